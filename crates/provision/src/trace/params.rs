//! The parameters of the trace generator ([`TraceParams`]) and their validation.

use super::{TraceError, MAX_TRACE_ENTRIES};

/// The parameters of the trace generator. Every tunnel's demand in minute `t` is
///
/// ```text
/// d_i(t) = min(cap, s · w_i · D_i(t) · S_i(t) · J_i(t) · B_i(t))
/// ```
///
/// - `w_i`: the tunnel's **mean weight**, lognormal with mean 1 and log-standard deviation
///   [`mean_log_sd`](Self::mean_log_sd): heavy-tailed, so a few tunnels carry much of the
///   traffic (some of them up to their cap) and many carry little.
/// - `D_i(t) = 1 + a_i · cos(2π (t − p_g) / day)`: the **diurnal pattern**, amplitude `a_i`
///   uniform in [`diurnal_amplitude`](Self::diurnal_amplitude), peak `p_g` shared by the
///   tunnel's tenant group, uniform within ±[`peak_spread_minutes`](Self::peak_spread_minutes)
///   of [`peak_minute`](Self::peak_minute). Its mean over a day is 1.
/// - `S_i(t)`: **slow variation**, lognormal with mean 1 and log-standard deviation
///   [`slow_sd`](Self::slow_sd), an AR(1) process in log space with correlation time
///   [`slow_minutes`](Self::slow_minutes). Its log is `√c · G_g(t) + √(1 − c) · E_i(t)`:
///   `G_g` is shared by the tunnel's **tenant group** (one of [`groups`](Self::groups),
///   assigned at random), `E_i` is the tunnel's own, and `c` is
///   [`group_correlation`](Self::group_correlation), the correlation of the slow variation of
///   two tunnels of one group.
/// - `J_i(t)`: **jitter**, independent every minute, lognormal with mean 1 and
///   log-standard deviation [`jitter_sd`](Self::jitter_sd).
/// - `B_i(t)`: **bursts**: each minute a tunnel not in a burst starts one with probability
///   `bursts_per_day / minutes_per_day`; a burst lasts a number of minutes drawn by
///   [`burst_length`](Self::burst_length) (by default geometric of mean
///   [`burst_minutes`](Self::burst_minutes)) and multiplies the demand by a factor drawn by
///   [`burst_height`](Self::burst_height) (by default uniform in
///   [`burst_factor`](Self::burst_factor)); 1 outside bursts.
/// - `s`: one **scale** for all tunnels, found by bisection so that the mean aggregate demand
///   after capping is [`mean_total_gbps`](Self::mean_total_gbps).
/// - `cap`: every tunnel's cap [`cap_gbps`](Self::cap_gbps) (its rate limit), or one of
///   [`cap_mix`](Self::cap_mix).
///
/// The paper's model stops there. The other families ([`super::TraceFamily`]) add parts that
/// are off by default (`None`, empty), multiplying the product above by:
///
/// - `O_i(t)` ([`on_off`](Self::on_off)): 0 or 1, a two-state Markov chain for a share of the
///   tunnels (a tenant that sends, then stops).
/// - `G_g(t)` ([`group_bursts`](Self::group_bursts)): bursts of a whole tenant group at once.
/// - `X(t)` ([`global_shock`](Self::global_shock)): slow variation shared by every tunnel
///   (an event that moves all tenants).
/// - `L_i(t)` ([`level_shifts`](Self::level_shifts)): a level that jumps at random times and
///   stays until the next jump (a tenant that moves a service in or out).
/// - `H_i(t)` ([`hourly_base`](Self::hourly_base)): random points every hour, linearly
///   interpolated in between (a series known only by its hourly means, as the paper's §7.4
///   describes its trace).
/// - and sets the demand of a share of the tunnels to 0 before their arrival
///   ([`arrivals`](Self::arrivals), recorded with [`super::Trace::with_arrivals`]).
///
/// With [`cap_mix`](Self::cap_mix) set, the mean weight `w_i` is also multiplied by
/// `σ_i / mean σ`, so a tunnel's demand is in proportion to its rate limit.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceParams {
    /// Number of tunnels.
    pub tunnels: usize,
    /// Number of 1-minute steps.
    pub minutes: usize,
    /// Minutes in a day (the period of the diurnal pattern).
    pub minutes_per_day: f64,
    /// Every tunnel's cap, Gbit/s (above zero).
    pub cap_gbps: f64,
    /// The mean aggregate demand to reach, Gbit/s (above zero, below `tunnels · cap_gbps`).
    pub mean_total_gbps: f64,
    /// Log-standard deviation of the per-tunnel mean weights (0: all tunnels alike).
    pub mean_log_sd: f64,
    /// Number of tenant groups (at least 1).
    pub groups: usize,
    /// Correlation of the slow variation of two tunnels of one group, in `[0, 1]`.
    pub group_correlation: f64,
    /// Range of the diurnal amplitude `a_i`, within `[0, 1]`, low ≤ high.
    pub diurnal_amplitude: (f64, f64),
    /// The minute of the day around which groups peak.
    pub peak_minute: f64,
    /// How far (minutes) a group's peak may be from `peak_minute`, either way.
    pub peak_spread_minutes: f64,
    /// Log-standard deviation of the slow variation (not negative).
    pub slow_sd: f64,
    /// Correlation time of the slow variation, minutes (above zero).
    pub slow_minutes: f64,
    /// Log-standard deviation of the per-minute jitter (not negative).
    pub jitter_sd: f64,
    /// Bursts a tunnel starts per day on average (not negative).
    pub bursts_per_day: f64,
    /// Mean length of a burst, minutes (at least 1).
    pub burst_minutes: f64,
    /// Range of the factor a burst multiplies demand by, low ≤ high, low at least 1.
    pub burst_factor: (f64, f64),
    /// How long a burst lasts.
    pub burst_length: BurstLength,
    /// How much a burst multiplies demand by.
    pub burst_height: BurstHeight,
    /// The caps of the tunnels, in turn (tunnel `i` gets `cap_mix[i % len]`); empty: every
    /// tunnel gets [`cap_gbps`](Self::cap_gbps).
    pub cap_mix: Vec<f64>,
    /// Tunnels that switch on and off.
    pub on_off: Option<OnOff>,
    /// Bursts of a whole tenant group at once.
    pub group_bursts: Option<GroupBursts>,
    /// Slow variation shared by every tunnel.
    pub global_shock: Option<GlobalShock>,
    /// Levels that jump and stay.
    pub level_shifts: Option<LevelShifts>,
    /// A base interpolated between random hourly points.
    pub hourly_base: Option<HourlyBase>,
    /// Tunnels that come into existence during the trace.
    pub arrivals: Option<Arrivals>,
}

/// A Pareto law cut at a maximum: `min(max, scale · U^(−1/shape))`, `U` uniform in (0, 1].
/// Heavy-tailed: for `shape` ≤ 2 its variance (before the cut) is infinite.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pareto {
    /// The smallest value (above zero).
    pub scale: f64,
    /// The tail index α (above zero; smaller is heavier).
    pub shape: f64,
    /// The largest value (at least `scale`).
    pub max: f64,
}

/// How long a burst lasts ([`TraceParams::burst_length`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BurstLength {
    /// Geometric, mean [`TraceParams::burst_minutes`] (the paper preset).
    Geometric,
    /// Pareto minutes, rounded down, at least 1: most bursts short, a few very long.
    Pareto(Pareto),
}

/// What a burst multiplies demand by ([`TraceParams::burst_height`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BurstHeight {
    /// Uniform in [`TraceParams::burst_factor`] (the paper preset).
    Uniform,
    /// `1 +` a Pareto draw: most bursts mild, a few far above the tunnel's usual demand (the
    /// cap still bounds the demand).
    Pareto(Pareto),
}

/// Tunnels that switch on and off ([`TraceParams::on_off`]): each minute an "on" tunnel
/// switches off with probability `1 / on_minutes`, an "off" one on with probability
/// `1 / off_minutes`; it starts in either at random in proportion. Its demand is 0 while off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OnOff {
    /// The share of the tunnels that do this, in `[0, 1]` (rounded to a whole number of
    /// tunnels, chosen at random).
    pub fraction: f64,
    /// Mean length of an "on" period, minutes (at least 1).
    pub on_minutes: f64,
    /// Mean length of an "off" period, minutes (at least 1).
    pub off_minutes: f64,
}

/// Bursts of a whole tenant group ([`TraceParams::group_bursts`]): each minute a group not in
/// a burst starts one with probability `per_day / minutes_per_day`; it lasts a geometric
/// number of minutes of mean `minutes` and multiplies the demand of every tunnel of the group
/// by one factor uniform in `factor`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupBursts {
    /// Bursts a group starts per day on average (not negative).
    pub per_day: f64,
    /// Mean length, minutes (at least 1).
    pub minutes: f64,
    /// Range of the factor, low ≤ high, low at least 1.
    pub factor: (f64, f64),
}

/// Slow variation shared by every tunnel ([`TraceParams::global_shock`]): lognormal with mean
/// 1, an AR(1) process in log space like the slow variation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GlobalShock {
    /// Log-standard deviation (not negative).
    pub sd: f64,
    /// Correlation time, minutes (above zero).
    pub minutes: f64,
}

/// Levels that jump and stay ([`TraceParams::level_shifts`]): each minute a tunnel's level
/// jumps with probability `per_day / minutes_per_day` to a new value, log-uniform in
/// `factor`, and keeps it until its next jump (the level starts at 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LevelShifts {
    /// Jumps per tunnel per day on average (not negative).
    pub per_day: f64,
    /// Range of the level after a jump, above zero, low ≤ high.
    pub factor: (f64, f64),
}

/// A base interpolated between random points ([`TraceParams::hourly_base`]): every `minutes`
/// minutes a tunnel gets a point, lognormal with mean 1 and log-standard deviation `sd`, and
/// its factor runs linearly from one point to the next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HourlyBase {
    /// Log-standard deviation of the points (not negative).
    pub sd: f64,
    /// Minutes between points (at least 1; 60 for hourly).
    pub minutes: usize,
}

/// Tunnels that come into existence during the trace ([`TraceParams::arrivals`]): a share of
/// the tunnels, chosen at random, each arriving at a minute uniform from 1 to the last.
/// Their demand is 0 before.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrivals {
    /// The share of the tunnels, in `[0, 1]` (rounded to a whole number of tunnels).
    pub fraction: f64,
}

impl TraceParams {
    /// The statistics of the paper's §7.4 trace: 170 tunnels, 24 hours at 1-minute steps,
    /// caps of 1.5 Gbit/s, a mean aggregate of 57.5 Gbit/s (the paper's 57.49).
    ///
    /// The paper gives nothing else about its trace, so the rest are assumptions, chosen
    /// before any simulation was run and not tuned to its results: per-tunnel means
    /// lognormal with log-sd 1.0 (the largest of 170 tunnels about 10× the mean, so a few sit
    /// at their cap); 12 tenant groups whose slow variation is correlated 0.5; a diurnal
    /// amplitude of 0.1–0.5 per tunnel peaking around 14:00 ± 3 h; slow variation of log-sd
    /// 0.3 with a 20-minute correlation time; per-minute jitter of log-sd 0.1; two bursts a
    /// day per tunnel of 10 minutes on average, 1.5–4× the demand.
    pub fn paper() -> Self {
        Self {
            tunnels: 170,
            minutes: 1440,
            minutes_per_day: 1440.0,
            cap_gbps: 1.5,
            mean_total_gbps: 57.5,
            mean_log_sd: 1.0,
            groups: 12,
            group_correlation: 0.5,
            diurnal_amplitude: (0.1, 0.5),
            peak_minute: 840.0,
            peak_spread_minutes: 180.0,
            slow_sd: 0.3,
            slow_minutes: 20.0,
            jitter_sd: 0.1,
            bursts_per_day: 2.0,
            burst_minutes: 10.0,
            burst_factor: (1.5, 4.0),
            burst_length: BurstLength::Geometric,
            burst_height: BurstHeight::Uniform,
            cap_mix: Vec::new(),
            on_off: None,
            group_bursts: None,
            global_shock: None,
            level_shifts: None,
            hourly_base: None,
            arrivals: None,
        }
    }

    /// Every tunnel's cap σ_i, Gbit/s, in tunnel order.
    pub fn caps(&self) -> Vec<f64> {
        if self.cap_mix.is_empty() {
            return vec![self.cap_gbps; self.tunnels];
        }
        (0..self.tunnels)
            .map(|i| self.cap_mix[i % self.cap_mix.len()])
            .collect()
    }

    /// The sum of the caps, Gbit/s (255 for the paper preset).
    pub fn cap_total(&self) -> f64 {
        self.caps().iter().sum()
    }

    /// Checks every field, naming the first that is out of range.
    pub fn validate(&self) -> Result<(), TraceError> {
        let bad = |field, value: String, reason| TraceError::InvalidParams {
            field,
            value,
            reason,
        };
        let finite_nonneg = |v: f64| v.is_finite() && v >= 0.0;
        if self.tunnels == 0 {
            return Err(bad("tunnels", "0".into(), "must be at least 1"));
        }
        if self.minutes == 0 {
            return Err(bad("minutes", "0".into(), "must be at least 1"));
        }
        if self
            .tunnels
            .checked_mul(self.minutes)
            .is_none_or(|e| e > MAX_TRACE_ENTRIES)
        {
            return Err(bad(
                "minutes",
                self.minutes.to_string(),
                "minutes × tunnels must be at most 10^7",
            ));
        }
        if !(self.minutes_per_day.is_finite() && self.minutes_per_day > 0.0) {
            return Err(bad(
                "minutes_per_day",
                self.minutes_per_day.to_string(),
                "must be finite and above zero",
            ));
        }
        if !(self.cap_gbps.is_finite() && self.cap_gbps > 0.0) {
            return Err(bad(
                "cap_gbps",
                self.cap_gbps.to_string(),
                "must be finite and above zero",
            ));
        }
        if let Some(&c) = self.cap_mix.iter().find(|&&c| !(c.is_finite() && c > 0.0)) {
            return Err(bad(
                "cap_mix",
                c.to_string(),
                "every cap must be finite and above zero",
            ));
        }
        if !(self.mean_total_gbps.is_finite()
            && self.mean_total_gbps > 0.0
            && self.mean_total_gbps < self.cap_total())
        {
            return Err(bad(
                "mean_total_gbps",
                self.mean_total_gbps.to_string(),
                "must be above zero and below the sum of the caps",
            ));
        }
        for (field, v) in [
            ("mean_log_sd", self.mean_log_sd),
            ("slow_sd", self.slow_sd),
            ("jitter_sd", self.jitter_sd),
            ("bursts_per_day", self.bursts_per_day),
            ("peak_spread_minutes", self.peak_spread_minutes),
        ] {
            if !finite_nonneg(v) || v > 1e6 {
                return Err(bad(
                    field,
                    v.to_string(),
                    "must be finite, not negative and at most 10^6",
                ));
            }
        }
        if !self.peak_minute.is_finite() {
            return Err(bad(
                "peak_minute",
                self.peak_minute.to_string(),
                "must be finite",
            ));
        }
        if self.groups == 0 {
            return Err(bad("groups", "0".into(), "must be at least 1"));
        }
        if !(0.0..=1.0).contains(&self.group_correlation) {
            return Err(bad(
                "group_correlation",
                self.group_correlation.to_string(),
                "must be in [0, 1]",
            ));
        }
        let (lo, hi) = self.diurnal_amplitude;
        if !(0.0..=1.0).contains(&lo) || !(0.0..=1.0).contains(&hi) || lo > hi {
            return Err(bad(
                "diurnal_amplitude",
                format!("({lo}, {hi})"),
                "must be within [0, 1], low <= high",
            ));
        }
        if !(self.slow_minutes.is_finite() && self.slow_minutes > 0.0) {
            return Err(bad(
                "slow_minutes",
                self.slow_minutes.to_string(),
                "must be finite and above zero",
            ));
        }
        if !(self.burst_minutes.is_finite() && self.burst_minutes >= 1.0) {
            return Err(bad(
                "burst_minutes",
                self.burst_minutes.to_string(),
                "must be finite and at least 1",
            ));
        }
        let (lo, hi) = self.burst_factor;
        if !(lo.is_finite() && hi.is_finite() && lo >= 1.0 && lo <= hi) {
            return Err(bad(
                "burst_factor",
                format!("({lo}, {hi})"),
                "must be finite, 1 <= low <= high",
            ));
        }
        self.validate_parts()
    }

    /// Checks the optional parts (see [`Self::validate`]).
    fn validate_parts(&self) -> Result<(), TraceError> {
        let bad = |field, value: String, reason| TraceError::InvalidParams {
            field,
            value,
            reason,
        };
        let pareto = |field, p: &Pareto| {
            let ok = p.scale.is_finite()
                && p.scale > 0.0
                && p.shape.is_finite()
                && p.shape > 0.0
                && p.max.is_finite()
                && p.max >= p.scale;
            if ok {
                Ok(())
            } else {
                Err(bad(
                    field,
                    format!("{p:?}"),
                    "scale and shape must be finite and above zero, max finite and >= scale",
                ))
            }
        };
        let at_least_one = |v: f64| v.is_finite() && v >= 1.0;
        // Finite, not negative and at most 10^6 (a range excludes NaN and infinities).
        let rate = |v: f64| (0.0..=1e6).contains(&v);
        let share = |v: f64| (0.0..=1.0).contains(&v);
        if let BurstLength::Pareto(p) = &self.burst_length {
            pareto("burst_length", p)?;
        }
        if let BurstHeight::Pareto(p) = &self.burst_height {
            pareto("burst_height", p)?;
        }
        if let Some(o) = &self.on_off {
            if !(share(o.fraction) && at_least_one(o.on_minutes) && at_least_one(o.off_minutes)) {
                return Err(bad(
                    "on_off",
                    format!("{o:?}"),
                    "fraction must be in [0, 1], on and off minutes finite and at least 1",
                ));
            }
        }
        if let Some(g) = &self.group_bursts {
            let (lo, hi) = g.factor;
            if !(rate(g.per_day)
                && at_least_one(g.minutes)
                && lo.is_finite()
                && hi.is_finite()
                && lo >= 1.0
                && lo <= hi)
            {
                return Err(bad(
                    "group_bursts",
                    format!("{g:?}"),
                    "per_day must be finite and not negative, minutes at least 1, \
                     1 <= low <= high",
                ));
            }
        }
        if let Some(g) = &self.global_shock {
            if !(rate(g.sd) && g.minutes.is_finite() && g.minutes > 0.0) {
                return Err(bad(
                    "global_shock",
                    format!("{g:?}"),
                    "sd must be finite and not negative, minutes finite and above zero",
                ));
            }
        }
        if let Some(l) = &self.level_shifts {
            let (lo, hi) = l.factor;
            if !(rate(l.per_day) && lo.is_finite() && hi.is_finite() && lo > 0.0 && lo <= hi) {
                return Err(bad(
                    "level_shifts",
                    format!("{l:?}"),
                    "per_day must be finite and not negative, 0 < low <= high",
                ));
            }
        }
        if let Some(h) = &self.hourly_base {
            if !rate(h.sd) || h.minutes == 0 {
                return Err(bad(
                    "hourly_base",
                    format!("{h:?}"),
                    "sd must be finite and not negative, minutes at least 1",
                ));
            }
        }
        if let Some(a) = &self.arrivals {
            if !share(a.fraction) {
                return Err(bad(
                    "arrivals",
                    format!("{a:?}"),
                    "fraction must be in [0, 1]",
                ));
            }
            if self.minutes < 2 {
                return Err(bad(
                    "minutes",
                    self.minutes.to_string(),
                    "must be at least 2 for tunnels to arrive",
                ));
            }
        }
        Ok(())
    }
}
