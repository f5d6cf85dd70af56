//! The schema registry's documents (docs/api.md, "Schemas"): parsing a
//! registration, compiling a JSON Schema (draft 2020-12) once, and checking
//! a job's `args` against it.
//!
//! A `$ref` to another document resolves only to a registered schema, and
//! the documents it reached are kept with the entry: an entry compiles from
//! itself and those alone, so it means the same after a restart, and after
//! a schema it refers to is deleted, as when it was registered. Nothing is
//! ever fetched from the network.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::clock::Millis;
use crate::job::ValidationError;
use crate::job::json::{self, RawObject};

pub use crate::limits::{SCHEMA_URI_BYTES_MAX, SCHEMA_URI_CHARS_MAX};
/// The largest schema document, as compact JSON.
pub const SCHEMA_DOCUMENT_BYTES_MAX: usize = 256 * 1024;
/// The most validation errors one answer lists.
pub const SCHEMA_ERRORS_MAX: usize = 20;
/// The one `$schema` a document may name (or none).
const DRAFT_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";

/// A registered schema, as stored and logged.
#[derive(Serialize, Deserialize)]
pub struct SchemaEntry {
    pub uri: String,
    /// The document as compact JSON.
    pub document: Arc<str>,
    /// Free metadata: the job type the schema is meant for.
    pub job_type: Option<String>,
    /// Free metadata, as compact JSON (a string or an integer).
    pub version: Option<String>,
    pub created_at: Millis,
    /// The registered documents its `$ref`s reached when it was registered:
    /// (uri, compact JSON).
    pub resources: Vec<(String, Arc<str>)>,
    /// The compiled validator, made once: at registration, or at first use
    /// after a restart.
    #[serde(skip)]
    compiled: OnceLock<Result<Arc<jsonschema::Validator>, String>>,
}

impl Clone for SchemaEntry {
    fn clone(&self) -> Self {
        Self {
            uri: self.uri.clone(),
            document: self.document.clone(),
            job_type: self.job_type.clone(),
            version: self.version.clone(),
            created_at: self.created_at,
            resources: self.resources.clone(),
            compiled: self.compiled.clone(),
        }
    }
}

impl PartialEq for SchemaEntry {
    fn eq(&self, other: &Self) -> bool {
        self.uri == other.uri
            && self.document == other.document
            && self.job_type == other.job_type
            && self.version == other.version
            && self.created_at == other.created_at
            && self.resources == other.resources
    }
}

impl std::fmt::Debug for SchemaEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchemaEntry").field("uri", &self.uri).field("created_at", &self.created_at).finish()
    }
}

/// One way a job's `args` miss its schema: where, and which keyword.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaViolation {
    /// Where in the job, e.g. `args[0].email`.
    pub path: String,
    /// The keyword that failed, e.g. `required`.
    pub keyword: String,
    /// What failed, without the offending value.
    pub message: String,
}

/// A registration before the engine stores it: the document checked and
/// compiled against the schemas registered now.
pub struct SchemaRegistration {
    pub entry: SchemaEntry,
}

impl SchemaEntry {
    /// The document as a JSON value.
    pub fn document_value(&self) -> Value {
        serde_json::from_str(&self.document).unwrap_or(Value::Null)
    }

    /// The compiled validator; compiled on first use when it was loaded from disk.
    fn validator(&self) -> Result<&Arc<jsonschema::Validator>, &String> {
        self.compiled
            .get_or_init(|| {
                let resources: BTreeMap<String, Value> = self
                    .resources
                    .iter()
                    .filter_map(|(uri, text)| Some((uri.clone(), serde_json::from_str(text).ok()?)))
                    .collect();
                let document: Value = serde_json::from_str(&self.document).map_err(|error| error.to_string())?;
                compile(&document, Retriever::frozen(resources)).map(|(validator, _)| Arc::new(validator))
            })
            .as_ref()
    }

    /// Checks a job's `args` (compact JSON text of an array). At most
    /// [`SCHEMA_ERRORS_MAX`] violations, paths relative to the job (`args…`).
    pub fn check_args(&self, args: &str) -> Result<(), Vec<SchemaViolation>> {
        let validator = match self.validator() {
            Ok(validator) => validator,
            Err(problem) => {
                return Err(vec![SchemaViolation {
                    path: "args".to_string(),
                    keyword: "$schema".to_string(),
                    message: format!("the schema cannot be used: {problem}"),
                }]);
            }
        };
        let Ok(args) = serde_json::from_str::<Value>(args) else {
            return Err(vec![SchemaViolation {
                path: "args".to_string(),
                keyword: "type".to_string(),
                message: "args is not JSON".to_string(),
            }]);
        };
        let violations: Vec<SchemaViolation> = validator
            .iter_errors(&args)
            .take(SCHEMA_ERRORS_MAX)
            .map(|error| SchemaViolation {
                path: job_path(error.instance_path().as_str()),
                keyword: error.kind().keyword().to_string(),
                message: error.masked().to_string(),
            })
            .collect();
        if violations.is_empty() { Ok(()) } else { Err(violations) }
    }
}

/// `/0/email` → `args[0].email`.
fn job_path(pointer: &str) -> String {
    let mut path = String::from("args");
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if !segment.is_empty() && segment.bytes().all(|byte| byte.is_ascii_digit()) {
            path.push('[');
            path.push_str(&segment);
            path.push(']');
        } else {
            path.push('.');
            path.push_str(&segment);
        }
    }
    path
}

/// Where `$ref`s to other documents resolve: the registered schemas (at
/// registration, noting each one reached), or an entry's own resources.
struct Retriever {
    documents: BTreeMap<String, Value>,
    reached: Mutex<Vec<String>>,
}

impl Retriever {
    fn frozen(documents: BTreeMap<String, Value>) -> Self {
        Self { documents, reached: Mutex::new(Vec::new()) }
    }
}

impl jsonschema::Retrieve for Retriever {
    fn retrieve(&self, uri: &jsonschema::Uri<String>) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        let key = uri.as_str().trim_end_matches('#');
        match self.documents.get(key) {
            Some(document) => {
                self.reached.lock().map_err(|_| "poisoned")?.push(key.to_string());
                Ok(document.clone())
            }
            None => Err(format!("$ref {key} is not a registered schema").into()),
        }
    }
}

/// Checks a document against the draft 2020-12 meta-schema and compiles it;
/// answers the validator and the registered documents it reached.
fn compile(document: &Value, retriever: Retriever) -> Result<(jsonschema::Validator, Vec<String>), String> {
    if let Some(named) = document.get("$schema") {
        let named = named.as_str().unwrap_or("");
        if named.trim_end_matches('#') != DRAFT_2020_12 {
            return Err(format!("$schema must be {DRAFT_2020_12} (or absent); other drafts are not supported"));
        }
    }
    if let Err(error) = jsonschema::draft202012::meta::validate(document) {
        let at = error.instance_path().as_str().to_string();
        let at = if at.is_empty() { String::new() } else { format!(" at {at}") };
        return Err(format!("not a valid JSON Schema (draft 2020-12){at}: {}", error.masked()));
    }
    let retriever = Arc::new(retriever);
    let validator = jsonschema::draft202012::options()
        .should_validate_formats(false)
        .with_retriever(RetrieverHandle(retriever.clone()))
        .build(document)
        .map_err(|error| format!("the schema cannot be compiled: {error}"))?;
    let mut reached = retriever.reached.lock().map(|reached| reached.clone()).unwrap_or_default();
    reached.sort();
    reached.dedup();
    Ok((validator, reached))
}

/// Shares the retriever with the compiler, so that what it reached can be read afterwards.
struct RetrieverHandle(Arc<Retriever>);

impl jsonschema::Retrieve for RetrieverHandle {
    fn retrieve(&self, uri: &jsonschema::Uri<String>) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        self.0.retrieve(uri)
    }
}

/// A schema to register from Rust; it is checked exactly as a
/// `POST /schemas` body is.
///
/// ```
/// use serde_json::json;
/// use svc::schema::SchemaBuilder;
/// let schema = SchemaBuilder::new("urn:svc:email.send:v1", json!({"type": "array", "minItems": 1}))
///     .job_type("email.send")
///     .version(1);
/// assert_eq!(schema.into_json()["uri"], "urn:svc:email.send:v1");
/// ```
#[derive(Debug, Clone)]
pub struct SchemaBuilder {
    body: serde_json::Map<String, Value>,
}

impl SchemaBuilder {
    /// A schema `uri` (absolute, e.g. `urn:…`) with its draft 2020-12 `document`.
    pub fn new(uri: impl Into<String>, document: impl Serialize) -> Self {
        let mut body = serde_json::Map::new();
        body.insert("uri".into(), Value::String(uri.into()));
        body.insert("schema".into(), serde_json::to_value(document).unwrap_or(Value::Null));
        SchemaBuilder { body }
    }

    /// Free metadata: the job type the schema is meant for.
    pub fn job_type(mut self, job_type: impl Into<String>) -> Self {
        self.body.insert("type".into(), Value::String(job_type.into()));
        self
    }

    /// Free metadata: a version number.
    pub fn version(mut self, version: u64) -> Self {
        self.body.insert("version".into(), Value::from(version));
        self
    }

    /// The registration body this builder stands for.
    pub fn into_json(self) -> Value {
        Value::Object(self.body)
    }
}

/// Parses and checks `POST /schemas` (`{uri, schema, type?, version?}`),
/// compiling the document with `registered` as the documents a `$ref` may
/// reach. `now` is when it is registered.
pub fn parse_registration(
    bytes: &[u8],
    now: Millis,
    registered: &dyn Fn(&str) -> Option<Arc<SchemaEntry>>,
) -> Result<SchemaRegistration, ValidationError> {
    let object = json::parse_object(bytes).map_err(crate::job::body_error)?;
    registration_from(&object, now, registered)
}

fn registration_from(
    object: &RawObject<'_>,
    now: Millis,
    registered: &dyn Fn(&str) -> Option<Arc<SchemaEntry>>,
) -> Result<SchemaRegistration, ValidationError> {
    let uri = match object.get_present("uri") {
        None => return Err(ValidationError::request(Some("uri".to_string()), "uri is required")),
        Some(raw) => serde_json::from_str::<String>(raw.get())
            .map_err(|_| ValidationError::request(Some("uri".to_string()), "uri must be a string"))?,
    };
    check_uri(&uri).map_err(|message| ValidationError::request(Some("uri".to_string()), message))?;
    let job_type = match object.get_present("type").or_else(|| object.get_present("job_type")) {
        None => None,
        Some(raw) => Some(
            serde_json::from_str::<String>(raw.get())
                .ok()
                .filter(|text| !text.is_empty() && text.chars().count() <= 255)
                .ok_or_else(|| {
                    ValidationError::request(Some("type".to_string()), "type must be a string of 1 to 255 characters")
                })?,
        ),
    };
    let version = match object.get_present("version") {
        None => None,
        Some(raw) => match serde_json::from_str::<Value>(raw.get()) {
            Ok(Value::String(text)) if !text.is_empty() && text.chars().count() <= 64 => Some(raw.get().to_string()),
            Ok(Value::Number(number)) if number.is_u64() => Some(number.to_string()),
            _ => {
                return Err(ValidationError::request(
                    Some("version".to_string()),
                    "version must be a string of 1 to 64 characters or a non-negative integer",
                ));
            }
        },
    };
    let Some(raw_document) = object.get_present("schema") else {
        return Err(ValidationError::request(Some("schema".to_string()), "schema is required"));
    };
    let document: Value = serde_json::from_str(raw_document.get())
        .map_err(|_| ValidationError::request(Some("schema".to_string()), "schema must be JSON"))?;
    if !document.is_object() && !document.is_boolean() {
        return Err(ValidationError::request(Some("schema".to_string()), "schema must be a JSON object or a boolean")
            .with_reason("invalid_schema"));
    }
    let compact = document.to_string();
    if compact.len() > SCHEMA_DOCUMENT_BYTES_MAX {
        return Err(ValidationError::too_large("schema", SCHEMA_DOCUMENT_BYTES_MAX, compact.len()));
    }
    let mut documents = BTreeMap::new();
    collect_references(&document, registered, &mut documents);
    let (validator, reached) = compile(&document, Retriever::frozen(documents.clone())).map_err(|message| {
        ValidationError::request(Some("schema".to_string()), message).with_reason("invalid_schema")
    })?;
    let resources = reached
        .into_iter()
        .filter_map(|uri| {
            let text: Arc<str> = Arc::from(documents.get(&uri)?.to_string());
            Some((uri, text))
        })
        .collect();
    let compiled = OnceLock::new();
    let _ = compiled.set(Ok(Arc::new(validator)));
    Ok(SchemaRegistration {
        entry: SchemaEntry {
            uri,
            document: Arc::from(compact),
            job_type,
            version,
            created_at: now,
            resources,
            compiled,
        },
    })
}

/// The registered documents `document` may reach through `$ref`, followed
/// through the documents they refer to in turn.
fn collect_references(
    document: &Value,
    registered: &dyn Fn(&str) -> Option<Arc<SchemaEntry>>,
    out: &mut BTreeMap<String, Value>,
) {
    let mut pending = vec![document.clone()];
    while let Some(current) = pending.pop() {
        let mut references = Vec::new();
        references_in(&current, &mut references);
        for reference in references {
            let target = reference.split('#').next().unwrap_or("").to_string();
            if target.is_empty() || out.contains_key(&target) {
                continue;
            }
            let Some(entry) = registered(&target) else { continue };
            out.insert(target, entry.document_value());
            for (uri, text) in &entry.resources {
                if let Ok(value) = serde_json::from_str(text) {
                    out.entry(uri.clone()).or_insert(value);
                }
            }
            pending.push(entry.document_value());
        }
    }
}

fn references_in(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                if (key == "$ref" || key == "$dynamicRef")
                    && let Value::String(reference) = item
                {
                    out.push(reference.clone());
                }
                references_in(item, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|item| references_in(item, out)),
        _ => {}
    }
}

pub use crate::job::check_schema_uri as check_uri;

/// Checks a job's `args` against the schema registered under `uri`
/// (`None`: none is), as an enqueue does (docs/api.md, "Schemas"): the
/// error names the schema and lists the violations.
pub fn check_job_args(schema: Option<&SchemaEntry>, uri: &str, args: &str) -> Result<(), ValidationError> {
    use crate::job::ValidationKind;
    let Some(schema) = schema else {
        let mut error = ValidationError::payload("schema", format!("schema {uri} is not registered"))
            .with_reason("schema_not_registered");
        error.kind = ValidationKind::Schema;
        error.details.push(("schema", uri.into()));
        return Err(error);
    };
    let violations = match schema.check_args(args) {
        Ok(()) => return Ok(()),
        Err(violations) => violations,
    };
    let first = &violations[0];
    let mut error = ValidationError::payload(
        "args",
        format!("args do not match schema {uri}: {} ({} at {})", first.message, first.keyword, first.path),
    );
    error.kind = ValidationKind::Schema;
    error.details.push(("schema", uri.into()));
    error.details.push(("validation_errors", serde_json::to_value(&violations).unwrap_or_default()));
    Err(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn register(body: Value, registered: &[Arc<SchemaEntry>]) -> Result<SchemaEntry, ValidationError> {
        let lookup = |uri: &str| registered.iter().find(|entry| entry.uri == uri).cloned();
        parse_registration(body.to_string().as_bytes(), 0, &lookup).map(|registration| registration.entry)
    }

    #[test]
    fn paths_point_into_the_job() {
        assert_eq!(job_path(""), "args");
        assert_eq!(job_path("/0/email"), "args[0].email");
        assert_eq!(job_path("/1/a~1b/2"), "args[1].a/b[2]");
    }

    #[test]
    fn a_document_must_be_draft_2020_12() {
        let bad = register(json!({"uri": "urn:a", "schema": {"type": "nope"}}), &[]).unwrap_err();
        assert_eq!(bad.reason, Some("invalid_schema"));
        let other_draft =
            register(json!({"uri": "urn:a", "schema": {"$schema": "http://json-schema.org/draft-07/schema#"}}), &[])
                .unwrap_err();
        assert_eq!(other_draft.reason, Some("invalid_schema"));
        assert!(register(json!({"uri": "urn:a", "schema": true}), &[]).is_ok());
        for uri in ["", "relative/path", "urn:", "urn:a#frag", "has space:x"] {
            assert!(register(json!({"uri": uri, "schema": {}}), &[]).is_err(), "{uri}");
        }
    }

    #[test]
    fn violations_name_path_and_keyword_never_the_value() {
        let entry = register(
            json!({"uri": "urn:a", "schema": {"type": "array", "prefixItems": [
                {"type": "object", "required": ["email"], "properties": {"email": {"type": "string"}}}
            ]}}),
            &[],
        )
        .unwrap();
        assert!(entry.check_args(r#"[{"email":"a@b"}]"#).is_ok());
        let violations = entry.check_args(r#"[{"email":12345678}]"#).unwrap_err();
        assert_eq!(violations[0].path, "args[0].email");
        assert_eq!(violations[0].keyword, "type");
        assert!(!violations[0].message.contains("12345678"), "{}", violations[0].message);
        let missing = entry.check_args("[{}]").unwrap_err();
        assert_eq!(missing[0].keyword, "required");
    }

    #[test]
    fn refs_reach_only_registered_schemas_and_are_kept() {
        let refused = register(json!({"uri": "urn:b", "schema": {"$ref": "https://example.com/not-registered"}}), &[])
            .unwrap_err();
        assert_eq!(refused.reason, Some("invalid_schema"));
        let email = Arc::new(register(json!({"uri": "urn:email", "schema": {"type": "string"}}), &[]).unwrap());
        let user = register(
            json!({"uri": "urn:user", "schema": {"type": "array", "items": {"$ref": "urn:email"}}}),
            std::slice::from_ref(&email),
        )
        .unwrap();
        assert_eq!(user.resources.len(), 1);
        // As loaded from disk: compiled from its own resources alone.
        let loaded: SchemaEntry = postcard::from_bytes(&postcard::to_allocvec(&user).unwrap()).unwrap();
        assert!(loaded.check_args(r#"["a@b"]"#).is_ok());
        assert_eq!(loaded.check_args("[1]").unwrap_err()[0].path, "args[0]");
    }
}
