//! `protego bench edge` (issue 16 §3): the provider edge's paths between a customer attached
//! at L2 and the VNet, at 1, 1 M and 16 M per-VM overlay entries, and the overlay table alone.
//!
//! ```text
//!  ce ns (load generator)             gw ns (gateway under test)        host ns (load generator)
//!  AF_PACKET, Q-in-Q frames    trunk  protego up: [[attachment]]        VXLAN VTEP 10.255.0.2,
//!  S=100 C=10, CE 10.99.0.2  ─ veth ─ qinq 100/10, one VNet, N per-VM ─ answers ARP for every VM
//!                                     routes (64.0.0.1.. -> host)
//! ```
//!
//! - **to-vnet**: tagged frames from the CE to VMs drawn uniformly at random over the loaded
//!   entries -> the gateway strips the tags, looks the VM up, sends VXLAN to its host.
//! - **to-ce**: VXLAN from the host, from VMs drawn uniformly at random over the entries (the
//!   gateway checks each source against its entry), to the CE -> tagged frames to the CE.
//!
//! Each case is measured as `protego bench` measures one: a probe, the maximum rate (offered
//! at 125 % of what the gateway delivered, doubled while it keeps up), and latency at half
//! that rate; the gateway's CPU time comes from its threads' `schedstat`, its drops from its
//! status. The gateway runs one worker, so CPU per packet is per core. Benchmarks are
//! programs: the unit tests cover the pure parts (frames, route file, options, JSON shape).

mod bed;
mod cgroup;
mod frames;
mod packet_sock;
mod plan;
mod run;
mod table;
mod traffic;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use crate::error::{BenchError, Result};
use crate::report::Target;
use crate::stats::Percentiles;

pub use cgroup::SHARES as GATEWAY_CPU_SHARES;
pub use run::run;
pub use table::TableFigure;

/// Version of the JSON document.
pub const EDGE_REPORT_VERSION: u32 = 1;

/// A direction of the edge paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EdgeDirection {
    /// Attachment (tagged frames from the CE) -> VXLAN to the VM's host.
    ToVnet,
    /// VXLAN from a VM's host -> tagged frames to the CE.
    ToCe,
}

impl EdgeDirection {
    /// The name on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            EdgeDirection::ToVnet => "to-vnet",
            EdgeDirection::ToCe => "to-ce",
        }
    }
}

impl FromStr for EdgeDirection {
    type Err = BenchError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "to-vnet" => Ok(EdgeDirection::ToVnet),
            "to-ce" => Ok(EdgeDirection::ToCe),
            _ => Err(BenchError::InvalidOption {
                option: "--dirs",
                value: s.to_owned(),
                reason: "expected to-vnet or to-ce".to_owned(),
            }),
        }
    }
}

/// Parses an entry count: a number with an optional `K` (x 1000) or `M` (x 2^20, as the
/// table's "16 M" is 16 x 2^20) suffix, 1 ..= 67 108 862.
pub fn parse_entries(s: &str) -> Result<u32> {
    let bad = |reason: &str| BenchError::InvalidOption {
        option: "--entries",
        value: s.to_owned(),
        reason: reason.to_owned(),
    };
    let t = s.trim();
    let (digits, mult) = match t.char_indices().last() {
        Some((i, 'M' | 'm')) => (&t[..i], 1u64 << 20),
        Some((i, 'K' | 'k')) => (&t[..i], 1000),
        _ => (t, 1),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| bad("expected a number, optionally with K or M"))?;
    let n = n.saturating_mul(mult);
    if n == 0 || n > u64::from(plan::MAX_ENTRIES) {
        return Err(bad(&format!("must be 1 ..= {}", plan::MAX_ENTRIES)));
    }
    Ok(n as u32)
}

/// Inner IP packet sizes the edge bench accepts (bytes, IPv4 header included).
pub const EDGE_SIZES: std::ops::RangeInclusive<u16> = 36..=1500;

/// What `protego bench edge` measures.
#[derive(Debug, Clone)]
pub struct EdgeOptions {
    /// Per-VM entry counts, one gateway start each.
    pub entries: Vec<u32>,
    /// Inner IP packet sizes.
    pub sizes: Vec<u16>,
    /// Directions.
    pub directions: Vec<EdgeDirection>,
    /// Length of the maximum-rate and the latency run of each case.
    pub duration: Duration,
    /// Draw destinations from the first N entries only (None: all of them).
    pub active: Option<u32>,
    /// Bytes of pre-built packets per run.
    pub pool_bytes: usize,
    /// Measure the table alone too.
    pub table: bool,
    /// Lookups per pass of the table measurement.
    pub table_lookups: usize,
    /// The `protego` binary under test (default: this one).
    pub protego_bin: Option<PathBuf>,
    /// Keep the run directory.
    pub keep: bool,
    /// Leave the VNet without a `router_mac`, so the gateway resolves each VM's MAC with ARP
    /// (the host answers for every VM), as before routed delivery existed.
    pub resolve_macs: bool,
    /// The rate of each case's equal-rate run, packets per second: every case measured at
    /// the same load, so that CPU per packet compares table sizes at equal batch sizes
    /// (at its own maximum rate each case runs with the batches its rate gives).
    pub equal_rate: f64,
    /// Confine the gateway to this share of one CPU, percent ([`GATEWAY_CPU_SHARES`]), from
    /// the warm-up of its first case on (the route load runs unconfined): the gateway, not
    /// the load generator, limits the rate, and its batches are as full as the ring allows.
    /// The cases then skip the equal-rate run (the maximum rate is the saturated one).
    pub gateway_cpu: Option<u32>,
}

/// Default of [`EdgeOptions::equal_rate`]: below the maximum rate of every case measured on
/// the project's 2-core machine (to-ce at 64 B delivered 0.25 Mpps).
pub const EQUAL_RATE: f64 = 100_000.0;

impl EdgeOptions {
    /// The whole matrix: 1, 1 M and 16 M entries, 64/128/512/1400 B, both directions.
    pub fn full() -> EdgeOptions {
        EdgeOptions {
            entries: vec![1, 1 << 20, 16 << 20],
            sizes: vec![64, 128, 512, 1400],
            directions: vec![EdgeDirection::ToVnet, EdgeDirection::ToCe],
            duration: Duration::from_secs(1),
            active: None,
            pool_bytes: 512 << 20,
            table: true,
            resolve_macs: false,
            equal_rate: EQUAL_RATE,
            gateway_cpu: None,
            table_lookups: 4 << 20,
            protego_bin: None,
            keep: false,
        }
    }

    /// The quick preset: 1 and 1 M entries, 64 and 1400 B, both directions, 0.5 s runs.
    pub fn quick() -> EdgeOptions {
        EdgeOptions {
            entries: vec![1, 1 << 20],
            sizes: vec![64, 1400],
            duration: Duration::from_millis(500),
            table_lookups: 1 << 20,
            ..EdgeOptions::full()
        }
    }

    /// Checks the options.
    pub fn validate(&self) -> Result<()> {
        let bad = |option: &'static str, value: String, reason: &str| BenchError::InvalidOption {
            option,
            value,
            reason: reason.to_owned(),
        };
        if self.entries.is_empty() {
            return Err(bad("--entries", String::new(), "no entry count"));
        }
        if let Some(s) = self.sizes.iter().find(|s| !EDGE_SIZES.contains(s)) {
            return Err(bad("--sizes", s.to_string(), "must be 36 ..= 1500 bytes"));
        }
        if self.sizes.is_empty() || self.directions.is_empty() {
            return Err(bad("--sizes/--dirs", String::new(), "nothing to measure"));
        }
        if self.active == Some(0) {
            return Err(bad("--active", "0".into(), "must be at least 1"));
        }
        if !(1_000.0..=10e6).contains(&self.equal_rate) {
            return Err(bad(
                "--equal-rate",
                self.equal_rate.to_string(),
                "must be 1000 ..= 10 000 000 packets per second",
            ));
        }
        if let Some(p) = self.gateway_cpu.filter(|p| !GATEWAY_CPU_SHARES.contains(p)) {
            return Err(bad(
                "--gateway-cpu",
                p.to_string(),
                "must be 5 ..= 100 percent of one CPU",
            ));
        }
        if self.duration < Duration::from_millis(50) {
            return Err(bad(
                "--duration",
                format!("{:?}", self.duration),
                "must be at least 50ms",
            ));
        }
        Ok(())
    }
}

/// Packets the gateway dropped, by its reason.
pub type DropReasons = BTreeMap<String, u64>;

/// One measured case.
#[derive(Debug, Clone, Serialize)]
pub struct EdgeCase {
    /// `to-vnet` or `to-ce`.
    pub direction: EdgeDirection,
    /// Per-VM entries loaded.
    pub entries: u32,
    /// Entries the VM addresses were drawn from (uniformly).
    pub drawn_from: u32,
    /// Inner IP packet size, bytes.
    pub size: u16,
    /// Offered rate of the maximum-rate run, Mpps.
    pub offered_mpps: f64,
    /// Delivered rate of the maximum-rate run, Mpps.
    pub delivered_mpps: f64,
    /// Gateway CPU (all its threads) per delivered packet at the maximum rate, ns.
    pub cpu_ns_per_packet: f64,
    /// Delivered packets per second of gateway CPU, millions (Mpps per core).
    pub mpps_per_core: f64,
    /// `cpu_ns_per_packet` over the 1-entry case of the same direction and size.
    pub cpu_vs_1_entry: Option<f64>,
    /// Cores the gateway kept busy at the maximum rate (delivered rate × CPU per packet):
    /// well below 1 the gateway was not what limited the rate.
    pub busy_cores_at_max: f64,
    /// Packets per batch the gateway's workers took over the maximum-rate run (None: the
    /// gateway does not report batches).
    pub packets_per_batch: Option<f64>,
    /// Share of the maximum-rate run's wall time the gateway spent throttled by its CPU
    /// share (`--gateway-cpu`; None without one).
    pub throttled_share: Option<f64>,
    /// Gateway CPU per delivered packet at [`EdgeOptions::equal_rate`], ns (None: the case's
    /// maximum rate was below it).
    pub equal_rate_cpu_ns: Option<f64>,
    /// `equal_rate_cpu_ns` over the 1-entry case's of the same direction and size.
    pub equal_rate_vs_1_entry: Option<f64>,
    /// Share of the maximum-rate run's packets that did not arrive.
    pub loss: f64,
    /// The gateway's drop counters over the maximum-rate run, by reason (non-zero only).
    pub gateway_drops: DropReasons,
    /// UDP datagrams the gateway's namespace dropped on receive over that run (its VTEP
    /// socket's buffer full: VXLAN the gateway did not read in time).
    pub gateway_socket_drops: u64,
    /// The machine's input backlog drops over that run (veth delivery).
    pub path_drops: u64,
    /// Packets the load generator's receiving socket dropped for want of buffer space over
    /// that run (not the gateway's loss).
    pub loadgen_drops: u64,
    /// Latency at half the maximum rate (one way, load generator to load generator), µs.
    pub latency_us: Option<Percentiles>,
    /// Share of the latency run's packets that did not arrive.
    pub latency_loss: f64,
}

/// The time `protego ctl route load` took at one entry count.
#[derive(Debug, Clone, Serialize)]
pub struct RouteLoad {
    /// Entries.
    pub entries: u32,
    /// Seconds from the request to the answer.
    pub seconds: f64,
    /// Bytes of the route file.
    pub file_bytes: u64,
}

/// The report of `protego bench edge` (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct EdgeReport {
    /// [`EDGE_REPORT_VERSION`].
    pub version: u32,
    /// How it was measured.
    pub settings: EdgeSettings,
    /// The cases.
    pub cases: Vec<EdgeCase>,
    /// Route loads.
    pub route_loads: Vec<RouteLoad>,
    /// The table alone.
    pub table: Vec<TableFigure>,
    /// Issue 16 §3's targets this run can judge.
    pub targets: Vec<Target>,
    /// What could not be measured.
    pub errors: Vec<String>,
}

/// Settings of a run.
#[derive(Debug, Clone, Serialize)]
pub struct EdgeSettings {
    /// Run length, seconds.
    pub duration_s: f64,
    /// Gateway workers.
    pub workers: u32,
    /// CPUs of the machine.
    pub cpus: u32,
    /// The VNet's `router_mac`, or None when each VM's MAC was resolved (`--resolve-macs`).
    pub router_mac: Option<String>,
    /// The gateway's CPU share, percent of one CPU (`--gateway-cpu`), if it had one.
    pub gateway_cpu_percent: Option<u32>,
    /// Notes on the method.
    pub notes: Vec<String>,
}

/// Fills `cpu_vs_1_entry` and `equal_rate_vs_1_entry` of every case from the 1-entry case
/// of its direction and size.
pub(crate) fn fill_ratios(cases: &mut [EdgeCase]) {
    type Base = BTreeMap<(&'static str, u16), f64>;
    let base = |ns: fn(&EdgeCase) -> Option<f64>| -> Base {
        cases
            .iter()
            .filter(|c| c.entries == 1)
            .filter_map(|c| Some(((c.direction.name(), c.size), ns(c).filter(|n| *n > 0.0)?)))
            .collect()
    };
    let at_max = base(|c| Some(c.cpu_ns_per_packet));
    let at_equal = base(|c| c.equal_rate_cpu_ns);
    for c in cases.iter_mut() {
        let key = (c.direction.name(), c.size);
        c.cpu_vs_1_entry = at_max
            .get(&key)
            .filter(|_| c.cpu_ns_per_packet > 0.0)
            .map(|b| c.cpu_ns_per_packet / b);
        c.equal_rate_vs_1_entry = at_equal
            .get(&key)
            .zip(c.equal_rate_cpu_ns.filter(|n| *n > 0.0))
            .map(|(b, n)| n / b);
    }
}

/// The entry count the targets speak of (16 M).
const TARGET_ENTRIES: u32 = 16 << 20;

/// Issue 16 §3's targets that the run's figures judge.
pub(crate) fn targets(cases: &[EdgeCase], table: &[TableFigure]) -> Vec<Target> {
    let mut out = Vec::new();
    for dir in [EdgeDirection::ToVnet, EdgeDirection::ToCe] {
        let big = cases
            .iter()
            .filter(|c| c.direction == dir && c.size == 64 && c.entries >= TARGET_ENTRIES)
            .max_by_key(|c| c.entries);
        // Judged at each case's maximum rate and at the equal rate; met only if both are.
        let ratio = big.and_then(|c| c.cpu_vs_1_entry);
        let equal = big.and_then(|c| c.equal_rate_vs_1_entry);
        out.push(Target {
            name: format!("entries_cost_{}", dir.name().replace('-', "_")),
            requirement: format!(
                "{}: at 16 M entries <= 15 % more gateway CPU per packet than at 1 entry (64 B)",
                dir.name()
            ),
            value: ratio,
            unit: "x".into(),
            met: ratio.map(|r| r <= 1.15 && equal.is_none_or(|e| e <= 1.15)),
            detail: match big {
                Some(c) => format!(
                    "{:.0} ns/packet at {} entries (drawn from {}), loss {:.1} %, {:.2} cores \
                     busy at the maximum rate, {} packets per batch; at the equal rate {} \
                     ns/packet, {} x",
                    c.cpu_ns_per_packet,
                    c.entries,
                    c.drawn_from,
                    c.loss * 100.0,
                    c.busy_cores_at_max,
                    opt(c.packets_per_batch, 0),
                    opt(c.equal_rate_cpu_ns, 0),
                    opt(equal, 2)
                ),
                None => "needs the 64 B cases at 1 and 16 M entries".into(),
            },
        });
    }
    let t = table
        .iter()
        .filter(|t| t.family == "ipv4" && t.entries >= TARGET_ENTRIES)
        .max_by_key(|t| t.entries);
    out.push(Target {
        name: "table_lookups".into(),
        requirement: "the table alone: >= 30 M lookups/s per core at 16 M entries (IPv4, batched)"
            .into(),
        value: t.map(|t| t.batched_mlps),
        unit: "M/s".into(),
        met: t.map(|t| t.batched_mlps >= 30.0),
        detail: match t {
            Some(t) => format!(
                "{:.1} M/s batched, {:.1} M/s one at a time, {:.1} B/entry",
                t.batched_mlps, t.single_mlps, t.bytes_per_entry
            ),
            None => "needs the table at 16 M entries".into(),
        },
    });
    out
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.prec$}"))
}

/// The report as text.
pub fn render(r: &EdgeReport) -> String {
    let mut out = String::new();
    let _ =
        writeln!(
        out,
        "{:<8} {:>9} {:>9} {:>5} {:>8} {:>8} {:>7} {:>9} {:>6} {:>5} {:>7} {:>7} {:>6} {:>6} {:>8} {:>8}  gateway drops",
        "dir", "entries", "drawn", "size", "offered", "deliv.", "ns/pkt", "Mpps/core",
        "vs 1", "busy", "pkt/bat", "ns@eq", "vs1@eq", "loss%", "p50 us", "p99 us"
    );
    for c in &r.cases {
        let mut drops = c
            .gateway_drops
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>();
        if c.gateway_socket_drops > 0 {
            drops.push(format!("(udp_rcvbuf={})", c.gateway_socket_drops));
        }
        if c.path_drops > 0 {
            drops.push(format!("(backlog={})", c.path_drops));
        }
        if c.loadgen_drops > 0 {
            drops.push(format!("(loadgen_rx={})", c.loadgen_drops));
        }
        let drops = drops.join(" ");
        let _ = writeln!(
            out,
            "{:<8} {:>9} {:>9} {:>5} {:>8.3} {:>8.3} {:>7.0} {:>9.2} {:>6} {:>5.2} {:>7} {:>7} {:>6} {:>6.1} {:>8} {:>8}  {}",
            c.direction.name(),
            c.entries,
            c.drawn_from,
            c.size,
            c.offered_mpps,
            c.delivered_mpps,
            c.cpu_ns_per_packet,
            c.mpps_per_core,
            opt(c.cpu_vs_1_entry, 2),
            c.busy_cores_at_max,
            opt(c.packets_per_batch, 0),
            opt(c.equal_rate_cpu_ns, 0),
            opt(c.equal_rate_vs_1_entry, 2),
            c.loss * 100.0,
            opt(c.latency_us.map(|l| l.p50), 1),
            opt(c.latency_us.map(|l| l.p99), 1),
            if drops.is_empty() { "-".into() } else { drops }
        );
    }
    for l in &r.route_loads {
        let _ = writeln!(
            out,
            "route load: {} entries in {:.2} s ({} MiB file)",
            l.entries,
            l.seconds,
            l.file_bytes >> 20
        );
    }
    if !r.table.is_empty() {
        let _ = writeln!(
            out,
            "\ntable alone (one core, uniformly random keys):\n{:<6} {:>10} {:>12} {:>12} {:>9} {:>7}",
            "family", "entries", "batched M/s", "single M/s", "B/entry", "load s"
        );
        for t in &r.table {
            let _ = writeln!(
                out,
                "{:<6} {:>10} {:>12.1} {:>12.1} {:>9.1} {:>7.2}",
                t.family, t.entries, t.batched_mlps, t.single_mlps, t.bytes_per_entry, t.load_s
            );
        }
    }
    let _ = writeln!(out, "\ntargets:");
    for t in &r.targets {
        let verdict = match t.met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "n/a",
        };
        let _ = writeln!(
            out,
            "  {:<22} {:<7} {} {}  ({}; {})",
            t.name,
            verdict,
            opt(t.value, 2),
            t.unit,
            t.requirement,
            t.detail
        );
    }
    for n in &r.settings.notes {
        let _ = writeln!(out, "note: {n}");
    }
    for e in &r.errors {
        let _ = writeln!(out, "error: {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(dir: EdgeDirection, entries: u32, size: u16, ns: f64) -> EdgeCase {
        EdgeCase {
            direction: dir,
            entries,
            drawn_from: entries,
            size,
            offered_mpps: 1.0,
            delivered_mpps: 0.9,
            cpu_ns_per_packet: ns,
            mpps_per_core: 1e3 / ns,
            cpu_vs_1_entry: None,
            busy_cores_at_max: 0.9 * ns / 1e3,
            packets_per_batch: Some(64.0),
            throttled_share: None,
            equal_rate_cpu_ns: Some(ns * 1.5),
            equal_rate_vs_1_entry: None,
            loss: 0.1,
            gateway_drops: DropReasons::from([("no_route".to_owned(), 3)]),
            gateway_socket_drops: 0,
            path_drops: 0,
            loadgen_drops: 0,
            latency_us: None,
            latency_loss: 0.0,
        }
    }

    #[test]
    fn options_parse_and_validate() {
        assert_eq!(parse_entries("1").expect("1"), 1);
        assert_eq!(parse_entries("16M").expect("16M"), 16 << 20);
        assert_eq!(parse_entries("64k").expect("64k"), 64_000);
        assert!(parse_entries("0").is_err());
        assert!(parse_entries("x").is_err());
        assert!(parse_entries("100M").is_err());
        assert_eq!(
            "to-ce".parse::<EdgeDirection>().expect("dir"),
            EdgeDirection::ToCe
        );
        assert!("in".parse::<EdgeDirection>().is_err());
        assert!(EdgeOptions::full().validate().is_ok());
        assert!(EdgeOptions::quick().validate().is_ok());
        let mut o = EdgeOptions::quick();
        o.sizes = vec![9000];
        assert!(o.validate().is_err());
        o.sizes = vec![64];
        o.active = Some(0);
        assert!(o.validate().is_err());
        o.active = None;
        o.equal_rate = 10.0;
        assert!(o.validate().is_err());
        o.equal_rate = EQUAL_RATE;
        for (share, ok) in [(4, false), (5, true), (100, true), (101, false)] {
            o.gateway_cpu = Some(share);
            assert_eq!(o.validate().is_ok(), ok, "--gateway-cpu {share}");
        }
    }

    #[test]
    fn ratios_targets_and_json_shape() {
        let mut cases = vec![
            case(EdgeDirection::ToVnet, 1, 64, 400.0),
            case(EdgeDirection::ToVnet, 16 << 20, 64, 440.0),
            case(EdgeDirection::ToCe, 16 << 20, 64, 500.0),
        ];
        fill_ratios(&mut cases);
        assert_eq!(cases[0].cpu_vs_1_entry, Some(1.0));
        assert!((cases[1].cpu_vs_1_entry.expect("ratio") - 1.1).abs() < 1e-9);
        assert_eq!(cases[2].cpu_vs_1_entry, None);
        assert!((cases[1].equal_rate_vs_1_entry.expect("ratio") - 1.1).abs() < 1e-9);
        assert_eq!(cases[2].equal_rate_vs_1_entry, None);
        let table = vec![TableFigure {
            family: "ipv4".into(),
            entries: 16 << 20,
            batched_mlps: 31.0,
            single_mlps: 12.0,
            bytes_per_entry: 15.0,
            load_s: 2.0,
        }];
        let t = targets(&cases, &table);
        assert_eq!(t.len(), 3);
        assert_eq!(
            (t[0].name.as_str(), t[0].met),
            ("entries_cost_to_vnet", Some(true))
        );
        assert_eq!((t[1].name.as_str(), t[1].met), ("entries_cost_to_ce", None));
        // Met at the maximum rate but not at the equal rate: not met.
        let mut worse = cases.clone();
        worse[1].equal_rate_cpu_ns = Some(400.0 * 1.5 * 1.3);
        fill_ratios(&mut worse);
        assert_eq!(targets(&worse, &table)[0].met, Some(false));
        assert_eq!(
            (t[2].name.as_str(), t[2].met),
            ("table_lookups", Some(true))
        );
        let report = EdgeReport {
            version: EDGE_REPORT_VERSION,
            settings: EdgeSettings {
                duration_s: 1.0,
                workers: 1,
                cpus: 2,
                router_mac: None,
                gateway_cpu_percent: None,
                notes: vec![],
            },
            cases,
            route_loads: vec![RouteLoad {
                entries: 1,
                seconds: 0.01,
                file_bytes: 32,
            }],
            table,
            targets: t,
            errors: vec![],
        };
        let v = serde_json::to_value(&report).expect("json");
        assert_eq!(v["version"], 1);
        assert_eq!(v["cases"][0]["direction"], "to-vnet");
        for key in [
            "entries",
            "drawn_from",
            "size",
            "offered_mpps",
            "delivered_mpps",
            "cpu_ns_per_packet",
            "mpps_per_core",
            "cpu_vs_1_entry",
            "busy_cores_at_max",
            "packets_per_batch",
            "throttled_share",
            "equal_rate_cpu_ns",
            "equal_rate_vs_1_entry",
            "loss",
            "gateway_drops",
            "gateway_socket_drops",
            "path_drops",
            "loadgen_drops",
            "latency_us",
            "latency_loss",
        ] {
            assert!(v["cases"][1].get(key).is_some(), "case field {key}");
        }
        assert_eq!(v["cases"][1]["gateway_drops"]["no_route"], 3);
        assert_eq!(v["table"][0]["batched_mlps"], 31.0);
        assert_eq!(v["targets"][2]["met"], true);
        assert_eq!(v["route_loads"][0]["entries"], 1);
        let text = render(&report);
        assert!(text.contains("to-vnet") && text.contains("table_lookups"));
    }
}
