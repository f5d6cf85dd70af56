#!/usr/bin/env bash
# The client libraries' worker loops against the raw HTTP drain, and the raw
# drain with acks that fetch against Redis, in alternating rounds of one run.
# Each figure is jobs/s draining JOBS no-op jobs at concurrency 32 from a
# fresh server (fresh data dir); quote the ratios, not the figures.
#
#   raw        svc bench --workload drain (a fetch and an ack per job)
#   ack-fetch  the same, each ack claiming the next job (--ack-fetch)
#   redis      svc bench --workload drain --target redis: LMOVE, then LREM,
#              Redis with appendfsync always (skipped without redis-server)
#   rust       clients/rust/examples/drain.rs (svc-client's Worker)
#   python     clients/python/bench.py (svc_client.Worker, async no-op handler)
#   typescript clients/typescript/bench.mjs (svc-client's Worker)
#
# Build first: `cargo build --release --bins -p svc-client --examples` and
# `npm ci && npm run build` in clients/typescript. The Python client is
# installed into SVC_PY_VENV (made if missing; default: a temporary one).
#
#   benches/clients.sh [JOBS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${1:-20000}
ROUNDS=${2:-3}
REPO=$(pwd)
WORK=$(mktemp -d)
PORT=18491
REDIS_PORT=18492
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

VENV=${SVC_PY_VENV:-$WORK/venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$REPO/clients/python"

# Starts a fresh server; its pid in $SERVER.
serve() {
    rm -rf "$WORK/data"
    target/release/svc serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" >"$WORK/svc.log" 2>&1 &
    SERVER=$!
    until curl -sf "http://127.0.0.1:$PORT/svc/v1/health" >/dev/null; do
        kill -0 "$SERVER" 2>/dev/null || { echo "svc did not start (port $PORT in use?)" >&2; exit 1; }
        sleep 0.05
    done
}
stop() { kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; }
# The jobs/s figure in a run's output (the last one, without separators).
rate() { grep -o '[0-9][0-9,]* jobs/s\|jobs/s=[0-9]*' | tail -n 1 | tr -d ',' | grep -o '[0-9]*'; }

measure() { # name
    local url="http://127.0.0.1:$PORT" result
    case "$1" in
        redis)
            rm -rf "$WORK/redis" && mkdir -p "$WORK/redis"
            redis-server --port "$REDIS_PORT" --dir "$WORK/redis" --appendonly yes --appendfsync always \
                --save '' --daemonize no >"$WORK/redis.log" 2>&1 &
            local redis=$!
            until redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do sleep 0.05; done
            result=$(target/release/svc bench --target redis --address "127.0.0.1:$REDIS_PORT" --workload drain \
                --jobs "$JOBS" --connections 32 2>&1 | rate)
            kill "$redis"; wait "$redis" 2>/dev/null || true
            ;;
        *)
            serve
            case "$1" in
                raw) result=$(target/release/svc bench --address "127.0.0.1:$PORT" --workload drain --jobs "$JOBS" \
                    --connections 32 2>&1 | rate) ;;
                ack-fetch) result=$(target/release/svc bench --address "127.0.0.1:$PORT" --workload drain --ack-fetch \
                    --jobs "$JOBS" --connections 32 2>&1 | rate) ;;
                rust) result=$(target/release/examples/drain --url "$url" --jobs "$JOBS" --concurrency 32 2>&1 | rate) ;;
                python) result=$("$VENV/bin/python" clients/python/bench.py --url "$url" --jobs "$JOBS" \
                    --concurrency 32 2>&1 | rate) ;;
                typescript) result=$(node clients/typescript/bench.mjs --url "$url" --jobs "$JOBS" --concurrency 32 2>&1 \
                    | rate) ;;
            esac
            stop
            ;;
    esac
    echo "$1 ${result:-failed}" | tee -a "$WORK/rounds"
}

NAMES="raw ack-fetch rust python typescript"
if command -v redis-server >/dev/null; then NAMES="$NAMES redis"; fi
for _ in $(seq "$ROUNDS"); do
    for name in $NAMES; do measure "$name"; done
done

median() { grep "^$1 " "$WORK/rounds" | cut -d' ' -f2 | grep -x '[0-9]*' | sort -n \
    | awk '{v[NR]=$1} END {if (NR == 0) print 0; else print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
ratio() { if [ "$2" = 0 ]; then echo "-"; else echo "scale=2; $1 / $2" | bc; fi; }
raw=$(median raw)
echo "medians (jobs/s): $(for name in $NAMES; do printf '%s=%s ' "$name" "$(median "$name")"; done)"
echo "rust/raw=$(ratio "$(median rust)" "$raw") python/raw=$(ratio "$(median python)" "$raw")" \
    "typescript/raw=$(ratio "$(median typescript)" "$raw")" \
    "ack-fetch/redis=$(ratio "$(median ack-fetch)" "$(median redis)")"
