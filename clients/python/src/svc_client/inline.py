"""Inline mode: run handlers in process, without a server, for unit tests.

>>> inline = worker.inline()                  # or InlineClient({"email.send": send})
>>> job = inline.enqueue("email.send", ["ada@example.com"])
>>> job.state, job.result
('completed', {'sent': True})

With ``eager=True`` (the default) :meth:`InlineClient.enqueue` runs the
job, and its retries, before it returns; with ``eager=False`` jobs wait
until :meth:`InlineClient.drain`. Jobs a handler enqueues through the
inline client run the same way. What inline mode leaves out: time
(``delay``, ``scheduled_at``, retry intervals and ``expires_at`` are
recorded, not waited for), unique policies, rate limits, queues' order and
pauses, timeouts, leases. Middleware (``before_enqueue``, ``enqueue``,
``execute``) and the trace context work as in a real worker.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from datetime import datetime, timezone
from typing import Any, Callable, Coroutine, Mapping, Sequence, TypeVar

from . import tracing
from ._common import failure_body
from ._wire import Duration, Timestamp, format_timestamp, new_job_id
from .context import JobContext, reset_current, set_current
from .errors import DuplicateError, NotFoundError
from .middleware import Middleware, chain_execute, chain_sync
from .models import (
    HeartbeatReply,
    Job,
    JobInput,
    JobProgress,
    JobSpec,
    PolicyInput,
    RateLimitInput,
    UniqueInput,
    job_body,
)
from .worker import UNKNOWN_JOB_TYPE, _Handler, make_handler

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class InlineJobFailed(Exception):
    """Raised (with ``raise_errors``) when an inline job ends discarded.

    ``job`` is the discarded job; the handler's exception is the ``__cause__``.
    """

    def __init__(self, job: Job) -> None:
        error = job.error
        super().__init__(f"job {job.id} ({job.type}) failed: {error.type if error else '?'}: {error.message if error else ''}")
        self.job = job


def _now() -> str:
    return format_timestamp(datetime.now(timezone.utc))


def _drive(coro: Coroutine[Any, Any, T]) -> T:
    """Runs a coroutine to its end from sync code, inside a running loop or not."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: list[Any] = []

    def target() -> None:
        try:
            box.append((True, asyncio.run(coro)))
        except BaseException as exc:  # handed back to the caller
            box.append((False, exc))

    thread = threading.Thread(target=target, name="svc-inline")
    thread.start()
    thread.join()
    ok, value = box[0]
    if not ok:
        raise value
    result: T = value
    return result


class _InlineRuntime:
    def __init__(self, client: InlineClient) -> None:
        self._client = client
        self.worker_id = "inline"

    async def report_progress(self, ctx: JobContext, progress: float, message: str | None, data: Any) -> JobProgress:
        return self._client._record_progress(ctx.id, progress, message, data)

    async def extend_lease(self, ctx: JobContext) -> HeartbeatReply:
        return HeartbeatReply(state="running", jobs_extended=1, server_time=datetime.now(timezone.utc))

    def loop(self) -> asyncio.AbstractEventLoop | None:
        return None


class InlineClient:
    """A stand-in for :class:`~svc_client.Client` plus a worker, in one process.

    ``handlers`` maps job types to handlers (called as a worker calls them).
    ``raise_errors=True`` raises :class:`InlineJobFailed` when a job ends
    discarded (from :meth:`enqueue` when eager, else from :meth:`drain`).
    """

    def __init__(
        self,
        handlers: Mapping[str, Callable[..., Any]] | None = None,
        *,
        eager: bool = True,
        raise_errors: bool = True,
        middleware: Sequence[Middleware] = (),
        traceparent_provider: tracing.TraceparentProvider | None = None,
    ) -> None:
        self.eager = eager
        self.raise_errors = raise_errors
        self.middleware = list(middleware)
        self.traceparent_provider = traceparent_provider
        self._handlers: dict[str, _Handler] = {}
        for name, fn in (handlers or {}).items():
            self.register(name, fn)
        self._jobs: dict[str, dict[str, Any]] = {}
        self._progress: dict[str, dict[str, Any]] = {}
        self._ready: deque[str] = deque()
        self._lock = threading.RLock()

    # ------------------------------------------------------------ handlers

    def handler(self, job_type: str) -> Callable[[F], F]:
        def register(fn: F) -> F:
            self.register(job_type, fn)
            return fn

        return register

    def register(self, job_type: str, fn: Callable[..., Any]) -> None:
        self._handlers[job_type] = make_handler(fn)

    # ------------------------------------------------------------ producing

    def enqueue(
        self,
        type: str,
        args: Sequence[Any] | None = None,
        *,
        id: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        delay: Duration | None = None,
        scheduled_at: Timestamp | None = None,
        expires_at: Timestamp | None = None,
        ttl: Duration | None = None,
        retry: PolicyInput | None = None,
        unique: UniqueInput | None = None,
        tags: Sequence[str] | None = None,
        timeout: Duration | None = None,
        visibility_timeout: Duration | None = None,
        meta: Mapping[str, Any] | None = None,
        schema: str | None = None,
        rate_limit: RateLimitInput | None = None,
        pending: bool | None = None,
        traceparent: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Job:
        """Records a job as :meth:`Client.enqueue` would send it; runs it now when eager."""
        spec = JobSpec(
            type=type, args=tuple(args or ()), id=id, queue=queue, priority=priority, delay=delay,
            scheduled_at=scheduled_at, expires_at=expires_at, ttl=ttl, retry=retry, unique=unique, tags=tags,
            timeout=timeout, visibility_timeout=visibility_timeout, meta=meta, schema=schema,
            rate_limit=rate_limit, pending=pending, traceparent=traceparent, extra=extra,
        )
        return self.enqueue_batch([spec])[0]

    def enqueue_batch(self, items: Sequence[JobInput]) -> list[Job]:
        bodies = [self._prepare(job_body(item)) for item in items]
        stored = chain_sync(self.middleware, self._store)(bodies)
        if self.eager:
            for job in stored:
                if job.state == "available":
                    self._run_until_done(job.id)
            return [self.get(job.id) for job in stored]
        return stored

    def _prepare(self, body: dict[str, Any]) -> dict[str, Any]:
        meta = body.get("meta")
        if not isinstance(meta, Mapping) or "traceparent" not in meta:
            traceparent = tracing.resolve(None, self.traceparent_provider)
            if traceparent is not None:
                body["meta"] = {**(meta if isinstance(meta, Mapping) else {}), "traceparent": traceparent}
        for mw in self.middleware:
            mw.before_enqueue(body)
        return body

    def _store(self, bodies: list[dict[str, Any]]) -> list[Job]:
        out = []
        with self._lock:
            for body in bodies:
                job_id = body.get("id") or new_job_id()
                if job_id in self._jobs:
                    raise DuplicateError(
                        f"job id {job_id} is already in use", code="duplicate", status=409,
                        details={"existing_job_id": job_id},
                    )
                options = dict(body.get("options") or {})
                retry = dict(options.get("retry") or {})
                max_attempts = int(retry.get("max_attempts", 3))
                state = "pending" if options.get("pending") else "available"
                now = _now()
                record: dict[str, Any] = {
                    "specversion": "1.0",
                    "id": job_id,
                    "type": body["type"],
                    "queue": options.get("queue", body.get("queue", "default")),
                    "args": list(body.get("args") or []),
                    "meta": dict(body.get("meta") or {}),
                    "state": state,
                    "priority": options.get("priority", 0),
                    "attempt": 0,
                    "max_attempts": max_attempts,
                    "timeout_ms": options.get("timeout_ms", 30_000),
                    "visibility_timeout_ms": options.get("visibility_timeout_ms", 30_000),
                    "retry": {"max_attempts": max_attempts, **retry},
                    "tags": list(options.get("tags") or []),
                    "created_at": now,
                    "options": options,
                    "errors": [],
                }
                if state == "available":
                    record["enqueued_at"] = now
                    self._ready.append(job_id)
                self._jobs[job_id] = record
                out.append(Job.from_json(record))
        return out

    # ------------------------------------------------------------ reading

    def get(self, job_id: str) -> Job:
        with self._lock:
            record = self._jobs.get(job_id)
            if record is None:
                raise NotFoundError(f"job {job_id} not found", code="not_found", status=404)
            return Job.from_json(record)

    @property
    def jobs(self) -> list[Job]:
        """Every job enqueued so far, in order."""
        with self._lock:
            return [Job.from_json(r) for r in self._jobs.values()]

    def jobs_of(self, job_type: str) -> list[Job]:
        return [j for j in self.jobs if j.type == job_type]

    def progress(self, job_id: str) -> JobProgress:
        with self._lock:
            record = self._jobs.get(job_id)
            if record is None:
                raise NotFoundError(f"job {job_id} not found", code="not_found", status=404)
            report = self._progress.get(job_id, {})
            return JobProgress.from_json(
                {"job_id": job_id, "state": record["state"], "attempt": record["attempt"],
                 "progress": report.get("progress"), "message": report.get("message"),
                 "data": report.get("data"), "updated_at": report.get("updated_at")}
            )

    def cancel(self, job_id: str) -> Job:
        with self._lock:
            record = self._jobs.get(job_id)
            if record is None:
                raise NotFoundError(f"job {job_id} not found", code="not_found", status=404)
            if record["state"] not in ("completed", "discarded", "cancelled"):
                record["previous_state"] = record["state"]
                record["state"] = "cancelled"
                record["cancelled_at"] = _now()
            return Job.from_json(record)

    def activate(self, job_id: str) -> Job:
        with self._lock:
            record = self._jobs[job_id]
            if record["state"] == "pending":
                record["state"] = "available"
                record["activated_at"] = record["enqueued_at"] = _now()
                self._ready.append(job_id)
        if self.eager:
            self._run_until_done(job_id)
        return self.get(job_id)

    def clear(self) -> None:
        """Forgets every job."""
        with self._lock:
            self._jobs.clear()
            self._progress.clear()
            self._ready.clear()

    # ------------------------------------------------------------ running

    def drain(self, max_jobs: int | None = None) -> int:
        """Runs waiting jobs (and those they enqueue, and retries) until none is left.

        Returns how many runs were made. With ``raise_errors``, raises
        :class:`InlineJobFailed` for the first job that ended discarded, after draining.
        """
        runs = 0
        failed: list[tuple[Job, BaseException | None]] = []
        while max_jobs is None or runs < max_jobs:
            with self._lock:
                if not self._ready:
                    break
                job_id = self._ready.popleft()
            if self._jobs[job_id]["state"] not in ("available", "retryable"):
                continue  # cancelled while it waited
            error = self._run_once(job_id)
            runs += 1
            job = self.get(job_id)
            if job.state == "discarded":
                failed.append((job, error))
        if failed and self.raise_errors:
            job, error = failed[0]
            raise InlineJobFailed(job) from error
        return runs

    def _run_until_done(self, job_id: str) -> None:
        while True:
            with self._lock:
                if job_id in self._ready:
                    self._ready.remove(job_id)
            error = self._run_once(job_id)
            job = self.get(job_id)
            if job.state == "retryable":
                continue
            if job.state == "discarded" and self.raise_errors:
                raise InlineJobFailed(job) from error
            return

    def _run_once(self, job_id: str) -> BaseException | None:
        with self._lock:
            record = self._jobs[job_id]
            if record["state"] not in ("available", "retryable"):
                return None
            record["state"] = "active"
            record["attempt"] += 1
            record["started_at"] = _now()
            record["worker_id"] = "inline"
            self._progress.pop(job_id, None)
            job = Job.from_json(record)
        handler = self._handlers.get(job.type)
        timeout = job.timeout_ms / 1000.0 if job.timeout_ms else None
        ctx = JobContext(job, _InlineRuntime(self), timeout)
        error: BaseException | None = None
        result: Any = None
        if handler is None:
            report: dict[str, Any] = {
                "type": UNKNOWN_JOB_TYPE,
                "message": f"no handler for job type {job.type!r} (handles: {', '.join(sorted(self._handlers)) or 'none'})",
            }
            error = LookupError(report["message"])
        else:
            try:
                result = _drive(self._execute(handler, job, ctx))
            except Exception as exc:  # the handler's failure
                error = exc
            report = failure_body(error) if error is not None else {}
        with self._lock:
            record = self._jobs[job_id]
            if record["state"] == "cancelled":
                return error
            now = _now()
            if error is None:
                record["state"] = "completed"
                record["completed_at"] = now
                if result is not None:
                    record["result"] = result
                record.pop("error", None)
                return None
            entry = {**report, "attempt": record["attempt"], "occurred_at": now}
            record["error"] = entry
            record["errors"] = (record["errors"] + [entry])[-20:]
            final = report.get("retryable") is False or record["attempt"] >= max(record["max_attempts"], 1)
            if final:
                record["state"] = "discarded"
                record["discarded_at"] = record["completed_at"] = now
            else:
                record["state"] = "retryable"
                record["retry_at"] = now
                if not self.eager:
                    self._ready.append(job_id)
        return error

    async def _execute(self, handler: _Handler, job: Job, ctx: JobContext) -> Any:
        async def invoke() -> Any:
            args, kwargs = handler.call_args(job, ctx)
            value = handler.fn(*args, **kwargs)
            if handler.is_async:
                value = await value
            return value

        trace_token = tracing.set_current(job.traceparent)
        ctx_token = set_current(ctx)
        try:
            return await chain_execute(self.middleware, ctx, invoke)()
        finally:
            reset_current(ctx_token)
            tracing.reset_current(trace_token)

    def _record_progress(self, job_id: str, progress: float, message: str | None, data: Any) -> JobProgress:
        with self._lock:
            self._progress[job_id] = {
                "progress": min(1.0, max(0.0, float(progress))),
                "message": message,
                "data": data,
                "updated_at": _now(),
            }
            record = self._jobs[job_id]
            record["progress"] = self._progress[job_id]["progress"]
            if message is not None:
                record["progress_message"] = message
        return self.progress(job_id)

