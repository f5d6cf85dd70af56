//! The log records of workflows.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::table::Workflow;
use crate::job::{Job, JobId, WorkflowId};

/// A workflow created with its jobs (later chain steps `pending`) and its
/// callbacks' jobs (inside the workflow, stored when they fire);
/// `replaced` are the jobs a unique `replace` policy cancels first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowCreate {
    pub workflow: Arc<Workflow>,
    pub jobs: Vec<Arc<Job>>,
    pub replaced: Vec<JobId>,
}

/// A running workflow cancelled with every job of it not yet ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowCancel {
    pub id: WorkflowId,
}

/// Ended workflows removed for good (retention, or the cap).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowPrune {
    pub ids: Vec<WorkflowId>,
}

/// A change of workflows. The variant order is part of the log format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkflowRecord {
    Create(WorkflowCreate),
    Cancel(WorkflowCancel),
    Prune(WorkflowPrune),
}

impl WorkflowRecord {
    /// The record's name, as `svc inspect` counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            WorkflowRecord::Create(_) => "workflow_create",
            WorkflowRecord::Cancel(_) => "workflow_cancel",
            WorkflowRecord::Prune(_) => "workflow_prune",
        }
    }
}
