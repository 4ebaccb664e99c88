//! The Key Exchange payload (RFC 7296 §3.4).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Next Payload  |C|  RESERVED   |         Payload Length        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |   Diffie-Hellman Group Num    |           RESERVED            |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~                       Key Exchange Data                       ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```

use super::{codec::Reader, IkeWireError};

/// A KE payload body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KePayload {
    /// Key exchange method (Diffie-Hellman group number).
    pub group: u16,
    /// The public value.
    pub data: Vec<u8>,
}

impl KePayload {
    /// Parses a payload body.
    pub fn parse(body: &[u8]) -> Result<Self, IkeWireError> {
        let mut r = Reader::new(body, "KE payload");
        let group = r.u16()?;
        let _reserved = r.u16()?;
        Ok(Self {
            group,
            data: r.rest().to_vec(),
        })
    }
    /// Appends the body.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.group.to_be_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&self.data);
    }
    /// Encoded body length.
    pub fn buffer_len(&self) -> usize {
        4 + self.data.len()
    }
}
