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
///   `bursts_per_day / minutes_per_day`; a burst lasts a geometric number of minutes of mean
///   [`burst_minutes`](Self::burst_minutes) and multiplies the demand by a factor uniform in
///   [`burst_factor`](Self::burst_factor) (1 outside bursts).
/// - `s`: one **scale** for all tunnels, found by bisection so that the mean aggregate demand
///   after capping is [`mean_total_gbps`](Self::mean_total_gbps).
/// - `cap`: every tunnel's cap [`cap_gbps`](Self::cap_gbps) (its rate limit).
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
        }
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
                "minutes × tunnels must be at most 10^8",
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
        let most = self.tunnels as f64 * self.cap_gbps;
        if !(self.mean_total_gbps.is_finite()
            && self.mean_total_gbps > 0.0
            && self.mean_total_gbps < most)
        {
            return Err(bad(
                "mean_total_gbps",
                self.mean_total_gbps.to_string(),
                "must be above zero and below tunnels × cap_gbps",
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
        Ok(())
    }
}
