//! The log records of the cron table. Each is encoded as the struct
//! variant it replaced, field for field (records 14, 15 and 20).

use serde::{Deserialize, Serialize};

use super::table::{CronEntry, CronFire};
use crate::clock::Millis;

/// A cron entry registered or changed, complete with its next run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CronPut {
    pub at: Millis,
    pub entry: CronEntry,
}

/// A cron entry removed; jobs it created are untouched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CronDelete {
    pub at: Millis,
    pub name: String,
}

/// One evaluation of a due cron entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CronFired {
    pub at: Millis,
    pub name: String,
    pub fire: CronFire,
}
