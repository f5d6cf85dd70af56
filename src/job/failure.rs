//! Failure reports sent by workers (nack / fail) or made by the server (timeouts).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::ValidationError;
use crate::clock::Millis;
use crate::limits::{BACKTRACE_CHARS_MAX, BACKTRACE_FRAMES_MAX, ERROR_MESSAGE_CHARS_MAX, ERROR_TYPE_CHARS_MAX};

/// One failure of a job, as stored (messages and backtraces already cut to size).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureReport {
    pub error_type: String,
    pub code: String,
    pub message: String,
    pub backtrace: Vec<String>,
    pub retryable: Option<bool>,
    /// Compact JSON text of the worker's `details` object.
    pub details: Option<String>,
}

/// A failure in a job's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorEntry {
    pub report: FailureReport,
    pub attempt: u32,
    pub occurred_at: Millis,
}

impl FailureReport {
    /// The bytes of its texts (for [`super::Job::held_bytes`]).
    pub fn held_bytes(&self) -> usize {
        self.error_type.len()
            + self.code.len()
            + self.message.len()
            + self.backtrace.iter().map(|frame| frame.len() + std::mem::size_of::<String>()).sum::<usize>()
            + self.details.as_ref().map_or(0, String::len)
    }

    /// A failure the server itself decided (`timeout`, `visibility_timeout`, `expired`).
    pub fn server(code: &str, message: impl Into<String>) -> Self {
        Self {
            error_type: code.to_string(),
            code: code.to_string(),
            message: message.into(),
            backtrace: Vec::new(),
            retryable: None,
            details: None,
        }
    }

    /// The `details.error_class` the worker sent, if any.
    pub fn error_class(&self) -> Option<String> {
        let details = self.details.as_ref()?;
        match serde_json::from_str::<Value>(details).ok()? {
            Value::Object(map) => map.get("error_class")?.as_str().map(str::to_string),
            _ => None,
        }
    }
}

/// Parses the `error` object of a nack / fail request. `type` is required, with
/// `code` accepted as its alias; `message` is required.
pub fn parse_failure_report(value: Option<&Value>) -> Result<FailureReport, ValidationError> {
    let Some(value) = value.filter(|value| !value.is_null()) else {
        return Err(ValidationError::request(
            Some("error".to_string()),
            "error is required: an object with type and message",
        ));
    };
    let Value::Object(map) = value else {
        return Err(ValidationError::request(
            Some("error".to_string()),
            "error must be an object with type and message",
        ));
    };
    let text = |name: &str| map.get(name).and_then(Value::as_str).filter(|text| !text.is_empty());
    let error_type = text("type").or_else(|| text("code"));
    let Some(error_type) = error_type else {
        return Err(ValidationError::request(
            Some("error.type".to_string()),
            "error.type (or error.code) is required and must be a non-empty string",
        ));
    };
    if error_type.chars().count() > ERROR_TYPE_CHARS_MAX {
        return Err(ValidationError::request(
            Some("error.type".to_string()),
            format!("error.type must be at most {ERROR_TYPE_CHARS_MAX} characters"),
        ));
    }
    let code = text("code").unwrap_or(error_type);
    let Some(message) = map.get("message").and_then(Value::as_str) else {
        return Err(ValidationError::request(
            Some("error.message".to_string()),
            "error.message is required and must be a string",
        ));
    };
    let backtrace = match map.get("backtrace") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(frames)) if frames.iter().all(Value::is_string) => cut_backtrace(frames),
        Some(_) => {
            return Err(ValidationError::request(
                Some("error.backtrace".to_string()),
                "error.backtrace must be an array of strings",
            ));
        }
    };
    let retryable = match map.get("retryable") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(flag)) => Some(*flag),
        Some(_) => {
            return Err(ValidationError::request(
                Some("error.retryable".to_string()),
                "error.retryable must be a boolean",
            ));
        }
    };
    let details = match map.get("details") {
        None | Some(Value::Null) => None,
        Some(object @ Value::Object(_)) => Some(object.to_string()),
        Some(_) => {
            return Err(ValidationError::request(Some("error.details".to_string()), "error.details must be an object"));
        }
    };
    Ok(FailureReport {
        error_type: error_type.to_string(),
        code: code.to_string(),
        message: message.chars().take(ERROR_MESSAGE_CHARS_MAX).collect(),
        backtrace,
        retryable,
        details,
    })
}

/// A failed attempt described in Rust for the embedding API
/// ([`Svc::nack`](crate::Svc::nack)). It builds the `error` object an HTTP
/// worker sends with a nack and is checked by the same
/// [`parse_failure_report`], so both doors take the same reports.
///
/// ```
/// use svc::job::Failure;
/// let failure = Failure::new("SmtpError", "421 try again later")
///     .backtrace(["mailer::send", "worker::run"])
///     .details(serde_json::json!({"error_class": "smtp.Transient"}));
/// let report = failure.build().expect("a valid report");
/// assert_eq!((report.error_type.as_str(), report.retryable), ("SmtpError", None));
///
/// // Final: no retry whatever the policy; the job goes to the dead letter listing.
/// let report = Failure::new("InvalidAddress", "no such domain").non_retryable().build().unwrap();
/// assert_eq!(report.retryable, Some(false));
/// assert!(Failure::new("", "a failure needs a type").build().is_err());
/// ```
#[derive(Debug, Clone)]
pub struct Failure {
    error: serde_json::Map<String, Value>,
    /// The first value that could not be turned into JSON, by field.
    unserializable: Option<(&'static str, String)>,
}

impl Failure {
    /// A failure of `error_type` (1 to 255 characters, e.g. the error's type
    /// name), with a message for people (cut to 4096 characters).
    pub fn new(error_type: impl Into<String>, message: impl Into<String>) -> Self {
        let mut error = serde_json::Map::new();
        error.insert("type".into(), Value::String(error_type.into()));
        error.insert("message".into(), Value::String(message.into()));
        Failure { error, unserializable: None }
    }

    /// A code besides the type (the type when not given); retry policies'
    /// `non_retryable_errors` match either.
    pub fn code(mut self, code: impl Into<String>) -> Self {
        self.error.insert("code".into(), Value::String(code.into()));
        self
    }

    /// Where it failed, innermost frame first (kept up to 50 frames and
    /// 10 000 characters).
    pub fn backtrace<I: IntoIterator<Item = S>, S: Into<String>>(mut self, frames: I) -> Self {
        let frames = frames.into_iter().map(|frame| Value::String(frame.into())).collect();
        self.error.insert("backtrace".into(), Value::Array(frames));
        self
    }

    /// Anything that serializes to a JSON object; its `error_class` is
    /// matched by retry policies' `non_retryable_errors` too.
    pub fn details(mut self, details: impl Serialize) -> Self {
        match serde_json::to_value(details) {
            Ok(details) => {
                self.error.insert("details".into(), details);
            }
            Err(error) => {
                self.unserializable.get_or_insert(("error.details", error.to_string()));
            }
        }
        self
    }

    /// Final: the job is not retried, whatever its retry policy and attempts
    /// left, and goes to the dead letter listing (`discarded`).
    pub fn non_retryable(mut self) -> Self {
        self.error.insert("retryable".into(), Value::Bool(false));
        self
    }

    /// Validates the report as the server validates a nack's `error`.
    pub fn build(self) -> Result<FailureReport, ValidationError> {
        if let Some((field, problem)) = self.unserializable {
            return Err(ValidationError::request(
                Some(field.to_string()),
                format!("{field} does not serialize to JSON: {problem}"),
            ));
        }
        parse_failure_report(Some(&Value::Object(self.error)))
    }
}

fn cut_backtrace(frames: &[Value]) -> Vec<String> {
    let mut kept = Vec::new();
    let mut chars = 0;
    for frame in frames.iter().filter_map(Value::as_str).take(BACKTRACE_FRAMES_MAX) {
        let length = frame.chars().count();
        if chars + length > BACKTRACE_CHARS_MAX {
            break;
        }
        chars += length;
        kept.push(frame.to_string());
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn code_is_an_alias_of_type() {
        let report = parse_failure_report(Some(&json!({"code": "handler_error", "message": "boom"}))).unwrap();
        assert_eq!(report.error_type, "handler_error");
        assert_eq!(report.code, "handler_error");
        let report = parse_failure_report(Some(&json!({"type": "SmtpError", "message": "421"}))).unwrap();
        assert_eq!(report.code, "SmtpError");
    }

    #[test]
    fn missing_parts_are_refused() {
        assert!(parse_failure_report(None).is_err());
        assert!(parse_failure_report(Some(&json!({"message": "no type"}))).is_err());
        assert!(parse_failure_report(Some(&json!({"type": "T"}))).is_err());
        assert!(parse_failure_report(Some(&json!("text"))).is_err());
    }

    #[test]
    fn error_class_comes_from_details() {
        let report = parse_failure_report(Some(
            &json!({"type": "E", "message": "m", "details": {"error_class": "net.Timeout"}}),
        ))
        .unwrap();
        assert_eq!(report.error_class().as_deref(), Some("net.Timeout"));
    }
}
