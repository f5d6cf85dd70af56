//! [`JobBuilder`]: a job described in Rust for the embedding API. It builds
//! the same enqueue body an HTTP client would send and validates it the same
//! way, so the two front doors accept exactly the same jobs.

use serde::Serialize;
use serde_json::{Map, Value};
use std::time::Duration;

use super::enqueue::{JobDefaults, parse_enqueue_body};
use super::error::ValidationError;
use super::time::format_timestamp;
use super::{DispatchLimit, JobId, NewJob, RetryPolicy, UniquePolicy};
use crate::clock::Millis;

/// A job to enqueue. Only the type is required; `args` default to `[]`.
///
/// ```
/// use svc::job::{JobBuilder, JobDefaults, OnConflict, UniquePolicy};
/// let job = JobBuilder::new("email.send")
///     .args(("ada@example.com", 3))
///     .queue("mail")
///     .priority(10)
///     .unique(UniquePolicy { on_conflict: OnConflict::Ignore, ..UniquePolicy::default() })
///     .build(&JobDefaults::default())
///     .expect("a valid job");
/// assert_eq!(job.queue, "mail");
/// ```
#[derive(Debug, Clone)]
pub struct JobBuilder {
    body: Map<String, Value>,
    options: Map<String, Value>,
    /// The first value that could not be turned into JSON, by field.
    unserializable: Option<(&'static str, String)>,
}

impl JobBuilder {
    pub fn new(job_type: impl Into<String>) -> Self {
        let mut body = Map::new();
        body.insert("type".into(), Value::String(job_type.into()));
        body.insert("args".into(), Value::Array(Vec::new()));
        JobBuilder { body, options: Map::new(), unserializable: None }
    }

    /// The arguments: anything that serializes to a JSON array (a tuple, a
    /// `Vec`, an array).
    pub fn args(mut self, args: impl Serialize) -> Self {
        self.set_serialized("args", args);
        self
    }

    /// Metadata: anything that serializes to a JSON object.
    pub fn meta(mut self, meta: impl Serialize) -> Self {
        self.set_serialized("meta", meta);
        self
    }

    /// The job's id instead of a generated one.
    pub fn id(mut self, id: JobId) -> Self {
        self.body.insert("id".into(), Value::String(id.to_string()));
        self
    }

    pub fn queue(self, queue: impl Into<String>) -> Self {
        self.option("queue", Value::String(queue.into()))
    }

    /// −100 (last) … 100 (first).
    pub fn priority(self, priority: i32) -> Self {
        self.option("priority", priority.into())
    }

    pub fn tags<I: IntoIterator<Item = S>, S: Into<String>>(self, tags: I) -> Self {
        self.option("tags", Value::Array(tags.into_iter().map(|tag| Value::String(tag.into())).collect()))
    }

    /// How long one attempt may run.
    pub fn timeout(self, timeout: Duration) -> Self {
        self.option("timeout_ms", millis(timeout).into())
    }

    /// How long a claim lasts without a heartbeat.
    pub fn visibility_timeout(self, timeout: Duration) -> Self {
        self.option("visibility_timeout_ms", millis(timeout).into())
    }

    /// Not to run before this time (milliseconds since the Unix epoch).
    pub fn scheduled_at(self, at: Millis) -> Self {
        self.option("scheduled_at", Value::String(format_timestamp(at)))
    }

    /// Not to run before this much time has passed.
    pub fn delay(self, delay: Duration) -> Self {
        self.option("delay_until", Value::String(format!("+PT{}S", delay.as_secs_f64())))
    }

    /// Discarded if not started by this time (milliseconds since the Unix epoch).
    pub fn expires_at(self, at: Millis) -> Self {
        self.option("expires_at", Value::String(format_timestamp(at)))
    }

    /// The retry policy, whole.
    pub fn retry(self, policy: &RetryPolicy) -> Self {
        self.option("retry", policy.to_json())
    }

    /// Never two held jobs with the same key (docs/api.md, "Unique jobs").
    pub fn unique(self, policy: UniquePolicy) -> Self {
        let mut text = String::new();
        policy.push_json(&mut text);
        self.option("unique", serde_json::from_str(&text).expect("a policy renders as JSON"))
    }

    /// Limits how many jobs of a key run at once or per period (docs/api.md, "Dispatch limits").
    pub fn rate_limit(self, limit: DispatchLimit) -> Self {
        let mut text = String::new();
        limit.push_json(&mut text);
        self.option("rate_limit", serde_json::from_str(&text).expect("a limit renders as JSON"))
    }

    /// The registered schema (its URI) that `args` must match (docs/api.md, "Schemas").
    pub fn schema(mut self, uri: impl Into<String>) -> Self {
        self.body.insert("schema".into(), Value::String(uri.into()));
        self
    }

    /// Staged: stored `pending` until [`Svc::activate`](crate::Svc::activate).
    pub fn pending(self) -> Self {
        self.option("pending", Value::Bool(true))
    }

    /// Validates the job as the server validates an enqueue body.
    pub fn build(self, defaults: &JobDefaults) -> Result<NewJob, ValidationError> {
        let body = self.into_json()?;
        parse_enqueue_body(body.to_string().as_bytes(), defaults)
    }

    /// The enqueue body this builder stands for.
    pub fn into_json(self) -> Result<Value, ValidationError> {
        if let Some((field, problem)) = self.unserializable {
            return Err(ValidationError::payload(field, format!("{field} does not serialize to JSON: {problem}")));
        }
        let mut body = self.body;
        if !self.options.is_empty() {
            body.insert("options".into(), Value::Object(self.options));
        }
        Ok(Value::Object(body))
    }

    fn option(mut self, name: &str, value: Value) -> Self {
        self.options.insert(name.into(), value);
        self
    }

    fn set_serialized(&mut self, field: &'static str, value: impl Serialize) {
        match serde_json::to_value(value) {
            Ok(value) => {
                self.body.insert(field.into(), value);
            }
            Err(error) => {
                self.unserializable.get_or_insert((field, error.to_string()));
            }
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{JobState, OnConflict};

    #[test]
    fn every_setting_reaches_the_job() {
        let policy = UniquePolicy { on_conflict: OnConflict::Replace, ..UniquePolicy::default() };
        let job = JobBuilder::new("report.build")
            .args(vec![1, 2])
            .meta(serde_json::json!({"trace_id": "t"}))
            .queue("reports")
            .priority(-3)
            .tags(["a", "b"])
            .timeout(Duration::from_secs(90))
            .visibility_timeout(Duration::from_millis(1500))
            .unique(policy.clone())
            .pending()
            .build(&JobDefaults::default())
            .unwrap();
        assert_eq!((job.payload.job_type(), job.payload.args()), ("report.build", "[1,2]"));
        assert_eq!(
            (job.queue.as_str(), job.priority, job.timeout_ms, job.visibility_timeout_ms),
            ("reports", -3, 90_000, 1500)
        );
        assert_eq!(job.payload.tags(), ["a", "b"]);
        assert_eq!(job.unique.as_deref(), Some(&policy));
        assert!(job.pending);
        assert!(policy.covers(JobState::Pending));
    }

    #[test]
    fn invalid_settings_are_refused_as_over_http() {
        let defaults = JobDefaults::default();
        let error = JobBuilder::new("t").priority(500).build(&defaults).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("options.priority"));
        let error = JobBuilder::new("t").args("not an array").build(&defaults).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("args"));
        assert!(JobBuilder::new("bad type").build(&defaults).is_err());
    }
}
