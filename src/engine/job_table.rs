//! Every job the engine holds, in one map that the engine and its readers
//! share (a second copy for readers cost memory for every job; see "Memory
//! per job" in docs/perf-log.md).
//!
//! The map is split into shards, each behind a read-write lock. Readers take
//! a shard's read lock for one lookup. The engine thread is the only writer:
//! what it changes during a turn waits in a small overlay of its own
//! (`unpublished`) until the turn is on disk, and [`JobTable::publish`] then
//! moves it into the shards under their write locks, so readers never see a
//! change before it is durable. Before any reader exists (loading a snapshot,
//! replaying the log) changes go straight into the shards.

use hashbrown::HashTable;
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::job::{IdHashState, Job, JobId, JobIdMap, JobState};

pub(crate) const SHARDS: usize = 64;

/// Position in the dead letter listing kept beside the jobs: newest
/// `discarded_at` first, then the higher id first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct DeadLetterKey {
    discarded_at: std::cmp::Reverse<i64>,
    id: std::cmp::Reverse<JobId>,
}

impl DeadLetterKey {
    pub(crate) fn new(discarded_at: i64, id: JobId) -> DeadLetterKey {
        DeadLetterKey { discarded_at: std::cmp::Reverse(discarded_at), id: std::cmp::Reverse(id) }
    }

    /// The key of a job the listing holds: a discarded one.
    pub(crate) fn of(job: &Job) -> Option<DeadLetterKey> {
        let discarded_at = job.run().discarded_at.filter(|_| job.state == JobState::Discarded)?;
        Some(DeadLetterKey::new(discarded_at, job.id))
    }

    pub(crate) fn discarded_at(&self) -> i64 {
        self.discarded_at.0
    }

    pub(crate) fn id(&self) -> JobId {
        self.id.0
    }
}

/// Jobs keyed by the id inside them: a slot is a pointer and part of the
/// id's hash (12 bytes and a control byte), not an id and a pointer (24
/// and one).
type JobSet = HashTable<Held>;
type Shard = RwLock<JobSet>;
/// A job's new version (`None`: removed).
type JobChange = (JobId, Option<Arc<Job>>);

/// A job in its shard: the job's pointer and 32 bits of its id's hash.
///
/// Growing a shard moves every slot to the place its hash says. Hashing the
/// id again read it from each job's own allocation, a cache miss (and often
/// a page walk) a job, which prefetching did not hide: an eighth of the
/// engine thread's time in a batch fill of 2 M jobs. With the hash in the
/// slot, growing reads the table alone, and a lookup reads the id of no
/// job whose hash differs. A full `u64` hash and an `Arc` make a 16-byte
/// slot, more memory a job at 10 M jobs (docs/perf-log.md, "Job table");
/// packed to 4-byte alignment it is 12 bytes.
#[repr(C, packed(4))]
struct Held {
    /// From [`Arc::into_raw`]: the slot holds one of the job's references.
    job: *const Job,
    hash: u32,
}

const _: () = assert!(std::mem::size_of::<Held>() == 12);

// What the impls below rest on, checked.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Arc<Job>>();
};

// SAFETY: a `Held` owns an `Arc<Job>` kept as its pointer, and `Arc<Job>`
// is `Send`.
#[allow(unsafe_code)]
unsafe impl Send for Held {}
// SAFETY: a `Held` only hands out `&Job` and new `Arc<Job>`s, and `Arc<Job>`
// is `Sync`.
#[allow(unsafe_code)]
unsafe impl Sync for Held {}

impl Held {
    fn new(hash: u32, job: Arc<Job>) -> Held {
        Held { job: Arc::into_raw(job), hash }
    }

    /// The job, alive as long as the slot holds it.
    #[allow(unsafe_code)]
    fn job(&self) -> &Job {
        // SAFETY: the pointer came from `Arc::into_raw` and the slot still
        // holds that reference. `{ self.job }` copies the packed field.
        unsafe { &*{ self.job } }
    }

    /// A new reference to the job.
    #[allow(unsafe_code)]
    fn handle(&self) -> Arc<Job> {
        let job = self.job;
        // SAFETY: as in `job`; the count is raised for the `Arc` made here.
        unsafe {
            Arc::increment_strong_count(job);
            Arc::from_raw(job)
        }
    }

    /// Puts `job` in the slot and hands back the one it held.
    #[allow(unsafe_code)]
    fn replace(&mut self, job: Arc<Job>) -> Arc<Job> {
        let old = self.job;
        self.job = Arc::into_raw(job);
        // SAFETY: the slot's reference to the old job passes to the `Arc`.
        unsafe { Arc::from_raw(old) }
    }

    /// The slot's reference to its job.
    #[allow(unsafe_code)]
    fn into_job(self) -> Arc<Job> {
        let held = std::mem::ManuallyDrop::new(self);
        // SAFETY: as in `replace`; `held` is not dropped.
        unsafe { Arc::from_raw(held.job) }
    }

    fn is(&self, hash: u32, id: JobId) -> bool {
        let held = self.hash;
        held == hash && self.job().id == id
    }

    /// The hash the table places the slot by. The table takes a slot's
    /// first bucket from the low bits of its hash and a 7-bit tag from the
    /// top 7: both come from the 32 bits kept, the bucket from bits 0–24 (a
    /// shard of up to 32 M buckets) and the tag from bits 25–31.
    fn table_hash(hash: u32) -> u64 {
        (u64::from(hash) << 32) | u64::from(hash)
    }

    fn placed(&self) -> u64 {
        Held::table_hash(self.hash)
    }
}

impl Drop for Held {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: as in `replace`; the slot is going.
        drop(unsafe { Arc::from_raw(self.job) });
    }
}

/// The durable jobs, as readers see them.
pub(crate) struct SharedJobs {
    shards: Box<[Shard]>,
    /// Each shard's capacity when it last grew: what it holds with no
    /// removed slots. `JobSet::capacity` counts removed slots as taken, so
    /// with many removals it says less.
    grown_to: Box<[AtomicUsize]>,
    hasher: IdHashState,
    /// Discarded jobs in listing order, kept in step with the shards.
    pub(super) dead_letter: RwLock<BTreeMap<DeadLetterKey, Arc<Job>>>,
}

impl SharedJobs {
    fn new() -> SharedJobs {
        SharedJobs {
            shards: (0..SHARDS).map(|_| RwLock::new(JobSet::new())).collect(),
            grown_to: (0..SHARDS).map(|_| AtomicUsize::new(0)).collect(),
            hasher: IdHashState::default(),
            dead_letter: RwLock::new(BTreeMap::new()),
        }
    }

    fn shard(&self, id: JobId) -> &Shard {
        &self.shards[shard_of(id)]
    }

    fn hash(&self, id: JobId) -> u32 {
        hash_of(&self.hasher, id)
    }

    /// A job as of the last durable turn.
    pub fn job(&self, id: JobId) -> Option<Arc<Job>> {
        let hash = self.hash(id);
        self.shard(id).read().find(Held::table_hash(hash), |held| held.is(hash, id)).map(Held::handle)
    }

    /// The ids of one shard's jobs above `after` that pass `keep`, in id
    /// order, and how many jobs the shard held. Only ids are copied under
    /// the shard's read lock; they are sorted after it is released, by
    /// value (sorting the jobs by their ids would read two jobs at every
    /// comparison).
    pub(crate) fn shard_ids(
        &self,
        shard: usize,
        after: Option<JobId>,
        keep: impl Fn(&Job) -> bool,
    ) -> (Vec<JobId>, usize) {
        let (mut ids, held): (Vec<JobId>, usize) = {
            let set = self.shards[shard].read();
            let kept = set
                .iter()
                .map(Held::job)
                .filter(|job| after.is_none_or(|after| job.id > after) && keep(job))
                .map(|job| job.id)
                .collect();
            (kept, set.len())
        };
        ids.sort_unstable();
        (ids, held)
    }

    /// Adds or replaces a job in a shard this thread may write (under its
    /// write lock, or owned alone); the version replaced.
    fn put(set: &mut JobSet, hasher: &IdHashState, job: Arc<Job>) -> Option<Arc<Job>> {
        let (id, hash) = (job.id, hash_of(hasher, job.id));
        match set.entry(Held::table_hash(hash), |held| held.is(hash, id), Held::placed) {
            hashbrown::hash_table::Entry::Occupied(mut held) => Some(held.get_mut().replace(job)),
            hashbrown::hash_table::Entry::Vacant(slot) => {
                slot.insert(Held::new(hash, job));
                None
            }
        }
    }

    /// Removes a job from a shard this thread may write.
    fn take(set: &mut JobSet, hasher: &IdHashState, id: JobId) -> Option<Arc<Job>> {
        let hash = hash_of(hasher, id);
        set.find_entry(Held::table_hash(hash), |held| held.is(hash, id)).ok().map(|held| held.remove().0.into_job())
    }

    /// The shard's map, read without its lock.
    ///
    /// Sound because a shard is written only by the one [`JobTable`] that
    /// owns this `SharedJobs` (it is created by and never handed out of
    /// [`JobTable::new`]), only through `&mut JobTable`, and only under the
    /// shard's write lock; the engine reads through `&JobTable`, so none of
    /// its reads overlaps one of its writes. Other threads only read.
    #[allow(unsafe_code)]
    fn unlocked(&self, id: JobId) -> Option<&Held> {
        // SAFETY: see above; the data lives as long as `self`.
        let set = unsafe { &*self.shard(id).data_ptr() };
        let hash = self.hash(id);
        set.find(Held::table_hash(hash), |held| held.is(hash, id))
    }

    #[allow(unsafe_code)]
    fn all_unlocked(&self) -> impl Iterator<Item = &Held> {
        // SAFETY: as in `unlocked`.
        self.shards.iter().flat_map(|shard| unsafe { &*shard.data_ptr() }.iter())
    }
}

/// The engine's side: every job, including changes not yet durable.
pub(crate) struct JobTable {
    shared: Arc<SharedJobs>,
    /// Jobs changed since the last publish, each with its newest version
    /// (`None`: removed).
    unpublished: JobIdMap<Option<Arc<Job>>>,
    /// The shared side was handed to readers: every change waits for
    /// [`JobTable::publish`] from then on, for good.
    handed_out: bool,
}

impl std::fmt::Debug for JobTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobTable").field("unpublished", &self.unpublished.len()).finish_non_exhaustive()
    }
}

impl Default for JobTable {
    fn default() -> Self {
        JobTable { shared: Arc::new(SharedJobs::new()), unpublished: JobIdMap::default(), handed_out: false }
    }
}

impl JobTable {
    /// The readers' side. From the first call on, changes wait for
    /// [`JobTable::publish`].
    pub fn shared(&mut self) -> Arc<SharedJobs> {
        self.handed_out = true;
        self.shared.clone()
    }

    /// The shards to change in place, while no reader can see them.
    fn alone(shared: &mut Arc<SharedJobs>, handed_out: bool) -> Option<&mut SharedJobs> {
        if handed_out { None } else { Arc::get_mut(shared) }
    }

    pub fn get(&self, id: &JobId) -> Option<&Job> {
        match self.unpublished.get(id) {
            Some(newest) => newest.as_deref(),
            None => self.shared.unlocked(*id).map(Held::job),
        }
    }

    /// A new reference to a job.
    pub fn handle(&self, id: &JobId) -> Option<Arc<Job>> {
        match self.unpublished.get(id) {
            Some(newest) => newest.clone(),
            None => self.shared.unlocked(*id).map(Held::handle),
        }
    }

    pub fn contains_key(&self, id: &JobId) -> bool {
        self.get(id).is_some()
    }

    /// Adds a job or replaces its version.
    pub fn insert(&mut self, job: Arc<Job>) {
        let id = job.id;
        match Self::alone(&mut self.shared, self.handed_out) {
            Some(alone) => {
                let listed = DeadLetterKey::of(&job).map(|key| (key, job.clone()));
                let shard = alone.shards[shard_of(id)].get_mut();
                let old = SharedJobs::put(shard, &alone.hasher, job);
                relist(alone.dead_letter.get_mut(), old.as_deref(), listed);
            }
            None => {
                self.unpublished.insert(id, Some(job));
            }
        }
    }

    /// Stores the jobs of a snapshot being loaded, all at once: each shard
    /// is filled in the order of the places its jobs hash to, front to back.
    /// One by one, in id order, every job took a cache miss or two at a
    /// random place of a table of tens of megabytes (two thirds of the
    /// indexing thread's time while loading); in order, the memory a shard
    /// is written to moves forward, as the processor fetches ahead best.
    /// Shards are filled on two threads when the table is not yet shared.
    ///
    /// The jobs' ids must be distinct, and none may be held yet.
    pub fn store_loaded(&mut self, loaded: LoadedJobs) {
        let Some(alone) = Self::alone(&mut self.shared, self.handed_out) else {
            loaded.by_shard.into_iter().flatten().for_each(|job| self.insert(job));
            return;
        };
        let (hasher, grown_to) = (&alone.hasher, &alone.grown_to);
        let mut work: Vec<(usize, &mut JobSet, Vec<Arc<Job>>)> = alone
            .shards
            .iter_mut()
            .map(RwLock::get_mut)
            .zip(loaded.by_shard)
            .enumerate()
            .map(|(index, (shard, jobs))| (index, shard, jobs))
            .collect();
        let (first, second) = work.split_at_mut(SHARDS / 2);
        let fill = |part: &mut [(usize, &mut JobSet, Vec<Arc<Job>>)]| {
            part.iter_mut().for_each(|(index, shard, jobs)| {
                fill_in_order(shard, hasher, *index, &grown_to[*index], std::mem::take(jobs))
            })
        };
        // The second half goes to a thread of its own when one can be started.
        let second = parking_lot::Mutex::new(second);
        std::thread::scope(|scope| {
            let other = std::thread::Builder::new()
                .name("svc-snapshot-store".into())
                .spawn_scoped(scope, || fill(&mut second.lock()));
            fill(first);
            if let Ok(other) = other {
                other.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            }
            // Nothing left in it unless no thread could be started.
            fill(&mut second.lock());
        });
        let dead_letter = alone.dead_letter.get_mut();
        loaded.discarded.into_iter().for_each(|listed| relist(dead_letter, None, Some(listed)));
    }

    /// Removes a job and hands back its newest version.
    pub fn remove(&mut self, id: &JobId) -> Option<Arc<Job>> {
        if let Some(alone) = Self::alone(&mut self.shared, self.handed_out) {
            let shard = alone.shards[shard_of(*id)].get_mut();
            let old = SharedJobs::take(shard, &alone.hasher, *id);
            relist(alone.dead_letter.get_mut(), old.as_deref(), None);
            return old;
        }
        use std::collections::hash_map::Entry;
        match self.unpublished.entry(*id) {
            Entry::Occupied(mut newest) => newest.insert(None),
            Entry::Vacant(slot) => {
                let old = self.shared.unlocked(*id).map(Held::handle);
                if old.is_some() {
                    slot.insert(None);
                }
                old
            }
        }
    }

    /// Every job, newest versions, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &Job> {
        self.durable().map(Held::job).chain(self.unpublished.values().flatten().map(Arc::as_ref))
    }

    /// The jobs in the shards that no unpublished change replaces.
    fn durable(&self) -> impl Iterator<Item = &Held> {
        let unpublished = &self.unpublished;
        self.shared
            .all_unlocked()
            .filter(move |held| unpublished.is_empty() || !unpublished.contains_key(&held.job().id))
    }

    /// A handle of every job, in no particular order: what an image holds.
    /// Each clone writes its job's reference count, a cache miss at a random
    /// place for every job (most of a second at 5 M jobs, while the engine
    /// thread waits); touching the jobs a few handles ahead keeps several of
    /// those misses in flight at once.
    pub fn handles(&self) -> Vec<Arc<Job>> {
        const AHEAD: usize = 16;
        let mut handles = Vec::with_capacity(self.len_hint());
        let mut window: std::collections::VecDeque<&Held> = std::collections::VecDeque::with_capacity(AHEAD);
        for held in self.durable() {
            prefetch(held.job());
            if window.len() == AHEAD {
                handles.extend(window.pop_front().map(Held::handle));
            }
            window.push_back(held);
        }
        handles.extend(window.into_iter().map(Held::handle));
        handles.extend(self.unpublished.values().flatten().cloned());
        handles
    }

    /// About how many jobs there are (what the shards hold).
    #[allow(unsafe_code)]
    fn len_hint(&self) -> usize {
        // SAFETY: as in `SharedJobs::unlocked`.
        self.shared.shards.iter().map(|shard| unsafe { &*shard.data_ptr() }.len()).sum()
    }

    /// Moves the changes since the last publish into the shards, where
    /// readers see them. A very large turn's changes are shared with a
    /// second thread, each taking half the shards.
    pub fn publish(&mut self) {
        /// Below this many changes a second thread costs more than it saves.
        const PARALLEL_CHANGES_MIN: usize = 65_536;
        if self.unpublished.is_empty() {
            return;
        }
        // A small overlay keeps its capacity for the next turn; a large one
        // is handed over whole, as draining it would scan every bucket each
        // turn, and replaced by one sized for as many changes, so that a
        // run of large turns does not grow it afresh each time.
        let changes: Vec<JobChange> = if self.unpublished.capacity() <= 1024 {
            self.unpublished.drain().collect()
        } else {
            let sized = JobIdMap::with_capacity_and_hasher(self.unpublished.len(), Default::default());
            std::mem::replace(&mut self.unpublished, sized).into_iter().collect()
        };
        let count = changes.len();
        let mut by_shard: Vec<Vec<JobChange>> = (0..SHARDS).map(|_| Vec::new()).collect();
        for (id, job) in changes {
            by_shard[shard_of(id)].push((id, job));
        }
        let shared = &*self.shared;
        let mut first: Vec<(usize, Vec<JobChange>)> = by_shard.into_iter().enumerate().collect();
        let publish = |half: &mut Vec<(usize, Vec<JobChange>)>| {
            half.drain(..).for_each(|(shard, changes)| Self::publish_shard(shared, shard, changes));
        };
        if count < PARALLEL_CHANGES_MIN {
            publish(&mut first);
            return;
        }
        let mut second = first.split_off(SHARDS / 2);
        let helped = std::thread::scope(|scope| {
            let second = &mut second;
            let helper =
                std::thread::Builder::new().name("svc-publish".into()).spawn_scoped(scope, move || publish(second));
            publish(&mut first);
            helper.is_ok()
        });
        if !helped {
            // No second thread: this one publishes the other half too.
            publish(&mut second);
        }
    }

    fn publish_shard(shared: &SharedJobs, shard: usize, changes: Vec<JobChange>) {
        if changes.is_empty() {
            return;
        }
        let hasher = &shared.hasher;
        let mut set = shared.shards[shard].write();
        reserve_staggered(&mut set, shard, changes.len(), &shared.grown_to[shard]);
        for (id, job) in changes {
            let listed = job.as_ref().and_then(|job| DeadLetterKey::of(job).map(|key| (key, job.clone())));
            let old = match job {
                Some(job) => SharedJobs::put(&mut set, hasher, job),
                None => SharedJobs::take(&mut set, hasher, id),
            };
            // Most changes touch no discarded job: the listing's lock is
            // taken only for those that do.
            if listed.is_some() || old.as_deref().is_some_and(|old| DeadLetterKey::of(old).is_some()) {
                relist(&mut shared.dead_letter.write(), old.as_deref(), listed);
            }
        }
    }
}

/// Below this capacity a shard grows only when full: its rehash is short.
const STAGGERED_GROWTH_CAPACITY_MIN: usize = 4096;

/// Makes room in shard `shard` for `additional` more jobs. Jobs spread
/// evenly over the shards, so left to themselves all of them would double
/// within a few thousand jobs of each other, each rehash moving every slot
/// the shard holds: with 7.3 M jobs held (when a rehash still read each
/// job's id from the job's own allocation), single enqueues stalled for
/// several tenths of a second (p99 12 ms, the slowest 34 ms). Instead,
/// each shard doubles once it is past its own share of its capacity, from
/// three quarters for the first shard to all of it for the last, so that
/// the rehashes of one doubling are spread over the last quarter of the
/// table's growth. Held jobs stay below three
/// quarters of the capacity at 10 M jobs, so no table is larger there.
///
/// The share is of the capacity the shard had when it last grew
/// (`grown_to`, kept up to date here): its current capacity leaves out the
/// slots of removed jobs, and measured against that, a shard whose jobs
/// come and go doubled at a constant size where the table by itself only
/// rehashes in place.
///
/// A shard filled from a snapshot is sized by the same rule, so that the
/// first writes after a restart do not set off at once the doublings of
/// every shard past its share.
fn reserve_staggered(set: &mut JobSet, shard: usize, additional: usize, grown_to: &AtomicUsize) {
    let rehash = Held::placed;
    let mut full = grown_to.load(Ordering::Relaxed).max(set.capacity());
    let wanted = set.len() + additional;
    if wanted > full {
        set.reserve(additional, rehash);
        full = full.max(set.capacity());
    }
    let share = full / 4 * 3 + full / 4 * shard / SHARDS;
    if full >= STAGGERED_GROWTH_CAPACITY_MIN && wanted > share && wanted <= full {
        // Room for one more than it holds when full: the next size up.
        set.reserve(full + 1 - set.len(), rehash);
    }
    grown_to.store(full.max(set.capacity()), Ordering::Relaxed);
}

/// The part of an id's hash a shard's slot keeps.
fn hash_of(hasher: &IdHashState, id: JobId) -> u32 {
    (hasher.hash_one(id) >> 32) as u32
}

/// The shard a job lives in: the low bits of a UUIDv7 are random, so they
/// spread jobs evenly.
pub(crate) fn shard_of(id: JobId) -> usize {
    (id.0 as usize) % SHARDS
}

/// The jobs of a snapshot being loaded, gathered by shard for
/// [`JobTable::store_loaded`].
pub(crate) struct LoadedJobs {
    by_shard: Vec<Vec<Arc<Job>>>,
    /// The discarded ones, for the dead letter listing.
    discarded: Vec<(DeadLetterKey, Arc<Job>)>,
}

impl LoadedJobs {
    /// Room for about `jobs` jobs.
    pub fn new(jobs: usize) -> LoadedJobs {
        let per_shard = jobs.div_ceil(SHARDS) + jobs.div_ceil(SHARDS) / 8;
        LoadedJobs { by_shard: (0..SHARDS).map(|_| Vec::with_capacity(per_shard)).collect(), discarded: Vec::new() }
    }

    pub fn push(&mut self, job: Arc<Job>) {
        if let Some(key) = DeadLetterKey::of(&job) {
            self.discarded.push((key, job.clone()));
        }
        self.by_shard[shard_of(job.id)].push(job);
    }
}

/// Puts `jobs` (new ids, each once) into `shard` in the order of the
/// buckets they hash to, so that the table's memory is written front to
/// back. The order only makes it faster: a bucket taken makes a job go to
/// the next free one, as any insert does.
fn fill_in_order(shard: &mut JobSet, hasher: &IdHashState, index: usize, grown_to: &AtomicUsize, jobs: Vec<Arc<Job>>) {
    debug_assert!(jobs.iter().all(|job| {
        let hash = hash_of(hasher, job.id);
        shard.find(Held::table_hash(hash), |held| held.is(hash, job.id)).is_none()
    }));
    reserve_staggered(shard, index, jobs.len(), grown_to);
    // A table of 2^k buckets holds 7/8 of them at most, and a job's first
    // bucket is its hash's low k bits.
    let mask = (shard.capacity() * 8 / 7).next_power_of_two() as u64 - 1;
    let mut keyed: Vec<Held> = jobs.into_iter().map(|job| Held::new(hash_of(hasher, job.id), job)).collect();
    keyed.sort_unstable_by_key(|held| held.placed() & mask);
    for held in keyed {
        shard.insert_unique(held.placed(), held, Held::placed);
    }
}

/// Keeps the dead letter listing in step with one change: `old` is the
/// version replaced or removed, `listed` the new version if it belongs in
/// the listing.
fn relist(
    listing: &mut BTreeMap<DeadLetterKey, Arc<Job>>,
    old: Option<&Job>,
    listed: Option<(DeadLetterKey, Arc<Job>)>,
) {
    if let Some(key) = old.and_then(DeadLetterKey::of) {
        listing.remove(&key);
    }
    if let Some((key, job)) = listed {
        listing.insert(key, job);
    }
}

/// Asks the processor to fetch the cache line at `at` (a hint: it reads
/// nothing and cannot fault).
#[allow(unsafe_code)]
fn prefetch<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch instruction has no effect a program can observe.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{JobDefaults, JobState, parse_enqueue_body};

    fn job(n: u128, state: JobState) -> Arc<Job> {
        let new_job = parse_enqueue_body(br#"{"type":"t","args":[]}"#, &JobDefaults::default()).unwrap();
        let mut job = Job::accept(new_job, JobId(n), state, 1_000, None, None);
        if state == JobState::Discarded {
            job.run_mut().discarded_at = Some(2_000 + n as i64);
        }
        Arc::new(job)
    }

    fn find<'s>(set: &'s JobSet, hasher: &IdHashState, id: JobId) -> Option<&'s Job> {
        let hash = hash_of(hasher, id);
        set.find(Held::table_hash(hash), |held| held.is(hash, id)).map(Held::job)
    }

    fn listed(shared: &SharedJobs) -> Vec<JobId> {
        shared.dead_letter.read().values().map(|job| job.id).collect()
    }

    #[test]
    fn readers_see_a_change_only_once_it_is_published() {
        let mut table = JobTable::default();
        table.insert(job(1, JobState::Available));
        let shared = table.shared();
        assert!(shared.job(JobId(1)).is_some(), "loaded before any reader: there at once");

        table.insert(job(2, JobState::Available));
        table.insert(job(1, JobState::Active));
        assert_eq!(table.get(&JobId(1)).unwrap().state, JobState::Active);
        assert!(table.contains_key(&JobId(2)));
        assert_eq!(shared.job(JobId(1)).unwrap().state, JobState::Available);
        assert!(shared.job(JobId(2)).is_none());
        let mut ids: Vec<_> = table.values().map(|job| (job.id, job.state)).collect();
        ids.sort_by_key(|(id, _)| *id);
        assert_eq!(ids, [(JobId(1), JobState::Active), (JobId(2), JobState::Available)]);

        table.publish();
        assert_eq!(shared.job(JobId(1)).unwrap().state, JobState::Active);
        assert!(shared.job(JobId(2)).is_some());
    }

    #[test]
    fn once_handed_to_readers_changes_wait_even_when_no_reader_is_left() {
        let mut table = JobTable::default();
        table.insert(job(1, JobState::Available));
        let shared = table.shared();
        table.insert(job(1, JobState::Active));
        drop(shared);
        table.insert(job(1, JobState::Completed));
        assert_eq!(table.get(&JobId(1)).unwrap().state, JobState::Completed);
        assert_eq!(table.remove(&JobId(1)).unwrap().state, JobState::Completed);
        assert!(table.get(&JobId(1)).is_none());
        table.publish();
        assert!(table.get(&JobId(1)).is_none() && table.values().count() == 0);
    }

    #[test]
    fn a_removal_waits_for_publishing_too_and_hands_back_the_newest_version() {
        let mut table = JobTable::default();
        table.insert(job(1, JobState::Available));
        let shared = table.shared();
        table.insert(job(1, JobState::Active));
        assert_eq!(table.remove(&JobId(1)).unwrap().state, JobState::Active);
        assert!(table.get(&JobId(1)).is_none());
        assert_eq!(table.values().count(), 0);
        assert!(shared.job(JobId(1)).is_some());
        assert!(table.remove(&JobId(1)).is_none());
        // A job added and removed in one turn never reaches readers.
        table.insert(job(3, JobState::Available));
        assert!(table.remove(&JobId(3)).is_some());
        table.publish();
        assert!(shared.job(JobId(1)).is_none() && shared.job(JobId(3)).is_none());
    }

    #[test]
    fn the_dead_letter_listing_follows_both_ways_of_changing() {
        let mut table = JobTable::default();
        table.insert(job(1, JobState::Discarded));
        table.insert(job(2, JobState::Discarded));
        table.insert(job(3, JobState::Completed));
        let shared = table.shared();
        assert_eq!(listed(&shared), [JobId(2), JobId(1)], "newest first");

        table.remove(&JobId(2));
        table.insert(job(4, JobState::Discarded));
        assert_eq!(listed(&shared), [JobId(2), JobId(1)], "unchanged until published");
        table.publish();
        assert_eq!(listed(&shared), [JobId(4), JobId(1)]);
    }

    #[test]
    fn a_turn_too_big_for_one_thread_is_published_whole() {
        let mut table = JobTable::default();
        let shared = table.shared();
        let count = 70_000;
        (1..=count).for_each(|n| table.insert(job(n, JobState::Available)));
        assert!(shared.job(JobId(count)).is_none());
        table.publish();
        assert!((1..=count).all(|n| shared.job(JobId(n)).is_some()));
        assert_eq!(table.values().count(), count as usize);
    }

    #[test]
    fn a_slot_holds_one_reference_to_its_job_until_it_gives_it_back() {
        let hasher = IdHashState::default();
        let mut set = JobSet::new();
        let first = job(1, JobState::Available);
        assert!(SharedJobs::put(&mut set, &hasher, first.clone()).is_none());
        assert_eq!(Arc::strong_count(&first), 2);
        let held = set.iter().next().expect("one slot");
        assert!(std::ptr::eq(held.job(), Arc::as_ptr(&first)));
        let handle = held.handle();
        assert_eq!(Arc::strong_count(&first), 3);
        drop(handle);

        let second = job(1, JobState::Active);
        let replaced = SharedJobs::put(&mut set, &hasher, second.clone()).expect("the first version");
        assert!(Arc::ptr_eq(&replaced, &first));
        drop(replaced);
        assert_eq!((Arc::strong_count(&first), Arc::strong_count(&second)), (1, 2));
        assert_eq!(find(&set, &hasher, JobId(1)).map(|job| job.state), Some(JobState::Active));

        let taken = SharedJobs::take(&mut set, &hasher, JobId(1)).expect("held");
        assert!(Arc::ptr_eq(&taken, &second) && set.is_empty());
        drop(taken);
        assert_eq!(Arc::strong_count(&second), 1);

        // A table dropped, or grown, keeps the counts right.
        (2..=2_000).for_each(|n| drop(SharedJobs::put(&mut set, &hasher, job(n, JobState::Available))));
        SharedJobs::put(&mut set, &hasher, second.clone());
        assert_eq!(Arc::strong_count(&second), 2);
        drop(set);
        assert_eq!(Arc::strong_count(&second), 1);
    }

    #[test]
    fn shards_double_one_after_another_from_three_quarters_of_their_capacity() {
        let hasher = IdHashState::default();
        let one = job(1, JobState::Available);
        let with_id = |n: u128| {
            let mut copy = (*one).clone();
            copy.id = JobId(n);
            Arc::new(copy)
        };
        let filled_to = |count: usize| {
            let mut set = JobSet::with_capacity(STAGGERED_GROWTH_CAPACITY_MIN);
            for n in 0..count {
                SharedJobs::put(&mut set, &hasher, with_id(n as u128 + 1));
            }
            set
        };
        let capacity = filled_to(0).capacity();
        let doubled = JobSet::with_capacity(capacity + 1).capacity();
        let share = |shard: usize| capacity / 4 * 3 + capacity / 4 * shard / SHARDS;
        for shard in [0, SHARDS / 2, SHARDS - 1] {
            // One short of the share, and at it: the next job takes it past.
            for (held, doubles) in [(share(shard) - 1, false), (share(shard), true)] {
                let mut set = filled_to(held);
                reserve_staggered(&mut set, shard, 1, &AtomicUsize::new(0));
                let expected = if doubles { doubled } else { capacity };
                assert_eq!(set.capacity(), expected, "shard {shard} holding {held} of {capacity}");
                assert_eq!(set.len(), held, "growing keeps every job");
            }
        }
        // A small shard grows only when full.
        let mut small = JobSet::with_capacity(64);
        let small_capacity = small.capacity();
        reserve_staggered(&mut small, 0, small_capacity, &AtomicUsize::new(0));
        assert_eq!(small.capacity(), small_capacity);

        // Jobs that come and go leave removed slots, which the table's own
        // capacity leaves out. A shard holding a constant 45 % of its
        // capacity, which the table itself only ever rehashes in place, does
        // not grow however long that goes on (measured against the capacity
        // less the removed slots, it doubled).
        let grown_to = AtomicUsize::new(0);
        let held = capacity * 45 / 100;
        let mut set = filled_to(held);
        for n in 0..50 * capacity as u128 {
            SharedJobs::take(&mut set, &hasher, JobId(n + 1));
            reserve_staggered(&mut set, 0, 1, &grown_to);
            SharedJobs::put(&mut set, &hasher, with_id(n + 1 + held as u128));
            assert!(set.capacity() <= capacity, "grew to {} at a constant {held} jobs", set.capacity());
        }
        assert_eq!(set.len(), held);
    }

    #[test]
    fn a_loaded_shard_is_sized_as_its_growth_would_have_left_it() {
        let hasher = IdHashState::default();
        let jobs = || (1..=7_000).map(|n| job(n, JobState::Available)).collect::<Vec<_>>();
        let plain = JobSet::with_capacity(7_000).capacity();
        assert!(7_000 > plain / 4 * 3, "past the first shard's share of the plain size");
        for (shard, doubled) in [(0, true), (SHARDS - 1, false)] {
            let mut set = JobSet::new();
            fill_in_order(&mut set, &hasher, shard, &AtomicUsize::new(0), jobs());
            assert_eq!(set.capacity() > plain, doubled, "shard {shard}");
            assert_eq!(set.len(), 7_000);
            assert!((1..=7_000).all(|n| find(&set, &hasher, JobId(n)).is_some()));
        }
    }
}
