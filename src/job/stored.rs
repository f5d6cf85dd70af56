//! How a job is encoded in logs and snapshots (docs/wal-format.md): one flat
//! list of fields, in the order the first format gave them, then its
//! extras. [`Job`] keeps some of these fields out of line; the encoding does
//! not show it, so the layout in memory can change without a new format.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::{
    ErrorEntry, FailureReport, Job, JobExtra, JobId, JobPayload, JobRun, JobState, QueueName, RetryPolicy, RunSlot,
};
use crate::clock::Millis;

/// A job as decoded from a log or a snapshot.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StoredJob {
    pub id: JobId,
    pub payload: JobPayload,
    pub queue: QueueName,
    pub state: JobState,
    pub priority: i32,
    pub timeout_ms: u64,
    pub visibility_timeout_ms: u64,
    pub retry: Arc<RetryPolicy>,
    pub attempt: u32,
    pub created_at: Millis,
    pub scheduled_at: Option<Millis>,
    pub expires_at: Option<Millis>,
    pub enqueued_at: Option<Millis>,
    pub started_at: Option<Millis>,
    pub completed_at: Option<Millis>,
    pub cancelled_at: Option<Millis>,
    pub discarded_at: Option<Millis>,
    pub retry_at: Option<Millis>,
    pub retry_delay_ms: Option<u64>,
    pub worker_id: Option<String>,
    pub result: Option<String>,
    pub error: Option<FailureReport>,
    pub errors: Vec<ErrorEntry>,
    pub visibility_deadline: Option<Millis>,
    pub execution_deadline: Option<Millis>,
    pub claim_visibility_ms: u64,
    pub extras: Box<[JobExtra]>,
}

/// The same fields, borrowed from a [`Job`], for encoding.
#[derive(Serialize)]
struct StoredJobRef<'a> {
    id: JobId,
    payload: &'a JobPayload,
    queue: &'a str,
    state: JobState,
    priority: i32,
    timeout_ms: u64,
    visibility_timeout_ms: u64,
    retry: &'a Arc<RetryPolicy>,
    attempt: u32,
    created_at: Millis,
    scheduled_at: Option<Millis>,
    expires_at: Option<Millis>,
    enqueued_at: Option<Millis>,
    started_at: Option<Millis>,
    completed_at: Option<Millis>,
    cancelled_at: Option<Millis>,
    discarded_at: Option<Millis>,
    retry_at: Option<Millis>,
    retry_delay_ms: Option<u64>,
    worker_id: Option<&'a str>,
    result: Option<&'a str>,
    error: Option<&'a FailureReport>,
    errors: &'a [ErrorEntry],
    visibility_deadline: Option<Millis>,
    execution_deadline: Option<Millis>,
    claim_visibility_ms: u64,
    extras: &'a [JobExtra],
}

impl From<StoredJob> for Job {
    fn from(stored: StoredJob) -> Job {
        let run = JobRun {
            started_at: stored.started_at,
            completed_at: stored.completed_at,
            cancelled_at: stored.cancelled_at,
            discarded_at: stored.discarded_at,
            retry_at: stored.retry_at,
            retry_delay_ms: stored.retry_delay_ms,
            worker_id: stored.worker_id,
            result: stored.result,
            error: stored.error,
            errors: stored.errors,
            visibility_deadline: stored.visibility_deadline,
            execution_deadline: stored.execution_deadline,
            claim_visibility_ms: stored.claim_visibility_ms,
        };
        Job {
            id: stored.id,
            payload: stored.payload,
            queue: stored.queue,
            state: stored.state,
            priority: super::priority_field(stored.priority),
            timeout_ms: super::timeout_field(stored.timeout_ms),
            visibility_timeout_ms: super::timeout_field(stored.visibility_timeout_ms),
            retry: stored.retry,
            attempt: stored.attempt,
            created_at: stored.created_at,
            scheduled_at: stored.scheduled_at.into(),
            expires_at: stored.expires_at.into(),
            enqueued_at: stored.enqueued_at.into(),
            // A job that never ran takes no out-of-line space.
            run: RunSlot((run != JobRun::default()).then(|| Box::new(run))),
            extras: stored.extras.into_vec().into(),
        }
    }
}

impl Serialize for Job {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let run = self.run();
        StoredJobRef {
            id: self.id,
            payload: &self.payload,
            queue: &self.queue,
            state: self.state,
            priority: i32::from(self.priority),
            timeout_ms: u64::from(self.timeout_ms),
            visibility_timeout_ms: u64::from(self.visibility_timeout_ms),
            retry: &self.retry,
            attempt: self.attempt,
            created_at: self.created_at,
            scheduled_at: self.scheduled_at(),
            expires_at: self.expires_at(),
            enqueued_at: self.enqueued_at(),
            started_at: run.started_at,
            completed_at: run.completed_at,
            cancelled_at: run.cancelled_at,
            discarded_at: run.discarded_at,
            retry_at: run.retry_at,
            retry_delay_ms: run.retry_delay_ms,
            worker_id: run.worker_id.as_deref(),
            result: run.result.as_deref(),
            error: run.error.as_ref(),
            errors: &run.errors,
            visibility_deadline: run.visibility_deadline,
            execution_deadline: run.execution_deadline,
            claim_visibility_ms: run.claim_visibility_ms,
            extras: &self.extras,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Job {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Job, D::Error> {
        StoredJob::deserialize(deserializer).map(Job::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{ErrorEntry, FailureReport};

    /// The encoding before the run moved out of line, field by field.
    #[derive(Serialize)]
    struct FlatJob {
        id: JobId,
        payload: JobPayload,
        queue: String,
        state: JobState,
        priority: i32,
        timeout_ms: u64,
        visibility_timeout_ms: u64,
        retry: Arc<RetryPolicy>,
        attempt: u32,
        created_at: Millis,
        scheduled_at: Option<Millis>,
        expires_at: Option<Millis>,
        enqueued_at: Option<Millis>,
        started_at: Option<Millis>,
        completed_at: Option<Millis>,
        cancelled_at: Option<Millis>,
        discarded_at: Option<Millis>,
        retry_at: Option<Millis>,
        retry_delay_ms: Option<u64>,
        worker_id: Option<String>,
        result: Option<String>,
        error: Option<Box<FailureReport>>,
        errors: Vec<ErrorEntry>,
        visibility_deadline: Option<Millis>,
        execution_deadline: Option<Millis>,
        claim_visibility_ms: u64,
        extras: Box<[JobExtra]>,
    }

    fn sample_job() -> Job {
        let payload = JobPayload::new("email.send", r#"["a@example.com"]"#, "{}", vec!["t".into()], Vec::new());
        let report = FailureReport {
            error_type: "Timeout".into(),
            code: "timeout".into(),
            message: "took too long".into(),
            backtrace: Vec::new(),
            retryable: None,
            details: None,
        };
        let mut job = Job {
            id: JobId(0x0195_39a4_aaaa_7000_8000_0000_0000_0001),
            payload,
            queue: "default".into(),
            state: JobState::Retryable,
            priority: 3,
            timeout_ms: 1000,
            visibility_timeout_ms: 2000,
            retry: Arc::new(RetryPolicy::default()),
            attempt: 1,
            created_at: 10,
            scheduled_at: None.into(),
            expires_at: Some(99).into(),
            enqueued_at: Some(10).into(),
            run: RunSlot::default(),
            extras: vec![JobExtra::ActivatedAt(5)].into(),
        };
        let run = job.run_mut();
        run.started_at = Some(11);
        run.retry_at = Some(20);
        run.retry_delay_ms = Some(9);
        run.worker_id = Some("w1".into());
        run.error = Some(report.clone());
        run.errors = vec![ErrorEntry { report, attempt: 1, occurred_at: 12 }];
        job
    }

    #[test]
    fn a_job_encodes_as_the_flat_list_it_always_was() {
        let job = sample_job();
        let run = job.run().clone();
        let flat = FlatJob {
            id: job.id,
            payload: job.payload.clone(),
            queue: job.queue.to_string(),
            state: job.state,
            priority: i32::from(job.priority),
            timeout_ms: u64::from(job.timeout_ms),
            visibility_timeout_ms: u64::from(job.visibility_timeout_ms),
            retry: job.retry.clone(),
            attempt: job.attempt,
            created_at: job.created_at,
            scheduled_at: job.scheduled_at(),
            expires_at: job.expires_at(),
            enqueued_at: job.enqueued_at(),
            started_at: run.started_at,
            completed_at: run.completed_at,
            cancelled_at: run.cancelled_at,
            discarded_at: run.discarded_at,
            retry_at: run.retry_at,
            retry_delay_ms: run.retry_delay_ms,
            worker_id: run.worker_id,
            result: run.result,
            error: run.error.map(Box::new),
            errors: run.errors,
            visibility_deadline: run.visibility_deadline,
            execution_deadline: run.execution_deadline,
            claim_visibility_ms: run.claim_visibility_ms,
            extras: job.extras.to_vec().into_boxed_slice(),
        };
        let encoded = postcard::to_allocvec(&job).unwrap();
        assert_eq!(encoded, postcard::to_allocvec(&flat).unwrap());
        assert_eq!(postcard::from_bytes::<Job>(&encoded).unwrap(), job);
    }

    #[test]
    fn a_job_that_never_ran_decodes_without_a_run() {
        let mut job = sample_job();
        *job.run_mut() = JobRun::default();
        let decoded: Job = postcard::from_bytes(&postcard::to_allocvec(&job).unwrap()).unwrap();
        assert!(decoded.run.0.is_none());
        assert_eq!(decoded, job, "an empty run equals no run");
    }
}
