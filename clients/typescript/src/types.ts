/**
 * Types of what the client sends and receives. Objects the server returns
 * (jobs, workflows, cron entries, ...) are typed as the server renders them,
 * with its snake_case field names; options the client takes are camelCase and
 * translated to the wire names.
 */

import type { RetryOptions } from "./http.js";

export type JobState =
  | "scheduled"
  | "available"
  | "pending"
  | "active"
  | "retryable"
  | "completed"
  | "discarded"
  | "cancelled";

/** A duration: milliseconds, or an ISO 8601 duration string (`PT5M`). */
export type Duration = number | string;

/** A point in time: a `Date`, epoch milliseconds, or an RFC 3339 string. */
export type Timestamp = Date | number | string;

export type JsonObject = Record<string, unknown>;

// ---------------------------------------------------------------- policies

/** The retry policy, merged by the server over its default one. */
export interface RetryPolicy {
  /** 0…1000; 0 and 1 both mean the first failure is final. Default 3. */
  maxAttempts?: number;
  /** Delay before the first retry. Default `PT1S`. */
  initialInterval?: Duration;
  /** 1.0…100.0, default 2.0. */
  backoffCoefficient?: number;
  /** Longest delay. Default `PT5M`. */
  maxInterval?: Duration;
  /** Multiply each delay by a random factor in [0.5, 1.5). Default true. */
  jitter?: boolean;
  /** Error types (or `prefix.*`) that end the job at once. */
  nonRetryableErrors?: string[];
  /** `discard` (kept 7 days) or `dead_letter` (kept 30 days). */
  onExhaustion?: "discard" | "dead_letter";
}

/** The policy as a job shows it. */
export interface RetryPolicyEffective {
  max_attempts: number;
  initial_interval: string;
  backoff_coefficient: number;
  max_interval: string;
  jitter: boolean;
  non_retryable_errors: string[];
  on_exhaustion: "discard" | "dead_letter";
}

export type UniqueState = "scheduled" | "available" | "pending" | "active" | "retryable";

/** Makes a job unique among the jobs svc holds (see docs/api.md, Unique jobs). */
export interface UniquePolicy {
  /** Property names (or decimal indexes) of `args` that make the identity; default the whole `args`. */
  key?: string[];
  /** Only jobs created less than this long ago conflict. */
  period?: Duration;
  /** `reject` (409, default), `ignore` (answer with the held job) or `replace` (cancel it). */
  onConflict?: "reject" | "ignore" | "replace";
  /** States of the held job that conflict; default all five live ones. */
  states?: UniqueState[];
}

export interface UniquePolicyEffective {
  key?: string[];
  period?: string;
  on_conflict: "reject" | "ignore" | "replace";
  states: UniqueState[];
}

/** Limits how many jobs sharing a key are handed out (see docs/api.md, Dispatch limits). */
export interface RateLimit {
  /** Default: the job's queue name. */
  key?: string;
  /** At most this many `active` jobs under the key. */
  concurrency?: number;
  /** Same as `rate: n, period: "second"`. */
  maxPerSecond?: number;
  /** Claims per sliding `period`. */
  rate?: number;
  period?: "second" | "minute" | "hour";
}

export interface RateLimitEffective {
  key?: string;
  concurrency?: number;
  max_per_second?: number;
  rate?: number;
  period?: string;
  on_limit: "wait";
}

// ---------------------------------------------------------------- enqueue

/** Options of one enqueue; each maps to a field of the wire body. */
export interface EnqueueOptions {
  /** Client-chosen id: a UUIDv7 (see {@link newJobId}). Makes the enqueue safe to retry. */
  id?: string;
  /** `options.queue`; default `default`. */
  queue?: string;
  /** `options.priority`, −100…100; higher is claimed first. */
  priority?: number;
  /** Run no earlier than this long from now (server clock): `options.scheduled_at` = `+<duration>`. */
  delay?: Duration;
  /** Run no earlier than this time: `options.scheduled_at`. */
  scheduledAt?: Timestamp;
  /** Discard the job if it has not started by then: `options.expires_at`. */
  expiresAt?: Timestamp;
  /**
   * Discard the job if it has not started this long after it became due:
   * `options.expires_at`, counted from `delay` (or now), or from a `Date`
   * given as `scheduledAt`.
   */
  ttl?: Duration;
  /** `options.retry`. */
  retry?: RetryPolicy;
  /** `options.unique`. */
  unique?: UniquePolicy;
  /** `options.tags`: at most 32 strings. */
  tags?: string[];
  /** Execution timeout in ms: `options.timeout_ms` (default 30 000). */
  timeout?: number;
  /** Visibility timeout in ms: `options.visibility_timeout_ms` (default 30 000). */
  visibilityTimeout?: number;
  /** The job's `meta` object. */
  meta?: JsonObject;
  /** A registered schema URI that `args` must match: `schema`. */
  schema?: string;
  /** `options.rate_limit`. */
  rateLimit?: RateLimit;
  /** `options.pending`: store the job staged, claimable once activated. */
  pending?: boolean;
  /** A W3C `traceparent` carried to the handler in `meta.traceparent`. */
  traceparent?: string;
}

/** Options every call takes. */
export interface CallOptions {
  /** Cancels the call (and its retries); the call rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Per-attempt timeout for this call, overriding the client's `timeoutMs`. */
  timeoutMs?: number;
  /** Retry options for this call, over the client's; `false`: a single attempt. */
  retry?: RetryOptions | false;
}

/** One item of {@link Client.enqueueBatch}. */
export interface BatchItem<Args extends unknown[] = unknown[]> extends EnqueueOptions {
  type: string;
  args?: Args;
}

// ---------------------------------------------------------------- job

export interface FailureReport {
  type: string;
  code: string;
  message: string;
  backtrace?: string[];
  retryable?: boolean;
  details?: JsonObject;
}

export interface FailureHistoryEntry extends FailureReport {
  attempt: number;
  occurred_at: string;
}

/** A job as every answer shows it. `Args` types its `args`. */
export interface Job<Args extends unknown[] = unknown[]> {
  specversion: "1.0";
  id: string;
  type: string;
  queue: string;
  args: Args;
  meta: JsonObject;
  state: JobState;
  priority: number;
  attempt: number;
  max_attempts: number;
  /** Seconds, rounded up. */
  timeout: number;
  timeout_ms: number;
  /** Seconds, rounded up. */
  visibility_timeout: number;
  visibility_timeout_ms: number;
  retry: RetryPolicyEffective;
  tags: string[];
  created_at: string;
  unique?: UniquePolicyEffective;
  unique_key?: string;
  rate_limit?: RateLimitEffective;
  scheduled_at?: string;
  expires_at?: string;
  enqueued_at?: string;
  activated_at?: string;
  started_at?: string;
  worker_id?: string;
  completed_at?: string;
  cancelled_at?: string;
  discarded_at?: string;
  retry_at?: string;
  retry_delay_ms?: number;
  result?: unknown;
  error?: FailureReport;
  errors?: FailureHistoryEntry[];
  workflow_id?: string;
  parent_results?: unknown[];
  parent_states?: Array<JobState | null>;
  previous_state?: JobState;
  /** True when a unique `ignore` policy answered with this held job instead of storing a new one. */
  deduplicated?: true;
  schema?: string;
  progress?: number;
  progress_message?: string;
  [field: string]: unknown;
}

/** `GET`/`PUT /jobs/{id}/progress`. */
export interface JobProgress {
  job_id: string;
  state: JobState;
  attempt: number;
  progress: number | null;
  message: string | null;
  data: unknown;
  updated_at: string | null;
}

/** A page of a listing. */
export interface Page {
  cursor: string | null;
  has_more: boolean;
}

export interface ListOptions extends CallOptions {
  /** Page size (default 25, at most 100). */
  limit?: number;
  /** The previous page's `cursor`. */
  cursor?: string;
}

// ---------------------------------------------------------------- workflows

/** A member or callback of a workflow: an enqueue item (args may be left out). */
export interface WorkflowJob<Args extends unknown[] = unknown[]> extends Omit<EnqueueOptions, "pending"> {
  type: string;
  args?: Args;
}

export interface WorkflowCallbacks {
  /** Fires once every job ended, whatever the outcome. */
  onComplete?: WorkflowJob;
  /** Fires when no job failed. */
  onSuccess?: WorkflowJob;
  /** Fires when a job failed. */
  onFailure?: WorkflowJob;
}

export interface WorkflowOptions extends CallOptions {
  /** The workflow's name (at most 255 characters). */
  name?: string;
  /** Defaults for every job of the workflow (a job's own settings win). */
  defaults?: Omit<EnqueueOptions, "id" | "pending" | "meta">;
  /** Every job's default `meta` (a job's own `meta` keys win). */
  meta?: JsonObject;
}

export type WorkflowType = "chain" | "group" | "batch";

export interface WorkflowMember {
  index: number;
  type: string;
  queue: string;
  job_id: string;
  state: JobState | null;
}

export interface WorkflowCallback {
  type: string;
  queue: string;
  job_id?: string;
  state?: JobState | null;
}

export interface Workflow {
  id: string;
  name: string | null;
  type: WorkflowType;
  state: "running" | "completed" | "failed" | "cancelled";
  steps_total: number;
  steps_completed: number;
  jobs_total: number;
  jobs_completed: number;
  jobs_failed: number;
  created_at: string;
  steps?: WorkflowMember[];
  jobs?: WorkflowMember[];
  callbacks?: { on_complete?: WorkflowCallback; on_success?: WorkflowCallback; on_failure?: WorkflowCallback };
  completed_at?: string;
  cancelled_at?: string;
  failure?: { index: number | null; job_id: string; error: JsonObject | null };
  [field: string]: unknown;
}

// ---------------------------------------------------------------- cron

export type OverlapPolicy = "skip" | "allow" | "cancel_previous" | "enqueue";

export interface CronRegistration {
  /** 1–255 characters: letters, digits, `.`, `_`, `-`. */
  name: string;
  /** Five-field cron expression or `@daily` and the like. */
  schedule: string;
  /** The job type of fired jobs. */
  type: string;
  args?: unknown[];
  /** `UTC` (default) or an `Area/Location` name. */
  timezone?: string;
  queue?: string;
  /** Added to each fired job's `meta`. */
  meta?: JsonObject;
  /** Enqueue options of fired jobs (no scheduling options). */
  options?: Omit<EnqueueOptions, "id" | "delay" | "scheduledAt" | "expiresAt" | "ttl" | "pending" | "meta" | "schema" | "traceparent">;
  overlapPolicy?: OverlapPolicy;
  enabled?: boolean;
  description?: string;
  schema?: string;
}

export type CronPatch = Partial<Omit<CronRegistration, "name">>;

export interface CronEntry {
  name: string;
  schedule: string;
  expression: string;
  timezone: string;
  type: string;
  args: unknown[];
  queue: string;
  meta: JsonObject;
  options: JsonObject;
  overlap_policy: OverlapPolicy;
  enabled: boolean;
  status: "active" | "disabled";
  run_count: number;
  created_at: string;
  updated_at: string;
  next_run_at?: string;
  last_run_at?: string;
  last_job_id?: string;
  description?: string;
  [field: string]: unknown;
}

// ---------------------------------------------------------------- queues

export interface QueueSummary {
  name: string;
  size: number;
  paused: boolean;
}

export interface QueueStats {
  queue: string;
  size: number;
  paused: boolean;
  states: Record<JobState, number>;
  throughput: { completed_last_minute: number; failed_last_minute: number };
}

// ---------------------------------------------------------------- workers

export type WorkerState = "running" | "quiet" | "terminate";

export interface WorkerInfo {
  worker_id: string;
  state: WorkerState;
  first_seen_at: string;
  last_seen_at: string;
  last_heartbeat_at?: string;
  active_job_ids: string[];
  stale: boolean;
}

export interface HeartbeatAnswer {
  state: WorkerState;
  jobs_extended: number;
  server_time: string;
}

export interface AckAnswer {
  job: Job;
  acknowledged: true;
  id: string;
  job_id: string;
  state: JobState;
  completed_at?: string;
  /** The jobs claimed by the ack's `fetch` (present when it had one). */
  jobs?: Job[];
}

/** The fetch an ack carries: the next jobs, claimed once the ack went through. */
export interface AckFetch {
  /** Queues to claim from, most important first (strict order). */
  queues: string[];
  /** How many jobs, 1…100 (default 1). */
  count?: number;
  /** Long-poll time after the ack committed, 0…20 000 ms (default 0). */
  waitMs?: number;
  visibilityTimeoutMs?: number;
}

/** One job of {@link Client.ackMany}. */
export interface AckItem {
  jobId: string;
  /** The job's result (any JSON); none when left out. */
  result?: unknown;
}

/** What became of one job of an `ackMany`, as svc renders it. */
export type AckOutcome =
  | { job_id: string; acknowledged: true; state: JobState; completed_at?: string }
  | {
      job_id: string;
      acknowledged: false;
      /** Why this job was refused: the body of the error it would have had alone. */
      error: { code: string; message: string; retryable: boolean; details: Record<string, unknown> };
    };

export interface AckManyAnswer {
  /** One per job sent, in order. */
  acks: AckOutcome[];
  /** The jobs claimed by the `fetch` (empty without one). */
  jobs: Job[];
}

export interface NackAnswer {
  job: Job;
  id: string;
  job_id: string;
  state: JobState;
  attempt: number;
  max_attempts: number;
  retry_at?: string;
  retry_delay_ms?: number;
  discarded_at?: string;
}

/** What a worker reports for a failure. */
export interface FailureInput {
  type: string;
  message: string;
  code?: string;
  retryable?: boolean;
  backtrace?: string[];
  details?: JsonObject;
}

// ---------------------------------------------------------------- webhooks

export interface WebhookFilter {
  queues?: string[];
  jobTypes?: string[];
}

export interface WebhookCreate {
  /** An absolute `https` URL. */
  url: string;
  /** Event types, `prefix.*` or `*`. */
  events: string[];
  /** 16–256 characters; never shown again. */
  secret: string;
  metadata?: JsonObject;
  filter?: WebhookFilter;
  active?: boolean;
}

export type WebhookPatch = Partial<WebhookCreate>;

export interface Subscription {
  id: string;
  url: string;
  events: string[];
  active: boolean;
  metadata: JsonObject;
  filter?: { queues?: string[]; job_types?: string[] };
  created_at: string;
  updated_at: string;
  secret_rotation?: { started_at: string; previous_expires_at: string };
}

export interface WebhookTestResult {
  success: boolean;
  status_code?: number;
  response_time_ms: number;
  delivery_id: string;
  event_id: string;
  error?: string;
  error_detail?: string;
}

// ---------------------------------------------------------------- events, schemas, probes

export interface SvcEvent {
  specversion: "1.0";
  id: string;
  type: string;
  source: string;
  time: string;
  subject?: string;
  datacontenttype: string;
  data: JsonObject;
}

export interface EventQuery extends ListOptions {
  types?: string[];
  queues?: string[];
  jobTypes?: string[];
  subject?: string;
  after?: string;
}

export interface SchemaInfo {
  uri: string;
  type?: string;
  version?: string | number;
  created_at: string;
  schema?: unknown;
}

export interface Health {
  status: "ok" | "unhealthy";
  version: string;
  uptime_seconds: number;
  backend: { type: string; status: string; latency_ms: number; error?: string };
}
