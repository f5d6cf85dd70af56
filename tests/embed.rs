//! The embedding API: the same engine called from a Rust program, no HTTP.

mod common;

use serde_json::{Value, json};
use svc::job::{Failure, JobBuilder, JobState, ValidationKind};
use svc::{Svc, SvcError};

/// The argument a call was refused for, as the HTTP API would name it.
fn refused_field(outcome: Result<impl std::fmt::Debug, SvcError>) -> (ValidationKind, String) {
    match outcome {
        Err(SvcError::Invalid(error)) => (error.kind, error.field.unwrap_or_default()),
        other => panic!("refused as invalid, got {other:?}"),
    }
}

#[test]
fn embedded_queue_round_trip_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    let job =
        svc.enqueue_json(r#"{"type":"email.send","args":["a@example.com"],"options":{"queue":"mail"}}"#).unwrap().job;
    let failing = svc
        .enqueue_json(
            r#"{"type":"email.send","args":["b@example.com"],"options":{"queue":"mail","retry":{"max_attempts":1}}}"#,
        )
        .unwrap()
        .job;
    let cancelled = svc.enqueue_json(r#"{"type":"email.send","args":[]}"#).unwrap().job;
    let claimed = svc.fetch(&["mail"], 2, Some("worker-1")).unwrap();
    assert_eq!(claimed.iter().map(|job| job.id).collect::<Vec<_>>(), [job.id, failing.id]);
    svc.ack_with(job.id, &serde_json::json!({"sent": true})).unwrap();
    assert_eq!(svc.nack(failing.id, Failure::new("SmtpError", "mailbox full")).unwrap().state, JobState::Discarded);
    assert_eq!(svc.cancel(cancelled.id).unwrap().previous_state, JobState::Available);
    assert!(svc.enqueue_json(r#"{"type":"bad type","args":[]}"#).is_err());
    svc.close();

    let svc = Svc::open(dir.path()).unwrap();
    let stored = svc.get(job.id).unwrap();
    assert_eq!((stored.state, stored.run().result.as_deref()), (JobState::Completed, Some(r#"{"sent":true}"#)));
    assert_eq!(svc.get(failing.id).unwrap().run().error.as_ref().unwrap().message, "mailbox full");
    assert_eq!(svc.get(cancelled.id).unwrap().state, JobState::Cancelled);
    assert!(svc.fetch(&["mail", "default"], 10, None).unwrap().is_empty());
    svc.close();
}

#[test]
fn an_embedded_queue_caps_its_finished_jobs_and_reports_a_full_disk() {
    let dir = tempfile::tempdir().unwrap();
    let disk = svc::storage::FaultyFileSystem::failing_after(i64::MAX);
    let mut config = svc::engine::EngineConfig::new(dir.path());
    config.retention.max_terminal_jobs = 2;
    config.file_system = std::sync::Arc::new(disk.clone());
    let svc = Svc::open_with(config).unwrap();
    let mut done = Vec::new();
    for n in 0..4 {
        let job = svc.enqueue_json(&format!(r#"{{"type":"t","args":[{n}]}}"#)).unwrap().job;
        svc.fetch(&["default"], 1, None).unwrap();
        svc.ack(job.id).unwrap();
        done.push(job.id);
    }
    assert!(svc.get(done[0]).is_none() && svc.get(done[1]).is_none(), "the oldest finished jobs are pruned");
    assert!(svc.get(done[2]).is_some() && svc.get(done[3]).is_some());

    let active = svc.enqueue_json(r#"{"type":"t","args":[]}"#).unwrap().job;
    svc.fetch(&["default"], 1, None).unwrap();
    disk.set_no_space(true);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let refused = loop {
        match svc.enqueue_json(r#"{"type":"t","args":[]}"#) {
            Err(error) => break error,
            Ok(_) => assert!(std::time::Instant::now() < deadline, "the full disk was noticed"),
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(
        matches!(
            refused,
            svc::SvcError::Engine(svc::engine::EngineError::Unavailable { reason: svc::engine::Unavailable::DiskFull })
        ),
        "{refused:?}"
    );
    assert!(svc.disk_full() && svc.failure().is_none());
    assert_eq!(svc.ack(active.id).unwrap().state, JobState::Completed, "accepted work still ends");
    svc.close();
}

#[test]
fn embedded_programs_use_unique_policies_and_dispatch_limits_through_typed_values() {
    use svc::job::{DispatchLimit, JobBuilder, OnConflict, UniquePolicy};
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    let per_user = UniquePolicy { key: Some(vec!["user".into()]), ..UniquePolicy::default() };
    let job = |user: &str, n: u32| JobBuilder::new("welcome.send").args([serde_json::json!({"user": user, "n": n})]);
    let first = svc.enqueue(job("ada", 1).unique(per_user.clone())).unwrap();
    assert!(!first.deduplicated && first.job.unique().is_some());
    match svc.enqueue(job("ada", 2).unique(per_user.clone())) {
        Err(svc::SvcError::Engine(svc::engine::EngineError::UniqueConflict { existing, .. })) => {
            assert_eq!(existing, first.job.id)
        }
        other => panic!("a second job for ada is refused, got {other:?}"),
    }
    let ignore = UniquePolicy { on_conflict: OnConflict::Ignore, ..per_user };
    let batch = svc.enqueue_batch([job("ada", 3).unique(ignore.clone()), job("bob", 1).unique(ignore)]).unwrap();
    assert_eq!((batch[0].job.id, batch[0].deduplicated, batch[1].deduplicated), (first.job.id, true, false));

    let one_at_a_time = DispatchLimit { key: Some("mailer".into()), concurrency: Some(1), rate: None };
    for n in 0..2 {
        svc.enqueue(JobBuilder::new("bulk.send").args([n]).queue("bulk").rate_limit(one_at_a_time.clone())).unwrap();
    }
    let claimed = svc.fetch(&["bulk"], 10, None).unwrap();
    assert_eq!(claimed.len(), 1, "one at a time under the key");
    svc.ack(claimed[0].id).unwrap();
    assert_eq!(svc.fetch(&["bulk"], 10, None).unwrap().len(), 1);
    let invalid = DispatchLimit { key: None, concurrency: Some(0), rate: None };
    assert!(matches!(svc.enqueue(JobBuilder::new("t").rate_limit(invalid)), Err(svc::SvcError::Invalid(_))));
    svc.close();
}

#[test]
fn embedded_programs_run_workflows_through_typed_builders() {
    use svc::engine::WorkflowState;
    use svc::job::JobBuilder;
    use svc::workflow::WorkflowBuilder;
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    let steps =
        [JobBuilder::new("user.create").args(["ada"]).queue("flow"), JobBuilder::new("email.welcome").queue("flow")];
    let chain = svc.create_workflow(WorkflowBuilder::chain(steps).name("onboarding")).unwrap();
    assert_eq!((chain.state, chain.members.len()), (WorkflowState::Running, 2));
    let first = svc.fetch(&["flow"], 10, None).unwrap();
    assert_eq!(first.len(), 1);
    svc.ack_json(first[0].id, r#"{"user_id":7}"#).unwrap();
    let second = svc.fetch(&["flow"], 10, None).unwrap().remove(0);
    let given = svc.parent_results(&second).unwrap();
    assert_eq!((given.results, given.states), (vec![serde_json::json!({"user_id": 7})], None));
    svc.ack(second.id).unwrap();
    assert_eq!(svc.workflow(chain.id).unwrap().state, WorkflowState::Completed);

    let batch = WorkflowBuilder::batch([JobBuilder::new("part").queue("parts")])
        .on_complete(JobBuilder::new("report").queue("reports"));
    let batch = svc.create_workflow(batch).unwrap();
    let cancelled = svc.cancel_workflow(batch.id).unwrap();
    assert_eq!(cancelled.state, WorkflowState::Cancelled);
    assert!(svc.fetch(&["parts", "reports"], 10, None).unwrap().is_empty());
    assert!(matches!(
        svc.cancel_workflow(batch.id),
        Err(svc::SvcError::Engine(svc::engine::EngineError::WorkflowConflict { .. }))
    ));
    let no_callback = WorkflowBuilder::batch([JobBuilder::new("part")]);
    assert!(matches!(svc.create_workflow(no_callback), Err(svc::SvcError::Invalid(_))));
    svc.close();
}

#[test]
fn embedded_programs_register_schemas_and_get_typed_violations() {
    use serde_json::json;
    use svc::job::JobBuilder;
    use svc::schema::SchemaBuilder;
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    let document = json!({"type": "array", "prefixItems": [{"type": "string", "format": "email"}], "minItems": 1});
    let entry = svc.register_schema(SchemaBuilder::new("urn:svc:email:v1", document).job_type("email.send")).unwrap();
    assert_eq!((entry.uri.as_str(), entry.job_type.as_deref()), ("urn:svc:email:v1", Some("email.send")));
    assert!(matches!(
        svc.register_schema(SchemaBuilder::new("urn:bad", json!({"type": 3}))),
        Err(svc::SvcError::Invalid(error)) if error.reason == Some("invalid_schema")
    ));

    let ok = svc.enqueue(JobBuilder::new("email.send").args(["ada@example.com"]).schema("urn:svc:email:v1")).unwrap();
    assert_eq!(ok.job.schema(), Some("urn:svc:email:v1"));
    let refused = svc.enqueue(JobBuilder::new("email.send").args([42]).schema("urn:svc:email:v1")).unwrap_err();
    let violations = refused.schema_violations().expect("a schema failure");
    assert_eq!((violations[0].path.as_str(), violations[0].keyword.as_str()), ("args[0]", "type"));
    let unknown = svc.enqueue(JobBuilder::new("t").schema("urn:nobody")).unwrap_err();
    assert_eq!(unknown.schema_violations(), Some(Vec::new()), "not registered");

    assert_eq!(svc.schemas().len(), 1);
    svc.close();
    let svc = Svc::open(dir.path()).unwrap();
    assert!(svc.schema("urn:svc:email:v1").is_some(), "durable");
    svc.delete_schema("urn:svc:email:v1").unwrap();
    assert!(svc.schemas().is_empty());
    svc.close();
}

#[test]
fn embedded_programs_manage_webhook_subscriptions_through_typed_builders() {
    use svc::webhook::subscription::{WebhookBuilder, WebhookUpdate};
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    let created = svc
        .create_webhook(
            WebhookBuilder::new("https://hooks.example.com/svc", ["job.*"], "embedded-secret-0123")
                .filter_queues(["mail"])
                .metadata(serde_json::json!({"team": "ops"})),
        )
        .unwrap();
    assert_eq!((created.events.as_slice(), created.active), (["job.*".to_string()].as_slice(), true));
    let refused = svc.create_webhook(WebhookBuilder::new("http://hooks.example.com", ["*"], "embedded-secret-0123"));
    assert!(matches!(refused, Err(svc::SvcError::Invalid(error)) if error.reason == Some("https_required")));
    let rotated =
        svc.update_webhook(created.id, WebhookUpdate::new().secret("the-next-secret-0123").active(false)).unwrap();
    assert!(rotated.rotation.is_some() && !rotated.active);
    let ended = svc.drop_previous_webhook_secret(created.id).unwrap();
    assert_eq!((ended.secret.as_str(), ended.rotation.is_none()), ("the-next-secret-0123", true));
    svc.close();
    let svc = Svc::open(dir.path()).unwrap();
    assert_eq!(svc.webhooks().len(), 1, "durable");
    svc.delete_webhook(created.id).unwrap();
    assert!(svc.webhook(created.id).is_none());
    svc.close();
}

#[test]
fn results_and_failure_reports_are_checked_as_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    let job = svc.enqueue(JobBuilder::new("t")).unwrap().job;
    svc.fetch(&["default"], 1, None).unwrap();
    let request = (ValidationKind::Request, "result".to_string());
    assert_eq!(refused_field(svc.ack_json(job.id, "not json")), request);
    assert_eq!(refused_field(svc.ack_json(job.id, "")), request);
    assert_eq!(refused_field(svc.ack_json(job.id, r#"{"a":1} trailing"#)), request);
    let deep = format!("{}{}", "[".repeat(64), "]".repeat(64));
    assert_eq!(refused_field(svc.ack_json(job.id, &deep)), request, "deeper than an ack body may nest");
    let deep: Value = serde_json::from_str(&deep[1..deep.len() - 1]).unwrap();
    let mut deeper = deep.clone();
    deeper = Value::Array(vec![deeper]);
    assert_eq!(refused_field(svc.ack_with(job.id, &deeper)), request);
    let too_large = (ValidationKind::TooLarge, "result".to_string());
    let big = "x".repeat(svc::__private::limits::RESULT_BYTES_MAX);
    assert_eq!(refused_field(svc.ack_with(job.id, &big)), too_large);
    assert_eq!(refused_field(svc.ack_json(job.id, &format!("\"{big}\""))), too_large);
    let mut keyed = std::collections::HashMap::new();
    keyed.insert((1, 2), "a map with keys that are not strings");
    assert_eq!(refused_field(svc.ack_with(job.id, &keyed)), request);

    let error_type = (ValidationKind::Request, "error.type".to_string());
    assert_eq!(refused_field(svc.nack(job.id, Failure::new("", "no type"))), error_type);
    assert_eq!(refused_field(svc.nack(job.id, Failure::new("T".repeat(256), "too long a type"))), error_type);
    assert_eq!(refused_field(svc.requeue(job.id, Failure::new("", "no type"))), error_type);
    let details = Failure::new("E", "m").details([1, 2]);
    assert_eq!(refused_field(svc.nack(job.id, details)), (ValidationKind::Request, "error.details".to_string()));
    let stored = svc.get(job.id).unwrap();
    assert_eq!((stored.state, stored.attempt, stored.run().error.is_none()), (JobState::Active, 1, true));

    // What is accepted is stored compact, and a `null` result is none.
    assert_eq!(svc.ack_with(job.id, &deep).unwrap().run().result.as_deref(), Some(&*deep.to_string()));
    let spaced = svc.enqueue(JobBuilder::new("t")).unwrap().job;
    let nothing = svc.enqueue(JobBuilder::new("t")).unwrap().job;
    svc.fetch(&["default"], 2, None).unwrap();
    let acked = svc.ack_json(spaced.id, " { \"sent\" :\n true } ").unwrap();
    assert_eq!(acked.run().result.as_deref(), Some(r#"{"sent":true}"#));
    assert_eq!(svc.ack_with(nothing.id, &Option::<u8>::None).unwrap().run().result, None);
    svc.close();
}

#[test]
fn fetches_batches_and_queue_names_are_checked_as_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    svc.enqueue(JobBuilder::new("t").queue("mail")).unwrap();
    let queues = (ValidationKind::Request, "queues".to_string());
    assert_eq!(refused_field(svc.fetch(&["Not A Queue"], 1, None)), queues);
    assert_eq!(refused_field(svc.fetch(&["mail", "mail/inbox"], 1, None)), queues);
    assert_eq!(refused_field(svc.fetch(&[], 1, None)), queues);
    assert_eq!(refused_field(svc.fetch(&["mail"; 33], 1, None)), queues);
    assert_eq!(refused_field(svc.fetch(&["mail"], 0, None)), (ValidationKind::Request, "count".to_string()));
    for worker in ["", "fetch", "a/b", "w 1"] {
        let refused = svc.fetch(&["mail"], 1, Some(worker));
        assert_eq!(refused_field(refused), (ValidationKind::Request, "worker_id".to_string()), "{worker:?}");
    }
    let wait = svc.fetch_waiting(&["mail"], 1, None, 20_001);
    assert_eq!(refused_field(wait), (ValidationKind::Request, "wait_ms".to_string()));
    assert!(svc.handle().worker("a/b").is_none() && svc.handle().worker("fetch").is_none(), "no worker was made");
    let claimed = svc.fetch_waiting(&["mail"; 32], 1000, Some("host-1:w@2"), 20_000).unwrap();
    assert_eq!(claimed.len(), 1, "32 queues, a count over the most (claims at most 100), the longest wait");

    let queue = (ValidationKind::Request, "queue".to_string());
    assert_eq!(refused_field(svc.pause_queue("Mail")), queue);
    assert_eq!(refused_field(svc.resume_queue("")), queue);
    assert!(svc.queue_stats("Mail").is_none(), "no queue was made");
    assert!(svc.pause_queue("mail").unwrap().paused);

    assert_eq!(refused_field(svc.enqueue_batch([])), (ValidationKind::Request, "jobs".to_string()));
    let too_many = (0..=svc::__private::limits::BATCH_JOBS_MAX).map(|n| JobBuilder::new("t").args([n]));
    match svc.enqueue_batch(too_many) {
        Err(SvcError::Invalid(error)) => {
            assert_eq!(error.kind, ValidationKind::TooLarge);
            assert!(error.details.contains(&("received", json!(svc::__private::limits::BATCH_JOBS_MAX + 1))));
        }
        other => panic!("a batch over the most is refused, got {other:?}"),
    }
    let invalid_item = svc.enqueue_batch([JobBuilder::new("t"), JobBuilder::new("t").priority(500)]);
    assert_eq!(refused_field(invalid_item), (ValidationKind::Payload, "jobs[1].options.priority".to_string()));
    svc.close();
}

#[test]
fn a_failure_report_says_whether_the_job_is_retried() {
    use svc::job::RetryPolicy;
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    let retried = RetryPolicy { max_attempts: 5, ..RetryPolicy::default() };
    let job = |n: u32| JobBuilder::new("t").args([n]).retry(&retried);
    let [again, last, back] = [1, 2, 3].map(|n| svc.enqueue(job(n)).unwrap().job);
    assert_eq!(svc.fetch(&["default"], 3, Some("w-1")).unwrap().len(), 3);

    let report = Failure::new("SmtpError", "421").code("smtp_421").backtrace(["send", "run"]);
    let failed = svc.nack(again.id, report.details(json!({"error_class": "smtp.Transient"}))).unwrap();
    assert_eq!(failed.state, JobState::Retryable, "retried as the policy says");
    let error = failed.run().error.clone().unwrap();
    assert_eq!(
        (error.error_type.as_str(), error.code.as_str(), error.message.as_str()),
        ("SmtpError", "smtp_421", "421")
    );
    assert_eq!(
        (error.backtrace.as_slice(), error.error_class().as_deref()),
        (["send", "run"].map(String::from).as_slice(), Some("smtp.Transient"))
    );

    let failed = svc.nack(last.id, Failure::new("InvalidAddress", "no such domain").non_retryable()).unwrap();
    assert_eq!((failed.state, failed.run().error.as_ref().unwrap().retryable), (JobState::Discarded, Some(false)));

    let requeued = svc.requeue(back.id, Failure::new("Shutdown", "the worker stops")).unwrap();
    assert_eq!((requeued.state, requeued.attempt), (JobState::Available, 0), "the attempt does not count");
    svc.close();
}

/// A job completed in process reads back over HTTP as the JSON it was
/// given, once a server opens the data dir.
#[test]
fn results_acked_in_process_read_back_as_json_over_http() {
    #[derive(serde::Serialize)]
    struct Receipt {
        message_id: u64,
        to: Vec<&'static str>,
    }
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    let ids: Vec<_> = (0..3).map(|n| svc.enqueue(JobBuilder::new("t").args([n])).unwrap().job.id).collect();
    svc.fetch(&["default"], 3, None).unwrap();
    svc.ack_with(ids[0], &Receipt { message_id: 7, to: vec!["ada@example.com"] }).unwrap();
    assert!(svc.ack_json(ids[1], "not json").is_err());
    svc.ack_json(ids[1], "[1, \"two\", {\"three\": 3}]").unwrap();
    svc.ack(ids[2]).unwrap();
    svc.close();

    let (_server, base) = common::spawn_server(dir.path());
    let client = common::http_client();
    let read = |id: svc::job::JobId| {
        let text = client.get(format!("{base}/svc/v1/jobs/{id}")).send().unwrap().text().unwrap();
        let body: Value = serde_json::from_str(&text).unwrap_or_else(|error| panic!("{error}: {text}"));
        body["job"].clone()
    };
    let job = read(ids[0]);
    assert_eq!(
        (&job["state"], &job["result"]),
        (&json!("completed"), &json!({"message_id": 7, "to": ["ada@example.com"]}))
    );
    assert_eq!(read(ids[1])["result"], json!([1, "two", {"three": 3}]));
    assert!(read(ids[2]).get("result").is_none_or(Value::is_null));
}

#[test]
fn an_embedded_worker_reports_progress_checked_as_over_http() {
    use svc::job::JobProgress;
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    let waiting = svc.enqueue(JobBuilder::new("report.build").queue("idle")).unwrap().job;
    let refused = svc.report_progress(waiting.id, JobProgress::new(0.5));
    assert!(matches!(refused, Err(SvcError::Engine(svc::engine::EngineError::Conflict { .. }))), "{refused:?}");

    let job = svc.enqueue(JobBuilder::new("report.build")).unwrap().job;
    svc.fetch(&["default"], 1, None).unwrap();
    let too_long = JobProgress::new(0.5).message("m".repeat(4097));
    assert_eq!(refused_field(svc.report_progress(job.id, too_long)).1, "message");
    assert_eq!(refused_field(svc.report_progress(job.id, JobProgress::new(f64::NAN))).1, "progress");
    assert!(svc.progress(job.id).is_none(), "nothing refused was kept");

    let progress = JobProgress::new(1.7).message("rows").data(&json!({"rows": 12})).unwrap();
    let reported = svc.report_progress(job.id, progress).unwrap();
    assert_eq!(reported.progress().map(|p| p.fraction), Some(1.0), "clamped");
    svc.close();
    let svc = Svc::open(dir.path()).unwrap();
    let kept = svc.progress(job.id).unwrap();
    assert_eq!((kept.message.as_deref(), kept.data.as_deref()), (Some("rows"), Some(r#"{"rows":12}"#)));
    svc.close();
}

#[test]
fn an_embedded_worker_acks_and_fetches_in_one_step() {
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    let ids: Vec<_> = (0..4).map(|n| svc.enqueue(JobBuilder::new("t").args([n])).unwrap().job.id).collect();
    let first = svc.fetch(&["default"], 1, Some("w1")).unwrap().remove(0);
    let (acked, next) = svc.ack_and_fetch(first.id, Some(&json!({"n": 0})), &["default"], 2, Some("w1")).unwrap();
    assert_eq!((acked.state, acked.run().result.as_deref()), (JobState::Completed, Some(r#"{"n":0}"#)));
    assert_eq!(next.iter().map(|job| job.id).collect::<Vec<_>>(), [ids[1], ids[2]]);
    assert!(next.iter().all(|job| job.run().worker_id.as_deref() == Some("w1")));

    // A refused ack claims nothing.
    let refused = svc.ack_and_fetch::<Value>(ids[3], None, &["default"], 1, Some("w1"));
    assert!(matches!(refused, Err(SvcError::Engine(_))), "{refused:?}");
    assert_eq!(svc.get(ids[3]).unwrap().state, JobState::Available);

    let outcomes = svc.ack_many(&[(ids[1], Some(json!("done"))), (ids[3], None), (ids[2], None)]).unwrap();
    let done: Vec<bool> = outcomes.iter().map(Result::is_ok).collect();
    assert_eq!(done, [true, false, true], "each on its own");
    assert!(matches!(svc.ack_many(&[]), Err(SvcError::Invalid(_))));
    svc.close();
}

#[test]
fn an_embedded_engine_opens_works_and_closes_inside_an_async_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    runtime.block_on(async {
        let svc = Svc::open(dir.path()).unwrap();
        let job = svc.enqueue(JobBuilder::new("t")).unwrap().job;
        assert_eq!(svc.fetch(&["default"], 1, None).unwrap()[0].id, job.id);
        svc.ack(job.id).unwrap();
        svc.close();
        // Dropped without a close, too.
        let reopened = Svc::open(dir.path()).unwrap();
        assert_eq!(reopened.get(job.id).unwrap().state, JobState::Completed);
        drop(reopened);
    });
}

#[test]
fn an_embedded_heartbeat_extends_what_the_worker_holds_and_names_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    let held = svc.enqueue(JobBuilder::new("t")).unwrap().job;
    let waiting = svc.enqueue(JobBuilder::new("t").queue("other")).unwrap().job;
    svc.fetch(&["default"], 1, Some("w1")).unwrap();
    let beat = svc.heartbeat("w1", Some(&[held.id, waiting.id])).unwrap();
    assert_eq!((beat.extended, beat.not_extended.as_slice()), (1, &[waiting.id][..]));
    assert_eq!(svc.heartbeat("w1", None).unwrap().extended, 1, "all it holds");
    assert!(matches!(svc.heartbeat("a/b", None), Err(SvcError::Invalid(_))));
    svc.close();
}

#[test]
fn the_admin_operations_work_embedded_and_validate_as_http_does() {
    use svc::engine::{Backpressure, BulkAction, EngineError, JobFilter};
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    svc.set_backpressure("mail", Backpressure::reject_above(3)).unwrap();
    for n in 0..3 {
        svc.enqueue(JobBuilder::new("email.send").queue("mail").args(json!([format!("u{n}@example.com")]))).unwrap();
    }
    let refused = svc.enqueue(JobBuilder::new("email.send").queue("mail"));
    assert!(matches!(refused, Err(SvcError::Engine(EngineError::QueueFull { depth: 3, bound: 3, .. }))), "{refused:?}");
    assert_eq!(refused_field(svc.set_backpressure("mail", Backpressure::reject_above(0))).1, "backpressure.max_depth");
    assert_eq!(refused_field(svc.jobs(&JobFilter::all().queue("Not A Queue"), None, 10)).1, "queue");
    assert_eq!(refused_field(svc.jobs(&JobFilter::all(), None, 0)).1, "limit");

    let found = svc.jobs(&JobFilter::all().text("u1@"), None, 10).unwrap();
    assert_eq!(found.jobs.len(), 1);
    let mail = JobFilter::all().queue("mail");
    assert_eq!(svc.bulk_dry_run(BulkAction::Cancel, &mail).unwrap().matched, 3);
    assert_eq!(svc.get(found.jobs[0].id).unwrap().state, JobState::Available, "a dry run changes nothing");
    assert_eq!(svc.bulk(BulkAction::Cancel, &mail).unwrap().changed, 3);
    assert_eq!(svc.bulk(BulkAction::Delete, &mail).unwrap().changed, 3);
    assert!(svc.get(found.jobs[0].id).is_none());
    assert_eq!(svc.overview().queues, 2, "default, and mail for its bound");

    let job = svc.enqueue(JobBuilder::new("t").queue("other")).unwrap().job;
    svc.fetch(&["other"], 1, None).unwrap();
    svc.ack(job.id).unwrap();
    assert_eq!(svc.throughput_minutes(Some("other")).iter().map(|m| m.completed).sum::<u64>(), 1);
    svc.close();
    let svc = Svc::open(dir.path()).unwrap();
    assert_eq!(svc.throughput_minutes(None).iter().map(|m| m.completed).sum::<u64>(), 1, "kept across a close");
    let refused = svc.enqueue(JobBuilder::new("email.send").queue("mail"));
    assert!(refused.is_ok(), "the bound is durable, and the queue is empty now");
}

#[test]
fn events_are_listed_embedded_as_over_http_and_page_by_next_after() {
    use svc::backend::EventFilter;
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    let jobs: Vec<_> = (0..5).map(|n| svc.enqueue(JobBuilder::new("t").queue("q").args([n])).unwrap().job).collect();
    svc.fetch(&["q"], 1, None).unwrap();
    svc.ack(jobs[0].id).unwrap();
    assert_eq!(refused_field(svc.events(&EventFilter::default(), None, 0)).1, "limit");
    assert_eq!(refused_field(svc.events(&EventFilter::default(), None, 101)).1, "limit");

    // Two at a time, following next_after: the five enqueues in order.
    let enqueued = EventFilter { types: Some(vec!["job.enqueued".into()]), ..EventFilter::default() };
    let (mut seen, mut after) = (Vec::new(), None);
    loop {
        let page = svc.events(&enqueued, after, 2).unwrap();
        seen.extend(page.events.iter().map(|event| event.job.as_ref().unwrap().id));
        after = page.next_after();
        if !page.has_more {
            break;
        }
    }
    assert_eq!(seen, jobs.iter().map(|job| job.id).collect::<Vec<_>>());
    let lifecycle = EventFilter { subject: Some(jobs[0].id.to_string()), ..EventFilter::default() };
    let kinds: Vec<&str> =
        svc.events(&lifecycle, None, 100).unwrap().events.iter().map(|event| event.kind.type_name()).collect();
    assert_eq!(kinds, ["job.enqueued", "job.started", "job.completed"]);
    svc.close();
}

#[test]
fn refusals_and_jobs_read_as_the_http_api_answers_them() {
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    let done = svc.enqueue(JobBuilder::new("t").args([1])).unwrap().job;
    svc.fetch(&["default"], 1, None).unwrap();
    svc.ack(done.id).unwrap();
    let unknown = svc::job::JobId::parse_any_case("0195a9c4-0000-7000-8000-000000000001").unwrap();
    let embedded: Vec<svc::Refusal> = [
        svc.ack(unknown).map(drop),
        svc.ack(done.id).map(drop),
        svc.nack(done.id, Failure::new("", "no type")).map(drop),
        svc.fetch(&["not a queue!"], 1, None).map(drop),
    ]
    .into_iter()
    .map(|outcome| outcome.expect_err("refused").refusal().expect("a request's refusal"))
    .collect();
    let rendered: Value = serde_json::from_str(&svc::render_job(&svc.get(done.id).unwrap(), None)).unwrap();
    svc.close();

    let server = common::TestServer::start(dir.path());
    let answers = [
        server.post("/svc/v1/workers/ack", json!({"job_id": unknown.to_string()})),
        server.post("/svc/v1/workers/ack", json!({"job_id": done.id.to_string()})),
        server.post(
            "/svc/v1/workers/nack",
            json!({"job_id": done.id.to_string(), "error": {"type": "", "message": "no type"}}),
        ),
        server.post("/svc/v1/workers/fetch", json!({"queues": ["not a queue!"]})),
    ];
    for (refusal, answer) in embedded.iter().zip(&answers) {
        let error = &answer.body["error"];
        assert_eq!(refusal.status(), answer.status, "{refusal}");
        assert_eq!(refusal.code, error["code"], "{refusal}");
        assert_eq!(refusal.message, error["message"], "{refusal}");
        assert_eq!(json!(refusal.retryable()), error["retryable"], "{refusal}");
        assert_eq!(Value::Object(refusal.details.clone()), error["details"], "{refusal}");
    }
    let codes: Vec<&str> = embedded.iter().map(|refusal| refusal.code).collect();
    assert_eq!(codes, ["not_found", "conflict", "invalid_request", "invalid_request"]);
    assert_eq!(rendered, server.get(&format!("/svc/v1/jobs/{}", done.id)).body["job"]);
}
