//! Per-SA statistics: packets and bytes that went through, dummy packets (RFC 4303 §2.6),
//! and drops by reason, as relaxed atomics read by `protego status`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a packet was not sealed or opened: one counter per reason (see `EspError`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// Shorter than header, IV, minimal trailer and ICV.
    Truncated,
    /// SPI of another SA.
    SpiMismatch,
    /// Sequence number 0 or not inferable.
    InvalidSequence,
    /// Below the replay window.
    TooOld,
    /// Already received.
    Replayed,
    /// ICV did not verify.
    Authentication,
    /// Ciphertext not a multiple of the cipher's block size.
    CiphertextLength,
    /// Pad Length or padding bytes invalid.
    BadPadding,
    /// Next Header neither IPv4, IPv6 nor "no next header".
    UnexpectedNextHeader,
    /// Inner packet does not parse as its Next Header says.
    MalformedInner,
    /// Outbound sequence numbers used up.
    SequenceExhausted,
    /// Caller's buffer lacks room for header or trailer.
    BufferTooSmall,
    /// Outbound inner packet is not IPv4 or IPv6.
    InnerNotIp,
    /// Unexpected error from the cipher.
    Crypto,
}

impl DropReason {
    /// Number of reasons.
    pub const COUNT: usize = 14;
    /// Every reason, in counter order.
    pub const ALL: [Self; Self::COUNT] = [
        Self::Truncated,
        Self::SpiMismatch,
        Self::InvalidSequence,
        Self::TooOld,
        Self::Replayed,
        Self::Authentication,
        Self::CiphertextLength,
        Self::BadPadding,
        Self::UnexpectedNextHeader,
        Self::MalformedInner,
        Self::SequenceExhausted,
        Self::BufferTooSmall,
        Self::InnerNotIp,
        Self::Crypto,
    ];

    /// A short stable name for status output and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Self::Truncated => "truncated",
            Self::SpiMismatch => "spi_mismatch",
            Self::InvalidSequence => "invalid_sequence",
            Self::TooOld => "too_old",
            Self::Replayed => "replayed",
            Self::Authentication => "authentication",
            Self::CiphertextLength => "ciphertext_length",
            Self::BadPadding => "bad_padding",
            Self::UnexpectedNextHeader => "unexpected_next_header",
            Self::MalformedInner => "malformed_inner",
            Self::SequenceExhausted => "sequence_exhausted",
            Self::BufferTooSmall => "buffer_too_small",
            Self::InnerNotIp => "inner_not_ip",
            Self::Crypto => "crypto",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The live counters of one SA (one direction). Updated with relaxed atomics: totals are
/// exact, a snapshot taken while traffic flows is not a single instant.
#[derive(Debug, Default)]
pub(crate) struct SaCounters {
    packets: AtomicU64,
    bytes: AtomicU64,
    dummies: AtomicU64,
    drops: [AtomicU64; DropReason::COUNT],
}

impl SaCounters {
    pub(crate) fn packet(&self, inner_bytes: usize) {
        self.packets.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(inner_bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn dummy(&self) {
        self.dummies.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn drop(&self, reason: DropReason) {
        self.drops[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            packets: self.packets.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            dummy_packets: self.dummies.load(Ordering::Relaxed),
            drops: core::array::from_fn(|i| self.drops[i].load(Ordering::Relaxed)),
        }
    }
}

/// A copy of an SA's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CounterSnapshot {
    /// Packets sealed (outbound) or opened and delivered (inbound).
    pub packets: u64,
    /// Inner packet bytes of those packets (the plaintext IP packets, without ESP overhead).
    pub bytes: u64,
    /// Dummy packets (RFC 4303 §2.6) sent, or received, authenticated and discarded.
    pub dummy_packets: u64,
    /// Drops, indexed like [`DropReason::ALL`].
    pub drops: [u64; DropReason::COUNT],
}

impl CounterSnapshot {
    /// Drops for one reason.
    pub fn drops_for(&self, reason: DropReason) -> u64 {
        self.drops[reason.index()]
    }

    /// All drops.
    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_index_their_counters() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
        let c = SaCounters::default();
        c.drop(DropReason::Replayed);
        c.drop(DropReason::Replayed);
        c.drop(DropReason::Crypto);
        c.packet(100);
        c.dummy();
        let s = c.snapshot();
        assert_eq!(s.drops_for(DropReason::Replayed), 2);
        assert_eq!(s.drops_for(DropReason::Crypto), 1);
        assert_eq!(s.total_drops(), 3);
        assert_eq!((s.packets, s.bytes, s.dummy_packets), (1, 100, 1));
        assert_eq!(DropReason::TooOld.name(), "too_old");
    }
}
