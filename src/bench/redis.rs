//! `svc bench --target redis` for `steady` and `drain`: the same workloads
//! against a Redis server, for side-by-side figures. Jobs are taken with a
//! move into a processing list (the reliable-queue pattern: `BLMOVE`, or
//! `LMOVE` when draining) and finished with `LREM`.
//!
//! `steady`: producers `LPUSH` jobs stamped with when they were sent, at the
//! same total rate as against svc; the end-to-end figure is measured as
//! against svc, from the enqueue call to the job's arrival at a consumer.
//! `drain`: `--jobs` jobs are loaded 100 to an `LPUSH`, then every
//! connection moves and removes jobs until the list is empty.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::{BenchOptions, BenchReport, LoopResult, Workload, gather_report, micros, since_start_us};

const LIST: &str = "bench";
const PROCESSING: &str = "bench:processing";

/// One reply of the Redis protocol, as far as these commands need.
#[derive(Debug, PartialEq)]
enum Reply {
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Simple(String),
}

/// One connection to Redis.
struct RedisConnection {
    stream: BufReader<TcpStream>,
}

impl RedisConnection {
    async fn open(address: &str) -> Result<RedisConnection, String> {
        let stream = TcpStream::connect(address).await.map_err(|error| format!("connect {address}: {error}"))?;
        let _ = stream.set_nodelay(true);
        Ok(RedisConnection { stream: BufReader::new(stream) })
    }

    /// Sends a command of bulk strings and reads its reply.
    async fn call(&mut self, parts: &[&[u8]]) -> Result<Reply, String> {
        let mut command = format!("*{}\r\n", parts.len()).into_bytes();
        for part in parts {
            command.extend_from_slice(format!("${}\r\n", part.len()).as_bytes());
            command.extend_from_slice(part);
            command.extend_from_slice(b"\r\n");
        }
        self.stream.get_mut().write_all(&command).await.map_err(|error| error.to_string())?;
        let mut line = String::new();
        if self.stream.read_line(&mut line).await.map_err(|error| error.to_string())? == 0 {
            return Err("Redis closed the connection".into());
        }
        let line = line.trim_end();
        let (kind, rest) = line.split_at(1.min(line.len()));
        match kind {
            ":" => rest.parse().map(Reply::Integer).map_err(|_| format!("bad integer reply {line}")),
            "+" => Ok(Reply::Simple(rest.to_string())),
            "$" | "*" if rest.starts_with('-') => Ok(Reply::Bulk(None)),
            "$" => {
                let length: usize = rest.parse().map_err(|_| format!("bad bulk reply {line}"))?;
                let mut bytes = vec![0u8; length + 2];
                self.stream.read_exact(&mut bytes).await.map_err(|error| error.to_string())?;
                bytes.truncate(length);
                Ok(Reply::Bulk(Some(bytes)))
            }
            _ => Err(format!("Redis answered {line}")),
        }
    }
}

/// Runs the steady workload against Redis: half the connections produce,
/// half consume, for `options.duration`.
pub async fn run(options: &BenchOptions) -> Result<BenchReport, String> {
    let mut setup = RedisConnection::open(&options.address).await?;
    setup.call(&[b"DEL", LIST.as_bytes(), PROCESSING.as_bytes()]).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let end_to_end = Arc::new(std::sync::Mutex::new(Vec::new()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..options.connections {
        let mut connection = RedisConnection::open(&options.address).await?;
        let (options, stop, end_to_end) = (options.clone(), stop.clone(), end_to_end.clone());
        tasks.push(tokio::spawn(async move {
            if worker % 2 == 0 {
                produce(&mut connection, &options, &stop).await
            } else {
                consume(&mut connection, &stop, &end_to_end).await
            }
        }));
    }
    tokio::time::sleep(options.duration).await;
    stop.store(true, Ordering::SeqCst);
    gather_report(Workload::Steady, options.connections, tasks, started, &end_to_end).await
}

/// Loads `options.jobs` jobs, then drains them over every connection;
/// the rate counts the drain alone.
pub async fn run_drain(options: &BenchOptions) -> Result<BenchReport, String> {
    let mut setup = RedisConnection::open(&options.address).await?;
    setup.call(&[b"DEL", LIST.as_bytes(), PROCESSING.as_bytes()]).await?;
    let mut loaded = 0;
    while loaded < options.jobs {
        let batch: Vec<String> = (loaded..options.jobs.min(loaded + 100))
            .map(|n| format!(r#"{{"type":"bench.job","args":[{n}]}}"#))
            .collect();
        let mut parts: Vec<&[u8]> = vec![b"LPUSH", LIST.as_bytes()];
        parts.extend(batch.iter().map(|job| job.as_bytes()));
        setup.call(&parts).await?;
        loaded += batch.len() as u64;
    }
    let end_to_end = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut connections = Vec::new();
    for _ in 0..options.connections {
        connections.push(RedisConnection::open(&options.address).await?);
    }
    let started = Instant::now();
    let tasks = connections.into_iter().map(|mut connection| tokio::spawn(async move { drain(&mut connection).await }));
    gather_report(Workload::Drain, options.connections, tasks.collect(), started, &end_to_end).await
}

/// Moves jobs to the processing list and removes them until none is left.
async fn drain(connection: &mut RedisConnection) -> LoopResult {
    let (mut latencies, mut jobs) = (Vec::new(), 0);
    loop {
        let sent = Instant::now();
        let reply = connection.call(&[b"LMOVE", LIST.as_bytes(), PROCESSING.as_bytes(), b"RIGHT", b"LEFT"]).await?;
        latencies.push(micros(sent.elapsed()));
        let Reply::Bulk(Some(job)) = reply else { return Ok((jobs, latencies)) };
        let sent = Instant::now();
        match connection.call(&[b"LREM", PROCESSING.as_bytes(), b"1", &job]).await? {
            Reply::Integer(1) => latencies.push(micros(sent.elapsed())),
            other => return Err(format!("LREM answered {other:?}")),
        }
        jobs += 1;
    }
}

/// `LPUSH`es stamped jobs at this connection's share of the rate until `stop`.
async fn produce(connection: &mut RedisConnection, options: &BenchOptions, stop: &AtomicBool) -> LoopResult {
    let producers = options.connections.div_ceil(2).max(1) as f64;
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(producers / options.rate.max(1) as f64));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut latencies = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        ticker.tick().await;
        let job = format!(r#"{{"type":"bench.job","args":[{}]}}"#, since_start_us());
        let sent = Instant::now();
        match connection.call(&[b"LPUSH", LIST.as_bytes(), job.as_bytes()]).await? {
            Reply::Integer(_) => latencies.push(micros(sent.elapsed())),
            other => return Err(format!("LPUSH answered {other:?}")),
        }
    }
    Ok((0, latencies))
}

/// Takes jobs with `BLMOVE` (waiting up to a second) and finishes each with
/// `LREM`, until `stop`; records each job's delay from its enqueue.
async fn consume(
    connection: &mut RedisConnection,
    stop: &AtomicBool,
    end_to_end: &std::sync::Mutex<Vec<u32>>,
) -> LoopResult {
    let (mut latencies, mut delays, mut jobs) = (Vec::new(), Vec::new(), 0);
    while !stop.load(Ordering::SeqCst) {
        let sent = Instant::now();
        let reply =
            connection.call(&[b"BLMOVE", LIST.as_bytes(), PROCESSING.as_bytes(), b"RIGHT", b"LEFT", b"1"]).await?;
        latencies.push(micros(sent.elapsed()));
        let Reply::Bulk(Some(job)) = reply else { continue };
        let stamp = std::str::from_utf8(&job)
            .ok()
            .and_then(|text| text.rsplit('[').next())
            .and_then(|rest| rest.trim_end_matches("]}").parse::<u64>().ok());
        if let Some(stamp) = stamp {
            delays.push(since_start_us().saturating_sub(stamp).min(u64::from(u32::MAX)) as u32);
        }
        let sent = Instant::now();
        match connection.call(&[b"LREM", PROCESSING.as_bytes(), b"1", &job]).await? {
            Reply::Integer(1) => latencies.push(micros(sent.elapsed())),
            other => return Err(format!("LREM answered {other:?}")),
        }
        jobs += 1;
    }
    if let Ok(mut all) = end_to_end.lock() {
        all.extend(delays);
    }
    Ok((jobs, latencies))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stamp_is_read_back_from_the_job_text() {
        let job = r#"{"type":"bench.job","args":[123456]}"#;
        let stamp = job.rsplit('[').next().and_then(|rest| rest.trim_end_matches("]}").parse::<u64>().ok());
        assert_eq!(stamp, Some(123456));
    }
}
