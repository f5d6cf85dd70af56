//! Every deadline the engine must act on, one entry per job: its earliest
//! pending deadline (scheduled time, retry time, claim expiry, expiry, pruning).
//!
//! An ordered set of (deadline, id): insert and remove are O(log n), taking
//! what is due costs O(due · log n), and the next deadline is O(1) away, so the
//! engine can sleep exactly until it.

use std::collections::BTreeSet;

use crate::clock::Millis;
use crate::job::JobId;

#[derive(Debug, Default, Clone)]
pub struct TimerSet {
    entries: BTreeSet<(Millis, JobId)>,
}

impl TimerSet {
    pub fn insert(&mut self, deadline: Millis, id: JobId) {
        self.entries.insert((deadline, id));
    }

    pub fn remove(&mut self, deadline: Millis, id: JobId) -> bool {
        self.entries.remove(&(deadline, id))
    }

    pub fn contains(&self, deadline: Millis, id: JobId) -> bool {
        self.entries.contains(&(deadline, id))
    }

    /// The earliest deadline, if any.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.entries.first().map(|(deadline, _)| *deadline)
    }

    /// Entries due at `now`, earliest first, left in place.
    pub fn due(&self, now: Millis) -> impl Iterator<Item = (Millis, JobId)> + '_ {
        self.entries.range(..=(now, JobId(u128::MAX))).copied()
    }

    /// Removes and returns up to `limit` entries due at `now`, earliest first.
    pub fn take_due(&mut self, now: Millis, limit: usize) -> Vec<(Millis, JobId)> {
        let mut due = Vec::new();
        while due.len() < limit {
            match self.entries.first() {
                Some(&(deadline, id)) if deadline <= now => {
                    self.entries.pop_first();
                    due.push((deadline, id));
                }
                _ => break,
            }
        }
        due
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_only_what_is_due_in_order() {
        let mut timers = TimerSet::default();
        timers.insert(300, JobId(1));
        timers.insert(100, JobId(2));
        timers.insert(200, JobId(3));
        assert_eq!(timers.next_deadline(), Some(100));
        assert_eq!(timers.take_due(250, 10), vec![(100, JobId(2)), (200, JobId(3))]);
        assert_eq!(timers.next_deadline(), Some(300));
        assert!(timers.take_due(299, 10).is_empty());
    }

    #[test]
    fn take_due_respects_the_limit() {
        let mut timers = TimerSet::default();
        (0..10).for_each(|n| timers.insert(n, JobId(n as u128)));
        assert_eq!(timers.take_due(100, 3).len(), 3);
        assert_eq!(timers.len(), 7);
    }
}
