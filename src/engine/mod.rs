//! The single-writer engine: state, decisions, the batch loop, recovery.
//!
//! [`Engine::open`] locks the data dir, loads the newest snapshot, replays the
//! log after it through the same `apply` the live engine uses, and starts the
//! writer thread. Everything else goes through the [`EngineHandle`].

mod acks;
mod api;
mod commit;
pub(crate) mod counting;
mod cron;
mod events;
mod handle;
mod image;
mod inbox;
#[doc(hidden)]
pub mod inspect;
mod job_table;
mod jobs;
pub(crate) mod legacy;
mod pace;
mod progress;
mod queues;
#[doc(hidden)]
pub mod record;
mod recover;
mod refusal;
pub mod requests;
mod schemas;
mod snapshot;
mod state;
mod table;
mod throughput;
mod view;
mod webhooks;
pub mod workers;
mod workflows;
mod writer;

pub use acks::{ACKS_MAX, AckItem, AckMany, AckOutcome};
pub use api::{
    Cancelled, ConflictReason, EngineError, Enqueued, FetchRequest, HeartbeatOutcome, Overview, QueueStats, Unavailable,
};
#[doc(hidden)]
pub use cron::register as register_cron;
pub use cron::table::{CronEntry, CronWrite};
pub use cron::{DeleteCron, PutCron};
#[doc(hidden)]
pub use events::EventSink;
#[cfg(feature = "postgres")]
pub(crate) use events::meta_may_hold_trace_id;
pub use events::{
    CronInfo, CronSkip, Event, EventId, EventKind, EventPage, SignalledWorker, WorkflowEvent, render_event,
};
pub(crate) use handle::block_on;
pub use handle::{EngineHandle, Pending};
#[doc(hidden)]
pub use image::{IMAGE_VERSION, StateImage, decode_image};
pub use jobs::bulk::{BULK_CHUNK_MAX, BulkAction, BulkJobs, BulkOutcome};
#[doc(hidden)]
pub use jobs::decide::{EnqueueSlot, Entropy, SystemEntropy};
pub use jobs::listing::{JobCursor, JobFilter, JobsPage};
pub use progress::ReportProgress;
pub use queues::{Backpressure, BackpressureStrategy, ConfigureQueue, PauseQueue};
#[doc(hidden)]
pub use recover::recover;
pub use refusal::{ERROR_CODES, Refusal};
pub use requests::Request;
pub use schemas::{DeleteSchema, RegisterSchema};
pub use state::Retention;
#[doc(hidden)]
pub use state::State;
pub use throughput::MinuteCount;
pub use view::{DeadLetterCursor, EngineFailure, QueueSummary};
pub use webhooks::WebhookChange;
pub use webhooks::outbox;
#[cfg(feature = "webhooks")]
#[doc(hidden)]
pub use webhooks::pool;
#[doc(hidden)]
pub use webhooks::{AttemptOutcome, AttemptResult, changed as changed_subscription};
pub use workers::{WorkerEntry, WorkerSignal, WorkerState};
#[doc(hidden)]
pub use workflows::table::is_failure;
pub use workflows::table::{Callback, Member, MemberOutcome, ParentResults, Workflow, WorkflowFailure, WorkflowState};
pub use workflows::{CancelWorkflow, CreateWorkflow};

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::thread::JoinHandle;

use crate::clock::{Clock, SteadyClock, SystemClock};
use crate::job::{IdGenerator, JobDefaults};
use crate::limits::{ENGINE_INBOX_BYTES_MAX, ENGINE_INBOX_MAX, SEGMENT_BYTES_MAX, SNAPSHOT_LOG_BYTES_DEFAULT};
use crate::storage::{
    DataDirLock, FileSystem, RealFileSystem, StorageError, WalWriter, list_snapshots, open_snapshot, remove_obsolete,
};
use view::ReadView;
use writer::{SnapshotPolicy, Writer};

/// How to open an engine: [`EngineConfig::new`], then change the fields
/// that differ from the defaults.
#[non_exhaustive]
pub struct EngineConfig {
    pub data_dir: PathBuf,
    /// Where time comes from; a [`crate::clock::ManualClock`] to drive it by hand.
    pub clock: Arc<dyn Clock>,
    /// What the log and snapshots are written through.
    pub file_system: Arc<dyn FileSystem>,
    /// Log bytes between snapshots.
    pub snapshot_log_bytes: u64,
    /// Size at which a log segment is closed.
    pub segment_bytes: u64,
    pub retention: Retention,
    pub defaults: JobDefaults,
    /// Most cron entries (`limits.max_cron`).
    pub cron_entries_max: usize,
    /// How long one delivery attempt may take (`webhooks.timeout_s`).
    pub delivery_timeout_ms: i64,
    /// Bounds of subscriptions and deliveries.
    pub webhook_limits: outbox::WebhookLimits,
    /// Most registered schemas (`limits.max_schemas`).
    pub max_schemas: usize,
    /// Bytes the live jobs may hold before new jobs are refused (`limits.max_live_bytes`).
    pub max_live_bytes: u64,
    /// What the server and the tests wire in; an embedding program leaves it.
    #[doc(hidden)]
    pub wiring: Wiring,
}

/// What the program that opens an engine wires into it, apart from its
/// settings: where it counts, where its deliveries go, where its ids'
/// randomness comes from, and the tests' check of every invariant.
#[doc(hidden)]
#[non_exhaustive]
pub struct Wiring {
    pub entropy: Box<dyn Entropy>,
    /// Verify every invariant after each batch (tests; costs O(jobs) per batch).
    pub check_invariants: bool,
    /// Where the engine counts what it does (shared with the HTTP front end).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Where attempts of webhook deliveries go (the delivery pool); without
    /// one, events are not queued for subscriptions.
    pub deliveries: Option<outbox::DeliverySink>,
}

impl Default for Wiring {
    fn default() -> Wiring {
        Wiring {
            entropy: Box::new(SystemEntropy),
            check_invariants: false,
            metrics: Arc::new(crate::metrics::Metrics::new()),
            deliveries: None,
        }
    }
}

impl EngineConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            clock: Arc::new(SystemClock),
            file_system: Arc::new(RealFileSystem),
            snapshot_log_bytes: SNAPSHOT_LOG_BYTES_DEFAULT,
            segment_bytes: SEGMENT_BYTES_MAX,
            retention: Retention::default(),
            defaults: JobDefaults::default(),
            cron_entries_max: crate::limits::CRON_ENTRIES_MAX_DEFAULT,
            delivery_timeout_ms: outbox::ATTEMPT_TIMEOUT_MS_DEFAULT,
            webhook_limits: outbox::WebhookLimits::default(),
            max_schemas: crate::limits::SCHEMAS_MAX,
            max_live_bytes: crate::limits::LIVE_BYTES_MAX_DEFAULT,
            wiring: Wiring::default(),
        }
    }
}

/// A running engine. [`Engine::close`] stops it cleanly with a final snapshot.
pub struct Engine {
    handle: EngineHandle,
    thread: Option<JoinHandle<()>>,
    data_dir: PathBuf,
    _lock: DataDirLock,
}

impl Engine {
    pub fn open(config: EngineConfig) -> Result<Engine, StorageError> {
        let lock = DataDirLock::acquire(&config.data_dir)?;
        let recovery_started = std::time::Instant::now();
        let (mut state, replay_from, last_segment, replayed_bytes) = recover(&config.data_dir, config.retention)?;
        state.set_max_live_bytes(config.max_live_bytes);
        let recovery_seconds = recovery_started.elapsed().as_secs_f64();
        config.wiring.metrics.recovery_seconds.set(recovery_seconds);
        tracing::info!(
            data_dir = %config.data_dir.display(),
            live_jobs = state.live_jobs(),
            replayed_bytes,
            seconds = recovery_seconds,
            "recovered"
        );
        let wal = match last_segment {
            Some((index, valid_bytes)) => WalWriter::resume(
                config.file_system.clone(),
                &config.data_dir,
                index,
                valid_bytes,
                config.segment_bytes,
            )?,
            None => WalWriter::create(config.file_system.clone(), &config.data_dir, replay_from, config.segment_bytes)?,
        };
        remove_obsolete(&config.data_dir, replay_from)?;
        // The data dir loads as it is, with no log to replay, from its newest
        // snapshot (not one passed over for an older one, nor one in an older
        // layout, which loads slower) or from nothing.
        let snapshot_written = replayed_bytes == 0
            && list_snapshots(&config.data_dir)?.last().is_none_or(|(index, path)| {
                *index == replay_from
                    && open_snapshot(path).is_ok_and(|newest| newest.payload_version == image::IMAGE_VERSION)
            });
        if config.wiring.check_invariants {
            state.check_invariants().map_err(|reason| StorageError::Corrupt {
                path: config.data_dir.clone(),
                offset: 0,
                reason: format!("recovered state is inconsistent: {reason}"),
            })?;
        }
        let (sender, inbox) = inbox::inbox(ENGINE_INBOX_MAX, ENGINE_INBOX_BYTES_MAX);
        let view = Arc::new(ReadView::new(state.jobs.shared()));
        view.load_throughput(&config.data_dir);
        // The engine's time never goes back, not even across a restart.
        let clock: Arc<dyn Clock> = Arc::new(SteadyClock::new(config.clock, state.latest_at()));
        let handle = EngineHandle::new(
            sender,
            view.clone(),
            clock.clone(),
            config.defaults.clone(),
            config.wiring.metrics.clone(),
        );
        let committer = commit::Committer::new(wal, view.clone(), config.wiring.metrics.clone());
        let writer = Writer {
            state,
            clock,
            entropy: config.wiring.entropy,
            inbox,
            view,
            snapshots: SnapshotPolicy {
                dir: config.data_dir.clone(),
                file_system: config.file_system,
                log_bytes: config.snapshot_log_bytes,
            },
            bytes_since_snapshot: replayed_bytes,
            snapshot_busy: Arc::new(AtomicBool::new(false)),
            snapshot_pace: Arc::default(),
            snapshot_written: Arc::new(AtomicBool::new(snapshot_written)),
            snapshot_retry_at: None,
            event_ids: IdGenerator::default(),
            event_seq: 0,
            check_invariants: config.wiring.check_invariants,
            final_snapshot: true,
            contacts: workers::entry::Contacts::default(),
            cron_entries_max: config.cron_entries_max,
            draining: false,
            last_worker_sweep: i64::MIN / 2,
            committer,
            parked: std::collections::VecDeque::new(),
            metrics: config.wiring.metrics,
            deliveries: config.wiring.deliveries,
            delivery_timeout_ms: config.delivery_timeout_ms,
            in_flight: outbox::InFlight::default(),
            outbox_wake: None,
            webhook_limits: config.webhook_limits,
            delivery_log: Default::default(),
            max_schemas: config.max_schemas,
            event_buffer: Vec::new(),
            record_buffer: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name("svc-engine".into())
            .spawn(move || writer.run())
            .map_err(|error| StorageError::Io { path: config.data_dir.clone(), error })?;
        // The writer publishes the recovered state before it takes commands;
        // a probe makes `open` return only once reads see it.
        let _ = handle.probe().wait();
        Ok(Engine { handle, thread: Some(thread), data_dir: config.data_dir.clone(), _lock: lock })
    }

    pub fn handle(&self) -> &EngineHandle {
        &self.handle
    }

    /// Stops the engine: commands already queued are handled, a final snapshot
    /// is written (unless nothing was logged since the newest one), and the
    /// writer thread is joined.
    pub fn close(mut self) {
        self.stop(true);
    }

    /// Stops without the final snapshot, leaving the data dir as a crash right
    /// after the last commit would: recovery must replay the log.
    pub fn close_without_snapshot(mut self) {
        self.stop(false);
    }

    fn stop(&mut self, snapshot: bool) {
        if let Some(thread) = self.thread.take() {
            let _ = self.handle.shutdown(snapshot).wait();
            let _ = thread.join();
            if snapshot && let Err(error) = self.handle.save_throughput(&self.data_dir) {
                tracing::warn!(%error, "the throughput history was not saved");
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop(true);
    }
}
