//! The maps of a running program (issue 18 §3, "maps"): fixed capacity, allocated when the
//! program is instantiated, values at stable addresses the program writes through.
//!
//! - `ARRAY`: `max_entries` zeroed values; keys are indices; delete is refused (`-EINVAL`).
//! - `PERCPU_ARRAY`: one array per worker (the worker is the CPU). From the control side a
//!   value is every worker's value, concatenated in worker order (the kernel's convention for
//!   per-CPU maps).
//! - `HASH`: a key index behind a mutex over a slab of `max_entries` value slots; a full map
//!   refuses new keys (`-E2BIG`).
//! - `LRU_HASH`: the same, evicting on insert when full with a clock over referenced bits
//!   (set by every lookup and update).
//!
//! A map is shared by the workers that run one program (except per-CPU values). A program
//! holds plain pointers into the value slab: its writes are not synchronised with other
//! workers or with the control side's reads, as in the kernel. A deleted hash value's slot
//! is reused by a later insert while a worker may still hold a pointer to it; the pointer
//! stays inside the slab (memory-safe), the value may then belong to the new key (the
//! kernel's preallocated hash maps behave alike).

use crate::{MapKind, MapSpec};
use std::collections::HashMap;
use std::sync::Mutex;

/// The most memory one map may take (values of all entries and workers), in bytes.
pub const MAX_MAP_BYTES: usize = 64 << 20;

/// `BPF_ANY`: create or update.
pub const BPF_ANY: u64 = 0;
/// `BPF_NOEXIST`: create only.
pub const BPF_NOEXIST: u64 = 1;
/// `BPF_EXIST`: update only.
pub const BPF_EXIST: u64 = 2;

/// Why a map operation failed; each maps to the kernel's errno for the helpers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MapError {
    /// The key has the wrong size.
    #[error("map `{map}`: the key has {got} bytes, the map's keys {expected}")]
    KeySize {
        /// The map.
        map: String,
        /// Its key size.
        expected: usize,
        /// What was given.
        got: usize,
    },
    /// The value has the wrong size.
    #[error("map `{map}`: the value has {got} bytes, the map's values {expected}")]
    ValueSize {
        /// The map.
        map: String,
        /// Its value size (times the workers for per-CPU maps).
        expected: usize,
        /// What was given.
        got: usize,
    },
    /// No such key (`-ENOENT`).
    #[error("map `{map}`: no such key")]
    NotFound {
        /// The map.
        map: String,
    },
    /// The key exists and `BPF_NOEXIST` was asked (`-EEXIST`).
    #[error("map `{map}`: the key exists")]
    Exists {
        /// The map.
        map: String,
    },
    /// The map is full (`-E2BIG`), or an array index is out of range.
    #[error("map `{map}`: full, or index out of range ({max_entries} entries)")]
    Full {
        /// The map.
        map: String,
        /// Its capacity.
        max_entries: u32,
    },
    /// Flags other than `BPF_ANY`, `BPF_NOEXIST`, `BPF_EXIST`, or a delete from an array
    /// (`-EINVAL`).
    #[error("map `{map}`: {what}")]
    Invalid {
        /// The map.
        map: String,
        /// What was invalid.
        what: &'static str,
    },
    /// The map would take more than [`MAX_MAP_BYTES`].
    #[error("map `{map}`: {bytes} bytes of values, more than the {MAX_MAP_BYTES} offered")]
    TooLarge {
        /// The map.
        map: String,
        /// The bytes it would take.
        bytes: u128,
    },
}

impl MapError {
    /// The kernel's negative errno for this error, as a helper returns it.
    pub fn errno(&self) -> i64 {
        match self {
            Self::NotFound { .. } => -2, // ENOENT
            Self::Exists { .. } => -17,  // EEXIST
            Self::Full { .. } => -7,     // E2BIG
            Self::KeySize { .. } | Self::ValueSize { .. } | Self::Invalid { .. } => -22, // EINVAL
            Self::TooLarge { .. } => -12, // ENOMEM
        }
    }
}

/// Zeroed memory with 8-byte alignment that never moves: the map's values.
struct Slab {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the slab is plain bytes; concurrent access goes through raw pointers, as documented
// in the module (the program's writes are unsynchronised, as in the kernel).
unsafe impl Send for Slab {}
// SAFETY: as for Send.
unsafe impl Sync for Slab {}

impl Slab {
    fn new(len: usize) -> Self {
        let len = len.max(8);
        let layout = std::alloc::Layout::from_size_align(len, 8)
            .expect("lengths are capped at MAX_MAP_BYTES");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Self { ptr, len }
    }

    fn range(&self) -> std::ops::Range<u64> {
        self.ptr as u64..self.ptr as u64 + self.len as u64
    }

    /// The address of byte `at`.
    fn at(&self, at: usize) -> *mut u8 {
        debug_assert!(at < self.len);
        // SAFETY: callers pass offsets of slots inside the slab.
        unsafe { self.ptr.add(at) }
    }

    fn read(&self, at: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        // SAFETY: `at + len` is inside the slab (a slot); the source may be written by a
        // program at the same time (module documentation).
        unsafe { std::ptr::copy_nonoverlapping(self.at(at), v.as_mut_ptr(), len) };
        v
    }

    fn write(&self, at: usize, bytes: &[u8]) {
        // SAFETY: as for `read`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.at(at), bytes.len()) };
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 8).expect("as allocated");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

/// The key index of a hash map: which slot holds which key.
#[derive(Default)]
struct Index {
    slots: HashMap<Box<[u8]>, u32>,
    keys: Vec<Option<Box<[u8]>>>,
    free: Vec<u32>,
    referenced: Vec<bool>,
    hand: usize,
}

enum Store {
    /// Array and hash values: one slab.
    Shared(Slab),
    /// Per-CPU array: one slab per worker.
    PerWorker(Vec<Slab>),
}

/// One map of a running program.
pub struct Map {
    spec: MapSpec,
    /// Value stride: the value size rounded up to 8 bytes.
    stride: usize,
    store: Store,
    index: Option<Mutex<Index>>,
}

impl std::fmt::Debug for Map {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Map")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl Map {
    /// Allocates the map `spec` describes, for `workers` workers (per-CPU maps).
    pub fn new(spec: &MapSpec, workers: usize) -> Result<Self, MapError> {
        if let Some(what) = spec.shape_error() {
            return Err(MapError::Invalid {
                map: spec.name.clone(),
                what,
            });
        }
        let stride = (spec.value_size as usize).div_ceil(8) * 8;
        let copies = if spec.kind == MapKind::PerCpuArray {
            workers.max(1)
        } else {
            1
        };
        let bytes = stride as u128 * u128::from(spec.max_entries) * copies as u128;
        if bytes > MAX_MAP_BYTES as u128 {
            return Err(MapError::TooLarge {
                map: spec.name.clone(),
                bytes,
            });
        }
        let len = stride * spec.max_entries as usize;
        let store = if spec.kind == MapKind::PerCpuArray {
            Store::PerWorker((0..copies).map(|_| Slab::new(len)).collect())
        } else {
            Store::Shared(Slab::new(len))
        };
        let index = (!spec.kind.is_array()).then(|| {
            let n = spec.max_entries as usize;
            Mutex::new(Index {
                slots: HashMap::with_capacity(n),
                keys: vec![None; n],
                free: (0..spec.max_entries).rev().collect(),
                referenced: vec![false; n],
                hand: 0,
            })
        });
        Ok(Self {
            spec: spec.clone(),
            stride,
            store,
            index,
        })
    }

    /// The map's declaration.
    pub fn spec(&self) -> &MapSpec {
        &self.spec
    }

    /// The number of workers whose values a per-CPU map keeps (1 for the other kinds).
    pub fn copies(&self) -> usize {
        match &self.store {
            Store::Shared(_) => 1,
            Store::PerWorker(s) => s.len(),
        }
    }

    /// The address ranges of the map's values, for the helpers' checks and the interpreter.
    pub(crate) fn ranges(&self) -> Vec<std::ops::Range<u64>> {
        match &self.store {
            Store::Shared(s) => vec![s.range()],
            Store::PerWorker(v) => v.iter().map(Slab::range).collect(),
        }
    }

    /// Whether `[addr, addr + len)` is inside the values `worker` may reach.
    pub(crate) fn contains(&self, worker: usize, addr: u64, len: u64) -> bool {
        let slab = match &self.store {
            Store::Shared(s) => s,
            Store::PerWorker(v) => match v.get(worker) {
                Some(s) => s,
                None => return false,
            },
        };
        let r = slab.range();
        addr >= r.start && addr.checked_add(len).is_some_and(|end| end <= r.end)
    }

    fn slab(&self, worker: usize) -> Option<&Slab> {
        match &self.store {
            Store::Shared(s) => Some(s),
            Store::PerWorker(v) => v.get(worker),
        }
    }

    fn check_key(&self, key: &[u8]) -> Result<(), MapError> {
        if key.len() != self.spec.key_size as usize {
            return Err(MapError::KeySize {
                map: self.spec.name.clone(),
                expected: self.spec.key_size as usize,
                got: key.len(),
            });
        }
        Ok(())
    }

    fn array_slot(&self, key: &[u8]) -> Option<usize> {
        let i = u32::from_le_bytes(key.try_into().ok()?);
        (i < self.spec.max_entries).then_some(i as usize)
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        let index = self.index.as_ref().expect("hash kinds have an index");
        // A panic while holding the lock cannot leave the index inconsistent in a way that
        // matters more than losing the map: keep serving.
        index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The program's lookup: the address of `key`'s value for `worker`, or `None`.
    pub(crate) fn lookup_for(&self, worker: usize, key: &[u8]) -> Option<*mut u8> {
        let slot = if self.spec.kind.is_array() {
            self.array_slot(key)?
        } else {
            let mut index = self.index();
            let slot = *index.slots.get(key)? as usize;
            index.referenced[slot] = true;
            slot
        };
        Some(self.slab(worker)?.at(slot * self.stride))
    }

    /// The program's update: `value` has `value_size` bytes, stored for `worker` (per-CPU).
    pub(crate) fn update_for(
        &self,
        worker: usize,
        key: &[u8],
        value: &[u8],
        flags: u64,
    ) -> Result<(), MapError> {
        let slab = self
            .slab(worker)
            .ok_or_else(|| self.invalid("no such worker"))?;
        self.with_slot_for_update(key, flags, |slot| slab.write(slot * self.stride, value))
    }

    fn invalid(&self, what: &'static str) -> MapError {
        MapError::Invalid {
            map: self.spec.name.clone(),
            what,
        }
    }

    /// Calls `write` with the slot `key`'s value goes to under `flags` (inserting the key into
    /// a hash), with a hash's index locked: no other key can take the slot before the value is
    /// written, and no reader sees the key before its value.
    fn with_slot_for_update<R>(
        &self,
        key: &[u8],
        flags: u64,
        write: impl FnOnce(usize) -> R,
    ) -> Result<R, MapError> {
        self.check_key(key)?;
        if flags > BPF_EXIST {
            return Err(self.invalid("flags must be BPF_ANY, BPF_NOEXIST or BPF_EXIST"));
        }
        let name = || self.spec.name.clone();
        if self.spec.kind.is_array() {
            let slot = self.array_slot(key).ok_or(MapError::Full {
                map: name(),
                max_entries: self.spec.max_entries,
            })?;
            if flags == BPF_NOEXIST {
                return Err(MapError::Exists { map: name() });
            }
            return Ok(write(slot));
        }
        let mut index = self.index();
        if let Some(&slot) = index.slots.get(key) {
            if flags == BPF_NOEXIST {
                return Err(MapError::Exists { map: name() });
            }
            index.referenced[slot as usize] = true;
            return Ok(write(slot as usize));
        }
        if flags == BPF_EXIST {
            return Err(MapError::NotFound { map: name() });
        }
        let slot = match index.free.pop() {
            Some(s) => s as usize,
            None if self.spec.kind == MapKind::LruHash => evict(&mut index),
            None => {
                return Err(MapError::Full {
                    map: name(),
                    max_entries: self.spec.max_entries,
                })
            }
        };
        let key: Box<[u8]> = key.into();
        index.slots.insert(key.clone(), slot as u32);
        index.keys[slot] = Some(key);
        index.referenced[slot] = true;
        // A new key starts from a zeroed value (then `write` writes the whole value).
        if let Some(slab) = self.slab(0) {
            slab.write(slot * self.stride, &vec![0; self.stride]);
        }
        Ok(write(slot))
    }

    /// Deletes `key` (hash kinds; arrays refuse with `-EINVAL`).
    pub fn delete(&self, key: &[u8]) -> Result<(), MapError> {
        self.check_key(key)?;
        if self.spec.kind.is_array() {
            return Err(self.invalid("array entries cannot be deleted"));
        }
        let mut index = self.index();
        let slot = index.slots.remove(key).ok_or_else(|| MapError::NotFound {
            map: self.spec.name.clone(),
        })?;
        index.keys[slot as usize] = None;
        index.free.push(slot);
        Ok(())
    }

    /// The value of `key` (every worker's, concatenated, for a per-CPU map), or `None`.
    pub fn lookup(&self, key: &[u8]) -> Result<Option<Vec<u8>>, MapError> {
        self.check_key(key)?;
        let slot = if self.spec.kind.is_array() {
            match self.array_slot(key) {
                Some(s) => s,
                None => return Ok(None),
            }
        } else {
            // Read under the index's lock: the slot cannot pass to another key meanwhile.
            let index = self.index();
            return Ok(index.slots.get(key).map(|&s| self.value_of(s as usize)));
        };
        Ok(Some(self.value_of(slot)))
    }

    fn value_of(&self, slot: usize) -> Vec<u8> {
        let size = self.spec.value_size as usize;
        (0..self.copies())
            .filter_map(|w| self.slab(w))
            .flat_map(|s| s.read(slot * self.stride, size))
            .collect()
    }

    /// Sets `key`'s value under `flags` ([`BPF_ANY`], [`BPF_NOEXIST`], [`BPF_EXIST`]); a
    /// per-CPU map takes every worker's value, concatenated.
    pub fn update(&self, key: &[u8], value: &[u8], flags: u64) -> Result<(), MapError> {
        let size = self.spec.value_size as usize;
        if value.len() != size * self.copies() {
            return Err(MapError::ValueSize {
                map: self.spec.name.clone(),
                expected: size * self.copies(),
                got: value.len(),
            });
        }
        self.with_slot_for_update(key, flags, |slot| {
            for (w, v) in value.chunks(size).enumerate() {
                if let Some(s) = self.slab(w) {
                    s.write(slot * self.stride, v);
                }
            }
        })
    }

    /// Every entry as (key, value), keys in ascending byte order (arrays: every index, in
    /// order); values as [`Map::lookup`] gives them.
    pub fn dump(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        if self.spec.kind.is_array() {
            return (0..self.spec.max_entries)
                .map(|i| (i.to_le_bytes().to_vec(), self.value_of(i as usize)))
                .collect();
        }
        // Values read under the index's lock, each with its own key.
        let mut entries: Vec<_> = self
            .index()
            .slots
            .iter()
            .map(|(k, &s)| (k.to_vec(), self.value_of(s as usize)))
            .collect();
        entries.sort();
        entries
    }

    /// The number of keys a hash holds (arrays: `max_entries`).
    pub fn len(&self) -> usize {
        match &self.index {
            Some(_) => self.index().slots.len(),
            None => self.spec.max_entries as usize,
        }
    }

    /// Whether a hash holds no key (arrays are never empty).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Frees the slot the clock hand finds first without its referenced bit (clearing the bits
/// it passes) and returns it.
fn evict(index: &mut Index) -> usize {
    let n = index.keys.len();
    loop {
        let slot = index.hand;
        index.hand = (index.hand + 1) % n;
        if index.referenced[slot] {
            index.referenced[slot] = false;
            continue;
        }
        if let Some(key) = index.keys[slot].take() {
            index.slots.remove(&key);
        }
        return slot;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: MapKind, key_size: u32, max_entries: u32) -> MapSpec {
        MapSpec {
            name: "m".into(),
            kind,
            key_size,
            value_size: 4,
            max_entries,
            flags: 0,
        }
    }

    #[test]
    fn a_map_of_no_entries_or_empty_values_is_refused() {
        for (kind, value_size, max_entries) in [
            (MapKind::LruHash, 4, 0),
            (MapKind::Hash, 4, 0),
            (MapKind::PerCpuArray, 0, 4),
        ] {
            let s = MapSpec {
                value_size,
                ..spec(kind, 4, max_entries)
            };
            assert!(
                matches!(Map::new(&s, 2), Err(MapError::Invalid { .. })),
                "{s:?}"
            );
        }
    }

    #[test]
    fn arrays_take_indices_refuse_deletes_and_exist_already() {
        let m = Map::new(&spec(MapKind::Array, 4, 2), 1).expect("map");
        assert_eq!(m.lookup(&1u32.to_le_bytes()), Ok(Some(vec![0; 4])));
        assert_eq!(m.lookup(&2u32.to_le_bytes()), Ok(None));
        m.update(&1u32.to_le_bytes(), &[1, 2, 3, 4], BPF_EXIST)
            .expect("exists");
        let e = m
            .update(&0u32.to_le_bytes(), &[0; 4], BPF_NOEXIST)
            .unwrap_err();
        assert_eq!(e.errno(), -17);
        assert_eq!(
            m.update(&2u32.to_le_bytes(), &[0; 4], BPF_ANY)
                .unwrap_err()
                .errno(),
            -7
        );
        assert_eq!(m.delete(&0u32.to_le_bytes()).unwrap_err().errno(), -22);
        assert_eq!(
            m.update(&0u32.to_le_bytes(), &[0; 4], 4)
                .unwrap_err()
                .errno(),
            -22
        );
        assert!(matches!(m.lookup(&[0; 3]), Err(MapError::KeySize { .. })));
        assert!(matches!(
            m.update(&[0; 4], &[0; 5], BPF_ANY),
            Err(MapError::ValueSize { .. })
        ));
        assert_eq!(m.dump()[1], (1u32.to_le_bytes().to_vec(), vec![1, 2, 3, 4]));
    }

    #[test]
    fn per_cpu_values_are_one_per_worker_concatenated() {
        let m = Map::new(&spec(MapKind::PerCpuArray, 4, 1), 3).expect("map");
        m.update(&[0; 4], &[1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0], BPF_ANY)
            .expect("update");
        let p = m.lookup_for(1, &[0; 4]).expect("value");
        // SAFETY: a 4-byte value of worker 1.
        assert_eq!(unsafe { *p }, 2);
        assert!(m.contains(1, p as u64, 4) && !m.contains(0, p as u64, 4));
        assert_eq!(m.ranges().len(), 3);
        assert!(m.lookup_for(3, &[0; 4]).is_none());
    }

    #[test]
    fn hashes_insert_update_delete_and_fill_up() {
        let m = Map::new(&spec(MapKind::Hash, 2, 2), 1).expect("map");
        m.update(b"aa", &[1; 4], BPF_NOEXIST).expect("new");
        assert_eq!(
            m.update(b"aa", &[2; 4], BPF_NOEXIST).unwrap_err().errno(),
            -17
        );
        assert_eq!(m.update(b"bb", &[2; 4], BPF_EXIST).unwrap_err().errno(), -2);
        m.update(b"bb", &[2; 4], BPF_ANY).expect("second");
        assert_eq!(m.update(b"cc", &[3; 4], BPF_ANY).unwrap_err().errno(), -7);
        m.delete(b"aa").expect("delete");
        assert_eq!(m.delete(b"aa").unwrap_err().errno(), -2);
        m.update(b"cc", &[3; 4], BPF_ANY).expect("reuses the slot");
        assert_eq!(
            m.dump(),
            [(b"bb".to_vec(), vec![2; 4]), (b"cc".to_vec(), vec![3; 4])]
        );
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn lru_hashes_evict_what_was_not_used_since_the_clock_passed() {
        let m = Map::new(&spec(MapKind::LruHash, 1, 2), 1).expect("map");
        m.update(b"a", &[1; 4], BPF_ANY).expect("a");
        m.update(b"b", &[2; 4], BPF_ANY).expect("b");
        // Full: the clock clears both bits and evicts the first slot, `a`.
        m.update(b"c", &[3; 4], BPF_ANY).expect("evicts");
        assert_eq!(m.lookup(b"a"), Ok(None));
        // `b`'s bit is clear, `c`'s set: `b` goes next, unless a lookup refreshes it.
        assert!(m.lookup_for(0, b"b").is_some());
        m.update(b"d", &[4; 4], BPF_ANY).expect("evicts");
        assert_eq!(m.len(), 2);
        assert!(m.lookup(b"d").expect("key").is_some());
    }

    #[test]
    fn maps_larger_than_the_cap_are_refused() {
        let mut s = spec(MapKind::Array, 4, u32::MAX);
        s.value_size = 4096;
        assert!(matches!(Map::new(&s, 1), Err(MapError::TooLarge { .. })));
    }
}
