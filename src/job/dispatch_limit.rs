//! The dispatch limit of a job (`options.rate_limit`): how many jobs sharing
//! a key may be active at once and how fast they may be claimed. Strict
//! validation and rendering; the engine enforces it.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

use super::enqueue::raw_integer;
use super::error::ValidationError;
use super::json::{parse_raw_object, push_json_string, string_value};
use super::time::push_duration_ms;

/// Longest dispatch limit `key`, in characters.
pub const DISPATCH_KEY_CHARS_MAX: usize = 255;
/// Largest `concurrency`, `max_per_second` and `rate` of a dispatch limit.
pub const DISPATCH_LIMIT_MAX: u32 = 100_000;

const FIELDS: [&str; 6] = ["key", "concurrency", "max_per_second", "rate", "period", "on_limit"];

/// The `period` names of a rate, with their length.
const PERIODS: [(&str, u64); 3] = [("second", 1000), ("minute", 60_000), ("hour", 3_600_000)];

/// The effective dispatch limit of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatchLimit {
    /// Jobs with the same key share the limit; `None` for the job's queue name.
    pub key: Option<String>,
    /// At most this many jobs of the key are active at once.
    pub concurrency: Option<u32>,
    /// At most `count` claims in any sliding window of `period_ms`.
    pub rate: Option<RateWindow>,
}

/// A claim rate: at most `count` claims in any sliding window of `period_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateWindow {
    pub count: u32,
    pub period_ms: u64,
}

impl DispatchLimit {
    /// Validates a client limit object; `path` names it in error messages
    /// (e.g. `options.rate_limit`).
    pub fn parse(raw: &RawValue, path: &str) -> Result<DispatchLimit, ValidationError> {
        let Some(object) = parse_raw_object(raw) else {
            return Err(ValidationError::payload(path, format!("{path} must be an object")));
        };
        if let Some((unknown, _)) = object.entries.iter().find(|(key, _)| !FIELDS.contains(&key.as_ref())) {
            return Err(ValidationError::payload(
                format!("{path}.{unknown}"),
                format!("{path}.{unknown} is not a rate limit field; allowed: {}", FIELDS.join(", ")),
            ));
        }
        let [key, concurrency, max_per_second, rate, period, on_limit] = object.get_present_many(&FIELDS);
        let at = |name: &str| format!("{path}.{name}");
        let key = match key {
            Some(raw) => Some(limit_key(raw, &at("key"))?),
            None => None,
        };
        let concurrency = concurrency.map(|raw| bounded_count(raw, &at("concurrency"))).transpose()?;
        let max_per_second = max_per_second.map(|raw| bounded_count(raw, &at("max_per_second"))).transpose()?;
        let rate_count = rate.map(|raw| bounded_count(raw, &at("rate"))).transpose()?;
        let period_ms = period.map(|raw| period_ms(raw, &at("period"))).transpose()?;
        if let Some(raw) = on_limit
            && string_value(raw).as_deref() != Some("wait")
        {
            let path = at("on_limit");
            return Err(ValidationError::payload(&path, format!("{path} must be \"wait\"")));
        }
        if max_per_second.is_some() && (rate_count.is_some() || period_ms.is_some()) {
            let path = at("max_per_second");
            return Err(ValidationError::payload(
                &path,
                format!("{path} cannot be combined with {}; give one or the other", at("rate")),
            ));
        }
        let rate = match (max_per_second, rate_count, period_ms) {
            (Some(count), _, _) => Some(RateWindow { count, period_ms: 1000 }),
            (None, Some(count), Some(period_ms)) => Some(RateWindow { count, period_ms }),
            (None, Some(_), None) => return Err(required_with(&at("period"), &at("rate"))),
            (None, None, Some(_)) => return Err(required_with(&at("rate"), &at("period"))),
            (None, None, None) => None,
        };
        if concurrency.is_none() && rate.is_none() {
            return Err(ValidationError::payload(path, format!("{path} must set concurrency, max_per_second or rate")));
        }
        Ok(DispatchLimit { key, concurrency, rate })
    }

    /// Appends the effective limit as compact JSON; `key`, `concurrency` and
    /// `rate` with `period` only when set. `max_per_second` renders as its
    /// rate per second.
    pub fn push_json(&self, out: &mut String) {
        let mut number = itoa::Buffer::new();
        out.push('{');
        if let Some(key) = &self.key {
            out.push_str("\"key\":");
            push_json_string(out, key);
            out.push(',');
        }
        if let Some(concurrency) = self.concurrency {
            out.push_str("\"concurrency\":");
            out.push_str(number.format(concurrency));
            out.push(',');
        }
        if let Some(rate) = self.rate {
            out.push_str("\"rate\":");
            out.push_str(number.format(rate.count));
            out.push_str(",\"period\":\"");
            match PERIODS.iter().find(|(_, ms)| *ms == rate.period_ms) {
                Some((name, _)) => out.push_str(name),
                // Only a window built by hand gets here: parse makes the named ones.
                None => push_duration_ms(out, i64::try_from(rate.period_ms).unwrap_or(i64::MAX)),
            }
            out.push_str("\",");
        }
        out.push_str("\"on_limit\":\"wait\"}");
    }
}

fn limit_key(raw: &RawValue, path: &str) -> Result<String, ValidationError> {
    string_value(raw)
        // Control characters are refused: a key is a name people choose,
        // and PostgreSQL's text columns cannot hold a NUL.
        .filter(|key| {
            !key.is_empty() && key.chars().count() <= DISPATCH_KEY_CHARS_MAX && !key.chars().any(char::is_control)
        })
        .map(Cow::into_owned)
        .ok_or_else(|| {
            ValidationError::payload(
                path,
                format!("{path} must be a string of 1 to {DISPATCH_KEY_CHARS_MAX} characters, none of them a control character"),
            )
        })
}

fn bounded_count(raw: &RawValue, path: &str) -> Result<u32, ValidationError> {
    raw_integer(raw)
        .filter(|count| (1..=i64::from(DISPATCH_LIMIT_MAX)).contains(count))
        .map(|count| count as u32)
        .ok_or_else(|| {
            ValidationError::payload(path, format!("{path} must be an integer from 1 to {DISPATCH_LIMIT_MAX}"))
        })
}

fn period_ms(raw: &RawValue, path: &str) -> Result<u64, ValidationError> {
    let name = string_value(raw);
    PERIODS
        .iter()
        .find(|(known, _)| name.as_deref() == Some(*known))
        .map(|(_, ms)| *ms)
        .ok_or_else(|| ValidationError::payload(path, format!("{path} must be \"second\", \"minute\" or \"hour\"")))
}

fn required_with(missing: &str, given: &str) -> ValidationError {
    ValidationError::payload(missing, format!("{missing} is required with {given}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn parse(value: Value) -> Result<DispatchLimit, ValidationError> {
        DispatchLimit::parse(&serde_json::value::to_raw_value(&value).unwrap(), "options.rate_limit")
    }

    fn rendered(limit: &DispatchLimit) -> String {
        let mut out = String::new();
        limit.push_json(&mut out);
        out
    }

    #[test]
    fn concurrency_alone_is_a_limit() {
        let limit = parse(json!({"concurrency": 5})).unwrap();
        assert_eq!(limit, DispatchLimit { key: None, concurrency: Some(5), rate: None });
    }

    #[test]
    fn max_per_second_is_a_rate_per_second() {
        let limit = parse(json!({"max_per_second": 20})).unwrap();
        assert_eq!(limit.rate, Some(RateWindow { count: 20, period_ms: 1000 }));
        assert_eq!(limit, parse(json!({"rate": 20, "period": "second"})).unwrap());
    }

    #[test]
    fn rates_take_each_period() {
        for (period, ms) in [("second", 1000), ("minute", 60_000), ("hour", 3_600_000)] {
            let limit = parse(json!({"rate": 7, "period": period})).unwrap();
            assert_eq!(limit.rate, Some(RateWindow { count: 7, period_ms: ms }), "{period}");
        }
    }

    #[test]
    fn every_field_is_read() {
        let limit = parse(json!({
            "key": "tenant:42",
            "concurrency": 3,
            "rate": 100,
            "period": "minute",
            "on_limit": "wait",
        }))
        .unwrap();
        assert_eq!(
            limit,
            DispatchLimit {
                key: Some("tenant:42".into()),
                concurrency: Some(3),
                rate: Some(RateWindow { count: 100, period_ms: 60_000 }),
            }
        );
    }

    #[test]
    fn bounds_are_inclusive() {
        let max = i64::from(DISPATCH_LIMIT_MAX);
        assert_eq!(parse(json!({"concurrency": 1})).unwrap().concurrency, Some(1));
        assert_eq!(parse(json!({"concurrency": max})).unwrap().concurrency, Some(DISPATCH_LIMIT_MAX));
        assert_eq!(parse(json!({"max_per_second": max})).unwrap().rate.unwrap().count, DISPATCH_LIMIT_MAX);
        let key = "k".repeat(DISPATCH_KEY_CHARS_MAX);
        assert_eq!(parse(json!({"key": key, "concurrency": 1})).unwrap().key, Some(key));
        // Characters are counted, not bytes.
        let wide = "é".repeat(DISPATCH_KEY_CHARS_MAX);
        assert!(parse(json!({"key": wide, "concurrency": 1})).is_ok());
    }

    #[test]
    fn strict_validation_names_the_field() {
        let max = i64::from(DISPATCH_LIMIT_MAX);
        let cases = [
            (json!({"concurrency": 1, "limit": 5}), "options.rate_limit.limit"),
            (json!({"key": "", "concurrency": 1}), "options.rate_limit.key"),
            (json!({"key": "k".repeat(DISPATCH_KEY_CHARS_MAX + 1), "concurrency": 1}), "options.rate_limit.key"),
            (json!({"key": 5, "concurrency": 1}), "options.rate_limit.key"),
            (json!({"key": "a\u{0}b", "concurrency": 1}), "options.rate_limit.key"),
            (json!({"key": "tenant\n42", "concurrency": 1}), "options.rate_limit.key"),
            (json!({"concurrency": 0}), "options.rate_limit.concurrency"),
            (json!({"concurrency": max + 1}), "options.rate_limit.concurrency"),
            (json!({"concurrency": 2.5}), "options.rate_limit.concurrency"),
            (json!({"concurrency": "5"}), "options.rate_limit.concurrency"),
            (json!({"concurrency": -1}), "options.rate_limit.concurrency"),
            (json!({"max_per_second": 0}), "options.rate_limit.max_per_second"),
            (json!({"max_per_second": max + 1}), "options.rate_limit.max_per_second"),
            (json!({"rate": 0, "period": "second"}), "options.rate_limit.rate"),
            (json!({"rate": max + 1, "period": "second"}), "options.rate_limit.rate"),
            (json!({"rate": 5, "period": "day"}), "options.rate_limit.period"),
            (json!({"rate": 5, "period": "PT1S"}), "options.rate_limit.period"),
            (json!({"rate": 5, "period": 1}), "options.rate_limit.period"),
            (json!({"rate": 5}), "options.rate_limit.period"),
            (json!({"period": "minute"}), "options.rate_limit.rate"),
            (json!({"max_per_second": 5, "rate": 5, "period": "second"}), "options.rate_limit.max_per_second"),
            (json!({"max_per_second": 5, "rate": 5}), "options.rate_limit.max_per_second"),
            (json!({"max_per_second": 5, "period": "minute"}), "options.rate_limit.max_per_second"),
            (json!({"concurrency": 1, "on_limit": "drop"}), "options.rate_limit.on_limit"),
            (json!({"concurrency": 1, "on_limit": true}), "options.rate_limit.on_limit"),
            (json!({}), "options.rate_limit"),
            (json!({"key": "k", "on_limit": "wait"}), "options.rate_limit"),
        ];
        for (object, field) in cases {
            let error = parse(object.clone()).unwrap_err();
            assert_eq!(error.field.as_deref(), Some(field), "{object}");
            assert!(error.message.starts_with(field), "{object}: {}", error.message);
        }
    }

    #[test]
    fn error_messages_say_what_is_allowed() {
        let message = |value: Value| parse(value).unwrap_err().message;
        assert_eq!(
            message(json!({"limit": 5})),
            "options.rate_limit.limit is not a rate limit field; \
             allowed: key, concurrency, max_per_second, rate, period, on_limit"
        );
        assert_eq!(message(json!({})), "options.rate_limit must set concurrency, max_per_second or rate");
        assert_eq!(message(json!({"rate": 5})), "options.rate_limit.period is required with options.rate_limit.rate");
        assert_eq!(
            message(json!({"max_per_second": 5, "rate": 5, "period": "second"})),
            "options.rate_limit.max_per_second cannot be combined with options.rate_limit.rate; give one or the other"
        );
    }

    #[test]
    fn the_limit_must_be_an_object() {
        for value in [json!([5]), json!(5), json!("wait"), json!(true)] {
            let error = parse(value.clone()).unwrap_err();
            assert_eq!(error.field.as_deref(), Some("options.rate_limit"), "{value}");
            assert_eq!(error.message, "options.rate_limit must be an object");
        }
    }

    #[test]
    fn null_fields_count_as_absent() {
        let limit = parse(json!({"concurrency": 2, "key": null, "rate": null, "period": null, "on_limit": null}));
        assert_eq!(limit.unwrap(), DispatchLimit { key: None, concurrency: Some(2), rate: None });
    }

    #[test]
    fn limits_render_as_compact_json() {
        let full = parse(json!({"key": "a\"b", "concurrency": 3, "rate": 100, "period": "hour"})).unwrap();
        assert_eq!(rendered(&full), r#"{"key":"a\"b","concurrency":3,"rate":100,"period":"hour","on_limit":"wait"}"#);
        let concurrency = parse(json!({"concurrency": 1})).unwrap();
        assert_eq!(rendered(&concurrency), r#"{"concurrency":1,"on_limit":"wait"}"#);
        let per_second = parse(json!({"max_per_second": 10})).unwrap();
        assert_eq!(rendered(&per_second), r#"{"rate":10,"period":"second","on_limit":"wait"}"#);
        let minute = parse(json!({"rate": 5, "period": "minute"})).unwrap();
        assert_eq!(rendered(&minute), r#"{"rate":5,"period":"minute","on_limit":"wait"}"#);
        // A window parse never makes still renders, as an ISO 8601 duration.
        let odd =
            DispatchLimit { key: None, concurrency: None, rate: Some(RateWindow { count: 2, period_ms: 90_000 }) };
        assert_eq!(rendered(&odd), r#"{"rate":2,"period":"PT1M30S","on_limit":"wait"}"#);
        // What is rendered parses back to the same limit.
        for limit in [full, concurrency, per_second, minute] {
            let text = rendered(&limit);
            let raw = RawValue::from_string(text.clone()).unwrap();
            assert_eq!(DispatchLimit::parse(&raw, "rate_limit").unwrap(), limit, "{text}");
        }
    }

    #[test]
    fn limits_round_trip_through_postcard() {
        let limit = parse(json!({"key": "k", "concurrency": 4, "max_per_second": 9})).unwrap();
        let bytes = postcard::to_stdvec(&limit).unwrap();
        assert_eq!(postcard::from_bytes::<DispatchLimit>(&bytes).unwrap(), limit);
    }
}
