//! The queue routes (docs/api.md, "Queues"): the listing, one queue's
//! figures with its last minute, and pausing and resuming.

use serde_json::{Value, json};

use super::error::ApiError;
use super::paging::{decode_cursor, encode_cursor, page_limit, query_pairs, query_value};
use super::{AppState, Reply, is_empty_body};
use crate::engine::QueueSummary;
use crate::job::{JobState, is_valid_queue};

/// `GET /queues`: queues by name, paged.
pub(super) async fn list(app: &AppState, query: &str) -> Result<Reply, ApiError> {
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
fn queue_name(name: &str) -> Result<&str, ApiError> {
    if is_valid_queue(name) {
        Ok(name)
    } else {
        Err(ApiError::invalid_request(Some("queue"), "the path does not name a valid queue"))
    }
}

/// `GET /queues/{name}/stats`.
pub(super) async fn stats(app: &AppState, name: &str) -> Result<Reply, ApiError> {
    let name = queue_name(name)?;
    let stats = app
        .backend
        .queue_stats(name.to_string())
        .outcome()
        .await?
        .ok_or_else(|| ApiError::not_found("queue", name.to_string()))?;
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
pub(super) async fn pause(app: &AppState, name: &str, paused: bool, body: &[u8]) -> Result<Reply, ApiError> {
    let name = queue_name(name)?;
    if !is_empty_body(body) {
        return Err(ApiError::invalid_request(None, "this request takes no body"));
    }
    let summary: QueueSummary = app.backend.pause_queue(name.to_string(), paused).outcome().await?;
    Ok(Reply::ok(json!({"queue": summary.name, "paused": summary.paused}).to_string()))
}
