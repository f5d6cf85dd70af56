//! The dead letter listing over HTTP: what fails for good is listed newest
//! first, can be paged and filtered, retried, or removed — durably.

mod common;

use common::TestServer;
use serde_json::{Value, json};

/// Enqueues a job with one attempt, claims it and fails it: it is discarded.
fn discard(server: &TestServer, queue: &str, label: &str) -> String {
    let id = server
        .enqueue(json!({"type": "t", "args": [label], "options": {"queue": queue, "retry": {"max_attempts": 1}}}));
    let claimed = server.fetch(&[queue], 1);
    assert_eq!(claimed[0]["id"], id.as_str());
    let answer =
        server.post("/svc/v1/workers/nack", json!({"job_id": id, "error": {"type": "Boom", "message": label}}));
    assert_eq!(answer.body["state"], "discarded");
    id
}

fn listed(answer: &common::Answer) -> Vec<String> {
    answer.body["jobs"].as_array().unwrap().iter().map(|job| job["id"].as_str().unwrap().to_string()).collect()
}

#[test]
fn discarded_jobs_are_listed_newest_first_with_paging_and_a_queue_filter() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let first = discard(&server, "mail", "first");
    std::thread::sleep(std::time::Duration::from_millis(2));
    let second = discard(&server, "reports", "second");
    std::thread::sleep(std::time::Duration::from_millis(2));
    let third = discard(&server, "mail", "third");
    server.enqueue(json!({"type": "t", "args": ["alive"], "options": {"queue": "mail"}}));

    let all = server.get("/svc/v1/dead-letter");
    assert_eq!(all.status, 200);
    assert_eq!(listed(&all), [third.clone(), second.clone(), first.clone()]);
    assert_eq!((all.body["cursor"].clone(), all.body["has_more"].clone()), (Value::Null, json!(false)));
    let job = &all.body["jobs"][0];
    assert_eq!((job["state"].as_str(), job["attempt"].as_i64()), (Some("discarded"), Some(1)));
    assert_eq!(job["error"]["message"], "third");

    let page = server.get("/svc/v1/dead-letter?limit=2");
    assert_eq!((listed(&page), page.body["has_more"].as_bool()), (vec![third.clone(), second.clone()], Some(true)));
    let cursor = page.body["cursor"].as_str().unwrap();
    let rest = server.get(&format!("/svc/v1/dead-letter?limit=2&cursor={cursor}"));
    assert_eq!((listed(&rest), rest.body["has_more"].as_bool()), (vec![first.clone()], Some(false)));

    assert_eq!(listed(&server.get("/svc/v1/dead-letter?queue=mail")), [third, first]);
    assert_eq!(listed(&server.get("/svc/v1/dead-letter?queue=nothing")), Vec::<String>::new());
    for query in ["limit=0", "limit=abc", "cursor=%21%21", "queue=Bad%20Queue"] {
        let answer = server.get(&format!("/svc/v1/dead-letter?{query}"));
        assert_eq!((answer.status, answer.error_code()), (400, "invalid_request"), "{query}");
    }
}

#[test]
fn retry_makes_a_discarded_job_runnable_again() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let id = discard(&server, "default", "once");
    let answer = server.post_raw(&format!("/svc/v1/dead-letter/{id}/retry"), "", None);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let job = &answer.body["job"];
    assert_eq!((job["state"].as_str(), job["attempt"].as_i64()), (Some("available"), Some(0)));
    assert!(job.get("error").is_none() && job.get("discarded_at").is_none() && job.get("completed_at").is_none());
    assert_eq!(job["errors"].as_array().unwrap().len(), 1, "the history is kept");
    assert_eq!(listed(&server.get("/svc/v1/dead-letter")), Vec::<String>::new());
    let claimed = server.fetch(&["default"], 1);
    assert_eq!((claimed[0]["id"].as_str(), claimed[0]["attempt"].as_i64()), (Some(id.as_str()), Some(1)));
    let events = server.get(&format!("/svc/v1/events?types=job.enqueued&subject={id}"));
    assert_eq!(events.body["events"][1]["data"]["reason"], "dead_letter_retry");

    let again = server.post(&format!("/svc/v1/dead-letter/{id}/retry"), json!({}));
    assert_eq!((again.status, again.error_code()), (404, "not_found"), "an active job is not in the listing");
    assert_eq!(again.body["error"]["details"]["resource_type"], "dead_letter_job");
    assert_eq!(server.post("/svc/v1/dead-letter/019539a4-0000-7000-8000-000000000000/retry", json!({})).status, 404);
    assert_eq!(server.post("/svc/v1/dead-letter/nonsense/retry", json!({})).status, 404);
}

#[test]
fn delete_removes_a_discarded_job_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let gone = discard(&server, "default", "gone");
    let kept = discard(&server, "default", "kept");
    let answer = server.delete(&format!("/svc/v1/dead-letter/{gone}"));
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, json!({"deleted": true, "job_id": gone}));
    assert_eq!(server.get(&format!("/svc/v1/jobs/{gone}")).status, 404);
    assert_eq!(listed(&server.get("/svc/v1/dead-letter")), std::slice::from_ref(&kept));
    assert_eq!(server.delete(&format!("/svc/v1/dead-letter/{gone}")).status, 404);
    let alive = server.enqueue(json!({"type": "t", "args": []}));
    assert_eq!(server.delete(&format!("/svc/v1/dead-letter/{alive}")).status, 404, "only discarded jobs");
    let deleted = server.get(&format!("/svc/v1/events?types=job.deleted&subject={gone}"));
    assert_eq!(deleted.body["events"][0]["data"]["previous_state"], "discarded");

    server.stop();
    let server = TestServer::start(dir.path());
    assert_eq!(server.get(&format!("/svc/v1/jobs/{gone}")).status, 404, "the deletion is durable");
    assert_eq!(listed(&server.get("/svc/v1/dead-letter")), [kept], "the listing is rebuilt at start");
}

/// The job's fields, of those a run gathers, that `job` shows.
fn run_fields(job: &Value) -> Vec<&'static str> {
    let fields = [
        "started_at",
        "worker_id",
        "completed_at",
        "cancelled_at",
        "discarded_at",
        "retry_at",
        "retry_delay_ms",
        "error",
        "result",
        "expires_at",
    ];
    fields.into_iter().filter(|field| job.get(*field).is_some()).collect()
}

#[test]
fn a_revived_job_starts_a_fresh_run_keeping_only_its_error_history() {
    const START: i64 = 1_800_000_000_000;
    let dir = tempfile::tempdir().unwrap();
    let clock = svc::clock::ManualClock::new(START);
    let server = TestServer::start_at(dir.path(), &clock);
    let expires = "2027-01-16T00:00:00.000Z";
    let id = server.enqueue(json!({"type": "t", "args": [], "options": {"retry": {"max_attempts": 2, "jitter": false}, "expires_at": expires}}));
    let fetch = json!({"queues": ["default"], "worker_id": "w-1"});
    let fail = json!({"job_id": id, "error": {"type": "Boom", "message": "no"}});
    for _ in 0..2 {
        assert_eq!(server.post("/svc/v1/workers/fetch", fetch.clone()).body["jobs"][0]["id"], id.as_str());
        assert_eq!(server.post("/svc/v1/workers/nack", fail.clone()).status, 200);
        server.advance(&clock, 1_000);
    }
    let discarded = server.job(&id);
    assert_eq!(discarded["state"], "discarded");
    assert_eq!(
        run_fields(&discarded),
        ["started_at", "worker_id", "completed_at", "discarded_at", "retry_delay_ms", "error", "expires_at"],
        "{discarded}"
    );

    server.advance(&clock, 5_000);
    let revived = server.post(&format!("/svc/v1/dead-letter/{id}/retry"), json!({}));
    assert_eq!(revived.status, 200, "{}", revived.body);
    for job in [revived.body["job"].clone(), server.job(&id)] {
        assert_eq!((job["state"].as_str(), job["attempt"].as_i64()), (Some("available"), Some(0)));
        assert_eq!(run_fields(&job), Vec::<&str>::new(), "nothing of the old run: {job}");
        assert_eq!(job["enqueued_at"], "2027-01-15T08:00:07Z");
        assert_eq!(job["errors"].as_array().unwrap().len(), 2, "the history stays");
    }

    // Replay gives the same job.
    server.stop();
    let server = TestServer::start_at(dir.path(), &clock);
    assert_eq!(run_fields(&server.job(&id)), Vec::<&str>::new());
    server.advance(&clock, 1_000);
    let claimed = server.post("/svc/v1/workers/fetch", json!({"queues": ["default"], "worker_id": "w-2"}));
    let job = &claimed.body["jobs"][0];
    assert_eq!((job["attempt"].as_i64(), job["started_at"].as_str()), (Some(1), Some("2027-01-15T08:00:08Z")));
    assert_eq!(run_fields(job), ["started_at", "worker_id"], "{job}");
}
