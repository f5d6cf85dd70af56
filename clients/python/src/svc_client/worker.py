"""The worker: fetches jobs, runs handlers, reports the outcome.

One asyncio loop drives everything: an ack loop (acks of jobs that finish
close together go in one request, which also claims the next jobs for the
free slots), a fetch loop (long polls for free slots the acks did not
fill: when idle, after failures), a heartbeat loop (every third of the
visibility timeout while jobs are in hand), and one task per job. Sync
handlers run on a pool of daemon threads, async handlers on the loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import inspect
import logging
import os
import queue
import random
import re
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

import httpx

from . import _ops, tracing
from ._common import failure_body
from ._keepalive import KeepAliveTransport
from ._transport import Call, RetryConfig, may_have_applied, server_root, transient
from ._wire import Duration, dumps, to_millis
from .aio import AsyncClient
from .context import JobContext, reset_current, set_current
from .errors import (
    AuthError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    SvcError,
    TransportError,
    ValidationError,
    error_from_item,
)
from .middleware import Middleware, chain_execute
from .models import HeartbeatReply, Job, JobProgress

if TYPE_CHECKING:
    from .inline import InlineClient

log = logging.getLogger("svc_client.worker")

F = TypeVar("F", bound=Callable[..., Any])

_WORKER_ID_RE = re.compile(r"[^A-Za-z0-9._:@-]")
_QUEUE_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,127}$")

#: Error types the worker reports.
UNKNOWN_JOB_TYPE = "unknown_job_type"
TIMEOUT = "timeout"
WORKER_SHUTDOWN = "worker_shutdown"
WORKER_TERMINATED = "worker_terminated"
INVALID_RESULT = "invalid_result"

#: Jobs one ack request names at most (svc's limit).
_ACKS_MAX = 100
#: Result bytes one ack request carries at most, so that a request stays
#: within svc's 2 MiB body limit; a larger result goes alone.
_ACK_BATCH_BYTES = 1 << 20
#: Ack requests in flight at once: one, and more only while full ones wait.
_ACK_FLIGHTS = 4
#: In flight at once when acks go one job a request (a server without ``acks``).
_ONE_JOB_ACK_FLIGHTS = 16


def default_worker_id() -> str:
    """``<host>:<pid>:<random>``, in the characters svc allows."""
    raw = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    return _WORKER_ID_RE.sub("-", raw)[:256]


@dataclass
class _Handler:
    fn: Callable[..., Any]
    is_async: bool
    ctx_mode: str  # "none", "first" (ctx positional, first) or "keyword"

    def call_args(self, job: Job, ctx: JobContext) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.ctx_mode == "first":
            return (ctx, *job.args), {}
        if self.ctx_mode == "keyword":
            return tuple(job.args), {"ctx": ctx}
        return tuple(job.args), {}


def make_handler(fn: Callable[..., Any]) -> _Handler:
    if not callable(fn):
        raise TypeError("a handler must be callable")
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
    mode = "none"
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    for index, param in enumerate(params):
        if param.name != "ctx" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if index == 0 and param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            mode = "first"
        elif param.kind is param.POSITIONAL_ONLY:
            raise TypeError("a positional-only ctx parameter must come first")
        else:
            mode = "keyword"
        break
    return _Handler(fn=fn, is_async=is_async, ctx_mode=mode)


class _ThreadPool:
    """Daemon threads for sync handlers: a handler still running at exit
    (after its job was released) never keeps the process alive."""

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._idle > 0:
                self._idle -= 1  # an idle thread takes it
            elif len(self._threads) < self._size:
                thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
            # else every thread is busy: it waits in the queue
        self._queue.put(fn)

    def _work(self) -> None:
        while True:
            fn = self._queue.get()
            if fn is None:
                return
            try:
                fn()
            finally:
                with self._lock:
                    self._idle += 1

    def shutdown(self) -> None:
        for _ in self._threads:
            self._queue.put(None)


@dataclass(eq=False)
class _Held:
    """A job in hand, from its claim until its outcome is reported (or given up)."""

    job: Job
    ctx: JobContext
    visibility_s: float
    lease_until: float
    task: asyncio.Task[None] | None = None
    settled: bool = False
    released: bool = False
    slot_freed: bool = False
    #: The slot is free but the outcome not yet known (a sync handler returned).
    settling: bool = False
    #: Bytes of the result as JSON, once the handler returned one.
    result_size: int = 0
    #: Done once the outcome is reported or given up: the nack's task, or
    #: for an ack a future the ack loop resolves.
    settle_task: asyncio.Future[None] | None = None


@dataclass(eq=False)
class _AckItem:
    """An ack waiting to be sent (or sent again)."""

    held: _Held
    result: Any
    queued_at: float
    #: Resolved once the ack is reported, refused or given up (the held
    #: job's ``settle_task`` until then).
    done: asyncio.Future[None]
    #: Tries that failed so far: an ack sent again never carries a fetch.
    failures: int = 0
    #: The last failed try may have been applied: check the claim before sending again.
    ambiguous: bool = False
    #: Goes in a request of its own.
    solo: bool = False


async def _wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Waits for ``event`` up to ``timeout`` seconds; whether it was set.

    Unlike ``asyncio.wait_for`` on Python 3.10/3.11, a cancellation that
    meets the event being set is never lost.
    """
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
    finally:
        if not waiter.done():
            waiter.cancel()
    return bool(done)


class _Backoff:
    def __init__(self, base: float = 0.1, cap: float = 5.0) -> None:
        self.base = base
        self.cap = cap
        self.n = 0

    def next(self) -> float:
        delay = min(self.cap, self.base * (2.0**self.n))
        self.n = min(self.n + 1, 30)
        return delay * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.n = 0


class Worker:
    """Runs handlers for jobs of ``queues`` (most important first).

    Args:
        url: the server's root, e.g. ``http://127.0.0.1:8080``.
        queues: queue names in strict priority order.
        concurrency: jobs run at once (at most 1000).
        api_key: a key with the ``worker`` (or ``admin``) role.
        worker_id: this worker's id in svc's registry (default: host, pid, random).
        wait: long-poll time of a fetch, seconds (at most 20).
        visibility_timeout: sent with fetches and heartbeats to override the
            jobs' own; heartbeats go every third of it.
        heartbeat_interval: overrides that third.
        shutdown_grace: seconds jobs in hand get to finish on SIGTERM/SIGINT
            (or :meth:`stop`) before they are released back to the queue.
        handle_signals: install SIGTERM/SIGINT handlers in :meth:`run` (main thread only).
        middleware: :class:`Middleware` whose ``execute`` wraps each run.
        settle_timeout: at shutdown, how long reporting outcomes may still
            take after the grace period (a stop takes at most
            ``shutdown_grace + settle_timeout``).
        idle_heartbeat: heartbeat period while quiet with nothing in hand.
        fetch_linger: while jobs run and only a few slots are free (under a
            quarter), how long the fetch loop waits for more to free up
            before a fetch of its own, so that one fetch claims several jobs.
        ack_linger: how long an ack may wait for others to finish and go in
            the same request, when no ack request is in flight and other
            jobs still run (acks finishing while one is in flight go in the
            next).
        transport: an httpx transport to send requests through (proxies, tests).
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        queues: Sequence[str] = ("default",),
        concurrency: int = 10,
        api_key: str | None = None,
        worker_id: str | None = None,
        *,
        wait: float = 20.0,
        visibility_timeout: Duration | None = None,
        heartbeat_interval: float | None = None,
        shutdown_grace: float = 25.0,
        handle_signals: bool = True,
        middleware: Sequence[Middleware] = (),
        headers: Mapping[str, str] | None = None,
        settle_timeout: float = 4.0,
        idle_heartbeat: float = 5.0,
        fetch_linger: float = 0.02,
        ack_linger: float = 0.002,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if isinstance(queues, str):
            queues = [queues]
        queues = list(dict.fromkeys(queues))
        if not 1 <= len(queues) <= 32:
            raise ValueError("a worker needs 1 to 32 queues")
        for name in queues:
            if not _QUEUE_RE.match(name):
                raise ValueError(f"not a queue name svc accepts: {name!r}")
        if not 1 <= concurrency <= 1000:
            raise ValueError("concurrency must be 1 to 1000")
        if worker_id is not None and (not worker_id or _WORKER_ID_RE.search(worker_id) or len(worker_id) > 256):
            raise ValueError("worker_id: 1-256 characters of A-Z a-z 0-9 . _ : @ -")
        self.url = url
        self.queues = queues
        self.concurrency = concurrency
        self.api_key = api_key
        self.worker_id = worker_id or default_worker_id()
        self.wait = max(0.0, min(float(wait), 20.0))
        self.visibility_timeout_ms = to_millis(visibility_timeout) if visibility_timeout is not None else None
        self.heartbeat_interval = heartbeat_interval
        self.shutdown_grace = shutdown_grace
        self.handle_signals = handle_signals
        self.middleware = list(middleware)
        self.headers = dict(headers or {})
        self.settle_timeout = settle_timeout
        self.idle_heartbeat = idle_heartbeat
        self.fetch_linger = fetch_linger
        self.ack_linger = max(0.0, ack_linger)
        self._refill = max(1, concurrency // 4)
        self._transport = transport
        self._handlers: dict[str, _Handler] = {}
        self._reset_runtime()

    def _reset_runtime(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: AsyncClient | None = None
        self._pool: _ThreadPool | None = None
        self._held: dict[str, _Held] = {}
        #: Jobs whose handler holds a slot.
        self._busy = 0
        #: Slots promised to fetches in flight (the fetch loop's, and acks' ``fetch``).
        self._reserved = 0
        #: Slots freed by handlers whose outcome is not yet settled.
        self._settling = 0
        #: Acks waiting to be sent, oldest first.
        self._acks: collections.deque[_AckItem] = collections.deque()
        self._ack_wake: asyncio.Event | None = None
        self._ack_flights: set[asyncio.Task[None]] = set()
        #: Ack requests in flight that carry a fetch.
        self._fetching_flights = 0
        #: Tasks that wait to send an ack again.
        self._ack_retries: set[asyncio.Task[None]] = set()
        self._ack_backoff = _Backoff(base=0.05, cap=2.0)
        #: The server takes no ``acks``: one job a request, no fetch.
        self._one_job_acks = False
        #: What the server last told this worker: running, quiet, draining.
        self._remote = "running"
        self._stopping = False
        self._release_now = False
        self._fatal: BaseException | None = None
        self._wake: asyncio.Event | None = None
        self._stop_event: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self._changed: asyncio.Event | None = None
        self.stats = {"fetched": 0, "acked": 0, "nacked": 0, "released": 0}

    # ------------------------------------------------------------------ registration

    def handler(self, job_type: str) -> Callable[[F], F]:
        """Registers the decorated function for ``job_type``.

        The job's ``args`` are passed as positional arguments; a parameter
        named ``ctx`` gets the :class:`JobContext`. Its return value is the
        job's result (JSON); an exception fails the attempt.
        """

        def register(fn: F) -> F:
            self.register(job_type, fn)
            return fn

        return register

    def register(self, job_type: str, fn: Callable[..., Any]) -> None:
        """Registers ``fn`` for ``job_type`` (see :meth:`handler`)."""
        if not isinstance(job_type, str) or not job_type:
            raise ValueError("a job type is a non-empty string")
        self._handlers[job_type] = make_handler(fn)

    @property
    def handlers(self) -> dict[str, Callable[..., Any]]:
        return {name: h.fn for name, h in self._handlers.items()}

    def inline(self, *, eager: bool = True, raise_errors: bool = True) -> InlineClient:
        """An :class:`~svc_client.InlineClient` running this worker's handlers in process."""
        from .inline import InlineClient

        return InlineClient(self.handlers, eager=eager, raise_errors=raise_errors, middleware=self.middleware)

    # ------------------------------------------------------------------ running

    def run(self) -> None:
        """Runs until stopped (SIGTERM/SIGINT, :meth:`stop`, a ``terminate``
        from the server), then returns. Raises only for a fatal error such as
        a refused API key."""
        asyncio.run(self.run_async())

    def stop(self, *, release: bool = False) -> None:
        """Asks a running worker to stop (from any thread).

        Jobs in hand get ``shutdown_grace`` to finish; ``release=True``
        releases them at once.
        """
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._request_stop, release)
        except RuntimeError:
            pass

    async def run_async(self) -> None:
        """:meth:`run` for a program that runs its own event loop."""
        self._reset_runtime()
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._wake = asyncio.Event()
        self._stop_event = asyncio.Event()
        self._hurry = asyncio.Event()
        self._changed = asyncio.Event()
        self._ack_wake = asyncio.Event()
        connections = min(self.concurrency, 16) + 2
        transport = self._transport
        if transport is None and self.url.startswith("http://"):
            transport = KeepAliveTransport(connections)
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self._client = AsyncClient(
            self.url,
            self.api_key,
            headers=self.headers,
            limits=limits,
            transport=transport,
            retry=RetryConfig(attempts=4, backoff=0.1, max_backoff=2.0, max_elapsed=10.0),
        )
        self._pool = _ThreadPool(self.concurrency, f"svc-worker-{self.worker_id[:20]}")
        installed = self._install_signals(loop)
        log.info("worker %s started: queues=%s concurrency=%d", self.worker_id, self.queues, self.concurrency)
        fetcher = loop.create_task(self._fetch_loop(), name="svc-fetch")
        beater = loop.create_task(self._heartbeat_loop(), name="svc-heartbeat")
        acker = loop.create_task(self._ack_loop(), name="svc-ack")
        try:
            await self._stop_event.wait()
            await self._shutdown(fetcher)
        finally:
            background = [beater, fetcher, acker, *self._ack_flights, *self._ack_retries]
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            for sig in installed:
                try:
                    loop.remove_signal_handler(sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    pass
            await self._client.aclose()
            self._pool.shutdown()
            self._loop = None
            log.info("worker %s stopped (%s)", self.worker_id, self.stats)
        if self._fatal is not None:
            raise self._fatal

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[int]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return []
        installed: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        return installed

    def _on_signal(self, sig: int) -> None:
        if self._stopping:
            log.warning("worker %s: second signal, releasing jobs in hand now", self.worker_id)
            self._request_stop(True)
        else:
            log.info("worker %s: %s, finishing jobs in hand", self.worker_id, signal.Signals(sig).name)
            self._request_stop(False)

    def _request_stop(self, release: bool) -> None:
        self._stopping = True
        if release:
            self._release_now = True
            if self._hurry is not None:
                self._hurry.set()
        if self._stop_event is not None:
            self._stop_event.set()
        self._notify()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
        if self._wake is not None:
            self._wake.set()

    async def _wait_changed(self, timeout: float | None = None) -> None:
        assert self._changed is not None
        self._changed.clear()
        await _wait_event(self._changed, timeout)

    async def _shutdown(self, fetcher: asyncio.Task[None]) -> None:
        # Stop fetching first: a long poll cut short takes nothing with it.
        fetcher.cancel()
        await asyncio.gather(fetcher, return_exceptions=True)
        assert self._hurry is not None
        if not self._release_now and self._held:
            deadline = time.monotonic() + self.shutdown_grace
            while self._running_jobs() and not self._hurry.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                await self._wait_changed(min(left, 0.5))
        for held in list(self._held.values()):
            if not held.settled:
                self._release(held, self._release_reason())
        # Outcomes still to report. Jobs an ack in flight claims meanwhile
        # are released as they come (see _took), which adds to them.
        deadline = time.monotonic() + self.settle_timeout
        while True:
            pending = {
                h.settle_task for h in self._held.values() if h.settle_task is not None and not h.settle_task.done()
            }
            if not pending:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                log.error(
                    "worker %s: %d outcomes not reported before exit; the server retries those jobs after their lease",
                    self.worker_id, len(pending),
                )
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                break
            await asyncio.wait(pending, timeout=left)
        stray = [h.task for h in self._held.values() if h.task is not None and not h.task.done()]
        for task in stray:
            task.cancel()
        await asyncio.gather(*stray, return_exceptions=True)

    def _release_reason(self) -> str:
        return WORKER_TERMINATED if self._remote == "terminate" else WORKER_SHUTDOWN

    def _running_jobs(self) -> bool:
        return any(not h.settled or (h.settle_task is not None and not h.settle_task.done()) for h in self._held.values())

    # ------------------------------------------------------------------ fetching

    def _may_fetch(self) -> bool:
        return not self._stopping and self._remote == "running"

    def _free(self) -> int:
        """Slots neither running a handler nor promised to a fetch in flight."""
        return self.concurrency - self._busy - self._reserved

    def _acks_will_fetch(self) -> bool:
        """Whether an ack about to go (or on its way) claims jobs for free slots."""
        if self._fetching_flights:
            return True
        if self._one_job_acks:
            return False
        return any(item.failures == 0 and not item.solo for item in self._acks)

    async def _fetch_loop(self) -> None:
        """Claims jobs for free slots that no ack fills: long polls while the
        worker is idle, and fetches after failures, releases, or an ack whose
        fetch came back short."""
        assert self._client is not None
        backoff = _Backoff()
        early = _Backoff(base=0.25, cap=5.0)
        linger_until: float | None = None
        while not self._stopping:
            if self._remote != "running":
                linger_until = None
                await self._wait_changed(self.idle_heartbeat)
                continue
            # Slots whose handler returned wait for their outcome: an ack
            # fetches for them in the same request.
            free = self._free() - self._settling
            if free <= 0 or self._acks_will_fetch():
                await self._wait_changed()
                continue
            if free < self._refill and self._busy > 0:
                # A slot or two just freed while others still run: wait a
                # moment for more, so that one fetch claims several jobs.
                now = time.monotonic()
                if linger_until is None:
                    linger_until = now + self.fetch_linger
                if now < linger_until:
                    await self._wait_changed(linger_until - now)
                    continue
            linger_until = None
            count = min(free, 100)
            call = _ops.fetch(self.queues, count, self.worker_id, int(self.wait * 1000), self.visibility_timeout_ms)
            started = time.monotonic()
            self._reserved += count
            try:
                jobs = call.parse(await self._client._send(call))
            except SvcError as exc:
                self._reserved -= count
                self._notify()
                if self._fatal_error(exc):
                    return
                delay = backoff.next()
                level = logging.WARNING if backoff.n == 1 else logging.DEBUG
                log.log(level, "worker %s: fetch failed (%s); again in %.2fs", self.worker_id, exc, delay)
                await self._sleep(delay)
                continue
            except BaseException:
                self._reserved -= count
                raise
            self._reserved -= count
            backoff.reset()
            received = time.monotonic()
            self._took(jobs, received)
            if jobs:
                early.reset()
                continue
            self._notify()
            if self.wait > 0 and received - started < self.wait * 0.9:
                # An empty answer before the wait was up: the server drains or
                # told this worker to stop. A heartbeat says which.
                await self._beat()
                if self._remote == "running" and not self._stopping:
                    await self._sleep(early.next())

    def _fatal_error(self, exc: SvcError) -> bool:
        if isinstance(exc, (AuthError, ValidationError)) or (exc.status == 404 and exc.details.get("resource_type") == "route"):
            log.error("worker %s: %s; stopping", self.worker_id, exc)
            self._fatal = exc
            self._request_stop(True)
            return True
        return False

    async def _sleep(self, seconds: float) -> None:
        """Sleeps, or less if the worker is asked to stop."""
        assert self._stop_event is not None
        await _wait_event(self._stop_event, seconds)

    # ------------------------------------------------------------------ heartbeats

    def _beat_interval(self) -> float | None:
        if self.heartbeat_interval is not None and (self._held or self._remote != "running"):
            return self.heartbeat_interval
        if self._held:
            if self.visibility_timeout_ms is not None:
                vis = self.visibility_timeout_ms / 1000.0
            else:
                vis = min(h.visibility_s for h in self._held.values())
            interval = max(0.05, vis / 3.0)
            if self._remote == "draining":
                interval = min(interval, 1.0)
            return interval
        if self._remote == "draining":
            return 1.0
        if self._remote == "quiet":
            return self.idle_heartbeat
        return None

    async def _heartbeat_loop(self) -> None:
        assert self._wake is not None
        last = time.monotonic()
        while True:
            interval = self._beat_interval()
            self._wake.clear()
            if interval is None:
                await self._wake.wait()
                last = time.monotonic()
                continue
            wait = last + interval - time.monotonic()
            if wait > 0 and await _wait_event(self._wake, wait):
                continue  # something changed: work out the interval again
            last = time.monotonic()
            await self._beat()

    async def _beat(self, only: Sequence[_Held] | None = None) -> HeartbeatReply | None:
        assert self._client is not None
        held = list(only) if only is not None else list(self._held.values())
        ids = [h.job.id for h in held][:1000]
        sent = time.monotonic()
        call = _ops.heartbeat(self.worker_id, ids, self.visibility_timeout_ms)
        try:
            reply = call.parse(await self._client._send(call))
        except SvcError as exc:
            if not self._fatal_error(exc):
                log.warning("worker %s: heartbeat failed (%s)", self.worker_id, exc)
            return None
        for h in held:
            h.lease_until = sent + h.visibility_s
        await self._obey(reply.state)
        return reply

    async def _obey(self, state: str) -> None:
        if state == "running":
            if self._remote != "running":
                log.info("worker %s: running again", self.worker_id)
                self._remote = "running"
                self._notify()
        elif state == "quiet":
            if self._remote != "quiet":
                log.info("worker %s: told to go quiet; finishing jobs in hand, fetching nothing", self.worker_id)
                self._remote = "quiet"
                self._notify()
        elif state == "terminate":
            if self._remote == "terminate":
                return
            if await self._draining():
                # The server itself is stopping: it answers every heartbeat
                # so. Finish what is in hand and carry on once it is back.
                if self._remote != "draining":
                    log.info("worker %s: the server is shutting down; finishing jobs in hand", self.worker_id)
                    self._remote = "draining"
                    self._notify()
                return
            log.info("worker %s: told to terminate; releasing jobs in hand", self.worker_id)
            self._remote = "terminate"
            self._request_stop(True)

    async def _draining(self) -> bool:
        """Whether a ``terminate`` comes from a server shutting down (``/ready``
        answers ``shutting_down``) rather than from an operator."""
        assert self._client is not None
        try:
            response = await self._client._http.get(server_root(self.url) + "/ready", timeout=5.0)
        except httpx.HTTPError:
            return True
        if response.status_code == 503:
            try:
                body = response.json()
            except ValueError:
                return True
            reason = body.get("error", {}).get("details", {}).get("reason") if isinstance(body, dict) else None
            text = str(body)
            return reason == "shutting_down" or "shutting_down" in text
        return False

    # ------------------------------------------------------------------ running a job

    def _took(self, jobs: Sequence[Job], received: float) -> None:
        """Jobs a fetch (or an ack's fetch) claimed: run them, or, once the
        worker is stopping, release them at once."""
        for job in jobs:
            held = self._hold(job, received)
            if self._stopping:
                self._release(held, self._release_reason())
            else:
                self._busy += 1
                assert self._loop is not None
                held.task = self._loop.create_task(self._execute(held), name=f"svc-job-{job.id}")
        if jobs:
            self._notify()

    def _hold(self, job: Job, received: float) -> _Held:
        self.stats["fetched"] += 1
        visibility = (self.visibility_timeout_ms or job.visibility_timeout_ms or 30_000) / 1000.0
        timeout = job.timeout_ms / 1000.0 if job.timeout_ms else None
        ctx = JobContext(job, _WorkerRuntime(self), timeout)
        held = _Held(job=job, ctx=ctx, visibility_s=visibility, lease_until=received + visibility)
        previous = self._held.get(job.id)
        if previous is not None and not previous.settled:
            # The server handed out a job this worker still runs: the earlier
            # run lost its lease. The new claim wins; the old run's outcome is
            # dropped (an ack of it still waiting is dropped too, see _stale).
            previous.released = True
            previous.ctx._cancel("lease lost")
        self._held[job.id] = held
        return held

    def _free_slot(self, held: _Held) -> None:
        if not held.slot_freed:
            held.slot_freed = True
            self._busy -= 1
            if not held.settled:
                held.settling = True
                self._settling += 1
            self._notify()

    async def _execute(self, held: _Held) -> None:
        job, ctx = held.job, held.ctx
        handler = self._handlers.get(job.type)
        if handler is None:
            self._free_slot(held)
            known = ", ".join(sorted(self._handlers)) or "none"
            self._settle(
                held,
                "nack",
                {
                    "type": UNKNOWN_JOB_TYPE,
                    "message": f"worker {self.worker_id} has no handler for job type {job.type!r} (it handles: {known})",
                    "details": {"job_type": job.type, "worker_id": self.worker_id},
                },
            )
            return
        trace_token = tracing.set_current(job.traceparent)
        ctx_token = set_current(ctx)
        try:
            outcome = await self._run_handler(held, handler)
        finally:
            reset_current(ctx_token)
            tracing.reset_current(trace_token)
            if handler.is_async:
                self._free_slot(held)
        if held.released or outcome is None:
            return
        kind, payload = outcome
        self._settle(held, kind, payload)

    async def _run_handler(self, held: _Held, handler: _Handler) -> tuple[str, Any] | None:
        ctx = held.ctx

        async def invoke() -> Any:
            if handler.is_async:
                args, kwargs = handler.call_args(held.job, ctx)
                return await handler.fn(*args, **kwargs)
            return await self._in_thread(held, handler)

        inner = asyncio.ensure_future(chain_execute(self.middleware, ctx, invoke)())
        try:
            done, _ = await asyncio.wait({inner}, timeout=ctx.time_left())
        except asyncio.CancelledError:
            inner.cancel()
            ctx._cancel("released")
            raise
        if inner not in done:
            limit = held.job.timeout_ms
            ctx._cancel("timeout")
            inner.cancel()
            await asyncio.gather(inner, return_exceptions=True)
            log.warning("worker %s: job %s (%s) ran past its timeout of %d ms", self.worker_id, held.job.id, held.job.type, limit)
            return "nack", {
                "type": TIMEOUT,
                "message": f"the handler ran past the job's timeout of {limit} ms",
                "details": {"limit_ms": limit, "worker_id": self.worker_id},
            }
        try:
            result = inner.result()
        except asyncio.CancelledError:
            if held.released:
                return None
            return "nack", {"type": "cancelled", "message": "the handler was cancelled"}
        except Exception as exc:  # the handler's failure
            return "nack", failure_body(exc)
        try:
            held.result_size = len(dumps(result))
        except (TypeError, ValueError) as exc:
            return "nack", {
                "type": INVALID_RESULT,
                "message": f"the handler's result is not JSON: {exc}",
                "retryable": False,
            }
        return "ack", result

    async def _in_thread(self, held: _Held, handler: _Handler) -> Any:
        assert self._loop is not None and self._pool is not None
        loop = self._loop
        future: asyncio.Future[Any] = loop.create_future()
        context = contextvars.copy_context()
        args, kwargs = handler.call_args(held.job, held.ctx)

        def deliver(ok: bool, value: Any) -> None:
            self._free_slot(held)
            if future.done():
                return
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

        def work() -> None:
            try:
                value = context.run(handler.fn, *args, **kwargs)
                ok = True
            except BaseException as exc:  # reported as the job's failure
                value, ok = exc, False
            try:
                loop.call_soon_threadsafe(deliver, ok, value)
            except RuntimeError:
                pass  # the loop is gone: the job was released at shutdown

        self._pool.submit(work)
        return await future

    def _release(self, held: _Held, reason: str) -> None:
        """Stops a run and gives the job back to the queue (nack with ``requeue``)."""
        if held.settled:
            return
        held.released = True
        held.ctx._cancel(reason)
        if held.task is not None and not held.task.done():
            held.task.cancel()
        self.stats["released"] += 1
        self._settle(
            held,
            "nack",
            {"type": reason, "message": f"worker {self.worker_id} stopped before the job finished; released"},
            requeue=True,
        )

    # ------------------------------------------------------------------ reporting outcomes

    def _settle(self, held: _Held, kind: str, payload: Any, *, requeue: bool = False) -> None:
        if held.settled:
            return
        held.settled = True
        if held.settling:
            held.settling = False
            self._settling -= 1
            self._notify()
        assert self._loop is not None
        if kind == "ack":
            # Acks go through the ack loop, several to a request.
            done: asyncio.Future[None] = self._loop.create_future()
            held.settle_task = done
            self._acks.append(_AckItem(held=held, result=payload, queued_at=time.monotonic(), done=done))
            assert self._ack_wake is not None
            self._ack_wake.set()
        else:
            held.settle_task = self._loop.create_task(self._report(held, payload, requeue))

    async def _report(self, held: _Held, error: Any, requeue: bool) -> None:
        """Sends a nack until it lands, the job is no longer ours, or its lease ran out."""
        assert self._client is not None
        job = held.job
        backoff = _Backoff(base=0.05, cap=2.0)
        ambiguous = False
        call = _ops.nack(job.id, error, requeue, self.worker_id)
        try:
            while True:
                if ambiguous and not await self._still_ours(held):
                    log.debug("worker %s: nack of %s landed before (or the claim is gone)", self.worker_id, job.id)
                    break
                try:
                    await self._client._send(call)
                    self.stats["nacked"] += 1
                    break
                except ConflictError as exc:
                    # Cancelled meanwhile, or the lease ran out and the job
                    # went back to the queue: nothing left to report.
                    log.warning("worker %s: nack of job %s refused: %s", self.worker_id, job.id, exc)
                    break
                except NotFoundError as exc:
                    log.warning("worker %s: job %s is gone: %s", self.worker_id, job.id, exc)
                    break
                except ValidationError as exc:
                    log.error("worker %s: nack of job %s refused: %s", self.worker_id, job.id, exc)
                    break
                except SvcError as exc:
                    if self._fatal_error(exc):
                        break
                    if may_have_applied(exc):
                        ambiguous = True
                    if not transient(exc):
                        log.error("worker %s: nack of job %s failed: %s", self.worker_id, job.id, exc)
                        break
                    if time.monotonic() > held.lease_until + 1.0:
                        log.error(
                            "worker %s: could not report nack of job %s before its lease ran out (%s); "
                            "the server will hand it out again",
                            self.worker_id, job.id, exc,
                        )
                        break
                    delay = backoff.next()
                    level = logging.WARNING if backoff.n == 1 else logging.DEBUG
                    log.log(
                        level, "worker %s: nack of job %s failed (%s); again in %.2fs",
                        self.worker_id, job.id, exc, delay,
                    )
                    await asyncio.sleep(delay)
        finally:
            if self._held.get(job.id) is held:
                del self._held[job.id]
            self._notify()

    # ------------------------------------------------------------------ acks

    async def _ack_loop(self) -> None:
        """Sends the acks waiting, several jobs a request (``acks``), with a
        ``fetch`` for the free slots while the worker is running.

        One request is in flight at a time (more only while full ones wait):
        acks that finish meanwhile go together in the next. With none in
        flight, an ack waits up to ``ack_linger`` for jobs still running to
        join it.
        """
        assert self._ack_wake is not None
        while True:
            self._ack_wake.clear()
            if self._acks and self._may_send_acks():
                if not self._ack_flights and not self._one_job_acks:
                    await self._linger_acks()
                batch = self._take_acks()
                if batch:
                    self._launch_acks(batch)
                continue
            await self._ack_wake.wait()

    def _may_send_acks(self) -> bool:
        flights = len(self._ack_flights)
        if self._one_job_acks:
            return flights < _ONE_JOB_ACK_FLIGHTS
        return flights == 0 or (flights < _ACK_FLIGHTS and len(self._acks) >= _ACKS_MAX)

    async def _linger_acks(self) -> None:
        assert self._ack_wake is not None
        deadline = self._acks[0].queued_at + self.ack_linger
        while len(self._acks) < _ACKS_MAX and (self._busy > 0 or self._settling > 0):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._ack_wake.clear()
            await _wait_event(self._ack_wake, left)
            if not self._acks:
                return

    def _stale(self, item: _AckItem) -> bool:
        """Whether an ack is no longer to be sent: given up at shutdown, or
        its claim superseded by a new one of the same job."""
        return item.done.done() or self._held.get(item.held.job.id) is not item.held

    def _take_acks(self) -> list[_AckItem]:
        """The next request's acks, in order: up to 100 and 1 MiB of results."""
        batch: list[_AckItem] = []
        size = 0
        limit = 1 if self._one_job_acks else _ACKS_MAX
        while self._acks and len(batch) < limit:
            item = self._acks[0]
            if self._stale(item):
                self._acks.popleft()
                self._ack_done(item)
                continue
            item_size = item.held.result_size
            if item_size > _ACK_BATCH_BYTES:
                item.solo = True
            if item.solo:
                if not batch:
                    batch.append(self._acks.popleft())
                break
            if batch and size + item_size > _ACK_BATCH_BYTES:
                break
            batch.append(self._acks.popleft())
            size += item_size
        return batch

    def _launch_acks(self, batch: list[_AckItem]) -> None:
        """Starts an ack request. What it fetches is decided, and its slots
        reserved, here and now: before the fetch loop looks again."""
        assert self._loop is not None
        # An ack alone in its request (a result svc refused in company, or
        # too large for it) goes in the one-job form, as it would without acks.
        one_job = self._one_job_acks or batch[0].solo
        count = 0
        if not one_job and self._may_fetch() and all(item.failures == 0 for item in batch):
            count = max(0, min(self._free(), 100))
        if count:
            self._reserved += count
            self._fetching_flights += 1
        task = self._loop.create_task(self._send_acks(batch, one_job, count), name="svc-ack-request")
        self._ack_flights.add(task)
        task.add_done_callback(self._ack_flight_done)

    def _ack_flight_done(self, task: asyncio.Task[None]) -> None:
        self._ack_flights.discard(task)
        if self._ack_wake is not None:
            self._ack_wake.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("worker %s: ack request failed unexpectedly", self.worker_id, exc_info=task.exception())

    async def _send_acks(self, batch: list[_AckItem], one_job: bool, count: int) -> None:
        """One ack request, with a fetch of ``count`` jobs (already reserved)."""
        assert self._client is not None
        call: Call[Any]
        if one_job:
            item = batch[0]
            call = _ops.ack(item.held.job.id, item.result, self.worker_id)
        else:
            fetch: dict[str, Any] | None = None
            if count:
                fetch = {"queues": self.queues, "count": count}
                if self.visibility_timeout_ms is not None:
                    fetch["visibility_timeout_ms"] = self.visibility_timeout_ms
            acks = [
                {"job_id": i.held.job.id} if i.result is None else {"job_id": i.held.job.id, "result": i.result}
                for i in batch
            ]
            call = _ops.ack_many(acks, self.worker_id, fetch)
        reserved = True
        try:
            try:
                answer = await self._client._send(call)
            except Exception as exc:
                self._unreserve(count)
                reserved = False
                if not isinstance(exc, SvcError):
                    log.error("worker %s: ack request failed unexpectedly", self.worker_id, exc_info=exc)
                    exc = TransportError(f"{type(exc).__name__}: {exc}", sent=True, cause=exc)
                self._ack_failed(batch, exc, many=not one_job)
                return
            received = time.monotonic()
            self._unreserve(count)
            reserved = False
            self._ack_backoff.reset()
            if one_job:
                self._acked(batch[0], {"acknowledged": True})
                return
            entries = answer.get("acks") if isinstance(answer, dict) else None
            if not isinstance(entries, list):
                entries = []
            for index, item in enumerate(batch):
                entry = entries[index] if index < len(entries) else None
                if isinstance(entry, dict) and entry.get("job_id") == item.held.job.id:
                    self._acked(item, entry)
                else:
                    log.error("worker %s: the answer to an ack says nothing of job %s", self.worker_id, item.held.job.id)
                    self._ack_done(item)
            self._took(_ops._jobs(answer), received)
        finally:
            if reserved:
                self._unreserve(count)

    def _unreserve(self, count: int) -> None:
        if count:
            self._reserved -= count
            self._fetching_flights -= 1
            self._notify()

    def _acked(self, item: _AckItem, entry: dict[str, Any]) -> None:
        """One ack's outcome as the answer tells it."""
        job = item.held.job
        if entry.get("acknowledged") is True:
            self.stats["acked"] += 1
            self._ack_done(item)
            return
        exc = error_from_item(entry.get("error"))
        if isinstance(exc, (ConflictError, NotFoundError)):
            # Cancelled meanwhile, or the lease ran out and the job went back
            # to the queue (or to another worker): nothing left to report.
            level = logging.DEBUG if item.failures else logging.WARNING
            log.log(level, "worker %s: ack of job %s refused: %s", self.worker_id, job.id, exc)
            self._ack_done(item)
        elif isinstance(exc, ValidationError):
            self._result_refused(item, exc)
        elif exc.retryable:
            self._ack_retry([item], exc)
        else:
            log.error("worker %s: ack of job %s refused: %s", self.worker_id, job.id, exc)
            self._ack_done(item)

    def _ack_failed(self, batch: list[_AckItem], exc: SvcError, *, many: bool) -> None:
        """A whole ack request failed (``many``: one in the ``acks`` form)."""
        index = exc.details.get("index")
        if (
            isinstance(exc, (ValidationError, ConflictError, NotFoundError))
            and isinstance(index, int)
            and not isinstance(index, bool)
            and 0 <= index < len(batch)
            and len(batch) > 1
        ):
            # One ack spoiled the request (before anything was applied): it
            # goes its own way, the others again at once.
            self._requeue_front(batch[:index] + batch[index + 1:])
            bad = batch[index]
            if isinstance(exc, ValidationError):
                self._result_refused(bad, exc)
            else:
                log.warning("worker %s: ack of job %s refused: %s", self.worker_id, bad.held.job.id, exc)
                self._ack_done(bad)
            return
        if isinstance(exc, ValidationError):
            if (
                many
                and not self._one_job_acks
                and exc.details.get("field") == "job_id"
                and "index" not in exc.details
                and not isinstance(exc, PayloadTooLargeError)
            ):
                log.warning(
                    "worker %s: the server does not take acks of several jobs (%s); acking one job a request",
                    self.worker_id, exc,
                )
                self._one_job_acks = True
                self._requeue_front(batch)
                return
            if many:
                # Which ack spoiled it is not said (a result nested too
                # deep for the body, say): each goes alone.
                for item in batch:
                    item.solo = True
                self._requeue_front(batch)
                return
            self._result_refused(batch[0], exc)
            return
        if self._fatal_error(exc):
            for item in batch:
                self._ack_done(item)
            return
        if isinstance(exc, (ConflictError, NotFoundError)) and len(batch) == 1:
            level = logging.DEBUG if batch[0].failures else logging.WARNING
            log.log(level, "worker %s: ack of job %s refused: %s", self.worker_id, batch[0].held.job.id, exc)
            self._ack_done(batch[0])
            return
        if not transient(exc):
            log.error("worker %s: ack of %d jobs failed: %s", self.worker_id, len(batch), exc)
            for item in batch:
                self._ack_done(item)
            return
        self._ack_retry(batch, exc)

    def _ack_retry(self, batch: list[_AckItem], exc: SvcError) -> None:
        """Sends acks again after a transient failure, until their lease runs out.
        After a try that may have landed, the claim is read first."""
        assert self._loop is not None
        ambiguous = may_have_applied(exc)
        delay = self._ack_backoff.next()
        level = logging.WARNING if self._ack_backoff.n == 1 else logging.DEBUG
        log.log(
            level, "worker %s: ack of %d jobs failed (%s); again in %.2fs",
            self.worker_id, len(batch), exc, delay,
        )
        now = time.monotonic()
        for item in batch:
            item.failures += 1
            item.ambiguous = item.ambiguous or ambiguous
            if now > item.held.lease_until + 1.0:
                log.error(
                    "worker %s: could not report ack of job %s before its lease ran out (%s); "
                    "the server will hand it out again",
                    self.worker_id, item.held.job.id, exc,
                )
                self._ack_done(item)
                continue
            task = self._loop.create_task(self._ack_again(item, delay))
            self._ack_retries.add(task)
            task.add_done_callback(self._ack_retries.discard)

    async def _ack_again(self, item: _AckItem, delay: float) -> None:
        await asyncio.sleep(delay)
        if self._stale(item):
            self._ack_done(item)
            return
        if item.ambiguous:
            if not await self._still_ours(item.held):
                log.debug("worker %s: ack of %s landed before (or the claim is gone)", self.worker_id, item.held.job.id)
                self._ack_done(item)
                return
            item.ambiguous = False
        self._acks.append(item)
        assert self._ack_wake is not None
        self._ack_wake.set()

    def _requeue_front(self, batch: list[_AckItem]) -> None:
        for item in reversed(batch):
            self._acks.appendleft(item)
        assert self._ack_wake is not None
        self._ack_wake.set()

    def _result_refused(self, item: _AckItem, exc: SvcError) -> None:
        """The server refused an ack's result (too large): the attempt fails instead."""
        held = item.held
        assert self._loop is not None
        log.warning("worker %s: result of job %s refused (%s); failing the attempt", self.worker_id, held.job.id, exc)
        payload = {"type": INVALID_RESULT, "message": f"result refused: {exc.message}"}
        held.settle_task = self._loop.create_task(self._report(held, payload, False))
        if not item.done.done():
            item.done.set_result(None)

    def _ack_done(self, item: _AckItem) -> None:
        """An ack reported, refused or given up: the job leaves the worker's hands."""
        held = item.held
        if not item.done.done():
            item.done.set_result(None)
        if self._held.get(held.job.id) is held:
            del self._held[held.job.id]
        self._notify()

    async def _still_ours(self, held: _Held) -> bool:
        """After a try that may have landed: is the claim we report on still current?"""
        assert self._client is not None
        while True:
            try:
                job = await self._client._run(_ops.get_job(held.job.id))
            except NotFoundError:
                return False
            except SvcError as exc:
                if time.monotonic() > held.lease_until + 1.0:
                    return False
                log.debug("worker %s: reading job %s failed (%s)", self.worker_id, held.job.id, exc)
                await asyncio.sleep(0.5)
                continue
            return (
                job.state == "active"
                and job.worker_id == self.worker_id
                and job.attempt == held.job.attempt
                and job.started_at == held.job.started_at
            )

    # ------------------------------------------------------------------ for contexts

    async def _progress(self, ctx: JobContext, fraction: float, message: str | None, data: Any) -> JobProgress | None:
        assert self._client is not None
        try:
            return await self._client._run(_ops.put_progress(ctx.id, fraction, message, data, self.worker_id))
        except ConflictError as exc:
            if exc.current_state in ("cancelled", "completed", "discarded", "retryable", "available"):
                ctx._cancel(f"the job is {exc.current_state}")
            log.warning("worker %s: progress of job %s refused: %s", self.worker_id, ctx.id, exc)
        except SvcError as exc:
            log.warning("worker %s: progress of job %s not sent: %s", self.worker_id, ctx.id, exc)
        return None

    async def _extend(self, ctx: JobContext) -> HeartbeatReply | None:
        held = self._held.get(ctx.id)
        if held is None or held.ctx is not ctx:
            return None
        return await self._beat([held])


class _WorkerRuntime:
    """The view of a worker a :class:`JobContext` gets."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self.worker_id = worker.worker_id

    async def report_progress(self, ctx: JobContext, progress: float, message: str | None, data: Any) -> JobProgress | None:
        return await self._worker._progress(ctx, progress, message, data)

    async def extend_lease(self, ctx: JobContext) -> HeartbeatReply | None:
        return await self._worker._extend(ctx)

    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._worker._loop

