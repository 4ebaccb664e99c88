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

    /// `h`: the index of the virtual MAC that serves the VM (or host) whose MAC is `mac`. A
    /// fixed mix of the MAC's 48 bits and the VNI (SplitMix64's finalizer, which spreads
    /// consecutive MACs, as hypervisors hand them out, evenly), reduced to `0..K`; the same on
    /// every node and every release, since the hosts learn by it.
    pub fn assign(&self, mac: [u8; 6]) -> u16 {
        let mut m = [0u8; 8];
        m[2..].copy_from_slice(&mac);
        let mut x = u64::from_be_bytes(m) ^ (u64::from(self.vni) << 48);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        // K ≤ 2^16: the index fits.
        (x % u64::from(self.k)) as u16
    }
}

/// Algorithm 1, step 3: the indices `0..k` split among `nodes` as evenly as they go (counts
/// differ by at most one), interleaved so that each node's part spreads over the hash's range;
/// in the order of `nodes`. No node: nothing.
pub fn partition(k: u32, nodes: &[u32]) -> Vec<(u32, Vec<u16>)> {
    let mut parts: Vec<(u32, Vec<u16>)> = nodes.iter().map(|&n| (n, Vec::new())).collect();
    if parts.is_empty() {
        return parts;
    }
    let n = parts.len();
    for index in 0..k.min(MAX_VMACS) {
        // index < 2^16.
        parts[index as usize % n].1.push(index as u16);
    }
    parts
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

    #[test]
    fn the_hash_spreads_consecutive_vm_macs_evenly() {
        // 4096 VMs with consecutive MACs (as a hypervisor hands them out) over K = 256.
        let s = VmacSpace::new(1001, 256).expect("space");
        let mut count = [0u32; 256];
        for n in 0..4096u32 {
            let b = n.to_be_bytes();
            count[usize::from(s.assign([0x52, 0x54, 0x00, b[1], b[2], b[3]]))] += 1;
        }
        let (min, max) = (count.iter().min(), count.iter().max());
        // 16 per virtual MAC on average; a uniform hash stays well within 4..=32.
        assert!(min >= Some(&4) && max <= Some(&32), "{min:?}..{max:?}");
        // Fixed: the hosts learn by it, so it must not change between releases (values
        // computed once by hand from SplitMix64's finalizer).
        let vm = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        assert_eq!(s.assign(vm), 18);
        assert_eq!(VmacSpace::new(1001, 4096).expect("space").assign(vm), 2834);
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
