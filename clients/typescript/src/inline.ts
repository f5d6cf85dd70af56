/**
 * Inline mode: the same handlers and middleware, run in this process without
 * a server, for unit tests of the code that enqueues jobs and of the
 * handlers themselves.
 */
import type { Enqueuer } from "./client.js";
import {
  type Handler,
  type JobContext,
  type ProgressOptions,
  type WorkerMiddleware,
  failureOf,
  runChain,
  traceparentOf,
} from "./context.js";
import { JobError, JobTimeoutError } from "./errors.js";
import type {
  BatchItem,
  CallOptions,
  EnqueueOptions,
  FailureHistoryEntry,
  Job,
  JobProgress,
  JsonObject,
} from "./types.js";
import { newJobId } from "./util.js";
import { wireItem } from "./wire.js";

export interface InlineOptions {
  /**
   * `immediate` (default): `enqueue` runs the job, retries included, before
   * it resolves. `queued`: jobs wait until {@link InlineWorker.drain}.
   */
  mode?: "immediate" | "queued";
  /** The worker id handlers see (default `inline`). */
  workerId?: string;
}

/** A progress report an inline job made. */
export interface InlineProgress {
  progress: number;
  message?: string | undefined;
  data?: unknown;
}

/**
 * Runs handlers in process. Use it where the code under test takes an
 * {@link Enqueuer} (a {@link Client} in production):
 *
 * ```ts
 * const inline = new InlineWorker();
 * inline.handle<[string]>("email.send", async ([to]) => ({ sent: to }));
 * await signUp(inline, "ada@example.com"); // calls inline.enqueue(...)
 * assert.equal(inline.jobs[0].state, "completed");
 * ```
 *
 * Retries happen at once (no delays); a job's `timeout` aborts `ctx.signal`
 * as in a real worker. Jobs and their outcomes stay in {@link jobs}.
 */
export class InlineWorker implements Enqueuer {
  private readonly handlers = new Map<string, Handler>();
  private readonly middleware: WorkerMiddleware[] = [];
  private readonly mode: "immediate" | "queued";
  readonly workerId: string;
  /** Every job enqueued, in order, with its state, `result`, `error` and `errors`. */
  readonly jobs: Job[] = [];
  /** Progress reports by job id, oldest first. */
  readonly progressReports = new Map<string, InlineProgress[]>();

  constructor(options: InlineOptions = {}) {
    this.mode = options.mode ?? "immediate";
    this.workerId = options.workerId ?? "inline";
  }

  handle<Args extends unknown[] = unknown[], Result = unknown>(type: string, handler: Handler<Args, Result>): this {
    this.handlers.set(type, handler as unknown as Handler);
    return this;
  }

  use(middleware: WorkerMiddleware): this {
    this.middleware.push(middleware);
    return this;
  }

  /**
   * Runs one job's handler now, once, and answers its result; throws what
   * the handler threw (an unknown type throws a {@link JobError} of type
   * `unknown_job_type`). Nothing is recorded in {@link jobs}.
   */
  async perform<Result = unknown, Args extends unknown[] = unknown[]>(
    type: string,
    args: Args,
    options: EnqueueOptions & { attempt?: number } = {},
  ): Promise<Result> {
    const job = this.makeJob(type, args, options);
    job.state = "active";
    job.attempt = options.attempt ?? 1;
    return (await this.execute(job)) as Result;
  }

  /** Stores a job; in `immediate` mode also runs it (retries included) before answering. */
  async enqueue<Args extends unknown[] = unknown[]>(
    type: string,
    args?: Args,
    options: EnqueueOptions & CallOptions = {},
  ): Promise<Job<Args>> {
    const job = this.makeJob(type, args ?? [], options);
    this.jobs.push(job);
    if (this.mode === "immediate" && job.state === "available") await this.runToEnd(job);
    return job as Job<Args>;
  }

  async enqueueBatch(items: BatchItem[], options: CallOptions = {}): Promise<Job[]> {
    const jobs: Job[] = [];
    for (const { type, args, ...rest } of items) jobs.push(await this.enqueue(type, args ?? [], { ...rest, ...options }));
    return jobs;
  }

  /** Runs every waiting job (`available` or `scheduled`, ignoring their time) until none is left; answers those it ran. */
  async drain(): Promise<Job[]> {
    const ran: Job[] = [];
    for (;;) {
      const next = this.jobs.find((job) => job.state === "available" || job.state === "scheduled");
      if (next === undefined) return ran;
      await this.runToEnd(next);
      ran.push(next);
    }
  }

  /** Forgets every job. */
  clear(): void {
    this.jobs.length = 0;
    this.progressReports.clear();
  }

  /** The jobs of one type. */
  jobsOf(type: string): Job[] {
    return this.jobs.filter((job) => job.type === type);
  }

  private makeJob(type: string, args: unknown[], options: EnqueueOptions): Job {
    const item = wireItem(type, args, options);
    const o = item.options as JsonObject;
    const now = new Date().toISOString();
    const retry = (o["retry"] ?? {}) as JsonObject;
    const timeoutMs = (o["timeout_ms"] as number | undefined) ?? 30_000;
    const vtMs = (o["visibility_timeout_ms"] as number | undefined) ?? 30_000;
    const scheduled = o["scheduled_at"] !== undefined;
    return {
      specversion: "1.0",
      id: item.id ?? newJobId(),
      type,
      queue: (o["queue"] as string | undefined) ?? "default",
      args: item.args,
      meta: item.meta ?? {},
      state: o["pending"] === true ? "pending" : scheduled ? "scheduled" : "available",
      priority: (o["priority"] as number | undefined) ?? 0,
      attempt: 0,
      max_attempts: (retry["max_attempts"] as number | undefined) ?? 3,
      timeout: Math.ceil(timeoutMs / 1000),
      timeout_ms: timeoutMs,
      visibility_timeout: Math.ceil(vtMs / 1000),
      visibility_timeout_ms: vtMs,
      retry: {
        max_attempts: (retry["max_attempts"] as number | undefined) ?? 3,
        initial_interval: (retry["initial_interval"] as string | undefined) ?? "PT1S",
        backoff_coefficient: (retry["backoff_coefficient"] as number | undefined) ?? 2,
        max_interval: (retry["max_interval"] as string | undefined) ?? "PT5M",
        jitter: (retry["jitter"] as boolean | undefined) ?? true,
        non_retryable_errors: (retry["non_retryable_errors"] as string[] | undefined) ?? [],
        on_exhaustion: (retry["on_exhaustion"] as "discard" | "dead_letter" | undefined) ?? "discard",
      },
      tags: (o["tags"] as string[] | undefined) ?? [],
      created_at: now,
      ...(scheduled ? { scheduled_at: String(o["scheduled_at"]) } : {}),
    };
  }

  private async runToEnd(job: Job): Promise<void> {
    for (;;) {
      job.state = "active";
      job.attempt += 1;
      job.started_at = new Date().toISOString();
      job.worker_id = this.workerId;
      try {
        job.result = await this.execute(job);
        job.state = "completed";
        job.completed_at = new Date().toISOString();
        return;
      } catch (thrown) {
        const failure = failureOf(thrown);
        const report = { ...failure, code: failure.code ?? failure.type };
        job.error = report;
        const entry: FailureHistoryEntry = { ...report, attempt: job.attempt, occurred_at: new Date().toISOString() };
        job.errors = [...(job.errors ?? []), entry].slice(-20);
        const final =
          failure.retryable === false ||
          job.attempt >= Math.max(1, job.max_attempts) ||
          job.retry.non_retryable_errors.some((pattern) => matches(pattern, failure));
        if (final) {
          job.state = "discarded";
          job.discarded_at = new Date().toISOString();
          return;
        }
        job.state = "retryable";
      }
    }
  }

  private async execute(job: Job): Promise<unknown> {
    const handler = this.handlers.get(job.type);
    if (handler === undefined) {
      throw new JobError(`no handler for job type "${job.type}"`, { type: "unknown_job_type" });
    }
    const controller = new AbortController();
    const deadline = Date.now() + job.timeout_ms;
    const reports = this.progressReports;
    const ctx: JobContext = {
      jobId: job.id,
      type: job.type,
      queue: job.queue,
      attempt: job.attempt,
      deadline: new Date(deadline),
      signal: controller.signal,
      job,
      workerId: this.workerId,
      traceparent: traceparentOf(job),
      async progress(fraction: number, options: ProgressOptions = {}): Promise<JobProgress | undefined> {
        const progress = Math.min(1, Math.max(0, fraction));
        const list = reports.get(job.id) ?? [];
        list.push({ progress, message: options.message, data: options.data });
        reports.set(job.id, list);
        job.progress = progress;
        if (options.message !== undefined) job.progress_message = options.message;
        return undefined;
      },
      async extendLease(): Promise<void> {},
    };
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        const reason = new JobTimeoutError(job.timeout_ms);
        controller.abort(reason);
        reject(reason);
      }, job.timeout_ms);
    });
    try {
      return await Promise.race([runChain(this.middleware, handler, job.args, ctx), timedOut]);
    } finally {
      clearTimeout(timer);
    }
  }
}

function matches(pattern: string, failure: { type: string; code?: string | undefined; details?: JsonObject | undefined }): boolean {
  const names = [failure.type, failure.code, failure.details?.["error_class"]].filter(
    (name): name is string => typeof name === "string",
  );
  if (pattern.endsWith(".*")) {
    const prefix = pattern.slice(0, -1);
    return names.some((name) => name.startsWith(prefix));
  }
  return names.includes(pattern);
}
