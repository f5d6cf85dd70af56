//! Cron (docs/api.md, "Cron"): registering, changing, deleting and firing
//! the entries of the cron table (`table.rs`).
//!
//! The feature is here: the requests, their decisions, their records
//! (`record.rs`) and how those records apply. A firing is one record
//! holding the created job and the entry's new `next_run_at`, so a replayed
//! log never fires a slot twice and never loses a registration. Parsing
//! expressions and finding the next time is `crate::cron`'s.

pub(super) mod record;
pub(crate) mod table;

use std::sync::Arc;

use super::api::EngineError;
use super::events::{CronInfo, CronSkip, EventKind, EventSink};
use super::jobs::decide::Entropy;
use super::record::Logged;
use super::requests::{Request, Turn, sealed};
use super::state::{ApplyError, State};
use crate::clock::Millis;
use crate::cron::{CronDefinition, OverlapPolicy};
use crate::job::{Job, JobState, OnConflict};
use crate::limits::CRON_MISSED_COUNT_MAX;
use record::{CronDelete, CronFired, CronPut, CronRecord};
use table::{CronEntry, CronFire, CronOutcome, CronWrite};

/// Registers a cron entry, replaces one, or changes one still at a revision;
/// answers the entry and whether it is new.
pub struct PutCron {
    pub definition: CronDefinition,
    pub write: CronWrite,
}

impl sealed::Sealed for PutCron {}

impl Request for PutCron {
    type Output = (Arc<CronEntry>, bool);

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let name = self.definition.name.clone();
        let limit = turn.cron_entries_max;
        let (record, created) = turn.state().decide_cron_put(turn.now, self.definition, self.write, limit)?;
        turn.apply(record);
        Ok((turn.state().crons().get(&name).cloned().expect("a cron entry just put is stored"), created))
    }

    fn full_disk_bytes(&self, _turn: &Turn<'_>) -> Option<u64> {
        None
    }
}

/// Removes a cron entry; jobs it already created are untouched.
pub struct DeleteCron {
    pub name: String,
}

impl sealed::Sealed for DeleteCron {}

impl Request for DeleteCron {
    type Output = Arc<CronEntry>;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let record = turn.state().decide_cron_delete(turn.now, &self.name)?;
        let entry = turn.state().crons().get(&self.name).cloned().expect("a cron entry to delete is stored");
        turn.apply(record);
        Ok(entry)
    }
}

/// The entry a registration stores: `definition` over the entry of the same
/// name (`existing`, one of `count` entries), as `write` allows. No backfill:
/// the first run is strictly after `now` (docs/api.md, "Firing"). Both
/// backends register through this.
pub fn register(
    existing: Option<&CronEntry>,
    count: usize,
    definition: CronDefinition,
    write: CronWrite,
    now: Millis,
    max_entries: usize,
) -> Result<CronEntry, EngineError> {
    match (existing, write) {
        (None, CronWrite::Patch { .. }) => return Err(EngineError::CronNotFound { name: definition.name }),
        (Some(entry), CronWrite::Patch { revision }) if entry.revision != revision => {
            return Err(EngineError::CronChanged { name: definition.name });
        }
        (None, CronWrite::Upsert) if count >= max_entries => return Err(EngineError::CronLimit { max_entries }),
        _ => {}
    }
    let schedule = definition.compile().map_err(|problem| EngineError::Invalid {
        error: crate::job::ValidationError::request(Some("schedule".to_string()), problem),
        index: None,
    })?;
    let next_run_at = if definition.enabled { schedule.next_fire(now).map(|next| next.at) } else { None };
    Ok(CronEntry {
        created_at: existing.map_or(now, |entry| entry.created_at),
        updated_at: now,
        revision: existing.map_or(1, |entry| entry.revision + 1),
        run_count: existing.map_or(0, |entry| entry.run_count),
        last_run_at: existing.and_then(|entry| entry.last_run_at),
        last_job_id: existing.and_then(|entry| entry.last_job_id),
        next_run_at,
        definition: Arc::new(definition),
    })
}

impl State {
    /// Registers or changes an entry. Returns the record and whether the entry is new.
    pub fn decide_cron_put(
        &self,
        now: Millis,
        definition: CronDefinition,
        write: CronWrite,
        max_entries: usize,
    ) -> Result<(Logged, bool), EngineError> {
        let existing = self.crons.get(&definition.name).map(Arc::as_ref);
        let entry = register(existing, self.crons.len(), definition, write, now, max_entries)?;
        Ok((Logged::new(now, CronPut { entry }), existing.is_none()))
    }

    pub fn decide_cron_delete(&self, now: Millis, name: &str) -> Result<Logged, EngineError> {
        if self.crons.get(name).is_none() {
            return Err(EngineError::CronNotFound { name: name.to_string() });
        }
        Ok(Logged::new(now, CronDelete { name: name.to_string() }))
    }

    /// Fires every entry due at `now` (at most `max`), one record each.
    pub fn decide_cron_due(&mut self, now: Millis, max: usize, entropy: &mut dyn Entropy) -> Vec<Logged> {
        let mut records = Vec::new();
        let mut made = crate::job::JobIdSet::default();
        let mut made_jobs: Vec<Arc<Job>> = Vec::new();
        for name in self.crons.due(now, max) {
            let (Some(entry), Some(schedule)) = (self.crons.get(&name).cloned(), self.crons.schedule(&name).cloned())
            else {
                continue;
            };
            let Some(first_due) = entry.next_run_at else { continue };
            let due = schedule.due_firing(first_due, now, CRON_MISSED_COUNT_MAX);
            let (scheduled, missed, next) = (due.scheduled, due.missed, due.next);
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
                    let job = definition.fired_job(id, state, now, scheduled);
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
            records.push(Logged::new(now, CronFired { name, fire }));
        }
        records
    }
}

impl State {
    pub(super) fn apply_cron_record(
        &mut self,
        at: Millis,
        record: &CronRecord,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        match record {
            CronRecord::Put(CronPut { entry }) => self.crons.put(entry.clone()).map_err(ApplyError),
            CronRecord::Delete(CronDelete { name }) => self
                .crons
                .remove(name)
                .map(drop)
                .ok_or_else(|| ApplyError(format!("record deletes unknown cron entry {name}"))),
            CronRecord::Fire(fired) => self.apply_cron_fire(at, fired, events),
        }
    }

    fn apply_cron_fire(&mut self, at: Millis, record: &CronFired, events: &mut EventSink) -> Result<(), ApplyError> {
        let CronFired { name, fire } = record;
        let entry =
            self.crons.get(name).cloned().ok_or_else(|| ApplyError(format!("record fires unknown cron {name}")))?;
        let definition = &entry.definition;
        let info = |scheduled_time| CronInfo {
            name: name.to_string(),
            schedule: definition.schedule.clone(),
            timezone: definition.timezone.clone(),
            scheduled_time,
        };
        if fire.missed > 0 {
            let kind = EventKind::CronSkipped(Box::new(CronSkip {
                cron: info(fire.scheduled),
                reason: "misfire",
                existing_job_id: None,
                missed_count: Some(fire.missed),
            }));
            events.push_other(at, kind);
        }
        let mut updated = entry.as_ref().clone();
        updated.next_run_at = fire.next_run_at;
        match &fire.outcome {
            CronOutcome::Enqueued { job, cancelled, waits_for, replaced } => {
                if self.jobs.contains_key(&job.id) {
                    return Err(ApplyError(format!("cron record enqueues job {} twice", job.id)));
                }
                // The run waits before anything is cancelled: if the previous
                // run is also the unique holder `replace` cancels, its end
                // releases the waiting run instead of leaving it pending.
                if let Some(previous) = waits_for {
                    self.crons.waiters.insert(*previous, job.id);
                }
                if let Some(previous) = cancelled {
                    self.cancel(at, *previous, "cron_cancel_previous", events)?;
                }
                for id in replaced {
                    if self.jobs.get(id).is_some_and(|job| !job.state.is_terminal()) {
                        self.cancel(at, *id, "unique_replace", events)?;
                    }
                }
                updated.run_count += 1;
                updated.last_run_at = Some(fire.scheduled);
                updated.last_job_id = Some(job.id);
                let kind =
                    EventKind::CronTriggered { cron: Box::new(info(fire.scheduled)), run_count: updated.run_count };
                events.push(at, kind, job.id);
                events.push(at, EventKind::Enqueued, job.id);
                self.insert_loaded(job.clone());
            }
            CronOutcome::Skipped { existing } => {
                let kind = EventKind::CronSkipped(Box::new(CronSkip {
                    cron: info(fire.scheduled),
                    reason: "overlap_skip",
                    existing_job_id: Some(*existing),
                    missed_count: None,
                }));
                events.push_other(at, kind);
            }
            CronOutcome::Duplicate { existing } => {
                let kind = EventKind::CronSkipped(Box::new(CronSkip {
                    cron: info(fire.scheduled),
                    reason: "duplicate",
                    existing_job_id: Some(*existing),
                    missed_count: None,
                }));
                events.push_other(at, kind);
            }
            CronOutcome::QueuePaused => {
                let kind = EventKind::CronSkipped(Box::new(CronSkip {
                    cron: info(fire.scheduled),
                    reason: "queue_paused",
                    existing_job_id: None,
                    missed_count: None,
                }));
                events.push_other(at, kind);
            }
            CronOutcome::SchemaNotRegistered => {
                let kind = EventKind::CronSkipped(Box::new(CronSkip {
                    cron: info(fire.scheduled),
                    reason: "schema_not_registered",
                    existing_job_id: None,
                    missed_count: None,
                }));
                events.push_other(at, kind);
            }
        }
        if let Some(gap) = fire.skipped_gap {
            let kind = EventKind::CronSkipped(Box::new(CronSkip {
                cron: info(gap),
                reason: "dst_skip",
                existing_job_id: None,
                missed_count: None,
            }));
            events.push_other(at, kind);
        }
        self.crons.put(updated).map_err(ApplyError)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::record::decode_batch;

    #[test]
    fn records_of_the_first_format_read_as_they_were_written() {
        // Kind 15 (docs/wal-format.md), then the fields in order: 5 as a
        // zigzag varint, the name's length and text.
        let delete = Logged::new(5, CronDelete { name: "n".into() });
        assert_eq!(decode_batch(&[1, 15, 10, 1, b'n']).unwrap(), [delete]);
        let fire = CronFire {
            scheduled: 3,
            missed: 0,
            skipped_gap: None,
            next_run_at: None,
            outcome: CronOutcome::QueuePaused,
        };
        // Kind 20, `at`, the name, the firing.
        let mut fired = vec![1, 20, 10, 1, b'n'];
        fired.extend(postcard::to_allocvec(&fire).unwrap());
        assert_eq!(decode_batch(&fired).unwrap(), [Logged::new(5, CronFired { name: "n".into(), fire })]);
    }
}
