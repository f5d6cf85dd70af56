//! What the engine reads of the state, and what changed since the read
//! view was last updated (`take_dirty_*`, which a commit copies out).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use super::super::cron::table::CronTable;
use super::super::view::QueueSummary;
use super::super::workers::entry::WorkerSignal;
use super::super::workflows::table::Workflow;
use super::{QueueState, Retention, State};
use crate::clock::Millis;
use crate::job::{Job, JobId, UniqueKey, WorkflowId};

impl State {
    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id)
    }

    /// A new reference to a job, to keep or hand out.
    pub fn job_handle(&self, id: JobId) -> Option<Arc<Job>> {
        self.jobs.handle(&id)
    }

    /// The latest time the state holds: the engine's clock starts no earlier.
    pub fn latest_at(&self) -> Millis {
        self.latest_at
    }

    pub fn live_jobs(&self) -> usize {
        self.live_jobs
    }

    /// The bytes live jobs hold ([`Job::held_bytes`]).
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Sets the bytes of live jobs past which new jobs are refused (`limits.max_live_bytes`).
    pub fn set_max_live_bytes(&mut self, max: u64) {
        self.max_live_bytes = max;
    }

    /// Whether `count` more live jobs may be taken: fewer than
    /// [`LIVE_JOBS_MAX`](crate::limits::LIVE_JOBS_MAX) in all, and the live
    /// jobs below `max_live_bytes` (a request may cross it by its own size).
    pub fn has_room_for(&self, count: usize) -> bool {
        self.live_jobs + count <= crate::limits::LIVE_JOBS_MAX && self.live_bytes < self.max_live_bytes
    }

    pub fn queue(&self, name: &str) -> Option<&QueueState> {
        self.queues.get(name)
    }

    /// How many queues have backpressure set.
    pub fn bounded_queues(&self) -> usize {
        self.bounded_queues
    }

    /// How full a queue with backpressure is, once past its warning threshold.
    pub fn queue_pressure(&self, name: &str) -> Option<f64> {
        let queue = self.queues.get(name)?;
        queue.backpressure?.pressure(queue.depth())
    }

    /// A queue's figures now (all zero for a queue that holds nothing).
    pub fn queue_summary(&self, name: &str) -> QueueSummary {
        match self.queues.get(name) {
            Some(queue) => queue.summary(name),
            None => QueueSummary {
                name: name.to_string(),
                paused: false,
                counts: [0; 8],
                backpressure: None,
                oldest_available_at: None,
            },
        }
    }

    pub fn queues(&self) -> &BTreeMap<String, QueueState> {
        &self.queues
    }

    /// The signal an operator gave `worker_id`, with when.
    pub fn worker_signal(&self, worker_id: &str) -> Option<(WorkerSignal, Millis)> {
        self.worker_signals.get(worker_id).copied()
    }

    /// Every worker with a signal.
    pub fn signalled_workers(&self) -> impl Iterator<Item = &String> {
        self.worker_signals.keys()
    }

    /// Workers whose entry changed since the last call.
    pub fn take_dirty_workers(&mut self) -> HashSet<String> {
        std::mem::take(&mut self.dirty_workers)
    }

    /// Marks a worker's entry as changed (contact recorded by the writer).
    pub fn touch_worker(&mut self, worker_id: &str) {
        self.dirty_workers.insert(worker_id.to_string());
    }

    /// Workers whose entry changed since [`State::take_dirty_workers`]
    /// (each whose active jobs changed among them).
    pub fn dirty_workers(&self) -> impl Iterator<Item = &String> {
        self.dirty_workers.iter()
    }

    /// Whether `worker_id` holds active jobs.
    pub fn holds_active(&self, worker_id: &str) -> bool {
        self.active_by_worker.contains_key(worker_id)
    }

    /// The active jobs `worker_id` holds, in id order.
    pub fn active_of_worker(&self, worker_id: &str) -> Vec<JobId> {
        self.active_by_worker.get(worker_id).map(|ids| ids.iter().copied().collect()).unwrap_or_default()
    }

    /// The earliest job deadline, cron run or workflow past its retention.
    pub fn next_deadline(&self) -> Option<Millis> {
        let workflow =
            self.terminal_workflows.first().map(|(ended_at, _)| ended_at.saturating_add(self.retention.workflows_ms));
        [self.timers.next_deadline(), self.crons.next_due(), workflow].into_iter().flatten().min()
    }

    pub fn crons(&self) -> &CronTable {
        &self.crons
    }

    pub fn workflow(&self, id: WorkflowId) -> Option<&Arc<Workflow>> {
        self.workflows.get(&id)
    }

    /// Live jobs holding `key`, oldest first.
    pub fn jobs_with_unique_key(&self, key: &UniqueKey) -> &[JobId] {
        self.unique_index.get(key).map_or(&[], Vec::as_slice)
    }

    /// Queues whose figures changed since the last call (all of them the
    /// first time), with their figures now, `None` for a queue now gone.
    pub fn take_dirty_queues(&mut self) -> Vec<(String, Option<QueueSummary>)> {
        let names = if std::mem::take(&mut self.all_queues_dirty) {
            self.dirty_queues.clear();
            self.queues.keys().cloned().collect()
        } else {
            std::mem::take(&mut self.dirty_queues)
        };
        names
            .into_iter()
            .map(|name| {
                let summary = self.queues.get_mut(&name).map(|queue| {
                    queue.dirty = false;
                    queue.summary(&name)
                });
                (name, summary)
            })
            .collect()
    }

    pub fn retention(&self) -> &Retention {
        &self.retention
    }
}

impl QueueState {
    /// Its figures, as readers see them.
    pub fn summary(&self, name: &str) -> QueueSummary {
        let oldest = [self.ready.oldest_entry(), self.limited.oldest_entry()].into_iter().flatten().min();
        QueueSummary {
            name: name.to_string(),
            paused: self.paused,
            counts: self.counts,
            backpressure: self.backpressure,
            oldest_available_at: oldest,
        }
    }
}
