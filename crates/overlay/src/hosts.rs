//! Host VTEP addresses interned with reference counts: the table's entries store a 4-byte
//! index into this side table instead of a 17-byte `IpAddr`, and 16 M entries over a few
//! thousand hosts pay for each host address once.

use std::collections::HashMap;
use std::net::IpAddr;

use rustc_hash::FxBuildHasher;

use crate::cuckoo::EMPTY;

/// Interned host addresses.
#[derive(Clone, Default)]
pub(crate) struct Hosts {
    /// Address of each index (unspecified while the index is free).
    addrs: Vec<IpAddr>,
    /// Entries referring to each index; 0 for a free index.
    refs: Vec<u32>,
    /// Index of each address in use.
    index: HashMap<IpAddr, u32, FxBuildHasher>,
    /// Free indices, reused before new ones.
    free: Vec<u32>,
}

/// No more host indices or references are left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostsExhausted;

impl Hosts {
    /// Distinct hosts in use.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// The address of index `id`.
    #[inline(always)]
    pub(crate) fn addr(&self, id: u32) -> Option<IpAddr> {
        self.addrs.get(id as usize).copied()
    }

    /// The index of `addr`, with one more reference.
    pub(crate) fn acquire(&mut self, addr: IpAddr) -> Result<u32, HostsExhausted> {
        if let Some(&id) = self.index.get(&addr) {
            let refs = &mut self.refs[id as usize];
            *refs = refs.checked_add(1).ok_or(HostsExhausted)?;
            return Ok(id);
        }
        let id = match self.free.pop() {
            Some(id) => {
                self.addrs[id as usize] = addr;
                self.refs[id as usize] = 1;
                id
            }
            None => {
                let id = u32::try_from(self.addrs.len())
                    .ok()
                    .filter(|&id| id != EMPTY)
                    .ok_or(HostsExhausted)?;
                self.addrs.push(addr);
                self.refs.push(1);
                id
            }
        };
        self.index.insert(addr, id);
        Ok(id)
    }

    /// Drops one reference to `id`, freeing the index with the last.
    pub(crate) fn release(&mut self, id: u32) {
        let Some(refs) = self.refs.get_mut(id as usize) else {
            return;
        };
        debug_assert!(
            *refs > 0,
            "host index {id} released more often than acquired"
        );
        *refs = refs.saturating_sub(1);
        if *refs == 0 {
            let addr = self.addrs[id as usize];
            self.index.remove(&addr);
            self.addrs[id as usize] = IpAddr::from([0u8; 4]);
            self.free.push(id);
        }
    }

    /// Bytes allocated, from the capacities. The index map's allocation is computed from its
    /// capacity the way hashbrown sizes it: a power-of-two number of buckets with a load
    /// factor of at most 7/8, one control byte per bucket plus 16.
    pub(crate) fn memory_bytes(&self) -> usize {
        let cap = self.index.capacity();
        let buckets = match cap {
            0 => 0,
            1..=3 => 4,
            4..=7 => 8,
            _ => (cap * 8 / 7).next_power_of_two(),
        };
        let map = if buckets == 0 {
            0
        } else {
            buckets * (core::mem::size_of::<(IpAddr, u32)>() + 1) + 16
        };
        self.addrs.capacity() * core::mem::size_of::<IpAddr>()
            + self.refs.capacity() * 4
            + self.free.capacity() * 4
            + map
    }
}
