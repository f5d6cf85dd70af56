// Acks that claim the next jobs (`fetch`) and several acks in one request
// (`acks`), against a real server.
import { strict as assert } from "node:assert";
import { after, before, describe, test } from "node:test";
import { Client, ConflictError, newJobId } from "../src/index.js";
import { TestServer, eventually } from "./helpers.js";

let server: TestServer;
let client: Client;

before(async () => {
  server = await TestServer.start();
  client = new Client(server.url);
});
after(async () => {
  await server.stop();
});

/**
 * A `fetch` whose first ack request reaches the server but loses its answer
 * (as a connection reset after the request was sent would).
 */
function losingFirstAck(): { fetch: typeof fetch; ackBodies: Array<Record<string, unknown>> } {
  const ackBodies: Array<Record<string, unknown>> = [];
  const wrapped: typeof fetch = async (input, init) => {
    const path = new URL(String(input)).pathname;
    const response = await fetch(input, init);
    if (path.endsWith("/workers/ack") && typeof init?.body === "string") {
      ackBodies.push(JSON.parse(init.body));
      if (ackBodies.length === 1) {
        await response.arrayBuffer();
        throw new TypeError("fetch failed", { cause: Object.assign(new Error("socket hang up"), { code: "ECONNRESET" }) });
      }
    }
    return response;
  };
  return { fetch: wrapped, ackBodies };
}

async function enqueueMany(queue: string, n: number, type = "t"): Promise<string[]> {
  const jobs = await client.enqueueBatch(Array.from({ length: n }, (_, i) => ({ type, args: [i], queue })));
  return jobs.map((j) => j.id);
}

describe("ack with fetch", () => {
  test("claims the next jobs for the same worker, in queue order", async () => {
    const low = await enqueueMany("af-low", 1);
    const high = await enqueueMany("af-high", 3);
    const [first] = await client.claim({ queues: ["af-high", "af-low"], workerId: "w-af" });
    assert.equal(first!.id, high[0]);
    const answer = await client.ack(first!.id, { ok: 1 }, {
      workerId: "w-af",
      fetch: { queues: ["af-high", "af-low"], count: 3, visibilityTimeoutMs: 7_000 },
    });
    assert.equal(answer.acknowledged, true);
    assert.equal(answer.state, "completed");
    assert.deepEqual(
      answer.jobs!.map((j) => j.id),
      [high[1], high[2], low[0]],
      "the rest of the high queue first, then the low one",
    );
    for (const job of answer.jobs!) {
      assert.equal(job.state, "active");
      assert.equal(job.worker_id, "w-af");
    }
    assert.deepEqual((await client.get(first!.id)).result, { ok: 1 });
  });

  test("a refused ack claims nothing", async () => {
    const ids = await enqueueMany("af-refused", 3);
    const [job] = await client.claim({ queues: ["af-refused"], workerId: "w-r1" });
    // Held by another worker: not_owner.
    await assert.rejects(
      client.ack(job!.id, undefined, { workerId: "w-r2", fetch: { queues: ["af-refused"], count: 2 } }),
      (error: unknown) => error instanceof ConflictError && error.reason === "not_owner",
    );
    await client.ack(job!.id, undefined, { workerId: "w-r1" });
    // Acked already: invalid_state.
    await assert.rejects(
      client.ack(job!.id, undefined, { workerId: "w-r1", fetch: { queues: ["af-refused"], count: 2 } }),
      (error: unknown) => error instanceof ConflictError && error.currentState === "completed",
    );
    for (const id of ids.slice(1)) assert.equal((await client.get(id)).state, "available");
  });

  test("a fetch that waits does so after the ack is committed", async () => {
    await enqueueMany("af-wait-first", 1);
    const [job] = await client.claim({ queues: ["af-wait-first"], workerId: "w-wait" });
    const started = Date.now();
    const pending = client.ack(job!.id, "done", { workerId: "w-wait", fetch: { queues: ["af-wait"], waitMs: 5_000 } });
    await eventually(async () => (await client.get(job!.id)).state === "completed", 3_000, "the ack to commit");
    const [late] = await enqueueMany("af-wait", 1);
    const answer = await pending;
    assert.ok(Date.now() - started < 4_500, "answered when the job came, not at the end of the wait");
    assert.deepEqual(
      answer.jobs!.map((j) => j.id),
      [late],
    );
  });

  test("a lost answer: the ack is sent again without the fetch", async () => {
    const ids = await enqueueMany("af-lost", 3);
    const lossy = losingFirstAck();
    const flaky = new Client(server.url, { fetch: lossy.fetch, retry: { baseDelayMs: 10, maxDelayMs: 20 } });
    const [job] = await client.claim({ queues: ["af-lost"], workerId: "w-lost" });
    const answer = await flaky.ack(job!.id, 42, { workerId: "w-lost", fetch: { queues: ["af-lost"], count: 1 } });
    assert.equal(answer.acknowledged, true);
    assert.deepEqual(answer.jobs, [], "what the lost answer claimed is not handed out twice");
    assert.equal(lossy.ackBodies.length, 2);
    assert.ok("fetch" in lossy.ackBodies[0]!);
    assert.ok(!("fetch" in lossy.ackBodies[1]!), "the retry carries no fetch");
    assert.equal((await client.get(job!.id)).result, 42);
    // The job claimed by the lost answer stays this worker's until its
    // visibility timeout; the last one was left alone.
    assert.deepEqual((await client.get(ids[1]!)).worker_id, "w-lost");
    assert.equal((await client.get(ids[2]!)).state, "available");
  });
});

describe("ackMany", () => {
  test("each job has its own outcome, and the fetch runs either way", async () => {
    const ids = await enqueueMany("am", 6);
    const mine = await client.claim({ queues: ["am"], count: 3, workerId: "w-am" });
    const [theirs] = await client.claim({ queues: ["am"], workerId: "w-other" });
    await client.ack(mine[1]!.id, undefined, { workerId: "w-am" });
    const unknown = newJobId();
    const answer = await client.ackMany(
      [
        { jobId: mine[0]!.id, result: { n: 0 } },
        { jobId: mine[1]!.id },
        { jobId: theirs!.id },
        { jobId: unknown },
        { jobId: mine[2]!.id },
      ],
      { workerId: "w-am", fetch: { queues: ["am"], count: 5 } },
    );
    assert.equal(answer.acks.length, 5);
    assert.deepEqual(
      answer.acks.map((a) => [a.job_id, a.acknowledged]),
      [
        [mine[0]!.id, true],
        [mine[1]!.id, false],
        [theirs!.id, false],
        [unknown, false],
        [mine[2]!.id, true],
      ],
    );
    const [ok, done, notMine, missing] = answer.acks;
    assert.ok(ok!.acknowledged && ok!.state === "completed" && typeof ok!.completed_at === "string");
    assert.ok(!done!.acknowledged && done!.error.code === "conflict");
    assert.equal(!done!.acknowledged && done!.error.details["current_state"], "completed");
    assert.ok(!notMine!.acknowledged && notMine!.error.code === "conflict");
    assert.equal(!notMine!.acknowledged && notMine!.error.details["reason"], "not_owner");
    assert.ok(!missing!.acknowledged && missing!.error.code === "not_found");
    assert.deepEqual(
      answer.jobs.map((j) => j.id),
      ids.slice(4),
      "the two jobs left, claimed for this worker",
    );
    for (const job of answer.jobs) assert.equal(job.worker_id, "w-am");
    assert.deepEqual((await client.get(mine[0]!.id)).result, { n: 0 });
    assert.equal((await client.get(theirs!.id)).state, "active");
  });

  test("without fetch: no jobs are claimed", async () => {
    const ids = await enqueueMany("am-plain", 2);
    const [job] = await client.claim({ queues: ["am-plain"], workerId: "w-plain" });
    const answer = await client.ackMany([{ jobId: job!.id }], { workerId: "w-plain" });
    assert.deepEqual(answer.jobs, []);
    assert.equal(answer.acks[0]!.acknowledged, true);
    assert.equal((await client.get(ids[1]!)).state, "available");
  });

  test("a lost answer: sent again without the fetch, and its own acks count as acknowledged", async () => {
    await enqueueMany("am-lost", 4);
    const lossy = losingFirstAck();
    const flaky = new Client(server.url, { fetch: lossy.fetch, retry: { baseDelayMs: 10, maxDelayMs: 20 } });
    const jobs = await client.claim({ queues: ["am-lost"], count: 2, workerId: "w-am-lost" });
    const answer = await flaky.ackMany(
      jobs.map((j) => ({ jobId: j.id, result: j.args })),
      { workerId: "w-am-lost", fetch: { queues: ["am-lost"], count: 2 } },
    );
    assert.equal(lossy.ackBodies.length, 2);
    assert.ok(!("fetch" in lossy.ackBodies[1]!), "the retry carries no fetch");
    assert.deepEqual(answer.jobs, []);
    assert.deepEqual(
      answer.acks.map((a) => a.acknowledged),
      [true, true],
    );
    for (const job of jobs) assert.equal((await client.get(job.id)).state, "completed");
  });
});
