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
use super::record::Logged;
use super::requests::{Request, Turn, sealed};
use super::state::State;
use super::view::QueueSummary;
use crate::clock::Millis;
pub use record::{Backpressure, BackpressureStrategy};
use record::{QueueConfigured, QueuePause, QueueRecord};

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
            let record = QueueConfigured { queue: self.queue.clone(), backpressure: self.backpressure };
            turn.apply(Logged::new(turn.now, record));
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
        if let Some(record) = turn.state().decide_queue_pause(&self.queue, self.paused) {
            turn.apply(Logged::new(turn.now, record));
        }
        Ok(turn.state().queue_summary(&self.queue))
    }
}

impl State {
    /// `None` when the queue already is as asked (no record, no event).
    fn decide_queue_pause(&self, queue: &str, paused: bool) -> Option<QueuePause> {
        let current = self.queue(queue).is_some_and(|state| state.paused);
        (current != paused).then(|| QueuePause { queue: queue.to_string(), paused })
    }

    pub(super) fn apply_queue_record(&mut self, at: Millis, record: &QueueRecord, events: &mut EventSink) {
        match record {
            QueueRecord::Pause(QueuePause { queue, paused }) => {
                self.set_queue_paused(queue, *paused);
                let kind = if *paused { EventKind::QueuePaused } else { EventKind::QueueResumed };
                events.push_other(at, kind(queue.clone()));
            }
            QueueRecord::Configure(QueueConfigured { queue, backpressure }) => {
                self.set_queue_backpressure(queue, *backpressure);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::record::decode_batch;

    #[test]
    fn records_of_the_first_format_read_as_they_were_written() {
        // Kind 18 (docs/wal-format.md), then the fields in order: 5 as a
        // zigzag varint, the queue's length and text, `true`.
        let pause = [1, 18, 10, 1, b'q', 1];
        let expected = Logged::new(5, QueuePause { queue: "q".into(), paused: true });
        assert_eq!(decode_batch(&pause).unwrap(), [expected]);
        // Kind 35, `at`, the queue, `Some`, max_depth 3, strategy 0
        // (reject), `Some(0.5)` as 8 little-endian bytes.
        let mut configure = vec![1, 35, 10, 1, b'q', 1, 3, 0, 1];
        configure.extend_from_slice(&0.5f64.to_le_bytes());
        let backpressure = Some(Backpressure::reject_above(3).warning_at(0.5));
        let expected = Logged::new(5, QueueConfigured { queue: "q".into(), backpressure });
        assert_eq!(decode_batch(&configure).unwrap(), [expected]);
    }

    #[test]
    fn pressure_is_told_from_the_threshold_on() {
        let backpressure = Backpressure::reject_above(10).warning_at(0.5);
        assert_eq!(backpressure.pressure(4), None);
        assert_eq!(backpressure.pressure(5), Some(0.5));
        assert_eq!(Backpressure::reject_above(10).pressure(9), None);
    }
}
