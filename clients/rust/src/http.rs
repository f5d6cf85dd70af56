//! The HTTP transport: one keep-alive connection pool to one server,
//! timeouts, and the retry rule (a request is sent again only if it surely
//! was not applied, or if applying it twice does no harm).

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::de::DeserializeOwned;

use crate::error::{ApiError, Error, Result, TransportError, TransportErrorKind};

/// The media type of svc's bodies.
pub const MEDIA_TYPE: &str = "application/svc+json";

/// 503 reasons that say the request was refused before it did anything.
const NOT_APPLIED_503: [&str; 5] = ["overloaded", "capacity", "disk_full", "connections", "connections_per_address"];

/// How transient failures are retried: capped exponential backoff with
/// jitter, and `Retry-After` obeyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestRetry {
    /// Retries after the first attempt (0 turns retrying off).
    pub max_retries: u32,
    /// The first backoff step; each retry doubles it.
    pub base_delay: Duration,
    /// The longest backoff step.
    pub max_delay: Duration,
    /// A `Retry-After` longer than this is not waited for: the error is returned.
    pub max_retry_after: Duration,
}

impl Default for RequestRetry {
    fn default() -> Self {
        RequestRetry {
            max_retries: 5,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            max_retry_after: Duration::from_secs(30),
        }
    }
}

impl RequestRetry {
    /// No retries: every call makes one attempt.
    pub fn none() -> RequestRetry {
        RequestRetry { max_retries: 0, ..RequestRetry::default() }
    }

    /// Retries after the first attempt.
    pub fn max_retries(mut self, retries: u32) -> RequestRetry {
        self.max_retries = retries;
        self
    }

    /// The first backoff step and the longest.
    pub fn delays(mut self, base: Duration, max: Duration) -> RequestRetry {
        self.base_delay = base;
        self.max_delay = max.max(base);
        self
    }

    /// The longest `Retry-After` waited for.
    pub fn max_retry_after(mut self, max: Duration) -> RequestRetry {
        self.max_retry_after = max;
        self
    }
}

/// `base × 2^attempt`, at most `max`, times a random factor in [0.5, 1).
pub(crate) fn backoff(attempt: u32, base: Duration, max: Duration) -> Duration {
    let step = base.saturating_mul(1u32 << attempt.min(20)).min(max);
    step.mul_f64(0.5 + rand::random::<f64>() * 0.5)
}

/// One request to send.
pub(crate) struct Call {
    pub method: reqwest::Method,
    pub path: String,
    pub query: Vec<(&'static str, String)>,
    pub body: Option<Vec<u8>>,
    /// Sending it twice does no harm: retried even after a failure that may
    /// have been applied.
    pub idempotent: bool,
    /// Added to the client's timeout (a long poll's wait).
    pub extra_timeout: Duration,
    pub retry: Option<RequestRetry>,
}

impl Call {
    pub fn new(method: reqwest::Method, path: impl Into<String>) -> Call {
        Call {
            method,
            path: path.into(),
            query: Vec::new(),
            body: None,
            idempotent: false,
            extra_timeout: Duration::ZERO,
            retry: None,
        }
    }

    pub fn get(path: impl Into<String>) -> Call {
        Call::new(reqwest::Method::GET, path).idempotent(true)
    }

    pub fn post(path: impl Into<String>) -> Call {
        Call::new(reqwest::Method::POST, path)
    }

    pub fn delete(path: impl Into<String>) -> Call {
        Call::new(reqwest::Method::DELETE, path).idempotent(true)
    }

    pub fn idempotent(mut self, idempotent: bool) -> Call {
        self.idempotent = idempotent;
        self
    }

    pub fn json(mut self, body: &impl serde::Serialize) -> Result<Call> {
        let bytes = serde_json::to_vec(body).map_err(|error| Error::invalid(None, error.to_string()))?;
        self.body = Some(bytes);
        Ok(self)
    }

    pub fn query(mut self, key: &'static str, value: Option<impl ToString>) -> Call {
        if let Some(value) = value {
            self.query.push((key, value.to_string()));
        }
        self
    }

    pub fn retry(mut self, retry: RequestRetry) -> Call {
        self.retry = Some(retry);
        self
    }
}

/// A success answer.
pub(crate) struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
    pub request_id: Option<String>,
    /// An earlier attempt failed in a way that may have been applied.
    pub maybe_applied: bool,
}

impl Answer {
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.body).map_err(|error| {
            Error::protocol(
                format!("the answer (HTTP {}) does not read: {error}", self.status),
                self.request_id.clone(),
            )
        })
    }
}

/// Sends requests to one server.
pub(crate) struct Transport {
    http: reqwest::Client,
    /// `http://host:port/svc/v1`
    base: String,
    /// `http://host:port`
    origin: String,
    timeout: Duration,
    retry: RequestRetry,
}

pub(crate) struct TransportConfig {
    pub api_key: Option<String>,
    pub timeout: Duration,
    pub connect_timeout: Duration,
    pub retry: RequestRetry,
    pub headers: Vec<(String, String)>,
    pub user_agent: String,
}

impl Transport {
    pub fn new(url: &str, config: TransportConfig) -> Result<Transport> {
        let parsed = reqwest::Url::parse(url).map_err(|error| Error::invalid(Some("url".into()), error.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(Error::invalid(Some("url".into()), format!("{url} is not an http(s) URL with a host")));
        }
        let origin = parsed.origin().ascii_serialization();
        let path = parsed.path().trim_end_matches('/');
        let base = if path.ends_with("/svc/v1") { format!("{origin}{path}") } else { format!("{origin}{path}/svc/v1") };
        let origin = base.strip_suffix("/svc/v1").unwrap_or(&origin).to_string();

        let mut headers = HeaderMap::new();
        headers.insert(reqwest::header::ACCEPT, HeaderValue::from_static(MEDIA_TYPE));
        if let Some(key) = &config.api_key {
            let mut value = HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| Error::invalid(Some("api_key".into()), "the key holds characters a header cannot"))?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        for (name, value) in &config.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|error| Error::invalid(Some("headers".into()), error.to_string()))?;
            let value = HeaderValue::from_str(value)
                .map_err(|error| Error::invalid(Some("headers".into()), error.to_string()))?;
            headers.insert(name, value);
        }
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls_config())
            .default_headers(headers)
            .user_agent(config.user_agent)
            .connect_timeout(config.connect_timeout)
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            .build()
            .map_err(|error| Error::invalid(Some("url".into()), format!("the HTTP client cannot be built: {error}")))?;
        Ok(Transport { http, base, origin, timeout: config.timeout, retry: config.retry })
    }

    /// The server's root, without `/svc/v1`.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    fn url(&self, path: &str) -> String {
        if path.starts_with("/svc/") || path == "/ready" || path == "/health" {
            format!("{}{path}", self.origin)
        } else {
            format!("{}{path}", self.base)
        }
    }

    /// Sends `call`, retrying transient failures as the rule allows.
    pub async fn send(&self, call: &Call) -> Result<Answer> {
        let retry = call.retry.unwrap_or(self.retry);
        let mut maybe_applied = false;
        let mut attempt: u32 = 0;
        loop {
            let (mut error, not_applied) = match self.once(call).await {
                Ok(Ok(mut answer)) => {
                    answer.maybe_applied = maybe_applied;
                    return Ok(answer);
                }
                Ok(Err(api)) => {
                    let not_applied = api.status < 500 && api.status != 0
                        || api.status == 503 && api.reason().is_some_and(|reason| NOT_APPLIED_503.contains(&reason))
                        || api.code == "queue_paused";
                    (Error::from(api), not_applied)
                }
                Err(transport) => {
                    let not_applied = transport.kind == TransportErrorKind::Refused;
                    (Error::Transport(transport), not_applied)
                }
            };
            maybe_applied |= !not_applied;
            error.set_attempts(attempt + 1, maybe_applied);
            // svc's own word on whether trying again can help; a paused queue
            // waits for an operator, not for time.
            if !error.retryable() || error.code() == "queue_paused" {
                return Err(error);
            }
            if !(not_applied || call.idempotent) || attempt >= retry.max_retries {
                return Err(error);
            }
            let retry_after = error.api().and_then(|api| api.retry_after);
            if retry_after.is_some_and(|after| after > retry.max_retry_after) {
                return Err(error);
            }
            let delay = backoff(attempt, retry.base_delay, retry.max_delay).max(retry_after.unwrap_or_default());
            tracing::debug!(target: "svc_client", path = %call.path, attempt = attempt + 1, ?delay, error = %error, "retrying");
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    /// One attempt: a success, svc's error, or no answer.
    async fn once(&self, call: &Call) -> Result<Result<Answer, ApiError>, TransportError> {
        let timeout = self.timeout + call.extra_timeout;
        let mut url = reqwest::Url::parse(&self.url(&call.path)).map_err(|error| {
            TransportError::new(TransportErrorKind::Refused, format!("{} is not a URL: {error}", call.path))
        })?;
        if !call.query.is_empty() {
            url.query_pairs_mut().extend_pairs(call.query.iter().map(|(key, value)| (*key, value.as_str())));
        }
        let mut request = self.http.request(call.method.clone(), url).timeout(timeout);
        if let Some(body) = &call.body {
            request = request.header(reqwest::header::CONTENT_TYPE, MEDIA_TYPE).body(body.clone());
        }
        let response = request.send().await.map_err(|error| self.transport_error(error, call, timeout))?;
        let status = response.status().as_u16();
        let request_id =
            response.headers().get("x-request-id").and_then(|value| value.to_str().ok()).map(str::to_string);
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<f64>().ok())
            .filter(|seconds| seconds.is_finite() && *seconds >= 0.0)
            .map(Duration::from_secs_f64);
        let body = response.bytes().await.map_err(|error| self.transport_error(error, call, timeout))?;
        if (200..300).contains(&status) {
            return Ok(Ok(Answer { status, body: body.to_vec(), request_id, maybe_applied: false }));
        }
        let mut error = ApiError::from_answer(status, &body, request_id);
        error.retry_after = retry_after;
        Ok(Err(error))
    }

    fn transport_error(&self, error: reqwest::Error, call: &Call, timeout: Duration) -> TransportError {
        let (kind, message) = if error.is_timeout() {
            (
                TransportErrorKind::Timeout,
                format!("no answer from svc within {timeout:?} ({} {})", call.method, call.path),
            )
        } else if error.is_connect() {
            (TransportErrorKind::Refused, format!("cannot connect to svc at {} ({})", self.origin, chain(&error)))
        } else {
            (TransportErrorKind::Broken, format!("the connection to svc at {} failed ({})", self.origin, chain(&error)))
        };
        let mut transport = TransportError::new(kind, message);
        transport.source = Some(Box::new(error));
        transport
    }

    /// Reads `/ready`: `Ok(true)` when svc is ready, `Ok(false)` when it
    /// answers that it is draining or not ready.
    pub async fn ready(&self) -> std::result::Result<bool, TransportError> {
        let call = Call::get("/ready").retry(RequestRetry::none());
        match self.once(&call).await? {
            Ok(_) => Ok(true),
            Err(_) => Ok(false),
        }
    }

    /// `/ready`'s `details.reason` when it is not ready (`shutting_down`,
    /// `backend_unavailable`); `None` when ready.
    pub async fn not_ready_reason(&self) -> std::result::Result<Option<String>, TransportError> {
        let call = Call::get("/ready").retry(RequestRetry::none());
        match self.once(&call).await? {
            Ok(_) => Ok(None),
            Err(error) => Ok(Some(error.reason().unwrap_or("not_ready").to_string())),
        }
    }
}

/// An error with its causes, `outer: inner: innermost`.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// TLS 1.2+ with the ring provider and the system's roots: the crypto
/// already in svc's dependency tree.
fn tls_config() -> rustls::ClientConfig {
    static CONFIG: std::sync::OnceLock<rustls::ClientConfig> = std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut roots = rustls::RootCertStore::empty();
            for certificate in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(certificate);
            }
            rustls::ClientConfig::builder_with_provider(provider)
                .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
                .expect("ring supports TLS 1.2 and 1.3")
                .with_root_certificates(roots)
                .with_no_client_auth()
        })
        .clone()
}
