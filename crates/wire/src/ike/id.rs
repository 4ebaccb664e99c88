//! The Identification payloads IDi and IDr (RFC 7296 §3.5).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Next Payload  |C|  RESERVED   |         Payload Length        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |   ID Type     |                 RESERVED                      |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~                   Identification Data                         ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```

use super::{codec::Reader, IdType, IkeWireError};

/// An ID payload body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdPayload {
    /// ID type.
    pub id_type: IdType,
    /// Identification data.
    pub data: Vec<u8>,
}

impl IdPayload {
    /// Parses a payload body.
    pub fn parse(body: &[u8]) -> Result<Self, IkeWireError> {
        let mut r = Reader::new(body, "ID payload");
        let id_type = IdType(r.u8()?);
        let _reserved = r.take(3)?;
        Ok(Self {
            id_type,
            data: r.rest().to_vec(),
        })
    }
    /// Appends the body. The body (without the generic header) is also what the AUTH
    /// computation signs as `IDi'` / `IDr'` (RFC 7296 §2.15).
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.push(self.id_type.0);
        out.extend_from_slice(&[0, 0, 0]);
        out.extend_from_slice(&self.data);
    }
    /// The encoded body as a new vector.
    pub fn body(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.buffer_len());
        self.emit(&mut v);
        v
    }
    /// Encoded body length.
    pub fn buffer_len(&self) -> usize {
        4 + self.data.len()
    }
}
