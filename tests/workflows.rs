//! Workflows (docs/api.md, "Workflows") over HTTP against a server on a
//! manual clock that checks its invariants after every turn: each row of
//! the execution table, results passing, cancel in each phase, the events
//! in order, restarts at each phase, retention, and every error path. The
//! tests that do not move time run on the PostgreSQL backend too.

mod common;

use common::TestServer;
use common::postgres::TempPostgres;
use serde_json::{Value, json};
use svc::clock::ManualClock;

const START: i64 = 1_800_000_000_000;

struct Flow {
    server: TestServer,
    clock: ManualClock,
    dir: tempfile::TempDir,
    /// The database of a node on the PostgreSQL backend (whose clock is
    /// the system's: its tests do not move time).
    _postgres: Option<TempPostgres>,
}

impl Flow {
    fn new() -> Flow {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(START);
        let server = TestServer::start_at(dir.path(), &clock);
        Flow { server, clock, dir, _postgres: None }
    }

    fn on_postgres() -> Flow {
        let postgres = TempPostgres::start();
        let dir = tempfile::tempdir().unwrap();
        let server = TestServer::on_postgres(dir.path(), &postgres.database("workflows"));
        Flow { server, clock: ManualClock::new(START), dir, _postgres: Some(postgres) }
    }

    fn restart(self) -> Flow {
        let Flow { server, clock, dir, _postgres } = self;
        server.stop();
        let server = TestServer::start_at(dir.path(), &clock);
        Flow { server, clock, dir, _postgres }
    }

    /// Creates a workflow, asserting 201; answers its object.
    fn create(&self, body: Value) -> Value {
        let answer = self.server.post("/svc/v1/workflows", body);
        assert_eq!(answer.status, 201, "{}", answer.body);
        let id = answer.body["workflow"]["id"].as_str().unwrap();
        assert_eq!(answer.header("location"), Some(format!("/svc/v1/workflows/{id}").as_str()));
        answer.body["workflow"].clone()
    }

    fn get(&self, id: &Value) -> Value {
        let answer = self.server.get(&format!("/svc/v1/workflows/{}", id.as_str().unwrap()));
        assert_eq!(answer.status, 200, "{}", answer.body);
        answer.body["workflow"].clone()
    }

    /// Fetches one job from `queue` (it must be there).
    fn take(&self, queue: &str) -> Value {
        let jobs = self.server.fetch(&[queue], 1);
        assert_eq!(jobs.len(), 1, "a job waits in {queue}");
        jobs[0].clone()
    }

    fn ack(&self, job: &Value, result: Value) {
        let answer = self.server.post("/svc/v1/workers/ack", json!({"job_id": job["id"], "result": result}));
        assert_eq!(answer.status, 200, "{}", answer.body);
    }

    /// A nack that ends the job (`retryable: false`).
    fn fail(&self, job: &Value) {
        let error = json!({"type": "Broken", "message": "no", "retryable": false});
        let answer = self.server.post("/svc/v1/workers/nack", json!({"job_id": job["id"], "error": error}));
        assert_eq!(answer.status, 200, "{}", answer.body);
    }

    fn events(&self, subject: &Value) -> Vec<String> {
        let answer = self.server.get(&format!("/svc/v1/events?types=workflow.*&subject={}", subject.as_str().unwrap()));
        answer.body["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|event| event["type"].as_str().unwrap().to_string())
            .collect()
    }
}

fn chain(queue: &str, steps: usize) -> Value {
    let steps: Vec<Value> =
        (0..steps).map(|n| json!({"type": format!("step.s{n}"), "args": [n], "options": {"queue": queue}})).collect();
    json!({"name": "c", "definition": {"type": "chain", "steps": steps}})
}

#[test]
fn a_chain_runs_its_steps_in_order_passing_results() {
    check_a_chain_runs_its_steps_in_order_passing_results(Flow::new());
}

#[test]
fn on_postgres_a_chain_runs_its_steps_in_order_passing_results() {
    check_a_chain_runs_its_steps_in_order_passing_results(Flow::on_postgres());
}

fn check_a_chain_runs_its_steps_in_order_passing_results(flow: Flow) {
    let created = flow.create(chain("c", 3));
    assert_eq!((created["state"].as_str(), created["steps_total"].as_u64()), (Some("running"), Some(3)));
    let states: Vec<&str> =
        created["steps"].as_array().unwrap().iter().map(|step| step["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["available", "pending", "pending"]);
    let later = &created["steps"][1]["job_id"];
    let owned = flow.server.post_raw(&format!("/svc/v1/jobs/{}/activate", later.as_str().unwrap()), "", None);
    assert_eq!((owned.status, owned.body["error"]["details"]["reason"].as_str()), (409, Some("owned")));

    let first = flow.take("c");
    assert_eq!((&first["workflow_id"], &first["parent_results"]), (&created["id"], &json!([])));
    assert!(flow.server.fetch(&["c"], 10).is_empty(), "step 1 waits for step 0");
    flow.ack(&first, json!({"report_id": "R-1"}));
    let second = flow.take("c");
    assert_eq!(second["type"], "step.s1");
    assert_eq!(second["parent_results"], json!([{"report_id": "R-1"}]));
    assert!(second["activated_at"].is_string());
    flow.ack(&second, Value::Null);
    let third = flow.take("c");
    assert_eq!(third["parent_results"], json!([{"report_id": "R-1"}, null]));
    flow.ack(&third, json!(3));

    let done = flow.get(&created["id"]);
    assert_eq!((done["state"].as_str(), done["steps_completed"].as_u64()), (Some("completed"), Some(3)));
    assert!(done["completed_at"].is_string());
    assert_eq!(
        flow.events(&created["id"]),
        [
            "workflow.started",
            "workflow.step_completed",
            "workflow.step_completed",
            "workflow.step_completed",
            "workflow.completed"
        ]
    );
}

#[test]
fn a_failed_or_cancelled_step_fails_the_chain_and_cancels_the_rest() {
    let flow = Flow::new();
    // A step that retries first, then succeeds, does not fail the chain.
    let created = flow.create(json!({"type": "chain", "steps": [
        {"type": "a", "options": {"queue": "c", "retry": {"max_attempts": 2, "initial_interval": "PT1S", "jitter": false}}},
        {"type": "b", "options": {"queue": "c"}}, {"type": "c", "options": {"queue": "c"}}]}));
    let first = flow.take("c");
    let error = json!({"type": "Flaky", "message": "again"});
    assert_eq!(flow.server.post("/svc/v1/workers/nack", json!({"job_id": first["id"], "error": error})).status, 200);
    assert_eq!(flow.get(&created["id"])["state"], "running", "retryable is not failure");
    flow.server.advance(&flow.clock, 1000);
    flow.ack(&flow.take("c"), Value::Null);
    let second = flow.take("c");
    flow.fail(&second);
    let failed = flow.get(&created["id"]);
    assert_eq!(failed["state"], "failed");
    assert_eq!((failed["failure"]["index"].as_u64(), &failed["failure"]["job_id"]), (Some(1), &second["id"]));
    assert_eq!(failed["failure"]["error"]["type"], "Broken");
    assert_eq!(failed["steps"][2]["state"], "cancelled");
    let last = failed["steps"][2]["job_id"].as_str().unwrap();
    let reasons = flow.server.get(&format!("/svc/v1/events?types=job.cancelled&subject={last}")).body;
    assert_eq!(reasons["events"][0]["data"]["reason"], "workflow_failed");
    assert_eq!(reasons["events"][0]["data"]["workflow_id"], created["id"]);

    a_cancelled_waiting_step_fails_the_chain(&flow);
}

#[test]
fn on_postgres_a_cancelled_waiting_step_fails_the_chain() {
    a_cancelled_waiting_step_fails_the_chain(&Flow::on_postgres());
}

/// A pending step cancelled directly fails the chain too.
fn a_cancelled_waiting_step_fails_the_chain(flow: &Flow) {
    let created = flow.create(chain("d", 3));
    let pending = created["steps"][2]["job_id"].as_str().unwrap().to_string();
    assert_eq!(flow.server.delete(&format!("/svc/v1/jobs/{pending}")).status, 200);
    let failed = flow.get(&created["id"]);
    assert_eq!((failed["state"].as_str(), failed["failure"]["index"].as_u64()), (Some("failed"), Some(2)));
    assert_eq!(failed["steps"][1]["state"], "cancelled", "a step still waiting never starts");
    assert_eq!(failed["steps"][0]["state"], "available", "a step already started runs on");
}

/// A step's timeout fails the chain in the same turn in which a later,
/// still waiting step expires: the cancelled step stays cancelled.
#[test]
fn a_step_cancelled_by_a_timeout_is_not_expired_in_the_same_turn() {
    let flow = Flow::new();
    let created = flow.create(json!({"type": "chain", "steps": [
        {"type": "a", "options": {"queue": "t", "timeout_ms": 1000, "retry": {"max_attempts": 1}}},
        {"type": "b", "options": {"queue": "t", "expires_at": "+PT2S"}}]}));
    flow.take("t");
    flow.server.advance(&flow.clock, 5000);
    let failed = flow.get(&created["id"]);
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(failed["steps"][1]["state"], "cancelled", "{failed}");
    let second = failed["steps"][1]["job_id"].as_str().unwrap().to_string();
    assert_eq!(flow.server.job(&second)["state"], "cancelled");
    let flow = flow.restart();
    assert_eq!(flow.server.job(&second)["state"], "cancelled", "replay agrees");
}

/// A member sent back from the dead letter listing runs on its own: the
/// workflow's cancel leaves it alone.
#[test]
fn cancelling_a_workflow_leaves_a_member_retried_from_the_dead_letter_listing() {
    check_cancelling_a_workflow_leaves_a_member_retried_from_the_dead_letter_listing(Flow::new());
}

#[test]
fn on_postgres_cancelling_a_workflow_leaves_a_member_retried_from_the_dead_letter_listing() {
    check_cancelling_a_workflow_leaves_a_member_retried_from_the_dead_letter_listing(Flow::on_postgres());
}

fn check_cancelling_a_workflow_leaves_a_member_retried_from_the_dead_letter_listing(flow: Flow) {
    let retry = json!({"max_attempts": 1, "on_exhaustion": "dead_letter"});
    let created = flow.create(json!({"type": "group", "jobs": [
        {"type": "a", "options": {"queue": "g", "retry": retry}},
        {"type": "b", "options": {"queue": "slow"}}]}));
    let first = flow.take("g");
    flow.fail(&first);
    let id = first["id"].as_str().unwrap();
    assert_eq!(flow.server.job(id)["state"], "discarded");
    assert_eq!(flow.server.post(&format!("/svc/v1/dead-letter/{id}/retry"), json!({})).status, 200);
    assert_eq!(flow.get(&created["id"])["state"], "running", "b has not ended");
    assert_eq!(flow.server.delete(&format!("/svc/v1/workflows/{}", created["id"].as_str().unwrap())).status, 200);
    assert_eq!(flow.server.job(id)["state"], "available", "the retried job runs on");
    let second = flow.get(&created["id"])["jobs"][1]["job_id"].as_str().unwrap().to_string();
    assert_eq!(flow.server.job(&second)["state"], "cancelled");
}

/// Two members with one unique key: the workflow would cancel its own
/// member, so it is refused whatever the policy.
#[test]
fn two_members_with_one_unique_key_refuse_the_creation() {
    check_two_members_with_one_unique_key_refuse_the_creation(Flow::new());
}

#[test]
fn on_postgres_two_members_with_one_unique_key_refuse_the_creation() {
    check_two_members_with_one_unique_key_refuse_the_creation(Flow::on_postgres());
}

fn check_two_members_with_one_unique_key_refuse_the_creation(flow: Flow) {
    let unique = json!({"key": ["0"], "on_conflict": "replace"});
    let body = json!({"type": "group", "jobs": [
        {"type": "u", "args": [1], "options": {"queue": "u", "unique": unique}},
        {"type": "u", "args": [1], "options": {"queue": "u", "unique": unique}}]});
    let refused = flow.server.post("/svc/v1/workflows", body);
    assert_eq!((refused.status, refused.error_code()), (409, "duplicate"), "{}", refused.body);
    assert_eq!(refused.body["error"]["details"]["index"], 1);
    assert!(flow.server.fetch(&["u"], 10).is_empty(), "nothing stored");
}

#[test]
fn a_group_ends_when_every_job_has() {
    check_a_group_ends_when_every_job_has(Flow::new());
}

#[test]
fn on_postgres_a_group_ends_when_every_job_has() {
    check_a_group_ends_when_every_job_has(Flow::on_postgres());
}

fn check_a_group_ends_when_every_job_has(flow: Flow) {
    let jobs: Vec<Value> = (0..3).map(|n| json!({"type": "g", "args": [n], "options": {"queue": "g"}})).collect();
    let created = flow.create(json!({"definition": {"type": "group", "jobs": jobs}}));
    let claimed = flow.server.fetch(&["g"], 3);
    assert_eq!(claimed.len(), 3, "a group's jobs all start at once");
    assert!(claimed.iter().all(|job| job["parent_results"] == json!([])));
    flow.fail(&claimed[1]);
    assert_eq!(flow.get(&created["id"])["state"], "running", "a failure does not touch siblings");
    flow.ack(&claimed[0], Value::Null);
    flow.ack(&claimed[2], Value::Null);
    let failed = flow.get(&created["id"]);
    assert_eq!(
        (failed["state"].as_str(), failed["jobs_failed"].as_u64(), failed["jobs_completed"].as_u64()),
        (Some("failed"), Some(1), Some(2))
    );
    assert_eq!(failed["failure"]["index"], 1);

    let created = flow.create(json!({"type": "group", "jobs": [{"type": "g", "options": {"queue": "h"}}]}));
    flow.ack(&flow.take("h"), Value::Null);
    assert_eq!(flow.get(&created["id"])["state"], "completed");
}

fn batch(queue: &str, jobs: usize, callbacks: Value) -> Value {
    let jobs: Vec<Value> = (0..jobs).map(|n| json!({"type": "b", "args": [n], "options": {"queue": queue}})).collect();
    json!({"type": "batch", "jobs": jobs, "callbacks": callbacks})
}

#[test]
fn a_batch_fires_its_callbacks_once_by_their_rule() {
    check_a_batch_fires_its_callbacks_once_by_their_rule(Flow::new());
}

#[test]
fn on_postgres_a_batch_fires_its_callbacks_once_by_their_rule() {
    check_a_batch_fires_its_callbacks_once_by_their_rule(Flow::on_postgres());
}

fn check_a_batch_fires_its_callbacks_once_by_their_rule(flow: Flow) {
    let callbacks = json!({"on_complete": {"type": "cb.complete", "options": {"queue": "cb"}},
                           "on_success": {"type": "cb.success", "options": {"queue": "cb"}},
                           "on_failure": {"type": "cb.failure", "options": {"queue": "cb"}}});
    let created = flow.create(batch("b", 2, callbacks.clone()));
    assert!(created["callbacks"]["on_success"].get("job_id").is_none(), "callbacks are made when they fire");
    let jobs = flow.server.fetch(&["b"], 2);
    flow.ack(&jobs[0], json!({"n": 0}));
    assert!(flow.server.fetch(&["cb"], 10).is_empty());
    flow.ack(&jobs[1], json!({"n": 1}));
    let fired = flow.server.fetch(&["cb"], 10);
    let types: Vec<&str> = fired.iter().map(|job| job["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["cb.complete", "cb.success"]);
    assert_eq!(fired[0]["parent_results"], json!([{"n": 0}, {"n": 1}]));
    assert_eq!(fired[0]["parent_states"], json!(["completed", "completed"]));
    assert_eq!(flow.get(&created["id"])["state"], "running", "until the fired callbacks end");
    flow.ack(&fired[0], Value::Null);
    flow.ack(&fired[1], Value::Null);
    let done = flow.get(&created["id"]);
    assert_eq!(done["state"], "completed");
    assert_eq!(done["callbacks"]["on_success"]["state"], "completed");
    assert!(done["callbacks"]["on_failure"].get("job_id").is_none());
    let events = flow.events(&created["id"]);
    assert_eq!(events.iter().filter(|event| *event == "workflow.callback_fired").count(), 2);
    assert_eq!(events.last().map(String::as_str), Some("workflow.completed"));

    // A failed job: on_complete and on_failure fire; a failing callback fails the batch.
    let created = flow.create(batch("b2", 2, callbacks));
    let jobs = flow.server.fetch(&["b2"], 2);
    flow.fail(&jobs[0]);
    flow.ack(&jobs[1], Value::Null);
    let fired = flow.server.fetch(&["cb"], 10);
    let types: Vec<&str> = fired.iter().map(|job| job["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["cb.complete", "cb.failure"]);
    assert_eq!(fired[1]["parent_states"], json!(["discarded", "completed"]));
    flow.ack(&fired[0], Value::Null);
    flow.fail(&fired[1]);
    let failed = flow.get(&created["id"]);
    assert_eq!(
        (failed["state"].as_str(), &failed["failure"]["index"], &failed["failure"]["job_id"]),
        (Some("failed"), &Value::Null, &fired[1]["id"])
    );

    // Only on_success, and a job failed: nothing fires, the batch fails at once.
    let created =
        flow.create(batch("b3", 1, json!({"on_success": {"type": "cb.success", "options": {"queue": "cb3"}}})));
    flow.fail(&flow.take("b3"));
    assert_eq!(flow.get(&created["id"])["state"], "failed");
    assert!(flow.server.fetch(&["cb3"], 10).is_empty());
}

#[test]
fn cancel_stops_every_job_in_each_phase_and_nothing_fires_afterwards() {
    check_cancel_stops_every_job_in_each_phase_and_nothing_fires_afterwards(Flow::new());
}

#[test]
fn on_postgres_cancel_stops_every_job_in_each_phase_and_nothing_fires_afterwards() {
    check_cancel_stops_every_job_in_each_phase_and_nothing_fires_afterwards(Flow::on_postgres());
}

fn check_cancel_stops_every_job_in_each_phase_and_nothing_fires_afterwards(flow: Flow) {
    // A chain with its first step active.
    let created = flow.create(chain("x", 2));
    let active = flow.take("x");
    let cancelled = flow.server.delete(&format!("/svc/v1/workflows/{}", created["id"].as_str().unwrap()));
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    assert_eq!(cancelled.body["workflow"]["state"], "cancelled");
    assert!(cancelled.body["workflow"]["cancelled_at"].is_string());
    let states: Vec<&str> = cancelled.body["workflow"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|step| step["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["cancelled", "cancelled"]);
    let ack = flow.server.post("/svc/v1/workers/ack", json!({"job_id": active["id"]}));
    assert_eq!(ack.status, 409, "the worker's late ack");
    let again = flow.server.delete(&format!("/svc/v1/workflows/{}", created["id"].as_str().unwrap()));
    assert_eq!((again.status, again.error_code()), (409, "conflict"));
    assert_eq!(flow.events(&created["id"]), ["workflow.started", "workflow.cancelled"]);

    // A batch whose callback fired: the callback is cancelled too.
    let created = flow.create(batch("y", 1, json!({"on_complete": {"type": "cb", "options": {"queue": "ycb"}}})));
    flow.ack(&flow.take("y"), Value::Null);
    let callback = flow.take("ycb");
    flow.server.delete(&format!("/svc/v1/workflows/{}", created["id"].as_str().unwrap()));
    assert_eq!(flow.server.job(callback["id"].as_str().unwrap())["state"], "cancelled");

    // A batch cancelled before its jobs ended never fires its callbacks.
    let created = flow.create(batch("z", 2, json!({"on_complete": {"type": "cb", "options": {"queue": "zcb"}}})));
    let first = flow.take("z");
    flow.ack(&first, Value::Null);
    flow.server.delete(&format!("/svc/v1/workflows/{}", created["id"].as_str().unwrap()));
    assert!(flow.server.fetch(&["zcb", "z"], 10).is_empty());
    let done = flow.get(&created["id"]);
    assert_eq!((done["jobs_completed"].as_u64(), done["jobs"][1]["state"].as_str()), (Some(1), Some("cancelled")));
}

#[test]
fn workflows_survive_restarts_in_every_phase() {
    let flow = Flow::new();
    let chain_id = flow.create(chain("r", 2))["id"].clone();
    let batch_id =
        flow.create(batch("rb", 1, json!({"on_success": {"type": "cb", "options": {"queue": "rcb"}}})))["id"].clone();
    let flow = flow.restart();
    flow.ack(&flow.take("r"), json!("one"));
    flow.server.engine().snapshot().wait().unwrap();
    let flow = flow.restart();
    let second = flow.take("r");
    assert_eq!(second["parent_results"], json!(["one"]), "results outlast a snapshot and a restart");
    flow.ack(&second, Value::Null);
    flow.ack(&flow.take("rb"), Value::Null);
    let flow = flow.restart();
    assert_eq!(flow.get(&chain_id)["state"], "completed");
    let callback = flow.take("rcb");
    assert!(flow.server.fetch(&["rcb"], 10).is_empty(), "the callback fired once, not again on replay");
    flow.ack(&callback, Value::Null);
    let flow = flow.restart();
    assert_eq!(flow.get(&batch_id)["state"], "completed");
}

#[test]
fn ended_workflows_are_pruned_after_their_retention() {
    let flow = Flow::new();
    let created = flow.create(chain("p", 1));
    flow.ack(&flow.take("p"), Value::Null);
    flow.server.advance(&flow.clock, 7 * 86_400_000 - 1);
    assert_eq!(flow.get(&created["id"])["state"], "completed");
    flow.server.advance(&flow.clock, 1);
    let gone = flow.server.get(&format!("/svc/v1/workflows/{}", created["id"].as_str().unwrap()));
    assert_eq!((gone.status, gone.body["error"]["details"]["resource_type"].as_str()), (404, Some("workflow")));
}

/// A server on a manual clock, checking its invariants, with the job and
/// workflow retention `change` sets.
fn start_retaining(dir: &std::path::Path, clock: &ManualClock, change: fn(&mut svc::engine::Retention)) -> TestServer {
    let config = common::config_for(dir);
    let mut engine = svc::__private::server::engine_config(&config);
    engine.clock = std::sync::Arc::new(clock.clone());
    engine.wiring.entropy = Box::new(common::FixedEntropy(0));
    engine.wiring.check_invariants = true;
    change(&mut engine.retention);
    TestServer::start_with(&config, engine)
}

/// The members of a workflow object as `(job_id, type, queue, state)`.
fn members(workflow: &Value, list: &str) -> Vec<(String, String, String, String)> {
    let text = |member: &Value, key: &str| member[key].as_str().unwrap_or("<none>").to_string();
    workflow[list]
        .as_array()
        .unwrap()
        .iter()
        .map(|member| (text(member, "job_id"), text(member, "type"), text(member, "queue"), text(member, "state")))
        .collect()
}

#[test]
fn members_whose_jobs_were_pruned_keep_their_ids_and_how_they_ended() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let retention = |retention: &mut svc::engine::Retention| retention.completed_ms = 60_000;
    let server = start_retaining(dir.path(), &clock, retention);
    let answer = server.post("/svc/v1/workflows", chain("pc", 2));
    let id = answer.body["workflow"]["id"].as_str().unwrap().to_string();
    let first = server.fetch(&["pc"], 1)[0]["id"].as_str().unwrap().to_string();
    assert_eq!(server.post("/svc/v1/workers/ack", json!({"job_id": first, "result": {"n": 1}})).status, 200);

    // The first step's job goes while the chain still runs; what it gave
    // is the workflow's, and still passed on.
    server.advance(&clock, 60_001);
    assert_eq!(server.get(&format!("/svc/v1/jobs/{first}")).status, 404);
    let running = server.get(&format!("/svc/v1/workflows/{id}")).body["workflow"].clone();
    assert_eq!((running["state"].as_str(), running["steps_completed"].as_u64()), (Some("running"), Some(1)));
    let shown = members(&running, "steps");
    assert_eq!(shown[0], (first.clone(), "step.s0".into(), "pc".into(), "completed".into()));
    assert_eq!(shown[1].3, "available");
    let second = server.fetch(&["pc"], 1)[0].clone();
    assert_eq!(second["parent_results"], json!([{"n": 1}]));
    assert_eq!(server.post("/svc/v1/workers/ack", json!({"job_id": second["id"]})).status, 200);
    server.advance(&clock, 60_001);
    let ended = server.get(&format!("/svc/v1/workflows/{id}")).body["workflow"].clone();
    assert_eq!((ended["state"].as_str(), ended["jobs_completed"].as_u64()), (Some("completed"), Some(2)));
    assert_eq!(members(&ended, "steps").iter().map(|member| member.3.as_str()).collect::<Vec<_>>(), ["completed"; 2]);

    // A group member discarded, sent back, completed and pruned: the
    // member shows the end the workflow recorded all along.
    let group =
        json!({"type": "group", "jobs": [{"type": "g", "options": {"queue": "pg", "retry": {"max_attempts": 1}}}]});
    let answer = server.post("/svc/v1/workflows", group);
    let group_id = answer.body["workflow"]["id"].as_str().unwrap().to_string();
    let job = server.fetch(&["pg"], 1)[0]["id"].as_str().unwrap().to_string();
    let failed = server.post("/svc/v1/workers/nack", json!({"job_id": job, "error": {"type": "E", "message": "m"}}));
    assert_eq!(failed.body["state"], "discarded");
    assert_eq!(server.post(&format!("/svc/v1/dead-letter/{job}/retry"), json!({})).status, 200);
    assert_eq!(server.fetch(&["pg"], 1)[0]["id"], job.as_str());
    assert_eq!(server.post("/svc/v1/workers/ack", json!({"job_id": job})).status, 200);
    let expected = vec![(job.clone(), "g".to_string(), "pg".to_string(), "discarded".to_string())];
    let shown = server.get(&format!("/svc/v1/workflows/{group_id}")).body["workflow"].clone();
    assert_eq!((shown["state"].as_str(), members(&shown, "jobs")), (Some("failed"), expected.clone()));
    server.advance(&clock, 60_001);
    assert_eq!(server.get(&format!("/svc/v1/jobs/{job}")).status, 404);
    server.stop();
    let server = start_retaining(dir.path(), &clock, retention);
    let shown = server.get(&format!("/svc/v1/workflows/{group_id}")).body["workflow"].clone();
    assert_eq!((shown["jobs_failed"].as_u64(), members(&shown, "jobs")), (Some(1), expected));
}

#[test]
fn jobs_whose_workflow_was_pruned_keep_its_id_but_not_its_results() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let retention = |retention: &mut svc::engine::Retention| retention.workflows_ms = 60_000;
    let server = start_retaining(dir.path(), &clock, retention);
    let answer = server.post("/svc/v1/workflows", chain("pw", 2));
    let id = answer.body["workflow"]["id"].as_str().unwrap().to_string();
    let mut steps = Vec::new();
    for n in 0..2 {
        let step = server.fetch(&["pw"], 1)[0]["id"].as_str().unwrap().to_string();
        assert_eq!(server.post("/svc/v1/workers/ack", json!({"job_id": step, "result": n})).status, 200);
        steps.push(step);
    }
    assert_eq!(server.job(&steps[1])["parent_results"], json!([0]));
    server.advance(&clock, 60_001);
    assert_eq!(server.get(&format!("/svc/v1/workflows/{id}")).status, 404);
    for step in &steps {
        let job = server.job(step);
        assert_eq!((job["state"].as_str(), job["workflow_id"].as_str()), (Some("completed"), Some(id.as_str())));
        assert!(job.get("parent_results").is_none() && job.get("parent_states").is_none(), "{job}");
    }
}

#[test]
fn invalid_creations_are_refused_and_create_nothing() {
    check_invalid_creations_are_refused_and_create_nothing(Flow::new());
}

#[test]
fn on_postgres_invalid_creations_are_refused_and_create_nothing() {
    check_invalid_creations_are_refused_and_create_nothing(Flow::on_postgres());
}

fn check_invalid_creations_are_refused_and_create_nothing(flow: Flow) {
    let cases = [
        (json!({"name": "x"}), 400, "invalid_request"),
        (json!({"definition": {"type": "dag", "steps": [{"type": "a"}]}}), 400, "invalid_request"),
        (json!({"type": "chain", "steps": []}), 400, "invalid_request"),
        (json!({"type": "batch", "jobs": [{"type": "a"}]}), 400, "invalid_request"),
        (
            json!({"type": "chain", "steps": [{"type": "a", "options": {"queue": "v"}}, {"type": "Bad Type"}]}),
            400,
            "invalid_payload",
        ),
        (json!({"type": "chain", "steps": [{"type": "chain", "steps": [{"type": "a"}]}]}), 422, "unsupported"),
        (json!({"type": "group", "jobs": [{"type": "a", "depends_on": ["b"]}]}), 422, "unsupported"),
        (
            json!({"type": "group", "jobs": (0..1001).map(|_| json!({"type": "a"})).collect::<Vec<_>>()}),
            400,
            "invalid_request",
        ),
    ];
    for (body, status, code) in cases {
        let answer = flow.server.post("/svc/v1/workflows", body.clone());
        let shown: String = body.to_string().chars().take(80).collect();
        assert_eq!((answer.status, answer.error_code()), (status, code), "{shown}: {}", answer.body);
    }
    let structure = flow.server.post("/svc/v1/workflows", json!({"definition": {"type": "chain", "steps": []}}));
    assert_eq!(structure.body["error"]["details"]["validation_errors"][0]["path"], "definition.steps");

    // A paused queue refuses the jobs that would start at once, not later steps.
    flow.server.post("/svc/v1/queues/v/pause", json!({}));
    let paused = flow.server.post(
        "/svc/v1/workflows",
        json!({"type": "group", "jobs": [{"type": "a"}, {"type": "a", "options": {"queue": "v"}}]}),
    );
    assert_eq!((paused.status, paused.body["error"]["details"]["index"].as_u64()), (503, Some(1)));
    flow.create(json!({"type": "chain", "steps": [{"type": "a"}, {"type": "a", "options": {"queue": "v"}}]}));
    assert_eq!(
        flow.server.get("/svc/v1/queues/default/stats").body["states"]["available"],
        1,
        "only the chain's first step"
    );

    let unknown = flow.server.get("/svc/v1/workflows/019539a4-0000-7000-8000-000000000000");
    assert_eq!(unknown.status, 404);
    assert_eq!(flow.server.get("/svc/v1/workflows/nonsense").status, 404);
    assert_eq!(flow.server.delete("/svc/v1/workflows/019539a4-0000-7000-8000-000000000000").status, 404);
}

/// A batch's callback has its id from the start but is stored only when it
/// fires; a log replayed after a crash must not hand that id to another job.
#[test]
fn a_callbacks_id_is_never_handed_out_again_after_a_crash() {
    use svc::engine::{Engine, EngineConfig, FetchRequest};
    use svc::job::{JobDefaults, parse_enqueue_body};
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let open = || {
        let mut config = EngineConfig::new(dir.path());
        config.clock = std::sync::Arc::new(clock.clone());
        config.wiring.entropy = Box::new(common::FixedEntropy(0));
        config.wiring.check_invariants = true;
        Engine::open(config).unwrap()
    };
    let engine = open();
    let body = json!({"type": "batch", "jobs": [{"type": "part", "options": {"queue": "parts"}}],
                      "callbacks": {"on_complete": {"type": "done"}}});
    let definition = svc::workflow::parse_workflow_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap();
    let id = engine.handle().create_workflow(definition).wait().unwrap();
    let callback_id = engine.handle().workflow(id).unwrap().callbacks[0].job.id;
    engine.close_without_snapshot();

    let engine = open();
    for n in 0..20 {
        let job = parse_enqueue_body(json!({"type": "t", "args": [n]}).to_string().as_bytes(), &JobDefaults::default());
        let made = engine.handle().enqueue(vec![job.unwrap()]).wait().unwrap()[0].job.id;
        assert_ne!(made, callback_id);
    }
    let request = FetchRequest { queues: vec!["parts".into()], count: 1, worker_id: None, visibility_timeout_ms: None };
    let part = engine.handle().fetch(request).wait().unwrap()[0].id;
    engine.handle().ack(part, None, None).wait().unwrap();
    assert_eq!(engine.handle().job(callback_id).unwrap().payload.job_type(), "done");
    engine.close();
}

#[test]
fn ended_workflows_past_a_cap_are_pruned_oldest_first() {
    use svc::engine::{Engine, EngineConfig, FetchRequest};
    use svc::job::JobDefaults;
    let dir = tempfile::tempdir().unwrap();
    let mut config = EngineConfig::new(dir.path());
    config.clock = std::sync::Arc::new(ManualClock::new(START));
    config.wiring.entropy = Box::new(common::FixedEntropy(0));
    config.wiring.check_invariants = true;
    config.retention.max_terminal_workflows = 2;
    let engine = Engine::open(config).unwrap();
    let handle = engine.handle();
    let request = FetchRequest { queues: vec!["g".into()], count: 1, worker_id: None, visibility_timeout_ms: None };
    let mut ids = Vec::new();
    for n in 0..3 {
        let body = json!({"type": "group", "jobs": [{"type": "g", "args": [n], "options": {"queue": "g"}}]});
        let definition =
            svc::workflow::parse_workflow_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap();
        let id = handle.create_workflow(definition).wait().unwrap();
        let job = handle.fetch(request.clone()).wait().unwrap()[0].id;
        handle.ack(job, None, None).wait().unwrap();
        ids.push(id);
    }
    handle.tick().wait().unwrap();
    assert!(handle.workflow(ids[0]).is_none(), "the oldest ended workflow went first");
    assert!(handle.workflow(ids[1]).is_some() && handle.workflow(ids[2]).is_some());

    // A running workflow is never pruned, whatever the caps say.
    let body = json!({"type": "chain", "steps": [{"type": "g", "options": {"queue": "held"}}]});
    let definition = svc::workflow::parse_workflow_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap();
    let running = handle.create_workflow(definition).wait().unwrap();
    handle.tick().wait().unwrap();
    assert!(handle.workflow(running).is_some());
    engine.close();
}

#[test]
fn workflow_events_follow_the_job_events_that_cause_them() {
    check_workflow_events_follow_the_job_events_that_cause_them(Flow::new());
}

#[test]
fn on_postgres_workflow_events_follow_the_job_events_that_cause_them() {
    check_workflow_events_follow_the_job_events_that_cause_them(Flow::on_postgres());
}

fn check_workflow_events_follow_the_job_events_that_cause_them(flow: Flow) {
    let created = flow.create(batch("ev", 1, json!({"on_complete": {"type": "cb", "options": {"queue": "evcb"}}})));
    let member = flow.take("ev");
    flow.ack(&member, Value::Null);
    let callback = flow.take("evcb");
    flow.ack(&callback, Value::Null);
    let listed = flow.server.get("/svc/v1/events?limit=100").body;
    let sequence: Vec<String> = listed["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|event| event["subject"] == created["id"] || event["data"]["workflow_id"] == created["id"])
        .map(|event| event["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        sequence,
        [
            "workflow.started",
            "job.enqueued",
            "job.started",
            "job.completed",
            "workflow.step_completed",
            "job.enqueued",
            "workflow.callback_fired",
            "job.started",
            "job.completed",
            "workflow.completed"
        ]
    );
    let started =
        &listed["events"].as_array().unwrap().iter().find(|event| event["type"] == "workflow.started").unwrap()["data"];
    assert_eq!((started["workflow_type"].as_str(), started["jobs_total"].as_u64()), (Some("batch"), Some(1)));
}
