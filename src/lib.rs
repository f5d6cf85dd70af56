//! svc: a durable, single-node job-queue server, and the same engine as a library.
//!
//! Embedding: open a data dir with [`Svc::open`] (or [`Svc::open_with`] and an
//! [`engine::EngineConfig`]) and call it directly, no HTTP. For async code,
//! [`Svc::handle`] is the [`engine::EngineHandle`] the server itself uses: it
//! takes every [`engine::Request`] and reads the durable state.
//!
//! What an embedding program uses is documented here: [`Svc`], [`engine`]
//! (the handle, its requests and answers, the configuration), [`job`] (jobs
//! and their parts), [`cron`] (cron registrations), [`clock`] (to inject
//! time) and [`storage`] (the file system the log writes through). The
//! modules behind the `svc` binary (`server`, `http`, `config` and the
//! rest) are public for it and for the tests, and hidden from these docs.
//!
//! ```no_run
//! let svc = svc::Svc::open("./data").expect("data dir opens");
//! let job = svc::job::JobBuilder::new("email.send").args(["a@example.com"]);
//! let enqueued = svc.enqueue(job).expect("enqueued");
//! let claimed = svc.fetch(&["default"], 1, Some("worker-1")).expect("fetched");
//! svc.ack(claimed[0].id, Some(r#"{"sent":true}"#.into())).expect("acked");
//! assert_eq!(svc.get(enqueued.job.id).expect("stored").state, svc::job::JobState::Completed);
//! svc.close();
//! ```

pub mod backend;
pub mod clock;
#[doc(hidden)]
pub mod config;
pub mod cron;
pub mod engine;
#[doc(hidden)]
pub mod http;
pub mod job;
#[doc(hidden)]
pub mod limits;
#[doc(hidden)]
pub mod logging;
#[doc(hidden)]
pub mod metrics;
#[doc(hidden)]
pub mod schedule;
/// The schema registry's documents: registration, compilation, checking `args`.
pub mod schema;
#[doc(hidden)]
pub mod server;
pub mod storage;
pub mod webhook;
#[doc(hidden)]
pub mod wire;
pub mod workflow;

mod embed;

pub use embed::{GivenResults, Svc, SvcError, WebhookSettings};
