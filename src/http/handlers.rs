//! One function per endpoint: parse the request, call the engine handle,
//! render the reply.

use bytes::Bytes;
use hyper::StatusCode;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::borrow::Cow;
use std::time::{Duration, Instant};

use super::error::{ApiError, ERROR_TABLE};
use super::paging::{decode_cursor, encode_cursor, page_limit, query_pairs, query_value};
use super::router::Route;
use super::wire::{job_body, jobs_object, render_event, render_job};
use super::{AppState, Reply, SPEC_VERSION, is_empty_body};
use crate::engine::{EngineError, FetchRequest};
use crate::job::json::{JsonKind, RawObject, kind_of, minify, parse_object, push_ascii, string_value};
use crate::job::time::format_timestamp;
use crate::job::{
    Job, JobId, body_error, is_valid_queue, parse_enqueue_body, parse_enqueue_object, parse_failure_report, raw_integer,
};
use crate::limits::{
    BATCH_JOBS_MAX, ENVELOPE_BYTES_MAX, FETCH_COUNT_MAX, FETCH_QUEUES_MAX, HEALTH_PROBE_MS, HEARTBEAT_JOBS_MAX,
    PAGE_SIZE_DEFAULT, PAGE_SIZE_MAX, RESULT_BYTES_MAX, TIMEOUT_MS_MAX, WORKER_ID_CHARS_MAX,
};

pub async fn handle(app: &AppState, route: Route, query: &str, body: Bytes) -> Result<Reply, ApiError> {
    match route {
        Route::Manifest => Ok(Reply::ok(manifest().to_string())),
        Route::Health => health(app).await,
        Route::Ready => ready(app),
        Route::ErrorCatalog => Ok(Reply::ok(error_catalog().to_string())),
        Route::CreateJob => create_job(app, &body).await,
        Route::BatchJobs => batch_jobs(app, &body).await,
        Route::GetJob(id) => get_job(app, &id),
        Route::CancelJob(id) => cancel_job(app, &id).await,
        Route::Fetch => fetch(app, &body).await,
        Route::Ack => ack(app, None, &body).await,
        Route::AckById(id) => ack(app, Some(&id), &body).await,
        Route::Nack => nack(app, None, &body).await,
        Route::FailById(id) => nack(app, Some(&id), &body).await,
        Route::Queues => super::queues::list(app, query),
        Route::QueueStats(name) => super::queues::stats(app, &name),
        Route::PauseQueue(name, paused) => super::queues::pause(app, &name, paused, &body).await,
        Route::Events => events(app, query),
        Route::Heartbeat => heartbeat(app, &body).await,
        Route::Workers => workers(app, query),
        Route::Worker(id) => worker(app, &id),
        Route::SignalWorker(id, signal) => signal_worker(app, &id, signal).await,
        Route::ForgetWorker(id) => forget_worker(app, &id).await,
        Route::DeadLetter => dead_letter(app, query),
        Route::DeadLetterRetry(id) => dead_letter_retry(app, &id, &body).await,
        Route::DeadLetterDelete(id) => dead_letter_delete(app, &id).await,
        Route::Crons => super::cron::list(app, query),
        Route::RegisterCron => super::cron::register(app, &body).await,
        Route::GetCron(name) => super::cron::get(app, &name),
        Route::PatchCron(name) => super::cron::patch(app, &name, &body).await,
        Route::DeleteCron(name) => super::cron::delete(app, &name).await,
    }
}

/// A path or body id that is not a valid job id cannot exist: 404.
fn job_id(text: &str) -> Result<JobId, ApiError> {
    JobId::parse_any_case(text).ok_or_else(|| ApiError::not_found("job", text))
}

/// Parses a body that must be a JSON object; its values stay raw text.
fn object_body(body: &[u8]) -> Result<RawObject<'_>, ApiError> {
    parse_object(body).map_err(|error| ApiError::from(body_error(error)))
}

fn location(job: &Job) -> String {
    let mut path = String::with_capacity(50);
    path.push_str("/svc/v1/jobs/");
    push_ascii(&mut path, &job.id.to_hyphenated());
    path
}

async fn create_job(app: &AppState, body: &[u8]) -> Result<Reply, ApiError> {
    let new_job = parse_enqueue_body(body, app.engine.defaults())?;
    let jobs = app.engine.enqueue(vec![new_job]).outcome().await?;
    let job = &jobs[0];
    Ok(Reply::ok(job_body(job)).with_status(StatusCode::CREATED).header(hyper::header::LOCATION, location(job)))
}

async fn batch_jobs(app: &AppState, body: &[u8]) -> Result<Reply, ApiError> {
    let object = parse_object(body).map_err(|error| ApiError::from(body_error(error)))?;
    let Some(raw_jobs) = object.get_present("jobs") else {
        return Err(ApiError::invalid_request(Some("jobs"), "jobs is required: a non-empty array of enqueue items"));
    };
    // Counted before it is kept: a body of tiny items must not become millions of entries.
    let items = crate::job::json::raw_elements_at_most(raw_jobs, BATCH_JOBS_MAX)
        .ok_or_else(|| ApiError::invalid_request(Some("jobs"), "jobs must be a non-empty array of enqueue items"))?
        .map_err(|received| {
            ApiError::new("envelope_too_large", format!("a batch holds at most {BATCH_JOBS_MAX} jobs"))
                .detail("limit", BATCH_JOBS_MAX)
                .detail("received", received)
        })?;
    if items.is_empty() {
        return Err(ApiError::invalid_request(Some("jobs"), "jobs must not be empty"));
    }
    let mut new_jobs = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let prefix = format!("jobs[{index}]");
        let parsed = crate::job::json::parse_raw_object(item)
            .ok_or_else(|| crate::job::ValidationError::payload(prefix.clone(), format!("{prefix} must be an object")))
            .and_then(|object| {
                let compact = minify(item.get()).len();
                if compact > ENVELOPE_BYTES_MAX {
                    return Err(crate::job::ValidationError::too_large(prefix.clone(), ENVELOPE_BYTES_MAX, compact));
                }
                parse_enqueue_object(&object, app.engine.defaults()).map_err(|error| error.within(&prefix))
            });
        new_jobs.push(parsed.map_err(|error| ApiError::from(error).detail("index", index))?);
    }
    let jobs = app.engine.enqueue(new_jobs).outcome().await?;
    let mut body = jobs_object("jobs", &jobs);
    body.number("count", jobs.len());
    Ok(Reply::ok(body.finish()).with_status(StatusCode::CREATED))
}

fn get_job(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let id = job_id(id)?;
    let job = app.engine.job(id).ok_or_else(|| ApiError::not_found("job", id.to_string()))?;
    Ok(Reply::ok(job_body(&job)))
}

async fn cancel_job(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let id = job_id(id)?;
    let cancelled = app.engine.cancel(id).outcome().await?;
    let extra = [("previous_state", Value::from(cancelled.previous_state.as_str()))];
    Ok(Reply::ok(format!("{{\"job\":{}}}", render_job(&cancelled.job, &extra))))
}

/// `^[A-Za-z0-9._:@-]{1,256}$`, minus names that collide with worker routes.
fn worker_id(object: &RawObject) -> Result<Option<String>, ApiError> {
    let Some(raw) = object.get_present("worker_id") else {
        return Ok(None);
    };
    let valid = string_value(raw).filter(|text| {
        !text.is_empty()
            && text.len() <= WORKER_ID_CHARS_MAX
            && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:@-".contains(&b))
            && !matches!(text.as_ref(), "." | ".." | "fetch" | "ack" | "nack" | "heartbeat")
    });
    match valid {
        Some(text) => Ok(Some(text.into_owned())),
        None => Err(ApiError::invalid_request(
            Some("worker_id"),
            "worker_id must be 1 to 256 characters of A-Z, a-z, 0-9, '.', '_', ':', '@' and '-'",
        )),
    }
}

/// The optional `visibility_timeout_ms` of fetch and heartbeat bodies.
fn visibility_timeout(object: &RawObject) -> Result<Option<u64>, ApiError> {
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
    let queues_error = || {
        ApiError::invalid_request(
            Some("queues"),
            format!("queues is required: an array of 1 to {FETCH_QUEUES_MAX} queue names"),
        )
    };
    let items = object.get_present("queues").and_then(|raw| serde_json::from_str::<Vec<&RawValue>>(raw.get()).ok());
    let queues: Vec<String> = match items {
        Some(items) if !items.is_empty() && items.len() <= FETCH_QUEUES_MAX => items
            .iter()
            .map(|item| {
                string_value(item).filter(|name| is_valid_queue(name)).map(Cow::into_owned).ok_or_else(queues_error)
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(queues_error()),
    };
    let count = match object.get_present("count") {
        None => 1,
        Some(raw) => match raw_integer(raw) {
            Some(count) if count >= 1 => (count as usize).min(FETCH_COUNT_MAX),
            _ => {
                return Err(ApiError::invalid_request(Some("count"), "count must be an integer of at least 1"));
            }
        },
    };
    let visibility_timeout_ms = visibility_timeout(&object)?;
    let request = FetchRequest { queues, count, worker_id: worker_id(&object)?, visibility_timeout_ms };
    // A draining engine hands out no new work (docs/api.md, "Shutting down").
    let jobs = app.engine.fetch(request).outcome().await?;
    Ok(Reply::ok(jobs_object("jobs", &jobs).finish()))
}

/// The job id of a worker report: from the path, or `job_id` in the body.
fn report_job_id(path_id: Option<&str>, body_id: Option<&RawValue>) -> Result<JobId, ApiError> {
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

/// A 409 for a report on a job that is not active, with the expected state.
fn report_error(error: EngineError) -> ApiError {
    let is_state_conflict =
        matches!(error, EngineError::Conflict { reason: crate::engine::ConflictReason::InvalidState, .. });
    let api = ApiError::from(error);
    if is_state_conflict { api.detail("expected_state", "active") } else { api }
}

async fn ack(app: &AppState, path_id: Option<&str>, body: &[u8]) -> Result<Reply, ApiError> {
    let object = if path_id.is_some() && is_empty_body(body) { Default::default() } else { object_body(body)? };
    let id = report_job_id(path_id, object.get_present("job_id"))?;
    let result = object.get_present("result").map(|raw| minify(raw.get()));
    if let Some(result) = &result
        && result.len() > RESULT_BYTES_MAX
    {
        return Err(ApiError::from(crate::job::ValidationError::too_large("result", RESULT_BYTES_MAX, result.len())));
    }
    let worker = worker_id(&object)?;
    let job = app.engine.ack(id, result, worker).outcome().await.map_err(report_error)?;
    let mut body = super::wire::ObjectWriter::default();
    body.job("job", &job)
        .raw("acknowledged", "true")
        .id("id", job.id)
        .id("job_id", job.id)
        .string("state", job.state.as_str());
    if let Some(at) = job.completed_at {
        body.time("completed_at", at);
    }
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
    let job = app.engine.fail(id, report, requeue, worker_id(&object)?).outcome().await.map_err(report_error)?;
    let mut body = super::wire::ObjectWriter::default();
    body.job("job", &job)
        .id("id", job.id)
        .id("job_id", job.id)
        .string("state", job.state.as_str())
        .number("attempt", job.attempt)
        .number("max_attempts", job.max_attempts());
    if let Some(at) = job.retry_at {
        body.time("retry_at", at).time("next_attempt_at", at);
        if let Some(delay) = job.retry_delay_ms {
            body.number("retry_delay_ms", delay);
        }
    }
    if let Some(at) = job.discarded_at {
        body.time("discarded_at", at);
    }
    if let Some(at) = job.completed_at {
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
    let listed = object.get_present("active_jobs").or_else(|| object.get_present("active_job_ids"));
    let active_jobs = match listed.map(|raw| (raw, kind_of(raw))) {
        None => None,
        // A bare count is accepted and extends nothing.
        Some((raw, JsonKind::Number)) if raw.get().bytes().all(|byte| byte.is_ascii_digit()) => Some(Vec::new()),
        Some((raw, JsonKind::Array)) => {
            let ids: Option<Vec<_>> = serde_json::from_str::<Vec<&RawValue>>(raw.get())
                .ok()
                .filter(|items| items.len() <= HEARTBEAT_JOBS_MAX)
                .and_then(|items| items.iter().map(|item| string_value(item)).collect());
            let Some(ids) = ids else { return Err(active_jobs_error()) };
            // Ids that cannot exist are ignored like unknown ones.
            Some(ids.iter().filter_map(|id| JobId::parse_any_case(id)).collect())
        }
        Some(_) => return Err(active_jobs_error()),
    };
    let visibility_timeout_ms = visibility_timeout(&object)?;
    let beat = app.engine.heartbeat(worker_id, active_jobs, visibility_timeout_ms).outcome().await?;
    let (extended, signal) = (beat.extended, beat.signal);
    let now = crate::clock::Clock::now_ms(app.engine.clock().as_ref());
    // While the engine drains, the signal is `terminate` (docs/api.md, "Shutting down").
    let state = crate::engine::WorkerState::of(signal).as_str();
    let server_time = crate::job::time::format_timestamp(now);
    Ok(Reply::ok(json!({"state": state, "jobs_extended": extended, "server_time": server_time}).to_string()))
}

fn active_jobs_error() -> ApiError {
    ApiError::invalid_request(
        Some("active_jobs"),
        format!("active_jobs must be an array of at most {HEARTBEAT_JOBS_MAX} job ids"),
    )
}

fn render_worker(entry: &crate::engine::workers::WorkerEntry, now: i64) -> Value {
    let mut value = json!({
        "worker_id": entry.worker_id,
        "state": entry.state.as_str(),
        "first_seen_at": format_timestamp(entry.first_seen_at),
        "last_seen_at": format_timestamp(entry.last_seen_at),
        "active_job_ids": entry.active_job_ids.iter().map(|id| id.to_string()).collect::<Vec<_>>(),
        "stale": now - entry.last_seen_at > crate::limits::WORKER_STALE_MS,
    });
    if let Some(at) = entry.last_heartbeat_at {
        value["last_heartbeat_at"] = format_timestamp(at).into();
    }
    value
}

fn now_ms(app: &AppState) -> i64 {
    crate::clock::Clock::now_ms(app.engine.clock().as_ref())
}

/// `GET /workers`: by worker id, paged, optionally filtered by `state`.
fn workers(app: &AppState, query: &str) -> Result<Reply, ApiError> {
    let pairs = query_pairs(query);
    let limit = page_limit(&pairs)?;
    let state = match query_value(&pairs, "state").filter(|state| !state.is_empty()) {
        Some(state @ ("running" | "quiet" | "terminate")) => Some(state.to_string()),
        Some(_) => return Err(ApiError::invalid_request(Some("state"), "state must be running, quiet or terminate")),
        None => None,
    };
    let after = query_value(&pairs, "cursor").filter(|cursor| !cursor.is_empty()).map(decode_cursor).transpose()?;
    let (page, has_more) = app.engine.workers_page(after.as_deref(), limit, |entry| {
        state.as_deref().is_none_or(|state| entry.state.as_str() == state)
    });
    let now = now_ms(app);
    let cursor = if has_more { page.last().map(|entry| Value::from(encode_cursor(&entry.worker_id))) } else { None };
    let workers: Vec<Value> = page.iter().map(|entry| render_worker(entry, now)).collect();
    Ok(Reply::ok(json!({"workers": workers, "cursor": cursor, "has_more": has_more}).to_string()))
}

fn worker(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let entry = app.engine.worker(id).ok_or_else(|| ApiError::not_found("worker", id))?;
    Ok(Reply::ok(json!({"worker": render_worker(&entry, now_ms(app))}).to_string()))
}

async fn signal_worker(app: &AppState, id: &str, signal: &str) -> Result<Reply, ApiError> {
    use crate::engine::workers::WorkerSignal;
    let signal = if signal == "quiet" { WorkerSignal::Quiet } else { WorkerSignal::Terminate };
    let entry = app.engine.signal_worker(id.to_string(), signal).outcome().await?;
    Ok(Reply::ok(json!({"worker": render_worker(&entry, now_ms(app))}).to_string()))
}

async fn forget_worker(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    app.engine.forget_worker(id.to_string()).outcome().await?;
    Ok(Reply::ok(json!({"deleted": true, "worker_id": id}).to_string()))
}

/// A dead letter id: a malformed one cannot be listed, so it is not found.
fn dead_letter_id(text: &str) -> Result<JobId, ApiError> {
    JobId::parse_any_case(text).ok_or_else(|| ApiError::not_found("dead_letter_job", text))
}

fn dead_letter(app: &AppState, query: &str) -> Result<Reply, ApiError> {
    use crate::engine::DeadLetterCursor;
    let pairs = query_pairs(query);
    let limit = page_limit(&pairs)?;
    let queue = match query_value(&pairs, "queue").filter(|queue| !queue.is_empty()) {
        Some(queue) if is_valid_queue(queue) => Some(queue),
        Some(_) => return Err(ApiError::invalid_request(Some("queue"), "queue is not a valid queue name")),
        None => None,
    };
    let after = match query_value(&pairs, "cursor").filter(|cursor| !cursor.is_empty()) {
        None => None,
        Some(cursor) => {
            let invalid = || ApiError::invalid_request(Some("cursor"), "cursor is not one this server issued");
            Some(DeadLetterCursor::parse(&decode_cursor(cursor)?).ok_or_else(invalid)?)
        }
    };
    let (jobs, next) = app.engine.dead_letter_page(after, limit, queue);
    let has_more = next.is_some();
    let cursor = match next {
        Some(next) => format!("\"{}\"", encode_cursor(&next.to_string())),
        None => "null".to_string(),
    };
    let mut body = jobs_object("jobs", &jobs);
    body.raw("cursor", &cursor).raw("has_more", if has_more { "true" } else { "false" });
    Ok(Reply::ok(body.finish()))
}

async fn dead_letter_retry(app: &AppState, id: &str, body: &[u8]) -> Result<Reply, ApiError> {
    if !is_empty_body(body) {
        object_body(body)?;
    }
    let job = app.engine.dead_letter_retry(dead_letter_id(id)?).outcome().await?;
    Ok(Reply::ok(job_body(&job)))
}

async fn dead_letter_delete(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let id = dead_letter_id(id)?;
    app.engine.dead_letter_delete(id).outcome().await?;
    Ok(Reply::ok(json!({"deleted": true, "job_id": id.to_string()}).to_string()))
}

/// `exact`, `prefix.*` or `*`.
fn pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some("") => true,
        Some(prefix) if prefix.ends_with('.') => name.starts_with(prefix),
        _ => pattern == name,
    }
}

fn list_filter(pairs: &[(String, String)], key: &str) -> Option<Vec<String>> {
    query_value(pairs, key).map(|text| text.split(',').filter(|item| !item.is_empty()).map(str::to_string).collect())
}

fn events(app: &AppState, query: &str) -> Result<Reply, ApiError> {
    let pairs = query_pairs(query);
    let limit = page_limit(&pairs)?;
    let types = list_filter(&pairs, "types");
    let queues = list_filter(&pairs, "queues");
    let job_types = list_filter(&pairs, "job_types");
    let subject = query_value(&pairs, "subject").map(str::to_string);
    let after = query_value(&pairs, "after").or_else(|| query_value(&pairs, "cursor")).filter(|id| !id.is_empty());
    let page = app.engine.events_page(after, limit, |event| {
        let job = event.job.as_ref();
        types.as_ref().is_none_or(|types| types.iter().any(|pattern| pattern_matches(pattern, event.kind.type_name())))
            && queues.as_ref().is_none_or(|queues| job.is_some_and(|job| queues.contains(&job.queue)))
            && job_types.as_ref().is_none_or(|types| {
                job.is_some_and(|job| types.iter().any(|pattern| pattern_matches(pattern, &job.payload.job_type)))
            })
            && subject.as_ref().is_none_or(|subject| event.subject().as_ref() == Some(subject))
    });
    let cursor = page.events.last().map(|event| event.id.to_string()).or_else(|| after.map(str::to_string));
    let events: Vec<Value> = page.events.iter().map(|event| render_event(event)).collect();
    let mut body = json!({"events": events, "cursor": cursor, "has_more": page.has_more});
    if page.gap {
        body["gap"] = true.into();
    }
    Ok(Reply::ok(body.to_string()))
}

async fn health(app: &AppState) -> Result<Reply, ApiError> {
    let started = Instant::now();
    let probe = tokio::time::timeout(Duration::from_millis(HEALTH_PROBE_MS), app.engine.probe().outcome()).await;
    let latency_ms = started.elapsed().as_millis() as u64;
    let problem = if let Some(failure) = app.engine.failure() {
        Some(failure.code())
    } else if app.engine.disk_full() {
        Some("disk_full")
    } else {
        match probe {
            Ok(Ok(())) => None,
            Ok(Err(_)) => Some("sync_failed"),
            Err(_) => Some("probe_timeout"),
        }
    };
    let uptime_seconds = app.started.elapsed().as_secs();
    let (status, backend) = match problem {
        None => ("ok", json!({"type": "wal", "status": "ok", "latency_ms": latency_ms})),
        Some(error) => {
            ("unhealthy", json!({"type": "wal", "status": "unhealthy", "latency_ms": latency_ms, "error": error}))
        }
    };
    let body = json!({"status": status, "version": SPEC_VERSION, "uptime_seconds": uptime_seconds, "backend": backend})
        .to_string();
    Ok(match problem {
        None => Reply::ok(body),
        Some(_) => {
            Reply::ok(body).with_status(StatusCode::SERVICE_UNAVAILABLE).header(hyper::header::RETRY_AFTER, "1".into())
        }
    })
}

fn ready(app: &AppState) -> Result<Reply, ApiError> {
    let reason = if app.is_shutting_down() {
        Some("shutting_down")
    } else if app.engine.storage_failed() {
        Some("backend_unavailable")
    } else {
        None
    };
    Ok(match reason {
        None => Reply::ok(json!({"status": "ready"}).to_string()),
        Some(reason) => Reply::ok(json!({"status": "not_ready", "reason": reason}).to_string())
            .with_status(StatusCode::SERVICE_UNAVAILABLE)
            .header(hyper::header::RETRY_AFTER, "1".into()),
    })
}

fn error_catalog() -> Value {
    let errors: Vec<Value> = ERROR_TABLE
        .iter()
        .map(|(code, status, retryable, meaning, _)| json!({"code": code, "status": status, "retryable": retryable, "meaning": meaning}))
        .collect();
    json!({"errors": errors})
}

/// What this build implements (docs/api.md, "Discovery and probes"); features of later levels are false.
pub fn manifest() -> Value {
    json!({
        "specversion": SPEC_VERSION,
        "implementation": "svc",
        "implementation_version": env!("CARGO_PKG_VERSION"),
        "conformance_level": 2,
        "conformance": {"level": 2, "tier": "runtime"},
        "features": {
            "batch_enqueue": true, "dead_letter": true, "cron": true, "workflows": false,
            "unique_jobs": false, "priority": true, "schemas": false, "webhooks": false,
            "events": true, "rate_limiting": false, "worker_signals": true
        },
        "extensions": [{"name": "retry", "version": "1.0.0"}, {"name": "dead-letter", "version": "1.0.0"}, {"name": "events", "version": "1.0.0"}, {"name": "cron", "version": "1.0.0"}],
        "protocols": ["http"],
        "backend": "wal",
        "authentication": {"schemes": [], "required": false},
        "limits": {
            "max_envelope_bytes": ENVELOPE_BYTES_MAX, "max_meta_bytes": crate::limits::META_BYTES_MAX,
            "max_batch_jobs": BATCH_JOBS_MAX, "max_fetch_count": FETCH_COUNT_MAX,
            "default_page_size": PAGE_SIZE_DEFAULT, "max_page_size": PAGE_SIZE_MAX
        }
    })
}
