//! Per-queue ready order: priority descending, then the time a job entered
//! `available`, then id (docs/api.md, "Fetch").
//!
//! An ordered set rather than a binary heap: cancel and expiry must take a job
//! out of the middle, and an exact set keeps `check_invariants` exact too.

use std::collections::BTreeSet;

use crate::job::JobId;

/// Sort key of an available job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReadyKey {
    /// Negated priority, so that the highest priority sorts first.
    negated_priority: i32,
    /// When the job (last) entered `available`, in milliseconds.
    entered_at: i64,
    pub id: JobId,
}

impl ReadyKey {
    pub fn new(priority: i32, entered_at: i64, id: JobId) -> Self {
        Self { negated_priority: -priority, entered_at, id }
    }
}

/// The available jobs of one queue, in fetch order.
#[derive(Debug, Default, Clone)]
pub struct ReadyQueue {
    keys: BTreeSet<ReadyKey>,
}

impl ReadyQueue {
    pub fn push(&mut self, key: ReadyKey) {
        self.keys.insert(key);
    }

    pub fn pop(&mut self) -> Option<ReadyKey> {
        self.keys.pop_first()
    }

    pub fn remove(&mut self, key: &ReadyKey) -> bool {
        self.keys.remove(key)
    }

    pub fn contains(&self, key: &ReadyKey) -> bool {
        self.keys.contains(key)
    }

    /// Keys in fetch order, without taking them out.
    pub fn iter(&self) -> impl Iterator<Item = &ReadyKey> {
        self.keys.iter()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_then_fifo() {
        let mut queue = ReadyQueue::default();
        queue.push(ReadyKey::new(0, 1, JobId(10)));
        queue.push(ReadyKey::new(5, 3, JobId(30)));
        queue.push(ReadyKey::new(0, 2, JobId(20)));
        queue.push(ReadyKey::new(-5, 0, JobId(40)));
        let order: Vec<u128> = std::iter::from_fn(|| queue.pop()).map(|key| key.id.0).collect();
        assert_eq!(order, [30, 10, 20, 40]);
    }

    #[test]
    fn same_time_ties_break_by_id() {
        let mut queue = ReadyQueue::default();
        queue.push(ReadyKey::new(0, 5, JobId(9)));
        queue.push(ReadyKey::new(0, 5, JobId(3)));
        queue.push(ReadyKey::new(0, 4, JobId(7)));
        let order: Vec<u128> = std::iter::from_fn(|| queue.pop()).map(|key| key.id.0).collect();
        assert_eq!(order, [7, 3, 9]);
    }

    #[test]
    fn removal_from_the_middle() {
        let mut queue = ReadyQueue::default();
        let keys: Vec<_> = (0..5).map(|n| ReadyKey::new(0, n, JobId(n as u128))).collect();
        keys.iter().for_each(|key| queue.push(*key));
        assert!(queue.remove(&keys[2]));
        assert!(!queue.remove(&keys[2]));
        let order: Vec<u128> = std::iter::from_fn(|| queue.pop()).map(|key| key.id.0).collect();
        assert_eq!(order, [0, 1, 3, 4]);
    }
}
