//! Errors of the IKE engine. Peer misbehaviour, peer incompatibility and local policy are kept
//! apart; each maps to the notify the RFC prescribes.

/// An error of the IKE engine or its configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value could not be parsed.
    #[error("invalid {what} {value:?}: {reason}")]
    Config {
        /// What was being parsed (`proposal`, `identity`, `traffic selector`...).
        what: &'static str,
        /// The offending text.
        value: String,
        /// Why it is invalid.
        reason: String,
    },
    /// The tunnel id is not configured.
    #[error("unknown tunnel {0:?}")]
    UnknownTunnel(crate::TunnelId),
}
