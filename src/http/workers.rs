//! The worker routes: fetch, ack, nack, heartbeat, and the worker registry
//! with its signals (docs/api.md, "Workers").

use hyper::Method;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::auth::Role;
use super::error::ApiError;
use super::extract::{job_id, object_body};
use super::paging::{decode_cursor, encode_cursor, page_limit, percent_decode, query_pairs, query_value};
use super::{AppState, Reply, is_empty_body};
use crate::engine::{ACKS_MAX, AckItem, AckMany, FetchRequest, WorkerState};
use crate::job::json::{JsonKind, RawObject, kind_of, string_value};
use crate::job::time::format_timestamp;
use crate::job::{
    Job, JobId, ack_result, body_error, fetch_count, fetch_queues, fetch_wait_ms, invalid_worker_id,
    is_valid_worker_id, parse_failure_report, raw_integer,
};
use crate::limits::{HEARTBEAT_JOBS_MAX, TIMEOUT_MS_MAX};
use crate::wire::{ObjectWriter, jobs_object_with};
use std::sync::Arc;

/// The worker routes (path ids as given, checked by the handlers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerRoute {
    Fetch,
    Ack,
    Nack,
    /// `POST /jobs/{id}/ack`.
    AckById(String),
    /// `POST /jobs/{id}/fail`.
    FailById(String),
    Heartbeat,
    List,
    Get(String),
    Forget(String),
    /// `quiet` or `terminate`.
    Signal(String, &'static str),
}

impl WorkerRoute {
    /// What a path under `/svc/v1/workers` takes (`rest`: the segments after it).
    pub fn choices(rest: &[&str]) -> Vec<(Method, WorkerRoute)> {
        match rest {
            [] => vec![(Method::GET, WorkerRoute::List)],
            ["fetch"] => vec![(Method::POST, WorkerRoute::Fetch)],
            ["ack"] => vec![(Method::POST, WorkerRoute::Ack)],
            ["nack"] => vec![(Method::POST, WorkerRoute::Nack)],
            ["heartbeat"] => vec![(Method::POST, WorkerRoute::Heartbeat)],
            [id] if !id.is_empty() => vec![
                (Method::GET, WorkerRoute::Get(percent_decode(id))),
                (Method::DELETE, WorkerRoute::Forget(percent_decode(id))),
            ],
            [id, signal @ ("quiet" | "terminate")] if !id.is_empty() => {
                let signal: &'static str = if *signal == "quiet" { "quiet" } else { "terminate" };
                vec![(Method::POST, WorkerRoute::Signal(percent_decode(id), signal))]
            }
            _ => Vec::new(),
        }
    }

    /// What `/svc/v1/jobs/{id}/{action}` takes for a worker's report
    /// (`ack` or `fail`); `id` as in the path.
    pub fn job_report_choices(id: &str, action: &str) -> Vec<(Method, WorkerRoute)> {
        match action {
            "ack" => vec![(Method::POST, WorkerRoute::AckById(percent_decode(id)))],
            "fail" => vec![(Method::POST, WorkerRoute::FailById(percent_decode(id)))],
            _ => Vec::new(),
        }
    }

    /// The metrics number, method and template (as the router's templates).
    pub fn template(&self) -> (usize, &'static str, &'static str) {
        match self {
            WorkerRoute::Fetch => (13, "POST", "/svc/v1/workers/fetch"),
            WorkerRoute::Ack => (14, "POST", "/svc/v1/workers/ack"),
            WorkerRoute::Nack => (15, "POST", "/svc/v1/workers/nack"),
            WorkerRoute::AckById(_) => (16, "POST", "/svc/v1/jobs/{id}/ack"),
            WorkerRoute::FailById(_) => (17, "POST", "/svc/v1/jobs/{id}/fail"),
            WorkerRoute::Heartbeat => (23, "POST", "/svc/v1/workers/heartbeat"),
            WorkerRoute::List => (24, "GET", "/svc/v1/workers"),
            WorkerRoute::Get(_) => (25, "GET", "/svc/v1/workers/{id}"),
            WorkerRoute::Forget(_) => (26, "DELETE", "/svc/v1/workers/{id}"),
            WorkerRoute::Signal(_, "quiet") => (27, "POST", "/svc/v1/workers/{id}/quiet"),
            WorkerRoute::Signal(..) => (28, "POST", "/svc/v1/workers/{id}/terminate"),
        }
    }

    /// Workers fetch and report; the registry and its signals are the operator's.
    pub fn allows(&self, role: Role) -> bool {
        match self {
            WorkerRoute::Fetch
            | WorkerRoute::Ack
            | WorkerRoute::Nack
            | WorkerRoute::AckById(_)
            | WorkerRoute::FailById(_)
            | WorkerRoute::Heartbeat => matches!(role, Role::Admin | Role::Worker),
            WorkerRoute::List | WorkerRoute::Get(_) | WorkerRoute::Forget(_) | WorkerRoute::Signal(..) => {
                role == Role::Admin
            }
        }
    }

    pub async fn handle(self, app: &AppState, query: &str, body: &[u8]) -> Result<Reply, ApiError> {
        match self {
            WorkerRoute::Fetch => fetch(app, body).await,
            WorkerRoute::Ack => ack(app, None, body).await,
            WorkerRoute::AckById(id) => ack(app, Some(&id), body).await,
            WorkerRoute::Nack => nack(app, None, body).await,
            WorkerRoute::FailById(id) => nack(app, Some(&id), body).await,
            WorkerRoute::Heartbeat => heartbeat(app, body).await,
            WorkerRoute::List => workers(app, query).await,
            WorkerRoute::Get(id) => worker(app, &id).await,
            WorkerRoute::Signal(id, signal) => signal_worker(app, &id, signal).await,
            WorkerRoute::Forget(id) => forget_worker(app, &id).await,
        }
    }

    #[cfg(test)]
    pub fn samples() -> Vec<WorkerRoute> {
        let id = || "x".to_string();
        vec![
            WorkerRoute::Fetch,
            WorkerRoute::Ack,
            WorkerRoute::Nack,
            WorkerRoute::AckById(id()),
            WorkerRoute::FailById(id()),
            WorkerRoute::Heartbeat,
            WorkerRoute::List,
            WorkerRoute::Get(id()),
            WorkerRoute::Forget(id()),
            WorkerRoute::Signal(id(), "quiet"),
            WorkerRoute::Signal(id(), "terminate"),
        ]
    }
}

/// The optional `worker_id` of a body (see [`is_valid_worker_id`]).
pub(super) fn worker_id(object: &RawObject) -> Result<Option<String>, ApiError> {
    let Some(raw) = object.get_present("worker_id") else {
        return Ok(None);
    };
    match string_value(raw).filter(|text| is_valid_worker_id(text)) {
        Some(text) => Ok(Some(text.into_owned())),
        None => Err(ApiError::from(invalid_worker_id())),
    }
}

/// The optional `visibility_timeout_ms` of fetch and heartbeat bodies.
pub(super) fn visibility_timeout(object: &RawObject) -> Result<Option<u64>, ApiError> {
    let Some(raw) = object.get_present("visibility_timeout_ms") else { return Ok(None) };
    match raw_integer(raw) {
        Some(ms) if (1..=TIMEOUT_MS_MAX as i64).contains(&ms) => Ok(Some(ms as u64)),
        _ => Err(ApiError::invalid_request(
            Some("visibility_timeout_ms"),
            format!("visibility_timeout_ms must be an integer from 1 to {TIMEOUT_MS_MAX}"),
        )),
    }
}

async fn fetch(app: &AppState, body: &[u8]) -> Result<Reply, ApiError> {
    let object = object_body(body)?;
    let (request, wait_ms) = fetch_request(&object)?;
    // A draining engine hands out no new work (docs/api.md, "Shutting down").
    let jobs = app.backend.fetch(request, wait_ms).outcome().await?;
    Ok(Reply::ok(jobs_with_fields(app, "jobs", &jobs).await?.finish()))
}

/// `{"<key>": [jobs]}` (left open), each job with its workflow's fields.
async fn jobs_with_fields(app: &AppState, key: &str, jobs: &[Arc<Job>]) -> Result<ObjectWriter, ApiError> {
    let fields = super::workflows::job_fields(app, jobs).await?;
    Ok(jobs_object_with(key, jobs, |job| fields.get(&job.id).cloned().unwrap_or_default()))
}

/// A fetch body (or an ack's `fetch` member): the request and its wait.
fn fetch_request(object: &RawObject) -> Result<(FetchRequest, u64), ApiError> {
    let items = object.get_present("queues").and_then(|raw| serde_json::from_str::<Vec<&RawValue>>(raw.get()).ok());
    // Missing or not an array: no queues, refused as such.
    let queues = fetch_queues(items.iter().flatten().map(|item| string_value(item)))?;
    let count = match object.get_present("count") {
        None => 1,
        Some(raw) => fetch_count(raw_integer(raw))?,
    };
    let visibility_timeout_ms = visibility_timeout(object)?;
    let wait_ms = match object.get_present("wait_ms") {
        None => 0,
        Some(raw) => fetch_wait_ms(raw_integer(raw))?,
    };
    Ok((FetchRequest { queues, count, worker_id: worker_id(object)?, visibility_timeout_ms }, wait_ms))
}

/// The job id of a worker report: from the path, or `job_id` in the body.
pub(super) fn report_job_id(path_id: Option<&str>, body_id: Option<&RawValue>) -> Result<JobId, ApiError> {
    let body_text = match body_id.map(string_value) {
        None => None,
        Some(Some(text)) => Some(text),
        Some(None) => {
            return Err(ApiError::invalid_request(Some("job_id"), "job_id must be a string"));
        }
    };
    match (path_id, body_text.as_deref()) {
        (Some(path), Some(body)) if !path.eq_ignore_ascii_case(body) => {
            Err(ApiError::invalid_request(Some("job_id"), "job_id in the body differs from the id in the path"))
        }
        (Some(path), _) => job_id(path),
        (None, Some(body)) => job_id(body),
        (None, None) => Err(ApiError::invalid_request(Some("job_id"), "job_id is required")),
    }
}

/// `POST /workers/ack` (or `/jobs/{id}/ack`): one job by `job_id`, or
/// several by `acks`; with `fetch`, the next jobs are claimed in the same
/// step and answered as `jobs` (docs/api.md, "Ack").
async fn ack(app: &AppState, path_id: Option<&str>, body: &[u8]) -> Result<Reply, ApiError> {
    let object = if path_id.is_some() && is_empty_body(body) { Default::default() } else { object_body(body)? };
    let worker = worker_id(&object)?;
    let fetch = match object.get_present("fetch") {
        None => None,
        Some(raw) => Some(ack_fetch(raw, worker.as_deref())?),
    };
    if let Some(acks) = object.get_present("acks") {
        if path_id.is_some() || object.get_present("job_id").is_some() || object.get_present("result").is_some() {
            return Err(ApiError::invalid_request(Some("acks"), "acks names the jobs: no job_id or result beside it"));
        }
        return ack_many(app, acks, worker, fetch).await;
    }
    let id = report_job_id(path_id, object.get_present("job_id"))?;
    let result = object.get_present("result").map(ack_result).transpose()?;
    let job = match fetch {
        None => app.backend.ack(id, result, worker).outcome().await.map_err(ApiError::from)?,
        Some(fetch) => {
            let mut request = AckMany::new(vec![AckItem { id, result }], worker, Some(fetch));
            request.fetch_unless_refused = true;
            let outcome = app.backend.ack_many(request).outcome().await?;
            let acked = outcome.acked.into_iter().next().expect("one ack, one outcome").map_err(ApiError::from)?;
            let mut body = jobs_with_fields(app, "jobs", &outcome.jobs).await?;
            push_acked(&mut body, &acked);
            return Ok(Reply::ok(body.finish()));
        }
    };
    let mut body = ObjectWriter::default();
    push_acked(&mut body, &job);
    Ok(Reply::ok(body.finish()))
}

/// The fields of a one-job ack's answer.
fn push_acked(body: &mut ObjectWriter, job: &Job) {
    body.job("job", job)
        .raw("acknowledged", "true")
        .id("id", job.id)
        .id("job_id", job.id)
        .string("state", job.state.as_str());
    if let Some(at) = job.run().completed_at {
        body.time("completed_at", at);
    }
}

/// An ack's `fetch` member: a fetch body, whose `worker_id` (if any) is the ack's.
fn ack_fetch(raw: &RawValue, worker: Option<&str>) -> Result<(FetchRequest, u64), ApiError> {
    let object = crate::job::json::parse_object(raw.get().as_bytes())
        .map_err(|_| ApiError::invalid_request(Some("fetch"), "fetch must be an object, as a fetch body is"))?;
    let (mut request, wait_ms) = fetch_request(&object)?;
    match (request.worker_id.as_deref(), worker) {
        (Some(inner), Some(outer)) if inner != outer => {
            return Err(ApiError::invalid_request(Some("fetch.worker_id"), "fetch names another worker than the ack"));
        }
        (None, Some(outer)) => request.worker_id = Some(outer.to_string()),
        _ => {}
    }
    Ok((request, wait_ms))
}

/// The error object of a whole refusal, without what belongs to the
/// request rather than the item.
fn item_error(error: ApiError) -> Value {
    let mut error = error.body("")["error"].take();
    if let Some(fields) = error.as_object_mut() {
        for key in ["request_id", "hint", "docs_url"] {
            fields.remove(key);
        }
    }
    error
}

/// `acks: [{job_id, result?}, ...]`: each acked on its own; the answer says
/// how each went, and holds the jobs `fetch` claimed.
async fn ack_many(
    app: &AppState,
    raw: &RawValue,
    worker: Option<String>,
    fetch: Option<(FetchRequest, u64)>,
) -> Result<Reply, ApiError> {
    let invalid = || {
        ApiError::invalid_request(
            Some("acks"),
            format!("acks must be an array of 1 to {ACKS_MAX} objects, each with a job_id and an optional result"),
        )
    };
    let items: Vec<&RawValue> = serde_json::from_str(raw.get()).map_err(|_| invalid())?;
    if items.is_empty() || items.len() > ACKS_MAX {
        return Err(invalid());
    }
    // Each item is checked on its own: one naming no valid job, or with a
    // result too large, is refused in its place and the others go on.
    let mut acks = Vec::with_capacity(items.len());
    let mut checked: Vec<(String, Result<(), ApiError>)> = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let object = crate::job::json::parse_object(item.get().as_bytes()).map_err(|_| invalid())?;
        let Some(text) = object.get_present("job_id").and_then(string_value) else {
            return Err(invalid().detail("index", index));
        };
        let item = report_job_id(None, object.get_present("job_id")).and_then(|id| {
            let result = object.get_present("result").map(ack_result).transpose()?;
            Ok(AckItem { id, result })
        });
        match item {
            Ok(item) => {
                checked.push((item.id.to_string(), Ok(())));
                acks.push(item);
            }
            Err(error) => checked.push((text.into_owned(), Err(error))),
        }
    }
    let outcome = if acks.is_empty() && fetch.is_none() {
        crate::engine::AckOutcome { acked: Vec::new(), jobs: Vec::new() }
    } else {
        app.backend.ack_many(AckMany::new(acks, worker, fetch)).outcome().await?
    };
    let mut acked = outcome.acked.iter();
    let results: Vec<Value> = checked
        .into_iter()
        .map(|(id, checked)| match checked.map(|()| acked.next().expect("an outcome for each ack sent")) {
            Ok(Ok(job)) => {
                let mut entry = json!({"job_id": id, "acknowledged": true, "state": job.state.as_str()});
                if let Some(at) = job.run().completed_at {
                    entry["completed_at"] = format_timestamp(at).into();
                }
                entry
            }
            Ok(Err(error)) => {
                json!({"job_id": id, "acknowledged": false, "error": item_error(ApiError::from(error.clone()))})
            }
            Err(error) => json!({"job_id": id, "acknowledged": false, "error": item_error(error)}),
        })
        .collect();
    let mut body = jobs_with_fields(app, "jobs", &outcome.jobs).await?;
    body.value("acks", &Value::Array(results));
    Ok(Reply::ok(body.finish()))
}

async fn nack(app: &AppState, path_id: Option<&str>, body: &[u8]) -> Result<Reply, ApiError> {
    let object = object_body(body)?;
    let id = report_job_id(path_id, object.get_present("job_id"))?;
    // The report is decoded whole: it is small, and its fields are checked one
    // by one. Raw text that `Value` refuses (a number beyond f64) is malformed.
    let error =
        match object.get_present("error") {
            None => None,
            Some(raw) => Some(serde_json::from_str::<Value>(raw.get()).map_err(|error| {
                ApiError::from(body_error(crate::job::json::BodyError::Malformed(error.to_string())))
            })?),
        };
    let report = parse_failure_report(error.as_ref())?;
    let requeue = match object.get_present("requeue").map(RawValue::get) {
        None => false,
        Some("true") => true,
        Some("false") => false,
        Some(_) => {
            return Err(ApiError::invalid_request(Some("requeue"), "requeue must be a boolean"));
        }
    };
    let job = app.backend.fail(id, report, requeue, worker_id(&object)?).outcome().await.map_err(ApiError::from)?;
    let mut body = crate::wire::ObjectWriter::default();
    body.job("job", &job)
        .id("id", job.id)
        .id("job_id", job.id)
        .string("state", job.state.as_str())
        .number("attempt", job.attempt)
        .number("max_attempts", job.max_attempts());
    if let Some(at) = job.run().retry_at {
        body.time("retry_at", at).time("next_attempt_at", at);
        if let Some(delay) = job.run().retry_delay_ms {
            body.number("retry_delay_ms", delay);
        }
    }
    if let Some(at) = job.run().discarded_at {
        body.time("discarded_at", at);
    }
    if let Some(at) = job.run().completed_at {
        body.time("completed_at", at);
    }
    Ok(Reply::ok(body.finish()))
}

/// `POST /workers/heartbeat` (docs/api.md, "Heartbeat").
async fn heartbeat(app: &AppState, body: &[u8]) -> Result<Reply, ApiError> {
    let object = object_body(body)?;
    let Some(worker_id) = worker_id(&object)? else {
        return Err(ApiError::invalid_request(Some("worker_id"), "worker_id is required"));
    };
    let is_count = |raw: &RawValue| kind_of(raw) == JsonKind::Number && raw.get().bytes().all(|b| b.is_ascii_digit());
    // `active_jobs` may be a count beside the list in `active_job_ids` (as
    // the OJS JavaScript SDK sends them): the list is what counts then.
    let listed = match (object.get_present("active_jobs"), object.get_present("active_job_ids")) {
        (Some(count), Some(ids)) if is_count(count) => Some(("active_job_ids", ids)),
        (Some(jobs), _) => Some(("active_jobs", jobs)),
        (None, ids) => ids.map(|ids| ("active_job_ids", ids)),
    };
    let active_jobs = match listed.map(|(field, raw)| (field, raw, kind_of(raw))) {
        None => None,
        // A bare count is accepted and extends nothing.
        Some((_, raw, JsonKind::Number)) if is_count(raw) => Some(Vec::new()),
        Some((field, raw, JsonKind::Array)) => {
            let ids: Option<Vec<_>> = serde_json::from_str::<Vec<&RawValue>>(raw.get())
                .ok()
                .filter(|items| items.len() <= HEARTBEAT_JOBS_MAX)
                .and_then(|items| items.iter().map(|item| string_value(item)).collect());
            let Some(ids) = ids else { return Err(active_jobs_error(field)) };
            // Ids that cannot exist are ignored like unknown ones.
            Some(ids.iter().filter_map(|id| JobId::parse_any_case(id)).collect())
        }
        Some((field, _, _)) => return Err(active_jobs_error(field)),
    };
    let visibility_timeout_ms = visibility_timeout(&object)?;
    let beat = app.backend.heartbeat(worker_id, active_jobs, visibility_timeout_ms).outcome().await?;
    let (extended, signal) = (beat.extended, beat.signal);
    let not_extended: Vec<String> = beat.not_extended.iter().map(JobId::to_string).collect();
    let now = crate::clock::Clock::now_ms(app.clock.as_ref());
    // While the engine drains, the signal is `terminate` (docs/api.md, "Shutting down").
    let state = crate::engine::WorkerState::of(signal).as_str();
    let server_time = crate::job::time::format_timestamp(now);
    let mut body = json!({"state": state, "jobs_extended": extended, "server_time": server_time});
    if !not_extended.is_empty() {
        body["jobs_not_extended"] = not_extended.into();
    }
    Ok(Reply::ok(body.to_string()))
}

/// 400 for a list of active jobs (`field`: `active_jobs` or `active_job_ids`) that is not one.
pub(super) fn active_jobs_error(field: &str) -> ApiError {
    ApiError::invalid_request(Some(field), format!("{field} must be an array of at most {HEARTBEAT_JOBS_MAX} job ids"))
}

pub(super) fn render_worker(entry: &crate::engine::workers::WorkerEntry, now: i64) -> Value {
    let mut value = json!({
        "worker_id": entry.worker_id,
        "state": entry.state.as_str(),
        "first_seen_at": format_timestamp(entry.first_seen_at),
        "last_seen_at": format_timestamp(entry.last_seen_at),
        "active_job_ids": entry.active_job_ids.iter().map(|id| id.to_string()).collect::<Vec<_>>(),
        "queues": entry.queues,
        "stale": now - entry.last_seen_at > crate::limits::WORKER_STALE_MS,
    });
    if let Some(at) = entry.last_heartbeat_at {
        value["last_heartbeat_at"] = format_timestamp(at).into();
    }
    value
}

pub(super) fn now_ms(app: &AppState) -> i64 {
    crate::clock::Clock::now_ms(app.clock.as_ref())
}

/// `GET /workers`: by worker id, paged, optionally filtered by `state`.
async fn workers(app: &AppState, query: &str) -> Result<Reply, ApiError> {
    let pairs = query_pairs(query);
    let limit = page_limit(&pairs)?;
    let state = match query_value(&pairs, "state").filter(|state| !state.is_empty()) {
        Some("running") => Some(WorkerState::Running),
        Some("quiet") => Some(WorkerState::Quiet),
        Some("terminate") => Some(WorkerState::Terminate),
        Some(_) => return Err(ApiError::invalid_request(Some("state"), "state must be running, quiet or terminate")),
        None => None,
    };
    let after = query_value(&pairs, "cursor").filter(|cursor| !cursor.is_empty()).map(decode_cursor).transpose()?;
    let (page, has_more) = app.backend.workers_page(after, limit, state).outcome().await?;
    let now = now_ms(app);
    let cursor = if has_more { page.last().map(|entry| Value::from(encode_cursor(&entry.worker_id))) } else { None };
    let workers: Vec<Value> = page.iter().map(|entry| render_worker(entry, now)).collect();
    Ok(Reply::ok(json!({"workers": workers, "cursor": cursor, "has_more": has_more}).to_string()))
}

async fn worker(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let entry = app.backend.worker(id.to_string()).outcome().await?.ok_or_else(|| ApiError::not_found("worker", id))?;
    Ok(Reply::ok(json!({"worker": render_worker(&entry, now_ms(app))}).to_string()))
}

async fn signal_worker(app: &AppState, id: &str, signal: &str) -> Result<Reply, ApiError> {
    use crate::engine::workers::WorkerSignal;
    let signal = if signal == "quiet" { WorkerSignal::Quiet } else { WorkerSignal::Terminate };
    let entry = app.backend.signal_worker(id.to_string(), signal).outcome().await?;
    Ok(Reply::ok(json!({"worker": render_worker(&entry, now_ms(app))}).to_string()))
}

async fn forget_worker(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    app.backend.forget_worker(id.to_string()).outcome().await?;
    Ok(Reply::ok(json!({"deleted": true, "worker_id": id}).to_string()))
}
