//! Jobs (docs/api.md, "Jobs", "Workers", "Dead letter"): enqueue, fetch,
//! ack, fail, cancel, heartbeat, activate, and the dead letter listing's
//! retry and delete.
//!
//! The requests are here, their decisions in `decide.rs`, their records in
//! `record.rs` and how the state applies them in `apply.rs`; the job map
//! the read view shares is `job_table.rs`.

mod apply;
pub mod bulk;
pub(super) mod decide;
pub mod listing;
pub(super) mod record;

use std::sync::Arc;

use super::api::{Cancelled, EngineError, Enqueued, FetchRequest, HeartbeatOutcome};
use super::requests::{RECORD_BYTES_PER_JOB, RECORD_FIXED_BYTES, Request, RunOutcome, Turn, sealed};
use super::workers::entry::WorkerSignal;
use crate::job::{FailureReport, Job, JobId, NewJob};
use decide::EnqueueSlot;

/// With the disk full, claims stop while this much log space is left, so
/// that the jobs already claimed can still be acked.
const FULL_DISK_ACK_RESERVE_BYTES: u64 = 1024 * 1024;

macro_rules! sealed {
    ($($request:ty),* $(,)?) => {
        $(impl sealed::Sealed for $request {})*
    };
}

sealed!(Enqueue, Fetch, Ack, Fail, Cancel, Heartbeat, DeadLetterRetry, DeadLetterDelete, Activate);

/// Activates a staged (`pending`) job: `available`, or `scheduled` until its time.
pub struct Activate {
    pub id: JobId,
}

impl Request for Activate {
    type Output = Arc<Job>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let record = turn.state().decide_activate(turn.now, self.id)?;
        turn.apply(record);
        Ok(turn.current(self.id))
    }
}

/// Enqueues jobs atomically: all of them or none.
pub struct Enqueue {
    pub jobs: Vec<NewJob>,
}

impl Request for Enqueue {
    type Output = Vec<Enqueued>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let now = turn.now;
        let (state, entropy) = turn.state_and_entropy();
        let (record, slots) = state.decide_enqueue(now, self.jobs, entropy)?;
        if let Some(record) = record {
            turn.apply(record);
        }
        let bounded = turn.state().bounded_queues() > 0;
        Ok(slots
            .into_iter()
            .map(|slot| {
                let (id, deduplicated) = match slot {
                    EnqueueSlot::New(id) => (id, false),
                    EnqueueSlot::Existing(id) => (id, true),
                };
                let job = turn.current(id);
                let pressure = if bounded { turn.state().queue_pressure(&job.queue) } else { None };
                Enqueued { job, deduplicated, pressure }
            })
            .collect())
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        None
    }

    fn held_bytes(&self) -> u64 {
        self.jobs
            .iter()
            .map(|job| {
                let payload = &job.payload;
                std::mem::size_of::<NewJob>()
                    + job.queue.len()
                    + payload.job_type().len()
                    + payload.args().len()
                    + payload.meta().len()
                    + payload.tags().iter().map(String::len).sum::<usize>()
                    + payload.extra().iter().map(|(key, value)| key.len() + value.len()).sum::<usize>()
            })
            .sum::<usize>() as u64
    }
}

/// Claims up to `count` available jobs from the listed queues. A draining
/// engine, or a worker told to go quiet or terminate, gets none. With
/// `wait_ms`, a fetch that finds nothing waits up to that long for a job to
/// appear in one of its queues (long polling).
pub struct Fetch {
    pub request: FetchRequest,
    pub wait_ms: u64,
}

impl Fetch {
    /// Told to stop: the engine drains, or the worker was signalled.
    fn stopped(&self, turn: &Turn<'_>) -> bool {
        *turn.draining
            || self.request.worker_id.as_deref().is_some_and(|worker| turn.state().worker_signal(worker).is_some())
    }
}

impl Request for Fetch {
    type Output = Vec<Arc<Job>>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let now = turn.now;
        let request = self.request;
        let signalled = request.worker_id.as_deref().is_some_and(|worker| {
            turn.touch_worker(worker, false);
            turn.note_worker_queues(worker, &request.queues);
            turn.state().worker_signal(worker).is_some()
        });
        if signalled || *turn.draining {
            return Ok(Vec::new());
        }
        let Some((record, ids)) = turn.state().decide_fetch(now, &request) else { return Ok(Vec::new()) };
        turn.apply(record);
        Ok(ids.into_iter().map(|id| turn.current(id)).collect())
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        let claims = self.request.count as u64 * RECORD_BYTES_PER_JOB;
        let worker = self.request.worker_id.as_ref().map_or(0, |id| id.len() as u64);
        // Claims also set aside room for the acks they will need (for the
        // rest of the turn; the next turn measures the space again).
        Some(RECORD_FIXED_BYTES + claims + worker + FULL_DISK_ACK_RESERVE_BYTES)
    }

    fn held_bytes(&self) -> u64 {
        self.request.queues.iter().map(String::len).sum::<usize>() as u64
    }

    fn run_or_wait(self, turn: &mut Turn<'_>) -> RunOutcome<Self> {
        if self.wait_ms == 0 {
            return RunOutcome::Done(self.run(turn));
        }
        let wait_ms = self.wait_ms;
        let again = Fetch { request: self.request.clone(), wait_ms };
        match self.run(turn) {
            Ok(jobs) if jobs.is_empty() && !again.stopped(turn) => {
                RunOutcome::Wait { request: again, until: turn.now.saturating_add(wait_ms as i64) }
            }
            outcome => RunOutcome::Done(outcome),
        }
    }

    fn released(&self) -> Result<Self::Output, EngineError> {
        Ok(Vec::new())
    }

    fn give_up(&self, turn: &Turn<'_>) -> bool {
        self.stopped(turn)
    }

    fn waits_on(&self) -> &[String] {
        &self.request.queues
    }
}

/// Completes an active job; `result` is compact JSON text.
pub struct Ack {
    pub id: JobId,
    pub result: Option<String>,
    pub worker_id: Option<String>,
}

impl Request for Ack {
    type Output = Arc<Job>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let record = turn.state().decide_ack(turn.now, self.id, self.result, self.worker_id.as_deref())?;
        turn.apply(record);
        Ok(turn.current(self.id))
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        Some(RECORD_FIXED_BYTES + self.held_bytes())
    }

    fn held_bytes(&self) -> u64 {
        self.result.as_ref().map_or(0, String::len) as u64
    }
}

/// Reports a failed attempt; the retry policy decides what follows (or,
/// with `requeue`, the job goes back at once and the attempt does not count).
pub struct Fail {
    pub id: JobId,
    pub report: FailureReport,
    pub requeue: bool,
    pub worker_id: Option<String>,
}

impl Request for Fail {
    type Output = Arc<Job>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let now = turn.now;
        let worker = self.worker_id.as_deref();
        let (state, entropy) = turn.state_and_entropy();
        let record = state.decide_fail(now, self.id, self.report, self.requeue, worker, entropy)?;
        turn.apply(record);
        Ok(turn.current(self.id))
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        Some(RECORD_FIXED_BYTES + self.held_bytes())
    }

    fn held_bytes(&self) -> u64 {
        self.report.held_bytes() as u64
    }
}

/// Cancels a job that has not ended (again: no change, same answer).
pub struct Cancel {
    pub id: JobId,
}

impl Request for Cancel {
    type Output = Cancelled;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let record = turn.state().decide_cancel(turn.now, self.id)?;
        let previous_state = turn.current(self.id).state;
        if let Some(record) = record {
            turn.apply(record);
        }
        Ok(Cancelled { job: turn.current(self.id), previous_state })
    }
}

/// Extends the claims of a worker's active jobs (the listed ones, or all).
pub struct Heartbeat {
    pub worker_id: String,
    pub active_jobs: Option<Vec<JobId>>,
    pub visibility_timeout_ms: Option<u64>,
}

impl Request for Heartbeat {
    type Output = HeartbeatOutcome;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let now = turn.now;
        turn.touch_worker(&self.worker_id, true);
        let signal = turn.state().worker_signal(&self.worker_id).map(|(signal, _)| signal);
        let listed = self.active_jobs.as_deref();
        let (record, not_extended) =
            turn.state().decide_heartbeat(now, &self.worker_id, listed, self.visibility_timeout_ms);
        let extended = match &record {
            Some((_, extended)) => *extended,
            None => 0,
        };
        if let Some((record, _)) = record {
            turn.apply(record);
        }
        let signal = if *turn.draining { Some(WorkerSignal::Terminate) } else { signal };
        Ok(HeartbeatOutcome { extended, not_extended, signal })
    }

    fn full_disk_bytes(&self, turn: &Turn<'_>) -> Option<u64> {
        let listed = match &self.active_jobs {
            Some(ids) => ids.len(),
            None => turn.state().active_of_worker(&self.worker_id).len(),
        };
        Some(RECORD_FIXED_BYTES + listed as u64 * RECORD_BYTES_PER_JOB)
    }

    fn held_bytes(&self) -> u64 {
        self.active_jobs.as_ref().map_or(0, |ids| ids.len() * std::mem::size_of::<JobId>()) as u64
    }
}

/// Sends a discarded job back to `available` with its attempts reset.
pub struct DeadLetterRetry {
    pub id: JobId,
}

impl Request for DeadLetterRetry {
    type Output = Arc<Job>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let record = turn.state().decide_dead_letter_retry(turn.now, self.id)?;
        turn.apply(record);
        Ok(turn.current(self.id))
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        None
    }
}

/// Removes a discarded job for good.
pub struct DeadLetterDelete {
    pub id: JobId,
}

impl Request for DeadLetterDelete {
    type Output = ();

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let record = turn.state().decide_dead_letter_delete(turn.now, self.id)?;
        turn.apply(record);
        Ok(())
    }
}
