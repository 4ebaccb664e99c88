//! The IKE header (RFC 7296 §3.1).
//!
//! ```text
//!                      1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                       IKE SA Initiator's SPI                  |
//! |                                                               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                       IKE SA Responder's SPI                  |
//! |                                                               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |  Next Payload | MjVer | MnVer | Exchange Type |     Flags     |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                          Message ID                           |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                            Length                             |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```

use super::{codec::Reader, ExchangeType, IkeWireError, PayloadType};
use crate::IkeSpi;

/// The IKE header flags octet (RFC 7296 §3.1): `X X R V I X X X`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Flags(pub u8);

impl Flags {
    /// I (Initiator): set in messages sent by the original initiator of the IKE SA.
    pub const INITIATOR: u8 = 0x08;
    /// V (Version): the sender could speak a higher major version. MUST be 0 for IKEv2.
    pub const VERSION: u8 = 0x10;
    /// R (Response): this message is a response to a message with the same Message ID.
    pub const RESPONSE: u8 = 0x20;

    /// Flags for a message from the original initiator (`initiator`) that is or is not a
    /// response.
    pub fn new(initiator: bool, response: bool) -> Self {
        let mut v = 0;
        if initiator {
            v |= Self::INITIATOR;
        }
        if response {
            v |= Self::RESPONSE;
        }
        Self(v)
    }
    /// The I bit.
    pub fn initiator(self) -> bool {
        self.0 & Self::INITIATOR != 0
    }
    /// The R bit.
    pub fn response(self) -> bool {
        self.0 & Self::RESPONSE != 0
    }
}

/// The fixed IKE header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// IKE SA Initiator's SPI.
    pub ispi: IkeSpi,
    /// IKE SA Responder's SPI (zero in the first IKE_SA_INIT request).
    pub rspi: IkeSpi,
    /// Type of the first payload.
    pub next_payload: PayloadType,
    /// Major version (2).
    pub major: u8,
    /// Minor version (0).
    pub minor: u8,
    /// Exchange type.
    pub exchange: ExchangeType,
    /// Flags.
    pub flags: Flags,
    /// Message ID.
    pub message_id: u32,
    /// Total length of the message (header and payloads) in octets.
    pub length: u32,
}

impl Header {
    /// Encoded length of the header.
    pub const LEN: usize = 28;

    /// A version 2.0 header; `next_payload` and `length` are set when the message is emitted.
    pub fn new(
        ispi: IkeSpi,
        rspi: IkeSpi,
        exchange: ExchangeType,
        flags: Flags,
        message_id: u32,
    ) -> Self {
        Self {
            ispi,
            rspi,
            next_payload: PayloadType::NONE,
            major: 2,
            minor: 0,
            exchange,
            flags,
            message_id,
            length: 0,
        }
    }

    /// Parses the first 28 bytes of `data` (any version; callers check [`Header::major`]).
    pub fn parse(data: &[u8]) -> Result<Self, IkeWireError> {
        let mut r = Reader::new(data, "IKE header");
        let ispi = IkeSpi(r.u64()?);
        let rspi = IkeSpi(r.u64()?);
        let next_payload = PayloadType(r.u8()?);
        let ver = r.u8()?;
        let exchange = ExchangeType(r.u8()?);
        let flags = Flags(r.u8()?);
        let message_id = r.u32()?;
        let length = r.u32()?;
        Ok(Self {
            ispi,
            rspi,
            next_payload,
            major: ver >> 4,
            minor: ver & 0x0f,
            exchange,
            flags,
            message_id,
            length,
        })
    }

    /// Appends the header as it stands (with its `next_payload` and `length`).
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.ispi.0.to_be_bytes());
        out.extend_from_slice(&self.rspi.0.to_be_bytes());
        out.push(self.next_payload.0);
        out.push((self.major << 4) | (self.minor & 0x0f));
        out.push(self.exchange.0);
        out.push(self.flags.0);
        out.extend_from_slice(&self.message_id.to_be_bytes());
        out.extend_from_slice(&self.length.to_be_bytes());
    }

    /// Encoded length.
    pub fn buffer_len(&self) -> usize {
        Self::LEN
    }
}
