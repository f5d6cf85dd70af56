//! Webhooks (docs/api.md, "Webhooks"): subscriptions to events, and what a
//! delivery needs that does not depend on the engine: the address guard,
//! the signature and the client that sends one attempt. The engine's
//! webhooks feature (`engine/webhooks/`) keeps the outbox and runs the pool.

#[cfg(feature = "webhooks")]
pub mod client;
pub mod guard;
pub mod signature;
pub mod subscription;
#[cfg(feature = "webhooks")]
pub mod verifier;

pub use guard::{AddressClass, classify};
pub use signature::sign;
pub use subscription::{Rotation, Subscription, SubscriptionFilter};

/// How the delivery thread shares the CPU with job operations
/// (`webhooks.priority`; docs/api.md, "Deliveries").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum DeliveryPriority {
    /// Linux's idle scheduling class: the CPU time nothing else wants, so
    /// deliveries slow job operations the least, but stop altogether while
    /// other work keeps every core busy (as workers beside the server do).
    Idle,
    /// Nice 10: deliveries keep a small share of a busy core (about a tenth
    /// against one busy thread at nice 0), so they slow down a lot but never
    /// stop when the host is loaded.
    Low,
    /// The server's own priority (the default): the delivery thread takes
    /// its share of the CPU like any other thread, so subscribers keep up
    /// best on a loaded host (docs/perf-log.md, "The delivery thread's
    /// priority").
    #[default]
    Normal,
}
