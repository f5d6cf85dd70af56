//! Queues, workers and progress on the PostgreSQL backend, against a real
//! PostgreSQL server of the test's own: listing and figures, pausing and
//! resuming, backpressure (also with enqueues from two nodes at once), the
//! overview and the throughput history, the worker registry and its
//! signals, and a worker's progress reports.

mod common;

use std::sync::Arc;

use common::postgres::TempPostgres;
use svc::backend::EventFilter;
use svc::backend::postgres::{PgJobs, PgSettings, open};
use svc::engine::{Backpressure, ConflictReason, EngineError, FetchRequest, WorkerSignal, WorkerState};
use svc::job::{JobBuilder, JobDefaults, JobProgress, JobState, NewJob};

const NOW: i64 = 1_800_000_000_000;

fn job(queue: &str) -> NewJob {
    JobBuilder::new("work.item").args([1]).queue(queue).build(&JobDefaults::default()).unwrap()
}

fn fetch(queue: &str, count: usize, worker: &str) -> FetchRequest {
    FetchRequest {
        queues: vec![queue.to_string()],
        count,
        worker_id: Some(worker.to_string()),
        visibility_timeout_ms: None,
    }
}

async fn store(server: &TempPostgres, database: &str) -> (Arc<PgJobs>, deadpool_postgres::Pool) {
    let pool = open(&PgSettings::new(server.database(database))).await.expect("the schema migrates");
    (Arc::new(PgJobs::new(pool.clone())), pool)
}

async fn event_types(jobs: &PgJobs) -> Vec<String> {
    let page = jobs.events_page(None, 1000, &EventFilter::default()).await.unwrap();
    page.events.iter().map(|event| event.kind.type_name().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_are_listed_with_their_figures() {
    let server = TempPostgres::start();
    let (jobs, _pool) = store(&server, "figures").await;
    jobs.enqueue(NOW, vec![job("beta"), job("beta"), job("beta")]).await.unwrap();
    jobs.enqueue(NOW, vec![job("alpha")]).await.unwrap();
    let claimed = jobs.claim(NOW + 1, &fetch("beta", 2, "w")).await.unwrap();
    jobs.ack(NOW + 2, claimed[0].id, None, Some("w")).await.unwrap();

    let (first, more) = jobs.queues_page(None, 1).await.unwrap();
    assert_eq!((first.len(), first[0].name.as_str(), more), (1, "alpha", true));
    assert_eq!(first[0].count(JobState::Available), 1);
    let (rest, more) = jobs.queues_page(Some("alpha"), 10).await.unwrap();
    assert!(!more);
    let names: Vec<&str> = rest.iter().map(|queue| queue.name.as_str()).collect();
    assert_eq!(names, ["beta", "default"], "`default` is always listed, as on the local engine");
    let beta = &rest[0];
    let counts = [JobState::Available, JobState::Active, JobState::Completed].map(|state| beta.count(state));
    assert_eq!(counts, [1, 1, 1], "in flight and finished jobs both count");
    assert_eq!(beta.oldest_available_at, Some(NOW));

    let stats = jobs.queue_stats(NOW + 3, "beta").await.unwrap().expect("a known queue");
    assert_eq!((stats.completed_last_minute, stats.failed_last_minute), (1, 0));
    assert!(jobs.queue_stats(NOW + 3, "never-used").await.unwrap().is_none(), "an unknown queue has no figures");

    let overview = jobs.overview(NOW + 3).await.unwrap();
    assert_eq!((overview.queues, overview.paused_queues), (3, 0));
    assert_eq!(overview.jobs[JobState::Available.index()], 2);
    assert_eq!((overview.completed_last_minute, overview.dead_letter), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_refuses_work_and_is_skipped_until_resumed() {
    let server = TempPostgres::start();
    let (jobs, _pool) = store(&server, "paused").await;
    jobs.enqueue(NOW, vec![job("mail")]).await.unwrap();

    let summary = jobs.pause_queue(NOW + 1, "mail", true).await.unwrap();
    assert!(summary.paused);
    jobs.pause_queue(NOW + 2, "mail", true).await.unwrap();
    let refused = jobs.enqueue(NOW + 3, vec![job("other"), job("mail")]).await.unwrap_err();
    assert!(matches!(&refused, EngineError::QueuePaused { queue, index: Some(1) } if queue == "mail"), "{refused:?}");
    assert!(jobs.claim(NOW + 4, &fetch("mail", 10, "w")).await.unwrap().is_empty(), "fetches skip it");
    assert_eq!(jobs.queues_page(None, 10).await.unwrap().0.iter().filter(|q| q.paused).count(), 1);

    assert!(!jobs.pause_queue(NOW + 5, "mail", false).await.unwrap().paused);
    assert_eq!(jobs.claim(NOW + 6, &fetch("mail", 10, "w")).await.unwrap().len(), 1);
    let types = event_types(&jobs).await;
    let queue_events: Vec<_> = types.iter().filter(|kind| kind.starts_with("queue.")).collect();
    assert_eq!(queue_events, ["queue.paused", "queue.resumed"], "a second pause changed nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_bounds_a_queue_even_across_nodes() {
    let server = TempPostgres::start();
    let (jobs, pool) = store(&server, "bounded").await;
    let other_node = Arc::new(PgJobs::new(pool.clone()));

    let bad = jobs.configure_queue("q", Some(Backpressure::reject_above(0))).await.unwrap_err();
    assert!(matches!(bad, EngineError::Invalid { .. }), "{bad:?}");
    let summary = jobs.configure_queue("q", Some(Backpressure::reject_above(4).warning_at(0.5))).await.unwrap();
    assert_eq!(summary.backpressure.map(|bound| bound.max_depth), Some(4));

    let first = jobs.enqueue(NOW, vec![job("q")]).await.unwrap();
    assert_eq!(first[0].pressure, None, "1 of 4 is under the warning threshold");
    let second = jobs.enqueue(NOW, vec![job("q")]).await.unwrap();
    assert_eq!(second[0].pressure, Some(0.5));
    let full = jobs.enqueue(NOW, vec![job("q"), job("q"), job("q")]).await.unwrap_err();
    assert!(
        matches!(full, EngineError::QueueFull { depth: 4, bound: 4, index: Some(2), .. }),
        "the batch is refused whole: {full:?}"
    );
    assert_eq!(jobs.queue_stats(NOW, "q").await.unwrap().unwrap().summary.depth(), 2, "nothing of it was stored");

    // Two nodes racing for the last two places: never past the bound.
    let attempts = (0..6).map(|i| {
        let node = if i % 2 == 0 { jobs.clone() } else { other_node.clone() };
        tokio::spawn(async move { node.enqueue(NOW, vec![job("q")]).await })
    });
    let mut accepted = 0;
    for attempt in attempts {
        match attempt.await.unwrap() {
            Ok(_) => accepted += 1,
            Err(EngineError::QueueFull { .. }) => {}
            Err(other) => panic!("unexpected refusal {other:?}"),
        }
    }
    assert_eq!(accepted, 2);
    assert_eq!(jobs.queue_stats(NOW, "q").await.unwrap().unwrap().summary.depth(), 4);

    // Claimed jobs leave the depth; removing the bound lifts it.
    jobs.claim(NOW + 1, &fetch("q", 1, "w")).await.unwrap();
    jobs.enqueue(NOW + 2, vec![job("q")]).await.unwrap();
    assert!(jobs.configure_queue("q", None).await.unwrap().backpressure.is_none());
    jobs.enqueue(NOW + 3, vec![job("q"), job("q")]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_reports_progress_on_the_job_it_holds() {
    let server = TempPostgres::start();
    let (jobs, _pool) = store(&server, "progress").await;
    let id = jobs.enqueue(NOW, vec![job("p")]).await.unwrap()[0].job.id;
    let early = jobs.report_progress(NOW, id, JobProgress::new(0.1), None).await.unwrap_err();
    assert!(matches!(early, EngineError::Conflict { reason: ConflictReason::NotActive, .. }), "{early:?}");

    jobs.claim(NOW + 1, &fetch("p", 1, "w1")).await.unwrap();
    let other = jobs.report_progress(NOW + 2, id, JobProgress::new(0.2), Some("w2")).await.unwrap_err();
    assert!(matches!(other, EngineError::Conflict { reason: ConflictReason::NotOwner, .. }), "{other:?}");
    let reported = jobs.report_progress(NOW + 3, id, JobProgress::new(1.5), Some("w1")).await.unwrap();
    let progress = reported.progress().expect("the job carries its report");
    assert_eq!((progress.fraction, progress.updated_at), (1.0, NOW + 3), "clamped to 1");
    assert_eq!(jobs.job(id).await.unwrap().unwrap().progress().map(|p| p.fraction), Some(1.0));
    assert!(event_types(&jobs).await.contains(&"job.progress".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_most_workers_known_the_idle_one_seen_longest_ago_makes_room() {
    let server = TempPostgres::start();
    let (jobs, pool) = store(&server, "workers_full").await;
    // The oldest contacts: one holding a job, one holding a signal.
    jobs.note_worker(NOW, "busy", None, true).await.unwrap();
    let id = jobs.enqueue(NOW, vec![job("mail")]).await.unwrap()[0].job.id;
    jobs.claim(NOW + 1, &fetch("mail", 1, "busy")).await.unwrap();
    jobs.note_worker(NOW + 2, "signalled", None, true).await.unwrap();
    jobs.signal_worker(NOW + 3, "signalled", WorkerSignal::Quiet).await.unwrap();
    // Then as many idle workers as fill the registry, seen one after another.
    let client = pool.get().await.unwrap();
    let filler = svc::__private::limits::WORKERS_MAX as i64 - 2;
    client
        .execute(
            "INSERT INTO svc_workers (worker_id, first_seen_at, last_seen_at) \
             SELECT 'idle-' || lpad(n::text, 5, '0'), to_timestamp(($1::int8 + n)::float8 / 1000), \
               to_timestamp(($1::int8 + n)::float8 / 1000) FROM generate_series(1, $2::int8) AS n",
            &[&(NOW + 10), &filler],
        )
        .await
        .unwrap();
    let known = || async { jobs.overview(NOW + 100_000).await.unwrap().workers };
    assert_eq!(known().await, svc::__private::limits::WORKERS_MAX);

    jobs.note_worker(NOW + 100_000, "newcomer", None, true).await.unwrap();
    assert_eq!(known().await, svc::__private::limits::WORKERS_MAX, "the registry stays at its bound");
    assert!(jobs.worker("newcomer").await.unwrap().is_some());
    assert!(jobs.worker("idle-00001").await.unwrap().is_none(), "the idle worker seen longest ago made room");
    assert!(jobs.worker("idle-00002").await.unwrap().is_some());
    let busy = jobs.worker("busy").await.unwrap().expect("a worker holding a job is kept");
    assert_eq!(busy.active_job_ids, [id]);
    assert!(jobs.worker("signalled").await.unwrap().is_some(), "a worker holding a signal is kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_are_registered_by_contact_and_obey_signals() {
    let server = TempPostgres::start();
    let (jobs, pool) = store(&server, "workers").await;
    let queues = ["mail".to_string()];
    assert_eq!(jobs.note_worker(NOW, "w1", Some(&queues), false).await.unwrap(), None);
    jobs.note_worker(NOW + 10, "w1", Some(&queues), false).await.unwrap();
    jobs.note_worker(NOW + 20, "w2", None, true).await.unwrap();
    let id = jobs.enqueue(NOW, vec![job("mail")]).await.unwrap()[0].job.id;
    jobs.claim(NOW + 30, &fetch("mail", 1, "w1")).await.unwrap();

    let w1 = jobs.worker("w1").await.unwrap().expect("registered by its fetch");
    assert_eq!((w1.state, w1.first_seen_at, w1.queues.as_slice()), (WorkerState::Running, NOW, &queues[..]));
    assert_eq!(w1.active_job_ids, [id]);
    let w2 = jobs.worker("w2").await.unwrap().unwrap();
    assert_eq!((w2.last_heartbeat_at, w2.last_seen_at), (Some(NOW + 20), NOW + 20));
    let started = event_types(&jobs).await.iter().filter(|kind| *kind == "worker.started").count();
    assert_eq!(started, 2, "one worker.started a worker");

    // Signals: answered to the worker, listed, and not undone.
    let quiet = jobs.signal_worker(NOW + 40, "w1", WorkerSignal::Quiet).await.unwrap();
    assert_eq!(quiet.state, WorkerState::Quiet);
    assert_eq!(jobs.note_worker(NOW + 50, "w1", Some(&queues), false).await.unwrap(), Some(WorkerSignal::Quiet));
    jobs.signal_worker(NOW + 60, "w1", WorkerSignal::Terminate).await.unwrap();
    let back = jobs.signal_worker(NOW + 70, "w1", WorkerSignal::Quiet).await.unwrap_err();
    assert!(matches!(back, EngineError::WorkerConflict { current_state: WorkerState::Terminate, .. }), "{back:?}");
    let unknown = jobs.signal_worker(NOW, "nobody", WorkerSignal::Quiet).await.unwrap_err();
    assert!(matches!(unknown, EngineError::WorkerNotFound { .. }), "{unknown:?}");
    let (running, _) = jobs.workers_page(None, 10, Some(WorkerState::Running)).await.unwrap();
    assert_eq!(running.iter().map(|w| w.worker_id.as_str()).collect::<Vec<_>>(), ["w2"]);
    let (first, more) = jobs.workers_page(None, 1, None).await.unwrap();
    assert_eq!((first[0].worker_id.as_str(), more), ("w1", true));
    assert!(event_types(&jobs).await.contains(&"worker.terminate".to_string()));
    let overview = jobs.overview(NOW + 80).await.unwrap();
    assert_eq!(overview.workers, 2);

    // Idle for a day: forgotten, unless it holds jobs.
    let day = 24 * 3_600_000;
    assert_eq!(jobs.forget_idle_workers(NOW + day + 100).await.unwrap(), 1);
    assert!(jobs.worker("w2").await.unwrap().is_none());
    assert!(jobs.worker("w1").await.unwrap().is_some(), "w1 still holds a job");
    jobs.forget_worker("w1").await.unwrap();
    assert!(matches!(jobs.forget_worker("w1").await, Err(EngineError::WorkerNotFound { .. })));
    drop(pool);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_throughput_history_counts_completions_and_failures_by_minute() {
    let server = TempPostgres::start();
    let (jobs, _pool) = store(&server, "throughput").await;
    let ids: Vec<_> =
        jobs.enqueue(NOW, vec![job("t"), job("t"), job("u")]).await.unwrap().iter().map(|e| e.job.id).collect();
    jobs.claim(NOW + 1, &fetch("t", 2, "w")).await.unwrap();
    jobs.claim(NOW + 1, &fetch("u", 1, "w")).await.unwrap();
    jobs.ack(NOW + 2, ids[0], None, Some("w")).await.unwrap();
    jobs.ack(NOW + 61_000, ids[2], None, Some("w")).await.unwrap();
    let report = svc::job::FailureReport::server("Boom", "it broke");
    jobs.fail(NOW + 3, ids[1], report, false, Some("w")).await.unwrap();

    let all = jobs.throughput_minutes(NOW + 120_000, None).await.unwrap();
    let minutes: Vec<_> = all.iter().map(|m| (m.minute, m.completed, m.failed)).collect();
    assert_eq!(minutes, [(NOW, 1, 1), (NOW + 60_000, 1, 0)]);
    let of_t = jobs.throughput_minutes(NOW + 120_000, Some("t")).await.unwrap();
    assert_eq!(of_t.iter().map(|m| (m.completed, m.failed)).collect::<Vec<_>>(), [(1, 1)]);
    assert!(jobs.throughput_minutes(NOW + 2 * 86_400_000, None).await.unwrap().is_empty(), "a day later");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_jobs_leave_the_history_by_retention_and_whole_days_are_dropped() {
    let server = TempPostgres::start();
    let (jobs, pool) = store(&server, "history").await;
    let retention = svc::engine::Retention::default();
    let partitions = async || -> Vec<String> {
        let client = pool.get().await.unwrap();
        let rows = client
            .query(
                "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
                 JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'svc_job_history' ORDER BY 1",
                &[],
            )
            .await
            .unwrap();
        rows.iter().map(|row| row.get(0)).collect()
    };
    jobs.keep_history(NOW, &retention, 1_000).await.unwrap();
    let days = ["svc_job_history_20270115", "svc_job_history_20270116", "svc_job_history_20270117"];
    assert_eq!(partitions().await, [&days[..], &["svc_job_history_default"]].concat(), "today and two days ahead");

    let ids: Vec<_> = jobs.enqueue(NOW, vec![job("h"), job("h")]).await.unwrap().iter().map(|e| e.job.id).collect();
    jobs.claim(NOW + 1, &fetch("h", 2, "w")).await.unwrap();
    jobs.ack(NOW + 2, ids[0], None, Some("w")).await.unwrap();
    let mut report = svc::job::FailureReport::server("Fatal", "no retry");
    report.retryable = Some(false);
    let discarded = jobs.fail(NOW + 3, ids[1], report, false, Some("w")).await.unwrap();
    assert_eq!(discarded.state, JobState::Discarded);

    // Eight days on: the completed job went (7 days), the discarded one stays
    // in the dead letter listing (30 days).
    let day = 86_400_000;
    jobs.keep_history(NOW + 8 * day, &retention, 1_000).await.unwrap();
    assert!(jobs.job(ids[0]).await.unwrap().is_none(), "completed and past its retention");
    assert!(jobs.job(ids[1]).await.unwrap().is_some(), "discarded and still kept");
    assert!(partitions().await.contains(&"svc_job_history_20270125".to_string()), "days ahead made as time goes");

    // A month on: the whole day is dropped, and with it the discarded job.
    assert!(jobs.keep_history(NOW + 32 * day, &retention, 1_000).await.unwrap() >= 1);
    assert!(!partitions().await.contains(&days[0].to_string()));
    assert!(jobs.job(ids[1]).await.unwrap().is_none());
}

/// The depth a bounded queue's enqueues are checked against is kept by the
/// database as jobs change, whatever changes them; it always equals the
/// jobs counted waiting, and refuses at the bound. It is kept only while
/// some queue is bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_depth_a_bound_is_checked_against_follows_every_change() {
    use svc::job::FailureReport;
    let server = TempPostgres::start();
    let (jobs, pool) = store(&server, "depths").await;
    let kept = async || -> i64 {
        let client = pool.get().await.unwrap();
        let row = client
            .query_one("SELECT coalesce(sum(delta), 0)::int8 FROM svc_queue_depths WHERE queue = 'q'", &[])
            .await
            .unwrap();
        row.get(0)
    };
    let counted = async || jobs.queue_stats(NOW, "q").await.unwrap().unwrap().summary.depth() as i64;

    // Jobs enqueued before the bound is set count too.
    let enqueued = jobs.enqueue(NOW, (0..6).map(|_| job("q")).collect()).await.unwrap();
    jobs.configure_queue("q", Some(Backpressure::reject_above(10))).await.unwrap();
    assert_eq!((kept().await, counted().await), (6, 6));

    // Claims take jobs out; a failure to be retried puts one back; an ack
    // changes nothing; a cancel of a waiting job takes it out.
    let claimed = jobs.claim(NOW + 1, &fetch("q", 3, "w")).await.unwrap();
    assert_eq!((kept().await, counted().await), (3, 3));
    let report = FailureReport::server("boom", "to retry");
    jobs.fail(NOW + 2, claimed[0].id, report, false, Some("w")).await.unwrap();
    jobs.ack(NOW + 3, claimed[1].id, None, Some("w")).await.unwrap();
    assert_eq!((kept().await, counted().await), (4, 4));
    let waiting = enqueued.iter().map(|item| item.job.id).find(|id| claimed.iter().all(|job| job.id != *id));
    jobs.cancel(NOW + 4, waiting.unwrap()).await.unwrap();
    assert_eq!((kept().await, counted().await), (3, 3));
    // A claim that runs out puts its job back.
    assert_eq!(jobs.expire_claims(NOW + 3_600_000, 100).await.unwrap(), 1);
    assert_eq!((kept().await, counted().await), (4, 4));

    // Folded into one row, the depth is the same; the bound refuses at it.
    jobs.fold_queue_depths().await.unwrap();
    let client = pool.get().await.unwrap();
    let rows: i64 = client.query_one("SELECT count(*) FROM svc_queue_depths", &[]).await.unwrap().get(0);
    assert_eq!((rows, kept().await), (1, 4));
    let full = jobs.enqueue(NOW + 5, (0..7).map(|_| job("q")).collect()).await.unwrap_err();
    assert!(matches!(full, EngineError::QueueFull { depth: 10, bound: 10, index: Some(6), .. }), "{full:?}");
    jobs.enqueue(NOW + 5, (0..6).map(|_| job("q")).collect()).await.unwrap();
    assert_eq!((kept().await, counted().await), (10, 10));

    // With no queue bounded, depths are no longer kept (nothing is added
    // as jobs change); a bound set again counts the queue afresh.
    let triggers =
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'svc_jobs'::regclass AND tgname LIKE 'svc_jobs_depths_%'";
    assert_eq!(client.query_one(triggers, &[]).await.unwrap().get::<_, i64>(0), 3);
    jobs.configure_queue("q", None).await.unwrap();
    jobs.unkeep_queue_depths().await.unwrap();
    assert_eq!(client.query_one(triggers, &[]).await.unwrap().get::<_, i64>(0), 0);
    jobs.enqueue(NOW + 6, vec![job("q")]).await.unwrap();
    assert_eq!(kept().await, 0, "nothing kept while no queue is bounded");
    jobs.configure_queue("q", Some(Backpressure::reject_above(11))).await.unwrap();
    assert_eq!((kept().await, counted().await), (11, 11));
    let full = jobs.enqueue(NOW + 7, vec![job("q")]).await.unwrap_err();
    assert!(matches!(full, EngineError::QueueFull { depth: 11, bound: 11, .. }), "{full:?}");
}

/// Setting the first bound counts every queue with writes to jobs held
/// back; behind a long transaction that writes jobs it gives up within a
/// second (to be sent again), rather than hold every write back meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_bound_gives_up_behind_a_long_writer_without_holding_writes() {
    let server = TempPostgres::start();
    let (jobs, pool) = store(&server, "first_bound").await;
    jobs.enqueue(NOW, vec![job("q")]).await.unwrap();
    let mut client = pool.get().await.unwrap();
    let writer = client.transaction().await.unwrap();
    writer.execute("UPDATE svc_jobs SET priority = priority", &[]).await.unwrap();

    let started = std::time::Instant::now();
    let refused = jobs.configure_queue("q", Some(Backpressure::reject_above(5))).await.unwrap_err();
    let contention = svc::engine::Unavailable::Contention;
    assert!(matches!(refused, EngineError::Unavailable { reason } if reason == contention), "{refused:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "it gave up");
    jobs.enqueue(NOW, vec![job("other")]).await.expect("writes go on");
    writer.rollback().await.unwrap();

    let summary = jobs.configure_queue("q", Some(Backpressure::reject_above(5))).await.unwrap();
    assert_eq!(summary.backpressure.map(|bound| bound.max_depth), Some(5));
}
