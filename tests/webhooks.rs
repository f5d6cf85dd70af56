//! Webhook subscriptions end to end: both route spellings, validation with
//! its reasons, secrets that never come back, secret rotation on the manual
//! clock, and durability across a restart. The tests that need no clock
//! run on PostgreSQL too (`on_postgres_*`).

mod common;

use common::{PostgresNode, TestServer, config_for};
use serde_json::{Value, json};
use std::sync::Arc;
use svc::__private::server::engine_config;
use svc::clock::ManualClock;

const SECRET: &str = "whk-secret-0123456789";

fn subscription() -> Value {
    json!({"url": "https://hooks.example.com/svc", "events": ["job.completed", "job.failed"], "secret": SECRET,
           "metadata": {"team": "billing"}, "filter": {"queues": ["mail"]}})
}

/// A server on the manual clock.
fn start(dir: &std::path::Path, clock: &ManualClock) -> TestServer {
    let config = config_for(dir);
    let mut engine = engine_config(&config);
    engine.clock = Arc::new(clock.clone());
    TestServer::start_with(&config, engine)
}

#[test]
fn create_read_list_change_delete_under_both_paths() {
    let dir = tempfile::tempdir().unwrap();
    check_create_read_list_change_delete_under_both_paths(&TestServer::start(dir.path()));
}

#[test]
fn on_postgres_create_read_list_change_delete_under_both_paths() {
    check_create_read_list_change_delete_under_both_paths(&PostgresNode::start("webhooks"));
}

fn check_create_read_list_change_delete_under_both_paths(server: &TestServer) {
    let created = server.post("/svc/v1/webhooks", subscription());
    assert_eq!(created.status, 201, "{}", created.body);
    let id = created.body["subscription"]["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("sub_"));
    assert_eq!(created.header("location"), Some(format!("/svc/v1/webhooks/{id}").as_str()));
    let sub = &created.body["subscription"];
    assert_eq!(sub["events"], json!(["job.completed", "job.failed"]));
    assert_eq!((sub["active"].as_bool(), &sub["metadata"]), (Some(true), &json!({"team": "billing"})));
    assert_eq!(sub["filter"], json!({"queues": ["mail"]}));

    let alias = server.post("/svc/v1/webhooks/subscriptions", subscription());
    assert_eq!(alias.status, 201);
    let second = alias.body["subscription"]["id"].as_str().unwrap().to_string();
    assert_eq!(alias.header("location"), Some(format!("/svc/v1/webhooks/{second}").as_str()), "canonical Location");

    for base in ["/svc/v1/webhooks", "/svc/v1/webhooks/subscriptions"] {
        let listed = server.get(&format!("{base}?limit=1"));
        assert_eq!(listed.body["subscriptions"][0]["id"], id.as_str(), "creation order");
        assert_eq!(listed.body["has_more"], true);
        let cursor = listed.body["cursor"].as_str().unwrap();
        let rest = server.get(&format!("{base}?limit=1&cursor={cursor}"));
        assert_eq!(rest.body["subscriptions"][0]["id"], second.as_str());
        assert_eq!(rest.body["has_more"], false);
        assert_eq!(server.get(&format!("{base}/{id}")).body["subscription"]["id"], id.as_str());
    }

    let changed =
        server.patch(&format!("/svc/v1/webhooks/subscriptions/{id}"), json!({"events": ["job.*"], "active": false}));
    assert_eq!(changed.status, 200, "{}", changed.body);
    assert_eq!(
        (&changed.body["subscription"]["events"], &changed.body["subscription"]["active"]),
        (&json!(["job.*"]), &json!(false))
    );
    assert_ne!(changed.body["subscription"]["updated_at"], created.body["subscription"]["updated_at"]);
    let strict = server.patch(&format!("/svc/v1/webhooks/{id}"), json!({"id": "sub_other"}));
    assert_eq!((strict.status, strict.body["error"]["details"]["reason"].as_str()), (400, Some("unknown_field")));

    let deleted = server.delete(&format!("/svc/v1/webhooks/subscriptions/{second}"));
    assert_eq!(deleted.body, json!({"deleted": true, "id": second}));
    assert_eq!(server.get(&format!("/svc/v1/webhooks/{second}")).status, 404);
    assert_eq!(server.delete(&format!("/svc/v1/webhooks/{second}")).status, 404);
    assert_eq!(server.get("/svc/v1/webhooks/not-an-id").status, 404);
    assert_eq!(server.get("/svc/v1/webhooks/sub_019539a4-0000-7000-8000-000000000000").status, 404);
}

#[test]
fn bad_subscriptions_get_their_reasons_and_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    check_bad_subscriptions_get_their_reasons_and_store_nothing(&TestServer::start(dir.path()));
}

#[test]
fn on_postgres_bad_subscriptions_get_their_reasons_and_store_nothing() {
    check_bad_subscriptions_get_their_reasons_and_store_nothing(&PostgresNode::start("webhooks"));
}

fn check_bad_subscriptions_get_their_reasons_and_store_nothing(server: &TestServer) {
    for (change, field, reason) in [
        (json!({"url": "http://hooks.example.com/x"}), "url", "https_required"),
        (json!({"url": "hooks.example.com"}), "url", "invalid_url"),
        (json!({"url": "https://10.0.0.5/x"}), "url", "forbidden_address"),
        (json!({"url": "https://[::ffff:127.0.0.1]/x"}), "url", "forbidden_address"),
        (json!({"url": "https://169.254.169.254/latest/meta-data"}), "url", "forbidden_address"),
        (json!({"url": "https://localhost/x"}), "url", "forbidden_address"),
        (json!({"events": []}), "events", "too_many"),
        (json!({"events": ["job completed"]}), "events[0]", "invalid_pattern"),
        (json!({"secret": "too-short"}), "secret", "invalid_secret"),
        (json!({"filter": {"queues": "mail"}}), "filter.queues", "invalid_filter"),
    ] {
        let mut body = subscription();
        for (key, value) in change.as_object().unwrap() {
            body[key] = value.clone();
        }
        let refused = server.post("/svc/v1/webhooks", body);
        assert_eq!((refused.status, refused.error_code()), (400, "invalid_request"), "{change}");
        let details = &refused.body["error"]["details"];
        assert_eq!((details["field"].as_str(), details["reason"].as_str()), (Some(field), Some(reason)), "{change}");
    }
    let huge = json!({"url": "https://h.example/x", "events": ["*"], "secret": SECRET, "metadata": {"x": "y".repeat(17 * 1024)}});
    assert_eq!(server.post("/svc/v1/webhooks", huge).status, 413);
    assert_eq!(server.get("/svc/v1/webhooks").body["subscriptions"], json!([]));
}

#[test]
fn secrets_go_in_and_never_come_out() {
    let dir = tempfile::tempdir().unwrap();
    check_secrets_go_in_and_never_come_out(&TestServer::start(dir.path()));
}

#[test]
fn on_postgres_secrets_go_in_and_never_come_out() {
    check_secrets_go_in_and_never_come_out(&PostgresNode::start("webhooks"));
}

fn check_secrets_go_in_and_never_come_out(server: &TestServer) {
    let created = server.post("/svc/v1/webhooks", subscription());
    let id = created.body["subscription"]["id"].as_str().unwrap().to_string();
    let rotated = server.post(&format!("/svc/v1/webhooks/{id}/secrets"), json!({"secret": "next-secret-0123456789"}));
    let answers = [
        created.body,
        server.get(&format!("/svc/v1/webhooks/{id}")).body,
        server.get("/svc/v1/webhooks").body,
        rotated.body,
        server.patch(&format!("/svc/v1/webhooks/{id}"), json!({"secret": "x"})).body,
    ];
    for answer in answers {
        let text = answer.to_string();
        assert!(!text.contains(SECRET) && !text.contains("next-secret"), "{text}");
        assert!(answer["subscription"].get("secret").is_none());
    }
}

#[test]
fn a_rotation_holds_both_secrets_until_dropped_or_its_grace_runs_out() {
    let dir = tempfile::tempdir().unwrap();
    let start_ms = 1_800_000_000_000;
    let clock = ManualClock::new(start_ms);
    let server = start(dir.path(), &clock);
    let id = server.post("/svc/v1/webhooks", subscription()).body["subscription"]["id"].as_str().unwrap().to_string();

    let dropped_nothing = server.delete(&format!("/svc/v1/webhooks/{id}/secrets/previous"));
    assert_eq!((dropped_nothing.status, dropped_nothing.error_code()), (409, "conflict"));

    let rotated = server.post(&format!("/svc/v1/webhooks/{id}/rotate-secret"), json!({"secret": "second-secret-0123"}));
    assert_eq!(rotated.status, 200, "{}", rotated.body);
    let rotation = &rotated.body["subscription"]["secret_rotation"];
    assert_eq!(rotation["started_at"], "2027-01-15T08:00:00Z");
    assert_eq!(rotation["previous_expires_at"], "2027-01-16T08:00:00Z", "24 hours of grace");
    let again =
        server.patch(&format!("/svc/v1/webhooks/{id}"), json!({"secret": "third-secret-01234", "active": false}));
    assert_eq!((again.status, again.body["error"]["details"]["reason"].as_str()), (409, Some("rotation_in_progress")));
    assert_eq!(server.get(&format!("/svc/v1/webhooks/{id}")).body["subscription"]["active"], true, "nothing changed");

    let ended = server.delete(&format!("/svc/v1/webhooks/subscriptions/{id}/secrets/previous"));
    assert_eq!(ended.status, 200);
    assert!(ended.body["subscription"].get("secret_rotation").is_none());

    // A rotation that is not ended by hand ends when its grace runs out.
    let rotated = server.patch(&format!("/svc/v1/webhooks/{id}"), json!({"secret": "third-secret-01234"}));
    assert!(rotated.body["subscription"]["secret_rotation"].is_object());
    server.advance(&clock, 24 * 3_600_000);
    let expired = server.get(&format!("/svc/v1/webhooks/{id}"));
    assert!(expired.body["subscription"].get("secret_rotation").is_none(), "{}", expired.body);
    assert_eq!(
        server.post(&format!("/svc/v1/webhooks/{id}/secrets"), json!({"secret": "fourth-secret-0123"})).status,
        200
    );
}

#[test]
fn subscriptions_and_rotations_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_800_000_000_000);
    let server = start(dir.path(), &clock);
    let kept = server.post("/svc/v1/webhooks", subscription()).body["subscription"]["id"].as_str().unwrap().to_string();
    let gone = server.post("/svc/v1/webhooks", subscription()).body["subscription"]["id"].as_str().unwrap().to_string();
    server.post(&format!("/svc/v1/webhooks/{kept}/secrets"), json!({"secret": "second-secret-0123"}));
    server.delete(&format!("/svc/v1/webhooks/{gone}"));
    let before = server.get(&format!("/svc/v1/webhooks/{kept}")).body;
    server.stop();

    let server = start(dir.path(), &clock);
    assert_eq!(server.get(&format!("/svc/v1/webhooks/{kept}")).body, before);
    assert_eq!(server.get(&format!("/svc/v1/webhooks/{gone}")).status, 404);
    assert_eq!(server.get("/svc/v1/webhooks").body["subscriptions"].as_array().unwrap().len(), 1);
    // Ids keep increasing past the ones stored.
    let newer =
        server.post("/svc/v1/webhooks", subscription()).body["subscription"]["id"].as_str().unwrap().to_string();
    assert!(newer > kept);
}

#[test]
fn the_number_of_subscriptions_and_the_rotation_grace_follow_the_settings() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_for(dir.path());
    config.webhook_limits.max_webhooks = 1;
    config.webhook_limits.rotation_grace_ms = 3_600_000;
    let clock = ManualClock::new(1_800_000_000_000);
    let mut engine = engine_config(&config);
    engine.clock = Arc::new(clock.clone());
    let server = TestServer::start_with(&config, engine);
    let id = server.post("/svc/v1/webhooks", subscription()).body["subscription"]["id"].as_str().unwrap().to_string();
    let second = server.post("/svc/v1/webhooks", subscription());
    assert_eq!((second.status, second.body["error"]["details"]["reason"].as_str()), (409, Some("limit")));
    let rotated = server.post(&format!("/svc/v1/webhooks/{id}/secrets"), json!({"secret": "second-secret-0123"}));
    assert_eq!(rotated.body["subscription"]["secret_rotation"]["previous_expires_at"], "2027-01-15T09:00:00Z");
}

#[test]
fn private_targets_are_allowed_only_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_for(dir.path());
    config.webhooks_allow_private_targets = true;
    let server = TestServer::start_with(&config, engine_config(&config));
    let local = json!({"url": "https://127.0.0.1:8443/hook", "events": ["*"], "secret": SECRET});
    assert_eq!(server.post("/svc/v1/webhooks", local).status, 201);
    let metadata = json!({"url": "https://169.254.169.254/x", "events": ["*"], "secret": SECRET});
    assert_eq!(server.post("/svc/v1/webhooks", metadata).status, 400, "never, whatever the setting");
}
