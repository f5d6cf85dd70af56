//! Embedding svc: a job queue in a local data dir, used without HTTP.
//!
//! Run with `cargo run --example embed`.

use svc::Svc;
use svc::job::{DispatchLimit, Failure, JobBuilder, JobProgress, OnConflict, RateWindow, UniquePolicy};
use svc::schema::SchemaBuilder;
use svc::webhook::subscription::WebhookBuilder;
use svc::workflow::WorkflowBuilder;

/// What a mail job completes with: any serde-serializable value.
#[derive(serde::Serialize)]
struct Done {
    done: bool,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("svc-embed-example-{}", std::process::id()));
    let svc = Svc::open(&dir)?;

    // A schema the welcome mails' args must match: a recipient, then a template name.
    let mail_args = serde_json::json!({"type": "array", "prefixItems": [{"type": "string"}, {"type": "string"}]});
    svc.register_schema(SchemaBuilder::new("urn:example:email.send:v1", mail_args).job_type("email.send"))?;
    let wrong = JobBuilder::new("email.send").args((42, "welcome")).schema("urn:example:email.send:v1");
    if let Err(error) = svc.enqueue(wrong) {
        println!("refused: {:?}", error.schema_violations().unwrap_or_default());
    }

    // A job: type, serde-serializable args, options.
    let welcome = JobBuilder::new("email.send")
        .args(("ada@example.com", "welcome"))
        .queue("mail")
        .schema("urn:example:email.send:v1");
    let first = svc.enqueue(welcome.clone())?;
    println!("enqueued {} ({})", first.job.id, first.job.state.as_str());

    // At most one held job per recipient: a second enqueue answers with the first.
    let once = UniquePolicy { key: Some(vec!["0".into()]), on_conflict: OnConflict::Ignore, ..Default::default() };
    let unique = svc.enqueue(welcome.clone().unique(once.clone()))?;
    let again = svc.enqueue(welcome.unique(once))?;
    println!("unique job {}; the same again is deduplicated: {}", unique.job.id, again.deduplicated);

    // A staged job waits as `pending` until it is activated.
    let staged = svc.enqueue(JobBuilder::new("report.build").args([2026]).queue("mail").pending())?;
    svc.activate(staged.job.id)?;

    // At most two report builds per second, whatever the number of workers.
    let two_per_second = DispatchLimit {
        key: Some("reports".into()),
        concurrency: None,
        rate: Some(RateWindow { count: 2, period_ms: 1000 }),
    };
    svc.enqueue(JobBuilder::new("report.build").args([2027]).queue("mail").rate_limit(two_per_second))?;

    for claimed in svc.fetch(&["mail"], 10, Some("example-worker"))? {
        println!("working on {} {} with args {}", claimed.payload.job_type(), claimed.id, claimed.payload.args());
        // A long job says how far it got (GET /svc/v1/jobs/{id}/progress shows it).
        svc.report_progress(claimed.id, JobProgress::new(0.5).message("halfway"))?;
        svc.ack_with(claimed.id, &Done { done: true })?;
    }

    // A failure is retried as the job's retry policy says; a final one is
    // not, and the job goes to the dead letter listing.
    let ping = svc.enqueue(JobBuilder::new("partner.ping").args(["https://partner.invalid"]).queue("partners"))?;
    svc.fetch(&["partners"], 1, Some("example-worker"))?;
    let failed = svc.nack(ping.job.id, Failure::new("InvalidHost", "no such host").non_retryable())?;
    println!("{} is {} after a final failure", failed.id, failed.state.as_str());

    // A chain: the second step starts once the first completed, and is given its result.
    let onboarding = WorkflowBuilder::chain([
        JobBuilder::new("user.create").args(["ada@example.com"]).queue("onboarding"),
        JobBuilder::new("email.send_welcome").queue("onboarding"),
    ]);
    let chain = svc.create_workflow(onboarding.name("onboarding"))?;
    while let Some(step) = svc.fetch(&["onboarding"], 1, Some("example-worker"))?.pop() {
        let given = svc.parent_results(&step).map(|given| given.results).unwrap_or_default();
        println!("step {} given {given:?}", step.payload.job_type());
        svc.ack_with(step.id, &serde_json::json!({"user_id": 7}))?;
    }
    println!("workflow {} is {}", chain.id, svc.workflow(chain.id).expect("stored").state.as_str());

    // A webhook subscription: a server running on this data dir sends it every job event of "mail".
    let hook = WebhookBuilder::new("https://hooks.example.com/svc", ["job.*"], "a-secret-of-at-least-16")
        .filter_queues(["mail"]);
    let subscription = svc.create_webhook(hook)?;
    println!("subscription sub_{} takes {:?}", subscription.id, subscription.events);

    let done = svc.get(first.job.id).expect("the job is stored");
    println!("{} is {} with result {}", done.id, done.state.as_str(), done.run().result.as_deref().unwrap_or("none"));
    svc.close();
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
