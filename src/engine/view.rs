//! What readers see: a copy of the committed state that only the writer
//! changes, after each durable commit. Readers take a shard's read lock for
//! one lookup, so reads never wait behind a commit's I/O.

use parking_lot::{Mutex, RwLock};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use super::cron::table::CronEntry;
use super::events::{Event, EventBuffer, EventKind, EventPage};
use super::job_table::{DeadLetterKey, SHARDS, SharedJobs};
use super::jobs::listing::{JobCursor, JobFilter, JobsPage, LOOKUP_BUDGET, SCAN_BUDGET};
use super::table::{Published, take_page};
use super::throughput::{MinuteCount, Throughput};
use super::workers::entry::{WorkerEntry, WorkerState};
use super::workflows::table::Workflow;
use crate::clock::Millis;
use crate::job::{Job, JobId, JobState, SubscriptionId, WorkflowId};
use crate::schema::SchemaEntry;

/// One queue's figures as of the last commit.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSummary {
    pub name: String,
    pub paused: bool,
    pub counts: [u64; 8],
    /// The bound on its waiting jobs, if one is set.
    pub backpressure: Option<super::queues::record::Backpressure>,
    /// When the available job that has waited longest became available.
    pub oldest_available_at: Option<Millis>,
}

impl QueueSummary {
    pub fn count(&self, state: JobState) -> u64 {
        self.counts[state.index()]
    }

    /// Jobs waiting to be claimed: what backpressure bounds.
    pub fn depth(&self) -> u64 {
        [JobState::Available, JobState::Scheduled, JobState::Retryable, JobState::Pending]
            .iter()
            .map(|state| self.count(*state))
            .sum()
    }

    /// Jobs not yet finished.
    pub fn size(&self) -> u64 {
        JobState::ALL.iter().filter(|state| !state.is_terminal()).map(|state| self.count(*state)).sum()
    }
}

/// Where a page of the dead letter listing ended: an opaque position that
/// reads and prints as text, to hand to a client and back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadLetterCursor(DeadLetterKey);

impl DeadLetterCursor {
    /// The position after the discarded job `id`, discarded at `discarded_at`.
    pub fn new(discarded_at: Millis, id: JobId) -> DeadLetterCursor {
        DeadLetterCursor(DeadLetterKey::new(discarded_at, id))
    }

    /// When the job the cursor names was discarded, and its id.
    pub fn position(&self) -> (Millis, JobId) {
        (self.0.discarded_at(), self.0.id())
    }

    /// Reads a cursor printed by [`DeadLetterCursor`]'s `Display`.
    pub fn parse(text: &str) -> Option<DeadLetterCursor> {
        let (at, id) = text.split_once('/')?;
        let discarded_at = at.parse::<i64>().ok()?;
        let id = JobId::parse(id)?;
        Some(DeadLetterCursor(DeadLetterKey::new(discarded_at, id)))
    }
}

impl std::fmt::Display for DeadLetterCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.0.discarded_at(), self.0.id())
    }
}

/// Every queue's figures by name, as readers get them.
pub(crate) type QueueTable = std::collections::BTreeMap<String, QueueSummary>;

pub struct ReadView {
    /// Every job and the dead letter listing, shared with the engine's state.
    jobs: Arc<SharedJobs>,
    /// The worker registry by worker id.
    workers: RwLock<std::collections::BTreeMap<String, WorkerEntry>>,
    /// Readers take the table by pointer; the writer changes it in place
    /// unless a reader still holds it (copy on write).
    queues: RwLock<Arc<QueueTable>>,
    events: Mutex<EventBuffer>,
    /// Per queue, what completed and failed lately (for queue stats).
    throughput: Mutex<std::collections::HashMap<String, Throughput>>,
    /// Cron entries by name.
    pub(super) crons: Published<String, CronEntry>,
    /// Workflows by id.
    pub(super) workflows: Published<WorkflowId, Workflow>,
    /// Registered schemas by URI.
    pub(super) schemas: Published<String, SchemaEntry>,
    /// Webhook subscriptions by id (creation order).
    pub(super) webhooks: Published<SubscriptionId, crate::webhook::Subscription>,
    /// Why the engine accepts no more writes: 0 while it does, else an
    /// [`EngineFailure`] as `1 + its index`.
    failure: AtomicU8,
    /// Wakes those waiting for a failure ([`ReadView::failed`]).
    failure_notify: tokio::sync::Notify,
    /// The disk is full: new work is refused until space is freed.
    disk_full: AtomicBool,
    /// What made the engine fail, in words, for the log line of the stop.
    failure_cause: Mutex<Option<String>>,
}

/// Why the engine has stopped accepting writes; the process should restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineFailure {
    /// A log write or sync failed.
    SyncFailed,
    /// The engine thread itself stopped (a bug: it panicked).
    EngineStopped,
}

impl EngineFailure {
    /// The short code health reports.
    pub fn code(self) -> &'static str {
        match self {
            EngineFailure::SyncFailed => "sync_failed",
            EngineFailure::EngineStopped => "engine_stopped",
        }
    }
}

impl ReadView {
    /// A view of `jobs` (the state's job table's shared side).
    pub(crate) fn new(jobs: Arc<SharedJobs>) -> Self {
        Self {
            jobs,
            workers: RwLock::new(std::collections::BTreeMap::new()),
            queues: RwLock::new(Arc::new(QueueTable::new())),
            events: Mutex::new(EventBuffer::default()),
            throughput: Mutex::new(std::collections::HashMap::new()),
            crons: Published::default(),
            workflows: Published::default(),
            schemas: Published::default(),
            webhooks: Published::default(),
            failure: AtomicU8::new(0),
            failure_notify: tokio::sync::Notify::new(),
            disk_full: AtomicBool::new(false),
            failure_cause: Mutex::new(None),
        }
    }

    pub fn job(&self, id: JobId) -> Option<Arc<Job>> {
        self.jobs.job(id)
    }

    /// Up to `limit` discarded jobs after `after`, optionally of one queue,
    /// and whether more follow.
    pub fn dead_letter_page(
        &self,
        after: Option<DeadLetterCursor>,
        limit: usize,
        queue: Option<&str>,
    ) -> (Vec<Arc<Job>>, Option<DeadLetterCursor>) {
        use std::ops::Bound;
        let listing = self.jobs.dead_letter.read();
        let start = after.map_or(Bound::Unbounded, |cursor| Bound::Excluded(cursor.0));
        let matching = listing
            .range((start, Bound::Unbounded))
            .map(|(_, job)| job)
            .filter(|job| queue.is_none_or(|queue| job.queue == queue));
        let (jobs, has_more) = take_page(matching, limit);
        let next = jobs.last().and_then(|job| DeadLetterKey::of(job)).filter(|_| has_more).map(DeadLetterCursor);
        (jobs, next)
    }

    /// Up to `limit` jobs that `filter` keeps, from `from` on, in listing
    /// order (`jobs/listing.rs`), looking at no more jobs than the budget.
    pub fn jobs_page(&self, filter: &JobFilter, from: Option<JobCursor>, limit: usize) -> JobsPage {
        self.jobs_page_within(filter, from, limit, LOOKUP_BUDGET)
    }

    /// [`ReadView::jobs_page`], reading at most `lookups` jobs whole in a shard.
    fn jobs_page_within(&self, filter: &JobFilter, from: Option<JobCursor>, limit: usize, lookups: usize) -> JobsPage {
        let JobCursor { mut shard, mut after } = from.unwrap_or(JobCursor { shard: 0, after: None });
        let mut page = JobsPage { jobs: Vec::new(), next: None, scanned: 0 };
        while shard < SHARDS {
            let (candidates, held) = self.jobs.shard_ids(shard, after, |job| filter.keeps_by_fields(job));
            page.scanned += held;
            for (looked_up, id) in candidates.iter().copied().enumerate() {
                if looked_up == lookups {
                    // Enough read for one page: the next goes on after the last one read.
                    page.next = Some(JobCursor { shard, after: Some(candidates[looked_up - 1]) });
                    return page;
                }
                // Gone since its id was read: as if it had not been there.
                let Some(job) = self.jobs.job(id).filter(|job| filter.keeps(job)) else { continue };
                page.jobs.push(job);
                if page.jobs.len() == limit {
                    page.next = Some(JobCursor { shard, after: Some(id) });
                    return page;
                }
            }
            (shard, after) = (shard + 1, None);
            if page.scanned >= SCAN_BUDGET && shard < SHARDS {
                page.next = Some(JobCursor { shard, after: None });
                return page;
            }
        }
        page
    }

    /// How many jobs the dead letter listing holds.
    pub fn dead_letter_len(&self) -> usize {
        self.jobs.dead_letter.read().len()
    }

    /// How many jobs of `queue` the dead letter listing holds.
    pub fn dead_letter_count_of(&self, queue: &str) -> usize {
        self.jobs.dead_letter.read().values().filter(|job| *job.queue == *queue).count()
    }

    /// How many workers the registry holds, and how many of them in each state.
    pub fn worker_counts(&self) -> (usize, Vec<(WorkerState, usize)>) {
        let registry = self.workers.read();
        let mut by_state: Vec<(WorkerState, usize)> = Vec::new();
        for entry in registry.values() {
            match by_state.iter_mut().find(|(state, _)| *state == entry.state) {
                Some((_, count)) => *count += 1,
                None => by_state.push((entry.state, 1)),
            }
        }
        (registry.len(), by_state)
    }

    /// Up to `limit` queues after the one named `after`, by name, and whether more follow.
    pub fn queues_page(&self, after: Option<&str>, limit: usize) -> (Vec<QueueSummary>, bool) {
        use std::ops::Bound;
        let table = self.queues();
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut remaining = table.range::<str, _>((start, Bound::Unbounded)).map(|(_, queue)| queue.clone());
        let page: Vec<QueueSummary> = remaining.by_ref().take(limit).collect();
        let has_more = remaining.next().is_some();
        (page, has_more)
    }

    /// Up to `limit` workers after `after` (by id) that pass `keep`, and whether more follow.
    pub fn workers_page(
        &self,
        after: Option<&str>,
        limit: usize,
        keep: impl Fn(&WorkerEntry) -> bool,
    ) -> (Vec<WorkerEntry>, bool) {
        use std::ops::Bound;
        let registry = self.workers.read();
        let start = after.map_or(Bound::Unbounded, |after| Bound::Excluded(after.to_string()));
        take_page(registry.range((start, Bound::Unbounded)).map(|(_, entry)| entry).filter(|entry| keep(entry)), limit)
    }

    pub fn worker(&self, worker_id: &str) -> Option<WorkerEntry> {
        self.workers.read().get(worker_id).cloned()
    }

    /// Writer only: publishes changed registry entries (`None` removes).
    pub(crate) fn publish_workers(&self, changes: impl Iterator<Item = (String, Option<WorkerEntry>)>) {
        let mut registry = self.workers.write();
        for (worker, entry) in changes {
            match entry {
                Some(entry) => registry.insert(worker, entry),
                None => registry.remove(&worker),
            };
        }
    }

    /// Up to `limit` cron entries after `after` (by name) that pass `keep`, and whether more follow.
    pub fn crons_page(
        &self,
        after: Option<&str>,
        limit: usize,
        keep: impl Fn(&CronEntry) -> bool,
    ) -> (Vec<Arc<CronEntry>>, bool) {
        self.crons.page(after, limit, keep)
    }

    pub fn cron(&self, name: &str) -> Option<Arc<CronEntry>> {
        self.crons.get(name)
    }

    /// Up to `limit` schemas after `after` (by URI), and whether more follow.
    pub fn schemas_page(&self, after: Option<&str>, limit: usize) -> (Vec<Arc<SchemaEntry>>, bool) {
        self.schemas.page(after, limit, |_| true)
    }

    pub fn schema(&self, uri: &str) -> Option<Arc<SchemaEntry>> {
        self.schemas.get(uri)
    }

    /// Up to `limit` subscriptions after `after` (creation order), and whether more follow.
    pub fn webhooks_page(
        &self,
        after: Option<SubscriptionId>,
        limit: usize,
    ) -> (Vec<Arc<crate::webhook::Subscription>>, bool) {
        self.webhooks.page(after.as_ref(), limit, |_| true)
    }

    pub fn webhook(&self, id: SubscriptionId) -> Option<Arc<crate::webhook::Subscription>> {
        self.webhooks.get(&id)
    }

    pub fn workflow(&self, id: WorkflowId) -> Option<Arc<Workflow>> {
        self.workflows.get(&id)
    }

    /// Up to `limit` workflows after `after`, by id (oldest first), and whether more follow.
    pub fn workflows_page(&self, after: Option<WorkflowId>, limit: usize) -> (Vec<Arc<Workflow>>, bool) {
        self.workflows.page(after.as_ref(), limit, |_| true)
    }

    pub(crate) fn queues(&self) -> Arc<QueueTable> {
        self.queues.read().clone()
    }

    pub fn events_page(&self, after: Option<&str>, limit: usize, keep: impl Fn(&Event) -> bool) -> EventPage {
        self.events.lock().page(after, limit, keep)
    }

    pub fn failure(&self) -> Option<EngineFailure> {
        match self.failure.load(Ordering::SeqCst) {
            0 => None,
            1 => Some(EngineFailure::SyncFailed),
            _ => Some(EngineFailure::EngineStopped),
        }
    }

    pub fn disk_full(&self) -> bool {
        self.disk_full.load(Ordering::SeqCst)
    }

    pub(crate) fn set_disk_full(&self, full: bool) {
        self.disk_full.store(full, Ordering::SeqCst);
    }

    /// What made the engine fail, in words (the error of the failed step).
    pub fn failure_cause(&self) -> Option<String> {
        self.failure_cause.lock().clone()
    }

    /// Records what failed; the first cause given stays.
    pub(crate) fn set_failure_cause(&self, cause: String) {
        self.failure_cause.lock().get_or_insert(cause);
    }

    /// Records why the engine stopped; the first reason given stays.
    pub(crate) fn set_failure(&self, failure: EngineFailure) {
        let code = match failure {
            EngineFailure::SyncFailed => 1,
            EngineFailure::EngineStopped => 2,
        };
        let _ = self.failure.compare_exchange(0, code, Ordering::SeqCst, Ordering::SeqCst);
        self.failure_notify.notify_waiters();
    }

    /// Completes once the engine accepts no more writes.
    pub async fn failed(&self) {
        loop {
            let notified = self.failure_notify.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a failure set in between still wakes it.
            notified.as_mut().enable();
            if self.failure().is_some() {
                return;
            }
            notified.await;
        }
    }

    /// Writer only: publishes changed queues (`None` removes).
    pub(crate) fn publish_queues(&self, changes: impl Iterator<Item = (String, Option<QueueSummary>)>) {
        let mut queues = self.queues.write();
        let table = Arc::make_mut(&mut queues);
        for (name, summary) in changes {
            match summary {
                Some(summary) => table.insert(name, summary),
                None => {
                    self.throughput.lock().remove(&name);
                    table.remove(&name)
                }
            };
        }
    }

    pub(crate) fn publish_events(&self, events: impl Iterator<Item = Event>) {
        let mut buffer = self.events.lock();
        let mut throughput = self.throughput.lock();
        for event in events {
            let counts = match event.kind {
                EventKind::Completed => Some((1, 0)),
                EventKind::Failed { .. } => Some((0, 1)),
                _ => None,
            };
            if let (Some((completed, failed)), Some(job)) = (counts, &event.job) {
                throughput.entry(job.queue.to_string()).or_default().count(event.time, completed, failed);
            }
            buffer.push(event);
        }
    }

    /// A queue's jobs completed and attempts failed in the 60 s up to `now`.
    pub fn throughput(&self, queue: &str, now: Millis) -> (u64, u64) {
        self.throughput.lock().get(queue).map_or((0, 0), |throughput| throughput.last_minute(now))
    }

    /// The minutes of the 24 hours up to `now` with counts, oldest first:
    /// of one queue, or of all together.
    pub fn throughput_minutes(&self, queue: Option<&str>, now: Millis) -> Vec<MinuteCount> {
        let throughput = self.throughput.lock();
        match queue {
            Some(queue) => throughput.get(queue).map(|held| held.minutes(now).collect()).unwrap_or_default(),
            None => throughput.values().fold(Vec::new(), |all, held| super::throughput::merge(all, held.minutes(now))),
        }
    }

    /// Writes the minutes to the data dir (`throughput.rs`).
    pub(crate) fn save_throughput(&self, dir: &std::path::Path) -> std::io::Result<()> {
        let held = self.throughput.lock().clone();
        super::throughput::save(dir, &held)
    }

    /// Takes the minutes a previous run saved.
    pub(crate) fn load_throughput(&self, dir: &std::path::Path) {
        *self.throughput.lock() = super::throughput::load(dir);
    }
}

/// The first `limit` items of a listing, and whether more follow.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_stops_at_its_budget_and_goes_on_from_there_without_repeats() {
        use crate::job::{JobDefaults, parse_enqueue_body};
        let mut table = super::super::job_table::JobTable::default();
        for n in 0..300u128 {
            let body = format!(r#"{{"type":"t","args":["{}"]}}"#, if n % 7 == 0 { "needle" } else { "hay" });
            let new_job = parse_enqueue_body(body.as_bytes(), &JobDefaults::default()).unwrap();
            // All in shard 3: ids that differ above the low six bits.
            let id = JobId((n + 1) << 64 | 3);
            table.insert(Arc::new(Job::accept(new_job, id, JobState::Available, 1_000, None, None)));
        }
        table.publish();
        let view = ReadView::new(table.shared());
        let filter = JobFilter::all().text("needle");
        let (mut found, mut from, mut pages) = (Vec::new(), None, 0);
        loop {
            let page = view.jobs_page_within(&filter, from, 100, 50);
            found.extend(page.jobs.iter().map(|job| job.id));
            pages += 1;
            match page.next {
                Some(next) => from = Some(next),
                None => break,
            }
        }
        let expected: Vec<JobId> = (0..300u128).filter(|n| n % 7 == 0).map(|n| JobId((n + 1) << 64 | 3)).collect();
        assert_eq!(found, expected, "every match once, in order");
        assert!(pages >= 6, "300 jobs read 50 at a time: {pages} pages");
    }

    #[tokio::test]
    async fn a_failure_wakes_those_waiting_for_it_and_later_waits_end_at_once() {
        let view = Arc::new(ReadView::new(super::super::job_table::JobTable::default().shared()));
        let waiting = tokio::spawn({
            let view = view.clone();
            async move { view.failed().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "no failure yet");
        let failing = view.clone();
        std::thread::spawn(move || failing.set_failure(EngineFailure::SyncFailed)).join().unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), waiting).await.unwrap().unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), view.failed()).await.unwrap();
        assert_eq!(view.failure(), Some(EngineFailure::SyncFailed));
    }
}
