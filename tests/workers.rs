//! The worker registry and operator signals (docs/api.md, "The worker registry and signals"): workers appear
//! on contact, quiet and terminate stop new claims, signals survive restarts,
//! and forgetting a worker clears its signal. Heartbeats as SDKs send them
//! (docs/api.md, "Heartbeat") extend the jobs they list.

mod common;

use common::TestServer;
use serde_json::json;

fn fetch_as(server: &TestServer, worker: &str) -> Vec<serde_json::Value> {
    let answer = server.post("/svc/v1/workers/fetch", json!({"queues": ["default"], "worker_id": worker}));
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body["jobs"].as_array().unwrap().clone()
}

#[test]
fn workers_register_on_contact_and_list_their_active_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let id = server.enqueue(json!({"type": "t", "args": []}));
    assert_eq!(fetch_as(&server, "w-b").len(), 1);
    server.post("/svc/v1/workers/heartbeat", json!({"worker_id": "w-a"}));
    let listing = server.get("/svc/v1/workers");
    assert_eq!(listing.status, 200);
    let ids: Vec<&str> =
        listing.body["workers"].as_array().unwrap().iter().map(|w| w["worker_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["w-a", "w-b"]);
    let worker = server.get("/svc/v1/workers/w-b").body["worker"].clone();
    assert_eq!((worker["state"].as_str(), worker["stale"].as_bool()), (Some("running"), Some(false)));
    assert_eq!(worker["active_job_ids"], json!([id]));
    assert!(worker["first_seen_at"].is_string() && worker.get("last_heartbeat_at").is_none());
    assert!(server.get("/svc/v1/workers/w-a").body["worker"]["last_heartbeat_at"].is_string());
    server.post("/svc/v1/workers/ack", json!({"job_id": id}));
    assert_eq!(server.get("/svc/v1/workers/w-b").body["worker"]["active_job_ids"], json!([]));

    let page = server.get("/svc/v1/workers?limit=1");
    assert_eq!(
        (page.body["workers"][0]["worker_id"].as_str(), page.body["has_more"].as_bool()),
        (Some("w-a"), Some(true))
    );
    let cursor = page.body["cursor"].as_str().unwrap();
    assert_eq!(server.get(&format!("/svc/v1/workers?limit=1&cursor={cursor}")).body["workers"][0]["worker_id"], "w-b");
    assert_eq!(server.get("/svc/v1/workers/nobody").status, 404);
    assert_eq!(server.get("/svc/v1/workers?state=asleep").status, 400);
}

#[test]
fn quiet_and_terminate_stop_new_claims_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    for n in 0..3 {
        server.enqueue(json!({"type": "t", "args": [n]}));
    }
    assert_eq!(fetch_as(&server, "w-1").len(), 1);
    assert_eq!(fetch_as(&server, "w-2").len(), 1);
    let quiet = server.post_raw("/svc/v1/workers/w-1/quiet", "", None);
    assert_eq!((quiet.status, quiet.body["worker"]["state"].as_str()), (200, Some("quiet")));
    assert!(fetch_as(&server, "w-1").is_empty(), "a quiet worker gets no new jobs");
    let beat = server.post("/svc/v1/workers/heartbeat", json!({"worker_id": "w-1"}));
    assert_eq!(
        (beat.body["state"].as_str(), beat.body["jobs_extended"].as_i64()),
        (Some("quiet"), Some(1)),
        "it may finish what it holds"
    );
    assert_eq!(server.post_raw("/svc/v1/workers/w-1/quiet", "", None).status, 200, "idempotent");

    assert_eq!(server.post_raw("/svc/v1/workers/w-2/terminate", "", None).body["worker"]["state"], "terminate");
    let refused = server.post_raw("/svc/v1/workers/w-2/quiet", "", None);
    assert_eq!((refused.status, refused.error_code()), (409, "conflict"));
    assert_eq!(server.post_raw("/svc/v1/workers/nobody/terminate", "", None).status, 404);
    let quiet_only = server.get("/svc/v1/workers?state=quiet");
    assert_eq!(quiet_only.body["workers"].as_array().unwrap().len(), 1);

    server.stop();
    let server = TestServer::start(dir.path());
    assert_eq!(server.get("/svc/v1/workers/w-2").body["worker"]["state"], "terminate", "signals are durable");
    assert!(fetch_as(&server, "w-2").is_empty());
    assert_eq!(fetch_as(&server, "w-3").len(), 1, "other workers still get work");

    let forgotten = server.delete("/svc/v1/workers/w-2");
    assert_eq!(forgotten.body, json!({"deleted": true, "worker_id": "w-2"}));
    assert_eq!(server.get("/svc/v1/workers/w-2").status, 404);
    assert_eq!(server.delete("/svc/v1/workers/w-2").status, 404);
    server.enqueue(json!({"type": "t", "args": ["more"]}));
    assert_eq!(fetch_as(&server, "w-2").len(), 1, "a forgotten worker starts afresh");
}

#[test]
fn first_contact_and_signals_are_events() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let id = server.enqueue(json!({"type": "t", "args": []}));
    assert_eq!(fetch_as(&server, "w-1").len(), 1);
    fetch_as(&server, "w-1");
    server.post_raw("/svc/v1/workers/w-1/quiet", "", None);
    let events = server.get("/svc/v1/events?types=worker.*");
    let kinds: Vec<(&str, &str)> = events.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| (event["type"].as_str().unwrap(), event["subject"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds, [("worker.started", "w-1"), ("worker.quiet", "w-1")], "started once, on first contact");
    let quiet = &events.body["events"][1];
    assert_eq!((quiet["data"]["by"].as_str(), &quiet["data"]["active_job_ids"]), (Some("operator"), &json!([id])));
    assert_eq!(quiet["data"]["worker_id"], "w-1");
}

#[test]
fn workers_idle_for_a_day_are_forgotten_with_their_signals() {
    use std::sync::Arc;
    use svc::clock::ManualClock;
    let dir = tempfile::tempdir().unwrap();
    let config = common::config_for(dir.path());
    let clock = ManualClock::new(1_800_000_000_000);
    let mut engine = svc::__private::server::engine_config(&config);
    engine.clock = Arc::new(clock.clone());
    let server = TestServer::start_with(&config, engine);
    fetch_as(&server, "steady");
    fetch_as(&server, "idle");
    server.post_raw("/svc/v1/workers/idle/terminate", "", None);
    clock.advance_ms(23 * 3_600_000);
    server.post("/svc/v1/workers/heartbeat", json!({"worker_id": "steady"}));
    assert_eq!(server.get("/svc/v1/workers").body["workers"].as_array().unwrap().len(), 2, "a day has not passed");
    clock.advance_ms(2 * 3_600_000);
    server.engine().tick().wait().unwrap();
    let ids: Vec<String> = server.get("/svc/v1/workers").body["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|worker| worker["worker_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["steady"], "the worker idle for 25 h is gone; the one seen 2 h ago stays");
    assert_eq!(server.get("/svc/v1/workers/idle").status, 404);
    let beat = server.post("/svc/v1/workers/heartbeat", json!({"worker_id": "idle"}));
    assert_eq!(beat.body["state"], "running", "its terminate signal was forgotten with it");
}

/// A heartbeat as the OJS JavaScript SDK sends it: `active_jobs` a count,
/// `active_job_ids` the list. The list extends the job's visibility, so it
/// is not handed out again when the fetch's deadline passes.
#[test]
fn a_heartbeat_with_a_count_beside_the_list_extends_the_listed_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let clock = svc::clock::ManualClock::new(1_750_000_000_000);
    let server = TestServer::start_at(dir.path(), &clock);
    let kept = server.enqueue(json!({"type": "t", "args": [1], "queue": "sdk"}));
    let counted = server.enqueue(json!({"type": "t", "args": [2], "queue": "counted"}));
    let fetch = |queue: &str, worker: &str| {
        let body = json!({"queues": [queue], "worker_id": worker, "visibility_timeout_ms": 5000});
        server.post("/svc/v1/workers/fetch", body).body["jobs"].as_array().unwrap().clone()
    };
    assert_eq!(fetch("sdk", "w-sdk")[0]["id"], kept);
    assert_eq!(fetch("counted", "w-count")[0]["id"], counted);
    server.advance(&clock, 4_000);

    let beat =
        json!({"worker_id": "w-sdk", "active_jobs": 1, "active_job_ids": [kept], "visibility_timeout_ms": 60_000});
    let answer = server.post("/svc/v1/workers/heartbeat", beat);
    assert_eq!((answer.status, answer.body["jobs_extended"].as_i64()), (200, Some(1)), "{}", answer.body);
    // A count alone still extends nothing.
    let count_only = json!({"worker_id": "w-count", "active_jobs": 1, "visibility_timeout_ms": 60_000});
    assert_eq!(server.post("/svc/v1/workers/heartbeat", count_only).body["jobs_extended"], 0);

    server.advance(&clock, 2_000); // past the fetch's 5 s, within the heartbeat's 60 s
    assert!(fetch("sdk", "w-other").is_empty(), "the extended job is not handed out again");
    assert_eq!(server.job(&kept)["state"], "active");
    assert_eq!(fetch("counted", "w-other")[0]["id"], counted, "the job a bare count named went back");

    // The list is checked as `active_jobs` is, and named in the error.
    let bad = json!({"worker_id": "w-sdk", "active_jobs": 1, "active_job_ids": "x"});
    let answer = server.post("/svc/v1/workers/heartbeat", bad);
    assert_eq!((answer.status, answer.body["error"]["details"]["field"].as_str()), (400, Some("active_job_ids")));
    // A list in `active_jobs` wins over `active_job_ids`.
    let both = json!({"worker_id": "w-sdk", "active_jobs": [kept], "active_job_ids": []});
    assert_eq!(server.post("/svc/v1/workers/heartbeat", both).body["jobs_extended"], 1);
}

/// A full registry makes room by forgetting the least recently seen worker
/// without active jobs: one that held a job when last seen counts as idle
/// once the job ends, and one holding a job is passed over however old.
#[test]
fn a_full_registry_forgets_the_least_recently_seen_idle_worker() {
    use svc::clock::ManualClock;
    use svc::engine::FetchRequest;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_800_000_000_000);
    let server = TestServer::start_at(dir.path(), &clock);
    let handle = server.engine();
    let fetch = |worker: &str| {
        let request = FetchRequest {
            queues: vec!["default".into()],
            count: 1,
            worker_id: Some(worker.to_string()),
            visibility_timeout_ms: Some(3_600_000),
        };
        handle.fetch(request).wait().unwrap()[0].id
    };
    server.enqueue(json!({"type": "t", "args": []}));
    server.enqueue(json!({"type": "t", "args": []}));
    fetch("a-busy");
    server.advance(&clock, 1);
    let done = fetch("b-done");
    server.advance(&clock, 1);
    handle.heartbeat("b-done".into(), None, None).wait().unwrap();
    server.advance(&clock, 1);
    handle.ack(done, None, None).wait().unwrap();
    server.advance(&clock, 1);
    let fillers: Vec<_> = (0..svc::__private::limits::WORKERS_MAX - 2)
        .map(|n| handle.heartbeat(format!("f{n:05}"), None, None))
        .collect();
    for beat in fillers {
        beat.wait().unwrap();
    }
    server.advance(&clock, 1);

    handle.heartbeat("new-1".into(), None, None).wait().unwrap();
    assert!(handle.worker("b-done").is_none(), "the worker whose job ended was the least recently seen idle one");
    handle.heartbeat("new-2".into(), None, None).wait().unwrap();
    assert!(handle.worker("f00000").is_none(), "then the oldest filler");
    assert!(handle.worker("a-busy").is_some_and(|worker| worker.active_job_ids.len() == 1));
    assert!(handle.worker("f00001").is_some() && handle.worker("new-1").is_some());
}

#[test]
fn a_heartbeat_names_the_listed_jobs_it_did_not_extend() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::TestServer::start(dir.path());
    let ids: Vec<String> = (0..3)
        .map(|n| server.enqueue(serde_json::json!({"type": "t", "args": [n], "options": {"queue": "q"}})))
        .collect();
    let fetched =
        server.post("/svc/v1/workers/fetch", serde_json::json!({"queues": ["q"], "count": 2, "worker_id": "w1"}));
    assert_eq!(fetched.body["jobs"].as_array().map(Vec::len), Some(2), "{}", fetched.body);
    // One held job is cancelled meanwhile; the third was never claimed; one id is unknown.
    assert_eq!(server.delete(&format!("/svc/v1/jobs/{}", ids[1])).status, 200);
    let unknown = "019539a4-0000-7000-8000-000000000000";
    let listed = [ids[0].as_str(), ids[1].as_str(), ids[2].as_str(), unknown];
    let beat =
        server.post("/svc/v1/workers/heartbeat", serde_json::json!({"worker_id": "w1", "active_job_ids": listed}));
    assert_eq!(beat.status, 200, "{}", beat.body);
    assert_eq!(beat.body["jobs_extended"], 1);
    let mut expected = vec![ids[1].clone(), ids[2].clone(), unknown.to_string()];
    expected.sort();
    assert_eq!(beat.body["jobs_not_extended"], serde_json::json!(expected));
    // All extended: the field is left out.
    let beat =
        server.post("/svc/v1/workers/heartbeat", serde_json::json!({"worker_id": "w1", "active_job_ids": [ids[0]]}));
    assert!(beat.body.get("jobs_not_extended").is_none(), "{}", beat.body);
}
