//! Workflows on the PostgreSQL backend with more than one node, against a
//! real PostgreSQL server of the test's own: a batch whose jobs are acked at
//! once through two nodes fires its callback once and ends once; a chain
//! step whose claim runs out fails the chain in the leader's transaction; a
//! cancel or an ack the database rolls back to break a deadlock runs again;
//! ended workflows past the count kept are dropped, oldest first.
//! (The execution table itself runs on both backends in tests/workflows.rs.)

mod common;

use std::sync::Arc;

use common::postgres::TempPostgres;
use svc::backend::EventFilter;
use svc::backend::postgres::{PgJobs, PgSettings, open};
use svc::engine::{EventKind, FetchRequest, WorkflowEvent, WorkflowState};
use svc::job::{JobDefaults, JobState};
use svc::workflow::parse_workflow_body;

const NOW: i64 = 1_800_000_000_000;

async fn node(url: &str) -> Arc<PgJobs> {
    let pool = open(&PgSettings::new(url)).await.expect("the schema migrates");
    Arc::new(PgJobs::new(pool))
}

fn fetch(queue: &str, count: usize, worker: &str) -> FetchRequest {
    FetchRequest {
        queues: vec![queue.to_string()],
        count,
        worker_id: Some(worker.to_string()),
        visibility_timeout_ms: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_acked_through_two_nodes_at_once_fires_its_callback_once() {
    let server = TempPostgres::start();
    let url = server.database("batch");
    let (a, b) = (node(&url).await, node(&url).await);
    let jobs: Vec<_> =
        (0..40).map(|n| serde_json::json!({"type": "part", "args": [n], "options": {"queue": "parts"}})).collect();
    let body = serde_json::json!({"type": "batch", "jobs": jobs,
        "callbacks": {"on_complete": {"type": "merge", "options": {"queue": "merge"}}}});
    let definition = parse_workflow_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap();
    let id = a.create_workflow(NOW, definition).await.unwrap();

    let from_a = a.claim(NOW + 1, &fetch("parts", 20, "wa")).await.unwrap();
    let from_b = b.claim(NOW + 1, &fetch("parts", 20, "wb")).await.unwrap();
    assert_eq!(from_a.len() + from_b.len(), 40);
    let mut acks = Vec::new();
    for (store, jobs, worker) in [(&a, from_a, "wa"), (&b, from_b, "wb")] {
        for job in jobs {
            let store = store.clone();
            acks.push(tokio::spawn(async move { store.ack(NOW + 2, job.id, None, Some(worker)).await }));
        }
    }
    for ack in acks {
        assert_eq!(ack.await.unwrap().unwrap().state, JobState::Completed);
    }

    let callbacks = b.claim(NOW + 3, &fetch("merge", 10, "wm")).await.unwrap();
    assert_eq!(callbacks.len(), 1, "the callback fired once");
    let workflow = a.workflow(id).await.unwrap().unwrap();
    assert_eq!(workflow.state, WorkflowState::Running, "until its callback ends");
    assert!(
        workflow.members.iter().all(|member| member.outcome.as_ref().map(|o| o.state) == Some(JobState::Completed))
    );
    b.ack(NOW + 4, callbacks[0].id, None, Some("wm")).await.unwrap();
    assert_eq!(a.workflow(id).await.unwrap().unwrap().state, WorkflowState::Completed);

    let events = a.events_page(None, 1000, &EventFilter::default()).await.unwrap().events;
    let workflow_events: Vec<&WorkflowEvent> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Workflow { event, .. } => Some(event.as_ref()),
            _ => None,
        })
        .collect();
    let count = |matches: fn(&WorkflowEvent) -> bool| workflow_events.iter().filter(|event| matches(event)).count();
    assert_eq!(count(|event| matches!(event, WorkflowEvent::StepCompleted { .. })), 40);
    assert_eq!(count(|event| matches!(event, WorkflowEvent::CallbackFired { .. })), 1);
    assert_eq!(count(|event| matches!(event, WorkflowEvent::Completed { .. })), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_claim_runs_out_fails_the_chain() {
    let server = TempPostgres::start();
    let jobs = node(&server.database("timeout")).await;
    let body = serde_json::json!({"type": "chain", "steps": [
        {"type": "a", "options": {"queue": "t", "timeout_ms": 1000, "retry": {"max_attempts": 1}}},
        {"type": "b", "options": {"queue": "t"}}]});
    let definition = parse_workflow_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap();
    let id = jobs.create_workflow(NOW, definition).await.unwrap();
    let claimed = jobs.claim(NOW, &fetch("t", 10, "w")).await.unwrap();
    assert_eq!(claimed.len(), 1, "the second step waits");

    assert_eq!(jobs.expire_claims(NOW + 5_000, 100).await.unwrap(), 1);
    let workflow = jobs.workflow(id).await.unwrap().unwrap();
    assert_eq!(workflow.state, WorkflowState::Failed);
    assert_eq!(workflow.failure.as_ref().map(|failure| failure.index), Some(Some(0)));
    let second = jobs.job(workflow.members[1].job_id).await.unwrap().unwrap();
    assert_eq!(second.state, JobState::Cancelled, "a step still waiting never starts");
    assert!(jobs.claim(NOW + 5_001, &fetch("t", 10, "w")).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_meets_the_unique_policy_of_a_job_held() {
    use svc::engine::EngineError;
    use svc::job::{JobBuilder, UniquePolicy};
    let server = TempPostgres::start();
    let jobs = node(&server.database("unique_members")).await;
    let held = JobBuilder::new("sync").args(["acct-1"]).queue("s").unique(UniquePolicy::default());
    let held = jobs.enqueue(NOW, vec![held.build(&JobDefaults::default()).unwrap()]).await.unwrap()[0].job.id;
    let group = |on_conflict: &str| {
        let member = serde_json::json!({"type": "sync", "args": ["acct-1"],
            "options": {"queue": "s", "unique": {"on_conflict": on_conflict}}});
        let body = serde_json::json!({"type": "group", "jobs": [member]});
        parse_workflow_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap()
    };

    // A workflow cannot adopt the job held: refused.
    let refused = jobs.create_workflow(NOW + 1, group("ignore")).await.unwrap_err();
    assert!(matches!(refused, EngineError::UniqueConflict { existing, index: Some(0), .. } if existing == held));
    // `replace`: the job held is cancelled, the member takes its place.
    let id = jobs.create_workflow(NOW + 2, group("replace")).await.unwrap();
    assert_eq!(jobs.job(held).await.unwrap().unwrap().state, JobState::Cancelled);
    let member = jobs.workflow(id).await.unwrap().unwrap().members[0].job_id;
    assert_eq!(jobs.claim(NOW + 3, &fetch("s", 10, "w")).await.unwrap()[0].id, member);
}

/// A cancel that the database rolls back to break a deadlock is run again,
/// and succeeds, rather than answering 503: another session holds the
/// workflow's row, the cancel locks the jobs and waits for it, and that
/// session then asks for a job, so the two wait on each other in a circle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_rolled_back_to_break_a_deadlock_is_run_again() {
    let server = TempPostgres::start();
    let url = server.database("deadlock");
    let store = node(&url).await;
    let id = chain_of_two(&store).await;
    let first = store.workflow(id).await.unwrap().unwrap().members[0].job_id.to_string();

    let (mut other, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    // Only the cancel's session looks for the circle, however the machine
    // schedules the two: this one would look only after a minute.
    other.batch_execute("SET deadlock_timeout = '60s'").await.unwrap();
    let other = other.transaction().await.unwrap();
    let workflow_row = "SELECT 1 FROM svc_workflows WHERE id = $1::text::uuid FOR UPDATE";
    other.execute(workflow_row, &[&id.to_string()]).await.unwrap();

    let cancelling = {
        let store = store.clone();
        tokio::spawn(async move { store.cancel_workflow(NOW + 1, id).await })
    };
    // The cancel holds the jobs and waits for the workflow's row; asking for
    // a job now closes the circle, and the database rolls the cancel back
    // (its session is the one that looks for circles).
    let job_row = "SELECT 1 FROM svc_jobs WHERE id = $1::text::uuid FOR UPDATE";
    let waiting = async {
        loop {
            let query = "SELECT count(*) FROM pg_locks WHERE NOT granted";
            let row = count_of(&url, query).await;
            if row > 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    waiting.await;
    other.execute(job_row, &[&first]).await.unwrap();
    other.rollback().await.unwrap();

    assert_eq!(cancelling.await.unwrap(), Ok(()), "the cancel was run again");
    assert_eq!(store.workflow(id).await.unwrap().unwrap().state, WorkflowState::Cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_rolled_back_to_break_a_deadlock_is_run_again() {
    let server = TempPostgres::start();
    let url = server.database("ack_deadlock");
    let store = node(&url).await;
    let id = chain_of_two(&store).await;
    let members = store.workflow(id).await.unwrap().unwrap().members.clone();
    let (first, second) = (members[0].job_id, members[1].job_id);
    assert_eq!(store.claim(NOW, &fetch("default", 1, "w")).await.unwrap()[0].id, first);

    let (mut other, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let other = other.transaction().await.unwrap();
    let job_row = "SELECT 1 FROM svc_jobs WHERE id = $1::text::uuid FOR UPDATE";
    other.execute(job_row, &[&second.to_string()]).await.unwrap();

    let acking = {
        let store = store.clone();
        tokio::spawn(async move { store.ack(NOW + 1, first, None, Some("w")).await })
    };
    // The ack holds the first step and waits for the second, to start it;
    // asking for the first step now closes the circle, and the database
    // rolls the ack back (it has waited longer, so its check finds the
    // circle first).
    while count_of(&url, "SELECT count(*) FROM pg_locks WHERE NOT granted").await == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    other.execute(job_row, &[&first.to_string()]).await.unwrap();
    other.rollback().await.unwrap();

    let acked = acking.await.unwrap().expect("the ack was run again");
    assert_eq!(acked.state, JobState::Completed);
    assert_eq!(store.job(second).await.unwrap().unwrap().state, JobState::Available, "the next step started");
}

/// Past the count kept, the workflows that ended first are dropped; one
/// still running is never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_workflows_past_the_count_kept_are_dropped_oldest_first() {
    let server = TempPostgres::start();
    let store = node(&server.database("kept")).await;
    let running = chain_of_two(&store).await;
    let mut ended = Vec::new();
    for at in [NOW + 1, NOW + 2, NOW + 3] {
        let id = chain_of_two(&store).await;
        store.cancel_workflow(at, id).await.unwrap();
        ended.push(id);
    }
    let mut retention = svc::engine::Retention::default();
    retention.max_terminal_workflows = 2;
    let exists = async |id| store.workflow(id).await.unwrap().is_some();

    assert_eq!(store.prune_workflows(NOW + 10, &retention).await.unwrap(), 1);
    assert!(!exists(ended[0]).await, "the first to end is dropped");
    assert!(exists(ended[1]).await && exists(ended[2]).await && exists(running).await);

    // Another ends: the oldest of the two kept goes.
    let last = chain_of_two(&store).await;
    store.cancel_workflow(NOW + 4, last).await.unwrap();
    assert_eq!(store.prune_workflows(NOW + 10, &retention).await.unwrap(), 1);
    assert!(!exists(ended[1]).await);
    assert!(exists(ended[2]).await && exists(last).await && exists(running).await);
    assert_eq!(store.prune_workflows(NOW + 10, &retention).await.unwrap(), 0, "none past the count");
}

/// A chain of two steps in the `default` queue.
async fn chain_of_two(store: &PgJobs) -> svc::job::WorkflowId {
    let steps: Vec<_> = (0..2).map(|n| serde_json::json!({"type": "step", "args": [n]})).collect();
    let body = serde_json::json!({"type": "chain", "steps": steps});
    let definition = parse_workflow_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap();
    store.create_workflow(NOW, definition).await.unwrap()
}

/// One number a query answers, on a connection of its own.
async fn count_of(url: &str, query: &str) -> i64 {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client.query_one(query, &[]).await.unwrap().get(0)
}
