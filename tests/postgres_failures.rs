//! Failures of svc on PostgreSQL, each against a real PostgreSQL server of
//! the test's own: a node killed (`SIGKILL`) while it holds claims, the
//! leader killed between cron firings, and the database restarted under
//! load. Nothing acknowledged is lost, no attempt is handed out twice, no
//! cron firing is doubled or lost.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::postgres::TempPostgres;
use common::{http_client, spawn_server_with_env};
use serde_json::{Value, json};
use svc::backend::Backend;
use svc::backend::postgres::{PgBackend, PgSettings, open};
use svc::clock::ManualClock;
use svc::cron::parse_cron_body;
use svc::job::JobDefaults;

const MEDIA: &str = "application/svc+json";

fn post(client: &reqwest::blocking::Client, base: &str, path: &str, body: Value) -> Result<(u16, Value), String> {
    let response = client
        .post(format!("{base}/svc/v1{path}"))
        .header("content-type", MEDIA)
        .body(body.to_string())
        .send()
        .map_err(|error| error.to_string())?;
    Ok((response.status().as_u16(), response.json().unwrap_or(Value::Null)))
}

fn get(base: &str, path: &str) -> (u16, Value) {
    let response = http_client().get(format!("{base}/svc/v1{path}")).send().unwrap();
    (response.status().as_u16(), response.json().unwrap_or(Value::Null))
}

/// The `(id, attempt)` of each job a fetch answer hands out.
fn handed(body: &Value) -> Vec<(String, u64)> {
    let jobs = body["jobs"].as_array().cloned().unwrap_or_default();
    jobs.iter().map(|job| (job["id"].as_str().unwrap().to_string(), job["attempt"].as_u64().unwrap())).collect()
}

#[test]
fn a_node_killed_holding_claims_loses_no_job_and_no_attempt_goes_out_twice() {
    let postgres = TempPostgres::start();
    let url = postgres.database("killed");
    let env = [("SVC_POSTGRES_URL", url.as_str())];
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    // The first node started holds the leader lease, so the timers keep running.
    let (_node_a, a) = spawn_server_with_env(dirs[0].path(), &env);
    let (_node_b, b) = spawn_server_with_env(dirs[1].path(), &env);
    let (node_c, c) = spawn_server_with_env(dirs[2].path(), &env);
    let client = http_client();
    const JOBS: usize = 300;
    let jobs: Vec<Value> =
        (0..JOBS).map(|i| json!({"type": "work.item", "args": [i], "options": {"queue": "work"}})).collect();
    let (status, body) = post(&client, &a, "/jobs/batch", json!({ "jobs": jobs })).unwrap();
    assert_eq!(status, 201, "{body}");

    let handed_out = Arc::new(Mutex::new(Vec::new()));
    let acked = Arc::new(AtomicUsize::new(0));
    // Workers on the two nodes that live, each fetching and acking.
    let workers: Vec<_> = [(a.clone(), "wa"), (b.clone(), "wb")]
        .into_iter()
        .map(|(base, worker)| {
            let (handed_out, acked) = (handed_out.clone(), acked.clone());
            std::thread::spawn(move || {
                let client = http_client();
                let deadline = Instant::now() + Duration::from_secs(60);
                while acked.load(Ordering::SeqCst) < JOBS && Instant::now() < deadline {
                    let fetch = json!({"queues": ["work"], "count": 10, "worker_id": worker,
                        "visibility_timeout_ms": 10_000, "wait_ms": 200});
                    let (status, body) = post(&client, &base, "/workers/fetch", fetch).unwrap();
                    assert_eq!(status, 200, "{body}");
                    let jobs = handed(&body);
                    handed_out.lock().unwrap().extend(jobs.iter().cloned());
                    for (id, _) in jobs {
                        let (status, body) =
                            post(&client, &base, "/workers/ack", json!({"job_id": id, "worker_id": worker})).unwrap();
                        assert_eq!(status, 200, "{body}");
                        acked.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();

    // The third node hands 20 jobs to a worker, with a 1 s lease, and is killed.
    let fetch = json!({"queues": ["work"], "count": 20, "worker_id": "victim", "visibility_timeout_ms": 1_000});
    let (status, body) = post(&client, &c, "/workers/fetch", fetch).unwrap();
    assert_eq!(status, 200, "{body}");
    let victims = handed(&body);
    assert!(!victims.is_empty(), "the killed node held claims");
    handed_out.lock().unwrap().extend(victims.iter().cloned());
    drop(node_c);

    for worker in workers {
        worker.join().unwrap();
    }
    assert_eq!(acked.load(Ordering::SeqCst), JOBS, "every job was acked once, by the nodes that live");
    let handed_out = handed_out.lock().unwrap();
    let distinct: HashSet<_> = handed_out.iter().collect();
    assert_eq!(distinct.len(), handed_out.len(), "no attempt was handed out twice");
    assert_eq!(handed_out.len(), JOBS + victims.len(), "the killed node's jobs went out once more each");
    for (id, attempt) in &victims {
        let (status, body) = get(&a, &format!("/jobs/{id}"));
        assert_eq!(status, 200);
        assert_eq!(body["job"]["state"], "completed", "{body}");
        assert_eq!(body["job"]["attempt"].as_u64(), Some(attempt + 1), "run again once its lease ran out");
    }
}

/// 2027-01-15T08:00:00Z.
const NOW: i64 = 1_800_000_000_000;
const MINUTE: i64 = 60_000;

/// Waits (real time) until `probe` answers true.
async fn eventually(what: &str, mut probe: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !probe().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_between_firings_neither_doubles_nor_loses_one() {
    let server = TempPostgres::start();
    let settings = PgSettings::new(server.database("leader"));
    let pool = open(&settings).await.unwrap();
    let clock = Arc::new(ManualClock::new(NOW));
    let leader = PgBackend::start(&settings, clock.clone(), "node-a".into()).await.unwrap();
    let holder = async || -> Option<String> {
        let client = pool.get().await.unwrap();
        let row = client.query_opt("SELECT node FROM svc_leader WHERE role = 'timers'", &[]).await.unwrap();
        row.map(|row| row.get(0))
    };
    eventually("node-a leads", async || holder().await.as_deref() == Some("node-a")).await;
    let follower = PgBackend::start(&settings, clock.clone(), "node-b".into()).await.unwrap();

    let body = json!({"name": "tick", "expression": "* * * * *", "overlap_policy": "allow",
        "job_template": {"type": "tick", "args": [], "options": {"queue": "ticks"}}});
    let definition = parse_cron_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap();
    follower.cron_put(definition).outcome().await.unwrap();
    let firings = async || -> Vec<i64> {
        let client = pool.get().await.unwrap();
        let rows = client
            .query(
                "SELECT (extract(epoch FROM scheduled_at) * 1000)::int8 FROM svc_cron_firings ORDER BY scheduled_at",
                &[],
            )
            .await
            .unwrap();
        rows.iter().map(|row| row.get(0)).collect()
    };

    clock.set_ms(NOW + MINUTE);
    eventually("the first slot fires", async || firings().await.len() == 1).await;
    // Killed: its tasks end where they are; the lease is not given back.
    drop(leader);
    // The next slot comes due, and the dead leader's lease runs out (20 s).
    clock.set_ms(NOW + 2 * MINUTE + 25_000);
    eventually("node-b takes over", async || holder().await.as_deref() == Some("node-b")).await;
    eventually("the second slot fires", async || firings().await.len() == 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    assert_eq!(firings().await, [NOW + MINUTE, NOW + 2 * MINUTE], "each slot fired once");
    let entry = follower.cron("tick".into()).outcome().await.unwrap().unwrap();
    assert_eq!((entry.run_count, entry.next_run_at), (2, Some(NOW + 3 * MINUTE)));
    let client = pool.get().await.unwrap();
    let jobs: i64 = client.query_one("SELECT count(*) FROM svc_jobs WHERE queue = 'ticks'", &[]).await.unwrap().get(0);
    assert_eq!(jobs, 2, "one job a firing");
}

#[test]
fn the_database_restarted_under_load_answers_503_then_recovers_losing_nothing() {
    let mut postgres = TempPostgres::start();
    let url = postgres.database("restarted");
    let dir = tempfile::tempdir().unwrap();
    let (_node, base) = spawn_server_with_env(dir.path(), &[("SVC_POSTGRES_URL", url.as_str())]);

    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged = Arc::new(Mutex::new(Vec::<String>::new()));
    let refusals = Arc::new(Mutex::new(Vec::<(u16, Value)>::new()));
    let producer = {
        let (base, stop, acknowledged, refusals) = (base.clone(), stop.clone(), acknowledged.clone(), refusals.clone());
        std::thread::spawn(move || {
            let client = http_client();
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                i += 1;
                let job = json!({"type": "load.item", "args": [i], "options": {"queue": "load"}});
                match post(&client, &base, "/jobs", job) {
                    Ok((201, body)) => acknowledged.lock().unwrap().push(body["job"]["id"].as_str().unwrap().into()),
                    Ok(refused) => {
                        refusals.lock().unwrap().push(refused);
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(error) => panic!("svc itself must keep answering: {error}"),
                }
            }
        })
    };
    let until = |count: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while acknowledged.lock().unwrap().len() < count {
            assert!(Instant::now() < deadline, "enqueues did not get to {count}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    until(50);
    postgres.restart();
    let before = acknowledged.lock().unwrap().len();
    until(before + 50);
    stop.store(true, Ordering::SeqCst);
    producer.join().unwrap();

    let refusals = refusals.lock().unwrap();
    assert!(!refusals.is_empty(), "enqueues sent while the database was down were refused");
    for (status, body) in refusals.iter() {
        assert_eq!(*status, 503, "{body}");
        assert_eq!(body["error"]["code"], "backend_error", "{body}");
        assert_eq!(body["error"]["retryable"], true, "{body}");
    }
    for id in acknowledged.lock().unwrap().iter() {
        let (status, body) = get(&base, &format!("/jobs/{id}"));
        assert_eq!(status, 200, "acknowledged job {id} is there: {body}");
    }
}
