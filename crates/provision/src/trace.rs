//! Demand traces for the provisioning simulator ([`crate::sim`]): the throughput of every
//! tunnel, minute by minute, in Gbit/s, with each tunnel's cap (its rate limit, σ_i).
//!
//! Production traces (the paper's §7.4 used 24 hours of 170 tunnels from one data centre) are
//! not public, so this module also **generates** traces ([`generate`], [`TraceParams`]) with
//! the features that decide how hard elastic provisioning is: a diurnal pattern, heavy-tailed
//! per-tunnel means, slow and fast variation, bursts up to the cap, and tenants whose tunnels
//! move together. [`TraceParams::paper`] matches the statistics the paper gives (170 tunnels,
//! 24 h at 1-minute steps, caps of 1.5 Gbit/s, a mean aggregate of about 57.5 Gbit/s).
//! [`TraceFamily`] names the presets the simulator is evaluated on (`paper`, `bursty`,
//! `together`, `heldout`) and gives each its seeds by [`Role`], so that settings are never
//! tuned on the seeds they are reported on.
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

mod family;
mod generate;
mod params;
mod stats;

pub use family::{Role, TraceFamily, LOAD_RATIO};
pub use generate::generate;
#[cfg(test)]
pub(crate) use generate::Rng;
pub use params::{
    Arrivals, BurstHeight, BurstLength, GlobalShock, GroupBursts, HourlyBase, LevelShifts, OnOff,
    Pareto, TraceParams,
};
pub use stats::{TraceStats, RISE_MINUTES};

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
    /// A name that is no [`TraceFamily`].
    #[error("unknown trace family `{0}`: expected paper, bursty, together or heldout")]
    UnknownFamily(String),
    /// A name that is no [`Role`].
    #[error("unknown seed role `{0}`: expected tune, report or heldout")]
    UnknownRole(String),
    /// A seed asked of a family for a role it has none for ([`TraceFamily::has_role`]).
    #[error("the {family} family has no {role} seeds")]
    NoSeeds {
        /// The family's name.
        family: &'static str,
        /// The role's name.
        role: &'static str,
    },
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
