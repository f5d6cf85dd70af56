//! The engine's only door: commands in, outcomes out, plus reads from the view.
//! Both the HTTP front end and embedding programs use it.

use std::sync::Arc;
use tokio::sync::oneshot;

use super::api::{Cancelled, EngineError, Enqueued, FetchRequest, HeartbeatOutcome, QueueStats, Unavailable};
use super::cron::table::{CronEntry, CronWrite};
use super::events::{Event, EventPage};
use super::inbox::Command;
use super::inbox::{InboxSender, SendError};
use super::requests::{self, Envelope, Reply, Request};
use super::view::{DeadLetterCursor, QueueSummary, ReadView};
use super::workers::entry::{WorkerEntry, WorkerSignal};
use super::workflows::table::Workflow;
use crate::clock::Clock;
use crate::cron::CronDefinition;
use crate::job::{FailureReport, Job, JobDefaults, JobId, NewJob, SubscriptionId, WorkflowId};
use crate::schema::SchemaEntry;
use crate::webhook::Subscription;
use crate::workflow::WorkflowDefinition;

/// An answer on its way: await [`Pending::outcome`], or [`Pending::wait`]
/// for it from synchronous code.
#[must_use = "a command's outcome says whether it happened"]
pub struct Pending<T> {
    receiver: Result<oneshot::Receiver<Result<T, EngineError>>, Result<T, EngineError>>,
}

impl<T> Pending<T> {
    /// An answer known at once (a read, or a request refused before it
    /// was sent).
    pub fn ready(outcome: Result<T, EngineError>) -> Pending<T> {
        Pending { receiver: Err(outcome) }
    }

    /// An answer to come through `sender`; dropping the sender answers
    /// that the backend stopped.
    pub fn channel() -> (oneshot::Sender<Result<T, EngineError>>, Pending<T>) {
        let (sender, receiver) = oneshot::channel();
        (sender, Pending { receiver: Ok(receiver) })
    }

    pub async fn outcome(self) -> Result<T, EngineError> {
        match self.receiver {
            Ok(receiver) => {
                receiver.await.unwrap_or(Err(EngineError::Unavailable { reason: Unavailable::EngineStopped }))
            }
            Err(outcome) => outcome,
        }
    }

    /// Blocks the calling thread until the outcome is known. Callable from
    /// any thread, a runtime's too (where it holds that thread meanwhile:
    /// async code should await [`Pending::outcome`] instead).
    pub fn wait(self) -> Result<T, EngineError> {
        match self.receiver {
            Ok(receiver) => {
                block_on(receiver).unwrap_or(Err(EngineError::Unavailable { reason: Unavailable::EngineStopped }))
            }
            Err(outcome) => outcome,
        }
    }
}

/// Runs `future` to its end on this thread, parking it while the future
/// waits. Unlike a runtime's own blocking wait, it does not refuse to run
/// on a runtime's thread, so closing an embedded engine from async code
/// (or dropping it there) works.
pub(crate) fn block_on<F: std::future::Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};

    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }

    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        match future.as_mut().poll(&mut context) {
            Poll::Ready(output) => return output,
            // A wake-up before the park makes the park return at once.
            Poll::Pending => std::thread::park(),
        }
    }
}

#[derive(Clone)]
pub struct EngineHandle {
    inbox: InboxSender,
    view: Arc<ReadView>,
    clock: Arc<dyn Clock>,
    defaults: Arc<JobDefaults>,
    metrics: Arc<crate::metrics::Metrics>,
}

impl EngineHandle {
    pub(crate) fn new(
        inbox: InboxSender,
        view: Arc<ReadView>,
        clock: Arc<dyn Clock>,
        defaults: JobDefaults,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Self {
        Self { inbox, view, clock, defaults: Arc::new(defaults), metrics }
    }

    /// Where the engine counts what it does.
    pub fn metrics(&self) -> &Arc<crate::metrics::Metrics> {
        &self.metrics
    }

    /// Sends a request to the engine; its outcome comes once the change is
    /// durable (see [`super::requests`] for every request).
    pub fn submit<R: Request>(&self, request: R) -> Pending<R::Output> {
        self.send(|reply| Command::Request(Box::new(Envelope { request, reply })))
    }

    fn send<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Pending<T> {
        let (reply, receiver) = oneshot::channel();
        let receiver = match self.inbox.send(make(reply)) {
            Ok(()) => Ok(receiver),
            Err(SendError::Full) => Err(Err(EngineError::Unavailable { reason: Unavailable::Overloaded })),
            Err(SendError::Stopped) => Err(Err(EngineError::Unavailable { reason: Unavailable::EngineStopped })),
        };
        Pending { receiver }
    }

    /// Enqueues jobs atomically: all of them or none. Jobs naming a schema
    /// are checked against it first.
    pub fn enqueue(&self, jobs: Vec<NewJob>) -> Pending<Vec<Enqueued>> {
        let batch = jobs.len() > 1;
        if let Err(error) = self.check_schemas(jobs.iter().enumerate().map(|(i, job)| (batch.then_some(i), job))) {
            return Pending::ready(Err(error));
        }
        self.submit(super::jobs::Enqueue { jobs })
    }

    /// Checks the `args` of every job that names a schema against it
    /// (docs/api.md, "Schemas"); the first job that fails decides the error.
    /// Registered schemas are read from the view: one registered or removed
    /// meanwhile is seen by the next request.
    fn check_schemas<'a>(&self, jobs: impl Iterator<Item = (Option<usize>, &'a NewJob)>) -> Result<(), EngineError> {
        for (index, job) in jobs {
            let Some(uri) = job.schema.as_deref() else { continue };
            crate::schema::check_job_args(self.view.schema(uri).as_deref(), uri, job.payload.args())
                .map_err(|error| EngineError::Invalid { error, index })?;
        }
        Ok(())
    }

    /// Activates a staged (`pending`) job.
    pub fn activate(&self, id: JobId) -> Pending<Arc<Job>> {
        self.submit(super::jobs::Activate { id })
    }

    /// Claims up to `request.count` available jobs.
    pub fn fetch(&self, request: FetchRequest) -> Pending<Vec<Arc<Job>>> {
        self.submit(super::jobs::Fetch { request, wait_ms: 0 })
    }

    /// Like [`EngineHandle::fetch`], but when no job qualifies, waits up to
    /// `wait_ms` for one to appear in the listed queues (long polling).
    pub fn fetch_waiting(&self, request: FetchRequest, wait_ms: u64) -> Pending<Vec<Arc<Job>>> {
        self.submit(super::jobs::Fetch { request, wait_ms })
    }

    /// Completes an active job; `result` is compact JSON text.
    pub fn ack(&self, id: JobId, result: Option<String>, worker_id: Option<String>) -> Pending<Arc<Job>> {
        self.submit(super::jobs::Ack { id, result, worker_id })
    }

    /// Reports a failed attempt; the retry policy decides what follows.
    pub fn fail(
        &self,
        id: JobId,
        report: FailureReport,
        requeue: bool,
        worker_id: Option<String>,
    ) -> Pending<Arc<Job>> {
        self.submit(super::jobs::Fail { id, report, requeue, worker_id })
    }

    /// Extends the visibility of a worker's active jobs; answers how many,
    /// and what the worker should do.
    pub fn heartbeat(
        &self,
        worker_id: String,
        active_jobs: Option<Vec<JobId>>,
        visibility_timeout_ms: Option<u64>,
    ) -> Pending<HeartbeatOutcome> {
        self.submit(super::jobs::Heartbeat { worker_id, active_jobs, visibility_timeout_ms })
    }

    /// Gives a known worker a signal (`quiet` or `terminate`).
    pub fn signal_worker(&self, worker_id: String, signal: WorkerSignal) -> Pending<WorkerEntry> {
        self.submit(super::workers::SignalWorker { worker_id, signal })
    }

    /// Forgets a worker's entry and signal; its jobs are untouched.
    pub fn forget_worker(&self, worker_id: String) -> Pending<()> {
        self.submit(super::workers::ForgetWorker { worker_id })
    }

    /// The worker registry by id, as of the last commit.
    pub fn workers_page(
        &self,
        after: Option<&str>,
        limit: usize,
        keep: impl Fn(&WorkerEntry) -> bool,
    ) -> (Vec<WorkerEntry>, bool) {
        self.view.workers_page(after, limit, keep)
    }

    pub fn worker(&self, worker_id: &str) -> Option<WorkerEntry> {
        self.view.worker(worker_id)
    }

    /// Sends a discarded job back to `available` with its attempts reset.
    pub fn dead_letter_retry(&self, id: JobId) -> Pending<Arc<Job>> {
        self.submit(super::jobs::DeadLetterRetry { id })
    }

    /// Removes a discarded job for good.
    pub fn dead_letter_delete(&self, id: JobId) -> Pending<()> {
        self.submit(super::jobs::DeadLetterDelete { id })
    }

    /// The dead letter listing, newest first, from the last commit: up to
    /// `limit` jobs after `after`, and the cursor of the next page if more follow.
    pub fn dead_letter_page(
        &self,
        after: Option<DeadLetterCursor>,
        limit: usize,
        queue: Option<&str>,
    ) -> (Vec<Arc<Job>>, Option<DeadLetterCursor>) {
        self.view.dead_letter_page(after, limit, queue)
    }

    /// Registers a cron entry, or replaces the one of the same name; says whether it is new.
    pub fn cron_put(&self, definition: CronDefinition) -> Pending<(Arc<CronEntry>, bool)> {
        if let Err(error) = self.check_cron_schema(&definition) {
            return Pending::ready(Err(error));
        }
        self.submit(super::cron::PutCron { definition, write: CronWrite::Upsert })
    }

    /// Changes a cron entry, provided it is still at `revision`.
    pub fn cron_patch(&self, definition: CronDefinition, revision: u64) -> Pending<(Arc<CronEntry>, bool)> {
        if let Err(error) = self.check_cron_schema(&definition) {
            return Pending::ready(Err(error));
        }
        self.submit(super::cron::PutCron { definition, write: CronWrite::Patch { revision } })
    }

    /// A cron entry's args are checked when it is registered; each firing
    /// only checks that the schema is still registered.
    fn check_cron_schema(&self, definition: &CronDefinition) -> Result<(), EngineError> {
        let Some(uri) = definition.schema() else { return Ok(()) };
        crate::schema::check_job_args(self.view.schema(&uri).as_deref(), &uri, definition.job.payload.args())
            .map_err(|error| EngineError::Invalid { error, index: None })
    }

    /// Removes a cron entry; jobs it already created are untouched.
    pub fn cron_delete(&self, name: String) -> Pending<Arc<CronEntry>> {
        self.submit(super::cron::DeleteCron { name })
    }

    /// Registers a schema checked and compiled by `schema::parse_registration`.
    pub fn register_schema(&self, registration: crate::schema::SchemaRegistration) -> Pending<Arc<SchemaEntry>> {
        self.submit(super::schemas::RegisterSchema { entry: registration.entry })
    }

    /// Removes a schema from the registry.
    pub fn delete_schema(&self, uri: String) -> Pending<Arc<SchemaEntry>> {
        self.submit(super::schemas::DeleteSchema { uri })
    }

    /// A registered schema, as of the last commit.
    pub fn schema(&self, uri: &str) -> Option<Arc<SchemaEntry>> {
        self.view.schema(uri)
    }

    /// Registered schemas by URI after `after`, and whether more follow.
    pub fn schemas_page(&self, after: Option<&str>, limit: usize) -> (Vec<Arc<SchemaEntry>>, bool) {
        self.view.schemas_page(after, limit)
    }

    /// Creates a webhook subscription.
    pub fn create_webhook(
        &self,
        subscription: crate::webhook::subscription::NewSubscription,
    ) -> Pending<Arc<Subscription>> {
        self.submit(super::webhooks::CreateWebhook { subscription })
    }

    /// Changes a webhook subscription (fields, or its secrets).
    pub fn change_webhook(
        &self,
        id: SubscriptionId,
        change: super::webhooks::WebhookChange,
    ) -> Pending<Arc<Subscription>> {
        self.submit(super::webhooks::ChangeWebhook { id, change })
    }

    /// Deletes a webhook subscription.
    pub fn delete_webhook(&self, id: SubscriptionId) -> Pending<Arc<Subscription>> {
        self.submit(super::webhooks::DeleteWebhook { id })
    }

    /// Reports how delivery attempts ended (the delivery pool); answers,
    /// for each, whether its delivery was abandoned.
    pub fn delivery_outcomes(&self, outcomes: Vec<super::webhooks::AttemptOutcome>) -> Pending<Vec<bool>> {
        self.submit(super::webhooks::DeliveryOutcomes { outcomes })
    }

    /// A webhook subscription, as of the last commit.
    pub fn webhook(&self, id: SubscriptionId) -> Option<Arc<Subscription>> {
        self.view.webhook(id)
    }

    /// Webhook subscriptions in creation order after `after`, and whether more follow.
    pub fn webhooks_page(&self, after: Option<SubscriptionId>, limit: usize) -> (Vec<Arc<Subscription>>, bool) {
        self.view.webhooks_page(after, limit)
    }

    /// Cron entries by name, as of the last commit.
    pub fn crons_page(
        &self,
        after: Option<&str>,
        limit: usize,
        keep: impl Fn(&CronEntry) -> bool,
    ) -> (Vec<Arc<CronEntry>>, bool) {
        self.view.crons_page(after, limit, keep)
    }

    pub fn cron(&self, name: &str) -> Option<Arc<CronEntry>> {
        self.view.cron(name)
    }

    /// Creates a workflow; answers its id.
    pub fn create_workflow(&self, definition: WorkflowDefinition) -> Pending<WorkflowId> {
        let members = definition.jobs.iter().enumerate().map(|(i, job)| (Some(i), job));
        let callbacks = definition.callbacks.iter().map(|(_, job)| (None, job));
        if let Err(error) = self.check_schemas(members.chain(callbacks)) {
            return Pending::ready(Err(error));
        }
        self.submit(super::workflows::CreateWorkflow { definition })
    }

    /// Cancels a running workflow.
    pub fn cancel_workflow(&self, id: WorkflowId) -> Pending<()> {
        self.submit(super::workflows::CancelWorkflow { id })
    }

    /// A workflow as of the last commit.
    pub fn workflow(&self, id: WorkflowId) -> Option<Arc<Workflow>> {
        self.view.workflow(id)
    }

    /// Up to `limit` workflows after `after`, by id, and whether more follow.
    pub fn workflows_page(&self, after: Option<WorkflowId>, limit: usize) -> (Vec<Arc<Workflow>>, bool) {
        self.view.workflows_page(after, limit)
    }

    /// A graceful shutdown begins: no more cron firings; workers seen in the
    /// last 90 s get a `worker.terminate` event.
    pub fn begin_drain(&self) -> Pending<()> {
        self.submit(requests::BeginDrain)
    }

    pub fn cancel(&self, id: JobId) -> Pending<Cancelled> {
        self.submit(super::jobs::Cancel { id })
    }

    /// A round trip through the engine (health checks).
    pub fn probe(&self) -> Pending<()> {
        self.submit(requests::Probe)
    }

    /// Makes the engine handle what is due now; useful with a manual clock.
    pub fn tick(&self) -> Pending<()> {
        self.submit(requests::Probe)
    }

    /// Writes a snapshot and returns once it is durable.
    pub fn snapshot(&self) -> Pending<()> {
        self.send(|reply| Command::Snapshot { reply })
    }

    /// The full committed state, as a snapshot would hold it.
    pub fn image(&self) -> Pending<super::image::StateImage> {
        self.send(|reply| Command::Image { reply })
    }

    pub(crate) fn shutdown(&self, snapshot: bool) -> Pending<()> {
        let (reply, receiver) = oneshot::channel();
        // Shutdown waits for room rather than failing on a full inbox.
        let receiver = match self.inbox.send(Command::Shutdown { snapshot, reply }) {
            Ok(()) => Ok(receiver),
            Err(_) => Err(Err(EngineError::Unavailable { reason: Unavailable::EngineStopped })),
        };
        Pending { receiver }
    }

    /// The job as of the last commit.
    pub fn job(&self, id: JobId) -> Option<Arc<Job>> {
        self.view.job(id)
    }

    /// Up to `limit` queues after the one named `after`, by name, as of the
    /// last commit, and whether more follow.
    pub fn queues_page(&self, after: Option<&str>, limit: usize) -> (Vec<QueueSummary>, bool) {
        self.view.queues_page(after, limit)
    }

    /// One queue's figures as of the last commit.
    pub fn queue(&self, name: &str) -> Option<QueueSummary> {
        self.view.queues().get(name).cloned()
    }

    /// A queue's figures and its last minute, or `None` for a queue that
    /// holds nothing and is not paused.
    pub fn queue_stats(&self, name: &str) -> Option<QueueStats> {
        let summary = self.queue(name)?;
        let (completed_last_minute, failed_last_minute) = self.view.throughput(name, self.clock.now_ms());
        Some(QueueStats { summary, completed_last_minute, failed_last_minute })
    }

    /// Up to `limit` jobs that `filter` keeps, from `from` on, as of the
    /// last commit (`jobs/listing.rs` says the order and the scan budget).
    pub fn jobs_page(
        &self,
        filter: &super::JobFilter,
        from: Option<super::JobCursor>,
        limit: usize,
    ) -> super::JobsPage {
        self.view.jobs_page(filter, from, limit)
    }

    /// The queues listed ([`Overview::queues`](super::api::Overview)).
    pub fn queue_count(&self) -> usize {
        self.view.queues().len()
    }

    /// The workers known, in all and in each state.
    pub fn worker_counts(&self) -> (usize, Vec<(super::workers::entry::WorkerState, usize)>) {
        self.view.worker_counts()
    }

    /// The service at a glance, as of the last commit.
    pub fn overview(&self) -> super::api::Overview {
        let now = self.clock.now_ms();
        let queues = self.view.queues();
        let mut overview = super::api::Overview { queues: queues.len(), ..Default::default() };
        for (name, queue) in queues.iter() {
            overview.paused_queues += usize::from(queue.paused);
            for (total, count) in overview.jobs.iter_mut().zip(queue.counts) {
                *total += count;
            }
            let (completed, failed) = self.view.throughput(name, now);
            overview.completed_last_minute += completed;
            overview.failed_last_minute += failed;
        }
        (overview.workers, overview.workers_by_state) = self.view.worker_counts();
        overview.dead_letter = self.view.dead_letter_len();
        overview
    }

    /// Jobs completed and attempts failed per minute over the last 24
    /// hours (minutes with counts only, oldest first): of one queue, or all.
    pub fn throughput_minutes(&self, queue: Option<&str>) -> Vec<super::MinuteCount> {
        self.view.throughput_minutes(queue, self.clock.now_ms())
    }

    /// Writes the per-minute history to `dir` (the data dir), as a clean
    /// stop does; the server does it every minute.
    pub fn save_throughput(&self, dir: &std::path::Path) -> std::io::Result<()> {
        self.view.save_throughput(dir)
    }

    /// How many jobs of `queue` (or of all queues) the dead letter listing holds.
    pub fn dead_letter_count(&self, queue: Option<&str>) -> u64 {
        match queue {
            None => self.view.dead_letter_len() as u64,
            Some(queue) => self.view.dead_letter_count_of(queue) as u64,
        }
    }

    /// Jobs claimed by workers and not yet reported on, across all queues.
    pub fn active_jobs(&self) -> u64 {
        self.view.queues().values().map(|queue| queue.count(crate::job::JobState::Active)).sum()
    }

    pub fn events_page(&self, after: Option<&str>, limit: usize, keep: impl Fn(&Event) -> bool) -> EventPage {
        self.view.events_page(after, limit, keep)
    }

    /// True once the engine accepts no more writes (the log failed to sync,
    /// or the engine thread stopped); the process should restart.
    pub fn storage_failed(&self) -> bool {
        self.view.failure().is_some()
    }

    /// Completes once the engine accepts no more writes (see
    /// [`EngineHandle::storage_failed`]).
    pub async fn storage_failure(&self) {
        self.view.failed().await
    }

    /// Whether the disk is full: new work is refused until space is freed,
    /// while work already accepted can still end.
    pub fn disk_full(&self) -> bool {
        self.view.disk_full()
    }

    /// Why the engine accepts no more writes, if it does not.
    pub fn failure(&self) -> Option<super::view::EngineFailure> {
        self.view.failure()
    }

    /// What made the engine fail, in words, once it has.
    pub fn failure_cause(&self) -> Option<String> {
        self.view.failure_cause()
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn defaults(&self) -> &JobDefaults {
        &self.defaults
    }
}
