//! Enqueues on PostgreSQL, merged (docs/postgres.md, "Merged statements"):
//! the enqueue requests a node has waiting (one job or a batch each) are
//! stored by one transaction, and each is still accepted or refused whole,
//! on its own.
//!
//! Requests of plain jobs (fresh ids, no unique policy) are first tried as
//! one statement that stores them only if none of their queues is paused or
//! bounded (`enqueue_plain`); otherwise (or if the statement is rolled back
//! in a deadlock), and for other requests, the checked transaction runs. It
//! reads what every request is checked against at once: the jobs holding
//! the fingerprints of unique jobs (the fingerprints locked, `unique.rs`),
//! the settings of their queues (recording new queues), the client ids
//! already in use, and the depth of bounded queues (their rows locked). The
//! requests are then checked in the order they came, each job as one
//! request alone would be (paused queue, id in use, unique policy,
//! backpressure; an accepted request counts toward the next ones), the
//! accepted jobs are inserted with one statement, and the holders a
//! `replace` policy gave up are cancelled. Should that insert still meet an
//! id taken meanwhile by another node, the transaction is dropped and each
//! request runs alone, so that only the request with the duplicate fails. A
//! lone request goes the same way, as a batch of one.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;

use super::events::{EventRows, insert_events};
use super::jobs::{PgJobs, database, duplicate_of, encode, notify_available, ready_at, unique_key};
use super::queues::{Settings, settings};
use super::sql::{Params, Prepared};
use super::wakeup::CHANNEL;
use crate::clock::Millis;
use crate::engine::{Backpressure, EngineError, Enqueued, EventKind, Unavailable};
use crate::job::{Job, JobId, JobState, OnConflict};

/// One enqueue request, its jobs admitted (ids, times, first state).
pub(super) struct PendingEnqueue {
    pub now: Millis,
    pub jobs: Vec<Job>,
    /// The ids among them the client chose. Only those can already be in
    /// use: a fresh id is a UUIDv7 no other job was given.
    pub chosen_ids: Vec<String>,
}

/// What the merged transaction read, that each request is checked against;
/// an accepted request adds to it, so that the next ones count it.
struct Known {
    paused: HashSet<String>,
    bounded: HashMap<String, Backpressure>,
    /// Waiting jobs of each bounded queue.
    depths: HashMap<String, u64>,
    /// Ids in use.
    taken: HashSet<String>,
    /// Jobs holding the fingerprints the requests name.
    holders: Vec<Arc<Job>>,
    /// Holders a `replace` policy gave up.
    replaced: HashSet<JobId>,
}

/// What one job of an accepted request comes to.
enum Slot {
    /// Stored, with how full its queue is after the request.
    New(Option<f64>),
    /// Not stored: a job holding its fingerprint answers (`ignore`).
    Existing(Arc<Job>),
}

/// Why a request is refused, checked job by job as the local engine checks
/// it alone (paused queue, id in use, unique policy, backpressure); else
/// what each of its jobs comes to.
fn check(jobs: &[Job], now: Millis, known: &mut Known) -> Result<Vec<Slot>, EngineError> {
    let index_of = |position: usize| (jobs.len() > 1).then_some(position);
    let mut depths = known.depths.clone();
    let mut seen = HashSet::new();
    let mut held: Vec<Arc<Job>> = Vec::new();
    let mut replaced = known.replaced.clone();
    let mut slots = Vec::with_capacity(jobs.len());
    for (position, job) in jobs.iter().enumerate() {
        let index = index_of(position);
        if known.paused.contains(job.queue.as_str()) {
            return Err(EngineError::QueuePaused { queue: job.queue.to_string(), index });
        }
        let id = job.id.to_string();
        if known.taken.contains(&id) || !seen.insert(id) {
            return Err(EngineError::Duplicate { id: job.id, index });
        }
        let candidates = known.holders.iter().chain(&held);
        if let Some((on_conflict, holders)) = super::unique::blocking(job, now, candidates, &replaced) {
            match on_conflict {
                OnConflict::Reject => {
                    let (existing, existing_state) = (holders[0].id, holders[0].state);
                    let key = job.unique().expect("a job with a unique policy").1;
                    return Err(EngineError::UniqueConflict { existing, existing_state, key, index });
                }
                OnConflict::Ignore => {
                    slots.push(Slot::Existing(holders[0].clone()));
                    continue;
                }
                OnConflict::Replace => {
                    let given_up: Vec<JobId> = holders.iter().map(|holder| holder.id).collect();
                    replaced.extend(given_up);
                }
            }
        }
        if let Some(bound) = known.bounded.get(job.queue.as_str()) {
            let depth = depths.entry(job.queue.to_string()).or_default();
            if *depth >= bound.max_depth {
                let (queue, depth, bound) = (job.queue.to_string(), *depth, bound.max_depth);
                return Err(EngineError::QueueFull { queue, depth, bound, index });
            }
            *depth += 1;
        }
        if job.unique().is_some() {
            held.push(Arc::new(job.clone()));
        }
        slots.push(Slot::New(None));
    }
    for (job, slot) in jobs.iter().zip(&mut slots) {
        if let Slot::New(pressure) = slot {
            let bound = known.bounded.get(job.queue.as_str());
            *pressure = bound.and_then(|bound| bound.pressure(depths[job.queue.as_str()]));
        }
    }
    known.depths = depths;
    known.taken.extend(jobs.iter().map(|job| job.id.to_string()));
    known.holders.extend(held);
    known.replaced = replaced;
    Ok(slots)
}

impl PgJobs {
    /// Stores waiting enqueue requests with one statement or one checked
    /// transaction; answers each request's outcome, in order. A lone
    /// request is a batch of one.
    pub(super) async fn enqueue_batch(
        &self,
        requests: Vec<PendingEnqueue>,
    ) -> Result<Vec<Result<Vec<Enqueued>, EngineError>>, EngineError> {
        let plain = |request: &PendingEnqueue| {
            request.chosen_ids.is_empty() && request.jobs.iter().all(|job| job.unique().is_none())
        };
        if requests.iter().all(plain) {
            match self.enqueue_plain(&requests).await {
                Ok(Some(outcomes)) => return Ok(outcomes),
                Ok(None) => {}
                // Caught in a deadlock (with the first bound being set, say),
                // the statement stored nothing: the checked path waits instead.
                Err(EngineError::Unavailable { reason: Unavailable::Contention }) => {}
                Err(error) => return Err(error),
            }
        }
        match self.enqueue_merged(&requests).await? {
            Ok(outcomes) => Ok(outcomes),
            Err(raced) if requests.len() == 1 => {
                let jobs = &requests[0].jobs;
                let position = jobs.iter().position(|job| job.id == raced).unwrap_or(0);
                Ok(vec![Err(EngineError::Duplicate { id: raced, index: (jobs.len() > 1).then_some(position) })])
            }
            Err(_) => {
                // An id was taken meanwhile: each request alone.
                let mut outcomes = Vec::with_capacity(requests.len());
                for request in requests {
                    outcomes.extend(Box::pin(self.enqueue_batch(vec![request])).await?);
                }
                Ok(outcomes)
            }
        }
    }

    /// The events of jobs stored at their request's time: `job.enqueued`,
    /// and `job.scheduled` for a job scheduled for later. Their ids are
    /// made in one hold of the generator, so that a batch's follow each
    /// other and its `job.enqueued` events are written as runs.
    fn enqueue_events<'a>(
        &self,
        stored: impl Iterator<Item = (Millis, &'a Job)>,
    ) -> Vec<(JobId, Millis, EventKind, Option<&'a Job>)> {
        let mut events = Vec::new();
        let mut ids = self.id_generator();
        for (now, job) in stored {
            events.push((ids.next(now, rand::random()), now, EventKind::Enqueued, Some(job)));
            if job.state == JobState::Scheduled {
                events.push((ids.next(now, rand::random()), now, EventKind::Scheduled, Some(job)));
            }
        }
        events
    }

    /// Plain requests (fresh ids, no unique policy) in one statement, its
    /// own transaction: one round trip to the database, where the merged
    /// transaction takes four. Such a request can only be refused by a
    /// paused or bounded queue, so the statement stores the jobs and their
    /// events only when none of their queues is either; else it stores
    /// nothing, and `None` sends the requests to the merged transaction.
    async fn enqueue_plain(
        &self,
        requests: &[PendingEnqueue],
    ) -> Result<Option<Vec<Result<Vec<Enqueued>, EngineError>>>, EngineError> {
        let jobs = requests.iter().flat_map(|request| request.jobs.iter());
        let mut names: Vec<&str> = jobs.clone().map(|job| job.queue.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let events =
            self.enqueue_events(requests.iter().flat_map(|request| request.jobs.iter().map(|job| (request.now, job))));
        let (job_rows, event_rows) = (JobRows::of(jobs), EventRows::of(&events));
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(22);
        params.extend(job_rows.params());
        params.extend(event_rows.params());
        params.extend([&names as &(dyn ToSql + Sync), &CHANNEL]);
        let client = self.client().await?;
        let rows = client
            .rows(
                concat!(
                    "WITH known AS (INSERT INTO svc_queues (name) SELECT unnest($21::text[]) ON CONFLICT DO NOTHING), \
                     special AS (SELECT 1 FROM svc_queues WHERE name = ANY($21) AND (paused OR max_depth IS NOT NULL)), \
                     stored AS (",
                    insert_jobs!(),
                    " WHERE NOT EXISTS (SELECT 1 FROM special) RETURNING queue, state), \
                     recorded AS (",
                    insert_events!("$14", "$15", "$16", "$17", "$18", "$19", "$20"),
                    " WHERE NOT EXISTS (SELECT 1 FROM special)) \
                     SELECT false FROM special \
                     UNION ALL SELECT pg_notify($22, queue) IS NOT NULL \
                       FROM (SELECT DISTINCT queue FROM stored WHERE state = 'available') AS woken"
                ),
                &params,
            )
            .await
            .map_err(database)?;
        // A paused or bounded queue: nothing was stored.
        if rows.iter().any(|row| !row.get::<_, bool>(0)) {
            return Ok(None);
        }
        let enqueued = |job: &Job| Enqueued { job: Arc::new(job.clone()), deduplicated: false, pressure: None };
        Ok(Some(requests.iter().map(|request| Ok(request.jobs.iter().map(enqueued).collect())).collect()))
    }

    /// The merged transaction; `Err` with the id its insert met taken
    /// meanwhile by another transaction (nothing was stored).
    async fn enqueue_merged(
        &self,
        requests: &[PendingEnqueue],
    ) -> Result<Result<Vec<Result<Vec<Enqueued>, EngineError>>, JobId>, EngineError> {
        let all: Vec<&Job> = requests.iter().flat_map(|request| &request.jobs).collect();
        let mut names: Vec<&str> = all.iter().map(|job| job.queue.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let chosen: Vec<&String> = requests.iter().flat_map(|request| &request.chosen_ids).collect();
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let holders = super::unique::lock_and_read_holders(&transaction, all.iter().copied()).await?;
        let (names_param, chosen_param): (Params<'_>, Params<'_>) = (&[&names], &[&chosen]);
        let (rows, taken) = tokio::try_join!(
            transaction.rows(
                "WITH known AS (INSERT INTO svc_queues (name) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING) \
                 SELECT name, paused, max_depth, warning_threshold FROM svc_queues \
                 WHERE name = ANY($1) AND (paused OR max_depth IS NOT NULL)",
                names_param,
            ),
            async {
                if chosen.is_empty() {
                    return Ok(Vec::new());
                }
                transaction
                    .rows(
                        "SELECT id::text AS id_text FROM svc_jobs WHERE id = ANY($1::text[]::uuid[]) \
                         UNION ALL SELECT id::text AS id_text FROM svc_job_history WHERE id = ANY($1::text[]::uuid[])",
                        chosen_param,
                    )
                    .await
            },
        )
        .map_err(database)?;
        let taken: HashSet<String> = taken.iter().map(|row| row.get(0)).collect();
        let (mut paused, mut bounded) = (HashSet::new(), HashMap::new());
        for row in &rows {
            let name: String = row.get("name");
            let Settings { paused: is_paused, backpressure } = settings(row);
            if is_paused {
                paused.insert(name);
            } else if let Some(bound) = backpressure {
                bounded.insert(name, bound);
            }
        }
        let mut depths: HashMap<String, u64> = HashMap::new();
        if !bounded.is_empty() {
            let mut locked: Vec<&str> = bounded.keys().map(String::as_str).collect();
            locked.sort_unstable();
            transaction
                .run("SELECT 1 FROM svc_queues WHERE name = ANY($1) ORDER BY name FOR UPDATE", &[&locked])
                .await
                .map_err(database)?;
            // The depths the database keeps (schema version 15): read
            // after the rows' locks, they count every enqueue before.
            let rows = transaction
                .rows(
                    "SELECT queue, sum(delta)::int8 FROM svc_queue_depths WHERE queue = ANY($1) GROUP BY queue",
                    &[&locked],
                )
                .await
                .map_err(database)?;
            depths = rows.iter().map(|row| (row.get::<_, String>(0), row.get::<_, i64>(1).max(0) as u64)).collect();
        }
        let mut known = Known { paused, bounded, depths, taken, holders, replaced: HashSet::new() };
        let checked: Vec<_> = requests.iter().map(|request| check(&request.jobs, request.now, &mut known)).collect();
        // The jobs stored: those of accepted requests not answered by a holder.
        let accepted: Vec<(Millis, &Job)> = requests
            .iter()
            .zip(&checked)
            .filter_map(|(request, outcome)| Some((request, outcome.as_ref().ok()?)))
            .flat_map(|(request, slots)| {
                let stored = request.jobs.iter().zip(slots).filter(|(_, slot)| matches!(slot, Slot::New(_)));
                stored.map(|(job, _)| (request.now, job))
            })
            .collect();
        if !accepted.is_empty() {
            let jobs: Vec<Job> = accepted.iter().map(|(_, job)| (*job).clone()).collect();
            let ids: Vec<String> = jobs.iter().map(|job| job.id.to_string()).collect();
            let events = self.enqueue_events(accepted.iter().copied());
            // Sent together (pipelined), as one step of the transaction.
            let inserted = tokio::try_join!(
                async { insert(&transaction, &jobs).await.map_err(Some) },
                async { notify_available(&transaction, &jobs).await.map_err(|_| None) },
                async { super::events::append(&transaction, &events).await.map_err(Some) },
            );
            match inserted {
                Ok(_) => {}
                Err(Some(error)) if let Some(position) = duplicate_of(&error, &ids) => {
                    return Ok(Err(jobs[position].id));
                }
                Err(Some(error)) => return Err(database(error)),
                Err(None) => return Err(EngineError::Unavailable { reason: crate::engine::Unavailable::Database }),
            }
        }
        // Holders a `replace` gave up, stored before or just now, are cancelled.
        if !known.replaced.is_empty() {
            let now = requests.iter().map(|request| request.now).max().unwrap_or_default();
            let replaced: Vec<JobId> = known.replaced.iter().copied().collect();
            self.cancel_replaced(&transaction, now, &replaced).await?;
        }
        transaction.commit().await.map_err(database)?;
        let outcomes = requests
            .iter()
            .zip(checked)
            .map(|(request, outcome)| {
                outcome.map(|slots| {
                    let answer = |(job, slot): (&Job, Slot)| match slot {
                        Slot::New(pressure) => Enqueued { job: Arc::new(job.clone()), deduplicated: false, pressure },
                        Slot::Existing(holder) => Enqueued { job: holder, deduplicated: true, pressure: None },
                    };
                    request.jobs.iter().zip(slots).map(answer).collect()
                })
            })
            .collect();
        Ok(Ok(outcomes))
    }
}

/// The `INSERT` of new jobs from the thirteen arrays of [`JobRows`], bound
/// to `$1` to `$13` (a macro, so that a statement of several parts can
/// include it).
macro_rules! insert_jobs {
    () => {
        "INSERT INTO svc_jobs (id, queue, type, state, priority, ready_at, attempt, created_at, body, \
         unique_key, dispatch_key, expires_at, visibility_ms, timeout_ms) \
         SELECT t.id::uuid, t.queue, t.type, t.state, t.priority, to_timestamp(t.ready::float8 / 1000), 0, \
           to_timestamp(t.created::float8 / 1000), t.body, t.key, t.limit_key, to_timestamp(t.expires::float8 / 1000), \
           t.visibility, t.timeout \
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int2[], $6::int8[], $7::int8[], \
           $8::bytea[], $9::bytea[], $10::text[], $11::int8[], $12::int8[], $13::int8[]) \
           AS t(id, queue, type, state, priority, ready, created, body, key, limit_key, expires, visibility, timeout)"
    };
}
pub(super) use insert_jobs;

/// New jobs as the columns of [`insert_jobs`].
pub(super) struct JobRows<'a> {
    ids: Vec<String>,
    queues: Vec<&'a str>,
    types: Vec<&'a str>,
    states: Vec<&'static str>,
    priorities: Vec<i16>,
    ready: Vec<Millis>,
    created: Vec<Millis>,
    bodies: Vec<Vec<u8>>,
    keys: Vec<Option<Vec<u8>>>,
    limits: Vec<Option<&'a str>>,
    expiries: Vec<Option<Millis>>,
    visibilities: Vec<i64>,
    timeouts: Vec<i64>,
}

impl<'a> JobRows<'a> {
    pub(super) fn of(jobs: impl Iterator<Item = &'a Job> + Clone) -> JobRows<'a> {
        JobRows {
            ids: jobs.clone().map(|job| job.id.to_string()).collect(),
            queues: jobs.clone().map(|job| job.queue.as_str()).collect(),
            types: jobs.clone().map(|job| job.payload.job_type()).collect(),
            states: jobs.clone().map(|job| job.state.as_str()).collect(),
            priorities: jobs.clone().map(|job| i16::from(job.priority)).collect(),
            ready: jobs.clone().map(ready_at).collect(),
            created: jobs.clone().map(|job| job.created_at).collect(),
            bodies: jobs.clone().map(encode).collect(),
            keys: jobs.clone().map(unique_key).collect(),
            limits: jobs.clone().map(|job| job.limit_and_key().map(|(_, key)| key)).collect(),
            expiries: jobs.clone().map(Job::expires_at).collect(),
            visibilities: jobs.clone().map(|job| job.visibility_timeout_ms as i64).collect(),
            timeouts: jobs.map(|job| job.timeout_ms as i64).collect(),
        }
    }

    /// The parameters, in the order [`insert_jobs`] names them.
    pub(super) fn params(&self) -> [&(dyn ToSql + Sync); 13] {
        [
            &self.ids,
            &self.queues,
            &self.types,
            &self.states,
            &self.priorities,
            &self.ready,
            &self.created,
            &self.bodies,
            &self.keys,
            &self.limits,
            &self.expiries,
            &self.visibilities,
            &self.timeouts,
        ]
    }
}

/// Inserts new jobs in one statement.
pub(super) async fn insert(client: &impl GenericClient, jobs: &[Job]) -> Result<u64, tokio_postgres::Error> {
    client.run(insert_jobs!(), &JobRows::of(jobs.iter()).params()).await
}
