"""A worker program for the signal tests: ``python worker_app.py URL LOG GRACE SLEEP``.

Each run appends ``start <id>`` and ``done <id>`` lines to LOG.
"""

from __future__ import annotations

import logging
import sys
import time

from svc_client import JobContext, Worker

url, log_path, grace, sleep_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

worker = Worker(url, queues=["signals"], concurrency=4, wait=5, shutdown_grace=grace)


def note(line: str) -> None:
    with open(log_path, "a") as f:
        f.write(line + "\n")


@worker.handler("slow.task")
def slow_task(n: int, ctx: JobContext) -> int:
    note(f"start {ctx.id}")
    time.sleep(sleep_s)
    note(f"done {ctx.id}")
    return n


worker.run()
note("exit")
