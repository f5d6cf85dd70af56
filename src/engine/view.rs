//! What readers see: a copy of the committed state that only the writer
//! changes, after each durable commit. Readers take a shard's read lock for
//! one lookup, so reads never wait behind a commit's I/O.

use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::events::{Event, EventBuffer, EventPage};
use crate::job::{Job, JobId, JobState};

const SHARDS: usize = 64;

/// One queue's figures as of the last commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSummary {
    pub name: String,
    pub paused: bool,
    pub counts: [u64; 8],
}

impl QueueSummary {
    pub fn count(&self, state: JobState) -> u64 {
        self.counts[state.index()]
    }

    /// Jobs not yet finished.
    pub fn size(&self) -> u64 {
        JobState::ALL.iter().filter(|state| !state.is_terminal()).map(|state| self.count(*state)).sum()
    }
}

pub struct ReadView {
    shards: Vec<RwLock<HashMap<JobId, Arc<Job>>>>,
    queues: RwLock<Arc<Vec<QueueSummary>>>,
    events: Mutex<EventBuffer>,
    storage_failed: AtomicBool,
}

impl Default for ReadView {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
            queues: RwLock::new(Arc::new(Vec::new())),
            events: Mutex::new(EventBuffer::default()),
            storage_failed: AtomicBool::new(false),
        }
    }
}

impl ReadView {
    fn shard(&self, id: JobId) -> &RwLock<HashMap<JobId, Arc<Job>>> {
        // The low bits of a UUIDv7 are random, so they spread jobs evenly.
        &self.shards[(id.0 as usize) % SHARDS]
    }

    pub fn job(&self, id: JobId) -> Option<Arc<Job>> {
        self.shard(id).read().get(&id).cloned()
    }

    pub fn queues(&self) -> Arc<Vec<QueueSummary>> {
        self.queues.read().clone()
    }

    pub fn events_page(&self, after: Option<&str>, limit: usize, keep: impl Fn(&Event) -> bool) -> EventPage {
        self.events.lock().page(after, limit, keep)
    }

    pub fn storage_failed(&self) -> bool {
        self.storage_failed.load(Ordering::SeqCst)
    }

    pub(crate) fn set_storage_failed(&self) {
        self.storage_failed.store(true, Ordering::SeqCst);
    }

    /// Writer only: publishes changed jobs (`None` removes).
    pub(crate) fn publish_jobs(&self, changes: impl Iterator<Item = (JobId, Option<Arc<Job>>)>) {
        let mut by_shard: Vec<Vec<(JobId, Option<Arc<Job>>)>> = (0..SHARDS).map(|_| Vec::new()).collect();
        for (id, job) in changes {
            by_shard[(id.0 as usize) % SHARDS].push((id, job));
        }
        for (shard, changes) in self.shards.iter().zip(by_shard) {
            if changes.is_empty() {
                continue;
            }
            let mut map = shard.write();
            for (id, job) in changes {
                match job {
                    Some(job) => map.insert(id, job),
                    None => map.remove(&id),
                };
            }
        }
    }

    pub(crate) fn publish_queues(&self, summaries: Vec<QueueSummary>) {
        *self.queues.write() = Arc::new(summaries);
    }

    pub(crate) fn publish_events(&self, events: impl Iterator<Item = Event>) {
        let mut buffer = self.events.lock();
        events.for_each(|event| buffer.push(event));
    }
}
