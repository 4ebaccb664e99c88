//! The state the planner reads: data nodes with their place in the hierarchy (§5.2), tunnels
//! with their current usage α_i and node, and so each node's utilization β_j (§5.2, "Current
//! resource usage of a tunnel and utilization of a node": β_j = Σ α_i over its tunnels).
//!
//! A [`Cluster`] is a plain value: a simulator keeps one and applies each [`crate::Plan`] to
//! it; a live autoscaler builds one from its reports every τ. Iteration is in identifier
//! order, so everything computed from it is deterministic.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use crate::error::ProvisionError;
use crate::ids::{NodeId, TunnelId};
use crate::nodes::{NodeCounts, NodeState};
use crate::placement::{Fill, Size, FIT_TOLERANCE};
use crate::plan::{Action, Plan};
use crate::usage::check_sample;

/// A tunnel's usage and node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TunnelState {
    /// Current usage α_i, in the caller's unit.
    pub alpha: f64,
    /// Headroom on top of α_i that the tunnel shares with the others of its node (0 unless
    /// set: see [`Fill`] and [`Cluster::set_spread`]).
    pub spread: f64,
    /// The node it is on, if any.
    pub node: Option<NodeId>,
    /// Not measured yet (a new tunnel at its prior size): consolidation, hotspot relief and
    /// drain leave it where it is ([`Cluster::set_settling`]).
    pub settling: bool,
}

impl TunnelState {
    /// What placement packs: α_i with its spread.
    pub fn fill(&self) -> Fill {
        Fill::new(self.alpha, self.spread)
    }
}

#[derive(Debug, Clone, PartialEq)]
struct NodeEntry {
    state: NodeState,
    tunnels: BTreeSet<TunnelId>,
    /// Cannot be stopped (no provider manages it).
    pinned: bool,
}

/// Nodes, tunnels and the placement of tunnels on nodes (see the module docs).
///
/// Invariants it keeps: a tunnel is on at most one node, and that node is listed. Tunnels are
/// placed only on active nodes, but a node may stop being active with tunnels on it (through
/// [`Cluster::set_node_state`], as a live report may say); the planner then moves them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cluster {
    nodes: BTreeMap<NodeId, NodeEntry>,
    tunnels: BTreeMap<TunnelId, TunnelState>,
}

impl Cluster {
    /// No nodes, no tunnels.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lists a node in `state`.
    pub fn add_node(&mut self, node: NodeId, state: NodeState) -> Result<(), ProvisionError> {
        if self.nodes.contains_key(&node) {
            return Err(ProvisionError::DuplicateNode { node });
        }
        self.nodes.insert(
            node,
            NodeEntry {
                state,
                tunnels: BTreeSet::new(),
                pinned: false,
            },
        );
        Ok(())
    }

    /// Forgets a node (it failed or was released); its tunnels are left on no node. Returns
    /// them.
    pub fn remove_node(&mut self, node: NodeId) -> Result<Vec<TunnelId>, ProvisionError> {
        let entry = self
            .nodes
            .remove(&node)
            .ok_or(ProvisionError::UnknownNode { node })?;
        for tunnel in &entry.tunnels {
            if let Some(t) = self.tunnels.get_mut(tunnel) {
                t.node = None;
            }
        }
        Ok(entry.tunnels.into_iter().collect())
    }

    /// Sets a node's state as reported, without checking the transition. Tunnels on a node
    /// that is no longer active stay there until the planner moves them.
    pub fn set_node_state(&mut self, node: NodeId, state: NodeState) -> Result<(), ProvisionError> {
        let entry = self
            .nodes
            .get_mut(&node)
            .ok_or(ProvisionError::UnknownNode { node })?;
        entry.state = state;
        Ok(())
    }

    /// Marks a listed node as one that cannot be stopped (e.g. no node provider manages it):
    /// the planner never stops it, and drains it only after the nodes it can stop.
    pub fn pin(&mut self, node: NodeId) -> Result<(), ProvisionError> {
        let entry = self
            .nodes
            .get_mut(&node)
            .ok_or(ProvisionError::UnknownNode { node })?;
        entry.pinned = true;
        Ok(())
    }

    /// Whether the node is pinned ([`Cluster::pin`]).
    pub fn is_pinned(&self, node: NodeId) -> bool {
        self.nodes.get(&node).is_some_and(|e| e.pinned)
    }

    /// A node's state, if listed.
    pub fn node_state(&self, node: NodeId) -> Option<NodeState> {
        self.nodes.get(&node).map(|e| e.state)
    }

    /// All nodes and their states, in node order.
    pub fn nodes(&self) -> impl Iterator<Item = (NodeId, NodeState)> + '_ {
        self.nodes.iter().map(|(&id, e)| (id, e.state))
    }

    /// The tunnels on a node, in tunnel order (none for an unknown node).
    pub fn tunnels_on(&self, node: NodeId) -> impl Iterator<Item = TunnelId> + '_ {
        self.nodes
            .get(&node)
            .into_iter()
            .flat_map(|e| e.tunnels.iter().copied())
    }

    /// β_j: the sum of the usage of the node's tunnels (0 for an unknown node).
    pub fn load(&self, node: NodeId) -> f64 {
        self.tunnels_on(node)
            .filter_map(|t| self.tunnels.get(&t))
            .map(|t| t.alpha)
            .sum()
    }

    /// The node's fill: Σ α_i with the spreads of its tunnels (0 for an unknown node). Its mean
    /// is [`Cluster::load`].
    pub fn fill(&self, node: NodeId) -> Fill {
        self.tunnels_on(node)
            .filter_map(|t| self.tunnels.get(&t))
            .fold(Fill::default(), |sum, t| sum + t.fill())
    }

    /// The load of every active node, in node order.
    pub fn active_loads(&self) -> BTreeMap<NodeId, f64> {
        self.nodes
            .iter()
            .filter(|(_, e)| e.state.is_active())
            .map(|(&id, _)| (id, self.load(id)))
            .collect()
    }

    /// The fill of every active node, in node order.
    pub fn active_fills(&self) -> BTreeMap<NodeId, Fill> {
        self.nodes
            .iter()
            .filter(|(_, e)| e.state.is_active())
            .map(|(&id, _)| (id, self.fill(id)))
            .collect()
    }

    /// Active nodes whose level (load plus shared spread, [`Fill`]) is above `limit` (with
    /// [`FIT_TOLERANCE`]): (node, level), highest first. Without spreads the level is the
    /// load.
    pub fn hotspots(&self, limit: f64) -> Vec<(NodeId, f64)> {
        let mut hot: Vec<(NodeId, f64)> = self
            .active_fills()
            .into_iter()
            .map(|(node, fill)| (node, fill.level()))
            .filter(|&(_, level)| level > limit + FIT_TOLERANCE)
            .collect();
        hot.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        hot
    }

    /// How many nodes are in each state.
    pub fn counts(&self) -> NodeCounts {
        let mut counts = NodeCounts::default();
        for entry in self.nodes.values() {
            match entry.state {
                NodeState::Active => counts.active += 1,
                NodeState::Inactive => counts.inactive += 1,
                NodeState::Starting { .. } => counts.starting += 1,
                NodeState::ShutDown => counts.shut_down += 1,
            }
        }
        counts
    }

    /// The lowest node number above every listed one (0 for no nodes).
    pub fn next_node_id(&self) -> Result<NodeId, ProvisionError> {
        match self.nodes.keys().next_back() {
            None => Ok(NodeId(0)),
            Some(last) => last
                .0
                .checked_add(1)
                .map(NodeId)
                .ok_or(ProvisionError::NodeIdsExhausted),
        }
    }

    /// Lists a tunnel with usage `alpha`, on no node.
    pub fn add_tunnel(&mut self, tunnel: TunnelId, alpha: f64) -> Result<(), ProvisionError> {
        check_sample(Some(tunnel), alpha)?;
        if self.tunnels.contains_key(&tunnel) {
            return Err(ProvisionError::DuplicateTunnel { tunnel });
        }
        self.tunnels.insert(
            tunnel,
            TunnelState {
                alpha,
                spread: 0.0,
                node: None,
                settling: false,
            },
        );
        Ok(())
    }

    /// Marks a tunnel as settling (not measured yet: the planner places it but moves it no
    /// more until it is measured) or as measured.
    pub fn set_settling(&mut self, tunnel: TunnelId, settling: bool) -> Result<(), ProvisionError> {
        let state = self.tunnel_mut(tunnel)?;
        state.settling = settling;
        Ok(())
    }

    /// Forgets a tunnel; returns the node it was on.
    pub fn remove_tunnel(&mut self, tunnel: TunnelId) -> Result<Option<NodeId>, ProvisionError> {
        let state = self
            .tunnels
            .remove(&tunnel)
            .ok_or(ProvisionError::UnknownTunnel { tunnel })?;
        if let Some(node) = state.node {
            if let Some(entry) = self.nodes.get_mut(&node) {
                entry.tunnels.remove(&tunnel);
            }
        }
        Ok(state.node)
    }

    /// Sets a tunnel's current usage α_i (finite, not negative).
    pub fn set_alpha(&mut self, tunnel: TunnelId, alpha: f64) -> Result<(), ProvisionError> {
        check_sample(Some(tunnel), alpha)?;
        let state = self.tunnel_mut(tunnel)?;
        state.alpha = alpha;
        Ok(())
    }

    /// Sets the headroom a tunnel shares with the others of its node (finite, not negative;
    /// see [`Fill`]). 0 packs it at α_i alone, as the paper does.
    pub fn set_spread(&mut self, tunnel: TunnelId, spread: f64) -> Result<(), ProvisionError> {
        check_sample(Some(tunnel), spread)?;
        let state = self.tunnel_mut(tunnel)?;
        state.spread = spread;
        Ok(())
    }

    /// A listed tunnel's state, for a change; an unknown tunnel is an error.
    fn tunnel_mut(&mut self, tunnel: TunnelId) -> Result<&mut TunnelState, ProvisionError> {
        self.tunnels
            .get_mut(&tunnel)
            .ok_or(ProvisionError::UnknownTunnel { tunnel })
    }

    /// A tunnel's usage and node, if listed.
    pub fn tunnel(&self, tunnel: TunnelId) -> Option<TunnelState> {
        self.tunnels.get(&tunnel).copied()
    }

    /// All tunnels, in tunnel order.
    pub fn tunnels(&self) -> impl Iterator<Item = (TunnelId, TunnelState)> + '_ {
        self.tunnels.iter().map(|(&id, &t)| (id, t))
    }

    /// Number of tunnels.
    pub fn tunnel_count(&self) -> usize {
        self.tunnels.len()
    }

    /// Σ α_i over all tunnels.
    pub fn total_load(&self) -> f64 {
        self.tunnels.values().map(|t| t.alpha).sum()
    }

    /// Puts a tunnel on an active node, from wherever it is.
    pub fn assign(&mut self, tunnel: TunnelId, node: NodeId) -> Result<(), ProvisionError> {
        let state = self
            .nodes
            .get(&node)
            .ok_or(ProvisionError::UnknownNode { node })?
            .state;
        if !state.is_active() {
            return Err(ProvisionError::NodeNotActive { node, state });
        }
        let previous = self
            .tunnels
            .get(&tunnel)
            .ok_or(ProvisionError::UnknownTunnel { tunnel })?
            .node;
        if let Some(old) = previous {
            if let Some(entry) = self.nodes.get_mut(&old) {
                entry.tunnels.remove(&tunnel);
            }
        }
        if let Some(entry) = self.nodes.get_mut(&node) {
            entry.tunnels.insert(tunnel);
        }
        if let Some(t) = self.tunnels.get_mut(&tunnel) {
            t.node = Some(node);
        }
        Ok(())
    }

    /// Takes a tunnel off its node (if any).
    pub fn unassign(&mut self, tunnel: TunnelId) -> Result<(), ProvisionError> {
        let t = self.tunnel_mut(tunnel)?;
        if let Some(old) = t.node.take() {
            if let Some(entry) = self.nodes.get_mut(&old) {
                entry.tunnels.remove(&tunnel);
            }
        }
        Ok(())
    }

    /// Turns starting nodes whose `ready_at` is not after `now` into inactive ones; returns
    /// them. (A live cluster sets the state when the provider reports the node up instead.)
    pub fn advance(&mut self, now: Instant) -> Vec<NodeId> {
        let mut ready = Vec::new();
        for (&id, entry) in self.nodes.iter_mut() {
            if let NodeState::Starting { ready_at } = entry.state {
                if ready_at <= now {
                    entry.state = NodeState::Inactive;
                    ready.push(id);
                }
            }
        }
        ready
    }

    /// Applies one action, checking it against the state (see [`Action`]): a placement needs
    /// an unplaced tunnel and an active node, a migration the tunnel on its source and an
    /// active target, activation an inactive node, deactivation an empty active node, start a
    /// shut-down or unlisted node, stop an inactive or starting node. On error nothing changes.
    pub fn apply(&mut self, action: &Action) -> Result<(), ProvisionError> {
        match *action {
            Action::Place { tunnel, node } => {
                let t = self
                    .tunnel(tunnel)
                    .ok_or(ProvisionError::UnknownTunnel { tunnel })?;
                if let Some(current) = t.node {
                    return Err(ProvisionError::TunnelAlreadyPlaced {
                        tunnel,
                        node: current,
                    });
                }
                self.assign(tunnel, node)
            }
            Action::Migrate { tunnel, from, to } => {
                let t = self
                    .tunnel(tunnel)
                    .ok_or(ProvisionError::UnknownTunnel { tunnel })?;
                if t.node != Some(from) {
                    return Err(ProvisionError::TunnelNotOnNode {
                        tunnel,
                        expected: from,
                        actual: t.node,
                    });
                }
                self.assign(tunnel, to)
            }
            Action::Activate { node } => self.transition(node, "activate", |state| {
                (state == NodeState::Inactive).then_some(NodeState::Active)
            }),
            Action::Deactivate { node } => {
                let entry = self
                    .nodes
                    .get(&node)
                    .ok_or(ProvisionError::UnknownNode { node })?;
                if entry.state.is_active() && !entry.tunnels.is_empty() {
                    return Err(ProvisionError::NodeNotEmpty {
                        node,
                        tunnels: entry.tunnels.len(),
                    });
                }
                self.transition(node, "deactivate", |state| {
                    state.is_active().then_some(NodeState::Inactive)
                })
            }
            Action::Start { node, ready_at } => {
                if !self.nodes.contains_key(&node) {
                    return self.add_node(node, NodeState::Starting { ready_at });
                }
                self.transition(node, "start", |state| {
                    (state == NodeState::ShutDown).then_some(NodeState::Starting { ready_at })
                })
            }
            Action::Stop { node } => self.transition(node, "stop", |state| {
                matches!(state, NodeState::Inactive | NodeState::Starting { .. })
                    .then_some(NodeState::ShutDown)
            }),
        }
    }

    /// Applies every action of `plan` in order; on error nothing changes.
    pub fn apply_plan(&mut self, plan: &Plan) -> Result<(), ProvisionError> {
        let mut next = self.clone();
        for decision in &plan.decisions {
            next.apply(&decision.action)?;
        }
        *self = next;
        Ok(())
    }

    fn transition(
        &mut self,
        node: NodeId,
        action: &'static str,
        next: impl FnOnce(NodeState) -> Option<NodeState>,
    ) -> Result<(), ProvisionError> {
        let entry = self
            .nodes
            .get_mut(&node)
            .ok_or(ProvisionError::UnknownNode { node })?;
        match next(entry.state) {
            Some(state) => {
                entry.state = state;
                Ok(())
            }
            None => Err(ProvisionError::InvalidTransition {
                node,
                state: entry.state,
                action,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cluster() -> Cluster {
        let mut c = Cluster::new();
        c.add_node(NodeId(1), NodeState::Active).unwrap();
        c.add_node(NodeId(2), NodeState::Active).unwrap();
        c.add_node(NodeId(3), NodeState::Inactive).unwrap();
        c.add_node(NodeId(4), NodeState::ShutDown).unwrap();
        c.add_tunnel(TunnelId(10), 0.2).unwrap();
        c.add_tunnel(TunnelId(11), 0.3).unwrap();
        c.assign(TunnelId(10), NodeId(1)).unwrap();
        c.assign(TunnelId(11), NodeId(1)).unwrap();
        c
    }

    #[test]
    fn loads_counts_and_hotspots() {
        let c = cluster();
        assert!((c.load(NodeId(1)) - 0.5).abs() < 1e-12);
        assert_eq!(c.load(NodeId(2)), 0.0);
        assert_eq!(c.load(NodeId(99)), 0.0);
        assert_eq!(c.active_loads().len(), 2);
        assert_eq!(c.hotspots(0.45), vec![(NodeId(1), 0.5)]);
        assert!(c.hotspots(0.5).is_empty());
        let counts = c.counts();
        assert_eq!(
            (counts.active, counts.inactive, counts.shut_down),
            (2, 1, 1)
        );
        assert_eq!(c.next_node_id().unwrap(), NodeId(5));
        assert_eq!(Cluster::new().next_node_id().unwrap(), NodeId(0));
        assert!((c.total_load() - 0.5).abs() < 1e-12);
    }

    #[test]
    fn bad_input_is_rejected() {
        let mut c = cluster();
        assert_eq!(
            c.add_node(NodeId(1), NodeState::Active),
            Err(ProvisionError::DuplicateNode { node: NodeId(1) })
        );
        assert_eq!(
            c.add_tunnel(TunnelId(10), 0.1),
            Err(ProvisionError::DuplicateTunnel {
                tunnel: TunnelId(10)
            })
        );
        assert!(c.add_tunnel(TunnelId(12), f64::NAN).is_err());
        assert!(c.set_alpha(TunnelId(10), -0.5).is_err());
        assert!(c.set_alpha(TunnelId(99), 0.5).is_err());
        assert_eq!(
            c.assign(TunnelId(10), NodeId(3)),
            Err(ProvisionError::NodeNotActive {
                node: NodeId(3),
                state: NodeState::Inactive
            })
        );
        assert!(c.assign(TunnelId(10), NodeId(99)).is_err());
        assert!(c.assign(TunnelId(99), NodeId(1)).is_err());
        assert_eq!(c.tunnel(TunnelId(10)).unwrap().node, Some(NodeId(1)));
    }

    #[test]
    fn actions_follow_the_hierarchy() {
        let mut c = cluster();
        let now = Instant::now();
        let ready_at = now + Duration::from_secs(180);
        let err = c.apply(&Action::Activate { node: NodeId(4) }).unwrap_err();
        assert_eq!(err.to_string(), "node4 is shut down: cannot activate it");
        assert_eq!(
            c.apply(&Action::Deactivate { node: NodeId(1) }),
            Err(ProvisionError::NodeNotEmpty {
                node: NodeId(1),
                tunnels: 2
            })
        );
        c.apply(&Action::Deactivate { node: NodeId(2) }).unwrap();
        c.apply(&Action::Activate { node: NodeId(3) }).unwrap();
        c.apply(&Action::Start {
            node: NodeId(4),
            ready_at,
        })
        .unwrap();
        c.apply(&Action::Start {
            node: NodeId(7),
            ready_at,
        })
        .unwrap();
        assert!(c
            .apply(&Action::Start {
                node: NodeId(3),
                ready_at
            })
            .is_err());
        assert!(c.advance(now).is_empty());
        assert_eq!(c.advance(ready_at), vec![NodeId(4), NodeId(7)]);
        c.apply(&Action::Stop { node: NodeId(7) }).unwrap();
        assert_eq!(c.node_state(NodeId(7)), Some(NodeState::ShutDown));
        assert!(c.apply(&Action::Stop { node: NodeId(3) }).is_err());

        c.apply(&Action::Migrate {
            tunnel: TunnelId(10),
            from: NodeId(1),
            to: NodeId(3),
        })
        .unwrap();
        assert_eq!(
            c.apply(&Action::Migrate {
                tunnel: TunnelId(10),
                from: NodeId(1),
                to: NodeId(3),
            }),
            Err(ProvisionError::TunnelNotOnNode {
                tunnel: TunnelId(10),
                expected: NodeId(1),
                actual: Some(NodeId(3))
            })
        );
        assert!(matches!(
            c.apply(&Action::Place {
                tunnel: TunnelId(10),
                node: NodeId(1)
            }),
            Err(ProvisionError::TunnelAlreadyPlaced { .. })
        ));
        assert_eq!(
            c.tunnels_on(NodeId(3)).collect::<Vec<_>>(),
            vec![TunnelId(10)]
        );
    }

    #[test]
    fn removing_a_node_leaves_its_tunnels_unplaced() {
        let mut c = cluster();
        assert_eq!(
            c.remove_node(NodeId(1)).unwrap(),
            vec![TunnelId(10), TunnelId(11)]
        );
        assert_eq!(c.tunnel(TunnelId(10)).unwrap().node, None);
        c.apply(&Action::Place {
            tunnel: TunnelId(10),
            node: NodeId(2),
        })
        .unwrap();
        assert_eq!(c.remove_tunnel(TunnelId(10)).unwrap(), Some(NodeId(2)));
        assert_eq!(c.tunnels_on(NodeId(2)).count(), 0);
        c.unassign(TunnelId(11)).unwrap();
        assert!(c.remove_node(NodeId(1)).is_err());
    }

    #[test]
    fn a_failing_plan_changes_nothing() {
        let mut c = cluster();
        let before = c.clone();
        let plan = Plan {
            decisions: vec![
                crate::plan::Decision {
                    action: Action::Deactivate { node: NodeId(2) },
                    reason: crate::plan::Reason::Empty,
                },
                crate::plan::Decision {
                    action: Action::Deactivate { node: NodeId(1) },
                    reason: crate::plan::Reason::Empty,
                },
            ],
            consolidation: None,
            reservation: crate::plan::Reservation {
                mean: 0.0,
                capacity: 0.0,
                capacity_nodes: 0.0,
                epsilon: 0.05,
                required: 0,
                reserved: 0,
                active: 0,
            },
            unplaced: Vec::new(),
            hotspots: Vec::new(),
        };
        assert!(c.apply_plan(&plan).is_err());
        assert_eq!(c, before);
    }
}
