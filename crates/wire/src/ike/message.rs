//! A whole IKEv2 message: header and payload chain (RFC 7296 §3.1, §3.2), with the Encrypted
//! payload located but not decrypted.

use super::{
    payload::{chain_len, emit_chain, parse_chain, Encrypted, Payload},
    Header, IkeWireError, NotifyPayload, NotifyType, PayloadType,
};

/// A parsed message. `payloads` are the unencrypted payloads; when the message carries an
/// Encrypted payload, `encrypted` locates it for the engine to decrypt (then parse the inner
/// chain with [`parse_chain`](super::parse_chain) starting at `encrypted.next_inner`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The header.
    pub header: Header,
    /// Unencrypted payloads, in order.
    pub payloads: Vec<Payload>,
    /// The Encrypted payload, if any.
    pub encrypted: Option<Encrypted>,
}

impl Message {
    /// Parses a datagram. The header's Length must equal the datagram's length and the major
    /// version must be 2 (RFC 7296 §2.5; the caller answers INVALID_MAJOR_VERSION after reading
    /// the header with [`Header::parse`] when it wants to).
    pub fn parse(data: &[u8]) -> Result<Self, IkeWireError> {
        let header = Header::parse(data)?;
        if header.major != 2 {
            return Err(IkeWireError::UnsupportedVersion {
                major: header.major,
            });
        }
        if header.length as usize != data.len() {
            return Err(IkeWireError::BadLength {
                what: "IKE message",
                length: header.length as usize,
            });
        }
        let (payloads, encrypted) =
            parse_chain(header.next_payload, &data[Header::LEN..], Header::LEN, true)?;
        Ok(Self {
            header,
            payloads,
            encrypted,
        })
    }

    /// Appends an unencrypted message (the `encrypted` field must be `None`; use
    /// [`emit_encrypted`](super::emit_encrypted) for protected messages). Sets the header's
    /// Next Payload and Length fields in the output.
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), IkeWireError> {
        if self.encrypted.is_some() {
            return Err(IkeWireError::InvalidValue {
                what: "emit of a message with an Encrypted payload",
                value: 0,
            });
        }
        let mut h = self.header;
        h.next_payload = self.payloads.first().map_or(PayloadType::NONE, Payload::ty);
        let len = self.buffer_len();
        h.length = u32::try_from(len).map_err(|_| IkeWireError::BadLength {
            what: "IKE message",
            length: len,
        })?;
        h.emit(out);
        emit_chain(&self.payloads, PayloadType::NONE, out)?;
        Ok(())
    }

    /// Encoded length of an unencrypted message.
    pub fn buffer_len(&self) -> usize {
        Header::LEN + chain_len(&self.payloads)
    }

    /// The first notify of type `ty` among `payloads`.
    pub fn notify(&self, ty: NotifyType) -> Option<&NotifyPayload> {
        find_notify(&self.payloads, ty)
    }
}

/// The first notify of type `ty` in a payload list.
pub fn find_notify(payloads: &[Payload], ty: NotifyType) -> Option<&NotifyPayload> {
    payloads.iter().find_map(|p| match p {
        Payload::Notify(n) if n.ty == ty => Some(n),
        _ => None,
    })
}
