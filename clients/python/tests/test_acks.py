"""Acks that fetch the next jobs, and acks of several jobs."""

from __future__ import annotations

import asyncio

import pytest
from conftest import SvcServer

from svc_client import (
    AckManyResult,
    AsyncClient,
    Client,
    ConflictError,
    FetchSpec,
    JobSpec,
    NotFoundError,
    new_job_id,
)


def test_ack_with_fetch_claims_the_next_jobs_for_the_same_worker(server: SvcServer, client: Client) -> None:
    jobs = client.enqueue_batch([JobSpec("step", [i], queue="line") for i in range(5)])
    [first] = client.fetch(["line"], worker_id="w-1")
    assert first.id == jobs[0].id

    claimed = client.ack(first.id, {"done": 0}, worker_id="w-1", fetch=FetchSpec(["line"], count=2, visibility_timeout=60))
    assert [j.id for j in claimed] == [jobs[1].id, jobs[2].id]
    assert all(j.state == "active" and j.worker_id == "w-1" and j.attempt == 1 for j in claimed)
    done = client.get(first.id)
    assert done.state == "completed" and done.result == {"done": 0}

    # Without fetch, ack answers the job as before; the async client does the same.
    assert client.ack(claimed[0].id, 1, worker_id="w-1").state == "completed"

    async def run_async() -> list[str]:
        async with AsyncClient(server.url) as svc:
            more = await svc.ack(claimed[1].id, 2, worker_id="w-1", fetch={"queues": ["line"], "count": 5})
            return [j.id for j in more]

    rest = asyncio.run(run_async())
    assert rest == [jobs[3].id, jobs[4].id]
    assert client.queues.stats("line").states["completed"] == 3
    for job_id in rest:  # a server stopping waits for active jobs
        client.ack(job_id)


def test_a_refused_ack_claims_nothing(server: SvcServer, client: Client) -> None:
    client.enqueue_batch([JobSpec("step", [i], queue="line") for i in range(3)])
    [held] = client.fetch(["line"], worker_id="w-1")

    with pytest.raises(ConflictError) as refused:
        client.ack(held.id, worker_id="w-2", fetch=FetchSpec(["line"], count=2))  # not the owner
    assert refused.value.reason == "not_owner"
    client.ack(held.id, worker_id="w-1")
    with pytest.raises(ConflictError) as again:
        client.ack(held.id, worker_id="w-1", fetch=FetchSpec(["line"], count=2))  # already completed
    assert again.value.current_state == "completed"

    states = client.queues.stats("line").states
    assert states["available"] == 2 and states["active"] == 0


def test_ack_many_reports_each_ack_and_fetches_either_way(server: SvcServer, client: Client) -> None:
    jobs = client.enqueue_batch([JobSpec("step", [i], queue="line") for i in range(6)])
    held = client.fetch(["line"], 3, worker_id="w-1")
    [other] = client.fetch(["line"], worker_id="w-2")
    client.ack(held[2].id, worker_id="w-1")
    unknown = new_job_id()

    answer = client.ack_many(
        [(held[0].id, {"n": 0}), held[1].id, {"job_id": held[2].id}, (other.id, "mine"), unknown],
        worker_id="w-1",
        fetch=FetchSpec(["line"], count=5),
    )
    assert isinstance(answer, AckManyResult)
    assert [a.job_id for a in answer.acks] == [held[0].id, held[1].id, held[2].id, other.id, unknown]
    assert [a.acknowledged for a in answer.acks] == [True, True, False, False, False]
    assert answer.acks[0].state == "completed" and answer.acks[0].completed_at is not None
    completed, not_owner, missing = answer.acks[2].error, answer.acks[3].error, answer.acks[4].error
    assert isinstance(completed, ConflictError) and completed.current_state == "completed"
    assert isinstance(not_owner, ConflictError) and not_owner.reason == "not_owner"
    assert isinstance(missing, NotFoundError)
    assert [a.job_id for a in answer.refused] == [held[2].id, other.id, unknown]
    # Refusals leave the other acks done, and the fetch runs either way.
    assert [j.id for j in answer.jobs] == [jobs[4].id, jobs[5].id]
    assert all(j.worker_id == "w-1" for j in answer.jobs)
    assert client.get(held[0].id).result == {"n": 0}
    assert client.get(other.id).state == "active"

    # Without fetch: no jobs; the async client answers the same way.
    async def run_async() -> AckManyResult:
        async with AsyncClient(server.url) as svc:
            return await svc.ack_many([j.id for j in answer.jobs], worker_id="w-1")

    last = asyncio.run(run_async())
    assert [a.acknowledged for a in last.acks] == [True, True] and last.jobs == []
    client.ack(other.id, worker_id="w-2")
