//! Earlier encodings of logged and snapshotted values that this build still
//! reads (`docs/wal-format.md`). Each is decoded as written and upgraded at
//! once, so the rest of the engine only ever sees the current types.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::cron::record::{CronDelete, CronFired, CronPut};
use super::cron::table::{CronEntry, CronFire, CronOutcome};
use super::jobs::record::{Claim, FailOutcome, JobRecord, TimeoutKind};
use super::progress::record::ProgressReported;
use super::queues::record::{Backpressure, QueueConfigured, QueuePause};
use super::record::{Change, Logged};
use super::schemas::record::{SchemaDelete, SchemaPut};
use super::webhooks::outbox::{Delivery, QueuedDelivery, QueuedEvent};
use super::webhooks::record::{
    DeliveriesDone, DeliveriesQueued, DeliveriesQueuedOnce, DeliveryRetry, DeliveryStarted, WebhookDelete, WebhookPut,
};
use super::workers::entry::WorkerSignal;
use super::workers::record::{WorkerForgotten, WorkerSignalGiven};
use super::workflows::record::{WorkflowCancel, WorkflowCreate, WorkflowPrune};
use super::workflows::table::Workflow;
use crate::clock::Millis;
use crate::job::{
    DeliveryId, ErrorEntry, FailureReport, Job, JobId, JobPayload, JobRun, JobState, RetryPolicy, StoredJob,
    SubscriptionId, WorkflowId,
};
use crate::schema::SchemaEntry;
use crate::webhook::Subscription;

/// A job as logs and snapshots held it before jobs carried extras (unique
/// policies, dispatch limits, activation times).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobV1 {
    pub id: JobId,
    pub payload: JobPayload,
    pub queue: String,
    pub state: JobState,
    pub priority: i32,
    pub timeout_ms: u64,
    pub visibility_timeout_ms: u64,
    pub retry: Arc<RetryPolicy>,
    pub attempt: u32,
    pub created_at: Millis,
    pub scheduled_at: Option<Millis>,
    pub expires_at: Option<Millis>,
    pub enqueued_at: Option<Millis>,
    pub started_at: Option<Millis>,
    pub completed_at: Option<Millis>,
    pub cancelled_at: Option<Millis>,
    pub discarded_at: Option<Millis>,
    pub retry_at: Option<Millis>,
    pub retry_delay_ms: Option<u64>,
    pub worker_id: Option<String>,
    pub result: Option<String>,
    pub error: Option<Box<FailureReport>>,
    pub errors: Vec<ErrorEntry>,
    pub visibility_deadline: Option<Millis>,
    pub execution_deadline: Option<Millis>,
    pub claim_visibility_ms: u64,
}

impl From<JobV1> for Job {
    fn from(old: JobV1) -> Job {
        StoredJob {
            id: old.id,
            payload: old.payload,
            queue: old.queue.into(),
            state: old.state,
            priority: old.priority,
            timeout_ms: old.timeout_ms,
            visibility_timeout_ms: old.visibility_timeout_ms,
            retry: old.retry,
            attempt: old.attempt,
            created_at: old.created_at,
            scheduled_at: old.scheduled_at,
            expires_at: old.expires_at,
            enqueued_at: old.enqueued_at,
            run: JobRun {
                started_at: old.started_at,
                completed_at: old.completed_at,
                cancelled_at: old.cancelled_at,
                discarded_at: old.discarded_at,
                retry_at: old.retry_at,
                retry_delay_ms: old.retry_delay_ms,
                worker_id: old.worker_id,
                result: old.result,
                error: old.error.map(|report| *report),
                errors: old.errors,
                visibility_deadline: old.visibility_deadline,
                execution_deadline: old.execution_deadline,
                claim_visibility_ms: old.claim_visibility_ms,
            },
            extras: Box::default(),
        }
        .into()
    }
}

/// A cron evaluation as logged before jobs carried extras.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CronFireV1 {
    pub scheduled: Millis,
    pub missed: u32,
    pub skipped_gap: Option<Millis>,
    pub next_run_at: Option<Millis>,
    pub outcome: CronOutcomeV1,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CronOutcomeV1 {
    Enqueued { job: Box<JobV1>, cancelled: Option<JobId>, waits_for: Option<JobId> },
    Skipped { existing: JobId },
    QueuePaused,
}

impl From<CronFireV1> for CronFire {
    fn from(old: CronFireV1) -> CronFire {
        let outcome = match old.outcome {
            CronOutcomeV1::Enqueued { job, cancelled, waits_for } => {
                CronOutcome::Enqueued { job: Arc::new((*job).into()), cancelled, waits_for, replaced: Vec::new() }
            }
            CronOutcomeV1::Skipped { existing } => CronOutcome::Skipped { existing },
            CronOutcomeV1::QueuePaused => CronOutcome::QueuePaused,
        };
        CronFire {
            scheduled: old.scheduled,
            missed: old.missed,
            skipped_gap: old.skipped_gap,
            next_run_at: old.next_run_at,
            outcome,
        }
    }
}

/// A record as the first record format logged it: every kind a variant of
/// one enum, each carrying its own time (`docs/wal-format.md`, "Records of
/// the first format"). Read from logs written before the `Logged` form and
/// turned into it at once; written only by tests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RecordV1 {
    EnqueueV1 {
        at: Millis,
        jobs: Vec<JobV1>,
    },
    Claim {
        at: Millis,
        worker_id: Option<String>,
        claims: Vec<Claim>,
    },
    Ack {
        at: Millis,
        id: JobId,
        result: Option<String>,
    },
    Fail {
        at: Millis,
        id: JobId,
        report: FailureReport,
        outcome: FailOutcome,
    },
    Cancel {
        at: Millis,
        id: JobId,
    },
    Promote {
        at: Millis,
        ids: Vec<JobId>,
    },
    Expire {
        at: Millis,
        ids: Vec<JobId>,
    },
    Timeout {
        at: Millis,
        id: JobId,
        kind: TimeoutKind,
        outcome: FailOutcome,
    },
    Prune {
        at: Millis,
        ids: Vec<JobId>,
    },
    DeadLetterRetry {
        at: Millis,
        id: JobId,
    },
    Delete {
        at: Millis,
        id: JobId,
    },
    Heartbeat {
        at: Millis,
        extensions: Vec<(JobId, Millis)>,
    },
    WorkerSignal {
        at: Millis,
        worker_id: String,
        signal: WorkerSignal,
    },
    WorkerForget {
        at: Millis,
        worker_id: String,
    },
    CronPut {
        at: Millis,
        entry: CronEntry,
    },
    CronDelete {
        at: Millis,
        name: String,
    },
    CronFireV1 {
        at: Millis,
        name: String,
        fire: Box<CronFireV1>,
    },
    PruneCapped {
        at: Millis,
        ids: Vec<JobId>,
    },
    QueuePause {
        at: Millis,
        queue: String,
        paused: bool,
    },
    Enqueue {
        at: Millis,
        jobs: Vec<Arc<Job>>,
        replaced: Vec<JobId>,
    },
    CronFire {
        at: Millis,
        name: String,
        fire: CronFire,
    },
    Activate {
        at: Millis,
        id: JobId,
    },
    WorkflowCreate {
        at: Millis,
        workflow: Arc<Workflow>,
        jobs: Vec<Arc<Job>>,
        replaced: Vec<JobId>,
    },
    WorkflowCancel {
        at: Millis,
        id: WorkflowId,
    },
    WorkflowPrune {
        at: Millis,
        ids: Vec<WorkflowId>,
    },
    SchemaPut {
        at: Millis,
        entry: Arc<SchemaEntry>,
    },
    SchemaDelete {
        at: Millis,
        uri: String,
    },
    WebhookPut {
        at: Millis,
        subscription: Arc<Subscription>,
    },
    WebhookDelete {
        at: Millis,
        id: SubscriptionId,
    },
    DeliveriesQueued {
        at: Millis,
        deliveries: Vec<Arc<Delivery>>,
    },
    DeliveryStarted {
        at: Millis,
        ids: Vec<DeliveryId>,
        until: Millis,
    },
    DeliveryRetry {
        at: Millis,
        id: DeliveryId,
        next_at: Millis,
    },
    DeliveriesDone {
        at: Millis,
        ids: Vec<DeliveryId>,
    },
    DeliveriesQueuedOnce {
        at: Millis,
        events: Vec<QueuedEvent>,
        deliveries: Vec<QueuedDelivery>,
    },
    /// Its time was the progress's `updated_at`.
    Progress(ProgressReported),
    QueueConfig {
        at: Millis,
        queue: String,
        backpressure: Option<Backpressure>,
    },
}

impl From<RecordV1> for Logged {
    fn from(old: RecordV1) -> Logged {
        use RecordV1 as V1;
        let (at, change): (Millis, Change) = match old {
            V1::EnqueueV1 { at, jobs } => {
                let jobs = jobs.into_iter().map(|job| Arc::new(job.into())).collect();
                (at, JobRecord::Enqueue { jobs, replaced: Vec::new() }.into())
            }
            V1::Claim { at, worker_id, claims } => (at, JobRecord::Claim { worker_id, claims }.into()),
            V1::Ack { at, id, result } => (at, JobRecord::Ack { id, result }.into()),
            V1::Fail { at, id, report, outcome } => (at, JobRecord::Fail { id, report, outcome }.into()),
            V1::Cancel { at, id } => (at, JobRecord::Cancel { id }.into()),
            V1::Promote { at, ids } => (at, JobRecord::Promote { ids }.into()),
            V1::Expire { at, ids } => (at, JobRecord::Expire { ids }.into()),
            V1::Timeout { at, id, kind, outcome } => (at, JobRecord::Timeout { id, kind, outcome }.into()),
            V1::Prune { at, ids } => (at, JobRecord::Prune { ids }.into()),
            V1::DeadLetterRetry { at, id } => (at, JobRecord::DeadLetterRetry { id }.into()),
            V1::Delete { at, id } => (at, JobRecord::Delete { id }.into()),
            V1::Heartbeat { at, extensions } => (at, JobRecord::Heartbeat { extensions }.into()),
            V1::WorkerSignal { at, worker_id, signal } => (at, WorkerSignalGiven { worker_id, signal }.into()),
            V1::WorkerForget { at, worker_id } => (at, WorkerForgotten { worker_id }.into()),
            V1::CronPut { at, entry } => (at, CronPut { entry }.into()),
            V1::CronDelete { at, name } => (at, CronDelete { name }.into()),
            V1::CronFireV1 { at, name, fire } => (at, CronFired { name, fire: (*fire).into() }.into()),
            V1::PruneCapped { at, ids } => (at, JobRecord::PruneCapped { ids }.into()),
            V1::QueuePause { at, queue, paused } => (at, QueuePause { queue, paused }.into()),
            V1::Enqueue { at, jobs, replaced } => (at, JobRecord::Enqueue { jobs, replaced }.into()),
            V1::CronFire { at, name, fire } => (at, CronFired { name, fire }.into()),
            V1::Activate { at, id } => (at, JobRecord::Activate { id }.into()),
            V1::WorkflowCreate { at, workflow, jobs, replaced } => {
                (at, WorkflowCreate { workflow, jobs, replaced }.into())
            }
            V1::WorkflowCancel { at, id } => (at, WorkflowCancel { id }.into()),
            V1::WorkflowPrune { at, ids } => (at, WorkflowPrune { ids }.into()),
            V1::SchemaPut { at, entry } => (at, SchemaPut { entry }.into()),
            V1::SchemaDelete { at, uri } => (at, SchemaDelete { uri }.into()),
            V1::WebhookPut { at, subscription } => (at, WebhookPut { subscription }.into()),
            V1::WebhookDelete { at, id } => (at, WebhookDelete { id }.into()),
            V1::DeliveriesQueued { at, deliveries } => (at, DeliveriesQueued { deliveries }.into()),
            V1::DeliveryStarted { at, ids, until } => (at, DeliveryStarted { ids, until }.into()),
            V1::DeliveryRetry { at, id, next_at } => (at, DeliveryRetry { id, next_at }.into()),
            V1::DeliveriesDone { at, ids } => (at, DeliveriesDone { ids }.into()),
            V1::DeliveriesQueuedOnce { at, events, deliveries } => {
                (at, DeliveriesQueuedOnce { events, deliveries }.into())
            }
            V1::Progress(record) => (record.progress.updated_at, record.into()),
            V1::QueueConfig { at, queue, backpressure } => (at, QueueConfigured { queue, backpressure }.into()),
        };
        Logged { at, change }
    }
}
