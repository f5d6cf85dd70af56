//! Engine transitions driven by time, on a manual clock: no sleeping. The
//! engine checks every invariant after each batch (`check_invariants`).

mod common;

use common::FixedEntropy;
use serde_json::json;
use std::sync::Arc;
use svc::clock::ManualClock;
use svc::engine::{Engine, EngineConfig, FetchRequest, Retention};
use svc::job::{FailureReport, JobDefaults, JobId, JobState, parse_enqueue_body};
use svc::storage::{FaultyFileSystem, StorageError};

const START: i64 = 1_800_000_000_000;

struct Harness {
    engine: Engine,
    clock: ManualClock,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn new() -> Harness {
        Self::with_retention(Retention::default())
    }

    fn with_retention(retention: Retention) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(START);
        let mut config = EngineConfig::new(dir.path());
        config.clock = Arc::new(clock.clone());
        config.wiring.entropy = Box::new(FixedEntropy(0));
        config.wiring.check_invariants = true;
        config.retention = retention;
        Harness { engine: Engine::open(config).unwrap(), clock, _dir: dir }
    }

    fn enqueue(&self, body: serde_json::Value) -> JobId {
        let job = parse_enqueue_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap();
        self.engine.handle().enqueue(vec![job]).wait().unwrap()[0].job.id
    }

    fn fetch(&self, count: usize) -> Vec<JobId> {
        let request = FetchRequest {
            queues: vec!["default".into()],
            count,
            worker_id: Some("w".into()),
            visibility_timeout_ms: None,
        };
        self.engine.handle().fetch(request).wait().unwrap().iter().map(|job| job.id).collect()
    }

    fn fail(&self, id: JobId) -> JobState {
        self.engine.handle().fail(id, FailureReport::server("E", "m"), false, None).wait().unwrap().state
    }

    /// Moves time and lets the engine handle what became due.
    fn advance(&self, ms: i64) {
        self.clock.advance_ms(ms);
        self.engine.handle().tick().wait().unwrap();
    }

    fn state(&self, id: JobId) -> JobState {
        self.engine.handle().job(id).expect("job stored").state
    }
}

#[test]
fn retries_come_due_exactly_at_retry_at() {
    let harness = Harness::new();
    let id = harness
        .enqueue(json!({"type": "t", "args": [], "options": {"retry": {"initial_interval": "PT2S", "jitter": false}}}));
    harness.fetch(1);
    assert_eq!(harness.fail(id), JobState::Retryable);
    assert_eq!(harness.engine.handle().job(id).unwrap().run().retry_at, Some(START + 2000));
    harness.advance(1999);
    assert_eq!(harness.state(id), JobState::Retryable);
    assert!(harness.fetch(1).is_empty());
    harness.advance(1);
    assert_eq!(harness.state(id), JobState::Available);
    let job = harness.engine.handle().job(id).unwrap();
    assert_eq!((job.enqueued_at(), job.run().retry_at), (Some(START + 2000), None));
    assert_eq!(harness.fetch(1), [id]);
    assert_eq!(harness.engine.handle().job(id).unwrap().attempt, 2);
}

#[test]
fn backoff_grows_and_exhaustion_discards() {
    let harness = Harness::new();
    let id = harness.enqueue(json!({"type": "t", "args": [], "options": {"retry": {"max_attempts": 3, "initial_interval": "PT1S", "backoff_coefficient": 3.0}}}));
    let mut delays = Vec::new();
    for _ in 0..2 {
        harness.fetch(1);
        assert_eq!(harness.fail(id), JobState::Retryable);
        let delay = harness.engine.handle().job(id).unwrap().run().retry_delay_ms.unwrap();
        delays.push(delay);
        harness.advance(delay as i64);
    }
    assert_eq!(delays, [1000, 3000], "jitter at its midpoint leaves the exponential delay");
    harness.fetch(1);
    assert_eq!(harness.fail(id), JobState::Discarded);
    let job = harness.engine.handle().job(id).unwrap();
    assert_eq!((job.run().errors.len(), job.attempt), (3, 3));
}

#[test]
fn an_expired_reservation_returns_the_job() {
    let harness = Harness::new();
    let id = harness.enqueue(json!({"type": "t", "args": [], "options": {"visibility_timeout_ms": 5000, "timeout_ms": 60000, "retry": {"max_attempts": 2}}}));
    harness.fetch(1);
    harness.advance(4999);
    assert_eq!(harness.state(id), JobState::Active);
    harness.advance(1);
    let job = harness.engine.handle().job(id).unwrap();
    assert_eq!((job.state, job.attempt), (JobState::Available, 1));
    assert_eq!(job.run().error.as_ref().unwrap().code, "visibility_timeout");
    let late = harness.engine.handle().ack(id, None, Some("w".into())).wait();
    assert!(late.is_err(), "the previous claimant's ack is refused");
    harness.fetch(1);
    harness.advance(5000);
    assert_eq!(harness.state(id), JobState::Discarded, "the last attempt's expiry discards");
}

#[test]
fn an_attempt_past_its_execution_timeout_fails() {
    let harness = Harness::new();
    let id = harness.enqueue(json!({"type": "t", "args": [], "options": {"timeout_ms": 1000, "visibility_timeout_ms": 1000, "retry": {"jitter": false}}}));
    harness.fetch(1);
    harness.advance(1000);
    let job = harness.engine.handle().job(id).unwrap();
    assert_eq!(job.state, JobState::Retryable, "on a tie the execution deadline decides");
    assert_eq!(job.run().error.as_ref().unwrap().code, "timeout");
    assert_eq!(job.run().retry_at, Some(START + 2000));
}

#[test]
fn scheduled_jobs_wait_for_their_time_and_expired_ones_never_run() {
    let harness = Harness::new();
    let later = harness.enqueue(json!({"type": "t", "args": [], "options": {"delay_until": "+PT10S"}}));
    let expiring =
        harness.enqueue(json!({"type": "t", "args": [], "options": {"queue": "other", "expires_at": "+PT3S"}}));
    assert_eq!(harness.state(later), JobState::Scheduled);
    assert!(harness.fetch(1).is_empty());
    harness.advance(3000);
    let expired = harness.engine.handle().job(expiring).unwrap();
    assert_eq!((expired.state, expired.run().error.as_ref().unwrap().code.as_str()), (JobState::Discarded, "expired"));
    assert!(expired.run().completed_at.is_none());
    let (listed, _) = harness.engine.handle().dead_letter_page(None, 10, None);
    assert_eq!(
        listed.iter().map(|job| job.id).collect::<Vec<_>>(),
        [expiring],
        "expired jobs are in the dead letter listing"
    );
    harness.advance(7000);
    assert_eq!(harness.state(later), JobState::Available);
    assert_eq!(harness.fetch(1), [later]);
}

#[test]
fn a_promoted_job_takes_its_priority_place_and_a_past_time_means_now() {
    let harness = Harness::new();
    let low = harness.enqueue(json!({"type": "t", "args": [], "options": {"priority": -5}}));
    let high = harness.enqueue(json!({"type": "t", "args": [], "options": {"priority": 10, "delay_until": "+PT5S"}}));
    let past = harness.enqueue(json!({"type": "t", "args": [], "options": {"delay_until": "2020-01-01T00:00:00Z"}}));
    assert_eq!((harness.state(high), harness.state(past)), (JobState::Scheduled, JobState::Available));
    harness.advance(4999);
    assert_eq!(harness.state(high), JobState::Scheduled);
    harness.advance(1);
    assert_eq!(harness.fetch(3), [high, past, low], "priority first, then time entered available");
}

#[test]
fn terminal_jobs_are_pruned_after_retention() {
    let mut retention = Retention::default();
    retention.completed_ms = 60_000;
    let harness = Harness::with_retention(retention);
    let id = harness.enqueue(json!({"type": "t", "args": []}));
    harness.fetch(1);
    harness.engine.handle().ack(id, None, None).wait().unwrap();
    harness.advance(59_999);
    assert!(harness.engine.handle().job(id).is_some());
    harness.advance(1);
    assert!(harness.engine.handle().job(id).is_none());
    assert_eq!(harness.engine.handle().queue("default").unwrap().counts, [0; 8]);
}

#[test]
fn many_due_jobs_are_all_handled() {
    let harness = Harness::new();
    let jobs = (0..25_000)
        .map(|n| {
            parse_enqueue_body(
                json!({"type": "t", "args": [n], "options": {"delay_until": "+PT1S"}}).to_string().as_bytes(),
                &JobDefaults::default(),
            )
            .unwrap()
        })
        .collect();
    let ids: Vec<JobId> =
        harness.engine.handle().enqueue(jobs).wait().unwrap().iter().map(|item| item.job.id).collect();
    harness.advance(1000);
    // Due work past one turn's limit is picked up by the following turns.
    harness.engine.handle().tick().wait().unwrap();
    harness.engine.handle().tick().wait().unwrap();
    assert!(ids.iter().all(|id| harness.state(*id) == JobState::Available));
}

#[test]
fn heartbeats_extend_claims_by_the_claims_own_visibility() {
    let harness = Harness::new();
    let id = harness.enqueue(json!({"type": "t", "args": [], "options": {"visibility_timeout_ms": 30000}}));
    let other = harness.enqueue(json!({"type": "t", "args": []}));
    let request = |worker: &str, visibility| FetchRequest {
        queues: vec!["default".into()],
        count: 1,
        worker_id: Some(worker.into()),
        visibility_timeout_ms: Some(visibility),
    };
    assert_eq!(harness.engine.handle().fetch(request("w-1", 2000)).wait().unwrap()[0].id, id);
    assert_eq!(harness.engine.handle().fetch(request("w-2", 2000)).wait().unwrap()[0].id, other);
    harness.advance(1500);
    let extended = harness.engine.handle().heartbeat("w-1".into(), None, None).wait().unwrap().extended;
    assert_eq!(extended, 1, "only w-1's own job");
    assert_eq!(
        harness.engine.handle().job(id).unwrap().run().visibility_deadline,
        Some(START + 1500 + 2000),
        "by the fetch's 2 s, not the job's 30 s"
    );
    harness.advance(600);
    assert_eq!(
        (harness.state(id), harness.state(other)),
        (JobState::Active, JobState::Available),
        "w-2 sent no heartbeat"
    );

    let listed = vec![id, other, JobId(42)];
    assert_eq!(
        harness.engine.handle().heartbeat("w-1".into(), Some(listed), Some(10_000)).wait().unwrap().extended,
        1,
        "only active jobs are extended"
    );
    assert_eq!(
        harness.engine.handle().heartbeat("w-1".into(), Some(Vec::new()), None).wait().unwrap().extended,
        0,
        "an empty list extends nothing"
    );
    assert_eq!(
        harness.engine.handle().heartbeat("w-2".into(), Some(vec![id]), None).wait().unwrap().extended,
        0,
        "another worker's claim is not extended"
    );
    harness.advance(9_999);
    assert_eq!(harness.state(id), JobState::Active);
    harness.advance(1);
    assert_eq!(harness.state(id), JobState::Available);
}

#[test]
fn a_heartbeat_extension_survives_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let config = |clock: &ManualClock| {
        let mut config = EngineConfig::new(dir.path());
        config.clock = Arc::new(clock.clone());
        config.wiring.check_invariants = true;
        config
    };
    let engine = Engine::open(config(&clock)).unwrap();
    let job = parse_enqueue_body(br#"{"type":"t","args":[]}"#, &JobDefaults::default()).unwrap();
    let id = engine.handle().enqueue(vec![job]).wait().unwrap()[0].job.id;
    let request = FetchRequest {
        queues: vec!["default".into()],
        count: 1,
        worker_id: Some("w".into()),
        visibility_timeout_ms: Some(1000),
    };
    engine.handle().fetch(request).wait().unwrap();
    engine.handle().heartbeat("w".into(), None, Some(60_000)).wait().unwrap();
    engine.close_without_snapshot();
    // Past the 1 s claim, short of the 30 s execution timeout (which heartbeats do not extend).
    clock.advance_ms(20_000);
    let engine = Engine::open(config(&clock)).unwrap();
    engine.handle().tick().wait().unwrap();
    assert_eq!(engine.handle().job(id).unwrap().state, JobState::Active, "the extended deadline was replayed");
    engine.close();
}

/// Group commit: commands that reach the engine while it waits for the disk
/// are written and synced together, one sync for all of them.
#[test]
fn commands_queued_during_a_sync_share_the_next_sync() {
    let dir = tempfile::tempdir().unwrap();
    let disk = FaultyFileSystem::failing_after(i64::MAX);
    let mut config = EngineConfig::new(dir.path());
    config.file_system = Arc::new(disk.clone());
    config.wiring.check_invariants = true;
    let engine = Engine::open(config).unwrap();
    let handle = engine.handle();
    let job = || parse_enqueue_body(br#"{"type":"t","args":[]}"#, &JobDefaults::default()).unwrap();

    disk.hold_syncs("svc-engine");
    let first = handle.enqueue(vec![job()]);
    disk.wait_for_held_syncs(1);
    let syncs_before = disk.data_syncs_by("svc-engine");
    let queued: Vec<_> = (0..100).map(|_| handle.enqueue(vec![job()])).collect();
    disk.release_syncs();

    let first = first.wait().unwrap()[0].job.id;
    let ids: std::collections::HashSet<JobId> =
        queued.into_iter().map(|pending| pending.wait().unwrap()[0].job.id).collect();
    assert_eq!(ids.len(), 100);
    assert!(!ids.contains(&first));
    assert_eq!(disk.data_syncs_by("svc-engine") - syncs_before, 1, "100 queued enqueues, one sync");
    engine.close_without_snapshot();

    // All of them were durable before they were answered.
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    for id in ids.iter().chain([&first]) {
        assert_eq!(engine.handle().job(*id).map(|job| job.state), Some(JobState::Available));
    }
    engine.close();
}

/// The queue figures readers see, rebuilt from scratch out of every job the
/// engine holds ("default" is always listed).
fn queue_counts_from_jobs(engine: &Engine) -> std::collections::BTreeMap<String, [u64; 8]> {
    let mut expected = std::collections::BTreeMap::from([("default".to_string(), [0; 8])]);
    for job in engine.handle().image().wait().unwrap().jobs {
        expected.entry(job.queue.to_string()).or_insert([0; 8])[job.state.index()] += 1;
    }
    expected
}

fn queue_counts_seen(engine: &Engine) -> std::collections::BTreeMap<String, [u64; 8]> {
    let (queues, _) = engine.handle().queues_page(None, usize::MAX);
    queues.into_iter().map(|queue| (queue.name, queue.counts)).collect()
}

/// Each turn publishes only the queues it changed; what readers see must
/// still match the whole state, including queues that come and go.
#[test]
fn queue_figures_follow_changes_across_many_queues() {
    let mut retention = Retention::default();
    retention.completed_ms = 10_000;
    let harness = Harness::with_retention(retention);
    let engine = &harness.engine;
    let ids: Vec<JobId> = (0..50)
        .map(|n| harness.enqueue(json!({"type": "t", "args": [n], "options": {"queue": format!("q{n:02}")}})))
        .collect();
    harness.enqueue(json!({"type": "t", "args": []}));
    assert_eq!(queue_counts_seen(engine).len(), 51);
    assert_eq!(queue_counts_seen(engine), queue_counts_from_jobs(engine));

    let claim = |queue: &str| {
        let request =
            FetchRequest { queues: vec![queue.into()], count: 1, worker_id: None, visibility_timeout_ms: None };
        engine.handle().fetch(request).wait().unwrap()[0].id
    };
    assert_eq!(claim("q07"), ids[7]);
    engine.handle().ack(ids[7], None, None).wait().unwrap();
    assert_eq!(claim("q08"), ids[8]);
    assert_eq!(queue_counts_seen(engine)["q07"][JobState::Completed.index()], 1);
    assert_eq!(queue_counts_seen(engine)["q08"][JobState::Active.index()], 1);
    assert_eq!(queue_counts_seen(engine), queue_counts_from_jobs(engine));

    // Once its only job is pruned, q07 is gone; q08's job is still active.
    harness.advance(10_000);
    engine.handle().ack(ids[8], None, None).wait().unwrap();
    let seen = queue_counts_seen(engine);
    assert!(!seen.contains_key("q07"), "an emptied queue leaves the listing");
    assert_eq!(seen, queue_counts_from_jobs(engine));

    // A queue that comes back is listed again.
    harness.enqueue(json!({"type": "t", "args": [], "options": {"queue": "q07"}}));
    assert_eq!(queue_counts_seen(engine)["q07"][JobState::Available.index()], 1);
    assert_eq!(queue_counts_seen(engine), queue_counts_from_jobs(engine));
}

/// A data dir belongs to one engine at a time, but a lock held only for a
/// moment (as a child process holds it between fork and exec, when any
/// thread of the program spawns one) does not make an open fail.
#[test]
fn a_data_dir_opens_once_and_a_passing_hold_on_its_lock_is_waited_out() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    assert!(matches!(Engine::open(EngineConfig::new(dir.path())), Err(StorageError::Locked(_))));
    engine.close();

    let passing = std::fs::File::options().write(true).open(dir.path().join("LOCK")).unwrap();
    passing.try_lock().unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(passing);
    });
    let engine = Engine::open(EngineConfig::new(dir.path())).expect("a passing hold is waited out");
    release.join().unwrap();
    engine.close();
}

#[test]
fn jobs_read_back_after_a_restart_share_equal_retry_policies() {
    let dir = tempfile::tempdir().unwrap();
    let defaults = JobDefaults::default();
    let job = |body: &str| parse_enqueue_body(body.as_bytes(), &defaults).unwrap();
    let plain = r#"{"type":"t","args":[]}"#;
    let custom = r#"{"type":"t","args":[],"options":{"retry":{"max_attempts":9}}}"#;
    let enqueue_all = |engine: &Engine| -> Vec<JobId> {
        let jobs = vec![job(plain), job(custom), job(plain), job(custom)];
        engine.handle().enqueue(jobs).wait().unwrap().iter().map(|item| item.job.id).collect()
    };
    let shared = |engine: &Engine, ids: &[JobId]| {
        let jobs: Vec<_> = ids.iter().map(|id| engine.handle().job(*id).expect("job stored")).collect();
        assert_eq!((jobs[0].retry.max_attempts, jobs[1].retry.max_attempts), (defaults.retry.max_attempts, 9));
        assert!(Arc::ptr_eq(&jobs[0].retry, &jobs[2].retry), "default policies share one allocation");
        assert!(Arc::ptr_eq(&jobs[1].retry, &jobs[3].retry), "equal client policies share one allocation");
        assert!(!Arc::ptr_eq(&jobs[0].retry, &jobs[1].retry));
    };

    // Read back from the log...
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    let ids = enqueue_all(&engine);
    shared(&engine, &ids);
    engine.close_without_snapshot();
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    shared(&engine, &ids);
    // ...and from a snapshot.
    engine.close();
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    shared(&engine, &ids);
    engine.close();
}

#[test]
fn a_wall_clock_step_forward_of_an_hour_does_not_expire_every_claim_at_once() {
    let harness = Harness::new();
    let id = harness
        .enqueue(json!({"type": "t", "args": [], "options": {"visibility_timeout_ms": 30_000, "timeout_ms": 600_000}}));
    assert_eq!(harness.fetch(1), [id]);
    harness.clock.step_wall_ms(3_600_000);
    harness.advance(1);
    assert_eq!(harness.state(id), JobState::Active, "the step alone expires nothing");
    // The engine's time catches up a tenth faster than real time: the claim
    // ends after 27.3 s instead of 30 s, not at once.
    harness.advance(27_000);
    assert_eq!(harness.state(id), JobState::Active);
    harness.advance(400);
    assert_eq!(harness.state(id), JobState::Available, "the claim ran out, a little early");
}

#[test]
fn a_wall_clock_step_back_of_an_hour_does_not_stall_the_timers() {
    let harness = Harness::new();
    let id = harness.enqueue(json!({"type": "t", "args": [], "options": {"scheduled_at": "2027-01-15T08:01:00Z"}}));
    let scheduled_at = harness.engine.handle().job(id).unwrap().scheduled_at().unwrap();
    harness.clock.step_wall_ms(-3_600_000);
    harness.advance(60_000);
    assert_eq!(harness.state(id), JobState::Scheduled, "the engine's time ran a tenth slower");
    harness.advance(6_700);
    assert_eq!(harness.state(id), JobState::Available, "promoted after 66.7 s of real time, not an hour");
    let job = harness.engine.handle().job(id).unwrap();
    assert!(job.enqueued_at().unwrap() >= scheduled_at, "the engine's time never went back");
}
