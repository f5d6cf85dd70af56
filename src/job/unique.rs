//! The unique job policy (`options.unique`): strict validation, rendering,
//! and the fingerprint that identifies duplicates of a job.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::fmt;

use super::JobState;
use super::error::ValidationError;
use super::json::{parse_raw_object, push_ascii, push_json_string, raw_elements_at_most, string_value};
use super::time::{parse_duration_ms, push_duration_ms};

/// Most names in a unique policy's `key`.
pub const UNIQUE_KEY_NAMES_MAX: usize = 32;
/// Longest name in a unique policy's `key`, in characters.
pub const UNIQUE_KEY_NAME_CHARS_MAX: usize = 255;

const FIELDS: [&str; 4] = ["key", "period", "on_conflict", "states"];

/// What an enqueue does when a job with the same fingerprint is held in a covered state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum OnConflict {
    /// Refuse the new job.
    Reject,
    /// Take the new job in place of the one held.
    Replace,
    /// Answer with the job held and store nothing.
    Ignore,
}

impl OnConflict {
    pub fn as_str(self) -> &'static str {
        match self {
            OnConflict::Reject => "reject",
            OnConflict::Replace => "replace",
            OnConflict::Ignore => "ignore",
        }
    }
}

/// The effective unique policy of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UniquePolicy {
    /// Names that select the parts of `args` the fingerprint covers; `None`
    /// covers the whole `args` array.
    pub key: Option<Vec<String>>,
    /// How long after enqueue a job still blocks its duplicates; `None` for no limit.
    pub period_ms: Option<u64>,
    pub on_conflict: OnConflict,
    /// Bit i set = `JobState::ALL[i]` is covered.
    pub states: u8,
}

impl Default for UniquePolicy {
    fn default() -> Self {
        Self { key: None, period_ms: None, on_conflict: OnConflict::Reject, states: non_terminal_states() }
    }
}

/// The fingerprint of a unique job: SHA-256 of its canonical identity.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct UniqueKey(pub [u8; 32]);

impl fmt::Display for UniqueKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut text = [0u8; 64];
        for (pair, byte) in text.chunks_exact_mut(2).zip(self.0) {
            pair[0] = HEX[usize::from(byte >> 4)];
            pair[1] = HEX[usize::from(byte & 0xf)];
        }
        f.write_str(std::str::from_utf8(&text).expect("hex digits are ASCII"))
    }
}

impl UniquePolicy {
    /// Validates a client policy object; `path` names it in error messages
    /// (e.g. `options.unique`). Absent fields take their defaults.
    pub fn parse(raw: &RawValue, path: &str) -> Result<UniquePolicy, ValidationError> {
        let Some(object) = parse_raw_object(raw) else {
            return Err(ValidationError::payload(path, format!("{path} must be an object")));
        };
        if let Some((unknown, _)) = object.entries.iter().find(|(key, _)| !FIELDS.contains(&key.as_ref())) {
            return Err(ValidationError::payload(
                format!("{path}.{unknown}"),
                format!("{path}.{unknown} is not a unique policy field; allowed: {}", FIELDS.join(", ")),
            ));
        }
        let [key, period, on_conflict, states] = object.get_present_many(&FIELDS);
        let at = |name: &str| format!("{path}.{name}");
        let mut policy = UniquePolicy::default();
        if let Some(raw) = key {
            policy.key = Some(key_names(raw, &at("key"))?);
        }
        if let Some(raw) = period {
            policy.period_ms = Some(period_ms(raw, &at("period"))?);
        }
        if let Some(raw) = on_conflict {
            policy.on_conflict = match string_value(raw).as_deref() {
                Some("reject") => OnConflict::Reject,
                Some("replace") => OnConflict::Replace,
                Some("ignore") => OnConflict::Ignore,
                _ => {
                    let path = at("on_conflict");
                    return Err(ValidationError::payload(
                        &path,
                        format!("{path} must be \"reject\", \"replace\" or \"ignore\""),
                    ));
                }
            };
        }
        if let Some(raw) = states {
            policy.states = state_set(raw, &at("states"))?;
        }
        Ok(policy)
    }

    /// Whether a job held in `state` blocks a duplicate.
    pub fn covers(&self, state: JobState) -> bool {
        self.states & state_bit(state) != 0
    }

    /// Whether `holder` (a job with the same fingerprint) blocks a new job
    /// under this policy at `now`: in a covered state, and enqueued within
    /// the period, if there is one.
    pub fn blocked_by(&self, holder: &super::Job, now: crate::clock::Millis) -> bool {
        self.covers(holder.state)
            && self.period_ms.is_none_or(|period| holder.created_at.saturating_add(period as i64) > now)
    }

    /// Appends the effective policy as compact JSON; `key` and `period` only when set.
    pub fn push_json(&self, out: &mut String) {
        out.push('{');
        if let Some(key) = &self.key {
            out.push_str("\"key\":");
            push_string_array(out, key.iter().map(String::as_str));
            out.push(',');
        }
        if let Some(period_ms) = self.period_ms {
            out.push_str("\"period\":\"");
            // Parsed periods are at most 365 days, far inside i64.
            push_duration_ms(out, i64::try_from(period_ms).unwrap_or(i64::MAX));
            out.push_str("\",");
        }
        out.push_str("\"on_conflict\":\"");
        out.push_str(self.on_conflict.as_str());
        out.push_str("\",\"states\":");
        push_string_array(out, JobState::ALL.into_iter().filter(|state| self.covers(*state)).map(JobState::as_str));
        out.push('}');
    }

    /// The fingerprint of a job of `job_type` whose `args` array has the
    /// compact JSON text `args_json`: SHA-256 of the canonical JSON (object
    /// keys sorted at every level, compact) of `{"args": <selected>, "type": <job_type>}`.
    ///
    /// Without `key` the selected value is the whole array. With it, it is an
    /// object mapping each name to the value of that property in the first
    /// object element of args that has it; else, for a decimal index within
    /// bounds, to that element; else to `null`.
    pub fn fingerprint(&self, job_type: &str, args_json: &str) -> UniqueKey {
        // The caller validated args; anything unreadable still gets a stable
        // fingerprint of its own, as a string.
        let args = serde_json::from_str::<Value>(args_json).unwrap_or_else(|_| Value::String(args_json.to_string()));
        let mut canonical = String::with_capacity(args_json.len() + job_type.len() + 32);
        canonical.push_str("{\"args\":");
        match &self.key {
            None => push_canonical(&mut canonical, &args),
            Some(names) => push_selection(&mut canonical, names, &args),
        }
        canonical.push_str(",\"type\":");
        push_json_string(&mut canonical, job_type);
        canonical.push('}');
        UniqueKey(Sha256::digest(canonical.as_bytes()).into())
    }
}

fn state_bit(state: JobState) -> u8 {
    1 << state.index()
}

/// The states a unique policy may cover (and covers by default): every non-terminal one.
fn non_terminal_states() -> u8 {
    JobState::ALL.into_iter().filter(|state| !state.is_terminal()).fold(0, |bits, state| bits | state_bit(state))
}

fn key_names(raw: &RawValue, path: &str) -> Result<Vec<String>, ValidationError> {
    let elements = match raw_elements_at_most(raw, UNIQUE_KEY_NAMES_MAX) {
        Some(Ok(elements)) => elements,
        Some(Err(count)) => {
            return Err(ValidationError::payload(
                path,
                format!("{path} has {count} names, more than the limit of {UNIQUE_KEY_NAMES_MAX}"),
            ));
        }
        None => return Err(ValidationError::payload(path, format!("{path} must be an array of strings"))),
    };
    elements
        .into_iter()
        .map(|element| {
            string_value(element)
                .filter(|name| !name.is_empty() && name.chars().count() <= UNIQUE_KEY_NAME_CHARS_MAX)
                .map(Cow::into_owned)
                .ok_or_else(|| {
                    ValidationError::payload(
                        path,
                        format!("{path} must hold strings of 1 to {UNIQUE_KEY_NAME_CHARS_MAX} characters"),
                    )
                })
        })
        .collect()
}

fn period_ms(raw: &RawValue, path: &str) -> Result<u64, ValidationError> {
    let text = string_value(raw).ok_or_else(|| {
        ValidationError::payload(path, format!("{path} must be an ISO 8601 duration string such as \"PT1H\""))
    })?;
    // parse_duration_ms also enforces the bounds: longer than zero, at most 365 days.
    let ms =
        parse_duration_ms(&text).map_err(|message| ValidationError::payload(path, format!("{path}: {message}")))?;
    Ok(ms as u64)
}

fn state_set(raw: &RawValue, path: &str) -> Result<u8, ValidationError> {
    let allowed = || {
        let names: Vec<&str> =
            JobState::ALL.into_iter().filter(|state| !state.is_terminal()).map(JobState::as_str).collect();
        names.join(", ")
    };
    let invalid = || ValidationError::payload(path, format!("{path} must be a non-empty array of: {}", allowed()));
    let elements = raw_elements_at_most(raw, usize::MAX).and_then(Result::ok).ok_or_else(invalid)?;
    if elements.is_empty() {
        return Err(invalid());
    }
    let mut bits = 0;
    for element in elements {
        let name = string_value(element).ok_or_else(invalid)?;
        let state = JobState::ALL.into_iter().find(|state| state.as_str() == name).ok_or_else(invalid)?;
        if state.is_terminal() {
            return Err(ValidationError::payload(
                path,
                format!("{path} cannot hold the terminal state \"{}\"; allowed: {}", state.as_str(), allowed()),
            ));
        }
        // Repeated states collapse into one bit.
        bits |= state_bit(state);
    }
    Ok(bits)
}

fn push_string_array<'a>(out: &mut String, items: impl Iterator<Item = &'a str>) {
    out.push('[');
    for (index, item) in items.enumerate() {
        if index > 0 {
            out.push(',');
        }
        push_json_string(out, item);
    }
    out.push(']');
}

/// The object `{name: value}` a policy's `key` selects from `args`, canonical.
fn push_selection(out: &mut String, names: &[String], args: &Value) {
    static NULL: Value = Value::Null;
    let elements = args.as_array().map_or(&[][..], Vec::as_slice);
    let mut selected: Vec<(&str, &Value)> = names
        .iter()
        .map(|name| {
            let property = elements.iter().filter_map(Value::as_object).find_map(|object| object.get(name));
            // Digits only: `parse` would also take a leading `+`.
            let by_index = || {
                let index = name.parse::<usize>().ok().filter(|_| name.bytes().all(|byte| byte.is_ascii_digit()))?;
                elements.get(index)
            };
            (name.as_str(), property.or_else(by_index).unwrap_or(&NULL))
        })
        .collect();
    // A repeated name selects the same value each time: keep one.
    selected.sort_unstable_by(|a, b| a.0.cmp(b.0));
    selected.dedup_by(|a, b| a.0 == b.0);
    push_canonical_entries(out, selected.into_iter());
}

/// Appends `value` as canonical JSON: compact, object keys sorted by code
/// point at every level, numbers and strings as serde_json reads them (so
/// `"\u00e9"` and `"é"` are one string, `1.50` and `1.5` one number).
fn push_canonical(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(number) => push_ascii(out, number.to_string().as_bytes()),
        Value::String(text) => push_json_string(out, text),
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                push_canonical(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            // The map keeps insertion order (preserve_order): sort here.
            let mut entries: Vec<(&str, &Value)> = map.iter().map(|(key, value)| (key.as_str(), value)).collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            push_canonical_entries(out, entries.into_iter());
        }
    }
}

/// Appends an object from entries already sorted by key.
fn push_canonical_entries<'a>(out: &mut String, entries: impl Iterator<Item = (&'a str, &'a Value)>) {
    out.push('{');
    for (index, (key, value)) in entries.enumerate() {
        if index > 0 {
            out.push(',');
        }
        push_json_string(out, key);
        out.push(':');
        push_canonical(out, value);
    }
    out.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(value: Value) -> Box<RawValue> {
        serde_json::value::to_raw_value(&value).unwrap()
    }

    fn parse(value: Value) -> Result<UniquePolicy, ValidationError> {
        UniquePolicy::parse(&raw(value), "options.unique")
    }

    fn policy_with_key(names: &[&str]) -> UniquePolicy {
        UniquePolicy { key: Some(names.iter().map(|name| name.to_string()).collect()), ..UniquePolicy::default() }
    }

    fn rendered(policy: &UniquePolicy) -> String {
        let mut out = String::new();
        policy.push_json(&mut out);
        out
    }

    #[test]
    fn an_empty_object_takes_the_defaults() {
        let policy = parse(json!({})).unwrap();
        assert_eq!(policy, UniquePolicy::default());
        assert_eq!(policy.key, None);
        assert_eq!(policy.period_ms, None);
        assert_eq!(policy.on_conflict, OnConflict::Reject);
        for state in JobState::ALL {
            assert_eq!(policy.covers(state), !state.is_terminal(), "{state:?}");
        }
        // null counts as absent, as for every other option.
        assert_eq!(parse(json!({"key": null, "period": null, "states": null})).unwrap(), UniquePolicy::default());
    }

    #[test]
    fn every_field_is_read() {
        let policy = parse(json!({
            "key": ["to", "0"],
            "period": "PT1H",
            "on_conflict": "replace",
            "states": ["available", "scheduled", "available"],
        }))
        .unwrap();
        assert_eq!(policy.key, Some(vec!["to".to_string(), "0".to_string()]));
        assert_eq!(policy.period_ms, Some(3_600_000));
        assert_eq!(policy.on_conflict, OnConflict::Replace);
        let covered: Vec<_> = JobState::ALL.into_iter().filter(|state| policy.covers(*state)).collect();
        assert_eq!(covered, [JobState::Scheduled, JobState::Available]);
        assert_eq!(parse(json!({"on_conflict": "ignore"})).unwrap().on_conflict, OnConflict::Ignore);
        assert_eq!(parse(json!({"key": []})).unwrap().key, Some(Vec::new()));
        assert_eq!(parse(json!({"period": "P365D"})).unwrap().period_ms, Some(365 * 86_400_000));
    }

    #[test]
    fn strict_validation_names_the_field() {
        let long_name = "n".repeat(UNIQUE_KEY_NAME_CHARS_MAX + 1);
        let many_names: Vec<String> = (0..=UNIQUE_KEY_NAMES_MAX).map(|index| index.to_string()).collect();
        let cases = [
            (json!({"keys": ["to"]}), "options.unique.keys"),
            (json!({"states": ["completed"]}), "options.unique.states"),
            (json!({"states": ["available", "cancelled"]}), "options.unique.states"),
            (json!({"states": ["discarded"]}), "options.unique.states"),
            (json!({"states": []}), "options.unique.states"),
            (json!({"states": ["waiting"]}), "options.unique.states"),
            (json!({"states": "available"}), "options.unique.states"),
            (json!({"states": [1]}), "options.unique.states"),
            (json!({"on_conflict": "overwrite"}), "options.unique.on_conflict"),
            (json!({"on_conflict": true}), "options.unique.on_conflict"),
            (json!({"period": "PT0S"}), "options.unique.period"),
            (json!({"period": "P366D"}), "options.unique.period"),
            (json!({"period": "an hour"}), "options.unique.period"),
            (json!({"period": "P1M"}), "options.unique.period"),
            (json!({"period": 3600}), "options.unique.period"),
            (json!({"key": [long_name]}), "options.unique.key"),
            (json!({"key": many_names}), "options.unique.key"),
            (json!({"key": [""]}), "options.unique.key"),
            (json!({"key": ["to", 1]}), "options.unique.key"),
            (json!({"key": "to"}), "options.unique.key"),
        ];
        for (object, field) in cases {
            let error = parse(object.clone()).unwrap_err();
            assert_eq!(error.field.as_deref(), Some(field), "{object}");
            assert!(error.message.starts_with(field), "{object}: {}", error.message);
        }
    }

    #[test]
    fn error_messages_say_what_is_allowed() {
        let unknown = parse(json!({"keys": ["to"]})).unwrap_err();
        assert_eq!(
            unknown.message,
            "options.unique.keys is not a unique policy field; allowed: key, period, on_conflict, states"
        );
        let terminal = parse(json!({"states": ["completed"]})).unwrap_err();
        assert_eq!(
            terminal.message,
            "options.unique.states cannot hold the terminal state \"completed\"; \
             allowed: scheduled, available, pending, active, retryable"
        );
        let long = parse(json!({"period": "P366D"})).unwrap_err();
        assert!(long.message.contains("365 days"), "{}", long.message);
    }

    #[test]
    fn the_policy_must_be_an_object() {
        for value in [json!(["to"]), json!("to"), json!(1), json!(true)] {
            let error = parse(value.clone()).unwrap_err();
            assert_eq!(error.field.as_deref(), Some("options.unique"), "{value}");
            assert_eq!(error.message, "options.unique must be an object");
        }
    }

    #[test]
    fn reordered_object_keys_fingerprint_equally() {
        let policy = UniquePolicy::default();
        let a = policy.fingerprint("email.send", r#"[{"b":1,"a":{"y":[1,{"q":2,"p":3}],"x":"é"}}]"#);
        let b = policy.fingerprint("email.send", r#"[{"a":{"x":"\u00e9","y":[1,{"p":3,"q":2}]},"b":1}]"#);
        assert_eq!(a, b);
    }

    #[test]
    fn type_and_args_are_part_of_the_fingerprint() {
        let policy = UniquePolicy::default();
        let base = policy.fingerprint("email.send", r#"["a@example.com"]"#);
        assert_ne!(base, policy.fingerprint("email.resend", r#"["a@example.com"]"#));
        assert_ne!(base, policy.fingerprint("email.send", r#"["b@example.com"]"#));
        assert_ne!(base, policy.fingerprint("email.send", r#"["a@example.com",1]"#));
        // Array order matters, unlike object key order.
        let pair = policy.fingerprint("t", "[1,2]");
        assert_ne!(pair, policy.fingerprint("t", "[2,1]"));
        // The period, the conflict handling and the states do not change the identity.
        let other = UniquePolicy { period_ms: Some(1000), on_conflict: OnConflict::Ignore, states: 1, key: None };
        assert_eq!(base, other.fingerprint("email.send", r#"["a@example.com"]"#));
    }

    #[test]
    fn the_fingerprint_is_sha256_of_the_canonical_json() {
        let key = UniquePolicy::default().fingerprint("t", r#"[{"b":1,"a":2}]"#);
        let expected: [u8; 32] = Sha256::digest(br#"{"args":[{"a":2,"b":1}],"type":"t"}"#).into();
        assert_eq!(key, UniqueKey(expected));
    }

    #[test]
    fn a_key_selects_named_properties() {
        let policy = policy_with_key(&["to"]);
        let a = policy.fingerprint("email.send", r#"[{"to":"a@example.com","body":"hello"}]"#);
        let b = policy.fingerprint("email.send", r#"[{"body":"bye","to":"a@example.com"},7]"#);
        assert_eq!(a, b);
        assert_ne!(a, policy.fingerprint("email.send", r#"[{"to":"b@example.com","body":"hello"}]"#));
        // The first object element that has the property wins.
        let later = policy.fingerprint("email.send", r#"[{"x":1},{"to":"a@example.com"},{"to":"c@example.com"}]"#);
        assert_eq!(a, later);
        // A repeated name selects the same as one.
        assert_eq!(a, policy_with_key(&["to", "to"]).fingerprint("email.send", r#"[{"to":"a@example.com"}]"#));
    }

    #[test]
    fn a_decimal_key_name_selects_by_index() {
        let policy = policy_with_key(&["0"]);
        let a = policy.fingerprint("t", r#"["a@example.com","hello"]"#);
        assert_eq!(a, policy.fingerprint("t", r#"["a@example.com","bye"]"#));
        assert_ne!(a, policy.fingerprint("t", r#"["b@example.com","hello"]"#));
        // A property of that name comes before the index.
        let named = policy.fingerprint("t", r#"["x",{"0":"a@example.com"}]"#);
        assert_eq!(a, named);
        // Out of bounds, or not purely digits, selects null.
        let missing = policy_with_key(&["5"]).fingerprint("t", r#"["a"]"#);
        assert_eq!(missing, policy_with_key(&["5"]).fingerprint("t", r#"["b"]"#));
        let signed = policy_with_key(&["+0"]).fingerprint("t", r#"["a"]"#);
        assert_eq!(signed, policy_with_key(&["+0"]).fingerprint("t", r#"["b"]"#));
    }

    #[test]
    fn a_missing_name_selects_null() {
        let policy = policy_with_key(&["to"]);
        let missing = policy.fingerprint("t", r#"[{"body":"hello"}]"#);
        assert_ne!(missing, policy.fingerprint("t", r#"[{"to":"a@example.com"}]"#));
        // Missing and an explicit null are the same selection.
        assert_eq!(missing, policy.fingerprint("t", r#"[{"to":null}]"#));
        assert_eq!(missing, policy.fingerprint("t", "[]"));
    }

    #[test]
    fn an_empty_key_identifies_by_type_only() {
        let policy = policy_with_key(&[]);
        let a = policy.fingerprint("report.build", r#"[1,{"a":2}]"#);
        assert_eq!(a, policy.fingerprint("report.build", r#"["other"]"#));
        assert_eq!(a, policy.fingerprint("report.build", "[]"));
        assert_ne!(a, policy.fingerprint("report.send", "[]"));
    }

    #[test]
    fn keys_render_as_64_lowercase_hex_digits() {
        let text = UniquePolicy::default().fingerprint("t", "[]").to_string();
        assert_eq!(text.len(), 64);
        assert!(text.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f')), "{text}");
        let mut bytes = [0u8; 32];
        bytes[0] = 0xab;
        bytes[31] = 0x01;
        assert_eq!(UniqueKey(bytes).to_string(), format!("ab{}01", "0".repeat(60)));
    }

    #[test]
    fn policies_render_as_compact_json() {
        assert_eq!(
            rendered(&UniquePolicy::default()),
            r#"{"on_conflict":"reject","states":["scheduled","available","pending","active","retryable"]}"#
        );
        let full = parse(json!({
            "key": ["to", "a\"b"],
            "period": "PT1H",
            "on_conflict": "ignore",
            "states": ["active", "available"],
        }))
        .unwrap();
        assert_eq!(
            rendered(&full),
            r#"{"key":["to","a\"b"],"period":"PT1H","on_conflict":"ignore","states":["available","active"]}"#
        );
        // What is rendered parses back to the same policy.
        let text = rendered(&full);
        assert_eq!(UniquePolicy::parse(&RawValue::from_string(text).unwrap(), "unique").unwrap(), full);
    }

    #[test]
    fn policies_round_trip_through_postcard() {
        let policy = parse(json!({"key": ["to"], "period": "PT5M", "states": ["active"]})).unwrap();
        let bytes = postcard::to_stdvec(&policy).unwrap();
        assert_eq!(postcard::from_bytes::<UniquePolicy>(&bytes).unwrap(), policy);
        let key = policy.fingerprint("t", "[]");
        assert_eq!(postcard::from_bytes::<UniqueKey>(&postcard::to_stdvec(&key).unwrap()).unwrap(), key);
    }
}
