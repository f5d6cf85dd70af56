//! The producer and admin calls against a real server: every enqueue
//! option round-trips, and each admin family answers typed results.

mod support;

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use support::{Server, logs};
use svc_client::{
    Client, CronSpec, Enqueue, Fetch, JobState, ListOptions, OnConflict, RateLimit, RatePeriod, RetryPolicy,
    UniquePolicy, WebhookSpec, WorkflowSpec, new_job_id, rfc3339,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_enqueue_option_round_trips() {
    logs();
    let Some(server) = Server::start() else { return };
    let client = server.client();
    client
        .schemas()
        .register("urn:test:mail:v1", json!({"type": "array", "prefixItems": [{"type": "object", "required": ["to"]}]}))
        .await
        .unwrap();
    let id = new_job_id();
    let expires = SystemTime::now() + Duration::from_secs(3600);
    let job = client
        .enqueue(
            Enqueue::new("email.send")
                .args(&json!({"to": "ada@example.com", "n": 1}))
                .id(&id)
                .queue("mail")
                .priority(7)
                .timeout(Duration::from_secs(45))
                .visibility_timeout(Duration::from_secs(12))
                .delay(Duration::from_secs(600))
                .expires_at(expires)
                .retry(
                    RetryPolicy::new()
                        .max_attempts(5)
                        .backoff(Duration::from_secs(2), 3.0)
                        .max_interval(Duration::from_secs(60))
                        .jitter(false)
                        .non_retryable(["Fatal", "auth.*"])
                        .dead_letter(),
                )
                .tags(["welcome", "eu"])
                .unique(
                    UniquePolicy::new()
                        .key(["to"])
                        .period(Duration::from_secs(3600))
                        .on_conflict(OnConflict::Ignore)
                        .states([JobState::Scheduled, JobState::Available]),
                )
                .rate_limit(RateLimit::new().key("smtp").concurrency(2).rate(10, RatePeriod::Minute))
                .meta(&json!({"tenant": "acme"}))
                .traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
                .schema("urn:test:mail:v1"),
        )
        .await
        .unwrap();
    let stored = client.get(&id).await.unwrap();
    assert_eq!(stored, job, "the answer is the stored job");
    assert_eq!(job.id, id);
    assert_eq!(job.job_type, "email.send");
    assert_eq!(job.args, [json!({"to": "ada@example.com", "n": 1})]);
    assert_eq!((job.queue.as_str(), job.priority, job.state), ("mail", 7, JobState::Scheduled));
    assert_eq!((job.timeout_ms, job.visibility_timeout_ms), (45_000, 12_000));
    assert!(job.scheduled_at.is_some());
    assert_eq!(job.expires_at.as_deref(), Some(rfc3339(expires).as_str()));
    assert_eq!(
        job.retry,
        Some(json!({"max_attempts": 5, "initial_interval": "PT2S", "backoff_coefficient": 3.0,
            "max_interval": "PT1M", "jitter": false, "non_retryable_errors": ["Fatal", "auth.*"],
            "on_exhaustion": "dead_letter"}))
    );
    assert_eq!(job.max_attempts, 5);
    assert_eq!(job.tags, ["welcome", "eu"]);
    let unique = job.unique.clone().unwrap();
    assert_eq!(unique["key"], json!(["to"]));
    assert_eq!(unique["on_conflict"], json!("ignore"));
    assert_eq!(unique["states"], json!(["scheduled", "available"]));
    assert!(unique["period"].is_string());
    assert_eq!(job.unique_key.as_ref().map(String::len), Some(64));
    let limit = job.rate_limit.clone().unwrap();
    assert_eq!((&limit["key"], &limit["concurrency"], &limit["rate"]), (&json!("smtp"), &json!(2), &json!(10)));
    assert_eq!(limit["period"], json!("minute"));
    assert_eq!(job.meta.get("tenant"), Some(&json!("acme")));
    assert_eq!(job.traceparent(), Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));
    assert_eq!(job.schema.as_deref(), Some("urn:test:mail:v1"));

    // The unique policy answers the held job.
    let again = client
        .enqueue(
            Enqueue::new("email.send")
                .args(&json!({"to": "ada@example.com", "n": 2}))
                .unique(UniquePolicy::new().key(["to"]).on_conflict(OnConflict::Ignore)),
        )
        .await
        .unwrap();
    assert!(again.deduplicated);
    assert_eq!(again.id, id);

    // Staged, then activated.
    let staged = client.enqueue(Enqueue::new("invoice.send").args(&[42]).pending()).await.unwrap();
    assert_eq!(staged.state, JobState::Pending);
    let active = client.activate(&staged.id).await.unwrap();
    assert_eq!(active.state, JobState::Available);
    assert!(active.activated_at.is_some());

    // A time in the past means now; expiring relative to now.
    let now = client
        .enqueue(
            Enqueue::new("report.build")
                .scheduled_at(SystemTime::now() - Duration::from_secs(5))
                .expires_in(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    assert_eq!(now.state, JobState::Available);
    assert!(now.expires_at.is_some());

    // Cancel answers the state the job left.
    let cancelled = client.cancel(&now.id).await.unwrap();
    assert_eq!((cancelled.state, cancelled.previous_state), (JobState::Cancelled, Some(JobState::Available)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_svc_code_details_and_request_id() {
    logs();
    let Some(server) = Server::start() else { return };
    let client = server.client();
    let error = client.enqueue(Enqueue::new("not a type")).await.unwrap_err();
    assert_eq!((error.status(), error.code()), (400, "invalid_payload"));
    assert!(!error.retryable());
    assert_eq!(error.api().unwrap().field(), Some("type"));
    assert!(error.request_id().is_some_and(|id| id.starts_with("req_")), "{error:?}");

    let id = new_job_id();
    client.enqueue(Enqueue::new("a.b").id(&id)).await.unwrap();
    let duplicate = client.enqueue(Enqueue::new("a.b").id(&id)).await.unwrap_err();
    assert!(duplicate.is_duplicate());
    assert_eq!(duplicate.api().unwrap().existing_job_id(), Some(id.as_str()));
    assert!(!duplicate.maybe_applied());

    let missing = client.get(&new_job_id()).await.unwrap_err();
    assert!(missing.is_not_found());
    assert_eq!(client.find(&new_job_id()).await.unwrap(), None);

    let bad_args = client.enqueue(Enqueue::new("a.b").meta(&json!("not an object"))).await.unwrap_err();
    assert_eq!(bad_args.code(), "invalid_argument");

    // A paused queue refuses new work at once, without retries.
    assert!(client.queues().pause("held").await.unwrap());
    let started = std::time::Instant::now();
    let paused = client.enqueue(Enqueue::new("a.b").queue("held")).await.unwrap_err();
    assert_eq!(paused.code(), "queue_paused");
    assert_eq!(paused.api().unwrap().attempts, 1);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(!client.queues().resume("held").await.unwrap());

    // Nothing listens here: refused, retried, then reported.
    let nowhere = Client::builder(format!("http://127.0.0.1:{}", support::free_port()))
        .retry(
            svc_client::RequestRetry::default()
                .max_retries(2)
                .delays(Duration::from_millis(10), Duration::from_millis(20)),
        )
        .build()
        .unwrap();
    let refused = nowhere.enqueue(Enqueue::new("a.b")).await.unwrap_err();
    assert_eq!(refused.code(), "connection_refused");
    assert!(!refused.maybe_applied());
    let svc_client::Error::Transport(transport) = &refused else { panic!("{refused:?}") };
    assert_eq!(transport.attempts, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_progress_and_the_worker_protocol() {
    logs();
    let Some(server) = Server::start() else { return };
    let client = server.client();
    let ids: Vec<String> = (0..3).map(|_| new_job_id()).collect();
    let jobs = client
        .enqueue_batch(ids.iter().enumerate().map(|(n, id)| Enqueue::new("batch.item").args(&[n]).id(id)).collect())
        .await
        .unwrap();
    assert_eq!(jobs.iter().map(|job| job.id.clone()).collect::<Vec<_>>(), ids);
    let refused = client.enqueue_batch(vec![Enqueue::new("ok.job"), Enqueue::new("bad type")]).await.unwrap_err();
    assert_eq!(refused.details().get("index"), Some(&json!(1)));

    let claimed = client.fetch(Fetch::new(["default"]).count(2).worker_id("w-proto")).await.unwrap();
    assert_eq!(claimed.len(), 2);
    let progress = client
        .report_progress(
            &claimed[0].id,
            &svc_client::ProgressReport::new(0.25).message("a quarter").data(json!({"rows": 5})),
        )
        .await
        .unwrap();
    assert_eq!((progress.progress, progress.data.clone()), (Some(0.25), json!({"rows": 5})));
    assert_eq!(client.progress(&claimed[0].id).await.unwrap(), progress);

    // Two acks and the next claim in one request.
    let answer = client
        .ack(
            svc_client::Acks::many(vec![
                (claimed[0].id.clone(), Some(json!({"ok": 1}))),
                (claimed[1].id.clone(), None),
            ])
            .worker_id("w-proto")
            .then_fetch(Fetch::new(["default"]).count(5)),
        )
        .await
        .unwrap();
    assert!(answer.acks.iter().all(|ack| ack.outcome == Ok(JobState::Completed)), "{:?}", answer.acks);
    assert_eq!(answer.jobs.len(), 1);
    let again = client.ack(svc_client::Acks::one(&claimed[0].id, None)).await.unwrap();
    let refused = again.acks[0].outcome.clone().unwrap_err();
    assert_eq!((refused.code.as_str(), refused.current_state()), ("conflict", Some("completed")));

    let beat = client.heartbeat(&svc_client::Heartbeat::new("w-proto", vec![answer.jobs[0].id.clone()])).await.unwrap();
    assert_eq!((beat.state, beat.jobs_extended), (svc_client::WorkerState::Running, 1));
    let nacked = client
        .nack(&answer.jobs[0].id, &svc_client::Failure::new("Boom", "it broke").non_retryable(), false, Some("w-proto"))
        .await
        .unwrap();
    assert_eq!(nacked.state, JobState::Discarded);
    assert_eq!(client.get(&claimed[0].id).await.unwrap().result, Some(json!({"ok": 1})));
    let workers = client.workers().list(&ListOptions::new()).await.unwrap();
    assert!(workers.items.iter().any(|worker| worker.worker_id == "w-proto"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflows_cron_queues_and_webhooks() {
    logs();
    let Some(server) = Server::start() else { return };
    let client = server.client();

    let chain = client
        .workflows()
        .create(
            WorkflowSpec::chain(vec![Enqueue::new("user.create").args(&["ada"]), Enqueue::new("email.welcome")])
                .name("onboarding")
                .defaults(Enqueue::new("-").queue("users").meta(&json!({"flow": "signup"}))),
        )
        .await
        .unwrap();
    assert_eq!((chain.workflow_type.as_str(), chain.state.as_str()), ("chain", "running"));
    assert_eq!(chain.name.as_deref(), Some("onboarding"));
    let steps = chain.members();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[1].state, Some(JobState::Pending));
    let first = client.get(steps[0].job_id.as_deref().unwrap()).await.unwrap();
    assert_eq!((first.queue.as_str(), first.meta.get("flow")), ("users", Some(&json!("signup"))));
    assert_eq!(first.workflow_id.as_deref(), Some(chain.id.as_str()));

    let batch = client
        .workflows()
        .create(
            WorkflowSpec::batch(vec![Enqueue::new("export.csv"), Enqueue::new("export.pdf")])
                .on_success(Enqueue::new("export.notify"))
                .on_failure(Enqueue::new("export.alert").queue("alerts")),
        )
        .await
        .unwrap();
    assert_eq!(batch.jobs_total, 2);
    assert_eq!(batch.callbacks.as_ref().map(|callbacks| callbacks.len()), Some(2));
    let group = client.workflows().group(vec![Enqueue::new("a.one"), Enqueue::new("a.two")]).await.unwrap();
    let cancelled = client.workflows().cancel(&group.id).await.unwrap();
    assert_eq!(cancelled.state, "cancelled");
    assert_eq!(client.workflows().get(&chain.id).await.unwrap().id, chain.id);

    let cron = client
        .cron()
        .register(
            CronSpec::new("nightly", "0 2 * * *", Enqueue::new("maintenance.cleanup").args(&[1]).queue("maintenance"))
                .timezone("Europe/Berlin")
                .overlap_policy("skip")
                .description("clean up"),
        )
        .await
        .unwrap();
    assert_eq!(cron.name, "nightly");
    assert_eq!((cron.timezone.as_deref(), cron.queue.as_deref()), (Some("Europe/Berlin"), Some("maintenance")));
    assert!(cron.next_run_at.is_some() && cron.enabled);
    let disabled = client.cron().update("nightly", json!({"enabled": false})).await.unwrap();
    assert!(!disabled.enabled);
    let listed = client.cron().list(&ListOptions::new()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(client.cron().get("nightly").await.unwrap().description.as_deref(), Some("clean up"));
    client.cron().delete("nightly").await.unwrap();
    assert!(client.cron().get("nightly").await.unwrap_err().is_not_found());

    let queues = client.queues().list(&ListOptions::new().limit(100)).await.unwrap();
    assert!(queues.items.iter().any(|queue| queue.name == "users" && queue.size >= 2));
    let stats = client.queues().stats("users").await.unwrap();
    assert_eq!(stats.states.get("pending"), Some(&1));

    let subscription = client
        .webhooks()
        .create(
            WebhookSpec::new("https://hooks.example.com/svc", ["job.completed", "workflow.*"], "a-secret-of-sixteen+")
                .queues(["users"])
                .active(false),
        )
        .await
        .unwrap();
    assert!(subscription.id.starts_with("sub_"));
    assert!(!subscription.active);
    let updated = client.webhooks().update(&subscription.id, json!({"active": true})).await.unwrap();
    assert!(updated.active);
    let page = client.webhooks().list(&ListOptions::new()).await.unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(client.webhooks().get(&subscription.id).await.unwrap().url, "https://hooks.example.com/svc");
    client.webhooks().delete(&subscription.id).await.unwrap();
    assert!(client.webhooks().get(&subscription.id).await.unwrap_err().is_not_found());

    let events = client.events(&["workflow.*"], None, Some(10)).await.unwrap();
    assert!(events.items.iter().any(|event| event["type"] == json!("workflow.started")));
    let health: Value = client.health().await.unwrap();
    assert_eq!(health["status"], json!("ok"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limited_calls_wait_for_retry_after() {
    logs();
    let Some(server) = Server::start_with_config("[rate_limit]\nrequests = 4\nwindow_s = 1\n") else { return };
    let client = server.client();
    let job = client.enqueue(Enqueue::new("a.b")).await.unwrap();
    let started = std::time::Instant::now();
    for _ in 0..6 {
        client.get(&job.id).await.expect("a 429 is waited out");
    }
    assert!(started.elapsed() >= Duration::from_millis(300), "the window had to pass: {:?}", started.elapsed());

    let impatient = Client::builder(server.url())
        .retry(svc_client::RequestRetry::default().max_retry_after(Duration::from_millis(100)))
        .build()
        .unwrap();
    let mut refused = None;
    for _ in 0..8 {
        if let Err(error) = impatient.get(&job.id).await {
            refused = Some(error);
            break;
        }
    }
    let refused = refused.expect("the limit is reached");
    assert_eq!((refused.status(), refused.code()), (429, "rate_limited"));
    assert!(refused.retryable());
    assert!(refused.api().unwrap().retry_after.is_some());
}
