//! The error type of the ESP crate: one variant per reason a packet is not sealed or
//! opened, each carrying the SPI and, once known, the sequence number, so callers can count
//! and log drops without further context. [`EspError::reason`] maps to the SA counters.

use wire::error::WireError;
use wire::ip::IpProtocol;
use wire::EspSpi;

use crate::counters::DropReason;

/// Everything that can go wrong in an ESP SA.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EspError {
    /// The packet is shorter than the ESP header, IV, minimal trailer and ICV.
    #[error("spi {spi:?}: packet of {len} bytes is shorter than the minimum {min}")]
    Truncated {
        /// The SPI, if the packet holds one.
        spi: Option<EspSpi>,
        /// Packet length.
        len: usize,
        /// Minimum length for this SA.
        min: usize,
    },
    /// The packet's SPI is not this SA's (the caller looked up the wrong SA).
    #[error("packet for spi {got} given to spi {expected}")]
    SpiMismatch {
        /// This SA's SPI.
        expected: EspSpi,
        /// The packet's SPI.
        got: EspSpi,
    },
    /// Sequence number 0, or an extended number whose high-order bits cannot be inferred
    /// (RFC 4303 Appendix A2.2); `seq` is the 32 bits from the packet. Outbound: a number
    /// given to `OutboundSa::seal_with_seq` that `allocate` cannot have returned (0 or past
    /// the SA's limit).
    #[error("spi {spi}: invalid sequence number {seq}")]
    InvalidSequence {
        /// The SA.
        spi: EspSpi,
        /// The sequence number (low 32 bits as received, or the full number).
        seq: u64,
    },
    /// Below the anti-replay window (RFC 4303 §3.4.3).
    #[error("spi {spi}: sequence number {seq} is below the window (top {top})")]
    TooOld {
        /// The SA.
        spi: EspSpi,
        /// The (inferred) sequence number.
        seq: u64,
        /// The highest sequence number accepted.
        top: u64,
    },
    /// Already received (RFC 4303 §3.4.3).
    #[error("spi {spi}: sequence number {seq} replayed")]
    Replayed {
        /// The SA.
        spi: EspSpi,
        /// The sequence number.
        seq: u64,
    },
    /// The ICV did not verify (RFC 4303 §3.4.4): forged, corrupted, or the high-order ESN
    /// bits were inferred wrongly.
    #[error("spi {spi}: integrity check failed for sequence number {seq}")]
    Authentication {
        /// The SA.
        spi: EspSpi,
        /// The sequence number used in the check.
        seq: u64,
    },
    /// The ciphertext is not a multiple of the cipher's block size.
    #[error("spi {spi}: ciphertext of {len} bytes is not a multiple of {block} (seq {seq})")]
    CiphertextLength {
        /// The SA.
        spi: EspSpi,
        /// The sequence number.
        seq: u64,
        /// Ciphertext length.
        len: usize,
        /// Block size.
        block: usize,
    },
    /// Pad Length exceeds the payload, or the padding bytes are not 1, 2, 3, ...
    /// (RFC 4303 §2.4).
    #[error("spi {spi}: bad padding (pad length {pad_len}) in sequence number {seq}")]
    BadPadding {
        /// The SA.
        spi: EspSpi,
        /// The sequence number.
        seq: u64,
        /// The Pad Length field.
        pad_len: u8,
    },
    /// Next Header is not IPv4 (4), IPv6 (41) or no-next-header (59) in tunnel mode.
    #[error("spi {spi}: unexpected next header {next_header} in sequence number {seq}")]
    UnexpectedNextHeader {
        /// The SA.
        spi: EspSpi,
        /// The sequence number.
        seq: u64,
        /// The Next Header field.
        next_header: IpProtocol,
    },
    /// The inner packet does not parse as the IP version the Next Header names.
    #[error("spi {spi}: inner packet of sequence number {seq} is malformed: {source}")]
    MalformedInner {
        /// The SA.
        spi: EspSpi,
        /// The sequence number.
        seq: u64,
        /// What is wrong with it.
        source: WireError,
    },
    /// Every outbound sequence number has been used; the SA must be replaced
    /// (RFC 4303 §3.3.3).
    #[error("spi {spi}: sequence numbers exhausted")]
    SequenceExhausted {
        /// The SA.
        spi: EspSpi,
    },
    /// The caller's buffer cannot hold the sealed packet.
    #[error("spi {spi}: buffer of {got} bytes, sealing needs {need}")]
    BufferTooSmall {
        /// The SA.
        spi: EspSpi,
        /// Bytes needed.
        need: usize,
        /// Bytes given.
        got: usize,
    },
    /// The packet to seal is not IPv4 or IPv6 (`version` is its first nibble; 0 if empty).
    #[error("spi {spi}: inner packet has IP version {version}")]
    InnerNotIp {
        /// The SA.
        spi: EspSpi,
        /// The version nibble.
        version: u8,
    },
    /// The cipher failed for a reason other than authentication (a length it rejects).
    #[error("spi {spi}: cipher error: {source}")]
    Crypto {
        /// The SA.
        spi: EspSpi,
        /// The cipher's error.
        source: crypto::Error,
    },
    /// An SA was configured with a value outside what this implementation accepts.
    #[error("spi {spi}: invalid {field}: {reason}")]
    InvalidConfig {
        /// The SA.
        spi: EspSpi,
        /// The configuration field.
        field: &'static str,
        /// Why it is invalid.
        reason: &'static str,
    },
}

impl EspError {
    /// The drop counter this error increments; `None` for configuration errors, which
    /// concern no packet.
    pub fn reason(&self) -> Option<DropReason> {
        Some(match self {
            Self::Truncated { .. } => DropReason::Truncated,
            Self::SpiMismatch { .. } => DropReason::SpiMismatch,
            Self::InvalidSequence { .. } => DropReason::InvalidSequence,
            Self::TooOld { .. } => DropReason::TooOld,
            Self::Replayed { .. } => DropReason::Replayed,
            Self::Authentication { .. } => DropReason::Authentication,
            Self::CiphertextLength { .. } => DropReason::CiphertextLength,
            Self::BadPadding { .. } => DropReason::BadPadding,
            Self::UnexpectedNextHeader { .. } => DropReason::UnexpectedNextHeader,
            Self::MalformedInner { .. } => DropReason::MalformedInner,
            Self::SequenceExhausted { .. } => DropReason::SequenceExhausted,
            Self::BufferTooSmall { .. } => DropReason::BufferTooSmall,
            Self::InnerNotIp { .. } => DropReason::InnerNotIp,
            Self::Crypto { .. } => DropReason::Crypto,
            Self::InvalidConfig { .. } => return None,
        })
    }
}
