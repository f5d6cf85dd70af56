export { Client } from "./client.js";
export type { ClientOptions, ClaimOptions, EnqueueContext, EnqueueMiddleware, Enqueuer, Listing, WireItem } from "./client.js";
export { Worker, consoleLogger, silentLogger } from "./worker.js";
export type { Logger, WorkerOptions, WorkerStatus } from "./worker.js";
export { InlineWorker } from "./inline.js";
export type { InlineOptions, InlineProgress } from "./inline.js";
export { failureOf } from "./context.js";
export type { Handler, JobContext, ProgressOptions, WorkerMiddleware } from "./context.js";
export {
  AuthError,
  ConflictError,
  ConnectionError,
  DuplicateError,
  JobAbortedError,
  JobError,
  JobTimeoutError,
  NotFoundError,
  QueuePausedError,
  RateLimitedError,
  RequestTimeoutError,
  SvcError,
  UnavailableError,
  UnsupportedError,
  ValidationError,
} from "./errors.js";
export { Transport, VERSION, MEDIA_TYPE } from "./http.js";
export type { RetryOptions, TransportOptions } from "./http.js";
export { newJobId, newTraceparent, isTraceparent } from "./util.js";
export type {
  JobState,
  Duration,
  Timestamp,
  JsonObject,
  RetryPolicy,
  RetryPolicyEffective,
  UniqueState,
  UniquePolicy,
  UniquePolicyEffective,
  RateLimit,
  RateLimitEffective,
  EnqueueOptions,
  CallOptions,
  BatchItem,
  FailureReport,
  FailureHistoryEntry,
  Job,
  JobProgress,
  Page,
  ListOptions,
  WorkflowJob,
  WorkflowCallbacks,
  WorkflowOptions,
  WorkflowType,
  WorkflowMember,
  WorkflowCallback,
  Workflow,
  OverlapPolicy,
  CronRegistration,
  CronPatch,
  CronEntry,
  QueueSummary,
  QueueStats,
  WorkerState,
  WorkerInfo,
  HeartbeatAnswer,
  AckAnswer,
  NackAnswer,
  FailureInput,
  WebhookFilter,
  WebhookCreate,
  WebhookPatch,
  Subscription,
  WebhookTestResult,
  SvcEvent,
  EventQuery,
  SchemaInfo,
  Health,
} from "./types.js";
