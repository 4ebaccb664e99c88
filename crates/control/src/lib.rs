//! Protego's control plane on one node: the configuration file (`protego up --config FILE`,
//! swanctl.conf vocabulary), the control loop that drives the sans-IO IKEv2 engine (RFC 7296)
//! and applies its CHILD_SAs to a data path, the key log, and the status API served on a Unix
//! socket to `protego status`.
//!
//! Start-up order for a node:
//! 1. [`Config::load`] validates the whole file (nothing starts on an error);
//! 2. the data plane starts with [`Config::dataplane`] and a `ToControl` channel;
//! 3. [`ControlPlane::start`] runs the control loop against the data path;
//! 4. [`StatusServer::start`] serves [`Responder`] on [`config::Gateway::control_socket`].
//!
//! Shutdown runs the other way: stop the status server, [`ControlPlane::shutdown`] (DELETEs to
//! every peer, bounded wait), then stop the data plane.

pub mod applied;
pub mod config;
mod error;
pub mod filters;
mod keylog;
pub mod routes;
pub mod runtime;
pub mod status;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use config::Config;
pub use error::{ConfigError, Error};
pub use keylog::{ESP_TABLE, IKE_TABLE};
pub use runtime::{ApplyOutcome, ApplyRequest, ControlHandle, ControlPlane};
pub use status::{Responder, StatusReport, StatusServer, WorkerStatus};
