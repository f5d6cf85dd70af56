//! The `fill` workload: loads `--jobs` jobs of about 200 bytes (or of
//! `--job-bytes`) with batch enqueue (100 jobs a request over every
//! connection) and reports, for each step of the fill (every million jobs,
//! or a tenth of the run when it is smaller), the rate of that step and the
//! resident memory of the server when it ended, if the server runs on this
//! machine.
//!
//! The same client drives a Redis server (`--target redis`): one variadic
//! `LPUSH` of the same 100 job texts per request, so the two are measured
//! doing the same work.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hyper::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{BenchOptions, Connection};

/// Jobs per request.
pub const BATCH: u64 = 100;
/// The length of each job's JSON text, as a client would send it, unless
/// `--job-bytes` says otherwise.
pub const JOB_BYTES: usize = 200;

/// What a fill is pointed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Svc,
    /// A Redis server, filled with `LPUSH` (for the side-by-side figure).
    Redis,
}

/// One step of a fill.
#[derive(Debug, Clone)]
pub struct FillStep {
    /// Jobs held when the step ended.
    pub held: u64,
    /// Jobs per second during the step.
    pub rate: f64,
    /// The server's resident memory when the step ended, in bytes.
    pub rss: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct FillReport {
    pub target: Target,
    pub jobs: u64,
    pub elapsed: Duration,
    pub steps: Vec<FillStep>,
    /// Request latencies in microseconds, sorted.
    pub latencies_us: Vec<u32>,
}

impl std::fmt::Display for FillReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for step in &self.steps {
            write!(f, "held={} step_jobs/s={:.0}", step.held, step.rate)?;
            if let Some(rss) = step.rss {
                write!(f, " rss_mb={:.0} rss_bytes/job={:.0}", rss as f64 / 1e6, rss as f64 / step.held as f64)?;
            }
            writeln!(f)?;
        }
        let quantile = |q: f64| super::quantile_ms(&self.latencies_us, q);
        write!(
            f,
            "workload=Fill target={:?} jobs={} elapsed={:.2}s jobs/s={:.0} p50={:.2}ms p99={:.2}ms",
            self.target,
            self.jobs,
            self.elapsed.as_secs_f64(),
            self.jobs as f64 / self.elapsed.as_secs_f64(),
            quantile(0.5),
            quantile(0.99)
        )
    }
}

/// The JSON text of job `n`: a type, and args padded to `bytes` in all.
pub fn job_text(n: u64, bytes: usize) -> String {
    let head = format!(r#"{{"type":"bench.fill","args":[{n},""#);
    let tail = r#""]}"#;
    let pad = bytes.saturating_sub(head.len() + tail.len());
    format!("{head}{}{tail}", "x".repeat(pad))
}

pub async fn run(options: &BenchOptions, target: Target) -> Result<FillReport, String> {
    let server_pid = listening_pid(&options.address);
    let step = if options.jobs >= 2_000_000 { 1_000_000 } else { (options.jobs / 10).max(BATCH) };
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..options.connections {
        let (next, done, jobs, bytes) = (next.clone(), done.clone(), options.jobs, options.job_bytes);
        let mut client = FillClient::open(&options.address, target).await?;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let first = next.fetch_add(BATCH, Ordering::Relaxed);
                if first >= jobs {
                    return Ok::<_, String>(latencies);
                }
                let count = BATCH.min(jobs - first);
                let texts: Vec<String> = (first..first + count).map(|n| job_text(n, bytes)).collect();
                latencies.push(super::micros(client.push(&texts).await?));
                done.fetch_add(count, Ordering::Relaxed);
            }
        }));
    }
    let mut steps = Vec::new();
    let (mut mark, mut mark_at) = (0u64, started);
    while mark < options.jobs {
        tokio::time::sleep(Duration::from_millis(5)).await;
        if tasks.iter().all(|task| task.is_finished()) && done.load(Ordering::Relaxed) < options.jobs {
            break;
        }
        let held = done.load(Ordering::Relaxed);
        if held >= (mark + step).min(options.jobs) {
            let now = Instant::now();
            steps.push(FillStep {
                held,
                rate: (held - mark) as f64 / (now - mark_at).as_secs_f64(),
                rss: server_pid.and_then(resident_bytes),
            });
            (mark, mark_at) = (held, now);
        }
    }
    let mut latencies_us = Vec::new();
    for task in tasks {
        latencies_us.extend(task.await.map_err(|error| error.to_string())??);
    }
    let elapsed = started.elapsed();
    latencies_us.sort_unstable();
    Ok(FillReport { target, jobs: done.load(Ordering::Relaxed), elapsed, steps, latencies_us })
}

/// One connection of a fill, to either kind of server.
enum FillClient {
    Svc(Connection),
    Redis { stream: TcpStream, reply: Vec<u8> },
}

impl FillClient {
    async fn open(address: &str, target: Target) -> Result<FillClient, String> {
        Ok(match target {
            Target::Svc => FillClient::Svc(Connection::open(address).await?),
            Target::Redis => {
                let stream =
                    TcpStream::connect(address).await.map_err(|error| format!("connect {address}: {error}"))?;
                let _ = stream.set_nodelay(true);
                FillClient::Redis { stream, reply: vec![0; 256] }
            }
        })
    }

    /// Sends one request holding `texts` and waits for its answer.
    async fn push(&mut self, texts: &[String]) -> Result<Duration, String> {
        match self {
            FillClient::Svc(connection) => {
                let body = format!(r#"{{"jobs":[{}]}}"#, texts.join(","));
                let (status, answer, latency) = connection.post("/svc/v1/jobs/batch", body).await?;
                if status != StatusCode::CREATED {
                    return Err(format!("batch enqueue answered {status}: {}", String::from_utf8_lossy(&answer)));
                }
                Ok(latency)
            }
            FillClient::Redis { stream, reply } => {
                let command = lpush_command("fill", texts);
                let started = Instant::now();
                stream.write_all(&command).await.map_err(|error| error.to_string())?;
                // The answer to LPUSH is one line: `:<length>\r\n`, or `-<error>\r\n`.
                let mut read = 0;
                while !reply[..read].ends_with(b"\r\n") {
                    if read == reply.len() {
                        return Err("Redis answered with an over-long line".into());
                    }
                    let n = stream.read(&mut reply[read..]).await.map_err(|error| error.to_string())?;
                    if n == 0 {
                        return Err("Redis closed the connection".into());
                    }
                    read += n;
                }
                if reply[0] != b':' {
                    return Err(format!("LPUSH answered {}", String::from_utf8_lossy(&reply[..read]).trim_end()));
                }
                Ok(started.elapsed())
            }
        }
    }
}

/// `LPUSH key text...` in the Redis protocol (RESP).
fn lpush_command(key: &str, texts: &[String]) -> Vec<u8> {
    let mut command = format!("*{}\r\n$5\r\nLPUSH\r\n${}\r\n{key}\r\n", texts.len() + 2, key.len()).into_bytes();
    for text in texts {
        command.extend_from_slice(format!("${}\r\n", text.len()).as_bytes());
        command.extend_from_slice(text.as_bytes());
        command.extend_from_slice(b"\r\n");
    }
    command
}

/// The process on this machine listening on `address`'s port, found through
/// `/proc` (Linux; `None` elsewhere, or when the server is remote or
/// belongs to another user).
pub fn listening_pid(address: &str) -> Option<u32> {
    let port: u16 = address.rsplit(':').next()?.parse().ok()?;
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address is HEX_IP:HEX_PORT; state 0A is LISTEN.
            let listens_here = fields
                .get(1)
                .and_then(|local| local.rsplit(':').next())
                .and_then(|hex| u16::from_str_radix(hex, 16).ok())
                == Some(port)
                && fields.get(3) == Some(&"0A");
            if listens_here && let Some(inode) = fields.get(9) {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for process in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = process.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(process.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path())
                && inodes.iter().any(|inode| link.as_os_str() == inode.as_str())
            {
                return Some(pid);
            }
        }
    }
    None
}

/// The resident memory of process `pid` (`VmRSS`), in bytes.
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_job_text_is_as_long_as_asked_and_json() {
        for (n, bytes) in [(0, JOB_BYTES), (7, JOB_BYTES), (123_456, 1024), (9_999_999_999, JOB_BYTES)] {
            let text = job_text(n, bytes);
            assert_eq!(text.len(), bytes);
            let job: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(job["type"], "bench.fill");
            assert_eq!(job["args"][0], n);
        }
    }

    #[test]
    fn lpush_is_one_array_of_bulk_strings() {
        let command = lpush_command("fill", &["ab".to_string(), "c".to_string()]);
        assert_eq!(command, b"*4\r\n$5\r\nLPUSH\r\n$4\r\nfill\r\n$2\r\nab\r\n$1\r\nc\r\n");
    }

    #[test]
    fn this_process_is_found_by_the_port_it_listens_on() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        if std::path::Path::new("/proc/net/tcp").exists() {
            assert_eq!(listening_pid(&address), Some(std::process::id()));
            assert!(resident_bytes(std::process::id()).unwrap() > 0);
        }
    }
}
