#!/usr/bin/env bash
# Runs the dashboard's end-to-end tests in headless Chromium against a
# release binary; screenshots of every page go to target/ui-screenshots/.
#
#   SVC_BIN         the svc binary (default: <repo>/target/release/svc)
#   SVC_UI_VENV     a virtualenv dir to create or reuse (default: a temporary one)
#   CHROMIUM, CHROMEDRIVER   the browser and its driver (default: Debian's)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export SVC_BIN="${SVC_BIN:-$repo/target/release/svc}"

if [[ -n "${SVC_UI_VENV:-}" ]]; then
    venv="$SVC_UI_VENV"
else
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    venv="$tmp/venv"
fi
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "selenium==4.51.0"
# Selenium finds the driver given, and does not download one.
export SE_OFFLINE=true
"$venv/bin/python" "$here/dashboard_test.py"
