//! The floor under a webhook delivery's cost: the CPU one HTTPS POST over a
//! kept-alive connection takes from the process that sends it, with none of
//! svc's work (no outbox, no log, no engine). Set beside the server CPU a
//! delivery costs in `benches/webhooks.sh`, it says how much of that cost is
//! the sending itself.
//!
//! ```text
//! webhook_floor URL CA_FILE [REQUESTS] [CONCURRENCY] [--raw]
//! ```
//!
//! By default each request goes through the stack svc's delivery pool uses
//! (reqwest over hyper and rustls with ring, on a one-thread tokio runtime,
//! the signature headers included); `--raw` writes each request by hand on
//! one blocking rustls stream per connection, each on its own thread, the
//! least any HTTPS sender can do. It prints the requests a second and the
//! process's CPU (user + system) per request. Run it against
//! `examples/webhook_receiver.rs`, as the benchmark script does.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

/// A body the size of a `job.completed` event.
fn event_body() -> String {
    let now = jiff::Timestamp::now();
    format!(
        r#"{{"id":"evt_00000000000000000000000001","type":"job.completed","time":"{now}","subject":"job_0000000000000000000000000001","data":{{"job":{{"id":"job_0000000000000000000000000001","type":"bench.work","queue":"default","state":"completed","args":[1,"two",{{"three":3}}],"priority":0,"attempt":1,"max_attempts":3,"created_at":"{now}","enqueued_at":"{now}","started_at":"{now}","completed_at":"{now}","result":{{"ok":true}}}}}}}}"#
    )
}

/// The process's CPU time so far, user and system, in microseconds.
#[allow(unsafe_code)]
fn cpu_us() -> u64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is written by the call and read only after it succeeds.
    let usage = unsafe {
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()), 0);
        usage.assume_init()
    };
    let us = |time: libc::timeval| time.tv_sec as u64 * 1_000_000 + time.tv_usec as u64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

fn tls_config(ca_file: &str) -> Result<rustls::ClientConfig, Box<dyn std::error::Error>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for certificate in rustls::pki_types::CertificateDer::pem_file_iter(ca_file)? {
        roots.add(certificate?)?;
    }
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let raw = args.iter().any(|arg| arg == "--raw");
    let mut positional = args.iter().filter(|arg| !arg.starts_with("--"));
    let url: url::Url = positional.next().ok_or("URL")?.parse()?;
    let ca_file = positional.next().ok_or("CA_FILE")?.clone();
    let requests: usize = positional.next().map_or(Ok(50_000), |n| n.parse())?;
    let concurrency: usize = positional.next().map_or(Ok(8), |n| n.parse())?;
    let tls = tls_config(&ca_file)?;
    let body = event_body();

    // Connections are opened (and the handshakes done) before the clock starts.
    let (cpu_before, started, sent) = if raw {
        send_raw(&url, tls, &body, requests, concurrency)?
    } else {
        send_reqwest(&url, tls, &body, requests, concurrency)?
    };
    let (cpu, elapsed) = (cpu_us() - cpu_before, started.elapsed());
    println!(
        "stack={} requests={sent} concurrency={concurrency} requests/s={:.0} cpu_us_per_request={:.1}",
        if raw { "raw" } else { "reqwest" },
        sent as f64 / elapsed.as_secs_f64(),
        cpu as f64 / sent as f64
    );
    Ok(())
}

type Measured = (u64, Instant, usize);

fn send_reqwest(
    url: &url::Url,
    tls: rustls::ClientConfig,
    body: &str,
    requests: usize,
    concurrency: usize,
) -> Result<Measured, Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    runtime.block_on(async {
        let client = reqwest::Client::builder().tls_backend_preconfigured(tls).no_proxy().build()?;
        let body = bytes::Bytes::from(body.to_string());
        let post = |client: reqwest::Client, body: bytes::Bytes, url: url::Url| async move {
            let timestamp = jiff::Timestamp::now().as_second();
            let signature = svc::webhook::sign("benchmark-secret-0123", timestamp, &body);
            let response = client
                .post(url)
                .header("content-type", "application/json")
                .header("x-svc-timestamp", timestamp)
                .header("x-svc-signature", signature)
                .header("x-svc-delivery-id", "del_00000000000000000000000001")
                .header("x-svc-event-type", "job.completed")
                .header("x-svc-subscription-id", "sub_00000000000000000000000001")
                .body(body)
                .send()
                .await?;
            assert!(response.status().is_success(), "{}", response.status());
            Ok::<(), reqwest::Error>(())
        };
        // One round per connection first, so every handshake is done.
        let warm: Vec<_> =
            (0..concurrency).map(|_| tokio::spawn(post(client.clone(), body.clone(), url.clone()))).collect();
        for task in warm {
            task.await??;
        }
        let (cpu_before, started) = (cpu_us(), Instant::now());
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let workers: Vec<_> = (0..concurrency)
            .map(|_| {
                let (client, body, url, next) = (client.clone(), body.clone(), url.clone(), next.clone());
                tokio::spawn(async move {
                    while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < requests {
                        post(client.clone(), body.clone(), url.clone()).await?;
                    }
                    Ok::<(), reqwest::Error>(())
                })
            })
            .collect();
        for worker in workers {
            worker.await??;
        }
        Ok((cpu_before, started, requests))
    })
}

fn send_raw(
    url: &url::Url,
    tls: rustls::ClientConfig,
    body: &str,
    requests: usize,
    concurrency: usize,
) -> Result<Measured, Box<dyn std::error::Error>> {
    let tls = Arc::new(tls);
    let host = url.host_str().ok_or("URL has no host")?.to_string();
    let address = (host.as_str(), url.port_or_known_default().ok_or("URL has no port")?);
    let request = format!(
        "POST {} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        url.path(),
        body.len()
    );
    let mut streams = Vec::new();
    for _ in 0..concurrency {
        let name = rustls::pki_types::ServerName::try_from(host.clone())?;
        let connection = rustls::ClientConnection::new(tls.clone(), name)?;
        let socket = TcpStream::connect(address)?;
        socket.set_nodelay(true)?;
        let mut stream = BufReader::new(rustls::StreamOwned::new(connection, socket));
        exchange(&mut stream, request.as_bytes())?;
        streams.push(stream);
    }
    let (cpu_before, started) = (cpu_us(), Instant::now());
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let threads: Vec<_> = streams
        .into_iter()
        .map(|mut stream| {
            let (request, next) = (request.clone(), next.clone());
            std::thread::spawn(move || {
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < requests {
                    exchange(&mut stream, request.as_bytes()).expect("the receiver answers");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().map_err(|_| "a sending thread failed")?;
    }
    Ok((cpu_before, started, requests))
}

/// Writes one request and reads the answer's head (the receiver answers 204,
/// with no body).
fn exchange<S: Read + Write>(stream: &mut BufReader<S>, request: &[u8]) -> std::io::Result<()> {
    stream.get_mut().write_all(request)?;
    stream.get_mut().flush()?;
    let mut line = String::new();
    loop {
        line.clear();
        if stream.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if line == "\r\n" {
            return Ok(());
        }
    }
}
