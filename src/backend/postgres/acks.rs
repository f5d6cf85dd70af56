//! Acks on PostgreSQL, merged (docs/postgres.md, "Merged statements"):
//! the acks a node has waiting run as one transaction of five statements,
//! whatever their number.
//!
//! The jobs are locked in id order (so concurrent batches cannot deadlock),
//! each ack is checked and applied in Rust with the same transition as the
//! local engine, in the order the acks came, and the completed jobs move to
//! the history with one `DELETE` and one `INSERT`, their events with one
//! more. An ack refused (not found, not active, another worker's) refuses
//! that ack alone. A batch the database rolls back to break a deadlock is
//! run again.

use std::collections::HashMap;
use std::sync::Arc;

use super::jobs::{CONTENTION_TRIES, PgJobs, database, decode, finished_at, generic_plans, lock_in_flight};
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
    /// Runs waiting acks as one transaction; answers each ack's outcome, in
    /// order. A transaction the database rolled back to break a deadlock
    /// changed nothing and runs again, up to [`CONTENTION_TRIES`] times, so
    /// that the acks merged with the one caught in it are not refused.
    pub(super) async fn ack_batch(
        &self,
        acks: Vec<PendingAck>,
    ) -> Result<Vec<Result<Arc<Job>, EngineError>>, EngineError> {
        let contention = EngineError::Unavailable { reason: Unavailable::Contention };
        let mut tries = 1;
        loop {
            match self.try_ack_batch(&acks).await {
                Err(error) if error == contention && tries < CONTENTION_TRIES => tries += 1,
                outcome => return outcome,
            }
        }
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
