//! Per-queue ready order: priority descending, then the time a job entered
//! `available`, then id (docs/api.md, "Fetch").
//!
//! An ordered set rather than a binary heap: cancel and expiry must take a job
//! out of the middle, and an exact set keeps `check_invariants` exact too.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::job::JobId;

/// Sort key of an available job: 24 bytes, as many as a job has in each
/// of its maps, since a backlog holds one per waiting job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReadyKey {
    /// The priority's rank (highest first) in the top 8 bits, then the
    /// time the job (last) entered `available`, in milliseconds, biased by
    /// 2^55 so that earlier times sort first on either side of 1970.
    order: u64,
    pub id: JobId,
}

/// The bits of [`ReadyKey::order`] the entry time takes.
const TIME_BITS: u32 = 56;

impl ReadyKey {
    /// `priority` is validated to ±100 and `entered_at` a time the clock
    /// gave; values past what the key holds sort as their nearest end.
    pub fn new(priority: i32, entered_at: i64, id: JobId) -> Self {
        let rank = (i32::from(i8::MAX) - priority.clamp(i8::MIN.into(), i8::MAX.into())) as u64;
        let bias = 1i64 << (TIME_BITS - 1);
        let time = entered_at.clamp(-bias, bias - 1) + bias;
        Self { order: rank << TIME_BITS | time as u64, id }
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

    pub fn first(&self) -> Option<ReadyKey> {
        self.keys.first().copied()
    }

    /// The job after `key` in fetch order.
    pub fn next_after(&self, key: &ReadyKey) -> Option<ReadyKey> {
        use std::ops::Bound::{Excluded, Unbounded};
        self.keys.range((Excluded(*key), Unbounded)).next().copied()
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

/// The available jobs of one queue that carry a dispatch limit, by limit
/// key, each key in fetch order; and the first job of every key, in fetch
/// order, so a fetch finds the best job of an open key without looking at
/// the jobs behind each key's first.
#[derive(Debug, Default, Clone)]
pub struct KeyedReady {
    by_key: HashMap<Arc<str>, ReadyQueue>,
    heads: BTreeSet<(ReadyKey, Arc<str>)>,
    len: usize,
}

impl KeyedReady {
    pub fn push(&mut self, key: &str, job: ReadyKey) {
        let name: Arc<str> = match self.by_key.get_key_value(key) {
            Some((name, _)) => name.clone(),
            None => Arc::from(key),
        };
        let queue = self.by_key.entry(name.clone()).or_default();
        let old_head = queue.first();
        queue.push(job);
        self.len += 1;
        if old_head.is_none_or(|head| job < head) {
            if let Some(head) = old_head {
                self.heads.remove(&(head, name.clone()));
            }
            self.heads.insert((job, name));
        }
    }

    pub fn remove(&mut self, key: &str, job: &ReadyKey) -> bool {
        let Some((name, _)) = self.by_key.get_key_value(key) else { return false };
        let name = name.clone();
        let queue = self.by_key.get_mut(key).expect("found above");
        let was_head = queue.first() == Some(*job);
        if !queue.remove(job) {
            return false;
        }
        self.len -= 1;
        if was_head {
            self.heads.remove(&(*job, name.clone()));
            match queue.first() {
                Some(next) => {
                    self.heads.insert((next, name));
                }
                None => {
                    self.by_key.remove(key);
                }
            }
        }
        true
    }

    pub fn contains(&self, key: &str, job: &ReadyKey) -> bool {
        self.by_key.get(key).is_some_and(|queue| queue.contains(job))
    }

    /// The first job of each key, in fetch order.
    pub fn heads(&self) -> impl Iterator<Item = (&ReadyKey, &str)> {
        self.heads.iter().map(|(job, key)| (job, &**key))
    }

    /// The job after `job` under `key`, in fetch order.
    pub fn next_after(&self, key: &str, job: &ReadyKey) -> Option<ReadyKey> {
        self.by_key.get(key)?.next_after(job)
    }

    /// One key's jobs in fetch order.
    pub fn of_key(&self, key: &str) -> impl Iterator<Item = &ReadyKey> {
        self.by_key.get(key).into_iter().flat_map(ReadyQueue::iter)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_heads_follow_each_keys_first_job() {
        let mut ready = KeyedReady::default();
        let jobs: Vec<_> = (0..6).map(|n| ReadyKey::new(0, n, JobId(n as u128))).collect();
        ready.push("b", jobs[3]);
        ready.push("a", jobs[1]);
        ready.push("b", jobs[2]);
        ready.push("a", jobs[4]);
        let heads: Vec<_> = ready.heads().map(|(job, key)| (job.id.0, key.to_string())).collect();
        assert_eq!(heads, [(1, "a".to_string()), (2, "b".to_string())]);
        assert!(ready.remove("a", &jobs[1]));
        assert!(!ready.remove("a", &jobs[1]));
        let heads: Vec<_> = ready.heads().map(|(job, key)| (job.id.0, key.to_string())).collect();
        assert_eq!(heads, [(2, "b".to_string()), (4, "a".to_string())]);
        assert_eq!(ready.of_key("b").map(|job| job.id.0).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(ready.len(), 3);
        ready.remove("a", &jobs[4]);
        ready.remove("b", &jobs[3]);
        ready.remove("b", &jobs[2]);
        assert!(ready.is_empty() && ready.heads().next().is_none());
    }

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
    fn the_packed_key_keeps_the_order_at_the_ends_of_its_ranges() {
        let now = 1_800_000_000_000;
        let keys = [
            ReadyKey::new(100, -5_000, JobId(1)),
            ReadyKey::new(100, now, JobId(2)),
            ReadyKey::new(1, i64::MIN, JobId(3)),
            ReadyKey::new(1, 0, JobId(4)),
            ReadyKey::new(1, now, JobId(5)),
            ReadyKey::new(0, now - 1, JobId(6)),
            ReadyKey::new(0, now, JobId(7)),
            ReadyKey::new(0, now, JobId(8)),
            ReadyKey::new(-1, 1, JobId(9)),
            ReadyKey::new(-100, now, JobId(10)),
        ];
        let mut sorted = keys;
        sorted.reverse();
        sorted.sort();
        assert_eq!(sorted, keys, "priority first, then entry time, then id");
        assert_eq!(std::mem::size_of::<ReadyKey>(), 24);
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
