//! Sending one delivery attempt (docs/api.md, "Deliveries"): HTTPS only,
//! every resolved address checked by the guard and the connection made to
//! the checked addresses (so a name cannot be re-pointed between check and
//! connect), no redirects, no proxies, TLS 1.2 or later with certificate
//! and host name verified, against the system's roots plus an optional
//! extra bundle whose certificates are also pinned as receivers' own.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::guard::{AddressClass, classify};
use super::signature::sign;
use super::subscription::Subscription;
use super::verifier::ReceiverVerifier;
use crate::clock::Millis;

/// Why an attempt failed, as the test answer and the logs name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptError {
    /// The URL names, or the host resolves to, an address deliveries may not go to.
    BlockedAddress,
    /// No answer within the attempt's time.
    Timeout,
    /// The host could not be resolved or reached.
    ConnectionFailed,
    /// The TLS handshake or certificate check failed.
    Tls,
    /// The receiver answered a redirect (never followed).
    Redirect,
    /// The receiver answered, not with a 2xx.
    HttpStatus,
}

impl AttemptError {
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptError::BlockedAddress => "blocked_address",
            AttemptError::Timeout => "timeout",
            AttemptError::ConnectionFailed => "connection_failed",
            AttemptError::Tls => "tls_error",
            AttemptError::Redirect => "redirect",
            AttemptError::HttpStatus => "http_status",
        }
    }
}

/// How long a connection to a receiver stays open unused.
const IDLE_CONNECTION_KEPT: Duration = Duration::from_secs(90);

/// The longest [`AttemptOutcome::detail`], in bytes.
const DETAIL_MAX: usize = 300;

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptOutcome {
    /// The receiver's status, when it answered.
    pub status: Option<u16>,
    pub error: Option<AttemptError>,
    /// Why the attempt failed, in a short sentence for people (the TLS or
    /// connection error, the time allowed, the status): never the
    /// receiver's body, nor a secret. Set whenever `error` is.
    pub detail: Option<String>,
    /// `Retry-After` of a 429, in seconds.
    pub retry_after_s: Option<u64>,
    pub elapsed_ms: u64,
}

impl AttemptOutcome {
    pub fn succeeded(&self) -> bool {
        self.error.is_none()
    }
}

/// One delivery to send: the body is the event envelope, serialised once
/// and shared, not copied, by every attempt ([`shared_body`]).
pub struct Attempt<'a> {
    /// As stored: the secrets that sign are the ones in force at `now`.
    pub subscription: &'a Subscription,
    pub delivery_id: &'a str,
    pub event_type: &'a str,
    pub body: Bytes,
    /// When this attempt is signed; `X-SVC-Timestamp` carries its seconds.
    pub now: Millis,
    pub timeout: Duration,
}

/// A delivery's body as the request sends it, without copying it.
pub fn shared_body(body: &Arc<str>) -> Bytes {
    struct Shared(Arc<str>);
    impl AsRef<[u8]> for Shared {
        fn as_ref(&self) -> &[u8] {
            self.0.as_bytes()
        }
    }
    Bytes::from_owner(Shared(body.clone()))
}

/// Sends delivery attempts; cheap to clone (one connection pool).
#[derive(Clone)]
pub struct DeliveryClient {
    http: reqwest::Client,
    allow_private: bool,
}

/// A name that resolved to an address deliveries may not go to. The
/// address itself is not told: the guard's answer should not map a
/// private network for whoever can create subscriptions.
#[derive(Debug)]
enum Blocked {
    NoAddress,
    /// Loopback or private, refused without `webhooks.allow_private_targets`.
    Private,
    Forbidden,
}

impl Blocked {
    /// Why the addresses of a name are refused, if they are.
    fn judge(addresses: &[SocketAddr], allow_private: bool) -> Option<Blocked> {
        if addresses.is_empty() {
            return Some(Blocked::NoAddress);
        }
        let classes = addresses.iter().map(|address| classify(address.ip()));
        if classes.clone().any(|class| class == AddressClass::Forbidden) {
            Some(Blocked::Forbidden)
        } else if classes.clone().any(|class| !class.allowed(allow_private)) {
            Some(Blocked::Private)
        } else {
            None
        }
    }
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Blocked::NoAddress => "the host resolves to no address",
            Blocked::Private => {
                "the host resolves to a loopback or private address, allowed only with \
                 webhooks.allow_private_targets"
            }
            Blocked::Forbidden => "the host resolves to an address deliveries may never go to",
        })
    }
}

impl std::error::Error for Blocked {}

/// Resolves with the system resolver, then refuses the whole name if any of
/// its addresses is forbidden; the addresses handed back are the ones the
/// connection is made to.
struct GuardedResolver {
    allow_private: bool,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_private = self.allow_private;
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if let Some(blocked) = Blocked::judge(&addresses, allow_private) {
                return Err(Box::new(blocked) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(addresses.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

impl DeliveryClient {
    /// A client for `webhooks.allow_private_targets` and `webhooks.extra_ca_file`.
    pub fn new(allow_private: bool, extra_ca_file: Option<&Path>) -> Result<DeliveryClient, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for certificate in rustls_native_certs::load_native_certs().certs {
            // A system certificate rustls cannot read is skipped, as browsers do.
            let _ = roots.add(certificate);
        }
        // The extra file's certificates are roots, and also pinned: one the
        // receiver presents as its own is taken as it is (self-signed receivers).
        let mut pinned = Vec::new();
        if let Some(path) = extra_ca_file {
            let text =
                std::fs::read(path).map_err(|error| format!("webhooks.extra_ca_file {}: {error}", path.display()))?;
            for certificate in rustls_pemfile_certs(&text) {
                roots
                    .add(certificate.clone())
                    .map_err(|error| format!("webhooks.extra_ca_file {}: {error}", path.display()))?;
                pinned.push(certificate);
            }
            if pinned.is_empty() {
                return Err(format!("webhooks.extra_ca_file {} holds no PEM certificate", path.display()));
            }
        }
        let verifier = ReceiverVerifier::new(roots, pinned, provider.clone())?;
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|error| format!("TLS setup: {error}"))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .dns_resolver(GuardedResolver { allow_private })
            // Attempts to a receiver reuse its open connections (docs/api.md,
            // "Where deliveries may go"): no handshake, no resolution, no
            // guard run again, as the connection goes where the guard let it.
            .pool_idle_timeout(IDLE_CONNECTION_KEPT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(concat!("svc-webhooks/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| format!("webhook client: {error}"))?;
        Ok(DeliveryClient { http, allow_private })
    }

    /// Sends one attempt: signed afresh, guarded, bounded by its timeout.
    pub async fn send(&self, attempt: Attempt<'_>) -> AttemptOutcome {
        let started = Instant::now();
        let done = |status: Option<u16>, failure: Option<(AttemptError, String)>, retry_after_s: Option<u64>| {
            let (error, detail) = failure.map_or((None, None), |(error, detail)| (Some(error), Some(bounded(detail))));
            AttemptOutcome { status, error, detail, retry_after_s, elapsed_ms: started.elapsed().as_millis() as u64 }
        };
        let subscription = attempt.subscription;
        // Parsed once, here: the guard looks at this URL and the request
        // goes to it.
        let url = match url::Url::parse(&subscription.url) {
            Ok(url) => url,
            Err(error) => {
                return done(
                    None,
                    Some((AttemptError::ConnectionFailed, format!("the URL cannot be used: {error}"))),
                    None,
                );
            }
        };
        // An address written in the URL never goes through the resolver.
        let literal: Option<IpAddr> = match url.host() {
            Some(url::Host::Ipv4(address)) => Some(address.into()),
            Some(url::Host::Ipv6(address)) => Some(address.into()),
            _ => None,
        };
        let refused = if url.scheme() != "https" {
            Some("the URL is not https")
        } else {
            match literal.map(classify) {
                Some(AddressClass::Forbidden) => Some("the URL names an address deliveries may never go to"),
                Some(class) if !class.allowed(self.allow_private) => Some(
                    "the URL names a loopback or private address, allowed only with \
                     webhooks.allow_private_targets",
                ),
                _ => None,
            }
        };
        if let Some(reason) = refused {
            return done(None, Some((AttemptError::BlockedAddress, reason.to_string())), None);
        }
        let timestamp = attempt.now.div_euclid(1000);
        let (secret, next_secret) = subscription.signing_secrets(attempt.now);
        let mut request = self
            .http
            .post(url)
            .timeout(attempt.timeout)
            .header("content-type", "application/json")
            .header("x-svc-timestamp", itoa::Buffer::new().format(timestamp))
            .header("x-svc-signature", sign(secret, timestamp, &attempt.body))
            .header("x-svc-delivery-id", attempt.delivery_id)
            .header("x-svc-event-type", attempt.event_type)
            .header("x-svc-subscription-id", format!("sub_{}", subscription.id));
        if let Some(next_secret) = next_secret {
            request = request.header("x-svc-signature-new", sign(next_secret, timestamp, &attempt.body));
        }
        match request.body(attempt.body).send().await {
            Ok(response) => {
                let status = response.status();
                let retry_after_s = (status.as_u16() == 429)
                    .then(|| response.headers().get("retry-after")?.to_str().ok()?.trim().parse::<u64>().ok())
                    .flatten();
                // The body is never read: it is the receiver's, not ours to show.
                let answered = format!("the receiver answered {status}");
                let failure = match status.as_u16() {
                    200..=299 => None,
                    300..=399 => Some((AttemptError::Redirect, format!("{answered}; redirects are not followed"))),
                    _ => Some((
                        AttemptError::HttpStatus,
                        match retry_after_s {
                            Some(seconds) => format!("{answered} (Retry-After: {seconds} s)"),
                            None => answered,
                        },
                    )),
                };
                done(Some(status.as_u16()), failure, retry_after_s)
            }
            Err(error) => done(None, Some(describe_error(&error, attempt.timeout)), None),
        }
    }
}

/// `detail` cut to [`DETAIL_MAX`] bytes, on a character boundary.
fn bounded(mut detail: String) -> String {
    if detail.len() > DETAIL_MAX {
        let mut end = DETAIL_MAX - '…'.len_utf8();
        while !detail.is_char_boundary(end) {
            end -= 1;
        }
        detail.truncate(end);
        detail.push('…');
    }
    detail
}

/// The certificates of a PEM bundle.
fn rustls_pemfile_certs(text: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(text).filter_map(Result::ok).collect()
}

/// What failed, and why in words: the guard's reason, the TLS error, or
/// the connection error's causes (the request error itself is left out: it
/// repeats the URL, which may carry a receiver's token).
fn describe_error(error: &reqwest::Error, timeout: Duration) -> (AttemptError, String) {
    if error.is_timeout() {
        return (AttemptError::Timeout, format!("no answer within {}", seconds_or_ms(timeout)));
    }
    let mut blocked = None;
    let mut tls = None;
    let mut causes: Vec<String> = Vec::new();
    visit_causes(error, &mut |cause| {
        if let Some(reason) = cause.downcast_ref::<Blocked>() {
            blocked.get_or_insert_with(|| reason.to_string());
        } else if let Some(reason) = cause.downcast_ref::<rustls::Error>() {
            tls.get_or_insert_with(|| reason.to_string());
        }
        if std::ptr::addr_eq(cause, error) {
            return;
        }
        let text = cause.to_string();
        // An I/O error that wraps another shows the same words again, and
        // the HTTP client's own wrapper names only the phase that failed.
        let repeated = causes.last().is_some_and(|last| last.ends_with(&text));
        if !text.is_empty() && !repeated && !text.starts_with("client error (") {
            causes.push(text);
        }
    });
    if let Some(reason) = blocked {
        return (AttemptError::BlockedAddress, reason);
    }
    if let Some(reason) = tls {
        return (AttemptError::Tls, format!("TLS handshake failed: {reason}"));
    }
    let detail = if causes.is_empty() { "the request could not be sent".to_string() } else { causes.join(": ") };
    (AttemptError::ConnectionFailed, detail)
}

/// `10 s`, or `1500 ms` when not whole seconds.
fn seconds_or_ms(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms.is_multiple_of(1000) { format!("{} s", ms / 1000) } else { format!("{ms} ms") }
}

/// Every cause of an error, looking inside I/O errors too (their `source`
/// skips the error they wrap).
fn visit_causes(error: &(dyn std::error::Error + 'static), visit: &mut dyn FnMut(&(dyn std::error::Error + 'static))) {
    visit(error);
    if let Some(io) = error.downcast_ref::<std::io::Error>()
        && let Some(inner) = io.get_ref()
    {
        visit_causes(inner, visit);
    }
    if let Some(source) = error.source() {
        visit_causes(source, visit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detail_is_cut_on_a_character_boundary() {
        assert_eq!(bounded("short".to_string()), "short");
        let long = "é".repeat(DETAIL_MAX);
        let cut = bounded(long);
        assert!(cut.len() <= DETAIL_MAX && cut.ends_with('…'), "{} bytes", cut.len());
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
    }

    #[test]
    fn times_read_as_seconds_when_whole() {
        assert_eq!(seconds_or_ms(Duration::from_secs(10)), "10 s");
        assert_eq!(seconds_or_ms(Duration::from_millis(1500)), "1500 ms");
    }
}
