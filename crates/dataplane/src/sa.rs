//! The ESP SA pair of one CHILD_SA over the `esp` crate: keyed from `ike::ChildSaInfo`
//! (inbound keys open what the peer sends, outbound keys seal what we send, RFC 7296 §2.17),
//! with `esp`'s errors mapped onto the data plane's drop reasons.

use crate::stats::DropReason;
use crypto::SaCipher;
use datapath::ChildStats;
use esp::{
    EspError, InboundSa, Opened, OutboundSa, SaConfig, Unaccepted, DEFAULT_REPLAY_WINDOW,
    MAX_REPLAY_WINDOW, MIN_REPLAY_WINDOW,
};
use ike::ChildSaInfo;
use std::ops::Range;
use wire::ip::IpVersion;

/// What an authentic packet carried: its inner packet's range and IP version, or why it is
/// dropped once accepted.
pub(crate) type InnerPacket = Result<(Range<usize>, IpVersion), DropReason>;

/// Inbound and outbound SA of a CHILD_SA; both are shared by every thread that uses them.
pub(crate) struct SaPair {
    inbound: InboundSa,
    outbound: OutboundSa,
}

/// The anti-replay window to use for a configured size (0: the default; else clamped to what
/// the `esp` crate supports). The data plane's parallelism needs no larger window: packets are
/// accepted in arrival order whatever the number of workers (see `accept`).
fn window(requested: u32) -> u32 {
    let w = if requested == 0 {
        DEFAULT_REPLAY_WINDOW
    } else {
        requested
    };
    w.clamp(MIN_REPLAY_WINDOW, MAX_REPLAY_WINDOW)
}

impl SaPair {
    /// Starts loading what opening and accepting inbound sequence number `seq` (low 32 bits)
    /// will read (a CPU hint, see [`crate::pipeline::open::Prefetch`]).
    pub(crate) fn prefetch_inbound(&self, seq: u32) {
        self.inbound.prefetch(seq);
    }

    /// Keys both SAs; `rekey_after` overrides the soft sequence number limit (None: the
    /// `esp` crate's default, half the sequence number space).
    pub(crate) fn new(child: &ChildSaInfo, rekey_after: Option<u64>) -> Result<Self, String> {
        let keys = &child.keys;
        let cipher = |encr: &[u8], integ: &[u8], dir: &str| {
            SaCipher::new(child.encr, encr, child.integ.map(|i| (i, integ)))
                .map_err(|e| format!("{dir} keys: {e}"))
        };
        let cfg = SaConfig {
            esn: child.esn,
            replay_window: window(child.replay_window),
            rekey_after,
        };
        let inbound = InboundSa::new(
            child.inbound_spi,
            cipher(&keys.inbound_encr, &keys.inbound_integ, "inbound")?,
            &cfg,
        )
        .map_err(|e| format!("inbound SA: {e}"))?;
        let outbound = OutboundSa::new(
            child.outbound_spi,
            cipher(&keys.outbound_encr, &keys.outbound_integ, "outbound")?,
            &cfg,
        )
        .map_err(|e| format!("outbound SA: {e}"))?;
        Ok(Self { inbound, outbound })
    }

    /// Verifies and decrypts an ESP packet (SPI through ICV) in place, without accepting its
    /// sequence number. `Err`: not authentic (or refused before decryption), drop it. `Ok`:
    /// an authentic packet, to be passed to [`accept`](Self::accept) in arrival order, with
    /// its inner packet's range and version or the reason to drop it after acceptance.
    pub(crate) fn open_unaccepted(
        &self,
        pkt: &mut [u8],
    ) -> Result<(Unaccepted, InnerPacket), DropReason> {
        let (packet, opened) = self
            .inbound
            .open_unaccepted(pkt)
            .map_err(|e| drop_reason(&e))?;
        let inner = match opened {
            Ok(Opened::Packet { version, inner, .. }) => Ok((inner, version)),
            // RFC 4303 §2.6: an authentic dummy packet is discarded.
            Ok(Opened::Dummy { .. }) => Err(DropReason::EspDummy),
            Err(e) => Err(drop_reason(&e)),
        };
        Ok((packet, inner))
    }

    /// Accepts an authentic packet in the replay window: how far it lay behind the highest
    /// number accepted (0: it is the newest), or the drop reason if it is a replay or too
    /// old by now.
    pub(crate) fn accept(&self, packet: Unaccepted) -> Result<u64, DropReason> {
        self.inbound.accept(packet).map_err(|e| drop_reason(&e))
    }

    /// Bytes before the inner packet in a sealed packet (ESP header and IV).
    pub(crate) fn header_len(&self) -> usize {
        self.outbound.header_len()
    }

    /// The exact ESP packet length for an inner packet of `inner_len` bytes.
    pub(crate) fn sealed_len(&self, inner_len: usize) -> usize {
        self.outbound.sealed_len(inner_len)
    }

    /// Allocates the next outbound sequence number (RFC 4303 §3.3.3).
    pub(crate) fn allocate_seq(&self) -> Result<u64, EspError> {
        self.outbound.allocate()
    }

    /// Seals the `inner_len`-byte IP packet at `buf[header_len()..]` with sequence number
    /// `seq` from [`allocate_seq`](Self::allocate_seq); returns the ESP packet's length at the
    /// start of `buf`.
    pub(crate) fn seal_with_seq(
        &self,
        buf: &mut [u8],
        inner_len: usize,
        seq: u64,
    ) -> Result<usize, EspError> {
        self.outbound
            .seal_with_seq(buf, inner_len, seq)
            .map(|s| s.len)
    }

    /// True once the outbound SA passed its soft sequence number limit (RFC 4303 §3.3.3:
    /// the SA must be replaced before the counter would cycle).
    pub(crate) fn rekey_due(&self) -> bool {
        self.outbound.needs_rekey()
    }

    /// Fills the packet and byte counters of `stats` from the SAs (`extra_drops_in`: inbound
    /// packets dropped after decryption, e.g. by the selector check).
    pub(crate) fn fill_stats(&self, stats: &mut ChildStats, extra_drops_in: u64) {
        let i = self.inbound.counters();
        let o = self.outbound.counters();
        stats.packets_in = i.packets;
        stats.bytes_in = i.bytes;
        stats.drops_in = i.total_drops() + i.dummy_packets + extra_drops_in;
        stats.packets_out = o.packets;
        stats.bytes_out = o.bytes;
        stats.reordered_in = i.reordered;
        stats.max_reorder_in = i.max_reorder;
        stats.replay_window = self.inbound.replay_window();
    }
}

/// The data plane's drop reason for an `esp` error.
fn drop_reason(e: &EspError) -> DropReason {
    match e {
        EspError::TooOld { .. } | EspError::Replayed { .. } => DropReason::EspReplay,
        EspError::Authentication { .. } => DropReason::EspAuth,
        EspError::UnexpectedNextHeader { .. } => DropReason::EspNextHeader,
        EspError::MalformedInner { .. } => DropReason::InnerMalformed,
        EspError::Truncated { .. }
        | EspError::SpiMismatch { .. }
        | EspError::InvalidSequence { .. }
        | EspError::CiphertextLength { .. }
        | EspError::BadPadding { .. }
        | EspError::SequenceExhausted { .. }
        | EspError::BufferTooSmall { .. }
        | EspError::InnerNotIp { .. }
        | EspError::Crypto { .. }
        | EspError::InvalidConfig { .. } => DropReason::EspMalformed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_window_sizes() {
        assert_eq!(window(0), DEFAULT_REPLAY_WINDOW);
        assert_eq!(window(1), MIN_REPLAY_WINDOW);
        assert_eq!(window(64), 64);
        assert_eq!(window(8192), 8192);
        assert_eq!(window(u32::MAX), MAX_REPLAY_WINDOW);
    }
}
