//! The backend seam: every operation of the service, as one trait.
//!
//! The HTTP front end and the embedding API ([`crate::Svc`]) reach the
//! service only through [`Backend`]: typed requests in, typed answers and
//! [`EngineError`] out, each answer a
//! [`Pending`] that can be awaited or waited for. The local engine
//! ([`EngineHandle`](crate::engine::EngineHandle), `local.rs`) is the first
//! implementation. Every method is one unit of work a backend can do as one
//! transaction (a database backend: one SQL transaction), and reads take
//! typed filters, never closures, so they can become queries.
//!
//! What is not here is wiring, not service: the clock, job defaults,
//! metrics, and the local engine's snapshots and shutdown.

mod local;
#[cfg(feature = "postgres")]
pub mod postgres;

use std::sync::Arc;

use crate::cron::CronDefinition;
use crate::engine::{
    AckMany, AckOutcome, Backpressure, BulkAction, BulkOutcome, Cancelled, CronEntry, DeadLetterCursor, EngineError,
    EngineFailure, Enqueued, Event, EventId, EventPage, FetchRequest, HeartbeatOutcome, JobCursor, JobFilter, JobsPage,
    MinuteCount, Overview, Pending, QueueStats, QueueSummary, WebhookChange, WorkerEntry, WorkerSignal, WorkerState,
    Workflow,
};
use crate::job::{FailureReport, Job, JobId, JobProgress, NewJob, SubscriptionId, WorkflowId};
use crate::schema::{SchemaEntry, SchemaRegistration};
use crate::webhook::Subscription;
use crate::webhook::subscription::{NewSubscription, pattern_matches};
use crate::workflow::WorkflowDefinition;

/// A page of a listing: the items, and whether more follow.
pub type Page<T> = (Vec<T>, bool);

/// Every operation of the service. Writes answer once their change is
/// durable; reads see every write answered before them.
pub trait Backend: Send + Sync + 'static {
    // Jobs.

    /// Enqueues jobs atomically: all of them or none; jobs naming a schema
    /// are checked against it first.
    fn enqueue(&self, jobs: Vec<NewJob>) -> Pending<Vec<Enqueued>>;
    fn job(&self, id: JobId) -> Pending<Option<Arc<Job>>>;
    /// Cancels a job that has not ended (again: no change, same answer).
    fn cancel(&self, id: JobId) -> Pending<Cancelled>;
    /// Activates a staged (`pending`) job.
    fn activate(&self, id: JobId) -> Pending<Arc<Job>>;
    /// Up to `limit` jobs that `filter` keeps, from `from` on, in a stable
    /// order; a page may stop short of `limit` at the backend's bound on
    /// the work one page does, and then says where to go on.
    fn jobs_page(&self, filter: JobFilter, from: Option<JobCursor>, limit: usize) -> Pending<JobsPage>;
    /// Applies a bulk action to each listed job on its own (at most
    /// [`crate::engine::BULK_CHUNK_MAX`]); see [`run_bulk`] for a filter.
    fn bulk_jobs(&self, action: BulkAction, ids: Vec<JobId>) -> Pending<BulkOutcome>;

    // Workers.

    /// Claims up to `request.count` jobs; with `wait_ms`, waits that long
    /// for one to appear when none qualifies (long polling).
    fn fetch(&self, request: FetchRequest, wait_ms: u64) -> Pending<Vec<Arc<Job>>>;
    /// Completes an active job; `result` is compact JSON text.
    fn ack(&self, id: JobId, result: Option<String>, worker_id: Option<String>) -> Pending<Arc<Job>>;
    /// Completes several jobs, each on its own, then claims the next ones
    /// in the same durable step (docs/api.md, "Ack").
    fn ack_many(&self, request: AckMany) -> Pending<AckOutcome>;
    /// Reports a failed attempt; the retry policy decides what follows (with
    /// `requeue`, the job goes back at once and the attempt does not count).
    fn fail(&self, id: JobId, report: FailureReport, requeue: bool, worker_id: Option<String>) -> Pending<Arc<Job>>;
    /// Extends the claims of a worker's active jobs (the listed ones, or all).
    fn heartbeat(
        &self,
        worker_id: String,
        active_jobs: Option<Vec<JobId>>,
        visibility_timeout_ms: Option<u64>,
    ) -> Pending<HeartbeatOutcome>;
    /// Reports progress on an active job (docs/api.md, "Progress").
    fn report_progress(&self, id: JobId, progress: JobProgress, worker_id: Option<String>) -> Pending<Arc<Job>>;
    fn workers_page(
        &self,
        after: Option<String>,
        limit: usize,
        state: Option<WorkerState>,
    ) -> Pending<Page<WorkerEntry>>;
    fn worker(&self, worker_id: String) -> Pending<Option<WorkerEntry>>;
    fn signal_worker(&self, worker_id: String, signal: WorkerSignal) -> Pending<WorkerEntry>;
    /// Forgets a worker's entry and signal; its jobs are untouched.
    fn forget_worker(&self, worker_id: String) -> Pending<()>;

    // Queues.

    fn queues_page(&self, after: Option<String>, limit: usize) -> Pending<Page<QueueSummary>>;
    /// A queue's figures and its last minute; `None` for a queue that holds
    /// nothing and is not paused.
    fn queue_stats(&self, name: String) -> Pending<Option<QueueStats>>;
    /// Pauses (`true`) or resumes a queue; answers its figures.
    fn pause_queue(&self, name: String, paused: bool) -> Pending<QueueSummary>;
    /// Sets (`Some`) or removes a queue's backpressure; answers its figures.
    fn configure_queue(&self, name: String, backpressure: Option<Backpressure>) -> Pending<QueueSummary>;
    /// Totals across queues, workers and the dead letter listing.
    fn overview(&self) -> Pending<Overview>;
    /// The queues listed, as [`Overview::queues`], without counting jobs.
    fn queue_count(&self) -> Pending<usize>;
    /// The workers known, in all and in each state, as in the overview.
    fn worker_counts(&self) -> Pending<(usize, Vec<(WorkerState, usize)>)>;
    /// Jobs completed and attempts failed per minute over the last 24
    /// hours, of one queue or of all: the minutes with counts, oldest first.
    fn throughput_minutes(&self, queue: Option<String>) -> Pending<Vec<MinuteCount>>;

    // The dead letter listing.

    /// Newest first: up to `limit` jobs after `after`, and the cursor of
    /// the next page if more follow.
    fn dead_letter_page(
        &self,
        after: Option<DeadLetterCursor>,
        limit: usize,
        queue: Option<String>,
    ) -> Pending<(Vec<Arc<Job>>, Option<DeadLetterCursor>)>;
    /// Sends a discarded job back to `available`, as a fresh run.
    fn dead_letter_retry(&self, id: JobId) -> Pending<Arc<Job>>;
    fn dead_letter_delete(&self, id: JobId) -> Pending<()>;
    /// How many jobs the listing holds, of one queue or of all.
    fn dead_letter_count(&self, queue: Option<String>) -> Pending<u64>;

    // Cron.

    fn crons_page(&self, after: Option<String>, limit: usize, enabled: Option<bool>) -> Pending<Page<Arc<CronEntry>>>;
    fn cron(&self, name: String) -> Pending<Option<Arc<CronEntry>>>;
    /// Registers an entry or replaces the one of its name; says whether it is new.
    fn cron_put(&self, definition: CronDefinition) -> Pending<(Arc<CronEntry>, bool)>;
    /// Changes an entry, provided it is still at `revision`.
    fn cron_patch(&self, definition: CronDefinition, revision: u64) -> Pending<(Arc<CronEntry>, bool)>;
    fn cron_delete(&self, name: String) -> Pending<Arc<CronEntry>>;

    // Workflows.

    /// Creates a workflow; answers its id.
    fn create_workflow(&self, definition: WorkflowDefinition) -> Pending<WorkflowId>;
    fn workflow(&self, id: WorkflowId) -> Pending<Option<Arc<Workflow>>>;
    fn cancel_workflow(&self, id: WorkflowId) -> Pending<()>;
    /// Workflows by id (oldest first), running and ended ones still held.
    fn workflows_page(&self, after: Option<WorkflowId>, limit: usize) -> Pending<Page<Arc<Workflow>>>;

    // Schemas.

    fn register_schema(&self, registration: SchemaRegistration) -> Pending<Arc<SchemaEntry>>;
    fn delete_schema(&self, uri: String) -> Pending<Arc<SchemaEntry>>;
    fn schema(&self, uri: String) -> Pending<Option<Arc<SchemaEntry>>>;
    fn schemas_page(&self, after: Option<String>, limit: usize) -> Pending<Page<Arc<SchemaEntry>>>;

    // Webhook subscriptions.

    fn create_webhook(&self, subscription: NewSubscription) -> Pending<Arc<Subscription>>;
    /// Changes a subscription's fields or its secrets.
    fn change_webhook(&self, id: SubscriptionId, change: WebhookChange) -> Pending<Arc<Subscription>>;
    fn delete_webhook(&self, id: SubscriptionId) -> Pending<Arc<Subscription>>;
    fn webhook(&self, id: SubscriptionId) -> Pending<Option<Arc<Subscription>>>;
    fn webhooks_page(&self, after: Option<SubscriptionId>, limit: usize) -> Pending<Page<Arc<Subscription>>>;

    // Events and health.

    /// Events after the one named `after`, oldest first.
    fn events_page(&self, after: Option<String>, limit: usize, filter: EventFilter) -> Pending<EventPage>;
    /// Where a live event stream starts: after `resume` (an event id a
    /// client saw last), else from `now` on (an id of the current
    /// millisecond).
    fn stream_start(&self, resume: Option<EventId>, now: EventId) -> Pending<StreamStart>;
    /// A live stream's next events from `from`, in the order they became
    /// visible: an event that commits late is sent late, never stepped
    /// past.
    fn stream_events(&self, from: StreamPosition, limit: usize, filter: EventFilter) -> Pending<StreamPage>;
    /// A round trip through the backend's writer (health checks).
    fn probe(&self) -> Pending<()>;
    /// A graceful shutdown begins: no more cron firings, workers are told
    /// to terminate.
    fn begin_drain(&self) -> Pending<()>;
    /// Completes once the backend takes no more writes (the process
    /// should then restart).
    fn failed(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>;
    /// Why the backend takes no more writes, once it does not.
    fn failure(&self) -> Option<EngineFailure>;
    /// What made it fail, in words.
    fn failure_cause(&self) -> Option<String>;
    /// New work is refused for lack of disk; work in hand can still end.
    fn disk_full(&self) -> bool;
    /// Jobs claimed and not yet reported on, across all queues.
    fn active_jobs(&self) -> u64;
}

/// What a bulk action by filter found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BulkReport {
    /// Jobs the filter kept that the action applies to.
    pub matched: u64,
    /// Jobs changed (none in a dry run).
    pub changed: u64,
    /// Matched jobs that had changed state by the time their chunk ran.
    pub skipped: u64,
}

/// Applies `action` to every job `filter` keeps that the action applies
/// to, a chunk of [`crate::engine::BULK_CHUNK_MAX`] jobs at a time, so that
/// other requests are served between chunks. A `dry_run` only counts.
/// Jobs that arrive while it runs may or may not be included.
pub async fn run_bulk(
    backend: &dyn Backend,
    mut filter: JobFilter,
    action: BulkAction,
    dry_run: bool,
) -> Result<BulkReport, EngineError> {
    use crate::job::JobState;
    let applicable: Vec<JobState> = JobState::ALL.into_iter().filter(|state| action.applies_to(*state)).collect();
    filter.states = if filter.states.is_empty() {
        applicable
    } else {
        filter.states.into_iter().filter(|state| applicable.contains(state)).collect()
    };
    let mut report = BulkReport::default();
    if filter.states.is_empty() {
        return Ok(report);
    }
    let mut from = None;
    loop {
        let page = backend.jobs_page(filter.clone(), from, crate::engine::BULK_CHUNK_MAX).outcome().await?;
        let ids: Vec<JobId> = page.jobs.iter().map(|job| job.id).collect();
        report.matched += ids.len() as u64;
        if !dry_run && !ids.is_empty() {
            let outcome = backend.bulk_jobs(action, ids).outcome().await?;
            report.changed += outcome.changed;
            report.skipped += outcome.skipped;
        }
        match page.next {
            Some(next) => from = Some(next),
            None => return Ok(report),
        }
    }
}

/// Where a live event stream has read to. Each backend makes and reads
/// its own kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamPosition {
    /// Past this event, in id order: the local engine publishes events in
    /// id order as their turn commits.
    AfterId(EventId),
    /// In the order of the transactions that wrote the events (PostgreSQL,
    /// where an event's id is made before its transaction commits): the
    /// stored rows from `(xid, row)` on, where `row` is the first event of
    /// a row, past the events of transaction `xid` up to `through`. Until
    /// the reading is past them, two marks of where the stream started:
    /// none of a transaction that had committed as of the snapshot
    /// `opened` (in the database's text form), and none up to the event
    /// `resumed.1` of a transaction up to `resumed.0`.
    Committed {
        xid: u64,
        row: EventId,
        through: Option<EventId>,
        opened: Option<String>,
        resumed: Option<(u64, EventId)>,
    },
}

/// Where a live stream starts.
#[derive(Debug, Clone)]
pub struct StreamStart {
    pub position: StreamPosition,
    /// The event to resume after is no longer held: events may have been
    /// missed, and the stream starts at the oldest held.
    pub gap: bool,
}

/// What a live stream read.
#[derive(Debug, Clone)]
pub struct StreamPage {
    /// The events the filter keeps, in the order they became visible.
    pub events: Vec<Event>,
    /// Where the next read starts: past every event looked at.
    pub position: StreamPosition,
    /// Whether more may follow at once (read again without waiting).
    pub has_more: bool,
}

/// Which events a listing keeps: each filter given must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// Event types: exact, `prefix.*` or `*`.
    pub types: Option<Vec<String>>,
    /// The queue of the event's job.
    pub queues: Option<Vec<String>>,
    /// The event's job type, as patterns like `types`.
    pub job_types: Option<Vec<String>>,
    /// The envelope's `subject`.
    pub subject: Option<String>,
}

impl EventFilter {
    pub fn keeps(&self, event: &Event) -> bool {
        let job = event.job.as_ref();
        self.types
            .as_ref()
            .is_none_or(|types| types.iter().any(|pattern| pattern_matches(pattern, event.kind.type_name())))
            && self
                .queues
                .as_ref()
                .is_none_or(|queues| job.is_some_and(|job| queues.iter().any(|queue| *queue == job.queue)))
            && self.job_types.as_ref().is_none_or(|types| {
                job.is_some_and(|job| types.iter().any(|pattern| pattern_matches(pattern, job.payload.job_type())))
            })
            && self.subject.as_ref().is_none_or(|subject| event.subject().as_ref() == Some(subject))
    }
}
