//! Workflows in the engine (docs/api.md, "Workflows"): deciding a creation
//! and a cancel, and, as records are applied, moving a workflow on when one
//! of its jobs ends: the next chain step, a batch's callbacks, the
//! workflow's own end. Everything here is state: logged as decided records
//! (the callbacks' jobs, ids included, are in the creation record), in the
//! snapshot, and replayed exactly, so a crash never fires a callback twice
//! or activates a step twice.
//!
//! The feature is here: the requests, their decisions, their records
//! (`record.rs`), how those apply, and the workflow as held (`table.rs`).
//! Parsing a definition is `crate::workflow`'s.

pub(super) mod record;
pub(crate) mod table;

use std::sync::Arc;

use super::api::{EngineError, Unavailable};
use super::events::{EventKind, EventSink, WorkflowEvent};
use super::jobs::decide::Entropy;
use super::record::Logged;
use super::requests::{RECORD_BYTES_PER_JOB, RECORD_FIXED_BYTES, Request, Turn, sealed};
use super::state::{ApplyError, State};
use crate::clock::Millis;
use crate::job::{Job, JobExtra, JobId, JobIdSet, JobState, OnConflict, WorkflowId, WorkflowRole};
use crate::workflow::{WorkflowDefinition, WorkflowKind};
use record::{WorkflowCancel, WorkflowCreate, WorkflowPrune, WorkflowRecord};
use table::{Callback, Member, MemberOutcome, Workflow, WorkflowFailure, WorkflowState, is_failure};

/// Creates a workflow with its jobs, all or nothing; answers its id.
pub struct CreateWorkflow {
    pub definition: WorkflowDefinition,
}

impl sealed::Sealed for CreateWorkflow {}

impl Request for CreateWorkflow {
    type Output = WorkflowId;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let now = turn.now;
        let (state, entropy) = turn.state_and_entropy();
        let (record, id) = state.decide_workflow_create(now, self.definition, entropy)?;
        turn.apply(record);
        Ok(id)
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        None
    }

    fn held_bytes(&self) -> u64 {
        let definition = &self.definition;
        let jobs = definition.jobs.iter().chain(definition.callbacks.iter().map(|(_, job)| job));
        jobs.map(|job| {
            let payload = &job.payload;
            std::mem::size_of::<crate::job::NewJob>()
                + job.queue.len()
                + payload.job_type().len()
                + payload.args().len()
                + payload.meta().len()
        })
        .sum::<usize>() as u64
    }
}

/// Cancels a running workflow and every job of it not yet ended.
pub struct CancelWorkflow {
    pub id: WorkflowId,
}

impl sealed::Sealed for CancelWorkflow {}

impl Request for CancelWorkflow {
    type Output = ();

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let record = turn.state().decide_workflow_cancel(turn.now, self.id)?;
        turn.apply(record);
        Ok(())
    }

    fn full_disk_bytes(&self, turn: &Turn<'_>) -> Option<u64> {
        let jobs =
            turn.state().workflow(self.id).map_or(0, |workflow| workflow.members.len() + workflow.callbacks.len());
        Some(RECORD_FIXED_BYTES + jobs as u64 * RECORD_BYTES_PER_JOB)
    }
}

impl State {
    /// Decides a creation: every job checked as an enqueue would be (the
    /// ones that start at once also against paused queues), all or nothing.
    pub fn decide_workflow_create(
        &mut self,
        now: Millis,
        definition: WorkflowDefinition,
        entropy: &mut dyn Entropy,
    ) -> Result<(Logged, WorkflowId), EngineError> {
        if !self.has_room_for(definition.jobs.len()) {
            return Err(EngineError::Unavailable { reason: Unavailable::Capacity });
        }
        let mut seen = JobIdSet::default();
        let id = WorkflowId(self.fresh_id(now, entropy, &seen));
        seen.insert(id.0);
        let kind = definition.kind;
        let mut jobs: Vec<Arc<Job>> = Vec::with_capacity(definition.jobs.len());
        let mut members = Vec::with_capacity(definition.jobs.len());
        let mut replaced = Vec::new();
        for (index, new_job) in definition.jobs.into_iter().enumerate() {
            let starts_now = kind != WorkflowKind::Chain || index == 0;
            if starts_now && self.queue(&new_job.queue).is_some_and(|queue| queue.paused) {
                return Err(EngineError::QueuePaused { queue: new_job.queue.to_string(), index: Some(index) });
            }
            let mut job = self.admit(now, new_job, Some(index), &mut seen, entropy, !starts_now)?;
            // A workflow cannot adopt a job it did not make: `reject` and
            // `ignore` both refuse the creation; `replace` cancels the holders.
            // Nor can it cancel a member of its own: two members with one key
            // refuse the creation, whatever the policy.
            if let Some((on_conflict, holders)) = self.unique_holders(&job, now, &jobs, &replaced) {
                let own = holders.iter().find(|holder| jobs.iter().any(|member| member.id == **holder));
                if let Some(own) = own {
                    return Err(self.unique_conflict(&job, *own, &jobs, Some(index)));
                }
                if on_conflict != OnConflict::Replace {
                    return Err(self.unique_conflict(&job, holders[0], &jobs, Some(index)));
                }
                replaced.extend(holders);
            }
            job.push_extra(JobExtra::Workflow { id, role: WorkflowRole::Member(index as u32) });
            members.push(Member::of(&job));
            jobs.push(Arc::new(job));
        }
        let mut callbacks = Vec::with_capacity(definition.callbacks.len());
        for (callback, new_job) in definition.callbacks {
            let mut job = self.admit(now, new_job, None, &mut seen, entropy, true)?;
            job.push_extra(JobExtra::Workflow { id, role: WorkflowRole::Callback(callback) });
            callbacks.push(Callback { kind: callback, job: Arc::new(job), fired: false, outcome: None });
        }
        let workflow = Workflow::running(id, definition.name, kind, members, callbacks, now);
        Ok((Logged::new(now, WorkflowCreate { workflow: Arc::new(workflow), jobs, replaced }), id))
    }

    /// Decides a cancel: 404 for an unknown workflow, 409 for an ended one.
    pub fn decide_workflow_cancel(&self, now: Millis, id: WorkflowId) -> Result<Logged, EngineError> {
        let workflow = self.workflow(id).ok_or(EngineError::WorkflowNotFound { id })?;
        if workflow.state.is_terminal() {
            return Err(EngineError::WorkflowConflict { id, current_state: workflow.state });
        }
        Ok(Logged::new(now, WorkflowCancel { id }))
    }

    pub(super) fn apply_workflow_record(
        &mut self,
        at: Millis,
        record: &WorkflowRecord,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        match record {
            WorkflowRecord::Create(WorkflowCreate { workflow, jobs, replaced }) => {
                self.apply_workflow_create(at, workflow, jobs, replaced, events)
            }
            WorkflowRecord::Cancel(WorkflowCancel { id }) => self.apply_workflow_cancel(at, *id, events),
            WorkflowRecord::Prune(WorkflowPrune { ids }) => self.apply_workflow_prune(ids),
        }
    }

    fn apply_workflow_create(
        &mut self,
        at: Millis,
        workflow: &Arc<Workflow>,
        jobs: &[Arc<Job>],
        replaced: &[JobId],
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        if self.workflows.contains_key(&workflow.id) {
            return Err(ApplyError(format!("record creates workflow {} twice", workflow.id)));
        }
        // The generator moves past the workflow's id and its callbacks' (not
        // stored as jobs until they fire), as it does past every stored job's,
        // so a replayed log never hands them out again.
        self.ids.observe(workflow.id.0);
        for callback in &workflow.callbacks {
            self.ids.observe(callback.job.id);
        }
        self.highest_stored_id = self.highest_stored_id.max(workflow.id.0);
        self.workflows.insert(workflow.id, workflow.clone());
        let started = WorkflowEvent::Started {
            name: workflow.name.clone(),
            workflow_type: workflow.kind.as_str(),
            jobs_total: workflow.members.len(),
        };
        events.push_other(at, EventKind::Workflow { id: workflow.id, event: Box::new(started) });
        for id in replaced {
            if self.job(*id).is_some_and(|job| !job.state.is_terminal()) {
                self.cancel(at, *id, "unique_replace", events)?;
            }
        }
        self.insert_new(at, jobs, events)
    }

    /// Cancels a running workflow: every job of it not yet ended, callbacks
    /// fired included; callbacks not fired never will.
    fn apply_workflow_cancel(&mut self, at: Millis, id: WorkflowId, events: &mut EventSink) -> Result<(), ApplyError> {
        let workflow =
            self.workflows.get(&id).ok_or_else(|| ApplyError(format!("record cancels unknown workflow {id}")))?;
        if workflow.state.is_terminal() {
            return Err(ApplyError(format!("record cancels workflow {id}, which has ended")));
        }
        // A job whose end the workflow already recorded is no longer its to
        // cancel: one sent back from the dead letter listing runs on its own.
        let live: Vec<JobId> = workflow
            .members
            .iter()
            .filter(|member| member.outcome.is_none())
            .map(|member| member.job_id)
            .chain(
                workflow
                    .callbacks
                    .iter()
                    .filter(|callback| callback.fired && callback.outcome.is_none())
                    .map(|callback| callback.job.id),
            )
            .filter(|job| self.job(*job).is_some_and(|job| !job.state.is_terminal()))
            .collect();
        self.cancel_running(id, at);
        let cancelled = WorkflowEvent::Cancelled { jobs_cancelled: live.len() };
        events.push_other(at, EventKind::Workflow { id, event: Box::new(cancelled) });
        for job in live {
            self.cancel(at, job, "workflow_cancel", events)?;
        }
        Ok(())
    }

    /// Removes ended workflows for good.
    fn apply_workflow_prune(&mut self, ids: &[WorkflowId]) -> Result<(), ApplyError> {
        for id in ids {
            let workflow =
                self.workflows.remove(id).ok_or_else(|| ApplyError(format!("record prunes unknown workflow {id}")))?;
            let ended_at =
                workflow.ended_at.ok_or_else(|| ApplyError(format!("record prunes running workflow {id}")))?;
            self.terminal_workflows.remove(&(ended_at, *id));
            self.terminal_workflow_bytes -= workflow.held_bytes();
        }
        Ok(())
    }

    /// A job of a workflow ended (the first time): records how, and moves
    /// the workflow on (docs/api.md, "Workflows", execution table).
    pub(super) fn workflow_job_ended(
        &mut self,
        at: Millis,
        job_id: JobId,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        let Some(job) = self.job_handle(job_id) else { return Ok(()) };
        let Some((id, role)) = job.workflow() else { return Ok(()) };
        let Some(workflow) = self.workflows.update(&id) else { return Ok(()) };
        match role {
            WorkflowRole::Member(index) => {
                let index = index as usize;
                let Some(member) = workflow.members.get_mut(index) else { return Ok(()) };
                if member.outcome.is_some() {
                    // Ended again after a dead-letter retry: it runs detached.
                    return Ok(());
                }
                if workflow.state.is_terminal() {
                    // Nothing waits for its result any more, and an ended
                    // workflow keeps its size.
                    member.outcome = Some(MemberOutcome { state: job.state, result: None });
                    return Ok(());
                }
                member.outcome =
                    Some(MemberOutcome { state: job.state, result: job.run().result.as_deref().map(Arc::from) });
                if !is_failure(job.state) {
                    let steps_remaining = workflow.members.iter().filter(|member| member.outcome.is_none()).count();
                    let completed = WorkflowEvent::StepCompleted {
                        index,
                        job_id,
                        job_type: job.payload.job_type().to_owned(),
                        steps_remaining,
                    };
                    events.push_other(at, EventKind::Workflow { id, event: Box::new(completed) });
                }
                match workflow.kind {
                    WorkflowKind::Chain => self.chain_step_ended(at, id, index, &job, events),
                    WorkflowKind::Group | WorkflowKind::Batch => self.member_of_many_ended(at, id, events),
                }
            }
            WorkflowRole::Callback(kind) => {
                let Some(callback) = workflow.callbacks.iter_mut().find(|callback| callback.kind == kind) else {
                    return Ok(());
                };
                if callback.outcome.is_some() {
                    return Ok(());
                }
                callback.outcome = Some(job.state);
                if workflow.state.is_terminal() {
                    return Ok(());
                }
                let mut fired = workflow.callbacks.iter().filter(|callback| callback.fired);
                if fired.clone().any(|callback| callback.outcome.is_none()) {
                    return Ok(());
                }
                let failed =
                    fired.find(|callback| callback.outcome.is_some_and(is_failure)).map(|callback| callback.job.id);
                let failure = failed.map(|job_id| WorkflowFailure {
                    index: None,
                    job_id,
                    error: self.job(job_id).and_then(|job| job.run().error.clone()),
                });
                self.finish(at, id, failure, events);
                Ok(())
            }
        }
    }

    /// A chain step ended: the next one starts, or the chain completes, or
    /// (a failed step) the chain fails and its later steps are cancelled.
    fn chain_step_ended(
        &mut self,
        at: Millis,
        id: WorkflowId,
        index: usize,
        job: &Job,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        let workflow = self.workflows.get(&id).expect("a known workflow").clone();
        if is_failure(job.state) {
            let failure = WorkflowFailure { index: Some(index as u32), job_id: job.id, error: job.run().error.clone() };
            self.finish(at, id, Some(failure), events);
            // Steps still waiting will never start. (A step before a failed
            // one can only still run when a later step was cancelled
            // directly; it runs to its end.)
            for member in &workflow.members {
                if self.job(member.job_id).is_some_and(|job| job.state == JobState::Pending) {
                    self.cancel(at, member.job_id, "workflow_failed", events)?;
                }
            }
            return Ok(());
        }
        match workflow.members.get(index + 1) {
            Some(next) if self.job(next.job_id).is_some_and(|job| job.state == JobState::Pending) => {
                let started = self.update(next.job_id, |job| crate::job::transition::activate(job, at))?;
                if started.state == JobState::Scheduled {
                    events.push(at, EventKind::Scheduled, started.id);
                }
            }
            Some(_) => {}
            None => self.finish(at, id, None, events),
        }
        Ok(())
    }

    /// A group's or batch's job ended: once all have, a group ends and a
    /// batch fires its callbacks.
    fn member_of_many_ended(&mut self, at: Millis, id: WorkflowId, events: &mut EventSink) -> Result<(), ApplyError> {
        let workflow = self.workflows.get(&id).expect("a known workflow").clone();
        if workflow.members.iter().any(|member| member.outcome.is_none()) {
            return Ok(());
        }
        let failure = workflow.first_failed_member().map(|(index, job_id)| WorkflowFailure {
            index: Some(index),
            job_id,
            error: self.job(job_id).and_then(|job| job.run().error.clone()),
        });
        if workflow.kind == WorkflowKind::Group {
            self.finish(at, id, failure, events);
            return Ok(());
        }
        let any_failed = failure.is_some();
        if !workflow.callbacks.iter().any(|callback| callback.fires(any_failed)) {
            self.finish(at, id, failure, events);
            return Ok(());
        }
        let workflow = self.workflows.update(&id).expect("looked up above");
        let fired: Vec<Arc<Job>> = workflow
            .callbacks
            .iter_mut()
            .filter(|callback| callback.fires(any_failed))
            .map(|callback| {
                callback.fired = true;
                Arc::new(callback.fired_job(at))
            })
            .collect();
        self.insert_new(at, &fired, events)?;
        for job in &fired {
            if let Some((_, WorkflowRole::Callback(callback))) = job.workflow() {
                let event = WorkflowEvent::CallbackFired { callback: callback.as_str(), job_id: job.id };
                events.push_other(at, EventKind::Workflow { id, event: Box::new(event) });
            }
        }
        Ok(())
    }

    /// Ends a running workflow: completed, or failed by `failure`.
    fn finish(&mut self, at: Millis, id: WorkflowId, failure: Option<WorkflowFailure>, events: &mut EventSink) {
        let workflow = self.workflows.update(&id).expect("a known workflow");
        let event = workflow.finish(at, failure);
        self.terminal_workflow_bytes += workflow.held_bytes();
        self.terminal_workflows.insert((at, id));
        events.push_other(at, EventKind::Workflow { id, event: Box::new(event) });
    }

    /// Ends a running workflow as cancelled.
    fn cancel_running(&mut self, id: WorkflowId, at: Millis) {
        let workflow = self.workflows.update(&id).expect("a known workflow");
        workflow.state = WorkflowState::Cancelled;
        workflow.ended_at = Some(at);
        self.terminal_workflow_bytes += workflow.held_bytes();
        self.terminal_workflows.insert((at, id));
    }

    /// Ended workflows past their retention, or over the caps (oldest
    /// first), at most `limit`.
    pub fn decide_workflow_prune(&self, now: Millis, limit: usize) -> Option<Logged> {
        let retention = self.retention();
        let (mut count, mut bytes) = (self.terminal_workflows.len(), self.terminal_workflow_bytes);
        let mut ids = Vec::new();
        for (ended_at, id) in &self.terminal_workflows {
            let over = count > retention.max_terminal_workflows || bytes > retention.max_terminal_workflow_bytes;
            if ids.len() >= limit || !(over || ended_at.saturating_add(retention.workflows_ms) <= now) {
                break;
            }
            count -= 1;
            bytes -= self.workflows.get(id).map_or(0, |workflow| workflow.held_bytes());
            ids.push(*id);
        }
        (!ids.is_empty()).then(|| Logged::new(now, WorkflowPrune { ids }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::record::decode_batch;

    #[test]
    fn records_of_the_first_format_read_as_they_were_written() {
        // Kinds 23 and 24 (docs/wal-format.md), then the fields in order:
        // 5 as a zigzag varint, then an id (a u128 varint) or a list of them.
        let cancel = Logged::new(5, WorkflowCancel { id: WorkflowId(JobId(3)) });
        assert_eq!(decode_batch(&[1, 23, 10, 3]).unwrap(), [cancel]);
        let prune = Logged::new(5, WorkflowPrune { ids: vec![WorkflowId(JobId(3)), WorkflowId(JobId(4))] });
        assert_eq!(decode_batch(&[1, 24, 10, 2, 3, 4]).unwrap(), [prune]);
    }
}
