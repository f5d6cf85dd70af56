//! Every bound of the server as a named constant, unit last.
//!
//! Configurable limits have their default here; `config.rs` may override them.
//! Related limits are checked against each other at compile time at the bottom.

/// Largest request body for every route but batch enqueue.
pub const REQUEST_BODY_BYTES_MAX: usize = 2 * 1024 * 1024;
/// Largest batch enqueue request body.
pub const BATCH_BODY_BYTES_MAX: usize = 32 * 1024 * 1024;
/// Largest compact JSON of one enqueue item.
pub const ENVELOPE_BYTES_MAX: usize = 1024 * 1024;
/// Largest compact JSON of `meta`.
pub const META_BYTES_MAX: usize = 64 * 1024;
/// Largest compact JSON of an ack `result`.
pub const RESULT_BYTES_MAX: usize = 1024 * 1024;
/// Largest `result` a `job.completed` event (listed, or sent to a webhook)
/// carries; a larger one is left out and `result_omitted: true` said instead.
pub const EVENT_RESULT_BYTES_MAX: usize = 64 * 1024;
/// The longest progress message a worker may report (docs/api.md, "Progress").
pub const PROGRESS_MESSAGE_BYTES_MAX: usize = 4 * 1024;
/// The most JSON a progress report may carry as `data`.
pub const PROGRESS_DATA_BYTES_MAX: usize = 64 * 1024;
/// Deepest JSON nesting accepted in a request body.
pub const JSON_DEPTH_MAX: usize = 64;
/// Most jobs in one batch enqueue.
pub const BATCH_JOBS_MAX: usize = 10_000;
/// Largest fetch `count`; larger values are clamped.
pub const FETCH_COUNT_MAX: usize = 100;
/// Most workers the registry remembers; past it the least recently seen idle one is forgotten.
pub const WORKERS_MAX: usize = 10_000;
/// A worker not seen for this long is reported stale.
pub const WORKER_STALE_MS: i64 = 90_000;
/// A worker idle this long (no contact, no active jobs) is forgotten.
pub const WORKER_FORGET_MS: i64 = 24 * 3_600_000;
/// How often the engine looks for workers to forget.
pub const WORKER_SWEEP_EVERY_MS: i64 = 60_000;
/// Most job ids one heartbeat may list.
pub const HEARTBEAT_JOBS_MAX: usize = 1000;
/// Longest a fetch may wait for a job (`wait_ms`); below the request timeout.
pub const FETCH_WAIT_MS_MAX: u64 = 20_000;
const _: () = assert!(FETCH_WAIT_MS_MAX < REQUEST_TIMEOUT_MS);
/// Most queue names in one fetch.
pub const FETCH_QUEUES_MAX: usize = 32;
/// Default and largest page size of list endpoints.
pub const PAGE_SIZE_DEFAULT: usize = 25;
pub const PAGE_SIZE_MAX: usize = 100;
/// Most bytes of text a job search (`q`) looks for.
pub const SEARCH_TEXT_BYTES_MAX: usize = 256;
/// Length bounds of names.
pub const TYPE_CHARS_MAX: usize = 255;
pub const QUEUE_CHARS_MAX: usize = 128;
pub const WORKER_ID_CHARS_MAX: usize = 256;
/// Priority range.
pub const PRIORITY_MIN: i64 = -100;
pub const PRIORITY_MAX: i64 = 100;
/// Execution and visibility timeouts.
pub const TIMEOUT_MS_DEFAULT: u64 = 30_000;
pub const TIMEOUT_MS_MAX: u64 = 86_400_000;
/// Tags.
pub const TAGS_MAX: usize = 32;
pub const TAG_CHARS_MAX: usize = 128;
/// Retry policy bounds.
pub const RETRY_ATTEMPTS_MAX: i64 = 1000;
pub const BACKOFF_COEFFICIENT_MAX: f64 = 100.0;
pub const NON_RETRYABLE_ERRORS_MAX: usize = 100;
pub const ERROR_TYPE_CHARS_MAX: usize = 255;
/// Durations (retry intervals, unique periods): at most 365 days.
pub const DURATION_MS_MAX: i64 = 365 * 86_400_000;
/// Stored failure reports are cut to these sizes.
pub const ERROR_MESSAGE_CHARS_MAX: usize = 4096;
pub const BACKTRACE_FRAMES_MAX: usize = 50;
pub const BACKTRACE_CHARS_MAX: usize = 10_000;
/// Newest failures kept in a job's error history.
pub const ERROR_HISTORY_MAX: usize = 20;
/// Jobs in one workflow (chain steps, or a group's or batch's jobs; a
/// batch may add up to three callbacks).
pub const WORKFLOW_JOBS_MAX: usize = 1000;
pub const WORKFLOW_NAME_CHARS_MAX: usize = 255;
/// The longest window of a dispatch rate limit (`period: "hour"`).
pub const DISPATCH_WINDOW_MS_MAX: i64 = 3_600_000;
/// Client `X-Request-Id` values echoed back.
pub const REQUEST_ID_CHARS_MAX: usize = 128;
/// Non-terminal jobs the server holds at once.
pub const LIVE_JOBS_MAX: usize = 10_000_000;
/// Bytes the live jobs may hold by default (`limits.max_live_bytes`), as
/// [`crate::job::Job::held_bytes`] counts them.
pub const LIVE_BYTES_MAX_DEFAULT: u64 = 8 * 1024 * 1024 * 1024;
/// The most webhook subscriptions.
pub const WEBHOOKS_MAX: usize = 1000;
/// How long an old webhook secret keeps signing after a new one is added.
pub const WEBHOOK_ROTATION_GRACE_MS: i64 = 24 * 3_600_000;
/// The most schemas the registry holds.
pub const SCHEMAS_MAX: usize = 10_000;
/// How far ahead of the server's clock a client-chosen job id's timestamp may
/// be. Generated ids sort after every id in use, so a later bound would let a
/// client push the generator's clock forward without limit.
pub const CLIENT_ID_AHEAD_MS_MAX: i64 = 3_600_000;
/// Events kept in memory for `GET /events`.
pub const EVENT_BUFFER_MAX: usize = 10_000;
/// Most bytes of jobs the event buffer may keep alive (an event holds the job
/// as it was after its transition); past it the oldest events are dropped.
pub const EVENT_BUFFER_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// Commands waiting for the engine; past this, requests get 503 `backend_error`.
pub const ENGINE_INBOX_MAX: usize = 65_536;
/// Bytes the commands waiting for the engine may carry; past this, requests
/// get 503 `backend_error` too.
pub const ENGINE_INBOX_BYTES_MAX: u64 = 256 * 1024 * 1024;
/// Most commands the engine applies in one batch (one write, one fsync).
pub const ENGINE_BATCH_COMMANDS_MAX: usize = 4096;
/// Most bytes of commands the engine takes into one batch (one larger
/// command is taken alone): what one turn logs is bounded by this, its
/// events' deliveries (each body once) and the outbox's caps, whatever
/// the inbox holds.
pub const ENGINE_BATCH_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// Largest payload of one log frame; the decoder refuses larger lengths before allocating.
pub const FRAME_PAYLOAD_BYTES_MAX: usize = 128 * 1024 * 1024;
// One request's records must fit half a frame (a turn's records are cut
// into sequences of that size, but one record is never split): the largest,
// a full batch, is its body plus at most about a hundred bytes of fields a
// job holds beyond its JSON. Webhook deliveries are logged in records of
// their own, each at most 8 MiB of bodies (`engine::outbox`).
const _: () = assert!(BATCH_BODY_BYTES_MAX + BATCH_JOBS_MAX * 1024 <= FRAME_PAYLOAD_BYTES_MAX / 2);
/// A segment is closed and a new one started once it grows past this.
pub const SEGMENT_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// A snapshot is written once this many log bytes were appended since the last one.
pub const SNAPSHOT_LOG_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;
/// Largest snapshot payload the reader accepts.
pub const SNAPSHOT_BYTES_MAX: u64 = 64 * 1024 * 1024 * 1024;

/// Cron entries a server holds by default (`limits.max_cron`).
pub const CRON_ENTRIES_MAX_DEFAULT: usize = 10_000;
/// Longest cron entry name.
pub const CRON_NAME_CHARS_MAX: usize = 255;
/// Longest cron expression text.
pub const CRON_SCHEDULE_CHARS_MAX: usize = 256;
/// Longest cron description.
pub const CRON_DESCRIPTION_CHARS_MAX: usize = 1024;
/// Missed occurrences counted for one misfire event (the count stops here).
pub const CRON_MISSED_COUNT_MAX: u32 = 10_000;

/// Retention of terminal jobs before they are pruned.
pub const RETENTION_COMPLETED_MS: i64 = 7 * 86_400_000;
pub const RETENTION_CANCELLED_MS: i64 = 7 * 86_400_000;
pub const RETENTION_DISCARDED_MS: i64 = 7 * 86_400_000;
pub const RETENTION_DEAD_LETTER_MS: i64 = 30 * 86_400_000;
/// Terminal jobs held for lookup, all terminal states together: past either
/// bound the oldest are pruned first, dead-lettered ones last.
pub const RETENTION_TERMINAL_JOBS_MAX: usize = 1_000_000;
pub const RETENTION_TERMINAL_BYTES_MAX: u64 = 256 * 1024 * 1024;
/// Finished workflows are kept this long, and at most this many.
pub const RETENTION_WORKFLOWS_MS: i64 = 7 * 86_400_000;
pub const RETENTION_TERMINAL_WORKFLOWS_MAX: usize = 100_000;
pub const RETENTION_TERMINAL_WORKFLOW_BYTES_MAX: u64 = 256 * 1024 * 1024;

/// How long a health probe may wait for the engine.
pub const HEALTH_PROBE_MS: u64 = 1000;
/// Connections served at once; more are answered 503 and closed.
pub const CONNECTIONS_MAX_DEFAULT: usize = 10_000;
/// Connections one client address may hold at once by default (a reverse
/// proxy in front of the server is one address: it pools its connections).
pub const CONNECTIONS_PER_ADDRESS_MAX_DEFAULT: usize = 1024;
/// How long writing an answer may wait for a client that does not read it.
pub const WRITE_TIMEOUT_MS: u64 = 30_000;
/// How long a request may take before it gets 504.
pub const REQUEST_TIMEOUT_MS: u64 = 30_000;
/// After the log is poisoned the process keeps answering (503) this long, then exits.
pub const POISON_EXIT_DELAY_MS: u64 = 1000;

// A batch body must be able to carry at least one maximal envelope, and one log
// frame must hold the largest batch the server accepts.
const _: () = assert!(BATCH_BODY_BYTES_MAX >= ENVELOPE_BYTES_MAX);
const _: () = assert!(REQUEST_BODY_BYTES_MAX >= ENVELOPE_BYTES_MAX);
const _: () = assert!(FRAME_PAYLOAD_BYTES_MAX >= 2 * BATCH_BODY_BYTES_MAX);
const _: () = assert!(FRAME_PAYLOAD_BYTES_MAX as u64 <= SEGMENT_BYTES_MAX * 2);
const _: () = assert!(PAGE_SIZE_DEFAULT <= PAGE_SIZE_MAX);
/// How long opening a data dir keeps trying its lock before it reports the
/// dir in use. A child process holds the lock for an instant between fork and
/// exec: it inherits the lock's file descriptor, which exec then closes.
pub const DATA_DIR_LOCK_WAIT_MS: u64 = 1000;
/// The longest schema URI, in characters.
pub const SCHEMA_URI_CHARS_MAX: usize = 1024;
/// The longest schema URI, in bytes: PostgreSQL's index keys hold at most
/// 2 704 bytes, and a URI is one.
pub const SCHEMA_URI_BYTES_MAX: usize = 2048;
