//! The error type of the steer node: invalid configuration or tables (each naming the field),
//! sockets that cannot be bound or ports opened, threads that cannot be started. Per-packet problems are never
//! errors: they are drops, counted by [`crate::DropReason`].

use std::net::SocketAddr;

use steer::SteerError;

/// Everything [`crate::SteerNode`] refuses or fails at.
#[derive(Debug, thiserror::Error)]
pub enum SteerNodeError {
    /// The configuration is invalid (checked whole before any socket is opened).
    #[error("invalid steer node configuration {field}: {reason}")]
    Config {
        /// The offending field, e.g. `vips[1]`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A table update is invalid (checked whole before anything changes).
    #[error("invalid steering table {field}: {reason}")]
    Table {
        /// The offending field, e.g. `data_nodes[2]`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A table entry the steering crate rejects (reserved SPI, bad selector, ...).
    #[error("invalid steering table {field}: {source}")]
    Steer {
        /// Where the entry was, e.g. `spis[3]` or `vnis[0].selectors`.
        field: String,
        /// The steering crate's reason.
        source: SteerError,
    },
    /// A socket could not be opened or bound.
    #[error("cannot bind the {role} socket on {addr}: {source}")]
    Bind {
        /// Which socket (`ike`, `natt`, `vxlan`, `geneve`).
        role: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// A customer-facing port's packet socket could not be opened (no such interface, not
    /// Ethernet, no CAP_NET_RAW).
    #[error("cannot open customer-facing port {interface}: {source}")]
    Port {
        /// The interface.
        interface: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The shutdown signal or a thread could not be created.
    #[error("cannot start the steer node ({what}): {source}")]
    Start {
        /// What failed.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

impl SteerNodeError {
    pub(crate) fn config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Config {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn table(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Table {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn steer(field: impl Into<String>, source: SteerError) -> Self {
        Self::Steer {
            field: field.into(),
            source,
        }
    }
}
