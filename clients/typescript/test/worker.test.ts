import { strict as assert } from "node:assert";
import { after, before, describe, test } from "node:test";
import {
  Client,
  JobAbortedError,
  JobError,
  JobTimeoutError,
  Worker,
  silentLogger,
  type WorkerOptions,
} from "../src/index.js";
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

let counter = 0;
function makeWorker(options: WorkerOptions): Worker {
  counter++;
  return new Worker(server.url, {
    workerId: `test-worker-${counter}`,
    handleSignals: false,
    logger: silentLogger,
    ...options,
  });
}

async function settled(ids: string[], states = ["completed", "discarded", "cancelled"]): Promise<void> {
  await eventually(
    async () => {
      for (const id of ids) if (!states.includes((await client.get(id)).state)) return false;
      return true;
    },
    20_000,
    `jobs to end (${states.join("/")})`,
  );
}

describe("worker", () => {
  test("200 jobs at concurrency 8: each handled exactly once", async () => {
    const jobs = await client.enqueueBatch(
      Array.from({ length: 200 }, (_, i) => ({ type: "count.me", args: [i], queue: "bulk" })),
    );
    const seen = new Map<string, number>();
    let running = 0;
    let peak = 0;
    const worker = makeWorker({ queues: ["bulk"], concurrency: 8 });
    worker.handle<[number]>("count.me", async ([n], ctx) => {
      running++;
      peak = Math.max(peak, running);
      seen.set(ctx.jobId, (seen.get(ctx.jobId) ?? 0) + 1);
      await delay(n % 5);
      running--;
      return { doubled: n * 2 };
    });
    const run = worker.run();
    await eventually(() => seen.size === 200, 30_000, "200 jobs handled");
    await settled(jobs.map((j) => j.id));
    await worker.stop();
    await run;
    assert.equal(seen.size, 200);
    for (const [id, count] of seen) assert.equal(count, 1, `job ${id} handled ${count} times`);
    assert.ok(peak <= 8, `peak concurrency ${peak}`);
    const sample = await client.get(jobs[17]!.id);
    assert.equal(sample.state, "completed");
    assert.deepEqual(sample.result, { doubled: 34 });
    const stats = await client.queues.stats("bulk");
    assert.equal(stats.states.completed, 200);
  });

  test("queues are taken in strict order", async () => {
    await client.enqueue("order.job", ["low"], { queue: "order-low" });
    await client.enqueue("order.job", ["high"], { queue: "order-high" });
    const order: string[] = [];
    const worker = makeWorker({ queues: ["order-high", "order-low"], concurrency: 1 });
    worker.handle<[string]>("order.job", ([which]) => void order.push(which));
    const run = worker.run();
    await eventually(() => order.length === 2);
    await worker.stop();
    await run;
    assert.deepEqual(order, ["high", "low"]);
  });

  test("a failure is nacked with type, message and backtrace, retried, then dead-lettered", async () => {
    const job = await client.enqueue("flaky.job", [], {
      queue: "failing",
      retry: { maxAttempts: 3, initialInterval: 50, maxInterval: 100, onExhaustion: "dead_letter" },
    });
    const attempts: number[] = [];
    class SmtpError extends Error {
      override name = "SmtpError";
    }
    const worker = makeWorker({ queues: ["failing"], concurrency: 2 });
    worker.handle("flaky.job", (_args, ctx) => {
      attempts.push(ctx.attempt);
      throw new SmtpError(`421 try later (attempt ${ctx.attempt})`);
    });
    const run = worker.run();
    await settled([job.id], ["discarded"]);
    await worker.stop();
    await run;
    assert.deepEqual(attempts, [1, 2, 3]);
    const dead = await client.get(job.id);
    assert.equal(dead.error?.type, "SmtpError");
    assert.equal(dead.error?.message, "421 try later (attempt 3)");
    assert.ok((dead.error?.backtrace?.length ?? 0) > 0);
    assert.match(dead.error!.backtrace![0]!, /^at /);
    assert.equal(dead.errors?.length, 3);
    const listing = await client.deadLetter.list({ queue: "failing" });
    assert.ok(listing.items.some((j) => j.id === job.id));
  });

  test("a JobError with retryable: false ends the job at once", async () => {
    const job = await client.enqueue("final.job", [], { queue: "final", retry: { maxAttempts: 5 } });
    const worker = makeWorker({ queues: ["final"] });
    worker.handle("final.job", () => {
      throw new JobError("bad address", { type: "invalid_address", retryable: false, details: { field: "to" } });
    });
    const run = worker.run();
    await settled([job.id], ["discarded"]);
    await worker.stop();
    await run;
    const read = await client.get(job.id);
    assert.equal(read.attempt, 1);
    assert.equal(read.error?.type, "invalid_address");
    assert.deepEqual(read.error?.details, { field: "to" });
  });

  test("an unknown job type is nacked with unknown_job_type", async () => {
    const job = await client.enqueue("nobody.handles", [], { queue: "unknown", retry: { maxAttempts: 1 } });
    const worker = makeWorker({ queues: ["unknown"] });
    worker.handle("something.else", () => undefined);
    const run = worker.run();
    await settled([job.id], ["discarded"]);
    await worker.stop();
    await run;
    const read = await client.get(job.id);
    assert.equal(read.error?.type, "unknown_job_type");
    assert.match(read.error!.message, /no handler for job type "nobody\.handles"/);
  });

  test("heartbeats keep a lease past its visibility timeout", async () => {
    const job = await client.enqueue("slow.job", [], { queue: "slow", visibilityTimeout: 1_000, timeout: 20_000 });
    let runs = 0;
    const worker = makeWorker({ queues: ["slow"], concurrency: 4 });
    worker.handle("slow.job", async () => {
      runs++;
      await delay(3_500);
      return "done";
    });
    const run = worker.run();
    await settled([job.id]);
    await delay(300);
    await worker.stop();
    await run;
    assert.equal(runs, 1);
    const read = await client.get(job.id);
    assert.equal(read.state, "completed");
    assert.equal(read.attempt, 1);
    assert.equal(read.result, "done");
  });

  test("the job's timeout aborts ctx.signal and nacks with a timeout", async () => {
    const job = await client.enqueue("hang.job", [], { queue: "hang", timeout: 300, retry: { maxAttempts: 1 } });
    let reason: unknown;
    const worker = makeWorker({ queues: ["hang"] });
    worker.handle("hang.job", (_args, ctx) => {
      assert.ok(ctx.deadline.getTime() > Date.now());
      return new Promise((_, reject) =>
        ctx.signal.addEventListener("abort", () => {
          reason = ctx.signal.reason;
          reject(ctx.signal.reason);
        }),
      );
    });
    const run = worker.run();
    await settled([job.id], ["discarded"]);
    await worker.stop();
    await run;
    assert.ok(reason instanceof JobTimeoutError);
    const read = await client.get(job.id);
    assert.equal(read.error?.type, "timeout");
  });

  test("a handler that never reads ctx.signal is still timed out; read late, the signal is aborted", async () => {
    const job = await client.enqueue("deaf.job", [], { queue: "deaf", timeout: 300, retry: { maxAttempts: 1 } });
    let lateSignal: AbortSignal | undefined;
    const worker = makeWorker({ queues: ["deaf"] });
    worker.handle("deaf.job", (_args, ctx) => {
      // Sleeps past its timeout without looking at ctx.signal, then reads it.
      return new Promise((resolve) =>
        setTimeout(() => {
          lateSignal = ctx.signal;
          resolve(undefined);
        }, 600),
      );
    });
    const run = worker.run();
    await settled([job.id], ["discarded"]);
    const read = await client.get(job.id);
    assert.equal(read.error?.type, "timeout");
    while (lateSignal === undefined) await new Promise((resolve) => setTimeout(resolve, 20));
    assert.ok(lateSignal.aborted);
    assert.ok(lateSignal.reason instanceof JobTimeoutError);
    await worker.stop();
    await run;
  });

  test("progress shows in GET /jobs/{id}/progress; middleware and traceparent reach the handler", async () => {
    const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const producer = new Client(server.url, { traceparent: () => traceparent });
    const seenByMiddleware: string[] = [];
    producer.use(async (context, next) => {
      for (const item of context.items) item.meta = { ...item.meta, enqueued_by: "test" };
      return next();
    });
    const job = await producer.enqueue("report.build", [3], { queue: "progress" });
    let ctxTrace: string | undefined;
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const worker = makeWorker({ queues: ["progress"] });
    worker.use(async (ctx, next) => {
      seenByMiddleware.push(`before ${ctx.type}`);
      const result = await next();
      seenByMiddleware.push(`after ${JSON.stringify(result)}`);
      return result;
    });
    worker.handle<[number]>("report.build", async ([rows], ctx) => {
      ctxTrace = ctx.traceparent;
      await ctx.progress(0.4, { message: "400 of 1000 rows", data: { rows: 400 } });
      await gate;
      return { rows };
    });
    const run = worker.run();
    await eventually(async () => (await client.progress(job.id)).progress === 0.4);
    const progress = await client.progress(job.id);
    assert.equal(progress.state, "active");
    assert.equal(progress.message, "400 of 1000 rows");
    assert.deepEqual(progress.data, { rows: 400 });
    release();
    await settled([job.id]);
    await worker.stop();
    await run;
    assert.equal(ctxTrace, traceparent);
    assert.deepEqual(seenByMiddleware, ["before report.build", 'after {"rows":3}']);
    assert.deepEqual((await client.get(job.id)).meta, { traceparent, enqueued_by: "test" });
  });

  test("quiet stops fetching; lifting the signal resumes", async () => {
    const worker = makeWorker({ queues: ["quietq"], quietPollMs: 200, pollWaitMs: 5_000 });
    const done: string[] = [];
    worker.handle("q.job", (_args, ctx) => void done.push(ctx.jobId));
    const run = worker.run();
    await delay(200);
    await client.workers.quiet(worker.workerId);
    await eventually(() => worker.state === "quiet", 5_000, "the worker to go quiet");
    const job = await client.enqueue("q.job", [], { queue: "quietq" });
    await delay(1_000);
    assert.equal((await client.get(job.id)).state, "available", "a quiet worker takes nothing");
    await client.workers.forget(worker.workerId);
    await settled([job.id]);
    assert.deepEqual(done, [job.id]);
    await worker.stop();
    await run;
  });

  test("terminate aborts the jobs in hand, releases them, and stops the worker", async () => {
    const job = await client.enqueue("long.job", [], { queue: "termq", visibilityTimeout: 1_500 });
    let reason: unknown;
    let started!: () => void;
    const running = new Promise<void>((r) => (started = r));
    const worker = makeWorker({ queues: ["termq"], abortGraceMs: 500 });
    worker.handle("long.job", (_args, ctx) => {
      started();
      return new Promise((_, reject) =>
        ctx.signal.addEventListener("abort", () => {
          reason = ctx.signal.reason;
          reject(new Error("interrupted"));
        }),
      );
    });
    const run = worker.run();
    await running;
    await client.workers.terminate(worker.workerId);
    await run;
    assert.ok(reason instanceof JobAbortedError);
    assert.equal((reason as JobAbortedError).why, "terminate");
    const read = await client.get(job.id);
    assert.equal(read.state, "available", "released with requeue");
    assert.equal(read.attempt, 0, "the attempt was given back");
  });

  test("a job cancelled while it runs aborts its handler", async () => {
    const job = await client.enqueue("cancel.me", [], { queue: "cancelq", visibilityTimeout: 900 });
    let reason: unknown;
    const worker = makeWorker({ queues: ["cancelq"] });
    worker.handle("cancel.me", (_args, ctx) =>
      new Promise((resolve) =>
        ctx.signal.addEventListener("abort", () => {
          reason = ctx.signal.reason;
          resolve("too late");
        }),
      ),
    );
    const run = worker.run();
    await eventually(async () => (await client.get(job.id)).state === "active");
    await client.cancel(job.id);
    await eventually(() => reason !== undefined, 5_000, "the handler to be aborted");
    await worker.stop();
    await run;
    assert.equal((reason as JobAbortedError).why, "cancelled");
    assert.equal((await client.get(job.id)).state, "cancelled");
  });

  test("stopping (here through run's signal) lets jobs in hand finish, then run() resolves", async () => {
    const jobs = await client.enqueueBatch([1, 2, 3].map((n) => ({ type: "finish.me", args: [n], queue: "stopq" })));
    let startedCount = 0;
    const worker = makeWorker({ queues: ["stopq"], concurrency: 3 });
    worker.handle("finish.me", async () => {
      startedCount++;
      await delay(500);
      return "ok";
    });
    const controller = new AbortController();
    const run = worker.run({ signal: controller.signal });
    await eventually(() => startedCount === 3);
    controller.abort();
    await run;
    for (const job of jobs) assert.equal((await client.get(job.id)).state, "completed");
  });

  test("a short grace releases what is still running, with requeue", async () => {
    const job = await client.enqueue("stuck.job", [], { queue: "graceq" });
    let started = false;
    const worker = makeWorker({ queues: ["graceq"], abortGraceMs: 100 });
    worker.handle("stuck.job", async () => {
      started = true;
      await delay(10_000);
    });
    const run = worker.run();
    await eventually(() => started);
    await worker.stop({ graceMs: 200 });
    await run;
    const read = await client.get(job.id);
    assert.equal(read.state, "available");
    assert.equal(read.attempt, 0);
  });
});
