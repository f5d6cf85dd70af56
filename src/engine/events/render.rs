//! The event envelope as JSON text (docs/api.md, "Events"): an item of the
//! event listing and the body of the event's webhook deliveries, built with
//! `wire`'s writer so the common `job.*` events need no `Value`.

use serde_json::Value;

use super::{CronInfo, CronSkip, Event, EventKind, SignalledWorker, WorkflowEvent};
use crate::job::time::format_timestamp;
use crate::job::{Job, JobId, JobState, WorkflowId};
use crate::wire::{ObjectWriter, push_progress_fields, report_value};

/// The event envelope (docs/api.md, "Events") as JSON text: an item of the
/// event listing, and the body of the event's webhook deliveries (the
/// engine renders it for every event a subscription takes, so the common
/// `job.*` events are written without building a `Value`).
pub fn render_event(event: &Event) -> String {
    let mut envelope = ObjectWriter::default();
    let mut id = [0u8; 40];
    id[..4].copy_from_slice(b"evt_");
    id[4..].copy_from_slice(&event.id.0.to_hyphenated());
    envelope.raw("specversion", "\"1.0\"").string("id", std::str::from_utf8(&id).expect("ASCII"));
    envelope.string("type", event.kind.type_name());
    match other_event_data(event) {
        Some((component, data)) => {
            envelope
                .string("source", component)
                .time("time", event.time)
                .string("datacontenttype", "application/json")
                .value("data", &data);
        }
        None => {
            envelope
                .string("source", "svc://svc/api")
                .time("time", event.time)
                .string("datacontenttype", "application/json");
            if let Some(job) = &event.job {
                envelope.object("data", |data| push_job_event_data(data, event, job));
            }
        }
    }
    if let Some(subject) = event.subject() {
        envelope.string("subject", &subject);
    }
    envelope.finish()
}

/// The source and `data` of every event but the `job.*` ones (`None`).
fn other_event_data(event: &Event) -> Option<(&'static str, Value)> {
    Some(match (&event.kind, &event.job) {
        (EventKind::CronTriggered { cron, run_count }, job) => {
            let mut data = cron_data(cron);
            if let Some(job) = job {
                data["job_id"] = job.id.to_string().into();
                data["job_type"] = job.payload.job_type().to_owned().into();
                data["queue"] = job.queue.as_str().into();
            }
            data["run_count"] = (*run_count).into();
            ("svc://svc/cron", data)
        }
        (EventKind::CronSkipped(skip), _) => {
            let CronSkip { cron, reason, existing_job_id, missed_count } = skip.as_ref();
            let mut data = cron_data(cron);
            data["reason"] = (*reason).into();
            if let Some(id) = existing_job_id {
                data["existing_job_id"] = id.to_string().into();
            }
            if let Some(count) = missed_count {
                data["missed_count"] = (*count).into();
            }
            ("svc://svc/cron", data)
        }
        (EventKind::Pruned { count }, _) => {
            ("svc://svc/scheduler", serde_json::json!({"count": count, "reason": "cap"}))
        }
        (EventKind::QueuePaused(queue) | EventKind::QueueResumed(queue), _) => {
            ("svc://svc/api", serde_json::json!({"queue": queue}))
        }
        (EventKind::WorkerStarted { worker_id }, _) => ("svc://svc/api", serde_json::json!({"worker_id": worker_id})),
        (EventKind::WorkerSignalled(signalled), _) => {
            let SignalledWorker { worker_id, active_job_ids, by, .. } = signalled.as_ref();
            let ids: Vec<String> = active_job_ids.iter().map(JobId::to_string).collect();
            ("svc://svc/api", serde_json::json!({"worker_id": worker_id, "active_job_ids": ids, "by": by}))
        }
        (EventKind::Workflow { id, event }, _) => ("svc://svc/workflows", workflow_event_data(*id, event)),
        (_, Some(_)) => return None,
        (_, None) => ("svc://svc/api", serde_json::json!({})),
    })
}

fn workflow_event_data(id: WorkflowId, event: &WorkflowEvent) -> Value {
    let mut data = serde_json::json!({"workflow_id": id.to_string()});
    let fields: Vec<(&str, Value)> = match event {
        WorkflowEvent::Started { name, workflow_type, jobs_total } => {
            let mut fields = vec![("workflow_type", (*workflow_type).into()), ("jobs_total", (*jobs_total).into())];
            if let Some(name) = name {
                fields.push(("workflow_name", name.clone().into()));
            }
            fields
        }
        WorkflowEvent::StepCompleted { index, job_id, job_type, steps_remaining } => vec![
            ("index", (*index).into()),
            ("job_id", job_id.to_string().into()),
            ("job_type", job_type.clone().into()),
            ("steps_remaining", (*steps_remaining).into()),
        ],
        WorkflowEvent::CallbackFired { callback, job_id } => {
            vec![("callback", (*callback).into()), ("job_id", job_id.to_string().into())]
        }
        WorkflowEvent::Completed { workflow_type, duration_ms } => {
            vec![("workflow_type", (*workflow_type).into()), ("duration_ms", (*duration_ms).into())]
        }
        WorkflowEvent::Failed { workflow_type, failed_index, failed_job_id, error } => vec![
            ("workflow_type", (*workflow_type).into()),
            ("failed_index", (*failed_index).into()),
            ("failed_job_id", failed_job_id.to_string().into()),
            ("error", error.as_ref().map(|report| report_value(report, false)).into()),
        ],
        WorkflowEvent::Cancelled { jobs_cancelled } => vec![("jobs_cancelled", (*jobs_cancelled).into())],
    };
    for (key, value) in fields {
        data[key] = value;
    }
    data
}

fn cron_data(cron: &CronInfo) -> Value {
    serde_json::json!({
        "cron_name": cron.name,
        "schedule": cron.schedule,
        "timezone": cron.timezone,
        "scheduled_time": format_timestamp(cron.scheduled_time),
    })
}

/// Whether a job's `meta` text may hold the `trace_id` its events carry:
/// it names one, or has escapes that might spell the key.
pub(crate) fn meta_may_hold_trace_id(meta: &str) -> bool {
    memchr::memmem::find(meta.as_bytes(), b"trace_id").is_some() || meta.contains('\\')
}

/// `data` of a `job.*` event.
fn push_job_event_data(data: &mut ObjectWriter, event: &Event, job: &Job) {
    data.id("job_id", job.id).string("job_type", job.payload.job_type()).string("queue", &job.queue);
    if let Some((workflow_id, _)) = job.workflow() {
        data.id("workflow_id", workflow_id.0);
    }
    let meta = job.payload.meta();
    // Most jobs carry no trace id: their meta is not parsed.
    if meta_may_hold_trace_id(meta)
        && let Ok(object) = crate::job::json::parse_object(meta.as_bytes())
        && let Some(trace_id) = object.get("trace_id")
    {
        data.raw("trace_id", &crate::job::json::minify(trace_id.get()));
    }
    let duration = job.run().started_at.map(|started| event.time - started);
    let run = job.run();
    match &event.kind {
        EventKind::Enqueued => {
            let state = if job.state == JobState::Pending {
                "pending"
            } else if job.scheduled_at().is_some_and(|at| at > event.time) {
                "scheduled"
            } else {
                "available"
            };
            data.string("state", state).number("priority", job.priority);
            if let Some(at) = job.scheduled_at() {
                data.time("scheduled_at", at);
            }
            if let Some((_, key)) = job.unique() {
                data.string("unique_key", &key.to_string());
            }
        }
        EventKind::Scheduled => {
            data.optional_time("scheduled_at", job.scheduled_at());
        }
        EventKind::Started => {
            data.number("attempt", job.attempt);
            if let Some(worker) = &run.worker_id {
                data.string("worker_id", worker);
            }
        }
        EventKind::Completed => {
            data.number("attempt", job.attempt).number("duration_ms", duration.unwrap_or(0));
            if let Some(result) =
                run.result.as_deref().filter(|text| serde_json::from_str::<&serde_json::value::RawValue>(text).is_ok())
            {
                // A large result stays with the job: every event listing and
                // every webhook delivery would carry it otherwise.
                if result.len() <= crate::limits::EVENT_RESULT_BYTES_MAX {
                    data.raw("result", result);
                } else {
                    data.raw("result_omitted", "true");
                }
            }
        }
        EventKind::Failed { report, attempt } => {
            data.number("attempt", *attempt)
                .value("error", &report_value(report, true))
                .number("duration_ms", duration.unwrap_or(0));
        }
        EventKind::Retrying { report } => {
            data.number("attempt", job.attempt)
                .number("max_attempts", job.max_attempts())
                .optional_time("next_retry_at", run.retry_at)
                .value("retry_delay_ms", &run.retry_delay_ms.into())
                .value("error", &report_value(report, false));
        }
        EventKind::Requeued { reason } => {
            data.number("attempt", job.attempt).string("reason", reason);
        }
        EventKind::Discarded { reason } => {
            data.number("total_attempts", job.attempt)
                .string("reason", reason)
                .value("last_error", &run.error.as_ref().map(|report| report_value(report, false)).into());
        }
        EventKind::Cancelled { previous_state, reason } => {
            data.string("previous_state", previous_state.as_str()).string("reason", reason);
        }
        EventKind::Revived => {
            data.string("state", "available").number("priority", job.priority).string("reason", "dead_letter_retry");
        }
        EventKind::Deleted => {
            data.string("reason", "api").string("previous_state", "discarded");
        }
        EventKind::Progress => {
            data.number("attempt", job.attempt);
            if let Some(progress) = job.progress() {
                push_progress_fields(data, progress);
            }
        }
        EventKind::Expired => {
            data.time("created_at", job.created_at)
                .time("expired_at", event.time)
                .value("ttl_ms", &job.expires_at().map(|at| at - job.created_at).into());
        }
        // Not job events; rendered by `other_event_data`.
        EventKind::CronTriggered { .. }
        | EventKind::CronSkipped(_)
        | EventKind::Pruned { .. }
        | EventKind::QueuePaused(_)
        | EventKind::QueueResumed(_)
        | EventKind::WorkerStarted { .. }
        | EventKind::WorkerSignalled(_)
        | EventKind::Workflow { .. } => {}
    }
}
