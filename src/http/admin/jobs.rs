//! The admin job routes (docs/api.md, "Admin API"): listing and searching
//! jobs, one job in full with its timeline, and bulk actions by filter.

use hyper::StatusCode;
use serde_json::{Value, json};

use super::super::error::ApiError;
use super::super::extract::object_body;
use super::super::paging::{decode_cursor, encode_cursor, page_limit, query_pairs, query_value};
use super::super::{AppState, Reply};
use crate::backend::run_bulk;
use crate::engine::{BulkAction, JobCursor, JobFilter};
use crate::job::time::{format_timestamp, parse_timestamp};
use crate::job::{Job, JobId, JobState, is_valid_queue};

/// A filter from named values (the query of a listing, or a bulk body's
/// `filter`): `queue`, `state` (one, or several comma-separated),
/// `type` (exact or `prefix.*`), `since` and `until` (RFC 3339, on the
/// creation time) and `q` (text in args, meta or the last error).
pub(in crate::__private::http) fn parse_filter<'a>(
    get: impl Fn(&str) -> Option<&'a str>,
    prefix: &str,
) -> Result<JobFilter, ApiError> {
    let field = |name: &str| format!("{prefix}{name}");
    let mut filter = JobFilter::all();
    if let Some(queue) = get("queue").filter(|queue| !queue.is_empty()) {
        if !is_valid_queue(queue) {
            return Err(ApiError::invalid_request(Some(&field("queue")), "queue is not a valid queue name"));
        }
        filter = filter.queue(queue);
    }
    if let Some(states) = get("state").filter(|states| !states.is_empty()) {
        for name in states.split(',') {
            let state = JobState::ALL.into_iter().find(|state| state.as_str() == name.trim()).ok_or_else(|| {
                ApiError::invalid_request(Some(&field("state")), format!("{name} is not a job state"))
            })?;
            filter = filter.state(state);
        }
    }
    if let Some(pattern) = get("type").filter(|pattern| !pattern.is_empty()) {
        if pattern.len() > crate::limits::TYPE_CHARS_MAX {
            return Err(ApiError::invalid_request(Some(&field("type")), "type is too long"));
        }
        // No job type holds one, and PostgreSQL's text cannot hold a NUL.
        if pattern.chars().any(char::is_control) {
            return Err(ApiError::invalid_request(Some(&field("type")), "type must not contain control characters"));
        }
        filter = filter.job_type(pattern);
    }
    let time = |name: &str| -> Result<Option<i64>, ApiError> {
        get(name)
            .filter(|text| !text.is_empty())
            .map(|text| parse_timestamp(text).map_err(|problem| ApiError::invalid_request(Some(&field(name)), problem)))
            .transpose()
    };
    filter = filter.created_between(time("since")?, time("until")?);
    if let Some(text) = get("q").filter(|text| !text.is_empty()) {
        if text.len() > crate::limits::SEARCH_TEXT_BYTES_MAX {
            return Err(ApiError::invalid_request(
                Some(&field("q")),
                format!("q may be at most {} bytes", crate::limits::SEARCH_TEXT_BYTES_MAX),
            ));
        }
        filter = filter.text(text);
    }
    Ok(filter)
}

/// `GET /admin/jobs`: jobs the filter keeps, a page at a time by cursor.
pub(super) async fn list(app: &AppState, query: &str) -> Result<Reply, ApiError> {
    let pairs = query_pairs(query);
    let filter = parse_filter(|name| query_value(&pairs, name), "")?;
    let limit = page_limit(&pairs)?;
    let from = match query_value(&pairs, "cursor").filter(|cursor| !cursor.is_empty()) {
        None => None,
        Some(cursor) => {
            let invalid = || ApiError::invalid_request(Some("cursor"), "cursor is not one this server issued");
            Some(JobCursor::parse(&decode_cursor(cursor)?).ok_or_else(invalid)?)
        }
    };
    let page = app.backend.jobs_page(filter, from, limit).outcome().await?;
    let fields = super::super::workflows::job_fields(app, &page.jobs).await?;
    let next = page.next.map(|next| encode_cursor(&next.encode()));
    let pagination = json!({
        "has_more": next.is_some(),
        "next_cursor": next,
        "per_page": limit,
        "scanned": page.scanned,
    });
    let mut body =
        crate::wire::jobs_object_with("items", &page.jobs, |job| fields.get(&job.id).cloned().unwrap_or_default());
    body.raw("pagination", &pagination.to_string());
    Ok(Reply::ok(body.finish()))
}

/// `GET /admin/jobs/{id}`: the job itself (not wrapped), with its timeline.
pub(super) async fn get(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let not_found = || ApiError::not_found("job", id);
    let id = JobId::parse_any_case(id).ok_or_else(not_found)?;
    let job = app.backend.job(id).outcome().await?.ok_or_else(not_found)?;
    let mut extra =
        super::super::workflows::job_fields(app, std::slice::from_ref(&job)).await?.remove(&id).unwrap_or_default();
    extra.push(("timeline", timeline(&job)));
    Ok(Reply::ok(crate::wire::render_job(&job, &extra)))
}

/// The job's state changes that its times record, oldest first: created,
/// scheduled, enqueued, each failed attempt, the current attempt's start,
/// a retry's time, and how it ended.
pub(in crate::__private::http) fn timeline(job: &Job) -> Value {
    let mut entries: Vec<(i64, Value)> = Vec::new();
    let mut push = |at: Option<i64>, event: &str, more: Value| {
        if let Some(at) = at {
            let mut entry = json!({"at": format_timestamp(at), "event": event});
            if let (Value::Object(entry), Value::Object(more)) = (&mut entry, more) {
                entry.extend(more);
            }
            entries.push((at, entry));
        }
    };
    let run = job.run();
    push(Some(job.created_at), "created", json!({}));
    if job.scheduled_at().is_some_and(|at| at > job.created_at) {
        push(job.scheduled_at(), "scheduled_for", json!({}));
    }
    push(job.enqueued_at().filter(|at| *at != job.created_at), "enqueued", json!({}));
    // Entries of one millisecond keep the order pushed: earlier attempts'
    // failures, the current attempt's start, then its failure.
    let failed = |error: &crate::job::ErrorEntry| json!({"attempt": error.attempt, "error_type": error.report.error_type, "message": error.report.message});
    let (earlier, current): (Vec<_>, Vec<_>) = run.errors.iter().partition(|error| error.attempt < job.attempt);
    for error in earlier {
        push(Some(error.occurred_at), "failed", failed(error));
    }
    push(run.started_at, "started", json!({"attempt": job.attempt, "worker_id": run.worker_id}));
    for error in current {
        push(Some(error.occurred_at), "failed", failed(error));
    }
    push(run.retry_at, "retry_at", json!({}));
    // A discarded job carries `completed_at` too (the attempt that ended it).
    push(run.completed_at.filter(|_| job.state == JobState::Completed), "completed", json!({}));
    push(run.cancelled_at, "cancelled", json!({}));
    push(run.discarded_at, "discarded", json!({}));
    entries.sort_by_key(|(at, _)| *at);
    Value::Array(entries.into_iter().map(|(_, entry)| entry).collect())
}

/// `POST /admin/jobs/bulk/{retry|cancel|delete|purge}`
/// `{filter: {...}, confirm: true}` or `{filter: {...}, dry_run: true}`.
pub(super) async fn bulk(app: &AppState, action: &str, body: &[u8]) -> Result<Reply, ApiError> {
    let action = BulkAction::parse(action).ok_or_else(|| {
        ApiError::new("not_found", format!("no bulk action {action}; there are retry, cancel, delete and purge"))
            .detail("resource_type", "route")
            .detail("resource_id", action)
    })?;
    object_body(body)?;
    let value: Value =
        serde_json::from_slice(body).map_err(|_| ApiError::invalid_request(None, "the body must be a JSON object"))?;
    let object = value.as_object().expect("object_body checked it");
    if let Some(key) = object.keys().find(|key| !["filter", "confirm", "dry_run"].contains(&key.as_str())) {
        return Err(ApiError::invalid_request(Some(key), format!("unknown field {key}")));
    }
    let flag = |name: &str| -> Result<bool, ApiError> {
        match object.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(flag)) => Ok(*flag),
            Some(_) => Err(ApiError::invalid_request(Some(name), format!("{name} must be true or false"))),
        }
    };
    let (confirm, dry_run) = (flag("confirm")?, flag("dry_run")?);
    if !confirm && !dry_run {
        return Err(ApiError::invalid_request(
            Some("confirm"),
            "a bulk action needs \"confirm\": true (or \"dry_run\": true to count what it would change)",
        ));
    }
    let filter = match object.get("filter") {
        None | Some(Value::Null) => JobFilter::all(),
        Some(Value::Object(filter)) => {
            if let Some(key) =
                filter.keys().find(|key| !["queue", "state", "type", "since", "until", "q"].contains(&key.as_str()))
            {
                return Err(ApiError::invalid_request(Some(&format!("filter.{key}")), format!("unknown filter {key}")));
            }
            let text = |name: &str| -> Result<Option<String>, ApiError> {
                match filter.get(name) {
                    None | Some(Value::Null) => Ok(None),
                    Some(Value::String(text)) => Ok(Some(text.clone())),
                    // Several states may be given as a list.
                    Some(Value::Array(items)) if name == "state" => items
                        .iter()
                        .map(|item| item.as_str().map(str::to_string))
                        .collect::<Option<Vec<_>>>()
                        .map(|states| Some(states.join(",")))
                        .ok_or_else(|| {
                            ApiError::invalid_request(Some("filter.state"), "filter.state lists state names")
                        }),
                    Some(_) => Err(ApiError::invalid_request(
                        Some(&format!("filter.{name}")),
                        format!("filter.{name} must be a string"),
                    )),
                }
            };
            let named: Vec<(&str, Option<String>)> = ["queue", "state", "type", "since", "until", "q"]
                .into_iter()
                .map(|name| text(name).map(|value| (name, value)))
                .collect::<Result<_, _>>()?;
            parse_filter(
                |name| named.iter().find(|(key, _)| *key == name).and_then(|(_, value)| value.as_deref()),
                "filter.",
            )?
        }
        Some(_) => return Err(ApiError::invalid_request(Some("filter"), "filter must be an object")),
    };
    let report = run_bulk(app.backend.as_ref(), filter, action, dry_run).await?;
    let body = json!({
        "action": action.as_str(),
        "dry_run": dry_run,
        "matched": report.matched,
        "changed": report.changed,
        "skipped": report.skipped,
    });
    Ok(Reply::ok(body.to_string()).with_status(StatusCode::OK))
}
