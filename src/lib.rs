//! svc: a durable, single-node job-queue server, and the same engine as a library.
//!
//! Crate map:
//! - [`limits`], [`clock`]: named bounds; the only reader of OS time.
//! - [`job`]: domain types and enqueue validation (pure data).
//! - [`schedule`]: ready order, deadline set, backoff (pure, `now` passed in).
//! - [`cron`]: cron expressions, firing times in time zones, registrations (pure).
//! - [`storage`]: frames, log segments, snapshots (bytes only, no jobs).
//! - [`engine`]: the single writer — state, decisions, batch loop, recovery.
//! - [`http`]: the hyper front end, translation only.
//! - [`config`], [`server`]: settings and wiring for `svc serve`.
//!
//! Embedding: open a data dir with [`Svc::open`] and call it directly — no HTTP.
//!
//! ```no_run
//! let svc = svc::Svc::open("./data").expect("data dir opens");
//! let job = svc.enqueue_json(r#"{"type":"email.send","args":["a@example.com"]}"#).expect("enqueued");
//! let claimed = svc.fetch(&["default"], 1, Some("worker-1")).expect("fetched");
//! svc.ack(claimed[0].id, Some(r#"{"sent":true}"#.into())).expect("acked");
//! assert_eq!(svc.get(job.id).expect("stored").state, svc::job::JobState::Completed);
//! svc.close();
//! ```

pub mod bench;
pub mod clock;
pub mod config;
pub mod cron;
pub mod engine;
pub mod http;
pub mod job;
pub mod limits;
pub mod logging;
pub mod model;
pub mod schedule;
pub mod server;
pub mod storage;

mod embed;

pub use embed::{Svc, SvcError};
