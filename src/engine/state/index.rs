//! Where each job sits: its queue's counts and ready order, the timers, the
//! pruning order of terminal jobs, the unique and dispatch indexes and the
//! active jobs by worker, kept in step with its state (`index_job`,
//! `unindex_job`).

use std::sync::Arc;

use super::{QueueState, State, TerminalKey};
use crate::clock::Millis;
use crate::job::{Exhaustion, Job, JobState};
use crate::schedule::ReadyKey;

impl State {
    /// Notes that a queue's figures changed, for the next view update.
    pub(super) fn queue_changed(dirty_queues: &mut Vec<String>, name: &str, queue: &mut QueueState) {
        if !queue.dirty {
            queue.dirty = true;
            dirty_queues.push(name.to_string());
        }
    }

    /// The earliest deadline this job waits for in its current state.
    pub fn deadline_of(&self, job: &Job) -> Option<Millis> {
        let earliest = |a: Option<Millis>, b: Option<Millis>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match job.state {
            JobState::Scheduled => earliest(job.scheduled_at(), job.expires_at()),
            JobState::Retryable => earliest(job.run().retry_at, job.expires_at()),
            JobState::Available | JobState::Pending => job.expires_at(),
            JobState::Active => earliest(job.run().visibility_deadline, job.run().execution_deadline),
            JobState::Completed => job.run().completed_at.map(|at| at.saturating_add(self.retention.completed_ms)),
            JobState::Cancelled => job.run().cancelled_at.map(|at| at.saturating_add(self.retention.cancelled_ms)),
            JobState::Discarded => {
                let keep = match job.retry.on_exhaustion {
                    Exhaustion::DeadLetter => self.retention.dead_letter_ms,
                    Exhaustion::Discard => self.retention.discarded_ms,
                };
                job.run().discarded_at.map(|at| at.saturating_add(keep))
            }
        }
    }

    /// Where a terminal job stands in the caps' pruning order; `None` for a live job.
    pub(super) fn terminal_key(job: &Job) -> Option<TerminalKey> {
        let ended_at = match job.state {
            JobState::Completed => job.run().completed_at,
            JobState::Cancelled => job.run().cancelled_at,
            JobState::Discarded => job.run().discarded_at,
            _ => return None,
        };
        // Every discarded job is in the dead letter listing, where an operator
        // looks for what failed: they go last.
        let dead_letter = job.state == JobState::Discarded;
        Some((dead_letter, ended_at.unwrap_or(job.created_at), job.id))
    }

    pub(super) fn ready_key(job: &Job) -> ReadyKey {
        ReadyKey::new(i32::from(job.priority), job.enqueued_at().unwrap_or(job.created_at), job.id)
    }

    /// Puts a job into the structures its state implies.
    pub(super) fn index_job(&mut self, job: &Job) {
        // The name is copied only when the queue is new.
        if !self.queues.contains_key(job.queue.as_str()) {
            self.queues.insert(job.queue.to_string(), QueueState::default());
        }
        let queue = self.queues.get_mut(job.queue.as_str()).expect("inserted above");
        queue.counts[job.state.index()] += 1;
        if job.state == JobState::Available {
            match job.dispatch_key() {
                Some(key) => queue.limited.push(key, Self::ready_key(job)),
                None => queue.ready.push(Self::ready_key(job)),
            }
        }
        Self::queue_changed(&mut self.dirty_queues, &job.queue, queue);
        if !job.state.is_terminal() {
            self.live_jobs += 1;
            self.live_bytes += job.held_bytes();
            if let Some((_, key)) = job.unique() {
                let holders = self.unique_index.entry(key).or_default();
                let at = holders.partition_point(|id| *id < job.id);
                holders.insert(at, job.id);
            }
            if let Some((limit, key)) = job.limit_and_key() {
                self.dispatch.rate_held(key, limit);
            }
        }
        if job.state == JobState::Active
            && let Some(key) = job.dispatch_key()
        {
            self.dispatch.activated(key);
        }
        if let Some(key) = Self::terminal_key(job) {
            self.terminal.insert(key);
            self.terminal_bytes += job.held_bytes();
        }
        if let (JobState::Active, Some(worker)) = (job.state, &job.run().worker_id) {
            self.active_by_worker.entry(worker.clone()).or_default().insert(job.id);
            self.dirty_workers.insert(worker.clone());
        }
        if let Some(deadline) = self.deadline_of(job) {
            self.timers.insert(deadline, job.id);
        }
    }

    /// Takes a job out of every structure (the reverse of `index_job`).
    pub(in crate::engine) fn unindex_job(&mut self, job: &Job) {
        if let Some(deadline) = self.deadline_of(job) {
            self.timers.remove(deadline, job.id);
        }
        if !job.state.is_terminal() {
            self.live_jobs -= 1;
            self.live_bytes -= job.held_bytes();
            if let Some((limit, key)) = job.limit_and_key() {
                self.dispatch.rate_released(key, limit);
            }
            if let Some((_, key)) = job.unique()
                && let Some(holders) = self.unique_index.get_mut(&key)
            {
                holders.retain(|id| *id != job.id);
                if holders.is_empty() {
                    self.unique_index.remove(&key);
                }
            }
        }
        if job.state == JobState::Active
            && let Some(key) = job.dispatch_key()
        {
            self.dispatch.deactivated(key);
        }
        if let Some(key) = Self::terminal_key(job) {
            self.terminal.remove(&key);
            self.terminal_bytes -= job.held_bytes();
        }
        if let (JobState::Active, Some(worker)) = (job.state, &job.run().worker_id)
            && let Some(active) = self.active_by_worker.get_mut(worker)
        {
            self.dirty_workers.insert(worker.clone());
            active.remove(&job.id);
            if active.is_empty() {
                self.active_by_worker.remove(worker);
            }
        }
        if let Some(queue) = self.queues.get_mut(job.queue.as_str()) {
            queue.counts[job.state.index()] -= 1;
            if job.state == JobState::Available {
                match job.dispatch_key() {
                    Some(key) => queue.limited.remove(key, &Self::ready_key(job)),
                    None => queue.ready.remove(&Self::ready_key(job)),
                };
            }
            Self::queue_changed(&mut self.dirty_queues, &job.queue, queue);
            if queue.is_empty() && job.queue != "default" {
                self.queues.remove(job.queue.as_str());
            }
        }
    }

    /// Adds a job (new, or loaded from a snapshot).
    pub(in crate::engine) fn insert_loaded(&mut self, job: Arc<Job>) {
        self.note_loaded(&job);
        self.jobs.insert(job);
    }

    /// Everything adding a job does but storing it in the job table.
    pub(super) fn note_loaded(&mut self, job: &Arc<Job>) {
        self.ids.observe(job.id);
        self.highest_stored_id = self.highest_stored_id.max(job.id);
        let times =
            [job.created_at, job.enqueued_at().unwrap_or(Millis::MIN), job.run().started_at.unwrap_or(Millis::MIN)];
        let ended = [job.run().completed_at, job.run().cancelled_at, job.run().discarded_at]
            .map(|at| at.unwrap_or(Millis::MIN));
        self.latest_at = times.into_iter().chain(ended).fold(self.latest_at, Millis::max);
        self.index_job(job);
    }
}
