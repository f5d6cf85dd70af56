//! The pace of background snapshots. While the server runs, a snapshot's
//! thread works at most a quarter of the time and rests the remainder, so
//! that the requests of the moment keep the cores; it works flat out once
//! told to hurry (a whole snapshot interval of log has built up behind it,
//! or the server is stopping). Why a quarter, and what it costs, is in
//! ARCHITECTURE.md ("What a job costs in memory", on snapshots and p99).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How much a snapshot writes between rests.
const STEP_BYTES: usize = 1024 * 1024;
/// Time rested per unit of time worked: a quarter of the time working.
const REST_PER_WORK: u32 = 3;
/// The longest single rest, whatever the step before it took.
const REST_MAX: Duration = Duration::from_millis(100);

/// How long to rest after a step that took `worked`.
pub(crate) fn rest_after(worked: Duration, hurry: bool) -> Duration {
    if hurry { Duration::ZERO } else { (worked * REST_PER_WORK).min(REST_MAX) }
}

/// Passes a snapshot's bytes on, resting after every [`STEP_BYTES`] of them
/// unless `hurry` is set.
pub(crate) struct PacedWriter<'a> {
    out: &'a mut dyn Write,
    hurry: &'a AtomicBool,
    since_rest: usize,
    working_since: Instant,
}

impl<'a> PacedWriter<'a> {
    pub(crate) fn new(out: &'a mut dyn Write, hurry: &'a AtomicBool) -> Self {
        Self { out, hurry, since_rest: 0, working_since: Instant::now() }
    }
}

impl Write for PacedWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let written = self.out.write(bytes)?;
        self.since_rest += written;
        if self.since_rest >= STEP_BYTES {
            self.since_rest = 0;
            let rest = rest_after(self.working_since.elapsed(), self.hurry.load(Ordering::Relaxed));
            if !rest.is_zero() {
                std::thread::sleep(rest);
            }
            self.working_since = Instant::now();
        }
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_followed_by_three_times_its_length_of_rest_unless_hurried() {
        let step = Duration::from_millis(4);
        assert_eq!(rest_after(step, false), Duration::from_millis(12));
        assert_eq!(rest_after(step, true), Duration::ZERO);
        assert_eq!(rest_after(Duration::from_secs(2), false), REST_MAX, "one slow step does not stall the snapshot");
    }

    #[test]
    fn every_byte_is_passed_on_in_order() {
        let hurry = AtomicBool::new(true);
        let mut out = Vec::new();
        let bytes: Vec<u8> = (0..3 * STEP_BYTES + 17).map(|n| (n % 251) as u8).collect();
        let mut paced = PacedWriter::new(&mut out, &hurry);
        for piece in bytes.chunks(70_001) {
            paced.write_all(piece).expect("a Vec takes every byte");
        }
        assert_eq!(out, bytes);
    }
}
