//! Errors of the IKEv2 message codec (RFC 7296 §3).

use super::PayloadType;

/// Why an IKEv2 message or payload could not be parsed or emitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IkeWireError {
    /// A field ran past the end of its enclosing structure.
    #[error("{what}: truncated, needed {needed} bytes, {available} available")]
    Truncated {
        /// The structure being read.
        what: &'static str,
        /// Bytes the field needed.
        needed: usize,
        /// Bytes that were left.
        available: usize,
    },
    /// Bytes were left over after the structure's last field.
    #[error("{what}: {count} trailing bytes")]
    TrailingBytes {
        /// The structure being read.
        what: &'static str,
        /// Number of unread bytes.
        count: usize,
    },
    /// A length field is inconsistent with the structure it describes.
    #[error("{what}: invalid length {length}")]
    BadLength {
        /// The structure whose length is wrong.
        what: &'static str,
        /// The length found (or required when emitting).
        length: usize,
    },
    /// A field holds a value the encoding does not allow.
    #[error("{what}: invalid value {value:#x}")]
    InvalidValue {
        /// The field.
        what: &'static str,
        /// The value found.
        value: u32,
    },
    /// The header carries a major version other than 2 (RFC 7296 §2.5).
    #[error("unsupported IKE major version {major}")]
    UnsupportedVersion {
        /// Major version found.
        major: u8,
    },
    /// A payload this implementation does not understand had the critical bit set
    /// (RFC 7296 §2.5: answer UNSUPPORTED_CRITICAL_PAYLOAD).
    #[error("unsupported critical payload {payload}")]
    UnsupportedCriticalPayload {
        /// The payload type.
        payload: PayloadType,
    },
    /// An Encrypted (SK) payload was not the last payload of the message (RFC 7296 §3.14).
    #[error("encrypted payload is not the last payload")]
    EncryptedNotLast,
    /// An Encrypted payload appeared where it is not allowed (inside another one).
    #[error("nested encrypted payload")]
    NestedEncrypted,
}
