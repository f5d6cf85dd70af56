//! Staged jobs (docs/api.md, "Staged jobs"): `options.pending` stores a job
//! that no fetch hands out until `POST /svc/v1/jobs/{id}/activate`; what
//! activation answers in each state, and that both survive a restart. Also
//! through the embedding API.

mod common;

use common::TestServer;
use serde_json::json;
use svc::Svc;
use svc::clock::ManualClock;
use svc::job::{JobBuilder, JobState};

const START: i64 = 1_800_000_000_000;

#[test]
fn a_pending_job_waits_for_its_activation() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let server = TestServer::start_at(dir.path(), &clock);
    let created = server.post("/svc/v1/jobs", json!({"type": "t", "args": [], "options": {"pending": true}}));
    assert_eq!(created.status, 201, "{}", created.body);
    let id = created.body["job"]["id"].as_str().unwrap().to_string();
    assert_eq!(created.body["job"]["state"], "pending");
    assert!(created.body["job"].get("enqueued_at").is_none());
    assert!(server.fetch(&["default"], 10).is_empty(), "a pending job is not handed out");
    let stats = server.get("/svc/v1/queues/default/stats").body;
    assert_eq!((stats["states"]["pending"].as_u64(), stats["size"].as_u64()), (Some(1), Some(1)));
    server.stop();

    let server = TestServer::start_at(dir.path(), &clock);
    server.advance(&clock, 5_000);
    let activated = server.post_raw(&format!("/svc/v1/jobs/{id}/activate"), "", None);
    assert_eq!(activated.status, 200, "{}", activated.body);
    let job = &activated.body["job"];
    assert_eq!(job["state"], "available");
    assert_eq!(job["activated_at"], job["enqueued_at"]);
    assert_eq!(job["activated_at"], "2027-01-15T08:00:05Z");
    let again = server.post(&format!("/svc/v1/jobs/{id}/activate"), json!({}));
    assert_eq!((again.status, again.error_code()), (409, "conflict"));
    assert_eq!(
        (again.body["error"]["details"]["reason"].as_str(), again.body["error"]["details"]["current_state"].as_str()),
        (Some("not_pending"), Some("available"))
    );
    server.stop();

    let server = TestServer::start_at(dir.path(), &clock);
    assert_eq!(server.job(&id)["activated_at"], "2027-01-15T08:00:05Z", "activation is durable");
    assert_eq!(server.fetch(&["default"], 10)[0]["id"], id.as_str());
}

#[test]
fn activation_respects_the_scheduled_time_and_a_paused_queue() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let server = TestServer::start_at(dir.path(), &clock);
    let later = server.enqueue(
        json!({"type": "t", "args": [], "options": {"queue": "mail", "pending": true, "delay_until": "+PT1M"}}),
    );
    let now = server.enqueue(json!({"type": "t", "args": [], "options": {"queue": "mail", "pending": true}}));
    assert_eq!(server.job(&later)["state"], "pending", "staged before scheduled");

    assert_eq!(server.post("/svc/v1/queues/mail/pause", json!({})).status, 200);
    let activated = server.post_raw(&format!("/svc/v1/jobs/{now}/activate"), "", None);
    assert_eq!(
        (activated.status, activated.body["job"]["state"].as_str()),
        (200, Some("available")),
        "paused queues take activations"
    );
    assert_eq!(server.post("/svc/v1/queues/mail/resume", json!({})).status, 200);

    let scheduled = server.post_raw(&format!("/svc/v1/jobs/{later}/activate"), "", None);
    assert_eq!(scheduled.body["job"]["state"], "scheduled");
    assert!(scheduled.body["job"].get("enqueued_at").is_none());
    assert_eq!(server.fetch(&["mail"], 10).len(), 1);
    server.advance(&clock, 60_000);
    assert_eq!(server.fetch(&["mail"], 10)[0]["id"], later.as_str());
}

#[test]
fn activate_answers_404_409_and_400_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START - START % 60_000);
    let server = TestServer::start_at(dir.path(), &clock);
    let missing = server.post_raw("/svc/v1/jobs/019539a4-0000-7000-8000-000000000000/activate", "", None);
    assert_eq!((missing.status, missing.error_code()), (404, "not_found"));
    assert_eq!(server.post_raw("/svc/v1/jobs/nonsense/activate", "", None).status, 404);
    let id = server.enqueue(json!({"type": "t", "args": [], "options": {"pending": true}}));
    let bad_body = server.post_raw(&format!("/svc/v1/jobs/{id}/activate"), "[1]", Some("application/svc+json"));
    assert_eq!(bad_body.status, 400, "{}", bad_body.body);
    assert_eq!(server.job(&id)["state"], "pending", "a refused activation changes nothing");

    // A cron run waiting behind the previous one belongs to the cron entry.
    let register = server.post(
        "/svc/v1/cron",
        json!({"name": "every-minute", "schedule": "* * * * *", "type": "t", "args": [], "overlap_policy": "enqueue",
               "options": {"queue": "cron"}}),
    );
    assert_eq!(register.status, 201, "{}", register.body);
    server.advance(&clock, 60_000);
    server.fetch(&["cron"], 1);
    server.advance(&clock, 60_000);
    let waiting = server.get("/svc/v1/cron/every-minute").body["cron"]["last_job_id"].as_str().unwrap().to_string();
    assert_eq!(server.job(&waiting)["state"], "pending");
    let owned = server.post_raw(&format!("/svc/v1/jobs/{waiting}/activate"), "", None);
    assert_eq!((owned.status, owned.body["error"]["details"]["reason"].as_str()), (409, Some("owned")));
    let cron_job_option = server.post(
        "/svc/v1/cron",
        json!({"name": "x", "schedule": "* * * * *", "type": "t",
        "args": [], "options": {"pending": true}}),
    );
    assert_eq!(cron_job_option.status, 400, "a cron entry cannot stage its jobs: {}", cron_job_option.body);
}

#[test]
fn a_pending_job_expires_like_any_waiting_job() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let server = TestServer::start_at(dir.path(), &clock);
    let id = server.enqueue(json!({"type": "t", "args": [], "options": {"pending": true, "expires_at": "+PT10S"}}));
    server.advance(&clock, 10_000);
    let job = server.job(&id);
    assert_eq!((job["state"].as_str(), job["error"]["code"].as_str()), (Some("discarded"), Some("expired")));
}

#[test]
fn embedded_programs_stage_and_activate() {
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    let staged = svc.enqueue(JobBuilder::new("report.build").args([1]).pending()).unwrap();
    assert_eq!(staged.job.state, JobState::Pending);
    assert!(svc.fetch(&["default"], 1, None).unwrap().is_empty());
    let active = svc.activate(staged.job.id).unwrap();
    assert_eq!((active.state, active.activated_at().is_some()), (JobState::Available, true));
    assert!(matches!(
        svc.activate(staged.job.id),
        Err(svc::SvcError::Engine(svc::engine::EngineError::Conflict {
            reason: svc::engine::ConflictReason::NotPending,
            ..
        }))
    ));
    assert_eq!(svc.fetch(&["default"], 1, None).unwrap()[0].id, staged.job.id);
    svc.close();
}
