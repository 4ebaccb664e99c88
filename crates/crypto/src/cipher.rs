//! Keyed ciphers shared by the IKE SK payload and ESP. One interface covers both AEAD
//! (AES-GCM-16 RFC 4106/5282, ChaCha20-Poly1305 RFC 7634) and AES-CBC (RFC 3602) with HMAC
//! integrity (RFC 2404, RFC 4868): the ICV always covers `aad | iv | ciphertext`, which is exactly
//! "everything before the ICV" for both IKE (RFC 7296 §3.14) and ESP (RFC 4303 §3.3.2.1). (AEAD
//! ciphers bind the IV through the nonce `salt | iv`, RFC 4106 §4 / RFC 7634 §2, and
//! authenticate only `aad` as associated data, RFC 4106 §5 / RFC 5282 §5.)
//!
//! Keys are expanded once in [`SaCipher::new`]; `seal_in_place` / `open_in_place` work in the
//! caller's buffer and do not allocate (aws-lc's CBC keys take the IV per call, and its HMAC
//! contexts live on the stack).

use crate::{
    error::Error,
    transform::{EncrId, IntegId},
};
use aws_lc_rs::{
    aead::{self, Aad, LessSafeKey, Nonce, UnboundKey},
    cipher::{
        DecryptingKey, DecryptionContext, EncryptingKey, EncryptionContext, UnboundCipherKey,
        AES_128, AES_256,
    },
    constant_time, hmac,
    iv::FixedLength,
};
use zeroize::Zeroizing;

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

/// Salt bytes at the end of AEAD keying material (RFC 4106 §8.1, RFC 7634 §2).
const SALT_LEN: usize = 4;
/// Explicit IV on the wire for AEAD (RFC 4106 §3.1, RFC 7634 §2).
const AEAD_IV_LEN: usize = 8;
/// AES block and CBC IV size (RFC 3602 §2.4).
const AES_BLOCK: usize = 16;

impl Encr {
    /// The transform for an IANA ID and optional key length attribute (bits), if supported.
    /// AES_GCM_16 and AES_CBC require the key length attribute; ChaCha20-Poly1305 must not have one.
    pub fn from_id(id: EncrId, key_bits: Option<u16>) -> Option<Self> {
        match (id, key_bits) {
            (EncrId::AES_GCM_16, Some(128)) => Some(Self::AesGcm16_128),
            (EncrId::AES_GCM_16, Some(256)) => Some(Self::AesGcm16_256),
            // RFC 7634 §3: "the Key Length attribute MUST NOT be sent".
            (EncrId::CHACHA20_POLY1305, None) => Some(Self::ChaCha20Poly1305),
            (EncrId::AES_CBC, Some(128)) => Some(Self::AesCbc128),
            (EncrId::AES_CBC, Some(256)) => Some(Self::AesCbc256),
            _ => None,
        }
    }
    /// The IANA ID and key length attribute (bits) to put in a proposal.
    pub fn id(self) -> (EncrId, Option<u16>) {
        match self {
            Self::AesGcm16_128 => (EncrId::AES_GCM_16, Some(128)),
            Self::AesGcm16_256 => (EncrId::AES_GCM_16, Some(256)),
            Self::ChaCha20Poly1305 => (EncrId::CHACHA20_POLY1305, None),
            Self::AesCbc128 => (EncrId::AES_CBC, Some(128)),
            Self::AesCbc256 => (EncrId::AES_CBC, Some(256)),
        }
    }
    /// True for combined-mode (AEAD) ciphers, which take no separate integrity transform.
    pub fn is_aead(self) -> bool {
        matches!(
            self,
            Self::AesGcm16_128 | Self::AesGcm16_256 | Self::ChaCha20Poly1305
        )
    }
    /// Bytes of keying material taken from KEYMAT / prf+ (key plus salt for AEAD: 20, 36, 36, 16, 32).
    pub fn keymat_len(self) -> usize {
        match self {
            Self::AesGcm16_128 => 16 + SALT_LEN,
            Self::AesGcm16_256 | Self::ChaCha20Poly1305 => 32 + SALT_LEN,
            Self::AesCbc128 => 16,
            Self::AesCbc256 => 32,
        }
    }
    /// Length of the explicit IV on the wire (8 for AEAD, 16 for CBC).
    pub fn iv_len(self) -> usize {
        if self.is_aead() {
            AEAD_IV_LEN
        } else {
            AES_BLOCK
        }
    }
    /// Length of the ICV for AEAD (16); 0 for CBC (the integrity transform decides).
    pub fn aead_icv_len(self) -> usize {
        if self.is_aead() {
            16
        } else {
            0
        }
    }
    /// Block size the plaintext must be padded to (16 for CBC, 4 for ESP with AEAD; callers
    /// apply ESP's 4-byte alignment on top of this).
    pub fn block_size(self) -> usize {
        if self.is_aead() {
            4
        } else {
            AES_BLOCK
        }
    }
    /// A short human-readable name, e.g. "AES-GCM-16-256".
    pub fn name(self) -> &'static str {
        match self {
            Self::AesGcm16_128 => "AES-GCM-16-128",
            Self::AesGcm16_256 => "AES-GCM-16-256",
            Self::ChaCha20Poly1305 => "ChaCha20-Poly1305",
            Self::AesCbc128 => "AES-CBC-128",
            Self::AesCbc256 => "AES-CBC-256",
        }
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
        match id {
            IntegId::HMAC_SHA1_96 => Some(Self::HmacSha1_96),
            IntegId::HMAC_SHA2_256_128 => Some(Self::HmacSha256_128),
            IntegId::HMAC_SHA2_384_192 => Some(Self::HmacSha384_192),
            IntegId::HMAC_SHA2_512_256 => Some(Self::HmacSha512_256),
            _ => None,
        }
    }
    /// The IANA ID.
    pub fn id(self) -> IntegId {
        match self {
            Self::HmacSha1_96 => IntegId::HMAC_SHA1_96,
            Self::HmacSha256_128 => IntegId::HMAC_SHA2_256_128,
            Self::HmacSha384_192 => IntegId::HMAC_SHA2_384_192,
            Self::HmacSha512_256 => IntegId::HMAC_SHA2_512_256,
        }
    }
    /// Key length in bytes (20, 32, 48, 64).
    pub fn key_len(self) -> usize {
        // RFC 2404 §3 and RFC 4868 §2.1.1: the key is as long as the hash output.
        match self {
            Self::HmacSha1_96 => 20,
            Self::HmacSha256_128 => 32,
            Self::HmacSha384_192 => 48,
            Self::HmacSha512_256 => 64,
        }
    }
    /// Truncated ICV length in bytes (12, 16, 24, 32).
    pub fn icv_len(self) -> usize {
        // RFC 2404 §2 (96 bits) and RFC 4868 §2.3 (half the hash output).
        match self {
            Self::HmacSha1_96 => 12,
            Self::HmacSha256_128 => 16,
            Self::HmacSha384_192 => 24,
            Self::HmacSha512_256 => 32,
        }
    }
    /// A short human-readable name, e.g. "HMAC-SHA2-256-128".
    pub fn name(self) -> &'static str {
        match self {
            Self::HmacSha1_96 => "HMAC-SHA1-96",
            Self::HmacSha256_128 => "HMAC-SHA2-256-128",
            Self::HmacSha384_192 => "HMAC-SHA2-384-192",
            Self::HmacSha512_256 => "HMAC-SHA2-512-256",
        }
    }
    fn hmac_algorithm(self) -> hmac::Algorithm {
        match self {
            Self::HmacSha1_96 => hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
            Self::HmacSha256_128 => hmac::HMAC_SHA256,
            Self::HmacSha384_192 => hmac::HMAC_SHA384,
            Self::HmacSha512_256 => hmac::HMAC_SHA512,
        }
    }
}

/// A keyed cipher (one direction of an IKE SA or ESP SA), with keys expanded once.
pub struct SaCipher {
    encr: Encr,
    integ: Option<Integ>,
    keys: Keys,
}

/// Expanded keys. aws-lc cleanses its key schedules and HMAC states when they are dropped; the
/// salt is held in a zeroizing array. The CBC schedules (two AES key schedules and an HMAC
/// state, over a kilobyte) are boxed so that AEAD SAs stay small.
enum Keys {
    Aead {
        key: LessSafeKey,
        salt: Zeroizing<[u8; SALT_LEN]>,
    },
    Cbc(Box<CbcKeys>),
}

/// AES-CBC encryption and decryption schedules plus the HMAC key.
struct CbcKeys {
    enc: EncryptingKey,
    dec: DecryptingKey,
    mac: hmac::Key,
    icv_len: usize,
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
        if encr_key.len() != encr.keymat_len() {
            return Err(Error::KeyLength {
                alg: encr.name(),
                got: encr_key.len(),
                expected: encr.keymat_len(),
            });
        }
        let key_error = || Error::KeyLength {
            alg: encr.name(),
            got: encr_key.len(),
            expected: encr.keymat_len(),
        };
        let keys = match (encr, integ) {
            (Encr::AesGcm16_128 | Encr::AesGcm16_256 | Encr::ChaCha20Poly1305, None) => {
                let alg = match encr {
                    Encr::AesGcm16_128 => &aead::AES_128_GCM,
                    Encr::AesGcm16_256 => &aead::AES_256_GCM,
                    _ => &aead::CHACHA20_POLY1305,
                };
                let (key, salt) = encr_key.split_at(encr_key.len() - SALT_LEN);
                let key = UnboundKey::new(alg, key).map_err(|_| key_error())?;
                let mut salt_bytes = Zeroizing::new([0u8; SALT_LEN]);
                salt_bytes.copy_from_slice(salt);
                Keys::Aead {
                    key: LessSafeKey::new(key),
                    salt: salt_bytes,
                }
            }
            (Encr::AesGcm16_128 | Encr::AesGcm16_256 | Encr::ChaCha20Poly1305, Some(_)) => {
                // RFC 5282 §8 / RFC 4303 §3.2: combined-mode ciphers take no integrity transform.
                return Err(Error::Unsupported(
                    "an AEAD cipher with a separate integrity transform",
                ));
            }
            (Encr::AesCbc128 | Encr::AesCbc256, None) => {
                // RFC 7296 §3.3.3 / RFC 4303 §3.2: CBC needs an integrity algorithm.
                return Err(Error::Unsupported("AES-CBC without an integrity transform"));
            }
            (Encr::AesCbc128 | Encr::AesCbc256, Some((integ, integ_key))) => {
                if integ_key.len() != integ.key_len() {
                    return Err(Error::KeyLength {
                        alg: integ.name(),
                        got: integ_key.len(),
                        expected: integ.key_len(),
                    });
                }
                let alg = if encr == Encr::AesCbc128 {
                    &AES_128
                } else {
                    &AES_256
                };
                let unbound = || UnboundCipherKey::new(alg, encr_key).map_err(|_| key_error());
                Keys::Cbc(Box::new(CbcKeys {
                    enc: EncryptingKey::cbc(unbound()?).map_err(|_| key_error())?,
                    dec: DecryptingKey::cbc(unbound()?).map_err(|_| key_error())?,
                    mac: hmac::Key::new(integ.hmac_algorithm(), integ_key),
                    icv_len: integ.icv_len(),
                }))
            }
        };
        Ok(Self {
            encr,
            integ: integ.map(|(i, _)| i),
            keys,
        })
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
        match &self.keys {
            Keys::Aead { .. } => self.encr.aead_icv_len(),
            Keys::Cbc(cbc) => cbc.icv_len,
        }
    }
    /// Plaintext alignment required by the cipher (16 for CBC, 1 for AEAD).
    pub fn block_size(&self) -> usize {
        match self.keys {
            Keys::Aead { .. } => 1,
            Keys::Cbc(_) => AES_BLOCK,
        }
    }
    /// Encrypts `buf` in place and writes the ICV into `icv` (`icv.len() == self.icv_len()`).
    /// For AEAD the nonce is salt | iv and `aad` is authenticated; for CBC `buf.len()` must be a
    /// multiple of 16 and the HMAC covers `aad | iv | ciphertext`.
    pub fn seal_in_place(
        &self,
        iv: &[u8],
        aad: &[u8],
        buf: &mut [u8],
        icv: &mut [u8],
    ) -> Result<(), Error> {
        self.seal_in_place_with_trailer(iv, aad, buf, &[], icv)
    }
    /// Verifies `icv` and decrypts `buf` in place. On failure `buf` content is unspecified and
    /// must be discarded; nothing else changes.
    pub fn open_in_place(
        &self,
        iv: &[u8],
        aad: &[u8],
        buf: &mut [u8],
        icv: &[u8],
    ) -> Result<(), Error> {
        self.open_in_place_with_trailer(iv, aad, buf, &[], icv)
    }
    /// Like [`seal_in_place`](Self::seal_in_place), but for CBC the HMAC covers
    /// `aad | iv | ciphertext | trailer`. ESP with extended sequence numbers needs this: RFC 4303
    /// §2.2.1 / §3.3.2.1 authenticate the high-order 32 bits of the sequence number *after* the
    /// payload. AEAD ciphers put those bits into `aad` instead (RFC 4106 §5, RFC 7634 §2.1) and
    /// reject a non-empty trailer with [`Error::Unsupported`].
    pub fn seal_in_place_with_trailer(
        &self,
        iv: &[u8],
        aad: &[u8],
        buf: &mut [u8],
        trailer: &[u8],
        icv: &mut [u8],
    ) -> Result<(), Error> {
        self.check_lengths(iv, buf, trailer, icv.len())?;
        match &self.keys {
            Keys::Aead { key, salt } => {
                let len = buf.len();
                let tag = key
                    .seal_in_place_separate_tag(aead_nonce(salt, iv)?, Aad::from(aad), buf)
                    .map_err(|_| Error::Length {
                        what: "plaintext",
                        len,
                    })?;
                icv.copy_from_slice(tag.as_ref());
            }
            Keys::Cbc(cbc) => {
                let CbcKeys { enc, mac, .. } = &**cbc;
                let len = buf.len();
                enc.less_safe_encrypt(buf, EncryptionContext::Iv128(cbc_iv(iv)?))
                    .map_err(|_| Error::Length {
                        what: "plaintext",
                        len,
                    })?;
                let tag = cbc_mac(mac, aad, iv, buf, trailer);
                icv.copy_from_slice(&tag.as_ref()[..icv.len()]);
            }
        }
        Ok(())
    }
    /// Like [`open_in_place`](Self::open_in_place), with the CBC `trailer` of
    /// [`seal_in_place_with_trailer`](Self::seal_in_place_with_trailer).
    pub fn open_in_place_with_trailer(
        &self,
        iv: &[u8],
        aad: &[u8],
        buf: &mut [u8],
        trailer: &[u8],
        icv: &[u8],
    ) -> Result<(), Error> {
        self.check_lengths(iv, buf, trailer, icv.len())?;
        match &self.keys {
            Keys::Aead { key, salt } => {
                key.open_in_place_separate_tag(aead_nonce(salt, iv)?, Aad::from(aad), icv, buf)
                    .map_err(|_| Error::Authentication)?;
            }
            Keys::Cbc(cbc) => {
                let CbcKeys { dec, mac, .. } = &**cbc;
                // RFC 4303 §3.4.4.1: verify the ICV before decrypting.
                let tag = cbc_mac(mac, aad, iv, buf, trailer);
                constant_time::verify_slices_are_equal(&tag.as_ref()[..icv.len()], icv)
                    .map_err(|_| Error::Authentication)?;
                let len = buf.len();
                dec.decrypt(buf, DecryptionContext::Iv128(cbc_iv(iv)?))
                    .map_err(|_| Error::Length {
                        what: "ciphertext",
                        len,
                    })?;
            }
        }
        Ok(())
    }
    /// Computes a deterministic, unpredictable CBC IV from a counter (NIST SP 800-38A appendix C:
    /// the forward cipher applied to a unique nonce). For AEAD returns the counter big-endian
    /// (RFC 4106 §3.1 allows the sequence number as IV). Writes `iv_len()` bytes.
    ///
    /// # Panics
    /// If `iv.len() < self.iv_len()` (a caller bug: the IV field of every packet layout is sized
    /// from `iv_len()`).
    pub fn iv_from_counter(&self, counter: u64, iv: &mut [u8]) {
        let iv_len = self.iv_len();
        assert!(
            iv.len() >= iv_len,
            "IV buffer of {} bytes, {} needs {iv_len}",
            iv.len(),
            self.encr.name()
        );
        match &self.keys {
            Keys::Aead { .. } => iv[..iv_len].copy_from_slice(&counter.to_be_bytes()),
            Keys::Cbc(cbc) => {
                let enc = &cbc.enc;
                // One CBC block with a zero IV is the raw forward cipher (ECB) of the block.
                let mut block = [0u8; AES_BLOCK];
                block[AES_BLOCK - 8..].copy_from_slice(&counter.to_be_bytes());
                enc.less_safe_encrypt(
                    &mut block,
                    EncryptionContext::Iv128(FixedLength::from([0u8; AES_BLOCK])),
                )
                .expect("a single whole block with a 16-byte IV always encrypts");
                iv[..iv_len].copy_from_slice(&block);
            }
        }
    }

    /// Rejects IV, ICV, trailer and buffer lengths this cipher cannot process.
    fn check_lengths(
        &self,
        iv: &[u8],
        buf: &[u8],
        trailer: &[u8],
        icv_len: usize,
    ) -> Result<(), Error> {
        if iv.len() != self.iv_len() {
            return Err(Error::Length {
                what: "iv",
                len: iv.len(),
            });
        }
        if icv_len != self.icv_len() {
            return Err(Error::Length {
                what: "icv",
                len: icv_len,
            });
        }
        match self.keys {
            Keys::Aead { .. } if !trailer.is_empty() => Err(Error::Unsupported(
                "an authenticated trailer with an AEAD cipher",
            )),
            // RFC 3602 §2.4: the CBC payload is a whole number of 16-byte blocks.
            Keys::Cbc(_) if !buf.len().is_multiple_of(AES_BLOCK) => Err(Error::Length {
                what: "CBC payload",
                len: buf.len(),
            }),
            _ => Ok(()),
        }
    }
}

/// nonce = salt | iv (RFC 4106 §4, RFC 7634 §2).
fn aead_nonce(salt: &[u8; SALT_LEN], iv: &[u8]) -> Result<Nonce, Error> {
    let iv: &[u8; AEAD_IV_LEN] = iv.try_into().map_err(|_| Error::Length {
        what: "iv",
        len: iv.len(),
    })?;
    let mut nonce = [0u8; SALT_LEN + AEAD_IV_LEN];
    nonce[..SALT_LEN].copy_from_slice(salt);
    nonce[SALT_LEN..].copy_from_slice(iv);
    Ok(Nonce::assume_unique_for_key(nonce))
}

/// The 16-byte CBC IV as aws-lc takes it.
fn cbc_iv(iv: &[u8]) -> Result<FixedLength<AES_BLOCK>, Error> {
    FixedLength::try_from(iv).map_err(|_| Error::Length {
        what: "iv",
        len: iv.len(),
    })
}

/// Untruncated HMAC over `aad | iv | ciphertext | trailer`.
fn cbc_mac(key: &hmac::Key, aad: &[u8], iv: &[u8], ciphertext: &[u8], trailer: &[u8]) -> hmac::Tag {
    let mut ctx = hmac::Context::with_key(key);
    ctx.update(aad);
    ctx.update(iv);
    ctx.update(ciphertext);
    ctx.update(trailer);
    ctx.sign()
}

#[cfg(test)]
#[path = "cipher_tests.rs"]
mod tests;
