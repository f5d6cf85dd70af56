//! End-to-end tests of the level-0 HTTP API against a real server on
//! 127.0.0.1:0 with a temp data dir: every endpoint, success and error paths.

mod common;

use common::TestServer;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn server() -> (tempfile::TempDir, TestServer) {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = TestServer::start(dir.path());
    (dir, server)
}

#[test]
fn enqueue_returns_the_stored_job_with_headers() {
    let (_dir, server) = server();
    let answer = server.post(
        "/svc/v1/jobs",
        json!({"type": "email.send", "args": ["a@example.com", 1.50], "meta": {"trace_id": "t-1"}}),
    );
    assert_eq!(answer.status, 201);
    let job = &answer.body["job"];
    let id = job["id"].as_str().unwrap();
    assert!(svc::job::JobId::parse(id).is_some(), "UUIDv7 id: {id}");
    assert_eq!(answer.header("location"), Some(format!("/svc/v1/jobs/{id}").as_str()));
    assert_eq!(answer.header("content-type"), Some("application/svc+json"));
    assert_eq!(answer.header("svc-version"), Some("1.0.0-rc.1"));
    assert!(answer.header("x-request-id").is_some_and(|id| id.starts_with("req_")));
    assert_eq!(job["state"], "available");
    assert_eq!(job["queue"], "default");
    assert_eq!(job["attempt"], 0);
    assert_eq!(job["max_attempts"], 3);
    assert_eq!(job["meta"]["trace_id"], "t-1");
    let created = job["created_at"].as_str().unwrap();
    assert!(created.ends_with('Z') && created.parse::<jiff::Timestamp>().is_ok(), "RFC 3339 UTC: {created}");
    assert!(job.get("started_at").is_none() && job.get("completed_at").is_none() && job.get("error").is_none());
    assert_eq!(server.job(id)["state"], "available");
}

#[test]
fn raw_json_round_trips_exactly() {
    let (_dir, server) = server();
    let body = r#"{"type":"t","args":[1.50,1e2,{"z":1,"a":2}],"x_ext":{"b":1,"a":[true,null]},"state":"completed"}"#;
    let answer = server.post_raw("/svc/v1/jobs", body, Some("application/json"));
    assert_eq!(answer.status, 201, "{}", answer.body);
    let id = answer.body["job"]["id"].as_str().unwrap().to_string();
    let text = server.client.get(format!("{}/svc/v1/jobs/{id}", server.base)).send().unwrap().text().unwrap();
    assert!(text.contains(r#""args":[1.50,1e2,{"z":1,"a":2}]"#), "{text}");
    assert!(text.contains(r#""x_ext":{"b":1,"a":[true,null]}"#), "{text}");
    assert!(text.contains(r#""state":"available""#), "system-managed state is dropped: {text}");
}

#[test]
fn client_ids_are_used_once() {
    let (_dir, server) = server();
    let id = "019539a4-aaaa-7000-8000-111111111111";
    assert_eq!(server.enqueue(json!({"type": "t", "args": [], "id": id})), id);
    let again = server.post("/svc/v1/jobs", json!({"type": "t", "args": [], "id": id}));
    assert_eq!((again.status, again.error_code()), (409, "duplicate"));
    assert_eq!(again.body["error"]["details"]["existing_job_id"], id);
}

#[test]
fn invalid_enqueues_get_their_documented_errors_and_store_nothing() {
    let (_dir, server) = server();
    let cases: Vec<(String, Option<&str>, u16, &str)> = vec![
        ("{not json".into(), Some("application/svc+json"), 400, "invalid_request"),
        ("[1,2]".into(), Some("application/svc+json"), 400, "invalid_request"),
        (r#"{"args":[]}"#.into(), Some("application/svc+json"), 400, "invalid_request"),
        (r#"{"type":"t"}"#.into(), Some("application/svc+json"), 400, "invalid_request"),
        (r#"{"type":"t","args":"x"}"#.into(), Some("application/svc+json"), 400, "invalid_payload"),
        (r#"{"type":"1bad","args":[]}"#.into(), Some("application/svc+json"), 400, "invalid_payload"),
        (
            r#"{"type":"t","args":[],"options":{"queue":"Bad Queue"}}"#.into(),
            Some("application/svc+json"),
            400,
            "invalid_payload",
        ),
        (
            r#"{"type":"t","args":[],"options":{"priority":101}}"#.into(),
            Some("application/svc+json"),
            400,
            "invalid_payload",
        ),
        (
            r#"{"type":"t","args":[],"options":{"retry":{"backoff_strategy":"linear"}}}"#.into(),
            Some("application/svc+json"),
            400,
            "invalid_payload",
        ),
        (
            r#"{"type":"t","args":[],"options":{"expires_at":"2001-01-01T00:00:00Z"}}"#.into(),
            Some("application/svc+json"),
            400,
            "invalid_payload",
        ),
        (
            r#"{"type":"t","args":[],"options":{"unique":{"keys":["a"]}}}"#.into(),
            Some("application/svc+json"),
            400,
            "invalid_payload",
        ),
        (
            r#"{"type":"t","args":[],"options":{"rate_limit":{"concurrency":0}}}"#.into(),
            Some("application/svc+json"),
            400,
            "invalid_payload",
        ),
        (
            r#"{"type":"t","args":[],"schema":"urn:example:s"}"#.into(),
            Some("application/svc+json"),
            400,
            "schema_validation",
        ),
        (r#"{"type":"t","args":[]}"#.into(), None, 400, "invalid_request"),
        (r#"{"type":"t","args":[]}"#.into(), Some("text/plain"), 400, "invalid_request"),
        (
            format!(r#"{{"type":"t","args":[],"meta":{{"k":"{}"}}}}"#, "x".repeat(70_000)),
            Some("application/svc+json"),
            413,
            "envelope_too_large",
        ),
    ];
    for (body, content_type, status, code) in cases {
        let answer = server.post_raw("/svc/v1/jobs", body.clone(), content_type);
        let shown: String = body.chars().take(80).collect();
        assert_eq!((answer.status, answer.error_code()), (status, code), "{shown}: {}", answer.body);
        let error = &answer.body["error"];
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
        assert_eq!(error["retryable"], false);
        assert!(error["details"].is_object() && error["hint"].is_string() && error["docs_url"].is_string());
        assert_eq!(error["request_id"].as_str(), answer.header("x-request-id"));
    }
    // A body that is not UTF-8 is not JSON either.
    let not_utf8 = b"{\"type\":\"t\",\"args\":[\"\xff\"]}".to_vec();
    let answer = server.post_raw("/svc/v1/jobs", not_utf8, Some("application/svc+json"));
    assert_eq!((answer.status, answer.error_code()), (400, "invalid_request"), "{}", answer.body);
    assert!(answer.body["error"]["message"].as_str().is_some_and(|m| m.contains("UTF-8")), "{}", answer.body);
    let queues = server.get("/svc/v1/queues");
    assert_eq!(queues.body["queues"], json!([{"name": "default", "size": 0, "paused": false}]));
}

#[test]
fn an_oversized_body_is_refused_before_it_is_read() {
    use std::io::{Read, Write};
    let (_dir, server) = server();
    let mut stream = std::net::TcpStream::connect(server.base.trim_start_matches("http://")).unwrap();
    let declared = 3 * 1024 * 1024;
    let head = format!(
        "POST /svc/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/svc+json\r\nContent-Length: {declared}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    // Only the first KiB of the body is ever sent.
    stream.write_all(&[b' '; 1024]).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    let mut response = Vec::new();
    let mut buffer = [0u8; 4096];
    while !String::from_utf8_lossy(&response).contains("docs_url") {
        let read = stream.read(&mut buffer).expect("the server answers without waiting for the body");
        assert!(read > 0, "connection closed before an answer");
        response.extend_from_slice(&buffer[..read]);
    }
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("envelope_too_large") && text.contains(&format!("\"actual_bytes\":{declared}")), "{text}");
}

#[test]
fn field_errors_name_the_field() {
    let (_dir, server) = server();
    let answer =
        server.post("/svc/v1/jobs", json!({"type": "t", "args": [], "options": {"retry": {"max_attempts": -1}}}));
    assert_eq!(answer.body["error"]["details"]["field"], "options.retry.max_attempts");
    let answer = server.post_raw("/svc/v1/jobs", r#"{"type":"t","args":[]}"#, None);
    assert_eq!(answer.body["error"]["details"]["reason"], "content_type_required");
}

#[test]
fn version_header_is_checked_on_api_routes_only() {
    let (_dir, server) = server();
    let send = |path: &str, version: &str| {
        let response =
            server.client.get(format!("{}{path}", server.base)).header("svc-version", version).send().unwrap();
        (response.status().as_u16(), response.json::<Value>().unwrap())
    };
    assert_eq!(send("/svc/v1/queues", "1.0.0").0, 200);
    assert_eq!(send("/svc/v1/queues", "1").0, 200);
    let (status, body) = send("/svc/v1/queues", "2.0.0");
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("unsupported")));
    assert_eq!(body["error"]["details"]["supported_versions"], json!(["1.0.0-rc.1"]));
    assert_eq!(send("/svc/v1/health", "2.0.0").0, 200);
    assert_eq!(send("/svc/manifest", "9").0, 200);
}

#[test]
fn unknown_routes_and_methods() {
    let (_dir, server) = server();
    let answer = server.get("/svc/v1/nothing");
    assert_eq!((answer.status, answer.error_code()), (404, "not_found"));
    assert_eq!(answer.body["error"]["details"]["resource_type"], "route");
    assert_eq!(server.get("/svc/v1/jobs/").status, 404, "no trailing-slash normalisation");
    let answer = server.get("/svc/v1/jobs");
    assert_eq!((answer.status, answer.error_code()), (405, "method_not_allowed"));
    assert_eq!(answer.header("allow"), Some("POST"));
}

#[test]
fn request_ids_are_echoed_when_valid() {
    let (_dir, server) = server();
    let response = server
        .client
        .get(format!("{}/svc/v1/jobs/nope", server.base))
        .header("x-request-id", "trace-42")
        .send()
        .unwrap();
    assert_eq!(response.headers()["x-request-id"], "trace-42");
    assert_eq!(response.json::<Value>().unwrap()["error"]["request_id"], "trace-42");
    let too_long = "x".repeat(129);
    let response =
        server.client.get(format!("{}/svc/v1/health", server.base)).header("x-request-id", too_long).send().unwrap();
    assert!(response.headers()["x-request-id"].to_str().unwrap().starts_with("req_"));
}

#[test]
fn get_job_unknown_and_malformed_ids_are_404() {
    let (_dir, server) = server();
    for id in ["019539a4-0000-7000-8000-000000000000", "not-an-id", "550e8400-e29b-41d4-a716-446655440000"] {
        let answer = server.get(&format!("/svc/v1/jobs/{id}"));
        assert_eq!((answer.status, answer.error_code()), (404, "not_found"), "{id}");
        assert_eq!(answer.body["error"]["details"]["resource_type"], "job");
    }
    // Hex digits in upper case name the same job, in a path or a body.
    let id = server.enqueue(json!({"type": "t", "args": []}));
    let upper = id.to_ascii_uppercase();
    assert_eq!(server.get(&format!("/svc/v1/jobs/{upper}")).body["job"]["id"], id);
    server.fetch(&["default"], 1);
    let acked = server.post("/svc/v1/workers/ack", json!({"job_id": upper}));
    assert_eq!((acked.status, acked.body["job"]["id"].as_str()), (200, Some(id.as_str())), "{}", acked.body);
}

#[test]
fn fetch_orders_by_priority_then_fifo_then_queue_order() {
    let (_dir, server) = server();
    let low = server.enqueue(json!({"type": "t", "args": [1], "options": {"queue": "q1", "priority": -5}}));
    let first = server.enqueue(json!({"type": "t", "args": [2], "options": {"queue": "q1"}}));
    let second = server.enqueue(json!({"type": "t", "args": [3], "options": {"queue": "q1"}}));
    let urgent = server.enqueue(json!({"type": "t", "args": [4], "options": {"queue": "q1", "priority": 10}}));
    let other = server.enqueue(json!({"type": "t", "args": [5], "options": {"queue": "q2", "priority": 100}}));
    let ids: Vec<String> =
        server.fetch(&["q1", "q2"], 10).iter().map(|job| job["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids, [urgent, first, second, low, other]);
    assert!(server.fetch(&["q1", "q2"], 10).is_empty());
}

#[test]
fn a_queue_named_twice_in_one_fetch_hands_out_each_job_once() {
    let (_dir, server) = server();
    let id = server.enqueue(json!({"type": "t", "args": []}));
    let other = server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "q2"}}));
    let answer = server.post("/svc/v1/workers/fetch", json!({"queues": ["default", "q2", "default"], "count": 5}));
    assert_eq!(answer.status, 200, "{}", answer.body);
    let jobs = answer.body["jobs"].as_array().unwrap();
    let claimed: Vec<(&str, i64)> =
        jobs.iter().map(|job| (job["id"].as_str().unwrap(), job["attempt"].as_i64().unwrap())).collect();
    assert_eq!(claimed, [(id.as_str(), 1), (other.as_str(), 1)]);
    assert_eq!(server.job(&id)["attempt"], 1);
}

#[test]
fn client_ids_at_the_end_of_time_cannot_make_generated_ids_collide() {
    let (dir, server) = server();
    // A client id far ahead of the clock is refused; it would move the generator.
    let far =
        server.post("/svc/v1/jobs", json!({"type": "t", "args": [], "id": "ffffffff-ffff-7000-8000-000000000000"}));
    assert_eq!((far.status, far.error_code()), (400, "invalid_payload"), "{}", far.body);
    assert_eq!(far.body["error"]["details"]["reason"], "id_in_future");
    assert_eq!(server.get("/svc/v1/jobs/ffffffff-ffff-7000-8000-000000000000").status, 404);
    // Ids a little ahead of the clock are taken, and generated ids still never collide.
    let soon = svc::clock::Clock::now_ms(&svc::clock::SystemClock) + 60_000;
    let near = format!("{:08x}-{:04x}-7fff-bfff-ffffffffffff", soon >> 16, soon & 0xffff);
    assert_eq!(server.post("/svc/v1/jobs", json!({"type": "t", "args": [], "id": near})).status, 201);
    let mut ids = std::collections::HashSet::new();
    for _ in 0..3 {
        let generated = server.enqueue(json!({"type": "t", "args": []}));
        assert!(generated > near, "{generated} sorts after {near}");
        assert!(ids.insert(generated));
    }
    assert_eq!(server.get("/svc/v1/health").status, 200);
    server.stop();
    let server = TestServer::start(dir.path());
    assert_ne!(server.enqueue(json!({"type": "t", "args": []})), near);
    assert_eq!(server.get("/svc/v1/health").status, 200);
}

#[test]
fn fetch_claims_and_marks_active() {
    let (_dir, server) = server();
    let id = server.enqueue(json!({"type": "t", "args": []}));
    let answer = server.post(
        "/svc/v1/workers/fetch",
        json!({"queues": ["default"], "worker_id": "w-1", "visibility_timeout_ms": 5000}),
    );
    let job = &answer.body["jobs"][0];
    assert_eq!(
        (job["id"].as_str(), job["state"].as_str(), job["attempt"].as_i64()),
        (Some(id.as_str()), Some("active"), Some(1))
    );
    assert_eq!(job["worker_id"], "w-1");
    assert!(job["started_at"].is_string());
    assert_eq!(server.job(&id)["state"], "active");
}

#[test]
fn concurrent_fetches_never_share_a_job() {
    let (_dir, server) = server();
    for n in 0..200 {
        server.enqueue(json!({"type": "t", "args": [n], "options": {"queue": "race"}}));
    }
    let claimed: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let jobs = server.fetch(&["race"], 3);
                        if jobs.is_empty() {
                            return mine;
                        }
                        mine.extend(jobs.iter().map(|job| job["id"].as_str().unwrap().to_string()));
                    }
                })
            })
            .collect();
        workers.into_iter().flat_map(|worker| worker.join().unwrap()).collect()
    });
    let unique: std::collections::HashSet<_> = claimed.iter().collect();
    assert_eq!((claimed.len(), unique.len()), (200, 200));
}

#[test]
fn fetch_validation() {
    let (_dir, server) = server();
    for body in [
        json!({}),
        json!({"queues": []}),
        json!({"queues": ["Bad"]}),
        json!({"queues": ["default"], "count": 0}),
        json!({"queues": ["default"], "count": 1.5}),
        json!({"queues": ["default"], "worker_id": "has space"}),
        json!({"queues": ["default"], "worker_id": "fetch"}),
        json!({"queues": ["default"], "visibility_timeout_ms": 0}),
        json!({"queues": "default"}),
        json!({"queues": ["default", 1]}),
        json!({"queues": ["default"], "count": "2"}),
        json!({"queues": ["default"], "worker_id": 7}),
        json!({"queues": ["default"], "visibility_timeout_ms": "60000"}),
    ] {
        let answer = server.post("/svc/v1/workers/fetch", body.clone());
        assert_eq!((answer.status, answer.error_code()), (400, "invalid_request"), "{body}");
    }
    // Escaped names are decoded before they are checked.
    let escaped = r#"{"queues":["d\u0065fault"],"worker_id":"w\u002d1","count":1}"#;
    let answer = server.post_raw("/svc/v1/workers/fetch", escaped, Some("application/svc+json"));
    assert_eq!((answer.status, answer.body["jobs"].as_array().map(Vec::len)), (200, Some(0)), "{}", answer.body);
    let worker = server.get("/svc/v1/workers/w-1");
    assert_eq!(worker.status, 200, "the decoded worker id was recorded: {}", worker.body);
    for n in 0..120 {
        server.enqueue(json!({"type": "t", "args": [n]}));
    }
    assert_eq!(server.fetch(&["default"], 1000).len(), 100, "count is clamped to 100");
}

#[test]
fn ack_completes_and_reports() {
    let (_dir, server) = server();
    let id = server.enqueue(json!({"type": "t", "args": []}));
    server.post("/svc/v1/workers/fetch", json!({"queues": ["default"], "worker_id": "w-1"}));
    let wrong = server.post("/svc/v1/workers/ack", json!({"job_id": id, "worker_id": "w-2"}));
    assert_eq!((wrong.status, wrong.body["error"]["details"]["reason"].as_str()), (409, Some("not_owner")));
    let answer = server.post("/svc/v1/workers/ack", json!({"job_id": id, "worker_id": "w-1", "result": {"n": 1.0}}));
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!((answer.body["acknowledged"].as_bool(), answer.body["state"].as_str()), (Some(true), Some("completed")));
    assert_eq!(answer.body["id"], id.as_str());
    assert!(answer.body["completed_at"].is_string());
    let job = server.job(&id);
    assert_eq!((job["state"].as_str(), job["result"]["n"].as_f64()), (Some("completed"), Some(1.0)));
    let again = server.post("/svc/v1/workers/ack", json!({"job_id": id}));
    assert_eq!((again.status, again.error_code()), (409, "conflict"));
    assert_eq!(again.body["error"]["details"]["current_state"], "completed");
    assert_eq!(again.body["error"]["details"]["expected_state"], "active");
}

#[test]
fn ack_errors() {
    let (_dir, server) = server();
    let id = server.enqueue(json!({"type": "t", "args": []}));
    let answer = server.post("/svc/v1/workers/ack", json!({"job_id": id}));
    assert_eq!((answer.status, answer.error_code()), (409, "conflict"), "available job");
    let answer = server.post("/svc/v1/workers/ack", json!({}));
    assert_eq!((answer.status, answer.error_code()), (400, "invalid_request"));
    let answer = server.post("/svc/v1/workers/ack", json!({"job_id": "019539a4-0000-7000-8000-000000000000"}));
    assert_eq!((answer.status, answer.error_code()), (404, "not_found"));
    server.fetch(&["default"], 1);
    let big = format!(r#"{{"job_id":"{id}","result":"{}"}}"#, "x".repeat(1024 * 1024 + 10));
    let answer = server.post_raw("/svc/v1/workers/ack", big, Some("application/svc+json"));
    assert_eq!((answer.status, answer.error_code()), (413, "envelope_too_large"));
    assert_eq!(server.job(&id)["state"], "active", "an oversized result leaves the job active");
}

#[test]
fn nack_follows_the_retry_policy() {
    let (_dir, server) = server();
    let retry = json!({"max_attempts": 2, "initial_interval": "PT10S", "jitter": false});
    let id = server.enqueue(json!({"type": "t", "args": [], "options": {"retry": retry}}));
    server.fetch(&["default"], 1);
    let answer = server
        .post("/svc/v1/workers/nack", json!({"job_id": id, "error": {"code": "handler_error", "message": "boom"}}));
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        (answer.body["state"].as_str(), answer.body["retry_delay_ms"].as_i64()),
        (Some("retryable"), Some(10_000))
    );
    assert!(answer.body["retry_at"].is_string() && answer.body["next_attempt_at"] == answer.body["retry_at"]);
    let job = server.job(&id);
    assert_eq!(job["error"], json!({"type": "handler_error", "code": "handler_error", "message": "boom"}));
    assert_eq!(job["errors"][0]["attempt"], 1);
    assert!(job.get("completed_at").is_none());
}

#[test]
fn nack_discards_when_exhausted_or_not_retryable() {
    let (_dir, server) = server();
    let exhausted = server.enqueue(json!({"type": "t", "args": [], "options": {"retry": {"max_attempts": 1}}}));
    server.fetch(&["default"], 1);
    let answer =
        server.post("/svc/v1/workers/nack", json!({"job_id": exhausted, "error": {"type": "E", "message": "m"}}));
    assert_eq!(answer.body["state"], "discarded");
    assert!(answer.body["completed_at"].is_string() && answer.body["discarded_at"].is_string());

    let fatal = server
        .enqueue(json!({"type": "t", "args": [], "options": {"retry": {"non_retryable_errors": ["validation.*"]}}}));
    server.fetch(&["default"], 1);
    let answer = server
        .post("/svc/v1/workers/nack", json!({"job_id": fatal, "error": {"type": "validation.Bad", "message": "m"}}));
    assert_eq!(answer.body["state"], "discarded");

    let flagged = server.enqueue(json!({"type": "t", "args": []}));
    server.fetch(&["default"], 1);
    let answer = server.post(
        "/svc/v1/workers/nack",
        json!({"job_id": flagged, "error": {"type": "E", "message": "m", "retryable": false}}),
    );
    assert_eq!(answer.body["state"], "discarded");
}

#[test]
fn nack_with_requeue_releases_the_claim() {
    let (_dir, server) = server();
    let id = server.enqueue(json!({"type": "t", "args": []}));
    server.fetch(&["default"], 1);
    let answer = server.post(
        "/svc/v1/workers/nack",
        json!({"job_id": id, "requeue": true, "error": {"type": "Shutdown", "message": "m"}}),
    );
    assert_eq!((answer.body["state"].as_str(), answer.body["attempt"].as_i64()), (Some("available"), Some(0)));
    assert_eq!(server.fetch(&["default"], 1)[0]["attempt"], 1);
}

#[test]
fn nack_errors() {
    let (_dir, server) = server();
    let id = server.enqueue(json!({"type": "t", "args": []}));
    server.fetch(&["default"], 1);
    for body in [
        json!({"job_id": id}),
        json!({"job_id": id, "error": {"message": "m"}}),
        json!({"job_id": id, "error": {"type": "E"}}),
        json!({"job_id": id, "error": {"type": "E", "message": "m"}, "requeue": "yes"}),
        json!({"job_id": id, "error": {"type": "E", "message": "m"}, "requeue": 1}),
        json!({"job_id": 5, "error": {"type": "E", "message": "m"}}),
        json!({"job_id": id, "error": "boom"}),
    ] {
        let answer = server.post("/svc/v1/workers/nack", body.clone());
        assert_eq!((answer.status, answer.error_code()), (400, "invalid_request"), "{body}");
    }
    // A number JSON allows but no double holds, inside the report.
    for body in [
        format!(r#"{{"job_id":"{id}","error":{{"type":"E","message":"m","details":{{"n":1e400}}}}}}"#),
        format!(r#"{{"job_id":"{id}","error":{{"type":"E","message":"m"}},"requeue":1e400}}"#),
    ] {
        let answer = server.post_raw("/svc/v1/workers/nack", body.clone(), Some("application/svc+json"));
        assert_eq!((answer.status, answer.error_code()), (400, "invalid_request"), "{body}");
    }
    assert_eq!(server.job(&id)["state"], "active");
}

#[test]
fn retryable_jobs_come_back_without_polling() {
    let (_dir, server) = server();
    let id = server.enqueue(
        json!({"type": "t", "args": [], "options": {"retry": {"initial_interval": "PT0.2S", "jitter": false}}}),
    );
    server.fetch(&["default"], 1);
    server.post("/svc/v1/workers/nack", json!({"job_id": id, "error": {"type": "E", "message": "m"}}));
    assert_eq!(server.job(&id)["state"], "retryable");
    // Reads never change state, so the job turning available proves the
    // engine's own timer promoted it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.job(&id)["state"] != "available" {
        assert!(Instant::now() < deadline, "job was not promoted");
        std::thread::sleep(Duration::from_millis(20));
    }
    let job = server.job(&id);
    assert!(job.get("retry_at").is_none());
    assert_eq!(job["retry_delay_ms"], 200);
    assert_eq!(server.fetch(&["default"], 1)[0]["attempt"], 2);
}

#[test]
fn second_spelling_of_worker_routes() {
    let (_dir, server) = server();
    let id = server.enqueue(json!({"type": "t", "args": []}));
    let answer = server.post("/svc/v1/jobs/fetch", json!({"queues": ["default"]}));
    assert_eq!(answer.body["jobs"][0]["id"], id.as_str());
    let answer = server.post_raw(
        &format!("/svc/v1/jobs/{id}/fail"),
        json!({"job_id": "019539a4-0000-7000-8000-000000000000", "error": {"type": "E", "message": "m"}}).to_string(),
        Some("application/svc+json"),
    );
    assert_eq!((answer.status, answer.error_code()), (400, "invalid_request"), "differing job_id");
    let answer = server
        .post(&format!("/svc/v1/jobs/{id}/fail"), json!({"error": {"type": "E", "message": "m"}, "requeue": true}));
    assert_eq!(answer.body["state"], "available");
    server.post("/svc/v1/jobs/fetch", json!({"queues": ["default"]}));
    let answer = server.post_raw(&format!("/svc/v1/jobs/{id}/ack"), "", None);
    assert_eq!((answer.status, answer.body["state"].as_str()), (200, Some("completed")), "{}", answer.body);
}

#[test]
fn cancel_from_each_state() {
    let (_dir, server) = server();
    let available = server.enqueue(json!({"type": "t", "args": []}));
    let answer = server.delete(&format!("/svc/v1/jobs/{available}"));
    assert_eq!((answer.status, answer.body["job"]["state"].as_str()), (200, Some("cancelled")));
    assert_eq!(answer.body["job"]["previous_state"], "available");
    assert!(answer.body["job"]["cancelled_at"].is_string());
    let again = server.delete(&format!("/svc/v1/jobs/{available}"));
    assert_eq!((again.status, again.body["job"]["state"].as_str()), (200, Some("cancelled")), "idempotent");

    let active = server.enqueue(json!({"type": "t", "args": []}));
    server.fetch(&["default"], 1);
    assert_eq!(server.delete(&format!("/svc/v1/jobs/{active}")).body["job"]["previous_state"], "active");
    let late_ack = server.post("/svc/v1/workers/ack", json!({"job_id": active}));
    assert_eq!(late_ack.status, 409, "the claim was dropped");

    let scheduled =
        server.enqueue(json!({"type": "t", "args": [], "options": {"delay_until": "2099-12-31T23:59:59Z"}}));
    assert_eq!(server.job(&scheduled)["state"], "scheduled");
    assert_eq!(server.job(&scheduled)["scheduled_at"], "2099-12-31T23:59:59Z");
    assert_eq!(server.delete(&format!("/svc/v1/jobs/{scheduled}")).body["job"]["state"], "cancelled");

    let done = server.enqueue(json!({"type": "t", "args": []}));
    server.fetch(&["default"], 1);
    server.post("/svc/v1/workers/ack", json!({"job_id": done}));
    let answer = server.delete(&format!("/svc/v1/jobs/{done}"));
    assert_eq!((answer.status, answer.error_code()), (409, "conflict"));
    assert_eq!(answer.body["error"]["details"]["current_state"], "completed");
    assert_eq!(server.delete("/svc/v1/jobs/019539a4-0000-7000-8000-000000000000").status, 404);
}

/// Docs/api.md, "Which times a job carries": the times of a job in each
/// state, live and after a restart.
#[test]
fn each_state_carries_its_own_times() {
    const TIMES: [&str; 8] = [
        "created_at",
        "scheduled_at",
        "enqueued_at",
        "started_at",
        "completed_at",
        "cancelled_at",
        "discarded_at",
        "retry_at",
    ];
    let dir = tempfile::tempdir().unwrap();
    let clock = svc::clock::ManualClock::new(1_800_000_000_000);
    let server = TestServer::start_at(dir.path(), &clock);
    let in_queue = |queue: &str, options: Value| {
        let mut options = options;
        options["queue"] = json!(queue);
        server.enqueue(json!({"type": "t", "args": [], "options": options}))
    };
    let claim = |queue: &str| server.fetch(&[queue], 1)[0]["id"].as_str().unwrap().to_string();
    let fail =
        |id: &str| server.post("/svc/v1/workers/nack", json!({"job_id": id, "error": {"type": "E", "message": "m"}}));

    let expired = in_queue("expired", json!({"pending": true, "expires_at": "2027-01-15T08:00:01Z"}));
    server.advance(&clock, 2_000);
    let pending = in_queue("pending", json!({"pending": true}));
    let scheduled = in_queue("scheduled", json!({"scheduled_at": "2027-01-16T00:00:00Z"}));
    let available = in_queue("available", json!({}));
    let active = in_queue("active", json!({}));
    claim("active");
    let retryable = in_queue("retryable", json!({}));
    claim("retryable");
    assert_eq!(fail(&retryable).body["state"], "retryable");
    let completed = in_queue("completed", json!({}));
    claim("completed");
    assert_eq!(server.post("/svc/v1/workers/ack", json!({"job_id": completed})).status, 200);
    let discarded = in_queue("discarded", json!({"retry": {"max_attempts": 1}}));
    claim("discarded");
    assert_eq!(fail(&discarded).body["state"], "discarded");
    let cancelled_waiting = in_queue("cancelled", json!({}));
    let cancelled_active = in_queue("cancelled-active", json!({}));
    claim("cancelled-active");
    for id in [&cancelled_waiting, &cancelled_active] {
        assert_eq!(server.delete(&format!("/svc/v1/jobs/{id}")).status, 200);
    }

    let expected: [(&str, &str, &[&str]); 10] = [
        (&pending, "pending", &["created_at"]),
        (&scheduled, "scheduled", &["created_at", "scheduled_at"]),
        (&available, "available", &["created_at", "enqueued_at"]),
        (&active, "active", &["created_at", "enqueued_at", "started_at"]),
        (&retryable, "retryable", &["created_at", "enqueued_at", "started_at", "retry_at"]),
        (&completed, "completed", &["created_at", "enqueued_at", "started_at", "completed_at"]),
        (&discarded, "discarded", &["created_at", "enqueued_at", "started_at", "completed_at", "discarded_at"]),
        (&expired, "discarded", &["created_at", "discarded_at"]),
        (&cancelled_waiting, "cancelled", &["created_at", "enqueued_at", "cancelled_at"]),
        (&cancelled_active, "cancelled", &["created_at", "enqueued_at", "started_at", "cancelled_at"]),
    ];
    let check = |server: &TestServer| {
        for (id, state, times) in &expected {
            let job = server.job(id);
            assert_eq!(job["state"], *state, "{job}");
            let shown: Vec<&str> = TIMES.into_iter().filter(|time| job.get(*time).is_some()).collect();
            assert_eq!(shown, *times, "{state}: {job}");
        }
    };
    check(&server);
    let discarded = server.job(&discarded);
    assert_eq!(discarded["completed_at"], discarded["discarded_at"], "the failure that discarded it ended the attempt");
    server.stop();
    check(&TestServer::start_at(dir.path(), &clock));
}

#[test]
fn batch_enqueue_is_atomic() {
    let (_dir, server) = server();
    let answer = server.post(
        "/svc/v1/jobs/batch",
        json!({"jobs": [{"type": "a", "args": [1]}, {"type": "b", "args": [2], "options": {"queue": "other"}}]}),
    );
    assert_eq!((answer.status, answer.body["count"].as_i64()), (201, Some(2)), "{}", answer.body);
    assert_eq!(answer.body["jobs"][1]["queue"], "other");
    let answer =
        server.post("/svc/v1/jobs/batch", json!({"jobs": [{"type": "a", "args": [1]}, {"type": "b", "args": "no"}]}));
    assert_eq!((answer.status, answer.error_code()), (400, "invalid_payload"));
    assert_eq!(answer.body["error"]["details"]["index"], 1);
    assert_eq!(answer.body["error"]["details"]["field"], "jobs[1].args");
    let id = "019539a4-aaaa-7000-8000-222222222222";
    let answer = server.post(
        "/svc/v1/jobs/batch",
        json!({"jobs": [{"type": "a", "args": [], "id": id}, {"type": "a", "args": [], "id": id}]}),
    );
    assert_eq!((answer.status, answer.error_code()), (409, "duplicate"));
    assert_eq!(server.get(&format!("/svc/v1/jobs/{id}")).status, 404, "nothing of a refused batch is stored");
    let total: i64 = server.get("/svc/v1/queues").body["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|queue| queue["size"].as_i64().unwrap())
        .sum();
    assert_eq!(total, 2);
    for body in [json!({}), json!({"jobs": []}), json!({"jobs": "x"})] {
        assert_eq!(server.post("/svc/v1/jobs/batch", body).status, 400);
    }
}

#[test]
fn queue_listing_counts_and_pages() {
    let (_dir, server) = server();
    for queue in ["alpha", "beta", "gamma"] {
        server.enqueue(json!({"type": "t", "args": [], "options": {"queue": queue}}));
    }
    server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "beta"}}));
    let all = server.get("/svc/v1/queues");
    let names: Vec<&str> =
        all.body["queues"].as_array().unwrap().iter().map(|queue| queue["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["alpha", "beta", "default", "gamma"]);
    assert_eq!(all.body["queues"][1], json!({"name": "beta", "size": 2, "paused": false}));
    assert_eq!((all.body["has_more"].as_bool(), all.body["cursor"].is_null()), (Some(false), true));

    let first = server.get("/svc/v1/queues?limit=3");
    assert_eq!((first.body["queues"].as_array().unwrap().len(), first.body["has_more"].as_bool()), (3, Some(true)));
    let cursor = first.body["cursor"].as_str().unwrap();
    let second = server.get(&format!("/svc/v1/queues?limit=3&cursor={cursor}"));
    assert_eq!(second.body["queues"][0]["name"], "gamma");
    assert_eq!(second.body["has_more"], false);
    for query in ["limit=0", "limit=x", "cursor=!!!"] {
        assert_eq!(server.get(&format!("/svc/v1/queues?{query}")).status, 400, "{query}");
    }
}

#[test]
fn events_record_the_lifecycle() {
    let (_dir, server) = server();
    let id = server
        .enqueue(json!({"type": "mail.send", "args": [], "meta": {"trace_id": "tr-9"}, "options": {"queue": "mail"}}));
    server.fetch(&["mail"], 1);
    server.post("/svc/v1/workers/ack", json!({"job_id": id, "result": {"ok": true}}));
    let answer = server.get("/svc/v1/events?queues=mail");
    let types: Vec<&str> =
        answer.body["events"].as_array().unwrap().iter().map(|event| event["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["job.enqueued", "job.started", "job.completed"]);
    let completed = &answer.body["events"][2];
    assert_eq!(
        (completed["subject"].as_str(), completed["data"]["trace_id"].as_str()),
        (Some(id.as_str()), Some("tr-9"))
    );
    assert!(completed["id"].as_str().unwrap().starts_with("evt_"));
    assert!(completed["data"]["duration_ms"].is_i64() && completed["data"]["result"]["ok"] == true);
    let filtered = server.get("/svc/v1/events?types=job.*&job_types=mail.*&limit=1");
    assert_eq!(filtered.body["events"].as_array().unwrap().len(), 1);
    assert_eq!(filtered.body["has_more"], true);
    let cursor = filtered.body["cursor"].as_str().unwrap();
    let next = server.get(&format!("/svc/v1/events?types=job.*&after={cursor}"));
    assert_eq!(next.body["events"][0]["type"], "job.started");
    let none = server.get("/svc/v1/events?types=job.enqueued&queues=other");
    assert_eq!(none.body["events"], json!([]));
}

#[test]
fn failure_events_carry_their_data() {
    let dir = tempfile::tempdir().unwrap();
    let clock = svc::clock::ManualClock::new(1_800_000_000_000);
    let server = TestServer::start_at(dir.path(), &clock);
    let retry = json!({"max_attempts": 2, "initial_interval": "PT10S", "jitter": false});
    let id = server.enqueue(json!({"type": "t", "args": [], "options": {"retry": retry, "queue": "q"}}));
    for attempt in 1..=2 {
        server.fetch(&["q"], 1);
        clock.advance_ms(250);
        let error = json!({"code": "handler_error", "message": format!("boom {attempt}")});
        assert_eq!(server.post("/svc/v1/workers/nack", json!({"job_id": id, "error": error})).status, 200);
        server.advance(&clock, 10_000);
    }
    let events = server.get("/svc/v1/events?queues=q").body["events"].clone();
    let data_of = |kind: &str| {
        // The last of its kind (each failed attempt has a `job.failed`).
        let event = events.as_array().unwrap().iter().rev().find(|event| event["type"] == kind).unwrap().clone();
        assert_eq!(event["specversion"], "1.0");
        assert_eq!(event["source"], "svc://svc/api");
        assert_eq!(event["datacontenttype"], "application/json");
        assert_eq!(event["subject"], id.as_str());
        event["data"].clone()
    };
    let common = json!({"job_id": id, "job_type": "t", "queue": "q"});
    let with = |fields: Value| {
        let mut data = common.clone();
        data.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        data
    };
    let first = json!({"type": "handler_error", "code": "handler_error", "message": "boom 1"});
    assert_eq!(
        data_of("job.retrying"),
        with(json!({"attempt": 1, "max_attempts": 2, "next_retry_at": "2027-01-15T08:00:10.250Z",
            "retry_delay_ms": 10_000, "error": first}))
    );
    let last = json!({"type": "handler_error", "code": "handler_error", "message": "boom 2"});
    let mut failed_error = last.clone();
    failed_error["retryable"] = true.into();
    let failed = data_of("job.failed");
    assert_eq!(failed, with(json!({"attempt": 2, "error": failed_error, "duration_ms": 250})));
    assert_eq!(data_of("job.discarded"), with(json!({"total_attempts": 2, "reason": "exhausted", "last_error": last})));
}

#[test]
fn health_manifest_and_error_catalogue() {
    let (_dir, server) = server();
    let health = server.get("/svc/v1/health");
    assert_eq!((health.status, health.body["status"].as_str()), (200, Some("ok")));
    assert_eq!(health.body["backend"]["type"], "wal");
    assert!(health.body["uptime_seconds"].is_u64() && health.body["backend"]["latency_ms"].is_u64());
    assert_eq!(server.get("/health").status, 200);
    assert_eq!(server.get("/ready").body["status"], "ready");
    let manifest = server.get("/svc/manifest");
    assert_eq!(
        (manifest.body["specversion"].as_str(), manifest.body["implementation"].as_str()),
        (Some("1.0.0-rc.1"), Some("svc"))
    );
    assert_eq!(manifest.body["conformance_level"], 4);
    assert_eq!(manifest.body["features"]["cron"], true);
    let features = &manifest.body["features"];
    assert_eq!(
        (&features["unique_jobs"], &features["rate_limiting"], &features["workflows"], &features["schemas"]),
        (&json!(true), &json!(true), &json!(true), &json!(true))
    );
    let catalogue = server.get("/svc/v1/errors");
    let codes: Vec<&str> =
        catalogue.body["errors"].as_array().unwrap().iter().map(|row| row["code"].as_str().unwrap()).collect();
    assert!(codes.contains(&"envelope_too_large") && codes.contains(&"backend_error"));
}

#[test]
fn state_survives_a_clean_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let kept = server.enqueue(json!({"type": "t", "args": ["kept"], "options": {"priority": 5}}));
    let done = server.enqueue(json!({"type": "t", "args": []}));
    let claimed = server.fetch(&["default"], 2);
    assert_eq!(claimed[0]["id"], kept.as_str());
    server.post("/svc/v1/workers/ack", json!({"job_id": done}));
    server.stop();
    let server = TestServer::start(dir.path());
    assert_eq!(server.job(&kept)["state"], "active");
    assert_eq!(server.job(&done)["state"], "completed");
    assert!(server.fetch(&["default"], 10).is_empty(), "a completed job is never handed out again");
}

#[test]
fn heartbeat_extends_and_reports() {
    let (_dir, server) = server();
    let id = server.enqueue(json!({"type": "t", "args": []}));
    server.post(
        "/svc/v1/workers/fetch",
        json!({"queues": ["default"], "worker_id": "w-1", "visibility_timeout_ms": 5000}),
    );
    let before = server.job(&id)["started_at"].clone();
    let answer = server.post(
        "/svc/v1/workers/heartbeat",
        json!({"worker_id": "w-1", "active_jobs": [id, "not-an-id"], "visibility_timeout_ms": 60000}),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!((answer.body["state"].as_str(), answer.body["jobs_extended"].as_i64()), (Some("running"), Some(1)));
    assert!(answer.body["server_time"].as_str().is_some_and(|time| time.parse::<jiff::Timestamp>().is_ok()));
    assert_eq!(server.job(&id)["started_at"], before, "a heartbeat changes no state");
    let count = server.post("/svc/v1/workers/heartbeat", json!({"worker_id": "w-1", "active_jobs": 3}));
    assert_eq!(count.body["jobs_extended"], 0, "a bare count extends nothing");
    let unknown = server.post("/svc/v1/workers/heartbeat", json!({"worker_id": "w-new"}));
    assert_eq!((unknown.status, unknown.body["jobs_extended"].as_i64()), (200, Some(0)));
    for body in [
        json!({}),
        json!({"worker_id": "bad id"}),
        json!({"worker_id": "w-1", "active_jobs": "x"}),
        json!({"worker_id": "w-1", "active_jobs": [1]}),
        json!({"worker_id": "w-1", "active_jobs": -1}),
        json!({"worker_id": "w-1", "active_jobs": 1.5}),
        json!({"worker_id": "w-1", "active_jobs": {"id": id}}),
        json!({"worker_id": "w-1", "visibility_timeout_ms": 0}),
    ] {
        let answer = server.post("/svc/v1/workers/heartbeat", body.clone());
        assert_eq!((answer.status, answer.error_code()), (400, "invalid_request"), "{body}");
    }
}
