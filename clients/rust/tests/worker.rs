//! The worker against a real server and against an embedded svc: the same
//! handlers, both deployments.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use support::{Server, eventually, logs};
use svc_client::{
    CancelReason, Client, Enqueue, Enqueuer, Job, JobContext, JobError, JobState, Next, RetryPolicy, WorkSource, Worker,
};

#[derive(Serialize, Deserialize)]
struct Count {
    n: u64,
}

/// The handlers under test, registered the same way on every worker.
fn count_handlers(
    worker: &mut Worker,
    runs: Arc<Mutex<HashMap<u64, u32>>>,
    done: Arc<tokio::sync::Notify>,
    total: usize,
) {
    worker.handle("test.count", move |count: Count, ctx: JobContext| {
        let runs = runs.clone();
        let done = done.clone();
        async move {
            assert_eq!(ctx.attempt(), 1);
            tokio::time::sleep(Duration::from_millis(count.n % 3)).await;
            let finished = {
                let mut runs = runs.lock().unwrap();
                *runs.entry(count.n).or_default() += 1;
                runs.len()
            };
            if finished == total {
                done.notify_one();
            }
            Ok::<_, JobError>(json!({ "double": count.n * 2 }))
        }
    });
}

async fn each_job_once(source: impl WorkSource + Clone, producer: &dyn Enqueuer, total: usize) -> Vec<Job> {
    let jobs: Vec<Enqueue> =
        (0..total as u64).map(|n| Enqueue::new("test.count").args(&Count { n }).queue("count")).collect();
    let enqueued = producer.enqueue_batch(jobs).await.expect("the batch is stored");
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let done = Arc::new(tokio::sync::Notify::new());
    let mut worker = Worker::builder().queues(["count"]).concurrency(8).handle_signals(false).build(source);
    count_handlers(&mut worker, runs.clone(), done.clone(), total);
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(30), worker.run_until(async move { done.notified().await }))
        .await
        .expect("the jobs are drained in time")
        .expect("the worker runs");
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), total, "every job ran");
    assert!(runs.values().all(|&count| count == 1), "no job ran twice: {runs:?}");
    eprintln!("{total} jobs in {:?}", started.elapsed());
    enqueued
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_job_is_handled_once_over_http() {
    logs();
    let Some(server) = Server::start() else { return };
    let client = server.client();
    let enqueued = each_job_once(client.clone(), &client, 300).await;
    for job in enqueued.iter().step_by(37) {
        let job = client.get(&job.id).await.unwrap();
        assert_eq!(job.state, JobState::Completed);
        let n: Count = job.args_as().unwrap();
        assert_eq!(job.result, Some(json!({ "double": n.n * 2 })));
    }
    let stats = client.queues().stats("count").await.unwrap();
    assert_eq!(stats.states.get("completed"), Some(&300));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_job_is_handled_once_embedded() {
    logs();
    let dir = tempfile::tempdir().unwrap();
    let svc = svc_client::embedded::open(dir.path()).await.unwrap();
    let enqueued = each_job_once(svc.clone(), &svc, 300).await;
    for job in enqueued.iter().step_by(37) {
        let job = svc.job_view(&job.id).await;
        assert_eq!(job.state, JobState::Completed);
        let n: Count = job.args_as().unwrap();
        assert_eq!(job.result_as::<Value>().unwrap(), Some(json!({ "double": n.n * 2 })));
    }
    svc_client::embedded::close(svc).await;
}

/// Reads a job through the [`WorkSource`] side of an embedded svc.
trait JobView {
    async fn job_view(&self, id: &str) -> Job;
}

impl JobView for Arc<svc::Svc> {
    async fn job_view(&self, id: &str) -> Job {
        WorkSource::job(self, id.to_string()).await.unwrap().expect("the job exists")
    }
}

#[derive(Debug)]
struct SmtpError;

impl std::fmt::Display for SmtpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("421 try later")
    }
}

impl std::error::Error for SmtpError {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_retried_then_dead_lettered() {
    logs();
    let Some(server) = Server::start() else { return };
    let client = server.client();
    let policy =
        RetryPolicy::new().max_attempts(2).backoff(Duration::from_millis(100), 1.0).jitter(false).dead_letter();
    let job = client.enqueue(Enqueue::new("test.fail").queue("fail").retry(policy)).await.unwrap();
    let mut worker = Worker::builder().queues(["fail"]).handle_signals(false).build(client.clone());
    worker.handle("test.fail", |_: Value, _ctx: JobContext| async move { Err::<(), _>(SmtpError.into()) });
    let stop = worker.stop_handle();
    let running = tokio::spawn(worker.run());
    let discarded = eventually(Duration::from_secs(10), "the job to be discarded", || async {
        client.get(&job.id).await.ok().filter(|job| job.state == JobState::Discarded)
    })
    .await;
    stop.stop();
    running.await.unwrap().unwrap();
    assert_eq!(discarded.errors.len(), 2, "{:?}", discarded.errors);
    let error = discarded.error.expect("the last failure");
    assert_eq!(error.error_type, "SmtpError");
    assert_eq!(error.message, "421 try later");
    let dead = client.dead_letter().list(Some("fail"), &Default::default()).await.unwrap();
    assert_eq!(dead.items.iter().map(|job| job.id.as_str()).collect::<Vec<_>>(), [job.id.as_str()]);
    let retried = client.dead_letter().retry(&job.id).await.unwrap();
    assert_eq!((retried.state, retried.attempt), (JobState::Available, 0));
    client.cancel(&job.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_claim_past_its_visibility_timeout() {
    logs();
    let Some(server) = Server::start() else { return };
    let client = server.client();
    let job = client
        .enqueue(
            Enqueue::new("test.slow").visibility_timeout(Duration::from_millis(900)).timeout(Duration::from_secs(10)),
        )
        .await
        .unwrap();
    let mut worker = Worker::builder().handle_signals(false).build(client.clone());
    worker.handle("test.slow", |_: Value, _ctx: JobContext| async move {
        tokio::time::sleep(Duration::from_millis(3000)).await;
        Ok::<_, JobError>("slow but done")
    });
    let stop = worker.stop_handle();
    let running = tokio::spawn(worker.run());
    let completed = eventually(Duration::from_secs(10), "the job to complete", || async {
        client.get(&job.id).await.ok().filter(|job| job.state == JobState::Completed)
    })
    .await;
    stop.stop();
    running.await.unwrap().unwrap();
    assert_eq!(completed.attempt, 1, "claimed once");
    assert!(completed.errors.is_empty(), "the claim never ran out: {:?}", completed.errors);
    assert_eq!(completed.result, Some(json!("slow but done")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_worker_takes_nothing_and_a_terminated_one_releases_its_jobs() {
    logs();
    let Some(server) = Server::start() else { return };
    let client = server.client();
    let started = Arc::new(AtomicUsize::new(0));
    let mut worker = Worker::builder()
        .worker_id("w-signals")
        .concurrency(2)
        .quiet_poll(Duration::from_millis(200))
        .visibility_timeout(Duration::from_secs(3))
        .abort_grace(Duration::from_millis(200))
        .handle_signals(false)
        .build(client.clone());
    let counter = started.clone();
    worker.handle("test.signal", move |mode: String, ctx: JobContext| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move {
            if mode == "hang" {
                ctx.cancelled().await;
                assert_eq!(ctx.cancel_reason(), Some(CancelReason::Terminate));
                return Err(JobError::msg("stopped"));
            }
            Ok(())
        }
    });
    let running = tokio::spawn(worker.run());
    // Registered, and waiting for work.
    eventually(Duration::from_secs(5), "the worker to register", || async {
        client.workers().get("w-signals").await.ok()
    })
    .await;

    client.workers().quiet("w-signals").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held_back = client.enqueue(Enqueue::new("test.signal").args("quick")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(client.get(&held_back.id).await.unwrap().state, JobState::Available, "a quiet worker fetches nothing");

    // Lifting the signal (forgetting the worker) lets it fetch again.
    client.workers().forget("w-signals").await.unwrap();
    eventually(Duration::from_secs(5), "the held-back job to complete", || async {
        client.get(&held_back.id).await.ok().filter(|job| job.state == JobState::Completed)
    })
    .await;

    let hanging = client.enqueue(Enqueue::new("test.signal").args("hang")).await.unwrap();
    eventually(Duration::from_secs(5), "the hanging job to start", || async {
        client.get(&hanging.id).await.ok().filter(|job| job.state == JobState::Active)
    })
    .await;
    client.workers().terminate("w-signals").await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), running).await.expect("a terminated worker stops").unwrap().unwrap();
    let released = client.get(&hanging.id).await.unwrap();
    assert_eq!(released.state, JobState::Available, "released, not failed");
    assert_eq!(released.attempt, 0, "a release gives the attempt back");
    assert_eq!(started.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_types_are_nacked_and_timeouts_enforced() {
    logs();
    let Some(server) = Server::start() else { return };
    let client = server.client();
    let once = RetryPolicy::new().max_attempts(1);
    let unknown = client.enqueue(Enqueue::new("test.nobody").retry(once.clone())).await.unwrap();
    let slow = client
        .enqueue(Enqueue::new("test.sleepy").timeout(Duration::from_millis(400)).retry(once.clone()))
        .await
        .unwrap();
    let woke = Arc::new(AtomicBool::new(false));
    let flag = woke.clone();
    let mut worker = Worker::builder().handle_signals(false).build(client.clone());
    worker.handle("test.sleepy", move |_: Value, ctx: JobContext| {
        let flag = flag.clone();
        async move {
            assert!(ctx.remaining() <= Duration::from_millis(400));
            tokio::time::sleep(Duration::from_secs(5)).await;
            flag.store(true, Ordering::SeqCst);
            Ok::<_, JobError>(())
        }
    });
    let stop = worker.stop_handle();
    let running = tokio::spawn(worker.run());
    let ended = |id: String| {
        let client = client.clone();
        async move {
            eventually(Duration::from_secs(10), "the job to be discarded", || async {
                client.get(&id).await.ok().filter(|job| job.state == JobState::Discarded)
            })
            .await
        }
    };
    let unknown = ended(unknown.id).await;
    let error = unknown.error.unwrap();
    assert_eq!(error.error_type, "unknown_job_type");
    assert!(error.message.contains("test.nobody") && error.message.contains("test.sleepy"), "{}", error.message);
    let slow = ended(slow.id).await;
    assert_eq!(slow.error.unwrap().error_type, "timeout");
    stop.stop();
    running.await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!woke.load(Ordering::SeqCst), "the timed-out handler was dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_traces_and_middleware_reach_the_job() {
    logs();
    let Some(server) = Server::start() else { return };
    let trace = svc_client::trace::child_traceparent(None);
    let source_trace = trace.clone();
    let client = Client::builder(server.url())
        .traceparent_source(move || Some(source_trace.clone()))
        .enqueue_middleware(|mut jobs: Vec<Enqueue>, next: svc_client::EnqueueNext| async move {
            for job in &mut jobs {
                job.meta_mut().insert("tenant".into(), json!("acme"));
            }
            next.run(jobs).await
        })
        .build()
        .unwrap();
    let job = client.enqueue(Enqueue::new("test.progress")).await.unwrap();
    assert_eq!(job.meta.get("tenant"), Some(&json!("acme")));
    assert_eq!(job.traceparent(), Some(trace.as_str()));

    let release = Arc::new(tokio::sync::Notify::new());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut worker = Worker::builder().handle_signals(false).build(client.clone());
    let gate = release.clone();
    worker.handle("test.progress", move |_: Value, ctx: JobContext| {
        let gate = gate.clone();
        async move {
            ctx.progress(0.5, Some("half way")).await?;
            ctx.extend_lease().await?;
            gate.notified().await;
            Ok::<_, JobError>("done")
        }
    });
    let log = seen.clone();
    worker.wrap(move |ctx: JobContext, next: Next| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push(format!("before {}", ctx.traceparent().unwrap_or("-")));
            let outcome = next.run(ctx).await;
            log.lock().unwrap().push(format!("after {:?}", outcome.as_ref().ok()));
            outcome
        }
    });
    let stop = worker.stop_handle();
    let running = tokio::spawn(worker.run());
    let progress = eventually(Duration::from_secs(5), "the progress report", || async {
        client.progress(&job.id).await.ok().filter(|progress| progress.progress.is_some())
    })
    .await;
    assert_eq!(progress.progress, Some(0.5));
    assert_eq!(progress.message.as_deref(), Some("half way"));
    let active = client.get(&job.id).await.unwrap();
    assert_eq!((active.progress, active.progress_message.as_deref()), (Some(0.5), Some("half way")));
    release.notify_one();
    eventually(Duration::from_secs(5), "the job to complete", || async {
        client.get(&job.id).await.ok().filter(|job| job.state == JobState::Completed)
    })
    .await;
    stop.stop();
    running.await.unwrap().unwrap();
    assert_eq!(*seen.lock().unwrap(), [format!("before {trace}"), "after Some(String(\"done\"))".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_cancelled_while_it_runs_cancels_its_handler() {
    logs();
    let Some(server) = Server::start() else { return };
    let client = server.client();
    struct Dropped(Arc<AtomicBool>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let context = Arc::new(Mutex::new(None));
    let dropped = Arc::new(AtomicBool::new(false));
    let (kept, flag) = (context.clone(), dropped.clone());
    let mut worker =
        Worker::builder().visibility_timeout(Duration::from_millis(600)).handle_signals(false).build(client.clone());
    worker.handle("test.cancel", move |_: Value, ctx: JobContext| {
        *kept.lock().unwrap() = Some(ctx);
        let guard = Dropped(flag.clone());
        async move {
            let _guard = guard;
            std::future::pending::<()>().await;
            Ok::<_, JobError>(())
        }
    });
    let stop = worker.stop_handle();
    let running = tokio::spawn(worker.run());
    let job = client.enqueue(Enqueue::new("test.cancel")).await.unwrap();
    eventually(Duration::from_secs(5), "the job to start", || async {
        client.get(&job.id).await.ok().filter(|job| job.state == JobState::Active)
    })
    .await;
    client.cancel(&job.id).await.unwrap();
    eventually(Duration::from_secs(5), "the handler to be dropped", || async {
        dropped.load(Ordering::SeqCst).then_some(())
    })
    .await;
    let ctx = context.lock().unwrap().take().unwrap();
    assert_eq!(ctx.cancel_reason(), Some(CancelReason::Cancelled));
    stop.stop();
    running.await.unwrap().unwrap();
    assert_eq!(client.get(&job.id).await.unwrap().state, JobState::Cancelled);
}

/// The inline mode: an embedded svc on a temporary directory, the worker
/// run until there is nothing left to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_mode_runs_handlers_in_process_until_idle() {
    logs();
    async fn sign_up(queue: &impl Enqueuer, email: &str) -> svc_client::Result<Job> {
        queue.enqueue(Enqueue::new("email.welcome").args(email)).await
    }

    let dir = tempfile::tempdir().unwrap();
    let svc = svc_client::embedded::open(dir.path()).await.unwrap();
    let job = sign_up(&svc, "ada@example.com").await.unwrap();
    let mut worker = Worker::builder().build(svc.clone());
    worker.handle(
        "email.welcome",
        |to: String, _ctx: JobContext| async move { Ok::<_, JobError>(json!({ "sent": to })) },
    );
    worker.run_until_idle().await.unwrap();
    let done = svc.job_view(&job.id).await;
    assert_eq!(done.state, JobState::Completed);
    assert_eq!(done.result, Some(json!({ "sent": "ada@example.com" })));
    svc_client::embedded::close(svc).await;
}
