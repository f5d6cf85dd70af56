//! The webhook outbox (docs/api.md, "Deliveries"): every event a
//! subscription takes, queued durably in the same commit as the change that
//! caused it, until the receiver acknowledges it or its attempts run out.
//!
//! Attempts are counted when they start (a `DeliveryStarted` record is
//! durable before the request leaves), so a crash during an attempt counts
//! it, and the delivery goes out again after the restart.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::clock::Millis;
use crate::job::{DeliveryId, JobId, SubscriptionId};

/// The most attempts of one delivery.
pub const DELIVERY_ATTEMPTS_MAX: u32 = 8;
/// The wait before attempt 2, 3, … 8, counted from the failure before it.
pub const RETRY_DELAYS_MS: [i64; 7] =
    [60_000, 5 * 60_000, 30 * 60_000, 2 * 3_600_000, 8 * 3_600_000, 16 * 3_600_000, 24 * 3_600_000];
/// The longest `Retry-After` of a 429 that is honoured.
pub const RETRY_AFTER_MAX_MS: i64 = 24 * 3_600_000;
/// The most deliveries one subscription may have queued by default; newer ones are dropped.
pub const PENDING_PER_SUBSCRIPTION_MAX: usize = 100_000;
/// The most bytes of deliveries one subscription may have queued by
/// default ([`Delivery::held_bytes`]); newer ones are dropped.
pub const PENDING_BYTES_PER_SUBSCRIPTION_MAX: usize = 64 * 1024 * 1024;
/// The most deliveries queued over every subscription by default.
pub const OUTBOX_MAX: usize = 1_000_000;
/// The most bytes of deliveries queued over every subscription by default.
pub const OUTBOX_BYTES_MAX: usize = 512 * 1024 * 1024;
/// The most body bytes one `DeliveriesQueued` record carries: a turn's
/// deliveries are logged in records of about this size, never as one
/// record that could outgrow a log frame.
pub const QUEUED_RECORD_BODY_BYTES_MAX: usize = 8 * 1024 * 1024;
/// The most deliveries one `DeliveriesQueued` record carries.
pub const QUEUED_RECORD_DELIVERIES_MAX: usize = 16_384;
/// What a queued delivery costs beyond its body: the record, the id maps' entries.
const DELIVERY_FIXED_BYTES: usize = 160;
/// How long one attempt may take unless `webhooks.timeout_s` says otherwise.
pub const ATTEMPT_TIMEOUT_MS_DEFAULT: i64 = 30_000;
/// How much longer than its timeout an attempt keeps its delivery from
/// being due again (an attempt lost with the process is retried then).
pub const ATTEMPT_LEASE_MARGIN_MS: i64 = 5_000;
/// The most attempts in flight at once, over every subscription, by default.
pub const IN_FLIGHT_MAX: usize = 64;
/// The most attempts in flight at once to one subscription, by default.
pub const IN_FLIGHT_PER_SUBSCRIPTION_MAX: usize = 8;

/// The bounds of webhook state and deliveries (docs/api.md, "Limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WebhookLimits {
    /// Subscriptions (`limits.max_webhooks`).
    pub max_webhooks: usize,
    /// Queued deliveries per subscription (`webhooks.max_pending`).
    pub max_pending: usize,
    /// Bytes of queued deliveries per subscription (`webhooks.max_pending_bytes`).
    pub max_pending_bytes: usize,
    /// Queued deliveries over every subscription (`webhooks.max_outbox`).
    pub max_outbox: usize,
    /// Bytes of queued deliveries over every subscription (`webhooks.max_outbox_bytes`).
    pub max_outbox_bytes: usize,
    /// Attempts in flight (`webhooks.concurrency`).
    pub concurrency: usize,
    /// Attempts in flight to one subscription (`webhooks.concurrency_per_subscription`).
    pub concurrency_per_subscription: usize,
    /// How long an old secret keeps signing (`webhooks.rotation_grace`).
    pub rotation_grace_ms: i64,
}

impl Default for WebhookLimits {
    fn default() -> Self {
        Self {
            max_webhooks: crate::limits::WEBHOOKS_MAX,
            max_pending: PENDING_PER_SUBSCRIPTION_MAX,
            max_pending_bytes: PENDING_BYTES_PER_SUBSCRIPTION_MAX,
            max_outbox: OUTBOX_MAX,
            max_outbox_bytes: OUTBOX_BYTES_MAX,
            concurrency: IN_FLIGHT_MAX,
            concurrency_per_subscription: IN_FLIGHT_PER_SUBSCRIPTION_MAX,
            rotation_grace_ms: crate::limits::WEBHOOK_ROTATION_GRACE_MS,
        }
    }
}

/// What the outbox holds, for [`WebhookLimits::has_room`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Queued {
    /// Deliveries queued for the subscription, and their bytes.
    pub subscription: usize,
    pub subscription_bytes: usize,
    /// Deliveries queued over every subscription, and their bytes.
    pub all: usize,
    pub all_bytes: usize,
}

impl WebhookLimits {
    /// Whether one more delivery of `held` bytes fits beside `queued`: by
    /// count and by bytes, for its subscription and overall. One that does
    /// not is dropped and counted, never queued.
    pub fn has_room(&self, queued: &Queued, held: usize) -> bool {
        queued.subscription < self.max_pending
            && queued.subscription_bytes + held <= self.max_pending_bytes
            && queued.all < self.max_outbox
            && queued.all_bytes + held <= self.max_outbox_bytes
    }
}

/// Attempts handed to the pool whose outcome has not come back (soft state
/// of the running engine: after a restart, leases stand in for it).
#[derive(Debug, Default)]
pub struct InFlight {
    total: usize,
    per_subscription: HashMap<SubscriptionId, usize>,
}

impl InFlight {
    /// Whether another attempt to `subscription` may start now.
    pub fn has_room(&self, subscription: SubscriptionId, limits: &WebhookLimits) -> bool {
        self.total < limits.concurrency
            && self.per_subscription.get(&subscription).copied().unwrap_or(0) < limits.concurrency_per_subscription
    }

    /// Whether any attempt may start now.
    pub fn has_any_room(&self, limits: &WebhookLimits) -> bool {
        self.total < limits.concurrency
    }

    pub fn started(&mut self, subscription: SubscriptionId) {
        self.total += 1;
        *self.per_subscription.entry(subscription).or_default() += 1;
    }

    pub fn ended(&mut self, subscription: SubscriptionId) {
        self.total = self.total.saturating_sub(1);
        if let Some(count) = self.per_subscription.get_mut(&subscription) {
            *count -= 1;
            if *count == 0 {
                self.per_subscription.remove(&subscription);
            }
        }
    }
}

/// Where the engine hands deliveries whose attempt is starting (durably
/// counted by then).
pub type DeliverySink = tokio::sync::mpsc::UnboundedSender<StartedAttempts>;

/// Deliveries whose attempts the engine has counted, on their way to the pool.
#[derive(Debug)]
pub struct StartedAttempts {
    pub deliveries: Vec<Arc<Delivery>>,
    /// When the engine handed them over (the pool measures how long they
    /// waited for its thread).
    pub handed_at: std::time::Instant,
}

/// One event on its way to one subscription.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// Shown as `del_<uuidv7>`; the same on every attempt.
    pub id: DeliveryId,
    pub subscription: SubscriptionId,
    /// The event's type, for the `X-SVC-Event-Type` header and the logs.
    pub event_type: String,
    /// The event envelope, serialised once: every attempt sends these bytes.
    pub body: Arc<str>,
    /// Attempts started so far.
    pub attempts: u32,
    /// When the next attempt may start.
    pub next_at: Millis,
}

impl Delivery {
    /// What the delivery holds in memory, counting its body whole (a body
    /// shared with other subscriptions' deliveries is counted by each).
    pub fn held_bytes(&self) -> usize {
        delivery_held_bytes(&self.body, &self.event_type)
    }
}

/// [`Delivery::held_bytes`] of a delivery of this body and event type.
pub fn delivery_held_bytes(body: &str, event_type: &str) -> usize {
    DELIVERY_FIXED_BYTES + body.len() + event_type.len()
}

/// How often dropped and abandoned deliveries are logged (as counts).
const DELIVERY_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Deliveries dropped (past a cap) or abandoned (out of attempts) since the
/// last log line: one line a minute says how many, per subscription, rather
/// than a line each.
#[derive(Debug, Default)]
pub struct DeliveryLog {
    dropped: HashMap<SubscriptionId, u64>,
    abandoned: HashMap<SubscriptionId, u64>,
    last_flush: Option<std::time::Instant>,
}

impl DeliveryLog {
    pub fn dropped(&mut self, subscription: SubscriptionId) {
        *self.dropped.entry(subscription).or_default() += 1;
        self.flush_if_due();
    }

    pub fn abandoned(&mut self, subscription: SubscriptionId) {
        *self.abandoned.entry(subscription).or_default() += 1;
        self.flush_if_due();
    }

    /// Logs the counts if there are any and the last line is a minute old.
    pub fn flush_if_due(&mut self) {
        if self.dropped.is_empty() && self.abandoned.is_empty() {
            return;
        }
        if self.last_flush.is_some_and(|at| at.elapsed() < DELIVERY_LOG_EVERY) {
            return;
        }
        self.last_flush = Some(std::time::Instant::now());
        for (subscription, count) in self.dropped.drain() {
            tracing::error!(
                subscription_id = %format!("sub_{subscription}"),
                dropped = count,
                "webhook deliveries dropped: the subscription or the outbox has as many queued as allowed"
            );
        }
        for (subscription, count) in self.abandoned.drain() {
            tracing::error!(
                subscription_id = %format!("sub_{subscription}"),
                abandoned = count,
                "webhook deliveries abandoned after their last attempt"
            );
        }
    }
}

/// One event's body as a `DeliveriesQueued` record logs it: once, however
/// many subscriptions take it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuedEvent {
    pub event_type: String,
    pub body: Arc<str>,
}

/// One delivery as a `DeliveriesQueued` record logs it: its event is the
/// record's `events[event]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QueuedDelivery {
    pub id: DeliveryId,
    pub subscription: SubscriptionId,
    pub event: u32,
    pub next_at: Millis,
}

/// The deliveries of a `DeliveriesQueued` record, each sharing its event's body.
pub fn queued_deliveries(events: &[QueuedEvent], deliveries: &[QueuedDelivery]) -> Result<Vec<Arc<Delivery>>, String> {
    deliveries
        .iter()
        .map(|queued| {
            let event = events
                .get(queued.event as usize)
                .ok_or_else(|| format!("delivery {} names event {} of {}", queued.id, queued.event, events.len()))?;
            Ok(Arc::new(Delivery {
                id: queued.id,
                subscription: queued.subscription,
                event_type: event.event_type.clone(),
                body: event.body.clone(),
                attempts: 0,
                next_at: queued.next_at,
            }))
        })
        .collect()
}

/// Gives a delivery the body of the one before it when their bodies are
/// equal: deliveries of one event to several subscriptions have consecutive
/// ids, so loading them in id order shares each body again.
pub fn share_body(previous: Option<&Arc<Delivery>>, delivery: &mut Arc<Delivery>) {
    if let Some(previous) = previous
        && !Arc::ptr_eq(&previous.body, &delivery.body)
        && previous.body == delivery.body
    {
        Arc::make_mut(delivery).body = previous.body.clone();
    }
}

/// The deliveries the state holds, with their due order.
#[derive(Debug, Clone, Default)]
pub struct Outbox {
    deliveries: BTreeMap<DeliveryId, Arc<Delivery>>,
    due: BTreeSet<(Millis, DeliveryId)>,
    /// Per subscription: how many deliveries it has queued, and their bytes.
    per_subscription: HashMap<SubscriptionId, (usize, usize)>,
    /// The bytes of every queued delivery ([`Delivery::held_bytes`]).
    bytes: usize,
}

impl Outbox {
    pub fn len(&self) -> usize {
        self.deliveries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.deliveries.is_empty()
    }

    pub fn get(&self, id: DeliveryId) -> Option<&Arc<Delivery>> {
        self.deliveries.get(&id)
    }

    /// How many deliveries a subscription has queued.
    pub fn pending_for(&self, subscription: SubscriptionId) -> usize {
        self.per_subscription.get(&subscription).map_or(0, |(count, _)| *count)
    }

    /// The bytes of the deliveries a subscription has queued.
    pub fn pending_bytes_for(&self, subscription: SubscriptionId) -> usize {
        self.per_subscription.get(&subscription).map_or(0, |(_, bytes)| *bytes)
    }

    /// The bytes of every queued delivery.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn deliveries(&self) -> impl Iterator<Item = &Arc<Delivery>> {
        self.deliveries.values()
    }

    pub fn insert(&mut self, delivery: Arc<Delivery>) -> Result<(), String> {
        if self.deliveries.contains_key(&delivery.id) {
            return Err(format!("delivery {} queued twice", delivery.id));
        }
        self.due.insert((delivery.next_at, delivery.id));
        let held = delivery.held_bytes();
        let (count, bytes) = self.per_subscription.entry(delivery.subscription).or_default();
        *count += 1;
        *bytes += held;
        self.bytes += held;
        self.deliveries.insert(delivery.id, delivery);
        Ok(())
    }

    pub fn remove(&mut self, id: DeliveryId) -> Option<Arc<Delivery>> {
        let delivery = self.deliveries.remove(&id)?;
        self.due.remove(&(delivery.next_at, id));
        let held = delivery.held_bytes();
        self.bytes -= held;
        if let Some((count, bytes)) = self.per_subscription.get_mut(&delivery.subscription) {
            *count -= 1;
            *bytes -= held;
            if *count == 0 {
                self.per_subscription.remove(&delivery.subscription);
            }
        }
        Some(delivery)
    }

    /// Changes a delivery in place, keeping the due order right.
    pub fn update(&mut self, id: DeliveryId, change: impl FnOnce(&mut Delivery)) -> Result<(), String> {
        let delivery = self.deliveries.get_mut(&id).ok_or_else(|| format!("unknown delivery {id}"))?;
        self.due.remove(&(delivery.next_at, id));
        change(Arc::make_mut(delivery));
        self.due.insert((delivery.next_at, id));
        Ok(())
    }

    /// Every delivery of a subscription, removed (it was deleted or paused).
    pub fn drop_subscription(&mut self, subscription: SubscriptionId) -> usize {
        if self.pending_for(subscription) == 0 {
            return 0;
        }
        let ids: Vec<DeliveryId> =
            self.deliveries.values().filter(|delivery| delivery.subscription == subscription).map(|d| d.id).collect();
        for id in &ids {
            self.remove(*id);
        }
        ids.len()
    }

    /// Deliveries whose time came, earliest first, skipping `busy` ones.
    pub fn due(&self, now: Millis, busy: &dyn Fn(DeliveryId) -> bool) -> impl Iterator<Item = DeliveryId> {
        self.due.range(..=(now, DeliveryId(JobId(u128::MAX)))).map(|(_, id)| *id).filter(move |id| !busy(*id))
    }

    /// When the earliest delivery is due.
    pub fn next_due(&self) -> Option<Millis> {
        self.due.first().map(|(at, _)| *at)
    }

    /// When the earliest delivery due after `now` is due.
    pub fn next_due_after(&self, now: Millis) -> Option<Millis> {
        self.due.range((now.saturating_add(1), DeliveryId(JobId(0)))..).next().map(|(at, _)| *at)
    }
}

/// When a failed attempt's delivery goes out again: the schedule's delay
/// after `attempts` attempts, or a 429's longer `Retry-After` (capped);
/// `None` when the attempts ran out.
pub fn next_attempt_at(now: Millis, attempts: u32, retry_after_ms: Option<i64>) -> Option<Millis> {
    if attempts >= DELIVERY_ATTEMPTS_MAX {
        return None;
    }
    let scheduled = RETRY_DELAYS_MS[(attempts.max(1) - 1) as usize];
    let wait = retry_after_ms.map_or(scheduled, |asked| asked.min(RETRY_AFTER_MAX_MS).max(scheduled));
    Some(now.saturating_add(wait))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deliveries of one event to three subscriptions, in both record forms,
    /// as logged: the first record format's, and today's.
    fn both_forms() -> [(&'static str, Vec<u8>); 2] {
        use crate::engine::legacy::RecordV1;
        use crate::engine::record::{Logged, encode_sequences};
        let body: Arc<str> = Arc::from(r#"{"id":"evt_1","data":{}}"#);
        let old = (1..=3)
            .map(|n| {
                Arc::new(Delivery {
                    id: DeliveryId(JobId(n)),
                    subscription: SubscriptionId(JobId(100 + n)),
                    event_type: "job.enqueued".into(),
                    // Each its own copy, as decoding gives it.
                    body: Arc::from(&*body),
                    attempts: 0,
                    next_at: 5,
                })
            })
            .collect();
        let events = vec![QueuedEvent { event_type: "job.enqueued".into(), body: body.clone() }];
        let deliveries = (1..=3)
            .map(|n| QueuedDelivery {
                id: DeliveryId(JobId(n)),
                subscription: SubscriptionId(JobId(100 + n)),
                event: 0,
                next_at: 5,
            })
            .collect();
        let whole = postcard::to_allocvec(&vec![RecordV1::DeliveriesQueued { at: 5, deliveries: old }]).unwrap();
        let once = Logged::new(5, super::super::record::DeliveriesQueuedOnce { events, deliveries });
        [("whole bodies", whole), ("bodies once", encode_sequences(&[once]).concat())]
    }

    #[test]
    fn queued_deliveries_load_from_either_record_with_one_body() {
        for (kind, logged) in both_forms() {
            let decoded = crate::engine::record::decode_batch(&logged).unwrap();
            let mut state = crate::engine::state::State::new(Default::default());
            for record in &decoded {
                state.apply(record, &mut crate::engine::events::EventSink::disabled()).unwrap();
            }
            let loaded: Vec<_> = state.outbox.deliveries().cloned().collect();
            assert_eq!(loaded.len(), 3, "{kind}");
            assert!(loaded.iter().all(|delivery| Arc::ptr_eq(&delivery.body, &loaded[0].body)), "{kind}: one body");
            assert_eq!(state.outbox.pending_for(SubscriptionId(JobId(102))), 1, "{kind}");
            assert_eq!(state.outbox.bytes(), 3 * loaded[0].held_bytes(), "{kind}");
        }
    }

    #[test]
    fn a_queued_delivery_naming_a_missing_event_is_refused() {
        let deliveries =
            [QueuedDelivery { id: DeliveryId(JobId(1)), subscription: SubscriptionId(JobId(2)), event: 1, next_at: 0 }];
        assert!(queued_deliveries(&[], &deliveries).is_err());
    }

    fn delivery(id: u128, subscription: u128, next_at: Millis) -> Arc<Delivery> {
        Arc::new(Delivery {
            id: DeliveryId(JobId(id)),
            subscription: SubscriptionId(JobId(subscription)),
            event_type: "job.completed".into(),
            body: Arc::from("{}"),
            attempts: 0,
            next_at,
        })
    }

    #[test]
    fn the_schedule_is_the_documented_one_and_honours_a_longer_retry_after() {
        let waits: Vec<i64> = (1..8).map(|attempts| next_attempt_at(0, attempts, None).unwrap()).collect();
        assert_eq!(waits, RETRY_DELAYS_MS);
        assert_eq!(RETRY_DELAYS_MS.iter().sum::<i64>(), (50 * 60 + 36) * 60_000, "50 h 36 min in all");
        assert_eq!(next_attempt_at(0, 8, None), None, "eight attempts, then abandoned");
        assert_eq!(next_attempt_at(0, 1, Some(1_000)), Some(60_000), "a shorter Retry-After does not hurry");
        assert_eq!(next_attempt_at(0, 1, Some(600_000)), Some(600_000));
        assert_eq!(next_attempt_at(0, 1, Some(i64::MAX)), Some(RETRY_AFTER_MAX_MS), "capped at 24 h");
    }

    #[test]
    fn due_order_counts_and_dropping_a_subscription() {
        let mut outbox = Outbox::default();
        outbox.insert(delivery(1, 7, 30)).unwrap();
        outbox.insert(delivery(2, 7, 10)).unwrap();
        outbox.insert(delivery(3, 8, 20)).unwrap();
        assert!(outbox.insert(delivery(3, 8, 20)).is_err());
        let due: Vec<u128> = outbox.due(25, &|_| false).map(|id| id.0.0).collect();
        assert_eq!(due, [2, 3]);
        let not_busy: Vec<u128> = outbox.due(25, &|id| id.0.0 == 2).map(|id| id.0.0).collect();
        assert_eq!(not_busy, [3]);
        outbox.update(DeliveryId(JobId(2)), |d| d.next_at = 100).unwrap();
        assert_eq!(outbox.next_due(), Some(20));
        assert_eq!(
            (outbox.pending_for(SubscriptionId(JobId(7))), outbox.drop_subscription(SubscriptionId(JobId(7)))),
            (2, 2)
        );
        assert_eq!((outbox.len(), outbox.pending_for(SubscriptionId(JobId(7)))), (1, 0));
    }
}
