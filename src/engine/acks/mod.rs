//! Acks of several jobs in one request, and an ack that also fetches the
//! next jobs (docs/api.md, "Ack"): a busy worker's one durable round trip.
//!
//! The acks are decided and applied one by one, each on its own (a late
//! ack refused does not refuse the others), then the fetch runs in the same
//! turn, so they share one commit. A fetch that finds nothing may wait
//! (long polling) after its acks are applied: they are committed with
//! this turn, and answered when the fetch is.

use std::sync::Arc;

use super::api::{EngineError, FetchRequest};
use super::jobs::Fetch;
use super::requests::{RECORD_BYTES_PER_JOB, RECORD_FIXED_BYTES, Request, RunOutcome, Turn, sealed};
use crate::job::{Job, JobId};

/// The most acks one request may carry.
pub const ACKS_MAX: usize = 100;

/// One job to complete, with its result (compact JSON text).
#[derive(Debug, Clone, PartialEq)]
pub struct AckItem {
    pub id: JobId,
    pub result: Option<String>,
}

/// Completes jobs held by `worker_id` (or by anyone, when `None`), then
/// claims the next ones with `fetch`. With `fetch_unless_refused`, a fetch
/// only follows acks that all went through (the one-ack form: its caller
/// gets an error and must not be left holding claims it never saw).
pub struct AckMany {
    pub acks: Vec<AckItem>,
    pub worker_id: Option<String>,
    /// What to claim next, and how long to wait for it.
    pub fetch: Option<(FetchRequest, u64)>,
    pub fetch_unless_refused: bool,
    /// The acks' outcomes once applied (a request waiting for its fetch).
    acked: Option<Vec<Result<Arc<Job>, EngineError>>>,
}

impl AckMany {
    pub fn new(acks: Vec<AckItem>, worker_id: Option<String>, fetch: Option<(FetchRequest, u64)>) -> AckMany {
        AckMany { acks, worker_id, fetch, fetch_unless_refused: false, acked: None }
    }
}

/// What acks and their fetch came to: each ack's outcome, in order, and
/// the jobs claimed.
#[derive(Debug, Clone)]
pub struct AckOutcome {
    pub acked: Vec<Result<Arc<Job>, EngineError>>,
    pub jobs: Vec<Arc<Job>>,
}

impl sealed::Sealed for AckMany {}

impl AckMany {
    fn apply_acks(&mut self, turn: &mut Turn<'_>) {
        if self.acked.is_some() {
            return;
        }
        let worker = self.worker_id.clone();
        let outcomes = std::mem::take(&mut self.acks)
            .into_iter()
            .map(|AckItem { id, result }| {
                let record = turn.state().decide_ack(turn.now, id, result, worker.as_deref())?;
                turn.apply(record);
                Ok(turn.current(id))
            })
            .collect();
        self.acked = Some(outcomes);
    }

    fn fetch(&self) -> Option<Fetch> {
        let refused = self.acked.iter().flatten().any(Result::is_err);
        if self.fetch_unless_refused && refused {
            return None;
        }
        self.fetch.as_ref().map(|(request, wait_ms)| Fetch { request: request.clone(), wait_ms: *wait_ms })
    }

    fn outcome(&self, jobs: Vec<Arc<Job>>) -> AckOutcome {
        AckOutcome { acked: self.acked.clone().unwrap_or_default(), jobs }
    }
}

impl Request for AckMany {
    type Output = AckOutcome;

    fn run(mut self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        self.apply_acks(turn);
        let jobs = match self.fetch() {
            Some(fetch) => fetch.run(turn)?,
            None => Vec::new(),
        };
        Ok(self.outcome(jobs))
    }

    fn run_or_wait(mut self, turn: &mut Turn<'_>) -> RunOutcome<Self> {
        self.apply_acks(turn);
        let Some(fetch) = self.fetch() else { return RunOutcome::Done(Ok(self.outcome(Vec::new()))) };
        match fetch.run_or_wait(turn) {
            RunOutcome::Done(jobs) => RunOutcome::Done(jobs.map(|jobs| self.outcome(jobs))),
            RunOutcome::Wait { until, .. } => RunOutcome::Wait { request: self, until },
        }
    }

    fn full_disk_bytes(&self, turn: &Turn<'_>) -> Option<u64> {
        // Acks are always let through on a full disk (their room is kept);
        // the fetch takes what a fetch takes.
        let acks = self.acks.len() as u64 * RECORD_FIXED_BYTES + self.held_bytes();
        let fetch = match self.fetch() {
            Some(fetch) => fetch.full_disk_bytes(turn)?,
            None => 0,
        };
        Some(acks + fetch)
    }

    fn held_bytes(&self) -> u64 {
        let results: usize = self.acks.iter().map(|ack| ack.result.as_ref().map_or(0, String::len)).sum();
        let queues: usize = self.fetch.iter().flat_map(|(request, _)| &request.queues).map(String::len).sum();
        (results + queues) as u64 + self.acks.len() as u64 * RECORD_BYTES_PER_JOB
    }

    fn released(&self) -> Result<Self::Output, EngineError> {
        Ok(self.outcome(Vec::new()))
    }

    fn give_up(&self, turn: &Turn<'_>) -> bool {
        self.fetch().is_some_and(|fetch| fetch.give_up(turn))
    }

    fn waits_on(&self) -> &[String] {
        self.fetch.as_ref().map_or(&[], |(request, _)| &request.queues)
    }
}
