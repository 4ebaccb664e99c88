//! Lock-free allocation of outbound ESP sequence numbers (RFC 4303 §3.3.3): every number is
//! used at most once, the first is 1, and the counter never cycles.
//!
//! The fast path is one `fetch_add`. Refusals must not move the counter (a sender that keeps
//! trying on an exhausted SA would otherwise wrap it), so within `FAST_MARGIN` of the limit
//! allocation switches to a compare-and-swap loop that never passes `limit + 1`. Threads that
//! read the counter below the margin and then `fetch_add` late can push it past the limit by
//! at most one each; their results are refused, and the limits below leave room for that.

use std::sync::atomic::{AtomicU64, Ordering};

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

/// Below `limit - FAST_MARGIN` allocation is a plain `fetch_add`. Must exceed the number of
/// threads that can be between their load and their `fetch_add` at once.
const FAST_MARGIN: u64 = 1 << 20;

/// The outbound sequence counter of one SA.
#[derive(Debug)]
pub(crate) struct SequenceCounter {
    next: AtomicU64,
    limit: u64,
    soft_limit: u64,
}

impl SequenceCounter {
    /// A counter whose first number is `first`, last is `limit`, and which asks for a rekey
    /// once a number above `soft_limit` has been handed out.
    pub(crate) fn new(first: u64, limit: u64, soft_limit: u64) -> Self {
        Self {
            next: AtomicU64::new(first.max(1)),
            limit,
            soft_limit,
        }
    }

    /// The next unused sequence number, or `None` once `limit` has been used.
    #[inline]
    pub(crate) fn allocate(&self) -> Option<u64> {
        let cur = self.next.load(Ordering::Relaxed);
        if cur.saturating_add(FAST_MARGIN) <= self.limit {
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
    #[cfg(test)]
    pub(crate) fn set_next(&self, next: u64) {
        self.next.store(next, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    #[test]
    fn starts_at_one_and_stops_at_the_limit() {
        let c = SequenceCounter::new(1, MAX_SEQ, DEFAULT_SOFT_LIMIT);
        assert_eq!(c.allocate(), Some(1));
        assert_eq!(c.allocate(), Some(2));
        assert!(!c.needs_rekey());
        c.set_next(DEFAULT_SOFT_LIMIT);
        assert_eq!(c.allocate(), Some(DEFAULT_SOFT_LIMIT));
        assert!(!c.needs_rekey());
        assert_eq!(c.allocate(), Some(DEFAULT_SOFT_LIMIT + 1));
        assert!(c.needs_rekey());
        c.set_next(MAX_SEQ - 2);
        assert_eq!(c.allocate(), Some(MAX_SEQ - 2));
        assert_eq!(c.allocate(), Some(MAX_SEQ - 1));
        assert_eq!(c.allocate(), Some(MAX_SEQ));
        assert!(c.is_exhausted());
        for _ in 0..1000 {
            assert_eq!(c.allocate(), None);
        }
        // Refusals do not move the counter.
        assert_eq!(c.peek(), MAX_SEQ + 1);
    }

    #[test]
    fn esn_limit() {
        let c = SequenceCounter::new(MAX_ESN - 1, MAX_ESN, DEFAULT_SOFT_LIMIT_ESN);
        assert!(c.needs_rekey());
        assert_eq!(c.allocate(), Some(MAX_ESN - 1));
        assert_eq!(c.allocate(), Some(MAX_ESN));
        assert_eq!(c.allocate(), None);
        assert_eq!(c.peek(), MAX_ESN + 1);
    }

    #[test]
    fn concurrent_allocation_is_unique_and_exact_at_the_limit() {
        // Start inside the fast-path margin's reach so both paths run: 3 * 2^20 numbers.
        let first = MAX_SEQ - 3 * FAST_MARGIN + 1;
        let c = Arc::new(SequenceCounter::new(first, MAX_SEQ, DEFAULT_SOFT_LIMIT));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    while let Some(n) = c.allocate() {
                        got.push(n);
                    }
                    // Keep knocking: must stay refused.
                    for _ in 0..100 {
                        assert_eq!(c.allocate(), None);
                    }
                    got
                })
            })
            .collect();
        let mut all = HashSet::new();
        for t in threads {
            for n in t.join().unwrap() {
                assert!(all.insert(n), "{n} handed out twice");
            }
        }
        assert_eq!(all.len() as u64, MAX_SEQ - first + 1);
        assert_eq!(all.iter().min(), Some(&first));
        assert_eq!(all.iter().max(), Some(&MAX_SEQ));
    }
}
