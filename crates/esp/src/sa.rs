//! What inbound and outbound SAs share: the negotiated parameters ([`SaConfig`]), the packet
//! layout of RFC 4303 §2 for a given cipher (header, IV, padding, trailer, ICV), and the
//! associated data for the ICV with and without extended sequence numbers (RFC 4303 §2.2.1,
//! §3.3.2.1; RFC 4106 §5; RFC 7634 §2.1).
//!
//! ```text
//!  0                   1                   2                   3
//! +---------------------------------------------------------------+  ^
//! |               Security Parameters Index (SPI)                 |  | header_len
//! |                  Sequence Number (low 32 bits)                |  | = 8 + IV
//! |                  IV (8 AEAD / 16 CBC)                         |  v
//! +---------------------------------------------------------------+  ^
//! |                  inner IP packet (Next Header 4 or 41)        |  | encrypted
//! |   Padding 1, 2, 3, ... (0-255 bytes)  | Pad Length | Next Hdr |  v
//! +---------------------------------------------------------------+
//! |                  ICV (16 AEAD / 12-32 HMAC)                   |
//! +---------------------------------------------------------------+
//! ```
//! With ESN, the high 32 bits of the sequence number are not sent but authenticated: AEAD
//! takes AAD = SPI | seq high | seq low; CBC+HMAC appends seq high after the ciphertext for
//! the ICV computation only.

use crypto::{Error as CryptoError, SaCipher};
use wire::esp::ESP_HEADER_LEN;
use wire::EspSpi;

use crate::error::EspError;
use crate::seq::{DEFAULT_SOFT_LIMIT, DEFAULT_SOFT_LIMIT_ESN, MAX_ESN, MAX_SEQ};

/// Default anti-replay window (RFC 4303 §3.4.3 requires at least 32 and recommends 64; a
/// peer that sends from several cores, or a network with several paths, reorders more, so we
/// default higher).
pub const DEFAULT_REPLAY_WINDOW: u32 = 1024;
/// Smallest accepted replay window (RFC 4303 §3.4.3: "a minimum window size of 32").
pub const MIN_REPLAY_WINDOW: u32 = 32;
/// Largest accepted replay window (8 KiB of bitmap per SA).
pub const MAX_REPLAY_WINDOW: u32 = 1 << 16;

/// The largest ESP header plus IV of any supported transform (8 + 16 for AES-CBC).
pub const MAX_HEADER_LEN: usize = ESP_HEADER_LEN + 16;
/// The largest trailer of any supported transform: 15 bytes of CBC padding, Pad Length,
/// Next Header, and the 32-byte ICV of HMAC-SHA2-512-256.
pub const MAX_TRAILER_LEN: usize = 15 + 2 + 32;
/// Header plus trailer bound: a buffer of `MAX_OVERHEAD` + inner length fits any SA's packet.
pub const MAX_OVERHEAD: usize = MAX_HEADER_LEN + MAX_TRAILER_LEN;

/// Parameters negotiated for a CHILD_SA, shared by its two directions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaConfig {
    /// Extended (64-bit) sequence numbers (RFC 4303 §2.2.1; IKEv2 ESN transform 1).
    pub esn: bool,
    /// Inbound anti-replay window size, `MIN_REPLAY_WINDOW..=MAX_REPLAY_WINDOW`.
    pub replay_window: u32,
    /// Outbound: report [`needs_rekey`](crate::OutboundSa::needs_rekey) once a sequence
    /// number above this has been used. `None`: 2^31 without ESN, 2^63 with ESN.
    pub rekey_after: Option<u64>,
}

impl Default for SaConfig {
    fn default() -> Self {
        Self {
            esn: false,
            replay_window: DEFAULT_REPLAY_WINDOW,
            rekey_after: None,
        }
    }
}

impl SaConfig {
    /// The last sequence number an outbound SA may use.
    pub(crate) fn hard_limit(&self) -> u64 {
        if self.esn {
            MAX_ESN
        } else {
            MAX_SEQ
        }
    }

    /// The soft (rekey) limit, validated against the hard limit.
    pub(crate) fn soft_limit(&self, spi: EspSpi) -> Result<u64, EspError> {
        let default = if self.esn {
            DEFAULT_SOFT_LIMIT_ESN
        } else {
            DEFAULT_SOFT_LIMIT
        };
        let soft = self.rekey_after.unwrap_or(default);
        if soft >= self.hard_limit() {
            return Err(EspError::InvalidConfig {
                spi,
                field: "rekey_after",
                reason: "must be below the sequence number limit",
            });
        }
        Ok(soft)
    }

    pub(crate) fn validate_window(&self, spi: EspSpi) -> Result<(), EspError> {
        if !(MIN_REPLAY_WINDOW..=MAX_REPLAY_WINDOW).contains(&self.replay_window) {
            return Err(EspError::InvalidConfig {
                spi,
                field: "replay_window",
                reason: "must be 32..=65536",
            });
        }
        Ok(())
    }
}

/// RFC 4303 §2.1: SPI values 1..=255 are reserved by IANA and 0 is for local use only, never
/// sent on the wire.
pub(crate) fn validate_spi(spi: EspSpi) -> Result<(), EspError> {
    if spi.0 < 256 {
        return Err(EspError::InvalidConfig {
            spi,
            field: "spi",
            reason: "0..=255 are reserved (RFC 4303 §2.1)",
        });
    }
    Ok(())
}

/// Sizes of the parts of an ESP packet for one cipher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) iv_len: usize,
    pub(crate) icv_len: usize,
    /// Alignment of Payload | Padding | Pad Length | Next Header: the cipher's block size,
    /// and at least 4 so the ICV is 4-byte aligned (RFC 4303 §2.4).
    pub(crate) align: usize,
    /// Block size the ciphertext must be a multiple of on receipt (1 for AEAD).
    pub(crate) block: usize,
    pub(crate) aead: bool,
}

impl Layout {
    pub(crate) fn new(cipher: &SaCipher) -> Self {
        let block = cipher.block_size();
        Self {
            iv_len: cipher.iv_len(),
            icv_len: cipher.icv_len(),
            align: block.max(4),
            block,
            aead: cipher.encr().is_aead(),
        }
    }

    /// ESP header plus IV: where the inner packet starts.
    pub(crate) fn header_len(&self) -> usize {
        ESP_HEADER_LEN + self.iv_len
    }

    /// Padding for a payload (RFC 4303 §2.4): the minimum that aligns payload + 2.
    pub(crate) fn padding(&self, payload_len: usize) -> usize {
        (self.align - (payload_len + 2) % self.align) % self.align
    }

    /// Length of the sealed packet for a payload.
    pub(crate) fn sealed_len(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len + self.padding(payload_len) + 2 + self.icv_len
    }

    /// Largest trailer: maximal padding, Pad Length, Next Header, ICV.
    pub(crate) fn max_trailer_len(&self) -> usize {
        self.align - 1 + 2 + self.icv_len
    }

    /// Shortest packet worth decrypting: header, IV, one block (or the 2 trailer bytes for
    /// AEAD), ICV.
    pub(crate) fn min_len(&self) -> usize {
        self.header_len() + self.block.max(2) + self.icv_len
    }
}

/// The associated data of RFC 4106 §5 / RFC 7634 §2.1 with ESN: SPI | seq high | seq low.
pub(crate) fn esn_aad(spi: EspSpi, seq: u64) -> [u8; 12] {
    let mut aad = [0u8; 12];
    aad[..4].copy_from_slice(&spi.0.to_be_bytes());
    aad[4..].copy_from_slice(&seq.to_be_bytes());
    aad
}

/// The keyed state both directions share: SPI, cipher, ESN flag and layout.
#[derive(Debug)]
pub(crate) struct SaCore {
    pub(crate) spi: EspSpi,
    pub(crate) cipher: SaCipher,
    pub(crate) esn: bool,
    pub(crate) layout: Layout,
}

impl SaCore {
    pub(crate) fn new(spi: EspSpi, cipher: SaCipher, config: &SaConfig) -> Result<Self, EspError> {
        validate_spi(spi)?;
        let layout = Layout::new(&cipher);
        Ok(Self {
            spi,
            cipher,
            esn: config.esn,
            layout,
        })
    }

    /// Seals `pt` in place with the ICV input RFC 4303 prescribes for this SA. `hdr` is the
    /// 8-byte ESP header as sent.
    pub(crate) fn seal(
        &self,
        seq: u64,
        hdr: &[u8],
        iv: &[u8],
        pt: &mut [u8],
        icv: &mut [u8],
    ) -> Result<(), CryptoError> {
        if !self.esn {
            self.cipher.seal_in_place(iv, hdr, pt, icv)
        } else if self.layout.aead {
            self.cipher
                .seal_in_place(iv, &esn_aad(self.spi, seq), pt, icv)
        } else {
            let high = ((seq >> 32) as u32).to_be_bytes();
            self.cipher
                .seal_in_place_with_trailer(iv, hdr, pt, &high, icv)
        }
    }

    /// Verifies and decrypts `ct` in place; the inverse of [`Self::seal`].
    pub(crate) fn open(
        &self,
        seq: u64,
        hdr: &[u8],
        iv: &[u8],
        ct: &mut [u8],
        icv: &[u8],
    ) -> Result<(), CryptoError> {
        if !self.esn {
            self.cipher.open_in_place(iv, hdr, ct, icv)
        } else if self.layout.aead {
            self.cipher
                .open_in_place(iv, &esn_aad(self.spi, seq), ct, icv)
        } else {
            let high = ((seq >> 32) as u32).to_be_bytes();
            self.cipher
                .open_in_place_with_trailer(iv, hdr, ct, &high, icv)
        }
    }
}
