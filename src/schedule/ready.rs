//! Per-queue ready order: priority descending, then the time a job entered
//! `available`, then id (docs/api.md, "Fetch").
//!
//! An ordered set rather than a binary heap: cancel and expiry must take a job
//! out of the middle, and an exact set keeps `check_invariants` exact too.
//! Built by hand ([`ReadyQueue`]) because a backlog holds one key per
//! waiting job, and the general B-tree spent twice the key's size on each.

use std::collections::{BTreeSet, HashMap, VecDeque};
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

    /// The time the job entered `available`, as [`ReadyKey::new`] took it.
    pub fn entered_at(&self) -> i64 {
        (self.order & ((1u64 << TIME_BITS) - 1)) as i64 - (1i64 << (TIME_BITS - 1))
    }
}

/// Keys a block holds at most (12 KiB of keys).
const BLOCK_KEYS: usize = 512;

/// The available jobs of one queue, in fetch order.
///
/// Sorted blocks of up to `BLOCK_KEYS` (512) keys rather than a B-tree: a job
/// almost always enters `available` later than every job of its priority
/// already there, so most pushes append to the last block, and a full block
/// costs 24 bytes a key where the B-tree's half-full leaves cost about 50
/// (docs/perf-log.md, "Memory per job"). A key that sorts
/// elsewhere (a higher priority, a job retried with an earlier entry time)
/// goes into its block, which splits in halves when full.
#[derive(Debug, Default, Clone)]
pub struct ReadyQueue {
    /// Non-empty sorted blocks; each block's keys sort before the next's.
    blocks: VecDeque<VecDeque<ReadyKey>>,
    len: usize,
}

impl ReadyQueue {
    /// The block `key` is in or belongs in: the last one that starts at or
    /// before it, else the first.
    fn block_for(&self, key: &ReadyKey) -> usize {
        self.blocks.partition_point(|block| block[0] <= *key).saturating_sub(1)
    }

    /// Adds `key` (a key already there stays once).
    pub fn push(&mut self, key: ReadyKey) {
        if let Some(last) = self.blocks.back_mut()
            && last.back().is_some_and(|back| *back < key)
        {
            if last.len() < BLOCK_KEYS {
                last.push_back(key);
            } else {
                self.blocks.push_back(VecDeque::from([key]));
            }
            self.len += 1;
            return;
        }
        if self.blocks.is_empty() {
            self.blocks.push_back(VecDeque::from([key]));
            self.len += 1;
            return;
        }
        let mut index = self.block_for(&key);
        if self.blocks[index].binary_search(&key).is_ok() {
            return;
        }
        if self.blocks[index].len() == BLOCK_KEYS {
            let upper = self.blocks[index].split_off(BLOCK_KEYS / 2);
            self.blocks.insert(index + 1, upper);
            if self.blocks[index + 1][0] < key {
                index += 1;
            }
        }
        let block = &mut self.blocks[index];
        let at = block.binary_search(&key).unwrap_err();
        block.insert(at, key);
        self.len += 1;
    }

    pub fn first(&self) -> Option<ReadyKey> {
        self.blocks.front().and_then(|block| block.front()).copied()
    }

    /// When the job that has waited longest entered `available` (ms): the
    /// first key of each priority, found by jumping from one priority to
    /// the next (a lookup per priority present, not a pass over the keys).
    pub fn oldest_entry(&self) -> Option<i64> {
        let mut oldest: Option<i64> = None;
        let mut key = self.first()?;
        loop {
            oldest = Some(oldest.map_or(key.entered_at(), |held| held.min(key.entered_at())));
            // The last key this priority can hold; the next key is the next priority's first.
            let last_of_rank = ReadyKey { order: key.order | ((1u64 << TIME_BITS) - 1), id: JobId(u128::MAX) };
            match self.next_after(&last_of_rank) {
                Some(next) => key = next,
                None => return oldest,
            }
        }
    }

    /// The job after `key` in fetch order.
    pub fn next_after(&self, key: &ReadyKey) -> Option<ReadyKey> {
        if self.blocks.is_empty() {
            return None;
        }
        let index = self.block_for(key);
        let block = &self.blocks[index];
        let at = match block.binary_search(key) {
            Ok(at) => at + 1,
            Err(at) => at,
        };
        block.get(at).or_else(|| self.blocks.get(index + 1).and_then(|next| next.front())).copied()
    }

    pub fn pop(&mut self) -> Option<ReadyKey> {
        let first = self.blocks.front_mut()?;
        let key = first.pop_front();
        if first.is_empty() {
            self.blocks.pop_front();
        }
        self.len -= 1;
        key
    }

    pub fn remove(&mut self, key: &ReadyKey) -> bool {
        if self.blocks.is_empty() {
            return false;
        }
        let index = self.block_for(key);
        let block = &mut self.blocks[index];
        let Ok(at) = block.binary_search(key) else { return false };
        block.remove(at);
        if block.is_empty() {
            self.blocks.remove(index);
        } else if block.len() < block.capacity() / 4 {
            // A block emptied from the middle gives back what it no longer uses.
            block.shrink_to_fit();
        }
        self.len -= 1;
        true
    }

    pub fn contains(&self, key: &ReadyKey) -> bool {
        !self.blocks.is_empty() && self.blocks[self.block_for(key)].binary_search(key).is_ok()
    }

    /// Keys in fetch order, without taking them out.
    pub fn iter(&self) -> impl Iterator<Item = &ReadyKey> {
        self.blocks.iter().flatten()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
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
    /// As [`ReadyQueue::oldest_entry`], over the first job of each of the
    /// first 256 keys in fetch order: exact for the usual few keys, a
    /// bounded look for many.
    pub fn oldest_entry(&self) -> Option<i64> {
        self.heads.iter().take(256).map(|(head, _)| head.entered_at()).min()
    }

    pub fn push(&mut self, key: &str, job: ReadyKey) {
        let name: Arc<str> = match self.by_key.get_key_value(key) {
            Some((name, _)) => name.clone(),
            None => Arc::from(key),
        };
        let queue = self.by_key.entry(name.clone()).or_default();
        let (old_head, old_len) = (queue.first(), queue.len());
        queue.push(job);
        if queue.len() == old_len {
            return;
        }
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
    fn the_oldest_entry_is_found_across_priorities() {
        let mut ready = ReadyQueue::default();
        assert_eq!(ready.oldest_entry(), None);
        for (priority, at, id) in [(5, 300, 1), (5, 400, 2), (0, 100, 3), (0, 500, 4), (-3, 200, 5)] {
            ready.push(ReadyKey::new(priority, at, JobId(id)));
        }
        for n in 0..2000u128 {
            ready.push(ReadyKey::new(9, 1_000 + n as i64, JobId(100 + n)));
        }
        assert_eq!(ready.oldest_entry(), Some(100));
        assert_eq!(ReadyKey::new(0, -42, JobId(1)).entered_at(), -42);
    }

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
    fn a_job_pushed_twice_under_a_key_counts_once() {
        let mut ready = KeyedReady::default();
        let jobs: Vec<_> = (0..3).map(|n| ReadyKey::new(0, n, JobId(n as u128))).collect();
        for job in [jobs[1], jobs[0], jobs[2], jobs[1], jobs[0]] {
            ready.push("k", job);
        }
        assert_eq!(ready.len(), 3);
        for job in &jobs {
            assert!(ready.remove("k", job));
        }
        assert!(ready.is_empty());
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

    proptest::proptest! {
        /// Any mix of pushes (mostly in order, as jobs arrive), pops and
        /// removals leaves the queue holding what an ordered set holds, in
        /// its order.
        #[test]
        fn it_keeps_the_order_an_ordered_set_keeps(
            operations in proptest::collection::vec((0u8..10, 0i64..3000, 0i32..3), 1..4000)
        ) {
            let mut queue = ReadyQueue::default();
            let mut model = BTreeSet::new();
            let mut clock = 0;
            for (n, (kind, value, priority)) in operations.into_iter().enumerate() {
                match kind {
                    0..=5 => {
                        clock += 1;
                        let key = ReadyKey::new(priority, clock, JobId(n as u128));
                        queue.push(key);
                        model.insert(key);
                    }
                    6 => {
                        let key = ReadyKey::new(priority, value, JobId(value as u128));
                        queue.push(key);
                        queue.push(key);
                        model.insert(key);
                    }
                    7 => proptest::prop_assert_eq!(queue.pop(), model.pop_first()),
                    _ => {
                        let key = model.iter().nth(value as usize % model.len().max(1)).copied()
                            .unwrap_or(ReadyKey::new(0, value, JobId(1)));
                        proptest::prop_assert_eq!(queue.contains(&key), model.contains(&key));
                        let after = queue.next_after(&key);
                        proptest::prop_assert_eq!(after, model.range(key..).find(|next| **next != key).copied());
                        proptest::prop_assert_eq!(queue.remove(&key), model.remove(&key));
                        proptest::prop_assert!(!queue.contains(&key));
                    }
                }
                proptest::prop_assert_eq!(queue.len(), model.len());
                proptest::prop_assert_eq!(queue.first(), model.first().copied());
            }
            proptest::prop_assert!(queue.iter().eq(model.iter()));
            proptest::prop_assert!(queue.blocks.iter().all(|block| !block.is_empty() && block.len() <= BLOCK_KEYS));
        }
    }

    #[test]
    fn a_backlog_in_arrival_order_fills_its_blocks() {
        let mut queue = ReadyQueue::default();
        (0..10 * BLOCK_KEYS as i64).for_each(|n| queue.push(ReadyKey::new(0, n, JobId(n as u128))));
        assert_eq!(queue.blocks.len(), 10);
        assert!(queue.blocks.iter().all(|block| block.len() == BLOCK_KEYS && block.capacity() == BLOCK_KEYS));
        // A key between two of a full block's splits it in halves.
        let between = ReadyKey::new(0, 1, JobId(0));
        queue.push(between);
        assert_eq!(queue.blocks.len(), 11);
        assert_eq!((queue.blocks[0].len(), queue.blocks[1].len()), (BLOCK_KEYS / 2 + 1, BLOCK_KEYS / 2));
        assert_eq!(queue.next_after(&ReadyKey::new(0, 0, JobId(0))), Some(between));
        assert_eq!(queue.iter().nth(1), Some(&between));
        assert_eq!(queue.len(), 10 * BLOCK_KEYS + 1);
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
