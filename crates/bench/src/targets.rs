//! The targets of issue 3, evaluated on the measured cases. A target whose cases were not
//! part of the run is reported as not measured, never as met.

use crate::crypto_only::CryptoFigure;
use crate::report::{CaseReport, Target};

/// Gateway CPU per byte allowed for inbound AES-256-GCM, 1400 bytes, one tunnel.
pub(crate) const MAX_NS_PER_BYTE: f64 = 1.5;
/// How many times less CPU per byte than strongSwan.
pub(crate) const MIN_SPEEDUP_VS_STRONGSWAN: f64 = 10.0;
/// The least share of the crypto-only limit.
pub(crate) const MIN_CRYPTO_FRACTION: f64 = 0.40;
/// Most extra per-packet cost of all workers over one worker.
pub(crate) const MAX_WORKER_OVERHEAD: f64 = 0.10;
/// Most extra per-packet cost of 1000 tunnels over one.
pub(crate) const MAX_TUNNEL_OVERHEAD: f64 = 0.10;
/// Evenness demanded of the worker spread: the busiest worker's share times the worker count
/// at most this (1.0 is a perfect spread).
pub(crate) const MAX_SPREAD: f64 = 1.25;
/// Added p99 latency allowed at half the maximum rate, µs.
pub(crate) const MAX_P99_US: f64 = 100.0;

const CIPHER: &str = "aes256gcm";
const SIZE: &str = "1400";

fn find<'a>(
    cases: &'a [CaseReport],
    gateway: &str,
    direction: &str,
    tunnels: u32,
    workers: Option<u32>,
) -> Option<&'a CaseReport> {
    cases
        .iter()
        .filter(|c| c.is(gateway, direction, CIPHER, SIZE, tunnels))
        .filter(|c| workers.is_none() || c.workers == workers)
        .min_by_key(|c| c.workers.unwrap_or(0))
}

fn max_workers<'a>(cases: &'a [CaseReport], direction: &str) -> Option<&'a CaseReport> {
    cases
        .iter()
        .filter(|c| c.is("protego", direction, CIPHER, SIZE, 1))
        .max_by_key(|c| c.workers.unwrap_or(0))
}

fn not_measured(name: &str, requirement: String, unit: &str, why: &str) -> Target {
    Target {
        name: name.to_owned(),
        requirement,
        value: None,
        unit: unit.to_owned(),
        met: None,
        detail: format!("not measured: {why}"),
    }
}

/// Evaluates every target on `cases` (and the crypto-only figures).
pub(crate) fn evaluate(cases: &[CaseReport], crypto: &[CryptoFigure]) -> Vec<Target> {
    let mut out = Vec::new();
    let headline = find(cases, "protego", "inbound", 1, Some(1))
        .or_else(|| find(cases, "protego", "inbound", 1, None));
    let what = "inbound AES-256-GCM 1400 B, 1 tunnel";

    // 1. CPU per byte.
    let name = "cpu_per_byte";
    let req = format!("{what}: gateway CPU <= {MAX_NS_PER_BYTE} ns per byte");
    out.push(match headline {
        Some(c) => Target {
            name: name.to_owned(),
            requirement: req,
            value: Some(c.cpu_ns_per_byte),
            unit: "ns/B".to_owned(),
            met: Some(c.cpu_ns_per_byte <= MAX_NS_PER_BYTE),
            detail: format!(
                "{} worker(s): {:.3} ns/B, {:.0} ns/packet, {:.2} Gbit/s",
                c.workers.unwrap_or(0),
                c.cpu_ns_per_byte,
                c.cpu_ns_per_packet,
                c.gbps
            ),
        },
        None => not_measured(name, req, "ns/B", "the case was not in the run"),
    });

    // 2. Versus strongSwan.
    let name = "vs_strongswan";
    let req = format!("{what}: at least {MIN_SPEEDUP_VS_STRONGSWAN}x less CPU per byte than strongSwan in the same run");
    let swan = find(cases, "strongswan", "inbound", 1, None);
    out.push(match (headline, swan) {
        (Some(p), Some(s)) if p.cpu_ns_per_byte > 0.0 => {
            let ratio = s.cpu_ns_per_byte / p.cpu_ns_per_byte;
            Target {
                name: name.to_owned(),
                requirement: req,
                value: Some(ratio),
                unit: "x".to_owned(),
                met: Some(ratio >= MIN_SPEEDUP_VS_STRONGSWAN),
                detail: format!(
                    "strongSwan {:.3} ns/B vs Protego {:.3} ns/B",
                    s.cpu_ns_per_byte, p.cpu_ns_per_byte
                ),
            }
        }
        (_, None) => not_measured(name, req, "x", "run with --compare-strongswan"),
        _ => not_measured(name, req, "x", "no Protego figure"),
    });

    // 3. Share of the crypto-only limit.
    let name = "crypto_fraction";
    let req = format!(
        "{what}: at least {:.0} % of the crypto-only limit per core",
        MIN_CRYPTO_FRACTION * 100.0
    );
    let limit = crypto.iter().find(|f| f.cipher == CIPHER && f.size == SIZE);
    out.push(match (headline, limit) {
        (Some(c), Some(f)) if c.cpu_ns_per_byte > 0.0 => {
            let frac = f.open_ns_per_byte / c.cpu_ns_per_byte;
            Target {
                name: name.to_owned(),
                requirement: req,
                value: Some(frac),
                unit: "fraction".to_owned(),
                met: Some(frac >= MIN_CRYPTO_FRACTION),
                detail: format!(
                    "crypto alone {:.3} ns/B ({:.1} Gbit/s per core) vs gateway {:.3} ns/B",
                    f.open_ns_per_byte, f.open_gbps, c.cpu_ns_per_byte
                ),
            }
        }
        _ => not_measured(
            name,
            req,
            "fraction",
            "the case or its crypto-only figure is missing",
        ),
    });

    // 4. All workers versus one, per direction; and the spread.
    for direction in ["inbound", "outbound"] {
        let name = format!("workers_cost_{direction}");
        let req = format!(
            "{direction} AES-256-GCM 1400 B, 1 tunnel: per-packet CPU with all workers within {:.0} % of 1 worker",
            MAX_WORKER_OVERHEAD * 100.0
        );
        let one = find(cases, "protego", direction, 1, Some(1));
        let all = max_workers(cases, direction);
        out.push(match (one, all) {
            (Some(o), Some(a)) if a.workers > o.workers && o.cpu_ns_per_packet > 0.0 => {
                let extra = a.cpu_ns_per_packet / o.cpu_ns_per_packet - 1.0;
                Target {
                    name,
                    requirement: req,
                    value: Some(extra),
                    unit: "extra".to_owned(),
                    met: Some(extra <= MAX_WORKER_OVERHEAD),
                    detail: format!(
                        "{} workers {:.0} ns/packet vs 1 worker {:.0} ns/packet",
                        a.workers.unwrap_or(0),
                        a.cpu_ns_per_packet,
                        o.cpu_ns_per_packet
                    ),
                }
            }
            _ => not_measured(
                &name,
                req,
                "extra",
                "needs the case with 1 worker and with more",
            ),
        });
        let name = format!("worker_spread_{direction}");
        let req = format!(
            "{direction} AES-256-GCM 1400 B, 1 tunnel, all workers: packets spread evenly (busiest worker's share x workers <= {MAX_SPREAD})"
        );
        out.push(
            match all.and_then(|a| Some((a, a.worker_share.as_ref()?))) {
                Some((a, share)) if share.len() > 1 => {
                    let busiest = share.iter().cloned().fold(0.0, f64::max);
                    let spread = busiest * share.len() as f64;
                    let shares: Vec<String> =
                        share.iter().map(|s| format!("{:.0}%", s * 100.0)).collect();
                    Target {
                        name,
                        requirement: req,
                        value: Some(spread),
                        unit: "x even".to_owned(),
                        met: Some(spread <= MAX_SPREAD),
                        detail: format!(
                            "{} workers: {}",
                            a.workers.unwrap_or(0),
                            shares.join(" / ")
                        ),
                    }
                }
                _ => not_measured(
                    &name,
                    req,
                    "x even",
                    "needs a case with several workers and a gateway reporting per-worker packets",
                ),
            },
        );
    }

    // 5. 1000 tunnels versus one.
    let name = "tunnels_cost";
    let req = format!(
        "{what} vs 1000 tunnels: per-packet CPU at most {:.0} % higher",
        MAX_TUNNEL_OVERHEAD * 100.0
    );
    let one = headline;
    let many = one.and_then(|o| {
        cases
            .iter()
            .filter(|c| c.is("protego", "inbound", CIPHER, SIZE, 1000))
            .find(|c| c.workers == o.workers)
    });
    out.push(match (one, many) {
        (Some(o), Some(m)) if o.cpu_ns_per_packet > 0.0 => {
            let extra = m.cpu_ns_per_packet / o.cpu_ns_per_packet - 1.0;
            Target {
                name: name.to_owned(),
                requirement: req,
                value: Some(extra),
                unit: "extra".to_owned(),
                met: Some(extra <= MAX_TUNNEL_OVERHEAD),
                detail: format!(
                    "1000 tunnels {:.0} ns/packet vs 1 tunnel {:.0} ns/packet ({} worker(s))",
                    m.cpu_ns_per_packet,
                    o.cpu_ns_per_packet,
                    o.workers.unwrap_or(0)
                ),
            }
        }
        _ => not_measured(
            name,
            req,
            "extra",
            "needs 1 and 1000 tunnels with the same workers",
        ),
    });

    // 6. Latency.
    let name = "p99_latency";
    let req = format!("{what}: added p99 latency <= {MAX_P99_US} us at half the maximum rate");
    let worst = cases
        .iter()
        .filter(|c| c.gateway == "protego")
        .filter_map(|c| Some((c, c.latency_us?.p99)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    out.push(match headline.and_then(|c| Some((c, c.latency_us?))) {
        Some((c, l)) => Target {
            name: name.to_owned(),
            requirement: req,
            value: Some(l.p99),
            unit: "us".to_owned(),
            met: Some(l.p99 <= MAX_P99_US),
            detail: format!(
                "p50 {:.1} / p99 {:.1} / p999 {:.1} us at {:.3} Mpps ({} worker(s)); worst p99 of all Protego cases {}",
                l.p50,
                l.p99,
                l.p999,
                c.half_rate.mpps,
                c.workers.unwrap_or(0),
                worst.map_or_else(
                    || "-".to_owned(),
                    |(w, p)| format!("{p:.1} us ({} {} {} {}t {}w)", w.direction, w.cipher, w.size, w.tunnels, w.workers.unwrap_or(0))
                )
            ),
        },
        None => not_measured(name, req, "us", "the case was not in the run"),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::RunResult;
    use crate::options::{Case, Cipher, Direction, GatewayKind, PacketSize};
    use crate::stats::Percentiles;

    fn case(
        gateway: GatewayKind,
        direction: Direction,
        tunnels: u32,
        workers: Option<u32>,
        cpu: u64,
        shares: Vec<u64>,
    ) -> CaseReport {
        let r = RunResult {
            offered_pps: 1e6,
            sent: 1000,
            delivered: 1000,
            delivered_bytes: 1_400_000,
            rx_span_s: 0.001,
            send_span_s: 0.001,
            cpu_ns: cpu,
            worker_packets: shares,
            ..RunResult::default()
        };
        let lat = Percentiles {
            p50: 20.0,
            p99: 60.0,
            p999: 90.0,
            max: 100.0,
            samples: 1000,
        };
        CaseReport::new(
            &Case {
                gateway,
                workers,
                tunnels,
                cipher: Cipher::Aes256Gcm,
                size: PacketSize::Fixed(1400),
                direction,
            },
            &r,
            &r,
            Some(lat),
            Some(5.0),
            None,
        )
    }

    fn crypto() -> CryptoFigure {
        CryptoFigure {
            cipher: "aes256gcm".into(),
            size: "1400".into(),
            mean_bytes: 1400.0,
            seal_ns_per_packet: 280.0,
            seal_ns_per_byte: 0.2,
            seal_gbps: 40.0,
            open_ns_per_packet: 350.0,
            open_ns_per_byte: 0.25,
            open_gbps: 32.0,
        }
    }

    #[test]
    fn met_missed_and_not_measured() {
        use Direction::*;
        use GatewayKind::*;
        let cases = vec![
            // 1 worker: 700 ns/packet = 0.5 ns/B.
            case(Protego, Inbound, 1, Some(1), 700_000, vec![1000]),
            // 2 workers: 5 % more per packet, spread 55/45.
            case(Protego, Inbound, 1, Some(2), 735_000, vec![550, 450]),
            // 1000 tunnels: 20 % more per packet.
            case(Protego, Inbound, 1000, Some(1), 840_000, vec![1000]),
            // strongSwan: 17 ns/B.
            case(StrongSwan, Inbound, 1, None, 23_800_000, vec![]),
        ];
        let t = evaluate(&cases, &[crypto()]);
        let get = |n: &str| t.iter().find(|x| x.name == n).expect(n);
        assert_eq!(get("cpu_per_byte").met, Some(true));
        assert!((get("cpu_per_byte").value.expect("v") - 0.5).abs() < 1e-9);
        assert_eq!(get("vs_strongswan").met, Some(true));
        assert!((get("vs_strongswan").value.expect("v") - 34.0).abs() < 1e-6);
        assert_eq!(get("crypto_fraction").met, Some(true));
        assert!((get("crypto_fraction").value.expect("v") - 0.5).abs() < 1e-9);
        assert_eq!(get("workers_cost_inbound").met, Some(true));
        assert_eq!(get("worker_spread_inbound").met, Some(true));
        assert!((get("worker_spread_inbound").value.expect("v") - 1.1).abs() < 1e-9);
        assert_eq!(get("tunnels_cost").met, Some(false));
        assert!((get("tunnels_cost").value.expect("v") - 0.2).abs() < 1e-9);
        assert_eq!(get("p99_latency").met, Some(true));
        assert!((get("p99_latency").value.expect("v") - 55.0).abs() < 1e-9);
        assert_eq!(get("workers_cost_outbound").met, None);
        // Nothing measured: every target is "not measured", none is met.
        assert!(evaluate(&[], &[]).iter().all(|t| t.met.is_none()));
    }
}
