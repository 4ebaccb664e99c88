//! Text rendering of a [`StatusReport`] for `protego status`: the SA layout of
//! `swanctl --list-sas` with the counter blocks of `ip -s link`, then the data plane's and the
//! IKE engine's drop counters.

use super::{ChildSaReport, IkeSaReport, StatusReport, TunnelState};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Renders the report as text.
pub fn render_text(report: &StatusReport) -> String {
    let mut out = String::new();
    let up = report
        .tunnels
        .iter()
        .filter(|t| t.state == TunnelState::Established)
        .count();
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "{} tunnel(s), {} established, uptime {}",
        report.tunnels.len(),
        up,
        format_age(report.uptime_secs)
    );
    for t in &report.tunnels {
        let _ = writeln!(
            out,
            "{}: {}, tenant {}, inside {}",
            t.name,
            t.state.as_str().to_uppercase(),
            t.tenant,
            t.inside
        );
        if t.ike_sas.is_empty() {
            let remote = if t.remote_addrs.is_empty() {
                "%any".to_owned()
            } else {
                t.remote_addrs
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = writeln!(out, "  local  '{}'", t.local_id);
            let _ = writeln!(out, "  remote '{}' @ {}", t.remote_id, remote);
        }
        for sa in &t.ike_sas {
            render_ike(&mut out, sa, &t.local_id, &t.remote_id);
        }
    }
    if report.unmatched_ike_sas > 0 {
        let _ = writeln!(
            out,
            "{} IKE SA(s) not matched to a tunnel (half-open)",
            report.unmatched_ike_sas
        );
    }
    render_counters(&mut out, "drops", &report.drops);
    render_counters(&mut out, "ike drops", &report.ike_drops);
    render_workers(&mut out, &report.workers);
    for x in &report.xdp {
        let _ = writeln!(
            out,
            "AF_XDP input on {} ({}, {}, {} queue(s)): {}; {} frames",
            x.interface,
            x.attach,
            if x.zero_copy { "zero-copy" } else { "copy" },
            x.queues,
            x.addresses.join(", "),
            x.frames
        );
    }
    render_tenants_cpu(&mut out, report);
    render_filters(&mut out, &report.filters);
    if let Some(store) = &report.store {
        render_store(&mut out, store);
    }
    if let Some(routes) = report.routes.as_ref().filter(|r| r.entries > 0) {
        render_routes(&mut out, routes);
    }
    out
}

/// The per-VM overlay routes: totals, then the VNets that have entries.
fn render_routes(out: &mut String, r: &super::RouteStatus) {
    let _ = writeln!(
        out,
        "per-VM routes: {} entries to {} hosts, {:.1} MiB (both copies)",
        r.entries,
        r.hosts,
        r.memory_bytes as f64 / (1024.0 * 1024.0)
    );
    for v in r.vnets.iter().filter(|v| v.v4 + v.v6 > 0) {
        let _ = writeln!(
            out,
            "  {}/{}: {} IPv4, {} IPv6",
            v.tenant, v.vnet, v.v4, v.v6
        );
    }
}

/// The IKE state store: what it is, its commits and, while it fails, why and what waits.
fn render_store(out: &mut String, s: &crate::runtime::StoreStats) {
    let _ = writeln!(
        out,
        "store: {}, {} commits ({} records), commit p50 {:.1} ms, p99 {:.1} ms, {} failures",
        s.backend,
        s.commits,
        s.records_written,
        s.commit_us_p50 as f64 / 1e3,
        s.commit_us_p99 as f64 / 1e3,
        s.failures
    );
    if let Some(e) = &s.error {
        let _ = writeln!(
            out,
            "  FAILING: {e}; {} IKE datagrams held until it works",
            s.held
        );
    }
    if let Some(e) = &s.encryption {
        render_encryption(out, e);
    }
}

/// How the store's records are encrypted, and how far a re-encryption got.
fn render_encryption(out: &mut String, e: &crate::store::EncryptionStatus) {
    let records = e
        .records
        .iter()
        .map(|(key, n)| match key.as_str() {
            "clear" => format!("{n} in clear"),
            _ => format!("{n} under key {key}"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let records = if records.is_empty() {
        "no records".to_owned()
    } else {
        records
    };
    match (&e.key_file, e.current_key) {
        (Some(file), Some(current)) => {
            let _ = writeln!(
                out,
                "  encryption: AES-256-GCM-SIV, key file {}, current key {current}; {records}",
                file.display()
            );
            if e.reencrypt_pending > 0 {
                let _ = writeln!(
                    out,
                    "  re-encrypting: {} records left ({} done)",
                    e.reencrypt_pending, e.reencrypted
                );
            }
            if e.accept_cleartext {
                let _ = writeln!(
                    out,
                    "  accept_cleartext is set: remove it once no record is in clear"
                );
            }
        }
        _ => {
            let _ = writeln!(
                out,
                "  encryption: OFF, IKE keys and PSKs are stored in clear (set [store] \
                 encryption_key_file); {records}"
            );
        }
    }
    if let Some(error) = &e.error {
        let _ = writeln!(out, "  re-encryption FAILING: {error}");
    }
}

/// One line per data plane worker: CPU, packets and batches.
fn render_workers(out: &mut String, workers: &[super::WorkerStatus]) {
    if workers.is_empty() {
        return;
    }
    let _ = writeln!(out, "workers:");
    for w in workers {
        let cpu = w
            .cpu
            .map_or_else(|| "unpinned".to_owned(), |c| format!("cpu {c}"));
        // Adaptive polling's cost, once it has any.
        let spin = if w.spin_ns > 0 {
            format!(", {:.1} ms polling idle", w.spin_ns as f64 / 1e6)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "  worker {} ({cpu}): {} packets in {} batches{spin}",
            w.worker, w.packets, w.batches
        );
    }
}

/// One line per tenant the CPU charge knows: CPU time, share, weight, packets, fairness drops
/// and tokens (when enforcing), then the unattributed CPU time and the time taken back from
/// the tenants because their worker was preempted.
fn render_tenants_cpu(out: &mut String, report: &super::StatusReport) {
    if report.tenants.is_empty() {
        return;
    }
    let _ = writeln!(out, "tenant cpu:");
    for t in &report.tenants {
        let tokens = t.tokens_ns.map_or_else(String::new, |n| {
            format!(", tokens {:.3} ms", n as f64 / 1e6)
        });
        let _ = writeln!(
            out,
            "  {}: {:.1} % of the last 10 s ({:.3} ms), weight {}; since the start {:.3} ms \
             ({:.1} %), {} packets, {} fair-share drops{tokens}",
            t.tenant,
            t.recent_cpu_share * 100.0,
            t.recent_cpu_ns as f64 / 1e6,
            t.cpu_weight,
            t.cpu_ns as f64 / 1e6,
            t.cpu_share * 100.0,
            t.packets,
            t.fair_drops,
        );
    }
    let _ = writeln!(
        out,
        "  unattributed: {:.3} ms",
        report.cpu_unattributed_ns as f64 / 1e6
    );
    if report.cpu_preempted_ns != 0 {
        let _ = writeln!(
            out,
            "  taken back (worker preempted): {:.3} ms",
            report.cpu_preempted_ns as f64 / 1e6
        );
    }
    if let Some(n) = report.fair_kernel_drops {
        let _ = writeln!(out, "  kernel gate: on, {n} datagrams dropped");
    }
}

/// One line per running tenant filter: where it runs, its verdicts, its instructions and CPU.
pub fn render_filters(out: &mut String, filters: &[super::FilterStatus]) {
    if filters.is_empty() {
        return;
    }
    let _ = writeln!(out, "filters:");
    for f in filters {
        let _ = writeln!(
            out,
            "  {} {} {} of {} (weight {}, {} insns): {} passed, {} dropped, {} tx, {} aborted \
             ({} at the instruction limit), {} metered insns, {:.3} ms",
            f.tenant,
            f.direction,
            f.section,
            f.object,
            f.weight,
            f.instructions,
            f.passed,
            f.dropped,
            f.tx,
            f.aborted,
            f.insn_limit,
            f.metered_insns,
            f.cpu_ns as f64 / 1e6,
        );
    }
}

/// A `title:` block of the non-zero counters, one `reason  count` line each, or `title: none`.
fn render_counters(out: &mut String, title: &str, counters: &BTreeMap<String, u64>) {
    let nonzero: Vec<_> = counters.iter().filter(|(_, n)| **n > 0).collect();
    if nonzero.is_empty() {
        let _ = writeln!(out, "{title}: none");
    } else {
        let width = nonzero.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let _ = writeln!(out, "{title}:");
        for (reason, count) in nonzero {
            let _ = writeln!(out, "  {reason:<width$}  {count}");
        }
    }
}

fn render_ike(out: &mut String, sa: &IkeSaReport, local_id: &str, remote_id: &str) {
    let (mark_i, mark_r) = if sa.initiator { ("*", "") } else { ("", "*") };
    let _ = writeln!(
        out,
        "  IKE_SA {}, {}_i{} {}_r{}",
        sa.state.to_uppercase(),
        sa.spi_i,
        mark_i,
        sa.spi_r,
        mark_r
    );
    let _ = writeln!(
        out,
        "    local  '{}' @ {}[{}]",
        local_id,
        sa.local.ip(),
        sa.local.port()
    );
    let _ = writeln!(
        out,
        "    remote '{}' @ {}[{}]",
        remote_id,
        sa.remote.ip(),
        sa.remote.port()
    );
    if !sa.proposal.is_empty() {
        let _ = writeln!(out, "    {}", sa.proposal);
    }
    if sa.state != "connecting" {
        let _ = writeln!(
            out,
            "    established {} ago",
            format_age(sa.established_secs)
        );
    }
    for child in &sa.children {
        render_child(out, child);
    }
}

fn render_child(out: &mut String, c: &ChildSaReport) {
    let _ = writeln!(
        out,
        "    CHILD_SA {}, installed {} ago{}",
        c.proposal,
        format_age(c.installed_secs),
        if c.per_resource { ", per-resource" } else { "" }
    );
    let _ = writeln!(out, "      local  {}", c.local_ts.join(" "));
    let _ = writeln!(out, "      remote {}", c.remote_ts.join(" "));
    let w = [c.bytes_in, c.bytes_out]
        .iter()
        .map(|n| n.to_string().len())
        .max()
        .unwrap_or(1)
        .max(5);
    let p = [c.packets_in, c.packets_out]
        .iter()
        .map(|n| n.to_string().len())
        .max()
        .unwrap_or(1)
        .max(7);
    let _ = writeln!(
        out,
        "      RX: {:<8}  {:>w$}  {:>p$}  {:>7}",
        "spi", "bytes", "packets", "dropped"
    );
    let _ = writeln!(
        out,
        "          {:<8}  {:>w$}  {:>p$}  {:>7}",
        c.spi_in, c.bytes_in, c.packets_in, c.drops_in
    );
    if c.reordered_in > 0 {
        let _ = writeln!(
            out,
            "          {} accepted out of order, at most {} behind (window {})",
            c.reordered_in, c.max_reorder_in, c.replay_window
        );
    }
    let _ = writeln!(
        out,
        "      TX: {:<8}  {:>w$}  {:>p$}",
        "spi", "bytes", "packets"
    );
    let _ = writeln!(
        out,
        "          {:<8}  {:>w$}  {:>p$}",
        c.spi_out, c.bytes_out, c.packets_out
    );
}

/// `3d 4h`, `2h 5m`, `5m 20s`, `42s`.
fn format_age(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}d {h}h")
    } else if h > 0 {
        format!("{h}h {m}m")
    } else if m > 0 {
        format!("{m}m {s}s")
    } else {
        format!("{s}s")
    }
}
