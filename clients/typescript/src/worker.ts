import { hostname } from "node:os";
import { Client, type ClientOptions } from "./client.js";
import {
  type Handler,
  type JobContext,
  type ProgressOptions,
  type WorkerMiddleware,
  failureOf,
  runChain,
  traceparentOf,
} from "./context.js";
import {
  AuthError,
  ConflictError,
  JobAbortedError,
  JobTimeoutError,
  NotFoundError,
  SvcError,
  ValidationError,
} from "./errors.js";
import { InlineWorker } from "./inline.js";
import type { AckManyAnswer, AckOutcome, FailureInput, HeartbeatAnswer, Job, JobProgress } from "./types.js";
import { anySignal, backoffDelay, sleep } from "./util.js";

/** Where the worker writes what happens to it. */
export interface Logger {
  debug(message: string, fields?: Record<string, unknown>): void;
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
}

/** Warnings and errors to standard error; the rest is dropped. */
export const consoleLogger: Logger = {
  debug: () => {},
  info: () => {},
  warn: (message, fields) => console.error(...line("warn", message, fields)),
  error: (message, fields) => console.error(...line("error", message, fields)),
};

function line(level: string, message: string, fields?: Record<string, unknown>): unknown[] {
  return fields === undefined ? [`svc-worker ${level}: ${message}`] : [`svc-worker ${level}: ${message}`, fields];
}

/** Sleeps `ms` unless one of the signals aborts first; never rejects, leaves no timer behind. */
async function pause(ms: number, ...signals: AbortSignal[]): Promise<void> {
  const { signal, dispose } = anySignal(signals);
  try {
    await sleep(ms, signal);
  } catch {
    // cut short
  } finally {
    dispose();
  }
}

/** A logger that drops everything. */
export const silentLogger: Logger = { debug: () => {}, info: () => {}, warn: () => {}, error: () => {} };

export interface WorkerOptions extends ClientOptions {
  /** Queues to take jobs from, most important first (strict order). Default `["default"]`. */
  queues?: string[];
  /** Jobs run at once (default 10). The worker fetches only as many jobs as it has free slots. */
  concurrency?: number;
  /** This worker's id (`A-Z a-z 0-9 . _ : @ -`); default `<host>-<pid>-<random>`. */
  workerId?: string;
  /** Visibility timeout asked for at each fetch and heartbeat; default: each job's own `visibility_timeout_ms`. */
  visibilityTimeoutMs?: number;
  /** Heartbeat period; default a third of the shortest visibility timeout of the jobs in hand. */
  heartbeatIntervalMs?: number;
  /** Long-poll time of a fetch, 1…20 000 ms (default 20 000): an idle worker sends one request per period. */
  pollWaitMs?: number;
  /** On shutdown, how long jobs in hand may run on before they are aborted and released (default 25 000). */
  shutdownGraceMs?: number;
  /** How long an aborted handler may take to return before its job is released anyway (default 2 000). */
  abortGraceMs?: number;
  /** While quiet and idle, how often to ask whether the signal was lifted (default 10 000). */
  quietPollMs?: number;
  /** Stop gracefully on these signals (default `SIGTERM` and `SIGINT`); `false` to leave signals alone. */
  handleSignals?: boolean | NodeJS.Signals[];
  /** Middleware around every execution (also added later with {@link Worker.use}). */
  workerMiddleware?: WorkerMiddleware[];
  /** Default: warnings and errors to standard error. */
  logger?: Logger;
  /** Backoff of the reconnect loop after failed fetches (defaults 200 ms doubling up to 5 000 ms). */
  reconnect?: { baseDelayMs?: number; maxDelayMs?: number };
  /** An existing client to use instead of making one from `url` and the client options. */
  client?: Client;
}

/** What the worker does now. */
export type WorkerStatus = "idle" | "running" | "quiet" | "draining" | "stopping" | "stopped";

type Outcome =
  | { kind: "ack"; result: unknown; bytes: number }
  | { kind: "fail"; failure: FailureInput }
  | { kind: "release"; failure: FailureInput }
  | { kind: "drop"; why: string };

/**
 * A running job's cancellation. Its `AbortSignal` is made only when the
 * handler asks for `ctx.signal`: most handlers never do, and an
 * `AbortController` with its listeners is a large share of what a no-op job
 * costs the worker.
 */
class Cancellation {
  private controller: AbortController | undefined;
  private reasonGiven: unknown;
  private isAborted = false;
  private listener: ((reason: unknown) => void) | undefined;

  /** Aborts with `reason` now, or at once when made after the abort. */
  get signal(): AbortSignal {
    if (this.controller === undefined) {
      this.controller = new AbortController();
      if (this.isAborted) this.controller.abort(this.reasonGiven);
    }
    return this.controller.signal;
  }

  get aborted(): boolean {
    return this.isAborted;
  }

  /** The first abort wins; later ones change nothing. */
  abort(reason: unknown): void {
    if (this.isAborted) return;
    this.isAborted = true;
    this.reasonGiven = reason;
    this.controller?.abort(reason);
    const listener = this.listener;
    this.listener = undefined;
    listener?.(reason);
  }

  /** Resolves with the reason once aborted (one waiter at a time). */
  whenAborted(): Promise<unknown> {
    if (this.isAborted) return Promise.resolve(this.reasonGiven);
    return new Promise((resolve) => (this.listener = resolve));
  }
}

interface Held {
  readonly job: Job;
  readonly cancellation: Cancellation;
  readonly vtMs: number;
  /** Local time the claim was last extended (conservatively: when the request left). */
  extendedAt: number;
  /** Local estimate of the claim's end. */
  leaseUntil: number;
  readonly deadline: number;
  done: Promise<void>;
  /** The handler is over; the job is being acked, nacked or released. */
  settling: boolean;
}

/** An ack waiting for, or riding in, a request of the ack pipeline. */
interface PendingAck {
  readonly held: Held;
  readonly result: unknown;
  readonly bytes: number;
  /** `done`: acked, or refused for good; otherwise the job is acked on its own from here. */
  readonly resolve: (fate: AckFate) => void;
}

type AckFate = { done: true } | { done: false; maybeApplied: boolean };

/** Jobs acked in one request at most (svc's limit). */
const MAX_ACKS = 100;
/** Result bytes in one ack request at most (svc takes bodies up to 2 MiB). */
const MAX_ACK_BATCH_BYTES = 1024 * 1024;
/** svc's limit for one result: larger ones are acked alone, to be refused (and failed) alone. */
const MAX_RESULT_BYTES = 1024 * 1024;
/** Ack requests under way at once; acks finishing meanwhile wait for the next one. */
const MAX_ACK_REQUESTS = 1;

class Notifier {
  private waiters: Array<() => void> = [];
  notify(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }
  /** Resolves at the next notify, or after `ms`. */
  wait(ms?: number): Promise<void> {
    return new Promise((resolve) => {
      let timer: NodeJS.Timeout | undefined;
      const wake = (): void => {
        if (timer !== undefined) clearTimeout(timer);
        resolve();
      };
      this.waiters.push(wake);
      if (ms !== undefined) {
        timer = setTimeout(() => {
          this.waiters = this.waiters.filter((w) => w !== wake);
          resolve();
        }, Math.max(0, ms));
      }
    });
  }
}

function defaultWorkerId(): string {
  const host = hostname().replace(/[^A-Za-z0-9._:@-]/g, "-").slice(0, 200) || "worker";
  return `${host}-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
}

/**
 * Fetches jobs from svc and runs their handlers: long-polls for work, runs
 * up to `concurrency` jobs at once, acks results (several to a request,
 * each request claiming the next jobs for the slots it frees) and nacks
 * failures, sends heartbeats and obeys their answer, enforces each job's
 * timeout, and on SIGTERM/SIGINT stops taking work and lets the jobs in hand
 * finish.
 */
export class Worker {
  readonly client: Client;
  readonly workerId: string;
  readonly queues: readonly string[];
  readonly concurrency: number;
  private readonly options: WorkerOptions;
  private readonly handlers = new Map<string, Handler>();
  private readonly middleware: WorkerMiddleware[];
  private readonly logger: Logger;

  private status: WorkerStatus = "idle";
  private readonly held = new Set<Held>();
  private readonly latest = new Map<string, Held>();
  private readonly slotFreed = new Notifier();
  private readonly stateChanged = new Notifier();
  private readonly heartbeatWake = new Notifier();
  private fetchAbort: AbortController | undefined;
  private readonly force = new AbortController();
  /** Aborts once the worker has stopped: ends heartbeats and probes still under way. */
  private readonly final = new AbortController();
  /** Aborts when the shutdown begins. */
  private readonly stopSignal = new AbortController();
  private stopPromise: Promise<void> | undefined;
  private stopResolve!: () => void;
  private readonly stopped: Promise<void>;
  private fatal: unknown;
  private quiet = false;
  private heartbeatInFlight: Promise<HeartbeatAnswer | undefined> | undefined;
  private checkingClaims = false;
  private heartbeatFailures = 0;
  private signalCleanup: (() => void) | undefined;
  /** Acks waiting for the next request of the pipeline. */
  private ackQueue: PendingAck[] = [];
  /** Acks in requests under way (their first attempt). */
  private acksInFlight = 0;
  private ackRequests = 0;
  private ackFlushScheduled = false;
  /** Jobs asked for by claims under way: the long poll's, and those riding on acks. */
  private reserved = 0;

  constructor(url: string, options: WorkerOptions = {}) {
    this.options = options;
    this.client = options.client ?? new Client(url, options);
    this.workerId = options.workerId ?? defaultWorkerId();
    this.queues = [...(options.queues ?? ["default"])];
    if (this.queues.length === 0) throw new TypeError("a worker needs at least one queue");
    this.concurrency = Math.max(1, Math.floor(options.concurrency ?? 10));
    this.middleware = [...(options.workerMiddleware ?? [])];
    this.logger = options.logger ?? consoleLogger;
    this.stopped = new Promise((resolve) => (this.stopResolve = resolve));
  }

  /** An in-process runner of the same handlers, without a server, for tests (see {@link InlineWorker}). */
  static inline(): InlineWorker {
    return new InlineWorker();
  }

  /** Registers the handler of a job type. `Args` types the job's `args` array. */
  handle<Args extends unknown[] = unknown[], Result = unknown>(type: string, handler: Handler<Args, Result>): this {
    this.handlers.set(type, handler as unknown as Handler);
    return this;
  }

  /** Adds middleware around every execution (outermost first). */
  use(middleware: WorkerMiddleware): this {
    this.middleware.push(middleware);
    return this;
  }

  /** What the worker does now. */
  get state(): WorkerStatus {
    return this.status === "running" && this.quiet ? "quiet" : this.status;
  }

  /** Jobs in hand: running, or being acked or released. */
  get activeJobIds(): string[] {
    return [...new Set([...this.held].map((h) => h.job.id))];
  }

  /**
   * Runs until the worker stops: after {@link stop}, a signal (SIGTERM,
   * SIGINT), a `terminate` from svc, or the abort of `signal`. Resolves once every job in hand was
   * acked or released; rejects if the worker cannot work at all (a wrong key,
   * a malformed queue name).
   */
  async run(options: { signal?: AbortSignal } = {}): Promise<void> {
    if (this.status !== "idle") throw new Error("this worker already ran");
    this.status = "running";
    this.installSignals();
    // Aborting `signal` stops the worker like stop() does.
    const onAbort = (): void => void this.stop();
    if (options.signal?.aborted) onAbort();
    else options.signal?.addEventListener("abort", onAbort, { once: true });
    const loops = Promise.all([this.fetchLoop(), this.heartbeatLoop()]);
    await this.stopped;
    options.signal?.removeEventListener("abort", onAbort);
    await loops;
    this.signalCleanup?.();
    this.status = "stopped";
    if (this.fatal !== undefined) throw this.fatal;
  }

  /**
   * Stops taking work, lets the jobs in hand finish within `graceMs`
   * (default `shutdownGraceMs`), then aborts and releases what remains
   * (nack with `requeue: true`). Resolves once stopped. Calling it again
   * while stopping with a shorter grace shortens it.
   */
  stop(options: { graceMs?: number } = {}): Promise<void> {
    const grace = options.graceMs ?? this.options.shutdownGraceMs ?? 25_000;
    if (this.stopPromise !== undefined) {
      if (grace <= 0) this.force.abort();
      return this.stopPromise.then(() => this.stopped);
    }
    if (this.status === "idle") {
      this.status = "stopped";
      this.stopResolve();
      return Promise.resolve();
    }
    this.stopPromise = this.shutdown(grace);
    return this.stopPromise;
  }

  // ------------------------------------------------------------ signals

  private installSignals(): void {
    const option = this.options.handleSignals ?? true;
    if (option === false) return;
    const signals: NodeJS.Signals[] = option === true ? ["SIGTERM", "SIGINT"] : option;
    let count = 0;
    const onSignal = (signal: NodeJS.Signals): void => {
      count++;
      if (count === 1) {
        this.logger.info(`${signal}: stopping; jobs in hand may finish`, { jobs: this.held.size });
        void this.stop();
      } else {
        this.logger.warn(`${signal} again: releasing the jobs in hand now`, { jobs: this.held.size });
        void this.stop({ graceMs: 0 });
      }
    };
    for (const signal of signals) process.on(signal, onSignal);
    this.signalCleanup = () => {
      for (const signal of signals) process.off(signal, onSignal);
      this.signalCleanup = undefined;
    };
  }

  // ------------------------------------------------------------ shutdown

  private async shutdown(graceMs: number): Promise<void> {
    this.status = "stopping";
    this.stopSignal.abort();
    this.fetchAbort?.abort();
    this.stateChanged.notify();
    this.slotFreed.notify();
    if (this.held.size > 0) {
      const all = Promise.all([...this.held].map((h) => h.done));
      const over = new AbortController();
      await Promise.race([all, pause(graceMs, this.force.signal, over.signal)]);
      over.abort();
      if (this.held.size > 0) {
        this.logger.warn("grace period over: aborting and releasing the jobs in hand", { jobs: this.activeJobIds });
        for (const held of this.held) held.cancellation.abort(new JobAbortedError("shutdown", "the worker is shutting down"));
      }
    }
    while (this.held.size > 0) await Promise.all([...this.held].map((h) => h.done));
    this.final.abort();
    this.heartbeatWake.notify();
    this.stateChanged.notify();
    this.stopResolve();
  }

  private get stopping(): boolean {
    return this.status === "stopping" || this.status === "stopped";
  }

  // ------------------------------------------------------------ fetching

  private async fetchLoop(): Promise<void> {
    const waitMs = Math.min(20_000, Math.max(1, this.options.pollWaitMs ?? 20_000));
    const base = this.options.reconnect?.baseDelayMs ?? 200;
    const max = this.options.reconnect?.maxDelayMs ?? 5_000;
    let failures = 0;
    let deferred = false;
    while (!this.stopping) {
      if (this.quiet || this.status === "draining") {
        await this.stateChanged.wait();
        continue;
      }
      if (this.held.size > 0 && !deferred) {
        // Let acks finishing in this turn join the pipeline first: their
        // requests claim the next jobs, so a fetch of its own is not needed.
        await new Promise<void>((resolve) => setImmediate(resolve));
        deferred = true;
        continue;
      }
      deferred = false;
      if (this.ackQueue.length > 0 || this.ackRequests > 0) {
        await this.slotFreed.wait();
        continue;
      }
      const free = Math.min(100, this.freeSlots());
      if (free <= 0) {
        await this.slotFreed.wait();
        continue;
      }
      const controller = new AbortController();
      this.fetchAbort = controller;
      const sentAt = Date.now();
      let jobs: Job[];
      this.reserved += free;
      try {
        jobs = await this.client.claim({
          queues: [...this.queues],
          count: free,
          workerId: this.workerId,
          ...(this.options.visibilityTimeoutMs === undefined ? {} : { visibilityTimeoutMs: this.options.visibilityTimeoutMs }),
          waitMs,
          signal: controller.signal,
          retry: false,
        });
      } catch (error) {
        if (controller.signal.aborted) continue;
        if (error instanceof AuthError || error instanceof ValidationError || error instanceof NotFoundError) {
          this.logger.error(`fetch refused: ${(error as Error).message}`, { code: error.code });
          this.fatal = error;
          void this.stop({ graceMs: this.options.shutdownGraceMs ?? 25_000 });
          return;
        }
        failures++;
        const delay = backoffDelay(failures - 1, base, max);
        this.logger.warn(`fetch failed (${(error as Error).message}); trying again in ${Math.round(delay)} ms`, {
          failures,
        });
        await this.waitUnlessStopping(delay);
        continue;
      } finally {
        this.fetchAbort = undefined;
        this.reserved -= free;
      }
      if (failures > 0) this.logger.info("fetch works again", { failures });
      failures = 0;
      for (const job of jobs) this.start(job, sentAt);
      if (jobs.length === 0 && Date.now() - sentAt < waitMs - 1_000 && !this.stopping) {
        // A long poll answered early with nothing: the worker was told to go
        // quiet or terminate, or the server drains. The heartbeat says which.
        const answer = await this.heartbeat();
        if (answer === undefined || answer.state === "running") await this.waitUnlessStopping(1_000);
      }
    }
  }

  private async waitUnlessStopping(ms: number): Promise<void> {
    if (this.stopping || ms <= 0) return;
    await this.stateChanged.wait(ms);
  }

  // ------------------------------------------------------------ running a job

  private start(job: Job, sentAt: number): void {
    const vtMs = this.options.visibilityTimeoutMs ?? job.visibility_timeout_ms ?? 30_000;
    const now = Date.now();
    const held: Held = {
      job,
      cancellation: new Cancellation(),
      vtMs,
      extendedAt: sentAt,
      leaseUntil: sentAt + vtMs,
      deadline: now + (job.timeout_ms ?? 30_000),
      done: Promise.resolve(),
      settling: false,
    };
    const previous = this.latest.get(job.id);
    this.latest.set(job.id, held);
    this.held.add(held);
    held.done = this.process(held, previous?.done)
      .catch((error) => this.logger.error(`job ${job.id}: ${(error as Error).message}`))
      .finally(() => {
        this.held.delete(held);
        if (this.latest.get(job.id) === held) this.latest.delete(job.id);
        this.slotFreed.notify();
        this.heartbeatWake.notify();
      });
    this.heartbeatWake.notify();
  }

  private async process(held: Held, previous: Promise<void> | undefined): Promise<void> {
    const { job } = held;
    if (previous !== undefined) {
      // An earlier claim of the same job is still being settled here: run
      // this one only once that is over and svc confirms the claim is ours.
      await previous;
      const current = await this.client.get(job.id).catch(() => undefined);
      if (current === undefined || current.state !== "active" || current.worker_id !== this.workerId) {
        this.logger.warn(`job ${job.id}: claim no longer held after an earlier settle; not run`);
        return;
      }
    }
    if (this.stopping || this.status === "draining") {
      // Claimed by a request under way when the worker began to stop (or was
      // told to terminate): give it back untouched.
      const why = this.stopping ? "shutdown" : "terminate";
      await this.settle(held, { kind: "release", failure: this.releaseFailure(why) });
      return;
    }
    const handler = this.handlers.get(job.type);
    if (handler === undefined) {
      const known = [...this.handlers.keys()].sort().join(", ") || "none";
      this.logger.warn(`job ${job.id}: no handler for type ${job.type}`);
      await this.settle(held, {
        kind: "fail",
        failure: {
          type: "unknown_job_type",
          message: `worker ${this.workerId} has no handler for job type "${job.type}" (it handles: ${known})`,
          details: { job_type: job.type, worker_id: this.workerId },
        },
      });
      return;
    }
    const outcome = await this.execute(held, handler);
    await this.settle(held, outcome);
  }

  private context(held: Held): JobContext {
    const { job } = held;
    const worker = this;
    return {
      jobId: job.id,
      type: job.type,
      queue: job.queue,
      attempt: job.attempt,
      deadline: new Date(held.deadline),
      get signal(): AbortSignal {
        return held.cancellation.signal;
      },
      job,
      workerId: this.workerId,
      traceparent: traceparentOf(job),
      async progress(fraction: number, options: ProgressOptions = {}): Promise<JobProgress | undefined> {
        return worker.client.reportProgress(job.id, fraction, {
          ...options,
          workerId: worker.workerId,
          signal: held.cancellation.signal,
        });
      },
      async extendLease(): Promise<void> {
        const answer = await worker.heartbeat();
        if (answer === undefined) throw new Error("the heartbeat failed; the lease was not extended");
      },
    };
  }

  private async execute(held: Held, handler: Handler): Promise<Outcome> {
    const { job, cancellation } = held;
    const timer = setTimeout(
      () => cancellation.abort(new JobTimeoutError(job.timeout_ms)),
      Math.max(0, held.deadline - Date.now()),
    );
    const run = runChain(this.middleware, handler, job.args, this.context(held)).then(
      (result): Outcome => {
        let text: string | undefined;
        try {
          text = JSON.stringify(result);
        } catch (error) {
          return {
            kind: "fail",
            failure: { type: "invalid_result", message: `the handler's result is not JSON: ${(error as Error).message}` },
          };
        }
        return { kind: "ack", result, bytes: text === undefined ? 0 : Buffer.byteLength(text) };
      },
      (error: unknown): Outcome => ({ kind: "fail", failure: failureOf(error) }),
    );
    try {
      const first = await Promise.race([
        run,
        cancellation.whenAborted().then((reason) => ({ kind: "aborted" as const, reason })),
      ]);
      if (first.kind !== "aborted") return first;
      const reason = first.reason;
      if (reason instanceof JobTimeoutError) {
        this.logger.warn(`job ${job.id} (${job.type}) ran past its timeout of ${job.timeout_ms} ms`);
        return { kind: "fail", failure: failureOf(reason) };
      }
      if (reason instanceof JobAbortedError && (reason.why === "cancelled" || reason.why === "lease_lost")) {
        return { kind: "drop", why: reason.why };
      }
      // Shutdown or terminate: give the handler a moment to stop, keep what
      // it finished, release the rest.
      const grace = this.options.abortGraceMs ?? 2_000;
      const over = new AbortController();
      const late = await Promise.race([run, pause(grace, over.signal).then(() => undefined)]);
      over.abort();
      if (late?.kind === "ack") return late;
      const why = reason instanceof JobAbortedError ? reason.why : "shutdown";
      return { kind: "release", failure: this.releaseFailure(why === "terminate" ? "terminate" : "shutdown") };
    } finally {
      clearTimeout(timer);
    }
  }

  private releaseFailure(why: "shutdown" | "terminate"): FailureInput {
    return why === "terminate"
      ? { type: "worker_terminated", message: `released by worker ${this.workerId}: told to terminate` }
      : { type: "worker_shutdown", message: `released by worker ${this.workerId}: shutting down` };
  }

  /**
   * Acks or nacks a job, trying again through failures until its claim runs
   * out. A nack whose earlier attempt may have been applied is sent again
   * only while svc still shows this very claim.
   */
  private async settle(held: Held, outcome: Outcome): Promise<void> {
    const { job } = held;
    held.settling = true;
    if (outcome.kind === "drop") {
      this.logger.info(`job ${job.id}: ${outcome.why}; its result is dropped`);
      return;
    }
    const base = this.options.reconnect?.baseDelayMs ?? 200;
    const max = this.options.reconnect?.maxDelayMs ?? 5_000;
    let maybeApplied = false;
    if (outcome.kind === "ack" && outcome.bytes <= MAX_RESULT_BYTES) {
      // First through the pipeline, with other acks and the next fetch;
      // what did not go through there is acked alone below.
      const fate = await this.pipelineAck(held, outcome.result, outcome.bytes);
      if (fate.done) return;
      maybeApplied = fate.maybeApplied;
    }
    for (let attempt = 0; ; attempt++) {
      try {
        if (outcome.kind === "ack") {
          await this.client.ack(job.id, outcome.result === undefined ? undefined : outcome.result, {
            workerId: this.workerId,
          });
        } else {
          if (maybeApplied && !(await this.stillHeld(held))) return;
          await this.client.nack(job.id, outcome.failure, {
            workerId: this.workerId,
            requeue: outcome.kind === "release",
          });
        }
        return;
      } catch (error) {
        if (error instanceof ConflictError || error instanceof NotFoundError) {
          if (outcome.kind === "ack" && maybeApplied && error instanceof ConflictError && error.currentState === "completed") {
            this.logger.debug(`job ${job.id}: acked by an earlier attempt whose answer was lost`);
            return;
          }
          if (!(maybeApplied && outcome.kind !== "ack")) {
            this.logger.warn(`job ${job.id}: ${outcome.kind === "ack" ? "ack" : "nack"} refused: ${error.message}`, {
              code: error.code,
            });
          }
          return;
        }
        if (outcome.kind === "ack" && error instanceof ValidationError) {
          // The result was refused (over 1 MiB, say): fail the job rather
          // than leave it active until its claim runs out.
          this.logger.error(`job ${job.id}: ack refused: ${error.message}`, { code: error.code });
          outcome = { kind: "fail", failure: { type: "invalid_result", message: `svc refused the result: ${error.message}` } };
          continue;
        }
        if (!(error instanceof SvcError) || !error.retryable) {
          this.logger.error(`job ${job.id}: ${outcome.kind} failed: ${(error as Error).message}`, {
            code: error instanceof SvcError ? error.code : undefined,
          });
          return;
        }
        if (error instanceof SvcError && error.maybeApplied) maybeApplied = true;
        if (Date.now() >= held.leaseUntil) {
          this.logger.error(`job ${job.id}: its claim ran out before the ${outcome.kind} got through`, {
            error: (error as Error).message,
          });
          return;
        }
        const delay = Math.min(backoffDelay(attempt, base, max), Math.max(50, held.leaseUntil - Date.now()));
        this.logger.warn(`job ${job.id}: ${outcome.kind} failed (${(error as Error).message}); trying again`, {
          attempt: attempt + 1,
        });
        await sleep(delay);
      }
    }
  }

  // ------------------------------------------------------------ the ack pipeline

  /** Slots neither running, nor settling outside the pipeline, nor asked for by a claim under way. */
  private freeSlots(): number {
    return this.concurrency - this.held.size + this.ackQueue.length + this.acksInFlight - this.reserved;
  }

  /** Whether the acks sent now should claim the next jobs. */
  private get fetchesWithAcks(): boolean {
    return this.status === "running" && !this.quiet;
  }

  /**
   * Queues an ack for the pipeline. Acks are sent together, with a fetch of
   * as many jobs as slots are then free: at once when no ack request is
   * under way (after the current turn of the event loop, so that handlers
   * finishing together share a request), else as soon as it is answered.
   */
  private pipelineAck(held: Held, result: unknown, bytes: number): Promise<AckFate> {
    return new Promise((resolve) => {
      this.ackQueue.push({ held, result, bytes, resolve });
      this.scheduleAcks();
    });
  }

  private scheduleAcks(): void {
    if (this.ackFlushScheduled || this.ackQueue.length === 0 || this.ackRequests >= MAX_ACK_REQUESTS) return;
    this.ackFlushScheduled = true;
    setImmediate(() => {
      this.ackFlushScheduled = false;
      while (this.ackQueue.length > 0 && this.ackRequests < MAX_ACK_REQUESTS) void this.sendAcks(this.takeAckBatch());
    });
  }

  private takeAckBatch(): PendingAck[] {
    let bytes = 0;
    let count = 0;
    while (count < this.ackQueue.length && count < MAX_ACKS) {
      const next = this.ackQueue[count]!;
      if (count > 0 && bytes + next.bytes > MAX_ACK_BATCH_BYTES) break;
      bytes += next.bytes;
      count++;
    }
    return this.ackQueue.splice(0, count);
  }

  /** One request of the pipeline: the acks of `batch`, and the next jobs for the slots free. */
  private async sendAcks(batch: PendingAck[]): Promise<void> {
    this.ackRequests++;
    this.acksInFlight += batch.length;
    const count = this.fetchesWithAcks ? Math.max(0, Math.min(100, this.freeSlots())) : 0;
    this.reserved += count;
    const sentAt = Date.now();
    let answer: AckManyAnswer | undefined;
    let failure: unknown;
    try {
      answer = await this.client.ackMany(
        batch.map(({ held, result }) => (result === undefined ? { jobId: held.job.id } : { jobId: held.job.id, result })),
        {
          workerId: this.workerId,
          ...(count === 0
            ? {}
            : {
                fetch: {
                  queues: [...this.queues],
                  count,
                  ...(this.options.visibilityTimeoutMs === undefined
                    ? {}
                    : { visibilityTimeoutMs: this.options.visibilityTimeoutMs }),
                },
              }),
        },
      );
    } catch (error) {
      failure = error;
    } finally {
      this.reserved -= count;
      this.acksInFlight -= batch.length;
      this.ackRequests--;
    }
    if (answer !== undefined) {
      for (const job of answer.jobs) this.start(job, sentAt);
      batch.forEach((entry, index) => entry.resolve(this.ackFate(entry, answer!.acks[index])));
    } else {
      const maybeApplied = failure instanceof SvcError && failure.maybeApplied;
      this.logger.warn(`ack of ${batch.length} job(s) failed (${(failure as Error).message}); acking each on its own`, {
        code: failure instanceof SvcError ? failure.code : undefined,
      });
      for (const entry of batch) entry.resolve({ done: false, maybeApplied });
    }
    this.scheduleAcks();
    // With the pipeline idle, the fetch loop takes over free slots (a
    // short answer: the queues ran dry, so it long-polls).
    this.slotFreed.notify();
  }

  private ackFate(entry: PendingAck, outcome: AckOutcome | undefined): AckFate {
    const id = entry.held.job.id;
    if (outcome === undefined || outcome.job_id !== id) {
      this.logger.warn(`job ${id}: no outcome for its ack in svc's answer; acking it on its own`);
      return { done: false, maybeApplied: true };
    }
    if (outcome.acknowledged) return { done: true };
    const { code, message } = outcome.error;
    if (code === "not_found" || code === "conflict") {
      // The claim is no longer ours (it ran out, or the job was cancelled).
      this.logger.warn(`job ${id}: ack refused: ${message}`, { code });
      return { done: true };
    }
    return { done: false, maybeApplied: false };
  }

  /** Whether svc still shows this claim as ours (before a nack is sent again). */
  private async stillHeld(held: Held): Promise<boolean> {
    for (;;) {
      try {
        const job = await this.client.get(held.job.id);
        return (
          job.state === "active" && job.worker_id === this.workerId && job.started_at === held.job.started_at
        );
      } catch (error) {
        if (error instanceof NotFoundError) return false;
        if (Date.now() >= held.leaseUntil) return false;
        await sleep(500);
      }
    }
  }

  // ------------------------------------------------------------ heartbeats

  private heartbeatDue(): number | undefined {
    if (this.held.size === 0) return undefined;
    let due = Infinity;
    for (const held of this.held) {
      const interval = this.options.heartbeatIntervalMs ?? Math.max(100, held.vtMs / 3);
      due = Math.min(due, held.extendedAt + interval);
    }
    return due;
  }

  private async heartbeatLoop(): Promise<void> {
    while (!(this.stopping && this.held.size === 0)) {
      const due = this.heartbeatDue();
      if (due === undefined) {
        if (this.quiet && !this.stopping) {
          await this.heartbeatWake.wait(this.options.quietPollMs ?? 10_000);
          if (this.held.size === 0 && this.quiet && !this.stopping) await this.heartbeat();
        } else {
          await this.heartbeatWake.wait();
        }
        continue;
      }
      const now = Date.now();
      if (now < due) {
        await this.heartbeatWake.wait(due - now);
        continue;
      }
      const answer = await this.heartbeat();
      if (answer === undefined && !this.final.signal.aborted) {
        // svc unreachable: try again soon, backing off, without spinning.
        await pause(Math.min(2_000, 125 * 2 ** Math.min(this.heartbeatFailures, 4)), this.final.signal);
      }
    }
  }

  /** Sends one heartbeat for the jobs in hand and acts on its answer. Concurrent callers share it. */
  private heartbeat(): Promise<HeartbeatAnswer | undefined> {
    if (this.heartbeatInFlight !== undefined) return this.heartbeatInFlight;
    const attempt = this.sendHeartbeat().finally(() => (this.heartbeatInFlight = undefined));
    this.heartbeatInFlight = attempt;
    return attempt;
  }

  private async sendHeartbeat(): Promise<HeartbeatAnswer | undefined> {
    const listed = [...this.held];
    const ids = [...new Set(listed.map((h) => h.job.id))];
    const sentAt = Date.now();
    let answer: HeartbeatAnswer;
    try {
      answer = await this.client.heartbeat(this.workerId, ids, {
        ...(this.options.visibilityTimeoutMs === undefined ? {} : { visibilityTimeoutMs: this.options.visibilityTimeoutMs }),
        retry: false,
        timeoutMs: 10_000,
        signal: this.final.signal,
      });
    } catch (error) {
      this.heartbeatFailures++;
      const log = this.heartbeatFailures === 1 ? this.logger.warn : this.logger.debug;
      log.call(this.logger, `heartbeat failed: ${(error as Error).message}`, { failures: this.heartbeatFailures });
      return undefined;
    }
    if (this.heartbeatFailures > 0) this.logger.info("heartbeats work again", { failures: this.heartbeatFailures });
    this.heartbeatFailures = 0;
    for (const held of listed) {
      held.extendedAt = sentAt;
      held.leaseUntil = Math.max(held.leaseUntil, sentAt + held.vtMs);
    }
    if (answer.jobs_extended < ids.length) void this.checkClaims(listed);
    this.obey(answer.state);
    return answer;
  }

  /** Some claims were not extended: find which, and abort their handlers. */
  private async checkClaims(listed: Held[]): Promise<void> {
    if (this.checkingClaims) return;
    this.checkingClaims = true;
    try {
      for (const held of listed) {
        // A job whose handler is over may be completed by an ack under way.
        if (!this.held.has(held) || held.settling || held.cancellation.aborted) continue;
        const job = await this.client.get(held.job.id).catch((error: unknown) =>
          error instanceof NotFoundError ? null : undefined,
        );
        if (job === undefined) continue;
        if (job === null || job.state !== "active" || job.worker_id !== this.workerId) {
          const why = job?.state === "cancelled" ? "cancelled" : "lease_lost";
          this.logger.warn(`job ${held.job.id}: no longer held (${job?.state ?? "gone"}); aborting its handler`);
          held.cancellation.abort(new JobAbortedError(why));
        }
      }
    } finally {
      this.checkingClaims = false;
    }
  }

  private obey(state: HeartbeatAnswer["state"]): void {
    if (state === "running") {
      if (this.quiet) {
        this.logger.info("signal lifted: fetching again");
        this.quiet = false;
        this.stateChanged.notify();
      }
      return;
    }
    if (state === "quiet") {
      if (!this.quiet) {
        this.logger.info("told to go quiet: finishing the jobs in hand, taking nothing new");
        this.quiet = true;
        this.fetchAbort?.abort();
        this.stateChanged.notify();
        this.heartbeatWake.notify();
      }
      return;
    }
    if (this.status === "draining" || this.stopping) return;
    void this.onTerminate();
  }

  private async onTerminate(): Promise<void> {
    this.status = "draining";
    this.fetchAbort?.abort();
    this.stateChanged.notify();
    const jobs = [...this.held];
    if (jobs.length > 0) this.logger.warn("told to terminate: aborting and releasing the jobs in hand", { jobs: jobs.length });
    for (const held of jobs) held.cancellation.abort(new JobAbortedError("terminate", "the worker was told to terminate"));
    await Promise.all(jobs.map((h) => h.done));
    if (this.stopping) return;
    // svc says terminate to every worker while it drains for a restart: then
    // wait for it to come back instead of stopping for good.
    if (await this.serverDraining()) {
      this.logger.info("svc is shutting down; waiting for it to come back");
      await this.waitForServer();
      if (this.stopping) return;
      const answer = await this.heartbeat();
      if (this.status === "draining" && (answer === undefined || answer.state !== "terminate")) {
        this.status = "running";
        this.stateChanged.notify();
        return;
      }
      if (this.status !== "draining") return;
    }
    this.logger.info("told to terminate: stopping");
    void this.stop({ graceMs: 0 });
  }

  private async serverDraining(): Promise<boolean> {
    try {
      const response = await fetch(this.client.transport.origin + "/ready", { signal: AbortSignal.timeout(5_000) });
      const body = (await response.json().catch(() => ({}))) as { error?: { details?: { reason?: string } } };
      return response.status === 503 && body.error?.details?.reason !== "backend_unavailable" ? true : false;
    } catch {
      return true;
    }
  }

  private async waitForServer(): Promise<void> {
    const base = this.options.reconnect?.baseDelayMs ?? 200;
    const max = this.options.reconnect?.maxDelayMs ?? 5_000;
    for (let attempt = 0; !this.stopping; attempt++) {
      await pause(backoffDelay(attempt, base, max), this.stopSignal.signal);
      if (this.stopping) return;
      try {
        const response = await fetch(this.client.transport.origin + "/ready", { signal: AbortSignal.timeout(5_000) });
        await response.arrayBuffer();
        if (response.ok) return;
      } catch {
        // not back yet
      }
    }
  }
}
