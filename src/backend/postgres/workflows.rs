//! Workflows on PostgreSQL (docs/postgres.md, "Workflows"): chains, groups
//! and batches in `svc_workflows`, moved on in the transaction that ends
//! one of their jobs.
//!
//! A workflow's row holds the whole workflow in svc's stored form (members
//! with how they ended, a batch's callbacks made at creation, its state).
//! Whatever ends a job of a workflow (an ack, a failure, a cancel, a claim
//! running out, a bulk action) moves it to the history through
//! [`PgJobs::move_to_history`], which locks the workflow's row and moves the
//! workflow on as the local engine does (docs/api.md, "Workflows"): the next
//! chain step becomes available, a failed step fails the chain and cancels
//! the steps still waiting, a batch fires its callbacks once every job
//! ended. Locks are taken jobs first (in id order), then workflows (by id).
//! Moving a workflow on can still lock a job after the workflow's row (the
//! next step, a callback), so a cancel or an ack can meet another
//! transaction in a circle; the database rolls one back, and it is run
//! again (`CONTENTION_TRIES`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use deadpool_postgres::Transaction;

use super::claims::{job_columns, job_of};
use super::enqueues::insert;
use super::jobs::{CONTENTION_TRIES, lock_in_flight, update_row};
use super::jobs::{PgJobs, database, duplicate_of, finished, finished_at, locked, move_rows, notify_available};
use super::sql::{Prepared, from_body, to_body};
use crate::backend::Page;
use crate::clock::Millis;
use crate::engine::{
    Callback, EngineError, EventKind, Member, MemberOutcome, Unavailable, Workflow, WorkflowEvent, WorkflowFailure,
    WorkflowState, is_failure,
};
use crate::job::{Job, JobExtra, JobId, JobState, OnConflict, WorkflowId, WorkflowRole, transition};
use crate::workflow::{WorkflowDefinition, WorkflowKind};

fn encode(workflow: &Workflow) -> Vec<u8> {
    to_body(workflow)
}

fn decode(id: &str, body: &[u8]) -> Result<Workflow, EngineError> {
    from_body("workflow", id, body)
}

/// The events of a change, each with its time and the job it is about.
type Events = Vec<(Millis, EventKind, Option<Job>)>;

fn workflow_event(at: Millis, id: WorkflowId, event: WorkflowEvent) -> (Millis, EventKind, Option<Job>) {
    (at, EventKind::Workflow { id, event: Box::new(event) }, None)
}

/// Ends a running workflow: completed, or failed by `failure`.
fn finish(workflow: &mut Workflow, at: Millis, failure: Option<WorkflowFailure>, events: &mut Events) {
    let event = workflow.finish(at, failure);
    events.push(workflow_event(at, workflow.id, event));
}

impl PgJobs {
    /// Creates a workflow with its jobs, all or nothing, checked as the
    /// local engine checks one: schemas, then each job as an enqueue would
    /// be (the jobs that start at once also against paused queues).
    pub async fn create_workflow(
        &self,
        now: Millis,
        definition: WorkflowDefinition,
    ) -> Result<WorkflowId, EngineError> {
        let members = definition.jobs.iter().enumerate().map(|(i, job)| (Some(i), job));
        let callbacks = definition.callbacks.iter().map(|(_, job)| (None, job));
        let named = members
            .chain(callbacks)
            .filter_map(|(index, job)| job.schema.as_deref().map(|uri| (index, uri, job.payload.args())));
        self.check_args(named.collect()).await?;

        let id = WorkflowId(self.fresh_id(now));
        let kind = definition.kind;
        let mut jobs = Vec::with_capacity(definition.jobs.len());
        let mut members = Vec::with_capacity(definition.jobs.len());
        for (index, new_job) in definition.jobs.into_iter().enumerate() {
            let starts_now = kind != WorkflowKind::Chain || index == 0;
            let mut job = transition::admit(new_job, now, !starts_now, || self.fresh_id(now))
                .map_err(|error| EngineError::Invalid { error, index: Some(index) })?;
            job.push_extra(JobExtra::Workflow { id, role: WorkflowRole::Member(index as u32) });
            members.push(Member::of(&job));
            jobs.push(job);
        }
        let mut callbacks = Vec::with_capacity(definition.callbacks.len());
        for (callback, new_job) in definition.callbacks {
            let mut job = transition::admit(new_job, now, true, || self.fresh_id(now))
                .map_err(|error| EngineError::Invalid { error, index: None })?;
            job.push_extra(JobExtra::Workflow { id, role: WorkflowRole::Callback(callback) });
            callbacks.push(Callback { kind: callback, job: Arc::new(job), fired: false, outcome: None });
        }
        let workflow = Workflow::running(id, definition.name, kind, members, callbacks, now);

        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let mut queues: Vec<&str> = jobs.iter().map(|job| job.queue.as_str()).collect();
        queues.sort_unstable();
        queues.dedup();
        let paused: HashSet<String> = transaction
            .rows(
                "WITH known AS (INSERT INTO svc_queues (name) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING) \
                 SELECT name FROM svc_queues WHERE name = ANY($1) AND paused",
                &[&queues],
            )
            .await
            .map_err(database)?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let starting =
            jobs.iter().position(|job| job.state != JobState::Pending && paused.contains(job.queue.as_str()));
        if let Some(index) = starting {
            return Err(EngineError::QueuePaused { queue: jobs[index].queue.to_string(), index: Some(index) });
        }
        let ids: Vec<String> = jobs.iter().map(|job| job.id.to_string()).collect();
        let taken: HashSet<String> = transaction
            .rows(
                "SELECT id::text AS id_text FROM svc_jobs WHERE id = ANY($1::text[]::uuid[]) \
                 UNION ALL SELECT id::text AS id_text FROM svc_job_history WHERE id = ANY($1::text[]::uuid[])",
                &[&ids],
            )
            .await
            .map_err(database)?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let mut seen = HashSet::new();
        if let Some(index) = ids.iter().position(|id| taken.contains(id) || !seen.insert(id)) {
            return Err(EngineError::Duplicate { id: jobs[index].id, index: Some(index) });
        }
        let replaced = unique_members(&transaction, now, &jobs).await?;
        transaction
            .run(
                "INSERT INTO svc_workflows (id, state, created_at, body) \
                 VALUES ($1::text::uuid, 'running', to_timestamp($2::int8::float8 / 1000), $3)",
                &[&id.to_string(), &now, &encode(&workflow)],
            )
            .await
            .map_err(database)?;
        if let Err(error) = insert(&transaction, &jobs).await {
            return Err(match duplicate_of(&error, &ids) {
                Some(index) => EngineError::Duplicate { id: jobs[index].id, index: Some(index) },
                None => database(error),
            });
        }
        notify_available(&transaction, &jobs).await?;
        self.cancel_replaced(&transaction, now, &replaced).await?;
        let started = WorkflowEvent::Started {
            name: workflow.name.clone(),
            workflow_type: kind.as_str(),
            jobs_total: workflow.members.len(),
        };
        let mut events = vec![workflow_event(now, id, started)];
        for job in &jobs {
            events.push((now, EventKind::Enqueued, Some(job.clone())));
            if job.state == JobState::Scheduled {
                events.push((now, EventKind::Scheduled, Some(job.clone())));
            }
        }
        self.append_events(&transaction, events).await?;
        transaction.commit().await.map_err(database)?;
        Ok(id)
    }

    async fn append_events(&self, transaction: &Transaction<'_>, events: Events) -> Result<(), EngineError> {
        let events: Vec<_> =
            events.iter().map(|(at, kind, job)| (self.fresh_id(*at), *at, kind.clone(), job.as_ref())).collect();
        super::events::append(transaction, &events).await.map_err(database)
    }

    pub async fn workflow(&self, id: WorkflowId) -> Result<Option<Arc<Workflow>>, EngineError> {
        let key = id.to_string();
        let client = self.client().await?;
        let row = client
            .maybe_row("SELECT body FROM svc_workflows WHERE id = $1::text::uuid", &[&key])
            .await
            .map_err(database)?;
        row.map(|row| decode(&key, row.get(0)).map(Arc::new)).transpose()
    }

    /// Workflows by id (oldest first) after `after`, running and ended ones
    /// still kept.
    pub async fn workflows_page(
        &self,
        after: Option<WorkflowId>,
        limit: usize,
    ) -> Result<Page<Arc<Workflow>>, EngineError> {
        let client = self.client().await?;
        let rows = client
            .rows(
                "SELECT id::text AS id_text, body FROM svc_workflows \
                 WHERE id > coalesce($1::text::uuid, '00000000-0000-0000-0000-000000000000'::uuid) \
                 ORDER BY id LIMIT $2",
                &[&after.map(|id| id.to_string()), &(limit as i64 + 1)],
            )
            .await
            .map_err(database)?;
        let has_more = rows.len() > limit;
        let workflows = rows.iter().take(limit).map(|row| decode(row.get(0), row.get(1)).map(Arc::new));
        Ok((workflows.collect::<Result<_, _>>()?, has_more))
    }

    /// Cancels a running workflow and every job of it not yet ended
    /// (callbacks fired included); callbacks not fired never will.
    pub async fn cancel_workflow(&self, now: Millis, id: WorkflowId) -> Result<(), EngineError> {
        let contention = EngineError::Unavailable { reason: Unavailable::Contention };
        for _ in 0..CONTENTION_TRIES {
            // A deadlock the database broke by rolling the cancel back (an
            // ack moving the workflow on takes a job after the workflow's
            // row): nothing was changed, so it is tried again.
            match self.try_cancel_workflow(now, id).await {
                Ok(true) => return Ok(()),
                Ok(false) => continue,
                Err(error) if error == contention => continue,
                Err(error) => return Err(error),
            }
        }
        Err(contention)
    }

    /// One try at cancelling: `false` when a batch callback fired between
    /// the first read of the workflow and the lock of its row. Its job was
    /// not locked first, and locking it after the workflow's row could wait
    /// in a circle with an ack, so the try is rolled back to start over.
    async fn try_cancel_workflow(&self, now: Millis, id: WorkflowId) -> Result<bool, EngineError> {
        let key = id.to_string();
        let Some(current) = self.workflow(id).await? else { return Err(EngineError::WorkflowNotFound { id }) };
        if current.state.is_terminal() {
            return Err(EngineError::WorkflowConflict { id, current_state: current.state });
        }
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        // Jobs first, then the workflow: the order an ack takes them in.
        let first_read = live_jobs(&current);
        let mut jobs = lock_in_flight(&transaction, &first_read).await?;
        let row = transaction
            .maybe_row("SELECT body FROM svc_workflows WHERE id = $1::text::uuid FOR UPDATE", &[&key])
            .await
            .map_err(database)?
            .ok_or(EngineError::WorkflowNotFound { id })?;
        let mut workflow = decode(&key, row.get(0))?;
        if workflow.state.is_terminal() {
            return Err(EngineError::WorkflowConflict { id, current_state: workflow.state });
        }
        let first_read: HashSet<String> = first_read.into_iter().collect();
        let live: HashSet<String> = live_jobs(&workflow).into_iter().collect();
        if !live.is_subset(&first_read) {
            return Ok(false);
        }
        jobs.retain(|job| live.contains(&job.id.to_string()));
        workflow.state = WorkflowState::Cancelled;
        workflow.ended_at = Some(now);
        let mut events = vec![workflow_event(now, id, WorkflowEvent::Cancelled { jobs_cancelled: jobs.len() })];
        for job in &mut jobs {
            let previous_state = job.state;
            transition::cancel(job, now);
            events.push((now, EventKind::Cancelled { previous_state, reason: "workflow_cancel" }, Some(job.clone())));
            record_outcome(&mut workflow, job);
        }
        move_rows(&transaction, &jobs.iter().collect::<Vec<_>>()).await?;
        store_workflow(&transaction, &workflow).await?;
        self.append_events(&transaction, events).await?;
        transaction.commit().await.map_err(database)?;
        Ok(true)
    }

    /// Jobs of workflows ended (in the caller's transaction, their rows
    /// already moved): records how, and moves each workflow on.
    pub(super) async fn workflow_jobs_ended(
        &self,
        transaction: &Transaction<'_>,
        jobs: &[&Job],
    ) -> Result<(), EngineError> {
        let mut ended: VecDeque<Job> = jobs
            .iter()
            .filter(|job| job.state.is_terminal() && job.workflow().is_some())
            .map(|job| (*job).clone())
            .collect();
        let mut keys: Vec<String> =
            ended.iter().filter_map(|job| job.workflow()).map(|(id, _)| id.to_string()).collect();
        keys.sort_unstable();
        keys.dedup();
        let rows = transaction
            .rows(
                "SELECT id::text AS id_text, body FROM svc_workflows WHERE id = ANY($1::text[]::uuid[]) \
                 ORDER BY id FOR UPDATE",
                &[&keys],
            )
            .await
            .map_err(database)?;
        let mut workflows = HashMap::with_capacity(rows.len());
        for row in rows {
            let workflow = decode(row.get(0), row.get(1))?;
            workflows.insert(workflow.id, workflow);
        }
        let mut events = Events::new();
        let mut changed = HashSet::new();
        while let Some(job) = ended.pop_front() {
            let Some((id, role)) = job.workflow() else { continue };
            let Some(workflow) = workflows.get_mut(&id) else { continue };
            changed.insert(id);
            let at = finished_at(&job);
            let running = !workflow.state.is_terminal();
            if !record_outcome(workflow, &job) || !running {
                continue;
            }
            match role {
                WorkflowRole::Member(index) => {
                    let index = index as usize;
                    if !is_failure(job.state) {
                        let steps_remaining = workflow.members.iter().filter(|member| member.outcome.is_none()).count();
                        let completed = WorkflowEvent::StepCompleted {
                            index,
                            job_id: job.id,
                            job_type: job.payload.job_type().to_owned(),
                            steps_remaining,
                        };
                        events.push(workflow_event(at, id, completed));
                    }
                    match workflow.kind {
                        WorkflowKind::Chain => {
                            let cancelled = self.chain_step_ended(transaction, workflow, index, &job, at, &mut events);
                            ended.extend(cancelled.await?);
                        }
                        WorkflowKind::Group | WorkflowKind::Batch => {
                            self.member_of_many_ended(transaction, workflow, &job, at, &mut events).await?;
                        }
                    }
                }
                WorkflowRole::Callback(_) => {
                    let mut fired = workflow.callbacks.iter().filter(|callback| callback.fired);
                    if fired.clone().any(|callback| callback.outcome.is_none()) {
                        continue;
                    }
                    let failed = fired.find(|callback| callback.outcome.is_some_and(is_failure));
                    let failure = match failed.map(|callback| callback.job.id) {
                        Some(job_id) => Some(self.failure_of(transaction, None, job_id, &job).await?),
                        None => None,
                    };
                    finish(workflow, at, failure, &mut events);
                }
            }
        }
        for id in changed {
            store_workflow(transaction, &workflows[&id]).await?;
        }
        self.append_events(transaction, events).await
    }

    /// A chain step ended: the next one starts, or the chain completes, or
    /// (a failed step) the chain fails and its waiting steps are cancelled.
    /// Answers the steps cancelled, whose ends are recorded in turn.
    async fn chain_step_ended(
        &self,
        transaction: &Transaction<'_>,
        workflow: &mut Workflow,
        index: usize,
        job: &Job,
        at: Millis,
        events: &mut Events,
    ) -> Result<Vec<Job>, EngineError> {
        if is_failure(job.state) {
            let failure = WorkflowFailure { index: Some(index as u32), job_id: job.id, error: job.run().error.clone() };
            finish(workflow, at, Some(failure), events);
            let waiting: Vec<String> = workflow
                .members
                .iter()
                .filter(|member| member.outcome.is_none())
                .map(|member| member.job_id.to_string())
                .collect();
            let rows = transaction
                .rows(
                    concat!(
                        "SELECT ",
                        job_columns!(),
                        " FROM svc_jobs WHERE id = ANY($1::text[]::uuid[]) AND state = 'pending' ORDER BY id FOR UPDATE"
                    ),
                    &[&waiting],
                )
                .await
                .map_err(database)?;
            let mut cancelled = rows.iter().map(job_of).collect::<Result<Vec<_>, _>>()?;
            for step in &mut cancelled {
                transition::cancel(step, at);
                let kind = EventKind::Cancelled { previous_state: JobState::Pending, reason: "workflow_failed" };
                events.push((at, kind, Some(step.clone())));
            }
            move_rows(transaction, &cancelled.iter().collect::<Vec<_>>()).await?;
            return Ok(cancelled);
        }
        match workflow.members.get(index + 1) {
            Some(next) => {
                if let Some(mut step) = locked(transaction, next.job_id).await?
                    && step.state == JobState::Pending
                {
                    transition::activate(&mut step, at);
                    update_row(transaction, &step).await?;
                    notify_available(transaction, std::slice::from_ref(&step)).await?;
                    if step.state == JobState::Scheduled {
                        events.push((at, EventKind::Scheduled, Some(step)));
                    }
                }
            }
            None => finish(workflow, at, None, events),
        }
        Ok(Vec::new())
    }

    /// A group's or batch's job ended: once all have, a group ends and a
    /// batch fires its callbacks.
    async fn member_of_many_ended(
        &self,
        transaction: &Transaction<'_>,
        workflow: &mut Workflow,
        job: &Job,
        at: Millis,
        events: &mut Events,
    ) -> Result<(), EngineError> {
        if workflow.members.iter().any(|member| member.outcome.is_none()) {
            return Ok(());
        }
        let first_failed = workflow.first_failed_member();
        let failure = match first_failed {
            Some((index, job_id)) => Some(self.failure_of(transaction, Some(index), job_id, job).await?),
            None => None,
        };
        if workflow.kind == WorkflowKind::Group {
            finish(workflow, at, failure, events);
            return Ok(());
        }
        let any_failed = failure.is_some();
        let mut fired = Vec::new();
        for callback in workflow.callbacks.iter_mut().filter(|callback| callback.fires(any_failed)) {
            callback.fired = true;
            fired.push((callback.kind, callback.fired_job(at)));
        }
        if fired.is_empty() {
            finish(workflow, at, failure, events);
            return Ok(());
        }
        let jobs: Vec<Job> = fired.iter().map(|(_, job)| job.clone()).collect();
        insert(transaction, &jobs).await.map_err(database)?;
        notify_available(transaction, &jobs).await?;
        for job in &jobs {
            events.push((at, EventKind::Enqueued, Some(job.clone())));
            if job.state == JobState::Scheduled {
                events.push((at, EventKind::Scheduled, Some(job.clone())));
            }
        }
        for (kind, job) in &fired {
            let event = WorkflowEvent::CallbackFired { callback: kind.as_str(), job_id: job.id };
            events.push(workflow_event(at, workflow.id, event));
        }
        Ok(())
    }

    /// What failed a workflow: the job `job_id`'s last error (read from the
    /// history unless it is `ending`, the job ending now).
    async fn failure_of(
        &self,
        transaction: &Transaction<'_>,
        index: Option<u32>,
        job_id: JobId,
        ending: &Job,
    ) -> Result<WorkflowFailure, EngineError> {
        let error = if ending.id == job_id {
            ending.run().error.clone()
        } else {
            finished(transaction, job_id).await?.and_then(|job| job.run().error.clone())
        };
        Ok(WorkflowFailure { index, job_id, error })
    }

    /// Drops ended workflows past their retention, and the oldest past the
    /// count the retention keeps (the leader's housekeeping).
    pub async fn prune_workflows(&self, now: Millis, retention: &crate::engine::Retention) -> Result<u64, EngineError> {
        let client = self.client().await?;
        let cutoff = now.saturating_sub(retention.workflows_ms);
        let kept = i64::try_from(retention.max_terminal_workflows).unwrap_or(i64::MAX);
        let old = client
            .run("DELETE FROM svc_workflows WHERE ended_at < to_timestamp($1::int8::float8 / 1000)", &[&cutoff])
            .await
            .map_err(database)?;
        // Past the count kept: those that ended before the last one kept.
        // The time of that one is read from the index alone; ones that
        // ended in the same millisecond as it are kept with it.
        let over = if kept == 0 {
            client.run("DELETE FROM svc_workflows WHERE ended_at IS NOT NULL", &[]).await
        } else {
            client
                .run(
                    "DELETE FROM svc_workflows WHERE ended_at < (SELECT ended_at FROM svc_workflows \
                     WHERE ended_at IS NOT NULL ORDER BY ended_at DESC OFFSET $1 LIMIT 1)",
                    &[&(kept - 1)],
                )
                .await
        };
        let over = over.map_err(database)?;
        Ok(old + over)
    }
}

/// Checks the unique policies of a new workflow's members, as the local
/// engine does: a workflow cannot adopt a job it did not make, so `reject`
/// and `ignore` both refuse the creation, and `replace` gives the holders
/// up (answered, to be cancelled); nor can it give up a member of its own,
/// so two members with one fingerprint refuse it whatever the policy.
async fn unique_members(transaction: &Transaction<'_>, now: Millis, jobs: &[Job]) -> Result<Vec<JobId>, EngineError> {
    let stored = super::unique::lock_and_read_holders(transaction, jobs.iter()).await?;
    let mut replaced = HashSet::new();
    let mut members: Vec<Arc<Job>> = Vec::new();
    for (index, job) in jobs.iter().enumerate() {
        let candidates = stored.iter().chain(&members);
        if let Some((on_conflict, holders)) = super::unique::blocking(job, now, candidates, &replaced) {
            let own = holders.iter().find(|holder| members.iter().any(|member| member.id == holder.id));
            let refused = own.or(holders.first().filter(|_| on_conflict != OnConflict::Replace));
            if let Some(holder) = refused {
                let key = job.unique().expect("a job with a unique policy").1;
                let (existing, existing_state) = (holder.id, holder.state);
                return Err(EngineError::UniqueConflict { existing, existing_state, key, index: Some(index) });
            }
            replaced.extend(holders.iter().map(|holder| holder.id));
        }
        if job.unique().is_some() {
            members.push(Arc::new(job.clone()));
        }
    }
    Ok(replaced.into_iter().collect())
}

/// The jobs of a workflow that have not ended as far as it knows: members,
/// and callbacks fired (a job sent back from the dead letter listing after
/// it ended runs on its own).
fn live_jobs(workflow: &Workflow) -> Vec<String> {
    let members = workflow.members.iter().filter(|member| member.outcome.is_none()).map(|member| member.job_id);
    let fired = workflow.callbacks.iter().filter(|callback| callback.fired && callback.outcome.is_none());
    members.chain(fired.map(|callback| callback.job.id)).map(|id| id.to_string()).collect()
}

/// Records how a job of `workflow` first ended; `false` when it had ended
/// before (one sent back from the dead letter listing runs detached). An
/// ended workflow keeps no results.
fn record_outcome(workflow: &mut Workflow, job: &Job) -> bool {
    let running = !workflow.state.is_terminal();
    match job.workflow() {
        Some((_, WorkflowRole::Member(index))) => {
            let Some(member) = workflow.members.get_mut(index as usize) else { return false };
            if member.outcome.is_some() {
                return false;
            }
            let result = if running { job.run().result.as_deref().map(Arc::from) } else { None };
            member.outcome = Some(MemberOutcome { state: job.state, result });
            true
        }
        Some((_, WorkflowRole::Callback(kind))) => {
            let Some(callback) = workflow.callbacks.iter_mut().find(|callback| callback.kind == kind) else {
                return false;
            };
            if callback.outcome.is_some() {
                return false;
            }
            callback.outcome = Some(job.state);
            true
        }
        None => false,
    }
}

async fn store_workflow(transaction: &Transaction<'_>, workflow: &Workflow) -> Result<(), EngineError> {
    transaction
        .run(
            "UPDATE svc_workflows SET state = $2, ended_at = to_timestamp($3::int8::float8 / 1000), body = $4 \
             WHERE id = $1::text::uuid",
            &[&workflow.id.to_string(), &workflow.state.as_str(), &workflow.ended_at, &encode(workflow)],
        )
        .await
        .map_err(database)?;
    Ok(())
}
