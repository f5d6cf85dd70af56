#!/usr/bin/env bash
# The admin API and the dashboard with a large store: fills a fresh server
# with JOBS jobs: all but 1 000 of them jobs of 200 bytes (`svc bench
# --workload fill`, queue `default`; the store takes at most 10 M jobs not
# yet ended), the rest in other queues and states. Then it times every admin
# call and dashboard page: the median of 5 requests each, over loopback, in
# milliseconds. Run after `cargo build --release`, alone on the machine.
#
#   benches/admin.sh [JOBS]      (default 10 000 000)
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${1:-10000000}
WORK=$(mktemp -d)
PORT=18483
BASE="http://127.0.0.1:$PORT"
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT

target/release/svc serve --listen "127.0.0.1:$PORT" --data-dir "$WORK/data" >"$WORK/svc.log" 2>&1 &
for _ in $(seq 100); do curl -sf "$BASE/ready" >/dev/null && break; sleep 0.05; done

echo "== filling $JOBS jobs"
target/release/svc bench --workload fill --jobs "$((JOBS - 1000))" --address "127.0.0.1:$PORT" | tail -n 3

post() { curl -sf -X POST "$BASE$1" -H 'content-type: application/json' -d "$2"; }
for n in $(seq 899); do
    post /svc/v1/jobs "{\"type\":\"email.send\",\"args\":[{\"to\":\"user$n@example.com\"}],\"options\":{\"queue\":\"mail\"}}" >/dev/null
done
for n in $(seq 100); do
    id=$(post /svc/v1/jobs "{\"type\":\"report.build\",\"args\":[$n],\"options\":{\"queue\":\"reports\",\"retry\":{\"max_attempts\":1,\"on_exhaustion\":\"dead_letter\"}}}" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["job"]["id"])')
    post /svc/v1/workers/fetch '{"queues":["reports"],"count":1,"worker_id":"w-1"}' >/dev/null
    post /svc/v1/workers/nack "{\"job_id\":\"$id\",\"error\":{\"type\":\"Boom\",\"message\":\"needle-$n\"}}" >/dev/null
done
post /svc/v1/jobs '{"type":"later","args":[],"options":{"queue":"mail","delay_until":"2099-01-01T00:00:00Z"}}' >/dev/null
post /svc/v1/cron '{"name":"nightly","schedule":"0 3 * * *","type":"report.build","args":[]}' >/dev/null

median_ms() {
    local path=$1 times=()
    for _ in 1 2 3 4 5; do
        times+=("$(curl -s -o /dev/null -w '%{time_total}' "$BASE$path")")
    done
    printf '%s\n' "${times[@]}" | sort -n | sed -n 3p | awk '{printf "%.1f", $1 * 1000}'
}

echo "== median ms per request, $JOBS jobs held"
for path in \
    /svc/v1/admin/stats \
    /svc/v1/admin/queues \
    /svc/v1/admin/queues/default \
    "/svc/v1/admin/jobs?limit=25" \
    "/svc/v1/admin/jobs?queue=mail&limit=25" \
    "/svc/v1/admin/jobs?state=discarded" \
    "/svc/v1/admin/jobs?q=needle-42" \
    "/svc/v1/admin/jobs/$id" \
    /svc/v1/admin/dead-letter \
    "/svc/v1/admin/dead-letter?page=10&per_page=10" \
    /svc/v1/admin/dead-letter/stats \
    /svc/v1/admin/workers \
    /ui /ui/queues /ui/queues/default /ui/queues/mail /ui/jobs "/ui/jobs?q=needle-42" "/ui/jobs/$id" \
    /ui/scheduled /ui/dead-letter /ui/cron /ui/workers /ui/workflows /ui/events; do
    printf '%-48s %8s\n' "$path" "$(median_ms "$path")"
done
echo "== a dry run of a bulk retry over every discarded job"
curl -s -o /dev/null -w '%{time_total}\n' -X POST "$BASE/svc/v1/admin/jobs/bulk/retry" \
    -H 'content-type: application/json' -d '{"filter":{"state":"discarded"},"dry_run":true}'
