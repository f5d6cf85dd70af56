//! The engine's cron table: registered entries as stored, waiting in an
//! ordered set by `next_run_at` so that a turn touches only the entries that
//! are due, however many are registered; and the decided firing a record
//! carries. The decisions that change the table are in `mod.rs`.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::super::table::{Changes, Table};
use crate::clock::Millis;
use crate::cron::{CronDefinition, CronSchedule};
use crate::job::{Job, JobId};

/// A registered cron entry as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CronEntry {
    pub definition: Arc<CronDefinition>,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// Raised by every registration change; `PATCH` checks it to detect a concurrent change.
    pub revision: u64,
    pub run_count: u64,
    /// The nominal time of the last firing.
    pub last_run_at: Option<Millis>,
    pub last_job_id: Option<JobId>,
    /// `None` while disabled or when the expression never fires again.
    pub next_run_at: Option<Millis>,
}

/// How a registration reaches the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CronWrite {
    /// `POST`: create, or replace an entry of the same name.
    Upsert,
    /// `PATCH`: the entry must exist at this revision.
    Patch { revision: u64 },
}

/// What one evaluation of a due entry did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum CronOutcome {
    /// A job was created (`available`, or `pending` behind `waits_for`);
    /// `cancelled` is the previous run cancelled by `cancel_previous`.
    Enqueued { job: Arc<Job>, cancelled: Option<JobId>, waits_for: Option<JobId>, replaced: Vec<JobId> },
    /// The previous run is still going and the policy said skip.
    Skipped { existing: JobId },
    /// The target queue is paused: nothing was created (not a missed run;
    /// it is never caught up).
    QueuePaused,
    /// The job's unique policy (`reject` or `ignore`) met a held job with
    /// the same key: nothing was created.
    Duplicate { existing: JobId },
    /// The entry names a schema that is no longer registered: nothing was created.
    SchemaNotRegistered,
}

/// One evaluation of a due entry, fully decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CronFire {
    /// The nominal time fired (the latest missed one after downtime).
    pub scheduled: Millis,
    /// Occurrences missed before `scheduled` (downtime or a clock jump).
    pub missed: u32,
    /// A local time skipped by a daylight-saving gap before the next run.
    pub skipped_gap: Option<Millis>,
    pub next_run_at: Option<Millis>,
    pub outcome: CronOutcome,
}

/// The engine's cron entries and their due order.
#[derive(Debug, Clone, Default)]
pub struct CronTable {
    entries: Table<String, CronEntry>,
    schedules: HashMap<String, CronSchedule>,
    due: BTreeSet<(Millis, String)>,
    /// A run that waits (`pending`, policy `enqueue`) for the previous one to end: previous → waiting.
    pub(crate) waiters: BTreeMap<JobId, JobId>,
}

impl CronTable {
    pub fn get(&self, name: &str) -> Option<&Arc<CronEntry>> {
        self.entries.get(name)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> impl Iterator<Item = &Arc<CronEntry>> {
        self.entries.values()
    }

    pub fn schedule(&self, name: &str) -> Option<&CronSchedule> {
        self.schedules.get(name)
    }

    /// The earliest `next_run_at` of all entries.
    pub fn next_due(&self) -> Option<Millis> {
        self.due.first().map(|(at, _)| *at)
    }

    /// Names of entries due at `now`, earliest first, at most `max`.
    pub fn due(&self, now: Millis, max: usize) -> Vec<String> {
        self.due.iter().take_while(|(at, _)| *at <= now).take(max).map(|(_, name)| name.clone()).collect()
    }

    /// Entries changed since the last call, as they are now.
    pub(crate) fn take_changes(&mut self) -> Changes<String, CronEntry> {
        self.entries.take_changes()
    }

    /// Stores an entry (replacing one of the same name); an entry whose
    /// schedule does not compile is refused with the reason.
    pub(crate) fn put(&mut self, entry: CronEntry) -> Result<(), String> {
        let name = entry.definition.name.clone();
        let schedule =
            entry.definition.compile().map_err(|problem| format!("cron entry {name} does not compile: {problem}"))?;
        self.remove(&name);
        if let Some(at) = entry.next_run_at {
            self.due.insert((at, name.clone()));
        }
        self.schedules.insert(name.clone(), schedule);
        self.entries.insert(name, Arc::new(entry));
        Ok(())
    }

    pub(crate) fn remove(&mut self, name: &str) -> Option<Arc<CronEntry>> {
        let entry = self.entries.remove(name)?;
        if let Some(at) = entry.next_run_at {
            self.due.remove(&(at, name.to_string()));
        }
        self.schedules.remove(name);
        Some(entry)
    }

    /// Checks that the due order matches the entries.
    pub fn check_invariants(&self) -> Result<(), String> {
        let scheduled = self.entries.values().filter(|entry| entry.next_run_at.is_some()).count();
        if scheduled != self.due.len() {
            return Err(format!("{} due entries for {scheduled} scheduled cron entries", self.due.len()));
        }
        for entry in self.entries.values() {
            let name = &entry.definition.name;
            if let Some(at) = entry.next_run_at
                && !self.due.contains(&(at, name.clone()))
            {
                return Err(format!("cron entry {name} due at {at} is not in the due order"));
            }
            if !self.schedules.contains_key(name) {
                return Err(format!("cron entry {name} has no compiled schedule"));
            }
        }
        Ok(())
    }
}
