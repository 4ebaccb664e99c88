//! Adaptive sizing and reserve (issue 24): each tunnel is packed at its measurement with a
//! headroom predicted from its own history, which it shares with the other tunnels of its node
//! (the node's level is `Σ α + √(Σ headroom²)`, [`crate::Fill`]); a calibrator scales every
//! headroom so that the share of steps with a saturated node meets the guarantee target, and a
//! forecast of the aggregate's rise over the node start latency tells the planner how many
//! nodes to keep ready. Pure and deterministic: the caller feeds one step at a time.
//!
//! # The parts
//!
//! - [`DecayHist`]: a histogram of values in `[−1, 1]` with 48 fixed bins (geometric in `|x|`,
//!   fine near 0) and exponential forgetting; 204 bytes.
//! - Per tunnel: the step-to-step changes of its measurement α, in units of its cap σ, in a
//!   [`DecayHist`]. Its size is α and its headroom (spread) `min(σ · k · q, σ − α)`, with `q`
//!   the [`RISE_QUANTILE`] of its own rises, or of the population's while it has fewer than
//!   [`MIN_SAMPLES`] of its own, or `q = 0` (the tunnel at its measurement, the paper's sizing)
//!   while the population has fewer than [`MIN_SAMPLES`] rises: sizing every tunnel at its cap
//!   until then would activate nodes for load that is not there (about 210 bytes per tunnel,
//!   beside its usage histogram). Headrooms add as standard deviations do: a node of n
//!   tunnels with headroom h each is filled to `Σ α + h · √n`, not `Σ α + n · h`, because its
//!   tunnels rarely all rise at once; the calibrator makes up for tunnels that do.
//! - The calibrator (adaptive conformal inference, Gibbs & Candès 2021): after every step,
//!   `k ← clamp(k + γ · (e − r), K_MIN, K_MAX)`, where `e` is 1 when any active node was
//!   saturated in the step ([`saturated`]) or a tunnel was on no active node (stranded, waiting
//!   for one), and `r = SATURATED_PER_VIOLATION · (1 − G*)` with G* the guarantee target
//!   ([`crate::PlannerConfig::guarantee_target`]). In the long run the share of saturated
//!   steps is `r` (unless `k` sits at a bound).
//! - The aggregate: the sum of the sizes (the measurements), its largest rise within the next
//!   `h` steps (`h = ⌈start latency / τ⌉ + 1`: the steps a node takes to start, plus the one in
//!   which the need shows) in units of the sum of the caps, in a [`DecayHist`] that forgets
//!   over a day ([`AGGREGATE_HALF_LIFE`]), at its [`AGGREGATE_QUANTILE`]; with the measured
//!   fragmentation (active nodes per node needed for the sized load, `⌈S / limit⌉`) it gives the
//!   nodes to keep ready ([`ReserveHint`]). No tunnel is assumed independent of another.
//! - The prior ([`Prior`]): a new tunnel, before its first measurement, is sized at the
//!   [`RISE_QUANTILE`] of earlier tunnels' first measurements (relative to their caps), or at
//!   its cap until [`MIN_SAMPLES`] tunnels were seen. It is the [`crate::Sizer`]'s, learned and
//!   used under every sizing rule (issue 24), not only this one.
//!
//! # Order of calls, once per τ
//!
//! 1. [`Forecaster::observe_step`] with the load of every active node over the step just
//!    served and the number of tunnels that were on no active node in it (it updates `k`,
//!    closes the previous step's aggregate and advances the forgetting: nothing else needs
//!    calling once per step);
//! 2. [`Forecaster::size`] for every measured tunnel (its size for the next step);
//!    [`crate::Sizer::prior`] for a tunnel not yet measured;
//! 3. [`Forecaster::hint`] for the planner's reserve.
//!
//! The parameters are fixed from first principles, before any evaluation; docs/provisioning.md
//! ("Adaptive sizing") gives the reasons.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::error::ProvisionError;
use crate::ids::TunnelId;
use crate::planner::PlannerConfig;

/// The quantile of a tunnel's own rises its prediction uses: the highest that an hour of
/// forgetting memory still estimates from several samples (about 170 effective samples at
/// τ = 1 minute, so about 9 beyond it); a higher one would rest on one or two rises.
pub const RISE_QUANTILE: f64 = 0.95;
/// Rises a tunnel needs before its own quantile is used (and tunnels seen before the prior
/// is): `1 / (1 − RISE_QUANTILE)`, the fewest samples with one beyond the quantile.
pub const MIN_SAMPLES: u32 = 20;
/// A node is saturated when its load over the step is at least this share of its capacity.
/// Live, a node's measured load cannot exceed its capacity (the excess is dropped), so an
/// overload shows as a load at the ceiling; the 2 % margin takes measurement rounding and a
/// saturation during part of the step.
pub const SATURATION: f64 = 0.98;
/// Saturated steps the calibrator allows per violation minute the guarantee allows: its
/// target share of saturated steps is `SATURATED_PER_VIOLATION · (1 − G*)` (at most one half).
/// A saturated node under-serves only the tunnels above their fair share, and a violation
/// minute needs 1 % of all tunnels under-served, so saturated steps are more frequent than
/// violation minutes. Chosen on the tune seeds of the `paper`, `bursty` and `together`
/// families at 10-minute consolidation (docs/provisioning.md, "Evaluation on the trace
/// families"): with 1 the guarantee came out at 98.2–99.5 % for G* = 0.97, paid in saving;
/// with 2 at 96.3–98.7 %.
pub const SATURATED_PER_VIOLATION: f64 = 2.0;
/// The calibrator's floor: `k = 0` is sizing by the last measurement, the paper's.
pub const K_MIN: f64 = 0.0;
/// The calibrator's ceiling: three times a tunnel's 95 % rise (≈ 5 standard deviations for a
/// normal one); rises beyond it are jumps the quantile does not describe, left to hotspot
/// relief and the reserve.
pub const K_MAX: f64 = 3.0;
/// The calibrator's start: every tunnel's own 95 % rise as it is.
pub const K_START: f64 = 1.0;
/// How far the share of saturated steps may stray from its target over a day, which fixes
/// γ through the bound of adaptive conformal inference: `|mean(e) − r| ≤ (W + γ) / (γ T)`
/// over `T` steps with `k` in a range of width `W`; `γ = W / (DAILY_SLACK · T_day)` makes it
/// one point of guarantee per day.
pub const DAILY_SLACK: f64 = 0.01;
/// The forgetting of the rise histograms, as a time: long enough for [`RISE_QUANTILE`] to rest
/// on several samples, short against the diurnal cycle (hours).
pub const HALF_LIFE: Duration = Duration::from_secs(3600);
/// The forgetting of the aggregate's rises, as a time: a day. Surges that come a few times a
/// day (a tenant group bursting as one, the morning ramp) are rare within an hour's memory,
/// and a reserve sized from an hour would forget them between two of them. Chosen with
/// [`AGGREGATE_QUANTILE`] on the families' tune seeds (docs/provisioning.md): against an
/// hour and the reserve's ε, it keeps 1.5–4 Gbit/s more in inactive nodes on the `together`
/// traces, for fewer minutes waiting for a node to start.
pub const AGGREGATE_HALF_LIFE: Duration = Duration::from_secs(86_400);
/// The quantile of the aggregate's rise the reserve hint covers (see
/// [`AGGREGATE_HALF_LIFE`]): about 14 rises a day beyond it at τ = 1 minute.
pub const AGGREGATE_QUANTILE: f64 = 0.99;
/// The forgetting of the prior, in new tunnels: about 150 effective tunnels, so its 95 %
/// quantile rests on several.
pub const PRIOR_HALF_LIFE_TUNNELS: f64 = 50.0;
/// The longest aggregate horizon `h` in steps (the ring of aggregate sums is bounded).
pub const MAX_HORIZON: usize = 512;

/// Bins of a [`DecayHist`], half for negative values.
const BINS: usize = 48;
const HALF: usize = BINS / 2;
/// The first bin edge above 0; the others are geometric up to 1.
const SMALLEST: f64 = 1e-3;
/// Weights are rescaled when the next sample's weight passes this.
const RESCALE: f32 = 1e30;

/// Whether a node with `load` over the step (in the unit of `capacity`) was saturated:
/// `load ≥ SATURATION · capacity`. The same test for the simulator's true loads and a live
/// node's measured ones (see [`SATURATION`]).
pub fn saturated(load: f64, capacity: f64) -> bool {
    load >= SATURATION * capacity
}

/// A histogram of values in `[−1, 1]` (clamped) with exponential forgetting: 48 bins,
/// geometric in `|x|` from 0.001 to 1 (each about 35 % wider than the one inside it), with
/// 0.001-wide bins on either side of 0. Forgetting is lazy: a sample is added with weight `w`,
/// and [`DecayHist::tick`] multiplies `w` by `2^(1/half-life)`; so it is O(1), and a quantile
/// is a walk over the bins.
#[derive(Debug, Clone, PartialEq)]
pub struct DecayHist {
    bins: [f32; BINS],
    total: f32,
    /// The weight of the next sample.
    weight: f32,
    /// `2^(−1/half-life)`.
    keep: f32,
}

impl DecayHist {
    /// An empty histogram whose samples lose half their weight every `half_life` ticks
    /// (`half_life` above zero; infinity: no forgetting).
    pub fn new(half_life: f64) -> Self {
        let keep = if half_life.is_finite() && half_life > 0.0 {
            0.5f64.powf(1.0 / half_life) as f32
        } else {
            1.0
        };
        Self {
            bins: [0.0; BINS],
            total: 0.0,
            weight: 1.0,
            keep,
        }
    }

    /// Adds `x` (clamped to `[−1, 1]`; a NaN is dropped).
    pub fn add(&mut self, x: f64) {
        if x.is_nan() {
            return;
        }
        let bin = bin_of(x.clamp(-1.0, 1.0));
        self.bins[bin] += self.weight;
        self.total += self.weight;
    }

    /// One step of forgetting: samples added from now on weigh `2^(1/half-life)` times more.
    pub fn tick(&mut self) {
        self.weight /= self.keep;
        if self.weight > RESCALE {
            let scale = 1.0 / self.weight;
            for b in &mut self.bins {
                *b *= scale;
            }
            self.total *= scale;
            self.weight = 1.0;
        }
    }

    /// Adds `x` and ticks: a histogram that forgets per sample (a NaN is dropped, with no
    /// tick).
    pub fn push(&mut self, x: f64) {
        if x.is_nan() {
            return;
        }
        self.add(x);
        self.tick();
    }

    /// The total weight, relative to the next sample's (so `n` samples without forgetting
    /// weigh `n`).
    pub fn mass(&self) -> f64 {
        f64::from(self.total) / f64::from(self.weight)
    }

    /// The `p`-quantile (`p` in `[0, 1]`), interpolated linearly within its bin; `None` when
    /// empty.
    pub fn quantile(&self, p: f64) -> Option<f64> {
        if self.total <= 0.0 {
            return None;
        }
        let target = p.clamp(0.0, 1.0) * f64::from(self.total);
        let mut below = 0.0f64;
        let mut last = 0;
        for (i, &w) in self.bins.iter().enumerate() {
            let w = f64::from(w);
            if w <= 0.0 {
                continue;
            }
            last = i;
            if below + w >= target {
                let (lo, hi) = bin_edges(i);
                let frac = ((target - below) / w).clamp(0.0, 1.0);
                return Some(lo + frac * (hi - lo));
            }
            below += w;
        }
        // Rounding left the target just above the sum: the top of the highest bin.
        Some(bin_edges(last).1)
    }
}

/// The ratio of successive geometric bin edges: `SMALLEST · RATIO^(HALF − 1) = 1`.
fn ratio() -> f64 {
    (1.0 / SMALLEST).powf(1.0 / (HALF - 1) as f64)
}

/// `[lo, hi)` of the non-negative side's bin `j` (0 is `[0, SMALLEST)`).
fn side_edges(j: usize) -> (f64, f64) {
    let r = ratio();
    let edge = |k: usize| {
        if k + 1 >= HALF {
            1.0
        } else {
            SMALLEST * r.powi(k as i32)
        }
    };
    let lo = if j == 0 { 0.0 } else { edge(j - 1) };
    (lo, edge(j))
}

/// Which side bin `|x|` falls in.
fn side_bin(a: f64) -> usize {
    if a < SMALLEST {
        return 0;
    }
    let j = 1 + ((a / SMALLEST).ln() / ratio().ln()).floor() as usize;
    j.min(HALF - 1)
}

/// The bin of `x` in `[−1, 1]`: bins ascend with `x`, `HALF` is `[0, SMALLEST)`.
fn bin_of(x: f64) -> usize {
    if x >= 0.0 {
        HALF + side_bin(x)
    } else {
        HALF - 1 - side_bin(-x)
    }
}

/// The edges of bin `i`, ascending.
fn bin_edges(i: usize) -> (f64, f64) {
    if i >= HALF {
        side_edges(i - HALF)
    } else {
        let (lo, hi) = side_edges(HALF - 1 - i);
        (-hi, -lo)
    }
}

/// A forecaster's parameters, derived from the planner's ([`ForecastConfig::from_planner`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ForecastConfig {
    /// A node's capacity (the unit of every load).
    pub node_capacity: f64,
    /// A node's fill limit, `T_H · node capacity`.
    pub limit: f64,
    /// G*: the guarantee to aim for (the share of minutes with 99 % of the tunnels served), in
    /// `(0, 1)`; the calibrator aims at `SATURATED_PER_VIOLATION · (1 − G*)` saturated steps.
    pub guarantee_target: f64,
    /// h: the aggregate forecast's horizon in steps, 1 to [`MAX_HORIZON`].
    pub horizon: usize,
    /// The half-life of the rise histograms, in steps.
    pub half_life: f64,
    /// The half-life of the aggregate's rises, in steps ([`AGGREGATE_HALF_LIFE`]).
    pub aggregate_half_life: f64,
    /// γ: the calibrator's step.
    pub gamma: f64,
}

impl ForecastConfig {
    /// The parameters for a planner: G*, ε, T_H and the node capacity are the planner's;
    /// `h = ⌈start latency / τ⌉ + 1`; the half-life is [`HALF_LIFE`] in steps of τ;
    /// `γ = (K_MAX − K_MIN) / (DAILY_SLACK · steps per day)`. Errors: an invalid planner
    /// configuration, or a horizon above [`MAX_HORIZON`].
    pub fn from_planner(config: &PlannerConfig) -> Result<Self, ProvisionError> {
        config.validate()?;
        let tau = config.tau.as_secs_f64();
        let horizon = (config.start_latency.as_secs_f64() / tau).ceil() as usize + 1;
        if horizon > MAX_HORIZON {
            return Err(ProvisionError::InvalidConfig {
                field: "start_latency",
                value: format!("{:?}", config.start_latency),
                reason: "more than 511 steps of tau: the aggregate forecast's horizon is bounded",
            });
        }
        let steps_per_day = 86_400.0 / tau;
        Ok(Self {
            node_capacity: config.node_capacity,
            limit: config.limit(),
            guarantee_target: config.guarantee_target,
            horizon,
            half_life: (HALF_LIFE.as_secs_f64() / tau).max(1.0),
            aggregate_half_life: (AGGREGATE_HALF_LIFE.as_secs_f64() / tau).max(1.0),
            gamma: (K_MAX - K_MIN) / (DAILY_SLACK * steps_per_day),
        })
    }
}

/// What the aggregate forecast asks the planner's reserve for (see [`Forecaster::hint`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReserveHint {
    /// Nodes to keep reserved (active + inactive + starting).
    pub nodes: u32,
    /// The sum of the sizes now, in the unit of the node capacity.
    pub level: f64,
    /// The forecast rise of that sum within the horizon (its [`AGGREGATE_QUANTILE`]), same
    /// unit.
    pub rise: f64,
    /// The horizon, in steps.
    pub horizon: u32,
    /// Active nodes per node needed for the sized load, `active / max(1, ⌈S / limit⌉)` (at
    /// least 1), as measured.
    pub fragmentation: f64,
}

/// The calibrator's state (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// The multiplier of every tunnel's rise quantile, in `[K_MIN, K_MAX]`.
    pub k: f64,
    /// γ.
    pub gamma: f64,
    /// The target share of saturated steps, `SATURATED_PER_VIOLATION · (1 − G*)` (at most 0.5).
    pub target: f64,
    /// Steps observed (with at least one active node).
    pub steps: u64,
    /// Of them, steps with a saturated node or a stranded tunnel.
    pub saturated_steps: u64,
}

/// What the forecaster keeps of one tunnel.
#[derive(Debug, Clone, PartialEq)]
struct TunnelForecast {
    /// The last measurement, in units of the cap.
    last: f32,
    /// The headroom of its last size, in the caller's unit (see [`Forecaster::spread`]).
    spread: f32,
    /// Step-to-step changes, in units of the cap.
    rises: DecayHist,
    /// How many changes it has seen (saturating).
    samples: u32,
}

/// The per-tunnel forecasts, the calibrator and the aggregate forecast (see the module docs).
#[derive(Debug, Clone)]
pub struct Forecaster {
    config: ForecastConfig,
    tunnels: HashMap<TunnelId, TunnelForecast>,
    calibration: Calibration,
    /// Every tunnel's rises, pooled (forgets per step): the prior for a tunnel's own.
    pooled: DecayHist,
    pooled_samples: u32,
    aggregate: Aggregate,
}

/// The aggregate forecast's state.
#[derive(Debug, Clone)]
struct Aggregate {
    /// The sums of the sizes of the last closed steps, oldest first (at most `h + 1`).
    ring: VecDeque<f64>,
    /// Largest rise within `h` steps, in units of the sum of the caps.
    rises: DecayHist,
    samples: u32,
    /// The step being sized: the sum of the sizes, of the caps, and how many tunnels.
    sized: f64,
    caps: f64,
    count: usize,
    /// Active nodes per node needed for the sized load, exponentially weighted.
    fragmentation: Option<f64>,
}

impl Forecaster {
    /// A forecaster with `config` (see [`ForecastConfig::from_planner`]).
    pub fn new(config: ForecastConfig) -> Self {
        let target = (SATURATED_PER_VIOLATION * (1.0 - config.guarantee_target)).min(0.5);
        Self {
            calibration: Calibration {
                k: K_START,
                gamma: config.gamma,
                target,
                steps: 0,
                saturated_steps: 0,
            },
            pooled: DecayHist::new(config.half_life),
            pooled_samples: 0,
            aggregate: Aggregate {
                ring: VecDeque::with_capacity(config.horizon + 1),
                rises: DecayHist::new(config.aggregate_half_life),
                samples: 0,
                sized: 0.0,
                caps: 0.0,
                count: 0,
                fragmentation: None,
            },
            tunnels: HashMap::new(),
            config,
        }
    }

    /// Its parameters.
    pub fn config(&self) -> &ForecastConfig {
        &self.config
    }

    /// The calibrator's state.
    pub fn calibration(&self) -> Calibration {
        self.calibration
    }

    /// Starts a step: `loads` are the loads of the active nodes over the step just served (in
    /// the unit of the node capacity), placed by the sizes of the step before, and `stranded`
    /// the tunnels that were on no active node in it (waiting for a node: live, the tunnels
    /// with a CHILD_SA that no active node holds). Updates `k` (when there was an active node
    /// or a stranded tunnel: the step is an error when a node was saturated or a tunnel
    /// stranded), closes the previous step's aggregate and advances the forgetting of the
    /// pooled rises.
    pub fn observe_step(&mut self, loads: impl IntoIterator<Item = f64>, stranded: usize) {
        let mut active = 0usize;
        let mut any = stranded > 0;
        for load in loads {
            active += 1;
            any |= saturated(load, self.config.node_capacity);
        }
        let c = &mut self.calibration;
        if active > 0 || stranded > 0 {
            let error = if any { 1.0 } else { 0.0 };
            c.k = (c.k + c.gamma * (error - c.target)).clamp(K_MIN, K_MAX);
            c.steps += 1;
            c.saturated_steps += u64::from(any);
        }
        let keep = 0.5f64.powf(1.0 / self.config.half_life);
        let agg = &mut self.aggregate;
        if active > 0 && agg.sized > 0.0 {
            // Against the whole nodes the load needs: a small load on one node is not
            // fragmented (its ratio to a fraction of a node would be).
            let needed = (agg.sized / self.config.limit - 1e-9).ceil().max(1.0);
            let ratio = (active as f64 / needed).max(1.0);
            agg.fragmentation = Some(match agg.fragmentation {
                Some(f) => keep * f + (1.0 - keep) * ratio,
                None => ratio,
            });
        }
        if agg.count > 0 {
            agg.ring.push_back(agg.sized);
            if agg.ring.len() > self.config.horizon {
                let base = agg.ring[0];
                let peak = agg.ring.iter().skip(1).copied().fold(f64::MIN, f64::max);
                if agg.caps > 0.0 {
                    agg.rises.push((peak - base) / agg.caps);
                    agg.samples = agg.samples.saturating_add(1);
                }
                agg.ring.pop_front();
            }
        }
        agg.sized = 0.0;
        agg.caps = 0.0;
        agg.count = 0;
        self.pooled.tick();
    }

    /// [`Forecaster::observe_step`] without stranded tunnels.
    pub fn observe_nodes(&mut self, loads: impl IntoIterator<Item = f64>) {
        self.observe_step(loads, 0);
    }

    /// Takes `tunnel`'s measurement `alpha` for the step (its cap `cap`) and returns its size
    /// for the next, `min(α, cap)`; its headroom `min(cap · k · q, cap − size)` is kept for
    /// [`Forecaster::spread`]. `q` is the tunnel's own rise quantile, else the population's,
    /// else (the population has fewer than [`MIN_SAMPLES`] rises: the first steps) 0, so the
    /// first headrooms are 0.
    pub fn size(&mut self, tunnel: TunnelId, alpha: f64, cap: f64) -> f64 {
        let floor = alpha.min(cap);
        if !(cap > 0.0 && cap.is_finite() && alpha.is_finite()) {
            return floor;
        }
        let x = (alpha / cap).clamp(0.0, 1.0);
        let quantile = match self.tunnels.get_mut(&tunnel) {
            Some(t) => {
                let rise = x - f64::from(t.last);
                t.rises.push(rise);
                t.samples = t.samples.saturating_add(1);
                t.last = x as f32;
                self.pooled.add(rise);
                self.pooled_samples = self.pooled_samples.saturating_add(1);
                if t.samples >= MIN_SAMPLES {
                    t.rises.quantile(RISE_QUANTILE)
                } else {
                    None
                }
            }
            None => {
                self.tunnels.insert(
                    tunnel,
                    TunnelForecast {
                        last: x as f32,
                        spread: 0.0,
                        rises: DecayHist::new(self.config.half_life),
                        samples: 0,
                    },
                );
                None
            }
        };
        let q = quantile
            .or_else(|| self.pooled_rise())
            .unwrap_or(0.0)
            .max(0.0);
        let spread = (cap * self.calibration.k * q).min(cap - floor).max(0.0);
        if let Some(t) = self.tunnels.get_mut(&tunnel) {
            t.spread = spread as f32;
        }
        let agg = &mut self.aggregate;
        agg.sized += floor;
        agg.caps += cap;
        agg.count += 1;
        floor
    }

    /// The headroom of `tunnel`'s last size ([`Forecaster::size`]): `min(σ · k · q, σ − α)`, in
    /// the caller's unit; 0 for a tunnel not measured. The planner packs the tunnel as
    /// `Fill::new(α, spread)` ([`crate::Fill`]), so the tunnels of a node share their headroom:
    /// the node's level is `Σ α + √(Σ spread²)`.
    pub fn spread(&self, tunnel: TunnelId) -> f64 {
        self.tunnels
            .get(&tunnel)
            .map_or(0.0, |t| f64::from(t.spread))
    }

    /// Counts a tunnel that has no new measurement this step (its node's report did not
    /// come in time) at its last size `size`, cap `cap`, in the step's aggregate only: its own
    /// forecast and the calibrator are left as they are. Without it the sum of the sizes
    /// would dip for the step and its return look like a rise.
    pub fn carry(&mut self, size: f64, cap: f64) {
        if !(cap > 0.0 && cap.is_finite() && size.is_finite()) {
            return;
        }
        let agg = &mut self.aggregate;
        agg.sized += size.clamp(0.0, cap);
        agg.caps += cap;
        agg.count += 1;
    }

    /// The population's [`RISE_QUANTILE`] rise, once it has [`MIN_SAMPLES`] rises.
    fn pooled_rise(&self) -> Option<f64> {
        (self.pooled_samples >= MIN_SAMPLES)
            .then(|| self.pooled.quantile(RISE_QUANTILE))
            .flatten()
    }

    /// Whether `tunnel` has been measured.
    pub fn is_measured(&self, tunnel: TunnelId) -> bool {
        self.tunnels.contains_key(&tunnel)
    }

    /// Forgets `tunnel` (it was removed).
    pub fn forget(&mut self, tunnel: TunnelId) {
        self.tunnels.remove(&tunnel);
    }

    /// The nodes to keep ready for the horizon, once the aggregate has [`MIN_SAMPLES`] rises
    /// and the current step has sizes: `⌈(f · S + Q) / limit⌉` with `S` the sum of this step's
    /// sizes, `Q` the [`AGGREGATE_QUANTILE`] of its rise within `h` steps and `f` the measured
    /// fragmentation (the placement's overhead on the load placed now; the rise is new load,
    /// packed onto fresh nodes).
    pub fn hint(&self) -> Option<ReserveHint> {
        let agg = &self.aggregate;
        if agg.samples < MIN_SAMPLES || agg.count == 0 {
            return None;
        }
        let q = agg.rises.quantile(AGGREGATE_QUANTILE)?.max(0.0);
        let rise = q * agg.caps;
        let fragmentation = agg.fragmentation.unwrap_or(1.0).max(1.0);
        let nodes = ((fragmentation * agg.sized + rise) / self.config.limit - 1e-9)
            .ceil()
            .max(0.0);
        Some(ReserveHint {
            nodes: if nodes >= f64::from(u32::MAX) {
                u32::MAX
            } else {
                nodes as u32
            },
            level: agg.sized,
            rise,
            horizon: u32::try_from(self.config.horizon).unwrap_or(u32::MAX),
            fragmentation,
        })
    }
}

/// The population prior: the size of a tunnel not yet measured, learned from earlier tunnels'
/// first measurements relative to their caps (forgetting per tunnel, with
/// [`PRIOR_HALF_LIFE_TUNNELS`]). A [`crate::Sizer`] keeps one under every sizing rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Prior {
    /// New tunnels' first measurements relative to their caps.
    levels: DecayHist,
    seen: u32,
}

impl Default for Prior {
    fn default() -> Self {
        Self::new()
    }
}

impl Prior {
    /// A prior that has seen no tunnel (it sizes every tunnel at its cap).
    pub fn new() -> Self {
        Self {
            levels: DecayHist::new(PRIOR_HALF_LIFE_TUNNELS),
            seen: 0,
        }
    }

    /// Takes a new tunnel's first measurement `alpha` (its cap `cap`); a cap that is not
    /// positive and finite, or a measurement that is not finite, teaches nothing.
    pub fn observe(&mut self, alpha: f64, cap: f64) {
        if !(cap > 0.0 && cap.is_finite() && alpha.is_finite()) {
            return;
        }
        self.levels.push((alpha / cap).clamp(0.0, 1.0));
        self.seen = self.seen.saturating_add(1);
    }

    /// The size of a tunnel not yet measured, with cap `cap`: the [`RISE_QUANTILE`] of earlier
    /// tunnels' first measurements relative to their caps, times `cap`; `cap` itself until
    /// [`MIN_SAMPLES`] tunnels were seen.
    pub fn size(&self, cap: f64) -> f64 {
        let level = (self.seen >= MIN_SAMPLES)
            .then(|| self.levels.quantile(RISE_QUANTILE))
            .flatten()
            .unwrap_or(1.0)
            .clamp(0.0, 1.0);
        cap * level
    }
}

#[cfg(test)]
mod tests;
