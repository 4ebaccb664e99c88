//! A bucketized two-choice cuckoo hash table whose buckets hold their keys and values inline:
//! [`SLOTS`] slots per 64-byte (IPv4) or 128-byte (IPv6) bucket, a per-bucket count of the
//! entries that were pushed to their second bucket (Cuckoo++'s idea: most misses and most
//! hits read one bucket), breadth-first search for a path of moves when both buckets are full.
//!
//! Values are `u32` (host indices); [`EMPTY`] marks a free slot.

use crate::huge;
use wire::prefetch::prefetch;

/// Slots per bucket: five 12-byte IPv4 slots and a 4-byte counter fill one cache line.
pub(crate) const SLOTS: usize = 5;

/// The value of a free slot (never a valid host index).
pub(crate) const EMPTY: u32 = u32::MAX;

/// The load factor above which an insert grows the table first.
const MAX_LOAD: f64 = 0.95;

/// The load factor [`Cuckoo::reserve`] sizes for: room to insert more without growing, and
/// few entries pushed to their second bucket.
pub(crate) const RESERVE_LOAD: f64 = 0.85;

/// Buckets a breadth-first search for a cuckoo path visits at most before the table grows.
const SEARCH_MAX: usize = 256;

/// Most buckets a table may have (indices are `u32`).
const MAX_BUCKETS: usize = u32::MAX as usize;

/// A key stored inline in a bucket.
pub(crate) trait SlotKey: Copy + Eq {
    /// The key left in free slots (free slots are recognised by their value, so any key does).
    const FREE: Self;

    /// A 64-bit hash: the low half chooses the primary bucket, the high half the secondary.
    fn hash(&self, seed: u64) -> u64;
}

/// One bucket: [`SLOTS`] keys, their values and the overflow count, aligned to a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Bucket<K> {
    keys: [K; SLOTS],
    vals: [u32; SLOTS],
    /// Entries whose primary bucket is this one but that live in their secondary bucket. Zero
    /// means a key not found here is not in the table.
    overflow: u32,
}

impl<K: SlotKey> Bucket<K> {
    const FREE: Self = Self {
        keys: [K::FREE; SLOTS],
        vals: [EMPTY; SLOTS],
        overflow: 0,
    };

    #[inline(always)]
    fn find(&self, k: &K) -> Option<usize> {
        (0..SLOTS).find(|&i| self.vals[i] != EMPTY && self.keys[i] == *k)
    }

    #[inline(always)]
    fn free_slot(&self) -> Option<usize> {
        self.vals.iter().position(|&v| v == EMPTY)
    }
}

/// What the first read of a batched lookup found.
pub(crate) enum Probe {
    /// The key is in its primary bucket, with this value.
    Found(u32),
    /// The key is not in the table.
    Absent,
    /// Not in the primary bucket, which has overflowed: look in this secondary bucket.
    Secondary(usize),
}

/// The table's capacity could not grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GrowError {
    /// Slots the table would have needed.
    pub(crate) slots: usize,
}

/// The hash table.
pub(crate) struct Cuckoo<K> {
    buckets: Vec<Bucket<K>>,
    len: usize,
    seed: u64,
}

/// A copy's buckets advised for huge pages too (the data plane keeps two copies of a table).
impl<K: SlotKey> Clone for Cuckoo<K> {
    fn clone(&self) -> Self {
        let mut buckets = Vec::with_capacity(self.buckets.len());
        huge::advise(buckets.spare_capacity_mut());
        buckets.extend_from_slice(&self.buckets);
        Self {
            buckets,
            len: self.len,
            seed: self.seed,
        }
    }
}

/// Maps a 32-bit hash onto `0..n` without division (Lemire's multiply-shift).
#[inline(always)]
fn spread(h: u32, n: usize) -> usize {
    ((u64::from(h) * n as u64) >> 32) as usize
}

/// One move of a cuckoo path: the entry in `from` (bucket, slot) goes to `to`.
#[derive(Clone, Copy)]
struct Node {
    bucket: usize,
    /// Index of the node whose entry moves here, `usize::MAX` for the two roots.
    parent: usize,
    /// Slot of the parent's bucket whose entry moves into this bucket.
    slot: usize,
}

impl<K: SlotKey> Cuckoo<K> {
    /// An empty table that allocates nothing until the first insert.
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            buckets: Vec::new(),
            len: 0,
            seed,
        }
    }

    /// Entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Slots (entries the table has room for at a load factor of 1).
    pub(crate) fn slots(&self) -> usize {
        self.buckets.len() * SLOTS
    }

    /// Bytes allocated, from the vector's capacity.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.buckets.capacity() * core::mem::size_of::<Bucket<K>>()
    }

    /// Entries living in their secondary bucket.
    pub(crate) fn displaced(&self) -> usize {
        self.buckets.iter().map(|b| b.overflow as usize).sum()
    }

    #[inline(always)]
    fn buckets_of(&self, h: u64) -> (usize, usize) {
        let n = self.buckets.len();
        let b1 = spread(h as u32, n);
        let mut b2 = spread((h >> 32) as u32, n);
        if b2 == b1 && n > 1 {
            b2 = if b1 + 1 == n { 0 } else { b1 + 1 };
        }
        (b1, b2)
    }

    /// The value of `k`.
    #[inline]
    pub(crate) fn get(&self, k: &K) -> Option<u32> {
        if self.buckets.is_empty() {
            return None;
        }
        let (b1, b2) = self.buckets_of(k.hash(self.seed));
        let p = self.buckets.get(b1)?;
        if let Some(i) = p.find(k) {
            return Some(p.vals[i]);
        }
        if p.overflow == 0 {
            return None;
        }
        let s = self.buckets.get(b2)?;
        s.find(k).map(|i| s.vals[i])
    }

    /// First step of a batched lookup: hashes `k` and prefetches its primary bucket. Returns
    /// the hash for [`Self::primary`].
    #[inline(always)]
    pub(crate) fn start(&self, k: &K) -> u64 {
        let h = k.hash(self.seed);
        if !self.buckets.is_empty() {
            let (b1, _) = self.buckets_of(h);
            if let Some(b) = self.buckets.get(b1) {
                prefetch(b);
            }
        }
        h
    }

    /// Second step: reads the primary bucket of `k` (hash `h` from [`Self::start`]). When the
    /// answer needs the secondary bucket, prefetches it and says which.
    #[inline(always)]
    pub(crate) fn primary(&self, k: &K, h: u64) -> Probe {
        if self.buckets.is_empty() {
            return Probe::Absent;
        }
        let (b1, b2) = self.buckets_of(h);
        let Some(p) = self.buckets.get(b1) else {
            return Probe::Absent;
        };
        if let Some(i) = p.find(k) {
            return Probe::Found(p.vals[i]);
        }
        if p.overflow == 0 {
            return Probe::Absent;
        }
        if let Some(s) = self.buckets.get(b2) {
            prefetch(s);
        }
        Probe::Secondary(b2)
    }

    /// Last step: reads secondary bucket `b` (from [`Probe::Secondary`]).
    #[inline(always)]
    pub(crate) fn secondary(&self, k: &K, b: usize) -> Option<u32> {
        let s = self.buckets.get(b)?;
        s.find(k).map(|i| s.vals[i])
    }

    /// Sets the value of `k`, returning the value it replaced. Grows the table when it is
    /// full; fails only when it cannot grow.
    pub(crate) fn insert(&mut self, k: K, v: u32) -> Result<Option<u32>, GrowError> {
        debug_assert_ne!(v, EMPTY, "EMPTY is not a value");
        if let Some((b, i)) = self.locate(&k) {
            let old = self.buckets[b].vals[i];
            self.buckets[b].vals[i] = v;
            return Ok(Some(old));
        }
        if (self.len + 1) as f64 > MAX_LOAD * self.slots() as f64 {
            self.grow(self.len + 1)?;
        }
        while !self.place(k, v) {
            self.grow(self.len + 1)?;
        }
        self.len += 1;
        Ok(None)
    }

    /// Removes `k`, returning its value.
    pub(crate) fn remove(&mut self, k: &K) -> Option<u32> {
        let (b, i) = self.locate(k)?;
        let (b1, _) = self.buckets_of(k.hash(self.seed));
        let old = self.buckets[b].vals[i];
        self.buckets[b].vals[i] = EMPTY;
        if b != b1 {
            self.buckets[b1].overflow -= 1;
        }
        self.len -= 1;
        Some(old)
    }

    /// Removes every entry for which `keep` is false; returns the values removed.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) -> Vec<u32> {
        let mut removed = Vec::new();
        for b in 0..self.buckets.len() {
            for i in 0..SLOTS {
                let bucket = &self.buckets[b];
                if bucket.vals[i] == EMPTY || keep(&bucket.keys[i]) {
                    continue;
                }
                let k = bucket.keys[i];
                removed.push(bucket.vals[i]);
                self.buckets[b].vals[i] = EMPTY;
                let (b1, _) = self.buckets_of(k.hash(self.seed));
                if b != b1 {
                    self.buckets[b1].overflow -= 1;
                }
                self.len -= 1;
            }
        }
        removed
    }

    /// Every entry, in bucket order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (K, u32)> + '_ {
        self.buckets.iter().flat_map(|b| {
            (0..SLOTS)
                .filter(move |&i| b.vals[i] != EMPTY)
                .map(move |i| (b.keys[i], b.vals[i]))
        })
    }

    /// Makes room for `additional` more entries at [`RESERVE_LOAD`], so that they insert
    /// without growing.
    pub(crate) fn reserve(&mut self, additional: usize) -> Result<(), GrowError> {
        let want = self.len.saturating_add(additional);
        if want as f64 <= RESERVE_LOAD * self.slots() as f64 {
            return Ok(());
        }
        self.grow(want)
    }

    /// Where `k` lives: (bucket, slot).
    fn locate(&self, k: &K) -> Option<(usize, usize)> {
        if self.buckets.is_empty() {
            return None;
        }
        let (b1, b2) = self.buckets_of(k.hash(self.seed));
        if let Some(i) = self.buckets[b1].find(k) {
            return Some((b1, i));
        }
        if self.buckets[b1].overflow == 0 {
            return None;
        }
        self.buckets[b2].find(k).map(|i| (b2, i))
    }

    /// Puts `k` (not in the table) somewhere, moving other entries along a cuckoo path if both
    /// its buckets are full. False when no path was found: the table must grow.
    fn place(&mut self, k: K, v: u32) -> bool {
        if self.buckets.is_empty() {
            return false;
        }
        let (b1, b2) = self.buckets_of(k.hash(self.seed));
        if let Some(i) = self.buckets[b1].free_slot() {
            self.put(b1, i, k, v, b1);
            return true;
        }
        if let Some(i) = self.buckets[b2].free_slot() {
            self.put(b2, i, k, v, b1);
            return true;
        }
        match self.make_room(b1, b2) {
            Some((b, i)) => {
                self.put(b, i, k, v, b1);
                true
            }
            None => false,
        }
    }

    fn put(&mut self, b: usize, i: usize, k: K, v: u32, primary: usize) {
        let bucket = &mut self.buckets[b];
        bucket.keys[i] = k;
        bucket.vals[i] = v;
        if b != primary {
            self.buckets[primary].overflow += 1;
        }
    }

    /// Breadth-first search from the two full buckets `b1` and `b2` for an entry that can move
    /// to a free slot of its other bucket, then moves the entries along that path, freeing a
    /// slot in `b1` or `b2`, which is returned.
    fn make_room(&mut self, b1: usize, b2: usize) -> Option<(usize, usize)> {
        let mut nodes: Vec<Node> = Vec::with_capacity(SEARCH_MAX);
        for root in [b1, b2] {
            if nodes.iter().all(|n| n.bucket != root) {
                nodes.push(Node {
                    bucket: root,
                    parent: usize::MAX,
                    slot: 0,
                });
            }
        }
        let mut next = 0;
        while next < nodes.len() {
            let node = nodes[next];
            for slot in 0..SLOTS {
                let key = self.buckets[node.bucket].keys[slot];
                let (p, s) = self.buckets_of(key.hash(self.seed));
                let alt = if node.bucket == p { s } else { p };
                if alt == node.bucket || self.on_path(&nodes, next, alt) {
                    continue;
                }
                if let Some(free) = self.buckets[alt].free_slot() {
                    return Some(self.shift(&nodes, next, slot, alt, free));
                }
                if nodes.len() < SEARCH_MAX {
                    nodes.push(Node {
                        bucket: alt,
                        parent: next,
                        slot,
                    });
                }
            }
            next += 1;
        }
        None
    }

    /// Whether `bucket` is on the path from node `at` to its root.
    fn on_path(&self, nodes: &[Node], mut at: usize, bucket: usize) -> bool {
        while at != usize::MAX {
            if nodes[at].bucket == bucket {
                return true;
            }
            at = nodes[at].parent;
        }
        false
    }

    /// Moves the entries of the path ending at node `at`: its entry in `slot` goes to
    /// (`to`, `free`), then each parent's entry into the slot its child vacated. Returns the
    /// slot vacated in the root.
    fn shift(
        &mut self,
        nodes: &[Node],
        mut at: usize,
        mut slot: usize,
        mut to: usize,
        mut free: usize,
    ) -> (usize, usize) {
        loop {
            let from = nodes[at].bucket;
            self.move_entry(from, slot, to, free);
            (to, free) = (from, slot);
            let node = nodes[at];
            if node.parent == usize::MAX {
                return (from, slot);
            }
            slot = node.slot;
            at = node.parent;
        }
    }

    /// Moves the entry in (`from`, `i`) to the free slot (`to`, `j`), one of its two buckets.
    fn move_entry(&mut self, from: usize, i: usize, to: usize, j: usize) {
        let k = self.buckets[from].keys[i];
        let v = self.buckets[from].vals[i];
        debug_assert_eq!(self.buckets[to].vals[j], EMPTY);
        self.buckets[from].vals[i] = EMPTY;
        self.buckets[to].keys[j] = k;
        self.buckets[to].vals[j] = v;
        let (p, _) = self.buckets_of(k.hash(self.seed));
        if from == p {
            self.buckets[p].overflow += 1;
        } else if to == p {
            self.buckets[p].overflow -= 1;
        }
    }

    /// Rebuilds the table with room for at least `entries` at [`RESERVE_LOAD`] and at least
    /// twice the buckets it has (amortized constant time per insert).
    fn grow(&mut self, entries: usize) -> Result<(), GrowError> {
        let by_load = (entries as f64 / (RESERVE_LOAD * SLOTS as f64)).ceil() as usize;
        let mut n = by_load.max(self.buckets.len().saturating_mul(2)).max(1);
        loop {
            if n > MAX_BUCKETS {
                return Err(GrowError {
                    slots: n.saturating_mul(SLOTS),
                });
            }
            let mut buckets = Vec::new();
            buckets.try_reserve_exact(n).map_err(|_| GrowError {
                slots: n.saturating_mul(SLOTS),
            })?;
            huge::advise(buckets.spare_capacity_mut());
            buckets.resize(n, Bucket::FREE);
            let mut bigger = Self {
                buckets,
                len: 0,
                seed: self.seed,
            };
            if self.iter().all(|(k, v)| bigger.place(k, v)) {
                bigger.len = self.len;
                *self = bigger;
                return Ok(());
            }
            n = n.saturating_mul(2);
        }
    }
}

#[cfg(test)]
impl<K: SlotKey + core::fmt::Debug> Cuckoo<K> {
    /// Checks the structure: every entry in one of its two buckets, every overflow count
    /// exact, the length right.
    pub(crate) fn check(&self) {
        let mut overflow = vec![0u32; self.buckets.len()];
        let mut len = 0;
        for (b, bucket) in self.buckets.iter().enumerate() {
            for i in 0..SLOTS {
                if bucket.vals[i] == EMPTY {
                    continue;
                }
                len += 1;
                let k = bucket.keys[i];
                let (p, s) = self.buckets_of(k.hash(self.seed));
                assert!(b == p || b == s, "{k:?} in bucket {b}, not {p} or {s}");
                if b != p {
                    overflow[p] += 1;
                }
            }
        }
        assert_eq!(len, self.len);
        for (b, bucket) in self.buckets.iter().enumerate() {
            assert_eq!(bucket.overflow, overflow[b], "overflow count of bucket {b}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{V4Key, V6Key};
    use crate::VnetId;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// Fills fixed-size tables to 95 % (no growth), so that most inserts after the first half
    /// need a cuckoo path, and checks the structure after every step.
    #[test]
    fn cuckoo_paths_keep_the_structure_at_high_load() {
        let mut t = Cuckoo::<V4Key>::new(7);
        t.grow(1000).expect("small");
        let slots = t.slots();
        let target = slots * 95 / 100;
        let mut x = 0x1234_5678_u64;
        let mut keys = Vec::new();
        while t.len() < target {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = V4Key::new(VnetId((x >> 40) as u32 % 4), Ipv4Addr::from_bits(x as u32));
            if t.place(k, keys.len() as u32) {
                t.len += 1;
                keys.push(k);
            } else {
                break;
            }
        }
        assert_eq!(t.slots(), slots, "no growth");
        assert!(t.len() * 100 >= slots * 90, "{} of {slots}", t.len());
        t.check();
        assert!(t.displaced() > 0);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(t.get(k), Some(i as u32));
        }
        for k in keys.iter().step_by(2) {
            assert!(t.remove(k).is_some());
        }
        t.check();
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(t.get(k), (i % 2 == 1).then_some(i as u32));
        }
    }

    #[test]
    fn v6_paths_keep_the_structure() {
        let mut t = Cuckoo::<V6Key>::new(9);
        t.grow(500).expect("small");
        let slots = t.slots();
        let mut a = 0u128;
        while t.len() * 100 < slots * 93 {
            a += 1;
            let k = V6Key::new(VnetId((a % 3) as u32), Ipv6Addr::from_bits(a << 64 | a));
            assert!(t.place(k, a as u32), "no path at {} of {slots}", t.len());
            t.len += 1;
        }
        t.check();
    }
}
