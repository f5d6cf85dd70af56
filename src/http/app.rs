//! The front end's state (`AppState`: the backend, its wiring, keys,
//! limits and guards) and a handler's reply (`Reply`): what every resource
//! module uses, below the router and the dispatch.

use hyper::StatusCode;
use hyper::header::HeaderName;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::auth;
use super::rate_limit::{RateLimiter, Window};
use crate::backend::Backend;
use crate::engine::EngineHandle;
use crate::job::{IdGenerator, JobDefaults};

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
    pub shutting_down: Arc<AtomicBool>,
    /// Signs dashboard sessions.
    pub(super) session_key: super::ui::session::SessionKey,
    /// Put before every dashboard link (`ui.prefix`): the path a reverse
    /// proxy serves svc under.
    pub ui_prefix: String,
    /// Open event streams (`GET /events/stream`), bounded.
    pub(super) event_streams: Arc<super::body::StreamSlots>,
    pub(super) request_ids: parking_lot::Mutex<IdGenerator>,
    /// The request rate limit, when configured.
    pub rate_limiter: Option<RateLimiter>,
    /// The API keys; no keys, no authentication.
    pub auth: auth::Authenticator,
    /// With keys and a rate limit: each key's window, by the key's index.
    pub(super) key_windows: Vec<Arc<Window>>,
    /// With keys: wrong keys counted per client address (IPv6: per /64),
    /// in windows of a minute; `None` when not limited.
    pub(super) failed_attempts: Option<RateLimiter>,
    /// `auth.failed_attempts_per_minute`; 0: no limit.
    failed_attempts_per_minute: u64,
    /// Without keys: what keeps web pages out.
    pub(super) browser_guard: Option<auth::BrowserGuard>,
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
            shutting_down: Arc::new(AtomicBool::new(false)),
            event_streams: Arc::default(),
            session_key: super::ui::session::SessionKey::default(),
            ui_prefix: String::new(),
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

    /// Keeps web pages away from a server without keys (docs/api.md,
    /// "Authentication"): `guard` checks Host and Origin ahead of the
    /// routes. A server with keys needs no guard and keeps none. Call after
    /// `with_keys`.
    pub fn with_browser_guard(mut self, guard: auth::BrowserGuard) -> Self {
        if !self.auth.is_enabled() {
            self.browser_guard = Some(guard);
        }
        self
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

    /// A dashboard link: `path` (empty: the overview) under the prefix.
    pub fn ui_link(&self, path: &str) -> String {
        format!("{}{}{path}", self.ui_prefix, super::ui::session::UI_PATH)
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
    /// A body sent as it comes, in place of `body` (an event stream).
    pub stream: Option<super::body::EventStream>,
}

impl Reply {
    pub fn ok(body: String) -> Self {
        Self { status: StatusCode::OK, body, headers: Vec::new(), stream: None }
    }

    pub fn streaming(mut self, stream: super::body::EventStream) -> Self {
        self.stream = Some(stream);
        self
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

/// An absent body, white space only, or `{}`.
pub fn is_empty_body(body: &[u8]) -> bool {
    let mut significant = body.iter().filter(|byte| !byte.is_ascii_whitespace());
    match significant.next() {
        None => true,
        Some(b'{') => significant.next() == Some(&b'}') && significant.next().is_none(),
        Some(_) => false,
    }
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
