//! Seeded runs of the cluster core's simulation. `PROTEGO_SIM_SEEDS=N` runs N seeds instead
//! of the default; `PROTEGO_SIM_SEED=S` runs seed S alone.

use super::{Stats, World, EVENTS};

/// Seeds run by a plain `cargo test`.
const DEFAULT_SEEDS: u64 = 300;

fn seeds() -> std::ops::Range<u64> {
    if let Some(s) = std::env::var("PROTEGO_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return s..s + 1;
    }
    let n = std::env::var("PROTEGO_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEEDS);
    0..n
}

/// Runs `seed` for [`EVENTS`] events, checking the invariants after each.
fn run(seed: u64) -> World {
    let mut w = World::new(seed);
    for _ in 0..EVENTS {
        w.step();
    }
    w
}

#[test]
fn seeded_runs_keep_the_invariants() {
    let mut total = Stats::default();
    for seed in seeds() {
        let s = run(seed).stats;
        total.installed += s.installed;
        total.deleted_after_steering += s.deleted_after_steering;
        total.failovers += s.failovers;
        total.moves += s.moves;
        total.plan_done += s.plan_done;
        total.takeovers += s.takeovers;
        total.refused += s.refused;
    }
    println!("{total:?}");
    // The runs reach the states the invariants are about (a single seed may not).
    if seeds().count() >= 100 {
        let Stats {
            installed,
            deleted_after_steering,
            failovers,
            moves,
            plan_done,
            takeovers,
            refused,
        } = total;
        for (what, n) in [
            ("installs", installed),
            ("deletions after the steering moved", deleted_after_steering),
            ("failovers", failovers),
            ("moves", moves),
            ("autoscaler decisions", plan_done),
            ("takeovers", takeovers),
            ("refused updates", refused),
        ] {
            assert!(n > 0, "no run went through {what}");
        }
    }
}
