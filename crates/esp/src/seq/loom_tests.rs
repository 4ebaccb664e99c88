//! Model-checked interleavings of the sequence counter (loom explores every schedule of its
//! atomics). Run with `RUSTFLAGS="--cfg loom" cargo test -p protego-esp --release --lib loom`.
//!
//! The limits are tiny and the fast-path margin is 0 or 1, so the models reach every case in a
//! few operations: racing `fetch_add`s, a `fetch_add` that lands past the limit after another
//! thread took the last number, the compare-and-swap path racing the fast path, and threads
//! that keep asking after exhaustion. In every schedule the numbers handed out must be
//! distinct, exactly `first..=limit` when demand exceeds supply, and the counter must end at
//! most one past the limit per refused thread.

use super::*;
use loom::sync::Arc;
use loom::thread;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// Runs `per_thread[t]` allocations on thread `t` (thread 0 is the model's own) and checks
/// the counter's specification; `first..=limit` is the supply.
fn race(first: u64, limit: u64, margin: u64, per_thread: &'static [usize]) {
    let c = Arc::new(SequenceCounter::with_margin(first, limit, limit, margin));
    let spawned: Vec<_> = per_thread[1..]
        .iter()
        .map(|&n| {
            let c = Arc::clone(&c);
            thread::spawn(move || (0..n).map(|_| c.allocate()).collect::<Vec<_>>())
        })
        .collect();
    let mut traces = vec![(0..per_thread[0]).map(|_| c.allocate()).collect::<Vec<_>>()];
    traces.extend(spawned.into_iter().map(|h| h.join().unwrap()));

    let mut got = Vec::new();
    let mut refused_threads = 0;
    for trace in &traces {
        let mut refused = false;
        for n in trace {
            match n {
                Some(n) => {
                    assert!(!refused, "{n} handed out after a refusal");
                    got.push(*n);
                }
                None => refused = true,
            }
        }
        refused_threads += u64::from(refused);
    }
    got.sort_unstable();
    let demand: u64 = per_thread.iter().map(|&n| n as u64).sum();
    let supply = limit + 1 - first;
    let expected: Vec<u64> = (first..first + demand.min(supply)).collect();
    assert_eq!(got, expected, "numbers handed out");
    let end = c.peek();
    assert!(end >= first + demand.min(supply));
    assert!(end <= limit + 1 + refused_threads, "counter ran to {end}");
    if demand < supply {
        assert_eq!(
            end,
            first + demand,
            "the counter moved without handing out a number"
        );
    } else {
        assert!(c.is_exhausted());
        assert_eq!(c.allocate(), None);
        assert_eq!(
            c.peek(),
            end,
            "a refusal after exhaustion moved the counter"
        );
    }
}

#[test]
fn loom_fast_path_racing_at_the_limit() {
    // Margin 0: both threads take the fetch_add path up to the limit; one of them can land
    // past it after the other took the last number.
    model(|| race(1, 2, 0, &[2, 2]));
}

#[test]
fn loom_fast_and_slow_paths_racing() {
    // Margin 1: number 3 is allocated on the fast path, 4 on the compare-and-swap path; a
    // thread that loaded 3 can fetch_add after the other already took 4.
    model(|| race(3, 4, 1, &[2, 2]));
}

#[test]
fn loom_three_allocators_one_number_each_across_the_margin() {
    model(|| race(1, 2, 1, &[1, 1, 1]));
}

#[test]
fn loom_supply_exceeds_demand() {
    // No refusals: the counter ends exactly after the last number handed out.
    model(|| race(5, 9, 1, &[2, 1]));
}
