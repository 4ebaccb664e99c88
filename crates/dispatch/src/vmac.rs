//! A VNet's virtual MACs and the hash from a VM's MAC to one of them (the clustering paper's
//! Algorithm 1).

use crate::DispatchError;

/// The most virtual MACs a VNet may have (their index is 16 bits).
pub const MAX_VMACS: u32 = 1 << 16;

/// The `K` virtual MACs of one VNet: `02:VV:VV:VV:II:II`, locally administered unicast
/// addresses made of the VNet's 24-bit VNI and the 16-bit index, so they are unique in the
/// VNet's segment (and across VNets), and every data node derives the same ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmacSpace {
    vni: u32,
    k: u32,
}

impl VmacSpace {
    /// The `k` virtual MACs of VNI `vni`.
    pub fn new(vni: u32, k: u32) -> Result<Self, DispatchError> {
        if vni >= 1 << 24 {
            return Err(DispatchError::Vni { vni });
        }
        if !(1..=MAX_VMACS).contains(&k) {
            return Err(DispatchError::Count { k });
        }
        Ok(Self { vni, k })
    }

    /// How many virtual MACs the VNet has (`K`).
    pub fn len(&self) -> u32 {
        self.k
    }

    /// Always false: a space holds at least one virtual MAC.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The virtual MAC of index `index` (`index < K`).
    pub fn mac(&self, index: u16) -> [u8; 6] {
        let v = self.vni.to_be_bytes();
        let i = index.to_be_bytes();
        [0x02, v[1], v[2], v[3], i[0], i[1]]
    }

    /// The index of `mac` if it is one of this VNet's virtual MACs.
    pub fn index_of(&self, mac: [u8; 6]) -> Option<u16> {
        let v = self.vni.to_be_bytes();
        if mac[..4] != [0x02, v[1], v[2], v[3]] {
            return None;
        }
        let index = u16::from_be_bytes([mac[4], mac[5]]);
        (u32::from(index) < self.k).then_some(index)
    }

    /// `h`: the index of the virtual MAC that serves the VM (or host) whose MAC is `mac`:
    /// Fibonacci hashing of the MAC's 48 bits (the VNI in the bits above them), multiplied by
    /// 2^64/φ and scaled to `0..K` by its high bits. MACs in an arithmetic sequence — as
    /// hypervisors hand them out, one after the other or in any fixed step — land on indices
    /// spread nearly evenly (the fractional parts of `i·s/φ` are equidistributed with low
    /// discrepancy), so their counts per index differ by a few, where a random
    /// hash would leave them binomially uneven (±9 % per node for 240 VMs on three) and
    /// the paper's `m mod K` would put a sequence of step K on one index. Random MACs are spread
    /// as any hash spreads them. The same on every node and every release, since the hosts learn
    /// by it.
    pub fn assign(&self, mac: [u8; 6]) -> u16 {
        let mut m = [0u8; 8];
        m[2..].copy_from_slice(&mac);
        let x = u64::from_be_bytes(m) ^ (u64::from(self.vni) << 48);
        let y = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        // (y / 2^64) · K < K ≤ 2^16: the index fits.
        ((u128::from(y) * u128::from(self.k)) >> 64) as u16
    }
}

/// Algorithm 1, step 3: the indices `0..k` split among `nodes` as evenly as they go (counts
/// differ by at most one, the first nodes taking the extra ones), each node a contiguous range
/// in the order of `nodes`: `h` spreads MACs handed out in sequence nearly evenly over any
/// range of indices, not over every third one. No node: nothing.
pub fn partition(k: u32, nodes: &[u32]) -> Vec<(u32, Vec<u16>)> {
    let n = nodes.len() as u32;
    let k = k.min(MAX_VMACS);
    let mut start = 0u32;
    nodes
        .iter()
        .enumerate()
        .map(|(j, &node)| {
            let size = k / n + u32::from((j as u32) < k % n);
            // Indices below 2^16.
            let part = (start..start + size).map(|i| i as u16).collect();
            start += size;
            (node, part)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_macs_are_local_unicast_unique_and_found_again() {
        let s = VmacSpace::new(0x00ab_cdef, 300).expect("space");
        let mut seen = std::collections::HashSet::new();
        for i in 0..300u16 {
            let m = s.mac(i);
            // Locally administered (bit 1), unicast (bit 0 clear).
            assert_eq!(m[0] & 0x03, 0x02);
            assert!(seen.insert(m));
            assert_eq!(s.index_of(m), Some(i));
        }
        assert_eq!(s.index_of(s.mac(300)), None, "beyond K");
        let other = VmacSpace::new(0x00ab_cdee, 300).expect("space");
        assert_eq!(other.index_of(s.mac(5)), None, "another VNet's");
        assert_eq!(
            VmacSpace::new(1 << 24, 1),
            Err(DispatchError::Vni { vni: 1 << 24 })
        );
        assert_eq!(VmacSpace::new(1, 0), Err(DispatchError::Count { k: 0 }));
        assert_eq!(
            VmacSpace::new(1, MAX_VMACS + 1),
            Err(DispatchError::Count { k: MAX_VMACS + 1 })
        );
    }

    /// How many of `macs` each index of `s` gets.
    fn counts(s: &VmacSpace, macs: impl Iterator<Item = [u8; 6]>) -> Vec<u32> {
        let mut count = vec![0u32; s.len() as usize];
        for m in macs {
            count[usize::from(s.assign(m))] += 1;
        }
        count
    }

    fn mac_of(n: u64) -> [u8; 6] {
        let b = n.to_be_bytes();
        [b[2], b[3], b[4], b[5], b[6], b[7]]
    }

    #[test]
    fn the_hash_spreads_arithmetic_sequences_of_macs_evenly() {
        let s = VmacSpace::new(1001, 256).expect("space");
        let base = 0x5254_0000_0000u64;
        // 4096 consecutive MACs (as a hypervisor hands them out), and the paper's Fig. 5
        // sequence of step 0x100 (which `m mod K` puts on one index): 16 per index, give or
        // take three (a uniform random hash would give about 8..=25).
        for step in [1u64, 0x100, 7, 0x1_0000] {
            let c = counts(&s, (0..4096).map(|n| mac_of(base + n * step)));
            let (min, max) = (c.iter().min(), c.iter().max());
            assert!(
                min >= Some(&13) && max <= Some(&19),
                "step {step}: {min:?}..{max:?}"
            );
        }
        // 240 consecutive VMs over three nodes' contiguous parts: 80 each, give or take two.
        let parts = partition(256, &[0, 1, 2]);
        let c = counts(&s, (0..240).map(|n| mac_of(base + 0x18 + n)));
        for (node, part) in &parts {
            let on: u32 = part.iter().map(|&i| c[usize::from(i)]).sum();
            assert!((78..=82).contains(&on), "node {node}: {on}");
        }
        // Random MACs (a fixed LCG): spread as a uniform hash would, within 4..=32.
        let mut x = 12345u64;
        let c = counts(
            &s,
            (0..4096).map(|_| {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                mac_of(x >> 16)
            }),
        );
        let (min, max) = (c.iter().min(), c.iter().max());
        assert!(min >= Some(&4) && max <= Some(&32), "{min:?}..{max:?}");
        // Fixed: the hosts learn by it, so it must not change between releases (values
        // computed once apart, with Python's integers).
        let vm = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        assert_eq!(s.assign(vm), 200);
        assert_eq!(VmacSpace::new(1001, 4096).expect("space").assign(vm), 3211);
    }

    #[test]
    fn the_partition_is_even_and_whole() {
        let parts = partition(256, &[7, 3, 9]);
        let sizes: Vec<usize> = parts.iter().map(|p| p.1.len()).collect();
        assert_eq!(sizes, vec![86, 85, 85]);
        let mut all: Vec<u16> = parts.iter().flat_map(|p| p.1.iter().copied()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..256).collect::<Vec<u16>>());
        assert!(partition(10, &[]).is_empty());
    }
}
