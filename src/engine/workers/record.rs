//! The log records of the worker registry.

use serde::{Deserialize, Serialize};

use super::entry::WorkerSignal;

/// An operator's signal to a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerSignalGiven {
    pub worker_id: String,
    pub signal: WorkerSignal,
}

/// A worker's entry and signal forgotten; its jobs are untouched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerForgotten {
    pub worker_id: String,
}

/// A change of the worker registry. The variant order is part of the log format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerRecord {
    Signal(WorkerSignalGiven),
    Forget(WorkerForgotten),
}

impl WorkerRecord {
    /// The record's name, as `svc inspect` counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            WorkerRecord::Signal(_) => "worker_signal",
            WorkerRecord::Forget(_) => "worker_forget",
        }
    }
}
