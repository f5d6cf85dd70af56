//! The cron registration body (docs/api.md, "Registering") → a validated [`CronDefinition`].
//!
//! Aliases are resolved first (`expression`/`cron` for `schedule`,
//! `job_template` for the flat job fields, flat fields winning), giving the
//! canonical registration that is stored and that `PATCH` edits. The job
//! fields go through the ordinary enqueue validation, so a fired job obeys
//! exactly the rules of an enqueued one.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::sync::Arc;

use super::expr::CronExpr;
use super::next::parse_timezone;
use crate::clock::Millis;
use crate::job::json::{self, minify};
use crate::job::time::format_timestamp;
use crate::job::{
    DispatchLimit, Job, JobDefaults, JobId, JobPayload, JobState, NewJob, RetryPolicy, UniquePolicy, ValidationError,
    body_error, parse_enqueue_object,
};
use crate::limits::{CRON_DESCRIPTION_CHARS_MAX, CRON_NAME_CHARS_MAX, CRON_SCHEDULE_CHARS_MAX};

/// What a cron entry does when its previous job is still going (docs/api.md, "When the previous run is still going").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum OverlapPolicy {
    Skip,
    Allow,
    CancelPrevious,
    /// Stage the new job as `pending` until the previous one ends.
    Enqueue,
}

impl OverlapPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            OverlapPolicy::Skip => "skip",
            OverlapPolicy::Allow => "allow",
            OverlapPolicy::CancelPrevious => "cancel_previous",
            OverlapPolicy::Enqueue => "enqueue",
        }
    }

    fn parse(text: &str) -> Option<OverlapPolicy> {
        match text {
            "skip" => Some(OverlapPolicy::Skip),
            "allow" => Some(OverlapPolicy::Allow),
            "cancel_previous" | "cancel" => Some(OverlapPolicy::CancelPrevious),
            "enqueue" => Some(OverlapPolicy::Enqueue),
            _ => None,
        }
    }
}

/// The job each firing enqueues: an enqueue request without id or times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobTemplate {
    pub payload: JobPayload,
    pub queue: String,
    pub priority: i32,
    pub timeout_ms: u64,
    pub visibility_timeout_ms: u64,
    pub retry: Arc<RetryPolicy>,
}

impl CronDefinition {
    /// The unique policy and dispatch limit of the jobs this entry fires,
    /// from its registered `options` (validated at registration).
    pub fn job_controls(&self) -> (Option<Arc<UniquePolicy>>, Option<Arc<DispatchLimit>>) {
        let Ok(object) = json::parse_object(self.options.as_bytes()) else { return (None, None) };
        let unique =
            object.get_present("unique").and_then(|raw| UniquePolicy::parse(raw, "options.unique").ok()).map(Arc::new);
        let rate_limit = object
            .get_present("rate_limit")
            .and_then(|raw| DispatchLimit::parse(raw, "options.rate_limit").ok())
            .map(Arc::new);
        (unique, rate_limit)
    }

    /// The schedule: the expression in the entry's time zone.
    pub fn compile(&self) -> Result<super::CronSchedule, String> {
        Ok(super::CronSchedule::new(CronExpr::parse(&self.schedule)?, parse_timezone(&self.timezone)?))
    }

    /// The job a firing creates: the template, with the cron's name and the
    /// nominal time (`scheduled`) added to `meta`.
    pub fn fired_job(&self, id: JobId, state: JobState, now: Millis, scheduled: Millis) -> Job {
        let template = &self.job;
        let mut meta: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(template.payload.meta()).unwrap_or_default();
        meta.insert("cron_name".to_string(), self.name.clone().into());
        meta.insert("cron_triggered_at".to_string(), format_timestamp(scheduled).into());
        let payload = template.payload.with_meta(&serde_json::Value::Object(meta).to_string());
        let (unique, rate_limit) = self.job_controls();
        let schema = self.schema().map(Arc::from);
        let request = NewJob {
            id: Some(id),
            payload,
            queue: template.queue.as_str().into(),
            priority: template.priority,
            timeout_ms: template.timeout_ms,
            visibility_timeout_ms: template.visibility_timeout_ms,
            scheduled_at: None,
            expires_at: None,
            retry: template.retry.clone(),
            unique,
            rate_limit,
            pending: false,
            schema,
        };
        Job::accept(request, id, state, now, None, None)
    }

    /// The URI of the schema this entry's jobs name, from its registration.
    pub fn schema(&self) -> Option<String> {
        let object = json::parse_object(self.registration.as_bytes()).ok()?;
        serde_json::from_str(object.get_present("schema")?.get()).ok()
    }
}

/// A validated registration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CronDefinition {
    pub name: String,
    /// The expression exactly as submitted.
    pub schedule: String,
    pub timezone: String,
    pub job: JobTemplate,
    /// Compact JSON of `options` as registered (echoed in the cron object).
    pub options: String,
    pub overlap: OverlapPolicy,
    pub enabled: bool,
    pub description: Option<String>,
    /// Compact JSON of the canonical registration: what `PATCH` starts from.
    pub registration: String,
}

/// Top-level fields of a registration.
const FIELDS: [&str; 15] = [
    "name",
    "schedule",
    "expression",
    "cron",
    "timezone",
    "type",
    "args",
    "queue",
    "meta",
    "options",
    "schema",
    "overlap_policy",
    "enabled",
    "description",
    "job_template",
];
const TEMPLATE_FIELDS: [&str; 4] = ["type", "args", "meta", "options"];
/// Options that would pin a fired job to one instant.
const NOT_ALLOWED_IN_CRON: [&str; 4] = ["delay_until", "scheduled_at", "expires_at", "pending"];

/// Parses a `POST /cron` body.
pub fn parse_cron_body(bytes: &[u8], defaults: &JobDefaults) -> Result<CronDefinition, ValidationError> {
    let object = parse_body(bytes)?;
    let canonical = canonical_registration(object, Map::new())?;
    definition_from(canonical, defaults)
}

/// Applies a `PATCH /cron/{name}` body to an existing definition.
pub fn patch_cron_body(
    current: &CronDefinition,
    bytes: &[u8],
    defaults: &JobDefaults,
) -> Result<CronDefinition, ValidationError> {
    let patch = parse_body(bytes)?;
    if patch.contains_key("name") {
        return Err(ValidationError::request(Some("name".to_string()), "name cannot be changed; register a new entry"));
    }
    let base: Map<String, Value> = serde_json::from_str(&current.registration).unwrap_or_default();
    let mut canonical = canonical_registration(patch, base)?;
    canonical.insert("name".to_string(), Value::String(current.name.clone()));
    definition_from(canonical, defaults)
}

fn parse_body(bytes: &[u8]) -> Result<Map<String, Value>, ValidationError> {
    json::parse_object(bytes).map_err(body_error)?;
    serde_json::from_slice(bytes).map_err(|error| ValidationError::request(None, error.to_string()))
}

/// Resolves aliases of `given` and lays its fields over `base`; `null` removes a field.
fn canonical_registration(
    given: Map<String, Value>,
    mut base: Map<String, Value>,
) -> Result<Map<String, Value>, ValidationError> {
    if let Some(unknown) = given.keys().find(|key| !FIELDS.contains(&key.as_str())) {
        return Err(ValidationError::request(
            Some(unknown.clone()),
            format!("unknown field {unknown:?} in a cron registration"),
        )
        .with_reason("unknown_field"));
    }
    let mut flat = given;
    if let Some(template) = flat.remove("job_template").filter(|value| !value.is_null()) {
        let Value::Object(template) = template else {
            return Err(ValidationError::payload("job_template", "job_template must be an object"));
        };
        if let Some(unknown) = template.keys().find(|key| !TEMPLATE_FIELDS.contains(&key.as_str())) {
            return Err(ValidationError::payload(
                format!("job_template.{unknown}"),
                format!("unknown field {unknown:?} in job_template; it holds type, args, meta and options"),
            ));
        }
        for (key, value) in template {
            match (key.as_str(), flat.get_mut(&key), value) {
                // Flat options win key by key over the template's.
                ("options", Some(Value::Object(flat_options)), Value::Object(template_options)) => {
                    for (option, value) in template_options {
                        flat_options.entry(option).or_insert(value);
                    }
                }
                (_, Some(_), _) => {}
                (_, None, value) => {
                    flat.insert(key, value);
                }
            }
        }
    }
    let schedule_alias = ["schedule", "expression", "cron"].into_iter().find(|key| flat.contains_key(*key));
    if let Some(alias) = schedule_alias {
        let value = flat.remove(alias).unwrap_or(Value::Null);
        flat.remove("expression");
        flat.remove("cron");
        flat.insert("schedule".to_string(), value);
    }
    for (key, value) in flat {
        if value.is_null() {
            base.remove(&key);
        } else {
            base.insert(key, value);
        }
    }
    Ok(base)
}

/// Validates a canonical registration.
fn definition_from(canonical: Map<String, Value>, defaults: &JobDefaults) -> Result<CronDefinition, ValidationError> {
    let request = |field: &str, message: String| ValidationError::request(Some(field.to_string()), message);
    let string_field = |field: &str| -> Result<Option<String>, ValidationError> {
        match canonical.get(field) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(_) => Err(request(field, format!("{field} must be a string"))),
        }
    };

    let name = string_field("name")?.ok_or_else(|| request("name", "name is required".to_string()))?;
    if !is_valid_cron_name(&name) {
        return Err(request(
            "name",
            format!(
                "name must be 1 to {CRON_NAME_CHARS_MAX} characters of letters, digits, '.', '_' and '-', starting with a letter or digit"
            ),
        ));
    }
    let schedule = string_field("schedule")?
        .ok_or_else(|| request("schedule", "schedule (or expression) is required".to_string()))?;
    if schedule.len() > CRON_SCHEDULE_CHARS_MAX {
        return Err(request("schedule", format!("schedule is longer than {CRON_SCHEDULE_CHARS_MAX} characters")));
    }
    let expr = CronExpr::parse(&schedule)
        .map_err(|problem| request("schedule", format!("invalid cron expression {schedule:?}: {problem}")))?;
    if expr.next_after(jiff::civil::date(2000, 1, 1).at(0, 0, 0, 0)).is_none() {
        return Err(request("schedule", format!("cron expression {schedule:?} never fires (no such date)")));
    }
    let timezone = string_field("timezone")?.unwrap_or_else(|| "UTC".to_string());
    parse_timezone(&timezone).map_err(|problem| request("timezone", problem))?;
    let overlap = match string_field("overlap_policy")? {
        None => OverlapPolicy::Skip,
        Some(text) => OverlapPolicy::parse(&text).ok_or_else(|| {
            request(
                "overlap_policy",
                format!("overlap_policy {text:?} is not one of skip, allow, cancel_previous, enqueue"),
            )
        })?,
    };
    let enabled = match canonical.get("enabled") {
        None => true,
        Some(Value::Bool(enabled)) => *enabled,
        Some(_) => return Err(request("enabled", "enabled must be true or false".to_string())),
    };
    let description = string_field("description")?;
    if description.as_ref().is_some_and(|text| text.chars().count() > CRON_DESCRIPTION_CHARS_MAX) {
        return Err(request(
            "description",
            format!("description is longer than {CRON_DESCRIPTION_CHARS_MAX} characters"),
        ));
    }

    let options = match canonical.get("options") {
        None => Map::new(),
        Some(Value::Object(options)) => options.clone(),
        Some(_) => return Err(ValidationError::payload("options", "options must be an object")),
    };
    if let Some(field) = NOT_ALLOWED_IN_CRON.iter().find(|field| options.contains_key(**field)) {
        return Err(ValidationError::payload(
            format!("options.{field}"),
            format!("options.{field} is not allowed in a cron registration: each firing is enqueued at its own time"),
        )
        .with_reason("not_allowed_in_cron"));
    }
    // The enqueue body each firing stands for; queue precedence: queue → options.queue.
    let mut job_options = options.clone();
    if let Some(queue) = canonical.get("queue") {
        job_options.insert("queue".to_string(), queue.clone());
    }
    let mut body = Map::new();
    for field in ["type", "meta", "schema"] {
        if let Some(value) = canonical.get(field) {
            body.insert(field.to_string(), value.clone());
        }
    }
    body.insert("args".to_string(), canonical.get("args").cloned().unwrap_or(Value::Array(Vec::new())));
    body.insert("options".to_string(), Value::Object(job_options));
    let body_text = Value::Object(body).to_string();
    let object = json::parse_object(body_text.as_bytes()).map_err(body_error)?;
    let job = parse_enqueue_object(&object, defaults).map_err(|error| match error.field.as_deref() {
        Some("options.queue") if canonical.contains_key("queue") => {
            ValidationError { field: Some("queue".to_string()), ..error }
        }
        _ => error,
    })?;

    Ok(CronDefinition {
        name,
        schedule,
        timezone,
        job: JobTemplate {
            payload: job.payload,
            queue: job.queue.to_string(),
            priority: job.priority,
            timeout_ms: job.timeout_ms,
            visibility_timeout_ms: job.visibility_timeout_ms,
            retry: job.retry,
        },
        options: minify(&Value::Object(options).to_string()),
        overlap,
        enabled,
        description,
        registration: Value::Object(canonical).to_string(),
    })
}

/// `^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$`.
pub fn is_valid_cron_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= CRON_NAME_CHARS_MAX
        && bytes[0].is_ascii_alphanumeric()
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::ValidationKind;

    fn parse(body: &str) -> Result<CronDefinition, ValidationError> {
        parse_cron_body(body.as_bytes(), &JobDefaults::default())
    }

    #[test]
    fn flat_registration_with_defaults() {
        let cron =
            parse(r#"{"name":"nightly-cleanup","type":"maintenance.cleanup","schedule":"0 2 * * *"}"#).expect("valid");
        assert_eq!(cron.name, "nightly-cleanup");
        assert_eq!(cron.timezone, "UTC");
        assert_eq!(cron.overlap, OverlapPolicy::Skip);
        assert!(cron.enabled);
        assert_eq!(cron.job.queue, "default");
        assert_eq!(cron.job.payload.args(), "[]");
        assert_eq!(cron.options, "{}");
    }

    #[test]
    fn aliases_and_job_template_resolve_with_flat_fields_winning() {
        let cron = parse(
            r#"{"name":"a","expression":"*/5 * * * *","queue":"flat",
                "job_template":{"type":"cron.test","args":[1],"options":{"queue":"template","priority":5}},
                "options":{"priority":7}}"#,
        )
        .expect("valid");
        assert_eq!(cron.schedule, "*/5 * * * *");
        assert_eq!(cron.job.payload.job_type(), "cron.test");
        assert_eq!(cron.job.payload.args(), "[1]");
        assert_eq!(cron.job.queue, "flat");
        assert_eq!(cron.job.priority, 7);
        let from_template =
            parse(r#"{"name":"b","cron":"@hourly","job_template":{"type":"t","options":{"queue":"template"}}}"#)
                .expect("valid");
        assert_eq!(from_template.job.queue, "template");
        assert_eq!(from_template.schedule, "@hourly");
    }

    #[test]
    fn errors_name_the_field_and_kind() {
        let cases = [
            (r#"{"type":"t","schedule":"* * * * *"}"#, ValidationKind::Request, "name"),
            (r#"{"name":"-bad","type":"t","schedule":"* * * * *"}"#, ValidationKind::Request, "name"),
            (r#"{"name":"a","type":"t"}"#, ValidationKind::Request, "schedule"),
            (r#"{"name":"a","type":"t","schedule":"* * * *"}"#, ValidationKind::Request, "schedule"),
            (r#"{"name":"a","type":"t","schedule":"0 0 30 2 *"}"#, ValidationKind::Request, "schedule"),
            (r#"{"name":"a","type":"t","schedule":"* * * * *","timezone":"EST"}"#, ValidationKind::Request, "timezone"),
            (
                r#"{"name":"a","type":"t","schedule":"* * * * *","overlap_policy":"queue"}"#,
                ValidationKind::Request,
                "overlap_policy",
            ),
            (r#"{"name":"a","schedule":"* * * * *"}"#, ValidationKind::Request, "type"),
            (r#"{"name":"a","type":"1t","schedule":"* * * * *"}"#, ValidationKind::Payload, "type"),
            (r#"{"name":"a","type":"t","args":{},"schedule":"* * * * *"}"#, ValidationKind::Payload, "args"),
            (r#"{"name":"a","type":"t","schedule":"* * * * *","queue":"Bad"}"#, ValidationKind::Payload, "queue"),
            (
                r#"{"name":"a","type":"t","schedule":"* * * * *","options":{"delay_until":"+PT1M"}}"#,
                ValidationKind::Payload,
                "options.delay_until",
            ),
            (r#"{"name":"a","type":"t","schedule":"* * * * *","colour":1}"#, ValidationKind::Request, "colour"),
        ];
        for (body, kind, field) in cases {
            let error = parse(body).expect_err(body);
            assert_eq!((error.kind, error.field.as_deref()), (kind, Some(field)), "{body}: {}", error.message);
        }
    }

    #[test]
    fn patch_changes_only_the_given_fields() {
        let defaults = JobDefaults::default();
        let cron =
            parse(r#"{"name":"a","type":"t","args":[1],"schedule":"0 * * * *","description":"x"}"#).expect("valid");
        let patched = patch_cron_body(&cron, br#"{"expression":"*/10 * * * *","description":null}"#, &defaults)
            .expect("valid patch");
        assert_eq!(patched.schedule, "*/10 * * * *");
        assert_eq!(patched.description, None);
        assert_eq!(patched.job.payload.args(), "[1]");
        assert_eq!(patched.name, "a");
        let error = patch_cron_body(&cron, br#"{"name":"b"}"#, &defaults).expect_err("name is fixed");
        assert_eq!(error.field.as_deref(), Some("name"));
        let error = patch_cron_body(&cron, br#"{"timezone":"Nowhere/Special"}"#, &defaults).expect_err("bad tz");
        assert_eq!(error.field.as_deref(), Some("timezone"));
    }
}
