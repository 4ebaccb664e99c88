//! Per-SA statistics: packets and bytes that went through, dummy packets (RFC 4303 §2.6),
//! drops by reason, and how far inbound packets arrived out of order within the anti-replay
//! window (RFC 4303 §3.4.3), as relaxed atomics read by `protego status`, sharded by thread so
//! that workers sharing an SA do not contend on them.

use core::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::sync::CachePadded;

/// Why a packet was not sealed or opened: one counter per reason (see `EspError`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// Shorter than header, IV, minimal trailer and ICV.
    Truncated,
    /// SPI of another SA.
    SpiMismatch,
    /// Sequence number 0 or not inferable; outbound, one `allocate` cannot have returned.
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

/// Shards of the per-packet counters. Threads beyond this many share shards (still exact,
/// only contended again); 8 covers the worker counts of a data node while keeping an SA's
/// counters at 1 KiB per direction.
const SHARDS: usize = 8;

/// The counters every packet touches, on cache lines of their own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    packets: AtomicU64,
    bytes: AtomicU64,
    reordered: AtomicU64,
}

/// Threads that took a shard so far (see [`shard_index`]).
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

/// The shards any thread may have updated: the first [`NEXT_SHARD`] (all of them once that
/// many threads counted). A reader sums only those: a data node's two or four workers use
/// as many of an SA's eight shards, and reading the others cost a 10 000-tunnel scrape
/// thousands of needless cache misses.
fn shards_in_use() -> usize {
    NEXT_SHARD.load(Ordering::Acquire).min(SHARDS)
}

/// Hands each thread its shard: the first counter update on a thread takes the next index
/// of a global round robin, so the first `SHARDS` threads that count (the workers, started
/// together) get distinct shards.
fn shard_index() -> usize {
    thread_local! {
        static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SHARD.with(|s| {
        let i = s.get();
        if i != usize::MAX {
            return i;
        }
        // Counted before the thread's first update of its shard: a snapshot reads every shard
        // taken before it began ([`shards_in_use`]), and a later snapshot never fewer.
        let i = NEXT_SHARD.fetch_add(1, Ordering::AcqRel) % SHARDS;
        s.set(i);
        i
    })
}

/// The live counters of one SA (one direction). Updated with relaxed atomics: totals are
/// exact, a snapshot taken while traffic flows is not a single instant.
///
/// Several threads work on one SA at once, and a counter that two cores increment per packet
/// moves its cache line between them every time. So the per-packet counters (packets, bytes,
/// reordered) are sharded by thread and summed by the reader; the maximal reordering is
/// written only when it grows, and drops and dummy packets, rare on a working SA, share one
/// line of their own.
#[derive(Debug, Default)]
pub(crate) struct SaCounters {
    shards: [Shard; SHARDS],
    max_reorder: CachePadded<AtomicU64>,
    rare: CachePadded<Rare>,
}

#[derive(Debug, Default)]
struct Rare {
    dummies: AtomicU64,
    drops: [AtomicU64; DropReason::COUNT],
}

impl SaCounters {
    fn shard(&self) -> &Shard {
        // `shard_index` is below SHARDS.
        &self.shards[shard_index()]
    }

    pub(crate) fn packet(&self, inner_bytes: usize) {
        let s = self.shard();
        s.packets.fetch_add(1, Ordering::Relaxed);
        s.bytes.fetch_add(inner_bytes as u64, Ordering::Relaxed);
    }

    /// An inbound packet whose number the replay window accepted `behind` below the highest
    /// number accepted so far (0: in order).
    pub(crate) fn accepted(&self, behind: u64) {
        if behind == 0 {
            return;
        }
        self.shard().reordered.fetch_add(1, Ordering::Relaxed);
        // Written only when the maximum grows: a handful of times per SA.
        if behind > self.max_reorder.load(Ordering::Relaxed) {
            self.max_reorder.fetch_max(behind, Ordering::Relaxed);
        }
    }

    pub(crate) fn dummy(&self) {
        self.rare.dummies.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn drop(&self, reason: DropReason) {
        self.rare.drops[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> CounterSnapshot {
        let used = &self.shards[..shards_in_use()];
        let sum = |f: fn(&Shard) -> &AtomicU64| {
            used.iter()
                .map(|s| f(s).load(Ordering::Relaxed))
                .fold(0u64, u64::wrapping_add)
        };
        CounterSnapshot {
            packets: sum(|s| &s.packets),
            bytes: sum(|s| &s.bytes),
            dummy_packets: self.rare.dummies.load(Ordering::Relaxed),
            drops: core::array::from_fn(|i| self.rare.drops[i].load(Ordering::Relaxed)),
            reordered: sum(|s| &s.reordered),
            max_reorder: self.max_reorder.load(Ordering::Relaxed),
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
    /// Inbound: accepted packets whose sequence number was below the highest one accepted
    /// before them (they arrived behind a later packet). 0 outbound.
    pub reordered: u64,
    /// Inbound: the largest distance, in sequence numbers, by which an accepted packet
    /// arrived behind the highest number accepted before it; how much of the replay window
    /// the path's reordering used. 0 outbound, and 0 while every packet came in order.
    pub max_reorder: u64,
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

#[cfg(all(test, not(loom)))]
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
        assert_eq!((s.reordered, s.max_reorder), (0, 0));
    }

    #[test]
    fn shards_sum_exactly_across_threads() {
        let c = SaCounters::default();
        let threads = SHARDS + 3;
        std::thread::scope(|scope| {
            for t in 0..threads {
                let c = &c;
                scope.spawn(move || {
                    let mine = shard_index();
                    for i in 0..1000u64 {
                        c.packet(10 + t);
                        c.accepted(i % 2 * (t as u64 + 1));
                        assert_eq!(shard_index(), mine, "a thread keeps its shard");
                    }
                });
            }
        });
        let s = c.snapshot();
        assert_eq!(s.packets, threads as u64 * 1000);
        assert_eq!(
            s.bytes,
            (0..threads).map(|t| (10 + t as u64) * 1000).sum::<u64>()
        );
        assert_eq!(s.reordered, threads as u64 * 500);
        assert_eq!(s.max_reorder, threads as u64);
        assert_eq!(s.total_drops(), 0);
    }

    #[test]
    fn reordering_keeps_count_and_maximum() {
        let c = SaCounters::default();
        for behind in [0, 5, 0, 3, 9, 1, 0] {
            c.accepted(behind);
        }
        let s = c.snapshot();
        assert_eq!((s.reordered, s.max_reorder), (4, 9));
        assert_eq!(
            s.packets, 0,
            "reordering is counted beside the packets, not as them"
        );
    }

    #[test]
    fn shards_are_on_lines_of_their_own() {
        assert_eq!(core::mem::align_of::<Shard>(), 128);
        assert_eq!(core::mem::size_of::<Shard>(), 128);
    }
}
