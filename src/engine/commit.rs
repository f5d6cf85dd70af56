//! Committing a turn: what a write waits for between the engine deciding it
//! and the requester hearing of it.
//!
//! At the end of each turn the engine hands its [`Committer`] the turn's
//! encoded records, the view changes and the replies. The committer writes
//! the records as one frame (more only when a turn outgrows a frame), runs
//! `fdatasync` once, and only then publishes the changes to the read view and
//! sends the replies. It runs on the engine thread: while it waits for the
//! disk, new commands queue up in the inbox and the next turn takes them all,
//! so a slow disk makes turns, and frames, bigger (group commit). A frame is
//! only written after every earlier frame is durable, which the recovery rule
//! relies on.

use std::sync::Arc;

use super::api::{EngineError, Unavailable};
use super::cron::table::CronEntry;
use super::events::Event;
use super::job_table::JobTable;
use super::requests::Responder;
use super::table::Changes;
use super::view::{QueueSummary, ReadView};
use super::workers::entry::WorkerEntry;
use crate::limits::FRAME_PAYLOAD_BYTES_MAX;
use crate::storage::{StorageError, WalWriter};

/// The error every reply of a failed commit gets.
pub(crate) fn storage_failed() -> EngineError {
    EngineError::Unavailable { reason: Unavailable::StorageFailed }
}

/// What changed in the read view during one turn, copied out of the state at
/// its end (`None` removes an entry).
#[derive(Default)]
pub(crate) struct ViewDelta {
    pub workers: Vec<(String, Option<WorkerEntry>)>,
    pub crons: Changes<String, CronEntry>,
    pub workflows: Changes<crate::job::WorkflowId, super::workflows::table::Workflow>,
    pub queues: Vec<(String, Option<QueueSummary>)>,
    pub schemas: Changes<String, crate::schema::SchemaEntry>,
    pub webhooks: Changes<crate::job::SubscriptionId, crate::webhook::Subscription>,
    pub events: Vec<Event>,
}

impl ViewDelta {
    /// Publishes the turn's changes, the jobs' from the state's job table.
    pub fn publish(self, view: &ReadView, jobs: &mut JobTable) {
        if !self.workers.is_empty() {
            view.publish_workers(self.workers.into_iter());
        }
        view.crons.publish(self.crons);
        view.webhooks.publish(self.webhooks);
        view.schemas.publish(self.schemas);
        view.workflows.publish(self.workflows);
        jobs.publish();
        if !self.queues.is_empty() {
            view.publish_queues(self.queues.into_iter());
        }
        if !self.events.is_empty() {
            view.publish_events(self.events.into_iter());
        }
    }
}

/// Owns the log on the engine thread: writes, syncs, then publishes and replies.
pub(crate) struct Committer {
    wal: WalWriter,
    view: Arc<ReadView>,
    /// The frame being assembled, kept to reuse its allocation.
    payload: Vec<u8>,
    /// Set for good when a write or sync fails.
    failed: bool,
    metrics: Arc<crate::metrics::Metrics>,
}

impl Committer {
    pub fn new(wal: WalWriter, view: Arc<ReadView>, metrics: Arc<crate::metrics::Metrics>) -> Committer {
        Committer { wal, view, payload: Vec::new(), failed: false, metrics }
    }

    /// Whether a write or sync failed; the log then takes nothing more.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Makes a turn durable, then publishes its changes and sends its
    /// replies; on a failed write or sync, every reply becomes that failure.
    /// `sequences` are the turn's encoded records, each at most half a frame
    /// so that any one fits a frame; none when the turn changed nothing
    /// durable.
    pub fn commit(&mut self, sequences: &[Vec<u8>], delta: ViewDelta, jobs: &mut JobTable, replies: Vec<Responder>) {
        let mut ok = !self.failed;
        self.payload.clear();
        for sequence in sequences {
            if !ok {
                break;
            }
            if !self.payload.is_empty() && self.payload.len() + sequence.len() > FRAME_PAYLOAD_BYTES_MAX {
                ok = self.write_and_sync();
                self.payload.clear();
            }
            self.payload.extend_from_slice(sequence);
        }
        if ok && !self.payload.is_empty() {
            let started = std::time::Instant::now();
            ok = self.write_and_sync();
            self.metrics.sync_seconds.observe(started.elapsed().as_secs_f64());
        }
        if ok {
            delta.publish(&self.view, jobs);
        }
        let failure = (!ok).then(storage_failed);
        replies.into_iter().for_each(|reply| reply(failure.as_ref()));
    }

    /// With the disk full, the log bytes a turn may still write; `None`
    /// while the log has room to grow.
    pub fn space_budget(&mut self) -> Option<u64> {
        if self.failed { None } else { self.wal.space_budget() }
    }

    /// Starts a new segment (a snapshot boundary); its index.
    pub fn rotate(&mut self) -> Result<u64, StorageError> {
        if self.failed {
            return Err(StorageError::Poisoned);
        }
        let result = self.wal.rotate();
        // A full disk or a want of descriptors leaves the log as it was;
        // anything else poisons it.
        if let Err(error) = &result
            && !error.is_transient()
        {
            self.fail(error);
        }
        result
    }

    /// Marks the log failed for good, keeping what failed for the stop's log line.
    fn fail(&mut self, error: &StorageError) {
        self.failed = true;
        self.view.set_failure_cause(error.to_string());
        self.view.set_failure(super::view::EngineFailure::SyncFailed);
    }

    fn write_and_sync(&mut self) -> bool {
        let result = self.wal.append(&self.payload).and_then(|written| written.sync());
        if let Err(error) = &result {
            self.wal.poison();
            tracing::error!(error = %error, "write-ahead log failed; refusing all writes until restart");
            self.fail(error);
        }
        result.is_ok()
    }
}
