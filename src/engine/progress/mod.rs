//! Job progress (docs/api.md, "Progress"): a worker holding a job reports how
//! far it got; the job carries the last report of its current attempt.
//!
//! The whole feature is here: the request, its decision, its record (in
//! `record.rs`) and how that record applies. A claim clears the report, so a
//! new attempt starts without the last one's progress. A report does not
//! extend the claim: a heartbeat does that.

pub(super) mod record;

pub use record::ProgressReported;

use std::sync::Arc;

use super::api::EngineError;
use super::events::{EventKind, EventSink};
use super::record::Logged;
use super::requests::{RECORD_FIXED_BYTES, Request, Turn, sealed};
use super::state::{ApplyError, State};
use crate::clock::Millis;
use crate::job::{Job, JobId, JobProgress};

/// Reports progress on an active job; `worker_id`, when given, must be the
/// worker holding it. Answers the job as it is after the report.
pub struct ReportProgress {
    pub id: JobId,
    pub progress: JobProgress,
    pub worker_id: Option<String>,
}

impl sealed::Sealed for ReportProgress {}

impl Request for ReportProgress {
    type Output = Arc<Job>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let mut progress = self.progress;
        progress.check().map_err(|error| EngineError::Invalid { error, index: None })?;
        turn.state().active_job(self.id, self.worker_id.as_deref())?;
        progress.updated_at = turn.now;
        turn.apply(Logged::new(turn.now, ProgressReported { id: self.id, progress }));
        Ok(turn.current(self.id))
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        Some(RECORD_FIXED_BYTES + self.held_bytes())
    }

    fn held_bytes(&self) -> u64 {
        self.progress.held_bytes() as u64
    }
}

impl State {
    pub(super) fn apply_progress(
        &mut self,
        at: Millis,
        record: &ProgressReported,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        self.update(record.id, |job| job.set_progress(Some(record.progress.clone())))?;
        events.push(at, EventKind::Progress, record.id);
        Ok(())
    }
}
