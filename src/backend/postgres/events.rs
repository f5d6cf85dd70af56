//! Events on PostgreSQL (docs/postgres.md, "Events"): each change to a job
//! writes its events in its own transaction, so the listing shows exactly
//! the changes that committed; the leader keeps the newest
//! [`EVENTS_KEPT`] of them.
//!
//! An event's row holds its kind and the job as it was right after the
//! change, less the parts no event shows (its arguments, tags, unknown
//! fields and, but for a trace id, its `meta`); the HTTP front end renders
//! it as for the local engine.

use std::borrow::Cow;
use std::sync::Arc;

use deadpool_postgres::GenericClient;
use serde::{Deserialize, Serialize};
use tokio_postgres::types::ToSql;

use super::sql::Prepared;
use crate::backend::EventFilter;
use crate::clock::Millis;
use crate::engine::{
    CronInfo, CronSkip, EngineError, Event, EventId, EventKind, EventPage, SignalledWorker, Unavailable, WorkflowEvent,
    meta_may_hold_trace_id,
};
use crate::job::{FailureReport, Job, JobId, JobPayload, JobState};

/// Events the table keeps (the newest), as the local engine's buffer does.
pub const EVENTS_KEPT: i64 = 10_000;
/// Rows one listing request reads at most, whatever its filter keeps.
const SCAN_MAX: i64 = 10_000;
/// Rows read at a time while filtering.
const SCAN_CHUNK: i64 = 500;

/// An event's kind as stored: the job events this backend makes.
#[derive(Serialize, Deserialize)]
enum StoredKind {
    Enqueued,
    Scheduled,
    Started,
    Completed,
    Failed {
        report: FailureReport,
        attempt: u32,
    },
    Retrying {
        report: FailureReport,
    },
    Requeued {
        reason: String,
    },
    Discarded {
        reason: String,
    },
    Cancelled {
        previous_state: JobState,
        reason: String,
    },
    Revived,
    Deleted,
    Expired,
    CronTriggered {
        cron: StoredCron,
        run_count: u64,
    },
    CronSkipped {
        cron: StoredCron,
        reason: String,
        existing_job_id: Option<JobId>,
        missed_count: Option<u32>,
    },
    Progress,
    QueuePaused {
        queue: String,
    },
    QueueResumed {
        queue: String,
    },
    WorkerStarted {
        worker_id: String,
    },
    WorkerSignalled {
        worker_id: String,
        terminate: bool,
        active_job_ids: Vec<JobId>,
    },
    Workflow {
        id: crate::job::WorkflowId,
        event: StoredWorkflowEvent,
    },
    /// `job.started`, written by a claim in SQL (`claims.rs`): the job that
    /// follows is the job before the claim, which reading applies (the
    /// event's time is the claim's). Last, so the kinds before keep their
    /// stored tags.
    Claimed {
        worker_id: Option<String>,
        visibility_ms: Option<u64>,
    },
}

/// A workflow event as stored: the engine's, its names as text.
#[derive(Serialize, Deserialize)]
enum StoredWorkflowEvent {
    Started { name: Option<String>, workflow_type: String, jobs_total: usize },
    StepCompleted { index: usize, job_id: JobId, job_type: String, steps_remaining: usize },
    CallbackFired { callback: String, job_id: JobId },
    Completed { workflow_type: String, duration_ms: Millis },
    Failed { workflow_type: String, failed_index: Option<u32>, failed_job_id: JobId, error: Option<FailureReport> },
    Cancelled { jobs_cancelled: usize },
}

/// The names a workflow event carries, as the engine spells them.
const WORKFLOW_NAMES: &[&str] = &["chain", "group", "batch", "on_complete", "on_success", "on_failure"];

fn workflow_name(text: &str) -> &'static str {
    WORKFLOW_NAMES.iter().copied().find(|known| *known == text).unwrap_or("unknown")
}

impl StoredWorkflowEvent {
    fn of(event: &WorkflowEvent) -> StoredWorkflowEvent {
        match event.clone() {
            WorkflowEvent::Started { name, workflow_type, jobs_total } => {
                StoredWorkflowEvent::Started { name, workflow_type: workflow_type.into(), jobs_total }
            }
            WorkflowEvent::StepCompleted { index, job_id, job_type, steps_remaining } => {
                StoredWorkflowEvent::StepCompleted { index, job_id, job_type, steps_remaining }
            }
            WorkflowEvent::CallbackFired { callback, job_id } => {
                StoredWorkflowEvent::CallbackFired { callback: callback.into(), job_id }
            }
            WorkflowEvent::Completed { workflow_type, duration_ms } => {
                StoredWorkflowEvent::Completed { workflow_type: workflow_type.into(), duration_ms }
            }
            WorkflowEvent::Failed { workflow_type, failed_index, failed_job_id, error } => {
                StoredWorkflowEvent::Failed { workflow_type: workflow_type.into(), failed_index, failed_job_id, error }
            }
            WorkflowEvent::Cancelled { jobs_cancelled } => StoredWorkflowEvent::Cancelled { jobs_cancelled },
        }
    }

    fn event(self) -> WorkflowEvent {
        match self {
            StoredWorkflowEvent::Started { name, workflow_type, jobs_total } => {
                WorkflowEvent::Started { name, workflow_type: workflow_name(&workflow_type), jobs_total }
            }
            StoredWorkflowEvent::StepCompleted { index, job_id, job_type, steps_remaining } => {
                WorkflowEvent::StepCompleted { index, job_id, job_type, steps_remaining }
            }
            StoredWorkflowEvent::CallbackFired { callback, job_id } => {
                WorkflowEvent::CallbackFired { callback: workflow_name(&callback), job_id }
            }
            StoredWorkflowEvent::Completed { workflow_type, duration_ms } => {
                WorkflowEvent::Completed { workflow_type: workflow_name(&workflow_type), duration_ms }
            }
            StoredWorkflowEvent::Failed { workflow_type, failed_index, failed_job_id, error } => {
                WorkflowEvent::Failed {
                    workflow_type: workflow_name(&workflow_type),
                    failed_index,
                    failed_job_id,
                    error,
                }
            }
            StoredWorkflowEvent::Cancelled { jobs_cancelled } => WorkflowEvent::Cancelled { jobs_cancelled },
        }
    }
}

/// The cron entry an event tells of, as stored.
#[derive(Serialize, Deserialize)]
struct StoredCron {
    name: String,
    schedule: String,
    timezone: String,
    scheduled_time: Millis,
}

impl StoredCron {
    fn of(cron: &CronInfo) -> StoredCron {
        StoredCron {
            name: cron.name.clone(),
            schedule: cron.schedule.clone(),
            timezone: cron.timezone.clone(),
            scheduled_time: cron.scheduled_time,
        }
    }

    fn info(self) -> CronInfo {
        CronInfo {
            name: self.name,
            schedule: self.schedule,
            timezone: self.timezone,
            scheduled_time: self.scheduled_time,
        }
    }
}

/// The reasons events carry, as the engine names them.
const REASONS: &[&str] = &[
    "nack_requeue",
    "visibility_timeout",
    "exhausted",
    "non_retryable",
    "expired",
    "api",
    "shutdown",
    "terminate",
    "cron_cancel_previous",
    "overlap_skip",
    "queue_paused",
    "misfire",
    "dst_skip",
    "schema_not_registered",
    "duplicate",
    "unique_replace",
    "workflow_cancel",
    "workflow_failed",
    "disk_full",
];

fn reason(text: &str) -> &'static str {
    REASONS.iter().copied().find(|known| *known == text).unwrap_or("unknown")
}

impl StoredKind {
    fn of(kind: &EventKind) -> Option<StoredKind> {
        Some(match kind {
            EventKind::Enqueued => StoredKind::Enqueued,
            EventKind::Scheduled => StoredKind::Scheduled,
            EventKind::Started => StoredKind::Started,
            EventKind::Completed => StoredKind::Completed,
            EventKind::Failed { report, attempt } => {
                StoredKind::Failed { report: report.as_ref().clone(), attempt: *attempt }
            }
            EventKind::Retrying { report } => StoredKind::Retrying { report: report.as_ref().clone() },
            EventKind::Requeued { reason } => StoredKind::Requeued { reason: reason.to_string() },
            EventKind::Discarded { reason } => StoredKind::Discarded { reason: reason.to_string() },
            EventKind::Cancelled { previous_state, reason } => {
                StoredKind::Cancelled { previous_state: *previous_state, reason: reason.to_string() }
            }
            EventKind::Revived => StoredKind::Revived,
            EventKind::Expired => StoredKind::Expired,
            EventKind::Deleted => StoredKind::Deleted,
            EventKind::Progress => StoredKind::Progress,
            EventKind::QueuePaused(queue) => StoredKind::QueuePaused { queue: queue.clone() },
            EventKind::QueueResumed(queue) => StoredKind::QueueResumed { queue: queue.clone() },
            EventKind::WorkerStarted { worker_id } => StoredKind::WorkerStarted { worker_id: worker_id.clone() },
            // Only operators signal workers on this backend.
            EventKind::WorkerSignalled(signalled) => StoredKind::WorkerSignalled {
                worker_id: signalled.worker_id.clone(),
                terminate: signalled.terminate,
                active_job_ids: signalled.active_job_ids.clone(),
            },
            EventKind::CronTriggered { cron, run_count } => {
                StoredKind::CronTriggered { cron: StoredCron::of(cron), run_count: *run_count }
            }
            EventKind::CronSkipped(skip) => StoredKind::CronSkipped {
                cron: StoredCron::of(&skip.cron),
                reason: skip.reason.to_string(),
                existing_job_id: skip.existing_job_id,
                missed_count: skip.missed_count,
            },
            EventKind::Workflow { id, event } => {
                StoredKind::Workflow { id: *id, event: StoredWorkflowEvent::of(event) }
            }
            _ => return None,
        })
    }

    fn kind(self) -> EventKind {
        match self {
            StoredKind::Enqueued => EventKind::Enqueued,
            StoredKind::Scheduled => EventKind::Scheduled,
            StoredKind::Started | StoredKind::Claimed { .. } => EventKind::Started,
            StoredKind::Completed => EventKind::Completed,
            StoredKind::Failed { report, attempt } => EventKind::Failed { report: Box::new(report), attempt },
            StoredKind::Retrying { report } => EventKind::Retrying { report: Box::new(report) },
            StoredKind::Requeued { reason: why } => EventKind::Requeued { reason: reason(&why) },
            StoredKind::Discarded { reason: why } => EventKind::Discarded { reason: reason(&why) },
            StoredKind::Cancelled { previous_state, reason: why } => {
                EventKind::Cancelled { previous_state, reason: reason(&why) }
            }
            StoredKind::Revived => EventKind::Revived,
            StoredKind::Expired => EventKind::Expired,
            StoredKind::Deleted => EventKind::Deleted,
            StoredKind::Progress => EventKind::Progress,
            StoredKind::QueuePaused { queue } => EventKind::QueuePaused(queue),
            StoredKind::QueueResumed { queue } => EventKind::QueueResumed(queue),
            StoredKind::WorkerStarted { worker_id } => EventKind::WorkerStarted { worker_id },
            StoredKind::WorkerSignalled { worker_id, terminate, active_job_ids } => {
                EventKind::WorkerSignalled(Box::new(SignalledWorker {
                    worker_id,
                    terminate,
                    active_job_ids,
                    by: "operator",
                }))
            }
            StoredKind::CronTriggered { cron, run_count } => {
                EventKind::CronTriggered { cron: Box::new(cron.info()), run_count }
            }
            StoredKind::CronSkipped { cron, reason: why, existing_job_id, missed_count } => {
                EventKind::CronSkipped(Box::new(CronSkip {
                    cron: cron.info(),
                    reason: reason(&why),
                    existing_job_id,
                    missed_count,
                }))
            }
            StoredKind::Workflow { id, event } => EventKind::Workflow { id, event: Box::new(event.event()) },
        }
    }
}

/// The `INSERT` of events from the six arrays of [`EventRows`], given the
/// placeholders they are bound to (so that a statement of several parts
/// can number them).
macro_rules! insert_events {
    ($ids:literal, $times:literal, $types:literal, $queues:literal, $job_types:literal, $bodies:literal) => {
        concat!(
            "INSERT INTO svc_events (id, at, type, queue, job_type, body) \
             SELECT t.id::uuid, to_timestamp(t.at::float8 / 1000), t.type, t.queue, t.job_type, t.body \
             FROM unnest(",
            $ids,
            "::text[], ",
            $times,
            "::int8[], ",
            $types,
            "::text[], ",
            $queues,
            "::text[], ",
            $job_types,
            "::text[], ",
            $bodies,
            "::bytea[]) AS t(id, at, type, queue, job_type, body)"
        )
    };
}
pub(super) use insert_events;

/// Events to write, as the columns of [`insert_events`]: each with its
/// id, time and the job as it is after the change (none for an event about
/// a cron entry only). `body` is the stored kind, followed by the job when
/// there is one.
#[derive(Default)]
pub(super) struct EventRows<'a> {
    ids: Vec<String>,
    times: Vec<Millis>,
    types: Vec<&'static str>,
    queues: Vec<Option<&'a str>>,
    job_types: Vec<Option<&'a str>>,
    bodies: Vec<Vec<u8>>,
}

impl<'a> EventRows<'a> {
    pub(super) fn of(events: &[(JobId, Millis, EventKind, Option<&'a Job>)]) -> EventRows<'a> {
        let mut rows = EventRows::default();
        for (id, at, kind, job) in events {
            let Some(stored) = StoredKind::of(kind) else { continue };
            rows.ids.push(id.to_string());
            rows.times.push(*at);
            rows.types.push(kind.type_name());
            rows.queues.push(job.map(|job| job.queue.as_str()));
            rows.job_types.push(job.map(|job| job.payload.job_type()));
            let mut body = postcard::to_allocvec(&stored).expect("an event always encodes");
            if let Some(job) = job {
                body.extend(postcard::to_allocvec(&*as_an_event_holds(job)).expect("a job always encodes"));
            }
            rows.bodies.push(body);
        }
        rows
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The parameters, in the order [`insert_events`] names them.
    pub(super) fn params(&self) -> [&(dyn ToSql + Sync); 6] {
        [&self.ids, &self.times, &self.types, &self.queues, &self.job_types, &self.bodies]
    }
}

/// The job as an event row holds it: without its `args`, tags and unknown
/// fields, and without its `meta` unless that may hold a trace id. An
/// event's rendering and counting read the job's state, times, attempts,
/// result and errors, never those; so a job's arguments are written once,
/// in its own row, not again in each of its events (docs/postgres.md,
/// "Events").
fn as_an_event_holds(job: &Job) -> Cow<'_, Job> {
    let payload = &job.payload;
    let meta = if meta_may_hold_trace_id(payload.meta()) { payload.meta() } else { "{}" };
    if payload.args() == "[]" && payload.meta() == meta && payload.tags().is_empty() && payload.extra().is_empty() {
        return Cow::Borrowed(job);
    }
    let mut held = job.clone();
    held.payload = JobPayload::new(payload.job_type(), "[]", meta, Vec::new(), Vec::new());
    Cow::Owned(held)
}

/// The start of a `job.started` event's `body` that a claim in SQL writes,
/// the job before the claim to follow (see [`StoredKind::Claimed`]).
pub(super) fn claimed_header(worker_id: Option<&str>, visibility_ms: Option<u64>) -> Vec<u8> {
    let stored = StoredKind::Claimed { worker_id: worker_id.map(str::to_string), visibility_ms };
    postcard::to_allocvec(&stored).expect("an event always encodes")
}

/// Writes events of one transaction (see [`EventRows`]).
pub async fn append(
    client: &impl GenericClient,
    events: &[(JobId, Millis, EventKind, Option<&Job>)],
) -> Result<(), tokio_postgres::Error> {
    let rows = EventRows::of(events);
    if rows.is_empty() {
        return Ok(());
    }
    client.run(insert_events!("$1", "$2", "$3", "$4", "$5", "$6"), &rows.params()).await?;
    Ok(())
}

/// Events after `after` (an event id), oldest first, that `filter` keeps.
/// `gap` says that `after` is older than the oldest event kept, so events
/// may have been missed.
pub async fn page(
    client: &impl GenericClient,
    after: Option<&str>,
    limit: usize,
    filter: &EventFilter,
) -> Result<EventPage, EngineError> {
    let failed = |error: tokio_postgres::Error| {
        tracing::warn!(%error, "reading events failed");
        EngineError::Unavailable { reason: Unavailable::Database }
    };
    let mut cursor = match after {
        Some(text) => Some(EventId::parse(text).map(|id| id.0.to_string()).ok_or_else(|| {
            let error = crate::job::ValidationError::request(Some("after".to_string()), "after is not an event id");
            EngineError::Invalid { error, index: None }
        })?),
        None => None,
    };
    let gap = match &cursor {
        Some(after) => client
            .row("SELECT coalesce($1::text::uuid < (SELECT id FROM svc_events ORDER BY id LIMIT 1), false)", &[after])
            .await
            .map_err(failed)?
            .get(0),
        None => false,
    };
    let mut events = Vec::new();
    let mut scanned = 0;
    let mut has_more = false;
    while scanned < SCAN_MAX {
        let rows = client
            .rows(
                "SELECT id::text AS id_text, (extract(epoch FROM at) * 1000)::int8, body FROM svc_events \
                 WHERE $1::text IS NULL OR id > $1::text::uuid ORDER BY id LIMIT $2",
                &[&cursor, &SCAN_CHUNK],
            )
            .await
            .map_err(failed)?;
        let last_chunk = (rows.len() as i64) < SCAN_CHUNK;
        for row in rows {
            scanned += 1;
            let id: String = row.get(0);
            cursor = Some(id.clone());
            if events.len() == limit {
                has_more = true;
                break;
            }
            let Some(event) = decode(&id, row.get(1), row.get(2)) else { continue };
            if filter.keeps(&event) {
                events.push(event);
            }
        }
        if has_more || last_chunk {
            break;
        }
    }
    if scanned >= SCAN_MAX && !has_more {
        has_more = true;
    }
    Ok(EventPage { events, has_more, gap })
}

pub(super) fn decode(id: &str, at: i64, body: &[u8]) -> Option<Event> {
    decode_if(id, at, body, |_| true)
}

/// An event read back, its job decoded only where `wants_job` says so for
/// its kind (decoding the job is most of the cost of reading an event).
pub(super) fn decode_if(id: &str, at: i64, body: &[u8], wants_job: impl Fn(&EventKind) -> bool) -> Option<Event> {
    let id = JobId::parse(id)?;
    let decoded = postcard::take_from_bytes::<StoredKind>(body).and_then(|(stored, rest)| {
        let claim = match &stored {
            StoredKind::Claimed { worker_id, visibility_ms } => Some((worker_id.clone(), *visibility_ms)),
            _ => None,
        };
        let kind = stored.kind();
        let job = if rest.is_empty() || !wants_job(&kind) {
            None
        } else {
            let mut job = postcard::from_bytes::<Job>(rest)?;
            if let Some((worker_id, visibility_ms)) = claim {
                super::claims::apply_claim(&mut job, at, worker_id, visibility_ms);
            }
            Some(Arc::new(job))
        };
        Ok((kind, job))
    });
    match decoded {
        Ok((kind, job)) => Some(Event { seq: 0, id: EventId(id), time: at, kind, job }),
        Err(error) => {
            tracing::error!(%id, %error, "a stored event does not decode");
            None
        }
    }
}

/// Deletes all but the newest [`EVENTS_KEPT`] events, never one webhook
/// subscriptions have not been matched against yet; answers how many went.
pub async fn prune(client: &impl GenericClient) -> Result<u64, tokio_postgres::Error> {
    client
        .run(
            "DELETE FROM svc_events WHERE id < (SELECT id FROM svc_events ORDER BY id DESC OFFSET $1 LIMIT 1) \
             AND xid < (SELECT xid FROM svc_webhook_cursor)",
            &[&(EVENTS_KEPT - 1)],
        )
        .await
}
