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

use super::guard::classify;
use super::signature::sign;
use super::subscription::Subscription;
use super::verifier::ReceiverVerifier;

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

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptOutcome {
    /// The receiver's status, when it answered.
    pub status: Option<u16>,
    pub error: Option<AttemptError>,
    /// `Retry-After` of a 429, in seconds.
    pub retry_after_s: Option<u64>,
    pub elapsed_ms: u64,
}

impl AttemptOutcome {
    pub fn succeeded(&self) -> bool {
        self.error.is_none()
    }
}

/// One delivery to send: the body is the event envelope, serialised once.
pub struct Attempt<'a> {
    pub subscription: &'a Subscription,
    pub delivery_id: &'a str,
    pub event_type: &'a str,
    pub body: &'a [u8],
    /// Unix seconds this attempt is signed at.
    pub timestamp: i64,
    pub timeout: Duration,
}

/// Sends delivery attempts; cheap to clone (one connection pool).
#[derive(Clone)]
pub struct DeliveryClient {
    http: reqwest::Client,
    allow_private: bool,
}

/// A name that resolved to an address deliveries may not go to.
#[derive(Debug)]
struct Blocked;

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the host resolves to an address deliveries may not go to")
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
            if addresses.is_empty() || addresses.iter().any(|address| !classify(address.ip()).allowed(allow_private)) {
                return Err(Box::new(Blocked) as Box<dyn std::error::Error + Send + Sync>);
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
        let done = |status: Option<u16>, error: Option<AttemptError>, retry_after_s: Option<u64>| AttemptOutcome {
            status,
            error,
            retry_after_s,
            elapsed_ms: started.elapsed().as_millis() as u64,
        };
        let subscription = attempt.subscription;
        // An address written in the URL never goes through the resolver.
        if let Ok(url) = url::Url::parse(&subscription.url) {
            let literal: Option<IpAddr> = match url.host() {
                Some(url::Host::Ipv4(address)) => Some(address.into()),
                Some(url::Host::Ipv6(address)) => Some(address.into()),
                _ => None,
            };
            if url.scheme() != "https" || literal.is_some_and(|address| !classify(address).allowed(self.allow_private))
            {
                return done(None, Some(AttemptError::BlockedAddress), None);
            }
        }
        let mut request = self
            .http
            .post(&subscription.url)
            .timeout(attempt.timeout)
            .header("content-type", "application/json")
            .header("x-svc-timestamp", attempt.timestamp.to_string())
            .header("x-svc-signature", sign(&subscription.secret, attempt.timestamp, attempt.body))
            .header("x-svc-delivery-id", attempt.delivery_id)
            .header("x-svc-event-type", attempt.event_type)
            .header("x-svc-subscription-id", format!("sub_{}", subscription.id));
        if let Some(rotation) = &subscription.rotation {
            request =
                request.header("x-svc-signature-new", sign(&rotation.next_secret, attempt.timestamp, attempt.body));
        }
        match request.body(attempt.body.to_vec()).send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let retry_after_s = (status == 429)
                    .then(|| response.headers().get("retry-after")?.to_str().ok()?.trim().parse::<u64>().ok())
                    .flatten();
                let error = match status {
                    200..=299 => None,
                    300..=399 => Some(AttemptError::Redirect),
                    _ => Some(AttemptError::HttpStatus),
                };
                done(Some(status), error, retry_after_s)
            }
            Err(error) => done(None, Some(classify_error(&error)), None),
        }
    }
}

/// The certificates of a PEM bundle.
fn rustls_pemfile_certs(text: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(text).filter_map(Result::ok).collect()
}

fn classify_error(error: &reqwest::Error) -> AttemptError {
    if error.is_timeout() {
        return AttemptError::Timeout;
    }
    let mut found = AttemptError::ConnectionFailed;
    visit_causes(error, &mut |cause| {
        if cause.is::<Blocked>() {
            found = AttemptError::BlockedAddress;
        } else if cause.is::<rustls::Error>() && found != AttemptError::BlockedAddress {
            found = AttemptError::Tls;
        }
    });
    found
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
