//! The generic payload header and payload chains (RFC 7296 §3.2).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Next Payload  |C|  RESERVED   |         Payload Length        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! Payloads form a chain: each generic header names the type of the payload after it. The
//! Encrypted (SK) payload is last and its Next Payload field names the first payload inside
//! it (§3.14). Unknown payloads are kept as [`Payload::Unknown`] and skipped by the engine;
//! an unknown payload with the critical bit set fails the parse with
//! [`IkeWireError::UnsupportedCriticalPayload`] (§2.5).

use super::{
    codec::{LenField, Reader},
    AuthPayload, DeletePayload, IdPayload, IkeWireError, KePayload, NoncePayload, NotifyPayload,
    PayloadType, SaPayload, TsPayload, VendorIdPayload,
};
use core::ops::Range;

/// The critical bit in the generic payload header.
const CRITICAL: u8 = 0x80;

/// A payload this codec does not interpret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPayload {
    /// Its type.
    pub ty: PayloadType,
    /// The critical bit as received.
    pub critical: bool,
    /// The body.
    pub body: Vec<u8>,
}

/// One decoded payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// Security Association.
    Sa(SaPayload),
    /// Key Exchange.
    Ke(KePayload),
    /// Identification - Initiator.
    IdI(IdPayload),
    /// Identification - Responder.
    IdR(IdPayload),
    /// Authentication.
    Auth(AuthPayload),
    /// Nonce.
    Nonce(NoncePayload),
    /// Notify.
    Notify(NotifyPayload),
    /// Delete.
    Delete(DeletePayload),
    /// Vendor ID.
    VendorId(VendorIdPayload),
    /// Traffic Selector - Initiator.
    TsI(TsPayload),
    /// Traffic Selector - Responder.
    TsR(TsPayload),
    /// Anything else (CERT, CERTREQ, CP, EAP, unknown types).
    Unknown(UnknownPayload),
}

impl Payload {
    /// The payload type.
    pub fn ty(&self) -> PayloadType {
        match self {
            Self::Sa(_) => PayloadType::SA,
            Self::Ke(_) => PayloadType::KE,
            Self::IdI(_) => PayloadType::IDI,
            Self::IdR(_) => PayloadType::IDR,
            Self::Auth(_) => PayloadType::AUTH,
            Self::Nonce(_) => PayloadType::NONCE,
            Self::Notify(_) => PayloadType::NOTIFY,
            Self::Delete(_) => PayloadType::DELETE,
            Self::VendorId(_) => PayloadType::VENDOR_ID,
            Self::TsI(_) => PayloadType::TSI,
            Self::TsR(_) => PayloadType::TSR,
            Self::Unknown(u) => u.ty,
        }
    }

    /// Parses the body of a payload of type `ty`.
    pub fn parse_body(ty: PayloadType, critical: bool, body: &[u8]) -> Result<Self, IkeWireError> {
        Ok(match ty {
            PayloadType::SA => Self::Sa(SaPayload::parse(body)?),
            PayloadType::KE => Self::Ke(KePayload::parse(body)?),
            PayloadType::IDI => Self::IdI(IdPayload::parse(body)?),
            PayloadType::IDR => Self::IdR(IdPayload::parse(body)?),
            PayloadType::AUTH => Self::Auth(AuthPayload::parse(body)?),
            PayloadType::NONCE => Self::Nonce(NoncePayload::parse(body)?),
            PayloadType::NOTIFY => Self::Notify(NotifyPayload::parse(body)?),
            PayloadType::DELETE => Self::Delete(DeletePayload::parse(body)?),
            PayloadType::VENDOR_ID => Self::VendorId(VendorIdPayload::parse(body)?),
            PayloadType::TSI => Self::TsI(TsPayload::parse(body)?),
            PayloadType::TSR => Self::TsR(TsPayload::parse(body)?),
            // RFC 7296 §2.5: an unrecognised payload with the critical bit set MUST cause
            // rejection of the entire message; the critical bit of types defined in RFC 7296
            // MUST be ignored.
            t if critical && !t.is_rfc7296() => {
                return Err(IkeWireError::UnsupportedCriticalPayload { payload: t })
            }
            t => Self::Unknown(UnknownPayload {
                ty: t,
                critical,
                body: body.to_vec(),
            }),
        })
    }

    /// Encoded body length (without the generic header).
    pub fn body_len(&self) -> usize {
        match self {
            Self::Sa(p) => p.buffer_len(),
            Self::Ke(p) => p.buffer_len(),
            Self::IdI(p) | Self::IdR(p) => p.buffer_len(),
            Self::Auth(p) => p.buffer_len(),
            Self::Nonce(p) => p.buffer_len(),
            Self::Notify(p) => p.buffer_len(),
            Self::Delete(p) => p.buffer_len(),
            Self::VendorId(p) => p.buffer_len(),
            Self::TsI(p) | Self::TsR(p) => p.buffer_len(),
            Self::Unknown(u) => u.body.len(),
        }
    }

    /// Encoded length with the generic header.
    pub fn buffer_len(&self) -> usize {
        4 + self.body_len()
    }

    /// Appends the body (without the generic header).
    pub fn emit_body(&self, out: &mut Vec<u8>) -> Result<(), IkeWireError> {
        match self {
            Self::Sa(p) => p.emit(out)?,
            Self::Ke(p) => p.emit(out),
            Self::IdI(p) | Self::IdR(p) => p.emit(out),
            Self::Auth(p) => p.emit(out),
            Self::Nonce(p) => p.emit(out),
            Self::Notify(p) => p.emit(out)?,
            Self::Delete(p) => p.emit(out)?,
            Self::VendorId(p) => p.emit(out),
            Self::TsI(p) | Self::TsR(p) => p.emit(out)?,
            Self::Unknown(u) => out.extend_from_slice(&u.body),
        }
        Ok(())
    }

    /// Appends the payload with its generic header; `next` is the type of the payload after it.
    pub fn emit(&self, next: PayloadType, out: &mut Vec<u8>) -> Result<(), IkeWireError> {
        let start = out.len();
        out.push(next.0);
        out.push(match self {
            Self::Unknown(u) if u.critical => CRITICAL,
            _ => 0,
        });
        let len = LenField::u16(out, start, "payload length");
        self.emit_body(out)?;
        len.finish(out)
    }
}

/// Where the Encrypted (SK) payload of a message is, so that the engine can authenticate and
/// decrypt it in place. All offsets are relative to the start of the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encrypted {
    /// Type of the first payload inside the encrypted data.
    pub next_inner: PayloadType,
    /// Offset of the SK payload's generic header.
    pub header_offset: usize,
    /// IV, ciphertext (with padding) and ICV. Everything before `body.start` is the AAD
    /// (RFC 5282 §5.1) / the start of the integrity-protected data (RFC 7296 §3.14).
    pub body: Range<usize>,
}

/// Parses a payload chain starting with a payload of type `first`. `base` is the offset of
/// `data` within the message (for [`Encrypted`] offsets); `allow_sk` is false inside an
/// Encrypted payload.
pub fn parse_chain(
    first: PayloadType,
    data: &[u8],
    base: usize,
    allow_sk: bool,
) -> Result<(Vec<Payload>, Option<Encrypted>), IkeWireError> {
    let mut r = Reader::new(data, "payload chain");
    let mut next = first;
    let mut payloads = Vec::new();
    while next != PayloadType::NONE {
        let offset = r.position();
        let ty = next;
        next = PayloadType(r.u8()?);
        let critical = r.u8()? & CRITICAL != 0;
        let len = usize::from(r.u16()?);
        if len < 4 {
            return Err(IkeWireError::BadLength {
                what: "payload",
                length: len,
            });
        }
        let body_offset = r.position();
        let body = r.take(len - 4)?;
        if ty == PayloadType::SK {
            if !allow_sk {
                return Err(IkeWireError::NestedEncrypted);
            }
            // RFC 7296 §3.14: the Encrypted payload, if present, MUST be the last payload.
            if !r.is_empty() {
                return Err(IkeWireError::EncryptedNotLast);
            }
            let start = base + body_offset;
            return Ok((
                payloads,
                Some(Encrypted {
                    next_inner: next,
                    header_offset: base + offset,
                    body: start..start + body.len(),
                }),
            ));
        }
        payloads.push(Payload::parse_body(ty, critical, body)?);
    }
    r.finish()?;
    Ok((payloads, None))
}

/// Appends a payload chain; the last payload's Next Payload is `last_next` (NONE, or the type of
/// an Encrypted payload that follows). Returns the type of the first payload (NONE if empty).
pub fn emit_chain(
    payloads: &[Payload],
    last_next: PayloadType,
    out: &mut Vec<u8>,
) -> Result<PayloadType, IkeWireError> {
    for (i, p) in payloads.iter().enumerate() {
        let next = payloads.get(i + 1).map_or(last_next, Payload::ty);
        p.emit(next, out)?;
    }
    Ok(payloads.first().map_or(last_next, Payload::ty))
}

/// Encoded length of a payload chain.
pub fn chain_len(payloads: &[Payload]) -> usize {
    payloads.iter().map(Payload::buffer_len).sum()
}
