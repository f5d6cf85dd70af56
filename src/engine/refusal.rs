//! How a refused or failed call reads, whatever front door it came
//! through: the stable error code, its HTTP status and retryability, a
//! message and structured details. The HTTP API answers exactly this in its
//! error body (docs/api.md, "Errors"); an embedding program gets it from
//! [`crate::SvcError::refusal`], so a client can treat both alike.

use serde_json::{Map, Value};

use super::{ConflictReason, EngineError, Unavailable};
use crate::job::{ValidationError, ValidationKind};

/// Every error code: (code, HTTP status, retryable, meaning, hint).
pub const ERROR_CODES: [(&str, u16, bool, &str, &str); 16] = [
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

/// A call refused or failed, as the interface's error body states it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Refusal {
    /// The stable code (`not_found`, `conflict`, `queue_full`, ...): one of
    /// [`ERROR_CODES`].
    pub code: &'static str,
    /// What happened, for a person.
    pub message: String,
    /// Structured details (`field`, `reason`, `job_id`, `current_state`, ...).
    pub details: Map<String, Value>,
}

impl Refusal {
    /// A refusal with this code (one of [`ERROR_CODES`]) and message, no details.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        debug_assert!(ERROR_CODES.iter().any(|row| row.0 == code), "error code {code} is in the table");
        Refusal { code, message: message.into(), details: Map::new() }
    }

    /// The same with one more detail.
    pub fn detail(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_string(), value.into());
        self
    }

    /// `not_found` of one resource, named by its type and id.
    pub fn not_found(resource_type: &str, resource_id: impl Into<String>) -> Self {
        let resource_id = resource_id.into();
        Self::new("not_found", format!("{resource_type} {resource_id} not found"))
            .detail("resource_type", resource_type)
            .detail("resource_id", resource_id)
    }

    fn row(&self) -> Option<&'static (&'static str, u16, bool, &'static str, &'static str)> {
        ERROR_CODES.iter().find(|row| row.0 == self.code)
    }

    /// The HTTP status the API answers it with.
    pub fn status(&self) -> u16 {
        self.row().map_or(500, |row| row.1)
    }

    /// Whether the same call may succeed when tried again later.
    pub fn retryable(&self) -> bool {
        self.row().is_some_and(|row| row.2)
    }

    /// What to do about it.
    pub fn hint(&self) -> &'static str {
        self.row().map_or("", |row| row.4)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl From<ValidationError> for Refusal {
    fn from(error: ValidationError) -> Self {
        let code = match error.kind {
            ValidationKind::Request => "invalid_request",
            ValidationKind::Payload => "invalid_payload",
            ValidationKind::TooLarge => "envelope_too_large",
            ValidationKind::Unsupported => "unsupported",
            ValidationKind::Schema => "schema_validation",
        };
        let mut refusal = Refusal::new(code, error.message);
        if let Some(field) = error.field {
            refusal = refusal.detail("field", field);
        }
        if let Some(reason) = error.reason {
            refusal = refusal.detail("reason", reason);
        }
        for (key, value) in error.details {
            refusal = refusal.detail(key, value);
        }
        refusal
    }
}

impl From<EngineError> for Refusal {
    fn from(error: EngineError) -> Self {
        let message = error.to_string();
        match error {
            EngineError::NotFound { id } => Refusal::not_found("job", id.to_string()),
            EngineError::NotInDeadLetter { id } => Refusal::not_found("dead_letter_job", id.to_string()),
            EngineError::WorkerNotFound { worker_id } => Refusal::not_found("worker", worker_id),
            EngineError::WorkerConflict { worker_id, current_state } => Refusal::new("conflict", message)
                .detail("worker_id", worker_id)
                .detail("current_state", current_state.as_str()),
            EngineError::CronNotFound { name } => Refusal::not_found("cron", name),
            EngineError::CronChanged { name } => {
                Refusal::new("conflict", message).detail("name", name).detail("reason", "concurrent_change")
            }
            EngineError::CronLimit { max_entries } => {
                Refusal::new("conflict", message).detail("reason", "limit").detail("limit", max_entries)
            }
            EngineError::SchemaNotFound { uri } => Refusal::not_found("schema", uri),
            EngineError::WebhookNotFound { id } => Refusal::not_found("webhook", format!("sub_{id}")),
            EngineError::WebhookLimit { max_webhooks } => {
                Refusal::new("conflict", message).detail("reason", "limit").detail("limit", max_webhooks)
            }
            EngineError::RotationInProgress { id } => Refusal::new("conflict", message)
                .detail("reason", "rotation_in_progress")
                .detail("subscription_id", format!("sub_{id}")),
            EngineError::NoRotation { id } => Refusal::new("conflict", message)
                .detail("reason", "no_rotation")
                .detail("subscription_id", format!("sub_{id}")),
            EngineError::SchemaExists { uri } => Refusal::new("duplicate", message).detail("uri", uri),
            EngineError::SchemaLimit { max_schemas } => {
                Refusal::new("conflict", message).detail("reason", "limit").detail("limit", max_schemas)
            }
            EngineError::Conflict { id, current_state, reason } => {
                let refusal = Refusal::new("conflict", message)
                    .detail("job_id", id.to_string())
                    .detail("current_state", current_state.as_str())
                    .detail("reason", reason.as_str());
                match reason {
                    ConflictReason::NotActive => refusal.detail("expected_state", "active"),
                    _ => refusal,
                }
            }
            EngineError::Duplicate { id, index } => {
                let error = Refusal::new("duplicate", message).detail("existing_job_id", id.to_string());
                match index {
                    Some(index) => error.detail("index", index),
                    None => error,
                }
            }
            EngineError::UniqueConflict { existing, existing_state, key, index } => {
                let error = Refusal::new("duplicate", message)
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
                let api = Refusal::from(error);
                match index {
                    Some(index) => api.detail("index", index),
                    None => api,
                }
            }
            EngineError::QueuePaused { queue, index } => {
                let error = Refusal::new("queue_paused", message).detail("queue", queue);
                match index {
                    Some(index) => error.detail("index", index),
                    None => error,
                }
            }
            EngineError::QueueFull { queue, depth, bound, index } => {
                let error = Refusal::new("queue_full", message)
                    .detail("queue", queue)
                    .detail("depth", depth)
                    .detail("bound", bound);
                match index {
                    Some(index) => error.detail("index", index),
                    None => error,
                }
            }
            EngineError::WorkflowNotFound { id } => Refusal::not_found("workflow", id.to_string()),
            EngineError::WorkflowConflict { id, current_state } => Refusal::new("conflict", message)
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
                    Unavailable::Contention => {
                        "the database rolled the change back to end a conflict with another; nothing was changed, retry"
                    }
                };
                Refusal::new("backend_error", text).detail("reason", reason.as_str())
            }
        }
    }
}
