//! Tests of the replay window: RFC 4303 §3.4.3 edges, Appendix A ESN inference, a proptest
//! against a reference model, and concurrent updates that must accept each number once.

use super::*;
use proptest::prelude::*;
use std::collections::HashSet;
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

    fn update(&mut self, seq: u64) -> Result<(), ReplayError> {
        self.verdict(seq)?;
        self.seen.insert(seq);
        self.top = self.top.max(seq);
        Ok(())
    }
}

#[test]
fn window_edges() {
    let w = ReplayWindow::new(64);
    assert_eq!(w.check(0), Err(ReplayError::Invalid));
    assert_eq!(w.update(0), Err(ReplayError::Invalid));
    assert_eq!(w.update(1), Ok(()));
    assert_eq!(w.update(1), Err(ReplayError::Replayed));
    assert_eq!(w.check(1), Err(ReplayError::Replayed));
    assert_eq!(w.update(100), Ok(()));
    // Window is 37..=100.
    assert_eq!(w.check(36), Err(ReplayError::TooOld { top: 100 }));
    assert_eq!(w.update(36), Err(ReplayError::TooOld { top: 100 }));
    assert_eq!(w.check(37), Ok(()));
    assert_eq!(w.update(37), Ok(()));
    assert_eq!(w.update(37), Err(ReplayError::Replayed));
    assert_eq!(w.check(100), Err(ReplayError::Replayed));
    assert_eq!(w.check(101), Ok(()));
    // A jump far beyond the ring clears everything; the old top is now too old.
    assert_eq!(w.update(1_000_000), Ok(()));
    assert_eq!(w.update(100), Err(ReplayError::TooOld { top: 1_000_000 }));
    assert_eq!(w.update(999_937), Ok(()));
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
            for &s in chunk.iter().rev() {
                assert_eq!(w.update(s), Ok(()), "size {size} seq {s}");
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
    for low in [5u32, 0xffff_fff9, 0, 0xffff_ffff, 1, 0xffff_fffe] {
        let s = w.infer_esn(low).unwrap();
        assert_eq!(s as u32, low);
        assert_eq!(w.check(s), Ok(()));
        assert_eq!(w.update(s), Ok(()), "{s:#x}");
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
