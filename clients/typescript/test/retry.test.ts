// The retry rule, against a scripted fetch: which failures are retried for
// which calls.
import { strict as assert } from "node:assert";
import { describe, test } from "node:test";
import {
  Client,
  ConnectionError,
  QueuePausedError,
  RateLimitedError,
  UnavailableError,
  newJobId,
} from "../src/index.js";

type Step = { status: number; body?: unknown; headers?: Record<string, string> } | { network: string };

function scripted(steps: Step[]): { client: Client; calls: Array<{ method: string; path: string }> } {
  const calls: Array<{ method: string; path: string }> = [];
  const fake = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const url = new URL(String(input));
    calls.push({ method: init?.method ?? "GET", path: url.pathname });
    const step = steps.shift();
    if (step === undefined) throw new Error("unexpected request");
    if ("network" in step) {
      throw new TypeError("fetch failed", { cause: Object.assign(new Error(step.network), { code: step.network }) });
    }
    return new Response(step.body === undefined ? "" : JSON.stringify(step.body), {
      status: step.status,
      headers: { "content-type": "application/svc+json", ...(step.headers ?? {}) },
    });
  };
  const client = new Client("http://127.0.0.1:1", {
    fetch: fake as typeof fetch,
    retry: { baseDelayMs: 1, maxDelayMs: 5, maxRetries: 3 },
  });
  return { client, calls };
}

const job = (id: string, extra: Record<string, unknown> = {}): Record<string, unknown> => ({
  id,
  type: "a.b",
  queue: "default",
  args: [],
  meta: {},
  state: "available",
  ...extra,
});
const error = (code: string, details: Record<string, unknown> = {}, retryable = false): unknown => ({
  error: { code, message: code, retryable, details, request_id: "req_1" },
});

describe("the retry rule", () => {
  test("an enqueue without id is not sent again after a broken connection", async () => {
    const { client, calls } = scripted([{ network: "ECONNRESET" }, { status: 201, body: { job: job(newJobId()) } }]);
    const failure = await client.enqueue("a.b", []).then(() => undefined, (e: unknown) => e);
    assert.ok(failure instanceof ConnectionError);
    assert.equal(failure.maybeApplied, true);
    assert.equal(calls.length, 1);
  });

  test("any call is sent again after a refused connection (it never left)", async () => {
    const id = newJobId();
    const { client, calls } = scripted([
      { network: "ECONNREFUSED" },
      { network: "ECONNREFUSED" },
      { status: 201, body: { job: job(id) } },
    ]);
    assert.equal((await client.enqueue("a.b", [])).id, id);
    assert.equal(calls.length, 3);
  });

  test("an enqueue with id is retried, and a retry that meets its own job answers it", async () => {
    const id = newJobId();
    const { client, calls } = scripted([
      { network: "ECONNRESET" },
      { status: 409, body: error("duplicate", { existing_job_id: id }) },
      { status: 200, body: { job: job(id) } },
    ]);
    const answer = await client.enqueue("a.b", [], { id });
    assert.equal(answer.id, id);
    assert.deepEqual(
      calls.map((c) => `${c.method} ${c.path}`),
      ["POST /svc/v1/jobs", "POST /svc/v1/jobs", `GET /svc/v1/jobs/${id}`],
    );
  });

  test("503 overloaded and 429 are retried for every call; their Retry-After is obeyed", async () => {
    const id = newJobId();
    const { client, calls } = scripted([
      { status: 503, body: error("backend_error", { reason: "overloaded" }, true), headers: { "retry-after": "0" } },
      { status: 429, body: error("rate_limited", {}, true), headers: { "retry-after": "0" } },
      { status: 201, body: { job: job(id) } },
    ]);
    assert.equal((await client.enqueue("a.b", [])).id, id);
    assert.equal(calls.length, 3);
  });

  test("a Retry-After beyond maxRetryAfterMs is not waited for", async () => {
    const { client, calls } = scripted([
      { status: 429, body: error("rate_limited", {}, true), headers: { "retry-after": "3600" } },
    ]);
    const failure = await client.get(newJobId()).then(() => undefined, (e: unknown) => e);
    assert.ok(failure instanceof RateLimitedError);
    assert.equal(failure.retryAfterMs, 3_600_000);
    assert.equal(calls.length, 1);
  });

  test("a 503 that may have been applied is retried only for idempotent calls", async () => {
    const storage = { status: 503, body: error("backend_error", { reason: "storage_failed" }, true) };
    const a = scripted([storage, { status: 201, body: { job: job(newJobId()) } }]);
    const failure = await a.client.enqueue("a.b", []).then(() => undefined, (e: unknown) => e);
    assert.ok(failure instanceof UnavailableError);
    assert.equal(failure.maybeApplied, true);
    assert.equal(a.calls.length, 1);

    const id = newJobId();
    const b = scripted([storage, { status: 200, body: { job: job(id) } }]);
    assert.equal((await b.client.get(id)).id, id);
    assert.equal(b.calls.length, 2);
  });

  test("a paused queue is not retried", async () => {
    const { client, calls } = scripted([
      { status: 503, body: error("queue_paused", { queue: "q" }, true), headers: { "retry-after": "5" } },
    ]);
    await assert.rejects(client.enqueue("a.b", [], { queue: "q" }), QueuePausedError);
    assert.equal(calls.length, 1);
  });

  test("retries stop after maxRetries", async () => {
    const { client, calls } = scripted([
      { network: "ECONNREFUSED" },
      { network: "ECONNREFUSED" },
      { network: "ECONNREFUSED" },
      { network: "ECONNREFUSED" },
    ]);
    const failure = await client.get(newJobId()).then(() => undefined, (e: unknown) => e);
    assert.ok(failure instanceof ConnectionError);
    assert.equal(failure.code, "connection_refused");
    assert.equal(failure.attempts, 4);
    assert.equal(calls.length, 4);
  });

  test("an ack whose first attempt was applied answers the completed job", async () => {
    const id = newJobId();
    const { client, calls } = scripted([
      { network: "ECONNRESET" },
      { status: 409, body: error("conflict", { current_state: "completed", reason: "invalid_state" }) },
      { status: 200, body: { job: job(id, { state: "completed", worker_id: "w", completed_at: "x" }) } },
    ]);
    const answer = await client.ack(id, { ok: true }, { workerId: "w" });
    assert.equal(answer.state, "completed");
    assert.equal(calls.length, 3);
  });

  test("a nack is not sent again after a broken connection", async () => {
    const { client, calls } = scripted([{ network: "ECONNRESET" }]);
    await assert.rejects(client.nack(newJobId(), { type: "E", message: "m" }), ConnectionError);
    assert.equal(calls.length, 1);
  });
});
