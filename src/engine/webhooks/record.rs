//! The log records of webhook subscriptions and their deliveries. Each is
//! encoded as the struct variant it replaced, field for field (records 27
//! to 33).

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::outbox::{Delivery, QueuedDelivery, QueuedEvent};
use crate::clock::Millis;
use crate::job::{DeliveryId, SubscriptionId};
use crate::webhook::Subscription;

/// A webhook subscription created or changed, whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookPut {
    pub at: Millis,
    pub subscription: Arc<Subscription>,
}

/// A webhook subscription deleted, with its queued deliveries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookDelete {
    pub at: Millis,
    pub id: SubscriptionId,
}

/// Deliveries queued, each with its whole body: no longer written
/// ([`DeliveriesQueuedOnce`] replaced it), read as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveriesQueued {
    pub at: Millis,
    pub deliveries: Vec<Arc<Delivery>>,
}

/// Attempts starting: each delivery's count goes up before it is sent, and
/// it is not due again before `until` (the attempt's outcome comes first,
/// unless the attempt is lost with the process).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveryStarted {
    pub at: Millis,
    pub ids: Vec<DeliveryId>,
    pub until: Millis,
}

/// A failed attempt: the delivery waits until `next_at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveryRetry {
    pub at: Millis,
    pub id: DeliveryId,
    pub next_at: Millis,
}

/// Deliveries that ended: acknowledged, abandoned after their last attempt,
/// or dropped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveriesDone {
    pub at: Millis,
    pub ids: Vec<DeliveryId>,
}

/// Events queued for the subscriptions that take them, in the commit of
/// the change that caused them: each event's body once, whatever number of
/// subscriptions take it, and at most
/// [`super::outbox::QUEUED_RECORD_BODY_BYTES_MAX`] of bodies a record (a
/// turn logs as many as it needs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveriesQueuedOnce {
    pub at: Millis,
    pub events: Vec<QueuedEvent>,
    pub deliveries: Vec<QueuedDelivery>,
}
