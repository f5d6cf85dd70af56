//! The error body `{error: {code, message, retryable, details, request_id,
//! hint, docs_url}}` and its headers, built from the engine's [`Refusal`]
//! (which holds the one table from codes to status and retryability).

use hyper::StatusCode;
use hyper::header::{HeaderName, RETRY_AFTER};
use serde_json::{Map, Value};

use crate::engine::{ERROR_CODES, EngineError, Refusal};
use crate::job::ValidationError;

/// A refused enqueue's queue depth and bound (`queue_full`).
pub const X_SVC_QUEUE_DEPTH: HeaderName = HeaderName::from_static("x-svc-queue-depth");
pub const X_SVC_QUEUE_BOUND: HeaderName = HeaderName::from_static("x-svc-queue-bound");
/// How full the queue of an accepted enqueue is, past its warning threshold.
pub const X_SVC_QUEUE_PRESSURE: HeaderName = HeaderName::from_static("x-svc-queue-pressure");

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
        debug_assert!(ERROR_CODES.iter().any(|row| row.0 == code), "error code {code} is in the table");
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
        ApiError::from(Refusal::not_found(resource_type, resource_id))
    }

    pub fn status(&self) -> StatusCode {
        let row = ERROR_CODES.iter().find(|row| row.0 == self.code);
        StatusCode::from_u16(row.map_or(500, |row| row.1)).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The error body.
    pub fn body(&self, request_id: &str) -> Value {
        let row = ERROR_CODES.iter().find(|row| row.0 == self.code);
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

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        let mut error = ApiError::new(refusal.code, refusal.message);
        error.details = refusal.details;
        error
    }
}

impl From<ValidationError> for ApiError {
    fn from(error: ValidationError) -> Self {
        ApiError::from(Refusal::from(error))
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        let queue_full = match &error {
            EngineError::QueueFull { depth, bound, .. } => Some((*depth, *bound)),
            _ => None,
        };
        let mut api = ApiError::from(Refusal::from(error));
        if let Some((depth, bound)) = queue_full {
            api.headers.push((X_SVC_QUEUE_DEPTH, depth.to_string()));
            api.headers.push((X_SVC_QUEUE_BOUND, bound.to_string()));
            api.headers.push((RETRY_AFTER, "1".into()));
        }
        api
    }
}
