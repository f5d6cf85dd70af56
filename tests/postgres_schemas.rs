//! The schema registry on the PostgreSQL backend, against a real
//! PostgreSQL server of the test's own: registration and its errors over
//! HTTP, jobs checked against their schema (single and batch) on any node,
//! a schema deleted and registered again with another document on one node
//! then used on the other, and cron entries whose template names a schema.

mod common;

use std::sync::Arc;

use common::postgres::TempPostgres;
use common::{http_client, spawn_server_with_env};
use serde_json::{Value, json};
use svc::backend::EventFilter;
use svc::backend::postgres::{PgJobs, PgSettings, open};
use svc::cron::parse_cron_body;
use svc::engine::{CronWrite, EngineError, EventKind};
use svc::job::{JobDefaults, ValidationKind};

const MEDIA: &str = "application/svc+json";
const EMAIL: &str = "urn:svc:email.send:v1";

fn send(request: reqwest::blocking::RequestBuilder) -> (u16, Value) {
    let response = request.header("content-type", MEDIA).send().unwrap();
    (response.status().as_u16(), response.json().unwrap_or(Value::Null))
}

fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    send(http_client().post(format!("{base}/svc/v1{path}")).body(body.to_string()))
}

fn get(base: &str, path: &str) -> (u16, Value) {
    send(http_client().get(format!("{base}/svc/v1{path}")))
}

fn delete(base: &str, path: &str) -> (u16, Value) {
    send(http_client().delete(format!("{base}/svc/v1{path}")))
}

fn email_schema() -> Value {
    json!({"uri": EMAIL, "type": "email.send", "version": 1, "schema": {
        "type": "array", "minItems": 1,
        "prefixItems": [{"type": "object", "required": ["to"], "properties": {"to": {"type": "string"}}}]
    }})
}

fn email(to: Value) -> Value {
    json!({"type": "email.send", "args": [{"to": to}], "schema": EMAIL, "options": {"queue": "mail"}})
}

#[test]
fn schemas_are_registered_on_one_node_and_checked_on_every_node() {
    let postgres = TempPostgres::start();
    let url = postgres.database("schemas");
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let env = [("SVC_POSTGRES_URL", url.as_str())];
    let (_node_a, a) = spawn_server_with_env(dir_a.path(), &env);
    let (_node_b, b) = spawn_server_with_env(dir_b.path(), &env);

    // Registered, read back with its document, refused a second time.
    let (status, body) = post(&a, "/schemas", email_schema());
    assert_eq!(status, 201, "{body}");
    assert_eq!((body["schema"]["uri"].as_str(), &body["schema"]["version"]), (Some(EMAIL), &json!(1)));
    let (status, body) = get(&b, "/schemas/urn%3Asvc%3Aemail.send%3Av1");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["schema"]["schema"]["prefixItems"][0]["required"], json!(["to"]));
    let (status, body) = post(&b, "/schemas", json!({"uri": EMAIL, "schema": {}}));
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("duplicate")), "{body}");
    let (status, body) = post(&a, "/schemas", json!({"uri": "urn:x", "schema": {"$ref": "urn:not-registered"}}));
    assert_eq!((status, body["error"]["details"]["field"].as_str()), (400, Some("schema")), "{body}");

    // Jobs are checked on either node; a batch with one bad item stores nothing.
    let (status, body) = post(&b, "/jobs", email(json!("a@b")));
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["job"]["schema"], EMAIL);
    let (status, body) = post(&a, "/jobs", email(json!(7)));
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("schema_validation")), "{body}");
    assert_eq!(body["error"]["details"]["validation_errors"][0]["path"], "args[0].to");
    let (status, body) = post(&a, "/jobs/batch", json!({"jobs": [email(json!("x@y")), email(json!(false))]}));
    assert_eq!((status, &body["error"]["details"]["index"]), (400, &json!(1)), "{body}");
    let unknown = json!({"type": "t", "args": [], "schema": "urn:nobody"});
    let (status, body) = post(&b, "/jobs", unknown);
    assert_eq!((status, body["error"]["details"]["reason"].as_str()), (400, Some("schema_not_registered")));
    let (_, fetched) = post(&a, "/workers/fetch", json!({"queues": ["mail"], "count": 10}));
    assert_eq!(fetched["jobs"].as_array().unwrap().len(), 1, "only the good single job was stored");

    // Deleted on one node and registered again with another document: the
    // other node, which compiled the first, checks against the second.
    let (status, _) = delete(&a, "/schemas/urn%3Asvc%3Aemail.send%3Av1");
    assert_eq!(status, 200);
    let (status, body) = post(&b, "/jobs", email(json!("a@b")));
    assert_eq!((status, body["error"]["details"]["reason"].as_str()), (400, Some("schema_not_registered")));
    let numbers = json!({"uri": EMAIL, "schema": {"type": "array", "items": {"type": "object",
        "properties": {"to": {"type": "integer"}}}}});
    assert_eq!(post(&a, "/schemas", numbers).0, 201);
    assert_eq!(post(&b, "/jobs", email(json!(7))).0, 201, "the new document decides");
    assert_eq!(post(&b, "/jobs", email(json!("a@b"))).0, 400);

    // Listed by URI, a page at a time.
    for n in 0..2 {
        assert_eq!(post(&b, "/schemas", json!({"uri": format!("urn:page:{n}"), "schema": true})).0, 201);
    }
    let (_, first) = get(&a, "/schemas?limit=2");
    let uris: Vec<&str> = first["schemas"].as_array().unwrap().iter().map(|s| s["uri"].as_str().unwrap()).collect();
    assert_eq!((uris, &first["has_more"]), (vec!["urn:page:0", "urn:page:1"], &json!(true)));
    let (_, rest) = get(&a, &format!("/schemas?limit=2&cursor={}", first["cursor"].as_str().unwrap()));
    assert_eq!((&rest["schemas"][0]["uri"], &rest["has_more"]), (&json!(EMAIL), &json!(false)));
    assert_eq!(delete(&b, "/schemas/urn:page:9").0, 404);
}

/// 2027-01-15T08:00:00Z: a whole minute.
const NOW: i64 = 1_800_000_000_000;

async fn store(server: &TempPostgres, database: &str) -> Arc<PgJobs> {
    let pool = open(&PgSettings::new(server.database(database))).await.expect("the schema migrates");
    Arc::new(PgJobs::new(pool).with_max_schemas(2))
}

fn registration(body: Value) -> svc::schema::SchemaRegistration {
    svc::schema::parse_registration(body.to_string().as_bytes(), NOW, &|_| None).expect("a valid schema")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_templates_are_checked_and_a_missing_schema_skips_the_firing() {
    let server = TempPostgres::start();
    let jobs = store(&server, "cron").await;
    jobs.register_schema(NOW, registration(email_schema())).await.unwrap();
    let entry = |to: Value| {
        let body = json!({"name": "digest", "expression": "* * * * *", "type": "email.send", "args": [{"to": to}],
                          "schema": EMAIL, "queue": "mail"});
        parse_cron_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap()
    };
    let refused = jobs.cron_put(NOW, entry(json!(1)), CronWrite::Upsert).await.unwrap_err();
    match refused {
        EngineError::Invalid { error, .. } => assert_eq!(error.kind, ValidationKind::Schema),
        other => panic!("expected a schema validation error, got {other:?}"),
    }
    jobs.cron_put(NOW, entry(json!("a@b")), CronWrite::Upsert).await.unwrap();

    assert_eq!(jobs.fire_due_crons(NOW + 60_000, 10).await.unwrap(), 1);
    jobs.delete_schema(EMAIL).await.unwrap();
    assert_eq!(jobs.fire_due_crons(NOW + 120_000, 10).await.unwrap(), 1);
    let events = jobs.events_page(None, 100, &EventFilter::default()).await.unwrap().events;
    let triggered = events.iter().filter(|event| matches!(event.kind, EventKind::CronTriggered { .. })).count();
    let skipped: Vec<_> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::CronSkipped(skip) => Some(skip.reason),
            _ => None,
        })
        .collect();
    assert_eq!((triggered, skipped), (1, vec!["schema_not_registered"]), "the second firing made nothing");

    // The registry's cap (two here) holds.
    jobs.register_schema(NOW, registration(json!({"uri": "urn:a", "schema": true}))).await.unwrap();
    jobs.register_schema(NOW, registration(json!({"uri": "urn:b", "schema": true}))).await.unwrap();
    let full = jobs.register_schema(NOW, registration(json!({"uri": "urn:c", "schema": true}))).await;
    assert!(matches!(full, Err(EngineError::SchemaLimit { max_schemas: 2 })), "{full:?}");
}
