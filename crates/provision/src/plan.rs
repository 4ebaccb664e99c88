//! What a [`crate::Planner`] decides in one step: a list of [`Decision`]s, each an
//! [`Action`] with the [`Reason`] for it, plus the reserve it computed. Every type prints in
//! words, for operators (`protego ctl capacity` shows the last decisions and why). `Display`
//! names nodes and tunnels by id (`node3`, `tunnel7`); [`Action::named`], [`Reason::named`] and
//! [`Decision::named`] print the same text with the names a [`Names`] gives them.

use core::fmt;
use std::time::Instant;

use crate::ids::{NodeId, TunnelId};
use crate::nodes::{NodePlan, NodeState};

/// How printed decisions name nodes and tunnels (see [`Decision::named`]). Both methods default
/// to the id (`node3`, `tunnel7`), so an implementation can fall back to them for ids it does
/// not know.
pub trait Names {
    /// Writes `node`'s name (default: `node<id>`).
    fn node(&self, node: NodeId, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{node}")
    }

    /// Writes `tunnel`'s name (default: `tunnel<id>`).
    fn tunnel(&self, tunnel: TunnelId, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{tunnel}")
    }
}

/// The ids as they are (`node3`, `tunnel7`): what `Display` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ById;

impl Names for ById {}

/// A node printed through a [`Names`].
struct NodeName<'a>(&'a dyn Names, NodeId);

impl fmt::Display for NodeName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.node(self.1, f)
    }
}

/// A tunnel printed through a [`Names`].
struct TunnelName<'a>(&'a dyn Names, TunnelId);

impl fmt::Display for TunnelName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.tunnel(self.1, f)
    }
}

/// A value printed with its nodes and tunnels named by a [`Names`]; what the `named` methods
/// return.
struct Named<'a, T> {
    value: &'a T,
    names: &'a dyn Names,
}

/// One change to the cluster. Apply it with [`crate::Cluster::apply`]; in a live cluster,
/// `Place` and `Migrate` are tunnel migrations by rekeying and the node actions go to the node
/// provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Put a tunnel that has no node on an active node.
    Place {
        /// The tunnel.
        tunnel: TunnelId,
        /// Its node.
        node: NodeId,
    },
    /// Move a tunnel from one node to another, active one.
    Migrate {
        /// The tunnel.
        tunnel: TunnelId,
        /// Where it is.
        from: NodeId,
        /// Where it goes.
        to: NodeId,
    },
    /// Put an inactive node in the pool (instant).
    Activate {
        /// The node.
        node: NodeId,
    },
    /// Hold an empty active node in reserve.
    Deactivate {
        /// The node.
        node: NodeId,
    },
    /// Boot a shut-down node, or a new one if the cluster does not list it; it is expected up
    /// (inactive) at `ready_at`.
    Start {
        /// The node.
        node: NodeId,
        /// When it is expected up: the step's time plus the start latency.
        ready_at: Instant,
    },
    /// Shut an inactive node down.
    Stop {
        /// The node.
        node: NodeId,
    },
}

impl Action {
    /// Prints the action with its nodes and tunnels named by `names` (`Display` is
    /// `self.named(&ById)`).
    pub fn named<'a>(&'a self, names: &'a dyn Names) -> impl fmt::Display + 'a {
        Named { value: self, names }
    }
}

impl fmt::Display for Named<'_, Action> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let node = |node| NodeName(self.names, node);
        let tunnel = |tunnel| TunnelName(self.names, tunnel);
        match *self.value {
            Action::Place { tunnel: t, node: n } => {
                write!(f, "place {} on {}", tunnel(t), node(n))
            }
            Action::Migrate {
                tunnel: t,
                from,
                to,
            } => {
                write!(f, "migrate {} {} -> {}", tunnel(t), node(from), node(to))
            }
            Action::Activate { node: n } => write!(f, "activate {}", node(n)),
            Action::Deactivate { node: n } => write!(f, "deactivate {}", node(n)),
            Action::Start { node: n, .. } => write!(f, "start {}", node(n)),
            Action::Stop { node: n } => write!(f, "stop {}", node(n)),
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.named(&ById).fmt(f)
    }
}

/// Why an action was taken. Loads (α, β, limits) are in the caller's unit (that of
/// [`crate::PlannerConfig::node_capacity`]); capacities C are in nodes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reason {
    /// The tunnel had no node; Best Fit chose this one.
    NewTunnel {
        /// The tunnel's size: its usage α, plus its spread when it has one ([`crate::Fill`]).
        alpha: f64,
    },
    /// The tunnel's node is not active (it was deactivated or stopped with tunnels on it);
    /// Best Fit chose a new one.
    NodeNotActive {
        /// The node it was on.
        node: NodeId,
        /// That node's state.
        state: NodeState,
        /// The tunnel's size: its usage α, plus its spread when it has one ([`crate::Fill`]).
        alpha: f64,
    },
    /// No node had room for the tunnel and no inactive node was left, so it went to the least
    /// loaded active node, above the limit: a tunnel must be served somewhere.
    Overflow {
        /// The tunnel's size: its usage α, plus its spread when it has one ([`crate::Fill`]).
        alpha: f64,
        /// The node's level with the tunnel (load plus shared spread).
        load: f64,
        /// The fill limit, `T_H · node capacity`.
        limit: f64,
    },
    /// The node it leaves is a hotspot (§5.4): β_j above the limit; this tunnel is one of the
    /// fewest largest whose sum exceeds `β_j − limit`, placed by Best Fit.
    Hotspot {
        /// The hotspot.
        node: NodeId,
        /// Its level when detected: β_j, plus its tunnels' shared spread.
        load: f64,
        /// The fill limit, `T_H · node capacity`.
        limit: f64,
        /// The tunnel's size: its usage α, plus its spread when it has one ([`crate::Fill`]).
        alpha: f64,
    },
    /// Periodic consolidation (§5.4): Best Fit Decreasing over all tunnels packs them into
    /// fewer nodes than are active.
    Consolidation {
        /// Active nodes before.
        active: usize,
        /// Nodes Best Fit Decreasing uses.
        nodes: usize,
    },
    /// No active node had room for a tunnel under the limit, so an inactive node joins.
    NothingFits {
        /// The tunnel that did not fit.
        tunnel: TunnelId,
        /// Its size: its usage α, plus its spread when it has one.
        alpha: f64,
        /// The fill limit, `T_H · node capacity`.
        limit: f64,
    },
    /// Drain (Protego's): every tunnel of this node fits on the other active nodes under the
    /// limit, so the node is emptied now rather than at the next consolidation.
    Drain {
        /// The node emptied.
        node: NodeId,
        /// Its level before: β_j, plus its tunnels' shared spread.
        load: f64,
        /// The fill limit, `T_H · node capacity`.
        limit: f64,
    },
    /// The active node holds no tunnel: it is held in reserve (it rejoins instantly).
    Empty,
    /// Fewer nodes are reserved (active + inactive + starting) than the model requires:
    /// `⌈C / T_H⌉` with `Pr(Y > C) <= ε` (§5.3), or the configured minimum.
    BelowReserve {
        /// C in nodes.
        capacity: f64,
        /// ε.
        epsilon: f64,
        /// T_H.
        threshold: f64,
        /// Nodes required.
        required: u32,
        /// Nodes reserved before this action.
        reserved: u32,
    },
    /// Tunnels could not be placed on any node now (no room, no inactive node left): nodes
    /// are started for them.
    Stranded {
        /// How many tunnels.
        tunnels: usize,
        /// How many nodes Best Fit Decreasing needs for them.
        nodes: usize,
    },
    /// Fewer nodes are reserved than the aggregate forecast asks for (adaptive sizing,
    /// [`crate::Forecaster::hint`]): the sum of the sizes plus its forecast rise within the
    /// start horizon, times the measured fragmentation, at the fill limit.
    AggregateForecast {
        /// The sum of the sizes now, in the caller's unit.
        level: f64,
        /// Its forecast rise within the horizon (the quantile
        /// [`crate::forecast::AGGREGATE_QUANTILE`]), same unit.
        rise: f64,
        /// The horizon, in steps of τ.
        horizon: u32,
        /// Active nodes per node's worth of sized load.
        fragmentation: f64,
        /// Nodes required.
        required: u32,
        /// Nodes reserved before this action.
        reserved: u32,
    },
    /// More nodes are reserved than the model requires plus the configured slack.
    AboveReserve {
        /// C in nodes.
        capacity: f64,
        /// ε.
        epsilon: f64,
        /// T_H.
        threshold: f64,
        /// Nodes required.
        required: u32,
        /// Nodes reserved before this action.
        reserved: u32,
        /// Extra nodes kept before stopping any.
        slack: u32,
    },
}

impl Reason {
    /// Prints the reason with its nodes and tunnels named by `names` (`Display` is
    /// `self.named(&ById)`).
    pub fn named<'a>(&'a self, names: &'a dyn Names) -> impl fmt::Display + 'a {
        Named { value: self, names }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.named(&ById).fmt(f)
    }
}

impl fmt::Display for Named<'_, Reason> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Reason as R;
        match *self.value {
            R::NewTunnel { alpha } => {
                write!(f, "new tunnel (α = {alpha:.4}), best fit")
            }
            R::NodeNotActive { node, state, alpha } => write!(
                f,
                "its node {} is {state}, not active (α = {alpha:.4}), best fit",
                NodeName(self.names, node)
            ),
            R::Overflow { alpha, load, limit } => write!(
                f,
                "no node has room for α = {alpha:.4} and no inactive node is left: least loaded \
                 active node, now at {load:.4} > limit {limit:.4}"
            ),
            R::Hotspot {
                node,
                load,
                limit,
                alpha,
            } => write!(
                f,
                "{} is a hotspot (β = {load:.4} > limit {limit:.4}); α = {alpha:.4} is among the \
                 fewest largest tunnels whose sum exceeds β − limit = {:.4}, best fit",
                NodeName(self.names, node),
                load - limit
            ),
            R::Consolidation { active, nodes } => write!(
                f,
                "consolidation: best fit decreasing packs all tunnels into {nodes} node(s), \
                 {active} active"
            ),
            R::NothingFits {
                tunnel,
                alpha,
                limit,
            } => write!(
                f,
                "no active node has room for {} (α = {alpha:.4}) under limit {limit:.4}",
                TunnelName(self.names, tunnel)
            ),
            R::Drain { node, load, limit } => write!(
                f,
                "drain: every tunnel of {} (β = {load:.4}) fits on the other active nodes under \
                 limit {limit:.4}, so it is given back now",
                NodeName(self.names, node)
            ),
            R::Empty => f.write_str("empty: held in reserve, rejoins instantly"),
            R::BelowReserve {
                capacity,
                epsilon,
                threshold,
                required,
                reserved,
            } => write!(
                f,
                "reserve too small: C = {capacity:.3} nodes (Pr(Y > C) <= ε = {epsilon}), \
                 T_H = {threshold}: {required} node(s) required, {reserved} reserved (active + \
                 inactive + starting)"
            ),
            R::Stranded { tunnels, nodes } => write!(
                f,
                "{tunnels} tunnel(s) found no room and no inactive node: {nodes} more node(s) \
                 needed now"
            ),
            R::AggregateForecast {
                level,
                rise,
                horizon,
                fragmentation,
                required,
                reserved,
            } => write!(
                f,
                "aggregate forecast: sized load {level:.3} may rise by {rise:.3} within \
                 {horizon} step(s), fragmentation {fragmentation:.3}: {required} node(s) \
                 required, {reserved} reserved (active + inactive + starting)"
            ),
            R::AboveReserve {
                capacity,
                epsilon,
                threshold,
                required,
                reserved,
                slack,
            } => write!(
                f,
                "reserve too large: C = {capacity:.3} nodes (Pr(Y > C) <= ε = {epsilon}), \
                 T_H = {threshold}: {required} node(s) required, {reserved} reserved, slack \
                 {slack}"
            ),
        }
    }
}

/// An action and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// What to do.
    pub action: Action,
    /// Why.
    pub reason: Reason,
}

impl Decision {
    /// Prints the decision with its nodes and tunnels named by `names`, e.g. "migrate acme-hq
    /// data2 -> data1: data2 is a hotspot ..." (`Display` is `self.named(&ById)`).
    pub fn named<'a>(&'a self, names: &'a dyn Names) -> impl fmt::Display + 'a {
        Named { value: self, names }
    }
}

impl fmt::Display for Named<'_, Decision> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}",
            self.value.action.named(self.names),
            self.value.reason.named(self.names)
        )
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.named(&ById).fmt(f)
    }
}

/// What a consolidation step found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsolidationOutcome {
    /// Active nodes before.
    pub active_before: usize,
    /// Nodes Best Fit Decreasing uses for all placed tunnels.
    pub bfd_nodes: usize,
    /// Whether its placement was adopted (see [`crate::ConsolidationMode`]).
    pub applied: bool,
}

/// The reserve the model asks for (§5.3), and what the cluster has after the plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reservation {
    /// `E[Y]`, in the caller's unit.
    pub mean: f64,
    /// C, the least capacity with `Pr(Y > C) <= ε`, in the caller's unit.
    pub capacity: f64,
    /// C in nodes.
    pub capacity_nodes: f64,
    /// ε.
    pub epsilon: f64,
    /// Nodes required: `⌈C / T_H⌉`, at least the configured minimum and at least what the
    /// placement needs now.
    pub required: u32,
    /// Nodes reserved after the plan: active, inactive and starting.
    pub reserved: u32,
    /// Active nodes after the plan.
    pub active: u32,
}

impl fmt::Display for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "E[Y] = {:.3}, C = {:.3} ({:.3} nodes, ε = {}), {} node(s) required, {} reserved, {} \
             active",
            self.mean,
            self.capacity,
            self.capacity_nodes,
            self.epsilon,
            self.required,
            self.reserved,
            self.active
        )
    }
}

/// The outcome of one planning step.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The actions in the order to apply them, each with its reason.
    pub decisions: Vec<Decision>,
    /// Some when consolidation was due this step (the caller then records the step's time as
    /// the last consolidation, whether or not it was applied).
    pub consolidation: Option<ConsolidationOutcome>,
    /// The reserve.
    pub reservation: Reservation,
    /// Tunnels that are on no active node after the plan (no room anywhere and no inactive
    /// node: they wait for started nodes).
    pub unplaced: Vec<TunnelId>,
    /// Active nodes still above the limit after the plan (a single tunnel above the limit, or
    /// no room elsewhere).
    pub hotspots: Vec<NodeId>,
}

impl Plan {
    /// Whether the plan changes nothing.
    pub fn is_empty(&self) -> bool {
        self.decisions.is_empty()
    }

    /// The tunnel moves: (tunnel, from, to), `from` being `None` for a placement.
    pub fn moves(&self) -> impl Iterator<Item = (TunnelId, Option<NodeId>, NodeId)> + '_ {
        self.decisions.iter().filter_map(|d| match d.action {
            Action::Place { tunnel, node } => Some((tunnel, None, node)),
            Action::Migrate { tunnel, from, to } => Some((tunnel, Some(from), to)),
            _ => None,
        })
    }

    /// The node changes, by kind.
    pub fn node_plan(&self) -> NodePlan {
        let mut plan = NodePlan::default();
        for decision in &self.decisions {
            match decision.action {
                Action::Activate { node } => plan.activate.push(node),
                Action::Deactivate { node } => plan.deactivate.push(node),
                Action::Start { node, ready_at } => plan.start.push((node, ready_at)),
                Action::Stop { node } => plan.stop.push(node),
                Action::Place { .. } | Action::Migrate { .. } => {}
            }
        }
        plan
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reserve: {}", self.reservation)?;
        if let Some(c) = &self.consolidation {
            write!(
                f,
                "\nconsolidation: best fit decreasing needs {} node(s), {} active: {}",
                c.bfd_nodes,
                c.active_before,
                if c.applied {
                    "applied"
                } else {
                    "kept placement"
                }
            )?;
        }
        for decision in &self.decisions {
            write!(f, "\n{decision}")?;
        }
        if !self.unplaced.is_empty() {
            write!(f, "\nunplaced: {:?}", self.unplaced)?;
        }
        if !self.hotspots.is_empty() {
            write!(f, "\nhotspots left: {:?}", self.hotspots)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Operator names for some ids; the others print as ids through the default methods.
    #[derive(Default)]
    struct Map {
        nodes: HashMap<NodeId, &'static str>,
        tunnels: HashMap<TunnelId, &'static str>,
    }

    impl Names for Map {
        fn node(&self, node: NodeId, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self.nodes.get(&node) {
                Some(name) => f.write_str(name),
                None => ById.node(node, f),
            }
        }

        fn tunnel(&self, tunnel: TunnelId, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self.tunnels.get(&tunnel) {
                Some(name) => f.write_str(name),
                None => ById.tunnel(tunnel, f),
            }
        }
    }

    fn names() -> Map {
        Map {
            nodes: HashMap::from([(NodeId(1), "data1"), (NodeId(2), "data2")]),
            tunnels: HashMap::from([(TunnelId(7), "acme-hq")]),
        }
    }

    /// Every action and every reason that names a node or a tunnel, with what `Display` and
    /// `named(&names())` print.
    fn actions() -> Vec<(Action, &'static str, &'static str)> {
        let ready_at = Instant::now();
        vec![
            (
                Action::Place {
                    tunnel: TunnelId(7),
                    node: NodeId(1),
                },
                "place tunnel7 on node1",
                "place acme-hq on data1",
            ),
            (
                Action::Migrate {
                    tunnel: TunnelId(7),
                    from: NodeId(2),
                    to: NodeId(1),
                },
                "migrate tunnel7 node2 -> node1",
                "migrate acme-hq data2 -> data1",
            ),
            (
                Action::Activate { node: NodeId(2) },
                "activate node2",
                "activate data2",
            ),
            (
                Action::Deactivate { node: NodeId(1) },
                "deactivate node1",
                "deactivate data1",
            ),
            (
                Action::Start {
                    node: NodeId(2),
                    ready_at,
                },
                "start node2",
                "start data2",
            ),
            (Action::Stop { node: NodeId(1) }, "stop node1", "stop data1"),
            // Unknown ids fall back to the id.
            (
                Action::Migrate {
                    tunnel: TunnelId(8),
                    from: NodeId(2),
                    to: NodeId(9),
                },
                "migrate tunnel8 node2 -> node9",
                "migrate tunnel8 data2 -> node9",
            ),
        ]
    }

    fn reasons() -> Vec<(Reason, &'static str, &'static str)> {
        vec![
            (
                Reason::NodeNotActive {
                    node: NodeId(2),
                    state: NodeState::ShutDown,
                    alpha: 0.25,
                },
                "its node node2 is shut down, not active (α = 0.2500), best fit",
                "its node data2 is shut down, not active (α = 0.2500), best fit",
            ),
            (
                Reason::Hotspot {
                    node: NodeId(2),
                    load: 1.0,
                    limit: 0.9,
                    alpha: 0.3,
                },
                "node2 is a hotspot (β = 1.0000 > limit 0.9000); α = 0.3000 is among the fewest \
                 largest tunnels whose sum exceeds β − limit = 0.1000, best fit",
                "data2 is a hotspot (β = 1.0000 > limit 0.9000); α = 0.3000 is among the fewest \
                 largest tunnels whose sum exceeds β − limit = 0.1000, best fit",
            ),
            (
                Reason::NothingFits {
                    tunnel: TunnelId(7),
                    alpha: 0.5,
                    limit: 0.9,
                },
                "no active node has room for tunnel7 (α = 0.5000) under limit 0.9000",
                "no active node has room for acme-hq (α = 0.5000) under limit 0.9000",
            ),
            // Unknown ids fall back to the id.
            (
                Reason::NodeNotActive {
                    node: NodeId(5),
                    state: NodeState::Inactive,
                    alpha: 0.1,
                },
                "its node node5 is inactive, not active (α = 0.1000), best fit",
                "its node node5 is inactive, not active (α = 0.1000), best fit",
            ),
            (
                Reason::NothingFits {
                    tunnel: TunnelId(3),
                    alpha: 0.5,
                    limit: 0.9,
                },
                "no active node has room for tunnel3 (α = 0.5000) under limit 0.9000",
                "no active node has room for tunnel3 (α = 0.5000) under limit 0.9000",
            ),
            // No ids at all: the same either way.
            (
                Reason::NewTunnel { alpha: 0.2 },
                "new tunnel (α = 0.2000), best fit",
                "new tunnel (α = 0.2000), best fit",
            ),
            (
                Reason::Empty,
                "empty: held in reserve, rejoins instantly",
                "empty: held in reserve, rejoins instantly",
            ),
        ]
    }

    #[test]
    fn actions_print_names() {
        let names = names();
        for (action, by_id, named) in actions() {
            assert_eq!(action.to_string(), by_id);
            assert_eq!(action.named(&ById).to_string(), by_id);
            assert_eq!(action.named(&names).to_string(), named);
        }
    }

    #[test]
    fn reasons_print_names() {
        let names = names();
        for (reason, by_id, named) in reasons() {
            assert_eq!(reason.to_string(), by_id);
            assert_eq!(reason.named(&ById).to_string(), by_id);
            assert_eq!(reason.named(&names).to_string(), named);
        }
    }

    #[test]
    fn decisions_print_names() {
        let names = names();
        for (action, action_by_id, action_named) in actions() {
            for (reason, reason_by_id, reason_named) in reasons() {
                let decision = Decision { action, reason };
                let by_id = format!("{action_by_id}: {reason_by_id}");
                assert_eq!(decision.to_string(), by_id);
                assert_eq!(decision.named(&ById).to_string(), by_id);
                assert_eq!(
                    decision.named(&names).to_string(),
                    format!("{action_named}: {reason_named}")
                );
            }
        }
        let decision = Decision {
            action: Action::Migrate {
                tunnel: TunnelId(7),
                from: NodeId(2),
                to: NodeId(1),
            },
            reason: Reason::Hotspot {
                node: NodeId(2),
                load: 1.0,
                limit: 0.9,
                alpha: 0.3,
            },
        };
        assert!(decision
            .named(&names)
            .to_string()
            .starts_with("migrate acme-hq data2 -> data1: data2 is a hotspot (β = 1.0000"));
    }
}
