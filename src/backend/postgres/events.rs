//! Events on PostgreSQL (docs/postgres.md, "Events"): each change to a job
//! writes its events in its own transaction, so the listing shows exactly
//! the changes that committed; the leader keeps the newest
//! [`EVENTS_KEPT`] of them.
//!
//! An event's row holds its kind and the job as it was right after the
//! change, less the parts no event shows (its arguments, tags, unknown
//! fields and, but for a trace id, its `meta`); the HTTP front end renders
//! it as for the local engine. A row may hold a run of a batch's
//! `job.enqueued` events, read back one by one ([`EventRows::of`]).

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
/// Events one listing request reads at most, whatever its filter keeps.
pub(super) const SCAN_MAX: i64 = 10_000;
/// Rows read at a time while filtering (a run's row holds up to
/// [`RUN_MEMBERS_MAX`] events and about [`RUN_BYTES_MAX`] bytes).
pub(super) const SCAN_CHUNK: i64 = 200;

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
    /// event's time is the claim's). Added after the kinds above, so that
    /// they keep their stored tags, as each kind added later must be.
    Claimed {
        worker_id: Option<String>,
        visibility_ms: Option<u64>,
    },
    /// A run of `members` `job.enqueued` events in one row (see
    /// [`EventRows::of`]): each event's job follows in turn; the first
    /// event's id is the row's, each next one's the id after it
    /// ([`JobId::next_in_millisecond`]).
    EnqueuedRun {
        members: u32,
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
            StoredKind::Enqueued | StoredKind::EnqueuedRun { .. } => EventKind::Enqueued,
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

/// The `INSERT` of events from the seven arrays of [`EventRows`], given
/// the placeholders they are bound to (so that a statement of several parts
/// can number them).
macro_rules! insert_events {
    ($ids:literal, $times:literal, $types:literal, $queues:literal, $job_types:literal, $bodies:literal,
     $members:literal) => {
        concat!(
            "INSERT INTO svc_events (id, at, type, queue, job_type, body, members) \
             SELECT t.id::uuid, to_timestamp(t.at::float8 / 1000), t.type, t.queue, t.job_type, t.body, t.members \
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
            "::bytea[], ",
            $members,
            "::int4[]) AS t(id, at, type, queue, job_type, body, members)"
        )
    };
}
pub(super) use insert_events;

/// `job.enqueued` events one row holds at most.
const RUN_MEMBERS_MAX: u32 = 256;
/// Bytes of jobs from which a row takes no further event of a run (the
/// last one taken may pass it by one job).
const RUN_BYTES_MAX: usize = 32 * 1024;

/// Events to write, as the columns of [`insert_events`]: each with its
/// id, time and the job as it is after the change (none for an event about
/// a cron entry only). `body` is the stored kind, followed by the job when
/// there is one; `members` counts the events the row holds.
#[derive(Default)]
pub(super) struct EventRows<'a> {
    ids: Vec<String>,
    times: Vec<Millis>,
    types: Vec<&'static str>,
    queues: Vec<Option<&'a str>>,
    job_types: Vec<Option<&'a str>>,
    bodies: Vec<Vec<u8>>,
    members: Vec<i32>,
}

/// `job.enqueued` events being gathered into one row: jobs of one queue and
/// type at one time, each event's id the one after the last's.
struct Run<'a> {
    first: JobId,
    last: JobId,
    at: Millis,
    job: &'a Job,
    members: u32,
    jobs: Vec<u8>,
}

impl<'a> Run<'a> {
    fn takes(&self, id: JobId, at: Millis, job: &Job) -> bool {
        self.members < RUN_MEMBERS_MAX
            && self.jobs.len() < RUN_BYTES_MAX
            && self.last.next_in_millisecond() == Some(id)
            && self.at == at
            && self.job.queue == job.queue
            && self.job.payload.job_type() == job.payload.job_type()
    }
}

impl<'a> EventRows<'a> {
    /// The rows of `events`. A batch's `job.enqueued` events are written as
    /// runs, a row each (schema version 17): of an event a run is almost
    /// all the index entries and most of the row's bytes, and a batch
    /// enqueue writes one such event a job (docs/postgres.md, "Events").
    pub(super) fn of(events: &[(JobId, Millis, EventKind, Option<&'a Job>)]) -> EventRows<'a> {
        let mut rows = EventRows::default();
        let mut run: Option<Run<'a>> = None;
        for &(id, at, ref kind, job) in events {
            let Some(stored) = StoredKind::of(kind) else { continue };
            if let (EventKind::Enqueued, Some(job)) = (kind, job) {
                let encoded = held_bytes(job);
                match &mut run {
                    Some(run) if run.takes(id, at, job) => {
                        run.last = id;
                        run.members += 1;
                        run.jobs.extend(encoded);
                    }
                    _ => {
                        if let Some(ended) = run.take() {
                            rows.push_run(ended);
                        }
                        run = Some(Run { first: id, last: id, at, job, members: 1, jobs: encoded });
                    }
                }
                continue;
            }
            if let Some(ended) = run.take() {
                rows.push_run(ended);
            }
            let mut body = postcard::to_allocvec(&stored).expect("an event always encodes");
            if let Some(job) = job {
                body.extend(held_bytes(job));
            }
            rows.push(id, at, kind.type_name(), job, body, 1);
        }
        if let Some(ended) = run {
            rows.push_run(ended);
        }
        rows
    }

    /// A run of one is written as any event is, `StoredKind::Enqueued`.
    fn push_run(&mut self, run: Run<'a>) {
        let stored = match run.members {
            1 => StoredKind::Enqueued,
            members => StoredKind::EnqueuedRun { members },
        };
        let mut body = postcard::to_allocvec(&stored).expect("an event always encodes");
        body.extend(run.jobs);
        self.push(run.first, run.at, EventKind::Enqueued.type_name(), Some(run.job), body, run.members as i32);
    }

    fn push(
        &mut self,
        id: JobId,
        at: Millis,
        type_name: &'static str,
        job: Option<&'a Job>,
        body: Vec<u8>,
        members: i32,
    ) {
        self.ids.push(id.to_string());
        self.times.push(at);
        self.types.push(type_name);
        self.queues.push(job.map(|job| job.queue.as_str()));
        self.job_types.push(job.map(|job| job.payload.job_type()));
        self.bodies.push(body);
        self.members.push(members);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The parameters, in the order [`insert_events`] names them.
    pub(super) fn params(&self) -> [&(dyn ToSql + Sync); 7] {
        [&self.ids, &self.times, &self.types, &self.queues, &self.job_types, &self.bodies, &self.members]
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

/// The job as an event row holds it ([`as_an_event_holds`]), encoded.
fn held_bytes(job: &Job) -> Vec<u8> {
    postcard::to_allocvec(&*as_an_event_holds(job)).expect("a job always encodes")
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
    client.run(insert_events!("$1", "$2", "$3", "$4", "$5", "$6", "$7"), &rows.params()).await?;
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
    let after = match after {
        Some(text) => Some(EventId::parse(text).map(|id| id.0).ok_or_else(|| {
            let error = crate::job::ValidationError::request(Some("after".to_string()), "after is not an event id");
            EngineError::Invalid { error, index: None }
        })?),
        None => None,
    };
    let after_text = after.map(|id| id.to_string());
    let gap = match &after_text {
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
    let mut scanned_to = None;
    // Reading starts at the run that holds `after` where events of it come
    // after `after`, else just past `after`; each next chunk just past the
    // last row read.
    let mut from = match after {
        Some(after) => Some(match run_past(client, after).await.map_err(failed)? {
            Some(first) => (first, true),
            None => (after.to_string(), false),
        }),
        None => None,
    };
    while scanned < SCAN_MAX {
        let sql = match &from {
            None => {
                "SELECT id::text AS id_text, (extract(epoch FROM at) * 1000)::int8, body FROM svc_events \
                 WHERE $1::text IS NULL ORDER BY id LIMIT $2"
            }
            Some((_, true)) => {
                "SELECT id::text AS id_text, (extract(epoch FROM at) * 1000)::int8, body FROM svc_events \
                 WHERE id >= $1::text::uuid ORDER BY id LIMIT $2"
            }
            Some((_, false)) => {
                "SELECT id::text AS id_text, (extract(epoch FROM at) * 1000)::int8, body FROM svc_events \
                 WHERE id > $1::text::uuid ORDER BY id LIMIT $2"
            }
        };
        let start = from.as_ref().map(|(id, _)| id);
        let rows = client.rows(sql, &[&start, &SCAN_CHUNK]).await.map_err(failed)?;
        let last_chunk = (rows.len() as i64) < SCAN_CHUNK;
        'rows: for row in rows {
            let id: String = row.get(0);
            for event in decode(&id, row.get(1), row.get(2)) {
                if after.is_some_and(|after| event.id.0 <= after) {
                    continue;
                }
                if events.len() == limit || scanned == SCAN_MAX {
                    has_more = true;
                    break 'rows;
                }
                scanned += 1;
                scanned_to = Some(event.id);
                if filter.keeps(&event) {
                    events.push(event);
                }
            }
            from = Some((id, false));
        }
        if has_more || last_chunk {
            break;
        }
    }
    if scanned >= SCAN_MAX && !has_more {
        has_more = true;
    }
    // The next page starts past every event looked at, matching or not: a
    // stream whose filter matches little reads each event once.
    Ok(EventPage { events, has_more, gap, scanned_to })
}

/// The first id of the run that holds `after` and events after it, if
/// `after` falls in such a run: the row at or before `after` is one, and
/// its last member's id is later.
async fn run_past(client: &impl GenericClient, after: JobId) -> Result<Option<String>, tokio_postgres::Error> {
    let row = client
        .rows(
            "SELECT id::text AS id_text, members FROM svc_events WHERE id <= $1::text::uuid ORDER BY id DESC LIMIT 1",
            &[&after.to_string()],
        )
        .await?;
    let Some(row) = row.first() else { return Ok(None) };
    let (first, members): (String, i32) = (row.get(0), row.get(1));
    let last = JobId::parse(&first).and_then(|first| last_of_run(first, members));
    Ok(last.is_some_and(|last| last > after).then_some(first))
}

/// The id of the last event of a row whose first is `first`.
pub(super) fn last_of_run(first: JobId, members: i32) -> Option<JobId> {
    (1..members).try_fold(first, |id, _| id.next_in_millisecond())
}

/// The events of a row (a run of `job.enqueued` events holds several).
pub(super) fn decode(id: &str, at: i64, body: &[u8]) -> Vec<Event> {
    decode_if(id, at, body, |_| true)
}

/// The events of a row read back, their jobs decoded only where `wants_job`
/// says so for their kind (decoding the job is most of the cost of reading
/// an event).
pub(super) fn decode_if(id: &str, at: i64, body: &[u8], wants_job: impl Fn(&EventKind) -> bool) -> Vec<Event> {
    let Some(first) = JobId::parse(id) else { return Vec::new() };
    let event = |id: JobId, kind: EventKind, job: Option<Job>| Event {
        seq: 0,
        id: EventId(id),
        time: at,
        kind,
        job: job.map(Arc::new),
    };
    let decoded = postcard::take_from_bytes::<StoredKind>(body).and_then(|(stored, mut rest)| {
        let claim = match &stored {
            StoredKind::Claimed { worker_id, visibility_ms } => Some((worker_id.clone(), *visibility_ms)),
            _ => None,
        };
        if let StoredKind::EnqueuedRun { members } = stored {
            let wants = wants_job(&EventKind::Enqueued);
            let mut events = Vec::with_capacity(members as usize);
            let mut id = Some(first);
            for _ in 0..members {
                let Some(this) = id else { return Err(postcard::Error::DeserializeUnexpectedEnd) };
                let job = if wants {
                    let (job, after) = postcard::take_from_bytes::<Job>(rest)?;
                    rest = after;
                    Some(job)
                } else {
                    None
                };
                events.push(event(this, EventKind::Enqueued, job));
                id = this.next_in_millisecond();
            }
            return Ok(events);
        }
        let kind = stored.kind();
        let job = if rest.is_empty() || !wants_job(&kind) {
            None
        } else {
            let mut job = postcard::from_bytes::<Job>(rest)?;
            if let Some((worker_id, visibility_ms)) = claim {
                super::claims::apply_claim(&mut job, at, worker_id, visibility_ms);
            }
            Some(job)
        };
        Ok(vec![event(first, kind, job)])
    });
    decoded.unwrap_or_else(|error| {
        tracing::error!(%id, %error, "a stored event does not decode");
        Vec::new()
    })
}

/// Deletes all but the newest [`EVENTS_KEPT`] events (the row that
/// reaches that count kept whole), never one webhook subscriptions have
/// not been matched against yet; answers how many rows went.
pub async fn prune(client: &impl GenericClient) -> Result<u64, tokio_postgres::Error> {
    client
        .run(
            "DELETE FROM svc_events WHERE id < (SELECT id FROM (SELECT id, sum(members) OVER (ORDER BY id DESC) AS kept \
               FROM svc_events) newest WHERE kept >= $1 ORDER BY id DESC LIMIT 1) \
             AND xid < (SELECT xid FROM svc_webhook_cursor)",
            &[&EVENTS_KEPT],
        )
        .await
}
