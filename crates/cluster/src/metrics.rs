//! The cluster's families in a control node's metrics (beside the gateway's, which
//! `control::status::metrics` writes): each registered node's liveness, state and load as the
//! control node sees it (labelled `member`, since `node` names the node being scraped), and
//! the autoscaler's decisions. The data and steer nodes' own families are in
//! [`crate::data_node`] and [`crate::steer_node`].

use crate::capacity::AutoscalerFigures;
use crate::core::{Role, Status};
use metrics::Families;

/// The name of a role in labels.
fn role_name(role: Role) -> &'static str {
    match role {
        Role::Data => "data",
        Role::Steer => "steer",
    }
}

/// Writes the cluster's families.
pub(crate) fn write_cluster(
    out: &mut Families<'_, '_>,
    status: &Status,
    autoscaler: Option<&AutoscalerFigures>,
) -> std::fmt::Result {
    let labels: Vec<[(&str, &str); 2]> = status
        .nodes
        .iter()
        .map(|n| [("member", n.name.as_str()), ("role", role_name(n.role))])
        .collect();
    let per_node = || status.nodes.iter().zip(&labels);
    out.gauge(
        "protego_cluster_node_alive",
        "1 while the registered node has a session with this control node, 0 once it is lost.",
        per_node().map(|(n, l)| (&l[..], u32::from(n.alive))),
    )?;
    out.gauge(
        "protego_cluster_node_draining",
        "1 while the node is being drained (ctl drain).",
        per_node().map(|(n, l)| (&l[..], u32::from(n.draining))),
    )?;
    out.gauge(
        "protego_cluster_node_parked",
        "1 while the autoscaler holds the node in reserve.",
        per_node().map(|(n, l)| (&l[..], u32::from(n.parked))),
    )?;
    out.gauge(
        "protego_cluster_node_utilization",
        "Busy fraction of the node's packet workers over its last report interval (0 to 1).",
        per_node().filter_map(|(n, l)| Some((&l[..], n.load.as_ref()?.utilization))),
    )?;
    out.gauge(
        "protego_cluster_node_tunnels",
        "Tunnels placed on the data node.",
        per_node()
            .filter(|(n, _)| n.role == Role::Data)
            .map(|(n, l)| (&l[..], n.tunnels.len())),
    )?;
    out.gauge(
        "protego_cluster_node_child_sas",
        "CHILD_SAs the data node holds.",
        per_node()
            .filter(|(n, _)| n.role == Role::Data)
            .map(|(n, l)| (&l[..], n.child_sas.len())),
    )?;
    out.counter(
        "protego_cluster_node_reports",
        "Load reports received from the node.",
        per_node().map(|(n, l)| (&l[..], n.reports)),
    )?;
    let Some(a) = autoscaler else {
        return Ok(());
    };
    let decisions: Vec<([(&str, &str); 3], u64)> = a
        .decisions
        .iter()
        .map(|((action, outcome), n)| {
            (
                [("mode", a.mode), ("action", action), ("outcome", outcome)],
                *n,
            )
        })
        .collect();
    out.counter(
        "protego_autoscaler_decisions",
        "The autoscaler's decisions by action (place, migrate, activate, deactivate, start, stop) and outcome (advised, done, skipped); a decision repeated step after step counts once.",
        decisions.iter().map(|(l, n)| (&l[..], *n)),
    )?;
    if let Some((active, reserved, required, hotspots)) = a.last {
        out.gauge(
            "protego_autoscaler_active_nodes",
            "Data nodes active after the autoscaler's last step.",
            [(&[][..], active)],
        )?;
        out.gauge(
            "protego_autoscaler_reserved_nodes",
            "Data nodes held in reserve after the last step.",
            [(&[][..], reserved)],
        )?;
        out.gauge(
            "protego_autoscaler_required_nodes",
            "Data nodes the forecast requires at the last step.",
            [(&[][..], required)],
        )?;
        out.gauge(
            "protego_autoscaler_hotspots",
            "Hotspot nodes left after the last step's plan.",
            [(&[][..], hotspots)],
        )?;
    }
    Ok(())
}

/// Starts a data or steer node's listener if its file has `[metrics]`.
pub(crate) fn serve(
    config: &crate::node_config::NodeConfig,
    source: impl FnOnce() -> std::sync::Arc<dyn metrics::Source>,
) -> Result<Option<metrics::MetricsServer>, metrics::MetricsError> {
    config
        .metrics
        .map(|m| metrics::MetricsServer::start(m.listen, &config.node.name, source()))
        .transpose()
}

/// `[metrics] listen` on a data node: its data plane's figures, and each tunnel's traffic
/// through this node (`protego_node_tunnel_*`; the control node's `protego_tunnel_*` are the
/// cluster's totals).
pub(crate) struct DataNodeMetrics {
    pub(crate) dp: std::sync::Arc<dataplane::Dataplane>,
    pub(crate) started: std::time::Instant,
}

impl metrics::Source for DataNodeMetrics {
    fn collect(&self, out: &mut Families<'_, '_>) -> Result<(), metrics::Collect> {
        use control::status::{FilterStatus, RouteStatus, StatusReport};
        use dataplane::DataPath;
        let now = control::status::metrics::unix_now();
        let stats = self.dp.stats();
        let uptime = self.started.elapsed().as_secs();
        let mut report = StatusReport::node(&ike::IkeStats::default(), &stats, uptime);
        report.routes = RouteStatus::of(&self.dp.route_stats());
        report.filters = (self.dp.filter_report(None).programs.iter())
            .map(FilterStatus::of)
            .collect();
        let bindings = self.dp.tunnel_bindings();
        let names: std::collections::HashMap<ike::TunnelId, &datapath::TunnelBinding> =
            bindings.iter().map(|b| (b.tunnel, b)).collect();
        control::status::metrics::write_build(out, uptime, now)?;
        // The tunnels with CHILD_SAs on this node, now or before.
        control::status::metrics::write_traffic(
            out,
            "protego_node_tunnel",
            stats.tunnels.iter().filter_map(|(t, traffic)| {
                let b = names.get(t)?;
                Some((b.tenant.as_str(), b.name.as_str(), *traffic))
            }),
        )?;
        control::status::metrics::write_dataplane(out, &report)?;
        Ok(())
    }
}

/// An object's labels each way (two labels: its id and `direction`) and its counters.
type Directed<'a, T> = ([(&'a str, &'a str); 2], [(&'a str, &'a str); 2], T);

/// `[metrics] listen` on a steer node: what it forwarded and dropped, its probes of the data
/// nodes (labelled `data_node`, the node's id in `protego ctl nodes`), rate limits and
/// attachments.
pub(crate) struct SteerNodeMetrics {
    pub(crate) node: std::sync::Arc<steernode::SteerNode>,
    pub(crate) started: std::time::Instant,
}

impl metrics::Source for SteerNodeMetrics {
    fn collect(&self, out: &mut Families<'_, '_>) -> Result<(), metrics::Collect> {
        let now = control::status::metrics::unix_now();
        let s = self.node.stats();
        control::status::metrics::write_build(out, self.started.elapsed().as_secs(), now)?;
        let kinds: Vec<([(&str, &str); 1], u64)> = s
            .forwarded
            .iter()
            .map(|(k, n)| ([("kind", k.name())], n))
            .collect();
        out.counter(
            "protego_steer_forwarded",
            "Datagrams and frames the steer node forwarded, by kind.",
            kinds.iter().map(|(l, n)| (&l[..], *n)),
        )?;
        let reasons: Vec<([(&str, &str); 1], u64)> = s
            .dropped
            .iter()
            .map(|(r, n)| ([("reason", r.name())], n))
            .collect();
        out.counter(
            "protego_steer_drops",
            "Datagrams and frames the steer node dropped, by reason.",
            reasons.iter().map(|(l, n)| (&l[..], *n)),
        )?;
        let h = &s.health;
        out.counter(
            "protego_steer_probes",
            "Health probes of the data nodes sent, by why: sampled (every probe_sample-th packet), interval (the node's last probe was probe_interval old), idle (an idle node).",
            [
                (&[("kind", "sampled")][..], h.sampled_probes),
                (&[("kind", "interval")][..], h.interval_probes),
                (&[("kind", "idle")][..], h.idle_probes),
            ],
        )?;
        let ids: Vec<String> = s.nodes.keys().map(|n| n.0.to_string()).collect();
        let labels: Vec<[(&str, &str); 1]> =
            ids.iter().map(|i| [("data_node", i.as_str())]).collect();
        let per_node = || s.nodes.values().zip(&labels);
        out.counter(
            "protego_steer_probe_misses",
            "Probes of each data node that went unanswered within probe_timeout (probe_misses in a row declare it dead).",
            per_node().map(|(n, l)| (&l[..], n.total_misses)),
        )?;
        out.counter(
            "protego_steer_probe_replies",
            "Probe replies accepted from each data node.",
            per_node().map(|(n, l)| (&l[..], n.replies)),
        )?;
        out.gauge(
            "protego_steer_data_node_alive",
            "1 while the steer node's failure detector holds the data node alive.",
            per_node().map(|(n, l)| (&l[..], u32::from(n.alive))),
        )?;
        let tunnel_ids: Vec<String> = s.tunnels.keys().map(|t| t.0.to_string()).collect();
        let rows: Vec<Directed<'_, &steernode::TunnelStats>> = s
            .tunnels
            .values()
            .zip(&tunnel_ids)
            .map(|(t, id)| {
                (
                    [("tunnel_id", id.as_str()), ("direction", "in")],
                    [("tunnel_id", id.as_str()), ("direction", "out")],
                    t,
                )
            })
            .collect();
        out.counter(
            "protego_steer_rate_dropped_packets",
            "Packets the steer node dropped over each tunnel's rate limit (rate_limit_mbit), by tunnel id and direction.",
            (rows.iter().map(|(i, _, t)| (&i[..], t.inbound.dropped_packets)))
                .chain(rows.iter().map(|(_, o, t)| (&o[..], t.outbound.dropped_packets))),
        )?;
        let attachments: Vec<(String, &steernode::AttachmentStats)> = s
            .attachments
            .values()
            .map(|a| (a.attachment.0.to_string(), a))
            .collect();
        let a_rows: Vec<Directed<'_, &steernode::AttachmentStats>> = attachments
            .iter()
            .map(|(id, a)| {
                (
                    [("attachment_id", id.as_str()), ("direction", "from_ce")],
                    [("attachment_id", id.as_str()), ("direction", "to_ce")],
                    *a,
                )
            })
            .collect();
        out.counter(
            "protego_attachment_frames",
            "Frames of each VLAN/Q-in-Q attachment on this steer node's ports, from and to the CE.",
            (a_rows.iter().map(|(f, _, a)| (&f[..], a.from_ce_frames)))
                .chain(a_rows.iter().map(|(_, t, a)| (&t[..], a.to_ce_frames))),
        )?;
        out.counter(
            "protego_attachment_bytes",
            "Bytes (Ethernet frames with their tags) of each attachment, from and to the CE.",
            (a_rows.iter().map(|(f, _, a)| (&f[..], a.from_ce_bytes)))
                .chain(a_rows.iter().map(|(_, t, a)| (&t[..], a.to_ce_bytes))),
        )?;
        Ok(())
    }
}
