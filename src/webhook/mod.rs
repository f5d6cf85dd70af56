//! Webhooks (docs/api.md, "Webhooks"): subscriptions to events, and what a
//! delivery needs that does not depend on the engine: the address guard and
//! the signature.

pub mod client;
pub mod guard;
pub mod pool;
pub mod signature;
pub mod subscription;
pub mod verifier;

pub use guard::{AddressClass, classify};
pub use pool::DeliveryPriority;
pub use signature::sign;
pub use subscription::{Rotation, Subscription, SubscriptionFilter};
