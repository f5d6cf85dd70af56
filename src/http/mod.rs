//! The hyper front end. It only translates: HTTP + JSON in, engine commands
//! through the handle, JSON out. Order of checks follows docs/api.md, "Order of checks".

// `ApiError` is a few words larger than clippy likes inside `Result`; it only
// travels the cold error path once per request, so boxing it buys nothing.
#![allow(clippy::result_large_err)]

pub mod auth;
pub mod connection;
mod cron;
mod dead_letter;
pub mod error;
mod events;
mod extract;
mod handlers;
pub mod jobs;
mod paging;
mod probes;
mod progress;
mod queues;
pub mod rate_limit;
mod router;
mod schemas;
mod webhooks;
mod workers;
mod workflows;

pub use error::{ApiError, ERROR_TABLE};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::engine::EngineHandle;
use crate::job::{IdGenerator, JobDefaults};
use crate::limits::{BATCH_BODY_BYTES_MAX, REQUEST_BODY_BYTES_MAX, REQUEST_ID_CHARS_MAX};
use rate_limit::{RateLimiter, Window};
use router::Route;

pub const SPEC_VERSION: &str = "1.0.0-rc.1";
pub const MEDIA_TYPE: &str = "application/svc+json";

/// Everything a request handler may use.
pub struct AppState {
    /// Every operation of the service (docs: `backend/mod.rs`).
    pub backend: Arc<dyn Backend>,
    /// Wiring beside the backend: time, job defaults, metrics.
    pub clock: Arc<dyn crate::clock::Clock>,
    pub defaults: Arc<JobDefaults>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub started: Instant,
    pub request_timeout: Duration,
    /// Set once shutdown begins (`/ready` turns 503).
    pub shutting_down: AtomicBool,
    request_ids: parking_lot::Mutex<IdGenerator>,
    /// The request rate limit, when configured.
    pub rate_limiter: Option<RateLimiter>,
    /// The API keys; no keys, no authentication.
    pub auth: auth::Authenticator,
    /// With keys and a rate limit: each key's window, by the key's index.
    key_windows: Vec<Arc<Window>>,
    /// With keys: wrong keys counted per client address (IPv6: per /64),
    /// in windows of a minute; `None` when not limited.
    failed_attempts: Option<RateLimiter>,
    /// `auth.failed_attempts_per_minute`; 0: no limit.
    failed_attempts_per_minute: u64,
    /// Without keys: what keeps web pages out.
    browser_guard: Option<auth::BrowserGuard>,
    /// `GET /metrics` needs no key.
    pub metrics_public: bool,
    /// Webhook URLs may name loopback and private addresses.
    pub webhooks_allow_private_targets: bool,
    /// Sends webhook attempts (the test event); `None` until the server sets it up.
    pub webhook_client: Option<crate::webhook::client::DeliveryClient>,
    /// How long one delivery attempt may take (`webhooks.timeout_s`).
    pub webhook_timeout: Duration,
}

impl AppState {
    /// The front end of the local engine.
    pub fn new(engine: EngineHandle, request_timeout: Duration) -> Self {
        let clock = engine.clock().clone();
        let defaults = Arc::new(engine.defaults().clone());
        let metrics = engine.metrics().clone();
        Self::with_backend(Arc::new(engine), clock, defaults, metrics, request_timeout)
    }

    /// The front end of any backend.
    pub fn with_backend(
        backend: Arc<dyn Backend>,
        clock: Arc<dyn crate::clock::Clock>,
        defaults: Arc<JobDefaults>,
        metrics: Arc<crate::metrics::Metrics>,
        request_timeout: Duration,
    ) -> Self {
        Self {
            backend,
            clock,
            defaults,
            metrics,
            started: Instant::now(),
            request_timeout,
            shutting_down: AtomicBool::new(false),
            request_ids: parking_lot::Mutex::new(IdGenerator::default()),
            rate_limiter: None,
            auth: auth::Authenticator::default(),
            key_windows: Vec::new(),
            failed_attempts: None,
            failed_attempts_per_minute: auth::FAILED_ATTEMPTS_PER_MINUTE,
            browser_guard: None,
            metrics_public: false,
            webhooks_allow_private_targets: false,
            webhook_client: None,
            webhook_timeout: Duration::from_secs(30),
        }
    }

    /// The checks `config` asks for ahead of the routes, after `with_keys`:
    /// the browser guard of a server without keys (docs/api.md,
    /// "Authentication") with `http.allowed_origins`, and the limit of wrong
    /// keys per address.
    pub fn with_access_checks(self, config: &crate::config::Config) -> Self {
        let mut app = self.with_failed_attempt_limit(config.auth_failed_attempts_per_minute);
        if app.auth.is_enabled() {
            return app;
        }
        // A server bound beyond loopback without keys sits behind a proxy that
        // authenticates (`--insecure-no-auth`), whose host names it cannot
        // know; web pages are kept out all the same.
        let guard = if config.binds_loopback_only() {
            auth::BrowserGuard::new(&config.listen)
        } else {
            auth::BrowserGuard::any_host()
        };
        app.browser_guard = Some(guard.allow_origins(&config.http_allowed_origins));
        app
    }

    /// Requires one of `keys` on every request but the public ones. Call
    /// after `with_rate_limit`.
    pub fn with_keys(mut self, keys: Vec<auth::ApiKey>) -> Self {
        if let Some(limiter) = &self.rate_limiter {
            self.key_windows = keys.iter().map(|_| limiter.new_window()).collect();
        }
        self.auth = auth::Authenticator::new(keys);
        let per_minute = self.failed_attempts_per_minute;
        self.with_failed_attempt_limit(per_minute)
    }

    /// With keys, answers 429 to a client address that has sent
    /// `per_minute` wrong keys in the current minute, before its key is
    /// looked at; 0 turns the limit off.
    pub fn with_failed_attempt_limit(mut self, per_minute: u64) -> Self {
        self.failed_attempts_per_minute = per_minute;
        self.failed_attempts =
            (self.auth.is_enabled() && per_minute > 0).then(|| RateLimiter::new(per_minute, FAILED_ATTEMPTS_WINDOW_S));
        self
    }

    /// Limits each client to `requests` per `window_s` seconds.
    pub fn with_rate_limit(mut self, requests: u64, window_s: u64) -> Self {
        self.rate_limiter = Some(RateLimiter::new(requests, window_s));
        self
    }

    /// The windows of a client connecting from `address` (once per connection).
    pub fn principal(&self, address: std::net::IpAddr) -> Principal {
        Principal {
            requests: self.rate_limiter.as_ref().map(|limiter| limiter.principal(address)),
            failed_attempts: self.failed_attempts.as_ref().map(|limiter| limiter.principal(attempts_key(address))),
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}

/// The windows of one client address, looked up when its connection is
/// accepted; each request then only counts in them.
#[derive(Debug, Clone, Default)]
pub struct Principal {
    /// Its window of the request rate limit, if requests are limited.
    pub requests: Option<Arc<Window>>,
    /// Its count of wrong keys, if they are limited.
    pub failed_attempts: Option<Arc<Window>>,
}

/// The window, in seconds, of `auth.failed_attempts_per_minute`.
const FAILED_ATTEMPTS_WINDOW_S: u64 = 60;

/// Whom wrong keys are counted against: the address, or for IPv6 its /64,
/// which one subscriber usually holds whole (an IPv4 address in IPv6 form
/// counts as itself).
fn attempts_key(address: std::net::IpAddr) -> std::net::IpAddr {
    match address.to_canonical() {
        std::net::IpAddr::V6(v6) => std::net::IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        v4 => v4,
    }
}

/// A successful response: status, JSON body, extra headers.
pub struct Reply {
    pub status: StatusCode,
    pub body: String,
    pub headers: Vec<(HeaderName, String)>,
}

impl Reply {
    pub fn ok(body: String) -> Self {
        Self { status: StatusCode::OK, body, headers: Vec::new() }
    }

    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    pub fn header(mut self, name: HeaderName, value: String) -> Self {
        self.headers.push((name, value));
        self
    }
}

// Header names made once: a name given as text is parsed on every insert.
const SVC_VERSION: HeaderName = HeaderName::from_static("svc-version");
const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Serves one request; never fails (every error becomes an error body).
/// `principal` holds the client's windows ([`AppState::principal`]).
pub async fn serve_request(
    app: Arc<AppState>,
    principal: Principal,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let started = Instant::now();
    let request_id = request_id(&app, request.headers());
    let mut label = None;
    let dispatched = dispatch(&app, &principal, request, &mut label);
    let outcome = match tokio::time::timeout(app.request_timeout, dispatched).await {
        Ok(outcome) => outcome,
        Err(_) => Err(ApiError::new("timeout", "the request was not completed in time; its outcome is unknown")),
    };
    let (status, body, headers) = match outcome {
        Ok(reply) => (reply.status, reply.body, reply.headers),
        Err(error) => (error.status(), error.body(&request_id).to_string(), error.headers),
    };
    let (index, method, template) = label.unwrap_or((router::UNKNOWN_ROUTE.0, "OTHER", router::UNKNOWN_ROUTE.1));
    let seconds = started.elapsed().as_secs_f64();
    app.metrics.request((index, template), method, status.as_u16(), seconds);
    // The route's template, never its path: ids and names stay out of logs.
    tracing::debug!(request_id = %request_id, method, route = template, status = status.as_u16(), seconds, "request");
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let response_headers = response.headers_mut();
    response_headers.insert(CONTENT_TYPE, HeaderValue::from_static(MEDIA_TYPE));
    response_headers.insert(SVC_VERSION, HeaderValue::from_static(SPEC_VERSION));
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response_headers.insert(X_REQUEST_ID, value);
    }
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response_headers.insert(name, value);
        }
    }
    Ok(response)
}

/// A client's `X-Request-Id` (1–128 visible ASCII characters), else `req_<uuidv7>`.
fn request_id(app: &AppState, headers: &HeaderMap) -> String {
    let given = headers.get(&X_REQUEST_ID).and_then(|value| value.to_str().ok());
    match given {
        Some(id)
            if !id.is_empty() && id.len() <= REQUEST_ID_CHARS_MAX && id.bytes().all(|b| (0x21..=0x7e).contains(&b)) =>
        {
            id.to_string()
        }
        _ => {
            let now = crate::clock::Clock::now_ms(app.clock.as_ref());
            let id = app.request_ids.lock().next(now, rand::random());
            let mut text = String::with_capacity(40);
            text.push_str("req_");
            crate::job::json::push_ascii(&mut text, &id.to_hyphenated());
            text
        }
    }
}

/// The order of checks of docs/api.md: without keys, the browser guard;
/// public routes; authentication (an address over its limit of wrong keys,
/// or of failed attempts under the request rate limit, is refused first);
/// route; role; request rate (per key, or per address without keys).
async fn dispatch(
    app: &AppState,
    client: &Principal,
    request: Request<Incoming>,
    label: &mut Option<(usize, &'static str, &'static str)>,
) -> Result<Reply, ApiError> {
    let route = router::route(request.method(), request.uri().path());
    *label = route.as_ref().ok().map(Route::template);
    if let Some(guard) = &app.browser_guard {
        guard.check(request.uri(), request.headers())?;
    }
    if let Ok(route) = &route
        && (route.is_public() || (*route == Route::Metrics && app.metrics_public))
    {
        return respond(app, route.clone(), request).await;
    }
    let now_s = crate::clock::Clock::now_ms(&crate::clock::SystemClock).max(0) as u64 / 1000;
    let address = client.requests.as_deref();
    let mut principal = address;
    if app.auth.is_enabled() {
        if let (Some(limiter), Some(window)) = (&app.failed_attempts, client.failed_attempts.as_deref())
            && limiter.exhausted(window, now_s)
        {
            let mut error = rate_limited(app, limiter, limiter.take(window, now_s), now_s);
            error.message = format!("{} wrong keys from this address this minute; wait for the next", limiter.limit());
            return Err(error.detail("reason", "failed_attempts"));
        }
        if let (Some(limiter), Some(window)) = (&app.rate_limiter, address)
            && limiter.exhausted(window, now_s)
        {
            return Err(rate_limited(app, limiter, limiter.take(window, now_s), now_s));
        }
        let (index, key) = match app.auth.authenticate(request.headers()) {
            Ok(found) => found,
            Err(error) => {
                // A failed attempt counts against the address, and a key
                // that was sent but is wrong against its wrong keys.
                if let (Some(limiter), Some(window)) = (&app.rate_limiter, address) {
                    limiter.take(window, now_s);
                }
                if let (Some(limiter), Some(window)) = (&app.failed_attempts, client.failed_attempts.as_deref())
                    && request.headers().contains_key(hyper::header::AUTHORIZATION)
                {
                    limiter.take(window, now_s);
                }
                return Err(error);
            }
        };
        let route = route.as_ref().map_err(Clone::clone)?;
        if !key.role.allows(route) {
            return Err(auth::forbidden(key.role));
        }
        principal = app.key_windows.get(index).map(Arc::as_ref);
    }
    let route = route?;
    let (Some(limiter), Some(window)) = (&app.rate_limiter, principal) else {
        return respond(app, route, request).await;
    };
    let quota = limiter.take(window, now_s);
    let headers = [
        (X_RATELIMIT_LIMIT, quota.limit.to_string()),
        (X_RATELIMIT_REMAINING, quota.remaining.to_string()),
        (X_RATELIMIT_RESET, quota.reset_at.to_string()),
    ];
    let outcome =
        if quota.allowed { respond(app, route, request).await } else { Err(rate_limited(app, limiter, quota, now_s)) };
    match outcome {
        Ok(mut reply) => {
            reply.headers.extend(headers);
            Ok(reply)
        }
        Err(mut error) => {
            error.headers.extend(headers);
            Err(error)
        }
    }
}

/// 429 `rate_limited` for a window with nothing left.
fn rate_limited(app: &AppState, limiter: &RateLimiter, quota: rate_limit::Quota, now_s: u64) -> ApiError {
    app.metrics.rate_limited.inc();
    let retry_after = quota.reset_at.saturating_sub(now_s).max(1);
    let mut error =
        ApiError::new("rate_limited", format!("more than {} requests in {} s", quota.limit, limiter.window_s()))
            .detail("limit", quota.limit)
            .detail("window_seconds", limiter.window_s())
            .detail("retry_after_seconds", retry_after);
    error.headers.retain(|(name, _)| *name != hyper::header::RETRY_AFTER);
    error.headers.push((hyper::header::RETRY_AFTER, retry_after.to_string()));
    error
}

/// Checks the version and reads the body, then hands the request to its handler.
async fn respond(app: &AppState, route: Route, request: Request<Incoming>) -> Result<Reply, ApiError> {
    if !route.is_public() {
        check_version(request.headers())?;
    }
    let query = request.uri().query().unwrap_or("").to_string();
    let body = if matches!(*request.method(), Method::POST | Method::PATCH | Method::PUT) {
        let limit = if route == Route::BatchJobs { BATCH_BODY_BYTES_MAX } else { REQUEST_BODY_BYTES_MAX };
        read_body(request, limit).await?
    } else {
        Bytes::new()
    };
    handlers::handle(app, route, &query, body).await
}

/// `SVC-Version` is optional; any version with major 1 is accepted.
fn check_version(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get("svc-version") else {
        return Ok(());
    };
    let text = value.to_str().unwrap_or("").trim();
    let major = text.split(['.', '-']).next().unwrap_or("");
    if major == "1" && text.split('-').next().unwrap_or("").split('.').all(|part| part.parse::<u32>().is_ok()) {
        return Ok(());
    }
    Err(ApiError::new("unsupported", format!("SVC-Version {text} is not supported; this server speaks {SPEC_VERSION}"))
        .detail("requested_version", text)
        .detail("supported_versions", vec![SPEC_VERSION]))
}

/// Checks `Content-Type` when a body is present or a type is declared, then
/// reads the body within `limit`. A declared type other than svc/JSON is
/// refused even on an empty body: the types a web page may send without a
/// preflight (forms, `text/plain`) never reach a handler.
async fn read_body(request: Request<Incoming>, limit: usize) -> Result<Bytes, ApiError> {
    let declared = request.headers().get(CONTENT_LENGTH).and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    let content_type = request.headers().get(CONTENT_TYPE).map(|value| value.to_str().unwrap_or("").to_string());
    if let Some(length) = declared
        && length > limit as u64
    {
        check_content_type(content_type.as_deref())?;
        return Err(too_large(limit, length));
    }
    let collected = Limited::new(request.into_body(), limit).collect().await;
    let body = match collected {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            return Err(too_large(limit, limit as u64 + 1));
        }
        Err(_) => {
            return Err(ApiError::invalid_request(None, "the request body could not be read"));
        }
    };
    if !is_empty_body(&body) || content_type.is_some() {
        check_content_type(content_type.as_deref())?;
    }
    Ok(body)
}

fn too_large(limit: usize, actual: u64) -> ApiError {
    ApiError::new("envelope_too_large", format!("the request body is over the limit of {limit} bytes"))
        .detail("limit_bytes", limit)
        .detail("actual_bytes", actual)
}

/// An absent body, white space only, or `{}`.
pub fn is_empty_body(body: &[u8]) -> bool {
    let mut significant = body.iter().filter(|byte| !byte.is_ascii_whitespace());
    match significant.next() {
        None => true,
        Some(b'{') => significant.next() == Some(&b'}') && significant.next().is_none(),
        Some(_) => false,
    }
}

fn check_content_type(content_type: Option<&str>) -> Result<(), ApiError> {
    let Some(content_type) = content_type else {
        return Err(ApiError::invalid_request(None, format!("Content-Type is required: {MEDIA_TYPE}"))
            .detail("reason", "content_type_required"));
    };
    let media_type = content_type.split(';').next().unwrap_or("").trim();
    if media_type.eq_ignore_ascii_case(MEDIA_TYPE) || media_type.eq_ignore_ascii_case("application/json") {
        return Ok(());
    }
    let media_type = media_type.to_ascii_lowercase();
    Err(ApiError::invalid_request(None, format!("Content-Type {media_type} is not supported; send {MEDIA_TYPE}"))
        .detail("reason", "unsupported_media_type"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_keys_count_per_address_and_per_ipv6_64() {
        let key = |text: &str| attempts_key(text.parse().unwrap()).to_string();
        assert_eq!(key("203.0.113.9"), "203.0.113.9");
        assert_eq!(key("::ffff:203.0.113.9"), "203.0.113.9", "an IPv4 client of a dual-stack socket");
        assert_eq!(key("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::");
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("::1"), "::");
    }
}
