//! The one table from errors to HTTP status, stable code and retryability,
//! and the error body `{error: {code, message, retryable, details, request_id, hint, docs_url}}`.

use hyper::StatusCode;
use hyper::header::{HeaderName, RETRY_AFTER};
use serde_json::{Map, Value};

use crate::engine::{EngineError, Unavailable};
use crate::job::{ValidationError, ValidationKind};

/// (code, status, retryable, meaning, hint)
/// A refused enqueue's queue depth and bound (`queue_full`).
pub const X_SVC_QUEUE_DEPTH: HeaderName = HeaderName::from_static("x-svc-queue-depth");
pub const X_SVC_QUEUE_BOUND: HeaderName = HeaderName::from_static("x-svc-queue-bound");
/// How full the queue of an accepted enqueue is, past its warning threshold.
pub const X_SVC_QUEUE_PRESSURE: HeaderName = HeaderName::from_static("x-svc-queue-pressure");

pub const ERROR_TABLE: [(&str, u16, bool, &str, &str); 16] = [
    (
        "invalid_request",
        400,
        false,
        "malformed JSON, missing required field, or an invalid non-envelope request",
        "Check the request body against the API reference; details.field names the problem.",
    ),
    (
        "invalid_payload",
        400,
        false,
        "the job envelope fails validation",
        "Fix the field named in details.field; the job was not stored.",
    ),
    (
        "schema_validation",
        400,
        false,
        "args do not conform to the registered schema",
        "Make args match the schema named in details.schema.",
    ),
    ("unauthorized", 401, false, "missing or invalid API key", "Send Authorization: Bearer <key>."),
    ("forbidden", 403, false, "the key's role lacks the right", "Use a key whose role allows this operation."),
    (
        "not_found",
        404,
        false,
        "job or resource does not exist",
        "Check the id; finished jobs are removed after their retention period.",
    ),
    ("method_not_allowed", 405, false, "known route, wrong method", "Use one of the methods in the Allow header."),
    (
        "duplicate",
        409,
        false,
        "unique constraint violated",
        "The id or unique key is taken; details name the existing job.",
    ),
    (
        "conflict",
        409,
        false,
        "invalid state transition",
        "Read the job to see its current state before retrying the operation.",
    ),
    (
        "envelope_too_large",
        413,
        false,
        "the request or job exceeds a size limit",
        "Send less data; details give the limit and the size received.",
    ),
    (
        "unsupported",
        422,
        false,
        "unsupported version or feature",
        "See /svc/manifest for the supported version and features.",
    ),
    ("rate_limited", 429, true, "request rate limit exceeded", "Wait for Retry-After seconds, then retry."),
    ("queue_paused", 503, true, "target queue is paused", "Retry after the queue is resumed."),
    (
        "queue_full",
        429,
        true,
        "the queue's backpressure bound is reached",
        "Retry after Retry-After seconds, once workers have drained the queue; details give its depth and bound.",
    ),
    (
        "backend_error",
        503,
        true,
        "storage failure or overload",
        "Retry after Retry-After seconds; details.reason tells overload from storage failure.",
    ),
    ("timeout", 504, true, "the operation timed out", "Retry; the outcome may be unknown, so read the resource first."),
];

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: &'static str,
    pub message: String,
    pub details: Map<String, Value>,
    /// Extra response headers (`Retry-After`, `Allow`).
    pub headers: Vec<(HeaderName, String)>,
}

impl ApiError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        debug_assert!(ERROR_TABLE.iter().any(|row| row.0 == code), "error code {code} is in the table");
        let mut error = Self { code, message: message.into(), details: Map::new(), headers: Vec::new() };
        if matches!(code, "backend_error" | "rate_limited") {
            error.headers.push((RETRY_AFTER, "1".into()));
        } else if code == "queue_paused" {
            error.headers.push((RETRY_AFTER, "5".into()));
        }
        error
    }

    pub fn detail(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_string(), value.into());
        self
    }

    pub fn invalid_request(field: Option<&str>, message: impl Into<String>) -> Self {
        let error = Self::new("invalid_request", message);
        match field {
            Some(field) => error.detail("field", field),
            None => error,
        }
    }

    pub fn not_found(resource_type: &str, resource_id: impl Into<String>) -> Self {
        let resource_id = resource_id.into();
        Self::new("not_found", format!("{resource_type} {resource_id} not found"))
            .detail("resource_type", resource_type)
            .detail("resource_id", resource_id)
    }

    pub fn status(&self) -> StatusCode {
        let row = ERROR_TABLE.iter().find(|row| row.0 == self.code);
        StatusCode::from_u16(row.map_or(500, |row| row.1)).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The error body.
    pub fn body(&self, request_id: &str) -> Value {
        let row = ERROR_TABLE.iter().find(|row| row.0 == self.code);
        serde_json::json!({"error": {
            "code": self.code,
            "message": self.message,
            "retryable": row.is_some_and(|row| row.2),
            "details": self.details,
            "request_id": request_id,
            "hint": row.map_or("", |row| row.4),
            "docs_url": format!("/svc/v1/errors#{}", self.code),
        }})
    }
}

impl From<ValidationError> for ApiError {
    fn from(error: ValidationError) -> Self {
        let code = match error.kind {
            ValidationKind::Request => "invalid_request",
            ValidationKind::Payload => "invalid_payload",
            ValidationKind::TooLarge => "envelope_too_large",
            ValidationKind::Unsupported => "unsupported",
            ValidationKind::Schema => "schema_validation",
        };
        let mut api = ApiError::new(code, error.message);
        if let Some(field) = error.field {
            api = api.detail("field", field);
        }
        if let Some(reason) = error.reason {
            api = api.detail("reason", reason);
        }
        for (key, value) in error.details {
            api = api.detail(key, value);
        }
        api
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        let message = error.to_string();
        match error {
            EngineError::NotFound { id } => ApiError::not_found("job", id.to_string()),
            EngineError::NotInDeadLetter { id } => ApiError::not_found("dead_letter_job", id.to_string()),
            EngineError::WorkerNotFound { worker_id } => ApiError::not_found("worker", worker_id),
            EngineError::WorkerConflict { worker_id, current_state } => ApiError::new("conflict", message)
                .detail("worker_id", worker_id)
                .detail("current_state", current_state.as_str()),
            EngineError::CronNotFound { name } => ApiError::not_found("cron", name),
            EngineError::CronChanged { name } => {
                ApiError::new("conflict", message).detail("name", name).detail("reason", "concurrent_change")
            }
            EngineError::CronLimit { max_entries } => {
                ApiError::new("conflict", message).detail("reason", "limit").detail("limit", max_entries)
            }
            EngineError::SchemaNotFound { uri } => ApiError::not_found("schema", uri),
            EngineError::WebhookNotFound { id } => ApiError::not_found("webhook", format!("sub_{id}")),
            EngineError::WebhookLimit { max_webhooks } => {
                ApiError::new("conflict", message).detail("reason", "limit").detail("limit", max_webhooks)
            }
            EngineError::RotationInProgress { id } => ApiError::new("conflict", message)
                .detail("reason", "rotation_in_progress")
                .detail("subscription_id", format!("sub_{id}")),
            EngineError::NoRotation { id } => ApiError::new("conflict", message)
                .detail("reason", "no_rotation")
                .detail("subscription_id", format!("sub_{id}")),
            EngineError::SchemaExists { uri } => ApiError::new("duplicate", message).detail("uri", uri),
            EngineError::SchemaLimit { max_schemas } => {
                ApiError::new("conflict", message).detail("reason", "limit").detail("limit", max_schemas)
            }
            EngineError::Conflict { id, current_state, reason } => ApiError::new("conflict", message)
                .detail("job_id", id.to_string())
                .detail("current_state", current_state.as_str())
                .detail("reason", reason.as_str()),
            EngineError::Duplicate { id, index } => {
                let error = ApiError::new("duplicate", message).detail("existing_job_id", id.to_string());
                match index {
                    Some(index) => error.detail("index", index),
                    None => error,
                }
            }
            EngineError::UniqueConflict { existing, existing_state, key, index } => {
                let error = ApiError::new("duplicate", message)
                    .detail("existing_job_id", existing.to_string())
                    .detail("existing_job_state", existing_state.as_str())
                    .detail("unique_key", key.to_string())
                    .detail("reason", "unique_conflict");
                match index {
                    Some(index) => error.detail("index", index),
                    None => error,
                }
            }
            EngineError::Invalid { error, index } => {
                let api = ApiError::from(error);
                match index {
                    Some(index) => api.detail("index", index),
                    None => api,
                }
            }
            EngineError::QueuePaused { queue, index } => {
                let error = ApiError::new("queue_paused", message).detail("queue", queue);
                match index {
                    Some(index) => error.detail("index", index),
                    None => error,
                }
            }
            EngineError::QueueFull { queue, depth, bound, index } => {
                let mut error = ApiError::new("queue_full", message)
                    .detail("queue", queue)
                    .detail("depth", depth)
                    .detail("bound", bound);
                if let Some(index) = index {
                    error = error.detail("index", index);
                }
                error.headers.push((X_SVC_QUEUE_DEPTH, depth.to_string()));
                error.headers.push((X_SVC_QUEUE_BOUND, bound.to_string()));
                error.headers.push((RETRY_AFTER, "1".into()));
                error
            }
            EngineError::WorkflowNotFound { id } => ApiError::not_found("workflow", id.to_string()),
            EngineError::WorkflowConflict { id, current_state } => ApiError::new("conflict", message)
                .detail("workflow_id", id.to_string())
                .detail("current_state", current_state.as_str()),
            EngineError::Unavailable { reason } => {
                let text = match reason {
                    Unavailable::Overloaded => "the server is overloaded; retry shortly",
                    Unavailable::Capacity => "the server holds as many live jobs, or bytes of them, as it may",
                    Unavailable::StorageFailed => "storage failed; the server accepts no writes until it restarts",
                    Unavailable::DiskFull => "the disk is full; new work is refused until space is freed",
                    Unavailable::EngineStopped | Unavailable::SnapshotFailed => "the engine is not available",
                    Unavailable::Database => "the database did not answer or failed; nothing was changed, retry",
                };
                ApiError::new("backend_error", text).detail("reason", reason.as_str())
            }
        }
    }
}
