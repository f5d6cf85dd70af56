//! Merged statements on the PostgreSQL backend, against a real PostgreSQL
//! server of the test's own: many fetches and acks at once on one node are
//! run together, and each still gets exactly its own answer.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::postgres::TempPostgres;
use svc::backend::postgres::{PgJobs, PgSettings, open};
use svc::engine::{ConflictReason, EngineError, FetchRequest};
use svc::job::{JobBuilder, JobDefaults, JobPayload, JobState, NewJob};

const NOW: i64 = 1_800_000_000_000;

fn job(queue: &str, priority: i32) -> NewJob {
    JobBuilder::new("work").args([1]).queue(queue).priority(priority).build(&JobDefaults::default()).unwrap()
}

fn fetch(queues: &[&str], count: usize, worker: &str) -> FetchRequest {
    FetchRequest {
        queues: queues.iter().map(|queue| queue.to_string()).collect(),
        count,
        worker_id: Some(worker.to_string()),
        visibility_timeout_ms: Some(60_000),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_fetches_each_get_their_own_jobs_in_claim_order() {
    let server = TempPostgres::start();
    let pool = open(&PgSettings::new(server.database("fetches"))).await.unwrap();
    let jobs = Arc::new(PgJobs::new(pool));
    let mut batch: Vec<NewJob> = (0..40).map(|i| job("a", i % 3)).collect();
    batch.extend((0..20).map(|_| job("b", 0)));
    jobs.enqueue(NOW, batch).await.unwrap();

    // 24 fetches at once, of two queue lists and several counts.
    let fetches: Vec<_> = (0..24usize)
        .map(|i| {
            let jobs = jobs.clone();
            let queues: &[&str] = if i.is_multiple_of(2) { &["a", "b"] } else { &["b"] };
            let request = fetch(queues, 1 + i % 4, &format!("w{i}"));
            tokio::spawn(async move { (request.clone(), jobs.claim(NOW + 1, &request).await.unwrap()) })
        })
        .collect();
    let mut seen = HashSet::new();
    let mut handed = 0;
    for fetch in fetches {
        let (request, claimed) = fetch.await.unwrap();
        assert!(claimed.len() <= request.count, "a fetch gets at most its count");
        for job in &claimed {
            assert!(seen.insert(job.id), "job {} handed out twice", job.id);
            assert!(request.queues.contains(&job.queue.to_string()), "a job of a queue it asked for");
            assert_eq!(job.run().worker_id, request.worker_id, "claimed for the fetch that got it");
            assert_eq!(job.state, JobState::Active);
        }
        // Within one fetch, higher priorities come first.
        let priorities: Vec<i8> = claimed.iter().filter(|job| job.queue.as_str() == "a").map(|j| j.priority).collect();
        assert!(priorities.windows(2).all(|pair| pair[0] >= pair[1]), "{priorities:?}");
        handed += claimed.len();
    }
    // Fetches of `a, b` ask for 24 and find them in `a`; fetches of `b` alone
    // ask for 36 and share the 20 jobs of `b`.
    let (of_a_b, of_b): (usize, usize) = (0..24)
        .fold((0, 0), |(ab, b), i: usize| if i.is_multiple_of(2) { (ab + 1 + i % 4, b) } else { (ab, b + 1 + i % 4) });
    assert_eq!((of_a_b, of_b), (24, 36));
    assert_eq!(handed, 24 + 20, "every fetch was served while its queues held jobs");
    for id in &seen {
        assert_eq!(jobs.job(*id).await.unwrap().unwrap().state, JobState::Active, "stored as claimed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acks_are_each_answered_on_their_own() {
    let server = TempPostgres::start();
    let pool = open(&PgSettings::new(server.database("acks"))).await.unwrap();
    let jobs = Arc::new(PgJobs::new(pool));
    jobs.enqueue(NOW, (0..30).map(|_| job("q", 0)).collect()).await.unwrap();
    let claimed = jobs.claim(NOW + 1, &fetch(&["q"], 30, "w")).await.unwrap();

    // Every job acked twice at once, and a third of them by the wrong worker first.
    let mut acks = Vec::new();
    for (i, job) in claimed.iter().enumerate() {
        for attempt in 0..2 {
            let (jobs, id) = (jobs.clone(), job.id);
            let worker = if i % 3 == 0 && attempt == 0 { "other" } else { "w" };
            acks.push(tokio::spawn(async move { (id, worker, jobs.ack(NOW + 2, id, None, Some(worker)).await) }));
        }
    }
    let mut completed = HashSet::new();
    for ack in acks {
        let (id, worker, outcome) = ack.await.unwrap();
        match outcome {
            Ok(job) => {
                assert_eq!((worker, job.state), ("w", JobState::Completed));
                assert!(completed.insert(id), "job {id} acked twice");
            }
            Err(EngineError::Conflict { reason: ConflictReason::NotOwner, .. }) => assert_eq!(worker, "other"),
            Err(EngineError::Conflict { reason: ConflictReason::NotActive, current_state, .. }) => {
                assert_eq!(current_state, JobState::Completed, "the other ack of the pair came first");
            }
            Err(other) => panic!("unexpected refusal of {id}: {other:?}"),
        }
    }
    assert_eq!(completed.len(), 30, "each job completed exactly once");
    let unknown =
        jobs.ack(NOW + 3, svc::job::JobId::parse("0190a8a2-8f6e-7c3b-9a1d-1234567890ab").unwrap(), None, None);
    assert!(matches!(unknown.await, Err(EngineError::NotFound { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enqueues_are_each_accepted_or_refused_whole() {
    let server = TempPostgres::start();
    let pool = open(&PgSettings::new(server.database("enqueues"))).await.unwrap();
    let jobs = Arc::new(PgJobs::new(pool));
    let used = jobs.enqueue(NOW, vec![job("q", 0)]).await.unwrap()[0].job.id;
    jobs.pause_queue(NOW, "stopped", true).await.unwrap();
    let fresh = svc::job::JobId::parse("0190a8a2-8f6e-7c3b-9a1d-1234567890ab").unwrap();
    let with_id = |id: svc::job::JobId| {
        JobBuilder::new("work").args([1]).queue("q").id(id).build(&JobDefaults::default()).unwrap()
    };

    // 30 requests at once: plain ones, batches, and three kinds that are refused.
    let requests: Vec<(&str, Vec<NewJob>)> = (0..30)
        .map(|i| match i % 6 {
            0 => ("duplicate", vec![job("q", 0), with_id(used)]),
            1 => ("paused", vec![job("q", 0), job("stopped", 0)]),
            2 => ("same new id", vec![with_id(fresh)]),
            3 => ("batch", vec![job("q", 0), job("r", 0), job("q", 0)]),
            _ => ("single", vec![job("q", 0)]),
        })
        .collect();
    let sent: Vec<_> = requests
        .into_iter()
        .map(|(kind, batch)| {
            let jobs = jobs.clone();
            tokio::spawn(async move { (kind, batch.len(), jobs.enqueue(NOW + 1, batch).await) })
        })
        .collect();
    let (mut stored, mut fresh_taken) = (Vec::new(), 0);
    for request in sent {
        let (kind, size, outcome) = request.await.unwrap();
        match (kind, outcome) {
            ("duplicate", Err(EngineError::Duplicate { id, index: Some(1) })) => assert_eq!(id, used),
            ("paused", Err(EngineError::QueuePaused { queue, index: Some(1) })) => assert_eq!(queue, "stopped"),
            ("same new id", Ok(enqueued)) => {
                fresh_taken += 1;
                stored.extend(enqueued.iter().map(|e| e.job.id));
            }
            ("same new id", Err(EngineError::Duplicate { id, .. })) => assert_eq!(id, fresh),
            ("batch" | "single", Ok(enqueued)) => {
                assert_eq!(enqueued.len(), size);
                stored.extend(enqueued.iter().map(|e| e.job.id));
            }
            (kind, other) => panic!("{kind}: unexpected {other:?}"),
        }
    }
    assert_eq!(fresh_taken, 1, "one of the requests with the same new id got it");
    assert_eq!(stored.len(), 1 + 5 * 3 + 10, "every accepted job, and only those");
    for id in &stored {
        assert!(jobs.job(*id).await.unwrap().is_some(), "job {id} stored");
    }
    let (queues, _) = jobs.queues_page(None, 10).await.unwrap();
    let waiting: u64 = queues.iter().map(|queue| queue.count(JobState::Available)).sum();
    assert_eq!(waiting, 1 + stored.len() as u64, "nothing of a refused request was stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_enqueues_at_once_store_every_job_and_its_events() {
    use svc::backend::EventFilter;
    let server = TempPostgres::start();
    let pool = open(&PgSettings::new(server.database("plain"))).await.unwrap();
    let jobs = Arc::new(PgJobs::new(pool));
    let later = |queue: &str| {
        let job = JobBuilder::new("work").args([1]).queue(queue).scheduled_at(NOW + 60_000);
        job.build(&JobDefaults::default()).unwrap()
    };

    // 20 requests at once with fresh ids and no unique policy: some of one
    // job, some of two, a third of them scheduled, over new queues.
    let sent: Vec<_> = (0..20)
        .map(|i| {
            let jobs = jobs.clone();
            let queue = format!("q{}", i % 4);
            let batch = if i % 3 == 0 { vec![later(&queue)] } else { vec![job(&queue, 0), job(&queue, 1)] };
            tokio::spawn(async move { jobs.enqueue(NOW, batch).await.unwrap() })
        })
        .collect();
    let mut stored = Vec::new();
    for request in sent {
        stored.extend(request.await.unwrap().into_iter().map(|enqueued| enqueued.job));
    }
    assert_eq!(stored.len(), 7 + 13 * 2);
    let page = jobs.events_page(None, 1000, &EventFilter::default()).await.unwrap();
    for job in &stored {
        let found = jobs.job(job.id).await.unwrap().expect("stored");
        assert_eq!((found.state, &found.queue), (job.state, &job.queue));
        let mut types: Vec<&str> = page
            .events
            .iter()
            .filter(|event| event.job.as_ref().is_some_and(|of| of.id == job.id))
            .map(|event| event.kind.type_name())
            .collect();
        types.sort_unstable();
        let expected: &[&str] =
            if job.state == JobState::Scheduled { &["job.enqueued", "job.scheduled"] } else { &["job.enqueued"] };
        assert_eq!(types, expected, "the events of job {}", job.id);
    }
    assert_eq!(page.events.len(), 7 * 2 + 13 * 2, "no other event");
    let (queues, _) = jobs.queues_page(None, 10).await.unwrap();
    let names: HashSet<String> = queues.iter().map(|queue| queue.name.to_string()).collect();
    assert!(["q0", "q1", "q2", "q3"].iter().all(|name| names.contains(*name)), "new queues recorded: {names:?}");
}

/// An ack of a job this node claimed completes it from the claim only while
/// the row is still as the claim left it: after a heartbeat, or once the
/// claim ran out and another node's worker claimed the job, the ack is
/// checked against the row as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_completes_a_claim_only_while_the_row_still_holds_it() {
    use svc::backend::EventFilter;
    let server = TempPostgres::start();
    let url = server.database("claims_held");
    let jobs = PgJobs::new(open(&PgSettings::new(url.clone())).await.unwrap());
    let other_node = PgJobs::new(open(&PgSettings::new(url)).await.unwrap());
    jobs.enqueue(NOW, (0..3).map(|_| job("q", 0)).collect()).await.unwrap();
    let claimed = jobs.claim(NOW + 1, &fetch(&["q"], 3, "w")).await.unwrap();
    let (plain, beaten, lost) = (claimed[0].id, claimed[1].id, claimed[2].id);

    // The plain case: completed with its result, moved to the history.
    let acked = jobs.ack(NOW + 2, plain, Some("{\"ok\":true}".into()), Some("w")).await.unwrap();
    assert_eq!((acked.state, acked.run().completed_at), (JobState::Completed, Some(NOW + 2)));
    let stored = other_node.job(plain).await.unwrap().unwrap();
    assert_eq!((stored.state, stored.run().result.as_deref()), (JobState::Completed, Some("{\"ok\":true}")));

    // A heartbeat and a progress report changed the claim's row: the ack
    // completes the job as the row holds it, with its progress.
    jobs.extend_claims(NOW + 3, "w", Some(&[beaten]), Some(120_000)).await.unwrap();
    jobs.report_progress(NOW + 3, beaten, svc::job::JobProgress::new(0.5), Some("w")).await.unwrap();
    let acked = jobs.ack(NOW + 4, beaten, None, Some("w")).await.unwrap();
    assert_eq!(acked.state, JobState::Completed);
    assert_eq!(acked.progress().map(|progress| progress.fraction), Some(0.5), "completed from the row as it is");

    // The claim ran out, and a worker of the other node claimed the job:
    // this node still remembers the first claim, which no longer holds.
    assert_eq!(other_node.expire_claims(NOW + 61_000, 10).await.unwrap(), 1);
    let later = NOW + 3_600_000;
    other_node.promote_due(later, 10).await.unwrap();
    let again = other_node.claim(later, &fetch(&["q"], 1, "x")).await.unwrap();
    assert_eq!(again.iter().map(|job| job.id).collect::<Vec<_>>(), vec![lost]);
    let refused = jobs.ack(later + 1, lost, None, Some("w")).await;
    assert!(matches!(refused, Err(EngineError::Conflict { reason: ConflictReason::NotOwner, .. })), "{refused:?}");
    let row = jobs.job(lost).await.unwrap().unwrap();
    assert_eq!((row.state, row.run().worker_id.as_deref()), (JobState::Active, Some("x")), "left to its holder");
    let completed = other_node.ack(later + 2, lost, None, Some("x")).await.unwrap();
    assert_eq!(completed.state, JobState::Completed);

    let events = jobs.events_page(None, 100, &EventFilter::default()).await.unwrap().events;
    let mut completions: Vec<_> = events
        .iter()
        .filter(|event| event.kind.type_name() == "job.completed")
        .map(|event| event.job.as_ref().unwrap().id)
        .collect();
    completions.sort_unstable();
    let mut expected = vec![plain, beaten, lost];
    expected.sort_unstable();
    assert_eq!(completions, expected, "one event a completion");
}

/// A claim is written as columns, the job's stored body left as it was:
/// every read of the job (by id, in the listing, in its `job.started`
/// event) shows it exactly as the claim answered it (the event without the
/// job's arguments when the checked path wrote it), and the claim runs out
/// at its visibility or execution timeout, whichever comes first. A row
/// written before claims were columns (no timeouts in its columns) is
/// claimed too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_written_as_columns_reads_back_as_the_claim_answered() {
    use std::time::Duration;
    use svc::backend::EventFilter;
    use svc::engine::JobFilter;
    let server = TempPostgres::start();
    let pool = open(&PgSettings::new(server.database("claim_columns"))).await.unwrap();
    let jobs = PgJobs::new(pool.clone());
    let timed = |visibility_ms: u64| {
        let job = JobBuilder::new("work").args([1]).queue("q").timeout(Duration::from_secs(30));
        job.visibility_timeout(Duration::from_millis(visibility_ms)).build(&JobDefaults::default()).unwrap()
    };
    let enqueued = jobs.enqueue(NOW, vec![timed(20_000), timed(90_000), timed(20_000)]).await.unwrap();
    let ids: Vec<_> = enqueued.iter().map(|enqueued| enqueued.job.id).collect();
    let client = pool.get().await.unwrap();
    client
        .execute(
            "UPDATE svc_jobs SET visibility_ms = NULL, timeout_ms = NULL WHERE id = $1::text::uuid",
            &[&ids[2].to_string()],
        )
        .await
        .unwrap();

    // Two with the jobs' own visibility timeouts, then the old row with the
    // fetch's (5 s).
    let own =
        FetchRequest { queues: vec!["q".into()], count: 2, worker_id: Some("w".into()), visibility_timeout_ms: None };
    let mut claimed = jobs.claim(NOW + 1, &own).await.unwrap();
    assert_eq!(claimed.iter().map(|job| job.id).collect::<Vec<_>>(), ids[..2]);
    let short = FetchRequest { visibility_timeout_ms: Some(5_000), ..fetch(&["q"], 1, "v") };
    claimed.extend(jobs.claim(NOW + 2, &short).await.unwrap());
    assert_eq!(claimed.len(), 3);
    assert_eq!(claimed[0].run().visibility_deadline, Some(NOW + 1 + 20_000));
    assert_eq!(claimed[1].run().execution_deadline, Some(NOW + 1 + 30_000));
    assert_eq!((claimed[2].run().worker_id.as_deref(), claimed[2].attempt), (Some("v"), 1));

    let listed = jobs.jobs_page(&JobFilter::all(), None, 10).await.unwrap().jobs;
    let events = jobs.events_page(None, 100, &EventFilter::default()).await.unwrap().events;
    for job in &claimed {
        assert_eq!(jobs.job(job.id).await.unwrap().as_deref(), Some(job.as_ref()), "read by id");
        assert_eq!(listed.iter().find(|found| found.id == job.id), Some(job), "listed");
        // The one statement's claim copies the whole row into its event;
        // the checked path (the old row's) writes the job as events hold
        // it, without its arguments (docs/postgres.md, "Events").
        let mut expected = job.as_ref().clone();
        if job.id == ids[2] {
            expected.payload = JobPayload::new("work", "[]", "{}", Vec::new(), Vec::new());
        }
        let started: Vec<_> = events
            .iter()
            .filter(|event| event.kind.type_name() == "job.started")
            .filter_map(|event| event.job.as_deref().filter(|of| of.id == job.id))
            .collect();
        assert_eq!(started, vec![&expected], "its job.started event");
    }

    // Each claim runs out at its lease, soonest first: the old row's at the
    // fetch's visibility timeout, the first job's at its own, the second's
    // at its execution timeout (its visibility is longer).
    for (lease, id) in [(NOW + 2 + 5_000, ids[2]), (NOW + 1 + 20_000, ids[0]), (NOW + 1 + 30_000, ids[1])] {
        assert_eq!(jobs.expire_claims(lease - 1, 10).await.unwrap(), 0, "not before {lease}");
        assert_eq!(jobs.expire_claims(lease, 10).await.unwrap(), 1, "at {lease}");
        let job = jobs.job(id).await.unwrap().unwrap();
        assert_ne!(job.state, JobState::Active, "job {id} given back");
        assert_eq!(job.attempt, 1);
    }
}
