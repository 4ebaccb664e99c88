//! Tests of the replay window: RFC 4303 §3.4.3 edges, Appendix A ESN inference, a proptest
//! against a reference model, concurrent updates that must accept each number once, and
//! property tests that run random streams (duplicates, reorderings) on several threads and
//! check the window's exact concurrent contract (module docs of `replay.rs`). The loom model
//! of the same code is in `loom_tests.rs`.

use super::*;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU8;
use std::sync::Arc;

/// The RFC's rule, written as plainly as possible: accepted numbers in a set, the highest
/// accepted number, and "reject 0, anything <= top - W, anything seen".
struct Model {
    size: u64,
    top: u64,
    seen: HashSet<u64>,
}

impl Model {
    fn new(size: u32) -> Self {
        Self {
            size: u64::from(size),
            top: 0,
            seen: HashSet::new(),
        }
    }

    fn verdict(&self, seq: u64) -> Result<(), ReplayError> {
        if seq == 0 {
            Err(ReplayError::Invalid)
        } else if self.top >= self.size && seq <= self.top - self.size {
            Err(ReplayError::TooOld { top: self.top })
        } else if self.seen.contains(&seq) {
            Err(ReplayError::Replayed)
        } else {
            Ok(())
        }
    }

    /// Accepts `seq` if the rule allows; returns how far below the highest accepted number
    /// it was.
    fn update(&mut self, seq: u64) -> Result<u64, ReplayError> {
        self.verdict(seq)?;
        let behind = self.top.saturating_sub(seq);
        self.seen.insert(seq);
        self.top = self.top.max(seq);
        Ok(behind)
    }
}

#[test]
fn window_edges() {
    let w = ReplayWindow::new(64);
    assert_eq!(w.check(0), Err(ReplayError::Invalid));
    assert_eq!(w.update(0), Err(ReplayError::Invalid));
    assert_eq!(w.update(1), Ok(0));
    assert_eq!(w.update(1), Err(ReplayError::Replayed));
    assert_eq!(w.check(1), Err(ReplayError::Replayed));
    assert_eq!(w.update(100), Ok(0));
    // Window is 37..=100.
    assert_eq!(w.check(36), Err(ReplayError::TooOld { top: 100 }));
    assert_eq!(w.update(36), Err(ReplayError::TooOld { top: 100 }));
    assert_eq!(w.check(37), Ok(()));
    assert_eq!(w.update(37), Ok(63));
    assert_eq!(w.update(37), Err(ReplayError::Replayed));
    assert_eq!(w.check(100), Err(ReplayError::Replayed));
    assert_eq!(w.check(101), Ok(()));
    // A jump far beyond the ring clears everything; the old top is now too old.
    assert_eq!(w.update(1_000_000), Ok(0));
    assert_eq!(w.update(100), Err(ReplayError::TooOld { top: 1_000_000 }));
    assert_eq!(w.update(999_937), Ok(63));
    assert_eq!(
        w.update(999_936),
        Err(ReplayError::TooOld { top: 1_000_000 })
    );
    assert_eq!(w.top(), 1_000_000);
    assert_eq!(w.size(), 64);
}

#[test]
fn every_number_in_a_large_window_once() {
    for size in [32, 64, 65, 1024, 4096] {
        let w = ReplayWindow::new(size);
        // Out of order within the window: a descending run per chunk.
        let mut accepted = 0;
        for chunk in (1..=20_000u64)
            .collect::<Vec<_>>()
            .chunks(size as usize / 2)
        {
            let top = chunk[chunk.len() - 1];
            for &s in chunk.iter().rev() {
                assert_eq!(w.update(s), Ok(top - s), "size {size} seq {s}");
                accepted += 1;
            }
            for &s in chunk {
                assert_eq!(w.update(s), Err(ReplayError::Replayed));
            }
        }
        assert_eq!(accepted, 20_000);
    }
}

#[test]
fn esn_inference_appendix_a() {
    let w = ReplayWindow::new(64);
    // Nothing received: low numbers are in subspace 0; a number "behind" 0 does not exist.
    assert_eq!(w.infer_esn(1), Some(1));
    assert_eq!(w.infer_esn(0), None);
    assert_eq!(w.infer_esn(u32::MAX), None);
    // Case A, window inside subspace 0: a low number far below the window is in subspace 1.
    w.update(0xffff_fff0).unwrap();
    assert_eq!(w.infer_esn(0xffff_ffb1), Some(0xffff_ffb1));
    assert_eq!(w.infer_esn(0xffff_ffff), Some(0xffff_ffff));
    assert_eq!(w.infer_esn(0xffff_ffb0), Some(0x1_ffff_ffb0));
    assert_eq!(w.infer_esn(0), Some(1 << 32));
    assert_eq!(w.infer_esn(5), Some((1 << 32) + 5));
    // Cross the 2^32 boundary: case B, window spans subspaces 0 and 1.
    w.update((1 << 32) + 5).unwrap();
    assert_eq!(w.infer_esn(0xffff_fff0), Some(0xffff_fff0));
    assert_eq!(w.infer_esn(0xffff_ffc6), Some(0xffff_ffc6));
    assert_eq!(w.infer_esn(3), Some((1 << 32) + 3));
    assert_eq!(w.infer_esn(0x8000_0000), Some((1 << 32) + 0x8000_0000));
    // The top of the 64-bit space.
    let w = ReplayWindow::new(64);
    w.update(u64::MAX - 10).unwrap();
    assert_eq!(w.infer_esn(u32::MAX), Some(u64::MAX));
    assert_eq!(w.infer_esn(0), None);
}

#[test]
fn esn_window_across_the_boundary() {
    let w = ReplayWindow::new(128);
    let base = (1u64 << 32) - 40;
    for s in base..base + 30 {
        w.update(s).unwrap();
    }
    // Packets from both sides of 2^32, out of order, each accepted once.
    // With how far below the top (2^32 + 5 once it arrived) each was accepted.
    for (low, behind) in [
        (5u32, 0),
        (0xffff_fff9, 12),
        (0, 5),
        (0xffff_ffff, 6),
        (1, 4),
        (0xffff_fffe, 7),
    ] {
        let s = w.infer_esn(low).unwrap();
        assert_eq!(s as u32, low);
        assert_eq!(w.check(s), Ok(()));
        assert_eq!(w.update(s), Ok(behind), "{s:#x}");
        let again = w.infer_esn(low).unwrap();
        assert_eq!(again, s);
        assert_eq!(w.update(again), Err(ReplayError::Replayed));
    }
    assert_eq!(w.top(), (1 << 32) + 5);
    // base is 2^32 - 40, still inside the 128 window; base - 100 is not.
    assert_eq!(w.update(base), Err(ReplayError::Replayed));
    // Below the window, Appendix A2.2 reads a number as the next subspace's (the ICV then
    // decides); the same number as a full 64-bit value is too old.
    assert_eq!(
        w.infer_esn((base - 100) as u32),
        Some((1 << 32) + base - 100)
    );
    assert!(matches!(
        w.update(base - 100),
        Err(ReplayError::TooOld { .. })
    ));
}

fn seq_ops() -> impl Strategy<Value = (u32, Vec<(bool, u64)>)> {
    (
        prop_oneof![Just(32u32), Just(64), Just(100), Just(1024)],
        any::<u64>(),
    )
        .prop_flat_map(|(size, base)| {
            let base = base % (u64::MAX - 1_000_000);
            // Numbers clustered so that duplicates, in-window and too-old cases all occur.
            let op = (any::<bool>(), 0u64..3 * u64::from(size) + 200)
                .prop_map(move |(c, d)| (c, base + d));
            (Just(size), proptest::collection::vec(op, 1..400))
        })
}

proptest! {
    #[test]
    fn matches_reference_model((size, ops) in seq_ops()) {
        let w = ReplayWindow::new(size);
        let mut m = Model::new(size);
        for (check_only, seq) in ops {
            if check_only {
                prop_assert_eq!(w.check(seq), m.verdict(seq), "check {}", seq);
            } else {
                prop_assert_eq!(w.update(seq), m.update(seq), "update {}", seq);
            }
            prop_assert_eq!(w.top(), m.top);
        }
    }

    #[test]
    fn esn_inference_recovers_nearby_numbers(top in 1u64..u64::MAX, size in 32u32..5000, delta in any::<i64>()) {
        // Any number from the bottom of the window up to 2^32 - W past the top is recovered
        // from its low 32 bits (RFC 4303 Appendix A2.2).
        let w = ReplayWindow::new(size);
        w.update(top).unwrap();
        let lo = top.saturating_sub(u64::from(size) - 1).max(1);
        let span = (1u64 << 32) - u64::from(size);
        let hi = top.saturating_add(span);
        let width = hi - lo + 1;
        let s = lo + (delta as u64) % width;
        prop_assert_eq!(w.infer_esn(s as u32), Some(s));
    }
}

#[test]
fn concurrent_updates_accept_each_number_at_most_once() {
    const N: u64 = 30_000;
    for size in [64u32, 1024, 4096] {
        let w = Arc::new(ReplayWindow::new(size));
        let hits: Arc<Vec<AtomicU8>> = Arc::new((0..=N).map(|_| AtomicU8::new(0)).collect());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (w, hits) = (Arc::clone(&w), Arc::clone(&hits));
                std::thread::spawn(move || {
                    // Every thread offers every number (duplicates across threads), in a
                    // per-thread jittered order so that advances and in-window sets race.
                    for chunk in (1..=N).collect::<Vec<_>>().chunks(48) {
                        let k = chunk.len();
                        for i in 0..k {
                            let s = chunk[(i * 7 + t as usize * 13) % k];
                            if w.update(s).is_ok() {
                                hits[s as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let accepted = hits
            .iter()
            .filter(|h| h.load(std::sync::atomic::Ordering::Relaxed) == 1)
            .count();
        for (s, h) in hits.iter().enumerate() {
            assert!(
                h.load(std::sync::atomic::Ordering::Relaxed) <= 1,
                "size {size}: {s} accepted twice"
            );
        }
        // Each number is offered by 4 threads; with a window wider than the jitter nearly all
        // are accepted exactly once.
        assert!(
            accepted as u64 > N * 9 / 10,
            "size {size}: only {accepted} accepted"
        );
        // Afterwards nothing is accepted again.
        for s in (N - u64::from(size) + 1)..=N {
            assert!(w.update(s).is_err());
        }
    }
}

/// One offer of a number to the window and the window's answer.
#[derive(Debug, Clone, Copy)]
struct Offer {
    seq: u64,
    result: Result<u64, ReplayError>,
}

/// Offers `per_thread[t]` in order on thread `t`, all threads released at once; thread `t`
/// yields before offer `i` when bit `(i + 7 * t) % 64` of `yields` is set, so that runs
/// differ in their interleavings.
fn offer_concurrently(w: &Arc<ReplayWindow>, per_thread: Vec<Vec<u64>>, yields: u64) -> Vec<Offer> {
    let start = Arc::new(std::sync::Barrier::new(per_thread.len()));
    let handles: Vec<_> = per_thread
        .into_iter()
        .enumerate()
        .map(|(t, seqs)| {
            let (w, start) = (Arc::clone(w), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                seqs.into_iter()
                    .enumerate()
                    .map(|(i, seq)| {
                        if yields >> ((i + 7 * t) % 64) & 1 != 0 {
                            std::thread::yield_now();
                        }
                        Offer {
                            seq,
                            result: w.update(seq),
                        }
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().expect("updating thread"))
        .collect()
}

/// Deals `(offset, thread)` pairs out to `threads` threads as `base + offset`, keeping
/// each thread's share in the generated order (a random reordering of the whole stream).
fn deal(base: u64, items: &[(u64, usize)], threads: usize) -> Vec<Vec<u64>> {
    let mut per_thread = vec![Vec::new(); threads];
    for &(offset, t) in items {
        per_thread[t % threads].push(base + offset);
    }
    per_thread
}

/// The accepted numbers of a run, checking that none was accepted twice.
fn accepted_once(offers: &[Offer]) -> Result<HashMap<u64, u64>, TestCaseError> {
    let mut accepted = HashMap::new();
    for o in offers {
        if let Ok(behind) = o.result {
            prop_assert!(
                accepted.insert(o.seq, behind).is_none(),
                "{} accepted twice",
                o.seq
            );
        }
    }
    Ok(accepted)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Numbers that all lie within the window of each other: whatever the interleaving,
    /// duplicates and order, every distinct number is accepted exactly once and every other
    /// offer is refused as a replay. One thread must match the sequential model exactly.
    #[test]
    fn concurrent_within_the_window_each_number_exactly_once(
        size in prop_oneof![Just(32u32), Just(64), Just(100), Just(1024)],
        base in 1u64..(1 << 40),
        gap in 0u64..3000,
        threads in 1usize..=4,
        raw in proptest::collection::vec((any::<u64>(), 0usize..4), 1..300),
        yields in any::<u64>(),
    ) {
        let w = Arc::new(ReplayWindow::new(size));
        let mut model = Model::new(size);
        // Optionally start from an earlier position, `gap` below the band.
        let base = base + gap + 1;
        if gap % 3 != 0 {
            prop_assert_eq!(w.update(base - 1 - gap), Ok(0));
            prop_assert_eq!(model.update(base - 1 - gap), Ok(0));
        }
        let items: Vec<(u64, usize)> =
            raw.iter().map(|&(o, t)| (o % u64::from(size), t)).collect();
        let per_thread = deal(base, &items, threads);
        let offered: HashSet<u64> = per_thread.iter().flatten().copied().collect();
        let sequential: Option<Vec<Result<u64, ReplayError>>> =
            (threads == 1).then(|| per_thread[0].iter().map(|&s| model.update(s)).collect());
        let offers = offer_concurrently(&w, per_thread, yields);

        let accepted = accepted_once(&offers)?;
        prop_assert_eq!(accepted.len(), offered.len(), "every distinct number accepted");
        for o in &offers {
            if o.result.is_err() {
                prop_assert_eq!(o.result, Err(ReplayError::Replayed), "{}", o.seq);
            }
        }
        prop_assert_eq!(Some(w.top()), offered.iter().copied().max());
        for (&s, &behind) in &accepted {
            prop_assert!(behind <= w.top() - s, "{} accepted {} behind", s, behind);
            prop_assert!(behind < u64::from(size), "{} accepted {} behind", s, behind);
        }
        if let Some(sequential) = sequential {
            let got: Vec<_> = offers.iter().map(|o| o.result).collect();
            prop_assert_eq!(got, sequential);
        }
    }

    /// Numbers spread over several windows, so that advances recycle ring words while other
    /// threads set bits in them. The exact contract (module docs): no number accepted twice;
    /// too-old refusals really are too old; a number inside the final window that was never
    /// accepted was refused only because an older number sharing its ring bit was refused as
    /// too old in a race with an advance; `top` is the highest accepted number, or one
    /// refused in the same race.
    #[test]
    fn concurrent_across_windows_matches_the_contract(
        size in prop_oneof![Just(32u32), Just(64), Just(100)],
        base in 1u64..(1 << 40),
        threads in 2usize..=4,
        raw in proptest::collection::vec((any::<u64>(), 0usize..4), 1..400),
        spread in 2u64..6,
        yields in any::<u64>(),
    ) {
        let w = Arc::new(ReplayWindow::new(size));
        let ring = BITS * (w.mask + 1);
        let items: Vec<(u64, usize)> =
            raw.iter().map(|&(o, t)| (o % (spread * u64::from(size)), t)).collect();
        let offers = offer_concurrently(&w, deal(base, &items, threads), yields);

        let accepted = accepted_once(&offers)?;
        let top = w.top();
        let bottom = top.saturating_sub(u64::from(size));
        let too_old_refused: HashSet<u64> = offers
            .iter()
            .filter(|o| matches!(o.result, Err(ReplayError::TooOld { .. })))
            .map(|o| o.seq)
            .collect();
        let explained = |s: u64| too_old_refused.iter().any(|&o| o < s && (s - o).is_multiple_of(ring));
        for o in &offers {
            match o.result {
                Ok(behind) => {
                    prop_assert!(behind <= top - o.seq && behind < u64::from(size), "{:?}", o);
                }
                Err(ReplayError::TooOld { top: t }) => {
                    prop_assert!(o.seq <= t - u64::from(size) && t <= top, "{:?}", o);
                }
                Err(ReplayError::Replayed) => {
                    prop_assert!(
                        accepted.contains_key(&o.seq) || o.seq <= bottom || explained(o.seq),
                        "{} refused as a replay, never accepted, inside the final window {}..={}",
                        o.seq, bottom + 1, top
                    );
                }
                Err(ReplayError::Invalid) => prop_assert!(false, "{:?}", o),
            }
        }
        let max_accepted = accepted.keys().copied().max().unwrap_or(0);
        prop_assert!(top == max_accepted || (top > max_accepted && explained(top)));
        // Afterwards, sequentially, the window is exact again for what is left.
        for s in bottom + 1..=top {
            let again = w.update(s);
            if accepted.contains_key(&s) {
                prop_assert_eq!(again, Err(ReplayError::Replayed));
            }
        }
    }
}
