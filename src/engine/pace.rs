//! The pace of background snapshots. While requests are being served, a
//! snapshot's thread rests seven times as long as each megabyte took it, so
//! that it works about an eighth of the time and the requests of the moment
//! keep the cores. It works flat out while nothing is being logged, and once
//! told to hurry (a whole snapshot interval of log has built up behind it,
//! or the server waits for it). A rest is at most 100 ms, and the sort
//! before the first byte is not paced. Why an eighth, and what it costs, is
//! in docs/perf-log.md ("Snapshots and request latency").

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How much a snapshot writes between rests.
const STEP_BYTES: usize = 1024 * 1024;
/// Time rested per unit of time worked: an eighth of the time working.
const REST_PER_WORK: u32 = 7;
/// The longest single rest, whatever the step before it took.
const REST_MAX: Duration = Duration::from_millis(100);

/// What the engine tells a background snapshot about the load.
#[derive(Debug, Default)]
pub(crate) struct PaceSignals {
    /// Stop resting: the next snapshot is due, or the server waits for this one.
    hurry: AtomicBool,
    /// Log bytes written so far; a step during which they grew was one
    /// during which requests were being served.
    logged: AtomicU64,
}

impl PaceSignals {
    /// A new snapshot starts, not hurried.
    pub(crate) fn start(&self) {
        self.hurry.store(false, Ordering::SeqCst);
    }

    pub(crate) fn hurry(&self) {
        self.hurry.store(true, Ordering::SeqCst);
    }

    /// The engine wrote `bytes` to the log.
    pub(crate) fn logged(&self, bytes: u64) {
        self.logged.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// How long to rest after a step that took `worked`: none when hurried or
/// when nothing was logged meanwhile.
pub(crate) fn rest_after(worked: Duration, hurried: bool, served: bool) -> Duration {
    if hurried || !served { Duration::ZERO } else { (worked * REST_PER_WORK).min(REST_MAX) }
}

/// Passes a snapshot's bytes on, resting after every [`STEP_BYTES`] of them
/// as [`rest_after`] says.
pub(crate) struct PacedWriter<'a> {
    out: &'a mut dyn Write,
    signals: &'a PaceSignals,
    since_rest: usize,
    working_since: Instant,
    logged_before: u64,
}

impl<'a> PacedWriter<'a> {
    pub(crate) fn new(out: &'a mut dyn Write, signals: &'a PaceSignals) -> Self {
        let logged_before = signals.logged.load(Ordering::Relaxed);
        Self { out, signals, since_rest: 0, working_since: Instant::now(), logged_before }
    }
}

impl Write for PacedWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let written = self.out.write(bytes)?;
        self.since_rest += written;
        if self.since_rest >= STEP_BYTES {
            self.since_rest = 0;
            let logged = self.signals.logged.load(Ordering::Relaxed);
            let served = logged != self.logged_before;
            let rest = rest_after(self.working_since.elapsed(), self.signals.hurry.load(Ordering::Relaxed), served);
            if !rest.is_zero() {
                std::thread::sleep(rest);
            }
            self.logged_before = self.signals.logged.load(Ordering::Relaxed);
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
    fn a_step_is_followed_by_seven_times_its_length_of_rest_while_requests_are_served() {
        let step = Duration::from_millis(4);
        assert_eq!(rest_after(step, false, true), Duration::from_millis(28));
        assert_eq!(rest_after(step, true, true), Duration::ZERO, "hurried");
        assert_eq!(rest_after(step, false, false), Duration::ZERO, "nothing logged meanwhile");
        assert_eq!(rest_after(Duration::from_secs(2), false, true), REST_MAX, "one slow step does not stall it");
    }

    /// A sink that takes `per_write` for every write, during which the
    /// engine logs a request.
    struct SlowSink<'a> {
        per_write: Duration,
        bytes: usize,
        signals: &'a PaceSignals,
    }

    impl Write for SlowSink<'_> {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            std::thread::sleep(self.per_write);
            self.signals.logged(100);
            self.bytes += bytes.len();
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_writer_not_hurried_rests_after_each_step_while_requests_are_served() {
        let signals = PaceSignals::default();
        let per_write = Duration::from_millis(2);
        let mut sink = SlowSink { per_write, bytes: 0, signals: &signals };
        let started = Instant::now();
        let mut paced = PacedWriter::new(&mut sink, &signals);
        for _ in 0..3 {
            paced.write_all(&vec![0u8; STEP_BYTES]).unwrap();
        }
        // Each step took at least 2 ms, and worked an eighth of its time.
        let least = per_write * 8 * 3;
        assert!(started.elapsed() >= least, "{:?} is less than {least:?}: it did not rest", started.elapsed());
        assert_eq!(sink.bytes, 3 * STEP_BYTES);
    }

    #[test]
    fn every_byte_is_passed_on_in_order() {
        let signals = PaceSignals::default();
        signals.hurry();
        let mut out = Vec::new();
        let bytes: Vec<u8> = (0..3 * STEP_BYTES + 17).map(|n| (n % 251) as u8).collect();
        let mut paced = PacedWriter::new(&mut out, &signals);
        for piece in bytes.chunks(70_001) {
            paced.write_all(piece).expect("a Vec takes every byte");
        }
        assert_eq!(out, bytes);
    }
}
