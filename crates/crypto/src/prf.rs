//! Pseudorandom functions and prf+ (RFC 7296 §2.13), and the SKEYSEED / KEYMAT derivations of
//! §2.14 and §2.17 built on them.

use crate::transform::PrfId;
use zeroize::Zeroizing;

/// A supported PRF.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prf {
    /// PRF_HMAC_SHA1 (RFC 2104).
    HmacSha1,
    /// PRF_HMAC_SHA2_256 (RFC 4868).
    HmacSha256,
    /// PRF_HMAC_SHA2_384 (RFC 4868).
    HmacSha384,
    /// PRF_HMAC_SHA2_512 (RFC 4868).
    HmacSha512,
}

impl Prf {
    /// The PRF for an IANA transform ID, if supported.
    pub fn from_id(id: PrfId) -> Option<Self> {
        todo!("{id:?}")
    }

    /// The IANA transform ID.
    pub fn id(self) -> PrfId {
        todo!()
    }

    /// Output length in bytes; also the preferred key length (RFC 7296 §2.13, SK_d/SK_p length).
    pub fn output_len(self) -> usize {
        todo!()
    }

    /// prf(key, data).
    pub fn prf(self, key: &[u8], data: &[u8]) -> Zeroizing<Vec<u8>> {
        todo!("{} {}", key.len(), data.len())
    }

    /// prf(key, data_1 | data_2 | ...) without concatenating the parts first.
    pub fn prf_parts(self, key: &[u8], parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
        todo!("{} {}", key.len(), parts.len())
    }

    /// prf+(key, seed) truncated to `len` bytes (RFC 7296 §2.13):
    /// T1 = prf(K, S | 0x01), Tn = prf(K, Tn-1 | S | n). `len` must be at most 255 outputs.
    pub fn prf_plus(self, key: &[u8], seed: &[u8], len: usize) -> Zeroizing<Vec<u8>> {
        todo!("{} {} {len}", key.len(), seed.len())
    }
}
