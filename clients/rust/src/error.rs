//! Errors: what svc answered ([`ApiError`]), or why no answer came
//! ([`TransportError`]).

use std::fmt;
use std::time::Duration;

use serde_json::{Map, Value};

/// The result of every call of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a call failed.
///
/// Every variant answers [`Error::code`], [`Error::message`],
/// [`Error::retryable`], [`Error::details`] and [`Error::request_id`], so
/// most callers never need to match on it.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// svc answered with an error (`{"error": {code, message, ...}}`), or an
    /// embedded svc refused the call the way the HTTP API would.
    Api(Box<ApiError>),
    /// No answer came: the connection was refused or broke, or the answer
    /// took longer than the timeout.
    Transport(TransportError),
    /// An answer that does not have the shape the API describes.
    Protocol {
        /// What was wrong with it.
        message: String,
        /// The request id of the answer (`X-Request-Id`), when there was one.
        request_id: Option<String>,
    },
    /// Refused by the client before anything was sent: arguments that do
    /// not serialize to JSON, an option out of range, a malformed URL.
    Invalid {
        /// The argument at fault, named as on the wire (`args`, `queues`, …).
        field: Option<String>,
        /// What is wrong with it.
        message: String,
    },
}

impl Error {
    pub(crate) fn invalid(field: impl Into<Option<String>>, message: impl Into<String>) -> Error {
        Error::Invalid { field: field.into(), message: message.into() }
    }

    pub(crate) fn protocol(message: impl Into<String>, request_id: Option<String>) -> Error {
        Error::Protocol { message: message.into(), request_id }
    }

    /// The stable error code: svc's (`not_found`, `conflict`, `duplicate`,
    /// `queue_paused`, …), or the client's own (`connection_refused`,
    /// `connection_error`, `timeout`, `protocol_error`, `invalid_argument`).
    pub fn code(&self) -> &str {
        match self {
            Error::Api(error) => &error.code,
            Error::Transport(error) => error.kind.code(),
            Error::Protocol { .. } => "protocol_error",
            Error::Invalid { .. } => "invalid_argument",
        }
    }

    /// What went wrong, in words.
    pub fn message(&self) -> &str {
        match self {
            Error::Api(error) => &error.message,
            Error::Transport(error) => &error.message,
            Error::Protocol { message, .. } | Error::Invalid { message, .. } => message,
        }
    }

    /// Whether the same call may succeed later (svc's word, or a failure to
    /// reach it).
    pub fn retryable(&self) -> bool {
        match self {
            Error::Api(error) => error.retryable,
            Error::Transport(_) => true,
            Error::Protocol { .. } | Error::Invalid { .. } => false,
        }
    }

    /// svc's `details` (`field`, `reason`, `current_state`, …); empty when
    /// there are none.
    pub fn details(&self) -> &Map<String, Value> {
        static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        match self {
            Error::Api(error) => &error.details,
            _ => EMPTY.get_or_init(Map::new),
        }
    }

    /// The request id of svc's answer (`X-Request-Id`), for logs and support.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Error::Api(error) => error.request_id.as_deref(),
            Error::Protocol { request_id, .. } => request_id.as_deref(),
            _ => None,
        }
    }

    /// The HTTP status of svc's answer (0 when none came).
    pub fn status(&self) -> u16 {
        match self {
            Error::Api(error) => error.status,
            Error::Protocol { .. } | Error::Transport(_) | Error::Invalid { .. } => 0,
        }
    }

    /// True when the call may have taken effect although it failed: an
    /// attempt was sent and its answer lost (a broken connection, a
    /// timeout), or svc answered in a way that does not say.
    pub fn maybe_applied(&self) -> bool {
        match self {
            Error::Api(error) => error.maybe_applied,
            Error::Transport(error) => error.maybe_applied,
            Error::Protocol { .. } => true,
            Error::Invalid { .. } => false,
        }
    }

    /// svc's error, when it answered one.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Error::Api(error) => Some(error),
            _ => None,
        }
    }

    /// 404 `not_found`.
    pub fn is_not_found(&self) -> bool {
        self.code() == "not_found"
    }

    /// 409 `conflict`: the job (or entry) is in a state the call does not apply to.
    pub fn is_conflict(&self) -> bool {
        self.code() == "conflict"
    }

    /// 409 `duplicate`: a client-chosen id in use, or a unique policy that rejects.
    pub fn is_duplicate(&self) -> bool {
        self.code() == "duplicate"
    }

    /// 401 or 403: a missing or unknown key, or a role that may not do this.
    pub fn is_auth(&self) -> bool {
        matches!(self.code(), "unauthorized" | "forbidden")
    }

    pub(crate) fn set_attempts(&mut self, attempts: u32, maybe_applied: bool) {
        match self {
            Error::Api(error) => {
                error.attempts = attempts;
                error.maybe_applied = maybe_applied;
            }
            Error::Transport(error) => {
                error.attempts = attempts;
                error.maybe_applied = maybe_applied;
            }
            _ => {}
        }
    }
}

impl From<ApiError> for Error {
    fn from(error: ApiError) -> Error {
        Error::Api(Box::new(error))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Api(error) => fmt::Display::fmt(error, f),
            Error::Transport(error) => fmt::Display::fmt(error, f),
            Error::Protocol { message, .. } => write!(f, "unexpected answer from svc: {message}"),
            Error::Invalid { field: Some(field), message } => write!(f, "invalid {field}: {message}"),
            Error::Invalid { field: None, message } => write!(f, "invalid argument: {message}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Transport(error) => error.source.as_deref().map(|source| source as _),
            _ => None,
        }
    }
}

/// An error svc answered: the fields of its error body, with the HTTP
/// status and what the client knows about the call.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ApiError {
    /// The HTTP status (an embedded svc reports the status HTTP would answer).
    pub status: u16,
    /// The stable error code (`GET /svc/v1/errors` lists them).
    pub code: String,
    pub message: String,
    /// Whether svc says the same request may succeed later.
    pub retryable: bool,
    /// `field`, `reason`, `current_state`, `existing_job_id`, …
    pub details: Map<String, Value>,
    /// The answer's `X-Request-Id` (also in the error body).
    pub request_id: Option<String>,
    /// The `Retry-After` of a 429 or 503.
    pub retry_after: Option<Duration>,
    /// Attempts made for this call, retries included.
    pub attempts: u32,
    /// An earlier attempt of this call may have been applied (its answer
    /// was lost), so this error may describe the retry, not the call.
    pub maybe_applied: bool,
}

impl ApiError {
    pub(crate) fn new(status: u16, code: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code: code.into(),
            message: message.into(),
            retryable: status == 429 || status >= 502,
            details: Map::new(),
            request_id: None,
            retry_after: None,
            attempts: 1,
            maybe_applied: false,
        }
    }

    /// Reads an error answer: its body if it is svc's error body, else the
    /// status alone.
    pub(crate) fn from_answer(status: u16, body: &[u8], request_id: Option<String>) -> ApiError {
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        let error = parsed.as_ref().and_then(|body| body.get("error")).and_then(Value::as_object);
        let text = |key: &str| error.and_then(|error| error.get(key)).and_then(Value::as_str).map(str::to_string);
        let mut api = ApiError::new(
            status,
            text("code").unwrap_or_else(|| format!("http_{status}")),
            text("message").unwrap_or_else(|| format!("svc answered HTTP {status}")),
        );
        if let Some(retryable) = error.and_then(|error| error.get("retryable")).and_then(Value::as_bool) {
            api.retryable = retryable;
        }
        if let Some(details) = error.and_then(|error| error.get("details")).and_then(Value::as_object) {
            api.details = details.clone();
        }
        api.request_id = text("request_id").or(request_id);
        api
    }

    fn detail(&self, key: &str) -> Option<&str> {
        self.details.get(key).and_then(Value::as_str)
    }

    /// `details.reason`, when svc gave one (`unique_conflict`, `not_owner`, `overloaded`, …).
    pub fn reason(&self) -> Option<&str> {
        self.detail("reason")
    }

    /// `details.field`: the offending field of a refused request.
    pub fn field(&self) -> Option<&str> {
        self.detail("field")
    }

    /// `details.current_state`: the state that stood in the way (409).
    pub fn current_state(&self) -> Option<&str> {
        self.detail("current_state")
    }

    /// `details.existing_job_id`: the job holding the id or unique key (409 `duplicate`).
    pub fn existing_job_id(&self) -> Option<&str> {
        self.detail("existing_job_id")
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "svc answered {} {}: {}", self.status, self.code, self.message)?;
        if let Some(id) = &self.request_id {
            write!(f, " (request {id})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

/// How a request failed to get an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportErrorKind {
    /// The connection could not be made: the request was surely not sent.
    Refused,
    /// The connection broke after the request may have left.
    Broken,
    /// No answer within the timeout.
    Timeout,
}

impl TransportErrorKind {
    /// The error code: `connection_refused`, `connection_error` or `timeout`.
    pub fn code(self) -> &'static str {
        match self {
            TransportErrorKind::Refused => "connection_refused",
            TransportErrorKind::Broken => "connection_error",
            TransportErrorKind::Timeout => "timeout",
        }
    }
}

/// No answer came from svc.
#[derive(Debug)]
#[non_exhaustive]
pub struct TransportError {
    pub kind: TransportErrorKind,
    pub message: String,
    /// Attempts made for this call, retries included.
    pub attempts: u32,
    /// An attempt may have been applied although no answer came.
    pub maybe_applied: bool,
    pub(crate) source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl TransportError {
    pub(crate) fn new(kind: TransportErrorKind, message: impl Into<String>) -> TransportError {
        TransportError {
            kind,
            message: message.into(),
            attempts: 1,
            maybe_applied: kind != TransportErrorKind::Refused,
            source: None,
        }
    }
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}
