//! Acks on PostgreSQL, merged (docs/postgres.md, "Merged statements"):
//! the acks a node has waiting run together, as one statement, one
//! transaction or one of each, whatever their number.
//!
//! An ack of a job this node claimed, whose row is still exactly as the
//! claim left it (no heartbeat, progress or other change since), is first
//! tried with one statement that deletes the row on that condition and
//! writes the history row and event of the completion computed here from
//! the claimed job ([`ClaimedJobs`]). The acks it does not complete take
//! the checked transaction below.
//!
//! There, the jobs are locked in id order (so concurrent batches cannot deadlock),
//! each ack is checked and applied in Rust with the same transition as the
//! local engine, in the order the acks came, and the completed jobs move to
//! the history with one `DELETE` and one `INSERT`, their events with one
//! more. An ack refused (not found, not active, another worker's) refuses
//! that ack alone. A batch the database rolls back to break a deadlock is
//! run again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio_postgres::types::ToSql;

use super::events::{EventRows, insert_events};
use super::jobs::{CONTENTION_TRIES, PgJobs, database, decode, encode, finished_at, generic_plans, lock_in_flight};
use super::sql::Prepared;
use crate::clock::Millis;
use crate::engine::{EngineError, EventKind, Unavailable};
use crate::job::transition::{self, NotHeld};
use crate::job::{Job, JobId};

/// One ack waiting to be merged.
pub(super) struct PendingAck {
    pub now: Millis,
    pub id: JobId,
    pub result: Option<String>,
    pub worker_id: Option<String>,
}

impl PgJobs {
    /// Runs waiting acks: those of remembered claims with one statement
    /// (`ack_claimed`), the rest as one checked transaction; answers each
    /// ack's outcome, in order. A transaction the database rolled back to
    /// break a deadlock changed nothing and runs again, up to
    /// [`CONTENTION_TRIES`] times, so that the acks merged with the one
    /// caught in it are not refused.
    pub(super) async fn ack_batch(
        &self,
        acks: Vec<PendingAck>,
    ) -> Result<Vec<Result<Arc<Job>, EngineError>>, EngineError> {
        let contention = EngineError::Unavailable { reason: Unavailable::Contention };
        // Rolled back to break a deadlock, the statement changed nothing:
        // its acks take the checked transaction, which runs again if need be.
        let mut outcomes = match self.ack_claimed(&acks).await {
            Err(error) if error == contention => acks.iter().map(|_| None).collect(),
            outcome => outcome?,
        };
        let rest: Vec<PendingAck> =
            acks.into_iter().zip(&outcomes).filter(|(_, outcome)| outcome.is_none()).map(|(ack, _)| ack).collect();
        if rest.is_empty() {
            return Ok(outcomes.into_iter().flatten().collect());
        }
        let mut tries = 1;
        let checked = loop {
            match self.try_ack_batch(&rest).await {
                Err(error) if error == contention && tries < CONTENTION_TRIES => tries += 1,
                outcome => break outcome,
            }
        };
        // The acks completed by the statement are answered as completed
        // whatever became of the checked transaction after it.
        let mut checked = match checked {
            Ok(checked) => checked,
            Err(error) => rest.iter().map(|_| Err(error.clone())).collect(),
        }
        .into_iter();
        for outcome in outcomes.iter_mut().filter(|outcome| outcome.is_none()) {
            *outcome = checked.next();
        }
        Ok(outcomes.into_iter().flatten().collect())
    }

    /// Completes, with one statement, the acks of jobs this node claimed
    /// whose rows are still as the claim left them (and that belong to no
    /// workflow and hold back no cron run: those take the checked
    /// transaction). Answers the outcome of each ack it completed, `None`
    /// for the others.
    async fn ack_claimed(
        &self,
        acks: &[PendingAck],
    ) -> Result<Vec<Option<Result<Arc<Job>, EngineError>>>, EngineError> {
        let mut outcomes: Vec<Option<Result<Arc<Job>, EngineError>>> = acks.iter().map(|_| None).collect();
        let mut candidates: Vec<(usize, Job, i64)> = Vec::new();
        for (index, ack) in acks.iter().enumerate() {
            let Some((claimed, token)) = self.claimed.take(ack.id) else { continue };
            if claimed.workflow().is_some() || transition::check_held(&claimed, ack.worker_id.as_deref()).is_err() {
                continue;
            }
            let mut job = Arc::unwrap_or_clone(claimed);
            transition::complete(&mut job, ack.now, ack.result.clone());
            candidates.push((index, job, token));
        }
        if candidates.is_empty() {
            return Ok(outcomes);
        }
        // Sorted by id, so that the rows are locked in the order every
        // transaction locks jobs in when the plan follows the array (a
        // deadlock otherwise rolls the statement back, and its acks take
        // the checked transaction).
        candidates.sort_unstable_by_key(|(_, job, _)| job.id.to_string());
        let ids: Vec<String> = candidates.iter().map(|(_, job, _)| job.id.to_string()).collect();
        let tokens: Vec<i64> = candidates.iter().map(|(_, _, token)| *token).collect();
        let queues: Vec<&str> = candidates.iter().map(|(_, job, _)| job.queue.as_str()).collect();
        let types: Vec<&str> = candidates.iter().map(|(_, job, _)| job.payload.job_type()).collect();
        let times: Vec<Millis> = candidates.iter().map(|(_, job, _)| finished_at(job)).collect();
        let bodies: Vec<Vec<u8>> = candidates.iter().map(|(_, job, _)| encode(job)).collect();
        let events: Vec<_> = candidates
            .iter()
            .map(|(_, job, _)| (self.fresh_id(finished_at(job)), finished_at(job), EventKind::Completed, Some(job)))
            .collect();
        let event_ids: Vec<String> = events.iter().map(|(id, ..)| id.to_string()).collect();
        let event_rows = EventRows::of(&events);
        let mut params: Vec<&(dyn ToSql + Sync)> = event_rows.params().to_vec();
        params.extend([&ids as &(dyn ToSql + Sync), &tokens, &queues, &types, &times, &bodies, &event_ids]);
        let client = self.client().await?;
        let rows = client
            .rows(
                concat!(
                    "WITH gone AS (DELETE FROM svc_jobs j USING unnest($8::text[], $9::int8[]) AS c(id, claim) \
                       WHERE j.id = c.id::uuid AND j.claim = c.claim AND j.claimed_ms IS NOT NULL \
                         AND j.waiter IS NULL RETURNING j.id), \
                     moved AS (INSERT INTO svc_job_history (id, queue, type, state, finished_at, body) \
                       SELECT h.id::uuid, h.queue, h.type, 'completed', to_timestamp(h.at::float8 / 1000), h.body \
                       FROM unnest($8::text[], $10::text[], $11::text[], $12::int8[], $13::bytea[]) \
                         AS h(id, queue, type, at, body) \
                       WHERE h.id::uuid IN (SELECT id FROM gone)), \
                     recorded AS (",
                    insert_events!("$1", "$2", "$3", "$4", "$5", "$6", "$7"),
                    " WHERE t.id::uuid IN (SELECT e.event::uuid FROM unnest($8::text[], $14::text[]) AS e(job, event) \
                       WHERE e.job::uuid IN (SELECT id FROM gone))) \
                     SELECT id::text FROM gone"
                ),
                &params,
            )
            .await
            .map_err(database)?;
        let completed: HashSet<String> = rows.iter().map(|row| row.get(0)).collect();
        for (index, job, _) in candidates {
            if completed.contains(&job.id.to_string()) {
                outcomes[index] = Some(Ok(Arc::new(job)));
            }
        }
        Ok(outcomes)
    }

    async fn try_ack_batch(&self, acks: &[PendingAck]) -> Result<Vec<Result<Arc<Job>, EngineError>>, EngineError> {
        let mut ids: Vec<String> = acks.iter().map(|ack| ack.id.to_string()).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let (_, locked) = tokio::try_join!(generic_plans(&transaction), lock_in_flight(&transaction, &ids))?;
        let mut held: HashMap<JobId, Job> = HashMap::with_capacity(locked.len());
        for job in locked {
            held.insert(job.id, job);
        }
        // Jobs not in flight: finished (refused as not active) or unknown.
        let missing: Vec<String> =
            acks.iter().filter(|ack| !held.contains_key(&ack.id)).map(|ack| ack.id.to_string()).collect();
        let mut finished: HashMap<JobId, Job> = HashMap::new();
        if !missing.is_empty() {
            let rows = transaction
                .rows(
                    "SELECT id::text AS id_text, body FROM svc_job_history WHERE id = ANY($1::text[]::uuid[])",
                    &[&missing],
                )
                .await
                .map_err(database)?;
            for row in rows {
                let job = decode(row.get(0), row.get(1))?;
                finished.insert(job.id, job);
            }
        }
        let mut outcomes = Vec::with_capacity(acks.len());
        let mut completed: Vec<JobId> = Vec::new();
        for ack in acks {
            let outcome = match held.get_mut(&ack.id) {
                Some(job) => match transition::check_held(job, ack.worker_id.as_deref()) {
                    Ok(()) => {
                        transition::complete(job, ack.now, ack.result.clone());
                        completed.push(job.id);
                        Ok(Arc::new(job.clone()))
                    }
                    Err(refusal) => Err(EngineError::not_held(job, refusal)),
                },
                None => Err(match finished.get(&ack.id) {
                    Some(job) => EngineError::not_held(job, NotHeld::NotActive),
                    None => EngineError::NotFound { id: ack.id },
                }),
            };
            outcomes.push(outcome);
        }
        if completed.is_empty() {
            transaction.commit().await.map_err(database)?;
            return Ok(outcomes);
        }
        let done: Vec<&Job> = completed.iter().map(|id| &held[id]).collect();
        let events: Vec<_> = done
            .iter()
            .map(|job| {
                let at = finished_at(job);
                (self.fresh_id(at), at, EventKind::Completed, Some(*job))
            })
            .collect();
        // Sent together (pipelined), as one step of the transaction.
        tokio::try_join!(self.move_to_history(&transaction, &done), async {
            super::events::append(&transaction, &events).await.map_err(database)
        })?;
        transaction.commit().await.map_err(database)?;
        Ok(outcomes)
    }
}

/// Jobs this node claimed, at most this many remembered.
const CLAIMED_KEPT_MAX: usize = 16_384;
/// Jobs this node claimed, at most this many bytes of them remembered.
const CLAIMED_KEPT_BYTES_MAX: u64 = 32 << 20;

/// The jobs this node claimed last, each with its claim's token, for acks
/// that come back to this node (`ack_claimed`). Bounded by count and bytes;
/// the oldest claims are forgotten first. A job remembered is only a guess:
/// an ack completes it only if its row still holds that claim written as
/// columns (`claimed_ms` set, which every later write of the row clears),
/// so a claim changed since (a heartbeat, a failure, an expiry, another
/// node's claim) is never completed from here.
#[derive(Default)]
pub(super) struct ClaimedJobs {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    jobs: HashMap<JobId, (Arc<Job>, i64)>,
    /// Ids in the order they were claimed (some since taken or claimed again).
    order: VecDeque<JobId>,
    bytes: u64,
}

impl Kept {
    fn forget_oldest(&mut self) {
        if let Some(id) = self.order.pop_front()
            && let Some((job, _)) = self.jobs.remove(&id)
        {
            self.bytes -= job.held_bytes();
        }
    }
}

impl ClaimedJobs {
    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Remembers jobs just claimed, each with its claim's token.
    pub(super) fn keep(&self, claimed: impl Iterator<Item = (Arc<Job>, i64)>) {
        let mut kept = self.kept();
        for (job, token) in claimed {
            let size = job.held_bytes();
            kept.order.push_back(job.id);
            if let Some((old, _)) = kept.jobs.insert(job.id, (job, token)) {
                kept.bytes -= old.held_bytes();
            }
            kept.bytes += size;
            while kept.order.len() > CLAIMED_KEPT_MAX || kept.bytes > CLAIMED_KEPT_BYTES_MAX {
                kept.forget_oldest();
            }
        }
    }

    /// The job as claimed here, forgotten once taken.
    fn take(&self, id: JobId) -> Option<(Arc<Job>, i64)> {
        let mut kept = self.kept();
        let (job, token) = kept.jobs.remove(&id)?;
        kept.bytes -= job.held_bytes();
        Some((job, token))
    }
}
