//! Keyed ciphers shared by the IKE SK payload and ESP. One interface covers both AEAD
//! (AES-GCM-16 RFC 4106/5282, ChaCha20-Poly1305 RFC 7634) and AES-CBC (RFC 3602) with HMAC
//! integrity (RFC 2404, RFC 4868): the ICV always covers `aad | iv | ciphertext`, which is exactly
//! "everything before the ICV" for both IKE (RFC 7296 §3.14) and ESP (RFC 4303 §3.3.2.1).
//!
//! Keys are expanded once in [`SaCipher::new`]; `seal_in_place` / `open_in_place` work in the
//! caller's buffer and do not allocate.

use crate::{
    error::Error,
    transform::{EncrId, IntegId},
};

/// A supported encryption transform with its key size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encr {
    /// ENCR_AES_GCM_16 with a 128-bit key (+4 bytes salt in the keying material).
    AesGcm16_128,
    /// ENCR_AES_GCM_16 with a 256-bit key (+4 bytes salt).
    AesGcm16_256,
    /// ENCR_CHACHA20_POLY1305 (256-bit key + 4 bytes salt).
    ChaCha20Poly1305,
    /// ENCR_AES_CBC with a 128-bit key.
    AesCbc128,
    /// ENCR_AES_CBC with a 256-bit key.
    AesCbc256,
}

impl Encr {
    /// The transform for an IANA ID and optional key length attribute (bits), if supported.
    /// AES_GCM_16 and AES_CBC require the key length attribute; ChaCha20-Poly1305 must not have one.
    pub fn from_id(id: EncrId, key_bits: Option<u16>) -> Option<Self> {
        todo!("{id:?} {key_bits:?}")
    }
    /// The IANA ID and key length attribute (bits) to put in a proposal.
    pub fn id(self) -> (EncrId, Option<u16>) {
        todo!()
    }
    /// True for combined-mode (AEAD) ciphers, which take no separate integrity transform.
    pub fn is_aead(self) -> bool {
        todo!()
    }
    /// Bytes of keying material taken from KEYMAT / prf+ (key plus salt for AEAD: 20, 36, 36, 16, 32).
    pub fn keymat_len(self) -> usize {
        todo!()
    }
    /// Length of the explicit IV on the wire (8 for AEAD, 16 for CBC).
    pub fn iv_len(self) -> usize {
        todo!()
    }
    /// Length of the ICV for AEAD (16); 0 for CBC (the integrity transform decides).
    pub fn aead_icv_len(self) -> usize {
        todo!()
    }
    /// Block size the plaintext must be padded to (16 for CBC, 4 for ESP with AEAD; callers
    /// apply ESP's 4-byte alignment on top of this).
    pub fn block_size(self) -> usize {
        todo!()
    }
}

/// A supported integrity transform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Integ {
    /// AUTH_HMAC_SHA1_96.
    HmacSha1_96,
    /// AUTH_HMAC_SHA2_256_128.
    HmacSha256_128,
    /// AUTH_HMAC_SHA2_384_192.
    HmacSha384_192,
    /// AUTH_HMAC_SHA2_512_256.
    HmacSha512_256,
}

impl Integ {
    /// The transform for an IANA ID, if supported (NONE is not an `Integ`).
    pub fn from_id(id: IntegId) -> Option<Self> {
        todo!("{id:?}")
    }
    /// The IANA ID.
    pub fn id(self) -> IntegId {
        todo!()
    }
    /// Key length in bytes (20, 32, 48, 64).
    pub fn key_len(self) -> usize {
        todo!()
    }
    /// Truncated ICV length in bytes (12, 16, 24, 32).
    pub fn icv_len(self) -> usize {
        todo!()
    }
}

/// A keyed cipher (one direction of an IKE SA or ESP SA), with keys expanded once.
pub struct SaCipher {
    encr: Encr,
    integ: Option<Integ>,
    // implementation-defined expanded keys (zeroized on drop)
}

impl core::fmt::Debug for SaCipher {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SaCipher")
            .field("encr", &self.encr)
            .field("integ", &self.integ)
            .finish_non_exhaustive()
    }
}

impl SaCipher {
    /// Keys a cipher. `encr_key` is `encr.keymat_len()` bytes (for AEAD the last 4 are the salt);
    /// `integ` is required for CBC and must be `None` for AEAD.
    pub fn new(encr: Encr, encr_key: &[u8], integ: Option<(Integ, &[u8])>) -> Result<Self, Error> {
        todo!("{encr:?} {} {}", encr_key.len(), integ.is_some())
    }
    /// The encryption transform.
    pub fn encr(&self) -> Encr {
        self.encr
    }
    /// The integrity transform (None for AEAD).
    pub fn integ(&self) -> Option<Integ> {
        self.integ
    }
    /// IV length on the wire.
    pub fn iv_len(&self) -> usize {
        self.encr.iv_len()
    }
    /// ICV length on the wire.
    pub fn icv_len(&self) -> usize {
        todo!()
    }
    /// Plaintext alignment required by the cipher (16 for CBC, 1 for AEAD).
    pub fn block_size(&self) -> usize {
        todo!()
    }
    /// Encrypts `buf` in place and writes the ICV into `icv` (`icv.len() == self.icv_len()`).
    /// For AEAD the nonce is salt | iv and `aad` is authenticated; for CBC `buf.len()` must be a
    /// multiple of 16 and the HMAC covers `aad | iv | ciphertext`.
    pub fn seal_in_place(&self, iv: &[u8], aad: &[u8], buf: &mut [u8], icv: &mut [u8]) -> Result<(), Error> {
        todo!("{} {} {} {}", iv.len(), aad.len(), buf.len(), icv.len())
    }
    /// Verifies `icv` and decrypts `buf` in place. On failure `buf` content is unspecified and
    /// must be discarded; nothing else changes.
    pub fn open_in_place(&self, iv: &[u8], aad: &[u8], buf: &mut [u8], icv: &[u8]) -> Result<(), Error> {
        todo!("{} {} {} {}", iv.len(), aad.len(), buf.len(), icv.len())
    }
    /// Computes a deterministic, unpredictable CBC IV from a counter (NIST SP 800-38A appendix C:
    /// the forward cipher applied to a unique nonce). For AEAD returns the counter big-endian
    /// (RFC 4106 §3.1 allows the sequence number as IV). Writes `iv_len()` bytes.
    pub fn iv_from_counter(&self, counter: u64, iv: &mut [u8]) {
        todo!("{counter} {}", iv.len())
    }
}
