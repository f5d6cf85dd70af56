//! All engine state and the one function that changes it: [`State::apply`].
//!
//! Each job sits in exactly the structures its state implies: an `available`
//! job in its queue's ready order, every job with a pending deadline in the
//! timer set under that deadline. [`State::check_invariants`] verifies this.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::cron_table::{CronOutcome, CronTable};
use super::events::{CronInfo, CronSkip, EventKind, EventSink, SignalledWorker};
use super::image::StateImage;
use super::job_table::JobTable;
use super::job_table::LoadedJobs;
use super::record::{FailOutcome, Record, TimeoutKind};
use super::view::QueueSummary;
use super::workers::WorkerSignal;
use super::workflow_table::Workflow;
use crate::clock::Millis;
use crate::job::{
    DispatchLimit, ErrorEntry, Exhaustion, FailureReport, IdGenerator, Job, JobId, JobIdSet, JobRun, JobState,
    SharedPolicies, UniqueKey,
};
use crate::limits::DISPATCH_WINDOW_MS_MAX;
use crate::limits::ERROR_HISTORY_MAX;
use crate::schedule::{DispatchTable, KeyedReady, ReadyKey, ReadyQueue, TimerSet};

/// How long terminal jobs are kept before they are pruned, and how many of
/// them (and how many of their bytes) are held at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
        self.counts.iter().all(|count| *count == 0) && !self.paused
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
    claims_since_forget: u32,
    /// Workflows by id, shared with the read view.
    pub(crate) workflows: BTreeMap<JobId, Arc<Workflow>>,
    /// Ended workflows by when they ended, for retention and the caps.
    pub(crate) terminal_workflows: std::collections::BTreeSet<(Millis, JobId)>,
    /// The sum of [`Workflow::held_bytes`] over ended workflows (which do
    /// not change size once ended).
    pub(crate) terminal_workflow_bytes: u64,
    /// Workflows changed since the view was last updated.
    pub(crate) dirty_workflows: JobIdSet,
    /// Workflow jobs that ended during the record being applied.
    ended_in_workflow: Vec<JobId>,
    /// Registered schemas by URI, shared with the read view.
    pub(crate) schemas: BTreeMap<String, Arc<crate::schema::SchemaEntry>>,
    /// Schemas registered or removed since the view was last updated.
    dirty_schemas: Vec<String>,
    /// Webhook subscriptions by id, shared with the read view.
    pub(crate) webhooks: BTreeMap<JobId, Arc<crate::webhook::Subscription>>,
    /// Subscriptions changed since the view was last updated.
    dirty_webhooks: Vec<JobId>,
    /// Webhook deliveries on their way.
    pub(crate) outbox: super::outbox::Outbox,
}

/// A record that does not fit the state (a damaged or foreign log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyError(pub String);

impl State {
    pub fn new(retention: Retention) -> Self {
        let mut state = Self {
            jobs: JobTable::default(),
            queues: BTreeMap::new(),
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
            workflows: BTreeMap::new(),
            terminal_workflows: std::collections::BTreeSet::new(),
            terminal_workflow_bytes: 0,
            dirty_workflows: JobIdSet::default(),
            ended_in_workflow: Vec::new(),
            schemas: BTreeMap::new(),
            dirty_schemas: Vec::new(),
            webhooks: BTreeMap::new(),
            dirty_webhooks: Vec::new(),
            outbox: super::outbox::Outbox::default(),
        };
        state.queues.insert("default".to_string(), QueueState::default());
        state
    }

    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id)
    }

    /// A new reference to a job, to keep or hand out.
    pub fn job_handle(&self, id: JobId) -> Option<Arc<Job>> {
        self.jobs.handle(&id)
    }

    /// The latest time the state holds: the engine's clock starts no earlier.
    pub fn latest_at(&self) -> Millis {
        self.latest_at
    }

    pub fn live_jobs(&self) -> usize {
        self.live_jobs
    }

    /// The bytes live jobs hold ([`Job::held_bytes`]).
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Sets the bytes of live jobs past which new jobs are refused (`limits.max_live_bytes`).
    pub fn set_max_live_bytes(&mut self, max: u64) {
        self.max_live_bytes = max;
    }

    /// Whether `count` more live jobs may be taken: fewer than
    /// [`LIVE_JOBS_MAX`](crate::limits::LIVE_JOBS_MAX) in all, and the live
    /// jobs below `max_live_bytes` (a request may cross it by its own size).
    pub fn has_room_for(&self, count: usize) -> bool {
        self.live_jobs + count <= crate::limits::LIVE_JOBS_MAX && self.live_bytes < self.max_live_bytes
    }

    pub fn queue(&self, name: &str) -> Option<&QueueState> {
        self.queues.get(name)
    }

    /// A queue's figures now (all zero for a queue that holds nothing).
    pub fn queue_summary(&self, name: &str) -> QueueSummary {
        let (paused, counts) = self.queues.get(name).map_or((false, [0; 8]), |queue| (queue.paused, queue.counts));
        QueueSummary { name: name.to_string(), paused, counts }
    }

    pub fn queues(&self) -> &BTreeMap<String, QueueState> {
        &self.queues
    }

    /// The signal an operator gave `worker_id`, with when.
    pub fn worker_signal(&self, worker_id: &str) -> Option<(WorkerSignal, Millis)> {
        self.worker_signals.get(worker_id).copied()
    }

    /// Every worker with a signal.
    pub fn signalled_workers(&self) -> impl Iterator<Item = &String> {
        self.worker_signals.keys()
    }

    /// Workers whose entry changed since the last call.
    pub fn take_dirty_workers(&mut self) -> HashSet<String> {
        std::mem::take(&mut self.dirty_workers)
    }

    /// Marks a worker's entry as changed (contact recorded by the writer).
    pub fn touch_worker(&mut self, worker_id: &str) {
        self.dirty_workers.insert(worker_id.to_string());
    }

    /// Workers whose entry changed since [`State::take_dirty_workers`]
    /// (each whose active jobs changed among them).
    pub fn dirty_workers(&self) -> impl Iterator<Item = &String> {
        self.dirty_workers.iter()
    }

    /// Whether `worker_id` holds active jobs.
    pub fn holds_active(&self, worker_id: &str) -> bool {
        self.active_by_worker.contains_key(worker_id)
    }

    /// The active jobs `worker_id` holds, in id order.
    pub fn active_of_worker(&self, worker_id: &str) -> Vec<JobId> {
        self.active_by_worker.get(worker_id).map(|ids| ids.iter().copied().collect()).unwrap_or_default()
    }

    /// The earliest job deadline, cron run or workflow past its retention.
    pub fn next_deadline(&self) -> Option<Millis> {
        let workflow =
            self.terminal_workflows.first().map(|(ended_at, _)| ended_at.saturating_add(self.retention.workflows_ms));
        [self.timers.next_deadline(), self.crons.next_due(), workflow].into_iter().flatten().min()
    }

    pub fn crons(&self) -> &CronTable {
        &self.crons
    }

    pub fn workflow(&self, id: JobId) -> Option<&Arc<Workflow>> {
        self.workflows.get(&id)
    }

    /// Workflows changed since the last call, as they are now (`None`: pruned).
    pub fn take_dirty_workflows(&mut self) -> Vec<(JobId, Option<Arc<Workflow>>)> {
        let ids: Vec<JobId> = self.dirty_workflows.drain().collect();
        ids.into_iter().map(|id| (id, self.workflows.get(&id).cloned())).collect()
    }

    /// Schemas registered or removed since the last call, as they are now.
    pub fn take_dirty_schemas(&mut self) -> Vec<(String, Option<Arc<crate::schema::SchemaEntry>>)> {
        let uris = std::mem::take(&mut self.dirty_schemas);
        uris.into_iter().map(|uri| (uri.clone(), self.schemas.get(&uri).cloned())).collect()
    }

    /// Subscriptions changed since the last call, as they are now.
    pub fn take_dirty_webhooks(&mut self) -> Vec<(JobId, Option<Arc<crate::webhook::Subscription>>)> {
        let ids = std::mem::take(&mut self.dirty_webhooks);
        ids.into_iter().map(|id| (id, self.webhooks.get(&id).cloned())).collect()
    }

    /// Live jobs holding `key`, oldest first.
    pub fn jobs_with_unique_key(&self, key: &UniqueKey) -> &[JobId] {
        self.unique_index.get(key).map_or(&[], Vec::as_slice)
    }

    /// Queues whose figures changed since the last call (all of them the
    /// first time), with their figures now, `None` for a queue now gone.
    pub fn take_dirty_queues(&mut self) -> Vec<(String, Option<QueueSummary>)> {
        let names = if std::mem::take(&mut self.all_queues_dirty) {
            self.dirty_queues.clear();
            self.queues.keys().cloned().collect()
        } else {
            std::mem::take(&mut self.dirty_queues)
        };
        names
            .into_iter()
            .map(|name| {
                let summary = self.queues.get_mut(&name).map(|queue| {
                    queue.dirty = false;
                    QueueSummary { name: name.clone(), paused: queue.paused, counts: queue.counts }
                });
                (name, summary)
            })
            .collect()
    }

    /// Notes that a queue's figures changed, for the next view update.
    fn queue_changed(dirty_queues: &mut Vec<String>, name: &str, queue: &mut QueueState) {
        if !queue.dirty {
            queue.dirty = true;
            dirty_queues.push(name.to_string());
        }
    }

    /// The earliest deadline this job waits for in its current state.
    pub fn deadline_of(&self, job: &Job) -> Option<Millis> {
        let earliest = |a: Option<Millis>, b: Option<Millis>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match job.state {
            JobState::Scheduled => earliest(job.scheduled_at(), job.expires_at()),
            JobState::Retryable => earliest(job.run().retry_at, job.expires_at()),
            JobState::Available | JobState::Pending => job.expires_at(),
            JobState::Active => earliest(job.run().visibility_deadline, job.run().execution_deadline),
            JobState::Completed => job.run().completed_at.map(|at| at.saturating_add(self.retention.completed_ms)),
            JobState::Cancelled => job.run().cancelled_at.map(|at| at.saturating_add(self.retention.cancelled_ms)),
            JobState::Discarded => {
                let keep = match job.retry.on_exhaustion {
                    Exhaustion::DeadLetter => self.retention.dead_letter_ms,
                    Exhaustion::Discard => self.retention.discarded_ms,
                };
                job.run().discarded_at.map(|at| at.saturating_add(keep))
            }
        }
    }

    /// Where a terminal job stands in the caps' pruning order; `None` for a live job.
    fn terminal_key(job: &Job) -> Option<TerminalKey> {
        let ended_at = match job.state {
            JobState::Completed => job.run().completed_at,
            JobState::Cancelled => job.run().cancelled_at,
            JobState::Discarded => job.run().discarded_at,
            _ => return None,
        };
        // Every discarded job is in the dead letter listing, where an operator
        // looks for what failed: they go last.
        let dead_letter = job.state == JobState::Discarded;
        Some((dead_letter, ended_at.unwrap_or(job.created_at), job.id))
    }

    pub fn retention(&self) -> &Retention {
        &self.retention
    }

    fn ready_key(job: &Job) -> ReadyKey {
        ReadyKey::new(i32::from(job.priority), job.enqueued_at().unwrap_or(job.created_at), job.id)
    }

    /// Puts a job into the structures its state implies.
    fn index_job(&mut self, job: &Job) {
        // The name is copied only when the queue is new.
        if !self.queues.contains_key(job.queue.as_str()) {
            self.queues.insert(job.queue.to_string(), QueueState::default());
        }
        let queue = self.queues.get_mut(job.queue.as_str()).expect("inserted above");
        queue.counts[job.state.index()] += 1;
        if job.state == JobState::Available {
            match job.dispatch_key() {
                Some(key) => queue.limited.push(key, Self::ready_key(job)),
                None => queue.ready.push(Self::ready_key(job)),
            }
        }
        Self::queue_changed(&mut self.dirty_queues, &job.queue, queue);
        if !job.state.is_terminal() {
            self.live_jobs += 1;
            self.live_bytes += job.held_bytes();
            if let Some((_, key)) = job.unique() {
                let holders = self.unique_index.entry(key).or_default();
                let at = holders.partition_point(|id| *id < job.id);
                holders.insert(at, job.id);
            }
            if let Some((limit, key)) = job.limit_and_key() {
                self.dispatch.rate_held(key, limit);
            }
        }
        if job.state == JobState::Active
            && let Some(key) = job.dispatch_key()
        {
            self.dispatch.activated(key);
        }
        if let Some(key) = Self::terminal_key(job) {
            self.terminal.insert(key);
            self.terminal_bytes += job.held_bytes();
        }
        if let (JobState::Active, Some(worker)) = (job.state, &job.run().worker_id) {
            self.active_by_worker.entry(worker.clone()).or_default().insert(job.id);
            self.dirty_workers.insert(worker.clone());
        }
        if let Some(deadline) = self.deadline_of(job) {
            self.timers.insert(deadline, job.id);
        }
    }

    /// Takes a job out of every structure (the reverse of `index_job`).
    fn unindex_job(&mut self, job: &Job) {
        if let Some(deadline) = self.deadline_of(job) {
            self.timers.remove(deadline, job.id);
        }
        if !job.state.is_terminal() {
            self.live_jobs -= 1;
            self.live_bytes -= job.held_bytes();
            if let Some((limit, key)) = job.limit_and_key() {
                self.dispatch.rate_released(key, limit);
            }
            if let Some((_, key)) = job.unique()
                && let Some(holders) = self.unique_index.get_mut(&key)
            {
                holders.retain(|id| *id != job.id);
                if holders.is_empty() {
                    self.unique_index.remove(&key);
                }
            }
        }
        if job.state == JobState::Active
            && let Some(key) = job.dispatch_key()
        {
            self.dispatch.deactivated(key);
        }
        if let Some(key) = Self::terminal_key(job) {
            self.terminal.remove(&key);
            self.terminal_bytes -= job.held_bytes();
        }
        if let (JobState::Active, Some(worker)) = (job.state, &job.run().worker_id)
            && let Some(active) = self.active_by_worker.get_mut(worker)
        {
            self.dirty_workers.insert(worker.clone());
            active.remove(&job.id);
            if active.is_empty() {
                self.active_by_worker.remove(worker);
            }
        }
        if let Some(queue) = self.queues.get_mut(job.queue.as_str()) {
            queue.counts[job.state.index()] -= 1;
            if job.state == JobState::Available {
                match job.dispatch_key() {
                    Some(key) => queue.limited.remove(key, &Self::ready_key(job)),
                    None => queue.ready.remove(&Self::ready_key(job)),
                };
            }
            Self::queue_changed(&mut self.dirty_queues, &job.queue, queue);
            if queue.is_empty() && job.queue != "default" {
                self.queues.remove(job.queue.as_str());
            }
        }
    }

    /// Adds a job (new, or loaded from a snapshot).
    fn insert_loaded(&mut self, job: Arc<Job>) {
        self.note_loaded(&job);
        self.jobs.insert(job);
    }

    /// Everything adding a job does but storing it in the job table.
    fn note_loaded(&mut self, job: &Arc<Job>) {
        self.ids.observe(job.id);
        self.highest_stored_id = self.highest_stored_id.max(job.id);
        let times =
            [job.created_at, job.enqueued_at().unwrap_or(Millis::MIN), job.run().started_at.unwrap_or(Millis::MIN)];
        let ended = [job.run().completed_at, job.run().cancelled_at, job.run().discarded_at]
            .map(|at| at.unwrap_or(Millis::MIN));
        self.latest_at = times.into_iter().chain(ended).fold(self.latest_at, Millis::max);
        self.index_job(job);
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
    pub fn apply(&mut self, record: &Record, events: &mut EventSink) -> Result<(), ApplyError> {
        self.apply_record(record, events)?;
        let at = record.at();
        self.latest_at = self.latest_at.max(at);
        // What the jobs that ended set going, until nothing more ends: a cron
        // run staged behind a run that just ended starts now (rows 5/6), and
        // workflows move on (a step, a callback, a cancelled rest).
        while !self.ended_with_waiter.is_empty() || !self.ended_in_workflow.is_empty() {
            for previous in std::mem::take(&mut self.ended_with_waiter) {
                let Some(waiting) = self.crons.waiters.remove(&previous) else { continue };
                if self.jobs.get(&waiting).is_some_and(|job| job.state == JobState::Pending) {
                    self.update(waiting, |job| activate(job, at))?;
                }
            }
            for ended in std::mem::take(&mut self.ended_in_workflow) {
                self.workflow_job_ended(at, ended, events)?;
            }
        }
        Ok(())
    }

    /// Cancels a non-terminal job (row 16).
    pub(super) fn cancel(
        &mut self,
        at: Millis,
        id: JobId,
        reason: &'static str,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        let previous_state = self.jobs.get(&id).map_or(JobState::Cancelled, |job| job.state);
        self.update(id, |job| {
            job.state = JobState::Cancelled;
            job.run_mut().cancelled_at = Some(at);
            job.run_mut().retry_at = None;
            clear_claim(job);
        })?;
        events.push(at, EventKind::Cancelled { previous_state, reason }, id);
        Ok(())
    }

    /// One function per record kind.
    fn apply_record(&mut self, record: &Record, events: &mut EventSink) -> Result<(), ApplyError> {
        match record {
            Record::Enqueue { at, jobs, replaced } => self.apply_enqueue(*at, jobs, replaced, events),
            Record::Activate { at, id } => self.apply_activate(*at, *id, events),
            Record::WorkflowCreate { at, workflow, jobs, replaced } => {
                self.apply_workflow_create(*at, workflow, jobs, replaced, events)
            }
            Record::WorkflowCancel { at, id } => self.apply_workflow_cancel(*at, *id, events),
            Record::WorkflowPrune { ids, .. } => self.apply_workflow_prune(ids),
            Record::EnqueueV1 { .. } | Record::CronFireV1 { .. } => {
                Err(ApplyError(format!("a {} record of an earlier format was not upgraded", record.kind())))
            }
            Record::Claim { at, worker_id, claims } => self.apply_claim(*at, worker_id, claims, events),
            Record::Ack { at, id, result } => self.apply_ack(*at, *id, result, events),
            Record::Progress(record) => self.apply_progress(record, events),
            Record::Fail { at, id, report, outcome } => self.apply_fail(*at, *id, report, *outcome, events),
            Record::Cancel { at, id } => self.cancel(*at, *id, "api", events),
            Record::Promote { at, ids } => self.apply_promote(*at, ids),
            Record::Expire { at, ids } => self.apply_expire(*at, ids, events),
            Record::Timeout { at, id, kind, outcome } => self.apply_timeout(*at, *id, *kind, *outcome, events),
            Record::DeadLetterRetry { at, id } => self.apply_dead_letter_retry(*at, *id, events),
            Record::Delete { at, id } => self.apply_delete(*at, *id, events),
            Record::Heartbeat { extensions, .. } => self.apply_heartbeat(extensions),
            Record::WorkerSignal { at, worker_id, signal } => self.apply_worker_signal(*at, worker_id, *signal, events),
            Record::WorkerForget { worker_id, .. } => {
                self.worker_signals.remove(worker_id);
                self.dirty_workers.insert(worker_id.clone());
                Ok(())
            }
            Record::CronPut { entry, .. } => self.crons.put(entry.clone()).map_err(ApplyError),
            Record::CronDelete { name, .. } => self
                .crons
                .remove(name)
                .map(drop)
                .ok_or_else(|| ApplyError(format!("record deletes unknown cron entry {name}"))),
            Record::CronFire { at, name, fire } => self.apply_cron_fire(*at, name, fire, events),
            Record::Prune { ids, .. } => self.prune(ids),
            Record::PruneCapped { at, ids } => {
                self.prune(ids)?;
                events.push_other(*at, EventKind::Pruned { count: ids.len() as u64 });
                Ok(())
            }
            Record::SchemaPut { entry, .. } => {
                if self.schemas.contains_key(&entry.uri) {
                    return Err(ApplyError(format!("record registers schema {} twice", entry.uri)));
                }
                self.dirty_schemas.push(entry.uri.clone());
                self.schemas.insert(entry.uri.clone(), entry.clone());
                Ok(())
            }
            Record::SchemaDelete { uri, .. } => {
                self.schemas.remove(uri).ok_or_else(|| ApplyError(format!("record deletes unknown schema {uri}")))?;
                self.dirty_schemas.push(uri.clone());
                Ok(())
            }
            Record::WebhookPut { subscription, .. } => {
                self.ids.observe(subscription.id);
                self.dirty_webhooks.push(subscription.id);
                self.webhooks.insert(subscription.id, subscription.clone());
                // A paused subscription's queued deliveries are dropped.
                if !subscription.active {
                    self.outbox.drop_subscription(subscription.id);
                }
                Ok(())
            }
            Record::WebhookDelete { id, .. } => {
                self.webhooks.remove(id).ok_or_else(|| ApplyError(format!("record deletes unknown webhook {id}")))?;
                self.dirty_webhooks.push(*id);
                self.outbox.drop_subscription(*id);
                Ok(())
            }
            Record::DeliveriesQueued { deliveries, .. } => {
                let mut previous: Option<Arc<super::outbox::Delivery>> = None;
                for delivery in deliveries {
                    let mut delivery = delivery.clone();
                    super::outbox::share_body(previous.as_ref(), &mut delivery);
                    self.outbox.insert(delivery.clone()).map_err(ApplyError)?;
                    previous = Some(delivery);
                }
                Ok(())
            }
            Record::DeliveriesQueuedOnce { events, deliveries, .. } => {
                for delivery in super::outbox::queued_deliveries(events, deliveries).map_err(ApplyError)? {
                    self.outbox.insert(delivery).map_err(ApplyError)?;
                }
                Ok(())
            }
            // A delivery dropped meanwhile (its subscription went) is skipped.
            Record::DeliveryStarted { ids, until, .. } => {
                for id in ids {
                    if self.outbox.get(*id).is_some() {
                        let change = |delivery: &mut super::outbox::Delivery| {
                            delivery.attempts += 1;
                            delivery.next_at = *until;
                        };
                        self.outbox.update(*id, change).map_err(ApplyError)?;
                    }
                }
                Ok(())
            }
            Record::DeliveryRetry { id, next_at, .. } => {
                if self.outbox.get(*id).is_some() {
                    self.outbox.update(*id, |delivery| delivery.next_at = *next_at).map_err(ApplyError)?;
                }
                Ok(())
            }
            Record::DeliveriesDone { ids, .. } => {
                for id in ids {
                    self.outbox.remove(*id);
                }
                Ok(())
            }
            Record::QueuePause { at, queue, paused } => {
                self.apply_queue_pause(queue, *paused);
                let kind = if *paused { EventKind::QueuePaused } else { EventKind::QueueResumed };
                events.push_other(*at, kind(queue.clone()));
                Ok(())
            }
        }
    }

    /// Pauses or resumes a queue, making its record if needed (and dropping
    /// it again when it is resumed holding nothing).
    fn apply_queue_pause(&mut self, name: &str, paused: bool) {
        let queue = self.queues.entry(name.to_string()).or_default();
        queue.paused = paused;
        Self::queue_changed(&mut self.dirty_queues, name, queue);
        if queue.is_empty() && name != "default" {
            self.queues.remove(name);
        }
    }

    fn apply_enqueue(
        &mut self,
        at: Millis,
        jobs: &[Arc<Job>],
        replaced: &[JobId],
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        // Jobs a unique `replace` cancels: stored ones first, then any of
        // this same batch once it is stored.
        let (stored, in_batch): (Vec<JobId>, Vec<JobId>) = replaced.iter().partition(|id| self.jobs.contains_key(id));
        for id in stored {
            self.cancel(at, id, "unique_replace", events)?;
        }
        self.insert_new(at, jobs, events)?;
        for id in in_batch {
            self.cancel(at, id, "unique_replace", events)?;
        }
        Ok(())
    }

    /// Stages no longer: `available`, or `scheduled` until its time (rows 5/6).
    fn apply_activate(&mut self, at: Millis, id: JobId, events: &mut EventSink) -> Result<(), ApplyError> {
        match self.jobs.get(&id) {
            Some(job) if job.state == JobState::Pending => {}
            Some(job) => return Err(ApplyError(format!("record activates job {id}, which is {}", job.state.as_str()))),
            None => return Err(ApplyError(format!("record activates unknown job {id}"))),
        }
        let job = self.update(id, |job| activate(job, at))?;
        if job.state == JobState::Scheduled {
            events.push(at, EventKind::Scheduled, id);
        }
        Ok(())
    }

    pub(super) fn insert_new(
        &mut self,
        at: Millis,
        jobs: &[Arc<Job>],
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        for job in jobs {
            // A fresh id is above every stored one: most need no lookup.
            if job.id <= self.highest_stored_id && self.jobs.contains_key(&job.id) {
                return Err(ApplyError(format!("record enqueues job {} twice", job.id)));
            }
            events.push(at, EventKind::Enqueued, job.id);
            if job.state == JobState::Scheduled {
                events.push(at, EventKind::Scheduled, job.id);
            }
            self.insert_loaded(job.clone());
        }
        Ok(())
    }

    fn apply_claim(
        &mut self,
        at: Millis,
        worker_id: &Option<String>,
        claims: &[super::record::Claim],
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        for claim in claims {
            let job = self.update(claim.id, |job| {
                job.state = JobState::Active;
                job.attempt += 1;
                job.run_mut().started_at = Some(at);
                job.run_mut().worker_id = worker_id.clone();
                job.run_mut().visibility_deadline = Some(claim.visibility_deadline);
                job.run_mut().execution_deadline = Some(claim.execution_deadline);
                job.run_mut().claim_visibility_ms = (claim.visibility_deadline - at).max(0) as u64;
                job.set_progress(None);
            })?;
            if let Some((limit, key)) = job.limit_and_key() {
                self.dispatch.claimed(key, limit, at);
                self.claims_since_forget += 1;
            }
            events.push(at, EventKind::Started, claim.id);
        }
        // Claims older than the longest window decide nothing: forget them
        // now and then, so keys used once do not stay forever.
        if self.claims_since_forget >= 4096 {
            self.claims_since_forget = 0;
            self.dispatch.forget_before(at, DISPATCH_WINDOW_MS_MAX);
        }
        Ok(())
    }

    fn apply_ack(
        &mut self,
        at: Millis,
        id: JobId,
        result: &Option<String>,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        self.update(id, |job| {
            job.state = JobState::Completed;
            job.run_mut().completed_at = Some(at);
            job.run_mut().result = result.clone();
            job.run_mut().error = None;
            clear_claim(job);
        })?;
        events.push(at, EventKind::Completed, id);
        Ok(())
    }

    fn apply_fail(
        &mut self,
        at: Millis,
        id: JobId,
        report: &FailureReport,
        outcome: FailOutcome,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        let attempt = self.jobs.get(&id).map_or(0, |job| job.attempt);
        self.update(id, |job| fail(job, at, report, outcome))?;
        if outcome != FailOutcome::Requeue {
            events.push(at, EventKind::Failed { report: Box::new(report.clone()), attempt }, id);
        }
        push_outcome_event(events, at, id, report, outcome, "nack_requeue");
        Ok(())
    }

    /// Jobs whose time came. A job an earlier record of the same turn moved
    /// on (a chain step cancelled by its chain's failure) is left as it is.
    fn apply_promote(&mut self, at: Millis, ids: &[JobId]) -> Result<(), ApplyError> {
        for id in ids {
            if !self.jobs.get(id).is_some_and(|job| matches!(job.state, JobState::Scheduled | JobState::Retryable)) {
                continue;
            }
            self.update(*id, |job| {
                job.state = JobState::Available;
                job.set_enqueued_at(Some(at));
                if let Some(run) = job.run_if_any_mut() {
                    run.retry_at = None;
                }
            })?;
        }
        Ok(())
    }

    /// Unclaimed jobs past `expires_at`; as for promotions, a job that an
    /// earlier record of the turn ended or claimed is left as it is.
    fn apply_expire(&mut self, at: Millis, ids: &[JobId], events: &mut EventSink) -> Result<(), ApplyError> {
        for id in ids {
            let waiting = |job: &Job| {
                matches!(job.state, JobState::Scheduled | JobState::Retryable | JobState::Available | JobState::Pending)
            };
            if !self.jobs.get(id).is_some_and(waiting) {
                continue;
            }
            self.update(*id, |job| {
                let report = FailureReport::server("expired", "the job expired before a worker claimed it");
                job.state = JobState::Discarded;
                job.run_mut().discarded_at = Some(at);
                job.run_mut().retry_at = None;
                push_error(job, report, at);
            })?;
            events.push(at, EventKind::Expired, *id);
            events.push(at, EventKind::Discarded { reason: "expired" }, *id);
        }
        Ok(())
    }

    fn apply_timeout(
        &mut self,
        at: Millis,
        id: JobId,
        kind: TimeoutKind,
        outcome: FailOutcome,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        let job = self.jobs.get(&id).ok_or_else(|| ApplyError(format!("record names unknown job {id}")))?;
        let report = timeout_report(job, kind, at);
        let attempt = job.attempt;
        self.update(id, |job| fail(job, at, &report, outcome))?;
        events.push(at, EventKind::Failed { report: Box::new(report.clone()), attempt }, id);
        push_outcome_event(events, at, id, &report, outcome, "visibility_timeout");
        Ok(())
    }

    /// A revived job starts a fresh run: of the old one only the error
    /// history stays (docs/api.md, "Which times a job carries").
    fn apply_dead_letter_retry(&mut self, at: Millis, id: JobId, events: &mut EventSink) -> Result<(), ApplyError> {
        self.update(id, |job| {
            job.state = JobState::Available;
            job.attempt = 0;
            job.set_enqueued_at(Some(at));
            // Else an expired job would expire again at once.
            job.set_expires_at(None);
            let errors = job.run_if_any_mut().map(|run| std::mem::take(&mut run.errors)).unwrap_or_default();
            *job.run_mut() = JobRun { errors, ..JobRun::default() };
        })?;
        events.push(at, EventKind::Revived, id);
        Ok(())
    }

    fn apply_delete(&mut self, at: Millis, id: JobId, events: &mut EventSink) -> Result<(), ApplyError> {
        let job = self.jobs.remove(&id).ok_or_else(|| ApplyError(format!("record deletes unknown job {id}")))?;
        self.unindex_job(&job);
        events.push_gone(at, EventKind::Deleted, job);
        Ok(())
    }

    fn apply_heartbeat(&mut self, extensions: &[(JobId, Millis)]) -> Result<(), ApplyError> {
        for (id, deadline) in extensions {
            self.update(*id, |job| job.run_mut().visibility_deadline = Some(*deadline))?;
        }
        Ok(())
    }

    fn apply_worker_signal(
        &mut self,
        at: Millis,
        worker_id: &str,
        signal: WorkerSignal,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        self.worker_signals.insert(worker_id.to_string(), (signal, at));
        self.dirty_workers.insert(worker_id.to_string());
        let kind = EventKind::WorkerSignalled(Box::new(SignalledWorker {
            worker_id: worker_id.to_string(),
            terminate: signal == WorkerSignal::Terminate,
            active_job_ids: self.active_of_worker(worker_id),
            by: "operator",
        }));
        events.push_other(at, kind);
        Ok(())
    }

    fn apply_cron_fire(
        &mut self,
        at: Millis,
        name: &str,
        fire: &super::cron_table::CronFire,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        let entry =
            self.crons.get(name).cloned().ok_or_else(|| ApplyError(format!("record fires unknown cron {name}")))?;
        let definition = &entry.definition;
        let info = |scheduled_time| CronInfo {
            name: name.to_string(),
            schedule: definition.schedule.clone(),
            timezone: definition.timezone.clone(),
            scheduled_time,
        };
        if fire.missed > 0 {
            let kind = EventKind::CronSkipped(Box::new(CronSkip {
                cron: info(fire.scheduled),
                reason: "misfire",
                existing_job_id: None,
                missed_count: Some(fire.missed),
            }));
            events.push_other(at, kind);
        }
        let mut updated = entry.as_ref().clone();
        updated.next_run_at = fire.next_run_at;
        match &fire.outcome {
            CronOutcome::Enqueued { job, cancelled, waits_for, replaced } => {
                if self.jobs.contains_key(&job.id) {
                    return Err(ApplyError(format!("cron record enqueues job {} twice", job.id)));
                }
                // The run waits before anything is cancelled: if the previous
                // run is also the unique holder `replace` cancels, its end
                // releases the waiting run instead of leaving it pending.
                if let Some(previous) = waits_for {
                    self.crons.waiters.insert(*previous, job.id);
                }
                if let Some(previous) = cancelled {
                    self.cancel(at, *previous, "cron_cancel_previous", events)?;
                }
                for id in replaced {
                    if self.jobs.get(id).is_some_and(|job| !job.state.is_terminal()) {
                        self.cancel(at, *id, "unique_replace", events)?;
                    }
                }
                updated.run_count += 1;
                updated.last_run_at = Some(fire.scheduled);
                updated.last_job_id = Some(job.id);
                let kind =
                    EventKind::CronTriggered { cron: Box::new(info(fire.scheduled)), run_count: updated.run_count };
                events.push(at, kind, job.id);
                events.push(at, EventKind::Enqueued, job.id);
                self.insert_loaded(job.clone());
            }
            CronOutcome::Skipped { existing } => {
                let kind = EventKind::CronSkipped(Box::new(CronSkip {
                    cron: info(fire.scheduled),
                    reason: "overlap_skip",
                    existing_job_id: Some(*existing),
                    missed_count: None,
                }));
                events.push_other(at, kind);
            }
            CronOutcome::Duplicate { existing } => {
                let kind = EventKind::CronSkipped(Box::new(CronSkip {
                    cron: info(fire.scheduled),
                    reason: "duplicate",
                    existing_job_id: Some(*existing),
                    missed_count: None,
                }));
                events.push_other(at, kind);
            }
            CronOutcome::QueuePaused => {
                let kind = EventKind::CronSkipped(Box::new(CronSkip {
                    cron: info(fire.scheduled),
                    reason: "queue_paused",
                    existing_job_id: None,
                    missed_count: None,
                }));
                events.push_other(at, kind);
            }
            CronOutcome::SchemaNotRegistered => {
                let kind = EventKind::CronSkipped(Box::new(CronSkip {
                    cron: info(fire.scheduled),
                    reason: "schema_not_registered",
                    existing_job_id: None,
                    missed_count: None,
                }));
                events.push_other(at, kind);
            }
        }
        if let Some(gap) = fire.skipped_gap {
            let kind = EventKind::CronSkipped(Box::new(CronSkip {
                cron: info(gap),
                reason: "dst_skip",
                existing_job_id: None,
                missed_count: None,
            }));
            events.push_other(at, kind);
        }
        self.crons.put(updated).map_err(ApplyError)
    }

    /// Removes terminal jobs for good.
    fn prune(&mut self, ids: &[JobId]) -> Result<(), ApplyError> {
        for id in ids {
            match self.jobs.get(id) {
                Some(job) if job.state.is_terminal() => {}
                Some(_) => return Err(ApplyError(format!("record prunes job {id}, which is not terminal"))),
                None => return Err(ApplyError(format!("record prunes unknown job {id}"))),
            }
            let job = self.jobs.remove(id).expect("checked above");
            self.unindex_job(&job);
        }
        Ok(())
    }

    /// The state as an image, jobs in no particular order: cheap enough for
    /// the engine thread (a pointer per job); sorting and encoding can
    /// happen elsewhere.
    pub fn image(&self) -> StateImage {
        let jobs = self.jobs.handles();
        let paused_queues =
            self.queues.iter().filter(|(_, queue)| queue.paused).map(|(name, _)| name.clone()).collect();
        let worker_signals =
            self.worker_signals.iter().map(|(worker, (signal, at))| (worker.clone(), *signal, *at)).collect();
        let crons = self.crons.entries().map(|entry| entry.as_ref().clone()).collect();
        let cron_waiters = self.crons.waiters.iter().map(|(previous, waiting)| (*previous, *waiting)).collect();
        // Claims too old to decide anything are left out, so the image does
        // not depend on when they were last forgotten.
        let since = self.latest_at.saturating_sub(DISPATCH_WINDOW_MS_MAX);
        let dispatch_claims = self
            .dispatch
            .claims_image()
            .into_iter()
            .map(|(key, claims)| (key, claims.into_iter().filter(|at| *at > since).collect::<Vec<_>>()))
            .filter(|(_, claims)| !claims.is_empty())
            .collect();
        let workflows = self.workflows.values().cloned().collect();
        let schemas = self.schemas.values().cloned().collect();
        let webhooks = self.webhooks.values().cloned().collect();
        let deliveries = self.outbox.deliveries().cloned().collect();
        StateImage {
            jobs,
            paused_queues,
            ids: self.ids.clone(),
            reserved: 0,
            worker_signals,
            crons,
            cron_waiters,
            dispatch_claims,
            workflows,
            schemas,
            webhooks,
            deliveries,
        }
    }

    /// Rebuilds the state from a snapshot image.
    pub fn from_image(mut image: StateImage, retention: Retention) -> Result<Self, String> {
        let mut state = State::new(retention);
        let mut policies = SharedPolicies::default();
        let mut loaded = LoadedJobs::new(image.jobs.len());
        // Snapshots are written in id order; a job held twice is damage.
        image.jobs.sort_by_key(|job| job.id);
        if let Some(twice) = image.jobs.windows(2).find(|pair| pair[0].id == pair[1].id) {
            return Err(format!("job {} is held twice", twice[0].id));
        }
        for mut job in std::mem::take(&mut image.jobs) {
            if let Some(decoded) = Arc::get_mut(&mut job) {
                policies.share(&mut decoded.retry);
            }
            state.load_job(job, &mut loaded);
        }
        state.store_loaded(loaded);
        state.finish_loading(image)?;
        Ok(state)
    }

    /// Takes one job of the snapshot being loaded into a new state: indexes
    /// it and gathers it into `loaded`, for [`State::store_loaded`] once all
    /// are in (then [`State::finish_loading`]).
    pub(crate) fn load_job(&mut self, job: Arc<Job>, loaded: &mut LoadedJobs) {
        self.note_loaded(&job);
        loaded.push(job);
    }

    /// Stores the jobs of the snapshot being loaded, all at once.
    pub(crate) fn store_loaded(&mut self, loaded: LoadedJobs) {
        self.jobs.store_loaded(loaded);
    }

    /// Takes the rest of the snapshot being loaded: everything of `image`
    /// but its jobs, which came one by one.
    pub(crate) fn finish_loading(&mut self, image: StateImage) -> Result<(), String> {
        let state = self;
        for name in image.paused_queues {
            let queue = state.queues.entry(name.clone()).or_default();
            queue.paused = true;
            Self::queue_changed(&mut state.dirty_queues, &name, queue);
        }
        for (worker, signal, at) in image.worker_signals {
            state.dirty_workers.insert(worker.clone());
            state.worker_signals.insert(worker, (signal, at));
        }
        for entry in image.crons {
            let name = entry.definition.name.clone();
            state.crons.put(entry).map_err(|error| format!("snapshot cron entry {name}: {error}"))?;
        }
        state.crons.waiters = image.cron_waiters.into_iter().collect();
        for (key, claims) in image.dispatch_claims {
            state.dispatch.load_claims(key, claims);
        }
        for workflow in image.workflows {
            state.ids.observe(workflow.id);
            for callback in &workflow.callbacks {
                state.ids.observe(callback.job.id);
            }
            if let Some(ended_at) = workflow.ended_at {
                state.terminal_workflows.insert((ended_at, workflow.id));
                state.terminal_workflow_bytes += workflow.held_bytes();
            }
            state.dirty_workflows.insert(workflow.id);
            state.highest_stored_id = state.highest_stored_id.max(workflow.id);
            state.workflows.insert(workflow.id, workflow);
        }
        for subscription in image.webhooks {
            state.ids.observe(subscription.id);
            state.dirty_webhooks.push(subscription.id);
            state.webhooks.insert(subscription.id, subscription);
        }
        let mut previous: Option<Arc<super::outbox::Delivery>> = None;
        for mut delivery in image.deliveries {
            super::outbox::share_body(previous.as_ref(), &mut delivery);
            state.outbox.insert(delivery.clone()).map_err(|problem| format!("snapshot: {problem}"))?;
            previous = Some(delivery);
        }
        for entry in image.schemas {
            state.dirty_schemas.push(entry.uri.clone());
            state.schemas.insert(entry.uri.clone(), entry);
        }
        state.ids = image.ids;
        Ok(())
    }

    /// Checks that every job sits in exactly the structures its state implies.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut counts: BTreeMap<&str, [u64; 8]> = BTreeMap::new();
        let mut live = 0;
        let mut with_deadline = 0;
        for job in self.jobs.values() {
            let id = job.id;
            counts.entry(job.queue.as_str()).or_default()[job.state.index()] += 1;
            if !job.state.is_terminal() {
                live += 1;
            }
            let queue = self
                .queues
                .get(job.queue.as_str())
                .ok_or_else(|| format!("job {id} in unknown queue {}", job.queue))?;
            let in_ready = match job.dispatch_key() {
                Some(key) => queue.limited.contains(key, &Self::ready_key(job)),
                None => queue.ready.contains(&Self::ready_key(job)),
            };
            if in_ready != (job.state == JobState::Available) {
                return Err(format!("job {id} is {} but in_ready={in_ready}", job.state.as_str()));
            }
            if let Some(deadline) = self.deadline_of(job) {
                with_deadline += 1;
                if !self.timers.contains(deadline, id) {
                    return Err(format!("job {id} has deadline {deadline} but no timer"));
                }
            }
            times_fit_state(job)?;
            if (job.state == JobState::Active) != job.run().visibility_deadline.is_some() {
                return Err(format!(
                    "job {id} is {} with visibility deadline {:?}",
                    job.state.as_str(),
                    job.run().visibility_deadline
                ));
            }
        }
        let indexed: usize = self.active_by_worker.values().map(|ids| ids.len()).sum();
        let claimed =
            self.jobs.values().filter(|job| job.state == JobState::Active && job.run().worker_id.is_some()).count();
        if indexed != claimed {
            return Err(format!("{indexed} jobs indexed by worker, {claimed} active jobs with a worker"));
        }
        if with_deadline != self.timers.len() {
            return Err(format!("{} timers for {with_deadline} jobs with deadlines", self.timers.len()));
        }
        if live != self.live_jobs {
            return Err(format!("live count {} but {live} live jobs", self.live_jobs));
        }
        let live_bytes: u64 =
            self.jobs.values().filter(|job| !job.state.is_terminal()).map(|job| job.held_bytes()).sum();
        if live_bytes != self.live_bytes {
            return Err(format!("live bytes {} but live jobs hold {live_bytes}", self.live_bytes));
        }
        let terminal: Vec<&Job> = self.jobs.values().filter(|job| job.state.is_terminal()).collect();
        let terminal_bytes: u64 = terminal.iter().map(|job| job.held_bytes()).sum();
        if terminal.len() != self.terminal.len() || terminal_bytes != self.terminal_bytes {
            return Err(format!(
                "{} terminal jobs of {terminal_bytes} bytes, indexed {} of {} bytes",
                terminal.len(),
                self.terminal.len(),
                self.terminal_bytes
            ));
        }
        if let Some(job) =
            terminal.iter().find(|job| Self::terminal_key(job).is_none_or(|key| !self.terminal.contains(&key)))
        {
            return Err(format!("terminal job {} is not in the pruning order", job.id));
        }
        let mut unique: HashMap<UniqueKey, Vec<JobId>> = HashMap::new();
        let mut active: HashMap<&str, u32> = HashMap::new();
        let mut rates: HashMap<(&str, u32), u32> = HashMap::new();
        for job in self.jobs.values().filter(|job| !job.state.is_terminal()) {
            if let Some((_, key)) = job.unique() {
                unique.entry(key).or_default().push(job.id);
            }
            if let Some((DispatchLimit { rate: Some(rate), .. }, key)) = job.limit_and_key() {
                *rates.entry((key, rate.count)).or_default() += 1;
            }
            if job.state == JobState::Active
                && let Some(key) = job.dispatch_key()
            {
                *active.entry(key).or_default() += 1;
            }
        }
        unique.values_mut().for_each(|ids| ids.sort());
        let ended: Vec<&Arc<Workflow>> =
            self.workflows.values().filter(|workflow| workflow.state.is_terminal()).collect();
        let ended_bytes: u64 = ended.iter().map(|workflow| workflow.held_bytes()).sum();
        if ended.len() != self.terminal_workflows.len() || ended_bytes != self.terminal_workflow_bytes {
            return Err(format!(
                "{} ended workflows of {ended_bytes} bytes, indexed {} of {} bytes",
                ended.len(),
                self.terminal_workflows.len(),
                self.terminal_workflow_bytes
            ));
        }
        if unique != self.unique_index {
            return Err("the unique index does not match the live jobs' unique keys".to_string());
        }
        let indexed: HashMap<&str, u32> = self.dispatch.active_counts().collect();
        if indexed != active {
            return Err(format!("dispatch keys count {indexed:?} active jobs, jobs say {active:?}"));
        }
        let indexed: HashMap<(&str, u32), u32> = self.dispatch.live_rates().collect();
        if indexed != rates {
            return Err(format!("dispatch keys hold rates {indexed:?} of live jobs, jobs say {rates:?}"));
        }
        self.crons.check_invariants()?;
        for (previous, waiting) in &self.crons.waiters {
            if self.jobs.get(previous).is_none_or(|job| job.state.is_terminal()) {
                return Err(format!("cron run {waiting} waits on {previous}, which has ended"));
            }
        }
        for (name, queue) in &self.queues {
            let expected = counts.get(name.as_str()).copied().unwrap_or_default();
            if queue.counts != expected {
                return Err(format!("queue {name} counts {:?}, jobs say {expected:?}", queue.counts));
            }
            let ready = (queue.ready.len() + queue.limited.len()) as u64;
            if ready != expected[JobState::Available.index()] {
                return Err(format!("queue {name} ready order holds {ready} jobs"));
            }
        }
        Ok(())
    }
}

/// The times a job carries in its state (docs/api.md, "Which times a job
/// carries"): each end time only in its own end state, `completed_at` also
/// on a job a failed attempt discarded, `retry_at` only while `retryable`,
/// and `started_at` once the run was claimed, never while it waits for its
/// first claim.
fn times_fit_state(job: &Job) -> Result<(), String> {
    let run = job.run();
    let state = job.state;
    let completed_fits = match state {
        JobState::Completed => run.completed_at.is_some(),
        JobState::Discarded => run.completed_at.is_none_or(|at| Some(at) == run.discarded_at),
        _ => run.completed_at.is_none(),
    };
    // A requeue gives the attempt back but not the claim's `started_at`.
    let started_fits = match run.started_at {
        Some(_) => !matches!(state, JobState::Pending | JobState::Scheduled),
        None => job.attempt == 0,
    };
    let enqueued_fits = match state {
        JobState::Pending | JobState::Scheduled => job.enqueued_at().is_none(),
        JobState::Available | JobState::Active | JobState::Retryable | JobState::Completed => {
            job.enqueued_at().is_some()
        }
        JobState::Discarded | JobState::Cancelled => true,
    };
    if !completed_fits
        || !started_fits
        || !enqueued_fits
        || run.cancelled_at.is_some() != (state == JobState::Cancelled)
        || run.discarded_at.is_some() != (state == JobState::Discarded)
        || run.retry_at.is_some() != (state == JobState::Retryable)
    {
        return Err(format!("job {} is {} with times {run:?}", job.id, state.as_str()));
    }
    Ok(())
}

/// Rows 5/6: a `pending` job becomes `scheduled` until its time, else `available`.
pub(super) fn activate(job: &mut Job, at: Millis) {
    if job.scheduled_at().is_some_and(|scheduled| scheduled > at) {
        job.state = JobState::Scheduled;
    } else {
        job.state = JobState::Available;
        job.set_enqueued_at(Some(at));
    }
    job.set_activated_at(at);
}

fn clear_claim(job: &mut Job) {
    if let Some(run) = job.run_if_any_mut() {
        run.visibility_deadline = None;
        run.execution_deadline = None;
        run.claim_visibility_ms = 0;
    }
}

fn push_error(job: &mut Job, report: FailureReport, at: Millis) {
    let attempt = job.attempt;
    let run = job.run_mut();
    run.errors.push(ErrorEntry { report: report.clone(), attempt, occurred_at: at });
    if run.errors.len() > ERROR_HISTORY_MAX {
        run.errors.remove(0);
    }
    run.error = Some(report);
}

/// The effects of a failed attempt (rows 9–14 of the state table).
fn fail(job: &mut Job, at: Millis, report: &FailureReport, outcome: FailOutcome) {
    push_error(job, report.clone(), at);
    clear_claim(job);
    match outcome {
        FailOutcome::Retry { retry_at, delay_ms } => {
            job.state = JobState::Retryable;
            job.run_mut().retry_at = Some(retry_at);
            job.run_mut().retry_delay_ms = Some(delay_ms);
        }
        FailOutcome::Discard => {
            job.state = JobState::Discarded;
            job.run_mut().completed_at = Some(at);
            job.run_mut().discarded_at = Some(at);
        }
        FailOutcome::Requeue => {
            job.state = JobState::Available;
            job.attempt = job.attempt.saturating_sub(1);
            job.set_enqueued_at(Some(at));
        }
        FailOutcome::Release => {
            job.state = JobState::Available;
            job.set_enqueued_at(Some(at));
        }
    }
}

fn push_outcome_event(
    events: &mut EventSink,
    at: Millis,
    id: JobId,
    report: &FailureReport,
    outcome: FailOutcome,
    requeue_reason: &'static str,
) {
    match outcome {
        FailOutcome::Retry { .. } => events.push(at, EventKind::Retrying { report: Box::new(report.clone()) }, id),
        FailOutcome::Discard => {
            let reason = if report.retryable == Some(false) { "non_retryable" } else { "exhausted" };
            events.push(at, EventKind::Discarded { reason }, id)
        }
        FailOutcome::Requeue | FailOutcome::Release => {
            events.push(at, EventKind::Requeued { reason: requeue_reason }, id)
        }
    }
}

/// The server-made failure report of a timed-out claim.
pub fn timeout_report(job: &Job, kind: TimeoutKind, at: Millis) -> FailureReport {
    match kind {
        TimeoutKind::Visibility => FailureReport::server(
            "visibility_timeout",
            "the worker's reservation ran out without ack, nack or heartbeat",
        ),
        TimeoutKind::Execution => {
            let elapsed = job.run().started_at.map_or(0, |started| at - started);
            let mut report =
                FailureReport::server("timeout", format!("the attempt ran longer than {} ms", job.timeout_ms));
            report.details = Some(format!("{{\"limit_ms\":{},\"elapsed_ms\":{elapsed}}}", job.timeout_ms));
            report
        }
    }
}
