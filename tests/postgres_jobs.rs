//! Jobs on the PostgreSQL backend, against a real PostgreSQL server of the
//! test's own: enqueue and read back, claim order, acks and failures with
//! the local engine's rules (retry, discard, requeue, who may report),
//! cancel, staged jobs and their activation, paused queues, duplicate ids,
//! and claimers on several nodes sharing one database without ever taking
//! the same job.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::postgres::TempPostgres;
use svc::backend::postgres::{PgJobs, PgSettings, open};
use svc::engine::{ConflictReason, EngineError, FetchRequest};
use svc::job::{FailureReport, JobBuilder, JobDefaults, JobId, JobState, NewJob, RetryPolicy};

const NOW: i64 = 1_800_000_000_000;

fn new_job(builder: JobBuilder) -> NewJob {
    builder.build(&JobDefaults::default()).expect("a valid job")
}

fn fetch(queues: &[&str], count: usize, worker: &str) -> FetchRequest {
    FetchRequest {
        queues: queues.iter().map(|queue| queue.to_string()).collect(),
        count,
        worker_id: Some(worker.to_string()),
        visibility_timeout_ms: None,
    }
}

async fn store(server: &TempPostgres, database: &str) -> (PgJobs, deadpool_postgres::Pool) {
    let pool = open(&PgSettings::new(server.database(database))).await.expect("the schema migrates");
    (PgJobs::new(pool.clone()), pool)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_go_through_their_lifecycle_as_on_the_local_engine() {
    let server = TempPostgres::start();
    let (jobs, pool) = store(&server, "lifecycle").await;

    // Enqueued: available, read back whole.
    let enqueued = jobs
        .enqueue(NOW, vec![new_job(JobBuilder::new("email.send").args(["ada@example.com"]).queue("mail"))])
        .await
        .unwrap();
    let id = enqueued[0].job.id;
    let read = jobs.job(id).await.unwrap().expect("stored");
    assert_eq!((read.state, read.queue.as_str(), read.payload.job_type()), (JobState::Available, "mail", "email.send"));
    assert_eq!(read.payload.args(), r#"["ada@example.com"]"#);
    assert!(jobs.job(JobId::parse("0190a8a2-8f6e-7c3b-9a1d-1234567890ab").unwrap()).await.unwrap().is_none());

    // Claimed by one worker: active, first attempt; another worker may not report on it.
    let claimed = jobs.claim(NOW + 10, &fetch(&["mail"], 10, "w1")).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!((claimed[0].state, claimed[0].attempt), (JobState::Active, 1));
    assert_eq!(claimed[0].run().worker_id.as_deref(), Some("w1"));
    let other = jobs.ack(NOW + 20, id, None, Some("w2")).await.unwrap_err();
    assert!(matches!(other, EngineError::Conflict { reason: ConflictReason::NotOwner, .. }), "{other:?}");
    assert!(jobs.claim(NOW + 20, &fetch(&["mail"], 10, "w2")).await.unwrap().is_empty(), "held jobs are not claimed");

    // Acked: completed with its result, moved to the history; a second ack is refused.
    let acked = jobs.ack(NOW + 30, id, Some(r#"{"sent":true}"#.into()), Some("w1")).await.unwrap();
    assert_eq!(acked.state, JobState::Completed);
    assert_eq!(acked.run().result.as_deref(), Some(r#"{"sent":true}"#));
    let read = jobs.job(id).await.unwrap().unwrap();
    assert_eq!((read.state, read.run().completed_at), (JobState::Completed, Some(NOW + 30)));
    let again = jobs.ack(NOW + 40, id, None, Some("w1")).await.unwrap_err();
    assert!(
        matches!(
            again,
            EngineError::Conflict { current_state: JobState::Completed, reason: ConflictReason::NotActive, .. }
        ),
        "{again:?}"
    );
    let client = pool.get().await.unwrap();
    let (hot, history): (i64, i64) = {
        let row = client
            .query_one("SELECT (SELECT count(*) FROM svc_jobs), (SELECT count(*) FROM svc_job_history)", &[])
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((hot, history), (0, 1), "a finished job leaves the hot table");

    // Failures follow the retry policy: retryable, due again after the delay,
    // then discarded once the attempts are used up.
    let policy = RetryPolicy { max_attempts: 2, initial_interval_ms: 1_000, jitter: false, ..RetryPolicy::default() };
    let id = jobs.enqueue(NOW, vec![new_job(JobBuilder::new("flaky").retry(&policy))]).await.unwrap()[0].job.id;
    jobs.claim(NOW, &fetch(&["default"], 1, "w1")).await.unwrap();
    let failed = jobs.fail(NOW + 100, id, FailureReport::server("boom", "it broke"), false, Some("w1")).await.unwrap();
    assert_eq!(failed.state, JobState::Retryable);
    assert_eq!(failed.run().retry_at, Some(NOW + 1_100));
    assert_eq!(failed.run().error.as_ref().map(|error| error.code.as_str()), Some("boom"));
    assert_eq!(jobs.promote_due(NOW + 1_099, 100).await.unwrap(), 0, "not due yet");
    assert_eq!(jobs.promote_due(NOW + 1_100, 100).await.unwrap(), 1);
    let claimed = jobs.claim(NOW + 1_200, &fetch(&["default"], 1, "w1")).await.unwrap();
    assert_eq!((claimed[0].id, claimed[0].attempt), (id, 2));
    let discarded = jobs.fail(NOW + 1_300, id, FailureReport::server("boom", "again"), false, None).await.unwrap();
    assert_eq!(discarded.state, JobState::Discarded);
    assert_eq!(jobs.job(id).await.unwrap().unwrap().run().errors.len(), 2, "both errors are kept");

    // A nack with requeue gives the job back without counting the attempt.
    let id = jobs.enqueue(NOW, vec![new_job(JobBuilder::new("again"))]).await.unwrap()[0].job.id;
    jobs.claim(NOW, &fetch(&["default"], 1, "w1")).await.unwrap();
    let requeued = jobs.fail(NOW + 5, id, FailureReport::server("shutdown", "bye"), true, Some("w1")).await.unwrap();
    assert_eq!((requeued.state, requeued.attempt), (JobState::Available, 0));

    // Cancel: available or active jobs end; cancelled again is answered as
    // it is; a completed job is refused; an unknown one is not found.
    let cancelled = jobs.cancel(NOW + 10, id).await.unwrap();
    assert_eq!((cancelled.previous_state, cancelled.job.state), (JobState::Available, JobState::Cancelled));
    let again = jobs.cancel(NOW + 20, id).await.unwrap();
    assert_eq!((again.previous_state, again.job.state), (JobState::Cancelled, JobState::Cancelled));
    let completed = enqueued[0].job.id;
    assert!(matches!(jobs.cancel(NOW, completed).await.unwrap_err(), EngineError::Conflict { .. }));
    let unknown = JobId::parse("0190a8a2-8f6e-7c3b-9a1d-1234567890ab").unwrap();
    assert!(matches!(jobs.cancel(NOW, unknown).await.unwrap_err(), EngineError::NotFound { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_follow_priority_then_time_and_skip_paused_queues() {
    let server = TempPostgres::start();
    let (jobs, pool) = store(&server, "claim_order").await;
    let mut ids = Vec::new();
    for (offset, priority) in [(0, 0), (1, 5), (2, 0), (3, 5)] {
        let job = new_job(JobBuilder::new("t").priority(priority));
        ids.push(jobs.enqueue(NOW + offset, vec![job]).await.unwrap()[0].job.id);
    }
    // A scheduled job waits for its time; a batch is stored whole.
    let later = new_job(JobBuilder::new("later").queue("other"));
    let batch = jobs.enqueue(NOW, vec![later, new_job(JobBuilder::new("now").queue("other"))]).await.unwrap();
    assert_eq!(batch.len(), 2);

    let order: Vec<JobId> =
        jobs.claim(NOW + 10, &fetch(&["default"], 10, "w")).await.unwrap().iter().map(|job| job.id).collect();
    assert_eq!(order, vec![ids[1], ids[3], ids[0], ids[2]], "priority first, then first in");

    // A paused queue takes no new jobs and hands none out.
    pool.get()
        .await
        .unwrap()
        .execute("INSERT INTO svc_queues (name, paused) VALUES ('other', true) ON CONFLICT (name) DO UPDATE SET paused = true", &[])
        .await
        .unwrap();
    assert!(jobs.claim(NOW + 20, &fetch(&["other"], 10, "w")).await.unwrap().is_empty());
    let refused = jobs.enqueue(NOW, vec![new_job(JobBuilder::new("t").queue("other"))]).await.unwrap_err();
    assert!(matches!(refused, EngineError::QueuePaused { ref queue, .. } if queue == "other"), "{refused:?}");

    // A client id in use, in flight or finished, is refused, and the batch with it.
    let taken = ids[0];
    let duplicate = jobs
        .enqueue(NOW, vec![new_job(JobBuilder::new("fresh")), new_job(JobBuilder::new("t").id(taken))])
        .await
        .unwrap_err();
    assert!(matches!(duplicate, EngineError::Duplicate { id, index: Some(1) } if id == taken), "{duplicate:?}");
    let count: i64 = pool.get().await.unwrap().query_one("SELECT count(*) FROM svc_jobs", &[]).await.unwrap().get(0);
    assert_eq!(count, 6, "nothing of the refused batch was stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claimers_on_several_nodes_never_take_the_same_job() {
    let server = TempPostgres::start();
    let url = server.database("shared");
    let (first, _) = (PgJobs::new(open(&PgSettings::new(url.clone())).await.unwrap()), ());
    let total = 600;
    let batch: Vec<NewJob> = (0..total).map(|n| new_job(JobBuilder::new("work").args([n]))).collect();
    let enqueued: HashSet<JobId> = first.enqueue(NOW, batch).await.unwrap().iter().map(|done| done.job.id).collect();

    // Three nodes, each its own pool, four claimers each, small claims.
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(Arc::new(PgJobs::new(open(&PgSettings::new(url.clone())).await.unwrap())));
    }
    let mut claimers = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        for c in 0..4 {
            let node = node.clone();
            let worker = format!("node{n}-worker{c}");
            claimers.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let claimed = node.claim(NOW, &fetch(&["default"], 7, &worker)).await.expect("claims work");
                    if claimed.is_empty() {
                        return mine;
                    }
                    for job in claimed {
                        node.ack(NOW + 1, job.id, None, Some(&worker)).await.expect("the holder acks");
                        mine.push(job.id);
                    }
                }
            }));
        }
    }
    let mut seen = HashSet::new();
    for claimer in claimers {
        for id in claimer.await.unwrap() {
            assert!(seen.insert(id), "job {id} was handed out twice");
        }
    }
    assert_eq!(seen, enqueued, "every job was claimed once, none lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_nodes_claims_run_out_onto_the_others_and_one_node_leads() {
    use svc::backend::postgres::LeaderLease;
    let server = TempPostgres::start();
    let url = server.database("failover");
    let (a, b) = (open(&PgSettings::new(url.clone())).await.unwrap(), open(&PgSettings::new(url)).await.unwrap());
    let (node_a, node_b) = (PgJobs::new(a.clone()), PgJobs::new(b.clone()));

    // One leader at a time; the other takes over once the lease runs out
    // unrenewed, or at once when the holder gives it up.
    let (lead_a, lead_b) =
        (LeaderLease::new(a, "timers", "node-a", 20_000), LeaderLease::new(b, "timers", "node-b", 20_000));
    assert!(lead_a.hold(NOW).await.unwrap());
    assert!(!lead_b.hold(NOW + 1).await.unwrap(), "held by node a");
    assert!(lead_a.hold(NOW + 10_000).await.unwrap(), "renewed");
    assert!(!lead_b.hold(NOW + 29_999).await.unwrap(), "the renewal counts from then");
    assert!(lead_b.hold(NOW + 30_000).await.unwrap(), "node a stopped renewing: node b leads");
    assert!(!lead_a.hold(NOW + 30_001).await.unwrap());
    lead_b.release().await.unwrap();
    assert!(lead_a.hold(NOW + 30_002).await.unwrap(), "given up, taken at once");

    // Node a claims jobs and dies holding them (visibility 5 s, execution 60 s).
    let batch: Vec<NewJob> = (0..3).map(|n| new_job(JobBuilder::new("work").args([n]))).collect();
    node_a.enqueue(NOW, batch).await.unwrap();
    let mut request = fetch(&["default"], 10, "a-worker");
    request.visibility_timeout_ms = Some(5_000);
    let held: Vec<JobId> = node_a.claim(NOW, &request).await.unwrap().iter().map(|job| job.id).collect();
    assert_eq!(held.len(), 3);
    // A heartbeat for one job keeps it; the others run out on node b's watch.
    let (extended, not) = node_a.extend_claims(NOW + 4_000, "a-worker", Some(&held[..1]), None).await.unwrap();
    assert_eq!((extended, not.len()), (1, 0));
    assert_eq!(node_b.expire_claims(NOW + 4_999, 100).await.unwrap(), 0, "nothing ran out yet");
    assert_eq!(node_b.expire_claims(NOW + 5_000, 100).await.unwrap(), 2);
    let taken = node_b.claim(NOW + 5_001, &fetch(&["default"], 10, "b-worker")).await.unwrap();
    let taken_ids: HashSet<JobId> = taken.iter().map(|job| job.id).collect();
    assert_eq!(taken_ids, held[1..].iter().copied().collect(), "the two lapsed jobs, not the extended one");
    assert!(taken.iter().all(|job| job.attempt == 2), "the lost attempt counts");
    let lapsed = node_b.job(held[1]).await.unwrap().unwrap();
    assert_eq!(lapsed.run().errors[0].report.code, "visibility_timeout");
    // The dead node's late ack is refused: the job is another worker's now.
    let late = node_a.ack(NOW + 6_000, held[1], None, Some("a-worker")).await.unwrap_err();
    assert!(matches!(late, EngineError::Conflict { reason: ConflictReason::NotOwner, .. }), "{late:?}");
    // The extended job runs out later, at its renewed deadline.
    assert_eq!(node_b.expire_claims(NOW + 8_999, 100).await.unwrap(), 0);
    assert_eq!(node_b.expire_claims(NOW + 9_000, 100).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_fetch_is_woken_by_a_job_enqueued_on_another_node() {
    use std::time::{Duration, Instant};
    use svc::backend::postgres::RECHECK_INTERVAL;
    let server = TempPostgres::start();
    let settings = PgSettings::new(server.database("wakeups"));
    let waiting_node = Arc::new(PgJobs::new(open(&settings).await.unwrap()));
    let listener = waiting_node.listen(&settings).unwrap();
    let other_node = PgJobs::new(open(&settings).await.unwrap());
    while !waiting_node.listening() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let now = || NOW;

    // Nothing to claim: the fetch waits, then answers empty.
    let started = Instant::now();
    let empty = waiting_node.claim_waiting(&now, &fetch(&["mail"], 1, "w"), Duration::from_millis(300)).await.unwrap();
    assert!(empty.is_empty() && started.elapsed() >= Duration::from_millis(300));

    // A job enqueued on the other node wakes it, long before it would have
    // looked again by itself.
    let waiter = waiting_node.clone();
    let fetch_task = tokio::spawn(async move {
        let claimed = waiter.claim_waiting(&now, &fetch(&["mail"], 1, "w"), Duration::from_secs(30)).await.unwrap();
        (claimed, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let enqueued_at = Instant::now();
    let id = other_node.enqueue(NOW, vec![new_job(JobBuilder::new("t").queue("mail"))]).await.unwrap()[0].job.id;
    let (claimed, woken_at) = fetch_task.await.unwrap();
    assert_eq!(claimed.iter().map(|job| job.id).collect::<Vec<_>>(), vec![id]);
    // Its own look would come RECHECK_INTERVAL after it began to wait, 1.7 s
    // after the enqueue: woken sooner, it was the notification.
    assert_eq!(RECHECK_INTERVAL, Duration::from_secs(2));
    assert!(woken_at.duration_since(enqueued_at) < Duration::from_secs(1), "woken by the notification");

    // Without a listening connection, a waiting fetch still finds the job, by polling.
    listener.abort();
    let polling = Arc::new(PgJobs::new(open(&settings).await.unwrap()));
    assert!(!polling.listening());
    let waiter = polling.clone();
    let fetch_task =
        tokio::spawn(
            async move { waiter.claim_waiting(&now, &fetch(&["mail"], 1, "w"), Duration::from_secs(30)).await },
        );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let id = other_node.enqueue(NOW, vec![new_job(JobBuilder::new("t").queue("mail"))]).await.unwrap()[0].job.id;
    let claimed = fetch_task.await.unwrap().unwrap();
    assert_eq!(claimed.iter().map(|job| job.id).collect::<Vec<_>>(), vec![id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_change_writes_its_events_and_the_newest_are_kept() {
    use svc::backend::EventFilter;
    let server = TempPostgres::start();
    let (jobs, _pool) = store(&server, "events").await;
    let id = jobs.enqueue(NOW, vec![new_job(JobBuilder::new("email.send").queue("mail"))]).await.unwrap()[0].job.id;
    jobs.claim(NOW + 1, &fetch(&["mail"], 1, "w")).await.unwrap();
    jobs.fail(NOW + 2, id, FailureReport::server("boom", "broke"), false, Some("w")).await.unwrap();
    let page = jobs.events_page(None, 100, &EventFilter::default()).await.unwrap();
    let types: Vec<&str> = page.events.iter().map(|event| event.kind.type_name()).collect();
    assert_eq!(types, ["job.enqueued", "job.started", "job.failed", "job.retrying"]);
    assert!(page.events.iter().all(|event| event.job.as_ref().is_some_and(|job| job.id == id)));
    assert_eq!(page.events[2].job.as_ref().unwrap().state, JobState::Retryable, "the job as after the change");
    assert!(!page.has_more && !page.gap);

    // Paging by cursor, and filtering by type.
    let first = jobs.events_page(None, 1, &EventFilter::default()).await.unwrap();
    assert!(first.has_more);
    let cursor = first.events[0].id.to_string();
    let rest = jobs.events_page(Some(&cursor), 100, &EventFilter::default()).await.unwrap();
    assert_eq!(rest.events.len(), 3);
    let filter = EventFilter { types: Some(vec!["job.retrying".into()]), ..EventFilter::default() };
    let retrying = jobs.events_page(None, 100, &filter).await.unwrap();
    assert_eq!(retrying.events.len(), 1);

    // The newest 10 000 are kept; a cursor older than those reports a gap.
    let batch: Vec<NewJob> = (0..10_000).map(|n| new_job(JobBuilder::new("bulk").args([n]))).collect();
    jobs.enqueue(NOW + 3, batch).await.unwrap();
    // Only events already matched to webhook subscriptions go (the leader
    // matches them before it prunes).
    assert_eq!(jobs.prune_events().await.unwrap(), 0, "events not yet matched stay");
    let mut matching = svc::backend::postgres::Matching::default();
    while jobs.match_events(NOW + 3, &mut matching).await.unwrap().events > 0 {}
    assert_eq!(jobs.prune_events().await.unwrap(), 4);
    let after_pruning = jobs.events_page(Some(&cursor), 10, &EventFilter::default()).await.unwrap();
    assert!(after_pruning.gap, "events after the cursor were pruned");
    assert_eq!(after_pruning.events.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_render_as_with_the_whole_job_without_storing_its_args_again() {
    use svc::backend::EventFilter;
    let server = TempPostgres::start();
    let (jobs, pool) = store(&server, "event_bodies").await;
    let large = "x".repeat(32 * 1024);
    let plain =
        JobBuilder::new("report.build").queue("reports").args([&large]).meta(serde_json::json!({"tenant": large}));
    let traced =
        JobBuilder::new("report.build").queue("reports").args([&large]).meta(serde_json::json!({"trace_id": "t-1"}));
    let enqueued = jobs.enqueue(NOW, vec![new_job(plain), new_job(traced)]).await.unwrap();
    let (plain_id, traced_id) = (enqueued[0].job.id, enqueued[1].job.id);
    let claimed = jobs.claim(NOW + 1, &fetch(&["reports"], 2, "w")).await.unwrap();
    assert_eq!(claimed.len(), 2);
    let mut acked = Vec::new();
    for id in [plain_id, traced_id] {
        acked.push(jobs.ack(NOW + 2, id, Some(r#"{"pages":3}"#.into()), Some("w")).await.unwrap());
    }

    // The job keeps its arguments; its enqueue and ack events do not hold them again.
    assert_eq!(jobs.job(plain_id).await.unwrap().unwrap().payload.args().len(), large.len() + 4);
    let client = pool.get().await.unwrap();
    let rows = client
        .query("SELECT type, length(body) FROM svc_events WHERE type <> 'job.started' ORDER BY id", &[])
        .await
        .unwrap();
    let sizes: Vec<(String, i32)> = rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    // The two `job.enqueued` events of the batch share a row.
    assert_eq!(sizes.len(), 3, "{sizes:?}");
    assert!(sizes.iter().all(|(_, bytes)| *bytes < 4096), "events hold a job's arguments again: {sizes:?}");

    // Each event renders exactly as it does with the whole job, as the
    // change answered it: the trace id and the result included.
    let page = jobs.events_page(None, 100, &EventFilter::default()).await.unwrap();
    assert_eq!(page.events.len(), 6);
    for event in &page.events {
        let of = event.job.as_ref().expect("a job event").id;
        let answered = match event.kind.type_name() {
            "job.enqueued" => enqueued.iter().map(|enqueued| &enqueued.job).find(|job| job.id == of),
            "job.started" => claimed.iter().find(|job| job.id == of),
            "job.completed" => acked.iter().find(|job| job.id == of),
            other => panic!("unexpected {other}"),
        };
        let whole = svc::engine::Event { job: answered.cloned(), ..event.clone() };
        let rendered = svc::engine::render_event(event);
        assert_eq!(rendered, svc::engine::render_event(&whole), "{}", event.kind.type_name());
        let data = &serde_json::from_str::<serde_json::Value>(&rendered).unwrap()["data"];
        let trace_id = (of == traced_id).then_some("t-1");
        assert_eq!(data["trace_id"].as_str(), trace_id, "{rendered}");
        if event.kind.type_name() == "job.completed" {
            assert_eq!(data["result"], serde_json::json!({"pages": 3}));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batchs_enqueued_events_share_rows_and_read_back_one_by_one() {
    use svc::backend::EventFilter;
    let server = TempPostgres::start();
    let (jobs, pool) = store(&server, "event_runs").await;
    // 700 jobs of one type, then one of another type amid 299 more of the first.
    let batch = |types: &dyn Fn(usize) -> &'static str| -> Vec<NewJob> {
        (0..700).map(|n| new_job(JobBuilder::new(types(n)).queue("bulk").args([n]))).collect()
    };
    let mut enqueued = jobs.enqueue(NOW, batch(&|_| "a")).await.unwrap();
    enqueued.extend(jobs.enqueue(NOW + 1, batch(&|n| if n == 350 { "b" } else { "a" })).await.unwrap());
    let single = jobs.enqueue(NOW + 2, vec![new_job(JobBuilder::new("a").queue("bulk"))]).await.unwrap();
    enqueued.extend(single);
    let order: Vec<JobId> = enqueued.iter().map(|enqueued| enqueued.job.id).collect();

    // A handful of rows hold all 1 401 events.
    let client = pool.get().await.unwrap();
    let row = client.query_one("SELECT count(*), sum(members)::int8 FROM svc_events", &[]).await.unwrap();
    let (rows, events): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(events, 1401);
    assert!(rows <= 12, "{rows} rows");

    // Paged seven at a time, each event once, in the order enqueued, ids rising.
    let (mut seen, mut cursor) = (Vec::new(), None::<String>);
    loop {
        let page = jobs.events_page(cursor.as_deref(), 7, &EventFilter::default()).await.unwrap();
        assert!(!page.gap);
        for event in &page.events {
            assert_eq!(event.kind.type_name(), "job.enqueued");
            let job = event.job.as_ref().expect("each event holds its job");
            let enqueued = enqueued.iter().find(|enqueued| enqueued.job.id == job.id).unwrap();
            assert_eq!(svc::engine::render_event(event), {
                let whole = svc::engine::Event { job: Some(enqueued.job.clone()), ..event.clone() };
                svc::engine::render_event(&whole)
            });
            seen.push((event.id, job.id));
        }
        cursor = page.events.last().map(|event| event.id.to_string());
        if !page.has_more {
            break;
        }
    }
    assert_eq!(seen.iter().map(|(_, job)| *job).collect::<Vec<_>>(), order);
    assert!(seen.windows(2).all(|pair| pair[0].0.0 < pair[1].0.0), "event ids rise");
    // From a cursor inside a run: the rest of that run follows.
    let middle = seen[500].0.to_string();
    let rest = jobs.events_page(Some(&middle), 3, &EventFilter::default()).await.unwrap();
    let next: Vec<JobId> = rest.events.iter().map(|event| event.job.as_ref().unwrap().id).collect();
    assert_eq!(next, order[501..504]);
    // From each run's last two events: its last, then the next row's first.
    let runs = client.query("SELECT members FROM svc_events ORDER BY id", &[]).await.unwrap();
    let mut end = 0;
    for members in runs.iter().map(|row| row.get::<_, i32>(0) as usize) {
        end += members;
        for cursor in [end.saturating_sub(2), end - 1] {
            let page = jobs.events_page(Some(&seen[cursor].0.to_string()), 1, &EventFilter::default()).await.unwrap();
            assert_eq!(page.events.first().map(|event| event.id), seen.get(cursor + 1).map(|(id, _)| *id));
        }
    }
    assert_eq!(end, seen.len());
    let of_type_b = EventFilter { job_types: Some(vec!["b".into()]), ..EventFilter::default() };
    let found = jobs.events_page(None, 10, &of_type_b).await.unwrap();
    assert_eq!(found.events.iter().map(|event| event.job.as_ref().unwrap().id).collect::<Vec<_>>(), [order[1050]]);

    // Matched in passes of whole rows, each at most 1 000 events, every event once.
    let mut matching = svc::backend::postgres::Matching::default();
    let mut passes = Vec::new();
    loop {
        let pass = jobs.match_events(NOW + 3, &mut matching).await.unwrap();
        if pass.events == 0 {
            break;
        }
        passes.push(pass.events);
    }
    assert_eq!(passes.iter().sum::<usize>(), 1401, "{passes:?}");
    assert!(passes.iter().all(|events| *events <= 1000), "{passes:?}");
}

/// Enqueues 10 500 jobs of type "a" (and so as many `job.enqueued`
/// events), more than a page looks at, then one of type "b"; answers its id.
async fn past_a_page_then_b(jobs: &PgJobs) -> JobId {
    for batch in 0..15 {
        let jobs_a = (0..700).map(|n| new_job(JobBuilder::new("a").queue("bulk").args([n]))).collect();
        jobs.enqueue(NOW + batch, jobs_a).await.unwrap();
    }
    jobs.enqueue(NOW + 15, vec![new_job(JobBuilder::new("b").queue("bulk"))]).await.unwrap()[0].job.id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_listing_goes_on_past_more_events_than_a_page_looks_at() {
    use svc::backend::EventFilter;
    let server = TempPostgres::start();
    let (jobs, _pool) = store(&server, "event_scan").await;
    // More events of type "a" than one page looks at (10 000), then one "b".
    let b = past_a_page_then_b(&jobs).await;

    // The first page finds nothing yet, and says where to go on; following
    // it finds the one event, and the listing ends.
    let of_type_b = EventFilter { job_types: Some(vec!["b".into()]), ..EventFilter::default() };
    let first = jobs.events_page(None, 10, &of_type_b).await.unwrap();
    assert!(first.events.is_empty() && first.has_more);
    let go_on = first.scanned_to.expect("a page that stopped early says where it stopped").to_string();
    let second = jobs.events_page(Some(&go_on), 10, &of_type_b).await.unwrap();
    let found: Vec<JobId> = second.events.iter().map(|event| event.job.as_ref().unwrap().id).collect();
    assert_eq!(found, [b]);
    assert!(!second.has_more);
    assert_eq!(second.next_after(), Some(second.events[0].id), "the newest event, looked at last");
    // Unfiltered, a full page stops where its last event is.
    let all = jobs.events_page(None, 10, &EventFilter::default()).await.unwrap();
    assert_eq!(all.scanned_to, all.events.last().map(|event| event.id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_search_looks_at_no_more_than_its_budget_whatever_the_filters() {
    use svc::backend::postgres::SCAN_BUDGET;
    use svc::engine::JobFilter;
    let server = TempPostgres::start();
    let (jobs, _pool) = store(&server, "job_scan").await;
    // 10 500 jobs of type "a", then one "b".
    let b = past_a_page_then_b(&jobs).await;
    let total = 15 * 700 + 1;

    // Filtered by type in SQL, pages still count (and stop at) what they
    // look at: every job once over the pages, and the one "b" found.
    let (mut found, mut from, mut scanned) = (Vec::new(), None, Vec::new());
    loop {
        let page = jobs.jobs_page(&JobFilter::all().job_type("b"), from, 10).await.unwrap();
        assert!(page.scanned <= SCAN_BUDGET, "{} rows looked at", page.scanned);
        scanned.push(page.scanned);
        found.extend(page.jobs.iter().map(|job| job.id));
        match page.next {
            Some(next) => from = Some(next),
            None => break,
        }
    }
    assert_eq!(found, [b]);
    assert_eq!(scanned.iter().sum::<usize>(), total, "{scanned:?}");
    // Unfiltered, a page of ten looks at one job more than it shows.
    let first = jobs.jobs_page(&JobFilter::all(), None, 10).await.unwrap();
    assert_eq!(first.jobs.len(), 10);
    assert!(first.next.is_some() && first.scanned == 11, "{}", first.scanned);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dead_letter_listing_pages_retries_and_deletes() {
    let server = TempPostgres::start();
    let (jobs, _pool) = store(&server, "dead_letter").await;
    let once = RetryPolicy { max_attempts: 1, ..RetryPolicy::default() };
    let mut dead = Vec::new();
    for n in 0..3 {
        let id = jobs.enqueue(NOW, vec![new_job(JobBuilder::new("t").retry(&once))]).await.unwrap()[0].job.id;
        jobs.claim(NOW, &fetch(&["default"], 1, "w")).await.unwrap();
        let failed =
            jobs.fail(NOW + 10 * (n + 1), id, FailureReport::server("boom", "broke"), false, None).await.unwrap();
        assert_eq!(failed.state, JobState::Discarded);
        dead.push(id);
    }
    assert_eq!(jobs.dead_letter_count(None).await.unwrap(), 3);
    assert_eq!(jobs.dead_letter_count(Some("other")).await.unwrap(), 0);
    // Newest first, two to a page.
    let (page, next) = jobs.dead_letter_page(None, 2, None).await.unwrap();
    assert_eq!(page.iter().map(|job| job.id).collect::<Vec<_>>(), vec![dead[2], dead[1]]);
    let (rest, last) = jobs.dead_letter_page(next, 2, None).await.unwrap();
    assert_eq!((rest.iter().map(|job| job.id).collect::<Vec<_>>(), last.is_none()), (vec![dead[0]], true));

    // Retried: available again as a fresh run, its errors kept.
    let revived = jobs.dead_letter_retry(NOW + 100, dead[0]).await.unwrap();
    assert_eq!((revived.state, revived.attempt, revived.run().errors.len()), (JobState::Available, 0, 1));
    assert_eq!(jobs.claim(NOW + 101, &fetch(&["default"], 5, "w")).await.unwrap()[0].id, dead[0]);
    // Deleted: gone for good.
    jobs.dead_letter_delete(NOW + 102, dead[1]).await.unwrap();
    assert!(jobs.job(dead[1]).await.unwrap().is_none());
    assert_eq!(jobs.dead_letter_count(None).await.unwrap(), 1);
    for refused in [
        jobs.dead_letter_delete(NOW, dead[1]).await.unwrap_err(),
        jobs.dead_letter_retry(NOW, dead[0]).await.unwrap_err(),
    ] {
        assert!(matches!(refused, EngineError::NotInDeadLetter { .. }), "{refused:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_expiry_is_discarded_not_handed_out() {
    use svc::backend::EventFilter;
    let server = TempPostgres::start();
    let (jobs, _pool) = store(&server, "expiry").await;
    let id = jobs.enqueue(NOW, vec![new_job(JobBuilder::new("t").expires_at(NOW + 100))]).await.unwrap()[0].job.id;
    let also = jobs.enqueue(NOW, vec![new_job(JobBuilder::new("t").expires_at(NOW + 100))]).await.unwrap()[0].job.id;
    let fresh = jobs.enqueue(NOW, vec![new_job(JobBuilder::new("t"))]).await.unwrap()[0].job.id;
    // Asked for two, the claim passes over the two expired jobs ahead and
    // still finds the one that may go.
    let claimed = jobs.claim(NOW + 100, &fetch(&["default"], 2, "w")).await.unwrap();
    assert_eq!(claimed.iter().map(|job| job.id).collect::<Vec<_>>(), vec![fresh]);
    assert_eq!(jobs.job(also).await.unwrap().unwrap().state, JobState::Discarded);
    let expired = jobs.job(id).await.unwrap().unwrap();
    assert_eq!(expired.state, JobState::Discarded);
    assert_eq!(expired.run().error.as_ref().unwrap().code, "expired");
    let filter = EventFilter { types: Some(vec!["job.expired".into(), "job.discarded".into()]), ..Default::default() };
    assert_eq!(jobs.events_page(None, 10, &filter).await.unwrap().events.len(), 4);
    assert_eq!(jobs.dead_letter_count(None).await.unwrap(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_job_waits_for_its_activation() {
    let server = TempPostgres::start();
    let (jobs, _pool) = store(&server, "staged").await;
    let staged = || JobBuilder::new("report.build").args([1]).queue("staged").pending();
    let enqueued = jobs.enqueue(NOW, vec![new_job(staged()), new_job(staged().scheduled_at(NOW + 60_000))]).await;
    let [now, later] = [0, 1].map(|n| enqueued.as_ref().unwrap()[n].job.id);
    assert_eq!(jobs.job(now).await.unwrap().unwrap().state, JobState::Pending);
    assert!(jobs.claim(NOW + 1, &fetch(&["staged"], 10, "w")).await.unwrap().is_empty(), "not handed out");

    let activated = jobs.activate(NOW + 5, now).await.unwrap();
    assert_eq!((activated.state, activated.activated_at()), (JobState::Available, Some(NOW + 5)));
    let again = jobs.activate(NOW + 6, now).await.unwrap_err();
    assert!(
        matches!(
            again,
            EngineError::Conflict { current_state: JobState::Available, reason: ConflictReason::NotPending, .. }
        ),
        "{again:?}"
    );
    assert_eq!(jobs.activate(NOW + 6, later).await.unwrap().state, JobState::Scheduled, "its time has not come");
    let claimed = jobs.claim(NOW + 7, &fetch(&["staged"], 10, "w")).await.unwrap();
    assert_eq!(claimed.iter().map(|job| job.id).collect::<Vec<_>>(), [now]);
    jobs.promote_due(NOW + 60_000, 10).await.unwrap();
    assert_eq!(jobs.claim(NOW + 60_001, &fetch(&["staged"], 10, "w")).await.unwrap()[0].id, later);

    let unknown = JobId::parse("019539a4-0000-7000-8000-000000000000").unwrap();
    assert!(matches!(jobs.activate(NOW, unknown).await, Err(EngineError::NotFound { .. })));
    jobs.ack(NOW + 8, now, None, Some("w")).await.unwrap();
    let finished = jobs.activate(NOW + 9, now).await.unwrap_err();
    assert!(matches!(finished, EngineError::Conflict { current_state: JobState::Completed, .. }), "{finished:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unique_fingerprint_is_held_once_across_nodes_and_within_its_period() {
    use svc::job::UniquePolicy;
    let server = TempPostgres::start();
    let url = server.database("unique_nodes");
    let node = || async { PgJobs::new(open(&PgSettings::new(url.as_str())).await.unwrap()) };
    let (a, b) = (Arc::new(node().await), Arc::new(node().await));
    let once = || new_job(JobBuilder::new("report.build").args(["r-1"]).queue("u").unique(UniquePolicy::default()));

    // Twenty enqueues of one fingerprint at once, ten through each node: one is stored.
    let mut racing = Vec::new();
    for n in 0..20 {
        let store = if n % 2 == 0 { a.clone() } else { b.clone() };
        let job = once();
        racing.push(tokio::spawn(async move { store.enqueue(NOW, vec![job]).await }));
    }
    let (mut stored, mut refused) = (Vec::new(), 0);
    for outcome in racing {
        match outcome.await.unwrap() {
            Ok(enqueued) => stored.push(enqueued[0].job.id),
            Err(EngineError::UniqueConflict { existing, .. }) => {
                refused += 1;
                assert!(stored.is_empty() || stored[0] == existing);
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!((stored.len(), refused), (1, 19));
    assert_eq!(a.claim(NOW, &fetch(&["u"], 10, "w")).await.unwrap().len(), 1);

    // A period: the holder blocks for a minute after its enqueue; a
    // cancelled one blocks nothing.
    let policy = UniquePolicy { period_ms: Some(60_000), ..UniquePolicy::default() };
    let timed = || new_job(JobBuilder::new("digest").args([1]).queue("p").unique(policy.clone()));
    let first = a.enqueue(NOW, vec![timed()]).await.unwrap()[0].job.id;
    let blocked = b.enqueue(NOW + 59_999, vec![timed()]).await.unwrap_err();
    assert!(matches!(blocked, EngineError::UniqueConflict { existing, .. } if existing == first), "{blocked:?}");
    let second = b.enqueue(NOW + 60_000, vec![timed()]).await.unwrap()[0].job.id;
    a.cancel(NOW + 60_001, second).await.unwrap();
    assert!(b.enqueue(NOW + 60_002, vec![timed()]).await.is_ok(), "a cancelled holder frees its fingerprint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_never_claimed_are_discarded_when_they_expire() {
    let server = TempPostgres::start();
    let (jobs, _pool) = store(&server, "expiry").await;
    let expiring = |builder: JobBuilder| new_job(builder.queue("x").expires_at(NOW + 1_000));
    let enqueued = jobs
        .enqueue(NOW, vec![expiring(JobBuilder::new("a")), expiring(JobBuilder::new("b").pending())])
        .await
        .unwrap();
    let lasting = jobs.enqueue(NOW, vec![new_job(JobBuilder::new("c").queue("x"))]).await.unwrap()[0].job.id;

    assert_eq!(jobs.expire_due(NOW + 999, 100).await.unwrap(), 0, "not yet");
    assert_eq!(jobs.expire_due(NOW + 1_000, 100).await.unwrap(), 2);
    for enqueued in &enqueued {
        let job = jobs.job(enqueued.job.id).await.unwrap().unwrap();
        assert_eq!(job.state, JobState::Discarded, "available and staged jobs alike");
        assert_eq!(job.run().error.as_ref().map(|error| error.code.as_str()), Some("expired"));
    }
    assert_eq!(jobs.job(lasting).await.unwrap().unwrap().state, JobState::Available);
}
