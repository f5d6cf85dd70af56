//! [`State::check_invariants`]: every job sits in exactly the structures its
//! state implies and carries exactly the times its state implies.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::super::workflows::table::Workflow;
use super::State;
use crate::job::{DispatchLimit, Job, JobId, JobState, UniqueKey};

impl State {
    /// Checks that every job sits in exactly the structures its state implies.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut counts: BTreeMap<&str, [u64; 8]> = BTreeMap::new();
        let mut live = 0;
        let mut with_deadline = 0;
        for job in self.jobs.values() {
            let id = job.id;
            counts.entry(job.queue.as_str()).or_default()[job.state.index()] += 1;
            if !job.state.is_terminal() {
                live += 1;
            }
            let queue = self
                .queues
                .get(job.queue.as_str())
                .ok_or_else(|| format!("job {id} in unknown queue {}", job.queue))?;
            let in_ready = match job.dispatch_key() {
                Some(key) => queue.limited.contains(key, &Self::ready_key(job)),
                None => queue.ready.contains(&Self::ready_key(job)),
            };
            if in_ready != (job.state == JobState::Available) {
                return Err(format!("job {id} is {} but in_ready={in_ready}", job.state.as_str()));
            }
            if let Some(deadline) = self.deadline_of(job) {
                with_deadline += 1;
                if !self.timers.contains(deadline, id) {
                    return Err(format!("job {id} has deadline {deadline} but no timer"));
                }
            }
            times_fit_state(job)?;
            if (job.state == JobState::Active) != job.run().visibility_deadline.is_some() {
                return Err(format!(
                    "job {id} is {} with visibility deadline {:?}",
                    job.state.as_str(),
                    job.run().visibility_deadline
                ));
            }
        }
        let indexed: usize = self.active_by_worker.values().map(|ids| ids.len()).sum();
        let claimed =
            self.jobs.values().filter(|job| job.state == JobState::Active && job.run().worker_id.is_some()).count();
        if indexed != claimed {
            return Err(format!("{indexed} jobs indexed by worker, {claimed} active jobs with a worker"));
        }
        if with_deadline != self.timers.len() {
            return Err(format!("{} timers for {with_deadline} jobs with deadlines", self.timers.len()));
        }
        if live != self.live_jobs {
            return Err(format!("live count {} but {live} live jobs", self.live_jobs));
        }
        let live_bytes: u64 =
            self.jobs.values().filter(|job| !job.state.is_terminal()).map(|job| job.held_bytes()).sum();
        if live_bytes != self.live_bytes {
            return Err(format!("live bytes {} but live jobs hold {live_bytes}", self.live_bytes));
        }
        let terminal: Vec<&Job> = self.jobs.values().filter(|job| job.state.is_terminal()).collect();
        let terminal_bytes: u64 = terminal.iter().map(|job| job.held_bytes()).sum();
        if terminal.len() != self.terminal.len() || terminal_bytes != self.terminal_bytes {
            return Err(format!(
                "{} terminal jobs of {terminal_bytes} bytes, indexed {} of {} bytes",
                terminal.len(),
                self.terminal.len(),
                self.terminal_bytes
            ));
        }
        if let Some(job) =
            terminal.iter().find(|job| Self::terminal_key(job).is_none_or(|key| !self.terminal.contains(&key)))
        {
            return Err(format!("terminal job {} is not in the pruning order", job.id));
        }
        let mut unique: HashMap<UniqueKey, Vec<JobId>> = HashMap::new();
        let mut active: HashMap<&str, u32> = HashMap::new();
        let mut rates: HashMap<(&str, u32), u32> = HashMap::new();
        for job in self.jobs.values().filter(|job| !job.state.is_terminal()) {
            if let Some((_, key)) = job.unique() {
                unique.entry(key).or_default().push(job.id);
            }
            if let Some((DispatchLimit { rate: Some(rate), .. }, key)) = job.limit_and_key() {
                *rates.entry((key, rate.count)).or_default() += 1;
            }
            if job.state == JobState::Active
                && let Some(key) = job.dispatch_key()
            {
                *active.entry(key).or_default() += 1;
            }
        }
        unique.values_mut().for_each(|ids| ids.sort());
        let ended: Vec<&Arc<Workflow>> =
            self.workflows.values().filter(|workflow| workflow.state.is_terminal()).collect();
        let ended_bytes: u64 = ended.iter().map(|workflow| workflow.held_bytes()).sum();
        if ended.len() != self.terminal_workflows.len() || ended_bytes != self.terminal_workflow_bytes {
            return Err(format!(
                "{} ended workflows of {ended_bytes} bytes, indexed {} of {} bytes",
                ended.len(),
                self.terminal_workflows.len(),
                self.terminal_workflow_bytes
            ));
        }
        if unique != self.unique_index {
            return Err("the unique index does not match the live jobs' unique keys".to_string());
        }
        let indexed: HashMap<&str, u32> = self.dispatch.active_counts().collect();
        if indexed != active {
            return Err(format!("dispatch keys count {indexed:?} active jobs, jobs say {active:?}"));
        }
        let indexed: HashMap<(&str, u32), u32> = self.dispatch.live_rates().collect();
        if indexed != rates {
            return Err(format!("dispatch keys hold rates {indexed:?} of live jobs, jobs say {rates:?}"));
        }
        self.crons.check_invariants()?;
        for (previous, waiting) in &self.crons.waiters {
            if self.jobs.get(previous).is_none_or(|job| job.state.is_terminal()) {
                return Err(format!("cron run {waiting} waits on {previous}, which has ended"));
            }
        }
        for (name, queue) in &self.queues {
            let expected = counts.get(name.as_str()).copied().unwrap_or_default();
            if queue.counts != expected {
                return Err(format!("queue {name} counts {:?}, jobs say {expected:?}", queue.counts));
            }
            let ready = (queue.ready.len() + queue.limited.len()) as u64;
            if ready != expected[JobState::Available.index()] {
                return Err(format!("queue {name} ready order holds {ready} jobs"));
            }
        }
        Ok(())
    }
}

/// The times a job carries in its state (docs/api.md, "Which times a job
/// carries"): each end time only in its own end state, `completed_at` also
/// on a job a failed attempt discarded, `retry_at` only while `retryable`,
/// and `started_at` once the run was claimed, never while it waits for its
/// first claim.
fn times_fit_state(job: &Job) -> Result<(), String> {
    let run = job.run();
    let state = job.state;
    let completed_fits = match state {
        JobState::Completed => run.completed_at.is_some(),
        JobState::Discarded => run.completed_at.is_none_or(|at| Some(at) == run.discarded_at),
        _ => run.completed_at.is_none(),
    };
    // A requeue gives the attempt back but not the claim's `started_at`.
    let started_fits = match run.started_at {
        Some(_) => !matches!(state, JobState::Pending | JobState::Scheduled),
        None => job.attempt == 0,
    };
    let enqueued_fits = match state {
        JobState::Pending | JobState::Scheduled => job.enqueued_at().is_none(),
        JobState::Available | JobState::Active | JobState::Retryable | JobState::Completed => {
            job.enqueued_at().is_some()
        }
        JobState::Discarded | JobState::Cancelled => true,
    };
    if !completed_fits
        || !started_fits
        || !enqueued_fits
        || run.cancelled_at.is_some() != (state == JobState::Cancelled)
        || run.discarded_at.is_some() != (state == JobState::Discarded)
        || run.retry_at.is_some() != (state == JobState::Retryable)
    {
        return Err(format!("job {} is {} with times {run:?}", job.id, state.as_str()));
    }
    Ok(())
}
