//! Prints what one token generation (`Buckets::generate`) costs at 1, 64 and 1024 tenants, in
//! three worker states:
//! - saturated: every bucket in debt, none fills (the O(n) path, the common one under load);
//! - mixed: half the tenants idle (full), a quarter close to full so that they fill and the
//!   surplus moves (the sorted O(n log n) path), the rest in debt;
//! - long idle: every bucket nearly full and many intervals at once (every bucket fills).
//!
//! `cargo run --release -p protego-fair --example generation_cost`
//!
//! Each generation starts from the same state: the buckets are restored from a copy before
//! each one, and the restore alone is timed and subtracted.

use std::hint::black_box;
use std::time::Instant;

use fair::{Buckets, Occupant, Params, Weight};

/// Δt = 1 ms and B = 4 ms at 3 GHz, generating 31/32 of Δt.
const INTERVAL: u64 = 3_000_000;
const BUCKET: u64 = 12_000_000;

fn state(n: usize, kind: &str) -> Buckets {
    let params = Params::new(INTERVAL, BUCKET)
        .and_then(|p| p.with_tokens(INTERVAL / 32 * 31))
        .expect("constants in range");
    let table: Vec<Option<Occupant>> = (0..n)
        .map(|i| {
            Some(Occupant {
                key: i as u64,
                weight: Weight::new(1 + (i as u64 * 7) % 10).expect("1 to 10"),
            })
        })
        .collect();
    let mut b = Buckets::new(params, &table).expect("at most 1024 slots");
    for i in 0..n {
        let debt = match kind {
            "saturated" => BUCKET + (i as u64 * 7919) % BUCKET,
            "mixed" => match i % 4 {
                0 | 1 => 0,
                // Room below the share the level would give: these fill.
                2 => 1 + (i as u64 * 131) % (INTERVAL / (4 * n as u64).max(1)),
                _ => BUCKET + (i as u64 * 7919) % BUCKET,
            },
            _ => 1 + (i as u64 * 131) % 1_000,
        };
        b.charge(i, debt);
    }
    b
}

/// Nanoseconds per call of `f` on a fresh copy of `saved`, minus the copy.
fn time(saved: &Buckets, mut f: impl FnMut(&mut Buckets)) -> f64 {
    let mut b = saved.clone();
    let mut per_call = |with: bool| {
        let mut iterations = 1u64;
        loop {
            let start = Instant::now();
            for _ in 0..iterations {
                b.clone_from(saved);
                if with {
                    f(black_box(&mut b));
                }
                black_box(&b);
            }
            let elapsed = start.elapsed();
            if elapsed.as_millis() >= 200 {
                return elapsed.as_nanos() as f64 / iterations as f64;
            }
            iterations *= 2;
        }
    };
    let with = per_call(true);
    let without = per_call(false);
    (with - without).max(0.0)
}

fn main() {
    println!("one generation (ns), restore subtracted");
    println!(
        "{:>8} {:>12} {:>12} {:>12}",
        "tenants", "saturated", "mixed", "long idle"
    );
    for n in [1usize, 64, 1024] {
        let saturated = time(&state(n, "saturated"), |b| {
            black_box(b.generate(1));
        });
        let mixed = time(&state(n, "mixed"), |b| {
            black_box(b.generate(1));
        });
        let idle = time(&state(n, "idle"), |b| {
            black_box(b.generate(1_000));
        });
        println!("{n:>8} {saturated:>12.0} {mixed:>12.0} {idle:>12.0}");
    }
    println!(
        "(one generation per Δt = 1 ms per worker: 10 µs would be 1 % of a core; \
         Δt = 1 ms = {INTERVAL} cycles at 3 GHz)"
    );
}
