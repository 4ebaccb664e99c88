//! The synthetic workload the table is measured with, in one place for both of its
//! benchmarks (`crates/overlay/examples/table_bench.rs`, which also measures std's `HashMap`
//! beside it, and the table figures of `protego bench edge`): entries spread over [`VNETS`]
//! VNets and pointing at [`HOSTS`] hosts, destinations drawn uniformly at random over all
//! entries with a fixed-seed xorshift ([`Draw`]) so runs are comparable, each figure the best
//! of [`PASSES`] passes over the same lookups. Not used by the data path.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use crate::{Family, Key, OverlayError, OverlayTable, Value, VnetId, Vni};

/// VNets the entries spread over.
pub const VNETS: u32 = 64;
/// Hosts the entries point at.
pub const HOSTS: u32 = 4096;
/// Passes over the lookups; a figure is the best one.
pub const PASSES: usize = 3;

/// A fixed-seed xorshift: the same destinations in every run.
#[derive(Debug, Clone)]
pub struct Draw(u64);

impl Draw {
    /// A generator from `seed` (0 is replaced: xorshift has no zero state).
    pub fn new(seed: u64) -> Draw {
        Draw(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number uniformly drawn from `0..n` (0 for `n` = 0), by multiply-shift.
    pub fn below(&mut self, n: u32) -> u32 {
        // The product's high 64 bits are below `n`, so the cast keeps them.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u32
    }
}

/// The `i`-th entry's key: VNet `i % VNETS`, the `i / VNETS`-th address of the VNet's plan
/// (10.0.0.1 up for IPv4, fd00::1:0:0:0:1 up for IPv6).
pub fn key(family: Family, i: u32) -> Key {
    let vnet = VnetId(i % VNETS);
    let n = i / VNETS + 1;
    let addr = match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from_bits(0x0a00_0000 + n)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from_bits(
            (0xfd00_0000_0000_0001_u128 << 64) | u128::from(n),
        )),
    };
    Key::new(vnet, addr)
}

/// The `i`-th entry's host: one of [`HOSTS`] in 198.51.100.0 and up, scattered.
pub fn host(i: u32) -> IpAddr {
    let h = i.wrapping_mul(2_654_435_761) % HOSTS;
    IpAddr::V4(Ipv4Addr::from_bits(0xc633_6400 + h))
}

/// VNet `vnet`'s VNI: 1000 + its number.
pub fn vni(vnet: VnetId) -> Vni {
    // VNETS is far below the VNI range.
    Vni::new(1000 + vnet.0 % VNETS).unwrap_or_default()
}

/// A table with the [`VNETS`] VNets set and no entries.
pub fn empty_table() -> Result<OverlayTable, OverlayError> {
    let mut t = OverlayTable::new();
    for v in 0..VNETS {
        t.set_vnet(VnetId(v), vni(VnetId(v)))?;
    }
    Ok(t)
}

/// A table holding entries `0..n` of `family`, bulk-loaded (room reserved from the size hint),
/// and how long the load took.
pub fn filled_table(family: Family, n: u32) -> Result<(OverlayTable, Duration), OverlayError> {
    let mut t = empty_table()?;
    let start = Instant::now();
    t.load((0..n).map(|i| (key(family, i), host(i))))?;
    Ok((t, start.elapsed()))
}

/// `lookups` destinations drawn uniformly over entries `0..n` (seeded by `n`).
pub fn destinations(family: Family, n: u32, lookups: usize) -> Vec<Key> {
    let mut draw = Draw::new(0x9e37_79b9_7f4a_7c15 ^ u64::from(n));
    (0..lookups).map(|_| key(family, draw.below(n))).collect()
}

/// The best of [`PASSES`] runs of `pass`, and the checksum the last one returned.
pub fn best(mut pass: impl FnMut() -> u64) -> (Duration, u64) {
    let mut best = Duration::MAX;
    let mut check = 0;
    for _ in 0..PASSES {
        let t = Instant::now();
        check = pass();
        best = best.min(t.elapsed());
    }
    (best, check)
}

/// A lookup's contribution to a pass's checksum (so the lookups cannot be optimised away).
pub fn hit(v: Option<Value>) -> u64 {
    v.map_or(0, |v| u64::from(v.vni.get()))
}

/// The best pass of looking `keys` up one at a time, and its checksum.
pub fn one_at_a_time(t: &OverlayTable, keys: &[Key]) -> (Duration, u64) {
    best(|| keys.iter().map(|k| hit(black_box(t).get(k))).sum())
}

/// The best pass of looking `keys` up in batches of `size` ([`OverlayTable::get_batch`], with
/// its prefetching), and its checksum.
pub fn batched(t: &OverlayTable, keys: &[Key], size: usize) -> (Duration, u64) {
    let mut out = vec![None; size.max(1)];
    best(|| {
        let mut sum = 0;
        for chunk in keys.chunks(size.max(1)) {
            let out = &mut out[..chunk.len()];
            // Same lengths by construction: an error is impossible and would count no hits.
            if black_box(t).get_batch(chunk, out).is_ok() {
                sum += out.iter().map(|&v| hit(v)).sum::<u64>();
            }
        }
        sum
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batched_and_single_lookups_agree_on_the_workload() {
        for family in [Family::V4, Family::V6] {
            let (t, _) = filled_table(family, 5000).expect("filled");
            let keys = destinations(family, 5000, 10_000);
            let (_, single) = one_at_a_time(&t, &keys);
            let (_, batch) = batched(&t, &keys, crate::BATCH);
            // Every destination is an entry: each contributes its VNI, at least 1000.
            assert!(single >= 1000 * 10_000);
            assert_eq!(single, batch);
        }
        assert_eq!(Draw::new(0).below(0), 0);
        assert!(matches!(host(7), IpAddr::V4(_)));
    }
}
