//! Listing jobs and bulk actions on PostgreSQL (docs/postgres.md, "Job
//! listing and bulk actions"): the admin API's job search over the hot
//! table and the history together, and retry, cancel, delete and purge of a
//! chunk of listed jobs in one transaction.
//!
//! The listing's order is the job id's (a UUIDv7: creation time first), so
//! a page goes on after the last id it answered whatever was added or
//! removed meanwhile. A page reads the next rows of both tables in id
//! order, a window at a time and at most [`SCAN_BUDGET`] rows in all; the
//! queue, state and type filters pick the rows of a window whose job is
//! read (the others answer their id alone), and the time range and the
//! text search read the job itself. So a search that matches little comes
//! back short, with a cursor saying where to go on, as on the local engine,
//! and no page reads more than its budget, whatever the filters. Rows are
//! taken one at a time: a window of 5 000 jobs of 2 MiB is never held.

use std::collections::HashSet;
use std::sync::Arc;

use futures_util::StreamExt;

use super::claims::{job_columns, job_of};
use super::enqueues::insert;
use super::jobs::{PgJobs, database, lock_in_flight, notify_available};
use super::sql::Prepared;
use crate::clock::Millis;
use crate::engine::{
    BULK_CHUNK_MAX, BulkAction, BulkOutcome, EngineError, EventKind, JobCursor, JobFilter, JobsPage, Unavailable,
};
use crate::job::{Job, JobId, JobState, transition};

/// Most rows one page reads, as many as a page of the local engine looks
/// at (at least).
pub const SCAN_BUDGET: usize = 100_000;
/// Most rows read at a time (a window), or the page's limit and one when
/// larger: only the rows the filters keep are sent whole.
const WINDOW_MAX: usize = 5_000;
/// The first window of a search that reads the jobs themselves (text, time).
const WINDOW_READING: usize = 500;

/// What a row must hold for its job to be read: `$2` the queue, `$3` the
/// states, `$4` the exact type, `$5` a type prefix.
const FIELDS: &str = "($2::text IS NULL OR queue = $2) AND (cardinality($3::text[]) = 0 OR state = ANY($3)) \
     AND ($4::text IS NULL OR type = $4) AND ($5::text IS NULL OR left(type, length($5)) = $5)";

/// Which tables a filter's states are found in.
fn tables(states: &[JobState]) -> (bool, bool) {
    let hot = states.is_empty() || states.iter().any(|state| !state.is_terminal());
    let history = states.is_empty() || states.iter().any(|state| state.is_terminal());
    (hot, history)
}

/// The next window of `$6` rows after the id `$1`, over the tables the
/// states are found in, as rows of `job_columns!()`; `body` is null where
/// [`FIELDS`] does not hold.
fn page_query(hot: bool, history: bool) -> String {
    // The claim's columns of a job in flight (`jobs::job_of`); none in the history.
    let select = |table: &str, claim: &str| {
        format!(
            "(SELECT id, body, {claim}, queue, state, type FROM {table} \
             WHERE id > coalesce($1::text::uuid, '00000000-0000-0000-0000-000000000000'::uuid) ORDER BY id LIMIT $6)"
        )
    };
    let hot_rows = select("svc_jobs", "claimed_ms, visible_until_ms, worker_id");
    let history_rows = select("svc_job_history", "NULL::int8, NULL::int8, NULL::text");
    let sources = match (hot, history) {
        (true, true) => format!("{hot_rows} UNION ALL {history_rows}"),
        (true, false) => hot_rows,
        _ => history_rows,
    };
    format!(
        "SELECT id::text AS id_text, CASE WHEN {FIELDS} THEN body END AS body, claimed_ms, visible_until_ms, worker_id \
         FROM ({sources}) AS window_rows(id, body, claimed_ms, visible_until_ms, worker_id, queue, state, type) \
         ORDER BY id LIMIT $6"
    )
}

impl PgJobs {
    /// Up to `limit` jobs `filter` keeps, in id order after `from`.
    pub async fn jobs_page(
        &self,
        filter: &JobFilter,
        from: Option<JobCursor>,
        limit: usize,
    ) -> Result<JobsPage, EngineError> {
        let limit = limit.max(1);
        // No job's queue or type holds a control character (and a NUL
        // would fail the statement): such a filter keeps nothing.
        let names = [filter.queue.as_deref(), filter.job_type.as_deref()];
        if names.into_iter().flatten().any(|name| name.chars().any(char::is_control)) {
            return Ok(JobsPage { jobs: Vec::new(), next: None, scanned: 0 });
        }
        let (hot, history) = tables(&filter.states);
        let query = page_query(hot, history);
        let states: Vec<&str> = filter.states.iter().map(|state| state.as_str()).collect();
        let (exact, prefix) = match filter.job_type.as_deref() {
            Some(pattern) => match pattern.strip_suffix('*') {
                Some(prefix) => (None, Some(prefix)),
                None => (Some(pattern), None),
            },
            None => (None, None),
        };
        // A window one row larger than the page, doubled while the filters
        // leave rows out: an unfiltered page reads one row past what it shows.
        let widest = WINDOW_MAX.max(limit + 1);
        let reads_jobs = filter.text.is_some() || filter.created_from.is_some() || filter.created_before.is_some();
        let mut chunk = if reads_jobs { WINDOW_READING.max(limit + 1) } else { limit + 1 };
        let client = self.client().await?;
        let mut after = from.and_then(|cursor| cursor.after());
        let (mut jobs, mut scanned) = (Vec::new(), 0);
        loop {
            let key = after.map(|id| id.to_string());
            // Row by row: a window of large jobs is never held whole.
            let rows = client
                .row_stream(&query, &[&key, &filter.queue, &states, &exact, &prefix, &(chunk as i64)])
                .await
                .map_err(database)?;
            let mut rows = std::pin::pin!(rows);
            let mut read = 0;
            while let Some(row) = rows.next().await {
                let row = row.map_err(database)?;
                read += 1;
                scanned += 1;
                if row.get::<_, Option<&[u8]>>(1).is_none() {
                    // Left out by the queue, state or type.
                    let id: &str = row.get(0);
                    after = Some(JobId::parse(id).ok_or(EngineError::Unavailable { reason: Unavailable::Database })?);
                    continue;
                }
                let job = job_of(&row)?;
                after = Some(job.id);
                if filter.keeps(&job) {
                    jobs.push(Arc::new(job));
                    if jobs.len() > limit {
                        jobs.truncate(limit);
                        let next = jobs.last().map(|job| JobCursor::after_job(job.id));
                        return Ok(JobsPage { jobs, next, scanned });
                    }
                }
            }
            if read < chunk {
                return Ok(JobsPage { jobs, next: None, scanned });
            }
            if scanned >= SCAN_BUDGET {
                return Ok(JobsPage { jobs, next: after.map(JobCursor::after_job), scanned });
            }
            chunk = (2 * chunk).min(widest).min(SCAN_BUDGET - scanned);
        }
    }

    /// Applies `action` to each of `ids` (at most [`BULK_CHUNK_MAX`]) that
    /// it applies to, in one transaction; a job the action skips (gone, or
    /// in another state) does not stop the others.
    pub async fn bulk_jobs(
        &self,
        now: Millis,
        action: BulkAction,
        ids: Vec<JobId>,
    ) -> Result<BulkOutcome, EngineError> {
        let given = ids.len().min(BULK_CHUNK_MAX);
        let mut seen = HashSet::with_capacity(given);
        let keys: Vec<String> =
            ids.into_iter().take(BULK_CHUNK_MAX).filter(|id| seen.insert(*id)).map(|id| id.to_string()).collect();
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let rows = |sql: &'static str| {
            let (transaction, keys) = (&transaction, &keys);
            async move {
                let rows = transaction.rows(sql, &[keys]).await.map_err(database)?;
                rows.iter().map(job_of).collect::<Result<Vec<Job>, _>>()
            }
        };
        let changed = match action {
            BulkAction::Retry => {
                let mut jobs = rows(
                    "DELETE FROM svc_job_history WHERE id = ANY($1::text[]::uuid[]) AND state = 'discarded' \
                     RETURNING id::text AS id_text, body",
                )
                .await?;
                jobs.iter_mut().for_each(|job| transition::revive(job, now));
                insert(&transaction, &jobs).await.map_err(database)?;
                notify_available(&transaction, &jobs).await?;
                self.record(&transaction, now, jobs.iter().map(|job| (EventKind::Revived, job)).collect()).await?;
                jobs.len()
            }
            BulkAction::Cancel => {
                let mut jobs = lock_in_flight(&transaction, &keys).await?;
                let previous: Vec<JobState> = jobs.iter().map(|job| job.state).collect();
                jobs.iter_mut().for_each(|job| transition::cancel(job, now));
                self.move_to_history(&transaction, &jobs.iter().collect::<Vec<_>>()).await?;
                let events = jobs
                    .iter()
                    .zip(previous)
                    .map(|(job, previous_state)| (EventKind::Cancelled { previous_state, reason: "api" }, job))
                    .collect();
                self.record(&transaction, now, events).await?;
                jobs.len()
            }
            BulkAction::Delete | BulkAction::Purge => {
                let mut events = Vec::new();
                let (mut cancelled, mut waiters) = (Vec::new(), Vec::new());
                if action == BulkAction::Purge {
                    // Cron runs waiting for a purged job start, as when it is cancelled.
                    let waiting = transaction
                        .rows(
                            "SELECT waiter::text FROM svc_jobs WHERE id = ANY($1::text[]::uuid[]) AND waiter IS NOT NULL",
                            &[&keys],
                        )
                        .await
                        .map_err(database)?;
                    waiters = waiting.iter().map(|row| row.get(0)).collect();
                    // Cancelled first, in the same step: the events say both.
                    cancelled = rows(concat!(
                        "DELETE FROM svc_jobs WHERE id = ANY($1::text[]::uuid[]) RETURNING ",
                        job_columns!()
                    ))
                    .await?;
                }
                let previous: Vec<JobState> = cancelled.iter().map(|job| job.state).collect();
                cancelled.iter_mut().for_each(|job| transition::cancel(job, now));
                let deleted = rows(
                    "DELETE FROM svc_job_history WHERE id = ANY($1::text[]::uuid[]) RETURNING id::text AS id_text, body",
                )
                .await?;
                for (job, previous_state) in cancelled.iter().zip(previous) {
                    events.push((EventKind::Cancelled { previous_state, reason: "api" }, job));
                    events.push((EventKind::Deleted, job));
                }
                events.extend(deleted.iter().map(|job| (EventKind::Deleted, job)));
                if cancelled.iter().any(|job| job.workflow().is_some()) {
                    self.workflow_jobs_ended(&transaction, &cancelled.iter().collect::<Vec<_>>()).await?;
                }
                self.start_waiters(&transaction, now, &waiters).await?;
                self.record(&transaction, now, events).await?;
                cancelled.len() + deleted.len()
            }
        };
        transaction.commit().await.map_err(database)?;
        Ok(BulkOutcome { changed: changed as u64, skipped: (given - changed) as u64 })
    }
}
