import { strict as assert } from "node:assert";
import { spawn } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, describe, test } from "node:test";
import { Client, Worker, silentLogger } from "../src/index.js";
import { TestServer, delay, eventually } from "./helpers.js";

const here = dirname(fileURLToPath(import.meta.url));

let server: TestServer;
let client: Client;

before(async () => {
  server = await TestServer.start();
  client = new Client(server.url);
});
after(async () => {
  await server.stop();
});

describe("resilience", () => {
  test("SIGTERM: jobs in hand finish, the process exits 0, nothing is lost or run twice", async () => {
    const jobs = await client.enqueueBatch(
      Array.from({ length: 12 }, (_, i) => ({ type: "slow.task", args: [i], queue: "sigterm" })),
    );
    const child = spawn(process.execPath, [join(here, "fixtures/sigterm-worker.js")], {
      env: { ...process.env, SVC_URL: server.url, SVC_QUEUE: "sigterm", CONCURRENCY: "4", TASK_MS: "1000" },
      stdio: ["ignore", "pipe", "inherit"],
    });
    const events: Array<{ event: string; id?: string }> = [];
    let buffer = "";
    child.stdout!.on("data", (chunk: Buffer) => {
      buffer += chunk.toString();
      let newline: number;
      while ((newline = buffer.indexOf("\n")) >= 0) {
        events.push(JSON.parse(buffer.slice(0, newline)));
        buffer = buffer.slice(newline + 1);
      }
    });
    const exited = new Promise<{ code: number | null; signal: string | null }>((resolve) =>
      child.once("exit", (code, signal) => resolve({ code, signal })),
    );
    await eventually(() => events.filter((e) => e.event === "start").length === 4, 10_000, "4 jobs started");
    child.kill("SIGTERM");
    const { code, signal } = await exited;
    assert.equal(signal, null);
    assert.equal(code, 0);
    const started = events.filter((e) => e.event === "start").map((e) => e.id!);
    const done = events.filter((e) => e.event === "done").map((e) => e.id!);
    assert.equal(started.length, 4, "nothing new started after SIGTERM");
    assert.deepEqual([...done].sort(), [...started].sort(), "every job in hand finished");
    assert.equal(events.at(-1)?.event, "stopped");
    for (const job of jobs) {
      const read = await client.get(job.id);
      if (started.includes(job.id)) assert.equal(read.state, "completed");
      else assert.deepEqual([read.state, read.attempt], ["available", 0], "untouched jobs wait for the next worker");
    }

    // The next worker takes the rest: every job ran exactly once in all.
    const counts = new Map<string, number>(started.map((id) => [id, 1]));
    const next = new Worker(server.url, { queues: ["sigterm"], concurrency: 8, handleSignals: false, logger: silentLogger });
    next.handle("slow.task", (_args, ctx) => void counts.set(ctx.jobId, (counts.get(ctx.jobId) ?? 0) + 1));
    const run = next.run();
    await eventually(() => counts.size === 12, 10_000, "the rest to run");
    await next.stop();
    await run;
    for (const job of jobs) {
      assert.equal(counts.get(job.id), 1);
      assert.equal((await client.get(job.id)).state, "completed");
    }
  });

  test("the server killed and restarted mid-run: the worker carries on, nothing is lost", async () => {
    const jobs = await client.enqueueBatch(
      Array.from({ length: 80 }, (_, i) => ({ type: "crash.task", args: [i], queue: "crash", visibilityTimeout: 4_000 })),
    );
    const counts = new Map<string, number>();
    const worker = new Worker(server.url, {
      queues: ["crash"],
      concurrency: 4,
      handleSignals: false,
      logger: silentLogger,
      reconnect: { baseDelayMs: 100, maxDelayMs: 1_000 },
    });
    worker.handle("crash.task", async (_args, ctx) => {
      counts.set(ctx.jobId, (counts.get(ctx.jobId) ?? 0) + 1);
      await delay(30);
    });
    const run = worker.run();
    await eventually(() => counts.size >= 20, 10_000, "20 jobs handled");
    await server.kill();
    const handledAtKill = counts.size;
    await delay(800);
    await server.launch();
    await eventually(
      async () => (await client.queues.stats("crash")).states.completed === 80,
      30_000,
      "all 80 jobs completed after the restart",
    );
    await worker.stop();
    await run;
    assert.ok(handledAtKill < 80, "the kill came mid-run");
    for (const job of jobs) {
      assert.equal((await client.get(job.id)).state, "completed");
      assert.equal(counts.get(job.id), 1, `job ${job.id} ran ${counts.get(job.id)} times`);
    }
  });
  test("a graceful server restart: the worker releases its jobs, waits, and resumes", async () => {
    const jobs = await client.enqueueBatch(
      Array.from({ length: 6 }, (_, i) => ({ type: "drain.task", args: [i], queue: "drain", visibilityTimeout: 1_500 })),
    );
    const completed = new Set<string>();
    let aborted = 0;
    const worker = new Worker(server.url, {
      queues: ["drain"],
      concurrency: 2,
      handleSignals: false,
      logger: silentLogger,
      abortGraceMs: 200,
      reconnect: { baseDelayMs: 100, maxDelayMs: 500 },
    });
    worker.handle("drain.task", (_args, ctx) =>
      new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          completed.add(ctx.jobId);
          resolve("ok");
        }, 600);
        ctx.signal.addEventListener("abort", () => {
          clearTimeout(timer);
          aborted++;
          reject(ctx.signal.reason);
        });
      }),
    );
    const run = worker.run();
    await eventually(async () => (await client.queues.stats("drain")).states.active === 2, 10_000, "2 jobs running");
    await server.signal("SIGTERM");
    await delay(300);
    await server.launch();
    await eventually(
      async () => (await client.queues.stats("drain")).states.completed === 6,
      20_000,
      "all jobs completed after the restart",
    );
    assert.equal(worker.state, "running");
    await worker.stop();
    await run;
    assert.ok(aborted >= 1, "the drain's terminate aborted the jobs in hand");
    for (const job of jobs) assert.equal((await client.get(job.id)).state, "completed");
  });
});
