"""The asynchronous client: the same surface as :class:`svc_client.Client`, awaited."""

from __future__ import annotations

import logging
import asyncio
import time
from typing import Any, Mapping, Sequence, TypeVar, overload

import httpx

from . import _ops
from ._common import Settings, cron_body, failure_body, webhook_body
from ._transport import Call, RetryConfig, Retrier, Safety, read_response, transport_error
from ._wire import Duration, Timestamp, to_millis
from .errors import SvcError
from .middleware import Middleware, chain_async
from .models import (
    AckInput,
    AckManyResult,
    CronEntry,
    FetchInput,
    HeartbeatReply,
    Job,
    JobInput,
    JobProgress,
    JobSpec,
    OverlapPolicy,
    Page,
    PolicyInput,
    QueueStats,
    QueueSummary,
    RateLimitInput,
    UniqueInput,
    WebhookSubscription,
    WorkerInfo,
    Workflow,
    ack_item_json,
    fetch_json,
)
from .tracing import TraceparentProvider

T = TypeVar("T")
log = logging.getLogger("svc_client")


class AsyncClient:
    """An asyncio producer (and admin) client for svc over one keep-alive connection pool.

    ``url`` is the server's root (``http://127.0.0.1:8080``); ``api_key``
    is sent as a bearer token. Transient failures are retried as ``retry``
    says, under the rules in the README ("Retries"). Use it as a context
    manager (``async with``) or await :meth:`aclose`.

    ``auto_id=True`` gives every enqueued job without an id a client-made
    UUIDv7, which makes every enqueue safe to retry (the host's clock must
    then be within an hour of the server's).
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        retry: RetryConfig | None = None,
        headers: Mapping[str, str] | None = None,
        middleware: Sequence[Middleware] = (),
        traceparent_provider: TraceparentProvider | None = None,
        auto_id: bool = False,
        transport: httpx.AsyncBaseTransport | None = None,
        limits: httpx.Limits | None = None,
    ) -> None:
        self._settings = Settings(url, api_key, timeout, retry, headers, middleware, traceparent_provider, auto_id)
        self._http = httpx.AsyncClient(
            base_url=self._settings.base_url,
            headers=self._settings.headers,
            timeout=self._settings.timeout,
            transport=transport,
            limits=limits or httpx.Limits(max_connections=100, max_keepalive_connections=20),
        )
        self.workflows = Workflows(self)
        self.cron = Cron(self)
        self.queues = Queues(self)
        self.dead_letter = DeadLetter(self)
        self.webhooks = Webhooks(self)
        self.workers = Workers(self)
        self.schemas = Schemas(self)

    # ------------------------------------------------------------ plumbing

    async def aclose(self) -> None:
        """Closes the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, call: Call[Any]) -> Any:
        try:
            response = await self._http.request(
                call.method,
                call.path,
                content=call.content(),
                headers=call.headers(),
                params=call.query(),
                timeout=call.timeout if call.timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.HTTPError as exc:
            raise transport_error(exc) from exc
        return read_response(response)

    async def _run(self, call: Call[T]) -> T:
        retrier = Retrier(self._settings.retry, call.safety, time.monotonic)
        while True:
            try:
                return call.parse(await self._send(call))
            except SvcError as exc:
                if retrier.ambiguous and call.recover is not None:
                    recovery = call.recover(exc)
                    if recovery is not None:
                        return recovery.combine([await self._run(c) for c in recovery.calls])
                delay = retrier.failed(exc)
                if delay is None:
                    raise
                log.debug("svc %s %s failed (%s); retrying in %.2fs", call.method, call.path, exc, delay)
                await asyncio.sleep(delay)

    async def request(self, method: str, path: str, body: Any = None, *, params: Mapping[str, Any] | None = None) -> Any:
        """Sends any API request (``path`` under ``/svc/v1``) and returns its JSON.

        Retried only when the failure proves it was not applied (GETs always).
        """
        call: Call[Any] = Call(
            method.upper(),
            path,
            lambda a: a,
            body=body,
            has_body=body is not None,
            params=params,
            safety=Safety.IDEMPOTENT if method.upper() == "GET" else Safety.UNSAFE,
        )
        return await self._run(call)

    # ------------------------------------------------------------ jobs

    async def enqueue(
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
        """Enqueues one job (``POST /jobs``) and returns it as stored.

        A unique policy with ``on_conflict="ignore"`` that meets a held job
        returns that job with ``deduplicated=True``. See :class:`JobSpec`
        for the options.
        """
        spec = JobSpec(
            type=type, args=tuple(args or ()), id=id, queue=queue, priority=priority, delay=delay,
            scheduled_at=scheduled_at, expires_at=expires_at, ttl=ttl, retry=retry, unique=unique, tags=tags,
            timeout=timeout, visibility_timeout=visibility_timeout, meta=meta, schema=schema,
            rate_limit=rate_limit, pending=pending, traceparent=traceparent, extra=extra,
        )
        return (await self._enqueue([self._settings.prepare(spec.to_json())], batch=False))[0]

    async def enqueue_batch(self, items: Sequence[JobInput]) -> list[Job]:
        """Enqueues many jobs atomically (``POST /jobs/batch``): all or nothing, in order."""
        bodies = self._settings.bodies(items)
        if not bodies:
            return []
        return await self._enqueue(bodies, batch=True)

    async def _enqueue(self, bodies: list[dict[str, Any]], *, batch: bool) -> list[Job]:
        async def send(final: list[dict[str, Any]]) -> list[Job]:
            if batch:
                return await self._run(_ops.enqueue_batch(final))
            return [await self._run(_ops.enqueue(final[0]))]

        return await chain_async(self._settings.middleware, send)(bodies)

    async def get(self, job_id: str) -> Job:
        """Reads a job (``GET /jobs/{id}``)."""
        return await self._run(_ops.get_job(job_id))

    async def cancel(self, job_id: str) -> Job:
        """Cancels a job that has not ended, an active one included (``DELETE /jobs/{id}``)."""
        return await self._run(_ops.cancel_job(job_id))

    async def activate(self, job_id: str) -> Job:
        """Releases a job enqueued with ``pending=True``."""
        return await self._run(_ops.activate_job(job_id))

    async def progress(self, job_id: str) -> JobProgress:
        """The current attempt's last progress report (``GET /jobs/{id}/progress``)."""
        return await self._run(_ops.get_progress(job_id))

    async def report_progress(
        self,
        job_id: str,
        progress: float,
        message: str | None = None,
        data: Any = None,
        *,
        worker_id: str | None = None,
    ) -> JobProgress:
        """Reports progress of an active job (``PUT /jobs/{id}/progress``)."""
        return await self._run(_ops.put_progress(job_id, progress, message, data, worker_id))

    # ------------------------------------------------------------ worker protocol

    async def fetch(
        self,
        queues: Sequence[str],
        count: int = 1,
        *,
        worker_id: str | None = None,
        wait: float = 0.0,
        visibility_timeout: Duration | None = None,
    ) -> list[Job]:
        """Claims up to ``count`` jobs, waiting up to ``wait`` seconds (20 at most) for one."""
        return await self._run(
            _ops.fetch(
                queues, count, worker_id, int(wait * 1000),
                to_millis(visibility_timeout) if visibility_timeout is not None else None,
            )
        )

    @overload
    async def ack(self, job_id: str, result: Any = None, *, worker_id: str | None = None, fetch: None = None) -> Job: ...

    @overload
    async def ack(
        self, job_id: str, result: Any = None, *, worker_id: str | None = None, fetch: FetchInput
    ) -> list[Job]: ...

    async def ack(
        self, job_id: str, result: Any = None, *, worker_id: str | None = None, fetch: FetchInput | None = None
    ) -> Job | list[Job]:
        """Completes an active job with ``result``; returns it as stored.

        With ``fetch`` (a :class:`FetchSpec`, or a fetch body), the next jobs
        are claimed for ``worker_id`` in the same durable step and returned
        instead: one round trip per job for a busy worker. A refused ack
        raises and claims nothing. Such an ack is sent again only after a
        failure that proves it was not applied: should its answer be lost,
        the jobs it claimed come back to their queues after their
        visibility timeout.
        """
        if fetch is None:
            return await self._run(_ops.ack(job_id, result, worker_id))
        return await self._run(_ops.ack_fetch(job_id, result, worker_id, fetch_json(fetch)))

    async def ack_many(
        self,
        acks: Sequence[AckInput],
        *,
        worker_id: str | None = None,
        fetch: FetchInput | None = None,
    ) -> AckManyResult:
        """Completes several jobs in one request (1 to 100), each on its own.

        ``acks`` holds job ids, ``(job_id, result)`` pairs or ``{"job_id",
        "result"}`` mappings. One refused (a lease lost, an unknown job)
        leaves the others done: the answer's ``acks`` say how each went, in
        order. With ``fetch``, the next jobs are claimed for ``worker_id``
        whatever the acks came to, and returned as ``jobs``. Without
        ``fetch`` the request is retried like an ack (an ack that landed on
        a lost try then shows as refused with ``current_state`` ``completed``);
        with it, only after a failure that proves nothing was applied.
        """
        if isinstance(acks, (str, bytes)) or not isinstance(acks, Sequence):
            raise TypeError("acks must be a list of job ids, (job_id, result) pairs or mappings")
        items = [ack_item_json(item) for item in acks]
        return await self._run(_ops.ack_many(items, worker_id, fetch_json(fetch) if fetch is not None else None))

    async def nack(
        self,
        job_id: str,
        error: BaseException | Mapping[str, Any],
        *,
        requeue: bool = False,
        retryable: bool | None = None,
        worker_id: str | None = None,
    ) -> Job:
        """Reports a failure: an exception (type, message, traceback) or an error mapping."""
        return await self._run(_ops.nack(job_id, failure_body(error, retryable), requeue, worker_id))

    async def heartbeat(
        self,
        worker_id: str,
        active_job_ids: Sequence[str] | None = None,
        *,
        visibility_timeout: Duration | None = None,
    ) -> HeartbeatReply:
        """Extends the claims of ``active_job_ids``; the answer says ``running``, ``quiet`` or ``terminate``."""
        return await self._run(
            _ops.heartbeat(
                worker_id, active_job_ids,
                to_millis(visibility_timeout) if visibility_timeout is not None else None,
            )
        )

    # ------------------------------------------------------------ misc

    async def events(
        self,
        *,
        types: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        job_types: Sequence[str] | None = None,
        subject: str | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> Page[dict[str, Any]]:
        """Recent events (``GET /events``), oldest first; page with ``after=page.cursor``."""
        return await self._run(_ops.list_events(types, queues, job_types, subject, after, limit))

    async def health(self) -> dict[str, Any]:
        """``GET /health``; raises :class:`UnavailableError` when the server is unhealthy."""
        return await self._run(_ops.health())

    async def wait_for(
        self,
        job_id: str,
        *,
        states: Sequence[str] = ("completed", "discarded", "cancelled"),
        timeout: float = 30.0,
        interval: float = 0.1,
    ) -> Job:
        """Polls a job until it is in one of ``states``; raises ``TimeoutError`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            job = await self.get(job_id)
            if job.state in states:
                return job
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is {job.state} after {timeout}s")
            await asyncio.sleep(interval)


class _Namespace:
    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def _run(self, call: Call[T]) -> T:
        return await self._client._run(call)


class Workflows(_Namespace):
    """Chains, groups and batches (``/workflows``)."""

    async def chain(
        self,
        steps: Sequence[JobInput],
        *,
        name: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> Workflow:
        """Runs ``steps`` one after the other; each gets the results before it (``parent_results``)."""
        return await self._run(_ops.create_workflow(self._client._settings.workflow("chain", steps, None, options), name))

    async def group(
        self,
        jobs: Sequence[JobInput],
        *,
        name: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> Workflow:
        """Runs ``jobs`` at once."""
        return await self._run(_ops.create_workflow(self._client._settings.workflow("group", jobs, None, options), name))

    async def batch(
        self,
        jobs: Sequence[JobInput],
        *,
        on_complete: JobInput | None = None,
        on_success: JobInput | None = None,
        on_failure: JobInput | None = None,
        name: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> Workflow:
        """Runs ``jobs`` at once, then the callbacks (at least one is required)."""
        callbacks = {"on_complete": on_complete, "on_success": on_success, "on_failure": on_failure}
        definition = self._client._settings.workflow("batch", jobs, callbacks, options)
        return await self._run(_ops.create_workflow(definition, name))

    async def get(self, workflow_id: str) -> Workflow:
        return await self._run(_ops.get_workflow(workflow_id))

    async def cancel(self, workflow_id: str) -> Workflow:
        """Cancels every job of a running workflow not yet ended."""
        return await self._run(_ops.cancel_workflow(workflow_id))


class Cron(_Namespace):
    """Recurring jobs (``/cron``)."""

    async def register(
        self,
        name: str,
        schedule: str,
        type: str,
        args: Sequence[Any] | None = None,
        *,
        timezone: str | None = None,
        queue: str | None = None,
        meta: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        overlap_policy: OverlapPolicy | None = None,
        enabled: bool | None = None,
        description: str | None = None,
        schema: str | None = None,
    ) -> CronEntry:
        """Registers (or replaces, by name) a cron entry.

        ``options`` are the fired jobs' enqueue options as svc names them
        (``priority``, ``timeout_ms``, ``retry``, ...); ``schema`` a
        registered JSON Schema their ``args`` must match.
        """
        body = cron_body(
            name, schedule, type, args, timezone=timezone, queue=queue, meta=meta, options=options,
            overlap_policy=overlap_policy, enabled=enabled, description=description, schema=schema,
        )
        return await self._run(_ops.register_cron(body))

    async def list(self, *, enabled: bool | None = None, limit: int | None = None, cursor: str | None = None) -> Page[CronEntry]:
        return await self._run(_ops.list_cron(enabled, limit, cursor))

    async def get(self, name: str) -> CronEntry:
        return await self._run(_ops.get_cron(name))

    async def update(self, name: str, **fields: Any) -> CronEntry:
        """Changes fields of an entry (``PATCH /cron/{name}``), e.g. ``enabled=False``."""
        return await self._run(_ops.update_cron(name, fields))

    async def delete(self, name: str) -> None:
        """Removes an entry; the jobs it created stay."""
        await self._run(_ops.delete_cron(name))


class Queues(_Namespace):
    """Queues: listing, statistics, pause and resume."""

    async def list(self, *, limit: int | None = None, cursor: str | None = None) -> Page[QueueSummary]:
        return await self._run(_ops.list_queues(limit, cursor))

    async def stats(self, name: str) -> QueueStats:
        return await self._run(_ops.queue_stats(name))

    async def pause(self, name: str) -> bool:
        """Pauses a queue (it refuses new work; fetches skip it). Returns ``paused``."""
        return await self._run(_ops.pause_queue(name))

    async def resume(self, name: str) -> bool:
        """Resumes a queue. Returns ``paused`` (``False``)."""
        return await self._run(_ops.resume_queue(name))


class DeadLetter(_Namespace):
    """Jobs that failed for good (``/dead-letter``)."""

    async def list(self, *, queue: str | None = None, limit: int | None = None, cursor: str | None = None) -> Page[Job]:
        return await self._run(_ops.list_dead_letter(queue, limit, cursor))

    async def retry(self, job_id: str) -> Job:
        """Sends a discarded job back to ``available`` with its attempts reset."""
        return await self._run(_ops.retry_dead_letter(job_id))

    async def delete(self, job_id: str) -> None:
        await self._run(_ops.delete_dead_letter(job_id))


class Webhooks(_Namespace):
    """Webhook subscriptions (``/webhooks``)."""

    async def create(
        self,
        url: str,
        events: Sequence[str],
        secret: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        filter: Mapping[str, Any] | None = None,
        active: bool | None = None,
    ) -> WebhookSubscription:
        return await self._run(_ops.create_webhook(webhook_body(url, events, secret, metadata, filter, active)))

    async def list(self, *, limit: int | None = None, cursor: str | None = None) -> Page[WebhookSubscription]:
        return await self._run(_ops.list_webhooks(limit, cursor))

    async def get(self, subscription_id: str) -> WebhookSubscription:
        return await self._run(_ops.get_webhook(subscription_id))

    async def update(
        self,
        subscription_id: str,
        *,
        url: str | None = None,
        events: Sequence[str] | None = None,
        secret: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        filter: Mapping[str, Any] | None = None,
        active: bool | None = None,
    ) -> WebhookSubscription:
        body = webhook_body(url, events, secret, metadata, filter, active)
        return await self._run(_ops.update_webhook(subscription_id, body))

    async def delete(self, subscription_id: str) -> None:
        await self._run(_ops.delete_webhook(subscription_id))

    async def rotate_secret(self, subscription_id: str, secret: str) -> WebhookSubscription:
        """Adds a new secret beside the current one (both sign until the rotation ends)."""
        return await self._run(_ops.rotate_webhook_secret(subscription_id, secret))

    async def end_rotation(self, subscription_id: str) -> WebhookSubscription:
        return await self._run(_ops.end_webhook_rotation(subscription_id))

    async def test(self, subscription_id: str) -> dict[str, Any]:
        """Sends a signed ``webhook.test`` event now and reports what the receiver said."""
        return await self._run(_ops.test_webhook(subscription_id))


class Workers(_Namespace):
    """The worker registry and its signals (admin)."""

    async def list(self, *, state: str | None = None, limit: int | None = None, cursor: str | None = None) -> Page[WorkerInfo]:
        return await self._run(_ops.list_workers(state, limit, cursor))

    async def get(self, worker_id: str) -> WorkerInfo:
        return await self._run(_ops.get_worker(worker_id))

    async def quiet(self, worker_id: str) -> WorkerInfo:
        """Tells a worker to finish what it holds and take nothing new."""
        return await self._run(_ops.signal_worker(worker_id, "quiet"))

    async def terminate(self, worker_id: str) -> WorkerInfo:
        """Tells a worker to stop."""
        return await self._run(_ops.signal_worker(worker_id, "terminate"))

    async def forget(self, worker_id: str) -> None:
        """Forgets a worker and its signal (``DELETE /workers/{id}``)."""
        await self._run(_ops.forget_worker(worker_id))


class Schemas(_Namespace):
    """Registered JSON Schemas that jobs' ``args`` may be checked against."""

    async def register(
        self,
        uri: str,
        schema: Mapping[str, Any] | bool,
        *,
        type: str | None = None,
        version: str | int | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"uri": uri, "schema": schema if isinstance(schema, bool) else dict(schema)}
        if type is not None:
            body["type"] = type
        if version is not None:
            body["version"] = version
        return await self._run(_ops.register_schema(body))

    async def get(self, uri: str) -> dict[str, Any]:
        return await self._run(_ops.get_schema(uri))

    async def list(self, *, limit: int | None = None, cursor: str | None = None) -> Page[dict[str, Any]]:
        return await self._run(_ops.list_schemas(limit, cursor))

    async def delete(self, uri: str) -> None:
        await self._run(_ops.delete_schema(uri))


