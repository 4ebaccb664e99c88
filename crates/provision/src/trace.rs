//! Demand traces for the provisioning simulator ([`crate::sim`]): the throughput of every
//! tunnel, minute by minute, in Gbit/s, with each tunnel's cap (its rate limit, σ_i).
//!
//! Production traces (the paper's §7.4 used 24 hours of 170 tunnels from one data centre) are
//! not public, so this module also **generates** traces ([`generate`], [`TraceParams`]) with
//! the features that decide how hard elastic provisioning is: a diurnal pattern, heavy-tailed
//! per-tunnel means, slow and fast variation, bursts up to the cap, and tenants whose tunnels
//! move together. [`TraceParams::paper`] matches the statistics the paper gives (170 tunnels,
//! 24 h at 1-minute steps, caps of 1.5 Gbit/s, a mean aggregate of about 57.5 Gbit/s).
//!
//! Traces are read and written as CSV with the header `minute,tunnel,gbps`
//! ([`Trace::from_csv`], [`Trace::to_csv`]); this module only turns text into a trace and
//! back: reading files is the caller's business.
//!
//! Everything here is pure and deterministic: the generator draws from its own seeded PRNG
//! (xoshiro256\*\*, seeded through SplitMix64), so a seed always gives the same trace on every
//! platform.

use core::fmt;
use std::collections::BTreeMap;

/// The most entries (minutes × tunnels) a trace may hold: 10⁷ (e.g. 170 tunnels for 40 days),
/// about 160 MB while a CSV is read. A CSV asking for more (a stray huge minute or tunnel
/// number) is rejected instead of allocated.
pub const MAX_TRACE_ENTRIES: usize = 10_000_000;

/// The CSV header of a trace.
pub const CSV_HEADER: &str = "minute,tunnel,gbps";

/// What trace building, parsing or generation rejects.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TraceError {
    /// A CSV line that is not a valid trace row (lines count from 1).
    #[error("trace CSV line {line}: {reason}")]
    Csv {
        /// The line number, from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A generator parameter out of range.
    #[error("trace generator: {field} = {value}: {reason}")]
    InvalidParams {
        /// The field of [`TraceParams`].
        field: &'static str,
        /// The rejected value, as written.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A trace whose shape or values are inconsistent (see [`Trace::new`]).
    #[error("trace: {0}")]
    Invalid(String),
}

/// Demand of every tunnel in every minute (see the module docs).
///
/// Tunnels are kept in the order of their identifiers; `index` arguments are positions in that
/// order (0 to `tunnels() − 1`), identifiers are what the CSV calls `tunnel`.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    ids: Vec<u32>,
    caps: Vec<f64>,
    minutes: usize,
    /// Minute-major: `demand[minute * tunnels + index]`.
    demand: Vec<f64>,
    /// The minute each tunnel comes into existence (0 for all unless set with
    /// [`Trace::with_arrivals`]); its demand is 0 before.
    arrivals: Vec<usize>,
}

impl Trace {
    /// A trace from its parts: tunnel identifiers (strictly increasing), their caps (finite,
    /// above zero), the number of minutes (at least 1) and the demands, minute-major
    /// (`demand[minute * ids.len() + index]`; each finite, not negative and not above the
    /// tunnel's cap).
    pub fn new(
        ids: Vec<u32>,
        caps: Vec<f64>,
        minutes: usize,
        demand: Vec<f64>,
    ) -> Result<Self, TraceError> {
        if ids.is_empty() {
            return Err(TraceError::Invalid("no tunnels".into()));
        }
        if minutes == 0 {
            return Err(TraceError::Invalid("no minutes".into()));
        }
        if caps.len() != ids.len() {
            return Err(TraceError::Invalid(format!(
                "{} caps for {} tunnels",
                caps.len(),
                ids.len()
            )));
        }
        if ids.windows(2).any(|w| w[0] >= w[1]) {
            return Err(TraceError::Invalid(
                "tunnel identifiers must be strictly increasing".into(),
            ));
        }
        let entries = minutes
            .checked_mul(ids.len())
            .filter(|&e| e <= MAX_TRACE_ENTRIES);
        if entries != Some(demand.len()) {
            return Err(TraceError::Invalid(format!(
                "{} demands for {} minutes × {} tunnels (at most {MAX_TRACE_ENTRIES})",
                demand.len(),
                minutes,
                ids.len()
            )));
        }
        for (&id, &cap) in ids.iter().zip(&caps) {
            if !(cap.is_finite() && cap > 0.0) {
                return Err(TraceError::Invalid(format!(
                    "tunnel {id}: cap {cap} must be finite and above zero"
                )));
            }
        }
        for (k, &d) in demand.iter().enumerate() {
            let index = k % ids.len();
            if !(d.is_finite() && d >= 0.0 && d <= caps[index]) {
                return Err(TraceError::Invalid(format!(
                    "minute {}, tunnel {}: demand {d} must be finite, from 0 to the cap {}",
                    k / ids.len(),
                    ids[index],
                    caps[index]
                )));
            }
        }
        let arrivals = vec![0; ids.len()];
        Ok(Self {
            ids,
            caps,
            minutes,
            demand,
            arrivals,
        })
    }

    /// The same trace with tunnels that come into existence during it: `arrivals[index]` is
    /// the first minute of tunnel `index` (0: there from the start). Errors: not one arrival per
    /// tunnel, an arrival at or past the last minute, or a demand above 0 before its tunnel's
    /// arrival.
    pub fn with_arrivals(mut self, arrivals: Vec<usize>) -> Result<Self, TraceError> {
        if arrivals.len() != self.ids.len() {
            return Err(TraceError::Invalid(format!(
                "{} arrivals for {} tunnels",
                arrivals.len(),
                self.ids.len()
            )));
        }
        for (index, &at) in arrivals.iter().enumerate() {
            let id = self.ids[index];
            if at >= self.minutes {
                return Err(TraceError::Invalid(format!(
                    "tunnel {id}: arrival at minute {at}, the trace ends at minute {}",
                    self.minutes - 1
                )));
            }
            if let Some(m) = (0..at).find(|&m| self.demand(m, index) > 0.0) {
                return Err(TraceError::Invalid(format!(
                    "tunnel {id}: demand in minute {m}, before its arrival at minute {at}"
                )));
            }
        }
        self.arrivals = arrivals;
        Ok(self)
    }

    /// The first minute of tunnel `index` (0 for a tunnel there from the start, and for an
    /// unknown index).
    pub fn arrival(&self, index: usize) -> usize {
        self.arrivals.get(index).copied().unwrap_or(0)
    }

    /// Number of tunnels.
    pub fn tunnels(&self) -> usize {
        self.ids.len()
    }

    /// Number of minutes.
    pub fn minutes(&self) -> usize {
        self.minutes
    }

    /// The tunnel identifiers, increasing.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The caps σ_i (Gbit/s), in tunnel order.
    pub fn caps(&self) -> &[f64] {
        &self.caps
    }

    /// The demands of all tunnels in `minute` (Gbit/s), in tunnel order; empty past the end.
    pub fn minute(&self, minute: usize) -> &[f64] {
        let n = self.ids.len();
        self.demand
            .get(minute * n..(minute + 1) * n)
            .unwrap_or_default()
    }

    /// The demand of tunnel `index` in `minute` (0 outside the trace).
    pub fn demand(&self, minute: usize, index: usize) -> f64 {
        if index >= self.ids.len() {
            return 0.0;
        }
        self.minute(minute).get(index).copied().unwrap_or(0.0)
    }

    /// The aggregate demand of every minute.
    pub fn totals(&self) -> Vec<f64> {
        (0..self.minutes)
            .map(|m| self.minute(m).iter().sum())
            .collect()
    }

    /// The mean aggregate demand over the trace.
    pub fn mean_total(&self) -> f64 {
        self.demand.iter().sum::<f64>() / self.minutes as f64
    }

    /// The highest aggregate demand of any minute.
    pub fn peak_total(&self) -> f64 {
        self.totals().into_iter().fold(0.0, f64::max)
    }

    /// The mean demand of tunnel `index` over the trace (0 for an unknown index).
    pub fn tunnel_mean(&self, index: usize) -> f64 {
        if index >= self.ids.len() {
            return 0.0;
        }
        (0..self.minutes)
            .map(|m| self.demand(m, index))
            .sum::<f64>()
            / self.minutes as f64
    }

    /// The capacity of one dedicated VM pair per tunnel, as the paper counts it (§7.4): each
    /// tunnel's cap, twice for high availability. 510 Gbit/s for 170 tunnels of 1.5 Gbit/s.
    pub fn dedicated_capacity(&self) -> f64 {
        2.0 * self.caps.iter().sum::<f64>()
    }

    /// The trace as CSV: the header `minute,tunnel,gbps`, then one row per minute and tunnel
    /// (zeros included), minute by minute, each value in the shortest form that reads back
    /// exactly.
    pub fn to_csv(&self) -> String {
        let mut out = String::with_capacity(self.demand.len() * 16 + 32);
        out.push_str(CSV_HEADER);
        out.push('\n');
        for minute in 0..self.minutes {
            for (index, id) in self.ids.iter().enumerate() {
                let d = self.demand(minute, index);
                out.push_str(&format!("{minute},{id},{d}\n"));
            }
        }
        out
    }

    /// Parses a CSV trace (see the module docs). The first line that is not blank must be the
    /// header `minute,tunnel,gbps` (spaces around fields are allowed, as are blank lines and a
    /// byte-order mark). Each row gives a minute (from 0), a tunnel identifier and its demand
    /// in Gbit/s (finite, not negative, at most `cap`, the cap every tunnel of the trace gets).
    /// Minutes run from 0 to the largest one given; a tunnel without a row in some minute had
    /// no traffic then. A row repeating a (minute, tunnel) pair is an error naming both lines.
    pub fn from_csv(text: &str, cap: f64) -> Result<Self, TraceError> {
        if !(cap.is_finite() && cap > 0.0) {
            return Err(TraceError::Invalid(format!(
                "cap {cap} must be finite and above zero"
            )));
        }
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim()));
        let header = lines.find(|(_, l)| !l.is_empty());
        match header {
            None => {
                return Err(TraceError::Csv {
                    line: 1,
                    reason: format!("empty: expected the header `{CSV_HEADER}`"),
                })
            }
            Some((line, l)) => {
                let fields: Vec<&str> = l.split(',').map(str::trim).collect();
                if fields != ["minute", "tunnel", "gbps"] {
                    return Err(TraceError::Csv {
                        line,
                        reason: format!("expected the header `{CSV_HEADER}`, found `{l}`"),
                    });
                }
            }
        }
        let mut rows: Vec<(usize, u32, f64, usize)> = Vec::new();
        let mut max_minute = 0usize;
        for (line, l) in lines {
            if l.is_empty() {
                continue;
            }
            let err = |reason: String| TraceError::Csv { line, reason };
            let fields: Vec<&str> = l.split(',').map(str::trim).collect();
            if fields.len() != 3 {
                return Err(err(format!(
                    "expected 3 fields (minute,tunnel,gbps), found {}",
                    fields.len()
                )));
            }
            let minute: usize = fields[0]
                .parse()
                .map_err(|_| err(format!("minute `{}`: not a whole number", fields[0])))?;
            let tunnel: u32 = fields[1].parse().map_err(|_| {
                err(format!(
                    "tunnel `{}`: not a whole number from 0 to {}",
                    fields[1],
                    u32::MAX
                ))
            })?;
            let gbps: f64 = fields[2]
                .parse()
                .map_err(|_| err(format!("gbps `{}`: not a number", fields[2])))?;
            if !gbps.is_finite() || gbps < 0.0 {
                return Err(err(format!(
                    "gbps {}: must be finite and not negative",
                    fields[2]
                )));
            }
            if gbps > cap {
                return Err(err(format!(
                    "gbps {gbps} of tunnel {tunnel} is above the cap {cap} (the rate limit caps \
                     a tunnel; give the right cap)"
                )));
            }
            if minute >= MAX_TRACE_ENTRIES {
                return Err(err(format!(
                    "minute {minute}: too large (a trace holds at most {MAX_TRACE_ENTRIES} \
                     entries)"
                )));
            }
            max_minute = max_minute.max(minute);
            rows.push((minute, tunnel, gbps, line));
        }
        if rows.is_empty() {
            return Err(TraceError::Csv {
                line: text.lines().count().max(1),
                reason: "no rows after the header".into(),
            });
        }
        let index: BTreeMap<u32, usize> = {
            let mut ids: Vec<u32> = rows.iter().map(|r| r.1).collect();
            ids.sort_unstable();
            ids.dedup();
            ids.into_iter().enumerate().map(|(i, id)| (id, i)).collect()
        };
        let n = index.len();
        let minutes = max_minute + 1;
        let entries = minutes.checked_mul(n).filter(|&e| e <= MAX_TRACE_ENTRIES);
        let Some(entries) = entries else {
            let line = rows.iter().find(|r| r.0 == max_minute).map_or(1, |r| r.3);
            return Err(TraceError::Csv {
                line,
                reason: format!(
                    "{minutes} minutes × {n} tunnels is more than {MAX_TRACE_ENTRIES} entries"
                ),
            });
        };
        let mut demand = vec![0.0; entries];
        let mut seen = vec![0usize; entries];
        for (minute, tunnel, gbps, line) in rows {
            let k = minute * n + index.get(&tunnel).copied().unwrap_or(0);
            if seen[k] != 0 {
                return Err(TraceError::Csv {
                    line,
                    reason: format!(
                        "minute {minute}, tunnel {tunnel} already given on line {}",
                        seen[k]
                    ),
                });
            }
            seen[k] = line;
            demand[k] = gbps;
        }
        let ids: Vec<u32> = index.keys().copied().collect();
        Self::new(ids, vec![cap; n], minutes, demand)
    }
}

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

/// Generates a trace from `params` and `seed` (see [`TraceParams`]). The same parameters and
/// seed always give the same trace. Each part of the model (weights, groups, variation,
/// bursts) draws from its own stream of the seed, so changing one parameter does not reshuffle
/// the others.
pub fn generate(params: &TraceParams, seed: u64) -> Result<Trace, TraceError> {
    params.validate()?;
    let n = params.tunnels;
    let minutes = params.minutes;
    let day = params.minutes_per_day;

    // Per-tunnel mean weights, lognormal with mean 1.
    let mut rng = Rng::stream(seed, 1);
    let sd = params.mean_log_sd;
    let weights: Vec<f64> = (0..n)
        .map(|_| (sd * rng.normal() - sd * sd / 2.0).exp())
        .collect();

    // Tenant groups and their diurnal peaks; per-tunnel diurnal amplitudes.
    let mut rng = Rng::stream(seed, 2);
    let group_of: Vec<usize> = (0..n).map(|_| rng.below(params.groups)).collect();
    let peaks: Vec<f64> = (0..params.groups)
        .map(|_| params.peak_minute + params.peak_spread_minutes * (2.0 * rng.unit() - 1.0))
        .collect();
    let (a_lo, a_hi) = params.diurnal_amplitude;
    let amplitudes: Vec<f64> = (0..n).map(|_| a_lo + (a_hi - a_lo) * rng.unit()).collect();

    // Slow variation: AR(1) with unit variance, one per group and one per tunnel.
    let phi = (-1.0 / params.slow_minutes).exp();
    let innovation = (1.0 - phi * phi).sqrt();
    let c = params.group_correlation;
    let (wg, wo) = (c.sqrt(), (1.0 - c).sqrt());
    let slow_sd = params.slow_sd;
    let mut group_rng = Rng::stream(seed, 3);
    let mut own_rng = Rng::stream(seed, 4);
    let mut jitter_rng = Rng::stream(seed, 5);
    let mut burst_rng = Rng::stream(seed, 6);
    let mut group_state: Vec<f64> = (0..params.groups).map(|_| group_rng.normal()).collect();
    let mut own_state: Vec<f64> = (0..n).map(|_| own_rng.normal()).collect();
    // Remaining minutes and factor of each tunnel's current burst.
    let mut bursts: Vec<(u64, f64)> = vec![(0, 1.0); n];
    let start_p = (params.bursts_per_day / day).min(1.0);
    let end_p = 1.0 / params.burst_minutes;
    let (b_lo, b_hi) = params.burst_factor;
    let jsd = params.jitter_sd;

    let mut raw = vec![0.0; n * minutes];
    for t in 0..minutes {
        if t > 0 {
            for g in group_state.iter_mut() {
                *g = phi * *g + innovation * group_rng.normal();
            }
            for e in own_state.iter_mut() {
                *e = phi * *e + innovation * own_rng.normal();
            }
        }
        for i in 0..n {
            let g = group_of[i];
            let angle = 2.0 * std::f64::consts::PI * (t as f64 - peaks[g]) / day;
            let diurnal = 1.0 + amplitudes[i] * angle.cos();
            let slow_log = slow_sd * (wg * group_state[g] + wo * own_state[i]);
            let slow = (slow_log - slow_sd * slow_sd / 2.0).exp();
            let jitter = (jsd * jitter_rng.normal() - jsd * jsd / 2.0).exp();
            let burst = &mut bursts[i];
            if burst.0 == 0 && burst_rng.unit() < start_p {
                burst.0 = burst_rng.geometric(end_p);
                burst.1 = b_lo + (b_hi - b_lo) * burst_rng.unit();
            }
            let factor = if burst.0 > 0 {
                burst.0 -= 1;
                burst.1
            } else {
                1.0
            };
            raw[t * n + i] = weights[i] * diurnal * slow * jitter * factor;
        }
    }

    let cap = params.cap_gbps;
    let scale = find_scale(&raw, cap, params.mean_total_gbps * minutes as f64)?;
    let demand: Vec<f64> = raw.iter().map(|&x| (scale * x).min(cap)).collect();
    let ids = (0..n)
        .map(|i| u32::try_from(i).map_err(|_| TraceError::Invalid("too many tunnels".into())))
        .collect::<Result<Vec<u32>, _>>()?;
    Trace::new(ids, vec![cap; n], minutes, demand)
}

/// The scale `s` with `Σ min(cap, s · x) = target` (the sum is continuous and increasing in
/// `s` up to where every value is capped), by bisection.
fn find_scale(raw: &[f64], cap: f64, target: f64) -> Result<f64, TraceError> {
    let total = |s: f64| raw.iter().map(|&x| (s * x).min(cap)).sum::<f64>();
    let mut hi = 1.0;
    let mut grown = 0;
    while total(hi) < target {
        hi *= 2.0;
        grown += 1;
        if grown > 200 {
            return Err(TraceError::Invalid(
                "the mean aggregate cannot be reached under the caps".into(),
            ));
        }
    }
    let mut lo = 0.0;
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if total(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(hi)
}

/// xoshiro256\*\* (Blackman and Vigna), seeded by SplitMix64: small, fast and of good
/// statistical quality; not for cryptography.
#[derive(Debug, Clone)]
pub(crate) struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator seeded from `seed` through SplitMix64.
    pub(crate) fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    /// Stream `stream` of `seed`: an independent generator per purpose.
    pub(crate) fn stream(seed: u64, stream: u64) -> Self {
        Self::new(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)`, with 53 random bits.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (0 for `n = 0`).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((self.unit() * n as f64) as usize).min(n.saturating_sub(1))
    }

    /// Standard normal (Box–Muller).
    pub(crate) fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit(); // in (0, 1]
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Geometric on `1, 2, …` with success probability `p` in `(0, 1]` (mean `1 / p`).
    pub(crate) fn geometric(&mut self, p: f64) -> u64 {
        if p >= 1.0 || p.is_nan() || p <= 0.0 {
            return 1;
        }
        let u = 1.0 - self.unit(); // in (0, 1]
        let k = (u.ln() / (1.0 - p).ln()).floor();
        1 + (k.min(1e12) as u64)
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} tunnels × {} minutes, mean aggregate {:.2} Gbit/s, peak {:.2} Gbit/s",
            self.tunnels(),
            self.minutes(),
            self.mean_total(),
            self.peak_total()
        )
    }
}

#[cfg(test)]
mod tests;
