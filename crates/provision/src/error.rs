//! The error type of the provisioning crate: invalid configuration, invalid measurements and
//! operations on a [`crate::Cluster`] that do not match its state, each naming what was wrong.

use core::fmt;

use crate::ids::{NodeId, TunnelId};
use crate::nodes::NodeState;

/// Everything the provisioning crate rejects.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProvisionError {
    /// A configuration field out of range.
    #[error("provisioning config: {field} = {value}: {reason}")]
    InvalidConfig {
        /// The field's name (in [`crate::PlannerConfig`] or [`crate::UsageConfig`]).
        field: &'static str,
        /// The rejected value, as written.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A usage sample (α) that is not a finite, non-negative number.
    #[error("{}usage sample {value}: {reason}", Subject(*.tunnel))]
    InvalidUsage {
        /// The tunnel it was measured for, when known.
        tunnel: Option<TunnelId>,
        /// The rejected sample.
        value: f64,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A usage cap (σ) that is not a finite number above zero.
    #[error("{}usage cap σ = {value}: must be finite and above zero", Subject(*.tunnel))]
    InvalidSigma {
        /// The tunnel it was given for, when known.
        tunnel: Option<TunnelId>,
        /// The rejected cap.
        value: f64,
    },
    /// A violation tolerance ε outside `[0, 1)`.
    #[error("violation tolerance ε = {value}: must be in [0, 1)")]
    InvalidEpsilon {
        /// The rejected tolerance.
        value: f64,
    },
    /// A hotspot threshold T_H outside `(0, 1]`.
    #[error("hotspot threshold T_H = {value}: must be in (0, 1]")]
    InvalidThreshold {
        /// The rejected threshold.
        value: f64,
    },
    /// A capacity C that is negative or not finite.
    #[error("capacity C = {value}: must be finite and not negative")]
    InvalidCapacity {
        /// The rejected capacity.
        value: f64,
    },
    /// A lattice step for the aggregate that is not finite and above zero, or so small that
    /// one tunnel's usage would span more lattice points than the aggregate allows.
    #[error("lattice step {step} for a tunnel with σ = {sigma}: {reason}")]
    InvalidStep {
        /// The rejected step.
        step: f64,
        /// The cap of the tunnel that showed the problem (0 when none did).
        sigma: f64,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A node the cluster already lists.
    #[error("{node}: already in the cluster")]
    DuplicateNode {
        /// The node.
        node: NodeId,
    },
    /// A node the cluster does not list.
    #[error("{node}: not in the cluster")]
    UnknownNode {
        /// The node.
        node: NodeId,
    },
    /// A tunnel the cluster already lists.
    #[error("{tunnel}: already in the cluster")]
    DuplicateTunnel {
        /// The tunnel.
        tunnel: TunnelId,
    },
    /// A tunnel the cluster does not list.
    #[error("{tunnel}: not in the cluster")]
    UnknownTunnel {
        /// The tunnel.
        tunnel: TunnelId,
    },
    /// A tunnel cannot be placed on a node that is not active.
    #[error("{node} is {state}, not active: it cannot hold tunnels")]
    NodeNotActive {
        /// The node.
        node: NodeId,
        /// Its state.
        state: NodeState,
    },
    /// A node state change that the node hierarchy (§5.2) does not allow from the node's
    /// current state.
    #[error("{node} is {state}: cannot {action} it")]
    InvalidTransition {
        /// The node.
        node: NodeId,
        /// Its current state.
        state: NodeState,
        /// The change asked for ("activate", "deactivate", "start", "stop").
        action: &'static str,
    },
    /// An active node can only be deactivated once it holds no tunnel.
    #[error("{node} still holds {tunnels} tunnel(s): cannot deactivate it")]
    NodeNotEmpty {
        /// The node.
        node: NodeId,
        /// How many tunnels it holds.
        tunnels: usize,
    },
    /// A migration whose source is not where the tunnel is.
    #[error("{tunnel} is on {}, not on {expected}", NodeLabel(*.actual))]
    TunnelNotOnNode {
        /// The tunnel.
        tunnel: TunnelId,
        /// The node the migration names as its source.
        expected: NodeId,
        /// Where the tunnel is (None: on no node).
        actual: Option<NodeId>,
    },
    /// A placement of a tunnel that already has a node (use a migration instead).
    #[error("{tunnel} is already on {node}")]
    TunnelAlreadyPlaced {
        /// The tunnel.
        tunnel: TunnelId,
        /// Its node.
        node: NodeId,
    },
    /// Every node number is in use, so no new node can be named.
    #[error("no free node number left")]
    NodeIdsExhausted,
}

/// "tunnelN: " or nothing.
struct Subject(Option<TunnelId>);

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(tunnel) => write!(f, "{tunnel}: "),
            None => Ok(()),
        }
    }
}

/// "nodeN" or "no node".
struct NodeLabel(Option<NodeId>);

impl fmt::Display for NodeLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(node) => write!(f, "{node}"),
            None => f.write_str("no node"),
        }
    }
}
