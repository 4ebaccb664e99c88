//! Lock-free allocation of outbound ESP sequence numbers (RFC 4303 §3.3.3): every number is
//! used at most once, the first is 1, and the counter never cycles.
//!
//! # How
//! The fast path is one relaxed `fetch_add`. Refusals must not move the counter (a sender that
//! keeps trying on an exhausted SA would otherwise wrap a 64-bit counter after 2^32
//! refusals), so within a *margin* of the limit allocation switches to a compare-and-swap loop
//! that never writes past `limit + 1`.
//!
//! # Why no number is handed out twice, and none below the limit is skipped
//! Every write to the counter is a read-modify-write that adds exactly 1 to the value it read
//! (`fetch_add(1)`, or a successful `compare_exchange(c, c + 1)`); refused compare-and-swaps
//! write nothing. Read-modify-writes of one atomic read the value immediately before them in
//! its modification order, so the counter takes the values `first, first + 1, ...` in order
//! and each allocation reads a different one: the numbers read are distinct and contiguous.
//! An allocation returns the number it read when that is at most `limit`, so every number in
//! `first..=limit` is returned at most once, and the numbers returned are exactly
//! `first..=min(limit, next - 1)`. No ordering beyond `Relaxed` is needed: only the
//! modification order of this one atomic matters.
//!
//! # How far past the limit the counter can go
//! A `fetch_add` can land past the limit only if its thread read the counter at most
//! `limit - margin` and `margin` other allocations happened before its `fetch_add`. Each
//! thread has at most one such stale `fetch_add` outstanding, after which its loads see the
//! counter past the limit and it takes the compare-and-swap path, which never moves it. So the
//! counter stays at most `limit + 1 + threads` for any margin (and [`MAX_ESN`] leaves 2^32 of
//! headroom in the 64-bit counter). The margin only makes such late refusals rare; the loom
//! model (`seq/loom_tests.rs`) shrinks it to 0 and 1 to reach them.

use crate::sync::{AtomicU64, CachePadded, Ordering};

/// The last sequence number an SA without extended sequence numbers may send (RFC 4303
/// §3.3.3: the counter MUST NOT cycle; rekey before 2^32 - 1 is passed).
pub const MAX_SEQ: u64 = u32::MAX as u64;
/// The last extended sequence number we send: 2^64 - 2^32. RFC 4303 allows 2^64 - 1; we stop
/// 2^32 earlier so the 64-bit counter keeps headroom for racing allocators and can never
/// wrap. (At 10^9 packets per second the difference is reached after 584 years.)
pub const MAX_ESN: u64 = u64::MAX - MAX_SEQ;
/// Default soft limit without ESN: 2^31, half the space, so IKE has ample time to rekey.
pub const DEFAULT_SOFT_LIMIT: u64 = 1 << 31;
/// Default soft limit with ESN: 2^63.
pub const DEFAULT_SOFT_LIMIT_ESN: u64 = 1 << 63;

/// Below `limit - FAST_MARGIN` allocation is a plain `fetch_add` (see the module docs for
/// why any margin is correct; this one makes a late refusal need 2^20 allocations by other
/// threads while one thread is between its load and its `fetch_add`).
pub(crate) const FAST_MARGIN: u64 = 1 << 20;

/// The outbound sequence counter of one SA.
#[derive(Debug)]
pub(crate) struct SequenceCounter {
    /// The next number to hand out; on a line of its own, since the thread that allocates
    /// writes it per packet while the threads that seal read the SA's other fields.
    next: CachePadded<AtomicU64>,
    limit: u64,
    /// The fast path applies while the counter is at most this (`limit - margin`; 0 if the
    /// margin exceeds the limit, and the counter is never 0).
    fast_max: u64,
    soft_limit: u64,
}

impl SequenceCounter {
    /// A counter whose first number is `first`, last is `limit`, and which asks for a rekey
    /// once a number above `soft_limit` has been handed out.
    pub(crate) fn new(first: u64, limit: u64, soft_limit: u64) -> Self {
        Self::with_margin(first, limit, soft_limit, FAST_MARGIN)
    }

    /// [`Self::new`] with the fast path ending `margin` numbers before the limit (the loom
    /// model uses tiny margins; any margin is correct).
    pub(crate) fn with_margin(first: u64, limit: u64, soft_limit: u64, margin: u64) -> Self {
        Self {
            next: CachePadded(AtomicU64::new(first.max(1))),
            limit,
            fast_max: limit.saturating_sub(margin),
            soft_limit,
        }
    }

    /// The next unused sequence number, or `None` once `limit` has been used.
    #[inline]
    pub(crate) fn allocate(&self) -> Option<u64> {
        let cur = self.next.load(Ordering::Relaxed);
        if cur <= self.fast_max {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            // Late `fetch_add`s of threads that loaded long ago can land past the limit.
            return (n <= self.limit).then_some(n);
        }
        self.next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                (c <= self.limit).then(|| c + 1)
            })
            .ok()
    }

    /// The last number this counter hands out.
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// The number the next [`Self::allocate`] will try (may exceed the limit once exhausted).
    pub(crate) fn peek(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }

    /// True once a number above the soft limit has been allocated.
    pub(crate) fn needs_rekey(&self) -> bool {
        self.peek().saturating_sub(1) > self.soft_limit
    }

    /// True once the hard limit has been used.
    pub(crate) fn is_exhausted(&self) -> bool {
        self.peek() > self.limit
    }

    /// Moves the counter (tests only: to reach the limits without 2^32 packets).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn set_next(&self, next: u64) {
        self.next.store(next, Ordering::Relaxed);
    }
}

#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(all(test, loom))]
mod loom_tests;
