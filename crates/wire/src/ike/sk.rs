//! The Encrypted and Authenticated (SK) payload (RFC 7296 §3.14, RFC 5282 for AEAD).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Next Payload  |C|  RESERVED   |         Payload Length        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                     Initialization Vector                     |
//! |         (length is block size for encryption algorithm)       |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~                    Encrypted IKE Payloads                     ~
//! +               +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |               |             Padding (0-255 octets)            |
//! +-+-+-+-+-+-+-+-+                               +-+-+-+-+-+-+-+-+
//! |                                               |  Pad Length   |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~                    Integrity Checksum Data                    ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! This module lays the payload out; the engine fills the IV, encrypts the plaintext range in
//! place and writes the ICV (everything before the plaintext range is the AAD / the start of
//! the integrity-protected data).

use super::{
    codec::{LenField, Reader},
    Header, IkeWireError, PayloadType,
};
use core::ops::Range;

/// Where the parts of an Encrypted payload lie in an emitted message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealLayout {
    /// Length of the associated data: the IKE header, any unencrypted payloads and the SK
    /// generic header (RFC 5282 §5.1).
    pub aad_len: usize,
    /// The IV (zeroes until the engine writes it).
    pub iv: Range<usize>,
    /// Inner payloads, padding and the Pad Length octet, to be encrypted in place.
    pub plaintext: Range<usize>,
    /// The Integrity Checksum Data (zeroes until the engine writes it).
    pub icv: Range<usize>,
}

/// Appends a message consisting of `header` and one Encrypted payload holding `inner` (an
/// encoded payload chain whose first payload is of type `inner_first`). The header's
/// `next_payload` and `length` are set here. Padding is zero bytes so that the plaintext
/// (inner | padding | pad length) is a multiple of `block_size`.
pub fn emit_encrypted(
    header: &Header,
    inner_first: PayloadType,
    inner: &[u8],
    iv_len: usize,
    block_size: usize,
    icv_len: usize,
    out: &mut Vec<u8>,
) -> Result<SealLayout, IkeWireError> {
    let block = block_size.max(1);
    let pad = (block - (inner.len() + 1) % block) % block;
    let pad_u8 = u8::try_from(pad).map_err(|_| IkeWireError::BadLength {
        what: "padding",
        length: pad,
    })?;
    let sk_len = 4 + iv_len + inner.len() + pad + 1 + icv_len;
    let total = Header::LEN + sk_len;
    let mut h = *header;
    h.next_payload = PayloadType::SK;
    h.length = u32::try_from(total).map_err(|_| IkeWireError::BadLength {
        what: "message",
        length: total,
    })?;
    let base = out.len();
    h.emit(out);
    let sk_start = out.len();
    out.push(inner_first.0);
    out.push(0);
    let len = LenField::u16(out, sk_start, "encrypted payload length");
    let aad_len = out.len() - base;
    let iv_start = out.len();
    out.resize(iv_start + iv_len, 0);
    let pt_start = out.len();
    out.extend_from_slice(inner);
    out.resize(out.len() + pad, 0);
    out.push(pad_u8);
    let icv_start = out.len();
    out.resize(icv_start + icv_len, 0);
    len.finish(out)?;
    Ok(SealLayout {
        aad_len,
        iv: iv_start - base..pt_start - base,
        plaintext: pt_start - base..icv_start - base,
        icv: icv_start - base..out.len() - base,
    })
}

/// Splits a decrypted Encrypted payload body into the inner payload chain, checking the Pad
/// Length octet.
pub fn strip_padding(plaintext: &[u8]) -> Result<&[u8], IkeWireError> {
    let mut r = Reader::new(plaintext, "encrypted payload padding");
    let n = plaintext.len();
    if n == 0 {
        return Err(IkeWireError::Truncated {
            what: "encrypted payload padding",
            needed: 1,
            available: 0,
        });
    }
    let pad = usize::from(plaintext[n - 1]);
    if pad + 1 > n {
        return Err(IkeWireError::BadLength {
            what: "encrypted payload padding",
            length: pad,
        });
    }
    r.take(n - pad - 1)
}
