//! The admin API (docs/api.md, "Admin API"): what an operator's tools and
//! the dashboard read and press, under `/svc/v1/admin`. Every route is the
//! admin role's. Listings page by number (`page`, `per_page`) as far as
//! [`NUMBERED_ITEMS_MAX`] items, and by cursor at any depth.
//!
//! The routes are here with the overview, workers and the dead letter
//! listing; jobs are in `jobs.rs`, queues in `queues.rs`.

pub(super) mod jobs;
mod queues;

use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use super::auth::Role;
use super::error::ApiError;
use super::paging::{decode_cursor, encode_cursor, percent_decode, query_pairs, query_value};
use super::{AppState, Reply, is_empty_body};
use crate::job::{JobState, is_valid_queue};
use crate::limits::{PAGE_SIZE_DEFAULT, PAGE_SIZE_MAX};

/// Deepest item a numbered page reaches; deeper listings take a cursor.
pub const NUMBERED_ITEMS_MAX: usize = 10_000;

/// The admin routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminRoute {
    Stats,
    Queues,
    Queue(String),
    /// Pause (`true`) or resume a queue.
    PauseQueue(String, bool),
    QueueConfig(String),
    SetQueueConfig(String),
    Jobs,
    Job(String),
    /// Retry, cancel or delete by filter.
    Bulk(String),
    Workers,
    /// Quiet (`true`) or terminate a worker.
    SignalWorker(String, bool),
    DeadLetter,
    DeadLetterStats,
    DeadLetterRetry(String),
    DeadLetterDelete(String),
}

impl AdminRoute {
    /// What a path under `/svc/v1/admin` takes (`rest`: the segments after it).
    pub fn choices(rest: &[&str]) -> Vec<(Method, AdminRoute)> {
        let name = |segment: &str| percent_decode(segment);
        match rest {
            ["stats"] => vec![(Method::GET, AdminRoute::Stats)],
            ["queues"] => vec![(Method::GET, AdminRoute::Queues)],
            ["queues", queue] if !queue.is_empty() => vec![(Method::GET, AdminRoute::Queue(name(queue)))],
            ["queues", queue, action @ ("pause" | "resume")] if !queue.is_empty() => {
                vec![(Method::POST, AdminRoute::PauseQueue(name(queue), *action == "pause"))]
            }
            ["queues", queue, "config"] if !queue.is_empty() => vec![
                (Method::GET, AdminRoute::QueueConfig(name(queue))),
                (Method::PUT, AdminRoute::SetQueueConfig(name(queue))),
            ],
            ["jobs"] => vec![(Method::GET, AdminRoute::Jobs)],
            ["jobs", "bulk", action] if !action.is_empty() => vec![(Method::POST, AdminRoute::Bulk(name(action)))],
            ["jobs", id] if !id.is_empty() => vec![(Method::GET, AdminRoute::Job(name(id)))],
            ["workers"] => vec![(Method::GET, AdminRoute::Workers)],
            ["workers", id, signal @ ("quiet" | "terminate")] if !id.is_empty() => {
                vec![(Method::POST, AdminRoute::SignalWorker(name(id), *signal == "quiet"))]
            }
            ["dead-letter"] => vec![(Method::GET, AdminRoute::DeadLetter)],
            ["dead-letter", "stats"] => vec![(Method::GET, AdminRoute::DeadLetterStats)],
            ["dead-letter", id] if !id.is_empty() => vec![(Method::DELETE, AdminRoute::DeadLetterDelete(name(id)))],
            ["dead-letter", id, "retry"] if !id.is_empty() => {
                vec![(Method::POST, AdminRoute::DeadLetterRetry(name(id)))]
            }
            _ => Vec::new(),
        }
    }

    /// The metrics number, method and template (as the router's templates).
    pub fn template(&self) -> (usize, &'static str, &'static str) {
        use AdminRoute::*;
        match self {
            Stats => (52, "GET", "/svc/v1/admin/stats"),
            Queues => (53, "GET", "/svc/v1/admin/queues"),
            Queue(_) => (54, "GET", "/svc/v1/admin/queues/{name}"),
            PauseQueue(_, true) => (55, "POST", "/svc/v1/admin/queues/{name}/pause"),
            PauseQueue(_, false) => (56, "POST", "/svc/v1/admin/queues/{name}/resume"),
            QueueConfig(_) => (57, "GET", "/svc/v1/admin/queues/{name}/config"),
            SetQueueConfig(_) => (58, "PUT", "/svc/v1/admin/queues/{name}/config"),
            Jobs => (59, "GET", "/svc/v1/admin/jobs"),
            Job(_) => (60, "GET", "/svc/v1/admin/jobs/{id}"),
            Bulk(_) => (61, "POST", "/svc/v1/admin/jobs/bulk/{action}"),
            Workers => (62, "GET", "/svc/v1/admin/workers"),
            SignalWorker(_, true) => (63, "POST", "/svc/v1/admin/workers/{id}/quiet"),
            SignalWorker(_, false) => (64, "POST", "/svc/v1/admin/workers/{id}/terminate"),
            DeadLetter => (65, "GET", "/svc/v1/admin/dead-letter"),
            DeadLetterStats => (66, "GET", "/svc/v1/admin/dead-letter/stats"),
            DeadLetterRetry(_) => (67, "POST", "/svc/v1/admin/dead-letter/{id}/retry"),
            DeadLetterDelete(_) => (68, "DELETE", "/svc/v1/admin/dead-letter/{id}"),
        }
    }

    /// The admin API is the operator's.
    pub fn allows(&self, role: Role) -> bool {
        role == Role::Admin
    }

    pub async fn handle(self, app: &AppState, query: &str, body: &[u8]) -> Result<Reply, ApiError> {
        use AdminRoute::*;
        match self {
            Stats => stats(app).await,
            Queues => queues::list(app, query).await,
            Queue(name) => queues::get(app, &name).await,
            PauseQueue(name, paused) => queues::pause(app, &name, paused, body).await,
            QueueConfig(name) => queues::config(app, &name).await,
            SetQueueConfig(name) => queues::set_config(app, &name, body).await,
            Jobs => jobs::list(app, query).await,
            Job(id) => jobs::get(app, &id).await,
            Bulk(action) => jobs::bulk(app, &action, body).await,
            Workers => workers(app, query).await,
            SignalWorker(id, quiet) => signal_worker(app, &id, quiet, body).await,
            DeadLetter => dead_letter(app, query).await,
            DeadLetterStats => dead_letter_stats(app, query).await,
            DeadLetterRetry(id) => dead_letter_retry(app, &id, body).await,
            DeadLetterDelete(id) => dead_letter_delete(app, &id).await,
        }
    }

    #[cfg(test)]
    pub fn samples() -> Vec<AdminRoute> {
        use AdminRoute::*;
        let x = || "x".to_string();
        vec![
            Stats,
            Queues,
            Queue(x()),
            PauseQueue(x(), true),
            PauseQueue(x(), false),
            QueueConfig(x()),
            SetQueueConfig(x()),
            Jobs,
            Job(x()),
            Bulk(x()),
            Workers,
            SignalWorker(x(), true),
            SignalWorker(x(), false),
            DeadLetter,
            DeadLetterStats,
            DeadLetterRetry(x()),
            DeadLetterDelete(x()),
        ]
    }
}

/// How a listing request pages: by number (the default), or by cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Paging {
    /// Page `page` (from 1) of `per_page` items.
    Numbered { page: usize, per_page: usize },
    /// Up to `limit` items after the cursor (none: from the start).
    Cursor { cursor: Option<String>, limit: usize },
}

impl Paging {
    /// `cursor` (with `limit` or `per_page`) pages by cursor; otherwise
    /// `page` and `per_page` (or `limit`), each 1 by default and at most 100 a page.
    fn of(pairs: &[(String, String)]) -> Result<Paging, ApiError> {
        // As every listing's `limit`: below 1 is refused, above the most a
        // page holds counts as that most.
        let number = |key: &str, default: usize| -> Result<usize, ApiError> {
            match query_value(pairs, key) {
                None | Some("") => Ok(default),
                Some(text) => text
                    .parse::<u64>()
                    .ok()
                    .filter(|value| *value >= 1)
                    .map(|value| usize::try_from(value).unwrap_or(usize::MAX))
                    .ok_or_else(|| ApiError::invalid_request(Some(key), format!("{key} must be an integer from 1 on"))),
            }
        };
        let size_key = if query_value(pairs, "per_page").is_some() { "per_page" } else { "limit" };
        let size = number(size_key, PAGE_SIZE_DEFAULT)?.min(PAGE_SIZE_MAX);
        if let Some(cursor) = query_value(pairs, "cursor") {
            let cursor = (!cursor.is_empty()).then(|| cursor.to_string());
            return Ok(Paging::Cursor { cursor, limit: size });
        }
        let page = number("page", 1)?;
        if page.saturating_mul(size) > NUMBERED_ITEMS_MAX {
            return Err(ApiError::invalid_request(
                Some("page"),
                format!("numbered pages reach the first {NUMBERED_ITEMS_MAX} items; page deeper with cursor"),
            ));
        }
        Ok(Paging::Numbered { page, per_page: size })
    }

    /// How many items to fetch from the start (numbered) or the cursor.
    fn fetch(&self) -> usize {
        match self {
            Paging::Numbered { page, per_page } => page * per_page,
            Paging::Cursor { limit, .. } => *limit,
        }
    }

    /// The items of this page out of what was fetched.
    fn cut<T>(&self, mut fetched: Vec<T>) -> Vec<T> {
        match self {
            Paging::Numbered { page, per_page } => {
                fetched.drain(((page - 1) * per_page).min(fetched.len())..).collect()
            }
            Paging::Cursor { .. } => fetched,
        }
    }

    /// The `pagination` object: `total` (when known), the page and its
    /// size, whether more follow, and the cursor of the next page.
    fn render(&self, total: Option<u64>, has_more: bool, next_cursor: Option<String>) -> Value {
        let mut pagination = json!({"has_more": has_more, "next_cursor": next_cursor});
        if let Some(total) = total {
            pagination["total"] = total.into();
        }
        match self {
            Paging::Numbered { page, per_page } => {
                pagination["page"] = (*page).into();
                pagination["per_page"] = (*per_page).into();
            }
            Paging::Cursor { limit, .. } => pagination["per_page"] = (*limit).into(),
        }
        pagination
    }
}

/// The `counts` object: jobs per state.
fn state_counts(count: impl Fn(JobState) -> u64) -> Value {
    let mut counts = serde_json::Map::new();
    for state in JobState::ALL {
        counts.insert(state.as_str().to_string(), count(state).into());
    }
    Value::Object(counts)
}

/// An optional `queue` query filter, checked.
fn queue_filter(pairs: &[(String, String)]) -> Result<Option<String>, ApiError> {
    match query_value(pairs, "queue").filter(|queue| !queue.is_empty()) {
        Some(queue) if is_valid_queue(queue) => Ok(Some(queue.to_string())),
        Some(_) => Err(ApiError::invalid_request(Some("queue"), "queue is not a valid queue name")),
        None => Ok(None),
    }
}

/// `GET /admin/stats`: totals across queues, workers and the dead letter listing.
async fn stats(app: &AppState) -> Result<Reply, ApiError> {
    let overview = app.backend.overview().outcome().await?;
    let minutes = app.backend.throughput_minutes(None).outcome().await?;
    let mut workers_by_state = serde_json::Map::new();
    for (state, count) in &overview.workers_by_state {
        workers_by_state.insert(state.as_str().to_string(), (*count).into());
    }
    let body = json!({
        "queues": overview.queues,
        "paused_queues": overview.paused_queues,
        "workers": overview.workers,
        "workers_by_state": workers_by_state,
        "jobs": state_counts(|state| overview.count(state)),
        "dead_letter": overview.dead_letter,
        "throughput": {
            "processed_per_minute": overview.completed_last_minute,
            "failed_per_minute": overview.failed_last_minute,
            "per_minute": render_minutes(&minutes),
        },
    });
    Ok(Reply::ok(body.to_string()))
}

/// The minutes of the last 24 hours with counts: `[{minute, completed, failed}]`.
fn render_minutes(minutes: &[crate::engine::MinuteCount]) -> Value {
    use crate::job::time::format_timestamp;
    minutes
        .iter()
        .map(|counts| json!({"minute": format_timestamp(counts.minute), "completed": counts.completed, "failed": counts.failed}))
        .collect()
}

/// `GET /admin/workers`: by worker id, with totals by state.
async fn workers(app: &AppState, query: &str) -> Result<Reply, ApiError> {
    let pairs = query_pairs(query);
    let paging = Paging::of(&pairs)?;
    let after = match &paging {
        Paging::Cursor { cursor: Some(cursor), .. } => Some(decode_cursor(cursor)?),
        _ => None,
    };
    let (fetched, has_more) = app.backend.workers_page(after, paging.fetch(), None).outcome().await?;
    let next = if has_more { fetched.last().map(|entry| encode_cursor(&entry.worker_id)) } else { None };
    let (total, by_state) = app.backend.worker_counts().outcome().await?;
    let now = super::workers::now_ms(app);
    let items: Vec<Value> = paging.cut(fetched).iter().map(|entry| super::workers::render_worker(entry, now)).collect();
    let mut summary = json!({"total": total, "running": 0, "quiet": 0, "terminate": 0});
    for (state, count) in &by_state {
        summary[state.as_str()] = (*count).into();
    }
    let pagination = paging.render(Some(total as u64), has_more, next);
    Ok(Reply::ok(json!({"items": items, "summary": summary, "pagination": pagination}).to_string()))
}

/// `POST /admin/workers/{id}/quiet` and `/terminate` (no body).
async fn signal_worker(app: &AppState, id: &str, quiet: bool, body: &[u8]) -> Result<Reply, ApiError> {
    use crate::engine::WorkerSignal;
    if !is_empty_body(body) {
        return Err(ApiError::invalid_request(None, "this request takes no body"));
    }
    let signal = if quiet { WorkerSignal::Quiet } else { WorkerSignal::Terminate };
    let entry = app.backend.signal_worker(id.to_string(), signal).outcome().await?;
    Ok(Reply::ok(json!({"worker": super::workers::render_worker(&entry, super::workers::now_ms(app))}).to_string()))
}

/// `GET /admin/dead-letter`: newest first, optionally of one queue.
async fn dead_letter(app: &AppState, query: &str) -> Result<Reply, ApiError> {
    use crate::engine::DeadLetterCursor;
    let pairs = query_pairs(query);
    let paging = Paging::of(&pairs)?;
    let queue = queue_filter(&pairs)?;
    let after = match &paging {
        Paging::Cursor { cursor: Some(cursor), .. } => {
            let invalid = || ApiError::invalid_request(Some("cursor"), "cursor is not one this server issued");
            Some(DeadLetterCursor::parse(&decode_cursor(cursor)?).ok_or_else(invalid)?)
        }
        _ => None,
    };
    let (fetched, next) = app.backend.dead_letter_page(after, paging.fetch(), queue.clone()).outcome().await?;
    let total = app.backend.dead_letter_count(queue).outcome().await?;
    let jobs = paging.cut(fetched);
    let fields = super::workflows::job_fields(app, &jobs).await?;
    let has_more = next.is_some();
    let next = next.map(|next| encode_cursor(&next.to_string()));
    let mut body =
        crate::wire::jobs_object_with("items", &jobs, |job| fields.get(&job.id).cloned().unwrap_or_default());
    body.raw("pagination", &paging.render(Some(total), has_more, next).to_string());
    Ok(Reply::ok(body.finish()))
}

/// `GET /admin/dead-letter/stats`: how many jobs the listing holds.
async fn dead_letter_stats(app: &AppState, query: &str) -> Result<Reply, ApiError> {
    let queue = queue_filter(&query_pairs(query))?;
    let total = app.backend.dead_letter_count(queue.clone()).outcome().await?;
    Ok(Reply::ok(json!({"total": total, "queue": queue}).to_string()))
}

/// `POST /admin/dead-letter/{id}/retry`: as `POST /dead-letter/{id}/retry`.
async fn dead_letter_retry(app: &AppState, id: &str, body: &[u8]) -> Result<Reply, ApiError> {
    if !is_empty_body(body) {
        super::extract::object_body(body)?;
    }
    let job = app.backend.dead_letter_retry(super::dead_letter::dead_letter_id(id)?).outcome().await?;
    Ok(Reply::ok(crate::wire::job_body(&job)))
}

/// `DELETE /admin/dead-letter/{id}`: 204 with no body.
async fn dead_letter_delete(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let id = super::dead_letter::dead_letter_id(id)?;
    app.backend.dead_letter_delete(id).outcome().await?;
    Ok(Reply::ok(String::new()).with_status(StatusCode::NO_CONTENT))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(query: &str) -> Vec<(String, String)> {
        query_pairs(query)
    }

    #[test]
    fn paging_is_numbered_unless_a_cursor_is_given() {
        assert_eq!(Paging::of(&pairs("")).unwrap(), Paging::Numbered { page: 1, per_page: PAGE_SIZE_DEFAULT });
        assert_eq!(Paging::of(&pairs("page=3&per_page=10")).unwrap(), Paging::Numbered { page: 3, per_page: 10 });
        assert_eq!(
            Paging::of(&pairs("cursor=abc&limit=5")).unwrap(),
            Paging::Cursor { cursor: Some("abc".into()), limit: 5 }
        );
        assert_eq!(Paging::of(&pairs("per_page=500")).unwrap(), Paging::Numbered { page: 1, per_page: PAGE_SIZE_MAX });
        for bad in ["page=0", "per_page=0", "page=x", "page=101&per_page=100", "page=99999999999999999999"] {
            assert_eq!(Paging::of(&pairs(bad)).unwrap_err().code, "invalid_request", "{bad}");
        }
    }

    #[test]
    fn a_numbered_page_cuts_its_items_from_the_start() {
        let paging = Paging::Numbered { page: 2, per_page: 3 };
        assert_eq!(paging.fetch(), 6);
        assert_eq!(paging.cut((1..=6).collect()), vec![4, 5, 6]);
        assert_eq!(paging.cut(vec![1, 2]), Vec::<i32>::new());
    }
}
