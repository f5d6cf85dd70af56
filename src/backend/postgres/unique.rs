//! Unique jobs on PostgreSQL (docs/postgres.md, "Unique jobs"): the jobs
//! that hold a fingerprint, read under a lock on it, and the holders a
//! `replace` policy cancels.
//!
//! A job in flight with a unique policy keeps its fingerprint in the
//! `unique_key` column of `svc_jobs` (a policy covers unfinished states
//! only, so finished jobs never hold one). A transaction that enqueues such jobs
//! first takes a transaction-level advisory lock per bucket of fingerprints
//! (in one order, so two transactions never wait on each other in a circle;
//! by bucket, so a large batch takes a bounded share of the database's
//! shared lock table, whose overflow fails every session's locks), then
//! reads the holders: two enqueues of one fingerprint, on any nodes, are
//! decided one after the other, each seeing the other's job. The decision
//! itself is the local engine's rule ([`UniquePolicy::blocked_by`]).
//!
//! [`UniquePolicy::blocked_by`]: crate::job::UniquePolicy::blocked_by

use std::collections::HashSet;
use std::sync::Arc;

use deadpool_postgres::Transaction;

use super::claims::{job_columns, job_of};
use super::jobs::{PgJobs, database, lock_in_flight};
use super::sql::Prepared;
use crate::clock::Millis;
use crate::engine::{EngineError, EventKind};
use crate::job::{Job, JobId, OnConflict, transition};

/// Locks the fingerprints of `jobs` that have one, and answers the jobs in
/// flight that hold them.
pub(super) async fn lock_and_read_holders<'a>(
    transaction: &Transaction<'_>,
    jobs: impl Iterator<Item = &'a Job>,
) -> Result<Vec<Arc<Job>>, EngineError> {
    let mut keys: Vec<Vec<u8>> = jobs.filter_map(|job| job.unique().map(|(_, key)| key.0.to_vec())).collect();
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    keys.sort_unstable();
    keys.dedup();
    let mut locks: Vec<i64> = keys.iter().map(|key| bucket_lock(key)).collect();
    locks.sort_unstable();
    locks.dedup();
    transaction
        .run("SELECT pg_advisory_xact_lock(k) FROM unnest($1::int8[]) WITH ORDINALITY AS t(k, n) ORDER BY n", &[&locks])
        .await
        .map_err(database)?;
    let rows = transaction
        .rows(concat!("SELECT ", job_columns!(), " FROM svc_jobs WHERE unique_key = ANY($1::bytea[])"), &[&keys])
        .await
        .map_err(database)?;
    rows.iter().map(|row| job_of(row).map(Arc::new)).collect()
}

/// How many advisory locks guard fingerprints at most: two fingerprints in
/// one bucket share a lock, and only wait on each other.
const FINGERPRINT_LOCK_BUCKETS: u16 = 256;

/// The advisory lock of `fingerprint`'s bucket: `svc_uq` and the bucket as
/// eight bytes, so that other programs' advisory locks do not collide.
fn bucket_lock(fingerprint: &[u8]) -> i64 {
    let bucket = u16::from_be_bytes([fingerprint[0], fingerprint[1]]) % FINGERPRINT_LOCK_BUCKETS;
    let [high, low] = bucket.to_be_bytes();
    i64::from_be_bytes([b's', b'v', b'c', b'_', b'u', b'q', high, low])
}

/// The holders that block `job` at `now` among `candidates` (none that
/// `replaced` already gave up), with the policy's answer to them; `None`
/// when `job` has no policy or nothing blocks it.
pub(super) fn blocking<'a>(
    job: &Job,
    now: Millis,
    candidates: impl Iterator<Item = &'a Arc<Job>>,
    replaced: &HashSet<JobId>,
) -> Option<(OnConflict, Vec<&'a Arc<Job>>)> {
    let (policy, key) = job.unique()?;
    let holders: Vec<&Arc<Job>> = candidates
        .filter(|holder| holder.unique().is_some_and(|(_, held)| held == key))
        .filter(|holder| !replaced.contains(&holder.id) && policy.blocked_by(holder, now))
        .collect();
    (!holders.is_empty()).then_some((policy.on_conflict, holders))
}

impl PgJobs {
    /// Cancels the unfinished jobs among `ids` that a `replace` policy
    /// gave up (`unique_replace`), in the caller's transaction.
    pub(super) async fn cancel_replaced(
        &self,
        transaction: &Transaction<'_>,
        now: Millis,
        ids: &[JobId],
    ) -> Result<(), EngineError> {
        if ids.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = ids.iter().map(JobId::to_string).collect();
        let mut jobs = lock_in_flight(transaction, &keys).await?;
        let mut events = Vec::with_capacity(jobs.len());
        for job in &mut jobs {
            events.push(EventKind::Cancelled { previous_state: job.state, reason: "unique_replace" });
            transition::cancel(job, now);
        }
        self.move_to_history(transaction, &jobs.iter().collect::<Vec<_>>()).await?;
        self.record(transaction, now, events.into_iter().zip(&jobs).collect()).await
    }
}
