#!/usr/bin/env bash
# Type-checks the Python client and runs its tests against a real server.
#
#   SVC_BIN       the svc binary the tests start (default: <repo>/target/release/svc)
#   PYTHON        the interpreter the virtualenv is made with (default: python3, 3.10 or later)
#   SVC_PY_VENV   a virtualenv dir to create or reuse (default: a temporary one, removed after)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export SVC_BIN="${SVC_BIN:-$repo/target/release/svc}"
python="${PYTHON:-python3}"

if [[ ! -x "$SVC_BIN" ]]; then
    echo "ci.sh: no svc binary at $SVC_BIN (build it, or set SVC_BIN)" >&2
    exit 1
fi

if [[ -n "${SVC_PY_VENV:-}" ]]; then
    venv="$SVC_PY_VENV"
else
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    venv="$tmp/venv"
fi

[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$here[dev]"

cd "$here"
"$venv/bin/python" -m mypy --strict src/svc_client
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests
