//! The local engine as a [`Backend`]: writes go to the single writer
//! through its handle, reads come from the read view and are answered at
//! once.

use std::sync::Arc;

use super::{Backend, EventFilter, Page, StreamPage, StreamPosition, StreamStart};
use crate::cron::CronDefinition;
use crate::engine::{
    AckMany, AckOutcome, Backpressure, BulkAction, BulkJobs, BulkOutcome, Cancelled, ConfigureQueue, CronEntry,
    DeadLetterCursor, EngineError, EngineFailure, EngineHandle, Enqueued, EventId, EventPage, FetchRequest,
    HeartbeatOutcome, JobCursor, JobFilter, JobsPage, MinuteCount, Overview, PauseQueue, Pending, QueueStats,
    QueueSummary, ReportProgress, WebhookChange, WorkerEntry, WorkerSignal, WorkerState, Workflow,
};
use crate::job::{FailureReport, Job, JobId, JobProgress, NewJob, SubscriptionId, WorkflowId};
use crate::schema::{SchemaEntry, SchemaRegistration};
use crate::webhook::Subscription;
use crate::webhook::subscription::NewSubscription;
use crate::workflow::WorkflowDefinition;

impl Backend for EngineHandle {
    fn enqueue(&self, jobs: Vec<NewJob>) -> Pending<Vec<Enqueued>> {
        EngineHandle::enqueue(self, jobs)
    }

    fn job(&self, id: JobId) -> Pending<Option<Arc<Job>>> {
        Pending::ready(Ok(EngineHandle::job(self, id)))
    }

    fn cancel(&self, id: JobId) -> Pending<Cancelled> {
        EngineHandle::cancel(self, id)
    }

    fn activate(&self, id: JobId) -> Pending<Arc<Job>> {
        EngineHandle::activate(self, id)
    }

    fn jobs_page(&self, filter: JobFilter, from: Option<JobCursor>, limit: usize) -> Pending<JobsPage> {
        Pending::ready(Ok(EngineHandle::jobs_page(self, &filter, from, limit)))
    }

    fn bulk_jobs(&self, action: BulkAction, ids: Vec<JobId>) -> Pending<BulkOutcome> {
        self.submit(BulkJobs { action, ids })
    }

    fn fetch(&self, request: FetchRequest, wait_ms: u64) -> Pending<Vec<Arc<Job>>> {
        self.fetch_waiting(request, wait_ms)
    }

    fn ack(&self, id: JobId, result: Option<String>, worker_id: Option<String>) -> Pending<Arc<Job>> {
        EngineHandle::ack(self, id, result, worker_id)
    }

    fn ack_many(&self, request: AckMany) -> Pending<AckOutcome> {
        self.submit(request)
    }

    fn fail(&self, id: JobId, report: FailureReport, requeue: bool, worker_id: Option<String>) -> Pending<Arc<Job>> {
        EngineHandle::fail(self, id, report, requeue, worker_id)
    }

    fn heartbeat(
        &self,
        worker_id: String,
        active_jobs: Option<Vec<JobId>>,
        visibility_timeout_ms: Option<u64>,
    ) -> Pending<HeartbeatOutcome> {
        EngineHandle::heartbeat(self, worker_id, active_jobs, visibility_timeout_ms)
    }

    fn report_progress(&self, id: JobId, progress: JobProgress, worker_id: Option<String>) -> Pending<Arc<Job>> {
        self.submit(ReportProgress { id, progress, worker_id })
    }

    fn workers_page(
        &self,
        after: Option<String>,
        limit: usize,
        state: Option<WorkerState>,
    ) -> Pending<Page<WorkerEntry>> {
        let keep = |entry: &WorkerEntry| state.is_none_or(|state| entry.state == state);
        Pending::ready(Ok(EngineHandle::workers_page(self, after.as_deref(), limit, keep)))
    }

    fn worker(&self, worker_id: String) -> Pending<Option<WorkerEntry>> {
        Pending::ready(Ok(EngineHandle::worker(self, &worker_id)))
    }

    fn signal_worker(&self, worker_id: String, signal: WorkerSignal) -> Pending<WorkerEntry> {
        EngineHandle::signal_worker(self, worker_id, signal)
    }

    fn forget_worker(&self, worker_id: String) -> Pending<()> {
        EngineHandle::forget_worker(self, worker_id)
    }

    fn queues_page(&self, after: Option<String>, limit: usize) -> Pending<Page<QueueSummary>> {
        Pending::ready(Ok(EngineHandle::queues_page(self, after.as_deref(), limit)))
    }

    fn queue_stats(&self, name: String) -> Pending<Option<QueueStats>> {
        Pending::ready(Ok(EngineHandle::queue_stats(self, &name)))
    }

    fn pause_queue(&self, name: String, paused: bool) -> Pending<QueueSummary> {
        self.submit(PauseQueue { queue: name, paused })
    }

    fn configure_queue(&self, name: String, backpressure: Option<Backpressure>) -> Pending<QueueSummary> {
        self.submit(ConfigureQueue { queue: name, backpressure })
    }

    fn overview(&self) -> Pending<Overview> {
        Pending::ready(Ok(EngineHandle::overview(self)))
    }

    fn queue_count(&self) -> Pending<usize> {
        Pending::ready(Ok(EngineHandle::queue_count(self)))
    }

    fn worker_counts(&self) -> Pending<(usize, Vec<(WorkerState, usize)>)> {
        Pending::ready(Ok(EngineHandle::worker_counts(self)))
    }

    fn throughput_minutes(&self, queue: Option<String>) -> Pending<Vec<MinuteCount>> {
        Pending::ready(Ok(EngineHandle::throughput_minutes(self, queue.as_deref())))
    }

    fn dead_letter_page(
        &self,
        after: Option<DeadLetterCursor>,
        limit: usize,
        queue: Option<String>,
    ) -> Pending<(Vec<Arc<Job>>, Option<DeadLetterCursor>)> {
        Pending::ready(Ok(EngineHandle::dead_letter_page(self, after, limit, queue.as_deref())))
    }

    fn dead_letter_retry(&self, id: JobId) -> Pending<Arc<Job>> {
        EngineHandle::dead_letter_retry(self, id)
    }

    fn dead_letter_delete(&self, id: JobId) -> Pending<()> {
        EngineHandle::dead_letter_delete(self, id)
    }

    fn dead_letter_count(&self, queue: Option<String>) -> Pending<u64> {
        Pending::ready(Ok(EngineHandle::dead_letter_count(self, queue.as_deref())))
    }

    fn crons_page(&self, after: Option<String>, limit: usize, enabled: Option<bool>) -> Pending<Page<Arc<CronEntry>>> {
        let keep = |entry: &CronEntry| enabled.is_none_or(|enabled| entry.definition.enabled == enabled);
        Pending::ready(Ok(EngineHandle::crons_page(self, after.as_deref(), limit, keep)))
    }

    fn cron(&self, name: String) -> Pending<Option<Arc<CronEntry>>> {
        Pending::ready(Ok(EngineHandle::cron(self, &name)))
    }

    fn cron_put(&self, definition: CronDefinition) -> Pending<(Arc<CronEntry>, bool)> {
        EngineHandle::cron_put(self, definition)
    }

    fn cron_patch(&self, definition: CronDefinition, revision: u64) -> Pending<(Arc<CronEntry>, bool)> {
        EngineHandle::cron_patch(self, definition, revision)
    }

    fn cron_delete(&self, name: String) -> Pending<Arc<CronEntry>> {
        EngineHandle::cron_delete(self, name)
    }

    fn create_workflow(&self, definition: WorkflowDefinition) -> Pending<WorkflowId> {
        EngineHandle::create_workflow(self, definition)
    }

    fn workflow(&self, id: WorkflowId) -> Pending<Option<Arc<Workflow>>> {
        Pending::ready(Ok(EngineHandle::workflow(self, id)))
    }

    fn cancel_workflow(&self, id: WorkflowId) -> Pending<()> {
        EngineHandle::cancel_workflow(self, id)
    }

    fn workflows_page(&self, after: Option<WorkflowId>, limit: usize) -> Pending<Page<Arc<Workflow>>> {
        Pending::ready(Ok(EngineHandle::workflows_page(self, after, limit)))
    }

    fn register_schema(&self, registration: SchemaRegistration) -> Pending<Arc<SchemaEntry>> {
        EngineHandle::register_schema(self, registration)
    }

    fn delete_schema(&self, uri: String) -> Pending<Arc<SchemaEntry>> {
        EngineHandle::delete_schema(self, uri)
    }

    fn schema(&self, uri: String) -> Pending<Option<Arc<SchemaEntry>>> {
        Pending::ready(Ok(EngineHandle::schema(self, &uri)))
    }

    fn schemas_page(&self, after: Option<String>, limit: usize) -> Pending<Page<Arc<SchemaEntry>>> {
        Pending::ready(Ok(EngineHandle::schemas_page(self, after.as_deref(), limit)))
    }

    fn create_webhook(&self, subscription: NewSubscription) -> Pending<Arc<Subscription>> {
        EngineHandle::create_webhook(self, subscription)
    }

    fn change_webhook(&self, id: SubscriptionId, change: WebhookChange) -> Pending<Arc<Subscription>> {
        EngineHandle::change_webhook(self, id, change)
    }

    fn delete_webhook(&self, id: SubscriptionId) -> Pending<Arc<Subscription>> {
        EngineHandle::delete_webhook(self, id)
    }

    fn webhook(&self, id: SubscriptionId) -> Pending<Option<Arc<Subscription>>> {
        Pending::ready(Ok(EngineHandle::webhook(self, id)))
    }

    fn webhooks_page(&self, after: Option<SubscriptionId>, limit: usize) -> Pending<Page<Arc<Subscription>>> {
        Pending::ready(Ok(EngineHandle::webhooks_page(self, after, limit)))
    }

    fn events_page(&self, after: Option<String>, limit: usize, filter: EventFilter) -> Pending<EventPage> {
        Pending::ready(Ok(EngineHandle::events_page(self, after.as_deref(), limit, |event| filter.keeps(event))))
    }

    fn stream_start(&self, resume: Option<EventId>, now: EventId) -> Pending<StreamStart> {
        // A page of none that keeps all looks at one event at most.
        let gap = resume.is_some_and(|id| EngineHandle::events_page(self, Some(&id.to_string()), 0, |_| true).gap);
        Pending::ready(Ok(StreamStart { position: StreamPosition::AfterId(resume.unwrap_or(now)), gap }))
    }

    /// Events are published in id order as their turn commits, so the
    /// listing's order is the order they became visible.
    fn stream_events(&self, from: StreamPosition, limit: usize, filter: EventFilter) -> Pending<StreamPage> {
        let StreamPosition::AfterId(after) = from else {
            let error = crate::job::ValidationError::request(None, "not a position of this backend");
            return Pending::ready(Err(EngineError::Invalid { error, index: None }));
        };
        let page = EngineHandle::events_page(self, Some(&after.to_string()), limit, |event| filter.keeps(event));
        let position = StreamPosition::AfterId(page.next_after().unwrap_or(after));
        Pending::ready(Ok(StreamPage { events: page.events, position, has_more: page.has_more }))
    }

    fn probe(&self) -> Pending<()> {
        EngineHandle::probe(self)
    }

    fn begin_drain(&self) -> Pending<()> {
        EngineHandle::begin_drain(self)
    }

    fn failed(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(self.storage_failure())
    }

    fn failure(&self) -> Option<EngineFailure> {
        EngineHandle::failure(self)
    }

    fn failure_cause(&self) -> Option<String> {
        EngineHandle::failure_cause(self)
    }

    fn disk_full(&self) -> bool {
        EngineHandle::disk_full(self)
    }

    fn active_jobs(&self) -> u64 {
        EngineHandle::active_jobs(self)
    }
}
