//! The delivery pool (docs/api.md, "Deliveries"): takes the deliveries whose
//! attempt the engine has counted, sends each on a bounded number of tasks,
//! and reports how it went. It runs on a runtime of its own, never on the
//! engine thread nor beside the HTTP front end: a slow or dead receiver holds
//! a task, not a job operation, and signing and sending take the CPU only
//! when job operations leave it (the thread runs at a lower priority).

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::client::{Attempt, AttemptError, DeliveryClient};
use crate::engine::outbox::Delivery;
use crate::engine::{AttemptOutcome, AttemptResult, EngineError, EngineHandle, Unavailable};

/// How long a refused report waits before it is offered again.
const REPORT_RETRY_WAIT: Duration = Duration::from_millis(100);
/// The most outcomes in one report.
const REPORT_BATCH_MAX: usize = 256;

/// How much lower than the server's the delivery thread's priority is (a
/// nice value: at 10, the kernel gives it about a tenth of a busy CPU).
#[cfg(target_os = "linux")]
const DELIVERY_NICENESS: libc::c_int = 10;

/// The runtime the pool runs on: one thread, named `svc-webhooks`, at a
/// lower priority than the rest of the server.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("svc-webhooks")
        .on_thread_start(lower_priority)
        .enable_all()
        .build()
}

/// Lowers the calling thread's priority (on Linux the nice value is per thread).
#[cfg(target_os = "linux")]
fn lower_priority() {
    // SAFETY: both calls only concern the calling thread and take no pointers.
    let result = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, DELIVERY_NICENESS) };
    if result != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "the delivery thread keeps its priority");
    }
}

/// Elsewhere the nice value is per process: the thread keeps its priority.
#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

/// Runs until the engine drops its end of `batches`.
pub async fn run(
    mut batches: mpsc::UnboundedReceiver<Vec<Arc<Delivery>>>,
    engine: EngineHandle,
    client: DeliveryClient,
    timeout: Duration,
    concurrency: usize,
) {
    // The engine starts no more attempts than this, so a slot is always free.
    let slots = Arc::new(Semaphore::new(concurrency.max(1)));
    let (ended, reports) = mpsc::unbounded_channel();
    tokio::spawn(report_outcomes(reports, engine.clone()));
    while let Some(batch) = batches.recv().await {
        for delivery in batch {
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            let (engine, client, ended) = (engine.clone(), client.clone(), ended.clone());
            tokio::spawn(async move {
                let result = attempt(&engine, &client, &delivery, timeout).await;
                let metrics = engine.metrics();
                match result {
                    AttemptResult::Delivered => metrics.webhook_delivery("success"),
                    AttemptResult::Failed { blocked: true, .. } => metrics.webhook_delivery("blocked"),
                    AttemptResult::Failed { .. } => metrics.webhook_delivery("failure"),
                    AttemptResult::NoSubscription => metrics.webhook_delivery("dropped"),
                }
                let outcome = AttemptOutcome { id: delivery.id, subscription: delivery.subscription, result };
                let _ = ended.send((outcome, slot));
            });
        }
    }
}

/// Tells the engine how attempts ended: every outcome that arrived while
/// the last report was on its way goes in the next one (one command and
/// one commit for them all). An attempt's slot is freed once its outcome
/// is reported: the engine holds the slot until it hears back.
async fn report_outcomes(
    mut ended: mpsc::UnboundedReceiver<(AttemptOutcome, OwnedSemaphorePermit)>,
    engine: EngineHandle,
) {
    let mut batch = Vec::new();
    while ended.recv_many(&mut batch, REPORT_BATCH_MAX).await > 0 {
        let outcomes: Vec<AttemptOutcome> = batch.iter().map(|(outcome, _)| *outcome).collect();
        // An overloaded inbox, or a full disk, is tried again for as long as
        // it lasts: the engine holds the attempts' slots until it hears back.
        // A stopped engine forgets its slots anyway.
        loop {
            match engine.delivery_outcomes(outcomes.clone()).outcome().await {
                Ok(abandoned) => {
                    for _ in abandoned.iter().filter(|abandoned| **abandoned) {
                        engine.metrics().webhook_delivery("abandoned");
                    }
                    break;
                }
                Err(EngineError::Unavailable { reason: Unavailable::Overloaded | Unavailable::DiskFull }) => {
                    tokio::time::sleep(REPORT_RETRY_WAIT).await;
                }
                Err(_) => break,
            }
        }
        batch.clear();
    }
}

/// One attempt, signed with the subscription's secrets as they are now.
async fn attempt(
    engine: &EngineHandle,
    client: &DeliveryClient,
    delivery: &Delivery,
    timeout: Duration,
) -> AttemptResult {
    let Some(subscription) = engine.webhook(delivery.subscription) else { return AttemptResult::NoSubscription };
    let now = crate::clock::Clock::now_ms(engine.clock().as_ref());
    let subscription = subscription.settled(now);
    let delivery_id = format!("del_{}", delivery.id);
    let outcome = client
        .send(Attempt {
            subscription: &subscription,
            delivery_id: &delivery_id,
            event_type: &delivery.event_type,
            body: delivery.body.as_bytes(),
            timestamp: now.div_euclid(1000),
            timeout,
        })
        .await;
    if outcome.succeeded() {
        return AttemptResult::Delivered;
    }
    tracing::debug!(
        delivery_id = %delivery_id,
        subscription_id = %format!("sub_{}", subscription.id),
        status = outcome.status,
        error = outcome.error.map(AttemptError::as_str),
        "webhook attempt failed"
    );
    AttemptResult::Failed {
        retry_after_ms: outcome.retry_after_s.map(|seconds| seconds.saturating_mul(1000).min(i64::MAX as u64) as i64),
        blocked: outcome.error == Some(AttemptError::BlockedAddress),
    }
}
