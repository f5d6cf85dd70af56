//! Shutdowns and restarts: nothing in hand is lost, nothing runs twice.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{Server, eventually, logs};
use svc_client::{Client, Enqueue, Job, JobContext, JobError, JobState, RequestRetry, Worker};

type Runs = Arc<Mutex<HashMap<u64, u32>>>;

/// A worker whose `test.work` handler counts its runs and takes `pause`.
fn worker(
    client: &Client,
    runs: Runs,
    pause: Duration,
    build: impl FnOnce(svc_client::WorkerBuilder) -> svc_client::WorkerBuilder,
) -> Worker {
    let mut worker = build(Worker::builder().queues(["work"]).handle_signals(false)).build(client.clone());
    worker.handle("test.work", move |n: u64, _ctx: JobContext| {
        let runs = runs.clone();
        async move {
            tokio::time::sleep(pause).await;
            *runs.lock().unwrap().entry(n).or_default() += 1;
            Ok::<_, JobError>(n)
        }
    });
    worker
}

async fn enqueue(client: &Client, count: u64) -> Vec<Job> {
    let jobs = (0..count).map(|n| Enqueue::new("test.work").args(&n).queue("work")).collect();
    client.enqueue_batch(jobs).await.unwrap()
}

async fn states(client: &Client, jobs: &[Job]) -> HashMap<JobState, usize> {
    let mut states = HashMap::new();
    for job in jobs {
        *states.entry(client.get(&job.id).await.unwrap().state).or_default() += 1;
    }
    states
}

fn ran(runs: &Runs) -> usize {
    runs.lock().unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_finishes_the_jobs_in_hand() {
    logs();
    let Some(server) = Server::start() else { return };
    let client = server.client();
    let jobs = enqueue(&client, 24).await;
    let runs: Runs = Arc::default();
    let first = worker(&client, runs.clone(), Duration::from_millis(300), |b| {
        b.concurrency(4).shutdown_grace(Duration::from_secs(10))
    });
    let stop = first.stop_handle();
    let running = tokio::spawn(first.run());
    eventually(Duration::from_secs(10), "some jobs to finish", || async { (ran(&runs) >= 4).then_some(()) }).await;
    stop.stop();
    running.await.unwrap().unwrap();
    // Every job taken was finished and acked; the rest wait untouched.
    let after_stop = states(&client, &jobs).await;
    let done = ran(&runs);
    assert_eq!(after_stop.get(&JobState::Completed).copied().unwrap_or(0), done, "{after_stop:?}");
    assert_eq!(after_stop.get(&JobState::Available).copied().unwrap_or(0), 24 - done, "{after_stop:?}");
    assert!(done < 24, "the stop came before the queue was drained");

    let second = worker(&client, runs.clone(), Duration::from_millis(1), |b| b.concurrency(8));
    let stop = second.stop_handle();
    let running = tokio::spawn(second.run());
    eventually(Duration::from_secs(10), "every job to run", || async { (ran(&runs) == 24).then_some(()) }).await;
    stop.stop();
    running.await.unwrap().unwrap();
    assert!(runs.lock().unwrap().values().all(|&count| count == 1), "no job ran twice: {runs:?}");
    assert_eq!(states(&client, &jobs).await.get(&JobState::Completed), Some(&24));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_past_the_grace_period_are_released_at_once() {
    logs();
    let Some(server) = Server::start() else { return };
    let client = server.client();
    let jobs = enqueue(&client, 3).await;
    let runs: Runs = Arc::default();
    let slow = worker(&client, runs.clone(), Duration::from_secs(30), |b| {
        b.concurrency(3).shutdown_grace(Duration::from_millis(300)).abort_grace(Duration::from_millis(100))
    });
    let stop = slow.stop_handle();
    let running = tokio::spawn(slow.run());
    eventually(Duration::from_secs(5), "the jobs to be claimed", || async {
        (states(&client, &jobs).await.get(&JobState::Active) == Some(&3)).then_some(())
    })
    .await;
    stop.stop();
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("the worker stops after its grace")
        .unwrap()
        .unwrap();
    for job in &jobs {
        let job = client.get(&job.id).await.unwrap();
        assert_eq!((job.state, job.attempt), (JobState::Available, 0), "released with the attempt given back");
        assert_eq!(job.errors.last().map(|error| error.error_type.as_str()), Some("worker_shutdown"));
    }
    assert_eq!(ran(&runs), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_carries_on_when_the_server_is_killed_and_restarted() {
    logs();
    let Some(mut server) = Server::start() else { return };
    // No retries in the transport: the worker's own reconnects and ack
    // retries carry it through.
    let client = Client::builder(server.url()).retry(RequestRetry::none()).build().unwrap();
    let jobs = enqueue(&client, 120).await;
    let runs: Runs = Arc::default();
    let busy = worker(&client, runs.clone(), Duration::from_millis(20), |b| {
        // Jobs claimed by an answer lost in the crash come back after 2 s.
        b.concurrency(8)
            .visibility_timeout(Duration::from_secs(2))
            .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
    });
    let stop = busy.stop_handle();
    let running = tokio::spawn(busy.run());
    eventually(Duration::from_secs(10), "a third of the jobs to run", || async { (ran(&runs) >= 40).then_some(()) })
        .await;
    server.kill();
    let at_kill = ran(&runs);
    tokio::time::sleep(Duration::from_millis(700)).await;
    server.restart();
    eprintln!("killed after {at_kill} jobs ran, restarted after {} ran", ran(&runs));
    eventually(Duration::from_secs(60), "every job to run", || async { (ran(&runs) == 120).then_some(()) }).await;
    let completed = eventually(Duration::from_secs(30), "every job to complete", || async {
        let states = states(&client, &jobs).await;
        (states.get(&JobState::Completed) == Some(&120)).then_some(states)
    })
    .await;
    stop.stop();
    running.await.unwrap().unwrap();
    assert_eq!(completed.len(), 1);
    let twice: Vec<_> = runs.lock().unwrap().iter().filter(|(_, count)| **count > 1).map(|(n, _)| *n).collect();
    assert!(twice.is_empty(), "jobs ran twice: {twice:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_server_gets_its_jobs_back_and_the_worker_waits_for_it() {
    logs();
    let Some(mut server) = Server::start() else { return };
    let client = server.client();
    let runs: Runs = Arc::default();
    let release = Arc::new(tokio::sync::Notify::new());
    let gate = release.clone();
    let mut worker = Worker::builder()
        .queues(["work"])
        .concurrency(2)
        .visibility_timeout(Duration::from_millis(600))
        .abort_grace(Duration::from_millis(100))
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(300))
        .handle_signals(false)
        .build(client.clone());
    let counter = runs.clone();
    worker.handle("test.work", move |n: u64, ctx: JobContext| {
        let runs = counter.clone();
        let gate = gate.clone();
        async move {
            *runs.lock().unwrap().entry(n).or_default() += 1;
            tokio::select! {
                () = gate.notified() => Ok(n),
                () = ctx.cancelled() => Err(JobError::msg("released")),
            }
        }
    });
    let stop = worker.stop_handle();
    let running = tokio::spawn(worker.run());
    let held = client.enqueue(Enqueue::new("test.work").args(&1).queue("work")).await.unwrap();
    eventually(Duration::from_secs(5), "the job to start", || async { (ran(&runs) == 1).then_some(()) }).await;

    // SIGTERM: the server answers `terminate` to every worker and exits
    // once no job is active (well before its 30 s grace): the worker gave
    // its job back, and waits for the server.
    server.terminate();
    server.wait_exit(Duration::from_secs(15));
    server.restart();

    // The worker comes back by itself and runs the job again.
    eventually(Duration::from_secs(15), "the job to run again", || async {
        (ran(&runs) == 1 && runs.lock().unwrap()[&1] == 2).then_some(())
    })
    .await;
    release.notify_one();
    let completed = eventually(Duration::from_secs(5), "the job to complete", || async {
        client.get(&held.id).await.ok().filter(|job| job.state == JobState::Completed)
    })
    .await;
    assert!(!running.is_finished(), "the worker did not stop for the server's restart");
    stop.stop();
    running.await.unwrap().unwrap();
    // Released once (the attempt given back), then completed by its second run.
    let released: Vec<&str> = completed.errors.iter().map(|error| error.error_type.as_str()).collect();
    assert_eq!(released, ["worker_terminated"]);
    assert_eq!(completed.attempt, 1);
}

/// The worker process of [`sigterm_lets_the_jobs_in_hand_finish`]: runs only
/// when that test starts this binary again with `SVC_CLIENT_CHILD_URL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_child_worker() {
    let Ok(url) = std::env::var("SVC_CLIENT_CHILD_URL") else { return };
    let client = Client::new(url).unwrap();
    // Signals are handled by default.
    let mut worker = Worker::builder().queues(["work"]).concurrency(4).build(client);
    worker.handle("test.work", |n: u64, _ctx: JobContext| async move {
        tokio::time::sleep(Duration::from_millis(800)).await;
        Ok::<_, JobError>(n)
    });
    worker.run().await.unwrap();
    println!("child worker stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_jobs_in_hand_finish() {
    logs();
    if std::env::var_os("SVC_CLIENT_CHILD_URL").is_some() {
        return;
    }
    let Some(server) = Server::start() else { return };
    let client = server.client();
    let jobs = enqueue(&client, 12).await;
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["sigterm_child_worker", "--exact", "--nocapture", "--test-threads", "1"])
        .env("SVC_CLIENT_CHILD_URL", server.url())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let active = eventually(Duration::from_secs(10), "the child to take 4 jobs", || async {
        let states = states(&client, &jobs).await;
        (states.get(&JobState::Active) == Some(&4)).then_some(states)
    })
    .await;
    assert_eq!(active.get(&JobState::Available), Some(&8));
    let signalled = std::process::Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
    assert!(signalled.success());
    let status = tokio::task::spawn_blocking(move || {
        let output = child.wait_with_output().unwrap();
        (output.status, String::from_utf8_lossy(&output.stdout).to_string())
    })
    .await
    .unwrap();
    assert!(status.0.success(), "the child worker exits cleanly: {status:?}");
    assert!(status.1.contains("child worker stopped"), "{}", status.1);
    // The four jobs in hand were finished and acked, none released; the
    // rest were not touched.
    let after = states(&client, &jobs).await;
    assert_eq!((after.get(&JobState::Completed), after.get(&JobState::Available)), (Some(&4), Some(&8)), "{after:?}");
    for job in &jobs {
        let job = client.get(&job.id).await.unwrap();
        assert!(job.errors.is_empty(), "nothing was released or failed: {:?}", job.errors);
    }
}
