"""Inline mode: handlers run in process, no server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from svc_client import (
    InlineClient,
    InlineJobFailed,
    JobContext,
    JobSpec,
    Middleware,
    RetryPolicy,
    Worker,
    current_job,
    new_traceparent,
)


def make_worker() -> Worker:
    worker = Worker("http://127.0.0.1:1", queues=["mail"])

    @worker.handler("email.send")
    def send(to: str, ctx: JobContext) -> dict[str, Any]:
        ctx.progress(1.0, "sent")
        return {"sent": to, "attempt": ctx.attempt}

    @worker.handler("math.add")
    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    return worker


def test_eager_runs_on_enqueue() -> None:
    inline = make_worker().inline()
    job = inline.enqueue("email.send", ["ada@example.com"], queue="mail")
    assert job.state == "completed" and job.result == {"sent": "ada@example.com", "attempt": 1}
    assert inline.progress(job.id).message == "sent"
    assert inline.enqueue("math.add", [2, 3]).result == 5
    assert [j.type for j in inline.jobs] == ["email.send", "math.add"]


def test_deferred_until_drain_and_nested_enqueues() -> None:
    inline = InlineClient(eager=False)
    order: list[str] = []

    @inline.handler("parent.job")
    def parent(n: int) -> None:
        order.append(f"parent {n}")
        inline.enqueue("child.job", [n])

    @inline.handler("child.job")
    def child(n: int) -> int:
        order.append(f"child {n}")
        return n * 10

    inline.enqueue_batch([JobSpec("parent.job", [1]), JobSpec("parent.job", [2])])
    assert all(j.state == "available" for j in inline.jobs) and order == []
    assert inline.drain() == 4
    assert order == ["parent 1", "parent 2", "child 1", "child 2"]
    assert [j.result for j in inline.jobs_of("child.job")] == [10, 20]


def test_retries_and_failures() -> None:
    inline = InlineClient(raise_errors=False)
    calls: list[int] = []

    @inline.handler("flaky.job")
    def flaky(ctx: JobContext) -> str:
        calls.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RuntimeError("not yet")
        return "ok"

    job = inline.enqueue("flaky.job", [], retry=RetryPolicy(max_attempts=3))
    assert job.state == "completed" and job.result == "ok" and calls == [1, 2, 3]
    assert [e.type for e in job.errors] == ["RuntimeError", "RuntimeError"]

    missing = inline.enqueue("nobody.home", [])
    assert missing.state == "discarded" and missing.error and missing.error.type == "unknown_job_type"

    strict = InlineClient({"always.fails": lambda: 1 / 0})
    with pytest.raises(InlineJobFailed) as info:
        strict.enqueue("always.fails", [], retry={"max_attempts": 2})
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert info.value.job.attempt == 2 and info.value.job.state == "discarded"


def test_middleware_and_trace_context_inline() -> None:
    seen: list[Any] = []

    class Record(Middleware):
        def before_enqueue(self, body: dict[str, Any]) -> None:
            body.setdefault("meta", {})["source"] = "test"

        async def execute(self, ctx, call_next):  # type: ignore[no-untyped-def]
            seen.append(("before", ctx.type))
            result = await call_next()
            seen.append(("after", result))
            return result

    inline = InlineClient(middleware=[Record()])

    @inline.handler("trace.me")
    def trace_me() -> str | None:
        ctx = current_job()
        assert ctx is not None
        return ctx.traceparent

    traceparent = new_traceparent()
    job = inline.enqueue("trace.me", [], traceparent=traceparent)
    assert job.result == traceparent and job.meta["source"] == "test"
    assert seen == [("before", "trace.me"), ("after", traceparent)]


def test_pending_and_cancel() -> None:
    inline = make_worker().inline()
    staged = inline.enqueue("math.add", [1, 1], pending=True)
    assert staged.state == "pending"
    assert inline.activate(staged.id).result == 2
    deferred = InlineClient({"math.add": lambda a, b: a + b}, eager=False)
    job = deferred.enqueue("math.add", [1, 2])
    assert deferred.cancel(job.id).state == "cancelled"
    assert deferred.drain() == 0 and deferred.get(job.id).state == "cancelled"
