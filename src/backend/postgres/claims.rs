//! Claims (fetches) on PostgreSQL, merged (docs/postgres.md, "Merged
//! statements"): the fetches a node has waiting run as one transaction.
//!
//! Fetches naming the same queues share one selection: the jobs are taken
//! in claim order (queue by queue as listed; in a queue by priority, then
//! time, then id) with `FOR UPDATE SKIP LOCKED`, so claims on other nodes
//! pass over them, and handed to the fetches in the order they came, each
//! up to its count. One `UPDATE` then claims them all and one `INSERT`
//! writes their events. Jobs past their expiry met on the way are
//! discarded, not handed out, and jobs their dispatch limit holds back
//! (`dispatch.rs`) are left available, their key passed over for the rest
//! of the claim; the queue is then looked at again.

use std::sync::Arc;

use deadpool_postgres::Transaction;

use super::dispatch::Dispatch;
use super::jobs::{PgJobs, database, decode, encode, generic_plans};
use super::sql::Prepared;
use crate::clock::Millis;
use crate::engine::{EngineError, EventKind, FetchRequest};
use crate::job::{Job, transition};

/// One fetch waiting to be merged.
pub(super) struct PendingClaim {
    pub now: Millis,
    pub request: FetchRequest,
}

/// What one claim transaction met so far: the ids it looked at, the jobs
/// it discarded as expired, and the dispatch limits it counted.
#[derive(Default)]
struct Met {
    taken: Vec<String>,
    expired: Vec<Job>,
    dispatch: Dispatch,
    /// Limit keys found at their limit: passed over for the rest of the claim.
    blocked: Vec<String>,
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
        loop {
            let missing = (wanted - selected.len()) as i64;
            let rows = transaction
                .rows(
                    // `id_text`, not `id`: ORDER BY `id` must name the uuid
                    // column, in the index's order, not the text.
                    "SELECT id::text AS id_text, body FROM svc_jobs \
                     WHERE state = 'available' AND queue = $1 AND NOT (id = ANY($3::text[]::uuid[])) \
                       AND (dispatch_key IS NULL OR NOT (dispatch_key = ANY($4))) \
                       AND NOT EXISTS (SELECT 1 FROM svc_queues WHERE name = $1 AND paused) \
                     ORDER BY priority DESC, ready_at, id LIMIT $2 FOR UPDATE SKIP LOCKED",
                    &[queue, &missing, &met.taken, &met.blocked],
                )
                .await
                .map_err(database)?;
            let found = rows.len() as i64;
            let mut passed_over = 0;
            for row in rows {
                let mut job = decode(row.get(0), row.get(1))?;
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
                let held = key.as_ref().is_some_and(|key| met.blocked.contains(key));
                if !held && met.dispatch.allows(transaction, &job, now).await? {
                    selected.push(job);
                    continue;
                }
                if let Some(key) = key.filter(|_| !held) {
                    met.blocked.push(key);
                }
                passed_over += 1;
            }
            if passed_over == 0 || found < missing {
                break;
            }
        }
        if selected.len() == wanted {
            break;
        }
    }
    Ok(selected)
}

impl PgJobs {
    /// Runs waiting fetches as one transaction; answers each fetch's jobs, in order.
    pub(super) async fn claim_batch(
        &self,
        claims: Vec<PendingClaim>,
    ) -> Result<Vec<Result<Vec<Arc<Job>>, EngineError>>, EngineError> {
        let now = claims.iter().map(|claim| claim.now).max().unwrap_or_default();
        // Fetches of the same queues share a selection, first come first served.
        let mut groups: Vec<(&[String], Vec<usize>)> = Vec::new();
        for (index, claim) in claims.iter().enumerate() {
            match groups.iter_mut().find(|(queues, _)| *queues == claim.request.queues.as_slice()) {
                Some((_, members)) => members.push(index),
                None => groups.push((&claim.request.queues, vec![index])),
            }
        }
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(database)?;
        let mut met = Met::default();
        let mut handed: Vec<Vec<Job>> = claims.iter().map(|_| Vec::new()).collect();
        for (queues, members) in &groups {
            let wanted = members.iter().map(|index| claims[*index].request.count).sum();
            let mut selected = select(self, &transaction, queues, wanted, now, &mut met).await?.into_iter();
            for index in members {
                let PendingClaim { now, request } = &claims[*index];
                for mut job in selected.by_ref().take(request.count) {
                    let visibility = request.visibility_timeout_ms.unwrap_or(u64::from(job.visibility_timeout_ms));
                    let (visible_until, runs_until) =
                        (now.saturating_add(visibility as i64), now.saturating_add(job.timeout_ms as i64));
                    transition::claim(&mut job, *now, request.worker_id.clone(), visible_until, runs_until);
                    handed[*index].push(job);
                }
            }
        }
        let claimed: Vec<&Job> = handed.iter().flatten().collect();
        let ids: Vec<String> = claimed.iter().map(|job| job.id.to_string()).collect();
        let attempts: Vec<i32> = claimed.iter().map(|job| job.attempt as i32).collect();
        let tokens: Vec<i64> = claimed.iter().map(|_| rand::random::<i64>()).collect();
        let leases: Vec<i64> = claimed.iter().map(|job| transition::claim_ends(job).unwrap_or(now)).collect();
        let workers: Vec<Option<&str>> = claimed.iter().map(|job| job.run().worker_id.as_deref()).collect();
        let bodies: Vec<Vec<u8>> = claimed.iter().map(|job| encode(job)).collect();
        let mut events: Vec<(EventKind, &Job)> = Vec::new();
        for job in &met.expired {
            events.push((EventKind::Expired, job));
            events.push((EventKind::Discarded { reason: "expired" }, job));
        }
        events.extend(claimed.iter().map(|job| (EventKind::Started, *job)));
        let updated = async {
            if ids.is_empty() {
                return Ok(0);
            }
            transaction
                .run(
                    "UPDATE svc_jobs j SET state = 'active', attempt = t.attempt, claim = t.claim, \
                       lease_until = to_timestamp((t.lease)::int8::float8 / 1000), worker_id = t.worker, body = t.body \
                     FROM unnest($1::text[], $2::int4[], $3::int8[], $4::int8[], $5::text[], $6::bytea[]) \
                       AS t(id, attempt, claim, lease, worker, body) \
                     WHERE j.id = t.id::uuid",
                    &[&ids, &attempts, &tokens, &leases, &workers, &bodies],
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
        let handed: Vec<Vec<Arc<Job>>> =
            handed.into_iter().map(|jobs| jobs.into_iter().map(Arc::new).collect()).collect();
        self.claimed.keep(handed.iter().flatten().cloned().zip(bodies));
        Ok(handed.into_iter().map(Ok).collect())
    }
}
