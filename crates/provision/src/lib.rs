//! Elastic provisioning of data nodes (Son et al., "Protego: Cloud-Scale Multitenant IPsec
//! Gateway", ATC '17, §5): how many nodes to keep, which tunnel goes on which node, and when
//! nodes join, leave, start and stop. Pure: no I/O, no clock, no threads, no randomness; time
//! is an explicit `now: Instant` argument and every result is deterministic.
//!
//! # The model (the paper's notation)
//!
//! - Every data node has the same CPU capacity, normalized to 1 (here: any unit, given as
//!   [`PlannerConfig::node_capacity`]; all loads are in that unit).
//! - A tunnel `i` is rate limited, so its CPU usage never exceeds its cap σ_i (`0 < σ_i < 1`).
//!   Its usage α_i is measured every τ. A node `j`'s utilization is
//!   `β_j = Σ α_i` over the tunnels it holds ([`Cluster::load`]).
//! - U_i is the distribution of tunnel `i`'s usage over time: a histogram of its recent α_i
//!   samples on `[0, σ_i]` ([`UsageHistogram`], kept per tunnel in a [`UsageBook`]).
//! - Tunnels are assumed independent, so the aggregate usage is `Y = U_1 * U_2 * … * U_n`
//!   (convolution; [`aggregate()`]).
//! - ε is the tolerated probability that demand exceeds the reserve. C, the least capacity
//!   with `Pr(Y > C) <= ε` ([`capacity`]), is what must be reserved; since nodes are filled
//!   only up to the hotspot threshold T_H, `⌈C / T_H⌉` nodes are kept active or inactive
//!   ([`reserve_nodes`]).
//! - A node is a hotspot when `β_j > T_H`; its fewest largest tunnels whose sum exceeds
//!   `β_j − T_H` then move to other nodes by Best Fit ([`hotspot_selection`], [`best_fit`]).
//!   Periodically all tunnels are re-packed by Best Fit Decreasing ([`best_fit_decreasing`])
//!   and emptied nodes become inactive.
//! - Nodes are active (hold tunnels), inactive (booted, in reserve, join instantly) or shut
//!   down (minutes to start) ([`NodeState`]).
//!
//! # Using it
//!
//! ```
//! use std::time::Instant;
//! use provision::{Cluster, NodeId, NodeState, Planner, PlannerConfig, TunnelId, UsageBook};
//!
//! let planner = Planner::new(PlannerConfig::default())?;
//! let mut usage = UsageBook::new(planner.config().usage_config())?;
//! let mut cluster = Cluster::new();
//! for n in 0..3 {
//!     cluster.add_node(NodeId(n), NodeState::Inactive)?;
//! }
//! for t in 0..5 {
//!     cluster.add_tunnel(TunnelId(t), 0.2)?;
//!     usage.set_sigma(TunnelId(t), 0.3)?;
//!     usage.record(TunnelId(t), 0.2)?;
//! }
//! let now = Instant::now();
//! let plan = planner.plan(&cluster, &usage, now, None)?;
//! for decision in &plan.decisions {
//!     println!("{decision}"); // e.g. "place tunnel1 on node0: new tunnel (α = 0.2000), best fit"
//! }
//! cluster.apply_plan(&plan)?;
//! assert!(plan.unplaced.is_empty());
//! assert_eq!(cluster.counts().active, 2); // 5 × 0.2 under T_H = 0.9: two nodes
//! # Ok::<(), provision::ProvisionError>(())
//! ```
//!
//! Modules: [`usage`] (U_i), [`aggregate`](mod@aggregate) (Y, C, the reserve),
//! [`placement`] (Best Fit, BFD, hotspot selection), [`nodes`] (the node hierarchy),
//! [`cluster`] (nodes, tunnels and placement), [`plan`] (decisions and reasons),
//! [`planner`] (one provisioning step), [`sizing`] and [`forecast`] (the α a tunnel is
//! packed at, and adaptive sizing and reserve), [`trace`] (demand traces: generation and CSV),
//! [`sim`] (replaying a trace through the planner and the baselines, §7.4).

pub mod aggregate;
pub mod cluster;
mod error;
mod fft;
pub mod forecast;
mod ids;
pub mod nodes;
pub mod placement;
pub mod plan;
pub mod planner;
pub mod sim;
pub mod sizing;
pub mod trace;
pub mod usage;

pub use aggregate::{
    aggregate, aggregate_exact, aggregate_with_step, capacity, lattice_step, reserve_nodes,
    Distribution,
};
pub use cluster::{Cluster, TunnelState};
pub use error::ProvisionError;
pub use forecast::{Calibration, DecayHist, ForecastConfig, Forecaster, ReserveHint};
pub use ids::{NodeId, TunnelId};
pub use nodes::{NodeCounts, NodePlan, NodeState};
pub use placement::{
    best_fit, best_fit_decreasing, best_fit_decreasing_onto, fits, hotspot_selection,
    volume_lower_bound, Fill, Size, FIT_TOLERANCE,
};
pub use plan::{Action, ById, ConsolidationOutcome, Decision, Names, Plan, Reason, Reservation};
pub use planner::{ConsolidationMode, Planner, PlannerConfig};
pub use sim::{
    compare, run_policy, sweep, Comparison, MinuteStats, Policy, Progress, Run, SimConfig,
    SimError, Summary, SweepRow,
};
pub use sizing::{Defaults, Sizer, Sizing};
pub use trace::{generate, Trace, TraceError, TraceParams};
pub use usage::{UsageBook, UsageConfig, UsageHistogram, DEFAULT_BINS, DEFAULT_WINDOW, MAX_BINS};
