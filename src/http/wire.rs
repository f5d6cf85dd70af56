//! Wire rendering: the one full job rendering used by every response
//! (decisions §3.1) and the event envelope. Raw JSON (`args`, `meta`,
//! `result`, unknown fields) is copied verbatim.

use serde_json::Value;

use crate::engine::{CronInfo, Event, EventKind};
use crate::job::json::push_json_string;
use crate::job::time::format_timestamp;
use crate::job::{FailureReport, Job, JobId, JobState};

/// Builds a JSON object by appending text.
pub struct ObjectWriter {
    out: String,
    first: bool,
}

impl Default for ObjectWriter {
    fn default() -> Self {
        Self { out: String::from("{"), first: true }
    }
}

impl ObjectWriter {
    fn key(&mut self, key: &str) {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        push_json_string(&mut self.out, key);
        self.out.push(':');
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

    pub fn number(&mut self, key: &str, number: impl std::fmt::Display) -> &mut Self {
        self.key(key);
        self.out.push_str(&number.to_string());
        self
    }

    pub fn time(&mut self, key: &str, ms: i64) -> &mut Self {
        self.string(key, &format_timestamp(ms))
    }

    pub fn value(&mut self, key: &str, value: &Value) -> &mut Self {
        self.raw(key, &value.to_string())
    }

    pub fn finish(mut self) -> String {
        self.out.push('}');
        self.out
    }
}

/// The full job rendering; `extra` adds response-specific keys (e.g. `previous_state`).
pub fn render_job(job: &Job, extra: &[(&str, Value)]) -> String {
    let mut object = ObjectWriter::default();
    object
        .string("specversion", "1.0")
        .string("id", std::str::from_utf8(&job.id.to_hyphenated()).expect("ASCII"))
        .string("type", &job.payload.job_type)
        .string("queue", &job.queue)
        .raw("args", &job.payload.args)
        .raw("meta", &job.payload.meta)
        .string("state", job.state.as_str())
        .number("priority", job.priority)
        .number("attempt", job.attempt)
        .number("max_attempts", job.max_attempts())
        .number("timeout", job.timeout_ms.div_ceil(1000))
        .number("timeout_ms", job.timeout_ms)
        .number("visibility_timeout", job.visibility_timeout_ms.div_ceil(1000))
        .number("visibility_timeout_ms", job.visibility_timeout_ms)
        .raw("retry", &render_retry(&job.retry))
        .raw("tags", &render_strings(&job.payload.tags))
        .time("created_at", job.created_at);
    let times = [
        ("scheduled_at", job.scheduled_at),
        ("expires_at", job.expires_at),
        ("enqueued_at", job.enqueued_at),
        ("started_at", job.started_at),
    ];
    for (key, time) in times {
        if let Some(ms) = time {
            object.time(key, ms);
        }
    }
    if let Some(worker) = &job.worker_id {
        object.string("worker_id", worker);
    }
    for (key, time) in [
        ("completed_at", job.completed_at),
        ("cancelled_at", job.cancelled_at),
        ("discarded_at", job.discarded_at),
        ("retry_at", job.retry_at),
    ] {
        if let Some(ms) = time {
            object.time(key, ms);
        }
    }
    if let Some(delay) = job.retry_delay_ms {
        object.number("retry_delay_ms", delay);
    }
    if let Some(result) = &job.result {
        object.raw("result", result);
    }
    if let Some(error) = &job.error {
        object.raw("error", &render_report(error, None));
    }
    if !job.errors.is_empty() {
        let entries: Vec<String> = job
            .errors
            .iter()
            .map(|entry| render_report(&entry.report, Some((entry.attempt, entry.occurred_at))))
            .collect();
        object.raw("errors", &format!("[{}]", entries.join(",")));
    }
    for (key, value) in &job.payload.extra {
        object.raw(key, value);
    }
    for (key, value) in extra {
        object.value(key, value);
    }
    object.finish()
}

/// The effective retry policy, durations in ISO 8601.
fn render_retry(policy: &crate::job::RetryPolicy) -> String {
    use crate::job::time::format_duration_ms;
    let mut object = ObjectWriter::default();
    object
        .number("max_attempts", policy.max_attempts)
        .string("initial_interval", &format_duration_ms(policy.initial_interval_ms))
        .raw("backoff_coefficient", &Value::from(policy.backoff_coefficient).to_string())
        .string("max_interval", &format_duration_ms(policy.max_interval_ms))
        .raw("jitter", if policy.jitter { "true" } else { "false" })
        .raw("non_retryable_errors", &render_strings(&policy.non_retryable_errors))
        .string("on_exhaustion", policy.on_exhaustion.as_str());
    object.finish()
}

fn render_strings(items: &[String]) -> String {
    let mut out = String::from("[");
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        push_json_string(&mut out, item);
    }
    out.push(']');
    out
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
        object.raw("retryable", if retryable { "true" } else { "false" });
    }
    if let Some(details) = &report.details {
        object.raw("details", details);
    }
    object.finish()
}

fn report_value(report: &FailureReport, with_retryable: bool) -> Value {
    let mut value = serde_json::json!({"type": report.error_type, "code": report.code, "message": report.message});
    if with_retryable {
        value["retryable"] = report.retryable.unwrap_or(true).into();
    }
    value
}

/// The event envelope (decisions §20.1).
pub fn render_event(event: &Event) -> Value {
    let (component, data) = match (&event.kind, &event.job) {
        (EventKind::CronTriggered { cron, run_count }, job) => {
            let mut data = cron_data(cron);
            if let Some(job) = job {
                data["job_id"] = job.id.to_string().into();
                data["job_type"] = job.payload.job_type.clone().into();
                data["queue"] = job.queue.clone().into();
            }
            data["run_count"] = (*run_count).into();
            ("cron", data)
        }
        (EventKind::CronSkipped { cron, reason, existing_job_id, missed_count }, _) => {
            let mut data = cron_data(cron);
            data["reason"] = (*reason).into();
            if let Some(id) = existing_job_id {
                data["existing_job_id"] = id.to_string().into();
            }
            if let Some(count) = missed_count {
                data["missed_count"] = (*count).into();
            }
            ("cron", data)
        }
        (EventKind::WorkerStarted { worker_id }, _) => ("api", serde_json::json!({"worker_id": worker_id})),
        (EventKind::WorkerSignalled { worker_id, active_job_ids, by, .. }, _) => {
            let ids: Vec<String> = active_job_ids.iter().map(JobId::to_string).collect();
            ("api", serde_json::json!({"worker_id": worker_id, "active_job_ids": ids, "by": by}))
        }
        (_, Some(job)) => ("api", job_event_data(event, job)),
        (_, None) => ("api", serde_json::json!({})),
    };
    serde_json::json!({
        "specversion": "1.0",
        "id": event.id,
        "type": event.kind.type_name(),
        "source": format!("svc://svc/{component}"),
        "time": format_timestamp(event.time),
        "subject": event.subject(),
        "datacontenttype": "application/json",
        "data": data,
    })
}

fn cron_data(cron: &CronInfo) -> Value {
    serde_json::json!({
        "cron_name": cron.name,
        "schedule": cron.schedule,
        "timezone": cron.timezone,
        "scheduled_time": format_timestamp(cron.scheduled_time),
    })
}

/// `data` of a `job.*` event.
fn job_event_data(event: &Event, job: &Job) -> Value {
    let mut data = serde_json::json!({
        "job_id": job.id.to_string(),
        "job_type": job.payload.job_type,
        "queue": job.queue,
    });
    if let Ok(Value::Object(meta)) = serde_json::from_str::<Value>(&job.payload.meta)
        && let Some(trace_id) = meta.get("trace_id")
    {
        data["trace_id"] = trace_id.clone();
    }
    let duration = job.started_at.map(|started| event.time - started);
    let fields: Vec<(&str, Value)> = match &event.kind {
        EventKind::Enqueued => {
            let mut fields = vec![
                (
                    "state",
                    Value::from(if job.state == JobState::Pending {
                        "pending"
                    } else if job.scheduled_at.is_some_and(|at| at > event.time) {
                        "scheduled"
                    } else {
                        "available"
                    }),
                ),
                ("priority", job.priority.into()),
            ];
            if let Some(at) = job.scheduled_at {
                fields.push(("scheduled_at", format_timestamp(at).into()));
            }
            fields
        }
        EventKind::Scheduled => vec![("scheduled_at", job.scheduled_at.map(format_timestamp).into())],
        EventKind::Started => {
            let mut fields = vec![("attempt", Value::from(job.attempt))];
            if let Some(worker) = &job.worker_id {
                fields.push(("worker_id", worker.clone().into()));
            }
            fields
        }
        EventKind::Completed => {
            let mut fields = vec![("attempt", Value::from(job.attempt)), ("duration_ms", duration.unwrap_or(0).into())];
            if let Some(result) = job.result.as_deref().and_then(|text| serde_json::from_str::<Value>(text).ok()) {
                fields.push(("result", result));
            }
            fields
        }
        EventKind::Failed { report, attempt } => vec![
            ("attempt", (*attempt).into()),
            ("error", report_value(report, true)),
            ("duration_ms", duration.unwrap_or(0).into()),
        ],
        EventKind::Retrying { report } => vec![
            ("attempt", job.attempt.into()),
            ("max_attempts", job.max_attempts().into()),
            ("next_retry_at", job.retry_at.map(format_timestamp).into()),
            ("retry_delay_ms", job.retry_delay_ms.into()),
            ("error", report_value(report, false)),
        ],
        EventKind::Requeued { reason } => vec![("attempt", job.attempt.into()), ("reason", (*reason).into())],
        EventKind::Discarded { reason } => vec![
            ("total_attempts", job.attempt.into()),
            ("reason", (*reason).into()),
            ("last_error", job.error.as_ref().map(|report| report_value(report, false)).into()),
        ],
        EventKind::Cancelled { previous_state, reason } => {
            vec![("previous_state", previous_state.as_str().into()), ("reason", (*reason).into())]
        }
        EventKind::Revived => vec![
            ("state", "available".into()),
            ("priority", job.priority.into()),
            ("reason", "dead_letter_retry".into()),
        ],
        EventKind::Deleted => vec![("reason", "api".into()), ("previous_state", "discarded".into())],
        EventKind::Expired => vec![
            ("created_at", format_timestamp(job.created_at).into()),
            ("expired_at", format_timestamp(event.time).into()),
            ("ttl_ms", job.expires_at.map(|at| at - job.created_at).into()),
        ],
        // Not job events; rendered by `render_event`.
        EventKind::CronTriggered { .. }
        | EventKind::CronSkipped { .. }
        | EventKind::WorkerStarted { .. }
        | EventKind::WorkerSignalled { .. } => Vec::new(),
    };
    for (key, value) in fields {
        data[key] = value;
    }
    data
}
