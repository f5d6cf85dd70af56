//! Jobs on PostgreSQL (docs/postgres.md, "Jobs"): enqueue, read, claim,
//! ack, fail, cancel and promote, each one transaction.
//!
//! A job's row carries the columns the queries select on and the whole job
//! (`body`, svc's stored form; its current claim may be kept in columns
//! instead, read back by `claims::job_of`). Every change reads the job locked
//! (`FOR UPDATE`), changes it with the same transitions as the local engine
//! (`job::transition`), and writes it back in the same transaction, so both
//! backends answer alike. Claims lock with `SKIP LOCKED`: concurrent
//! claimers, on any node, pass over each other's rows and never take the
//! same job. Finished jobs move to `svc_job_history`.
//!
//! Times are the caller's (`now`), so a manual clock drives tests; nodes are
//! expected to keep their clocks in sync (NTP), as leases span nodes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use deadpool_postgres::{GenericClient, Pool, Transaction};
use tokio_postgres::error::SqlState;

use super::PgError;
use super::batch::Batches;
use super::claims::{job_columns, job_of};
use super::enqueues::insert;
use super::sql::{Params, Prepared, from_body, to_body};
use super::wakeup::{CHANNEL, Wakeups};
use crate::clock::Millis;
use crate::engine::{
    Cancelled, ConflictReason, DeadLetterCursor, EngineError, Enqueued, EventKind, FetchRequest, Unavailable,
};
use crate::job::transition::{self, FailOutcome};
use crate::job::{FailureReport, IdGenerator, Job, JobId, JobProgress, JobState, NewJob};

/// Milliseconds since the epoch as a `timestamptz`, in SQL.
macro_rules! ts {
    ($expr:literal) => {
        concat!("to_timestamp((", $expr, ")::int8::float8 / 1000)")
    };
}

/// The job store of one node.
///
/// Cloning it is cheap: the clones share the pool, the id generator, the
/// wake-ups and the merged requests.
#[derive(Clone)]
pub struct PgJobs {
    pool: Pool,
    ids: Arc<std::sync::Mutex<IdGenerator>>,
    wakeups: Arc<Wakeups>,
    pub(super) batches: Arc<std::sync::OnceLock<Batches>>,
    compiled_schemas: Arc<super::schemas::CompiledSchemas>,
    /// The most schemas and cron entries registered (`limits.max_schemas`,
    /// `limits.max_cron`).
    pub(super) max_schemas: usize,
    pub(super) max_cron: usize,
    webhook_limits: crate::engine::outbox::WebhookLimits,
    /// What this node counts: the leader counts every committed event once.
    metrics: Arc<crate::metrics::Metrics>,
    /// By queue, the soonest a rate window that held a claim back opens, as
    /// the node's claims last saw it: fetches waiting on the queue look
    /// again then. Times past are dropped as new ones come.
    window_opens_at: Arc<std::sync::Mutex<HashMap<String, Millis>>>,
    /// Cron entries whose firing failed, until their next try.
    pub(super) cron_retries: Arc<super::cron::CronRetries>,
    /// The jobs this node claimed last, for acks that come back to it.
    pub(super) claimed: Arc<super::acks::ClaimedJobs>,
    /// Queues whose jobs were found to need the checked claim, for a while.
    pub(super) checked_queues: Arc<super::claims::CheckedQueues>,
}

/// Tries at a transaction the database may roll back to break a deadlock
/// (a workflow cancel, a merged ack): such a transaction changed nothing
/// and runs again, up to this many times in all.
pub(super) const CONTENTION_TRIES: usize = 3;

/// A database failure, logged with its cause and answered as unavailable:
/// the transaction was rolled back, nothing changed.
pub(super) fn database(error: impl Into<PgError>) -> EngineError {
    let error = error.into();
    tracing::warn!(%error, "a database statement failed");
    let code = match &error {
        PgError::Database(error) => error.code(),
        _ => None,
    };
    // A lock not taken within the transaction's `lock_timeout` is
    // contention too: nothing was changed, and it may be sent again.
    let contention =
        [SqlState::T_R_DEADLOCK_DETECTED, SqlState::T_R_SERIALIZATION_FAILURE, SqlState::LOCK_NOT_AVAILABLE];
    match code {
        Some(code) if contention.contains(code) => EngineError::Unavailable { reason: Unavailable::Contention },
        _ => EngineError::Unavailable { reason: Unavailable::Database },
    }
}

/// The job as stored in `body`.
pub(super) fn encode(job: &Job) -> Vec<u8> {
    to_body(job)
}

pub(super) fn decode(id: &str, body: &[u8]) -> Result<Job, EngineError> {
    from_body("job", id, body)
}

/// When a job in the hot table becomes (or became) claimable: the order of
/// `svc_jobs_claim_order` within a priority, and the due time of the timers.
pub(super) fn ready_at(job: &Job) -> Millis {
    match job.state {
        JobState::Scheduled => job.scheduled_at().unwrap_or(job.created_at),
        JobState::Retryable => job.run().retry_at.unwrap_or(job.created_at),
        _ => job.enqueued_at().unwrap_or(job.created_at),
    }
}

/// The fingerprint a job with a unique policy holds (`unique_key` columns).
pub(super) fn unique_key(job: &Job) -> Option<Vec<u8>> {
    job.unique().map(|(_, key)| key.0.to_vec())
}

/// When a finished job finished.
pub(super) fn finished_at(job: &Job) -> Millis {
    let run = job.run();
    match job.state {
        JobState::Cancelled => run.cancelled_at,
        JobState::Discarded => run.discarded_at,
        _ => run.completed_at,
    }
    .unwrap_or(job.created_at)
}

impl PgJobs {
    /// A store on `pool`. Waiting fetches poll until [`PgJobs::listen`]
    /// starts the node's listening connection.
    pub fn new(pool: Pool) -> Self {
        PgJobs {
            pool,
            ids: Arc::default(),
            wakeups: Arc::default(),
            batches: Arc::default(),
            compiled_schemas: Arc::default(),
            max_schemas: crate::limits::SCHEMAS_MAX,
            max_cron: crate::limits::CRON_ENTRIES_MAX_DEFAULT,
            webhook_limits: Default::default(),
            metrics: Arc::new(crate::metrics::Metrics::new()),
            window_opens_at: Arc::default(),
            cron_retries: Arc::default(),
            claimed: Arc::default(),
            checked_queues: Arc::default(),
        }
    }

    /// Notes that a rate window opens at `opens_at` for `queue` (a claim at
    /// `now` was held back by it); times already past are dropped.
    pub(super) fn window_opens_at(&self, now: Millis, queue: String, opens_at: Millis) {
        let mut known = self.window_opens_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        known.retain(|_, at| *at > now);
        let soonest = known.entry(queue).or_insert(opens_at);
        *soonest = (*soonest).min(opens_at);
    }

    /// How long until the soonest rate window known of `queues` opens, if
    /// one is ahead.
    fn until_a_window_opens(&self, now: Millis, queues: &[String]) -> Option<std::time::Duration> {
        let known = self.window_opens_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let soonest = queues.iter().filter_map(|queue| known.get(queue)).filter(|at| **at > now).min()?;
        Some(std::time::Duration::from_millis((soonest - now) as u64))
    }

    /// The metrics this store counts into (docs/postgres.md, "Metrics").
    pub fn metrics(&self) -> &Arc<crate::metrics::Metrics> {
        &self.metrics
    }

    /// Sets the bounds of webhook subscriptions and their outbox
    /// (`limits.max_webhooks`, `webhooks.max_pending`, ...).
    pub fn with_webhook_limits(mut self, limits: crate::engine::outbox::WebhookLimits) -> Self {
        self.webhook_limits = limits;
        self
    }

    /// The same store on connections of `pool`: the sender of deliveries
    /// has its own, driven by its own runtime.
    #[cfg(feature = "webhooks")]
    pub(super) fn with_pool(&self, pool: Pool) -> Self {
        PgJobs { pool, ..self.clone() }
    }

    pub(super) fn webhook_limits(&self) -> &crate::engine::outbox::WebhookLimits {
        &self.webhook_limits
    }

    /// Sets the most schemas the registry holds (`limits.max_schemas`).
    pub fn with_max_schemas(mut self, max_schemas: usize) -> Self {
        self.max_schemas = max_schemas;
        self
    }

    pub(super) fn compiled_schemas(&self) -> &super::schemas::CompiledSchemas {
        &self.compiled_schemas
    }

    /// Starts listening for jobs made available on any node, on a
    /// connection of its own (made again when lost) until the task is aborted.
    pub fn listen(&self, settings: &super::PgSettings) -> Result<tokio::task::JoinHandle<()>, PgError> {
        Ok(self.wakeups.listen(settings.connection_config()?))
    }

    /// Whether this node hears of new jobs as they come (else waiting
    /// fetches poll).
    pub fn listening(&self) -> bool {
        self.wakeups.listening()
    }

    /// Claims as [`PgJobs::claim`] does; with nothing to claim, waits up to
    /// `wait` for jobs on the requested queues, woken by the notification of
    /// the transaction that makes them available, on any node.
    pub async fn claim_waiting(
        &self,
        now: &(dyn Fn() -> Millis + Send + Sync),
        request: &FetchRequest,
        wait: std::time::Duration,
    ) -> Result<Vec<Arc<Job>>, EngineError> {
        let deadline = std::time::Instant::now() + wait;
        let waiter = self.wakeups.waiter(&request.queues);
        loop {
            let claimed = self.claim(now(), request).await?;
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if !claimed.is_empty() || left.is_zero() {
                return Ok(claimed);
            }
            // A job a rate window holds back is claimed when the window
            // opens: no notification tells of that.
            let window = self.until_a_window_opens(now(), &request.queues).unwrap_or(left);
            waiter.wait(left.min(window)).await;
        }
    }

    pub(super) async fn client(&self) -> Result<deadpool_postgres::Object, EngineError> {
        self.pool.get().await.map_err(database)
    }

    pub(super) fn fresh_id(&self, now: Millis) -> JobId {
        self.id_generator().next(now, rand::random())
    }

    /// The node's id generator, held: ids made one after another while it
    /// is held follow each other (see `JobId::next_in_millisecond`).
    pub(super) fn id_generator(&self) -> std::sync::MutexGuard<'_, IdGenerator> {
        self.ids.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes the events of a change in its transaction, each with a fresh id.
    pub(super) async fn record(
        &self,
        client: &impl GenericClient,
        now: Millis,
        events: Vec<(EventKind, &Job)>,
    ) -> Result<(), EngineError> {
        let events: Vec<_> = events.into_iter().map(|(kind, job)| (self.fresh_id(now), now, kind, Some(job))).collect();
        super::events::append(client, &events).await.map_err(database)
    }

    /// The event listing: events after `after`, oldest first, that `filter` keeps.
    pub async fn events_page(
        &self,
        after: Option<&str>,
        limit: usize,
        filter: &crate::backend::EventFilter,
    ) -> Result<crate::engine::EventPage, EngineError> {
        let client = self.client().await?;
        super::events::page(&client, after, limit, filter).await
    }

    /// Keeps the newest events only (the leader's housekeeping).
    pub async fn prune_events(&self) -> Result<u64, EngineError> {
        let client = self.client().await?;
        super::events::prune(&client).await.map_err(database)
    }

    /// Enqueues jobs, all or none. Checked as the local engine checks them:
    /// client ids not in use and not far ahead, times in order, queues not
    /// paused and not past their backpressure bound, `args` matching the
    /// schema a job names, unique policies.
    pub async fn enqueue(&self, now: Millis, new_jobs: Vec<NewJob>) -> Result<Vec<Enqueued>, EngineError> {
        let batch = new_jobs.len() > 1;
        let index_of = |position: usize| batch.then_some(position);
        self.check_schemas(&new_jobs, index_of).await?;
        let chosen_ids = new_jobs.iter().filter_map(|new_job| new_job.id).map(|id| id.to_string()).collect();
        let mut jobs = Vec::with_capacity(new_jobs.len());
        for (position, new_job) in new_jobs.into_iter().enumerate() {
            jobs.push(self.admit(now, new_job, index_of(position))?);
        }
        self.batches().enqueues.submit(super::enqueues::PendingEnqueue { now, jobs, chosen_ids }).await
    }

    /// A new job with its id, times and first state, as the local engine
    /// admits one (`State::admit`).
    fn admit(&self, now: Millis, new_job: NewJob, index: Option<usize>) -> Result<Job, EngineError> {
        transition::admit(new_job, now, false, || self.fresh_id(now))
            .map_err(|error| EngineError::Invalid { error, index })
    }

    /// A round trip to the database (health checks).
    pub async fn probe(&self) -> Result<(), EngineError> {
        self.client().await?.run("SELECT 1", &[]).await.map_err(database)?;
        Ok(())
    }

    /// A job by id, in flight or finished.
    pub async fn job(&self, id: JobId) -> Result<Option<Arc<Job>>, EngineError> {
        let client = self.client().await?;
        let row = client
            .maybe_row(
                concat!(
                    "SELECT ",
                    job_columns!(),
                    " FROM svc_jobs WHERE id = $1::text::uuid \
                     UNION ALL SELECT id::text, body, NULL, NULL, NULL FROM svc_job_history \
                     WHERE id = $1::text::uuid LIMIT 1"
                ),
                &[&id.to_string()],
            )
            .await
            .map_err(database)?;
        row.map(|row| job_of(&row).map(Arc::new)).transpose()
    }

    /// Claims up to `request.count` available jobs from the listed queues
    /// (merged with other claims waiting, `claims.rs`).
    pub async fn claim(&self, now: Millis, request: &FetchRequest) -> Result<Vec<Arc<Job>>, EngineError> {
        let claim = super::claims::PendingClaim { now, request: request.clone() };
        self.batches().claims.submit(claim).await
    }

    /// Completes an active job with the worker's result (merged with other
    /// acks waiting, `acks.rs`).
    pub async fn ack(
        &self,
        now: Millis,
        id: JobId,
        result: Option<String>,
        worker_id: Option<&str>,
    ) -> Result<Arc<Job>, EngineError> {
        let ack = super::acks::PendingAck { now, id, result, worker_id: worker_id.map(str::to_string) };
        self.batches().acks.submit(ack).await
    }

    /// Records a failed attempt: retried, discarded or made available again
    /// (`requeue`) as the job's retry policy and the report say.
    pub async fn fail(
        &self,
        now: Millis,
        id: JobId,
        report: FailureReport,
        requeue: bool,
        worker_id: Option<&str>,
    ) -> Result<Arc<Job>, EngineError> {
        self.change_held(now, id, worker_id, |job| {
            let outcome = if requeue {
                FailOutcome::Requeue
            } else {
                crate::schedule::failure_outcome(job, &report, now, rand::random)
            };
            let attempt = job.attempt;
            transition::fail(job, now, &report, outcome);
            let mut events = Vec::with_capacity(2);
            if outcome != FailOutcome::Requeue {
                events.push(EventKind::Failed { report: Box::new(report.clone()), attempt });
            }
            events.push(EventKind::after_failure(&report, outcome, "nack_requeue"));
            events
        })
        .await
    }

    /// Records a worker's progress on a job it holds (docs/api.md,
    /// "Progress"): the job carries the last report of its attempt.
    pub async fn report_progress(
        &self,
        now: Millis,
        id: JobId,
        mut progress: JobProgress,
        worker_id: Option<&str>,
    ) -> Result<Arc<Job>, EngineError> {
        progress.check().map_err(|error| EngineError::Invalid { error, index: None })?;
        progress.updated_at = now;
        self.change_held(now, id, worker_id, |job| {
            job.set_progress(Some(progress));
            vec![EventKind::Progress]
        })
        .await
    }

    /// Changes a job a worker holds (it is active, and claimed by that
    /// worker when both name one), then writes it back or, finished, moves it.
    async fn change_held(
        &self,
        now: Millis,
        id: JobId,
        worker_id: Option<&str>,
        change: impl FnOnce(&mut Job) -> Vec<EventKind>,
    ) -> Result<Arc<Job>, EngineError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let Some(mut job) = locked(&transaction, id).await? else {
            return Err(match finished(&transaction, id).await? {
                Some(job) => EngineError::not_held(&job, transition::NotHeld::NotActive),
                None => EngineError::NotFound { id },
            });
        };
        transition::check_held(&job, worker_id).map_err(|refusal| EngineError::not_held(&job, refusal))?;
        let events = change(&mut job);
        let events = events.into_iter().map(|kind| (kind, &job)).collect();
        let notified = notify_available(&transaction, std::slice::from_ref(&job));
        tokio::try_join!(self.store(&transaction, &job), notified, self.record(&transaction, now, events))?;
        transaction.commit().await.map_err(database)?;
        Ok(Arc::new(job))
    }

    /// Cancels a job not yet finished; a cancelled one is answered as it is
    /// (cancel is idempotent), a completed or discarded one refused.
    pub async fn cancel(&self, now: Millis, id: JobId) -> Result<Cancelled, EngineError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let Some(mut job) = locked(&transaction, id).await? else {
            return match finished(&transaction, id).await? {
                Some(job) if job.state == JobState::Cancelled => {
                    Ok(Cancelled { job: Arc::new(job), previous_state: JobState::Cancelled })
                }
                Some(job) => {
                    Err(EngineError::Conflict { id, current_state: job.state, reason: ConflictReason::InvalidState })
                }
                None => Err(EngineError::NotFound { id }),
            };
        };
        let previous_state = job.state;
        transition::cancel(&mut job, now);
        self.store(&transaction, &job).await?;
        self.record(&transaction, now, vec![(EventKind::Cancelled { previous_state, reason: "api" }, &job)]).await?;
        transaction.commit().await.map_err(database)?;
        Ok(Cancelled { job: Arc::new(job), previous_state })
    }

    /// Activates a staged (`pending`) job: `scheduled` until its time,
    /// else available at once.
    pub async fn activate(&self, now: Millis, id: JobId) -> Result<Arc<Job>, EngineError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let Some(mut job) = locked(&transaction, id).await? else {
            return Err(match finished(&transaction, id).await? {
                Some(job) => EngineError::Conflict { id, current_state: job.state, reason: ConflictReason::NotPending },
                None => EngineError::NotFound { id },
            });
        };
        if job.state != JobState::Pending {
            return Err(EngineError::Conflict { id, current_state: job.state, reason: ConflictReason::NotPending });
        }
        // A waiting chain step or callback is its workflow's to start, a
        // waiting cron run its cron entry's.
        let waiting = transaction
            .maybe_row("SELECT 1 FROM svc_jobs WHERE waiter = $1::text::uuid", &[&id.to_string()])
            .await
            .map_err(database)?;
        if job.workflow().is_some() || waiting.is_some() {
            return Err(EngineError::Conflict { id, current_state: job.state, reason: ConflictReason::Owned });
        }
        transition::activate(&mut job, now);
        let events = if job.state == JobState::Scheduled { vec![(EventKind::Scheduled, &job)] } else { Vec::new() };
        let notified = notify_available(&transaction, std::slice::from_ref(&job));
        tokio::try_join!(self.store(&transaction, &job), notified, self.record(&transaction, now, events))?;
        transaction.commit().await.map_err(database)?;
        Ok(Arc::new(job))
    }

    /// A worker's heartbeat: extends the claims it covers, the listed jobs
    /// that are active and held by this worker or by none (or, without a
    /// list, every job it holds), by the claim's own visibility timeout
    /// unless `visibility_ms` gives another. Answers how many were extended,
    /// and the listed ids that were not.
    pub async fn extend_claims(
        &self,
        now: Millis,
        worker_id: &str,
        listed: Option<&[JobId]>,
        visibility_ms: Option<u64>,
    ) -> Result<(usize, Vec<JobId>), EngineError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let mut held = match listed {
            Some(ids) => {
                let ids: Vec<String> = ids.iter().map(JobId::to_string).collect();
                locked_jobs(
                    &transaction,
                    concat!(
                        "SELECT ",
                        job_columns!(),
                        " FROM svc_jobs WHERE id = ANY($1::text[]::uuid[]) AND state = 'active' \
                     AND (worker_id IS NULL OR worker_id = $2) ORDER BY id FOR UPDATE"
                    ),
                    &[&ids, &worker_id],
                )
                .await?
            }
            None => {
                locked_jobs(
                    &transaction,
                    concat!(
                        "SELECT ",
                        job_columns!(),
                        " FROM svc_jobs WHERE state = 'active' AND worker_id = $1 \
                     ORDER BY id FOR UPDATE"
                    ),
                    &[&worker_id],
                )
                .await?
            }
        };
        for job in &mut held {
            let visibility = visibility_ms.unwrap_or_else(|| transition::claim_visibility_ms(job));
            transition::extend(job, now.saturating_add(visibility as i64));
        }
        // Sent together (pipelined): one round trip for every claim, not one each.
        futures_util::future::try_join_all(held.iter().map(|job| update_row(&transaction, job))).await?;
        let extended: HashSet<JobId> = held.iter().map(|job| job.id).collect();
        transaction.commit().await.map_err(database)?;
        let mut not_extended: Vec<JobId> =
            listed.unwrap_or_default().iter().copied().filter(|id| !extended.contains(id)).collect();
        not_extended.sort();
        not_extended.dedup();
        Ok((extended.len(), not_extended))
    }

    /// Ends claims whose time ran out, at most `limit` (the soonest first),
    /// as the local engine does: an execution timeout is a failed attempt, a
    /// visibility timeout gives the job back while attempts are left. This
    /// is how a dead node's jobs come back to the living ones. Answers how
    /// many claims ended.
    pub async fn expire_claims(&self, now: Millis, limit: i64) -> Result<usize, EngineError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let mut jobs = due_jobs(
            &transaction,
            concat!(
                "SELECT ",
                job_columns!(),
                " FROM svc_jobs WHERE state = 'active' AND lease_until <= ",
                ts!("$1"),
                " ORDER BY lease_until LIMIT $2 FOR UPDATE SKIP LOCKED"
            ),
            &[&now, &limit],
        )
        .await?;
        let mut events = Vec::with_capacity(2 * jobs.len());
        for job in &mut jobs {
            let (kind, outcome) = crate::schedule::timeout_outcome(job, now, rand::random);
            let report = transition::timeout_report(job, kind, now);
            let attempt = job.attempt;
            transition::fail(job, now, &report, outcome);
            self.store(&transaction, job).await?;
            events.push(EventKind::Failed { report: Box::new(report.clone()), attempt });
            events.push(EventKind::after_failure(&report, outcome, "visibility_timeout"));
        }
        notify_available(&transaction, &jobs).await?;
        // Two events a job, in the order they were made.
        let events = events.into_iter().zip(jobs.iter().flat_map(|job| [job, job])).collect();
        self.record(&transaction, now, events).await?;
        transaction.commit().await.map_err(database)?;
        Ok(jobs.len())
    }

    /// The dead letter listing: discarded jobs, newest first, after
    /// `after`, of one queue or all; with the cursor of the next page when
    /// more follow.
    pub async fn dead_letter_page(
        &self,
        after: Option<DeadLetterCursor>,
        limit: usize,
        queue: Option<&str>,
    ) -> Result<(Vec<Arc<Job>>, Option<DeadLetterCursor>), EngineError> {
        let client = self.client().await?;
        let (at, id) = match after.map(|cursor| cursor.position()) {
            Some((at, id)) => (Some(at), Some(id.to_string())),
            None => (None, None),
        };
        let rows = client
            .rows(
                concat!(
                    "SELECT id::text AS id_text, body FROM svc_job_history WHERE state = 'discarded' \
                       AND ($1::text IS NULL OR queue = $1) \
                       AND ($2::int8 IS NULL OR (finished_at, id) < (",
                    ts!("$2"),
                    ", $3::text::uuid)) \
                     ORDER BY finished_at DESC, id DESC LIMIT $4"
                ),
                &[&queue, &at, &id, &(limit as i64 + 1)],
            )
            .await
            .map_err(database)?;
        let mut jobs = Vec::with_capacity(rows.len());
        for row in rows {
            jobs.push(Arc::new(decode(row.get(0), row.get(1))?));
        }
        let next = if jobs.len() > limit {
            jobs.truncate(limit);
            jobs.last().map(|job: &Arc<Job>| DeadLetterCursor::new(finished_at(job), job.id))
        } else {
            None
        };
        Ok((jobs, next))
    }

    /// How many jobs the dead letter listing holds, of one queue or all.
    pub async fn dead_letter_count(&self, queue: Option<&str>) -> Result<u64, EngineError> {
        let client = self.client().await?;
        let count: i64 = client
            .row(
                "SELECT count(*) FROM svc_job_history WHERE state = 'discarded' AND ($1::text IS NULL OR queue = $1)",
                &[&queue],
            )
            .await
            .map_err(database)?
            .get(0);
        Ok(count as u64)
    }

    /// Sends a discarded job back to `available` as a fresh run.
    pub async fn dead_letter_retry(&self, now: Millis, id: JobId) -> Result<Arc<Job>, EngineError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let mut job = take_discarded(&transaction, id).await?;
        transition::revive(&mut job, now);
        insert(&transaction, std::slice::from_ref(&job)).await.map_err(database)?;
        notify_available(&transaction, std::slice::from_ref(&job)).await?;
        self.record(&transaction, now, vec![(EventKind::Revived, &job)]).await?;
        transaction.commit().await.map_err(database)?;
        Ok(Arc::new(job))
    }

    /// Removes a discarded job for good.
    pub async fn dead_letter_delete(&self, now: Millis, id: JobId) -> Result<(), EngineError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let job = take_discarded(&transaction, id).await?;
        self.record(&transaction, now, vec![(EventKind::Deleted, &job)]).await?;
        transaction.commit().await.map_err(database)?;
        Ok(())
    }

    /// Makes scheduled and retryable jobs whose time came available, up to
    /// `limit` of them (oldest due first); answers how many.
    pub async fn promote_due(&self, now: Millis, limit: i64) -> Result<usize, EngineError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let mut jobs = due_jobs(
            &transaction,
            concat!(
                "SELECT ",
                job_columns!(),
                " FROM svc_jobs WHERE state IN ('scheduled', 'retryable') AND ready_at <= ",
                ts!("$1"),
                " ORDER BY ready_at LIMIT $2 FOR UPDATE SKIP LOCKED"
            ),
            &[&now, &limit],
        )
        .await?;
        for job in &mut jobs {
            transition::promote(job, now);
            self.store(&transaction, job).await?;
        }
        notify_available(&transaction, &jobs).await?;
        transaction.commit().await.map_err(database)?;
        Ok(jobs.len())
    }

    /// Discards jobs not claimed whose `expires_at` passed, as the local
    /// engine's timers do, up to `limit` of them (the soonest first);
    /// answers how many.
    pub async fn expire_due(&self, now: Millis, limit: i64) -> Result<usize, EngineError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let mut jobs = due_jobs(
            &transaction,
            concat!(
                "SELECT ",
                job_columns!(),
                " FROM svc_jobs \
             WHERE state IN ('pending', 'scheduled', 'available', 'retryable') AND expires_at <= ",
                ts!("$1"),
                " ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED"
            ),
            &[&now, &limit],
        )
        .await?;
        if jobs.is_empty() {
            return Ok(0);
        }
        jobs.iter_mut().for_each(|job| transition::expire(job, now));
        self.move_to_history(&transaction, &jobs.iter().collect::<Vec<_>>()).await?;
        let events = jobs
            .iter()
            .flat_map(|job| [(EventKind::Expired, job), (EventKind::Discarded { reason: "expired" }, job)])
            .collect();
        self.record(&transaction, now, events).await?;
        transaction.commit().await.map_err(database)?;
        Ok(jobs.len())
    }

    /// Writes a changed job back: its row updated while in flight, or moved
    /// to the history once finished.
    pub(super) async fn store(&self, transaction: &Transaction<'_>, job: &Job) -> Result<(), EngineError> {
        if job.state.is_terminal() {
            return self.move_to_history(transaction, &[job]).await;
        }
        update_row(transaction, job).await
    }

    /// Moves finished jobs to the history; the workflows of those that
    /// belong to one move on (`workflows.rs`), in the same transaction.
    pub(super) async fn move_to_history(
        &self,
        transaction: &Transaction<'_>,
        jobs: &[&Job],
    ) -> Result<(), EngineError> {
        let waiters = move_rows(transaction, jobs).await?;
        if !waiters.is_empty() {
            let at = jobs.iter().map(|job| finished_at(job)).max().unwrap_or_default();
            self.start_waiters(transaction, at, &waiters).await?;
        }
        if jobs.iter().any(|job| job.workflow().is_some()) {
            self.workflow_jobs_ended(transaction, jobs).await?;
        }
        Ok(())
    }
}

impl PgJobs {
    /// Starts the cron runs that waited for jobs just ended
    /// (`overlap_policy: "enqueue"`): `scheduled` until their time, else
    /// available.
    pub(super) async fn start_waiters(
        &self,
        transaction: &Transaction<'_>,
        at: Millis,
        waiters: &[String],
    ) -> Result<(), EngineError> {
        if waiters.is_empty() {
            return Ok(());
        }
        let mut started = lock_in_flight(transaction, waiters).await?;
        started.retain(|job| job.state == JobState::Pending);
        for job in &mut started {
            transition::activate(job, at);
            update_row(transaction, job).await?;
        }
        let scheduled = started.iter().filter(|job| job.state == JobState::Scheduled);
        let events = scheduled.map(|job| (EventKind::Scheduled, job)).collect();
        notify_available(transaction, &started).await?;
        self.record(transaction, at, events).await
    }
}

/// Writes an unfinished job's row back, its claim (if any) in `body`
/// again: the claim's columns cleared.
pub(super) async fn update_row(transaction: &Transaction<'_>, job: &Job) -> Result<(), EngineError> {
    let id = job.id.to_string();
    let lease = if job.state == JobState::Active { transition::claim_ends(job) } else { None };
    let worker = job.run().worker_id.as_deref();
    transaction
        .run(
            concat!(
                "UPDATE svc_jobs SET state = $2, priority = $3, ready_at = ",
                ts!("$4"),
                ", attempt = $5, claim = CASE WHEN $2 = 'active' THEN claim END, lease_until = ",
                ts!("$6"),
                ", worker_id = $7, body = $8, claimed_ms = NULL, visible_until_ms = NULL, \
                 visibility_ms = $9, timeout_ms = $10 WHERE id = $1::text::uuid"
            ),
            &[
                &id,
                &job.state.as_str(),
                &i16::from(job.priority),
                &ready_at(job),
                &(job.attempt as i32),
                &lease,
                &worker,
                &encode(job),
                &(job.visibility_timeout_ms as i64),
                &(job.timeout_ms as i64),
            ],
        )
        .await
        .map_err(database)?;
    Ok(())
}

/// The job locked for this transaction, when it is in the hot table.
pub(super) async fn locked(transaction: &Transaction<'_>, id: JobId) -> Result<Option<Job>, EngineError> {
    let key = id.to_string();
    let row = transaction
        .maybe_row(concat!("SELECT ", job_columns!(), " FROM svc_jobs WHERE id = $1::text::uuid FOR UPDATE"), &[&key])
        .await
        .map_err(database)?;
    row.map(|row| job_of(&row)).transpose()
}

/// Runs the rest of the transaction's statements on their generic plans.
/// The merged claims and acks select by primary key from arrays whose
/// length changes with every merge, so PostgreSQL would plan them again
/// each time (docs/postgres.md, "Merged statements"); their generic plan is
/// the same index scan, whatever the length. Sent pipelined with the
/// statement after it, it adds no round trip.
pub(super) async fn generic_plans(transaction: &Transaction<'_>) -> Result<(), EngineError> {
    transaction.batch_execute("SET LOCAL plan_cache_mode = force_generic_plan").await.map_err(database)
}

/// The due jobs a timer's `query` selects and locks, the query planned at
/// this execution. The leader's timers select due jobs through partial
/// indexes; a plan cached while `svc_jobs` was empty (a new database) reads
/// the whole table and sorts it, and stays cached until the table is
/// analyzed (docs/perf-log.md). Planned afresh, the query sees the table's
/// size and takes the index. The setting is sent pipelined with the query,
/// and put back (when there are jobs to write) before the statements that
/// follow, which keep their cached plans.
async fn due_jobs(transaction: &Transaction<'_>, query: &str, params: Params<'_>) -> Result<Vec<Job>, EngineError> {
    let custom =
        async { transaction.batch_execute("SET LOCAL plan_cache_mode = force_custom_plan").await.map_err(database) };
    let (_, jobs) = tokio::try_join!(custom, locked_jobs(transaction, query, params))?;
    if !jobs.is_empty() {
        transaction.batch_execute("SET LOCAL plan_cache_mode TO DEFAULT").await.map_err(database)?;
    }
    Ok(jobs)
}

/// The jobs in flight among `ids`, locked in id order: the order every
/// transaction locks jobs in, so that two never wait on each other in a
/// circle.
pub(super) async fn lock_in_flight(transaction: &Transaction<'_>, ids: &[String]) -> Result<Vec<Job>, EngineError> {
    let rows = transaction
        .rows(
            concat!(
                "SELECT ",
                job_columns!(),
                " FROM svc_jobs WHERE id = ANY($1::text[]::uuid[]) ORDER BY id FOR UPDATE"
            ),
            &[&ids],
        )
        .await
        .map_err(database)?;
    rows.iter().map(job_of).collect()
}

/// The job, when it has finished.
pub(super) async fn finished(transaction: &Transaction<'_>, id: JobId) -> Result<Option<Job>, EngineError> {
    let key = id.to_string();
    let row = transaction
        .maybe_row("SELECT body FROM svc_job_history WHERE id = $1::text::uuid LIMIT 1", &[&key])
        .await
        .map_err(database)?;
    row.map(|row| decode(&key, row.get(0))).transpose()
}

/// Takes a discarded job out of the history (the dead letter listing).
async fn take_discarded(transaction: &Transaction<'_>, id: JobId) -> Result<Job, EngineError> {
    let key = id.to_string();
    let row = transaction
        .maybe_row(
            "DELETE FROM svc_job_history WHERE id = $1::text::uuid AND state = 'discarded' RETURNING body",
            &[&key],
        )
        .await
        .map_err(database)?;
    let Some(row) = row else { return Err(EngineError::NotInDeadLetter { id }) };
    decode(&key, row.get(0))
}

/// Moves finished jobs' rows from `svc_jobs` to `svc_job_history`: one
/// `DELETE` and one `INSERT`, sent together (pipelined). Answers the cron
/// runs that waited for them (`waiter`), to be started.
pub(super) async fn move_rows(transaction: &Transaction<'_>, jobs: &[&Job]) -> Result<Vec<String>, EngineError> {
    let ids: Vec<String> = jobs.iter().map(|job| job.id.to_string()).collect();
    let queues: Vec<&str> = jobs.iter().map(|job| job.queue.as_str()).collect();
    let types: Vec<&str> = jobs.iter().map(|job| job.payload.job_type()).collect();
    let states: Vec<&str> = jobs.iter().map(|job| job.state.as_str()).collect();
    let times: Vec<i64> = jobs.iter().map(|job| finished_at(job)).collect();
    let bodies: Vec<Vec<u8>> = jobs.iter().map(|job| encode(job)).collect();
    let (delete_params, move_params): (Params<'_>, Params<'_>) =
        (&[&ids], &[&ids, &queues, &types, &states, &times, &bodies]);
    let (waiters, _) = tokio::try_join!(
        transaction
            .rows("DELETE FROM svc_jobs WHERE id = ANY($1::text[]::uuid[]) RETURNING waiter::text", delete_params),
        transaction.run(
            "INSERT INTO svc_job_history (id, queue, type, state, finished_at, body) \
             SELECT t.id::uuid, t.queue, t.type, t.state, to_timestamp(t.at::float8 / 1000), t.body \
             FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::bytea[]) \
               AS t(id, queue, type, state, at, body)",
            move_params,
        ),
    )
    .map_err(database)?;
    Ok(waiters.iter().filter_map(|row| row.get::<_, Option<String>>(0)).collect())
}

/// The jobs a locking query selects, as rows of [`job_columns`].
async fn locked_jobs(
    transaction: &Transaction<'_>,
    query: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<Job>, EngineError> {
    let rows = transaction.rows(query, params).await.map_err(database)?;
    rows.iter().map(job_of).collect()
}

/// Tells every node's listener, once per queue and in one statement, that
/// the available ones of `jobs` can be claimed, when the transaction commits.
pub(super) async fn notify_available(client: &impl GenericClient, jobs: &[Job]) -> Result<(), EngineError> {
    let mut queues: Vec<&str> =
        jobs.iter().filter(|job| job.state == JobState::Available).map(|job| job.queue.as_str()).collect();
    queues.sort_unstable();
    queues.dedup();
    if queues.is_empty() {
        return Ok(());
    }
    client
        .run("SELECT pg_notify($1, queue) FROM unnest($2::text[]) AS queue", &[&CHANNEL, &queues])
        .await
        .map_err(database)?;
    Ok(())
}

/// Which of `ids` a unique violation names, when the error is one (two
/// requests enqueuing the same client id at once).
pub(super) fn duplicate_of(error: &tokio_postgres::Error, ids: &[String]) -> Option<usize> {
    let db = error.as_db_error()?;
    if db.code() != &tokio_postgres::error::SqlState::UNIQUE_VIOLATION {
        return None;
    }
    let detail = db.detail().unwrap_or_default();
    Some(ids.iter().position(|id| detail.contains(id.as_str())).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_fetch_looks_again_only_when_a_window_of_its_own_queues_opens() {
        // The pool connects lazily: nothing here reaches a database.
        let pool = super::super::connect(&super::super::PgSettings::new("postgres://127.0.0.1:1/none")).unwrap();
        let jobs = PgJobs::new(pool);
        let queues = |names: &[&str]| names.iter().map(|name| name.to_string()).collect::<Vec<_>>();
        let ms = std::time::Duration::from_millis;
        jobs.window_opens_at(1_000, "mail".into(), 3_000);
        jobs.window_opens_at(1_000, "mail".into(), 2_500);
        jobs.window_opens_at(1_000, "sms".into(), 4_000);
        assert_eq!(jobs.until_a_window_opens(1_000, &queues(&["reports"])), None);
        assert_eq!(jobs.until_a_window_opens(1_000, &queues(&["reports", "sms"])), Some(ms(3_000)));
        assert_eq!(jobs.until_a_window_opens(1_000, &queues(&["sms", "mail"])), Some(ms(1_500)));
        // Once past, a window is forgotten.
        assert_eq!(jobs.until_a_window_opens(2_500, &queues(&["mail"])), None);
        jobs.window_opens_at(3_000, "reports".into(), 3_500);
        assert_eq!(jobs.window_opens_at.lock().unwrap().len(), 2, "mail's time had passed");
    }
}
