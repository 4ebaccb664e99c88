//! Status of a running node: the JSON document `protego status` fetches over the control socket
//! ([`StatusReport`]), how it is assembled from the IKE engine's SA table and drop counters and
//! the data plane's counters, and formatting helpers shared with the log lines (swanctl's notation for traffic
//! selectors and identities).

pub mod metrics;
mod render;
mod server;

#[cfg(test)]
mod tests;

pub use render::{render_filters, render_text};
pub use server::{
    apply_answer, distributed_only, error_answer, query, query_status, query_with_timeout,
    read_route_file, route_answer, vm_route, ErrorKind, FilterLoad, Request, RequestHandler,
    Responder, StatusServer, MAX_ROUTE_FILE,
};

use crate::config::{Config, TunnelInside};
use datapath::DataplaneStats;
use ids::TenantId;
use ike::{IkeSaState, IkeSaStatus, IkeStats, TrafficSelector, TunnelId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use wire::EspSpi;

/// Version of the status document; bumped when a field changes meaning.
pub const STATUS_VERSION: u32 = 1;

/// The answer to a `status` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// [`STATUS_VERSION`].
    pub version: u32,
    /// Seconds since the control plane started.
    pub uptime_secs: u64,
    /// Every configured tunnel, in configuration order, up or not.
    pub tunnels: Vec<TunnelStatus>,
    /// IKE SAs not (yet) attributed to a configured tunnel (half-open responder SAs).
    pub unmatched_ike_sas: usize,
    /// Node-wide data plane drop counters by reason.
    pub drops: BTreeMap<String, u64>,
    /// Node-wide counters of IKE datagrams the engine dropped or refused, by reason
    /// ([`ike::IkeDrop`] names; every reason present, zeros included).
    #[serde(default)]
    pub ike_drops: BTreeMap<String, u64>,
    /// The data plane's worker threads, in worker order.
    #[serde(default)]
    pub workers: Vec<WorkerStatus>,
    /// The IKE state store: backend, commits and their latency, failures.
    #[serde(default)]
    pub store: Option<crate::runtime::StoreStats>,
    /// The per-VM overlay routes (absent when the data path has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<RouteStatus>,
    /// The CPU charged per tenant (`[gateway] cpu_fairness`; empty while it is off and
    /// nothing was charged), in tenant name order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<TenantCpuStatus>,
    /// CPU time of the workers' batches no tenant is known for, in nanoseconds (IKE,
    /// packets dropped before their tenant is known).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpu_unattributed_ns: u64,
    /// The tenants' running filters with their counters (issue 18), by tenant, direction
    /// and weight.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<FilterStatus>,
    /// Batch phases whose CPU charge crossed more than 8 tenant runs, so that the rest of the
    /// phase was split among its packets by count (an approximation; docs/architecture.md,
    /// "CPU charge").
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpu_capped_phases: u64,
    /// CPU time taken back from the tenants' charges because their worker was preempted
    /// while it charged them, in nanoseconds (docs/architecture.md, "CPU charge").
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpu_preempted_ns: u64,
    /// Enforcing with the kernel gate open: the tenants' datagrams it dropped before they
    /// reached the workers (counted in `fair_drops` too); absent while no gate is open
    /// (docs/configuration.md, `cpu_fairness_kernel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair_kernel_drops: Option<u64>,
    /// The interfaces whose NAT-T, VXLAN or Geneve datagrams an XDP program steers into
    /// AF_XDP sockets (`[gateway] xdp`; docs/configuration.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xdp: Vec<XdpStatus>,
}

/// An interface with AF_XDP input (`protego status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XdpStatus {
    /// The interface.
    pub interface: String,
    /// `native` (in the driver) or `generic` (in the kernel's generic receive path).
    pub attach: String,
    /// The driver writes frames straight into the sockets' memory; false: the kernel copies
    /// them (copy mode, as on veth).
    pub zero_copy: bool,
    /// The addresses and ports steered.
    pub addresses: Vec<String>,
    /// Receive queues (one AF_XDP socket per address on each).
    pub queues: usize,
    /// Frames read from its sockets.
    pub frames: u64,
}

/// One running tenant filter and what it did since it was loaded (`protego status`,
/// `protego ctl filter show`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterStatus {
    /// The tenant.
    pub tenant: String,
    /// `to_cloud` or `from_cloud`.
    pub direction: String,
    /// The program's section.
    pub section: String,
    /// The object file's name as given.
    pub object: String,
    /// Its order among the tenant's filters of the direction (lower first).
    pub weight: u32,
    /// Its instructions as loaded.
    pub instructions: usize,
    /// Runs that returned `XDP_PASS`.
    pub passed: u64,
    /// Runs that returned `XDP_DROP`.
    pub dropped: u64,
    /// Runs that returned `XDP_TX`.
    pub tx: u64,
    /// Runs that ended `XDP_ABORTED` (of which `insn_limit` by the instruction meter).
    pub aborted: u64,
    /// Runs the instruction meter stopped.
    pub insn_limit: u64,
    /// Instructions the meter charged (each trip around a loop charges the loop's length;
    /// code outside loops is not charged).
    pub metered_insns: u64,
    /// CPU time in the program, in nanoseconds.
    pub cpu_ns: u64,
}

impl FilterStatus {
    /// The status of one program the data path reports.
    pub fn of(p: &datapath::FilterProgramReport) -> Self {
        let c = &p.counters;
        Self {
            tenant: p.tenant.as_str().to_owned(),
            direction: p.direction.to_string(),
            section: p.section.clone(),
            object: p.object_name.clone(),
            weight: p.weight,
            instructions: p.instructions,
            passed: c.passed,
            dropped: c.dropped,
            tx: c.tx,
            aborted: c.aborted,
            insn_limit: c.insn_limit,
            metered_insns: c.metered_insns,
            cpu_ns: c.cpu_ns,
        }
    }
}

/// One map of a tenant's filters (`protego ctl filter show`, `map dump`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterMapStatus {
    /// The map's name as declared.
    pub name: String,
    /// The object file that declares it.
    pub object: String,
    /// `hash`, `array`, `percpu_array` or `lru_hash`.
    pub kind: String,
    /// Key size in bytes.
    pub key_size: u32,
    /// Value size in bytes (one worker's, for a per-CPU map).
    pub value_size: u32,
    /// Most entries.
    pub max_entries: u32,
    /// Entries held (arrays: `max_entries`).
    pub entries: usize,
    /// Values per key: the workers, for a per-CPU map; else 1.
    pub copies: usize,
}

impl FilterMapStatus {
    /// The status of one map the data path reports.
    pub fn of(m: &datapath::FilterMapReport) -> Self {
        Self {
            name: m.name.clone(),
            object: m.object_name.clone(),
            kind: m.kind.clone(),
            key_size: m.key_size,
            value_size: m.value_size,
            max_entries: m.max_entries,
            entries: m.entries,
            copies: m.copies,
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The CPU charged to one tenant since the data plane started (issue 18 §3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantCpuStatus {
    /// The tenant.
    pub tenant: TenantId,
    /// Its `cpu_weight`.
    pub cpu_weight: u16,
    /// CPU time charged to it, in nanoseconds.
    pub cpu_ns: u64,
    /// Its share of all the CPU time charged to tenants, in `[0, 1]` (cumulative).
    pub cpu_share: f64,
    /// CPU time charged to it over the last 10 s (`datapath::RECENT_CPU_WINDOW`; less right
    /// after the start), in nanoseconds.
    #[serde(default)]
    pub recent_cpu_ns: u64,
    /// Its share of the CPU time charged to tenants over the same window, in `[0, 1]`: its
    /// share now.
    #[serde(default)]
    pub recent_cpu_share: f64,
    /// Its packets the charge counted.
    pub packets: u64,
    /// Its packets dropped for its fair share (`cpu_fairness = "enforce"`).
    pub fair_drops: u64,
    /// Its tokens summed over the workers, in nanoseconds (only when enforcing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_ns: Option<i64>,
}

/// The per-VM overlay route table of the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteStatus {
    /// Entries, all VNets.
    pub entries: usize,
    /// Distinct host VTEPs they point at.
    pub hosts: usize,
    /// Bytes the table holds (both published copies).
    pub memory_bytes: usize,
    /// Per configured VNet.
    pub vnets: Vec<VnetRoutes>,
}

/// The per-VM routes of one VNet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VnetRoutes {
    /// Tenant.
    pub tenant: String,
    /// VNet name.
    pub vnet: String,
    /// IPv4 entries.
    pub v4: usize,
    /// IPv6 entries.
    pub v6: usize,
}

impl RouteStatus {
    /// The report of `s`; None when the data path has no VNets and no entries.
    pub fn of(s: &datapath::RouteStats) -> Option<Self> {
        (s.entries > 0 || !s.vnets.is_empty()).then(|| Self {
            entries: s.entries,
            hosts: s.hosts,
            memory_bytes: s.memory_bytes,
            vnets: s
                .vnets
                .iter()
                .map(|v| VnetRoutes {
                    tenant: v.tenant.clone(),
                    vnet: v.vnet.clone(),
                    v4: v.v4,
                    v6: v.v6,
                })
                .collect(),
        })
    }
}

/// Counters of one data plane worker thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// Worker index.
    pub worker: usize,
    /// The CPU it is pinned to (absent when not pinned).
    pub cpu: Option<usize>,
    /// Packets it processed (both directions, IKE included).
    pub packets: u64,
    /// Batches it processed.
    pub batches: u64,
    /// Time it spent processing batches, in nanoseconds.
    #[serde(default)]
    pub busy_ns: u64,
    /// Time it spent polling without sleeping and finding nothing (`busy_poll`), ns.
    #[serde(default)]
    pub spin_ns: u64,
}

/// Summary state of a tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TunnelState {
    /// No IKE SA.
    Down,
    /// An IKE SA is being negotiated.
    Connecting,
    /// An IKE SA is established (possibly being rekeyed).
    Established,
}

impl TunnelState {
    /// The lower-case name used in JSON and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            TunnelState::Down => "down",
            TunnelState::Connecting => "connecting",
            TunnelState::Established => "established",
        }
    }
}

/// One configured tunnel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelStatus {
    /// Name (`[[tunnel]] name`).
    pub name: String,
    /// Tenant.
    pub tenant: TenantId,
    /// `vnet:NAME` or `tun`.
    pub inside: String,
    /// Summary state.
    pub state: TunnelState,
    /// Configured peer addresses (empty: any).
    pub remote_addrs: Vec<IpAddr>,
    /// Our identity, swanctl notation.
    pub local_id: String,
    /// The peer's identity, swanctl notation.
    pub remote_id: String,
    /// Its IKE SAs (two while one is being rekeyed).
    pub ike_sas: Vec<IkeSaReport>,
    /// What happened to it since the control plane started.
    #[serde(default)]
    pub events: TunnelEvents,
    /// Its traffic since the data path started (a control node: since it became active),
    /// over all its CHILD_SAs, the retired ones included; zeros until it carried any.
    #[serde(default)]
    pub traffic: datapath::TunnelTraffic,
}

/// Counters of a tunnel's IKE events since the control plane started (cumulative; the
/// metrics' `_total` series).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelEvents {
    /// IKE SAs established (IKE_AUTH completed; rekeys not included).
    pub ike_established: u64,
    /// IKE SAs replaced by a rekey.
    pub ike_rekeys: u64,
    /// CHILD_SAs created (not by a rekey).
    pub child_installed: u64,
    /// CHILD_SAs replaced by a rekey.
    pub child_rekeys: u64,
    /// Liveness checks (dead peer detection) the peer answered.
    pub dpd_answered: u64,
    /// IKE SAs deleted, by reason (`dpd_timeout`: liveness checks that went unanswered;
    /// `peer_request`, `local_request`, `rekeyed`, `retransmit_limit`, `expired`,
    /// `auth_failed`, `negotiation_failed`).
    pub ike_deleted: BTreeMap<String, u64>,
}

/// One IKE SA.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IkeSaReport {
    /// Initiator's SPI, 16 hex digits.
    pub spi_i: String,
    /// Responder's SPI, 16 hex digits (zeros while half-open).
    pub spi_r: String,
    /// True if this node was the original initiator.
    pub initiator: bool,
    /// `connecting`, `established`, `rekeying` or `deleting`.
    pub state: String,
    /// Our address and port.
    pub local: SocketAddr,
    /// The peer's address and port.
    pub remote: SocketAddr,
    /// Negotiated proposal (empty until negotiated).
    pub proposal: String,
    /// Seconds since it was established.
    pub established_secs: u64,
    /// Seconds until it is rekeyed (absent: no rekey scheduled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rekey_in_secs: Option<u64>,
    /// Its CHILD_SAs.
    pub children: Vec<ChildSaReport>,
}

/// One CHILD_SA pair with its data plane counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildSaReport {
    /// Inbound SPI, 8 hex digits.
    pub spi_in: String,
    /// Outbound SPI, 8 hex digits.
    pub spi_out: String,
    /// Negotiated proposal.
    pub proposal: String,
    /// Local traffic selectors.
    pub local_ts: Vec<String>,
    /// Remote traffic selectors.
    pub remote_ts: Vec<String>,
    /// Seconds since it was installed.
    pub installed_secs: u64,
    /// Seconds until it is rekeyed (absent: no rekey scheduled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rekey_in_secs: Option<u64>,
    /// Seconds until it expires (absent: no hard lifetime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_in_secs: Option<u64>,
    /// Inner bytes decrypted.
    pub bytes_in: u64,
    /// Packets decrypted.
    pub packets_in: u64,
    /// Inner bytes encrypted.
    pub bytes_out: u64,
    /// Packets encrypted.
    pub packets_out: u64,
    /// Inbound packets dropped (replay, ICV, padding).
    pub drops_in: u64,
    /// Inbound packets accepted behind a later one (parallel workers or network reordering).
    #[serde(default)]
    pub reordered_in: u64,
    /// The largest distance below the newest sequence number at which one was accepted.
    #[serde(default)]
    pub max_reorder_in: u64,
    /// The inbound anti-replay window, in packets.
    #[serde(default)]
    pub replay_window: u32,
    /// Negotiated with SA_RESOURCE_INFO: one of the tunnel's per-resource CHILD_SAs (RFC 9611).
    #[serde(default)]
    pub per_resource: bool,
}

/// What the status report needs to know about each configured tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelEntry {
    /// Its id.
    pub id: TunnelId,
    /// Its name.
    pub name: String,
    /// Its tenant.
    pub tenant: TenantId,
    /// `vnet:NAME` or `tun`.
    pub inside: String,
    /// Configured peer addresses.
    pub remote_addrs: Vec<IpAddr>,
    /// Our identity, swanctl notation.
    pub local_id: String,
    /// The peer's identity, swanctl notation.
    pub remote_id: String,
}

/// The configured tunnels, for status reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TunnelDirectory(pub Vec<TunnelEntry>);

impl TunnelDirectory {
    /// The directory of a configuration.
    pub fn from_config(config: &Config) -> Self {
        Self(
            config
                .tunnels
                .iter()
                .map(|t| TunnelEntry {
                    id: t.peer.id,
                    name: t.peer.name.clone(),
                    tenant: t.tenant.clone(),
                    inside: match &t.inside {
                        TunnelInside::Vnet(n) => format!("vnet:{n}"),
                        TunnelInside::Tun => "tun".to_owned(),
                    },
                    remote_addrs: t.peer.remote_addrs.clone(),
                    local_id: t.peer.local_id.to_string(),
                    remote_id: t.peer.remote_id.to_string(),
                })
                .collect(),
        )
    }

    /// The entry of `id`.
    pub fn get(&self, id: TunnelId) -> Option<&TunnelEntry> {
        self.0.iter().find(|e| e.id == id)
    }
}

/// The engine's view joined tunnel by tunnel: each tunnel's IKE SAs in the report's order
/// (established first, then oldest first), the data path's counters of each CHILD_SA and each
/// tunnel's traffic. The status report and the metrics are both written from it, so they
/// agree on every tunnel's state and counters.
pub(crate) struct Joined<'a> {
    by_tunnel: HashMap<TunnelId, Vec<&'a IkeSaStatus>>,
    counters: HashMap<EspSpi, &'a datapath::ChildStats>,
    traffic: HashMap<TunnelId, datapath::TunnelTraffic>,
    /// IKE SAs of no configured tunnel (not yet authenticated, or of a removed tunnel).
    pub(crate) unmatched: usize,
}

impl<'a> Joined<'a> {
    /// Indexes first, so a report costs O(tunnels + SAs), not their product.
    pub(crate) fn new(
        directory: &TunnelDirectory,
        ike_sas: &'a [IkeSaStatus],
        stats: &'a DataplaneStats,
    ) -> Self {
        let mut by_tunnel: HashMap<TunnelId, Vec<&IkeSaStatus>> = HashMap::new();
        for s in ike_sas {
            if let Some(t) = s.tunnel {
                by_tunnel.entry(t).or_default().push(s);
            }
        }
        for sas in by_tunnel.values_mut() {
            sas.sort_by_key(|s| (state_rank(s.state), std::cmp::Reverse(s.age_secs)));
        }
        // A set of the configured tunnels, not `directory.get` per SA (a linear search: with
        // 10 000 tunnels that was 10^8 comparisons per report).
        let configured: std::collections::HashSet<TunnelId> =
            directory.0.iter().map(|e| e.id).collect();
        let unmatched = ike_sas
            .iter()
            .filter(|s| s.tunnel.is_none_or(|t| !configured.contains(&t)))
            .count();
        Joined {
            by_tunnel,
            counters: stats.children.iter().map(|c| (c.inbound_spi, c)).collect(),
            traffic: stats.tunnels.iter().copied().collect(),
            unmatched,
        }
    }

    /// The IKE SAs of tunnel `id`, established first, then oldest first.
    pub(crate) fn sas(&self, id: TunnelId) -> &[&'a IkeSaStatus] {
        self.by_tunnel.get(&id).map_or(&[], Vec::as_slice)
    }

    /// Tunnel `id`'s traffic over all its CHILD_SAs (zeros before any).
    pub(crate) fn traffic(&self, id: TunnelId) -> datapath::TunnelTraffic {
        self.traffic.get(&id).copied().unwrap_or_default()
    }

    /// The data path's counters of CHILD_SA `child` of IKE SA `sa` (none: not installed
    /// there yet, or its SPI counted for another tunnel).
    pub(crate) fn child(
        &self,
        sa: &IkeSaStatus,
        child: &ike::ChildSaStatus,
    ) -> Option<&'a datapath::ChildStats> {
        self.counters
            .get(&child.inbound_spi)
            .copied()
            .filter(|st| st.tunnel.is_none_or(|t| Some(t) == sa.tunnel))
    }
}

/// A tunnel's summary state from its IKE SAs in [`Joined::sas`]'s order.
pub(crate) fn tunnel_state(sas: &[&IkeSaStatus]) -> TunnelState {
    sas.first().map_or(TunnelState::Down, |s| match s.state {
        IkeSaState::Established | IkeSaState::Rekeying => TunnelState::Established,
        IkeSaState::Connecting => TunnelState::Connecting,
        IkeSaState::Deleting => TunnelState::Down,
    })
}

impl StatusReport {
    /// Joins the IKE engine's SA table with the data plane's counters, tunnel by tunnel, and
    /// adds both drop counter maps.
    pub fn build(
        directory: &TunnelDirectory,
        ike_sas: &[IkeSaStatus],
        ike_stats: &IkeStats,
        stats: &DataplaneStats,
        uptime_secs: u64,
    ) -> Self {
        let joined = Joined::new(directory, ike_sas, stats);
        let mut report = Self::node(ike_stats, stats, uptime_secs);
        report.tunnels = directory
            .0
            .iter()
            .map(|entry| {
                let sas = joined.sas(entry.id);
                TunnelStatus {
                    name: entry.name.clone(),
                    tenant: entry.tenant.clone(),
                    inside: entry.inside.clone(),
                    state: tunnel_state(sas),
                    remote_addrs: entry.remote_addrs.clone(),
                    local_id: entry.local_id.clone(),
                    remote_id: entry.remote_id.clone(),
                    ike_sas: sas.iter().map(|s| ike_report(s, &joined)).collect(),
                    events: TunnelEvents::default(),
                    traffic: joined.traffic(entry.id),
                }
            })
            .collect();
        report.unmatched_ike_sas = joined.unmatched;
        report
    }

    /// The node-wide part of a report (drops, workers, tenants, AF_XDP), without tunnels: a
    /// data node's, or what a gateway's metrics take beside their own view of the tunnels.
    pub fn node(ike_stats: &IkeStats, stats: &DataplaneStats, uptime_secs: u64) -> Self {
        let mut drops = BTreeMap::new();
        for (reason, count) in &stats.drops {
            *drops.entry(reason.clone()).or_insert(0) += count;
        }
        let ike_drops = ike_stats
            .iter()
            .map(|(reason, count)| (reason.to_owned(), count))
            .collect();
        let workers = stats
            .workers
            .iter()
            .enumerate()
            .map(|(worker, w)| WorkerStatus {
                worker,
                cpu: w.cpu,
                packets: w.packets,
                batches: w.batches,
                busy_ns: w.busy_ns,
                spin_ns: w.spin_ns,
            })
            .collect();
        let charged: u64 = stats.tenants.iter().map(|t| t.cpu_ns).sum();
        let recent: u64 = stats.tenants.iter().map(|t| t.recent_cpu_ns).sum();
        let share = |part: u64, all: u64| {
            if all == 0 {
                0.0
            } else {
                part as f64 / all as f64
            }
        };
        let tenants = stats
            .tenants
            .iter()
            .map(|t| TenantCpuStatus {
                tenant: t.tenant.clone(),
                cpu_weight: t.cpu_weight,
                cpu_ns: t.cpu_ns,
                cpu_share: share(t.cpu_ns, charged),
                recent_cpu_ns: t.recent_cpu_ns,
                recent_cpu_share: share(t.recent_cpu_ns, recent),
                packets: t.packets,
                fair_drops: t.fair_drops,
                tokens_ns: t.tokens_ns,
            })
            .collect();
        Self {
            version: STATUS_VERSION,
            uptime_secs,
            tunnels: Vec::new(),
            unmatched_ike_sas: 0,
            drops,
            ike_drops,
            workers,
            store: None,
            routes: None,
            filters: Vec::new(),
            tenants,
            cpu_unattributed_ns: stats.cpu_unattributed_ns,
            cpu_capped_phases: stats.cpu_capped_phases,
            cpu_preempted_ns: stats.cpu_preempted_ns,
            fair_kernel_drops: stats.fair_kernel_drops,
            xdp: stats
                .xdp
                .iter()
                .map(|x| XdpStatus {
                    interface: x.interface.clone(),
                    attach: x.attach.clone(),
                    zero_copy: x.zero_copy,
                    addresses: x.addresses.iter().map(ToString::to_string).collect(),
                    queues: x.queues,
                    frames: x.frames,
                })
                .collect(),
        }
    }
}

impl StatusReport {
    /// Fills each tunnel's [`TunnelEvents`] from the control loop's counters (taken, not
    /// copied: they are the report's own copy).
    pub fn set_events(
        &mut self,
        directory: &TunnelDirectory,
        mut events: HashMap<TunnelId, TunnelEvents>,
    ) {
        // `tunnels` is in directory order (see `build`).
        for (t, entry) in self.tunnels.iter_mut().zip(&directory.0) {
            if let Some(e) = events.remove(&entry.id) {
                t.events = e;
            }
        }
    }
}

fn state_rank(state: IkeSaState) -> u8 {
    match state {
        IkeSaState::Established => 0,
        IkeSaState::Rekeying => 1,
        IkeSaState::Connecting => 2,
        IkeSaState::Deleting => 3,
    }
}

/// The lower-case name of an IKE SA state.
pub fn ike_state_name(state: IkeSaState) -> &'static str {
    match state {
        IkeSaState::Connecting => "connecting",
        IkeSaState::Established => "established",
        IkeSaState::Rekeying => "rekeying",
        IkeSaState::Deleting => "deleting",
    }
}

fn ike_report(s: &IkeSaStatus, joined: &Joined<'_>) -> IkeSaReport {
    let children = s
        .children
        .iter()
        .map(|c| {
            let counters = joined.child(s, c);
            let get = |f: fn(&datapath::ChildStats) -> u64| counters.map_or(0, f);
            ChildSaReport {
                spi_in: c.inbound_spi.to_string(),
                spi_out: c.outbound_spi.to_string(),
                proposal: c.proposal.clone(),
                local_ts: c.local_ts.iter().map(format_ts).collect(),
                remote_ts: c.remote_ts.iter().map(format_ts).collect(),
                installed_secs: c.age_secs,
                rekey_in_secs: c.rekey_in_secs,
                expire_in_secs: c.expire_in_secs,
                bytes_in: get(|c| c.bytes_in),
                packets_in: get(|c| c.packets_in),
                bytes_out: get(|c| c.bytes_out),
                packets_out: get(|c| c.packets_out),
                drops_in: get(|c| c.drops_in),
                reordered_in: get(|c| c.reordered_in),
                max_reorder_in: get(|c| c.max_reorder_in),
                replay_window: counters.map_or(0, |c| c.replay_window),
                per_resource: c.per_resource,
            }
        })
        .collect();
    IkeSaReport {
        spi_i: s.ike.initiator.to_string(),
        spi_r: s.ike.responder.to_string(),
        initiator: s.initiator,
        state: ike_state_name(s.state).to_owned(),
        local: s.local,
        remote: s.remote,
        proposal: s.proposal.clone(),
        established_secs: s.age_secs,
        rekey_in_secs: s.rekey_in_secs,
        children,
    }
}

/// A traffic selector in swanctl notation: `10.1.0.0/24`, `10.1.0.1..10.1.0.9`, with a
/// `[proto/port]` suffix when it is narrower than any protocol and port.
pub fn format_ts(ts: &TrafficSelector) -> String {
    let mut out = String::with_capacity(24);
    push_ts(&mut out, ts);
    out
}

/// Appends [`format_ts`]'s text of `ts`.
pub fn push_ts(out: &mut String, ts: &TrafficSelector) {
    push_ip(out, ts.start);
    match prefix_len(ts.start, ts.end) {
        Some(len) => {
            out.push('/');
            push_decimal(out, len);
        }
        None => {
            out.push_str("..");
            push_ip(out, ts.end);
        }
    }
    let any_port = ts.start_port == 0 && ts.end_port == u16::MAX;
    if ts.ip_proto != 0 || !any_port {
        let proto = match ts.ip_proto {
            0 => "any".to_owned(),
            1 => "icmp".to_owned(),
            6 => "tcp".to_owned(),
            17 => "udp".to_owned(),
            58 => "ipv6-icmp".to_owned(),
            132 => "sctp".to_owned(),
            n => n.to_string(),
        };
        if any_port {
            out.push_str(&format!("[{proto}]"));
        } else if ts.start_port == ts.end_port {
            out.push_str(&format!("[{proto}/{}]", ts.start_port));
        } else {
            out.push_str(&format!("[{proto}/{}-{}]", ts.start_port, ts.end_port));
        }
    }
}

/// Appends the low `digits` hex digits of `n` (at most 16), lower case and zero-padded, as
/// the SPIs' `Display` writes them (`{:016x}`, `{:08x}`).
pub fn push_hex(out: &mut String, n: u64, digits: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for i in (0..digits.min(16)).rev() {
        out.push(char::from(HEX[(n >> (4 * i)) as usize & 0xf]));
    }
}

/// Appends `ip` as its `Display` writes it. Reports and scrapes write tens of thousands of
/// addresses, and `Display` of an IPv4 address goes through the formatting machinery for
/// each octet (a tenth of a 10 000-tunnel scrape); IPv6 keeps `Display` (its zero
/// compression is not worth writing twice).
pub fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            for (i, octet) in [a, b, c, d].into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                push_decimal(out, u32::from(octet));
            }
        }
        IpAddr::V6(v6) => {
            use std::fmt::Write as _;
            let _ = write!(out, "{v6}");
        }
    }
}

/// Appends `addr` as its `Display` writes it (`192.0.2.1:4500`, `[2001:db8::1]:4500`).
pub fn push_socket_addr(out: &mut String, addr: std::net::SocketAddr) {
    match addr {
        std::net::SocketAddr::V4(v4) => {
            push_ip(out, IpAddr::V4(*v4.ip()));
            out.push(':');
            push_decimal(out, u32::from(v4.port()));
        }
        std::net::SocketAddr::V6(v6) => {
            use std::fmt::Write as _;
            let _ = write!(out, "{v6}");
        }
    }
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut String, n: u32) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// The prefix length if `start..=end` is exactly one CIDR block.
fn prefix_len(start: IpAddr, end: IpAddr) -> Option<u32> {
    let (s, e, bits) = match (start, end) {
        (IpAddr::V4(s), IpAddr::V4(e)) => (u128::from(u32::from(s)), u128::from(u32::from(e)), 32),
        (IpAddr::V6(s), IpAddr::V6(e)) => (u128::from(s), u128::from(e), 128),
        _ => return None,
    };
    let span = s ^ e;
    // `span` must be all ones in its low bits, and `start` must have those bits clear.
    if e < s || span & span.wrapping_add(1) != 0 || s & span != 0 {
        return None;
    }
    Some(bits - (128 - span.leading_zeros()))
}
