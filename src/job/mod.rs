//! Domain types: pure data, no I/O. A [`Job`] is what the engine stores;
//! [`NewJob`] is a validated enqueue request that the engine has not yet accepted.

mod builder;
mod dispatch_limit;
mod enqueue;
mod error;
mod failure;
mod id;
pub mod json;
mod payload;
pub(crate) mod postcard_form;
mod progress;
mod queue_name;
mod retry;
mod stored;
pub mod time;
pub mod transition;
mod unique;
mod worker;

pub use builder::JobBuilder;
pub use dispatch_limit::{DISPATCH_KEY_CHARS_MAX, DISPATCH_LIMIT_MAX, DispatchLimit, RateWindow};
pub use enqueue::{
    JobDefaults, body_error, check_batch_size, check_schema_uri, invalid_queue, is_valid_queue, is_valid_type,
    parse_enqueue_body, parse_enqueue_object, raw_integer,
};
pub use error::{ValidationError, ValidationKind};
pub use failure::{ErrorEntry, Failure, FailureReport, parse_failure_report};
pub use id::{DeliveryId, IdGenerator, IdHashState, JobId, JobIdMap, JobIdSet, SubscriptionId, WorkflowId};
pub use payload::JobPayload;
pub use progress::JobProgress;
pub use queue_name::QueueName;
pub use retry::{Exhaustion, RetryPolicy, SharedPolicies};
pub(crate) use stored::StoredJobDecoder;
pub use stored::{StoredJob, StoredJobEncoder};
pub use unique::{OnConflict, UNIQUE_KEY_NAME_CHARS_MAX, UNIQUE_KEY_NAMES_MAX, UniqueKey, UniquePolicy};
pub use worker::{
    ack_result, fetch_count, fetch_queues, fetch_wait_ms, invalid_worker_id, is_valid_worker_id, parse_ack_result,
};

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::clock::Millis;
use time::TimeSpec;

/// The states a job moves through (docs/api.md, "States").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[non_exhaustive]
pub enum JobState {
    Scheduled,
    Available,
    Pending,
    Active,
    Retryable,
    Completed,
    Discarded,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 8] = [
        JobState::Scheduled,
        JobState::Available,
        JobState::Pending,
        JobState::Active,
        JobState::Retryable,
        JobState::Completed,
        JobState::Discarded,
        JobState::Cancelled,
    ];

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
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Completed | JobState::Discarded | JobState::Cancelled)
    }

    /// Position in [`JobState::ALL`], for per-state counters.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A validated enqueue request.
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    pub id: Option<JobId>,
    pub payload: JobPayload,
    pub queue: QueueName,
    pub priority: i32,
    pub timeout_ms: u64,
    pub visibility_timeout_ms: u64,
    pub scheduled_at: Option<TimeSpec>,
    pub expires_at: Option<TimeSpec>,
    pub retry: Arc<RetryPolicy>,
    pub unique: Option<Arc<UniquePolicy>>,
    pub rate_limit: Option<Arc<DispatchLimit>>,
    /// Staged: stored `pending` until activated.
    pub pending: bool,
    /// The registered schema `args` were checked against (its URI).
    pub schema: Option<Arc<str>>,
}

/// An attribute few jobs carry, kept out of line so that the rest pay
/// nothing for it. A list of variants rather than a struct of options: a
/// variant added later leaves every stored job readable as it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum JobExtra {
    /// The job's unique policy and its fingerprint (docs/api.md, "Unique jobs").
    Unique { policy: Arc<UniquePolicy>, key: UniqueKey },
    /// The job's dispatch limit (docs/api.md, "Dispatch limits").
    RateLimit(Arc<DispatchLimit>),
    /// When the job last left `pending`.
    ActivatedAt(Millis),
    /// The workflow the job belongs to, and its part in it.
    Workflow { id: WorkflowId, role: WorkflowRole },
    /// The registered schema its `args` were checked against (its URI).
    Schema(Arc<str>),
    /// Progress reported in the current attempt (docs/api.md, "Progress").
    Progress(Box<JobProgress>),
}

/// A job's part in its workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum WorkflowRole {
    /// A chain step or a group or batch job, by its index.
    Member(u32),
    /// A batch callback.
    Callback(CallbackKind),
}

/// Which batch callback (docs/api.md, "Workflows").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CallbackKind {
    /// Fires once every job ended, whatever the outcome.
    OnComplete,
    /// Fires once every job ended, if none failed.
    OnSuccess,
    /// Fires once every job ended, if any failed.
    OnFailure,
}

impl CallbackKind {
    pub const ALL: [CallbackKind; 3] = [CallbackKind::OnComplete, CallbackKind::OnSuccess, CallbackKind::OnFailure];

    pub fn as_str(self) -> &'static str {
        match self {
            CallbackKind::OnComplete => "on_complete",
            CallbackKind::OnSuccess => "on_success",
            CallbackKind::OnFailure => "on_failure",
        }
    }

    pub fn parse(name: &str) -> Option<CallbackKind> {
        CallbackKind::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

/// A job as the engine holds it. The fields a job only gathers once it is
/// claimed, cancelled or discarded live out of line in [`JobRun`], so a job
/// that only waits (most of a backlog) does not pay for them. In logs and
/// snapshots a job is one flat list of fields (`stored.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: JobId,
    pub payload: JobPayload,
    pub queue: QueueName,
    pub state: JobState,
    /// −100 to 100 (`limits::PRIORITY_MIN`, `PRIORITY_MAX`).
    pub priority: i8,
    /// At most a day (`limits::TIMEOUT_MS_MAX`), as is the visibility timeout.
    pub timeout_ms: u32,
    pub visibility_timeout_ms: u32,
    pub retry: Arc<RetryPolicy>,
    /// Claims so far; only fetch raises it.
    pub attempt: u32,
    pub created_at: Millis,
    scheduled_at: OptionalTime,
    enqueued_at: OptionalTime,
    run: RunSlot,
    /// Attributes few jobs carry (its extras, an expiry); empty for most.
    extras: JobExtras,
}

/// What few jobs carry: their [`JobExtra`]s and an expiry. One pointer,
/// null for a job with neither (most). The job's fields are sized so that
/// it fills a 112-byte allocation with its reference counts (docs/perf-log.md,
/// "Memory per job").
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct JobExtras(Option<Box<RareFields>>);

#[derive(Debug, Clone, PartialEq)]
struct RareFields {
    list: Box<[JobExtra]>,
    expires_at: OptionalTime,
}

impl JobExtras {
    /// The extras `list` and the expiry `expires_at`.
    pub(crate) fn new(list: Vec<JobExtra>, expires_at: Option<Millis>) -> JobExtras {
        let expires_at = OptionalTime::from(expires_at);
        let none = list.is_empty() && expires_at.get().is_none();
        JobExtras((!none).then(|| Box::new(RareFields { list: list.into_boxed_slice(), expires_at })))
    }

    fn expires_at(&self) -> Option<Millis> {
        self.0.as_ref().and_then(|rare| rare.expires_at.get())
    }

    fn set_expires_at(&mut self, at: Option<Millis>) {
        *self = JobExtras::new(self.to_vec(), at);
    }

    fn push(&mut self, extra: JobExtra) {
        let mut list = self.to_vec();
        list.push(extra);
        *self = JobExtras::new(list, self.expires_at());
    }

    /// Keeps the extras `keep` says yes to.
    fn retain(&mut self, mut keep: impl FnMut(&JobExtra) -> bool) {
        if self.iter().all(&mut keep) {
            return;
        }
        let list = self.iter().filter(|extra| keep(extra)).cloned().collect();
        *self = JobExtras::new(list, self.expires_at());
    }
}

impl std::ops::Deref for JobExtras {
    type Target = [JobExtra];
    fn deref(&self) -> &[JobExtra] {
        self.0.as_deref().map_or(&[], |rare| &rare.list)
    }
}

/// What a job gathers once it is claimed, cancelled or discarded. Its
/// fields are stored in this order, inside a job's (`stored.rs`).
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct JobRun {
    pub started_at: Option<Millis>,
    pub completed_at: Option<Millis>,
    pub cancelled_at: Option<Millis>,
    pub discarded_at: Option<Millis>,
    pub retry_at: Option<Millis>,
    pub retry_delay_ms: Option<u64>,
    pub worker_id: Option<String>,
    /// Compact JSON text of the ack result.
    pub result: Option<String>,
    pub error: Option<FailureReport>,
    pub errors: Vec<ErrorEntry>,
    /// While `active`: when the claim runs out unless extended.
    pub visibility_deadline: Option<Millis>,
    /// While `active`: when the attempt counts as timed out.
    pub execution_deadline: Option<Millis>,
    /// While `active`: the visibility timeout of this claim (a fetch may
    /// override the job's), which heartbeats extend by. 0 when unknown.
    pub claim_visibility_ms: u64,
}

/// A job's [`JobRun`], allocated when first written. Empty and an
/// all-default run are the same run.
#[derive(Debug, Clone, Default)]
struct RunSlot(Option<Box<JobRun>>);

static NO_RUN: std::sync::LazyLock<JobRun> = std::sync::LazyLock::new(JobRun::default);

impl PartialEq for RunSlot {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_deref().unwrap_or(&NO_RUN) == other.0.as_deref().unwrap_or(&NO_RUN)
    }
}

impl Job {
    /// A new job from a validated request: `state` is where it starts
    /// (`available`, `scheduled` or `pending`); times are already resolved.
    pub fn accept(
        new_job: NewJob,
        id: JobId,
        state: JobState,
        now: Millis,
        scheduled_at: Option<Millis>,
        expires_at: Option<Millis>,
    ) -> Job {
        let mut extras = Vec::new();
        if let Some(policy) = new_job.unique {
            let key = policy.fingerprint(new_job.payload.job_type(), new_job.payload.args());
            extras.push(JobExtra::Unique { policy, key });
        }
        if let Some(limit) = new_job.rate_limit {
            extras.push(JobExtra::RateLimit(limit));
        }
        if let Some(schema) = new_job.schema {
            extras.push(JobExtra::Schema(schema));
        }
        Job {
            id,
            payload: new_job.payload,
            queue: new_job.queue,
            state,
            priority: priority_field(new_job.priority),
            timeout_ms: timeout_field(new_job.timeout_ms),
            visibility_timeout_ms: timeout_field(new_job.visibility_timeout_ms),
            retry: new_job.retry,
            attempt: 0,
            created_at: now,
            scheduled_at: scheduled_at.into(),
            enqueued_at: (state == JobState::Available).then_some(now).into(),
            run: RunSlot::default(),
            extras: JobExtras::new(extras, expires_at),
        }
    }

    /// When a scheduled job becomes available.
    pub fn scheduled_at(&self) -> Option<Millis> {
        self.scheduled_at.get()
    }

    pub fn set_scheduled_at(&mut self, at: Option<Millis>) {
        self.scheduled_at = at.into();
    }

    /// When the job expires unless it was claimed by then.
    pub fn expires_at(&self) -> Option<Millis> {
        self.extras.expires_at()
    }

    pub fn set_expires_at(&mut self, at: Option<Millis>) {
        self.extras.set_expires_at(at);
    }

    /// Attributes few jobs carry (unique keys, dispatch limits, schemas…).
    pub fn extras(&self) -> &[JobExtra] {
        &self.extras
    }

    /// When the job last became available (its place in the ready order).
    pub fn enqueued_at(&self) -> Option<Millis> {
        self.enqueued_at.get()
    }

    pub fn set_enqueued_at(&mut self, at: Option<Millis>) {
        self.enqueued_at = at.into();
    }

    /// What the job gathered once claimed, cancelled or discarded (all
    /// empty for a job that only waited).
    pub fn run(&self) -> &JobRun {
        self.run.0.as_deref().unwrap_or(&NO_RUN)
    }

    /// The job's run to change, if it has one (clearing a field of a job
    /// that never ran needs no allocation).
    pub fn run_if_any_mut(&mut self) -> Option<&mut JobRun> {
        self.run.0.as_deref_mut()
    }

    /// The job's run, to change; allocated on first use.
    pub fn run_mut(&mut self) -> &mut JobRun {
        self.run.0.get_or_insert_with(Box::default)
    }

    /// The unique policy and fingerprint, if the job has one.
    pub fn unique(&self) -> Option<(&UniquePolicy, UniqueKey)> {
        self.extras.iter().find_map(|extra| match extra {
            JobExtra::Unique { policy, key } => Some((&**policy, *key)),
            _ => None,
        })
    }

    /// The dispatch limit, if the job has one.
    pub fn dispatch_limit(&self) -> Option<&DispatchLimit> {
        self.extras.iter().find_map(|extra| match extra {
            JobExtra::RateLimit(limit) => Some(&**limit),
            _ => None,
        })
    }

    /// The key the job's dispatch limit counts under: its own, or its queue's name.
    pub fn dispatch_key(&self) -> Option<&str> {
        self.limit_and_key().map(|(_, key)| key)
    }

    /// The job's dispatch limit with the key it counts under.
    pub fn limit_and_key(&self) -> Option<(&DispatchLimit, &str)> {
        self.dispatch_limit().map(|limit| (limit, limit.key.as_deref().unwrap_or(&self.queue)))
    }

    /// The URI of the schema the job's `args` were checked against.
    pub fn schema(&self) -> Option<&str> {
        self.extras.iter().find_map(|extra| match extra {
            JobExtra::Schema(uri) => Some(&**uri),
            _ => None,
        })
    }

    /// When the job last left `pending`.
    pub fn activated_at(&self) -> Option<Millis> {
        self.extras.iter().find_map(|extra| match extra {
            JobExtra::ActivatedAt(at) => Some(*at),
            _ => None,
        })
    }

    /// The workflow the job belongs to, and its part in it.
    pub fn workflow(&self) -> Option<(WorkflowId, WorkflowRole)> {
        self.extras.iter().find_map(|extra| match extra {
            JobExtra::Workflow { id, role } => Some((*id, *role)),
            _ => None,
        })
    }

    /// Adds an extra (the caller makes sure there is no other of its kind).
    pub fn push_extra(&mut self, extra: JobExtra) {
        self.extras.push(extra);
    }

    pub fn set_activated_at(&mut self, at: Millis) {
        self.extras.retain(|extra| !matches!(extra, JobExtra::ActivatedAt(_)));
        self.extras.push(JobExtra::ActivatedAt(at));
    }

    pub fn max_attempts(&self) -> u32 {
        self.retry.max_attempts
    }

    /// About how many bytes of memory this job holds: its own fields, its
    /// texts, and its entries in the engine's and the read view's maps. A pure
    /// function of the job's contents, so adding and removing it balance.
    pub fn held_bytes(&self) -> u64 {
        /// A job's entries in the state's and the read view's id maps.
        const INDEX_BYTES: usize = 96;
        /// What an extra holds out of line (a policy) and its index entry.
        const EXTRA_BYTES: usize = 128;
        let payload = &self.payload;
        let payload_bytes = payload.held_bytes();
        let run = self.run();
        let run_bytes = if *run == *NO_RUN { 0 } else { std::mem::size_of::<JobRun>() }
            + run.error.as_ref().map_or(0, FailureReport::held_bytes)
            + run
                .errors
                .iter()
                .map(|entry| std::mem::size_of::<ErrorEntry>() + entry.report.held_bytes())
                .sum::<usize>()
            + run.worker_id.as_ref().map_or(0, String::len)
            + run.result.as_ref().map_or(0, String::len);
        let bytes = std::mem::size_of::<Job>()
            + INDEX_BYTES
            + payload_bytes
            + self.queue.len()
            + run_bytes
            + self.extras.0.as_ref().map_or(0, |_| std::mem::size_of::<RareFields>())
            + self.extras.len() * (std::mem::size_of::<JobExtra>() + EXTRA_BYTES)
            + self.progress().map_or(0, JobProgress::held_bytes);
        bytes as u64
    }
}

/// An optional instant in 8 bytes, where `Option<Millis>` takes 16: `None`
/// is held as `Millis::MIN`, far outside the years a time may name.
#[derive(Clone, Copy, PartialEq, Eq)]
struct OptionalTime(Millis);

impl OptionalTime {
    fn get(self) -> Option<Millis> {
        (self.0 != Millis::MIN).then_some(self.0)
    }
}

impl From<Option<Millis>> for OptionalTime {
    fn from(at: Option<Millis>) -> Self {
        // The one instant it cannot hold becomes the next one.
        OptionalTime(at.map_or(Millis::MIN, |at| at.max(Millis::MIN + 1)))
    }
}

impl std::fmt::Debug for OptionalTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

/// A validated priority in a job's field (validation bounds it to ±100).
pub(crate) fn priority_field(priority: i32) -> i8 {
    priority.clamp(i8::MIN.into(), i8::MAX.into()) as i8
}

/// A validated timeout in a job's field (validation bounds it to a day).
pub(crate) fn timeout_field(ms: u64) -> u32 {
    u32::try_from(ms).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_and_its_reference_counts_fill_a_112_byte_allocation() {
        assert_eq!(std::mem::size_of::<Job>() + 2 * std::mem::size_of::<usize>(), 112);
    }

    #[test]
    fn an_expiry_and_extras_are_kept_through_each_others_changes() {
        let mut extras = JobExtras::new(Vec::new(), None);
        assert!(extras.0.is_none(), "nothing out of line for a job with neither");
        extras.set_expires_at(Some(7));
        extras.push(JobExtra::ActivatedAt(1));
        extras.push(JobExtra::ActivatedAt(2));
        extras.retain(|extra| *extra != JobExtra::ActivatedAt(1));
        assert_eq!((extras.expires_at(), &*extras), (Some(7), &[JobExtra::ActivatedAt(2)][..]));
        extras.set_expires_at(None);
        assert_eq!((extras.expires_at(), &*extras), (None, &[JobExtra::ActivatedAt(2)][..]));
        extras.retain(|_| false);
        assert_eq!(extras, JobExtras::default(), "emptied, it takes no allocation again");
    }

    #[test]
    fn optional_times_keep_every_time_a_job_can_hold() {
        for at in [Some(0), Some(-1), Some(Millis::MAX), Some(Millis::MIN + 1), None] {
            assert_eq!(OptionalTime::from(at).get(), at);
        }
        assert_eq!(OptionalTime::from(Some(Millis::MIN)).get(), Some(Millis::MIN + 1));
    }
}
