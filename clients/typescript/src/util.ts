import { randomBytes } from "node:crypto";

/** Resolves after `ms`, or rejects with the signal's reason once it aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(abortReason(signal));
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(abortReason(signal!));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, ms));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** The reason an aborted signal carries (an `AbortError` when none was given). */
export function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("This operation was aborted", "AbortError");
}

/**
 * A signal that aborts when any of `signals` does (`AbortSignal.any` is not
 * in Node 18). `dispose` removes the listeners once the operation is over.
 */
export function anySignal(signals: ReadonlyArray<AbortSignal | undefined>): {
  signal: AbortSignal;
  dispose: () => void;
} {
  const controller = new AbortController();
  const present = signals.filter((s): s is AbortSignal => s !== undefined);
  const listeners: Array<[AbortSignal, () => void]> = [];
  const dispose = (): void => {
    for (const [signal, listener] of listeners) signal.removeEventListener("abort", listener);
    listeners.length = 0;
  };
  for (const signal of present) {
    if (signal.aborted) {
      controller.abort(signal.reason);
      dispose();
      return { signal: controller.signal, dispose };
    }
    const listener = (): void => {
      controller.abort(signal.reason);
      dispose();
    };
    signal.addEventListener("abort", listener, { once: true });
    listeners.push([signal, listener]);
  }
  return { signal: controller.signal, dispose };
}

/**
 * Capped exponential backoff with jitter: `base × 2^attempt`, capped at
 * `max`, then multiplied by a random factor in [0.5, 1) ("equal jitter").
 * `attempt` counts from 0.
 */
export function backoffDelay(attempt: number, baseMs: number, maxMs: number): number {
  const exp = Math.min(maxMs, baseMs * 2 ** Math.min(attempt, 30));
  return exp / 2 + Math.random() * (exp / 2);
}

/** A duration in milliseconds as ISO 8601 (`PT1.5S`); strings pass as they are. */
export function isoDuration(value: number | string): string {
  if (typeof value === "string") return value;
  if (!Number.isFinite(value) || value < 0) throw new TypeError(`a duration must be a non-negative number of ms, got ${value}`);
  const seconds = Math.round(value) / 1000;
  return `PT${seconds}S`;
}

/** A point in time as the wire wants it: RFC 3339. */
export function timestamp(value: Date | string | number): string {
  if (typeof value === "string") return value;
  const date = typeof value === "number" ? new Date(value) : value;
  if (Number.isNaN(date.getTime())) throw new TypeError("invalid date");
  return date.toISOString();
}

let lastMs = -1;
let lastRandA = 0;

/**
 * A new UUIDv7 (time-ordered, lower case), fit for a client-chosen job id.
 * Ids made by one process within the same millisecond still sort in creation
 * order. Giving a job an id makes its enqueue safe to retry (see the README).
 */
export function newJobId(): string {
  let ms = Date.now();
  const bytes = randomBytes(16);
  let randA: number;
  if (ms <= lastMs) {
    ms = lastMs;
    randA = lastRandA + 1;
    if (randA > 0xfff) {
      ms = lastMs + 1;
      randA = bytes.readUInt16BE(6) & 0x7ff;
    }
  } else {
    randA = bytes.readUInt16BE(6) & 0x7ff;
  }
  lastMs = ms;
  lastRandA = randA;
  bytes.writeUIntBE(ms, 0, 6);
  bytes[6] = 0x70 | ((randA >> 8) & 0x0f);
  bytes[7] = randA & 0xff;
  bytes[8] = 0x80 | (bytes[8]! & 0x3f);
  const hex = bytes.toString("hex");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

const TRACEPARENT = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;

/** Whether `value` is a well-formed W3C `traceparent` header value. */
export function isTraceparent(value: unknown): value is string {
  return typeof value === "string" && TRACEPARENT.test(value) && !value.startsWith("ff");
}

/**
 * A W3C `traceparent`: a child of `parent` (same trace, new span id), or the
 * root of a new trace without one.
 */
export function newTraceparent(parent?: string): string {
  const span = randomBytes(8).toString("hex");
  if (parent !== undefined && isTraceparent(parent)) {
    const [version, trace, , flags] = parent.split("-");
    return `${version}-${trace}-${span}-${flags}`;
  }
  return `00-${randomBytes(16).toString("hex")}-${span}-01`;
}

/** Whether a value is a plain JSON object. */
export function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/**
 * The object without its `undefined` members (they have no JSON form). A
 * copy, not `delete`: deleting members turns an object into a slow
 * dictionary, and this runs for every job acked.
 */
export function compact<T extends Record<string, unknown>>(object: T): T {
  const kept: Record<string, unknown> = {};
  for (const key in object) if (object[key] !== undefined) kept[key] = object[key];
  return kept as T;
}
