//! Acks on PostgreSQL, merged (docs/postgres.md, "Merged statements"):
//! the acks a node has waiting run as one transaction of five statements,
//! whatever their number.
//!
//! The jobs are locked in id order (so concurrent batches cannot deadlock),
//! each ack is checked and applied in Rust with the same transition as the
//! local engine, in the order the acks came, and the completed jobs move to
//! the history with one `DELETE` and one `INSERT`, their events with one
//! more. An ack refused (not found, not active, another worker's) refuses
//! that ack alone.

use std::collections::HashMap;
use std::sync::Arc;

use super::jobs::{PgJobs, database, decode, encode, finished_at};
use super::sql::Prepared;
use crate::clock::Millis;
use crate::engine::{EngineError, EventKind};
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
    /// Runs waiting acks as one transaction; answers each ack's outcome, in order.
    pub(super) async fn ack_batch(
        &self,
        acks: Vec<PendingAck>,
    ) -> Result<Vec<Result<Arc<Job>, EngineError>>, EngineError> {
        let mut ids: Vec<String> = acks.iter().map(|ack| ack.id.to_string()).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let rows = transaction
            .rows(
                "SELECT id::text AS id_text, body FROM svc_jobs WHERE id = ANY($1::text[]::uuid[]) \
                 ORDER BY id FOR UPDATE",
                &[&ids],
            )
            .await
            .map_err(database)?;
        let mut held: HashMap<JobId, Job> = HashMap::with_capacity(rows.len());
        for row in rows {
            let job = decode(row.get(0), row.get(1))?;
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
                        transition::complete(job, ack.now, ack.result);
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
        let ids: Vec<String> = done.iter().map(|job| job.id.to_string()).collect();
        let queues: Vec<&str> = done.iter().map(|job| job.queue.as_str()).collect();
        let types: Vec<&str> = done.iter().map(|job| job.payload.job_type()).collect();
        let states: Vec<&str> = done.iter().map(|job| job.state.as_str()).collect();
        let times: Vec<i64> = done.iter().map(|job| finished_at(job)).collect();
        let bodies: Vec<Vec<u8>> = done.iter().map(|job| encode(job)).collect();
        let events: Vec<_> =
            done.iter().map(|job| (self.fresh_id(job.run().completed_at.unwrap_or(job.created_at)), job)).collect();
        let events: Vec<_> = events
            .into_iter()
            .map(|(event_id, job)| (event_id, finished_at(job), EventKind::Completed, Some(*job)))
            .collect();
        // Sent together (pipelined), as one step of the transaction.
        tokio::try_join!(
            async {
                transaction
                    .run("DELETE FROM svc_jobs WHERE id = ANY($1::text[]::uuid[])", &[&ids])
                    .await
                    .map_err(database)
            },
            async {
                transaction
                    .run(
                        "INSERT INTO svc_job_history (id, queue, type, state, finished_at, body) \
                         SELECT t.id::uuid, t.queue, t.type, t.state, to_timestamp(t.at::float8 / 1000), t.body \
                         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::bytea[]) \
                           AS t(id, queue, type, state, at, body)",
                        &[&ids, &queues, &types, &states, &times, &bodies],
                    )
                    .await
                    .map_err(database)
            },
            async { super::events::append(&transaction, &events).await.map_err(database) },
        )?;
        transaction.commit().await.map_err(database)?;
        Ok(outcomes)
    }
}
