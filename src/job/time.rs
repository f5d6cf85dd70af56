//! Timestamps and ISO 8601 durations as the wire uses them.
//!
//! Output: RFC 3339 UTC with `Z`, three fraction digits, omitted when zero.
//! Input: RFC 3339 with `Z` or an offset, or `+<duration>` relative to now.

use jiff::Timestamp;

use super::json::push_ascii;
use crate::clock::Millis;
use crate::limits::DURATION_MS_MAX;

/// Formats milliseconds since the epoch as RFC 3339 UTC.
pub fn format_timestamp(ms: Millis) -> String {
    let mut text = String::with_capacity(24);
    push_timestamp(&mut text, ms);
    text
}

/// Appends milliseconds since the epoch as RFC 3339 UTC, e.g.
/// `2026-03-09T10:30:02.789Z` (the fraction omitted when zero).
pub fn push_timestamp(out: &mut String, ms: Millis) {
    if Timestamp::from_millisecond(ms).is_err() {
        out.push_str("1970-01-01T00:00:00Z");
        return;
    }
    let day = ms.div_euclid(DAY_MS);
    // Timestamps rendered together nearly always fall on one day, and the
    // calendar date is most of the cost: each thread keeps the last one.
    let date = match LAST_DATE.get() {
        Some((known, date)) if known == day => date,
        _ => {
            let date = DateText::of(ms);
            LAST_DATE.set(Some((day, date)));
            date
        }
    };
    push_ascii(out, date.as_bytes());
    let in_day = ms.rem_euclid(DAY_MS);
    // Filled in place and appended once: this runs several times per job rendered.
    let mut text = *b"T00:00:00.000Z";
    put_digits(&mut text[1..3], (in_day / 3_600_000) as u32);
    put_digits(&mut text[4..6], (in_day / 60_000 % 60) as u32);
    put_digits(&mut text[7..9], (in_day / 1000 % 60) as u32);
    let millis = (in_day % 1000) as u32;
    let length = if millis == 0 {
        text[9] = b'Z';
        10
    } else {
        put_digits(&mut text[10..13], millis);
        14
    };
    push_ascii(out, &text[..length]);
}

const DAY_MS: i64 = 86_400_000;

thread_local! {
    /// The date of the last timestamp rendered on this thread, by day number.
    static LAST_DATE: std::cell::Cell<Option<(i64, DateText)>> = const { std::cell::Cell::new(None) };
}

/// `YYYY-MM-DD` of a UTC day, with a `-` before years below zero.
#[derive(Clone, Copy)]
struct DateText {
    bytes: [u8; 11],
    length: u8,
}

impl DateText {
    /// The date of `ms`, which must be a valid timestamp.
    fn of(ms: Millis) -> DateText {
        let timestamp = Timestamp::from_millisecond(ms).expect("checked by the caller");
        let civil = jiff::tz::Offset::UTC.to_datetime(timestamp);
        let year = i32::from(civil.year());
        let mut bytes = *b"-0000-00-00";
        put_digits(&mut bytes[1..5], year.unsigned_abs());
        put_digits(&mut bytes[6..8], civil.month().unsigned_abs() as u32);
        put_digits(&mut bytes[9..11], civil.day().unsigned_abs() as u32);
        if year < 0 {
            DateText { bytes, length: 11 }
        } else {
            bytes.copy_within(1.., 0);
            DateText { bytes, length: 10 }
        }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.length)]
    }
}

/// Writes `value` in decimal into `slot`, zero-padded on the left (years
/// never exceed four digits).
fn put_digits(slot: &mut [u8], mut value: u32) {
    for byte in slot.iter_mut().rev() {
        *byte = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// A point in time as a client gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSpec {
    /// An absolute instant.
    At(Millis),
    /// This long after the moment the request is accepted.
    After(Millis),
}

impl TimeSpec {
    pub fn resolve(self, now: Millis) -> Millis {
        match self {
            TimeSpec::At(at) => at,
            TimeSpec::After(delta) => now.saturating_add(delta),
        }
    }
}

/// Parses an RFC 3339 timestamp (with `Z` or a numeric offset) or `+<ISO 8601 duration>`.
pub fn parse_time_spec(text: &str) -> Result<TimeSpec, String> {
    if let Some(duration) = text.strip_prefix('+') {
        return parse_duration_ms(duration).map(TimeSpec::After);
    }
    parse_timestamp(text).map(TimeSpec::At)
}

/// Parses an RFC 3339 timestamp; sub-millisecond digits are truncated.
pub fn parse_timestamp(text: &str) -> Result<Millis, String> {
    let looks_rfc3339 = text.len() >= 20 && text.as_bytes().get(10).is_some_and(|b| *b == b'T' || *b == b't');
    if !looks_rfc3339 {
        return Err(format!("'{}' is not an RFC 3339 timestamp with a time zone", clip(text)));
    }
    text.parse::<Timestamp>()
        .map(|timestamp| timestamp.as_millisecond())
        .map_err(|_| format!("'{}' is not an RFC 3339 timestamp with a time zone", clip(text)))
}

/// Parses an ISO 8601 duration `P[nW][nD][T[nH][nM][n[.fff]S]]` into milliseconds.
/// Years and months are refused (their length varies); the total must be > 0
/// and at most 365 days; only seconds may have a fraction.
pub fn parse_duration_ms(text: &str) -> Result<Millis, String> {
    let invalid = || format!("'{}' is not an ISO 8601 duration such as PT30S", clip(text));
    let upper = text.to_ascii_uppercase();
    let Some(body) = upper.strip_prefix('P') else {
        return Err(invalid());
    };
    if body.is_empty() || body == "T" || body.ends_with('T') {
        return Err(invalid());
    }
    let (date_part, time_part) = match body.split_once('T') {
        Some((date, time)) => (date, Some(time)),
        None => (body, None),
    };
    let mut total: i128 = 0;
    total += parse_components(date_part, &[('W', 7 * 86_400_000), ('D', 86_400_000)], false).ok_or_else(invalid)?;
    if let Some(time) = time_part {
        total += parse_components(time, &[('H', 3_600_000), ('M', 60_000), ('S', 1000)], true).ok_or_else(invalid)?;
    }
    if total <= 0 {
        return Err(format!("duration '{}' must be longer than zero", clip(text)));
    }
    if total > DURATION_MS_MAX as i128 {
        return Err(format!("duration '{}' is longer than 365 days", clip(text)));
    }
    Ok(total as Millis)
}

/// Parses `<number><unit>` pairs in the order of `units`; a fraction is allowed
/// only on the seconds unit when `seconds_last` is set.
fn parse_components(text: &str, units: &[(char, i128)], seconds_last: bool) -> Option<i128> {
    let mut rest = text;
    let mut total: i128 = 0;
    let mut next_unit = 0;
    while !rest.is_empty() {
        let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))?;
        let (number, tail) = rest.split_at(end);
        let unit = tail.chars().next()?;
        let position = units[next_unit..].iter().position(|(name, _)| *name == unit)? + next_unit;
        let scale = units[position].1;
        let is_seconds = seconds_last && unit == 'S';
        total += parse_number_scaled(number, scale, is_seconds)?;
        next_unit = position + 1;
        rest = &tail[1..];
    }
    Some(total)
}

fn parse_number_scaled(number: &str, scale: i128, fraction_allowed: bool) -> Option<i128> {
    // ISO 8601 allows a comma as the decimal sign.
    let (whole, fraction) = match number.find(['.', ',']) {
        Some(at) if fraction_allowed => (&number[..at], Some(&number[at + 1..])),
        Some(_) => return None,
        None => (number, None),
    };
    if whole.is_empty() || whole.len() > 12 || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let fraction = fraction.unwrap_or_default();
    if !fraction.bytes().all(|b| b.is_ascii_digit()) || (number.len() > whole.len() && fraction.is_empty()) {
        return None;
    }
    let mut value = i128::from(whole.parse::<u64>().ok()?) * scale;
    // Milliseconds are the finest unit kept; further digits are truncated.
    let mut digit_scale = scale / 10;
    for digit in fraction.bytes() {
        value += i128::from(digit - b'0') * digit_scale;
        digit_scale /= 10;
    }
    Some(value)
}

/// Formats milliseconds as the shortest ISO 8601 duration (`PT1S`, `PT5M`, `P1DT2H`).
pub fn format_duration_ms(ms: Millis) -> String {
    let mut text = String::with_capacity(16);
    push_duration_ms(&mut text, ms);
    text
}

/// Appends milliseconds as the shortest ISO 8601 duration.
pub fn push_duration_ms(out: &mut String, ms: Millis) {
    let days = ms / 86_400_000;
    let mut rest = ms % 86_400_000;
    let hours = rest / 3_600_000;
    rest %= 3_600_000;
    let minutes = rest / 60_000;
    rest %= 60_000;
    let seconds = rest / 1000;
    let millis = rest % 1000;
    let mut number = itoa::Buffer::new();
    out.push('P');
    if days > 0 {
        out.push_str(number.format(days));
        out.push('D');
    }
    if hours > 0 || minutes > 0 || seconds > 0 || millis > 0 || days == 0 {
        out.push('T');
        if hours > 0 {
            out.push_str(number.format(hours));
            out.push('H');
        }
        if minutes > 0 {
            out.push_str(number.format(minutes));
            out.push('M');
        }
        if millis > 0 {
            out.push_str(number.format(seconds));
            out.push('.');
            let mut fraction = [b'0'; 3];
            let digits = number.format(millis).as_bytes();
            fraction[3 - digits.len()..].copy_from_slice(digits);
            let kept = fraction.iter().rposition(|digit| *digit != b'0').map_or(0, |last| last + 1);
            push_ascii(out, &fraction[..kept]);
            out.push('S');
        } else if seconds > 0 || (hours == 0 && minutes == 0) {
            out.push_str(number.format(seconds));
            out.push('S');
        }
    }
}

fn clip(text: &str) -> String {
    text.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Timestamp text straight from jiff's calendar, for comparison.
    fn reference_timestamp(ms: Millis) -> String {
        let civil = jiff::tz::Offset::UTC.to_datetime(Timestamp::from_millisecond(ms).unwrap());
        let sign = if civil.year() < 0 { "-" } else { "" };
        let (year, millis) = (i32::from(civil.year()).unsigned_abs(), ms.rem_euclid(1000));
        let fraction = if millis == 0 { String::new() } else { format!(".{millis:03}") };
        format!(
            "{sign}{year:04}-{:02}-{:02}T{:02}:{:02}:{:02}{fraction}Z",
            civil.month(),
            civil.day(),
            civil.hour(),
            civil.minute(),
            civil.second()
        )
    }

    proptest::proptest! {
        /// Runs of nearby instants (the remembered date in use) and far ones.
        #[test]
        fn timestamps_match_the_calendar(
            start in -377_000_000_000_000i64..253_000_000_000_000,
            steps in proptest::collection::vec(-200_000_000i64..200_000_000, 1..20),
        ) {
            let mut ms = start;
            for step in steps {
                proptest::prop_assert_eq!(format_timestamp(ms), reference_timestamp(ms));
                ms += step;
            }
        }
    }

    #[test]
    fn timestamps_format_with_millis_only_when_needed() {
        assert_eq!(format_timestamp(4_102_444_799_000), "2099-12-31T23:59:59Z");
        assert_eq!(format_timestamp(1_773_052_202_789), "2026-03-09T10:30:02.789Z");
        assert_eq!(format_timestamp(1_773_052_202_009), "2026-03-09T10:30:02.009Z");
        assert_eq!(format_timestamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_timestamp(-62_135_596_800_000), "0001-01-01T00:00:00Z");
        assert_eq!(format_timestamp(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(format_timestamp(-62_198_755_200_000), "-0001-01-01T00:00:00Z");
    }

    #[test]
    fn timestamps_parse_with_offsets() {
        assert_eq!(parse_timestamp("2099-12-31T23:59:59Z"), Ok(4_102_444_799_000));
        assert_eq!(parse_timestamp("2100-01-01T01:59:59+02:00"), Ok(4_102_444_799_000));
        assert_eq!(parse_timestamp("2026-03-09T10:30:02.789123Z"), Ok(1_773_052_202_789));
        assert!(parse_timestamp("2026-03-09T10:30:02").is_err());
        assert!(parse_timestamp("2026-03-09").is_err());
        assert!(parse_timestamp("tomorrow").is_err());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration_ms("PT1S"), Ok(1000));
        assert_eq!(parse_duration_ms("PT5M"), Ok(300_000));
        assert_eq!(parse_duration_ms("PT1.5S"), Ok(1500));
        assert_eq!(parse_duration_ms("P1DT2H"), Ok(93_600_000));
        assert_eq!(parse_duration_ms("P2W"), Ok(14 * 86_400_000));
        assert_eq!(parse_duration_ms("PT0.001S"), Ok(1));
        assert_eq!(parse_duration_ms("PT1,25S"), Ok(1250));
        assert_eq!(parse_duration_ms("pt0.0019s"), Ok(1));
        for bad in [
            "P1Y", "P1M", "PT", "P", "1S", "PT1.5H", "PT0S", "P366D", "PT1S2M", "PTS", "", "PT1.S", "PT.5S",
            "PT1.2.3S", "PT1,2.3S", "PT-1S", "PT+1S",
        ] {
            assert!(parse_duration_ms(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn durations_format_round_trip() {
        for ms in [1, 1000, 1500, 60_000, 300_000, 3_600_000, 93_600_000, 86_400_000, 90_061_001] {
            assert_eq!(parse_duration_ms(&format_duration_ms(ms)), Ok(ms), "{ms}");
        }
        assert_eq!(format_duration_ms(300_000), "PT5M");
        assert_eq!(format_duration_ms(1000), "PT1S");
    }

    #[test]
    fn relative_specs_resolve_against_now() {
        assert_eq!(parse_time_spec("+PT5S").map(|spec| spec.resolve(1000)), Ok(6000));
        assert_eq!(parse_time_spec("2099-12-31T23:59:59Z").map(|spec| spec.resolve(0)), Ok(4_102_444_799_000));
    }
}
