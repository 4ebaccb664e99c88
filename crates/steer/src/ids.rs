//! Identifiers the steering node works with: data nodes, tunnels and health probes.

use core::fmt;

/// A node as numbered by the control node: a data node (the paper's GPN) in the steering
/// tables, or a steer node where the control node divides rate limits
/// ([`crate::RateShares`]). Small and `Copy`: it is what the steering tables return per
/// packet; the I/O layer maps it to the node's address.
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

/// A tunnel, numbered as the control node numbers it (the value of `ike::TunnelId`; this crate
/// does not depend on `ike`). Rate limits and counters are kept per tunnel.
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

/// A health probe, unique within one [`crate::HealthMonitor`] (numbered from 1 upwards). The
/// I/O layer carries it to the data node (e.g. in a Geneve option) and back in the reply.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProbeId(pub u64);

impl fmt::Debug for ProbeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "probe{}", self.0)
    }
}

impl fmt::Display for ProbeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
