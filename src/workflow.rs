//! Workflow creation bodies (docs/api.md, "Workflows"): a chain, group or
//! batch of enqueue items, with a batch's callbacks, validated into a
//! [`WorkflowDefinition`] before anything reaches the engine.

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::job::json::{self, RawObject};
use crate::job::{CallbackKind, JobBuilder, JobDefaults, NewJob, ValidationError, body_error, parse_enqueue_object};
use crate::limits::{WORKFLOW_JOBS_MAX, WORKFLOW_NAME_CHARS_MAX};
use crate::wire::ObjectWriter;

/// How a workflow's jobs relate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum WorkflowKind {
    /// One after the other; a step starts when the one before completed.
    Chain,
    /// All at once, independent of each other.
    Group,
    /// All at once, then callbacks once every job ended.
    Batch,
}

impl WorkflowKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowKind::Chain => "chain",
            WorkflowKind::Group => "group",
            WorkflowKind::Batch => "batch",
        }
    }
}

/// A validated creation request.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowDefinition {
    pub name: Option<String>,
    pub kind: WorkflowKind,
    /// Chain steps in order, or the group's or batch's jobs.
    pub jobs: Vec<NewJob>,
    /// A batch's callbacks, each at most once, in `CallbackKind` order.
    pub callbacks: Vec<(CallbackKind, NewJob)>,
}

/// Parses and validates `POST /workflows`: the canonical `{name?,
/// definition: {type, steps | jobs, callbacks?, options?}}`, or the flat
/// form where the body itself is the definition. Items keep their text
/// (`args` and `meta` as sent), as a single enqueue does.
pub fn parse_workflow_body(bytes: &[u8], defaults: &JobDefaults) -> Result<WorkflowDefinition, ValidationError> {
    let body = json::parse_object(bytes).map_err(body_error)?;
    let name = match body.get_present("name") {
        None => None,
        Some(raw) => match json::string_value(raw) {
            Some(name) if !name.is_empty() && name.chars().count() <= WORKFLOW_NAME_CHARS_MAX => {
                Some(name.into_owned())
            }
            _ => {
                return Err(structure(
                    "name",
                    format!("name must be a string of 1 to {WORKFLOW_NAME_CHARS_MAX} characters"),
                ));
            }
        },
    };
    let nested_definition;
    let (definition, prefix) = match body.get("definition") {
        Some(raw) => {
            nested_definition = json::parse_raw_object(raw)
                .ok_or_else(|| structure("definition", "definition must be an object".to_string()))?;
            (&nested_definition, "definition")
        }
        None if body.get("type").is_some() => (&body, ""),
        None => return Err(structure("definition", "definition is required".to_string())),
    };
    let at = |field: &str| if prefix.is_empty() { field.to_string() } else { format!("{prefix}.{field}") };

    let kind = match definition.get("type").map(json::string_value) {
        Some(Some(kind)) => match kind.as_ref() {
            "chain" => WorkflowKind::Chain,
            "group" => WorkflowKind::Group,
            "batch" => WorkflowKind::Batch,
            other => {
                return Err(structure(&at("type"), format!("type {other:?} is not one of chain, group, batch")));
            }
        },
        Some(None) => return Err(structure(&at("type"), "type must be a string".to_string())),
        None => return Err(structure(&at("type"), "type is required: chain, group or batch".to_string())),
    };
    if definition.get("depends_on").is_some() {
        return Err(unsupported(&at("depends_on"), "depends_on is not supported: use a chain"));
    }
    let options = match definition.get_present("options") {
        None => RawObject::default(),
        Some(raw) => json::parse_raw_object(raw)
            .ok_or_else(|| ValidationError::payload(at("options"), "options must be an object"))?,
    };
    let (items_field, items) = match (definition.get("steps"), definition.get("jobs")) {
        (Some(items), _) => ("steps", items),
        (None, Some(items)) => ("jobs", items),
        (None, None) => return Err(structure(&at("steps"), "steps (or jobs) is required".to_string())),
    };
    let items = match json::raw_elements_at_most(items, WORKFLOW_JOBS_MAX) {
        None => return Err(structure(&at(items_field), format!("{items_field} must be an array"))),
        Some(Err(count)) => return Err(item_count(&at(items_field), items_field, count)),
        Some(Ok(items)) if items.is_empty() => return Err(item_count(&at(items_field), items_field, 0)),
        Some(Ok(items)) => items,
    };
    let jobs = items
        .iter()
        .enumerate()
        .map(|(index, item)| parse_item(item, &options, &format!("{}[{index}]", at(items_field)), defaults))
        .collect::<Result<Vec<_>, _>>()?;

    let mut callbacks = Vec::new();
    let nested = match definition.get_present("callbacks") {
        None => None,
        Some(raw) => Some(
            json::parse_raw_object(raw)
                .ok_or_else(|| structure(&at("callbacks"), "callbacks must be an object".to_string()))?,
        ),
    };
    if let Some(nested) = &nested
        && let Some((unknown, _)) = nested.entries.iter().find(|(name, _)| CallbackKind::parse(name).is_none())
    {
        return Err(structure(
            &format!("{}.{unknown}", at("callbacks")),
            format!("{unknown} is not a callback: on_complete, on_success or on_failure"),
        ));
    }
    for kind in CallbackKind::ALL {
        let (item, path) = match nested.as_ref().and_then(|nested| nested.get(kind.as_str())) {
            Some(item) => (item, format!("{}.{}", at("callbacks"), kind.as_str())),
            None => match definition.get(kind.as_str()) {
                Some(item) => (item, at(kind.as_str())),
                None => continue,
            },
        };
        if item.get() == "null" {
            continue;
        }
        // A callback's id is decided at creation but its job is stored only
        // when it fires: a client's id could be taken by then.
        if json::parse_raw_object(item).is_some_and(|object| object.get("id").is_some()) {
            return Err(ValidationError::payload(format!("{path}.id"), "a callback cannot choose its id"));
        }
        callbacks.push((kind, parse_item(item, &options, &path, defaults)?));
    }
    match kind {
        WorkflowKind::Batch if callbacks.is_empty() => {
            return Err(structure(
                &at("callbacks"),
                "a batch needs at least one callback: on_complete, on_success or on_failure".to_string(),
            ));
        }
        WorkflowKind::Chain | WorkflowKind::Group if !callbacks.is_empty() => {
            return Err(structure(&at("callbacks"), "callbacks belong to batch workflows only".to_string()));
        }
        _ => {}
    }
    Ok(WorkflowDefinition { name, kind, jobs, callbacks })
}

fn item_count(path: &str, field: &str, count: usize) -> ValidationError {
    structure(path, format!("{field} must hold 1 to {WORKFLOW_JOBS_MAX} jobs, not {count}"))
}

/// The settings an item can give either under `options` or at its top
/// level: (names under `options`, names at the top level). A definition's
/// option gives way to an item that sets the same thing either way.
const SETTINGS: [(&[&str], &[&str]); 10] = [
    (&["queue"], &["queue"]),
    (&["priority"], &["priority"]),
    (&["timeout_ms"], &["timeout_ms", "timeout"]),
    (&["visibility_timeout_ms"], &["visibility_timeout_ms", "visibility_timeout"]),
    (&["delay_until", "scheduled_at"], &["scheduled_at", "delay_until"]),
    (&["expires_at"], &["expires_at"]),
    (&["retry", "retry_policy"], &["retry"]),
    (&["tags"], &["tags"]),
    (&["unique"], &["unique"]),
    (&["rate_limit"], &["rate_limit"]),
];

/// One member or callback: an enqueue item, with the definition's options
/// under its own and `args` defaulting to `[]`. The item is rewritten as
/// text from its own values' text, so numbers and key order stay as sent.
fn parse_item(
    item: &RawValue,
    definition_options: &RawObject,
    path: &str,
    defaults: &JobDefaults,
) -> Result<NewJob, ValidationError> {
    let Some(object) = json::parse_raw_object(item) else {
        return Err(ValidationError::payload(path, format!("{path} must be an enqueue item (an object)")));
    };
    if object.get("steps").is_some() || object.get("jobs").is_some() {
        return Err(unsupported(path, "nested workflows are not supported"));
    }
    if object.get("depends_on").is_some() {
        return Err(unsupported(&format!("{path}.depends_on"), "depends_on is not supported: use a chain"));
    }
    let own_options = match object.get_present("options") {
        None => RawObject::default(),
        Some(raw) => json::parse_raw_object(raw)
            .ok_or_else(|| ValidationError::payload(format!("{path}.options"), "options must be an object"))?,
    };
    if own_options.get("pending").is_some() || definition_options.get("pending").is_some() {
        return Err(ValidationError::payload(
            format!("{path}.options.pending"),
            "options.pending is not allowed in a workflow: the workflow decides when its jobs start",
        ));
    }
    let options = merged_options(definition_options, &own_options, &object);
    let mut text = ObjectWriter::continuing(String::with_capacity(item.get().len() + options.len() + 16));
    for (key, value) in object.entries.iter().filter(|(key, _)| key != "options") {
        text.raw(key, value.get());
    }
    if object.get("args").is_none() {
        text.raw("args", "[]");
    }
    if options != "{}" {
        text.raw("options", &options);
    }
    let text = text.finish();
    let object = json::parse_object(text.as_bytes()).map_err(body_error)?;
    parse_enqueue_object(&object, defaults).map_err(|error| error.within(path))
}

/// An item's options as text: its own, and those of the definition it
/// does not set itself, under `options` or at its top level. The
/// definition's `metadata` goes under the item's `meta`.
fn merged_options(definition: &RawObject, own: &RawObject, item: &RawObject) -> String {
    // The same name under its options, even as null, is the item's; another
    // name of the same setting counts only when it is not null.
    let set_by_item = |key: &str| {
        if own.get(key).is_some() {
            return true;
        }
        SETTINGS.iter().any(|(under_options, top_level)| {
            under_options.contains(&key)
                && (under_options.iter().any(|name| own.get_present(name).is_some())
                    || top_level.iter().any(|name| item.get_present(name).is_some()))
        })
    };
    let mut out = ObjectWriter::default();
    for (key, value) in &definition.entries {
        if set_by_item(key) {
            continue;
        }
        // The item's `meta` is merged over `options.metadata`; the
        // definition's metadata is the item's default, so the item's keys
        // win: the item's meta over the definition's metadata.
        let merged = (key == "metadata")
            .then(|| item.get_present("meta").and_then(json::parse_raw_object).zip(json::parse_raw_object(value)))
            .flatten()
            .map(|(meta, metadata)| json::merge_objects(metadata, meta));
        out.raw(key, merged.as_deref().unwrap_or(value.get()));
    }
    for (key, value) in &own.entries {
        out.raw(key, value.get());
    }
    out.finish()
}

/// A workflow described in Rust for the embedding API; validated exactly
/// as a `POST /workflows` body.
///
/// ```
/// use svc::job::{JobBuilder, JobDefaults};
/// use svc::workflow::WorkflowBuilder;
/// let mailing = WorkflowBuilder::batch([
///     JobBuilder::new("email.send").args(["u1"]),
///     JobBuilder::new("email.send").args(["u2"]),
/// ])
/// .name("mailing")
/// .on_failure(JobBuilder::new("mailing.alert").queue("alerts"))
/// .build(&JobDefaults::default())
/// .expect("a valid workflow");
/// assert_eq!(mailing.jobs.len(), 2);
/// ```
#[derive(Debug, Clone)]
pub struct WorkflowBuilder {
    kind: WorkflowKind,
    name: Option<String>,
    jobs: Vec<JobBuilder>,
    callbacks: Vec<(CallbackKind, JobBuilder)>,
}

impl WorkflowBuilder {
    /// Steps run one after the other, each given the results of those before.
    pub fn chain(steps: impl IntoIterator<Item = JobBuilder>) -> Self {
        Self::new(WorkflowKind::Chain, steps)
    }

    /// Jobs run at once, independently.
    pub fn group(jobs: impl IntoIterator<Item = JobBuilder>) -> Self {
        Self::new(WorkflowKind::Group, jobs)
    }

    /// Jobs run at once; callbacks fire once all of them ended.
    pub fn batch(jobs: impl IntoIterator<Item = JobBuilder>) -> Self {
        Self::new(WorkflowKind::Batch, jobs)
    }

    fn new(kind: WorkflowKind, jobs: impl IntoIterator<Item = JobBuilder>) -> Self {
        WorkflowBuilder { kind, name: None, jobs: jobs.into_iter().collect(), callbacks: Vec::new() }
    }

    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// A batch callback that fires whatever the outcome.
    pub fn on_complete(self, job: JobBuilder) -> Self {
        self.callback(CallbackKind::OnComplete, job)
    }

    /// A batch callback that fires if no job failed.
    pub fn on_success(self, job: JobBuilder) -> Self {
        self.callback(CallbackKind::OnSuccess, job)
    }

    /// A batch callback that fires if any job failed.
    pub fn on_failure(self, job: JobBuilder) -> Self {
        self.callback(CallbackKind::OnFailure, job)
    }

    fn callback(mut self, kind: CallbackKind, job: JobBuilder) -> Self {
        self.callbacks.retain(|(existing, _)| *existing != kind);
        self.callbacks.push((kind, job));
        self
    }

    /// Validates the workflow as the server validates a creation body.
    pub fn build(self, defaults: &JobDefaults) -> Result<WorkflowDefinition, ValidationError> {
        let jobs = self.jobs.into_iter().map(JobBuilder::into_json).collect::<Result<Vec<_>, _>>()?;
        let mut definition = Map::new();
        definition.insert("type".into(), self.kind.as_str().into());
        definition.insert("steps".into(), Value::Array(jobs));
        let mut callbacks = Map::new();
        for (kind, job) in self.callbacks {
            callbacks.insert(kind.as_str().into(), job.into_json()?);
        }
        if !callbacks.is_empty() {
            definition.insert("callbacks".into(), Value::Object(callbacks));
        }
        let mut body = Map::new();
        if let Some(name) = self.name {
            body.insert("name".into(), name.into());
        }
        body.insert("definition".into(), Value::Object(definition));
        parse_workflow_body(Value::Object(body).to_string().as_bytes(), defaults)
    }
}

/// A structural problem: 400 `invalid_request` with `validation_errors`.
fn structure(path: &str, message: String) -> ValidationError {
    let mut error = ValidationError::request(Some(path.to_string()), message.clone());
    error.details.push(("validation_errors", serde_json::json!([{"path": path, "message": message}])));
    error
}

fn unsupported(path: &str, message: &str) -> ValidationError {
    ValidationError {
        kind: crate::job::ValidationKind::Unsupported,
        message: format!("{path}: {message}"),
        field: Some(path.to_string()),
        reason: Some("feature_not_supported"),
        details: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: Value) -> Result<WorkflowDefinition, ValidationError> {
        parse_workflow_body(body.to_string().as_bytes(), &JobDefaults::default())
    }

    #[test]
    fn canonical_and_flat_forms_read_the_same() {
        let canonical = parse(serde_json::json!({"name": "onboarding", "definition": {"type": "chain", "steps": [
            {"type": "user.create", "args": ["a@x.io"], "options": {"queue": "users"}}, {"type": "email.welcome"}]}}))
        .unwrap();
        let flat = parse(serde_json::json!({"name": "onboarding", "type": "chain", "jobs": [
            {"type": "user.create", "args": ["a@x.io"], "options": {"queue": "users"}}, {"type": "email.welcome"}]}))
        .unwrap();
        assert_eq!(canonical, flat);
        assert_eq!((canonical.kind, canonical.jobs.len()), (WorkflowKind::Chain, 2));
        assert_eq!((canonical.jobs[0].queue.as_str(), canonical.jobs[1].payload.args()), ("users", "[]"));
    }

    #[test]
    fn definition_options_go_under_each_items_own() {
        let definition = parse(serde_json::json!({"definition": {"type": "batch",
            "options": {"queue": "bulk", "priority": 3},
            "jobs": [{"type": "a"}, {"type": "b", "options": {"queue": "own"}}],
            "on_failure": {"type": "alert", "options": {"queue": "alerts"}},
            "callbacks": {"on_success": {"type": "done"}}}}))
        .unwrap();
        assert_eq!((definition.jobs[0].queue.as_str(), definition.jobs[0].priority), ("bulk", 3));
        assert_eq!((definition.jobs[1].queue.as_str(), definition.jobs[1].priority), ("own", 3));
        let kinds: Vec<CallbackKind> = definition.callbacks.iter().map(|(kind, _)| *kind).collect();
        assert_eq!(kinds, [CallbackKind::OnSuccess, CallbackKind::OnFailure]);
        assert_eq!(definition.callbacks[1].1.queue, "alerts");
    }

    #[test]
    fn items_keep_their_text_and_their_own_settings_beat_the_definitions() {
        let body = r#"{"type": "group",
            "options": {"queue": "bulk", "priority": 3, "timeout_ms": 5000, "metadata": {"team": "ops", "tier": 1},
                        "retry": {"max_attempts": 7}},
            "jobs": [{"type": "a", "args": [1e2, 1.50, {"z": 1, "a": 2}], "meta": {"tier": 2}},
                     {"type": "b", "queue": "own", "timeout": 7, "priority": null},
                     {"type": "c", "options": {"metadata": {"x": true}, "queue": null, "retry_policy": null}}]}"#;
        let definition = parse_workflow_body(body.as_bytes(), &JobDefaults::default()).unwrap();
        let [a, b, c] = &definition.jobs[..] else { panic!("three jobs") };
        assert_eq!(a.payload.args(), r#"[1e2,1.50,{"z":1,"a":2}]"#, "number text and key order as sent");
        assert_eq!(a.payload.meta(), r#"{"tier":2,"team":"ops"}"#, "the item's meta over the definition's");
        assert_eq!((a.queue.as_str(), a.priority, a.timeout_ms), ("bulk", 3, 5000));
        // Top-level aliases are the item's own settings; a null one is absent.
        assert_eq!((b.queue.as_str(), b.timeout_ms, b.priority), ("own", 7000, 3));
        // The item's own options, null included, beat the definition's.
        assert_eq!((c.queue.as_str(), c.payload.meta()), ("default", r#"{"x":true}"#));
        // A null under another name of a setting leaves the definition's.
        assert_eq!(c.retry.max_attempts, 7);
    }

    #[test]
    fn structure_errors_are_invalid_request_with_their_path() {
        let cases = [
            (serde_json::json!({"name": "x"}), "definition"),
            (serde_json::json!({"definition": {"steps": [{"type": "a"}]}}), "definition.type"),
            (serde_json::json!({"definition": {"type": "dag", "steps": [{"type": "a"}]}}), "definition.type"),
            (serde_json::json!({"definition": {"type": "chain", "steps": []}}), "definition.steps"),
            (serde_json::json!({"definition": {"type": "batch", "jobs": [{"type": "a"}]}}), "definition.callbacks"),
            (
                serde_json::json!({"type": "batch", "jobs": [{"type": "a"}], "callbacks": {"on_done": {"type": "b"}}}),
                "callbacks.on_done",
            ),
            (serde_json::json!({"type": "group", "jobs": [{"type": "a"}], "on_success": {"type": "b"}}), "callbacks"),
        ];
        for (body, path) in cases {
            let error = parse(body.clone()).unwrap_err();
            assert_eq!(
                (error.kind, error.field.as_deref()),
                (crate::job::ValidationKind::Request, Some(path)),
                "{body}"
            );
            assert_eq!(error.details[0].1[0]["path"], path);
        }
        let too_many: Vec<Value> = (0..=WORKFLOW_JOBS_MAX).map(|_| serde_json::json!({"type": "a"})).collect();
        assert!(parse(serde_json::json!({"type": "group", "jobs": too_many})).is_err());
    }

    #[test]
    fn item_errors_name_the_item_and_nesting_is_unsupported() {
        let error =
            parse(serde_json::json!({"type": "chain", "steps": [{"type": "a"}, {"type": "bad type"}]})).unwrap_err();
        assert_eq!((error.kind, error.field.as_deref()), (crate::job::ValidationKind::Payload, Some("steps[1].type")));
        let nested = parse(serde_json::json!({"type": "chain", "steps": [{"type": "group", "jobs": [{"type": "a"}]}]}));
        assert_eq!(nested.unwrap_err().kind, crate::job::ValidationKind::Unsupported);
        let depends = parse(serde_json::json!({"type": "group", "jobs": [{"type": "a", "depends_on": ["x"]}]}));
        assert_eq!(depends.unwrap_err().kind, crate::job::ValidationKind::Unsupported);
        let staged = parse(serde_json::json!({"type": "group", "jobs": [{"type": "a", "options": {"pending": true}}]}));
        assert_eq!(staged.unwrap_err().field.as_deref(), Some("jobs[0].options.pending"));
        let staged_by_definition =
            parse(serde_json::json!({"type": "group", "options": {"pending": true}, "jobs": [{"type": "a"}]}));
        assert_eq!(staged_by_definition.unwrap_err().field.as_deref(), Some("jobs[0].options.pending"));
    }
}
