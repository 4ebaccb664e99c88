//! The overlay table: per-VM entries (VNet, address) -> (host VTEP, VNI), one cuckoo table per
//! address family, host addresses interned, VNIs kept per VNet.

use std::net::IpAddr;

use wire::vxlan::Vni;

use crate::cuckoo::{Cuckoo, GrowError, Probe, EMPTY};
use crate::hosts::{Hosts, HostsExhausted};
use crate::key::{Key, V4Key, V6Key, Value, VnetId};

/// Highest VNet number plus one: VNIs are 24-bit, so this is room for a VNet per VNI.
pub const MAX_VNETS: u32 = 1 << 24;

/// Keys a batched lookup hashes and prefetches before it reads the first bucket.
pub const BATCH: usize = 64;

/// The hash seed of [`OverlayTable::new`].
const DEFAULT_SEED: u64 = 0x5851_f42d_4c95_7f2d;

/// A VNet without a VNI in [`OverlayTable::vnis`].
const NO_VNI: u32 = u32::MAX;

/// An IP address family.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl core::fmt::Display for Family {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// Why the table refused a change or a lookup.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverlayError {
    /// The entry's VNet has no VNI yet ([`OverlayTable::set_vnet`] first).
    #[error("{vnet} has no VNI: configure the VNet before its entries")]
    UnknownVnet {
        /// The VNet.
        vnet: VnetId,
    },
    /// A VNet number at or above [`MAX_VNETS`].
    #[error("{vnet} is out of range (VNet numbers are below {MAX_VNETS})")]
    VnetOutOfRange {
        /// The VNet.
        vnet: VnetId,
    },
    /// A VM address that cannot be one: unspecified, multicast, or IPv4 broadcast.
    #[error("{addr} in {vnet} is not a VM address (unspecified, multicast or broadcast)")]
    BadAddress {
        /// The VNet.
        vnet: VnetId,
        /// The address.
        addr: IpAddr,
    },
    /// A host VTEP address that cannot be one: unspecified, multicast, or IPv4 broadcast.
    #[error("{host} is not a host VTEP address (unspecified, multicast or broadcast)")]
    BadHost {
        /// The address.
        host: IpAddr,
    },
    /// The table holds its limit of entries ([`OverlayTable::set_max_entries`]).
    #[error("table full: {entries} entries is the limit")]
    LimitReached {
        /// The limit.
        entries: usize,
    },
    /// The table could not grow: memory could not be allocated, or the size passes what
    /// 32-bit bucket numbers address.
    #[error("table full: cannot grow the {family} table to {slots} slots")]
    CannotGrow {
        /// The family whose table had to grow.
        family: Family,
        /// Slots it would have needed.
        slots: usize,
    },
    /// More than 2^32 - 1 distinct hosts, or entries on one host.
    #[error("host table full at {host}")]
    HostsExhausted {
        /// The host being added.
        host: IpAddr,
    },
    /// A batched lookup's output slice is not as long as its keys.
    #[error("batch of {keys} keys with room for {out} results")]
    BatchLength {
        /// Keys given.
        keys: usize,
        /// Results room was given for.
        out: usize,
    },
    /// An entry of a bulk load failed; the entries before it are in the table.
    #[error("entry {index} of the load: {source}")]
    Load {
        /// 0-based position of the entry in the load's iterator.
        index: usize,
        /// What was wrong with it.
        source: Box<OverlayError>,
    },
}

/// Memory the table allocated, by part, in bytes (from capacities, not lengths).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Memory {
    /// The IPv4 cuckoo table.
    pub v4: usize,
    /// The IPv6 cuckoo table.
    pub v6: usize,
    /// The interned host addresses and their index.
    pub hosts: usize,
    /// The VNI of each VNet number.
    pub vnets: usize,
    /// All of it, with the table's own struct.
    pub total: usize,
}

/// Exact-match overlay routes: (VNet, VM address) -> (host VTEP, VNI). See the crate docs for
/// the layout and its costs.
///
/// Not synchronized: changes take `&mut self`, lookups `&self`. How the data path publishes a
/// changed table to its workers while they forward is left to it (two copies still fit the
/// memory budget: see the crate docs).
#[derive(Clone)]
pub struct OverlayTable {
    v4: Cuckoo<V4Key>,
    v6: Cuckoo<V6Key>,
    hosts: Hosts,
    /// VNI of each VNet number, [`NO_VNI`] for none.
    vnis: Vec<u32>,
    max_entries: Option<usize>,
}

impl Default for OverlayTable {
    fn default() -> Self {
        Self::new()
    }
}

impl OverlayTable {
    /// An empty table with the default hash seed.
    pub fn new() -> Self {
        Self::with_seed(DEFAULT_SEED)
    }

    /// An empty table whose hash functions depend on `seed`. The keys come from the
    /// operator's configuration, not from the network, so the seed is no defence the data
    /// path relies on; a random one (drawn by the caller) still makes crafted sets of keys
    /// that all fall in the same buckets useless.
    pub fn with_seed(seed: u64) -> Self {
        Self {
            v4: Cuckoo::new(seed),
            v6: Cuckoo::new(seed.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15),
            hosts: Hosts::default(),
            vnis: Vec::new(),
            max_entries: None,
        }
    }

    /// Limits the entries (both families together); inserts past it fail with
    /// [`OverlayError::LimitReached`]. None: no limit but memory.
    pub fn set_max_entries(&mut self, max: Option<usize>) {
        self.max_entries = max;
    }

    /// Gives VNet `vnet` its VNI (for all its entries, present and future); returns the VNI it
    /// replaced. The VNIs are an array indexed by VNet number (4 bytes for every number up to
    /// the highest given), so number VNets densely from 0.
    pub fn set_vnet(&mut self, vnet: VnetId, vni: Vni) -> Result<Option<Vni>, OverlayError> {
        if vnet.0 >= MAX_VNETS {
            return Err(OverlayError::VnetOutOfRange { vnet });
        }
        let i = vnet.0 as usize;
        if self.vnis.len() <= i {
            self.vnis.resize(i + 1, NO_VNI);
        }
        let old = core::mem::replace(&mut self.vnis[i], vni.get());
        Ok(Vni::new(old))
    }

    /// The VNI of `vnet`.
    pub fn vni(&self, vnet: VnetId) -> Option<Vni> {
        self.vnis.get(vnet.0 as usize).and_then(|&v| Vni::new(v))
    }

    /// Removes VNet `vnet` and all its entries (a scan of the whole table); returns how many
    /// entries went.
    pub fn remove_vnet(&mut self, vnet: VnetId) -> usize {
        let mut removed = self.v4.retain(|k| k.vnet() != vnet);
        removed.extend(self.v6.retain(|k| k.vnet() != vnet));
        for &id in &removed {
            self.hosts.release(id);
        }
        if let Some(v) = self.vnis.get_mut(vnet.0 as usize) {
            *v = NO_VNI;
        }
        removed.len()
    }

    /// Entries, both families.
    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries of one family.
    pub fn len_of(&self, family: Family) -> usize {
        match family {
            Family::V4 => self.v4.len(),
            Family::V6 => self.v6.len(),
        }
    }

    /// Distinct host VTEP addresses the entries point to.
    pub fn hosts(&self) -> usize {
        self.hosts.len()
    }

    /// Entries of `family` divided by its slots (0 for a table with no slots).
    pub fn load_factor(&self, family: Family) -> f64 {
        let (len, slots) = match family {
            Family::V4 => (self.v4.len(), self.v4.slots()),
            Family::V6 => (self.v6.len(), self.v6.slots()),
        };
        if slots == 0 {
            0.0
        } else {
            len as f64 / slots as f64
        }
    }

    /// Entries of `family` that live in their second bucket (a lookup of one reads two
    /// buckets).
    pub fn displaced(&self, family: Family) -> usize {
        match family {
            Family::V4 => self.v4.displaced(),
            Family::V6 => self.v6.displaced(),
        }
    }

    /// Bytes allocated, all included.
    pub fn memory_bytes(&self) -> usize {
        self.memory().total
    }

    /// Bytes allocated, by part.
    pub fn memory(&self) -> Memory {
        let v4 = self.v4.memory_bytes();
        let v6 = self.v6.memory_bytes();
        let hosts = self.hosts.memory_bytes();
        let vnets = self.vnis.capacity() * 4;
        Memory {
            v4,
            v6,
            hosts,
            vnets,
            total: v4 + v6 + hosts + vnets + core::mem::size_of::<Self>(),
        }
    }

    /// Makes room for `v4` more IPv4 and `v6` more IPv6 entries, so that they insert without
    /// the table growing.
    pub fn reserve(&mut self, v4: usize, v6: usize) -> Result<(), OverlayError> {
        self.v4.reserve(v4).map_err(|e| grow_error(Family::V4, e))?;
        self.v6.reserve(v6).map_err(|e| grow_error(Family::V6, e))
    }

    /// Points `key` at `host`; returns the value it replaced.
    pub fn insert(&mut self, key: Key, host: IpAddr) -> Result<Option<Value>, OverlayError> {
        let vni = self
            .vni(key.vnet)
            .ok_or(OverlayError::UnknownVnet { vnet: key.vnet })?;
        if !usable(key.addr) {
            return Err(OverlayError::BadAddress {
                vnet: key.vnet,
                addr: key.addr,
            });
        }
        if !usable(host) {
            return Err(OverlayError::BadHost { host });
        }
        if let Some(max) = self.max_entries {
            if self.len() >= max && self.get(&key).is_none() {
                return Err(OverlayError::LimitReached { entries: max });
            }
        }
        let id = self
            .hosts
            .acquire(host)
            .map_err(|HostsExhausted| OverlayError::HostsExhausted { host })?;
        let old = match key.addr {
            IpAddr::V4(a) => self
                .v4
                .insert(V4Key::new(key.vnet, a), id)
                .map_err(|e| grow_error(Family::V4, e)),
            IpAddr::V6(a) => self
                .v6
                .insert(V6Key::new(key.vnet, a), id)
                .map_err(|e| grow_error(Family::V6, e)),
        };
        match old {
            Ok(old) => Ok(old.and_then(|old| {
                let host = self.hosts.addr(old);
                self.hosts.release(old);
                Some(Value { host: host?, vni })
            })),
            Err(e) => {
                self.hosts.release(id);
                Err(e)
            }
        }
    }

    /// Removes `key`; returns its value.
    pub fn remove(&mut self, key: &Key) -> Option<Value> {
        let id = match key.addr {
            IpAddr::V4(a) => self.v4.remove(&V4Key::new(key.vnet, a)),
            IpAddr::V6(a) => self.v6.remove(&V6Key::new(key.vnet, a)),
        }?;
        let value = self.value(key.vnet, id);
        self.hosts.release(id);
        value
    }

    /// The value of `key`.
    #[inline]
    pub fn get(&self, key: &Key) -> Option<Value> {
        let id = match key.addr {
            IpAddr::V4(a) => self.v4.get(&V4Key::new(key.vnet, a)),
            IpAddr::V6(a) => self.v6.get(&V6Key::new(key.vnet, a)),
        }?;
        self.value(key.vnet, id)
    }

    /// Looks up every key of `keys`, writing the value of `keys[i]` to `out[i]`. Faster per key
    /// than [`Self::get`] once the table is larger than the CPU caches: the buckets of
    /// [`BATCH`] keys are prefetched before the first is read, so their memory accesses
    /// overlap. Fails only when the slices' lengths differ (then nothing is written).
    pub fn get_batch(&self, keys: &[Key], out: &mut [Option<Value>]) -> Result<(), OverlayError> {
        if keys.len() != out.len() {
            return Err(OverlayError::BatchLength {
                keys: keys.len(),
                out: out.len(),
            });
        }
        for (keys, out) in keys.chunks(BATCH).zip(out.chunks_mut(BATCH)) {
            self.get_chunk(keys, out);
        }
        Ok(())
    }

    /// [`Self::get_batch`] for at most [`BATCH`] keys: hash and prefetch all primary buckets,
    /// read them (prefetching the secondary buckets still needed), read those, then turn the
    /// host indices found into values (a separate pass: composing `Value`s inside the probe
    /// loop made the compiler go through the stack and stall on store forwarding).
    #[inline(always)]
    fn get_chunk(&self, keys: &[Key], out: &mut [Option<Value>]) {
        let mut hashes = [0u64; BATCH];
        for (k, h) in keys.iter().zip(hashes.iter_mut()) {
            *h = match k.addr {
                IpAddr::V4(a) => self.v4.start(&V4Key::new(k.vnet, a)),
                IpAddr::V6(a) => self.v6.start(&V6Key::new(k.vnet, a)),
            };
        }
        let mut ids = [EMPTY; BATCH];
        let mut later = [(0u32, 0usize); BATCH];
        let mut n_later = 0;
        for (i, k) in keys.iter().enumerate() {
            let probe = match k.addr {
                IpAddr::V4(a) => self.v4.primary(&V4Key::new(k.vnet, a), hashes[i]),
                IpAddr::V6(a) => self.v6.primary(&V6Key::new(k.vnet, a), hashes[i]),
            };
            match probe {
                Probe::Found(id) => ids[i] = id,
                Probe::Absent => {}
                Probe::Secondary(b) => {
                    later[n_later] = (i as u32, b);
                    n_later += 1;
                }
            }
        }
        for &(i, b) in &later[..n_later] {
            let i = i as usize;
            let Some(k) = keys.get(i) else {
                continue;
            };
            let id = match k.addr {
                IpAddr::V4(a) => self.v4.secondary(&V4Key::new(k.vnet, a), b),
                IpAddr::V6(a) => self.v6.secondary(&V6Key::new(k.vnet, a), b),
            };
            ids[i] = id.unwrap_or(EMPTY);
        }
        for ((k, o), &id) in keys.iter().zip(out.iter_mut()).zip(&ids) {
            *o = if id == EMPTY {
                None
            } else {
                self.value(k.vnet, id)
            };
        }
    }

    /// Inserts every (key, host) of `entries` (later duplicates replace earlier ones); returns
    /// how many were inserted. Reserves room first for the lower bound of the iterator's size
    /// hint, in the family of its first entry (route files are usually of one family; the
    /// other grows as needed, by doubling). A parsed route file's iterator has no lower bound:
    /// count its lines and call [`Self::reserve`] first to save the rebuilds. Stops at the first entry that fails: the entries
    /// before it stay in the table, the error says which one.
    pub fn load<I>(&mut self, entries: I) -> Result<usize, OverlayError>
    where
        I: IntoIterator<Item = (Key, IpAddr)>,
    {
        let mut entries = entries.into_iter().peekable();
        let hint = entries.size_hint().0;
        let reserved = match entries.peek() {
            Some((k, _)) if k.addr.is_ipv4() => self.reserve(hint, 0),
            Some(_) => self.reserve(0, hint),
            None => Ok(()),
        };
        reserved.map_err(|e| OverlayError::Load {
            index: 0,
            source: Box::new(e),
        })?;
        let mut n = 0;
        for (key, host) in entries {
            self.insert(key, host).map_err(|e| OverlayError::Load {
                index: n,
                source: Box::new(e),
            })?;
            n += 1;
        }
        Ok(n)
    }

    /// Every entry, IPv4 first, in no particular order within a family.
    pub fn iter(&self) -> impl Iterator<Item = (Key, Value)> + '_ {
        let v4 = self
            .v4
            .iter()
            .map(|(k, id)| (Key::new(k.vnet(), k.addr()), id));
        let v6 = self
            .v6
            .iter()
            .map(|(k, id)| (Key::new(k.vnet(), k.addr()), id));
        v4.chain(v6)
            .filter_map(|(k, id)| Some((k, self.value(k.vnet, id)?)))
    }

    /// Checks both tables' structure (tests).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        self.v4.check();
        self.v6.check();
    }

    #[inline(always)]
    fn value(&self, vnet: VnetId, id: u32) -> Option<Value> {
        Some(Value {
            host: self.hosts.addr(id)?,
            vni: self.vni(vnet)?,
        })
    }
}

fn grow_error(family: Family, e: GrowError) -> OverlayError {
    OverlayError::CannotGrow {
        family,
        slots: e.slots,
    }
}

/// Whether `a` can be a VM's or a host's unicast address.
pub(crate) fn usable(a: IpAddr) -> bool {
    !(a.is_unspecified() || a.is_multicast() || matches!(a, IpAddr::V4(v4) if v4.is_broadcast()))
}
