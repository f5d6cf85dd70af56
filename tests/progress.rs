//! Job progress over HTTP: a worker reports, anyone who may read the job
//! reads it back; out-of-range fractions are clamped; only an active job
//! (held by the reporting worker) takes a report; a new attempt starts
//! without the last one's progress; reports survive a restart and make
//! `job.progress` events.

mod common;

use common::TestServer;
use serde_json::json;

fn active_job(server: &TestServer, queue: &str) -> String {
    let id = server.enqueue(json!({"type": "t", "args": [], "options": {"queue": queue}}));
    let fetched = server.post("/svc/v1/workers/fetch", json!({"queues": [queue], "worker_id": "w1"}));
    assert_eq!(fetched.body["jobs"][0]["id"], id.as_str(), "{}", fetched.body);
    id
}

#[test]
fn a_worker_reports_progress_and_anyone_reads_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let id = active_job(&server, "q");
    let path = format!("/svc/v1/jobs/{id}/progress");

    let before = server.get(&path);
    assert_eq!(before.status, 200, "{}", before.body);
    assert_eq!((&before.body["progress"], &before.body["state"]), (&json!(null), &json!("active")));

    let body = json!({"progress": 0.25, "message": "a quarter", "data": {"rows": 250}, "worker_id": "w1"});
    let reported = server.put(&path, body);
    assert_eq!(reported.status, 200, "{}", reported.body);
    assert_eq!(reported.body["progress"], 0.25);
    assert_eq!(reported.body["message"], "a quarter");
    assert_eq!(reported.body["data"], json!({"rows": 250}));
    assert!(reported.body["updated_at"].is_string());

    let read = server.get(&path);
    assert_eq!((read.body["progress"].as_f64(), &read.body["data"]["rows"]), (Some(0.25), &json!(250)));
    let job = server.job(&id);
    assert_eq!((job["progress"].as_f64(), &job["progress_message"]), (Some(0.25), &json!("a quarter")));

    // Out of range is clamped, not refused; a later report replaces the last.
    assert_eq!(server.put(&path, json!({"progress": 7})).body["progress"], 1.0);
    assert_eq!(server.put(&path, json!({"progress": -0.5})).body["progress"], 0.0);
    let last = server.get(&path).body;
    assert_eq!((&last["message"], &last["data"]), (&json!(null), &json!(null)), "the last report replaced all of it");

    server.put(&path, json!({"progress": 0.5, "message": "half"}));
    // Events are kept in memory: read them before the restart.
    let events = server.get("/svc/v1/events?types=job.progress");
    let data: Vec<f64> = events.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|event| event["data"]["progress"].as_f64())
        .collect();
    assert_eq!(data, [0.25, 1.0, 0.0, 0.5], "{}", events.body);
    assert_eq!(events.body["events"][0]["data"]["message"], "a quarter");
    assert_eq!(events.body["events"][0]["data"]["job_id"], id.as_str());

    // Durable: it survives a restart.
    server.stop();
    let server = TestServer::start(dir.path());
    let read = server.get(&path).body;
    assert_eq!((read["progress"].as_f64(), &read["message"]), (Some(0.5), &json!("half")));
}

#[test]
fn only_the_holder_of_an_active_job_reports_and_bad_reports_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let waiting = server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "idle"}}));
    let refused = server.put(&format!("/svc/v1/jobs/{waiting}/progress"), json!({"progress": 0.5}));
    assert_eq!((refused.status, refused.error_code()), (409, "conflict"), "{}", refused.body);
    assert_eq!(refused.body["error"]["details"]["expected_state"], "active");

    let unknown = "019539a4-0000-7000-8000-000000000000";
    assert_eq!(server.put(&format!("/svc/v1/jobs/{unknown}/progress"), json!({"progress": 0.5})).status, 404);
    assert_eq!(server.get(&format!("/svc/v1/jobs/{unknown}/progress")).status, 404);

    let id = active_job(&server, "q");
    let path = format!("/svc/v1/jobs/{id}/progress");
    let other = server.put(&path, json!({"progress": 0.5, "worker_id": "w2"}));
    assert_eq!((other.status, other.error_code()), (409, "conflict"), "another worker: {}", other.body);
    for body in [
        json!({}),
        json!({"progress": "half"}),
        json!({"progress": null}),
        json!({"progress": 0.5, "message": 3}),
        json!({"progress": 0.5, "message": "m".repeat(4097)}),
        json!({"progress": 0.5, "data": "d".repeat(65_536)}),
        json!([0.5]),
    ] {
        let answer = server.put(&path, body.clone());
        assert!(matches!(answer.status, 400 | 413), "{body}: {} {}", answer.status, answer.body);
    }
    assert_eq!(server.get(&path).body["progress"], json!(null), "nothing refused was kept");
    assert!(server.job(&id).get("progress").is_none());
}

#[test]
fn a_new_attempt_starts_without_the_last_ones_progress() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let id = server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "q"}}));
    assert_eq!(server.fetch(&["q"], 1)[0]["id"], id.as_str());
    let path = format!("/svc/v1/jobs/{id}/progress");
    assert_eq!(server.put(&path, json!({"progress": 0.9})).status, 200);
    let nack = server
        .post("/svc/v1/workers/nack", json!({"job_id": id, "error": {"type": "E", "message": "m"}, "requeue": true}));
    assert_eq!(nack.status, 200, "{}", nack.body);
    assert_eq!(server.job(&id)["progress"], 0.9, "kept while it waits: the last attempt's");
    assert_eq!(server.fetch(&["q"], 1)[0]["id"], id.as_str());
    let job = server.job(&id);
    assert!(job.get("progress").is_none(), "{job}");
    assert_eq!(server.get(&path).body["progress"], json!(null));

    // A finished job keeps what its last attempt reported.
    assert_eq!(server.put(&path, json!({"progress": 1.0, "message": "done"})).status, 200);
    assert_eq!(server.post("/svc/v1/workers/ack", json!({"job_id": id})).status, 200);
    assert_eq!(server.get(&path).body["message"], "done");
    let late = server.put(&path, json!({"progress": 0.1}));
    assert_eq!(late.status, 409, "a completed job takes no report: {}", late.body);
}

#[test]
fn a_report_replays_from_the_log_and_loads_from_a_snapshot() {
    use std::sync::Arc;
    use svc::clock::ManualClock;
    use svc::engine::{Engine, EngineConfig, FetchRequest, ReportProgress};
    use svc::job::{JobDefaults, JobProgress, parse_enqueue_body};

    let dir = tempfile::tempdir().unwrap();
    let config = || {
        let mut config = EngineConfig::new(dir.path());
        config.clock = Arc::new(ManualClock::new(1_800_000_000_000));
        config.wiring.check_invariants = true;
        config
    };
    let engine = Engine::open(config()).unwrap();
    let job = parse_enqueue_body(br#"{"type":"t","args":[]}"#, &JobDefaults::default()).unwrap();
    let id = engine.handle().enqueue(vec![job]).wait().unwrap()[0].job.id;
    let fetch = FetchRequest { queues: vec!["default".into()], count: 1, worker_id: None, visibility_timeout_ms: None };
    assert_eq!(engine.handle().fetch(fetch).wait().unwrap()[0].id, id);
    let progress = JobProgress::new(0.3).message("a third").data(&json!({"n": 3})).unwrap();
    let job = engine.handle().submit(ReportProgress { id, progress, worker_id: None }).wait().unwrap();
    assert_eq!(job.progress().map(|p| (p.fraction, p.updated_at)), Some((0.3, 1_800_000_000_000)));
    engine.close_without_snapshot();

    let engine = Engine::open(config()).unwrap();
    let replayed = engine.handle().job(id).unwrap();
    assert_eq!(replayed.progress().map(|p| p.message.as_deref()), Some(Some("a third")));
    engine.handle().snapshot().wait().unwrap();
    engine.close_without_snapshot();

    let engine = Engine::open(config()).unwrap();
    let loaded = engine.handle().job(id).unwrap();
    assert_eq!(loaded.progress(), replayed.progress());
    assert_eq!(loaded.progress().and_then(|p| p.data.as_deref()), Some(r#"{"n":3}"#));
}
