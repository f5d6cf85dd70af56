//! The engine's webhook subscriptions: creating, changing, rotating the
//! secret of and deleting them (docs/api.md, "Webhooks"). Each change is one
//! `WebhookPut` record holding the whole subscription, so replay needs no
//! decision of its own.
//!
//! The feature is here: the requests, their decisions, their records
//! (`record.rs`) and how those apply, and the outbox of deliveries
//! (`outbox.rs`), and the delivery pool that sends what the outbox starts
//! (`pool.rs`). Parsing subscriptions, signing and sending one attempt are
//! `crate::webhook`'s.

pub mod outbox;
#[cfg(feature = "webhooks")]
pub mod pool;
pub(super) mod record;

use std::sync::Arc;

use super::api::EngineError;
use super::record::Logged;
use super::requests::{Request, Turn, sealed};
use super::state::{ApplyError, State};
use crate::job::{DeliveryId, SubscriptionId};
use crate::webhook::subscription::{NewSubscription, Rotation, Subscription, SubscriptionPatch};
use record::{
    DeliveriesDone, DeliveriesQueued, DeliveriesQueuedOnce, DeliveryRetry, DeliveryStarted, WebhookDelete, WebhookPut,
    WebhookRecord,
};

/// Creates a subscription; answers it.
pub struct CreateWebhook {
    pub subscription: NewSubscription,
}

impl Request for CreateWebhook {
    type Output = Arc<Subscription>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let max_webhooks = turn.webhook_limits.max_webhooks;
        if turn.state().webhooks.len() >= max_webhooks {
            return Err(EngineError::WebhookLimit { max_webhooks });
        }
        let now = turn.now;
        let (state, entropy) = turn.state_and_entropy();
        let id = SubscriptionId(state.fresh_id(now, entropy, &Default::default()));
        let subscription = Arc::new(self.subscription.stored(id, now));
        turn.apply(Logged::new(now, WebhookPut { subscription: subscription.clone() }));
        Ok(subscription)
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        None
    }
}

/// What a change to a subscription does.
pub enum WebhookChange {
    /// `PATCH`: the fields present are replaced; a `secret` starts a rotation.
    Patch(SubscriptionPatch),
    /// A new secret is rolled in (`POST …/secrets`).
    AddSecret(String),
    /// The old secret is dropped (`DELETE …/secrets/previous`).
    DropPreviousSecret,
}

/// Changes a subscription; answers it as changed.
pub struct ChangeWebhook {
    pub id: SubscriptionId,
    pub change: WebhookChange,
}

impl Request for ChangeWebhook {
    type Output = Arc<Subscription>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let now = turn.now;
        let grace = turn.webhook_limits.rotation_grace_ms;
        let Some(current) = turn.state().webhooks.get(&self.id) else {
            return Err(EngineError::WebhookNotFound { id: self.id });
        };
        let subscription = Arc::new(changed(current, self.change, now, grace)?);
        turn.apply(Logged::new(now, WebhookPut { subscription: subscription.clone() }));
        Ok(subscription)
    }
}

/// `current` as `change` leaves it at `now`, both backends' rule: a new
/// secret starts a rotation of `grace_ms` (refused while one runs), and a
/// rotation whose grace ran out has ended first.
pub fn changed(
    current: &Subscription,
    change: WebhookChange,
    now: crate::clock::Millis,
    grace_ms: i64,
) -> Result<Subscription, EngineError> {
    let mut changed = current.settled(now);
    let start_rotation = |changed: &mut Subscription, secret: String| {
        if changed.rotation.is_some() {
            return Err(EngineError::RotationInProgress { id: changed.id });
        }
        changed.rotation =
            Some(Rotation { next_secret: secret, started_at: now, expires_at: now.saturating_add(grace_ms) });
        Ok(())
    };
    match change {
        WebhookChange::Patch(patch) => {
            if let Some(secret) = patch.secret {
                start_rotation(&mut changed, secret)?;
            }
            if let Some(url) = patch.url {
                changed.url = url;
            }
            if let Some(events) = patch.events {
                changed.events = events;
            }
            if let Some(metadata) = patch.metadata {
                changed.metadata = metadata;
            }
            if let Some(filter) = patch.filter {
                changed.filter = Some(filter);
            }
            if let Some(active) = patch.active {
                changed.active = active;
            }
        }
        WebhookChange::AddSecret(secret) => start_rotation(&mut changed, secret)?,
        WebhookChange::DropPreviousSecret => {
            let Some(rotation) = changed.rotation.take() else {
                return Err(EngineError::NoRotation { id: current.id });
            };
            changed.secret = rotation.next_secret;
        }
    }
    changed.updated_at = now;
    Ok(changed)
}

/// Deletes a subscription; answers it as it was.
pub struct DeleteWebhook {
    pub id: SubscriptionId,
}

impl Request for DeleteWebhook {
    type Output = Arc<Subscription>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let Some(current) = turn.state().webhooks.get(&self.id).cloned() else {
            return Err(EngineError::WebhookNotFound { id: self.id });
        };
        turn.apply(Logged::new(turn.now, WebhookDelete { id: self.id }));
        Ok(current)
    }
}

/// How a delivery attempt ended, as the delivery pool reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptResult {
    /// The receiver answered 2xx.
    Delivered,
    /// Anything else; a 429's `Retry-After` in milliseconds.
    Failed { retry_after_ms: Option<i64>, blocked: bool },
    /// The subscription is gone: nothing was sent.
    NoSubscription,
}

impl AttemptResult {
    /// The `result` label `svc_webhook_deliveries_total` counts it under.
    pub fn metric_label(&self) -> &'static str {
        match self {
            AttemptResult::Delivered => "success",
            AttemptResult::Failed { blocked: true, .. } => "blocked",
            AttemptResult::Failed { .. } => "failure",
            AttemptResult::NoSubscription => "dropped",
        }
    }
}

/// How one attempt ended: the delivery ends, or waits for its next attempt
/// by the schedule, or is abandoned after its last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptOutcome {
    pub id: DeliveryId,
    /// The subscription the attempt went to (its slot is freed).
    pub subscription: SubscriptionId,
    pub result: AttemptResult,
}

/// The outcomes of attempts that ended together, reported at once by the
/// delivery pool: one command and one commit for all of them.
pub struct DeliveryOutcomes {
    pub outcomes: Vec<AttemptOutcome>,
}

impl Request for DeliveryOutcomes {
    /// For each outcome, whether its delivery was abandoned (its last attempt failed).
    type Output = Vec<bool>;

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        Some(super::requests::RECORD_FIXED_BYTES.saturating_mul(self.outcomes.len().max(1) as u64))
    }

    fn held_bytes(&self) -> u64 {
        (self.outcomes.len() * std::mem::size_of::<AttemptOutcome>()) as u64
    }

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let now = turn.now;
        let mut done = Vec::new();
        let mut abandoned = Vec::with_capacity(self.outcomes.len());
        for outcome in self.outcomes {
            turn.in_flight.ended(outcome.subscription);
            abandoned.push(false);
            // Dropped meanwhile (its subscription was deleted or paused): nothing to do.
            let Some(delivery) = turn.state().outbox.get(outcome.id).cloned() else { continue };
            match outcome.result {
                AttemptResult::Delivered | AttemptResult::NoSubscription => done.push(outcome.id),
                AttemptResult::Failed { retry_after_ms, .. } => {
                    match outbox::next_attempt_at(now, delivery.attempts, retry_after_ms) {
                        Some(next_at) => turn.apply(Logged::new(now, DeliveryRetry { id: outcome.id, next_at })),
                        None => {
                            turn.delivery_log.abandoned(delivery.subscription);
                            done.push(outcome.id);
                            *abandoned.last_mut().expect("pushed above") = true;
                        }
                    }
                }
            }
        }
        if !done.is_empty() {
            turn.apply(Logged::new(now, DeliveriesDone { ids: done }));
        }
        Ok(abandoned)
    }
}

// Only this crate's requests reach the engine (see `requests::Request`).
impl sealed::Sealed for CreateWebhook {}
impl sealed::Sealed for ChangeWebhook {}
impl sealed::Sealed for DeleteWebhook {}
impl sealed::Sealed for DeliveryOutcomes {}

impl State {
    pub(super) fn apply_webhook_record(&mut self, record: &WebhookRecord) -> Result<(), ApplyError> {
        match record {
            WebhookRecord::Put(WebhookPut { subscription }) => {
                self.ids.observe(subscription.id.0);
                self.webhooks.insert(subscription.id, subscription.clone());
                // A paused subscription's queued deliveries are dropped.
                if !subscription.active {
                    self.outbox.drop_subscription(subscription.id);
                }
            }
            WebhookRecord::Delete(WebhookDelete { id }) => {
                self.webhooks.remove(id).ok_or_else(|| ApplyError(format!("record deletes unknown webhook {id}")))?;
                self.outbox.drop_subscription(*id);
            }
            WebhookRecord::DeliveriesQueued(DeliveriesQueuedOnce { events, deliveries }) => {
                for delivery in outbox::queued_deliveries(events, deliveries).map_err(ApplyError)? {
                    self.outbox.insert(delivery).map_err(ApplyError)?;
                }
            }
            WebhookRecord::DeliveriesQueuedWhole(DeliveriesQueued { deliveries }) => {
                let mut previous: Option<Arc<outbox::Delivery>> = None;
                for delivery in deliveries {
                    let mut delivery = delivery.clone();
                    outbox::share_body(previous.as_ref(), &mut delivery);
                    self.outbox.insert(delivery.clone()).map_err(ApplyError)?;
                    previous = Some(delivery);
                }
            }
            // A delivery dropped meanwhile (its subscription went) is skipped.
            WebhookRecord::DeliveryStarted(DeliveryStarted { ids, until }) => {
                for id in ids {
                    if self.outbox.get(*id).is_some() {
                        let change = |delivery: &mut outbox::Delivery| {
                            delivery.attempts += 1;
                            delivery.next_at = *until;
                        };
                        self.outbox.update(*id, change).map_err(ApplyError)?;
                    }
                }
            }
            WebhookRecord::DeliveryRetry(DeliveryRetry { id, next_at }) => {
                if self.outbox.get(*id).is_some() {
                    self.outbox.update(*id, |delivery| delivery.next_at = *next_at).map_err(ApplyError)?;
                }
            }
            WebhookRecord::DeliveriesDone(DeliveriesDone { ids }) => {
                for id in ids {
                    self.outbox.remove(*id);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::record::decode_batch;
    use crate::job::JobId;

    #[test]
    fn records_of_the_first_format_read_as_they_were_written() {
        // Kinds 28, 30, 31 and 32 (docs/wal-format.md), then the fields in
        // order: 5 as a zigzag varint, then ids (u128 varints), lists of
        // them and times.
        let cases: [(Logged, &[u8]); 4] = [
            (Logged::new(5, WebhookDelete { id: SubscriptionId(JobId(3)) }), &[1, 28, 10, 3]),
            (Logged::new(5, DeliveryStarted { ids: vec![DeliveryId(JobId(3))], until: 2 }), &[1, 30, 10, 1, 3, 4]),
            (Logged::new(5, DeliveryRetry { id: DeliveryId(JobId(3)), next_at: 2 }), &[1, 31, 10, 3, 4]),
            (
                Logged::new(5, DeliveriesDone { ids: vec![DeliveryId(JobId(3)), DeliveryId(JobId(4))] }),
                &[1, 32, 10, 2, 3, 4],
            ),
        ];
        for (expected, bytes) in cases {
            let kind = expected.kind();
            assert_eq!(decode_batch(bytes).unwrap(), [expected], "{kind}");
        }
    }
}
