"""The producer side against a real server: options, batches, errors, retries, admin routes."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from conftest import SvcServer
from helpers import LoseResponses

from svc_client import (
    AsyncClient,
    Client,
    ConflictError,
    DuplicateError,
    JobSpec,
    Middleware,
    NotFoundError,
    QueuePausedError,
    RateLimit,
    RetryConfig,
    RetryPolicy,
    TransportError,
    UniquePolicy,
    ValidationError,
    new_job_id,
    new_traceparent,
    use_traceparent,
)


def close_to(a: datetime | None, b: datetime, slack: float = 5.0) -> bool:
    return a is not None and abs((a - b).total_seconds()) <= slack


def test_every_enqueue_option_round_trips(client: Client) -> None:
    client.schemas.register(
        "urn:test:email.send:v1",
        {"type": "array", "prefixItems": [{"type": "string"}]},
    )
    job_id = new_job_id()
    when = datetime.now(timezone.utc) + timedelta(hours=1)
    until = when + timedelta(hours=2)
    traceparent = new_traceparent()
    job = client.enqueue(
        "email.send",
        ["ada@example.com"],
        id=job_id,
        queue="mail",
        priority=7,
        scheduled_at=when,
        expires_at=until,
        retry=RetryPolicy(
            max_attempts=5,
            initial_interval=0.25,
            backoff_coefficient=1.5,
            max_interval=timedelta(seconds=30),
            jitter=False,
            non_retryable_errors=["ValueError", "auth.*"],
            on_exhaustion="dead_letter",
        ),
        unique=UniquePolicy(key=[], period=timedelta(hours=1), on_conflict="reject", states=["scheduled", "available"]),
        tags=["welcome", "batch-7"],
        timeout=12.5,
        visibility_timeout=timedelta(seconds=45),
        meta={"tenant": "acme", "nested": {"a": [1, 2]}},
        schema="urn:test:email.send:v1",
        rate_limit=RateLimit(key="smtp", concurrency=3, rate=10, period="minute"),
        traceparent=traceparent,
        extra={"x_custom": {"kept": True}},
    )
    for seen in (job, client.get(job_id)):
        assert seen.id == job_id
        assert seen.type == "email.send"
        assert seen.args == ["ada@example.com"]
        assert seen.queue == "mail"
        assert seen.priority == 7
        assert seen.state == "scheduled"
        assert close_to(seen.scheduled_at, when, 0.01)
        assert close_to(seen.expires_at, until, 0.01)
        assert seen.retry == RetryPolicy(
            max_attempts=5,
            initial_interval=timedelta(seconds=0.25),
            backoff_coefficient=1.5,
            max_interval=timedelta(seconds=30),
            jitter=False,
            non_retryable_errors=["ValueError", "auth.*"],
            on_exhaustion="dead_letter",
        )
        assert seen.max_attempts == 5
        assert seen.unique == UniquePolicy(
            key=[], period=timedelta(hours=1), on_conflict="reject", states=["scheduled", "available"]
        )
        assert seen.unique_key and len(seen.unique_key) == 64
        assert seen.tags == ["welcome", "batch-7"]
        assert seen.timeout_ms == 12_500
        assert seen.visibility_timeout_ms == 45_000
        assert seen.meta == {"tenant": "acme", "nested": {"a": [1, 2]}, "traceparent": traceparent}
        assert seen.traceparent == traceparent
        assert seen.schema == "urn:test:email.send:v1"
        assert seen.rate_limit == RateLimit(key="smtp", concurrency=3, rate=10, period="minute", on_limit="wait")
        assert seen.raw["x_custom"] == {"kept": True}


def test_relative_times_pending_and_retry_dict(client: Client) -> None:
    now = datetime.now(timezone.utc)
    delayed = client.enqueue("report.build", [1], delay=120, ttl=timedelta(minutes=10))
    assert delayed.state == "scheduled"
    assert close_to(delayed.scheduled_at, now + timedelta(seconds=120))
    assert close_to(delayed.expires_at, now + timedelta(seconds=720))

    expiring = client.enqueue("report.build", [2], ttl=60, retry={"max_attempts": 9, "initial_interval": "PT2S"})
    assert expiring.state == "available"
    assert close_to(expiring.expires_at, now + timedelta(seconds=60))
    assert expiring.retry.max_attempts == 9
    assert expiring.retry.initial_interval == timedelta(seconds=2)

    staged = client.enqueue("report.build", [3], pending=True, priority=-5)
    assert staged.state == "pending" and staged.priority == -5
    activated = client.activate(staged.id)
    assert activated.state == "available" and activated.activated_at is not None

    with pytest.raises(ValueError):
        client.enqueue("report.build", [4], delay=5, scheduled_at=now)


def test_batch_unique_and_duplicates(client: Client) -> None:
    ids = [new_job_id() for _ in range(3)]
    jobs = client.enqueue_batch(
        [JobSpec("thumb.make", [i], id=ids[i], queue="media") for i in range(3)]
        + [{"type": "thumb.make", "args": [99], "options": {"queue": "media"}}]
    )
    assert [j.id for j in jobs[:3]] == ids
    assert all(j.queue == "media" for j in jobs)
    assert client.queues.stats("media").size == 4

    with pytest.raises(DuplicateError) as info:
        client.enqueue("thumb.make", [0], id=ids[0])
    assert info.value.existing_job_id == ids[0]
    assert info.value.status == 409 and info.value.request_id

    first = client.enqueue("user.sync", [{"user": 1}], unique={"key": ["user"], "on_conflict": "ignore"})
    again = client.enqueue("user.sync", [{"user": 1}], unique={"key": ["user"], "on_conflict": "ignore"})
    assert again.deduplicated and again.id == first.id
    with pytest.raises(DuplicateError):
        client.enqueue("user.sync", [{"user": 1}], unique=UniquePolicy(key=["user"]))


def test_errors_carry_the_server_body(client: Client, server: SvcServer) -> None:
    with pytest.raises(NotFoundError) as missing:
        client.get(new_job_id())
    assert missing.value.code == "not_found" and missing.value.status == 404
    assert missing.value.request_id and missing.value.request_id.startswith("req_")

    with pytest.raises(ValidationError) as invalid:
        client.enqueue("9-not-a-type", [])
    assert invalid.value.code == "invalid_payload" and invalid.value.details.get("field")

    client.queues.pause("frozen")
    started = time.monotonic()
    with pytest.raises(QueuePausedError) as paused:
        client.enqueue("a.b", [], queue="frozen")
    assert time.monotonic() - started < 1.0, "a paused queue is not retried"
    assert paused.value.retryable and paused.value.retry_after == 5
    client.queues.resume("frozen")
    client.enqueue("a.b", [], queue="frozen")

    job = client.enqueue("a.b", [])
    cancelled = client.cancel(job.id)
    assert cancelled.state == "cancelled" and cancelled.previous_state == "available"
    assert client.cancel(job.id).state == "cancelled"  # idempotent
    done = client.enqueue("a.b", [], queue="done")
    fetched = client.fetch(["done"], worker_id="w-test")
    client.ack(fetched[0].id, {"ok": True}, worker_id="w-test")
    with pytest.raises(ConflictError) as conflict:
        client.cancel(done.id)
    assert conflict.value.current_state == "completed"


def test_enqueue_with_id_survives_a_lost_answer(server: SvcServer) -> None:
    transport = LoseResponses("POST", "/svc/v1/jobs")
    with Client(server.url, transport=transport) as client:
        job_id = new_job_id()
        job = client.enqueue("a.b", [1], id=job_id)
        assert job.id == job_id and transport.requests == 2
        assert client.queues.stats("default").size == 1


def test_enqueue_without_id_is_not_sent_twice(server: SvcServer) -> None:
    transport = LoseResponses("POST", "/svc/v1/jobs")
    with Client(server.url, transport=transport) as client:
        with pytest.raises(TransportError) as lost:
            client.enqueue("a.b", [1])
        assert lost.value.sent
        assert transport.requests == 1
        assert client.queues.stats("default").size == 1  # applied once, never twice


def test_auto_id_makes_every_enqueue_retryable(server: SvcServer) -> None:
    transport = LoseResponses("POST", "/svc/v1/jobs/batch")
    with Client(server.url, transport=transport, auto_id=True) as client:
        jobs = client.enqueue_batch([JobSpec("a.b", [i]) for i in range(5)])
        assert [j.args for j in jobs] == [[i] for i in range(5)]
        assert transport.requests == 2
        assert client.queues.stats("default").size == 5


def test_refused_connection_is_retried_until_the_server_is_back(server: SvcServer) -> None:
    retry = RetryConfig(attempts=50, backoff=0.05, max_backoff=0.2, max_elapsed=20)
    with Client(server.url, retry=retry) as client:
        client.health()
        server.kill()
        restart = threading.Timer(0.7, server.start)
        restart.start()
        try:
            job = client.enqueue("a.b", ["after restart"])  # no id: safe only because nothing was sent
        finally:
            restart.join()
        assert client.get(job.id).args == ["after restart"]


def test_middleware_and_trace_context(server: SvcServer) -> None:
    seen: list[str] = []

    class Tag(Middleware):
        def before_enqueue(self, body: dict[str, object]) -> None:
            meta = dict(body.get("meta") or {})  # type: ignore[call-overload]
            meta["via"] = "middleware"
            body["meta"] = meta

        def enqueue(self, bodies, call_next):  # type: ignore[no-untyped-def]
            seen.append(f"before:{len(bodies)}")
            jobs = call_next(bodies)
            seen.append(f"after:{len(jobs)}")
            return jobs

    traceparent = new_traceparent()
    with Client(server.url, middleware=[Tag()]) as client:
        with use_traceparent(traceparent):
            job = client.enqueue("a.b", [])
        other = client.enqueue("a.b", [], traceparent=None)
        batch = client.enqueue_batch([JobSpec("a.b", [1]), JobSpec("a.b", [2])])
    assert job.meta == {"via": "middleware", "traceparent": traceparent}
    assert "traceparent" not in other.meta
    assert all(j.meta["via"] == "middleware" for j in batch)
    assert seen == ["before:1", "after:1", "before:1", "after:1", "before:2", "after:2"]

    with Client(server.url, traceparent_provider=lambda: traceparent) as client:
        assert client.enqueue("a.b", []).traceparent == traceparent


def test_workflows(client: Client) -> None:
    chain = client.workflows.chain(
        [JobSpec("user.create", ["ada"]), {"type": "email.welcome"}], name="onboarding", options={"queue": "wf"}
    )
    assert chain.type == "chain" and chain.state == "running" and chain.name == "onboarding"
    assert [m.state for m in chain.members] == ["available", "pending"]
    assert all(m.queue == "wf" for m in chain.members)

    group = client.workflows.group([JobSpec("export.csv", [1]), JobSpec("export.pdf", [1])])
    assert group.type == "group" and group.jobs_total == 2

    batch = client.workflows.batch(
        [JobSpec("export.csv", [2])], on_complete=JobSpec("export.notify"), on_failure={"type": "export.alert"}
    )
    assert set(batch.callbacks) == {"on_complete", "on_failure"}
    assert client.workflows.get(batch.id).id == batch.id

    cancelled = client.workflows.cancel(chain.id)
    assert cancelled.state == "cancelled"
    assert client.get(chain.members[0].job_id or "").state == "cancelled"
    with pytest.raises(ValueError):
        client.workflows.batch([], on_complete=JobSpec("x.y"))


def test_cron_queues_dead_letter_webhooks(client: Client) -> None:
    entry = client.cron.register(
        "nightly-cleanup", "0 2 * * *", "maintenance.cleanup", [1], timezone="Europe/Berlin",
        queue="maintenance", overlap_policy="skip", description="tidy up",
    )
    assert entry.schedule == "0 2 * * *" and entry.timezone == "Europe/Berlin" and entry.next_run_at
    assert client.cron.get("nightly-cleanup").description == "tidy up"
    assert [c.name for c in client.cron.list()] == ["nightly-cleanup"]
    assert client.cron.update("nightly-cleanup", enabled=False).status == "disabled"
    client.cron.delete("nightly-cleanup")
    with pytest.raises(NotFoundError):
        client.cron.get("nightly-cleanup")
    client.schemas.register("urn:test:report:v1", {"type": "array", "prefixItems": [{"type": "integer"}]})
    with pytest.raises(ValidationError) as mismatch:
        client.cron.register("hourly", "@hourly", "report.build", ["x"], schema="urn:test:report:v1")
    assert mismatch.value.code == "schema_validation"
    hourly = client.cron.register("hourly", "@hourly", "report.build", [1], schema="urn:test:report:v1",
                                  options={"priority": 3})
    assert hourly.options == {"priority": 3} and hourly.args == [1]

    client.enqueue("a.b", [], queue="q-one")
    assert client.queues.pause("q-one") is True
    names = {q.name: q for q in client.queues.list()}
    assert names["q-one"].paused and names["q-one"].size == 1
    assert client.queues.resume("q-one") is False
    stats = client.queues.stats("q-one")
    assert stats.states["available"] == 1 and stats.paused is False

    doomed = client.enqueue("a.fail", [], queue="dl", retry=RetryPolicy(max_attempts=1))
    claimed = client.fetch(["dl"], worker_id="w-dl")
    assert [j.id for j in claimed] == [doomed.id]
    client.nack(doomed.id, ValueError("boom"), worker_id="w-dl")
    dead = client.dead_letter.list(queue="dl")
    assert [j.id for j in dead] == [doomed.id] and dead.items[0].error
    assert dead.items[0].error.type == "ValueError"
    revived = client.dead_letter.retry(doomed.id)
    assert revived.state == "available" and revived.attempt == 0
    client.fetch(["dl"], worker_id="w-dl")
    client.nack(doomed.id, {"type": "Final", "message": "again"}, worker_id="w-dl")
    client.dead_letter.delete(doomed.id)
    assert len(client.dead_letter.list(queue="dl")) == 0

    sub = client.webhooks.create(
        "https://hooks.example.com/svc", ["job.*"], "s" * 24, metadata={"team": "ops"},
        filter={"queues": ["mail"]}, active=False,
    )
    assert sub.id.startswith("sub_") and sub.active is False and sub.filter == {"queues": ["mail"]}
    assert client.webhooks.get(sub.id).metadata == {"team": "ops"}
    assert [s.id for s in client.webhooks.list()] == [sub.id]
    assert client.webhooks.update(sub.id, events=["job.completed"]).events == ["job.completed"]
    client.webhooks.delete(sub.id)
    with pytest.raises(NotFoundError):
        client.webhooks.get(sub.id)


def test_async_client(server: SvcServer) -> None:
    async def main() -> None:
        async with AsyncClient(server.url) as client:
            job = await client.enqueue("a.b", [1], queue="aq", priority=2, tags=["t"])
            assert (await client.get(job.id)).priority == 2
            jobs = await client.enqueue_batch([JobSpec("a.b", [i], queue="aq") for i in range(3)])
            assert len(jobs) == 3
            claimed = await client.fetch(["aq"], 10, worker_id="aw")
            assert [j.id for j in claimed] == [job.id] + [j.id for j in jobs]
            for j in claimed:
                await client.ack(j.id, {"n": j.args[0]}, worker_id="aw")
            assert (await client.get(job.id)).result == {"n": 1}
            assert (await client.queues.stats("aq")).states["completed"] == 4
            with pytest.raises(NotFoundError):
                await client.get(new_job_id())

    asyncio.run(main())
