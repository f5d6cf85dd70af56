import { strict as assert } from "node:assert";
import { after, before, describe, test } from "node:test";
import {
  Client,
  ConflictError,
  DuplicateError,
  NotFoundError,
  QueuePausedError,
  ValidationError,
  newJobId,
  type Job,
} from "../src/index.js";
import { TestServer } from "./helpers.js";

let server: TestServer;
let client: Client;

before(async () => {
  server = await TestServer.start();
  client = new Client(server.url);
});
after(async () => {
  await server.stop();
});

describe("enqueue", () => {
  test("every option round-trips through enqueue and get", async () => {
    const id = newJobId();
    const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const before = Date.now();
    const created = await client.enqueue("email.send", ["ada@example.com", { n: 1 }], {
      id,
      queue: "mail",
      priority: 7,
      delay: 60_000,
      ttl: 120_000,
      retry: {
        maxAttempts: 4,
        initialInterval: 250,
        backoffCoefficient: 3,
        maxInterval: "PT1M",
        jitter: false,
        nonRetryableErrors: ["ValidationError", "smtp.*"],
        onExhaustion: "dead_letter",
      },
      unique: { key: ["0"], period: "PT1H", onConflict: "reject", states: ["scheduled", "available"] },
      tags: ["welcome", "v2"],
      timeout: 45_000,
      visibilityTimeout: 12_000,
      meta: { tenant: "acme" },
      rateLimit: { key: "smtp", concurrency: 5, rate: 10, period: "minute" },
      traceparent,
    });
    assert.equal(created.id, id);
    assert.equal(created.state, "scheduled");
    const job = await client.get(id);
    assert.equal(job.type, "email.send");
    assert.deepEqual(job.args, ["ada@example.com", { n: 1 }]);
    assert.equal(job.queue, "mail");
    assert.equal(job.priority, 7);
    const scheduled = Date.parse(job.scheduled_at!);
    assert.ok(scheduled >= before + 59_000 && scheduled <= Date.now() + 61_000, `scheduled_at ${job.scheduled_at}`);
    assert.equal(Date.parse(job.expires_at!) - scheduled, 120_000);
    assert.deepEqual(job.retry, {
      max_attempts: 4,
      initial_interval: "PT0.25S",
      backoff_coefficient: 3,
      max_interval: "PT1M",
      jitter: false,
      non_retryable_errors: ["ValidationError", "smtp.*"],
      on_exhaustion: "dead_letter",
    });
    assert.equal(job.max_attempts, 4);
    assert.deepEqual(job.unique, { key: ["0"], period: "PT1H", on_conflict: "reject", states: ["scheduled", "available"] });
    assert.match(job.unique_key!, /^[0-9a-f]{64}$/);
    assert.deepEqual(job.tags, ["welcome", "v2"]);
    assert.equal(job.timeout_ms, 45_000);
    assert.equal(job.visibility_timeout_ms, 12_000);
    assert.deepEqual(job.meta, { tenant: "acme", traceparent });
    assert.deepEqual(job.rate_limit, { key: "smtp", concurrency: 5, rate: 10, period: "minute", on_limit: "wait" });
  });

  test("scheduledAt, expiresAt, schema and pending round-trip", async () => {
    await client.schemas.register({
      uri: "urn:test:report:v1",
      schema: { type: "array", prefixItems: [{ type: "integer" }] },
    });
    const at = new Date(Date.now() + 3_600_000);
    const expires = new Date(at.getTime() + 60_000);
    const job = await client.enqueue("report.build", [7], {
      scheduledAt: at,
      expiresAt: expires,
      schema: "urn:test:report:v1",
      pending: true,
    });
    const read = await client.get(job.id);
    assert.equal(read.state, "pending");
    assert.equal(read.scheduled_at, at.toISOString());
    assert.equal(read.expires_at, expires.toISOString());
    assert.equal(read.schema, "urn:test:report:v1");
    const activated = await client.activate(job.id);
    assert.equal(activated.state, "scheduled");
    await assert.rejects(client.enqueue("report.build", ["x"], { schema: "urn:test:report:v1" }), ValidationError);
  });

  test("a unique ignore answers the held job, deduplicated", async () => {
    const first = await client.enqueue("mail.digest", [{ user: 1 }], { unique: { key: ["user"], onConflict: "ignore" } });
    const second = await client.enqueue("mail.digest", [{ user: 1 }], { unique: { key: ["user"], onConflict: "ignore" } });
    assert.equal(second.id, first.id);
    assert.equal(second.deduplicated, true);
    const rejected = await client
      .enqueue("mail.digest", [{ user: 1 }], { unique: { key: ["user"] } })
      .then(() => undefined, (e: unknown) => e);
    assert.ok(rejected instanceof DuplicateError);
    assert.equal(rejected.existingJobId, first.id);
  });

  test("errors carry code, status, details and request id", async () => {
    const missing = await client.get(newJobId()).then(() => undefined, (e: unknown) => e);
    assert.ok(missing instanceof NotFoundError);
    assert.equal(missing.code, "not_found");
    assert.equal(missing.status, 404);
    assert.equal(missing.retryable, false);
    assert.equal(missing.details["resource_type"], "job");
    assert.match(missing.requestId ?? "", /^req_/);

    const invalid = await client.enqueue("9bad type", []).then(() => undefined, (e: unknown) => e);
    assert.ok(invalid instanceof ValidationError);
    assert.equal(invalid.status, 400);

    const id = newJobId();
    await client.enqueue("a.b", [], { id });
    const dup = await client.enqueue("a.b", [], { id }).then(() => undefined, (e: unknown) => e);
    assert.ok(dup instanceof DuplicateError, "a used id is a duplicate on a first attempt");
    assert.equal(dup.existingJobId, id);
  });

  test("enqueueBatch stores all or nothing, in order", async () => {
    const jobs = await client.enqueueBatch([
      { type: "a.one", args: [1], queue: "batchq" },
      { type: "a.two", args: [2], queue: "batchq", priority: 3 },
    ]);
    assert.deepEqual(
      jobs.map((j) => [j.type, j.args, j.priority]),
      [
        ["a.one", [1], 0],
        ["a.two", [2], 3],
      ],
    );
    await assert.rejects(client.enqueueBatch([{ type: "a.one" }, { type: "" as string }]), TypeError);
    await assert.rejects(client.enqueueBatch([{ type: "a.one" }, { type: "a.x", priority: 1000 }]), ValidationError);
  });

  test("cancel and progress", async () => {
    const job = await client.enqueue("a.cancel", []);
    const cancelled = await client.cancel(job.id);
    assert.equal(cancelled.state, "cancelled");
    assert.equal(cancelled.previous_state, "available");
    assert.equal((await client.cancel(job.id)).state, "cancelled", "cancel again answers the same");
    const progress = await client.progress(job.id);
    assert.equal(progress.progress, null);
  });

  test("an AbortSignal cancels a call", async () => {
    const controller = new AbortController();
    const started = Date.now();
    const call = client.claim({ queues: ["never-filled"], waitMs: 5_000, signal: controller.signal });
    setTimeout(() => controller.abort(), 100);
    await assert.rejects(call, (e: unknown) => e instanceof Error && e.name === "AbortError");
    assert.ok(Date.now() - started < 2_000);
    const reason = new Error("gave up");
    await assert.rejects(client.get(newJobId(), { signal: AbortSignal.abort(reason) }), (e: unknown) => e === reason);
  });
});

describe("workflows", () => {
  test("chain, group and batch with callbacks; get and cancel", async () => {
    const chain = await client.workflows.chain(
      [
        { type: "user.create", args: ["ada"], queue: "wf" },
        { type: "email.welcome", queue: "wf" },
      ],
      { name: "onboarding" },
    );
    assert.equal(chain.type, "chain");
    assert.equal(chain.name, "onboarding");
    assert.equal(chain.steps?.length, 2);
    assert.equal(chain.steps?.[1]?.state, "pending");

    const group = await client.workflows.group([{ type: "export.csv" }, { type: "export.pdf" }], {
      defaults: { queue: "exports", priority: 2 },
    });
    assert.equal(group.jobs?.length, 2);
    const member = await client.get(group.jobs![0]!.job_id);
    assert.equal(member.queue, "exports");
    assert.equal(member.priority, 2);
    assert.equal(member.workflow_id, group.id);

    const batch = await client.workflows.batch(
      [{ type: "mail.send", args: [1] }, { type: "mail.send", args: [2] }],
      { onComplete: { type: "mail.report" }, onFailure: { type: "mail.alert", queue: "alerts" } },
      { meta: { campaign: "c1" } },
    );
    assert.equal(batch.type, "batch");
    assert.equal(batch.callbacks?.on_failure?.queue, "alerts");
    assert.deepEqual((await client.get(batch.jobs![0]!.job_id)).meta, { campaign: "c1" });

    const read = await client.workflows.get(chain.id);
    assert.equal(read.id, chain.id);
    const cancelled = await client.workflows.cancel(chain.id);
    assert.equal(cancelled.state, "cancelled");
    await assert.rejects(client.workflows.cancel(chain.id), ConflictError);
  });
});

describe("cron, queues, dead letter, webhooks", () => {
  test("cron register, list, get, update, delete", async () => {
    const entry = await client.cron.register({
      name: "nightly-cleanup",
      schedule: "0 2 * * *",
      timezone: "Europe/Berlin",
      type: "maintenance.cleanup",
      args: [30],
      queue: "maintenance",
      overlapPolicy: "skip",
      description: "purge old rows",
      options: { priority: 4, retry: { maxAttempts: 2 } },
    });
    assert.equal(entry.description, "purge old rows");
    assert.equal(entry.options["priority"], 4);
    assert.equal(entry.name, "nightly-cleanup");
    assert.equal(entry.timezone, "Europe/Berlin");
    assert.equal(entry.status, "active");
    assert.ok(entry.next_run_at);
    const again = await client.cron.register({ name: "nightly-cleanup", schedule: "@daily", type: "maintenance.cleanup" });
    assert.equal(again.schedule, "@daily");
    const list = await client.cron.list();
    assert.deepEqual(
      list.items.map((c) => c.name),
      ["nightly-cleanup"],
    );
    assert.equal((await client.cron.get("nightly-cleanup")).type, "maintenance.cleanup");
    const disabled = await client.cron.update("nightly-cleanup", { enabled: false });
    assert.equal(disabled.status, "disabled");
    await client.cron.delete("nightly-cleanup");
    await assert.rejects(client.cron.get("nightly-cleanup"), NotFoundError);
  });

  test("queues list, stats, pause and resume", async () => {
    await client.enqueue("q.job", [], { queue: "stats-q" });
    const stats = await client.queues.stats("stats-q");
    assert.equal(stats.queue, "stats-q");
    assert.equal(stats.states.available, 1);
    const paused = await client.queues.pause("stats-q");
    assert.deepEqual(paused, { queue: "stats-q", paused: true });
    const refused = await client.enqueue("q.job", [], { queue: "stats-q" }).then(() => undefined, (e: unknown) => e);
    assert.ok(refused instanceof QueuePausedError, "a paused queue is not retried");
    assert.equal(refused.queue, "stats-q");
    assert.equal(refused.attempts, 1);
    await client.queues.resume("stats-q");
    const list = await client.queues.list({ limit: 100 });
    assert.ok(list.items.some((q) => q.name === "stats-q" && q.size === 1 && !q.paused));
  });

  test("dead letter list, retry, delete", async () => {
    const job = await client.enqueue("dl.fail", [], { queue: "dlq", retry: { maxAttempts: 1 } });
    const [claimed] = await client.claim({ queues: ["dlq"], workerId: "dl-worker" });
    assert.equal(claimed?.id, job.id);
    await client.nack(job.id, { type: "Boom", message: "no" }, { workerId: "dl-worker" });
    const dead = await client.deadLetter.list({ queue: "dlq" });
    assert.deepEqual(
      dead.items.map((j: Job) => j.id),
      [job.id],
    );
    const seen: string[] = [];
    for await (const j of client.deadLetter.iterate({ queue: "dlq", limit: 1 })) seen.push(j.id);
    assert.deepEqual(seen, [job.id]);
    const retried = await client.deadLetter.retry(job.id);
    assert.equal(retried.state, "available");
    assert.equal(retried.attempt, 0);
    const [again] = await client.claim({ queues: ["dlq"], workerId: "dl-worker" });
    await client.nack(again!.id, { type: "Boom", message: "no" }, { workerId: "dl-worker" });
    assert.deepEqual(await client.deadLetter.delete(job.id), { deleted: true, job_id: job.id });
    await assert.rejects(client.get(job.id), NotFoundError);
  });

  test("webhook subscriptions create, list, get, update, delete", async () => {
    const sub = await client.webhooks.create({
      url: "https://hooks.example.com/svc",
      events: ["job.completed", "workflow.*"],
      secret: "s3cret-s3cret-s3cret",
      metadata: { team: "ops" },
      filter: { queues: ["mail"], jobTypes: ["email.*"] },
    });
    assert.match(sub.id, /^sub_/);
    assert.deepEqual(sub.filter, { queues: ["mail"], job_types: ["email.*"] });
    assert.equal(sub.active, true);
    assert.equal((sub as unknown as Record<string, unknown>)["secret"], undefined);
    const list = await client.webhooks.list();
    assert.deepEqual(
      list.items.map((s) => s.id),
      [sub.id],
    );
    assert.equal((await client.webhooks.get(sub.id)).url, "https://hooks.example.com/svc");
    const updated = await client.webhooks.update(sub.id, { active: false, events: ["job.*"] });
    assert.equal(updated.active, false);
    assert.deepEqual(updated.events, ["job.*"]);
    await assert.rejects(client.webhooks.create({ url: "http://insecure.example.com", events: ["*"], secret: "s3cret-s3cret-s3cret" }), ValidationError);
    assert.deepEqual(await client.webhooks.delete(sub.id), { deleted: true, id: sub.id });
    await assert.rejects(client.webhooks.get(sub.id), NotFoundError);
  });
});
