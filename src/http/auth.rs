//! API keys and roles (docs/api.md, "Authentication"): `Authorization:
//! Bearer <key>`, checked against the SHA-256 digest of every configured key
//! in constant time, and which role may use which route.
//!
//! Key material never leaves this module: an entry keeps only its digest,
//! and errors, logs and rate limits name the entry. A digest of a well-known
//! weak key is refused, and so, by the length rule, is such a key as text.

use hyper::header::{AUTHORIZATION, HeaderMap, WWW_AUTHENTICATE};
use sha2::{Digest, Sha256};

use super::error::ApiError;
use super::router::Route;

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Everything.
    Admin,
    /// Enqueue, read and cancel jobs; create and read workflows.
    Producer,
    /// Fetch, ack, nack, heartbeat; read jobs.
    Worker,
}

impl Role {
    pub fn parse(name: &str) -> Option<Role> {
        match name {
            "admin" => Some(Role::Admin),
            "producer" => Some(Role::Producer),
            "worker" => Some(Role::Worker),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Producer => "producer",
            Role::Worker => "worker",
        }
    }

    /// Whether this role may use `route` (public routes need no key at all).
    pub fn allows(self, route: &Route) -> bool {
        use Route::*;
        match route {
            Manifest | Health | Ready | ErrorCatalog | Metrics | OpenApi | GetJob(_) => true,
            CreateJob | BatchJobs | ActivateJob(_) | CancelJob(_) | CreateWorkflow | GetWorkflow(_) => {
                matches!(self, Role::Admin | Role::Producer)
            }
            Fetch | Ack | Nack | AckById(_) | FailById(_) | Heartbeat => matches!(self, Role::Admin | Role::Worker),
            CancelWorkflow(_)
            | Queues
            | QueueStats(_)
            | PauseQueue(..)
            | Events
            | Workers
            | Worker(_)
            | ForgetWorker(_)
            | SignalWorker(..)
            | DeadLetter
            | DeadLetterRetry(_)
            | DeadLetterDelete(_)
            | Crons
            | RegisterCron
            | GetCron(_)
            | PatchCron(_)
            | DeleteCron(_)
            | Schemas
            | RegisterSchema
            | GetSchema(_)
            | DeleteSchema(_)
            | Webhooks
            | CreateWebhook
            | GetWebhook(_)
            | PatchWebhook(_)
            | DeleteWebhook(_)
            | AddWebhookSecret(_)
            | DropPreviousWebhookSecret(_)
            | TestWebhook(_) => self == Role::Admin,
        }
    }
}

/// One configured key: its name, role and the SHA-256 of the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub name: String,
    pub role: Role,
    pub digest: [u8; 32],
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the digest: a digest of a weak key is as good as the key.
        f.debug_struct("ApiKey").field("name", &self.name).field("role", &self.role).finish_non_exhaustive()
    }
}

/// Wrong keys one client address may send a minute, by default
/// (`auth.failed_attempts_per_minute`).
pub const FAILED_ATTEMPTS_PER_MINUTE: u64 = 10;

/// The shortest plain key accepted in the configuration.
pub const KEY_CHARS_MIN: usize = 32;

/// Keys found in examples and first attempts: their digests are refused as
/// `key_sha256`. None is [`KEY_CHARS_MIN`] long, so none passes as text.
pub const WEAK_KEYS: &[&str] = &[
    "",
    "test",
    "testing",
    "password",
    "passw0rd",
    "secret",
    "changeme",
    "changeit",
    "admin",
    "root",
    "key",
    "svc",
    "123456",
    "12345678",
    "123456789",
    "api_key",
    "apikey",
    "api-key",
    "token",
    "letmein",
    "qwerty",
    "default",
    "example",
    "demo",
    "dev",
];

/// Whether `digest` is the SHA-256 of one of [`WEAK_KEYS`].
fn is_weak_digest(digest: &[u8; 32]) -> bool {
    static WEAK: std::sync::LazyLock<Vec<[u8; 32]>> =
        std::sync::LazyLock::new(|| WEAK_KEYS.iter().map(|key| Sha256::digest(key.as_bytes()).into()).collect());
    WEAK.contains(digest)
}

impl ApiKey {
    /// An entry from a plain key (at least [`KEY_CHARS_MIN`] characters).
    pub fn from_key(name: String, role: Role, key: &str) -> Result<ApiKey, String> {
        if key.chars().count() < KEY_CHARS_MIN {
            return Err(format!("the key of {name} is shorter than {KEY_CHARS_MIN} characters"));
        }
        Ok(ApiKey { name, role, digest: Sha256::digest(key.as_bytes()).into() })
    }

    /// An entry from the lowercase or uppercase hex SHA-256 of a key; not
    /// the digest of one of [`WEAK_KEYS`].
    pub fn from_sha256(name: String, role: Role, hex: &str) -> Result<ApiKey, String> {
        let bytes = hex.as_bytes();
        if bytes.len() != 64 || !bytes.iter().all(u8::is_ascii_hexdigit) {
            return Err(format!("key_sha256 of {name} must be 64 hex digits"));
        }
        let mut digest = [0u8; 32];
        for (index, pair) in bytes.chunks_exact(2).enumerate() {
            let text = std::str::from_utf8(pair).expect("hex digits are ASCII");
            digest[index] = u8::from_str_radix(text, 16).expect("checked to be hex digits");
        }
        if is_weak_digest(&digest) {
            return Err(format!(
                "key_sha256 of {name} is the digest of a well-known weak key; \
                 give the digest of a random key (see README.md, \"Run it in production\")"
            ));
        }
        Ok(ApiKey { name, role, digest })
    }
}

/// The configured keys; authentication is on when there is at least one.
#[derive(Debug, Clone, Default)]
pub struct Authenticator {
    keys: Vec<ApiKey>,
}

impl Authenticator {
    pub fn new(keys: Vec<ApiKey>) -> Authenticator {
        Authenticator { keys }
    }

    pub fn is_enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    pub fn keys(&self) -> &[ApiKey] {
        &self.keys
    }

    /// The entry (its index and itself) whose key the request presents, or
    /// 401. The presented key's digest is compared with every entry's,
    /// whatever matched before, so the time taken does not tell which.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<(usize, &ApiKey), ApiError> {
        let presented = headers
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|key| !key.is_empty());
        let Some(presented) = presented else {
            return Err(unauthorized("send Authorization: Bearer <key>"));
        };
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = usize::MAX;
        for (index, key) in self.keys.iter().enumerate() {
            let difference = key.digest.iter().zip(&digest).fold(0u8, |acc, (a, b)| acc | (a ^ b));
            // Branch-free: keeps the first match without ending the loop.
            let matched = usize::from(difference == 0);
            let unset = usize::from(found == usize::MAX);
            found = (matched & unset) * index + (1 - (matched & unset)) * found;
        }
        match self.keys.get(found) {
            Some(key) => Ok((found, key)),
            None => Err(unauthorized("the key is not valid")),
        }
    }
}

fn unauthorized(message: &str) -> ApiError {
    let mut error = ApiError::new("unauthorized", message);
    error.headers.push((WWW_AUTHENTICATE, "Bearer realm=\"svc\"".to_string()));
    error
}

/// What protects a server without keys from browsers: a web page may make
/// a browser send requests to a loopback port (a form, `fetch` with
/// `no-cors`, or a DNS name rebound to 127.0.0.1). Such a request carries an
/// `Origin`, or a `Host` that is not the server's; real clients send neither.
#[derive(Debug, Clone, Default)]
pub struct BrowserGuard {
    /// Host names (without port) besides the loopback ones.
    extra_hosts: Vec<String>,
}

impl BrowserGuard {
    /// Allows the loopback names and the host of `listen` (`host:port`).
    pub fn new(listen: &str) -> BrowserGuard {
        let host = host_without_port(listen).to_ascii_lowercase();
        BrowserGuard { extra_hosts: if host.is_empty() { Vec::new() } else { vec![host] } }
    }

    /// 403 for a request from a web page, or for another host's name.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if headers.contains_key(hyper::header::ORIGIN) {
            return Err(ApiError::new(
                "forbidden",
                "requests from web pages are refused: svc has no keys configured, so it serves local programs only",
            )
            .detail("reason", "origin_not_allowed"));
        }
        let Some(host) = headers.get(hyper::header::HOST).and_then(|value| value.to_str().ok()) else {
            return Ok(());
        };
        let name = host_without_port(host).to_ascii_lowercase();
        let loopback = name == "localhost"
            || name.ends_with(".localhost")
            || name.parse::<std::net::IpAddr>().is_ok_and(|address| address.is_loopback());
        if loopback || self.extra_hosts.contains(&name) {
            return Ok(());
        }
        Err(ApiError::new("forbidden", format!("the host name {name} is not this server's"))
            .detail("reason", "host_not_allowed"))
    }
}

/// `host` of `host:port`, `[::1]:port` or a bare name.
fn host_without_port(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

/// 403 for a key whose role may not use the route.
pub fn forbidden(role: Role) -> ApiError {
    ApiError::new("forbidden", format!("a {} key may not do this", role.as_str())).detail("role", role.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(authorization: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, authorization.parse().unwrap());
        headers
    }

    #[test]
    fn a_key_is_found_by_its_digest_whichever_way_it_was_configured() {
        let plain = "p".repeat(40);
        let hashed = "h".repeat(40);
        let hex: String = Sha256::digest(hashed.as_bytes()).iter().map(|byte| format!("{byte:02x}")).collect();
        let keys = Authenticator::new(vec![
            ApiKey::from_key("ops".into(), Role::Admin, &plain).unwrap(),
            ApiKey::from_sha256("ci".into(), Role::Producer, &hex.to_uppercase()).unwrap(),
        ]);
        assert_eq!(keys.authenticate(&headers(&format!("Bearer {plain}"))).unwrap().1.name, "ops");
        assert_eq!(keys.authenticate(&headers(&format!("Bearer {hashed}"))).unwrap().0, 1);
        for wrong in ["Bearer nope", "Basic abc", "Bearer ", &format!("Bearer {plain}x")] {
            let error = keys.authenticate(&headers(wrong)).unwrap_err();
            assert_eq!(error.code, "unauthorized");
        }
        assert!(keys.authenticate(&HeaderMap::new()).is_err());
    }

    #[test]
    fn keys_must_be_long_and_digests_well_formed() {
        assert!(ApiKey::from_key("short".into(), Role::Worker, "x".repeat(31).as_str()).is_err());
        assert!(ApiKey::from_sha256("bad".into(), Role::Worker, "abc").is_err());
        assert!(ApiKey::from_sha256("bad".into(), Role::Worker, &"g".repeat(64)).is_err());
        assert!(WEAK_KEYS.iter().all(|key| key.chars().count() < KEY_CHARS_MIN));
        let debug = format!("{:?}", ApiKey::from_key("ops".into(), Role::Admin, &"s".repeat(40)).unwrap());
        assert!(debug.contains("ops") && !debug.contains("digest"));
    }

    #[test]
    fn digests_of_weak_keys_are_refused_in_either_case() {
        let hex = |key: &str| -> String { Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect() };
        // Known values, so the list is hashed as the documentation's recipe hashes it.
        assert_eq!(hex("test"), "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
        assert_eq!(hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        for weak in ["test", "password", "secret", "changeme", "admin", "key", "svc", "123456", "", "api_key"]
            .into_iter()
            .chain(["apikey", "token", "letmein", "qwerty", "default"])
        {
            for digest in [hex(weak), hex(weak).to_uppercase()] {
                let error = ApiKey::from_sha256("shop".into(), Role::Producer, &digest).unwrap_err();
                assert!(error.contains("shop") && error.contains("weak"), "{weak:?}: {error}");
            }
        }
        assert!(ApiKey::from_sha256("shop".into(), Role::Producer, &hex("Test")).is_ok(), "only the listed keys");
        assert!(ApiKey::from_sha256("shop".into(), Role::Producer, &hex(&"r".repeat(32))).is_ok());
    }

    #[test]
    fn the_browser_guard_lets_local_programs_in_and_web_pages_out() {
        let guard = BrowserGuard::new("svc.internal:8080");
        let with = |name: hyper::header::HeaderName, value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(name, value.parse().unwrap());
            headers
        };
        for host in ["127.0.0.1:8080", "localhost:9", "[::1]:8080", "127.9.9.9", "svc.internal:8080", "LOCALHOST"] {
            assert!(guard.check(&with(hyper::header::HOST, host)).is_ok(), "{host}");
        }
        for host in ["evil.example:8080", "10.0.0.1", "[::2]:80"] {
            assert!(guard.check(&with(hyper::header::HOST, host)).is_err(), "{host}");
        }
        assert!(guard.check(&with(hyper::header::ORIGIN, "http://127.0.0.1:8080")).is_err());
        assert!(guard.check(&HeaderMap::new()).is_ok());
    }

    #[test]
    fn roles_follow_the_table() {
        assert!(Role::Producer.allows(&Route::CreateJob) && !Role::Worker.allows(&Route::CreateJob));
        assert!(Role::Worker.allows(&Route::Fetch) && !Role::Producer.allows(&Route::Fetch));
        assert!(Role::Worker.allows(&Route::GetJob("x".into())));
        assert!(!Role::Producer.allows(&Route::CancelWorkflow("x".into())));
        assert!(Role::Admin.allows(&Route::Crons) && !Role::Producer.allows(&Route::Crons));
    }
}
