//! The engine's webhook subscriptions: creating, changing, rotating the
//! secret of and deleting them (docs/api.md, "Webhooks"). Each change is one
//! `WebhookPut` record holding the whole subscription, so replay needs no
//! decision of its own.

use std::sync::Arc;

use super::api::EngineError;
use super::record::Record;
use super::requests::{Request, Turn, sealed};
use crate::job::JobId;
use crate::webhook::subscription::{NewSubscription, Rotation, Subscription, SubscriptionPatch};

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
        let id = state.fresh_id(now, entropy, &Default::default());
        let new = self.subscription;
        let subscription = Arc::new(Subscription {
            id,
            url: new.url,
            events: new.events,
            secret: new.secret,
            rotation: None,
            metadata: new.metadata,
            filter: new.filter,
            active: new.active,
            created_at: now,
            updated_at: now,
        });
        turn.apply(Record::WebhookPut { at: now, subscription: subscription.clone() });
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
    pub id: JobId,
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
        let mut changed = current.settled(now);
        let start_rotation = |changed: &mut Subscription, secret: String| {
            if changed.rotation.is_some() {
                return Err(EngineError::RotationInProgress { id: changed.id });
            }
            changed.rotation =
                Some(Rotation { next_secret: secret, started_at: now, expires_at: now.saturating_add(grace) });
            Ok(())
        };
        match self.change {
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
                    return Err(EngineError::NoRotation { id: self.id });
                };
                changed.secret = rotation.next_secret;
            }
        }
        changed.updated_at = now;
        let subscription = Arc::new(changed);
        turn.apply(Record::WebhookPut { at: now, subscription: subscription.clone() });
        Ok(subscription)
    }
}

/// Deletes a subscription; answers it as it was.
pub struct DeleteWebhook {
    pub id: JobId,
}

impl Request for DeleteWebhook {
    type Output = Arc<Subscription>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let Some(current) = turn.state().webhooks.get(&self.id).cloned() else {
            return Err(EngineError::WebhookNotFound { id: self.id });
        };
        turn.apply(Record::WebhookDelete { at: turn.now, id: self.id });
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

/// How one attempt ended: the delivery ends, or waits for its next attempt
/// by the schedule, or is abandoned after its last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptOutcome {
    pub id: JobId,
    /// The subscription the attempt went to (its slot is freed).
    pub subscription: JobId,
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
                    match super::outbox::next_attempt_at(now, delivery.attempts, retry_after_ms) {
                        Some(next_at) => turn.apply(Record::DeliveryRetry { at: now, id: outcome.id, next_at }),
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
            turn.apply(Record::DeliveriesDone { at: now, ids: done });
        }
        Ok(abandoned)
    }
}

// Only this crate's requests reach the engine (see `requests::Request`).
impl sealed::Sealed for CreateWebhook {}
impl sealed::Sealed for ChangeWebhook {}
impl sealed::Sealed for DeleteWebhook {}
impl sealed::Sealed for DeliveryOutcomes {}
