//! The HTTP client: producer calls, the worker protocol, and the admin
//! calls (workflows, cron, queues, dead letter, webhooks, workers).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::enqueue::{Enqueue, millis};
use crate::error::{ApiError, Error, Result};
use crate::http::{Call, RequestRetry, Transport, TransportConfig};
use crate::source::{Acks, AcksAnswer, BoxFuture, Enqueuer, Failure, Fetch, Heartbeat, ProgressReport, WorkSource};
use crate::types::{AckOutcome, HeartbeatAnswer, Job, JobState, NackAnswer, Page, Progress};

/// The HTTP client of one svc server. Cheap to clone: clones share one
/// keep-alive connection pool.
///
/// ```no_run
/// # async fn run() -> svc_client::Result<()> {
/// use svc_client::{Client, Enqueue};
///
/// let client = Client::new("http://127.0.0.1:8080")?;
/// let job = client.enqueue(Enqueue::new("email.send").args(&["ada@example.com"]).queue("mail")).await?;
/// println!("{} is {}", job.id, job.state);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) transport: Transport,
    middleware: Vec<Arc<dyn EnqueueMiddleware>>,
    traceparent: Option<Arc<dyn Fn() -> Option<String> + Send + Sync>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("url", &self.inner.transport.origin()).finish_non_exhaustive()
    }
}

/// Builds a [`Client`]: [`Client::builder`].
#[must_use]
pub struct ClientBuilder {
    url: String,
    config: TransportConfig,
    middleware: Vec<Arc<dyn EnqueueMiddleware>>,
    traceparent: Option<Arc<dyn Fn() -> Option<String> + Send + Sync>>,
}

impl ClientBuilder {
    /// `Authorization: Bearer <key>` on every request.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.config.api_key = Some(key.into());
        self
    }

    /// How long one attempt may take (default 30 s); a long-poll fetch
    /// adds its wait.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = timeout;
        self
    }

    /// How long making a connection may take (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// How transient failures are retried (default: 5 retries, 200 ms
    /// doubling to 5 s, with jitter; `Retry-After` up to 30 s obeyed).
    pub fn retry(mut self, retry: RequestRetry) -> Self {
        self.config.retry = retry;
        self
    }

    /// A header sent with every request.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.headers.push((name.into(), value.into()));
        self
    }

    /// Middleware around every enqueue and batch (the first added runs
    /// outermost): see [`EnqueueMiddleware`].
    pub fn enqueue_middleware(mut self, middleware: impl EnqueueMiddleware) -> Self {
        self.middleware.push(Arc::new(middleware));
        self
    }

    /// The current W3C trace context, if any: enqueued jobs without a
    /// `meta.traceparent` of their own get it, and their handlers see it as
    /// [`JobContext::traceparent`](crate::JobContext::traceparent).
    pub fn traceparent_source(mut self, source: impl Fn() -> Option<String> + Send + Sync + 'static) -> Self {
        self.traceparent = Some(Arc::new(source));
        self
    }

    /// Builds the client (no connection is made yet).
    pub fn build(self) -> Result<Client> {
        let transport = Transport::new(&self.url, self.config)?;
        Ok(Client { inner: Arc::new(Inner { transport, middleware: self.middleware, traceparent: self.traceparent }) })
    }
}

/// Runs around every [`Client::enqueue`] and [`Client::enqueue_batch`]: it
/// may change the jobs (their `meta`, say), time the call, or refuse it.
/// Call [`EnqueueNext::run`] to go on. Any
/// `Fn(Vec<Enqueue>, EnqueueNext) -> impl Future<Output = Result<Vec<Job>>>`
/// is one:
///
/// ```no_run
/// # fn build() -> svc_client::Result<svc_client::Client> {
/// use svc_client::{Client, Enqueue, EnqueueNext};
///
/// Client::builder("http://127.0.0.1:8080")
///     .enqueue_middleware(|mut jobs: Vec<Enqueue>, next: EnqueueNext| async move {
///         for job in &mut jobs {
///             job.meta_mut().insert("tenant".into(), "acme".into());
///         }
///         next.run(jobs).await
///     })
///     .build()
/// # }
/// ```
pub trait EnqueueMiddleware: Send + Sync + 'static {
    /// Handles the jobs about to be enqueued.
    fn call(&self, jobs: Vec<Enqueue>, next: EnqueueNext) -> BoxFuture<'static, Result<Vec<Job>>>;
}

impl<F, Fut> EnqueueMiddleware for F
where
    F: Fn(Vec<Enqueue>, EnqueueNext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<Job>>> + Send + 'static,
{
    fn call(&self, jobs: Vec<Enqueue>, next: EnqueueNext) -> BoxFuture<'static, Result<Vec<Job>>> {
        Box::pin(self(jobs, next))
    }
}

/// The rest of the enqueue middleware chain, then the request itself.
pub struct EnqueueNext {
    client: Client,
    index: usize,
    batch: bool,
}

impl EnqueueNext {
    /// Whether this is a batch (`enqueue_batch`) rather than one job.
    pub fn is_batch(&self) -> bool {
        self.batch
    }

    /// Runs the rest of the chain and sends the jobs; answers the stored jobs.
    pub fn run(self, jobs: Vec<Enqueue>) -> BoxFuture<'static, Result<Vec<Job>>> {
        Box::pin(async move {
            match self.client.inner.middleware.get(self.index).cloned() {
                Some(middleware) => {
                    let next = EnqueueNext { client: self.client, index: self.index + 1, batch: self.batch };
                    middleware.call(jobs, next).await
                }
                None if self.batch => self.client.post_batch(jobs).await,
                None => {
                    let [job]: [Enqueue; 1] = jobs.try_into().map_err(|jobs: Vec<Enqueue>| {
                        Error::invalid(None, format!("an enqueue sends one job; middleware gave {}", jobs.len()))
                    })?;
                    Ok(vec![self.client.post_job(job).await?])
                }
            }
        })
    }
}

pub(crate) fn encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[derive(Deserialize)]
struct JobBody {
    job: Job,
    #[serde(default)]
    deduplicated: bool,
}

#[derive(Deserialize)]
struct JobsBody {
    jobs: Vec<Job>,
}

/// Options of a listing: page size and where to start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListOptions {
    /// Page size (default 25, at most 100).
    pub limit: Option<u32>,
    /// The `cursor` of the page before.
    pub cursor: Option<String>,
}

impl ListOptions {
    pub fn new() -> ListOptions {
        ListOptions::default()
    }

    pub fn limit(mut self, limit: u32) -> ListOptions {
        self.limit = Some(limit);
        self
    }

    pub fn cursor(mut self, cursor: impl Into<String>) -> ListOptions {
        self.cursor = Some(cursor.into());
        self
    }
}

impl Client {
    /// A client of the server at `url` (`http://host:port`; `/svc/v1` is
    /// added when missing) with default settings.
    pub fn new(url: impl Into<String>) -> Result<Client> {
        Client::builder(url).build()
    }

    /// A builder for a client of the server at `url`.
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            url: url.into(),
            config: TransportConfig {
                api_key: None,
                timeout: Duration::from_secs(30),
                connect_timeout: Duration::from_secs(5),
                retry: RequestRetry::default(),
                headers: Vec::new(),
                user_agent: format!("svc-client-rust/{}", env!("CARGO_PKG_VERSION")),
            },
            middleware: Vec::new(),
            traceparent: None,
        }
    }

    /// The server's root URL.
    pub fn url(&self) -> &str {
        self.inner.transport.origin()
    }

    pub(crate) async fn send(&self, call: Call) -> Result<crate::http::Answer> {
        self.inner.transport.send(&call).await
    }

    pub(crate) async fn call<T: DeserializeOwned>(&self, call: Call) -> Result<T> {
        self.send(call).await?.decode()
    }

    // ------------------------------------------------------------ jobs

    /// Enqueues one job (`POST /jobs`); answers the stored job.
    ///
    /// Transient failures are retried when the job surely was not stored,
    /// or when it has a client-chosen id ([`Enqueue::with_new_id`]): a retry
    /// that meets the job an earlier attempt stored answers that job.
    pub async fn enqueue(&self, job: Enqueue) -> Result<Job> {
        let jobs = self.run_enqueue(vec![job], false).await?;
        jobs.into_iter().next().ok_or_else(|| Error::protocol("an enqueue answered no job", None))
    }

    /// Enqueues 1 to 10 000 jobs, all or none (`POST /jobs/batch`);
    /// answers them in order. Retried after an unclear failure only when
    /// every job has a client-chosen id.
    pub async fn enqueue_batch(&self, jobs: Vec<Enqueue>) -> Result<Vec<Job>> {
        self.run_enqueue(jobs, true).await
    }

    async fn run_enqueue(&self, mut jobs: Vec<Enqueue>, batch: bool) -> Result<Vec<Job>> {
        if let Some(trace) = self.inner.traceparent.as_ref().and_then(|source| source())
            && crate::trace::is_traceparent(&trace)
        {
            for job in &mut jobs {
                job.meta_mut().entry("traceparent").or_insert_with(|| Value::String(trace.clone()));
            }
        }
        EnqueueNext { client: self.clone(), index: 0, batch }.run(jobs).await
    }

    async fn post_job(&self, job: Enqueue) -> Result<Job> {
        let id = job.job_id().map(str::to_string);
        let body = job.to_json()?;
        let call = Call::post("/jobs").json(&body)?.idempotent(id.is_some());
        match self.call::<JobBody>(call).await {
            Ok(answer) => {
                let mut job = answer.job;
                job.deduplicated |= answer.deduplicated;
                Ok(job)
            }
            Err(error) => {
                // An earlier attempt stored the job and its answer was lost:
                // the retry met our own id.
                if let (Some(id), Some(api)) = (&id, error.api())
                    && api.maybe_applied
                    && own_duplicate(api, id)
                {
                    return self.get(id).await;
                }
                Err(error)
            }
        }
    }

    async fn post_batch(&self, jobs: Vec<Enqueue>) -> Result<Vec<Job>> {
        let ids: Vec<Option<String>> = jobs.iter().map(|job| job.job_id().map(str::to_string)).collect();
        let all_ids = !ids.is_empty() && ids.iter().all(Option::is_some);
        let items = jobs.iter().map(Enqueue::to_json).collect::<Result<Vec<_>>>()?;
        let call = Call::post("/jobs/batch").json(&json!({ "jobs": items }))?.idempotent(all_ids);
        match self.call::<JobsBody>(call).await {
            Ok(answer) => Ok(answer.jobs),
            Err(error) => {
                if let Some(api) = error.api()
                    && api.maybe_applied
                    && all_ids
                {
                    let index = api.details.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                    if let Some(Some(id)) = ids.get(index)
                        && own_duplicate(api, id)
                    {
                        // All or nothing: the first attempt stored the whole batch.
                        let mut stored = Vec::with_capacity(ids.len());
                        for id in ids.iter().flatten() {
                            stored.push(self.get(id).await?);
                        }
                        return Ok(stored);
                    }
                }
                Err(error)
            }
        }
    }

    /// Reads a job (`GET /jobs/{id}`).
    pub async fn get(&self, id: &str) -> Result<Job> {
        Ok(self.call::<JobBody>(Call::get(format!("/jobs/{}", encode(id)))).await?.job)
    }

    /// Reads a job; `None` when svc has none with this id.
    pub async fn find(&self, id: &str) -> Result<Option<Job>> {
        match self.get(id).await {
            Ok(job) => Ok(Some(job)),
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Cancels a job that has not ended (`DELETE /jobs/{id}`); the answer's
    /// job carries [`previous_state`](Job::previous_state). Safe to retry.
    pub async fn cancel(&self, id: &str) -> Result<Job> {
        Ok(self.call::<JobBody>(Call::delete(format!("/jobs/{}", encode(id)))).await?.job)
    }

    /// Activates a job enqueued with [`Enqueue::pending`].
    pub async fn activate(&self, id: &str) -> Result<Job> {
        let call = Call::post(format!("/jobs/{}/activate", encode(id))).idempotent(true);
        match self.call::<JobBody>(call).await {
            Ok(answer) => Ok(answer.job),
            Err(error) => {
                if let Some(api) = error.api()
                    && api.maybe_applied
                    && api.reason() == Some("not_pending")
                {
                    let job = self.get(id).await?;
                    if job.activated_at.is_some() {
                        return Ok(job);
                    }
                }
                Err(error)
            }
        }
    }

    /// A job's last progress report (`GET /jobs/{id}/progress`).
    pub async fn progress(&self, id: &str) -> Result<Progress> {
        self.call(Call::get(format!("/jobs/{}/progress", encode(id)))).await
    }

    // ------------------------------------------------------------ the worker protocol

    /// Claims jobs (`POST /workers/fetch`). Never retried after an unclear
    /// failure: jobs claimed by a lost answer come back after their
    /// visibility timeout. [`Worker`](crate::Worker) runs this loop for you.
    pub async fn fetch(&self, fetch: Fetch) -> Result<Vec<Job>> {
        let mut call = Call::post("/workers/fetch").json(&fetch_body(&fetch))?;
        call.extra_timeout = fetch.wait;
        Ok(self.call::<JobsBody>(call).await?.jobs)
    }

    /// Acks jobs (`POST /workers/ack`, the `acks` form), each on its own,
    /// then claims the next ones when `acks.fetch` is set. Retried after an
    /// unclear failure when it claims nothing: an ack an earlier attempt
    /// applied then shows as acknowledged.
    pub async fn ack(&self, acks: Acks) -> Result<AcksAnswer> {
        let mut body = Map::new();
        let items: Vec<Value> = acks
            .acks
            .iter()
            .map(|(id, result)| match result {
                Some(result) if !result.is_null() => json!({"job_id": id, "result": result}),
                _ => json!({ "job_id": id }),
            })
            .collect();
        body.insert("acks".into(), Value::Array(items));
        if let Some(worker) = &acks.worker_id {
            body.insert("worker_id".into(), json!(worker));
        }
        let mut wait = Duration::ZERO;
        if let Some(fetch) = &acks.fetch {
            wait = fetch.wait;
            let mut fetch_body = fetch_body(fetch);
            fetch_body.remove("worker_id");
            body.insert("fetch".into(), Value::Object(fetch_body));
        }
        let mut call = Call::post("/workers/ack").json(&body)?.idempotent(acks.fetch.is_none());
        call.extra_timeout = wait;
        let answer = self.send(call).await?;
        let maybe_applied = answer.maybe_applied;
        let decoded: AcksWire = answer.decode()?;
        let outcomes = decoded
            .acks
            .into_iter()
            .map(|item| {
                let outcome = if item.acknowledged {
                    Ok(item.state.unwrap_or(JobState::Completed))
                } else {
                    let mut error = item.error.map(|error| error.into_api(409)).unwrap_or_else(|| {
                        ApiError::new(409, "conflict", format!("job {} was not acknowledged", item.job_id))
                    });
                    if maybe_applied && error.current_state() == Some("completed") {
                        // An earlier attempt acked it; its answer was lost.
                        return AckOutcome { job_id: item.job_id, outcome: Ok(JobState::Completed) };
                    }
                    error.request_id = answer.request_id.clone();
                    Err(error)
                };
                AckOutcome { job_id: item.job_id, outcome }
            })
            .collect();
        Ok(AcksAnswer { acks: outcomes, jobs: decoded.jobs })
    }

    /// Reports a failed attempt (`POST /workers/nack`); with `requeue` the
    /// job goes back to `available` at once and the attempt does not count.
    /// Retried only when surely not applied: applied twice, it could fail a
    /// later claim of the same job.
    pub async fn nack(
        &self,
        job_id: &str,
        failure: &Failure,
        requeue: bool,
        worker_id: Option<&str>,
    ) -> Result<NackAnswer> {
        let mut body = json!({"job_id": job_id, "requeue": requeue, "error": failure});
        if let Some(worker) = worker_id {
            body["worker_id"] = json!(worker);
        }
        self.call(Call::post("/workers/nack").json(&body)?).await
    }

    /// Extends the claims of the listed jobs and answers what the worker
    /// should do (`POST /workers/heartbeat`).
    pub async fn heartbeat(&self, heartbeat: &Heartbeat) -> Result<HeartbeatAnswer> {
        let mut body = json!({"worker_id": heartbeat.worker_id, "active_job_ids": heartbeat.active_jobs});
        if let Some(timeout) = heartbeat.visibility_timeout {
            body["visibility_timeout_ms"] = json!(millis(timeout).max(1));
        }
        self.call(Call::post("/workers/heartbeat").json(&body)?.idempotent(true)).await
    }

    /// Reports how far an active job got (`PUT /jobs/{id}/progress`).
    pub async fn report_progress(&self, job_id: &str, report: &ProgressReport) -> Result<Progress> {
        let mut body = json!({ "progress": report.fraction });
        if let Some(message) = &report.message {
            body["message"] = json!(message);
        }
        if let Some(data) = &report.data {
            body["data"] = data.clone();
        }
        if let Some(worker) = &report.worker_id {
            body["worker_id"] = json!(worker);
        }
        let call = Call::new(Method::PUT, format!("/jobs/{}/progress", encode(job_id))).json(&body)?.idempotent(true);
        self.call(call).await
    }

    /// `GET /svc/v1/health`: svc's health report.
    pub async fn health(&self) -> Result<Value> {
        self.call(Call::get("/svc/v1/health").retry(RequestRetry::none())).await
    }

    /// Whether `/ready` answers 200 (a draining server answers 503).
    pub async fn ready(&self) -> bool {
        matches!(self.inner.transport.ready().await, Ok(true))
    }

    pub(crate) async fn list<T: DeserializeOwned>(
        &self,
        path: &str,
        key: &str,
        options: &ListOptions,
        extra: Vec<(&'static str, Option<String>)>,
    ) -> Result<Page<T>> {
        let mut call = Call::get(path).query("limit", options.limit).query("cursor", options.cursor.clone());
        for (name, value) in extra {
            call = call.query(name, value);
        }
        let mut body: Map<String, Value> = self.call(call).await?;
        let items = body.remove(key).unwrap_or(Value::Array(Vec::new()));
        let items: Vec<T> = serde_json::from_value(items)
            .map_err(|error| Error::protocol(format!("a {key} listing does not read: {error}"), None))?;
        let cursor = body.get("cursor").and_then(Value::as_str).map(str::to_string);
        let has_more = body.get("has_more").and_then(Value::as_bool).unwrap_or(cursor.is_some());
        Ok(Page { items, cursor, has_more })
    }
}

/// The client's own id met again: a retry of a job an earlier attempt stored.
fn own_duplicate(api: &ApiError, id: &str) -> bool {
    api.code == "duplicate" && api.reason() != Some("unique_conflict") && api.existing_job_id() == Some(id)
}

fn fetch_body(fetch: &Fetch) -> Map<String, Value> {
    let mut body = Map::new();
    body.insert("queues".into(), json!(fetch.queues));
    body.insert("count".into(), json!(fetch.count.max(1)));
    if let Some(worker) = &fetch.worker_id {
        body.insert("worker_id".into(), json!(worker));
    }
    if let Some(timeout) = fetch.visibility_timeout {
        body.insert("visibility_timeout_ms".into(), json!(millis(timeout).max(1)));
    }
    if !fetch.wait.is_zero() {
        body.insert("wait_ms".into(), json!(millis(fetch.wait).min(20_000)));
    }
    body
}

#[derive(Deserialize)]
struct AcksWire {
    #[serde(default)]
    acks: Vec<AckItemWire>,
    #[serde(default)]
    jobs: Vec<Job>,
}

#[derive(Deserialize)]
struct AckItemWire {
    job_id: String,
    #[serde(default)]
    acknowledged: bool,
    #[serde(default)]
    state: Option<JobState>,
    #[serde(default)]
    error: Option<ErrorWire>,
}

#[derive(Deserialize)]
struct ErrorWire {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    retryable: bool,
    #[serde(default)]
    details: Map<String, Value>,
}

impl ErrorWire {
    fn into_api(self, status: u16) -> ApiError {
        let status = match self.code.as_str() {
            "not_found" => 404,
            "invalid_request" | "invalid_payload" => 400,
            "envelope_too_large" => 413,
            _ => status,
        };
        let mut api = ApiError::new(status, self.code, self.message);
        api.retryable = self.retryable;
        api.details = self.details;
        api
    }
}

impl WorkSource for Client {
    fn fetch(&self, fetch: Fetch) -> BoxFuture<'_, Result<Vec<Job>>> {
        Box::pin(Client::fetch(self, fetch))
    }

    fn ack(&self, acks: Acks) -> BoxFuture<'_, Result<AcksAnswer>> {
        Box::pin(Client::ack(self, acks))
    }

    fn nack(
        &self,
        job_id: String,
        failure: Failure,
        requeue: bool,
        worker_id: Option<String>,
    ) -> BoxFuture<'_, Result<Job>> {
        Box::pin(async move { Ok(Client::nack(self, &job_id, &failure, requeue, worker_id.as_deref()).await?.job) })
    }

    fn heartbeat(&self, heartbeat: Heartbeat) -> BoxFuture<'_, Result<HeartbeatAnswer>> {
        Box::pin(async move { Client::heartbeat(self, &heartbeat).await })
    }

    fn report_progress(&self, job_id: String, report: ProgressReport) -> BoxFuture<'_, Result<Progress>> {
        Box::pin(async move { Client::report_progress(self, &job_id, &report).await })
    }

    fn job(&self, job_id: String) -> BoxFuture<'_, Result<Option<Job>>> {
        Box::pin(async move { self.find(&job_id).await })
    }

    fn draining(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            match self.inner.transport.not_ready_reason().await {
                Ok(Some(reason)) => reason != "backend_unavailable",
                Ok(None) => false,
                // Not answering at all: stopped, or restarting.
                Err(_) => true,
            }
        })
    }
}

impl Enqueuer for Client {
    fn enqueue(&self, job: Enqueue) -> BoxFuture<'_, Result<Job>> {
        Box::pin(Client::enqueue(self, job))
    }

    fn enqueue_batch(&self, jobs: Vec<Enqueue>) -> BoxFuture<'_, Result<Vec<Job>>> {
        Box::pin(Client::enqueue_batch(self, jobs))
    }
}
