"""Every operation of the API as a :class:`Call`, with its retry rule.

The rule for each operation (see the README, "Retries"):

- reads (``GET``) are always sent again after a transient failure;
- ``enqueue`` and ``enqueue_batch`` are sent again after a failure that may
  have been applied only when every job has a client-chosen id: the server
  refuses an id in use (409 ``duplicate`` naming that id), which then means
  the first try landed, and the stored job is read and returned;
- ``cancel`` (a second cancel answers the same), ``pause``/``resume``,
  heartbeats, progress reports (each replaces the last), cron
  registration (an upsert by name) and changes are idempotent;
- ``ack`` is idempotent: a job acknowledged once is ``completed`` for good,
  so a retry that finds it completed returns it; so is ``ack_many``
  without ``fetch`` (an ack that landed before answers ``conflict``);
- an ack with ``fetch`` is not sent again unless the failure proves the
  first try was not applied: the jobs a lost answer claimed stay claimed
  until their visibility timeout, and a second try would claim more;
- ``nack``, ``fetch``, workflow and webhook creation are not sent again
  unless the failure proves the first try was not applied;
- deletes are idempotent: a retry that finds the thing gone counts as done.

Failures that prove nothing was applied (a refused connection, 429, 503
``overloaded``/``capacity``/``disk_full``/``connections``) are retried for
every operation.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence
from urllib.parse import quote

from ._transport import Call, Recovery, Safety
from .errors import ConflictError, DuplicateError, NotFoundError, SvcError
from .models import (
    AckManyResult,
    CronEntry,
    HeartbeatReply,
    Job,
    JobProgress,
    Page,
    QueueStats,
    QueueSummary,
    WebhookSubscription,
    WorkerInfo,
    Workflow,
    fetch_body,
)


def _seg(value: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("an identifier must be a non-empty string")
    return quote(value, safe="")


def _obj(answer: Any, key: str) -> Mapping[str, Any]:
    if isinstance(answer, Mapping):
        inner = answer.get(key)
        if isinstance(inner, Mapping):
            return inner
        return answer
    return {}


def _job(answer: Any) -> Job:
    data = dict(_obj(answer, "job"))
    if isinstance(answer, Mapping) and answer.get("deduplicated") is True:
        data["deduplicated"] = True
    return Job.from_json(data)


def _jobs(answer: Any) -> list[Job]:
    items = answer.get("jobs") if isinstance(answer, Mapping) else None
    return [Job.from_json(j) for j in items or [] if isinstance(j, Mapping)]


def _page(answer: Any, key: str, build: Any) -> Page[Any]:
    items = answer.get(key) if isinstance(answer, Mapping) else None
    cursor = answer.get("cursor") if isinstance(answer, Mapping) else None
    has_more = bool(answer.get("has_more")) if isinstance(answer, Mapping) else False
    return Page(
        items=[build(i) for i in items or [] if isinstance(i, Mapping)],
        cursor=cursor if isinstance(cursor, str) else None,
        has_more=has_more,
    )


def _none(answer: Any) -> None:
    return None


def _gone_is_done(exc: SvcError) -> Recovery[None] | None:
    if isinstance(exc, NotFoundError):
        return Recovery(calls=[], combine=lambda _: None)
    return None


# ----------------------------------------------------------------- jobs


def enqueue(body: dict[str, Any]) -> Call[Job]:
    job_id = body.get("id")

    def recover(exc: SvcError) -> Recovery[Job] | None:
        if isinstance(exc, DuplicateError) and job_id and exc.existing_job_id == job_id:
            return Recovery(calls=[get_job(job_id)], combine=lambda answers: answers[0])
        return None

    return Call(
        "POST",
        "/jobs",
        _job,
        body=body,
        has_body=True,
        safety=Safety.IDEMPOTENT if job_id else Safety.UNSAFE,
        recover=recover if job_id else None,
    )


def enqueue_batch(bodies: list[dict[str, Any]]) -> Call[list[Job]]:
    ids = [b.get("id") for b in bodies]
    all_ids = bool(bodies) and all(isinstance(i, str) and i for i in ids)

    def recover(exc: SvcError) -> Recovery[list[Job]] | None:
        # All or nothing: an id of this batch in use means the batch landed.
        if isinstance(exc, DuplicateError) and exc.existing_job_id in ids:
            return Recovery(
                calls=[get_job(str(i)) for i in ids],
                combine=lambda answers: list(answers),
            )
        return None

    return Call(
        "POST",
        "/jobs/batch",
        _jobs,
        body={"jobs": bodies},
        has_body=True,
        safety=Safety.IDEMPOTENT if all_ids else Safety.UNSAFE,
        recover=recover if all_ids else None,
    )


def get_job(job_id: str) -> Call[Job]:
    return Call("GET", f"/jobs/{_seg(job_id)}", _job)


def cancel_job(job_id: str) -> Call[Job]:
    return Call("DELETE", f"/jobs/{_seg(job_id)}", _job)


def activate_job(job_id: str) -> Call[Job]:
    def recover(exc: SvcError) -> Recovery[Job] | None:
        if isinstance(exc, ConflictError) and exc.reason == "not_pending":
            return Recovery(calls=[get_job(job_id)], combine=lambda answers: answers[0])
        return None

    return Call("POST", f"/jobs/{_seg(job_id)}/activate", _job, recover=recover)


def get_progress(job_id: str) -> Call[JobProgress]:
    return Call("GET", f"/jobs/{_seg(job_id)}/progress", lambda a: JobProgress.from_json(_obj(a, "progress")))


def put_progress(
    job_id: str,
    progress: float,
    message: str | None = None,
    data: Any = None,
    worker_id: str | None = None,
) -> Call[JobProgress]:
    body: dict[str, Any] = {"progress": float(progress)}
    if message is not None:
        body["message"] = message
    if data is not None:
        body["data"] = data
    if worker_id is not None:
        body["worker_id"] = worker_id
    return Call(
        "PUT",
        f"/jobs/{_seg(job_id)}/progress",
        lambda a: JobProgress.from_json(_obj(a, "progress")),
        body=body,
        has_body=True,
    )


# ----------------------------------------------------------------- workers


def fetch(
    queues: Sequence[str],
    count: int = 1,
    worker_id: str | None = None,
    wait_ms: int = 0,
    visibility_timeout_ms: int | None = None,
) -> Call[list[Job]]:
    body = fetch_body(queues, count, worker_id, wait_ms, visibility_timeout_ms)
    return Call(
        "POST", "/workers/fetch", _jobs, body=body, has_body=True, safety=Safety.UNSAFE, timeout=_wait_timeout(body)
    )


def _wait_timeout(fetch: Mapping[str, Any]) -> float:
    # A long poll is held by the server: the read timeout must outlast it.
    wait_ms = fetch.get("wait_ms")
    return (wait_ms / 1000.0 if isinstance(wait_ms, (int, float)) else 0.0) + 15.0


def ack(job_id: str, result: Any = None, worker_id: str | None = None) -> Call[Job]:
    body: dict[str, Any] = {"job_id": job_id}
    if result is not None:
        body["result"] = result
    if worker_id is not None:
        body["worker_id"] = worker_id

    def recover(exc: SvcError) -> Recovery[Job] | None:
        if isinstance(exc, ConflictError) and exc.current_state == "completed":
            return Recovery(calls=[get_job(job_id)], combine=lambda answers: answers[0])
        return None

    return Call("POST", "/workers/ack", _job, body=body, has_body=True, recover=recover)


def ack_fetch(job_id: str, result: Any, worker_id: str | None, fetch: Mapping[str, Any]) -> Call[list[Job]]:
    """An ack that claims the next jobs (``jobs`` of the answer) in the same step.

    Not sent again after an unknown outcome: the jobs a lost answer claimed
    are held until their visibility timeout, and a second try would claim
    more. A refused ack claims nothing.
    """
    body: dict[str, Any] = {"job_id": job_id}
    if result is not None:
        body["result"] = result
    if worker_id is not None:
        body["worker_id"] = worker_id
    body["fetch"] = dict(fetch)
    return Call(
        "POST", "/workers/ack", _jobs, body=body, has_body=True, safety=Safety.UNSAFE, timeout=_wait_timeout(fetch)
    )


def ack_many(
    acks: Sequence[Mapping[str, Any]],
    worker_id: str | None = None,
    fetch: Mapping[str, Any] | None = None,
) -> Call[AckManyResult]:
    """Acks of several jobs (``acks``), each on its own, and a fetch run either way.

    Without ``fetch`` it is sent again after an unknown outcome (an ack
    that landed the first time then answers ``conflict``, ``current_state:
    completed``); with one, only when the failure proves nothing was applied.
    """
    body: dict[str, Any] = {"acks": list(acks)}
    if worker_id is not None:
        body["worker_id"] = worker_id
    if fetch is not None:
        body["fetch"] = dict(fetch)
    return Call(
        "POST",
        "/workers/ack",
        lambda a: AckManyResult.from_json(a if isinstance(a, Mapping) else {}),
        body=body,
        has_body=True,
        safety=Safety.UNSAFE if fetch is not None else Safety.IDEMPOTENT,
        timeout=_wait_timeout(fetch) if fetch is not None else None,
    )


def nack(
    job_id: str,
    error: Mapping[str, Any],
    requeue: bool = False,
    worker_id: str | None = None,
) -> Call[Job]:
    body: dict[str, Any] = {"job_id": job_id, "error": dict(error)}
    if requeue:
        body["requeue"] = True
    if worker_id is not None:
        body["worker_id"] = worker_id
    return Call("POST", "/workers/nack", _job, body=body, has_body=True, safety=Safety.UNSAFE)


def heartbeat(
    worker_id: str,
    active_job_ids: Sequence[str] | None = None,
    visibility_timeout_ms: int | None = None,
) -> Call[HeartbeatReply]:
    body: dict[str, Any] = {"worker_id": worker_id}
    if active_job_ids is not None:
        body["active_job_ids"] = list(active_job_ids)
    if visibility_timeout_ms is not None:
        body["visibility_timeout_ms"] = visibility_timeout_ms
    return Call("POST", "/workers/heartbeat", HeartbeatReply.from_json, body=body, has_body=True)


def list_workers(state: str | None = None, limit: int | None = None, cursor: str | None = None) -> Call[Page[WorkerInfo]]:
    return Call(
        "GET",
        "/workers",
        lambda a: _page(a, "workers", WorkerInfo.from_json),
        params={"state": state, "limit": limit, "cursor": cursor},
    )


def get_worker(worker_id: str) -> Call[WorkerInfo]:
    return Call("GET", f"/workers/{_seg(worker_id)}", lambda a: WorkerInfo.from_json(_obj(a, "worker")))


def signal_worker(worker_id: str, signal: str) -> Call[WorkerInfo]:
    return Call("POST", f"/workers/{_seg(worker_id)}/{signal}", lambda a: WorkerInfo.from_json(_obj(a, "worker")))


def forget_worker(worker_id: str) -> Call[None]:
    return Call("DELETE", f"/workers/{_seg(worker_id)}", _none, recover=_gone_is_done)


# ----------------------------------------------------------------- workflows


def create_workflow(definition: dict[str, Any], name: str | None) -> Call[Workflow]:
    body: dict[str, Any] = {"definition": definition}
    if name is not None:
        body["name"] = name
    return Call(
        "POST",
        "/workflows",
        lambda a: Workflow.from_json(_obj(a, "workflow")),
        body=body,
        has_body=True,
        safety=Safety.UNSAFE,
    )


def get_workflow(workflow_id: str) -> Call[Workflow]:
    return Call("GET", f"/workflows/{_seg(workflow_id)}", lambda a: Workflow.from_json(_obj(a, "workflow")))


def cancel_workflow(workflow_id: str) -> Call[Workflow]:
    def recover(exc: SvcError) -> Recovery[Workflow] | None:
        if isinstance(exc, ConflictError):
            return Recovery(calls=[get_workflow(workflow_id)], combine=lambda answers: answers[0])
        return None

    return Call(
        "DELETE",
        f"/workflows/{_seg(workflow_id)}",
        lambda a: Workflow.from_json(_obj(a, "workflow")),
        recover=recover,
    )


# ----------------------------------------------------------------- cron


def register_cron(body: dict[str, Any]) -> Call[CronEntry]:
    return Call("POST", "/cron", lambda a: CronEntry.from_json(_obj(a, "cron")), body=body, has_body=True)


def list_cron(enabled: bool | None, limit: int | None, cursor: str | None) -> Call[Page[CronEntry]]:
    return Call(
        "GET",
        "/cron",
        lambda a: _page(a, "crons", CronEntry.from_json),
        params={"enabled": enabled, "limit": limit, "cursor": cursor},
    )


def get_cron(name: str) -> Call[CronEntry]:
    return Call("GET", f"/cron/{_seg(name)}", lambda a: CronEntry.from_json(_obj(a, "cron")))


def update_cron(name: str, fields: dict[str, Any]) -> Call[CronEntry]:
    return Call(
        "PATCH", f"/cron/{_seg(name)}", lambda a: CronEntry.from_json(_obj(a, "cron")), body=fields, has_body=True
    )


def delete_cron(name: str) -> Call[None]:
    return Call("DELETE", f"/cron/{_seg(name)}", _none, recover=_gone_is_done)


# ----------------------------------------------------------------- queues


def list_queues(limit: int | None, cursor: str | None) -> Call[Page[QueueSummary]]:
    return Call(
        "GET", "/queues", lambda a: _page(a, "queues", QueueSummary.from_json), params={"limit": limit, "cursor": cursor}
    )


def queue_stats(name: str) -> Call[QueueStats]:
    return Call("GET", f"/queues/{_seg(name)}/stats", QueueStats.from_json)


def _paused(answer: Any) -> bool:
    return isinstance(answer, Mapping) and answer.get("paused") is True


def pause_queue(name: str) -> Call[bool]:
    return Call("POST", f"/queues/{_seg(name)}/pause", _paused)


def resume_queue(name: str) -> Call[bool]:
    return Call("POST", f"/queues/{_seg(name)}/resume", _paused)


# ----------------------------------------------------------------- dead letter


def list_dead_letter(queue: str | None, limit: int | None, cursor: str | None) -> Call[Page[Job]]:
    return Call(
        "GET",
        "/dead-letter",
        lambda a: _page(a, "jobs", Job.from_json),
        params={"queue": queue, "limit": limit, "cursor": cursor},
    )


def retry_dead_letter(job_id: str) -> Call[Job]:
    def recover(exc: SvcError) -> Recovery[Job] | None:
        # No longer in the listing: the first try sent it back.
        if isinstance(exc, NotFoundError):
            return Recovery(calls=[get_job(job_id)], combine=lambda answers: answers[0])
        return None

    return Call("POST", f"/dead-letter/{_seg(job_id)}/retry", _job, recover=recover)


def delete_dead_letter(job_id: str) -> Call[None]:
    return Call("DELETE", f"/dead-letter/{_seg(job_id)}", _none, recover=_gone_is_done)


# ----------------------------------------------------------------- webhooks


def _subscription(answer: Any) -> WebhookSubscription:
    return WebhookSubscription.from_json(_obj(answer, "subscription"))


def create_webhook(body: dict[str, Any]) -> Call[WebhookSubscription]:
    return Call("POST", "/webhooks", _subscription, body=body, has_body=True, safety=Safety.UNSAFE)


def list_webhooks(limit: int | None, cursor: str | None) -> Call[Page[WebhookSubscription]]:
    return Call(
        "GET",
        "/webhooks",
        lambda a: _page(a, "subscriptions", WebhookSubscription.from_json),
        params={"limit": limit, "cursor": cursor},
    )


def get_webhook(sub_id: str) -> Call[WebhookSubscription]:
    return Call("GET", f"/webhooks/{_seg(sub_id)}", _subscription)


def update_webhook(sub_id: str, fields: dict[str, Any]) -> Call[WebhookSubscription]:
    # A new secret starts a rotation, which a second try would refuse.
    safety = Safety.UNSAFE if "secret" in fields else Safety.IDEMPOTENT
    return Call("PATCH", f"/webhooks/{_seg(sub_id)}", _subscription, body=fields, has_body=True, safety=safety)


def delete_webhook(sub_id: str) -> Call[None]:
    return Call("DELETE", f"/webhooks/{_seg(sub_id)}", _none, recover=_gone_is_done)


def rotate_webhook_secret(sub_id: str, secret: str) -> Call[WebhookSubscription]:
    return Call(
        "POST", f"/webhooks/{_seg(sub_id)}/secrets", _subscription, body={"secret": secret}, has_body=True,
        safety=Safety.UNSAFE,
    )


def end_webhook_rotation(sub_id: str) -> Call[WebhookSubscription]:
    return Call("DELETE", f"/webhooks/{_seg(sub_id)}/secrets/previous", _subscription, safety=Safety.UNSAFE)


def test_webhook(sub_id: str) -> Call[dict[str, Any]]:
    return Call("POST", f"/webhooks/{_seg(sub_id)}/test", lambda a: dict(a) if isinstance(a, Mapping) else {},
                safety=Safety.UNSAFE, timeout=20.0)


# ----------------------------------------------------------------- schemas


def _schema(answer: Any) -> dict[str, Any]:
    return dict(_obj(answer, "schema"))


def register_schema(body: dict[str, Any]) -> Call[dict[str, Any]]:
    uri = str(body["uri"])

    def recover(exc: SvcError) -> Recovery[dict[str, Any]] | None:
        if isinstance(exc, DuplicateError):
            return Recovery(calls=[get_schema(uri)], combine=lambda answers: answers[0])
        return None

    return Call("POST", "/schemas", _schema, body=body, has_body=True, recover=recover)


def get_schema(uri: str) -> Call[dict[str, Any]]:
    return Call("GET", f"/schemas/{_seg(uri)}", _schema)


def list_schemas(limit: int | None, cursor: str | None) -> Call[Page[dict[str, Any]]]:
    return Call("GET", "/schemas", lambda a: _page(a, "schemas", dict), params={"limit": limit, "cursor": cursor})


def delete_schema(uri: str) -> Call[None]:
    return Call("DELETE", f"/schemas/{_seg(uri)}", _none, recover=_gone_is_done)


# ----------------------------------------------------------------- events, probes


def list_events(
    types: Sequence[str] | None,
    queues: Sequence[str] | None,
    job_types: Sequence[str] | None,
    subject: str | None,
    after: str | None,
    limit: int | None,
) -> Call[Page[dict[str, Any]]]:
    return Call(
        "GET",
        "/events",
        lambda a: _page(a, "events", dict),
        params={
            "types": types,
            "queues": queues,
            "job_types": job_types,
            "subject": subject,
            "after": after,
            "limit": limit,
        },
    )


def health() -> Call[dict[str, Any]]:
    return Call("GET", "/health", lambda a: dict(a) if isinstance(a, Mapping) else {})
