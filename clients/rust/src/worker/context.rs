//! What a handler gets ([`JobContext`]) and returns ([`JobError`]), and
//! middleware around it.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::runtime::Shared;
use crate::error::Result;
use crate::source::{BoxFuture, Failure, ProgressReport};
use crate::types::{Job, Progress};

/// Why a job's [`JobContext::cancellation_token`] was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CancelReason {
    /// The job ran past its `timeout_ms`: its handler is dropped and the
    /// job nacked with type `timeout`.
    Timeout,
    /// The worker is shutting down and the grace period is over: what the
    /// handler returns within the abort grace is still acked, else the job
    /// is released (nack with `requeue`, the attempt does not count).
    Shutdown,
    /// svc told the worker to terminate: as for a shutdown.
    Terminate,
    /// The job was cancelled in svc: its result would be refused.
    Cancelled,
    /// The claim is no longer this worker's (it ran out): its result would
    /// be refused.
    LeaseLost,
}

impl CancelReason {
    /// `timeout`, `shutdown`, `terminate`, `cancelled` or `lease_lost`.
    pub fn as_str(self) -> &'static str {
        match self {
            CancelReason::Timeout => "timeout",
            CancelReason::Shutdown => "shutdown",
            CancelReason::Terminate => "terminate",
            CancelReason::Cancelled => "cancelled",
            CancelReason::LeaseLost => "lease_lost",
        }
    }
}

/// A job's cancellation: the token and why it fired.
#[derive(Default)]
pub(crate) struct Cancellation {
    pub token: CancellationToken,
    reason: OnceLock<CancelReason>,
}

impl Cancellation {
    pub fn cancel(&self, reason: CancelReason) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }

    pub fn reason(&self) -> Option<CancelReason> {
        self.reason.get().copied()
    }
}

/// What a handler knows about the job it runs, and what it can do besides
/// returning: report progress, extend its lease, notice cancellation.
/// Cheap to clone.
#[derive(Clone)]
pub struct JobContext {
    pub(crate) inner: Arc<ContextInner>,
}

pub(crate) struct ContextInner {
    pub job: Job,
    pub deadline: Instant,
    pub cancellation: Arc<Cancellation>,
    pub shared: Arc<Shared>,
    pub seq: u64,
}

impl fmt::Debug for JobContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobContext")
            .field("job_id", &self.job_id())
            .field("type", &self.job_type())
            .field("attempt", &self.attempt())
            .finish_non_exhaustive()
    }
}

impl JobContext {
    /// The job's id.
    pub fn job_id(&self) -> &str {
        &self.inner.job.id
    }

    /// The job's type (`email.send`).
    pub fn job_type(&self) -> &str {
        &self.inner.job.job_type
    }

    /// The queue it came from.
    pub fn queue(&self) -> &str {
        &self.inner.job.queue
    }

    /// This run's attempt, from 1.
    pub fn attempt(&self) -> u32 {
        self.inner.job.attempt
    }

    /// The whole job as claimed: `args`, `meta`, `parent_results`, …
    pub fn job(&self) -> &Job {
        &self.inner.job
    }

    /// The job's `meta`.
    pub fn meta(&self) -> &Map<String, Value> {
        &self.inner.job.meta
    }

    /// The W3C trace context the job was enqueued in (`meta.traceparent`).
    pub fn traceparent(&self) -> Option<&str> {
        self.inner.job.traceparent()
    }

    /// A workflow step's inputs: the results of the steps before it.
    pub fn parent_results(&self) -> &[Value] {
        self.inner.job.parent_results.as_deref().unwrap_or_default()
    }

    /// The arguments read as another type than the handler's.
    pub fn args_as<T: DeserializeOwned>(&self) -> Result<T> {
        self.inner.job.args_as()
    }

    /// This worker's id.
    pub fn worker_id(&self) -> &str {
        &self.inner.shared.worker_id
    }

    /// When the job's execution timeout runs out (by this process's clock,
    /// counted from when the fetch was sent: never later than svc's).
    pub fn deadline(&self) -> Instant {
        self.inner.deadline
    }

    /// Time left before the deadline.
    pub fn remaining(&self) -> Duration {
        self.inner.deadline.saturating_duration_since(Instant::now())
    }

    /// Cancelled when the handler should stop: see [`CancelReason`]. Pass
    /// it (or a child) to work that can be cancelled.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.inner.cancellation.token
    }

    /// Whether the handler should stop.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancellation.token.is_cancelled()
    }

    /// Completes once the handler should stop.
    pub async fn cancelled(&self) {
        self.inner.cancellation.token.cancelled().await
    }

    /// Why the handler should stop, once it should.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.inner.cancellation.reason()
    }

    /// Reports how far the job got: a fraction from 0.0 to 1.0 and an
    /// optional message, seen in [`Client::progress`](crate::Client::progress)
    /// and the job's `progress`.
    pub async fn progress(&self, fraction: f64, message: Option<&str>) -> Result<Progress> {
        let mut report = ProgressReport::new(fraction);
        if let Some(message) = message {
            report = report.message(message);
        }
        self.report_progress(report).await
    }

    /// Reports progress with data.
    pub async fn report_progress(&self, report: ProgressReport) -> Result<Progress> {
        let report = report.worker_id(self.worker_id());
        self.inner.shared.source.report_progress(self.job_id().to_string(), report).await
    }

    /// Extends the job's claim now (a heartbeat), beside the periodic ones.
    pub async fn extend_lease(&self) -> Result<()> {
        self.inner.shared.extend_now(self.inner.seq).await
    }
}

/// A failed job, as its handler reports it: the error type svc records
/// (matched against the retry policy's `non_retryable_errors`), a message,
/// details, a backtrace, and whether a retry can help.
///
/// Any `std::error::Error` converts into one (so `?` works in handlers):
/// the type is the error's type name, the message its text, and the
/// backtrace its chain of causes (and the stack, when `RUST_BACKTRACE`
/// captures one).
pub struct JobError {
    failure: Failure,
}

impl JobError {
    /// A failure of this type (1 to 255 characters) with a message.
    pub fn new(error_type: impl Into<String>, message: impl Into<String>) -> JobError {
        JobError { failure: Failure::new(error_type, message) }
    }

    /// A failure with a message, of type `Error`.
    pub fn msg(message: impl Into<String>) -> JobError {
        JobError::new("Error", message)
    }

    /// A boxed error (`Box<dyn Error + Send + Sync>`, what `anyhow::Error` converts into).
    pub fn from_boxed(error: Box<dyn std::error::Error + Send + Sync + 'static>) -> JobError {
        let mut job_error = JobError::new("Error", error.to_string());
        job_error.failure.backtrace = causes(error.source());
        job_error
    }

    /// Final: the job is not retried, whatever attempts it has left.
    pub fn non_retryable(mut self) -> JobError {
        self.failure.retryable = Some(false);
        self
    }

    /// A code beside the type (retry policies match either).
    pub fn code(mut self, code: impl Into<String>) -> JobError {
        self.failure.code = Some(code.into());
        self
    }

    /// Details, kept with the failure (`error_class` is matched by retry policies too).
    pub fn details(mut self, details: Map<String, Value>) -> JobError {
        self.failure.details = Some(details);
        self
    }

    /// The error type.
    pub fn error_type(&self) -> &str {
        &self.failure.error_type
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.failure.message
    }

    /// The failure a nack reports.
    pub fn into_failure(self) -> Failure {
        self.failure
    }
}

impl fmt::Debug for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobError")
            .field("type", &self.failure.error_type)
            .field("message", &self.failure.message)
            .field("retryable", &self.failure.retryable)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.failure.error_type, self.failure.message)
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for JobError {
    fn from(error: E) -> JobError {
        let mut job_error = JobError::new(short_type_name::<E>(), error.to_string());
        let mut frames = causes(error.source());
        let backtrace = std::backtrace::Backtrace::capture();
        if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
            frames.extend(backtrace.to_string().lines().map(|line| line.trim().to_string()).take(40));
        }
        job_error.failure.backtrace = frames;
        job_error
    }
}

/// `caused by: …` for each cause of an error.
fn causes(mut source: Option<&(dyn std::error::Error + 'static)>) -> Vec<String> {
    let mut frames = Vec::new();
    while let Some(cause) = source {
        frames.push(format!("caused by: {cause}"));
        source = cause.source();
    }
    frames
}

/// `std::io::Error` → `io.Error`, `my::SendFailed` → `SendFailed`; generics dropped.
fn short_type_name<E>() -> String {
    let full = std::any::type_name::<E>();
    let base = full.split('<').next().unwrap_or(full);
    let mut segments = base.rsplit("::");
    let last = segments.next().unwrap_or("Error");
    // A bare `Error` is named with its module (`io.Error`; std's private
    // `error` modules are skipped).
    let name = match segments.find(|module| *module != "error") {
        Some(module) if last == "Error" => format!("{module}.{last}"),
        _ => last.to_string(),
    };
    name.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.')).take(255).collect()
}

/// A type-erased handler: arguments and context in, a JSON result out.
pub(crate) type HandlerFn = dyn Fn(Vec<Value>, JobContext) -> BoxFuture<'static, Result<Value, JobError>> + Send + Sync;

/// Runs around every execution (see [`Worker::wrap`](crate::Worker::wrap)):
/// it may time it, trace it, change the result or fail the job. Call
/// [`Next::run`] to go on. Any
/// `Fn(JobContext, Next) -> impl Future<Output = Result<Value, JobError>>`
/// is one.
pub trait Middleware: Send + Sync + 'static {
    /// Handles one execution.
    fn call(&self, ctx: JobContext, next: Next) -> BoxFuture<'static, Result<Value, JobError>>;
}

impl<F, Fut> Middleware for F
where
    F: Fn(JobContext, Next) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, JobError>> + Send + 'static,
{
    fn call(&self, ctx: JobContext, next: Next) -> BoxFuture<'static, Result<Value, JobError>> {
        Box::pin(self(ctx, next))
    }
}

/// The rest of the middleware chain, then the handler.
pub struct Next {
    pub(crate) chain: Arc<[Arc<dyn Middleware>]>,
    pub(crate) index: usize,
    pub(crate) handler: Arc<HandlerFn>,
    pub(crate) args: Vec<Value>,
}

impl Next {
    /// Runs the rest of the chain and the handler; answers the result (as
    /// JSON) or the failure.
    pub fn run(self, ctx: JobContext) -> BoxFuture<'static, Result<Value, JobError>> {
        match self.chain.get(self.index).cloned() {
            Some(middleware) => {
                let next = Next { chain: self.chain, index: self.index + 1, handler: self.handler, args: self.args };
                middleware.call(ctx, next)
            }
            None => (self.handler)(self.args, ctx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("sending failed")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn errors_become_failures_with_their_type_and_causes() {
        let error: JobError = Outer(std::io::Error::other("421 try later")).into();
        assert_eq!(error.error_type(), "Outer");
        assert_eq!(error.message(), "sending failed");
        let failure = error.into_failure();
        assert_eq!(failure.backtrace.first().map(String::as_str), Some("caused by: 421 try later"));
        let io: JobError = std::io::Error::other("disk").into();
        assert_eq!(io.error_type(), "io.Error");
        let parse: JobError = "x".parse::<u32>().unwrap_err().into();
        assert_eq!(parse.error_type(), "ParseIntError");
    }
}
