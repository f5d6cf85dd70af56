import {
  ConnectionError,
  RequestTimeoutError,
  SvcError,
  errorFromResponse,
} from "./errors.js";
import type { Agent } from "node:http";
import { fetchSend, nodeSend, type Incoming, type Send } from "./send.js";
import { abortReason, anySignal, backoffDelay, sleep } from "./util.js";

export const VERSION = "0.1.0";
export const MEDIA_TYPE = "application/svc+json";

/** How transient failures are retried. */
export interface RetryOptions {
  /** Retries after the first attempt (default 5; 0 turns retrying off). */
  maxRetries?: number;
  /** The first backoff step (default 200 ms); each retry doubles it. */
  baseDelayMs?: number;
  /** The longest backoff step (default 5 000 ms). */
  maxDelayMs?: number;
  /** A `Retry-After` longer than this (default 30 000 ms) is not waited for: the error is thrown. */
  maxRetryAfterMs?: number;
}

export interface TransportOptions {
  apiKey?: string | undefined;
  timeoutMs?: number | undefined;
  retry?: RetryOptions | undefined;
  headers?: Record<string, string> | undefined;
  /**
   * Send through this `fetch` rather than Node's `http` module (tests,
   * proxies, runtimes without `node:http`).
   */
  fetch?: typeof fetch | undefined;
  /** The `http.Agent` (an `https.Agent` for `https:`) requests go through; kept-alive ones of its own by default. */
  agent?: Agent | undefined;
}

export interface RequestSpec {
  method: "GET" | "POST" | "PUT" | "PATCH" | "DELETE";
  path: string;
  query?: Record<string, string | number | boolean | undefined> | undefined;
  body?: unknown;
  /**
   * Whether sending the request twice does no harm. A request that is not
   * idempotent is retried only when it surely was not applied (connection
   * refused, 429, or a 503 whose reason says nothing was done).
   */
  idempotent: boolean;
  signal?: AbortSignal | undefined;
  timeoutMs?: number | undefined;
  /** Overrides the client's retry options for this request; `false`: no retries. */
  retry?: RetryOptions | false | undefined;
}

export interface Answer<T> {
  status: number;
  data: T;
  headers: Headers;
  /** Attempts made (1 when the first one answered). */
  attempts: number;
  /** True when an earlier attempt may have been applied although it failed (its answer was lost). */
  maybeApplied: boolean;
}

/**
 * 503 reasons that say the request was refused before it did anything, so
 * that even a request that is not idempotent may be sent again.
 */
const NOT_APPLIED_503 = new Set(["overloaded", "capacity", "disk_full", "connections", "connections_per_address"]);

/** Error codes of a refused connection: the request never left. */
const REFUSED = new Set(["ECONNREFUSED"]);

function causeCodes(error: unknown): string[] {
  const codes: string[] = [];
  const seen = new Set<unknown>();
  const visit = (value: unknown): void => {
    if (value === null || typeof value !== "object" || seen.has(value)) return;
    seen.add(value);
    const code = (value as { code?: unknown }).code;
    if (typeof code === "string") codes.push(code);
    visit((value as { cause?: unknown }).cause);
    const errors = (value as { errors?: unknown }).errors;
    if (Array.isArray(errors)) for (const inner of errors) visit(inner);
  };
  visit(error);
  return codes;
}

/** Sends requests to one svc server, with timeouts and the retry rule. */
export class Transport {
  readonly baseUrl: string;
  readonly timeoutMs: number;
  readonly retry: Required<RetryOptions>;
  private readonly apiKey: string | undefined;
  private readonly extraHeaders: Record<string, string>;
  private readonly send: Send;

  constructor(url: string, options: TransportOptions = {}) {
    const parsed = new URL(url);
    let base = parsed.origin + parsed.pathname.replace(/\/+$/, "");
    if (!base.endsWith("/svc/v1")) base += "/svc/v1";
    this.baseUrl = base;
    this.apiKey = options.apiKey;
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.retry = {
      maxRetries: options.retry?.maxRetries ?? 5,
      baseDelayMs: options.retry?.baseDelayMs ?? 200,
      maxDelayMs: options.retry?.maxDelayMs ?? 5_000,
      maxRetryAfterMs: options.retry?.maxRetryAfterMs ?? 30_000,
    };
    this.extraHeaders = { ...(options.headers ?? {}) };
    this.send = options.fetch === undefined ? nodeSend(options.agent) : fetchSend(options.fetch);
  }

  /** The server's root (without `/svc/v1`), for the probes. */
  get origin(): string {
    return this.baseUrl.slice(0, -"/svc/v1".length);
  }

  url(path: string, query?: RequestSpec["query"]): string {
    // Paths under /svc/ are taken from the server's root, the rest from /svc/v1.
    const url = new URL(path.startsWith("/svc/") ? this.origin + path : this.baseUrl + path);
    if (query) {
      for (const [key, value] of Object.entries(query)) {
        if (value !== undefined) url.searchParams.set(key, String(value));
      }
    }
    return url.toString();
  }

  async request<T>(spec: RequestSpec): Promise<Answer<T>> {
    const retry = { ...this.retry };
    if (spec.retry === false) retry.maxRetries = 0;
    else if (spec.retry !== undefined) {
      for (const [key, value] of Object.entries(spec.retry) as Array<[keyof RetryOptions, number | undefined]>) {
        if (value !== undefined) retry[key] = value;
      }
    }
    let maybeApplied = false;
    for (let attempt = 0; ; attempt++) {
      if (spec.signal?.aborted) throw abortReason(spec.signal);
      let error: SvcError;
      let notApplied: boolean;
      try {
        const answer = await this.once<T>(spec);
        if (answer.ok) {
          return { status: answer.status, data: answer.data, headers: answer.headers, attempts: attempt + 1, maybeApplied };
        }
        error = answer.error;
        notApplied =
          error.status === 429 || (error.status === 503 && NOT_APPLIED_503.has(error.reason ?? "")) ||
          error.code === "queue_paused";
      } catch (thrown) {
        if (!(thrown instanceof ConnectionError)) throw thrown;
        error = thrown;
        notApplied = thrown.notSent;
      }
      if (!notApplied && error.status !== 0 && error.status < 500) notApplied = true;
      if (!notApplied) maybeApplied = true;
      error.attempts = attempt + 1;
      error.maybeApplied = maybeApplied;
      // The server's own word on whether trying again can help; a paused
      // queue waits for an operator, not for time.
      if (!error.retryable || error.code === "queue_paused") throw error;
      if (!(notApplied || spec.idempotent) || attempt >= retry.maxRetries) throw error;
      const after = error.retryAfterMs;
      if (after !== undefined && after > retry.maxRetryAfterMs) throw error;
      const backoff = backoffDelay(attempt, retry.baseDelayMs, retry.maxDelayMs);
      await sleep(Math.max(backoff, after ?? 0), spec.signal);
    }
  }

  private async once<T>(
    spec: RequestSpec,
  ): Promise<{ ok: true; status: number; data: T; headers: Headers } | { ok: false; error: SvcError }> {
    const timeoutMs = spec.timeoutMs ?? this.timeoutMs;
    const timeout = new AbortController();
    const timer = setTimeout(() => timeout.abort(new Error("timeout")), timeoutMs);
    const combined = anySignal([spec.signal, timeout.signal]);
    const headers: Record<string, string> = {
      accept: MEDIA_TYPE,
      "user-agent": `svc-client-ts/${VERSION}`,
      ...this.extraHeaders,
    };
    if (this.apiKey) headers["authorization"] = `Bearer ${this.apiKey}`;
    let body: string | undefined;
    if (spec.body !== undefined) {
      headers["content-type"] = MEDIA_TYPE;
      body = JSON.stringify(spec.body);
    }
    try {
      let response: Incoming;
      try {
        response = await this.send({
          method: spec.method,
          url: this.url(spec.path, spec.query),
          headers,
          body,
          signal: combined.signal,
        });
      } catch (cause) {
        throw this.networkError(cause, spec, timeout.signal, timeoutMs);
      }
      const text = response.text;
      let data: unknown = null;
      if (text.length > 0) {
        try {
          data = JSON.parse(text);
        } catch {
          data = text;
        }
      }
      if (response.status >= 200 && response.status < 300)
        return { ok: true, status: response.status, data: data as T, headers: response.headers };
      return { ok: false, error: errorFromResponse(response.status, data, response.headers) };
    } finally {
      clearTimeout(timer);
      combined.dispose();
    }
  }

  private networkError(cause: unknown, spec: RequestSpec, timeout: AbortSignal, timeoutMs: number): unknown {
    if (spec.signal?.aborted) return abortReason(spec.signal);
    if (timeout.aborted) {
      return new RequestTimeoutError({
        code: "timeout",
        message: `no answer from svc within ${timeoutMs} ms (${spec.method} ${spec.path})`,
        status: 0,
        retryable: true,
        notSent: false,
        cause,
      });
    }
    const codes = causeCodes(cause);
    const refused = codes.some((code) => REFUSED.has(code));
    const detail = codes.length > 0 ? codes.join(", ") : cause instanceof Error ? cause.message : String(cause);
    return new ConnectionError({
      code: refused ? "connection_refused" : "connection_error",
      message: `cannot reach svc at ${this.origin} (${detail})`,
      status: 0,
      retryable: true,
      notSent: refused,
      details: { causes: codes },
      cause,
    });
  }
}
