//! When a cron expression fires in a time zone (docs/api.md, "Time zones"): local
//! wall-clock evaluation; a local time that does not exist (spring forward)
//! does not fire; a repeated local time (fall back) fires once, at its first
//! occurrence. All instants are UTC milliseconds.

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone};

use super::expr::CronExpr;
use crate::clock::Millis;

/// An expression bound to a time zone.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    expr: CronExpr,
    zone: TimeZone,
}

/// The next firing, and the first local time skipped on the way because a
/// daylight-saving gap made it not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextFire {
    pub at: Millis,
    pub skipped_gap: Option<Millis>,
}

/// The firing of an entry first due at `first_due`, evaluated at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DueFiring {
    /// The nominal time fired: the latest missed one after downtime.
    pub scheduled: Millis,
    /// Occurrences missed before `scheduled` (counted up to a cap).
    pub missed: u32,
    /// The firing after this one, if the expression fires again.
    pub next: Option<NextFire>,
}

/// Most candidate local times examined in one search (a gap or fold hour has
/// at most 60 per day, so this is far above any real need).
const CANDIDATES_MAX: usize = 10_000;

/// Checks a time zone name: `UTC` or a tz database name `Area/Location`.
pub fn parse_timezone(name: &str) -> Result<TimeZone, String> {
    if name == "UTC" {
        return Ok(TimeZone::UTC);
    }
    let well_formed = name.split('/').count() >= 2
        && name.split('/').all(|part| {
            !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+'))
        })
        && name.starts_with(|c: char| c.is_ascii_alphabetic());
    if !well_formed {
        return Err(format!(
            "time zone {name:?} is not a tz database name; use UTC or an Area/Location name such as America/New_York"
        ));
    }
    TimeZone::get(name).map_err(|_| format!("unknown time zone {name:?}"))
}

impl CronSchedule {
    pub fn new(expr: CronExpr, zone: TimeZone) -> Self {
        Self { expr, zone }
    }

    /// The first firing strictly after `after`, or `None` if it never fires again.
    pub fn next_fire(&self, after: Millis) -> Option<NextFire> {
        let after_ts = Timestamp::from_millisecond(after).ok()?;
        let mut cursor = self.zone.to_datetime(after_ts);
        let mut skipped_gap = None;
        for _ in 0..CANDIDATES_MAX {
            let candidate = self.expr.next_after(cursor)?;
            match self.resolve(candidate) {
                Resolved::At(at) if at > after => return Some(NextFire { at, skipped_gap }),
                Resolved::At(_) => {}
                Resolved::Gap(at) => {
                    if skipped_gap.is_none() && at > after {
                        skipped_gap = Some(at);
                    }
                }
            }
            cursor = candidate;
        }
        None
    }

    /// The last firing at or before `at`.
    pub fn latest_fire_at_or_before(&self, at: Millis) -> Option<Millis> {
        let at_ts = Timestamp::from_millisecond(at).ok()?;
        let mut cursor = self.zone.to_datetime(at_ts);
        for _ in 0..CANDIDATES_MAX {
            let candidate = self.expr.latest_at_or_before(cursor)?;
            if let Resolved::At(instant) = self.resolve(candidate)
                && instant <= at
            {
                return Some(instant);
            }
            cursor = candidate.checked_sub(jiff::SignedDuration::from_mins(1)).ok()?;
        }
        None
    }

    /// The firing due at `now` of an entry first due at `first_due`: after
    /// downtime or a clock jump, once, for the latest missed slot; `missed`
    /// counts the slots passed over, at most `missed_cap`.
    pub fn due_firing(&self, first_due: Millis, now: Millis, missed_cap: u32) -> DueFiring {
        let scheduled = self.latest_fire_at_or_before(now).filter(|at| *at > first_due).unwrap_or(first_due);
        let missed = if scheduled > first_due { self.count_fires(first_due, scheduled, missed_cap) } else { 0 };
        DueFiring { scheduled, missed, next: self.next_fire(now.max(scheduled)) }
    }

    /// How many firings fall in `[from, until)`, counting at most `cap`.
    pub fn count_fires(&self, from: Millis, until: Millis, cap: u32) -> u32 {
        let mut count = 0;
        let mut at = from - 1;
        while count < cap {
            match self.next_fire(at) {
                Some(next) if next.at < until => {
                    count += 1;
                    at = next.at;
                }
                _ => break,
            }
        }
        count
    }

    /// The instant a local time names: the earlier one in a fold; for a time
    /// in a gap, where it would have been (reported, never fired).
    fn resolve(&self, local: DateTime) -> Resolved {
        let to_ms = |offset: jiff::tz::Offset| offset.to_timestamp(local).map(|ts| ts.as_millisecond());
        match self.zone.to_ambiguous_timestamp(local).offset() {
            AmbiguousOffset::Unambiguous { offset } => to_ms(offset).map_or(Resolved::Gap(Millis::MAX), Resolved::At),
            AmbiguousOffset::Fold { before, .. } => to_ms(before).map_or(Resolved::Gap(Millis::MAX), Resolved::At),
            AmbiguousOffset::Gap { before, .. } => Resolved::Gap(to_ms(before).unwrap_or(Millis::MAX)),
        }
    }
}

enum Resolved {
    At(Millis),
    Gap(Millis),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(expression: &str, zone: &str) -> CronSchedule {
        CronSchedule::new(CronExpr::parse(expression).expect("valid"), parse_timezone(zone).expect("known zone"))
    }

    fn ms(text: &str) -> Millis {
        text.parse::<Timestamp>().expect("timestamp").as_millisecond()
    }

    fn iso(at: Millis) -> String {
        Timestamp::from_millisecond(at).expect("in range").to_string()
    }

    /// The next `n` firings after `start`, as UTC strings.
    fn fires(schedule: &CronSchedule, start: &str, n: usize) -> Vec<String> {
        let mut at = ms(start);
        (0..n)
            .map(|_| {
                at = schedule.next_fire(at).expect("fires").at;
                iso(at)
            })
            .collect()
    }

    #[test]
    fn time_zone_names_must_be_tz_database_names() {
        assert!(parse_timezone("UTC").is_ok());
        assert!(parse_timezone("Asia/Tokyo").is_ok());
        assert!(parse_timezone("America/Argentina/Buenos_Aires").is_ok());
        assert!(parse_timezone("Etc/GMT+5").is_ok());
        for bad in ["EST", "PST", "CET", "+05:00", "UTC+5", "", "/Tokyo", "Asia/"] {
            let error = parse_timezone(bad).expect_err(bad);
            assert!(error.contains("not a tz database name"), "{bad}: {error}");
        }
        assert!(parse_timezone("Mars/Olympus_Mons").expect_err("unknown").contains("unknown time zone"));
    }

    #[test]
    fn new_york_spring_forward_skips_the_missing_hour() {
        // 2026-03-08 02:00 EST → 03:00 EDT: 02:30 does not exist that day.
        let daily = schedule("30 2 * * *", "America/New_York");
        assert_eq!(
            fires(&daily, "2026-03-07T00:00:00Z", 3),
            ["2026-03-07T07:30:00Z", "2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]
        );
        let next = daily.next_fire(ms("2026-03-07T07:30:00Z")).expect("fires");
        assert_eq!(next.skipped_gap.map(iso).as_deref(), Some("2026-03-08T07:30:00Z"));
        // Every 15 minutes: 01:45 EST is followed by 03:00 EDT.
        let quarter = schedule("*/15 * * * *", "America/New_York");
        assert_eq!(fires(&quarter, "2026-03-08T06:40:00Z", 2), ["2026-03-08T06:45:00Z", "2026-03-08T07:00:00Z"]);
    }

    #[test]
    fn new_york_fall_back_fires_a_repeated_time_once() {
        // 2026-11-01 02:00 EDT → 01:00 EST: 01:30 happens twice, fires at the first.
        let daily = schedule("30 1 * * *", "America/New_York");
        assert_eq!(
            fires(&daily, "2026-10-31T12:00:00Z", 3),
            ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z", "2026-11-03T06:30:00Z"]
        );
        // Hourly: 01:00 EDT fires, 01:00 EST (the repeat) does not, 02:00 EST does.
        let hourly = schedule("0 * * * *", "America/New_York");
        assert_eq!(
            fires(&hourly, "2026-11-01T04:30:00Z", 3),
            ["2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z", "2026-11-01T08:00:00Z"]
        );
    }

    #[test]
    fn london_changes_at_one_in_the_morning() {
        // 2026-03-29 01:00 GMT → 02:00 BST; 2026-10-25 02:00 BST → 01:00 GMT.
        let daily = schedule("30 1 * * *", "Europe/London");
        assert_eq!(fires(&daily, "2026-03-28T00:00:00Z", 2), ["2026-03-28T01:30:00Z", "2026-03-30T00:30:00Z"]);
        assert_eq!(fires(&daily, "2026-10-24T12:00:00Z", 2), ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]);
    }

    #[test]
    fn lord_howe_shifts_by_thirty_minutes() {
        // 2026-10-04 02:00 +10:30 → 02:30 +11:00: 02:15 does not exist.
        let daily = schedule("15 2 * * *", "Australia/Lord_Howe");
        assert_eq!(fires(&daily, "2026-10-02T00:00:00Z", 2), ["2026-10-02T15:45:00Z", "2026-10-04T15:15:00Z"]);
        // 2026-04-05 02:00 +11:00 → 01:30 +10:30: 01:45 repeats, fires once.
        let repeated = schedule("45 1 * * *", "Australia/Lord_Howe");
        assert_eq!(
            fires(&repeated, "2026-04-03T12:00:00Z", 3),
            ["2026-04-03T14:45:00Z", "2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"]
        );
    }

    #[test]
    fn a_zone_without_dst_keeps_a_fixed_offset() {
        // 09:00 in Tokyo is 00:00 UTC all year; strictly after the start instant.
        let daily = schedule("0 9 * * *", "Asia/Tokyo");
        assert_eq!(
            fires(&daily, "2026-03-07T00:00:00Z", 3),
            ["2026-03-08T00:00:00Z", "2026-03-09T00:00:00Z", "2026-03-10T00:00:00Z"]
        );
        assert_eq!(fires(&daily, "2026-11-01T06:00:00Z", 1), ["2026-11-02T00:00:00Z"]);
    }

    #[test]
    fn leap_days_and_day_31() {
        let leap = schedule("0 12 29 2 *", "Europe/Berlin");
        assert_eq!(fires(&leap, "2026-01-01T00:00:00Z", 2), ["2028-02-29T11:00:00Z", "2032-02-29T11:00:00Z"]);
        let day_31 = schedule("0 0 31 * *", "UTC");
        assert_eq!(
            fires(&day_31, "2026-01-31T00:00:00Z", 3),
            ["2026-03-31T00:00:00Z", "2026-05-31T00:00:00Z", "2026-07-31T00:00:00Z"]
        );
        assert_eq!(schedule("0 0 31 2 *", "UTC").next_fire(ms("2026-01-01T00:00:00Z")), None);
    }

    #[test]
    fn latest_fire_and_counting_for_misfires() {
        let every_five = schedule("*/5 * * * *", "UTC");
        assert_eq!(
            every_five.latest_fire_at_or_before(ms("2026-03-10T10:17:30Z")).map(iso).as_deref(),
            Some("2026-03-10T10:15:00Z")
        );
        assert_eq!(every_five.count_fires(ms("2026-03-10T10:00:00Z"), ms("2026-03-10T10:15:00Z"), 1000), 3);
        assert_eq!(every_five.count_fires(ms("2026-03-10T10:00:00Z"), ms("2026-03-11T10:00:00Z"), 100), 100);
        // The repeated hour's second pass is not a firing.
        let hourly = schedule("0 * * * *", "America/New_York");
        assert_eq!(
            hourly.latest_fire_at_or_before(ms("2026-11-01T06:30:00Z")).map(iso).as_deref(),
            Some("2026-11-01T05:00:00Z")
        );
    }
}
