//! The engine's cron decisions: register, change, delete and fire entries
//! of the cron table (`cron_table.rs`).
//!
//! A firing is one record holding the created job and the entry's new
//! `next_run_at`, so a replayed log never fires a slot twice and never loses
//! a registration.

use std::sync::Arc;

use super::api::EngineError;
use super::cron_table::{CronEntry, CronFire, CronOutcome, CronWrite, compile};
use super::decide::Entropy;
use super::record::Record;
use super::state::State;
use crate::clock::Millis;
use crate::cron::{CronDefinition, OverlapPolicy};
use crate::job::time::format_timestamp;
use crate::job::{Job, JobId, JobState, NewJob, OnConflict};
use crate::limits::CRON_MISSED_COUNT_MAX;

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
        // No backfill: the first run is strictly after now (docs/api.md, "Firing").
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
        let mut made_jobs: Vec<Arc<Job>> = Vec::new();
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
            let paused = self.queue(&definition.job.queue).is_some_and(|queue| queue.paused);
            let schema = definition.schema();
            let schema_missing = schema.as_deref().is_some_and(|uri| !self.schemas.contains_key(uri));
            let outcome = match (previous, definition.overlap) {
                _ if schema_missing => CronOutcome::SchemaNotRegistered,
                _ if paused => CronOutcome::QueuePaused,
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
                    let job = fired_job(definition, id, state, now, scheduled);
                    match self.unique_holders(&job, now, &made_jobs, &[]) {
                        Some((OnConflict::Reject | OnConflict::Ignore, holders)) => {
                            CronOutcome::Duplicate { existing: holders[0] }
                        }
                        found => {
                            let replaced = found.map(|(_, holders)| holders).unwrap_or_default();
                            made.insert(id);
                            let job = Arc::new(job);
                            made_jobs.push(job.clone());
                            CronOutcome::Enqueued { job, cancelled, waits_for, replaced }
                        }
                    }
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
        serde_json::from_str(template.payload.meta()).unwrap_or_default();
    meta.insert("cron_name".to_string(), definition.name.clone().into());
    meta.insert("cron_triggered_at".to_string(), format_timestamp(scheduled).into());
    let payload = template.payload.with_meta(&serde_json::Value::Object(meta).to_string());
    let (unique, rate_limit) = definition.job_controls();
    let schema = definition.schema().map(Arc::from);
    let request = NewJob {
        id: Some(id),
        payload,
        queue: template.queue.as_str().into(),
        priority: template.priority,
        timeout_ms: template.timeout_ms,
        visibility_timeout_ms: template.visibility_timeout_ms,
        scheduled_at: None,
        expires_at: None,
        retry: template.retry.clone(),
        unique,
        rate_limit,
        pending: false,
        schema,
    };
    Job::accept(request, id, state, now, None, None)
}
