//! The log records of workflows. Each is encoded as the struct variant it
//! replaced, field for field (records 22, 23 and 24).

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::table::Workflow;
use crate::clock::Millis;
use crate::job::{Job, JobId, WorkflowId};

/// A workflow created with its jobs (later chain steps `pending`) and its
/// callbacks' jobs (inside the workflow, stored when they fire);
/// `replaced` are the jobs a unique `replace` policy cancels first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowCreate {
    pub at: Millis,
    pub workflow: Arc<Workflow>,
    pub jobs: Vec<Arc<Job>>,
    pub replaced: Vec<JobId>,
}

/// A running workflow cancelled with every job of it not yet ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowCancel {
    pub at: Millis,
    pub id: WorkflowId,
}

/// Ended workflows removed for good (retention, or the cap).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowPrune {
    pub at: Millis,
    pub ids: Vec<WorkflowId>,
}
