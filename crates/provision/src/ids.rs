//! Identifiers the provisioning model works with: tunnels and data nodes.

use core::fmt;

/// A tunnel, numbered as the control node numbers it (the value of `ike::TunnelId`; this crate
/// depends on no other Protego crate). Usage histograms and placements are kept per tunnel.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct TunnelId(pub u32);

impl fmt::Debug for TunnelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tunnel{}", self.0)
    }
}

impl fmt::Display for TunnelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A data node (the paper's GPN), as numbered by the control node. The planner allocates the
/// next free number when it needs a node that the cluster does not list yet.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NodeId(pub u32);

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node{}", self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
