//! Retry delays, and what a failed attempt leads to (docs/api.md, "What a
//! failure leads to").

use crate::clock::Millis;
use crate::job::transition::{FailOutcome, TimeoutKind, timeout_report};
use crate::job::{FailureReport, Job, RetryPolicy};

/// What a failed attempt of `job` leads to: discarded when the report says
/// it is final, when it matches the policy's `non_retryable_errors`, or when
/// the attempts are used up; else retried after the policy's delay.
/// `random_unit` is asked for only when a delay is drawn.
pub fn failure_outcome(
    job: &Job,
    report: &FailureReport,
    now: Millis,
    random_unit: impl FnOnce() -> f64,
) -> FailOutcome {
    if report.retryable == Some(false) || matches_non_retryable(&job.retry.non_retryable_errors, report) {
        return FailOutcome::Discard;
    }
    if job.attempt >= job.max_attempts().max(1) {
        return FailOutcome::Discard;
    }
    let delay_ms = retry_delay_ms(&job.retry, job.attempt.max(1), random_unit());
    FailOutcome::Retry { retry_at: now.saturating_add(delay_ms as i64), delay_ms }
}

/// Which deadline of an active job ran out, and what follows (docs/api.md,
/// "Visibility and execution timeouts"): an execution timeout is a failed
/// attempt like any other; a visibility timeout releases the job while
/// attempts are left, and discards it after the last.
pub fn timeout_outcome(job: &Job, now: Millis, random_unit: impl FnOnce() -> f64) -> (TimeoutKind, FailOutcome) {
    let visibility = job.run().visibility_deadline.unwrap_or(Millis::MAX);
    let execution = job.run().execution_deadline.unwrap_or(Millis::MAX);
    let kind = if execution <= visibility { TimeoutKind::Execution } else { TimeoutKind::Visibility };
    let outcome = match kind {
        TimeoutKind::Execution => failure_outcome(job, &timeout_report(job, kind, now), now, random_unit),
        TimeoutKind::Visibility if job.attempt < job.max_attempts().max(1) => FailOutcome::Release,
        TimeoutKind::Visibility => FailOutcome::Discard,
    };
    (kind, outcome)
}

/// An entry matches a candidate exactly, or as a `prefix.*` pattern.
fn matches_non_retryable(entries: &[String], report: &FailureReport) -> bool {
    let class = report.error_class();
    let candidates = [Some(report.error_type.as_str()), Some(report.code.as_str()), class.as_deref()];
    entries.iter().any(|entry| {
        candidates.iter().flatten().any(|candidate| match entry.strip_suffix('*') {
            Some(prefix) if entry.ends_with(".*") => candidate.starts_with(prefix),
            _ => candidate == entry,
        })
    })
}

/// The delay before the next attempt after claim number `attempt` (≥ 1) failed.
/// `random_unit` is uniform in [0, 1) and is used only when the policy has jitter.
pub fn retry_delay_ms(policy: &RetryPolicy, attempt: u32, random_unit: f64) -> u64 {
    let exponent = attempt.saturating_sub(1).min(1000) as i32;
    let raw = policy.initial_interval_ms as f64 * policy.backoff_coefficient.powi(exponent);
    let cap = policy.max_interval_ms as f64;
    let mut delay = raw.min(cap);
    if policy.jitter {
        delay = (delay * (0.5 + random_unit)).min(cap);
    }
    (delay.round() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_retryable_patterns() {
        let report = FailureReport {
            details: Some(r#"{"error_class":"net.Timeout"}"#.into()),
            ..FailureReport::server("ValidationError", "m")
        };
        assert!(matches_non_retryable(&["ValidationError".into()], &report));
        assert!(matches_non_retryable(&["net.*".into()], &report));
        assert!(!matches_non_retryable(&["Validation".into(), "other.*".into()], &report));
        assert!(!matches_non_retryable(&["validationerror".into()], &report));
    }

    fn policy(initial: i64, coefficient: f64, max: i64, jitter: bool) -> RetryPolicy {
        RetryPolicy {
            initial_interval_ms: initial,
            backoff_coefficient: coefficient,
            max_interval_ms: max,
            jitter,
            ..RetryPolicy::default()
        }
    }

    #[test]
    fn exponential_without_jitter() {
        let policy = policy(1000, 2.0, 300_000, false);
        let delays: Vec<u64> = (1..=4).map(|attempt| retry_delay_ms(&policy, attempt, 0.0)).collect();
        assert_eq!(delays, [1000, 2000, 4000, 8000]);
    }

    #[test]
    fn capped_by_max_interval() {
        let policy = policy(1000, 10.0, 2000, false);
        let delays: Vec<u64> = (1..=3).map(|attempt| retry_delay_ms(&policy, attempt, 0.0)).collect();
        assert_eq!(delays, [1000, 2000, 2000]);
    }

    #[test]
    fn jitter_stays_within_half_and_one_and_a_half() {
        let policy = policy(2000, 2.0, 300_000, true);
        assert_eq!(retry_delay_ms(&policy, 1, 0.0), 1000);
        assert_eq!(retry_delay_ms(&policy, 1, 0.999_999), 3000);
        let capped = self::policy(2000, 2.0, 2500, true);
        assert_eq!(retry_delay_ms(&capped, 1, 0.99), 2500);
    }
}
