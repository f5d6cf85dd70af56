//! Faults that must not take a running server down silently: an engine thread
//! that dies makes the server report it and exit non-zero, so a supervisor
//! restarts it into recovery.

mod common;

use common::{TestServer, config_for};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use svc::clock::{Clock, Millis, SystemClock};

/// A clock that makes the engine thread panic once `broken` is set (a
/// stand-in for any bug on that thread); other threads read the time as usual.
struct BreakingClock {
    broken: Arc<AtomicBool>,
}

impl Clock for BreakingClock {
    fn now_ms(&self) -> Millis {
        let on_engine = std::thread::current().name() == Some("svc-engine");
        if on_engine && self.broken.load(Ordering::SeqCst) {
            panic!("a bug on the engine thread");
        }
        SystemClock.now_ms()
    }
}

#[test]
fn a_dead_engine_thread_turns_health_and_ready_503_and_stops_the_server_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let broken = Arc::new(AtomicBool::new(false));
    let config = config_for(dir.path());
    let mut engine = svc::__private::server::engine_config(&config);
    engine.clock = Arc::new(BreakingClock { broken: broken.clone() });
    let mut server = TestServer::start_with(&config, engine);
    let kept = server.enqueue(json!({"type": "t", "args": []}));

    broken.store(true, Ordering::SeqCst);
    let answer = server.post("/svc/v1/jobs", json!({"type": "t", "args": []}));
    assert_eq!((answer.status, answer.error_code()), (503, "backend_error"), "{}", answer.body);
    let health = server.get("/svc/v1/health");
    assert_eq!((health.status, health.body["backend"]["error"].as_str()), (503, Some("engine_stopped")));
    assert_eq!(server.get("/ready").status, 503);
    assert_eq!(server.job(&kept)["state"], "available", "reads of durable state still work");
    let outcome = server.server.take().unwrap().join();
    assert!(
        matches!(outcome, Err(svc::__private::server::ServerError::StorageFailed)),
        "the server stops with an error"
    );

    let server = TestServer::start(dir.path());
    assert_eq!(server.job(&kept)["state"], "available", "recovery brings back what was acknowledged");
}

/// Enqueues, claims and completes one job; returns its id.
fn complete_one(server: &TestServer, queue: &str) -> String {
    let id = server.enqueue(json!({"type": "t", "args": [], "options": {"queue": queue}}));
    let claimed = server.fetch(&[queue], 1);
    assert_eq!(claimed[0]["id"], id.as_str());
    assert_eq!(server.post("/svc/v1/workers/ack", json!({"job_id": id})).status, 200);
    id
}

/// Sends a job to the dead letter listing; returns its id.
fn dead_letter_one(server: &TestServer) -> String {
    let body = json!({"type": "t", "args": [], "options": {"queue": "dlq", "retry": {"max_attempts": 1}}});
    let id = server.enqueue(body);
    server.fetch(&["dlq"], 1);
    let error = json!({"type": "E", "message": "no"});
    assert_eq!(server.post("/svc/v1/workers/nack", json!({"job_id": id, "error": error})).status, 200);
    assert_eq!(server.job(&id)["state"], "discarded");
    id
}

#[test]
fn terminal_jobs_over_the_count_cap_are_pruned_oldest_first_dead_letter_last() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_for(dir.path());
    config.retention.max_terminal_jobs = 3;
    let server = TestServer::start_with(&config, svc::__private::server::engine_config(&config));
    let dead = dead_letter_one(&server);
    let completed: Vec<String> = (0..4).map(|_| complete_one(&server, "default")).collect();
    let live = server.enqueue(json!({"type": "t", "args": []}));

    for gone in &completed[..2] {
        assert_eq!(server.get(&format!("/svc/v1/jobs/{gone}")).status, 404, "oldest completed jobs go first");
    }
    for kept in &completed[2..] {
        assert_eq!(server.job(kept)["state"], "completed");
    }
    assert_eq!(server.job(&dead)["state"], "discarded", "dead-lettered jobs go last");
    assert_eq!(server.job(&live)["state"], "available", "live jobs are never pruned");
    // One event per sweep that pruned (here each turn pruned one job).
    let events = server.get("/svc/v1/events?types=jobs.pruned");
    let sweeps = events.body["events"].as_array().unwrap();
    let counted: u64 = sweeps.iter().map(|event| event["data"]["count"].as_u64().unwrap()).sum();
    assert_eq!(counted, 2, "{}", events.body);
    for sweep in sweeps {
        assert_eq!(sweep["data"]["reason"], "cap");
        assert!(sweep.get("subject").is_none(), "an event about many jobs has no subject");
    }

    // The pruning is durable: a restart (replaying the log) does not bring them back.
    server.stop();
    let server = TestServer::start_with(&config, svc::__private::server::engine_config(&config));
    assert_eq!(server.get(&format!("/svc/v1/jobs/{}", completed[0])).status, 404);
    assert_eq!(server.job(&completed[3])["state"], "completed");
    assert_eq!(server.job(&dead)["state"], "discarded");
}

#[test]
fn terminal_jobs_over_the_byte_cap_are_pruned_and_large_results_count() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_for(dir.path());
    config.retention.max_terminal_bytes = 64 * 1024;
    let server = TestServer::start_with(&config, svc::__private::server::engine_config(&config));
    let big = "x".repeat(40 * 1024);
    let mut ids = Vec::new();
    for _ in 0..4 {
        let id = server.enqueue(json!({"type": "t", "args": [big]}));
        server.fetch(&["default"], 1);
        assert_eq!(server.post("/svc/v1/workers/ack", json!({"job_id": id})).status, 200);
        ids.push(id);
    }
    let kept: Vec<&String> = ids.iter().filter(|id| server.get(&format!("/svc/v1/jobs/{id}")).status == 200).collect();
    assert_eq!(kept, [&ids[3]], "only the newest 40 KiB job fits in 64 KiB");
}

#[test]
fn a_batch_over_the_item_limit_is_refused_with_its_count() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    // Millions of tiny items: counted, not kept, then refused.
    let items = vec!["0"; 3_000_000].join(",");
    let body = format!(r#"{{"jobs":[{items}]}}"#);
    let answer = server.post_raw("/svc/v1/jobs/batch", body, Some("application/svc+json"));
    assert_eq!((answer.status, answer.error_code()), (413, "envelope_too_large"), "{}", answer.body);
    assert_eq!(answer.body["error"]["details"]["received"], 3_000_000);
    let queues = server.get("/svc/v1/queues");
    assert_eq!(queues.body["queues"][0]["size"], 0, "nothing was enqueued");
}

#[test]
fn connections_over_the_cap_get_a_clear_503_and_the_slot_comes_back() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_for(dir.path());
    config.max_connections = 2;
    let server = TestServer::start_with(&config, svc::__private::server::engine_config(&config));
    let address = server.base.trim_start_matches("http://").to_string();
    let health = |stream: &mut std::net::TcpStream| {
        let request = format!("GET /svc/v1/health HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    };
    let first = std::net::TcpStream::connect(&address).unwrap();
    let mut second = std::net::TcpStream::connect(&address).unwrap();
    // Connections are accepted in order: these two hold both slots.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let mut third = std::net::TcpStream::connect(&address).unwrap();
    let refused = health(&mut third);
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains(r#""reason":"connections""#), "{refused}");
    assert!(health(&mut second).starts_with("HTTP/1.1 200"), "open connections are served");
    drop(first);
    // The server notices the close in its own time; the slot comes back then.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut again = std::net::TcpStream::connect(&address).unwrap();
        if health(&mut again).starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "closed connections free their slot");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Enqueues jobs of 64 KiB until one is refused; returns the refusal and the ids taken.
fn enqueue_until_refused(server: &TestServer) -> (common::Answer, Vec<String>) {
    let big = "x".repeat(64 * 1024);
    let mut taken = Vec::new();
    for _ in 0..200 {
        let answer = server.post("/svc/v1/jobs", json!({"type": "t", "args": [big], "options": {"queue": "big"}}));
        if answer.status != 201 {
            return (answer, taken);
        }
        taken.push(answer.body["job"]["id"].as_str().unwrap().to_string());
    }
    panic!("the disk never filled up");
}

#[test]
fn with_the_disk_full_new_work_gets_503_accepted_work_ends_and_space_freed_brings_writes_back() {
    for direct in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let disk = svc::storage::FaultyFileSystem::failing_after(i64::MAX);
        let disk = if direct { disk } else { disk.without_direct_writes() };
        let config = config_for(dir.path());
        let engine_for = |disk: &svc::storage::FaultyFileSystem| {
            let mut engine = svc::__private::server::engine_config(&config);
            engine.file_system = Arc::new(disk.clone());
            engine.segment_bytes = 1 << 20;
            engine
        };
        let mut server = TestServer::start_with(&config, engine_for(&disk));
        let active = server.enqueue(json!({"type": "t", "args": [1]}));
        assert_eq!(server.fetch(&["default"], 1)[0]["id"], active.as_str());

        disk.set_no_space(true);
        let (refused, taken) = enqueue_until_refused(&server);
        assert_eq!((refused.status, refused.error_code()), (503, "backend_error"), "{}", refused.body);
        assert_eq!(refused.body["error"]["details"]["reason"], "disk_full");
        assert_eq!(refused.header("retry-after"), Some("1"));
        let health = server.get("/svc/v1/health");
        assert_eq!((health.status, health.body["backend"]["error"].as_str()), (503, Some("disk_full")));
        assert_eq!(server.get("/ready").status, 200, "reads and acks are still served");
        assert_eq!(server.job(&active)["state"], "active");
        let acked = server.post("/svc/v1/workers/ack", json!({"job_id": active}));
        assert_eq!(acked.status, 200, "accepted work can still end: {}", acked.body);
        let cancelled = server.delete(&format!("/svc/v1/jobs/{}", taken[0]));
        assert_eq!(cancelled.status, 200, "{}", cancelled.body);
        let small = server.post("/svc/v1/jobs", json!({"type": "t", "args": []}));
        assert_eq!(small.status, 503);

        // A restart on the full disk serves reads and refuses new work.
        server.server.take().unwrap().stop().expect("a clean stop, even without room for a snapshot");
        let server = TestServer::start_with(&config, engine_for(&disk));
        assert_eq!(server.job(&active)["state"], "completed");
        assert_eq!(server.job(&taken[0])["state"], "cancelled");
        assert_eq!(server.post("/svc/v1/jobs", json!({"type": "t", "args": []})).status, 503);

        disk.set_no_space(false);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let answer = server.post("/svc/v1/jobs", json!({"type": "t", "args": ["back"]}));
            if answer.status == 201 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "writes came back once space was freed: {}", answer.body);
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_eq!(server.get("/svc/v1/health").status, 200, "direct={direct}");
        for id in &taken[1..] {
            assert_eq!(server.job(id)["state"], "available", "nothing acknowledged was lost");
        }
    }
}

#[test]
fn the_request_rate_limit_counts_each_client_and_answers_429_with_when_to_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_for(dir.path());
    // A day-long window, so that the test never straddles two.
    config.rate_limit = Some((3, 86_400));
    let server = TestServer::start_with(&config, svc::__private::server::engine_config(&config));
    let mut remaining = Vec::new();
    for _ in 0..3 {
        let answer = server.get("/svc/v1/queues");
        assert_eq!(answer.status, 200);
        assert_eq!(answer.header("x-ratelimit-limit"), Some("3"));
        assert!(answer.header("x-ratelimit-reset").is_some_and(|reset| reset.parse::<u64>().is_ok()));
        remaining.push(answer.header("x-ratelimit-remaining").unwrap().to_string());
    }
    assert_eq!(remaining, ["2", "1", "0"]);
    let refused = server.post("/svc/v1/jobs", json!({"type": "t", "args": []}));
    assert_eq!((refused.status, refused.error_code()), (429, "rate_limited"), "{}", refused.body);
    let details = &refused.body["error"]["details"];
    assert_eq!((details["limit"].as_u64(), details["window_seconds"].as_u64()), (Some(3), Some(86_400)));
    let retry_after: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&retry_after));
    assert_eq!(details["retry_after_seconds"].as_u64(), Some(retry_after));
    assert_eq!(server.get("/svc/v1/queues").body["queues"], serde_json::Value::Null, "still refused");
    let health = server.get("/svc/v1/health");
    assert_eq!((health.status, health.header("x-ratelimit-limit")), (200, None), "probes are not counted");
}

#[test]
fn a_start_on_a_busy_port_leaves_no_data_dir() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("data");
    let mut config = config_for(&dir);
    config.listen = busy.local_addr().unwrap().to_string();
    let started = svc::__private::server::start(&config, svc::__private::server::engine_config(&config));
    assert!(matches!(started, Err(svc::__private::server::ServerError::Bind(..))), "the port is taken");
    assert!(!dir.exists(), "nothing was created");
}
