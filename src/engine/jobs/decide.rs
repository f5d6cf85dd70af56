//! Live decisions: check a command against the state and turn it into a
//! fully decided record. Nothing here changes the state; `State::apply` does.

use super::super::api::{ConflictReason, EngineError, FetchRequest, Unavailable};
use super::super::record::Logged;
use super::super::state::{QueueState, State};
use super::record::{Claim, FailOutcome, JobRecord};
use crate::clock::Millis;
use crate::job::{FailureReport, Job, JobId, JobState, NewJob, OnConflict, transition};
use crate::schedule::{ReadyKey, Taken};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// Randomness the decisions need (ids, jitter); injected so tests can fix it.
pub trait Entropy: Send {
    fn next_u128(&mut self) -> u128;
    /// Uniform in [0, 1).
    fn next_unit(&mut self) -> f64;
}

/// Entropy from the operating system's generator.
#[derive(Debug, Default)]
pub struct SystemEntropy;

impl Entropy for SystemEntropy {
    fn next_u128(&mut self) -> u128 {
        rand::random()
    }

    fn next_unit(&mut self) -> f64 {
        rand::random()
    }
}

/// What answers one enqueued item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnqueueSlot {
    /// The job this request stores.
    New(JobId),
    /// A job already held that a unique `ignore` policy answers with.
    Existing(JobId),
}

impl State {
    /// Decides an enqueue (one job or a batch, all or nothing): the record,
    /// if anything is stored, and for each item the job that answers it.
    pub fn decide_enqueue(
        &mut self,
        now: Millis,
        new_jobs: Vec<NewJob>,
        entropy: &mut dyn Entropy,
    ) -> Result<(Option<Logged>, Vec<EnqueueSlot>), EngineError> {
        if !self.has_room_for(new_jobs.len()) {
            return Err(EngineError::Unavailable { reason: Unavailable::Capacity });
        }
        let batch = new_jobs.len() > 1;
        let index_of = |position: usize| batch.then_some(position);
        let mut seen = crate::job::JobIdSet::with_capacity_and_hasher(new_jobs.len(), Default::default());
        let mut jobs: Vec<Arc<Job>> = Vec::with_capacity(new_jobs.len());
        let mut slots = Vec::with_capacity(new_jobs.len());
        let mut replaced = Vec::new();
        // Jobs this batch adds to each queue with backpressure, so far.
        let mut added: Vec<(String, u64)> = Vec::new();
        let bounded = self.bounded_queues() > 0;
        for (position, new_job) in new_jobs.into_iter().enumerate() {
            let queue = self.queue(&new_job.queue);
            if queue.is_some_and(|queue| queue.paused) {
                return Err(EngineError::QueuePaused { queue: new_job.queue.to_string(), index: index_of(position) });
            }
            let backpressure =
                if bounded { queue.and_then(|queue| Some((queue.depth(), queue.backpressure?))) } else { None };
            let job = self.admit(now, new_job, index_of(position), &mut seen, entropy, false)?;
            if let Some((on_conflict, holders)) = self.unique_holders(&job, now, &jobs, &replaced) {
                match on_conflict {
                    OnConflict::Reject => {
                        return Err(self.unique_conflict(&job, holders[0], &jobs, index_of(position)));
                    }
                    OnConflict::Ignore => {
                        slots.push(EnqueueSlot::Existing(holders[0]));
                        continue;
                    }
                    OnConflict::Replace => replaced.extend(holders),
                }
            }
            if let Some((depth, backpressure)) = backpressure {
                let queue: &str = &job.queue;
                let place = match added.iter().position(|(name, _)| name == queue) {
                    Some(place) => place,
                    None => {
                        added.push((queue.to_string(), 0));
                        added.len() - 1
                    }
                };
                let in_batch = &mut added[place].1;
                if depth + *in_batch >= backpressure.max_depth {
                    return Err(EngineError::QueueFull {
                        queue: job.queue.to_string(),
                        depth: depth + *in_batch,
                        bound: backpressure.max_depth,
                        index: index_of(position),
                    });
                }
                *in_batch += 1;
            }
            slots.push(EnqueueSlot::New(job.id));
            jobs.push(Arc::new(job));
        }
        let record = (!jobs.is_empty() || !replaced.is_empty())
            .then_some(Logged::new(now, JobRecord::Enqueue { jobs, replaced }));
        Ok((record, slots))
    }

    /// A new job as an enqueue item makes it, checked against the stored
    /// ids and the clock: its id (the client's, or a fresh one, added to
    /// `seen`), its times resolved, and its first state (`pending` when
    /// `staged` or asked for). `index` is its place in a batch, for errors.
    pub(crate) fn admit(
        &mut self,
        now: Millis,
        new_job: NewJob,
        index: Option<usize>,
        seen: &mut crate::job::JobIdSet,
        entropy: &mut dyn Entropy,
        staged: bool,
    ) -> Result<Job, EngineError> {
        if let Some(id) = new_job.id
            && (self.job(id).is_some() || !seen.insert(id))
        {
            return Err(EngineError::Duplicate { id, index });
        }
        transition::admit(new_job, now, staged, || {
            let id = self.fresh_id(now, entropy, seen);
            seen.insert(id);
            id
        })
        .map_err(|error| EngineError::Invalid { error, index })
    }

    /// The jobs a new job's unique policy conflicts with (docs/api.md,
    /// "Unique jobs"): held ones oldest first, then those of `batch` (earlier
    /// items of the same request), leaving out `replaced`; with what the
    /// policy says to do. `None` when there is no policy or no conflict.
    pub(crate) fn unique_holders(
        &self,
        job: &Job,
        now: Millis,
        batch: &[Arc<Job>],
        replaced: &[JobId],
    ) -> Option<(OnConflict, Vec<JobId>)> {
        let (policy, key) = job.unique()?;
        let stored = self.jobs_with_unique_key(&key).iter().filter_map(|id| self.job(*id));
        let in_batch = batch.iter().map(Arc::as_ref).filter(|earlier| earlier.unique().is_some_and(|(_, k)| k == key));
        let holders: Vec<JobId> = stored
            .chain(in_batch)
            .filter(|holder| !replaced.contains(&holder.id))
            .filter(|holder| policy.blocked_by(holder, now))
            .map(|holder| holder.id)
            .collect();
        (!holders.is_empty()).then_some((policy.on_conflict, holders))
    }

    /// The 409 for `job` meeting `existing`, held or one of `batch`.
    pub(crate) fn unique_conflict(
        &self,
        job: &Job,
        existing: JobId,
        batch: &[Arc<Job>],
        index: Option<usize>,
    ) -> EngineError {
        let existing_state = self
            .job(existing)
            .or_else(|| batch.iter().map(Arc::as_ref).find(|job| job.id == existing))
            .map_or(JobState::Available, |job| job.state);
        let key = job.unique().expect("a job with a unique policy").1;
        EngineError::UniqueConflict { existing, existing_state, key, index }
    }

    /// Activates a staged job (`POST /jobs/{id}/activate`).
    pub fn decide_activate(&self, now: Millis, id: JobId) -> Result<Logged, EngineError> {
        let job = self.job(id).ok_or(EngineError::NotFound { id })?;
        if job.state != JobState::Pending {
            return Err(EngineError::Conflict { id, current_state: job.state, reason: ConflictReason::NotPending });
        }
        if job.workflow().is_some() || self.crons.waiters.values().any(|waiting| *waiting == id) {
            return Err(EngineError::Conflict { id, current_state: job.state, reason: ConflictReason::Owned });
        }
        Ok(Logged::new(now, JobRecord::Activate { id }))
    }

    /// A generated id that no stored job and none of `taken` uses. The
    /// generator's ids increase past every id it has seen, so an id is looked
    /// up among the stored ones only when it is not above all of them, and
    /// the loop turns more than once, only after the generator ran out of
    /// milliseconds.
    pub(crate) fn fresh_id(&mut self, now: Millis, entropy: &mut dyn Entropy, taken: &crate::job::JobIdSet) -> JobId {
        loop {
            let id = self.ids.next(now, entropy.next_u128());
            let stored = id <= self.highest_stored_id
                && (self.job(id).is_some() || self.workflows.contains_key(&crate::job::WorkflowId(id)));
            if !stored && !taken.contains(&id) {
                return id;
            }
        }
    }

    /// Chooses jobs for a fetch without claiming them, with their ids in
    /// claim order; `None` when nothing qualifies.
    pub fn decide_fetch(&self, now: Millis, request: &FetchRequest) -> Option<(Logged, Vec<JobId>)> {
        let mut claims = Vec::new();
        let mut taken = HashMap::new();
        for (position, name) in request.queues.iter().enumerate() {
            // A queue named twice is taken once, at its first place.
            if request.queues[..position].contains(name) {
                continue;
            }
            let Some(queue) = self.queue(name).filter(|queue| !queue.paused) else {
                continue;
            };
            let wanted = request.count - claims.len();
            for id in self.pick_ready(queue, wanted, now, &mut taken) {
                let job = self.job(id).expect("every ready key names a stored job");
                let visibility = request.visibility_timeout_ms.unwrap_or(u64::from(job.visibility_timeout_ms));
                claims.push(Claim {
                    id,
                    visibility_deadline: now.saturating_add(visibility as i64),
                    execution_deadline: now.saturating_add(job.timeout_ms as i64),
                });
            }
            if claims.len() == request.count {
                break;
            }
        }
        let ids = claims.iter().map(|claim| claim.id).collect();
        (!claims.is_empty())
            .then(|| (Logged::new(now, JobRecord::Claim { worker_id: request.worker_id.clone(), claims }), ids))
    }

    /// Up to `wanted` available jobs of `queue` in fetch order, skipping the
    /// keys at their dispatch limit. `taken` counts this fetch's claims by
    /// key (a key may span queues). Only the first job of each key is looked
    /// at until that key yields one, so a key at its limit costs one look,
    /// however many jobs wait behind it.
    fn pick_ready<'a>(
        &'a self,
        queue: &'a QueueState,
        wanted: usize,
        now: Millis,
        taken: &mut HashMap<&'a str, Taken>,
    ) -> Vec<JobId> {
        if queue.limited.is_empty() {
            return queue.ready.iter().take(wanted).map(|key| key.id).collect();
        }
        let limit_of =
            |job: &ReadyKey| self.job(job.id).and_then(|job| job.dispatch_limit()).expect("limited jobs have a limit");
        let open = |job: &ReadyKey, key: &str, taken: &HashMap<&str, Taken>| {
            self.dispatch.allowance(key, limit_of(job), taken.get(key).copied().unwrap_or_default(), now) > 0
        };
        let mut plain = queue.ready.iter().peekable();
        let mut heads = queue.limited.heads().peekable();
        // The next job of each key already taken from, if it may go too.
        let mut next_of_taken: BTreeSet<(ReadyKey, &str)> = BTreeSet::new();
        let mut picked = Vec::new();
        while picked.len() < wanted {
            while let Some((job, key)) = heads.peek() {
                if open(job, key, taken) {
                    break;
                }
                heads.next();
            }
            let best_limited = match (heads.peek(), next_of_taken.first()) {
                (Some((head, key)), Some((next, next_key))) => {
                    Some(if *head < next { (**head, *key) } else { (*next, *next_key) })
                }
                (Some((head, key)), None) => Some((**head, *key)),
                (None, Some((next, next_key))) => Some((*next, *next_key)),
                (None, None) => None,
            };
            let (job, limited_key) = match (plain.peek(), best_limited) {
                (Some(plain_job), Some((job, key))) if job < **plain_job => (job, Some(key)),
                (Some(_), _) => (*plain.next().expect("peeked"), None),
                (None, Some((job, key))) => (job, Some(key)),
                (None, None) => break,
            };
            picked.push(job.id);
            let Some(key) = limited_key else { continue };
            if !next_of_taken.remove(&(job, key)) {
                heads.next();
            }
            taken.entry(key).or_default().add(limit_of(&job));
            if let Some(next) = queue.limited.next_after(key, &job)
                && open(&next, key, taken)
            {
                next_of_taken.insert((next, key));
            }
        }
        picked
    }

    /// When a parked fetch of `queues` may find work that a rate window
    /// holds back now: the earliest time such a window opens.
    pub fn dispatch_opening(&self, queues: &[String], now: Millis) -> Option<Millis> {
        let mut earliest: Option<Millis> = None;
        for queue in queues.iter().filter_map(|name| self.queue(name)).filter(|queue| !queue.paused) {
            for (head, key) in queue.limited.heads() {
                let Some(limit) = self.job(head.id).and_then(|job| job.dispatch_limit()) else { continue };
                if let Some(at) = self.dispatch.opens_at(key, limit, now) {
                    earliest = Some(earliest.map_or(at, |earliest| earliest.min(at)));
                }
            }
        }
        earliest
    }

    /// Finds the active job a worker reports on, checking the claim's owner.
    pub(in crate::engine) fn active_job(&self, id: JobId, worker_id: Option<&str>) -> Result<&Job, EngineError> {
        let job = self.job(id).ok_or(EngineError::NotFound { id })?;
        transition::check_held(job, worker_id).map_err(|refusal| EngineError::not_held(job, refusal))?;
        Ok(job)
    }

    pub fn decide_ack(
        &self,
        now: Millis,
        id: JobId,
        result: Option<String>,
        worker_id: Option<&str>,
    ) -> Result<Logged, EngineError> {
        self.active_job(id, worker_id)?;
        Ok(Logged::new(now, JobRecord::Ack { id, result }))
    }

    pub fn decide_fail(
        &self,
        now: Millis,
        id: JobId,
        report: FailureReport,
        requeue: bool,
        worker_id: Option<&str>,
        entropy: &mut dyn Entropy,
    ) -> Result<Logged, EngineError> {
        let job = self.active_job(id, worker_id)?;
        let outcome = if requeue { FailOutcome::Requeue } else { failure_outcome(job, &report, now, entropy) };
        Ok(Logged::new(now, JobRecord::Fail { id, report, outcome }))
    }

    /// `Ok(None)` when the job is already cancelled (cancel is idempotent).
    pub fn decide_cancel(&self, now: Millis, id: JobId) -> Result<Option<Logged>, EngineError> {
        let job = self.job(id).ok_or(EngineError::NotFound { id })?;
        match job.state {
            JobState::Cancelled => Ok(None),
            JobState::Completed | JobState::Discarded => {
                Err(EngineError::Conflict { id, current_state: job.state, reason: ConflictReason::InvalidState })
            }
            _ => Ok(Some(Logged::new(now, JobRecord::Cancel { id }))),
        }
    }

    /// Extends the claims a worker's heartbeat covers (docs/api.md, "Heartbeat"): the
    /// listed ids that are active and claimed by no worker or this one, or,
    /// with no list, every active job this worker holds; with how many
    /// (`None` when there is nothing to extend), and the listed ids it does
    /// not cover.
    pub fn decide_heartbeat(
        &self,
        now: Millis,
        worker_id: &str,
        listed: Option<&[JobId]>,
        visibility_ms: Option<u64>,
    ) -> (Option<(Logged, usize)>, Vec<JobId>) {
        let (mut ids, mut not_extended): (Vec<JobId>, Vec<JobId>) = match listed {
            Some(ids) => ids.iter().copied().partition(|id| self.heartbeat_covers(*id, worker_id)),
            None => (self.active_of_worker(worker_id), Vec::new()),
        };
        for list in [&mut ids, &mut not_extended] {
            list.sort();
            list.dedup();
        }
        let extensions: Vec<(JobId, Millis)> = ids
            .into_iter()
            .map(|id| {
                let job = self.job(id).expect("covered jobs are stored");
                let visibility = visibility_ms.unwrap_or_else(|| transition::claim_visibility_ms(job));
                (id, now.saturating_add(visibility as i64))
            })
            .collect();
        let extended = extensions.len();
        ((extended > 0).then_some((Logged::new(now, JobRecord::Heartbeat { extensions }), extended)), not_extended)
    }

    /// Whether a heartbeat of `worker_id` extends job `id`'s claim: it is
    /// active and claimed by no worker or this one.
    fn heartbeat_covers(&self, id: JobId, worker_id: &str) -> bool {
        self.job(id).is_some_and(|job| {
            job.state == JobState::Active && job.run().worker_id.as_deref().is_none_or(|owner| owner == worker_id)
        })
    }

    /// A job in the dead letter listing (state `discarded`), else not found.
    fn dead_letter_job(&self, id: JobId) -> Result<&Job, EngineError> {
        self.job(id).filter(|job| job.state == JobState::Discarded).ok_or(EngineError::NotInDeadLetter { id })
    }

    pub fn decide_dead_letter_retry(&self, now: Millis, id: JobId) -> Result<Logged, EngineError> {
        self.dead_letter_job(id)?;
        Ok(Logged::new(now, JobRecord::DeadLetterRetry { id }))
    }

    pub fn decide_dead_letter_delete(&self, now: Millis, id: JobId) -> Result<Logged, EngineError> {
        self.dead_letter_job(id)?;
        Ok(Logged::new(now, JobRecord::Delete { id }))
    }

    /// Records for everything due at `now`, at most `limit` jobs.
    pub fn decide_due(&self, now: Millis, limit: usize, entropy: &mut dyn Entropy) -> Vec<Logged> {
        let mut promote = Vec::new();
        let mut expire = Vec::new();
        let mut prune = Vec::new();
        let mut records = Vec::new();
        for (_, id) in self.timers.due(now).take(limit) {
            let job = self.job(id).expect("every timer names a stored job");
            let expired = job.expires_at().is_some_and(|at| at <= now);
            match job.state {
                JobState::Scheduled | JobState::Retryable | JobState::Available | JobState::Pending if expired => {
                    expire.push(id)
                }
                JobState::Scheduled | JobState::Retryable => promote.push(id),
                JobState::Active => records.push(claim_timeout(job, now, entropy)),
                state if state.is_terminal() => prune.push(id),
                _ => {}
            }
        }
        if !promote.is_empty() {
            records.push(Logged::new(now, JobRecord::Promote { ids: promote }));
        }
        if !expire.is_empty() {
            records.push(Logged::new(now, JobRecord::Expire { ids: expire }));
        }
        if !prune.is_empty() {
            records.push(Logged::new(now, JobRecord::Prune { ids: prune }));
        }
        if let Some(record) = self.decide_workflow_prune(now, limit) {
            records.push(record);
        }
        records
    }

    /// The oldest terminal jobs to prune (dead-lettered ones last) so that
    /// the rest fit the retention caps, at most `limit`; `None` when they fit.
    pub fn decide_capped_prune(&self, now: Millis, limit: usize) -> Option<Logged> {
        let retention = self.retention();
        let mut count = self.terminal.len();
        let mut bytes = self.terminal_bytes;
        let mut capped = Vec::new();
        for (_, _, id) in &self.terminal {
            if (count <= retention.max_terminal_jobs && bytes <= retention.max_terminal_bytes) || capped.len() >= limit
            {
                break;
            }
            count -= 1;
            bytes -= self.job(*id).map_or(0, |job| job.held_bytes());
            capped.push(*id);
        }
        (!capped.is_empty()).then_some(Logged::new(now, JobRecord::PruneCapped { ids: capped }))
    }
}

/// Which deadline of an active job ran out, and what follows (docs/api.md, "Visibility and execution timeouts").
fn claim_timeout(job: &Job, now: Millis, entropy: &mut dyn Entropy) -> Logged {
    let (kind, outcome) = crate::schedule::timeout_outcome(job, now, || entropy.next_unit());
    Logged::new(now, JobRecord::Timeout { id: job.id, kind, outcome })
}

/// The decision on a failed attempt (docs/api.md, "What a failure leads to").
pub fn failure_outcome(job: &Job, report: &FailureReport, now: Millis, entropy: &mut dyn Entropy) -> FailOutcome {
    crate::schedule::failure_outcome(job, report, now, || entropy.next_unit())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct FixedEntropy(u128);

    impl Entropy for FixedEntropy {
        fn next_u128(&mut self) -> u128 {
            self.0
        }
        fn next_unit(&mut self) -> f64 {
            0.5
        }
    }

    #[test]
    fn after_the_last_millisecond_a_fresh_id_is_checked_against_the_stored_ones() {
        let now = 1_800_000_000_000;
        let mut entropy = FixedEntropy(42);
        // The id a generator starting again at `now` makes first.
        let restart_id = crate::job::IdGenerator::default().next(now, 42);
        let mut state = State::new(crate::engine::Retention::default());
        let body = format!(r#"{{"type":"t","args":[],"id":"{restart_id}"}}"#);
        let job = crate::job::parse_enqueue_body(body.as_bytes(), &crate::job::JobDefaults::default()).unwrap();
        let record = state.decide_enqueue(now, vec![job], &mut entropy).unwrap().0.unwrap();
        state.apply(&record, &mut crate::engine::EventSink::disabled()).unwrap();
        // The generator has seen the last id there is, so it starts again at `now`.
        state.ids.observe(JobId::parse("ffffffff-ffff-7fff-bfff-ffffffffffff").unwrap());
        let fresh = state.fresh_id(now, &mut entropy, &Default::default());
        assert_ne!(fresh, restart_id, "the stored job's id is not handed out again");
        assert!(state.job(fresh).is_none());
    }
}
