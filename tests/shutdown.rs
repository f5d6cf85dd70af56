//! Graceful shutdown (docs/api.md, "Shutting down"): a drain stops handing out work, tells
//! workers to terminate, keeps serving everything else, and stops once no job
//! is active or the grace period ends; SIGTERM starts it and exits 0.

mod common;

use common::{TestServer, config_for};
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn a_drain_serves_reports_and_stops_when_no_job_is_active() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = TestServer::start(dir.path());
    let active = server.enqueue(json!({"type": "t", "args": [1]}));
    let waiting = server.enqueue(json!({"type": "t", "args": [2]}));
    server.post("/svc/v1/workers/fetch", json!({"queues": ["default"], "worker_id": "w-1"}));
    server.server.as_ref().unwrap().drain();
    std::thread::sleep(Duration::from_millis(100));

    let ready = server.get("/ready");
    assert_eq!((ready.status, ready.body["reason"].as_str()), (503, Some("shutting_down")));
    assert_eq!(server.get("/svc/v1/health").status, 200, "health does not change during a drain");
    assert!(server.fetch(&["default"], 10).is_empty(), "no new claims while draining");
    let beat = server.post("/svc/v1/workers/heartbeat", json!({"worker_id": "w-1"}));
    assert_eq!((beat.body["state"].as_str(), beat.body["jobs_extended"].as_i64()), (Some("terminate"), Some(1)));
    let late = server.enqueue(json!({"type": "t", "args": [3]}));
    let events = server.get("/svc/v1/events?types=worker.terminate");
    let terminate = &events.body["events"][0];
    assert_eq!((terminate["subject"].as_str(), terminate["data"]["by"].as_str()), (Some("w-1"), Some("shutdown")));
    assert_eq!(terminate["data"]["active_job_ids"], json!([active]));

    let started = Instant::now();
    let answer = server.post("/svc/v1/workers/ack", json!({"job_id": active}));
    assert_eq!(answer.status, 200, "reports are still served");
    server.server.take().unwrap().join().expect("the drain ends cleanly");
    assert!(started.elapsed() < Duration::from_secs(5), "it stopped once no job was active");

    let server = TestServer::start(dir.path());
    assert_eq!(server.job(&active)["state"], "completed");
    assert_eq!(server.job(&waiting)["state"], "available");
    assert_eq!(server.job(&late)["state"], "available");
}

#[test]
fn the_grace_period_bounds_a_drain() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_for(dir.path());
    config.shutdown_grace_ms = 300;
    let engine = svc::__private::server::engine_config(&config);
    let mut server = TestServer::start_with(&config, engine);
    let held = server.enqueue(json!({"type": "t", "args": []}));
    server.fetch(&["default"], 1);
    let started = Instant::now();
    server.server.as_ref().unwrap().drain();
    server.server.take().unwrap().join().expect("the drain ends cleanly");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(5), "waited {waited:?}");
    let server = TestServer::start(dir.path());
    assert_eq!(server.job(&held)["state"], "active", "a job still held keeps its claim across the restart");
}

#[test]
fn sigterm_drains_and_exits_zero() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_svc"))
        .args(["serve", "--log-format", "json", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let listening =
        lines.by_ref().map_while(Result::ok).find(|line| line.contains("svc listening")).expect("server starts");
    let address =
        serde_json::from_str::<serde_json::Value>(&listening).unwrap()["address"].as_str().unwrap().to_string();
    let http = common::http_client();
    let created = http
        .post(format!("http://{address}/svc/v1/jobs"))
        .header("content-type", "application/svc+json")
        .body(r#"{"type":"t","args":[]}"#)
        .send()
        .unwrap();
    assert_eq!(created.status(), 201);
    let status = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let exit = child.wait().unwrap();
    assert!(exit.success(), "exit status {exit:?}");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(rest.iter().any(|line| line.contains("drain finished")), "{rest:?}");
    assert!(svc::storage::list_snapshots(dir.path()).unwrap().len() == 1, "a snapshot was written on the way out");
}
