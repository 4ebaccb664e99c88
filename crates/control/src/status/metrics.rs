//! The gateway's metrics (`[metrics] listen` of `protego up` and of control nodes): the
//! engine's view of its tunnels ([`GatewayView`]) and the node's report written as Prometheus
//! families, every configured tunnel with a series even while it is down, times as Unix
//! timestamps, counters as `_total` (docs/operations.md, "Metrics", lists them).
//!
//! The tunnels' families are written from the engine's view directly, joined as the status
//! report joins it ([`super::Joined`]) but borrowed: a 10 000-tunnel gateway spent a quarter
//! of a scrape assembling a [`StatusReport`] of owned strings and dropping it again.

use super::{ike_state_name, push_hex, push_ip, push_socket_addr, push_ts, tunnel_state, Joined};
use super::{StatusReport, TunnelDirectory, TunnelEntry, TunnelEvents, TunnelState};
use ike::{ChildSaStatus, IkeSaState, IkeSaStatus, TunnelId};
use metrics::{Families, Histogram, LabelSet};
use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The numeric value of a tunnel state in `protego_tunnel_state`.
fn state_value(state: TunnelState) -> u32 {
    match state {
        TunnelState::Down => 0,
        TunnelState::Connecting => 1,
        TunnelState::Established => 2,
    }
}

/// A gateway's tunnels as its engine holds them at a scrape: the configured tunnels, the
/// control loop's IKE SAs and per-tunnel events, and the data path's counters.
pub struct GatewayView<'a> {
    /// The configured tunnels, in the order their series are written.
    pub directory: &'a TunnelDirectory,
    /// The control loop's IKE SAs.
    pub sas: &'a [IkeSaStatus],
    /// Per tunnel, what happened to it since the control loop started.
    pub events: &'a HashMap<TunnelId, TunnelEvents>,
    /// The data path's counters (its CHILD_SAs' and tunnels').
    pub stats: &'a datapath::DataplaneStats,
}

/// Writes a gateway's families: the tunnels of `view`, and the node-wide ones of `node` (a
/// report of no tunnels, [`StatusReport::node`], with its store, routes and filters set);
/// `now` is the Unix time the view was taken at (ages become timestamps against it).
pub fn write_gateway(
    out: &mut Families<'_, '_>,
    view: &GatewayView<'_>,
    node: &StatusReport,
    now: f64,
) -> std::fmt::Result {
    write_build(out, node.uptime_secs, now)?;
    let sas = write_tunnels(out, view, now)?;
    write_ike_node(out, node, sas)?;
    write_store(out, node)?;
    write_dataplane(out, node)
}

/// `protego_build_info` and `protego_start_time_seconds` (every role).
pub fn write_build(out: &mut Families<'_, '_>, uptime_secs: u64, now: f64) -> std::fmt::Result {
    let version = env!("CARGO_PKG_VERSION");
    out.info(
        "protego_build",
        "The running Protego's version.",
        [&[("version", version)][..]],
    )?;
    out.gauge(
        "protego_start_time_seconds",
        "When the node started, Unix time.",
        [(&[][..], (now - uptime_secs as f64).floor())],
    )
}

/// One configured tunnel at a scrape.
struct Row<'a> {
    entry: &'a TunnelEntry,
    /// Its IKE SAs, established first, then oldest first.
    sas: &'a [&'a IkeSaStatus],
    state: TunnelState,
    events: &'a TunnelEvents,
}

impl Row<'_> {
    /// The IKE SA in use (absent while none is established).
    fn current(&self) -> Option<&IkeSaStatus> {
        // The state is the first SA's (`tunnel_state`): established means it is in use.
        (self.state == TunnelState::Established)
            .then(|| self.sas.first().copied())
            .flatten()
    }
}

/// A tunnel's events before the control loop reported any.
static NO_EVENTS: TunnelEvents = TunnelEvents {
    ike_established: 0,
    ike_rekeys: 0,
    child_installed: 0,
    child_rekeys: 0,
    dpd_answered: 0,
    ike_deleted: BTreeMap::new(),
};

/// Label values written for a scrape (addresses, SPIs, selectors) in one buffer, instead of a
/// string each: [`Texts::push`] appends one and gives its index, [`Texts::get`] reads it.
#[derive(Default)]
struct Texts {
    buf: String,
    ends: Vec<usize>,
}

impl Texts {
    fn push(&mut self, write: impl FnOnce(&mut String)) -> usize {
        write(&mut self.buf);
        self.ends.push(self.buf.len());
        self.ends.len() - 1
    }

    fn get(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.buf[start..self.ends[i]]
    }
}

/// Appends `items`, each written by `push`, separated by commas.
fn push_list<T>(out: &mut String, items: &[T], push: impl Fn(&mut String, &T)) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push(out, item);
    }
}

/// IKE SAs in all, and those being negotiated (the unmatched ones included).
#[derive(Clone, Copy)]
struct SaCounts {
    all: usize,
    half_open: usize,
}

/// Per-tunnel, per-IKE SA and per-CHILD_SA families.
fn write_tunnels(
    out: &mut Families<'_, '_>,
    view: &GatewayView<'_>,
    now: f64,
) -> Result<SaCounts, std::fmt::Error> {
    let joined = Joined::new(view.directory, view.sas, view.stats);
    let rows: Vec<Row<'_>> = (view.directory.0.iter())
        .map(|entry| {
            let sas = joined.sas(entry.id);
            Row {
                entry,
                sas,
                state: tunnel_state(sas),
                events: view.events.get(&entry.id).unwrap_or(&NO_EVENTS),
            }
        })
        .collect();
    // Every series of a tunnel starts with its tenant and name, escaped once.
    let ids: Vec<LabelSet> = (rows.iter())
        .map(|r| {
            out.label_set(&[
                ("tenant", r.entry.tenant.as_str()),
                ("tunnel", &r.entry.name),
            ])
        })
        .collect();
    let per_tunnel = || rows.iter().zip(&ids);
    out.gauge(
        "protego_tunnel_state",
        "State of each configured tunnel: 0 down, 1 connecting, 2 established.",
        per_tunnel().map(|(r, l)| (l, state_value(r.state))),
    )?;
    out.gauge(
        "protego_tunnel_up",
        "1 if the tunnel has an established IKE SA, else 0.",
        per_tunnel().map(|(r, l)| (l, u32::from(r.state == TunnelState::Established))),
    )?;
    let mut remotes = Texts::default();
    for r in &rows {
        remotes.push(|text| push_list(text, &r.entry.remote_addrs, |t, a| push_ip(t, *a)));
    }
    let infos: Vec<[(&str, &str); 6]> = (rows.iter().enumerate())
        .map(|(i, r)| {
            let e = r.entry;
            [
                ("tenant", e.tenant.as_str()),
                ("tunnel", e.name.as_str()),
                ("inside", e.inside.as_str()),
                ("local_id", e.local_id.as_str()),
                ("remote_id", e.remote_id.as_str()),
                ("remote_addrs", remotes.get(i)),
            ]
        })
        .collect();
    out.info(
        "protego_tunnel",
        "Each configured tunnel's inside, identities and configured peer addresses.",
        infos.iter().map(|l| &l[..]),
    )?;
    out.gauge(
        "protego_tunnel_ike_sas",
        "IKE SAs of the tunnel (two while one is rekeyed).",
        per_tunnel().map(|(r, l)| (l, r.sas.len())),
    )?;
    out.gauge(
        "protego_tunnel_child_sas",
        "CHILD_SAs of the tunnel.",
        per_tunnel().map(|(r, l)| {
            let n: usize = r.sas.iter().map(|s| s.children.len()).sum();
            (l, n)
        }),
    )?;
    out.gauge(
        "protego_ike_sa_established_timestamp_seconds",
        "When the tunnel's IKE SA in use was established, Unix time (absent while none is).",
        per_tunnel()
            .filter_map(|(r, l)| r.current().map(|s| (l, (now - s.age_secs as f64).floor()))),
    )?;
    out.gauge(
        "protego_ike_sa_rekey_timestamp_seconds",
        "When the tunnel's IKE SA in use is due to be rekeyed, Unix time.",
        per_tunnel().filter_map(|(r, l)| {
            let s = r.current()?;
            Some((l, (now + s.rekey_in_secs? as f64).floor()))
        }),
    )?;
    write_sa_families(out, &rows, &joined, now)?;
    write_tunnel_counters(out, &rows, &joined, &ids)?;
    let connecting = (rows.iter().flat_map(|r| r.sas))
        .filter(|s| s.state == IkeSaState::Connecting)
        .count();
    Ok(SaCounts {
        all: view.sas.len(),
        half_open: connecting + joined.unmatched,
    })
}

/// The per-IKE SA and per-CHILD_SA families (labelled with their SPIs, as strongSwan's
/// exporters label theirs by unique id).
fn write_sa_families(
    out: &mut Families<'_, '_>,
    rows: &[Row<'_>],
    joined: &Joined<'_>,
    now: f64,
) -> std::fmt::Result {
    // Four texts per IKE SA (its SPIs and addresses), then four per CHILD_SA (its SPIs and
    // selectors), in the order the labels below read them.
    let mut texts = Texts::default();
    let all_sas = || rows.iter().flat_map(|r| r.sas.iter().map(move |s| (r, *s)));
    for (_, s) in all_sas() {
        texts.push(|t| push_hex(t, s.ike.initiator.0, 16));
        texts.push(|t| push_hex(t, s.ike.responder.0, 16));
        texts.push(|t| push_socket_addr(t, s.local));
        texts.push(|t| push_socket_addr(t, s.remote));
    }
    let first_child = texts.ends.len();
    for (_, s) in all_sas() {
        for c in &s.children {
            texts.push(|t| push_hex(t, u64::from(c.inbound_spi.0), 8));
            texts.push(|t| push_hex(t, u64::from(c.outbound_spi.0), 8));
            texts.push(|t| push_list(t, &c.local_ts, push_ts));
            texts.push(|t| push_list(t, &c.remote_ts, push_ts));
        }
    }
    let ikes: Vec<[(&str, &str); 9]> = all_sas()
        .enumerate()
        .map(|(i, (r, s))| {
            let text = |k| texts.get(4 * i + k);
            [
                ("tenant", r.entry.tenant.as_str()),
                ("tunnel", r.entry.name.as_str()),
                ("spi_i", text(0)),
                ("spi_r", text(1)),
                ("state", ike_state_name(s.state)),
                ("initiator", if s.initiator { "true" } else { "false" }),
                ("local", text(2)),
                ("remote", text(3)),
                ("proposal", s.proposal.as_str()),
            ]
        })
        .collect();
    out.info(
        "protego_ike_sa",
        "Each IKE SA: SPIs, state, role, addresses and proposal.",
        ikes.iter().map(|l| &l[..]),
    )?;
    drop(ikes);

    let count = (texts.ends.len() - first_child) / 4;
    let mut infos: Vec<[(&str, &str); 7]> = Vec::with_capacity(count);
    let mut keys: Vec<LabelSet> = Vec::with_capacity(count);
    let mut children: Vec<(&ChildSaStatus, Option<&datapath::ChildStats>)> =
        Vec::with_capacity(count);
    for (r, s) in all_sas() {
        for c in &s.children {
            let at = first_child + 4 * children.len();
            let (tenant, tunnel) = (r.entry.tenant.as_str(), r.entry.name.as_str());
            let spi_in = texts.get(at);
            infos.push([
                ("tenant", tenant),
                ("tunnel", tunnel),
                ("spi_in", spi_in),
                ("spi_out", texts.get(at + 1)),
                ("proposal", c.proposal.as_str()),
                ("local_ts", texts.get(at + 2)),
                ("remote_ts", texts.get(at + 3)),
            ]);
            keys.push(out.label_set(&[("tenant", tenant), ("tunnel", tunnel), ("spi_in", spi_in)]));
            children.push((c, joined.child(s, c)));
        }
    }
    out.info(
        "protego_child_sa",
        "Each CHILD_SA: SPIs, proposal and traffic selectors.",
        infos.iter().map(|l| &l[..]),
    )?;
    let per_child = || children.iter().zip(&keys);
    out.gauge(
        "protego_child_sa_established_timestamp_seconds",
        "When the CHILD_SA was installed, Unix time.",
        per_child().map(|((c, _), l)| (l, (now - c.age_secs as f64).floor())),
    )?;
    out.gauge(
        "protego_child_sa_rekey_timestamp_seconds",
        "When the CHILD_SA is due to be rekeyed, Unix time.",
        per_child().filter_map(|((c, _), l)| Some((l, (now + c.rekey_in_secs? as f64).floor()))),
    )?;
    out.gauge(
        "protego_child_sa_expire_timestamp_seconds",
        "When the CHILD_SA expires (its hard lifetime), Unix time.",
        per_child().filter_map(|((c, _), l)| Some((l, (now + c.expire_in_secs? as f64).floor()))),
    )?;
    type Get = fn(&datapath::ChildStats) -> u64;
    let both = |value_in: Get, value_out: Get| {
        let value = |counters: &Option<&datapath::ChildStats>, f: Get| counters.map_or(0, f);
        (per_child().map(move |((_, st), l)| ((l, &IN[..]), value(st, value_in))))
            .chain(per_child().map(move |((_, st), l)| ((l, &OUT[..]), value(st, value_out))))
    };
    out.counter(
        "protego_child_sa_bytes",
        "Inner bytes the CHILD_SA decrypted (in) and encrypted (out).",
        both(|c| c.bytes_in, |c| c.bytes_out),
    )?;
    out.counter(
        "protego_child_sa_packets",
        "Packets the CHILD_SA decrypted (in) and encrypted (out).",
        both(|c| c.packets_in, |c| c.packets_out),
    )
}

/// The `direction` label of inbound and outbound counters.
const IN: [(&str, &str); 1] = [("direction", "in")];
const OUT: [(&str, &str); 1] = [("direction", "out")];

/// The tunnels' cumulative counters: traffic over all their CHILD_SAs and IKE events.
fn write_tunnel_counters(
    out: &mut Families<'_, '_>,
    rows: &[Row<'_>],
    joined: &Joined<'_>,
    ids: &[LabelSet],
) -> std::fmt::Result {
    // Every configured tunnel has its series from the start, zero until traffic flows.
    write_traffic_of(
        out,
        "protego_tunnel",
        ids,
        rows.iter().map(|r| joined.traffic(r.entry.id)),
    )?;
    let per_tunnel = || rows.iter().zip(ids);
    out.counter(
        "protego_ike_sas_established",
        "IKE SAs the tunnel established (rekeys not included).",
        per_tunnel().map(|(r, l)| (l, r.events.ike_established)),
    )?;
    out.counter(
        "protego_ike_sa_rekeys",
        "IKE SAs of the tunnel replaced by a rekey.",
        per_tunnel().map(|(r, l)| (l, r.events.ike_rekeys)),
    )?;
    out.counter(
        "protego_child_sas_installed",
        "CHILD_SAs the tunnel created (rekeys not included).",
        per_tunnel().map(|(r, l)| (l, r.events.child_installed)),
    )?;
    out.counter(
        "protego_child_sa_rekeys",
        "CHILD_SAs of the tunnel replaced by a rekey.",
        per_tunnel().map(|(r, l)| (l, r.events.child_rekeys)),
    )?;
    const ANSWERED: [(&str, &str); 1] = [("result", "answered")];
    const TIMEOUT: [(&str, &str); 1] = [("result", "timeout")];
    out.counter(
        "protego_dpd",
        "Liveness checks (dead peer detection) of the tunnel's IKE SAs by result: answered, or timeout (the IKE SA was deleted).",
        (per_tunnel().map(|(r, l)| ((l, &ANSWERED[..]), r.events.dpd_answered))).chain(
            per_tunnel().map(|(r, l)| {
                let timeouts = r.events.ike_deleted.get("dpd_timeout").copied();
                ((l, &TIMEOUT[..]), timeouts.unwrap_or(0))
            }),
        ),
    )?;
    /// A tunnel's labels, its `reason` label and the count.
    type Deleted<'a> = (&'a LabelSet, [(&'a str, &'a str); 1], u64);
    let deleted: Vec<Deleted<'_>> = per_tunnel()
        .flat_map(|(r, l)| {
            (r.events.ike_deleted.iter())
                .map(move |(reason, n)| (l, [("reason", reason.as_str())], *n))
        })
        .collect();
    out.counter(
        "protego_ike_sa_deleted",
        "IKE SAs of the tunnel deleted, by reason (peer_request, local_request, rekeyed, dpd_timeout, retransmit_limit, expired, auth_failed, negotiation_failed).",
        deleted.iter().map(|(l, reason, n)| ((*l, &reason[..]), *n)),
    )
}

/// Per-tunnel traffic counters of (tenant, tunnel, traffic) rows, as families
/// `PREFIX_bytes`, `PREFIX_packets` and `PREFIX_esp_drops`: `protego_tunnel` for a
/// gateway's totals (a control node's cover the whole cluster), `protego_node_tunnel` for a
/// data node's own part (so that summing a tunnel's series over the nodes never counts
/// twice).
pub fn write_traffic<'r>(
    out: &mut Families<'_, '_>,
    prefix: &str,
    rows: impl Iterator<Item = (&'r str, &'r str, datapath::TunnelTraffic)>,
) -> std::fmt::Result {
    let mut ids = Vec::new();
    let mut traffic = Vec::new();
    for (tenant, tunnel, t) in rows {
        ids.push(out.label_set(&[("tenant", tenant), ("tunnel", tunnel)]));
        traffic.push(t);
    }
    write_traffic_of(out, prefix, &ids, traffic.into_iter())
}

/// [`write_traffic`] of tunnels whose labels are `ids`, in the order of `traffic`.
fn write_traffic_of(
    out: &mut Families<'_, '_>,
    prefix: &str,
    ids: &[LabelSet],
    traffic: impl Iterator<Item = datapath::TunnelTraffic>,
) -> std::fmt::Result {
    let rows: Vec<(&LabelSet, datapath::TunnelTraffic)> = ids.iter().zip(traffic).collect();
    let both = |value_in: fn(&datapath::TunnelTraffic) -> u64,
                value_out: fn(&datapath::TunnelTraffic) -> u64| {
        (rows.iter().map(move |(l, t)| ((*l, &IN[..]), value_in(t)))).chain(
            rows.iter()
                .map(move |(l, t)| ((*l, &OUT[..]), value_out(t))),
        )
    };
    out.counter(
        &format!("{prefix}_bytes"),
        "Inner bytes the tunnel decrypted (in) and encrypted (out), over all its CHILD_SAs.",
        both(|t| t.bytes_in, |t| t.bytes_out),
    )?;
    out.counter(
        &format!("{prefix}_packets"),
        "Packets the tunnel decrypted (in) and encrypted (out), over all its CHILD_SAs.",
        both(|t| t.packets_in, |t| t.packets_out),
    )?;
    out.counter(
        &format!("{prefix}_esp_drops"),
        "Inbound ESP packets the tunnel's CHILD_SAs dropped (replay, integrity, padding).",
        rows.iter().map(|(l, t)| (*l, t.drops_in)),
    )
}

fn reason(r: &str) -> [(&str, &str); 1] {
    [("reason", r)]
}

/// The IKE engine's node-wide families: `node`'s drop counters and the SAs `sas` counted.
fn write_ike_node(
    out: &mut Families<'_, '_>,
    node: &StatusReport,
    sas: SaCounts,
) -> std::fmt::Result {
    let ike_drops: Vec<([(&str, &str); 1], u64)> = node
        .ike_drops
        .iter()
        .map(|(r, n)| (reason(r), *n))
        .collect();
    out.counter(
        "protego_ike_drops",
        "IKE datagrams the engine dropped or refused, by reason.",
        ike_drops.iter().map(|(l, n)| (&l[..], *n)),
    )?;
    out.gauge(
        "protego_ike_sas",
        "IKE SAs the node holds.",
        [(&[][..], sas.all)],
    )?;
    out.gauge(
        "protego_half_open_ike_sas",
        "IKE SAs being negotiated (IKE_SA_INIT or IKE_AUTH not finished), those not yet matched to a tunnel included.",
        [(&[][..], sas.half_open)],
    )?;
    out.counter(
        "protego_ike_cookies_sent",
        "IKE_SA_INIT requests answered with a COOKIE demand (RFC 7296 §2.6) because too many SAs were half-open.",
        [(&[][..], node.ike_drops.get("init_cookie_demanded").copied().unwrap_or(0))],
    )
}

/// The data path's node-wide families: drops, workers, tenants, filters, routes, AF_XDP
/// (also a data node's, from a report built without IKE).
pub fn write_dataplane(out: &mut Families<'_, '_>, report: &StatusReport) -> std::fmt::Result {
    let drops: Vec<([(&str, &str); 1], u64)> =
        report.drops.iter().map(|(r, n)| (reason(r), *n)).collect();
    out.counter(
        "protego_drops",
        "Packets the data path dropped, by reason (docs/operations.md lists the reasons).",
        drops.iter().map(|(l, n)| (&l[..], *n)),
    )?;
    write_workers(out, report)?;
    write_tenants(out, report)?;
    if let Some(r) = &report.routes {
        out.gauge(
            "protego_routes",
            "Per-VM overlay routes held.",
            [(&[][..], r.entries)],
        )?;
        out.gauge(
            "protego_routes_memory_bytes",
            "Memory the per-VM route table holds (both published copies).",
            [(&[][..], r.memory_bytes)],
        )?;
    }
    let xdp: Vec<([(&str, &str); 2], u64)> = report
        .xdp
        .iter()
        .map(|x| {
            (
                [
                    ("interface", x.interface.as_str()),
                    ("attach", x.attach.as_str()),
                ],
                x.frames,
            )
        })
        .collect();
    out.counter(
        "protego_xdp_frames",
        "Frames read from the AF_XDP sockets of each steered interface.",
        xdp.iter().map(|(l, n)| (&l[..], *n)),
    )
}

fn write_workers(out: &mut Families<'_, '_>, report: &StatusReport) -> std::fmt::Result {
    let names: Vec<String> = report
        .workers
        .iter()
        .map(|w| w.worker.to_string())
        .collect();
    let labels: Vec<[(&str, &str); 1]> = names.iter().map(|n| [("worker", n.as_str())]).collect();
    let per_worker = || report.workers.iter().zip(&labels);
    out.counter(
        "protego_worker_packets",
        "Packets each data-path worker processed (both directions, IKE included).",
        per_worker().map(|(w, l)| (&l[..], w.packets)),
    )?;
    out.counter(
        "protego_worker_batches",
        "Batches each data-path worker processed.",
        per_worker().map(|(w, l)| (&l[..], w.batches)),
    )?;
    out.counter(
        "protego_worker_busy_seconds",
        "Time each data-path worker spent processing batches.",
        per_worker().map(|(w, l)| (&l[..], w.busy_ns as f64 / 1e9)),
    )?;
    out.counter(
        "protego_worker_spin_seconds",
        "Time each data-path worker spent polling without finding packets (busy_poll).",
        per_worker().map(|(w, l)| (&l[..], w.spin_ns as f64 / 1e9)),
    )
}

fn write_store(out: &mut Families<'_, '_>, report: &StatusReport) -> std::fmt::Result {
    let Some(store) = &report.store else {
        return Ok(());
    };
    out.counter(
        "protego_store_commits",
        "Successful commits of IKE state to the store.",
        [(&[][..], store.commits)],
    )?;
    out.counter(
        "protego_store_commit_failures",
        "Failed commit attempts (IKE datagrams are held while the store fails).",
        [(&[][..], store.failures)],
    )?;
    out.gauge(
        "protego_store_held_datagrams",
        "IKE datagrams held until their state is committed (non-zero only while the store fails).",
        [(&[][..], store.held)],
    )?;
    let l = &store.commit_latency;
    let bounds = crate::runtime::COMMIT_BUCKETS_US
        .iter()
        .map(|&us| us as f64 / 1e6)
        .chain([f64::INFINITY]);
    let h = Histogram {
        sum: l.sum_us as f64 / 1e6,
        count: l.count(),
        buckets: bounds.zip(l.buckets.iter().copied()).collect(),
    };
    out.histogram(
        "protego_store_commit_duration_seconds",
        "Latency of the store's successful commits.",
        [(&[][..], &h)],
    )
}

fn write_tenants(out: &mut Families<'_, '_>, report: &StatusReport) -> std::fmt::Result {
    let labels: Vec<[(&str, &str); 1]> = report
        .tenants
        .iter()
        .map(|t| [("tenant", t.tenant.as_str())])
        .collect();
    let per_tenant = || report.tenants.iter().zip(&labels);
    out.counter(
        "protego_tenant_cpu_seconds",
        "Data-path CPU time charged to each tenant (cpu_fairness).",
        per_tenant().map(|(t, l)| (&l[..], t.cpu_ns as f64 / 1e9)),
    )?;
    out.counter(
        "protego_tenant_packets",
        "Packets of each tenant the CPU charge counted.",
        per_tenant().map(|(t, l)| (&l[..], t.packets)),
    )?;
    out.counter(
        "protego_tenant_fair_drops",
        "Packets of each tenant dropped for its fair CPU share (cpu_fairness = \"enforce\").",
        per_tenant().map(|(t, l)| (&l[..], t.fair_drops)),
    )?;
    out.gauge(
        "protego_tenant_cpu_weight",
        "Each tenant's cpu_weight.",
        per_tenant().map(|(t, l)| (&l[..], u32::from(t.cpu_weight))),
    )?;
    let filter_labels: Vec<[(&str, &str); 3]> = report
        .filters
        .iter()
        .map(|f| {
            [
                ("tenant", f.tenant.as_str()),
                ("direction", f.direction.as_str()),
                ("section", f.section.as_str()),
            ]
        })
        .collect();
    let results: Vec<([(&str, &str); 4], u64)> = report
        .filters
        .iter()
        .zip(&filter_labels)
        .flat_map(|(f, l)| {
            [
                ("pass", f.passed),
                ("drop", f.dropped),
                ("tx", f.tx),
                ("aborted", f.aborted),
            ]
            .map(|(r, n)| ([l[0], l[1], l[2], ("result", r)], n))
        })
        .collect();
    out.counter(
        "protego_filter_runs",
        "Runs of each tenant filter by result (pass, drop, tx, aborted).",
        results.iter().map(|(l, n)| (&l[..], *n)),
    )?;
    let per_filter = || report.filters.iter().zip(&filter_labels);
    out.counter(
        "protego_filter_insn_limit",
        "Runs of each tenant filter stopped by the instruction meter (counted in aborted too).",
        per_filter().map(|(f, l)| (&l[..], f.insn_limit)),
    )?;
    out.counter(
        "protego_filter_cpu_seconds",
        "CPU time spent in each tenant filter.",
        per_filter().map(|(f, l)| (&l[..], f.cpu_ns as f64 / 1e9)),
    )
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
