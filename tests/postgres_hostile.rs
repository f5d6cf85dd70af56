//! Hostile requests against svc on PostgreSQL (a real PostgreSQL server of
//! the test's own): values PostgreSQL cannot store or index are refused with
//! a 4xx before they reach a statement, requests merged with them are not
//! failed by them, a large unique batch stays within the database's shared
//! lock table, and the settings' bound on cron entries holds.

mod common;

use common::postgres::TempPostgres;
use common::{PostgresNode, TestServer, http_client};
use serde_json::{Value, json};

/// A request from a thread of its own: (status, body).
fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let response = http_client()
        .post(format!("{base}{path}"))
        .header("content-type", "application/svc+json")
        .body(body.to_string())
        .send()
        .unwrap();
    (response.status().as_u16(), response.json().unwrap_or(Value::Null))
}

fn limited(key: &str) -> Value {
    json!({"type": "work", "args": [1], "options": {"rate_limit": {"key": key, "concurrency": 1}}})
}

#[test]
fn a_nul_in_a_rate_limit_key_is_refused_and_fails_no_request_beside_it() {
    let node = PostgresNode::start("hostile_keys");
    for key in ["\u{0}", "tenant\u{0}42", "line\nbreak"] {
        let answer = node.post("/svc/v1/jobs", limited(key));
        assert_eq!(answer.status, 400, "key {key:?}: {}", answer.body);
        assert!(answer.body.to_string().contains("options.rate_limit.key"), "{}", answer.body);
    }
    // In a workflow's callback, stored with the workflow and enqueued only
    // when its jobs end, the key is refused at creation too.
    let workflow = json!({"type": "batch", "jobs": [{"type": "work", "args": [1]}],
        "callbacks": {"on_failure": limited("\u{0}")}});
    let answer = node.post("/svc/v1/workflows", workflow);
    assert_eq!(answer.status, 400, "{}", answer.body);

    // Good and bad enqueues racing, so that they share merged statements:
    // every good one is stored, every bad one refused.
    let threads: Vec<_> = (0..40)
        .map(|i| {
            let base = node.base.clone();
            std::thread::spawn(move || {
                let body = if i % 2 == 0 { limited(&format!("tenant-{i}")) } else { limited("bad\u{0}") };
                (i, post(&base, "/svc/v1/jobs", &body))
            })
        })
        .collect();
    for thread in threads {
        let (i, (status, body)) = thread.join().unwrap();
        let expected = if i % 2 == 0 { 201 } else { 400 };
        assert_eq!(status, expected, "request {i}: {body}");
    }
}

#[test]
fn reads_of_names_no_one_can_hold_are_a_4xx() {
    let node = PostgresNode::start("hostile_reads");
    let cases = [
        ("GET", "/svc/v1/admin/jobs?type=a%00", 400),
        ("POST", "/svc/v1/admin/jobs/bulk/cancel", 400),
        ("GET", "/svc/v1/admin/queues?cursor=AA", 400),
        ("GET", "/svc/v1/workers?cursor=AA", 400),
        ("GET", "/svc/v1/cron?cursor=AA", 400),
        ("GET", "/svc/v1/schemas?cursor=AA", 400),
        ("GET", "/svc/v1/workers/a%00", 404),
        ("DELETE", "/svc/v1/workers/a%00", 404),
        ("POST", "/svc/v1/workers/a%00/quiet", 404),
    ];
    for (method, path, expected) in cases {
        let answer = match (method, path) {
            ("GET", _) => node.get(path),
            ("DELETE", _) => node.delete(path),
            (_, "/svc/v1/admin/jobs/bulk/cancel") => {
                node.post(path, json!({"filter": {"type": "a\u{0}"}, "confirm": true}))
            }
            _ => node.post(path, json!({})),
        };
        assert_eq!(answer.status, expected, "{method} {path}: {}", answer.body);
    }
    // A URI PostgreSQL's index could not hold (4 000 bytes in 1 004
    // characters) is refused, and one of 2 048 bytes is stored.
    let schema = |uri: String| json!({"uri": uri, "schema": {"type": "array"}});
    let answer = node.post("/svc/v1/schemas", schema(format!("urn:{}", "\u{1D11E}".repeat(1000))));
    assert_eq!(answer.status, 400, "{}", answer.body);
    let answer = node.post("/svc/v1/schemas", schema(format!("urn:{}", "\u{1D11E}".repeat(511))));
    assert_eq!(answer.status, 201, "{}", answer.body);
    assert_eq!(node.get("/svc/v1/health").status, 200);
}

#[test]
fn a_unique_batch_takes_a_bounded_share_of_the_database_lock_table() {
    // A lock table of 10 slots a connection (2 000 here, and the slack of
    // the shared memory): one advisory lock a fingerprint made a batch of
    // 10 000 unique jobs fail with "out of shared memory", and every request
    // merged with it too.
    let mut postgres = TempPostgres::start();
    postgres.psql("postgres", "ALTER SYSTEM SET max_locks_per_transaction = 10").unwrap();
    postgres.restart();
    let dir = tempfile::tempdir().unwrap();
    let node = TestServer::on_postgres(dir.path(), &postgres.database("hostile_unique"));
    let jobs: Vec<Value> =
        (0..10_000).map(|i| json!({"type": "work", "args": [i], "options": {"unique": {}}})).collect();
    let answer = node.post("/svc/v1/jobs/batch", json!({"jobs": jobs}));
    assert_eq!(answer.status, 201, "{}", answer.body.to_string().chars().take(300).collect::<String>());
    assert_eq!(answer.body["count"], 10_000);
    // The fingerprints hold: the same job again is refused.
    let again = json!({"type": "work", "args": [7], "options": {"unique": {}}});
    let answer = node.post("/svc/v1/jobs", again);
    assert_eq!(answer.status, 409, "{}", answer.body);
}

#[test]
fn the_settings_bound_on_cron_entries_holds_on_postgres() {
    // `limits.max_cron` from the settings file: PostgreSQL nodes took the
    // default (10 000) whatever it said.
    let postgres = TempPostgres::start();
    let dir = tempfile::tempdir().unwrap();
    let settings = dir.path().join("svc.toml");
    std::fs::write(&settings, "[limits]\nmax_cron = 2\n").unwrap();
    let url = postgres.database("hostile_cron");
    let env = [("SVC_POSTGRES_URL", url.as_str()), ("SVC_CONFIG", settings.to_str().unwrap())];
    let (process, base) = common::spawn_server_with_env(&dir.path().join("data"), &env);
    let node = TestServer { server: None, process: Some(process), base, client: http_client() };
    for name in ["first", "second"] {
        let answer = node.post("/svc/v1/cron", json!({"name": name, "type": "t", "cron": "*/5 * * * *"}));
        assert_eq!(answer.status, 201, "{}", answer.body);
    }
    let answer = node.post("/svc/v1/cron", json!({"name": "third", "type": "t", "cron": "*/5 * * * *"}));
    assert_eq!(answer.status, 409, "{}", answer.body);
    assert_eq!(answer.body["error"]["details"]["reason"], "limit", "{}", answer.body);
    assert_eq!(answer.body["error"]["details"]["limit"], 2, "{}", answer.body);
}
