//! Queue control (docs/api.md, "Queues", "Backpressure"): pausing and
//! resuming a queue, and bounding how many jobs it holds waiting.
//!
//! The feature is here: the requests, their decisions, their records
//! (`record.rs`) and how those apply. A paused queue refuses new work
//! (`EngineError::QueuePaused`, checked where work is decided), fetches
//! skip it, and its timers run on. A queue with backpressure refuses an
//! enqueue that would take its depth past `max_depth`
//! (`EngineError::QueueFull`), a batch as a whole. Both settings live in
//! the state's queue table and in snapshots.

pub(super) mod record;

use super::api::EngineError;
use super::events::{EventKind, EventSink};
use super::requests::{Request, Turn, sealed};
use super::state::State;
use super::view::QueueSummary;
use crate::clock::Millis;
pub use record::{Backpressure, BackpressureStrategy};
use record::{QueueConfigured, QueuePause};

/// Sets (`Some`) or removes a queue's backpressure; answers its figures.
/// Setting what is already set changes nothing and logs nothing.
pub struct ConfigureQueue {
    pub queue: String,
    pub backpressure: Option<Backpressure>,
}

impl sealed::Sealed for ConfigureQueue {}

impl Request for ConfigureQueue {
    type Output = QueueSummary;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        let current = turn.state().queue(&self.queue).and_then(|queue| queue.backpressure);
        if current != self.backpressure {
            let record = QueueConfigured { at: turn.now, queue: self.queue.clone(), backpressure: self.backpressure };
            turn.apply(record.into());
        }
        Ok(turn.state().queue_summary(&self.queue))
    }
}

/// Pauses (`paused`) or resumes a queue; answers its figures. Pausing a
/// paused queue changes nothing and logs nothing.
pub struct PauseQueue {
    pub queue: String,
    pub paused: bool,
}

impl sealed::Sealed for PauseQueue {}

impl Request for PauseQueue {
    type Output = QueueSummary;

    fn run(self, turn: &mut Turn<'_>) -> Result<Self::Output, EngineError> {
        if let Some(record) = turn.state().decide_queue_pause(turn.now, &self.queue, self.paused) {
            turn.apply(record.into());
        }
        Ok(turn.state().queue_summary(&self.queue))
    }
}

impl State {
    /// `None` when the queue already is as asked (no record, no event).
    fn decide_queue_pause(&self, now: Millis, queue: &str, paused: bool) -> Option<QueuePause> {
        let current = self.queue(queue).is_some_and(|state| state.paused);
        (current != paused).then(|| QueuePause { at: now, queue: queue.to_string(), paused })
    }

    pub(super) fn apply_queue_pause(&mut self, record: &QueuePause, events: &mut EventSink) {
        self.set_queue_paused(&record.queue, record.paused);
        let kind = if record.paused { EventKind::QueuePaused } else { EventKind::QueueResumed };
        events.push_other(record.at, kind(record.queue.clone()));
    }

    pub(super) fn apply_queue_configured(&mut self, record: &QueueConfigured) {
        self.set_queue_backpressure(&record.queue, record.backpressure);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_encoded_as_the_struct_variant_it_replaced() {
        let record = super::super::record::Record::QueuePause(QueuePause { at: 5, queue: "q".into(), paused: true });
        // Kind 18 (docs/wal-format.md), then the fields in order: 5 as a
        // zigzag varint, the queue's length and text, `true`.
        assert_eq!(postcard::to_allocvec(&record).unwrap(), [18, 10, 1, b'q', 1]);
    }

    #[test]
    fn the_configuration_record_is_kind_35_as_documented() {
        let backpressure = Some(Backpressure::reject_above(3).warning_at(0.5));
        let record =
            super::super::record::Record::QueueConfig(QueueConfigured { at: 5, queue: "q".into(), backpressure });
        // Kind 35 (docs/wal-format.md), `at`, the queue, `Some`, max_depth 3,
        // strategy 0 (reject), `Some(0.5)` as 8 little-endian bytes.
        let mut expected = vec![35, 10, 1, b'q', 1, 3, 0, 1];
        expected.extend_from_slice(&0.5f64.to_le_bytes());
        assert_eq!(postcard::to_allocvec(&record).unwrap(), expected);
    }

    #[test]
    fn pressure_is_told_from_the_threshold_on() {
        let backpressure = Backpressure::reject_above(10).warning_at(0.5);
        assert_eq!(backpressure.pressure(4), None);
        assert_eq!(backpressure.pressure(5), Some(0.5));
        assert_eq!(Backpressure::reject_above(10).pressure(9), None);
    }
}
