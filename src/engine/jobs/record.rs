//! The log records of jobs (`docs/wal-format.md`, "Job records"): each
//! change of one or more jobs, fully decided, so that applying it
//! (`apply.rs`) rebuilds exactly the state the live engine had.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::clock::Millis;
use crate::job::{FailureReport, Job, JobId};

/// What a failed attempt leads to; logged in `Fail` and `Timeout` records.
pub use crate::job::transition::FailOutcome;

/// Which claim deadline ran out; logged in `Timeout` records.
pub use crate::job::transition::TimeoutKind;

/// A claim made by a fetch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claim {
    pub id: JobId,
    pub visibility_deadline: Millis,
    pub execution_deadline: Millis,
}

/// A change of jobs. The variant order is part of the log format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum JobRecord {
    /// New jobs, complete with id, state and timestamps; a batch enqueue is
    /// one record. `replaced` are the jobs a unique `replace` policy cancels
    /// first. The jobs are shared with the state that applies them.
    Enqueue {
        jobs: Vec<Arc<Job>>,
        replaced: Vec<JobId>,
    },
    /// Jobs handed to a fetch.
    Claim {
        worker_id: Option<String>,
        claims: Vec<Claim>,
    },
    Ack {
        id: JobId,
        result: Option<String>,
    },
    Fail {
        id: JobId,
        report: FailureReport,
        outcome: FailOutcome,
    },
    Cancel {
        id: JobId,
    },
    /// `scheduled` or `retryable` jobs whose time came.
    Promote {
        ids: Vec<JobId>,
    },
    /// Unclaimed jobs past `expires_at`.
    Expire {
        ids: Vec<JobId>,
    },
    /// A claim whose deadline ran out.
    Timeout {
        id: JobId,
        kind: TimeoutKind,
        outcome: FailOutcome,
    },
    /// Terminal jobs past their retention.
    Prune {
        ids: Vec<JobId>,
    },
    /// Terminal jobs pruned, oldest first, to hold the retention caps on
    /// terminal jobs' count and bytes.
    PruneCapped {
        ids: Vec<JobId>,
    },
    /// A discarded job sent back to `available` from the dead letter listing.
    DeadLetterRetry {
        id: JobId,
    },
    /// A discarded job removed for good from the dead letter listing.
    Delete {
        id: JobId,
    },
    /// Claims extended by a worker's heartbeat: (job, new visibility deadline).
    Heartbeat {
        extensions: Vec<(JobId, Millis)>,
    },
    /// A staged (`pending`) job activated: `available`, or `scheduled` when
    /// its time has not come.
    Activate {
        id: JobId,
    },
}

impl JobRecord {
    /// The record's name, as `svc inspect` counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            JobRecord::Enqueue { .. } => "enqueue",
            JobRecord::Claim { .. } => "claim",
            JobRecord::Ack { .. } => "ack",
            JobRecord::Fail { .. } => "fail",
            JobRecord::Cancel { .. } => "cancel",
            JobRecord::Promote { .. } => "promote",
            JobRecord::Expire { .. } => "expire",
            JobRecord::Timeout { .. } => "timeout",
            JobRecord::Prune { .. } => "prune",
            JobRecord::PruneCapped { .. } => "prune_capped",
            JobRecord::DeadLetterRetry { .. } => "dead_letter_retry",
            JobRecord::Delete { .. } => "delete",
            JobRecord::Heartbeat { .. } => "heartbeat",
            JobRecord::Activate { .. } => "activate",
        }
    }
}
