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
    fn due_entries_come_earliest_first_and_stay_until_removed() {
        let mut timers = TimerSet::default();
        timers.insert(300, JobId(1));
        timers.insert(100, JobId(2));
        timers.insert(200, JobId(3));
        assert_eq!(timers.next_deadline(), Some(100));
        assert_eq!(timers.due(250).collect::<Vec<_>>(), [(100, JobId(2)), (200, JobId(3))]);
        assert_eq!(timers.len(), 3, "looking does not take");
        assert!(timers.remove(100, JobId(2)));
        assert_eq!(timers.next_deadline(), Some(200));
        assert!(timers.due(199).next().is_none());
    }
}
