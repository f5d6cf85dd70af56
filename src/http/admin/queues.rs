//! The admin queue routes (docs/api.md, "Admin API", "Backpressure"): every
//! queue with its counts, one queue, pausing and resuming, and a queue's
//! configuration (backpressure).

use serde_json::{Value, json};

use super::super::error::ApiError;
use super::super::extract::object_body;
use super::super::paging::{decode_cursor, encode_cursor, query_pairs};
use super::super::queues::queue_name;
use super::super::{AppState, Reply, is_empty_body};
use super::{Paging, state_counts};
use crate::engine::{Backpressure, QueueSummary};

/// A queue as the admin API shows it, at `now`.
fn render_queue(queue: &QueueSummary, now: i64) -> Value {
    use crate::job::time::format_timestamp;
    json!({
        "name": queue.name,
        "paused": queue.paused,
        "depth": queue.depth(),
        "size": queue.size(),
        "counts": state_counts(|state| queue.count(state)),
        "backpressure": queue.backpressure.as_ref().map(render_backpressure),
        "oldest_available_at": queue.oldest_available_at.map(format_timestamp),
        "oldest_available_age_ms": queue.oldest_available_at.map(|at| (now - at).max(0)),
    })
}

fn render_backpressure(backpressure: &Backpressure) -> Value {
    json!({
        "max_depth": backpressure.max_depth,
        "strategy": backpressure.strategy.as_str(),
        "warning_threshold": backpressure.warning_threshold,
    })
}

/// `GET /admin/queues`: by name, each with its counts.
pub(super) async fn list(app: &AppState, query: &str) -> Result<Reply, ApiError> {
    let paging = Paging::of(&query_pairs(query))?;
    let after = match &paging {
        Paging::Cursor { cursor: Some(cursor), .. } => Some(decode_cursor(cursor)?),
        _ => None,
    };
    let (fetched, has_more) = app.backend.queues_page(after, paging.fetch()).outcome().await?;
    let next = if has_more { fetched.last().map(|queue| encode_cursor(&queue.name)) } else { None };
    let total = app.backend.queue_count().outcome().await? as u64;
    let now = super::super::workers::now_ms(app);
    let items: Vec<Value> = paging.cut(fetched).iter().map(|queue| render_queue(queue, now)).collect();
    let pagination = paging.render(Some(total), has_more, next);
    Ok(Reply::ok(json!({"items": items, "pagination": pagination}).to_string()))
}

/// `GET /admin/queues/{name}`: its counts, configuration and last minute.
pub(super) async fn get(app: &AppState, name: &str) -> Result<Reply, ApiError> {
    let name = queue_name(name)?;
    let stats = super::super::queues::existing_queue_stats(app, name).await?;
    let minutes = app.backend.throughput_minutes(Some(name.to_string())).outcome().await?;
    let mut body = render_queue(&stats.summary, super::super::workers::now_ms(app));
    body["throughput"] = json!({
        "completed_last_minute": stats.completed_last_minute,
        "failed_last_minute": stats.failed_last_minute,
        "per_minute": super::render_minutes(&minutes),
    });
    Ok(Reply::ok(json!({"queue": body}).to_string()))
}

/// `POST /admin/queues/{name}/pause` and `/resume` (no body; idempotent).
pub(super) async fn pause(app: &AppState, name: &str, paused: bool, body: &[u8]) -> Result<Reply, ApiError> {
    let name = queue_name(name)?;
    if !is_empty_body(body) {
        return Err(ApiError::invalid_request(None, "this request takes no body"));
    }
    let summary = app.backend.pause_queue(name.to_string(), paused).outcome().await?;
    let mut body = render_queue(&summary, super::super::workers::now_ms(app));
    body["queue"] = summary.name.clone().into();
    Ok(Reply::ok(body.to_string()))
}

/// `GET /admin/queues/{name}/config`.
pub(super) async fn config(app: &AppState, name: &str) -> Result<Reply, ApiError> {
    let name = queue_name(name)?;
    let backpressure =
        app.backend.queue_stats(name.to_string()).outcome().await?.and_then(|stats| stats.summary.backpressure);
    Ok(Reply::ok(render_config(name, backpressure.as_ref()).to_string()))
}

fn render_config(name: &str, backpressure: Option<&Backpressure>) -> Value {
    json!({"queue": name, "backpressure": backpressure.map(render_backpressure)})
}

/// `PUT /admin/queues/{name}/config` `{backpressure: {...} | null}`.
pub(super) async fn set_config(app: &AppState, name: &str, body: &[u8]) -> Result<Reply, ApiError> {
    let name = queue_name(name)?;
    object_body(body)?;
    let value: Value =
        serde_json::from_slice(body).map_err(|_| ApiError::invalid_request(None, "the body must be a JSON object"))?;
    if let Some(key) = value.as_object().and_then(|object| object.keys().find(|key| *key != "backpressure")) {
        return Err(ApiError::invalid_request(
            Some(key),
            format!("unknown field {key}; a queue's config has backpressure"),
        ));
    }
    let backpressure = match value.get("backpressure") {
        None => {
            return Err(ApiError::invalid_request(Some("backpressure"), "backpressure is required (null removes it)"));
        }
        Some(Value::Null) => None,
        Some(given) => Some(parse_backpressure(given)?),
    };
    let summary = app.backend.configure_queue(name.to_string(), backpressure).outcome().await?;
    Ok(Reply::ok(render_config(name, summary.backpressure.as_ref()).to_string()))
}

/// `{max_depth, strategy?: "reject", warning_threshold?}`.
fn parse_backpressure(value: &Value) -> Result<Backpressure, ApiError> {
    let object = value
        .as_object()
        .ok_or_else(|| ApiError::invalid_request(Some("backpressure"), "backpressure must be an object or null"))?;
    for key in object.keys() {
        if !["max_depth", "strategy", "warning_threshold"].contains(&key.as_str()) {
            let field = format!("backpressure.{key}");
            return Err(ApiError::invalid_request(Some(&field), format!("unknown field {field}")));
        }
    }
    let max_depth = object.get("max_depth").and_then(Value::as_u64).filter(|depth| *depth >= 1).ok_or_else(|| {
        ApiError::invalid_request(
            Some("backpressure.max_depth"),
            format!("max_depth must be an integer from 1 to {}", Backpressure::MAX_DEPTH_MAX),
        )
    })?;
    match object.get("strategy") {
        None | Some(Value::Null) => {}
        Some(Value::String(strategy)) if strategy == "reject" => {}
        Some(_) => {
            return Err(ApiError::invalid_request(
                Some("backpressure.strategy"),
                "strategy must be \"reject\", the one strategy svc has",
            ));
        }
    }
    let mut backpressure = Backpressure::reject_above(max_depth);
    match object.get("warning_threshold") {
        None | Some(Value::Null) => {}
        Some(threshold) => {
            let threshold = threshold.as_f64().ok_or_else(|| {
                ApiError::invalid_request(Some("backpressure.warning_threshold"), "warning_threshold must be a number")
            })?;
            backpressure = backpressure.warning_at(threshold);
        }
    }
    backpressure.check().map_err(|error| {
        let field = error.field.clone();
        ApiError::invalid_request(field.as_deref(), error.message)
    })?;
    Ok(backpressure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backpressure_is_checked_field_by_field() {
        let parsed =
            parse_backpressure(&json!({"max_depth": 5, "strategy": "reject", "warning_threshold": 0.5})).unwrap();
        assert_eq!(parsed, Backpressure::reject_above(5).warning_at(0.5));
        for (bad, field) in [
            (json!({"max_depth": 0}), "backpressure.max_depth"),
            (json!({"max_depth": 1.5}), "backpressure.max_depth"),
            (json!({}), "backpressure.max_depth"),
            (json!({"max_depth": 3, "strategy": "drop_oldest"}), "backpressure.strategy"),
            (json!({"max_depth": 3, "warning_threshold": 1.5}), "backpressure.warning_threshold"),
            (json!({"max_depth": 3, "warning_threshold": 0}), "backpressure.warning_threshold"),
            (json!({"max_depth": 3, "extra": 1}), "backpressure.extra"),
        ] {
            let error = parse_backpressure(&bad).unwrap_err();
            assert_eq!(error.details["field"], field, "{bad}");
        }
    }
}
