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

/// The anti-replay window to use for a negotiated size (0: the default; else clamped to what
/// the `esp` crate supports).
fn window(requested: u32) -> u32 {
    if requested == 0 {
        DEFAULT_REPLAY_WINDOW
    } else {
        requested.clamp(MIN_REPLAY_WINDOW, MAX_REPLAY_WINDOW)
    }
}

impl SaPair {
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

    /// Most bytes after the inner packet (padding, Pad Length, Next Header, ICV).
    pub(crate) fn max_trailer_len(&self) -> usize {
        self.outbound.max_trailer_len()
    }

    /// Seals the `inner_len`-byte IP packet at `buf[header_len()..]`; returns the ESP packet's
    /// length at the start of `buf`.
    pub(crate) fn seal(&self, buf: &mut [u8], inner_len: usize) -> Result<usize, EspError> {
        self.outbound.seal(buf, inner_len).map(|s| s.len)
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
        assert_eq!(window(u32::MAX), MAX_REPLAY_WINDOW);
    }
}
