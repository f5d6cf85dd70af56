//! The worker: fetches jobs from a [`WorkSource`] (a server, or an
//! embedded svc), runs their handlers, and reports what came of them.

mod context;
mod runtime;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use context::HandlerFn;
pub use context::{CancelReason, JobContext, JobError, Middleware, Next};

use crate::error::{Error, Result};
use crate::source::WorkSource;

/// How a worker runs: [`Worker::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct WorkerBuilder {
    queues: Vec<String>,
    concurrency: usize,
    worker_id: Option<String>,
    visibility_timeout: Option<Duration>,
    heartbeat_interval: Option<Duration>,
    poll_wait: Duration,
    shutdown_grace: Duration,
    abort_grace: Duration,
    quiet_poll: Duration,
    handle_signals: bool,
    reconnect_base: Duration,
    reconnect_max: Duration,
}

impl Default for WorkerBuilder {
    fn default() -> Self {
        WorkerBuilder {
            queues: vec!["default".to_string()],
            concurrency: 10,
            worker_id: None,
            visibility_timeout: None,
            heartbeat_interval: None,
            poll_wait: Duration::from_secs(20),
            shutdown_grace: Duration::from_secs(25),
            abort_grace: Duration::from_secs(2),
            quiet_poll: Duration::from_secs(10),
            handle_signals: true,
            reconnect_base: Duration::from_millis(200),
            reconnect_max: Duration::from_secs(5),
        }
    }
}

impl WorkerBuilder {
    /// The queues to take jobs from, most important first: a job of a later
    /// queue is taken only when the earlier ones have none (default `default`).
    pub fn queues<I: IntoIterator<Item = S>, S: Into<String>>(mut self, queues: I) -> Self {
        self.queues = queues.into_iter().map(Into::into).collect();
        self
    }

    /// Jobs run at once (default 10). The worker claims only as many jobs
    /// as it has free slots.
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// The worker's id in svc's registry (`A-Z a-z 0-9 . _ : @ -`, at most
    /// 256); default `<host>-<pid>-<random>`.
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    /// The visibility timeout asked for at each fetch and heartbeat
    /// (default: each job's own).
    pub fn visibility_timeout(mut self, timeout: Duration) -> Self {
        self.visibility_timeout = Some(timeout);
        self
    }

    /// The heartbeat period (default: a third of the shortest visibility
    /// timeout of the jobs in hand).
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = Some(interval);
        self
    }

    /// How long a fetch waits for a job when there is none (long polling;
    /// default and most 20 s): an idle worker sends one request per period.
    pub fn poll_wait(mut self, wait: Duration) -> Self {
        self.poll_wait = wait.clamp(Duration::from_millis(1), Duration::from_secs(20));
        self
    }

    /// On shutdown, how long the jobs in hand may run on before they are
    /// cancelled and released (default 25 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// How long a cancelled handler (shutdown, terminate) may take to
    /// return before its job is released anyway (default 2 s).
    pub fn abort_grace(mut self, grace: Duration) -> Self {
        self.abort_grace = grace;
        self
    }

    /// While told to be quiet and idle, how often to ask whether the
    /// signal was lifted (default 10 s).
    pub fn quiet_poll(mut self, every: Duration) -> Self {
        self.quiet_poll = every.max(Duration::from_millis(10));
        self
    }

    /// Whether SIGTERM and SIGINT stop the worker gracefully (default
    /// `true`; a second signal cuts the grace period short).
    pub fn handle_signals(mut self, handle: bool) -> Self {
        self.handle_signals = handle;
        self
    }

    /// The backoff of fetches while svc cannot be reached (default 200 ms
    /// doubling to 5 s, with jitter).
    pub fn reconnect_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.reconnect_base = base.max(Duration::from_millis(1));
        self.reconnect_max = max.max(self.reconnect_base);
        self
    }

    /// A worker taking its jobs from `source`: a [`Client`](crate::Client),
    /// or an embedded `svc::Svc` (`Arc<svc::Svc>`, feature `embedded`).
    pub fn build(self, source: impl WorkSource) -> Worker {
        let worker_id = self.worker_id.clone().unwrap_or_else(default_worker_id);
        Worker {
            source: Arc::new(source),
            config: self,
            worker_id,
            handlers: HashMap::new(),
            middleware: Vec::new(),
            stop: StopHandle { graceful: CancellationToken::new(), now: CancellationToken::new() },
        }
    }
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "worker".to_string());
    let host: String = host
        .trim()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "._:@-".contains(c) { c } else { '-' })
        .take(200)
        .collect();
    let host = if host.is_empty() { "worker".to_string() } else { host };
    format!("{host}-{}-{:06x}", std::process::id(), rand::random::<u32>() & 0xff_ffff)
}

/// Stops a running worker from elsewhere: [`Worker::stop_handle`].
#[derive(Debug, Clone)]
pub struct StopHandle {
    graceful: CancellationToken,
    now: CancellationToken,
}

impl StopHandle {
    /// Stops taking work; the jobs in hand may finish within the shutdown
    /// grace, then are cancelled and released.
    pub fn stop(&self) {
        self.graceful.cancel();
    }

    /// Stops at once: the jobs in hand are cancelled now and, unless their
    /// handlers return within the abort grace, released.
    pub fn stop_now(&self) {
        self.graceful.cancel();
        self.now.cancel();
    }
}

/// Fetches jobs and runs their handlers.
///
/// ```no_run
/// # async fn run() -> svc_client::Result<()> {
/// use svc_client::{Client, JobContext, Worker};
///
/// #[derive(serde::Deserialize)]
/// struct Email { to: String }
///
/// let client = Client::new("http://127.0.0.1:8080")?;
/// let mut worker = Worker::builder().queues(["mail", "default"]).concurrency(8).build(client);
/// worker.handle("email.send", |email: Email, ctx: JobContext| async move {
///     ctx.progress(0.5, Some("connecting")).await?;
///     Ok(serde_json::json!({ "sent_to": email.to }))
/// });
/// worker.run().await // until SIGTERM or SIGINT
/// # }
/// ```
///
/// The worker long-polls for jobs (`wait_ms`), claims only as many as it
/// has free slots, and acks each result in the request that claims the
/// next job (acks of several jobs that finished together go in one
/// request). A handler's `Ok` value is the job's result; an `Err` nacks the
/// job with its type, message and causes, and the retry policy decides
/// what follows. Jobs of a type without a handler are nacked with type
/// `unknown_job_type`. See the crate documentation for heartbeats, quiet
/// and terminate, timeouts, shutdown and reconnects.
pub struct Worker {
    source: Arc<dyn WorkSource>,
    config: WorkerBuilder,
    worker_id: String,
    handlers: HashMap<String, Arc<HandlerFn>>,
    middleware: Vec<Arc<dyn Middleware>>,
    stop: StopHandle,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut types: Vec<&String> = self.handlers.keys().collect();
        types.sort();
        f.debug_struct("Worker")
            .field("worker_id", &self.worker_id)
            .field("queues", &self.config.queues)
            .field("concurrency", &self.config.concurrency)
            .field("handles", &types)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A builder with the defaults: queue `default`, concurrency 10.
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder::default()
    }

    /// This worker's id in svc's registry.
    pub fn id(&self) -> &str {
        &self.worker_id
    }

    /// Registers the handler of a job type. `T` is read from the job's
    /// `args` with serde: when `args` holds one value, from that value
    /// (else from the array), otherwise from the array, so a struct takes
    /// one object argument and a tuple several. The handler's `Ok` value,
    /// anything `Serialize` (`()` for none), is the job's result; its `Err`
    /// is a [`JobError`], which any `std::error::Error` converts into (`?`).
    pub fn handle<T, R, F, Fut>(&mut self, job_type: impl Into<String>, handler: F) -> &mut Self
    where
        T: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        F: Fn(T, JobContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<R, JobError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let erased: Arc<HandlerFn> = Arc::new(move |args: Vec<Value>, ctx: JobContext| {
            let handler = handler.clone();
            Box::pin(async move {
                let args: T = crate::types::args_from(&args)
                    .map_err(|error| JobError::new("invalid_args", error.message().to_string()))?;
                let result = handler(args, ctx).await?;
                serde_json::to_value(result).map_err(|error| {
                    JobError::new("invalid_result", format!("the result does not serialize to JSON: {error}"))
                })
            })
        });
        self.handlers.insert(job_type.into(), erased);
        self
    }

    /// Adds middleware around every execution (the first added runs
    /// outermost). Any `Fn(JobContext, Next) -> impl Future<Output =
    /// Result<Value, JobError>>` is one:
    ///
    /// ```no_run
    /// # fn add(worker: &mut svc_client::Worker) {
    /// use svc_client::{JobContext, Next};
    ///
    /// worker.wrap(|ctx: JobContext, next: Next| async move {
    ///     let started = std::time::Instant::now();
    ///     let outcome = next.run(ctx.clone()).await;
    ///     tracing::info!(job = ctx.job_id(), trace = ctx.traceparent(), took = ?started.elapsed());
    ///     outcome
    /// });
    /// # }
    /// ```
    pub fn wrap(&mut self, middleware: impl Middleware) -> &mut Self {
        self.middleware.push(Arc::new(middleware));
        self
    }

    /// A handle that stops the worker from elsewhere (take it before
    /// [`Worker::run`]).
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Runs until stopped: by SIGTERM or SIGINT (unless
    /// [`WorkerBuilder::handle_signals`] is off), a [`StopHandle`], or svc's
    /// `terminate` signal. Returns once every job in hand was acked or
    /// released; an error only when the worker cannot work at all (a
    /// refused key, an invalid queue name).
    pub async fn run(self) -> Result<()> {
        self.run_until(std::future::pending()).await
    }

    /// [`Worker::run`], also stopping gracefully once `stop` completes.
    pub async fn run_until(self, stop: impl Future<Output = ()> + Send) -> Result<()> {
        self.start(stop, false).await
    }

    /// Runs until there is nothing left to do: no job available in its
    /// queues (fetches do not wait) and none in hand. Jobs scheduled for
    /// later, or waiting for a retry, are not waited for. Meant for tests:
    /// with an embedded svc on a temporary directory, the handlers run in
    /// process, through the same code as in production.
    pub async fn run_until_idle(self) -> Result<()> {
        self.start(std::future::pending(), true).await
    }

    async fn start(self, stop: impl Future<Output = ()> + Send, until_idle: bool) -> Result<()> {
        check_queues(&self.config.queues)?;
        if !self.worker_id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:@-".contains(&b))
            || self.worker_id.is_empty()
            || self.worker_id.len() > 256
        {
            return Err(Error::invalid(Some("worker_id".into()), "1 to 256 characters of A-Z a-z 0-9 . _ : @ -"));
        }
        let signals = if self.config.handle_signals && !until_idle {
            Some(tokio::spawn(listen_for_signals(self.stop.clone())))
        } else {
            None
        };
        let stop_handle = self.stop.clone();
        let outcome = {
            let run = runtime::run(self, until_idle);
            tokio::pin!(run);
            tokio::select! {
                outcome = &mut run => outcome,
                () = stop => {
                    stop_handle.stop();
                    run.await
                }
            }
        };
        if let Some(signals) = signals {
            signals.abort();
        }
        outcome
    }
}

fn check_queues(queues: &[String]) -> Result<()> {
    let valid = |name: &str| {
        (1..=128).contains(&name.len())
            && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    };
    if queues.is_empty() || queues.len() > 32 {
        return Err(Error::invalid(Some("queues".into()), "a worker takes jobs from 1 to 32 queues"));
    }
    if let Some(bad) = queues.iter().find(|name| !valid(name)) {
        return Err(Error::invalid(
            Some("queues".into()),
            format!("{bad:?} is not a queue name (1-128 of a-z 0-9 . -, starting with a letter or digit)"),
        ));
    }
    Ok(())
}

#[cfg(unix)]
async fn listen_for_signals(stop: StopHandle) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::warn!(target: "svc_client::worker", "cannot listen for SIGTERM and SIGINT");
        return;
    };
    for count in 0.. {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        if count == 0 {
            tracing::info!(target: "svc_client::worker", signal = name, "stopping; the jobs in hand may finish");
            stop.stop();
        } else {
            tracing::warn!(target: "svc_client::worker", signal = name, "stopping now: releasing the jobs in hand");
            stop.stop_now();
        }
    }
}

#[cfg(not(unix))]
async fn listen_for_signals(stop: StopHandle) {
    let mut count = 0;
    while tokio::signal::ctrl_c().await.is_ok() {
        if count == 0 {
            stop.stop()
        } else {
            stop.stop_now()
        }
        count += 1;
    }
}
