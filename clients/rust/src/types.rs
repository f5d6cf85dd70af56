//! What svc answers, typed: jobs, progress, workflows, cron entries,
//! queues, workers, webhook subscriptions. Names are svc's own
//! (`scheduled_at`, `max_attempts`); timestamps are RFC 3339 text as svc
//! sends them; fields this version does not know are kept in `extra`.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Where a job is in its life (docs/api.md, "States").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum JobState {
    /// Waiting for its `scheduled_at`.
    Scheduled,
    /// Ready to be claimed.
    Available,
    /// Staged: stored, claimable once activated.
    Pending,
    /// Claimed by a worker.
    Active,
    /// Failed, waiting for its `retry_at`.
    Retryable,
    /// Acked.
    Completed,
    /// Failed for good, or expired (the dead letter listing).
    Discarded,
    /// Cancelled.
    Cancelled,
    /// A state this version of the client does not know.
    #[serde(other)]
    Unknown,
}

impl JobState {
    /// Whether the job has ended (`completed`, `discarded`, `cancelled`).
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Completed | JobState::Discarded | JobState::Cancelled)
    }

    /// The wire name (`available`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Scheduled => "scheduled",
            JobState::Available => "available",
            JobState::Pending => "pending",
            JobState::Active => "active",
            JobState::Retryable => "retryable",
            JobState::Completed => "completed",
            JobState::Discarded => "discarded",
            JobState::Cancelled => "cancelled",
            JobState::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failure as svc records it (`error`, and each of `errors`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct JobFailure {
    #[serde(rename = "type", default)]
    pub error_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backtrace: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    /// In `errors`: the attempt that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// In `errors`: when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occurred_at: Option<String>,
}

/// A job, as every answer of svc shows it (docs/api.md, "The job object").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Job {
    pub id: String,
    #[serde(rename = "type")]
    pub job_type: String,
    pub queue: String,
    /// The arguments, exactly as sent.
    pub args: Vec<Value>,
    #[serde(default)]
    pub meta: Map<String, Value>,
    pub state: JobState,
    #[serde(default)]
    pub priority: i32,
    /// Claims so far (1 for the first run of a fetched job).
    #[serde(default)]
    pub attempt: u32,
    #[serde(default)]
    pub max_attempts: u32,
    #[serde(default)]
    pub timeout_ms: u64,
    #[serde(default)]
    pub visibility_timeout_ms: u64,
    /// The effective retry policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Value>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub created_at: String,
    /// The effective unique policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enqueued_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activated_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discarded_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_delay_ms: Option<u64>,
    /// The last progress report's fraction (0.0 to 1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_message: Option<String>,
    /// The ack's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The last failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<JobFailure>,
    /// The last 20 failures, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<JobFailure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<String>,
    /// A workflow step's inputs: the results of the steps before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_results: Option<Vec<Value>>,
    /// A batch callback's inputs: each member's final state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_states: Option<Vec<Option<JobState>>>,
    /// In a cancel's answer: the state the job left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_state: Option<JobState>,
    /// An enqueue under a unique `ignore` policy met this held job: nothing
    /// new was stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deduplicated: bool,
    /// Every other field (the client's own fields come back as sent).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Job {
    /// The arguments read as `T`, the way a worker's handler reads them:
    /// when `args` holds one value, that value (else the whole array);
    /// otherwise the array (a tuple or a `Vec` takes several arguments).
    pub fn args_as<T: DeserializeOwned>(&self) -> Result<T> {
        args_from(&self.args)
    }

    /// The ack's result read as `T` (`None` when the job has none).
    pub fn result_as<T: DeserializeOwned>(&self) -> Result<Option<T>> {
        match &self.result {
            None | Some(Value::Null) => Ok(None),
            Some(value) => T::deserialize(value)
                .map(Some)
                .map_err(|error| Error::invalid(Some("result".to_string()), error.to_string())),
        }
    }

    /// `meta.traceparent`: the W3C trace context the job was enqueued in.
    pub fn traceparent(&self) -> Option<&str> {
        self.meta.get("traceparent").and_then(Value::as_str)
    }
}

/// Reads a handler's `T` from an `args` array (see [`Job::args_as`]).
pub(crate) fn args_from<T: DeserializeOwned>(args: &[Value]) -> Result<T> {
    let whole = || T::deserialize(Value::Array(args.to_vec()));
    let outcome = match args {
        [single] => T::deserialize(single).or_else(|first| whole().map_err(|_| first)),
        _ => whole(),
    };
    outcome.map_err(|error| Error::invalid(Some("args".to_string()), error.to_string()))
}

/// A job's last progress report (`GET /jobs/{id}/progress`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Progress {
    pub job_id: String,
    pub state: JobState,
    #[serde(default)]
    pub attempt: u32,
    /// 0.0 to 1.0; `None` while the current attempt has reported nothing.
    pub progress: Option<f64>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub data: Value,
    #[serde(default)]
    pub updated_at: Option<String>,
}

/// What svc tells a worker to do, in a heartbeat's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WorkerState {
    /// Carry on.
    Running,
    /// Finish the jobs in hand; take nothing new.
    Quiet,
    /// Stop: release the jobs in hand.
    Terminate,
    /// A state this client does not know (treated as `running`).
    #[serde(other)]
    Unknown,
}

/// A heartbeat's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HeartbeatAnswer {
    /// What the worker should do.
    pub state: WorkerState,
    /// Claims extended.
    pub jobs_extended: usize,
    #[serde(default)]
    pub server_time: Option<String>,
}

/// A nack's answer: the job, and what follows for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NackAnswer {
    pub job: Job,
    pub state: JobState,
    #[serde(default)]
    pub attempt: u32,
    #[serde(default)]
    pub max_attempts: u32,
    #[serde(default)]
    pub retry_at: Option<String>,
    #[serde(default)]
    pub retry_delay_ms: Option<u64>,
    #[serde(default)]
    pub discarded_at: Option<String>,
}

/// One ack of several, as svc answered it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AckOutcome {
    pub job_id: String,
    /// `Ok(state)` when acked; svc's refusal otherwise (a lease lost, a
    /// cancelled job).
    pub outcome: std::result::Result<JobState, crate::error::ApiError>,
}

/// The registry's view of a worker (`GET /workers/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WorkerInfo {
    pub worker_id: String,
    pub state: WorkerState,
    #[serde(default)]
    pub first_seen_at: Option<String>,
    #[serde(default)]
    pub last_seen_at: Option<String>,
    #[serde(default)]
    pub last_heartbeat_at: Option<String>,
    #[serde(default)]
    pub active_job_ids: Vec<String>,
    #[serde(default)]
    pub stale: bool,
}

/// A page of a listing; pass `cursor` to the next call for the next page.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Page<T> {
    pub items: Vec<T>,
    pub cursor: Option<String>,
    pub has_more: bool,
}

/// A queue and its size (`GET /queues`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct QueueSummary {
    #[serde(alias = "queue")]
    pub name: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub paused: bool,
}

/// A queue's figures (`GET /queues/{name}/stats`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct QueueStats {
    pub queue: String,
    pub size: u64,
    pub paused: bool,
    /// Jobs in each state (every state, 0 included).
    pub states: BTreeMap<String, u64>,
    pub throughput: Throughput,
}

/// A queue's last minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Throughput {
    pub completed_last_minute: u64,
    pub failed_last_minute: u64,
}

/// A workflow and its jobs' states (`GET /workflows/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Workflow {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    /// `chain`, `group` or `batch`.
    #[serde(rename = "type")]
    pub workflow_type: String,
    /// `running`, `completed`, `failed` or `cancelled`.
    pub state: String,
    #[serde(default)]
    pub jobs_total: u32,
    #[serde(default)]
    pub jobs_completed: u32,
    #[serde(default)]
    pub jobs_failed: u32,
    #[serde(default)]
    pub steps_total: Option<u32>,
    #[serde(default)]
    pub steps_completed: Option<u32>,
    /// A chain's steps.
    #[serde(default)]
    pub steps: Option<Vec<WorkflowMember>>,
    /// A group's or batch's jobs.
    #[serde(default)]
    pub jobs: Option<Vec<WorkflowMember>>,
    /// A batch's callbacks, by name (`on_complete`, …).
    #[serde(default)]
    pub callbacks: Option<BTreeMap<String, WorkflowMember>>,
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default)]
    pub completed_at: Option<String>,
    #[serde(default)]
    pub cancelled_at: Option<String>,
    #[serde(default)]
    pub failure: Option<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Workflow {
    /// The member jobs: a chain's steps, or a group's or batch's jobs.
    pub fn members(&self) -> &[WorkflowMember] {
        self.steps.as_deref().or(self.jobs.as_deref()).unwrap_or_default()
    }
}

/// One job of a workflow (or a fired callback).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WorkflowMember {
    #[serde(default)]
    pub index: Option<u32>,
    #[serde(rename = "type")]
    pub job_type: String,
    #[serde(default)]
    pub queue: Option<String>,
    #[serde(default)]
    pub job_id: Option<String>,
    #[serde(default)]
    pub state: Option<JobState>,
}

/// A cron entry (`GET /cron/{name}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CronEntry {
    pub name: String,
    #[serde(default)]
    pub schedule: Option<String>,
    #[serde(default)]
    pub timezone: Option<String>,
    #[serde(rename = "type", default)]
    pub job_type: Option<String>,
    #[serde(default)]
    pub args: Vec<Value>,
    #[serde(default)]
    pub queue: Option<String>,
    #[serde(default)]
    pub meta: Map<String, Value>,
    #[serde(default)]
    pub options: Map<String, Value>,
    #[serde(default)]
    pub overlap_policy: Option<String>,
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub description: Option<String>,
    /// `active` or `disabled`.
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub next_run_at: Option<String>,
    #[serde(default)]
    pub last_run_at: Option<String>,
    #[serde(default)]
    pub last_job_id: Option<String>,
    #[serde(default)]
    pub run_count: u64,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A webhook subscription (the secret is never shown).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Subscription {
    pub id: String,
    pub url: String,
    pub events: Vec<String>,
    #[serde(default)]
    pub active: bool,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default)]
    pub filter: Option<Value>,
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default)]
    pub updated_at: Option<String>,
    #[serde(default)]
    pub secret_rotation: Option<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// What a webhook test event came to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WebhookTestResult {
    pub success: bool,
    #[serde(default)]
    pub status_code: Option<u16>,
    #[serde(default)]
    pub response_time_ms: u64,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub error_detail: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}
