//! Pure ordering structures; time is always an argument, never read here.

mod backoff;
mod ready;
mod timers;

pub use backoff::retry_delay_ms;
pub use ready::{ReadyKey, ReadyQueue};
pub use timers::TimerSet;
