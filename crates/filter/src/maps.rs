//! The maps a tenant program declares (`SEC(".maps")`, described by BTF), as the runtime will
//! create them: only the four kinds the gateway offers.

use crate::LoadError;

/// A map type the gateway offers (the kernel's `enum bpf_map_type` numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MapKind {
    /// `BPF_MAP_TYPE_HASH` (1).
    Hash,
    /// `BPF_MAP_TYPE_ARRAY` (2).
    Array,
    /// `BPF_MAP_TYPE_PERCPU_ARRAY` (6): one value per worker.
    PerCpuArray,
    /// `BPF_MAP_TYPE_LRU_HASH` (9): a hash that evicts its least recently used entry when full.
    LruHash,
}

impl MapKind {
    /// Every offered kind.
    pub const ALL: [MapKind; 4] = [Self::Hash, Self::Array, Self::PerCpuArray, Self::LruHash];

    /// The kind of the kernel's map type number, if it is offered.
    pub fn from_type(map_type: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.map_type() == map_type)
    }

    /// The kernel's map type number.
    pub fn map_type(self) -> u32 {
        match self {
            Self::Hash => 1,
            Self::Array => 2,
            Self::PerCpuArray => 6,
            Self::LruHash => 9,
        }
    }

    /// Whether keys are indices `0..max_entries` (array kinds).
    pub fn is_array(self) -> bool {
        matches!(self, Self::Array | Self::PerCpuArray)
    }
}

impl std::fmt::Display for MapKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Hash => "hash",
            Self::Array => "array",
            Self::PerCpuArray => "percpu_array",
            Self::LruHash => "lru_hash",
        })
    }
}

/// One map a [`crate::Program`] uses, as declared in the object.
///
/// In the program's instructions, a map is referenced by `lddw rX, HANDLE` with the source
/// register `BPF_PSEUDO_MAP_FD` (1), where `HANDLE` is the map's position
/// in [`crate::Program::maps`] plus one (PREVAIL, like the kernel, reserves 0 for no map).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapSpec {
    /// The map's name in the object (its C variable).
    pub name: String,
    /// Its type.
    pub kind: MapKind,
    /// Key size in bytes.
    pub key_size: u32,
    /// Value size in bytes.
    pub value_size: u32,
    /// Maximum number of entries (for arrays: the number of entries).
    pub max_entries: u32,
    /// `map_flags` as declared (e.g. `BPF_F_NO_PREALLOC`); the runtime decides what it honours.
    pub flags: u32,
}

/// Largest key or value the gateway accepts, in bytes (the kernel's limit for values is
/// larger, but a filter's keys and values are addresses, counters and small structs).
pub const MAX_KEY_OR_VALUE: u32 = 4096;

impl MapSpec {
    /// The map's description from `aya-obj`, checked against what the gateway offers.
    pub(crate) fn from_obj(name: &str, map: &aya_obj::Map) -> Result<Self, LoadError> {
        let map_name = || name.to_owned();
        if let aya_obj::Map::Legacy(_) = map {
            return Err(LoadError::LegacyMap { map: map_name() });
        }
        let kind = MapKind::from_type(map.map_type()).ok_or_else(|| LoadError::MapType {
            map: map_name(),
            map_type: map.map_type(),
        })?;
        let spec = Self {
            name: name.to_owned(),
            kind,
            key_size: map.key_size(),
            value_size: map.value_size(),
            max_entries: map.max_entries(),
            flags: map.map_flags(),
        };
        match spec.shape_error() {
            Some(what) => Err(LoadError::MapShape {
                map: map_name(),
                what,
            }),
            None => Ok(spec),
        }
    }

    /// What is wrong with the map's shape for the gateway, if anything: key and value sizes
    /// of 1 to [`MAX_KEY_OR_VALUE`] bytes, a 4-byte key for arrays, at least one entry.
    pub fn shape_error(&self) -> Option<&'static str> {
        if self.key_size == 0 || self.key_size > MAX_KEY_OR_VALUE {
            return Some("key size must be 1 to 4096 bytes");
        }
        if self.kind.is_array() && self.key_size != 4 {
            return Some("an array's key must be a 4-byte index (__u32)");
        }
        if self.value_size == 0 || self.value_size > MAX_KEY_OR_VALUE {
            return Some("value size must be 1 to 4096 bytes");
        }
        if self.max_entries == 0 {
            return Some("max_entries must be at least 1");
        }
        None
    }

    /// The map descriptor PREVAIL checks helper arguments and value accesses against.
    pub(crate) fn descriptor(
        &self,
        handle: i32,
    ) -> prevail::spec::type_descriptors::EbpfMapDescriptor {
        prevail::spec::type_descriptors::EbpfMapDescriptor {
            original_fd: handle,
            map_type: self.kind.map_type(),
            key_size: self.key_size,
            value_size: self.value_size,
            max_entries: self.max_entries,
            inner_map_fd: -1,
            name: self.name.clone(),
            is_inner_map_template: false,
        }
    }
}
