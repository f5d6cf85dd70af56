//! The Rust client of svc, the durable job-queue server: an HTTP producer
//! and admin [`Client`], and a [`Worker`] that runs the same handlers
//! against a server or against an embedded `svc::Svc` in the same process.
//!
//! ```no_run
//! # async fn run() -> svc_client::Result<()> {
//! use svc_client::{Client, Enqueue, JobContext, Worker};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Email { to: String }
//!
//! let client = Client::new("http://127.0.0.1:8080")?;
//! client.enqueue(Enqueue::new("email.send").args(&Email { to: "ada@example.com".into() })).await?;
//!
//! let mut worker = Worker::builder().queues(["default"]).concurrency(8).build(client);
//! worker.handle("email.send", |email: Email, _ctx: JobContext| async move {
//!     Ok(format!("sent to {}", email.to))
//! });
//! worker.run().await
//! # }
//! ```
//!
//! The same worker embedded: `Worker::builder().build(Arc::new(svc::Svc::open(dir)?))`
//! (feature `embedded`, on by default). See the README for the whole API,
//! the retry rule, and the worker's behaviour (heartbeats, quiet and
//! terminate, timeouts, shutdown, reconnects).

mod admin;
mod client;
#[cfg(feature = "embedded")]
pub mod embedded;
mod enqueue;
mod error;
mod http;
mod source;
pub mod trace;
mod types;
mod worker;

pub use admin::{Cron, CronSpec, DeadLetter, Queues, Schemas, WebhookSpec, Webhooks, Workers, WorkflowSpec, Workflows};
pub use client::{Client, ClientBuilder, EnqueueMiddleware, EnqueueNext, ListOptions};
pub use enqueue::{
    Enqueue, OnConflict, RateLimit, RatePeriod, RetryPolicy, UniquePolicy, iso_duration, new_job_id, rfc3339,
};
pub use error::{ApiError, Error, Result, TransportError, TransportErrorKind};
pub use http::{MEDIA_TYPE, RequestRetry};
pub use source::{Acks, AcksAnswer, BoxFuture, Enqueuer, Failure, Fetch, Heartbeat, ProgressReport, WorkSource};
pub use types::{
    AckOutcome, CronEntry, HeartbeatAnswer, Job, JobFailure, JobState, NackAnswer, Page, Progress, QueueStats,
    QueueSummary, Subscription, Throughput, WebhookTestResult, WorkerInfo, WorkerState, Workflow, WorkflowMember,
};
pub use worker::{CancelReason, JobContext, JobError, Middleware, Next, StopHandle, Worker, WorkerBuilder};

/// `tokio_util`'s cancellation token, as [`JobContext::cancellation_token`] gives it.
pub use tokio_util::sync::CancellationToken;
