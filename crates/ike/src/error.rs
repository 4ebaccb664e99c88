//! Errors of the IKE engine. Peer misbehaviour, peer incompatibility and local policy are kept
//! apart; each maps to the notify RFC 7296 prescribes ([`Error::notify`]).

use crate::TunnelId;
use crypto::DhGroup;
use wire::ike::{IkeWireError, NotifyType, PayloadType};
use wire::{EspSpi, IkeSpi};

/// An error of the IKE engine or its configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // ---- configuration and API use (local) ----
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
    /// The tunnel has no remote address to initiate to.
    #[error("tunnel {0:?} has no remote address to initiate to")]
    NoRemoteAddress(TunnelId),
    /// The tunnel has no established IKE SA for the requested operation.
    #[error("tunnel {0:?} has no established IKE SA")]
    NotEstablished(TunnelId),
    /// No installed CHILD_SA has this inbound SPI.
    #[error("no CHILD_SA with inbound SPI {0}")]
    UnknownChildSa(EspSpi),
    /// Snapshot bytes could not be restored.
    #[error("invalid IKE SA snapshot: {0}")]
    Snapshot(&'static str),
    /// An IKE SA with the snapshot's SPI already exists.
    #[error("IKE SA {0} already exists")]
    DuplicateSa(IkeSpi),

    // ---- peer misbehaviour ----
    /// A message could not be decoded.
    #[error("malformed message on IKE SA {spi}: {source}")]
    Malformed {
        /// Our SPI of the IKE SA (0 before one exists).
        spi: IkeSpi,
        /// The codec error.
        #[source]
        source: IkeWireError,
    },
    /// A message decoded but lacks, duplicates or misplaces payloads for its exchange.
    #[error("invalid {exchange} message on IKE SA {spi}: {what}")]
    InvalidSyntax {
        /// Our SPI of the IKE SA.
        spi: IkeSpi,
        /// The exchange.
        exchange: &'static str,
        /// What is wrong.
        what: &'static str,
    },
    /// A cryptographic operation on peer input failed (bad public value, bad ICV).
    #[error("crypto failure on IKE SA {spi}: {source}")]
    Crypto {
        /// Our SPI of the IKE SA.
        spi: IkeSpi,
        /// The crypto error.
        #[source]
        source: crypto::Error,
    },

    // ---- peer incompatibility ----
    /// An unknown payload was marked critical.
    #[error("unsupported critical payload {0}")]
    UnsupportedCriticalPayload(PayloadType),
    /// None of the peer's proposals is acceptable.
    #[error("no acceptable {what} proposal")]
    NoProposalChosen {
        /// `IKE` or `ESP`.
        what: &'static str,
    },
    /// The peer's KE payload uses another group than the selected proposal.
    #[error("KE payload group is not the selected {wanted:?}")]
    InvalidKePayload {
        /// The group we want.
        wanted: DhGroup,
    },
    /// The traffic selectors do not intersect our configuration.
    #[error("traffic selectors unacceptable")]
    TsUnacceptable,

    // ---- local policy ----
    /// The peer's identity, PSK or proposal does not satisfy any configured tunnel.
    #[error("authentication failed: {0}")]
    AuthenticationFailed(&'static str),
    /// The CHILD_SA to rekey does not exist.
    #[error("CHILD_SA {0} not found")]
    ChildSaNotFound(EspSpi),
    /// The request collides with an exchange in progress; the peer should retry later.
    #[error("temporary failure: {0}")]
    TemporaryFailure(&'static str),
    /// The tunnel holds as many per-resource CHILD_SAs as it accepts (RFC 9611 §3.2).
    #[error("the tunnel holds its most per-resource CHILD_SAs ({0})")]
    TsMaxQueue(u32),
}

impl Error {
    /// The notify (RFC 7296 §3.10.1) that answers a request failing with this error, if any.
    /// Local configuration and API errors have none.
    pub fn notify(&self) -> Option<NotifyType> {
        match self {
            Error::Config { .. }
            | Error::UnknownTunnel(_)
            | Error::NoRemoteAddress(_)
            | Error::NotEstablished(_)
            | Error::UnknownChildSa(_)
            | Error::Snapshot(_)
            | Error::DuplicateSa(_) => None,
            Error::Malformed {
                source: IkeWireError::UnsupportedCriticalPayload { .. },
                ..
            } => Some(NotifyType::UNSUPPORTED_CRITICAL_PAYLOAD),
            Error::Malformed { .. } | Error::InvalidSyntax { .. } => {
                Some(NotifyType::INVALID_SYNTAX)
            }
            // A bad public value is a malformed KE payload; a bad ICV is never answered (dropped
            // before this mapping is consulted).
            Error::Crypto { .. } => Some(NotifyType::INVALID_SYNTAX),
            Error::UnsupportedCriticalPayload(_) => Some(NotifyType::UNSUPPORTED_CRITICAL_PAYLOAD),
            Error::NoProposalChosen { .. } => Some(NotifyType::NO_PROPOSAL_CHOSEN),
            Error::InvalidKePayload { .. } => Some(NotifyType::INVALID_KE_PAYLOAD),
            Error::TsUnacceptable => Some(NotifyType::TS_UNACCEPTABLE),
            Error::AuthenticationFailed(_) => Some(NotifyType::AUTHENTICATION_FAILED),
            Error::ChildSaNotFound(_) => Some(NotifyType::CHILD_SA_NOT_FOUND),
            Error::TemporaryFailure(_) => Some(NotifyType::TEMPORARY_FAILURE),
            Error::TsMaxQueue(_) => Some(NotifyType::TS_MAX_QUEUE),
        }
    }

    /// The notification data that goes with [`notify`](Self::notify): the wanted group for
    /// INVALID_KE_PAYLOAD (RFC 7296 §3.10.1), the payload type for UNSUPPORTED_CRITICAL_PAYLOAD.
    pub fn notify_data(&self) -> Vec<u8> {
        match self {
            Error::InvalidKePayload { wanted } => wanted.id().0.to_be_bytes().to_vec(),
            Error::UnsupportedCriticalPayload(p)
            | Error::Malformed {
                source: IkeWireError::UnsupportedCriticalPayload { payload: p },
                ..
            } => vec![p.0],
            _ => Vec::new(),
        }
    }
}
