//! The overlay table alone (issue 16 §3): lookups per second on one core at 1, 1 M and 16 M
//! entries, batched and one at a time, next to std's `HashMap` (hashbrown) with FxHash and with
//! SipHash; memory per entry; bulk-load time; route file parse rate.
//!
//! `cargo run -p protego-overlay --release --example table_bench [-- SIZE...]`
//!
//! Destinations are drawn uniformly at random over all entries (a fixed-seed xorshift, so runs
//! are comparable). Entries spread over 64 VNets and point at 4096 hosts. Each figure is the
//! best of three passes over the same 4 M lookups. Tables are built and freed one at a time so
//! that 16 M IPv6 entries and the hashbrown anchors never share memory.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::hint::black_box;
use std::time::{Duration, Instant};

use overlay::workload::{self, best, hit, host, key, vni, PASSES};
use overlay::{resolve_routes, Family, Key, Value, VnetId};

const LOOKUPS: usize = 4 << 20;

fn rate(d: Duration) -> f64 {
    LOOKUPS as f64 / d.as_secs_f64() / 1e6
}

/// Bytes a std `HashMap` (hashbrown) holds for `cap` usable entries of `entry` bytes: a
/// power-of-two bucket count at load at most 7/8, one control byte each plus 16.
fn hashbrown_bytes(cap: usize, entry: usize) -> usize {
    let buckets = if cap < 8 {
        (cap + 1).next_power_of_two()
    } else {
        (cap * 8 / 7).next_power_of_two()
    };
    buckets * (entry + 1) + 16
}

struct Row {
    name: String,
    single: f64,
    /// Batches of 32 and of [`overlay::BATCH`].
    batch: Option<(f64, f64)>,
    bytes_per_entry: f64,
    load: Duration,
    extra: String,
}

fn ours(family: Family, n: usize, keys: &[Key]) -> Row {
    let n32 = u32::try_from(n).expect("at most 4 G entries");
    // A load whose iterator gives no size hint (as a parsed route file's): the table grows by
    // doubling.
    let mut t = workload::empty_table().expect("VNets");
    let start = Instant::now();
    let hidden = (0..n32).map(|i| (key(family, i), host(i))).filter(|_| true);
    t.load(hidden).expect("load");
    let unreserved = start.elapsed();
    let unreserved_lf = t.load_factor(family);
    drop(t);
    let (t, load) = workload::filled_table(family, n32).expect("load");
    assert_eq!(t.len(), n);
    let (single, c1) = workload::one_at_a_time(&t, keys);
    let (batch32, c3) = workload::batched(&t, keys, 32);
    let (batch, c2) = workload::batched(&t, keys, overlay::BATCH);
    assert_eq!(c1, c3, "batched and single lookups agree");
    assert_eq!(c1, c2, "batched and single lookups agree");
    assert!(c1 > 0);
    let m = t.memory();
    Row {
        name: "overlay (cuckoo)".into(),
        single: rate(single),
        batch: Some((rate(batch32), rate(batch))),
        bytes_per_entry: m.total as f64 / n as f64,
        load,
        extra: format!(
            "load factor {:.2}, {:.1} % in 2nd bucket, {} hosts in {} KiB, {} MiB; \
             unreserved load {:.2} s to load factor {:.2}",
            t.load_factor(family),
            100.0 * t.displaced(family) as f64 / n as f64,
            t.hosts(),
            m.hosts >> 10,
            m.total >> 20,
            unreserved.as_secs_f64(),
            unreserved_lf
        ),
    }
}

fn anchor<S: BuildHasher + Default>(name: &str, family: Family, n: usize, keys: &[Key]) -> Row {
    let start = Instant::now();
    let mut m: HashMap<Key, Value, S> = HashMap::with_capacity_and_hasher(n, S::default());
    for i in 0..n as u32 {
        let k = key(family, i);
        m.insert(
            k,
            Value {
                host: host(i),
                vni: vni(k.vnet),
            },
        );
    }
    let load = start.elapsed();
    let (single, c) = best(|| {
        keys.iter()
            .map(|k| hit(black_box(&m).get(k).copied()))
            .sum()
    });
    assert!(c > 0);
    let bytes = hashbrown_bytes(m.capacity(), size_of::<(Key, Value)>());
    Row {
        name: name.into(),
        single: rate(single),
        batch: None,
        bytes_per_entry: bytes as f64 / n as f64,
        load,
        extra: format!(
            "{}-byte entries, {} MiB",
            size_of::<(Key, Value)>(),
            bytes >> 20
        ),
    }
}

fn parse_rate() {
    let n: u32 = 1 << 20;
    let mut text = String::with_capacity(n as usize * 40);
    for i in 0..n {
        let k = key(Family::V4, i);
        text.push_str(&format!(
            "t{},vnet{},{},{}\n",
            k.vnet.0 % 8,
            k.vnet.0,
            k.addr,
            host(i)
        ));
    }
    let start = Instant::now();
    let vnet_of = |tenant: &str, vnet: &str| {
        let v: u32 = vnet.strip_prefix("vnet")?.parse().ok()?;
        (tenant.strip_prefix('t')?.parse::<u32>().ok()? == v % 8).then_some(VnetId(v))
    };
    let ok = resolve_routes(&text, vnet_of).filter(Result::is_ok).count();
    let d = start.elapsed();
    assert_eq!(ok, n as usize);
    println!(
        "route file (CSV) parse + resolve: {:.2} M lines/s ({:.1} s for 16 M lines)",
        n as f64 / d.as_secs_f64() / 1e6,
        d.as_secs_f64() * 16.0
    );
}

fn main() {
    let sizes: Vec<usize> = {
        let args: Vec<usize> = std::env::args()
            .skip(1)
            .filter_map(|a| a.parse().ok())
            .collect();
        if args.is_empty() {
            vec![1, 1_000_000, 16_000_000]
        } else {
            args
        }
    };
    println!(
        "{LOOKUPS} lookups per pass, uniformly random over all entries; best of {PASSES}; one core"
    );
    println!(
        "{:<6} {:>10}  {:<18} {:>10} {:>9} {:>9} {:>8} {:>7}  notes",
        "family",
        "entries",
        "table",
        "single M/s",
        "batch 32",
        format!("batch {}", overlay::BATCH),
        "B/entry",
        "load s"
    );
    for family in [Family::V4, Family::V6] {
        for &n in &sizes {
            let keys = workload::destinations(family, n as u32, LOOKUPS);
            let rows = [
                ours(family, n, &keys),
                anchor::<rustc_hash::FxBuildHasher>("HashMap + FxHash", family, n, &keys),
                anchor::<std::hash::RandomState>("HashMap + SipHash", family, n, &keys),
            ];
            for r in rows {
                println!(
                    "{:<6} {:>10}  {:<18} {:>10.1} {:>9} {:>9} {:>8.1} {:>7.2}  {}",
                    family.to_string(),
                    n,
                    r.name,
                    r.single,
                    r.batch.map_or("-".into(), |b| format!("{:.1}", b.0)),
                    r.batch.map_or("-".into(), |b| format!("{:.1}", b.1)),
                    r.bytes_per_entry,
                    r.load.as_secs_f64(),
                    r.extra
                );
            }
        }
    }
    parse_rate();
}
