//! Jobs/s through the worker loop: batch-enqueues N jobs into a fresh
//! queue of a running server, then times a worker with a no-op handler
//! draining them.
//!
//! ```sh
//! svc serve --listen 127.0.0.1:8080 --data-dir /tmp/svc-bench &
//! cargo run --release -p svc-client --no-default-features --example drain -- \
//!     --url http://127.0.0.1:8080 --jobs 20000 --concurrency 32
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use svc_client::{Client, Enqueue, JobContext, Worker};

struct Options {
    url: String,
    jobs: usize,
    concurrency: usize,
    batch: usize,
}

fn options() -> Options {
    let mut options = Options { url: "http://127.0.0.1:8080".into(), jobs: 20_000, concurrency: 32, batch: 1_000 };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        let number = || value.parse::<usize>().unwrap_or_else(|_| panic!("{flag} takes a number"));
        match flag.as_str() {
            "--url" => options.url = value.clone(),
            "--jobs" => options.jobs = number().max(1),
            "--concurrency" => options.concurrency = number().max(1),
            "--batch" => options.batch = number().clamp(1, 10_000),
            _ => panic!("unknown flag {flag} (--url, --jobs, --concurrency, --batch)"),
        }
    }
    options
}

#[tokio::main]
async fn main() -> svc_client::Result<()> {
    let options = options();
    let client = Client::new(&options.url)?;
    let queue = format!("bench-{:08x}", rand::random::<u32>());

    let started = Instant::now();
    let mut left = options.jobs;
    while left > 0 {
        let size = left.min(options.batch);
        let jobs = (0..size).map(|n| Enqueue::new("bench.noop").args(&[n]).queue(&queue)).collect();
        client.enqueue_batch(jobs).await?;
        left -= size;
    }
    let enqueue = started.elapsed();
    println!(
        "enqueued {} jobs into {queue} in {:.2} s ({:.0} jobs/s, batches of {})",
        options.jobs,
        enqueue.as_secs_f64(),
        options.jobs as f64 / enqueue.as_secs_f64(),
        options.batch
    );

    let done = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(tokio::sync::Notify::new());
    let mut worker = Worker::builder()
        .queues([queue.as_str()])
        .concurrency(options.concurrency)
        .handle_signals(false)
        .poll_wait(Duration::from_secs(1))
        .build(client.clone());
    let (count, total, last) = (done.clone(), options.jobs, finished.clone());
    worker.handle("bench.noop", move |_: Value, _ctx: JobContext| {
        if count.fetch_add(1, Ordering::Relaxed) + 1 == total {
            last.notify_one();
        }
        async { Ok(()) }
    });
    let started = Instant::now();
    let running = tokio::spawn(worker.run_until(async move { finished.notified().await }));
    running.await.expect("the worker runs")?;
    let drain = started.elapsed();
    let stats = client.queues().stats(&queue).await?;
    println!(
        "drained {} jobs at concurrency {} in {:.2} s: {:.0} jobs/s (completed: {})",
        done.load(Ordering::Relaxed),
        options.concurrency,
        drain.as_secs_f64(),
        options.jobs as f64 / drain.as_secs_f64(),
        stats.states.get("completed").copied().unwrap_or(0)
    );
    Ok(())
}
