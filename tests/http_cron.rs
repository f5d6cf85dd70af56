//! The cron endpoints end to end: registration (201 + Location, upsert 200),
//! listing with cursor and filter, get, patch, delete, every error path, and a
//! firing that a worker then fetches.

mod common;

use common::{TestServer, config_for};
use serde_json::{Value, json};
use std::sync::Arc;
use svc::__private::server::engine_config;
use svc::clock::ManualClock;

/// 2027-01-15T10:02:00Z.
const START: i64 = 1_800_007_320_000;

fn nightly() -> Value {
    json!({"name": "nightly-cleanup", "type": "maintenance.cleanup", "args": [], "schedule": "0 2 * * *",
           "timezone": "Europe/Berlin", "queue": "maintenance", "description": "drop old rows"})
}

#[test]
fn register_get_list_patch_delete() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());

    let created = server.post("/svc/v1/cron", nightly());
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.header("location"), Some("/svc/v1/cron/nightly-cleanup"));
    let cron = &created.body["cron"];
    assert_eq!(cron["schedule"], "0 2 * * *");
    assert_eq!(cron["expression"], "0 2 * * *");
    assert_eq!(cron["timezone"], "Europe/Berlin");
    assert_eq!((cron["type"].as_str(), cron["queue"].as_str()), (Some("maintenance.cleanup"), Some("maintenance")));
    assert_eq!((cron["overlap_policy"].as_str(), cron["status"].as_str()), (Some("skip"), Some("active")));
    assert_eq!((cron["enabled"].as_bool(), cron["run_count"].as_u64()), (Some(true), Some(0)));
    assert_eq!(cron["description"], "drop old rows");
    let next = cron["next_run_at"].as_str().expect("next_run_at");
    assert!(
        next.ends_with(":00Z") && (next.contains("T01:00") || next.contains("T00:00")),
        "02:00 Berlin in UTC: {next}"
    );

    let fetched = server.get("/svc/v1/cron/nightly-cleanup");
    assert_eq!((fetched.status, &fetched.body["cron"]), (200, cron));

    // Same name again: an upsert that keeps created_at.
    let mut changed = nightly();
    changed["expression"] = json!("@hourly");
    changed.as_object_mut().unwrap().remove("schedule");
    let upserted = server.post("/svc/v1/cron", changed);
    assert_eq!(upserted.status, 200, "{}", upserted.body);
    assert_eq!(upserted.body["cron"]["schedule"], "@hourly");
    assert_eq!(upserted.body["cron"]["created_at"], cron["created_at"]);
    assert!(upserted.header("location").is_none());

    let patched = server.patch("/svc/v1/cron/nightly-cleanup", json!({"enabled": false, "description": null}));
    assert_eq!(patched.status, 200, "{}", patched.body);
    assert_eq!(
        (patched.body["cron"]["status"].as_str(), patched.body["cron"]["enabled"].as_bool()),
        (Some("disabled"), Some(false))
    );
    assert!(patched.body["cron"].get("next_run_at").is_none() && patched.body["cron"].get("description").is_none());

    for name in ["a-first", "b-second", "c-third"] {
        let body = json!({"name": name, "type": "t", "cron": "*/5 * * * *"});
        assert_eq!(server.post("/svc/v1/cron", body).status, 201);
    }
    let page = server.get("/svc/v1/cron?limit=2");
    let names: Vec<&str> = page.body["crons"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!((names, page.body["has_more"].as_bool()), (vec!["a-first", "b-second"], Some(true)));
    let cursor = page.body["cursor"].as_str().unwrap().to_string();
    let rest = server.get(&format!("/svc/v1/cron?limit=2&cursor={cursor}"));
    let names: Vec<&str> = rest.body["crons"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!((names, rest.body["has_more"].as_bool()), (vec!["c-third", "nightly-cleanup"], Some(false)));
    assert_eq!(rest.body["cursor"], Value::Null);
    let disabled = server.get("/svc/v1/cron?enabled=false");
    assert_eq!(disabled.body["crons"].as_array().unwrap().len(), 1);

    let deleted = server.delete("/svc/v1/cron/nightly-cleanup");
    assert_eq!((deleted.status, deleted.body["deleted"].as_bool()), (200, Some(true)));
    assert_eq!(deleted.body["cron"]["name"], "nightly-cleanup");
    assert_eq!(server.get("/svc/v1/cron/nightly-cleanup").status, 404);
    assert_eq!(server.delete("/svc/v1/cron/nightly-cleanup").error_code(), "not_found");
}

#[test]
fn invalid_registrations_get_400_naming_the_field_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path());
    let cases = [
        (json!({"type": "t", "schedule": "* * * * *"}), "invalid_request", "name"),
        (json!({"name": "a", "type": "t"}), "invalid_request", "schedule"),
        (json!({"name": "a", "type": "t", "schedule": "0 * * * * *"}), "invalid_request", "schedule"),
        (json!({"name": "a", "type": "t", "schedule": "61 * * * *"}), "invalid_request", "schedule"),
        (json!({"name": "a", "type": "t", "schedule": "* * L * *"}), "invalid_request", "schedule"),
        (json!({"name": "a", "type": "t", "schedule": "@every 5m"}), "invalid_request", "schedule"),
        (json!({"name": "a", "type": "t", "schedule": "* * * * *", "timezone": "PST"}), "invalid_request", "timezone"),
        (
            json!({"name": "a", "type": "t", "schedule": "* * * * *", "timezone": "Nowhere/City"}),
            "invalid_request",
            "timezone",
        ),
        (
            json!({"name": "a", "type": "t", "schedule": "* * * * *", "overlap_policy": "x"}),
            "invalid_request",
            "overlap_policy",
        ),
        (json!({"name": "a b", "type": "t", "schedule": "* * * * *"}), "invalid_request", "name"),
        (json!({"name": "a", "type": "9t", "schedule": "* * * * *"}), "invalid_payload", "type"),
        (json!({"name": "a", "type": "t", "args": "x", "schedule": "* * * * *"}), "invalid_payload", "args"),
        (
            json!({"name": "a", "type": "t", "schedule": "* * * * *", "options": {"expires_at": "+PT1H"}}),
            "invalid_payload",
            "options.expires_at",
        ),
    ];
    for (body, code, field) in cases {
        let answer = server.post("/svc/v1/cron", body.clone());
        assert_eq!(answer.status, 400, "{body}: {}", answer.body);
        assert_eq!(answer.error_code(), code, "{body}");
        assert_eq!(answer.body["error"]["details"]["field"], field, "{body}: {}", answer.body);
        assert!(!answer.body["error"]["message"].as_str().unwrap().is_empty());
    }
    let schedule_error = server.post("/svc/v1/cron", json!({"name": "a", "type": "t", "schedule": "61 * * * *"}));
    assert!(schedule_error.body["error"]["message"].as_str().unwrap().contains("61 is out of range 0-59"));
    assert_eq!(server.get("/svc/v1/cron").body["crons"], json!([]), "nothing was registered");

    assert_eq!(server.post("/svc/v1/cron", nightly()).status, 201);
    let patch = server.patch("/svc/v1/cron/nightly-cleanup", json!({"name": "renamed"}));
    assert_eq!((patch.status, patch.error_code()), (400, "invalid_request"));
    let patch = server.patch("/svc/v1/cron/nightly-cleanup", json!({"schedule": "nope"}));
    assert_eq!((patch.status, patch.body["error"]["details"]["field"].as_str()), (400, Some("schedule")));
    assert_eq!(server.get("/svc/v1/cron/nightly-cleanup").body["cron"]["schedule"], "0 2 * * *");
    assert_eq!(server.patch("/svc/v1/cron/unknown", json!({"enabled": false})).status, 404);
    assert_eq!(server.get("/svc/v1/cron?limit=0").status, 400);
    assert_eq!(server.get("/svc/v1/cron?enabled=maybe").status, 400);
    let wrong_method = server.post("/svc/v1/cron/nightly-cleanup", json!({}));
    assert_eq!((wrong_method.status, wrong_method.header("allow")), (405, Some("GET, PATCH, DELETE")));
}

#[test]
fn the_registry_limit_answers_409() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_for(dir.path());
    config.cron_entries_max = 2;
    let server = TestServer::start_with(&config, engine_config(&config));
    for name in ["one", "two"] {
        assert_eq!(server.post("/svc/v1/cron", json!({"name": name, "type": "t", "schedule": "@daily"})).status, 201);
    }
    let third = server.post("/svc/v1/cron", json!({"name": "three", "type": "t", "schedule": "@daily"}));
    assert_eq!((third.status, third.error_code()), (409, "conflict"));
    assert_eq!(third.body["error"]["details"]["reason"], "limit");
    let replace = server.post("/svc/v1/cron", json!({"name": "two", "type": "t", "schedule": "@hourly"}));
    assert_eq!(replace.status, 200, "replacing an entry needs no room");
}

#[test]
fn a_fired_job_reaches_a_worker_and_the_events() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_for(dir.path());
    let clock = ManualClock::new(START);
    let mut engine = engine_config(&config);
    engine.clock = Arc::new(clock.clone());
    let server = TestServer::start_with(&config, engine);
    let body = json!({"name": "tick", "expression": "*/5 * * * *",
                      "job_template": {"type": "cron.tick", "args": [{"n": 1}], "options": {"queue": "ticks"}}});
    let created = server.post("/svc/v1/cron", body);
    assert_eq!(created.body["cron"]["next_run_at"], "2027-01-15T10:05:00Z");
    assert_eq!(created.body["cron"]["queue"], "ticks");

    clock.set_ms(START + 3 * 60_000);
    server.engine().tick().wait().unwrap();
    let jobs = server.fetch(&["ticks"], 1);
    assert_eq!(jobs[0]["type"], "cron.tick");
    assert_eq!(jobs[0]["args"], json!([{"n": 1}]));
    assert_eq!(jobs[0]["meta"], json!({"cron_name": "tick", "cron_triggered_at": "2027-01-15T10:05:00Z"}));
    let cron = &server.get("/svc/v1/cron/tick").body["cron"];
    assert_eq!((cron["run_count"].as_u64(), cron["last_job_id"].as_str()), (Some(1), jobs[0]["id"].as_str()));
    assert_eq!(cron["last_run_at"], "2027-01-15T10:05:00Z");

    let events = server.get("/svc/v1/events?types=cron.*");
    let triggered = &events.body["events"][0];
    assert_eq!((triggered["type"].as_str(), triggered["subject"].as_str()), (Some("cron.triggered"), Some("tick")));
    assert_eq!(triggered["data"]["job_id"], jobs[0]["id"]);
    assert_eq!(triggered["data"]["scheduled_time"], "2027-01-15T10:05:00Z");
    assert_eq!(triggered["data"]["run_count"], 1);
}
