//! Wire rendering: the one full job rendering used by every response
//! (docs/api.md, "The job object") and the pieces the event envelope
//! (`engine/events/render.rs`) is built of. Raw JSON (`args`, `meta`,
//! `result`, unknown fields) is copied verbatim.

use serde_json::Value;
use std::cell::RefCell;
use std::sync::Arc;

use crate::job::json::{push_ascii, push_json_string};
use crate::job::time::{push_duration_ms, push_timestamp};
use crate::job::{FailureReport, Job, JobId, RetryPolicy};

/// Builds a JSON object by appending text.
pub struct ObjectWriter {
    out: String,
    first: bool,
}

impl Default for ObjectWriter {
    fn default() -> Self {
        Self::continuing(String::with_capacity(256))
    }
}

impl ObjectWriter {
    /// An object written after what `out` already holds.
    pub fn continuing(mut out: String) -> Self {
        out.push('{');
        Self { out, first: true }
    }

    fn key(&mut self, key: &str) {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        if key.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_') {
            // The common case, every key of ours: nothing to escape.
            self.out.reserve(key.len() + 3);
            self.out.push('"');
            self.out.push_str(key);
            self.out.push_str("\":");
        } else {
            push_json_string(&mut self.out, key);
            self.out.push(':');
        }
    }

    pub fn raw(&mut self, key: &str, json: &str) -> &mut Self {
        self.key(key);
        self.out.push_str(json);
        self
    }

    pub fn string(&mut self, key: &str, text: &str) -> &mut Self {
        self.key(key);
        push_json_string(&mut self.out, text);
        self
    }

    pub fn number(&mut self, key: &str, number: impl itoa::Integer) -> &mut Self {
        self.key(key);
        self.out.push_str(itoa::Buffer::new().format(number));
        self
    }

    pub fn time(&mut self, key: &str, ms: i64) -> &mut Self {
        self.key(key);
        self.out.push('"');
        push_timestamp(&mut self.out, ms);
        self.out.push('"');
        self
    }

    pub fn value(&mut self, key: &str, value: &Value) -> &mut Self {
        self.key(key);
        // Writing a Value into a String cannot fail.
        let _ = serde_json::to_writer(StringWriter(&mut self.out), value);
        self
    }

    /// A job id as its hyphenated string.
    pub fn id(&mut self, key: &str, id: JobId) -> &mut Self {
        self.key(key);
        self.out.push('"');
        push_ascii(&mut self.out, &id.to_hyphenated());
        self.out.push('"');
        self
    }

    pub fn bool(&mut self, key: &str, value: bool) -> &mut Self {
        self.raw(key, if value { "true" } else { "false" })
    }

    /// A time, or `null`.
    pub fn optional_time(&mut self, key: &str, ms: Option<i64>) -> &mut Self {
        match ms {
            Some(ms) => self.time(key, ms),
            None => self.raw(key, "null"),
        }
    }

    /// An object under `key`, written by `write`.
    pub fn object(&mut self, key: &str, write: impl FnOnce(&mut ObjectWriter)) -> &mut Self {
        self.key(key);
        let mut inner = ObjectWriter::continuing(std::mem::take(&mut self.out));
        write(&mut inner);
        self.out = inner.finish();
        self
    }

    /// The full job rendering under `key`.
    pub fn job(&mut self, key: &str, job: &Job) -> &mut Self {
        self.key(key);
        push_job(&mut self.out, job, &[]);
        self
    }

    pub fn finish(mut self) -> String {
        self.out.push('}');
        self.out
    }
}

/// `io::Write` into a `String`, for serde_json's writer (which only writes UTF-8).
struct StringWriter<'a>(&'a mut String);

impl std::io::Write for StringWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let text = std::str::from_utf8(bytes).map_err(std::io::Error::other)?;
        self.0.push_str(text);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The full job rendering; `extra` adds response-specific keys (e.g. `previous_state`).
pub fn render_job(job: &Job, extra: &[(&str, Value)]) -> String {
    let mut out = String::with_capacity(1024);
    push_job(&mut out, job, extra);
    out
}

/// `{"job": <the job>}`, the body of single-job responses.
pub fn job_body(job: &Job) -> String {
    let mut out = String::with_capacity(1024);
    out.push_str("{\"job\":");
    push_job(&mut out, job, &[]);
    out.push('}');
    out
}

/// `{"<key>": [<jobs>]` with the object left open for more keys.
pub fn jobs_object(key: &str, jobs: &[std::sync::Arc<Job>]) -> ObjectWriter {
    jobs_object_with(key, jobs, |_| Vec::new())
}

/// `jobs_object`, each job followed by the fields `extra` gives it.
pub fn jobs_object_with(
    key: &str,
    jobs: &[std::sync::Arc<Job>],
    extra: impl Fn(&Job) -> Vec<(&'static str, Value)>,
) -> ObjectWriter {
    let mut out = String::with_capacity(64 + 1024 * jobs.len());
    out.push('{');
    push_json_string(&mut out, key);
    out.push_str(":[");
    for (index, job) in jobs.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        push_job(&mut out, job, &extra(job));
    }
    out.push(']');
    ObjectWriter { out, first: false }
}

/// `,"name":`, built at compile time.
macro_rules! key {
    ($name:literal) => {
        concat!(",\"", $name, "\":")
    };
}

/// Appends the full job rendering to `out`. The fixed fields are written
/// with their keys as literals: this runs for every job in every response.
pub fn push_job(out: &mut String, job: &Job, extra: &[(&str, Value)]) {
    out.reserve(1024);
    out.push_str("{\"specversion\":\"1.0\",\"id\":\"");
    push_ascii(out, &job.id.to_hyphenated());
    out.push('"');
    out.push_str(key!("type"));
    push_json_string(out, job.payload.job_type());
    out.push_str(key!("queue"));
    push_json_string(out, &job.queue);
    out.push_str(key!("args"));
    out.push_str(job.payload.args());
    out.push_str(key!("meta"));
    out.push_str(job.payload.meta());
    out.push_str(key!("state"));
    push_json_string(out, job.state.as_str());
    push_number(out, key!("priority"), job.priority);
    push_number(out, key!("attempt"), job.attempt);
    push_number(out, key!("max_attempts"), job.max_attempts());
    push_number(out, key!("timeout"), job.timeout_ms.div_ceil(1000));
    push_number(out, key!("timeout_ms"), job.timeout_ms);
    push_number(out, key!("visibility_timeout"), job.visibility_timeout_ms.div_ceil(1000));
    push_number(out, key!("visibility_timeout_ms"), job.visibility_timeout_ms);
    out.push_str(key!("retry"));
    push_retry(out, &job.retry);
    out.push_str(key!("tags"));
    push_strings(out, job.payload.tags());
    push_time(out, key!("created_at"), Some(job.created_at));
    if !job.extras().is_empty() {
        push_extras(out, job);
    }
    push_time(out, key!("scheduled_at"), job.scheduled_at());
    push_time(out, key!("expires_at"), job.expires_at());
    push_time(out, key!("enqueued_at"), job.enqueued_at());
    push_time(out, key!("activated_at"), job.activated_at());
    push_time(out, key!("started_at"), job.run().started_at);
    if let Some(worker) = &job.run().worker_id {
        out.push_str(key!("worker_id"));
        push_json_string(out, worker);
    }
    push_time(out, key!("completed_at"), job.run().completed_at);
    push_time(out, key!("cancelled_at"), job.run().cancelled_at);
    push_time(out, key!("discarded_at"), job.run().discarded_at);
    push_time(out, key!("retry_at"), job.run().retry_at);
    if let Some(delay) = job.run().retry_delay_ms {
        push_number(out, key!("retry_delay_ms"), delay);
    }
    if let Some(result) = &job.run().result {
        out.push_str(key!("result"));
        out.push_str(result);
    }
    // The rest is rare: failures, unknown envelope fields, response extras.
    let mut object = ObjectWriter { out: std::mem::take(out), first: false };
    if let Some(error) = &job.run().error {
        object.raw("error", &render_report(error, None));
    }
    if !job.run().errors.is_empty() {
        let entries: Vec<String> = job
            .run()
            .errors
            .iter()
            .map(|entry| render_report(&entry.report, Some((entry.attempt, entry.occurred_at))))
            .collect();
        object.raw("errors", &format!("[{}]", entries.join(",")));
    }
    for (key, value) in job.payload.extra() {
        object.raw(key, value);
    }
    for (key, value) in extra {
        object.value(key, value);
    }
    *out = object.finish();
}

/// The attributes few jobs carry: unique policy and key, dispatch limit.
fn push_extras(out: &mut String, job: &Job) {
    if let Some((policy, key)) = job.unique() {
        out.push_str(key!("unique"));
        policy.push_json(out);
        out.push_str(key!("unique_key"));
        out.push('"');
        out.push_str(&key.to_string());
        out.push('"');
    }
    if let Some(limit) = job.dispatch_limit() {
        out.push_str(key!("rate_limit"));
        limit.push_json(out);
    }
    if let Some(schema) = job.schema() {
        out.push_str(key!("schema"));
        push_json_string(out, schema);
    }
    if let Some(progress) = job.progress() {
        out.push_str(key!("progress"));
        out.push_str(&progress_number(progress.fraction));
        if let Some(message) = &progress.message {
            out.push_str(key!("progress_message"));
            push_json_string(out, message);
        }
    }
}

/// A progress fraction as JSON: shortest round-trip form, `1.0` as `1.0`.
pub fn progress_number(fraction: f64) -> String {
    ryu::Buffer::new().format(fraction).to_string()
}

/// `progress`, `message`, `data` and `updated_at` of a progress report.
pub fn push_progress_fields(object: &mut ObjectWriter, progress: &crate::job::JobProgress) {
    object.raw("progress", &progress_number(progress.fraction));
    match &progress.message {
        Some(message) => object.string("message", message),
        None => object.raw("message", "null"),
    };
    object.raw("data", progress.data.as_deref().unwrap_or("null")).time("updated_at", progress.updated_at);
}

fn push_number(out: &mut String, key: &str, number: impl itoa::Integer) {
    out.push_str(key);
    out.push_str(itoa::Buffer::new().format(number));
}

/// A timestamp field, left out when absent.
fn push_time(out: &mut String, key: &str, ms: Option<i64>) {
    if let Some(ms) = ms {
        out.push_str(key);
        out.push('"');
        push_timestamp(out, ms);
        out.push('"');
    }
}

fn push_strings(out: &mut String, items: &[String]) {
    out.push('[');
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        push_json_string(out, item);
    }
    out.push(']');
}

/// Policies rendered lately on this thread, most recent first. Jobs share
/// their policy (`Arc`), nearly all of them the server default or one a
/// client sends with every job, so a few entries spare nearly every job the
/// float and duration formatting. Holding the `Arc` keeps its address from
/// being reused by another policy while it is remembered.
struct RenderedPolicies(Vec<(Arc<RetryPolicy>, Box<str>)>);

const RENDERED_POLICIES_MAX: usize = 8;

thread_local! {
    static RENDERED_POLICIES: RefCell<RenderedPolicies> = const { RefCell::new(RenderedPolicies(Vec::new())) };
}

/// The effective retry policy, durations in ISO 8601.
fn push_retry(out: &mut String, policy: &Arc<RetryPolicy>) {
    RENDERED_POLICIES.with_borrow_mut(|RenderedPolicies(recent)| {
        if let Some(index) = recent.iter().position(|(known, _)| Arc::ptr_eq(known, policy)) {
            out.push_str(&recent[index].1);
            // Keep the ones in use near the front.
            recent[..=index].rotate_right(1);
            return;
        }
        let mut text = String::with_capacity(200);
        render_retry(&mut text, policy);
        out.push_str(&text);
        if recent.len() == RENDERED_POLICIES_MAX {
            recent.pop();
        }
        recent.insert(0, (policy.clone(), text.into_boxed_str()));
    });
}

fn render_retry(out: &mut String, policy: &RetryPolicy) {
    out.push_str("{\"max_attempts\":");
    out.push_str(itoa::Buffer::new().format(policy.max_attempts));
    out.push_str(key!("initial_interval"));
    out.push('"');
    push_duration_ms(out, policy.initial_interval_ms);
    out.push('"');
    out.push_str(key!("backoff_coefficient"));
    out.push_str(&render_float(policy.backoff_coefficient));
    out.push_str(key!("max_interval"));
    out.push('"');
    push_duration_ms(out, policy.max_interval_ms);
    out.push('"');
    out.push_str(key!("jitter"));
    out.push_str(if policy.jitter { "true" } else { "false" });
    out.push_str(key!("non_retryable_errors"));
    push_strings(out, &policy.non_retryable_errors);
    out.push_str(key!("on_exhaustion"));
    push_json_string(out, policy.on_exhaustion.as_str());
    out.push('}');
}

/// A finite float as serde_json writes it (`2.0`, `1.5`); `null` otherwise.
fn render_float(value: f64) -> String {
    if value.is_finite() { ryu::Buffer::new().format_finite(value).to_string() } else { "null".to_string() }
}

/// A failure as `{type, code, message, ...}`; history entries add attempt and time.
fn render_report(report: &FailureReport, history: Option<(u32, i64)>) -> String {
    let mut object = ObjectWriter::default();
    object.string("type", &report.error_type).string("code", &report.code).string("message", &report.message);
    if let Some((attempt, occurred_at)) = history {
        object.number("attempt", attempt).time("occurred_at", occurred_at);
    }
    if !report.backtrace.is_empty() {
        object.value("backtrace", &Value::from(report.backtrace.clone()));
    }
    if history.is_none()
        && let Some(retryable) = report.retryable
    {
        object.bool("retryable", retryable);
    }
    if let Some(details) = &report.details {
        object.raw("details", details);
    }
    object.finish()
}

/// A failure as a `Value` (`{type, code, message}`, with `retryable` if
/// asked), as events carry it.
pub fn report_value(report: &FailureReport, with_retryable: bool) -> Value {
    let mut value = serde_json::json!({"type": report.error_type, "code": report.code, "message": report.message});
    if with_retryable {
        value["retryable"] = report.retryable.unwrap_or(true).into();
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_retry_policy_renders_as_itself_however_many_take_turns() {
        let policies: Vec<Arc<RetryPolicy>> = (0..20)
            .map(|n| {
                Arc::new(RetryPolicy {
                    max_attempts: n + 1,
                    backoff_coefficient: 1.5 + f64::from(n),
                    non_retryable_errors: vec![format!("E{n}")],
                    ..RetryPolicy::default()
                })
            })
            .collect();
        // Few policies in turn (all remembered), then more than are remembered.
        let orders = [vec![0, 1, 0, 2, 1, 0], (0..20).collect(), (0..20).rev().collect(), vec![3, 3, 19, 3, 0]];
        for index in orders.into_iter().flatten() {
            let policy = &policies[index];
            let mut cached = String::from("x");
            push_retry(&mut cached, policy);
            let mut fresh = String::from("x");
            render_retry(&mut fresh, policy);
            assert_eq!(cached, fresh);
            let rendered: Value = serde_json::from_str(&cached[1..]).unwrap();
            assert_eq!(rendered["max_attempts"], index + 1);
            assert_eq!(rendered["non_retryable_errors"][0], format!("E{index}"));
        }
    }
}
