//! Sending the webhook outbox on PostgreSQL (docs/postgres.md, "Webhooks"):
//! the leader starts the due deliveries, sends each on a task of the node's
//! runtime, and writes how the attempts ended, in batches.
//!
//! Starting an attempt counts it and moves the delivery's `next_at` past the
//! attempt's timeout in one statement, before anything is sent: a node that
//! dies mid-attempt leaves the delivery to be tried again once that time has
//! passed, by whichever node leads then (at least once, as on the local
//! engine). Attempts in flight are bounded overall and per subscription by
//! the same `webhooks` settings as on the local engine.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};

use super::jobs::{PgJobs, database};
use deadpool_postgres::GenericClient;

use super::sql::Prepared;
use crate::clock::{Clock, Millis};
use crate::engine::outbox::{ATTEMPT_LEASE_MARGIN_MS, DeliveryLog, InFlight, next_attempt_at};
use crate::engine::pool::{guarded, send_attempt};
use crate::engine::{AttemptResult, EngineError};
use crate::job::{DeliveryId, SubscriptionId};
use crate::webhook::Subscription;
use crate::webhook::client::{Attempt, DeliveryClient};

/// How often the sender looks for due deliveries when nothing wakes it.
const LOOK_EVERY: Duration = Duration::from_millis(100);
/// The most outcomes written in one statement pair.
const OUTCOMES_BATCH_MAX: usize = 256;
/// How long a failed write of outcomes waits before it is tried again.
const OUTCOMES_RETRY_WAIT: Duration = Duration::from_millis(200);
/// How often a write of outcomes is tried (over 30 s, as long as an
/// attempt's lease lasts by default) before the attempts are left to their
/// leases (they are sent again once those run out).
const OUTCOMES_TRIES: usize = 150;

/// How one attempt ended.
struct Ended {
    id: DeliveryId,
    subscription: SubscriptionId,
    /// Attempts counted, this one included.
    attempts: u32,
    result: AttemptResult,
}

/// What the sender and the writer of outcomes share.
#[derive(Default)]
struct Shared {
    in_flight: InFlight,
    log: DeliveryLog,
}

/// The node's sender of deliveries; it sends only while `leading` holds.
pub(super) struct Sender {
    jobs: Arc<PgJobs>,
    client: DeliveryClient,
    clock: Arc<dyn Clock>,
    timeout: Duration,
    shared: Arc<Mutex<Shared>>,
    ended: mpsc::UnboundedSender<Ended>,
    /// Woken when deliveries were queued or attempts ended.
    wake: Arc<Notify>,
}

impl Sender {
    /// Starts the sender and the writer of outcomes on the current runtime;
    /// `wake` wakes the sender (deliveries were queued). Answers the tasks.
    pub(super) fn spawn(
        jobs: Arc<PgJobs>,
        client: DeliveryClient,
        clock: Arc<dyn Clock>,
        timeout: Duration,
        leading: Arc<AtomicBool>,
        wake: Arc<Notify>,
    ) -> [tokio::task::JoinHandle<()>; 2] {
        let (ended, outcomes) = mpsc::unbounded_channel();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let sender = Sender { jobs: jobs.clone(), client, clock: clock.clone(), timeout, shared, ended, wake };
        let writer = tokio::spawn(write_outcomes(outcomes, jobs, clock, sender.shared.clone(), sender.wake.clone()));
        let sending = tokio::spawn(async move {
            loop {
                if leading.load(Ordering::SeqCst) {
                    // A failure is logged by the store, and tried again next look.
                    let _ = sender.start_due().await;
                }
                let _ = tokio::time::timeout(LOOK_EVERY, sender.wake.notified()).await;
            }
        });
        [sending, writer]
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Frees the in-flight slots of attempts that will not be sent.
    fn release(&self, subscriptions: impl Iterator<Item = SubscriptionId>) {
        let mut shared = self.shared();
        for subscription in subscriptions {
            shared.in_flight.ended(subscription);
        }
    }

    /// Starts the due deliveries there is room for, oldest due first, each
    /// counted and held past its timeout before it is sent.
    async fn start_due(&self) -> Result<usize, EngineError> {
        let limits = *self.jobs.webhook_limits();
        if !self.shared().in_flight.has_any_room(&limits) {
            return Ok(0);
        }
        let now = self.clock.now_ms();
        let client = self.jobs.client().await?;
        // At most a subscription's own cap from each, so that one slow
        // receiver's backlog cannot hide the others' due deliveries.
        let candidates = client
            .rows(
                "SELECT d.id::text, d.subscription::text FROM svc_webhooks w CROSS JOIN LATERAL \
                   (SELECT id, subscription, next_at FROM svc_deliveries \
                    WHERE subscription = w.id AND next_at <= $1 ORDER BY next_at LIMIT $2) d \
                 ORDER BY d.next_at LIMIT $3",
                &[&now, &(limits.concurrency_per_subscription.max(1) as i64), &(limits.concurrency.max(1) as i64)],
            )
            .await
            .map_err(database)?;
        // Counted as in flight while chosen, so a subscription's room holds
        // within this look too.
        let mut chosen = Vec::new();
        {
            let mut shared = self.shared();
            for row in &candidates {
                let (Some(id), Some(subscription)) = (DeliveryId::parse(row.get(0)), SubscriptionId::parse(row.get(1)))
                else {
                    continue;
                };
                if shared.in_flight.has_room(subscription, &limits) {
                    shared.in_flight.started(subscription);
                    chosen.push((id, subscription));
                }
            }
        }
        if chosen.is_empty() {
            return Ok(0);
        }
        // Read before the attempts are counted: a failure here counts none.
        let mut wanted: Vec<String> = chosen.iter().map(|(_, subscription)| subscription.to_string()).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let until = now.saturating_add(self.timeout.as_millis() as Millis).saturating_add(ATTEMPT_LEASE_MARGIN_MS);
        let ids: Vec<String> = chosen.iter().map(|(id, _)| id.to_string()).collect();
        let counted = async {
            let subscriptions = self.jobs.webhooks_among(&client, &wanted).await?;
            let started = client
                .rows(
                    "UPDATE svc_deliveries SET attempts = attempts + 1, next_at = $2 \
                     WHERE id = ANY($1::text[]::uuid[]) AND next_at <= $3 \
                     RETURNING id::text, subscription::text, event_type, body, attempts",
                    &[&ids, &until, &now],
                )
                .await
                .map_err(database)?;
            Ok::<_, EngineError>((subscriptions, started))
        };
        let (subscriptions, started) = match counted.await {
            Ok(counted) => counted,
            Err(error) => {
                self.release(chosen.iter().map(|(_, subscription)| *subscription));
                return Err(error);
            }
        };
        // Those not started were taken meanwhile by another node, or went
        // with their subscription.
        let begun: HashSet<DeliveryId> = started.iter().filter_map(|row| DeliveryId::parse(row.get(0))).collect();
        self.release(chosen.iter().filter(|(id, _)| !begun.contains(id)).map(|(_, subscription)| *subscription));
        drop(client);
        for row in &started {
            let (Some(id), Some(subscription)) = (DeliveryId::parse(row.get(0)), SubscriptionId::parse(row.get(1)))
            else {
                continue;
            };
            let (event_type, body, attempts): (String, String, i32) = (row.get(2), row.get(3), row.get(4));
            let target = subscriptions.get(&subscription).cloned();
            let (client, ended, timeout) = (self.client.clone(), self.ended.clone(), self.timeout);
            let now = self.clock.now_ms();
            tokio::spawn(async move {
                let result = match target {
                    None => AttemptResult::NoSubscription,
                    Some(target) => {
                        guarded(async move {
                            let delivery_id = format!("del_{id}");
                            let attempt = Attempt {
                                subscription: &target,
                                delivery_id: &delivery_id,
                                event_type: &event_type,
                                body: body.into(),
                                now,
                                timeout,
                            };
                            send_attempt(&client, attempt).await
                        })
                        .await
                    }
                };
                let _ = ended.send(Ended { id, subscription, attempts: attempts.max(0) as u32, result });
            });
        }
        Ok(started.len())
    }
}

impl PgJobs {
    /// The subscriptions among `ids`, as they are now.
    async fn webhooks_among(
        &self,
        client: &impl GenericClient,
        ids: &[String],
    ) -> Result<HashMap<SubscriptionId, Arc<Subscription>>, EngineError> {
        let rows = client
            .rows("SELECT id::text, body FROM svc_webhooks WHERE id = ANY($1::text[]::uuid[])", &[&ids])
            .await
            .map_err(database)?;
        rows.iter().map(|row| super::webhooks::decode(row.get(0), row.get(1)).map(|s| (s.id, Arc::new(s)))).collect()
    }
}

/// Writes how attempts ended, every outcome that arrived while the last
/// write ran in the next: delivered ones (and those whose subscription went)
/// leave the outbox, failed ones wait for their next attempt by the
/// schedule, and one whose last attempt failed is abandoned and counted.
async fn write_outcomes(
    mut outcomes: mpsc::UnboundedReceiver<Ended>,
    jobs: Arc<PgJobs>,
    clock: Arc<dyn Clock>,
    shared: Arc<Mutex<Shared>>,
    wake: Arc<Notify>,
) {
    let mut batch = Vec::new();
    while outcomes.recv_many(&mut batch, OUTCOMES_BATCH_MAX).await > 0 {
        let now = clock.now_ms();
        let mut outcome = Outcomes::default();
        let mut abandoned = Vec::new();
        for ended in &batch {
            let attempts = ended.attempts as i32;
            match ended.result {
                AttemptResult::Delivered | AttemptResult::NoSubscription => outcome.done(ended.id, attempts),
                AttemptResult::Failed { retry_after_ms, .. } => {
                    match next_attempt_at(now, ended.attempts, retry_after_ms) {
                        Some(next_at) => outcome.retry(ended.id, attempts, next_at),
                        None => {
                            outcome.done(ended.id, attempts);
                            abandoned.push(ended.subscription);
                        }
                    }
                }
            }
        }
        let metrics = jobs.metrics();
        for ended in &batch {
            metrics.webhook_delivery(ended.result.metric_label());
        }
        // Tried again while the attempts' leases last: a write that never
        // comes leaves them to be sent again once the leases run out.
        let mut written = false;
        for _ in 0..OUTCOMES_TRIES {
            if outcome.write(&jobs).await.is_ok() {
                written = true;
                break;
            }
            tokio::time::sleep(OUTCOMES_RETRY_WAIT).await;
        }
        {
            let mut shared = shared.lock().unwrap_or_else(PoisonError::into_inner);
            for ended in &batch {
                shared.in_flight.ended(ended.subscription);
            }
            for subscription in abandoned.into_iter().filter(|_| written) {
                metrics.webhook_delivery("abandoned");
                shared.log.abandoned(subscription);
            }
            shared.log.flush_if_due();
        }
        batch.clear();
        wake.notify_one();
    }
}

/// How attempts ended, as columns: each names the attempt it reports, so
/// that an outcome written late (its lease ran out, and another attempt
/// started) changes nothing.
#[derive(Default)]
struct Outcomes {
    done: (Vec<String>, Vec<i32>),
    retry: (Vec<String>, Vec<i32>, Vec<Millis>),
}

impl Outcomes {
    fn done(&mut self, id: DeliveryId, attempts: i32) {
        self.done.0.push(id.to_string());
        self.done.1.push(attempts);
    }

    fn retry(&mut self, id: DeliveryId, attempts: i32, next_at: Millis) {
        self.retry.0.push(id.to_string());
        self.retry.1.push(attempts);
        self.retry.2.push(next_at);
    }

    /// One transaction: the done leave the outbox, the others get their
    /// next time.
    async fn write(&self, jobs: &PgJobs) -> Result<(), EngineError> {
        let mut client = jobs.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        if !self.done.0.is_empty() {
            transaction
                .run(
                    "DELETE FROM svc_deliveries d USING unnest($1::text[], $2::int4[]) AS t(id, attempts) \
                     WHERE d.id = t.id::uuid AND d.attempts = t.attempts",
                    &[&self.done.0, &self.done.1],
                )
                .await
                .map_err(database)?;
        }
        if !self.retry.0.is_empty() {
            transaction
                .run(
                    "UPDATE svc_deliveries d SET next_at = t.next_at \
                     FROM unnest($1::text[], $2::int4[], $3::int8[]) AS t(id, attempts, next_at) \
                     WHERE d.id = t.id::uuid AND d.attempts = t.attempts",
                    &[&self.retry.0, &self.retry.1, &self.retry.2],
                )
                .await
                .map_err(database)?;
        }
        transaction.commit().await.map_err(database)
    }
}
