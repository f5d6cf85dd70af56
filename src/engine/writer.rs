//! The engine thread: the single writer.
//!
//! Each turn: wait for a command or the next deadline → take a batch of
//! commands → one `now` → decide and apply due timers and each command →
//! encode the turn's records, write them as one frame and `fdatasync` once
//! (`commit.rs`) → publish the changes and send the replies. No reply leaves
//! before its record is durable; commands that arrive during the sync form
//! the next turn's batch.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::command::{Cancelled, Command, EngineError};
use super::commit::{Committer, Outgoing, ViewDelta, storage_failed};
use super::decide::Entropy;
use super::events::{Event, EventId, EventKind, EventSink, JobRef};
use super::inbox::{InboxReceiver, Received};
use super::record::{Record, encode_sequences};
use super::state::{State, StateImage};
use super::view::ReadView;
use super::workers::{Contacts, WorkerEntry, WorkerSignal, state_name};
use crate::clock::{Clock, Millis};
use crate::job::{IdGenerator, Job};
use crate::limits::ENGINE_BATCH_COMMANDS_MAX;
use crate::storage::{FileSystem, StorageError, remove_obsolete, write_snapshot};

/// Most due jobs handled in one turn; the rest follow in the next turn at once.
const DUE_JOBS_PER_TURN_MAX: usize = 10_000;
/// Most due cron entries fired in one turn; the rest follow in the next turn at once.
const DUE_CRONS_PER_TURN_MAX: usize = 1_000;
/// The most log bytes one due job's record takes (a promotion, a claim's
/// timeout with its outcome), used to size turns while the disk is full.
const DUE_RECORD_BYTES_MAX: u64 = 64;
/// With the disk full, claims stop while this much log space is left, so
/// that the jobs already claimed can still be acked.
const FULL_DISK_ACK_RESERVE_BYTES: u64 = 1024 * 1024;
/// The longest the engine sleeps with nothing due.
const IDLE_WAIT_MAX: Duration = Duration::from_secs(1);

/// Where and how often snapshots are written.
pub(crate) struct SnapshotPolicy {
    pub dir: PathBuf,
    pub file_system: Arc<dyn FileSystem>,
    pub log_bytes: u64,
}

pub(crate) struct Writer {
    pub state: State,
    pub clock: Arc<dyn Clock>,
    pub entropy: Box<dyn Entropy>,
    pub inbox: InboxReceiver,
    pub view: Arc<ReadView>,
    pub snapshots: SnapshotPolicy,
    pub bytes_since_snapshot: u64,
    pub snapshot_busy: Arc<AtomicBool>,
    pub event_ids: IdGenerator,
    pub event_seq: u64,
    pub check_invariants: bool,
    /// Whether stopping writes a snapshot (false only to imitate a crash).
    pub final_snapshot: bool,
    /// When each worker was last seen (soft state; signals are in `state`).
    pub contacts: Contacts,
    pub cron_entries_max: usize,
    /// Set when a graceful shutdown begins: no more cron firings.
    pub draining: bool,
    /// When idle workers were last looked for.
    pub last_worker_sweep: Millis,
    /// Owns the log: writes, syncs, publishes and replies.
    pub committer: Committer,
}

/// Answers `command` with `error` without handling it; true for a shutdown
/// (which is answered `Ok`: the engine stops).
fn refuse(command: Command, error: &EngineError) -> bool {
    let error = error.clone();
    let _ = match command {
        Command::Enqueue { reply, .. } | Command::Fetch { reply, .. } => reply.send(Err(error)).map_err(drop),
        Command::Ack { reply, .. } | Command::Fail { reply, .. } | Command::DeadLetterRetry { reply, .. } => {
            reply.send(Err(error)).map_err(drop)
        }
        Command::DeadLetterDelete { reply, .. } => reply.send(Err(error)).map_err(drop),
        Command::CronPut { reply, .. } => reply.send(Err(error)).map_err(drop),
        Command::CronDelete { reply, .. } => reply.send(Err(error)).map_err(drop),
        Command::Heartbeat { reply, .. } => reply.send(Err(error)).map_err(drop),
        Command::SignalWorker { reply, .. } => reply.send(Err(error)).map_err(drop),
        Command::ForgetWorker { reply, .. } => reply.send(Err(error)).map_err(drop),
        Command::Cancel { reply, .. } => reply.send(Err(error)).map_err(drop),
        Command::Probe { reply }
        | Command::Tick { reply }
        | Command::Snapshot { reply }
        | Command::BeginDrain { reply } => reply.send(Err(error)).map_err(drop),
        Command::Image { reply } => reply.send(Err(error)).map_err(drop),
        Command::Shutdown { reply, .. } => {
            let _ = reply.send(Ok(()));
            return true;
        }
    };
    false
}

/// The error of a write refused because the disk is full.
fn disk_full() -> EngineError {
    EngineError::Unavailable { reason: "disk_full" }
}

/// The bytes `records` take encoded.
fn encoded_bytes(records: &[Record]) -> u64 {
    records.iter().map(|record| postcard::experimental::serialized_size(record).unwrap_or(0) as u64).sum()
}

/// A turn's records, applied to the state, with the replies and events that
/// wait for them.
struct Staged {
    records: Vec<Record>,
    replies: Vec<Outgoing>,
    events: EventSink,
}

impl Staged {
    fn new() -> Staged {
        Staged { records: Vec::new(), replies: Vec::new(), events: EventSink::enabled() }
    }

    fn is_empty(&self) -> bool {
        self.records.is_empty() && self.replies.is_empty() && self.events.is_empty()
    }
}

/// Marks the engine failed if the writer thread unwinds, so that health,
/// readiness and the server see it at once instead of a silent inbox.
struct FailOnUnwind(Arc<ReadView>);

impl Drop for FailOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            crate::logging::error("the engine thread stopped; the server must restart", &[]);
            self.0.set_failure(super::view::EngineFailure::EngineStopped);
        }
    }
}

impl Writer {
    pub fn run(mut self) {
        let _fail_on_unwind = FailOnUnwind(self.view.clone());
        // The recovered state, for readers, before the first command.
        let initial = self.collect_delta(Vec::new());
        initial.publish(&self.view);
        loop {
            let mut batch = Vec::new();
            if self.inbox.receive(&mut batch, ENGINE_BATCH_COMMANDS_MAX, self.idle_wait()) == Received::Disconnected {
                break;
            }
            // An empty batch: a deadline came with no command.
            if self.turn(batch) {
                break;
            }
        }
        if self.final_snapshot
            && !self.committer.failed()
            && let Err(error) = self.snapshot_now()
        {
            crate::logging::error("final snapshot failed", &[("error", error.to_string().into())]);
        }
        // A background snapshot still writing must finish before the data dir
        // is unlocked.
        while self.snapshot_busy.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// How long to wait for commands before the next deadline is due.
    fn idle_wait(&self) -> Duration {
        let now = self.clock.now_ms();
        match self.state.next_deadline() {
            Some(deadline) if deadline <= now => Duration::ZERO,
            Some(deadline) => Duration::from_millis((deadline - now) as u64).min(IDLE_WAIT_MAX),
            None => IDLE_WAIT_MAX,
        }
    }

    /// Handles one batch; returns true when the engine should stop.
    fn turn(&mut self, batch: Vec<Command>) -> bool {
        if self.committer.failed() {
            return self.refuse_all(batch);
        }
        let now = self.clock.now_ms();
        let mut staged = Staged::new();
        let mut stop = false;
        let mut snapshot_requests = Vec::new();
        let mut image_requests = Vec::new();
        // With the disk full, the log bytes this turn may still use.
        let mut budget = self.committer.space_budget();
        let full_disk = budget.is_some();
        self.note_disk_full(full_disk);
        {
            let Staged { records, replies, events } = &mut staged;
            let due_limit = budget.map_or(DUE_JOBS_PER_TURN_MAX, |bytes| {
                DUE_JOBS_PER_TURN_MAX.min((bytes / DUE_RECORD_BYTES_MAX) as usize)
            });
            for record in self.state.decide_due(now, due_limit, self.entropy.as_mut()) {
                self.apply(record, records, events);
            }
            if let Some(bytes) = budget.as_mut() {
                *bytes = bytes.saturating_sub(encoded_bytes(records));
            } else {
                self.forget_idle_workers(now, records, events);
                // A draining server fires no cron entries (decisions §26), nor
                // does one whose disk is full (the entry fires late, as after downtime).
                if !self.draining {
                    for record in self.state.decide_cron_due(now, DUE_CRONS_PER_TURN_MAX, self.entropy.as_mut()) {
                        self.apply(record, records, events);
                    }
                }
            }
            for command in batch {
                match command {
                    Command::Shutdown { snapshot, reply } => {
                        stop = true;
                        self.final_snapshot = snapshot;
                        replies.push(Outgoing::Unit(reply, Ok(())));
                    }
                    Command::Image { reply } => image_requests.push(reply),
                    Command::Snapshot { reply } => snapshot_requests.push(reply),
                    command => {
                        if let Some(bytes) = budget.as_mut()
                            && !self.admit_on_full_disk(&command, bytes)
                        {
                            stop |= refuse(command, &disk_full());
                            continue;
                        }
                        self.handle(command, now, records, events, replies)
                    }
                }
            }
            // The caps on terminal jobs hold after every turn (with the disk
            // full, pruning waits: it frees memory, not disk).
            if budget.is_none()
                && let Some(record) = self.state.decide_capped_prune(now, DUE_JOBS_PER_TURN_MAX)
            {
                self.apply(record, records, events);
            }
        }
        if self.check_invariants
            && let Err(problem) = self.state.check_invariants()
        {
            panic!("engine invariant broken after a batch: {problem}");
        }

        self.commit(staged);
        for reply in image_requests {
            let mut image = self.state.image();
            image.sort_jobs();
            let _ = reply.send(Ok(image));
        }
        for reply in snapshot_requests {
            let result = self.snapshot_now().map_err(|_| EngineError::Unavailable { reason: "snapshot_failed" });
            let _ = reply.send(result);
        }
        // A snapshot needs a new segment and room for its file: not while the disk is full.
        if !stop && !full_disk {
            self.maybe_start_snapshot();
        }
        stop
    }

    fn apply(&mut self, record: Record, records: &mut Vec<Record>, events: &mut EventSink) {
        self.state.apply(&record, events).expect("a record decided against this state applies to it");
        records.push(record);
    }

    fn handle(
        &mut self,
        command: Command,
        now: Millis,
        records: &mut Vec<Record>,
        events: &mut EventSink,
        outgoing: &mut Vec<Outgoing>,
    ) {
        match command {
            Command::Enqueue { jobs, reply } => {
                let result = self.state.decide_enqueue(now, jobs, self.entropy.as_mut()).map(|record| {
                    let Record::Enqueue { jobs, .. } = &record else {
                        unreachable!("decide_enqueue makes enqueue records")
                    };
                    let ids: Vec<_> = jobs.iter().map(|job| job.id).collect();
                    self.apply(record, records, events);
                    ids.iter().map(|id| self.current(*id)).collect()
                });
                outgoing.push(Outgoing::Jobs(reply, result));
            }
            Command::Fetch { request, reply } => {
                let mut claimed = Vec::new();
                let signalled = request.worker_id.as_deref().is_some_and(|worker| {
                    self.touch_worker(worker, now, false, events);
                    self.state.worker_signal(worker).is_some()
                });
                // A quiet or terminating worker gets no new jobs.
                if let Some(record) = self.state.decide_fetch(now, &request).filter(|_| !signalled) {
                    let Record::Claim { claims, .. } = &record else {
                        unreachable!("decide_fetch makes claim records")
                    };
                    let ids: Vec<_> = claims.iter().map(|claim| claim.id).collect();
                    self.apply(record, records, events);
                    claimed = ids.iter().map(|id| self.current(*id)).collect();
                }
                outgoing.push(Outgoing::Jobs(reply, Ok(claimed)));
            }
            Command::Ack { id, result, worker_id, reply } => {
                let outcome = self.state.decide_ack(now, id, result, worker_id.as_deref()).map(|record| {
                    self.apply(record, records, events);
                    self.current(id)
                });
                outgoing.push(Outgoing::Job(reply, outcome));
            }
            Command::Fail { id, report, requeue, worker_id, reply } => {
                let outcome = self
                    .state
                    .decide_fail(now, id, report, requeue, worker_id.as_deref(), self.entropy.as_mut())
                    .map(|record| {
                        self.apply(record, records, events);
                        self.current(id)
                    });
                outgoing.push(Outgoing::Job(reply, outcome));
            }
            Command::Heartbeat { worker_id, active_jobs, visibility_timeout_ms, reply } => {
                self.touch_worker(&worker_id, now, true, events);
                let signal = self.state.worker_signal(&worker_id).map(|(signal, _)| signal);
                let record =
                    self.state.decide_heartbeat(now, &worker_id, active_jobs.as_deref(), visibility_timeout_ms);
                let extended = match &record {
                    Some(Record::Heartbeat { extensions, .. }) => extensions.len(),
                    _ => 0,
                };
                if let Some(record) = record {
                    self.apply(record, records, events);
                }
                outgoing.push(Outgoing::Beat(reply, Ok((extended, signal))));
            }
            Command::SignalWorker { worker_id, signal, reply } => {
                let outcome = self.decide_signal(now, &worker_id, signal).map(|record| {
                    self.apply(record, records, events);
                    self.worker_entry(&worker_id).expect("a signalled worker has an entry")
                });
                outgoing.push(Outgoing::Worker(reply, outcome));
            }
            Command::ForgetWorker { worker_id, reply } => {
                let outcome = if self.worker_entry(&worker_id).is_some() {
                    self.contacts.forget(&worker_id);
                    self.apply(Record::WorkerForget { at: now, worker_id }, records, events);
                    Ok(())
                } else {
                    Err(EngineError::WorkerNotFound { worker_id })
                };
                outgoing.push(Outgoing::Unit(reply, outcome));
            }
            Command::DeadLetterRetry { id, reply } => {
                let outcome = self.state.decide_dead_letter_retry(now, id).map(|record| {
                    self.apply(record, records, events);
                    self.current(id)
                });
                outgoing.push(Outgoing::Job(reply, outcome));
            }
            Command::CronPut { definition, write, reply } => {
                let outcome = self.state.decide_cron_put(now, definition, write, self.cron_entries_max).map(
                    |(record, created)| {
                        let Record::CronPut { entry, .. } = &record else {
                            unreachable!("decide_cron_put makes cron records")
                        };
                        let name = entry.definition.name.clone();
                        self.apply(record, records, events);
                        (self.state.crons().get(&name).cloned().expect("a cron entry just put is stored"), created)
                    },
                );
                outgoing.push(Outgoing::CronPut(reply, outcome));
            }
            Command::CronDelete { name, reply } => {
                let outcome = self.state.decide_cron_delete(now, &name).map(|record| {
                    let entry = self.state.crons().get(&name).cloned().expect("a cron entry to delete is stored");
                    self.apply(record, records, events);
                    entry
                });
                outgoing.push(Outgoing::Cron(reply, outcome));
            }
            Command::DeadLetterDelete { id, reply } => {
                let outcome =
                    self.state.decide_dead_letter_delete(now, id).map(|record| self.apply(record, records, events));
                outgoing.push(Outgoing::Unit(reply, outcome));
            }
            Command::Cancel { id, reply } => {
                let outcome = self.state.decide_cancel(now, id).map(|record| {
                    let previous_state = self.current(id).state;
                    if let Some(record) = record {
                        self.apply(record, records, events);
                    }
                    Cancelled { job: self.current(id), previous_state }
                });
                outgoing.push(Outgoing::Cancelled(reply, outcome));
            }
            Command::BeginDrain { reply } => {
                self.begin_drain(now, events);
                outgoing.push(Outgoing::Unit(reply, Ok(())));
            }
            Command::Probe { reply } | Command::Tick { reply } => outgoing.push(Outgoing::Unit(reply, Ok(()))),
            Command::Snapshot { .. } | Command::Shutdown { .. } | Command::Image { .. } => {
                unreachable!("handled by the batch loop")
            }
        }
    }

    /// Records contact with a worker, forgetting an idle one if the registry is full.
    fn touch_worker(&mut self, worker_id: &str, now: Millis, heartbeat: bool, events: &mut EventSink) {
        let state = &self.state;
        let touched = self.contacts.touch(worker_id, now, heartbeat, crate::limits::WORKERS_MAX, |worker| {
            !state.active_of_worker(worker).is_empty()
        });
        if touched.new && self.state.worker_signal(worker_id).is_none() {
            events.push_other(now, EventKind::WorkerStarted { worker_id: worker_id.to_string() });
        }
        self.state.touch_worker(worker_id);
        if let Some(forgotten) = touched.forgotten {
            self.state.touch_worker(&forgotten);
        }
    }

    /// Forgets workers idle for a day: no contact, no active jobs (decisions §16).
    fn forget_idle_workers(&mut self, now: Millis, records: &mut Vec<Record>, events: &mut EventSink) {
        if now - self.last_worker_sweep < crate::limits::WORKER_SWEEP_EVERY_MS {
            return;
        }
        self.last_worker_sweep = now;
        let cutoff = now - crate::limits::WORKER_FORGET_MS;
        for worker_id in self.contacts.seen_before(cutoff) {
            if self.state.active_of_worker(&worker_id).is_empty() {
                self.contacts.forget(&worker_id);
                self.state.touch_worker(&worker_id);
            }
        }
        // Signals outlive contact; one given long ago to a worker not seen since goes too.
        let signalled: Vec<String> = self
            .state
            .signalled_workers()
            .filter(|worker_id| {
                self.contacts.get(worker_id).is_none()
                    && self.state.worker_signal(worker_id).is_some_and(|(_, at)| at < cutoff)
                    && self.state.active_of_worker(worker_id).is_empty()
            })
            .cloned()
            .collect();
        for worker_id in signalled {
            self.apply(Record::WorkerForget { at: now, worker_id }, records, events);
        }
    }

    /// A drain began: fire no more cron entries, and tell each live worker to terminate.
    fn begin_drain(&mut self, now: Millis, events: &mut EventSink) {
        self.draining = true;
        for worker_id in self.contacts.seen_since(now - crate::limits::WORKER_STALE_MS) {
            let active_job_ids = self.state.active_of_worker(&worker_id);
            events.push_other(
                now,
                EventKind::WorkerSignalled { worker_id, terminate: true, active_job_ids, by: "shutdown" },
            );
        }
    }

    /// Checks a signal against the worker's state (decisions §7.6).
    fn decide_signal(&self, now: Millis, worker_id: &str, signal: WorkerSignal) -> Result<Record, EngineError> {
        let Some(entry) = self.worker_entry(worker_id) else {
            return Err(EngineError::WorkerNotFound { worker_id: worker_id.to_string() });
        };
        if signal == WorkerSignal::Quiet && entry.state == "terminate" {
            return Err(EngineError::WorkerConflict { worker_id: worker_id.to_string(), current_state: entry.state });
        }
        Ok(Record::WorkerSignal { at: now, worker_id: worker_id.to_string(), signal })
    }

    /// The registry entry of a worker seen since start or holding a signal.
    fn worker_entry(&self, worker_id: &str) -> Option<WorkerEntry> {
        let contact = self.contacts.get(worker_id);
        let signal = self.state.worker_signal(worker_id);
        let (first_seen_at, last_seen_at) = match (contact, signal) {
            (Some(contact), _) => (contact.first_seen_at, contact.last_seen_at),
            (None, Some((_, at))) => (at, at),
            (None, None) => return None,
        };
        Some(WorkerEntry {
            worker_id: worker_id.to_string(),
            state: state_name(signal.map(|(signal, _)| signal)),
            first_seen_at,
            last_seen_at,
            last_heartbeat_at: contact.and_then(|contact| contact.last_heartbeat_at),
            active_job_ids: self.state.active_of_worker(worker_id),
        })
    }

    fn current(&self, id: crate::job::JobId) -> Arc<Job> {
        self.state.job(id).cloned().expect("a job just decided on is stored")
    }

    /// Encodes a turn's records and makes them durable, then publishes the
    /// view changes and sends the replies that waited for them.
    fn commit(&mut self, staged: Staged) {
        if staged.is_empty() {
            return;
        }
        let Staged { records, replies, mut events } = staged;
        let sequences = encode_sequences(&records);
        self.bytes_since_snapshot += sequences.iter().map(|sequence| sequence.len() as u64).sum::<u64>();
        let delta = self.collect_delta(events.take());
        self.committer.commit(&sequences, delta, replies);
    }

    fn refuse_all(&mut self, batch: Vec<Command>) -> bool {
        let error = storage_failed();
        let mut stop = false;
        for command in batch {
            if refuse(command, &error) {
                stop = true;
                self.final_snapshot = false;
            }
        }
        stop
    }

    /// Tells readers (health) whether the disk is full, logging each change.
    fn note_disk_full(&mut self, full: bool) {
        if self.view.disk_full() != full {
            if full {
                crate::logging::error("the disk is full: new work is refused until space is freed", &[]);
            } else {
                crate::logging::info("disk space is back: taking new work again", &[]);
            }
            self.view.set_disk_full(full);
        }
    }

    /// With the disk full, whether `command` may use some of the `budget`
    /// of log bytes left (and takes its share). Work already accepted may
    /// still end (ack, nack, cancel, heartbeats, the dead letter's delete);
    /// new work may not (enqueue, cron changes, dead letter retries), and
    /// claims leave room for the acks they will need.
    fn admit_on_full_disk(&self, command: &Command, budget: &mut u64) -> bool {
        /// A record's fixed part: its kind, times and ids, generously.
        const FIXED: u64 = 96;
        let bound = match command {
            Command::Enqueue { .. } | Command::CronPut { .. } | Command::DeadLetterRetry { .. } => return false,
            // These write nothing.
            Command::Probe { .. } | Command::Tick { .. } | Command::BeginDrain { .. } => return true,
            Command::Fetch { request, .. } => {
                let claims = request.count as u64 * DUE_RECORD_BYTES_MAX;
                let bound = FIXED + claims + request.worker_id.as_ref().map_or(0, |id| id.len() as u64);
                if bound.saturating_add(FULL_DISK_ACK_RESERVE_BYTES) > *budget {
                    return false;
                }
                bound
            }
            Command::Heartbeat { worker_id, active_jobs, .. } => {
                let listed = match active_jobs {
                    Some(ids) => ids.len(),
                    None => self.state.active_of_worker(worker_id).len(),
                };
                FIXED + listed as u64 * DUE_RECORD_BYTES_MAX
            }
            other => FIXED + other.held_bytes(),
        };
        if bound > *budget {
            return false;
        }
        *budget -= bound;
        true
    }

    /// Copies what changed since the last turn out of the state, and turns
    /// the pending events into published ones.
    fn collect_delta(&mut self, pending: Vec<(Millis, EventKind, JobRef)>) -> ViewDelta {
        let workers = self
            .state
            .take_dirty_workers()
            .into_iter()
            .map(|worker| {
                let entry = self.worker_entry(&worker);
                (worker, entry)
            })
            .collect();
        let crons = self
            .state
            .crons
            .take_dirty()
            .into_iter()
            .map(|name| {
                let entry = self.state.crons().get(&name).cloned();
                (name, entry)
            })
            .collect();
        let jobs = self.state.take_dirty().into_iter().map(|id| (id, self.state.job(id).cloned())).collect();
        let queues = self.state.take_dirty_queues();
        let mut events = Vec::with_capacity(pending.len());
        for (time, kind, job) in pending {
            let job = match job {
                JobRef::Id(id) => match self.state.job(id) {
                    Some(job) => Some(job.clone()),
                    None => continue,
                },
                JobRef::Gone(job) => Some(job),
                JobRef::None => None,
            };
            self.event_seq += 1;
            let event_id = self.event_ids.next(time, rand::random());
            events.push(Event { seq: self.event_seq, id: EventId(event_id), time, kind, job });
        }
        ViewDelta { jobs, workers, crons, queues, events }
    }

    /// Starts a new segment and takes the state's image as of that boundary.
    /// The image shares the jobs with the state, so this costs a pointer per
    /// job; sorting and encoding it is left to whoever writes it.
    fn snapshot_image(&mut self) -> Result<(u64, StateImage), StorageError> {
        // Every record so far is durable and before the boundary: the image includes them.
        let replay_from = self.committer.rotate()?;
        let image = self.state.image();
        self.bytes_since_snapshot = 0;
        Ok((replay_from, image))
    }

    /// Writes a snapshot on this thread and waits for it to be durable.
    fn snapshot_now(&mut self) -> Result<(), StorageError> {
        while self.snapshot_busy.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let (replay_from, image) = self.snapshot_image()?;
        let payload = image.encode();
        write_snapshot(
            self.snapshots.file_system.as_ref(),
            &self.snapshots.dir,
            replay_from,
            super::state::IMAGE_VERSION,
            &payload,
        )?;
        remove_obsolete(&self.snapshots.dir, replay_from)
    }

    /// Starts a background snapshot once enough log has been written.
    fn maybe_start_snapshot(&mut self) {
        if self.bytes_since_snapshot < self.snapshots.log_bytes || self.snapshot_busy.load(Ordering::SeqCst) {
            return;
        }
        let (replay_from, image) = match self.snapshot_image() {
            Ok(snapshot) => snapshot,
            Err(error) => {
                crate::logging::error("could not start a snapshot", &[("error", error.to_string().into())]);
                return;
            }
        };
        self.snapshot_busy.store(true, Ordering::SeqCst);
        let busy = self.snapshot_busy.clone();
        let file_system = self.snapshots.file_system.clone();
        let dir = self.snapshots.dir.clone();
        std::thread::spawn(move || {
            let payload = image.encode();
            let result = write_snapshot(file_system.as_ref(), &dir, replay_from, super::state::IMAGE_VERSION, &payload)
                .and_then(|()| remove_obsolete(&dir, replay_from));
            match result {
                Ok(()) => crate::logging::info(
                    "snapshot written",
                    &[("replay_from_segment", replay_from.into()), ("bytes", payload.len().into())],
                ),
                // The log segments are still there, so nothing is lost; the next
                // snapshot tries again.
                Err(error) => crate::logging::error("snapshot failed", &[("error", error.to_string().into())]),
            }
            busy.store(false, Ordering::SeqCst);
        });
    }
}
