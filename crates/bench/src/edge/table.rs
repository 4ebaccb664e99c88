//! The overlay table alone (issue 16 §3): lookups per second on one core at each entry count,
//! batched ([`overlay::BATCH`] keys with prefetching, as the data plane's lookup stage does)
//! and one at a time, and memory per entry, on the workload of `overlay::workload` (shared with
//! `crates/overlay/examples/table_bench.rs`, which also measures std's `HashMap` beside it):
//! entries spread over 64 VNets and 4096 hosts, keys drawn uniformly at random over all
//! entries with a fixed seed, the best of three passes over the same lookups.

use overlay::workload;
use overlay::Family;
use serde::Serialize;

use crate::error::{BenchError, Result};

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

fn table_error(what: &str, detail: impl std::fmt::Display) -> BenchError {
    BenchError::NoTraffic {
        case: "table".to_owned(),
        detail: format!("{what}: {detail}"),
    }
}

/// Measures the table at `entries` entries of `family` with `lookups` lookups per pass
/// (`overlay::workload`).
pub(crate) fn measure(family: Family, entries: u32, lookups: usize) -> Result<TableFigure> {
    let (t, load) = workload::filled_table(family, entries).map_err(|e| table_error("load", e))?;
    if t.len() != entries as usize {
        return Err(table_error(
            "load",
            format!("loaded {} of {entries} entries", t.len()),
        ));
    }
    let keys = workload::destinations(family, entries, lookups);
    let (single, c1) = workload::one_at_a_time(&t, &keys);
    let (batched, c2) = workload::batched(&t, &keys, overlay::BATCH);
    if c1 != c2 || c1 == 0 {
        return Err(table_error(
            "lookups",
            format!("batched and single lookups disagree ({c2} vs {c1})"),
        ));
    }
    let rate = |d: std::time::Duration| lookups as f64 / d.as_secs_f64() / 1e6;
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
