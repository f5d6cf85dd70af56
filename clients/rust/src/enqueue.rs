//! What to enqueue: [`Enqueue`] and the policies it takes, written as the
//! enqueue body of docs/api.md ("Enqueue").

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::error::{Error, Result};
use crate::types::JobState;

/// A job to enqueue: its type, arguments and every option of the API.
///
/// ```
/// use std::time::Duration;
/// use svc_client::{Enqueue, RetryPolicy};
///
/// #[derive(serde::Serialize)]
/// struct Email { to: String }
///
/// let job = Enqueue::new("email.send")
///     .args(&Email { to: "ada@example.com".into() })
///     .queue("mail")
///     .priority(5)
///     .delay(Duration::from_secs(60))
///     .retry(RetryPolicy::new().max_attempts(5))
///     .tags(["welcome"])
///     .with_new_id();
/// assert!(job.job_id().is_some());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Enqueue {
    body: Map<String, Value>,
    options: Map<String, Value>,
    /// A problem found while building, reported when the job is sent.
    problem: Option<(String, String)>,
}

impl Enqueue {
    /// A job of this type (dot-separated names: `email.send`) with no arguments.
    pub fn new(job_type: impl Into<String>) -> Enqueue {
        let mut body = Map::new();
        body.insert("type".into(), Value::String(job_type.into()));
        body.insert("args".into(), Value::Array(Vec::new()));
        Enqueue { body, options: Map::new(), problem: None }
    }

    fn fail(mut self, field: &str, message: impl Into<String>) -> Enqueue {
        if self.problem.is_none() {
            self.problem = Some((field.to_string(), message.into()));
        }
        self
    }

    fn option(mut self, key: &str, value: Value) -> Enqueue {
        self.options.insert(key.to_string(), value);
        self
    }

    /// The arguments: anything serde serializes. An array (a `Vec`, a
    /// tuple) is the `args` array itself; any other value (a struct, a
    /// string) becomes its one element. A handler reads them back the same
    /// way (see [`Job::args_as`](crate::Job::args_as)).
    pub fn args<T: Serialize + ?Sized>(mut self, args: &T) -> Enqueue {
        match serde_json::to_value(args) {
            Ok(Value::Array(list)) => {
                self.body.insert("args".into(), Value::Array(list));
                self
            }
            Ok(value) => {
                self.body.insert("args".into(), Value::Array(vec![value]));
                self
            }
            Err(error) => self.fail("args", format!("the arguments do not serialize to JSON: {error}")),
        }
    }

    /// Arguments given as JSON values, one per element of `args`.
    pub fn args_list(mut self, args: Vec<Value>) -> Enqueue {
        self.body.insert("args".into(), Value::Array(args));
        self
    }

    /// A client-chosen id (a UUIDv7, see [`new_job_id`]): it makes the
    /// enqueue safe to retry after a failure that may have been applied.
    pub fn id(mut self, id: impl Into<String>) -> Enqueue {
        self.body.insert("id".into(), Value::String(id.into()));
        self
    }

    /// Gives the job a fresh client-chosen id ([`new_job_id`]) unless it has one.
    pub fn with_new_id(self) -> Enqueue {
        if self.job_id().is_some() { self } else { self.id(new_job_id()) }
    }

    /// The queue (default `default`).
    pub fn queue(self, queue: impl Into<String>) -> Enqueue {
        self.option("queue", Value::String(queue.into()))
    }

    /// −100 to 100, higher first (default 0).
    pub fn priority(self, priority: i32) -> Enqueue {
        self.option("priority", json!(priority))
    }

    /// Runs `delay` from now, by the server's clock.
    pub fn delay(mut self, delay: Duration) -> Enqueue {
        self.options.remove("scheduled_at");
        if delay.is_zero() {
            self
        } else {
            self.option("scheduled_at", Value::String(format!("+{}", iso_duration(delay))))
        }
    }

    /// Runs at `at` (a time in the past means now).
    pub fn scheduled_at(self, at: SystemTime) -> Enqueue {
        self.option("scheduled_at", Value::String(rfc3339(at)))
    }

    /// Not started by `at`: discarded (error `expired`).
    pub fn expires_at(self, at: SystemTime) -> Enqueue {
        self.option("expires_at", Value::String(rfc3339(at)))
    }

    /// Not started within `ttl` from now (by the server's clock): discarded.
    pub fn expires_in(self, ttl: Duration) -> Enqueue {
        self.option("expires_at", Value::String(format!("+{}", iso_duration(ttl))))
    }

    /// The execution timeout (1 ms to 24 h, default 30 s).
    pub fn timeout(self, timeout: Duration) -> Enqueue {
        self.option("timeout_ms", json!(millis(timeout)))
    }

    /// The visibility timeout: how long a claim lasts without a heartbeat
    /// (1 ms to 24 h, default 30 s).
    pub fn visibility_timeout(self, timeout: Duration) -> Enqueue {
        self.option("visibility_timeout_ms", json!(millis(timeout)))
    }

    /// The retry policy, merged over the server's default.
    pub fn retry(self, policy: RetryPolicy) -> Enqueue {
        self.option("retry", policy.to_json())
    }

    /// Unique among the jobs svc holds (see [`UniquePolicy`]).
    pub fn unique(self, policy: UniquePolicy) -> Enqueue {
        self.option("unique", policy.to_json())
    }

    /// A dispatch limit shared by the jobs of one key (see [`RateLimit`]).
    pub fn rate_limit(self, limit: RateLimit) -> Enqueue {
        self.option("rate_limit", limit.to_json())
    }

    /// Up to 32 tags.
    pub fn tags<I: IntoIterator<Item = S>, S: Into<String>>(self, tags: I) -> Enqueue {
        let tags: Vec<Value> = tags.into_iter().map(|tag| Value::String(tag.into())).collect();
        self.option("tags", Value::Array(tags))
    }

    /// Stages the job: stored `pending` until [`Client::activate`](crate::Client::activate).
    pub fn pending(self) -> Enqueue {
        self.option("pending", Value::Bool(true))
    }

    /// `meta`: anything that serializes to a JSON object (at most 64 KiB).
    /// Replaces earlier `meta` but keeps a `traceparent` set before.
    pub fn meta<T: Serialize + ?Sized>(mut self, meta: &T) -> Enqueue {
        match serde_json::to_value(meta) {
            Ok(Value::Object(mut object)) => {
                if let Some(Value::Object(old)) = self.body.get("meta")
                    && let Some(trace) = old.get("traceparent")
                {
                    object.entry("traceparent").or_insert_with(|| trace.clone());
                }
                self.body.insert("meta".into(), Value::Object(object));
                self
            }
            Ok(_) => self.fail("meta", "meta must serialize to a JSON object"),
            Err(error) => self.fail("meta", format!("meta does not serialize to JSON: {error}")),
        }
    }

    /// Sets one key of `meta`.
    pub fn meta_entry(mut self, key: impl Into<String>, value: impl Into<Value>) -> Enqueue {
        self.meta_mut().insert(key.into(), value.into());
        self
    }

    /// The W3C trace context the handler sees as
    /// [`JobContext::traceparent`](crate::JobContext::traceparent)
    /// (`meta.traceparent`).
    pub fn traceparent(self, traceparent: impl Into<String>) -> Enqueue {
        self.meta_entry("traceparent", Value::String(traceparent.into()))
    }

    /// A registered JSON Schema (its URI) the arguments must match.
    pub fn schema(mut self, uri: impl Into<String>) -> Enqueue {
        self.body.insert("schema".into(), Value::String(uri.into()));
        self
    }

    /// Any other option under `options`, as JSON (for options newer than
    /// this client).
    pub fn raw_option(self, key: impl Into<String>, value: Value) -> Enqueue {
        let key = key.into();
        self.option(&key, value)
    }

    /// The job type.
    pub fn job_type(&self) -> &str {
        self.body.get("type").and_then(Value::as_str).unwrap_or_default()
    }

    /// The client-chosen id, if any.
    pub fn job_id(&self) -> Option<&str> {
        self.body.get("id").and_then(Value::as_str)
    }

    /// The queue the job goes to, if set.
    pub fn queue_name(&self) -> Option<&str> {
        self.options.get("queue").and_then(Value::as_str)
    }

    /// `meta`, to read or change (enqueue middleware).
    pub fn meta_mut(&mut self) -> &mut Map<String, Value> {
        let meta = self.body.entry("meta").or_insert_with(|| Value::Object(Map::new()));
        if !meta.is_object() {
            *meta = Value::Object(Map::new());
        }
        meta.as_object_mut().expect("meta is an object")
    }

    /// `meta`, if any was set.
    pub fn meta_ref(&self) -> Option<&Map<String, Value>> {
        self.body.get("meta").and_then(Value::as_object)
    }

    /// The enqueue body sent to svc (`{type, args, id?, meta?, schema?, options}`).
    pub fn to_json(&self) -> Result<Value> {
        if let Some((field, message)) = &self.problem {
            return Err(Error::invalid(Some(field.clone()), message.clone()));
        }
        let mut body = self.body.clone();
        if !self.options.is_empty() {
            body.insert("options".into(), Value::Object(self.options.clone()));
        }
        Ok(Value::Object(body))
    }
}

/// What happens after a failed attempt (docs/api.md, "The retry policy");
/// unset fields keep the server's default.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct RetryPolicy {
    pub max_attempts: Option<u32>,
    pub initial_interval: Option<Duration>,
    pub backoff_coefficient: Option<f64>,
    pub max_interval: Option<Duration>,
    pub jitter: Option<bool>,
    pub non_retryable_errors: Option<Vec<String>>,
    /// `true`: `on_exhaustion: dead_letter` (kept 30 days instead of 7).
    pub dead_letter: Option<bool>,
}

impl RetryPolicy {
    /// The server's default policy (no field set).
    pub fn new() -> RetryPolicy {
        RetryPolicy::default()
    }

    /// 0 to 1000; 0 and 1 both mean the first failure is final.
    pub fn max_attempts(mut self, attempts: u32) -> RetryPolicy {
        self.max_attempts = Some(attempts);
        self
    }

    /// The delay before the first retry, and the factor each retry multiplies it by.
    pub fn backoff(mut self, initial: Duration, coefficient: f64) -> RetryPolicy {
        self.initial_interval = Some(initial);
        self.backoff_coefficient = Some(coefficient);
        self
    }

    /// The longest delay between attempts.
    pub fn max_interval(mut self, max: Duration) -> RetryPolicy {
        self.max_interval = Some(max);
        self
    }

    /// Whether delays are multiplied by a random factor in [0.5, 1.5).
    pub fn jitter(mut self, jitter: bool) -> RetryPolicy {
        self.jitter = Some(jitter);
        self
    }

    /// Error types (or `prefix.*` patterns) that are never retried.
    pub fn non_retryable<I: IntoIterator<Item = S>, S: Into<String>>(mut self, errors: I) -> RetryPolicy {
        self.non_retryable_errors = Some(errors.into_iter().map(Into::into).collect());
        self
    }

    /// Exhausted jobs go to the dead letter listing for 30 days (`on_exhaustion: dead_letter`).
    pub fn dead_letter(mut self) -> RetryPolicy {
        self.dead_letter = Some(true);
        self
    }

    /// The policy as svc reads it.
    pub fn to_json(&self) -> Value {
        let mut out = Map::new();
        if let Some(attempts) = self.max_attempts {
            out.insert("max_attempts".into(), json!(attempts));
        }
        if let Some(interval) = self.initial_interval {
            out.insert("initial_interval".into(), json!(iso_duration(interval)));
        }
        if let Some(coefficient) = self.backoff_coefficient {
            out.insert("backoff_coefficient".into(), json!(coefficient));
        }
        if let Some(interval) = self.max_interval {
            out.insert("max_interval".into(), json!(iso_duration(interval)));
        }
        if let Some(jitter) = self.jitter {
            out.insert("jitter".into(), json!(jitter));
        }
        if let Some(errors) = &self.non_retryable_errors {
            out.insert("non_retryable_errors".into(), json!(errors));
        }
        if let Some(dead_letter) = self.dead_letter {
            out.insert("on_exhaustion".into(), json!(if dead_letter { "dead_letter" } else { "discard" }));
        }
        Value::Object(out)
    }
}

/// What a unique job does when svc holds one with the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnConflict {
    /// 409 `duplicate`; nothing stored (the default).
    Reject,
    /// Answers the held job, marked [`deduplicated`](crate::Job::deduplicated).
    Ignore,
    /// Cancels the held job, then stores the new one.
    Replace,
}

impl OnConflict {
    fn as_str(self) -> &'static str {
        match self {
            OnConflict::Reject => "reject",
            OnConflict::Ignore => "ignore",
            OnConflict::Replace => "replace",
        }
    }
}

/// Unique among the jobs svc holds (docs/api.md, "Unique jobs").
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct UniquePolicy {
    /// Names of the properties (of the first object argument) that make
    /// the key; `None`: the whole `args`.
    pub key: Option<Vec<String>>,
    /// Only jobs created within this period conflict.
    pub period: Option<Duration>,
    pub on_conflict: Option<OnConflict>,
    /// The states a held job must be in to conflict (default: every live one).
    pub states: Option<Vec<JobState>>,
}

impl UniquePolicy {
    /// Unique by type and the whole `args`, rejecting a conflict.
    pub fn new() -> UniquePolicy {
        UniquePolicy::default()
    }

    /// The properties that make the key.
    pub fn key<I: IntoIterator<Item = S>, S: Into<String>>(mut self, key: I) -> UniquePolicy {
        self.key = Some(key.into_iter().map(Into::into).collect());
        self
    }

    pub fn period(mut self, period: Duration) -> UniquePolicy {
        self.period = Some(period);
        self
    }

    pub fn on_conflict(mut self, on_conflict: OnConflict) -> UniquePolicy {
        self.on_conflict = Some(on_conflict);
        self
    }

    pub fn states<I: IntoIterator<Item = JobState>>(mut self, states: I) -> UniquePolicy {
        self.states = Some(states.into_iter().collect());
        self
    }

    /// The policy as svc reads it.
    pub fn to_json(&self) -> Value {
        let mut out = Map::new();
        if let Some(key) = &self.key {
            out.insert("key".into(), json!(key));
        }
        if let Some(period) = self.period {
            out.insert("period".into(), json!(iso_duration(period)));
        }
        if let Some(on_conflict) = self.on_conflict {
            out.insert("on_conflict".into(), json!(on_conflict.as_str()));
        }
        if let Some(states) = &self.states {
            out.insert("states".into(), json!(states.iter().map(|state| state.as_str()).collect::<Vec<_>>()));
        }
        Value::Object(out)
    }
}

/// The window of a claim rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RatePeriod {
    Second,
    Minute,
    Hour,
}

/// How many jobs sharing a key are handed out (docs/api.md, "Dispatch limits").
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct RateLimit {
    /// Default: the job's queue.
    pub key: Option<String>,
    /// At most this many `active` jobs under the key.
    pub concurrency: Option<u32>,
    /// At most this many claims per second.
    pub max_per_second: Option<u32>,
    /// At most this many claims per sliding window.
    pub rate: Option<(u32, RatePeriod)>,
}

impl RateLimit {
    /// No limit yet: set at least one of concurrency, max per second, rate.
    pub fn new() -> RateLimit {
        RateLimit::default()
    }

    pub fn key(mut self, key: impl Into<String>) -> RateLimit {
        self.key = Some(key.into());
        self
    }

    pub fn concurrency(mut self, concurrency: u32) -> RateLimit {
        self.concurrency = Some(concurrency);
        self
    }

    pub fn max_per_second(mut self, max: u32) -> RateLimit {
        self.max_per_second = Some(max);
        self
    }

    pub fn rate(mut self, claims: u32, period: RatePeriod) -> RateLimit {
        self.rate = Some((claims, period));
        self
    }

    /// The limit as svc reads it.
    pub fn to_json(&self) -> Value {
        let mut out = Map::new();
        if let Some(key) = &self.key {
            out.insert("key".into(), json!(key));
        }
        if let Some(concurrency) = self.concurrency {
            out.insert("concurrency".into(), json!(concurrency));
        }
        if let Some(max) = self.max_per_second {
            out.insert("max_per_second".into(), json!(max));
        }
        if let Some((rate, period)) = self.rate {
            let period = match period {
                RatePeriod::Second => "second",
                RatePeriod::Minute => "minute",
                RatePeriod::Hour => "hour",
            };
            out.insert("rate".into(), json!(rate));
            out.insert("period".into(), json!(period));
        }
        Value::Object(out)
    }
}

/// A fresh job id: a UUIDv7 (the time now, then random bits), lower case.
/// Give it to [`Enqueue::id`] to make an enqueue safe to retry.
pub fn new_job_id() -> String {
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
    let random: u128 = rand::random();
    let value = ((ms & 0xffff_ffff_ffff) << 80)
        | (0x7 << 76)
        | (((random >> 64) & 0xfff) << 64)
        | (0b10 << 62)
        | (random & ((1 << 62) - 1));
    let hex = format!("{value:032x}");
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// An ISO 8601 duration of seconds (`PT90S`, `PT1.5S`); at least a millisecond.
pub fn iso_duration(duration: Duration) -> String {
    let ms = millis(duration).max(1);
    if ms.is_multiple_of(1000) { format!("PT{}S", ms / 1000) } else { format!("PT{}.{:03}S", ms / 1000, ms % 1000) }
}

/// RFC 3339 in UTC with milliseconds (`2026-01-02T03:04:05.678Z`).
pub fn rfc3339(at: SystemTime) -> String {
    let ms = match at.duration_since(UNIX_EPOCH) {
        Ok(after) => i128::try_from(after.as_millis()).unwrap_or(i128::MAX),
        Err(before) => -i128::try_from(before.duration().as_millis()).unwrap_or(i128::MAX),
    };
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i128::from(month <= 2);
    let (hour, minute, second, milli) = (in_day / 3_600_000, in_day / 60_000 % 60, in_day / 1000 % 60, in_day % 1000);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{milli:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_written_as_svc_reads_them() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_millis(1_767_323_045_678)), "2026-01-02T03:04:05.678Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00.000Z");
        assert_eq!(iso_duration(Duration::from_secs(90)), "PT90S");
        assert_eq!(iso_duration(Duration::from_millis(1500)), "PT1.500S");
        assert_eq!(iso_duration(Duration::ZERO), "PT0.001S");
    }

    #[test]
    fn new_ids_are_lower_case_uuidv7_in_time_order() {
        let first = new_job_id();
        std::thread::sleep(Duration::from_millis(2));
        let second = new_job_id();
        assert_eq!(first.len(), 36);
        assert_eq!(&first[14..15], "7");
        assert!(matches!(&first[19..20], "8" | "9" | "a" | "b"));
        assert_eq!(first, first.to_lowercase());
        assert!(first < second);
    }

    #[test]
    fn arguments_that_are_not_an_array_become_its_one_element() {
        #[derive(Serialize)]
        struct Email {
            to: &'static str,
        }
        let job = Enqueue::new("email.send").args(&Email { to: "a@example.com" }).to_json().unwrap();
        assert_eq!(job["args"], json!([{"to": "a@example.com"}]));
        let job = Enqueue::new("email.send").args(&("a", 2)).to_json().unwrap();
        assert_eq!(job["args"], json!(["a", 2]));
        let job = Enqueue::new("email.send").args("a").to_json().unwrap();
        assert_eq!(job["args"], json!(["a"]));
    }

    #[test]
    fn a_traceparent_survives_a_later_meta() {
        let job = Enqueue::new("a.b").traceparent("00-1-2-01").meta(&json!({"tenant": 7})).to_json().unwrap();
        assert_eq!(job["meta"], json!({"tenant": 7, "traceparent": "00-1-2-01"}));
        assert!(Enqueue::new("a.b").meta(&json!([1])).to_json().is_err());
    }
}
