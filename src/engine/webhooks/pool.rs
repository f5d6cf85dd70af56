//! The delivery pool (docs/api.md, "Deliveries"): takes the deliveries whose
//! attempt the engine has counted, sends each on a bounded number of tasks,
//! and reports how it went. It runs on a runtime of its own, never on the
//! engine thread nor beside the HTTP front end: a slow or dead receiver holds
//! a task, not a job operation. The thread runs at the priority
//! `webhooks.priority` names (docs/api.md, "Deliveries").

use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::outbox::{Delivery, StartedAttempts};
use crate::engine::{AttemptOutcome, AttemptResult, EngineConfig, EngineError, EngineHandle, Unavailable};
use crate::webhook::DeliveryPriority;
use crate::webhook::client::{Attempt, AttemptError, DeliveryClient, shared_body};

/// How long a refused report waits before it is offered again.
const REPORT_RETRY_WAIT: Duration = Duration::from_millis(100);
/// The most outcomes in one report.
const REPORT_BATCH_MAX: usize = 256;
/// A hand-off slower than this means the delivery thread is short of CPU.
const HANDOFF_SLOW: Duration = Duration::from_secs(1);
/// How often that is logged at most.
const HANDOFF_WARNING_EVERY: Duration = Duration::from_secs(60);

/// The nice value of the delivery thread at [`DeliveryPriority::Low`], and
/// where the idle scheduling class is refused (at 10, the kernel gives it
/// about a tenth of a CPU other threads keep busy).
#[cfg(target_os = "linux")]
const DELIVERY_NICENESS: libc::c_int = 10;

/// A delivery pool attached to an engine's settings, started by [`Pool::spawn`].
pub struct Pool {
    batches: mpsc::UnboundedReceiver<StartedAttempts>,
    client: DeliveryClient,
    timeout: Duration,
    concurrency: usize,
    priority: DeliveryPriority,
}

impl Pool {
    /// Makes the engine opened with `engine` hand its attempts to this pool.
    pub fn attach(engine: &mut EngineConfig, client: DeliveryClient, priority: DeliveryPriority) -> Pool {
        let (sink, batches) = mpsc::unbounded_channel();
        engine.wiring.deliveries = Some(sink);
        let timeout = Duration::from_millis(engine.delivery_timeout_ms.max(1) as u64);
        Pool { batches, client, timeout, concurrency: engine.webhook_limits.concurrency, priority }
    }

    /// Runs the pool on a runtime of its own: one thread, `svc-webhooks`,
    /// at the pool's priority. Dropping the runtime stops it.
    pub fn spawn(self, engine: EngineHandle) -> std::io::Result<tokio::runtime::Runtime> {
        let runtime = delivery_runtime(self.priority)?;
        runtime.spawn(run(self, engine));
        Ok(runtime)
    }
}

/// The runtime deliveries are sent from, on either backend: one thread,
/// `svc-webhooks`, at `priority` (`webhooks.priority`).
pub fn delivery_runtime(priority: DeliveryPriority) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("svc-webhooks")
        .on_thread_start(move || lower_priority(priority))
        .enable_all()
        .build()
}

/// Lowers the calling thread's priority, unless it is to stay the server's
/// own ([`DeliveryPriority::Normal`]). The idle class makes the kernel
/// take the core from the thread at once when a job operation's thread
/// wakes, and count a core running only it as free when it places a waking
/// thread; a nice value alone leaves those threads queued behind it
/// (ARCHITECTURE.md, "Webhooks"). On Linux both are per thread.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn lower_priority(priority: DeliveryPriority) {
    if priority == DeliveryPriority::Normal {
        return;
    }
    if priority == DeliveryPriority::Idle {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; `param` outlives the call.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0 {
            return;
        }
    }
    // SAFETY: only concerns the calling thread and takes no pointers.
    let result = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, DELIVERY_NICENESS) };
    if result != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "the delivery thread keeps its priority");
    }
}

/// Elsewhere the nice value is per process: the thread keeps its priority.
#[cfg(not(target_os = "linux"))]
fn lower_priority(_: DeliveryPriority) {}

/// Runs until the engine drops its end of the pool's channel.
async fn run(pool: Pool, engine: EngineHandle) {
    let Pool { mut batches, client, timeout, concurrency, priority } = pool;
    // The engine starts no more attempts than this, so a slot is always free.
    let slots = Arc::new(Semaphore::new(concurrency.max(1)));
    let (ended, reports) = mpsc::unbounded_channel();
    tokio::spawn(report_outcomes(reports, engine.clone()));
    // Shared by the attempts: cloning the handle itself takes the engine
    // inbox's lock, which this low-priority thread should hold as seldom as
    // it can (ARCHITECTURE.md, "Webhooks").
    let engine = Arc::new(engine);
    let mut warned_at: Option<Instant> = None;
    while let Some(batch) = batches.recv().await {
        let waited = batch.handed_at.elapsed();
        engine.metrics().webhook_handoff_seconds.observe(waited.as_secs_f64());
        if waited > HANDOFF_SLOW && warned_at.is_none_or(|at| at.elapsed() > HANDOFF_WARNING_EVERY) {
            warned_at = Some(Instant::now());
            let advice = match priority {
                DeliveryPriority::Idle => "; on a host other processes keep busy, set webhooks.priority = \"normal\"",
                DeliveryPriority::Low | DeliveryPriority::Normal => "",
            };
            tracing::warn!(waited_ms = waited.as_millis() as u64, "webhook deliveries waited for the CPU{advice}");
        }
        for delivery in batch.deliveries {
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            let (engine, client, ended) = (engine.clone(), client.clone(), ended.clone());
            tokio::spawn(async move {
                let sent = (engine.clone(), delivery.clone());
                let result = guarded(async move { attempt(&sent.0, &client, &sent.1, timeout).await }).await;
                let metrics = engine.metrics();
                metrics.webhook_delivery(result.metric_label());
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
    let delivery_id = format!("del_{}", delivery.id);
    let attempt = Attempt {
        subscription: &subscription,
        delivery_id: &delivery_id,
        event_type: &delivery.event_type,
        body: shared_body(&delivery.body),
        now,
        timeout,
    };
    send_attempt(client, attempt).await
}

/// Runs one attempt on a task of its own. Should it panic, it counts as a
/// failed attempt, retried by the schedule, instead of keeping its slot (and
/// its subscription's) taken until the process ends.
pub async fn guarded(attempt: impl Future<Output = AttemptResult> + Send + 'static) -> AttemptResult {
    tokio::spawn(attempt).await.unwrap_or_else(|error| {
        tracing::error!(%error, "a webhook attempt panicked; it counts as failed");
        AttemptResult::Failed { retry_after_ms: None, blocked: false }
    })
}

/// Sends one attempt and says how it ended, as both backends count it: a
/// failure is logged with its reason, and a 429's `Retry-After` kept.
pub async fn send_attempt(client: &DeliveryClient, attempt: Attempt<'_>) -> AttemptResult {
    let (delivery_id, subscription) = (attempt.delivery_id, attempt.subscription.id);
    let outcome = client.send(attempt).await;
    if outcome.succeeded() {
        return AttemptResult::Delivered;
    }
    tracing::debug!(
        delivery_id = %delivery_id,
        subscription_id = %format!("sub_{subscription}"),
        status = outcome.status,
        error = outcome.error.map(AttemptError::as_str),
        detail = outcome.detail.as_deref(),
        "webhook attempt failed"
    );
    AttemptResult::Failed {
        retry_after_ms: outcome.retry_after_s.map(|seconds| seconds.saturating_mul(1000).min(i64::MAX as u64) as i64),
        blocked: outcome.error == Some(AttemptError::BlockedAddress),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_attempt_that_panics_counts_as_a_failed_attempt() {
        let result = guarded(async { panic!("a receiver the client did not expect") }).await;
        assert_eq!(result, AttemptResult::Failed { retry_after_ms: None, blocked: false });
        assert_eq!(guarded(async { AttemptResult::Delivered }).await, AttemptResult::Delivered);
    }
}
