//! The PostgreSQL backend as a [`Backend`] (docs/postgres.md): each
//! operation runs as a task on the node's runtime and answers through a
//! [`Pending`]; the node's housekeeping (the leader's timers, matching
//! events to webhook subscriptions, sending deliveries) runs beside them.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{LEASE_TTL_MS_DEFAULT, LeaderLease, PgError, PgJobs, PgSettings};
use crate::backend::{Backend, EventFilter, Page, StreamPage, StreamPosition, StreamStart};
use crate::clock::Clock;
use crate::cron::CronDefinition;
use crate::engine::{
    AckMany, AckOutcome, Backpressure, BulkAction, BulkOutcome, Cancelled, CronEntry, CronWrite, DeadLetterCursor,
    EngineError, EngineFailure, Enqueued, EventId, EventPage, FetchRequest, HeartbeatOutcome, JobCursor, JobFilter,
    JobsPage, MinuteCount, Overview, Pending, QueueStats, QueueSummary, Retention, WebhookChange, WorkerEntry,
    WorkerSignal, WorkerState, Workflow,
};
use crate::job::{FailureReport, Job, JobId, JobProgress, NewJob, SubscriptionId, WorkflowId};
use crate::schema::{SchemaEntry, SchemaRegistration};
use crate::webhook::Subscription;
use crate::webhook::subscription::NewSubscription;
use crate::workflow::WorkflowDefinition;

/// How often the leader looks for due jobs and claims that ran out.
const TIMERS_EVERY: Duration = Duration::from_millis(100);
/// How often the leader renews its lease, and another node asks for it.
const LEASE_EVERY: Duration = Duration::from_secs(2);
/// How often the leader prunes the event listing to its newest events.
const PRUNE_EVERY: Duration = Duration::from_secs(10);
/// Jobs one pass of the timers changes at most, per kind.
const TIMERS_BATCH: i64 = 1_000;

/// Passes of webhook matching one pass of the timers runs at most.
const MATCH_PASSES: usize = 10;

/// Cron entries one pass of the timers fires at most (one transaction).
const CRON_BATCH: i64 = 100;

/// One node of svc on PostgreSQL.
pub struct PgBackend {
    jobs: Arc<PgJobs>,
    clock: Arc<dyn Clock>,
    runtime: tokio::runtime::Handle,
    draining: Arc<AtomicBool>,
    /// Whether this node holds the leader lease (it sends webhook deliveries).
    #[cfg_attr(not(feature = "webhooks"), allow(dead_code))]
    leading: Arc<AtomicBool>,
    /// Wakes the sender of deliveries when matching queued some.
    #[cfg_attr(not(feature = "webhooks"), allow(dead_code))]
    deliveries_queued: Arc<tokio::sync::Notify>,
    #[cfg_attr(not(feature = "webhooks"), allow(dead_code))]
    delivery_timeout: Duration,
    /// The connections and the thread deliveries are sent with, apart from
    /// job operations' (docs/postgres.md, "Webhooks").
    #[cfg_attr(not(feature = "webhooks"), allow(dead_code))]
    delivery_pool: deadpool_postgres::Pool,
    #[cfg_attr(not(feature = "webhooks"), allow(dead_code))]
    delivery_priority: crate::webhook::DeliveryPriority,
    #[cfg(feature = "webhooks")]
    deliveries: Option<DeliveryRuntime>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Connections the sender of deliveries keeps: one to start attempts, one
/// to write how they ended.
const DELIVERY_POOL_SIZE: usize = 2;

/// The runtime deliveries are sent from; dropped, it stops without waiting
/// (attempts under way are counted and go out again), so that it may be
/// dropped from async code.
#[cfg(feature = "webhooks")]
struct DeliveryRuntime(Option<tokio::runtime::Runtime>);

#[cfg(feature = "webhooks")]
impl Drop for DeliveryRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

impl PgBackend {
    /// Connects, migrates the schema, starts listening for new jobs and the
    /// leader's timers, all on the current tokio runtime. `node` names this
    /// node in `svc_leader`.
    pub async fn start(settings: &PgSettings, clock: Arc<dyn Clock>, node: String) -> Result<PgBackend, PgError> {
        let pool = super::open(settings).await?;
        let mut jobs = PgJobs::new(pool.clone())
            .with_max_schemas(settings.max_schemas)
            .with_webhook_limits(settings.webhook_limits);
        jobs.max_cron = settings.max_cron;
        let jobs = Arc::new(jobs);
        let listener = jobs.listen(settings)?;
        let delivery_pool = super::connect(&PgSettings { pool_size: DELIVERY_POOL_SIZE, ..settings.clone() })?;
        let lease = LeaderLease::new(pool, "timers", node, LEASE_TTL_MS_DEFAULT);
        let draining = Arc::new(AtomicBool::new(false));
        let leading = Arc::new(AtomicBool::new(false));
        let deliveries_queued = Arc::new(tokio::sync::Notify::new());
        let leader = Leader { lease, leading: leading.clone(), deliveries_queued: deliveries_queued.clone() };
        let timers =
            tokio::spawn(run_timers(jobs.clone(), leader, clock.clone(), draining.clone(), settings.retention));
        Ok(PgBackend {
            jobs,
            clock,
            runtime: tokio::runtime::Handle::current(),
            draining,
            leading,
            deliveries_queued,
            delivery_timeout: settings.delivery_timeout,
            delivery_pool,
            delivery_priority: settings.delivery_priority,
            #[cfg(feature = "webhooks")]
            deliveries: None,
            tasks: vec![listener, timers],
        })
    }

    /// Sends webhook deliveries through `client` while this node leads
    /// (docs/postgres.md, "Webhooks"). Without it, deliveries queue up in
    /// the database, bounded by the outbox's limits, for a node that sends.
    ///
    /// They go out from a thread of their own at `webhooks.priority`
    /// ([`PgSettings::delivery_priority`]), on connections of their own, so
    /// that sending never takes job operations' threads or connections.
    #[cfg(feature = "webhooks")]
    pub fn deliver(&mut self, client: crate::webhook::client::DeliveryClient) -> std::io::Result<()> {
        let runtime = crate::engine::pool::delivery_runtime(self.delivery_priority)?;
        let _guard = runtime.enter();
        let tasks = super::deliveries::Sender::spawn(
            Arc::new(self.jobs.with_pool(self.delivery_pool.clone())),
            client,
            self.clock.clone(),
            self.delivery_timeout,
            self.leading.clone(),
            self.deliveries_queued.clone(),
        );
        self.tasks.extend(tasks);
        drop(_guard);
        self.deliveries = Some(DeliveryRuntime(Some(runtime)));
        Ok(())
    }

    /// What this node counts (`GET /metrics`): requests, and on the leader
    /// every committed event once (docs/postgres.md, "Metrics").
    pub fn metrics(&self) -> Arc<crate::metrics::Metrics> {
        self.jobs.metrics().clone()
    }

    /// Runs `work` on the node's runtime; its outcome answers the pending.
    fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T, EngineError>> + Send + 'static,
    ) -> Pending<T> {
        let (sender, pending) = Pending::channel();
        self.runtime.spawn(async move {
            let _ = sender.send(work.await);
        });
        pending
    }

    fn now(&self) -> crate::clock::Millis {
        self.clock.now_ms()
    }
}

impl Drop for PgBackend {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The leader's timers: while this node holds the lease, due jobs are
/// promoted, jobs past their expiry discarded, claims that ran out ended
/// and due cron entries fired, and the queues' depths folded, every
/// [`TIMERS_EVERY`]; events, cron firings, idle workers, the history, ended
/// workflows and old dispatch claims are pruned, and depths no longer kept
/// once no queue is bounded, every [`PRUNE_EVERY`].
async fn run_timers(
    jobs: Arc<PgJobs>,
    leader: Leader,
    clock: Arc<dyn Clock>,
    draining: Arc<AtomicBool>,
    retention: Retention,
) {
    let Leader { lease, leading: leading_flag, deliveries_queued } = leader;
    let mut matching = super::webhooks::Matching::default();
    let mut leading = false;
    let mut asked_at: Option<tokio::time::Instant> = None;
    let mut pruned_at: Option<tokio::time::Instant> = None;
    loop {
        if draining.load(Ordering::SeqCst) {
            // The sender stops starting attempts too: the next leader sends.
            leading_flag.store(false, Ordering::SeqCst);
            if leading && let Err(error) = lease.release().await {
                tracing::warn!(%error, "could not give up the leader lease");
            }
            return;
        }
        if asked_at.is_none_or(|at| at.elapsed() >= LEASE_EVERY) {
            asked_at = Some(tokio::time::Instant::now());
            match lease.hold(clock.now_ms()).await {
                Ok(held) => {
                    if held != leading {
                        tracing::info!(leading = held, "the timers' leader lease changed hands");
                    }
                    leading = held;
                }
                Err(error) => {
                    tracing::warn!(%error, "could not ask for the leader lease");
                    leading = false;
                }
            }
            leading_flag.store(leading, Ordering::SeqCst);
        }
        if leading {
            let now = clock.now_ms();
            // A failure is logged by the store, and tried again next pass.
            let _ = jobs.expire_due(now, TIMERS_BATCH).await;
            let _ = jobs.promote_due(now, TIMERS_BATCH).await;
            let _ = jobs.expire_claims(now, TIMERS_BATCH).await;
            let _ = jobs.fire_due_crons(now, CRON_BATCH).await;
            let _ = jobs.fold_queue_depths().await;
            if match_events(&jobs, now, &mut matching).await > 0 {
                deliveries_queued.notify_one();
            }
            if pruned_at.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
                pruned_at = Some(tokio::time::Instant::now());
                let _ = jobs.prune_events().await;
                let _ = jobs.prune_firings().await;
                let _ = jobs.forget_idle_workers(now).await;
                let _ = jobs.keep_history(now, &retention, TIMERS_BATCH).await;
                let _ = jobs.prune_workflows(now, &retention).await;
                let _ = jobs.prune_dispatch_claims(now).await;
                let _ = jobs.unkeep_queue_depths().await;
            }
        }
        tokio::time::sleep(TIMERS_EVERY).await;
    }
}

/// The leader lease, and what the sender of deliveries learns from it.
struct Leader {
    lease: LeaderLease,
    leading: Arc<AtomicBool>,
    deliveries_queued: Arc<tokio::sync::Notify>,
}

/// Matches committed events to webhook subscriptions until none is left
/// or [`MATCH_PASSES`] passes ran; answers how many events were read.
async fn match_events(jobs: &PgJobs, now: crate::clock::Millis, matching: &mut super::webhooks::Matching) -> usize {
    let mut read = 0;
    for _ in 0..MATCH_PASSES {
        match jobs.match_events(now, matching).await {
            Ok(pass) => {
                read += pass.events;
                if !pass.more_waiting {
                    break;
                }
            }
            // Logged by the store, and tried again next pass.
            Err(_) => break,
        }
    }
    read
}

impl Backend for PgBackend {
    fn enqueue(&self, jobs: Vec<NewJob>) -> Pending<Vec<Enqueued>> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.enqueue(now, jobs).await })
    }

    fn job(&self, id: JobId) -> Pending<Option<Arc<Job>>> {
        let store = self.jobs.clone();
        self.run(async move { store.job(id).await })
    }

    fn cancel(&self, id: JobId) -> Pending<Cancelled> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.cancel(now, id).await })
    }

    fn activate(&self, id: JobId) -> Pending<Arc<Job>> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.activate(now, id).await })
    }

    fn jobs_page(&self, filter: JobFilter, from: Option<JobCursor>, limit: usize) -> Pending<JobsPage> {
        let store = self.jobs.clone();
        self.run(async move { store.jobs_page(&filter, from, limit).await })
    }

    fn bulk_jobs(&self, action: BulkAction, ids: Vec<JobId>) -> Pending<BulkOutcome> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.bulk_jobs(now, action, ids).await })
    }

    fn fetch(&self, request: FetchRequest, wait_ms: u64) -> Pending<Vec<Arc<Job>>> {
        let (store, clock, draining) = (self.jobs.clone(), self.clock.clone(), self.draining.clone());
        self.run(async move {
            if let Some(worker) = &request.worker_id
                && store.note_worker(clock.now_ms(), worker, Some(&request.queues), false).await?.is_some()
            {
                return Ok(Vec::new());
            }
            if draining.load(Ordering::SeqCst) {
                return Ok(Vec::new());
            }
            let now = move || clock.now_ms();
            store.claim_waiting(&now, &request, Duration::from_millis(wait_ms)).await
        })
    }

    fn ack(&self, id: JobId, result: Option<String>, worker_id: Option<String>) -> Pending<Arc<Job>> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.ack(now, id, result, worker_id.as_deref()).await })
    }

    fn ack_many(&self, request: AckMany) -> Pending<AckOutcome> {
        let (store, clock, draining) = (self.jobs.clone(), self.clock.clone(), self.draining.clone());
        self.run(async move {
            // Each ack goes to the merged acks at once, so they share a transaction.
            let submitted: Vec<_> = request
                .acks
                .into_iter()
                .map(|item| {
                    let (store, now, worker) = (store.clone(), clock.now_ms(), request.worker_id.clone());
                    tokio::spawn(async move { store.ack(now, item.id, item.result, worker.as_deref()).await })
                })
                .collect();
            let mut acked = Vec::with_capacity(submitted.len());
            for handle in submitted {
                let stopped = EngineError::Unavailable { reason: crate::engine::Unavailable::EngineStopped };
                acked.push(handle.await.unwrap_or(Err(stopped)));
            }
            let refused = acked.iter().any(Result::is_err);
            let jobs = match request.fetch {
                Some((fetch, wait_ms)) if !(request.fetch_unless_refused && refused) => {
                    let signalled = match &fetch.worker_id {
                        Some(worker) => store.note_worker(clock.now_ms(), worker, Some(&fetch.queues), false).await?,
                        None => None,
                    };
                    if signalled.is_some() || draining.load(Ordering::SeqCst) {
                        return Ok(AckOutcome { acked, jobs: Vec::new() });
                    }
                    let now = move || clock.now_ms();
                    store.claim_waiting(&now, &fetch, Duration::from_millis(wait_ms)).await?
                }
                _ => Vec::new(),
            };
            Ok(AckOutcome { acked, jobs })
        })
    }

    fn fail(&self, id: JobId, report: FailureReport, requeue: bool, worker_id: Option<String>) -> Pending<Arc<Job>> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.fail(now, id, report, requeue, worker_id.as_deref()).await })
    }

    fn heartbeat(
        &self,
        worker_id: String,
        active_jobs: Option<Vec<JobId>>,
        visibility_timeout_ms: Option<u64>,
    ) -> Pending<HeartbeatOutcome> {
        let (store, now, draining) = (self.jobs.clone(), self.now(), self.draining.clone());
        self.run(async move {
            let signal = store.note_worker(now, &worker_id, None, true).await?;
            let (extended, not_extended) =
                store.extend_claims(now, &worker_id, active_jobs.as_deref(), visibility_timeout_ms).await?;
            let signal = if draining.load(Ordering::SeqCst) { Some(WorkerSignal::Terminate) } else { signal };
            Ok(HeartbeatOutcome { extended, not_extended, signal })
        })
    }

    fn report_progress(&self, id: JobId, progress: JobProgress, worker_id: Option<String>) -> Pending<Arc<Job>> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.report_progress(now, id, progress, worker_id.as_deref()).await })
    }

    fn workers_page(
        &self,
        after: Option<String>,
        limit: usize,
        state: Option<WorkerState>,
    ) -> Pending<Page<WorkerEntry>> {
        let store = self.jobs.clone();
        self.run(async move { store.workers_page(after.as_deref(), limit, state).await })
    }

    fn worker(&self, worker_id: String) -> Pending<Option<WorkerEntry>> {
        let store = self.jobs.clone();
        self.run(async move { store.worker(&worker_id).await })
    }

    fn signal_worker(&self, worker_id: String, signal: WorkerSignal) -> Pending<WorkerEntry> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.signal_worker(now, &worker_id, signal).await })
    }

    fn forget_worker(&self, worker_id: String) -> Pending<()> {
        let store = self.jobs.clone();
        self.run(async move { store.forget_worker(&worker_id).await })
    }

    fn queues_page(&self, after: Option<String>, limit: usize) -> Pending<Page<QueueSummary>> {
        let store = self.jobs.clone();
        self.run(async move { store.queues_page(after.as_deref(), limit).await })
    }

    fn queue_stats(&self, name: String) -> Pending<Option<QueueStats>> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.queue_stats(now, &name).await })
    }

    fn pause_queue(&self, name: String, paused: bool) -> Pending<QueueSummary> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.pause_queue(now, &name, paused).await })
    }

    fn configure_queue(&self, name: String, backpressure: Option<Backpressure>) -> Pending<QueueSummary> {
        let store = self.jobs.clone();
        self.run(async move { store.configure_queue(&name, backpressure).await })
    }

    fn overview(&self) -> Pending<Overview> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.overview(now).await })
    }

    fn queue_count(&self) -> Pending<usize> {
        let store = self.jobs.clone();
        self.run(async move { store.queue_count().await })
    }

    fn worker_counts(&self) -> Pending<(usize, Vec<(WorkerState, usize)>)> {
        let store = self.jobs.clone();
        self.run(async move { store.worker_counts().await })
    }

    fn throughput_minutes(&self, queue: Option<String>) -> Pending<Vec<MinuteCount>> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.throughput_minutes(now, queue.as_deref()).await })
    }

    fn dead_letter_page(
        &self,
        after: Option<DeadLetterCursor>,
        limit: usize,
        queue: Option<String>,
    ) -> Pending<(Vec<Arc<Job>>, Option<DeadLetterCursor>)> {
        let store = self.jobs.clone();
        self.run(async move { store.dead_letter_page(after, limit, queue.as_deref()).await })
    }

    fn dead_letter_retry(&self, id: JobId) -> Pending<Arc<Job>> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.dead_letter_retry(now, id).await })
    }

    fn dead_letter_delete(&self, id: JobId) -> Pending<()> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.dead_letter_delete(now, id).await })
    }

    fn dead_letter_count(&self, queue: Option<String>) -> Pending<u64> {
        let store = self.jobs.clone();
        self.run(async move { store.dead_letter_count(queue.as_deref()).await })
    }

    fn crons_page(&self, after: Option<String>, limit: usize, enabled: Option<bool>) -> Pending<Page<Arc<CronEntry>>> {
        let store = self.jobs.clone();
        self.run(async move { store.crons_page(after.as_deref(), limit, enabled).await })
    }

    fn cron(&self, name: String) -> Pending<Option<Arc<CronEntry>>> {
        let store = self.jobs.clone();
        self.run(async move { store.cron(&name).await })
    }

    fn cron_put(&self, definition: CronDefinition) -> Pending<(Arc<CronEntry>, bool)> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.cron_put(now, definition, CronWrite::Upsert).await })
    }

    fn cron_patch(&self, definition: CronDefinition, revision: u64) -> Pending<(Arc<CronEntry>, bool)> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.cron_put(now, definition, CronWrite::Patch { revision }).await })
    }

    fn cron_delete(&self, name: String) -> Pending<Arc<CronEntry>> {
        let store = self.jobs.clone();
        self.run(async move { store.cron_delete(&name).await })
    }

    fn create_workflow(&self, definition: WorkflowDefinition) -> Pending<WorkflowId> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.create_workflow(now, definition).await })
    }

    fn workflow(&self, id: WorkflowId) -> Pending<Option<Arc<Workflow>>> {
        let store = self.jobs.clone();
        self.run(async move { store.workflow(id).await })
    }

    fn cancel_workflow(&self, id: WorkflowId) -> Pending<()> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.cancel_workflow(now, id).await })
    }

    fn workflows_page(&self, after: Option<WorkflowId>, limit: usize) -> Pending<Page<Arc<Workflow>>> {
        let store = self.jobs.clone();
        self.run(async move { store.workflows_page(after, limit).await })
    }

    fn register_schema(&self, registration: SchemaRegistration) -> Pending<Arc<SchemaEntry>> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.register_schema(now, registration).await })
    }

    fn delete_schema(&self, uri: String) -> Pending<Arc<SchemaEntry>> {
        let store = self.jobs.clone();
        self.run(async move { store.delete_schema(&uri).await })
    }

    fn schema(&self, uri: String) -> Pending<Option<Arc<SchemaEntry>>> {
        let store = self.jobs.clone();
        self.run(async move { store.schema(&uri).await })
    }

    fn schemas_page(&self, after: Option<String>, limit: usize) -> Pending<Page<Arc<SchemaEntry>>> {
        let store = self.jobs.clone();
        self.run(async move { store.schemas_page(after.as_deref(), limit).await })
    }

    fn create_webhook(&self, subscription: NewSubscription) -> Pending<Arc<Subscription>> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.create_webhook(now, subscription).await })
    }

    fn change_webhook(&self, id: SubscriptionId, change: WebhookChange) -> Pending<Arc<Subscription>> {
        let (store, now) = (self.jobs.clone(), self.now());
        self.run(async move { store.change_webhook(now, id, change).await })
    }

    fn delete_webhook(&self, id: SubscriptionId) -> Pending<Arc<Subscription>> {
        let store = self.jobs.clone();
        self.run(async move { store.delete_webhook(id).await })
    }

    fn webhook(&self, id: SubscriptionId) -> Pending<Option<Arc<Subscription>>> {
        let store = self.jobs.clone();
        self.run(async move { store.webhook(id).await })
    }

    fn webhooks_page(&self, after: Option<SubscriptionId>, limit: usize) -> Pending<Page<Arc<Subscription>>> {
        let store = self.jobs.clone();
        self.run(async move { store.webhooks_page(after, limit).await })
    }

    fn events_page(&self, after: Option<String>, limit: usize, filter: EventFilter) -> Pending<EventPage> {
        let store = self.jobs.clone();
        self.run(async move { store.events_page(after.as_deref(), limit, &filter).await })
    }

    fn stream_start(&self, resume: Option<EventId>, _now: EventId) -> Pending<StreamStart> {
        let store = self.jobs.clone();
        self.run(async move { super::stream::start(&store.client().await?, resume).await })
    }

    fn stream_events(&self, from: StreamPosition, limit: usize, filter: EventFilter) -> Pending<StreamPage> {
        let store = self.jobs.clone();
        self.run(async move { super::stream::read(&store.client().await?, from, limit, &filter).await })
    }

    /// A round trip to the database.
    fn probe(&self) -> Pending<()> {
        let store = self.jobs.clone();
        self.run(async move { store.probe().await })
    }

    fn begin_drain(&self) -> Pending<()> {
        self.draining.store(true, Ordering::SeqCst);
        Pending::ready(Ok(()))
    }

    /// A node keeps no state of its own to lose: it never stops taking
    /// writes for good (a database failure fails each request on its own).
    fn failed(&self) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(std::future::pending())
    }

    fn failure(&self) -> Option<EngineFailure> {
        None
    }

    fn failure_cause(&self) -> Option<String> {
        None
    }

    fn disk_full(&self) -> bool {
        false
    }

    /// None is held by this node: a worker's ack or heartbeat may go to any
    /// node, so a node that drains waits for none (docs/postgres.md,
    /// "Several nodes").
    fn active_jobs(&self) -> u64 {
        0
    }
}
