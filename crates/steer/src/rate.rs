//! Per-tunnel rate limits (the paper's §4.3 "Rate limiting": GIN and GEN limit "the rate of
//! tunnels to the maximum bandwidth that cloud provider promise to support to tenants", for
//! per-tunnel performance isolation).
//!
//! A [`TokenBucket`] holds credit in *nanobits* (10⁻⁹ bit): `t` nanoseconds at `r` bit/s add
//! exactly `t · r` nanobits and a packet of `b` bytes costs exactly `b · 8 · 10⁹`, so refills
//! never round and nothing drifts however the calls are spaced. The arithmetic is `u128`
//! (saturating) and cannot overflow for any `u64` rate or burst. Packets that do not fit are
//! dropped, not queued, and leave the bucket as it was (no debt).
//!
//! [`RateLimiters`] keeps one bucket and one set of counters per tunnel. Use one per direction
//! (inbound ESP; outbound: VXLAN from hosts and a CE's packets into the tunnel, one bucket
//! for both). With several steer nodes in parallel each enforces its own buckets with the
//! limit it is given: the control node gives each node its share of a tunnel's rate, divided
//! by the traffic each reports ([`crate::share`]), so the shares add up to the tunnel's limit.

use rustc_hash::FxHashMap;
use std::time::Instant;

use crate::ids::TunnelId;

/// Credit units per byte: 8 bits of 10⁹ nanobits.
const NANOBITS_PER_BYTE: u128 = 8 * 1_000_000_000;

/// A rate limit: sustained rate and burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateLimit {
    /// Sustained rate in bits per second. 0 blocks the tunnel: nothing is admitted, not even
    /// a burst.
    pub bits_per_second: u64,
    /// Bucket size in bytes: the most a tunnel may send at once after being idle. Packets
    /// larger than this are never admitted, so it must be at least the largest packet.
    pub burst_bytes: u64,
}

impl RateLimit {
    /// A limit of `bits_per_second` with a burst of `burst_bytes`.
    pub const fn new(bits_per_second: u64, burst_bytes: u64) -> Self {
        Self {
            bits_per_second,
            burst_bytes,
        }
    }

    /// A limit of `mbit_per_second` Mbit/s (10⁶ bit/s, saturating) with a burst of
    /// `burst_bytes`.
    pub const fn mbit(mbit_per_second: u64, burst_bytes: u64) -> Self {
        Self::new(mbit_per_second.saturating_mul(1_000_000), burst_bytes)
    }

    /// The bucket capacity in nanobits (0 for a blocked tunnel).
    fn capacity(&self) -> u128 {
        if self.bits_per_second == 0 {
            0
        } else {
            u128::from(self.burst_bytes).saturating_mul(NANOBITS_PER_BYTE)
        }
    }
}

/// A token bucket (see the module docs). It starts full; the first call's `now` starts its
/// clock. Time going backwards refills nothing and does not move the clock back.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    limit: RateLimit,
    /// Most credit the bucket holds, in nanobits.
    capacity: u128,
    /// Credit now, in nanobits; never above `capacity`.
    tokens: u128,
    /// When credit was last added.
    last: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket for `limit`.
    pub fn new(limit: RateLimit) -> Self {
        let capacity = limit.capacity();
        Self {
            limit,
            capacity,
            tokens: capacity,
            last: None,
        }
    }

    /// The limit.
    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    /// Changes the limit at `now`: credit earned until `now` accrues at the old rate, then
    /// the credit is cut to the new burst (a higher limit grants no credit at once).
    pub fn set_limit(&mut self, now: Instant, limit: RateLimit) {
        self.refill(now);
        self.limit = limit;
        self.capacity = limit.capacity();
        self.tokens = self.tokens.min(self.capacity);
    }

    /// Admits a packet of `bytes` at `now` if the bucket holds enough credit, taking it;
    /// otherwise the packet is to be dropped and the bucket is unchanged. Zero-length packets
    /// cost nothing (but a blocked tunnel admits nothing).
    #[inline]
    pub fn admit(&mut self, now: Instant, bytes: usize) -> bool {
        if self.limit.bits_per_second == 0 {
            return false;
        }
        self.refill(now);
        let cost = (bytes as u128).saturating_mul(NANOBITS_PER_BYTE);
        if cost <= self.tokens {
            self.tokens -= cost;
            true
        } else {
            false
        }
    }

    /// Whole bytes of credit at `now` (after adding what accrued until then).
    pub fn available_bytes(&mut self, now: Instant) -> u64 {
        self.refill(now);
        u64::try_from(self.tokens / NANOBITS_PER_BYTE).unwrap_or(u64::MAX)
    }

    /// Adds the credit earned between the last refill and `now`, up to the capacity.
    #[inline]
    fn refill(&mut self, now: Instant) {
        let Some(last) = self.last else {
            self.last = Some(now);
            return;
        };
        // `None`: time went backwards; keep the later instant and add nothing.
        let Some(elapsed) = now.checked_duration_since(last) else {
            return;
        };
        if self.tokens < self.capacity {
            let earned = elapsed
                .as_nanos()
                .saturating_mul(u128::from(self.limit.bits_per_second));
            self.tokens = self.tokens.saturating_add(earned).min(self.capacity);
        }
        self.last = Some(now);
    }
}

/// Packets and bytes a tunnel's limiter admitted and dropped. Counters wrap at `u64::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TunnelCounters {
    /// Packets admitted.
    pub admitted_packets: u64,
    /// Bytes admitted.
    pub admitted_bytes: u64,
    /// Packets dropped for exceeding the rate.
    pub dropped_packets: u64,
    /// Bytes dropped for exceeding the rate.
    pub dropped_bytes: u64,
}

impl TunnelCounters {
    fn count(&mut self, admitted: bool, bytes: usize) {
        let bytes = bytes as u64;
        if admitted {
            self.admitted_packets = self.admitted_packets.wrapping_add(1);
            self.admitted_bytes = self.admitted_bytes.wrapping_add(bytes);
        } else {
            self.dropped_packets = self.dropped_packets.wrapping_add(1);
            self.dropped_bytes = self.dropped_bytes.wrapping_add(bytes);
        }
    }
}

/// A tunnel's bucket and counters.
#[derive(Debug, Clone)]
struct Limited {
    bucket: TokenBucket,
    counters: TunnelCounters,
}

/// Tunnel → token bucket, with per-tunnel counters (see the module docs).
///
/// A tunnel without a configured limit is not limited: its packets are admitted and counted
/// together in [`RateLimiters::unlimited`]. (The control node sets a limit for every tunnel it
/// steers; this covers the moment between a steering rule and its limit arriving.)
#[derive(Debug, Clone, Default)]
pub struct RateLimiters {
    tunnels: FxHashMap<TunnelId, Limited>,
    unlimited: TunnelCounters,
}

impl RateLimiters {
    /// No limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// Limits `tunnel` to `limit` from `now`. A new tunnel starts with a full bucket and zero
    /// counters; an existing one keeps its counters and its credit (cut to the new burst).
    pub fn set_limit(&mut self, tunnel: TunnelId, now: Instant, limit: RateLimit) {
        match self.tunnels.get_mut(&tunnel) {
            Some(l) => l.bucket.set_limit(now, limit),
            None => {
                self.tunnels.insert(
                    tunnel,
                    Limited {
                        bucket: TokenBucket::new(limit),
                        counters: TunnelCounters::default(),
                    },
                );
            }
        }
    }

    /// Removes the limit of `tunnel`, returning its final counters.
    pub fn remove(&mut self, tunnel: TunnelId) -> Option<TunnelCounters> {
        self.tunnels.remove(&tunnel).map(|l| l.counters)
    }

    /// Admits or drops a packet of `bytes` of `tunnel` at `now`, and counts it.
    #[inline]
    pub fn admit(&mut self, tunnel: TunnelId, now: Instant, bytes: usize) -> bool {
        match self.tunnels.get_mut(&tunnel) {
            Some(l) => {
                let admitted = l.bucket.admit(now, bytes);
                l.counters.count(admitted, bytes);
                admitted
            }
            None => {
                self.unlimited.count(true, bytes);
                true
            }
        }
    }

    /// The counters of `tunnel`, if it has a limit.
    pub fn counters(&self, tunnel: TunnelId) -> Option<TunnelCounters> {
        self.tunnels.get(&tunnel).map(|l| l.counters)
    }

    /// The limit of `tunnel`, if any.
    pub fn limit(&self, tunnel: TunnelId) -> Option<RateLimit> {
        self.tunnels.get(&tunnel).map(|l| l.bucket.limit())
    }

    /// Packets of tunnels without a limit (all admitted).
    pub fn unlimited(&self) -> TunnelCounters {
        self.unlimited
    }

    /// Every limited tunnel with its limit and counters, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (TunnelId, RateLimit, TunnelCounters)> + '_ {
        self.tunnels
            .iter()
            .map(|(&t, l)| (t, l.bucket.limit(), l.counters))
    }

    /// Number of limited tunnels.
    pub fn len(&self) -> usize {
        self.tunnels.len()
    }

    /// True if no tunnel is limited.
    pub fn is_empty(&self) -> bool {
        self.tunnels.is_empty()
    }
}

#[cfg(test)]
mod tests;
