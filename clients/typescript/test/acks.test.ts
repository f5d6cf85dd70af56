// Acks that claim the next jobs (`fetch`), several acks in one request
// (`acks`), and the worker loop built on them, against a real server.
import { strict as assert } from "node:assert";
import { after, before, describe, test } from "node:test";
import { Client, ConflictError, Worker, newJobId, silentLogger, type Logger } from "../src/index.js";
import { TestServer, delay, eventually } from "./helpers.js";

let server: TestServer;
let client: Client;

before(async () => {
  server = await TestServer.start();
  client = new Client(server.url);
});
after(async () => {
  await server.stop();
});

/** A `fetch` that counts requests by path and keeps the bodies of the acks. */
function countingFetch(): { fetch: typeof fetch; counts: Map<string, number>; ackBodies: Array<Record<string, unknown>> } {
  const counts = new Map<string, number>();
  const ackBodies: Array<Record<string, unknown>> = [];
  const wrapped: typeof fetch = (input, init) => {
    const path = new URL(String(input)).pathname.replace(/^\/svc\/v1/, "");
    counts.set(path, (counts.get(path) ?? 0) + 1);
    if (path === "/workers/ack" && typeof init?.body === "string") ackBodies.push(JSON.parse(init.body));
    return fetch(input, init);
  };
  return { fetch: wrapped, counts, ackBodies };
}

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

function recordingLogger(): Logger & { warnings: string[] } {
  const warnings: string[] = [];
  return { ...silentLogger, warn: (message: string) => void warnings.push(message), warnings };
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

describe("the worker's ack pipeline", () => {
  test("500 jobs at concurrency 32: each exactly once, in far fewer requests than jobs", async () => {
    const total = 500;
    const ids = await enqueueMany("pipe", total, "pipe.job");
    const counting = countingFetch();
    const seen = new Map<string, number>();
    let running = 0;
    let peak = 0;
    const worker = new Worker(server.url, {
      queues: ["pipe"],
      concurrency: 32,
      workerId: "w-pipe",
      handleSignals: false,
      logger: silentLogger,
      fetch: counting.fetch,
    });
    worker.handle<[number]>("pipe.job", async ([n], ctx) => {
      running++;
      peak = Math.max(peak, running);
      seen.set(ctx.jobId, (seen.get(ctx.jobId) ?? 0) + 1);
      if (n % 3 === 0) await delay(n % 7);
      running--;
      return n;
    });
    const run = worker.run();
    await eventually(async () => (await client.queues.stats("pipe")).states.completed === total, 30_000, "all completed");
    await worker.stop();
    await run;
    assert.equal(seen.size, total);
    for (const [id, count] of seen) assert.equal(count, 1, `job ${id} ran ${count} times`);
    assert.ok(peak <= 32, `peak concurrency ${peak}`);
    assert.equal((await client.get(ids[123]!)).result, 123);
    const requests = [...counting.counts.values()].reduce((a, b) => a + b, 0);
    const acked = counting.ackBodies.reduce((sum, body) => sum + ((body["acks"] as unknown[] | undefined)?.length ?? 1), 0);
    assert.equal(acked, total, "every job acked once");
    assert.ok(requests < total / 2, `${requests} requests for ${total} jobs (${JSON.stringify([...counting.counts])})`);
    assert.ok(
      counting.ackBodies.some((body) => (body["acks"] as unknown[]).length > 1),
      "acks finishing together share a request",
    );
    assert.ok(
      counting.ackBodies.some((body) => body["fetch"] !== undefined),
      "acks claim the next jobs",
    );
  });

  test("a lone ack claims the next job: one request per job", async () => {
    await enqueueMany("pipe-one", 10, "one.job");
    const counting = countingFetch();
    const order: number[] = [];
    const worker = new Worker(server.url, {
      queues: ["pipe-one"],
      concurrency: 1,
      handleSignals: false,
      logger: silentLogger,
      fetch: counting.fetch,
      pollWaitMs: 20_000,
    });
    worker.handle<[number]>("one.job", ([n]) => void order.push(n));
    const run = worker.run();
    await eventually(() => order.length === 10, 10_000, "10 jobs");
    await eventually(async () => (await client.queues.stats("pipe-one")).states.completed === 10, 5_000, "all acked");
    await worker.stop();
    await run;
    assert.deepEqual(order, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    // The first fetch, one ack (with the next fetch) per job, and the long poll
    // after the last one.
    assert.equal(counting.counts.get("/workers/ack"), 10);
    assert.ok((counting.counts.get("/workers/fetch") ?? 0) <= 3, JSON.stringify([...counting.counts]));
  });

  test("an ack refused for one job (its lease lost) is logged and dropped; the others are acked", async () => {
    const ids = await enqueueMany("pipe-lost", 4, "lost.job");
    const logger = recordingLogger();
    const victim = ids[1]!;
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let arrived = 0;
    const worker = new Worker(server.url, {
      queues: ["pipe-lost"],
      concurrency: 4,
      handleSignals: false,
      logger,
    });
    worker.handle("lost.job", async (_args, ctx) => {
      // All four finish together, so that their acks share a request.
      if (++arrived === 4) release();
      await gate;
      if (ctx.jobId === victim) await client.cancel(victim);
      return "ok";
    });
    const run = worker.run();
    await eventually(
      async () => (await client.queues.stats("pipe-lost")).states.completed === 3,
      10_000,
      "the other three completed",
    );
    await worker.stop();
    await run;
    assert.equal((await client.get(victim)).state, "cancelled");
    for (const id of ids) if (id !== victim) assert.equal((await client.get(id)).state, "completed");
    assert.ok(
      logger.warnings.some((w) => w.includes(victim) && w.includes("ack refused")),
      JSON.stringify(logger.warnings),
    );
  });

  test("a result over 1 MiB fails its job with invalid_result; the others are acked", async () => {
    const ids = await enqueueMany("pipe-big", 3, "big.job");
    const worker = new Worker(server.url, {
      queues: ["pipe-big"],
      concurrency: 3,
      handleSignals: false,
      logger: silentLogger,
    });
    worker.handle<[number]>("big.job", ([n]) => (n === 1 ? "x".repeat(1024 * 1024 + 1) : n));
    const run = worker.run();
    await eventually(
      async () => {
        const states = await Promise.all(ids.map(async (id) => (await client.get(id)).state));
        return states[1] !== "active" && states[1] !== "available" && states[0] === "completed" && states[2] === "completed";
      },
      10_000,
      "the jobs to settle",
    );
    await worker.stop();
    await run;
    const big = await client.get(ids[1]!);
    assert.equal(big.error?.type, "invalid_result");
    assert.equal((await client.get(ids[2]!)).result, 2);
  });

  test("stopping: acks go out without a fetch", async () => {
    await enqueueMany("pipe-stop", 4, "stop.job");
    const counting = countingFetch();
    let started = 0;
    const worker = new Worker(server.url, {
      queues: ["pipe-stop"],
      concurrency: 2,
      handleSignals: false,
      logger: silentLogger,
      fetch: counting.fetch,
    });
    worker.handle("stop.job", async () => {
      started++;
      await delay(300);
    });
    const run = worker.run();
    await eventually(() => started === 2, 5_000, "2 jobs started");
    await worker.stop();
    await run;
    assert.equal(started, 2, "nothing new started while stopping");
    assert.equal((await client.queues.stats("pipe-stop")).states.completed, 2);
    assert.equal((await client.queues.stats("pipe-stop")).states.available, 2);
    for (const body of counting.ackBodies) assert.equal(body["fetch"], undefined);
  });
});
