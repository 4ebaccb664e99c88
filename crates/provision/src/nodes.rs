//! The node hierarchy (the paper's §5.2, "Hierarchy of virtual machine"): active nodes carry
//! tunnels; inactive nodes are booted and held in reserve, and join the pool at once; shut-down
//! nodes are not booted and take minutes to start. A starting node is on its way from shut
//! down to inactive.
//!
//! ```text
//!                 start (takes the start latency)          activate (instant)
//!   ShutDown ──────────────────────▶ Starting ──ready──▶ Inactive ◀──────────▶ Active
//!      ▲                                                    │   deactivate (empty only)
//!      └──────────────────────── stop ──────────────────────┘
//! ```
//!
//! The reserve of §5.3 is the active and inactive nodes; a planner also counts starting nodes,
//! which will be in the reserve by the time it could start more.

use core::fmt;
use std::time::Instant;

use crate::ids::NodeId;

/// Where a node is in the hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// Booted and in the data-node pool: it may hold tunnels.
    Active,
    /// Booted, held in reserve: it joins the pool at once when activated.
    Inactive,
    /// Booting; it becomes inactive at `ready_at` (or when its provider says it is up).
    Starting {
        /// When the node is expected to be up.
        ready_at: Instant,
    },
    /// Not booted; starting it takes the start latency.
    ShutDown,
}

impl NodeState {
    /// Whether the node may hold tunnels.
    pub fn is_active(self) -> bool {
        self == Self::Active
    }

    /// Whether the node counts towards the reserve: active, inactive or starting.
    pub fn is_reserved(self) -> bool {
        !matches!(self, Self::ShutDown)
    }

    /// A short lower-case name ("active", "inactive", "starting", "shut down").
    pub fn name(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Inactive => "inactive",
            Self::Starting { .. } => "starting",
            Self::ShutDown => "shut down",
        }
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How many nodes are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCounts {
    /// Active nodes.
    pub active: usize,
    /// Inactive nodes.
    pub inactive: usize,
    /// Starting nodes.
    pub starting: usize,
    /// Shut-down nodes the cluster lists.
    pub shut_down: usize,
}

impl NodeCounts {
    /// Active and inactive nodes: the reserve of §5.3.
    pub fn reserve(&self) -> usize {
        self.active + self.inactive
    }

    /// Active, inactive and starting nodes: the reserve once the starting nodes are up.
    pub fn reserve_with_starting(&self) -> usize {
        self.reserve() + self.starting
    }
}

/// The node changes of a plan, by kind, each in the order the plan makes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePlan {
    /// Inactive nodes to put in the pool.
    pub activate: Vec<NodeId>,
    /// Empty active nodes to hold in reserve.
    pub deactivate: Vec<NodeId>,
    /// Shut-down (or new) nodes to start, and when each is expected up.
    pub start: Vec<(NodeId, Instant)>,
    /// Inactive nodes to shut down.
    pub stop: Vec<NodeId>,
}

impl NodePlan {
    /// Whether the plan changes no node.
    pub fn is_empty(&self) -> bool {
        self.activate.is_empty()
            && self.deactivate.is_empty()
            && self.start.is_empty()
            && self.stop.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_counts() {
        let starting = NodeState::Starting {
            ready_at: Instant::now(),
        };
        assert!(NodeState::Active.is_active());
        assert!(!NodeState::Inactive.is_active());
        assert!(starting.is_reserved());
        assert!(!NodeState::ShutDown.is_reserved());
        assert_eq!(NodeState::ShutDown.to_string(), "shut down");
        assert_eq!(starting.to_string(), "starting");
        let counts = NodeCounts {
            active: 3,
            inactive: 2,
            starting: 1,
            shut_down: 4,
        };
        assert_eq!(counts.reserve(), 5);
        assert_eq!(counts.reserve_with_starting(), 6);
        assert!(NodePlan::default().is_empty());
    }
}
