//! The retry policy object: defaults, strict validation, rendering.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use std::sync::Arc;

use super::error::ValidationError;
use super::json::parse_raw_object;
use super::time::{format_duration_ms, parse_duration_ms};
use crate::limits::{BACKOFF_COEFFICIENT_MAX, ERROR_TYPE_CHARS_MAX, NON_RETRYABLE_ERRORS_MAX, RETRY_ATTEMPTS_MAX};

/// What happens to a job whose attempts are used up. Both end in `discarded`
/// and the dead letter listing; they differ in retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Exhaustion {
    Discard,
    DeadLetter,
}

impl Exhaustion {
    pub fn as_str(self) -> &'static str {
        match self {
            Exhaustion::Discard => "discard",
            Exhaustion::DeadLetter => "dead_letter",
        }
    }
}

/// The effective retry policy of a job (docs/api.md, "The retry policy").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub initial_interval_ms: i64,
    pub backoff_coefficient: f64,
    pub max_interval_ms: i64,
    pub jitter: bool,
    pub non_retryable_errors: Vec<String>,
    pub on_exhaustion: Exhaustion,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            initial_interval_ms: 1000,
            backoff_coefficient: 2.0,
            max_interval_ms: 300_000,
            jitter: true,
            non_retryable_errors: Vec::new(),
            on_exhaustion: Exhaustion::Discard,
        }
    }
}

const FIELDS: [&str; 7] = [
    "max_attempts",
    "initial_interval",
    "backoff_coefficient",
    "max_interval",
    "jitter",
    "non_retryable_errors",
    "on_exhaustion",
];

/// Makes equal retry policies of loaded jobs share one allocation again.
/// Live jobs share theirs (the server default, or one per policy a client
/// repeats), but each job read back from a snapshot or the log carries its
/// own copy: about 80 bytes a job after every restart.
#[derive(Debug, Default)]
pub struct SharedPolicies {
    /// The last few distinct policies seen; a server sees few.
    recent: Vec<Arc<RetryPolicy>>,
}

const SHARED_POLICIES_MAX: usize = 16;

impl SharedPolicies {
    /// Points `policy` at an equal one seen before, or remembers it.
    pub fn share(&mut self, policy: &mut Arc<RetryPolicy>) {
        if let Some(known) = self.recent.iter().find(|known| Arc::ptr_eq(known, policy) || ***known == **policy) {
            *policy = known.clone();
            return;
        }
        if self.recent.len() == SHARED_POLICIES_MAX {
            self.recent.remove(0);
        }
        self.recent.push(policy.clone());
    }
}

impl RetryPolicy {
    /// Merges a client policy object field by field over `base`. `path` names
    /// the object in error messages (e.g. `options.retry`).
    pub fn merged(base: &RetryPolicy, raw: &RawValue, path: &str) -> Result<RetryPolicy, ValidationError> {
        let Some(object) = parse_raw_object(raw) else {
            return Err(ValidationError::payload(path, format!("{path} must be an object")));
        };
        if let Some((unknown, _)) = object.entries.iter().find(|(key, _)| !FIELDS.contains(&key.as_ref())) {
            return Err(ValidationError::payload(
                format!("{path}.{unknown}"),
                format!("{path}.{unknown} is not a retry policy field; allowed: {}", FIELDS.join(", ")),
            ));
        }
        let field = |name: &str| object.get_present(name).map(RawValue::get);
        let at = |name: &str| format!("{path}.{name}");
        let mut policy = base.clone();
        if let Some(text) = field("max_attempts") {
            // Integers only: "2.5" and "1e2" do not parse as i64.
            let attempts = serde_json::from_str::<i64>(text).ok().filter(|n| (0..=RETRY_ATTEMPTS_MAX).contains(n));
            policy.max_attempts = attempts.ok_or_else(|| {
                ValidationError::payload(
                    at("max_attempts"),
                    format!("{} must be an integer from 0 to {RETRY_ATTEMPTS_MAX}", at("max_attempts")),
                )
            })? as u32;
        }
        let initial_given = field("initial_interval").is_some();
        if let Some(text) = field("initial_interval") {
            policy.initial_interval_ms = duration_field(text, || at("initial_interval"))?;
        }
        if let Some(text) = field("backoff_coefficient") {
            let coefficient =
                serde_json::from_str::<f64>(text).ok().filter(|c| (1.0..=BACKOFF_COEFFICIENT_MAX).contains(c));
            policy.backoff_coefficient = coefficient.ok_or_else(|| {
                ValidationError::payload(
                    at("backoff_coefficient"),
                    format!("{} must be a number from 1.0 to {BACKOFF_COEFFICIENT_MAX}", at("backoff_coefficient")),
                )
            })?;
        }
        match field("max_interval") {
            Some(text) => {
                policy.max_interval_ms = duration_field(text, || at("max_interval"))?;
                if policy.max_interval_ms < policy.initial_interval_ms {
                    return Err(ValidationError::payload(
                        at("max_interval"),
                        format!("{} must not be shorter than initial_interval", at("max_interval")),
                    ));
                }
            }
            None if initial_given => policy.max_interval_ms = policy.max_interval_ms.max(policy.initial_interval_ms),
            None => {}
        }
        if let Some(text) = field("jitter") {
            policy.jitter = serde_json::from_str::<bool>(text)
                .map_err(|_| ValidationError::payload(at("jitter"), format!("{} must be a boolean", at("jitter"))))?;
        }
        if let Some(text) = field("non_retryable_errors") {
            policy.non_retryable_errors = error_list(text, &at("non_retryable_errors"))?;
        }
        if let Some(text) = field("on_exhaustion") {
            policy.on_exhaustion = match serde_json::from_str::<String>(text).as_deref() {
                Ok("discard") => Exhaustion::Discard,
                Ok("dead_letter") => Exhaustion::DeadLetter,
                _ => {
                    return Err(ValidationError::payload(
                        at("on_exhaustion"),
                        format!("{} must be \"discard\" or \"dead_letter\"", at("on_exhaustion")),
                    ));
                }
            };
        }
        Ok(policy)
    }

    /// `merged` for a policy given as a JSON value (configuration).
    pub fn merged_value(base: &RetryPolicy, value: &Value, path: &str) -> Result<RetryPolicy, ValidationError> {
        let raw = serde_json::value::to_raw_value(value)
            .map_err(|_| ValidationError::payload(path, format!("{path} must be an object")))?;
        Self::merged(base, &raw, path)
    }

    /// The policy as a JSON object with durations in ISO 8601.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "max_attempts": self.max_attempts,
            "initial_interval": format_duration_ms(self.initial_interval_ms),
            "backoff_coefficient": self.backoff_coefficient,
            "max_interval": format_duration_ms(self.max_interval_ms),
            "jitter": self.jitter,
            "non_retryable_errors": self.non_retryable_errors,
            "on_exhaustion": self.on_exhaustion.as_str(),
        })
    }
}

/// A duration field given as raw JSON; `path` names it, built only for an error.
fn duration_field(raw: &str, path: impl Fn() -> String) -> Result<i64, ValidationError> {
    let text = serde_json::from_str::<String>(raw).map_err(|_| {
        let path = path();
        ValidationError::payload(&path, format!("{path} must be an ISO 8601 duration string such as \"PT1S\""))
    })?;
    parse_duration_ms(&text).map_err(|message| {
        let path = path();
        ValidationError::payload(&path, format!("{path}: {message}"))
    })
}

fn error_list(raw: &str, path: &str) -> Result<Vec<String>, ValidationError> {
    let value = serde_json::from_str::<Value>(raw).unwrap_or_default();
    let invalid = || {
        ValidationError::payload(
            path,
            format!(
                "{path} must be an array of at most {NON_RETRYABLE_ERRORS_MAX} strings of 1 to {ERROR_TYPE_CHARS_MAX} characters"
            ),
        )
    };
    let items = value.as_array().filter(|items| items.len() <= NON_RETRYABLE_ERRORS_MAX).ok_or_else(invalid)?;
    items
        .iter()
        .map(|item| {
            item.as_str()
                .filter(|text| !text.is_empty() && text.chars().count() <= ERROR_TYPE_CHARS_MAX)
                .map(str::to_string)
                .ok_or_else(invalid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn partial_policy_merges_over_defaults() {
        let policy = RetryPolicy::merged_value(
            &RetryPolicy::default(),
            &json!({"max_attempts": 5, "initial_interval": "PT2S"}),
            "retry",
        )
        .unwrap();
        assert_eq!(policy.max_attempts, 5);
        assert_eq!(policy.initial_interval_ms, 2000);
        assert_eq!(policy.max_interval_ms, 300_000);
        assert!(policy.jitter);
    }

    #[test]
    fn max_interval_follows_a_larger_initial_interval() {
        let policy =
            RetryPolicy::merged_value(&RetryPolicy::default(), &json!({"initial_interval": "PT10M"}), "retry").unwrap();
        assert_eq!(policy.max_interval_ms, 600_000);
    }

    #[test]
    fn strict_validation_names_the_field() {
        let cases = [
            (json!({"backoff_strategy": "linear"}), "retry.backoff_strategy"),
            (json!({"max_attempts": -1}), "retry.max_attempts"),
            (json!({"max_attempts": 2.5}), "retry.max_attempts"),
            (json!({"backoff_coefficient": 0.5}), "retry.backoff_coefficient"),
            (json!({"initial_interval": "P1Y"}), "retry.initial_interval"),
            (json!({"initial_interval": "PT10S", "max_interval": "PT1S"}), "retry.max_interval"),
            (json!({"on_exhaustion": "explode"}), "retry.on_exhaustion"),
            (json!({"non_retryable_errors": [""]}), "retry.non_retryable_errors"),
        ];
        for (object, field) in cases {
            let error = RetryPolicy::merged_value(&RetryPolicy::default(), &object, "retry").unwrap_err();
            assert_eq!(error.field.as_deref(), Some(field), "{object}");
        }
    }
}
