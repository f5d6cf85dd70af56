//! The plain types that cross the engine's boundary besides the requests
//! themselves: what some requests carry and answer, and the one error type.

use std::sync::Arc;

use super::workers::entry::{WorkerSignal, WorkerState};
use crate::job::{Job, JobId, JobState, UniqueKey, ValidationError};

/// One enqueued item: the job stored, or for a unique `ignore` policy that
/// met a conflicting job, that job (`deduplicated`).
#[derive(Debug, Clone)]
pub struct Enqueued {
    pub job: Arc<Job>,
    pub deduplicated: bool,
    /// How full the job's queue is (waiting jobs over its backpressure
    /// bound), when past the queue's warning threshold.
    pub pressure: Option<f64>,
}

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

/// A queue's figures, with what it completed and failed lately.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueStats {
    pub summary: super::view::QueueSummary,
    /// Jobs completed in the last 60 s.
    pub completed_last_minute: u64,
    /// Attempts failed in the last 60 s (nacks without requeue, and timeouts).
    pub failed_last_minute: u64,
}

/// The service at a glance: what the admin overview shows.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct Overview {
    /// Queues known (holding jobs, paused or configured).
    pub queues: usize,
    pub paused_queues: usize,
    /// Jobs in each state across all queues, indexed by [`JobState::index`].
    pub jobs: [u64; 8],
    /// Workers in the registry, and how many in each state.
    pub workers: usize,
    pub workers_by_state: Vec<(super::workers::entry::WorkerState, usize)>,
    /// Jobs in the dead letter listing.
    pub dead_letter: usize,
    /// Jobs completed and attempts failed in the last 60 s, all queues.
    pub completed_last_minute: u64,
    pub failed_last_minute: u64,
}

impl Overview {
    pub fn count(&self, state: JobState) -> u64 {
        self.jobs[state.index()]
    }
}

/// What a heartbeat answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatOutcome {
    /// Claims extended.
    pub extended: usize,
    /// The listed jobs whose claims were not extended: ended, cancelled,
    /// unknown, or held by another worker (a worker stops their handlers).
    pub not_extended: Vec<JobId>,
    /// What the worker should do: an operator's signal, or `Terminate` while
    /// the engine drains.
    pub signal: Option<WorkerSignal>,
}

/// Why the engine refused a request, or could not take it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
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
        current_state: WorkerState,
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
    /// No webhook subscription has this id.
    WebhookNotFound {
        id: crate::job::SubscriptionId,
    },
    /// As many webhook subscriptions exist as the server allows.
    WebhookLimit {
        max_webhooks: usize,
    },
    /// A new secret was added while another rotation is still going.
    RotationInProgress {
        id: crate::job::SubscriptionId,
    },
    /// No rotation is going: there is no previous secret to drop.
    NoRotation {
        id: crate::job::SubscriptionId,
    },
    /// No schema is registered under this URI.
    SchemaNotFound {
        uri: String,
    },
    /// A schema is already registered under this URI (schemas do not change:
    /// delete it and register again).
    SchemaExists {
        uri: String,
    },
    /// As many schemas are registered as the server allows.
    SchemaLimit {
        max_schemas: usize,
    },
    /// The job is not in a state the command applies to, or is claimed by
    /// another worker.
    Conflict {
        id: JobId,
        current_state: JobState,
        reason: ConflictReason,
    },
    /// The client-supplied id is taken; `index` is the batch position.
    Duplicate {
        id: JobId,
        index: Option<usize>,
    },
    /// A job with the same unique key is held (unique policy `reject`).
    UniqueConflict {
        existing: JobId,
        existing_state: JobState,
        key: UniqueKey,
        index: Option<usize>,
    },
    /// A request that only the engine can judge invalid (e.g. already expired).
    Invalid {
        error: ValidationError,
        index: Option<usize>,
    },
    /// The queue is paused: it takes no new work until resumed.
    QueuePaused {
        queue: String,
        index: Option<usize>,
    },
    /// The queue's backpressure bound is reached: `depth` jobs wait and at
    /// most `bound` may.
    QueueFull {
        queue: String,
        depth: u64,
        bound: u64,
        index: Option<usize>,
    },
    /// No workflow has this id (or it was pruned).
    WorkflowNotFound {
        id: crate::job::WorkflowId,
    },
    /// The workflow has ended: it cannot be cancelled.
    WorkflowConflict {
        id: crate::job::WorkflowId,
        current_state: super::workflows::table::WorkflowState,
    },
    /// The engine cannot take the request now; `reason` says why.
    Unavailable {
        reason: Unavailable,
    },
}

/// Why a job is in the way of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConflictReason {
    /// The job is not in a state the request applies to.
    InvalidState,
    /// A worker's report (ack, nack, progress) on a job that is not
    /// `active`; read as `invalid_state`, with `expected_state: active`.
    NotActive,
    /// The job is claimed by another worker.
    NotOwner,
    /// Activation of a job that is not `pending`.
    NotPending,
    /// Activation of a `pending` job that a cron entry (or workflow) will activate itself.
    Owned,
}

impl ConflictReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ConflictReason::InvalidState | ConflictReason::NotActive => "invalid_state",
            ConflictReason::NotOwner => "not_owner",
            ConflictReason::NotPending => "not_pending",
            ConflictReason::Owned => "owned",
        }
    }
}

/// Why the engine cannot take a request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unavailable {
    /// Too many requests wait already; retry shortly.
    Overloaded,
    /// The engine holds as many live jobs as it may.
    Capacity,
    /// The disk is full: new work waits until space is freed.
    DiskFull,
    /// A write or sync of the log failed; the engine takes no more writes.
    StorageFailed,
    /// The engine has stopped.
    EngineStopped,
    /// A requested snapshot could not be written.
    SnapshotFailed,
    /// The database (the PostgreSQL backend's) could not be reached, or
    /// failed the statement; nothing of the request was committed.
    Database,
    /// The database rolled the request back to end a conflict with another
    /// transaction (a deadlock, a serialization failure); nothing of it was
    /// committed, and the same request may well succeed at once.
    Contention,
}

impl Unavailable {
    pub fn as_str(self) -> &'static str {
        match self {
            Unavailable::Overloaded => "overloaded",
            Unavailable::Capacity => "capacity",
            Unavailable::DiskFull => "disk_full",
            Unavailable::StorageFailed => "storage_failed",
            Unavailable::EngineStopped => "engine_stopped",
            Unavailable::SnapshotFailed => "snapshot_failed",
            Unavailable::Database => "database",
            Unavailable::Contention => "contention",
        }
    }
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::NotFound { id } => write!(f, "job {id} not found"),
            EngineError::NotInDeadLetter { id } => write!(f, "job {id} is not in the dead letter listing"),
            EngineError::WorkerNotFound { worker_id } => write!(f, "worker {worker_id} not found"),
            EngineError::WorkerConflict { worker_id, current_state } => {
                write!(f, "worker {worker_id} is {}; a terminating worker cannot be made quiet", current_state.as_str())
            }
            EngineError::CronNotFound { name } => write!(f, "cron entry {name} not found"),
            EngineError::CronChanged { name } => write!(f, "cron entry {name} changed meanwhile; retry"),
            EngineError::CronLimit { max_entries } => {
                write!(f, "{max_entries} cron entries are registered, the most this server allows")
            }
            EngineError::SchemaNotFound { uri } => write!(f, "schema {uri} not found"),
            EngineError::WebhookNotFound { id } => write!(f, "webhook subscription sub_{id} not found"),
            EngineError::WebhookLimit { max_webhooks } => {
                write!(f, "{max_webhooks} webhook subscriptions exist, the most this server allows")
            }
            EngineError::RotationInProgress { .. } => {
                write!(f, "a secret rotation is in progress: drop the previous secret before adding another")
            }
            EngineError::NoRotation { .. } => write!(f, "no secret rotation is in progress"),
            EngineError::SchemaExists { uri } => {
                write!(f, "schema {uri} is already registered; schemas do not change (delete it first)")
            }
            EngineError::SchemaLimit { max_schemas } => {
                write!(f, "{max_schemas} schemas are registered, the most this server allows")
            }
            EngineError::Conflict { id, current_state, reason } => {
                write!(f, "job {id} is {} ({})", current_state.as_str(), reason.as_str())
            }
            EngineError::Duplicate { id, .. } => write!(f, "job id {id} is already in use"),
            EngineError::UniqueConflict { existing, existing_state, .. } => {
                write!(f, "a job with the same unique key is held: {existing} ({})", existing_state.as_str())
            }
            EngineError::Invalid { error, .. } => write!(f, "{error}"),
            EngineError::QueuePaused { queue, .. } => write!(f, "queue {queue} is paused"),
            EngineError::QueueFull { queue, depth, bound, .. } => {
                write!(f, "queue {queue} is full: {depth} jobs wait and its bound is {bound}")
            }
            EngineError::WorkflowNotFound { id } => write!(f, "workflow {id} not found"),
            EngineError::WorkflowConflict { id, current_state } => {
                write!(f, "workflow {id} is {}: it has ended", current_state.as_str())
            }
            EngineError::Unavailable { reason } => write!(f, "engine unavailable: {}", reason.as_str()),
        }
    }
}

impl std::error::Error for EngineError {}

impl EngineError {
    /// The 409 for a worker's report on a job it does not hold.
    pub fn not_held(job: &Job, refusal: crate::job::transition::NotHeld) -> EngineError {
        let reason = match refusal {
            crate::job::transition::NotHeld::NotActive => ConflictReason::NotActive,
            crate::job::transition::NotHeld::OtherWorker => ConflictReason::NotOwner,
        };
        EngineError::Conflict { id: job.id, current_state: job.state, reason }
    }
}
