//! What each principal is shown: the status report cut down to a tenant's objects, the
//! tenants' summaries, the SAs as one list, the attachments.

use crate::auth::Principal;
use control::status::{StatusReport, TunnelState, TunnelStatus};
use datapath::{AttachmentConfig, AttachmentPort, AttachmentTags, TunnelTraffic};
use serde::Serialize;
use serde_json::{json, Value};

/// The report as `who` may see it: an operator all of it; a tenant its tunnels, filters and
/// CPU, with every node-wide figure empty. Written field by field, so that a field added to
/// the report is hidden from tenants until someone decides otherwise here.
pub(crate) fn status_for(who: &Principal, report: StatusReport) -> StatusReport {
    let Some(tenant) = who.role.tenant() else {
        return report;
    };
    let mine = |t: &str| t == tenant.as_str();
    StatusReport {
        version: report.version,
        uptime_secs: report.uptime_secs,
        tunnels: (report.tunnels.into_iter())
            .filter(|t| mine(t.tenant.as_str()))
            .collect(),
        unmatched_ike_sas: 0,
        drops: Default::default(),
        ike_drops: Default::default(),
        workers: Vec::new(),
        store: None,
        routes: None,
        tenants: (report.tenants.into_iter())
            .filter(|t| mine(t.tenant.as_str()))
            .collect(),
        cpu_unattributed_ns: 0,
        filters: (report.filters.into_iter())
            .filter(|f| mine(&f.tenant))
            .collect(),
        cpu_capped_phases: 0,
        cpu_preempted_ns: 0,
        fair_kernel_drops: None,
        xdp: Vec::new(),
    }
}

/// A tenant at a glance (`GET /api/v1/tenants`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TenantSummary {
    /// The tenant's name.
    pub(crate) name: String,
    /// Its tunnels, by name.
    pub(crate) tunnels: Vec<String>,
    /// How many are up (an established IKE SA).
    pub(crate) tunnels_up: usize,
    /// The sum of its tunnels' traffic.
    pub(crate) traffic: TunnelTraffic,
    /// Its share of the workers' CPU since the start, 0..1 (absent while CPU fairness is off).
    pub(crate) cpu_share: Option<f64>,
    /// Its CPU weight (`cpu_weight`), when CPU fairness reports it.
    pub(crate) cpu_weight: Option<u16>,
    /// Its running filters.
    pub(crate) filters: usize,
}

impl TenantSummary {
    /// A tenant with nothing running.
    pub(crate) fn empty(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            tunnels: Vec::new(),
            tunnels_up: 0,
            traffic: TunnelTraffic::default(),
            cpu_share: None,
            cpu_weight: None,
            filters: 0,
        }
    }
}

/// Whether a tunnel is up: its IKE SA is established (as `protego_tunnel_up`).
pub(crate) fn is_up(t: &TunnelStatus) -> bool {
    t.state == TunnelState::Established
}

/// Every tenant with a tunnel, CPU figures or a filter in `report` (already cut down to what
/// the principal sees), by name.
pub(crate) fn tenants(report: &StatusReport) -> Vec<TenantSummary> {
    let mut by_name: std::collections::BTreeMap<String, TenantSummary> = Default::default();
    let entry = |name: &str, m: &mut std::collections::BTreeMap<String, TenantSummary>| {
        m.entry(name.to_owned())
            .or_insert_with(|| TenantSummary::empty(name))
            .name
            .clone()
    };
    for t in &report.tunnels {
        let name = entry(t.tenant.as_str(), &mut by_name);
        let s = by_name.get_mut(&name).expect("just inserted");
        s.tunnels.push(t.name.clone());
        s.tunnels_up += usize::from(is_up(t));
        s.traffic.add(t.traffic);
    }
    for c in &report.tenants {
        let name = entry(c.tenant.as_str(), &mut by_name);
        let s = by_name.get_mut(&name).expect("just inserted");
        s.cpu_share = Some(c.cpu_share);
        s.cpu_weight = Some(c.cpu_weight);
    }
    for f in &report.filters {
        let name = entry(&f.tenant, &mut by_name);
        by_name.get_mut(&name).expect("just inserted").filters += 1;
    }
    by_name.into_values().collect()
}

/// Every IKE SA of the tunnels, each with its tunnel's name and tenant.
pub(crate) fn sas(tunnels: &[TunnelStatus]) -> Vec<Value> {
    let mut out = Vec::new();
    for t in tunnels {
        for sa in &t.ike_sas {
            let mut v = serde_json::to_value(sa).unwrap_or(Value::Null);
            if let Value::Object(m) = &mut v {
                m.insert("tunnel".into(), json!(t.name));
                m.insert("tenant".into(), json!(t.tenant.as_str()));
            }
            out.push(v);
        }
    }
    out
}

/// An attachment as configured, with what a control node of the distributed form reports of
/// it (`steered`, `node`, `ce_mac`, frames), found by name in `running` (the `attachments` of
/// the `nodes` answer).
pub(crate) fn attachment(a: &AttachmentConfig, running: Option<&Value>) -> Value {
    let (kind, s_tag, c_tag) = match a.tags {
        AttachmentTags::QinQ { s_tag, c_tag } => ("qinq", Some(s_tag), c_tag),
        AttachmentTags::Vlan { c_tag } => ("vlan", None, c_tag),
    };
    let interface = match &a.port {
        AttachmentPort::Interface(i) => Some(i.clone()),
        AttachmentPort::Steer { .. } => None,
    };
    let mut v = json!({
        "name": a.name,
        "tenant": a.tenant.as_str(),
        "vnet": a.vnet,
        "kind": kind,
        "s_tag": s_tag,
        "c_tag": c_tag,
        "interface": interface,
        "gateway_ip": a.gateway_ip.to_string(),
        "ce_ip": a.ce_ip.map(|ip| ip.to_string()),
        "routes": a.routes.iter().map(|(ip, len)| format!("{ip}/{len}")).collect::<Vec<_>>(),
    });
    if let (Some(Value::Object(r)), Value::Object(m)) = (running, &mut v) {
        for key in [
            "steer",
            "interface",
            "steered",
            "node",
            "ce_mac",
            "from_ce_frames",
            "from_ce_bytes",
            "to_ce_frames",
            "to_ce_bytes",
            "dropped",
        ] {
            if let Some(x) = r.get(key) {
                m.insert(key.into(), x.clone());
            }
        }
    }
    v
}
