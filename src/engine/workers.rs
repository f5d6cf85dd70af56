//! The worker registry (docs/api.md, "The worker registry and signals"): who has been seen, and the signals
//! operators gave them. Signals are durable engine state; when a worker was
//! last seen is soft state kept by the writer, rebuilt by contact after a
//! restart.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

use crate::clock::Millis;
use crate::job::JobId;

/// What an operator told a worker. No signal means `running`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerSignal {
    /// Finish current jobs; fetch hands out nothing new.
    Quiet,
    /// Stop: fetch hands out nothing; finish or requeue what is held.
    Terminate,
}

/// What a worker is to do, as the registry reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerState {
    Running,
    Quiet,
    Terminate,
}

impl WorkerState {
    /// The state a signal (or none) leaves a worker in.
    pub fn of(signal: Option<WorkerSignal>) -> WorkerState {
        match signal {
            None => WorkerState::Running,
            Some(WorkerSignal::Quiet) => WorkerState::Quiet,
            Some(WorkerSignal::Terminate) => WorkerState::Terminate,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Running => "running",
            WorkerState::Quiet => "quiet",
            WorkerState::Terminate => "terminate",
        }
    }
}

/// A worker as the registry reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerEntry {
    pub worker_id: String,
    pub state: WorkerState,
    pub first_seen_at: Millis,
    pub last_seen_at: Millis,
    pub last_heartbeat_at: Option<Millis>,
    pub active_job_ids: Vec<JobId>,
}

/// When each worker was first and last seen, and last sent a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contact {
    pub first_seen_at: Millis,
    pub last_seen_at: Millis,
    pub last_heartbeat_at: Option<Millis>,
}

/// What recording a contact did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Touched {
    /// The worker was not known before.
    pub new: bool,
    /// A worker forgotten to make room.
    pub forgotten: Option<String>,
}

/// The soft half of the registry, bounded: when full, the least recently
/// seen worker without active jobs is forgotten.
#[derive(Debug, Default)]
pub struct Contacts {
    seen: HashMap<String, Contact>,
}

impl Contacts {
    pub fn get(&self, worker_id: &str) -> Option<&Contact> {
        self.seen.get(worker_id)
    }

    /// Records contact; `busy` says whether a worker holds active jobs (they
    /// are never the ones forgotten).
    pub fn touch(
        &mut self,
        worker_id: &str,
        now: Millis,
        heartbeat: bool,
        limit: usize,
        busy: impl Fn(&str) -> bool,
    ) -> Touched {
        let mut forgotten = None;
        if !self.seen.contains_key(worker_id) && self.seen.len() >= limit {
            let idle = self.seen.iter().filter(|(id, _)| !busy(id)).min_by_key(|(_, contact)| contact.last_seen_at);
            if let Some(id) = idle.map(|(id, _)| id.clone()) {
                self.seen.remove(&id);
                forgotten = Some(id);
            }
        }
        let new = !self.seen.contains_key(worker_id);
        let contact = self.seen.entry(worker_id.to_string()).or_insert(Contact {
            first_seen_at: now,
            last_seen_at: now,
            last_heartbeat_at: None,
        });
        contact.last_seen_at = now;
        if heartbeat {
            contact.last_heartbeat_at = Some(now);
        }
        Touched { new, forgotten }
    }

    /// Workers last seen before `cutoff`.
    pub fn seen_before(&self, cutoff: Millis) -> Vec<String> {
        self.seen.iter().filter(|(_, contact)| contact.last_seen_at < cutoff).map(|(id, _)| id.clone()).collect()
    }

    /// Workers seen at or after `since`, in id order.
    pub fn seen_since(&self, since: Millis) -> Vec<String> {
        let mut ids: Vec<String> =
            self.seen.iter().filter(|(_, contact)| contact.last_seen_at >= since).map(|(id, _)| id.clone()).collect();
        ids.sort();
        ids
    }

    pub fn forget(&mut self, worker_id: &str) -> bool {
        self.seen.remove(worker_id).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_registry_forgets_the_least_recently_seen_idle_worker() {
        let mut contacts = Contacts::default();
        contacts.touch("old-busy", 1, false, 3, |_| false);
        contacts.touch("old-idle", 2, false, 3, |_| false);
        contacts.touch("recent", 3, true, 3, |_| false);
        let touched = contacts.touch("new", 4, false, 3, |id| id == "old-busy");
        assert_eq!(touched, Touched { new: true, forgotten: Some("old-idle".to_string()) });
        assert!(!contacts.touch("new", 5, false, 3, |_| false).new);
        assert_eq!(contacts.seen_before(3), vec!["old-busy".to_string()]);
        assert!(contacts.get("old-busy").is_some() && contacts.get("new").is_some());
        assert_eq!(contacts.get("recent").unwrap().last_heartbeat_at, Some(3));
    }
}
