//! The overlay table alone (issue 16 §3): lookups per second on one core at each entry count,
//! batched ([`overlay::BATCH`] keys with prefetching, as the data plane's lookup stage does)
//! and one at a time, and memory per entry. The same method as
//! `crates/overlay/examples/table_bench.rs` (which also measures std's `HashMap` beside it):
//! entries spread over 64 VNets and 4096 hosts, keys drawn uniformly at random over all
//! entries with a fixed seed, the best of three passes over the same lookups.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use overlay::{Family, Key, OverlayTable, Value, VnetId, Vni};
use serde::Serialize;

use super::plan::Draw;
use crate::error::{BenchError, Result};

const VNETS: u32 = 64;
const HOSTS: u32 = 4096;
const PASSES: usize = 3;

/// The table's figures at one entry count.
#[derive(Debug, Clone, Serialize)]
pub struct TableFigure {
    /// `ipv4` or `ipv6`.
    pub family: String,
    /// Entries loaded.
    pub entries: u32,
    /// Lookups per second on one core, in batches of [`overlay::BATCH`], millions.
    pub batched_mlps: f64,
    /// Lookups per second on one core, one at a time, millions.
    pub single_mlps: f64,
    /// Bytes the table allocated per entry, everything included.
    pub bytes_per_entry: f64,
    /// Time the bulk load took, seconds.
    pub load_s: f64,
}

/// The `i`-th entry's key: VNet `i % 64`, the `i / 64`-th address of the VNet's plan.
fn key(family: Family, i: u32) -> Key {
    let vnet = VnetId(i % VNETS);
    let n = i / VNETS + 1;
    let addr = match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(
            (0xfd00_0000_0000_0001_u128 << 64) | u128::from(n),
        )),
    };
    Key::new(vnet, addr)
}

fn host(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(
        0xc633_6400 + i.wrapping_mul(2_654_435_761) % HOSTS,
    ))
}

fn best(mut pass: impl FnMut() -> u64) -> (Duration, u64) {
    let mut best = Duration::MAX;
    let mut check = 0;
    for _ in 0..PASSES {
        let t = Instant::now();
        check = pass();
        best = best.min(t.elapsed());
    }
    (best, check)
}

fn hit(v: Option<Value>) -> u64 {
    v.map_or(0, |v| u64::from(v.vni.get()))
}

fn table_error(what: &str, e: overlay::OverlayError) -> BenchError {
    BenchError::NoTraffic {
        case: "table".to_owned(),
        detail: format!("{what}: {e}"),
    }
}

/// Measures the table at `entries` entries of `family` with `lookups` lookups per pass.
pub(crate) fn measure(family: Family, entries: u32, lookups: usize) -> Result<TableFigure> {
    let mut t = OverlayTable::new();
    for v in 0..VNETS {
        let vni = Vni::new(1000 + v).ok_or_else(|| BenchError::NoTraffic {
            case: "table".to_owned(),
            detail: format!("VNI {} out of range", 1000 + v),
        })?;
        t.set_vnet(VnetId(v), vni)
            .map_err(|e| table_error("VNet", e))?;
    }
    let start = Instant::now();
    let loaded = t
        .load((0..entries).map(|i| (key(family, i), host(i))))
        .map_err(|e| table_error("load", e))?;
    let load = start.elapsed();
    if loaded != entries as usize {
        return Err(BenchError::NoTraffic {
            case: "table".to_owned(),
            detail: format!("loaded {loaded} of {entries} entries"),
        });
    }
    let mut draw = Draw::new(0x9e37_79b9 ^ u64::from(entries));
    let keys: Vec<Key> = (0..lookups)
        .map(|_| key(family, draw.below(entries)))
        .collect();
    let (single, c1) = best(|| keys.iter().map(|k| hit(black_box(&t).get(k))).sum());
    let mut out = vec![None; overlay::BATCH];
    let mut batch_err = None;
    let (batched, c2) = best(|| {
        let mut sum = 0;
        for chunk in keys.chunks(overlay::BATCH) {
            let out = &mut out[..chunk.len()];
            if let Err(e) = black_box(&t).get_batch(chunk, out) {
                batch_err = Some(e);
                return 0;
            }
            sum += out.iter().map(|&v| hit(v)).sum::<u64>();
        }
        sum
    });
    if let Some(e) = batch_err {
        return Err(table_error("batched lookup", e));
    }
    if c1 != c2 || c1 == 0 {
        return Err(BenchError::NoTraffic {
            case: "table".to_owned(),
            detail: format!("batched and single lookups disagree ({c2} vs {c1})"),
        });
    }
    let rate = |d: Duration| lookups as f64 / d.as_secs_f64() / 1e6;
    Ok(TableFigure {
        family: match family {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
        .to_owned(),
        entries,
        batched_mlps: rate(batched),
        single_mlps: rate(single),
        bytes_per_entry: t.memory().total as f64 / f64::from(entries),
        load_s: load.as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_table_is_measured() {
        let f = measure(Family::V4, 1000, 10_000).expect("measured");
        assert_eq!((f.family.as_str(), f.entries), ("ipv4", 1000));
        assert!(f.batched_mlps > 0.0 && f.single_mlps > 0.0 && f.bytes_per_entry > 0.0);
        let f = measure(Family::V6, 1, 100).expect("measured");
        assert_eq!(f.family, "ipv6");
    }
}
