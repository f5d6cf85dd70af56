#!/usr/bin/env python3
"""Copies the upstream conformance cases whose job types contain '-' into DEST,
with '-' in those type names replaced by '_'.

The interface's type pattern, ^[a-zA-Z][a-zA-Z0-9_]*([.][a-zA-Z][a-zA-Z0-9_]*)*$,
has no '-', so svc answers 400 invalid_payload to those cases as written
(see conformance/expected-failures.skip). Rerunning them with a valid type
name checks everything else they test.

usage: retype_hyphens.py SUITE_DIR DEST_DIR
"""
import json
import pathlib
import re
import sys

TYPE_WITH_HYPHEN = re.compile(r'"type"\s*:\s*"([A-Za-z][A-Za-z0-9_.-]*-[A-Za-z0-9_.-]*)"')


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    source, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    copied = 0
    for path in sorted(source.rglob("*.json")):
        text = path.read_text()
        names = set(TYPE_WITH_HYPHEN.findall(text))
        if not names:
            continue
        for name in sorted(names, key=len, reverse=True):
            text = text.replace(f'"{name}"', f'"{name.replace("-", "_")}"')
        json.loads(text)  # still a valid test file
        target = dest / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        copied += 1
    print(f"{copied} cases retyped into {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
