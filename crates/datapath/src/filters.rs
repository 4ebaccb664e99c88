//! Tenant filters (issue 18): the eBPF programs a tenant runs on its own traffic, as the
//! control plane hands them to a data path. The object's bytes travel whole: a data path
//! loads and verifies them itself before anything runs them.

use ids::TenantId;
use std::fmt;
use std::sync::Arc;

/// Which of a tenant's traffic a filter sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FilterDirection {
    /// Toward the tenant's VNet: decrypted tunnel traffic and frames from its attachments,
    /// before they are delivered (`"to_cloud"`).
    ToCloud,
    /// From the tenant's VNet toward its tunnels and attachments, before encryption or
    /// tagging (`"from_cloud"`).
    FromCloud,
}

impl FilterDirection {
    /// Both directions, in the order status output lists them.
    pub const ALL: [Self; 2] = [Self::ToCloud, Self::FromCloud];

    /// The direction as configuration files and commands spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ToCloud => "to_cloud",
            Self::FromCloud => "from_cloud",
        }
    }

    /// Parses [`Self::as_str`]'s spelling.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == text)
    }
}

impl fmt::Display for FilterDirection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One tenant filter: a program of an eBPF object, where it runs and in which order.
///
/// A tenant's filters of one direction run in increasing `weight` (then in the order given);
/// each sees the packet as the one before it left it, and the first verdict other than
/// `XDP_PASS` ends the chain. Filters of one tenant loaded from the same object (the same
/// bytes) share that object's maps, as the programs of one object do under libbpf.
#[derive(Clone, PartialEq, Eq)]
pub struct FilterConfig {
    /// The tenant whose traffic it sees.
    pub tenant: TenantId,
    /// Which of that traffic.
    pub direction: FilterDirection,
    /// The object file's name as given (for status and errors; the bytes are what runs).
    pub object_name: String,
    /// The ELF object as clang wrote it.
    pub object: Arc<[u8]>,
    /// `xdp`, or `xdp:FUNCTION` when the section holds several programs.
    pub section: String,
    /// Order among the tenant's filters of one direction (lower first).
    pub weight: u32,
}

impl FilterConfig {
    /// The file name of the object (`object_name` without its directories): what tells two
    /// versions of one program apart from two programs, whichever path named the file.
    pub fn file_name(&self) -> &str {
        std::path::Path::new(&self.object_name)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(&self.object_name)
    }

    /// Whether `other` runs in this filter's place: the same tenant, direction, section and
    /// object file name (a new version of the same program replaces it there).
    pub fn same_place(&self, other: &FilterConfig) -> bool {
        self.tenant == other.tenant
            && self.direction == other.direction
            && self.section == other.section
            && self.file_name() == other.file_name()
    }
}

impl fmt::Debug for FilterConfig {
    /// Everything but the object's bytes (their length instead).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FilterConfig")
            .field("tenant", &self.tenant)
            .field("direction", &self.direction)
            .field("object_name", &self.object_name)
            .field("object_bytes", &self.object.len())
            .field("section", &self.section)
            .field("weight", &self.weight)
            .finish()
    }
}

/// What one filter did since it was loaded (its runs on every worker, summed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilterCounters {
    /// Runs that returned `XDP_PASS`.
    pub passed: u64,
    /// Runs that returned `XDP_DROP`.
    pub dropped: u64,
    /// Runs that returned `XDP_TX`.
    pub tx: u64,
    /// Runs that ended `XDP_ABORTED`: returned it, stopped by the instruction meter, returned
    /// no valid action, or faulted.
    pub aborted: u64,
    /// Of the aborted runs, those the instruction meter stopped.
    pub insn_limit: u64,
    /// Instructions the meter charged: every trip around one of the program's loops charges
    /// the loop's length; code outside loops (at most the program's length per run) is not
    /// charged.
    pub metered_insns: u64,
    /// CPU time in the program, in nanoseconds (the cycle counter around its runs).
    pub cpu_ns: u64,
}

/// One running filter and its counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterProgramReport {
    /// The tenant.
    pub tenant: TenantId,
    /// Where it runs.
    pub direction: FilterDirection,
    /// Its section.
    pub section: String,
    /// The object file's name as given.
    pub object_name: String,
    /// Its order among the tenant's filters of the direction.
    pub weight: u32,
    /// Its instructions as loaded.
    pub instructions: usize,
    /// What it did.
    pub counters: FilterCounters,
}

/// One map of a tenant's filters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterMapReport {
    /// The tenant.
    pub tenant: TenantId,
    /// The map's name as declared.
    pub name: String,
    /// The object file that declares it.
    pub object_name: String,
    /// `hash`, `array`, `percpu_array` or `lru_hash`.
    pub kind: String,
    /// Key size in bytes.
    pub key_size: u32,
    /// Value size in bytes (of one worker's value, for a per-CPU map).
    pub value_size: u32,
    /// Most entries.
    pub max_entries: u32,
    /// Entries held (arrays: `max_entries`).
    pub entries: usize,
    /// Values per key: the number of workers for a per-CPU map, else 1.
    pub copies: usize,
}

/// The running filters and their maps (of one tenant, or of all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilterReport {
    /// The filters, by tenant, direction and weight.
    pub programs: Vec<FilterProgramReport>,
    /// Their maps, each once.
    pub maps: Vec<FilterMapReport>,
}

/// An operation on one map of a tenant's filters (`protego ctl filter map`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilterMapOp {
    /// Every entry.
    Dump,
    /// Sets `key`'s value (every worker's, concatenated, for a per-CPU map) under `flags`
    /// (0 any, 1 only a new key, 2 only an existing key: the kernel's `BPF_ANY`,
    /// `BPF_NOEXIST`, `BPF_EXIST`).
    Update {
        /// The key's bytes.
        key: Vec<u8>,
        /// The value's bytes.
        value: Vec<u8>,
        /// `BPF_ANY`, `BPF_NOEXIST` or `BPF_EXIST`.
        flags: u64,
    },
    /// Deletes `key` (hash kinds).
    Delete {
        /// The key's bytes.
        key: Vec<u8>,
    },
}

/// A tenant's setting of one map entry: a `protego ctl filter map update` that the node keeps
/// (in its store) and writes again into the map wherever the map starts afresh (a restarted
/// gateway, a data node that registers), so that a threshold a tenant tuned stays tuned. A
/// `delete` of the key forgets it; a new filter set whose map of that name is declared
/// differently (or gone) forgets the map's settings, as the map's contents are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterMapSetting {
    /// The tenant.
    pub tenant: TenantId,
    /// The map as the update named it (`NAME` or `OBJECT:NAME`).
    pub map: String,
    /// The key's bytes.
    pub key: Vec<u8>,
    /// The value's bytes (every worker's, concatenated, for a per-CPU map).
    pub value: Vec<u8>,
}

/// What a [`FilterMapOp`] found: the map, and for a dump its entries as (key, value), keys in
/// ascending byte order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterMapAnswer {
    /// The map.
    pub map: FilterMapReport,
    /// The entries (a dump on one data path), else empty.
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
    /// The distributed form: each data node's answer, by node name (every data node holds its
    /// own copy of the map, as each CPU holds its own copy of a per-CPU map); `entries` is
    /// then empty. Empty for one data path.
    pub nodes: Vec<FilterMapNode>,
}

/// One data node's part of a [`FilterMapAnswer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterMapNode {
    /// The data node's name.
    pub node: String,
    /// Its entries (a dump), keys in ascending byte order; else empty.
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
}
