//! The single-writer engine: state, decisions, the batch loop, recovery.
//!
//! [`Engine::open`] locks the data dir, loads the newest snapshot, replays the
//! log after it through the same `apply` the live engine uses, and starts the
//! writer thread. Everything else goes through the [`EngineHandle`].

mod acks;
mod api;
mod commit;
mod cron;
mod cron_table;
mod decide;
mod events;
mod handle;
mod image;
mod inbox;
#[doc(hidden)]
pub mod inspect;
mod job_table;
mod legacy;
pub mod outbox;
mod pace;
mod progress;
mod queues;
#[doc(hidden)]
pub mod record;
mod registry;
pub mod requests;
mod state;
mod view;
mod webhooks;
pub mod workers;
mod workflow_table;
mod workflows;
mod writer;

pub use acks::{ACKS_MAX, AckItem, AckMany, AckOutcome};
pub use api::{
    Cancelled, ConflictReason, EngineError, Enqueued, FetchRequest, HeartbeatOutcome, QueueStats, Unavailable,
};
pub use cron_table::{CronEntry, CronWrite};
pub use decide::{EnqueueSlot, Entropy, SystemEntropy};
#[doc(hidden)]
pub use events::EventSink;
pub use events::{CronInfo, CronSkip, Event, EventId, EventKind, EventPage, SignalledWorker, WorkflowEvent};
pub use handle::{EngineHandle, Pending};
#[doc(hidden)]
pub use image::{IMAGE_VERSION, StateImage, decode_image};
pub use progress::ReportProgress;
pub use queues::PauseQueue;
pub use requests::Request;
pub use state::Retention;
#[doc(hidden)]
pub use state::State;
pub use view::{DeadLetterCursor, EngineFailure, QueueSummary};
pub use webhooks::{AttemptOutcome, AttemptResult, WebhookChange};
pub use workers::{WorkerEntry, WorkerSignal, WorkerState};
pub use workflow_table::{Callback, Member, MemberOutcome, ParentResults, Workflow, WorkflowFailure, WorkflowState};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::thread::JoinHandle;

use crate::clock::{Clock, SteadyClock, SystemClock};
use crate::job::{IdGenerator, Job, JobDefaults, SharedPolicies};
use crate::limits::{ENGINE_INBOX_BYTES_MAX, ENGINE_INBOX_MAX, SEGMENT_BYTES_MAX, SNAPSHOT_LOG_BYTES_DEFAULT};
use crate::storage::{
    DataDirLock, FileSystem, OpenSnapshot, RealFileSystem, SNAPSHOT_HEADER_BYTES, SnapshotPayload, StorageError,
    TailPolicy, WalWriter, list_segments, list_snapshots, open_snapshot, remove_obsolete, replay_log,
};
use job_table::LoadedJobs;
use record::{Record, decode_batch};
use view::ReadView;
use writer::{SnapshotPolicy, Writer};

/// How to open an engine: [`EngineConfig::new`], then change the fields
/// that differ from the defaults.
#[non_exhaustive]
pub struct EngineConfig {
    pub data_dir: PathBuf,
    pub clock: Arc<dyn Clock>,
    pub file_system: Arc<dyn FileSystem>,
    pub entropy: Box<dyn Entropy>,
    /// Log bytes between snapshots.
    pub snapshot_log_bytes: u64,
    /// Size at which a log segment is closed.
    pub segment_bytes: u64,
    pub retention: Retention,
    pub defaults: JobDefaults,
    /// Most cron entries (`limits.max_cron`).
    pub cron_entries_max: usize,
    /// Verify every invariant after each batch (tests; costs O(jobs) per batch).
    pub check_invariants: bool,
    /// Where the engine counts what it does (shared with the HTTP front end).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Where attempts of webhook deliveries go (the server's delivery pool);
    /// without one, events are not queued for subscriptions.
    pub deliveries: Option<outbox::DeliverySink>,
    /// How long one delivery attempt may take (`webhooks.timeout_s`).
    pub delivery_timeout_ms: i64,
    /// Bounds of subscriptions and deliveries.
    pub webhook_limits: outbox::WebhookLimits,
    /// Most registered schemas (`limits.max_schemas`).
    pub max_schemas: usize,
    /// Bytes the live jobs may hold before new jobs are refused (`limits.max_live_bytes`).
    pub max_live_bytes: u64,
}

impl EngineConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            clock: Arc::new(SystemClock),
            file_system: Arc::new(RealFileSystem),
            entropy: Box::new(SystemEntropy),
            snapshot_log_bytes: SNAPSHOT_LOG_BYTES_DEFAULT,
            segment_bytes: SEGMENT_BYTES_MAX,
            retention: Retention::default(),
            defaults: JobDefaults::default(),
            cron_entries_max: crate::limits::CRON_ENTRIES_MAX_DEFAULT,
            check_invariants: false,
            metrics: Arc::new(crate::metrics::Metrics::new()),
            deliveries: None,
            delivery_timeout_ms: outbox::ATTEMPT_TIMEOUT_MS_DEFAULT,
            webhook_limits: outbox::WebhookLimits::default(),
            max_schemas: crate::limits::SCHEMAS_MAX,
            max_live_bytes: crate::limits::LIVE_BYTES_MAX_DEFAULT,
        }
    }
}

/// A running engine. [`Engine::close`] stops it cleanly with a final snapshot.
pub struct Engine {
    handle: EngineHandle,
    thread: Option<JoinHandle<()>>,
    _lock: DataDirLock,
}

impl Engine {
    pub fn open(config: EngineConfig) -> Result<Engine, StorageError> {
        let lock = DataDirLock::acquire(&config.data_dir)?;
        let recovery_started = std::time::Instant::now();
        let (mut state, replay_from, last_segment, replayed_bytes) = recover(&config.data_dir, config.retention)?;
        state.set_max_live_bytes(config.max_live_bytes);
        let recovery_seconds = recovery_started.elapsed().as_secs_f64();
        config.metrics.recovery_seconds.set(recovery_seconds);
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
        if config.check_invariants {
            state.check_invariants().map_err(|reason| StorageError::Corrupt {
                path: config.data_dir.clone(),
                offset: 0,
                reason: format!("recovered state is inconsistent: {reason}"),
            })?;
        }
        let (sender, inbox) = inbox::inbox(ENGINE_INBOX_MAX, ENGINE_INBOX_BYTES_MAX);
        let view = Arc::new(ReadView::new(state.jobs.shared()));
        // The engine's time never goes back, not even across a restart.
        let clock: Arc<dyn Clock> = Arc::new(SteadyClock::new(config.clock, state.latest_at()));
        let handle =
            EngineHandle::new(sender, view.clone(), clock.clone(), config.defaults.clone(), config.metrics.clone());
        let committer = commit::Committer::new(wal, view.clone(), config.metrics.clone());
        let writer = Writer {
            state,
            clock,
            entropy: config.entropy,
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
            check_invariants: config.check_invariants,
            final_snapshot: true,
            contacts: workers::Contacts::default(),
            cron_entries_max: config.cron_entries_max,
            draining: false,
            last_worker_sweep: i64::MIN / 2,
            committer,
            parked: std::collections::VecDeque::new(),
            metrics: config.metrics,
            deliveries: config.deliveries,
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
        Ok(Engine { handle, thread: Some(thread), _lock: lock })
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
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop(true);
    }
}

type Recovered = (State, u64, Option<(u64, u64)>, u64);

/// Loads the newest snapshot and replays the log after it. A snapshot that
/// does not read back (damaged on disk) is passed over for the one before
/// it, whose log segments are kept for this (`remove_obsolete`), and if
/// none reads back, for the whole log when it is all still there.
pub fn recover(dir: &Path, retention: Retention) -> Result<Recovered, StorageError> {
    crate::storage::create_data_dir(dir)?;
    let mut first_error: Option<StorageError> = None;
    for (_, path) in list_snapshots(dir)?.iter().rev() {
        let loaded = load_snapshot(path, retention).and_then(|(state, replay_from)| replay(dir, state, replay_from));
        match loaded {
            Ok(recovered) => {
                if let Some(error) = &first_error {
                    tracing::warn!(snapshot = %path.display(), newer_one = %error, "recovered from an older snapshot");
                }
                return Ok(recovered);
            }
            Err(error) => {
                tracing::warn!(error = %error, "a snapshot does not read back");
                first_error.get_or_insert(error);
            }
        }
    }
    let whole_log = list_segments(dir)?.first().is_none_or(|(index, _)| *index == 0);
    match first_error {
        Some(error) if !whole_log => Err(error),
        first_error => replay(dir, State::new(retention), 0).map_err(|error| first_error.unwrap_or(error)),
    }
}

/// A snapshot's state and the first segment it does not cover.
fn load_snapshot(path: &Path, retention: Retention) -> Result<(State, u64), StorageError> {
    let OpenSnapshot { replay_from, payload_version, payload } = open_snapshot(path)?;
    let corrupt = |reason: String| StorageError::Corrupt {
        path: path.to_path_buf(),
        offset: SNAPSHOT_HEADER_BYTES as u64,
        reason,
    };
    let mut payload = payload;
    let (decoded, state) = if payload_version == image::IMAGE_VERSION {
        load_current_payload(&mut payload, retention)
    } else {
        let length = payload.remaining();
        (image::decode_image_from(payload_version, &mut payload, length), None)
    };
    // A failed read is reported as such, not as a payload that does not decode.
    if let Some(error) = payload.read_failure() {
        return Err(error);
    }
    let image = decoded.map_err(|error| corrupt(format!("snapshot does not decode: {error}")))?;
    // The checksum covers what was decoded: a damaged payload is refused here
    // even when it happened to decode.
    payload.finish()?;
    let state = match state {
        Some(mut state) => state.finish_loading(image).map(|()| state),
        None => State::from_image(image, retention),
    };
    Ok((state.map_err(corrupt)?, replay_from))
}

/// Loads a payload of the current version on three threads: one reads the
/// chunks of jobs and decodes every other one, a second decodes the rest,
/// and this one indexes them as they come, in payload order (decoding is
/// about two thirds of the work). Returns what was read besides the jobs,
/// and the state holding the jobs; on one thread only when no other can be
/// started.
fn load_current_payload(
    payload: &mut SnapshotPayload,
    retention: Retention,
) -> (Result<StateImage, String>, Option<State>) {
    use image::{ChunkedPayload, JobChunk};
    type Decoded = Result<Vec<Arc<Job>>, String>;
    let length = payload.remaining();
    let mut state = State::new(retention);
    let source = &mut *payload;
    let loaded = std::thread::scope(|scope| {
        let (to_helper, helper_in) = std::sync::mpsc::sync_channel::<JobChunk>(2);
        let (helper_out, from_helper) = std::sync::mpsc::sync_channel::<Decoded>(2);
        let (reader_out, from_reader) = std::sync::mpsc::sync_channel::<Decoded>(2);
        let (count_out, count_in) = std::sync::mpsc::sync_channel::<usize>(1);
        // Each thread's senders move into it: when it ends, its channels close.
        let helper = std::thread::Builder::new().name("svc-snapshot-decode".into()).spawn_scoped(scope, move || {
            let mut policies = SharedPolicies::default();
            for chunk in helper_in {
                if helper_out.send(chunk.decode(&mut policies)).is_err() {
                    break;
                }
            }
        });
        let Ok(helper) = helper else { return None };
        let reader = std::thread::Builder::new().name("svc-snapshot-read".into()).spawn_scoped(scope, move || {
            let (mut chunks, count) = ChunkedPayload::open(source, length)?;
            let _ = count_out.send(count);
            let mut policies = SharedPolicies::default();
            let gone = || "the loader stopped".to_string();
            for turn in 0u64.. {
                let Some(chunk) = chunks.next_chunk()? else { break };
                if turn % 2 == 0 {
                    to_helper.send(chunk).map_err(|_| gone())?;
                } else {
                    reader_out.send(chunk.decode(&mut policies)).map_err(|_| gone())?;
                }
            }
            chunks.rest()
        });
        let Ok(reader) = reader else { return None };
        let mut failed = None;
        let count = count_in.recv().unwrap_or(0);
        let mut loaded = LoadedJobs::new(image::jobs_to_reserve(count, length));
        let mut in_order = image::IdOrder::default();
        // Chunk n was decoded by the helper when n is even. A closed channel
        // means there are no more chunks (or the reader failed, said below).
        for turn in 0u64.. {
            let from = if turn % 2 == 0 { &from_helper } else { &from_reader };
            match from.recv() {
                Ok(jobs) => {
                    let indexed = jobs.and_then(|jobs| {
                        jobs.into_iter().try_for_each(|job| {
                            in_order.check(job.id)?;
                            state.load_job(job, &mut loaded);
                            Ok(())
                        })
                    });
                    if let Err(error) = indexed {
                        failed = Some(error);
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        state.store_loaded(loaded);
        drop((from_helper, from_reader));
        helper.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let read = reader.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        // The reader checked that the chunks hold as many jobs as the payload claims.
        Some(match (failed, read) {
            (Some(error), _) | (None, Err(error)) => Err(error),
            (None, Ok(rest)) => Ok(rest),
        })
    });
    match loaded {
        Some(loaded) => (loaded, Some(state)),
        None => (image::decode_image_from(image::IMAGE_VERSION, payload, length), None),
    }
}

/// Replays the log from segment `replay_from` onto `state`, on two threads:
/// one reads and decodes frames, this one applies their records as they come.
/// On one thread only when no second one can be started.
fn replay(dir: &Path, mut state: State, replay_from: u64) -> Result<Recovered, StorageError> {
    /// Decoded frames the reader may be ahead by: a frame can hold up to
    /// `FRAME_PAYLOAD_BYTES_MAX`, so few.
    const FRAMES_AHEAD: usize = 2;
    let mut events = EventSink::disabled();
    let mut replayed_bytes = 0u64;
    let (sender, receiver) = std::sync::mpsc::sync_channel::<DecodedFrame>(FRAMES_AHEAD);
    let state_ref = &mut state;
    let replayed = std::thread::scope(|scope| {
        let reader = std::thread::Builder::new().name("svc-log-decode".into()).spawn_scoped(scope, move || {
            let mut policies = SharedPolicies::default();
            replay_log(dir, replay_from, TailPolicy::Truncate, &mut |path, offset, payload| {
                let records = decode_frame(path, offset, payload, &mut policies)?;
                let frame = DecodedFrame { path: path.to_path_buf(), offset, records, bytes: payload.len() as u64 };
                // A closed channel: the applying side met an error and reports it.
                sender.send(frame).map_err(|_| StorageError::Corrupt {
                    path: path.to_path_buf(),
                    offset,
                    reason: "replay stopped".to_string(),
                })
            })
        });
        let Ok(reader) = reader else { return None };
        let mut applied = Ok(());
        for frame in receiver {
            applied = apply_frame(state_ref, &mut events, &frame.path, frame.offset, &frame.records);
            if applied.is_err() {
                break;
            }
            replayed_bytes += frame.bytes;
        }
        let end = reader.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        Some(applied.and(end))
    });
    let end = match replayed {
        Some(end) => end?,
        None => {
            let mut policies = SharedPolicies::default();
            replay_log(dir, replay_from, TailPolicy::Truncate, &mut |path, offset, payload| {
                let records = decode_frame(path, offset, payload, &mut policies)?;
                apply_frame(&mut state, &mut events, path, offset, &records)?;
                replayed_bytes += payload.len() as u64;
                Ok(())
            })?
        }
    };
    Ok((state, replay_from, end.last_segment, replayed_bytes))
}

/// Applies one frame's records; a record that does not apply makes the
/// frame corrupt.
fn apply_frame(
    state: &mut State,
    events: &mut EventSink,
    path: &Path,
    offset: u64,
    records: &[Record],
) -> Result<(), StorageError> {
    records.iter().try_for_each(|record| {
        state.apply(record, events).map_err(|error| StorageError::Corrupt {
            path: path.to_path_buf(),
            offset,
            reason: error.0,
        })
    })
}

/// A log frame's records, decoded ahead of being applied.
struct DecodedFrame {
    path: std::path::PathBuf,
    offset: u64,
    records: Vec<Record>,
    bytes: u64,
}

/// Decodes one frame's records; jobs made live share equal retry policies
/// (read back, each decoded its own).
fn decode_frame(
    path: &Path,
    offset: u64,
    payload: &[u8],
    policies: &mut SharedPolicies,
) -> Result<Vec<Record>, StorageError> {
    let mut records =
        decode_batch(payload).map_err(|reason| StorageError::Corrupt { path: path.to_path_buf(), offset, reason })?;
    for record in &mut records {
        let jobs = match record {
            Record::Enqueue { jobs, .. } => jobs.as_mut_slice(),
            Record::CronFire {
                fire: cron_table::CronFire { outcome: cron_table::CronOutcome::Enqueued { job, .. }, .. },
                ..
            } => std::slice::from_mut(job),
            _ => &mut [],
        };
        jobs.iter_mut().filter_map(Arc::get_mut).for_each(|job| policies.share(&mut job.retry));
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{snapshot_path, write_snapshot};

    fn load(dir: &Path, payload: &[u8]) -> Result<State, StorageError> {
        write_snapshot(&RealFileSystem, dir, 1, image::IMAGE_VERSION, payload)?;
        load_snapshot(&snapshot_path(dir, 1), Retention::default()).map(|(state, _)| state)
    }

    #[test]
    fn a_snapshot_loaded_on_three_threads_holds_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let written = image::tests::image_of(10_000);
        let state = load(dir.path(), &written.clone().encode()).unwrap();
        state.check_invariants().unwrap();
        let mut loaded = state.image();
        loaded.sort_jobs();
        let mut expected = written;
        expected.sort_jobs();
        assert_eq!(loaded.jobs, expected.jobs);
        assert_eq!(loaded.paused_queues, expected.paused_queues);
        assert_eq!(loaded.dispatch_claims, expected.dispatch_claims);
    }

    #[test]
    fn a_damaged_snapshot_is_refused_by_the_three_thread_loader() {
        let dir = tempfile::tempdir().unwrap();
        // Enough chunks (25) that the threads' channels fill up and a thread
        // stopping early meets the others blocked.
        let payload = image::tests::image_of(100_000).encode();
        for (damage, bytes) in image::tests::damaged_payloads(&payload) {
            let error = load(dir.path(), &bytes).err().unwrap_or_else(|| panic!("{damage}: loaded"));
            assert!(error.to_string().contains("does not decode"), "{damage}: {error}");
        }
    }

    #[test]
    fn an_older_image_holding_a_job_twice_is_refused() {
        let mut image = image::tests::image_of(10);
        image.jobs.push(image.jobs[3].clone());
        let Err(error) = State::from_image(image, Retention::default()) else { panic!("a job held twice was loaded") };
        assert!(error.contains("held twice"), "{error}");
    }
}
