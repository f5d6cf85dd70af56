"""Acks that fetch the next jobs, acks of several jobs, and the worker that
uses them: one round trip per job, several jobs per round trip."""

from __future__ import annotations

import asyncio
import collections
import json
import random
import threading
import time
from typing import Any

import httpx
import pytest
from conftest import SvcServer
from helpers import AsyncRecorder, AsyncScripted, running, wait_until

from svc_client import (
    AckManyResult,
    AsyncClient,
    Client,
    ConflictError,
    FetchSpec,
    JobContext,
    JobSpec,
    NotFoundError,
    RetryPolicy,
    Worker,
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


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_busy_worker_acks_and_fetches_many_jobs_a_request(server: SvcServer, client: Client, kind: str) -> None:
    n = 500
    client.enqueue_batch([JobSpec("load.job", [i], queue="load") for i in range(n)])
    recorder = AsyncRecorder()
    runs: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    worker = Worker(server.url, queues=["load"], concurrency=32, wait=1, transport=recorder)

    if kind == "async":
        @worker.handler("load.job")
        async def handle_async(i: int, ctx: JobContext) -> int:
            runs[ctx.id] += 1
            await asyncio.sleep(random.uniform(0, 0.004))
            return i
    else:
        @worker.handler("load.job")
        def handle_sync(i: int, ctx: JobContext) -> int:
            with lock:
                runs[ctx.id] += 1
            time.sleep(random.uniform(0, 0.004))
            return i

    with running(worker):
        wait_until(lambda: client.queues.stats("load").states["completed"] == n, timeout=40)
        requests = len(recorder.seen)

    assert len(runs) == n and set(runs.values()) == {1}, "each job runs exactly once"
    assert worker.stats["acked"] == n and worker.stats["fetched"] == n
    assert requests < n / 2, f"{requests} requests for {n} jobs"
    acks = [json.loads(body) for _, _, path, body in recorder.seen if path.endswith("/workers/ack")]
    assert sum(len(a["acks"]) for a in acks) == n
    assert max(len(a["acks"]) for a in acks) > 1  # acks finishing together share a request
    assert sum(a.get("fetch", {}).get("count", 0) for a in acks) > 0
    assert all(a["fetch"]["queues"] == ["load"] and a["fetch"]["count"] <= 32 for a in acks if "fetch" in a)


def test_lost_answers_to_acks_that_fetch(server: SvcServer, client: Client) -> None:
    """The answer to an ack that fetched is lost: its ack landed (the worker
    reads the job and sends nothing more) and the job it claimed comes back
    after its visibility timeout. An ack sent again never fetches."""
    a, b, c = client.enqueue_batch([JobSpec("lossy", [name], queue="lossy") for name in "abc"])
    transport = AsyncScripted("/workers/ack", ["lose", "drop"])
    runs: collections.Counter[str] = collections.Counter()
    worker = Worker(server.url, queues=["lossy"], concurrency=1, wait=1, visibility_timeout=1, transport=transport)

    @worker.handler("lossy")
    def lossy(name: str, ctx: JobContext) -> str:
        runs[name] += 1
        return name

    with running(worker):
        for job in (a, b, c):
            assert client.wait_for(job.id, timeout=15).state == "completed"

    assert runs == {"a": 1, "b": 1, "c": 1}
    assert client.get(a.id).attempt == 1 and client.get(c.id).attempt == 1
    came_back = client.get(b.id)
    assert came_back.attempt == 2 and came_back.result == "b"  # claimed by the lost answer, then expired
    assert [e.type for e in came_back.errors] == ["visibility_timeout"]
    acks = transport.bodies("/workers/ack")
    assert [[x["job_id"] for x in body["acks"]] for body in acks[:3]] == [[a.id], [c.id], [c.id]]
    assert "fetch" in acks[0] and "fetch" in acks[1]  # lost (b claimed), then dropped before the server
    assert "fetch" not in acks[2]  # sent again: no fetch


def test_a_stop_releases_jobs_an_ack_in_flight_claims(server: SvcServer, client: Client) -> None:
    first, *rest = client.enqueue_batch([JobSpec("stopper", [i], queue="stopper") for i in range(3)])
    transport = AsyncScripted("/workers/ack", [0.6])
    worker = Worker(server.url, queues=["stopper"], concurrency=1, wait=1, transport=transport)
    worker.register("stopper", lambda i: i)

    with running(worker) as thread:
        wait_until(lambda: transport.bodies("/workers/ack"))
        worker.stop()
        thread.join(10)
        assert not thread.is_alive()

    [ack] = transport.bodies("/workers/ack")
    assert ack["fetch"]["count"] == 1
    assert client.get(first.id).state == "completed"
    for job in rest:  # the one claimed meanwhile was released at once, its attempt given back
        after = client.get(job.id)
        assert after.state == "available" and after.attempt == 0
    assert worker.stats["released"] == 1


def test_a_refused_result_fails_only_its_own_job(server: SvcServer, client: Client) -> None:
    deep: Any = 1
    for _ in range(70):
        deep = [deep]  # deeper than svc's 64 levels
    results: dict[int, Any] = {0: "x" * (1 << 20), 1: deep}  # too large; too deep
    jobs = client.enqueue_batch(
        [JobSpec("result.job", [i], queue="results", retry=RetryPolicy(max_attempts=1)) for i in range(6)]
    )
    gate = threading.Event()
    worker = Worker(server.url, queues=["results"], concurrency=6, wait=1)

    @worker.handler("result.job")
    def result_job(i: int) -> Any:
        gate.wait(10)
        return results.get(i, i)

    with running(worker):
        wait_until(lambda: client.queues.stats("results").states["active"] == 6)
        gate.set()
        done = [client.wait_for(j.id, timeout=15) for j in jobs]

    for job in done[:2]:
        assert job.state == "discarded"
        assert job.error is not None and job.error.type == "invalid_result"
    assert [(j.state, j.result) for j in done[2:]] == [("completed", i) for i in range(2, 6)]


class _NoAcksOfSeveral(httpx.AsyncBaseTransport):
    """A server from before ``acks``: an ack naming no ``job_id`` is refused."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.refused = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        if request.url.path.endswith("/workers/ack") and "acks" in json.loads(body):
            self.refused += 1
            error = {"code": "invalid_request", "message": "job_id is required", "details": {"field": "job_id"}}
            return httpx.Response(400, json={"error": error})
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_a_server_without_acks_of_several_gets_one_job_acks(server: SvcServer, client: Client) -> None:
    jobs = client.enqueue_batch([JobSpec("old.server", [i], queue="old") for i in range(20)])
    transport = _NoAcksOfSeveral()
    worker = Worker(server.url, queues=["old"], concurrency=4, wait=1, transport=transport)
    worker.register("old.server", lambda i: i * 10)
    with running(worker):
        wait_until(lambda: client.queues.stats("old").states["completed"] == 20, timeout=20)
    assert transport.refused == 1
    assert [client.get(j.id).result for j in jobs[:3]] == [0, 10, 20]
    assert worker.stats["acked"] == 20
