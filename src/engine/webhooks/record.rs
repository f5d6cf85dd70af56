//! The log records of webhook subscriptions and their deliveries.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::outbox::{Delivery, QueuedDelivery, QueuedEvent};
use crate::clock::Millis;
use crate::job::{DeliveryId, SubscriptionId};
use crate::webhook::Subscription;

/// A webhook subscription created or changed, whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookPut {
    pub subscription: Arc<Subscription>,
}

/// A webhook subscription deleted, with its queued deliveries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookDelete {
    pub id: SubscriptionId,
}

/// Deliveries queued, each with its whole body: no longer written
/// ([`DeliveriesQueuedOnce`] replaced it), read as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveriesQueued {
    pub deliveries: Vec<Arc<Delivery>>,
}

/// Attempts starting: each delivery's count goes up before it is sent, and
/// it is not due again before `until` (the attempt's outcome comes first,
/// unless the attempt is lost with the process).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveryStarted {
    pub ids: Vec<DeliveryId>,
    pub until: Millis,
}

/// A failed attempt: the delivery waits until `next_at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveryRetry {
    pub id: DeliveryId,
    pub next_at: Millis,
}

/// Deliveries that ended: acknowledged, abandoned after their last attempt,
/// or dropped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveriesDone {
    pub ids: Vec<DeliveryId>,
}

/// Events queued for the subscriptions that take them, in the commit of
/// the change that caused them: each event's body once, whatever number of
/// subscriptions take it, and at most
/// [`super::outbox::QUEUED_RECORD_BODY_BYTES_MAX`] of bodies a record (a
/// turn logs as many as it needs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveriesQueuedOnce {
    pub events: Vec<QueuedEvent>,
    pub deliveries: Vec<QueuedDelivery>,
}

/// A change of subscriptions or their deliveries. The variant order is
/// part of the log format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WebhookRecord {
    Put(WebhookPut),
    Delete(WebhookDelete),
    DeliveriesQueued(DeliveriesQueuedOnce),
    DeliveryStarted(DeliveryStarted),
    DeliveryRetry(DeliveryRetry),
    DeliveriesDone(DeliveriesDone),
    /// Read from logs of the first record format only; never written.
    DeliveriesQueuedWhole(DeliveriesQueued),
}

impl WebhookRecord {
    /// The record's name, as `svc inspect` counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            WebhookRecord::Put(_) => "webhook_put",
            WebhookRecord::Delete(_) => "webhook_delete",
            WebhookRecord::DeliveriesQueued(_) | WebhookRecord::DeliveriesQueuedWhole(_) => "deliveries_queued",
            WebhookRecord::DeliveryStarted(_) => "delivery_started",
            WebhookRecord::DeliveryRetry(_) => "delivery_retry",
            WebhookRecord::DeliveriesDone(_) => "deliveries_done",
        }
    }
}
