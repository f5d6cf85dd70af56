//! Events emitted by committed transitions, kept in a bounded in-memory buffer
//! for `GET /events`. A job event's payload is rendered lazily from the job
//! as it was right after the transition; cron and worker events carry their data.

mod render;

#[cfg(feature = "postgres")]
pub(crate) use render::meta_may_hold_trace_id;
pub use render::render_event;

use std::collections::VecDeque;
use std::sync::Arc;

use crate::clock::Millis;
use crate::job::{FailureReport, Job, JobId, JobState};
use crate::limits::{EVENT_BUFFER_BYTES_MAX, EVENT_BUFFER_MAX};

/// The details an event carries beyond its job.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum EventKind {
    Enqueued,
    Scheduled,
    Started,
    Completed,
    Failed {
        report: Box<FailureReport>,
        attempt: u32,
    },
    Retrying {
        report: Box<FailureReport>,
    },
    Requeued {
        reason: &'static str,
    },
    Discarded {
        reason: &'static str,
    },
    Cancelled {
        previous_state: JobState,
        reason: &'static str,
    },
    Expired,
    /// Progress reported on an active job.
    Progress,
    /// Back from the dead letter listing.
    Revived,
    /// Removed from the dead letter listing.
    Deleted,
    /// A cron entry fired; the event's job is the one it created.
    CronTriggered {
        cron: Box<CronInfo>,
        run_count: u64,
    },
    /// A cron evaluation that created nothing, or a misfire or gap report.
    CronSkipped(Box<CronSkip>),
    /// Terminal jobs pruned in one sweep to hold the retention caps.
    Pruned {
        count: u64,
    },
    /// A queue was paused.
    QueuePaused(String),
    /// A queue was resumed.
    QueueResumed(String),
    /// A worker seen for the first time.
    WorkerStarted {
        worker_id: String,
    },
    /// A worker told to go quiet or to terminate.
    WorkerSignalled(Box<SignalledWorker>),
    /// Something happened to a workflow.
    Workflow {
        id: crate::job::WorkflowId,
        event: Box<WorkflowEvent>,
    },
}

// Every job transition makes an event, which is moved several times before
// it rests in the buffer. The rare kinds with many fields are boxed, so that
// the common ones are not moved at their size: an event takes 72 bytes
// instead of 232, whose copies were a twentieth of the engine thread's
// time in a batch fill.
const _: () = assert!(std::mem::size_of::<EventKind>() <= 32);

/// A cron evaluation that created nothing: why, and what was there instead.
#[derive(Debug, Clone)]
pub struct CronSkip {
    pub cron: CronInfo,
    pub reason: &'static str,
    pub existing_job_id: Option<JobId>,
    pub missed_count: Option<u32>,
}

/// A worker told to go quiet or to terminate, and what it held then.
#[derive(Debug, Clone)]
pub struct SignalledWorker {
    pub worker_id: String,
    pub terminate: bool,
    pub active_job_ids: Vec<JobId>,
    pub by: &'static str,
}

/// What happened to a workflow, with the details its event carries.
#[derive(Debug, Clone)]
pub enum WorkflowEvent {
    Started {
        name: Option<String>,
        workflow_type: &'static str,
        jobs_total: usize,
    },
    StepCompleted {
        index: usize,
        job_id: JobId,
        job_type: String,
        steps_remaining: usize,
    },
    CallbackFired {
        callback: &'static str,
        job_id: JobId,
    },
    Completed {
        workflow_type: &'static str,
        duration_ms: Millis,
    },
    Failed {
        workflow_type: &'static str,
        /// The failed member's index; `None` for a callback.
        failed_index: Option<u32>,
        failed_job_id: JobId,
        error: Option<FailureReport>,
    },
    Cancelled {
        jobs_cancelled: usize,
    },
}

/// The cron entry an event is about.
#[derive(Debug, Clone)]
pub struct CronInfo {
    pub name: String,
    pub schedule: String,
    pub timezone: String,
    pub scheduled_time: Millis,
}

impl EventKind {
    /// The event of what a failed attempt led to (a backend's own
    /// `job.failed` comes before it, but for a requeue).
    pub fn after_failure(
        report: &FailureReport,
        outcome: crate::job::transition::FailOutcome,
        requeue_reason: &'static str,
    ) -> EventKind {
        use crate::job::transition::FailOutcome;
        match outcome {
            FailOutcome::Retry { .. } => EventKind::Retrying { report: Box::new(report.clone()) },
            FailOutcome::Discard => {
                let reason = if report.retryable == Some(false) { "non_retryable" } else { "exhausted" };
                EventKind::Discarded { reason }
            }
            FailOutcome::Requeue | FailOutcome::Release => EventKind::Requeued { reason: requeue_reason },
        }
    }

    pub fn type_name(&self) -> &'static str {
        match self {
            EventKind::Enqueued => "job.enqueued",
            EventKind::Scheduled => "job.scheduled",
            EventKind::Started => "job.started",
            EventKind::Completed => "job.completed",
            EventKind::Failed { .. } => "job.failed",
            EventKind::Retrying { .. } => "job.retrying",
            EventKind::Requeued { .. } => "job.requeued",
            EventKind::Discarded { .. } => "job.discarded",
            EventKind::Cancelled { .. } => "job.cancelled",
            EventKind::Expired => "job.expired",
            EventKind::Progress => "job.progress",
            EventKind::Revived => "job.enqueued",
            EventKind::Deleted => "job.deleted",
            EventKind::CronTriggered { .. } => "cron.triggered",
            EventKind::CronSkipped(_) => "cron.skipped",
            EventKind::Pruned { .. } => "jobs.pruned",
            EventKind::QueuePaused(_) => "queue.paused",
            EventKind::QueueResumed(_) => "queue.resumed",
            EventKind::WorkerStarted { .. } => "worker.started",
            EventKind::WorkerSignalled(signalled) if signalled.terminate => "worker.terminate",
            EventKind::WorkerSignalled(_) => "worker.quiet",
            EventKind::Workflow { event, .. } => match event.as_ref() {
                WorkflowEvent::Started { .. } => "workflow.started",
                WorkflowEvent::StepCompleted { .. } => "workflow.step_completed",
                WorkflowEvent::CallbackFired { .. } => "workflow.callback_fired",
                WorkflowEvent::Completed { .. } => "workflow.completed",
                WorkflowEvent::Failed { .. } => "workflow.failed",
                WorkflowEvent::Cancelled { .. } => "workflow.cancelled",
            },
        }
    }
}

/// An event's id: a UUIDv7, `evt_<uuidv7>` on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventId(pub crate::job::JobId);

impl EventId {
    pub fn parse(text: &str) -> Option<EventId> {
        text.strip_prefix("evt_").and_then(crate::job::JobId::parse).map(EventId)
    }
}

impl std::fmt::Display for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "evt_{}", self.0)
    }
}

/// One event: `seq` orders the buffer.
#[derive(Debug, Clone)]
pub struct Event {
    pub seq: u64,
    pub id: EventId,
    pub time: Millis,
    pub kind: EventKind,
    /// The job as it was right after the transition (job events and `cron.triggered`).
    pub job: Option<Arc<Job>>,
}

impl Event {
    /// The queue and job type a webhook subscription's filter looks at: a
    /// queue event's queue, or the job's queue and type (none for events
    /// about neither).
    pub fn webhook_scope(&self) -> (Option<&str>, Option<&str>) {
        match (&self.kind, self.job.as_deref()) {
            (EventKind::QueuePaused(queue) | EventKind::QueueResumed(queue), _) => (Some(queue.as_str()), None),
            (_, Some(job)) => (Some(job.queue.as_str()), Some(job.payload.job_type())),
            _ => (None, None),
        }
    }

    /// The envelope's `subject`: job id, cron name or worker id; none for
    /// an event about many jobs (`jobs.pruned`).
    pub fn subject(&self) -> Option<String> {
        match &self.kind {
            EventKind::CronTriggered { cron, .. } => Some(cron.name.clone()),
            EventKind::CronSkipped(skip) => Some(skip.cron.name.clone()),
            EventKind::WorkerStarted { worker_id } => Some(worker_id.clone()),
            EventKind::WorkerSignalled(signalled) => Some(signalled.worker_id.clone()),
            EventKind::Pruned { .. } => None,
            EventKind::QueuePaused(queue) | EventKind::QueueResumed(queue) => Some(queue.clone()),
            EventKind::Workflow { id, .. } => Some(id.to_string()),
            _ => self.job.as_ref().map(|job| job.id.to_string()),
        }
    }
}

/// Events waiting to be published, produced while a batch is applied.
#[derive(Debug, Default)]
pub struct EventSink {
    enabled: bool,
    pending: Vec<(Millis, EventKind, JobRef)>,
}

/// The job an event is about: looked up at publication, or (for a job that
/// no longer exists) as it was; `None` for events about no job.
#[derive(Debug, Clone)]
pub enum JobRef {
    Id(crate::job::JobId),
    Gone(Arc<Job>),
    None,
}

impl EventSink {
    pub fn enabled() -> Self {
        Self::reusing(Vec::new())
    }

    /// An enabled sink that fills `buffer` (emptied first), so a turn reuses
    /// the room an earlier turn's events grew.
    pub fn reusing(mut buffer: Vec<(Millis, EventKind, JobRef)>) -> Self {
        buffer.clear();
        Self { enabled: true, pending: buffer }
    }

    /// A sink that drops everything (replay emits no events).
    pub fn disabled() -> Self {
        Self::default()
    }

    pub fn push(&mut self, time: Millis, kind: EventKind, job: crate::job::JobId) {
        if self.enabled {
            self.pending.push((time, kind, JobRef::Id(job)));
        }
    }

    /// An event about a job that is being removed.
    pub fn push_gone(&mut self, time: Millis, kind: EventKind, job: Arc<Job>) {
        if self.enabled {
            self.pending.push((time, kind, JobRef::Gone(job)));
        }
    }

    /// An event about no job (cron and worker events).
    pub fn push_other(&mut self, time: Millis, kind: EventKind) {
        if self.enabled {
            self.pending.push((time, kind, JobRef::None));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    pub fn take(&mut self) -> Vec<(Millis, EventKind, JobRef)> {
        std::mem::take(&mut self.pending)
    }
}

/// The newest events, oldest first, at most [`EVENT_BUFFER_MAX`] of them
/// keeping at most [`EVENT_BUFFER_BYTES_MAX`] of jobs alive. Their ids come
/// from one generator and rise in that order, so a cursor is found by binary
/// search.
#[derive(Debug, Default)]
pub struct EventBuffer {
    events: VecDeque<HeldEvent>,
    /// The sum of [`HeldEvent::bytes`] over `events`.
    held_bytes: u64,
}

/// An event with the bytes it was counted at when it came in, so that
/// dropping it does not read its long-cold job again. Held inline, not
/// behind an `Arc`: readers of a page get clones (a job pointer and the
/// kind), and the engine, which pushes and drops every event, saves an
/// allocation and a cold read each.
#[derive(Debug)]
struct HeldEvent {
    event: Event,
    /// [`Event::held_bytes`] when it was pushed (an event's job never changes).
    bytes: u64,
}

impl Event {
    /// The bytes this event keeps alive: itself and the job it holds (counted
    /// whole, even where the job store still shares it).
    fn held_bytes(&self) -> u64 {
        std::mem::size_of::<Event>() as u64 + self.job.as_ref().map_or(0, |job| job.held_bytes())
    }
}

impl EventBuffer {
    pub fn push(&mut self, event: Event) {
        debug_assert!(self.events.back().is_none_or(|last| last.event.id.0 < event.id.0), "event ids rise");
        let bytes = event.held_bytes();
        self.held_bytes += bytes;
        self.events.push_back(HeldEvent { event, bytes });
        while self.events.len() > EVENT_BUFFER_MAX
            || (self.held_bytes > EVENT_BUFFER_BYTES_MAX && self.events.len() > 1)
        {
            let dropped = self.events.pop_front().expect("more than one event held");
            self.held_bytes -= dropped.bytes;
        }
    }

    /// Events after the one with id `after` (all when `None` or no longer held),
    /// that pass `keep`, at most `limit`. Also says whether more match and
    /// whether `after` had dropped out of the buffer. Ids order events, so
    /// an id newer than the buffer's events (one made from a time) starts
    /// after every event before it.
    pub fn page(&self, after: Option<&str>, limit: usize, keep: impl Fn(&Event) -> bool) -> EventPage {
        let (start, gap) = match after {
            None => (0, false),
            Some(id) => match EventId::parse(id) {
                Some(id)
                    if self.position(id).is_some()
                        || self.events.front().is_some_and(|held| held.event.id.0 < id.0) =>
                {
                    (self.events.partition_point(|held| held.event.id.0 <= id.0), false)
                }
                _ => (0, true),
            },
        };
        let mut matching = self.events.range(start..).map(|held| &held.event).filter(|event| keep(event));
        let events: Vec<Event> = matching.by_ref().take(limit).cloned().collect();
        let has_more = matching.next().is_some();
        let scanned_to = if has_more { events.last().map(|event| event.id) } else { None };
        EventPage { events, has_more, gap, scanned_to }
    }

    /// Where the event with `id` is held, if it still is.
    fn position(&self, id: EventId) -> Option<usize> {
        self.events.binary_search_by_key(&id.0, |held| held.event.id.0).ok()
    }
}

/// A page of the event listing.
#[derive(Debug, Clone)]
pub struct EventPage {
    /// The events, oldest first.
    pub events: Vec<Event>,
    /// Whether events after this page may match.
    pub has_more: bool,
    /// Whether `after` was older than every event held: the page starts
    /// at the oldest.
    pub gap: bool,
    /// The last event the listing looked at, matching or not: where the
    /// next page starts (`after`). PostgreSQL sets it on every page that
    /// looked at an event (a filtered page there looks at a bounded number
    /// of events, so it can hold fewer than asked, even none, and still go
    /// on from here); the local engine, which looks at every event it
    /// holds, only when `has_more`.
    pub scanned_to: Option<EventId>,
}

impl EventPage {
    /// Where the next page starts (its `after`): [`scanned_to`](Self::scanned_to)
    /// when set, else the last event listed; `None` when neither (the next
    /// page starts where this one did).
    pub fn next_after(&self) -> Option<EventId> {
        self.scanned_to.or_else(|| self.events.last().map(|event| event.id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{IdGenerator, JobId};

    fn buffer_of(count: usize) -> (EventBuffer, Vec<EventId>) {
        let mut ids = IdGenerator::default();
        let mut buffer = EventBuffer::default();
        let mut made = Vec::new();
        for seq in 0..count as u64 {
            // Several events share a millisecond, as in one engine turn.
            let id = EventId(ids.next(1_800_000_000_000 + (seq / 3) as i64, u128::from(seq) * 7919));
            buffer.push(Event { seq, id, time: 0, kind: EventKind::Enqueued, job: None });
            made.push(id);
        }
        (buffer, made)
    }

    fn seqs(page: &EventPage) -> Vec<u64> {
        page.events.iter().map(|event| event.seq).collect()
    }

    #[test]
    fn a_page_starts_right_after_its_cursor() {
        let (buffer, ids) = buffer_of(100);
        for (position, id) in ids.iter().enumerate() {
            let page = buffer.page(Some(&id.to_string()), 3, |_| true);
            let expected: Vec<u64> = (position as u64 + 1..100).take(3).collect();
            assert_eq!((seqs(&page), page.gap), (expected, false), "after event {position}");
            assert_eq!(page.has_more, position + 4 < 100);
        }
        let first = buffer.page(None, 2, |_| true);
        assert_eq!((seqs(&first), first.has_more, first.gap), (vec![0, 1], true, false));
    }

    #[test]
    fn events_of_large_jobs_are_dropped_oldest_first_past_the_byte_budget() {
        let args = format!("[\"{}\"]", "x".repeat(1024 * 1024));
        let payload = crate::job::JobPayload::new("t", &args, "{}", Vec::new(), Vec::new());
        let new_job = crate::job::NewJob {
            id: None,
            payload,
            queue: "default".into(),
            priority: 0,
            timeout_ms: 1,
            visibility_timeout_ms: 1,
            scheduled_at: None,
            expires_at: None,
            retry: Arc::new(crate::job::RetryPolicy::default()),
            unique: None,
            rate_limit: None,
            pending: false,
            schema: None,
        };
        let mut ids = IdGenerator::default();
        let mut buffer = EventBuffer::default();
        let events = 200u64;
        for seq in 0..events {
            let id = ids.next(1_800_000_000_000, u128::from(seq));
            // Distinct jobs, as after a transition each event's job is its own copy.
            let job = Job::accept(new_job.clone(), id, JobState::Available, 0, None, None);
            buffer.push(Event { seq, id: EventId(id), time: 0, kind: EventKind::Enqueued, job: Some(Arc::new(job)) });
        }
        assert!(buffer.held_bytes <= EVENT_BUFFER_BYTES_MAX, "{} bytes held", buffer.held_bytes);
        let held = buffer.page(None, EVENT_BUFFER_MAX, |_| true);
        assert!(held.events.len() >= 60 && held.events.len() < 64, "{} events held", held.events.len());
        assert_eq!(held.events.last().map(|event| event.seq), Some(events - 1), "the newest are kept");
    }

    #[test]
    fn a_cursor_older_than_the_buffer_starts_over_with_a_gap() {
        let (mut buffer, ids) = buffer_of(EVENT_BUFFER_MAX);
        let mut generator = IdGenerator::default();
        generator.observe(ids[ids.len() - 1].0);
        buffer.push(Event {
            seq: EVENT_BUFFER_MAX as u64,
            id: EventId(generator.next(1_900_000_000_000, 1)),
            time: 0,
            kind: EventKind::Enqueued,
            job: None,
        });
        // The oldest event was dropped to make room.
        let page = buffer.page(Some(&ids[0].to_string()), 1, |_| true);
        assert_eq!((seqs(&page), page.gap), (vec![1], true));
        // An id between two held ones (never issued, or made from a time)
        // starts after the events before it, with nothing lost.
        let between = EventId(JobId(ids[5].0.0 + 1)).to_string();
        let page = buffer.page(Some(&between), 1, |_| true);
        assert_eq!((seqs(&page), page.gap), (vec![6], false));
        let page = buffer.page(Some(&ids[1].to_string()), 1, |_| true);
        assert_eq!((seqs(&page), page.gap), (vec![2], false));
    }
}
