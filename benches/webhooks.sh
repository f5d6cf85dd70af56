#!/usr/bin/env bash
# Enqueue + drain throughput with one webhook subscription to `job.*` (a
# local HTTPS receiver) against none, in alternating rounds of the same
# run, and how fast the deliveries arrive. Run after
# `cargo build --release --bins --examples`; quote the ratios, not the figures.
# Each job makes three events; the subscription may hold all of them
# (`webhooks.max_pending`), so that every one is delivered at any JOBS.
# CONCURRENCY sets `webhooks.concurrency_per_subscription` (default: the
# server's default); PRIORITY sets `webhooks.priority`. The receiver stands in for a service on another
# machine: it runs in Linux's idle scheduling class (`chrt --idle 0`), so
# that on a small machine its TLS and HTTP work does not come out of the
# server's CPU; RECEIVER_PRIORITY=normal runs it beside the server as an
# equal, which charges its work to the ratio.
#
# BUSY=N keeps N busy loops running through the rounds (workers beside the
# server holding the cores); the receiver reports each delivery's lag from
# its event's time, and the last round's p99 and most are printed.
#
#   [CONCURRENCY=N] [PRIORITY=normal|low|idle] [RECEIVER_PRIORITY=normal] [BUSY=N] benches/webhooks.sh [JOBS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${1:-20000}
ROUNDS=${2:-3}
WORK=$(mktemp -d)
SVC_PORT=18471
RECEIVER_PORT=18472
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
RECEIVER_RUN=""
if [ "${RECEIVER_PRIORITY:-idle}" = idle ] && chrt --idle 0 true 2>/dev/null; then RECEIVER_RUN="chrt --idle 0"; fi

$RECEIVER_RUN target/release/examples/webhook_receiver "$RECEIVER_PORT" "$WORK/ca.pem" >"$WORK/receiver.log" &
until [ -s "$WORK/ca.pem" ]; do sleep 0.1; done
{
    printf '[webhooks]\nallow_private_targets = true\nextra_ca_file = "%s"\n' "$WORK/ca.pem"
    printf 'max_pending = %d\n' $((3 * JOBS + 1000))
    if [ -n "${CONCURRENCY:-}" ]; then printf 'concurrency_per_subscription = %d\n' "$CONCURRENCY"; fi
    if [ -n "${PRIORITY:-}" ]; then printf 'priority = "%s"\n' "$PRIORITY"; fi
} >"$WORK/svc.toml"

delivered() { tail -n 1 "$WORK/receiver.log" | sed -n 's/^deliveries=\([0-9]*\).*/\1/p'; }
# The receiver's lag figures so far (event time to arrival).
lag() { tail -n 1 "$WORK/receiver.log" | grep -o 'lag_p99_ms=[0-9-]* lag_max_ms=[0-9-]*'; }
# The server's CPU time so far (user + system), in seconds.
cpu_seconds() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$1/stat"; }

round() { # with_subscription
    rm -rf "$WORK/data"
    target/release/svc serve --config "$WORK/svc.toml" --listen "127.0.0.1:$SVC_PORT" --data-dir "$WORK/data" \
        >"$WORK/svc.log" 2>&1 &
    local pid=$!
    until curl -sf "http://127.0.0.1:$SVC_PORT/svc/v1/health" >/dev/null; do sleep 0.1; done
    if [ "$1" = yes ]; then
        curl -sf -X POST "http://127.0.0.1:$SVC_PORT/svc/v1/webhooks" -H 'content-type: application/svc+json' \
            -d "{\"url\":\"https://127.0.0.1:$RECEIVER_PORT/hooks\",\"events\":[\"job.*\"],\"secret\":\"benchmark-secret-0123\"}" >/dev/null
    fi
    sleep 1.2
    local before; before=$(delivered)
    local started; started=$(date +%s.%N)
    local result
    result=$(target/release/svc bench --address "127.0.0.1:$SVC_PORT" --workload drain --jobs "$JOBS" --connections 32 2>&1 \
        | grep -o 'jobs/s=[0-9]*' | tail -n 1)
    if [ "$1" = yes ]; then
        local expected=$((before + 3 * JOBS))
        local waited=0
        while [ "$(delivered)" -lt "$expected" ]; do
            sleep 0.05
            waited=$((waited + 1))
            if [ "$waited" -gt 6000 ]; then echo "only $(($(delivered) - before)) of $((3 * JOBS)) delivered" >&2; exit 1; fi
        done
        local ended; ended=$(date +%s.%N)
        local rate; rate=$(echo "3 * $JOBS / ($ended - $started)" | bc)
        sleep 1.1
        echo "subscription $result deliveries=$((3 * JOBS)) deliveries/s=$rate cpu_s=$(cpu_seconds "$pid") $(lag)" \
            | tee -a "$WORK/rounds"
    else
        echo "none         $result cpu_s=$(cpu_seconds "$pid")" | tee -a "$WORK/rounds"
    fi
    kill "$pid"; wait "$pid" 2>/dev/null || true
}

for _ in $(seq "${BUSY:-0}"); do
    sh -c 'while :; do :; done' &
done
for _ in $(seq "$ROUNDS"); do
    round no
    round yes
done
# The medians of the rounds, and their ratio.
median() { grep "^$1" "$WORK/rounds" | grep -o 'jobs/s=[0-9]*' | cut -d= -f2 | sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
none=$(median none); with=$(median subscription)
echo "median jobs/s: none=$none subscription=$with ratio=$(echo "scale=2; $with / $none" | bc)"
# Server CPU a delivery costs: the rounds' medians, with against without, over the deliveries.
cpu() { grep "^$1" "$WORK/rounds" | grep -o 'cpu_s=[0-9.]*' | cut -d= -f2 | sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
echo "server CPU per delivery: $(echo "scale=1; ($(cpu subscription) - $(cpu none)) * 1000000 / (3 * $JOBS)" | bc) us"
