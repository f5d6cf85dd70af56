//! `svc serve --postgres` (SVC_POSTGRES_URL here): stateless nodes on one
//! PostgreSQL database, over HTTP. A job enqueued on one node is claimed and
//! acked on another; a node killed and started again has lost nothing,
//! since it keeps nothing of its own; cron entries and webhook
//! subscriptions made through one node are the other's too.

mod common;

use common::postgres::TempPostgres;
use common::{http_client, spawn_server_with_env};
use serde_json::{Value, json};

const MEDIA: &str = "application/svc+json";

fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    let response = http_client()
        .post(format!("{base}/svc/v1{path}"))
        .header("content-type", MEDIA)
        .body(body.to_string())
        .send()
        .unwrap();
    (response.status().as_u16(), response.json().unwrap_or(Value::Null))
}

fn get(base: &str, path: &str) -> (u16, Value) {
    let response = http_client().get(format!("{base}/svc/v1{path}")).send().unwrap();
    (response.status().as_u16(), response.json().unwrap_or(Value::Null))
}

#[test]
fn nodes_on_one_database_serve_the_same_jobs() {
    let postgres = TempPostgres::start();
    let url = postgres.database("nodes");
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let env = [("SVC_POSTGRES_URL", url.as_str())];
    let (node_a, a) = spawn_server_with_env(dir_a.path(), &env);
    let (_node_b, b) = spawn_server_with_env(dir_b.path(), &env);

    let (status, body) = post(&a, "/jobs", json!({"type": "email.send", "args": ["ada"], "options": {"queue": "pg"}}));
    assert_eq!(status, 201, "{body}");
    let id = body["job"]["id"].as_str().unwrap().to_string();
    let (status, body) = post(&b, "/workers/fetch", json!({"queues": ["pg"], "worker_id": "w1"}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["jobs"][0]["id"], id.as_str());
    assert_eq!(body["jobs"][0]["state"], "active");
    let (status, body) = post(&b, "/workers/ack", json!({"job_id": id, "result": {"sent": true}}));
    assert_eq!((status, body["state"].as_str()), (200, Some("completed")), "{body}");
    let (status, body) = get(&a, &format!("/jobs/{id}"));
    assert_eq!(status, 200);
    assert_eq!((body["job"]["state"].as_str(), &body["job"]["result"]), (Some("completed"), &json!({"sent": true})));

    // Killed and started again, the node has lost nothing: it kept nothing.
    drop(node_a);
    let (_node_a, a) = spawn_server_with_env(dir_a.path(), &env);
    assert_eq!(get(&a, &format!("/jobs/{id}")).1["job"]["state"], "completed");
    assert_eq!(std::fs::read_dir(dir_a.path()).unwrap().count(), 0, "nothing is written to the data dir");

    // A cron entry registered through one node is the other's too.
    let cron = json!({"name": "nightly", "expression": "0 3 * * *", "job_template": {"type": "t", "args": []}});
    let (status, body) = post(&a, "/cron", cron);
    assert_eq!(status, 201, "{body}");
    let (status, body) = get(&b, "/cron/nightly");
    assert_eq!((status, body["cron"]["expression"].as_str()), (200, Some("0 3 * * *")), "{body}");

    // So is a webhook subscription.
    let subscription = json!({"url": "https://hooks.example.com/svc", "events": ["job.*"],
        "secret": "a-secret-of-sixteen-or-more"});
    let (status, body) = post(&a, "/webhooks", subscription);
    assert_eq!(status, 201, "{body}");
    let (status, listed) = get(&b, "/webhooks");
    assert_eq!((status, &listed["subscriptions"][0]["id"]), (200, &body["subscription"]["id"]), "{listed}");
    assert_eq!(get(&a, "/health").0, 200);
}
