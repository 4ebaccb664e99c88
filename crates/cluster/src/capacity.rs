//! The elastic provisioning model of issue 5 (the `provision` crate) run on the live cluster's
//! load reports: what the model reserves, which data nodes are hotspots, and the decisions it
//! takes each τ with their reasons (`protego ctl capacity`).
//!
//! With `[cluster.autoscale] mode = "advise"` (the default) the decisions are shown, not
//! carried out. With `mode = "act"` the cluster carries them out
//! ([`crate::manager::Cluster`]'s autoscaler step): migrations are zero-loss moves, activation
//! and deactivation unpark and park data nodes, starts and stops go to the node provider
//! ([`crate::provider`]).
//!
//! Units: loads are throughput in Mbit/s, both directions of a tunnel together, against a
//! data node's capacity `[cluster] node_capacity_mbit`; the paper's CPU share of a tunnel is
//! proportional to it for packets of one size, and the data nodes' per-tunnel CPU time is
//! itself only an estimate from packet shares. A tunnel's cap σ is twice its `rate_limit`
//! (the steer nodes limit each direction), or 30 % of a node without one (the paper's σ).
//!
//! Sizing is the simulator's ([`provision::Sizer`]). Under every sizing rule a tunnel with a
//! CHILD_SA not measured yet is placed at the sizer's prior (learned from earlier tunnels'
//! first measurements) and is settling (left where it is) until its first report (issue 24).
//! With `sizing = "adaptive"` each step first gives the sizer the active nodes' loads from
//! their new reports, then the tunnels' new measurements (a tunnel measured before whose node
//! sent no new report keeps its last size in the aggregate), and the plan keeps the reserve
//! the aggregate forecast asks for (docs/provisioning.md, "Adaptive sizing").

use crate::manager::NodeLoad;
use crate::provider::ProvidedState;
use control::config::{AutoscaleConfig, AutoscaleMode};
use ike::TunnelId;
use provision::{
    Action, Cluster as Model, Decision, NodeId, NodeState, Plan, Planner, PlannerConfig,
    ProvisionError, ReserveHint, Size, UsageBook,
};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Decisions kept for `protego ctl capacity`.
const HISTORY: usize = 50;

/// Steps over which `protego ctl capacity` shows the recent saturation rate (an hour at the
/// default τ of 10 s).
const RECENT_STEPS: usize = 360;

/// One data node as the model sees it: registered, or only known to the node provider.
#[derive(Debug, Clone)]
pub(crate) struct NodeInput {
    /// Its id in the cluster.
    pub(crate) id: u32,
    /// Its name.
    pub(crate) name: String,
    /// Registered and alive (its reports count).
    pub(crate) alive: bool,
    /// Drained by an operator: left out of the model.
    pub(crate) draining: bool,
    /// Parked by the autoscaler: held in reserve (inactive), no tunnel is placed on it.
    pub(crate) parked: bool,
    /// The autoscaler asked the provider to stop it.
    pub(crate) leaving: bool,
    /// What the node provider says of it, if the provider manages it.
    pub(crate) provided: Option<ProvidedState>,
    /// Its last load report and that report's number (a report is recorded once).
    pub(crate) load: Option<(u64, NodeLoad)>,
}

/// The cluster's state for one step.
#[derive(Debug, Clone, Default)]
pub(crate) struct Input {
    /// Every registered data node, and every node the provider manages.
    pub(crate) nodes: Vec<NodeInput>,
    /// Where each placed tunnel is (the node for its next CHILD_SA; a placement outlives the
    /// tunnel's CHILD_SAs).
    pub(crate) placement: Vec<(TunnelId, u32)>,
    /// The tunnels with a CHILD_SA (data nodes report only these).
    pub(crate) with_child: HashSet<TunnelId>,
    /// Of those, the ones none of whose CHILD_SAs is held by, or being installed on, a live
    /// data node (a lost node's, or no data node could take them).
    pub(crate) unplaced: HashSet<TunnelId>,
    /// Each configured tunnel's rate limit (Mbit/s per direction) and name.
    pub(crate) tunnels: BTreeMap<TunnelId, (String, Option<u32>)>,
    /// A node provider is configured.
    pub(crate) provider: bool,
}

/// A provider node's starts: when it was last started (or last seen failing) and how many
/// times in a row it failed (exited on its own, or never registered).
#[derive(Debug, Clone, Copy)]
struct Starts {
    at: Instant,
    failures: u32,
    /// The current failure is counted.
    counted: bool,
}

/// The longest a failing node is left out before it is tried again.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// What became of one decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Shown only (advise mode).
    Advised,
    /// Carried out.
    Done,
    /// Not carried out, and why.
    Skipped(String),
}

/// The autoscaler's model: the usage histograms and the planner, stepped every τ.
pub(crate) struct Autoscaler {
    planner: Planner,
    usage: UsageBook,
    mode: AutoscaleMode,
    node_capacity: f64,
    last_consolidation: Option<Instant>,
    /// The report number last recorded per node.
    recorded: HashMap<u32, u64>,
    /// Tunnels with a usage histogram.
    seen: HashSet<TunnelId>,
    last: Option<Step>,
    /// Decisions with what became of them, newest last.
    history: VecDeque<Entry>,
    /// The decisions of the last step with their outcomes (what the history compares to).
    previous: Vec<(Action, Outcome)>,
    /// Provider nodes' starts and failures, by node id.
    starts: HashMap<u32, Starts>,
    /// Each tunnel's size for placement, from its measurements.
    sizer: provision::Sizer,
    /// Each tunnel's size at its last measurement.
    sizes: HashMap<TunnelId, f64>,
    /// With adaptive sizing, whether a data node was saturated in each of the last steps the
    /// calibrator counted (newest last, at most [`RECENT_STEPS`]).
    recent: VecDeque<bool>,
    /// Decisions taken (each once, not again while repeated step after step), by action and
    /// outcome: the metrics' `protego_autoscaler_decisions_total`.
    decided: BTreeMap<(&'static str, &'static str), u64>,
}

/// What the metrics show of the autoscaler.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct AutoscalerFigures {
    /// `advise` or `act`.
    pub mode: &'static str,
    /// Decisions by (action, outcome): actions `place`, `migrate`, `activate`,
    /// `deactivate`, `start`, `stop`; outcomes `advised`, `done`, `skipped`.
    pub decisions: BTreeMap<(&'static str, &'static str), u64>,
    /// The last step's reservation: active nodes after it, reserved ones, the nodes the
    /// forecast requires, and hotspots left (None before the first step).
    pub last: Option<(u32, u32, u32, usize)>,
}

/// The metrics' name of an action.
fn action_name(a: &Action) -> &'static str {
    match a {
        Action::Place { .. } => "place",
        Action::Migrate { .. } => "migrate",
        Action::Activate { .. } => "activate",
        Action::Deactivate { .. } => "deactivate",
        Action::Start { .. } => "start",
        Action::Stop { .. } => "stop",
    }
}

/// The metrics' name of an outcome.
fn outcome_name(o: &Outcome) -> &'static str {
    match o {
        Outcome::Advised => "advised",
        Outcome::Done => "done",
        Outcome::Skipped(_) => "skipped",
    }
}

/// One decision in the history.
struct Entry {
    at_ms: u64,
    text: String,
    outcome: Outcome,
}

/// What the last step found.
struct Step {
    at_ms: u64,
    plan: Plan,
    /// Each node in the model before the plan: its name, state, load, level (the load plus
    /// the headroom its tunnels share, [`provision::Fill`]) and whether parked.
    nodes: Vec<(String, NodeState, f64, f64, bool)>,
    tunnels: usize,
    demand: f64,
    /// The plan's decisions with node and tunnel names, and their outcomes.
    decisions: Vec<(String, Outcome)>,
    /// The adaptive forecast's reserve hint the plan was made with.
    hint: Option<ReserveHint>,
    /// Tunnels placed at their prior size, not measured yet.
    settling: usize,
}

/// True if two actions are the same decision (a start's expected time moves with the clock).
fn same_action(a: &Action, b: &Action) -> bool {
    match (a, b) {
        (Action::Start { node: x, .. }, Action::Start { node: y, .. }) => x == y,
        _ => a == b,
    }
}

/// Names decisions the way operators know the nodes and tunnels; a node the cluster does not
/// know (a start the planner numbered itself) is "a new data node".
pub(crate) struct Naming<'a> {
    pub(crate) nodes: &'a HashMap<u32, String>,
    pub(crate) tunnels: &'a BTreeMap<TunnelId, (String, Option<u32>)>,
}

impl provision::Names for Naming<'_> {
    fn node(&self, node: NodeId, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.nodes.get(&node.0) {
            Some(name) => f.write_str(name),
            None => write!(f, "a new data node ({node})"),
        }
    }

    fn tunnel(&self, tunnel: provision::TunnelId, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.tunnels.get(&tunnel) {
            Some((name, _)) => f.write_str(name),
            None => write!(f, "{tunnel}"),
        }
    }
}

impl Autoscaler {
    /// An autoscaler for data nodes of `node_capacity_mbit`, with the model's parameters from
    /// `config`.
    pub(crate) fn new(
        node_capacity_mbit: u32,
        config: &AutoscaleConfig,
    ) -> Result<Self, ProvisionError> {
        let node_capacity = f64::from(node_capacity_mbit.max(1));
        let defaults = PlannerConfig::default();
        let planner = Planner::new(PlannerConfig {
            node_capacity,
            default_sigma: defaults.default_sigma * node_capacity,
            hotspot_threshold: config.hotspot_threshold,
            epsilon: config.epsilon,
            tau: config.interval,
            consolidation_interval: config.consolidation_interval,
            start_latency: config.start_latency,
            min_reserved_nodes: config.min_nodes,
            stop_slack: config.stop_slack,
            drain: config.drain,
            window: config.window,
            guarantee_target: config.guarantee_target,
            ..defaults
        })?;
        let sizer = provision::Sizer::for_planner(config.sizing, planner.config())?;
        let usage = UsageBook::new(planner.config().usage_config())?;
        Ok(Self {
            planner,
            usage,
            mode: config.mode,
            node_capacity,
            last_consolidation: None,
            recorded: HashMap::new(),
            seen: HashSet::new(),
            last: None,
            history: VecDeque::new(),
            previous: Vec::new(),
            starts: HashMap::new(),
            sizer,
            sizes: HashMap::new(),
            recent: VecDeque::new(),
            decided: BTreeMap::new(),
        })
    }

    /// How often the autoscaler wants a step.
    pub(crate) fn tau(&self) -> Duration {
        self.planner.config().tau
    }

    /// Advise or act.
    pub(crate) fn mode(&self) -> AutoscaleMode {
        self.mode
    }

    /// How long a node that failed `failures` times in a row is left out: the start latency
    /// (at least 10 s), doubled for each further failure, at most an hour.
    fn backoff(&self, failures: u32) -> Duration {
        let base = self
            .planner
            .config()
            .start_latency
            .max(Duration::from_secs(10));
        base.saturating_mul(1 << failures.saturating_sub(1).min(12))
            .min(MAX_BACKOFF)
    }

    /// The model state of node `n` (`None`: left out), given whether tunnels are placed on it.
    fn model_state(&self, n: &NodeInput, holds_tunnels: bool, now: Instant) -> Option<NodeState> {
        let leaving = n.leaving || matches!(n.provided, Some(ProvidedState::Stopping));
        if n.alive {
            let reserve = n.parked && !holds_tunnels;
            return match (n.draining || leaving, reserve) {
                (true, _) => None,
                (false, true) => Some(NodeState::Inactive),
                (false, false) => Some(NodeState::Active),
            };
        }
        // A node that failed (exited on its own, or never registered and was stopped) is left
        // out for its backoff, so that the next stopped one is started instead.
        let backing_off = self
            .starts
            .get(&n.id)
            .is_some_and(|s| s.failures > 0 && now < s.at + self.backoff(s.failures));
        match &n.provided {
            Some(ProvidedState::Running { started_at }) => Some(NodeState::Starting {
                ready_at: started_at
                    .map_or(now, |s| s + self.planner.config().start_latency)
                    .max(now),
            }),
            Some(_) if backing_off => None,
            Some(
                ProvidedState::Stopped | ProvidedState::Stopping | ProvidedState::Failed { .. },
            ) => Some(NodeState::ShutDown),
            None => None,
        }
    }

    /// Counts a failure of node `id` at `now` (it exited on its own, or never registered).
    pub(crate) fn note_failure(&mut self, id: u32, now: Instant) {
        let s = self.starts.entry(id).or_insert(Starts {
            at: now,
            failures: 0,
            counted: false,
        });
        if !s.counted {
            s.failures += 1;
            s.counted = true;
            s.at = now;
        }
    }

    /// Provider nodes started at least twice their start latency (and 10 s) ago that have
    /// not registered: they are stopped and count as failed.
    pub(crate) fn stuck(&self, input: &Input, now: Instant) -> Vec<(u32, String)> {
        let limit = self.planner.config().start_latency * 2 + Duration::from_secs(10);
        input
            .nodes
            .iter()
            .filter(|n| !n.alive)
            .filter(|n| match n.provided {
                Some(ProvidedState::Running {
                    started_at: Some(s),
                }) => now.saturating_duration_since(s) > limit,
                _ => false,
            })
            .map(|n| (n.id, n.name.clone()))
            .collect()
    }

    /// One step: records the new reports' usage, builds the model of the data nodes and their
    /// tunnels, and plans. The caller carries the plan out (act mode) and hands the outcomes
    /// to [`Autoscaler::record`].
    pub(crate) fn step(
        &mut self,
        now: Instant,
        wall: SystemTime,
        input: &Input,
    ) -> Result<Plan, ProvisionError> {
        let mut model = Model::new();
        let mut states: HashMap<u32, NodeState> = HashMap::new();
        let mut alpha: HashMap<TunnelId, f64> = HashMap::new();
        // This step's new measurements, summed over the nodes of a tunnel (two during a move).
        let mut fresh_alpha: HashMap<TunnelId, f64> = HashMap::new();
        let holding: HashSet<u32> = input
            .placement
            .iter()
            .filter(|(t, _)| input.tunnels.contains_key(t))
            .map(|(_, n)| *n)
            .collect();
        let mut nodes = Vec::new();
        // Each active node's load over the interval of its new report, in Mbit/s.
        let mut node_loads = Vec::new();
        for n in &input.nodes {
            match (&n.provided, n.alive) {
                // Registered: a new failure counts again; up for its backoff, the failures in a
                // row are over.
                (_, true) => {
                    if let Some(s) = self.starts.get(&n.id).copied() {
                        if now >= s.at + self.backoff(s.failures.max(1)) {
                            self.starts.remove(&n.id);
                        } else if let Some(s) = self.starts.get_mut(&n.id) {
                            s.counted = false;
                        }
                    }
                }
                (Some(ProvidedState::Failed { .. }), false) => self.note_failure(n.id, now),
                _ => {}
            }
            if let Some(state) = self.model_state(n, holding.contains(&n.id), now) {
                model.add_node(NodeId(n.id), state)?;
                // With a provider, a node it does not manage cannot be stopped.
                if input.provider && n.provided.is_none() {
                    model.pin(NodeId(n.id))?;
                }
                states.insert(n.id, state);
                nodes.push((n.id, n.name.clone(), state, n.parked));
            }
            // A lost node's last report no longer describes anything.
            let Some((seq, load)) = n.load.as_ref().filter(|_| n.alive) else {
                continue;
            };
            let fresh = self.recorded.get(&n.id) != Some(seq);
            self.recorded.insert(n.id, *seq);
            // A node's first report covers everything since it started, not an interval.
            if load.interval_ms == 0 {
                continue;
            }
            let seconds = f64::from(load.interval_ms) / 1000.0;
            let mut node_mbit = 0.0;
            for (&t, &bytes) in &load.tunnel_bytes {
                let mbit = bytes as f64 * 8.0 / seconds / 1e6;
                node_mbit += mbit;
                let tunnel = TunnelId(t);
                *alpha.entry(tunnel).or_default() += mbit;
                if fresh {
                    *fresh_alpha.entry(tunnel).or_default() += mbit;
                }
            }
            // As in the simulator, the active nodes that hold tunnels.
            if fresh && holding.contains(&n.id) && states.get(&n.id).is_some_and(|s| s.is_active())
            {
                node_loads.push(node_mbit);
            }
        }
        // As in the simulator: the active nodes' loads over the step just served and the
        // tunnels on no active node first, then the tunnels' new measurements (adaptive
        // sizing; nothing for the other rules).
        let stranded = Self::stranded(input, &states);
        self.observe_step(node_loads, stranded);
        for (&tunnel, &mbit) in &fresh_alpha {
            if input.tunnels.contains_key(&tunnel) {
                let cap = self.sigma(input, tunnel);
                let t = tunnel;
                self.usage.set_sigma(t, cap)?;
                self.usage.record(t, mbit.min(cap))?;
                self.sizes.insert(tunnel, self.sizer.size(t, mbit, cap));
            }
        }
        // A tunnel whose node sent no new report this step keeps its last size in the
        // aggregate: left out, the sum would dip and then look like a rise.
        for tunnel in &input.with_child {
            if input.tunnels.contains_key(tunnel) && !fresh_alpha.contains_key(tunnel) {
                if let Some(&size) = self.sizes.get(tunnel) {
                    let cap = self.sigma(input, *tunnel);
                    self.sizer.carry(size, cap);
                }
            }
        }
        // Tunnels no longer configured are forgotten.
        let gone: Vec<TunnelId> = self
            .seen
            .iter()
            .filter(|t| !input.tunnels.contains_key(t))
            .copied()
            .collect();
        for t in gone {
            self.usage.remove(t);
            self.sizer.forget(t);
            self.sizes.remove(&t);
            self.seen.remove(&t);
        }
        self.seen
            .extend(fresh_alpha.keys().filter(|t| input.tunnels.contains_key(t)));
        let mut settling = 0;
        for (tunnel, node) in &input.placement {
            if !input.tunnels.contains_key(tunnel) {
                continue;
            }
            // Sized as configured (e.g. the higher of its last two measurements), never below
            // what it carries now. Before its first measurement and with a CHILD_SA, under
            // every sizing rule (issue 24), at the sizer's prior and settling: consolidation,
            // hotspot relief and drain leave it where it is until it is measured. Without a
            // CHILD_SA it carries nothing and no report will measure it (data nodes report
            // only tunnels with one): 0, not settling.
            let cap = self.sigma(input, *tunnel);
            let now_mbit = alpha.get(tunnel).copied().unwrap_or(0.0);
            let (sized, unmeasured) = match self.sizes.get(tunnel) {
                Some(&size) => (size, false),
                None if input.with_child.contains(tunnel) => (self.sizer.prior(cap), true),
                None => (0.0, false),
            };
            let a = now_mbit.max(sized).min(cap);
            let t = *tunnel;
            model.add_tunnel(t, a)?;
            // Adaptive sizing's headroom, shared with the node's other tunnels (0 under the
            // other rules and before the first measurement), within the cap.
            if !unmeasured {
                model.set_spread(t, self.sizer.spread(t).min(cap - a).max(0.0))?;
            }
            if unmeasured {
                model.set_settling(t, true)?;
                settling += 1;
            }
            // A tunnel on a node left out of the model (or not active) is placed anew.
            if states.get(node).is_some_and(|s| s.is_active()) {
                model.assign(t, NodeId(*node))?;
            }
        }
        let hint = self.sizer.hint();
        let plan = self.planner.plan_with(
            &model,
            &self.usage,
            now,
            self.last_consolidation,
            hint.as_ref(),
        )?;
        if plan.consolidation.is_some() {
            self.last_consolidation = Some(now);
        }
        let at_ms = wall
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let fills = model.active_fills();
        self.last = Some(Step {
            at_ms,
            nodes: nodes
                .into_iter()
                .map(|(id, name, state, parked)| {
                    let fill = fills.get(&NodeId(id)).copied().unwrap_or_default();
                    (
                        name,
                        state,
                        fill.mean.max(0.0),
                        fill.level().max(0.0),
                        parked,
                    )
                })
                .collect(),
            tunnels: model.tunnel_count(),
            demand: model.total_load(),
            plan: plan.clone(),
            decisions: Vec::new(),
            hint,
            settling,
        });
        Ok(plan)
    }

    /// The figures the metrics show.
    pub(crate) fn figures(&self) -> AutoscalerFigures {
        AutoscalerFigures {
            mode: self.mode.as_str(),
            decisions: self.decided.clone(),
            last: self.last.as_ref().map(|s| {
                let r = &s.plan.reservation;
                (r.active, r.reserved, r.required, s.plan.hotspots.len())
            }),
        }
    }

    /// Records what became of the last step's decisions (in the plan's order; advise mode:
    /// [`Outcome::Advised`] for each). The history keeps a decision unless the last step took
    /// the same one with the same outcome (advice, and decisions that cannot be carried out,
    /// come back every step with new figures in their reasons).
    pub(crate) fn record(&mut self, now: Instant, names: &Naming<'_>, outcomes: Vec<Outcome>) {
        let Some(step) = self.last.as_mut() else {
            return;
        };
        let decisions: &[Decision] = &step.plan.decisions;
        let mut previous = Vec::with_capacity(decisions.len());
        step.decisions.clear();
        for (d, outcome) in decisions.iter().zip(outcomes) {
            let text = d.named(names).to_string();
            let repeated = self
                .previous
                .iter()
                .any(|(a, o)| same_action(a, &d.action) && *o == outcome);
            if !repeated {
                *self
                    .decided
                    .entry((action_name(&d.action), outcome_name(&outcome)))
                    .or_default() += 1;
                if self.history.len() == HISTORY {
                    self.history.pop_front();
                }
                self.history.push_back(Entry {
                    at_ms: step.at_ms,
                    text: text.clone(),
                    outcome: outcome.clone(),
                });
            }
            if let (Action::Start { node, .. }, Outcome::Done) = (&d.action, &outcome) {
                let s = self.starts.entry(node.0).or_insert(Starts {
                    at: now,
                    failures: 0,
                    counted: false,
                });
                s.at = now;
                s.counted = false;
            }
            previous.push((d.action, outcome.clone()));
            step.decisions.push((text, outcome));
        }
        self.previous = previous;
    }

    /// The configured tunnels with a CHILD_SA that are on no active node of the model: no
    /// live data node holds their CHILD_SAs, or their placement is gone or on a node that is
    /// not active. A tunnel without a CHILD_SA carries nothing, wherever its placement points.
    fn stranded(input: &Input, states: &HashMap<u32, NodeState>) -> usize {
        let placement: HashMap<TunnelId, u32> = input.placement.iter().copied().collect();
        input
            .with_child
            .iter()
            .filter(|t| input.tunnels.contains_key(t))
            .filter(|t| {
                input.unplaced.contains(t)
                    || !placement
                        .get(t)
                        .and_then(|n| states.get(n))
                        .is_some_and(|s| s.is_active())
            })
            .count()
    }

    /// Starts the sizer's step with the active nodes' loads over the step just served (Mbit/s)
    /// and the number of tunnels on no active node (adaptive sizing, nothing for the other
    /// rules), and keeps whether the calibrator counted the step as saturated, for the recent
    /// saturation rate.
    fn observe_step(&mut self, loads: Vec<f64>, stranded: usize) {
        let before = self.sizer.forecaster().map(|f| f.calibration());
        self.sizer.observe_step(loads, stranded);
        let after = self.sizer.forecaster().map(|f| f.calibration());
        if let (Some(before), Some(after)) = (before, after) {
            if after.steps > before.steps {
                if self.recent.len() == RECENT_STEPS {
                    self.recent.pop_front();
                }
                self.recent
                    .push_back(after.saturated_steps > before.saturated_steps);
            }
        }
    }

    /// The adaptive calibrator's state for `protego ctl capacity` (null for the other rules).
    fn describe_calibration(&self) -> serde_json::Value {
        let Some(f) = self.sizer.forecaster() else {
            return serde_json::Value::Null;
        };
        let c = f.calibration();
        let rate =
            |saturated: u64, steps: u64| (steps > 0).then(|| saturated as f64 / steps as f64);
        let recent_saturated = self.recent.iter().filter(|&&s| s).count() as u64;
        serde_json::json!({
            "k": c.k,
            "gamma": c.gamma,
            "target_saturation_rate": c.target,
            "steps": c.steps,
            "saturated_steps": c.saturated_steps,
            "saturation_rate": rate(c.saturated_steps, c.steps),
            "recent_steps": self.recent.len(),
            "recent_saturation_rate": rate(recent_saturated, self.recent.len() as u64),
        })
    }

    /// A tunnel's cap σ in Mbit/s: both directions of its rate limit, else the default.
    fn sigma(&self, input: &Input, tunnel: TunnelId) -> f64 {
        match input.tunnels.get(&tunnel).and_then(|(_, limit)| *limit) {
            Some(mbit) => (2.0 * f64::from(mbit)).min(self.node_capacity),
            None => self.planner.config().default_sigma,
        }
    }

    /// What `protego ctl capacity` shows.
    pub(crate) fn describe(&self) -> serde_json::Value {
        let config = self.planner.config();
        let model = serde_json::json!({
            "node_capacity_mbit": self.node_capacity,
            "hotspot_threshold": config.hotspot_threshold,
            "epsilon": config.epsilon,
            "tau_ms": config.tau.as_millis() as u64,
            "consolidation_interval_s": config.consolidation_interval.as_secs(),
            "start_latency_s": config.start_latency.as_secs(),
            "min_nodes": config.min_reserved_nodes,
            "stop_slack": config.stop_slack,
            "sizing": self.sizer.sizing().to_string(),
            "drain": config.drain,
            "window": config.window,
            "default_sigma_mbit": config.default_sigma,
            "guarantee_target": config.guarantee_target,
        });
        let calibration = self.describe_calibration();
        let entry = |text: &str, outcome: &Outcome| {
            let (done, why) = match outcome {
                Outcome::Advised => (serde_json::Value::Null, None),
                Outcome::Done => (true.into(), None),
                Outcome::Skipped(why) => (false.into(), Some(why.clone())),
            };
            serde_json::json!({ "decision": text, "carried_out": done, "not_carried_out_because": why })
        };
        let history: Vec<serde_json::Value> = self
            .history
            .iter()
            .map(|e| {
                let mut v = entry(&e.text, &e.outcome);
                v["at_ms"] = e.at_ms.into();
                v
            })
            .collect();
        let mode = self.mode.as_str();
        let note = match self.mode {
            AutoscaleMode::Advise => "advise mode: decisions are shown, not carried out",
            AutoscaleMode::Act => "act mode: decisions are carried out",
        };
        let Some(step) = &self.last else {
            return serde_json::json!({
                "mode": mode,
                "note": note,
                "model": model,
                "calibration": calibration,
                "step": null,
                "decisions": history,
                "waiting": "no step yet: the first comes one interval after start",
            });
        };
        let r = &step.plan.reservation;
        let limit = config.hotspot_threshold;
        let nodes: Vec<serde_json::Value> = step
            .nodes
            .iter()
            .map(|(name, state, load, level, parked)| {
                serde_json::json!({
                    "node": name,
                    "state": state.name(),
                    "parked": parked,
                    "used_mbit": load,
                    "level_mbit": level,
                    "utilization": load / self.node_capacity,
                    "hotspot": state.is_active() && level / self.node_capacity > limit,
                })
            })
            .collect();
        let count = |wanted: fn(&NodeState) -> bool| {
            step.nodes
                .iter()
                .filter(|(_, s, _, _, _)| wanted(s))
                .count()
        };
        let hint = step.hint.map(|h| {
            serde_json::json!({
                "nodes": h.nodes,
                "level_mbit": h.level,
                "rise_mbit": h.rise,
                "horizon_steps": h.horizon,
                "fragmentation": h.fragmentation,
            })
        });
        serde_json::json!({
            "mode": mode,
            "note": note,
            "model": model,
            "calibration": calibration,
            "step": {
                "at_ms": step.at_ms,
                "tunnels": step.tunnels,
                "settling": step.settling,
                "used_mbit": step.demand,
                "nodes": nodes,
                "before": {
                    "active": count(|s| s.is_active()),
                    "reserved": count(|s| s.is_reserved()),
                    "hotspots": nodes.iter().filter(|n| n["hotspot"] == true).count(),
                },
                "after": {
                    "active": r.active,
                    "reserved": r.reserved,
                    "hotspots": step.plan.hotspots.len(),
                    "unplaced": step.plan.unplaced.len(),
                },
                "required": r.required,
                "predicted_mbit": r.capacity,
                "predicted_nodes": r.capacity_nodes,
                "mean_mbit": r.mean,
                "reserve_hint": hint,
                "consolidated": step.plan.consolidation.is_some(),
                "decisions": step.decisions.iter().map(|(t, o)| entry(t, o)).collect::<Vec<_>>(),
            },
            "decisions": history,
        })
    }
}

#[cfg(test)]
#[path = "capacity_tests.rs"]
mod tests;
