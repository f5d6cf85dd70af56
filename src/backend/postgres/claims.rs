//! Claims (fetches) on PostgreSQL, merged (docs/postgres.md, "Merged
//! statements"): the fetches a node has waiting are claimed together.
//!
//! Fetches naming the same queues share one selection: the jobs are taken
//! in claim order (queue by queue as listed; in a queue by priority, then
//! time, then id) with `FOR UPDATE SKIP LOCKED`, so claims on other nodes
//! pass over them, and handed to the fetches in the order they came, each
//! up to its count. A claim is written as columns (`claimed_ms` and the
//! rest), the job's `body` left as it was (docs/postgres.md, "Claims as
//! columns").
//!
//! Fetches of one queue are first claimed by one statement
//! (`claim_at_once`): it selects, claims and writes the `job.started`
//! events, on the condition that none of the jobs it selects needs Rust's
//! judgement. Otherwise, and for fetches of several queues, the checked
//! transaction runs: it selects the jobs, discards those past their expiry
//! met on the way, leaves available those their dispatch limit holds back
//! (`dispatch.rs`), their key passed over for the rest of the claim (the
//! queue is then looked at again), and claims the rest with one `UPDATE`
//! and their events with one `INSERT`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use deadpool_postgres::Transaction;

use super::dispatch::Dispatch;
use super::events::claimed_header;
use super::jobs::{PgJobs, database, decode, generic_plans};
use super::sql::Prepared;
use crate::clock::Millis;
use crate::engine::{EngineError, EventKind, FetchRequest, Unavailable};
use crate::job::{Job, transition};

/// One fetch waiting to be merged.
pub(super) struct PendingClaim {
    pub now: Millis,
    pub request: FetchRequest,
}

/// How many jobs in line a claim that met jobs held back by their limits
/// reads ahead, to pass over the keys at their limit among them at once:
/// first a few, then twice as many each time, up to the most.
const LOOK_AHEAD_FIRST: i64 = 8;
const LOOK_AHEAD_MAX: i64 = 256;

/// What one claim transaction met so far: the ids it looked at, the jobs
/// it discarded as expired, and the dispatch limits it counted.
#[derive(Default)]
struct Met {
    taken: Vec<String>,
    expired: Vec<Job>,
    dispatch: Dispatch,
    /// By queue, limit keys whose next job there its limit holds back:
    /// passed over in that queue for the rest of the claim. By queue, as
    /// the local engine decides (a key may span queues, with other limits).
    blocked: HashMap<String, Vec<String>>,
}

/// The keys passed over in `queue` ([`Met::blocked`]).
fn blocked_in<'a>(blocked: &'a mut HashMap<String, Vec<String>>, queue: &str) -> &'a mut Vec<String> {
    blocked.entry(queue.to_string()).or_default()
}

/// Up to `wanted` available jobs of `queues`, in claim order, locked; the
/// jobs already met left out, and the new ones added to `met`. Expired jobs
/// met on the way are discarded, and jobs their dispatch limit holds back
/// are left as they are.
async fn select(
    store: &PgJobs,
    transaction: &Transaction<'_>,
    queues: &[String],
    wanted: usize,
    now: Millis,
    met: &mut Met,
) -> Result<Vec<Job>, EngineError> {
    let mut selected = Vec::new();
    for (position, queue) in queues.iter().enumerate() {
        if queues[..position].contains(queue) {
            continue;
        }
        let mut ahead = LOOK_AHEAD_FIRST;
        loop {
            let missing = (wanted - selected.len()) as i64;
            let blocked = blocked_in(&mut met.blocked, queue);
            let rows = transaction
                .rows(
                    // `id_text`, not `id`: ORDER BY `id` must name the uuid
                    // column, in the index's order, not the text.
                    concat!(
                        "SELECT ",
                        job_columns!(),
                        " FROM svc_jobs \
                     WHERE state = 'available' AND queue = $1 AND NOT (id = ANY($3::text[]::uuid[])) \
                       AND (dispatch_key IS NULL OR NOT (dispatch_key = ANY($4))) \
                       AND NOT EXISTS (SELECT 1 FROM svc_queues WHERE name = $1 AND paused) \
                     ORDER BY priority DESC, ready_at, id LIMIT $2 FOR UPDATE SKIP LOCKED"
                    ),
                    &[queue, &missing, &met.taken, &*blocked],
                )
                .await
                .map_err(database)?;
            let found = rows.len() as i64;
            let (mut passed_over, mut held_back) = (0, false);
            for row in rows {
                let mut job = job_of(&row)?;
                met.taken.push(job.id.to_string());
                // Past its expiry, a job is discarded, not handed out.
                if job.expires_at().is_some_and(|at| at <= now) {
                    transition::expire(&mut job, now);
                    store.store(transaction, &job).await?;
                    met.expired.push(job);
                    passed_over += 1;
                    continue;
                }
                // A job its limit holds back holds the jobs behind it under its key.
                let key = job.limit_and_key().map(|(_, key)| key.to_string());
                let held = key.as_ref().is_some_and(|key| blocked_in(&mut met.blocked, queue).contains(key));
                if !held && met.dispatch.allows(transaction, &job, now).await? {
                    selected.push(job);
                    continue;
                }
                if let Some(key) = key.filter(|_| !held) {
                    blocked_in(&mut met.blocked, queue).push(key);
                }
                (passed_over, held_back) = (passed_over + 1, true);
            }
            if passed_over == 0 || found < missing {
                break;
            }
            if held_back {
                block_keys_ahead(transaction, queue, ahead, now, met).await?;
                // Read further ahead each time jobs are held back still:
                // one key at its limit costs a short look, many a few.
                ahead = (2 * ahead).min(LOOK_AHEAD_MAX);
            }
        }
        if selected.len() == wanted {
            break;
        }
    }
    Ok(selected)
}

/// Passes over in `queue`, for the rest of the claim, every key whose next
/// job in line (among the next `ahead` jobs) its limit holds back, so that
/// a claim that met held jobs does not meet the next keys at their limit
/// one look at a time (docs/perf-log.md, "PostgreSQL: a claim past many
/// keys at their limit"). The jobs are read, not locked: none of them is
/// claimed here, and no other claim can take a limited job while this one
/// holds the dispatch lock, which it took at the first limited job it met.
async fn block_keys_ahead(
    transaction: &Transaction<'_>,
    queue: &String,
    ahead: i64,
    now: Millis,
    met: &mut Met,
) -> Result<(), EngineError> {
    let blocked = blocked_in(&mut met.blocked, queue);
    let rows = transaction
        .rows(
            "SELECT id::text AS id_text, body FROM (\
               SELECT id, body, dispatch_key, priority, ready_at FROM svc_jobs \
               WHERE state = 'available' AND queue = $1 AND NOT (id = ANY($3::text[]::uuid[])) \
                 AND (dispatch_key IS NULL OR NOT (dispatch_key = ANY($4))) \
               ORDER BY priority DESC, ready_at, id LIMIT $2) AS ahead \
             WHERE dispatch_key IS NOT NULL ORDER BY priority DESC, ready_at, id",
            &[queue, &ahead, &met.taken, &*blocked],
        )
        .await
        .map_err(database)?;
    let jobs = rows.iter().map(|row| decode(row.get(0), row.get(1))).collect::<Result<Vec<Job>, _>>()?;
    met.dispatch.load(transaction, &jobs, now).await?;
    let mut decided = HashSet::new();
    for job in &jobs {
        // An expired job holds nothing back: it is discarded when met.
        if job.expires_at().is_some_and(|at| at <= now) {
            continue;
        }
        let Some((_, key)) = job.limit_and_key() else { continue };
        if decided.insert(key) && met.dispatch.holds_back(job, now) {
            blocked_in(&mut met.blocked, queue).push(key.to_string());
        }
    }
    Ok(())
}

/// The columns a job in the hot table is read from, in the order
/// [`job_of`] takes them: its id, `body`, and the claim written as columns.
macro_rules! job_columns {
    () => {
        "id::text AS id_text, body, claimed_ms, visible_until_ms, worker_id"
    };
}
pub(super) use job_columns;

/// A job from a row of [`job_columns`], or of `(id, body)` alone (a
/// finished job). While `claimed_ms` is set, `body` is the job as it was
/// before its claim, which this applies (docs/postgres.md, "Claims as
/// columns"), exactly as the claim applied it to the job it answered.
pub(super) fn job_of(row: &tokio_postgres::Row) -> Result<Job, EngineError> {
    let mut job = decode(row.get(0), row.get(1))?;
    if row.len() == 5
        && let Some(at) = row.get::<_, Option<i64>>(2)
    {
        let visible_until = row.get::<_, Option<i64>>(3).unwrap_or(at);
        let runs_until = at.saturating_add(job.timeout_ms as i64);
        transition::claim(&mut job, at, row.get(4), visible_until, runs_until);
    }
    Ok(job)
}

/// Applies a claim at `at` by `worker_id` to `job`, holding it unseen for
/// `visibility_ms` (the job's own visibility timeout when `None`): what
/// every claim does, and what reading a claim written in SQL does again.
pub(super) fn apply_claim(job: &mut Job, at: Millis, worker_id: Option<String>, visibility_ms: Option<u64>) {
    let visibility = visibility_ms.unwrap_or(u64::from(job.visibility_timeout_ms));
    let (visible_until, runs_until) = (at.saturating_add(visibility as i64), at.saturating_add(job.timeout_ms as i64));
    transition::claim(job, at, worker_id, visible_until, runs_until);
}

/// How long a queue whose claim in one statement met a job that needs the
/// checked claim is claimed the checked way at once: a queue of jobs with
/// dispatch limits would otherwise pay for both at every fetch.
const CHECKED_FOR_MS: Millis = 1_000;

/// Queues claimed the checked way for now, with until when.
#[derive(Default)]
pub(super) struct CheckedQueues {
    until: std::sync::Mutex<std::collections::HashMap<String, Millis>>,
}

impl CheckedQueues {
    fn until(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Millis>> {
        self.until.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn checked(&self, queue: &str, now: Millis) -> bool {
        self.until().get(queue).is_some_and(|until| *until > now)
    }

    /// Claims of `queue` go the checked way for a while; the queues whose
    /// while has passed are forgotten.
    fn check(&self, queue: &str, now: Millis) {
        let mut until = self.until();
        until.retain(|_, until| *until > now);
        until.insert(queue.to_string(), now.saturating_add(CHECKED_FOR_MS));
    }
}

/// Jobs claimed, each with the fetch it goes to and its claim's token.
type Handed = Vec<(usize, Job, i64)>;

impl PgJobs {
    /// Runs waiting fetches; answers each fetch's jobs, in order.
    pub(super) async fn claim_batch(
        &self,
        claims: Vec<PendingClaim>,
    ) -> Result<Vec<Result<Vec<Arc<Job>>, EngineError>>, EngineError> {
        // Fetches of the same queues share a selection, first come first served.
        let mut groups: Vec<(&[String], Vec<usize>)> = Vec::new();
        for (index, claim) in claims.iter().enumerate() {
            match groups.iter_mut().find(|(queues, _)| *queues == claim.request.queues.as_slice()) {
                Some((_, members)) => members.push(index),
                None => groups.push((&claim.request.queues, vec![index])),
            }
        }
        let now = claims.iter().map(|claim| claim.now).max().unwrap_or_default();
        let contention = EngineError::Unavailable { reason: Unavailable::Contention };
        // Each statement commits on its own: what one claimed is answered
        // whatever becomes of the statements and the transaction after it,
        // and a failure answers the fetches it ran for alone.
        let mut failed: Vec<Option<EngineError>> = claims.iter().map(|_| None).collect();
        let mut handed = Handed::new();
        let mut checked = Vec::new();
        for (queues, members) in groups {
            let [queue] = queues else {
                checked.push((queues, members));
                continue;
            };
            if self.checked_queues.checked(queue, now) {
                checked.push((queues, members));
                continue;
            }
            match self.claim_at_once(&claims, queue, &members).await {
                Ok(Some(jobs)) => handed.extend(jobs),
                Ok(None) => {
                    self.checked_queues.check(queue, now);
                    checked.push((queues, members));
                }
                // Rolled back to break a deadlock: nothing was claimed.
                Err(error) if error == contention => checked.push((queues, members)),
                Err(error) => members.iter().for_each(|index| failed[*index] = Some(error.clone())),
            }
        }
        if !checked.is_empty() {
            match self.claim_checked(&claims, &checked).await {
                Ok(jobs) => handed.extend(jobs),
                Err(error) => {
                    for index in checked.iter().flat_map(|(_, members)| members) {
                        failed[*index] = Some(error.clone());
                    }
                }
            }
        }
        let mut answers: Vec<Vec<Arc<Job>>> = claims.iter().map(|_| Vec::new()).collect();
        let mut tokens = Vec::with_capacity(handed.len());
        for (index, job, token) in handed {
            let job = Arc::new(job);
            tokens.push((job.clone(), token));
            answers[index].push(job);
        }
        self.claimed.keep(tokens.into_iter());
        Ok(answers
            .into_iter()
            .zip(failed)
            .map(|(jobs, failed)| match failed {
                Some(error) => Err(error),
                None => Ok(jobs),
            })
            .collect())
    }

    /// Claims for the fetches `members` of `queue` with one statement,
    /// committed on its own, events included. `None` when a job it selected
    /// needs the checked transaction (it has a dispatch limit, is past its
    /// expiry, or was written before claims were columns): nothing was
    /// claimed then.
    async fn claim_at_once(
        &self,
        claims: &[PendingClaim],
        queue: &String,
        members: &[usize],
    ) -> Result<Option<Handed>, EngineError> {
        let now = members.iter().map(|index| claims[*index].now).max().unwrap_or_default();
        // One slot per job wanted, in the order the fetches came.
        let slots: Vec<usize> =
            members.iter().flat_map(|index| std::iter::repeat_n(*index, claims[*index].request.count)).collect();
        let times: Vec<Millis> = slots.iter().map(|index| claims[*index].now).collect();
        let workers: Vec<Option<&str>> =
            slots.iter().map(|index| claims[*index].request.worker_id.as_deref()).collect();
        let visibilities: Vec<Option<i64>> =
            slots.iter().map(|index| claims[*index].request.visibility_timeout_ms.map(|ms| ms as i64)).collect();
        let tokens: Vec<i64> = slots.iter().map(|_| rand::random::<i64>()).collect();
        let events: Vec<String> = slots.iter().map(|index| self.fresh_id(claims[*index].now).to_string()).collect();
        let headers: Vec<Vec<u8>> = slots
            .iter()
            .map(|index| {
                let request = &claims[*index].request;
                claimed_header(request.worker_id.as_deref(), request.visibility_timeout_ms)
            })
            .collect();
        let wanted = slots.len() as i64;
        let client = self.client().await?;
        let rows = client
            .rows(
                "WITH pick AS MATERIALIZED (\
                   SELECT id, priority, ready_at, dispatch_key IS NOT NULL OR visibility_ms IS NULL \
                     OR coalesce(expires_at <= to_timestamp($2::int8::float8 / 1000), false) AS special \
                   FROM svc_jobs WHERE state = 'available' AND queue = $1 \
                     AND NOT EXISTS (SELECT 1 FROM svc_queues WHERE name = $1 AND paused) \
                   ORDER BY priority DESC, ready_at, id LIMIT $3 FOR UPDATE SKIP LOCKED), \
                 ranked AS (SELECT id, row_number() OVER (ORDER BY priority DESC, ready_at, id) AS n FROM pick \
                   WHERE NOT EXISTS (SELECT 1 FROM pick WHERE special)), \
                 claimed AS (UPDATE svc_jobs j SET state = 'active', attempt = j.attempt + 1, claim = s.claim, \
                     claimed_ms = s.at, visible_until_ms = s.at + coalesce(s.visibility, j.visibility_ms), \
                     lease_until = to_timestamp((s.at + least(coalesce(s.visibility, j.visibility_ms), j.timeout_ms))::float8 / 1000), \
                     worker_id = s.worker \
                   FROM ranked r JOIN unnest($4::int8[], $5::text[], $6::int8[], $7::int8[], $8::text[], $9::bytea[]) \
                     WITH ORDINALITY AS s(at, worker, visibility, claim, event, header, n) ON s.n = r.n \
                   WHERE j.id = r.id \
                   RETURNING j.id, j.body, j.queue, j.type, r.n, s.at, s.event, s.header), \
                 recorded AS (INSERT INTO svc_events (id, at, type, queue, job_type, body) \
                   SELECT c.event::uuid, to_timestamp(c.at::float8 / 1000), 'job.started', c.queue, c.type, c.header || c.body \
                   FROM claimed c) \
                 SELECT c.id::text, c.body, c.n FROM claimed c \
                 UNION ALL (SELECT NULL, NULL, NULL FROM pick WHERE special LIMIT 1)",
                &[queue, &now, &wanted, &times, &workers, &visibilities, &tokens, &events, &headers],
            )
            .await
            .map_err(database)?;
        let mut handed = Handed::with_capacity(rows.len());
        for row in rows {
            let (Some(id), Some(slot)) = (row.get::<_, Option<&str>>(0), row.get::<_, Option<i64>>(2)) else {
                return Ok(None);
            };
            let slot = slot as usize - 1;
            let PendingClaim { now, request } = &claims[slots[slot]];
            let mut job = decode(id, row.get(1))?;
            apply_claim(&mut job, *now, request.worker_id.clone(), request.visibility_timeout_ms);
            handed.push((slot, job, tokens[slot]));
        }
        // In claim order, each job to its fetch.
        handed.sort_unstable_by_key(|(slot, ..)| *slot);
        Ok(Some(handed.into_iter().map(|(slot, job, token)| (slots[slot], job, token)).collect()))
    }

    /// Claims for the fetches of `groups` with the checked transaction.
    async fn claim_checked(
        &self,
        claims: &[PendingClaim],
        groups: &[(&[String], Vec<usize>)],
    ) -> Result<Handed, EngineError> {
        let now = claims.iter().map(|claim| claim.now).max().unwrap_or_default();
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let mut met = Met::default();
        let mut handed = Handed::new();
        for (queues, members) in groups {
            let wanted = members.iter().map(|index| claims[*index].request.count).sum();
            let mut selected = select(self, &transaction, queues, wanted, now, &mut met).await?.into_iter();
            for index in members {
                let PendingClaim { now, request } = &claims[*index];
                for mut job in selected.by_ref().take(request.count) {
                    apply_claim(&mut job, *now, request.worker_id.clone(), request.visibility_timeout_ms);
                    handed.push((*index, job, rand::random::<i64>()));
                }
            }
        }
        let ids: Vec<String> = handed.iter().map(|(_, job, _)| job.id.to_string()).collect();
        let attempts: Vec<i32> = handed.iter().map(|(_, job, _)| job.attempt as i32).collect();
        let tokens: Vec<i64> = handed.iter().map(|(_, _, token)| *token).collect();
        let leases: Vec<i64> = handed.iter().map(|(_, job, _)| transition::claim_ends(job).unwrap_or(now)).collect();
        let workers: Vec<Option<&str>> = handed.iter().map(|(_, job, _)| job.run().worker_id.as_deref()).collect();
        let times: Vec<Millis> = handed.iter().map(|(index, ..)| claims[*index].now).collect();
        let visible: Vec<Option<Millis>> = handed.iter().map(|(_, job, _)| job.run().visibility_deadline).collect();
        let mut events: Vec<(EventKind, &Job)> = Vec::new();
        for job in &met.expired {
            events.push((EventKind::Expired, job));
            events.push((EventKind::Discarded { reason: "expired" }, job));
        }
        events.extend(handed.iter().map(|(_, job, _)| (EventKind::Started, job)));
        let updated = async {
            if ids.is_empty() {
                return Ok(0);
            }
            transaction
                .run(
                    "UPDATE svc_jobs j SET state = 'active', attempt = t.attempt, claim = t.claim, \
                       lease_until = to_timestamp((t.lease)::int8::float8 / 1000), worker_id = t.worker, \
                       claimed_ms = t.at, visible_until_ms = t.visible \
                     FROM unnest($1::text[], $2::int4[], $3::int8[], $4::int8[], $5::text[], $6::int8[], $7::int8[]) \
                       AS t(id, attempt, claim, lease, worker, at, visible) \
                     WHERE j.id = t.id::uuid",
                    &[&ids, &attempts, &tokens, &leases, &workers, &times, &visible],
                )
                .await
                .map_err(database)
        };
        // Sent together (pipelined), as one step of the transaction.
        tokio::try_join!(
            generic_plans(&transaction),
            updated,
            self.record(&transaction, now, events),
            met.dispatch.record(&transaction)
        )?;
        transaction.commit().await.map_err(database)?;
        for (queue, opens_at) in met.dispatch.opens_at {
            self.window_opens_at(now, queue, opens_at);
        }
        Ok(handed)
    }
}
