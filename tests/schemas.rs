//! The schema registry end to end: registration and its errors, jobs checked
//! against their schema (single, batch, workflow, cron), `$ref` between
//! registered schemas, and durability across a restart.

mod common;

use common::{TestServer, config_for};
use serde_json::{Value, json};
use std::sync::Arc;
use svc::__private::server::engine_config;
use svc::clock::ManualClock;

const EMAIL: &str = "urn:svc:email.send:v1";

fn email_schema() -> Value {
    json!({"uri": EMAIL, "type": "email.send", "version": 1, "schema": {
        "type": "array", "minItems": 1,
        "prefixItems": [{"type": "object", "required": ["to"],
                         "properties": {"to": {"type": "string"}, "cc": {"type": "array", "items": {"type": "string"}}}}]
    }})
}

fn encoded(uri: &str) -> String {
    uri.replace(':', "%3A").replace('/', "%2F")
}

#[test]
fn register_read_list_delete_and_the_errors_of_each() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());

    let created = server.post("/svc/v1/schemas", email_schema());
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.header("location"), Some("/svc/v1/schemas/urn%3Asvc%3Aemail.send%3Av1"));
    assert_eq!(created.body["schema"]["uri"], EMAIL);
    assert_eq!(created.body["schema"]["version"], 1);
    assert!(created.body["schema"].get("schema").is_none(), "the answer leaves the document out");

    let read = server.get(&format!("/svc/v1/schemas/{}", encoded(EMAIL)));
    assert_eq!(read.status, 200);
    assert_eq!(read.body["schema"]["type"], "email.send");
    assert_eq!(read.body["schema"]["schema"]["prefixItems"][0]["required"], json!(["to"]));
    assert_eq!(server.get(&format!("/svc/v1/schemas/{EMAIL}")).status, 200, "unencoded works too");

    let again = server.post("/svc/v1/schemas", json!({"uri": EMAIL, "schema": {}}));
    assert_eq!((again.status, again.error_code()), (409, "duplicate"), "schemas never change");

    for (body, field) in [
        (json!({"schema": {}}), "uri"),
        (json!({"uri": "relative", "schema": {}}), "uri"),
        (json!({"uri": "urn:x#frag", "schema": {}}), "uri"),
        (json!({"uri": "urn:x"}), "schema"),
        (json!({"uri": "urn:x", "schema": 5}), "schema"),
        (json!({"uri": "urn:x", "schema": {"type": "no-such-type"}}), "schema"),
        (json!({"uri": "urn:x", "schema": {"$schema": "http://json-schema.org/draft-07/schema#"}}), "schema"),
        (json!({"uri": "urn:x", "schema": {"$ref": "urn:not-registered"}}), "schema"),
        (json!({"uri": "urn:x", "schema": {}, "version": -1}), "version"),
    ] {
        let refused = server.post("/svc/v1/schemas", body.clone());
        assert_eq!((refused.status, refused.error_code()), (400, "invalid_request"), "{body}");
        assert_eq!(refused.body["error"]["details"]["field"], field, "{body}");
    }
    let huge = json!({"uri": "urn:huge", "schema": {"description": "x".repeat(300 * 1024)}});
    assert_eq!(server.post("/svc/v1/schemas", huge).status, 413);

    for n in 0..3 {
        assert_eq!(server.post("/svc/v1/schemas", json!({"uri": format!("urn:page:{n}"), "schema": true})).status, 201);
    }
    let first = server.get("/svc/v1/schemas?limit=2");
    let uris: Vec<&str> =
        first.body["schemas"].as_array().unwrap().iter().map(|s| s["uri"].as_str().unwrap()).collect();
    assert_eq!(uris, ["urn:page:0", "urn:page:1"], "by URI");
    assert_eq!(first.body["has_more"], true);
    let cursor = first.body["cursor"].as_str().unwrap();
    let rest = server.get(&format!("/svc/v1/schemas?limit=2&cursor={cursor}"));
    assert_eq!(rest.body["schemas"][0]["uri"], "urn:page:2");
    assert_eq!(rest.body["schemas"][1]["uri"], EMAIL);
    assert_eq!(rest.body["has_more"], false);

    let deleted = server.delete(&format!("/svc/v1/schemas/{}", encoded(EMAIL)));
    assert_eq!(deleted.status, 200);
    assert_eq!(deleted.body, json!({"deleted": true, "uri": EMAIL}));
    assert_eq!(server.get(&format!("/svc/v1/schemas/{}", encoded(EMAIL))).status, 404);
    assert_eq!(server.delete(&format!("/svc/v1/schemas/{}", encoded(EMAIL))).status, 404);
    assert_eq!(server.get("/svc/v1/schemas/not-a-uri").status, 404);
}

#[test]
fn jobs_are_checked_against_their_schema_with_paths_never_values() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    assert_eq!(server.post("/svc/v1/schemas", email_schema()).status, 201);

    let ok = server.post("/svc/v1/jobs", json!({"type": "email.send", "args": [{"to": "a@b"}], "schema": EMAIL}));
    assert_eq!(ok.status, 201, "{}", ok.body);
    assert_eq!(ok.body["job"]["schema"], EMAIL, "the job keeps the schema it was checked against");

    let bad = server.post(
        "/svc/v1/jobs",
        json!({"type": "email.send", "args": [{"to": "secret-address-value", "cc": [1234567]}], "schema": EMAIL}),
    );
    assert_eq!((bad.status, bad.error_code()), (400, "schema_validation"), "{}", bad.body);
    let details = &bad.body["error"]["details"];
    assert_eq!(details["schema"], EMAIL);
    assert_eq!(details["validation_errors"][0]["path"], "args[0].cc[0]");
    assert_eq!(details["validation_errors"][0]["keyword"], "type");
    assert!(!bad.body.to_string().contains("1234567"), "no offending value: {}", bad.body);
    let missing = server.post("/svc/v1/jobs", json!({"type": "email.send", "args": [{}], "schema": EMAIL}));
    assert_eq!(missing.body["error"]["details"]["validation_errors"][0]["keyword"], "required");

    let unknown = server.post("/svc/v1/jobs", json!({"type": "t", "args": [], "schema": "urn:nobody"}));
    assert_eq!((unknown.status, unknown.error_code()), (400, "schema_validation"));
    assert_eq!(unknown.body["error"]["details"]["reason"], "schema_not_registered");
    let malformed = server.post("/svc/v1/jobs", json!({"type": "t", "args": [], "schema": "no scheme"}));
    assert_eq!((malformed.status, malformed.error_code()), (400, "invalid_payload"));

    // Schema checks come before the state of things: a paused queue is not reached.
    assert_eq!(server.post("/svc/v1/queues/default/pause", json!({})).status, 200);
    let paused = server.post("/svc/v1/jobs", json!({"type": "email.send", "args": [1], "schema": EMAIL}));
    assert_eq!(paused.error_code(), "schema_validation");
}

#[test]
fn a_batch_with_one_bad_item_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    assert_eq!(server.post("/svc/v1/schemas", email_schema()).status, 201);
    let good = || json!({"type": "email.send", "args": [{"to": "a@b"}], "schema": EMAIL, "options": {"queue": "mail"}});
    let bad = json!({"type": "email.send", "args": [{"to": false}], "schema": EMAIL, "options": {"queue": "mail"}});
    let refused = server.post("/svc/v1/jobs/batch", json!({"jobs": [good(), good(), bad]}));
    assert_eq!((refused.status, refused.error_code()), (400, "schema_validation"), "{}", refused.body);
    assert_eq!(refused.body["error"]["details"]["index"], 2);
    assert!(server.fetch(&["mail"], 10).is_empty(), "nothing stored");
    assert_eq!(server.post("/svc/v1/jobs/batch", json!({"jobs": [good(), good()]})).status, 201);
    assert_eq!(server.fetch(&["mail"], 10).len(), 2);
}

#[test]
fn refs_resolve_to_registered_schemas_and_keep_their_meaning() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let address = json!({"uri": "https://schemas.example.com/address.json",
                         "schema": {"type": "object", "required": ["city"]}});
    assert_eq!(server.post("/svc/v1/schemas", address).status, 201);
    let order = json!({"uri": "urn:svc:order:v1", "schema": {
        "type": "array", "items": {"$ref": "https://schemas.example.com/address.json"}}});
    assert_eq!(server.post("/svc/v1/schemas", order).status, 201);

    let job = |args: Value| json!({"type": "order.ship", "args": args, "schema": "urn:svc:order:v1"});
    assert_eq!(server.post("/svc/v1/jobs", job(json!([{"city": "Oslo"}]))).status, 201);
    let bad = server.post("/svc/v1/jobs", job(json!([{"street": "x"}])));
    assert_eq!(bad.body["error"]["details"]["validation_errors"][0]["path"], "args[0]");

    // The referred schema goes; the one that refers to it keeps what it meant.
    let gone = server.delete(&format!("/svc/v1/schemas/{}", encoded("https://schemas.example.com/address.json")));
    assert_eq!(gone.status, 200);
    assert_eq!(server.post("/svc/v1/jobs", job(json!([{"street": "x"}]))).status, 400);
    assert_eq!(server.post("/svc/v1/jobs", job(json!([{"city": "Rome"}]))).status, 201);
}

#[test]
fn schemas_survive_a_restart_and_still_check_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    assert_eq!(server.post("/svc/v1/schemas", email_schema()).status, 201);
    assert_eq!(server.post("/svc/v1/schemas", json!({"uri": "urn:gone", "schema": true})).status, 201);
    assert_eq!(server.delete("/svc/v1/schemas/urn:gone").status, 200);
    let id = server.enqueue(json!({"type": "email.send", "args": [{"to": "a@b"}], "schema": EMAIL}));
    server.stop();

    let server = TestServer::start(dir.path());
    let listed = server.get("/svc/v1/schemas");
    assert_eq!(listed.body["schemas"].as_array().unwrap().len(), 1);
    assert_eq!(listed.body["schemas"][0]["uri"], EMAIL);
    assert_eq!(server.job(&id)["schema"], EMAIL);
    let bad = server.post("/svc/v1/jobs", json!({"type": "email.send", "args": [{"to": 1}], "schema": EMAIL}));
    assert_eq!(bad.error_code(), "schema_validation", "compiled again after the restart");
    assert_eq!(server.post("/svc/v1/jobs", json!({"type": "t", "args": [], "schema": "urn:gone"})).status, 400);
}

#[test]
fn workflows_and_cron_entries_are_checked_too() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_for(dir.path());
    // 2027-01-15T10:02:00Z.
    let start = 1_800_007_320_000;
    let clock = ManualClock::new(start);
    let mut engine = engine_config(&config);
    engine.clock = Arc::new(clock.clone());
    let server = TestServer::start_with(&config, engine);
    assert_eq!(server.post("/svc/v1/schemas", email_schema()).status, 201);

    let chain = json!({"type": "chain", "steps": [
        {"type": "email.send", "args": [{"to": "a@b"}], "schema": EMAIL},
        {"type": "email.send", "args": [{"to": 7}], "schema": EMAIL}]});
    let refused = server.post("/svc/v1/workflows", chain);
    assert_eq!((refused.status, refused.error_code()), (400, "schema_validation"), "{}", refused.body);
    assert_eq!(refused.body["error"]["details"]["index"], 1);

    let cron = |args: Value| {
        json!({"name": "mailer", "expression": "*/5 * * * *", "type": "email.send", "args": args, "schema": EMAIL,
               "queue": "mail"})
    };
    assert_eq!(server.post("/svc/v1/cron", cron(json!([{"to": 1}]))).error_code(), "schema_validation");
    assert_eq!(server.post("/svc/v1/cron", cron(json!([{"to": "ops@x"}]))).status, 201);
    clock.set_ms(start + 3 * 60_000);
    server.engine().tick().wait().unwrap();
    let fired = server.fetch(&["mail"], 1);
    assert_eq!(fired[0]["schema"], EMAIL);

    // The schema goes: the next firing creates nothing and says why.
    assert_eq!(server.delete(&format!("/svc/v1/schemas/{}", encoded(EMAIL))).status, 200);
    clock.set_ms(start + 8 * 60_000);
    server.engine().tick().wait().unwrap();
    assert!(server.fetch(&["mail"], 1).is_empty());
    let skipped = server.get("/svc/v1/events?types=cron.skipped");
    assert_eq!(skipped.body["events"][0]["data"]["reason"], "schema_not_registered", "{}", skipped.body);
}
