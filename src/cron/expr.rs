//! Cron expressions in the dialect of docs/api.md, "Expressions": five fields (minute,
//! hour, day of month, month, day of week), `*` `,` `-` `/`, month and weekday
//! names, the `@hourly`-style macros, and the Vixie rule for days.
//!
//! Matching works on local wall-clock values; time zones are `next.rs`'s job.

use jiff::civil::{Date, DateTime, Time};

/// A parsed expression: one bit per allowed value of each field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronExpr {
    minutes: u64,
    hours: u32,
    /// Bits 1..=31.
    days_of_month: u32,
    /// Bits 1..=12.
    months: u16,
    /// Bits 0..=6, Sunday = 0 (7 is folded onto 0).
    days_of_week: u8,
    /// The Vixie rule: a day field written starting with `*` does not restrict
    /// on its own, so the other decides; when both are restricted, either fires.
    day_of_month_star: bool,
    day_of_week_star: bool,
}

/// How far ahead a search for the next matching day goes. Long enough for
/// `0 0 29 2 *` across a skipped leap year (2096 → 2104).
const SEARCH_DAYS_MAX: u32 = 366 * 9;

struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: Field = Field { name: "minute", min: 0, max: 59, names: &[] };
const HOUR: Field = Field { name: "hour", min: 0, max: 23, names: &[] };
const DAY_OF_MONTH: Field = Field { name: "day-of-month", min: 1, max: 31, names: &[] };
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"],
};
const DAY_OF_WEEK: Field =
    Field { name: "day-of-week", min: 0, max: 7, names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"] };

impl CronExpr {
    /// Parses an expression; the error says what is wrong and where.
    pub fn parse(text: &str) -> Result<CronExpr, String> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err("the expression is empty".to_string());
        }
        if let Some(name) = trimmed.strip_prefix('@') {
            let expanded = match name.to_ascii_lowercase().as_str() {
                "yearly" | "annually" => "0 0 1 1 *",
                "monthly" => "0 0 1 * *",
                "weekly" => "0 0 * * 0",
                "daily" | "midnight" => "0 0 * * *",
                "hourly" => "0 * * * *",
                _ => {
                    return Err(format!(
                        "unknown macro @{name}; supported: @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly"
                    ));
                }
            };
            return Self::parse(expanded);
        }
        let fields: Vec<&str> = trimmed.split_whitespace().collect();
        if fields.len() != 5 {
            let hint = if fields.len() == 6 { "; a seconds field is not supported" } else { "" };
            return Err(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week), got {}{hint}",
                fields.len()
            ));
        }
        let minutes = parse_field(fields[0], &MINUTE)?;
        let hours = parse_field(fields[1], &HOUR)?;
        let days_of_month = parse_field(fields[2], &DAY_OF_MONTH)?;
        let months = parse_field(fields[3], &MONTH)?;
        let mut days_of_week = parse_field(fields[4], &DAY_OF_WEEK)?;
        if days_of_week & (1 << 7) != 0 {
            days_of_week = (days_of_week & !(1 << 7)) | 1;
        }
        Ok(CronExpr {
            minutes,
            hours: hours as u32,
            days_of_month: days_of_month as u32,
            months: months as u16,
            days_of_week: days_of_week as u8,
            day_of_month_star: fields[2].starts_with('*'),
            day_of_week_star: fields[4].starts_with('*'),
        })
    }

    /// Whether the expression fires on this local date (month and day fields).
    pub fn matches_date(&self, date: Date) -> bool {
        if self.months & (1 << date.month()) == 0 {
            return false;
        }
        let by_month_day = self.days_of_month & (1 << date.day()) != 0;
        let by_weekday = self.days_of_week & (1 << date.weekday().to_sunday_zero_offset()) != 0;
        match (self.day_of_month_star, self.day_of_week_star) {
            (false, false) => by_month_day || by_weekday,
            _ => by_month_day && by_weekday,
        }
    }

    /// Whether the expression fires at this local minute.
    pub fn matches(&self, at: DateTime) -> bool {
        self.matches_date(at.date()) && self.hours & (1 << at.hour()) != 0 && self.minutes & (1 << at.minute()) != 0
    }

    /// The first matching local minute strictly after `after` (seconds are
    /// ignored), or `None` when nothing matches within the search horizon.
    pub fn next_after(&self, after: DateTime) -> Option<DateTime> {
        let start = after.date().at(after.hour(), after.minute(), 0, 0);
        let mut date = start.date();
        for day in 0..SEARCH_DAYS_MAX {
            if self.matches_date(date) {
                let from = if day == 0 { Some((start.hour(), start.minute())) } else { None };
                if let Some(time) = self.first_time_in_day(from) {
                    return Some(date.to_datetime(time));
                }
            }
            date = date.tomorrow().ok()?;
        }
        None
    }

    /// The last matching local minute at or before `at` (seconds ignored).
    pub fn latest_at_or_before(&self, at: DateTime) -> Option<DateTime> {
        let mut date = at.date();
        for day in 0..SEARCH_DAYS_MAX {
            if self.matches_date(date) {
                let until = if day == 0 { Some((at.hour(), at.minute())) } else { None };
                if let Some(time) = self.last_time_in_day(until) {
                    return Some(date.to_datetime(time));
                }
            }
            date = date.yesterday().ok()?;
        }
        None
    }

    /// The first matching time of day strictly after `after` (hour, minute).
    fn first_time_in_day(&self, after: Option<(i8, i8)>) -> Option<Time> {
        for hour in 0..24i8 {
            if self.hours & (1 << hour) == 0 || after.is_some_and(|(h, _)| hour < h) {
                continue;
            }
            for minute in 0..60i8 {
                if self.minutes & (1 << minute) == 0 {
                    continue;
                }
                if after.is_some_and(|(h, m)| hour == h && minute <= m) {
                    continue;
                }
                return Time::new(hour, minute, 0, 0).ok();
            }
        }
        None
    }

    /// The last matching time of day at or before `until` (hour, minute).
    fn last_time_in_day(&self, until: Option<(i8, i8)>) -> Option<Time> {
        for hour in (0..24i8).rev() {
            if self.hours & (1 << hour) == 0 || until.is_some_and(|(h, _)| hour > h) {
                continue;
            }
            for minute in (0..60i8).rev() {
                if self.minutes & (1 << minute) == 0 {
                    continue;
                }
                if until.is_some_and(|(h, m)| hour == h && minute > m) {
                    continue;
                }
                return Time::new(hour, minute, 0, 0).ok();
            }
        }
        None
    }
}

/// Parses one field into a bit set of its allowed values.
fn parse_field(text: &str, field: &Field) -> Result<u64, String> {
    if let Some(bad) = text.chars().find(|c| matches!(c, '?' | '#')) {
        return Err(format!("{} field {text:?}: '{bad}' is not supported", field.name));
    }
    let mut bits = 0u64;
    for item in text.split(',') {
        if item.is_empty() {
            return Err(format!("{} field {text:?}: empty list item", field.name));
        }
        bits |= parse_item(item, field).map_err(|problem| format!("{} field {text:?}: {problem}", field.name))?;
    }
    Ok(bits)
}

/// One list item: `*`, `N`, `N-M`, each optionally `/STEP`.
fn parse_item(item: &str, field: &Field) -> Result<u64, String> {
    let (range, step) = match item.split_once('/') {
        Some((range, step)) => {
            let step: u32 = step.parse().map_err(|_| format!("step {step:?} is not a positive integer"))?;
            if step == 0 {
                return Err("step 0 is not allowed".to_string());
            }
            if step > field.max - field.min + 1 {
                return Err(format!("step {step} is larger than the range {}-{}", field.min, field.max));
            }
            (range, Some(step))
        }
        None => (item, None),
    };
    let (low, high) = if range == "*" {
        (field.min, if field.max == 7 { 6 } else { field.max })
    } else if let Some((low, high)) = range.split_once('-') {
        let (low, high) = (parse_value(low, field)?, parse_value(high, field)?);
        if low > high {
            return Err(format!("range {range} is empty (start after end)"));
        }
        (low, high)
    } else {
        let value = parse_value(range, field)?;
        // `N/STEP` means N through the end of the field.
        (value, if step.is_some() { field.max } else { value })
    };
    let step = step.unwrap_or(1);
    let mut bits = 0u64;
    let mut value = low;
    while value <= high {
        bits |= 1 << value;
        value += step;
    }
    Ok(bits)
}

fn parse_value(text: &str, field: &Field) -> Result<u32, String> {
    if text.is_empty() {
        return Err("a range bound is missing".to_string());
    }
    if let Some(position) = field.names.iter().position(|name| name.eq_ignore_ascii_case(text)) {
        // Month names count from 1, weekday names from 0.
        return Ok(position as u32 + field.min);
    }
    let value: u32 = text.parse().map_err(|_| match text.chars().find(|c| matches!(c, 'L' | 'W' | 'l' | 'w')) {
        Some(letter) if text.len() <= 3 => format!("'{letter}' is not supported"),
        _ => format!("{text:?} is not a number or a known name"),
    })?;
    if value < field.min || value > field.max {
        return Err(format!("{value} is out of range {}-{}", field.min, field.max));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    fn parse(text: &str) -> CronExpr {
        CronExpr::parse(text).unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    #[test]
    fn macros_expand_to_their_five_field_forms() {
        assert_eq!(parse("@yearly"), parse("0 0 1 1 *"));
        assert_eq!(parse("@annually"), parse("0 0 1 1 *"));
        assert_eq!(parse("@monthly"), parse("0 0 1 * *"));
        assert_eq!(parse("@weekly"), parse("0 0 * * 0"));
        assert_eq!(parse("@daily"), parse("0 0 * * *"));
        assert_eq!(parse("@midnight"), parse("0 0 * * *"));
        assert_eq!(parse("@hourly"), parse("0 * * * *"));
    }

    #[test]
    fn names_are_case_insensitive_and_seven_is_sunday() {
        assert_eq!(parse("0 9 * jan-mar MON-FRI"), parse("0 9 * 1-3 1-5"));
        assert_eq!(parse("0 9 * Dec sun"), parse("0 9 * 12 0"));
        assert_eq!(parse("0 9 * * 7"), parse("0 9 * * 0"));
        assert_eq!(parse("0 9 * * 5-7"), parse("0 9 * * 0,5,6"));
    }

    #[test]
    fn steps_lists_and_ranges() {
        let expr = parse("*/15 9-17/4 * * *");
        let at = |h, m| date(2026, 3, 10).at(h, m, 0, 0);
        assert!(expr.matches(at(9, 0)) && expr.matches(at(13, 45)) && expr.matches(at(17, 30)));
        assert!(!expr.matches(at(10, 0)) && !expr.matches(at(9, 10)));
        assert_eq!(parse("5/20 * * * *"), parse("5,25,45 * * * *"));
    }

    #[test]
    fn invalid_expressions_say_what_is_wrong() {
        let cases = [
            ("", "empty"),
            ("* * * *", "expected 5 fields"),
            ("0 * * * * *", "seconds field is not supported"),
            ("60 * * * *", "minute field \"60\": 60 is out of range 0-59"),
            ("* 24 * * *", "out of range 0-23"),
            ("* * 0 * *", "out of range 1-31"),
            ("* * * 13 *", "out of range 1-12"),
            ("* * * * 8", "out of range 0-7"),
            ("*/0 * * * *", "step 0"),
            ("5-1 * * * *", "empty"),
            ("1,,2 * * * *", "empty list item"),
            ("* * L * *", "'L' is not supported"),
            ("* * 15W * *", "not supported"),
            ("* * * * 1#2", "'#' is not supported"),
            ("* * ? * *", "'?' is not supported"),
            ("@every 5m", "unknown macro"),
            ("@reboot", "unknown macro"),
            ("a * * * *", "not a number"),
            ("1- * * * *", "bound is missing"),
        ];
        for (text, expected) in cases {
            let error = CronExpr::parse(text).expect_err(text);
            assert!(error.contains(expected), "{text:?}: {error:?} lacks {expected:?}");
        }
    }

    #[test]
    fn vixie_rule_either_day_field_fires_when_both_are_restricted() {
        // 13th of the month or any Friday.
        let expr = parse("0 0 13 * 5");
        assert!(expr.matches_date(date(2026, 3, 13))); // a Friday the 13th
        assert!(expr.matches_date(date(2026, 4, 13))); // Monday the 13th
        assert!(expr.matches_date(date(2026, 4, 17))); // a Friday
        assert!(!expr.matches_date(date(2026, 4, 14)));
        // A star in either field: the other one alone decides.
        let fridays = parse("0 0 * * 5");
        assert!(fridays.matches_date(date(2026, 4, 17)) && !fridays.matches_date(date(2026, 4, 13)));
        // `*/2` starts with a star, so both must match: odd days that are Fridays.
        let odd_days_on_fridays = parse("0 0 */2 * 5");
        assert!(odd_days_on_fridays.matches_date(date(2026, 4, 17)));
        assert!(!odd_days_on_fridays.matches_date(date(2026, 4, 13)));
        assert!(!odd_days_on_fridays.matches_date(date(2026, 4, 10)));
    }

    #[test]
    fn next_after_finds_leap_days_and_skips_short_months() {
        let leap = parse("0 0 29 2 *");
        assert_eq!(leap.next_after(date(2026, 3, 1).at(0, 0, 0, 0)), Some(date(2028, 2, 29).at(0, 0, 0, 0)));
        // 2100 is not a leap year: eight years between leap days.
        assert_eq!(leap.next_after(date(2096, 3, 1).at(0, 0, 0, 0)), Some(date(2104, 2, 29).at(0, 0, 0, 0)));
        let day_31 = parse("30 12 31 * *");
        assert_eq!(day_31.next_after(date(2026, 3, 31).at(13, 0, 0, 0)), Some(date(2026, 5, 31).at(12, 30, 0, 0)));
        assert_eq!(parse("0 0 30 2 *").next_after(date(2026, 1, 1).at(0, 0, 0, 0)), None);
    }

    #[test]
    fn next_after_is_strictly_after_and_ignores_seconds() {
        let expr = parse("*/5 * * * *");
        assert_eq!(expr.next_after(date(2026, 3, 10).at(10, 5, 0, 0)), Some(date(2026, 3, 10).at(10, 10, 0, 0)));
        assert_eq!(expr.next_after(date(2026, 3, 10).at(10, 4, 59, 0)), Some(date(2026, 3, 10).at(10, 5, 0, 0)));
        assert_eq!(expr.next_after(date(2026, 12, 31).at(23, 55, 0, 0)), Some(date(2027, 1, 1).at(0, 0, 0, 0)));
    }

    #[test]
    fn latest_at_or_before_mirrors_next_after() {
        let expr = parse("0 9 * * 1-5");
        // Sunday 2026-03-15 → the Friday before.
        assert_eq!(expr.latest_at_or_before(date(2026, 3, 15).at(12, 0, 0, 0)), Some(date(2026, 3, 13).at(9, 0, 0, 0)));
        assert_eq!(expr.latest_at_or_before(date(2026, 3, 13).at(9, 0, 0, 0)), Some(date(2026, 3, 13).at(9, 0, 0, 0)));
    }
}
