#!/usr/bin/env bash
# End-to-end latency at a steady, modest rate, svc against Redis in
# alternating rounds of the same run: producers enqueue at RATE jobs/s in
# total (paced evenly), workers wait in long-poll fetch (svc, `wait_ms`) or
# in `BLMOVE` (Redis, `appendfsync always`, finishing each job with `LREM`).
# The figure is the time from the enqueue call to the job's arrival at a
# worker. Each round also runs the queue floor (`examples/handoff_floor.rs
# --queue`): svc's design (a front end handing requests to one writing
# thread, a waiting fetch handed its job in the commit that writes it) with
# none of svc's work, the least a server built this way takes on the machine.
# Run after `cargo build --release --bins --examples`; quote the ratios, not the figures.
#
#   [RATE=500] [DURATION=10] [CONNECTIONS=4] benches/latency.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || { echo "latency.sh: install redis-server (Debian's redis-server package)" >&2; exit 1; }
FLOOR=target/release/examples/handoff_floor
[ -x target/release/svc ] && [ -x "$FLOOR" ] \
    || { echo "latency.sh: build first: cargo build --release --bins --examples" >&2; exit 1; }
ROUNDS=${1:-3}
RATE=${RATE:-500}
SECONDS_PER_ROUND=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-4}
WORK=$(mktemp -d)
SVC_PORT=18481
REDIS_PORT=18482
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

bench() { # address target
    target/release/svc bench --address "$1" --workload steady --target "$2" --rate "$RATE" \
        --duration "$SECONDS_PER_ROUND" --connections "$CONNECTIONS" --wait-ms 5000 \
        | grep -o 'end_to_end_p50=[0-9.]*ms end_to_end_p99=[0-9.]*ms'
}

svc_round() {
    rm -rf "$WORK/data"
    target/release/svc serve --listen "127.0.0.1:$SVC_PORT" --data-dir "$WORK/data" >"$WORK/svc.log" 2>&1 &
    local pid=$!
    until curl -sf "http://127.0.0.1:$SVC_PORT/svc/v1/health" >/dev/null; do sleep 0.1; done
    echo "svc   $(bench "127.0.0.1:$SVC_PORT" svc)" | tee -a "$WORK/rounds"
    kill "$pid"; wait "$pid" 2>/dev/null || true
}

floor_round() {
    rm -rf "$WORK/floor"
    "$FLOOR" "127.0.0.1:$SVC_PORT" --queue "$WORK/floor" >"$WORK/floor.log" 2>&1 &
    local pid=$!
    until curl -sf "http://127.0.0.1:$SVC_PORT/svc/v1/health" >/dev/null; do sleep 0.1; done
    echo "floor $(bench "127.0.0.1:$SVC_PORT" svc)" | tee -a "$WORK/rounds"
    kill "$pid"; wait "$pid" 2>/dev/null || true
}

redis_round() {
    rm -rf "$WORK/redis" && mkdir -p "$WORK/redis"
    redis-server --port "$REDIS_PORT" --dir "$WORK/redis" --appendonly yes --appendfsync always \
        --save '' --daemonize no >"$WORK/redis.log" 2>&1 &
    local pid=$!
    until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.1; done
    echo "redis $(bench "127.0.0.1:$REDIS_PORT" redis)" | tee -a "$WORK/rounds"
    kill "$pid"; wait "$pid" 2>/dev/null || true
}

for _ in $(seq "$ROUNDS"); do
    svc_round
    floor_round
    redis_round
done
median() { # server quantile
    grep "^$1" "$WORK/rounds" | grep -o "end_to_end_$2=[0-9.]*" | cut -d= -f2 | sort -n \
        | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'
}
for q in p50 p99; do
    s=$(median svc "$q"); f=$(median floor "$q"); r=$(median redis "$q")
    echo "median end-to-end $q: svc=${s}ms floor=${f}ms redis=${r}ms" \
        "svc/redis=$(echo "scale=2; $s / $r" | bc) floor/redis=$(echo "scale=2; $f / $r" | bc)"
done
