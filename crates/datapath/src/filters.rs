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
