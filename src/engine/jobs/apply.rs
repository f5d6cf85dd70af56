//! Applying job records to the state: one function per record kind, each
//! the transition of `job::transition` for every job the record names and
//! the events it tells of (docs/api.md, "Job state table").

use std::sync::Arc;

use super::record::{Claim, FailOutcome, JobRecord, TimeoutKind};
use crate::clock::Millis;
use crate::engine::events::{EventKind, EventSink};
use crate::engine::state::{ApplyError, State};
use crate::job::{FailureReport, Job, JobId, JobState, transition};
use crate::limits::DISPATCH_WINDOW_MS_MAX;

impl State {
    /// Applies one job record made at `at`.
    pub(in crate::engine) fn apply_job_record(
        &mut self,
        at: Millis,
        record: &JobRecord,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        match record {
            JobRecord::Enqueue { jobs, replaced } => self.apply_enqueue(at, jobs, replaced, events),
            JobRecord::Activate { id } => self.apply_activate(at, *id, events),
            JobRecord::Claim { worker_id, claims } => self.apply_claim(at, worker_id, claims, events),
            JobRecord::Ack { id, result } => self.apply_ack(at, *id, result, events),
            JobRecord::Fail { id, report, outcome } => self.apply_fail(at, *id, report, *outcome, events),
            JobRecord::Cancel { id } => self.cancel(at, *id, "api", events),
            JobRecord::Promote { ids } => self.apply_promote(at, ids),
            JobRecord::Expire { ids } => self.apply_expire(at, ids, events),
            JobRecord::Timeout { id, kind, outcome } => self.apply_timeout(at, *id, *kind, *outcome, events),
            JobRecord::DeadLetterRetry { id } => self.apply_dead_letter_retry(at, *id, events),
            JobRecord::Delete { id } => self.apply_delete(at, *id, events),
            JobRecord::Heartbeat { extensions } => self.apply_heartbeat(extensions),
            JobRecord::Prune { ids } => self.prune(ids),
            JobRecord::PruneCapped { ids } => {
                self.prune(ids)?;
                events.push_other(at, EventKind::Pruned { count: ids.len() as u64 });
                Ok(())
            }
        }
    }

    fn apply_enqueue(
        &mut self,
        at: Millis,
        jobs: &[Arc<Job>],
        replaced: &[JobId],
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        // Jobs a unique `replace` cancels: stored ones first, then any of
        // this same batch once it is stored.
        let (stored, in_batch): (Vec<JobId>, Vec<JobId>) = replaced.iter().partition(|id| self.jobs.contains_key(id));
        for id in stored {
            self.cancel(at, id, "unique_replace", events)?;
        }
        self.insert_new(at, jobs, events)?;
        for id in in_batch {
            self.cancel(at, id, "unique_replace", events)?;
        }
        Ok(())
    }

    /// Stages no longer: `available`, or `scheduled` until its time (docs/api.md, "Job state table", rows 8 and 9).
    fn apply_activate(&mut self, at: Millis, id: JobId, events: &mut EventSink) -> Result<(), ApplyError> {
        match self.jobs.get(&id) {
            Some(job) if job.state == JobState::Pending => {}
            Some(job) => return Err(ApplyError(format!("record activates job {id}, which is {}", job.state.as_str()))),
            None => return Err(ApplyError(format!("record activates unknown job {id}"))),
        }
        let job = self.update(id, |job| transition::activate(job, at))?;
        if job.state == JobState::Scheduled {
            events.push(at, EventKind::Scheduled, id);
        }
        Ok(())
    }

    pub(in crate::engine) fn insert_new(
        &mut self,
        at: Millis,
        jobs: &[Arc<Job>],
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        for job in jobs {
            // A fresh id is above every stored one: most need no lookup.
            if job.id <= self.highest_stored_id && self.jobs.contains_key(&job.id) {
                return Err(ApplyError(format!("record enqueues job {} twice", job.id)));
            }
            events.push(at, EventKind::Enqueued, job.id);
            if job.state == JobState::Scheduled {
                events.push(at, EventKind::Scheduled, job.id);
            }
            self.insert_loaded(job.clone());
        }
        Ok(())
    }

    fn apply_claim(
        &mut self,
        at: Millis,
        worker_id: &Option<String>,
        claims: &[Claim],
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        for claim in claims {
            let job = self.update(claim.id, |job| {
                transition::claim(job, at, worker_id.clone(), claim.visibility_deadline, claim.execution_deadline)
            })?;
            if let Some((limit, key)) = job.limit_and_key() {
                self.dispatch.claimed(key, limit, at);
                self.claims_since_forget += 1;
            }
            events.push(at, EventKind::Started, claim.id);
        }
        // Claims older than the longest window decide nothing: forget them
        // now and then, so keys used once do not stay forever.
        if self.claims_since_forget >= 4096 {
            self.claims_since_forget = 0;
            self.dispatch.forget_before(at, DISPATCH_WINDOW_MS_MAX);
        }
        Ok(())
    }

    fn apply_ack(
        &mut self,
        at: Millis,
        id: JobId,
        result: &Option<String>,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        self.update(id, |job| transition::complete(job, at, result.clone()))?;
        events.push(at, EventKind::Completed, id);
        Ok(())
    }

    fn apply_fail(
        &mut self,
        at: Millis,
        id: JobId,
        report: &FailureReport,
        outcome: FailOutcome,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        let attempt = self.jobs.get(&id).map_or(0, |job| job.attempt);
        self.update(id, |job| transition::fail(job, at, report, outcome))?;
        if outcome != FailOutcome::Requeue {
            events.push(at, EventKind::Failed { report: Box::new(report.clone()), attempt }, id);
        }
        push_outcome_event(events, at, id, report, outcome, "nack_requeue");
        Ok(())
    }

    /// Jobs whose time came. A job an earlier record of the same turn moved
    /// on (a chain step cancelled by its chain's failure) is left as it is.
    fn apply_promote(&mut self, at: Millis, ids: &[JobId]) -> Result<(), ApplyError> {
        for id in ids {
            if !self.jobs.get(id).is_some_and(|job| matches!(job.state, JobState::Scheduled | JobState::Retryable)) {
                continue;
            }
            self.update(*id, |job| transition::promote(job, at))?;
        }
        Ok(())
    }

    /// Unclaimed jobs past `expires_at`; as for promotions, a job that an
    /// earlier record of the turn ended or claimed is left as it is.
    fn apply_expire(&mut self, at: Millis, ids: &[JobId], events: &mut EventSink) -> Result<(), ApplyError> {
        for id in ids {
            let waiting = |job: &Job| {
                matches!(job.state, JobState::Scheduled | JobState::Retryable | JobState::Available | JobState::Pending)
            };
            if !self.jobs.get(id).is_some_and(waiting) {
                continue;
            }
            self.update(*id, |job| transition::expire(job, at))?;
            events.push(at, EventKind::Expired, *id);
            events.push(at, EventKind::Discarded { reason: "expired" }, *id);
        }
        Ok(())
    }

    fn apply_timeout(
        &mut self,
        at: Millis,
        id: JobId,
        kind: TimeoutKind,
        outcome: FailOutcome,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        let job = self.jobs.get(&id).ok_or_else(|| ApplyError(format!("record names unknown job {id}")))?;
        let report = transition::timeout_report(job, kind, at);
        let attempt = job.attempt;
        self.update(id, |job| transition::fail(job, at, &report, outcome))?;
        events.push(at, EventKind::Failed { report: Box::new(report.clone()), attempt }, id);
        push_outcome_event(events, at, id, &report, outcome, "visibility_timeout");
        Ok(())
    }

    /// A revived job starts a fresh run: of the old one only the error
    /// history stays (docs/api.md, "Which times a job carries").
    fn apply_dead_letter_retry(&mut self, at: Millis, id: JobId, events: &mut EventSink) -> Result<(), ApplyError> {
        self.update(id, |job| transition::revive(job, at))?;
        events.push(at, EventKind::Revived, id);
        Ok(())
    }

    fn apply_delete(&mut self, at: Millis, id: JobId, events: &mut EventSink) -> Result<(), ApplyError> {
        let job = self.jobs.remove(&id).ok_or_else(|| ApplyError(format!("record deletes unknown job {id}")))?;
        self.unindex_job(&job);
        events.push_gone(at, EventKind::Deleted, job);
        Ok(())
    }

    fn apply_heartbeat(&mut self, extensions: &[(JobId, Millis)]) -> Result<(), ApplyError> {
        for (id, deadline) in extensions {
            self.update(*id, |job| transition::extend(job, *deadline))?;
        }
        Ok(())
    }

    /// Removes terminal jobs for good.
    fn prune(&mut self, ids: &[JobId]) -> Result<(), ApplyError> {
        for id in ids {
            match self.jobs.get(id) {
                Some(job) if job.state.is_terminal() => {}
                Some(_) => return Err(ApplyError(format!("record prunes job {id}, which is not terminal"))),
                None => return Err(ApplyError(format!("record prunes unknown job {id}"))),
            }
            let job = self.jobs.remove(id).expect("checked above");
            self.unindex_job(&job);
        }
        Ok(())
    }
}

fn push_outcome_event(
    events: &mut EventSink,
    at: Millis,
    id: JobId,
    report: &FailureReport,
    outcome: FailOutcome,
    requeue_reason: &'static str,
) {
    events.push(at, EventKind::after_failure(report, outcome, requeue_reason), id);
}
