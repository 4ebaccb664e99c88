//! The sending side of an ESP SA in tunnel mode (RFC 4303 §3.3): sequence number allocation
//! without locks (§3.3.3), IV from the sequence number, padding 1, 2, 3, ... (§2.4), Next
//! Header 4 or 41 (§2.6), ICV (§3.3.4), all in place in the caller's buffer.

use wire::esp::ESP_HEADER_LEN;
use wire::ip::{IpProtocol, IpVersion};
use wire::EspSpi;

use crypto::SaCipher;

use crate::counters::{CounterSnapshot, DropReason, SaCounters};
use crate::error::EspError;
use crate::sa::{SaConfig, SaCore};
use crate::seq::SequenceCounter;

/// The result of sealing a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sealed {
    /// Length of the ESP packet at the start of the buffer (SPI through ICV).
    pub len: usize,
    /// The sequence number it carries (full 64 bits with ESN).
    pub seq: u64,
}

/// An outbound ESP SA. Shareable between threads (`&self` everywhere): every packet gets its
/// own sequence number from an atomic counter.
///
/// Buffer contract for [`Self::seal`]: the caller writes the inner IP packet at
/// `buf[self.header_len()..]` and passes `buf` starting where the ESP header goes, with at
/// least [`Self::sealed_len`] bytes (at most [`Self::overhead`] more than the inner packet).
/// The ESP packet is then `buf[..sealed.len]`.
#[derive(Debug)]
pub struct OutboundSa {
    core: SaCore,
    seq: SequenceCounter,
    counters: SaCounters,
}

impl OutboundSa {
    /// An SA sending with `spi` (chosen by the peer) and `cipher` (this direction's keys).
    /// Its first sequence number is 1.
    pub fn new(spi: EspSpi, cipher: SaCipher, config: &SaConfig) -> Result<Self, EspError> {
        let soft = config.soft_limit(spi)?;
        let core = SaCore::new(spi, cipher, config)?;
        Ok(Self {
            seq: SequenceCounter::new(1, config.hard_limit(), soft),
            core,
            counters: SaCounters::default(),
        })
    }

    /// The SPI.
    pub fn spi(&self) -> EspSpi {
        self.core.spi
    }

    /// True if extended sequence numbers are in use.
    pub fn esn(&self) -> bool {
        self.core.esn
    }

    /// ESP header plus IV: the offset of the inner packet in the buffer.
    pub fn header_len(&self) -> usize {
        self.core.layout.header_len()
    }

    /// The largest trailer (padding, Pad Length, Next Header, ICV) this SA appends.
    pub fn max_trailer_len(&self) -> usize {
        self.core.layout.max_trailer_len()
    }

    /// Largest number of bytes sealing adds to an inner packet.
    pub fn overhead(&self) -> usize {
        self.header_len() + self.max_trailer_len()
    }

    /// The exact length of the ESP packet for an inner packet of `inner_len` bytes.
    pub fn sealed_len(&self, inner_len: usize) -> usize {
        self.core.layout.sealed_len(inner_len)
    }

    /// Seals the inner IP packet at `buf[header_len()..][..inner_len]` into an ESP packet
    /// at `buf[..sealed.len]`, with the next sequence number: [`Self::allocate`] and
    /// [`Self::seal_with_seq`] in one. Next Header comes from the packet's version nibble.
    /// Does not allocate memory. On error nothing was sent and, except for
    /// `SequenceExhausted`, no sequence number was used.
    pub fn seal(&self, buf: &mut [u8], inner_len: usize) -> Result<Sealed, EspError> {
        let r = self.seal_inner(buf, inner_len, None, None);
        if r.is_ok() {
            self.counters.packet(inner_len);
        }
        self.count_drop(r)
    }

    /// Allocates the next outbound sequence number (RFC 4303 §3.3.3: each at most once, the
    /// first is 1, never cycling), without sealing. A pipeline allocates numbers in its
    /// serial stage, in the order packets arrive, and seals them later on any thread with
    /// [`Self::seal_with_seq`], so that the peer sees numbers in order even though sealing
    /// runs in parallel. Lock-free; `SequenceExhausted` (counted as a drop) once the limit
    /// has been used.
    #[inline]
    pub fn allocate(&self) -> Result<u64, EspError> {
        self.seq.allocate().ok_or_else(|| {
            self.counters.drop(DropReason::SequenceExhausted);
            EspError::SequenceExhausted { spi: self.core.spi }
        })
    }

    /// [`Self::seal`] with a sequence number obtained from [`Self::allocate`] on this SA.
    ///
    /// Contract: each number from `allocate` is passed here at most once. Sealing two packets
    /// with one number would reuse the AEAD nonce (RFC 4106 §3.1: fatal for GCM's
    /// confidentiality and integrity) and present the peer a replay. A number that is never
    /// sealed (the packet was dropped, or this call failed) is a gap in the sequence, which
    /// RFC 4303 §3.3.3 allows: the receiver's window marks it unseen and it eventually
    /// slides out. `seq` must come from `allocate`; 0 or a number past the SA's limit is
    /// refused as `InvalidSequence` (other misuse cannot be detected without a shared read
    /// per packet).
    pub fn seal_with_seq(
        &self,
        buf: &mut [u8],
        inner_len: usize,
        seq: u64,
    ) -> Result<Sealed, EspError> {
        let r = self.seal_inner(buf, inner_len, None, Some(seq));
        if r.is_ok() {
            self.counters.packet(inner_len);
        }
        self.count_drop(r)
    }

    /// Seals a dummy packet (RFC 4303 §2.6, Next Header 59): `payload_len` bytes at
    /// `buf[header_len()..]` that the caller filled (e.g. with random data), for traffic flow
    /// confidentiality. The peer discards it after authenticating it.
    pub fn seal_dummy(&self, buf: &mut [u8], payload_len: usize) -> Result<Sealed, EspError> {
        let r = self.seal_inner(buf, payload_len, Some(IpProtocol::NO_NEXT_HEADER), None);
        if r.is_ok() {
            self.counters.dummy();
        }
        self.count_drop(r)
    }

    fn count_drop(&self, r: Result<Sealed, EspError>) -> Result<Sealed, EspError> {
        if let Err(e) = &r {
            if let Some(reason) = e.reason() {
                self.counters.drop(reason);
            }
        }
        r
    }

    /// Checks the buffer and the inner packet, takes a sequence number (`seq`, or the next
    /// one from the counter once the checks passed), and seals.
    fn seal_inner(
        &self,
        buf: &mut [u8],
        payload_len: usize,
        next_header: Option<IpProtocol>,
        seq: Option<u64>,
    ) -> Result<Sealed, EspError> {
        let spi = self.core.spi;
        let need = self.sealed_len(payload_len);
        if buf.len() < need {
            return Err(EspError::BufferTooSmall {
                spi,
                need,
                got: buf.len(),
            });
        }
        let hl = self.header_len();
        let next_header = match next_header {
            Some(nh) => nh,
            None => {
                let inner = &buf[hl..hl + payload_len];
                let version = IpVersion::of(inner).map_err(|_| EspError::InnerNotIp {
                    spi,
                    version: inner.first().map_or(0, |b| b >> 4),
                })?;
                version.encapsulation_protocol()
            }
        };
        let seq = match seq {
            Some(seq) if seq == 0 || seq > self.seq.limit() => {
                return Err(EspError::InvalidSequence { spi, seq });
            }
            Some(seq) => seq,
            None => self
                .seq
                .allocate()
                .ok_or(EspError::SequenceExhausted { spi })?,
        };
        let len = self.seal_at(buf, payload_len, next_header, seq, None)?;
        Ok(Sealed { len, seq })
    }

    /// Writes header, IV, trailer and ICV around the payload at `buf[header_len()..]` for
    /// sequence number `seq`. `iv` overrides the IV derived from `seq` (tests with published
    /// vectors use fixed IVs). The caller checked the buffer length.
    pub(crate) fn seal_at(
        &self,
        buf: &mut [u8],
        payload_len: usize,
        next_header: IpProtocol,
        seq: u64,
        iv: Option<&[u8]>,
    ) -> Result<usize, EspError> {
        let layout = &self.core.layout;
        let spi = self.core.spi;
        let hl = layout.header_len();
        let pad = layout.padding(payload_len);
        let ct_end = hl + payload_len + pad + 2;
        let end = ct_end + layout.icv_len;
        let buf = &mut buf[..end];

        buf[..4].copy_from_slice(&spi.0.to_be_bytes());
        buf[4..8].copy_from_slice(&(seq as u32).to_be_bytes());
        match iv {
            Some(iv) => buf[ESP_HEADER_LEN..hl].copy_from_slice(iv),
            // RFC 4303 §3.3.2 leaves the IV to the cipher: AEAD uses the sequence number
            // (RFC 4106 §3.1, unique per key); CBC its encryption (unpredictable).
            None => self
                .core
                .cipher
                .iv_from_counter(seq, &mut buf[ESP_HEADER_LEN..hl]),
        }
        // RFC 4303 §2.4: default padding is the monotonic series 1, 2, 3, ...
        let trailer = &mut buf[hl + payload_len..ct_end];
        for (i, b) in trailer[..pad].iter_mut().enumerate() {
            *b = (i + 1) as u8;
        }
        trailer[pad] = pad as u8;
        trailer[pad + 1] = next_header.0;

        let (head, rest) = buf.split_at_mut(hl);
        let (pt, icv) = rest.split_at_mut(ct_end - hl);
        let (hdr, iv) = head.split_at(ESP_HEADER_LEN);
        self.core
            .seal(seq, hdr, iv, pt, icv)
            .map_err(|source| EspError::Crypto { spi, source })?;
        Ok(end)
    }

    /// The sequence number the next packet will get (past the limit once exhausted).
    pub fn next_seq(&self) -> u64 {
        self.seq.peek()
    }

    /// True once the soft limit has been passed: the CHILD_SA should be rekeyed now
    /// (RFC 7296 §2.8), well before [`Self::is_exhausted`].
    pub fn needs_rekey(&self) -> bool {
        self.seq.needs_rekey()
    }

    /// True once every sequence number has been used; `seal` fails from then on.
    pub fn is_exhausted(&self) -> bool {
        self.seq.is_exhausted()
    }

    /// Packets, bytes and drops so far.
    pub fn counters(&self) -> CounterSnapshot {
        self.counters.snapshot()
    }

    /// Moves the sequence counter (tests only).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn set_next_seq(&self, next: u64) {
        self.seq.set_next(next);
    }

    /// Seals `buf[header_len()..][..pt_len]` exactly as given, trailer included, for
    /// sequence number `seq` (tests only: crafts authentic packets with bad trailers).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn seal_plaintext(&self, buf: &mut [u8], pt_len: usize, seq: u64) -> usize {
        let hl = self.header_len();
        let end = hl + pt_len + self.core.layout.icv_len;
        buf[..4].copy_from_slice(&self.core.spi.0.to_be_bytes());
        buf[4..8].copy_from_slice(&(seq as u32).to_be_bytes());
        self.core
            .cipher
            .iv_from_counter(seq, &mut buf[ESP_HEADER_LEN..hl]);
        let (head, rest) = buf[..end].split_at_mut(hl);
        let (pt, icv) = rest.split_at_mut(pt_len);
        let (hdr, iv) = head.split_at(ESP_HEADER_LEN);
        self.core
            .seal(seq, hdr, iv, pt, icv)
            .expect("test plaintext has a valid length");
        end
    }
}
