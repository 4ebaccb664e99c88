//! The human-readable summary `protego check` prints for a valid configuration.

use super::{format_duration, Config, TunnelInside};
use crate::status::format_ts;
use ike::{DpdAction, StartAction};
use std::fmt::Write;

impl Config {
    /// A summary of what the configuration sets up: gateway, VNets and one block per tunnel
    /// with its addresses, selectors, proposals and timers. Contains no secrets.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let g = &self.gateway;
        let listen: Vec<String> = g.listen.iter().map(ToString::to_string).collect();
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "gateway: listen {} (IKE port {}, NAT-T port {}), control socket {}",
            listen.join(", "),
            g.ike_port,
            g.natt_port,
            g.control_socket.display()
        );
        if let Some(dir) = &g.key_log {
            let _ = writeln!(out, "  key log (DANGEROUS): {}", dir.display());
        }
        let _ = writeln!(
            out,
            "{} tenant(s), {} vnet(s), {} tunnel(s)",
            self.tenants.len(),
            self.dataplane.vnets.len(),
            self.tunnels.len()
        );
        for v in &self.dataplane.vnets {
            let _ = writeln!(
                out,
                "vnet {} (tenant {}): VNI {}, gateway {}, VTEP {}, {} route(s)",
                v.name,
                v.tenant,
                v.vni,
                v.gateway_ips
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" "),
                v.vtep,
                v.routes.len()
            );
        }
        for a in &self.dataplane.attachments {
            let tags = match a.tags {
                datapath::AttachmentTags::QinQ { s_tag, c_tag } => {
                    format!("Q-in-Q s_tag {s_tag} c_tag {c_tag}")
                }
                datapath::AttachmentTags::Vlan { c_tag } => format!("VLAN {c_tag}"),
            };
            let routes: Vec<String> = a.routes.iter().map(|(p, l)| format!("{p}/{l}")).collect();
            // The distributed form: the interface is a port of a steer node.
            let port = match self
                .cluster
                .as_ref()
                .and_then(|c| c.attachment_steers.get(&a.name))
            {
                Some(steer) => format!("{} of steer node {steer}", a.port),
                None => a.port.to_string(),
            };
            let _ = writeln!(
                out,
                "attachment {} (tenant {}, vnet {}): {port} {tags}, gateway {}, behind the CE {}",
                a.name,
                a.tenant,
                a.vnet,
                a.gateway_ip,
                routes.join(" ")
            );
        }
        for f in &self.filters {
            let _ = writeln!(
                out,
                "filter {} of {} (tenant {}, {}, weight {}): verified, {} bytes",
                f.section,
                f.object_name,
                f.tenant,
                f.direction,
                f.weight,
                f.object.len()
            );
        }
        for t in &self.tunnels {
            let p = &t.peer;
            let inside = match &t.inside {
                TunnelInside::Vnet(n) => format!("vnet {n}"),
                TunnelInside::Tun => "tun".to_owned(),
            };
            let remote = if p.remote_addrs.is_empty() {
                "%any (responder only)".to_owned()
            } else {
                p.remote_addrs
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let start = match p.start_action {
                StartAction::None => "none",
                StartAction::Start => "start",
            };
            let _ = writeln!(
                out,
                "tunnel {} (tenant {}, {inside}): remote {remote}, start_action {start}",
                p.name, t.tenant
            );
            let ts =
                |v: &[ike::TrafficSelector]| v.iter().map(format_ts).collect::<Vec<_>>().join(",");
            let _ = writeln!(
                out,
                "  {} '{}' === {} '{}'",
                ts(&p.local_ts),
                p.local_id,
                ts(&p.remote_ts),
                p.remote_id
            );
            let _ = writeln!(out, "  IKE: {}", t.proposals.join(", "));
            let _ = writeln!(out, "  ESP: {}", t.esp_proposals.join(", "));
            let dpd = match (p.dpd_delay, p.dpd_action) {
                (None, _) => "off".to_owned(),
                (Some(d), DpdAction::Clear) => format!("{} (clear)", format_duration(d)),
                (Some(d), DpdAction::Restart) => format!("{} (restart)", format_duration(d)),
            };
            let _ = writeln!(
                out,
                "  rekey_time {}, over_time {}, child_rekey_time {}, life_time {}, rand_time {}, dpd {dpd}, replay_window {}, resource_sas {}",
                format_duration(p.ike_rekey_time),
                format_duration(p.ike_over_time),
                format_duration(p.child_rekey_time),
                format_duration(p.child_life_time),
                format_duration(p.rand_time),
                p.replay_window,
                p.resource_sas
            );
        }
        out
    }
}
