//! The Vendor ID payload (RFC 7296 §3.12).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Next Payload  |C|  RESERVED   |         Payload Length        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~                        Vendor ID (VID)                        ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```

use super::IkeWireError;

/// A Vendor ID payload body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VendorIdPayload {
    /// The vendor ID octets.
    pub data: Vec<u8>,
}

impl VendorIdPayload {
    /// Parses a payload body.
    pub fn parse(body: &[u8]) -> Result<Self, IkeWireError> {
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
