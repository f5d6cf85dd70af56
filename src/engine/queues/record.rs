//! The log record of a queue paused or resumed.

use serde::{Deserialize, Serialize};

use crate::clock::Millis;

/// A queue paused (new work refused, fetches skip it) or resumed. Encoded
/// as the struct variant it replaced, field for field (record 18).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuePause {
    pub at: Millis,
    pub queue: String,
    pub paused: bool,
}
