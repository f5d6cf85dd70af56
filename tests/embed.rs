//! The embedding API: the same engine called from a Rust program, no HTTP.

use svc::Svc;
use svc::job::JobState;

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
    svc.ack(job.id, Some(r#"{"sent":true}"#.into())).unwrap();
    assert_eq!(svc.nack(failing.id, "SmtpError", "mailbox full").unwrap().state, JobState::Discarded);
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
        svc.ack(job.id, None).unwrap();
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
    assert_eq!(svc.ack(active.id, None).unwrap().state, JobState::Completed, "accepted work still ends");
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
    svc.ack(claimed[0].id, None).unwrap();
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
    svc.ack(first[0].id, Some(r#"{"user_id":7}"#.into())).unwrap();
    let second = svc.fetch(&["flow"], 10, None).unwrap().remove(0);
    let given = svc.parent_results(&second).unwrap();
    assert_eq!((given.results, given.states), (vec![serde_json::json!({"user_id": 7})], None));
    svc.ack(second.id, None).unwrap();
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
