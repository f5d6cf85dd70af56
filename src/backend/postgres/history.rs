//! The history of finished jobs on PostgreSQL (docs/postgres.md, "History"):
//! `svc_job_history` is partitioned by the day a job finished, so the
//! leader makes each day's partition ahead of time and drops a whole day
//! once every job in it is past its retention; jobs whose state is kept
//! for less long are deleted from their partitions before that.

use super::jobs::{PgJobs, database};
use super::sql::Prepared;
use crate::clock::Millis;
use crate::engine::{EngineError, Retention};

const DAY_MS: i64 = 86_400_000;
/// Days ahead whose partitions exist before a job finishes in them.
const DAYS_AHEAD: i64 = 2;

/// A day's partition: `svc_job_history_YYYYMMDD` (UTC).
fn partition_name(day: i64) -> Option<String> {
    let date = jiff::Timestamp::from_millisecond(day * DAY_MS).ok()?.to_zoned(jiff::tz::TimeZone::UTC).date();
    Some(format!("svc_job_history_{:04}{:02}{:02}", date.year(), date.month(), date.day()))
}

/// The start of a day as a `timestamptz` literal, in UTC whatever the
/// session's time zone.
fn midnight(day: i64) -> String {
    match jiff::Timestamp::from_millisecond(day * DAY_MS) {
        Ok(at) => format!("{} 00:00:00+00", at.to_zoned(jiff::tz::TimeZone::UTC).date()),
        Err(_) => "infinity".to_string(),
    }
}

/// The day (since the epoch, UTC) a partition holds, from its name.
fn partition_day(name: &str) -> Option<i64> {
    let digits = name.strip_prefix("svc_job_history_")?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (year, month, day) = (digits[..4].parse().ok()?, digits[4..6].parse().ok()?, digits[6..].parse().ok()?);
    let date = jiff::civil::Date::new(year, month, day).ok()?;
    let start = date.to_zoned(jiff::tz::TimeZone::UTC).ok()?.timestamp().as_millisecond();
    Some(start.div_euclid(DAY_MS))
}

impl PgJobs {
    /// The leader's housekeeping of the history at `now`: partitions made
    /// for the days ahead, jobs past their state's retention deleted (at
    /// most `limit` a state), and days past the longest retention dropped.
    /// Answers the partitions dropped.
    pub async fn keep_history(&self, now: Millis, retention: &Retention, limit: i64) -> Result<usize, EngineError> {
        let client = self.client().await?;
        let today = now.div_euclid(DAY_MS);
        for day in today..=today + DAYS_AHEAD {
            let Some(name) = partition_name(day) else { continue };
            let statement = format!(
                "CREATE TABLE IF NOT EXISTS {name} PARTITION OF svc_job_history \
                 FOR VALUES FROM ('{start}') TO ('{end}')",
                start = midnight(day),
                end = midnight(day + 1),
            );
            // Today's partition cannot be made once the default partition
            // holds jobs of today (a database from before the partitions):
            // those days stay in the default partition until they go.
            if let Err(error) = client.batch_execute(&statement).await
                && day > today
            {
                tracing::warn!(%error, partition = name, "could not make a history partition ahead");
            }
        }
        let discarded_ms = retention.discarded_ms.max(retention.dead_letter_ms);
        for (state, kept_ms) in
            [("completed", retention.completed_ms), ("cancelled", retention.cancelled_ms), ("discarded", discarded_ms)]
        {
            client
                .run(
                    "DELETE FROM svc_job_history WHERE (id, finished_at) IN (SELECT id, finished_at \
                     FROM svc_job_history WHERE state = $1 AND finished_at < to_timestamp(($2::int8 - $3::int8)::float8 / 1000) \
                     LIMIT $4)",
                    &[&state, &now, &kept_ms, &limit],
                )
                .await
                .map_err(database)?;
        }
        let longest = retention.completed_ms.max(retention.cancelled_ms).max(discarded_ms);
        let partitions = client
            .rows(
                "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
                 JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'svc_job_history'",
                &[],
            )
            .await
            .map_err(database)?;
        let mut dropped = 0;
        for row in partitions {
            let name: String = row.get(0);
            let Some(day) = partition_day(&name) else { continue };
            if (day + 1) * DAY_MS <= now - longest {
                client.batch_execute(&format!("DROP TABLE IF EXISTS {name}")).await.map_err(database)?;
                tracing::info!(partition = name, "dropped a day of history past its retention");
                dropped += 1;
            }
        }
        Ok(dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_names_and_days_go_both_ways() {
        // 2027-01-15 is day 20 833 since the epoch.
        let day = 1_800_000_000_000_i64.div_euclid(DAY_MS);
        assert_eq!(partition_name(day).as_deref(), Some("svc_job_history_20270115"));
        assert_eq!(partition_day("svc_job_history_20270115"), Some(day));
        assert_eq!(partition_day("svc_job_history_default"), None);
        assert_eq!(partition_day("svc_job_history_2027011"), None);
        assert_eq!(midnight(day), "2027-01-15 00:00:00+00");
    }
}
