//! Cron on the PostgreSQL backend, against a real PostgreSQL server of the
//! test's own: registration, listing and deletion as on the local engine;
//! firings at their nominal times, once each even when two nodes fire at
//! once; downtime caught up with one firing; the overlap policies, a run
//! waiting for the previous one included; unique policies met by a firing,
//! with locks taken in the order enqueues take them; and an entry that
//! cannot be fired holding back no other.

mod common;

use std::sync::Arc;

use common::postgres::TempPostgres;
use svc::backend::EventFilter;
use svc::backend::postgres::{PgJobs, PgSettings, open};
use svc::cron::{CronDefinition, parse_cron_body};
use svc::engine::{CronWrite, EngineError, EventKind, FetchRequest};
use svc::job::{JobDefaults, JobState};

/// 2027-01-15T08:00:00Z: a whole minute.
const NOW: i64 = 1_800_000_000_000;
const MINUTE: i64 = 60_000;

fn definition(body: serde_json::Value) -> CronDefinition {
    parse_cron_body(body.to_string().as_bytes(), &JobDefaults::default()).expect("a valid registration")
}

fn every_minute(name: &str, queue: &str) -> CronDefinition {
    definition(serde_json::json!({
        "name": name, "expression": "* * * * *",
        "job_template": {"type": "report.build", "args": [name], "options": {"queue": queue}}
    }))
}

async fn store(server: &TempPostgres, database: &str) -> (Arc<PgJobs>, deadpool_postgres::Pool) {
    let pool = open(&PgSettings::new(server.database(database))).await.expect("the schema migrates");
    (Arc::new(PgJobs::new(pool.clone())), pool)
}

fn fetch(queue: &str) -> FetchRequest {
    FetchRequest {
        queues: vec![queue.to_string()],
        count: 100,
        worker_id: Some("w".into()),
        visibility_timeout_ms: None,
    }
}

async fn event_types(jobs: &PgJobs) -> Vec<String> {
    let page = jobs.events_page(None, 1000, &EventFilter::default()).await.unwrap();
    page.events.iter().map(|event| event.kind.type_name().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_are_registered_listed_changed_and_deleted() {
    let server = TempPostgres::start();
    let (jobs, _pool) = store(&server, "registry").await;

    let (entry, created) =
        jobs.cron_put(NOW + 5, every_minute("b-report", "reports"), CronWrite::Upsert).await.unwrap();
    assert!(created);
    assert_eq!((entry.revision, entry.next_run_at), (1, Some(NOW + MINUTE)), "no backfill: the next whole minute");
    let mut disabled = every_minute("a-report", "reports");
    disabled.enabled = false;
    let (entry, _) = jobs.cron_put(NOW + 5, disabled, CronWrite::Upsert).await.unwrap();
    assert_eq!(entry.next_run_at, None, "a disabled entry is not due");

    // Listed in name order, a page at a time, and by `enabled`.
    let (first, more) = jobs.crons_page(None, 1, None).await.unwrap();
    assert_eq!((first[0].definition.name.as_str(), more), ("a-report", true));
    let (rest, more) = jobs.crons_page(Some("a-report"), 10, None).await.unwrap();
    assert_eq!((rest.len(), rest[0].definition.name.as_str(), more), (1, "b-report", false));
    let (enabled, _) = jobs.crons_page(None, 10, Some(true)).await.unwrap();
    assert_eq!(enabled.iter().map(|e| e.definition.name.as_str()).collect::<Vec<_>>(), ["b-report"]);

    // Replaced: the revision goes up; a change at an older revision is refused.
    let (entry, created) = jobs.cron_put(NOW + 6, every_minute("b-report", "other"), CronWrite::Upsert).await.unwrap();
    assert_eq!((created, entry.revision, entry.definition.job.queue.as_str()), (false, 2, "other"));
    let stale = jobs.cron_put(NOW + 7, every_minute("b-report", "x"), CronWrite::Patch { revision: 1 }).await;
    assert!(matches!(stale, Err(EngineError::CronChanged { .. })), "{stale:?}");
    let missing = jobs.cron_put(NOW + 7, every_minute("c-report", "x"), CronWrite::Patch { revision: 1 }).await;
    assert!(matches!(missing, Err(EngineError::CronNotFound { .. })), "{missing:?}");

    // Deleted: gone from reads; a second delete is refused.
    assert_eq!(jobs.cron_delete("b-report").await.unwrap().definition.name, "b-report");
    assert!(jobs.cron("b-report").await.unwrap().is_none());
    assert!(matches!(jobs.cron_delete("b-report").await, Err(EngineError::CronNotFound { .. })));
    assert!(jobs.cron("a-report").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_fires_once_a_slot_with_its_events_even_from_two_nodes() {
    let server = TempPostgres::start();
    let (jobs, pool) = store(&server, "firing").await;
    let other_node = Arc::new(PgJobs::new(pool.clone()));
    let mut allowed = every_minute("tick", "ticks");
    allowed.overlap = svc::cron::OverlapPolicy::Allow;
    jobs.cron_put(NOW, allowed, CronWrite::Upsert).await.unwrap();

    assert_eq!(jobs.fire_due_crons(NOW + MINUTE - 1, 100).await.unwrap(), 0, "not due before its time");
    // Two nodes fire the same slot at once: one job.
    let (a, b) = tokio::join!(jobs.fire_due_crons(NOW + MINUTE, 100), other_node.fire_due_crons(NOW + MINUTE, 100));
    assert_eq!(a.unwrap() + b.unwrap(), 1, "the slot fired once");
    assert_eq!(jobs.fire_due_crons(NOW + MINUTE + 10, 100).await.unwrap(), 0, "and not again");

    let claimed = jobs.claim(NOW + MINUTE + 20, &fetch("ticks")).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let job = &claimed[0];
    assert_eq!((job.payload.job_type(), job.payload.args()), ("report.build", r#"["tick"]"#));
    let meta: serde_json::Value = serde_json::from_str(job.payload.meta()).unwrap();
    assert_eq!(meta["cron_name"], "tick");
    assert_eq!(meta["cron_triggered_at"], "2027-01-15T08:01:00Z");

    let entry = jobs.cron("tick").await.unwrap().unwrap();
    assert_eq!((entry.run_count, entry.last_run_at, entry.last_job_id), (1, Some(NOW + MINUTE), Some(job.id)));
    assert_eq!(entry.next_run_at, Some(NOW + 2 * MINUTE));
    let events = jobs.events_page(None, 100, &EventFilter::default()).await.unwrap().events;
    match &events[0].kind {
        EventKind::CronTriggered { cron, run_count } => {
            assert_eq!((cron.name.as_str(), cron.scheduled_time, *run_count), ("tick", NOW + MINUTE, 1));
            assert_eq!(events[0].job.as_ref().map(|job| job.id), Some(job.id));
        }
        other => panic!("expected cron.triggered first, got {other:?}"),
    }
    assert_eq!(event_types(&jobs).await[..3], ["cron.triggered", "job.enqueued", "job.started"]);

    // Down for ten minutes: one firing, for the latest slot, the rest counted as missed.
    assert_eq!(jobs.fire_due_crons(NOW + 12 * MINUTE + 30_000, 100).await.unwrap(), 1);
    let entry = jobs.cron("tick").await.unwrap().unwrap();
    assert_eq!((entry.run_count, entry.last_run_at), (2, Some(NOW + 12 * MINUTE)));
    assert_eq!(entry.next_run_at, Some(NOW + 13 * MINUTE));
    let events = jobs.events_page(None, 100, &EventFilter::default()).await.unwrap().events;
    let misfire = events.iter().find_map(|event| match &event.kind {
        EventKind::CronSkipped(skip) if skip.reason == "misfire" => Some(skip.missed_count),
        _ => None,
    });
    assert_eq!(misfire, Some(Some(10)), "slots 2 to 11 were missed");
    assert_eq!(jobs.claim(NOW + 13 * MINUTE, &fetch("ticks")).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overlap_policy_and_paused_queues_are_obeyed() {
    let server = TempPostgres::start();
    let (jobs, pool) = store(&server, "overlap").await;
    // skip (the default): no second run while the first is in flight.
    jobs.cron_put(NOW, every_minute("skipper", "skip-q"), CronWrite::Upsert).await.unwrap();
    let mut canceller = every_minute("canceller", "cancel-q");
    canceller.overlap = svc::cron::OverlapPolicy::CancelPrevious;
    jobs.cron_put(NOW, canceller, CronWrite::Upsert).await.unwrap();
    jobs.cron_put(NOW, every_minute("paused", "paused-q"), CronWrite::Upsert).await.unwrap();
    pool.get()
        .await
        .unwrap()
        .execute("INSERT INTO svc_queues (name, paused) VALUES ('paused-q', true)", &[])
        .await
        .unwrap();

    assert_eq!(jobs.fire_due_crons(NOW + MINUTE, 100).await.unwrap(), 3);
    let first_cancel = jobs.cron("canceller").await.unwrap().unwrap().last_job_id.unwrap();
    let first_skip = jobs.cron("skipper").await.unwrap().unwrap().last_job_id.unwrap();
    assert_eq!(jobs.cron("paused").await.unwrap().unwrap().run_count, 0, "a paused queue gets no run");

    assert_eq!(jobs.fire_due_crons(NOW + 2 * MINUTE, 100).await.unwrap(), 3);
    let skipper = jobs.cron("skipper").await.unwrap().unwrap();
    assert_eq!((skipper.run_count, skipper.last_job_id), (1, Some(first_skip)), "skipped while the first runs");
    let canceller = jobs.cron("canceller").await.unwrap().unwrap();
    assert_eq!(canceller.run_count, 2);
    assert_eq!(jobs.job(first_cancel).await.unwrap().unwrap().state, JobState::Cancelled, "the previous run cancelled");
    assert_eq!(jobs.job(canceller.last_job_id.unwrap()).await.unwrap().unwrap().state, JobState::Available);

    let page = jobs.events_page(None, 100, &EventFilter::default()).await.unwrap();
    let skips: Vec<(&str, Option<String>)> = page
        .events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::CronSkipped(skip) => Some((skip.reason, skip.existing_job_id.map(|id| id.to_string()))),
            _ => None,
        })
        .collect();
    assert!(skips.contains(&("overlap_skip", Some(first_skip.to_string()))), "{skips:?}");
    assert!(skips.contains(&("queue_paused", None)), "{skips:?}");
    let cancelled = page.events.iter().find(|event| matches!(event.kind, EventKind::Cancelled { .. })).unwrap();
    assert_eq!(cancelled.job.as_ref().map(|job| (job.id, job.state)), Some((first_cancel, JobState::Cancelled)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_meets_its_unique_policy_as_an_enqueue_does() {
    let server = TempPostgres::start();
    let (jobs, _pool) = store(&server, "unique_cron").await;
    let entry = |name: &str, on_conflict: &str| {
        definition(serde_json::json!({
            "name": name, "expression": "* * * * *", "overlap_policy": "allow",
            "job_template": {"type": "digest.send", "args": [name],
                             "options": {"queue": name, "unique": {"on_conflict": on_conflict}}}
        }))
    };
    jobs.cron_put(NOW, entry("rejects", "reject"), CronWrite::Upsert).await.unwrap();
    jobs.cron_put(NOW, entry("replaces", "replace"), CronWrite::Upsert).await.unwrap();
    jobs.fire_due_crons(NOW + MINUTE, 10).await.unwrap();
    jobs.fire_due_crons(NOW + 2 * MINUTE, 10).await.unwrap();

    // The run still held blocks the next one: skipped as a duplicate.
    assert_eq!(jobs.cron("rejects").await.unwrap().unwrap().run_count, 1);
    assert_eq!(jobs.claim(NOW + 3 * MINUTE, &fetch("rejects")).await.unwrap().len(), 1);
    let events = jobs.events_page(None, 1000, &EventFilter::default()).await.unwrap().events;
    let reasons: Vec<&str> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::CronSkipped(skip) => Some(skip.reason),
            _ => None,
        })
        .collect();
    assert_eq!(reasons, ["duplicate"]);

    // `replace`: the new run cancels the one it meets.
    let replaces = jobs.cron("replaces").await.unwrap().unwrap();
    assert_eq!(replaces.run_count, 2);
    let runs = jobs.claim(NOW + 3 * MINUTE, &fetch("replaces")).await.unwrap();
    assert_eq!(runs.iter().map(|job| job.id).collect::<Vec<_>>(), [replaces.last_job_id.unwrap()]);
    let cancelled =
        events.iter().find(|event| matches!(event.kind, EventKind::Cancelled { reason: "unique_replace", .. }));
    assert!(cancelled.is_some(), "the first run was cancelled as replaced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_waits_for_the_previous_one_starts_when_it_ends() {
    use svc::engine::ConflictReason;
    let server = TempPostgres::start();
    let (jobs, _pool) = store(&server, "waiting").await;
    let mut entry = every_minute("nightly", "queued");
    entry.overlap = svc::cron::OverlapPolicy::Enqueue;
    jobs.cron_put(NOW, entry, CronWrite::Upsert).await.unwrap();

    jobs.fire_due_crons(NOW + MINUTE, 10).await.unwrap();
    let first = jobs.claim(NOW + MINUTE, &fetch("queued")).await.unwrap()[0].id;
    jobs.fire_due_crons(NOW + 2 * MINUTE, 10).await.unwrap();
    let waiting = jobs.cron("nightly").await.unwrap().unwrap().last_job_id.unwrap();
    assert_eq!(jobs.job(waiting).await.unwrap().unwrap().state, JobState::Pending, "it waits for the first");
    let owned = jobs.activate(NOW + 2 * MINUTE, waiting).await.unwrap_err();
    assert!(matches!(owned, EngineError::Conflict { reason: ConflictReason::Owned, .. }), "{owned:?}");
    // At most one run waits: the next firing is skipped.
    jobs.fire_due_crons(NOW + 3 * MINUTE, 10).await.unwrap();
    assert_eq!(jobs.cron("nightly").await.unwrap().unwrap().last_job_id, Some(waiting));

    jobs.ack(NOW + 3 * MINUTE + 1, first, None, Some("w")).await.unwrap();
    let started = jobs.job(waiting).await.unwrap().unwrap();
    assert_eq!(started.state, JobState::Available, "started when the first ended");
    assert_eq!(jobs.claim(NOW + 3 * MINUTE + 2, &fetch("queued")).await.unwrap()[0].id, waiting);
}

/// A firing takes its locks in the order an enqueue with a `replace` policy
/// takes them: the fingerprint first, then the jobs. So an enqueue that holds
/// the fingerprint and goes on to lock the run it replaces is not deadlocked
/// by a firing of the same job waiting for that fingerprint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_and_a_replacing_enqueue_at_one_moment_both_go_through() {
    let server = TempPostgres::start();
    let (jobs, pool) = store(&server, "lock_order").await;
    let entry = definition(serde_json::json!({
        "name": "digest", "expression": "* * * * *", "overlap_policy": "allow",
        "job_template": {"type": "digest.send", "args": ["daily"],
                         "options": {"queue": "digests", "unique": {"on_conflict": "replace"}}}
    }));
    jobs.cron_put(NOW, entry, CronWrite::Upsert).await.unwrap();
    assert_eq!(jobs.fire_due_crons(NOW + MINUTE, 10).await.unwrap(), 1);
    let first_run = jobs.cron("digest").await.unwrap().unwrap().last_job_id.unwrap();
    let previous = first_run.to_string();

    // The enqueue's transaction takes the lock of the fingerprint's bucket
    // (`svc_uq`, then its first two bytes modulo 256 as two bytes) ...
    let mut client = pool.get().await.unwrap();
    let enqueue = client.transaction().await.unwrap();
    enqueue
        .execute(
            "SELECT pg_advisory_xact_lock(x'7376635f75710000'::bit(64)::int8 + get_byte(unique_key, 1)) \
             FROM svc_jobs WHERE id = $1::text::uuid",
            &[&previous],
        )
        .await
        .unwrap();
    // ... while the next firing starts and waits for it ...
    let firing = tokio::spawn({
        let jobs = jobs.clone();
        async move { jobs.fire_due_crons(NOW + 2 * MINUTE, 10).await }
    });
    let monitor = pool.get().await.unwrap();
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'";
    for _ in 0..1000 {
        if monitor.query_one(waiting, &[]).await.unwrap().get::<_, i64>(0) == 1 {
            break;
        }
        assert!(!firing.is_finished(), "the firing waits for the fingerprint");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(monitor.query_one(waiting, &[]).await.unwrap().get::<_, i64>(0), 1);
    // ... and then locks the run it replaces: the firing holds no job yet.
    enqueue.batch_execute("SET LOCAL lock_timeout = '10s'").await.unwrap();
    enqueue.execute("SELECT 1 FROM svc_jobs WHERE id = $1::text::uuid FOR UPDATE", &[&previous]).await.unwrap();
    enqueue.commit().await.unwrap();

    // The firing, no longer waiting, is made (not rolled back as a deadlock).
    assert_eq!(firing.await.unwrap().unwrap(), 1);
    let entry = jobs.cron("digest").await.unwrap().unwrap();
    assert_eq!(entry.run_count, 2);
    let replaced = jobs.job(first_run).await.unwrap().unwrap();
    assert_eq!(replaced.state, JobState::Cancelled, "the run it met was replaced");
}

/// An entry whose firing fails is left due, to be tried again, and the
/// entries due after it are fired meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_that_cannot_be_fired_holds_back_no_other() {
    let server = TempPostgres::start();
    let (jobs, pool) = store(&server, "failing_entry").await;
    jobs.cron_put(NOW, every_minute("report", "reports"), CronWrite::Upsert).await.unwrap();
    // An entry whose stored form no longer reads, due before the other.
    pool.get()
        .await
        .unwrap()
        .execute(
            "INSERT INTO svc_crons (name, enabled, next_run_at, body) \
             VALUES ('broken', true, to_timestamp(0), '\\x00ff'::bytea)",
            &[],
        )
        .await
        .unwrap();

    assert_eq!(jobs.fire_due_crons(NOW + MINUTE, 10).await.unwrap(), 1);
    assert_eq!(jobs.cron("report").await.unwrap().unwrap().run_count, 1);
    let still_due: i64 = pool
        .get()
        .await
        .unwrap()
        .query_one("SELECT count(*) FROM svc_crons WHERE name = 'broken' AND next_run_at = to_timestamp(0)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(still_due, 1, "the failing entry is left due");
}

/// An entry whose firing keeps failing is held back between tries, with a
/// delay that doubles, so it takes no place among the entries a pass fires
/// and is fired once it can be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_that_keeps_failing_waits_between_tries_and_takes_no_place() {
    let server = TempPostgres::start();
    let (jobs, pool) = store(&server, "retried_entry").await;
    jobs.cron_put(NOW, every_minute("nightly", "reports"), CronWrite::Upsert).await.unwrap();
    jobs.cron_put(NOW + 1_000, every_minute("report", "reports"), CronWrite::Upsert).await.unwrap();
    let client = pool.get().await.unwrap();
    let stored: Vec<u8> =
        client.query_one("SELECT body FROM svc_crons WHERE name = 'nightly'", &[]).await.unwrap().get(0);
    // `nightly`, due first, no longer reads.
    client.execute("UPDATE svc_crons SET body = '\\x00ff'::bytea WHERE name = 'nightly'", &[]).await.unwrap();

    // One entry a pass: the failing one first, then, held back, the other.
    let due = NOW + MINUTE;
    assert_eq!(jobs.fire_due_crons(due, 1).await.unwrap(), 0, "the failing entry is tried");
    assert_eq!(jobs.fire_due_crons(due + 1, 1).await.unwrap(), 1, "then the next entry due");
    assert_eq!(jobs.cron("report").await.unwrap().unwrap().run_count, 1);

    // Readable again, it is fired at its next try, not before.
    client.execute("UPDATE svc_crons SET body = $1 WHERE name = 'nightly'", &[&stored]).await.unwrap();
    assert_eq!(jobs.fire_due_crons(due + 50, 1).await.unwrap(), 0, "held back until its next try");
    assert_eq!(jobs.cron("nightly").await.unwrap().unwrap().run_count, 0);
    assert_eq!(jobs.fire_due_crons(due + 100, 1).await.unwrap(), 1, "tried again after its delay");
    assert_eq!(jobs.cron("nightly").await.unwrap().unwrap().run_count, 1);
}
