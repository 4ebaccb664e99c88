//! Summary statistics of a trace ([`TraceStats`]): what tells trace families apart before any
//! simulation runs.

use super::Trace;

/// How far ahead [`TraceStats::rise_p99_gbps`] looks, minutes.
pub const RISE_MINUTES: usize = 5;

/// Summary statistics of a [`Trace`] (see [`TraceStats::of`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceStats {
    /// Mean aggregate demand, Gbit/s.
    pub mean_total_gbps: f64,
    /// Highest aggregate demand of any minute, Gbit/s.
    pub peak_total_gbps: f64,
    /// The sum of the caps, Gbit/s.
    pub cap_total_gbps: f64,
    /// Mean of `|d_i(t) − d_i(t − 1)| / σ_i` over every tunnel and every pair of consecutive
    /// minutes after its arrival: how far one minute is from the last, as a share of the cap.
    pub mean_step_of_cap: f64,
    /// The 99th percentile over `t` of `A(t + 5) − A(t)`, the aggregate's rise over
    /// [`RISE_MINUTES`] minutes, Gbit/s (0 for a trace of 5 minutes or fewer).
    pub rise_p99_gbps: f64,
    /// Tunnels that arrive after minute 0.
    pub arrivals: usize,
}

impl TraceStats {
    /// The statistics of `trace`.
    pub fn of(trace: &Trace) -> Self {
        let totals = trace.totals();
        let n = trace.tunnels();
        let mut steps = 0.0;
        let mut pairs = 0usize;
        for (i, &cap) in trace.caps().iter().enumerate() {
            for m in (trace.arrival(i) + 1)..trace.minutes() {
                steps += (trace.demand(m, i) - trace.demand(m - 1, i)).abs() / cap;
                pairs += 1;
            }
        }
        let mut rises: Vec<f64> = totals
            .windows(RISE_MINUTES + 1)
            .map(|w| w[RISE_MINUTES] - w[0])
            .collect();
        rises.sort_by(f64::total_cmp);
        let rise_p99_gbps = if rises.is_empty() {
            0.0
        } else {
            let k = ((0.99 * rises.len() as f64).ceil() as usize).clamp(1, rises.len());
            rises[k - 1]
        };
        Self {
            mean_total_gbps: trace.mean_total(),
            peak_total_gbps: totals.iter().copied().fold(0.0, f64::max),
            cap_total_gbps: trace.caps().iter().sum(),
            mean_step_of_cap: if pairs == 0 {
                0.0
            } else {
                steps / pairs as f64
            },
            rise_p99_gbps,
            arrivals: (0..n).filter(|&i| trace.arrival(i) > 0).count(),
        }
    }
}
