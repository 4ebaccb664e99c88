//! Tests of the generation against the paper's loop (`oracle.rs`) and of its properties:
//! conservation, weights, work conservation, the floor, several intervals at once, table
//! changes.

use proptest::collection::vec;
use proptest::prelude::*;

use crate::oracle::algorithm1;
use crate::{Buckets, FairError, Generation, Occupant, Params, Weight, MAX_SLOTS};

/// A worker's state before a generation: B, Δt, and per slot a weight and tokens (or vacant).
#[derive(Debug, Clone)]
struct Scenario {
    bucket: u64,
    interval: u64,
    slots: Vec<Option<(u32, i64)>>,
}

impl Scenario {
    fn buckets(&self) -> Buckets {
        let params = Params::new(self.interval, self.bucket).expect("scenario parameters in range");
        let table: Vec<Option<Occupant>> = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.map(|(w, _)| Occupant {
                    key: i as u64,
                    weight: Weight::new(w.into()).expect("scenario weight in range"),
                })
            })
            .collect();
        let mut b = Buckets::new(params, &table).expect("at most 64 slots");
        for (i, s) in self.slots.iter().enumerate() {
            if let Some((_, t)) = s {
                b.charge(i, (self.bucket as i64 - t) as u64);
                assert_eq!(b.tokens(i), Some(*t));
            }
        }
        b
    }

    /// The oracle's buckets after `k` generations.
    fn oracle(&self, k: u64) -> (Vec<f64>, f64) {
        let w_sum: u64 = self
            .slots
            .iter()
            .flatten()
            .map(|&(w, _)| u64::from(w))
            .sum();
        let v: Vec<f64> = self
            .slots
            .iter()
            .map(|s| s.map_or(0.0, |(w, _)| w as f64 / w_sum as f64))
            .collect();
        let mut b: Vec<f64> = self
            .slots
            .iter()
            .map(|s| s.map_or(0.0, |(_, t)| t as f64))
            .collect();
        let mut discarded = 0.0;
        for _ in 0..k {
            discarded += algorithm1(&mut b, &v, self.bucket as f64, self.interval as f64).0;
        }
        (b, discarded)
    }
}

fn tokens(b: &Buckets) -> Vec<Option<i64>> {
    (0..b.slots()).map(|i| b.tokens(i)).collect()
}

fn weight() -> impl Strategy<Value = u32> {
    prop_oneof![1u32..=4, 1u32..=1000, 1u32..=65_535]
}

fn level(bucket: u64) -> impl Strategy<Value = i64> {
    let b = bucket as i64;
    prop_oneof![Just(b), Just(-b), Just(0), -b..=b]
}

fn scenario(max_slots: usize) -> impl Strategy<Value = Scenario> {
    (1u64..=1 << 32, 1u64..=1 << 33, 1usize..=max_slots).prop_flat_map(|(bucket, interval, n)| {
        let slot = prop_oneof![
            1 => Just(None),
            8 => (weight(), level(bucket)).prop_map(Some),
        ];
        vec(slot, n).prop_map(move |slots| Scenario {
            bucket,
            interval,
            slots,
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The water-filling gives the paper's loop's buckets (rounded to whole cycles), for `k`
    /// intervals at once against `k` runs of the loop.
    #[test]
    fn agrees_with_algorithm1(s in scenario(64), k in prop_oneof![Just(1u64), 1u64..=8]) {
        let mut b = s.buckets();
        let g = b.generate(k);
        let (expected, mut discarded) = s.oracle(k);
        if s.slots.iter().all(Option::is_none) {
            // The loop generates nothing without tenants; we count the core's time as discarded.
            discarded = g.generated as f64;
        }
        for (slot, (got, want)) in tokens(&b).iter().zip(&expected).enumerate() {
            if let Some(got) = got {
                prop_assert!((*got as f64 - want).abs() <= 1.01,
                    "slot {}: {} against the loop's {}", slot, got, want);
            }
        }
        let tolerance = 1.0 + s.slots.len() as f64;
        prop_assert!((g.discarded as f64 - discarded).abs() <= tolerance,
            "discarded {} against the loop's {}", g.discarded, discarded);
    }

    /// Nothing is created or lost: added + discarded = generated, the buckets grew by exactly
    /// what was added, none above B or shrinking, and nothing is discarded while a bucket is
    /// below B.
    #[test]
    fn conserves_tokens(s in scenario(64), k in 1u64..=8) {
        let mut b = s.buckets();
        let before = tokens(&b);
        let g = b.generate(k);
        let after = tokens(&b);
        prop_assert_eq!(g.generated, k * s.interval);
        prop_assert_eq!(g.added + g.discarded, g.generated);
        let grown: i64 = before.iter().zip(&after).map(|(x, y)| y.unwrap_or(0) - x.unwrap_or(0)).sum();
        prop_assert_eq!(grown as u64, g.added);
        for (x, y) in before.iter().zip(&after) {
            prop_assert_eq!(x.is_some(), y.is_some());
            if let (Some(x), Some(y)) = (x, y) {
                prop_assert!(x <= y && *y <= s.bucket as i64);
            }
        }
        if g.discarded > 0 {
            prop_assert!(after.iter().flatten().all(|&t| t == s.bucket as i64));
        }
    }

    /// While no bucket fills, every tenant gets its weight's share of what was generated,
    /// rounded to a whole cycle.
    #[test]
    fn shares_by_weight(
        weights in vec(weight(), 1..=64),
        depth in vec(0.0f64..=1.0, 64),
        bucket in 1u64 << 20..=1 << 32,
        k in 1u64..=4,
        per_interval in 0.0f64..=0.25,
    ) {
        let interval = ((bucket as f64 * per_interval) as u64).max(1);
        // Every bucket at or below 0: each has room for at least B ≥ k·Δt, no bucket fills.
        let slots = weights.iter().zip(&depth)
            .map(|(&w, &d)| Some((w, -((bucket as f64 * d) as i64))))
            .collect();
        let s = Scenario { bucket, interval, slots };
        let mut b = s.buckets();
        let before = tokens(&b);
        let g = b.generate(k);
        prop_assert_eq!(g.discarded, 0);
        let w_sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
        for (i, &w) in weights.iter().enumerate() {
            let added = (b.tokens(i).unwrap_or(0) - before[i].unwrap_or(0)) as u128;
            let exact = u128::from(g.generated) * u128::from(w);
            prop_assert!((added * w_sum).abs_diff(exact) < w_sum,
                "slot {} (weight {}) got {} of {}", i, w, added, g.generated);
        }
    }

    /// Work conservation: idle tenants (full buckets) get nothing and lose nothing, and the busy
    /// ones get exactly what they would get if the idle ones were not there.
    #[test]
    fn idle_share_goes_to_busy(s in scenario(64), idle in vec(any::<bool>(), 64), k in 1u64..=4) {
        let full = s.bucket as i64;
        let with_idle = Scenario {
            slots: s.slots.iter().zip(&idle)
                .map(|(slot, &idle)| slot.map(|(w, t)| (w, if idle { full } else { t })))
                .collect(),
            ..s.clone()
        };
        let without_idle = Scenario {
            slots: with_idle.slots.iter()
                .map(|slot| slot.filter(|&(_, t)| t < full))
                .collect(),
            ..s
        };
        let (mut a, mut b) = (with_idle.buckets(), without_idle.buckets());
        let (ga, gb) = (a.generate(k), b.generate(k));
        prop_assert_eq!(ga, gb);
        for (slot, occupant) in with_idle.slots.iter().enumerate() {
            match occupant {
                Some((_, t)) if *t == full => prop_assert_eq!(a.tokens(slot), Some(full)),
                _ => prop_assert_eq!(a.tokens(slot), b.tokens(slot)),
            }
        }
    }

    /// Whatever is charged and generated, a bucket stays within [−B, B] and `admit` says
    /// whether it holds tokens.
    #[test]
    fn stays_within_floor_and_bucket(
        s in scenario(16),
        ops in vec((0usize..20, any::<u64>(), 0u8..4), 1..200),
    ) {
        let mut b = s.buckets();
        let mut now = 0u64;
        for (slot, n, op) in ops {
            match op {
                0 => b.charge(slot, n >> (n % 64)),
                1 => b.refund(slot, n >> (n % 64)),
                2 => { b.generate(n % 4); }
                _ => { now = now.saturating_add(n % (4 * s.interval)); b.tick(now); }
            }
            for slot in 0..20 {
                match b.tokens(slot) {
                    Some(t) => {
                        prop_assert!(-(s.bucket as i64) <= t && t <= s.bucket as i64);
                        prop_assert_eq!(b.admit(slot), t > 0);
                    }
                    None => prop_assert!(b.admit(slot)),
                }
            }
        }
    }

    /// After an idle period long enough to fill every bucket (k·Δt ≥ the room of all of
    /// them), every bucket is full and the rest is discarded, at the cost of one generation.
    #[test]
    fn long_idle_fills_all(s in scenario(64)) {
        let mut b = s.buckets();
        let room: u64 = s.slots.iter().flatten().map(|&(_, t)| (s.bucket as i64 - t) as u64).sum();
        let k = room.div_ceil(s.interval).max(1);
        let g = b.generate(k);
        prop_assert_eq!(g.added, room);
        prop_assert_eq!(g.discarded, k * s.interval - room);
        prop_assert!(tokens(&b).iter().flatten().all(|&t| t == s.bucket as i64));
    }
}

/// The paper's two steps on a small case, by hand: B = 10, Δt = 8, weights 1, 1, 2, so
/// r = 2, 2, 4. Bucket 0 (at 9) takes 1 and leaves a surplus of 1, split 1:2 among the others:
/// 2⅓ and 4⅔. Bucket 0 fills, so the slow path runs and rounds cumulatively in the order of room
/// per weight (bucket 2, then 1): 4 and 3.
#[test]
fn small_case_by_hand() {
    let s = Scenario {
        bucket: 10,
        interval: 8,
        slots: vec![Some((1, 9)), Some((1, 0)), Some((2, 0))],
    };
    let mut b = s.buckets();
    let g = b.generate(1);
    assert_eq!(tokens(&b), [Some(10), Some(3), Some(4)]);
    assert_eq!(
        g,
        Generation {
            generated: 8,
            added: 8,
            discarded: 0
        }
    );
    let (oracle, discarded) = s.oracle(1);
    assert_eq!(discarded, 0.0);
    assert!((oracle[1] - 7.0 / 3.0).abs() < 1e-9 && (oracle[2] - 14.0 / 3.0).abs() < 1e-9);
}

/// 1024 tenants in mixed states against the loop (the proptests stop at 64).
#[test]
fn many_tenants_agree_with_algorithm1() {
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let bucket = 4_000_000u64;
    for round in 0..20 {
        let slots = (0..1024)
            .map(|_| {
                let w = (next() % 8 + 1) as u32;
                match next() % 4 {
                    0 => Some((w, bucket as i64)),
                    1 => Some((w, -(bucket as i64))),
                    _ => Some((w, (next() % (2 * bucket)) as i64 - bucket as i64)),
                }
            })
            .collect();
        let s = Scenario {
            bucket,
            interval: 1_000_000 * (round + 1),
            slots,
        };
        let mut b = s.buckets();
        let g = b.generate(1);
        assert_eq!(g.added + g.discarded, g.generated);
        let (expected, _) = s.oracle(1);
        for (slot, (got, want)) in tokens(&b).iter().zip(&expected).enumerate() {
            let got = got.expect("every slot occupied") as f64;
            assert!(
                (got - want).abs() <= 1.01,
                "round {round} slot {slot}: {got} against {want}"
            );
        }
    }
}

#[test]
fn vacant_slots_get_nothing_and_admit() {
    let s = Scenario {
        bucket: 100,
        interval: 50,
        slots: vec![None, Some((1, 0)), None],
    };
    let mut b = s.buckets();
    b.charge(0, 1_000);
    let g = b.generate(1);
    assert_eq!((g.added, g.discarded), (50, 0));
    assert_eq!(tokens(&b), [None, Some(50), None]);
    assert!(b.admit(0) && b.admit(2) && b.admit(99));
    b.charge(99, 5);
    // No tenant: the core's time is discarded.
    let mut empty = Buckets::new(b.params(), &[None, None]).expect("two slots");
    let g = empty.generate(3);
    assert_eq!((g.generated, g.added, g.discarded), (150, 0, 150));
}

#[test]
fn charge_floors_at_minus_bucket() {
    let s = Scenario {
        bucket: 1_000,
        interval: 100,
        slots: vec![Some((1, 1_000))],
    };
    let mut b = s.buckets();
    assert!(b.admit(0));
    b.charge(0, 1_000);
    assert_eq!(b.tokens(0), Some(0));
    assert!(!b.admit(0));
    b.charge(0, u64::MAX);
    assert_eq!(b.tokens(0), Some(-1_000));
    b.generate(10);
    assert_eq!(b.tokens(0), Some(0));
    assert!(!b.admit(0));
    b.generate(1);
    assert!(b.admit(0));
}

#[test]
fn a_refund_gives_back_up_to_the_bucket() {
    let s = Scenario {
        bucket: 1_000,
        interval: 100,
        slots: vec![Some((1, 1_000)), None],
    };
    let mut b = s.buckets();
    b.charge(0, 1_500);
    assert_eq!(b.tokens(0), Some(-500));
    b.refund(0, 700);
    assert_eq!(b.tokens(0), Some(200));
    b.refund(0, u64::MAX);
    assert_eq!(b.tokens(0), Some(1_000));
    // Vacant and unknown slots are untouched.
    b.refund(1, 5);
    b.refund(99, 5);
    assert_eq!(tokens(&b), [Some(1_000), None]);
}

#[test]
fn huge_interval_counts_saturate() {
    let s = Scenario {
        bucket: 1 << 40,
        interval: 1 << 40,
        slots: vec![Some((3, -(1 << 40))), Some((65_535, 0))],
    };
    let mut b = s.buckets();
    let g = b.generate(u64::MAX);
    assert_eq!(g.generated, u64::MAX);
    assert_eq!(g.added, 3 << 40);
    assert_eq!(g.discarded, u64::MAX);
    assert_eq!(tokens(&b), [Some(1 << 40), Some(1 << 40)]);
}

#[test]
fn tick_generates_whole_elapsed_intervals() {
    let s = Scenario {
        bucket: 1_000,
        interval: 100,
        slots: vec![Some((1, -1_000))],
    };
    let mut b = s.buckets();
    assert_eq!(b.tick(5_000), Generation::default());
    assert_eq!(b.tick(5_099).generated, 0);
    assert_eq!(b.tick(5_250).generated, 200);
    assert_eq!(b.tokens(0), Some(-800));
    // The 50 cycles left over count toward the next interval.
    assert_eq!(b.tick(5_300).generated, 100);
    // A counter that goes backwards generates nothing and moves nothing.
    assert_eq!(b.tick(10).generated, 0);
    assert_eq!(b.tick(5_400).generated, 100);
    assert_eq!(b.tokens(0), Some(-600));
}

#[test]
fn table_changes_keep_other_tenants() {
    let params = Params::new(100, 1_000).expect("in range");
    let occupant = |key, w| {
        Some(Occupant {
            key,
            weight: Weight::new(w).expect("in range"),
        })
    };
    let mut b = Buckets::new(params, &[occupant(7, 1), occupant(8, 1), occupant(9, 1)])
        .expect("three slots");
    b.charge(0, 1_500);
    b.charge(1, 300);
    b.charge(2, 2_000);
    // Slot 0 reweighted, slot 1 removed, slot 2 given to another tenant, slot 3 added.
    b.set_tenants(&[occupant(7, 5), None, occupant(10, 1), occupant(11, 2)])
        .expect("four slots");
    assert_eq!(
        tokens(&b),
        [Some(-500), None, Some(1_000), Some(1_000)],
        "kept, vacant, new, new"
    );
    assert_eq!(b.occupant(0).map(|o| o.weight.get()), Some(5));
    // Slot 1 comes back: a new tenant, full.
    b.set_tenants(&[occupant(7, 5), occupant(12, 1)])
        .expect("two slots");
    assert_eq!(tokens(&b), [Some(-500), Some(1_000)]);
    // New parameters bring the tokens within the new bucket.
    b.set_params(Params::new(100, 400).expect("in range"));
    assert_eq!(tokens(&b), [Some(-400), Some(400)]);
}

#[test]
fn rejects_bad_input() {
    assert_eq!(Weight::new(0), Err(FairError::InvalidWeight { value: 0 }));
    assert_eq!(
        Weight::new(65_536),
        Err(FairError::InvalidWeight { value: 65_536 })
    );
    assert_eq!(Weight::new(65_535), Ok(Weight::MAX));
    assert_eq!(
        Params::new(0, 1),
        Err(FairError::InvalidCycles {
            field: "interval",
            value: 0,
            max: 1 << 40
        })
    );
    assert!(matches!(
        Params::new(1, (1 << 40) + 1),
        Err(FairError::InvalidCycles {
            field: "bucket",
            ..
        })
    ));
    let params = Params::new(1, 1).expect("in range");
    let table = vec![None; MAX_SLOTS + 1];
    assert_eq!(
        Buckets::new(params, &table).map(|_| ()),
        Err(FairError::TooManySlots {
            slots: MAX_SLOTS + 1
        })
    );
    assert_eq!(
        FairError::InvalidWeight { value: 0 }.to_string(),
        "cpu_weight = 0: must be an integer from 1 to 65535"
    );
}

/// The largest table: 65 536 slots at the largest weight and bucket, every bucket in full
/// debt; the sums stay in range and the additions are by weight.
#[test]
fn largest_table() {
    let params = Params::new(1 << 40, 1 << 40).expect("in range");
    let table = vec![
        Some(Occupant {
            key: 0,
            weight: Weight::MAX
        });
        MAX_SLOTS
    ];
    let mut b = Buckets::new(params, &table).expect("MAX_SLOTS slots");
    for slot in 0..MAX_SLOTS {
        b.charge(slot, u64::MAX);
    }
    let g = b.generate(1);
    assert_eq!((g.added, g.discarded), (1 << 40, 0));
    let per_slot = (1u64 << 40) / MAX_SLOTS as u64;
    assert!((0..MAX_SLOTS).all(|i| b.tokens(i) == Some(per_slot as i64 - (1 << 40))));
}

#[test]
fn fewer_tokens_than_the_interval() {
    let params = Params::new(100, 1_000).expect("in range");
    assert_eq!(params.tokens(), 100);
    let params = params.with_tokens(97).expect("in range");
    assert_eq!(
        params.with_tokens(101),
        Err(FairError::InvalidCycles {
            field: "tokens",
            value: 101,
            max: 100
        })
    );
    assert!(params.with_tokens(0).is_err());
    let occupant = Some(Occupant {
        key: 1,
        weight: Weight::ONE,
    });
    let mut b = Buckets::new(params, &[occupant]).expect("one slot");
    b.charge(0, 2_000);
    b.tick(0);
    let g = b.tick(350);
    assert_eq!((g.generated, g.added), (3 * 97, 3 * 97));
    assert_eq!(b.tokens(0), Some(-1_000 + 3 * 97));
}
