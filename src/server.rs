//! Wiring only: open the engine, bind, serve HTTP, and stop in order.
//!
//! Stop order: stop accepting, let in-flight requests finish (up to 5 s),
//! then close the engine (final snapshot). A failed log sync stops the server
//! with an error after a short grace period, so a supervisor restarts it into
//! recovery.

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::config::Config;
use crate::engine::{Engine, EngineConfig};
use crate::http::{AppState, serve_request};
use crate::limits::POISON_EXIT_DELAY_MS;
use crate::storage::StorageError;

const IN_FLIGHT_GRACE: Duration = Duration::from_secs(5);
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub enum ServerError {
    Storage(StorageError),
    Bind(String, std::io::Error),
    Runtime(std::io::Error),
    /// The write-ahead log failed; restart to recover.
    StorageFailed,
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerError::Storage(error) => write!(f, "cannot open the data dir: {error}"),
            ServerError::Bind(address, error) => write!(f, "cannot listen on {address}: {error}"),
            ServerError::Runtime(error) => write!(f, "cannot start the runtime: {error}"),
            ServerError::StorageFailed => f.write_str("the write-ahead log failed to sync; restart to recover"),
        }
    }
}

impl std::error::Error for ServerError {}

/// The engine settings a server config implies.
pub fn engine_config(config: &Config) -> EngineConfig {
    let mut engine = EngineConfig::new(&config.data_dir);
    engine.snapshot_log_bytes = config.snapshot_log_bytes;
    engine.retention = config.retention;
    engine.defaults = config.jobs.clone();
    engine
}

/// A server running on a thread of its own (tests, embedding).
pub struct RunningServer {
    pub addr: SocketAddr,
    /// The engine behind the server (tests use it to tick a manual clock).
    pub engine: crate::engine::EngineHandle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServerError>>>,
}

impl RunningServer {
    /// Stops the server cleanly and waits for it.
    pub fn stop(mut self) -> Result<(), ServerError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.join()
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
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Opens the engine, binds, and serves on a background thread.
pub fn start(config: &Config, engine_config: EngineConfig) -> Result<RunningServer, ServerError> {
    let runtime = build_runtime()?;
    let engine = Engine::open(engine_config).map_err(ServerError::Storage)?;
    let listener = runtime
        .block_on(TcpListener::bind(&config.listen))
        .map_err(|error| ServerError::Bind(config.listen.clone(), error))?;
    let addr = listener.local_addr().map_err(|error| ServerError::Bind(config.listen.clone(), error))?;
    let handle = engine.handle().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let timeout = Duration::from_millis(config.request_timeout_ms);
    let thread = std::thread::Builder::new()
        .name("svc-server".into())
        .spawn(move || {
            let app = Arc::new(AppState::new(engine.handle().clone(), timeout));
            let outcome = runtime.block_on(serve(listener, app, async {
                let _ = stopped.await;
            }));
            engine.close();
            outcome
        })
        .map_err(ServerError::Runtime)?;
    Ok(RunningServer { addr, engine: handle, stop: Some(stop), thread: Some(thread) })
}

/// Runs `svc serve` in the foreground until SIGTERM or SIGINT.
pub fn run(config: &Config) -> Result<(), ServerError> {
    let runtime = build_runtime()?;
    let engine = Engine::open(engine_config(config)).map_err(ServerError::Storage)?;
    let listener = runtime
        .block_on(TcpListener::bind(&config.listen))
        .map_err(|error| ServerError::Bind(config.listen.clone(), error))?;
    let addr = listener.local_addr().map_err(|error| ServerError::Bind(config.listen.clone(), error))?;
    crate::logging::info(
        "svc listening",
        &[("address", addr.to_string().into()), ("data_dir", config.data_dir.display().to_string().into())],
    );
    let app = Arc::new(AppState::new(engine.handle().clone(), Duration::from_millis(config.request_timeout_ms)));
    let outcome = runtime.block_on(serve(listener, app, shutdown_signal()));
    engine.close();
    crate::logging::info("svc stopped", &[]);
    outcome
}

fn build_runtime() -> Result<tokio::runtime::Runtime, ServerError> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(ServerError::Runtime)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut terminate), Ok(mut interrupt)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    crate::logging::info("shutting down", &[]);
}

/// Accepts connections until `shutdown` completes or storage fails.
async fn serve(
    listener: TcpListener,
    app: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT).keep_alive(true);
    tokio::pin!(shutdown);
    let storage_watch = watch_storage(app.clone());
    tokio::pin!(storage_watch);
    let mut outcome = Ok(());
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let app = app.clone();
                let service = service_fn(move |request| serve_request(app.clone(), request));
                let connection = builder.serve_connection(TokioIo::new(stream), service);
                let watched = graceful.watch(connection);
                tokio::spawn(async move {
                    let _ = watched.await;
                });
            }
            () = &mut shutdown => break,
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
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if app.engine.storage_failed() {
            crate::logging::error("stopping: the write-ahead log failed", &[]);
            tokio::time::sleep(Duration::from_millis(POISON_EXIT_DELAY_MS)).await;
            return;
        }
    }
}
