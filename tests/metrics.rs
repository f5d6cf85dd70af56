//! `GET /metrics` (docs/api.md, "Metrics"): the Prometheus text after a known
//! sequence of operations, its content type, bounded labels, and who may
//! read it; on PostgreSQL, the leader's counts of committed events.

mod common;

use common::{PostgresNode, TestServer, config_for};
use serde_json::json;
use svc::__private::config::Config;
use svc::__private::http::auth::{ApiKey, Role};

fn metrics_text(server: &TestServer, key: Option<&str>) -> (u16, String, String) {
    let mut request = common::http_client().get(format!("{}/metrics", server.base()));
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let response = request.send().unwrap();
    let status = response.status().as_u16();
    let content_type = response.headers().get("content-type").unwrap().to_str().unwrap().to_string();
    (status, content_type, response.text().unwrap())
}

/// The value of the sample `name{labels}` in the text, 0 when absent.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0.0, |value| value.parse().unwrap())
}

/// Three jobs enqueued (two to `mail`, one of them with one attempt), two
/// claimed, one acked and one failed for good; answers the acked job's id.
fn known_sequence(server: &TestServer) -> String {
    let kept = server.enqueue(json!({"type": "t", "args": [1], "options": {"queue": "mail"}}));
    server.enqueue(json!({"type": "t", "args": [2], "options": {"queue": "mail", "retry": {"max_attempts": 1}}}));
    server.enqueue(json!({"type": "t", "args": [3], "options": {"queue": "other"}}));
    let claimed = server.fetch(&["mail"], 2);
    assert_eq!(server.post("/svc/v1/workers/ack", json!({"job_id": claimed[0]["id"]})).status, 200);
    let error = json!({"type": "E", "message": "m"});
    assert_eq!(server.post("/svc/v1/workers/nack", json!({"job_id": claimed[1]["id"], "error": error})).status, 200);
    assert_eq!(claimed[0]["id"], kept.as_str());
    kept
}

#[test]
fn counters_follow_a_known_sequence_of_operations() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let kept = known_sequence(&server);
    assert_eq!(server.get("/svc/v1/jobs/019539a4-0000-7000-8000-000000000000").status, 404);
    assert_eq!(server.post("/svc/v1/queues/other/pause", json!({})).status, 200);

    let (status, content_type, text) = metrics_text(&server, None);
    assert_eq!((status, content_type.as_str()), (200, "text/plain"));
    assert_eq!(sample(&text, r#"svc_jobs_enqueued_total{queue="mail"}"#), 2.0);
    assert_eq!(sample(&text, r#"svc_jobs_enqueued_total{queue="other"}"#), 1.0);
    assert_eq!(sample(&text, r#"svc_jobs_completed_total{queue="mail"}"#), 1.0);
    assert_eq!(sample(&text, r#"svc_jobs_failed_total{queue="mail"}"#), 1.0);
    assert_eq!(sample(&text, r#"svc_jobs_discarded_total{queue="mail"}"#), 1.0);
    assert_eq!(sample(&text, r#"svc_job_duration_seconds_count{queue="mail"}"#), 1.0);
    assert_eq!(sample(&text, r#"svc_job_wait_seconds_count{queue="mail"}"#), 2.0);
    assert_eq!(sample(&text, r#"svc_http_requests_total{method="POST",route="/svc/v1/jobs",status="201"}"#), 3.0);
    assert_eq!(sample(&text, r#"svc_http_requests_total{method="GET",route="/svc/v1/jobs/{id}",status="404"}"#), 1.0);
    assert_eq!(sample(&text, r#"svc_http_request_duration_seconds_count{route="/svc/v1/jobs"}"#), 3.0);
    assert_eq!(sample(&text, r#"svc_queue_jobs{queue="mail",state="completed"}"#), 1.0);
    assert_eq!(sample(&text, r#"svc_queue_jobs{queue="other",state="available"}"#), 1.0);
    assert_eq!(sample(&text, r#"svc_queue_paused{queue="other"}"#), 1.0);
    assert!(sample(&text, "svc_engine_commit_records_count") >= 6.0);
    assert!(sample(&text, "svc_engine_sync_seconds_count") >= 6.0);
    assert!(text.contains("svc_engine_recovery_seconds"));
    // No id, job type or argument ever becomes a label.
    assert!(!text.contains(&kept) && !text.contains(r#"type="t""#));
}

/// On PostgreSQL the leader counts each committed event once, as it reads
/// them after they commit (docs/postgres.md, "Metrics").
#[test]
fn on_postgres_the_leader_counts_what_committed() {
    let server = PostgresNode::start("metrics");
    known_sequence(&server);

    let expected = [
        (r#"svc_jobs_enqueued_total{queue="mail"}"#, 2.0),
        (r#"svc_jobs_enqueued_total{queue="other"}"#, 1.0),
        (r#"svc_jobs_completed_total{queue="mail"}"#, 1.0),
        (r#"svc_jobs_failed_total{queue="mail"}"#, 1.0),
        (r#"svc_jobs_discarded_total{queue="mail"}"#, 1.0),
        (r#"svc_job_duration_seconds_count{queue="mail"}"#, 1.0),
        (r#"svc_job_wait_seconds_count{queue="mail"}"#, 2.0),
    ];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (_, _, text) = metrics_text(&server, None);
        let found: Vec<f64> = expected.iter().map(|(series, _)| sample(&text, series)).collect();
        if found == expected.map(|(_, value)| value) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{found:?}\n{text}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Counted once: later passes add nothing.
    std::thread::sleep(std::time::Duration::from_millis(400));
    let (_, _, text) = metrics_text(&server, None);
    assert_eq!(sample(&text, r#"svc_jobs_enqueued_total{queue="mail"}"#), 2.0);
    assert_eq!(sample(&text, r#"svc_queue_jobs{queue="mail",state="completed"}"#), 1.0);
}

#[test]
fn a_batch_counts_each_job_under_its_own_queue() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    // Runs of one queue, broken by another: each job counts once, in its queue.
    let queues = ["mail", "mail", "sms", "mail", "mail", "mail", "sms", "sms", "push"];
    let jobs: Vec<_> =
        queues.iter().map(|queue| json!({"type": "t", "args": [], "options": {"queue": queue}})).collect();
    assert_eq!(server.post("/svc/v1/jobs/batch", json!({"jobs": jobs})).status, 201);
    let (_, _, text) = metrics_text(&server, None);
    assert_eq!(sample(&text, r#"svc_jobs_enqueued_total{queue="mail"}"#), 5.0);
    assert_eq!(sample(&text, r#"svc_jobs_enqueued_total{queue="sms"}"#), 3.0);
    assert_eq!(sample(&text, r#"svc_jobs_enqueued_total{queue="push"}"#), 1.0);
}

#[test]
fn with_keys_metrics_need_one_unless_public() {
    let key = "metrics-key-0123456789abcdef0123456789ab";
    let dir = tempfile::tempdir().unwrap();
    let keys = vec![ApiKey::from_key("scraper".into(), Role::Worker, key).unwrap()];
    let config = Config { api_keys: keys.clone(), ..config_for(dir.path()) };
    let server = TestServer::start_with(&config, svc::__private::server::engine_config(&config));
    assert_eq!(metrics_text(&server, None).0, 401);
    assert_eq!(metrics_text(&server, Some(key)).0, 200, "any role may read metrics");
    let text = metrics_text(&server, Some(key)).2;
    assert!(!text.contains(key) && !text.contains("scraper"), "no key material or key names in metrics");
    server.stop();

    let dir = tempfile::tempdir().unwrap();
    let config = Config { api_keys: keys, metrics_public: true, ..config_for(dir.path()) };
    let server = TestServer::start_with(&config, svc::__private::server::engine_config(&config));
    assert_eq!(metrics_text(&server, None).0, 200);
}
