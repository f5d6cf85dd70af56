//! The engine's webhook subscriptions: creating, changing, rotating the
//! secret of and deleting them (docs/api.md, "Webhooks"). Each change is one
//! `WebhookPut` record holding the whole subscription, so replay needs no
//! decision of its own.

use std::sync::Arc;

use super::api::EngineError;
use super::record::Record;
use super::requests::{Request, Turn};
use crate::job::JobId;
use crate::limits::{WEBHOOK_ROTATION_GRACE_MS, WEBHOOKS_MAX};
use crate::webhook::subscription::{NewSubscription, Rotation, Subscription, SubscriptionPatch};

/// Creates a subscription; answers it.
pub struct CreateWebhook {
    pub subscription: NewSubscription,
}

impl Request for CreateWebhook {
    type Output = Arc<Subscription>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        if turn.state().webhooks.len() >= WEBHOOKS_MAX {
            return Err(EngineError::WebhookLimit { max_webhooks: WEBHOOKS_MAX });
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
        let Some(current) = turn.state().webhooks.get(&self.id) else {
            return Err(EngineError::WebhookNotFound { id: self.id });
        };
        let mut changed = current.settled(now);
        let start_rotation = |changed: &mut Subscription, secret: String| {
            if changed.rotation.is_some() {
                return Err(EngineError::RotationInProgress { id: changed.id });
            }
            changed.rotation =
                Some(Rotation { next_secret: secret, started_at: now, expires_at: now + WEBHOOK_ROTATION_GRACE_MS });
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
