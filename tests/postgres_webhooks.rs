//! Webhooks on PostgreSQL, against a real PostgreSQL server and a real
//! HTTPS receiver: subscriptions shared by the nodes, each event delivered
//! once whichever node wrote it, signed as on the local engine; failed
//! attempts tried again by the schedule, then abandoned; an event whose
//! transaction commits after later ones still delivered; events matched in
//! the order of their transaction ids as numbers; the outbox's bounds.

mod common;
#[path = "support/receiver.rs"]
mod receiver;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::postgres::TempPostgres;
use receiver::{Receiver, verify};
use serde_json::{Value, json};
use svc::backend::Backend;
use svc::backend::postgres::{PgBackend, PgSettings, open};
use svc::clock::ManualClock;
use svc::engine::FetchRequest;
use svc::engine::outbox::RETRY_DELAYS_MS;
use svc::job::{JobBuilder, JobDefaults, JobId, NewJob};
use svc::webhook::Subscription;
use svc::webhook::client::DeliveryClient;
use svc::webhook::subscription::{WebhookBuilder, parse_subscription};

const NOW: i64 = 1_800_000_000_000;
const SECRET: &str = "receiver-secret-0123456789";

fn new_job(builder: JobBuilder) -> NewJob {
    builder.build(&JobDefaults::default()).expect("a valid job")
}

/// A node on `settings` that delivers to receivers the test trusts.
async fn node(settings: &PgSettings, clock: &Arc<ManualClock>, name: &str, receiver: &Receiver) -> PgBackend {
    let mut node = PgBackend::start(settings, clock.clone(), name.into()).await.unwrap();
    node.deliver(DeliveryClient::new(true, Some(&receiver.ca_file)).unwrap()).unwrap();
    node
}

/// A database of the test's own, a receiver, a manual clock and one node
/// that delivers (with the pool the test reads the tables through).
struct Setup {
    pool: deadpool_postgres::Pool,
    receiver: Receiver,
    clock: Arc<ManualClock>,
    node: PgBackend,
    _dir: tempfile::TempDir,
    _server: TempPostgres,
}

impl Setup {
    /// The node subscribed to `events` at the receiver.
    async fn start(database: &str, events: &[&str]) -> Setup {
        let server = TempPostgres::start();
        let settings = PgSettings::new(server.database(database));
        let pool = open(&settings).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let receiver = Receiver::start(dir.path());
        let clock = Arc::new(ManualClock::new(NOW));
        let node = node(&settings, &clock, "node-a", &receiver).await;
        subscribe(&node, WebhookBuilder::new(&receiver.url("127.0.0.1"), events.iter().copied(), SECRET)).await;
        Setup { pool, receiver, clock, node, _dir: dir, _server: server }
    }
}

async fn subscribe(node: &PgBackend, webhook: WebhookBuilder) -> Arc<Subscription> {
    let new = parse_subscription(webhook.into_json().to_string().as_bytes(), true).unwrap();
    node.create_webhook(new).outcome().await.unwrap()
}

/// Waits (real time) until `probe` answers true.
async fn eventually(what: &str, mut probe: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !probe().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The outbox as (attempts, next attempt's time).
async fn outbox(pool: &deadpool_postgres::Pool) -> Vec<(i32, i64)> {
    let client = pool.get().await.unwrap();
    let rows = client.query("SELECT attempts, next_at FROM svc_deliveries ORDER BY id", &[]).await.unwrap();
    rows.iter().map(|row| (row.get(0), row.get(1))).collect()
}

/// (event type, delivery id, body) of each request the receiver answered.
fn deliveries(receiver: &Receiver) -> Vec<(String, String, Value)> {
    let received = receiver.received.lock().unwrap();
    received
        .iter()
        .map(|request| {
            assert!(verify(
                SECRET,
                &request.headers["x-svc-timestamp"],
                &request.body,
                &request.headers["x-svc-signature"]
            ));
            (
                request.headers["x-svc-event-type"].clone(),
                request.headers["x-svc-delivery-id"].clone(),
                serde_json::from_slice(&request.body).unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_of_either_node_reach_the_subscriptions_that_take_them_once() {
    let server = TempPostgres::start();
    let settings = PgSettings::new(server.database("hooks"));
    let pool = open(&settings).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    let clock = Arc::new(ManualClock::new(NOW));
    let a = node(&settings, &clock, "node-a", &receiver).await;
    let b = node(&settings, &clock, "node-b", &receiver).await;

    let mail =
        subscribe(&b, WebhookBuilder::new(&receiver.url("127.0.0.1"), ["job.*"], SECRET).filter_queues(["mail"])).await;
    // Subscriptions are shared: the other node lists and reads it.
    let (listed, _) = a.webhooks_page(None, 10).outcome().await.unwrap();
    assert_eq!(listed.iter().map(|s| s.id).collect::<Vec<_>>(), [mail.id]);
    assert_eq!(a.webhook(mail.id).outcome().await.unwrap().unwrap().url, mail.url);

    let job = b.enqueue(vec![new_job(JobBuilder::new("email.send").args([1]).queue("mail"))]).outcome().await.unwrap();
    let job = job[0].job.id;
    a.enqueue(vec![new_job(JobBuilder::new("other").queue("elsewhere"))]).outcome().await.unwrap();
    let request = FetchRequest { queues: vec!["mail".into()], count: 1, worker_id: None, visibility_timeout_ms: None };
    let claimed = a.fetch(request, 0).outcome().await.unwrap();
    a.ack(claimed[0].id, Some("{\"sent\":true}".into()), None).outcome().await.unwrap();

    eventually("three deliveries arrive", async || receiver.count() >= 3).await;
    eventually("the outbox is empty", async || outbox(&pool).await.is_empty()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let delivered = deliveries(&receiver);
    let mut types: Vec<&str> = delivered.iter().map(|(kind, _, _)| kind.as_str()).collect();
    types.sort();
    assert_eq!(
        types,
        ["job.completed", "job.enqueued", "job.started"],
        "once each; the filter kept the other queue out"
    );
    for (kind, delivery, body) in &delivered {
        assert!(delivery.starts_with("del_"), "{delivery}");
        assert_eq!(body["type"], kind.as_str());
        assert_eq!(body["data"]["job_id"], job.to_string());
    }
    let completed = delivered.iter().find(|(kind, _, _)| kind == "job.completed").unwrap();
    assert_eq!(completed.2["data"]["result"], json!({"sent": true}));
    // Counted by whichever node sent them, once.
    let sent = |node: &PgBackend| {
        let text = node.metrics().render(&[], &[]);
        let line = text.lines().find(|line| line.starts_with(r#"svc_webhook_deliveries_total{result="success"}"#));
        line.map_or(0, |line| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
    };
    assert_eq!(sent(&a) + sent(&b), 3);

    // Paused, it takes nothing; deleted, it is gone on both nodes.
    let patch = svc::webhook::subscription::parse_subscription_patch(br#"{"active": false}"#, true).unwrap();
    a.change_webhook(mail.id, svc::engine::WebhookChange::Patch(patch)).outcome().await.unwrap();
    b.enqueue(vec![new_job(JobBuilder::new("email.send").queue("mail"))]).outcome().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.count(), 3, "a paused subscription takes nothing");
    assert_eq!(b.delete_webhook(mail.id).outcome().await.unwrap().id, mail.id);
    assert!(a.webhook(mail.id).outcome().await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_job_of_a_batch_is_delivered_once() {
    let Setup { pool, receiver, node, .. } = &Setup::start("batch", &["job.enqueued"]).await;
    let batch: Vec<NewJob> = (0..600).map(|n| new_job(JobBuilder::new("bulk").args([n]))).collect();
    let enqueued = node.enqueue(batch).outcome().await.unwrap();
    eventually("600 deliveries arrive", async || receiver.count() >= 600).await;
    eventually("the outbox is empty", async || outbox(pool).await.is_empty()).await;
    let mut delivered: Vec<String> =
        deliveries(receiver).iter().map(|(_, _, body)| body["data"]["job_id"].as_str().unwrap().to_string()).collect();
    delivered.sort();
    let mut expected: Vec<String> = enqueued.iter().map(|enqueued| enqueued.job.id.to_string()).collect();
    expected.sort();
    assert_eq!(delivered, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_follow_the_schedule_then_the_delivery_is_abandoned() {
    let Setup { pool, receiver, clock, node, .. } = &Setup::start("retries", &["job.enqueued"]).await;
    // The first answer asks for two minutes, longer than the schedule's first wait.
    receiver.answer_next(429, vec![("retry-after", "120".into())]);
    for _ in 1..8 {
        receiver.answer_next(500, Vec::new());
    }
    node.enqueue(vec![new_job(JobBuilder::new("t"))]).outcome().await.unwrap();

    let mut now = NOW;
    for attempt in 1..=8 {
        eventually("the attempt arrives", async || receiver.count() == attempt).await;
        if attempt == 8 {
            break;
        }
        let wait = if attempt == 1 { 120_000 } else { RETRY_DELAYS_MS[attempt - 1] };
        let expected = vec![(attempt as i32, now + wait)];
        eventually("the failure is written", async || outbox(pool).await == expected).await;
        now += wait;
        clock.set_ms(now);
    }
    eventually("the delivery is abandoned", async || outbox(pool).await.is_empty()).await;
    let ids: Vec<String> = deliveries(receiver).into_iter().map(|(_, id, _)| id).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "every attempt carries the delivery's id: {ids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_committed_after_later_ones_is_still_delivered() {
    let Setup { pool, receiver, node, .. } = &Setup::start("late", &["job.enqueued"]).await;
    let first = node.enqueue(vec![new_job(JobBuilder::new("first"))]).outcome().await.unwrap()[0].job.id;
    eventually("the first delivery arrives", async || receiver.count() == 1).await;

    // A transaction writes an event (a copy of the first, under an id just
    // after it) and stays open while a later event commits.
    let mut late = pool.get().await.unwrap();
    let late = late.transaction().await.unwrap();
    let event: String = late.query_one("SELECT id::text FROM svc_events", &[]).await.unwrap().get(0);
    let copy = JobId(JobId::parse(&event).unwrap().0 + 1).to_string();
    late.execute(
        "INSERT INTO svc_events (id, at, type, queue, job_type, body) \
         SELECT $1::text::uuid, at, type, queue, job_type, body FROM svc_events WHERE id = $2::text::uuid",
        &[&copy, &event],
    )
    .await
    .unwrap();
    let second = node.enqueue(vec![new_job(JobBuilder::new("second"))]).outcome().await.unwrap()[0].job.id;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.count(), 1, "an event waits while a transaction older than it runs");
    late.commit().await.unwrap();

    eventually("both later events arrive", async || receiver.count() == 3).await;
    let mut jobs: Vec<String> =
        deliveries(receiver).into_iter().map(|(_, _, body)| body["data"]["job_id"].as_str().unwrap().into()).collect();
    jobs.sort();
    let mut expected = vec![first.to_string(), first.to_string(), second.to_string()];
    expected.sort();
    assert_eq!(jobs, expected, "the late event was delivered, not skipped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_past_the_outbox_bounds_are_dropped_and_subscriptions_capped() {
    let server = TempPostgres::start();
    let mut settings = PgSettings::new(server.database("bounds"));
    settings.webhook_limits.max_pending = 3;
    settings.webhook_limits.max_webhooks = 1;
    let pool = open(&settings).await.unwrap();
    let clock = Arc::new(ManualClock::new(NOW));
    // No node sends: deliveries wait in the outbox.
    let node = PgBackend::start(&settings, clock.clone(), "node-a".into()).await.unwrap();
    let url = "https://127.0.0.1:9/hooks";
    subscribe(&node, WebhookBuilder::new(url, ["job.enqueued"], SECRET)).await;
    let second = parse_subscription(WebhookBuilder::new(url, ["*"], SECRET).into_json().to_string().as_bytes(), true);
    let refused = node.create_webhook(second.unwrap()).outcome().await.unwrap_err();
    assert!(refused.to_string().contains("1"), "{refused}");

    let jobs: Vec<NewJob> = (0..5).map(|i| new_job(JobBuilder::new("t").args([i]))).collect();
    node.enqueue(jobs).outcome().await.unwrap();
    eventually("three deliveries are queued", async || outbox(&pool).await.len() == 3).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(outbox(&pool).await.len(), 3, "the other two were dropped");
}

/// A database restored onto another server carries transaction ids larger
/// than the new server's: matching starts again from the server's own ids,
/// so new events are delivered (and old ones not sent again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matching_starts_again_after_a_restore_onto_another_server() {
    let Setup { pool, receiver, node, .. } = &Setup::start("restored", &["job.enqueued"]).await;
    node.enqueue(vec![new_job(JobBuilder::new("before"))]).outcome().await.unwrap();
    eventually("the first delivery arrives", async || receiver.count() == 1).await;
    // As after a restore: the ids written came from a server far ahead.
    let client = pool.get().await.unwrap();
    client.execute("UPDATE svc_events SET xid = '900000000000'", &[]).await.unwrap();
    client.execute("UPDATE svc_webhook_cursor SET xid = '900000000000'", &[]).await.unwrap();

    let after = node.enqueue(vec![new_job(JobBuilder::new("after"))]).outcome().await.unwrap()[0].job.id;
    eventually("the new event is delivered", async || receiver.count() == 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let delivered = deliveries(receiver);
    assert_eq!(delivered.len(), 2, "the event from before is not sent again");
    assert_eq!(delivered[1].2["data"]["job_id"], after.to_string());
}

/// Events are matched in the order of their transaction ids as numbers:
/// events written on both sides of a power of ten (9 999, then 10 000) and
/// read in one pass are each delivered once, none read again or passed by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_across_a_power_of_ten_in_transaction_ids_are_delivered_once() {
    let Setup { pool, receiver, node, .. } = &Setup::start("digits", &["job.enqueued"]).await;
    // An open transaction with an id of its own holds every later event
    // back, so that the leader reads them all in one pass.
    let mut held = pool.get().await.unwrap();
    let held = held.transaction().await.unwrap();
    let oldest: i64 = held.query_one("SELECT pg_current_xact_id()::text::int8", &[]).await.unwrap().get(0);
    // The next power of ten with room below it for the enqueues' ids.
    let boundary = 10_i64.pow((oldest + 100).ilog10() + 1);
    // Transaction ids used up, each in a transaction of its own, to just
    // below the boundary.
    let burner = pool.get().await.unwrap();
    burner
        .batch_execute(&format!(
            "DO $$ BEGIN WHILE pg_current_xact_id()::text::int8 < {} LOOP COMMIT; END LOOP; END $$",
            boundary - 4
        ))
        .await
        .unwrap();
    let mut enqueued = Vec::new();
    for i in 0..8 {
        let job = node.enqueue(vec![new_job(JobBuilder::new("t").args([i]))]).outcome().await.unwrap();
        enqueued.push(job[0].job.id.to_string());
    }
    let xids: Vec<i64> = burner
        .query("SELECT xid::text::int8 FROM svc_events ORDER BY xid", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(xids[0] < boundary && xids[xids.len() - 1] >= boundary, "the events straddle {boundary}: {xids:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(receiver.count(), 0, "held back by the older transaction");
    held.commit().await.unwrap();

    eventually("every event is delivered", async || receiver.count() >= enqueued.len()).await;
    eventually("the outbox is empty", async || outbox(pool).await.is_empty()).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut delivered: Vec<String> =
        deliveries(receiver).into_iter().map(|(_, _, body)| body["data"]["job_id"].as_str().unwrap().into()).collect();
    delivered.sort();
    enqueued.sort();
    assert_eq!(delivered, enqueued, "each event once");
}
