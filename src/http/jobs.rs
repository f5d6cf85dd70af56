//! The job routes: enqueue, batch, read, cancel and activate (docs/api.md, "Jobs").

use hyper::{Method, StatusCode};
use serde_json::Value;

use super::auth::Role;
use super::error::ApiError;
use super::extract::object_body;
use super::extract::{job_id, location};
use super::paging::percent_decode;
use super::{AppState, Reply, is_empty_body};
use crate::engine::Enqueued;
use crate::job::json::{ArrayMember, BodyError, ObjectElement, minify, parse_array_member, parse_object_array_member};
use crate::job::{
    JobDefaults, NewJob, ValidationError, body_error, check_batch_size, parse_enqueue_body, parse_enqueue_object,
};
use crate::limits::{BATCH_JOBS_MAX, ENVELOPE_BYTES_MAX};
use crate::wire::{job_body, push_job, render_job};

/// The job routes (path ids as given, checked by the handlers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobRoute {
    Create,
    Batch,
    Get(String),
    Cancel(String),
    Activate(String),
}

impl JobRoute {
    /// What a path under `/svc/v1/jobs` takes (`rest`: the segments after
    /// it; the router gives a job's worker and progress routes first).
    pub fn choices(rest: &[&str]) -> Vec<(Method, JobRoute)> {
        match rest {
            [] => vec![(Method::POST, JobRoute::Create)],
            ["batch"] => vec![(Method::POST, JobRoute::Batch)],
            [id] if !id.is_empty() => vec![
                (Method::GET, JobRoute::Get(percent_decode(id))),
                (Method::DELETE, JobRoute::Cancel(percent_decode(id))),
            ],
            [id, "activate"] if !id.is_empty() => vec![(Method::POST, JobRoute::Activate(percent_decode(id)))],
            _ => Vec::new(),
        }
    }

    /// The metrics number, method and template (as the router's templates).
    pub fn template(&self) -> (usize, &'static str, &'static str) {
        match self {
            JobRoute::Create => (5, "POST", "/svc/v1/jobs"),
            JobRoute::Batch => (6, "POST", "/svc/v1/jobs/batch"),
            JobRoute::Get(_) => (7, "GET", "/svc/v1/jobs/{id}"),
            JobRoute::Cancel(_) => (8, "DELETE", "/svc/v1/jobs/{id}"),
            JobRoute::Activate(_) => (9, "POST", "/svc/v1/jobs/{id}/activate"),
        }
    }

    /// Reading a job needs no key (ids are unguessable); producers make and
    /// control jobs.
    pub fn allows(&self, role: Role) -> bool {
        match self {
            JobRoute::Get(_) => true,
            JobRoute::Create | JobRoute::Batch | JobRoute::Cancel(_) | JobRoute::Activate(_) => {
                matches!(role, Role::Admin | Role::Producer)
            }
        }
    }

    pub async fn handle(self, app: &AppState, body: &[u8]) -> Result<Reply, ApiError> {
        match self {
            JobRoute::Create => create_job(app, body).await,
            JobRoute::Batch => batch_jobs(app, body).await,
            JobRoute::Get(id) => get_job(app, &id).await,
            JobRoute::Cancel(id) => cancel_job(app, &id).await,
            JobRoute::Activate(id) => activate_job(app, &id, body).await,
        }
    }

    #[cfg(test)]
    pub fn samples() -> Vec<JobRoute> {
        let id = || "x".to_string();
        vec![JobRoute::Create, JobRoute::Batch, JobRoute::Get(id()), JobRoute::Cancel(id()), JobRoute::Activate(id())]
    }
}

async fn create_job(app: &AppState, body: &[u8]) -> Result<Reply, ApiError> {
    let new_job = parse_enqueue_body(body, &app.defaults)?;
    let mut enqueued = app.backend.enqueue(vec![new_job]).outcome().await?;
    let Enqueued { job, deduplicated, pressure } = enqueued.swap_remove(0);
    let reply = if deduplicated {
        // A unique `ignore` policy met a held job: that job answers, once in
        // the job and once beside it.
        let extra = [("deduplicated", Value::Bool(true))];
        let body = format!("{{\"job\":{},\"deduplicated\":true}}", render_job(&job, &extra));
        Reply::ok(body).header(hyper::header::LOCATION, location(&job))
    } else {
        Reply::ok(job_body(&job)).with_status(StatusCode::CREATED).header(hyper::header::LOCATION, location(&job))
    };
    Ok(with_pressure(reply, pressure))
}

/// Says how full the queue is when past its warning threshold.
fn with_pressure(reply: Reply, pressure: Option<f64>) -> Reply {
    match pressure {
        Some(pressure) => reply.header(super::error::X_SVC_QUEUE_PRESSURE, format!("{pressure:.2}")),
        None => reply,
    }
}

async fn batch_jobs(app: &AppState, body: &[u8]) -> Result<Reply, ApiError> {
    let new_jobs = parse_batch(body, &app.defaults)?;
    let enqueued = app.backend.enqueue(new_jobs).outcome().await?;
    let pressure = enqueued.iter().filter_map(|item| item.pressure).reduce(f64::max);
    Ok(with_pressure(Reply::ok(render_batch(&enqueued)).with_status(StatusCode::CREATED), pressure))
}

/// The jobs of a batch enqueue body, each validated; the first invalid item
/// refuses the whole batch, naming its index.
pub fn parse_batch(body: &[u8], defaults: &JobDefaults) -> Result<Vec<NewJob>, ApiError> {
    // A body no larger than an envelope holds no item over the limit: its
    // items are read as objects in the one pass that splits the array.
    // Larger, each item is first kept as its text, to be measured.
    if body.len() <= ENVELOPE_BYTES_MAX {
        let items = batch_items(parse_object_array_member(body, "jobs", BATCH_JOBS_MAX))?;
        let mut new_jobs = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let parsed = match item {
                ObjectElement::Object(object) => {
                    parse_enqueue_object(object, defaults).map_err(|error| error.within(&item_name(index)))
                }
                ObjectElement::Other => Err(not_an_object(index)),
            };
            new_jobs.push(parsed.map_err(|error| ApiError::from(error).detail("index", index))?);
        }
        return Ok(new_jobs);
    }
    let items = batch_items(parse_array_member(body, "jobs", BATCH_JOBS_MAX))?;
    let mut new_jobs = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let parsed = crate::job::json::parse_raw_object(item).ok_or_else(|| not_an_object(index)).and_then(|object| {
            // Compact text is never longer than the text sent, so only a long
            // item needs compacting to be measured.
            if item.get().len() > ENVELOPE_BYTES_MAX {
                let compact = minify(item.get()).len();
                if compact > ENVELOPE_BYTES_MAX {
                    return Err(ValidationError::too_large(item_name(index), ENVELOPE_BYTES_MAX, compact));
                }
            }
            parse_enqueue_object(&object, defaults).map_err(|error| error.within(&item_name(index)))
        });
        new_jobs.push(parsed.map_err(|error| ApiError::from(error).detail("index", index))?);
    }
    Ok(new_jobs)
}

/// A batch body's `jobs` items, or why there are none to enqueue.
fn batch_items<T>(member: Result<ArrayMember<T>, BodyError>) -> Result<Vec<T>, ApiError> {
    let required = || ApiError::invalid_request(Some("jobs"), "jobs is required: a non-empty array of enqueue items");
    // Counted before it is kept: a body of tiny items must not become millions of entries.
    let (items, count) = match member.map_err(|error| ApiError::from(body_error(error)))? {
        ArrayMember::Missing => return Err(required()),
        ArrayMember::NotArray => {
            return Err(ApiError::invalid_request(Some("jobs"), "jobs must be a non-empty array of enqueue items"));
        }
        ArrayMember::TooMany(received) => (Vec::new(), received),
        ArrayMember::Elements(items) => {
            let count = items.len();
            (items, count)
        }
    };
    check_batch_size(count)?;
    Ok(items)
}

/// How errors name the item at `index`.
fn item_name(index: usize) -> String {
    format!("jobs[{index}]")
}

/// The error of an item that is not an object.
fn not_an_object(index: usize) -> ValidationError {
    let name = item_name(index);
    ValidationError::payload(name.clone(), format!("{name} must be an object"))
}

/// The answer to a batch enqueue: every job, in the order given.
pub fn render_batch(enqueued: &[Enqueued]) -> String {
    let mut body = String::with_capacity(64 + 1024 * enqueued.len());
    body.push_str("{\"jobs\":[");
    let deduplicated = [("deduplicated", Value::Bool(true))];
    for (index, item) in enqueued.iter().enumerate() {
        if index > 0 {
            body.push(',');
        }
        push_job(&mut body, &item.job, if item.deduplicated { &deduplicated } else { &[] });
    }
    body.push_str("],\"count\":");
    body.push_str(itoa::Buffer::new().format(enqueued.len()));
    body.push('}');
    body
}

async fn get_job(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let id = job_id(id)?;
    let job = app.backend.job(id).outcome().await?.ok_or_else(|| ApiError::not_found("job", id.to_string()))?;
    let extra = super::workflows::job_fields(app, std::slice::from_ref(&job)).await?.remove(&id).unwrap_or_default();
    Ok(Reply::ok(format!("{{\"job\":{}}}", render_job(&job, &extra))))
}

async fn cancel_job(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let id = job_id(id)?;
    let cancelled = app.backend.cancel(id).outcome().await?;
    let mut extra = super::workflows::job_fields(app, std::slice::from_ref(&cancelled.job))
        .await?
        .remove(&cancelled.job.id)
        .unwrap_or_default();
    extra.push(("previous_state", Value::from(cancelled.previous_state.as_str())));
    Ok(Reply::ok(format!("{{\"job\":{}}}", render_job(&cancelled.job, &extra))))
}

/// Activates a staged (`pending`) job; the body, if any, must be an object.
async fn activate_job(app: &AppState, id: &str, body: &[u8]) -> Result<Reply, ApiError> {
    if !is_empty_body(body) {
        object_body(body)?;
    }
    let job = app.backend.activate(job_id(id)?).outcome().await?;
    Ok(Reply::ok(job_body(&job)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch body read in one pass (no larger than an envelope) and the
    /// same body padded past that size (read item by item) are judged alike.
    #[test]
    fn a_batch_is_judged_alike_whether_read_in_one_pass_or_item_by_item() {
        let defaults = JobDefaults::default();
        let padding = format!(r#""pad":"{}""#, "x".repeat(ENVELOPE_BYTES_MAX));
        let bodies = [
            r#"{"jobs":[{"type":"a","args":[1]},{"type":"b","args":[{"k":"v"}],"meta":{"m":1},"options":{"queue":"q"}}]}"#,
            r#"{"jobs":[{"type":"a","args":[1e400]}]}"#,
            r#"{"jobs":[{"type":"a","args":[]}, 7]}"#,
            r#"{"jobs":[{"type":"a","args":[]}, [1, 2]]}"#,
            r#"{"jobs":[{"type":"a","args":[]}, 1e400]}"#,
            r#"{"jobs":[{"type":"a","args":[]}, "\ud800"]}"#,
            r#"{"jobs":[null]}"#,
            r#"{"jobs":[{"type":"a","args":"no"}]}"#,
            r#"{"jobs":[{"type":"a","args":[],"type":"b"}]}"#,
            r#"{"jobs":[{"\ud800":1}]}"#,
            r#"{"jobs":[]}"#,
            r#"{"jobs":{}}"#,
            r#"{"other":1}"#,
        ];
        let too_many = format!(r#"{{"jobs":[{}{{}}]}}"#, "{},".repeat(BATCH_JOBS_MAX));
        for body in bodies.iter().copied().chain([too_many.as_str()]) {
            let padded = body.replacen('{', &format!("{{{padding},"), 1);
            assert!(body.len() <= ENVELOPE_BYTES_MAX && padded.len() > ENVELOPE_BYTES_MAX);
            let (one_pass, by_item) =
                (parse_batch(body.as_bytes(), &defaults), parse_batch(padded.as_bytes(), &defaults));
            match (one_pass, by_item) {
                (Ok(one_pass), Ok(by_item)) => assert_eq!(one_pass, by_item, "{body}"),
                (Err(one_pass), Err(by_item)) => {
                    assert_eq!(
                        (one_pass.code, &one_pass.message, &one_pass.details),
                        (by_item.code, &by_item.message, &by_item.details),
                        "{body}"
                    );
                }
                (one_pass, by_item) => panic!("{body}: {one_pass:?} against {by_item:?}"),
            }
        }
        // Malformed or too deep: the same refusal (its message names a place in the body).
        let deep = format!(r#"{{"jobs":[{}{}]}}"#, "[".repeat(100), "]".repeat(100));
        for body in [r#"{"jobs":[{"type":"a"},]}"#, r#"{"jobs":[{"type":"a",}]}"#, deep.as_str()] {
            let padded = body.replacen('{', &format!("{{{padding},"), 1);
            let (one_pass, by_item) =
                (parse_batch(body.as_bytes(), &defaults), parse_batch(padded.as_bytes(), &defaults));
            assert_eq!(one_pass.unwrap_err().code, by_item.unwrap_err().code, "{body}");
        }
        let answer = parse_batch(bodies[2].as_bytes(), &defaults).unwrap_err();
        assert_eq!((answer.message.as_str(), &answer.details["index"]), ("jobs[1] must be an object", &Value::from(1)));
        assert_eq!(parse_batch(bodies[0].as_bytes(), &defaults).unwrap().len(), 2);
    }
}
