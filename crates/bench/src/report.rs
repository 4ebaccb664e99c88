//! The benchmark's results: the JSON document (`protego bench --json`) and the tables printed
//! for people. Every figure is derived from measured counters here, so the JSON and the table
//! always agree.

use std::fmt::Write as _;

use serde::Serialize;

use crate::crypto_only::CryptoFigure;
use crate::load::RunResult;
use crate::options::Case;
use crate::stats::Percentiles;

/// Version of the JSON document.
pub const REPORT_VERSION: u32 = 1;

/// The machine the run happened on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// CPUs this process may use.
    pub cpus: u32,
    /// `uname -r`.
    pub kernel: String,
    /// The CPU model (from /proc/cpuinfo).
    pub cpu_model: String,
}

/// How the run was done.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// Seconds per measurement (max-rate run and half-rate run each).
    pub duration_s: f64,
    /// Bytes of pre-built packets per run at most, MiB.
    pub pool_mib: usize,
    /// Whether the gateway binary took `[gateway] workers` (else it used its default).
    pub workers_key: bool,
    /// Whether the load generator's sends used UDP GSO.
    pub loadgen_gso: bool,
    /// The IMIX definition.
    pub imix: String,
    /// The offered loads of the load runs, percent of each case's maximum (`--loads`).
    pub loads: Vec<u32>,
    /// How the load generator sent in the load runs (`--peers`: `batching`, `single`).
    pub peers: Vec<String>,
    /// How figures are measured (one line each).
    pub notes: Vec<String>,
}

/// Packets that did not arrive, and where the counters saw them go.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Drops {
    /// Sent minus delivered.
    pub lost: u64,
    /// `lost / sent`.
    pub loss_ratio: f64,
    /// The gateway's own drop counters over the run (Protego's status `drops`, every reason
    /// but NAT keepalives); None for strongSwan.
    pub gateway_counters: Option<u64>,
    /// UDP datagrams the gateway namespace's kernel dropped on receive (`InErrors` and
    /// `NoPorts`: mostly full socket buffers, the gateway did not read fast enough).
    pub gateway_socket: u64,
    /// UDP receive-buffer overflows at the load generator's receiving socket.
    pub loadgen_socket: u64,
    /// Drops on the way: interfaces (veth) of the gateway's and the load generator's
    /// namespaces, and the machine's input backlog (`netdev_max_backlog`), which a veth
    /// delivers through.
    pub path: u64,
}

/// One run of a case, summarised.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunSummary {
    /// Offered rate, packets per second.
    pub offered_pps: f64,
    /// Packets sent.
    pub sent: u64,
    /// Packets delivered.
    pub delivered: u64,
    /// Time between the first and the last delivery, seconds.
    pub duration_s: f64,
    /// Delivered inner Gbit/s.
    pub gbps: f64,
    /// Delivered million packets per second.
    pub mpps: f64,
    /// Gateway CPU time over the run, seconds.
    pub cpu_s: f64,
    /// Gateway CPU per delivered packet, ns.
    pub cpu_ns_per_packet: f64,
    /// Gateway CPU per delivered inner byte, ns.
    pub cpu_ns_per_byte: f64,
    /// Losses.
    pub drops: Drops,
    /// Packets per gateway worker (empty if not reported).
    pub worker_packets: Vec<u64>,
}

impl RunSummary {
    /// Summarises a run.
    pub(crate) fn from_run(r: &RunResult) -> RunSummary {
        let lost = r.sent.saturating_sub(r.delivered);
        let per = |den: u64| {
            if den == 0 {
                0.0
            } else {
                r.cpu_ns as f64 / den as f64
            }
        };
        RunSummary {
            offered_pps: r.offered_pps,
            sent: r.sent,
            delivered: r.delivered,
            duration_s: r.rx_span_s,
            gbps: r.delivered_bps() / 1e9,
            mpps: r.delivered_pps() / 1e6,
            cpu_s: r.cpu_ns as f64 / 1e9,
            cpu_ns_per_packet: per(r.delivered),
            cpu_ns_per_byte: per(r.delivered_bytes),
            drops: Drops {
                lost,
                loss_ratio: if r.sent == 0 {
                    0.0
                } else {
                    lost as f64 / r.sent as f64
                },
                gateway_counters: r.gateway_drops,
                gateway_socket: r.gateway_socket_drops,
                loadgen_socket: r.loadgen_overflow,
                path: r.path_drops,
            },
            worker_packets: r.worker_packets.clone(),
        }
    }
}

/// A case's run at one offered load and with one way of sending (issue 23 §1): what the
/// gateway spends per packet and per byte where users run it, not only at saturation.
#[derive(Debug, Clone, Serialize)]
pub struct LoadFigures {
    /// `batching` (GSO trains, many per system call) or `single` (one datagram per system
    /// call, as a peer's kernel or a host's VXLAN device sends).
    pub peer: String,
    /// Offered load, percent of the case's maximum delivered rate (100 with `batching` is the
    /// maximum-rate run, which offers 125 %; 50 with `batching` is the latency run).
    pub load_pct: u32,
    /// Gateway CPU seconds per second over the run (cores busy).
    pub cpu_cores: f64,
    /// What the load generator actually sent, packets per second (a single-datagram peer
    /// may not reach the offered rate: one system call per datagram costs it as much as the
    /// gateway).
    pub sent_pps: f64,
    /// The run (offered and delivered rates, CPU per packet and per byte, losses).
    #[serde(flatten)]
    pub run: RunSummary,
}

impl LoadFigures {
    /// The figures of `run`, offered as `peer` at `load_pct`.
    pub(crate) fn new(peer: crate::options::PeerMode, load_pct: u32, run: &RunResult) -> Self {
        LoadFigures {
            peer: peer.name().to_owned(),
            load_pct,
            cpu_cores: cores(run),
            sent_pps: if run.send_span_s > 0.0 {
                run.sent as f64 / run.send_span_s
            } else {
                0.0
            },
            run: RunSummary::from_run(run),
        }
    }
}

/// Gateway CPU seconds per second of a run.
fn cores(r: &RunResult) -> f64 {
    if r.rx_span_s > 0.0 {
        r.cpu_ns as f64 / 1e9 / r.rx_span_s
    } else {
        0.0
    }
}

/// The result of one case.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    /// `protego` or `strongswan`.
    pub gateway: String,
    /// `inbound` or `outbound`.
    pub direction: String,
    /// The cipher.
    pub cipher: String,
    /// The size label (`64`, `1400`, `imix`).
    pub size: String,
    /// Mean inner packet length.
    pub mean_packet_bytes: f64,
    /// Tunnels.
    pub tunnels: u32,
    /// Protego's workers (None for strongSwan).
    pub workers: Option<u32>,
    /// How inner packets reach the host: `vxlan`, or `routed` (strongSwan: plain IP, no VXLAN).
    pub inside: String,
    /// Maximum delivered rate, inner Gbit/s.
    pub gbps: f64,
    /// Maximum delivered rate, Mpps.
    pub mpps: f64,
    /// Gateway CPU per inner byte at the maximum rate, ns.
    pub cpu_ns_per_byte: f64,
    /// Gateway CPU per packet at the maximum rate, ns.
    pub cpu_ns_per_packet: f64,
    /// Gateway CPU seconds per second at the maximum rate (cores busy).
    pub cpu_cores: f64,
    /// Losses at half the maximum rate.
    pub drops: Drops,
    /// Latency the gateway adds at half the maximum rate, µs (one-way, minus the baseline
    /// path's median).
    pub latency_us: Option<Percentiles>,
    /// One-way latency at half the maximum rate as measured, µs.
    pub raw_latency_us: Option<Percentiles>,
    /// Crypto-only cost of this cipher and size on one core (open for inbound, seal for
    /// outbound), ns per byte.
    pub crypto_ns_per_byte: Option<f64>,
    /// `crypto_ns_per_byte / cpu_ns_per_byte`: the share of the gateway's CPU a pure crypto
    /// loop would need (1.0 = the gateway does nothing but crypto).
    pub crypto_fraction: Option<f64>,
    /// Each worker's share of the packets at the maximum rate (None if not reported).
    pub worker_share: Option<Vec<f64>>,
    /// Inbound packets opened out of arrival order by parallel workers: the largest distance
    /// behind the newest sequence number at which one was accepted, after the maximum-rate
    /// run (None if not reported).
    pub max_reorder: Option<u64>,
    /// The smallest inbound replay window of the gateway's CHILD_SAs (the bound
    /// `max_reorder` must stay under).
    pub replay_window: Option<u64>,
    /// The maximum-rate run.
    pub max_rate: RunSummary,
    /// The half-rate (latency) run.
    pub half_rate: RunSummary,
    /// The runs at offered loads (`--loads`) by peers that batch and that do not (`--peers`).
    pub at_load: Vec<LoadFigures>,
}

impl CaseReport {
    /// Builds the report of `case` from its runs.
    pub(crate) fn new(
        case: &Case,
        max: &RunResult,
        half: &RunResult,
        latency: Option<Percentiles>,
        baseline_us: Option<f64>,
        crypto: Option<&CryptoFigure>,
    ) -> CaseReport {
        let inbound = case.direction == crate::options::Direction::Inbound;
        let max_rate = RunSummary::from_run(max);
        let half_rate = RunSummary::from_run(half);
        let crypto_ns_per_byte = crypto.map(|c| c.ns_per_byte(inbound));
        let crypto_fraction = crypto_ns_per_byte
            .filter(|_| max_rate.cpu_ns_per_byte > 0.0)
            .map(|c| c / max_rate.cpu_ns_per_byte);
        let total: u64 = max.worker_packets.iter().sum();
        let worker_share = (total > 0).then(|| {
            max.worker_packets
                .iter()
                .map(|&p| p as f64 / total as f64)
                .collect()
        });
        let cpu_cores = cores(max);
        CaseReport {
            gateway: case.gateway.name().to_owned(),
            direction: case.direction.name().to_owned(),
            cipher: case.cipher.name().to_owned(),
            size: case.size.label(),
            mean_packet_bytes: case.size.mean(),
            tunnels: case.tunnels,
            workers: case.workers,
            inside: match case.gateway {
                crate::options::GatewayKind::Protego => "vxlan".to_owned(),
                crate::options::GatewayKind::StrongSwan => "routed".to_owned(),
            },
            gbps: max_rate.gbps,
            mpps: max_rate.mpps,
            cpu_ns_per_byte: max_rate.cpu_ns_per_byte,
            cpu_ns_per_packet: max_rate.cpu_ns_per_packet,
            cpu_cores,
            drops: half_rate.drops.clone(),
            latency_us: latency.map(|p| p.minus(baseline_us.unwrap_or(0.0))),
            raw_latency_us: latency,
            crypto_ns_per_byte,
            crypto_fraction,
            worker_share,
            max_reorder: max.reorder.map(|r| r.0),
            replay_window: max.reorder.map(|r| r.1),
            max_rate,
            half_rate,
            at_load: Vec::new(),
        }
    }

    /// Whether this is the case `(gateway, direction, cipher, size, tunnels)`.
    pub fn is(
        &self,
        gateway: &str,
        direction: &str,
        cipher: &str,
        size: &str,
        tunnels: u32,
    ) -> bool {
        self.gateway == gateway
            && self.direction == direction
            && self.cipher == cipher
            && self.size == size
            && self.tunnels == tunnels
    }
}

/// A target of the issue, evaluated.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// Short name.
    pub name: String,
    /// The requirement, in words.
    pub requirement: String,
    /// The measured figure the requirement is about.
    pub value: Option<f64>,
    /// Its unit.
    pub unit: String,
    /// Met (true), missed (false), or not measured in this run (None).
    pub met: Option<bool>,
    /// The figures behind it, or why it was not measured.
    pub detail: String,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// [`REPORT_VERSION`].
    pub version: u32,
    /// The machine.
    pub machine: Machine,
    /// How the figures were taken.
    pub settings: Settings,
    /// Crypto-only limits per cipher and size, one core.
    pub crypto_only: Vec<CryptoFigure>,
    /// One-way latency of the baseline path (peer -> gateway namespace's kernel -> host), µs.
    pub baseline_latency_us: Option<Percentiles>,
    /// Every case measured.
    pub cases: Vec<CaseReport>,
    /// The targets.
    pub targets: Vec<Target>,
    /// Groups that could not be measured, with the reason.
    pub errors: Vec<String>,
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |x| format!("{x:.prec$}"))
}

/// The header of the results table.
pub fn table_header() -> String {
    format!(
        "{:<10} {:<3} {:<16} {:>5} {:>4} {:>3} | {:>7} {:>7} {:>6} {:>7} {:>6} {:>5} | {:>7} {:>7} {:>7} {:>7}",
        "gateway", "dir", "cipher", "size", "tun", "wrk", "Gbit/s", "Mpps", "ns/B", "ns/pkt", "cores", "cryp%", "p50us", "p99us", "p999us", "loss@1/2"
    )
}

/// The columns that name a case (gateway, direction, cipher, size, tunnels, workers).
fn case_columns(c: &CaseReport) -> String {
    format!(
        "{:<10} {:<3} {:<16} {:>5} {:>4} {:>3}",
        c.gateway,
        if c.direction == "inbound" {
            "in"
        } else {
            "out"
        },
        c.cipher,
        c.size,
        c.tunnels,
        c.workers.map_or_else(|| "-".to_owned(), |w| w.to_string()),
    )
}

/// One line of the results table.
pub fn table_row(c: &CaseReport) -> String {
    let lat = |f: fn(&Percentiles) -> f64| opt(c.latency_us.as_ref().map(f), 1);
    format!(
        "{} | {:>7.2} {:>7.3} {:>6.2} {:>7.0} {:>6.2} {:>5} | {:>7} {:>7} {:>7} {:>7}",
        case_columns(c),
        c.gbps,
        c.mpps,
        c.cpu_ns_per_byte,
        c.cpu_ns_per_packet,
        c.cpu_cores,
        c.crypto_fraction
            .map_or_else(|| "-".to_owned(), |f| format!("{:.0}", f * 100.0)),
        lat(|p| p.p50),
        lat(|p| p.p99),
        lat(|p| p.p999),
        format!("{:.2}%", c.drops.loss_ratio * 100.0),
    )
}

/// The header of the offered-load table.
pub fn load_header() -> String {
    format!(
        "{:<10} {:<3} {:<16} {:>5} {:>4} {:>3} | {:<8} {:>5} | {:>8} {:>8} {:>8} {:>7} {:>6} {:>6} {:>7}",
        "gateway",
        "dir",
        "cipher",
        "size",
        "tun",
        "wrk",
        "peer",
        "load",
        "off Mpps",
        "sent",
        "Mpps",
        "ns/pkt",
        "ns/B",
        "cores",
        "loss"
    )
}

/// One line of the offered-load table.
pub fn load_row(c: &CaseReport, l: &LoadFigures) -> String {
    format!(
        "{} | {:<8} {:>4}% | {:>8.3} {:>8.3} {:>8.3} {:>7.0} {:>6.2} {:>6.2} {:>6.2}%",
        case_columns(c),
        l.peer,
        l.load_pct,
        l.run.offered_pps / 1e6,
        l.sent_pps / 1e6,
        l.run.mpps,
        l.run.cpu_ns_per_packet,
        l.run.cpu_ns_per_byte,
        l.cpu_cores,
        l.run.drops.loss_ratio * 100.0,
    )
}

/// Writes `targets` as text, one line each with its verdict.
pub(crate) fn write_targets(out: &mut String, targets: &[Target]) {
    let _ = writeln!(out, "\ntargets:");
    for t in targets {
        let verdict = match t.met {
            Some(true) => "met   ",
            Some(false) => "MISSED",
            None => "n/a   ",
        };
        let _ = writeln!(
            out,
            "  [{verdict}] {}: {} (measured {} {}) - {}",
            t.name,
            t.requirement,
            opt(t.value, 3),
            t.unit,
            t.detail
        );
    }
}

/// The whole report as text: results, offered loads, crypto-only limits, targets.
pub fn render_text(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "protego bench: {} CPUs ({}), kernel {}, {:.1} s per measurement",
        r.machine.cpus, r.machine.cpu_model, r.machine.kernel, r.settings.duration_s
    );
    let _ = writeln!(out, "{}", r.settings.imix);
    for n in &r.settings.notes {
        let _ = writeln!(out, "  - {n}");
    }
    if let Some(b) = &r.baseline_latency_us {
        let _ = writeln!(
            out,
            "baseline path (no gateway in user space): p50 {:.1} us, p99 {:.1} us, p999 {:.1} us",
            b.p50, b.p99, b.p999
        );
    }
    let _ = writeln!(
        out,
        "\nresults (rates and CPU at the maximum rate; latency and loss at half of it):"
    );
    let _ = writeln!(out, "{}", table_header());
    for c in &r.cases {
        let _ = writeln!(out, "{}", table_row(c));
        if let Some(share) = &c.worker_share {
            if share.len() > 1 {
                let s: Vec<String> = share.iter().map(|x| format!("{:.0}%", x * 100.0)).collect();
                let _ = writeln!(out, "{:>49} worker share: {}", "", s.join(" / "));
            }
        }
    }
    if r.cases.iter().any(|c| !c.at_load.is_empty()) {
        let _ = writeln!(
            out,
            "\nat offered loads (percent of the case's maximum rate; batching: GSO trains, many per system call; single: one datagram per system call):"
        );
        let _ = writeln!(out, "{}", load_header());
        for c in &r.cases {
            for l in &c.at_load {
                let _ = writeln!(out, "{}", load_row(c, l));
            }
        }
    }
    let _ = writeln!(
        out,
        "\ncrypto only (esp crate over aws-lc-rs, one core, no I/O):"
    );
    let _ = writeln!(
        out,
        "{:<16} {:>5} | {:>9} {:>7} {:>7} | {:>9} {:>7} {:>7}",
        "cipher", "size", "seal ns/p", "ns/B", "Gbit/s", "open ns/p", "ns/B", "Gbit/s"
    );
    for f in &r.crypto_only {
        let _ = writeln!(
            out,
            "{:<16} {:>5} | {:>9.0} {:>7.3} {:>7.2} | {:>9.0} {:>7.3} {:>7.2}",
            f.cipher,
            f.size,
            f.seal_ns_per_packet,
            f.seal_ns_per_byte,
            f.seal_gbps,
            f.open_ns_per_packet,
            f.open_ns_per_byte,
            f.open_gbps
        );
    }
    write_targets(&mut out, &r.targets);
    for e in &r.errors {
        let _ = writeln!(out, "error: {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{Cipher, Direction, GatewayKind, PacketSize};

    fn run(sent: u64, delivered: u64, bytes: u64, span: f64, cpu: u64) -> RunResult {
        RunResult {
            offered_pps: 1e6,
            sent,
            delivered,
            delivered_bytes: bytes,
            rx_span_s: span,
            send_span_s: span,
            cpu_ns: cpu,
            gateway_drops: Some(3),
            gateway_socket_drops: 7,
            loadgen_overflow: 0,
            path_drops: 0,
            worker_packets: vec![300, 100],
            reorder: Some((12, 8192)),
            latency_ns: Vec::new(),
            status: None,
        }
    }

    fn case() -> Case {
        Case {
            gateway: GatewayKind::Protego,
            workers: Some(2),
            tunnels: 1,
            cipher: Cipher::Aes256Gcm,
            size: PacketSize::Fixed(1400),
            direction: Direction::Inbound,
        }
    }

    #[test]
    fn figures_follow_from_counters() {
        // 1000 packets of 1400 bytes in 1 ms, 700 µs of CPU.
        let max = run(1250, 1000, 1_400_000, 0.001, 700_000);
        let half = run(500, 499, 698_600, 0.001, 400_000);
        let crypto = CryptoFigure {
            cipher: "aes256gcm".into(),
            size: "1400".into(),
            mean_bytes: 1400.0,
            seal_ns_per_packet: 280.0,
            seal_ns_per_byte: 0.2,
            seal_gbps: 40.0,
            open_ns_per_packet: 350.0,
            open_ns_per_byte: 0.25,
            open_gbps: 32.0,
        };
        let lat = Percentiles {
            p50: 30.0,
            p99: 80.0,
            p999: 120.0,
            max: 200.0,
            samples: 499,
        };
        let c = CaseReport::new(&case(), &max, &half, Some(lat), Some(10.0), Some(&crypto));
        assert!((c.mpps - 1.0).abs() < 1e-9);
        assert!((c.gbps - 11.2).abs() < 1e-9);
        assert!((c.cpu_ns_per_packet - 700.0).abs() < 1e-9);
        assert!((c.cpu_ns_per_byte - 0.5).abs() < 1e-9);
        assert!((c.cpu_cores - 0.7).abs() < 1e-9);
        assert!((c.crypto_fraction.expect("crypto") - 0.5).abs() < 1e-9);
        assert_eq!(c.worker_share, Some(vec![0.75, 0.25]));
        assert_eq!((c.max_reorder, c.replay_window), (Some(12), Some(8192)));
        assert_eq!(c.drops.lost, 1);
        assert_eq!(c.max_rate.drops.lost, 250);
        assert_eq!(c.max_rate.drops.gateway_socket, 7);
        let l = c.latency_us.expect("latency");
        assert_eq!((l.p50, l.p99, l.p999), (20.0, 70.0, 110.0));
        assert_eq!(c.raw_latency_us.expect("raw").p50, 30.0);
        assert!(c.is("protego", "inbound", "aes256gcm", "1400", 1));
        let row = table_row(&c);
        assert!(row.contains("11.20") && row.contains("0.20%"), "{row}");
    }

    #[test]
    fn json_shape() {
        let max = run(10, 10, 14_000, 0.001, 7_000);
        let c = CaseReport::new(&case(), &max, &max, None, None, None);
        let v = serde_json::to_value(&c).expect("serialises");
        for key in [
            "gbps",
            "mpps",
            "cpu_ns_per_byte",
            "cpu_ns_per_packet",
            "drops",
            "latency_us",
            "workers",
            "tunnels",
            "cipher",
            "size",
            "direction",
            "worker_share",
            "max_rate",
            "half_rate",
        ] {
            assert!(v.get(key).is_some(), "missing {key} in {v}");
        }
        assert_eq!(v["direction"], "inbound");
        assert_eq!(v["workers"], 2);
        assert!(v["latency_us"].is_null());
        assert_eq!(v["drops"]["gateway_counters"], 3);
        assert_eq!(v["at_load"], serde_json::json!([]));
    }

    #[test]
    fn load_runs_report_cpu_per_packet_and_byte_flat() {
        // 100 packets of 1400 bytes delivered in 0.1 s with 2 ms of CPU: 20 µs a packet.
        let r = run(100, 100, 140_000, 0.1, 2_000_000);
        let mut c = CaseReport::new(&case(), &r, &r, None, None, None);
        c.at_load
            .push(LoadFigures::new(crate::options::PeerMode::Single, 10, &r));
        let l = &c.at_load[0];
        assert!((l.run.cpu_ns_per_packet - 20_000.0).abs() < 1e-6);
        assert!((l.cpu_cores - 0.02).abs() < 1e-9);
        let v = serde_json::to_value(&c).expect("serialises");
        let j = &v["at_load"][0];
        assert_eq!(j["peer"], "single");
        assert_eq!(j["load_pct"], 10);
        assert!((j["sent_pps"].as_f64().expect("sent_pps") - 1000.0).abs() < 1e-6);
        for key in [
            "offered_pps",
            "mpps",
            "cpu_ns_per_packet",
            "cpu_ns_per_byte",
            "drops",
        ] {
            assert!(
                j.get(key).is_some(),
                "the run's {key} is flattened into {j}"
            );
        }
        let row = load_row(&c, l);
        assert!(row.contains("single") && row.contains("10%"), "{row}");
        assert!(row.contains("20000"), "{row}");
    }
}
