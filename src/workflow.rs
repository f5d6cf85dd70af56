//! Workflow creation bodies (docs/api.md, "Workflows"): a chain, group or
//! batch of enqueue items, with a batch's callbacks, validated into a
//! [`WorkflowDefinition`] before anything reaches the engine.

use serde_json::{Map, Value};

use crate::job::json::{self, minify};
use crate::job::{CallbackKind, JobBuilder, JobDefaults, NewJob, ValidationError, body_error, parse_enqueue_object};
use crate::limits::{WORKFLOW_JOBS_MAX, WORKFLOW_NAME_CHARS_MAX};

/// How a workflow's jobs relate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
/// form where the body itself is the definition.
pub fn parse_workflow_body(bytes: &[u8], defaults: &JobDefaults) -> Result<WorkflowDefinition, ValidationError> {
    let body: Value = match json::parse_object(bytes) {
        Ok(_) => serde_json::from_slice(bytes).map_err(|error| ValidationError::request(None, error.to_string()))?,
        Err(error) => return Err(body_error(error)),
    };
    let Value::Object(body) = body else { unreachable!("parse_object checked for an object") };
    let name = match body.get("name") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) if !name.is_empty() && name.chars().count() <= WORKFLOW_NAME_CHARS_MAX => {
            Some(name.clone())
        }
        Some(_) => {
            return Err(structure(
                "name",
                format!("name must be a string of 1 to {WORKFLOW_NAME_CHARS_MAX} characters"),
            ));
        }
    };
    let (definition, prefix) = match body.get("definition") {
        Some(Value::Object(definition)) => (definition, "definition"),
        Some(_) => return Err(structure("definition", "definition must be an object".to_string())),
        None if body.contains_key("type") => (&body, ""),
        None => return Err(structure("definition", "definition is required".to_string())),
    };
    let at = |field: &str| if prefix.is_empty() { field.to_string() } else { format!("{prefix}.{field}") };

    let kind = match definition.get("type") {
        Some(Value::String(kind)) => match kind.as_str() {
            "chain" => WorkflowKind::Chain,
            "group" => WorkflowKind::Group,
            "batch" => WorkflowKind::Batch,
            other => {
                return Err(structure(&at("type"), format!("type {other:?} is not one of chain, group, batch")));
            }
        },
        Some(_) => return Err(structure(&at("type"), "type must be a string".to_string())),
        None => return Err(structure(&at("type"), "type is required: chain, group or batch".to_string())),
    };
    if definition.contains_key("depends_on") {
        return Err(unsupported(&at("depends_on"), "depends_on is not supported: use a chain"));
    }
    let options = match definition.get("options") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(options)) => options.clone(),
        Some(_) => return Err(ValidationError::payload(at("options"), "options must be an object")),
    };
    let (items_field, items) = match (definition.get("steps"), definition.get("jobs")) {
        (Some(items), _) => ("steps", items),
        (None, Some(items)) => ("jobs", items),
        (None, None) => return Err(structure(&at("steps"), "steps (or jobs) is required".to_string())),
    };
    let Value::Array(items) = items else {
        return Err(structure(&at(items_field), format!("{items_field} must be an array")));
    };
    if items.is_empty() || items.len() > WORKFLOW_JOBS_MAX {
        return Err(structure(
            &at(items_field),
            format!("{items_field} must hold 1 to {WORKFLOW_JOBS_MAX} jobs, not {}", items.len()),
        ));
    }
    let jobs = items
        .iter()
        .enumerate()
        .map(|(index, item)| parse_item(item, &options, &format!("{}[{index}]", at(items_field)), defaults))
        .collect::<Result<Vec<_>, _>>()?;

    let mut callbacks = Vec::new();
    let nested = match definition.get("callbacks") {
        None | Some(Value::Null) => None,
        Some(Value::Object(callbacks)) => Some(callbacks),
        Some(_) => return Err(structure(&at("callbacks"), "callbacks must be an object".to_string())),
    };
    if let Some(nested) = nested
        && let Some(unknown) = nested.keys().find(|name| CallbackKind::parse(name).is_none())
    {
        return Err(structure(
            &format!("{}.{unknown}", at("callbacks")),
            format!("{unknown} is not a callback: on_complete, on_success or on_failure"),
        ));
    }
    for kind in CallbackKind::ALL {
        let (item, path) = match nested.and_then(|nested| nested.get(kind.as_str())) {
            Some(item) => (item, format!("{}.{}", at("callbacks"), kind.as_str())),
            None => match definition.get(kind.as_str()) {
                Some(item) => (item, at(kind.as_str())),
                None => continue,
            },
        };
        if item.is_null() {
            continue;
        }
        // A callback's id is decided at creation but its job is stored only
        // when it fires: a client's id could be taken by then.
        if item.get("id").is_some() {
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

/// One member or callback: an enqueue item, with the definition's options
/// under its own and `args` defaulting to `[]`.
fn parse_item(
    item: &Value,
    defaults_options: &Map<String, Value>,
    path: &str,
    defaults: &JobDefaults,
) -> Result<NewJob, ValidationError> {
    let Value::Object(item) = item else {
        return Err(ValidationError::payload(path, format!("{path} must be an enqueue item (an object)")));
    };
    if item.contains_key("steps") || item.contains_key("jobs") {
        return Err(unsupported(path, "nested workflows are not supported"));
    }
    if item.contains_key("depends_on") {
        return Err(unsupported(&format!("{path}.depends_on"), "depends_on is not supported: use a chain"));
    }
    let mut item = item.clone();
    item.entry("args").or_insert_with(|| Value::Array(Vec::new()));
    if !defaults_options.is_empty() {
        let mut options = defaults_options.clone();
        match item.get("options") {
            None | Some(Value::Null) => {}
            Some(Value::Object(own)) => options.extend(own.clone()),
            Some(_) => return Err(ValidationError::payload(format!("{path}.options"), "options must be an object")),
        }
        item.insert("options".into(), Value::Object(options));
    }
    if let Some(Value::Object(options)) = item.get("options")
        && options.contains_key("pending")
    {
        return Err(ValidationError::payload(
            format!("{path}.options.pending"),
            "options.pending is not allowed in a workflow: the workflow decides when its jobs start",
        ));
    }
    let text = minify(&Value::Object(item).to_string());
    let object = json::parse_object(text.as_bytes()).map_err(body_error)?;
    parse_enqueue_object(&object, defaults).map_err(|error| error.within(path))
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
    }
}
