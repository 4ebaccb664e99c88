//! Identifiers the steering node works with: data nodes, tunnels, attachments and ports
//! (defined once, in the `ids` crate) and health probes.

use core::fmt;

pub use ids::{AttachmentId, NodeId, PortId, TunnelId};

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
