//! Tests of the sequence counter (RFC 4303 §3.3.3): the limits with and without ESN, and
//! property tests that run random allocation demands on real threads with random yields, so
//! that the fast path, the compare-and-swap path and late refusals interleave; every run must
//! hand out each number at most once and exactly the numbers `first..` up to the limit.
//! The loom model of the same code is in `loom_tests.rs`.

use super::*;
use proptest::prelude::*;
use std::collections::HashSet;
use std::sync::{Arc, Barrier};

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
    assert_eq!(c.limit(), MAX_ESN);
}

#[test]
fn margin_larger_than_the_limit_uses_the_slow_path_only() {
    let c = SequenceCounter::with_margin(1, 3, 2, 10);
    assert_eq!(
        (c.allocate(), c.allocate(), c.allocate()),
        (Some(1), Some(2), Some(3))
    );
    assert!(c.needs_rekey());
    assert_eq!(c.allocate(), None);
    assert_eq!(c.peek(), 4);
    // A zero margin: the fast path right up to the limit.
    let c = SequenceCounter::with_margin(5, 6, 5, 0);
    assert_eq!(
        (c.allocate(), c.allocate(), c.allocate()),
        (Some(5), Some(6), None)
    );
    // One thread alone reads the counter past the limit after the last number and never
    // takes the fast path again: its refusals do not move it.
    assert_eq!(c.peek(), 7);
    assert_eq!(c.allocate(), None);
    assert_eq!(c.peek(), 7);
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
    assert!(c.peek() <= MAX_SEQ + 1 + 4);
}

/// What one thread saw: its allocations in order (`None` for a refusal).
type Trace = Vec<Option<u64>>;

/// Runs `demands[t]` allocations on thread `t`, all threads released at once; thread `t`
/// yields before allocation `i` when bit `(i + t) % 64` of `yields` is set.
fn run(c: &Arc<SequenceCounter>, demands: &[usize], yields: u64) -> Vec<Trace> {
    let start = Arc::new(Barrier::new(demands.len()));
    let handles: Vec<_> = demands
        .iter()
        .enumerate()
        .map(|(t, &n)| {
            let (c, start) = (Arc::clone(c), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                (0..n)
                    .map(|i| {
                        if yields >> ((i + t) % 64) & 1 != 0 {
                            std::thread::yield_now();
                        }
                        c.allocate()
                    })
                    .collect()
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("allocating thread"))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The specification of the counter, for any interleaving: the numbers handed out are
    /// distinct and are exactly `first, first + 1, ...` up to the demand or the limit; a
    /// thread once refused is refused forever; refusals move the counter at most once per
    /// thread; the soft and hard limit flags agree with what was handed out.
    #[test]
    fn concurrent_allocation_matches_the_spec(
        demands in proptest::collection::vec(0usize..200, 1..=4),
        first in 1u64..1000,
        supply in 1u64..500,
        margin in prop_oneof![Just(0u64), 1u64..8, Just(FAST_MARGIN)],
        soft_offset in 0u64..500,
        yields in any::<u64>(),
    ) {
        let limit = first + supply - 1;
        let soft = (first + soft_offset).min(limit.saturating_sub(1));
        let c = Arc::new(SequenceCounter::with_margin(first, limit, soft, margin));
        let traces = run(&c, &demands, yields);

        let mut got = HashSet::new();
        let mut refused_threads = 0u64;
        for trace in &traces {
            let mut refused = false;
            for n in trace {
                match n {
                    Some(n) => {
                        prop_assert!(!refused, "{} handed out after a refusal", n);
                        prop_assert!(got.insert(*n), "{} handed out twice", n);
                    }
                    None => refused = true,
                }
            }
            refused_threads += u64::from(refused);
        }
        let demand: u64 = demands.iter().map(|&d| d as u64).sum();
        let handed = demand.min(supply);
        prop_assert_eq!(got.len() as u64, handed);
        let expected: HashSet<u64> = (first..first + handed).collect();
        prop_assert_eq!(&got, &expected);
        if demand <= supply {
            prop_assert_eq!(c.peek(), first + demand);
            prop_assert_eq!(refused_threads, 0);
        } else {
            prop_assert!(c.is_exhausted());
            prop_assert!(c.peek() > limit);
            prop_assert!(c.peek() <= limit + 1 + refused_threads, "counter {} ran away", c.peek());
            // Exhausted stays exhausted, without moving.
            let before = c.peek();
            prop_assert_eq!(c.allocate(), None);
            prop_assert_eq!(c.peek(), before);
        }
        prop_assert_eq!(c.needs_rekey(), got.iter().any(|&n| n > soft));
    }
}
