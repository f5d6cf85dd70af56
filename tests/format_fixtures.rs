//! The on-disk format is a contract: a data dir written by an earlier build
//! must keep opening with the same jobs in the same states. Each fixture is
//! a snapshot plus a log tail: `format-v1` from before jobs had extras
//! (snapshot payload version 3 and earlier, `EnqueueV1` records), and
//! `extras-v4` with unique, rate-limited, staged and activated jobs (payload
//! version 4, `Enqueue` and `Activate` records), and `schemas-v5` with the
//! schema registry and a webhook subscription in rotation (payload version
//! 5, `SchemaPut`, `SchemaDelete` and `WebhookPut` records) and jobs that
//! name a schema, and `chunked-v6` with a snapshot whose jobs are in
//! chunks (payload version 6), more than one of them, and `queue-config-v7`
//! with queues' backpressure (payload version 7, `QueueConfig` records), and
//! `logged-v2`, a log alone in the second record format (`Logged` records of
//! jobs, queues, progress and workflows). The fixtures are made by the
//! ignored tests below; regenerate one only together with a format change,
//! and keep the old one.

use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use svc::clock::ManualClock;
use svc::engine::{Engine, EngineConfig, Entropy, FetchRequest};
use svc::job::{FailureReport, JobDefaults, JobId, JobProgress, JobState, parse_enqueue_body};

const START: i64 = 1_800_000_000_000;

struct CountingEntropy(u128);

impl Entropy for CountingEntropy {
    fn next_u128(&mut self) -> u128 {
        self.0 += 1;
        self.0 << 40
    }

    fn next_unit(&mut self) -> f64 {
        0.5
    }
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-v1")
}

fn extras_fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/extras-v4")
}

fn config(dir: &Path) -> EngineConfig {
    let mut config = EngineConfig::new(dir);
    config.clock = Arc::new(ManualClock::new(START));
    config.wiring.entropy = Box::new(CountingEntropy(0));
    config.segment_bytes = 4096;
    config.wiring.check_invariants = true;
    config
}

fn enqueue(engine: &Engine, body: impl ToString) -> JobId {
    let job = parse_enqueue_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap();
    engine.handle().enqueue(vec![job]).wait().unwrap()[0].job.id
}

fn fetch(engine: &Engine, count: usize) -> Vec<JobId> {
    let request =
        FetchRequest { queues: vec!["mail".into()], count, worker_id: Some("w-1".into()), visibility_timeout_ms: None };
    engine.handle().fetch(request).wait().unwrap().iter().map(|job| job.id).collect()
}

#[test]
#[ignore = "writes the committed fixture; run only when introducing a format version"]
fn write_format_v1_fixture() {
    let dir = fixture_dir();
    let _ = std::fs::remove_dir_all(&dir);
    let engine = Engine::open(config(&dir)).unwrap();
    // Raw text, so the number `1.50` reaches the server as written.
    let first = enqueue(
        &engine,
        r#"{"type":"mail.send","args":["done"],"meta":{"k":1.50},"options":{"queue":"mail"},"x_extra":[1,{"b":2}]}"#,
    );
    let second = enqueue(
        &engine,
        json!({"type": "mail.send", "args": ["retrying"], "options": {"queue": "mail", "priority": 5, "retry": {"jitter": false}}}),
    );
    enqueue(
        &engine,
        json!({"type": "mail.send", "args": ["waiting"], "options": {"queue": "mail", "delay_until": "2099-12-31T23:59:59Z"}}),
    );
    assert_eq!(fetch(&engine, 2), [second, first]);
    engine.handle().ack(first, Some(r#"{"sent":true}"#.into()), None).wait().unwrap();
    engine.handle().fail(second, FailureReport::server("SmtpError", "421 try later"), false, None).wait().unwrap();
    engine.handle().snapshot().wait().unwrap();
    let cancelled = enqueue(
        &engine,
        json!({"type": "report.build", "args": ["cancelled"], "id": "019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f"}),
    );
    engine.handle().cancel(cancelled).wait().unwrap();
    enqueue(&engine, json!({"type": "report.build", "args": ["available"]}));
    engine.close_without_snapshot();
    let _ = std::fs::remove_file(dir.join("LOCK"));
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// `svc inspect` reads the data dir and decodes every snapshot in it.
fn assert_inspect_decodes(dir: &Path) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_svc")).arg("inspect").arg(dir).output().unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && !printed.contains("does not decode"), "{printed}");
}

#[test]
fn format_v1_data_dir_still_opens() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture_dir(), dir.path());
    let engine = Engine::open(config(dir.path())).unwrap();
    let image = engine.handle().image().wait().unwrap();
    let by_args =
        |args: &str| image.jobs.iter().find(|job| job.payload.args() == args).unwrap_or_else(|| panic!("job {args}"));
    assert_eq!(image.jobs.len(), 5);

    let done = by_args(r#"["done"]"#);
    assert_eq!(
        (done.state, done.run().result.as_deref(), done.attempt),
        (JobState::Completed, Some(r#"{"sent":true}"#), 1)
    );
    assert_eq!(done.payload.meta(), r#"{"k":1.50}"#);
    assert_eq!(done.payload.extra(), vec![("x_extra".to_string(), r#"[1,{"b":2}]"#.to_string())]);
    let retrying = by_args(r#"["retrying"]"#);
    assert_eq!(
        (retrying.state, retrying.priority, retrying.run().retry_at),
        (JobState::Retryable, 5, Some(START + 1000))
    );
    assert_eq!(retrying.run().error.as_ref().unwrap().message, "421 try later");
    assert_eq!(by_args(r#"["waiting"]"#).state, JobState::Scheduled);
    let cancelled = by_args(r#"["cancelled"]"#);
    assert_eq!(
        (cancelled.state, cancelled.id.to_string().as_str()),
        (JobState::Cancelled, "019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f")
    );
    assert_eq!(by_args(r#"["available"]"#).state, JobState::Available);
    engine.close();

    let output =
        std::process::Command::new(env!("CARGO_BIN_EXE_svc")).arg("inspect").arg(fixture_dir()).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));
}

fn workflow(engine: &Engine, body: serde_json::Value) -> svc::job::WorkflowId {
    let definition = svc::workflow::parse_workflow_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap();
    engine.handle().create_workflow(definition).wait().unwrap()
}

fn flow_fetch(engine: &Engine, queue: &str) -> JobId {
    let request = FetchRequest { queues: vec![queue.into()], count: 1, worker_id: None, visibility_timeout_ms: None };
    engine.handle().fetch(request).wait().unwrap()[0].id
}

fn enqueue_answer(engine: &Engine, body: impl ToString) -> Result<svc::engine::Enqueued, svc::engine::EngineError> {
    let job = parse_enqueue_body(body.to_string().as_bytes(), &JobDefaults::default()).unwrap();
    engine.handle().enqueue(vec![job]).wait().map(|mut answers| answers.remove(0))
}

#[test]
#[ignore = "writes the committed fixture; run only when introducing a format version"]
fn write_extras_v4_fixture() {
    let dir = extras_fixture_dir();
    let _ = std::fs::remove_dir_all(&dir);
    let engine = Engine::open(config(&dir)).unwrap();
    let limit = json!({"key": "reports", "max_per_second": 1});
    enqueue(
        &engine,
        json!({"type": "mail.send", "args": ["u1"], "options": {"queue": "mail", "unique": {"period": "P1D"}}}),
    );
    enqueue(
        &engine,
        json!({"type": "mail.send", "args": ["limited-1"], "options": {"queue": "mail", "rate_limit": limit}}),
    );
    enqueue(
        &engine,
        json!({"type": "mail.send", "args": ["limited-2"], "options": {"queue": "mail", "rate_limit": limit}}),
    );
    assert_eq!(fetch(&engine, 10).len(), 2, "the unique job and one limited job");
    let chain = workflow(
        &engine,
        json!({"name": "before", "type": "chain", "steps": [
        {"type": "step.one", "args": [1], "options": {"queue": "flow"}}, {"type": "step.two", "args": ["two"], "options": {"queue": "flow"}}]}),
    );
    let step_one = flow_fetch(&engine, "flow");
    engine.handle().ack(step_one, Some(r#"{"n":1}"#.into()), None).wait().unwrap();
    assert!(engine.handle().workflow(chain).is_some());
    engine.handle().snapshot().wait().unwrap();
    let batch = workflow(
        &engine,
        json!({"name": "after", "type": "batch", "jobs": [{"type": "part", "args": ["part"], "options": {"queue": "parts"}}],
        "callbacks": {"on_success": {"type": "done", "options": {"queue": "flow"}}}}),
    );
    assert!(engine.handle().workflow(batch).is_some());
    enqueue(
        &engine,
        json!({"type": "mail.send", "args": ["u2"], "options": {"queue": "mail", "unique": {"on_conflict": "replace"}}}),
    );
    let staged = enqueue(&engine, json!({"type": "report.build", "args": ["staged"], "options": {"pending": true}}));
    let activated =
        enqueue(&engine, json!({"type": "report.build", "args": ["activated"], "options": {"pending": true}}));
    engine.handle().activate(activated).wait().unwrap();
    assert_eq!(engine.handle().job(staged).unwrap().state, JobState::Pending);
    engine.close_without_snapshot();
    let _ = std::fs::remove_file(dir.join("LOCK"));
}

#[test]
fn extras_v4_data_dir_still_opens() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&extras_fixture_dir(), dir.path());
    let engine = Engine::open(config(dir.path())).unwrap();
    let image = engine.handle().image().wait().unwrap();
    let by_args =
        |args: &str| image.jobs.iter().find(|job| job.payload.args() == args).unwrap_or_else(|| panic!("job {args}"));
    assert_eq!(image.jobs.len(), 9);
    let unique = by_args(r#"["u1"]"#);
    let (policy, _) = unique.unique().expect("the policy is kept");
    assert_eq!((unique.state, policy.period_ms), (JobState::Active, Some(86_400_000)));
    assert_eq!(by_args(r#"["staged"]"#).state, JobState::Pending);
    let activated = by_args(r#"["activated"]"#);
    assert_eq!((activated.state, activated.activated_at()), (JobState::Available, Some(START)));
    assert_eq!(by_args(r#"["limited-2"]"#).dispatch_key(), Some("reports"));
    assert_eq!(image.dispatch_claims, [("reports".to_string(), vec![START])]);
    let names: Vec<Option<&str>> = image.workflows.iter().map(|workflow| workflow.name.as_deref()).collect();
    assert_eq!(names, [Some("before"), Some("after")]);
    let chain = &image.workflows[0];
    assert_eq!(chain.members[0].outcome.as_ref().and_then(|outcome| outcome.result.as_deref()), Some(r#"{"n":1}"#));
    let second_step = by_args(r#"["two"]"#);
    assert_eq!((second_step.state, second_step.workflow().map(|(id, _)| id)), (JobState::Available, Some(chain.id)));

    // The index and the window are rebuilt: a conflict is still found, and
    // the limited job waits for its second.
    let again = enqueue_answer(
        &engine,
        json!({"type": "mail.send", "args": ["u1"], "options": {"queue": "mail", "unique": {}}}),
    );
    assert!(matches!(again, Err(svc::engine::EngineError::UniqueConflict { existing, .. }) if existing == unique.id));
    assert!(fetch(&engine, 10).iter().all(|id| *id != by_args(r#"["limited-2"]"#).id));
    // The batch's callback was decided at creation and fires from the replayed state.
    let part = flow_fetch(&engine, "parts");
    assert_eq!(part, by_args(r#"["part"]"#).id);
    engine.handle().ack(part, None, None).wait().unwrap();
    let batch = engine.handle().workflow(image.workflows[1].id).unwrap();
    assert!(batch.callbacks[0].fired);
    engine.close();

    // Every snapshot in the fixture decodes as written (recovery could
    // otherwise fall back to an older one and hide a broken layout).
    assert_inspect_decodes(&extras_fixture_dir());
}

fn schemas_fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schemas-v5")
}

fn register(engine: &Engine, body: serde_json::Value) {
    let handle = engine.handle();
    let registration =
        svc::schema::parse_registration(body.to_string().as_bytes(), START, &|uri| handle.schema(uri)).unwrap();
    handle.register_schema(registration).wait().unwrap();
}

#[test]
#[ignore = "writes the committed fixture; run only when introducing a format version"]
fn write_schemas_v5_fixture() {
    let dir = schemas_fixture_dir();
    let _ = std::fs::remove_dir_all(&dir);
    let mut settings = config(&dir);
    // Deliveries are queued for a pool that never sends them.
    let (sink, _unsent) = tokio::sync::mpsc::unbounded_channel();
    settings.wiring.deliveries = Some(sink);
    let engine = Engine::open(settings).unwrap();
    register(&engine, json!({"uri": "urn:city", "schema": {"type": "object", "required": ["city"]}}));
    register(
        &engine,
        json!({"uri": "urn:ship:v1", "type": "ship", "version": "1", "schema": {"type": "array", "items": {"$ref": "urn:city"}}}),
    );
    enqueue(&engine, json!({"type": "ship", "args": [{"city": "Oslo"}], "schema": "urn:ship:v1"}));
    engine.handle().snapshot().wait().unwrap();
    engine.handle().delete_schema("urn:city".into()).wait().unwrap();
    register(&engine, json!({"uri": "urn:later", "schema": true}));
    let body = json!({"url": "https://hooks.example.com/svc", "events": ["job.*"], "secret": "fixture-secret-0123",
                      "filter": {"queues": ["mail"]}, "metadata": {"team": "ops"}});
    let new = svc::webhook::subscription::parse_subscription(body.to_string().as_bytes(), false).unwrap();
    let subscription = engine.handle().create_webhook(new).wait().unwrap();
    let change = svc::engine::WebhookChange::AddSecret("fixture-secret-next".into());
    engine.handle().change_webhook(subscription.id, change).wait().unwrap();
    enqueue(&engine, json!({"type": "mail.send", "args": ["delivered?"], "options": {"queue": "mail"}}));
    engine.handle().tick().wait().unwrap();
    enqueue(&engine, json!({"type": "ship", "args": [{"city": "Rome"}], "schema": "urn:ship:v1"}));
    engine.close_without_snapshot();
    let _ = std::fs::remove_file(dir.join("LOCK"));
}

#[test]
fn schemas_v5_data_dir_still_opens() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&schemas_fixture_dir(), dir.path());
    let engine = Engine::open(config(dir.path())).unwrap();
    let image = engine.handle().image().wait().unwrap();
    let uris: Vec<&str> = image.schemas.iter().map(|entry| entry.uri.as_str()).collect();
    assert_eq!(uris, ["urn:later", "urn:ship:v1"], "registered in the snapshot and the log, one deleted");
    assert_eq!(image.jobs.len(), 3);
    assert_eq!(image.jobs.iter().filter(|job| job.schema() == Some("urn:ship:v1")).count(), 2);
    // The schema still checks jobs, through the document it referred to.
    let ship = engine.handle().schema("urn:ship:v1").unwrap();
    assert!(ship.check_args(r#"[{"city":"Oslo"}]"#).is_ok());
    assert_eq!(ship.check_args(r#"[{"street":"x"}]"#).unwrap_err()[0].keyword, "required");
    let [subscription] = image.webhooks.as_slice() else { panic!("one subscription") };
    assert_eq!(
        (subscription.url.as_str(), subscription.secret.as_str()),
        ("https://hooks.example.com/svc", "fixture-secret-0123")
    );
    let rotation = subscription.rotation.as_ref().expect("the rotation is kept");
    assert_eq!((rotation.next_secret.as_str(), rotation.expires_at), ("fixture-secret-next", START + 24 * 3_600_000));
    assert!(subscription.takes("job.completed", Some("mail"), Some("ship")));
    let [delivery] = image.deliveries.as_slice() else { panic!("one queued delivery") };
    assert_eq!((delivery.subscription, delivery.event_type.as_str()), (subscription.id, "job.enqueued"));
    assert_eq!(delivery.attempts, 1, "its attempt started before the fixture was closed");
    let body: serde_json::Value = serde_json::from_str(&delivery.body).unwrap();
    assert_eq!(body["data"]["queue"], "mail");
    engine.close();
    assert_inspect_decodes(&schemas_fixture_dir());
}

#[test]
fn a_clean_stop_rewrites_a_snapshot_of_an_older_layout_even_with_nothing_changed() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&schemas_fixture_dir(), dir.path());
    // Without the log after the snapshot, nothing is replayed: the state is
    // the snapshot's, in payload version 5.
    for (index, path) in svc::storage::list_segments(dir.path()).unwrap() {
        if index >= 1 {
            std::fs::remove_file(path).unwrap();
        }
    }
    let newest = |dir: &Path| svc::storage::list_snapshots(dir).unwrap().pop().unwrap();
    let (old_index, old_path) = newest(dir.path());
    assert_eq!(svc::storage::open_snapshot(&old_path).unwrap().payload_version, 5);
    let engine = Engine::open(config(dir.path())).unwrap();
    let image = engine.handle().image().wait().unwrap();
    engine.close();
    let (index, path) = newest(dir.path());
    assert!(index > old_index, "a snapshot in the current layout replaces it");
    assert_eq!(svc::storage::open_snapshot(&path).unwrap().payload_version, svc::engine::IMAGE_VERSION);
    let engine = Engine::open(config(dir.path())).unwrap();
    assert_eq!(engine.handle().image().wait().unwrap(), image);
    engine.close();
}

fn chunked_fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chunked-v6")
}

/// Jobs in the chunked fixture's snapshot besides the few named ones: more
/// than one chunk holds (4096).
const CHUNKED_FILLER_JOBS: usize = 4500;

#[test]
#[ignore = "writes the committed fixture; run only when introducing a format version"]
fn write_chunked_v6_fixture() {
    let dir = chunked_fixture_dir();
    let _ = std::fs::remove_dir_all(&dir);
    let engine = Engine::open(config(&dir)).unwrap();
    let handle = engine.handle();
    let filler = (0..CHUNKED_FILLER_JOBS)
        .map(|n| parse_enqueue_body(json!({"type": "t", "args": [n]}).to_string().as_bytes(), &JobDefaults::default()))
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    handle.enqueue(filler).wait().unwrap();
    enqueue(
        &engine,
        json!({"type": "mail.send", "args": ["doomed"], "options": {"queue": "mail", "retry": {"max_attempts": 1}}}),
    );
    enqueue(&engine, json!({"type": "mail.send", "args": ["active"], "options": {"queue": "mail"}}));
    let [doomed] = fetch(&engine, 1)[..] else { panic!("one job") };
    handle.fail(doomed, FailureReport::server("E_GONE", "mailbox gone"), false, None).wait().unwrap();
    fetch(&engine, 1);
    enqueue(
        &engine,
        json!({"type": "mail.send", "args": ["waiting"], "options": {"queue": "mail", "delay_until": "2099-12-31T23:59:59Z"}}),
    );
    handle.snapshot().wait().unwrap();
    enqueue(&engine, json!({"type": "mail.send", "args": ["after the snapshot"], "options": {"queue": "mail"}}));
    engine.close_without_snapshot();
    let _ = std::fs::remove_file(dir.join("LOCK"));
    // The log the snapshot covers is not needed (and would double the fixture).
    let (replay_from, _) = svc::storage::list_snapshots(&dir).unwrap()[0].clone();
    for (index, path) in svc::storage::list_segments(&dir).unwrap() {
        if index < replay_from {
            std::fs::remove_file(path).unwrap();
        }
    }
}

#[test]
fn chunked_v6_data_dir_still_opens() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&chunked_fixture_dir(), dir.path());
    let engine = Engine::open(config(dir.path())).unwrap();
    let image = engine.handle().image().wait().unwrap();
    assert_eq!(image.jobs.len(), CHUNKED_FILLER_JOBS + 4);
    let by_args =
        |args: &str| image.jobs.iter().find(|job| job.payload.args() == args).unwrap_or_else(|| panic!("job {args}"));
    let doomed = by_args(r#"["doomed"]"#);
    assert_eq!(doomed.state, JobState::Discarded);
    assert_eq!(doomed.run().error.as_ref().unwrap().message, "mailbox gone");
    let (listed, _) = engine.handle().dead_letter_page(None, 10, None);
    assert_eq!(listed.iter().map(|job| job.id).collect::<Vec<_>>(), [doomed.id], "the dead letter listing");
    let active = by_args(r#"["active"]"#);
    assert_eq!((active.state, active.run().worker_id.as_deref()), (JobState::Active, Some("w-1")));
    assert_eq!(by_args(r#"["waiting"]"#).state, JobState::Scheduled);
    assert_eq!(by_args(r#"["after the snapshot"]"#).state, JobState::Available);
    let filler = image.jobs.iter().filter(|job| job.payload.job_type() == "t" && job.state == JobState::Available);
    assert_eq!(filler.count(), CHUNKED_FILLER_JOBS);
    assert_eq!(by_args("[4499]").queue, "default");
    engine.close();
    assert_inspect_decodes(&chunked_fixture_dir());
}

fn queue_config_fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/queue-config-v7")
}

#[test]
#[ignore = "writes the committed fixture; run only when introducing a format version"]
fn write_queue_config_v7_fixture() {
    use svc::engine::{Backpressure, ConfigureQueue};
    let dir = queue_config_fixture_dir();
    let _ = std::fs::remove_dir_all(&dir);
    let engine = Engine::open(config(&dir)).unwrap();
    let handle = engine.handle();
    let backpressure = Some(Backpressure::reject_above(2).warning_at(0.5));
    handle.submit(ConfigureQueue { queue: "mail".into(), backpressure }).wait().unwrap();
    enqueue(&engine, json!({"type": "mail.send", "args": ["held"], "options": {"queue": "mail"}}));
    handle.snapshot().wait().unwrap();
    let backpressure = Some(Backpressure::reject_above(5));
    handle.submit(ConfigureQueue { queue: "sms".into(), backpressure }).wait().unwrap();
    engine.close_without_snapshot();
    let _ = std::fs::remove_file(dir.join("LOCK"));
}

#[test]
fn queue_config_v7_data_dir_still_opens() {
    use svc::engine::Backpressure;
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&queue_config_fixture_dir(), dir.path());
    let snapshots = svc::storage::list_snapshots(dir.path()).unwrap();
    assert_eq!(svc::storage::open_snapshot(&snapshots.last().unwrap().1).unwrap().payload_version, 7);
    let engine = Engine::open(config(dir.path())).unwrap();
    let queue = |name: &str| engine.handle().queue(name).unwrap_or_else(|| panic!("queue {name}"));
    // From the snapshot, and from the log after it.
    assert_eq!(queue("mail").backpressure, Some(Backpressure::reject_above(2).warning_at(0.5)));
    assert_eq!(queue("mail").depth(), 1);
    assert_eq!(queue("sms").backpressure, Some(Backpressure::reject_above(5)));
    let refused = enqueue_answer(&engine, json!({"type": "mail.send", "args": [], "options": {"queue": "mail"}}));
    assert!(refused.is_ok(), "one more fits");
    let refused = enqueue_answer(&engine, json!({"type": "mail.send", "args": [], "options": {"queue": "mail"}}));
    assert!(matches!(refused, Err(svc::engine::EngineError::QueueFull { bound: 2, .. })), "{refused:?}");
    engine.close();
    assert_inspect_decodes(&queue_config_fixture_dir());
}

fn logged_fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/logged-v2")
}

#[test]
#[ignore = "writes the committed fixture; run only when introducing a format version"]
fn write_logged_v2_fixture() {
    use svc::engine::{Backpressure, ConfigureQueue, PauseQueue, ReportProgress};
    let dir = logged_fixture_dir();
    let _ = std::fs::remove_dir_all(&dir);
    let engine = Engine::open(config(&dir)).unwrap();
    let handle = engine.handle();
    let backpressure = Some(Backpressure::reject_above(10));
    handle.submit(ConfigureQueue { queue: "mail".into(), backpressure }).wait().unwrap();
    handle.submit(PauseQueue { queue: "sms".into(), paused: true }).wait().unwrap();
    let [.., cancelled] = ["acked", "failed", "reporting", "cancelled"]
        .map(|args| enqueue(&engine, json!({"type": "mail.send", "args": [args], "options": {"queue": "mail"}})));
    let [acked, failed, reporting] = fetch(&engine, 3)[..] else { panic!("three claimed") };
    handle.ack(acked, Some(r#"{"sent":true}"#.into()), None).wait().unwrap();
    let report = FailureReport { message: "421 try later".into(), ..FailureReport::server("smtp", "") };
    handle.fail(failed, report, false, None).wait().unwrap();
    let progress = JobProgress::new(0.5).message("half");
    handle.submit(ReportProgress { id: reporting, progress, worker_id: Some("w-1".into()) }).wait().unwrap();
    handle.cancel(cancelled).wait().unwrap();
    workflow(
        &engine,
        json!({"name": "logged", "type": "chain", "steps": [
        {"type": "step.one", "args": [1], "options": {"queue": "flow"}}, {"type": "step.two", "args": ["two"], "options": {"queue": "flow"}}]}),
    );
    engine.close_without_snapshot();
    let _ = std::fs::remove_file(dir.join("LOCK"));
}

#[test]
fn logged_v2_data_dir_still_opens() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&logged_fixture_dir(), dir.path());
    // The log's frames are of the second record format: each sequence
    // begins with its mark (docs/wal-format.md, "Payload").
    let segment = std::fs::read(dir.path().join("segment-00000000000000000000.wal")).unwrap();
    assert_eq!(segment[8..12], 2u32.to_le_bytes(), "a segment of version 2");
    let first_payload = &segment[32 + 8..32 + 10];
    assert_eq!(first_payload, [0, svc::engine::record::RECORD_FORMAT]);

    let engine = Engine::open(config(dir.path())).unwrap();
    let image = engine.handle().image().wait().unwrap();
    let by_args =
        |args: &str| image.jobs.iter().find(|job| job.payload.args() == args).unwrap_or_else(|| panic!("job {args}"));
    assert_eq!(image.jobs.len(), 6);
    let acked = by_args(r#"["acked"]"#);
    assert_eq!((acked.state, acked.run().result.as_deref()), (JobState::Completed, Some(r#"{"sent":true}"#)));
    let failed = by_args(r#"["failed"]"#);
    assert_eq!(failed.state, JobState::Retryable);
    assert_eq!(failed.run().error.as_ref().unwrap().message, "421 try later");
    let reporting = by_args(r#"["reporting"]"#);
    let progress = reporting.progress().expect("the report is kept");
    assert_eq!(
        (reporting.state, progress.fraction, progress.message.as_deref()),
        (JobState::Active, 0.5, Some("half"))
    );
    assert_eq!(progress.updated_at, START);
    assert_eq!(by_args(r#"["cancelled"]"#).state, JobState::Cancelled);
    assert_eq!(by_args("[1]").state, JobState::Available);
    assert_eq!(by_args(r#"["two"]"#).state, JobState::Pending);
    assert_eq!(image.workflows.len(), 1);
    let queue = |name: &str| engine.handle().queue(name).unwrap_or_else(|| panic!("queue {name}"));
    assert_eq!(queue("mail").backpressure, Some(svc::engine::Backpressure::reject_above(10)));
    assert!(queue("sms").paused);
    engine.close();
    assert_inspect_decodes(&logged_fixture_dir());
}

#[test]
fn a_segment_of_the_older_version_is_left_as_it_is_and_the_next_one_started() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&queue_config_fixture_dir(), dir.path());
    let last = dir.path().join("segment-00000000000000000001.wal");
    let before = std::fs::read(&last).unwrap();
    assert_eq!(before[8..12], 1u32.to_le_bytes(), "the fixture's segments are of version 1");

    let engine = Engine::open(config(dir.path())).unwrap();
    let id = enqueue(&engine, json!({"type": "mail.send", "args": ["after"], "options": {"queue": "sms"}}));
    engine.close_without_snapshot();
    // Nothing of this build's records went into the older segment; they
    // are in the next one, of version 2, which records where it ended.
    assert_eq!(std::fs::read(&last).unwrap(), before);
    let next = std::fs::read(dir.path().join("segment-00000000000000000002.wal")).unwrap();
    assert_eq!(next[8..12], 2u32.to_le_bytes());

    let engine = Engine::open(config(dir.path())).unwrap();
    assert_eq!(engine.handle().job(id).unwrap().state, JobState::Available);
    let queue = engine.handle().queue("mail").unwrap();
    assert_eq!(queue.backpressure, Some(svc::engine::Backpressure::reject_above(2).warning_at(0.5)));
    engine.close();
}
