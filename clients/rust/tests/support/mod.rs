//! Starts real svc servers for the tests: the binary in `SVC_BIN`, or the
//! repository's `target/release/svc`.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use svc_client::Client;

/// The svc binary, or `None` (the test is skipped) when `SVC_BIN` is unset
/// and the repository has no release build.
pub fn svc_bin() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SVC_BIN") {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "SVC_BIN names {}, which is not a file", path.display());
        return Some(path);
    }
    let default = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/svc");
    if default.is_file() {
        return Some(default);
    }
    static WARN: Once = Once::new();
    WARN.call_once(|| {
        eprintln!(
            "SKIPPED: the HTTP tests need the svc binary: set SVC_BIN, or run `cargo build --release` at the \
             repository root (looked for {})",
            default.display()
        );
    });
    None
}

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("an address").port()
}

/// A server on a free port with a data dir of its own.
pub struct Server {
    bin: PathBuf,
    child: Option<Child>,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl Server {
    /// Starts a server, or `None` when there is no binary (skipped).
    pub fn start() -> Option<Server> {
        Server::start_with_config("")
    }

    /// Starts a server with these settings (TOML), or `None` when there is
    /// no binary (skipped).
    pub fn start_with_config(config: &str) -> Option<Server> {
        let bin = svc_bin()?;
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(dir.path().join("svc.toml"), config).expect("the settings are written");
        let mut server = Server { bin, child: None, port: free_port(), dir };
        server.spawn();
        Some(server)
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .expect("the server log opens");
        let child = Command::new(&self.bin)
            .arg("serve")
            .arg("--config")
            .arg(self.dir.path().join("svc.toml"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log"))
            .stderr(log)
            .spawn()
            .expect("svc starts");
        self.child = Some(child);
        self.wait_healthy();
    }

    fn wait_healthy(&mut self) {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            if let Some(status) = self.child.as_mut().and_then(|child| child.try_wait().ok().flatten()) {
                panic!("svc exited at start ({status}): {}", self.log());
            }
            if health(self.port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("svc did not become healthy: {}", self.log());
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn client(&self) -> Client {
        Client::new(self.url()).expect("a client")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// SIGKILL: the server dies at once.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM: the server drains and exits once no job is active.
    pub fn terminate(&mut self) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
        }
    }

    /// Waits for the server to exit (after [`Server::terminate`]).
    pub fn wait_exit(&mut self, within: Duration) {
        let Some(child) = self.child.as_mut() else { return };
        let started = Instant::now();
        while started.elapsed() < within {
            if child.try_wait().ok().flatten().is_some() {
                self.child = None;
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("svc did not exit within {within:?}");
    }

    /// Starts the server again on the same port and data dir.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `GET /svc/v1/health` answers 200.
fn health(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET /svc/v1/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}

/// Polls `check` every 25 ms until it answers `Some`, for at most `within`.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(started.elapsed() < within, "timed out after {within:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// With `SVC_TEST_LOG=debug` (or `info`, `warn`), the library's logs go to
/// the test's output.
pub fn logs() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let level = match std::env::var("SVC_TEST_LOG").as_deref() {
            Ok("debug") => tracing::Level::DEBUG,
            Ok("info") => tracing::Level::INFO,
            Ok(_) => tracing::Level::WARN,
            Err(_) => return,
        };
        let _ = tracing_subscriber::fmt().with_max_level(level).with_test_writer().try_init();
    });
}
