//! The plain types that cross the engine's boundary besides the requests
//! themselves: what some requests carry and answer, and the one error type.

use std::sync::Arc;

use super::workers::WorkerSignal;
use crate::job::{Job, JobId, JobState, ValidationError};

/// A fetch request, already validated.
#[derive(Debug, Clone, PartialEq)]
pub struct FetchRequest {
    pub queues: Vec<String>,
    pub count: usize,
    pub worker_id: Option<String>,
    pub visibility_timeout_ms: Option<u64>,
}

/// The outcome of a cancel.
#[derive(Debug, Clone)]
pub struct Cancelled {
    pub job: Arc<Job>,
    pub previous_state: JobState,
}

/// What a heartbeat answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatOutcome {
    /// Claims extended.
    pub extended: usize,
    /// What the worker should do: an operator's signal, or `Terminate` while
    /// the engine drains.
    pub signal: Option<WorkerSignal>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum EngineError {
    NotFound {
        id: JobId,
    },
    /// No job with this id is in the dead letter listing.
    NotInDeadLetter {
        id: JobId,
    },
    /// No worker with this id is registered.
    WorkerNotFound {
        worker_id: String,
    },
    /// The signal does not apply in the worker's state (quiet after terminate).
    WorkerConflict {
        worker_id: String,
        current_state: &'static str,
    },
    /// No cron entry has this name.
    CronNotFound {
        name: String,
    },
    /// The cron entry changed between reading it and writing the change.
    CronChanged {
        name: String,
    },
    /// As many cron entries are registered as the server allows.
    CronLimit {
        max_entries: usize,
    },
    /// The job is not in a state the command applies to; `reason` is
    /// `invalid_state` or `not_owner`.
    Conflict {
        id: JobId,
        current_state: JobState,
        reason: &'static str,
    },
    /// The client-supplied id is taken; `index` is the batch position.
    Duplicate {
        id: JobId,
        index: Option<usize>,
    },
    /// A request that only the engine can judge invalid (e.g. already expired).
    Invalid {
        error: ValidationError,
        index: Option<usize>,
    },
    /// Storage failed, the engine is overloaded or stopped, or capacity is reached.
    Unavailable {
        reason: &'static str,
    },
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::NotFound { id } => write!(f, "job {id} not found"),
            EngineError::NotInDeadLetter { id } => write!(f, "job {id} is not in the dead letter listing"),
            EngineError::WorkerNotFound { worker_id } => write!(f, "worker {worker_id} not found"),
            EngineError::WorkerConflict { worker_id, current_state } => {
                write!(f, "worker {worker_id} is {current_state}; a terminating worker cannot be made quiet")
            }
            EngineError::CronNotFound { name } => write!(f, "cron entry {name} not found"),
            EngineError::CronChanged { name } => write!(f, "cron entry {name} changed meanwhile; retry"),
            EngineError::CronLimit { max_entries } => {
                write!(f, "{max_entries} cron entries are registered, the most this server allows")
            }
            EngineError::Conflict { id, current_state, reason } => {
                write!(f, "job {id} is {} ({reason})", current_state.as_str())
            }
            EngineError::Duplicate { id, .. } => write!(f, "job id {id} is already in use"),
            EngineError::Invalid { error, .. } => write!(f, "{error}"),
            EngineError::Unavailable { reason } => write!(f, "engine unavailable: {reason}"),
        }
    }
}

impl std::error::Error for EngineError {}
