/** Translation of the client's camelCase options into svc's wire bodies. */
import type {
  AckFetch,
  CronPatch,
  CronRegistration,
  Duration,
  EnqueueOptions,
  JsonObject,
  RateLimit,
  RetryPolicy,
  Timestamp,
  UniquePolicy,
  WebhookPatch,
  WorkflowJob,
} from "./types.js";
import { compact, isoDuration, timestamp } from "./util.js";

/** One enqueue item as sent: `{type, args, id?, meta?, schema?, options}`. */
export interface WireItem {
  type: string;
  args: unknown[];
  id?: string;
  meta?: JsonObject;
  schema?: string;
  options: JsonObject;
  [field: string]: unknown;
}

export function wireRetry(policy: RetryPolicy): JsonObject {
  return compact({
    max_attempts: policy.maxAttempts,
    initial_interval: policy.initialInterval === undefined ? undefined : isoDuration(policy.initialInterval),
    backoff_coefficient: policy.backoffCoefficient,
    max_interval: policy.maxInterval === undefined ? undefined : isoDuration(policy.maxInterval),
    jitter: policy.jitter,
    non_retryable_errors: policy.nonRetryableErrors,
    on_exhaustion: policy.onExhaustion,
  });
}

export function wireUnique(policy: UniquePolicy): JsonObject {
  return compact({
    key: policy.key,
    period: policy.period === undefined ? undefined : isoDuration(policy.period),
    on_conflict: policy.onConflict,
    states: policy.states,
  });
}

export function wireRateLimit(limit: RateLimit): JsonObject {
  return compact({
    key: limit.key,
    concurrency: limit.concurrency,
    max_per_second: limit.maxPerSecond,
    rate: limit.rate,
    period: limit.period,
  });
}

function toMs(value: Timestamp): number {
  if (value instanceof Date) return value.getTime();
  if (typeof value === "number") return value;
  const ms = Date.parse(value);
  if (Number.isNaN(ms)) throw new TypeError(`invalid timestamp: ${value}`);
  return ms;
}

function durationMs(value: Duration, name: string): number {
  if (typeof value === "number") return value;
  const match = /^PT(?:(\d+(?:\.\d+)?)H)?(?:(\d+(?:\.\d+)?)M)?(?:(\d+(?:\.\d+)?)S)?$/.exec(value);
  if (!match || value === "PT") throw new TypeError(`${name}: give milliseconds, or an ISO 8601 duration of hours, minutes and seconds`);
  return (Number(match[1] ?? 0) * 3600 + Number(match[2] ?? 0) * 60 + Number(match[3] ?? 0)) * 1000;
}

/** The `options` object of an enqueue item. */
export function wireOptions(o: Omit<EnqueueOptions, "id" | "meta" | "schema" | "traceparent">): JsonObject {
  if (o.delay !== undefined && o.scheduledAt !== undefined) throw new TypeError("give either delay or scheduledAt, not both");
  if (o.ttl !== undefined && o.expiresAt !== undefined) throw new TypeError("give either ttl or expiresAt, not both");
  let scheduledAt: string | undefined;
  if (o.delay !== undefined) scheduledAt = `+${isoDuration(o.delay)}`;
  else if (o.scheduledAt !== undefined) scheduledAt = timestamp(o.scheduledAt);
  let expiresAt: string | undefined;
  if (o.expiresAt !== undefined) expiresAt = timestamp(o.expiresAt);
  else if (o.ttl !== undefined) {
    const ttl = durationMs(o.ttl, "ttl");
    if (o.scheduledAt !== undefined) expiresAt = new Date(toMs(o.scheduledAt) + ttl).toISOString();
    else expiresAt = `+${isoDuration((o.delay === undefined ? 0 : durationMs(o.delay, "delay")) + ttl)}`;
  }
  return compact({
    queue: o.queue,
    priority: o.priority,
    timeout_ms: o.timeout,
    visibility_timeout_ms: o.visibilityTimeout,
    scheduled_at: scheduledAt,
    expires_at: expiresAt,
    retry: o.retry === undefined ? undefined : wireRetry(o.retry),
    unique: o.unique === undefined ? undefined : wireUnique(o.unique),
    tags: o.tags,
    rate_limit: o.rateLimit === undefined ? undefined : wireRateLimit(o.rateLimit),
    pending: o.pending,
  });
}

/** A whole enqueue item. */
export function wireItem(type: string, args: unknown[] | undefined, o: EnqueueOptions): WireItem {
  if (typeof type !== "string" || type.length === 0) throw new TypeError("a job needs a type");
  if (args !== undefined && !Array.isArray(args)) throw new TypeError("args must be an array");
  let meta = o.meta === undefined ? undefined : { ...o.meta };
  if (o.traceparent !== undefined) meta = { ...(meta ?? {}), traceparent: o.traceparent };
  const item: WireItem = { type, args: args ?? [], options: wireOptions(o) };
  if (o.id !== undefined) item.id = o.id;
  if (meta !== undefined) item.meta = meta;
  if (o.schema !== undefined) item.schema = o.schema;
  return item;
}

export function wireWorkflowJob(job: WorkflowJob): WireItem {
  const { type, args, ...options } = job;
  return wireItem(type, args, options);
}

export function wireCron(entry: CronRegistration | CronPatch, name?: string): JsonObject {
  return compact({
    name,
    schedule: entry.schedule,
    type: entry.type,
    args: entry.args,
    timezone: entry.timezone,
    queue: entry.queue,
    meta: entry.meta,
    options: entry.options === undefined ? undefined : wireOptions(entry.options),
    overlap_policy: entry.overlapPolicy,
    enabled: entry.enabled,
    description: entry.description,
    schema: entry.schema,
  });
}

export function wireWebhook(body: WebhookPatch): JsonObject {
  return compact({
    url: body.url,
    events: body.events,
    secret: body.secret,
    metadata: body.metadata,
    filter:
      body.filter === undefined
        ? undefined
        : compact({ queues: body.filter.queues, job_types: body.filter.jobTypes }),
    active: body.active,
  });
}

/** The `fetch` of an ack (its worker is the ack's `worker_id`). */
export function wireAckFetch(fetch: AckFetch): JsonObject {
  if (!Array.isArray(fetch.queues) || fetch.queues.length === 0) throw new TypeError("an ack's fetch needs at least one queue");
  return compact({
    queues: fetch.queues,
    count: fetch.count ?? 1,
    wait_ms: fetch.waitMs !== undefined && fetch.waitMs > 0 ? fetch.waitMs : undefined,
    visibility_timeout_ms: fetch.visibilityTimeoutMs,
  });
}
