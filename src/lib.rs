//! svc: a durable, single-node job-queue server, and the same engine as a library.
//!
//! Embedding: open a data dir with [`Svc::open`] (or [`Svc::open_with`] and an
//! [`engine::EngineConfig`]) and call it directly, no HTTP. For async code,
//! [`Svc::handle`] is the [`engine::EngineHandle`] the server itself uses: it
//! takes every [`engine::Request`] and reads the durable state.
//!
//! [`Svc`] checks every call as the HTTP API checks the same request, and
//! refuses what it would refuse with [`SvcError::Invalid`]. Results and
//! failure reports are typed: [`Svc::ack_with`] takes anything that
//! serializes to JSON ([`Svc::ack_json`] takes JSON text, checked as such),
//! [`Svc::nack`] a [`job::Failure`].
//!
//! What an embedding program uses is documented here: [`Svc`], [`engine`]
//! (the handle, its requests and answers, the configuration), [`job`] (jobs
//! and their parts), [`cron`] (cron registrations), [`clock`] (to inject
//! time) and [`storage`] (the file system the log writes through). The
//! modules behind the `svc` binary (the server, its settings, the HTTP front
//! end and the rest) sit under a hidden `__private`, for it and the tests.
//!
//! ```no_run
//! use svc::job::{Failure, JobBuilder};
//!
//! #[derive(serde::Serialize)]
//! struct Sent {
//!     message_id: String,
//! }
//!
//! # fn send(args: &str) -> Result<String, String> { Ok(args.into()) }
//! let svc = svc::Svc::open("./data")?;
//! svc.enqueue(JobBuilder::new("email.send").args(["a@example.com"]))?;
//! for job in svc.fetch(&["default"], 10, Some("worker-1"))? {
//!     match send(job.payload.args()) {
//!         Ok(message_id) => svc.ack_with(job.id, &Sent { message_id })?,
//!         // Retried later as the job's retry policy says.
//!         Err(error) => svc.nack(job.id, Failure::new("SmtpError", error))?,
//!     };
//! }
//! svc.close();
//! # Ok::<(), svc::SvcError>(())
//! ```

pub mod backend;
pub mod clock;
pub mod cron;
pub mod engine;
pub mod job;
/// The schema registry's documents: registration, compilation, checking `args`.
pub mod schema;
pub mod storage;
pub mod webhook;
pub mod workflow;

/// The modules behind the `svc` binary (the server, its settings, the HTTP
/// front end, metrics, logging), public for the binary and the tests only:
/// not part of the embedding API, not documented, and free to change.
#[doc(hidden)]
pub mod __private;

#[cfg(feature = "server")]
pub(crate) use __private::{config, http, logging};
pub(crate) use __private::{limits, metrics, schedule, wire};

mod embed;

pub use embed::{GivenResults, Refusal, Svc, SvcError, WebhookSettings, render_job};
