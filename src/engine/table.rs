//! A durable table: entries by key that records change on the engine
//! thread ([`Table`]), and the read view's copy of them ([`Published`]).
//!
//! Cron entries, workflows, schemas and webhook subscriptions are tables.
//! Each change marks its key; at the end of a turn the writer takes the
//! changed entries ([`Table::take_changes`]) and, once the turn is durable,
//! the committer hands them to the view ([`Published::publish`]). Entries
//! are shared by `Arc`, so publishing costs a pointer per changed entry.
//! A snapshot image carries a table as the list of its entries.

use parking_lot::RwLock;
use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

/// What changed in a table since the last publish: each changed key once,
/// with its entry now (`None`: removed).
pub(crate) type Changes<K, V> = Vec<(K, Option<Arc<V>>)>;

/// The engine's side of a table.
#[derive(Debug, Clone)]
pub(crate) struct Table<K, V> {
    entries: BTreeMap<K, Arc<V>>,
    /// Keys changed since the last [`Table::take_changes`], each once: a
    /// replayed log may change one entry millions of times before the first
    /// publish.
    changed: BTreeSet<K>,
}

impl<K, V> Default for Table<K, V> {
    fn default() -> Self {
        Table { entries: BTreeMap::new(), changed: BTreeSet::new() }
    }
}

impl<K: Ord + Clone, V> Table<K, V> {
    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&Arc<V>>
    where
        K: Borrow<Q>,
    {
        self.entries.get(key)
    }

    pub fn contains_key<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.entries.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry, in key order.
    pub fn values(&self) -> impl Iterator<Item = &Arc<V>> {
        self.entries.values()
    }

    /// Stores `value` under `key`, returning the entry it replaced.
    pub fn insert(&mut self, key: K, value: Arc<V>) -> Option<Arc<V>> {
        self.changed.insert(key.clone());
        self.entries.insert(key, value)
    }

    pub fn remove<Q: Ord + ToOwned<Owned = K> + ?Sized>(&mut self, key: &Q) -> Option<Arc<V>>
    where
        K: Borrow<Q>,
    {
        let removed = self.entries.remove(key)?;
        self.changed.insert(key.to_owned());
        Some(removed)
    }

    /// The entry under `key` to change in place: a copy when a reader still
    /// holds the published one.
    pub fn update(&mut self, key: &K) -> Option<&mut V>
    where
        V: Clone,
    {
        let entry = self.entries.get_mut(key)?;
        if !self.changed.contains(key) {
            self.changed.insert(key.clone());
        }
        Some(Arc::make_mut(entry))
    }

    /// The entries changed since the last call, each once, as they are now.
    pub fn take_changes(&mut self) -> Changes<K, V> {
        std::mem::take(&mut self.changed)
            .into_iter()
            .map(|key| {
                let entry = self.entries.get(&key).cloned();
                (key, entry)
            })
            .collect()
    }
}

/// The read view's side of a table: readers take the lock for one lookup
/// or one page; only the committer writes, after a turn is durable.
#[derive(Debug)]
pub(crate) struct Published<K, V> {
    entries: RwLock<BTreeMap<K, Arc<V>>>,
}

impl<K, V> Default for Published<K, V> {
    fn default() -> Self {
        Published { entries: RwLock::new(BTreeMap::new()) }
    }
}

impl<K: Ord, V> Published<K, V> {
    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<Arc<V>>
    where
        K: Borrow<Q>,
    {
        self.entries.read().get(key).cloned()
    }

    /// Up to `limit` entries after the key `after` (key order) that pass
    /// `keep`, and whether more follow.
    pub fn page<Q: Ord + ?Sized>(
        &self,
        after: Option<&Q>,
        limit: usize,
        keep: impl Fn(&V) -> bool,
    ) -> (Vec<Arc<V>>, bool)
    where
        K: Borrow<Q>,
    {
        let entries = self.entries.read();
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        let matching = entries.range::<Q, _>((start, Bound::Unbounded)).map(|(_, entry)| entry);
        take_page(matching.filter(|entry| keep(entry)), limit)
    }

    /// Applies a turn's changes (`None` removes).
    pub fn publish(&self, changes: Changes<K, V>) {
        if changes.is_empty() {
            return;
        }
        let mut entries = self.entries.write();
        for (key, entry) in changes {
            match entry {
                Some(entry) => entries.insert(key, entry),
                None => entries.remove(&key),
            };
        }
    }
}

/// Up to `limit` items of `matching`, and whether more follow.
pub(crate) fn take_page<'a, T: Clone + 'a>(mut matching: impl Iterator<Item = &'a T>, limit: usize) -> (Vec<T>, bool) {
    let page: Vec<T> = matching.by_ref().take(limit).cloned().collect();
    let has_more = matching.next().is_some();
    (page, has_more)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turns_changes_reach_the_published_copy_once_each() {
        let mut table: Table<String, u32> = Table::default();
        let published: Published<String, u32> = Published::default();
        table.insert("a".into(), Arc::new(1));
        table.insert("b".into(), Arc::new(2));
        *table.update(&"a".to_string()).unwrap() += 10;
        let changes = table.take_changes();
        assert_eq!(changes.len(), 2, "a key changed twice is published once");
        assert!(published.get("a").is_none(), "nothing is visible before the publish");
        published.publish(changes);
        assert_eq!(published.get("a").as_deref(), Some(&11));

        table.remove("b");
        assert!(table.remove("missing").is_none());
        assert!(table.update(&"missing".to_string()).is_none());
        let changes = table.take_changes();
        assert_eq!(changes, vec![("b".to_string(), None)], "only what changed, removals as None");
        published.publish(changes);
        assert!(published.get("b").is_none());
        assert!(table.take_changes().is_empty());
    }

    #[test]
    fn changes_waiting_for_a_publish_hold_each_key_once() {
        // A replayed log may change one entry millions of times before the
        // first publish: what waits must not grow with the changes.
        let mut table: Table<u32, u32> = Table::default();
        table.insert(1, Arc::new(0));
        for _ in 0..10_000 {
            *table.update(&1).unwrap() += 1;
            table.insert(2, Arc::new(0));
        }
        assert_eq!(table.changed.len(), 2);
        assert_eq!(table.take_changes().len(), 2);
    }

    #[test]
    fn an_entry_a_reader_holds_is_copied_before_it_changes() {
        let mut table: Table<u32, String> = Table::default();
        table.insert(1, Arc::new("before".into()));
        let held = table.get(&1).unwrap().clone();
        table.update(&1).unwrap().push_str(" and after");
        assert_eq!(held.as_str(), "before");
        assert_eq!(table.get(&1).unwrap().as_str(), "before and after");
    }

    #[test]
    fn pages_start_after_the_key_and_say_whether_more_follow() {
        let published: Published<u32, u32> = Published::default();
        published.publish((1..=5).map(|key| (key, Some(Arc::new(key * 10)))).collect());
        let (page, more) = published.page(None, 2, |_| true);
        assert_eq!(page.iter().map(|entry| **entry).collect::<Vec<_>>(), [10, 20]);
        assert!(more);
        let (page, more) = published.page(Some(&2), 10, |value| *value != 40);
        assert_eq!(page.iter().map(|entry| **entry).collect::<Vec<_>>(), [30, 50]);
        assert!(!more);
    }
}
