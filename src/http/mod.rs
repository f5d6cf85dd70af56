//! The hyper front end. It only translates: HTTP + JSON in, engine commands
//! through the handle, JSON out. Order of checks follows docs/api.md, "Order of checks".

// `ApiError` is a few words larger than clippy likes inside `Result`; it only
// travels the cold error path once per request, so boxing it buys nothing.
#![allow(clippy::result_large_err)]

mod admin;
mod app;
pub mod auth;
pub mod body;
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
pub mod stream;
pub mod ui;
mod webhooks;
mod workers;
mod workflows;

pub use app::{AppState, MEDIA_TYPE, Principal, Reply, SPEC_VERSION, is_empty_body};
pub use error::ApiError;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response};
use std::sync::Arc;
use std::time::Instant;

use crate::limits::{BATCH_BODY_BYTES_MAX, REQUEST_BODY_BYTES_MAX, REQUEST_ID_CHARS_MAX};
use rate_limit::RateLimiter;
use router::Route;

// Header names made once: a name given as text is parsed on every insert.
const SVC_VERSION: HeaderName = HeaderName::from_static("svc-version");
const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The metrics labels of the dashboard's pages and actions (after the
/// API's routes, below `metrics::ROUTES_MAX`).
const UI_PAGES: (usize, &str, &str) = (70, "GET", "/ui");
const UI_ACTIONS: (usize, &str, &str) = (71, "POST", "/ui");

/// Serves one request; never fails (every error becomes an error body).
/// `principal` holds the client's windows ([`AppState::principal`]).
pub async fn serve_request(
    app: Arc<AppState>,
    principal: Principal,
    request: Request<Incoming>,
) -> Result<Response<body::ResponseBody>, std::convert::Infallible> {
    let started = Instant::now();
    let request_id = request_id(&app, request.headers());
    let mut label = None;
    let dispatched = dispatch(&app, &principal, request, &mut label);
    let outcome = match tokio::time::timeout(app.request_timeout, dispatched).await {
        Ok(outcome) => outcome,
        Err(_) => Err(ApiError::new("timeout", "the request was not completed in time; its outcome is unknown")),
    };
    let (status, body, headers, streamed) = match outcome {
        Ok(reply) => (reply.status, reply.body, reply.headers, reply.stream),
        Err(error) => (error.status(), error.body(&request_id).to_string(), error.headers, None),
    };
    let (index, method, template) = label.unwrap_or((router::UNKNOWN_ROUTE.0, "OTHER", router::UNKNOWN_ROUTE.1));
    let seconds = started.elapsed().as_secs_f64();
    app.metrics.request((index, template), method, status.as_u16(), seconds);
    // The route's template, never its path: ids and names stay out of logs.
    tracing::debug!(request_id = %request_id, method, route = template, status = status.as_u16(), seconds, "request");
    let body = match streamed {
        Some(stream) => http_body_util::Either::Right(stream),
        None => http_body_util::Either::Left(Full::new(Bytes::from(body))),
    };
    let mut response = Response::new(body);
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
    if ui::is_ui_path(request.uri().path()) {
        // The dashboard has its own sign-in (a session cookie) and forms.
        *label = Some(if request.method() == Method::POST { UI_ACTIONS } else { UI_PAGES });
        return Ok(ui::serve(app, client, request).await);
    }
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
        if !route.allowed_for(key.role) {
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
    if route == Route::EventStream {
        return stream::open(app, &query, request.headers()).await;
    }
    let body = if matches!(*request.method(), Method::POST | Method::PATCH | Method::PUT) {
        let limit =
            if route == Route::Jobs(jobs::JobRoute::Batch) { BATCH_BODY_BYTES_MAX } else { REQUEST_BODY_BYTES_MAX };
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
