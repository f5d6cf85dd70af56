#!/usr/bin/env bash
# Builds and tests the TypeScript client against the svc binary in SVC_BIN
# (default: the repository's target/release/svc).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

SVC_BIN="${SVC_BIN:-$(cd ../.. && pwd)/target/release/svc}"
export SVC_BIN
if [[ ! -x "$SVC_BIN" ]]; then
  echo "ci.sh: no svc binary at $SVC_BIN (build it, or set SVC_BIN)" >&2
  exit 1
fi
node -e 'const [major] = process.versions.node.split(".").map(Number); if (major < 18) { console.error(`ci.sh: Node 18 or later is needed, found ${process.version}`); process.exit(1); }'

npm ci --no-audit --no-fund
npm run build
npm test
