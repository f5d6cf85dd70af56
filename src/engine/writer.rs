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

use super::api::{EngineError, Unavailable};
use super::commit::{Committer, ViewDelta, storage_failed};
use super::counting::EventCounter;
use super::events::{Event, EventId, EventKind, EventSink, JobRef};
use super::image::StateImage;
use super::inbox::{Command, InboxReceiver, Received};
use super::jobs::decide::Entropy;
use super::pace::PaceSignals;
use super::record::{Logged, encode_sequences_into};
use super::requests::{Parked, RECORD_BYTES_PER_JOB, Ran, Responder, Turn};
use super::snapshot::{BackgroundSnapshot, write_in_place};
use super::state::State;
use super::view::ReadView;
use super::webhooks::outbox::{self, QUEUED_RECORD_BODY_BYTES_MAX, QUEUED_RECORD_DELIVERIES_MAX};
use super::workers::entry::Contacts;
use super::workers::registry;
use crate::clock::{Clock, Millis};
use crate::job::IdGenerator;
use crate::job::{DeliveryId, SubscriptionId};
use crate::limits::{ENGINE_BATCH_BYTES_MAX, ENGINE_BATCH_COMMANDS_MAX};
use crate::storage::{FileSystem, StorageError, read_newest_into_page_cache};

/// Most due jobs handled in one turn; the rest follow in the next turn at once.
const DUE_JOBS_PER_TURN_MAX: usize = 10_000;
/// Most due cron entries fired in one turn; the rest follow in the next turn at once.
const DUE_CRONS_PER_TURN_MAX: usize = 1_000;
/// The longest the engine sleeps with nothing due.
const IDLE_WAIT_MAX: Duration = Duration::from_secs(1);

/// Where and how often snapshots are written.
pub(crate) struct SnapshotPolicy {
    pub dir: PathBuf,
    pub file_system: Arc<dyn FileSystem>,
    pub log_bytes: u64,
}

pub(crate) struct Writer {
    pub metrics: Arc<crate::metrics::Metrics>,
    pub state: State,
    pub clock: Arc<dyn Clock>,
    pub entropy: Box<dyn Entropy>,
    pub inbox: InboxReceiver,
    pub view: Arc<ReadView>,
    pub snapshots: SnapshotPolicy,
    pub bytes_since_snapshot: u64,
    pub snapshot_busy: Arc<AtomicBool>,
    /// What a background snapshot's pace goes by (`pace`): whether requests
    /// are being logged, and whether to hurry.
    pub snapshot_pace: Arc<PaceSignals>,
    /// The newest snapshot image taken was written out (or none was taken
    /// since recovery): with nothing logged since, the data dir then loads
    /// without replay as it is.
    pub snapshot_written: Arc<AtomicBool>,
    /// A snapshot that could not start (no descriptor or no space for its
    /// segment) is not tried again before this.
    pub snapshot_retry_at: Option<std::time::Instant>,
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
    /// Long-poll fetches waiting for work, oldest first.
    pub parked: std::collections::VecDeque<Box<dyn Parked>>,
    /// Where delivery attempts go; `None`: events are not queued for webhooks.
    pub deliveries: Option<super::webhooks::outbox::DeliverySink>,
    pub delivery_timeout_ms: i64,
    /// Attempts handed to the pool and not yet reported back.
    pub in_flight: super::webhooks::outbox::InFlight,
    /// When the outbox next has an attempt that may start: `None` while
    /// every due delivery waits for room (an outcome coming back wakes the
    /// engine), or while no attempts start at all.
    pub outbox_wake: Option<Millis>,
    pub webhook_limits: super::webhooks::outbox::WebhookLimits,
    /// Dropped and abandoned deliveries, logged as counts once a minute.
    pub delivery_log: super::webhooks::outbox::DeliveryLog,
    pub max_schemas: usize,
    /// The room the last turn's events took, kept for the next turn (a fill
    /// turn holds thousands; growing it afresh each turn was copied over a
    /// dozen times).
    pub event_buffer: Vec<(Millis, EventKind, JobRef)>,
    /// The room the last turn's encoded records took, kept for the next.
    pub record_buffer: Vec<u8>,
}

/// The most pending events whose room is kept from one turn to the next
/// (a turn of 32 batches of 100 holds 3 200; each takes about 200 bytes).
const EVENT_BUFFER_KEPT_MAX: usize = 8_192;
/// The most bytes of encoded records whose room is kept from one turn to the
/// next (such a turn encodes about 1 MiB); an unusually large turn's room
/// is given back rather than held while the server idles.
const RECORD_BUFFER_KEPT_MAX: usize = 4 * 1024 * 1024;

/// The deliveries of one `DeliveriesQueuedOnce` record being gathered.
#[derive(Default)]
struct QueuedChunk {
    events: Vec<super::webhooks::outbox::QueuedEvent>,
    deliveries: Vec<super::webhooks::outbox::QueuedDelivery>,
    body_bytes: usize,
}

impl QueuedChunk {
    fn is_empty(&self) -> bool {
        self.deliveries.is_empty()
    }

    /// Adds a delivery of the event whose body is `body` (its events are
    /// added in turn, so one already added is the last); whether the record
    /// is full now.
    fn add(
        &mut self,
        id: DeliveryId,
        subscription: SubscriptionId,
        event_type: &str,
        body: &Arc<str>,
        at: Millis,
    ) -> bool {
        let same_event = self.events.last().is_some_and(|last| Arc::ptr_eq(&last.body, body));
        if !same_event {
            self.events
                .push(super::webhooks::outbox::QueuedEvent { event_type: event_type.to_string(), body: body.clone() });
            self.body_bytes += body.len();
        }
        let event = (self.events.len() - 1) as u32;
        self.deliveries.push(super::webhooks::outbox::QueuedDelivery { id, subscription, event, next_at: at });
        self.body_bytes >= QUEUED_RECORD_BODY_BYTES_MAX || self.deliveries.len() >= QUEUED_RECORD_DELIVERIES_MAX
    }

    fn take(&mut self, at: Millis) -> Logged {
        self.body_bytes = 0;
        let events = std::mem::take(&mut self.events);
        let deliveries = std::mem::take(&mut self.deliveries);
        Logged::new(at, super::webhooks::record::DeliveriesQueuedOnce { events, deliveries })
    }
}

/// How long a snapshot that could not start waits before it is tried again.
const SNAPSHOT_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// The error of a write refused because the disk is full.
fn disk_full() -> EngineError {
    EngineError::Unavailable { reason: Unavailable::DiskFull }
}

/// The bytes `records` take encoded.
fn encoded_bytes(records: &[Logged]) -> u64 {
    records.iter().map(|record| postcard::experimental::serialized_size(record).unwrap_or(0) as u64).sum()
}

/// A turn's records, applied to the state, with the replies and events that
/// wait for them.
struct Staged {
    records: Vec<Logged>,
    replies: Vec<Responder>,
    events: EventSink,
}

impl Staged {
    /// An empty turn whose events go into `event_buffer`.
    fn new(event_buffer: Vec<(Millis, EventKind, JobRef)>) -> Staged {
        Staged { records: Vec::new(), replies: Vec::new(), events: EventSink::reusing(event_buffer) }
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
            tracing::error!("the engine thread stopped; the server must restart");
            self.0.set_failure(super::view::EngineFailure::EngineStopped);
        }
    }
}

impl Writer {
    pub fn run(mut self) {
        let _fail_on_unwind = FailOnUnwind(self.view.clone());
        // The recovered state, for readers, before the first command.
        let initial = self.collect_delta(Vec::new());
        initial.publish(&self.view, &mut self.state.jobs);
        self.outbox_wake = self.deliveries.as_ref().and(self.state.outbox.next_due());
        loop {
            let mut batch = Vec::new();
            if self.inbox.receive(&mut batch, ENGINE_BATCH_COMMANDS_MAX, ENGINE_BATCH_BYTES_MAX, self.idle_wait())
                == Received::Disconnected
            {
                break;
            }
            // An empty batch: a deadline came with no command.
            if self.turn(batch) {
                break;
            }
        }
        // A background snapshot still writing must finish before the data dir
        // is unlocked.
        self.wait_for_snapshot();
        if self.final_snapshot && !self.committer.failed() {
            if self.bytes_since_snapshot == 0 && self.snapshot_written.load(Ordering::SeqCst) {
                // Nothing changed since the newest snapshot: writing it again
                // would cost as much as the first time (seconds for millions
                // of jobs) and load no faster.
                tracing::info!("final snapshot not needed: nothing was logged since the last one");
                // That one may have been written past the page cache.
                let reading = std::time::Instant::now();
                match read_newest_into_page_cache(&self.snapshots.dir) {
                    Ok(bytes) => {
                        tracing::info!(
                            bytes,
                            seconds = reading.elapsed().as_secs_f64(),
                            "snapshot read into the page cache"
                        )
                    }
                    Err(error) => tracing::warn!(error = %error, "could not read the snapshot into the page cache"),
                }
            } else {
                let writing = std::time::Instant::now();
                match self.snapshot_now() {
                    Ok(()) => tracing::info!(seconds = writing.elapsed().as_secs_f64(), "final snapshot written"),
                    Err(error) => tracing::error!(error = %error, "final snapshot failed"),
                }
            }
        }
    }

    /// Waits until no background snapshot is being written, hurrying it.
    fn wait_for_snapshot(&self) {
        self.snapshot_pace.hurry();
        while self.snapshot_busy.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// How long to wait for commands before the next deadline is due.
    fn idle_wait(&self) -> Duration {
        // A failed engine only refuses commands: no deadline needs it.
        if self.committer.failed() {
            return IDLE_WAIT_MAX;
        }
        let now = self.clock.now_ms();
        // A parked fetch held back by a dispatch rate wakes when the window opens.
        let parked = self
            .parked
            .iter()
            .map(|parked| match self.state.dispatch_opening(parked.queues(), now) {
                Some(opening) => opening.min(parked.until()),
                None => parked.until(),
            })
            .min();
        let next = [self.state.next_deadline(), parked, self.outbox_wake].into_iter().flatten().min();
        match next {
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
        self.metrics.inbox_depth.set(batch.len() as i64);
        self.metrics.engine_turns.inc();
        let mut staged = Staged::new(std::mem::take(&mut self.event_buffer));
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
                DUE_JOBS_PER_TURN_MAX.min((bytes / RECORD_BYTES_PER_JOB) as usize)
            });
            for record in self.state.decide_due(now, due_limit, self.entropy.as_mut()) {
                self.apply(record, records, events);
            }
            if let Some(bytes) = budget.as_mut() {
                *bytes = bytes.saturating_sub(encoded_bytes(records));
            } else {
                self.forget_idle_workers(now, records, events);
                // A draining server fires no cron entries (docs/api.md, "Shutting down"), nor
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
                        replies.push(Box::new(move |failure| {
                            let _ = reply.send(failure.map_or(Ok(()), |error| Err(error.clone())));
                        }));
                    }
                    Command::Image { reply } => image_requests.push(reply),
                    Command::Snapshot { reply } => snapshot_requests.push(reply),
                    Command::Request(request) => {
                        let mut turn = Turn {
                            state: &mut self.state,
                            entropy: self.entropy.as_mut(),
                            contacts: &mut self.contacts,
                            draining: &mut self.draining,
                            cron_entries_max: self.cron_entries_max,
                            in_flight: &mut self.in_flight,
                            webhook_limits: &self.webhook_limits,
                            delivery_log: &mut self.delivery_log,
                            max_schemas: self.max_schemas,
                            now,
                            records,
                            events,
                        };
                        if let Some(bytes) = budget.as_mut() {
                            // With the disk full, a request runs only if its records fit.
                            match request.full_disk_bytes(&turn) {
                                Some(needed) if needed <= *bytes => *bytes -= needed,
                                _ => {
                                    request.refuse(disk_full());
                                    continue;
                                }
                            }
                        }
                        match request.run(&mut turn) {
                            Ran::Answer(responder) => replies.push(responder),
                            Ran::Park(parked) => self.parked.push_back(parked),
                        }
                    }
                }
            }
            // Parked fetches get what appeared this turn, first come first
            // served; each is answered empty once its time is up or it is told
            // to stop. With the disk full they wait without claiming.
            for parked in std::mem::take(&mut self.parked) {
                let mut turn = Turn {
                    state: &mut self.state,
                    entropy: self.entropy.as_mut(),
                    contacts: &mut self.contacts,
                    draining: &mut self.draining,
                    cron_entries_max: self.cron_entries_max,
                    in_flight: &mut self.in_flight,
                    webhook_limits: &self.webhook_limits,
                    delivery_log: &mut self.delivery_log,
                    max_schemas: self.max_schemas,
                    now,
                    records,
                    events,
                };
                if stop || parked.give_up(&turn) {
                    replies.push(parked.release());
                    continue;
                }
                let state = &*turn.state;
                let ready = parked
                    .queues()
                    .iter()
                    .any(|name| state.queue(name).is_some_and(|queue| !queue.paused && queue.has_available()));
                if !ready || budget.is_some() {
                    self.parked.push_back(parked);
                    continue;
                }
                match parked.retry(&mut turn) {
                    Ok(responder) => replies.push(responder),
                    Err(parked) => self.parked.push_back(parked),
                }
            }
            // Deliveries whose time came start their attempts (not while
            // draining, nor with the disk full); they leave once counted.
            self.outbox_wake = None;
            if budget.is_none() && !self.draining && !stop {
                self.start_deliveries(now, records, replies);
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
            let result =
                self.snapshot_now().map_err(|_| EngineError::Unavailable { reason: Unavailable::SnapshotFailed });
            let _ = reply.send(result);
        }
        // A snapshot needs a new segment and room for its file: not while the disk is full.
        if !stop && !full_disk {
            self.maybe_start_snapshot();
        }
        stop
    }

    pub(crate) fn apply(&mut self, record: Logged, records: &mut Vec<Logged>, events: &mut EventSink) {
        self.state.apply(&record, events).expect("a record decided against this state applies to it");
        records.push(record);
    }

    /// Forgets workers idle for a day (no contact, no active jobs), at most
    /// once a minute.
    fn forget_idle_workers(&mut self, now: Millis, records: &mut Vec<Logged>, events: &mut EventSink) {
        if now - self.last_worker_sweep < crate::limits::WORKER_SWEEP_EVERY_MS {
            return;
        }
        self.last_worker_sweep = now;
        for record in registry::forget_idle(&mut self.state, &mut self.contacts, now) {
            self.apply(record, records, events);
        }
    }

    /// Encodes a turn's records and makes them durable, then publishes the
    /// view changes and sends the replies that waited for them.
    fn commit(&mut self, staged: Staged) {
        if staged.is_empty() {
            return;
        }
        let Staged { mut records, replies, mut events } = staged;
        let mut pending = events.take();
        let numbered = self.number_events(&mut pending);
        if pending.capacity() <= EVENT_BUFFER_KEPT_MAX {
            self.event_buffer = pending;
        }
        self.queue_deliveries(&numbered, &mut records);
        self.metrics.commit_jobs.observe(records.len() as f64);
        let sequences = encode_sequences_into(&records, std::mem::take(&mut self.record_buffer));
        let logged = sequences.iter().map(|sequence| sequence.len() as u64).sum::<u64>();
        self.bytes_since_snapshot += logged;
        self.snapshot_pace.logged(logged);
        self.metrics.webhook_pending.set(self.state.outbox.len() as i64);
        let delta = self.collect_delta(numbered);
        self.committer.commit(&sequences, delta, &mut self.state.jobs, replies);
        if let Some(first) = sequences.into_iter().next()
            && first.capacity() <= RECORD_BUFFER_KEPT_MAX
        {
            self.record_buffer = first;
        }
    }

    fn refuse_all(&mut self, batch: Vec<Command>) -> bool {
        let error = storage_failed();
        let mut stop = false;
        for parked in self.parked.drain(..) {
            parked.refuse(error.clone());
        }
        for command in batch {
            match command {
                Command::Request(request) => request.refuse(error.clone()),
                Command::Image { reply } => drop(reply.send(Err(error.clone()))),
                Command::Snapshot { reply } => drop(reply.send(Err(error.clone()))),
                Command::Shutdown { reply, .. } => {
                    stop = true;
                    self.final_snapshot = false;
                    let _ = reply.send(Ok(()));
                }
            }
        }
        stop
    }

    /// Tells readers (health) whether the disk is full, logging each change.
    fn note_disk_full(&mut self, full: bool) {
        if self.view.disk_full() != full {
            if full {
                tracing::error!("the disk is full: new work is refused until space is freed");
            } else {
                tracing::info!("disk space is back: taking new work again");
            }
            self.view.set_disk_full(full);
        }
    }

    /// Gives the turn's events their ids and the jobs as they are now.
    fn number_events(&mut self, pending: &mut Vec<(Millis, EventKind, JobRef)>) -> Vec<Event> {
        let mut events = Vec::with_capacity(pending.len());
        let mut counts = EventCounter::default();
        for (time, kind, job) in pending.drain(..) {
            let job = match job {
                JobRef::Id(id) => {
                    let Some(job) = self.state.job_handle(id) else { continue };
                    Some(job)
                }
                JobRef::Gone(job) => Some(job),
                JobRef::None => None,
            };
            counts.count(&self.metrics, time, &kind, job.as_deref());
            self.event_seq += 1;
            let event_id = self.event_ids.next(time, self.entropy.next_u128());
            events.push(Event { seq: self.event_seq, id: EventId(event_id), time, kind, job });
        }
        counts.flush(&self.metrics);
        events
    }

    /// Queues the turn's events for the subscriptions that take them, as
    /// records of the same commit (docs/api.md, "Deliveries"). Each event's
    /// body is rendered and logged once however many subscriptions take it,
    /// and the records are cut at [`QUEUED_RECORD_BODY_BYTES_MAX`] of bodies,
    /// so no number of events or subscriptions makes one record too large for
    /// the log. A delivery past its subscription's caps or the outbox's (in
    /// count or bytes) is dropped and counted.
    fn queue_deliveries(&mut self, events: &[Event], records: &mut Vec<Logged>) {
        if self.deliveries.is_none() || events.is_empty() || self.state.webhooks.is_empty() {
            return;
        }
        let subscriptions: Vec<_> = self.state.webhooks.values().filter(|s| s.active).cloned().collect();
        let limits = self.webhook_limits;
        let mut chunk = QueuedChunk::default();
        let mut due: Option<Millis> = None;
        for event in events {
            let (queue, job_type) = event.webhook_scope();
            let type_name = event.kind.type_name();
            let mut body: Option<Arc<str>> = None;
            for subscription in &subscriptions {
                if !subscription.takes(type_name, queue, job_type) {
                    continue;
                }
                let body = body.get_or_insert_with(|| Arc::from(super::events::render_event(event)));
                let held = super::webhooks::outbox::delivery_held_bytes(body, type_name);
                let outbox = &self.state.outbox;
                let queued = outbox::Queued {
                    subscription: outbox.pending_for(subscription.id),
                    subscription_bytes: outbox.pending_bytes_for(subscription.id),
                    all: outbox.len(),
                    all_bytes: outbox.bytes(),
                };
                if !limits.has_room(&queued, held) {
                    self.metrics.webhook_delivery("dropped");
                    self.delivery_log.dropped(subscription.id);
                    continue;
                }
                let id = DeliveryId(self.event_ids.next(event.time, self.entropy.next_u128()));
                let at = event.time;
                due = Some(due.map_or(at, |due| due.min(at)));
                if chunk.add(id, subscription.id, type_name, body, at) {
                    // Applied as each record fills, so the caps above see
                    // the deliveries queued earlier in the turn.
                    self.log_queued(chunk.take(at), records);
                }
            }
        }
        if !chunk.is_empty() {
            let at = events.last().map_or(0, |event| event.time);
            self.log_queued(chunk.take(at), records);
        }
        // Queued after this turn started attempts: the next turn starts them
        // (if their subscriptions have room then; if not, that turn finds out).
        self.outbox_wake = [self.outbox_wake, due].into_iter().flatten().min();
        self.delivery_log.flush_if_due();
    }

    /// Applies a `DeliveriesQueuedOnce` record and keeps it for the commit.
    fn log_queued(&mut self, record: Logged, records: &mut Vec<Logged>) {
        self.state.apply(&record, &mut EventSink::disabled()).expect("queued deliveries apply");
        records.push(record);
    }

    /// Starts the attempts of deliveries whose time came: counted durably
    /// in this turn's commit, then handed to the delivery pool.
    fn start_deliveries(&mut self, now: Millis, records: &mut Vec<Logged>, replies: &mut Vec<Responder>) {
        let Some(sink) = self.deliveries.clone() else { return };
        // Counts of dropped and abandoned deliveries go out within a minute
        // of the last one, on the next turn.
        self.delivery_log.flush_if_due();
        // Only as many as may be in flight: the pool never queues an
        // attempt, so no lease runs out while it waits.
        let mut ids = Vec::new();
        // Subscriptions found at their limit this turn: once every one is,
        // the rest of the due list is not looked at (a slow receiver can have
        // a hundred thousand deliveries waiting, every turn).
        let mut full = Vec::new();
        let mut no_room = false;
        for id in self.state.outbox.due(now, &|_| false) {
            let Some(delivery) = self.state.outbox.get(id) else { continue };
            if self.in_flight.has_room(delivery.subscription, &self.webhook_limits) {
                self.in_flight.started(delivery.subscription);
                ids.push(id);
                continue;
            }
            if !full.contains(&delivery.subscription) {
                full.push(delivery.subscription);
            }
            if !self.in_flight.has_any_room(&self.webhook_limits) || full.len() >= self.state.webhooks.len() {
                no_room = true;
                break;
            }
        }
        if !ids.is_empty() {
            let until = now + self.delivery_timeout_ms + super::webhooks::outbox::ATTEMPT_LEASE_MARGIN_MS;
            let record = Logged::new(now, super::webhooks::record::DeliveryStarted { ids: ids.clone(), until });
            self.state.apply(&record, &mut EventSink::disabled()).expect("started deliveries apply");
            records.push(record);
            let batch: Vec<_> = ids.iter().filter_map(|id| self.state.outbox.get(*id).cloned()).collect();
            replies.push(Box::new(move |failure| {
                // Sent only once the attempts are counted on disk.
                if failure.is_none() {
                    let handed_at = std::time::Instant::now();
                    let _ = sink.send(super::webhooks::outbox::StartedAttempts { deliveries: batch, handed_at });
                }
            }));
        }
        // What is due now and was left waits for an outcome to free room (an
        // outcome is a command, so it wakes the engine); waking for it before
        // that would spin the engine thread.
        self.outbox_wake = if no_room { None } else { self.state.outbox.next_due_after(now) };
    }

    /// Copies what changed since the last turn out of the state, and
    /// publishes the turn's events.
    fn collect_delta(&mut self, events: Vec<Event>) -> ViewDelta {
        let workers = self
            .state
            .take_dirty_workers()
            .into_iter()
            .map(|worker| {
                // Keeps the registry's idle order in step (`Contacts`).
                self.contacts.set_busy(&worker, self.state.holds_active(&worker));
                let entry = registry::entry(&self.state, &self.contacts, &worker);
                (worker, entry)
            })
            .collect();
        let crons = self.state.crons.take_changes();
        let workflows = self.state.workflows.take_changes();
        let queues = self.state.take_dirty_queues();
        let schemas = self.state.schemas.take_changes();
        let webhooks = self.state.webhooks.take_changes();
        ViewDelta { workers, crons, workflows, queues, schemas, webhooks, events }
    }

    /// Starts a new segment and takes the state's image as of that boundary.
    /// The image shares the jobs with the state, so this costs a pointer per
    /// job; sorting and encoding it is left to whoever writes it.
    fn snapshot_image(&mut self) -> Result<(u64, StateImage), StorageError> {
        // Every record so far is durable and before the boundary: the image includes them.
        let replay_from = self.committer.rotate()?;
        let image = self.state.image();
        self.bytes_since_snapshot = 0;
        self.snapshot_written.store(false, Ordering::SeqCst);
        Ok((replay_from, image))
    }

    /// Writes a snapshot on this thread and waits for it to be durable. It
    /// stays in the page cache: a clean stop's is read by the restart that follows.
    fn snapshot_now(&mut self) -> Result<(), StorageError> {
        self.wait_for_snapshot();
        let (replay_from, image) = self.snapshot_image()?;
        write_in_place(self.snapshots.file_system.as_ref(), &self.snapshots.dir, replay_from, image)?;
        self.snapshot_written.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Starts a background snapshot once enough log has been written; when
    /// one is still being written by then, hurries it instead.
    fn maybe_start_snapshot(&mut self) {
        if self.bytes_since_snapshot < self.snapshots.log_bytes {
            return;
        }
        if self.snapshot_busy.load(Ordering::SeqCst) {
            self.snapshot_pace.hurry();
            return;
        }
        let taking = std::time::Instant::now();
        if self.snapshot_retry_at.is_some_and(|at| taking < at) {
            return;
        }
        let (replay_from, image) = match self.snapshot_image() {
            Ok(snapshot) => snapshot,
            Err(error) => {
                // A transient want leaves the log as it was: the snapshot is
                // tried again a second later, not on every turn meanwhile.
                tracing::error!(error = %error, "could not start a snapshot");
                self.snapshot_retry_at = Some(taking + SNAPSHOT_RETRY_AFTER);
                return;
            }
        };
        self.snapshot_retry_at = None;
        self.snapshot_busy.store(true, Ordering::SeqCst);
        self.snapshot_pace.start();
        let job = BackgroundSnapshot {
            replay_from,
            image,
            pace: self.snapshot_pace.clone(),
            busy: self.snapshot_busy.clone(),
            written: self.snapshot_written.clone(),
            file_system: self.snapshots.file_system.clone(),
            dir: self.snapshots.dir.clone(),
            metrics: self.metrics.clone(),
            // How long the engine thread spent starting the segment and taking the image.
            image_seconds: taking.elapsed().as_secs_f64(),
        };
        let busy_if_not_started = self.snapshot_busy.clone();
        let spawned = job.spawn();
        if let Err(error) = spawned {
            // The log segments are kept; the next due snapshot tries again.
            tracing::error!(error = %error, "could not start a snapshot thread");
            busy_if_not_started.store(false, Ordering::SeqCst);
        }
    }
}
