//! The Authentication payload (RFC 7296 §3.8).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Next Payload  |C|  RESERVED   |         Payload Length        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Auth Method   |                RESERVED                       |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~                      Authentication Data                      ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```

use super::{codec::Reader, AuthMethod, IkeWireError};

/// An AUTH payload body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthPayload {
    /// Authentication method.
    pub method: AuthMethod,
    /// Authentication data.
    pub data: Vec<u8>,
}

impl AuthPayload {
    /// Parses a payload body.
    pub fn parse(body: &[u8]) -> Result<Self, IkeWireError> {
        let mut r = Reader::new(body, "AUTH payload");
        let method = AuthMethod(r.u8()?);
        let _reserved = r.take(3)?;
        Ok(Self {
            method,
            data: r.rest().to_vec(),
        })
    }
    /// Appends the body.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.push(self.method.0);
        out.extend_from_slice(&[0, 0, 0]);
        out.extend_from_slice(&self.data);
    }
    /// Encoded body length.
    pub fn buffer_len(&self) -> usize {
        4 + self.data.len()
    }
}
