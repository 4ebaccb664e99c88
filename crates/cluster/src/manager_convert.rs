//! The shell's protobuf and JSON side: the core's [`Directive`]s as the directives nodes
//! receive, and its [`Status`] as `protego ctl nodes` prints it.

use crate::core::{Directive, DispatchStatus, NodeEntry, Status, SteerNodes, VniSelectors};
use ike::ChildSaInfo;
use rpc::pb;
use std::collections::BTreeMap;
use tracing::{debug, warn};

/// `directive` as the protobuf directive for node `name`, and the shares it should carry but
/// cannot express (not confirmed by its answer); None if nothing of it can be sent.
/// `install` is the CHILD_SA an install directive stands for.
pub(super) fn to_pb(
    directive: &Directive,
    config: &pb::DataConfig,
    install: Option<&ChildSaInfo>,
    name: &str,
) -> Option<(pb::directive::Op, Vec<steer::TunnelId>)> {
    use pb::directive::Op;
    let op = match directive {
        Directive::DataConfig => Op::DataConfig(config.clone()),
        Directive::SetAttachments(a) => Op::SetAttachments(rpc::convert::attachments_to_pb(a)),
        Directive::SetDispatch(d) => Op::SetDispatch(rpc::convert::dispatch_to_pb(d)),
        Directive::SetCeMac { attachment, mac } => {
            Op::SetCeMac(rpc::convert::ce_mac_to_pb(attachment, *mac))
        }
        Directive::SetPortTag(key, entry) => {
            Op::SetPortTag(rpc::convert::port_tag_to_pb(*key, *entry))
        }
        Directive::RemovePortTag(key) => {
            Op::RemovePortTag(rpc::convert::remove_port_tag_to_pb(*key))
        }
        Directive::Relays(steer) => Op::SetRelays(pb::Relays {
            steer: steer.iter().map(ToString::to_string).collect(),
        }),
        Directive::InstallChild { inbound_spi, .. } => {
            let child = install.filter(|c| c.inbound_spi == *inbound_spi)?;
            Op::InstallChild(rpc::convert::child_to_pb(child))
        }
        Directive::RemoveChild {
            tunnel,
            inbound_spi,
            outbound_spi,
        } => Op::RemoveChild(pb::RemoveChild {
            tunnel: tunnel.0,
            inbound_spi: inbound_spi.0,
            outbound_spi: outbound_spi.0,
        }),
        Directive::SetSpi { spi, node, tunnel } => Op::SetSpi(pb::SteerSpi {
            spi: spi.0,
            node: *node,
            tunnel: tunnel.0,
        }),
        Directive::RemoveSpi(spi) => Op::RemoveSpi(pb::RemoveSpi { spi: spi.0 }),
        Directive::SetNodes(n) => Op::SetNodes(nodes_to_pb(n)),
        Directive::SetSelectors(v) => Op::SetSelectors(vni_to_pb(v)),
        Directive::SteerTables(t) => {
            let (limits, unsent) = shares_to_pb(&t.limits, name, true);
            let op = Op::SteerTables(pb::SteerTables {
                nodes: Some(nodes_to_pb(&t.nodes)),
                spis: t
                    .spis
                    .iter()
                    .map(|(spi, node, tunnel)| pb::SteerSpi {
                        spi: spi.0,
                        node: *node,
                        tunnel: tunnel.0,
                    })
                    .collect(),
                vnis: t.vnis.iter().map(vni_to_pb).collect(),
                limits,
                attachments: t
                    .attachments
                    .iter()
                    .map(|(k, e)| rpc::convert::port_tag_to_pb(*k, *e))
                    .collect(),
            });
            return Some((op, unsent));
        }
        Directive::SetShares(shares) => {
            for (tunnel, share) in shares {
                debug!(node = %name, tunnel = tunnel.0, inbound_bps = share.limit.inbound.bits_per_second, outbound_bps = share.limit.outbound.bits_per_second, fallback_bps = share.fallback_bits_per_second, "rate limit share");
            }
            let (limits, unsent) = shares_to_pb(shares, name, false);
            if limits.is_empty() {
                return None;
            }
            return Some((Op::SetRateLimits(pb::RateLimits { limits }), unsent));
        }
        Directive::SetShare(tunnel, share) => {
            debug!(node = %name, tunnel = tunnel.0, inbound_bps = share.limit.inbound.bits_per_second, outbound_bps = share.limit.outbound.bits_per_second, fallback_bps = share.fallback_bits_per_second, "rate limit share");
            let (mut limits, _) = shares_to_pb(&[(*tunnel, *share)], name, false);
            return limits.pop().map(|r| (Op::SetRateLimit(r), Vec::new()));
        }
    };
    Some((op, Vec::new()))
}

/// Shares as rate limits; the tunnels of those not expressible (or, `confirmable`, whose
/// expression does not carry a limit back) come second.
fn shares_to_pb(
    shares: &[(steer::TunnelId, steer::Share)],
    name: &str,
    confirmable: bool,
) -> (Vec<pb::RateLimit>, Vec<steer::TunnelId>) {
    let mut limits = Vec::new();
    let mut unsent = Vec::new();
    for &(tunnel, share) in shares {
        match rpc::convert::share_to_pb(tunnel, Some(share)) {
            Ok(r) => {
                if confirmable && !matches!(rpc::convert::share_from_pb(&r), Ok((_, Some(_)))) {
                    unsent.push(tunnel);
                }
                limits.push(r);
            }
            Err(e) => {
                warn!(node = %name, tunnel = tunnel.0, error = %e, "rate limit share not expressible");
                unsent.push(tunnel);
            }
        }
    }
    (limits, unsent)
}

fn nodes_to_pb(n: &SteerNodes) -> pb::SteerNodes {
    pb::SteerNodes {
        data: n
            .data
            .iter()
            .map(|d| pb::DataNode {
                node: d.node,
                name: d.name.clone(),
                geneve: d.geneve.to_string(),
            })
            .collect(),
        control: n.control.to_string(),
    }
}

/// One VNI's selectors: its attachments' prefixes first (in attachment order), then its
/// tunnels' pairs; a pair the steer nodes cannot express is logged and left out.
fn vni_to_pb(v: &VniSelectors) -> pb::VniSelectors {
    let mut first = Vec::new();
    for r in &v.attachments {
        let (addr, len) = r.prefix;
        let any = if addr.is_ipv4() {
            steer::AddrRange::V4_ANY
        } else {
            steer::AddrRange::V6_ANY
        };
        match steer::AddrRange::prefix(addr, len) {
            Ok(dst) => first.push(rpc::convert::attachment_selector_to_pb(
                &steer::SelectorEntry {
                    selector: steer::Selector::between(any, dst),
                    tunnel: None,
                    node: steer::NodeId(r.node),
                },
                steer::AttachmentId(r.attachment),
            )),
            Err(e) => {
                warn!(attachment = r.attachment, error = %e, "attachment route cannot be steered");
            }
        }
    }
    let mut selectors = Vec::new();
    for s in &v.selectors {
        match rpc::convert::selector_entry(&s.local, &s.remote, s.tunnel, steer::NodeId(s.node)) {
            Ok(e) => selectors.push(rpc::convert::selector_to_pb(&e)),
            Err(e) => {
                warn!(tunnel = s.tunnel.0, error = %e, "traffic selector pair cannot be steered");
            }
        }
    }
    // Deterministic order: steer nodes receive identical tables.
    selectors.sort_by(|a, b| {
        (a.tunnel, &a.dst_start, &a.src_start).cmp(&(b.tunnel, &b.dst_start, &b.src_start))
    });
    first.append(&mut selectors);
    pb::VniSelectors {
        vni: v.vni,
        selectors: first,
        neighbour_nodes: v.neighbour_nodes.clone(),
        gateway_ips: v.gateway_ips.clone(),
    }
}

/// `status` as `protego ctl nodes` prints it (`control`: this control node's name).
pub(super) fn status_json(control: &str, status: &Status) -> serde_json::Value {
    let nodes: Vec<serde_json::Value> = status
        .nodes
        .iter()
        .map(|n| {
            // Each steer node's shares of the tunnels' limits, bit/s each way.
            let shares: serde_json::Map<String, serde_json::Value> = n
                .rate_shares
                .iter()
                .map(|(tunnel, l)| {
                    (
                        tunnel.0.to_string(),
                        serde_json::json!({
                            "inbound_bps": l.limit.inbound.bits_per_second,
                            "outbound_bps": l.limit.outbound.bits_per_second,
                            "fallback_bps": l.fallback_bits_per_second,
                        }),
                    )
                })
                .collect::<BTreeMap<_, _>>()
                .into_iter()
                .collect();
            let children: Vec<String> = n
                .child_sas
                .iter()
                .map(|(spi, out)| format!("{spi}/{out}"))
                .collect();
            serde_json::json!({
                "id": n.id,
                "name": n.name,
                "role": n.role,
                "geneve": n.geneve.to_string(),
                "alive": n.alive,
                "draining": n.draining,
                "parked": n.parked,
                "workers": n.workers,
                "tunnels": n.tunnels,
                "child_sas": children,
                "load": n.load,
                "reports": n.reports,
                "rate_shares": shares,
                "attachments": n.attachments,
                "ports": n.ports.iter().map(|p| serde_json::json!({
                    "id": p.id,
                    "interface": p.interface,
                    "mac": mac_text(p.mac),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let attachments: Vec<serde_json::Value> = status
        .attachments
        .iter()
        .map(|a| {
            // Its frames at the steer node owning its port (zero until that node reports
            // them).
            let t = a.traffic.unwrap_or_default();
            serde_json::json!({
                "name": a.name,
                "steer": a.steer,
                "interface": a.interface,
                "port": a.port,
                "steered": a.port.is_some() && a.node.is_some(),
                "node": a.node,
                "ce_mac": a.ce_mac.map(mac_text),
                "s_tag": a.s_tag,
                "c_tag": a.c_tag,
                "from_ce_frames": t.from_ce_frames,
                "from_ce_bytes": t.from_ce_bytes,
                "to_ce_frames": t.to_ce_frames,
                "to_ce_bytes": t.to_ce_bytes,
                "dropped": t.dropped,
            })
        })
        .collect();
    serde_json::json!({ "control": control, "nodes": nodes, "attachments": attachments })
}

/// A MAC as `02:00:00:00:00:01`.
fn mac_text(mac: [u8; 6]) -> String {
    wire::ethernet::EthernetAddress(mac).to_string()
}

/// Self-dispatch as `protego ctl dispatch show` prints it: the mode and `K`, the ring by
/// name, per node its VTEP, the virtual MACs it owns and its load per VNet (a fraction of the
/// node, from its last report) and whether it confirmed its latest table, and the last moves.
pub(super) fn dispatch_json(
    status: &DispatchStatus,
    nodes: &BTreeMap<u32, NodeEntry>,
) -> serde_json::Value {
    use serde_json::json;
    let name = |id: u32| {
        nodes
            .get(&id)
            .map_or_else(|| format!("#{id}"), |n| n.name.clone())
    };
    let vni_map =
        |m: BTreeMap<u32, serde_json::Value>| -> serde_json::Map<String, serde_json::Value> {
            m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
        };
    let ring: Vec<String> = status.ring.iter().map(|&id| name(id)).collect();
    let node_list: Vec<serde_json::Value> = status
        .ring
        .iter()
        .map(|&id| {
            let owned: BTreeMap<u32, serde_json::Value> = status
                .owned
                .iter()
                .map(|(vni, o)| (*vni, json!(o.get(&id).copied().unwrap_or(0))))
                .collect();
            let loads: BTreeMap<u32, serde_json::Value> = status
                .loads
                .get(&id)
                .map(|l| l.iter().map(|(vni, x)| (*vni, json!(x))).collect())
                .unwrap_or_default();
            let n = nodes.get(&id);
            json!({
                "name": name(id),
                "id": id,
                "vtep": n.and_then(|n| n.vtep).map(|v| v.to_string()),
                "utilization": n.and_then(|n| n.last_report.as_ref()).map(|r| r.utilization),
                "owned": vni_map(owned),
                "loads": vni_map(loads),
                "confirmed": !status.unconfirmed.contains(&id),
            })
        })
        .collect();
    let moves: Vec<serde_json::Value> = status
        .moves
        .iter()
        .rev()
        .map(|(ago, m)| {
            json!({
                "ago_ms": ago.as_millis() as u64,
                "vni": m.vni,
                "from": m.from.map(name),
                "to": name(m.to),
                "vmacs": m.vmacs,
                "why": m.why,
                "loads": m.loads.map(|(a, b)| json!([a, if b.is_finite() { json!(b) } else { json!(null) }])),
            })
        })
        .collect();
    json!({
        "mode": status.mode,
        "vmacs": status.vmacs,
        "ring": ring,
        "nodes": node_list,
        "moves": moves,
    })
}
