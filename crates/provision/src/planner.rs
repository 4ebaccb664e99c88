//! One step of elastic provisioning (§5): from the current usage, placement and node states,
//! decide the tunnel moves and node changes, each with its reason.
//!
//! [`Planner::plan`] is a pure function of its inputs (a [`Cluster`], a [`UsageBook`], the
//! time and the time of the last consolidation) and the [`PlannerConfig`]. A step runs:
//!
//! 1. **Tunnels without an active node** (new ones, or on a node that stopped being active),
//!    largest first, are placed by Best Fit under the limit `T_H · node capacity`; if nothing
//!    fits, an inactive node is activated; if none is left, the least loaded active node takes
//!    the tunnel above the limit (a tunnel must be served); with no active node at all it
//!    waits for a started node.
//! 2. If consolidation is due (`now − last ≥ consolidation_interval`, or never done):
//!    **consolidation** by Best Fit Decreasing over all placed tunnels. Its bins are matched
//!    to the current nodes so that as many tunnels as possible stay where they are (greedily,
//!    by the number of shared tunnels); tunnels whose node changes are migrated.
//! 3. **Hotspot relief** (§5.4) for every active node with β_j above the limit, highest
//!    first: its fewest largest tunnels whose sum exceeds `β_j − limit` move, each by Best Fit
//!    to another active node (kept within the limit), activating an inactive node when
//!    nothing fits. (After an adopted consolidation there is nothing to relieve; when a due
//!    consolidation keeps the placement, relief still runs.)
//! 4. **Empty active nodes are deactivated** (held in reserve; they rejoin instantly). The
//!    paper does this after consolidation; doing it every step costs nothing, since
//!    activation is instant.
//! 5. **Reserve** (§5.3): Y from every tunnel's histogram (a tunnel without one counts at the
//!    default σ), C with `Pr(Y > C) <= ε`, and `⌈C / T_H⌉` nodes (at least
//!    `min_reserved_nodes`, and at least the active nodes plus what stranded tunnels need)
//!    reserved as active + inactive + starting. Missing nodes are started (listed shut-down
//!    nodes first, lowest number first, then new numbers); a surplus above
//!    `stop_slack` stops inactive nodes, highest number first. With a forecast
//!    ([`Planner::plan_with`], [`crate::Forecaster::hint`]) at least the nodes it asks for.
//! 6. With [`PlannerConfig::drain`] (Protego's, off by default), **drain**: from the least
//!    loaded active node up, a node whose tunnels all fit on the other active nodes under the
//!    limit is emptied by migration and deactivated. It runs after the reserve, so a node
//!    drained now stays in reserve until the next step.
//!
//! A **settling** tunnel ([`crate::TunnelState::settling`]: new, not measured yet) is placed
//! in step 1 but then left where it is by consolidation (its node is a bin already filled with
//! the settling load, which counts among the packing's nodes), hotspot relief and drain.
//!
//! A simulator calls it once per interval and applies the plan with [`Cluster::apply_plan`]
//! (and [`Cluster::advance`] for nodes that finished starting); a live autoscaler calls it
//! every τ on a cluster built from its reports and carries the actions out. Seed a new
//! cluster with inactive nodes, or the first tunnels wait for nodes to start.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::aggregate::{aggregate, reserve_nodes};
use crate::cluster::Cluster;
use crate::error::ProvisionError;
use crate::forecast::ReserveHint;
use crate::ids::{NodeId, TunnelId};
use crate::nodes::NodeState;
use crate::placement::{
    best_fit, best_fit_decreasing, best_fit_decreasing_onto, hotspot_selection, sort_decreasing,
    Fill, Size,
};
use crate::plan::{Action, ConsolidationOutcome, Decision, Plan, Reason, Reservation};
use crate::usage::{UsageBook, UsageConfig, UsageHistogram};

/// When a due consolidation adopts the Best Fit Decreasing placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConsolidationMode {
    /// Always, as the paper does (it may move tunnels without saving a node).
    Always,
    /// Only when it uses fewer nodes than are active, or when some active node is above the
    /// limit (Best Fit Decreasing then relieves it with the fewest nodes): no migrations that
    /// save nothing.
    #[default]
    WhenFewerNodes,
}

/// The model's parameters (the paper's Table 1 and §7.4).
#[derive(Debug, Clone, PartialEq)]
pub struct PlannerConfig {
    /// The capacity of one data node, in the unit of every load given to and returned by the
    /// planner (α, σ, β, C): 1.0 for the paper's normalized units, or e.g. 5.0 to work in
    /// Gbit/s with the paper's 5 Gbit/s nodes.
    pub node_capacity: f64,
    /// σ for tunnels the usage book has no histogram for (in the unit above).
    pub default_sigma: f64,
    /// T_H: the hotspot threshold and fill limit, as a fraction of a node, in `(0, 1]`.
    pub hotspot_threshold: f64,
    /// ε: the tolerated probability that Y exceeds the reserve, in `[0, 1)`. (The paper's
    /// §7.4 writes "ε = 0.95" for the 95th percentile; here that is ε = 0.05.)
    pub epsilon: f64,
    /// τ: how often usage is measured and the planner runs (the caller's cadence; above zero).
    pub tau: Duration,
    /// How often tunnels are consolidated.
    pub consolidation_interval: Duration,
    /// Samples a usage histogram keeps (its window covers `window · τ`).
    pub window: usize,
    /// Bins of a usage histogram.
    pub bins: usize,
    /// How long a shut-down node takes to become inactive after a start.
    pub start_latency: Duration,
    /// The fewest nodes kept reserved, whatever the model says.
    pub min_reserved_nodes: u32,
    /// Extra reserved nodes tolerated before any is stopped (hysteresis against starting and
    /// stopping nodes in turn, since a start takes minutes).
    pub stop_slack: u32,
    /// When a due consolidation adopts its placement.
    pub consolidation: ConsolidationMode,
    /// Drain (Protego's, not the paper's): after hotspot relief, empty the least loaded
    /// active nodes whose tunnels all fit on the other active nodes under the limit, without
    /// waiting for the next consolidation (migrations lose nothing).
    pub drain: bool,
    /// G*: the guarantee adaptive sizing aims for ([`crate::Sizing::Adaptive`],
    /// [`crate::forecast`]), in `(0, 1)`: its calibrator aims at
    /// [`crate::forecast::SATURATED_PER_VIOLATION`]` · (1 − G*)` error steps (a node saturated
    /// or a tunnel stranded), at most half of them, so every G* up to 0.75 behaves the same
    /// (the live configuration takes `[0.75, 1)`). The default, 0.97, is
    /// the paper's 96.84 % guarantee (its Table 2 at 10-minute consolidation) rounded up to the
    /// next whole percent; it was not tuned.
    pub guarantee_target: f64,
}

impl Default for PlannerConfig {
    /// The paper's §7.4 parameters in normalized units: σ = 0.3, T_H = 0.9, τ = 1 minute,
    /// 10-minute consolidation; ε = 0.05, 100 bins, a one-day window, 3-minute starts, one
    /// node at least.
    fn default() -> Self {
        Self {
            node_capacity: 1.0,
            default_sigma: 0.3,
            hotspot_threshold: 0.9,
            epsilon: 0.05,
            tau: Duration::from_secs(60),
            consolidation_interval: Duration::from_secs(600),
            window: crate::usage::DEFAULT_WINDOW,
            bins: crate::usage::DEFAULT_BINS,
            start_latency: Duration::from_secs(180),
            min_reserved_nodes: 1,
            stop_slack: 0,
            consolidation: ConsolidationMode::default(),
            drain: false,
            guarantee_target: 0.97,
        }
    }
}

impl PlannerConfig {
    /// Checks every field, naming the first that is out of range.
    pub fn validate(&self) -> Result<(), ProvisionError> {
        let invalid = |field, value: String, reason| ProvisionError::InvalidConfig {
            field,
            value,
            reason,
        };
        if !(self.node_capacity.is_finite() && self.node_capacity > 0.0) {
            return Err(invalid(
                "node_capacity",
                self.node_capacity.to_string(),
                "must be finite and above zero",
            ));
        }
        if !(self.hotspot_threshold > 0.0 && self.hotspot_threshold <= 1.0) {
            return Err(invalid(
                "hotspot_threshold",
                self.hotspot_threshold.to_string(),
                "must be in (0, 1]",
            ));
        }
        if !(0.0..1.0).contains(&self.epsilon) {
            return Err(invalid(
                "epsilon",
                self.epsilon.to_string(),
                "must be in [0, 1)",
            ));
        }
        if !(self.guarantee_target > 0.0 && self.guarantee_target < 1.0) {
            return Err(invalid(
                "guarantee_target",
                self.guarantee_target.to_string(),
                "must be in (0, 1)",
            ));
        }
        if self.tau.is_zero() {
            return Err(invalid(
                "tau",
                format!("{:?}", self.tau),
                "must be above zero",
            ));
        }
        self.usage_config().validate()
    }

    /// The shape of the usage histograms: `bins`, `window`, `default_sigma`.
    pub fn usage_config(&self) -> UsageConfig {
        UsageConfig {
            bins: self.bins,
            window: self.window,
            default_sigma: self.default_sigma,
        }
    }

    /// The fill limit of a node, `T_H · node capacity`, in the caller's unit.
    pub fn limit(&self) -> f64 {
        self.hotspot_threshold * self.node_capacity
    }
}

/// The provisioning planner (see the module docs).
#[derive(Debug, Clone)]
pub struct Planner {
    config: PlannerConfig,
}

impl Planner {
    /// A planner; rejects an invalid configuration.
    pub fn new(config: PlannerConfig) -> Result<Self, ProvisionError> {
        config.validate()?;
        Ok(Self { config })
    }

    /// Its configuration.
    pub fn config(&self) -> &PlannerConfig {
        &self.config
    }

    /// Whether consolidation is due at `now` after one at `last` (always, if none yet).
    pub fn consolidation_due(&self, now: Instant, last: Option<Instant>) -> bool {
        last.is_none_or(|last| {
            now.saturating_duration_since(last) >= self.config.consolidation_interval
        })
    }

    /// The reserve the model asks for now, from every tunnel of `cluster` (usage from `usage`,
    /// the default σ prior for tunnels it lacks). `reserved` and `active` are the cluster's.
    pub fn reservation(
        &self,
        cluster: &Cluster,
        usage: &UsageBook,
    ) -> Result<Reservation, ProvisionError> {
        let prior = UsageHistogram::new(self.config.default_sigma, self.config.bins, 1)?;
        let histograms: Vec<&UsageHistogram> = cluster
            .tunnels()
            .map(|(id, _)| usage.get(id).unwrap_or(&prior))
            .collect();
        let y = aggregate(histograms.iter().copied())?;
        let capacity = y.capacity(self.config.epsilon)?;
        let capacity_nodes = capacity / self.config.node_capacity;
        let required = reserve_nodes(capacity_nodes, self.config.hotspot_threshold)?
            .max(self.config.min_reserved_nodes);
        let counts = cluster.counts();
        Ok(Reservation {
            mean: y.mean(),
            capacity,
            capacity_nodes,
            epsilon: self.config.epsilon,
            required,
            reserved: to_u32(counts.reserve_with_starting()),
            active: to_u32(counts.active),
        })
    }

    /// Plans one step at `now` (see the module docs). `last_consolidation` is when the last
    /// consolidation was due (`None`: never); when the plan's `consolidation` is `Some`, the
    /// caller records `now` as the new one.
    pub fn plan(
        &self,
        cluster: &Cluster,
        usage: &UsageBook,
        now: Instant,
        last_consolidation: Option<Instant>,
    ) -> Result<Plan, ProvisionError> {
        self.plan_with(cluster, usage, now, last_consolidation, None)
    }

    /// [`Planner::plan`] with a forecast of the nodes needed within the start latency
    /// ([`crate::Forecaster::hint`]): the reserve keeps at least `hint.nodes`.
    pub fn plan_with(
        &self,
        cluster: &Cluster,
        usage: &UsageBook,
        now: Instant,
        last_consolidation: Option<Instant>,
        hint: Option<&ReserveHint>,
    ) -> Result<Plan, ProvisionError> {
        let mut work = Work::new(cluster.clone(), self.config.limit());
        let mut stranded: Vec<(TunnelId, Fill)> = Vec::new();

        self.place_orphans(&mut work, &mut stranded)?;
        let consolidation = if self.consolidation_due(now, last_consolidation) {
            Some(self.consolidate(&mut work)?)
        } else {
            None
        };
        // After an adopted consolidation only a tunnel above the limit by itself can leave a
        // hotspot, and relief leaves that alone; after a kept placement relief is needed.
        self.relieve_hotspots(&mut work, &mut stranded)?;
        let empty: Vec<NodeId> = work
            .loads
            .keys()
            .copied()
            .filter(|&node| work.cluster.tunnels_on(node).next().is_none())
            .collect();
        for node in empty {
            work.act(Action::Deactivate { node }, Reason::Empty)?;
        }
        let mut reservation = self.reserve(&mut work, usage, now, &stranded, hint)?;
        // After the reserve: a node drained now is held in reserve until the next step (a
        // stop in the same step would leave no inactive node for the next peak).
        // Even while tunnels wait for room: a drained node is inactive, and the next step
        // activates it for them (skipping the drain then costs 0.05 points of saving on the
        // paper preset for a one-step delay in that rare case).
        if self.config.drain {
            self.drain(&mut work)?;
        }

        let counts = work.cluster.counts();
        reservation.reserved = to_u32(counts.reserve_with_starting());
        reservation.active = to_u32(counts.active);
        let unplaced = work
            .cluster
            .tunnels()
            .filter(|(_, t)| {
                t.node
                    .and_then(|n| work.cluster.node_state(n))
                    .is_none_or(|s| !s.is_active())
            })
            .map(|(id, _)| id)
            .collect();
        let hotspots = work
            .cluster
            .hotspots(work.limit)
            .into_iter()
            .map(|(node, _)| node)
            .collect();
        Ok(Plan {
            decisions: work.decisions,
            consolidation,
            reservation,
            unplaced,
            hotspots,
        })
    }

    /// Step 1: tunnels on no active node.
    fn place_orphans(
        &self,
        work: &mut Work,
        stranded: &mut Vec<(TunnelId, Fill)>,
    ) -> Result<(), ProvisionError> {
        let mut orphans: Vec<(TunnelId, Fill)> = work
            .cluster
            .tunnels()
            .filter(|(_, t)| t.node.is_none_or(|n| !work.loads.contains_key(&n)))
            .map(|(id, t)| (id, t.fill()))
            .collect();
        sort_decreasing(&mut orphans);
        for (tunnel, fill) in orphans {
            let alpha = fill.level();
            let from = work.cluster.tunnel(tunnel).and_then(|t| t.node);
            let reason = match from.and_then(|n| work.cluster.node_state(n).map(|s| (n, s))) {
                Some((node, state)) => Reason::NodeNotActive { node, state, alpha },
                None => Reason::NewTunnel { alpha },
            };
            let (target, reason) = match work.fit_or_activate(tunnel, fill, None)? {
                Some(node) => (node, reason),
                None => match work.least_loaded() {
                    Some((node, load)) => (
                        node,
                        Reason::Overflow {
                            alpha,
                            load: (load + fill).level(),
                            limit: work.limit,
                        },
                    ),
                    None => {
                        stranded.push((tunnel, fill));
                        continue;
                    }
                },
            };
            let action = match from {
                Some(from) => Action::Migrate {
                    tunnel,
                    from,
                    to: target,
                },
                None => Action::Place {
                    tunnel,
                    node: target,
                },
            };
            work.act(action, reason)?;
        }
        Ok(())
    }

    /// Step 2: Best Fit Decreasing over all placed tunnels but the settling ones, which stay
    /// where they are: each node holding settling tunnels is a bin already filled with their
    /// load, kept on that node, which the packing may fill up to the limit.
    fn consolidate(&self, work: &mut Work) -> Result<ConsolidationOutcome, ProvisionError> {
        let active_before = work.loads.len();
        let mut items: Vec<(TunnelId, Fill)> = Vec::new();
        let mut settled: BTreeMap<NodeId, Fill> = BTreeMap::new();
        for (id, t) in work.cluster.tunnels() {
            let Some(node) = t.node.filter(|n| work.loads.contains_key(n)) else {
                continue;
            };
            if t.settling {
                *settled.entry(node).or_default() += t.fill();
            } else {
                items.push((id, t.fill()));
            }
        }
        let filled: Vec<Fill> = settled.values().copied().collect();
        let bins = best_fit_decreasing_onto(&items, &filled, work.limit);
        let mut outcome = ConsolidationOutcome {
            active_before,
            bfd_nodes: bins.len(),
            applied: false,
        };
        let adopt = match self.config.consolidation {
            ConsolidationMode::Always => true,
            ConsolidationMode::WhenFewerNodes => {
                bins.len() < active_before || !work.cluster_hotspots().is_empty()
            }
        };
        if !adopt {
            return Ok(outcome);
        }

        // Match bins to nodes, most shared tunnels first, so that the fewest tunnels move.
        let mut shared: BTreeMap<(usize, NodeId), (usize, f64)> = BTreeMap::new();
        for (bin, tunnels) in bins.iter().enumerate() {
            for &tunnel in tunnels {
                if let Some(t) = work.cluster.tunnel(tunnel) {
                    if let Some(node) = t.node {
                        let entry = shared.entry((bin, node)).or_insert((0, 0.0));
                        entry.0 += 1;
                        entry.1 += t.alpha;
                    }
                }
            }
        }
        let mut pairs: Vec<((usize, NodeId), (usize, f64))> = shared.into_iter().collect();
        pairs.sort_by(|a, b| {
            b.1 .0
                .cmp(&a.1 .0)
                .then(b.1 .1.total_cmp(&a.1 .1))
                .then(a.0.cmp(&b.0))
        });
        // The filled bins stay on their nodes.
        let mut bin_node: Vec<Option<NodeId>> = settled.keys().copied().map(Some).collect();
        bin_node.resize(bins.len(), None);
        let mut used: BTreeSet<NodeId> = settled.keys().copied().collect();
        for ((bin, node), _) in pairs {
            if bin_node[bin].is_none() && !used.contains(&node) {
                bin_node[bin] = Some(node);
                used.insert(node);
            }
        }
        let free_active: Vec<NodeId> = work
            .loads
            .keys()
            .copied()
            .filter(|n| !used.contains(n))
            .collect();
        let free_inactive: Vec<NodeId> = work
            .cluster
            .nodes()
            .filter(|(_, s)| *s == NodeState::Inactive)
            .map(|(n, _)| n)
            .collect();
        let mut free_active = free_active.into_iter();
        let mut free_inactive = free_inactive.into_iter();
        let mut activate = Vec::new();
        for slot in bin_node.iter_mut().filter(|s| s.is_none()) {
            if let Some(node) = free_active.next() {
                *slot = Some(node);
            } else if let Some(node) = free_inactive.next() {
                *slot = Some(node);
                activate.push(node);
            } else {
                // Not enough nodes for this packing (only possible in `Always` mode): keep
                // the current placement.
                return Ok(outcome);
            }
        }
        outcome.applied = true;
        let reason = Reason::Consolidation {
            active: active_before,
            nodes: bins.len(),
        };
        for node in activate {
            work.act(Action::Activate { node }, reason)?;
        }
        for (tunnels, node) in bins.iter().zip(bin_node) {
            let Some(to) = node else { continue };
            for &tunnel in tunnels {
                let from = work.cluster.tunnel(tunnel).and_then(|t| t.node);
                if let Some(from) = from.filter(|&f| f != to) {
                    work.act(Action::Migrate { tunnel, from, to }, reason)?;
                }
            }
        }
        Ok(outcome)
    }

    /// Step 3: hotspot relief (§5.4).
    fn relieve_hotspots(
        &self,
        work: &mut Work,
        stranded: &mut Vec<(TunnelId, Fill)>,
    ) -> Result<(), ProvisionError> {
        for (node, fill) in work.cluster_hotspots() {
            let load = fill.level();
            // Settling tunnels stay: the others are chosen to relieve the node.
            let tunnels: Vec<(TunnelId, Fill)> = work
                .cluster
                .tunnels_on(node)
                .filter_map(|t| {
                    work.cluster
                        .tunnel(t)
                        .filter(|s| !s.settling)
                        .map(|s| (t, s.fill()))
                })
                .collect();
            for tunnel in hotspot_selection(&tunnels, fill, work.limit) {
                let size = work
                    .cluster
                    .tunnel(tunnel)
                    .map_or(Fill::default(), |t| t.fill());
                let alpha = size.level();
                match work.fit_or_activate(tunnel, size, Some(node))? {
                    Some(to) => work.act(
                        Action::Migrate {
                            tunnel,
                            from: node,
                            to,
                        },
                        Reason::Hotspot {
                            node,
                            load,
                            limit: work.limit,
                            alpha,
                        },
                    )?,
                    None => stranded.push((tunnel, size)),
                }
            }
        }
        Ok(())
    }

    /// Step 6 (with [`PlannerConfig::drain`]): from the least loaded active node up, empty
    /// each whose tunnels (largest first) all fit by Best Fit on the other active nodes under
    /// the limit, and deactivate it. No node is filled above the limit, so no hotspot is made.
    /// A node holding a settling tunnel is not emptied.
    fn drain(&self, work: &mut Work) -> Result<(), ProvisionError> {
        let mut loads = work.loads.clone();
        // Nodes that can be stopped first (pinned ones only after), least loaded first.
        let mut order: Vec<(bool, f64, NodeId)> = loads
            .iter()
            .map(|(&n, &l)| (work.cluster.is_pinned(n), l.level(), n))
            .collect();
        order.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
        // A node that took tunnels earlier in the pass may still be emptied: a tunnel may then
        // move twice in one plan, and a caller carries out only where it ends (the simulator
        // counts one migration, the live cluster one rekey).
        for (_, _, node) in order {
            let load = loads.get(&node).map_or(0.0, |l| l.level());
            let mut tunnels: Vec<(TunnelId, Fill)> = work
                .cluster
                .tunnels_on(node)
                .filter_map(|t| work.cluster.tunnel(t).map(|s| (t, s.fill())))
                .collect();
            let settling = work
                .cluster
                .tunnels_on(node)
                .any(|t| work.cluster.tunnel(t).is_some_and(|s| s.settling));
            if tunnels.is_empty() || settling {
                continue;
            }
            sort_decreasing(&mut tunnels);
            let mut trial = loads.clone();
            trial.remove(&node);
            let mut moves = Vec::with_capacity(tunnels.len());
            for &(tunnel, alpha) in &tunnels {
                let Some(to) = best_fit(trial.iter().map(|(&n, &l)| (n, l)), alpha, work.limit)
                else {
                    break;
                };
                if let Some(l) = trial.get_mut(&to) {
                    *l += alpha;
                }
                moves.push((tunnel, to));
            }
            if moves.len() < tunnels.len() || trial.is_empty() {
                continue;
            }
            for (tunnel, to) in moves {
                work.act(
                    Action::Migrate {
                        tunnel,
                        from: node,
                        to,
                    },
                    Reason::Drain {
                        node,
                        load,
                        limit: work.limit,
                    },
                )?;
            }
            work.act(Action::Deactivate { node }, Reason::Empty)?;
            loads = trial;
        }
        Ok(())
    }

    /// Step 5: start or stop nodes to match the reserve.
    fn reserve(
        &self,
        work: &mut Work,
        usage: &UsageBook,
        now: Instant,
        stranded: &[(TunnelId, Fill)],
        hint: Option<&ReserveHint>,
    ) -> Result<Reservation, ProvisionError> {
        let reservation = self.reservation(&work.cluster, usage)?;
        let counts = work.cluster.counts();
        let stranded_nodes = best_fit_decreasing(stranded, work.limit).len();
        let placement_need = to_u32(counts.active.saturating_add(stranded_nodes));
        let today = reservation.required.max(placement_need);
        let forecast = hint.map_or(0, |h| h.nodes);
        let required = today.max(forecast);
        let reserved = to_u32(counts.reserve_with_starting());
        let result = Reservation {
            required,
            ..reservation
        };
        if reserved < required {
            let reason = if let Some(h) = hint.filter(|_| forecast > today) {
                Reason::AggregateForecast {
                    level: h.level,
                    rise: h.rise,
                    horizon: h.horizon,
                    fragmentation: h.fragmentation,
                    required,
                    reserved,
                }
            } else if placement_need > reservation.required {
                Reason::Stranded {
                    tunnels: stranded.len(),
                    nodes: stranded_nodes,
                }
            } else {
                Reason::BelowReserve {
                    capacity: reservation.capacity_nodes,
                    epsilon: self.config.epsilon,
                    threshold: self.config.hotspot_threshold,
                    required,
                    reserved,
                }
            };
            let ready_at = now.checked_add(self.config.start_latency).unwrap_or(now);
            let mut shut_down: Vec<NodeId> = work
                .cluster
                .nodes()
                .filter(|(_, s)| *s == NodeState::ShutDown)
                .map(|(n, _)| n)
                .collect();
            shut_down.reverse();
            for _ in reserved..required {
                let node = match shut_down.pop() {
                    Some(node) => node,
                    None => work.cluster.next_node_id()?,
                };
                work.act(Action::Start { node, ready_at }, reason)?;
            }
        } else if reserved > required.saturating_add(self.config.stop_slack) {
            let surplus = reserved - required - self.config.stop_slack;
            let reason = Reason::AboveReserve {
                capacity: reservation.capacity_nodes,
                epsilon: self.config.epsilon,
                threshold: self.config.hotspot_threshold,
                required,
                reserved,
                slack: self.config.stop_slack,
            };
            // Pinned nodes cannot be stopped: the surplus is taken from the others.
            let inactive: Vec<NodeId> = work
                .cluster
                .nodes()
                .filter(|&(n, s)| s == NodeState::Inactive && !work.cluster.is_pinned(n))
                .map(|(n, _)| n)
                .collect();
            for &node in inactive.iter().rev().take(surplus as usize) {
                work.act(Action::Stop { node }, reason)?;
            }
        }
        Ok(result)
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The cluster as the plan changes it, with the loads of the active nodes kept up to date.
struct Work {
    cluster: Cluster,
    /// β_j of every active node, with the spreads of its tunnels.
    loads: BTreeMap<NodeId, Fill>,
    decisions: Vec<Decision>,
    limit: f64,
}

impl Work {
    fn new(cluster: Cluster, limit: f64) -> Self {
        let loads = cluster.active_fills();
        Self {
            cluster,
            loads,
            decisions: Vec::new(),
            limit,
        }
    }

    /// Applies an action to the cluster, updates the loads and records the decision.
    fn act(&mut self, action: Action, reason: Reason) -> Result<(), ProvisionError> {
        self.cluster.apply(&action)?;
        match action {
            Action::Place { tunnel, node } => {
                let fill = self
                    .cluster
                    .tunnel(tunnel)
                    .map_or(Fill::default(), |t| t.fill());
                *self.loads.entry(node).or_default() += fill;
            }
            Action::Migrate { tunnel, from, to } => {
                let fill = self
                    .cluster
                    .tunnel(tunnel)
                    .map_or(Fill::default(), |t| t.fill());
                if let Some(load) = self.loads.get_mut(&from) {
                    *load -= fill;
                }
                *self.loads.entry(to).or_default() += fill;
            }
            Action::Activate { node } => {
                self.loads.insert(node, Fill::default());
            }
            Action::Deactivate { node } => {
                self.loads.remove(&node);
            }
            Action::Start { .. } | Action::Stop { .. } => {}
        }
        self.decisions.push(Decision { action, reason });
        Ok(())
    }

    /// Best Fit among the active nodes other than `exclude`; else the lowest-numbered
    /// inactive node, activated (recorded with [`Reason::NothingFits`]); else `None`.
    fn fit_or_activate(
        &mut self,
        tunnel: TunnelId,
        size: Fill,
        exclude: Option<NodeId>,
    ) -> Result<Option<NodeId>, ProvisionError> {
        let candidates = self
            .loads
            .iter()
            .filter(|(&n, _)| Some(n) != exclude)
            .map(|(&n, &load)| (n, load));
        if let Some(node) = best_fit(candidates, size, self.limit) {
            return Ok(Some(node));
        }
        let inactive = self
            .cluster
            .nodes()
            .find(|(_, s)| *s == NodeState::Inactive)
            .map(|(n, _)| n);
        match inactive {
            Some(node) => {
                let reason = Reason::NothingFits {
                    tunnel,
                    alpha: size.level(),
                    limit: self.limit,
                };
                self.act(Action::Activate { node }, reason)?;
                Ok(Some(node))
            }
            None => Ok(None),
        }
    }

    /// The active node with the lowest level (ties: lowest number).
    fn least_loaded(&self) -> Option<(NodeId, Fill)> {
        self.loads
            .iter()
            .map(|(&n, &load)| (n, load))
            .min_by(|a, b| a.1.level().total_cmp(&b.1.level()).then(a.0.cmp(&b.0)))
    }

    /// Active nodes above the limit, highest level first, from the tracked loads.
    fn cluster_hotspots(&self) -> Vec<(NodeId, Fill)> {
        let mut hot: Vec<(NodeId, Fill)> = self
            .loads
            .iter()
            .filter(|(_, &load)| load.level() > self.limit + crate::placement::FIT_TOLERANCE)
            .map(|(&n, &load)| (n, load))
            .collect();
        hot.sort_by(|a, b| b.1.level().total_cmp(&a.1.level()).then(a.0.cmp(&b.0)));
        hot
    }
}

#[cfg(test)]
mod tests;
