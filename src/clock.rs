//! The only place that reads the operating system's clock.
//!
//! The engine takes one `now` per batch from a [`Clock`]; tests use a
//! [`ManualClock`] and move time by hand instead of sleeping.
//!
//! The engine reads time through a [`SteadyClock`]: it follows the wall clock,
//! but when the wall clock steps (an operator, a VM host, NTP after a long
//! gap) it moves toward the new time at most a tenth faster or slower than
//! real time, never backwards. (A step of more than a day is taken at once:
//! a clock that far off was simply wrong.) A step forward of an hour therefore does
//! not expire every claim at once, and a step back does not stall the timers
//! for an hour (see `ARCHITECTURE.md`, "Time").

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    /// Wall-clock time.
    fn now_ms(&self) -> Millis;

    /// Milliseconds from some fixed point, never stepping: real time elapsed.
    /// By default the wall clock (for clocks that never step).
    fn monotonic_ms(&self) -> Millis {
        self.now_ms()
    }
}

/// Wall-clock time of the operating system.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        since_epoch.as_millis() as Millis
    }

    fn monotonic_ms(&self) -> Millis {
        static ANCHOR: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        ANCHOR.get_or_init(std::time::Instant::now).elapsed().as_millis() as Millis
    }
}

/// A clock that moves only when told to. Clones share the same time.
///
/// `advance_ms` and `set_ms` let time pass (wall and monotonic time move
/// together); `step_wall_ms` steps the wall clock alone, as an operator or
/// NTP would.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<AtomicI64>,
    monotonic: Arc<AtomicI64>,
}

impl ManualClock {
    pub fn new(start_ms: Millis) -> Self {
        Self { now: Arc::new(AtomicI64::new(start_ms)), monotonic: Arc::new(AtomicI64::new(0)) }
    }

    pub fn advance_ms(&self, delta_ms: i64) {
        self.now.fetch_add(delta_ms, Ordering::SeqCst);
        self.monotonic.fetch_add(delta_ms.max(0), Ordering::SeqCst);
    }

    /// Time passes until `now_ms` (or, for an earlier time, the wall clock steps back).
    pub fn set_ms(&self, now_ms: Millis) {
        let before = self.now.swap(now_ms, Ordering::SeqCst);
        self.monotonic.fetch_add((now_ms - before).max(0), Ordering::SeqCst);
    }

    /// The wall clock steps by `delta_ms` while no time passes.
    pub fn step_wall_ms(&self, delta_ms: i64) {
        self.now.fetch_add(delta_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.now.load(Ordering::SeqCst)
    }

    fn monotonic_ms(&self) -> Millis {
        self.monotonic.load(Ordering::SeqCst)
    }
}

/// A wall-clock difference up to this is taken at once; beyond it, it is a
/// step, and the steady clock slews toward it.
const STEP_MS: Millis = 1000;
/// While slewing, the steady clock runs this share of real time faster or slower.
const SLEW_PER_MS: Millis = 10;
/// A wall clock further off than this was simply wrong (slewing would take
/// more than ten days): the steady clock takes the new time at once.
const SLEW_MAX_MS: Millis = 24 * 3_600_000;

/// The engine's clock: wall time that never goes back and takes steps of the
/// wall clock gradually, at most a tenth faster or slower than real time.
pub struct SteadyClock {
    inner: Arc<dyn Clock>,
    last: parking_lot::Mutex<SteadyReading>,
}

struct SteadyReading {
    /// The time last given.
    given: Millis,
    /// The monotonic reading then.
    seen: Millis,
    /// Elapsed milliseconds not yet turned into slew (under `SLEW_PER_MS`),
    /// so that frequent readings still slew.
    carry: Millis,
}

impl SteadyClock {
    /// Starts at the wall clock's time, or at `floor` when that is later (the
    /// latest time the engine already wrote, so a step back while the server
    /// was down does not send its clock back either).
    pub fn new(inner: Arc<dyn Clock>, floor: Millis) -> SteadyClock {
        let wall = inner.now_ms();
        let start = if floor.saturating_sub(wall) > SLEW_MAX_MS { wall } else { wall.max(floor) };
        let monotonic = inner.monotonic_ms();
        SteadyClock { inner, last: parking_lot::Mutex::new(SteadyReading { given: start, seen: monotonic, carry: 0 }) }
    }
}

impl Clock for SteadyClock {
    fn now_ms(&self) -> Millis {
        let wall = self.inner.now_ms();
        let monotonic = self.inner.monotonic_ms();
        let mut last = self.last.lock();
        let elapsed = (monotonic - last.seen).max(0);
        let predicted = last.given.saturating_add(elapsed);
        let drift = wall.saturating_sub(predicted);
        let now = if drift.abs() <= STEP_MS {
            last.carry = 0;
            wall.max(last.given)
        } else if drift.abs() > SLEW_MAX_MS {
            last.carry = 0;
            wall
        } else {
            let budget = elapsed.saturating_add(last.carry);
            last.carry = budget % SLEW_PER_MS;
            let slew = budget / SLEW_PER_MS;
            predicted.saturating_add(drift.clamp(-slew, slew)).max(last.given)
        };
        last.given = now;
        last.seen = monotonic;
        now
    }

    fn monotonic_ms(&self) -> Millis {
        self.inner.monotonic_ms()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steady(manual: &ManualClock) -> SteadyClock {
        SteadyClock::new(Arc::new(manual.clone()), 0)
    }

    #[test]
    fn it_follows_the_wall_clock_while_it_does_not_step() {
        let manual = ManualClock::new(1_000_000);
        let clock = steady(&manual);
        assert_eq!(clock.now_ms(), 1_000_000);
        manual.advance_ms(250);
        assert_eq!(clock.now_ms(), 1_000_250);
        manual.step_wall_ms(400);
        assert_eq!(clock.now_ms(), 1_000_650, "small corrections are taken at once");
        manual.step_wall_ms(-300);
        assert_eq!(clock.now_ms(), 1_000_650, "it never goes back");
        manual.advance_ms(500);
        assert_eq!(clock.now_ms(), 1_000_850);
    }

    #[test]
    fn a_step_forward_is_taken_a_tenth_faster_than_real_time() {
        let manual = ManualClock::new(0);
        let clock = steady(&manual);
        manual.step_wall_ms(3_600_000);
        assert_eq!(clock.now_ms(), 0);
        // Read every millisecond for ten seconds: frequent readings slew too.
        for _ in 0..10_000 {
            manual.advance_ms(1);
            clock.now_ms();
        }
        assert_eq!(clock.now_ms(), 11_000);
        manual.advance_ms(36_000_000);
        assert_eq!(clock.now_ms(), manual.now_ms(), "after ten hours it has caught up");
    }

    #[test]
    fn a_step_back_is_taken_a_tenth_slower_than_real_time() {
        let manual = ManualClock::new(10_000_000);
        let clock = steady(&manual);
        manual.step_wall_ms(-3_600_000);
        assert_eq!(clock.now_ms(), 10_000_000);
        manual.advance_ms(30_000);
        assert_eq!(clock.now_ms(), 10_027_000, "time goes on, a tenth slower");
        manual.advance_ms(40_000_000);
        assert_eq!(clock.now_ms(), manual.now_ms());
    }

    #[test]
    fn a_step_of_more_than_a_day_is_taken_at_once() {
        let manual = ManualClock::new(100 * 86_400_000);
        let clock = steady(&manual);
        manual.step_wall_ms(-2 * 86_400_000);
        assert_eq!(clock.now_ms(), 98 * 86_400_000);
        manual.step_wall_ms(3 * 86_400_000);
        assert_eq!(clock.now_ms(), 101 * 86_400_000);
        let restarted = SteadyClock::new(Arc::new(manual.clone()), 200 * 86_400_000);
        assert_eq!(restarted.now_ms(), 101 * 86_400_000, "a floor that far ahead was a wrong clock");
    }

    #[test]
    fn it_starts_no_earlier_than_its_floor() {
        let manual = ManualClock::new(5_000);
        let clock = SteadyClock::new(Arc::new(manual.clone()), 3_605_000);
        assert_eq!(clock.now_ms(), 3_605_000);
        manual.advance_ms(1_000);
        assert_eq!(clock.now_ms(), 3_605_900);
    }
}
