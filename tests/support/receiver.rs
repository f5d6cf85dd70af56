//! A webhook receiver for the tests: an HTTPS server on 127.0.0.1 with a
//! certificate the test makes, which records every request and answers
//! with the statuses the test queues; and the receiver's side of the
//! signature recipe.

#![allow(dead_code)]

use hmac::{KeyInit, Mac};
use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A number for a file name no other in the test process has.
pub fn next_file() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// One request the receiver got.
pub struct Received {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

/// Responses to give, in order: (status, headers).
pub type Answers = Arc<Mutex<VecDeque<(u16, Vec<(&'static str, String)>)>>>;

/// An HTTPS server on 127.0.0.1 answering with the queued responses (then
/// 200), each connection on a thread of its own.
pub struct Receiver {
    pub port: u16,
    /// How long each answer to [`Receiver::slow_url`] waits (a slow receiver).
    pub delay: Arc<Mutex<std::time::Duration>>,
    pub ca_file: PathBuf,
    /// The path of every request, as soon as it is read (before any delay).
    pub arrived: Arc<Mutex<Vec<String>>>,
    pub received: Arc<Mutex<Vec<Received>>>,
    pub answers: Answers,
}

impl Receiver {
    /// A receiver whose certificate is issued by a CA of its own; the CA is
    /// written to `ca_file`.
    pub fn start(dir: &Path) -> Receiver {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        // A name of its own: a CA of the same name would say "bad signature".
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, format!("svc test CA {}", next_file()));
        ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let mut leaf_params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        leaf_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
        let ca_file = dir.join(format!("receiver-ca-{}.pem", next_file()));
        std::fs::write(&ca_file, ca.pem()).unwrap();
        Receiver::serve(leaf.der().clone(), &leaf_key, ca_file)
    }

    /// A receiver presenting a self-signed certificate for `names`, valid
    /// from `not_before` to `not_after`; the certificate itself is written
    /// to `ca_file`.
    pub fn self_signed(
        dir: &Path,
        is_ca: rcgen::IsCa,
        names: &[&str],
        not_before: (i32, u8, u8),
        not_after: (i32, u8, u8),
    ) -> Receiver {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|name| name.to_string()).collect::<Vec<_>>()).unwrap();
        params.is_ca = is_ca;
        params.distinguished_name.push(rcgen::DnType::CommonName, "svc self-signed receiver");
        params.not_before = rcgen::date_time_ymd(not_before.0, not_before.1, not_before.2);
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let certificate = params.self_signed(&key).unwrap();
        let ca_file = dir.join(format!("receiver-self-signed-{}.pem", next_file()));
        std::fs::write(&ca_file, certificate.pem()).unwrap();
        Receiver::serve(certificate.der().clone(), &key, ca_file)
    }

    /// Serves HTTPS with `certificate` (alone, no chain) and its key.
    pub fn serve(
        certificate: rustls::pki_types::CertificateDer<'static>,
        key: &rcgen::KeyPair,
        ca_file: PathBuf,
    ) -> Receiver {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
        let tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![certificate], key)
            .unwrap();
        let tls = Arc::new(tls);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let arrived = Arc::new(Mutex::new(Vec::new()));
        let answers: Answers = Arc::default();
        let (got, queued, came) = (received.clone(), answers.clone(), arrived.clone());
        let delay = Arc::new(Mutex::new(std::time::Duration::ZERO));
        let slow = delay.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (tls, got, queued, slow, came) =
                    (tls.clone(), got.clone(), queued.clone(), slow.clone(), came.clone());
                std::thread::spawn(move || {
                    let Ok(connection) = rustls::ServerConnection::new(tls) else { return };
                    let mut stream = rustls::StreamOwned::new(connection, stream);
                    let Some(request) = read_request(&mut stream) else { return };
                    came.lock().unwrap().push(request.path.clone());
                    if request.path.starts_with("/slow") {
                        let delay = *slow.lock().unwrap();
                        std::thread::sleep(delay);
                    }
                    got.lock().unwrap().push(request);
                    let (status, headers) = queued.lock().unwrap().pop_front().unwrap_or((200, Vec::new()));
                    let mut response = format!("HTTP/1.1 {status} X\r\nconnection: close\r\ncontent-length: 2\r\n");
                    for (name, value) in headers {
                        response.push_str(&format!("{name}: {value}\r\n"));
                    }
                    response.push_str("\r\nok");
                    let _ = stream.write_all(response.as_bytes());
                    let _ = stream.flush();
                    stream.conn.send_close_notify();
                    let _ = stream.flush();
                });
            }
        });
        Receiver { port, delay, ca_file, arrived, received, answers }
    }

    pub fn url(&self, host: &str) -> String {
        format!("https://{host}:{}/hooks", self.port)
    }

    /// An address whose answers wait for `delay`.
    pub fn slow_url(&self, host: &str) -> String {
        format!("https://{host}:{}/slow", self.port)
    }

    /// How many requests to `path` were answered.
    pub fn count_at(&self, path: &str) -> usize {
        self.received.lock().unwrap().iter().filter(|request| request.path == path).count()
    }

    /// How many requests to `path` came in, answered or not.
    pub fn arrived_at(&self, path: &str) -> usize {
        self.arrived.lock().unwrap().iter().filter(|arrived| *arrived == path).count()
    }

    /// Waits until `count` requests to `path` came in.
    pub fn wait_for_arrivals(&self, path: &str, count: usize) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while self.arrived_at(path) < count {
            assert!(std::time::Instant::now() < deadline, "{} of {count} requests came", self.arrived_at(path));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    pub fn answer_next(&self, status: u16, headers: Vec<(&'static str, String)>) {
        self.answers.lock().unwrap().push_back((status, headers));
    }

    pub fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }
}

pub fn read_request(stream: &mut impl Read) -> Option<Received> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split(' ').nth(1)?.to_string();
    let mut headers = HashMap::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    let length: usize = headers.get("content-length")?.parse().ok()?;
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Received { path, headers, body })
}

/// The receiver's side of the recipe: HMAC-SHA256 over "<timestamp>." + body.
pub fn verify(secret: &str, timestamp: &str, body: &[u8], header: &str) -> bool {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    let expected: String = mac.finalize().into_bytes().iter().map(|byte| format!("{byte:02x}")).collect();
    header == format!("sha256={expected}")
}
