//! Test support: a real server on 127.0.0.1:0 with a temp data dir, a small
//! blocking JSON client, and fixed entropy for engines on a manual clock.
#![allow(dead_code)]

pub mod postgres;

use reqwest::blocking::{Client, Response};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use svc::__private::config::Config;
use svc::__private::server::{RunningServer, engine_config, start};
use svc::engine::{EngineConfig, Entropy};

/// The HTTP client tests talk to servers with. The build's `reqwest` can
/// speak TLS (webhook deliveries use it) and needs a crypto provider chosen
/// before any client is made: ring, as the deliveries use.
pub fn http_client() -> Client {
    http_client_builder().build().expect("a client builds")
}

pub fn http_client_builder() -> reqwest::blocking::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Client::builder()
}

pub struct TestServer {
    pub server: Option<RunningServer>,
    /// A `svc serve` child process, for a server on another backend.
    pub process: Option<ServerProcess>,
    pub base: String,
    pub client: Client,
}

/// What a test reads from a response.
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    pub fn error_code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("<no error code>")
    }
}

pub fn config_for(dir: &Path) -> Config {
    Config { listen: "127.0.0.1:0".to_string(), data_dir: dir.to_path_buf(), ..Config::default() }
}

impl TestServer {
    pub fn start(dir: &Path) -> TestServer {
        let config = config_for(dir);
        Self::start_with(&config, engine_config(&config))
    }

    /// A server with every setting of `config` (keys, access checks, limits).
    pub fn start_checked(config: &Config) -> TestServer {
        Self::start_with(config, engine_config(config))
    }

    pub fn start_with(config: &Config, engine: EngineConfig) -> TestServer {
        let server = start(config, engine).expect("server starts");
        let base = format!("http://{}", server.addr);
        TestServer { server: Some(server), process: None, base, client: http_client() }
    }

    /// `svc serve --postgres` on `url`, as a child process: the same tests
    /// over HTTP, on the PostgreSQL backend.
    pub fn on_postgres(dir: &Path, url: &str) -> TestServer {
        let (process, base) = spawn_server_with_env(dir, &[("SVC_POSTGRES_URL", url)]);
        TestServer { server: None, process: Some(process), base, client: http_client() }
    }

    /// A server whose engine reads `clock` and checks its invariants after
    /// every turn; `advance` moves time.
    pub fn start_at(dir: &Path, clock: &svc::clock::ManualClock) -> TestServer {
        let config = config_for(dir);
        let mut engine = engine_config(&config);
        engine.clock = std::sync::Arc::new(clock.clone());
        engine.wiring.entropy = Box::new(FixedEntropy(0));
        engine.wiring.check_invariants = true;
        Self::start_with(&config, engine)
    }

    /// Moves `clock` on and lets the engine handle what became due.
    pub fn advance(&self, clock: &svc::clock::ManualClock, ms: i64) {
        clock.advance_ms(ms);
        self.engine().tick().wait().expect("tick");
    }

    /// `http://<address>` of the server.
    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn engine(&self) -> &svc::engine::EngineHandle {
        &self.server.as_ref().expect("server running").engine
    }

    pub fn stop(mut self) {
        if self.process.take().is_some() {
            return;
        }
        self.server.take().expect("server running").stop().expect("server stops cleanly");
    }

    fn answer(response: Response) -> Answer {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().expect("response body reads");
        let body =
            if text.is_empty() { Value::Null } else { serde_json::from_str(&text).expect("response body is JSON") };
        Answer { status, headers, body }
    }

    pub fn get(&self, path: &str) -> Answer {
        Self::answer(self.client.get(format!("{}{path}", self.base)).send().expect("request sent"))
    }

    /// A body that is not JSON (`/metrics`).
    pub fn get_text(&self, path: &str) -> String {
        self.client.get(format!("{}{path}", self.base)).send().expect("request sent").text().expect("a text body")
    }

    pub fn delete(&self, path: &str) -> Answer {
        Self::answer(self.client.delete(format!("{}{path}", self.base)).send().expect("request sent"))
    }

    pub fn post(&self, path: &str, body: Value) -> Answer {
        self.post_raw(path, body.to_string(), Some("application/svc+json"))
    }

    pub fn post_raw(&self, path: &str, body: impl Into<reqwest::blocking::Body>, content_type: Option<&str>) -> Answer {
        let mut request = self.client.post(format!("{}{path}", self.base)).body(body);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        Self::answer(request.send().expect("request sent"))
    }

    pub fn put(&self, path: &str, body: Value) -> Answer {
        let request = self
            .client
            .put(format!("{}{path}", self.base))
            .body(body.to_string())
            .header("content-type", "application/svc+json");
        Self::answer(request.send().expect("request sent"))
    }

    pub fn patch(&self, path: &str, body: Value) -> Answer {
        let request = self
            .client
            .patch(format!("{}{path}", self.base))
            .body(body.to_string())
            .header("content-type", "application/svc+json");
        Self::answer(request.send().expect("request sent"))
    }

    /// Enqueues and returns the job id, asserting 201.
    pub fn enqueue(&self, body: Value) -> String {
        let answer = self.post("/svc/v1/jobs", body);
        assert_eq!(answer.status, 201, "enqueue: {}", answer.body);
        answer.body["job"]["id"].as_str().expect("job id").to_string()
    }

    /// Fetches from the queues, returning the claimed jobs.
    pub fn fetch(&self, queues: &[&str], count: u64) -> Vec<Value> {
        let answer = self.post("/svc/v1/workers/fetch", serde_json::json!({"queues": queues, "count": count}));
        assert_eq!(answer.status, 200, "fetch: {}", answer.body);
        answer.body["jobs"].as_array().expect("jobs array").clone()
    }

    pub fn job(&self, id: &str) -> Value {
        let answer = self.get(&format!("/svc/v1/jobs/{id}"));
        assert_eq!(answer.status, 200, "get job: {}", answer.body);
        answer.body["job"].clone()
    }
}

/// A node on the PostgreSQL backend with a PostgreSQL server and data dir
/// of its own; it reads as the [`TestServer`] it holds. The node stops
/// before its database does (fields drop in order).
pub struct PostgresNode {
    pub server: TestServer,
    /// The node's database, for a test's own sessions.
    pub url: String,
    _dir: tempfile::TempDir,
    _postgres: postgres::TempPostgres,
}

impl PostgresNode {
    pub fn start(database: &str) -> PostgresNode {
        let postgres = postgres::TempPostgres::start();
        let dir = tempfile::tempdir().expect("a temp dir");
        let url = postgres.database(database);
        let server = TestServer::on_postgres(dir.path(), &url);
        PostgresNode { server, url, _dir: dir, _postgres: postgres }
    }
}

impl std::ops::Deref for PostgresNode {
    type Target = TestServer;
    fn deref(&self) -> &TestServer {
        &self.server
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            let _ = server.stop();
        }
    }
}

/// A `svc serve` child process, killed when dropped, so that a test that
/// fails halfway leaves no server running.
pub struct ServerProcess(Child);

impl std::ops::Deref for ServerProcess {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for ServerProcess {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // Already gone when the test stopped it: then both just fail.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `svc serve` as a child process and returns it with its address.
pub fn spawn_server(dir: &Path) -> (ServerProcess, String) {
    spawn_server_with_env(dir, &[])
}

/// `spawn_server` with extra environment variables.
pub fn spawn_server_with_env(dir: &Path, env: &[(&str, &str)]) -> (ServerProcess, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(["serve", "--log-format", "json", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("svc starts");
    let stderr = child.stderr.take().expect("stderr piped");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Ok(entry) = serde_json::from_str::<Value>(&line)
                && entry["message"] == "svc listening"
            {
                let _ = sender.send(entry["address"].as_str().unwrap_or_default().to_string());
            }
        }
    });
    let child = ServerProcess(child);
    let address = receiver.recv_timeout(Duration::from_secs(20)).expect("server reports its address");
    (child, format!("http://{address}"))
}

/// Ids from a counter, and jitter fixed at the middle of its range (factor 1.0).
pub struct FixedEntropy(pub u128);

impl Entropy for FixedEntropy {
    fn next_u128(&mut self) -> u128 {
        self.0 += 1;
        self.0
    }

    fn next_unit(&mut self) -> f64 {
        0.5
    }
}
