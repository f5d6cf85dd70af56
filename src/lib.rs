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
//! modules behind the `svc` binary (`server`, `http`, `config` and the
//! rest) are public for it and for the tests, and hidden from these docs.
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
#[cfg(feature = "server")]
#[doc(hidden)]
pub mod config;
pub mod cron;
pub mod engine;
#[cfg(feature = "server")]
#[doc(hidden)]
pub mod http;
pub mod job;
#[doc(hidden)]
pub mod limits;
#[cfg(feature = "server")]
#[doc(hidden)]
pub mod logging;
#[doc(hidden)]
pub mod metrics;
#[doc(hidden)]
pub mod schedule;
/// The schema registry's documents: registration, compilation, checking `args`.
pub mod schema;
#[cfg(feature = "server")]
#[doc(hidden)]
pub mod server;
pub mod storage;
pub mod webhook;
#[doc(hidden)]
pub mod wire;
pub mod workflow;

mod embed;

pub use embed::{GivenResults, Refusal, Svc, SvcError, WebhookSettings, render_job};
