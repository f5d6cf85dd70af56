//! The worker registry on PostgreSQL (docs/postgres.md, "Workers"): who
//! has been seen, on any node, and the signals operators gave them, in
//! `svc_workers`.
//!
//! A fetch or heartbeat naming a worker records the contact. A fetch reads
//! the worker's row first and writes it only when the worker is new, its
//! queues changed or its last contact is older than [`CONTACT_GRANULARITY_MS`],
//! so a busy worker's fetches stay reads. A signalled worker's fetches get
//! nothing; its heartbeats answer the signal. Workers idle for a day (no
//! contact, no active jobs) are forgotten by the leader, as on the local
//! engine.

use deadpool_postgres::GenericClient;

use super::jobs::{PgJobs, database};
use super::sql::Prepared;
use crate::backend::Page;
use crate::clock::Millis;
use crate::engine::{EngineError, EventKind, SignalledWorker, WorkerEntry, WorkerSignal, WorkerState};
use crate::job::{JobId, is_valid_worker_id};
use crate::limits::{WORKER_FORGET_MS, WORKERS_MAX};

/// How stale a worker's last contact may read before a fetch writes it
/// again: the registry's times are this coarse.
const CONTACT_GRANULARITY_MS: i64 = 1_000;

fn signal_of(text: Option<&str>) -> Option<WorkerSignal> {
    match text {
        Some("quiet") => Some(WorkerSignal::Quiet),
        Some("terminate") => Some(WorkerSignal::Terminate),
        _ => None,
    }
}

fn signal_text(signal: WorkerSignal) -> &'static str {
    match signal {
        WorkerSignal::Quiet => "quiet",
        WorkerSignal::Terminate => "terminate",
    }
}

/// A worker's entry with the jobs it holds. `COLLATE "default"`: the
/// workers' ids are `"C"`, which would win in the comparison and keep it
/// off `svc_jobs_worker`, an index in the default collation (equality is
/// the same in both).
const ENTRY: &str = "SELECT w.worker_id, w.signal, (extract(epoch FROM w.first_seen_at) * 1000)::int8, \
     (extract(epoch FROM w.last_seen_at) * 1000)::int8, (extract(epoch FROM w.last_heartbeat_at) * 1000)::int8, \
     w.queues, coalesce((SELECT array_agg(j.id::text ORDER BY j.id) FROM svc_jobs j \
       WHERE j.state = 'active' AND j.worker_id = w.worker_id COLLATE \"default\"), '{}') FROM svc_workers w";

fn entry(row: &tokio_postgres::Row) -> WorkerEntry {
    let active: Vec<String> = row.get(6);
    WorkerEntry {
        worker_id: row.get(0),
        state: WorkerState::of(signal_of(row.get(1))),
        first_seen_at: row.get(2),
        last_seen_at: row.get(3),
        last_heartbeat_at: row.get(4),
        queues: row.get(5),
        active_job_ids: active.iter().filter_map(|id| JobId::parse(id)).collect(),
    }
}

impl PgJobs {
    /// Records contact with a worker (`queues` from a fetch, or a
    /// heartbeat); answers the signal it holds.
    pub async fn note_worker(
        &self,
        now: Millis,
        worker_id: &str,
        queues: Option<&[String]>,
        heartbeat: bool,
    ) -> Result<Option<WorkerSignal>, EngineError> {
        let client = self.client().await?;
        if !heartbeat {
            let row = client
                .maybe_row(
                    "SELECT signal, (extract(epoch FROM last_seen_at) * 1000)::int8, queues FROM svc_workers \
                     WHERE worker_id = $1",
                    &[&worker_id],
                )
                .await
                .map_err(database)?;
            if let Some(row) = row {
                let (seen, known): (i64, Vec<String>) = (row.get(1), row.get(2));
                let same_queues = queues.is_none_or(|queues| queues == known.as_slice());
                if same_queues && now - seen < CONTACT_GRANULARITY_MS {
                    return Ok(signal_of(row.get(0)));
                }
            }
        }
        let queues: Option<Vec<String>> = queues.map(<[String]>::to_vec);
        let row = client
            .row(
                "INSERT INTO svc_workers AS w (worker_id, first_seen_at, last_seen_at, last_heartbeat_at, queues) \
                 VALUES ($1, to_timestamp($2::int8::float8 / 1000), to_timestamp($2::int8::float8 / 1000), \
                   CASE WHEN $3::bool THEN to_timestamp($2::int8::float8 / 1000) END, coalesce($4::text[], '{}')) \
                 ON CONFLICT (worker_id) DO UPDATE SET last_seen_at = excluded.last_seen_at, \
                   last_heartbeat_at = coalesce(excluded.last_heartbeat_at, w.last_heartbeat_at), \
                   queues = coalesce($4::text[], w.queues) \
                 RETURNING signal, xmax = 0",
                &[&worker_id, &now, &heartbeat, &queues],
            )
            .await
            .map_err(database)?;
        let (signal, inserted): (Option<&str>, bool) = (row.get(0), row.get(1));
        if inserted {
            // Past the most workers known, the idle ones seen longest ago
            // make room, as on the local engine: a worker holding active
            // jobs or a signal is kept. Under the bound, the `LIMIT 0`
            // reads nothing.
            client
                .run(
                    "DELETE FROM svc_workers WHERE worker_id IN (SELECT w.worker_id FROM svc_workers w \
                     WHERE w.worker_id <> $1 AND w.signal IS NULL AND NOT EXISTS (SELECT 1 FROM svc_jobs j \
                       WHERE j.state = 'active' AND j.worker_id = w.worker_id) \
                     ORDER BY w.last_seen_at, w.worker_id \
                     LIMIT greatest((SELECT count(*) FROM svc_workers) - $2, 0))",
                    &[&worker_id, &(WORKERS_MAX as i64)],
                )
                .await
                .map_err(database)?;
            let kind = EventKind::WorkerStarted { worker_id: worker_id.to_string() };
            super::events::append(&client, &[(self.fresh_id(now), now, kind, None)]).await.map_err(database)?;
        }
        Ok(signal_of(signal))
    }

    pub async fn workers_page(
        &self,
        after: Option<&str>,
        limit: usize,
        state: Option<WorkerState>,
    ) -> Result<Page<WorkerEntry>, EngineError> {
        let signal = state.map(|state| match state {
            WorkerState::Running => "",
            WorkerState::Quiet => "quiet",
            WorkerState::Terminate => "terminate",
        });
        let client = self.client().await?;
        let query = format!(
            "{ENTRY} WHERE ($1::text IS NULL OR w.worker_id > $1) \
             AND ($2::text IS NULL OR coalesce(w.signal, '') = $2) ORDER BY w.worker_id LIMIT $3"
        );
        let rows = client.rows(&query, &[&after, &signal, &(limit as i64 + 1)]).await.map_err(database)?;
        let has_more = rows.len() > limit;
        Ok((rows.iter().take(limit).map(entry).collect(), has_more))
    }

    pub async fn worker(&self, worker_id: &str) -> Result<Option<WorkerEntry>, EngineError> {
        // An id no worker can have (a NUL would fail the statement) names none.
        if !is_valid_worker_id(worker_id) {
            return Ok(None);
        }
        let client = self.client().await?;
        let query = format!("{ENTRY} WHERE w.worker_id = $1");
        let row = client.maybe_row(&query, &[&worker_id]).await.map_err(database)?;
        Ok(row.as_ref().map(entry))
    }

    /// Gives a known worker a signal; `quiet` after `terminate` is refused.
    pub async fn signal_worker(
        &self,
        now: Millis,
        worker_id: &str,
        signal: WorkerSignal,
    ) -> Result<WorkerEntry, EngineError> {
        if !is_valid_worker_id(worker_id) {
            return Err(EngineError::WorkerNotFound { worker_id: worker_id.to_string() });
        }
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let current = transaction
            .maybe_row("SELECT signal FROM svc_workers WHERE worker_id = $1 FOR UPDATE", &[&worker_id])
            .await
            .map_err(database)?;
        let Some(current) = current else {
            return Err(EngineError::WorkerNotFound { worker_id: worker_id.to_string() });
        };
        if signal == WorkerSignal::Quiet && signal_of(current.get(0)) == Some(WorkerSignal::Terminate) {
            let current_state = WorkerState::Terminate;
            return Err(EngineError::WorkerConflict { worker_id: worker_id.to_string(), current_state });
        }
        transaction
            .run(
                "UPDATE svc_workers SET signal = $2, signalled_at = to_timestamp($3::int8::float8 / 1000) \
                 WHERE worker_id = $1",
                &[&worker_id, &signal_text(signal), &now],
            )
            .await
            .map_err(database)?;
        let query = format!("{ENTRY} WHERE w.worker_id = $1");
        let updated = entry(&transaction.row(&query, &[&worker_id]).await.map_err(database)?);
        let kind = EventKind::WorkerSignalled(Box::new(SignalledWorker {
            worker_id: worker_id.to_string(),
            terminate: signal == WorkerSignal::Terminate,
            active_job_ids: updated.active_job_ids.clone(),
            by: "operator",
        }));
        super::events::append(&transaction, &[(self.fresh_id(now), now, kind, None)]).await.map_err(database)?;
        transaction.commit().await.map_err(database)?;
        Ok(updated)
    }

    /// Forgets a worker's entry and signal; its jobs are untouched.
    pub async fn forget_worker(&self, worker_id: &str) -> Result<(), EngineError> {
        if !is_valid_worker_id(worker_id) {
            return Err(EngineError::WorkerNotFound { worker_id: worker_id.to_string() });
        }
        let client = self.client().await?;
        let gone = client.run("DELETE FROM svc_workers WHERE worker_id = $1", &[&worker_id]).await.map_err(database)?;
        if gone == 0 {
            return Err(EngineError::WorkerNotFound { worker_id: worker_id.to_string() });
        }
        Ok(())
    }

    /// Forgets workers with no contact for a day and no active jobs (the
    /// leader's housekeeping).
    pub async fn forget_idle_workers(&self, now: Millis) -> Result<u64, EngineError> {
        let client = self.client().await?;
        client
            .run(
                "DELETE FROM svc_workers w WHERE last_seen_at < to_timestamp(($1::int8 - $2::int8)::float8 / 1000) \
                 AND coalesce(signalled_at, last_seen_at) < to_timestamp(($1::int8 - $2::int8)::float8 / 1000) \
                 AND NOT EXISTS (SELECT 1 FROM svc_jobs j WHERE j.state = 'active' AND j.worker_id = w.worker_id COLLATE \"default\")",
                &[&now, &WORKER_FORGET_MS],
            )
            .await
            .map_err(database)
    }
}

/// The number of workers in each state, for the overview.
pub(super) async fn counts(client: &impl GenericClient) -> Result<(usize, Vec<(WorkerState, usize)>), EngineError> {
    let rows = client.rows("SELECT signal, count(*) FROM svc_workers GROUP BY signal", &[]).await.map_err(database)?;
    let mut total = 0;
    let mut by_state = Vec::new();
    for row in rows {
        let count = row.get::<_, i64>(1) as usize;
        total += count;
        by_state.push((WorkerState::of(signal_of(row.get(0))), count));
    }
    by_state.sort_by_key(|(state, _)| state.as_str());
    Ok((total, by_state))
}
