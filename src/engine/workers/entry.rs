//! The worker registry (docs/api.md, "The worker registry and signals"): who has been seen, and the signals
//! operators gave them. Signals are durable engine state; when a worker was
//! last seen is soft state kept by the writer, rebuilt by contact after a
//! restart.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};

use crate::clock::Millis;
use crate::job::JobId;

/// What an operator told a worker. No signal means `running`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum WorkerSignal {
    /// Finish current jobs; fetch hands out nothing new.
    Quiet,
    /// Stop: fetch hands out nothing; finish or requeue what is held.
    Terminate,
}

/// What a worker is to do, as the registry reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
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
    /// The queues its last fetch named (none before it fetched).
    pub queues: Vec<String>,
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
///
/// The workers last known to hold no active jobs are also kept ordered by
/// when they were last seen, so that finding that worker takes O(log n)
/// instead of a look at every worker. Whether a worker holds jobs is the
/// engine state's to say: the writer reports each change after its turn
/// ([`Contacts::set_busy`]), and [`Contacts::touch`] checks the one it picks,
/// so a worker that took a job since is passed over, never forgotten.
#[derive(Debug, Default)]
pub struct Contacts {
    seen: HashMap<String, Seen>,
    /// `(last_seen_at, worker_id)` of every worker in `seen` not known busy.
    idle: BTreeSet<(Millis, String)>,
}

#[derive(Debug)]
struct Seen {
    contact: Contact,
    /// The queues its last fetch named.
    queues: Vec<String>,
    /// Held active jobs when last told; such a worker is not in `idle`.
    busy: bool,
}

impl Contacts {
    pub fn get(&self, worker_id: &str) -> Option<&Contact> {
        self.seen.get(worker_id).map(|seen| &seen.contact)
    }

    /// The queues a worker's last fetch named.
    pub fn queues(&self, worker_id: &str) -> &[String] {
        self.seen.get(worker_id).map_or(&[], |seen| &seen.queues)
    }

    /// Notes the queues a worker fetches from (copied only when they change).
    pub fn set_queues(&mut self, worker_id: &str, queues: &[String]) {
        if let Some(seen) = self.seen.get_mut(worker_id)
            && seen.queues != queues
        {
            seen.queues = queues.to_vec();
        }
    }

    pub fn len(&self) -> usize {
        self.seen.len()
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
            // Oldest first; one that took a job since it was last reported
            // idle is marked busy and passed over.
            let mut taken = Vec::new();
            let mut idle = None;
            for (_, id) in &self.idle {
                if !busy(id) {
                    idle = Some(id.clone());
                    break;
                }
                taken.push(id.clone());
            }
            for id in taken {
                self.set_busy(&id, true);
            }
            if let Some(id) = idle {
                self.forget(&id);
                forgotten = Some(id);
            }
        }
        let is_busy = busy(worker_id);
        let new = !self.seen.contains_key(worker_id);
        let seen = self.seen.entry(worker_id.to_string()).or_insert_with(|| Seen {
            contact: Contact { first_seen_at: now, last_seen_at: now, last_heartbeat_at: None },
            queues: Vec::new(),
            busy: true,
        });
        if !seen.busy {
            self.idle.remove(&(seen.contact.last_seen_at, worker_id.to_string()));
        }
        seen.contact.last_seen_at = now;
        if heartbeat {
            seen.contact.last_heartbeat_at = Some(now);
        }
        seen.busy = is_busy;
        if !is_busy {
            self.idle.insert((now, worker_id.to_string()));
        }
        Touched { new, forgotten }
    }

    /// Notes whether a known worker holds active jobs now.
    pub fn set_busy(&mut self, worker_id: &str, busy: bool) {
        let Some(seen) = self.seen.get_mut(worker_id) else { return };
        if seen.busy == busy {
            return;
        }
        seen.busy = busy;
        let key = (seen.contact.last_seen_at, worker_id.to_string());
        if busy {
            self.idle.remove(&key);
        } else {
            self.idle.insert(key);
        }
    }

    /// Workers last seen before `cutoff`.
    pub fn seen_before(&self, cutoff: Millis) -> Vec<String> {
        self.seen.iter().filter(|(_, seen)| seen.contact.last_seen_at < cutoff).map(|(id, _)| id.clone()).collect()
    }

    /// Workers seen at or after `since`, in id order.
    pub fn seen_since(&self, since: Millis) -> Vec<String> {
        let mut ids: Vec<String> =
            self.seen.iter().filter(|(_, seen)| seen.contact.last_seen_at >= since).map(|(id, _)| id.clone()).collect();
        ids.sort();
        ids
    }

    pub fn forget(&mut self, worker_id: &str) -> bool {
        let Some(seen) = self.seen.remove(worker_id) else { return false };
        if !seen.busy {
            self.idle.remove(&(seen.contact.last_seen_at, worker_id.to_string()));
        }
        true
    }

    /// Checks that `idle` holds exactly the known workers not marked busy,
    /// each at its last contact (tests).
    #[cfg(test)]
    fn check(&self) {
        let expected: BTreeSet<(Millis, String)> = self
            .seen
            .iter()
            .filter(|(_, seen)| !seen.busy)
            .map(|(id, seen)| (seen.contact.last_seen_at, id.clone()))
            .collect();
        assert_eq!(self.idle, expected);
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
        contacts.check();
    }

    /// The idle order follows contact and reported work: the worker picked
    /// is the least recently seen of those holding no job, whether it
    /// became idle by a report or turns out busy when picked.
    #[test]
    fn the_least_recently_seen_idle_worker_is_forgotten_by_last_contact() {
        let mut contacts = Contacts::default();
        let limit = 1_000;
        for n in 0..limit {
            contacts.touch(&format!("w{n}"), n as Millis, false, limit, |_| false);
        }
        // w0 is seen again, w1 and w2 take jobs (w2's goes unreported).
        contacts.touch("w0", 5_000, true, limit, |_| false);
        contacts.set_busy("w1", true);
        let busy = |id: &str| id == "w1" || id == "w2";
        contacts.check();

        let touched = contacts.touch("n0", 6_000, false, limit, busy);
        assert_eq!(touched, Touched { new: true, forgotten: Some("w3".to_string()) });
        contacts.check();
        assert!(contacts.get("w2").is_some(), "a worker found busy when picked stays");
        let touched = contacts.touch("n1", 6_001, false, limit, busy);
        assert_eq!(touched.forgotten.as_deref(), Some("w4"));

        // w1 finishes its job: the oldest idle worker again.
        contacts.set_busy("w1", false);
        let touched = contacts.touch("n2", 6_002, false, limit, |id| id == "w2");
        assert_eq!(touched.forgotten.as_deref(), Some("w1"));
        contacts.check();
        assert!(contacts.forget("w5") && !contacts.forget("w5"));
        contacts.check();
        assert_eq!(contacts.len(), limit - 1);
        let touched = contacts.touch("n3", 6_003, false, limit, |_| false);
        assert_eq!(touched, Touched { new: true, forgotten: None }, "room was left");
        contacts.set_busy("w2", false);
        let touched = contacts.touch("n4", 6_004, false, limit, |_| false);
        assert_eq!(touched.forgotten.as_deref(), Some("w2"), "reported idle, w2 is the oldest");
        let everyone_busy = contacts.touch("n5", 6_005, false, limit, |_| true);
        assert_eq!(everyone_busy.forgotten, None);
        assert_eq!(contacts.len(), limit + 1, "no idle worker to forget: the registry grows");
        contacts.check();
    }
}
