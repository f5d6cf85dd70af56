#!/usr/bin/env bash
# svc on PostgreSQL against a plain job queue on the same PostgreSQL, and
# against svc's local engine, in alternating rounds of one run. Each figure
# is jobs/s at 32 connections from `svc bench`, on a fresh database (or data
# dir); quote the ratios, not the figures.
#
#   plain      svc bench --target postgres: the hand-written queue
#              (src/bench/postgres.rs), every statement its own transaction
#   merged     svc bench --target postgres-merged: the same queue with the
#              connections' requests merged as svc merges them, the floor
#              of merging on this machine (fill: a binary COPY a request)
#   history    svc bench --target postgres-merged-history: merged, and each
#              acked job moved into a history table partitioned by day,
#              as svc's layout does (fill: 100 jobs a request, merged)
#   outbox     svc bench --target postgres-merged-outbox: as history, with
#              an event row beside each enqueue, claim and ack
#   merged2    the merged floor as two load generators on one database, 16
#              connections each, each merging its own requests (`--shared`):
#              what splitting the requests between two nodes costs merging
#              (fill: a COPY a request, as `merged`, so nothing to merge)
#   pg         svc serve --postgres, one node
#   pg2        two svc nodes on one database, each driven by its own
#              `svc bench` with half the connections and half the jobs
#              (the figure is the sum of the two)
#   local      svc serve on a data dir
#
# for three workloads: enqueue (one job a request), fill (100 jobs a
# request) and drain (fetch + ack of loaded jobs). PostgreSQL runs from
# Debian's packages in a temp dir, with fsync and synchronous_commit on.
#
#   benches/postgres.sh [JOBS] [ROUNDS]      (build with cargo build --release first)
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${1:-10000}
ROUNDS=${2:-3}
SVC=$PWD/target/release/svc
PG_BIN=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)
[ -n "$PG_BIN" ] || { echo "postgres.sh: install Debian's postgresql package" >&2; exit 1; }
WORK=$(mktemp -d)
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if [ "$(id -u)" = 0 ]; then chown postgres: "$WORK"; fi
PG_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as_postgres "$PG_BIN/initdb" --auth=trust --username=postgres --no-instructions -D "$WORK/pg" >/dev/null
as_postgres "$PG_BIN/pg_ctl" -D "$WORK/pg" -l "$WORK/postgres.log" -w \
    -o "-p $PG_PORT -k $WORK -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
PORTS=(18481 18482)
SERVERS=()
cleanup() {
    for pid in "${SERVERS[@]}"; do kill "$pid" 2>/dev/null || true; done
    as_postgres "$PG_BIN/pg_ctl" -D "$WORK/pg" -m fast -w stop >/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

fresh_db() { # prints a URL of a new database
    local name
    name="bench_$(date +%s%N)"
    psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -qc "CREATE DATABASE $name" >/dev/null
    echo "postgres://postgres@127.0.0.1:$PG_PORT/$name"
}
serve() { # port [--postgres URL]: starts svc, waits until it answers
    local port=$1
    shift
    rm -rf "$WORK/data-$port"
    "$SVC" serve --listen "127.0.0.1:$port" --data-dir "$WORK/data-$port" "$@" >"$WORK/svc-$port.log" 2>&1 &
    SERVERS+=($!)
    until curl -sf "http://127.0.0.1:$port/svc/v1/health" >/dev/null; do
        kill -0 "${SERVERS[-1]}" 2>/dev/null || { echo "svc did not start:" >&2; cat "$WORK/svc-$port.log" >&2; exit 1; }
        sleep 0.05
    done
}
stop_all() {
    for pid in "${SERVERS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
    SERVERS=()
}
preload() { # address: JOBS jobs into the queue `svc bench` drains, 1000 to a batch
    python3 - "$1" "$JOBS" <<'PY'
import json, sys, urllib.request
address, jobs = sys.argv[1], int(sys.argv[2])
for start in range(0, jobs, 1000):
    batch = [{"type": "bench.job", "args": [n], "options": {"queue": "bench"}} for n in range(start, min(jobs, start + 1000))]
    request = urllib.request.Request(f"http://{address}/svc/v1/jobs/batch", data=json.dumps({"jobs": batch}).encode(),
                                     headers={"content-type": "application/svc+json"}, method="POST")
    urllib.request.urlopen(request).read()
PY
}
rate() { grep -o 'jobs/s=[0-9]*' | tail -n 1 | cut -d= -f2; }
bench() { # address workload jobs connections [extra]
    "$SVC" bench --address "$1" --workload "$2" --jobs "$3" --connections "$4" "${@:5}" 2>&1 | rate
}

measure() { # target workload
    local result
    case "$1" in
        plain) result=$(bench "$(fresh_db)" "$2" "$JOBS" 32 --target postgres) ;;
        merged) result=$(bench "$(fresh_db)" "$2" "$JOBS" 32 --target postgres-merged) ;;
        history) result=$(bench "$(fresh_db)" "$2" "$JOBS" 32 --target postgres-merged-history) ;;
        outbox) result=$(bench "$(fresh_db)" "$2" "$JOBS" 32 --target postgres-merged-outbox) ;;
        merged2)
            local url start end first
            url=$(fresh_db)
            if [ "$2" = drain ]; then
                # One run makes the table and loads it, then two drain it.
                bench "$url" fill "$JOBS" 32 --target postgres-merged >/dev/null
                start=$(date +%s.%N)
                "$SVC" bench --address "$url" --workload drain --jobs 0 --connections 16 \
                    --target postgres-merged --shared >/dev/null &
                first=$!
                "$SVC" bench --address "$url" --workload drain --jobs 0 --connections 16 \
                    --target postgres-merged --shared >/dev/null
                wait "$first"
                end=$(date +%s.%N)
                result=$(echo "$JOBS / ($end - $start)" | bc)
            else
                bench "$url" fill 0 1 --target postgres-merged >/dev/null
                bench "$url" "$2" $((JOBS / 2)) 16 --target postgres-merged --shared >"$WORK/a" &
                first=$!
                bench "$url" "$2" $((JOBS / 2)) 16 --target postgres-merged --shared >"$WORK/b"
                wait "$first"
                result=$(( $(cat "$WORK/a") + $(cat "$WORK/b") ))
            fi
            ;;
        local)
            serve "${PORTS[0]}"
            result=$(bench "127.0.0.1:${PORTS[0]}" "$2" "$JOBS" 32)
            stop_all
            ;;
        pg)
            serve "${PORTS[0]}" --postgres "$(fresh_db)"
            result=$(bench "127.0.0.1:${PORTS[0]}" "$2" "$JOBS" 32)
            stop_all
            ;;
        pg2)
            local url
            url=$(fresh_db)
            serve "${PORTS[0]}" --postgres "$url"
            serve "${PORTS[1]}" --postgres "$url"
            if [ "$2" = drain ]; then
                # Both nodes drain one queue: load it through one, then drain through both.
                preload "127.0.0.1:${PORTS[0]}"
                local start end
                start=$(date +%s.%N)
                "$SVC" bench --address "127.0.0.1:${PORTS[0]}" --workload drain --jobs 0 --connections 16 >/dev/null &
                local first=$!
                "$SVC" bench --address "127.0.0.1:${PORTS[1]}" --workload drain --jobs 0 --connections 16 >/dev/null
                wait "$first"
                end=$(date +%s.%N)
                result=$(echo "$JOBS / ($end - $start)" | bc)
            else
                bench "127.0.0.1:${PORTS[0]}" "$2" $((JOBS / 2)) 16 >"$WORK/a" &
                local first=$!
                bench "127.0.0.1:${PORTS[1]}" "$2" $((JOBS / 2)) 16 >"$WORK/b"
                wait "$first"
                result=$(( $(cat "$WORK/a") + $(cat "$WORK/b") ))
            fi
            stop_all
            ;;
    esac
    echo "$1 $2 ${result:-failed}" | tee -a "$WORK/rounds"
}

for _ in $(seq "$ROUNDS"); do
    for workload in enqueue fill drain; do
        for target in plain merged merged2 history outbox pg pg2 local; do measure "$target" "$workload"; done
    done
done

median() { grep "^$1 $2 " "$WORK/rounds" | cut -d' ' -f3 | grep -x '[0-9]*' | sort -n \
    | awk '{v[NR]=$1} END {if (NR == 0) print 0; else print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
ratio() { if [ "$2" = 0 ]; then echo "-"; else echo "scale=2; $1 / $2" | bc; fi; }
for workload in enqueue fill drain; do
    plain=$(median plain "$workload")
    echo "$workload medians (jobs/s): plain=$plain merged=$(median merged "$workload")" \
        "history=$(median history "$workload") outbox=$(median outbox "$workload") pg=$(median pg "$workload")" \
        "pg2=$(median pg2 "$workload") local=$(median local "$workload")" \
        " merged/plain=$(ratio "$(median merged "$workload")" "$plain")" \
        "history/plain=$(ratio "$(median history "$workload")" "$plain")" \
        "outbox/plain=$(ratio "$(median outbox "$workload")" "$plain") pg/plain=$(ratio "$(median pg "$workload")" "$plain")" \
        "merged2/merged=$(ratio "$(median merged2 "$workload")" "$(median merged "$workload")")" \
        "pg2/pg=$(ratio "$(median pg2 "$workload")" "$(median pg "$workload")")"
done
