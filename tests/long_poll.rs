//! Long-poll fetch: a fetch with `wait_ms` that finds nothing waits in the
//! engine, is answered as soon as a job appears in one of its queues (first
//! come, first served), and is answered empty when its time is up, when the
//! server drains, or when its worker is told to stop.

mod common;

use common::{FixedEntropy, TestServer};
use serde_json::json;
use std::sync::Arc;
use svc::backend::Backend;
use svc::clock::ManualClock;
use svc::engine::{Engine, EngineConfig, FetchRequest};
use svc::job::{JobDefaults, JobId, parse_enqueue_body};

fn engine() -> (tempfile::TempDir, ManualClock, Engine) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_800_000_000_000);
    let mut config = EngineConfig::new(dir.path());
    config.clock = Arc::new(clock.clone());
    config.wiring.entropy = Box::new(FixedEntropy(0));
    config.wiring.check_invariants = true;
    let engine = Engine::open(config).unwrap();
    (dir, clock, engine)
}

fn request(queue: &str, worker: Option<&str>) -> FetchRequest {
    FetchRequest {
        queues: vec![queue.to_string()],
        count: 1,
        worker_id: worker.map(str::to_string),
        visibility_timeout_ms: None,
    }
}

fn enqueue(engine: &Engine, queue: &str) -> JobId {
    let body = json!({"type": "t", "args": [], "options": {"queue": queue}}).to_string();
    let job = parse_enqueue_body(body.as_bytes(), &JobDefaults::default()).unwrap();
    engine.handle().enqueue(vec![job]).wait().unwrap()[0].job.id
}

#[test]
fn waiting_fetches_get_new_jobs_first_come_first_served() {
    let (_dir, _clock, engine) = engine();
    let handle = engine.handle();
    let first = handle.fetch_waiting(request("mail", None), 10_000);
    let second = handle.fetch_waiting(request("mail", None), 10_000);
    handle.probe().wait().unwrap();
    let other_queue = enqueue(&engine, "other");
    let a = enqueue(&engine, "mail");
    let got: Vec<JobId> = first.wait().unwrap().iter().map(|job| job.id).collect();
    assert_eq!(got, [a], "the first waiting fetch gets the first job");
    let b = enqueue(&engine, "mail");
    assert_eq!(second.wait().unwrap()[0].id, b);
    assert_eq!(handle.job(other_queue).unwrap().state, svc::job::JobState::Available);
    engine.close();
}

#[test]
fn a_waiting_fetch_is_answered_empty_when_its_time_is_up() {
    let (_dir, clock, engine) = engine();
    let handle = engine.handle();
    // Still waiting a millisecond before its time: it gets a job then.
    let waiting = handle.fetch_waiting(request("mail", None), 2_000);
    handle.probe().wait().unwrap();
    clock.advance_ms(1_999);
    handle.probe().wait().unwrap();
    let job = enqueue(&engine, "mail");
    assert_eq!(waiting.wait().unwrap()[0].id, job);
    // At its time, it is answered empty, and a later job is left for others.
    let waiting = handle.fetch_waiting(request("mail", None), 2_000);
    handle.probe().wait().unwrap();
    clock.advance_ms(2_000);
    handle.probe().wait().unwrap();
    assert!(waiting.wait().unwrap().is_empty());
    let later = enqueue(&engine, "mail");
    assert_eq!(handle.job(later).unwrap().state, svc::job::JobState::Available, "nobody claimed it");
    engine.close();
}

#[test]
fn a_drain_or_a_signal_releases_waiting_fetches_and_a_paused_queue_keeps_them_waiting() {
    let (_dir, _clock, engine) = engine();
    let handle = engine.handle();
    let worker = handle.fetch_waiting(request("mail", Some("w-1")), 10_000);
    handle.probe().wait().unwrap();
    handle.signal_worker("w-1".into(), svc::engine::WorkerSignal::Quiet).wait().unwrap();
    assert!(worker.wait().unwrap().is_empty(), "a quiet worker's fetch is released");

    handle.pause_queue("mail".into(), true).wait().unwrap();
    let waiting = handle.fetch_waiting(request("mail", None), 10_000);
    handle.probe().wait().unwrap();
    handle.pause_queue("mail".into(), false).wait().unwrap();
    let job = enqueue(&engine, "mail");
    assert_eq!(waiting.wait().unwrap()[0].id, job, "answered once the queue runs again");

    let drained = handle.fetch_waiting(request("mail", None), 10_000);
    handle.probe().wait().unwrap();
    handle.begin_drain().wait().unwrap();
    assert!(drained.wait().unwrap().is_empty(), "a drain releases waiting fetches");
    engine.close();
}

/// Enqueues a job with `options` into `queue`.
fn enqueue_with(engine: &Engine, queue: &str, mut options: serde_json::Value) -> JobId {
    options["queue"] = json!(queue);
    let body = json!({"type": "t", "args": [], "options": options}).to_string();
    let job = parse_enqueue_body(body.as_bytes(), &JobDefaults::default()).unwrap();
    engine.handle().enqueue(vec![job]).wait().unwrap()[0].job.id
}

/// What a case is called, how it makes a job that is not available yet, and
/// how it then makes that job available.
type WakeCase<'a> = (&'a str, &'a dyn Fn() -> JobId, &'a dyn Fn(JobId));

#[test]
fn a_waiting_fetch_wakes_on_every_way_a_job_becomes_available() {
    let (_dir, clock, engine) = engine();
    let handle = engine.handle();
    // Each case: set up a job that is not available yet, park a fetch, make
    // the job available the way the case says, and expect the fetch to get it.
    let cases: [WakeCase; 5] = [
        ("a scheduled job comes due", &|| enqueue_with(&engine, "a", json!({"delay_until": "+PT5S"})), &|_| {
            clock.advance_ms(5_000);
            handle.tick().wait().unwrap();
        }),
        (
            "a retry comes due",
            &|| {
                let id = enqueue_with(&engine, "b", json!({"retry": {"initial_interval": "PT2S", "jitter": false}}));
                handle.fetch(request("b", None)).wait().unwrap();
                let report = svc::job::FailureReport::server("E", "m");
                handle.fail(id, report, false, None).wait().unwrap();
                id
            },
            &|_| {
                clock.advance_ms(2_000);
                handle.tick().wait().unwrap();
            },
        ),
        (
            "a claim's visibility runs out",
            &|| {
                let id = enqueue_with(&engine, "c", json!({"visibility_timeout_ms": 3000}));
                handle.fetch(request("c", None)).wait().unwrap();
                id
            },
            &|_| {
                clock.advance_ms(3_000);
                handle.tick().wait().unwrap();
            },
        ),
        (
            "its queue is resumed",
            &|| {
                let id = enqueue_with(&engine, "d", json!({}));
                handle.pause_queue("d".into(), true).wait().unwrap();
                id
            },
            &|_| {
                handle.pause_queue("d".into(), false).wait().unwrap();
            },
        ),
        ("a staged job is activated", &|| enqueue_with(&engine, "e", json!({"pending": true})), &|id| {
            handle.activate(id).wait().unwrap();
        }),
    ];
    for (case, prepare, trigger) in cases {
        let id = prepare();
        let queue = handle.job(id).unwrap().queue.clone();
        let waiting = handle.fetch_waiting(request(&queue, None), 20_000);
        handle.probe().wait().unwrap();
        trigger(id);
        let got: Vec<JobId> = waiting.wait().unwrap().iter().map(|job| job.id).collect();
        assert_eq!(got, [id], "{case}");
    }
    // The concurrency case, written out: the held job goes once the active one is acked.
    let limit = json!({"rate_limit": {"concurrency": 1}});
    let first = enqueue_with(&engine, "f", limit.clone());
    handle.fetch(request("f", None)).wait().unwrap();
    let second = enqueue_with(&engine, "f", limit);
    let waiting = handle.fetch_waiting(request("f", None), 20_000);
    handle.probe().wait().unwrap();
    handle.ack(first, None, None).wait().unwrap();
    assert_eq!(waiting.wait().unwrap()[0].id, second, "a concurrency limit frees up");
    engine.close();
}

#[test]
fn wait_ms_over_http_is_checked_and_waits_for_a_job() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    for bad in [json!(-1), json!(20_001), json!("5"), json!(1.5)] {
        let answer = server.post("/svc/v1/workers/fetch", json!({"queues": ["mail"], "wait_ms": bad}));
        assert_eq!((answer.status, answer.body["error"]["details"]["field"].as_str()), (400, Some("wait_ms")));
    }
    let empty = server.post("/svc/v1/workers/fetch", json!({"queues": ["mail"], "wait_ms": 50}));
    assert_eq!((empty.status, empty.body["jobs"].clone()), (200, json!([])));

    let base = server.base.clone();
    let waiting = std::thread::spawn(move || {
        let client = common::http_client();
        let started = std::time::Instant::now();
        let answer: serde_json::Value = client
            .post(format!("{base}/svc/v1/workers/fetch"))
            .header("content-type", "application/svc+json")
            .body(json!({"queues": ["mail"], "wait_ms": 15_000}).to_string())
            .send()
            .unwrap()
            .json()
            .unwrap();
        (answer, started.elapsed())
    });
    // The fetch waits in the engine; a job then reaches it at once.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let id = server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "mail"}}));
    let (answer, elapsed) = waiting.join().unwrap();
    assert_eq!(answer["jobs"][0]["id"], id.as_str());
    assert!(elapsed < std::time::Duration::from_secs(10), "answered when the job came, not at the end");
}
