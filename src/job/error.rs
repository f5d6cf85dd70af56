//! Validation errors of request bodies, before anything reaches the engine.

use std::fmt;

/// Which error code a validation failure maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValidationKind {
    /// Malformed JSON, a missing required field, an invalid non-envelope request.
    Request,
    /// The job envelope fails validation.
    Payload,
    /// Something is over its size limit.
    TooLarge,
    /// A feature this server does not offer.
    Unsupported,
    /// `args` do not match the job's registered schema, or it names none.
    Schema,
}

/// One validation failure: the first one found is reported.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidationError {
    pub kind: ValidationKind,
    pub message: String,
    /// JSON path of the offending field, e.g. `options.retry.max_attempts`.
    pub field: Option<String>,
    pub reason: Option<&'static str>,
    /// Extra structured details as (key, JSON value) pairs.
    pub details: Vec<(&'static str, serde_json::Value)>,
}

impl ValidationError {
    pub fn request(field: impl Into<Option<String>>, message: impl Into<String>) -> Self {
        Self::new(ValidationKind::Request, field.into(), message.into())
    }

    pub fn payload(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ValidationKind::Payload, Some(field.into()), message.into())
    }

    /// A feature this server, or this backend, does not offer (422 `unsupported`).
    pub fn unsupported(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ValidationKind::Unsupported, Some(field.into()), message.into())
    }

    pub fn too_large(field: impl Into<String>, limit_bytes: usize, actual_bytes: usize) -> Self {
        let field = field.into();
        let message = format!("{field} is {actual_bytes} bytes, over the limit of {limit_bytes} bytes");
        let mut error = Self::new(ValidationKind::TooLarge, Some(field), message);
        error.details.push(("limit_bytes", limit_bytes.into()));
        error.details.push(("actual_bytes", actual_bytes.into()));
        error
    }

    fn new(kind: ValidationKind, field: Option<String>, message: String) -> Self {
        Self { kind, message, field, reason: None, details: Vec::new() }
    }

    pub fn with_reason(mut self, reason: &'static str) -> Self {
        self.reason = Some(reason);
        self
    }

    /// Prefixes the field path, e.g. for batch items.
    pub fn within(mut self, prefix: &str) -> Self {
        self.field = Some(match self.field {
            Some(field) => format!("{prefix}.{field}"),
            None => prefix.to_string(),
        });
        self
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ValidationError {}
