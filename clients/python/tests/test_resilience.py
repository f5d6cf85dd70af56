"""Shutdown by signal, and a server that crashes and comes back."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import SvcServer
from helpers import AsyncLoseResponses, running, wait_until

from svc_client import Client, JobContext, JobSpec, Worker

APP = Path(__file__).resolve().parent / "worker_app.py"
SRC = Path(__file__).resolve().parents[1] / "src"


def start_app(server: SvcServer, log: Path, grace: float, sleep_s: float) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, str(APP), server.url, str(log), str(grace), str(sleep_s)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def lines(log: Path, prefix: str) -> list[str]:
    if not log.exists():
        return []
    return [line.split(" ", 1)[1] for line in log.read_text().splitlines() if line.startswith(prefix + " ")]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_lets_jobs_in_hand_finish(server: SvcServer, client: Client, tmp_path: Path, signum: int) -> None:
    jobs = client.enqueue_batch([JobSpec("slow.task", [i], queue="signals") for i in range(10)])
    log = tmp_path / "runs.log"
    proc = start_app(server, log, grace=10, sleep_s=1.0)
    try:
        wait_until(lambda: len(lines(log, "start")) == 4, timeout=15)
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output.decode()
    assert log.read_text().splitlines()[-1] == "exit"
    started, done = lines(log, "start"), lines(log, "done")
    assert len(started) == 4 and sorted(started) == sorted(done)  # in hand: finished
    states = {j.id: client.get(j.id) for j in jobs}
    assert all(states[i].state == "completed" for i in started)
    rest = [j for i, j in states.items() if i not in started]
    assert len(rest) == 6 and all(j.state == "available" and j.attempt == 0 for j in rest)

    # Nothing lost, nothing run twice: another worker takes exactly the rest.
    runs: collections.Counter[str] = collections.Counter()
    worker = Worker(server.url, queues=["signals"], concurrency=4, wait=1)

    @worker.handler("slow.task")
    def slow_task(n: int, ctx: JobContext) -> int:
        runs[ctx.id] += 1
        return n

    with running(worker):
        wait_until(lambda: client.queues.stats("signals").states["completed"] == 10)
    assert set(runs) == {j.id for j in rest} and set(runs.values()) == {1}


def test_grace_period_over_releases_jobs(server: SvcServer, client: Client, tmp_path: Path) -> None:
    jobs = client.enqueue_batch([JobSpec("slow.task", [i], queue="signals") for i in range(2)])
    log = tmp_path / "runs.log"
    proc = start_app(server, log, grace=0.5, sleep_s=30)
    try:
        wait_until(lambda: len(lines(log, "start")) == 2, timeout=15)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=20)
        elapsed = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output.decode()
    assert elapsed < 10
    assert lines(log, "done") == []
    for job in jobs:
        after = client.get(job.id)
        assert after.state == "available" and after.attempt == 0  # released, not lost


def test_worker_survives_a_server_crash(server: SvcServer, client: Client) -> None:
    n = 150
    jobs = client.enqueue_batch(
        [JobSpec("crash.safe", [i], queue="crash", visibility_timeout=5) for i in range(n)]
    )
    runs: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    worker = Worker(server.url, queues=["crash"], concurrency=8, wait=2)

    @worker.handler("crash.safe")
    def crash_safe(i: int, ctx: JobContext) -> int:
        with lock:
            runs[ctx.id] += 1
        time.sleep(0.02)
        return i

    with running(worker):
        wait_until(lambda: len(runs) >= 40, timeout=30)
        server.kill()
        time.sleep(0.5)
        server.start()
        wait_until(lambda: client.queues.stats("crash").states["completed"] == n, timeout=60)
    assert set(runs) == {j.id for j in jobs}
    twice = {k: v for k, v in runs.items() if v > 1}
    assert not twice, f"run more than once: {twice}"
    assert all(client.get(j.id).result == j.args[0] for j in jobs[:10])


@pytest.mark.parametrize("route", ["/workers/ack", "/workers/nack"])
def test_lost_outcome_answers_are_not_applied_twice(server: SvcServer, client: Client, route: str) -> None:
    """The answer to an ack (or nack) is lost after the server applied it: the
    worker reads the job, sees its report landed, and sends nothing more."""
    transport = AsyncLoseResponses("POST", route, n=3)
    fail = route.endswith("nack")
    job = client.enqueue("report.once", [], retry={"max_attempts": 1})
    worker = Worker(server.url, wait=1, transport=transport)

    @worker.handler("report.once")
    def report_once() -> str:
        if fail:
            raise ValueError("nope")
        return "ok"

    with running(worker):
        done = client.wait_for(job.id, timeout=10)
        time.sleep(0.3)
    assert transport.requests == 1
    if fail:
        assert done.state == "discarded" and len(done.errors) == 1
    else:
        assert done.state == "completed" and done.result == "ok"


def test_worker_rides_out_a_graceful_server_restart(server: SvcServer, client: Client) -> None:
    """A draining server answers heartbeats with ``terminate``: the worker
    finishes what it holds, waits for the server, and carries on."""
    done: list[int] = []
    worker = Worker(server.url, concurrency=2, wait=2)

    @worker.handler("drain.me")
    def drain_me(i: int) -> int:
        time.sleep(1.0 if i == 0 else 0.0)
        done.append(i)
        return i

    first = client.enqueue("drain.me", [0])
    with running(worker) as thread:
        wait_until(lambda: client.get(first.id).state == "active")
        stopper = threading.Thread(target=server.stop)
        stopper.start()
        stopper.join(30)
        assert done == [0]
        server.start()
        with Client(server.url) as fresh:
            assert fresh.get(first.id).state == "completed"
            second = fresh.enqueue("drain.me", [1])
            assert fresh.wait_for(second.id, timeout=15).state == "completed"
        assert thread.is_alive()
    assert done == [0, 1]
