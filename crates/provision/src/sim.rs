//! The provisioning simulator (the paper's §7.4): replays a demand [`Trace`] minute by minute
//! through the [`Planner`] and measures what the tenants would get and what it costs, beside
//! the baselines it is compared with.
//!
//! # Timing
//!
//! The planner can only react to what it has measured. For every minute `t` of the trace:
//!
//! 1. **Serve** minute `t`'s demand with the placement and the active nodes decided before it.
//!    This minute's active capacity is the active nodes × the node capacity.
//! 2. **Measure** at its end (every τ): each tunnel's α is its mean demand over the last τ
//!    (over the minutes from its arrival, for a tunnel that arrived within the step);
//!    it goes into the cluster ([`Cluster::set_alpha`]) and the usage book
//!    ([`UsageBook::record`]). Nodes whose start latency has passed become inactive
//!    ([`Cluster::advance`]).
//! 3. **Plan** at the end of the minute ([`Planner::plan`], with the time of the last
//!    consolidation, which is recorded whenever a plan reports one) and apply the plan
//!    ([`Cluster::apply_plan`]); it is in force from minute `t + 1`.
//!
//! So a burst is seen one τ after it began, as in a live cluster. Before minute 0 the planner
//! places the tunnels once on minute 0's demand (a cluster does not start empty).
//!
//! **Arrivals** ([`Trace::arrival`]): a tunnel is neither placed nor judged before its first
//! minute. It joins the cluster at the plan before the step of that minute (before minute 0
//! for a first minute within the first step). With [`Policy::Protego`] it comes in at
//! [`Sizer::prior`] (the population prior, under every sizing rule) and is settling
//! ([`Cluster::set_settling`]) until its first measurement (issue 24); the paper's algorithm
//! places it at 0 as any other tunnel.
//!
//! **Adaptive sizing**: at the end of every step, before the tunnels' α, the sizer gets what a
//! live autoscaler sees, each active node's load over the step and how many existing tunnels
//! were on no active node ([`Sizer::observe_step`]); its reserve hint goes to
//! [`Planner::plan_with`]. It never sees demand ahead, and the warm start never primes it.
//!
//! **Warm-up** ([`SimConfig::score_from_minute`]): the minutes before it run normally but
//! count in no figure.
//!
//! **Warm start** ([`SimConfig::warm_start`], on by default): without a warm-up the usage
//! histograms start primed with the trace itself, standing for the previous day's history a
//! running cluster has, so the reserve of §5.3 is the one the paper computes from its day of
//! data (22 nodes for its trace) from the first minute. With a warm-up nothing is primed: the
//! warm-up is the history, each of its measurements recorded once as it is replayed, and
//! `warm_start` changes nothing (a warm-up shorter than τ ends before the first measurement, so
//! the first judged minutes are served as on a cold start). Without it, every histogram starts from the prior (the
//! tunnel at its cap: the largest reserve) and follows the day as it is seen. Priming touches
//! the reserve (how many nodes are kept active or inactive, and so whether an inactive node is
//! at hand when a tunnel needs one); placement itself sees nothing ahead.
//!
//! # Violations and the daily bandwidth guarantee
//!
//! A node is **overloaded** in a minute when its tunnels' demand exceeds its capacity (1 in the
//! paper's units, not T_H: T_H only sets how full the planner fills nodes). Following §7.4, the
//! node's packet scheduler is taken to be perfectly fair (max-min fair): on an overloaded node
//! the tunnels whose demand is under the fair share are still served in full and the others
//! get the fair share; a tunnel is **under-served** in that minute when it gets less than its
//! demand. A tunnel on no active node (waiting for a node to start) is under-served whenever
//! it has demand.
//!
//! §7.4 defines `DailyBandwidthGuarantee = (TotalAvailableMinutes − MinutesOfViolation) /
//! TotalAvailableMinutes` and reports it as the "99th-percentile guarantee": the bandwidth
//! guarantee of 99 % of the tunnels is met for that share of the time. Here a minute is a
//! **violation minute** when fewer than [`SimConfig::guarantee_fraction`] (0.99) of the
//! tunnels are served in full (for 170 tunnels: when 2 or more are under-served), and
//! [`Summary::guarantee_pct`] is the share of the other minutes. Two stricter and looser
//! readings are reported beside it: [`Summary::overload_minutes`] counts minutes with any
//! overloaded node (every tunnel's guarantee, no fair scheduler), and
//! [`Summary::tunnel_guarantee_pct`] is, per tunnel, the share of minutes it was served in
//! full, at the tunnel below which 1 % of the tunnels lie.
//!
//! # Cost
//!
//! [`Summary::active_capacity_gbps`] is the mean over the minutes of the active nodes'
//! capacity, and [`Summary::saving_pct`] is `1 − that / dedicated`, where dedicated is one VM
//! pair per tunnel sized for its cap ([`Trace::dedicated_capacity`]: 510 Gbit/s for the paper's
//! 170 tunnels of 1.5 Gbit/s), as the paper counts it. With arrivals, dedicated is the mean over
//! the judged minutes of the pairs of the tunnels that exist in each (a tunnel not there yet
//! needs no VM), and [`Policy::Dedicated`] runs exactly those pairs. Inactive nodes are not counted (the
//! paper's saving counts active capacity); [`Summary::reserved_capacity_gbps`] shows them.
//!
//! # Baselines
//!
//! [`compare`] runs, on the same trace:
//!
//! - [`Policy::Protego`]: the planner as configured (by default
//!   [`ConsolidationMode::WhenFewerNodes`]: a due consolidation is adopted only when it saves
//!   a node or relieves a hotspot), driven the way [`SimConfig::sizing`] and
//!   [`SimConfig::drain`] say: by default ([`SimConfig::paper`]) exactly like the paper's
//!   algorithm apart from the consolidation mode. Two caller-side improvements can be turned
//!   on: **sizing** gives the planner, instead of each tunnel's last measurement, e.g. the
//!   highest of its last two ([`Sizing::Envelope`]), so a tunnel that just jumped is packed
//!   at its new level and one that just dipped is not packed at its dip; **drain**
//!   ([`PlannerConfig::drain`]) gives a node back as soon as its tunnels fit elsewhere under T_H instead of
//!   waiting for the next consolidation, since migrations cost no throughput.
//! - [`Policy::Paper`]: the paper's algorithm as published: the same planner with
//!   [`ConsolidationMode::Always`], so every due Best Fit Decreasing packing is adopted. Its
//!   other steps are the paper's (Best Fit under T_H, hotspot relief by the fewest largest
//!   tunnels, empty nodes deactivated, the `⌈C / T_H⌉` reserve). The planner deactivates empty
//!   nodes every step rather than only after a consolidation, which changes nothing: only a
//!   consolidation can empty a node, as hotspot relief always leaves a tunnel behind.
//! - [`Policy::Dedicated`]: one VM pair per tunnel that exists; nothing is ever violated.
//! - [`Policy::StaticPeak`]: a fixed number of nodes, enough for the day's peak aggregate at
//!   T_H (`⌈peak / (T_H · node capacity)⌉`), all active all day. Its capacity never changes;
//!   its placement is re-balanced every minute on the previous minute's demand (largest
//!   tunnel first onto the least loaded node), so it is judged by the same rules.
//! - [`Policy::LowerBound`]: `⌈total demand / node capacity⌉` nodes every minute, with the
//!   demand of that very minute and traffic split freely across nodes. No policy can use less
//!   capacity and still serve everything; it is a bound, not a policy, and counts as never
//!   violated.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::cluster::Cluster;
use crate::error::ProvisionError;
use crate::ids::{NodeId, TunnelId};
use crate::nodes::NodeState;
use crate::planner::{ConsolidationMode, Planner, PlannerConfig};
pub use crate::sizing::{Defaults, Sizer, Sizing};
use crate::trace::{Trace, TraceError};
use crate::usage::UsageBook;
use judge::{existence, existing, not_arrived, summarize, to_u32, Judge};

/// Slack when comparing a node's demand with its capacity, Gbit/s (floating-point rounding).
const LOAD_TOLERANCE: f64 = 1e-9;

/// The paper's Table 2 (§7.4, its own trace), for comparison: consolidation interval
/// (minutes), active capacity (Gbit/s), 99th-percentile guarantee (%), resource saving (%).
pub const PAPER_TABLE2: [(u64, f64, f64, f64); 5] = [
    (3, 61.23, 90.21, 88.00),
    (5, 66.17, 93.07, 87.03),
    (10, 73.97, 96.84, 85.50),
    (30, 88.34, 98.24, 82.68),
    (60, 93.22, 98.63, 81.72),
];

/// What the simulator rejects.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    /// The model rejected a configuration or a step.
    #[error(transparent)]
    Provision(#[from] ProvisionError),
    /// The trace is unusable.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// A simulator setting out of range.
    #[error("simulator config: {field} = {value}: {reason}")]
    InvalidConfig {
        /// The setting.
        field: &'static str,
        /// The rejected value, as written.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// The simulator's settings: the model's parameters and how the guarantee is judged.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// The model's parameters, loads in Gbit/s (`node_capacity` is a node's Gbit/s). τ must be
    /// a whole number of minutes (the trace's step); the consolidation interval and the start
    /// latency are counted from the simulated clock.
    pub planner: PlannerConfig,
    /// The share of tunnels that must be served in full for a minute to count as available
    /// (the paper's 99th percentile: 0.99), in `(0, 1]`.
    pub guarantee_fraction: f64,
    /// Prime the usage histograms with the trace when there is no warm-up (see the module
    /// docs).
    pub warm_start: bool,
    /// How [`Policy::Protego`] sizes tunnels for the planner (the paper's algorithm always uses
    /// the last measurement).
    pub sizing: Sizing,
    /// Run [`Policy::Protego`]'s planner with [`PlannerConfig::drain`]: empty the least loaded
    /// active nodes whose tunnels all fit elsewhere under the fill limit.
    pub drain: bool,
    /// The first minute judged, below the trace's length: the minutes before it run normally
    /// (a warm-up in which every learner and histogram follows the trace, and nothing is
    /// primed) but count in no figure of the [`Summary`].
    pub score_from_minute: usize,
}

impl SimConfig {
    /// The paper's §7.4 setting in Gbit/s: nodes of 5 Gbit/s, tunnels of `cap_gbps`
    /// (1.5 in the paper, σ = 0.3 node), T_H = 0.9, ε = 0.05, τ = 1 minute, 10-minute
    /// consolidation, 3-minute node starts, 100-bin histograms over a day, a 99 % guarantee,
    /// warm start.
    pub fn paper(cap_gbps: f64) -> Self {
        Self {
            // The paper's §7.4 parameters (PlannerConfig's defaults) in Gbit/s.
            planner: PlannerConfig {
                node_capacity: 5.0,
                default_sigma: cap_gbps,
                ..PlannerConfig::default()
            },
            guarantee_fraction: 0.99,
            warm_start: true,
            sizing: Sizing::Measured,
            drain: false,
            score_from_minute: 0,
        }
    }

    /// [`SimConfig::paper`] with Protego's sizing and drain ([`Defaults::PROTEGO`]): what
    /// `protego sim` runs by default.
    pub fn protego(cap_gbps: f64) -> Self {
        Self {
            sizing: Defaults::PROTEGO.sizing,
            drain: Defaults::PROTEGO.drain,
            ..Self::paper(cap_gbps)
        }
    }

    /// The same setting with another consolidation interval, in minutes.
    pub fn with_consolidation_minutes(mut self, minutes: u64) -> Self {
        self.planner.consolidation_interval = Duration::from_secs(minutes.saturating_mul(60));
        self
    }

    /// The consolidation interval in whole minutes (rounded down).
    pub fn consolidation_minutes(&self) -> u64 {
        self.planner.consolidation_interval.as_secs() / 60
    }

    /// Checks the settings, naming the first that is out of range.
    pub fn validate(&self) -> Result<(), SimError> {
        self.planner.validate()?;
        self.tau_minutes()?;
        if !(self.guarantee_fraction > 0.0 && self.guarantee_fraction <= 1.0) {
            return Err(SimError::InvalidConfig {
                field: "guarantee_fraction",
                value: self.guarantee_fraction.to_string(),
                reason: "must be in (0, 1]",
            });
        }
        Ok(())
    }

    /// τ in minutes: a whole number of minutes, at least 1.
    fn tau_minutes(&self) -> Result<usize, SimError> {
        let tau = self.planner.tau;
        if !tau.as_secs().is_multiple_of(60) || tau.subsec_nanos() != 0 || tau.as_secs() == 0 {
            return Err(SimError::InvalidConfig {
                field: "tau",
                value: format!("{tau:?}"),
                reason: "must be a whole number of minutes (the trace's step), at least 1",
            });
        }
        usize::try_from(tau.as_secs() / 60).map_err(|_| SimError::InvalidConfig {
            field: "tau",
            value: format!("{tau:?}"),
            reason: "too long",
        })
    }
}

/// A provisioning policy the simulator runs (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The planner as configured.
    Protego,
    /// The paper's algorithm as published: the planner with [`ConsolidationMode::Always`].
    Paper,
    /// One VM pair per tunnel.
    Dedicated,
    /// A fixed number of nodes for the day's peak aggregate.
    StaticPeak,
    /// `⌈total demand / node capacity⌉` nodes every minute (a bound).
    LowerBound,
}

impl Policy {
    /// A short name: `protego`, `paper`, `dedicated`, `static_peak`, `lower_bound`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Protego => "protego",
            Self::Paper => "paper",
            Self::Dedicated => "dedicated",
            Self::StaticPeak => "static_peak",
            Self::LowerBound => "lower_bound",
        }
    }
}

/// What happened in one minute.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MinuteStats {
    /// Aggregate demand, Gbit/s.
    pub demand_gbps: f64,
    /// Capacity of the active nodes (or VMs), Gbit/s.
    pub active_gbps: f64,
    /// Capacity of the active and inactive nodes (the reserve of §5.3), Gbit/s.
    pub reserved_gbps: f64,
    /// Active nodes (for [`Policy::Dedicated`]: VMs).
    pub active_nodes: u32,
    /// Nodes whose demand exceeded their capacity.
    pub overloaded_nodes: u32,
    /// Tunnels that got less than their demand.
    pub underserved_tunnels: u32,
    /// Demand that was not served, Gbit/s.
    pub unserved_gbps: f64,
    /// Tunnel migrations the plan at the end of this minute made.
    pub migrations: u32,
    /// Tunnels that exist in this minute (from their arrival, [`Trace::arrival`]).
    pub tunnels: u32,
}

/// A run's figures over the whole trace (see the module docs for the definitions).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Summary {
    /// Minutes judged (from [`SimConfig::score_from_minute`] to the end).
    pub minutes: usize,
    /// Mean aggregate demand, Gbit/s.
    pub mean_demand_gbps: f64,
    /// Mean capacity of the active nodes, Gbit/s (Table 2's "Active VM Capacity").
    pub active_capacity_gbps: f64,
    /// Highest capacity of the active nodes in any minute, Gbit/s.
    pub peak_active_capacity_gbps: f64,
    /// Mean capacity of the active and inactive nodes, Gbit/s.
    pub reserved_capacity_gbps: f64,
    /// `100 · (1 − active_capacity / dedicated capacity)` (Table 2's "Resource Saving"), the
    /// dedicated capacity of the tunnels that exist in each judged minute, on average.
    pub saving_pct: f64,
    /// The daily bandwidth guarantee, % of minutes in which at least the guarantee fraction
    /// of tunnels were served in full (Table 2's "99th-percentile Guarantee").
    pub guarantee_pct: f64,
    /// Minutes in which more than the tolerated share of tunnels were under-served.
    pub violation_minutes: usize,
    /// Minutes in which any node was overloaded.
    pub overload_minutes: usize,
    /// Sum over the minutes of the overloaded nodes.
    pub overloaded_node_minutes: usize,
    /// Per tunnel, the % of minutes it was served in full; the value that the guarantee
    /// fraction of tunnels reach or exceed.
    pub tunnel_guarantee_pct: f64,
    /// Demand not served, % of all demand.
    pub unserved_pct: f64,
    /// Tunnel migrations over the run.
    pub migrations: u64,
}

/// One policy's run over a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The policy.
    pub policy: Policy,
    /// The consolidation interval, minutes (0 for policies without one).
    pub consolidation_minutes: u64,
    /// Every minute.
    pub minutes: Vec<MinuteStats>,
    /// The figures over the trace.
    pub summary: Summary,
}

/// Where a long run is, for progress reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress<'a> {
    /// The run: a policy name and its consolidation interval, e.g. `protego 10 min`.
    pub run: &'a str,
    /// Minutes done.
    pub minute: usize,
    /// Minutes in the trace.
    pub minutes: usize,
}

/// The result of [`compare`]: the planner and every baseline on one trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// The planner as configured.
    pub protego: Run,
    /// The paper's algorithm.
    pub paper: Run,
    /// One VM pair per tunnel.
    pub dedicated: Run,
    /// Fixed nodes for the peak.
    pub static_peak: Run,
    /// The per-minute lower bound.
    pub lower_bound: Run,
}

impl Comparison {
    /// The baselines with their names, in a fixed order.
    pub fn baselines(&self) -> [(&'static str, &Run); 4] {
        [
            (Policy::Dedicated.name(), &self.dedicated),
            (Policy::StaticPeak.name(), &self.static_peak),
            (Policy::Paper.name(), &self.paper),
            (Policy::LowerBound.name(), &self.lower_bound),
        ]
    }
}

/// One consolidation interval of [`sweep`]: the planner and the paper's algorithm.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepRow {
    /// The consolidation interval, minutes.
    pub consolidation_minutes: u64,
    /// The planner as configured.
    pub protego: Run,
    /// The paper's algorithm.
    pub paper: Run,
}

/// Runs the planner and every baseline on `trace` (see the module docs). `origin` is the
/// simulated clock's minute 0 (any instant); `progress` is called after every simulated step.
pub fn compare(
    trace: &Trace,
    config: &SimConfig,
    origin: Instant,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Comparison, SimError> {
    config.validate()?;
    Ok(Comparison {
        protego: run_policy(trace, config, Policy::Protego, origin, progress)?,
        paper: run_policy(trace, config, Policy::Paper, origin, progress)?,
        dedicated: run_policy(trace, config, Policy::Dedicated, origin, progress)?,
        static_peak: run_policy(trace, config, Policy::StaticPeak, origin, progress)?,
        lower_bound: run_policy(trace, config, Policy::LowerBound, origin, progress)?,
    })
}

/// Runs the planner and the paper's algorithm for every consolidation interval in
/// `intervals` (minutes, each at least 1) on `trace`: the trade-off of Table 2.
pub fn sweep(
    trace: &Trace,
    config: &SimConfig,
    intervals: &[u64],
    origin: Instant,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Vec<SweepRow>, SimError> {
    let mut rows = Vec::with_capacity(intervals.len());
    for &minutes in intervals {
        if minutes == 0 {
            return Err(SimError::InvalidConfig {
                field: "consolidation interval",
                value: "0".into(),
                reason: "must be at least 1 minute",
            });
        }
        let config = config.clone().with_consolidation_minutes(minutes);
        config.validate()?;
        rows.push(SweepRow {
            consolidation_minutes: minutes,
            protego: run_policy(trace, &config, Policy::Protego, origin, progress)?,
            paper: run_policy(trace, &config, Policy::Paper, origin, progress)?,
        });
    }
    Ok(rows)
}

/// Runs one policy on `trace` (see [`compare`]).
pub fn run_policy(
    trace: &Trace,
    config: &SimConfig,
    policy: Policy,
    origin: Instant,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Run, SimError> {
    config.validate()?;
    if config.score_from_minute >= trace.minutes() {
        return Err(SimError::InvalidConfig {
            field: "score_from_minute",
            value: config.score_from_minute.to_string(),
            reason: "must be a minute of the trace (below its length): at least one is judged",
        });
    }
    match policy {
        Policy::Protego => run_planner(
            trace,
            config,
            policy,
            config.planner.consolidation,
            origin,
            progress,
        ),
        Policy::Paper => run_planner(
            trace,
            config,
            policy,
            ConsolidationMode::Always,
            origin,
            progress,
        ),
        Policy::Dedicated => Ok(run_dedicated(trace, config)),
        Policy::StaticPeak => Ok(run_static_peak(trace, config)),
        Policy::LowerBound => Ok(run_lower_bound(trace, config)),
    }
}

/// The planner run (see the module docs for the timing).
fn run_planner(
    trace: &Trace,
    config: &SimConfig,
    policy: Policy,
    mode: ConsolidationMode,
    origin: Instant,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Run, SimError> {
    let tau = config.tau_minutes()?;
    let mut planner_config = config.planner.clone();
    planner_config.consolidation = mode;
    // The paper's algorithm never drains; Protego drains as configured.
    planner_config.drain = policy == Policy::Protego && config.drain;
    let planner = Planner::new(planner_config)?;
    let label = format!("{} {} min", policy.name(), config.consolidation_minutes());
    let ids: Vec<TunnelId> = trace.ids().iter().map(|&id| TunnelId(id)).collect();
    let caps = trace.caps();
    let sizing = if policy == Policy::Paper {
        Sizing::Measured
    } else {
        config.sizing
    };
    let mut sizer = Sizer::for_planner(sizing, planner.config())?;
    let mut usage = UsageBook::new(planner.config().usage_config())?;
    let mut cluster = Cluster::new();
    for (i, &id) in ids.iter().enumerate() {
        usage.set_sigma(id, caps[i])?;
        match trace.arrival(i) {
            0 => cluster.add_tunnel(id, trace.demand(0, i))?,
            // Arriving within the first step: in before it, as at any later step.
            arrival if arrival < tau => admit(&mut cluster, &sizer, policy, id, caps[i])?,
            _ => {}
        }
    }
    let steps = trace.minutes() / tau;
    let measured = |step: usize, i: usize| measurement(trace, tau, step, i);
    if config.warm_start && config.score_from_minute == 0 {
        // The previous day's history, as the paper's reserve is computed: the trace itself.
        // Only the usage histograms are primed. With a warm-up, the warm-up is the history,
        // recorded as it is replayed.
        for step in 0..steps {
            for (i, &id) in ids.iter().enumerate() {
                if trace.arrival(i) < (step + 1) * tau {
                    usage.record(id, measured(step, i))?;
                }
            }
        }
    }
    let seed_nodes = planner.reservation(&cluster, &usage)?.required;
    for k in 0..seed_nodes {
        cluster.add_node(NodeId(k), NodeState::Inactive)?;
    }
    let plan = planner.plan(&cluster, &usage, origin, None)?;
    cluster.apply_plan(&plan)?;
    let mut last_consolidation = plan.consolidation.map(|_| origin);

    let index: BTreeMap<TunnelId, usize> = ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let mut judge = Judge::new(trace, config);
    for t in 0..trace.minutes() {
        let counts = cluster.counts();
        let mut groups: BTreeMap<NodeId, Vec<usize>> = BTreeMap::new();
        for (id, state) in cluster.tunnels() {
            let Some(node) = state.node else { continue };
            if cluster.node_state(node).is_some_and(NodeState::is_active) {
                if let Some(&i) = index.get(&id) {
                    groups.entry(node).or_default().push(i);
                }
            }
        }
        let groups: Vec<Vec<usize>> = groups.into_values().collect();
        let stats = judge.minute(t, &groups, to_u32(counts.active), to_u32(counts.reserve()));
        // Tunnels that exist but are on no active node (waiting for one).
        let mut on_node = vec![false; ids.len()];
        for &i in groups.iter().flatten() {
            on_node[i] = true;
        }
        let stranded = (0..ids.len())
            .filter(|&i| trace.arrival(i) <= t && !on_node[i])
            .count();

        if (t + 1).is_multiple_of(tau) {
            let step = t / tau;
            let now = origin
                .checked_add(Duration::from_secs(60 * (t as u64 + 1)))
                .unwrap_or(origin);
            // What a live autoscaler sees at the end of the step: every active node's load
            // over it (the placement did not change within it) and the tunnels on no node,
            // then every tunnel's α.
            let node_load = |g: &Vec<usize>| {
                let minutes = step * tau..(step + 1) * tau;
                minutes
                    .map(|m| g.iter().map(|&i| trace.demand(m, i)).sum::<f64>())
                    .sum::<f64>()
                    / tau as f64
            };
            sizer.observe_step(groups.iter().map(node_load), stranded);
            for (i, &id) in ids.iter().enumerate() {
                if trace.arrival(i) > t {
                    continue;
                }
                let alpha = measured(step, i);
                cluster.set_alpha(id, sizer.size(id, alpha, caps[i]))?;
                cluster.set_spread(id, sizer.spread(id))?;
                cluster.set_settling(id, false)?;
                usage.record(id, alpha)?;
            }
            // Tunnels that arrive in the next step come in now (with Protego at their prior
            // size, settling until their first measurement).
            for (i, &id) in ids.iter().enumerate() {
                let arrival = trace.arrival(i);
                if arrival > t && arrival <= t + tau {
                    admit(&mut cluster, &sizer, policy, id, caps[i])?;
                }
            }
            cluster.advance(now);
            let before: BTreeMap<TunnelId, Option<NodeId>> =
                cluster.tunnels().map(|(t, st)| (t, st.node)).collect();
            let hint = sizer.hint();
            let plan =
                planner.plan_with(&cluster, &usage, now, last_consolidation, hint.as_ref())?;
            cluster.apply_plan(&plan)?;
            if plan.consolidation.is_some() {
                last_consolidation = Some(now);
            }
            // A tunnel that ends the step on another node moved once, however many times the
            // plan and the drain moved it.
            stats.migrations = to_u32(
                cluster
                    .tunnels()
                    .filter(|(t, st)| {
                        matches!((before.get(t).copied().flatten(), st.node),
                            (Some(a), Some(b)) if a != b)
                    })
                    .count(),
            );
        }
        progress(Progress {
            run: &label,
            minute: t + 1,
            minutes: trace.minutes(),
        });
    }
    Ok(judge.finish(policy, config.consolidation_minutes()))
}

/// Adds a tunnel before its first minute. With [`Policy::Protego`], under every sizing rule,
/// at its prior size ([`Sizer::prior`]) and settling until its first measurement (issue 24);
/// the paper's algorithm, as published, places it at 0 as any other tunnel.
fn admit(
    cluster: &mut Cluster,
    sizer: &Sizer,
    policy: Policy,
    id: TunnelId,
    cap: f64,
) -> Result<(), ProvisionError> {
    if policy == Policy::Paper {
        return cluster.add_tunnel(id, 0.0);
    }
    cluster.add_tunnel(id, sizer.prior(cap))?;
    cluster.set_settling(id, true)
}

/// Tunnel `i`'s measurement at the end of `step` (of `tau` minutes): its mean demand over the
/// step's minutes from its arrival on (a tunnel measured only while it exists); 0 for a step
/// that ends before its arrival.
fn measurement(trace: &Trace, tau: usize, step: usize, i: usize) -> f64 {
    let end = (step + 1) * tau;
    let start = (step * tau).max(trace.arrival(i));
    if start >= end {
        return 0.0;
    }
    (start..end).map(|m| trace.demand(m, i)).sum::<f64>() / (end - start) as f64
}

/// One VM pair per tunnel that exists: capacity twice its caps, nothing ever violated.
fn run_dedicated(trace: &Trace, config: &SimConfig) -> Run {
    let minutes: Vec<MinuteStats> = (0..trace.minutes())
        .map(|m| {
            let capacity = trace.dedicated_capacity() - not_arrived(trace, m);
            let tunnels = existing(trace, m);
            MinuteStats {
                demand_gbps: trace.minute(m).iter().sum(),
                active_gbps: capacity,
                reserved_gbps: capacity,
                active_nodes: tunnels.saturating_mul(2),
                tunnels,
                ..MinuteStats::default()
            }
        })
        .collect();
    let existed = existence(trace, config);
    let summary = summarize(trace, config, &minutes, &existed, &existed);
    Run {
        policy: Policy::Dedicated,
        consolidation_minutes: 0,
        minutes,
        summary,
    }
}

/// Fixed nodes for the peak, re-balanced every minute on the previous minute's demand.
fn run_static_peak(trace: &Trace, config: &SimConfig) -> Run {
    let limit = config.planner.limit();
    let nodes = (((trace.peak_total() - LOAD_TOLERANCE) / limit)
        .ceil()
        .max(1.0)) as usize;
    let count = to_u32(nodes);
    let mut judge = Judge::new(trace, config);
    for t in 0..trace.minutes() {
        let previous = trace.minute(t.saturating_sub(1));
        let mut order: Vec<(usize, f64)> = previous.iter().copied().enumerate().collect();
        order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut loads: Vec<f64> = vec![0.0; nodes];
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); nodes];
        for (i, d) in order {
            let (k, _) = loads
                .iter()
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(&b.0)))
                .unwrap_or((0, &0.0));
            loads[k] += d;
            groups[k].push(i);
        }
        judge.minute(t, &groups, count, count);
    }
    judge.finish(Policy::StaticPeak, 0)
}

/// `⌈total demand / node capacity⌉` nodes every minute, everything served.
fn run_lower_bound(trace: &Trace, config: &SimConfig) -> Run {
    let capacity = config.planner.node_capacity;
    let minutes: Vec<MinuteStats> = (0..trace.minutes())
        .map(|m| {
            let demand: f64 = trace.minute(m).iter().sum();
            let nodes = to_u32(((demand - LOAD_TOLERANCE) / capacity).ceil().max(0.0) as usize);
            MinuteStats {
                demand_gbps: demand,
                active_gbps: f64::from(nodes) * capacity,
                reserved_gbps: f64::from(nodes) * capacity,
                active_nodes: nodes,
                tunnels: existing(trace, m),
                ..MinuteStats::default()
            }
        })
        .collect();
    let existed = existence(trace, config);
    let summary = summarize(trace, config, &minutes, &existed, &existed);
    Run {
        policy: Policy::LowerBound,
        consolidation_minutes: 0,
        minutes,
        summary,
    }
}

mod judge;

#[cfg(test)]
mod arrival_tests;
#[cfg(test)]
mod tests;
