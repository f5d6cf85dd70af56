//! The worker registry's decisions (docs/api.md, "The worker registry and signals"): recording contact,
//! the entry a worker is reported with, operator signals, the drain's
//! farewell, and forgetting idle workers. Signals are durable state
//! (`State`); contact is soft state (`Contacts`) the engine keeps beside it.

use super::super::api::EngineError;
use super::super::events::{EventKind, EventSink, SignalledWorker};
use super::super::record::Logged;
use super::super::state::State;
use super::entry::{Contacts, WorkerEntry, WorkerSignal, WorkerState};
use super::record::{WorkerForgotten, WorkerSignalGiven};
use crate::clock::Millis;
use crate::limits::{WORKER_FORGET_MS, WORKER_STALE_MS, WORKERS_MAX};

/// Records contact with a worker, forgetting an idle one if the registry is full.
pub(crate) fn touch(
    state: &mut State,
    contacts: &mut Contacts,
    worker_id: &str,
    now: Millis,
    heartbeat: bool,
    events: &mut EventSink,
) {
    if contacts.len() >= WORKERS_MAX && contacts.get(worker_id).is_none() {
        // Room is made from the idle workers: bring in what this turn changed.
        for worker in state.dirty_workers() {
            contacts.set_busy(worker, state.holds_active(worker));
        }
    }
    let held = &*state;
    let touched = contacts.touch(worker_id, now, heartbeat, WORKERS_MAX, |worker| held.holds_active(worker));
    if touched.new && state.worker_signal(worker_id).is_none() {
        events.push_other(now, EventKind::WorkerStarted { worker_id: worker_id.to_string() });
    }
    state.touch_worker(worker_id);
    if let Some(forgotten) = touched.forgotten {
        state.touch_worker(&forgotten);
    }
}

/// The registry entry of a worker seen since start or holding a signal.
pub(crate) fn entry(state: &State, contacts: &Contacts, worker_id: &str) -> Option<WorkerEntry> {
    let contact = contacts.get(worker_id);
    let signal = state.worker_signal(worker_id);
    let (first_seen_at, last_seen_at) = match (contact, signal) {
        (Some(contact), _) => (contact.first_seen_at, contact.last_seen_at),
        (None, Some((_, at))) => (at, at),
        (None, None) => return None,
    };
    Some(WorkerEntry {
        worker_id: worker_id.to_string(),
        state: WorkerState::of(signal.map(|(signal, _)| signal)),
        first_seen_at,
        last_seen_at,
        last_heartbeat_at: contact.and_then(|contact| contact.last_heartbeat_at),
        active_job_ids: state.active_of_worker(worker_id),
        queues: contacts.queues(worker_id).to_vec(),
    })
}

/// Checks a signal against the worker's state: a known worker, and no
/// `quiet` after `terminate`.
pub(crate) fn decide_signal(
    state: &State,
    contacts: &Contacts,
    now: Millis,
    worker_id: &str,
    signal: WorkerSignal,
) -> Result<Logged, EngineError> {
    let Some(entry) = entry(state, contacts, worker_id) else {
        return Err(EngineError::WorkerNotFound { worker_id: worker_id.to_string() });
    };
    if signal == WorkerSignal::Quiet && entry.state == WorkerState::Terminate {
        return Err(EngineError::WorkerConflict { worker_id: worker_id.to_string(), current_state: entry.state });
    }
    Ok(Logged::new(now, WorkerSignalGiven { worker_id: worker_id.to_string(), signal }))
}

/// A drain began: each worker seen lately gets a `worker.terminate` event.
pub(crate) fn farewell(state: &State, contacts: &Contacts, now: Millis, events: &mut EventSink) {
    for worker_id in contacts.seen_since(now - WORKER_STALE_MS) {
        let active_job_ids = state.active_of_worker(&worker_id);
        let signalled = SignalledWorker { worker_id, terminate: true, active_job_ids, by: "shutdown" };
        events.push_other(now, EventKind::WorkerSignalled(Box::new(signalled)));
    }
}

/// Forgets workers idle for a day (no contact, no active jobs); returns the
/// records that forget the signals given long ago to workers not seen since.
pub(crate) fn forget_idle(state: &mut State, contacts: &mut Contacts, now: Millis) -> Vec<Logged> {
    let cutoff = now - WORKER_FORGET_MS;
    for worker_id in contacts.seen_before(cutoff) {
        if state.active_of_worker(&worker_id).is_empty() {
            contacts.forget(&worker_id);
            state.touch_worker(&worker_id);
        }
    }
    // Signals outlive contact; one given long ago to a worker not seen since goes too.
    state
        .signalled_workers()
        .filter(|worker_id| {
            contacts.get(worker_id).is_none()
                && state.worker_signal(worker_id).is_some_and(|(_, at)| at < cutoff)
                && state.active_of_worker(worker_id).is_empty()
        })
        .map(|worker_id| Logged::new(now, WorkerForgotten { worker_id: worker_id.clone() }))
        .collect()
}
