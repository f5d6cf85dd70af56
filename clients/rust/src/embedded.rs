//! An embedded svc as a [`WorkSource`] and an [`Enqueuer`]: the worker and
//! producer code that runs against a server runs unchanged against
//! `svc::Svc` in the same process, through its async engine handle.
//!
//! Calls are checked as the HTTP API checks the same request, and refusals
//! come back as [`Error::Api`] with the code and status HTTP would answer.
//!
//! `svc::Svc::open`, `close` and the drop of the last handle wait for the
//! engine's thread, which must not happen on an async runtime's thread:
//! from async code, open and close it with [`open`] and [`close`], and keep
//! a handle until the worker is done.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use svc::engine::{AckItem, AckMany, EngineError, EngineHandle, FetchRequest, ReportProgress, WorkerSignal};
use svc::job::{JobId, JobProgress, ValidationError};

use crate::enqueue::{Enqueue, millis};
use crate::error::{ApiError, Error, Result};
use crate::source::{Acks, AcksAnswer, BoxFuture, Enqueuer, Failure, Fetch, Heartbeat, ProgressReport, WorkSource};
use crate::types::{AckOutcome, HeartbeatAnswer, Job, Progress, WorkerState};

/// Opens (or creates) an embedded svc in `data_dir` from async code, on
/// the blocking pool.
pub async fn open(data_dir: impl Into<PathBuf>) -> std::result::Result<Arc<svc::Svc>, svc::SvcError> {
    open_with(svc::engine::EngineConfig::new(data_dir)).await
}

/// Opens an embedded svc with these settings from async code.
pub async fn open_with(config: svc::engine::EngineConfig) -> std::result::Result<Arc<svc::Svc>, svc::SvcError> {
    tokio::task::spawn_blocking(move || svc::Svc::open_with(config).map(Arc::new))
        .await
        .expect("opening svc does not panic")
}

/// Closes an embedded svc from async code (its final snapshot is written),
/// once the other handles on it are gone: it waits up to 10 s for them (a
/// worker that just stopped lets go of its own), then leaves the close to
/// the last of them.
pub async fn close(svc: Arc<svc::Svc>) {
    let closing = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut svc = svc;
        loop {
            match Arc::try_unwrap(svc) {
                Ok(svc) => return svc.close(),
                Err(shared) if Instant::now() >= deadline => {
                    tracing::warn!(target: "svc_client", "other handles on the embedded svc remain; it closes with the last");
                    drop(shared);
                    return;
                }
                Err(shared) => {
                    svc = shared;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    });
    let _ = closing.await;
}

/// svc's refusal, as HTTP would answer it.
fn engine_error(error: EngineError) -> Error {
    Error::from(api_error(error))
}

fn api_error(error: EngineError) -> ApiError {
    from_refusal(svc::Refusal::from(error))
}

fn validation_error(error: ValidationError) -> Error {
    Error::from(from_refusal(svc::Refusal::from(error)))
}

fn from_refusal(refusal: svc::Refusal) -> ApiError {
    let mut api = ApiError::new(refusal.status(), refusal.code, refusal.message.clone());
    api.retryable = refusal.retryable();
    api.details = refusal.details;
    api
}

/// A job as HTTP renders it, read into this crate's [`Job`].
fn render(handle: &EngineHandle, job: &svc::job::Job) -> Result<Job> {
    let given = job.workflow().and_then(|(workflow_id, role)| {
        Some(svc::GivenResults::from(handle.workflow(workflow_id)?.parent_results(role)))
    });
    let text = svc::render_job(job, given.as_ref());
    serde_json::from_str(&text).map_err(|error| Error::protocol(format!("a job does not read: {error}"), None))
}

fn job_id(text: &str) -> Result<JobId> {
    JobId::parse_any_case(text).ok_or_else(|| {
        Error::from(
            ApiError::new(404, "not_found", format!("job {text} not found")).with_detail("resource_type", "job"),
        )
    })
}

impl ApiError {
    fn with_detail(mut self, key: &str, value: &str) -> ApiError {
        self.details.insert(key.into(), json!(value));
        self
    }
}

fn fetch_request(fetch: &Fetch, worker_id: Option<String>) -> Result<(FetchRequest, u64)> {
    let queues = svc::job::fetch_queues(fetch.queues.iter().map(Some)).map_err(validation_error)?;
    let count =
        svc::job::fetch_count(Some(i64::try_from(fetch.count).unwrap_or(i64::MAX))).map_err(validation_error)?;
    if let Some(worker) = &worker_id
        && !svc::job::is_valid_worker_id(worker)
    {
        return Err(validation_error(svc::job::invalid_worker_id()));
    }
    let wait = svc::job::fetch_wait_ms(Some(i64::try_from(millis(fetch.wait)).unwrap_or(i64::MAX)))
        .map_err(validation_error)?;
    let visibility_timeout_ms = fetch.visibility_timeout.map(|timeout| millis(timeout).max(1));
    Ok((FetchRequest { queues, count, worker_id, visibility_timeout_ms }, wait))
}

fn render_all(handle: &EngineHandle, jobs: &[Arc<svc::job::Job>]) -> Result<Vec<Job>> {
    jobs.iter().map(|job| render(handle, job)).collect()
}

async fn fetch(handle: &EngineHandle, fetch: Fetch) -> Result<Vec<Job>> {
    let worker_id = fetch.worker_id.clone();
    let (request, wait) = fetch_request(&fetch, worker_id)?;
    let jobs = handle.fetch_waiting(request, wait).outcome().await.map_err(engine_error)?;
    render_all(handle, &jobs)
}

async fn ack(handle: &EngineHandle, acks: Acks) -> Result<AcksAnswer> {
    if acks.acks.is_empty() || acks.acks.len() > svc::engine::ACKS_MAX {
        return Err(Error::invalid(Some("acks".into()), format!("acks must name 1 to {} jobs", svc::engine::ACKS_MAX)));
    }
    let mut items = Vec::with_capacity(acks.acks.len());
    let mut refused = Vec::new();
    for (index, (id, result)) in acks.acks.iter().enumerate() {
        let result = match result {
            None | Some(Value::Null) => None,
            Some(value) => svc::job::parse_ack_result(&value.to_string()).map_err(validation_error)?,
        };
        match JobId::parse_any_case(id) {
            Some(id) => items.push(AckItem { id, result }),
            None => refused.push(index),
        }
    }
    let fetch = match &acks.fetch {
        Some(fetch) => Some(fetch_request(fetch, acks.worker_id.clone())?),
        None => None,
    };
    let outcome = if items.is_empty() {
        svc::engine::AckOutcome { acked: Vec::new(), jobs: Vec::new() }
    } else {
        let request = AckMany::new(items, acks.worker_id.clone(), fetch);
        handle.submit(request).outcome().await.map_err(engine_error)?
    };
    let mut acked = outcome.acked.into_iter();
    let mut outcomes = Vec::with_capacity(acks.acks.len());
    for (index, (id, _)) in acks.acks.iter().enumerate() {
        let outcome = if refused.contains(&index) {
            Err(ApiError::new(404, "not_found", format!("job {id} not found")))
        } else {
            match acked.next() {
                Some(Ok(job)) => Ok(render(handle, &job)?.state),
                Some(Err(error)) => Err(api_error(error)),
                None => Err(ApiError::new(500, "internal", "an ack had no outcome")),
            }
        };
        outcomes.push(AckOutcome { job_id: id.clone(), outcome });
    }
    Ok(AcksAnswer { acks: outcomes, jobs: render_all(handle, &outcome.jobs)? })
}

async fn nack(
    handle: &EngineHandle,
    job_id_text: String,
    failure: Failure,
    requeue: bool,
    worker_id: Option<String>,
) -> Result<Job> {
    let id = job_id(&job_id_text)?;
    let mut report = svc::job::Failure::new(failure.error_type, failure.message).backtrace(failure.backtrace);
    if let Some(code) = failure.code {
        report = report.code(code);
    }
    if let Some(details) = failure.details {
        report = report.details(details);
    }
    if failure.retryable == Some(false) {
        report = report.non_retryable();
    }
    let report = report.build().map_err(validation_error)?;
    let job = handle.fail(id, report, requeue, worker_id).outcome().await.map_err(engine_error)?;
    render(handle, &job)
}

async fn heartbeat(handle: &EngineHandle, heartbeat: Heartbeat) -> Result<HeartbeatAnswer> {
    if !svc::job::is_valid_worker_id(&heartbeat.worker_id) {
        return Err(validation_error(svc::job::invalid_worker_id()));
    }
    let ids = heartbeat.active_jobs.iter().filter_map(|id| JobId::parse_any_case(id)).collect();
    let timeout = heartbeat.visibility_timeout.map(|timeout| millis(timeout).max(1));
    let outcome = handle.heartbeat(heartbeat.worker_id, Some(ids), timeout).outcome().await.map_err(engine_error)?;
    let state = match outcome.signal {
        None => WorkerState::Running,
        Some(WorkerSignal::Quiet) => WorkerState::Quiet,
        Some(WorkerSignal::Terminate) => WorkerState::Terminate,
        Some(_) => WorkerState::Unknown,
    };
    Ok(HeartbeatAnswer { state, jobs_extended: outcome.extended, server_time: None })
}

async fn report_progress(handle: &EngineHandle, job_id_text: String, report: ProgressReport) -> Result<Progress> {
    let id = job_id(&job_id_text)?;
    let mut progress = JobProgress::new(report.fraction);
    if let Some(message) = report.message {
        progress = progress.message(message);
    }
    if let Some(data) = &report.data {
        progress = progress.data(data).map_err(validation_error)?;
    }
    progress.check().map_err(validation_error)?;
    let request = ReportProgress { id, progress, worker_id: report.worker_id };
    let job = handle.submit(request).outcome().await.map_err(engine_error)?;
    let reported = job.progress().cloned();
    let rendered = render(handle, &job)?;
    Ok(Progress {
        job_id: rendered.id,
        state: rendered.state,
        attempt: rendered.attempt,
        progress: reported.as_ref().map(|progress| progress.fraction),
        message: reported.as_ref().and_then(|progress| progress.message.clone()),
        data: reported
            .as_ref()
            .and_then(|progress| progress.data.as_deref())
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or(Value::Null),
        updated_at: reported.map(|progress| svc::job::time::format_timestamp(progress.updated_at)),
    })
}

async fn enqueue_all(handle: &EngineHandle, jobs: Vec<Enqueue>) -> Result<Vec<Job>> {
    svc::job::check_batch_size(jobs.len()).map_err(validation_error)?;
    let batch = jobs.len() > 1;
    let mut new_jobs = Vec::with_capacity(jobs.len());
    for (index, job) in jobs.iter().enumerate() {
        let body = job.to_json()?.to_string();
        let new_job = svc::job::parse_enqueue_body(body.as_bytes(), handle.defaults()).map_err(|mut error| {
            if batch {
                error = error.within(&format!("jobs[{index}]"));
                error.details.push(("index", index.into()));
            }
            validation_error(error)
        })?;
        new_jobs.push(new_job);
    }
    let enqueued = handle.enqueue(new_jobs).outcome().await.map_err(engine_error)?;
    enqueued
        .into_iter()
        .map(|enqueued| {
            let mut job = render(handle, &enqueued.job)?;
            job.deduplicated = enqueued.deduplicated;
            Ok(job)
        })
        .collect()
}

impl WorkSource for EngineHandle {
    fn fetch(&self, request: Fetch) -> BoxFuture<'_, Result<Vec<Job>>> {
        Box::pin(fetch(self, request))
    }

    fn ack(&self, acks: Acks) -> BoxFuture<'_, Result<AcksAnswer>> {
        Box::pin(ack(self, acks))
    }

    fn nack(
        &self,
        job_id: String,
        failure: Failure,
        requeue: bool,
        worker_id: Option<String>,
    ) -> BoxFuture<'_, Result<Job>> {
        Box::pin(nack(self, job_id, failure, requeue, worker_id))
    }

    fn heartbeat(&self, request: Heartbeat) -> BoxFuture<'_, Result<HeartbeatAnswer>> {
        Box::pin(heartbeat(self, request))
    }

    fn report_progress(&self, job_id: String, report: ProgressReport) -> BoxFuture<'_, Result<Progress>> {
        Box::pin(report_progress(self, job_id, report))
    }

    fn job(&self, job_id: String) -> BoxFuture<'_, Result<Option<Job>>> {
        Box::pin(async move {
            match JobId::parse_any_case(&job_id).and_then(|id| EngineHandle::job(self, id)) {
                Some(job) => render(self, &job).map(Some),
                None => Ok(None),
            }
        })
    }

    fn answers_can_be_lost(&self) -> bool {
        false
    }
}

impl Enqueuer for EngineHandle {
    fn enqueue(&self, job: Enqueue) -> BoxFuture<'_, Result<Job>> {
        Box::pin(async move {
            let mut jobs = enqueue_all(self, vec![job]).await?;
            Ok(jobs.remove(0))
        })
    }

    fn enqueue_batch(&self, jobs: Vec<Enqueue>) -> BoxFuture<'_, Result<Vec<Job>>> {
        Box::pin(enqueue_all(self, jobs))
    }
}

impl WorkSource for svc::Svc {
    fn fetch(&self, request: Fetch) -> BoxFuture<'_, Result<Vec<Job>>> {
        WorkSource::fetch(self.handle(), request)
    }

    fn ack(&self, acks: Acks) -> BoxFuture<'_, Result<AcksAnswer>> {
        WorkSource::ack(self.handle(), acks)
    }

    fn nack(
        &self,
        job_id: String,
        failure: Failure,
        requeue: bool,
        worker_id: Option<String>,
    ) -> BoxFuture<'_, Result<Job>> {
        WorkSource::nack(self.handle(), job_id, failure, requeue, worker_id)
    }

    fn heartbeat(&self, request: Heartbeat) -> BoxFuture<'_, Result<HeartbeatAnswer>> {
        WorkSource::heartbeat(self.handle(), request)
    }

    fn report_progress(&self, job_id: String, report: ProgressReport) -> BoxFuture<'_, Result<Progress>> {
        WorkSource::report_progress(self.handle(), job_id, report)
    }

    fn job(&self, job_id: String) -> BoxFuture<'_, Result<Option<Job>>> {
        WorkSource::job(self.handle(), job_id)
    }

    fn answers_can_be_lost(&self) -> bool {
        false
    }
}

impl Enqueuer for svc::Svc {
    fn enqueue(&self, job: Enqueue) -> BoxFuture<'_, Result<Job>> {
        Enqueuer::enqueue(self.handle(), job)
    }

    fn enqueue_batch(&self, jobs: Vec<Enqueue>) -> BoxFuture<'_, Result<Vec<Job>>> {
        Enqueuer::enqueue_batch(self.handle(), jobs)
    }
}
