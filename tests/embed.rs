//! The embedding API: the same engine called from a Rust program, no HTTP.

use svc::Svc;
use svc::job::JobState;

#[test]
fn embedded_queue_round_trip_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let svc = Svc::open(dir.path()).unwrap();
    let job = svc.enqueue_json(r#"{"type":"email.send","args":["a@example.com"],"options":{"queue":"mail"}}"#).unwrap();
    let failing = svc
        .enqueue_json(
            r#"{"type":"email.send","args":["b@example.com"],"options":{"queue":"mail","retry":{"max_attempts":1}}}"#,
        )
        .unwrap();
    let cancelled = svc.enqueue_json(r#"{"type":"email.send","args":[]}"#).unwrap();
    let claimed = svc.fetch(&["mail"], 2, Some("worker-1")).unwrap();
    assert_eq!(claimed.iter().map(|job| job.id).collect::<Vec<_>>(), [job.id, failing.id]);
    svc.ack(job.id, Some(r#"{"sent":true}"#.into())).unwrap();
    assert_eq!(svc.nack(failing.id, "SmtpError", "mailbox full").unwrap().state, JobState::Discarded);
    assert_eq!(svc.cancel(cancelled.id).unwrap().previous_state, JobState::Available);
    assert!(svc.enqueue_json(r#"{"type":"bad type","args":[]}"#).is_err());
    svc.close();

    let svc = Svc::open(dir.path()).unwrap();
    let stored = svc.get(job.id).unwrap();
    assert_eq!((stored.state, stored.result.as_deref()), (JobState::Completed, Some(r#"{"sent":true}"#)));
    assert_eq!(svc.get(failing.id).unwrap().error.as_ref().unwrap().message, "mailbox full");
    assert_eq!(svc.get(cancelled.id).unwrap().state, JobState::Cancelled);
    assert!(svc.fetch(&["mail", "default"], 10, None).unwrap().is_empty());
    svc.close();
}
