//! Embedding svc: a job queue in a local data dir, used without HTTP.
//!
//! Run with `cargo run --example embed`.

use svc::Svc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("svc-embed-example-{}", std::process::id()));
    let svc = Svc::open(&dir)?;

    let job = svc.enqueue_json(r#"{"type":"email.send","args":["ada@example.com"],"options":{"queue":"mail"}}"#)?;
    println!("enqueued {} ({})", job.id, job.state.as_str());

    for claimed in svc.fetch(&["mail"], 10, Some("example-worker"))? {
        println!("working on {} with args {}", claimed.id, claimed.payload.args);
        svc.ack(claimed.id, Some(r#"{"delivered":true}"#.to_string()))?;
    }

    let done = svc.get(job.id).expect("the job is stored");
    println!("{} is {} with result {}", done.id, done.state.as_str(), done.result.as_deref().unwrap_or("none"));
    svc.close();
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
