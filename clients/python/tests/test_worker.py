"""The worker against a real server: delivery, failures, leases, signals, timeouts, progress."""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
from typing import Any

from conftest import SvcServer
from helpers import AsyncRecorder, running, wait_until

from svc_client import (
    Client,
    JobContext,
    JobError,
    JobSpec,
    Middleware,
    RetryPolicy,
    Worker,
    current_job,
    current_traceparent,
    new_traceparent,
)


def test_two_hundred_jobs_each_handled_once(server: SvcServer, client: Client) -> None:
    n = 200
    jobs = client.enqueue_batch([JobSpec("count.me", [i], queue="bulk") for i in range(n)])
    runs: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    in_flight = 0
    peak = 0

    worker = Worker(server.url, queues=["bulk"], concurrency=8, wait=1)

    @worker.handler("count.me")
    def count(i: int, ctx: JobContext) -> dict[str, int]:
        nonlocal in_flight, peak
        with lock:
            runs[ctx.id] += 1
            in_flight += 1
            peak = max(peak, in_flight)
        time.sleep(0.005)
        with lock:
            in_flight -= 1
        return {"double": i * 2}

    with running(worker):
        wait_until(lambda: client.queues.stats("bulk").states["completed"] == n, timeout=60)

    assert len(runs) == n and set(runs.values()) == {1}
    assert 1 < peak <= 8
    sample = client.get(jobs[17].id)
    assert sample.result == {"double": 34} and sample.attempt == 1 and sample.worker_id == worker.worker_id


def test_queues_are_taken_in_strict_order(server: SvcServer, client: Client) -> None:
    client.enqueue_batch([JobSpec("order.x", ["low", i], queue="low") for i in range(5)])
    client.enqueue_batch([JobSpec("order.x", ["high", i], queue="high") for i in range(5)])
    seen: list[str] = []
    worker = Worker(server.url, queues=["high", "low"], concurrency=1, wait=1)
    worker.register("order.x", lambda name, i: seen.append(name))
    with running(worker):
        wait_until(lambda: len(seen) == 10)
    assert seen == ["high"] * 5 + ["low"] * 5


def test_failures_retry_then_dead_letter(server: SvcServer, client: Client) -> None:
    policy = RetryPolicy(max_attempts=3, initial_interval=0.05, jitter=False, on_exhaustion="dead_letter")
    job = client.enqueue("flaky.op", ["x"], retry=policy)
    attempts: list[int] = []
    worker = Worker(server.url, concurrency=2, wait=1)

    class Boom(Exception):
        pass

    @worker.handler("flaky.op")
    def flaky(value: str, ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        raise Boom(f"attempt {ctx.attempt} failed for {value}")

    with running(worker):
        done = client.wait_for(job.id, timeout=20)
    assert done.state == "discarded" and attempts == [1, 2, 3]
    assert [e.type for e in done.errors] == ["Boom"] * 3
    last = done.errors[-1]
    assert last.message == "attempt 3 failed for x"
    assert last.details["error_class"].startswith("test_worker.") and last.details["error_class"].endswith(".Boom")
    assert any("in flaky" in line for line in last.backtrace)
    assert [j.id for j in client.dead_letter.list()] == [job.id]

    # Sent back from the dead letter listing, it runs again from attempt 1.
    worker2 = Worker(server.url, concurrency=1, wait=1)
    worker2.register("flaky.op", lambda value: {"fixed": value})
    client.dead_letter.retry(job.id)
    with running(worker2):
        again = client.wait_for(job.id, timeout=10)
    assert again.state == "completed" and again.result == {"fixed": "x"} and again.attempt == 1


def test_job_error_controls_the_report(server: SvcServer, client: Client) -> None:
    job = client.enqueue("pay.charge", [1], retry={"max_attempts": 5})
    worker = Worker(server.url, wait=1)

    @worker.handler("pay.charge")
    def charge(amount: int) -> None:
        raise JobError("card declined", type="card_declined", retryable=False, details={"code": 51})

    with running(worker):
        done = client.wait_for(job.id, timeout=10)
    assert done.state == "discarded" and done.attempt == 1
    assert done.error is not None and done.error.type == "card_declined" and done.error.details["code"] == 51


def test_unknown_type_is_nacked_with_a_clear_error(server: SvcServer, client: Client) -> None:
    job = client.enqueue("nobody.handles", [], retry=RetryPolicy(max_attempts=1))
    worker = Worker(server.url, wait=1)
    worker.register("something.else", lambda: None)
    with running(worker):
        done = client.wait_for(job.id, timeout=10)
    assert done.state == "discarded"
    assert done.error is not None and done.error.type == "unknown_job_type"
    assert "nobody.handles" in done.error.message and "something.else" in done.error.message


def test_heartbeats_keep_a_lease_past_its_visibility_timeout(server: SvcServer, client: Client) -> None:
    job = client.enqueue("slow.job", [], visibility_timeout=1, timeout=20)
    runs: list[int] = []
    worker = Worker(server.url, concurrency=2, wait=1)

    @worker.handler("slow.job")
    def slow(ctx: JobContext) -> str:
        runs.append(ctx.attempt)
        time.sleep(3.2)  # more than three visibility timeouts
        return "done"

    with running(worker):
        done = client.wait_for(job.id, timeout=15)
        time.sleep(0.5)
    assert done.state == "completed" and done.result == "done"
    assert runs == [1] and done.attempt == 1 and not done.errors


def test_quiet_then_terminate(server: SvcServer, client: Client) -> None:
    release = threading.Event()
    started: list[str] = []
    worker = Worker(server.url, concurrency=2, wait=5, idle_heartbeat=0.2, heartbeat_interval=0.2)

    @worker.handler("hold.on")
    def hold(tag: str) -> str:
        started.append(tag)
        release.wait(10)
        return tag

    with running(worker) as thread:
        first = client.enqueue("hold.on", ["first"])
        wait_until(lambda: started == ["first"])
        client.workers.quiet(worker.worker_id)
        wait_until(lambda: worker._remote == "quiet", timeout=5)
        second = client.enqueue("hold.on", ["second"])
        time.sleep(0.6)
        assert client.get(second.id).state == "available"  # quiet: nothing new taken
        release.set()
        assert client.wait_for(first.id, timeout=5).state == "completed"  # in hand: finished
        assert client.get(second.id).state == "available"
        client.workers.terminate(worker.worker_id)
        thread.join(10)
        assert not thread.is_alive(), "terminate stops the worker"
    assert started == ["first"]


def test_terminate_releases_jobs_in_hand(server: SvcServer, client: Client) -> None:
    gate = threading.Event()
    cancelled: list[bool] = []
    worker = Worker(server.url, concurrency=2, wait=5, heartbeat_interval=0.2)

    @worker.handler("long.one")
    def long_one(ctx: JobContext) -> None:
        gate.set()
        ctx.cancel_event.wait(10)
        cancelled.append(ctx.cancelled)

    job = client.enqueue("long.one", [])
    with running(worker) as thread:
        assert gate.wait(10)
        client.workers.terminate(worker.worker_id)
        thread.join(10)
        assert not thread.is_alive()
    after = client.get(job.id)
    assert after.state == "available" and after.attempt == 0  # released, the attempt given back
    wait_until(lambda: cancelled == [True], timeout=5)


def test_timeout_cancels_the_handler(server: SvcServer, client: Client) -> None:
    sync_job = client.enqueue("slow.sync", [], timeout=0.5, retry=RetryPolicy(max_attempts=1))
    async_job = client.enqueue("slow.async", [], timeout=0.5, retry=RetryPolicy(max_attempts=1))
    flags: dict[str, Any] = {}
    worker = Worker(server.url, concurrency=2, wait=1)

    @worker.handler("slow.sync")
    def slow_sync(ctx: JobContext) -> str:
        flags["sync_cancelled"] = ctx.cancel_event.wait(5)
        return "too late"

    @worker.handler("slow.async")
    async def slow_async() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            flags["async_cancelled"] = True
            raise
        return "too late"

    with running(worker):
        for job_id in (sync_job.id, async_job.id):
            done = client.wait_for(job_id, timeout=10)
            assert done.state == "discarded", done
            assert done.error is not None and done.error.type == "timeout"
            assert done.result is None
        wait_until(lambda: flags.get("sync_cancelled") is True and flags.get("async_cancelled") is True, timeout=5)


def test_progress_shows_up(server: SvcServer, client: Client) -> None:
    reported = threading.Event()
    proceed = threading.Event()
    worker = Worker(server.url, wait=1)

    @worker.handler("import.rows")
    def import_rows(total: int, ctx: JobContext) -> int:
        ctx.progress(0.4, message=f"400 of {total} rows", data={"rows": 400})
        reported.set()
        proceed.wait(10)
        return total

    @worker.handler("import.async")
    async def import_async(ctx: JobContext) -> None:
        await ctx.progress_async(0.75, "three quarters")

    job = client.enqueue("import.rows", [1000])
    with running(worker):
        assert reported.wait(10)
        live = client.progress(job.id)
        assert live.state == "active" and live.progress == 0.4
        assert live.message == "400 of 1000 rows" and live.data == {"rows": 400}
        assert client.get(job.id).progress_message == "400 of 1000 rows"
        proceed.set()
        assert client.wait_for(job.id, timeout=10).state == "completed"
        other = client.enqueue("import.async", [])
        assert client.wait_for(other.id, timeout=10).state == "completed"
    assert client.progress(other.id).progress == 0.75


def test_async_handlers_context_middleware_and_tracing(server: SvcServer, client: Client) -> None:
    calls: list[str] = []

    class Around(Middleware):
        async def execute(self, ctx, call_next):  # type: ignore[no-untyped-def]
            calls.append(f"before {ctx.type}")
            try:
                return await call_next()
            finally:
                calls.append(f"after {ctx.type}")

    seen: dict[str, Any] = {}
    worker = Worker(server.url, concurrency=4, wait=1, middleware=[Around()])

    @worker.handler("trace.parent")
    async def parent(n: int, *, ctx: JobContext) -> int:
        seen["parent_traceparent"] = ctx.traceparent
        seen["current"] = current_traceparent()
        assert current_job() is ctx
        # A job enqueued from a handler carries the trace on.
        async_client = worker._client
        assert async_client is not None
        child = await async_client.enqueue("trace.child", [n + 1])
        seen["child_id"] = child.id
        return n

    @worker.handler("trace.child")
    def child(n: int) -> int:
        job = current_job()
        assert job is not None
        seen["child_traceparent"] = job.traceparent
        return n

    traceparent = new_traceparent()
    job = client.enqueue("trace.parent", [1], traceparent=traceparent)
    with running(worker):
        assert client.wait_for(job.id, timeout=10).result == 1
        wait_until(lambda: "child_id" in seen)
        assert client.wait_for(seen["child_id"], timeout=10).result == 2
    assert seen["parent_traceparent"] == traceparent == seen["current"] == seen["child_traceparent"]
    # The middleware wraps each job. The child may start before the parent's
    # "after" (it is fetched as soon as it is enqueued), so only each job's
    # own order is fixed.
    for job_type in ("trace.parent", "trace.child"):
        assert calls.count(f"before {job_type}") == calls.count(f"after {job_type}") == 1
        assert calls.index(f"before {job_type}") < calls.index(f"after {job_type}")


def test_idle_worker_only_long_polls_and_fetches_for_free_slots(server: SvcServer, client: Client) -> None:
    recorder = AsyncRecorder()
    gate = threading.Event()
    worker = Worker(server.url, concurrency=3, wait=1, transport=recorder)

    @worker.handler("gated.job")
    def gated(i: int) -> int:
        gate.wait(10)
        return i

    with running(worker):
        time.sleep(0.2)
        idle_from = time.monotonic()
        time.sleep(2.5)
        idle = recorder.paths(idle_from)
        assert set(idle) <= {"/svc/v1/workers/fetch"} and len(idle) <= 4  # one long poll a second
        jobs = client.enqueue_batch([JobSpec("gated.job", [i]) for i in range(7)])
        wait_until(lambda: sum(1 for j in jobs if client.get(j.id).state == "active") == 3)
        gate.set()
        wait_until(lambda: client.queues.stats("default").states["completed"] == 7)
    fetches = [json.loads(body) for _, _, path, body in recorder.seen if path.endswith("/workers/fetch")]
    assert all(f["count"] <= 3 and f["queues"] == ["default"] and f["wait_ms"] == 1000 for f in fetches)


def test_extend_lease_from_the_handler(server: SvcServer, client: Client) -> None:
    job = client.enqueue("lease.me", [], visibility_timeout=1)
    worker = Worker(server.url, wait=1, heartbeat_interval=60)  # no periodic heartbeat in time

    @worker.handler("lease.me")
    def lease_me(ctx: JobContext) -> str:
        for _ in range(5):
            time.sleep(0.5)
            reply = ctx.extend_lease()
            assert reply is not None and reply.state == "running" and reply.jobs_extended == 1
        return "kept"

    with running(worker):
        done = client.wait_for(job.id, timeout=15)
    assert done.state == "completed" and done.attempt == 1 and not done.errors
