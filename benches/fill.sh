#!/usr/bin/env bash
# A large backlog: fills a fresh server with JOBS jobs of 200 bytes (100 a
# request, 32 connections; `svc bench --workload fill` prints the rate and
# the server's resident memory at each step), then times two restarts of
# the same data dir until /ready answers: after `kill -9`, and after a clean
# stop (SIGTERM). With redis-server on the PATH, the same client then fills
# Redis (`appendfsync always`) for the side-by-side batch figure. Run after
# `cargo build --release`; quote ratios, not figures.
#
#   benches/fill.sh [JOBS]
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${1:-3000000}
WORK=$(mktemp -d)
PORT=18481
REDIS_PORT=18482
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

start() {
    target/release/svc serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" >>"$WORK/svc.log" 2>&1 &
    SVC_PID=$!
}

# Seconds from now until the server answers /ready. The port is polled
# from the shell: a process started every 20 ms would take CPU from the
# recovery being timed.
until_ready() {
    local started; started=$(date +%s.%N)
    until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null; do
        kill -0 "$SVC_PID" 2>/dev/null || { echo "svc exited; log:" >&2; tail "$WORK/svc.log" >&2; exit 1; }
        sleep 0.02
    done
    echo "$(date +%s.%N) - $started" | bc
}

# The server's resident memory, in MB.
rss_mb() {
    echo $(( $(ps -o rss= -p "$SVC_PID") / 1024 ))
}

# The seconds the last start spent recovering, as its log reports them.
recovery_seconds() {
    grep '"recovered"\|recovered' "$WORK/svc.log" | tail -1 | grep -o 'seconds=[0-9.]*' | cut -d= -f2
}

start
until_ready >/dev/null
target/release/svc bench --address "127.0.0.1:$PORT" --workload fill --jobs "$JOBS"
# Once a snapshot in progress has ended and freed memory has gone back.
sleep 15
echo "RSS 15 s after the fill: $(rss_mb) MB"

kill -9 "$SVC_PID"; wait "$SVC_PID" 2>/dev/null || true
start
echo "restart after kill -9: $(until_ready)s ($(recovery_seconds) in recovery), RSS $(rss_mb) MB"

kill -TERM "$SVC_PID"; wait "$SVC_PID" 2>/dev/null || true
start
echo "restart after a clean stop: $(until_ready)s ($(recovery_seconds) in recovery), RSS $(rss_mb) MB"
sleep 15
echo "RSS 15 s later: $(rss_mb) MB"
kill -TERM "$SVC_PID"; wait "$SVC_PID" 2>/dev/null || true
echo "data dir: $(du -sh "$WORK/data" | cut -f1)"

if command -v redis-server >/dev/null; then
    mkdir "$WORK/redis"
    redis-server --port "$REDIS_PORT" --dir "$WORK/redis" --appendonly yes --appendfsync always --save "" \
        >"$WORK/redis.log" 2>&1 &
    until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.05; done
    target/release/svc bench --address "127.0.0.1:$REDIS_PORT" --workload fill --target redis --jobs "$JOBS"
    redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
fi
