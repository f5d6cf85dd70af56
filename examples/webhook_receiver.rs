//! A webhook receiver for benchmarks: HTTPS with keep-alive on 127.0.0.1,
//! a certificate made at start (its CA written to a file for
//! `webhooks.extra_ca_file`), every request answered 204 and counted, and
//! each delivery's lag from its event's `time` to its arrival measured.
//!
//! `cargo run --release --example webhook_receiver -- PORT CA_FILE`
//! prints once a second the running count and the lag so far:
//! `deliveries=N lag_p50_ms=A lag_p99_ms=B lag_max_ms=C`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().ok_or("PORT")?.parse()?;
    let ca_file = args.next().ok_or("CA_FILE")?;

    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "svc benchmark CA");
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
    let ca = ca_params.self_signed(&ca_key)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate()?;
    let mut leaf_params = rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
    leaf_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let leaf = leaf_params.signed_by(&leaf_key, &issuer)?;
    std::fs::write(&ca_file, ca.pem())?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let tls = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone()], key)?,
    );
    let listener = TcpListener::bind(("127.0.0.1", port))?;
    let count = Arc::new(AtomicU64::new(0));
    let lags: Arc<Mutex<Vec<u32>>> = Arc::default();
    let (shown, shown_lags) = (count.clone(), lags.clone());
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
            let mut lags = shown_lags.lock().expect("not poisoned").clone();
            lags.sort_unstable();
            let at = |q: f64| lags.get(((lags.len() as f64 * q) as usize).min(lags.len().saturating_sub(1)));
            let (p50, p99, max) = (at(0.5), at(0.99), lags.last());
            let show = |value: Option<&u32>| value.map_or("-".to_string(), u32::to_string);
            println!(
                "deliveries={} lag_p50_ms={} lag_p99_ms={} lag_max_ms={}",
                shown.load(Ordering::Relaxed),
                show(p50),
                show(p99),
                show(max)
            );
        }
    });
    println!("listening port={port}");
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let (tls, count, lags) = (tls.clone(), count.clone(), lags.clone());
        std::thread::spawn(move || {
            let Ok(connection) = rustls::ServerConnection::new(tls) else { return };
            let stream = rustls::StreamOwned::new(connection, stream);
            let mut reader = BufReader::new(stream);
            while let Some(body) = serve_one(&mut reader) {
                count.fetch_add(1, Ordering::Relaxed);
                if let Some(lag) = lag_ms(&body) {
                    lags.lock().expect("not poisoned").push(lag);
                }
            }
        });
    }
    Ok(())
}

/// Milliseconds from the event's `time` to now.
fn lag_ms(body: &[u8]) -> Option<u32> {
    let event: serde_json::Value = serde_json::from_slice(body).ok()?;
    let time: jiff::Timestamp = event["time"].as_str()?.parse().ok()?;
    let lag = jiff::Timestamp::now().as_millisecond() - time.as_millisecond();
    Some(lag.clamp(0, i64::from(u32::MAX)) as u32)
}

/// Reads one request and answers 204, keeping the connection open; its body.
fn serve_one<S: Read + Write>(reader: &mut BufReader<S>) -> Option<Vec<u8>> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    let stream = reader.get_mut();
    stream.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").ok()?;
    stream.flush().ok()?;
    Some(body)
}
