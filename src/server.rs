//! Wiring only: open the engine, bind, serve HTTP, and stop in order.
//!
//! Stop order: drain (on SIGTERM/SIGINT: no new claims, workers told to
//! terminate, until no job is active or the grace period ends), stop
//! accepting, let in-flight requests finish (up to 5 s), then close the
//! engine (final snapshot). A failed log sync stops the server
//! with an error after a short grace period, so a supervisor restarts it into
//! recovery.

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::config::Config;
use crate::engine::pool::Pool;
use crate::engine::{Engine, EngineConfig};
use crate::http::connection::{ConnectionSlots, WriteTimeout, refuse};
use crate::http::connection::{connection_cap, open_descriptors, raise_open_file_limit};
use crate::http::{AppState, serve_request};
use crate::limits::{POISON_EXIT_DELAY_MS, WRITE_TIMEOUT_MS};
use crate::storage::StorageError;

const IN_FLIGHT_GRACE: Duration = Duration::from_secs(5);
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a drain checks whether jobs are still active.
const DRAIN_POLL: Duration = Duration::from_millis(50);
/// After an accept fails for want of descriptors or memory, accepting waits
/// this long, doubling up to `ACCEPT_BACKOFF_MAX` while it keeps failing:
/// the pending connection stays ready, so retrying at once would spin.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Accept failures are logged as a count at most this often.
const ACCEPT_ERROR_LOG_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub enum ServerError {
    Storage(StorageError),
    Bind(String, std::io::Error),
    Runtime(std::io::Error),
    /// The write-ahead log failed; restart to recover.
    StorageFailed,
    /// The webhook settings cannot be used (an unreadable CA bundle).
    Webhooks(String),
    /// The PostgreSQL backend could not start (unreachable, refused, or a
    /// schema newer than this binary).
    Postgres(String),
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerError::Storage(error) => write!(f, "cannot open the data dir: {error}"),
            ServerError::Bind(address, error) => write!(f, "cannot listen on {address}: {error}"),
            ServerError::Runtime(error) => write!(f, "cannot start the runtime: {error}"),
            ServerError::Webhooks(problem) => write!(f, "webhooks: {problem}"),
            ServerError::Postgres(problem) => write!(f, "cannot start on PostgreSQL: {problem}"),
            ServerError::StorageFailed => f.write_str(
                "the engine accepts no more writes (the log failed, or the engine stopped); restart to recover",
            ),
        }
    }
}

impl std::error::Error for ServerError {}

/// The engine settings a server config implies.
pub fn engine_config(config: &Config) -> EngineConfig {
    let mut engine = EngineConfig::new(&config.data_dir);
    engine.snapshot_log_bytes = config.snapshot_log_bytes;
    if !config.direct_writes {
        engine.file_system = Arc::new(crate::storage::PageCacheFileSystem);
    }
    engine.retention = config.retention;
    engine.defaults = config.jobs.clone();
    engine.cron_entries_max = config.cron_entries_max;
    engine.delivery_timeout_ms = config.webhooks_timeout_ms as i64;
    engine.webhook_limits = config.webhook_limits;
    engine.max_schemas = config.max_schemas;
    engine.max_live_bytes = config.max_live_bytes;
    engine
}

/// What the server is told from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Begin a graceful shutdown: drain, then stop (docs/api.md, "Shutting down").
    Drain,
    /// Stop now: close the listener, give in-flight requests 5 s, snapshot.
    Stop,
}

/// A server running on a thread of its own (tests, embedding).
pub struct RunningServer {
    pub addr: SocketAddr,
    /// The engine behind the server (tests use it to tick a manual clock).
    pub engine: crate::engine::EngineHandle,
    control: Option<mpsc::UnboundedSender<Control>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServerError>>>,
}

impl RunningServer {
    /// Stops the server at once (no drain) and waits for it.
    pub fn stop(mut self) -> Result<(), ServerError> {
        if let Some(control) = self.control.take() {
            let _ = control.send(Control::Stop);
        }
        self.join()
    }

    /// Begins a graceful shutdown, as SIGTERM does; `join` waits for its end.
    pub fn drain(&self) {
        if let Some(control) = &self.control {
            let _ = control.send(Control::Drain);
        }
    }

    /// Waits until the server stops by itself (e.g. after a storage failure).
    pub fn join(mut self) -> Result<(), ServerError> {
        match self.thread.take() {
            Some(thread) => thread.join().unwrap_or(Err(ServerError::StorageFailed)),
            None => Ok(()),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Some(control) = self.control.take() {
            let _ = control.send(Control::Stop);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Opens the engine, binds, and serves on a background thread.
pub fn start(config: &Config, mut engine_config: EngineConfig) -> Result<RunningServer, ServerError> {
    let open_file_limit = raise_open_file_limit();
    let runtime = build_runtime()?;
    let client = webhook_client(config)?;
    // Bound first: a start that fails on a busy port leaves no data dir behind.
    let listener = runtime
        .block_on(TcpListener::bind(&config.listen))
        .map_err(|error| ServerError::Bind(config.listen.clone(), error))?;
    let addr = listener.local_addr().map_err(|error| ServerError::Bind(config.listen.clone(), error))?;
    let pool = Pool::attach(&mut engine_config, client.clone(), config.webhooks_priority);
    let engine = Engine::open(engine_config).map_err(ServerError::Storage)?;
    let deliveries = pool.spawn(engine.handle().clone()).map_err(ServerError::Runtime)?;
    runtime.spawn(save_throughput_every_minute(engine.handle().clone(), config.data_dir.clone()));
    let handle = engine.handle().clone();
    let (control, controls) = mpsc::unbounded_channel();
    let timeout = Duration::from_millis(config.request_timeout_ms);
    let grace = Duration::from_millis(config.shutdown_grace_ms);
    let caps = ConnectionCaps::for_config(config, open_file_limit);
    let app_config = config.clone();
    let thread = std::thread::Builder::new()
        .name("svc-server".into())
        .spawn(move || {
            let app = Arc::new(app_state(AppState::new(engine.handle().clone(), timeout), &app_config, client));
            let outcome = runtime.block_on(serve(listener, app, controls, grace, caps));
            engine.close();
            stop_deliveries(deliveries);
            outcome
        })
        .map_err(ServerError::Runtime)?;
    Ok(RunningServer { addr, engine: handle, control: Some(control), thread: Some(thread) })
}

/// Runs `svc serve` in the foreground until SIGTERM or SIGINT.
pub fn run(config: &Config) -> Result<(), ServerError> {
    let open_file_limit = raise_open_file_limit();
    let runtime = build_runtime()?;
    let client = webhook_client(config)?;
    let mut settings = engine_config(config);
    // Bound first: a start that fails on a busy port leaves no data dir behind.
    let listener = runtime
        .block_on(TcpListener::bind(&config.listen))
        .map_err(|error| ServerError::Bind(config.listen.clone(), error))?;
    let addr = listener.local_addr().map_err(|error| ServerError::Bind(config.listen.clone(), error))?;
    let caps = ConnectionCaps::for_config(config, open_file_limit);
    if let Some(postgres) = &config.postgres {
        return run_on_postgres(config, postgres, runtime, listener, caps, client);
    }
    let pool = Pool::attach(&mut settings, client.clone(), config.webhooks_priority);
    let engine = Engine::open(settings).map_err(ServerError::Storage)?;
    let deliveries = pool.spawn(engine.handle().clone()).map_err(ServerError::Runtime)?;
    runtime.spawn(save_throughput_every_minute(engine.handle().clone(), config.data_dir.clone()));
    tracing::info!(
        address = %addr,
        data_dir = %config.data_dir.display(),
        max_connections = caps.total,
        max_connections_per_address = caps.per_address,
        open_file_limit = open_file_limit.unwrap_or(0),
        "svc listening"
    );
    let timeout = Duration::from_millis(config.request_timeout_ms);
    let app = Arc::new(app_state(AppState::new(engine.handle().clone(), timeout), config, client));
    let grace = Duration::from_millis(config.shutdown_grace_ms);
    let outcome = runtime.block_on(async {
        let (control, controls) = mpsc::unbounded_channel();
        tokio::spawn(forward_signals(control));
        serve(listener, app, controls, grace, caps).await
    });
    engine.close();
    stop_deliveries(deliveries);
    tracing::info!("svc stopped");
    outcome
}

/// How many connections the server serves at once, overall and per address.
#[derive(Debug, Clone, Copy)]
struct ConnectionCaps {
    total: usize,
    per_address: usize,
}

impl ConnectionCaps {
    /// The configured caps, lowered to fit the open-file limit with room for
    /// the log, snapshots and webhook sockets (a warning says so).
    fn for_config(config: &Config, open_file_limit: Option<u64>) -> ConnectionCaps {
        let total = match open_file_limit {
            Some(limit) => {
                // Idle kept-alive webhook connections may outnumber those in flight.
                let webhook_sockets = config.webhook_limits.concurrency.saturating_mul(2);
                let cap = connection_cap(config.max_connections, limit, open_descriptors(), webhook_sockets);
                if cap < config.max_connections {
                    tracing::warn!(
                        configured = config.max_connections,
                        serving = cap,
                        open_file_limit = limit,
                        "http.max_connections is lowered to fit the open-file limit; raise the limit (LimitNOFILE=) to serve more"
                    );
                }
                cap
            }
            None => config.max_connections,
        };
        ConnectionCaps { total, per_address: config.max_connections_per_address.min(total) }
    }
}

/// The client webhook attempts go out through, as the config sets it up.
fn webhook_client(config: &Config) -> Result<crate::webhook::client::DeliveryClient, ServerError> {
    crate::webhook::client::DeliveryClient::new(
        config.webhooks_allow_private_targets,
        config.webhooks_extra_ca_file.as_deref(),
    )
    .map_err(ServerError::Webhooks)
}

/// Runs `svc serve --postgres` in the foreground: a stateless node on the
/// database (docs/postgres.md), until SIGTERM or SIGINT.
fn run_on_postgres(
    config: &Config,
    postgres: &crate::backend::postgres::PgSettings,
    runtime: tokio::runtime::Runtime,
    listener: TcpListener,
    caps: ConnectionCaps,
    client: crate::webhook::client::DeliveryClient,
) -> Result<(), ServerError> {
    let clock: Arc<dyn crate::clock::Clock> = Arc::new(crate::clock::SystemClock);
    // Unique among the nodes, whatever their host names and process ids.
    let node = format!("node-{:016x}", rand::random::<u64>());
    // Finished jobs are kept as long as on the local engine.
    let mut postgres = postgres.clone();
    postgres.retention = config.retention;
    postgres.max_schemas = config.max_schemas;
    postgres.max_cron = config.cron_entries_max;
    postgres.webhook_limits = config.webhook_limits;
    postgres.delivery_timeout = Duration::from_millis(config.webhooks_timeout_ms);
    postgres.delivery_priority = config.webhooks_priority;
    let mut backend = runtime
        .block_on(crate::backend::postgres::PgBackend::start(&postgres, clock.clone(), node.clone()))
        .map_err(|error| ServerError::Postgres(error.to_string()))?;
    backend.deliver(client.clone()).map_err(ServerError::Runtime)?;
    let addr = listener.local_addr().map_err(|error| ServerError::Bind(config.listen.clone(), error))?;
    tracing::info!(address = %addr, backend = "postgres", node, max_connections = caps.total, "svc listening");
    let timeout = Duration::from_millis(config.request_timeout_ms);
    let metrics = backend.metrics();
    let app = AppState::with_backend(Arc::new(backend), clock, Arc::new(config.jobs.clone()), metrics, timeout);
    let app = Arc::new(app_state(app, config, client));
    let grace = Duration::from_millis(config.shutdown_grace_ms);
    let outcome = runtime.block_on(async {
        let (control, controls) = mpsc::unbounded_channel();
        tokio::spawn(forward_signals(control));
        serve(listener, app, controls, grace, caps).await
    });
    tracing::info!("svc stopped");
    outcome
}

/// The front end's settings from the config, on top of `app`.
fn app_state(app: AppState, config: &Config, client: crate::webhook::client::DeliveryClient) -> AppState {
    let app = match config.rate_limit {
        Some((requests, window_s)) => app.with_rate_limit(requests, window_s),
        None => app,
    };
    let mut app = app.with_keys(config.api_keys.clone());
    app.metrics_public = config.metrics_public;
    app.ui_prefix = config.ui_prefix.clone();
    app.webhooks_allow_private_targets = config.webhooks_allow_private_targets;
    app.webhook_client = Some(client);
    app.webhook_timeout = Duration::from_millis(config.webhooks_timeout_ms);
    // A server bound beyond loopback without keys sits behind a proxy that
    // authenticates (`--insecure-no-auth`), whose host names it cannot
    // know; web pages are kept out all the same.
    let guard = if config.binds_loopback_only() {
        crate::http::auth::BrowserGuard::new(&config.listen)
    } else {
        crate::http::auth::BrowserGuard::any_host()
    };
    app.with_failed_attempt_limit(config.auth_failed_attempts_per_minute)
        .with_browser_guard(guard.allow_origins(&config.http_allowed_origins))
}

/// Writes the per-minute throughput history to the data dir every minute,
/// so that a crash loses at most a minute of it (a clean stop writes it too).
async fn save_throughput_every_minute(engine: crate::engine::EngineHandle, dir: std::path::PathBuf) {
    let mut every = tokio::time::interval(Duration::from_secs(60));
    every.tick().await;
    loop {
        every.tick().await;
        let (engine, dir) = (engine.clone(), dir.clone());
        let saved = tokio::task::spawn_blocking(move || engine.save_throughput(&dir)).await;
        if let Ok(Err(error)) = saved {
            tracing::warn!(%error, "the throughput history was not saved");
        }
    }
}

/// Stops the delivery pool once the engine has stopped: attempts still in
/// flight are counted already and go out again at the next start.
fn stop_deliveries(runtime: tokio::runtime::Runtime) {
    runtime.shutdown_timeout(Duration::from_secs(1));
}

fn build_runtime() -> Result<tokio::runtime::Runtime, ServerError> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(ServerError::Runtime)
}

/// SIGTERM or SIGINT starts a graceful shutdown; a second one stops at once.
async fn forward_signals(control: mpsc::UnboundedSender<Control>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut terminate), Ok(mut interrupt)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return;
    };
    for order in [Control::Drain, Control::Stop] {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        let _ = control.send(order);
    }
}

/// Accepts connections until told to stop, a drain finishes, or storage fails.
///
/// A drain keeps serving while `/ready` answers 503, fetch hands out nothing
/// and heartbeats answer `terminate`, until no job is active or `grace` ends.
async fn serve(
    listener: TcpListener,
    app: Arc<AppState>,
    mut controls: mpsc::UnboundedReceiver<Control>,
    grace: Duration,
    caps: ConnectionCaps,
) -> Result<(), ServerError> {
    let graceful = GracefulShutdown::new();
    let slots = ConnectionSlots::new(caps.total, caps.per_address);
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT).keep_alive(true);
    let storage_watch = watch_storage(app.clone());
    tokio::pin!(storage_watch);
    let mut drain_ends: Option<tokio::time::Instant> = None;
    let mut accept_errors = AcceptErrors::default();
    let mut outcome = Ok(());
    loop {
        tokio::select! {
            accepted = listener.accept(), if accept_errors.may_accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => {
                        accept_errors.succeeded();
                        accepted
                    }
                    Err(error) => {
                        accept_errors.failed(&error);
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let slot = match slots.take(peer.ip()) {
                    Ok(slot) => slot,
                    Err(reason) => {
                        // Each answer holds a descriptor for up to a second:
                        // past a few at once, the connection is just closed.
                        if let Some(refusal) = slots.refusal() {
                            tokio::spawn(refuse(stream, reason, refusal));
                        }
                        continue;
                    }
                };
                let app = app.clone();
                let principal = app.principal(peer.ip());
                let service = service_fn(move |request| serve_request(app.clone(), principal.clone(), request));
                let stream = WriteTimeout::new(stream, Duration::from_millis(WRITE_TIMEOUT_MS));
                let connection = builder.serve_connection(TokioIo::new(stream), service);
                let watched = graceful.watch(connection);
                tokio::spawn(async move {
                    let _ = watched.await;
                    drop(slot);
                });
            }
            () = accept_errors.backoff(), if !accept_errors.may_accept() => accept_errors.resume(),
            control = controls.recv() => match control {
                Some(Control::Drain) if drain_ends.is_none() => {
                    tracing::info!(grace_ms = grace.as_millis() as u64, "draining: no new claims; waiting for active jobs");
                    app.shutting_down.store(true, Ordering::SeqCst);
                    let _ = app.backend.begin_drain().outcome().await;
                    drain_ends = Some(tokio::time::Instant::now() + grace);
                }
                Some(Control::Drain) => {}
                Some(Control::Stop) | None => break,
            },
            () = tokio::time::sleep(DRAIN_POLL), if drain_ends.is_some() => {
                let active = app.backend.active_jobs();
                if active == 0 || drain_ends.is_some_and(|ends| tokio::time::Instant::now() >= ends) {
                    tracing::info!(active_jobs = active, "drain finished");
                    break;
                }
            }
            () = &mut storage_watch => {
                outcome = Err(ServerError::StorageFailed);
                break;
            }
        }
    }
    app.shutting_down.store(true, Ordering::SeqCst);
    drop(listener);
    let _ = tokio::time::timeout(IN_FLIGHT_GRACE, graceful.shutdown()).await;
    outcome
}

/// Completes a short while after the log fails, so that clients still get
/// 503 answers (and health reports the failure) before the process goes.
async fn watch_storage(app: Arc<AppState>) {
    app.backend.failed().await;
    let reason = app.backend.failure().map_or("unknown", |failure| failure.code());
    let cause = app.backend.failure_cause().unwrap_or_else(|| "not known".to_string());
    tracing::error!(reason = reason, cause = %cause, "stopping: the engine accepts no more writes");
    tokio::time::sleep(Duration::from_millis(POISON_EXIT_DELAY_MS)).await;
}

/// Failed accepts: while they fail for want of a resource, accepting pauses
/// (doubling from [`ACCEPT_BACKOFF_MIN`]) instead of spinning on the same
/// pending connection; they are logged as a count at most once a minute.
#[derive(Default)]
struct AcceptErrors {
    /// Accepting waits until then.
    paused_until: Option<tokio::time::Instant>,
    backoff: Option<Duration>,
    unlogged: u64,
    last_logged: Option<std::time::Instant>,
}

impl AcceptErrors {
    fn may_accept(&self) -> bool {
        self.paused_until.is_none()
    }

    fn succeeded(&mut self) {
        self.backoff = None;
    }

    fn failed(&mut self, error: &std::io::Error) {
        self.unlogged += 1;
        if self.last_logged.is_none_or(|at| at.elapsed() >= ACCEPT_ERROR_LOG_EVERY) {
            tracing::warn!(
                error = %error,
                failures = self.unlogged,
                "accepting connections failed (counted since the last such line)"
            );
            self.unlogged = 0;
            self.last_logged = Some(std::time::Instant::now());
        }
        // Errors of one connection (reset before it was taken) need no pause.
        let wants_a_pause =
            matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM));
        if wants_a_pause {
            let backoff = self.backoff.map_or(ACCEPT_BACKOFF_MIN, |last| (last * 2).min(ACCEPT_BACKOFF_MAX));
            self.backoff = Some(backoff);
            self.paused_until = Some(tokio::time::Instant::now() + backoff);
        }
    }

    /// Completes when the pause ends (pending for ever when not paused).
    async fn backoff(&self) {
        match self.paused_until {
            Some(until) => tokio::time::sleep_until(until).await,
            None => std::future::pending().await,
        }
    }

    fn resume(&mut self) {
        self.paused_until = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn accepting_pauses_and_backs_off_while_descriptors_run_out() {
        let mut errors = AcceptErrors::default();
        let out_of_descriptors = std::io::Error::from_raw_os_error(libc::EMFILE);
        let mut pauses = Vec::new();
        for _ in 0..10 {
            errors.failed(&out_of_descriptors);
            assert!(!errors.may_accept(), "no accept is tried during a pause");
            let started = tokio::time::Instant::now();
            errors.backoff().await;
            pauses.push(started.elapsed());
            errors.resume();
        }
        assert_eq!(pauses[0], ACCEPT_BACKOFF_MIN);
        assert_eq!(pauses[1], ACCEPT_BACKOFF_MIN * 2);
        assert_eq!(*pauses.last().unwrap(), ACCEPT_BACKOFF_MAX, "doubling stops at the most");
        errors.succeeded();
        errors.failed(&out_of_descriptors);
        let started = tokio::time::Instant::now();
        errors.backoff().await;
        assert_eq!(started.elapsed(), ACCEPT_BACKOFF_MIN, "a success starts the doubling over");
        errors.resume();
        // A connection reset before it was taken is no reason to pause.
        errors.failed(&std::io::Error::from_raw_os_error(libc::ECONNABORTED));
        assert!(errors.may_accept());
    }
}
