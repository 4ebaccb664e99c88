//! The Notify payload (RFC 7296 §3.10).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Next Payload  |C|  RESERVED   |         Payload Length        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |  Protocol ID  |   SPI Size    |      Notify Message Type      |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~                Security Parameter Index (SPI)                 ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~                       Notification Data                       ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```

use super::{
    codec::{count_u8, Reader},
    IkeWireError, NotifyType, ProtocolId,
};

/// A Notify payload body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyPayload {
    /// Protocol of the SA the notify concerns (NONE / 0 when there is no SPI).
    pub protocol: ProtocolId,
    /// SPI of that SA (empty, or 4 bytes for ESP/AH; 8 possible for IKE).
    pub spi: Vec<u8>,
    /// Notify message type.
    pub ty: NotifyType,
    /// Notification data.
    pub data: Vec<u8>,
}

impl NotifyPayload {
    /// A notify without SPI.
    pub fn new(ty: NotifyType, data: Vec<u8>) -> Self {
        Self {
            protocol: ProtocolId::NONE,
            spi: Vec::new(),
            ty,
            data,
        }
    }

    /// Parses a payload body.
    pub fn parse(body: &[u8]) -> Result<Self, IkeWireError> {
        let mut r = Reader::new(body, "Notify payload");
        let protocol = ProtocolId(r.u8()?);
        let spi_size = usize::from(r.u8()?);
        let ty = NotifyType(r.u16()?);
        let spi = r.take(spi_size)?.to_vec();
        Ok(Self {
            protocol,
            spi,
            ty,
            data: r.rest().to_vec(),
        })
    }

    /// Appends the body.
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), IkeWireError> {
        out.push(self.protocol.0);
        out.push(count_u8(self.spi.len(), "notify SPI size")?);
        out.extend_from_slice(&self.ty.0.to_be_bytes());
        out.extend_from_slice(&self.spi);
        out.extend_from_slice(&self.data);
        Ok(())
    }

    /// Encoded body length.
    pub fn buffer_len(&self) -> usize {
        4 + self.spi.len() + self.data.len()
    }

    /// The SPI as a 4-byte ESP/AH SPI, if it is one.
    pub fn spi_u32(&self) -> Option<u32> {
        <[u8; 4]>::try_from(self.spi.as_slice())
            .ok()
            .map(u32::from_be_bytes)
    }
}
