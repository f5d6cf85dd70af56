import type { Agent } from "node:http";
import { ConflictError, DuplicateError, SvcError } from "./errors.js";
import { Transport, type RequestSpec, type RetryOptions } from "./http.js";
import type {
  AckAnswer,
  AckFetch,
  AckItem,
  AckManyAnswer,
  AckOutcome,
  BatchItem,
  CallOptions,
  CronEntry,
  CronPatch,
  CronRegistration,
  EnqueueOptions,
  EventQuery,
  FailureInput,
  Health,
  HeartbeatAnswer,
  Job,
  JobProgress,
  JsonObject,
  ListOptions,
  NackAnswer,
  Page,
  QueueStats,
  QueueSummary,
  SchemaInfo,
  Subscription,
  SvcEvent,
  WebhookCreate,
  WebhookPatch,
  WebhookTestResult,
  WorkerInfo,
  WorkerState,
  Workflow,
  WorkflowCallbacks,
  WorkflowJob,
  WorkflowOptions,
  WorkflowType,
} from "./types.js";
import { isTraceparent } from "./util.js";
import { wireAckFetch, wireCron, wireItem, wireOptions, wireWebhook, wireWorkflowJob, type WireItem } from "./wire.js";

export type { WireItem } from "./wire.js";

export interface ClientOptions {
  /** `Authorization: Bearer <apiKey>`. */
  apiKey?: string;
  /** Per-attempt timeout in ms (default 30 000). */
  timeoutMs?: number;
  /** How transient failures are retried (see the README for which calls are). */
  retry?: RetryOptions;
  /** Extra headers sent with every request. */
  headers?: Record<string, string>;
  /**
   * Send through this `fetch` rather than Node's `http` module (tests,
   * proxies, runtimes without `node:http`).
   */
  fetch?: typeof fetch;
  /** The `http.Agent` (an `https.Agent` for `https:`) requests go through; kept-alive ones of its own by default. */
  agent?: Agent;
  /**
   * Gives the `traceparent` of the current trace, if any; enqueues carry it
   * in `meta.traceparent` (unless the job sets one) so that handlers see it
   * as `ctx.traceparent`.
   */
  traceparent?: () => string | undefined;
  /** Middleware around enqueues (also added later with {@link Client.use}). */
  middleware?: EnqueueMiddleware[];
}

/** What an enqueue middleware sees: the wire items about to be sent (it may change them). */
export interface EnqueueContext {
  kind: "enqueue" | "batch";
  items: WireItem[];
}

/**
 * Runs around every `enqueue` and `enqueueBatch`: call `next()` to send (it
 * answers the stored jobs), or throw to refuse. Middleware added first runs
 * outermost.
 */
export type EnqueueMiddleware = (context: EnqueueContext, next: () => Promise<Job[]>) => Promise<Job[]>;

/** A listing page with its items under `items`. */
export interface Listing<T> extends Page {
  items: T[];
}

/** Anything that can enqueue: the {@link Client}, or an {@link InlineWorker} in tests. */
export interface Enqueuer {
  enqueue<Args extends unknown[] = unknown[]>(
    type: string,
    args?: Args,
    options?: EnqueueOptions & CallOptions,
  ): Promise<Job<Args>>;
  enqueueBatch(items: BatchItem[], options?: CallOptions): Promise<Job[]>;
}

/** Options of a fetch (claim) of jobs. */
export interface ClaimOptions extends CallOptions {
  queues: string[];
  count?: number;
  workerId?: string;
  visibilityTimeoutMs?: number;
  /** Long-poll time, 0…20 000 ms. */
  waitMs?: number;
}

const enc = encodeURIComponent;

/**
 * The producer and admin side of svc: enqueue jobs, read and cancel them,
 * run workflows, manage cron entries, queues, the dead letter listing and
 * webhook subscriptions.
 */
export class Client implements Enqueuer {
  readonly transport: Transport;
  private readonly middleware: EnqueueMiddleware[];
  private readonly traceparentSource: (() => string | undefined) | undefined;

  constructor(url: string, options: ClientOptions = {}) {
    this.transport = new Transport(url, options);
    this.middleware = [...(options.middleware ?? [])];
    this.traceparentSource = options.traceparent;
  }

  /** Adds an enqueue middleware (outermost first). */
  use(middleware: EnqueueMiddleware): this {
    this.middleware.push(middleware);
    return this;
  }

  private request<T>(spec: RequestSpec): Promise<T> {
    return this.transport.request<T>(spec).then((answer) => answer.data);
  }

  // ------------------------------------------------------------ jobs

  /**
   * Enqueues one job (`POST /jobs`). Retried on transient failures only when
   * it surely was not applied, or when it carries a client-chosen `id`: then
   * a retry that meets the job stored by an earlier attempt answers it.
   */
  async enqueue<Args extends unknown[] = unknown[]>(
    type: string,
    args?: Args,
    options: EnqueueOptions & CallOptions = {},
  ): Promise<Job<Args>> {
    const item = wireItem(type, args, options);
    const jobs = await this.runEnqueue({ kind: "enqueue", items: [item] }, async (items) => [
      await this.postJob(items[0]!, options),
    ]);
    return jobs[0] as Job<Args>;
  }

  /**
   * Enqueues many jobs at once, all or nothing (`POST /jobs/batch`). Retried
   * after an unclear failure only when every item has an `id`.
   */
  async enqueueBatch(items: BatchItem[], options: CallOptions = {}): Promise<Job[]> {
    const wire = items.map(({ type, args, ...rest }) => wireItem(type, args, rest));
    return this.runEnqueue({ kind: "batch", items: wire }, (sent) => this.postBatch(sent, options));
  }

  private async runEnqueue(context: EnqueueContext, send: (items: WireItem[]) => Promise<Job[]>): Promise<Job[]> {
    const traceparent = this.traceparentSource?.();
    if (traceparent !== undefined && isTraceparent(traceparent)) {
      for (const item of context.items) {
        if (item.meta?.["traceparent"] === undefined) item.meta = { ...(item.meta ?? {}), traceparent };
      }
    }
    const dispatch = (index: number): Promise<Job[]> => {
      const middleware = this.middleware[index];
      if (middleware === undefined) return send(context.items);
      return middleware(context, () => dispatch(index + 1));
    };
    return dispatch(0);
  }

  private async postJob(item: WireItem, call: CallOptions): Promise<Job> {
    try {
      const answer = await this.request<{ job: Job; deduplicated?: true }>({
        method: "POST",
        path: "/jobs",
        body: item,
        idempotent: typeof item.id === "string",
        signal: call.signal,
        timeoutMs: call.timeoutMs,
        retry: call.retry,
      });
      if (answer.deduplicated) answer.job.deduplicated = true;
      return answer.job;
    } catch (error) {
      // An earlier attempt stored the job and its answer was lost: the retry
      // meets our own id. Answer the stored job.
      if (
        error instanceof DuplicateError &&
        error.maybeApplied &&
        item.id !== undefined &&
        error.existingJobId === item.id &&
        error.reason !== "unique_conflict"
      ) {
        const job = await this.get(item.id, call);
        if (job.type === item.type) return job;
      }
      throw error;
    }
  }

  private async postBatch(items: WireItem[], call: CallOptions): Promise<Job[]> {
    const allIds = items.length > 0 && items.every((item) => typeof item.id === "string");
    try {
      const answer = await this.request<{ jobs: Job[]; count: number }>({
        method: "POST",
        path: "/jobs/batch",
        body: { jobs: items },
        idempotent: allIds,
        signal: call.signal,
        timeoutMs: call.timeoutMs,
        retry: call.retry,
      });
      return answer.jobs;
    } catch (error) {
      if (error instanceof DuplicateError && error.maybeApplied && allIds && error.reason !== "unique_conflict") {
        const index = typeof error.details["index"] === "number" ? (error.details["index"] as number) : 0;
        if (error.existingJobId === items[index]?.id) {
          // All or nothing: the first attempt stored the whole batch.
          return Promise.all(items.map((item) => this.get(item.id!, call)));
        }
      }
      throw error;
    }
  }

  /** Reads a job (`GET /jobs/{id}`). */
  get<Args extends unknown[] = unknown[]>(id: string, call: CallOptions = {}): Promise<Job<Args>> {
    return this.request<{ job: Job<Args> }>({
      method: "GET",
      path: `/jobs/${enc(id)}`,
      idempotent: true,
      ...call,
    }).then((a) => a.job);
  }

  /** Cancels a job that has not ended (`DELETE /jobs/{id}`); the answer's job has `previous_state`. Safe to retry. */
  cancel(id: string, call: CallOptions = {}): Promise<Job> {
    return this.request<{ job: Job }>({ method: "DELETE", path: `/jobs/${enc(id)}`, idempotent: true, ...call }).then(
      (a) => a.job,
    );
  }

  /** Activates a job enqueued with `pending: true` (`POST /jobs/{id}/activate`). */
  async activate(id: string, call: CallOptions = {}): Promise<Job> {
    try {
      const answer = await this.request<{ job: Job }>({
        method: "POST",
        path: `/jobs/${enc(id)}/activate`,
        idempotent: true,
        ...call,
      });
      return answer.job;
    } catch (error) {
      if (error instanceof ConflictError && error.maybeApplied && error.reason === "not_pending") {
        const job = await this.get(id, call);
        if (job.activated_at !== undefined) return job;
      }
      throw error;
    }
  }

  /** A job's last progress report (`GET /jobs/{id}/progress`). */
  progress(id: string, call: CallOptions = {}): Promise<JobProgress> {
    return this.request<JobProgress>({ method: "GET", path: `/jobs/${enc(id)}/progress`, idempotent: true, ...call });
  }

  // ------------------------------------------------------------ worker protocol

  /**
   * Claims jobs (`POST /workers/fetch`). Not retried after an unclear
   * failure: jobs claimed by a lost answer come back after their visibility
   * timeout. {@link Worker} runs this loop for you.
   */
  claim(options: ClaimOptions): Promise<Job[]> {
    const waitMs = options.waitMs ?? 0;
    return this.request<{ jobs: Job[] }>({
      method: "POST",
      path: "/workers/fetch",
      body: {
        queues: options.queues,
        count: options.count ?? 1,
        worker_id: options.workerId,
        visibility_timeout_ms: options.visibilityTimeoutMs,
        wait_ms: waitMs > 0 ? waitMs : undefined,
      },
      idempotent: false,
      signal: options.signal,
      timeoutMs: (options.timeoutMs ?? this.transport.timeoutMs) + waitMs,
      retry: options.retry,
    }).then((a) => a.jobs);
  }

  /**
   * Completes an active job (`POST /workers/ack`). Safe to retry: when an
   * earlier attempt was applied, the retry's 409 is answered by reading the
   * completed job.
   *
   * With `fetch`, the same durable step claims the next jobs for `workerId`
   * once the ack went through, answered in `jobs`; a refused ack claims
   * nothing (it rejects as without `fetch`). The request carrying the fetch
   * is sent again only when it surely was not applied. After an unclear
   * failure the ack alone is sent again and `jobs` is empty: jobs claimed by
   * the lost answer come back after their visibility timeout (as with
   * {@link claim}), and a fetch sent again with each retry could strand more.
   */
  async ack(
    id: string,
    result?: unknown,
    options: CallOptions & { workerId?: string; fetch?: AckFetch } = {},
  ): Promise<AckAnswer> {
    const body: JsonObject = { job_id: id, worker_id: options.workerId };
    if (result !== undefined) body["result"] = result;
    return (await this.sendAck<AckAnswer>(body, options)).data;
  }

  /**
   * Completes several active jobs in one request (`POST /workers/ack` with
   * `acks`, 1 to 100 of them): each is acked on its own, in order, and its
   * outcome is in `acks` (`acknowledged: false` with the `error` it would
   * have had alone: `not_found`, or `conflict` for a lease lost or a job
   * held by another worker). With `fetch`, the next jobs are claimed for
   * `workerId` in the same durable step, whatever became of the acks,
   * answered in `jobs`.
   *
   * Retried like {@link ack}: the request carrying the fetch only when it
   * surely was not applied, then the acks alone. After such an unclear
   * failure a job refused as `completed` is read, and counted as
   * acknowledged when this worker (or, without `workerId`, anyone)
   * completed it.
   */
  async ackMany(
    acks: AckItem[],
    options: CallOptions & { workerId?: string; fetch?: AckFetch } = {},
  ): Promise<AckManyAnswer> {
    const items = acks.map(({ jobId, result }): JsonObject =>
      result === undefined ? { job_id: jobId } : { job_id: jobId, result },
    );
    const body: JsonObject = { acks: items, worker_id: options.workerId };
    const { data, maybeApplied } = await this.sendAck<AckManyAnswer>(body, options);
    data.jobs ??= [];
    if (maybeApplied) {
      data.acks = await Promise.all(
        data.acks.map(async (outcome) => {
          if (outcome.acknowledged || outcome.error.code !== "conflict") return outcome;
          if (outcome.error.details["current_state"] !== "completed") return outcome;
          const job = await this.get(outcome.job_id, { signal: options.signal }).catch(() => undefined);
          if (job === undefined || job.state !== "completed") return outcome;
          if (options.workerId !== undefined && job.worker_id !== options.workerId) return outcome;
          const done: AckOutcome = { job_id: outcome.job_id, acknowledged: true, state: job.state };
          if (job.completed_at !== undefined) done.completed_at = job.completed_at;
          return done;
        }),
      );
    }
    return data;
  }

  /**
   * Sends an ack body, with `fetch` once (retried only when surely not
   * applied), then without it after an unclear failure. `maybeApplied`: an
   * attempt before the one answered may have been applied.
   */
  private async sendAck<T extends { jobs?: Job[] }>(
    body: JsonObject,
    options: CallOptions & { workerId?: string; fetch?: AckFetch },
  ): Promise<{ data: T; maybeApplied: boolean }> {
    const single = typeof body["job_id"] === "string";
    const send = (fetch: AckFetch | undefined) =>
      this.transport.request<T>({
        method: "POST",
        path: "/workers/ack",
        body: fetch === undefined ? body : { ...body, fetch: wireAckFetch(fetch) },
        idempotent: fetch === undefined,
        signal: options.signal,
        timeoutMs: (options.timeoutMs ?? this.transport.timeoutMs) + (fetch?.waitMs ?? 0),
        retry: options.retry,
      });
    let earlier = false;
    try {
      if (options.fetch !== undefined) {
        try {
          const answer = await send(options.fetch);
          answer.data.jobs ??= [];
          return { data: answer.data, maybeApplied: answer.maybeApplied };
        } catch (error) {
          if (!(error instanceof SvcError && error.maybeApplied && error.retryable) || options.retry === false) throw error;
          earlier = true;
        }
      }
      const answer = await send(undefined);
      if (options.fetch !== undefined) answer.data.jobs ??= [];
      return { data: answer.data, maybeApplied: earlier || answer.maybeApplied };
    } catch (error) {
      if (earlier && error instanceof SvcError) error.maybeApplied = true;
      if (
        single &&
        error instanceof ConflictError &&
        error.maybeApplied &&
        error.currentState === "completed"
      ) {
        const id = body["job_id"] as string;
        const job = await this.get(id, { signal: options.signal, timeoutMs: options.timeoutMs, retry: options.retry });
        if (options.workerId === undefined || job.worker_id === options.workerId) {
          const data = { job, acknowledged: true, id, job_id: id, state: job.state, completed_at: job.completed_at! };
          return { data: (options.fetch === undefined ? data : { ...data, jobs: [] }) as unknown as T, maybeApplied: true };
        }
      }
      throw error;
    }
  }

  /**
   * Reports a failure (`POST /workers/nack`); with `requeue` the job goes
   * back to `available` and the attempt does not count. Retried only when
   * surely not applied: applied twice, it could fail a later claim of the
   * same job. {@link Worker} checks the job before sending it again.
   */
  nack(
    id: string,
    error: FailureInput,
    options: CallOptions & { workerId?: string; requeue?: boolean } = {},
  ): Promise<NackAnswer> {
    return this.request<NackAnswer>({
      method: "POST",
      path: "/workers/nack",
      body: { job_id: id, worker_id: options.workerId, requeue: options.requeue ?? false, error },
      idempotent: false,
      signal: options.signal,
      timeoutMs: options.timeoutMs,
      retry: options.retry,
    });
  }

  /** Extends the claims of the listed jobs and answers what the worker should do (`POST /workers/heartbeat`). */
  heartbeat(
    workerId: string,
    activeJobIds: string[],
    options: CallOptions & { visibilityTimeoutMs?: number } = {},
  ): Promise<HeartbeatAnswer> {
    return this.request<HeartbeatAnswer>({
      method: "POST",
      path: "/workers/heartbeat",
      body: { worker_id: workerId, active_job_ids: activeJobIds, visibility_timeout_ms: options.visibilityTimeoutMs },
      idempotent: true,
      signal: options.signal,
      timeoutMs: options.timeoutMs,
      retry: options.retry,
    });
  }

  /** Reports how far a held job got (`PUT /jobs/{id}/progress`); `fraction` is clamped to 0…1 by the server. */
  reportProgress(
    id: string,
    fraction: number,
    options: CallOptions & { message?: string; data?: unknown; workerId?: string } = {},
  ): Promise<JobProgress> {
    return this.request<JobProgress>({
      method: "PUT",
      path: `/jobs/${enc(id)}/progress`,
      body: { progress: fraction, message: options.message, data: options.data, worker_id: options.workerId },
      idempotent: true,
      signal: options.signal,
      timeoutMs: options.timeoutMs,
      retry: options.retry,
    });
  }

  // ------------------------------------------------------------ namespaces

  /** Chains, groups and batches of jobs. */
  readonly workflows = {
    /** Runs `steps` one after the other; each step is given the results of those before (`parent_results`). */
    chain: (steps: WorkflowJob[], options: WorkflowOptions = {}): Promise<Workflow> =>
      this.createWorkflow("chain", steps, undefined, options),
    /** Runs `jobs` at once. */
    group: (jobs: WorkflowJob[], options: WorkflowOptions = {}): Promise<Workflow> =>
      this.createWorkflow("group", jobs, undefined, options),
    /** Runs `jobs` at once, then fires the callbacks once every one has ended. */
    batch: (jobs: WorkflowJob[], callbacks: WorkflowCallbacks, options: WorkflowOptions = {}): Promise<Workflow> =>
      this.createWorkflow("batch", jobs, callbacks, options),
    get: (id: string, call: CallOptions = {}): Promise<Workflow> =>
      this.request<{ workflow: Workflow }>({ method: "GET", path: `/workflows/${enc(id)}`, idempotent: true, ...call }).then(
        (a) => a.workflow,
      ),
    /** Cancels a running workflow and every job of it not yet ended. */
    cancel: async (id: string, call: CallOptions = {}): Promise<Workflow> => {
      try {
        const answer = await this.request<{ workflow: Workflow }>({
          method: "DELETE",
          path: `/workflows/${enc(id)}`,
          idempotent: true,
          ...call,
        });
        return answer.workflow;
      } catch (error) {
        if (error instanceof ConflictError && error.maybeApplied) {
          const workflow = await this.workflows.get(id, call);
          if (workflow.state === "cancelled") return workflow;
        }
        throw error;
      }
    },
  };

  private async createWorkflow(
    type: WorkflowType,
    members: WorkflowJob[],
    callbacks: WorkflowCallbacks | undefined,
    options: WorkflowOptions,
  ): Promise<Workflow> {
    const wireMembers = members.map(wireWorkflowJob);
    const definition: JsonObject = { type, [type === "chain" ? "steps" : "jobs"]: wireMembers };
    if (callbacks !== undefined) {
      const wireCallbacks: JsonObject = {};
      if (callbacks.onComplete) wireCallbacks["on_complete"] = wireWorkflowJob(callbacks.onComplete);
      if (callbacks.onSuccess) wireCallbacks["on_success"] = wireWorkflowJob(callbacks.onSuccess);
      if (callbacks.onFailure) wireCallbacks["on_failure"] = wireWorkflowJob(callbacks.onFailure);
      definition["callbacks"] = wireCallbacks;
    }
    const defaults = options.defaults === undefined ? {} : wireOptions(options.defaults);
    // The definition's `options.metadata` is every job's default `meta`.
    if (options.meta !== undefined) defaults["metadata"] = options.meta;
    if (Object.keys(defaults).length > 0) definition["options"] = defaults;
    const body: JsonObject = { definition };
    if (options.name !== undefined) body["name"] = options.name;
    // With an id on every member, creating again after an unclear failure
    // meets the first member: the workflow is found through it.
    const allIds = wireMembers.every((member) => typeof member.id === "string");
    try {
      const answer = await this.request<{ workflow: Workflow }>({
        method: "POST",
        path: "/workflows",
        body,
        idempotent: allIds,
        signal: options.signal,
        timeoutMs: options.timeoutMs,
        retry: options.retry,
      });
      return answer.workflow;
    } catch (error) {
      if (error instanceof DuplicateError && error.maybeApplied && allIds && error.reason !== "unique_conflict") {
        const index = typeof error.details["index"] === "number" ? (error.details["index"] as number) : 0;
        const member = wireMembers[index];
        if (member?.id !== undefined && error.existingJobId === member.id) {
          const job = await this.get(member.id, options);
          if (typeof job.workflow_id === "string") return this.workflows.get(job.workflow_id, options);
        }
      }
      throw error;
    }
  }

  /** Cron entries: registered by name; registering an existing name replaces it. */
  readonly cron = {
    /** Registers (or replaces) an entry (`POST /cron`); safe to retry. */
    register: (entry: CronRegistration, call: CallOptions = {}): Promise<CronEntry> =>
      this.request<{ cron: CronEntry }>({
        method: "POST",
        path: "/cron",
        body: wireCron(entry, entry.name),
        idempotent: true,
        ...call,
      }).then((a) => a.cron),
    list: (options: ListOptions & { enabled?: boolean } = {}): Promise<Listing<CronEntry>> =>
      this.list<CronEntry>("/cron", "crons", options, { enabled: options.enabled }),
    get: (name: string, call: CallOptions = {}): Promise<CronEntry> =>
      this.request<{ cron: CronEntry }>({ method: "GET", path: `/cron/${enc(name)}`, idempotent: true, ...call }).then(
        (a) => a.cron,
      ),
    /** Changes any field but the name (`PATCH /cron/{name}`). */
    update: (name: string, patch: CronPatch, call: CallOptions = {}): Promise<CronEntry> =>
      this.request<{ cron: CronEntry }>({
        method: "PATCH",
        path: `/cron/${enc(name)}`,
        body: wireCron(patch),
        idempotent: true,
        ...call,
      }).then((a) => a.cron),
    /** Removes an entry; the jobs it created stay. */
    delete: (name: string, call: CallOptions = {}): Promise<CronEntry> =>
      this.request<{ cron: CronEntry }>({ method: "DELETE", path: `/cron/${enc(name)}`, idempotent: true, ...call }).then(
        (a) => a.cron,
      ),
  };

  /** Queues: sizes, stats, pause and resume. */
  readonly queues = {
    list: (options: ListOptions = {}): Promise<Listing<QueueSummary>> =>
      this.list<QueueSummary>("/queues", "queues", options),
    stats: (name: string, call: CallOptions = {}): Promise<QueueStats> =>
      this.request<QueueStats>({ method: "GET", path: `/queues/${enc(name)}/stats`, idempotent: true, ...call }),
    /** Pauses a queue: fetches skip it and enqueues into it get {@link QueuePausedError}. */
    pause: (name: string, call: CallOptions = {}): Promise<{ queue: string; paused: boolean }> =>
      this.request({ method: "POST", path: `/queues/${enc(name)}/pause`, idempotent: true, ...call }),
    resume: (name: string, call: CallOptions = {}): Promise<{ queue: string; paused: boolean }> =>
      this.request({ method: "POST", path: `/queues/${enc(name)}/resume`, idempotent: true, ...call }),
  };

  /** Jobs that failed for good (`discarded`), newest first. */
  readonly deadLetter = {
    list: (options: ListOptions & { queue?: string } = {}): Promise<Listing<Job>> =>
      this.list<Job>("/dead-letter", "jobs", options, { queue: options.queue }),
    /** Every discarded job, page after page. */
    iterate: (options: ListOptions & { queue?: string } = {}): AsyncGenerator<Job> =>
      this.iterate((cursor) => this.deadLetter.list({ ...options, ...(cursor === undefined ? {} : { cursor }) })),
    /** Sends a discarded job back to `available` with its attempts reset. */
    retry: (id: string, call: CallOptions = {}): Promise<Job> =>
      this.request<{ job: Job }>({ method: "POST", path: `/dead-letter/${enc(id)}/retry`, idempotent: true, ...call }).then(
        (a) => a.job,
      ),
    delete: (id: string, call: CallOptions = {}): Promise<{ deleted: true; job_id: string }> =>
      this.request({ method: "DELETE", path: `/dead-letter/${enc(id)}`, idempotent: true, ...call }),
  };

  /** Webhook subscriptions (admin). */
  readonly webhooks = {
    /** Not retried after an unclear failure: a second create makes a second subscription. */
    create: (body: WebhookCreate, call: CallOptions = {}): Promise<Subscription> =>
      this.request<{ subscription: Subscription }>({
        method: "POST",
        path: "/webhooks",
        body: wireWebhook(body),
        idempotent: false,
        ...call,
      }).then((a) => a.subscription),
    list: (options: ListOptions = {}): Promise<Listing<Subscription>> =>
      this.list<Subscription>("/webhooks", "subscriptions", options),
    get: (id: string, call: CallOptions = {}): Promise<Subscription> =>
      this.request<{ subscription: Subscription }>({
        method: "GET",
        path: `/webhooks/${enc(id)}`,
        idempotent: true,
        ...call,
      }).then((a) => a.subscription),
    update: (id: string, patch: WebhookPatch, call: CallOptions = {}): Promise<Subscription> =>
      this.request<{ subscription: Subscription }>({
        method: "PATCH",
        path: `/webhooks/${enc(id)}`,
        body: wireWebhook(patch),
        idempotent: true,
        ...call,
      }).then((a) => a.subscription),
    delete: (id: string, call: CallOptions = {}): Promise<{ deleted: true; id: string }> =>
      this.request({ method: "DELETE", path: `/webhooks/${enc(id)}`, idempotent: true, ...call }),
    /** Starts a secret rotation (`POST /webhooks/{id}/secrets`). */
    rotateSecret: (id: string, secret: string, call: CallOptions = {}): Promise<Subscription> =>
      this.request<{ subscription: Subscription }>({
        method: "POST",
        path: `/webhooks/${enc(id)}/secrets`,
        body: { secret },
        idempotent: false,
        ...call,
      }).then((a) => a.subscription),
    /** Ends a secret rotation. */
    endRotation: (id: string, call: CallOptions = {}): Promise<Subscription> =>
      this.request<{ subscription: Subscription }>({
        method: "DELETE",
        path: `/webhooks/${enc(id)}/secrets/previous`,
        idempotent: false,
        ...call,
      }).then((a) => a.subscription),
    /** Sends one signed `webhook.test` event now and reports what the receiver said. */
    test: (id: string, call: CallOptions = {}): Promise<WebhookTestResult> =>
      this.request<WebhookTestResult>({ method: "POST", path: `/webhooks/${enc(id)}/test`, idempotent: false, ...call }),
  };

  /** The worker registry and its signals (admin). */
  readonly workers = {
    list: (options: ListOptions & { state?: WorkerState } = {}): Promise<Listing<WorkerInfo>> =>
      this.list<WorkerInfo>("/workers", "workers", options, { state: options.state }),
    get: (id: string, call: CallOptions = {}): Promise<WorkerInfo> =>
      this.request<{ worker: WorkerInfo }>({ method: "GET", path: `/workers/${enc(id)}`, idempotent: true, ...call }).then(
        (a) => a.worker,
      ),
    /** Tells a worker to finish what it holds and take nothing new. */
    quiet: (id: string, call: CallOptions = {}): Promise<WorkerInfo> =>
      this.request<{ worker: WorkerInfo }>({
        method: "POST",
        path: `/workers/${enc(id)}/quiet`,
        idempotent: true,
        ...call,
      }).then((a) => a.worker),
    /** Tells a worker to stop: it releases the jobs it holds. */
    terminate: (id: string, call: CallOptions = {}): Promise<WorkerInfo> =>
      this.request<{ worker: WorkerInfo }>({
        method: "POST",
        path: `/workers/${enc(id)}/terminate`,
        idempotent: true,
        ...call,
      }).then((a) => a.worker),
    /** Forgets a worker and its signal. */
    forget: (id: string, call: CallOptions = {}): Promise<{ deleted: true; worker_id: string }> =>
      this.request({ method: "DELETE", path: `/workers/${enc(id)}`, idempotent: true, ...call }),
  };

  /** Registered JSON Schemas for `args`. */
  readonly schemas = {
    register: (
      body: { uri: string; schema: unknown; type?: string; version?: string | number },
      call: CallOptions = {},
    ): Promise<SchemaInfo> =>
      this.request<{ schema: SchemaInfo }>({ method: "POST", path: "/schemas", body, idempotent: false, ...call }).then(
        (a) => a.schema,
      ),
    list: (options: ListOptions = {}): Promise<Listing<SchemaInfo>> => this.list<SchemaInfo>("/schemas", "schemas", options),
    get: (uri: string, call: CallOptions = {}): Promise<SchemaInfo> =>
      this.request<{ schema: SchemaInfo }>({ method: "GET", path: `/schemas/${enc(uri)}`, idempotent: true, ...call }).then(
        (a) => a.schema,
      ),
    delete: (uri: string, call: CallOptions = {}): Promise<{ deleted: true; uri: string }> =>
      this.request({ method: "DELETE", path: `/schemas/${enc(uri)}`, idempotent: true, ...call }),
  };

  /** Recent events (`GET /events`), oldest first. */
  events(query: EventQuery = {}): Promise<Listing<SvcEvent> & { gap?: true }> {
    return this.list<SvcEvent>("/events", "events", query, {
      types: query.types?.join(","),
      queues: query.queues?.join(","),
      job_types: query.jobTypes?.join(","),
      subject: query.subject,
      after: query.after,
    });
  }

  /** `GET /svc/v1/health`. */
  health(call: CallOptions = {}): Promise<Health> {
    return this.request<Health>({ method: "GET", path: "/svc/v1/health", idempotent: true, retry: false, ...call });
  }

  private async list<T>(
    path: string,
    key: string,
    options: ListOptions,
    extra: Record<string, string | number | boolean | undefined> = {},
  ): Promise<Listing<T>> {
    const data = await this.request<Record<string, unknown>>({
      method: "GET",
      path,
      query: { limit: options.limit, cursor: options.cursor, ...extra },
      idempotent: true,
      signal: options.signal,
      timeoutMs: options.timeoutMs,
      retry: options.retry,
    });
    const { [key]: items, ...rest } = data;
    return { ...(rest as unknown as Page), items: (items as T[]) ?? [] };
  }

  private async *iterate<T>(page: (cursor: string | undefined) => Promise<Listing<T>>): AsyncGenerator<T> {
    let cursor: string | undefined;
    for (;;) {
      const listing = await page(cursor);
      yield* listing.items;
      if (!listing.has_more || listing.cursor === null) return;
      cursor = listing.cursor;
    }
  }
}

