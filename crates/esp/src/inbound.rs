//! The receiving side of an ESP SA in tunnel mode (RFC 4303 §3.4): sequence number checks
//! and ESN inference before decryption (§3.4.3, Appendix A), ICV verification and decryption
//! (§3.4.4), the replay window update after it, padding (§2.4) and Next Header (§2.6)
//! checks, and validation of the inner IP packet.

use core::ops::Range;

use crypto::{Error as CryptoError, SaCipher};
use wire::esp::{EspPacket, ESP_HEADER_LEN};
use wire::ip::{IpProtocol, IpVersion, Ipv4Packet, Ipv6Packet};
use wire::EspSpi;

use crate::counters::{CounterSnapshot, DropReason, SaCounters};
use crate::error::EspError;
use crate::replay::{ReplayError, ReplayWindow};
use crate::sa::{SaConfig, SaCore};

/// What an authentic ESP packet carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// An inner IP packet, decrypted in place at `buf[inner]`. TFC padding (RFC 4303 §2.7)
    /// after the inner packet's own length is excluded from the range.
    Packet {
        /// The full sequence number.
        seq: u64,
        /// IPv4 or IPv6, from Next Header 4 or 41 and confirmed by the packet.
        version: IpVersion,
        /// Where the inner packet is in the buffer.
        inner: Range<usize>,
    },
    /// A dummy packet (Next Header 59, RFC 4303 §2.6): authentic, to be discarded silently.
    Dummy {
        /// The full sequence number.
        seq: u64,
    },
}

/// An authentic packet whose sequence number the replay window has not yet accepted, from
/// [`InboundSa::open_unaccepted`]. Small and `Copy`, so a pipeline can carry it from the
/// thread that decrypted the packet to the stage that accepts packets in arrival order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "an authentic packet must be passed to `accept`, or the window never records it"]
pub struct Unaccepted {
    seq: u64,
    outcome: Outcome,
}

/// What an authentic packet turned out to carry, for the counters [`InboundSa::accept`]
/// updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Packet { inner_len: usize },
    Dummy,
    Failed(Option<DropReason>),
}

impl Unaccepted {
    /// The packet's full sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// An inbound ESP SA. Shareable between threads: any number of threads may open packets of
/// the same SA at once; the replay window accepts every sequence number at most once.
///
/// [`Self::open`] does everything. A pipeline that wants to drop replays before handing
/// packets to decrypting workers calls [`Self::check`] first and [`Self::open_checked`]
/// later with the sequence number `check` returned.
///
/// A pipeline that decrypts packets of one SA on several threads but wants the window to
/// decide exactly as it would on one thread calls [`Self::open_unaccepted`] on the workers
/// and [`Self::accept`] in arrival order (as Linux's pcrypt serialises `xfrm_input`'s
/// replay advance): otherwise a packet opened late can find the window already moved past
/// it by a later arrival, for example after a burst of losses longer than the window.
#[derive(Debug)]
pub struct InboundSa {
    core: SaCore,
    window: ReplayWindow,
    counters: SaCounters,
}

impl InboundSa {
    /// An SA receiving on `spi` (chosen by us) with `cipher` (the peer's sending keys).
    pub fn new(spi: EspSpi, cipher: SaCipher, config: &SaConfig) -> Result<Self, EspError> {
        config.validate_window(spi)?;
        let core = SaCore::new(spi, cipher, config)?;
        Ok(Self {
            core,
            window: ReplayWindow::new(config.replay_window),
            counters: SaCounters::default(),
        })
    }

    /// The SPI.
    pub fn spi(&self) -> EspSpi {
        self.core.spi
    }

    /// Starts loading what opening and accepting a packet with sequence number (low 32 bits)
    /// `seq` will read: this SA's state and its replay window's position and word. A CPU hint
    /// for a batch of packets of many SAs, whose misses then overlap (see `wire::prefetch`).
    pub fn prefetch(&self, seq: u32) {
        wire::prefetch::prefetch(self);
        self.window.prefetch(u64::from(seq));
    }

    /// True if extended sequence numbers are in use.
    pub fn esn(&self) -> bool {
        self.core.esn
    }

    /// The anti-replay window size.
    pub fn replay_window(&self) -> u32 {
        self.window.size()
    }

    /// The highest sequence number accepted so far (0 before the first packet).
    pub fn highest_seq(&self) -> u64 {
        self.window.top()
    }

    /// The shortest packet this SA can open (header, IV, one cipher block, ICV).
    pub fn min_packet_len(&self) -> usize {
        self.core.layout.min_len()
    }

    /// Packets, bytes and drops so far, and how far accepted packets arrived out of order
    /// ([`CounterSnapshot::reordered`], [`CounterSnapshot::max_reorder`]): every packet
    /// whose number the window accepted counts there, even one dropped afterwards for its
    /// padding or inner packet.
    pub fn counters(&self) -> CounterSnapshot {
        self.counters.snapshot()
    }

    /// The replay window (tests only: to place it near 2^32).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn window(&self) -> &ReplayWindow {
        &self.window
    }

    /// Verifies, decrypts and checks the ESP packet `buf` (SPI through ICV) in place.
    /// Does not allocate. On error the buffer's content is unspecified.
    pub fn open(&self, buf: &mut [u8]) -> Result<Opened, EspError> {
        let (unaccepted, opened) = self.open_unaccepted(buf)?;
        self.accept(unaccepted)?;
        opened
    }

    /// The checks before decryption (RFC 4303 §3.4.3): length, SPI, sequence number not
    /// zero, not too old and not seen, with the high-order ESN bits inferred (Appendix A2.2).
    /// Returns the full sequence number to pass to [`Self::open_checked`].
    pub fn check(&self, packet: &[u8]) -> Result<u64, EspError> {
        let r = self.check_inner(packet);
        if let Err(e) = &r {
            self.count_drop(e);
        }
        r
    }

    /// [`Self::open`] for a packet that already passed [`Self::check`], which returned
    /// `seq`. The window is consulted again after verification, so a replay that slipped
    /// between the two calls is still rejected.
    pub fn open_checked(&self, buf: &mut [u8], seq: u64) -> Result<Opened, EspError> {
        let (unaccepted, opened) = self.counted(self.verify(buf, seq))?;
        self.accept(unaccepted)?;
        opened
    }

    /// [`Self::open`] without the window update: checks the packet against the window,
    /// verifies its ICV and decrypts it in place. `Err` for a packet that is not authentic
    /// (or fails the checks before decryption; counted here): drop it, the window is
    /// untouched. `Ok` for an authentic packet, with what it carries (an inner packet, a
    /// dummy, or an error such as bad padding); its [`Unaccepted`] must go to
    /// [`Self::accept`], which decides whether the packet is new and counts it.
    pub fn open_unaccepted(
        &self,
        buf: &mut [u8],
    ) -> Result<(Unaccepted, Result<Opened, EspError>), EspError> {
        let r = self.check_inner(buf).and_then(|seq| self.verify(buf, seq));
        self.counted(r)
    }

    /// Accepts an authentic packet's sequence number in the replay window (RFC 4303 §3.4.3:
    /// updated only after the ICV verified) and counts the packet. Returns how far it lay
    /// below the highest number accepted (0: in order), or the replay error if the number
    /// was seen before or is now too old; the packet must then be dropped.
    pub fn accept(&self, packet: Unaccepted) -> Result<u64, EspError> {
        let seq = packet.seq;
        let behind = match self.window.update(seq) {
            Ok(behind) => behind,
            Err(e) => {
                let e = self.replay_error(e, seq);
                self.count_drop(&e);
                return Err(e);
            }
        };
        self.counters.accepted(behind);
        match packet.outcome {
            Outcome::Packet { inner_len } => self.counters.packet(inner_len),
            Outcome::Dummy => self.counters.dummy(),
            Outcome::Failed(Some(reason)) => self.counters.drop(reason),
            Outcome::Failed(None) => {}
        }
        Ok(behind)
    }

    fn counted<T>(&self, r: Result<T, EspError>) -> Result<T, EspError> {
        if let Err(e) = &r {
            self.count_drop(e);
        }
        r
    }

    fn count_drop(&self, e: &EspError) {
        if let Some(reason) = e.reason() {
            self.counters.drop(reason);
        }
    }

    fn replay_error(&self, e: ReplayError, seq: u64) -> EspError {
        let spi = self.core.spi;
        match e {
            ReplayError::Invalid => EspError::InvalidSequence { spi, seq },
            ReplayError::TooOld { top } => EspError::TooOld { spi, seq, top },
            ReplayError::Replayed => EspError::Replayed { spi, seq },
        }
    }

    /// The error for an ICV that did not verify. RFC 4303 Appendix A2.2 reads a low-order
    /// number below the window as belonging to the next 2^32 subspace, and only the ICV can
    /// tell; when that reading fails and the same number in the current subspace is below
    /// the window, the packet is reported as what it almost surely is: a late one.
    fn authentication_failure(&self, seq: u64) -> EspError {
        let spi = self.core.spi;
        let top = self.window.top();
        if self.core.esn && seq >> 32 > top >> 32 {
            let older = seq - (1 << 32);
            if older <= top.saturating_sub(u64::from(self.window.size())) {
                return EspError::TooOld {
                    spi,
                    seq: older,
                    top,
                };
            }
        }
        EspError::Authentication { spi, seq }
    }

    /// Length and SPI checks; returns the packet's low 32 sequence bits.
    fn header(&self, packet: &[u8]) -> Result<u32, EspError> {
        let (len, min) = (packet.len(), self.core.layout.min_len());
        let esp = EspPacket::new_checked(packet).map_err(|_| EspError::Truncated {
            spi: None,
            len,
            min,
        })?;
        if esp.spi() != self.core.spi {
            return Err(EspError::SpiMismatch {
                expected: self.core.spi,
                got: esp.spi(),
            });
        }
        if len < min {
            return Err(EspError::Truncated {
                spi: Some(self.core.spi),
                len,
                min,
            });
        }
        Ok(esp.seq())
    }

    fn check_inner(&self, packet: &[u8]) -> Result<u64, EspError> {
        let low = self.header(packet)?;
        let seq = if self.core.esn {
            self.window
                .infer_esn(low)
                .ok_or(EspError::InvalidSequence {
                    spi: self.core.spi,
                    seq: u64::from(low),
                })?
        } else {
            u64::from(low)
        };
        self.window
            .check(seq)
            .map_err(|e| self.replay_error(e, seq))?;
        Ok(seq)
    }

    /// Verifies and decrypts the packet numbered `seq` and interprets its payload, without
    /// touching the window. The outer `Err`: not authentic. The inner result: what the
    /// authentic packet carries.
    fn verify(
        &self,
        buf: &mut [u8],
        seq: u64,
    ) -> Result<(Unaccepted, Result<Opened, EspError>), EspError> {
        let opened = self
            .decrypt_unaccepted(buf, seq)?
            .and_then(|(next_header, payload)| self.interpret(buf, seq, next_header, payload));
        let outcome = match &opened {
            Ok(Opened::Packet { inner, .. }) => Outcome::Packet {
                inner_len: inner.len(),
            },
            Ok(Opened::Dummy { .. }) => Outcome::Dummy,
            Err(e) => Outcome::Failed(e.reason()),
        };
        Ok((Unaccepted { seq, outcome }, opened))
    }

    /// What a decrypted payload is (RFC 4303 §2.6): a dummy, or an inner IP packet whose own
    /// length excludes TFC padding.
    fn interpret(
        &self,
        buf: &[u8],
        seq: u64,
        next_header: IpProtocol,
        payload: Range<usize>,
    ) -> Result<Opened, EspError> {
        let spi = self.core.spi;
        match next_header {
            IpProtocol::NO_NEXT_HEADER => Ok(Opened::Dummy { seq }),
            IpProtocol::IPV4 | IpProtocol::IPV6 => {
                let inner = &buf[payload.clone()];
                let parsed = if next_header == IpProtocol::IPV4 {
                    Ipv4Packet::new_checked(inner)
                        .map(|p| (IpVersion::V4, usize::from(p.total_len())))
                } else {
                    Ipv6Packet::new_checked(inner).map(|p| (IpVersion::V6, p.total_len()))
                };
                let (version, len) =
                    parsed.map_err(|source| EspError::MalformedInner { spi, seq, source })?;
                Ok(Opened::Packet {
                    seq,
                    version,
                    inner: payload.start..payload.start + len,
                })
            }
            other => Err(EspError::UnexpectedNextHeader {
                spi,
                seq,
                next_header: other,
            }),
        }
    }

    /// Verifies the ICV and decrypts (RFC 4303 §3.4.4), accepts `seq` in the window, and
    /// checks the padding (§2.4). Returns Next Header and the payload's range in `buf`.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn decrypt(
        &self,
        buf: &mut [u8],
        seq: u64,
    ) -> Result<(IpProtocol, Range<usize>), EspError> {
        let payload = self.decrypt_unaccepted(buf, seq)?;
        let behind = self
            .window
            .update(seq)
            .map_err(|e| self.replay_error(e, seq))?;
        self.counters.accepted(behind);
        payload
    }

    /// Verifies the ICV and decrypts (RFC 4303 §3.4.4), then checks the padding (§2.4),
    /// without touching the window. The outer `Err`: not authentic (or not this packet's
    /// number); the inner result: Next Header and the payload's range in `buf`, or the
    /// padding error of an authentic packet.
    #[allow(clippy::type_complexity)]
    fn decrypt_unaccepted(
        &self,
        buf: &mut [u8],
        seq: u64,
    ) -> Result<Result<(IpProtocol, Range<usize>), EspError>, EspError> {
        let spi = self.core.spi;
        let low = self.header(buf)?;
        // `seq` must be this packet's number: same low bits, and 32 bits only without ESN.
        if low != seq as u32 || (!self.core.esn && seq > u64::from(u32::MAX)) || seq == 0 {
            return Err(EspError::InvalidSequence { spi, seq });
        }
        let layout = &self.core.layout;
        let hl = layout.header_len();
        let ct_len = buf.len() - hl - layout.icv_len;
        if !ct_len.is_multiple_of(layout.block) {
            return Err(EspError::CiphertextLength {
                spi,
                seq,
                len: ct_len,
                block: layout.block,
            });
        }
        let (head, rest) = buf.split_at_mut(hl);
        let (ct, icv) = rest.split_at_mut(ct_len);
        let (hdr, iv) = head.split_at(ESP_HEADER_LEN);
        self.core.open(seq, hdr, iv, ct, icv).map_err(|e| match e {
            CryptoError::Authentication => self.authentication_failure(seq),
            source => EspError::Crypto { spi, source },
        })?;
        // min_len guarantees ct_len >= 2.
        let next_header = IpProtocol(ct[ct_len - 1]);
        let pad_len = ct[ct_len - 2];
        let Some(payload_len) = ct_len.checked_sub(2 + usize::from(pad_len)) else {
            return Ok(Err(EspError::BadPadding { spi, seq, pad_len }));
        };
        // RFC 4303 §2.4: padding bytes are 1, 2, 3, ...; the receiver SHOULD check them.
        let padding = &ct[payload_len..payload_len + usize::from(pad_len)];
        if padding
            .iter()
            .enumerate()
            .any(|(i, &b)| usize::from(b) != i + 1)
        {
            return Ok(Err(EspError::BadPadding { spi, seq, pad_len }));
        }
        Ok(Ok((next_header, hl..hl + payload_len)))
    }
}
