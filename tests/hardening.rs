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
    let mut engine = svc::server::engine_config(&config);
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
    assert!(matches!(outcome, Err(svc::server::ServerError::StorageFailed)), "the server stops with an error");

    let server = TestServer::start(dir.path());
    assert_eq!(server.job(&kept)["state"], "available", "recovery brings back what was acknowledged");
}
