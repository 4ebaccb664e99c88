//! Per-tunnel rate limits of one direction (inbound ESP, or outbound: VXLAN from hosts and
//! CEs' packets into tunnels): the `steer` crate's [`RateLimiters`] for tunnels with a limit,
//! plus per-tunnel counters for tunnels without one (which `RateLimiters` only counts
//! together), so every tunnel's traffic shows in the stats.

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::time::Instant;

use steer::{RateLimit, RateLimiters, TunnelCounters, TunnelId};

/// One direction's limits and counters.
#[derive(Debug, Default)]
pub(crate) struct Direction {
    limited: RateLimiters,
    /// Counters of tunnels without a limit (and what limited tunnels counted before their
    /// limit was removed).
    unlimited: FxHashMap<TunnelId, TunnelCounters>,
}

impl Direction {
    /// Admits or drops a packet of `bytes` of `tunnel` at `now`, and counts it.
    #[inline]
    pub(crate) fn admit(&mut self, tunnel: TunnelId, now: Instant, bytes: usize) -> bool {
        if self.limited.limit(tunnel).is_some() {
            return self.limited.admit(tunnel, now, bytes);
        }
        let c = self.unlimited.entry(tunnel).or_default();
        c.admitted_packets = c.admitted_packets.wrapping_add(1);
        c.admitted_bytes = c.admitted_bytes.wrapping_add(bytes as u64);
        true
    }

    /// Sets (or with `None` removes) the limit of `tunnel` from `now`. A tunnel keeps its
    /// counters across limit changes.
    pub(crate) fn set_limit(&mut self, tunnel: TunnelId, now: Instant, limit: Option<RateLimit>) {
        match limit {
            Some(l) => self.limited.set_limit(tunnel, now, l),
            None => {
                if let Some(done) = self.limited.remove(tunnel) {
                    let c = self.unlimited.entry(tunnel).or_default();
                    *c = add(*c, done);
                }
            }
        }
    }

    /// Makes the limits exactly `limits`: listed tunnels get theirs, others lose theirs.
    pub(crate) fn set_all(&mut self, limits: &[(TunnelId, RateLimit)], now: Instant) {
        let stale: Vec<TunnelId> = self
            .limited
            .iter()
            .map(|(t, _, _)| t)
            .filter(|t| !limits.iter().any(|(l, _)| l == t))
            .collect();
        for t in stale {
            self.set_limit(t, now, None);
        }
        for &(t, l) in limits {
            self.set_limit(t, now, Some(l));
        }
    }

    /// Forgets the counters of unlimited tunnels for which `keep` is false (tunnels no table
    /// mentions any more), so the map does not grow with every tunnel ever seen.
    pub(crate) fn retain_counters(&mut self, keep: impl Fn(TunnelId) -> bool) {
        self.unlimited.retain(|&t, _| keep(t));
    }

    /// Every tunnel's limit and counters.
    pub(crate) fn report(&self) -> BTreeMap<TunnelId, (Option<RateLimit>, TunnelCounters)> {
        let mut out: BTreeMap<TunnelId, (Option<RateLimit>, TunnelCounters)> = self
            .unlimited
            .iter()
            .map(|(&t, &c)| (t, (None, c)))
            .collect();
        for (t, limit, c) in self.limited.iter() {
            let e = out.entry(t).or_default();
            e.0 = Some(limit);
            e.1 = add(e.1, c);
        }
        out
    }
}

fn add(a: TunnelCounters, b: TunnelCounters) -> TunnelCounters {
    TunnelCounters {
        admitted_packets: a.admitted_packets.wrapping_add(b.admitted_packets),
        admitted_bytes: a.admitted_bytes.wrapping_add(b.admitted_bytes),
        dropped_packets: a.dropped_packets.wrapping_add(b.dropped_packets),
        dropped_bytes: a.dropped_bytes.wrapping_add(b.dropped_bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_survive_limit_changes_and_unlimited_tunnels_are_counted_each() {
        let mut d = Direction::default();
        let now = Instant::now();
        let (a, b) = (TunnelId(1), TunnelId(2));
        assert!(d.admit(a, now, 100));
        assert!(d.admit(b, now, 50));
        d.set_limit(a, now, Some(RateLimit::new(8_000, 150)));
        assert!(d.admit(a, now, 100));
        assert!(!d.admit(a, now, 100), "over the burst");
        let r = d.report();
        assert_eq!(r[&a].0, Some(RateLimit::new(8_000, 150)));
        assert_eq!(r[&a].1.admitted_packets, 2);
        assert_eq!(r[&a].1.dropped_packets, 1);
        assert_eq!(
            r[&b],
            (
                None,
                TunnelCounters {
                    admitted_packets: 1,
                    admitted_bytes: 50,
                    ..TunnelCounters::default()
                }
            )
        );
        d.set_all(&[(b, RateLimit::new(0, 0))], now);
        assert!(d.admit(a, now, 100), "a lost its limit");
        assert!(!d.admit(b, now, 1), "b is blocked");
        let r = d.report();
        assert_eq!(r[&a].0, None);
        assert_eq!(r[&a].1.admitted_packets, 3);
        assert_eq!(r[&a].1.dropped_packets, 1);
        d.retain_counters(|t| t == b);
        assert!(!d.report().contains_key(&a));
        assert!(d.report().contains_key(&b), "limited tunnels stay");
    }
}
