//! Pseudorandom functions and prf+ (RFC 7296 §2.13), and the SKEYSEED / KEYMAT derivations of
//! §2.14, §2.17 and §2.18 built on them. All PRFs are HMAC (RFC 2104) over SHA-1 or SHA-2
//! (RFC 4868), computed by aws-lc.

use crate::transform::PrfId;
use aws_lc_rs::hmac;
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

/// RFC 7296 §2.13: the counter byte of prf+ runs from 0x01 to 0xff, so at most 255 blocks.
const MAX_PRF_PLUS_BLOCKS: usize = 255;

impl Prf {
    /// The PRF for an IANA transform ID, if supported.
    pub fn from_id(id: PrfId) -> Option<Self> {
        match id {
            PrfId::HMAC_SHA1 => Some(Self::HmacSha1),
            PrfId::HMAC_SHA2_256 => Some(Self::HmacSha256),
            PrfId::HMAC_SHA2_384 => Some(Self::HmacSha384),
            PrfId::HMAC_SHA2_512 => Some(Self::HmacSha512),
            _ => None,
        }
    }

    /// The IANA transform ID.
    pub fn id(self) -> PrfId {
        match self {
            Self::HmacSha1 => PrfId::HMAC_SHA1,
            Self::HmacSha256 => PrfId::HMAC_SHA2_256,
            Self::HmacSha384 => PrfId::HMAC_SHA2_384,
            Self::HmacSha512 => PrfId::HMAC_SHA2_512,
        }
    }

    /// Output length in bytes; also the preferred key length (RFC 7296 §2.13, SK_d/SK_p length).
    pub fn output_len(self) -> usize {
        match self {
            Self::HmacSha1 => 20,
            Self::HmacSha256 => 32,
            Self::HmacSha384 => 48,
            Self::HmacSha512 => 64,
        }
    }

    /// The largest `len` [`prf_plus`](Self::prf_plus) accepts: 255 PRF outputs.
    pub fn max_prf_plus_len(self) -> usize {
        MAX_PRF_PLUS_BLOCKS * self.output_len()
    }

    /// prf(key, data).
    pub fn prf(self, key: &[u8], data: &[u8]) -> Zeroizing<Vec<u8>> {
        self.prf_parts(key, &[data])
    }

    /// prf(key, data_1 | data_2 | ...) without concatenating the parts first.
    pub fn prf_parts(self, key: &[u8], parts: &[&[u8]]) -> Zeroizing<Vec<u8>> {
        let key = hmac::Key::new(self.hmac_algorithm(), key);
        let mut out = Zeroizing::new(vec![0u8; self.output_len()]);
        hmac_parts_into(&key, parts, &mut out);
        out
    }

    /// prf+(key, seed) truncated to `len` bytes (RFC 7296 §2.13):
    /// T1 = prf(K, S | 0x01), Tn = prf(K, Tn-1 | S | n). `len` must be at most 255 outputs.
    ///
    /// # Panics
    /// If `len > self.max_prf_plus_len()`: the key lengths of every negotiable transform set are
    /// far below that bound, so a longer request is a bug in the caller, not bad input.
    pub fn prf_plus(self, key: &[u8], seed: &[u8], len: usize) -> Zeroizing<Vec<u8>> {
        self.prf_plus_parts(key, &[seed], len)
    }

    /// prf+(key, seed_1 | seed_2 | ...) truncated to `len` bytes, without concatenating the seed
    /// parts first (e.g. `Ni | Nr | SPIi | SPIr` for the IKE SA keys, RFC 7296 §2.14).
    ///
    /// # Panics
    /// If `len > self.max_prf_plus_len()` (see [`prf_plus`](Self::prf_plus)).
    pub fn prf_plus_parts(self, key: &[u8], seed: &[&[u8]], len: usize) -> Zeroizing<Vec<u8>> {
        let mut out = Zeroizing::new(vec![0u8; len]);
        self.prf_plus_into(key, seed, &mut out);
        out
    }

    /// Fills `out` with prf+(key, seed_1 | seed_2 | ...) (RFC 7296 §2.13).
    ///
    /// # Panics
    /// If `out.len() > self.max_prf_plus_len()` (see [`prf_plus`](Self::prf_plus)).
    pub fn prf_plus_into(self, key: &[u8], seed: &[&[u8]], out: &mut [u8]) {
        assert!(
            out.len() <= self.max_prf_plus_len(),
            "prf+ asked for {} bytes but {self:?} yields at most 255 * {} (RFC 7296 §2.13)",
            out.len(),
            self.output_len()
        );
        let key = hmac::Key::new(self.hmac_algorithm(), key);
        let block_len = self.output_len();
        // Tn-1 of the previous round; empty for T1.
        let mut prev = Zeroizing::new([0u8; MAX_OUTPUT_LEN]);
        let mut prev_len = 0;
        for (i, chunk) in out.chunks_mut(block_len).enumerate() {
            let counter = [u8::try_from(i + 1).expect("block count bounded by the assert above")];
            let mut ctx = hmac::Context::with_key(&key);
            ctx.update(&prev[..prev_len]);
            for part in seed {
                ctx.update(part);
            }
            ctx.update(&counter);
            let tag = ctx.sign();
            prev[..block_len].copy_from_slice(tag.as_ref());
            prev_len = block_len;
            chunk.copy_from_slice(&prev[..chunk.len()]);
        }
    }

    /// SKEYSEED = prf(Ni | Nr, g^ir) for a new IKE SA (RFC 7296 §2.14).
    pub fn skeyseed(self, ni: &[u8], nr: &[u8], shared_secret: &[u8]) -> Zeroizing<Vec<u8>> {
        let mut key = Zeroizing::new(Vec::with_capacity(ni.len() + nr.len()));
        key.extend_from_slice(ni);
        key.extend_from_slice(nr);
        self.prf(&key, shared_secret)
    }

    /// SKEYSEED = prf(SK_d (old), g^ir (new) | Ni | Nr) for an IKE SA rekey (RFC 7296 §2.18).
    /// `self` is the PRF of the *old* IKE SA.
    pub fn rekey_skeyseed(
        self,
        old_sk_d: &[u8],
        shared_secret: &[u8],
        ni: &[u8],
        nr: &[u8],
    ) -> Zeroizing<Vec<u8>> {
        self.prf_parts(old_sk_d, &[shared_secret, ni, nr])
    }

    /// KEYMAT = prf+(SK_d, [g^ir (new) |] Ni | Nr) for a CHILD_SA (RFC 7296 §2.17); pass the
    /// new shared secret only when the CREATE_CHILD_SA exchange included a KE payload.
    ///
    /// # Panics
    /// If `len > self.max_prf_plus_len()` (see [`prf_plus`](Self::prf_plus)).
    pub fn child_keymat(
        self,
        sk_d: &[u8],
        shared_secret: Option<&[u8]>,
        ni: &[u8],
        nr: &[u8],
        len: usize,
    ) -> Zeroizing<Vec<u8>> {
        match shared_secret {
            Some(g_ir) => self.prf_plus_parts(sk_d, &[g_ir, ni, nr], len),
            None => self.prf_plus_parts(sk_d, &[ni, nr], len),
        }
    }

    pub(crate) fn hmac_algorithm(self) -> hmac::Algorithm {
        match self {
            Self::HmacSha1 => hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
            Self::HmacSha256 => hmac::HMAC_SHA256,
            Self::HmacSha384 => hmac::HMAC_SHA384,
            Self::HmacSha512 => hmac::HMAC_SHA512,
        }
    }
}

/// The longest PRF output (HMAC-SHA-512).
const MAX_OUTPUT_LEN: usize = 64;

/// Writes HMAC(key, parts...) into `out`, which must be exactly the tag length.
fn hmac_parts_into(key: &hmac::Key, parts: &[&[u8]], out: &mut [u8]) {
    let mut ctx = hmac::Context::with_key(key);
    for part in parts {
        ctx.update(part);
    }
    out.copy_from_slice(ctx.sign().as_ref());
}

#[cfg(test)]
#[path = "prf_tests.rs"]
mod tests;
