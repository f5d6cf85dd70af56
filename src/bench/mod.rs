//! `svc bench`: drives a running server over HTTP with N keep-alive
//! connections and reports jobs/s and request latency percentiles.
//!
//! Workloads: `enqueue` (one job per request), `drain` (fetch + ack until the
//! queue is empty; jobs are loaded first with batch enqueue), `steady`
//! (producers at a fixed total rate while consumers fetch + ack, for a
//! duration), `retry` (every job fails once, then succeeds), `backlog` (loads
//! another queue with jobs half in flight, half waiting to retry in an hour,
//! to measure the others against), `schedules` (registers `--crons` cron
//! entries spread over the day and loads `--jobs` delayed jobs due over the
//! next hour, to measure the others against), and `ping` (the enqueue request
//! against any server, e.g. the hello-world ceiling in `examples/hello_ceiling.rs`).
//! `fill` (in `fill.rs`) loads many jobs with batch enqueue and reports rate
//! and server memory as the store grows; `redis.rs` runs `steady` and `drain`
//! against Redis; `postgres.rs` runs `enqueue`, `fill` and `drain` against a
//! plain job queue on PostgreSQL.

pub mod fill;
pub mod postgres;
pub mod redis;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

const QUEUE: &str = "bench";
/// The fetch request of the `drain`, `steady` and `retry` workloads.
const FETCH_ONE: &str = r#"{"queues":["bench"],"count":1}"#;

/// What the load generator reads of a fetch answer. Only these fields are
/// decoded; the rest of each job is skipped without being built, so the
/// client spends its share of the machine on requests, not on parsing.
#[derive(serde::Deserialize)]
struct Fetched<'a> {
    #[serde(borrow)]
    jobs: Vec<FetchedJob<'a>>,
}

#[derive(serde::Deserialize)]
struct FetchedJob<'a> {
    #[serde(borrow)]
    id: std::borrow::Cow<'a, str>,
    attempt: u32,
    /// For `steady`'s jobs `[n, sent]` (see `since_start_us`); kept raw,
    /// as other jobs carry anything.
    #[serde(default, borrow)]
    args: Option<&'a serde_json::value::RawValue>,
}

impl FetchedJob<'_> {
    /// When a stamped job was sent, in `since_start_us` time.
    fn sent_us(&self) -> Option<u64> {
        serde_json::from_str::<(u64, u64)>(self.args?.get()).ok().map(|(_, sent)| sent)
    }
}

impl<'a> Fetched<'a> {
    fn parse(body: &'a [u8]) -> Result<Fetched<'a>, String> {
        serde_json::from_slice(body).map_err(|error| format!("unexpected fetch answer: {error}"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Enqueue,
    Drain,
    Steady,
    Retry,
    Backlog,
    Schedules,
    Ping,
    /// `jobs` three-step chains, then the same number of jobs plain.
    Chain,
    /// `jobs` batches of 100 jobs with an `on_complete` callback, then the
    /// same number of jobs plain.
    Group,
    /// Batch-loads jobs and reports rate and server memory (`fill.rs`).
    Fill,
}

#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// `host:port` of the server.
    pub address: String,
    pub workload: Workload,
    pub connections: usize,
    /// Jobs for `enqueue`, `drain` and `ping`.
    pub jobs: u64,
    /// Duration of `steady`.
    pub duration: Duration,
    /// Total enqueue rate of `steady`, jobs per second.
    pub rate: u64,
    /// Cron entries registered by `schedules`.
    pub crons: u64,
    /// How long `steady`'s consumers let a fetch wait for a job (long
    /// polling); 0 polls an empty queue every millisecond instead.
    pub wait_ms: u64,
    /// `enqueue` gives every job a unique policy, each with a key of its
    /// own (distinct across runs too), so the server's fingerprint index grows.
    pub unique: bool,
    /// `drain` and `steady` consumers ack with `fetch`: one request per job.
    pub ack_fetch: bool,
    /// `--target postgres*`: use the tables an earlier run made, loading
    /// nothing (`postgres.rs`).
    pub shared: bool,
    /// An API key sent with every request (`Authorization: Bearer`).
    pub key: Option<String>,
    /// The length of each `fill` job's JSON text (`fill.rs`).
    pub job_bytes: usize,
}

#[derive(Debug, Clone)]
pub struct BenchReport {
    pub workload: Workload,
    pub connections: usize,
    pub jobs: u64,
    pub requests: u64,
    pub elapsed: Duration,
    /// Request latencies in microseconds, sorted.
    pub latencies_us: Vec<u32>,
    /// `steady`: from sending a job's enqueue to a consumer's fetch getting
    /// it, in microseconds, sorted.
    pub end_to_end_us: Vec<u32>,
    /// `chain` and `group`: the workflows run, how long their creation
    /// took, and the plain drain of as many jobs in the same run.
    pub workflows: Option<WorkflowFigures>,
}

/// What the workflow workloads measure besides their jobs.
#[derive(Debug, Clone)]
pub struct WorkflowFigures {
    pub workflows: u64,
    pub creation: Duration,
    /// The same number of plain jobs, batch-loaded, then fetched and acked.
    pub plain_jobs: u64,
    pub plain_elapsed: Duration,
}

impl BenchReport {
    pub fn jobs_per_second(&self) -> f64 {
        self.jobs as f64 / self.elapsed.as_secs_f64()
    }

    pub fn requests_per_second(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    /// Latency at quantile `q` (0..1) in milliseconds.
    pub fn latency_ms(&self, q: f64) -> f64 {
        quantile_ms(&self.latencies_us, q)
    }
}

/// The `q` quantile of sorted microseconds, in milliseconds.
fn quantile_ms(sorted_us: &[u32], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let index = ((sorted_us.len() as f64 * q) as usize).min(sorted_us.len() - 1);
    f64::from(sorted_us[index]) / 1000.0
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "workload={:?} connections={} jobs={} requests={} elapsed={:.2}s jobs/s={:.0} requests/s={:.0} p50={:.2}ms p99={:.2}ms p999={:.2}ms max={:.2}ms",
            self.workload,
            self.connections,
            self.jobs,
            self.requests,
            self.elapsed.as_secs_f64(),
            self.jobs_per_second(),
            self.requests_per_second(),
            self.latency_ms(0.50),
            self.latency_ms(0.99),
            self.latency_ms(0.999),
            self.latency_ms(1.0)
        )?;
        if !self.end_to_end_us.is_empty() {
            let e2e = |q| quantile_ms(&self.end_to_end_us, q);
            write!(f, " end_to_end_p50={:.2}ms end_to_end_p99={:.2}ms", e2e(0.5), e2e(0.99))?;
        }
        if let Some(figures) = &self.workflows {
            let plain = figures.plain_jobs as f64 / figures.plain_elapsed.as_secs_f64();
            write!(
                f,
                " workflows={} workflows/s={:.0} created/s={:.0} plain_drain_jobs/s={:.0} workflow_job_cost={:.2}x",
                figures.workflows,
                figures.workflows as f64 / self.elapsed.as_secs_f64(),
                figures.workflows as f64 / figures.creation.as_secs_f64(),
                plain,
                plain / self.jobs_per_second(),
            )?;
        }
        Ok(())
    }
}

/// One keep-alive HTTP/1.1 connection.
struct Connection {
    sender: SendRequest<Full<Bytes>>,
    host: String,
}

impl Connection {
    async fn open(address: &str) -> Result<Connection, String> {
        let stream = TcpStream::connect(address).await.map_err(|error| format!("connect {address}: {error}"))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|error| error.to_string())?;
        tokio::spawn(connection);
        Ok(Connection { sender, host: address.to_string() })
    }

    /// Sends a POST and returns (status, body, latency).
    async fn post(&mut self, path: &str, body: impl Into<Bytes>) -> Result<(StatusCode, Bytes, Duration), String> {
        let mut request = Request::post(path).header("host", &self.host).header("content-type", "application/svc+json");
        if let Some(key) = BENCH_KEY.get().and_then(Option::as_ref) {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        let request = request.body(Full::new(body.into())).map_err(|error| error.to_string())?;
        let started = Instant::now();
        self.sender.ready().await.map_err(|error| error.to_string())?;
        let response = self.sender.send_request(request).await.map_err(|error| error.to_string())?;
        let status = response.status();
        let bytes = response.into_body().collect().await.map_err(|error| error.to_string())?.to_bytes();
        Ok((status, bytes, started.elapsed()))
    }
}

fn enqueue_body(n: u64, unique: bool) -> String {
    if unique {
        // The run's start keeps the keys of one run apart from an earlier one's.
        let run = *RUN_NONCE.get_or_init(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_micros())
        });
        return format!(
            r#"{{"type":"bench.job","args":[{n},{run}],"options":{{"queue":"{QUEUE}","unique":{{}},"retry":{{"initial_interval":"PT0.001S","jitter":false}}}}}}"#
        );
    }
    format!(
        r#"{{"type":"bench.job","args":[{n}],"options":{{"queue":"{QUEUE}","retry":{{"initial_interval":"PT0.001S","jitter":false}}}}}}"#
    )
}

static RUN_NONCE: std::sync::OnceLock<u128> = std::sync::OnceLock::new();

/// An enqueue body stamped with when it was sent, for end-to-end latency.
fn stamped_enqueue_body(n: u64) -> String {
    let sent = since_start_us();
    format!(r#"{{"type":"bench.job","args":[{n},{sent}],"options":{{"queue":"{QUEUE}"}}}}"#)
}

/// Fetch; fail every first attempt, ack the second; until all jobs are done.
async fn retry_loop(connection: &mut Connection, options: &BenchOptions, completed: &AtomicU64) -> LoopResult {
    let mut latencies = Vec::new();
    let mut jobs = 0;
    while completed.load(Ordering::SeqCst) < options.jobs {
        let (status, body, latency) = connection.post("/svc/v1/workers/fetch", FETCH_ONE).await?;
        if status != StatusCode::OK {
            return Err(format!("fetch answered {status}: {}", String::from_utf8_lossy(&body)));
        }
        latencies.push(micros(latency));
        let fetched = Fetched::parse(&body)?;
        let Some(job) = fetched.jobs.first() else {
            // The failed ones come back after their 1 ms backoff.
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        };
        let id = &job.id;
        let (path, body) = if job.attempt == 1 {
            (
                "/svc/v1/workers/nack",
                format!(r#"{{"job_id":"{id}","error":{{"type":"Flaky","message":"first try fails"}}}}"#),
            )
        } else {
            ("/svc/v1/workers/ack", format!(r#"{{"job_id":"{id}"}}"#))
        };
        let (status, answer, latency) = connection.post(path, body).await?;
        if status != StatusCode::OK {
            return Err(format!("{path} answered {status}: {}", String::from_utf8_lossy(&answer)));
        }
        latencies.push(micros(latency));
        if path.ends_with("ack") && !path.ends_with("nack") {
            completed.fetch_add(1, Ordering::SeqCst);
            jobs += 1;
        }
    }
    Ok((jobs, latencies))
}

/// Loads queue `backlog` with `jobs` jobs: half claimed (for an hour), half
/// failed once and waiting an hour to retry.
async fn build_backlog(options: &BenchOptions) -> Result<BenchReport, String> {
    let started = Instant::now();
    let mut connection = Connection::open(&options.address).await?;
    let item = r#"{"type":"bench.backlog","args":[],"options":{"queue":"backlog","visibility_timeout_ms":3600000,"timeout_ms":3600000,"retry":{"initial_interval":"PT1H","jitter":false}}}"#;
    let mut loaded = 0;
    while loaded < options.jobs {
        let size = (options.jobs - loaded).min(1000);
        let items = vec![item; size as usize].join(",");
        let (status, body, _) = connection.post("/svc/v1/jobs/batch", format!(r#"{{"jobs":[{items}]}}"#)).await?;
        if status != StatusCode::CREATED {
            return Err(format!("batch enqueue answered {status}: {}", String::from_utf8_lossy(&body)));
        }
        loaded += size;
    }
    let mut claimed = 0u64;
    let mut requests = 0u64;
    while claimed < options.jobs {
        let (status, body, _) =
            connection.post("/svc/v1/workers/fetch", r#"{"queues":["backlog"],"count":100}"#.to_string()).await?;
        let value: serde_json::Value = serde_json::from_slice(&body).map_err(|error| error.to_string())?;
        let jobs = value["jobs"].as_array().cloned().unwrap_or_default();
        if status != StatusCode::OK || jobs.is_empty() {
            break;
        }
        for job in jobs {
            claimed += 1;
            // Every other claimed job fails once and waits an hour to retry.
            if claimed.is_multiple_of(2) {
                let id = job["id"].as_str().unwrap_or_default();
                let nack = format!(r#"{{"job_id":"{id}","error":{{"type":"Later","message":"retry in an hour"}}}}"#);
                connection.post("/svc/v1/workers/nack", nack).await?;
                requests += 1;
            }
        }
        requests += 1;
    }
    Ok(BenchReport {
        workload: Workload::Backlog,
        connections: 1,
        jobs: claimed,
        requests,
        elapsed: started.elapsed(),
        latencies_us: Vec::new(),
        end_to_end_us: Vec::new(),
        workflows: None,
    })
}

/// Registers `options.crons` cron entries (one a minute somewhere in the day,
/// spread evenly) over all connections, then loads `options.jobs` delayed
/// jobs into queue `delayed`, due evenly over the next hour.
async fn build_schedules(options: &BenchOptions) -> Result<BenchReport, String> {
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..options.connections {
        let mut connection = Connection::open(&options.address).await?;
        let (next, total) = (next.clone(), options.crons);
        tasks.push(tokio::spawn(async move {
            let mut requests = 0u64;
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    return Ok::<u64, String>(requests);
                }
                let body = format!(
                    r#"{{"name":"bench-cron-{n}","type":"bench.cron","schedule":"{} {} * * *","queue":"cron-bench"}}"#,
                    n % 60,
                    (n / 60) % 24
                );
                let (status, answer, _) = connection.post("/svc/v1/cron", body).await?;
                if !status.is_success() {
                    return Err(format!("cron registration answered {status}: {}", String::from_utf8_lossy(&answer)));
                }
                requests += 1;
            }
        }));
    }
    let mut requests = 0;
    for task in tasks {
        requests += task.await.map_err(|error| error.to_string())??;
    }
    let mut connection = Connection::open(&options.address).await?;
    let mut loaded = 0u64;
    while loaded < options.jobs {
        let size = (options.jobs - loaded).min(1000);
        let items: Vec<String> = (loaded..loaded + size)
            .map(|n| {
                let delay_s = 1 + n * 3600 / options.jobs.max(1);
                format!(r#"{{"type":"bench.delayed","args":[],"options":{{"queue":"delayed","delay_until":"+PT{delay_s}S"}}}}"#)
            })
            .collect();
        let (status, body, _) =
            connection.post("/svc/v1/jobs/batch", format!(r#"{{"jobs":[{}]}}"#, items.join(","))).await?;
        if status != StatusCode::CREATED {
            return Err(format!("batch enqueue answered {status}: {}", String::from_utf8_lossy(&body)));
        }
        loaded += size;
        requests += 1;
    }
    Ok(BenchReport {
        workload: Workload::Schedules,
        connections: options.connections,
        jobs: loaded,
        requests,
        elapsed: started.elapsed(),
        latencies_us: Vec::new(),
        end_to_end_us: Vec::new(),
        workflows: None,
    })
}

/// `chain` / `group`: first a plain drain of as many jobs as the workflows
/// hold (batch-loaded, then fetched and acked by every connection), then
/// the workflows created over every connection and run to completion the
/// same way. The report's jobs and time are the workflows' run.
async fn run_workflows(options: &BenchOptions) -> Result<BenchReport, String> {
    let (per_workflow, body): (u64, fn(u64) -> String) = match options.workload {
        Workload::Chain => (3, chain_body),
        _ => (101, batch_body),
    };
    let total_jobs = options.jobs * per_workflow;
    let plain = BenchOptions { workload: Workload::Drain, jobs: total_jobs, ..options.clone() };
    preload(&plain).await?;
    let plain_started = Instant::now();
    let (plain_jobs, _) = drain_all(options).await?;
    let plain_elapsed = plain_started.elapsed();

    let creation_started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..options.connections {
        let mut connection = Connection::open(&options.address).await?;
        let (next, total) = (next.clone(), options.jobs);
        tasks.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    return Ok::<(), String>(());
                }
                let (status, answer, _) = connection.post("/svc/v1/workflows", body(n)).await?;
                if status != StatusCode::CREATED {
                    return Err(format!("workflow creation answered {status}: {}", String::from_utf8_lossy(&answer)));
                }
            }
        }));
    }
    for task in tasks {
        task.await.map_err(|error| error.to_string())??;
    }
    let creation = creation_started.elapsed();
    let started = Instant::now();
    let (jobs, latencies_us) = drain_all(options).await?;
    Ok(BenchReport {
        workload: options.workload,
        connections: options.connections,
        jobs,
        requests: latencies_us.len() as u64,
        elapsed: started.elapsed(),
        latencies_us,
        end_to_end_us: Vec::new(),
        workflows: Some(WorkflowFigures { workflows: options.jobs, creation, plain_jobs, plain_elapsed }),
    })
}

/// Fetches and acks from the bench queue over every connection until it is empty.
async fn drain_all(options: &BenchOptions) -> Result<(u64, Vec<u32>), String> {
    let end_to_end = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..options.connections {
        let mut connection = Connection::open(&options.address).await?;
        let end_to_end = end_to_end.clone();
        let ack_fetch = options.ack_fetch;
        tasks.push(tokio::spawn(async move { drain_loop(&mut connection, None, 0, ack_fetch, &end_to_end).await }));
    }
    let (mut jobs, mut latencies) = (0, Vec::new());
    for task in tasks {
        let (done, mut times) = task.await.map_err(|error| error.to_string())??;
        jobs += done;
        latencies.append(&mut times);
    }
    latencies.sort_unstable();
    Ok((jobs, latencies))
}

fn chain_body(n: u64) -> String {
    format!(
        r#"{{"type":"chain","options":{{"queue":"{QUEUE}"}},"steps":[{{"type":"bench.step","args":[{n},0]}},{{"type":"bench.step","args":[{n},1]}},{{"type":"bench.step","args":[{n},2]}}]}}"#
    )
}

fn batch_body(n: u64) -> String {
    let jobs: Vec<String> =
        (0..100).map(|member| format!(r#"{{"type":"bench.part","args":[{n},{member}]}}"#)).collect();
    format!(
        r#"{{"type":"batch","options":{{"queue":"{QUEUE}"}},"jobs":[{}],"callbacks":{{"on_complete":{{"type":"bench.done","args":[{n}]}}}}}}"#,
        jobs.join(",")
    )
}

fn micros(duration: Duration) -> u32 {
    duration.as_micros().min(u128::from(u32::MAX)) as u32
}

/// The API key every request of this run sends, if any.
static BENCH_KEY: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// Runs the `fill` workload against `target` and reports.
pub fn run_fill(options: BenchOptions, target: fill::Target) -> Result<fill::FillReport, String> {
    let _ = BENCH_KEY.set(options.key.clone());
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|error| error.to_string())?;
    runtime.block_on(fill::run(&options, target))
}

/// Runs the steady or drain workload against a Redis server (`redis.rs`).
pub fn run_redis(options: BenchOptions) -> Result<BenchReport, String> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|error| error.to_string())?;
    match options.workload {
        Workload::Drain => runtime.block_on(redis::run_drain(&options)),
        _ => runtime.block_on(redis::run(&options)),
    }
}

/// Runs `enqueue`, `fill` or `drain` against a plain queue on PostgreSQL (`postgres.rs`).
pub fn run_postgres(options: BenchOptions, merged: Option<postgres::Layout>) -> Result<BenchReport, String> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|error| error.to_string())?;
    runtime.block_on(postgres::run(&options, merged))
}

/// Runs a workload to completion and reports.
pub fn run(options: BenchOptions) -> Result<BenchReport, String> {
    let _ = BENCH_KEY.set(options.key.clone());
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|error| error.to_string())?;
    runtime.block_on(run_async(options))
}

async fn run_async(options: BenchOptions) -> Result<BenchReport, String> {
    if matches!(options.workload, Workload::Drain | Workload::Retry) {
        preload(&options).await?;
    }
    if options.workload == Workload::Backlog {
        return build_backlog(&options).await;
    }
    if options.workload == Workload::Schedules {
        return build_schedules(&options).await;
    }
    if matches!(options.workload, Workload::Chain | Workload::Group) {
        return run_workflows(&options).await;
    }
    let counter = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let end_to_end = Arc::new(std::sync::Mutex::new(Vec::new()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..options.connections {
        let mut connection = Connection::open(&options.address).await?;
        let options = options.clone();
        let counter = counter.clone();
        let stop = stop.clone();
        let end_to_end = end_to_end.clone();
        tasks.push(tokio::spawn(async move {
            match options.workload {
                Workload::Enqueue | Workload::Ping => enqueue_loop(&mut connection, &options, &counter).await,
                Workload::Drain => drain_loop(&mut connection, None, 0, options.ack_fetch, &end_to_end).await,
                Workload::Retry => retry_loop(&mut connection, &options, &counter).await,
                Workload::Backlog | Workload::Schedules | Workload::Chain | Workload::Group | Workload::Fill => {
                    unreachable!("run before the loop")
                }
                Workload::Steady if worker % 2 == 0 => paced_enqueue(&mut connection, &options, &stop).await,
                Workload::Steady => {
                    drain_loop(&mut connection, Some(&stop), options.wait_ms, options.ack_fetch, &end_to_end).await
                }
            }
        }));
    }
    if options.workload == Workload::Steady {
        tokio::time::sleep(options.duration).await;
        stop.store(true, Ordering::SeqCst);
    }
    let mut report = gather_report(options.workload, options.connections, tasks, started, &end_to_end).await?;
    if options.workload == Workload::Steady {
        report.jobs = report.jobs.min(report.requests);
    }
    Ok(report)
}

type LoopResult = Result<(u64, Vec<u32>), String>;

/// Waits for a run's connection loops and adds up their jobs and latencies,
/// with the end-to-end delays its consumers recorded.
async fn gather_report(
    workload: Workload,
    connections: usize,
    tasks: Vec<tokio::task::JoinHandle<LoopResult>>,
    started: Instant,
    end_to_end: &std::sync::Mutex<Vec<u32>>,
) -> Result<BenchReport, String> {
    let mut report = BenchReport {
        workload,
        connections,
        jobs: 0,
        requests: 0,
        elapsed: Duration::ZERO,
        latencies_us: Vec::new(),
        end_to_end_us: Vec::new(),
        workflows: None,
    };
    for task in tasks {
        let (jobs, latencies) = task.await.map_err(|error| error.to_string())??;
        report.jobs += jobs;
        report.requests += latencies.len() as u64;
        report.latencies_us.extend(latencies);
    }
    report.elapsed = started.elapsed();
    report.latencies_us.sort_unstable();
    report.end_to_end_us = std::mem::take(&mut *end_to_end.lock().map_err(|_| "a consumer panicked".to_string())?);
    report.end_to_end_us.sort_unstable();
    Ok(report)
}

async fn enqueue_loop(connection: &mut Connection, options: &BenchOptions, counter: &AtomicU64) -> LoopResult {
    let mut latencies = Vec::new();
    let accepted = if options.workload == Workload::Ping { StatusCode::OK } else { StatusCode::CREATED };
    loop {
        let n = counter.fetch_add(1, Ordering::Relaxed);
        if n >= options.jobs {
            return Ok((latencies.len() as u64, latencies));
        }
        let (status, body, latency) = connection.post("/svc/v1/jobs", enqueue_body(n, options.unique)).await?;
        if status != accepted && status != StatusCode::CREATED {
            return Err(format!("enqueue answered {status}: {}", String::from_utf8_lossy(&body)));
        }
        latencies.push(micros(latency));
    }
}

/// Fetch + ack until the queue is empty; with `until` (the `steady`
/// workload), keep fetching from an empty queue until it is set: polling
/// every millisecond, or with `wait_ms`, letting each fetch wait.
async fn drain_loop(
    connection: &mut Connection,
    until: Option<&AtomicBool>,
    wait_ms: u64,
    ack_fetch: bool,
    end_to_end: &std::sync::Mutex<Vec<u32>>,
) -> LoopResult {
    let mut latencies = Vec::new();
    let mut delays = Vec::new();
    let mut jobs = 0;
    let steady = until.is_some();
    let fetch = if wait_ms > 0 {
        format!(r#"{{"queues":["{QUEUE}"],"count":1,"wait_ms":{wait_ms}}}"#)
    } else {
        FETCH_ONE.to_string()
    };
    let finish = |jobs, latencies, delays: Vec<u32>| {
        if let Ok(mut all) = end_to_end.lock() {
            all.extend(delays);
        }
        Ok((jobs, latencies))
    };
    // With `ack_fetch`, the job in hand came with the last ack's answer.
    let mut next: Option<(String, Option<u64>)> = None;
    loop {
        if until.is_some_and(|stop| stop.load(Ordering::SeqCst)) {
            return finish(jobs, latencies, delays);
        }
        let (id, sent) = match next.take() {
            Some(job) => job,
            None => {
                let (status, body, latency) = connection.post("/svc/v1/workers/fetch", fetch.clone()).await?;
                if status != StatusCode::OK {
                    return Err(format!("fetch answered {status}: {}", String::from_utf8_lossy(&body)));
                }
                latencies.push(micros(latency));
                let fetched = Fetched::parse(&body)?;
                let Some(job) = fetched.jobs.first() else {
                    if steady {
                        if wait_ms == 0 {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        continue;
                    }
                    return finish(jobs, latencies, delays);
                };
                (job.id.to_string(), job.sent_us())
            }
        };
        if let Some(sent) = sent {
            delays.push(since_start_us().saturating_sub(sent).min(u64::from(u32::MAX)) as u32);
        }
        let ack = if ack_fetch {
            // The next job comes now if one is ready; an empty queue is
            // asked again by a plain fetch (which may wait).
            format!(r#"{{"job_id":"{id}","fetch":{{"queues":["{QUEUE}"],"count":1}}}}"#)
        } else {
            format!(r#"{{"job_id":"{id}"}}"#)
        };
        let (status, body, latency) = connection.post("/svc/v1/workers/ack", ack).await?;
        if status != StatusCode::OK {
            return Err(format!("ack answered {status}: {}", String::from_utf8_lossy(&body)));
        }
        latencies.push(micros(latency));
        jobs += 1;
        if ack_fetch {
            next = Fetched::parse(&body)?.jobs.first().map(|job| (job.id.to_string(), job.sent_us()));
        }
    }
}

/// Microseconds since the load generator started (the clock producers
/// stamp jobs with and consumers read).
fn since_start_us() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// Enqueues at this connection's share of the total rate until `stop`.
async fn paced_enqueue(connection: &mut Connection, options: &BenchOptions, stop: &AtomicBool) -> LoopResult {
    let producers = options.connections.div_ceil(2).max(1) as f64;
    let interval = Duration::from_secs_f64(producers / options.rate.max(1) as f64);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut latencies = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        ticker.tick().await;
        let (status, body, latency) = connection.post("/svc/v1/jobs", stamped_enqueue_body(n)).await?;
        if status != StatusCode::CREATED {
            return Err(format!("enqueue answered {status}: {}", String::from_utf8_lossy(&body)));
        }
        latencies.push(micros(latency));
        n += 1;
    }
    Ok((0, latencies))
}

/// Loads the jobs a `drain` run takes out, in batches.
async fn preload(options: &BenchOptions) -> Result<(), String> {
    let mut connection = Connection::open(&options.address).await?;
    let mut loaded = 0;
    while loaded < options.jobs {
        let size = (options.jobs - loaded).min(1000);
        let items: Vec<String> = (loaded..loaded + size).map(|n| enqueue_body(n, false)).collect();
        let (status, body, _) =
            connection.post("/svc/v1/jobs/batch", format!(r#"{{"jobs":[{}]}}"#, items.join(","))).await?;
        if status != StatusCode::CREATED {
            return Err(format!("batch enqueue answered {status}: {}", String::from_utf8_lossy(&body)));
        }
        loaded += size;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fetch_request_asks_the_bench_queue_for_one_job() {
        let request: serde_json::Value = serde_json::from_str(FETCH_ONE).unwrap();
        assert_eq!(request, serde_json::json!({"queues": [QUEUE], "count": 1}));
    }

    #[test]
    fn a_fetch_answer_yields_each_jobs_id_and_attempt() {
        let body = br#"{"jobs":[{"specversion":"1.0","id":"019539a4-aaaa-7000-8000-000000000001","type":"t",
            "args":[{"id":"not this one"}],"meta":{},"attempt":2,"retry":{"max_attempts":3}}],"extra":1}"#;
        let fetched = Fetched::parse(body).unwrap();
        let ids: Vec<_> = fetched.jobs.iter().map(|job| (job.id.as_ref(), job.attempt)).collect();
        assert_eq!(ids, vec![("019539a4-aaaa-7000-8000-000000000001", 2)]);
        assert_eq!(fetched.jobs[0].sent_us(), None);
        let stamped = Fetched::parse(br#"{"jobs":[{"id":"x","attempt":1,"args":[7,1234]}]}"#).unwrap();
        assert_eq!(stamped.jobs[0].sent_us(), Some(1234));
        assert!(Fetched::parse(br#"{"jobs":[]}"#).unwrap().jobs.is_empty());
        assert!(Fetched::parse(b"not json").is_err());
    }
}
