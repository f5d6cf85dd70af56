//! The worker registry (docs/api.md, "The worker registry and signals"):
//! who has been seen, and the signals operators gave them.
//!
//! The feature is here: the requests, the registry's decisions
//! (`registry.rs`), its records (`record.rs`) and how those apply, and a
//! worker's entry with the soft contact state (`entry.rs`). Signals are
//! durable; when a worker was last seen is kept by the writer and rebuilt by
//! contact after a restart.

pub(crate) mod entry;
pub(super) mod record;
pub(crate) mod registry;

pub use entry::{WorkerEntry, WorkerSignal, WorkerState};

use super::api::EngineError;
use super::events::{EventKind, EventSink, SignalledWorker};
use super::record::Logged;
use super::requests::{Request, Turn, sealed};
use super::state::{ApplyError, State};
use crate::clock::Millis;
use record::{WorkerForgotten, WorkerRecord, WorkerSignalGiven};

/// Gives a known worker a signal (`quiet` or `terminate`).
pub struct SignalWorker {
    pub worker_id: String,
    pub signal: WorkerSignal,
}

impl sealed::Sealed for SignalWorker {}

impl Request for SignalWorker {
    type Output = WorkerEntry;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let record = registry::decide_signal(turn.state, turn.contacts, turn.now, &self.worker_id, self.signal)?;
        turn.apply(record);
        Ok(registry::entry(turn.state, turn.contacts, &self.worker_id).expect("a signalled worker has an entry"))
    }
}

/// Forgets a worker's entry and signal; its jobs are untouched.
pub struct ForgetWorker {
    pub worker_id: String,
}

impl sealed::Sealed for ForgetWorker {}

impl Request for ForgetWorker {
    type Output = ();

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        if registry::entry(turn.state, turn.contacts, &self.worker_id).is_none() {
            return Err(EngineError::WorkerNotFound { worker_id: self.worker_id });
        }
        turn.contacts.forget(&self.worker_id);
        turn.apply(Logged::new(turn.now, WorkerForgotten { worker_id: self.worker_id }));
        Ok(())
    }
}

impl State {
    pub(super) fn apply_worker_record(
        &mut self,
        at: Millis,
        record: &WorkerRecord,
        events: &mut EventSink,
    ) -> Result<(), ApplyError> {
        match record {
            WorkerRecord::Signal(WorkerSignalGiven { worker_id, signal }) => {
                self.set_worker_signal(worker_id, Some((*signal, at)));
                let kind = EventKind::WorkerSignalled(Box::new(SignalledWorker {
                    worker_id: worker_id.to_string(),
                    terminate: *signal == WorkerSignal::Terminate,
                    active_job_ids: self.active_of_worker(worker_id),
                    by: "operator",
                }));
                events.push_other(at, kind);
            }
            WorkerRecord::Forget(WorkerForgotten { worker_id }) => self.set_worker_signal(worker_id, None),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::record::decode_batch;

    #[test]
    fn records_of_the_first_format_read_as_they_were_written() {
        // Kinds 12 and 13 (docs/wal-format.md), then the fields in order: 5
        // as a zigzag varint, the worker id's length and text, the signal.
        let signal = WorkerSignalGiven { worker_id: "w".into(), signal: WorkerSignal::Terminate };
        assert_eq!(decode_batch(&[1, 12, 10, 1, b'w', 1]).unwrap(), [Logged::new(5, signal)]);
        let forget = WorkerForgotten { worker_id: "w".into() };
        assert_eq!(decode_batch(&[1, 13, 10, 1, b'w']).unwrap(), [Logged::new(5, forget)]);
    }
}
