//! `svc serve --postgres` (SVC_POSTGRES_URL here): stateless nodes on one
//! PostgreSQL database, over HTTP. A job enqueued on one node is claimed and
//! acked on another; a node killed and started again has lost nothing,
//! since it keeps nothing of its own; cron entries and webhook
//! subscriptions made through one node are the other's too.

mod common;
#[path = "support/receiver.rs"]
mod receiver;

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

/// The threads of process `pid` named `name`, each with its nice value.
fn threads_named(pid: u32, name: &str) -> Vec<i64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    let mut nice = Vec::new();
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap();
        // The fields after the command's closing parenthesis; nice is the 19th field of the line.
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        nice.push(fields[16].parse().unwrap());
    }
    nice
}

#[test]
fn a_node_sends_deliveries_from_a_thread_of_its_own_at_webhooks_priority() {
    let postgres = TempPostgres::start();
    let url = postgres.database("priority");
    let (data, files) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let receiver = receiver::Receiver::start(files.path());
    let settings = files.path().join("svc.toml");
    let toml = format!(
        "[webhooks]\npriority = \"low\"\nallow_private_targets = true\nextra_ca_file = \"{}\"\n",
        receiver.ca_file.display()
    );
    std::fs::write(&settings, toml).unwrap();
    let settings = settings.display().to_string();
    let (node, base) =
        spawn_server_with_env(data.path(), &[("SVC_POSTGRES_URL", url.as_str()), ("SVC_CONFIG", settings.as_str())]);

    let subscription = json!({"url": receiver.url("127.0.0.1"), "events": ["job.enqueued"],
        "secret": "a-secret-of-sixteen-or-more"});
    assert_eq!(post(&base, "/webhooks", subscription).0, 201);
    assert_eq!(post(&base, "/jobs", json!({"type": "t", "args": []})).0, 201);
    receiver.wait_for_arrivals("/hooks", 1);
    // One thread sends, at nice 10 (`low`), apart from the node's own.
    assert_eq!(threads_named(node.id(), "svc-webhooks"), [10]);
}
