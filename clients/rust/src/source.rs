//! Where a worker gets its jobs: [`WorkSource`], implemented by the HTTP
//! [`Client`](crate::Client) and by an embedded `svc::Svc` (feature
//! `embedded`), and [`Enqueuer`], what can take new jobs.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::enqueue::Enqueue;
use crate::error::Result;
use crate::types::{AckOutcome, HeartbeatAnswer, Job, Progress};

/// A boxed future that can move between threads.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A claim of jobs (docs/api.md, "Fetch").
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Fetch {
    /// 1 to 32 queues, most important first.
    pub queues: Vec<String>,
    /// 1 to 100 jobs.
    pub count: usize,
    pub worker_id: Option<String>,
    /// The claims' visibility timeout; default each job's own.
    pub visibility_timeout: Option<Duration>,
    /// With nothing to hand out, wait up to this long (at most 20 s) for a job.
    pub wait: Duration,
}

impl Fetch {
    /// One job from `queues`, no waiting.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(queues: I) -> Fetch {
        Fetch {
            queues: queues.into_iter().map(Into::into).collect(),
            count: 1,
            worker_id: None,
            visibility_timeout: None,
            wait: Duration::ZERO,
        }
    }

    pub fn count(mut self, count: usize) -> Fetch {
        self.count = count;
        self
    }

    pub fn worker_id(mut self, worker_id: impl Into<String>) -> Fetch {
        self.worker_id = Some(worker_id.into());
        self
    }

    pub fn visibility_timeout(mut self, timeout: Duration) -> Fetch {
        self.visibility_timeout = Some(timeout);
        self
    }

    /// Long polling: wait up to `wait` (at most 20 s) for a job.
    pub fn wait(mut self, wait: Duration) -> Fetch {
        self.wait = wait;
        self
    }
}

/// Acks of one or more active jobs, each on its own, and optionally the
/// next claim in the same durable step (docs/api.md, "Ack").
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Acks {
    /// 1 to 100 jobs, each with its result (JSON; `None` or `null`: none).
    pub acks: Vec<(String, Option<Value>)>,
    pub worker_id: Option<String>,
    /// Claims the next jobs once the acks went through.
    pub fetch: Option<Fetch>,
}

impl Acks {
    /// Acks one job.
    pub fn one(job_id: impl Into<String>, result: Option<Value>) -> Acks {
        Acks { acks: vec![(job_id.into(), result)], worker_id: None, fetch: None }
    }

    /// Acks several jobs.
    pub fn many(acks: Vec<(String, Option<Value>)>) -> Acks {
        Acks { acks, worker_id: None, fetch: None }
    }

    pub fn worker_id(mut self, worker_id: impl Into<String>) -> Acks {
        self.worker_id = Some(worker_id.into());
        self
    }

    /// Claims the next jobs in the same step (the fetch's `worker_id` is the ack's).
    pub fn then_fetch(mut self, fetch: Fetch) -> Acks {
        self.fetch = Some(fetch);
        self
    }
}

/// What acks came to: each one's outcome, in order, and the jobs claimed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AcksAnswer {
    pub acks: Vec<AckOutcome>,
    pub jobs: Vec<Job>,
}

/// A failed attempt, as a nack reports it (`error` of docs/api.md, "Nack").
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Failure {
    /// Matched against the retry policy's `non_retryable_errors`.
    #[serde(rename = "type")]
    pub error_type: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// `Some(false)`: the failure is final (no retry).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub backtrace: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Map<String, Value>>,
}

impl Failure {
    /// A failure of this type, with a message.
    pub fn new(error_type: impl Into<String>, message: impl Into<String>) -> Failure {
        Failure {
            error_type: error_type.into(),
            message: message.into(),
            code: None,
            retryable: None,
            backtrace: Vec::new(),
            details: None,
        }
    }

    /// Final: the job is not retried.
    pub fn non_retryable(mut self) -> Failure {
        self.retryable = Some(false);
        self
    }

    pub fn backtrace(mut self, frames: Vec<String>) -> Failure {
        self.backtrace = frames;
        self
    }

    pub fn details(mut self, details: Map<String, Value>) -> Failure {
        self.details = Some(details);
        self
    }
}

/// A heartbeat for the jobs a worker holds.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Heartbeat {
    pub worker_id: String,
    /// The jobs to extend (an empty list extends none).
    pub active_jobs: Vec<String>,
    /// The new claim length; default each claim's own.
    pub visibility_timeout: Option<Duration>,
}

impl Heartbeat {
    pub fn new(worker_id: impl Into<String>, active_jobs: Vec<String>) -> Heartbeat {
        Heartbeat { worker_id: worker_id.into(), active_jobs, visibility_timeout: None }
    }

    pub fn visibility_timeout(mut self, timeout: Option<Duration>) -> Heartbeat {
        self.visibility_timeout = timeout;
        self
    }
}

/// A progress report on an active job (docs/api.md, "Progress").
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ProgressReport {
    /// 0.0 to 1.0 (clamped by svc).
    pub fraction: f64,
    pub message: Option<String>,
    pub data: Option<Value>,
    pub worker_id: Option<String>,
}

impl ProgressReport {
    pub fn new(fraction: f64) -> ProgressReport {
        ProgressReport { fraction, message: None, data: None, worker_id: None }
    }

    pub fn message(mut self, message: impl Into<String>) -> ProgressReport {
        self.message = Some(message.into());
        self
    }

    pub fn data(mut self, data: Value) -> ProgressReport {
        self.data = Some(data);
        self
    }

    pub fn worker_id(mut self, worker_id: impl Into<String>) -> ProgressReport {
        self.worker_id = Some(worker_id.into());
        self
    }
}

/// What a [`Worker`](crate::Worker) runs against: the worker side of the
/// API. The HTTP [`Client`](crate::Client) implements it, and so does an
/// embedded `svc::Svc` in the same process (`Arc<svc::Svc>` or its
/// `EngineHandle`, feature `embedded`), so one handler serves both.
///
/// Errors are this crate's [`Error`](crate::Error): an embedded svc reports
/// the code and status HTTP would answer.
pub trait WorkSource: Send + Sync + 'static {
    /// Claims jobs.
    fn fetch(&self, fetch: Fetch) -> BoxFuture<'_, Result<Vec<Job>>>;
    /// Acks jobs, then claims the next ones (with `acks.fetch`).
    fn ack(&self, acks: Acks) -> BoxFuture<'_, Result<AcksAnswer>>;
    /// Reports a failed attempt; with `requeue` the job goes back at once
    /// and the attempt does not count.
    fn nack(
        &self,
        job_id: String,
        failure: Failure,
        requeue: bool,
        worker_id: Option<String>,
    ) -> BoxFuture<'_, Result<Job>>;
    /// Extends claims and answers what the worker should do.
    fn heartbeat(&self, heartbeat: Heartbeat) -> BoxFuture<'_, Result<HeartbeatAnswer>>;
    /// Reports progress on an active job.
    fn report_progress(&self, job_id: String, report: ProgressReport) -> BoxFuture<'_, Result<Progress>>;
    /// Reads a job (`None`: not found).
    fn job(&self, job_id: String) -> BoxFuture<'_, Result<Option<Job>>>;
    /// Whether the server is draining for a restart (it then answers
    /// `terminate` to every worker): the worker waits for it instead of
    /// stopping. An embedded svc never drains.
    fn draining(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { false })
    }
    /// Whether a failure of this source may leave a request applied without
    /// an answer (a network); `false` for an in-process source.
    fn answers_can_be_lost(&self) -> bool {
        true
    }
}

/// What takes new jobs: the [`Client`](crate::Client), or an embedded svc
/// (feature `embedded`), so code that enqueues can be tested in process.
pub trait Enqueuer: Send + Sync {
    /// Enqueues one job; answers the stored job (or, for a unique `ignore`
    /// policy that met a held job, that job, marked `deduplicated`).
    fn enqueue(&self, job: Enqueue) -> BoxFuture<'_, Result<Job>>;
    /// Enqueues 1 to 10 000 jobs, all or none; answers them in order.
    fn enqueue_batch(&self, jobs: Vec<Enqueue>) -> BoxFuture<'_, Result<Vec<Job>>>;
}

impl<T: WorkSource + ?Sized> WorkSource for std::sync::Arc<T> {
    fn fetch(&self, fetch: Fetch) -> BoxFuture<'_, Result<Vec<Job>>> {
        (**self).fetch(fetch)
    }
    fn ack(&self, acks: Acks) -> BoxFuture<'_, Result<AcksAnswer>> {
        (**self).ack(acks)
    }
    fn nack(
        &self,
        job_id: String,
        failure: Failure,
        requeue: bool,
        worker_id: Option<String>,
    ) -> BoxFuture<'_, Result<Job>> {
        (**self).nack(job_id, failure, requeue, worker_id)
    }
    fn heartbeat(&self, heartbeat: Heartbeat) -> BoxFuture<'_, Result<HeartbeatAnswer>> {
        (**self).heartbeat(heartbeat)
    }
    fn report_progress(&self, job_id: String, report: ProgressReport) -> BoxFuture<'_, Result<Progress>> {
        (**self).report_progress(job_id, report)
    }
    fn job(&self, job_id: String) -> BoxFuture<'_, Result<Option<Job>>> {
        (**self).job(job_id)
    }
    fn draining(&self) -> BoxFuture<'_, bool> {
        (**self).draining()
    }
    fn answers_can_be_lost(&self) -> bool {
        (**self).answers_can_be_lost()
    }
}

impl<T: Enqueuer + ?Sized> Enqueuer for std::sync::Arc<T> {
    fn enqueue(&self, job: Enqueue) -> BoxFuture<'_, Result<Job>> {
        (**self).enqueue(job)
    }

    fn enqueue_batch(&self, jobs: Vec<Enqueue>) -> BoxFuture<'_, Result<Vec<Job>>> {
        (**self).enqueue_batch(jobs)
    }
}
