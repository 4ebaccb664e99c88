//! The Nonce payload (RFC 7296 §3.9).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Next Payload  |C|  RESERVED   |         Payload Length        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~                            Nonce Data                         ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! "The size of the Nonce Data MUST be between 16 and 256 octets, inclusive" (§3.9); the codec
//! enforces it.

use super::IkeWireError;

/// Smallest nonce RFC 7296 §3.9 allows.
pub const MIN_NONCE_LEN: usize = 16;
/// Largest nonce RFC 7296 §3.9 allows.
pub const MAX_NONCE_LEN: usize = 256;

/// A Nonce payload body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoncePayload {
    /// The nonce.
    pub data: Vec<u8>,
}

impl NoncePayload {
    /// Parses a payload body.
    pub fn parse(body: &[u8]) -> Result<Self, IkeWireError> {
        // RFC 7296 §3.9: the size of the Nonce Data MUST be between 16 and 256 octets.
        if !(MIN_NONCE_LEN..=MAX_NONCE_LEN).contains(&body.len()) {
            return Err(IkeWireError::BadLength {
                what: "nonce",
                length: body.len(),
            });
        }
        Ok(Self {
            data: body.to_vec(),
        })
    }
    /// Appends the body.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.data);
    }
    /// Encoded body length.
    pub fn buffer_len(&self) -> usize {
        self.data.len()
    }
}
