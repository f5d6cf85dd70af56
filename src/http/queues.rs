//! The queue routes (docs/api.md, "Queues"): the listing, one queue's
//! figures with its last minute, and pausing and resuming.

use hyper::Method;
use serde_json::{Value, json};

use super::auth::Role;
use super::error::ApiError;
use super::paging::{decode_cursor, encode_cursor, page_limit, percent_decode, query_pairs, query_value};
use super::{AppState, Reply, is_empty_body};
use crate::engine::QueueSummary;
use crate::job::{JobState, is_valid_queue};

/// The queue routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueRoute {
    List,
    Stats(String),
    /// Pause (`true`) or resume a queue.
    Pause(String, bool),
}

impl QueueRoute {
    /// What a path under `/svc/v1/queues` takes (`rest`: the segments after it).
    pub fn choices(rest: &[&str]) -> Vec<(Method, QueueRoute)> {
        match rest {
            [] => vec![(Method::GET, QueueRoute::List)],
            [name, "stats"] if !name.is_empty() => vec![(Method::GET, QueueRoute::Stats(percent_decode(name)))],
            [name, action @ ("pause" | "resume")] if !name.is_empty() => {
                vec![(Method::POST, QueueRoute::Pause(percent_decode(name), *action == "pause"))]
            }
            _ => Vec::new(),
        }
    }

    /// The metrics number, method and template (as the router's templates).
    pub fn template(&self) -> (usize, &'static str, &'static str) {
        match self {
            QueueRoute::List => (18, "GET", "/svc/v1/queues"),
            QueueRoute::Stats(_) => (19, "GET", "/svc/v1/queues/{name}/stats"),
            QueueRoute::Pause(_, true) => (20, "POST", "/svc/v1/queues/{name}/pause"),
            QueueRoute::Pause(_, false) => (21, "POST", "/svc/v1/queues/{name}/resume"),
        }
    }

    /// Queues are the operator's.
    pub fn allows(&self, role: Role) -> bool {
        role == Role::Admin
    }

    pub async fn handle(self, app: &AppState, query: &str, body: &[u8]) -> Result<Reply, ApiError> {
        match self {
            QueueRoute::List => list(app, query).await,
            QueueRoute::Stats(name) => stats(app, &name).await,
            QueueRoute::Pause(name, paused) => pause(app, &name, paused, body).await,
        }
    }

    #[cfg(test)]
    pub fn samples() -> Vec<QueueRoute> {
        let name = || "x".to_string();
        vec![
            QueueRoute::List,
            QueueRoute::Stats(name()),
            QueueRoute::Pause(name(), true),
            QueueRoute::Pause(name(), false),
        ]
    }
}

/// `GET /queues`: queues by name, paged.
async fn list(app: &AppState, query: &str) -> Result<Reply, ApiError> {
    let pairs = query_pairs(query);
    let limit = page_limit(&pairs)?;
    let after = query_value(&pairs, "cursor").filter(|cursor| !cursor.is_empty()).map(decode_cursor).transpose()?;
    let (page, has_more) = app.backend.queues_page(after, limit).outcome().await?;
    let cursor = if has_more { page.last().map(|queue| Value::from(encode_cursor(&queue.name))) } else { None };
    let queues: Vec<Value> =
        page.iter().map(|queue| json!({"name": queue.name, "size": queue.size(), "paused": queue.paused})).collect();
    Ok(Reply::ok(json!({"queues": queues, "cursor": cursor, "has_more": has_more}).to_string()))
}

/// A queue name from the path: 400 when it cannot be one.
pub(super) fn queue_name(name: &str) -> Result<&str, ApiError> {
    if is_valid_queue(name) {
        Ok(name)
    } else {
        Err(ApiError::invalid_request(Some("queue"), "the path does not name a valid queue"))
    }
}

/// A queue's figures and last minute: 404 for a queue that does not exist.
pub(super) async fn existing_queue_stats(app: &AppState, name: &str) -> Result<crate::engine::QueueStats, ApiError> {
    app.backend.queue_stats(name.to_string()).outcome().await?.ok_or_else(|| ApiError::not_found("queue", name))
}

/// `GET /queues/{name}/stats`.
async fn stats(app: &AppState, name: &str) -> Result<Reply, ApiError> {
    let name = queue_name(name)?;
    let stats = existing_queue_stats(app, name).await?;
    let summary = &stats.summary;
    let mut states = serde_json::Map::new();
    for state in JobState::ALL {
        states.insert(state.as_str().to_string(), summary.count(state).into());
    }
    let body = json!({
        "queue": summary.name,
        "size": summary.size(),
        "paused": summary.paused,
        "states": states,
        "throughput": {
            "completed_last_minute": stats.completed_last_minute,
            "failed_last_minute": stats.failed_last_minute,
        },
    });
    Ok(Reply::ok(body.to_string()))
}

/// `POST /queues/{name}/pause` and `/resume` (no body; idempotent).
async fn pause(app: &AppState, name: &str, paused: bool, body: &[u8]) -> Result<Reply, ApiError> {
    let name = queue_name(name)?;
    if !is_empty_body(body) {
        return Err(ApiError::invalid_request(None, "this request takes no body"));
    }
    let summary: QueueSummary = app.backend.pause_queue(name.to_string(), paused).outcome().await?;
    Ok(Reply::ok(json!({"queue": summary.name, "paused": summary.paused}).to_string()))
}
