//! What each change of state does to one job (docs/api.md, "Job state
//! table"): the fields a claim, an ack, a failed attempt or a cancel sets
//! and clears. Every backend changes a job through these, so a job reads the
//! same whichever one holds it; the checks before a change and the events
//! after it stay with each backend.

use serde::{Deserialize, Serialize};

use super::{ErrorEntry, FailureReport, Job, JobId, JobState, NewJob, ValidationError};
use crate::clock::Millis;
use crate::limits::{CLIENT_ID_AHEAD_MS_MAX, ERROR_HISTORY_MAX};

/// What a failed attempt leads to.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum FailOutcome {
    /// `retryable` until `retry_at`.
    Retry { retry_at: Millis, delay_ms: u64 },
    /// `discarded`: exhausted or not retryable.
    Discard,
    /// Back to `available` at once; the released claim does not count (nack with requeue).
    Requeue,
    /// Back to `available` at once; the claim counts (visibility timeout).
    Release,
}

/// A new job as an enqueue admits it (rows 1–4): a client's id no more than
/// an hour ahead of the clock, its times resolved against `now` and in
/// order, its id (the client's, or `fresh_id`'s), and its first state
/// (`pending` when `staged` or asked for, `scheduled` when its time is
/// ahead, else `available`). Whether a client's id is already in use is
/// for the backend to check first.
pub fn admit(
    new_job: NewJob,
    now: Millis,
    staged: bool,
    fresh_id: impl FnOnce() -> JobId,
) -> Result<Job, ValidationError> {
    if new_job.id.is_some_and(|id| id.timestamp_ms() > now.saturating_add(CLIENT_ID_AHEAD_MS_MAX)) {
        return Err(ValidationError::payload(
            "id",
            "the id's timestamp is more than an hour ahead of the server's clock",
        )
        .with_reason("id_in_future"));
    }
    let scheduled_at = new_job.scheduled_at.map(|spec| spec.resolve(now));
    let expires_at = new_job.expires_at.map(|spec| spec.resolve(now));
    if let Some(expires) = expires_at {
        if expires <= now {
            return Err(ValidationError::payload("expires_at", "expires_at is already in the past")
                .with_reason("already_expired"));
        }
        if scheduled_at.is_some_and(|scheduled| expires <= scheduled) {
            return Err(ValidationError::payload("expires_at", "expires_at must be later than the scheduled time")
                .with_reason("expires_before_scheduled"));
        }
    }
    let id = new_job.id.unwrap_or_else(fresh_id);
    let state = if staged || new_job.pending {
        JobState::Pending
    } else if scheduled_at.is_some_and(|at| at > now) {
        JobState::Scheduled
    } else {
        JobState::Available
    };
    Ok(Job::accept(new_job, id, state, now, scheduled_at, expires_at))
}

/// Which claim deadline ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeoutKind {
    Visibility,
    Execution,
}

/// Why a worker's report on a job (ack, nack, heartbeat, progress) is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotHeld {
    /// The job is not `active`.
    NotActive,
    /// Another worker holds the claim.
    OtherWorker,
}

/// Whether `worker_id` may report on `job`: it must be active, and claimed by
/// that worker when both the claim and the report name one.
pub fn check_held(job: &Job, worker_id: Option<&str>) -> Result<(), NotHeld> {
    if job.state != JobState::Active {
        return Err(NotHeld::NotActive);
    }
    if let (Some(sender), Some(owner)) = (worker_id, job.run().worker_id.as_deref())
        && sender != owner
    {
        return Err(NotHeld::OtherWorker);
    }
    Ok(())
}

/// A claim (rows 9–12): the next attempt starts, held until the deadlines.
pub fn claim(
    job: &mut Job,
    at: Millis,
    worker_id: Option<String>,
    visibility_deadline: Millis,
    execution_deadline: Millis,
) {
    job.state = JobState::Active;
    job.attempt += 1;
    let run = job.run_mut();
    run.started_at = Some(at);
    run.worker_id = worker_id;
    run.visibility_deadline = Some(visibility_deadline);
    run.execution_deadline = Some(execution_deadline);
    run.claim_visibility_ms = (visibility_deadline - at).max(0) as u64;
    job.set_progress(None);
}

/// An ack (row 13): completed with the worker's result, the last error cleared.
pub fn complete(job: &mut Job, at: Millis, result: Option<String>) {
    job.state = JobState::Completed;
    let run = job.run_mut();
    run.completed_at = Some(at);
    run.result = result;
    run.error = None;
    clear_claim(job);
}

/// A failed attempt (rows 17–24): the error kept, then retried, discarded or
/// made available again as `outcome` says.
pub fn fail(job: &mut Job, at: Millis, report: &FailureReport, outcome: FailOutcome) {
    push_error(job, report.clone(), at);
    clear_claim(job);
    match outcome {
        FailOutcome::Retry { retry_at, delay_ms } => {
            job.state = JobState::Retryable;
            job.run_mut().retry_at = Some(retry_at);
            job.run_mut().retry_delay_ms = Some(delay_ms);
        }
        FailOutcome::Discard => {
            job.state = JobState::Discarded;
            job.run_mut().completed_at = Some(at);
            job.run_mut().discarded_at = Some(at);
        }
        FailOutcome::Requeue => {
            job.state = JobState::Available;
            job.attempt = job.attempt.saturating_sub(1);
            job.set_enqueued_at(Some(at));
        }
        FailOutcome::Release => {
            job.state = JobState::Available;
            job.set_enqueued_at(Some(at));
        }
    }
}

/// A heartbeat: the claim is held until `visibility_deadline`.
pub fn extend(job: &mut Job, visibility_deadline: Millis) {
    job.run_mut().visibility_deadline = Some(visibility_deadline);
}

/// How long a heartbeat extends a claim by, unless it says: the visibility
/// timeout the claim was made with, else the job's own.
pub fn claim_visibility_ms(job: &Job) -> u64 {
    match job.run().claim_visibility_ms {
        0 => u64::from(job.visibility_timeout_ms),
        ms => ms,
    }
}

/// When the claim of an active job runs out: the sooner of its deadlines.
pub fn claim_ends(job: &Job) -> Option<Millis> {
    let run = job.run();
    match (run.visibility_deadline, run.execution_deadline) {
        (Some(visibility), Some(execution)) => Some(visibility.min(execution)),
        (one, other) => one.or(other),
    }
}

/// The server-made failure report of a timed-out claim.
pub fn timeout_report(job: &Job, kind: TimeoutKind, at: Millis) -> FailureReport {
    match kind {
        TimeoutKind::Visibility => FailureReport::server(
            "visibility_timeout",
            "the worker's reservation ran out without ack, nack or heartbeat",
        ),
        TimeoutKind::Execution => {
            let elapsed = job.run().started_at.map_or(0, |started| at - started);
            let mut report =
                FailureReport::server("timeout", format!("the attempt ran longer than {} ms", job.timeout_ms));
            report.details = Some(format!("{{\"limit_ms\":{},\"elapsed_ms\":{elapsed}}}", job.timeout_ms));
            report
        }
    }
}

/// A scheduled or retryable job whose time came: available from `at`.
pub fn promote(job: &mut Job, at: Millis) {
    job.state = JobState::Available;
    job.set_enqueued_at(Some(at));
    if let Some(run) = job.run_if_any_mut() {
        run.retry_at = None;
    }
}

/// A `pending` job activated: `scheduled` until its time, else `available`
/// from `at` (docs/api.md, "Job state table").
pub fn activate(job: &mut Job, at: Millis) {
    if job.scheduled_at().is_some_and(|scheduled| scheduled > at) {
        job.state = JobState::Scheduled;
    } else {
        job.state = JobState::Available;
        job.set_enqueued_at(Some(at));
    }
    job.set_activated_at(at);
}

/// Back from the dead letter listing: available from `at` as a fresh run,
/// of the old one only the error history kept (docs/api.md, "Which times a
/// job carries"); no expiry, else an expired job would expire again at once.
pub fn revive(job: &mut Job, at: Millis) {
    job.state = JobState::Available;
    job.attempt = 0;
    job.set_enqueued_at(Some(at));
    job.set_expires_at(None);
    let errors = job.run_if_any_mut().map(|run| std::mem::take(&mut run.errors)).unwrap_or_default();
    *job.run_mut() = super::JobRun { errors, ..super::JobRun::default() };
}

/// An unclaimed job past its `expires_at`: discarded, with an `expired` error.
pub fn expire(job: &mut Job, at: Millis) {
    let report = FailureReport::server("expired", "the job expired before a worker claimed it");
    job.state = JobState::Discarded;
    job.run_mut().discarded_at = Some(at);
    job.run_mut().retry_at = None;
    push_error(job, report, at);
}

/// A cancel (rows 26–30): ended, any claim dropped.
pub fn cancel(job: &mut Job, at: Millis) {
    job.state = JobState::Cancelled;
    job.run_mut().cancelled_at = Some(at);
    job.run_mut().retry_at = None;
    clear_claim(job);
}

/// Drops the claim's deadlines (the worker id stays: who ran it last).
pub fn clear_claim(job: &mut Job) {
    if let Some(run) = job.run_if_any_mut() {
        run.visibility_deadline = None;
        run.execution_deadline = None;
        run.claim_visibility_ms = 0;
    }
}

/// Records a failure as the job's last error and in its history, which keeps
/// the newest [`ERROR_HISTORY_MAX`].
pub fn push_error(job: &mut Job, report: FailureReport, at: Millis) {
    let attempt = job.attempt;
    let run = job.run_mut();
    run.errors.push(ErrorEntry { report: report.clone(), attempt, occurred_at: at });
    if run.errors.len() > ERROR_HISTORY_MAX {
        run.errors.remove(0);
    }
    run.error = Some(report);
}
