//! Webhook subscriptions on PostgreSQL (docs/postgres.md, "Webhooks"): the
//! subscriptions in `svc_webhooks`, and the leader's matching of committed
//! events to them, which fills the outbox (`svc_deliveries`) that
//! `deliveries.rs` sends from.
//!
//! Events are matched after they commit, not in the transaction that writes
//! them, so a job operation pays nothing for webhooks. The leader reads the
//! events in the order of the transactions that wrote them, and only those
//! older than every transaction still running (the snapshot's xmin): an
//! event that commits late cannot appear behind the point already matched.
//! Each pass matches a batch and moves that point in one transaction, so an
//! event is matched once, whichever node leads; the same pass counts the
//! events into the leader's metrics, so each is counted once too.

use std::collections::HashMap;
use std::sync::Arc;

use deadpool_postgres::GenericClient;

use super::jobs::{PgJobs, database};
use super::sql::{Prepared, from_body, to_body};
use crate::backend::Page;
use crate::clock::Millis;
use crate::engine::changed_subscription as changed;
use crate::engine::counting::EventCounter;
use crate::engine::outbox::{DeliveryLog, Queued, delivery_held_bytes};
use crate::engine::{EngineError, Event, EventKind, WebhookChange};
use crate::job::{DeliveryId, QueueName, SubscriptionId};
use crate::webhook::Subscription;
use crate::webhook::subscription::NewSubscription;

/// The advisory lock creations hold (`svc_webh` as eight bytes), so that
/// creations past the cap cannot race each other.
const CREATION_LOCK: i64 = i64::from_be_bytes(*b"svc_webh");

/// Events one pass of matching reads at most (one transaction).
pub(super) const MATCH_BATCH: i64 = 1_000;

pub(super) fn decode(id: &str, body: &[u8]) -> Result<Subscription, EngineError> {
    from_body("webhook", id, body)
}

impl PgJobs {
    /// Creates a subscription; past `limits.max_webhooks` it is refused.
    pub async fn create_webhook(
        &self,
        now: Millis,
        subscription: NewSubscription,
    ) -> Result<Arc<Subscription>, EngineError> {
        let max_webhooks = self.webhook_limits().max_webhooks;
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        transaction.run("SELECT pg_advisory_xact_lock($1)", &[&CREATION_LOCK]).await.map_err(database)?;
        let count: i64 = transaction.row("SELECT count(*) FROM svc_webhooks", &[]).await.map_err(database)?.get(0);
        if count as usize >= max_webhooks {
            return Err(EngineError::WebhookLimit { max_webhooks });
        }
        let subscription = subscription.stored(SubscriptionId(self.fresh_id(now)), now);
        transaction
            .run(
                "INSERT INTO svc_webhooks (id, body) VALUES ($1::text::uuid, $2)",
                &[&subscription.id.to_string(), &to_body(&subscription)],
            )
            .await
            .map_err(database)?;
        transaction.commit().await.map_err(database)?;
        Ok(Arc::new(subscription))
    }

    /// Changes a subscription by the local engine's rule
    /// ([`changed`]); one paused drops its queued deliveries.
    pub async fn change_webhook(
        &self,
        now: Millis,
        id: SubscriptionId,
        change: WebhookChange,
    ) -> Result<Arc<Subscription>, EngineError> {
        let key = id.to_string();
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let row = transaction
            .maybe_row("SELECT body FROM svc_webhooks WHERE id = $1::text::uuid FOR UPDATE", &[&key])
            .await
            .map_err(database)?
            .ok_or(EngineError::WebhookNotFound { id })?;
        let current = decode(&key, row.get(0))?;
        let subscription = changed(&current, change, now, self.webhook_limits().rotation_grace_ms)?;
        transaction
            .run("UPDATE svc_webhooks SET body = $2 WHERE id = $1::text::uuid", &[&key, &to_body(&subscription)])
            .await
            .map_err(database)?;
        if !subscription.active {
            transaction
                .run("DELETE FROM svc_deliveries WHERE subscription = $1::text::uuid", &[&key])
                .await
                .map_err(database)?;
        }
        transaction.commit().await.map_err(database)?;
        Ok(Arc::new(subscription))
    }

    /// Deletes a subscription and its queued deliveries; answers it as it was.
    pub async fn delete_webhook(&self, id: SubscriptionId) -> Result<Arc<Subscription>, EngineError> {
        let key = id.to_string();
        let client = self.client().await?;
        // The outbox's rows go with it (`ON DELETE CASCADE`).
        let row = client
            .maybe_row("DELETE FROM svc_webhooks WHERE id = $1::text::uuid RETURNING body", &[&key])
            .await
            .map_err(database)?
            .ok_or(EngineError::WebhookNotFound { id })?;
        Ok(Arc::new(decode(&key, row.get(0))?))
    }

    pub async fn webhook(&self, id: SubscriptionId) -> Result<Option<Arc<Subscription>>, EngineError> {
        let key = id.to_string();
        let client = self.client().await?;
        let row = client
            .maybe_row("SELECT body FROM svc_webhooks WHERE id = $1::text::uuid", &[&key])
            .await
            .map_err(database)?;
        row.map(|row| decode(&key, row.get(0)).map(Arc::new)).transpose()
    }

    /// Subscriptions in id order (their creation order) after `after`.
    pub async fn webhooks_page(
        &self,
        after: Option<SubscriptionId>,
        limit: usize,
    ) -> Result<Page<Arc<Subscription>>, EngineError> {
        let after = after.map(|id| id.to_string());
        let client = self.client().await?;
        let rows = client
            .rows(
                "SELECT id::text AS id_text, body FROM svc_webhooks WHERE ($1::text IS NULL OR id > $1::text::uuid) \
                 ORDER BY id LIMIT $2",
                &[&after, &(limit as i64 + 1)],
            )
            .await
            .map_err(database)?;
        let has_more = rows.len() > limit;
        let page = rows.iter().take(limit).map(|row| decode(row.get(0), row.get(1)).map(Arc::new));
        Ok((page.collect::<Result<_, _>>()?, has_more))
    }

    /// One pass of matching (the leader's): the next events, up to
    /// 1 000 (`MATCH_BATCH`), in the order their transactions were written,
    /// become deliveries to the active subscriptions that take them, each
    /// body rendered once; a delivery past the outbox's bounds is dropped
    /// and counted in `log`. Answers how many events were read, and whether
    /// more may be waiting.
    pub async fn match_events(&self, now: Millis, matching: &mut Matching) -> Result<MatchPass, EngineError> {
        let mut client = self.client().await?;
        // A read first: with no event settled past the point matched, nothing
        // is written (an idle database stays idle). The first such event in
        // index order, not `EXISTS`: for `EXISTS` the planner may scan the
        // whole table (docs/perf-log.md, "PostgreSQL: plans that hold").
        let probe = client
            .row(
                "SELECT c.xid::text, pg_snapshot_xmax(pg_current_snapshot())::text, (SELECT e.xid FROM svc_events e \
                   WHERE (e.xid, e.id) > (c.xid, c.id) AND e.xid < pg_snapshot_xmin(pg_current_snapshot()) \
                   ORDER BY e.xid, e.id LIMIT 1) IS NOT NULL \
                 FROM svc_webhook_cursor c",
                &[],
            )
            .await
            .map_err(database)?;
        let (cursor_xid, next_xid, waiting): (String, String, bool) = (probe.get(0), probe.get(1), probe.get(2));
        if xid_below(&next_xid, &cursor_xid) == Some(true) {
            return self.restart_matching(&mut client, &next_xid).await;
        }
        if !waiting {
            return Ok(MatchPass::default());
        }
        let transaction = client.transaction().await.map_err(database)?;
        // Locked, so that two leaders in a handover match each event once;
        // the row read is the newest committed, so the point only moves on.
        let cursor = transaction
            .row("SELECT xid::text, id::text FROM svc_webhook_cursor FOR UPDATE", &[])
            .await
            .map_err(database)?;
        let (cursor_xid, cursor_id): (String, String) = (cursor.get(0), cursor.get(1));
        let rows = transaction.rows("SELECT id::text, body FROM svc_webhooks", &[]).await.map_err(database)?;
        let subscriptions: Vec<Subscription> = rows
            .iter()
            .map(|row| decode(row.get(0), row.get(1)))
            .filter(|subscription| subscription.as_ref().is_ok_and(|s| s.active))
            .collect::<Result<_, _>>()?;
        let rows = transaction
            .rows(
                // `e.xid, e.id`: unqualified, ORDER BY would name the text
                // outputs, sorting every unread event, ids as text
                // ('1000' before '999').
                //
                // Whole rows up to `$3` events (at least one: a run's row
                // holds several), bodies read only for those; `fetched`
                // counts the rows looked at, up to `$3`.
                "WITH next AS (SELECT e.xid, e.id, e.members, \
                     sum(e.members) OVER (ORDER BY e.xid, e.id) AS running \
                   FROM svc_events e \
                   WHERE (e.xid, e.id) > ($1::text::xid8, $2::text::uuid) \
                     AND e.xid < pg_snapshot_xmin(pg_current_snapshot()) \
                   ORDER BY e.xid, e.id LIMIT $3) \
                 SELECT e.id::text, (extract(epoch FROM e.at) * 1000)::int8, e.body, e.xid::text, e.queue, \
                   n.members, (SELECT count(*) FROM next) AS fetched \
                 FROM next n JOIN svc_events e ON e.id = n.id \
                 WHERE n.running <= $3 OR n.running = n.members \
                 ORDER BY n.xid, n.id",
                &[&cursor_xid, &cursor_id, &MATCH_BATCH],
            )
            .await
            .map_err(database)?;
        let read: usize = rows.iter().map(|row| row.get::<_, i32>(5).max(1) as usize).sum();
        // A full batch of rows looked at, or some left unread: more may be waiting.
        let fetched = rows.first().map_or(0, |row| row.get::<_, i64>(6));
        let more_waiting = fetched == MATCH_BATCH || (rows.len() as i64) < fetched;
        // The job itself is decoded only where a subscription may render it
        // or counting needs its times: for the rest, its queue's column does.
        let wants_job = |kind: &EventKind| !subscriptions.is_empty() || EventCounter::needs_job(kind);
        let events: Vec<(Event, Option<QueueName>)> = rows
            .iter()
            .flat_map(|row| {
                let queue = row.get::<_, Option<&str>>(4).map(QueueName::new);
                let events = super::events::decode_if(row.get(0), row.get(1), row.get(2), wants_job);
                events.into_iter().map(move |event| (event, queue.clone()))
            })
            .collect();
        // Taken: should the pass fail from here, figures that may count
        // deliveries never committed are read again.
        let kept = matching.figures.take().filter(|(_, read_at)| read_at.elapsed() < FIGURES_KEPT);
        let (mut figures, mut read_at) = match kept {
            Some((figures, read_at)) => (Some(figures), read_at),
            None => (None, std::time::Instant::now()),
        };
        let mut outbox = Outbox::default();
        let mut dropped = Vec::new();
        for (event, _) in &events {
            let (queue, job_type) = event.webhook_scope();
            let type_name = event.kind.type_name();
            let mut body: Option<String> = None;
            for subscription in &subscriptions {
                if !subscription.takes(type_name, queue, job_type) {
                    continue;
                }
                let figures = match &mut figures {
                    Some(figures) => figures,
                    None => {
                        read_at = std::time::Instant::now();
                        figures.insert(OutboxFigures::read(&transaction).await?)
                    }
                };
                let body = body.get_or_insert_with(|| crate::engine::render_event(event));
                let held = delivery_held_bytes(body, type_name);
                if !self.webhook_limits().has_room(&figures.queued(subscription.id), held) {
                    dropped.push(subscription.id);
                    continue;
                }
                figures.add(subscription.id, held);
                outbox.push(DeliveryId(self.fresh_id(now)), subscription.id, type_name, body, held, event.time);
            }
        }
        outbox.insert(&transaction).await?;
        // The point matched moves to the last event read: every event before
        // it in this order has been read, and none can still appear there.
        if let Some(last) = rows.last() {
            let (next_xid, next_id) = (last.get::<_, String>(3), last.get::<_, String>(0));
            transaction
                .run("UPDATE svc_webhook_cursor SET xid = $1::text::xid8, id = $2::text::uuid", &[&next_xid, &next_id])
                .await
                .map_err(database)?;
        }
        transaction.commit().await.map_err(database)?;
        // Counted once committed: each event once, whichever node leads.
        let metrics = self.metrics();
        let mut counter = EventCounter::default();
        for (event, queue) in &events {
            counter.count_in(metrics, event.time, &event.kind, queue.as_ref(), event.job.as_deref());
        }
        counter.flush(metrics);
        for subscription in dropped {
            metrics.webhook_delivery("dropped");
            matching.log.dropped(subscription);
        }
        if let Some(figures) = figures {
            metrics.webhook_pending.set(figures.all.0 as i64);
            matching.figures = Some((figures, read_at));
        }
        matching.log.flush_if_due();
        Ok(MatchPass { events: read, more_waiting })
    }
}

impl PgJobs {
    /// The point matched lies past every transaction id the server has
    /// given: the database was restored from a dump (or moved by logical
    /// replication) onto a server whose ids start lower. Events kept from
    /// before are taken as matched, and matching starts again from the
    /// server's own ids, so that new events are neither skipped nor pruned
    /// unmatched.
    async fn restart_matching(
        &self,
        client: &mut deadpool_postgres::Object,
        next_xid: &str,
    ) -> Result<MatchPass, EngineError> {
        tracing::warn!(
            next_xid,
            "webhook matching restarts: the database's transaction ids went back (a restore?); events kept \
             from before are not delivered again"
        );
        let transaction = client.transaction().await.map_err(database)?;
        transaction
            .run("UPDATE svc_events SET xid = '0'::xid8 WHERE xid >= $1::text::xid8", &[&next_xid])
            .await
            .map_err(database)?;
        transaction
            .run("UPDATE svc_webhook_cursor SET xid = '0'::xid8, id = $1::text::uuid", &[&MATCHED_ALL])
            .await
            .map_err(database)?;
        transaction.commit().await.map_err(database)?;
        Ok(MatchPass::default())
    }
}

/// The largest event id: with transaction id 0, the point that marks every
/// event of an earlier server as matched.
const MATCHED_ALL: &str = "ffffffff-ffff-ffff-ffff-ffffffffffff";

/// How long the leader counts on the outbox's figures it read, adding what
/// it queued since: deliveries that ended meanwhile are still counted, so a
/// cap may hold back a little early for that long, never let more through.
/// Read at every pass instead, they cost a scan of the outbox per 1 000
/// events while it is full.
const FIGURES_KEPT: std::time::Duration = std::time::Duration::from_secs(1);

/// What one pass of matching read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MatchPass {
    /// Events read (a row holds several for a run of `job.enqueued`).
    pub events: usize,
    /// The pass stopped at its bound with events left: another may follow.
    pub more_waiting: bool,
}

/// What the leader keeps from one pass of matching to the next.
#[derive(Default)]
pub struct Matching {
    /// Deliveries dropped, logged as counts.
    pub log: DeliveryLog,
    /// The outbox's figures, and when they were read.
    figures: Option<(OutboxFigures, std::time::Instant)>,
}

/// What the outbox holds: (deliveries, bytes) by subscription and in all.
#[derive(Default)]
struct OutboxFigures {
    by_subscription: HashMap<SubscriptionId, (usize, usize)>,
    all: (usize, usize),
}

impl OutboxFigures {
    /// The figures as the transaction sees them.
    async fn read(client: &impl GenericClient) -> Result<OutboxFigures, EngineError> {
        let rows = client
            .rows(
                "SELECT subscription::text, count(*), coalesce(sum(held), 0)::int8 FROM svc_deliveries GROUP BY 1",
                &[],
            )
            .await
            .map_err(database)?;
        let mut figures = OutboxFigures::default();
        for row in rows {
            let Some(id) = SubscriptionId::parse(row.get(0)) else { continue };
            let (count, bytes) = (row.get::<_, i64>(1) as usize, row.get::<_, i64>(2) as usize);
            figures.all = (figures.all.0 + count, figures.all.1 + bytes);
            figures.by_subscription.insert(id, (count, bytes));
        }
        Ok(figures)
    }

    fn queued(&self, subscription: SubscriptionId) -> Queued {
        let (count, bytes) = self.by_subscription.get(&subscription).copied().unwrap_or_default();
        Queued { subscription: count, subscription_bytes: bytes, all: self.all.0, all_bytes: self.all.1 }
    }

    fn add(&mut self, subscription: SubscriptionId, held: usize) {
        let entry = self.by_subscription.entry(subscription).or_default();
        *entry = (entry.0 + 1, entry.1 + held);
        self.all = (self.all.0 + 1, self.all.1 + held);
    }
}

/// Whether transaction id `a` is below `b` (both as text); none if either
/// does not read as one.
fn xid_below(a: &str, b: &str) -> Option<bool> {
    Some(a.parse::<u64>().ok()? < b.parse::<u64>().ok()?)
}

/// Deliveries a pass of matching writes, as columns for one statement.
#[derive(Default)]
struct Outbox {
    ids: Vec<String>,
    subscriptions: Vec<String>,
    types: Vec<&'static str>,
    bodies: Vec<String>,
    held: Vec<i64>,
    due: Vec<Millis>,
}

impl Outbox {
    fn push(
        &mut self,
        id: DeliveryId,
        subscription: SubscriptionId,
        event_type: &'static str,
        body: &str,
        held: usize,
        at: Millis,
    ) {
        self.ids.push(id.to_string());
        self.subscriptions.push(subscription.to_string());
        self.types.push(event_type);
        self.bodies.push(body.to_string());
        self.held.push(held as i64);
        self.due.push(at);
    }

    async fn insert(&self, client: &impl GenericClient) -> Result<(), EngineError> {
        if self.ids.is_empty() {
            return Ok(());
        }
        client
            .run(
                "INSERT INTO svc_deliveries (id, subscription, event_type, body, held, next_at) \
                 SELECT t.id::uuid, t.subscription::uuid, t.event_type, t.body, t.held, t.due \
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::int8[]) \
                   AS t(id, subscription, event_type, body, held, due)",
                &[&self.ids, &self.subscriptions, &self.types, &self.bodies, &self.held, &self.due],
            )
            .await
            .map_err(database)?;
        Ok(())
    }
}
