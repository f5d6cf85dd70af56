/**
 * Errors raised by the client. Every answer of the server that is not a
 * success becomes an {@link SvcError} (or one of its subclasses), carrying the
 * fields of the server's error body `{error: {code, message, retryable,
 * details, request_id}}` and the HTTP status. Failures to reach the server at
 * all are {@link ConnectionError}s.
 */

export interface SvcErrorInit {
  code: string;
  message: string;
  status: number;
  retryable?: boolean;
  details?: Record<string, unknown>;
  requestId?: string | null;
  retryAfterMs?: number | undefined;
  cause?: unknown;
}

/** Any error reported by svc, or raised by the client while talking to it. */
export class SvcError extends Error {
  /** The server's error code (`not_found`, `conflict`, ...), or a client-side code. */
  readonly code: string;
  /** Whether the server says the same request may succeed later. */
  readonly retryable: boolean;
  /** The server's `details` object (`field`, `reason`, `current_state`, ...). */
  readonly details: Record<string, unknown>;
  /** The request id (`X-Request-Id`) of the answer, for support and logs. */
  readonly requestId: string | null;
  /** HTTP status, or 0 when no answer came. */
  readonly status: number;
  /** The `Retry-After` of a 429 or 503, in milliseconds. */
  readonly retryAfterMs: number | undefined;
  /** Attempts the client made for this call (retries included). */
  attempts = 1;
  /**
   * True when the call may have taken effect although it failed: an attempt
   * got no answer after it was sent (a broken connection, a timeout) or an
   * answer that does not say (a 503 after a storage failure, a 504).
   */
  maybeApplied = false;

  constructor(init: SvcErrorInit) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.code = init.code;
    this.status = init.status;
    this.retryable = init.retryable ?? false;
    this.details = init.details ?? {};
    this.requestId = init.requestId ?? null;
    this.retryAfterMs = init.retryAfterMs;
  }

  /** `details.reason`, when the server gave one. */
  get reason(): string | undefined {
    const reason = this.details["reason"];
    return typeof reason === "string" ? reason : undefined;
  }
}

/** 400 and 413: the request is malformed or too large (`invalid_request`, `invalid_payload`, `schema_validation`, `envelope_too_large`). */
export class ValidationError extends SvcError {
  /** `details.field`, the offending field, when the server named one. */
  get field(): string | undefined {
    const field = this.details["field"];
    return typeof field === "string" ? field : undefined;
  }
}

/** 401 and 403: a missing or unknown key, or a role that may not do this. */
export class AuthError extends SvcError {}

/** 404: the job, workflow, entry or route does not exist (or was pruned). */
export class NotFoundError extends SvcError {}

/** 409: the thing is in the wrong state (`conflict`) or the id or unique key is taken (`duplicate`). */
export class ConflictError extends SvcError {
  /** `details.current_state`, when the server gave it. */
  get currentState(): string | undefined {
    const state = this.details["current_state"];
    return typeof state === "string" ? state : undefined;
  }
}

/** 409 `duplicate`: a client-chosen id in use, or a unique policy that rejects. */
export class DuplicateError extends ConflictError {
  /** The job already holding the id or unique key. */
  get existingJobId(): string | undefined {
    const id = this.details["existing_job_id"];
    return typeof id === "string" ? id : undefined;
  }
}

/** 422 `unsupported`: a feature or version this server does not implement. */
export class UnsupportedError extends SvcError {}

/** 503 and 504: the server cannot take the request now (overloaded, full, draining, a paused queue, a storage failure). */
export class UnavailableError extends SvcError {}

/** 503 `queue_paused`: the target queue is paused. Not retried by the client: a pause lasts until an operator resumes it. */
export class QueuePausedError extends UnavailableError {
  get queue(): string | undefined {
    const queue = this.details["queue"];
    return typeof queue === "string" ? queue : undefined;
  }
}

/** 429 `rate_limited`: too many requests; see {@link SvcError.retryAfterMs}. */
export class RateLimitedError extends SvcError {}

/**
 * The server could not be reached or the connection broke before an answer
 * came (`code`: `connection_refused`, `connection_error`), or the answer took
 * longer than the client's timeout (`code`: `timeout`, see {@link RequestTimeoutError}).
 */
export class ConnectionError extends SvcError {
  /** True when the request surely never reached the server (connection refused). */
  readonly notSent: boolean;
  constructor(init: SvcErrorInit & { notSent: boolean }) {
    super(init);
    this.notSent = init.notSent;
  }
}

/** The client's own per-request timeout ran out (`timeoutMs`). */
export class RequestTimeoutError extends ConnectionError {}

/** Builds the right subclass for an error answer. */
export function errorFromResponse(
  status: number,
  body: unknown,
  headers: { get(name: string): string | null },
): SvcError {
  const error =
    body !== null && typeof body === "object" && "error" in body && typeof body.error === "object" && body.error !== null
      ? (body.error as Record<string, unknown>)
      : undefined;
  const code = typeof error?.["code"] === "string" ? (error["code"] as string) : `http_${status}`;
  const message =
    typeof error?.["message"] === "string" ? (error["message"] as string) : `svc answered HTTP ${status}`;
  const details =
    error?.["details"] !== null && typeof error?.["details"] === "object"
      ? (error["details"] as Record<string, unknown>)
      : {};
  const requestId =
    typeof error?.["request_id"] === "string" ? (error["request_id"] as string) : headers.get("x-request-id");
  const retryable =
    typeof error?.["retryable"] === "boolean" ? (error["retryable"] as boolean) : status === 429 || status >= 502;
  const init: SvcErrorInit = {
    code,
    message,
    status,
    retryable,
    details,
    requestId,
    retryAfterMs: parseRetryAfter(headers.get("retry-after")),
  };
  if (status === 400 || status === 413) return new ValidationError(init);
  if (status === 401 || status === 403) return new AuthError(init);
  if (status === 404) return new NotFoundError(init);
  if (status === 409) return code === "duplicate" ? new DuplicateError(init) : new ConflictError(init);
  if (status === 422) return new UnsupportedError(init);
  if (status === 429) return new RateLimitedError(init);
  if (code === "queue_paused") return new QueuePausedError(init);
  if (status === 503 || status === 504 || status === 502) return new UnavailableError(init);
  return new SvcError(init);
}

/** `Retry-After` as milliseconds: whole seconds, or an HTTP date. */
export function parseRetryAfter(value: string | null): number | undefined {
  if (value === null || value.trim() === "") return undefined;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

/**
 * A handler may throw a `JobError` to control how the failure is reported:
 * its `type` is the error type svc records and matches against the retry
 * policy's `non_retryable_errors`; `retryable: false` makes the failure final.
 */
export class JobError extends Error {
  readonly type: string;
  readonly retryable: boolean | undefined;
  readonly details: Record<string, unknown> | undefined;
  constructor(
    message: string,
    options: { type?: string; retryable?: boolean; details?: Record<string, unknown>; cause?: unknown } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "JobError";
    this.type = options.type ?? "JobError";
    this.retryable = options.retryable;
    this.details = options.details;
  }
}

/** The reason a handler's `ctx.signal` aborts when the job ran past its `timeout_ms`. */
export class JobTimeoutError extends Error {
  constructor(readonly limitMs: number) {
    super(`the job ran past its timeout of ${limitMs} ms`);
    this.name = "JobTimeoutError";
  }
}

/** The reason a handler's `ctx.signal` aborts when the job is released: worker shutdown, a `terminate` signal, or a job cancelled while it ran. */
export class JobAbortedError extends Error {
  constructor(
    readonly why: "shutdown" | "terminate" | "cancelled" | "lease_lost",
    message?: string,
  ) {
    super(message ?? `the job was aborted (${why})`);
    this.name = "JobAbortedError";
  }
}
