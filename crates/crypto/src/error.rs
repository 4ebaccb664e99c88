//! Errors of the crypto crate.

/// Everything that can go wrong in a cryptographic operation.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// A key of the wrong length was supplied for an algorithm.
    #[error("{alg}: key is {got} bytes, expected {expected}")]
    KeyLength {
        /// The algorithm's name.
        alg: &'static str,
        /// Bytes supplied.
        got: usize,
        /// Bytes required.
        expected: usize,
    },
    /// The integrity check value did not verify (forged, corrupted or wrong key).
    #[error("integrity check failed")]
    Authentication,
    /// A buffer or IV has a length the algorithm cannot process.
    #[error("{what}: length {len} is invalid")]
    Length {
        /// Which input.
        what: &'static str,
        /// Its length.
        len: usize,
    },
    /// The peer's key exchange public value is malformed or not on the curve / in the group.
    #[error("invalid {group} public value ({len} bytes)")]
    PublicValue {
        /// The group's name.
        group: &'static str,
        /// Length of the offending value.
        len: usize,
    },
    /// A combination of transforms that cannot be keyed (e.g. CBC without integrity).
    #[error("unsupported transform combination: {0}")]
    Unsupported(&'static str),
}
