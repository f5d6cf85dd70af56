//! Bulk actions on jobs (docs/api.md, "Admin: bulk actions"): one request
//! retries, cancels or deletes a chunk of listed jobs in one turn. Whoever
//! drives a bulk action lists the matching jobs and sends them in chunks,
//! so other requests are served between chunks.

use super::super::api::EngineError;
use super::super::record::Logged;
use super::super::requests::{RECORD_FIXED_BYTES, Request, Turn, sealed};
use super::record::JobRecord;
use crate::job::{JobId, JobState};

/// Most jobs one bulk request takes.
pub const BULK_CHUNK_MAX: usize = 1000;

/// What a bulk action does to each job it is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BulkAction {
    /// A discarded job goes back to `available` as a fresh run (as a dead
    /// letter retry); jobs in other states are skipped.
    Retry,
    /// A job that has not ended is cancelled; ended jobs are skipped.
    Cancel,
    /// An ended job (`completed`, `cancelled`, `discarded`) is removed for
    /// good; jobs that have not ended are skipped (cancel them first).
    Delete,
    /// Any job is removed for good: one that has not ended is cancelled
    /// first, in the same step (a queue's purge).
    Purge,
}

impl BulkAction {
    pub fn as_str(self) -> &'static str {
        match self {
            BulkAction::Retry => "retry",
            BulkAction::Cancel => "cancel",
            BulkAction::Delete => "delete",
            BulkAction::Purge => "purge",
        }
    }

    pub fn parse(text: &str) -> Option<BulkAction> {
        match text {
            "retry" => Some(BulkAction::Retry),
            "cancel" => Some(BulkAction::Cancel),
            "delete" => Some(BulkAction::Delete),
            "purge" => Some(BulkAction::Purge),
            _ => None,
        }
    }

    /// Whether the action changes a job in `state`.
    pub fn applies_to(self, state: JobState) -> bool {
        match self {
            BulkAction::Retry => state == JobState::Discarded,
            BulkAction::Cancel => !state.is_terminal(),
            BulkAction::Delete => state.is_terminal(),
            BulkAction::Purge => true,
        }
    }
}

/// What a bulk request (or a whole bulk action) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BulkOutcome {
    /// Jobs changed (retried, cancelled or deleted).
    pub changed: u64,
    /// Jobs given that were gone or in a state the action skips.
    pub skipped: u64,
}

/// Applies `action` to each of `ids` (at most [`BULK_CHUNK_MAX`]), each on
/// its own: a job the action skips does not stop the others.
pub struct BulkJobs {
    pub action: BulkAction,
    pub ids: Vec<JobId>,
}

impl sealed::Sealed for BulkJobs {}

impl Request for BulkJobs {
    type Output = BulkOutcome;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let mut outcome = BulkOutcome::default();
        for id in self.ids.into_iter().take(BULK_CHUNK_MAX) {
            let state = turn.state().job(id).map(|job| job.state);
            let now = turn.now;
            let record = match state {
                Some(state) if self.action.applies_to(state) => match self.action {
                    BulkAction::Retry => turn.state().decide_dead_letter_retry(now, id).ok(),
                    BulkAction::Cancel => turn.state().decide_cancel(now, id).ok().flatten(),
                    BulkAction::Delete => Some(Logged::new(now, JobRecord::Delete { id })),
                    BulkAction::Purge => {
                        if let Some(cancel) = turn.state().decide_cancel(now, id).ok().flatten() {
                            turn.apply(cancel);
                        }
                        Some(Logged::new(now, JobRecord::Delete { id }))
                    }
                },
                _ => None,
            };
            match record {
                Some(record) => {
                    turn.apply(record);
                    outcome.changed += 1;
                }
                None => outcome.skipped += 1,
            }
        }
        Ok(outcome)
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        // Cancelling and deleting end work; a retry is new work.
        let records = self.ids.len().min(BULK_CHUNK_MAX) as u64 * if self.action == BulkAction::Purge { 2 } else { 1 };
        (self.action != BulkAction::Retry).then_some(records * RECORD_FIXED_BYTES)
    }

    fn held_bytes(&self) -> u64 {
        (self.ids.len() * std::mem::size_of::<JobId>()) as u64
    }
}
