//! The Delete payload (RFC 7296 §3.11).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Next Payload  |C|  RESERVED   |         Payload Length        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Protocol ID   |   SPI Size    |          Num of SPIs          |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~               Security Parameter Index(es) (SPI)              ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! For IKE the SPI size is zero (the SPIs are in the header); for ESP and AH it is four.

use super::{
    codec::{count_u16, Reader},
    IkeWireError, ProtocolId,
};

/// A Delete payload body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletePayload {
    /// IKE, AH or ESP.
    pub protocol: ProtocolId,
    /// The SPIs of the SAs to delete (the sender's inbound SPIs); empty for IKE.
    pub spis: Vec<u32>,
}

impl DeletePayload {
    /// Parses a payload body.
    pub fn parse(body: &[u8]) -> Result<Self, IkeWireError> {
        let mut r = Reader::new(body, "Delete payload");
        let protocol = ProtocolId(r.u8()?);
        let spi_size = r.u8()?;
        let count = usize::from(r.u16()?);
        let mut spis = Vec::new();
        match spi_size {
            // RFC 7296 §3.11: "For an IKE SA, the SPI Size MUST be zero ... the Num of SPIs
            // field MUST be zero" for IKE as well.
            0 if count == 0 => {}
            4 if protocol != ProtocolId::IKE => {
                for _ in 0..count {
                    spis.push(r.u32()?);
                }
            }
            s => {
                return Err(IkeWireError::InvalidValue {
                    what: "delete SPI size",
                    value: u32::from(s),
                })
            }
        }
        r.finish()?;
        Ok(Self { protocol, spis })
    }

    /// Appends the body.
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), IkeWireError> {
        out.push(self.protocol.0);
        out.push(if self.protocol == ProtocolId::IKE {
            0
        } else {
            4
        });
        let n = if self.protocol == ProtocolId::IKE {
            0
        } else {
            self.spis.len()
        };
        out.extend_from_slice(&count_u16(n, "number of SPIs")?.to_be_bytes());
        if self.protocol != ProtocolId::IKE {
            for s in &self.spis {
                out.extend_from_slice(&s.to_be_bytes());
            }
        }
        Ok(())
    }

    /// Encoded body length.
    pub fn buffer_len(&self) -> usize {
        4 + if self.protocol == ProtocolId::IKE {
            0
        } else {
            4 * self.spis.len()
        }
    }
}
