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

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Everything.
    Admin,
    /// Enqueue, read and cancel jobs; create and read workflows.
    Producer,
    /// Fetch, ack, nack, heartbeat; read jobs.
    Worker,
    /// Read what an operator reads (every `GET` but webhook
    /// subscriptions), and the dashboard without its buttons.
    Viewer,
}

impl Role {
    pub fn parse(name: &str) -> Option<Role> {
        match name {
            "admin" => Some(Role::Admin),
            "producer" => Some(Role::Producer),
            "worker" => Some(Role::Worker),
            "viewer" => Some(Role::Viewer),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Producer => "producer",
            Role::Worker => "worker",
            Role::Viewer => "viewer",
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
/// It runs before every route, the public ones included.
///
/// Behind a proxy (`--insecure-no-auth`, bound beyond loopback) the host
/// names are the proxy's to know, so only `Origin` is checked there.
/// Browsers send `Origin` with every `POST`, same-origin ones too, so the
/// pages of a web front end served through such a proxy need its origin in
/// `http.allowed_origins`.
#[derive(Debug, Clone, Default)]
pub struct BrowserGuard {
    /// Host names (without port) besides the loopback ones; `None`: any
    /// host (the Host check is off).
    hosts: Option<Vec<String>>,
    /// Origins (`scheme://host[:port]`, as [`origin_of`] writes them) whose
    /// pages may send requests.
    allowed_origins: Vec<String>,
}

impl BrowserGuard {
    /// Allows the loopback names and the host of `listen` (`host:port`).
    pub fn new(listen: &str) -> BrowserGuard {
        let host = authority_host(listen).unwrap_or_default();
        let hosts = if host.is_empty() { Vec::new() } else { vec![host] };
        BrowserGuard { hosts: Some(hosts), allowed_origins: Vec::new() }
    }

    /// Checks `Origin` only: for a server behind a proxy.
    pub fn any_host() -> BrowserGuard {
        BrowserGuard { hosts: None, allowed_origins: Vec::new() }
    }

    /// Lets requests from pages of `origins` through (`http.allowed_origins`,
    /// each as [`origin_of`] writes it).
    pub fn allow_origins(mut self, origins: &[String]) -> BrowserGuard {
        self.allowed_origins = origins.to_vec();
        self
    }

    /// 403 for a request from a web page not allowed, or for another host's
    /// name: in the `Host` header (one, of visible ASCII, a well-formed
    /// `host[:port]`) and in the authority of an absolute-form target.
    /// As [`BrowserGuard::check`], for the dashboard's own pages: their
    /// forms may also come from the origin of the host they were served on.
    pub fn check_own_page(&self, uri: &hyper::Uri, headers: &HeaderMap) -> Result<(), ApiError> {
        let host = headers.get(hyper::header::HOST).and_then(|value| value.to_str().ok()).unwrap_or("");
        let own = |origin: &str| {
            ["http://", "https://"].iter().any(|scheme| origin.trim().eq_ignore_ascii_case(&format!("{scheme}{host}")))
        };
        let mut without_own = headers.clone();
        if headers.get_all(hyper::header::ORIGIN).iter().all(|origin| origin.to_str().is_ok_and(own)) {
            without_own.remove(hyper::header::ORIGIN);
        }
        self.check(uri, &without_own)
    }

    pub fn check(&self, uri: &hyper::Uri, headers: &HeaderMap) -> Result<(), ApiError> {
        for origin in headers.get_all(hyper::header::ORIGIN) {
            let allowed = origin.to_str().is_ok_and(|origin| {
                self.allowed_origins.iter().any(|allowed| allowed.eq_ignore_ascii_case(origin.trim()))
            });
            if !allowed {
                return Err(ApiError::new(
                    "forbidden",
                    "requests from web pages are refused: svc has no keys configured, so it serves local programs \
                     and the origins of http.allowed_origins only",
                )
                .detail("reason", "origin_not_allowed"));
            }
        }
        let Some(hosts) = &self.hosts else {
            return Ok(());
        };
        let mut named = headers.get_all(hyper::header::HOST).iter();
        let header = named.next();
        if named.next().is_some() {
            return Err(host_not_allowed("a request must carry one Host header".to_string()));
        }
        let header = match header.map(|value| value.to_str()) {
            None => None,
            Some(Ok(text)) => Some(text),
            Some(Err(_)) => return Err(host_not_allowed("the Host header is not a host name".to_string())),
        };
        let target = uri.authority().map(|authority| authority.as_str());
        for authority in [header, target].into_iter().flatten() {
            let Some(name) = authority_host(authority) else {
                return Err(host_not_allowed("the Host header or request target names no valid host".to_string()));
            };
            let loopback = name == "localhost"
                || name.ends_with(".localhost")
                || name.parse::<std::net::IpAddr>().is_ok_and(|address| address.is_loopback());
            if !loopback && !hosts.contains(&name) {
                return Err(host_not_allowed(format!("the host name {name} is not this server's")));
            }
        }
        Ok(())
    }
}

fn host_not_allowed(message: String) -> ApiError {
    ApiError::new("forbidden", message).detail("reason", "host_not_allowed")
}

/// The host of `host[:port]` or `[v6][:port]`, in lower case; `None` for
/// anything else (user info, a port that is not a number, characters no
/// host name or IPv4 address has, an empty host).
fn authority_host(authority: &str) -> Option<String> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(rest) => {
            let (inside, after) = rest.split_once(']')?;
            inside.parse::<std::net::Ipv6Addr>().ok()?;
            (inside, after)
        }
        None => {
            let (host, port) = authority.split_at(authority.find(':').unwrap_or(authority.len()));
            let name_bytes = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_';
            if host.is_empty() || !host.bytes().all(name_bytes) {
                return None;
            }
            (host, port)
        }
    };
    let port_ok = port.is_empty()
        || port.strip_prefix(':').is_some_and(|digits| digits.len() <= 5 && digits.bytes().all(|b| b.is_ascii_digit()));
    port_ok.then(|| host.to_ascii_lowercase())
}

/// An allowed origin as browsers send it: `scheme://host[:port]`, in lower
/// case, without a default port; `None` unless `text` is an http or https
/// URL with nothing but a scheme, a host and a port (a path of `/` at most).
pub fn origin_of(text: &str) -> Option<String> {
    let url = url::Url::parse(text).ok()?;
    let bare = matches!(url.scheme(), "http" | "https")
        && url.host().is_some()
        && url.username().is_empty()
        && url.password().is_none()
        && url.path() == "/"
        && url.query().is_none()
        && url.fragment().is_none();
    bare.then(|| url.origin().ascii_serialization())
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

    fn request(pairs: &[(hyper::header::HeaderName, &[u8])]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(name.clone(), hyper::header::HeaderValue::from_bytes(value).unwrap());
        }
        headers
    }

    #[test]
    fn the_browser_guard_lets_local_programs_in_and_web_pages_out() {
        use hyper::header::{HOST, ORIGIN};
        let guard = BrowserGuard::new("svc.internal:8080");
        let path: hyper::Uri = "/svc/v1/queues".parse().unwrap();
        let check = |pairs: &[(hyper::header::HeaderName, &[u8])]| guard.check(&path, &request(pairs));
        for host in [
            "127.0.0.1:8080",
            "localhost:9",
            "[::1]:8080",
            "127.9.9.9",
            "svc.internal:8080",
            "LOCALHOST",
            "a.localhost:",
        ] {
            assert!(check(&[(HOST, host.as_bytes())]).is_ok(), "{host}");
        }
        for host in ["evil.example:8080", "10.0.0.1", "[::2]:80", "svc.internal.evil.example"] {
            let error = check(&[(HOST, host.as_bytes())]).unwrap_err();
            assert_eq!((error.code, &error.details["reason"]), ("forbidden", &"host_not_allowed".into()), "{host}");
        }
        // Malformed or unreadable: refused, never let through.
        let malformed: &[&[u8]] = &[
            b"",
            b"127.0.0.1\xff",
            b"localhost\xc3\xa9",
            b"[::1]junk",
            b"[::1",
            b"[not-v6]:80",
            b"127.0.0.1:abc",
            b"127.0.0.1:80:80",
            b"::1",
            b"user@127.0.0.1",
            b"127.0.0.1 evil.example",
            b"localhost:123456",
            b":8080",
        ];
        for host in malformed {
            let error = check(&[(HOST, host)]).unwrap_err();
            assert_eq!(error.details["reason"], "host_not_allowed", "{:?}", String::from_utf8_lossy(host));
        }
        let two = check(&[(HOST, b"127.0.0.1:8080"), (HOST, b"evil.example")]).unwrap_err();
        assert_eq!(two.details["reason"], "host_not_allowed", "the second Host header counts too");
        assert!(check(&[(HOST, b"127.0.0.1"), (HOST, b"127.0.0.1")]).is_err(), "one Host header, always");
        // An absolute-form target names the host the request is for.
        for (target, ok) in [
            ("http://evil.example/svc/v1/queues", false),
            ("http://evil.example:8080/svc/v1/queues", false),
            ("http://user@127.0.0.1/svc/v1/queues", false),
            ("http://127.0.0.1:8080/svc/v1/queues", true),
            ("http://svc.internal:8080/svc/v1/queues", true),
        ] {
            let uri: hyper::Uri = target.parse().unwrap();
            assert_eq!(guard.check(&uri, &request(&[(HOST, b"127.0.0.1")])).is_ok(), ok, "{target}");
        }
        assert_eq!(check(&[(ORIGIN, b"http://127.0.0.1:8080")]).unwrap_err().details["reason"], "origin_not_allowed");
        assert!(check(&[(ORIGIN, b"null")]).is_err());
        assert!(check(&[]).is_ok(), "HTTP/1.0 programs may send no Host");
    }

    #[test]
    fn allowed_origins_pass_and_behind_a_proxy_only_the_origin_is_checked() {
        use hyper::header::{HOST, ORIGIN};
        let admin = origin_of("https://Admin.Example.com:443/").unwrap();
        assert_eq!(admin, "https://admin.example.com");
        let path: hyper::Uri = "/svc/v1/queues".parse().unwrap();
        for guard in [BrowserGuard::new("127.0.0.1:8080"), BrowserGuard::any_host()] {
            let guard = guard.allow_origins(std::slice::from_ref(&admin));
            let check = |pairs: &[(hyper::header::HeaderName, &[u8])]| guard.check(&path, &request(pairs));
            assert!(check(&[(ORIGIN, b"https://admin.example.com"), (HOST, b"127.0.0.1")]).is_ok());
            for origin in
                [&b"https://admin.example.com:8443"[..], b"http://admin.example.com", b"null", b"https://evil.example"]
            {
                let error = check(&[(ORIGIN, origin)]).unwrap_err();
                assert_eq!(error.details["reason"], "origin_not_allowed", "{}", String::from_utf8_lossy(origin));
            }
            let both = check(&[(ORIGIN, b"https://admin.example.com"), (ORIGIN, b"https://evil.example")]);
            assert!(both.is_err(), "every Origin header must be allowed");
        }
        let proxied = BrowserGuard::any_host();
        for host in [&b"svc.example.com"[..], b"evil.example", b"\xff"] {
            assert!(proxied.check(&path, &request(&[(HOST, host)])).is_ok(), "the proxy's to judge");
        }
        assert!(proxied.check(&path, &request(&[(ORIGIN, b"https://evil.example")])).is_err());
        for bad in
            ["https://admin.example.com/app", "https://admin.example.com?x", "ftp://admin.example.com", "*", "null"]
        {
            assert_eq!(origin_of(bad), None, "{bad}");
        }
        assert_eq!(origin_of("http://[::1]:8080").as_deref(), Some("http://[::1]:8080"));
    }
}
