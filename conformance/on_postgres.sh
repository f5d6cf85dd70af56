#!/usr/bin/env bash
# Runs conformance suites against svc on PostgreSQL (docs/postgres.md): a
# PostgreSQL server of its own in a temp dir (as the `postgres` user when
# run as root, as PostgreSQL requires), and a fresh database for every
# server the runner starts. Arguments after the suites' directories are
# passed to the runner.
#
#   conformance/on_postgres.sh SUITE_DIR [runner options...]
set -euo pipefail
cd "$(dirname "$0")/.."
CONFORMANCE=${CONFORMANCE:-../shared/conformance}
SVC=${SVC_BIN:-$PWD/target/release/svc}
PG_BIN=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)
[ -n "$PG_BIN" ] || { echo "on_postgres.sh: install Debian's postgresql package" >&2; exit 1; }
WORK=$(mktemp -d)
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if [ "$(id -u)" = 0 ]; then chown postgres: "$WORK"; fi
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as_postgres "$PG_BIN/initdb" --auth=trust --username=postgres --no-instructions -D "$WORK/data" >/dev/null
as_postgres "$PG_BIN/pg_ctl" -D "$WORK/data" -l "$WORK/postgres.log" -w \
    -o "-p $PORT -k $WORK -c listen_addresses=127.0.0.1 -c max_connections=300" start >/dev/null
trap 'as_postgres "$PG_BIN/pg_ctl" -D "$WORK/data" -m fast -w stop >/dev/null; rm -rf "$WORK"' EXIT

cat >"$WORK/serve.sh" <<SERVE
#!/bin/sh
# {port} {data_dir}: svc on a database of its own.
db="svc_\$(echo "\$1" | tr -cd 0-9)_\$(date +%s%N)"
psql -h 127.0.0.1 -p $PORT -U postgres -qc "CREATE DATABASE \$db" >/dev/null
exec "$SVC" serve --listen "127.0.0.1:\$1" --data-dir "\$2" --postgres "postgres://postgres@127.0.0.1:$PORT/\$db"
SERVE
chmod +x "$WORK/serve.sh"
suite=$1
shift
python3 "$CONFORMANCE/run.py" --server-cmd "$WORK/serve.sh {port} {data_dir}" \
    --expected-failures "$CONFORMANCE/expected-failures.skip" \
    --expected-failures conformance/postgres-expected-failures.skip "$@" "$suite"
