//! Queues on PostgreSQL (docs/postgres.md, "Queues"): their figures, read
//! from the job tables, and their settings in `svc_queues`: paused, and
//! bounded (backpressure).
//!
//! Every queue a job was enqueued to has a row in `svc_queues` (made by the
//! enqueue, in its transaction), so listing queues pages one small table.
//! A queue is listed while it holds jobs (in flight or finished and kept),
//! or is paused or bounded, as on the local engine.

use deadpool_postgres::GenericClient;

use super::jobs::{PgJobs, database};
use super::sql::Prepared;
use crate::backend::Page;
use crate::clock::Millis;
use crate::engine::{Backpressure, EngineError, MinuteCount, Overview, QueueStats, QueueSummary};
use crate::job::JobState;

/// A queue's settings as stored.
pub(super) struct Settings {
    pub paused: bool,
    pub backpressure: Option<Backpressure>,
}

pub(super) fn settings(row: &tokio_postgres::Row) -> Settings {
    let max_depth: Option<i64> = row.get("max_depth");
    let warning: Option<f64> = row.get("warning_threshold");
    let backpressure = max_depth.map(|depth| {
        let bound = Backpressure::reject_above(depth as u64);
        match warning {
            Some(threshold) => bound.warning_at(threshold),
            None => bound,
        }
    });
    Settings { paused: row.get("paused"), backpressure }
}

fn state_of(text: &str) -> Option<JobState> {
    JobState::ALL.into_iter().find(|state| state.as_str() == text)
}

/// The figures of `names`, in that order: jobs per state (in flight and in
/// the history), settings, and the longest-waiting available job.
async fn summaries(client: &impl GenericClient, names: &[String]) -> Result<Vec<QueueSummary>, EngineError> {
    let mut summaries: Vec<QueueSummary> = names
        .iter()
        .map(|name| QueueSummary {
            name: name.clone(),
            paused: false,
            counts: [0; 8],
            backpressure: None,
            oldest_available_at: None,
        })
        .collect();
    let place = |name: &str| names.iter().position(|candidate| candidate == name);
    let counts = client
        .rows(
            "SELECT queue, state, count(*) FROM svc_jobs WHERE queue = ANY($1) GROUP BY queue, state \
             UNION ALL SELECT queue, state, count(*) FROM svc_job_history WHERE queue = ANY($1) GROUP BY queue, state",
            &[&names],
        )
        .await
        .map_err(database)?;
    for row in counts {
        let (queue, state, count): (&str, &str, i64) = (row.get(0), row.get(1), row.get(2));
        if let (Some(at), Some(state)) = (place(queue), state_of(state)) {
            summaries[at].counts[state.index()] += count as u64;
        }
    }
    let rows = client
        .rows("SELECT name, paused, max_depth, warning_threshold FROM svc_queues WHERE name = ANY($1)", &[&names])
        .await
        .map_err(database)?;
    for row in rows {
        if let Some(at) = place(row.get("name")) {
            let Settings { paused, backpressure } = settings(&row);
            (summaries[at].paused, summaries[at].backpressure) = (paused, backpressure);
        }
    }
    let oldest = client
        .rows(
            "SELECT queue, (extract(epoch FROM min(ready_at)) * 1000)::int8 FROM svc_jobs \
             WHERE state = 'available' AND queue = ANY($1) GROUP BY queue",
            &[&names],
        )
        .await
        .map_err(database)?;
    for row in oldest {
        if let Some(at) = place(row.get(0)) {
            summaries[at].oldest_available_at = row.get(1);
        }
    }
    Ok(summaries)
}

/// Jobs completed and attempts failed in the minute before `now`, of one
/// queue or all, as the kept events tell them.
async fn last_minute(client: &impl GenericClient, queue: Option<&str>, now: Millis) -> Result<(u64, u64), EngineError> {
    let row = client
        .row(
            "SELECT count(*) FILTER (WHERE type = 'job.completed'), count(*) FILTER (WHERE type = 'job.failed') \
             FROM svc_events WHERE at > to_timestamp(($1::int8 - 60000)::float8 / 1000) \
             AND ($2::text IS NULL OR queue = $2) AND type IN ('job.completed', 'job.failed')",
            &[&now, &queue],
        )
        .await
        .map_err(database)?;
    Ok((row.get::<_, i64>(0) as u64, row.get::<_, i64>(1) as u64))
}

/// Whether the queue `q` is in use: the local engine shows a queue while it
/// holds jobs (finished ones kept included), is paused or bounded, and
/// always `default`.
macro_rules! in_use {
    () => {
        "(name = 'default' OR paused OR max_depth IS NOT NULL \
         OR EXISTS (SELECT 1 FROM svc_jobs j WHERE j.queue = q.name) \
         OR EXISTS (SELECT 1 FROM svc_job_history h WHERE h.queue = q.name))"
    };
}

/// Queues that hold jobs, or are paused or bounded, and `default`, after
/// `after` in name order.
const LISTED: &str = concat!(
    "SELECT name FROM svc_queues q WHERE ($1::text IS NULL OR name COLLATE \"C\" > $1) AND ",
    in_use!(),
    " ORDER BY name COLLATE \"C\" LIMIT $2"
);

/// A queue known and in use, as the listing shows it.
const IN_USE: &str = concat!("SELECT 1 FROM svc_queues q WHERE name = $1 AND ", in_use!());

impl PgJobs {
    /// Jobs completed and attempts failed per minute over the 24 hours
    /// before `now` (minutes with counts only, oldest first), of one queue
    /// or all: completions from the history, failures from the kept events.
    pub async fn throughput_minutes(&self, now: Millis, queue: Option<&str>) -> Result<Vec<MinuteCount>, EngineError> {
        let client = self.client().await?;
        let rows = client
            .rows(
                "SELECT minute, sum(completed)::int8, sum(failed)::int8 FROM ( \
                   SELECT (extract(epoch FROM date_trunc('minute', finished_at)) * 1000)::int8 AS minute, \
                     count(*) AS completed, 0 AS failed FROM svc_job_history \
                   WHERE state = 'completed' AND finished_at > to_timestamp(($1::int8 - 86400000)::float8 / 1000) \
                     AND ($2::text IS NULL OR queue = $2) GROUP BY 1 \
                   UNION ALL \
                   SELECT (extract(epoch FROM date_trunc('minute', at)) * 1000)::int8, 0, count(*) FROM svc_events \
                   WHERE type = 'job.failed' AND at > to_timestamp(($1::int8 - 86400000)::float8 / 1000) \
                     AND ($2::text IS NULL OR queue = $2) GROUP BY 1) counted \
                 GROUP BY minute ORDER BY minute",
                &[&now, &queue],
            )
            .await
            .map_err(database)?;
        Ok(rows
            .iter()
            .map(|row| MinuteCount {
                minute: row.get(0),
                completed: row.get::<_, i64>(1) as u64,
                failed: row.get::<_, i64>(2) as u64,
            })
            .collect())
    }

    pub async fn queues_page(&self, after: Option<&str>, limit: usize) -> Result<Page<QueueSummary>, EngineError> {
        let client = self.client().await?;
        let rows = client.rows(LISTED, &[&after, &(limit as i64 + 1)]).await.map_err(database)?;
        let has_more = rows.len() > limit;
        let names: Vec<String> = rows.iter().take(limit).map(|row| row.get(0)).collect();
        Ok((summaries(&client, &names).await?, has_more))
    }

    /// A queue's figures, with its last minute; `None` for a queue not in
    /// use (as the local engine forgets a queue that holds nothing).
    pub async fn queue_stats(&self, now: Millis, name: &str) -> Result<Option<QueueStats>, EngineError> {
        let client = self.client().await?;
        let known = client.maybe_row(IN_USE, &[&name]).await.map_err(database)?;
        if known.is_none() {
            return Ok(None);
        }
        let summary = summaries(&client, &[name.to_string()]).await?.remove(0);
        let (completed_last_minute, failed_last_minute) = last_minute(&client, Some(name), now).await?;
        Ok(Some(QueueStats { summary, completed_last_minute, failed_last_minute }))
    }

    /// Pauses or resumes a queue (an event when that changes it); answers its figures.
    pub async fn pause_queue(&self, now: Millis, name: &str, paused: bool) -> Result<QueueSummary, EngineError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let current = transaction
            .maybe_row("SELECT paused FROM svc_queues WHERE name = $1 FOR UPDATE", &[&name])
            .await
            .map_err(database)?
            .is_some_and(|row| row.get::<_, bool>(0));
        if current != paused {
            transaction
                .run(
                    "INSERT INTO svc_queues (name, paused) VALUES ($1, $2) \
                     ON CONFLICT (name) DO UPDATE SET paused = $2, changed_at = now()",
                    &[&name, &paused],
                )
                .await
                .map_err(database)?;
            self.record_queue_event(&transaction, now, name, paused).await?;
        }
        if !paused {
            // Workers waiting on this queue may claim again.
            transaction.run("SELECT pg_notify($1, $2)", &[&super::wakeup::CHANNEL, &name]).await.map_err(database)?;
        }
        transaction.commit().await.map_err(database)?;
        // Counted after the commit: the queue's row stays locked no longer
        // than the change, since every enqueue's upsert of it waits on it.
        Ok(summaries(&client, &[name.to_string()]).await?.remove(0))
    }

    async fn record_queue_event(
        &self,
        client: &impl GenericClient,
        now: Millis,
        name: &str,
        paused: bool,
    ) -> Result<(), EngineError> {
        let kind = if paused {
            crate::engine::EventKind::QueuePaused(name.to_string())
        } else {
            crate::engine::EventKind::QueueResumed(name.to_string())
        };
        super::events::append(client, &[(self.fresh_id(now), now, kind, None)]).await.map_err(database)
    }

    /// Sets (`Some`) or removes a queue's backpressure; answers its figures.
    pub async fn configure_queue(
        &self,
        name: &str,
        backpressure: Option<Backpressure>,
    ) -> Result<QueueSummary, EngineError> {
        if let Some(bound) = &backpressure {
            bound.check().map_err(|error| EngineError::Invalid { error, index: None })?;
        }
        let max_depth = backpressure.map(|bound| bound.max_depth as i64);
        let warning = backpressure.and_then(|bound| bound.warning_threshold);
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        // Every write to jobs waits behind the lock `svc_depths_keep` may
        // take on `svc_jobs`, so the wait for it is bounded.
        if max_depth.is_some() {
            transaction.batch_execute("SET LOCAL lock_timeout = '1s'").await.map_err(database)?;
        }
        transaction
            .run(
                "INSERT INTO svc_queues (name, max_depth, warning_threshold) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO UPDATE SET max_depth = $2, warning_threshold = $3, changed_at = now()",
                &[&name, &max_depth, &warning],
            )
            .await
            .map_err(database)?;
        if max_depth.is_some() {
            // Bounded queues' depths are kept from here on (schema version
            // 15), in the transaction that sets the bound. The queue's row
            // is locked before `svc_jobs`, the order of enqueues and
            // workflow creations.
            transaction.run("SELECT svc_depths_keep()", &[]).await.map_err(database)?;
        }
        transaction.commit().await.map_err(database)?;
        Ok(summaries(&client, &[name.to_string()]).await?.remove(0))
    }

    /// The service at a glance.
    pub async fn overview(&self, now: Millis) -> Result<Overview, EngineError> {
        let client = self.client().await?;
        let mut overview = Overview::default();
        let rows = client
            .rows(
                "SELECT state, count(*) FROM svc_jobs GROUP BY state \
                 UNION ALL SELECT state, count(*) FROM svc_job_history GROUP BY state",
                &[],
            )
            .await
            .map_err(database)?;
        for row in rows {
            if let Some(state) = state_of(row.get(0)) {
                overview.jobs[state.index()] += row.get::<_, i64>(1) as u64;
            }
        }
        (overview.queues, overview.paused_queues) = queue_counts(&client).await?;
        (overview.completed_last_minute, overview.failed_last_minute) = last_minute(&client, None, now).await?;
        (overview.workers, overview.workers_by_state) = super::workers::counts(&client).await?;
        drop(client);
        overview.dead_letter = self.dead_letter_count(None).await? as usize;
        Ok(overview)
    }

    /// The queues listed (`GET /admin/queues`' total), without the rest of
    /// the overview: no job is counted.
    pub async fn queue_count(&self) -> Result<usize, EngineError> {
        Ok(queue_counts(&self.client().await?).await?.0)
    }

    /// The workers known, in all and in each state.
    pub async fn worker_counts(&self) -> Result<(usize, Vec<(crate::engine::WorkerState, usize)>), EngineError> {
        super::workers::counts(&self.client().await?).await
    }

    /// Folds the rows of each queue's depth into one (the leader's timers):
    /// while some queue is bounded, every statement that changes jobs adds a
    /// row (schema version 15), and a bounded queue's enqueue sums its rows.
    /// A queue already down to one row is left as it is.
    pub async fn fold_queue_depths(&self) -> Result<u64, EngineError> {
        let client = self.client().await?;
        client
            .run(
                "WITH folded AS (DELETE FROM svc_queue_depths WHERE queue IN \
                   (SELECT queue FROM svc_queue_depths GROUP BY queue HAVING count(*) > 1) \
                   RETURNING queue, delta) \
                 INSERT INTO svc_queue_depths (queue, delta) \
                 SELECT queue, sum(delta) FROM folded GROUP BY queue HAVING sum(delta) <> 0",
                &[],
            )
            .await
            .map_err(database)
    }

    /// Stops keeping queues' depths once no queue is bounded (the leader's
    /// housekeeping), so that changes to jobs no longer pay for it.
    pub async fn unkeep_queue_depths(&self) -> Result<(), EngineError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        // Every statement on jobs waits behind the lock this may take:
        // should a transaction in flight hold it back, it is tried again
        // next pass.
        transaction.batch_execute("SET LOCAL lock_timeout = '100ms'").await.map_err(database)?;
        transaction.run("SELECT svc_depths_unkeep()", &[]).await.map_err(database)?;
        transaction.commit().await.map_err(database)
    }
}

/// The queues listed and those paused. A queue is listed while it holds
/// jobs (finished ones kept included), or is paused or bounded, as on the
/// local engine; `default` always is. Each look is one index probe.
async fn queue_counts(client: &impl GenericClient) -> Result<(usize, usize), EngineError> {
    let row = client
        .row(
            "SELECT count(*) FILTER (WHERE name = 'default' OR paused OR max_depth IS NOT NULL OR EXISTS \
             (SELECT 1 FROM svc_jobs j WHERE j.queue = q.name) OR EXISTS \
             (SELECT 1 FROM svc_job_history h WHERE h.queue = q.name)), count(*) FILTER (WHERE paused) \
             FROM svc_queues q",
            &[],
        )
        .await
        .map_err(database)?;
    Ok((row.get::<_, i64>(0) as usize, row.get::<_, i64>(1) as usize))
}
