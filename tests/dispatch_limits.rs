//! Dispatch limits (docs/api.md, "Dispatch limits"): concurrency per key,
//! sliding rate windows on a manual clock, keys independent of each other
//! and of unlimited jobs, different rates under one key, claims without a
//! rate counting toward none within a fetch, the window kept across a
//! restart, and a long-poll fetch answered when a window opens. The
//! concurrency cap runs on the PostgreSQL backend too (its windows:
//! tests/postgres_dispatch.rs).

mod common;

use common::PostgresNode;
use common::TestServer;
use serde_json::{Value, json};
use svc::clock::ManualClock;
use svc::engine::FetchRequest;

const START: i64 = 1_800_000_000_000;

fn limited(queue: &str, n: u64, limit: Value) -> Value {
    json!({"type": "report.build", "args": [n], "options": {"queue": queue, "rate_limit": limit, "visibility_timeout_ms": 600_000, "timeout_ms": 600_000}})
}

fn ids(jobs: &[Value]) -> Vec<String> {
    jobs.iter().map(|job| job["id"].as_str().unwrap().to_string()).collect()
}

#[test]
fn concurrency_caps_active_jobs_per_key() {
    let dir = tempfile::tempdir().unwrap();
    check_concurrency_caps_active_jobs_per_key(&TestServer::start(dir.path()));
}

#[test]
fn on_postgres_concurrency_caps_active_jobs_per_key() {
    check_concurrency_caps_active_jobs_per_key(&PostgresNode::start("limits"));
}

fn check_concurrency_caps_active_jobs_per_key(server: &TestServer) {
    let two = json!({"key": "reports", "concurrency": 2});
    let jobs: Vec<String> = (0..3).map(|n| server.enqueue(limited("q", n, two.clone()))).collect();
    let plain = server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "q", "priority": -1}}));
    let first = server.fetch(&["q"], 10);
    assert_eq!(ids(&first), [jobs[0].clone(), jobs[1].clone(), plain.clone()], "the third waits; others pass");
    assert!(server.fetch(&["q"], 10).is_empty());
    assert_eq!(server.job(&jobs[2])["state"], "available", "a held job stays available");
    assert_eq!(server.job(&jobs[2])["rate_limit"], json!({"key": "reports", "concurrency": 2, "on_limit": "wait"}));

    assert_eq!(server.post("/svc/v1/workers/ack", json!({"job_id": jobs[0]})).status, 200);
    assert_eq!(ids(&server.fetch(&["q"], 10)), [jobs[2].clone()]);

    // The key spans queues: a job in another queue under the same key waits too.
    let elsewhere = server.enqueue(limited("other", 9, two));
    assert!(server.fetch(&["other"], 10).is_empty());
    let failed =
        server.post("/svc/v1/workers/nack", json!({"job_id": jobs[1], "error": {"type": "E", "message": "m"}}));
    assert_eq!(failed.status, 200, "{}", failed.body);
    assert_eq!(ids(&server.fetch(&["other"], 10)), [elsewhere]);
}

#[test]
fn a_rate_is_a_sliding_window_and_keys_are_independent() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let server = TestServer::start_at(dir.path(), &clock);
    let two_per_minute = json!({"key": "api", "rate": 2, "period": "minute"});
    for n in 0..4 {
        server.enqueue(limited("q", n, two_per_minute.clone()));
    }
    let other = server.enqueue(limited("q", 9, json!({"key": "other", "max_per_second": 1})));
    assert_eq!(server.fetch(&["q"], 10).len(), 3, "two under `api`, one under `other`");
    server.advance(&clock, 30_000);
    assert!(server.fetch(&["q"], 10).is_empty());
    server.advance(&clock, 29_999);
    assert!(server.fetch(&["q"], 10).is_empty(), "both claims are still inside the window");
    server.advance(&clock, 1);
    assert_eq!(server.fetch(&["q"], 10).len(), 2, "the window moved past both claims");
    assert_eq!(server.job(&other)["state"], "active");
}

#[test]
fn max_per_second_spaces_claims_and_the_window_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let server = TestServer::start_at(dir.path(), &clock);
    for n in 0..3 {
        server.enqueue(limited("tick", n, json!({"max_per_second": 1})));
    }
    assert_eq!(server.fetch(&["tick"], 10).len(), 1);
    server.stop();

    let server = TestServer::start_at(dir.path(), &clock);
    server.advance(&clock, 500);
    assert!(server.fetch(&["tick"], 10).is_empty(), "the claim before the restart still counts");
    server.advance(&clock, 500);
    assert_eq!(server.fetch(&["tick"], 10).len(), 1);
    server.engine().snapshot().wait().unwrap();
    server.stop();

    let server = TestServer::start_at(dir.path(), &clock);
    assert!(server.fetch(&["tick"], 10).is_empty(), "and one kept by a snapshot");
    server.advance(&clock, 1000);
    assert_eq!(server.fetch(&["tick"], 10).len(), 1);
}

#[test]
fn a_smaller_rate_under_a_key_does_not_shorten_the_window_of_a_larger_one() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let server = TestServer::start_at(dir.path(), &clock);
    let three_an_hour = json!({"key": "k", "rate": 3, "period": "hour"});
    let one_a_second = json!({"key": "k", "max_per_second": 1});
    let hourly: Vec<String> = (0..2).map(|n| server.enqueue(limited("q", n, three_an_hour.clone()))).collect();
    let quick = server.enqueue(limited("q", 2, one_a_second));
    let last = server.enqueue(limited("q", 3, three_an_hour));
    assert_eq!(ids(&server.fetch(&["q"], 10)), hourly, "the per-second job waits, and the job behind it");
    server.advance(&clock, 2_000);
    assert_eq!(ids(&server.fetch(&["q"], 10)), [quick], "its second has passed; the hour holds three claims");
    server.advance(&clock, 2_000);
    assert!(server.fetch(&["q"], 10).is_empty(), "three claims in the hour, though the last one's rate was 1 a second");
    server.engine().snapshot().wait().unwrap();
    server.stop();

    let server = TestServer::start_at(dir.path(), &clock);
    server.advance(&clock, 2_000);
    assert!(server.fetch(&["q"], 10).is_empty(), "and after a restart from a snapshot");
    server.advance(&clock, 3_600_000 - 6_000);
    assert_eq!(ids(&server.fetch(&["q"], 10)), [last], "the first two claims left the hour");
}

/// Only claims of jobs with a rate count toward a rate, within one fetch as
/// across fetches: a fetch that hands out a concurrency-only job under the
/// key still hands out the rated job behind it.
#[test]
fn claims_of_jobs_without_a_rate_do_not_count_toward_a_rate_in_the_same_fetch() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let server = TestServer::start_at(dir.path(), &clock);
    let capped = json!({"key": "mixed", "concurrency": 5});
    let rated = json!({"key": "mixed", "concurrency": 5, "rate": 2, "period": "minute"});
    let jobs = [
        server.enqueue(limited("q", 0, capped.clone())),
        server.enqueue(limited("q", 1, rated.clone())),
        server.enqueue(limited("q", 2, capped)),
        server.enqueue(limited("q", 3, rated.clone())),
        server.enqueue(limited("q", 4, rated)),
    ];
    let one_fetch = ids(&server.fetch(&["q"], 10));
    assert_eq!(one_fetch, jobs[..4], "two rated claims fit the minute; the third rated job waits");
    assert_eq!(server.job(&jobs[4])["state"], "available");
    server.advance(&clock, 59_999);
    assert!(server.fetch(&["q"], 10).is_empty());
    server.advance(&clock, 1);
    assert_eq!(ids(&server.fetch(&["q"], 10)), [jobs[4].clone()]);
}

#[test]
fn a_long_poll_held_back_by_a_window_gets_the_job_when_it_opens() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let server = TestServer::start_at(dir.path(), &clock);
    server.enqueue(limited("lp", 0, json!({"max_per_second": 1})));
    let second = server.enqueue(limited("lp", 1, json!({"max_per_second": 1})));
    assert_eq!(server.fetch(&["lp"], 1).len(), 1);
    let handle = server.engine();
    let request = FetchRequest { queues: vec!["lp".into()], count: 1, worker_id: None, visibility_timeout_ms: None };
    let waiting = handle.fetch_waiting(request, 20_000);
    // Commands are taken in order: once the probe is answered, the fetch waits.
    handle.probe().wait().unwrap();
    clock.advance_ms(999);
    handle.probe().wait().unwrap();
    clock.advance_ms(1);
    handle.tick().wait().unwrap();
    let got: Vec<String> = waiting.wait().unwrap().iter().map(|job| job.id.to_string()).collect();
    assert_eq!(got, [second]);
}

#[test]
fn invalid_limits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    for (limit, field) in [
        (json!({}), "options.rate_limit"),
        (json!({"concurrency": 0}), "options.rate_limit.concurrency"),
        (json!({"rate": 5}), "options.rate_limit.period"),
        (json!({"rate": 5, "period": "day"}), "options.rate_limit.period"),
        (json!({"max_per_second": 2, "rate": 1, "period": "second"}), "options.rate_limit.max_per_second"),
        (json!({"concurrency": 1, "on_limit": "drop"}), "options.rate_limit.on_limit"),
        (json!({"concurrency": 1, "burst": 3}), "options.rate_limit.burst"),
        (json!({"concurrency": 1, "key": ""}), "options.rate_limit.key"),
    ] {
        let answer = server.post("/svc/v1/jobs", limited("q", 0, limit.clone()));
        assert_eq!((answer.status, answer.error_code()), (400, "invalid_payload"), "{limit}: {}", answer.body);
        assert_eq!(answer.body["error"]["details"]["field"], field, "{limit}");
    }
}
