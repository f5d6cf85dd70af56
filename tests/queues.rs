//! Queue control over HTTP and in the engine: pause and resume (durable,
//! idempotent, with their events), what a paused queue refuses and what it
//! still does, a queue's figures with its last minute, and cron fires into a
//! paused queue.

mod common;

use common::{FixedEntropy, TestServer};
use serde_json::json;
use std::sync::Arc;
use svc::backend::Backend;
use svc::clock::ManualClock;
use svc::engine::{Engine, EngineConfig, EngineError};
use svc::job::{JobDefaults, parse_enqueue_body};

fn server() -> (tempfile::TempDir, TestServer) {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    (dir, server)
}

#[test]
fn a_paused_queue_refuses_new_work_skips_fetches_and_still_ends_what_it_holds() {
    let (dir, server) = server();
    let active = server.enqueue(json!({"type": "t", "args": [1], "options": {"queue": "mail"}}));
    let waiting = server.enqueue(json!({"type": "t", "args": [2], "options": {"queue": "mail"}}));
    assert_eq!(server.fetch(&["mail"], 1)[0]["id"], active.as_str());

    let paused = server.post_raw("/svc/v1/queues/mail/pause", "", None);
    assert_eq!((paused.status, &paused.body), (200, &json!({"queue": "mail", "paused": true})));
    assert_eq!(server.post_raw("/svc/v1/queues/mail/pause", "", None).status, 200, "idempotent");

    let refused = server.post("/svc/v1/jobs", json!({"type": "t", "args": [], "options": {"queue": "mail"}}));
    assert_eq!((refused.status, refused.error_code()), (503, "queue_paused"), "{}", refused.body);
    assert_eq!(refused.body["error"]["details"]["queue"], "mail");
    assert!(refused.header("retry-after").is_some());
    let batch = json!({"jobs": [{"type": "t", "args": []}, {"type": "t", "args": [], "options": {"queue": "mail"}}]});
    let refused = server.post("/svc/v1/jobs/batch", batch);
    assert_eq!((refused.status, refused.body["error"]["details"]["index"].as_u64()), (503, Some(1)));
    assert_eq!(server.job(&active)["state"], "active");
    assert!(server.fetch(&["mail"], 10).is_empty(), "fetch skips a paused queue");
    assert_eq!(server.post("/svc/v1/workers/ack", json!({"job_id": active})).status, 200, "held work still ends");

    let stats = server.get("/svc/v1/queues/mail/stats");
    assert_eq!(stats.status, 200, "{}", stats.body);
    assert_eq!((stats.body["paused"].as_bool(), stats.body["size"].as_u64()), (Some(true), Some(1)));
    assert_eq!(
        (stats.body["states"]["available"].as_u64(), stats.body["states"]["completed"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(stats.body["throughput"]["completed_last_minute"], 1);

    // Paused survives a restart.
    server.stop();
    let server = TestServer::start(dir.path());
    assert_eq!(server.get("/svc/v1/queues/mail/stats").body["paused"], true);
    assert!(server.fetch(&["mail"], 10).is_empty());

    let resumed = server.post_raw("/svc/v1/queues/mail/resume", "", None);
    assert_eq!((resumed.status, &resumed.body), (200, &json!({"queue": "mail", "paused": false})));
    assert_eq!(server.fetch(&["mail"], 10)[0]["id"], waiting.as_str());
    let events = server.get("/svc/v1/events?types=queue.*");
    let kinds: Vec<(&str, &str)> = events.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| (event["type"].as_str().unwrap(), event["subject"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds, [("queue.resumed", "mail")], "events since the restart, one per change");
}

#[test]
fn queue_routes_check_names_and_report_failures_in_the_last_minute() {
    let (_dir, server) = server();
    assert_eq!(server.get("/svc/v1/queues/Bad!/stats").status, 400);
    assert_eq!(server.post_raw("/svc/v1/queues/Bad!/pause", "", None).status, 400);
    let unknown = server.get("/svc/v1/queues/nothing-here/stats");
    assert_eq!((unknown.status, unknown.body["error"]["details"]["resource_type"].as_str()), (404, Some("queue")));
    assert_eq!(server.get("/svc/v1/queues/q/pause").status, 405);

    // Pausing an unknown queue makes it; resuming it, empty, lets it go.
    assert_eq!(server.post_raw("/svc/v1/queues/fresh/pause", "", None).status, 200);
    let listed = server.get("/svc/v1/queues");
    assert!(listed.body["queues"].as_array().unwrap().contains(&json!({"name": "fresh", "size": 0, "paused": true})));
    assert_eq!(server.post_raw("/svc/v1/queues/fresh/resume", "", None).status, 200);
    assert_eq!(server.get("/svc/v1/queues/fresh/stats").status, 404);

    let id = server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "q", "retry": {"max_attempts": 2}}}));
    server.fetch(&["q"], 1);
    let error = json!({"type": "E", "message": "no"});
    assert_eq!(server.post("/svc/v1/workers/nack", json!({"job_id": id, "error": error})).status, 200);
    let stats = server.get("/svc/v1/queues/q/stats");
    assert_eq!(stats.body["throughput"], json!({"completed_last_minute": 0, "failed_last_minute": 1}));
    assert_eq!(stats.body["states"]["retryable"], 1);
    let every_state =
        ["scheduled", "available", "pending", "active", "retryable", "completed", "discarded", "cancelled"];
    for state in every_state {
        assert!(stats.body["states"][state].is_u64(), "{state} is counted");
    }
}

#[test]
fn a_cron_entry_whose_queue_is_paused_skips_its_runs_and_fires_again_once_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_800_000_000_000);
    let mut config = EngineConfig::new(dir.path());
    config.clock = Arc::new(clock.clone());
    config.wiring.entropy = Box::new(FixedEntropy(0));
    config.wiring.check_invariants = true;
    let engine = Engine::open(config).unwrap();
    let handle = engine.handle();
    let body = json!({"name": "every-minute", "schedule": "* * * * *", "type": "t", "args": [], "queue": "reports"});
    let definition = svc::cron::parse_cron_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap();
    handle.cron_put(definition).wait().unwrap();
    handle.pause_queue("reports".into(), true).wait().unwrap();

    clock.advance_ms(60_000);
    handle.tick().wait().unwrap();
    let skipped = handle.events_page(None, 100, |event| event.kind.type_name() == "cron.skipped");
    assert_eq!(skipped.events.len(), 1);
    assert!(
        matches!(&skipped.events[0].kind, svc::engine::EventKind::CronSkipped(skip) if skip.reason == "queue_paused")
    );
    assert_eq!(handle.cron("every-minute").unwrap().run_count, 0);
    let job = parse_enqueue_body(br#"{"type":"t","args":[],"options":{"queue":"reports"}}"#, &JobDefaults::default());
    let refused = handle.enqueue(vec![job.unwrap()]).wait().unwrap_err();
    assert!(matches!(refused, EngineError::QueuePaused { ref queue, index: None } if queue == "reports"));

    handle.pause_queue("reports".into(), false).wait().unwrap();
    clock.advance_ms(60_000);
    handle.tick().wait().unwrap();
    assert_eq!(handle.cron("every-minute").unwrap().run_count, 1, "fires again, without catching up");
    assert_eq!(handle.queue("reports").unwrap().size(), 1);
    engine.close();
}
