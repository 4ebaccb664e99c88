//! The simulator's judge: who is served in full in each minute (a max-min fair scheduler per
//! node), and the [`Summary`] of a run (see the module docs of [`crate::sim`]).

use super::{MinuteStats, Policy, Run, SimConfig, Summary, LOAD_TOLERANCE};
use crate::trace::Trace;

/// Counts who is served in one minute, per node, and keeps per-tunnel tallies.
pub(super) struct Judge<'a> {
    trace: &'a Trace,
    config: &'a SimConfig,
    /// Judged minutes each tunnel was served in full.
    served: Vec<usize>,
    /// Judged minutes each tunnel existed in.
    existed: Vec<usize>,
    minutes: Vec<MinuteStats>,
}

impl<'a> Judge<'a> {
    pub(super) fn new(trace: &'a Trace, config: &'a SimConfig) -> Self {
        Self {
            trace,
            config,
            served: vec![0; trace.tunnels()],
            existed: vec![0; trace.tunnels()],
            minutes: Vec::with_capacity(trace.minutes()),
        }
    }

    /// Judges one minute: `groups` holds, per node, the indices of the tunnels on it; tunnels
    /// in no group are on no active node. A tunnel before its arrival is not judged. The
    /// per-tunnel tallies count only minutes from [`SimConfig::score_from_minute`].
    pub(super) fn minute(
        &mut self,
        minute: usize,
        groups: &[Vec<usize>],
        active_nodes: u32,
        reserved_nodes: u32,
    ) -> &mut MinuteStats {
        let demand = self.trace.minute(minute);
        let capacity = self.config.planner.node_capacity;
        let exists: Vec<bool> = (0..demand.len())
            .map(|i| self.trace.arrival(i) <= minute)
            .collect();
        let mut placed = vec![false; demand.len()];
        let mut full = vec![false; demand.len()];
        let mut stats = MinuteStats {
            demand_gbps: demand.iter().sum(),
            active_gbps: f64::from(active_nodes) * capacity,
            reserved_gbps: f64::from(reserved_nodes) * capacity,
            active_nodes,
            tunnels: to_u32(exists.iter().filter(|&&e| e).count()),
            ..MinuteStats::default()
        };
        for group in groups {
            let mut tunnels: Vec<(usize, f64)> = group
                .iter()
                .filter(|&&i| exists.get(i).copied().unwrap_or(false))
                .filter_map(|&i| demand.get(i).map(|&d| (i, d)))
                .collect();
            for &(i, _) in &tunnels {
                placed[i] = true;
            }
            let load: f64 = tunnels.iter().map(|t| t.1).sum();
            if load <= capacity + LOAD_TOLERANCE {
                for &(i, _) in &tunnels {
                    full[i] = true;
                }
                continue;
            }
            stats.overloaded_nodes += 1;
            stats.unserved_gbps += load - capacity;
            // Max-min fair shares: smallest demands first, each served in full while it is
            // under the fair share of what is left.
            tunnels.sort_by(|a, b| a.1.total_cmp(&b.1));
            let mut left = capacity;
            for (k, &(i, d)) in tunnels.iter().enumerate() {
                let share = left / (tunnels.len() - k) as f64;
                if d <= share + LOAD_TOLERANCE {
                    left -= d;
                    full[i] = true;
                } else {
                    stats.underserved_tunnels +=
                        u32::try_from(tunnels.len() - k).unwrap_or(u32::MAX);
                    break;
                }
            }
        }
        for (i, &d) in demand.iter().enumerate() {
            if placed[i] || !exists[i] {
                continue;
            }
            if d > 0.0 {
                stats.underserved_tunnels += 1;
                stats.unserved_gbps += d;
            } else {
                full[i] = true;
            }
        }
        if minute >= self.config.score_from_minute {
            for i in (0..demand.len()).filter(|&i| exists[i]) {
                self.existed[i] += 1;
                self.served[i] += usize::from(full[i]);
            }
        }
        self.minutes.push(stats);
        let last = self.minutes.len() - 1;
        &mut self.minutes[last]
    }

    pub(super) fn finish(self, policy: Policy, consolidation_minutes: u64) -> Run {
        let summary = summarize(
            self.trace,
            self.config,
            &self.minutes,
            &self.served,
            &self.existed,
        );
        Run {
            policy,
            consolidation_minutes,
            minutes: self.minutes,
            summary,
        }
    }
}

/// Per tunnel, the judged minutes it exists in (for policies that serve everything).
pub(super) fn existence(trace: &Trace, config: &SimConfig) -> Vec<usize> {
    (0..trace.tunnels())
        .map(|i| {
            trace
                .minutes()
                .saturating_sub(trace.arrival(i).max(config.score_from_minute))
        })
        .collect()
}

/// Tunnels that exist in `minute`.
pub(super) fn existing(trace: &Trace, minute: usize) -> u32 {
    to_u32(
        (0..trace.tunnels())
            .filter(|&i| trace.arrival(i) <= minute)
            .count(),
    )
}

/// The dedicated capacity (a VM pair per tunnel at its cap) of the tunnels that have not
/// arrived by `minute`: 0 when all exist.
pub(super) fn not_arrived(trace: &Trace, minute: usize) -> f64 {
    2.0 * trace
        .caps()
        .iter()
        .enumerate()
        .filter(|&(i, _)| trace.arrival(i) > minute)
        .map(|(_, cap)| cap)
        .sum::<f64>()
}

/// The figures of a run from its minutes (those from [`SimConfig::score_from_minute`] on)
/// and, per tunnel, the judged minutes it was served in full and existed in.
pub(super) fn summarize(
    trace: &Trace,
    config: &SimConfig,
    minutes: &[MinuteStats],
    served: &[usize],
    existed: &[usize],
) -> Summary {
    let first = config.score_from_minute;
    let minutes = minutes.get(first..).unwrap_or(&[]);
    let count = minutes.len().max(1) as f64;
    // Dedicated pairs for the tunnels that exist in each judged minute, on average (exactly
    // the trace's dedicated capacity when all exist throughout).
    let dedicated = trace.dedicated_capacity()
        - (first..first + minutes.len())
            .map(|m| not_arrived(trace, m))
            .sum::<f64>()
            / count;
    // The tunnels that must be served in full in a minute of `n` tunnels.
    let needed = |n: usize| {
        ((config.guarantee_fraction * n as f64) - 1e-9)
            .ceil()
            .clamp(1.0, n.max(1) as f64) as usize
    };
    let violation_minutes = minutes
        .iter()
        .filter(|m| {
            let n = m.tunnels as usize;
            m.underserved_tunnels as usize > n.saturating_sub(needed(n))
        })
        .count();
    let demand: f64 = minutes.iter().map(|m| m.demand_gbps).sum();
    let unserved: f64 = minutes.iter().map(|m| m.unserved_gbps).sum();
    let active = minutes.iter().map(|m| m.active_gbps).sum::<f64>() / count;
    // Per tunnel (that existed in a judged minute), the share of its minutes served in full.
    let mut per_tunnel: Vec<f64> = served
        .iter()
        .zip(existed)
        .filter(|(_, &e)| e > 0)
        .map(|(&s, &e)| s as f64 / e as f64)
        .collect();
    per_tunnel.sort_unstable_by(|a, b| b.total_cmp(a));
    let tunnel_served = per_tunnel
        .get(needed(per_tunnel.len()) - 1)
        .copied()
        .unwrap_or(0.0);
    Summary {
        minutes: minutes.len(),
        mean_demand_gbps: demand / count,
        active_capacity_gbps: active,
        peak_active_capacity_gbps: minutes.iter().map(|m| m.active_gbps).fold(0.0, f64::max),
        reserved_capacity_gbps: minutes.iter().map(|m| m.reserved_gbps).sum::<f64>() / count,
        saving_pct: if dedicated > 0.0 {
            100.0 * (1.0 - active / dedicated)
        } else {
            0.0
        },
        guarantee_pct: 100.0 * (minutes.len() - violation_minutes) as f64 / count,
        violation_minutes,
        overload_minutes: minutes.iter().filter(|m| m.overloaded_nodes > 0).count(),
        overloaded_node_minutes: minutes.iter().map(|m| m.overloaded_nodes as usize).sum(),
        tunnel_guarantee_pct: 100.0 * tunnel_served,
        unserved_pct: if demand > 0.0 {
            100.0 * unserved / demand
        } else {
            0.0
        },
        migrations: minutes.iter().map(|m| u64::from(m.migrations)).sum(),
    }
}

pub(super) fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
