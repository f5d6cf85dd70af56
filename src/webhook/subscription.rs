//! Webhook subscriptions (docs/api.md, "Webhooks"): what one is, the create
//! and change bodies with their rules, and which events it takes.
//!
//! The secret is write-only: it is stored (deliveries are signed with it
//! after a restart too) but never rendered, logged or put in an error.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock::Millis;
use crate::job::json::{self, RawObject};
use crate::job::{SubscriptionId, ValidationError, is_valid_queue};

use super::guard::{AddressClass, classify};

/// The longest subscription URL.
pub const URL_CHARS_MAX: usize = 2048;
/// How many event patterns one subscription may list.
pub const EVENT_PATTERNS_MAX: usize = 64;
/// The shortest and the longest secret.
pub const SECRET_CHARS_MIN: usize = 16;
pub const SECRET_CHARS_MAX: usize = 256;
/// The largest `metadata`, as compact JSON.
pub const METADATA_BYTES_MAX: usize = 16 * 1024;
/// How many queues or job types a filter may list.
pub const FILTER_ITEMS_MAX: usize = 64;
/// The longest event pattern.
const PATTERN_CHARS_MAX: usize = 255;

/// A subscription, as stored and logged.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct Subscription {
    /// Rendered `sub_<uuidv7>`.
    pub id: SubscriptionId,
    pub url: String,
    pub events: Vec<String>,
    /// The secret `X-SVC-Signature` is made with.
    pub secret: String,
    /// A new secret being rolled in, while the old one still signs.
    pub rotation: Option<Rotation>,
    /// Compact JSON of an object.
    pub metadata: String,
    pub filter: Option<SubscriptionFilter>,
    pub active: bool,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// A secret rotation in progress (docs/api.md, "Rotating a secret").
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct Rotation {
    /// Signs `X-SVC-Signature-New` until the rotation ends, then `X-SVC-Signature`.
    pub next_secret: String,
    pub started_at: Millis,
    /// When the old secret stops signing by itself.
    pub expires_at: Millis,
}

/// Only events whose `data.queue` / `data.job_type` match are delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionFilter {
    pub queues: Option<Vec<String>>,
    /// Exact types or `prefix.*`.
    pub job_types: Option<Vec<String>>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secrets.
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .field("url", &self.url)
            .field("events", &self.events)
            .field("active", &self.active)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Rotation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rotation").field("started_at", &self.started_at).field("expires_at", &self.expires_at).finish()
    }
}

/// Whether `pattern` (exact, `prefix.*` or `*`) takes an event type.
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some("") => true,
        Some(prefix) if prefix.ends_with('.') => name.starts_with(prefix),
        _ => pattern == name,
    }
}

impl Subscription {
    /// The subscription as it stands at `now`: a rotation whose grace ran
    /// out has ended, and the new secret signs alone.
    pub fn settled(&self, now: Millis) -> Subscription {
        let mut settled = self.clone();
        if let Some(rotation) = &self.rotation
            && now >= rotation.expires_at
        {
            settled.secret = rotation.next_secret.clone();
            settled.rotation = None;
        }
        settled
    }

    /// The secrets that sign at `now`, as [`Subscription::settled`] has
    /// them, without copying the subscription: the one for
    /// `X-SVC-Signature`, and during a rotation the one for
    /// `X-SVC-Signature-New` (docs/api.md, "Rotating a secret").
    pub fn signing_secrets(&self, now: Millis) -> (&str, Option<&str>) {
        match &self.rotation {
            Some(rotation) if now >= rotation.expires_at => (&rotation.next_secret, None),
            Some(rotation) => (&self.secret, Some(&rotation.next_secret)),
            None => (&self.secret, None),
        }
    }

    /// Whether an event is for this subscription: an active one whose
    /// patterns take the type and whose filter takes the event's queue and
    /// job type (an event without them passes no filter that names them).
    pub fn takes(&self, event_type: &str, queue: Option<&str>, job_type: Option<&str>) -> bool {
        if !self.active || !self.events.iter().any(|pattern| pattern_matches(pattern, event_type)) {
            return false;
        }
        let Some(filter) = &self.filter else { return true };
        let queue_ok = filter.queues.as_ref().is_none_or(|queues| queue.is_some_and(|q| queues.iter().any(|x| x == q)));
        let type_ok = filter
            .job_types
            .as_ref()
            .is_none_or(|types| job_type.is_some_and(|t| types.iter().any(|pattern| pattern_matches(pattern, t))));
        queue_ok && type_ok
    }
}

/// A validated create body.
#[derive(Clone)]
pub struct NewSubscription {
    pub url: String,
    pub events: Vec<String>,
    pub secret: String,
    pub metadata: String,
    pub filter: Option<SubscriptionFilter>,
    pub active: bool,
}

impl NewSubscription {
    /// The subscription this body creates, as either backend stores it.
    pub fn stored(self, id: SubscriptionId, now: Millis) -> Subscription {
        Subscription {
            id,
            url: self.url,
            events: self.events,
            secret: self.secret,
            rotation: None,
            metadata: self.metadata,
            filter: self.filter,
            active: self.active,
            created_at: now,
            updated_at: now,
        }
    }
}

/// A validated change: each field present is replaced.
#[derive(Clone, Default)]
pub struct SubscriptionPatch {
    pub url: Option<String>,
    pub events: Option<Vec<String>>,
    pub secret: Option<String>,
    pub metadata: Option<String>,
    pub filter: Option<SubscriptionFilter>,
    pub active: Option<bool>,
}

const PATCH_FIELDS: [&str; 6] = ["url", "events", "secret", "metadata", "filter", "active"];

/// A subscription described in Rust, checked exactly as a `POST /webhooks`
/// body is.
///
/// ```
/// use svc::webhook::subscription::WebhookBuilder;
/// let body = WebhookBuilder::new("https://hooks.example.com/svc", ["job.completed"], "a-secret-of-16+chars")
///     .filter_queues(["mail"])
///     .into_json();
/// assert_eq!(body["filter"]["queues"][0], "mail");
/// ```
#[derive(Debug, Clone)]
pub struct WebhookBuilder {
    body: serde_json::Map<String, Value>,
}

impl WebhookBuilder {
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(url: &str, events: I, secret: &str) -> Self {
        let mut body = serde_json::Map::new();
        body.insert("url".into(), url.into());
        body.insert(
            "events".into(),
            Value::Array(events.into_iter().map(|event| Value::String(event.into())).collect()),
        );
        body.insert("secret".into(), secret.into());
        WebhookBuilder { body }
    }

    /// Kept with the subscription and shown with it.
    pub fn metadata(mut self, metadata: impl Serialize) -> Self {
        self.body.insert("metadata".into(), serde_json::to_value(metadata).unwrap_or(Value::Null));
        self
    }

    /// Only events of these queues.
    pub fn filter_queues<I: IntoIterator<Item = S>, S: Into<String>>(mut self, queues: I) -> Self {
        self.filter("queues", queues);
        self
    }

    /// Only events of these job types (exact or `prefix.*`).
    pub fn filter_job_types<I: IntoIterator<Item = S>, S: Into<String>>(mut self, types: I) -> Self {
        self.filter("job_types", types);
        self
    }

    fn filter<I: IntoIterator<Item = S>, S: Into<String>>(&mut self, key: &str, items: I) {
        let filter = self.body.entry("filter").or_insert_with(|| Value::Object(Default::default()));
        filter[key] = Value::Array(items.into_iter().map(|item| Value::String(item.into())).collect());
    }

    /// Created paused (`active: false`).
    pub fn inactive(mut self) -> Self {
        self.body.insert("active".into(), Value::Bool(false));
        self
    }

    pub fn into_json(self) -> Value {
        Value::Object(self.body)
    }
}

/// A change to a subscription described in Rust, checked exactly as a
/// `PATCH /webhooks/{id}` body is.
#[derive(Debug, Clone, Default)]
pub struct WebhookUpdate {
    body: serde_json::Map<String, Value>,
}

impl WebhookUpdate {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn url(mut self, url: &str) -> Self {
        self.body.insert("url".into(), url.into());
        self
    }

    pub fn events<I: IntoIterator<Item = S>, S: Into<String>>(mut self, events: I) -> Self {
        self.body.insert("events".into(), Value::Array(events.into_iter().map(|e| Value::String(e.into())).collect()));
        self
    }

    pub fn active(mut self, active: bool) -> Self {
        self.body.insert("active".into(), Value::Bool(active));
        self
    }

    pub fn metadata(mut self, metadata: impl Serialize) -> Self {
        self.body.insert("metadata".into(), serde_json::to_value(metadata).unwrap_or(Value::Null));
        self
    }

    /// Starts a secret rotation.
    pub fn secret(mut self, secret: &str) -> Self {
        self.body.insert("secret".into(), secret.into());
        self
    }

    pub fn into_json(self) -> Value {
        Value::Object(self.body)
    }
}

/// Parses and checks a create body. `allow_private` is
/// `webhooks.allow_private_targets`, for a URL that names an address.
pub fn parse_subscription(bytes: &[u8], allow_private: bool) -> Result<NewSubscription, ValidationError> {
    let object = json::parse_object(bytes).map_err(crate::job::body_error)?;
    let required =
        |name: &str| object.get_present(name).ok_or_else(|| invalid(name, format!("{name} is required"), "required"));
    Ok(NewSubscription {
        url: parse_url(required("url")?.get(), allow_private)?,
        events: parse_events(required("events")?.get())?,
        secret: parse_secret(required("secret")?.get())?,
        metadata: match object.get_present("metadata") {
            Some(raw) => parse_metadata(raw.get())?,
            None => "{}".to_string(),
        },
        filter: object.get_present("filter").map(|raw| parse_filter(raw.get())).transpose()?,
        active: object.get_present("active").map(|raw| parse_bool("active", raw.get())).transpose()?.unwrap_or(true),
    })
}

/// Parses and checks a change body: only the fields a create body has;
/// any other is refused.
pub fn parse_subscription_patch(bytes: &[u8], allow_private: bool) -> Result<SubscriptionPatch, ValidationError> {
    let object = json::parse_object(bytes).map_err(crate::job::body_error)?;
    if let Some((name, _)) = object.entries.iter().find(|(name, _)| !PATCH_FIELDS.contains(&name.as_ref())) {
        return Err(invalid(
            name,
            format!("{name} cannot be changed (fields: {})", PATCH_FIELDS.join(", ")),
            "unknown_field",
        ));
    }
    let field = |name: &str| present(&object, name);
    Ok(SubscriptionPatch {
        url: field("url").map(|raw| parse_url(raw, allow_private)).transpose()?,
        events: field("events").map(parse_events).transpose()?,
        secret: field("secret").map(parse_secret).transpose()?,
        metadata: field("metadata").map(parse_metadata).transpose()?,
        filter: field("filter").map(parse_filter).transpose()?,
        active: field("active").map(|raw| parse_bool("active", raw)).transpose()?,
    })
}

/// Parses a body holding only `{secret}` (starting a rotation).
pub fn parse_secret_body(bytes: &[u8]) -> Result<String, ValidationError> {
    let object = json::parse_object(bytes).map_err(crate::job::body_error)?;
    match present(&object, "secret") {
        Some(raw) => parse_secret(raw),
        None => Err(invalid("secret", "secret is required".to_string(), "required")),
    }
}

fn present<'a>(object: &RawObject<'a>, name: &str) -> Option<&'a str> {
    object.get_present(name).map(|raw| raw.get())
}

fn invalid(field: &str, message: String, reason: &'static str) -> ValidationError {
    ValidationError::request(Some(field.to_string()), message).with_reason(reason)
}

fn parse_url(raw: &str, allow_private: bool) -> Result<String, ValidationError> {
    let text: String =
        serde_json::from_str(raw).map_err(|_| invalid("url", "url must be a string".into(), "invalid_url"))?;
    if text.chars().count() > URL_CHARS_MAX {
        return Err(invalid("url", format!("url must be at most {URL_CHARS_MAX} characters"), "invalid_url"));
    }
    let parsed = url::Url::parse(&text)
        .map_err(|_| invalid("url", "url must be an absolute https URL".into(), "invalid_url"))?;
    match parsed.scheme() {
        "https" => {}
        "http" => return Err(invalid("url", "url must use https".into(), "https_required")),
        _ => return Err(invalid("url", "url must be an absolute https URL".into(), "invalid_url")),
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(invalid("url", "url must not carry a user name or password".into(), "invalid_url"));
    }
    if parsed.fragment().is_some() {
        return Err(invalid("url", "url must not have a fragment".into(), "invalid_url"));
    }
    let class = match parsed.host() {
        None => return Err(invalid("url", "url must name a host".into(), "invalid_url")),
        Some(url::Host::Ipv4(address)) => Some(classify(address.into())),
        Some(url::Host::Ipv6(address)) => Some(classify(address.into())),
        Some(url::Host::Domain(name)) if is_localhost(name) => Some(AddressClass::Private),
        // Host names are checked when they are resolved, before each attempt.
        Some(url::Host::Domain(_)) => None,
    };
    if class.is_some_and(|class| !class.allowed(allow_private)) {
        return Err(invalid("url", "url names an address deliveries may not go to".into(), "forbidden_address"));
    }
    Ok(text)
}

/// `localhost` and names under it (RFC 6761) always mean this machine.
pub fn is_localhost(name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

fn parse_events(raw: &str) -> Result<Vec<String>, ValidationError> {
    let patterns: Vec<String> = serde_json::from_str(raw)
        .map_err(|_| invalid("events", "events must be an array of strings".into(), "invalid_pattern"))?;
    if patterns.is_empty() || patterns.len() > EVENT_PATTERNS_MAX {
        return Err(invalid("events", format!("events must list 1 to {EVENT_PATTERNS_MAX} patterns"), "too_many"));
    }
    for (index, pattern) in patterns.iter().enumerate() {
        if !is_valid_pattern(pattern) {
            return Err(invalid(
                &format!("events[{index}]"),
                "an event pattern is an event type, `prefix.*` or `*` (characters a-z, 0-9, _ and .)".into(),
                "invalid_pattern",
            ));
        }
    }
    Ok(patterns)
}

/// An exact type, `prefix.*` or `*`, in `[a-z0-9_.*]`.
fn is_valid_pattern(pattern: &str) -> bool {
    if pattern.is_empty() || pattern.len() > PATTERN_CHARS_MAX {
        return false;
    }
    if !pattern.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'*')) {
        return false;
    }
    let name = match pattern.strip_suffix(".*") {
        Some(prefix) => prefix,
        None if pattern == "*" => return true,
        None => pattern,
    };
    !name.is_empty() && !name.contains('*') && !name.starts_with('.') && !name.ends_with('.') && !name.contains("..")
}

fn parse_secret(raw: &str) -> Result<String, ValidationError> {
    let secret: Option<String> = serde_json::from_str(raw).ok();
    match secret {
        Some(secret) if (SECRET_CHARS_MIN..=SECRET_CHARS_MAX).contains(&secret.chars().count()) => Ok(secret),
        // Never the secret itself in the error.
        _ => Err(invalid(
            "secret",
            format!("secret must be a string of {SECRET_CHARS_MIN} to {SECRET_CHARS_MAX} characters"),
            "invalid_secret",
        )),
    }
}

fn parse_metadata(raw: &str) -> Result<String, ValidationError> {
    let value: Value = serde_json::from_str(raw)
        .map_err(|_| invalid("metadata", "metadata must be an object".into(), "invalid_metadata"))?;
    if !value.is_object() {
        return Err(invalid("metadata", "metadata must be an object".into(), "invalid_metadata"));
    }
    let compact = value.to_string();
    if compact.len() > METADATA_BYTES_MAX {
        return Err(ValidationError::too_large("metadata", METADATA_BYTES_MAX, compact.len()));
    }
    Ok(compact)
}

fn parse_filter(raw: &str) -> Result<SubscriptionFilter, ValidationError> {
    let object = match serde_json::from_str::<Value>(raw) {
        Ok(Value::Object(object)) => object,
        _ => return Err(invalid("filter", "filter must be an object {queues?, job_types?}".into(), "invalid_filter")),
    };
    if let Some(name) = object.keys().find(|name| !["queues", "job_types"].contains(&name.as_str())) {
        return Err(invalid(&format!("filter.{name}"), "filter takes queues and job_types".into(), "invalid_filter"));
    }
    let list = |name: &str, valid: &dyn Fn(&str) -> bool| -> Result<Option<Vec<String>>, ValidationError> {
        let field = format!("filter.{name}");
        match object.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(items)) if !items.is_empty() && items.len() <= FILTER_ITEMS_MAX => items
                .iter()
                .map(|item| match item.as_str() {
                    Some(text) if valid(text) => Ok(text.to_string()),
                    _ => Err(invalid(&field, format!("{field} holds an invalid entry"), "invalid_filter")),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(invalid(
                &field,
                format!("{field} must be an array of 1 to {FILTER_ITEMS_MAX} strings"),
                "invalid_filter",
            )),
        }
    };
    let queues = list("queues", &is_valid_queue)?;
    let job_types = list("job_types", &|text: &str| {
        let name = text.strip_suffix(".*").unwrap_or(text);
        crate::job::is_valid_type(name)
    })?;
    Ok(SubscriptionFilter { queues, job_types })
}

fn parse_bool(field: &str, raw: &str) -> Result<bool, ValidationError> {
    serde_json::from_str(raw).map_err(|_| invalid(field, format!("{field} must be true or false"), "invalid_boolean"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobId;
    use serde_json::json;

    fn create(body: Value) -> Result<NewSubscription, ValidationError> {
        parse_subscription(body.to_string().as_bytes(), false)
    }

    fn base() -> Value {
        json!({"url": "https://hooks.example.com/svc", "events": ["job.*"], "secret": "0123456789abcdef"})
    }

    #[test]
    fn a_create_body_is_checked_field_by_field() {
        let ok = create(base()).unwrap();
        assert!(ok.active && ok.metadata == "{}" && ok.filter.is_none());
        for (change, field, reason) in [
            (json!({"url": "http://hooks.example.com"}), "url", "https_required"),
            (json!({"url": "ftp://hooks.example.com"}), "url", "invalid_url"),
            (json!({"url": "not a url"}), "url", "invalid_url"),
            (json!({"url": "https://user:pw@hooks.example.com"}), "url", "invalid_url"),
            (json!({"url": "https://hooks.example.com/#frag"}), "url", "invalid_url"),
            (json!({"url": "https://127.0.0.1/x"}), "url", "forbidden_address"),
            (json!({"url": "https://[::ffff:169.254.169.254]/"}), "url", "forbidden_address"),
            (json!({"url": "https://localhost:8443/"}), "url", "forbidden_address"),
            (json!({"events": []}), "events", "too_many"),
            (json!({"events": ["Job.Completed"]}), "events[0]", "invalid_pattern"),
            (json!({"events": ["job*"]}), "events[0]", "invalid_pattern"),
            (json!({"events": ["*.completed"]}), "events[0]", "invalid_pattern"),
            (json!({"secret": "short"}), "secret", "invalid_secret"),
            (json!({"metadata": []}), "metadata", "invalid_metadata"),
            (json!({"filter": {"queues": []}}), "filter.queues", "invalid_filter"),
            (json!({"filter": {"other": 1}}), "filter.other", "invalid_filter"),
            (json!({"active": "yes"}), "active", "invalid_boolean"),
        ] {
            let mut body = base();
            for (key, value) in change.as_object().unwrap() {
                body[key] = value.clone();
            }
            let error = create(body).err().unwrap_or_else(|| panic!("{change} accepted"));
            assert_eq!((error.field.as_deref(), error.reason), (Some(field), Some(reason)), "{change}");
            assert!(!error.message.contains("0123456789abcdef"));
        }
        let private = json!({"url": "https://127.0.0.1:8443/x", "events": ["*"], "secret": "0123456789abcdef"});
        assert!(parse_subscription(private.to_string().as_bytes(), true).is_ok(), "allowed when configured");
        let mut missing = base();
        missing.as_object_mut().unwrap().remove("secret");
        assert_eq!(create(missing).err().unwrap().field.as_deref(), Some("secret"));
    }

    #[test]
    fn a_change_body_is_strict() {
        let patch = parse_subscription_patch(br#"{"events":["job.completed"],"active":false}"#, false).unwrap();
        assert_eq!(patch.events.unwrap(), ["job.completed"]);
        assert_eq!(patch.active, Some(false));
        let error = parse_subscription_patch(br#"{"id":"sub_x"}"#, false).err().unwrap();
        assert_eq!(error.reason, Some("unknown_field"));
    }

    #[test]
    fn patterns_and_filters_decide_which_events_are_taken() {
        let mut subscription = Subscription {
            id: SubscriptionId(JobId(1)),
            url: "https://h.example".into(),
            events: vec!["job.*".into(), "cron.triggered".into()],
            secret: "0123456789abcdef".into(),
            rotation: None,
            metadata: "{}".into(),
            filter: None,
            active: true,
            created_at: 0,
            updated_at: 0,
        };
        assert!(subscription.takes("job.completed", Some("q"), Some("t")));
        assert!(!subscription.takes("jobs.pruned", None, None), "job.* is not jobs.*");
        assert!(subscription.takes("cron.triggered", Some("q"), Some("t")));
        subscription.filter =
            Some(SubscriptionFilter { queues: Some(vec!["mail".into()]), job_types: Some(vec!["email.*".into()]) });
        assert!(subscription.takes("job.completed", Some("mail"), Some("email.send")));
        assert!(!subscription.takes("job.completed", Some("other"), Some("email.send")));
        assert!(!subscription.takes("job.completed", Some("mail"), Some("sms.send")));
        subscription.active = false;
        assert!(!subscription.takes("job.completed", Some("mail"), Some("email.send")));
    }

    #[test]
    fn a_rotation_ends_by_itself_when_its_grace_runs_out() {
        let subscription = Subscription {
            id: SubscriptionId(JobId(1)),
            url: "https://h.example".into(),
            events: vec!["*".into()],
            secret: "old-secret-0123456".into(),
            rotation: Some(Rotation { next_secret: "new-secret-0123456".into(), started_at: 0, expires_at: 100 }),
            metadata: "{}".into(),
            filter: None,
            active: true,
            created_at: 0,
            updated_at: 0,
        };
        assert_eq!(subscription.settled(99).secret, "old-secret-0123456");
        for now in [99, 100] {
            let settled = subscription.settled(now);
            let expected = (settled.secret.as_str(), settled.rotation.as_ref().map(|r| r.next_secret.as_str()));
            assert_eq!(subscription.signing_secrets(now), expected, "at {now}");
            assert_eq!(settled.signing_secrets(now), expected, "settled twice at {now}");
        }
        assert_eq!(subscription.signing_secrets(99), ("old-secret-0123456", Some("new-secret-0123456")));
        let ended = subscription.settled(100);
        assert_eq!((ended.secret.as_str(), ended.rotation.is_none()), ("new-secret-0123456", true));
        assert!(!format!("{subscription:?}").contains("secret-0123456"), "Debug never shows a secret");
    }
}
