//! All engine state and the one function that changes it: [`State::apply`].
//!
//! Each job sits in exactly the structures its state implies: an `available`
//! job in its queue's ready order, every job with a pending deadline in the
//! timer set under that deadline. [`State::check_invariants`] verifies this.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::cron::table::CronTable;
use super::events::{EventKind, EventSink};
use super::job_table::JobTable;
use super::record::{Change, Logged};
use super::table::Table;
use super::workers::entry::WorkerSignal;
use super::workflows::table::Workflow;
use crate::clock::Millis;
use crate::job::{IdGenerator, Job, JobId, JobState, SubscriptionId, UniqueKey, WorkflowId, transition};
use crate::schedule::{DispatchTable, KeyedReady, ReadyQueue, TimerSet};

mod index;
mod invariants;
mod read;
mod snapshot;

/// How long terminal jobs are kept before they are pruned, and how many of
/// them (and how many of their bytes) are held at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retention {
    pub completed_ms: i64,
    pub cancelled_ms: i64,
    pub discarded_ms: i64,
    pub dead_letter_ms: i64,
    /// Most terminal jobs held, all terminal states together.
    pub max_terminal_jobs: usize,
    /// Most bytes held by terminal jobs ([`Job::held_bytes`]).
    pub max_terminal_bytes: u64,
    /// How long ended workflows are kept, how many at most, and how many
    /// bytes ([`Workflow::held_bytes`]) at most.
    pub workflows_ms: i64,
    pub max_terminal_workflows: usize,
    pub max_terminal_workflow_bytes: u64,
}

impl Default for Retention {
    fn default() -> Self {
        use crate::limits::*;
        Self {
            completed_ms: RETENTION_COMPLETED_MS,
            cancelled_ms: RETENTION_CANCELLED_MS,
            discarded_ms: RETENTION_DISCARDED_MS,
            dead_letter_ms: RETENTION_DEAD_LETTER_MS,
            max_terminal_jobs: RETENTION_TERMINAL_JOBS_MAX,
            max_terminal_bytes: RETENTION_TERMINAL_BYTES_MAX,
            workflows_ms: RETENTION_WORKFLOWS_MS,
            max_terminal_workflows: RETENTION_TERMINAL_WORKFLOWS_MAX,
            max_terminal_workflow_bytes: RETENTION_TERMINAL_WORKFLOW_BYTES_MAX,
        }
    }
}

/// One queue: its ready order and a count of its jobs per state.
#[derive(Debug, Default, Clone)]
pub struct QueueState {
    /// Available jobs without a dispatch limit, in fetch order.
    pub ready: ReadyQueue,
    /// Available jobs with a dispatch limit, by limit key.
    pub limited: KeyedReady,
    pub counts: [u64; 8],
    pub paused: bool,
    pub backpressure: Option<super::queues::record::Backpressure>,
    /// Listed in `State::dirty_queues` since the view was last updated.
    dirty: bool,
}

impl QueueState {
    /// Whether any job is available (dispatch limits aside).
    pub fn has_available(&self) -> bool {
        !self.ready.is_empty() || !self.limited.is_empty()
    }
    /// Jobs not yet finished: scheduled, available, pending, active, retryable.
    pub fn size(&self) -> u64 {
        JobState::ALL.iter().filter(|state| !state.is_terminal()).map(|state| self.counts[state.index()]).sum()
    }

    fn is_empty(&self) -> bool {
        self.counts.iter().all(|count| *count == 0) && !self.paused && self.backpressure.is_none()
    }

    /// Jobs waiting to be claimed: what backpressure bounds.
    pub fn depth(&self) -> u64 {
        [JobState::Available, JobState::Scheduled, JobState::Retryable, JobState::Pending]
            .iter()
            .map(|state| self.counts[state.index()])
            .sum()
    }
}

/// A terminal job's place in the order the caps prune in: jobs not in the
/// dead letter listing first, then by when they ended, then by id.
pub(crate) type TerminalKey = (bool, Millis, JobId);

/// Active jobs by the worker that claimed them (for heartbeats).
type ActiveByWorker = HashMap<String, std::collections::BTreeSet<JobId>>;

#[derive(Debug)]
pub struct State {
    /// Every job, shared with the read view (which sees a turn's changes
    /// once it is durable).
    pub(crate) jobs: JobTable,
    pub(crate) queues: BTreeMap<String, QueueState>,
    /// Queues whose backpressure is set: when none are, enqueues skip the check.
    bounded_queues: usize,
    pub(crate) timers: TimerSet,
    pub(crate) ids: IdGenerator,
    active_by_worker: ActiveByWorker,
    /// Durable operator signals: worker id → (signal, when given).
    worker_signals: BTreeMap<String, (WorkerSignal, Millis)>,
    /// Workers whose registry entry changed since the view was last updated.
    dirty_workers: HashSet<String>,
    live_jobs: usize,
    /// The sum of [`Job::held_bytes`] over live (not terminal) jobs.
    live_bytes: u64,
    /// New jobs are refused once the live jobs hold this many bytes.
    max_live_bytes: u64,
    retention: Retention,
    /// Terminal jobs in the order the caps prune them.
    pub(crate) terminal: std::collections::BTreeSet<TerminalKey>,
    /// The sum of [`Job::held_bytes`] over terminal jobs.
    pub(crate) terminal_bytes: u64,
    /// Queues whose figures changed since the view was last updated, each
    /// listed once (a queue removed and made again may be listed twice).
    dirty_queues: Vec<String>,
    /// Every queue is to be published (before the first update of the view).
    all_queues_dirty: bool,
    /// Cron entries and the runs waiting on earlier runs.
    pub(crate) crons: CronTable,
    /// Jobs that ended during the record being applied while a cron run waited on them.
    ended_with_waiter: Vec<JobId>,
    /// The latest time any applied record or loaded job carries.
    latest_at: Millis,
    /// No job or workflow ever stored had a higher id (so a fresh id above
    /// it needs no lookup).
    pub(crate) highest_stored_id: JobId,
    /// Live (non-terminal) jobs by unique key.
    unique_index: HashMap<UniqueKey, Vec<JobId>>,
    /// Active jobs and recent claims per dispatch-limit key.
    pub(crate) dispatch: DispatchTable,
    /// Claims under a limit since old claims were last forgotten.
    pub(in crate::engine) claims_since_forget: u32,
    /// Workflows by id, shared with the read view.
    pub(crate) workflows: Table<WorkflowId, Workflow>,
    /// Ended workflows by when they ended, for retention and the caps.
    pub(crate) terminal_workflows: std::collections::BTreeSet<(Millis, WorkflowId)>,
    /// The sum of [`Workflow::held_bytes`] over ended workflows (which do
    /// not change size once ended).
    pub(crate) terminal_workflow_bytes: u64,
    /// Workflow jobs that ended during the record being applied.
    ended_in_workflow: Vec<JobId>,
    /// Registered schemas by URI, shared with the read view.
    pub(crate) schemas: Table<String, crate::schema::SchemaEntry>,
    /// Webhook subscriptions by id, shared with the read view.
    pub(crate) webhooks: Table<SubscriptionId, crate::webhook::Subscription>,
    /// Webhook deliveries on their way.
    pub(crate) outbox: super::webhooks::outbox::Outbox,
}

/// A record that does not fit the state (a damaged or foreign log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyError(pub String);

impl State {
    pub fn new(retention: Retention) -> Self {
        let mut state = Self {
            jobs: JobTable::default(),
            queues: BTreeMap::new(),
            bounded_queues: 0,
            timers: TimerSet::default(),
            ids: IdGenerator::default(),
            active_by_worker: HashMap::new(),
            worker_signals: BTreeMap::new(),
            dirty_workers: HashSet::new(),
            live_jobs: 0,
            live_bytes: 0,
            max_live_bytes: crate::limits::LIVE_BYTES_MAX_DEFAULT,
            retention,
            terminal: std::collections::BTreeSet::new(),
            terminal_bytes: 0,
            dirty_queues: Vec::new(),
            all_queues_dirty: true,
            highest_stored_id: JobId(0),
            crons: CronTable::default(),
            ended_with_waiter: Vec::new(),
            latest_at: Millis::MIN,
            unique_index: HashMap::new(),
            dispatch: DispatchTable::default(),
            claims_since_forget: 0,
            workflows: Table::default(),
            terminal_workflows: std::collections::BTreeSet::new(),
            terminal_workflow_bytes: 0,
            ended_in_workflow: Vec::new(),
            schemas: Table::default(),
            webhooks: Table::default(),
            outbox: super::webhooks::outbox::Outbox::default(),
        };
        state.queues.insert("default".to_string(), QueueState::default());
        state
    }

    /// Changes one job through `change`, keeping every structure in step.
    pub(super) fn update(&mut self, id: JobId, change: impl FnOnce(&mut Job)) -> Result<Arc<Job>, ApplyError> {
        let mut job = self.jobs.remove(&id).ok_or_else(|| ApplyError(format!("record names unknown job {id}")))?;
        self.unindex_job(&job);
        let was_terminal = job.state.is_terminal();
        change(Arc::make_mut(&mut job));
        if !was_terminal && job.state.is_terminal() {
            if self.crons.waiters.contains_key(&id) {
                self.ended_with_waiter.push(id);
            }
            if job.workflow().is_some() {
                self.ended_in_workflow.push(id);
            }
        }
        self.index_job(&job);
        self.jobs.insert(job.clone());
        Ok(job)
    }

    /// Applies one decided record. The live engine and recovery both come
    /// through here, so replay rebuilds exactly the live state.
    pub fn apply(&mut self, record: &Logged, events: &mut EventSink) -> Result<(), ApplyError> {
        self.apply_record(record, events)?;
        let at = record.at;
        self.latest_at = self.latest_at.max(at);
        // What the jobs that ended set going, until nothing more ends: a cron
        // run staged behind a run that just ended starts now (docs/api.md, "Job state table", row 10), and
        // workflows move on (a step, a callback, a cancelled rest).
        while !self.ended_with_waiter.is_empty() || !self.ended_in_workflow.is_empty() {
            for previous in std::mem::take(&mut self.ended_with_waiter) {
                let Some(waiting) = self.crons.waiters.remove(&previous) else { continue };
                if self.jobs.get(&waiting).is_some_and(|job| job.state == JobState::Pending) {
                    self.update(waiting, |job| transition::activate(job, at))?;
                }
            }
            for ended in std::mem::take(&mut self.ended_in_workflow) {
                self.workflow_job_ended(at, ended, events)?;
            }
        }
        Ok(())
    }

    /// Cancels a non-terminal job (docs/api.md, "Job state table", rows 26–30).
    pub(super) fn cancel(
        &mut self,
        at: Millis,
        id: JobId,
        reason: &'static str,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        let previous_state = self.jobs.get(&id).map_or(JobState::Cancelled, |job| job.state);
        self.update(id, |job| transition::cancel(job, at))?;
        events.push(at, EventKind::Cancelled { previous_state, reason }, id);
        Ok(())
    }

    /// Hands a record to its feature's apply.
    fn apply_record(&mut self, record: &Logged, events: &mut EventSink) -> Result<(), ApplyError> {
        let at = record.at;
        match &record.change {
            Change::Jobs(change) => self.apply_job_record(at, change, events),
            Change::Queues(change) => {
                self.apply_queue_record(at, change, events);
                Ok(())
            }
            Change::Workers(change) => self.apply_worker_record(at, change, events),
            Change::Cron(change) => self.apply_cron_record(at, change, events),
            Change::Workflows(change) => self.apply_workflow_record(at, change, events),
            Change::Schemas(change) => self.apply_schema_record(change),
            Change::Webhooks(change) => self.apply_webhook_record(change),
            Change::Progress(change) => self.apply_progress(at, change, events),
        }
    }

    /// Pauses or resumes a queue in the queue table, making its entry if
    /// needed (and dropping it again when it is resumed holding nothing).
    pub(super) fn set_queue_paused(&mut self, name: &str, paused: bool) {
        let queue = self.queues.entry(name.to_string()).or_default();
        queue.paused = paused;
        Self::queue_changed(&mut self.dirty_queues, name, queue);
        if queue.is_empty() && name != "default" {
            self.queues.remove(name);
        }
    }

    /// Sets or removes a queue's backpressure, as [`State::set_queue_paused`].
    pub(super) fn set_queue_backpressure(
        &mut self,
        name: &str,
        backpressure: Option<super::queues::record::Backpressure>,
    ) {
        let queue = self.queues.entry(name.to_string()).or_default();
        self.bounded_queues -= usize::from(queue.backpressure.is_some());
        self.bounded_queues += usize::from(backpressure.is_some());
        queue.backpressure = backpressure;
        Self::queue_changed(&mut self.dirty_queues, name, queue);
        if queue.is_empty() && name != "default" {
            self.queues.remove(name);
        }
    }

    /// Gives (`Some`: the signal and when) or forgets a worker's signal.
    pub(super) fn set_worker_signal(&mut self, worker_id: &str, signal: Option<(WorkerSignal, Millis)>) {
        match signal {
            Some(signal) => self.worker_signals.insert(worker_id.to_string(), signal),
            None => self.worker_signals.remove(worker_id),
        };
        self.dirty_workers.insert(worker_id.to_string());
    }
}
