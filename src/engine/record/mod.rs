//! Log records: fully decided state changes (ids, timestamps, chosen jobs,
//! retry delays), so replaying them through `State::apply` rebuilds exactly
//! the state the live engine had. Each is a [`Logged`]: when, and the
//! change of one feature, whose records are in that feature's folder. One
//! commit batch is one frame holding one or more record sequences
//! (`docs/wal-format.md`, "Payload"), written and read by `codec.rs`.

use serde::{Deserialize, Serialize};

use crate::clock::Millis;

use super::cron::record::{CronDelete, CronFired, CronPut, CronRecord};
use super::progress::record::ProgressReported;
use super::queues::record::{QueueConfigured, QueuePause, QueueRecord};
use super::schemas::record::{SchemaDelete, SchemaPut, SchemaRecord};
use super::webhooks::record::{
    DeliveriesDone, DeliveriesQueued, DeliveriesQueuedOnce, DeliveryRetry, DeliveryStarted, WebhookDelete, WebhookPut,
    WebhookRecord,
};
use super::workers::record::{WorkerForgotten, WorkerRecord, WorkerSignalGiven};
use super::workflows::record::{WorkflowCancel, WorkflowCreate, WorkflowPrune, WorkflowRecord};

mod codec;

pub use super::jobs::record::{Claim, FailOutcome, JobRecord, TimeoutKind};
pub use codec::{RECORD_FORMAT, decode_batch, encode_batch, encode_sequences, encode_sequences_into};

/// One logged change and when it was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Logged {
    pub at: Millis,
    pub change: Change,
}

impl Logged {
    pub fn new(at: Millis, change: impl Into<Change>) -> Logged {
        Logged { at, change: change.into() }
    }

    /// The record's name, as `svc inspect` counts it.
    pub fn kind(&self) -> &'static str {
        match &self.change {
            Change::Jobs(record) => record.kind(),
            Change::Queues(record) => record.kind(),
            Change::Workers(record) => record.kind(),
            Change::Cron(record) => record.kind(),
            Change::Workflows(record) => record.kind(),
            Change::Schemas(record) => record.kind(),
            Change::Webhooks(record) => record.kind(),
            Change::Progress(_) => "progress",
        }
    }
}

/// What a record changes: one line per feature. The variant order is part
/// of the log format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Change {
    Jobs(JobRecord),
    Queues(QueueRecord),
    Workers(WorkerRecord),
    Cron(CronRecord),
    Workflows(WorkflowRecord),
    Schemas(SchemaRecord),
    Webhooks(WebhookRecord),
    Progress(ProgressReported),
}

/// A feature's records, and each of their payloads, are a [`Change`].
macro_rules! change_from {
    ($($feature:ident($record:ty) { $($payload:ty => $variant:ident),* $(,)? }),* $(,)?) => {
        $(
            impl From<$record> for Change {
                fn from(record: $record) -> Change {
                    Change::$feature(record)
                }
            }
            $(impl From<$payload> for Change {
                fn from(record: $payload) -> Change {
                    Change::$feature(<$record>::$variant(record))
                }
            })*
        )*
    };
}

change_from!(
    Jobs(JobRecord) {},
    Queues(QueueRecord) { QueuePause => Pause, QueueConfigured => Configure },
    Workers(WorkerRecord) { WorkerSignalGiven => Signal, WorkerForgotten => Forget },
    Cron(CronRecord) { CronPut => Put, CronDelete => Delete, CronFired => Fire },
    Workflows(WorkflowRecord) { WorkflowCreate => Create, WorkflowCancel => Cancel, WorkflowPrune => Prune },
    Schemas(SchemaRecord) { SchemaPut => Put, SchemaDelete => Delete },
    Webhooks(WebhookRecord) {
        WebhookPut => Put,
        WebhookDelete => Delete,
        DeliveriesQueuedOnce => DeliveriesQueued,
        DeliveryStarted => DeliveryStarted,
        DeliveryRetry => DeliveryRetry,
        DeliveriesDone => DeliveriesDone,
        DeliveriesQueued => DeliveriesQueuedWhole,
    },
    Progress(ProgressReported) {},
);
