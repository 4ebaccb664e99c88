//! The error type of the packet views and builders in this crate (`WireError`).
//!
//! Kept generic on purpose: every variant names *what* was being parsed or built (a static
//! protocol/structure name such as `"ipv4"` or `"vxlan"`) and, where useful, the field, so a
//! caller can count drops by variant and log a precise reason without any allocation.

/// Everything that can go wrong when viewing, parsing or emitting a wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum WireError {
    /// The input ends before the structure does.
    #[error("{what}: truncated, need {need} bytes, got {got}")]
    Truncated {
        /// The structure being read (`"ipv4"`, `"udp"`, ...).
        what: &'static str,
        /// Bytes the structure needs.
        need: usize,
        /// Bytes available.
        got: usize,
    },
    /// A field holds a value the specification forbids (or that contradicts another field).
    #[error("{what}: invalid {field}")]
    Malformed {
        /// The structure being read.
        what: &'static str,
        /// The offending field.
        field: &'static str,
    },
    /// A field holds a legal value this implementation does not handle.
    #[error("{what}: unsupported {field} {value:#x}")]
    Unsupported {
        /// The structure being read.
        what: &'static str,
        /// The field.
        field: &'static str,
        /// Its value.
        value: u32,
    },
    /// A checksum did not verify.
    #[error("{what}: bad checksum")]
    Checksum {
        /// The structure whose checksum failed.
        what: &'static str,
    },
    /// The caller's output buffer cannot hold what is to be emitted.
    #[error("{what}: output buffer too small, need {need} bytes, got {got}")]
    BufferTooSmall {
        /// The structure being written.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        got: usize,
    },
}
