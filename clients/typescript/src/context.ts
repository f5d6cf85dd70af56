/** What handlers and worker middleware see; shared by {@link Worker} and {@link InlineWorker}. */
import { JobError, JobTimeoutError } from "./errors.js";
import type { FailureInput, Job, JobProgress } from "./types.js";
import { isTraceparent } from "./util.js";

export interface ProgressOptions {
  /** A short text (at most 4 KiB). */
  message?: string;
  /** Any JSON (at most 64 KiB). */
  data?: unknown;
}

/** The context a handler gets beside its `args`. */
export interface JobContext<Args extends unknown[] = unknown[]> {
  /** The job's id. */
  readonly jobId: string;
  /** The job's type. */
  readonly type: string;
  /** The queue it came from. */
  readonly queue: string;
  /** This attempt's number, from 1. */
  readonly attempt: number;
  /** When the job's execution timeout (`timeout_ms`) runs out; `ctx.signal` aborts then. */
  readonly deadline: Date;
  /**
   * Aborts when the job must stop: its timeout ran out (reason
   * {@link JobTimeoutError}), the worker shuts down or was told to terminate,
   * or the job was cancelled (reason {@link JobAbortedError}). Pass it on to
   * `fetch` and other cancellable calls.
   */
  readonly signal: AbortSignal;
  /** The whole job as the fetch answered it. */
  readonly job: Job<Args>;
  /** The worker's id. */
  readonly workerId: string;
  /** The W3C `traceparent` the producer put in `meta.traceparent`, if any. */
  readonly traceparent: string | undefined;
  /** Reports how far the job got (`PUT /jobs/{id}/progress`); `fraction` in 0…1. */
  progress(fraction: number, options?: ProgressOptions): Promise<JobProgress | undefined>;
  /** Extends the job's claim now (a heartbeat), beside the automatic ones. */
  extendLease(): Promise<void>;
}

/** A job handler: returns the job's `result` (any JSON, or nothing), or throws to fail it. */
export type Handler<Args extends unknown[] = unknown[], Result = unknown> = (
  args: Args,
  ctx: JobContext<Args>,
) => Promise<Result> | Result;

/**
 * Runs around every handler execution: call `next()` to run the handler (or
 * the next middleware) and return its result; throw to fail the job. Added
 * first runs outermost.
 */
export type WorkerMiddleware = (ctx: JobContext, next: () => Promise<unknown>) => Promise<unknown>;

/** Runs the middleware chain, then the handler. */
export function runChain(
  middleware: readonly WorkerMiddleware[],
  handler: Handler,
  args: unknown[],
  ctx: JobContext,
): Promise<unknown> {
  const dispatch = (index: number): Promise<unknown> => {
    const next = middleware[index];
    if (next === undefined) return Promise.resolve().then(() => handler(args, ctx));
    return Promise.resolve().then(() => next(ctx, () => dispatch(index + 1)));
  };
  return dispatch(0);
}

/** The `traceparent` in a job's meta, when well formed. */
export function traceparentOf(job: Job): string | undefined {
  const value = job.meta?.["traceparent"];
  return isTraceparent(value) ? value : undefined;
}

const MAX_FRAMES = 50;

/** Turns whatever a handler threw into a failure report: `{type, message, backtrace}`. */
export function failureOf(thrown: unknown): FailureInput {
  if (thrown instanceof JobTimeoutError) {
    return { type: "timeout", message: thrown.message, details: { limit_ms: thrown.limitMs } };
  }
  if (thrown instanceof Error) {
    const failure: FailureInput = {
      type: thrown instanceof JobError ? thrown.type : thrown.name || thrown.constructor?.name || "Error",
      message: thrown.message || String(thrown),
      backtrace: backtraceOf(thrown),
    };
    const code = (thrown as { code?: unknown }).code;
    if (typeof code === "string" && code.length > 0) failure.code = code;
    if (thrown instanceof JobError) {
      if (thrown.retryable !== undefined) failure.retryable = thrown.retryable;
      if (thrown.details !== undefined) failure.details = thrown.details;
    }
    return failure;
  }
  return { type: "Error", message: typeof thrown === "string" ? thrown : safeString(thrown) };
}

function safeString(value: unknown): string {
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

/** The frames of an error's stack, one a line, without the leading "Name: message". */
export function backtraceOf(error: Error): string[] {
  if (typeof error.stack !== "string") return [];
  return error.stack
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line.startsWith("at "))
    .slice(0, MAX_FRAMES);
}
