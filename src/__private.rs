//! The modules behind the `svc` binary, gathered under one hidden name (see
//! `lib.rs`). Their files stay where the module map in ARCHITECTURE.md puts
//! them; the crate itself names them from its root, as `crate::http`.

#[cfg(feature = "server")]
#[path = "config.rs"]
pub mod config;
#[cfg(feature = "server")]
#[path = "http/mod.rs"]
pub mod http;
#[path = "limits.rs"]
pub mod limits;
#[cfg(feature = "server")]
#[path = "logging.rs"]
pub mod logging;
#[path = "metrics.rs"]
pub mod metrics;
#[path = "schedule/mod.rs"]
pub mod schedule;
#[cfg(feature = "server")]
#[path = "server.rs"]
pub mod server;
#[path = "wire.rs"]
pub mod wire;
