//! Earlier encodings of logged and snapshotted values that this build still
//! reads (`docs/wal-format.md`). Each is decoded as written and upgraded at
//! once, so the rest of the engine only ever sees the current types.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::cron::table::{CronFire, CronOutcome};
use crate::clock::Millis;
use crate::job::{ErrorEntry, FailureReport, Job, JobId, JobPayload, JobRun, JobState, RetryPolicy, StoredJob};

/// A job as logs and snapshots held it before jobs carried extras (unique
/// policies, dispatch limits, activation times).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobV1 {
    pub id: JobId,
    pub payload: JobPayload,
    pub queue: String,
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
    pub error: Option<Box<FailureReport>>,
    pub errors: Vec<ErrorEntry>,
    pub visibility_deadline: Option<Millis>,
    pub execution_deadline: Option<Millis>,
    pub claim_visibility_ms: u64,
}

impl From<JobV1> for Job {
    fn from(old: JobV1) -> Job {
        StoredJob {
            id: old.id,
            payload: old.payload,
            queue: old.queue.into(),
            state: old.state,
            priority: old.priority,
            timeout_ms: old.timeout_ms,
            visibility_timeout_ms: old.visibility_timeout_ms,
            retry: old.retry,
            attempt: old.attempt,
            created_at: old.created_at,
            scheduled_at: old.scheduled_at,
            expires_at: old.expires_at,
            enqueued_at: old.enqueued_at,
            run: JobRun {
                started_at: old.started_at,
                completed_at: old.completed_at,
                cancelled_at: old.cancelled_at,
                discarded_at: old.discarded_at,
                retry_at: old.retry_at,
                retry_delay_ms: old.retry_delay_ms,
                worker_id: old.worker_id,
                result: old.result,
                error: old.error.map(|report| *report),
                errors: old.errors,
                visibility_deadline: old.visibility_deadline,
                execution_deadline: old.execution_deadline,
                claim_visibility_ms: old.claim_visibility_ms,
            },
            extras: Box::default(),
        }
        .into()
    }
}

/// A cron evaluation as logged before jobs carried extras.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CronFireV1 {
    pub scheduled: Millis,
    pub missed: u32,
    pub skipped_gap: Option<Millis>,
    pub next_run_at: Option<Millis>,
    pub outcome: CronOutcomeV1,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CronOutcomeV1 {
    Enqueued { job: Box<JobV1>, cancelled: Option<JobId>, waits_for: Option<JobId> },
    Skipped { existing: JobId },
    QueuePaused,
}

impl From<CronFireV1> for CronFire {
    fn from(old: CronFireV1) -> CronFire {
        let outcome = match old.outcome {
            CronOutcomeV1::Enqueued { job, cancelled, waits_for } => {
                CronOutcome::Enqueued { job: Arc::new((*job).into()), cancelled, waits_for, replaced: Vec::new() }
            }
            CronOutcomeV1::Skipped { existing } => CronOutcome::Skipped { existing },
            CronOutcomeV1::QueuePaused => CronOutcome::QueuePaused,
        };
        CronFire {
            scheduled: old.scheduled,
            missed: old.missed,
            skipped_gap: old.skipped_gap,
            next_run_at: old.next_run_at,
            outcome,
        }
    }
}
