//! The data plane's public interface: configuration, the [`DataPath`] trait the control plane
//! drives, and the messages it sends back.

mod filters;

pub use filters::{
    FilterConfig, FilterCounters, FilterDirection, FilterMapAnswer, FilterMapNode, FilterMapOp,
    FilterMapReport, FilterMapSetting, FilterProgramReport, FilterReport,
};

use ids::TenantId;
use ike::{ChildSaInfo, IkeSpis, TunnelId};
use std::net::{IpAddr, SocketAddr};
use wire::EspSpi;

/// A route inside a VNet: destinations in `prefix`/`len` live behind the host VTEP `host`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Network address.
    pub prefix: IpAddr,
    /// Prefix length in bits.
    pub len: u8,
    /// Underlay address of the host's VTEP.
    pub host: IpAddr,
}

/// A tenant's virtual network reached over VXLAN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VnetConfig {
    /// Owning tenant.
    pub tenant: TenantId,
    /// VNet name (unique per tenant).
    pub name: String,
    /// VXLAN network identifier (24 bits).
    pub vni: u32,
    /// The gateway's own addresses inside the VNet (VMs route via them; answered to ARP/ND):
    /// one IPv4 address, one IPv6 address, or one of each for a dual-stack VNet.
    pub gateway_ips: Vec<IpAddr>,
    /// Local underlay address the gateway's VTEP uses for this VNet (UDP 4789).
    pub vtep: IpAddr,
    /// Where VNet destinations live.
    pub routes: Vec<Route>,
    /// The MAC the VNet's hosts route inner packets at (`router_mac`, as the Router's MAC of
    /// an EVPN VTEP): set, every packet into the VNet leaves with it as the inner destination
    /// and no VM's MAC is resolved, however many VMs the VNet has; unset, each VM's MAC is
    /// resolved with ARP or neighbour discovery through its host.
    pub router_mac: Option<[u8; 6]>,
}

/// Where a tunnel's decrypted traffic goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inside {
    /// Into a VNet over VXLAN (index into [`DataplaneConfig::vnets`], or into the VNets last
    /// given to [`DataPath::set_inside`]).
    Vnet(usize),
    /// Into the node's TUN device and the kernel's routing table.
    Tun,
}

/// Binds a configured tunnel to its tenant and inside interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelBinding {
    /// The tunnel.
    pub tunnel: TunnelId,
    /// Its name, for stats.
    pub name: String,
    /// Its tenant.
    pub tenant: TenantId,
    /// Where its traffic goes.
    pub inside: Inside,
}

/// Relay mode (docs/architecture.md, "The picture"): the node sits behind steer nodes that own the public
/// addresses (VIPs). The steer nodes forward ESP-in-UDP from peers and VXLAN from cloud hosts
/// inside Geneve (RFC 8926) frames whose payload is the whole original IP/UDP datagram
/// (`wire::relay`); the data plane sends its encrypted output back to a steer node in the same
/// form (inner source = the CHILD_SA's local address, the VIP; inner destination = the peer),
/// and the steer node sends the UDP payload out from the VIP. VXLAN toward hosts leaves the
/// node directly from its VTEP address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayConfig {
    /// The node's Geneve address (UDP, port usually 6081; 0 lets the kernel pick one).
    pub listen: SocketAddr,
    /// The node's underlay address VXLAN toward hosts leaves from (a VTEP socket set is opened
    /// on it at start; VNets given later must use it or another starting VNet's VTEP). None:
    /// the IP address of `listen`.
    pub vtep: Option<IpAddr>,
    /// The steer nodes' Geneve addresses, in order of preference: frames from any other
    /// source are dropped (`relay_unknown_sender`), and encrypted output goes to the first
    /// that sent a valid frame (traffic or health probe) within the last 50 ms, or to the
    /// first when none did (empty: dropped, `relay_no_steer`). Replaced at run time with
    /// [`DataPath::set_relays`].
    pub steer: Vec<SocketAddr>,
}

/// Self-dispatch on the VNet side (issue 19 §1; the clustering paper's Algorithms 1–4 over
/// VXLAN, docs/architecture.md "Self-dispatch"): the hosts' kernel VXLAN devices flood to
/// every data node's VTEP and learn where each MAC lives, and each VNet's `vmacs` virtual MACs
/// (`dispatch::VmacSpace`) are split among the data nodes. A VM whose MAC is `m` is told, by
/// the only node that answers its ARP or ND request for the gateway, that the gateway is the
/// virtual MAC `h(m)`; the owner of `h(m)` then processes what the VM sends. With this set
/// the node's VTEPs receive VXLAN themselves, also in relay mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatchConfig {
    /// `K`, the virtual MACs of every dispatched VNet (1..=65536).
    pub vmacs: u32,
    /// Algorithm 3: how often an owner sends each host of the VNet a frame from each of its
    /// virtual MACs, so that the hosts' learnt entries never age out (the kernel's default
    /// ageing is 300 s). Virtual MACs a node gains are announced at once.
    pub announce_interval: std::time::Duration,
    /// A node sends on to their new owner the frames still arriving for virtual MACs it no
    /// longer owns until this long has passed since the hand-over and since the last such
    /// frame (the hosts learn the move from the new owner's announcement; until then they
    /// may still send to the old one). Frames for other nodes' virtual MACs are otherwise
    /// left to their owner, which receives its own copy of what hosts flood.
    pub linger: std::time::Duration,
    /// The dispatched VNets (by VNI) and who owns each of their virtual MACs. A VNet that is
    /// not listed keeps the single gateway MAC.
    pub vnets: Vec<VnetOwners>,
}

/// Who owns each virtual MAC of one VNet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VnetOwners {
    /// The VNet's VNI.
    pub vni: u32,
    /// The data nodes' VTEP addresses (this node's is the VNet's `vtep`).
    pub nodes: Vec<IpAddr>,
    /// Per virtual MAC index (`vmacs` entries): its owner's index in `nodes`.
    pub owners: Vec<u16>,
}

/// The VLAN tags that identify an attachment on its interface (issue 16 §1, the paper's L2
/// "tunnel" between the customer's edge router and the gateway).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttachmentTags {
    /// Q-in-Q: an 802.1ad S-tag (TPID 0x88a8, the customer) outside an 802.1Q C-tag (TPID
    /// 0x8100, the VNet).
    QinQ {
        /// Outer (service) VLAN id, 1..=4094.
        s_tag: u16,
        /// Inner (customer) VLAN id, 1..=4094.
        c_tag: u16,
    },
    /// One 802.1Q C-tag (TPID 0x8100).
    Vlan {
        /// VLAN id, 1..=4094.
        c_tag: u16,
    },
}

/// A customer attached at L2 (`[[attachment]]`): frames with `tags` on `interface` belong to
/// VNet `vnet` of `tenant`. The gateway is the customer edge router's (CE's) next hop there:
/// it answers ARP/ND for `gateway_ip` on the segment and sends toward the CE what the VNet
/// routes to `routes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachmentConfig {
    /// Name (unique), for logs and stats.
    pub name: String,
    /// Owning tenant.
    pub tenant: TenantId,
    /// The tenant's VNet (by name, so that a VNet list replaced at run time keeps it).
    pub vnet: String,
    /// Where the CE's frames come from and go to.
    pub port: AttachmentPort,
    /// The tag pair (or single tag) of the attachment on its port.
    pub tags: AttachmentTags,
    /// The gateway's address on the segment (answered to ARP, or ND for IPv6).
    pub gateway_ip: IpAddr,
    /// The CE's address on the segment, if known: only it teaches the CE's MAC, and the
    /// gateway asks for it (ARP/ND) when it must send before the CE spoke.
    pub ce_ip: Option<IpAddr>,
    /// Prefixes behind the CE (its segment address included): the sources the CE may send
    /// from, and the destinations VNet traffic is sent to the CE for.
    pub routes: Vec<(IpAddr, u8)>,
    /// The CE's MAC if already known (the distributed form: learned by another data node and
    /// passed on by the control node, see [`ToControl::CeLearned`]); None: learned from the
    /// CE's frames or asked for.
    pub ce_mac: Option<[u8; 6]>,
}

/// Where an attachment's frames come from and go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachmentPort {
    /// A local network interface, opened with an AF_PACKET ring at start (the embedded form).
    Interface(String),
    /// A steer node's customer-facing port (the distributed form, relay mode): the steer node
    /// sends the port's tagged frames inside Geneve with the port option, and takes the frames
    /// toward the CE the same way.
    Steer {
        /// The steer node's Geneve address.
        geneve: SocketAddr,
        /// The port's id on that steer node (the Geneve port option).
        port: u32,
        /// The port's MAC: the gateway's MAC on the customer's segment.
        mac: [u8; 6],
    },
}

impl std::fmt::Display for AttachmentPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Interface(name) => f.write_str(name),
            Self::Steer { geneve, port, .. } => write!(f, "port {port} of steer node {geneve}"),
        }
    }
}

/// The default of [`DataplaneConfig::busy_poll_budget`] (`[gateway] busy_poll_budget`):
/// a quarter of a worker's time.
pub const DEFAULT_BUSY_POLL_BUDGET: u8 = 25;

/// How the data plane receives ESP-in-UDP and VXLAN (`[gateway] xdp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XdpMode {
    /// UDP sockets only (`recvmmsg`).
    #[default]
    Off,
    /// AF_XDP where the interface and kernel allow it (native XDP, else generic), the UDP
    /// sockets elsewhere (said in the log and in `protego status`).
    Auto,
    /// AF_XDP with the program in the driver, or the data plane does not start.
    Native,
    /// AF_XDP with the program in the kernel's generic path, or the data plane does not
    /// start.
    Generic,
}

impl XdpMode {
    /// The configuration's word for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Auto => "auto",
            Self::Native => "native",
            Self::Generic => "generic",
        }
    }

    /// The mode named `s`, if any.
    pub fn from_name(s: &str) -> Option<Self> {
        [Self::Off, Self::Auto, Self::Native, Self::Generic]
            .into_iter()
            .find(|m| m.name() == s)
    }
}

/// Static configuration of the data plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataplaneConfig {
    /// Addresses to bind the IKE and NAT-T sockets on (must be empty in relay mode, where the
    /// steer nodes own the public addresses).
    pub listen: Vec<IpAddr>,
    /// IKE port (500).
    pub ike_port: u16,
    /// NAT-T / ESP-in-UDP port (4500).
    pub natt_port: u16,
    /// VXLAN UDP port (4789).
    pub vxlan_port: u16,
    /// VNets at start (replaceable with [`DataPath::set_inside`]; a VNet's `vtep` must then be
    /// one of the VTEPs opened at start).
    pub vnets: Vec<VnetConfig>,
    /// Tunnels and where their traffic goes at start (replaceable with
    /// [`DataPath::set_inside`]).
    pub tunnels: Vec<TunnelBinding>,
    /// Name of the TUN device for `inside = "tun"` tunnels (created if missing).
    pub tun_name: Option<String>,
    /// Datagrams per recvmmsg/sendmmsg batch (1..=1024; at most 64 receive slots are kept
    /// per worker, each holding a UDP GRO train of up to 64 KiB).
    pub batch: usize,
    /// Worker threads that process packets (0: one per CPU this process may run on).
    pub workers: usize,
    /// CPUs to pin workers to, worker `i` on `cpus[i % len]` (empty: the CPUs this process
    /// may run on).
    pub cpus: Vec<usize>,
    /// Pin each worker to its CPU.
    pub pin_workers: bool,
    /// The longest a worker keeps polling without sleeping after it last found traffic
    /// (zero: sleep as soon as nothing is waiting). It spins for twice the mean gap between
    /// its wake-ups that found traffic, at most this, and not at all when that gap is longer.
    /// Trades CPU for latency and wake-ups.
    pub busy_poll: std::time::Duration,
    /// The most of a worker's time its polls that find nothing may take, percent (1..=100,
    /// counted over every 100 ms; [`DEFAULT_BUSY_POLL_BUDGET`] unless configured).
    pub busy_poll_budget: u8,
    /// Whether datagrams to the NAT-T and VXLAN sockets are steered into AF_XDP sockets by an
    /// XDP program on their interfaces (`[gateway] xdp`).
    pub xdp: XdpMode,
    /// With `cpu_fairness = "enforce"`: have the kernel refuse floods too (a socket filter by
    /// SPI or VNI, while every worker refuses the tenant), before they cost a receive; false
    /// (the configuration's default) leaves every refusal to the workers.
    pub fair_kernel_gate: bool,
    /// Relay mode behind steer nodes (None: the node owns its public addresses).
    pub relay: Option<RelayConfig>,
    /// Self-dispatch of the VNets' traffic among data nodes (None: every VNet answers with
    /// its one gateway MAC; replaceable with [`DataPath::set_dispatch`] once set).
    pub dispatch: Option<DispatchConfig>,
    /// Customers attached at L2 over VLAN / Q-in-Q at start (their VNets are found by name
    /// in the current VNets): on local interfaces ([`AttachmentPort::Interface`], fixed at
    /// start), or in relay mode on steer nodes' ports (replaceable with
    /// [`DataPath::set_attachments`]).
    pub attachments: Vec<AttachmentConfig>,
}

/// A received IKE datagram (non-ESP marker removed).
#[derive(Debug, Clone)]
pub struct IkeDatagram {
    /// Local address and port it arrived on.
    pub local: SocketAddr,
    /// Sender.
    pub remote: SocketAddr,
    /// The IKE message.
    pub data: Vec<u8>,
}

/// What the data plane sends to the control plane.
#[derive(Debug, Clone)]
pub enum ToControl {
    /// An IKE datagram for the IKE engine.
    Ike(IkeDatagram),
    /// An outbound SA approaches its sequence number limit: rekey the CHILD_SA (inbound SPI).
    RekeyNeeded(EspSpi),
    /// Authenticated ESP (ICV and anti-replay checks passed, the newest sequence number so
    /// far) of the CHILD_SA with this inbound SPI arrived from an outer address other than
    /// the SA's: the peer's NAT rebound. The data path has already moved the CHILD_SAs of that
    /// IKE SA there (so no answer goes to the stale mapping); the control plane moves the IKE
    /// SA. Reported once per new address.
    PeerAddressSeen {
        /// Inbound SPI of the CHILD_SA.
        inbound_spi: EspSpi,
        /// Our address the packet arrived on.
        local: SocketAddr,
        /// Where it came from.
        remote: SocketAddr,
    },
    /// The data path learned the MAC of attachment `attachment`'s CE, or saw it change (the
    /// distributed form passes it to the other data nodes, which may serve the attachment
    /// after a move).
    CeLearned {
        /// The attachment's name.
        attachment: String,
        /// The CE's MAC.
        mac: [u8; 6],
    },
}

/// A CHILD_SA a data path holds, without its keys: what a new control node needs to take
/// over steering it ([`DataPath::installed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledChild {
    /// Tunnel.
    pub tunnel: TunnelId,
    /// The IKE SA that negotiated it.
    pub ike: IkeSpis,
    /// Inbound SPI.
    pub inbound_spi: EspSpi,
    /// Outbound SPI.
    pub outbound_spi: EspSpi,
    /// Our outer address.
    pub local: SocketAddr,
    /// The peer's outer address.
    pub remote: SocketAddr,
    /// Negotiated local selectors.
    pub local_ts: Vec<ike::TrafficSelector>,
    /// Negotiated remote selectors.
    pub remote_ts: Vec<ike::TrafficSelector>,
    /// It carries the tunnel's outbound traffic.
    pub sending: bool,
}

/// A CHILD_SA of a restored IKE SA, as the control loop's restored state describes it (see
/// [`DataPath::reconcile`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownChild {
    /// Tunnel.
    pub tunnel: TunnelId,
    /// The IKE SA that negotiated it.
    pub ike: IkeSpis,
    /// Inbound SPI.
    pub inbound_spi: EspSpi,
    /// Outbound SPI.
    pub outbound_spi: EspSpi,
    /// Negotiated local selectors.
    pub local_ts: Vec<ike::TrafficSelector>,
    /// Negotiated remote selectors.
    pub remote_ts: Vec<ike::TrafficSelector>,
}

impl KnownChild {
    /// True if `held` (what a data path reports) is this CHILD_SA: same SPIs, tunnel and
    /// selectors. The IKE SA is not compared: an IKE SA rekey hands the CHILD_SAs to the new
    /// IKE SA, and the data path keeps the SPIs it was installed with.
    pub fn matches(&self, held: &InstalledChild) -> bool {
        self.inbound_spi == held.inbound_spi
            && self.outbound_spi == held.outbound_spi
            && self.tunnel == held.tunnel
            && self.local_ts == held.local_ts
            && self.remote_ts == held.remote_ts
    }
}

/// Per CHILD_SA counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChildStats {
    /// Tunnel.
    pub tunnel: Option<TunnelId>,
    /// Inbound SPI.
    pub inbound_spi: EspSpi,
    /// Outbound SPI.
    pub outbound_spi: EspSpi,
    /// Bytes decrypted (inner).
    pub bytes_in: u64,
    /// Packets decrypted.
    pub packets_in: u64,
    /// Bytes encrypted (inner).
    pub bytes_out: u64,
    /// Packets encrypted.
    pub packets_out: u64,
    /// Inbound packets dropped (replay, ICV, padding...).
    pub drops_in: u64,
    /// Inbound packets accepted behind a later one (opened out of arrival order by parallel
    /// workers, or reordered by the network).
    pub reordered_in: u64,
    /// The largest distance below the highest accepted sequence number at which an inbound
    /// packet was accepted (always below the replay window).
    pub max_reorder_in: u64,
    /// The inbound SA's anti-replay window, in packets.
    pub replay_window: u32,
}

/// A tunnel's traffic over all its CHILD_SAs, the retired ones included, since the data path
/// started (cumulative: what the metrics' per-tunnel `_total` series show).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TunnelTraffic {
    /// Inner bytes decrypted.
    pub bytes_in: u64,
    /// Packets decrypted.
    pub packets_in: u64,
    /// Inner bytes encrypted.
    pub bytes_out: u64,
    /// Packets encrypted.
    pub packets_out: u64,
    /// Inbound packets its CHILD_SAs dropped (replay, ICV, padding).
    pub drops_in: u64,
}

impl TunnelTraffic {
    /// Adds `other` (another CHILD_SA's counters, or an interval's traffic).
    pub fn add(&mut self, other: TunnelTraffic) {
        self.bytes_in = self.bytes_in.saturating_add(other.bytes_in);
        self.packets_in = self.packets_in.saturating_add(other.packets_in);
        self.bytes_out = self.bytes_out.saturating_add(other.bytes_out);
        self.packets_out = self.packets_out.saturating_add(other.packets_out);
        self.drops_in = self.drops_in.saturating_add(other.drops_in);
    }
}

impl From<&ChildStats> for TunnelTraffic {
    /// One CHILD_SA's traffic.
    fn from(c: &ChildStats) -> Self {
        Self {
            bytes_in: c.bytes_in,
            packets_in: c.packets_in,
            bytes_out: c.bytes_out,
            packets_out: c.packets_out,
            drops_in: c.drops_in,
        }
    }
}

/// Counters of one worker thread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// The CPU it is pinned to (None: not pinned).
    pub cpu: Option<usize>,
    /// Packets it processed (received datagrams and GRO segments, both directions).
    pub packets: u64,
    /// Batches it processed.
    pub batches: u64,
    /// Time it spent receiving and processing batches, in nanoseconds (cumulative; the rest
    /// it waited for input). Utilization over an interval is the difference of two readings
    /// divided by the interval.
    pub busy_ns: u64,
    /// Time it spent polling its inputs without sleeping and finding nothing
    /// (`busy_poll`), in nanoseconds (cumulative): the CPU adaptive polling costs.
    pub spin_ns: u64,
}

/// An interface whose datagrams an XDP program steers into AF_XDP sockets (`[gateway] xdp`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XdpStats {
    /// The interface.
    pub interface: String,
    /// How the program is attached: `native` or `generic`.
    pub attach: String,
    /// The sockets are bound zero-copy (false: copy mode).
    pub zero_copy: bool,
    /// The addresses (and ports) it steers.
    pub addresses: Vec<std::net::SocketAddr>,
    /// Receive queues, each with one AF_XDP socket per address.
    pub queues: usize,
    /// Frames read from its sockets (cumulative).
    pub frames: u64,
}

/// Node-wide counters, including drops by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DataplaneStats {
    /// Per CHILD_SA.
    pub children: Vec<ChildStats>,
    /// Per tunnel: the traffic of its live and retired CHILD_SAs, by tunnel (empty where the
    /// data path does not count per tunnel, e.g. a control node, whose data nodes do).
    pub tunnels: Vec<(TunnelId, TunnelTraffic)>,
    /// Per worker thread.
    pub workers: Vec<WorkerStats>,
    /// Drop counters by reason name (`esp_unknown_spi`, `esp_replay`, `esp_auth`,
    /// `malformed_udp`, `vxlan_no_tunnel`, `relay_malformed`, ...).
    pub drops: Vec<(String, u64)>,
    /// Relay mode: health probes from steer nodes answered (idle control frames and probes
    /// riding on data frames).
    pub relay_probes_answered: u64,
    /// Per tenant: the CPU charged to it (empty while `cpu_fairness` is off and nothing was
    /// ever charged), in tenant name order.
    pub tenants: Vec<TenantStats>,
    /// CPU time the workers spent inside batches on work no tenant is known for (IKE
    /// datagrams, packets dropped before their tenant is known), in nanoseconds, cumulative.
    pub cpu_unattributed_ns: u64,
    /// Phases of a batch that crossed more tenant runs than the charge measures one by one
    /// (the rest of such a phase is one interval split by packet count), cumulative.
    pub cpu_capped_phases: u64,
    /// CPU time taken back from the tenants' charges because their worker was preempted
    /// (not running) while it was charged, in nanoseconds, cumulative (docs/architecture.md,
    /// "CPU charge").
    pub cpu_preempted_ns: u64,
    /// Enforcing with the kernel gate open (`[gateway] cpu_fairness_kernel`): the datagrams
    /// it dropped (also in the tenants' `fair_drops` and the `fair_share` drops); None while
    /// no gate is open.
    pub fair_kernel_drops: Option<u64>,
    /// Self-dispatch's counters (None when it is not configured).
    pub dispatch: Option<DispatchStats>,
    /// The interfaces with AF_XDP input (empty with `xdp = "off"` or where it fell back).
    pub xdp: Vec<XdpStats>,
}

/// What self-dispatch did (cumulative; see [`DispatchConfig`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DispatchStats {
    /// Virtual MACs this node owns now, over all dispatched VNets.
    pub owned: u64,
    /// Frames processed per virtual MAC this node owns, cumulative (kept while the VNet and
    /// `vmacs` stay): (VNI, index, frames), those with any, in VNI and index order. The
    /// ring's measure of each virtual MAC's load.
    pub vmac_packets: Vec<(u32, u16, u64)>,
    /// ARP and ND requests for the gateway answered with one of this node's virtual MACs.
    pub answered: u64,
    /// Requests for the gateway left to the owner of the requester's virtual MAC.
    pub left_to_owner: u64,
    /// Frames to another node's virtual MAC sent on to that node (still arriving after a
    /// move, before the hosts learnt where the virtual MAC went).
    pub forwarded: u64,
    /// Frames the Algorithm 3 announcements sent (one per virtual MAC and host).
    pub announced: u64,
}

/// The CPU fairness mode (`[gateway] cpu_fairness`, issue 18 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuFairness {
    /// Nothing is measured or charged (one branch per packet).
    #[default]
    Off,
    /// Every packet's CPU time is measured and charged to its tenant; nothing is dropped.
    Account,
    /// Charged as with `Account`, and a tenant whose token bucket is empty has its packets
    /// dropped at the earliest point its tenant is known (Algorithm 1 of the offloading
    /// paper).
    Enforce,
}

impl CpuFairness {
    /// The mode as the configuration spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Account => "account",
            Self::Enforce => "enforce",
        }
    }
}

/// What [`DataPath::set_cpu_fairness`] applies.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuFairnessConfig {
    /// The mode.
    pub mode: CpuFairness,
    /// Each tenant's `cpu_weight` (1..=65535); a tenant not listed has weight 1.
    pub weights: Vec<(TenantId, u16)>,
}

/// The CPU charged to one tenant (cumulative since the data plane started).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantStats {
    /// The tenant.
    pub tenant: TenantId,
    /// Its `cpu_weight`.
    pub cpu_weight: u16,
    /// CPU time charged to it, in nanoseconds (cycle counter readings at the calibrated rate).
    pub cpu_ns: u64,
    /// Its packets the charge counted (those whose tenant became known).
    pub packets: u64,
    /// Its packets dropped because its token bucket was empty (`cpu_fairness = "enforce"`).
    pub fair_drops: u64,
    /// Its tokens summed over the workers, in nanoseconds (negative: in debt); None unless
    /// enforcing.
    pub tokens_ns: Option<i64>,
    /// CPU time charged to it over the last [`RECENT_CPU_WINDOW`] (less right after the
    /// start), in nanoseconds.
    pub recent_cpu_ns: u64,
}

/// The window of [`TenantStats::recent_cpu_ns`]: a tenant's share of the CPU *now* (a data
/// plane's cumulative figures are since its start).
pub const RECENT_CPU_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// Errors of the data plane.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// A socket could not be opened or bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The TUN device could not be created or configured.
    #[error("TUN device {name}: {source}")]
    Tun {
        /// Device name.
        name: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A CHILD_SA could not be installed.
    #[error("cannot install CHILD_SA {spi} of tunnel {tunnel:?}: {reason}")]
    Install {
        /// Tunnel.
        tunnel: TunnelId,
        /// Inbound SPI.
        spi: EspSpi,
        /// Why.
        reason: String,
    },
    /// The configuration is invalid (checked whole before anything is opened).
    #[error("invalid data plane configuration {field}: {reason}")]
    Config {
        /// The offending field, e.g. `vnets[1].routes[0].host`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A thread or the shutdown signal could not be created.
    #[error("cannot start the data plane: {source}")]
    Start {
        /// The OS error.
        source: std::io::Error,
    },
    /// The operation is not supported by this data path (or not in its mode).
    #[error("{operation} is not supported by this data path: {reason}")]
    Unsupported {
        /// The operation.
        operation: &'static str,
        /// Why.
        reason: String,
    },
    /// A per-VM route change was refused (see [`DataPath::change_routes`]); nothing changed.
    #[error("{}", route_error_text(*line, *field, reason))]
    Route {
        /// 1-based line of the route file or snapshot at fault, if one is.
        line: Option<usize>,
        /// The field at fault (`tenant`, `vnet`, `address`, `host`), if one is.
        field: Option<&'static str>,
        /// What is wrong.
        reason: String,
    },
    /// The distributed form: data nodes refused what the control node sent them, or did not
    /// answer in time (each node with its reason, by name).
    #[error("{}", nodes_error_text(failures))]
    Nodes {
        /// (node name, why) of each node that failed.
        failures: Vec<(String, String)>,
    },
    /// An operation on a tenant filter's map was refused (see [`DataPath::filter_map`]);
    /// nothing changed.
    #[error("filter map {map}: {reason}")]
    FilterMap {
        /// The map as named in the request.
        map: String,
        /// What is wrong.
        reason: String,
    },
    /// A send failed.
    #[error("send to {to}: {source}")]
    Send {
        /// Destination.
        to: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

/// One per-VM overlay route: the VM at `address` in VNet `vnet` of `tenant` runs on the host
/// whose VTEP is `host` (issue 16 §2). It wins over the VNet's prefix [`Route`]s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmRoute {
    /// The VNet's tenant.
    pub tenant: TenantId,
    /// The VNet's configured name.
    pub vnet: String,
    /// The VM's address.
    pub address: IpAddr,
    /// The underlay address of the VTEP of the host the VM runs on.
    pub host: IpAddr,
}

/// A change of the per-VM overlay routes ([`DataPath::change_routes`]). Each is validated
/// whole before anything applies: a bad line or an unknown VNet changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteChange {
    /// Adds an entry, or points an existing one at a new host (the VM moved).
    Add(VmRoute),
    /// Removes the entry of `address` in VNet `vnet` of `tenant` (the VNet's prefix routes
    /// apply to the address again).
    Del {
        /// The VNet's tenant.
        tenant: TenantId,
        /// The VNet's configured name.
        vnet: String,
        /// The VM's address.
        address: IpAddr,
    },
    /// Adds or replaces every entry of a route file (`tenant,vnet,address,host` CSV or JSON
    /// lines; see `overlay::routes`), all published at once.
    Load(std::sync::Arc<str>),
    /// Adds or replaces the entries of a snapshot written by [`DataPath::write_routes`];
    /// entries of VNets no longer configured are skipped (and counted).
    Restore(std::sync::Arc<[u8]>),
    /// Makes the table the snapshot's entries (written by [`DataPath::write_routes`]): those
    /// it lacks are removed, all published at once (a data node catching up with the control
    /// node's table); entries of VNets no longer configured are skipped (and counted).
    Replace(std::sync::Arc<[u8]>),
}

/// What a [`RouteChange`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteChangeReport {
    /// Entries added.
    pub added: usize,
    /// Entries that existed and now point at another (or the same) host.
    pub replaced: usize,
    /// Entries removed.
    pub removed: usize,
    /// Entries skipped (a restored snapshot's entries of VNets no longer configured).
    pub skipped: usize,
    /// Where a cluster's control node sent a single change (None: a standalone gateway, or a
    /// change that reached no data node as such).
    pub nodes: Option<RouteFanout>,
}

/// How the data nodes took a single route change a cluster's control node sent them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteFanout {
    /// Data nodes that applied it.
    pub applied: usize,
    /// Data nodes that kept it while fetching the snapshot: applied after their restore,
    /// not yet.
    pub fetching: usize,
    /// Data nodes that refused it or did not answer in time: told to fetch the snapshot.
    pub failed: usize,
}

/// The per-VM routes of one VNet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VnetRouteStats {
    /// The VNet's tenant.
    pub tenant: String,
    /// The VNet's name.
    pub vnet: String,
    /// IPv4 entries.
    pub v4: usize,
    /// IPv6 entries.
    pub v6: usize,
}

/// The per-VM route table of a data path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteStats {
    /// Per configured VNet, in configuration order.
    pub vnets: Vec<VnetRouteStats>,
    /// Entries, all VNets.
    pub entries: usize,
    /// Distinct host VTEPs the entries point at.
    pub hosts: usize,
    /// Bytes the table holds, both published copies included.
    pub memory_bytes: usize,
}

/// `data node d1: REASON; data node d2: REASON`.
fn nodes_error_text(failures: &[(String, String)]) -> String {
    let parts: Vec<String> = failures
        .iter()
        .map(|(node, reason)| format!("data node {node}: {reason}"))
        .collect();
    parts.join("; ")
}

/// `line 3, field host: REASON`, `field host: REASON`, `line 3: REASON` or `REASON`.
fn route_error_text(line: Option<usize>, field: Option<&str>, reason: &str) -> String {
    match (line, field) {
        (Some(l), Some(f)) => format!("line {l}, field {f}: {reason}"),
        (Some(l), None) => format!("line {l}: {reason}"),
        (None, Some(f)) => format!("field {f}: {reason}"),
        (None, None) => reason.to_owned(),
    }
}

/// What the control plane needs from a data path, local or remote.
pub trait DataPath: Send + Sync {
    /// Installs a CHILD_SA pair. With `child.replaces`, outbound traffic moves to the new SA at
    /// once and the old inbound SA keeps accepting until [`remove_child`](Self::remove_child).
    fn install_child(&self, child: &ChildSaInfo) -> Result<(), DataplaneError>;
    /// Removes a CHILD_SA pair.
    fn remove_child(&self, tunnel: TunnelId, inbound_spi: EspSpi, outbound_spi: EspSpi);
    /// The peer refused a new CHILD_SA of this tunnel (`no_more`: for good, it answered
    /// TS_MAX_QUEUE, RFC 9611, or NO_ADDITIONAL_SAS): a data path that asks for CHILD_SAs of
    /// its own (one per data node in self-dispatch) counts it as answered, waits before asking
    /// again, and for good stops asking until the tunnel holds fewer than now. The default
    /// ignores it.
    fn child_refused(&self, tunnel: TunnelId, no_more: bool) {
        let _ = (tunnel, no_more);
    }
    /// The peer's outer address changed (NAT rebinding): update every SA of this IKE SA.
    fn update_peer(&self, tunnel: TunnelId, ike: IkeSpis, local: SocketAddr, remote: SocketAddr);
    /// Sends an IKE datagram (the data plane adds the non-ESP marker on the NAT-T port).
    fn send_ike(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
        payload: &[u8],
    ) -> Result<(), DataplaneError>;
    /// Current counters.
    fn stats(&self) -> DataplaneStats;
    /// The live CHILD_SAs (retired ones excluded), oldest first. The default holds none.
    fn installed(&self) -> Vec<InstalledChild> {
        Vec::new()
    }
    /// After the control loop restarted: `known` are the CHILD_SAs of the IKE SAs it restored,
    /// as the restored state says they are. Returns the inbound SPIs of those this data path no
    /// longer holds *as described* (a CHILD_SA held under another tunnel, outbound SPI or other
    /// selectors counts as not held, and is dropped; see [`KnownChild::matches`]), which the control loop rekeys
    /// (their ESP state is gone); the data path may drop what it holds beyond `known`. The
    /// default holds nothing across a restart (`protego up` restarts with its data plane):
    /// every one is returned.
    fn reconcile(&self, known: &[KnownChild]) -> Vec<EspSpi> {
        known.iter().map(|k| k.inbound_spi).collect()
    }
    /// Relay mode: replaces the steer nodes' Geneve addresses at once (accepted senders and,
    /// as in [`RelayConfig::steer`], the destinations of encrypted output, keeping what was
    /// heard from the steer nodes the new list keeps; empty: output is dropped). The default refuses
    /// ([`DataplaneError::Unsupported`]).
    fn set_relays(&self, steer: Vec<SocketAddr>) -> Result<(), DataplaneError> {
        let _ = steer;
        Err(DataplaneError::Unsupported {
            operation: "set_relays",
            reason: "this data path has no relay mode".into(),
        })
    }
    /// Self-dispatch: replaces who owns which virtual MACs (validated whole first; a batch
    /// sees the old or the new table). The default refuses ([`DataplaneError::Unsupported`]).
    fn set_dispatch(&self, dispatch: DispatchConfig) -> Result<(), DataplaneError> {
        let _ = dispatch;
        Err(DataplaneError::Unsupported {
            operation: "set_dispatch",
            reason: "this data path has no self-dispatch".into(),
        })
    }
    /// Checks what [`set_inside`](Self::set_inside) would check, changing nothing (so that a
    /// configuration change can be refused before anything else changes). The default refuses
    /// as `set_inside` does.
    fn check_inside(
        &self,
        vnets: &[VnetConfig],
        tunnels: &[TunnelBinding],
    ) -> Result<(), DataplaneError> {
        let _ = (vnets, tunnels);
        Err(DataplaneError::Unsupported {
            operation: "set_inside",
            reason: "this data path has a fixed inside configuration".into(),
        })
    }
    /// Replaces the VNets and tunnel bindings, validated whole first (errors name the field,
    /// e.g. `vnets[1].vtep`). Installed CHILD_SAs follow their tunnel's new binding; those of
    /// tunnels no longer bound are removed. The default refuses
    /// ([`DataplaneError::Unsupported`]).
    fn set_inside(
        &self,
        vnets: Vec<VnetConfig>,
        tunnels: Vec<TunnelBinding>,
    ) -> Result<(), DataplaneError> {
        let _ = (vnets, tunnels);
        Err(DataplaneError::Unsupported {
            operation: "set_inside",
            reason: "this data path has a fixed inside configuration".into(),
        })
    }
    /// Changes the per-VM overlay routes, validated whole first ([`DataplaneError::Route`]
    /// names the line and field; nothing changes then). Applied while forwarding: a batch
    /// sees the table before or after the change, never a part of it. The default refuses
    /// ([`DataplaneError::Unsupported`]).
    fn change_routes(&self, change: RouteChange) -> Result<RouteChangeReport, DataplaneError> {
        let _ = change;
        Err(DataplaneError::Unsupported {
            operation: "change_routes",
            reason: "this data path has no per-VM routes".into(),
        })
    }
    /// Writes every per-VM route as a compact snapshot that [`RouteChange::Restore`] reads
    /// back; returns the entries written. The default refuses.
    fn write_routes(&self, out: &mut dyn std::io::Write) -> Result<usize, DataplaneError> {
        let _ = out;
        Err(DataplaneError::Unsupported {
            operation: "write_routes",
            reason: "this data path has no per-VM routes".into(),
        })
    }
    /// Relay mode: replaces the attachments on steer nodes' ports, validated whole first
    /// (errors name the field, e.g. `attachments[1].c_tag`); a CE MAC already known for an
    /// attachment of the same name is kept unless the new configuration gives one. The
    /// default refuses ([`DataplaneError::Unsupported`]).
    fn set_attachments(&self, attachments: Vec<AttachmentConfig>) -> Result<(), DataplaneError> {
        let _ = attachments;
        Err(DataplaneError::Unsupported {
            operation: "set_attachments",
            reason: "this data path has a fixed set of attachments".into(),
        })
    }
    /// Sets the MAC of attachment `attachment`'s CE (learned by another data node). The
    /// default refuses ([`DataplaneError::Unsupported`]).
    fn set_ce_mac(&self, attachment: &str, mac: [u8; 6]) -> Result<(), DataplaneError> {
        let _ = (attachment, mac);
        Err(DataplaneError::Unsupported {
            operation: "set_ce_mac",
            reason: "this data path has a fixed set of attachments".into(),
        })
    }
    /// The per-VM route table's size. The default has none.
    fn route_stats(&self) -> RouteStats {
        RouteStats::default()
    }
    /// Sets the CPU fairness mode and the tenants' weights (takes effect at the workers' next
    /// batch). The default accepts only [`CpuFairness::Off`] and refuses the others
    /// ([`DataplaneError::Unsupported`]).
    fn set_cpu_fairness(&self, fairness: &CpuFairnessConfig) -> Result<(), DataplaneError> {
        if fairness.mode == CpuFairness::Off {
            return Ok(());
        }
        Err(DataplaneError::Unsupported {
            operation: "set_cpu_fairness",
            reason: "this data path does not measure CPU per tenant".into(),
        })
    }
    /// Replaces the tenants' eBPF filters ([`FilterConfig`]), each loaded and verified by the
    /// data path first: nothing changes on an error. The default accepts none but an empty
    /// list ([`DataplaneError::Unsupported`]).
    fn set_filters(&self, filters: &[FilterConfig]) -> Result<(), DataplaneError> {
        if filters.is_empty() {
            return Ok(());
        }
        Err(DataplaneError::Unsupported {
            operation: "set_filters",
            reason: "this data path runs no tenant filters".into(),
        })
    }
    /// The running filters of `tenant` (of every tenant: `None`) with their counters and maps.
    /// The default runs none.
    fn filter_report(&self, tenant: Option<&ids::TenantId>) -> FilterReport {
        let _ = tenant;
        FilterReport::default()
    }
    /// Keeps the tenants' map settings ([`FilterMapSetting`]: what `protego ctl filter map
    /// update` wrote, as the store keeps it) to write into the maps of a data plane that
    /// starts the filters later: the distributed form writes them into every data node that
    /// registers, right after its filter set. A data path that starts no other data plane
    /// keeps nothing (the default); the embedded form writes them with
    /// [`filter_map`](Self::filter_map) when it starts.
    fn keep_filter_settings(&self, settings: &[FilterMapSetting]) -> Result<(), DataplaneError> {
        let _ = settings;
        Ok(())
    }
    /// Reads or changes the map `map` of `tenant`'s filters (a map's name, or
    /// `OBJECT:NAME` when two of the tenant's objects declare maps of that name). The default
    /// runs no filters ([`DataplaneError::Unsupported`]).
    fn filter_map(
        &self,
        tenant: &ids::TenantId,
        map: &str,
        op: FilterMapOp,
    ) -> Result<FilterMapAnswer, DataplaneError> {
        let _ = (tenant, map, op);
        Err(DataplaneError::Unsupported {
            operation: "filter_map",
            reason: "this data path runs no tenant filters".into(),
        })
    }
}
