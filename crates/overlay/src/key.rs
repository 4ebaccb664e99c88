//! Keys and values: the public [`Key`] (VNet, VM address) and [`Value`] (host VTEP, VNI), and
//! the packed keys the two hash tables store inline.

use core::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use wire::vxlan::Vni;

use crate::cuckoo::SlotKey;

/// A VNet as the overlay table knows it: a number the control plane gives each configured
/// (tenant, VNet name) pair, like [`ids::TunnelId`] for tunnels. Two VNets with identical
/// address plans (of one tenant or of two) have different numbers, so their entries never
/// meet. The number also selects the VNet's [`Vni`] ([`crate::OverlayTable::set_vnet`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct VnetId(pub u32);

impl fmt::Debug for VnetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vnet{}", self.0)
    }
}

impl fmt::Display for VnetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// What the table is searched by: a VM's address inside a VNet.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct Key {
    /// The VNet (and so the tenant).
    pub vnet: VnetId,
    /// The VM's address, IPv4 or IPv6.
    pub addr: IpAddr,
}

impl Key {
    /// The key of `addr` in `vnet`.
    pub fn new(vnet: VnetId, addr: impl Into<IpAddr>) -> Self {
        Self {
            vnet,
            addr: addr.into(),
        }
    }
}

/// What a lookup returns: where to send the VM's packets.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Value {
    /// Underlay address of the VTEP of the host the VM runs on.
    pub host: IpAddr,
    /// VXLAN network identifier of the VM's VNet (the same for all its entries).
    pub vni: Vni,
}

/// An IPv4 key packed into one word: VNet in the high half, address in the low half.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct V4Key(u64);

impl V4Key {
    #[inline(always)]
    pub(crate) fn new(vnet: VnetId, addr: Ipv4Addr) -> Self {
        Self((u64::from(vnet.0) << 32) | u64::from(addr.to_bits()))
    }

    pub(crate) fn vnet(self) -> VnetId {
        VnetId((self.0 >> 32) as u32)
    }

    pub(crate) fn addr(self) -> Ipv4Addr {
        Ipv4Addr::from_bits(self.0 as u32)
    }
}

/// An IPv6 key: 20 bytes with 4-byte alignment, so five fit with their values in 128 bytes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(C)]
pub(crate) struct V6Key {
    vnet: u32,
    addr: [u32; 4],
}

impl V6Key {
    #[inline(always)]
    pub(crate) fn new(vnet: VnetId, addr: Ipv6Addr) -> Self {
        let b = addr.to_bits();
        Self {
            vnet: vnet.0,
            addr: [
                (b >> 96) as u32,
                (b >> 64) as u32,
                (b >> 32) as u32,
                b as u32,
            ],
        }
    }

    pub(crate) fn vnet(self) -> VnetId {
        VnetId(self.vnet)
    }

    pub(crate) fn addr(self) -> Ipv6Addr {
        let [a, b, c, d] = self.addr.map(u128::from);
        Ipv6Addr::from_bits((a << 96) | (b << 64) | (c << 32) | d)
    }
}

/// MurmurHash3's 64-bit finalizer: a bijection whose every output bit depends on every input
/// bit.
#[inline(always)]
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

impl SlotKey for V4Key {
    const FREE: Self = Self(0);

    /// A bijection of (VNet, address): two keys never share both buckets by hash collision.
    #[inline(always)]
    fn hash(&self, seed: u64) -> u64 {
        fmix64(self.0 ^ seed)
    }
}

impl SlotKey for V6Key {
    const FREE: Self = Self {
        vnet: 0,
        addr: [0; 4],
    };

    /// The VNet is mixed first and on its own, so that a VNet number and address bits never
    /// cancel out (VNet 1 with 2001:db8::/64 must not collide with VNet 0 with the
    /// neighbouring /64).
    #[inline(always)]
    fn hash(&self, seed: u64) -> u64 {
        let [a, b, c, d] = self.addr.map(u64::from);
        let h = fmix64(seed ^ u64::from(self.vnet));
        let h = fmix64(h ^ ((a << 32) | b));
        fmix64(h ^ ((c << 32) | d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuckoo::Bucket;

    #[test]
    fn buckets_fill_whole_cache_lines() {
        assert_eq!(core::mem::size_of::<Bucket<V4Key>>(), 64);
        assert_eq!(core::mem::size_of::<Bucket<V6Key>>(), 128);
        assert_eq!(core::mem::align_of::<Bucket<V4Key>>(), 64);
    }

    #[test]
    fn packed_keys_round_trip() {
        let k = V4Key::new(VnetId(7), Ipv4Addr::new(10, 1, 2, 3));
        assert_eq!(
            (k.vnet(), k.addr()),
            (VnetId(7), Ipv4Addr::new(10, 1, 2, 3))
        );
        let a: Ipv6Addr = "2001:db8::1:2:3".parse().expect("literal");
        let k = V6Key::new(VnetId(u32::MAX), a);
        assert_eq!((k.vnet(), k.addr()), (VnetId(u32::MAX), a));
    }
}
