//! Cron entries inside the engine: the table the writer owns, and the
//! decisions that register, delete and fire them (decisions §17).
//!
//! Entries wait in an ordered set by `next_run_at`, so a turn touches only
//! the entries that are due, however many are registered. A firing is one
//! record holding the created job and the entry's new `next_run_at`, so a
//! replayed log never fires a slot twice and never loses a registration.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::command::EngineError;
use super::decide::Entropy;
use super::record::Record;
use super::state::{ApplyError, State};
use crate::clock::Millis;
use crate::cron::{CronDefinition, CronExpr, CronSchedule, OverlapPolicy, parse_timezone};
use crate::job::time::format_timestamp;
use crate::job::{Job, JobId, JobPayload, JobState, NewJob};
use crate::limits::CRON_MISSED_COUNT_MAX;

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
pub enum CronOutcome {
    /// A job was created (`available`, or `pending` behind `waits_for`);
    /// `cancelled` is the previous run cancelled by `cancel_previous`.
    Enqueued { job: Arc<Job>, cancelled: Option<JobId>, waits_for: Option<JobId> },
    /// The previous run is still going and the policy said skip.
    Skipped { existing: JobId },
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
    entries: BTreeMap<String, Arc<CronEntry>>,
    schedules: HashMap<String, CronSchedule>,
    due: BTreeSet<(Millis, String)>,
    /// A run that waits (`pending`, policy `enqueue`) for the previous one to end: previous → waiting.
    pub(crate) waiters: BTreeMap<JobId, JobId>,
    dirty: HashSet<String>,
}

/// Compiles a stored definition's schedule.
pub fn compile(definition: &CronDefinition) -> Result<CronSchedule, String> {
    let expr = CronExpr::parse(&definition.schedule)?;
    let zone = parse_timezone(&definition.timezone)?;
    Ok(CronSchedule::new(expr, zone))
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

    /// Entries changed since the last call.
    pub fn take_dirty(&mut self) -> HashSet<String> {
        std::mem::take(&mut self.dirty)
    }

    pub(crate) fn put(&mut self, entry: CronEntry) -> Result<(), ApplyError> {
        let name = entry.definition.name.clone();
        let schedule = compile(&entry.definition)
            .map_err(|problem| ApplyError(format!("cron entry {name} does not compile: {problem}")))?;
        self.remove(&name);
        if let Some(at) = entry.next_run_at {
            self.due.insert((at, name.clone()));
        }
        self.schedules.insert(name.clone(), schedule);
        self.dirty.insert(name.clone());
        self.entries.insert(name, Arc::new(entry));
        Ok(())
    }

    pub(crate) fn remove(&mut self, name: &str) -> Option<Arc<CronEntry>> {
        let entry = self.entries.remove(name)?;
        if let Some(at) = entry.next_run_at {
            self.due.remove(&(at, name.to_string()));
        }
        self.schedules.remove(name);
        self.dirty.insert(name.to_string());
        Some(entry)
    }

    /// Checks that the due order matches the entries.
    pub fn check_invariants(&self) -> Result<(), String> {
        let scheduled = self.entries.values().filter(|entry| entry.next_run_at.is_some()).count();
        if scheduled != self.due.len() {
            return Err(format!("{} due entries for {scheduled} scheduled cron entries", self.due.len()));
        }
        for (name, entry) in &self.entries {
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

impl State {
    /// Registers or changes an entry. Returns the record and whether the entry is new.
    pub fn decide_cron_put(
        &self,
        now: Millis,
        definition: CronDefinition,
        write: CronWrite,
        max_entries: usize,
    ) -> Result<(Record, bool), EngineError> {
        let existing = self.crons.get(&definition.name);
        match (existing, write) {
            (None, CronWrite::Patch { .. }) => return Err(EngineError::CronNotFound { name: definition.name }),
            (Some(entry), CronWrite::Patch { revision }) if entry.revision != revision => {
                return Err(EngineError::CronChanged { name: definition.name });
            }
            (None, CronWrite::Upsert) if self.crons.len() >= max_entries => {
                return Err(EngineError::CronLimit { max_entries });
            }
            _ => {}
        }
        let schedule = compile(&definition).map_err(|problem| EngineError::Invalid {
            error: crate::job::ValidationError::request(Some("schedule".to_string()), problem),
            index: None,
        })?;
        // No backfill: the first run is strictly after now (decisions §17.5).
        let next_run_at = if definition.enabled { schedule.next_fire(now).map(|next| next.at) } else { None };
        let entry = CronEntry {
            created_at: existing.map_or(now, |entry| entry.created_at),
            updated_at: now,
            revision: existing.map_or(1, |entry| entry.revision + 1),
            run_count: existing.map_or(0, |entry| entry.run_count),
            last_run_at: existing.and_then(|entry| entry.last_run_at),
            last_job_id: existing.and_then(|entry| entry.last_job_id),
            next_run_at,
            definition: Arc::new(definition),
        };
        Ok((Record::CronPut { at: now, entry }, existing.is_none()))
    }

    pub fn decide_cron_delete(&self, now: Millis, name: &str) -> Result<Record, EngineError> {
        if self.crons.get(name).is_none() {
            return Err(EngineError::CronNotFound { name: name.to_string() });
        }
        Ok(Record::CronDelete { at: now, name: name.to_string() })
    }

    /// Fires every entry due at `now` (at most `max`), one record each.
    pub fn decide_cron_due(&mut self, now: Millis, max: usize, entropy: &mut dyn Entropy) -> Vec<Record> {
        let mut records = Vec::new();
        let mut made = crate::job::JobIdSet::default();
        for name in self.crons.due(now, max) {
            let (Some(entry), Some(schedule)) = (self.crons.get(&name).cloned(), self.crons.schedule(&name).cloned())
            else {
                continue;
            };
            let Some(first_due) = entry.next_run_at else { continue };
            // After downtime or a clock jump: fire once, for the latest missed slot.
            let scheduled = schedule.latest_fire_at_or_before(now).filter(|at| *at > first_due).unwrap_or(first_due);
            let missed = if scheduled > first_due {
                schedule.count_fires(first_due, scheduled, CRON_MISSED_COUNT_MAX)
            } else {
                0
            };
            let next = schedule.next_fire(now.max(scheduled));
            let previous = entry.last_job_id.and_then(|id| self.job(id)).filter(|job| !job.state.is_terminal());
            let definition = &entry.definition;
            let outcome = match (previous, definition.overlap) {
                (Some(previous), OverlapPolicy::Skip) => CronOutcome::Skipped { existing: previous.id },
                // At most one run waits behind the previous one.
                (Some(previous), OverlapPolicy::Enqueue) if previous.state == JobState::Pending => {
                    CronOutcome::Skipped { existing: previous.id }
                }
                (previous, policy) => {
                    let (state, cancelled, waits_for) = match (previous, policy) {
                        (Some(previous), OverlapPolicy::CancelPrevious) => {
                            (JobState::Available, Some(previous.id), None)
                        }
                        (Some(previous), OverlapPolicy::Enqueue) => (JobState::Pending, None, Some(previous.id)),
                        _ => (JobState::Available, None, None),
                    };
                    let id = self.fresh_id(now, entropy, &made);
                    made.insert(id);
                    let job = Arc::new(fired_job(definition, id, state, now, scheduled));
                    CronOutcome::Enqueued { job, cancelled, waits_for }
                }
            };
            let fire = CronFire {
                scheduled,
                missed,
                skipped_gap: next.and_then(|next| next.skipped_gap),
                next_run_at: next.map(|next| next.at),
                outcome,
            };
            records.push(Record::CronFire { at: now, name, fire });
        }
        records
    }
}

/// The job a firing creates: the template, with the cron's name and the
/// nominal time added to `meta`.
fn fired_job(definition: &CronDefinition, id: JobId, state: JobState, now: Millis, scheduled: Millis) -> Job {
    let template = &definition.job;
    let mut meta: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&template.payload.meta).unwrap_or_default();
    meta.insert("cron_name".to_string(), definition.name.clone().into());
    meta.insert("cron_triggered_at".to_string(), format_timestamp(scheduled).into());
    let payload = JobPayload { meta: serde_json::Value::Object(meta).to_string(), ..template.payload.as_ref().clone() };
    let request = NewJob {
        id: Some(id),
        payload: Arc::new(payload),
        queue: template.queue.clone(),
        priority: template.priority,
        timeout_ms: template.timeout_ms,
        visibility_timeout_ms: template.visibility_timeout_ms,
        scheduled_at: None,
        expires_at: None,
        retry: template.retry.clone(),
    };
    Job::accept(request, id, state, now, None, None)
}
