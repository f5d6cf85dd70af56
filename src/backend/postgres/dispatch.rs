//! Dispatch limits on PostgreSQL (docs/postgres.md, "Dispatch limits"): how
//! many jobs under a limit key may be active at once, and how many claims
//! a window allows, checked by the claim that would break them.
//!
//! A job with a limit keeps its key in `svc_jobs.dispatch_key`: the jobs
//! active under a key are counted from there. A claim by a job with a rate
//! is recorded in `svc_dispatch_claims`, kept as long as the longest window.
//! A claim transaction that meets a limited job takes one advisory lock
//! first, so that claims of limited jobs, on any nodes, are decided one
//! transaction after the other, each seeing the other's claims; claims of
//! other jobs never take it. Claims select with `SKIP LOCKED`, so a
//! transaction holding the lock never waits on a row, and the lock is the
//! only one they wait on. The rule is the local engine's (docs/api.md,
//! "Dispatch limits").

use std::collections::HashMap;

use deadpool_postgres::Transaction;

use super::jobs::database;
use super::sql::{Params, Prepared};
use crate::clock::Millis;
use crate::engine::EngineError;
use crate::job::Job;
use crate::limits::DISPATCH_WINDOW_MS_MAX;

/// The advisory lock a claim takes when it meets its first limited job
/// (`svc_disp` as eight bytes): one lock for every key, so that claims of
/// limited jobs on every node are decided one transaction after the other.
/// It is taken after the claim locked its candidates (`SKIP LOCKED`).
const DISPATCH_LOCK: i64 = i64::from_be_bytes(*b"svc_disp");

/// What one key holds: active jobs, and claims within the longest window
/// (oldest first).
struct KeyUse {
    active: u32,
    claims: Vec<Millis>,
}

/// The limit keys one claim transaction has looked at, with the claims it
/// decided so far.
#[derive(Default)]
pub(super) struct Dispatch {
    locked: bool,
    keys: HashMap<String, KeyUse>,
    /// Claims to record (jobs with a rate): key and time.
    recorded: Vec<(String, Millis)>,
    /// By queue, the soonest a rate window that held one of its jobs back
    /// lets the next claim in (a fetch waiting on the queue looks again then).
    pub opens_at: HashMap<String, Millis>,
}

impl Dispatch {
    /// Whether `job` may be claimed at `now` under its limit (a job with
    /// none always may); a claim allowed counts toward the next ones.
    pub async fn allows(&mut self, transaction: &Transaction<'_>, job: &Job, now: Millis) -> Result<bool, EngineError> {
        self.load(transaction, std::slice::from_ref(job), now).await?;
        Ok(self.decide(job, now, true))
    }

    /// Whether `job`'s limit holds it back at `now`, counting no claim (a
    /// rate window that holds it back still notes when it opens); its key's
    /// use was read first ([`Dispatch::load`]).
    pub fn holds_back(&mut self, job: &Job, now: Millis) -> bool {
        !self.decide(job, now, false)
    }

    /// The rule (docs/api.md, "Dispatch limits"): whether `job`'s key has
    /// room for it at `now`, and when `claim`, counting the claim.
    fn decide(&mut self, job: &Job, now: Millis, claim: bool) -> bool {
        let Some((limit, key)) = job.limit_and_key() else { return true };
        let state = self.keys.get_mut(key).expect("a key's use is read before its jobs are decided");
        if limit.concurrency.is_some_and(|concurrency| state.active >= concurrency) {
            return false;
        }
        if let Some(rate) = &limit.rate {
            let since = now.saturating_sub(rate.period_ms as i64);
            let recent = state.claims.len() - state.claims.partition_point(|at| *at <= since);
            if recent >= rate.count as usize {
                // The window lets one more in once the oldest of its last
                // `count` claims leaves it.
                let oldest = state.claims[state.claims.len() - rate.count as usize];
                let opens = oldest.saturating_add(rate.period_ms as i64);
                let soonest = self.opens_at.entry(job.queue.to_string()).or_insert(opens);
                *soonest = (*soonest).min(opens);
                return false;
            }
            if claim {
                state.claims.push(now);
                self.recorded.push((key.to_string(), now));
            }
        }
        if claim {
            state.active += 1;
        }
        true
    }

    /// Takes the lock that orders claims of limited jobs, once a claim.
    async fn lock(&mut self, transaction: &Transaction<'_>) -> Result<(), EngineError> {
        if !self.locked {
            transaction.run("SELECT pg_advisory_xact_lock($1)", &[&DISPATCH_LOCK]).await.map_err(database)?;
            self.locked = true;
        }
        Ok(())
    }

    /// Reads what the keys of `jobs` not read yet hold, all at once (two
    /// statements), after taking the lock if there is any such key: a
    /// claim that passes over many keys at their limit reads them together.
    pub async fn load(&mut self, transaction: &Transaction<'_>, jobs: &[Job], now: Millis) -> Result<(), EngineError> {
        let mut keys: Vec<&str> = jobs
            .iter()
            .filter_map(|job| job.limit_and_key().map(|(_, key)| key))
            .filter(|key| !self.keys.contains_key(*key))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        if keys.is_empty() {
            return Ok(());
        }
        self.lock(transaction).await?;
        let since = now.saturating_sub(DISPATCH_WINDOW_MS_MAX);
        let (by_key, by_key_since): (Params<'_>, Params<'_>) = (&[&keys], &[&keys, &since]);
        let (active, claims) = tokio::try_join!(
            transaction.rows(
                "SELECT dispatch_key, count(*) FROM svc_jobs WHERE dispatch_key = ANY($1) AND state = 'active' \
                 GROUP BY dispatch_key",
                by_key,
            ),
            transaction.rows(
                "SELECT key, claimed_at FROM svc_dispatch_claims WHERE key = ANY($1) AND claimed_at > $2 \
                 ORDER BY key, claimed_at",
                by_key_since,
            ),
        )
        .map_err(database)?;
        for key in keys {
            self.keys.insert(key.to_string(), KeyUse { active: 0, claims: Vec::new() });
        }
        for row in &active {
            let (key, count): (&str, i64) = (row.get(0), row.get(1));
            self.keys.get_mut(key).expect("a key asked for").active = count as u32;
        }
        for row in &claims {
            let (key, at): (&str, Millis) = (row.get(0), row.get(1));
            self.keys.get_mut(key).expect("a key asked for").claims.push(at);
        }
        Ok(())
    }

    /// Records the claims of jobs with a rate, in the claim's transaction.
    pub async fn record(&self, transaction: &Transaction<'_>) -> Result<(), EngineError> {
        if self.recorded.is_empty() {
            return Ok(());
        }
        let keys: Vec<&str> = self.recorded.iter().map(|(key, _)| key.as_str()).collect();
        let times: Vec<Millis> = self.recorded.iter().map(|(_, at)| *at).collect();
        transaction
            .run(
                "INSERT INTO svc_dispatch_claims (key, claimed_at) SELECT * FROM unnest($1::text[], $2::int8[])",
                &[&keys, &times],
            )
            .await
            .map_err(database)?;
        Ok(())
    }
}

impl super::PgJobs {
    /// Drops recorded claims older than the longest window (the leader's
    /// housekeeping).
    pub async fn prune_dispatch_claims(&self, now: Millis) -> Result<u64, EngineError> {
        let since = now.saturating_sub(DISPATCH_WINDOW_MS_MAX);
        let client = self.client().await?;
        client.run("DELETE FROM svc_dispatch_claims WHERE claimed_at <= $1", &[&since]).await.map_err(database)
    }
}
