//! The dead letter routes: list, retry, delete (docs/api.md, "Dead letter").

use hyper::Method;
use serde_json::json;

use super::auth::Role;
use super::error::ApiError;
use super::extract::object_body;
use super::paging::{decode_cursor, encode_cursor, page_limit, percent_decode, query_pairs, query_value};
use super::{AppState, Reply, is_empty_body};
use crate::job::{JobId, is_valid_queue};
use crate::wire::{job_body, jobs_object_with};

/// The dead letter routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetterRoute {
    List,
    Retry(String),
    Delete(String),
}

impl DeadLetterRoute {
    /// What a path under `/svc/v1/dead-letter` takes (`rest`: the segments after it).
    pub fn choices(rest: &[&str]) -> Vec<(Method, DeadLetterRoute)> {
        match rest {
            [] => vec![(Method::GET, DeadLetterRoute::List)],
            [id] if !id.is_empty() => vec![(Method::DELETE, DeadLetterRoute::Delete(percent_decode(id)))],
            [id, "retry"] if !id.is_empty() => vec![(Method::POST, DeadLetterRoute::Retry(percent_decode(id)))],
            _ => Vec::new(),
        }
    }

    /// The metrics number, method and template (as the router's templates).
    pub fn template(&self) -> (usize, &'static str, &'static str) {
        match self {
            DeadLetterRoute::List => (29, "GET", "/svc/v1/dead-letter"),
            DeadLetterRoute::Retry(_) => (30, "POST", "/svc/v1/dead-letter/{id}/retry"),
            DeadLetterRoute::Delete(_) => (31, "DELETE", "/svc/v1/dead-letter/{id}"),
        }
    }

    /// The dead letter listing is the operator's.
    pub fn allows(&self, role: Role) -> bool {
        role == Role::Admin
    }

    pub async fn handle(self, app: &AppState, query: &str, body: &[u8]) -> Result<Reply, ApiError> {
        match self {
            DeadLetterRoute::List => dead_letter(app, query).await,
            DeadLetterRoute::Retry(id) => dead_letter_retry(app, &id, body).await,
            DeadLetterRoute::Delete(id) => dead_letter_delete(app, &id).await,
        }
    }

    #[cfg(test)]
    pub fn samples() -> Vec<DeadLetterRoute> {
        vec![DeadLetterRoute::List, DeadLetterRoute::Retry("x".into()), DeadLetterRoute::Delete("x".into())]
    }
}

/// A dead letter id: a malformed one cannot be listed, so it is not found.
pub(super) fn dead_letter_id(text: &str) -> Result<JobId, ApiError> {
    JobId::parse_any_case(text).ok_or_else(|| ApiError::not_found("dead_letter_job", text))
}

async fn dead_letter(app: &AppState, query: &str) -> Result<Reply, ApiError> {
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
    let (jobs, next) = app.backend.dead_letter_page(after, limit, queue.map(str::to_string)).outcome().await?;
    let fields = super::workflows::job_fields(app, &jobs).await?;
    let has_more = next.is_some();
    let cursor = match next {
        Some(next) => format!("\"{}\"", encode_cursor(&next.to_string())),
        None => "null".to_string(),
    };
    let mut body = jobs_object_with("jobs", &jobs, |job| fields.get(&job.id).cloned().unwrap_or_default());
    body.raw("cursor", &cursor).bool("has_more", has_more);
    Ok(Reply::ok(body.finish()))
}

async fn dead_letter_retry(app: &AppState, id: &str, body: &[u8]) -> Result<Reply, ApiError> {
    if !is_empty_body(body) {
        object_body(body)?;
    }
    let job = app.backend.dead_letter_retry(dead_letter_id(id)?).outcome().await?;
    Ok(Reply::ok(job_body(&job)))
}

async fn dead_letter_delete(app: &AppState, id: &str) -> Result<Reply, ApiError> {
    let id = dead_letter_id(id)?;
    app.backend.dead_letter_delete(id).outcome().await?;
    Ok(Reply::ok(json!({"deleted": true, "job_id": id.to_string()}).to_string()))
}
