//! The inbound ESP steering table: SPI → data node (the paper's GIN, §4.3 "Traffic
//! forwarding": "GIN matches the Security Parameter Index (SPI) of ESP packets"; §6.1).
//!
//! One hash lookup per packet (O(1)). Each entry also names the tunnel, so the steer node can
//! charge the packet to the tunnel's inbound rate limit without a second table. The control
//! node installs an entry when a CHILD_SA's inbound half is placed on a data node and points
//! it at another node when the tunnel migrates (§4.5, step 5).
//!
//! Updates are incremental ([`SpiTable::insert`], [`SpiTable::remove`]); the table is `Clone`,
//! so the I/O layer can edit a copy and swap it in as the next snapshot.

use rustc_hash::FxHashMap;

use wire::EspSpi;

use crate::error::SteerError;
use crate::ids::{NodeId, TunnelId};

/// Where an inbound SPI goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpiEntry {
    /// The data node holding the inbound SA.
    pub node: NodeId,
    /// The tunnel the SA belongs to (for its rate limit and counters).
    pub tunnel: TunnelId,
}

/// Inbound ESP SPI → [`SpiEntry`] (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct SpiTable {
    map: FxHashMap<EspSpi, SpiEntry>,
}

impl SpiTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Steers `spi` to `entry`, returning the entry it replaced. SPIs 0..=255 are rejected
    /// (RFC 4303 §2.1: reserved; no peer sends them, so an entry could only be a mistake).
    pub fn insert(&mut self, spi: EspSpi, entry: SpiEntry) -> Result<Option<SpiEntry>, SteerError> {
        if spi.0 <= 255 {
            return Err(SteerError::ReservedSpi { spi });
        }
        Ok(self.map.insert(spi, entry))
    }

    /// Stops steering `spi`, returning its entry if it had one.
    pub fn remove(&mut self, spi: EspSpi) -> Option<SpiEntry> {
        self.map.remove(&spi)
    }

    /// Where a packet with `spi` goes, if anywhere. O(1).
    #[inline]
    pub fn lookup(&self, spi: EspSpi) -> Option<SpiEntry> {
        self.map.get(&spi).copied()
    }

    /// The data node for `spi`, if any (shorthand for `lookup(spi).map(|e| e.node)`).
    #[inline]
    pub fn node(&self, spi: EspSpi) -> Option<NodeId> {
        self.lookup(spi).map(|e| e.node)
    }

    /// Keeps only the entries for which `keep` returns true (e.g. drop every SPI of a removed
    /// data node).
    pub fn retain(&mut self, mut keep: impl FnMut(EspSpi, SpiEntry) -> bool) {
        self.map.retain(|&spi, &mut entry| keep(spi, entry));
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (EspSpi, SpiEntry)> + '_ {
        self.map.iter().map(|(&spi, &entry)| (spi, entry))
    }

    /// Number of steered SPIs.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True if no SPI is steered.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(node: u32, tunnel: u32) -> SpiEntry {
        SpiEntry {
            node: NodeId(node),
            tunnel: TunnelId(tunnel),
        }
    }

    #[test]
    fn insert_lookup_replace_remove() {
        let mut t = SpiTable::new();
        assert!(t.is_empty());
        assert_eq!(t.insert(EspSpi(0x1000), entry(1, 7)).unwrap(), None);
        assert_eq!(t.lookup(EspSpi(0x1000)), Some(entry(1, 7)));
        assert_eq!(t.node(EspSpi(0x1000)), Some(NodeId(1)));
        assert_eq!(t.lookup(EspSpi(0x1001)), None);
        // Migration (§4.5): the same SPI now goes to another node.
        assert_eq!(
            t.insert(EspSpi(0x1000), entry(2, 7)).unwrap(),
            Some(entry(1, 7))
        );
        assert_eq!(t.node(EspSpi(0x1000)), Some(NodeId(2)));
        assert_eq!(t.len(), 1);
        assert_eq!(t.remove(EspSpi(0x1000)), Some(entry(2, 7)));
        assert_eq!(t.remove(EspSpi(0x1000)), None);
        assert!(t.is_empty());
    }

    #[test]
    fn aligned_spis_spread_over_low_and_high_hash_bits() {
        // hashbrown picks the bucket from the low bits and the tag from the top 7: SPIs that
        // a peer's allocator aligns (here on 4 KiB) must still spread over both.
        use core::hash::BuildHasher;
        let b = rustc_hash::FxBuildHasher;
        let (mut low, mut high) = ([0u32; 64], [0u32; 64]);
        for i in 0..6400u32 {
            let h = b.hash_one(EspSpi(i << 12));
            low[(h & 63) as usize] += 1;
            high[(h >> 58) as usize] += 1;
        }
        for buckets in [low, high] {
            assert!(buckets.iter().all(|&n| n > 50 && n < 150), "{buckets:?}");
        }
    }

    #[test]
    fn reserved_spis_are_rejected() {
        let mut t = SpiTable::new();
        for spi in [0, 1, 255] {
            assert_eq!(
                t.insert(EspSpi(spi), entry(1, 1)),
                Err(SteerError::ReservedSpi { spi: EspSpi(spi) })
            );
        }
        assert!(t.insert(EspSpi(256), entry(1, 1)).is_ok());
        assert!(t.insert(EspSpi(u32::MAX), entry(1, 1)).is_ok());
    }

    #[test]
    fn snapshots_are_independent_and_retain_filters() {
        let mut t = SpiTable::new();
        for i in 0..10_000u32 {
            t.insert(EspSpi(0x100 + i * 4096), entry(i % 4, i)).unwrap();
        }
        let snapshot = t.clone();
        t.retain(|_, e| e.node != NodeId(3));
        assert_eq!(t.len(), 7_500);
        assert_eq!(snapshot.len(), 10_000);
        for i in 0..10_000u32 {
            let spi = EspSpi(0x100 + i * 4096);
            assert_eq!(snapshot.lookup(spi), Some(entry(i % 4, i)));
            let want = (i % 4 != 3).then_some(entry(i % 4, i));
            assert_eq!(t.lookup(spi), want);
        }
        assert_eq!(t.iter().filter(|(_, e)| e.node == NodeId(3)).count(), 0);
    }
}
