//! Queue control (docs/api.md, "Queues"): pausing and resuming a queue.
//!
//! The feature is here: the request, its decision, its record (`record.rs`)
//! and how that record applies. A paused queue refuses new work
//! (`EngineError::QueuePaused`, checked where work is decided), fetches
//! skip it, and its timers run on; the flag lives in the state's queue
//! table and in snapshots.

pub(super) mod record;

use super::api::EngineError;
use super::events::{EventKind, EventSink};
use super::requests::{Request, Turn, sealed};
use super::state::State;
use super::view::QueueSummary;
use crate::clock::Millis;
use record::QueuePause;

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
}
