//! Dispatch limits on the PostgreSQL backend, against a real PostgreSQL
//! server of the test's own, at the times the test gives: a rate is a
//! sliding window and keys are independent; a held job holds the jobs
//! behind it under its key; claims without a rate count toward none; a
//! concurrency cap holds across two nodes claiming at once; a claim passes
//! over many keys at their limit to the jobs behind them, and a key held in
//! one queue holds nothing in another; and a long-poll
//! fetch held back by a window gets the job when the window opens.

mod common;

use std::sync::Arc;

use common::postgres::TempPostgres;
use svc::backend::postgres::{PgJobs, PgSettings, open};
use svc::engine::FetchRequest;
use svc::job::{DispatchLimit, JobBuilder, JobDefaults, JobId, NewJob, RateWindow};

const NOW: i64 = 1_800_000_000_000;

async fn node(url: &str) -> Arc<PgJobs> {
    Arc::new(PgJobs::new(open(&PgSettings::new(url)).await.expect("the schema migrates")))
}

fn limited(queue: &str, n: u64, limit: DispatchLimit) -> NewJob {
    JobBuilder::new("report.build").args([n]).queue(queue).rate_limit(limit).build(&JobDefaults::default()).unwrap()
}

fn limit(key: &str, concurrency: Option<u32>, rate: Option<(u32, u64)>) -> DispatchLimit {
    let rate = rate.map(|(count, period_ms)| RateWindow { count, period_ms });
    DispatchLimit { key: Some(key.to_string()), concurrency, rate }
}

async fn claim(jobs: &PgJobs, at: i64, queue: &str) -> Vec<JobId> {
    let request = FetchRequest {
        queues: vec![queue.into()],
        count: 10,
        worker_id: Some("w".into()),
        visibility_timeout_ms: None,
    };
    jobs.claim(at, &request).await.unwrap().iter().map(|job| job.id).collect()
}

async fn enqueue(jobs: &PgJobs, job: NewJob) -> JobId {
    jobs.enqueue(NOW, vec![job]).await.unwrap()[0].job.id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_is_a_sliding_window_and_keys_are_independent() {
    let server = TempPostgres::start();
    let jobs = node(&server.database("windows")).await;
    for n in 0..4 {
        enqueue(&jobs, limited("q", n, limit("api", None, Some((2, 60_000))))).await;
    }
    let other = enqueue(&jobs, limited("q", 9, limit("other", None, Some((1, 1_000))))).await;
    assert_eq!(claim(&jobs, NOW, "q").await.len(), 3, "two under `api`, one under `other`");
    assert!(claim(&jobs, NOW + 30_000, "q").await.is_empty());
    assert!(claim(&jobs, NOW + 59_999, "q").await.is_empty(), "both claims are still inside the window");
    assert_eq!(claim(&jobs, NOW + 60_000, "q").await.len(), 2, "the window moved past both claims");
    assert_eq!(jobs.job(other).await.unwrap().unwrap().state, svc::job::JobState::Active);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_job_holds_the_jobs_behind_it_under_its_key() {
    let server = TempPostgres::start();
    let jobs = node(&server.database("behind")).await;
    let three_an_hour = || limit("k", None, Some((3, 3_600_000)));
    let hourly = [
        enqueue(&jobs, limited("q", 0, three_an_hour())).await,
        enqueue(&jobs, limited("q", 1, three_an_hour())).await,
    ];
    let quick = enqueue(&jobs, limited("q", 2, limit("k", None, Some((1, 1_000))))).await;
    let last = enqueue(&jobs, limited("q", 3, three_an_hour())).await;
    assert_eq!(claim(&jobs, NOW, "q").await, hourly, "the per-second job waits, and the job behind it");
    assert_eq!(claim(&jobs, NOW + 2_000, "q").await, [quick], "its second has passed; the hour holds three claims");
    assert!(claim(&jobs, NOW + 4_000, "q").await.is_empty(), "three claims in the hour");
    assert_eq!(claim(&jobs, NOW + 3_600_000, "q").await, [last], "the first two claims left the hour");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_passes_over_many_keys_at_their_limit_to_the_jobs_behind() {
    let server = TempPostgres::start();
    let jobs = node(&server.database("many_keys")).await;
    let hourly = |key: usize| limit(&format!("customer-{key}"), None, Some((1, 3_600_000)));
    let first: Vec<NewJob> = (0..300).map(|key| limited("q", key as u64, hourly(key))).collect();
    jobs.enqueue(NOW, first).await.unwrap();
    let mut claimed = 0;
    while claimed < 300 {
        let got = claim(&jobs, NOW, "q").await.len();
        assert!(got > 0, "each key lets one claim in");
        claimed += got;
    }
    // 300 jobs held back by their keys, then one free job and one of a new key.
    let held: Vec<NewJob> = (0..300).map(|key| limited("q", key as u64, hourly(key))).collect();
    let held: Vec<JobId> = jobs.enqueue(NOW, held).await.unwrap().iter().map(|enqueued| enqueued.job.id).collect();
    let free = enqueue(&jobs, JobBuilder::new("t").queue("q").build(&JobDefaults::default()).unwrap()).await;
    let fresh = enqueue(&jobs, limited("q", 0, hourly(300))).await;
    let request = FetchRequest { queues: vec!["q".into()], count: 1, worker_id: None, visibility_timeout_ms: None };
    let one = jobs.claim(NOW + 1, &request).await.unwrap();
    assert_eq!(one.iter().map(|job| job.id).collect::<Vec<_>>(), [free]);
    assert_eq!(claim(&jobs, NOW + 2, "q").await, [fresh]);
    assert!(claim(&jobs, NOW + 3, "q").await.is_empty(), "every key is at its limit");
    // An hour on, the held jobs come in their order, none skipped.
    let mut later = Vec::new();
    while later.len() < 300 {
        let got = claim(&jobs, NOW + 3_600_000, "q").await;
        assert!(!got.is_empty());
        later.extend(got);
    }
    assert_eq!(later, held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_in_one_queue_holds_nothing_in_another() {
    let server = TempPostgres::start();
    let jobs = node(&server.database("two_queues")).await;
    let hourly = |count: u32| limit("k", None, Some((count, 3_600_000)));
    enqueue(&jobs, limited("a", 0, hourly(1))).await;
    assert_eq!(claim(&jobs, NOW, "a").await.len(), 1, "the key's one claim of the hour");
    // Under the same key: one job at its limit in `a`, one with room in `b`.
    let held = enqueue(&jobs, limited("a", 1, hourly(1))).await;
    let roomy = enqueue(&jobs, limited("b", 2, hourly(2))).await;
    let both =
        FetchRequest { queues: vec!["a".into(), "b".into()], count: 10, worker_id: None, visibility_timeout_ms: None };
    let claimed: Vec<JobId> = jobs.claim(NOW + 1, &both).await.unwrap().iter().map(|job| job.id).collect();
    assert_eq!(claimed, [roomy], "each queue's next job under the key is decided by its own limit");
    assert_eq!(jobs.job(held).await.unwrap().unwrap().state, svc::job::JobState::Available);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_of_jobs_without_a_rate_count_toward_no_rate() {
    let server = TempPostgres::start();
    let jobs = node(&server.database("mixed")).await;
    let capped = || limit("mixed", Some(5), None);
    let rated = || limit("mixed", Some(5), Some((2, 60_000)));
    let ids = [
        enqueue(&jobs, limited("q", 0, capped())).await,
        enqueue(&jobs, limited("q", 1, rated())).await,
        enqueue(&jobs, limited("q", 2, capped())).await,
        enqueue(&jobs, limited("q", 3, rated())).await,
        enqueue(&jobs, limited("q", 4, rated())).await,
    ];
    assert_eq!(claim(&jobs, NOW, "q").await, ids[..4], "two rated claims fit the minute; the third waits");
    assert!(claim(&jobs, NOW + 59_999, "q").await.is_empty());
    assert_eq!(claim(&jobs, NOW + 60_000, "q").await, [ids[4]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_cap_holds_across_two_nodes_claiming_at_once() {
    let server = TempPostgres::start();
    let url = server.database("nodes");
    let (a, b) = (node(&url).await, node(&url).await);
    for n in 0..40 {
        enqueue(&a, limited(if n % 2 == 0 { "even" } else { "odd" }, n, limit("shared", Some(3), None))).await;
    }
    let mut claims = Vec::new();
    for round in 0..10 {
        for (store, queue) in [(a.clone(), "even"), (b.clone(), "odd")] {
            claims.push(tokio::spawn(async move { claim(&store, NOW + round, queue).await.len() }));
        }
    }
    let mut claimed = 0;
    for handle in claims {
        claimed += handle.await.unwrap();
    }
    assert_eq!(claimed, 3, "three active under the key, whichever node claimed");
}

/// A long-poll fetch held back by a rate window is answered when the window
/// opens, not when the listener's recheck (2 s) or its own wait comes round:
/// no notification tells of a window opening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_held_back_by_a_window_gets_the_job_when_it_opens() {
    let server = TempPostgres::start();
    let settings = PgSettings::new(server.database("long_poll"));
    let jobs = node(&settings.url).await;
    let _listener = jobs.listen(&settings).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !jobs.listening() {
        assert!(std::time::Instant::now() < deadline, "the listener connects");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // This test's clock runs in real time: the waiting fetch sleeps for real.
    let started = std::time::Instant::now();
    let now = move || NOW + started.elapsed().as_millis() as i64;
    enqueue(&jobs, limited("lp", 0, limit("lp", None, Some((1, 1_000))))).await;
    let second = enqueue(&jobs, limited("lp", 1, limit("lp", None, Some((1, 1_000))))).await;
    assert_eq!(claim(&jobs, now(), "lp").await.len(), 1);

    let request = FetchRequest { queues: vec!["lp".into()], count: 1, worker_id: None, visibility_timeout_ms: None };
    let waited = std::time::Instant::now();
    let got = jobs.claim_waiting(&now, &request, std::time::Duration::from_millis(1_900)).await.unwrap();
    assert_eq!(got.iter().map(|job| job.id).collect::<Vec<_>>(), [second]);
    let waited = waited.elapsed();
    assert!(waited < std::time::Duration::from_millis(1_600), "answered after {waited:?}, not when the window opened");
}
