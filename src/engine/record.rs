//! Log records: fully decided state changes (ids, timestamps, chosen jobs,
//! retry delays), so replaying them through `State::apply` rebuilds exactly
//! the state the live engine had. One commit batch is one frame holding a
//! postcard-encoded `Vec<Record>`.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::clock::Millis;
use crate::job::postcard_form::{put_serde, put_signed, put_unsigned};
use crate::job::{FailureReport, Job, JobId, StoredJobEncoder};
use crate::limits::FRAME_PAYLOAD_BYTES_MAX;

use super::legacy::{CronFireV1, JobV1};

/// A claim made by a fetch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claim {
    pub id: JobId,
    pub visibility_deadline: Millis,
    pub execution_deadline: Millis,
}

/// What a failed attempt leads to; logged in `Fail` and `Timeout` records.
pub use crate::job::transition::FailOutcome;

/// Which claim deadline ran out; logged in `Timeout` records.
pub use crate::job::transition::TimeoutKind;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Record {
    /// `Enqueue` as logged before jobs carried extras; upgraded when read.
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
    /// `scheduled` or `retryable` jobs whose time came.
    Promote {
        at: Millis,
        ids: Vec<JobId>,
    },
    /// Unclaimed jobs past `expires_at`.
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
    /// Terminal jobs past their retention.
    Prune {
        at: Millis,
        ids: Vec<JobId>,
    },
    /// A discarded job sent back to `available` from the dead letter listing.
    DeadLetterRetry {
        at: Millis,
        id: JobId,
    },
    /// A discarded job removed for good from the dead letter listing.
    Delete {
        at: Millis,
        id: JobId,
    },
    /// Claims extended by a worker's heartbeat: (job, new visibility deadline).
    Heartbeat {
        at: Millis,
        extensions: Vec<(JobId, Millis)>,
    },
    WorkerSignal(super::workers::record::WorkerSignalGiven),
    WorkerForget(super::workers::record::WorkerForgotten),
    CronPut(super::cron::record::CronPut),
    CronDelete(super::cron::record::CronDelete),
    /// `CronFire` as logged before jobs carried extras; upgraded when read.
    CronFireV1 {
        at: Millis,
        name: String,
        fire: Box<CronFireV1>,
    },
    /// Terminal jobs pruned, oldest first, to hold the retention caps on
    /// terminal jobs' count and bytes.
    PruneCapped {
        at: Millis,
        ids: Vec<JobId>,
    },
    QueuePause(super::queues::record::QueuePause),
    /// New jobs, complete with id, state and timestamps; a batch enqueue is
    /// one record. `replaced` are the jobs a unique `replace` policy cancels
    /// first. The jobs are shared with the state that applies them.
    Enqueue {
        at: Millis,
        jobs: Vec<Arc<Job>>,
        replaced: Vec<JobId>,
    },
    CronFire(super::cron::record::CronFired),
    /// A staged (`pending`) job activated: `available`, or `scheduled` when
    /// its time has not come.
    Activate {
        at: Millis,
        id: JobId,
    },
    WorkflowCreate(super::workflows::record::WorkflowCreate),
    WorkflowCancel(super::workflows::record::WorkflowCancel),
    WorkflowPrune(super::workflows::record::WorkflowPrune),
    SchemaPut(super::schemas::record::SchemaPut),
    SchemaDelete(super::schemas::record::SchemaDelete),
    WebhookPut(super::webhooks::record::WebhookPut),
    WebhookDelete(super::webhooks::record::WebhookDelete),
    DeliveriesQueued(super::webhooks::record::DeliveriesQueued),
    DeliveryStarted(super::webhooks::record::DeliveryStarted),
    DeliveryRetry(super::webhooks::record::DeliveryRetry),
    DeliveriesDone(super::webhooks::record::DeliveriesDone),
    DeliveriesQueuedOnce(super::webhooks::record::DeliveriesQueuedOnce),
    Progress(super::progress::record::ProgressReported),
    QueueConfig(super::queues::record::QueueConfigured),
}

impl Record {
    /// The current form of a record read from the log.
    fn upgrade(self) -> Record {
        match self {
            Record::EnqueueV1 { at, jobs } => Record::Enqueue {
                at,
                jobs: jobs.into_iter().map(|job| Arc::new(job.into())).collect(),
                replaced: Vec::new(),
            },
            Record::CronFireV1 { at, name, fire } => {
                Record::CronFire(super::cron::record::CronFired { at, name, fire: (*fire).into() })
            }
            current => current,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Record::Enqueue { .. } | Record::EnqueueV1 { .. } => "enqueue",
            Record::Claim { .. } => "claim",
            Record::Ack { .. } => "ack",
            Record::Fail { .. } => "fail",
            Record::Cancel { .. } => "cancel",
            Record::Promote { .. } => "promote",
            Record::Expire { .. } => "expire",
            Record::Timeout { .. } => "timeout",
            Record::Prune { .. } => "prune",
            Record::DeadLetterRetry { .. } => "dead_letter_retry",
            Record::Delete { .. } => "delete",
            Record::Heartbeat { .. } => "heartbeat",
            Record::WorkerSignal(_) => "worker_signal",
            Record::WorkerForget(_) => "worker_forget",
            Record::CronPut(_) => "cron_put",
            Record::CronDelete(_) => "cron_delete",
            Record::CronFire(_) | Record::CronFireV1 { .. } => "cron_fire",
            Record::PruneCapped { .. } => "prune_capped",
            Record::QueuePause(_) => "queue_pause",
            Record::Activate { .. } => "activate",
            Record::WorkflowCreate(_) => "workflow_create",
            Record::WorkflowCancel(_) => "workflow_cancel",
            Record::WorkflowPrune(_) => "workflow_prune",
            Record::SchemaPut(_) => "schema_put",
            Record::SchemaDelete(_) => "schema_delete",
            Record::WebhookPut(_) => "webhook_put",
            Record::WebhookDelete(_) => "webhook_delete",
            Record::DeliveriesQueued(_) => "deliveries_queued",
            Record::DeliveryStarted(_) => "delivery_started",
            Record::DeliveryRetry(_) => "delivery_retry",
            Record::DeliveriesDone(_) => "deliveries_done",
            Record::DeliveriesQueuedOnce(_) => "deliveries_queued",
            Record::Progress(_) => "progress",
            Record::QueueConfig(_) => "queue_config",
        }
    }

    /// When the record's change happened.
    pub fn at(&self) -> Millis {
        match self {
            Record::Enqueue { at, .. }
            | Record::EnqueueV1 { at, .. }
            | Record::CronFireV1 { at, .. }
            | Record::Activate { at, .. }
            | Record::Claim { at, .. }
            | Record::Ack { at, .. }
            | Record::Fail { at, .. }
            | Record::Cancel { at, .. }
            | Record::Promote { at, .. }
            | Record::Expire { at, .. }
            | Record::Timeout { at, .. }
            | Record::Prune { at, .. }
            | Record::DeadLetterRetry { at, .. }
            | Record::Delete { at, .. }
            | Record::Heartbeat { at, .. }
            | Record::PruneCapped { at, .. }
            | Record::QueuePause(super::queues::record::QueuePause { at, .. })
            | Record::QueueConfig(super::queues::record::QueueConfigured { at, .. })
            | Record::WorkerSignal(super::workers::record::WorkerSignalGiven { at, .. })
            | Record::WorkerForget(super::workers::record::WorkerForgotten { at, .. })
            | Record::SchemaPut(super::schemas::record::SchemaPut { at, .. })
            | Record::SchemaDelete(super::schemas::record::SchemaDelete { at, .. })
            | Record::CronPut(super::cron::record::CronPut { at, .. })
            | Record::CronDelete(super::cron::record::CronDelete { at, .. })
            | Record::CronFire(super::cron::record::CronFired { at, .. })
            | Record::WorkflowCreate(super::workflows::record::WorkflowCreate { at, .. })
            | Record::WorkflowCancel(super::workflows::record::WorkflowCancel { at, .. })
            | Record::WorkflowPrune(super::workflows::record::WorkflowPrune { at, .. })
            | Record::WebhookPut(super::webhooks::record::WebhookPut { at, .. })
            | Record::WebhookDelete(super::webhooks::record::WebhookDelete { at, .. })
            | Record::DeliveriesQueued(super::webhooks::record::DeliveriesQueued { at, .. })
            | Record::DeliveryStarted(super::webhooks::record::DeliveryStarted { at, .. })
            | Record::DeliveryRetry(super::webhooks::record::DeliveryRetry { at, .. })
            | Record::DeliveriesDone(super::webhooks::record::DeliveriesDone { at, .. })
            | Record::DeliveriesQueuedOnce(super::webhooks::record::DeliveriesQueuedOnce { at, .. }) => *at,
            Record::Progress(record) => record.at(),
        }
    }
}

/// A feature's record payload is its `Record` variant.
macro_rules! record_from {
    ($($payload:ty => $variant:ident),* $(,)?) => {
        $(impl From<$payload> for Record {
            fn from(record: $payload) -> Record {
                Record::$variant(record)
            }
        })*
    };
}

record_from!(
    super::queues::record::QueuePause => QueuePause,
    super::queues::record::QueueConfigured => QueueConfig,
    super::schemas::record::SchemaPut => SchemaPut,
    super::schemas::record::SchemaDelete => SchemaDelete,
    super::cron::record::CronPut => CronPut,
    super::cron::record::CronDelete => CronDelete,
    super::cron::record::CronFired => CronFire,
    super::workflows::record::WorkflowCreate => WorkflowCreate,
    super::workflows::record::WorkflowCancel => WorkflowCancel,
    super::workflows::record::WorkflowPrune => WorkflowPrune,
    super::webhooks::record::WebhookPut => WebhookPut,
    super::webhooks::record::WebhookDelete => WebhookDelete,
    super::webhooks::record::DeliveriesQueued => DeliveriesQueued,
    super::webhooks::record::DeliveryStarted => DeliveryStarted,
    super::webhooks::record::DeliveryRetry => DeliveryRetry,
    super::webhooks::record::DeliveriesDone => DeliveriesDone,
    super::webhooks::record::DeliveriesQueuedOnce => DeliveriesQueuedOnce,
    super::workers::record::WorkerSignalGiven => WorkerSignal,
    super::workers::record::WorkerForgotten => WorkerForget,
    super::progress::record::ProgressReported => Progress,
);

/// Encodes one commit batch: the same bytes as postcard gives the slice of
/// records, with the jobs of enqueue records written by
/// [`StoredJobEncoder`] rather than through serde field by field.
pub fn encode_batch(records: &[Record], out: &mut Vec<u8>) {
    out.clear();
    let mut jobs = StoredJobEncoder::default();
    put_unsigned(out, records.len() as u64);
    for record in records {
        match record {
            Record::Enqueue { at, jobs: new_jobs, replaced } => {
                out.extend_from_slice(enqueue_tag());
                put_signed(out, *at);
                put_unsigned(out, new_jobs.len() as u64);
                for job in new_jobs {
                    jobs.encode(job, out);
                }
                put_serde(out, replaced);
            }
            other => put_serde(out, other),
        }
    }
}

/// How postcard begins an `Enqueue` record: its variant's index, as the
/// encoding of an empty one shows it (so it follows the enum's order).
fn enqueue_tag() -> &'static [u8] {
    static TAG: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let empty = Record::Enqueue { at: 0, jobs: Vec::new(), replaced: Vec::new() };
        let mut encoded = postcard::to_allocvec(&empty).expect("records encode into a Vec without failing");
        // The three empty fields: a zero time and two empty lists.
        assert!(encoded.ends_with(&[0, 0, 0]), "an empty Enqueue ends in its three empty fields");
        encoded.truncate(encoded.len() - 3);
        encoded
    })
}

/// Encodes records as one or more sequences, each at most half a frame, so
/// that any one of them fits a frame with room to spare.
pub fn encode_sequences(records: &[Record]) -> Vec<Vec<u8>> {
    encode_sequences_into(records, Vec::new())
}

/// [`encode_sequences`], the first sequence written into `buffer`: the
/// engine hands back the room the last turn's records took, where a new
/// vector grew by doubling through every turn's megabyte.
pub fn encode_sequences_into(records: &[Record], buffer: Vec<u8>) -> Vec<Vec<u8>> {
    if records.is_empty() {
        return Vec::new();
    }
    let mut encoded = buffer;
    encode_batch(records, &mut encoded);
    if encoded.len() <= FRAME_PAYLOAD_BYTES_MAX / 2 || records.len() == 1 {
        return vec![encoded];
    }
    let (first, second) = records.split_at(records.len() / 2);
    let mut sequences = encode_sequences_into(first, encoded);
    sequences.extend(encode_sequences(second));
    sequences
}

/// Decodes a frame's payload: one or more record sequences back to back.
/// Never panics; allocation is bounded by the input.
pub fn decode_batch(mut bytes: &[u8]) -> Result<Vec<Record>, String> {
    let mut records = Vec::new();
    loop {
        match postcard::take_from_bytes::<Vec<Record>>(bytes) {
            Ok((sequence, rest)) => {
                records.extend(sequence.into_iter().map(Record::upgrade));
                if rest.is_empty() {
                    return Ok(records);
                }
                bytes = rest;
            }
            Err(error) => return Err(format!("undecodable records: {error}")),
        }
    }
}
