//! The ESP SA pair of one CHILD_SA over the `esp` crate: keyed from `ike::ChildSaInfo`
//! (inbound keys open what the peer sends, outbound keys seal what we send, RFC 7296 §2.17),
//! with `esp`'s errors mapped onto the data plane's drop reasons.

use crate::api::ChildStats;
use crate::stats::DropReason;
use crypto::SaCipher;
use esp::{
    EspError, InboundSa, Opened, OutboundSa, SaConfig, DEFAULT_REPLAY_WINDOW, MAX_REPLAY_WINDOW,
    MIN_REPLAY_WINDOW,
};
use ike::ChildSaInfo;
use std::ops::Range;
use wire::ip::IpVersion;

/// Inbound and outbound SA of a CHILD_SA; both are shared by every thread that uses them.
pub(crate) struct SaPair {
    inbound: InboundSa,
    outbound: OutboundSa,
}

/// The anti-replay window to use for a configured size (0: the default; else clamped to what
/// the `esp` crate supports), raised to `min` (what the data plane's parallelism needs).
fn window(requested: u32, min: u32) -> u32 {
    let w = if requested == 0 {
        DEFAULT_REPLAY_WINDOW
    } else {
        requested
    };
    w.max(min).clamp(MIN_REPLAY_WINDOW, MAX_REPLAY_WINDOW)
}

/// The smallest inbound replay window that never refuses a packet only because several
/// workers opened packets of one SA out of arrival order: while one worker opens a batch, each
/// other worker can run ahead by as many batches as its pool holds send batches (`pool`: it
/// fills one, hands it on, takes the next, until all are waiting behind the first batch), so
/// acceptance order trails arrival order by at most
/// `batch_packets × (1 + (workers - 1) × pool)` sequence numbers. Rounded up to a power of two
/// and capped at the largest window the `esp` crate supports.
pub(crate) fn parallel_window(batch_packets: usize, workers: usize, pool: usize) -> u32 {
    if workers <= 1 {
        return MIN_REPLAY_WINDOW;
    }
    let behind = batch_packets.saturating_mul((workers - 1).saturating_mul(pool).saturating_add(1));
    behind
        .saturating_add(1)
        .checked_next_power_of_two()
        .and_then(|w| u32::try_from(w).ok())
        .unwrap_or(MAX_REPLAY_WINDOW)
        .min(MAX_REPLAY_WINDOW)
}

impl SaPair {
    /// Keys both SAs; `rekey_after` overrides the soft sequence number limit (None: the
    /// `esp` crate's default, half the sequence number space); the inbound replay window is at
    /// least `min_window`.
    pub(crate) fn new(
        child: &ChildSaInfo,
        rekey_after: Option<u64>,
        min_window: u32,
    ) -> Result<Self, String> {
        let keys = &child.keys;
        let cipher = |encr: &[u8], integ: &[u8], dir: &str| {
            SaCipher::new(child.encr, encr, child.integ.map(|i| (i, integ)))
                .map_err(|e| format!("{dir} keys: {e}"))
        };
        let cfg = SaConfig {
            esn: child.esn,
            replay_window: window(child.replay_window, min_window),
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

    /// Opens an ESP packet (SPI through ICV) in place: the inner packet's range and version,
    /// and whether its sequence number was the highest accepted so far (at the moment of the
    /// check; a packet reordered behind newer ones is not).
    pub(crate) fn open(
        &self,
        pkt: &mut [u8],
    ) -> Result<(Range<usize>, IpVersion, bool), DropReason> {
        match self.inbound.open(pkt) {
            Ok(Opened::Packet {
                version,
                inner,
                seq,
            }) => Ok((inner, version, seq >= self.inbound.highest_seq())),
            // RFC 4303 §2.6: an authentic dummy packet is discarded.
            Ok(Opened::Dummy { .. }) => Err(DropReason::EspDummy),
            Err(e) => Err(drop_reason(&e)),
        }
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
        assert_eq!(window(0, 0), DEFAULT_REPLAY_WINDOW);
        assert_eq!(window(1, 0), MIN_REPLAY_WINDOW);
        assert_eq!(window(64, 0), 64);
        assert_eq!(window(u32::MAX, 0), MAX_REPLAY_WINDOW);
        assert_eq!(window(64, 4096), 4096);
        assert_eq!(window(8192, 4096), 8192);
    }

    #[test]
    fn parallel_window_covers_the_batches_in_flight() {
        assert_eq!(parallel_window(2048, 1, 3), MIN_REPLAY_WINDOW);
        // 2 workers, pool 3: one batch plus three run ahead = 4 batches (and one more packet).
        assert_eq!(parallel_window(512, 2, 3), 4096);
        assert_eq!(parallel_window(2048, 2, 3), 16384);
        assert_eq!(parallel_window(2048, 64, 3), MAX_REPLAY_WINDOW);
        assert_eq!(
            parallel_window(usize::MAX, usize::MAX, 3),
            MAX_REPLAY_WINDOW
        );
    }
}
