//! The log records of queue control (a queue paused or resumed, its
//! backpressure set or removed) and the backpressure they carry.

use serde::{Deserialize, Serialize};

/// A queue paused (new work refused, fetches skip it) or resumed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuePause {
    pub queue: String,
    pub paused: bool,
}

/// A queue's backpressure set (`Some`) or removed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueConfigured {
    pub queue: String,
    pub backpressure: Option<Backpressure>,
}

/// A queue's bound on the jobs it holds waiting (docs/api.md,
/// "Backpressure"). Its depth counts the jobs not yet claimed: `available`,
/// `scheduled`, `retryable` and `pending`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Backpressure {
    /// Most jobs the queue holds waiting; an enqueue past it is refused.
    pub max_depth: u64,
    /// What happens past the bound.
    pub strategy: BackpressureStrategy,
    /// From this fraction of `max_depth` on (0 to 1), accepted enqueues say
    /// how full the queue is.
    pub warning_threshold: Option<f64>,
}

impl Backpressure {
    /// A bound of `max_depth` waiting jobs, refusing past it.
    pub fn reject_above(max_depth: u64) -> Backpressure {
        Backpressure { max_depth, strategy: BackpressureStrategy::Reject, warning_threshold: None }
    }

    /// With a warning from `threshold` of the bound on.
    pub fn warning_at(self, threshold: f64) -> Backpressure {
        Backpressure { warning_threshold: Some(threshold), ..self }
    }

    /// Most waiting jobs a bound may name.
    pub const MAX_DEPTH_MAX: u64 = 1_000_000_000;

    /// Checks the bound as the HTTP API does: `max_depth` from 1 to
    /// [`Backpressure::MAX_DEPTH_MAX`], a threshold above 0 and at most 1.
    pub fn check(&self) -> Result<(), crate::job::ValidationError> {
        use crate::job::ValidationError;
        if !(1..=Self::MAX_DEPTH_MAX).contains(&self.max_depth) {
            let message = format!("max_depth must be an integer from 1 to {}", Self::MAX_DEPTH_MAX);
            return Err(ValidationError::request(Some("backpressure.max_depth".to_string()), message));
        }
        if self.warning_threshold.is_some_and(|threshold| !(threshold > 0.0 && threshold <= 1.0)) {
            let field = Some("backpressure.warning_threshold".to_string());
            return Err(ValidationError::request(field, "warning_threshold must be a number above 0 and at most 1"));
        }
        Ok(())
    }

    /// How full a queue of `depth` waiting jobs is, when that is at or past
    /// the warning threshold.
    pub fn pressure(&self, depth: u64) -> Option<f64> {
        let fraction = depth as f64 / self.max_depth.max(1) as f64;
        self.warning_threshold.filter(|threshold| fraction >= *threshold).map(|_| fraction)
    }
}

/// What a queue with backpressure does with work past its bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum BackpressureStrategy {
    /// Refuse the enqueue (HTTP 429 `queue_full`).
    Reject,
}

impl BackpressureStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            BackpressureStrategy::Reject => "reject",
        }
    }
}

/// A change of a queue's settings. The variant order is part of the log format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum QueueRecord {
    Pause(QueuePause),
    Configure(QueueConfigured),
}

impl QueueRecord {
    /// The record's name, as `svc inspect` counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            QueueRecord::Pause(_) => "queue_pause",
            QueueRecord::Configure(_) => "queue_config",
        }
    }
}
