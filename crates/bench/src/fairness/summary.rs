//! The figures of `protego bench fairness` from its runs: medians per case and mode
//! ([`summarize`]), the targets ([`targets`]) and the text report ([`render`]).

use std::fmt::Write as _;

use super::metrics::{fair_shares, jain_of_shares, median};
use super::{CaseSpec, CaseSummary, FairReport, Mode, RunFigures, TenantSummary};
use crate::report::Target;

/// The largest deviation of a tenant's CPU share from its fair share (relative).
pub(crate) const SHARE_TOLERANCE: f64 = 0.05;
/// The smallest Jain's index.
pub(crate) const JAIN_MIN: f64 = 0.99;
/// An idle tenant: total decrypted with enforce at least this share of off's.
pub(crate) const IDLE_MIN: f64 = 0.95;
/// The charge's cost per packet at most.
pub(crate) const OVERHEAD_MAX: f64 = 0.03;
/// 1 → 64 tenants: throughput falls by at most this.
pub(crate) const SCALE_MAX_FALL: f64 = 0.05;
/// A spinning tenant lowers the others' throughput by at most this.
pub(crate) const SPIN_MAX_FALL: f64 = 0.05;

fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

/// Each tenant's demand as a share of the worker: the packets of it that reached the gateway
/// (counted by the charge, refused ones included) times what one of its packets costs when
/// served (the median of the case's `account` runs, where nothing is refused), over all the
/// CPU charged in the run; the median over the case's enforcing runs (accounting ones if
/// there are none). None for a tenant whose cost is unknown (taken as more than the worker);
/// 0 for a tenant that sends nothing.
fn demands(case: &CaseSpec, runs: &[&RunFigures]) -> Vec<Option<f64>> {
    case.tenants
        .iter()
        .enumerate()
        .map(|(k, t)| {
            if t.share == 0 {
                return Some(0.0);
            }
            let costs: Vec<f64> = runs
                .iter()
                .filter(|r| r.mode == Mode::Account.name())
                .filter_map(|r| {
                    let tr = r.tenants.get(k)?;
                    ratio(tr.cpu_ns?, tr.counted?)
                })
                .collect();
            let cost = median(&costs)?;
            // Arrivals while enforcing (refused packets are cheap, so the gateway reads more
            // of them than while accounting), else while accounting.
            let mode = if runs.iter().any(|r| r.mode == Mode::Enforce.name()) {
                Mode::Enforce
            } else {
                Mode::Account
            };
            let per_run: Vec<f64> = runs
                .iter()
                .filter(|r| r.mode == mode.name())
                .filter_map(|r| {
                    let charged: u64 = r.tenants.iter().filter_map(|t| t.cpu_ns).sum();
                    let arrived = r.tenants.get(k)?.counted?;
                    (charged > 0).then(|| arrived as f64 * cost / charged as f64)
                })
                .collect();
            median(&per_run)
        })
        .collect()
}

/// Medians over the rounds of each case in each of its modes.
pub(crate) fn summarize(cases: &[CaseSpec], runs: &[RunFigures]) -> Vec<CaseSummary> {
    let mut out = Vec::new();
    for case in cases {
        let of_case: Vec<&RunFigures> = runs.iter().filter(|r| r.case == case.name).collect();
        let weights: Vec<u16> = case.tenants.iter().map(|t| t.weight).collect();
        let fair = fair_shares(&weights, &demands(case, &of_case));
        for mode in Mode::ALL {
            let rs: Vec<&RunFigures> = of_case
                .iter()
                .copied()
                .filter(|r| r.mode == mode.name() && r.span_s > 0.0)
                .collect();
            if rs.is_empty() {
                continue;
            }
            let med = |f: &dyn Fn(&RunFigures) -> Option<f64>| {
                median(&rs.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
            };
            let total_decrypted =
                |r: &RunFigures| r.tenants.iter().map(|t| t.decrypted).sum::<u64>();
            let charged = |r: &RunFigures| -> Option<u64> {
                r.tenants.iter().map(|t| t.cpu_ns).sum::<Option<u64>>()
            };
            let tenants: Vec<TenantSummary> = case
                .tenants
                .iter()
                .enumerate()
                .map(|(k, t)| {
                    let get = |r: &RunFigures| r.tenants.get(k).cloned().unwrap_or_default();
                    let cpu_share = med(&|r| ratio(get(r).cpu_ns?, charged(r)?));
                    TenantSummary {
                        tenant: t.name.clone(),
                        weight: t.weight,
                        traffic: t.traffic.label(),
                        program: t.program.label().to_owned(),
                        offered_pps: med(&|r| Some(get(r).offered as f64 / r.span_s))
                            .unwrap_or(0.0),
                        decrypted_pps: med(&|r| Some(get(r).decrypted as f64 / r.span_s))
                            .unwrap_or(0.0),
                        cpu_share,
                        packet_share: med(&|r| ratio(get(r).decrypted, total_decrypted(r)))
                            .unwrap_or(0.0),
                        fair_share: fair[k],
                        deviation: cpu_share
                            .filter(|_| fair[k] > 0.0)
                            .map(|s| s / fair[k] - 1.0),
                        ns_per_packet: med(&|r| {
                            let t = get(r);
                            ratio(t.cpu_ns?, t.counted?)
                        }),
                        fair_drops_pps: med(&|r| Some(get(r).fair_drops? as f64 / r.span_s)),
                    }
                })
                .collect();
            let shares: Option<Vec<f64>> = tenants.iter().map(|t| t.cpu_share).collect();
            let jain = shares.as_ref().map(|s| jain_of_shares(s, &fair));
            let max_deviation = shares.as_ref().map(|_| {
                tenants
                    .iter()
                    .filter_map(|t| t.deviation)
                    .map(f64::abs)
                    .fold(0.0, f64::max)
            });
            out.push(CaseSummary {
                case: case.name.to_owned(),
                mode: mode.name().to_owned(),
                rounds: rs.len(),
                offered_pps: med(&|r| Some(r.offered_pps)).unwrap_or(0.0),
                decrypted_pps: med(&|r| Some(total_decrypted(r) as f64 / r.span_s)).unwrap_or(0.0),
                host_pps: med(&|r| Some(r.host_delivered as f64 / r.span_s)).unwrap_or(0.0),
                cpu_ns_per_packet: med(&|r| ratio(r.gateway_cpu_ns, total_decrypted(r)))
                    .unwrap_or(0.0),
                gateway_cores: med(&|r| Some(r.gateway_cpu_ns as f64 / 1e9 / r.span_s))
                    .unwrap_or(0.0),
                loadavg: med(&|r| r.loadavg),
                capped_phases_per_s: med(&|r| Some(r.capped_phases? as f64 / r.span_s)),
                jain,
                max_deviation,
                tenants,
            });
        }
    }
    out
}

fn find<'a>(s: &'a [CaseSummary], case: &str, mode: Mode) -> Option<&'a CaseSummary> {
    s.iter().find(|c| c.case == case && c.mode == mode.name())
}

fn pct(x: f64) -> String {
    format!("{:+.1} %", x * 100.0)
}

fn shares_text(c: &CaseSummary) -> String {
    c.tenants
        .iter()
        .map(|t| {
            format!(
                "{} {} (fair {:.1} %)",
                t.tenant,
                t.cpu_share
                    .map_or_else(|| "-".to_owned(), |s| format!("{:.1} %", s * 100.0)),
                t.fair_share * 100.0
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn not_measured(name: &str, requirement: &str, unit: &str, why: &str) -> Target {
    Target {
        name: name.to_owned(),
        requirement: requirement.to_owned(),
        value: None,
        unit: unit.to_owned(),
        met: None,
        detail: why.to_owned(),
    }
}

/// The targets (§4), from the summaries.
pub(crate) fn targets(s: &[CaseSummary]) -> Vec<Target> {
    let mut out = Vec::new();
    for case in ["equal", "weighted", "weighted-skew"] {
        let name = format!("fair shares ({case})");
        let requirement = format!(
            "under overload, enforcing: every tenant's CPU share within ±{:.0} % of its weighted fair share, Jain's index ≥ {JAIN_MIN}",
            SHARE_TOLERANCE * 100.0
        );
        match find(s, case, Mode::Enforce) {
            Some(e) if e.max_deviation.is_some() => {
                let dev = e.max_deviation.unwrap_or(f64::INFINITY);
                let jain = e.jain.unwrap_or(0.0);
                let without = find(s, case, Mode::Account).map_or_else(String::new, |a| {
                    format!(
                        "; without fairness (account): {}, Jain {:.3}",
                        shares_text(a),
                        a.jain.unwrap_or(0.0)
                    )
                });
                out.push(Target {
                    name,
                    requirement,
                    value: Some(dev * 100.0),
                    unit: "% largest deviation".to_owned(),
                    met: Some(dev <= SHARE_TOLERANCE && jain >= JAIN_MIN),
                    detail: format!("enforce: {}, Jain {jain:.3}{without}", shares_text(e)),
                });
            }
            _ => out.push(not_measured(
                &name,
                &requirement,
                "%",
                "no enforce run with CPU shares",
            )),
        }
    }
    let idle_req = format!(
        "an idle tenant's share is used by the others: total decrypted with enforce within {:.0} % of off",
        (1.0 - IDLE_MIN) * 100.0
    );
    match (find(s, "idle", Mode::Enforce), find(s, "idle", Mode::Off)) {
        (Some(e), Some(o)) if o.decrypted_pps > 0.0 => {
            let r = e.decrypted_pps / o.decrypted_pps;
            out.push(Target {
                name: "idle tenant".to_owned(),
                requirement: idle_req,
                value: Some((r - 1.0) * 100.0),
                unit: "% vs off".to_owned(),
                met: Some(r >= IDLE_MIN),
                detail: format!(
                    "decrypted {:.3} Mpps enforcing, {:.3} Mpps off; enforce: {}",
                    e.decrypted_pps / 1e6,
                    o.decrypted_pps / 1e6,
                    shares_text(e)
                ),
            });
        }
        _ => out.push(not_measured(
            "idle tenant",
            &idle_req,
            "%",
            "needs the idle case off and enforcing",
        )),
    }
    let over_req = format!(
        "accounting plus fairness cost ≤ {:.0} % per packet at 64 B against cpu_fairness = off (tenants interleaved packet by packet)",
        OVERHEAD_MAX * 100.0
    );
    match (
        find(s, "overhead", Mode::Off),
        find(s, "overhead", Mode::Account),
        find(s, "overhead", Mode::Enforce),
    ) {
        (Some(o), a, Some(e)) if o.cpu_ns_per_packet > 0.0 => {
            let re = e.cpu_ns_per_packet / o.cpu_ns_per_packet - 1.0;
            let ra = a.map(|a| a.cpu_ns_per_packet / o.cpu_ns_per_packet - 1.0);
            out.push(Target {
                name: "charge overhead".to_owned(),
                requirement: over_req,
                value: Some(re * 100.0),
                unit: "% CPU per packet, enforce vs off".to_owned(),
                met: Some(re <= OVERHEAD_MAX),
                detail: format!(
                    "gateway CPU per decrypted packet: off {:.0} ns, account {}, enforce {:.0} ns ({}){}; Mpps off {:.3}, enforce {:.3}",
                    o.cpu_ns_per_packet,
                    a.map_or_else(|| "-".to_owned(), |a| format!(
                        "{:.0} ns ({})",
                        a.cpu_ns_per_packet,
                        ra.map_or_else(String::new, pct)
                    )),
                    e.cpu_ns_per_packet,
                    pct(re),
                    find(s, "overhead", Mode::EnforceKernel).map_or_else(String::new, |w| format!(
                        ", enforce-kernel {:.0} ns ({})",
                        w.cpu_ns_per_packet,
                        pct(w.cpu_ns_per_packet / o.cpu_ns_per_packet - 1.0)
                    )),
                    o.decrypted_pps / 1e6,
                    e.decrypted_pps / 1e6
                ),
            });
        }
        _ => out.push(not_measured(
            "charge overhead",
            &over_req,
            "%",
            "needs the overhead case off and enforcing",
        )),
    }
    let scale_req = format!(
        "from 1 to 64 tenants (64 tunnels either way) the throughput falls by ≤ {:.0} %, enforcing",
        SCALE_MAX_FALL * 100.0
    );
    match (
        find(s, "scale1", Mode::Enforce),
        find(s, "scale64", Mode::Enforce),
    ) {
        (Some(one), Some(many)) if one.decrypted_pps > 0.0 => {
            let r = many.decrypted_pps / one.decrypted_pps;
            let off = match (find(s, "scale1", Mode::Off), find(s, "scale64", Mode::Off)) {
                (Some(a), Some(b)) if a.decrypted_pps > 0.0 => format!(
                    "; off: {:.3} → {:.3} Mpps ({})",
                    a.decrypted_pps / 1e6,
                    b.decrypted_pps / 1e6,
                    pct(b.decrypted_pps / a.decrypted_pps - 1.0)
                ),
                _ => String::new(),
            };
            out.push(Target {
                name: "1 → 64 tenants".to_owned(),
                requirement: scale_req,
                value: Some((r - 1.0) * 100.0),
                unit: "% throughput".to_owned(),
                met: Some(r >= 1.0 - SCALE_MAX_FALL),
                detail: format!(
                    "enforce: {:.3} → {:.3} Mpps decrypted, CPU per packet {:.0} → {:.0} ns{off}",
                    one.decrypted_pps / 1e6,
                    many.decrypted_pps / 1e6,
                    one.cpu_ns_per_packet,
                    many.cpu_ns_per_packet
                ),
            });
        }
        _ => out.push(not_measured(
            "1 → 64 tenants",
            &scale_req,
            "%",
            "needs scale1 and scale64 enforcing",
        )),
    }
    let spin_req = format!(
        "a tenant whose program runs to its instruction limit on every packet lowers the others' throughput by ≤ {:.0} %, enforcing",
        SPIN_MAX_FALL * 100.0
    );
    let others = |c: &CaseSummary| -> f64 {
        c.tenants
            .iter()
            .filter(|t| t.program != "spin" && t.tenant != "d-spin")
            .map(|t| t.decrypted_pps)
            .sum()
    };
    match (
        find(s, "spin-base", Mode::Enforce),
        find(s, "spin", Mode::Enforce),
    ) {
        (Some(base), Some(spin)) if others(base) > 0.0 => {
            let r = others(spin) / others(base);
            let acc = match (find(s, "spin-base", Mode::Account), find(s, "spin", Mode::Account)) {
                (Some(a), Some(b)) if others(a) > 0.0 => format!(
                    "; without fairness (account): {:.3} → {:.3} Mpps ({}), the spinning tenant's CPU share {}",
                    others(a) / 1e6,
                    others(b) / 1e6,
                    pct(others(b) / others(a) - 1.0),
                    b.tenants
                        .last()
                        .and_then(|t| t.cpu_share)
                        .map_or_else(|| "-".to_owned(), |x| format!("{:.1} %", x * 100.0))
                ),
                _ => String::new(),
            };
            let workers = match (
                find(s, "spin-base", Mode::EnforceKernel),
                find(s, "spin", Mode::EnforceKernel),
            ) {
                (Some(a), Some(b)) if others(a) > 0.0 => format!(
                    "; with the kernel gate (enforce-kernel): {:.3} → {:.3} Mpps ({})",
                    others(a) / 1e6,
                    others(b) / 1e6,
                    pct(others(b) / others(a) - 1.0)
                ),
                _ => String::new(),
            };
            out.push(Target {
                name: "spinning program".to_owned(),
                requirement: spin_req,
                value: Some((r - 1.0) * 100.0),
                unit: "% others' throughput".to_owned(),
                met: Some(r >= 1.0 - SPIN_MAX_FALL),
                detail: format!(
                    "enforce: the other tenants {:.3} → {:.3} Mpps decrypted; shares with the spinning tenant: {}{acc}{workers}",
                    others(base) / 1e6,
                    others(spin) / 1e6,
                    shares_text(spin)
                ),
            });
        }
        _ => out.push(not_measured(
            "spinning program",
            &spin_req,
            "%",
            "needs spin-base and spin enforcing",
        )),
    }
    out
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_owned(), f)
}

/// The text report: per case and mode a table of the tenants, then the targets.
pub fn render(r: &FairReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "protego bench fairness: {} round(s) of {:.1} s at {:.2} Mpps offered, {} worker(s), {} ({} CPUs, {})",
        r.settings.rounds,
        r.settings.duration_s,
        r.settings.rate_pps / 1e6,
        r.settings.workers,
        r.settings.cipher,
        r.machine.cpus,
        r.machine.cpu_model
    );
    for c in &r.summaries {
        let purpose = r
            .cases
            .iter()
            .find(|k| k.name == c.case)
            .map_or("", |k| k.purpose);
        let _ = writeln!(
            s,
            "\n{} / {} ({purpose}), median of {}: offered {:.3} Mpps, decrypted {:.3} Mpps, at the host {:.3} Mpps, gateway {:.0} ns/packet, {:.2} cores (load average {}), capped charge phases {}/s, Jain {}, largest deviation {}",
            c.case,
            c.mode,
            c.rounds,
            c.offered_pps / 1e6,
            c.decrypted_pps / 1e6,
            c.host_pps / 1e6,
            c.cpu_ns_per_packet,
            c.gateway_cores,
            opt(c.loadavg, |l| format!("{l:.1}")),
            opt(c.capped_phases_per_s, |p| format!("{p:.0}")),
            opt(c.jain, |j| format!("{j:.3}")),
            opt(c.max_deviation, |d| format!("{:.1} %", d * 100.0)),
        );
        let _ = writeln!(
            s,
            "  {:<8} {:>3} {:<10} {:<13} {:>8} {:>8} {:>7} {:>7} {:>7} {:>8} {:>7} {:>9}",
            "tenant",
            "w",
            "traffic",
            "program",
            "off.Mpps",
            "dec.Mpps",
            "cpu%",
            "fair%",
            "dev",
            "pkt%",
            "ns/pkt",
            "fdrop/s"
        );
        for t in &c.tenants {
            let _ = writeln!(
                s,
                "  {:<8} {:>3} {:<10} {:<13} {:>8.3} {:>8.3} {:>7} {:>7.1} {:>7} {:>8.1} {:>7} {:>9}",
                t.tenant,
                t.weight,
                t.traffic,
                t.program,
                t.offered_pps / 1e6,
                t.decrypted_pps / 1e6,
                opt(t.cpu_share, |x| format!("{:.1}", x * 100.0)),
                t.fair_share * 100.0,
                opt(t.deviation, |x| format!("{:+.1}%", x * 100.0)),
                t.packet_share * 100.0,
                opt(t.ns_per_packet, |x| format!("{x:.0}")),
                opt(t.fair_drops_pps, |x| format!("{x:.0}")),
            );
        }
    }
    let _ = writeln!(s, "\ntargets (issue 18 §4):");
    for t in &r.targets {
        let verdict = match t.met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "not measured",
        };
        let _ = writeln!(
            s,
            "  {:<18} {:<12} {} {}\n      {}\n      {}",
            t.name,
            verdict,
            opt(t.value, |v| format!("{v:+.1}")),
            t.unit,
            t.requirement,
            t.detail
        );
    }
    for e in &r.errors {
        let _ = writeln!(s, "error: {e}");
    }
    s
}
