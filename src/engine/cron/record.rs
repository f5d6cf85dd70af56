//! The log records of the cron table.

use serde::{Deserialize, Serialize};

use super::table::{CronEntry, CronFire};

/// A cron entry registered or changed, complete with its next run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CronPut {
    pub entry: CronEntry,
}

/// A cron entry removed; jobs it created are untouched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CronDelete {
    pub name: String,
}

/// One evaluation of a due cron entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CronFired {
    pub name: String,
    pub fire: CronFire,
}

/// A change of the cron table. The variant order is part of the log format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CronRecord {
    Put(CronPut),
    Delete(CronDelete),
    Fire(CronFired),
}

impl CronRecord {
    /// The record's name, as `svc inspect` counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            CronRecord::Put(_) => "cron_put",
            CronRecord::Delete(_) => "cron_delete",
            CronRecord::Fire(_) => "cron_fire",
        }
    }
}
