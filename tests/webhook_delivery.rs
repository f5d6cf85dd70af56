//! Webhook attempts against a real HTTPS receiver (a certificate made by
//! the test, trusted through `webhooks.extra_ca_file`): the signature recipe
//! and its headers, both signatures during a rotation, redirects refused,
//! `429`, TLS failures and the address guard at attempt time.

mod common;
#[path = "support/receiver.rs"]
mod receiver;

use common::{TestServer, config_for, spawn_server_with_env};
use receiver::{Receiver, next_file, verify};
use serde_json::{Value, json};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use svc::__private::server::engine_config;

const SECRET: &str = "receiver-secret-0123456789";

fn server(dir: &Path, allow_private: bool, ca_file: Option<&Path>) -> TestServer {
    let mut config = config_for(dir);
    config.webhooks_allow_private_targets = allow_private;
    config.webhooks_extra_ca_file = ca_file.map(Path::to_path_buf);
    TestServer::start_with(&config, engine_config(&config))
}

fn subscribe(server: &TestServer, url: &str) -> String {
    let created = server.post("/svc/v1/webhooks", json!({"url": url, "events": ["job.*"], "secret": SECRET}));
    assert_eq!(created.status, 201, "{}", created.body);
    created.body["subscription"]["id"].as_str().unwrap().to_string()
}

fn test_event(server: &TestServer, id: &str) -> Value {
    let answer = server.post_raw(&format!("/svc/v1/webhooks/{id}/test"), "", None);
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

#[test]
fn a_test_event_is_signed_by_the_documented_recipe() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    let server = server(&dir.path().join("svc"), true, Some(&receiver.ca_file));
    let id = subscribe(&server, &receiver.url("127.0.0.1"));

    let answer = test_event(&server, &id);
    assert_eq!((answer["success"].as_bool(), answer["status_code"].as_u64()), (Some(true), Some(200)), "{answer}");
    assert!(answer["delivery_id"].as_str().unwrap().starts_with("del_"));
    let received = receiver.received.lock().unwrap();
    let request = &received[0];
    let headers = &request.headers;
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(body["type"], "webhook.test");
    assert_eq!(body["id"], answer["event_id"]);
    assert_eq!(body["data"], json!({"subscription_id": id, "message": "test event"}));
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["x-svc-event-type"], "webhook.test");
    assert_eq!(headers["x-svc-subscription-id"], id);
    assert_eq!(headers["x-svc-delivery-id"], answer["delivery_id"].as_str().unwrap());
    assert!(headers["user-agent"].starts_with("svc-webhooks/"));
    // The receiver's checks: a signature over this timestamp and body, and a timestamp within 5 minutes.
    let timestamp = &headers["x-svc-timestamp"];
    assert!(verify(SECRET, timestamp, &request.body, &headers["x-svc-signature"]));
    assert!(!verify("another-secret-0123456", timestamp, &request.body, &headers["x-svc-signature"]));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((now - timestamp.parse::<i64>().unwrap()).abs() <= 300, "the 5-minute rule");
    assert!(!headers.contains_key("x-svc-signature-new"), "no rotation, no second signature");
}

#[test]
fn during_a_rotation_both_secrets_sign() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    let server = server(&dir.path().join("svc"), true, Some(&receiver.ca_file));
    let id = subscribe(&server, &receiver.url("localhost"));
    let next = "the-next-secret-0123456";
    assert_eq!(server.post(&format!("/svc/v1/webhooks/{id}/secrets"), json!({"secret": next})).status, 200);
    assert_eq!(test_event(&server, &id)["success"], true);
    assert_eq!(server.delete(&format!("/svc/v1/webhooks/{id}/secrets/previous")).status, 200);
    assert_eq!(test_event(&server, &id)["success"], true);

    let received = receiver.received.lock().unwrap();
    let (during, after) = (&received[0], &received[1]);
    let timestamp = &during.headers["x-svc-timestamp"];
    assert!(verify(SECRET, timestamp, &during.body, &during.headers["x-svc-signature"]), "the old secret still signs");
    assert!(verify(next, timestamp, &during.body, &during.headers["x-svc-signature-new"]));
    let timestamp = &after.headers["x-svc-timestamp"];
    assert!(verify(next, timestamp, &after.body, &after.headers["x-svc-signature"]), "then the new one alone");
    assert!(!after.headers.contains_key("x-svc-signature-new"));
}

#[test]
fn redirects_are_not_followed_and_failures_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    let server = server(&dir.path().join("svc"), true, Some(&receiver.ca_file));
    let id = subscribe(&server, &receiver.url("127.0.0.1"));

    receiver.answer_next(302, vec![("location", receiver.url("127.0.0.1") + "/elsewhere")]);
    let redirected = test_event(&server, &id);
    assert_eq!((redirected["success"].as_bool(), redirected["error"].as_str()), (Some(false), Some("redirect")));
    assert_eq!(redirected["status_code"], 302);
    assert_eq!(receiver.count(), 1, "the redirect was not followed");

    receiver.answer_next(429, vec![("retry-after", "120".to_string())]);
    let limited = test_event(&server, &id);
    assert_eq!((limited["status_code"].as_u64(), limited["error"].as_str()), (Some(429), Some("http_status")));

    receiver.answer_next(500, Vec::new());
    assert_eq!(test_event(&server, &id)["status_code"], 500);

    // Nobody listening.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("https://127.0.0.1:{}/x", closed.local_addr().unwrap().port());
    drop(closed);
    let dead_id = subscribe(&server, &dead);
    let refused = test_event(&server, &dead_id);
    assert_eq!((refused["success"].as_bool(), refused["error"].as_str()), (Some(false), Some("connection_failed")));
    assert!(refused.get("status_code").is_none());
}

/// The answer's `error` and its `error_detail`, which must name `cause`.
fn failure_of(answer: &Value, error: &str, cause: &str) -> String {
    assert_eq!((answer["success"].as_bool(), answer["error"].as_str()), (Some(false), Some(error)), "{answer}");
    let detail = answer["error_detail"].as_str().unwrap_or_else(|| panic!("no error_detail in {answer}"));
    assert!(detail.to_lowercase().contains(&cause.to_lowercase()), "{detail:?} does not name {cause:?}");
    detail.to_string()
}

/// A failed test event says why, in `error_detail`: what the connection,
/// the TLS handshake, the receiver or the guard said, never the body.
#[test]
fn a_failed_test_event_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    let stranger = Receiver::start(dir.path());
    let elsewhere = Receiver::self_signed(dir.path(), rcgen::IsCa::NoCa, &["receiver.example"], LONG_AGO, FAR_OFF);
    let mut config = config_for(&dir.path().join("svc"));
    config.webhooks_allow_private_targets = true;
    config.webhooks_extra_ca_file = Some(bundle(dir.path(), &[&receiver.ca_file, &elsewhere.ca_file]));
    config.webhooks_timeout_ms = 300;
    let server = TestServer::start_with(&config, engine_config(&config));

    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("https://127.0.0.1:{}/x", closed.local_addr().unwrap().port());
    drop(closed);
    let refused = test_event(&server, &subscribe(&server, &dead));
    failure_of(&refused, "connection_failed", "connection refused");
    assert!(refused.get("status_code").is_none());

    let unknown = test_event(&server, &subscribe(&server, &stranger.url("127.0.0.1")));
    failure_of(&unknown, "tls_error", "UnknownIssuer");
    let wrong_name = test_event(&server, &subscribe(&server, &elsewhere.url("127.0.0.1")));
    failure_of(&wrong_name, "tls_error", "not valid for name");

    let id = subscribe(&server, &receiver.url("127.0.0.1"));
    receiver.answer_next(500, Vec::new());
    let failed = test_event(&server, &id);
    let detail = failure_of(&failed, "http_status", "500");
    assert!(!detail.contains("ok"), "the receiver's body is not shown: {detail:?}");
    receiver.answer_next(429, vec![("retry-after", "120".to_string())]);
    failure_of(&test_event(&server, &id), "http_status", "Retry-After: 120 s");
    receiver.answer_next(302, vec![("location", "https://elsewhere.example/".to_string())]);
    failure_of(&test_event(&server, &id), "redirect", "302");

    *receiver.delay.lock().unwrap() = std::time::Duration::from_secs(2);
    let slow = test_event(&server, &subscribe(&server, &receiver.slow_url("127.0.0.1")));
    failure_of(&slow, "timeout", "no answer within 300 ms");
    *receiver.delay.lock().unwrap() = std::time::Duration::ZERO;

    // The same subscriptions once private targets are refused.
    server.stop();
    config.webhooks_allow_private_targets = false;
    let server = TestServer::start_with(&config, engine_config(&config));
    let literal = test_event(&server, &id);
    failure_of(&literal, "blocked_address", "allow_private_targets");
}

#[test]
fn an_untrusted_certificate_fails_the_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    let server = server(&dir.path().join("svc"), true, None);
    let id = subscribe(&server, &receiver.url("127.0.0.1"));
    let answer = test_event(&server, &id);
    assert_eq!((answer["success"].as_bool(), answer["error"].as_str()), (Some(false), Some("tls_error")), "{answer}");
    assert_eq!(receiver.count(), 0, "nothing was sent");
}

/// A file holding the certificates of every file in `files`.
fn bundle(dir: &Path, files: &[&Path]) -> PathBuf {
    let text: String = files.iter().map(|file| std::fs::read_to_string(file).unwrap()).collect();
    let path = dir.join(format!("bundle-{}.pem", next_file()));
    std::fs::write(&path, text).unwrap();
    path
}

/// What `openssl req -x509` makes by default: a self-signed certificate
/// that says it is a CA (webpki takes no CA as a receiver's certificate).
fn like_openssl() -> rcgen::IsCa {
    rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained)
}

const LONG_AGO: (i32, u8, u8) = (2020, 1, 1);
const FAR_OFF: (i32, u8, u8) = (2200, 1, 1);

/// A self-signed receiver certificate listed in `webhooks.extra_ca_file` is
/// taken as presented (pinned by its bytes), whatever its basic
/// constraints, beside a CA listed there; one not listed is refused.
#[test]
fn a_listed_self_signed_certificate_is_trusted_as_itself() {
    let dir = tempfile::tempdir().unwrap();
    let names = ["localhost", "127.0.0.1"];
    let pinned = Receiver::self_signed(dir.path(), like_openssl(), &names, LONG_AGO, FAR_OFF);
    let plain = Receiver::self_signed(dir.path(), rcgen::IsCa::NoCa, &names, LONG_AGO, FAR_OFF);
    let unlisted = Receiver::self_signed(dir.path(), like_openssl(), &names, LONG_AGO, FAR_OFF);
    let unlisted_plain = Receiver::self_signed(dir.path(), rcgen::IsCa::NoCa, &names, LONG_AGO, FAR_OFF);
    let chained = Receiver::start(dir.path());
    let listed = bundle(dir.path(), &[&chained.ca_file, &pinned.ca_file, &plain.ca_file]);
    let server = server(&dir.path().join("svc"), true, Some(&listed));

    for receiver in [&pinned, &plain] {
        for host in ["127.0.0.1", "localhost"] {
            let id = subscribe(&server, &receiver.url(host));
            let answer = test_event(&server, &id);
            assert_eq!(
                (answer["success"].as_bool(), answer["status_code"].as_u64()),
                (Some(true), Some(200)),
                "{answer}"
            );
        }
        assert_eq!(receiver.count(), 2);
    }
    let id = subscribe(&server, &chained.url("127.0.0.1"));
    assert_eq!(test_event(&server, &id)["success"], true, "a CA in the same file still issues");

    for receiver in [&unlisted, &unlisted_plain] {
        let id = subscribe(&server, &receiver.url("127.0.0.1"));
        let answer = test_event(&server, &id);
        assert_eq!(
            (answer["success"].as_bool(), answer["error"].as_str()),
            (Some(false), Some("tls_error")),
            "{answer}"
        );
        assert_eq!(receiver.count(), 0, "nothing was sent");
    }
}

/// A pinned certificate is still checked for the host name and its
/// validity period.
#[test]
fn a_listed_self_signed_certificate_must_name_the_host_and_be_current() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = Receiver::self_signed(dir.path(), like_openssl(), &["receiver.example"], LONG_AGO, FAR_OFF);
    let expired = Receiver::self_signed(dir.path(), like_openssl(), &["127.0.0.1"], LONG_AGO, (2021, 1, 1));
    let early = Receiver::self_signed(dir.path(), like_openssl(), &["127.0.0.1"], (2190, 1, 1), FAR_OFF);
    let listed = bundle(dir.path(), &[&elsewhere.ca_file, &expired.ca_file, &early.ca_file]);
    let server = server(&dir.path().join("svc"), true, Some(&listed));
    for receiver in [&elsewhere, &expired, &early] {
        let id = subscribe(&server, &receiver.url("127.0.0.1"));
        let answer = test_event(&server, &id);
        assert_eq!(
            (answer["success"].as_bool(), answer["error"].as_str()),
            (Some(false), Some("tls_error")),
            "{answer}"
        );
        assert_eq!(receiver.count(), 0, "nothing was sent");
    }
}

/// Subscriptions made while private targets were allowed, checked again at
/// each attempt once they are not: an address in the URL, and a host name
/// that resolves to a loopback address.
#[test]
fn the_guard_runs_again_at_every_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    let data = dir.path().join("svc");
    let server = server(&data, true, Some(&receiver.ca_file));
    let literal = subscribe(&server, &receiver.url("127.0.0.1"));
    let named = subscribe(&server, &receiver.url("localhost"));
    let mapped = subscribe(&server, &format!("https://[::ffff:127.0.0.1]:{}/hooks", receiver.port));
    assert_eq!(test_event(&server, &named)["success"], true);
    server.stop();

    let server = self::server(&data, false, Some(&receiver.ca_file));
    let before = receiver.count();
    for id in [&literal, &named, &mapped] {
        let answer = test_event(&server, id);
        assert_eq!(
            (answer["success"].as_bool(), answer["error"].as_str()),
            (Some(false), Some("blocked_address")),
            "{id}"
        );
        failure_of(&answer, "blocked_address", "allowed only with webhooks.allow_private_targets");
    }
    assert_eq!(receiver.count(), before, "no connection was made");
    assert_eq!(server.post_raw("/svc/v1/webhooks/sub_nope/test", "", None).status, 404);
}

/// Waits (real time, bounded) until the receiver got `count` requests.
fn wait_for(receiver: &Receiver, count: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while receiver.count() < count {
        assert!(std::time::Instant::now() < deadline, "{} of {count} deliveries arrived", receiver.count());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Waits until the engine has heard how the last attempt went, and the
/// queued deliveries are then `expected` as (attempts, due in ms from now).
/// A receiver notes a request before the pool reports its outcome, so the
/// clock must not move before this (the retry would count from the new time).
fn wait_for_outbox(server: &TestServer, clock: &svc::clock::ManualClock, expected: &[(u32, i64)]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let now = svc::clock::Clock::now_ms(clock);
        let image = server.engine().image().wait().unwrap();
        let queued: Vec<(u32, i64)> =
            image.deliveries.iter().map(|delivery| (delivery.attempts, delivery.next_at - now)).collect();
        if queued == expected {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "queued deliveries {queued:?}, expected {expected:?}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A server on the manual clock that delivers to `receiver`.
fn delivering_server(dir: &Path, receiver: &Receiver, clock: &svc::clock::ManualClock) -> TestServer {
    limited_server(dir, receiver, clock, svc::engine::outbox::IN_FLIGHT_PER_SUBSCRIPTION_MAX)
}

/// `delivering_server` with at most `per_subscription` attempts in flight to a subscription.
fn limited_server(
    dir: &Path,
    receiver: &Receiver,
    clock: &svc::clock::ManualClock,
    per_subscription: usize,
) -> TestServer {
    let mut config = config_for(dir);
    config.webhooks_allow_private_targets = true;
    config.webhooks_extra_ca_file = Some(receiver.ca_file.clone());
    let mut engine = engine_config(&config);
    engine.clock = Arc::new(clock.clone());
    engine.webhook_limits.concurrency_per_subscription = per_subscription;
    TestServer::start_with(&config, engine)
}

fn events_of(receiver: &Receiver) -> Vec<(String, String)> {
    receiver
        .received
        .lock()
        .unwrap()
        .iter()
        .map(|request| (request.headers["x-svc-event-type"].clone(), request.headers["x-svc-delivery-id"].clone()))
        .collect()
}

#[test]
fn job_events_reach_the_subscriptions_that_take_them() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    let clock = svc::clock::ManualClock::new(1_800_000_000_000);
    let server = delivering_server(&dir.path().join("svc"), &receiver, &clock);
    let created = server.post(
        "/svc/v1/webhooks",
        json!({"url": receiver.url("127.0.0.1"), "events": ["job.*"], "secret": SECRET, "filter": {"queues": ["mail"]}}),
    );
    assert_eq!(created.status, 201);
    let id = server.enqueue(json!({"type": "email.send", "args": ["a"], "options": {"queue": "mail"}}));
    server.enqueue(json!({"type": "other", "args": [], "options": {"queue": "elsewhere"}}));
    let claimed = server.fetch(&["mail"], 1);
    assert_eq!(server.post("/svc/v1/workers/ack", json!({"job_id": claimed[0]["id"]})).status, 200);
    wait_for(&receiver, 3);
    let mut types: Vec<String> = events_of(&receiver).into_iter().map(|(kind, _)| kind).collect();
    types.sort();
    assert_eq!(types, ["job.completed", "job.enqueued", "job.started"], "the filter kept the other queue out");
    let received = receiver.received.lock().unwrap();
    for request in received.iter() {
        let body: Value = serde_json::from_slice(&request.body).unwrap();
        assert_eq!(body["data"]["job_id"], id.as_str());
        let timestamp = &request.headers["x-svc-timestamp"];
        assert!(verify(SECRET, timestamp, &request.body, &request.headers["x-svc-signature"]));
    }
}

/// The value of a counter in the server's metrics.
fn counter(server: &TestServer, name: &str) -> u64 {
    let text = server.get_text("/metrics");
    let line = text.lines().find(|line| line.starts_with(name)).unwrap_or_else(|| panic!("{name} in the metrics"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn deliveries_waiting_for_room_do_not_keep_the_engine_busy() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    *receiver.delay.lock().unwrap() = std::time::Duration::from_millis(800);
    let clock = svc::clock::ManualClock::new(1_800_000_000_000);
    let server = limited_server(&dir.path().join("svc"), &receiver, &clock, 1);
    subscribe(&server, &receiver.slow_url("127.0.0.1"));
    for n in 0..3 {
        server.enqueue(json!({"type": "report", "args": [n]}));
    }
    // One attempt is at the slow receiver; two deliveries are due and wait
    // for its slot. Nothing else happens, so the engine should sleep (this
    // waits in real time: what is measured is what the engine does meanwhile).
    receiver.wait_for_arrivals("/slow", 1);
    let before = counter(&server, "svc_engine_turns_total");
    std::thread::sleep(std::time::Duration::from_millis(400));
    let turns = counter(&server, "svc_engine_turns_total") - before;
    assert!(turns <= 5, "{turns} engine turns while nothing could start");
    assert_eq!(receiver.arrived_at("/slow"), 1, "the other deliveries waited for the slot");
    *receiver.delay.lock().unwrap() = std::time::Duration::ZERO;
    wait_for(&receiver, 3);
}

#[test]
fn a_subscription_at_its_limit_does_not_hold_back_another() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    *receiver.delay.lock().unwrap() = std::time::Duration::from_secs(30);
    let clock = svc::clock::ManualClock::new(1_800_000_000_000);
    let server = limited_server(&dir.path().join("svc"), &receiver, &clock, 2);
    // The slow one first: its deliveries are due first at every turn.
    subscribe(&server, &receiver.slow_url("127.0.0.1"));
    subscribe(&server, &receiver.url("127.0.0.1"));
    for n in 0..5 {
        server.enqueue(json!({"type": "report", "args": [n]}));
    }
    // Two attempts hang at the slow address, three deliveries wait behind
    // them; the other subscription gets all five meanwhile.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while receiver.count_at("/hooks") < 5 {
        assert!(std::time::Instant::now() < deadline, "{} of 5 deliveries arrived", receiver.count_at("/hooks"));
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    receiver.wait_for_arrivals("/slow", 2);
    assert_eq!(
        (receiver.arrived_at("/slow"), receiver.count_at("/slow")),
        (2, 0),
        "two attempts hang at the slow address, no more"
    );
}

#[test]
fn an_idle_server_sends_a_new_delivery_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    let clock = svc::clock::ManualClock::new(1_800_000_000_000);
    let server = delivering_server(&dir.path().join("svc"), &receiver, &clock);
    subscribe(&server, &receiver.url("127.0.0.1"));
    for n in 1..=3 {
        // Nothing is due and nothing else comes in: the engine would sleep
        // its longest wait (a second) unless it woke for the new delivery.
        let started = std::time::Instant::now();
        server.enqueue(json!({"type": "report", "args": [n]}));
        receiver.wait_for_arrivals("/hooks", n);
        let waited = started.elapsed();
        assert!(waited < std::time::Duration::from_millis(600), "delivery {n} went out after {waited:?}");
    }
}

#[test]
fn failed_attempts_follow_the_schedule_and_keep_their_delivery_id() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    let clock = svc::clock::ManualClock::new(1_800_000_000_000);
    let server = delivering_server(&dir.path().join("svc"), &receiver, &clock);
    let body = json!({"url": receiver.url("127.0.0.1"), "events": ["queue.paused"], "secret": SECRET});
    assert_eq!(server.post("/svc/v1/webhooks", body).status, 201);
    receiver.answer_next(500, Vec::new());
    receiver.answer_next(429, vec![("retry-after", "600".to_string())]);
    receiver.answer_next(503, Vec::new());
    assert_eq!(server.post("/svc/v1/queues/q/pause", json!({})).status, 200);
    wait_for(&receiver, 1);
    wait_for_outbox(&server, &clock, &[(1, 60_000)]);

    // Attempt 2 waits a minute after the first failure.
    server.advance(&clock, 59_000);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(receiver.count(), 1, "not before its minute");
    server.advance(&clock, 1_000);
    wait_for(&receiver, 2);
    wait_for_outbox(&server, &clock, &[(2, 600_000)]);
    // It got 429 with Retry-After 600 s, longer than the 5 minutes scheduled.
    server.advance(&clock, 5 * 60_000);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(receiver.count(), 2, "Retry-After is honoured");
    server.advance(&clock, 5 * 60_000);
    wait_for(&receiver, 3);
    wait_for_outbox(&server, &clock, &[(3, 30 * 60_000)]);
    // Then 30 minutes; the fourth attempt succeeds.
    server.advance(&clock, 30 * 60_000);
    wait_for(&receiver, 4);
    wait_for_outbox(&server, &clock, &[]);
    let events = events_of(&receiver);
    assert!(events.iter().all(|(kind, id)| kind == "queue.paused" && *id == events[0].1), "{events:?}");
    let timestamps: Vec<i64> = receiver
        .received
        .lock()
        .unwrap()
        .iter()
        .map(|request| request.headers["x-svc-timestamp"].parse().unwrap())
        .collect();
    assert_eq!(timestamps[3] - timestamps[0], 60 + 600 + 1800, "each attempt signed at its own time");
    // Delivered: nothing more goes out.
    server.advance(&clock, 48 * 3_600_000);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(receiver.count(), 4);
}

#[test]
fn a_delivery_is_abandoned_after_its_eighth_failure() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    let clock = svc::clock::ManualClock::new(1_800_000_000_000);
    let server = delivering_server(&dir.path().join("svc"), &receiver, &clock);
    let body = json!({"url": receiver.url("127.0.0.1"), "events": ["queue.*"], "secret": SECRET});
    assert_eq!(server.post("/svc/v1/webhooks", body).status, 201);
    for _ in 0..8 {
        receiver.answer_next(500, Vec::new());
    }
    assert_eq!(server.post("/svc/v1/queues/q/pause", json!({})).status, 200);
    wait_for(&receiver, 1);
    for (attempt, delay_ms) in (2..=8).zip([60_000, 300_000, 1_800_000, 7_200_000, 28_800_000, 57_600_000, 86_400_000])
    {
        wait_for_outbox(&server, &clock, &[(attempt as u32 - 1, delay_ms)]);
        server.advance(&clock, delay_ms);
        wait_for(&receiver, attempt);
    }
    // Abandoned: counted, and never sent again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let metrics = server.get_text("/metrics");
        if metrics.contains("svc_webhook_deliveries_total{result=\"abandoned\"} 1") {
            assert!(metrics.contains("svc_webhook_pending 0"), "{metrics}");
            // Each of the eight attempts was handed to the delivery thread once.
            assert!(metrics.contains("svc_webhook_handoff_seconds_count 8"), "{metrics}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{metrics}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    server.advance(&clock, 7 * 86_400_000);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(receiver.count(), 8);
}

/// A server killed (SIGKILL) while deliveries are queued and in flight
/// delivers every event once it runs again: at least once, by delivery id.
#[test]
fn deliveries_survive_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    *receiver.delay.lock().unwrap() = std::time::Duration::from_millis(100);
    let config = dir.path().join("svc.toml");
    let settings = format!(
        "[webhooks]\nallow_private_targets = true\ntimeout_s = 5\nextra_ca_file = \"{}\"\n",
        receiver.ca_file.display()
    );
    std::fs::write(&config, settings).unwrap();
    let data = dir.path().join("data");
    let env = [("SVC_CONFIG", config.to_str().unwrap())];
    let (mut child, base) = spawn_server_with_env(&data, &env);
    let http = common::http_client();
    let post = |base: &str, path: &str, body: Value| {
        http.post(format!("{base}{path}"))
            .header("content-type", "application/svc+json")
            .body(body.to_string())
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    let body = json!({"url": receiver.slow_url("127.0.0.1"), "events": ["job.enqueued"], "secret": SECRET});
    assert_eq!(post(&base, "/svc/v1/webhooks", body), 201);
    let jobs: Vec<Value> = (0..20).map(|n| json!({"type": "crash.test", "args": [n]})).collect();
    assert_eq!(
        post(&base, "/svc/v1/jobs/batch", json!({"jobs": jobs})),
        201,
        "acknowledged: the deliveries are queued"
    );
    wait_for(&receiver, 2);
    child.kill().unwrap();
    child.wait().unwrap();
    let before = receiver.count();
    assert!(before < 20, "killed with deliveries left ({before} arrived)");

    *receiver.delay.lock().unwrap() = std::time::Duration::ZERO;
    let (mut child, _) = spawn_server_with_env(&data, &env);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let delivered: std::collections::HashSet<String> = events_of(&receiver).into_iter().map(|(_, id)| id).collect();
        if delivered.len() == 20 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{} of 20 events delivered", delivered.len());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let arrived: Vec<Value> = receiver
        .received
        .lock()
        .unwrap()
        .iter()
        .map(|request| serde_json::from_slice(&request.body).unwrap())
        .collect();
    assert!(arrived.iter().all(|event| event["type"] == "job.enqueued" && event["data"]["job_id"].is_string()));
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A program that embeds svc sends deliveries too, from its own runtime.
#[test]
fn an_embedded_queue_delivers_when_opened_with_webhooks() {
    use svc::webhook::subscription::WebhookBuilder;
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    let settings = svc::WebhookSettings::default()
        .allow_private_targets(true)
        .extra_ca_file(receiver.ca_file.clone())
        .timeout(std::time::Duration::from_secs(5))
        // The server's tests run the default, the idle class; this one the other.
        .priority(svc::webhook::DeliveryPriority::Low);
    let queue =
        svc::Svc::open_with_webhooks(svc::engine::EngineConfig::new(dir.path().join("data")), settings).unwrap();
    queue.create_webhook(WebhookBuilder::new(&receiver.url("127.0.0.1"), ["job.enqueued"], SECRET)).unwrap();
    let job = queue.enqueue(svc::job::JobBuilder::new("embedded.job").args([1])).unwrap().job;
    wait_for(&receiver, 1);
    let received = receiver.received.lock().unwrap();
    let body: Value = serde_json::from_slice(&received[0].body).unwrap();
    assert_eq!(body["data"]["job_id"], job.id.to_string());
    assert!(verify(
        SECRET,
        &received[0].headers["x-svc-timestamp"],
        &received[0].body,
        &received[0].headers["x-svc-signature"]
    ));
    drop(received);
    queue.close();
}
