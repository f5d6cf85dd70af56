import { strict as assert } from "node:assert";
import { describe, test } from "node:test";
import { InlineWorker, JobError, JobTimeoutError, Worker, type Enqueuer } from "../src/index.js";

// Code under test takes an Enqueuer: a Client in production, an InlineWorker here.
async function signUp(queue: Enqueuer, email: string): Promise<string> {
  const job = await queue.enqueue("email.welcome", [email], { queue: "mail", meta: { source: "signup" } });
  return job.id;
}

describe("inline mode", () => {
  test("enqueue runs the handler in process, without a server", async () => {
    const inline = Worker.inline();
    const sent: string[] = [];
    inline.handle<[string]>("email.welcome", async ([to], ctx) => {
      sent.push(to);
      await ctx.progress(1, { message: "sent" });
      return { sent: to, attempt: ctx.attempt };
    });
    const id = await signUp(inline, "ada@example.com");
    assert.deepEqual(sent, ["ada@example.com"]);
    const [job] = inline.jobs;
    assert.equal(job?.id, id);
    assert.equal(job?.state, "completed");
    assert.equal(job?.queue, "mail");
    assert.deepEqual(job?.meta, { source: "signup" });
    assert.deepEqual(job?.result, { sent: "ada@example.com", attempt: 1 });
    assert.deepEqual(inline.progressReports.get(id), [{ progress: 1, message: "sent", data: undefined }]);
  });

  test("failures are retried up to max attempts, then discarded; non-retryable ones at once", async () => {
    const inline = new InlineWorker();
    let calls = 0;
    inline.handle("flaky", () => {
      calls++;
      if (calls < 3) throw new Error(`fail ${calls}`);
      return "third time";
    });
    inline.handle("broken", () => {
      throw new JobError("nope", { type: "invalid", retryable: false });
    });
    const flaky = await inline.enqueue("flaky", [], { retry: { maxAttempts: 5 } });
    assert.equal(flaky.state, "completed");
    assert.equal(flaky.attempt, 3);
    assert.equal(flaky.errors?.length, 2);
    const broken = await inline.enqueue("broken", [], { retry: { maxAttempts: 5 } });
    assert.equal(broken.state, "discarded");
    assert.equal(broken.attempt, 1);
    assert.equal(broken.error?.type, "invalid");
    const unknown = await inline.enqueue("nobody", []);
    assert.equal(unknown.state, "discarded");
    assert.equal(unknown.error?.type, "unknown_job_type");
  });

  test("queued mode waits for drain(); perform() answers a result directly", async () => {
    const inline = new InlineWorker({ mode: "queued" });
    const order: number[] = [];
    inline.handle<[number]>("n", ([n]) => {
      order.push(n);
      return n * 10;
    });
    await inline.enqueueBatch([{ type: "n", args: [1] }, { type: "n", args: [2] }]);
    assert.deepEqual(order, []);
    assert.equal(inline.jobs[0]?.state, "available");
    const ran = await inline.drain();
    assert.deepEqual(order, [1, 2]);
    assert.deepEqual(
      ran.map((j) => j.result),
      [10, 20],
    );
    assert.equal(await inline.perform<number>("n", [7]), 70);
    await assert.rejects(inline.perform("missing", []), JobError);
  });

  test("middleware, traceparent and the timeout work as in a worker", async () => {
    const inline = new InlineWorker();
    const log: string[] = [];
    inline.use(async (ctx, next) => {
      log.push(`before ${ctx.type} ${ctx.traceparent}`);
      return next();
    });
    inline.handle("slow", (_args, ctx) => new Promise((_, reject) => ctx.signal.addEventListener("abort", () => reject(ctx.signal.reason))));
    const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const job = await inline.enqueue("slow", [], { timeout: 50, traceparent, retry: { maxAttempts: 1 } });
    assert.equal(job.state, "discarded");
    assert.equal(job.error?.type, "timeout");
    assert.deepEqual(log, [`before slow ${traceparent}`]);
    await assert.rejects(inline.perform("slow", [], { timeout: 20 }), JobTimeoutError);
  });
});
