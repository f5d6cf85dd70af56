//! The embedding API: the engine without HTTP, called from synchronous code.

use serde::Serialize;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::backend::{Backend, BulkReport, EventFilter, run_bulk};
pub use crate::engine::Refusal;
use crate::engine::WebhookChange;
use crate::engine::block_on;
use crate::engine::{
    ACKS_MAX, AckItem, AckMany, BULK_CHUNK_MAX, Backpressure, BulkAction, Cancelled, Engine, EngineConfig, EngineError,
    EngineFailure, EngineHandle, Enqueued, EventId, EventPage, FetchRequest, HeartbeatOutcome, JobCursor, JobFilter,
    JobsPage, MinuteCount, Overview, ParentResults, Pending, QueueStats, QueueSummary, Workflow,
};
use crate::job::{
    Failure, Job, JobBuilder, JobId, JobProgress, JobState, NewJob, SubscriptionId, ValidationError, ValidationKind,
    WorkflowId, check_batch_size, fetch_count, fetch_queues, fetch_wait_ms, invalid_queue, invalid_worker_id,
    is_valid_queue, is_valid_worker_id, parse_ack_result, parse_enqueue_body,
};
use crate::limits::PAGE_SIZE_MAX;
use crate::schema::{SchemaBuilder, SchemaEntry, SchemaViolation};
use crate::storage::StorageError;
use crate::webhook::Subscription;
use crate::webhook::subscription::{WebhookBuilder, WebhookUpdate};
use crate::workflow::WorkflowBuilder;

/// Why an embedded call failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum SvcError {
    /// The call was refused before it reached the engine, as the HTTP API
    /// refuses the same request with a 4xx: `field` names the argument
    /// (as the HTTP body would name it, e.g. `queues`, `result`, `error.type`).
    Invalid(ValidationError),
    /// The engine refused or could not take the request.
    Engine(EngineError),
    /// The data dir could not be opened.
    Storage(StorageError),
    /// The webhook settings cannot be used (an unreadable CA bundle).
    Webhooks(String),
}

impl fmt::Display for SvcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SvcError::Invalid(error) => write!(f, "invalid request: {error}"),
            SvcError::Engine(error) => write!(f, "{error}"),
            SvcError::Storage(error) => write!(f, "storage: {error}"),
            SvcError::Webhooks(problem) => write!(f, "webhooks: {problem}"),
        }
    }
}

impl std::error::Error for SvcError {}

impl SvcError {
    /// Where a job's `args` missed its schema, when that is why the call
    /// failed (an empty list: the schema is not registered).
    pub fn schema_violations(&self) -> Option<Vec<SchemaViolation>> {
        let SvcError::Engine(EngineError::Invalid { error, .. }) = self else { return None };
        if error.kind != crate::job::ValidationKind::Schema {
            return None;
        }
        let listed = error.details.iter().find(|(key, _)| *key == "validation_errors");
        Some(listed.and_then(|(_, value)| serde_json::from_value(value.clone()).ok()).unwrap_or_default())
    }

    /// The call's refusal as the HTTP API states it: the stable code, the
    /// status, whether to retry, the message and the details, exactly as the
    /// same request over HTTP answers in its error body. `None` for the
    /// errors of opening a data dir, which no request meets.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            SvcError::Invalid(error) => Some(Refusal::from(error.clone())),
            SvcError::Engine(error) => Some(Refusal::from(error.clone())),
            SvcError::Storage(_) | SvcError::Webhooks(_) => None,
        }
    }
}

/// A job as the HTTP API represents it, as JSON text: a workflow's job
/// names its `workflow_id`, and `given` adds what it is given,
/// `parent_results` (and a batch callback's `parent_states`), as a fetch
/// answers it (see [`Svc::parent_results`]).
pub fn render_job(job: &Job, given: Option<&GivenResults>) -> String {
    let mut extra = Vec::new();
    if let Some((id, _)) = job.workflow() {
        extra.push(("workflow_id", serde_json::Value::from(id.to_string())));
    }
    if let Some(given) = given {
        extra.push(("parent_results", serde_json::Value::Array(given.results.clone())));
        if let Some(states) = &given.states {
            let states =
                states.iter().map(|state| state.map_or(serde_json::Value::Null, |state| state.as_str().into()));
            extra.push(("parent_states", serde_json::Value::Array(states.collect())));
        }
    }
    crate::wire::render_job(job, &extra)
}

impl From<EngineError> for SvcError {
    fn from(error: EngineError) -> Self {
        SvcError::Engine(error)
    }
}

/// What a workflow's job is given (see [`Svc::parent_results`]).
#[derive(Debug, Clone, PartialEq)]
pub struct GivenResults {
    /// A chain step: the results of the steps before it; a batch callback:
    /// every member's; `null` where a job gave none.
    pub results: Vec<serde_json::Value>,
    /// A batch callback: each member's final state.
    pub states: Option<Vec<Option<JobState>>>,
}

impl From<ParentResults> for GivenResults {
    /// Each result read as JSON (`null` where a job gave none).
    fn from(given: ParentResults) -> Self {
        let results = given
            .results
            .iter()
            .map(|result| result.as_deref().and_then(|text| serde_json::from_str(text).ok()).unwrap_or_default())
            .collect();
        GivenResults { results, states: given.states }
    }
}

/// A job queue in a local data dir. Every call returns once its change is on disk.
pub struct Svc {
    engine: Engine,
    /// Every operation goes through the backend seam, as HTTP's do.
    backend: Arc<dyn Backend>,
    /// Sends webhook deliveries, when opened with [`Svc::open_with_webhooks`].
    deliveries: Option<tokio::runtime::Runtime>,
    allow_private_targets: bool,
}

/// How an embedded queue sends webhook deliveries (the `[webhooks]`
/// settings of the server): [`WebhookSettings::default`] and its setters.
///
/// ```
/// let settings = svc::WebhookSettings::default()
///     .allow_private_targets(true)
///     .timeout(std::time::Duration::from_secs(5));
/// assert!(settings.allow_private_targets && settings.extra_ca_file.is_none());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WebhookSettings {
    /// Deliveries may go to loopback and private addresses.
    pub allow_private_targets: bool,
    /// Extra CA certificates (PEM) receivers are trusted by.
    pub extra_ca_file: Option<PathBuf>,
    /// How long one attempt may take.
    pub timeout: std::time::Duration,
    /// How the delivery thread shares the CPU with the rest of the program.
    pub priority: crate::webhook::DeliveryPriority,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self {
            allow_private_targets: false,
            extra_ca_file: None,
            timeout: std::time::Duration::from_secs(30),
            priority: crate::webhook::DeliveryPriority::default(),
        }
    }
}

impl WebhookSettings {
    /// Deliveries may go to loopback and private addresses.
    pub fn allow_private_targets(mut self, allow: bool) -> Self {
        self.allow_private_targets = allow;
        self
    }

    /// Extra CA certificates (PEM) receivers are trusted by.
    pub fn extra_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.extra_ca_file = Some(path.into());
        self
    }

    /// How long one attempt may take.
    pub fn timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How the delivery thread shares the CPU with the rest of the program.
    pub fn priority(mut self, priority: crate::webhook::DeliveryPriority) -> Self {
        self.priority = priority;
        self
    }
}

impl Svc {
    /// Opens (or creates) the data dir with default settings.
    pub fn open(data_dir: impl Into<PathBuf>) -> Result<Svc, SvcError> {
        Self::open_with(EngineConfig::new(data_dir))
    }

    /// Opens the data dir with these settings; webhook subscriptions are
    /// kept, but no deliveries are sent (see [`Svc::open_with_webhooks`]).
    pub fn open_with(config: EngineConfig) -> Result<Svc, SvcError> {
        let engine = Engine::open(config).map_err(SvcError::Storage)?;
        let backend: Arc<dyn Backend> = Arc::new(engine.handle().clone());
        Ok(Svc { engine, backend, deliveries: None, allow_private_targets: false })
    }

    /// Opens the data dir and sends webhook deliveries, as a server does,
    /// from a small runtime of its own, at a lower priority than the caller's
    /// threads (`webhooks.priority`). Needs the `webhooks` feature (on by
    /// default, with `server`).
    #[cfg(feature = "webhooks")]
    pub fn open_with_webhooks(mut config: EngineConfig, webhooks: WebhookSettings) -> Result<Svc, SvcError> {
        let client = crate::webhook::client::DeliveryClient::new(
            webhooks.allow_private_targets,
            webhooks.extra_ca_file.as_deref(),
        )
        .map_err(SvcError::Webhooks)?;
        config.delivery_timeout_ms = webhooks.timeout.as_millis().clamp(1, i64::MAX as u128) as i64;
        let pool = crate::engine::pool::Pool::attach(&mut config, client, webhooks.priority);
        let engine = Engine::open(config).map_err(SvcError::Storage)?;
        let runtime = pool.spawn(engine.handle().clone()).map_err(|error| SvcError::Webhooks(error.to_string()))?;
        let backend: Arc<dyn Backend> = Arc::new(engine.handle().clone());
        Ok(Svc { engine, backend, deliveries: Some(runtime), allow_private_targets: webhooks.allow_private_targets })
    }

    /// The engine handle, for async callers.
    pub fn handle(&self) -> &EngineHandle {
        self.engine.handle()
    }

    /// Enqueues a job. With a unique policy that meets a held job, the
    /// answer is that job (`deduplicated`) or an error, as the policy says.
    pub fn enqueue(&self, job: JobBuilder) -> Result<Enqueued, SvcError> {
        let new_job = job.build(self.handle().defaults()).map_err(SvcError::Invalid)?;
        self.enqueue_new(new_job)
    }

    /// Enqueues jobs atomically: all of them or none; the answers in order.
    /// A batch holds 1 to 10 000 jobs.
    pub fn enqueue_batch(&self, jobs: impl IntoIterator<Item = JobBuilder>) -> Result<Vec<Enqueued>, SvcError> {
        // Counted first, as an HTTP batch is before its items are read.
        let jobs: Vec<JobBuilder> = jobs.into_iter().collect();
        check_batch_size(jobs.len()).map_err(SvcError::Invalid)?;
        let defaults = self.handle().defaults();
        let new_jobs = jobs
            .into_iter()
            .enumerate()
            .map(|(index, job)| {
                job.build(defaults).map_err(|mut error| {
                    error = error.within(&format!("jobs[{index}]"));
                    error.details.push(("index", index.into()));
                    error
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(SvcError::Invalid)?;
        Ok(self.backend.enqueue(new_jobs).wait()?)
    }

    /// Enqueues a job given as an enqueue body (`{type, args, meta?, options?}`),
    /// the JSON an HTTP client sends.
    pub fn enqueue_json(&self, body: &str) -> Result<Enqueued, SvcError> {
        let new_job = parse_enqueue_body(body.as_bytes(), self.handle().defaults()).map_err(SvcError::Invalid)?;
        self.enqueue_new(new_job)
    }

    /// Enqueues a job validated by [`JobBuilder::build`] or [`parse_enqueue_body`].
    fn enqueue_new(&self, job: NewJob) -> Result<Enqueued, SvcError> {
        let mut jobs = self.backend.enqueue(vec![job]).wait()?;
        Ok(jobs.remove(0))
    }

    /// Creates a workflow (a chain, group or batch), all or nothing.
    pub fn create_workflow(&self, workflow: WorkflowBuilder) -> Result<Arc<Workflow>, SvcError> {
        let definition = workflow.build(self.handle().defaults()).map_err(SvcError::Invalid)?;
        let id = self.backend.create_workflow(definition).wait()?;
        Ok(self.workflow(id).expect("a created workflow is in the view"))
    }

    /// Registers a JSON Schema that jobs may name with [`JobBuilder::schema`].
    pub fn register_schema(&self, schema: SchemaBuilder) -> Result<Arc<SchemaEntry>, SvcError> {
        let handle = self.handle();
        let body = schema.into_json().to_string();
        let now = crate::clock::Clock::now_ms(handle.clock().as_ref());
        let registration = crate::schema::parse_registration(body.as_bytes(), now, &|uri| handle.schema(uri))
            .map_err(SvcError::Invalid)?;
        Ok(handle.register_schema(registration).wait()?)
    }

    /// A registered schema.
    pub fn schema(&self, uri: &str) -> Option<Arc<SchemaEntry>> {
        local_read(self.backend.schema(uri.to_string()))
    }

    /// Every registered schema, by URI.
    pub fn schemas(&self) -> Vec<Arc<SchemaEntry>> {
        let mut all = Vec::new();
        loop {
            let after = all.last().map(|entry: &Arc<SchemaEntry>| entry.uri.clone());
            let (page, has_more) = local_read(self.backend.schemas_page(after.clone(), crate::limits::PAGE_SIZE_MAX));
            all.extend(page);
            if !has_more {
                return all;
            }
        }
    }

    /// Removes a schema; jobs that named it keep their `schema`.
    pub fn delete_schema(&self, uri: &str) -> Result<Arc<SchemaEntry>, SvcError> {
        Ok(self.backend.delete_schema(uri.to_string()).wait()?)
    }

    /// Subscribes an HTTPS URL to events. Deliveries are sent when the queue
    /// was opened with [`Svc::open_with_webhooks`] (or by a server on this
    /// data dir); private addresses only when its settings allow them.
    pub fn create_webhook(&self, webhook: WebhookBuilder) -> Result<Arc<Subscription>, SvcError> {
        let body = webhook.into_json().to_string();
        let new = crate::webhook::subscription::parse_subscription(body.as_bytes(), self.allow_private_targets)
            .map_err(SvcError::Invalid)?;
        Ok(self.backend.create_webhook(new).wait()?)
    }

    /// Changes a subscription; a new secret starts a rotation.
    pub fn update_webhook(&self, id: SubscriptionId, update: WebhookUpdate) -> Result<Arc<Subscription>, SvcError> {
        let body = update.into_json().to_string();
        let patch = crate::webhook::subscription::parse_subscription_patch(body.as_bytes(), self.allow_private_targets)
            .map_err(SvcError::Invalid)?;
        Ok(self.backend.change_webhook(id, WebhookChange::Patch(patch)).wait()?)
    }

    /// Ends a secret rotation: the new secret alone signs from now on.
    pub fn drop_previous_webhook_secret(&self, id: SubscriptionId) -> Result<Arc<Subscription>, SvcError> {
        Ok(self.backend.change_webhook(id, WebhookChange::DropPreviousSecret).wait()?)
    }

    pub fn delete_webhook(&self, id: SubscriptionId) -> Result<Arc<Subscription>, SvcError> {
        Ok(self.backend.delete_webhook(id).wait()?)
    }

    pub fn webhook(&self, id: SubscriptionId) -> Option<Arc<Subscription>> {
        local_read(self.backend.webhook(id))
    }

    /// Every subscription, in creation order.
    pub fn webhooks(&self) -> Vec<Arc<Subscription>> {
        let mut all: Vec<Arc<Subscription>> = Vec::new();
        loop {
            let after = all.last().map(|subscription| subscription.id);
            let (page, has_more) = local_read(self.backend.webhooks_page(after, crate::limits::PAGE_SIZE_MAX));
            all.extend(page);
            if !has_more {
                return all;
            }
        }
    }

    /// A workflow with its members' states and outcomes.
    pub fn workflow(&self, id: WorkflowId) -> Option<Arc<Workflow>> {
        local_read(self.backend.workflow(id))
    }

    /// Cancels a running workflow and every job of it not yet ended; no
    /// callback fires afterwards.
    pub fn cancel_workflow(&self, id: WorkflowId) -> Result<Arc<Workflow>, SvcError> {
        self.backend.cancel_workflow(id).wait()?;
        Ok(self.workflow(id).expect("a cancelled workflow is in the view"))
    }

    /// What a workflow's job is given from the jobs before it (results,
    /// and for a batch callback the members' final states); `None` for a
    /// job outside any workflow.
    pub fn parent_results(&self, job: &Job) -> Option<GivenResults> {
        let (id, role) = job.workflow()?;
        let given = self.workflow(id).map(|workflow| workflow.parent_results(role)).unwrap_or_default();
        Some(GivenResults::from(given))
    }

    /// Activates a staged job (enqueued with [`JobBuilder::pending`]): it
    /// becomes available, or scheduled until its time.
    pub fn activate(&self, id: JobId) -> Result<Arc<Job>, SvcError> {
        Ok(self.backend.activate(id).wait()?)
    }

    /// Claims up to `count` jobs from `queues`, in the order given.
    ///
    /// `queues` are 1 to 32 valid queue names, `count` at least 1 (more than
    /// 100 claims 100), and `worker_id`, if given, 1 to 256 characters of
    /// `A-Z a-z 0-9 . _ : @ -`; anything else is refused with
    /// [`SvcError::Invalid`], as the HTTP fetch refuses it.
    pub fn fetch(&self, queues: &[&str], count: usize, worker_id: Option<&str>) -> Result<Vec<Arc<Job>>, SvcError> {
        let request = fetch_request(queues, count, worker_id)?;
        Ok(self.backend.fetch(request, 0).wait()?)
    }

    /// Like [`Svc::fetch`], but when no job qualifies, waits up to `wait_ms`
    /// (at most 20 000) for one to appear in `queues` (answered empty when
    /// the time is up).
    pub fn fetch_waiting(
        &self,
        queues: &[&str],
        count: usize,
        worker_id: Option<&str>,
        wait_ms: u64,
    ) -> Result<Vec<Arc<Job>>, SvcError> {
        let request = fetch_request(queues, count, worker_id)?;
        let wait_ms = fetch_wait_ms(Some(i64::try_from(wait_ms).unwrap_or(i64::MAX))).map_err(SvcError::Invalid)?;
        Ok(self.backend.fetch(request, wait_ms).wait()?)
    }

    /// Completes an active job, with no result.
    pub fn ack(&self, id: JobId) -> Result<Arc<Job>, SvcError> {
        Ok(self.backend.ack(id, None, None).wait()?)
    }

    /// Completes an active job with a result: anything that serializes to
    /// JSON (at most 1 MiB of it, compact), as an HTTP ack's `result`; a
    /// `null` result is none. The workflow steps after the job are given it
    /// (see [`Svc::parent_results`]).
    pub fn ack_with<T: Serialize + ?Sized>(&self, id: JobId, result: &T) -> Result<Arc<Job>, SvcError> {
        let result = checked_result(result)?;
        Ok(self.backend.ack(id, result, None).wait()?)
    }

    /// Completes an active job with a result given as JSON text, checked as
    /// an HTTP ack's `result` is: text that is not JSON, or too large or
    /// deep, is refused with [`SvcError::Invalid`] and the job stays active.
    pub fn ack_json(&self, id: JobId, result: &str) -> Result<Arc<Job>, SvcError> {
        let result = parse_ack_result(result).map_err(SvcError::Invalid)?;
        Ok(self.backend.ack(id, result, None).wait()?)
    }

    /// Completes an active job and claims up to `count` jobs from `queues`
    /// for `worker_id` in the same durable step; the fetch runs only if the
    /// ack went through. Answers the acked job and the claimed ones.
    pub fn ack_and_fetch<T: Serialize + ?Sized>(
        &self,
        id: JobId,
        result: Option<&T>,
        queues: &[&str],
        count: usize,
        worker_id: Option<&str>,
    ) -> Result<(Arc<Job>, Vec<Arc<Job>>), SvcError> {
        let result = match result {
            Some(result) => checked_result(result)?,
            None => None,
        };
        let fetch = fetch_request(queues, count, worker_id)?;
        let mut request = AckMany::new(vec![AckItem { id, result }], fetch.worker_id.clone(), Some((fetch, 0)));
        request.fetch_unless_refused = true;
        let outcome = self.backend.ack_many(request).wait()?;
        let acked = outcome.acked.into_iter().next().expect("one ack, one outcome")?;
        Ok((acked, outcome.jobs))
    }

    /// Completes several active jobs, each on its own (one refused leaves
    /// the others done), in one durable step: each job's outcome, in order.
    pub fn ack_many(
        &self,
        acks: &[(JobId, Option<serde_json::Value>)],
    ) -> Result<Vec<Result<Arc<Job>, EngineError>>, SvcError> {
        if acks.is_empty() || acks.len() > ACKS_MAX {
            return Err(SvcError::Invalid(ValidationError::request(
                Some("acks".to_string()),
                format!("acks must name 1 to {ACKS_MAX} jobs"),
            )));
        }
        let items = acks
            .iter()
            .map(|(id, result)| {
                let result = match result {
                    Some(result) => checked_result(result)?,
                    None => None,
                };
                Ok(AckItem { id: *id, result })
            })
            .collect::<Result<Vec<_>, SvcError>>()?;
        Ok(self.backend.ack_many(AckMany::new(items, None, None)).wait()?.acked)
    }

    /// Extends the claims of `worker_id`'s active jobs (the listed ones, or
    /// all it holds), as an HTTP heartbeat does; answers how many, the listed
    /// ones not extended, and the signal the worker should obey.
    pub fn heartbeat(&self, worker_id: &str, active_jobs: Option<&[JobId]>) -> Result<HeartbeatOutcome, SvcError> {
        if !is_valid_worker_id(worker_id) {
            return Err(SvcError::Invalid(invalid_worker_id()));
        }
        let listed = active_jobs.map(<[JobId]>::to_vec);
        Ok(self.backend.heartbeat(worker_id.to_string(), listed, None).wait()?)
    }

    /// Reports a failed attempt. The job's retry policy decides what
    /// follows (a retry later, or `discarded` once attempts are used up),
    /// unless the failure is [`Failure::non_retryable`]: then it is
    /// discarded at once.
    pub fn nack(&self, id: JobId, failure: Failure) -> Result<Arc<Job>, SvcError> {
        let report = failure.build().map_err(SvcError::Invalid)?;
        Ok(self.backend.fail(id, report, false, None).wait()?)
    }

    /// Gives an active job back, `available` at once: the attempt does not
    /// count and no retry delay applies (an HTTP nack with `requeue`). For a
    /// worker that stops before it finishes its jobs.
    pub fn requeue(&self, id: JobId, failure: Failure) -> Result<Arc<Job>, SvcError> {
        let report = failure.build().map_err(SvcError::Invalid)?;
        Ok(self.backend.fail(id, report, true, None).wait()?)
    }

    pub fn cancel(&self, id: JobId) -> Result<Cancelled, SvcError> {
        Ok(self.backend.cancel(id).wait()?)
    }

    pub fn get(&self, id: JobId) -> Option<Arc<Job>> {
        local_read(self.backend.job(id))
    }

    /// Pauses a queue: new jobs for it are refused
    /// (`EngineError::QueuePaused`), fetches skip it, its timers run on.
    pub fn pause_queue(&self, queue: &str) -> Result<QueueSummary, SvcError> {
        Ok(self.backend.pause_queue(queue_name(queue)?, true).wait()?)
    }

    /// Resumes a paused queue.
    pub fn resume_queue(&self, queue: &str) -> Result<QueueSummary, SvcError> {
        Ok(self.backend.pause_queue(queue_name(queue)?, false).wait()?)
    }

    /// A queue's figures and what it completed and failed in the last minute.
    pub fn queue_stats(&self, queue: &str) -> Option<QueueStats> {
        local_read(self.backend.queue_stats(queue.to_string()))
    }

    /// Bounds the jobs `queue` holds waiting (docs/api.md, "Backpressure"):
    /// past `max_depth`, enqueues into it are refused with
    /// `EngineError::QueueFull`, a batch as a whole. Durable.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// use svc::engine::{Backpressure, EngineError};
    /// use svc::{Svc, SvcError, job::JobBuilder};
    /// let svc = Svc::open(dir.path())?;
    /// svc.set_backpressure("mail", Backpressure::reject_above(1))?;
    /// svc.enqueue(JobBuilder::new("email.send").queue("mail"))?;
    /// let refused = svc.enqueue(JobBuilder::new("email.send").queue("mail"));
    /// assert!(matches!(refused, Err(SvcError::Engine(EngineError::QueueFull { depth: 1, bound: 1, .. }))));
    /// # Ok::<(), SvcError>(())
    /// ```
    pub fn set_backpressure(&self, queue: &str, backpressure: Backpressure) -> Result<QueueSummary, SvcError> {
        backpressure.check().map_err(SvcError::Invalid)?;
        Ok(self.backend.configure_queue(queue_name(queue)?, Some(backpressure)).wait()?)
    }

    /// Removes a queue's backpressure.
    pub fn clear_backpressure(&self, queue: &str) -> Result<QueueSummary, SvcError> {
        Ok(self.backend.configure_queue(queue_name(queue)?, None).wait()?)
    }

    /// Totals across queues, workers and the dead letter listing.
    pub fn overview(&self) -> Overview {
        local_read(self.backend.overview())
    }

    /// Jobs completed and attempts failed per minute over the last 24
    /// hours, of one queue or of all: the minutes with counts, oldest
    /// first. Kept in the data dir across a clean close.
    pub fn throughput_minutes(&self, queue: Option<&str>) -> Vec<MinuteCount> {
        local_read(self.backend.throughput_minutes(queue.map(str::to_string)))
    }

    /// Up to `limit` workflows after `after`, by id (oldest first), and
    /// whether more follow.
    pub fn workflows(&self, after: Option<WorkflowId>, limit: usize) -> (Vec<Arc<Workflow>>, bool) {
        local_read(self.backend.workflows_page(after, limit))
    }

    /// Up to `limit` (1 to 100) events after `after` that `filter` keeps,
    /// oldest first, as `GET /events` lists them (docs/api.md, "Events"):
    /// the engine holds the last 10 000. While `has_more`, the next page
    /// starts after [`EventPage::next_after`].
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// use svc::backend::EventFilter;
    /// use svc::{Svc, job::JobBuilder};
    /// let svc = Svc::open(dir.path())?;
    /// let job = svc.enqueue(JobBuilder::new("email.send").queue("mail"))?.job;
    /// let enqueued = EventFilter { types: Some(vec!["job.*".into()]), queues: Some(vec!["mail".into()]), ..Default::default() };
    /// let page = svc.events(&enqueued, None, 10)?;
    /// assert_eq!(page.events[0].kind.type_name(), "job.enqueued");
    /// assert_eq!(page.events[0].job.as_ref().map(|held| held.id), Some(job.id));
    /// assert!(!page.has_more);
    /// # Ok::<(), svc::SvcError>(())
    /// ```
    pub fn events(&self, filter: &EventFilter, after: Option<EventId>, limit: usize) -> Result<EventPage, SvcError> {
        if !(1..=PAGE_SIZE_MAX).contains(&limit) {
            let message = format!("limit must be from 1 to {PAGE_SIZE_MAX}");
            return Err(SvcError::Invalid(ValidationError::request(Some("limit".to_string()), message)));
        }
        Ok(self.backend.events_page(after.map(|id| id.to_string()), limit, filter.clone()).wait()?)
    }

    /// A page of the jobs `filter` keeps, from `from` on (docs/api.md,
    /// "Admin API"): in a stable order, at most `limit` (1 to 1,000) jobs;
    /// a page may stop short at the scan's bound, and its `next` says
    /// where to go on.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// use svc::engine::JobFilter;
    /// use svc::{Svc, job::JobBuilder};
    /// let svc = Svc::open(dir.path())?;
    /// svc.enqueue(JobBuilder::new("email.send").args(serde_json::json!(["ada@example.com"])))?;
    /// let page = svc.jobs(&JobFilter::all().job_type("email.*").text("ada@"), None, 50)?;
    /// assert_eq!(page.jobs.len(), 1);
    /// # Ok::<(), svc::SvcError>(())
    /// ```
    pub fn jobs(&self, filter: &JobFilter, from: Option<JobCursor>, limit: usize) -> Result<JobsPage, SvcError> {
        check_filter(filter)?;
        if !(1..=BULK_CHUNK_MAX).contains(&limit) {
            let message = format!("limit must be from 1 to {BULK_CHUNK_MAX}");
            return Err(SvcError::Invalid(ValidationError::request(Some("limit".to_string()), message)));
        }
        Ok(self.backend.jobs_page(filter.clone(), from, limit).wait()?)
    }

    /// Applies `action` to every job `filter` keeps that it applies to
    /// ([`BulkAction`]), in chunks, as `POST /admin/jobs/bulk/{action}` does.
    pub fn bulk(&self, action: BulkAction, filter: &JobFilter) -> Result<BulkReport, SvcError> {
        check_filter(filter)?;
        Ok(block_on(run_bulk(self.backend.as_ref(), filter.clone(), action, false))?)
    }

    /// How many jobs [`Svc::bulk`] would change, changing nothing.
    pub fn bulk_dry_run(&self, action: BulkAction, filter: &JobFilter) -> Result<BulkReport, SvcError> {
        check_filter(filter)?;
        Ok(block_on(run_bulk(self.backend.as_ref(), filter.clone(), action, true))?)
    }

    /// Reports progress on an active job (docs/api.md, "Progress"): a
    /// fraction (clamped to 0.0-1.0), and optionally a message and data
    /// ([`JobProgress::message`], [`JobProgress::data`]). Refused with
    /// [`SvcError::Invalid`] as HTTP refuses it; a job that is not active is
    /// a conflict.
    pub fn report_progress(&self, id: JobId, progress: JobProgress) -> Result<Arc<Job>, SvcError> {
        progress.check().map_err(SvcError::Invalid)?;
        Ok(self.backend.report_progress(id, progress, None).wait()?)
    }

    /// The progress the job's current attempt last reported, if any.
    pub fn progress(&self, id: JobId) -> Option<JobProgress> {
        self.get(id).and_then(|job| job.progress().cloned())
    }

    /// Whether the disk is full: new work (enqueue) is refused with
    /// `EngineError::Unavailable { reason: "disk_full" }` until space is
    /// freed, while work already accepted can still end.
    pub fn disk_full(&self) -> bool {
        self.backend.disk_full()
    }

    /// Why the engine takes no more writes at all, if it does not (a failed
    /// sync, or its thread stopped): reopen the data dir to recover.
    pub fn failure(&self) -> Option<EngineFailure> {
        self.backend.failure()
    }

    /// Stops cleanly: queued commands finish and a final snapshot is written,
    /// unless nothing changed since the newest one.
    pub fn close(self) {
        self.engine.close();
        if let Some(runtime) = self.deliveries {
            // Attempts in flight are counted already; they go out again at the next open.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
        }
    }
}

/// An ack's result: what `result` serializes to, checked as an HTTP ack's
/// `result` is (`null` is none).
fn checked_result<T: Serialize + ?Sized>(result: &T) -> Result<Option<String>, SvcError> {
    let text = serde_json::to_string(result).map_err(|error| {
        SvcError::Invalid(ValidationError::request(
            Some("result".to_string()),
            format!("result does not serialize to JSON: {error}"),
        ))
    })?;
    parse_ack_result(&text).map_err(SvcError::Invalid)
}

/// A read of the local engine: answered at once from the read view, and
/// never refused.
fn local_read<T: Default>(pending: Pending<T>) -> T {
    pending.wait().unwrap_or_default()
}

/// A fetch's parameters, checked as the HTTP fetch checks its body.
fn fetch_request(queues: &[&str], count: usize, worker_id: Option<&str>) -> Result<FetchRequest, SvcError> {
    let queues = fetch_queues(queues.iter().map(Some)).map_err(SvcError::Invalid)?;
    let count = fetch_count(Some(i64::try_from(count).unwrap_or(i64::MAX))).map_err(SvcError::Invalid)?;
    let worker_id = match worker_id {
        Some(id) if !is_valid_worker_id(id) => return Err(SvcError::Invalid(invalid_worker_id())),
        id => id.map(str::to_string),
    };
    Ok(FetchRequest { queues, count, worker_id, visibility_timeout_ms: None })
}

/// A queue named in a call, as a queue route's path must name one.
/// A job filter's names, checked as the HTTP listing checks its query.
fn check_filter(filter: &JobFilter) -> Result<(), SvcError> {
    if let Some(queue) = &filter.queue {
        queue_name(queue)?;
    }
    if filter.text.as_ref().is_some_and(|text| text.len() > crate::limits::SEARCH_TEXT_BYTES_MAX) {
        let message = format!("text may be at most {} bytes", crate::limits::SEARCH_TEXT_BYTES_MAX);
        return Err(SvcError::Invalid(ValidationError::request(Some("q".to_string()), message)));
    }
    Ok(())
}

fn queue_name(name: &str) -> Result<String, SvcError> {
    if !is_valid_queue(name) {
        let mut error = invalid_queue("queue");
        error.kind = ValidationKind::Request;
        return Err(SvcError::Invalid(error));
    }
    Ok(name.to_string())
}
