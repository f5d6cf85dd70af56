"""The handler context: what a running job knows about itself."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .models import HeartbeatReply, Job, JobProgress


class _Runtime(Protocol):
    """What a context needs from whatever runs the job (a worker, the inline client)."""

    worker_id: str

    async def report_progress(
        self, ctx: JobContext, progress: float, message: str | None, data: Any
    ) -> JobProgress | None: ...

    async def extend_lease(self, ctx: JobContext) -> HeartbeatReply | None: ...

    def loop(self) -> asyncio.AbstractEventLoop | None: ...


_current: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar("svc_client_job", default=None)


def current_job() -> JobContext | None:
    """The context of the job the calling code runs for (``None`` outside a handler)."""
    return _current.get()


class JobCancelled(Exception):
    """Raised by :meth:`JobContext.raise_if_cancelled` once the job's run was cancelled."""


class JobContext:
    """Passed to a handler that declares a ``ctx`` parameter (also :func:`current_job`).

    Attributes:
        job: the job as fetched (``args``, ``meta``, ``attempt``, ...).
        worker_id: the worker running it.
        deadline: when the job's ``timeout_ms`` runs out (UTC).
        traceparent: the producer's W3C trace context, if it sent one.
        cancel_event: set when the run is cancelled (timeout, terminate,
            shutdown); a sync handler should check it between steps.
        state: a dict for middleware and handlers to share things in.
    """

    def __init__(self, job: Job, runtime: _Runtime, timeout_s: float | None) -> None:
        self.job = job
        self._runtime = runtime
        self.worker_id = runtime.worker_id
        self.cancel_event = threading.Event()
        self.cancel_reason: str | None = None
        self.state: dict[str, Any] = {}
        self._started = time.monotonic()
        self._deadline_mono = self._started + timeout_s if timeout_s is not None else None
        self.deadline: datetime | None = (
            datetime.now(timezone.utc) + timedelta(seconds=timeout_s) if timeout_s is not None else None
        )

    # -------------------------------------------------------------- the job

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def type(self) -> str:
        return self.job.type

    @property
    def queue(self) -> str:
        return self.job.queue

    @property
    def args(self) -> list[Any]:
        return self.job.args

    @property
    def meta(self) -> dict[str, Any]:
        return self.job.meta

    @property
    def attempt(self) -> int:
        """This run's attempt, from 1."""
        return self.job.attempt

    @property
    def max_attempts(self) -> int:
        return self.job.max_attempts

    @property
    def traceparent(self) -> str | None:
        return self.job.traceparent

    @property
    def parent_results(self) -> list[Any] | None:
        """A workflow job's inputs: the results of the steps before it (chain) or of every job (batch callback)."""
        return self.job.parent_results

    # -------------------------------------------------------------- time and cancellation

    def time_left(self) -> float | None:
        """Seconds until the job's timeout (``None`` without one)."""
        if self._deadline_mono is None:
            return None
        return max(0.0, self._deadline_mono - time.monotonic())

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def raise_if_cancelled(self) -> None:
        """Raises :class:`JobCancelled` once the run was cancelled."""
        if self.cancel_event.is_set():
            raise JobCancelled(self.cancel_reason or "cancelled")

    def _cancel(self, reason: str) -> None:
        if not self.cancel_event.is_set():
            self.cancel_reason = reason
            self.cancel_event.set()

    # -------------------------------------------------------------- talking to the server

    def _blocking(self, coro: Any) -> Any:
        loop = self._runtime.loop()
        if loop is None:
            return _run_now(coro)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            coro.close()
            raise RuntimeError(
                "this blocking call would stall the worker's event loop: "
                "in an async handler use the *_async variant (await ctx.progress_async(...))"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def progress(self, fraction: float, message: str | None = None, data: Any = None) -> JobProgress | None:
        """Reports how far the job got (``PUT /jobs/{id}/progress``); for sync handlers.

        ``fraction`` is clamped to 0..1 by the server. Returns the stored
        report, or ``None`` when it could not be sent (logged, never raised).
        """
        result: JobProgress | None = self._blocking(self._runtime.report_progress(self, fraction, message, data))
        return result

    async def progress_async(self, fraction: float, message: str | None = None, data: Any = None) -> JobProgress | None:
        """:meth:`progress` for async handlers."""
        return await self._runtime.report_progress(self, fraction, message, data)

    def extend_lease(self) -> HeartbeatReply | None:
        """Sends a heartbeat for this job now (moves its visibility deadline); for sync handlers."""
        result: HeartbeatReply | None = self._blocking(self._runtime.extend_lease(self))
        return result

    async def extend_lease_async(self) -> HeartbeatReply | None:
        """:meth:`extend_lease` for async handlers."""
        return await self._runtime.extend_lease(self)

    def __repr__(self) -> str:
        return f"JobContext(id={self.id!r}, type={self.type!r}, attempt={self.attempt})"


def _run_now(coro: Any) -> Any:
    """Runs a coroutine that never suspends (an inline runtime's) to its end."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("this runtime's call suspended; use the *_async variant")


def set_current(ctx: JobContext | None) -> contextvars.Token[JobContext | None]:
    return _current.set(ctx)


def reset_current(token: contextvars.Token[JobContext | None]) -> None:
    _current.reset(token)
