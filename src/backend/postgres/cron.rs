//! Cron on PostgreSQL (docs/postgres.md, "Cron"): entries in `svc_crons`,
//! fired by the node holding the leader lease.
//!
//! A firing is one transaction: it locks the due entry, records the firing
//! in `svc_cron_firings` under its primary key (entry, nominal time),
//! creates the job and moves the entry to its next time. A firing is thus
//! made once whichever node makes it, and one whose leader died before
//! committing is made by the next leader. Registration and the firing's
//! decisions (the slot after downtime, the overlap policy) are the local
//! engine's own functions, so both backends fire alike.

use std::sync::Arc;

use deadpool_postgres::GenericClient;

use super::enqueues::insert;
use super::jobs::{PgJobs, database, lock_in_flight, notify_available};
use super::sql::{Prepared, from_body, to_body};
use crate::backend::Page;
use crate::clock::Millis;
use crate::cron::{CronDefinition, OverlapPolicy};
use crate::engine::{CronEntry, CronInfo, CronSkip, CronWrite, EngineError, EventKind, register_cron};
use crate::job::OnConflict;
use crate::job::{Job, JobId, JobState, transition};
use crate::limits::CRON_MISSED_COUNT_MAX;

/// The advisory lock registrations hold (`svc_cron` as eight bytes), so that
/// two registrations of one new name, or past the entry cap, cannot race.
const REGISTRATION_LOCK: i64 = i64::from_be_bytes(*b"svc_cron");

/// How long a firing's row is kept after it was made.
const FIRINGS_KEPT_DAYS: i32 = 7;

fn encode(entry: &CronEntry) -> Vec<u8> {
    to_body(entry)
}

fn decode(name: &str, body: &[u8]) -> Result<CronEntry, EngineError> {
    from_body("cron entry", name, body)
}

/// The entry's part in the events of its firing.
fn info(entry: &CronEntry, scheduled_time: Millis) -> CronInfo {
    let definition = &entry.definition;
    CronInfo {
        name: definition.name.clone(),
        schedule: definition.schedule.clone(),
        timezone: definition.timezone.clone(),
        scheduled_time,
    }
}

fn skipped(entry: &CronEntry, at: Millis, reason: &'static str, existing: Option<JobId>) -> EventKind {
    EventKind::CronSkipped(Box::new(CronSkip {
        cron: info(entry, at),
        reason,
        existing_job_id: existing,
        missed_count: None,
    }))
}

impl PgJobs {
    /// Entries in name order after `after`, those with `enabled` as given.
    pub async fn crons_page(
        &self,
        after: Option<&str>,
        limit: usize,
        enabled: Option<bool>,
    ) -> Result<Page<Arc<CronEntry>>, EngineError> {
        let client = self.client().await?;
        let rows = client
            .rows(
                "SELECT name, body FROM svc_crons WHERE ($1::text IS NULL OR name > $1) \
                 AND ($2::bool IS NULL OR enabled = $2) ORDER BY name LIMIT $3",
                &[&after, &enabled, &(limit as i64 + 1)],
            )
            .await
            .map_err(database)?;
        let has_more = rows.len() > limit;
        let entries = rows.iter().take(limit).map(|row| decode(row.get(0), row.get(1)).map(Arc::new));
        Ok((entries.collect::<Result<_, _>>()?, has_more))
    }

    pub async fn cron(&self, name: &str) -> Result<Option<Arc<CronEntry>>, EngineError> {
        let client = self.client().await?;
        let row = client.maybe_row("SELECT body FROM svc_crons WHERE name = $1", &[&name]).await.map_err(database)?;
        row.map(|row| decode(name, row.get(0)).map(Arc::new)).transpose()
    }

    /// Registers an entry, replaces one, or changes one still at a
    /// revision; answers the entry and whether it is new.
    pub async fn cron_put(
        &self,
        now: Millis,
        definition: CronDefinition,
        write: CronWrite,
    ) -> Result<(Arc<CronEntry>, bool), EngineError> {
        // The template's args are checked when the entry is registered;
        // each firing only checks that the schema is still registered.
        if let Some(uri) = definition.schema() {
            self.check_args(vec![(None, uri.as_str(), definition.job.payload.args())]).await?;
        }
        let name = definition.name.clone();
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        transaction.run("SELECT pg_advisory_xact_lock($1)", &[&REGISTRATION_LOCK]).await.map_err(database)?;
        let existing = transaction
            .maybe_row("SELECT body FROM svc_crons WHERE name = $1", &[&name])
            .await
            .map_err(database)?
            .map(|row| decode(&name, row.get(0)))
            .transpose()?;
        let count: i64 = transaction.row("SELECT count(*) FROM svc_crons", &[]).await.map_err(database)?.get(0);
        let entry = register_cron(existing.as_ref(), count as usize, definition, write, now, self.max_cron)?;
        transaction
            .run(
                "INSERT INTO svc_crons (name, enabled, next_run_at, body) \
                 VALUES ($1, $2, to_timestamp($3::int8::float8 / 1000), $4) \
                 ON CONFLICT (name) DO UPDATE SET enabled = $2, next_run_at = excluded.next_run_at, body = $4",
                &[&name, &entry.definition.enabled, &entry.next_run_at, &encode(&entry)],
            )
            .await
            .map_err(database)?;
        transaction.commit().await.map_err(database)?;
        Ok((Arc::new(entry), existing.is_none()))
    }

    /// Removes an entry; jobs it already created are untouched.
    pub async fn cron_delete(&self, name: &str) -> Result<Arc<CronEntry>, EngineError> {
        let client = self.client().await?;
        let row = client
            .maybe_row("DELETE FROM svc_crons WHERE name = $1 RETURNING body", &[&name])
            .await
            .map_err(database)?;
        match row {
            Some(row) => Ok(Arc::new(decode(name, row.get(0))?)),
            None => Err(EngineError::CronNotFound { name: name.to_string() }),
        }
    }

    /// Fires the entries due at `now`, at most `limit`, each in a
    /// transaction of its own (the leader's timers); answers how many were
    /// fired. One transaction an entry keeps each firing's locks in the
    /// order every transaction takes them (the fingerprint, then the jobs
    /// in id order): two entries fired together would lock their previous
    /// runs in firing order. An entry whose firing failed is tried again
    /// after a delay that doubles with each failure (docs/postgres.md, "Cron").
    pub async fn fire_due_crons(&self, now: Millis, limit: i64) -> Result<usize, EngineError> {
        let held_back = self.cron_retries.held_back(now);
        let mut client = self.client().await?;
        let due: Vec<String> = client
            .rows(
                "SELECT name FROM svc_crons WHERE next_run_at <= to_timestamp($1::int8::float8 / 1000) \
                 AND NOT (name = ANY($3)) ORDER BY next_run_at LIMIT $2",
                &[&now, &limit, &held_back],
            )
            .await
            .map_err(database)?
            .iter()
            .map(|row| row.get(0))
            .collect();
        self.cron_retries.forget_all_but(&due, now);
        let mut fired = 0;
        for name in due {
            let transaction = client.transaction().await.map_err(database)?;
            // Still due, and not being fired by another node.
            let row = transaction
                .maybe_row(
                    "SELECT body FROM svc_crons WHERE name = $1 \
                     AND next_run_at <= to_timestamp($2::int8::float8 / 1000) FOR UPDATE SKIP LOCKED",
                    &[&name, &now],
                )
                .await
                .map_err(database)?;
            let Some(row) = row else { continue };
            // An entry that cannot be fired now (its transaction rolled
            // back) is tried again after a delay (`CronRetries`); the
            // entries due after it are fired meanwhile.
            let firing = match decode(&name, row.get(0)) {
                Ok(entry) => self.fire(&transaction, now, entry).await,
                Err(error) => Err(error),
            };
            if let Err(error) = firing {
                self.cron_retries.failed(&name, now, &error);
                continue;
            }
            transaction.commit().await.map_err(database)?;
            self.cron_retries.fired(&name);
            fired += 1;
        }
        Ok(fired)
    }

    /// One firing of a due entry, in the caller's transaction.
    async fn fire(
        &self,
        transaction: &deadpool_postgres::Transaction<'_>,
        now: Millis,
        entry: CronEntry,
    ) -> Result<(), EngineError> {
        let name = entry.definition.name.clone();
        // An entry that cannot be fired is left due, and held back between
        // tries like any failed firing.
        let cannot = |message: String| {
            let error = crate::job::ValidationError::request(Some("cron".to_string()), message);
            EngineError::Invalid { error, index: None }
        };
        let first_due = entry.next_run_at.ok_or_else(|| cannot("a due cron entry has no next time".to_string()))?;
        let schedule = entry
            .definition
            .compile()
            .map_err(|problem| cannot(format!("a due cron entry does not compile: {problem}")))?;
        let due = schedule.due_firing(first_due, now, CRON_MISSED_COUNT_MAX);
        let definition = entry.definition.clone();
        let id = self.fresh_id(now);
        let candidate = definition.fired_job(id, JobState::Available, now, due.scheduled);
        // Locks in the order enqueues and acks take them: the fingerprint
        // first (as an enqueue with a unique policy does), then the previous
        // run and the fingerprint's holders together, in id order (as acks
        // and `replace` do). Taken the other way round, a `replace` enqueue
        // of the same job at the same moment would wait on this firing while
        // it waited on the enqueue.
        let holders = super::unique::lock_and_read_holders(transaction, std::iter::once(&candidate)).await?;
        let mut ids: Vec<String> = holders.iter().map(|holder| holder.id.to_string()).collect();
        ids.extend(entry.last_job_id.map(|id| id.to_string()));
        let in_flight = if ids.is_empty() { Vec::new() } else { lock_in_flight(transaction, &ids).await? };
        let previous = entry.last_job_id.and_then(|id| in_flight.iter().find(|job| job.id == id).cloned());
        let candidate_key = candidate.unique().map(|(_, key)| key);
        let holders: Vec<Arc<Job>> = in_flight
            .into_iter()
            .filter(|job| candidate_key.is_some() && job.unique().map(|(_, key)| key) == candidate_key)
            .map(Arc::new)
            .collect();
        let paused: bool = transaction
            .maybe_row("SELECT paused FROM svc_queues WHERE name = $1", &[&definition.job.queue])
            .await
            .map_err(database)?
            .is_some_and(|row| row.get(0));
        let schema_missing = match definition.schema() {
            Some(uri) => !self.schema_registered(transaction, &uri).await?,
            None => false,
        };
        // What this firing does: skip, or enqueue (cancelling the previous
        // run first, or waiting for it to end).
        let mut waits_for = None;
        let (job, cancelled, skip) = match (previous, definition.overlap) {
            _ if schema_missing => (None, None, Some(skipped(&entry, due.scheduled, "schema_not_registered", None))),
            _ if paused => (None, None, Some(skipped(&entry, due.scheduled, "queue_paused", None))),
            (Some(previous), OverlapPolicy::Skip) => {
                (None, None, Some(skipped(&entry, due.scheduled, "overlap_skip", Some(previous.id))))
            }
            // At most one run waits behind the previous one.
            (Some(previous), OverlapPolicy::Enqueue) if previous.state == JobState::Pending => {
                (None, None, Some(skipped(&entry, due.scheduled, "overlap_skip", Some(previous.id))))
            }
            (Some(previous), OverlapPolicy::Enqueue) => {
                waits_for = Some(previous.id);
                (Some(definition.fired_job(id, JobState::Pending, now, due.scheduled)), None, None)
            }
            (previous, policy) => {
                let cancelled = previous.filter(|_| policy == OverlapPolicy::CancelPrevious);
                (Some(candidate), cancelled, None)
            }
        };
        // A job held under its unique policy: skipped as a duplicate, or
        // its holders cancelled (`replace`), as on the local engine.
        let (mut job, mut skip, mut replaced) = (job, skip, Vec::new());
        if let Some(fired) = job.as_ref().filter(|fired| fired.unique().is_some()) {
            let blocking = super::unique::blocking(fired, now, holders.iter(), &Default::default());
            match blocking {
                Some((OnConflict::Replace, holders)) => replaced = holders.iter().map(|holder| holder.id).collect(),
                Some((_, holders)) => {
                    skip = Some(skipped(&entry, due.scheduled, "duplicate", Some(holders[0].id)));
                    job = None;
                }
                None => {}
            }
        }
        let outcome = if job.is_some() { "enqueued" } else { "skipped" };
        let recorded = transaction
            .run(
                "INSERT INTO svc_cron_firings (name, scheduled_at, fired_at, outcome, job_id) \
                 VALUES ($1, to_timestamp($2::int8::float8 / 1000), to_timestamp($3::int8::float8 / 1000), $4, \
                 $5::text::uuid) ON CONFLICT DO NOTHING",
                &[&name, &due.scheduled, &now, &outcome, &job.as_ref().map(|job| job.id.to_string())],
            )
            .await
            .map_err(database)?;
        let mut updated = entry.clone();
        updated.next_run_at = due.next.map(|next| next.at);
        let mut events: Vec<(EventKind, Option<&Job>)> = Vec::new();
        let mut cancelled = cancelled;
        if recorded == 1 {
            if due.missed > 0 {
                let kind = EventKind::CronSkipped(Box::new(CronSkip {
                    cron: info(&entry, due.scheduled),
                    reason: "misfire",
                    existing_job_id: None,
                    missed_count: Some(due.missed),
                }));
                events.push((kind, None));
            }
            if let Some(previous) = cancelled.as_mut() {
                let previous_state = previous.state;
                transition::cancel(previous, now);
                self.store(transaction, previous).await?;
                events.push((EventKind::Cancelled { previous_state, reason: "cron_cancel_previous" }, None));
            }
            if let Some(job) = &job {
                insert(transaction, std::slice::from_ref(job)).await.map_err(database)?;
                if let Some(previous) = waits_for {
                    // Started when the previous run ends (`move_to_history`),
                    // even when that is the `replace` just below.
                    transaction
                        .run(
                            "UPDATE svc_jobs SET waiter = $2::text::uuid WHERE id = $1::text::uuid",
                            &[&previous.to_string(), &job.id.to_string()],
                        )
                        .await
                        .map_err(database)?;
                }
                self.cancel_replaced(transaction, now, &replaced).await?;
                notify_available(transaction, std::slice::from_ref(job)).await?;
                updated.run_count += 1;
                updated.last_run_at = Some(due.scheduled);
                updated.last_job_id = Some(job.id);
                let kind = EventKind::CronTriggered {
                    cron: Box::new(info(&entry, due.scheduled)),
                    run_count: updated.run_count,
                };
                events.push((kind, Some(job)));
                events.push((EventKind::Enqueued, Some(job)));
            }
            if let Some(kind) = skip {
                events.push((kind, None));
            }
            if let Some(gap) = due.next.and_then(|next| next.skipped_gap) {
                events.push((skipped(&entry, gap, "dst_skip", None), None));
            }
        } else {
            // Recorded by an earlier firing (a leader whose clock ran ahead):
            // only the entry moves on.
            tracing::warn!(name, scheduled = due.scheduled, "a cron firing was already recorded; not made again");
        }
        // The cancelled run's event carries the job as it now is.
        let events: Vec<_> = events
            .into_iter()
            .map(|(kind, job)| {
                let job = match kind {
                    EventKind::Cancelled { .. } => cancelled.as_ref(),
                    _ => job,
                };
                (self.fresh_id(now), now, kind, job)
            })
            .collect();
        super::events::append(transaction, &events).await.map_err(database)?;
        transaction
            .run(
                "UPDATE svc_crons SET next_run_at = to_timestamp($2::int8::float8 / 1000), body = $3 WHERE name = $1",
                &[&name, &updated.next_run_at, &encode(&updated)],
            )
            .await
            .map_err(database)?;
        Ok(())
    }

    /// Drops the records of firings made more than a week ago (the leader's housekeeping).
    pub async fn prune_firings(&self) -> Result<u64, EngineError> {
        let client = self.client().await?;
        client
            .run(
                "DELETE FROM svc_cron_firings WHERE fired_at < now() - make_interval(days => $1)",
                &[&FIRINGS_KEPT_DAYS],
            )
            .await
            .map_err(database)
    }
}

/// The first delay before a failed firing is tried again.
const RETRY_FIRST_MS: Millis = 100;
/// The longest delay between tries at a firing that keeps failing.
const RETRY_MAX_MS: Millis = 60_000;

/// Entries whose firing failed, held back from the leader's passes until
/// their next try: a delay of [`RETRY_FIRST_MS`] after the first failure,
/// doubled at each one after, up to [`RETRY_MAX_MS`]. So an entry that
/// cannot be fired (a stored form this binary does not read, or one that
/// does not compile) neither takes a place in every pass, ahead of the
/// entries due after it, nor logs a warning every pass: it warns at its
/// first failure, then at every try once its delay has reached the
/// longest. A failure caused by the moment (contention, a connection lost)
/// is tried again within a fraction of a second.
#[derive(Default)]
pub(super) struct CronRetries {
    failing: std::sync::Mutex<std::collections::HashMap<String, Failing>>,
}

struct Failing {
    failures: u32,
    retry_at: Millis,
}

impl CronRetries {
    fn failing(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Failing>> {
        self.failing.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The entries not to be tried at `now`.
    fn held_back(&self, now: Millis) -> Vec<String> {
        self.failing().iter().filter(|(_, failing)| failing.retry_at > now).map(|(name, _)| name.clone()).collect()
    }

    /// Forgets the entries whose try is due that are no longer due
    /// themselves (changed, fired elsewhere or removed).
    fn forget_all_but(&self, due: &[String], now: Millis) {
        self.failing().retain(|name, failing| failing.retry_at > now || due.contains(name));
    }

    fn failed(&self, name: &str, now: Millis, error: &EngineError) {
        let mut failing = self.failing();
        let entry = failing.entry(name.to_string()).or_insert(Failing { failures: 0, retry_at: now });
        entry.failures = entry.failures.saturating_add(1);
        let delay = RETRY_FIRST_MS.saturating_mul(1 << (entry.failures - 1).min(20)).min(RETRY_MAX_MS);
        entry.retry_at = now.saturating_add(delay);
        if entry.failures == 1 || delay == RETRY_MAX_MS {
            let failures = entry.failures;
            tracing::warn!(name, %error, failures, retry_in_ms = delay, "a cron firing failed; it is tried again");
        }
    }

    fn fired(&self, name: &str) {
        self.failing().remove(name);
    }
}
