//! The log record of a progress report: which job, and what it reported
//! (its `updated_at` is the time the record is logged at).

use serde::{Deserialize, Serialize};

use crate::job::{JobId, JobProgress};

/// A worker reported progress on the active job `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgressReported {
    pub id: JobId,
    pub progress: JobProgress,
}
