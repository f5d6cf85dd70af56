//! Unique jobs (docs/api.md, "Unique jobs"): each conflict policy over HTTP,
//! the period and the states a policy covers on a manual clock, batches
//! (atomic, later items seeing earlier ones), cron fires, and the index
//! rebuilt after a restart. Servers check their invariants after every turn.
//! The policies and batches run on the PostgreSQL backend too.

mod common;

use common::PostgresNode;
use common::TestServer;
use serde_json::{Value, json};
use svc::clock::ManualClock;

const START: i64 = 1_800_000_000_000;

fn unique_job(args: Value, unique: Value) -> Value {
    json!({"type": "email.send", "args": args, "options": {"queue": "mail", "unique": unique}})
}

fn events_of(server: &TestServer, kind: &str, subject: &str) -> Vec<Value> {
    let answer = server.get(&format!("/svc/v1/events?types={kind}&subject={subject}"));
    answer.body["events"].as_array().expect("events").clone()
}

fn available_in(server: &TestServer, queue: &str) -> u64 {
    server.get(&format!("/svc/v1/queues/{queue}/stats")).body["states"]["available"].as_u64().unwrap_or(0)
}

#[test]
fn reject_answers_409_with_the_holder_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    check_reject_answers_409_with_the_holder_and_stores_nothing(&TestServer::start(dir.path()));
}

#[test]
fn on_postgres_reject_answers_409_with_the_holder_and_stores_nothing() {
    check_reject_answers_409_with_the_holder_and_stores_nothing(&PostgresNode::start("unique_jobs"));
}

fn check_reject_answers_409_with_the_holder_and_stores_nothing(server: &TestServer) {
    let first = server.post("/svc/v1/jobs", unique_job(json!(["a@x.io"]), json!({})));
    assert_eq!(first.status, 201, "{}", first.body);
    let job = &first.body["job"];
    let key = job["unique_key"].as_str().expect("the key is shown");
    assert!(key.len() == 64 && key.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    assert_eq!(job["unique"]["on_conflict"], "reject");
    assert_eq!(job["unique"]["states"].as_array().unwrap().len(), 5, "all live states by default");

    let second = server.post("/svc/v1/jobs", unique_job(json!(["a@x.io"]), json!({"on_conflict": "reject"})));
    assert_eq!((second.status, second.error_code()), (409, "duplicate"), "{}", second.body);
    let details = &second.body["error"]["details"];
    assert_eq!(details["existing_job_id"], job["id"]);
    assert_eq!(
        (details["existing_job_state"].as_str(), details["unique_key"].as_str()),
        (Some("available"), Some(key))
    );
    assert_eq!(available_in(server, "mail"), 1, "nothing stored");

    // Other args make another key; the queue is not part of it.
    server.enqueue(unique_job(json!(["b@x.io"]), json!({})));
    let elsewhere = json!({"type": "email.send", "args": ["a@x.io"], "options": {"queue": "other", "unique": {}}});
    assert_eq!(server.post("/svc/v1/jobs", elsewhere).status, 409);
}

#[test]
fn ignore_answers_with_the_held_job_and_emits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    check_ignore_answers_with_the_held_job_and_emits_nothing(&TestServer::start(dir.path()));
}

#[test]
fn on_postgres_ignore_answers_with_the_held_job_and_emits_nothing() {
    check_ignore_answers_with_the_held_job_and_emits_nothing(&PostgresNode::start("unique_jobs"));
}

fn check_ignore_answers_with_the_held_job_and_emits_nothing(server: &TestServer) {
    let id = server.enqueue(unique_job(json!([1]), json!({"on_conflict": "ignore"})));
    let again = server.post("/svc/v1/jobs", unique_job(json!([1]), json!({"on_conflict": "ignore"})));
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!((again.body["job"]["id"].as_str(), &again.body["deduplicated"]), (Some(id.as_str()), &json!(true)));
    assert_eq!(again.body["job"]["deduplicated"], true);
    assert_eq!(again.header("location"), Some(format!("/svc/v1/jobs/{id}").as_str()));
    assert_eq!(available_in(server, "mail"), 1);
    let enqueued = server.get("/svc/v1/events?types=job.enqueued").body["events"].as_array().unwrap().len();
    assert_eq!(enqueued, 1, "no event for a deduplicated enqueue");
}

#[test]
fn replace_cancels_every_holder_even_an_active_one() {
    let dir = tempfile::tempdir().unwrap();
    check_replace_cancels_every_holder_even_an_active_one(&TestServer::start(dir.path()));
}

#[test]
fn on_postgres_replace_cancels_every_holder_even_an_active_one() {
    check_replace_cancels_every_holder_even_an_active_one(&PostgresNode::start("unique_jobs"));
}

fn check_replace_cancels_every_holder_even_an_active_one(server: &TestServer) {
    let policy = json!({"key": ["to"], "on_conflict": "replace"});
    let old = server.enqueue(unique_job(json!([{"to": "a", "n": 1}]), policy.clone()));
    assert_eq!(server.fetch(&["mail"], 1)[0]["id"], old.as_str());
    let new = server.post("/svc/v1/jobs", unique_job(json!([{"to": "a", "n": 2}]), policy));
    assert_eq!(new.status, 201, "{}", new.body);
    let old_job = server.job(&old);
    assert_eq!(old_job["state"], "cancelled");
    assert_eq!(events_of(server, "job.cancelled", &old)[0]["data"]["reason"], "unique_replace");
    let ack = server.post("/svc/v1/workers/ack", json!({"job_id": old}));
    assert_eq!(ack.status, 409, "the worker's late ack: {}", ack.body);
    assert_eq!(new.body["job"]["unique_key"], old_job["unique_key"], "only `to` is in the key");
}

#[test]
fn a_period_ends_the_conflict_and_states_limit_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let server = TestServer::start_at(dir.path(), &clock);
    let within_a_minute = json!({"period": "PT1M"});
    server.enqueue(unique_job(json!(["p"]), within_a_minute.clone()));
    server.advance(&clock, 59_000);
    assert_eq!(server.post("/svc/v1/jobs", unique_job(json!(["p"]), within_a_minute.clone())).status, 409);
    server.advance(&clock, 1_000);
    assert_eq!(server.post("/svc/v1/jobs", unique_job(json!(["p"]), within_a_minute)).status, 201);

    // A policy covering only `available`: a held job that started no longer counts.
    let only_waiting = json!({"states": ["available"]});
    let first = server.enqueue(unique_job(json!(["s"]), only_waiting.clone()));
    server.post("/svc/v1/queues/mail/pause", json!({}));
    assert_eq!(server.post("/svc/v1/jobs", unique_job(json!(["s"]), only_waiting.clone())).status, 503);
    server.post("/svc/v1/queues/mail/resume", json!({}));
    let claimed: Vec<Value> = server.fetch(&["mail"], 10);
    assert!(claimed.iter().any(|job| job["id"] == first.as_str()));
    assert_eq!(server.post("/svc/v1/jobs", unique_job(json!(["s"]), only_waiting)).status, 201);

    // A job that ended frees its key (under the default states).
    let done = server.enqueue(unique_job(json!(["d"]), json!({})));
    server.fetch(&["mail"], 10);
    assert_eq!(server.post("/svc/v1/workers/ack", json!({"job_id": done})).status, 200);
    assert_eq!(server.post("/svc/v1/jobs", unique_job(json!(["d"]), json!({}))).status, 201);
}

#[test]
fn batches_apply_policies_in_item_order_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    check_batches_apply_policies_in_item_order_all_or_nothing(&TestServer::start(dir.path()));
}

#[test]
fn on_postgres_batches_apply_policies_in_item_order_all_or_nothing() {
    check_batches_apply_policies_in_item_order_all_or_nothing(&PostgresNode::start("unique_jobs"));
}

fn check_batches_apply_policies_in_item_order_all_or_nothing(server: &TestServer) {
    let held = server.enqueue(unique_job(json!(["held"]), json!({})));

    let rejected = server.post(
        "/svc/v1/jobs/batch",
        json!({"jobs": [unique_job(json!(["new"]), json!({})), unique_job(json!(["held"]), json!({}))]}),
    );
    assert_eq!((rejected.status, rejected.error_code()), (409, "duplicate"), "{}", rejected.body);
    assert_eq!(rejected.body["error"]["details"]["index"], 1);
    assert_eq!(available_in(server, "mail"), 1, "the first item was not stored either");

    // A later item sees an earlier one of the same batch.
    let twice = server.post(
        "/svc/v1/jobs/batch",
        json!({"jobs": [unique_job(json!(["twice"]), json!({})), unique_job(json!(["twice"]), json!({}))]}),
    );
    assert_eq!((twice.status, twice.body["error"]["details"]["index"].as_u64()), (409, Some(1)));

    let ignore = json!({"on_conflict": "ignore"});
    let mixed = server.post(
        "/svc/v1/jobs/batch",
        json!({"jobs": [unique_job(json!(["held"]), ignore.clone()), unique_job(json!(["fresh"]), ignore.clone()),
                        unique_job(json!(["fresh"]), ignore)]}),
    );
    assert_eq!(mixed.status, 201, "{}", mixed.body);
    let jobs = mixed.body["jobs"].as_array().unwrap();
    assert_eq!((jobs[0]["id"].as_str(), &jobs[0]["deduplicated"]), (Some(held.as_str()), &json!(true)));
    assert!(jobs[1].get("deduplicated").is_none());
    assert_eq!((&jobs[2]["id"], &jobs[2]["deduplicated"]), (&jobs[1]["id"], &json!(true)));
    assert_eq!(mixed.body["count"], 3);
    assert_eq!(available_in(server, "mail"), 2);

    let replace = json!({"on_conflict": "replace"});
    let replaced = server.post(
        "/svc/v1/jobs/batch",
        json!({"jobs": [unique_job(json!(["held"]), replace.clone()), unique_job(json!(["held"]), replace)]}),
    );
    assert_eq!(replaced.status, 201, "{}", replaced.body);
    assert_eq!(server.job(&held)["state"], "cancelled");
    let first = replaced.body["jobs"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(server.job(&first)["state"], "cancelled", "the second item replaced the first");
    assert_eq!(events_of(server, "job.cancelled", &first)[0]["data"]["reason"], "unique_replace");
}

#[test]
fn the_index_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let server = TestServer::start_at(dir.path(), &clock);
    let kept = server.enqueue(unique_job(json!(["k"]), json!({})));
    let ended = server.enqueue(unique_job(json!(["e"]), json!({})));
    server.engine().snapshot().wait().unwrap();
    let after_snapshot = server.enqueue(unique_job(json!(["s"]), json!({})));
    assert_eq!(server.delete(&format!("/svc/v1/jobs/{ended}")).status, 200);
    server.stop();

    let server = TestServer::start_at(dir.path(), &clock);
    for (args, holder) in [("k", &kept), ("s", &after_snapshot)] {
        let again = server.post("/svc/v1/jobs", unique_job(json!([args]), json!({})));
        assert_eq!(again.status, 409, "{args}: {}", again.body);
        assert_eq!(again.body["error"]["details"]["existing_job_id"], holder.as_str());
    }
    assert_eq!(server.post("/svc/v1/jobs", unique_job(json!(["e"]), json!({}))).status, 201);
}

#[test]
fn a_cron_fire_that_meets_a_held_job_is_skipped_as_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START - START % 60_000);
    let server = TestServer::start_at(dir.path(), &clock);
    let register = server.post(
        "/svc/v1/cron",
        json!({"name": "digest", "schedule": "* * * * *", "type": "digest.send", "args": [],
               "overlap_policy": "allow", "options": {"queue": "mail", "unique": {"on_conflict": "reject"}}}),
    );
    assert_eq!(register.status, 201, "{}", register.body);
    server.advance(&clock, 60_000);
    server.advance(&clock, 60_000);
    let cron = server.get("/svc/v1/cron/digest").body;
    assert_eq!(cron["cron"]["run_count"], 1, "{cron}");
    let skipped = server.get("/svc/v1/events?types=cron.skipped").body;
    let reasons: Vec<&str> =
        skipped["events"].as_array().unwrap().iter().filter_map(|event| event["data"]["reason"].as_str()).collect();
    assert_eq!(reasons, ["duplicate"]);
    assert_eq!(available_in(&server, "mail"), 1);
}

#[test]
fn invalid_policies_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    for (policy, field) in [
        (json!({"keys": ["a"]}), "options.unique.keys"),
        (json!({"states": ["completed"]}), "options.unique.states"),
        (json!({"states": []}), "options.unique.states"),
        (json!({"on_conflict": "merge"}), "options.unique.on_conflict"),
        (json!({"period": "PT0S"}), "options.unique.period"),
        (json!({"key": "to"}), "options.unique.key"),
        (json!("yes"), "options.unique"),
    ] {
        let answer = server.post("/svc/v1/jobs", unique_job(json!([]), policy.clone()));
        assert_eq!((answer.status, answer.error_code()), (400, "invalid_payload"), "{policy}: {}", answer.body);
        assert_eq!(answer.body["error"]["details"]["field"], field, "{policy}");
    }
}

#[test]
fn a_cron_run_waiting_on_the_run_its_unique_policy_replaces_starts_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START - START % 60_000);
    let server = TestServer::start_at(dir.path(), &clock);
    let register = server.post(
        "/svc/v1/cron",
        json!({"name": "sync", "schedule": "* * * * *", "type": "sync.run", "args": [],
               "overlap_policy": "enqueue", "options": {"queue": "sync", "unique": {"on_conflict": "replace"}}}),
    );
    assert_eq!(register.status, 201, "{}", register.body);
    server.advance(&clock, 60_000);
    let first = server.get("/svc/v1/cron/sync").body["cron"]["last_job_id"].as_str().unwrap().to_string();
    server.advance(&clock, 60_000);
    let second = server.get("/svc/v1/cron/sync").body["cron"]["last_job_id"].as_str().unwrap().to_string();
    assert_ne!(first, second);
    assert_eq!(server.job(&first)["state"], "cancelled");
    assert_eq!(server.job(&second)["state"], "available", "not left waiting on a run that ended");
}

#[test]
fn a_workflow_callback_cannot_choose_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let body = json!({"type": "batch", "jobs": [{"type": "part"}],
                      "callbacks": {"on_complete": {"type": "done", "id": "019539a4-0000-7000-8000-000000000001"}}});
    let answer = server.post("/svc/v1/workflows", body);
    assert_eq!((answer.status, answer.error_code()), (400, "invalid_payload"), "{}", answer.body);
    assert_eq!(answer.body["error"]["details"]["field"], "callbacks.on_complete.id");
}
