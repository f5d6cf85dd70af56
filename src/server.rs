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
use crate::engine::{Engine, EngineConfig};
use crate::http::connection::{ConnectionSlots, WriteTimeout, refuse};
use crate::http::{AppState, serve_request};
use crate::limits::{POISON_EXIT_DELAY_MS, WRITE_TIMEOUT_MS};
use crate::storage::StorageError;
use crate::webhook::pool::Pool;

const IN_FLIGHT_GRACE: Duration = Duration::from_secs(5);
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a drain checks whether jobs are still active.
const DRAIN_POLL: Duration = Duration::from_millis(50);

#[derive(Debug)]
pub enum ServerError {
    Storage(StorageError),
    Bind(String, std::io::Error),
    Runtime(std::io::Error),
    /// The write-ahead log failed; restart to recover.
    StorageFailed,
    /// The webhook settings cannot be used (an unreadable CA bundle).
    Webhooks(String),
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerError::Storage(error) => write!(f, "cannot open the data dir: {error}"),
            ServerError::Bind(address, error) => write!(f, "cannot listen on {address}: {error}"),
            ServerError::Runtime(error) => write!(f, "cannot start the runtime: {error}"),
            ServerError::Webhooks(problem) => write!(f, "webhooks: {problem}"),
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
    let runtime = build_runtime()?;
    let client = webhook_client(config)?;
    let pool = Pool::attach(&mut engine_config, client.clone(), config.webhooks_priority);
    let engine = Engine::open(engine_config).map_err(ServerError::Storage)?;
    let deliveries = pool.spawn(engine.handle().clone()).map_err(ServerError::Runtime)?;
    let listener = runtime
        .block_on(TcpListener::bind(&config.listen))
        .map_err(|error| ServerError::Bind(config.listen.clone(), error))?;
    let addr = listener.local_addr().map_err(|error| ServerError::Bind(config.listen.clone(), error))?;
    let handle = engine.handle().clone();
    let (control, controls) = mpsc::unbounded_channel();
    let timeout = Duration::from_millis(config.request_timeout_ms);
    let grace = Duration::from_millis(config.shutdown_grace_ms);
    let max_connections = config.max_connections;
    let app_config = config.clone();
    let thread = std::thread::Builder::new()
        .name("svc-server".into())
        .spawn(move || {
            let app = Arc::new(app_state(engine.handle().clone(), timeout, &app_config, client));
            let outcome = runtime.block_on(serve(listener, app, controls, grace, max_connections));
            engine.close();
            stop_deliveries(deliveries);
            outcome
        })
        .map_err(ServerError::Runtime)?;
    Ok(RunningServer { addr, engine: handle, control: Some(control), thread: Some(thread) })
}

/// Runs `svc serve` in the foreground until SIGTERM or SIGINT.
pub fn run(config: &Config) -> Result<(), ServerError> {
    let runtime = build_runtime()?;
    let client = webhook_client(config)?;
    let mut settings = engine_config(config);
    let pool = Pool::attach(&mut settings, client.clone(), config.webhooks_priority);
    let engine = Engine::open(settings).map_err(ServerError::Storage)?;
    let deliveries = pool.spawn(engine.handle().clone()).map_err(ServerError::Runtime)?;
    let listener = runtime
        .block_on(TcpListener::bind(&config.listen))
        .map_err(|error| ServerError::Bind(config.listen.clone(), error))?;
    let addr = listener.local_addr().map_err(|error| ServerError::Bind(config.listen.clone(), error))?;
    tracing::info!(address = %addr, data_dir = %config.data_dir.display(), "svc listening");
    let timeout = Duration::from_millis(config.request_timeout_ms);
    let app = Arc::new(app_state(engine.handle().clone(), timeout, config, client));
    let grace = Duration::from_millis(config.shutdown_grace_ms);
    let outcome = runtime.block_on(async {
        let (control, controls) = mpsc::unbounded_channel();
        tokio::spawn(forward_signals(control));
        serve(listener, app, controls, grace, config.max_connections).await
    });
    engine.close();
    stop_deliveries(deliveries);
    tracing::info!("svc stopped");
    outcome
}

/// The handlers' shared state; `rate_limit` is (requests, window in seconds).
/// The client webhook attempts go out through, as the config sets it up.
fn webhook_client(config: &Config) -> Result<crate::webhook::client::DeliveryClient, ServerError> {
    crate::webhook::client::DeliveryClient::new(
        config.webhooks_allow_private_targets,
        config.webhooks_extra_ca_file.as_deref(),
    )
    .map_err(ServerError::Webhooks)
}

fn app_state(
    engine: crate::engine::EngineHandle,
    timeout: Duration,
    config: &Config,
    client: crate::webhook::client::DeliveryClient,
) -> AppState {
    let app = AppState::new(engine, timeout);
    let app = match config.rate_limit {
        Some((requests, window_s)) => app.with_rate_limit(requests, window_s),
        None => app,
    };
    let mut app = app.with_keys(config.api_keys.clone());
    app.metrics_public = config.metrics_public;
    app.webhooks_allow_private_targets = config.webhooks_allow_private_targets;
    app.webhook_client = Some(client);
    app.webhook_timeout = Duration::from_millis(config.webhooks_timeout_ms);
    // A server bound beyond loopback without keys sits behind a proxy that
    // authenticates (`--insecure-no-auth`), whose host names it cannot know.
    if config.binds_loopback_only() { app.with_browser_guard(&config.listen) } else { app }
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
    max_connections: usize,
) -> Result<(), ServerError> {
    let graceful = GracefulShutdown::new();
    let slots = ConnectionSlots::new(max_connections);
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT).keep_alive(true);
    let storage_watch = watch_storage(app.clone());
    tokio::pin!(storage_watch);
    let mut drain_ends: Option<tokio::time::Instant> = None;
    let mut outcome = Ok(());
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let Some(slot) = slots.take() else {
                    tokio::spawn(refuse(stream));
                    continue;
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
            control = controls.recv() => match control {
                Some(Control::Drain) if drain_ends.is_none() => {
                    tracing::info!(grace_ms = grace.as_millis() as u64, "draining: no new claims; waiting for active jobs");
                    app.shutting_down.store(true, Ordering::SeqCst);
                    let _ = app.engine.begin_drain().outcome().await;
                    drain_ends = Some(tokio::time::Instant::now() + grace);
                }
                Some(Control::Drain) => {}
                Some(Control::Stop) | None => break,
            },
            () = tokio::time::sleep(DRAIN_POLL), if drain_ends.is_some() => {
                let active = app.engine.active_jobs();
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
    app.engine.storage_failure().await;
    let reason = app.engine.failure().map_or("unknown", |failure| failure.code());
    tracing::error!(reason = reason, "stopping: the engine accepts no more writes");
    tokio::time::sleep(Duration::from_millis(POISON_EXIT_DELAY_MS)).await;
}
