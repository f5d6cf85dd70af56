//! Pure ordering structures; time is always an argument, never read here.

mod backoff;
mod dispatch;
mod ready;
mod timers;

pub use backoff::{failure_outcome, retry_delay_ms, timeout_outcome};
pub use dispatch::{DispatchTable, Taken};
pub use ready::{KeyedReady, ReadyKey, ReadyQueue};
pub use timers::TimerSet;
