#!/usr/bin/env python3
"""Jobs per second through the worker loop, with a no-op handler.

Enqueues ``--jobs`` jobs in batches first, then times a :class:`Worker` at
``--concurrency`` draining them (fetch, run, ack). Against a running server::

    python bench.py --url http://127.0.0.1:8080 --jobs 20000 --concurrency 32

or let it start one from ``SVC_BIN`` (default ``<repo>/target/release/svc``)
on a free port and a temporary data dir::

    python bench.py --spawn
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from svc_client import Client, JobSpec, Worker


def spawn_server() -> tuple[subprocess.Popen[bytes], str, tempfile.TemporaryDirectory[str]]:
    binary = os.environ.get("SVC_BIN") or str(Path(__file__).resolve().parents[2] / "target" / "release" / "svc")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data = tempfile.TemporaryDirectory(prefix="svc-bench-")
    proc = subprocess.Popen(
        [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data.name],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(url + "/svc/v1/health", timeout=1).status_code == 200:
                return proc, url, data
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    sys.exit(f"svc at {binary} did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key", default=os.environ.get("SVC_API_KEY"))
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--queue", default="bench")
    parser.add_argument("--batch", type=int, default=1_000, help="jobs per enqueue batch")
    parser.add_argument("--sync", action="store_true", help="a sync (thread pool) handler instead of an async one")
    parser.add_argument("--spawn", action="store_true", help="start a server from SVC_BIN for the run")
    args = parser.parse_args()

    proc = None
    data = None
    url = args.url
    if args.spawn:
        proc, url, data = spawn_server()
    try:
        run(url, args)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        if data is not None:
            data.cleanup()


def run(url: str, args: argparse.Namespace) -> None:
    n = args.jobs
    with Client(url, args.api_key) as client:
        started = time.perf_counter()
        for first in range(0, n, args.batch):
            count = min(args.batch, n - first)
            client.enqueue_batch([JobSpec("bench.noop", [first + i], queue=args.queue) for i in range(count)])
        enqueue_s = time.perf_counter() - started
        print(f"enqueued {n} jobs in {enqueue_s:.2f}s ({n / enqueue_s:,.0f} jobs/s, batches of {args.batch})")

        worker = Worker(url, queues=[args.queue], concurrency=args.concurrency, api_key=args.api_key,
                        wait=1, handle_signals=False)
        handled = 0
        lock = threading.Lock()

        def finished() -> None:
            nonlocal handled
            with lock:
                handled += 1
                if handled == n:
                    worker.stop()

        if args.sync:
            @worker.handler("bench.noop")
            def noop_sync(i: int) -> None:
                finished()
        else:
            @worker.handler("bench.noop")
            async def noop_async(i: int) -> None:
                finished()

        started = time.perf_counter()
        worker.run()  # returns once every job is handled and acknowledged
        drain_s = time.perf_counter() - started
        stats = client.queues.stats(args.queue)
        kind = "sync" if args.sync else "async"
        print(
            f"drained {n} jobs in {drain_s:.2f}s at concurrency {args.concurrency} ({kind} no-op handler): "
            f"{n / drain_s:,.0f} jobs/s; completed={stats.states['completed']}"
        )


if __name__ == "__main__":
    main()
