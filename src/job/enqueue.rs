//! Turns an enqueue body (docs/api.md, "Enqueue") into a validated [`NewJob`].
//!
//! The interface form `{type, args, meta?, schema?, options?}` is canonical;
//! upstream top-level spellings are accepted as aliases, the first source
//! listed wins, and unknown top-level fields are kept verbatim.

use crate::limits::{SCHEMA_URI_BYTES_MAX, SCHEMA_URI_CHARS_MAX};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use super::error::ValidationError;
use super::json::{
    self, BodyError, JsonKind, RawObject, compact, kind_of, merge_objects, minify, parse_raw_object, string_value,
};
use super::retry::RetryPolicy;
use super::time::{TimeSpec, parse_time_spec};
use super::{DispatchLimit, JobId, JobPayload, NewJob, QueueName, UniquePolicy};
use crate::limits::{
    BATCH_JOBS_MAX, ENVELOPE_BYTES_MAX, META_BYTES_MAX, PRIORITY_MAX, PRIORITY_MIN, QUEUE_CHARS_MAX, TAG_CHARS_MAX,
    TAGS_MAX, TIMEOUT_MS_MAX, TYPE_CHARS_MAX,
};

/// Server-wide defaults applied to fields a client leaves out.
#[derive(Debug, Clone, PartialEq)]
pub struct JobDefaults {
    /// Shared by every job that does not give its own policy.
    pub retry: Arc<RetryPolicy>,
    pub timeout_ms: u64,
    pub visibility_timeout_ms: u64,
}

impl Default for JobDefaults {
    fn default() -> Self {
        Self {
            retry: Arc::new(RetryPolicy::default()),
            timeout_ms: crate::limits::TIMEOUT_MS_DEFAULT,
            visibility_timeout_ms: crate::limits::TIMEOUT_MS_DEFAULT,
        }
    }
}

/// Top-level names the server manages itself; a client's values are dropped.
const SYSTEM_MANAGED: [&str; 22] = [
    "state",
    "attempt",
    "max_attempts",
    "created_at",
    "enqueued_at",
    "started_at",
    "completed_at",
    "cancelled_at",
    "discarded_at",
    "activated_at",
    "retry_at",
    "retry_delay_ms",
    "result",
    "error",
    "errors",
    "worker_id",
    "unique_key",
    "workflow_id",
    "parent_results",
    "parent_states",
    "previous_state",
    "deduplicated",
];

/// Top-level names with a meaning of their own (canonical fields and
/// aliases), in the order `parse_enqueue_object` takes them apart.
const KNOWN: [&str; 20] = [
    "id",
    "specversion",
    "type",
    "args",
    "meta",
    "schema",
    "options",
    "queue",
    "priority",
    "timeout_ms",
    "timeout",
    "scheduled_at",
    "delay_until",
    "expires_at",
    "retry",
    "unique",
    "tags",
    "visibility_timeout_ms",
    "visibility_timeout",
    "rate_limit",
];

/// Parses and validates a whole request body holding one enqueue item.
pub fn parse_enqueue_body(bytes: &[u8], defaults: &JobDefaults) -> Result<NewJob, ValidationError> {
    let object = json::parse_object(bytes).map_err(body_error)?;
    if bytes.len() > ENVELOPE_BYTES_MAX {
        let compact = minify(std::str::from_utf8(bytes).unwrap_or_default()).len();
        if compact > ENVELOPE_BYTES_MAX {
            return Err(ValidationError::too_large("job", ENVELOPE_BYTES_MAX, compact));
        }
    }
    parse_enqueue_object(&object, defaults)
}

/// How many jobs one batch enqueue holds: 1 to `BATCH_JOBS_MAX`.
pub fn check_batch_size(count: usize) -> Result<(), ValidationError> {
    if count == 0 {
        return Err(ValidationError::request(Some("jobs".to_string()), "jobs must not be empty"));
    }
    if count > BATCH_JOBS_MAX {
        let mut error = ValidationError::request(None, format!("a batch holds at most {BATCH_JOBS_MAX} jobs"));
        error.kind = super::ValidationKind::TooLarge;
        error.details.push(("limit", BATCH_JOBS_MAX.into()));
        error.details.push(("received", count.into()));
        return Err(error);
    }
    Ok(())
}

/// Maps a body that is not a JSON object to its error.
pub fn body_error(error: BodyError) -> ValidationError {
    match error {
        BodyError::Malformed(detail) => {
            ValidationError::request(None, format!("request body is not valid JSON: {detail}"))
                .with_reason("malformed_json")
        }
        BodyError::NotAnObject => ValidationError::request(None, "request body must be a JSON object"),
        BodyError::TooDeep => ValidationError::request(
            None,
            format!("request body nests deeper than {} levels", crate::limits::JSON_DEPTH_MAX),
        )
        .with_reason("too_deep"),
    }
}

/// Validates one enqueue item already parsed as an object.
pub fn parse_enqueue_object(object: &RawObject, defaults: &JobDefaults) -> Result<NewJob, ValidationError> {
    let [
        id,
        specversion,
        job_type,
        args,
        meta,
        schema,
        options,
        queue,
        priority,
        timeout_ms,
        timeout,
        scheduled_at,
        delay_until,
        expires_at,
        retry,
        unique,
        tags,
        visibility_timeout_ms,
        visibility_timeout,
        rate_limit,
    ] = object.get_present_many(&KNOWN);
    let options = match options {
        Some(raw) => {
            parse_raw_object(raw).ok_or_else(|| ValidationError::payload("options", "options must be an object"))?
        }
        None => RawObject::default(),
    };
    let [
        option_metadata,
        option_unique,
        option_rate_limit,
        option_pending,
        option_queue,
        option_priority,
        option_timeout_ms,
        option_visibility_timeout_ms,
        option_delay_until,
        option_scheduled_at,
        option_expires_at,
        option_retry,
        option_retry_policy,
        option_tags,
    ] = options.get_present_many(&[
        "metadata",
        "unique",
        "rate_limit",
        "pending",
        "queue",
        "priority",
        "timeout_ms",
        "visibility_timeout_ms",
        "delay_until",
        "scheduled_at",
        "expires_at",
        "retry",
        "retry_policy",
        "tags",
    ]);

    let id = match id {
        Some(raw) => Some(parse_id(raw)?),
        None => None,
    };
    if let Some(raw) = specversion
        && raw.get() != "\"1.0\""
    {
        return Err(ValidationError::payload("specversion", "specversion must be \"1.0\""));
    }
    let job_type = parse_type(job_type)?;
    let args = parse_args(args)?;
    let meta = parse_meta(meta, option_metadata)?;
    let schema = match schema {
        Some(raw) => {
            let uri = serde_json::from_str::<String>(raw.get()).map_err(|_| {
                ValidationError::payload("schema", "schema must be a string (a registered schema's URI)")
            })?;
            check_schema_uri(&uri).map_err(|message| ValidationError::payload("schema", message))?;
            Some(Arc::from(uri))
        }
        None => None,
    };
    let unique = match first(&[(option_unique, "options.unique"), (unique, "unique")]) {
        Some((raw, path)) => Some(Arc::new(UniquePolicy::parse(raw, path)?)),
        None => None,
    };
    let rate_limit = match first(&[(option_rate_limit, "options.rate_limit"), (rate_limit, "rate_limit")]) {
        Some((raw, path)) => Some(Arc::new(DispatchLimit::parse(raw, path)?)),
        None => None,
    };
    let pending = match option_pending {
        Some(raw) => serde_json::from_str::<bool>(raw.get())
            .map_err(|_| ValidationError::payload("options.pending", "options.pending must be a boolean"))?,
        None => false,
    };

    let queue = match first(&[(option_queue, "options.queue"), (queue, "queue")]) {
        Some((raw, path)) => parse_queue_field(raw, path)?,
        None => QueueName::new("default"),
    };
    let priority = match first(&[(option_priority, "options.priority"), (priority, "priority")]) {
        Some((raw, path)) => int_in_range(raw, path, PRIORITY_MIN, PRIORITY_MAX)? as i32,
        None => 0,
    };
    let timeout_ms = millis_field(
        &[(option_timeout_ms, "options.timeout_ms", 1), (timeout_ms, "timeout_ms", 1), (timeout, "timeout", 1000)],
        defaults.timeout_ms,
    )?;
    let visibility_timeout_ms = millis_field(
        &[
            (option_visibility_timeout_ms, "options.visibility_timeout_ms", 1),
            (visibility_timeout_ms, "visibility_timeout_ms", 1),
            (visibility_timeout, "visibility_timeout", 1000),
        ],
        defaults.visibility_timeout_ms,
    )?;
    let scheduled_at = match first(&[
        (option_delay_until, "options.delay_until"),
        (option_scheduled_at, "options.scheduled_at"),
        (scheduled_at, "scheduled_at"),
        (delay_until, "delay_until"),
    ]) {
        Some((raw, path)) => Some(time_field(raw, path)?),
        None => None,
    };
    let expires_at = match first(&[(option_expires_at, "options.expires_at"), (expires_at, "expires_at")]) {
        Some((raw, path)) => Some(time_field(raw, path)?),
        None => None,
    };
    let retry = match first(&[
        (option_retry, "options.retry"),
        (option_retry_policy, "options.retry_policy"),
        (retry, "retry"),
    ]) {
        Some((raw, path)) => client_policy(&defaults.retry, raw, path)?,
        None => defaults.retry.clone(),
    };
    let tags = match first(&[(option_tags, "options.tags"), (tags, "tags")]) {
        Some((raw, path)) => parse_tags(raw, path)?,
        None => Vec::new(),
    };
    let extra = object
        .entries
        .iter()
        .filter(|(name, _)| !KNOWN.contains(&name.as_ref()) && !SYSTEM_MANAGED.contains(&name.as_ref()))
        .map(|(name, raw)| (name.to_string(), minify(raw.get())))
        .collect();

    Ok(NewJob {
        id,
        payload: JobPayload::new(&job_type, &args, &meta, tags, extra),
        queue,
        priority,
        timeout_ms,
        visibility_timeout_ms,
        scheduled_at,
        expires_at,
        retry,
        unique,
        rate_limit,
        pending,
        schema,
    })
}

/// Client retry policies parsed lately on one thread, by their JSON text.
/// Clients tend to send the same policy with every job: a repeat costs a
/// lookup instead of a parse, and its jobs share one allocation.
struct RecentPolicies {
    /// The defaults the policies were merged over.
    base: Arc<RetryPolicy>,
    by_text: HashMap<Box<str>, Arc<RetryPolicy>, foldhash::fast::RandomState>,
}

/// Policies remembered per thread; the memory is forgotten when full.
const RECENT_POLICIES_MAX: usize = 64;
/// Longer policy texts (long error lists) are parsed each time.
const RECENT_POLICY_TEXT_MAX: usize = 512;

thread_local! {
    static RECENT_POLICIES: RefCell<Option<RecentPolicies>> = const { RefCell::new(None) };
}

/// The policy `raw` (at `path`) merged over `base`, shared with earlier jobs
/// that sent the same text.
fn client_policy(base: &Arc<RetryPolicy>, raw: &RawValue, path: &str) -> Result<Arc<RetryPolicy>, ValidationError> {
    let text = raw.get();
    if text.len() > RECENT_POLICY_TEXT_MAX {
        return RetryPolicy::merged(base, raw, path).map(Arc::new);
    }
    RECENT_POLICIES.with_borrow_mut(|recent| {
        let recent = match recent {
            Some(recent) if Arc::ptr_eq(&recent.base, base) => recent,
            _ => recent.insert(RecentPolicies { base: base.clone(), by_text: HashMap::default() }),
        };
        if let Some(policy) = recent.by_text.get(text) {
            return Ok(policy.clone());
        }
        // Errors are not remembered: their messages name `path`.
        let policy = Arc::new(RetryPolicy::merged(base, raw, path)?);
        if recent.by_text.len() >= RECENT_POLICIES_MAX {
            recent.by_text.clear();
        }
        recent.by_text.insert(text.into(), policy.clone());
        Ok(policy)
    })
}

/// The first present source and its path.
fn first<'a>(sources: &[(Option<&'a RawValue>, &'static str)]) -> Option<(&'a RawValue, &'static str)> {
    sources.iter().find_map(|(raw, path)| raw.map(|raw| (raw, *path)))
}

fn parse_id(raw: &RawValue) -> Result<JobId, ValidationError> {
    string_value(raw).as_deref().and_then(JobId::parse).ok_or_else(|| {
        ValidationError::payload("id", "id must be a lowercase UUIDv7 such as 019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f")
    })
}

fn parse_type(raw: Option<&RawValue>) -> Result<String, ValidationError> {
    let Some(raw) = raw else {
        return Err(ValidationError::request(Some("type".to_string()), "type is required"));
    };
    let Some(text) = string_value(raw) else {
        return Err(ValidationError::payload("type", "type must be a string"));
    };
    if !is_valid_type(&text) {
        return Err(ValidationError::payload(
            "type",
            format!(
                "type must be 1 to {TYPE_CHARS_MAX} characters of dot-separated names, each starting with a letter (e.g. email.send)"
            ),
        ));
    }
    Ok(text.into_owned())
}

/// `^[a-zA-Z][a-zA-Z0-9_]*([.][a-zA-Z][a-zA-Z0-9_]*)*$`, 1 to 255 characters.
pub fn is_valid_type(text: &str) -> bool {
    if text.is_empty() || text.len() > TYPE_CHARS_MAX {
        return false;
    }
    // Dot-separated segments, each a letter, then letters, digits and `_`.
    let mut segment_start = true;
    for &byte in text.as_bytes() {
        let fits = if segment_start {
            byte.is_ascii_alphabetic()
        } else {
            byte == b'.' || byte == b'_' || byte.is_ascii_alphanumeric()
        };
        if !fits {
            return false;
        }
        segment_start = byte == b'.';
    }
    !segment_start
}

/// `^[a-z0-9][a-z0-9.-]*$`, 1 to 128 characters.
pub fn is_valid_queue(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= QUEUE_CHARS_MAX
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'.' || *b == b'-')
}

fn parse_args(raw: Option<&RawValue>) -> Result<Cow<'_, str>, ValidationError> {
    let Some(raw) = raw else {
        return Err(ValidationError::request(Some("args".to_string()), "args is required and must be an array"));
    };
    if kind_of(raw) != JsonKind::Array {
        return Err(ValidationError::payload("args", format!("args must be an array, not {}", kind_of(raw).name())));
    }
    Ok(compact(raw.get()))
}

fn parse_meta<'a>(meta: Option<&'a RawValue>, metadata: Option<&'a RawValue>) -> Result<Cow<'a, str>, ValidationError> {
    let base = match meta {
        Some(raw) if kind_of(raw) == JsonKind::Object => compact(raw.get()),
        Some(_) => return Err(ValidationError::payload("meta", "meta must be an object")),
        None => Cow::Borrowed("{}"),
    };
    let merged = match metadata {
        None => base,
        Some(raw) => {
            let overlay = parse_raw_object(raw)
                .ok_or_else(|| ValidationError::payload("options.metadata", "options.metadata must be an object"))?;
            let base_object = serde_json::from_str::<RawObject>(&base).unwrap_or_default();
            Cow::Owned(merge_objects(base_object, overlay))
        }
    };
    if merged.len() > META_BYTES_MAX {
        return Err(ValidationError::too_large("meta", META_BYTES_MAX, merged.len()));
    }
    Ok(merged)
}

/// The queue name, shared with the recent jobs of its queue that this
/// thread parsed: the engine thread takes it as it is, where building it
/// there cost a counted reference, a full memory barrier, for every job.
fn parse_queue_field(raw: &RawValue, path: &str) -> Result<QueueName, ValidationError> {
    string_value(raw)
        .filter(|text| is_valid_queue(text))
        .map(|text| QueueName::new(&text))
        .ok_or_else(|| invalid_queue(path))
}

/// The error of a queue name at `path` that is not one (see [`is_valid_queue`]).
pub fn invalid_queue(path: &str) -> ValidationError {
    ValidationError::payload(
        path,
        format!(
            "{path} must be 1 to {QUEUE_CHARS_MAX} characters of a-z, 0-9, '.' and '-', starting with a letter or digit"
        ),
    )
}

/// An integer written without fraction or exponent, within i64.
pub fn raw_integer(raw: &RawValue) -> Option<i64> {
    let text = raw.get().trim();
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn int_in_range(raw: &RawValue, path: &str, min: i64, max: i64) -> Result<i64, ValidationError> {
    raw_integer(raw)
        .filter(|value| (min..=max).contains(value))
        .ok_or_else(|| ValidationError::payload(path, format!("{path} must be an integer from {min} to {max}")))
}

/// The first present source, in milliseconds (`scale` 1000 for fields in seconds).
fn millis_field(sources: &[(Option<&RawValue>, &str, u64)], default: u64) -> Result<u64, ValidationError> {
    for (raw, path, scale) in sources {
        if let Some(raw) = raw {
            let max = (TIMEOUT_MS_MAX / scale) as i64;
            return Ok(int_in_range(raw, path, 1, max)? as u64 * scale);
        }
    }
    Ok(default)
}

fn time_field(raw: &RawValue, path: &str) -> Result<TimeSpec, ValidationError> {
    let Ok(text) = serde_json::from_str::<String>(raw.get()) else {
        return Err(ValidationError::payload(
            path,
            format!("{path} must be an RFC 3339 timestamp or +duration string"),
        ));
    };
    parse_time_spec(&text).map_err(|message| ValidationError::payload(path, format!("{path}: {message}")))
}

fn parse_tags(raw: &RawValue, path: &str) -> Result<Vec<String>, ValidationError> {
    let invalid = || {
        ValidationError::payload(
            path,
            format!("{path} must be an array of at most {TAGS_MAX} strings of 1 to {TAG_CHARS_MAX} characters"),
        )
    };
    let tags: Vec<String> = serde_json::from_str(raw.get()).map_err(|_| invalid())?;
    if tags.len() > TAGS_MAX || tags.iter().any(|tag| tag.is_empty() || tag.chars().count() > TAG_CHARS_MAX) {
        return Err(invalid());
    }
    Ok(tags)
}

/// A schema URI: absolute (it has a scheme), at most [`SCHEMA_URI_CHARS_MAX`]
/// characters and [`SCHEMA_URI_BYTES_MAX`] bytes, no white space or control
/// characters.
pub fn check_schema_uri(uri: &str) -> Result<(), String> {
    if uri.is_empty() || uri.chars().count() > SCHEMA_URI_CHARS_MAX || uri.len() > SCHEMA_URI_BYTES_MAX {
        return Err(format!(
            "uri must be an absolute URI of 1 to {SCHEMA_URI_CHARS_MAX} characters and at most {SCHEMA_URI_BYTES_MAX} bytes"
        ));
    }
    if uri.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("uri must not contain white space or control characters".to_string());
    }
    let scheme = uri.split(':').next().unwrap_or("");
    let scheme_ok = uri.contains(':')
        && scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !scheme_ok || uri.len() == scheme.len() + 1 {
        return Err("uri must be an absolute URI (with a scheme, e.g. urn:svc:email.send:v1)".to_string());
    }
    if uri.contains('#') {
        return Err("uri must not have a fragment".to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::ValidationKind;

    fn parse(body: &str) -> Result<NewJob, ValidationError> {
        parse_enqueue_body(body.as_bytes(), &JobDefaults::default())
    }

    /// The job type rule as the interface states it: dot-separated segments,
    /// each `[A-Za-z][A-Za-z0-9_]*`.
    fn type_rule(text: &str) -> bool {
        !text.is_empty()
            && text.len() <= TYPE_CHARS_MAX
            && text.split('.').all(|segment| {
                let mut chars = segment.chars();
                chars.next().is_some_and(|c| c.is_ascii_alphabetic())
                    && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
    }

    proptest::proptest! {
        #[test]
        fn job_types_follow_the_segment_rule(text in "[aZ0_.é-]{0,6}") {
            proptest::prop_assert_eq!(is_valid_type(&text), type_rule(&text), "{:?}", text);
        }
    }

    #[test]
    fn job_types_are_checked_segment_by_segment() {
        for good in ["a", "email.send", "A_1.b2.C", "x_"] {
            assert!(is_valid_type(good), "{good}");
        }
        let long = "a".repeat(TYPE_CHARS_MAX + 1);
        for bad in ["", ".", "a.", ".a", "a..b", "1a", "a._b", "a-b", "é", long.as_str()] {
            assert!(!is_valid_type(bad), "{bad}");
        }
    }

    #[test]
    fn minimal_job_gets_defaults() {
        let job = parse(r#"{"type":"email.send","args":["a@b.c"]}"#).unwrap();
        assert_eq!(job.queue, "default");
        assert_eq!(job.priority, 0);
        assert_eq!(job.timeout_ms, 30_000);
        assert_eq!(job.payload.args(), r#"["a@b.c"]"#);
        assert_eq!(job.payload.meta(), "{}");
        assert_eq!(*job.retry, RetryPolicy::default());
    }

    #[test]
    fn options_win_over_top_level_aliases() {
        let job = parse(
            r#"{"type":"t","args":[],"queue":"low","priority":1,"timeout":5,"options":{"queue":"high","priority":7}}"#,
        )
        .unwrap();
        assert_eq!(job.queue, "high");
        assert_eq!(job.priority, 7);
        assert_eq!(job.timeout_ms, 5000);
    }

    #[test]
    fn each_top_level_field_lands_in_its_place() {
        let job = parse(
            r#"{"id":"019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f","specversion":"1.0","type":"a.b","args":[1],
                "meta":{"m":1},"queue":"q","priority":3,"timeout_ms":4000,"visibility_timeout":6,
                "scheduled_at":"2030-01-01T00:00:00Z","expires_at":"2031-01-01T00:00:00Z",
                "retry":{"max_attempts":9},"tags":["x"]}"#,
        )
        .unwrap();
        assert_eq!(job.id, JobId::parse("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f"));
        assert_eq!((job.payload.job_type(), job.payload.args()), ("a.b", "[1]"));
        assert_eq!((job.payload.meta(), job.payload.tags()), (r#"{"m":1}"#, ["x".to_string()].as_slice()));
        assert_eq!((job.queue.as_str(), job.priority), ("q", 3));
        assert_eq!((job.timeout_ms, job.visibility_timeout_ms, job.retry.max_attempts), (4000, 6000, 9));
        assert!(job.scheduled_at.is_some() && job.expires_at.is_some() && job.scheduled_at != job.expires_at);
        let aliases = parse(r#"{"type":"t","args":[],"timeout":2,"visibility_timeout_ms":700,"delay_until":"+PT1M"}"#);
        let aliases = aliases.unwrap();
        assert_eq!((aliases.timeout_ms, aliases.visibility_timeout_ms), (2000, 700));
        assert!(aliases.scheduled_at.is_some());
        let named = parse(r#"{"type":"t","args":[],"schema":"urn:s"}"#).unwrap();
        assert_eq!(named.schema.as_deref(), Some("urn:s"));
        let error = parse(r#"{"type":"t","args":[],"schema":"not a uri"}"#).unwrap_err();
        assert_eq!((error.field.as_deref(), error.kind), (Some("schema"), ValidationKind::Payload));
        let controls = parse(
            r#"{"type":"t","args":[],"unique":{"on_conflict":"ignore"},"rate_limit":{"concurrency":2},
                "options":{"pending":true}}"#,
        )
        .unwrap();
        assert_eq!(controls.unique.unwrap().on_conflict, super::super::OnConflict::Ignore);
        assert_eq!(controls.rate_limit.unwrap().concurrency, Some(2));
        assert!(controls.pending);
        let error = parse(r#"{"type":"t","args":[],"options":{"pending":"yes"}}"#).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("options.pending"));
        let error = parse(r#"{"type":"t","args":[],"options":{"unique":{"keys":["a"]}}}"#).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("options.unique.keys"));
    }

    #[test]
    fn unknown_fields_are_kept_and_system_fields_dropped() {
        let job = parse(r#"{"type":"t","args":[],"x_custom": {"a" : 1.50},"state":"completed","attempt":9}"#).unwrap();
        assert_eq!(job.payload.extra(), vec![("x_custom".to_string(), r#"{"a":1.50}"#.to_string())]);
    }

    #[test]
    fn metadata_merges_over_meta() {
        let job = parse(r#"{"type":"t","args":[],"meta":{"a":1,"b":2},"options":{"metadata":{"b":3,"c":4}}}"#).unwrap();
        assert_eq!(job.payload.meta(), r#"{"a":1,"b":3,"c":4}"#);
    }

    #[test]
    fn validation_kinds_follow_the_decisions() {
        let cases = [
            (r#"{"args":[]}"#, ValidationKind::Request, "type"),
            (r#"{"type":"t"}"#, ValidationKind::Request, "args"),
            (r#"{"type":"t","args":null}"#, ValidationKind::Request, "args"),
            (r#"{"type":"t","args":{}}"#, ValidationKind::Payload, "args"),
            (r#"{"type":"1t","args":[]}"#, ValidationKind::Payload, "type"),
            (r#"{"type":"t","args":[],"options":{"queue":"Default"}}"#, ValidationKind::Payload, "options.queue"),
            (r#"{"type":"t","args":[],"options":{"priority":101}}"#, ValidationKind::Payload, "options.priority"),
            (r#"{"type":"t","args":[],"options":{"priority":5.0}}"#, ValidationKind::Payload, "options.priority"),
            (r#"{"type":"t","args":[],"id":"not-a-uuid"}"#, ValidationKind::Payload, "id"),
            (
                r#"{"type":"t","args":[],"options":{"delay_until":"tomorrow"}}"#,
                ValidationKind::Payload,
                "options.delay_until",
            ),
            (
                r#"{"type":"t","args":[],"options":{"retry":{"backoff_strategy":"x"}}}"#,
                ValidationKind::Payload,
                "options.retry.backoff_strategy",
            ),
            (r#"{"type":"t","args":[],"options":{"tags":[""]}}"#, ValidationKind::Payload, "options.tags"),
            (r#"{"type":"t","args":[],"options":{"timeout_ms":0}}"#, ValidationKind::Payload, "options.timeout_ms"),
            (r#"{"type":"t","args":[],"meta":[]}"#, ValidationKind::Payload, "meta"),
            (r#"{"type":"t","args":[],"specversion":"2.0"}"#, ValidationKind::Payload, "specversion"),
        ];
        for (body, kind, field) in cases {
            let error = parse(body).unwrap_err();
            assert_eq!((error.kind, error.field.as_deref()), (kind, Some(field)), "{body}");
        }
    }

    #[test]
    fn oversized_meta_is_too_large() {
        let body = format!(r#"{{"type":"t","args":[],"meta":{{"k":"{}"}}}}"#, "x".repeat(70_000));
        assert_eq!(parse(&body).unwrap_err().kind, ValidationKind::TooLarge);
    }

    #[test]
    fn jobs_sending_the_same_retry_policy_share_one() {
        let defaults = JobDefaults::default();
        let parse = |body: &str| parse_enqueue_body(body.as_bytes(), &defaults);
        let body = r#"{"type":"t","args":[],"options":{"retry":{"max_attempts":7}}}"#;
        let (first, second) = (parse(body).unwrap(), parse(body).unwrap());
        assert_eq!(first.retry.max_attempts, 7);
        assert!(Arc::ptr_eq(&first.retry, &second.retry));
        let other = parse(r#"{"type":"t","args":[],"options":{"retry":{"max_attempts":8}}}"#).unwrap();
        assert_eq!(other.retry.max_attempts, 8);

        // Over other defaults, the same text is merged again.
        let slow = Arc::new(RetryPolicy { initial_interval_ms: 5_000, ..RetryPolicy::default() });
        let over_slow = JobDefaults { retry: slow, ..JobDefaults::default() };
        let merged = parse_enqueue_body(body.as_bytes(), &over_slow).unwrap();
        assert_eq!((merged.retry.max_attempts, merged.retry.initial_interval_ms), (7, 5_000));

        // An invalid policy is refused every time, named where it was sent.
        for (body, field) in [
            (r#"{"type":"t","args":[],"options":{"retry":{"max_attempts":-1}}}"#, "options.retry.max_attempts"),
            (r#"{"type":"t","args":[],"retry":{"max_attempts":-1}}"#, "retry.max_attempts"),
            (r#"{"type":"t","args":[],"options":{"retry":{"max_attempts":-1}}}"#, "options.retry.max_attempts"),
        ] {
            assert_eq!(parse(body).unwrap_err().field.as_deref(), Some(field));
        }
    }

    #[test]
    fn relative_times_stay_relative_until_accepted() {
        let job = parse(r#"{"type":"t","args":[],"options":{"delay_until":"+PT5S"}}"#).unwrap();
        assert_eq!(job.scheduled_at, Some(TimeSpec::After(5000)));
    }
}
