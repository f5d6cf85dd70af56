//! The log records of the worker registry. Each is encoded as the struct
//! variant it replaced, field for field (records 12 and 13).

use serde::{Deserialize, Serialize};

use super::entry::WorkerSignal;
use crate::clock::Millis;

/// An operator's signal to a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerSignalGiven {
    pub at: Millis,
    pub worker_id: String,
    pub signal: WorkerSignal,
}

/// A worker's entry and signal forgotten; its jobs are untouched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerForgotten {
    pub at: Millis,
    pub worker_id: String,
}
