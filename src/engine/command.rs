//! What the front ends send the engine, and what comes back.

use std::sync::Arc;
use tokio::sync::oneshot;

use crate::job::{FailureReport, Job, JobId, JobState, NewJob, ValidationError};

/// Where the engine sends one command's outcome.
pub type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

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

pub enum Command {
    Enqueue {
        jobs: Vec<NewJob>,
        reply: Reply<Vec<Arc<Job>>>,
    },
    Fetch {
        request: FetchRequest,
        reply: Reply<Vec<Arc<Job>>>,
    },
    Ack {
        id: JobId,
        result: Option<String>,
        worker_id: Option<String>,
        reply: Reply<Arc<Job>>,
    },
    Fail {
        id: JobId,
        report: FailureReport,
        requeue: bool,
        worker_id: Option<String>,
        reply: Reply<Arc<Job>>,
    },
    /// Extends claims; replies with how many were extended and the worker's signal.
    Heartbeat {
        worker_id: String,
        active_jobs: Option<Vec<JobId>>,
        visibility_timeout_ms: Option<u64>,
        reply: Reply<(usize, Option<super::workers::WorkerSignal>)>,
    },
    /// An operator's signal to a known worker.
    SignalWorker {
        worker_id: String,
        signal: super::workers::WorkerSignal,
        reply: Reply<super::workers::WorkerEntry>,
    },
    /// Forgets a known worker's entry and signal.
    ForgetWorker {
        worker_id: String,
        reply: Reply<()>,
    },
    DeadLetterRetry {
        id: JobId,
        reply: Reply<Arc<Job>>,
    },
    /// Registers or changes a cron entry; replies with it and whether it is new.
    CronPut {
        definition: crate::cron::CronDefinition,
        write: super::cron::CronWrite,
        reply: Reply<(Arc<super::cron::CronEntry>, bool)>,
    },
    /// Removes a cron entry; replies with it as it was.
    CronDelete {
        name: String,
        reply: Reply<Arc<super::cron::CronEntry>>,
    },
    DeadLetterDelete {
        id: JobId,
        reply: Reply<()>,
    },
    Cancel {
        id: JobId,
        reply: Reply<Cancelled>,
    },
    /// A round trip through the engine, for health checks.
    Probe {
        reply: Reply<()>,
    },
    /// A graceful shutdown begins: stop firing cron entries, tell workers to terminate.
    BeginDrain {
        reply: Reply<()>,
    },
    /// Handle what is due now (used with a manual clock).
    Tick {
        reply: Reply<()>,
    },
    /// Write a snapshot now and wait until it is durable.
    Snapshot {
        reply: Reply<()>,
    },
    /// Stop; with `snapshot` a final snapshot is written first.
    Shutdown {
        snapshot: bool,
        reply: Reply<()>,
    },
    /// The full committed state (tests and tools).
    Image {
        reply: Reply<super::state::StateImage>,
    },
}

/// Why the engine refused a command.
impl Command {
    /// About how many bytes this command carries, for the inbox's bound.
    pub(crate) fn held_bytes(&self) -> u64 {
        let carried = match self {
            Command::Enqueue { jobs, .. } => jobs
                .iter()
                .map(|job| {
                    let payload = &job.payload;
                    std::mem::size_of::<NewJob>()
                        + job.queue.len()
                        + payload.job_type.len()
                        + payload.args.len()
                        + payload.meta.len()
                        + payload.tags.iter().map(String::len).sum::<usize>()
                        + payload.extra.iter().map(|(key, value)| key.len() + value.len()).sum::<usize>()
                })
                .sum(),
            Command::Ack { result, .. } => result.as_ref().map_or(0, String::len),
            Command::Fail { report, .. } => report.held_bytes(),
            Command::Heartbeat { active_jobs, .. } => {
                active_jobs.as_ref().map_or(0, |ids| ids.len() * std::mem::size_of::<JobId>())
            }
            Command::Fetch { request, .. } => request.queues.iter().map(String::len).sum(),
            _ => 0,
        };
        (std::mem::size_of::<Command>() + carried) as u64
    }
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
