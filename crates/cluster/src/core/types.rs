//! The cluster core's plain types: its view of nodes and CHILD_SAs, its inputs' payloads and
//! its outputs (directives to nodes in domain terms, steering tables, status).

use ike::{IkeSpis, TrafficSelector, TunnelId};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;
use wire::EspSpi;

/// A registered node's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// ESP and VXLAN processing (the paper's GPN).
    Data,
    /// The VIP's packet steering (GIN + GEN).
    Steer,
}

/// What control knows about a tunnel from the configuration.
#[derive(Debug, Clone)]
pub struct TunnelMeta {
    /// Its id.
    pub id: TunnelId,
    /// Its name.
    pub name: String,
    /// Its VNet's VNI (None: TUN inside, which the distributed form does not steer).
    pub vni: Option<u32>,
    /// Its rate limit, Mbit/s.
    pub rate_limit_mbit: Option<u32>,
}

/// What control knows about a customer attachment from the configuration (issue 16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachmentMeta {
    /// Its configuration; `port` is `Interface(name)` of an interface of steer node `steer`.
    pub config: datapath::AttachmentConfig,
    /// The steer node owning the port (`[[attachment]] steer`).
    pub steer: String,
    /// Its VNet's VNI (None: the VNet is not configured, nothing is steered for its routes).
    pub vni: Option<u32>,
}

/// A steer node's customer-facing port, as its Hello announced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// Its id on the steer node.
    pub id: u32,
    /// The interface's name there.
    pub interface: String,
    /// The interface's MAC.
    pub mac: [u8; 6],
}

/// One attachment as the core tracks it.
#[derive(Debug, Clone)]
pub struct AttachmentEntry {
    /// Its id (by name, stable for the core's lifetime; the steer nodes count by it).
    pub id: u32,
    /// What the configuration says.
    pub meta: AttachmentMeta,
    /// The data node serving it: where the steer nodes send the CE's frames and the hosts'
    /// VXLAN for its routes. None while its port is unknown or no data node can take it.
    pub node: Option<u32>,
    /// The CE's MAC, once a data node learned it.
    pub ce_mac: Option<[u8; 6]>,
}

/// One prefix behind an attachment's CE, steered to its serving data node (first in its
/// VNI's selector list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachmentRoute {
    /// The attachment's id.
    pub attachment: u32,
    /// The data node serving it.
    pub node: u32,
    /// The prefix.
    pub prefix: (IpAddr, u8),
}

/// One attachment as `protego ctl nodes` shows it.
#[derive(Debug, Clone)]
pub struct AttachmentStatus {
    /// Its name.
    pub name: String,
    /// The steer node owning its port.
    pub steer: String,
    /// The interface there.
    pub interface: String,
    /// The port's id, once the steer node announced the interface (None: unsteered).
    pub port: Option<u32>,
    /// The serving data node's name.
    pub node: Option<String>,
    /// The CE's MAC, once learned.
    pub ce_mac: Option<[u8; 6]>,
    /// Its outer tag's VLAN id (0: a single 802.1Q tag).
    pub s_tag: u16,
    /// Its (inner) 802.1Q tag's VLAN id.
    pub c_tag: u16,
    /// Its frames and drops at the steer node owning its port (that node's last report;
    /// None before one counted it).
    pub traffic: Option<AttachmentTraffic>,
}

/// One attachment's frames at the steer node owning its port, as the node reported them
/// (cumulative counters since it started, or since whole tables without the attachment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct AttachmentTraffic {
    /// The attachment's id.
    pub attachment: u32,
    /// The port's id on the steer node.
    pub port: u32,
    /// The outer tag's VLAN id (0: a single 802.1Q tag).
    pub s_tag: u16,
    /// The (inner) 802.1Q tag's VLAN id.
    pub c_tag: u16,
    /// Frames from the CE relayed to a data node.
    pub from_ce_frames: u64,
    /// Their bytes, tags included.
    pub from_ce_bytes: u64,
    /// Frames from data nodes handed to the port for the CE.
    pub to_ce_frames: u64,
    /// Their bytes, tags included.
    pub to_ce_bytes: u64,
    /// Frames from the CE the steer node dropped (no live data node, over a tunnel's rate
    /// limit, too large to wrap).
    pub dropped: u64,
}

/// A node's last reported load.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct NodeLoad {
    /// Length of the interval the figures cover, milliseconds.
    pub interval_ms: u32,
    /// Busy fraction of its packet workers.
    pub utilization: f64,
    /// Per tunnel: bytes in and out during the last interval.
    pub tunnel_bytes: BTreeMap<u32, u64>,
    /// Cumulative drop counters by reason.
    pub drops: BTreeMap<String, u64>,
    /// Packets the steer node dropped per tunnel by rate limit (steer reports).
    pub rate_dropped: BTreeMap<u32, u64>,
    /// Per tunnel, what the steer node's limiter admitted and dropped each way during the
    /// interval (steer reports): the demand its share of the tunnel's limit follows.
    #[serde(skip)]
    pub rate_usage: BTreeMap<u32, steer::TunnelUsage>,
    /// Per attachment whose port the node owns (steer reports): its frames and drops.
    pub attachments: Vec<AttachmentTraffic>,
    /// Data nodes in self-dispatch: (VNI, virtual MAC, frames) of each virtual MAC the node
    /// owns, cumulative.
    #[serde(skip)]
    pub vmac_packets: Vec<(u32, u16, u64)>,
    /// Packets of the node's tunnels during the interval, both ways (data nodes): what the
    /// busy share is divided by, so that a virtual MAC is charged its frames' part of it.
    pub packets: u64,
}

/// A node's Hello as the core takes it (checked against its certificate by the shell).
#[derive(Debug, Clone)]
pub struct Hello {
    /// Its name (its certificate's CN).
    pub name: String,
    /// Its role (its certificate's OU).
    pub role: Role,
    /// Where it receives Geneve.
    pub geneve: SocketAddr,
    /// Changes at every process start.
    pub boot_id: u64,
    /// Packet workers.
    pub workers: u32,
    /// The CHILD_SAs it holds (data nodes).
    pub installed: Vec<dataplane::InstalledChild>,
    /// Its customer-facing ports (steer nodes).
    pub ports: Vec<PortInfo>,
    /// Its own VTEP address (data nodes that can take part in self-dispatch).
    pub vtep: Option<std::net::IpAddr>,
}

/// One registered node as the core sees it.
#[derive(Debug, Clone)]
pub struct NodeEntry {
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// Where it receives Geneve.
    pub geneve: SocketAddr,
    /// Its session is open (it can receive directives).
    pub session_open: bool,
    /// Session open and (data nodes) not declared dead by a steer node.
    pub alive: bool,
    /// Being drained: no new CHILD_SAs are placed on it.
    pub draining: bool,
    /// Held in reserve by the autoscaler (inactive): new CHILD_SAs go elsewhere if they can.
    pub parked: bool,
    /// The autoscaler asked the node provider to stop it: nothing is placed on it any more.
    pub leaving: bool,
    /// Its process's boot id.
    pub boot_id: u64,
    /// Its packet workers.
    pub workers: u32,
    /// Its last report.
    pub last_report: Option<NodeLoad>,
    /// Reports received so far (tells the autoscaler a report is new).
    pub reports: u64,
    /// Its own VTEP address (data nodes that can take part in self-dispatch).
    pub vtep: Option<std::net::IpAddr>,
}

/// One installed CHILD_SA.
#[derive(Debug, Clone)]
pub struct ChildEntry {
    /// Its tunnel.
    pub tunnel: TunnelId,
    /// The data node holding it; None while its install is in flight, if it could not be
    /// placed (no live data node), or if its node was lost.
    pub node: Option<u32>,
    /// The node that last held it, while `node` is None (a node declared dead by probes may
    /// come back still holding it: it is told to remove it).
    pub last_node: Option<u32>,
    /// The data node its install was sent to, until the node's answer is fed back
    /// ([`super::ClusterCore::handle_install_answer`], which takes the node from here and
    /// ignores an answer when it is None).
    pub installing: Option<u32>,
    /// Its outbound SPI.
    pub outbound_spi: EspSpi,
    /// Its IKE SA.
    pub ike: IkeSpis,
    /// Install order (the newest remaining SA sends after the sending one is removed).
    pub seq: u64,
    /// This SA carries the tunnel's outbound traffic (steer's selectors point at its node).
    pub sending: bool,
    /// Its local traffic selectors.
    pub local_ts: Vec<TrafficSelector>,
    /// Its remote traffic selectors.
    pub remote_ts: Vec<TrafficSelector>,
}

/// A removed CHILD_SA whose SPI stays steered for the data node's grace.
#[derive(Debug, Clone, Copy)]
pub struct Retiring {
    /// When the steer nodes forget it.
    pub until: Instant,
    /// Its inbound SPI.
    pub spi: EspSpi,
    /// The node it stays steered to.
    pub node: Option<u32>,
    /// Its tunnel.
    pub tunnel: TunnelId,
}

/// Shares sent to a steer node, awaiting its answer.
#[derive(Debug, Clone)]
pub struct ShareAck {
    /// The steer node.
    pub node: u32,
    /// What the answer confirms.
    pub shares: Vec<(steer::TunnelId, steer::Share)>,
    /// The answer's token ([`Await::Shares`], [`Await::Resync`]).
    pub token: u64,
}

/// One selector pair of a tunnel's sending CHILD_SA, steered to its data node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SteeredSelector {
    /// The tunnel.
    pub tunnel: TunnelId,
    /// The data node holding its sending CHILD_SA.
    pub node: u32,
    /// The local selector.
    pub local: TrafficSelector,
    /// The remote selector.
    pub remote: TrafficSelector,
}

/// The selectors of one VNI at the steer nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VniSelectors {
    /// The VNI.
    pub vni: u32,
    /// The prefixes behind the CEs of the VNI's steered attachments: first in the list (the
    /// data node, too, sends to a CE before it looks at the tunnels).
    pub attachments: Vec<AttachmentRoute>,
    /// Every selector pair of its tunnels' sending CHILD_SAs.
    pub selectors: Vec<SteeredSelector>,
    /// The live data nodes (neighbour discovery goes to them).
    pub neighbour_nodes: Vec<u32>,
    /// The VNI's gateway addresses.
    pub gateway_ips: Vec<String>,
}

/// A data node the steer nodes forward to and probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SteerTarget {
    /// Its id.
    pub node: u32,
    /// Its name.
    pub name: String,
    /// Where it receives Geneve.
    pub geneve: SocketAddr,
}

/// The data nodes the steer nodes know, and where control receives IKE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SteerNodes {
    /// Every data node with an open session.
    pub data: Vec<SteerTarget>,
    /// This control node's Geneve address.
    pub control: SocketAddr,
}

/// A steer node's whole steering state.
#[derive(Debug, Clone)]
pub struct SteerTables {
    /// The data nodes.
    pub nodes: SteerNodes,
    /// Every inbound SPI (installed and retiring) and the node it goes to, by SPI.
    pub spis: Vec<(EspSpi, u32, TunnelId)>,
    /// Every VNI's selectors.
    pub vnis: Vec<VniSelectors>,
    /// The node's shares of the tunnels' limits.
    pub limits: Vec<(steer::TunnelId, steer::Share)>,
    /// The steered attachments on the node's own ports.
    pub attachments: Vec<(steer::PortKey, steer::AttachEntry)>,
}

/// A directive to a node, in the core's terms (the shell turns it into protobuf).
#[derive(Debug, Clone)]
pub enum Directive {
    /// Data node: the current inside configuration (VNets and bindings).
    DataConfig,
    /// Data node: the steer nodes' Geneve addresses, live ones first.
    Relays(Vec<SocketAddr>),
    /// Data node: install the CHILD_SA whose install the shell is carrying out.
    InstallChild {
        /// Its tunnel.
        tunnel: TunnelId,
        /// Its inbound SPI.
        inbound_spi: EspSpi,
    },
    /// Data node: every steerable attachment, resolved to its steer node's port (after
    /// [`Directive::DataConfig`]).
    SetAttachments(Vec<datapath::AttachmentConfig>),
    /// Data node: an attachment's CE MAC, learned by another data node.
    SetCeMac {
        /// The attachment's name.
        attachment: String,
        /// The MAC.
        mac: [u8; 6],
    },
    /// Data node: remove a CHILD_SA.
    RemoveChild {
        /// Its tunnel.
        tunnel: TunnelId,
        /// Its inbound SPI.
        inbound_spi: EspSpi,
        /// Its outbound SPI.
        outbound_spi: EspSpi,
    },
    /// Steer node: steer an inbound SPI to a data node.
    SetSpi {
        /// The SPI.
        spi: EspSpi,
        /// The data node.
        node: u32,
        /// Its tunnel.
        tunnel: TunnelId,
    },
    /// Steer node: forget an inbound SPI.
    RemoveSpi(EspSpi),
    /// Steer node: the data nodes.
    SetNodes(SteerNodes),
    /// Steer node: one VNI's selectors.
    SetSelectors(VniSelectors),
    /// Steer node: its whole tables.
    SteerTables(Box<SteerTables>),
    /// Steer node: its changed shares of tunnels' limits, in one directive.
    SetShares(Vec<(steer::TunnelId, steer::Share)>),
    /// Steer node predating the division: one tunnel's limit.
    SetShare(steer::TunnelId, steer::Share),
    /// Steer node owning the port: steer an attachment's tag pair to its serving data node.
    SetPortTag(steer::PortKey, steer::AttachEntry),
    /// Steer node owning the port: stop steering a tag pair.
    RemovePortTag(steer::PortKey),
    /// Data node: its self-dispatch table.
    SetDispatch(Box<datapath::DispatchConfig>),
}

impl Directive {
    /// True for directives only a data node takes.
    pub fn for_data_node(&self) -> bool {
        matches!(
            self,
            Self::DataConfig
                | Self::SetAttachments(_)
                | Self::SetCeMac { .. }
                | Self::Relays(_)
                | Self::InstallChild { .. }
                | Self::RemoveChild { .. }
                | Self::SetDispatch(_)
        )
    }
}

/// What the core waits for after a directive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Await {
    /// Nothing: a failure shows as a closed session.
    Nothing,
    /// A steering update: a failure is fed back with
    /// [`super::ClusterCore::handle_steer_failed`].
    Steer,
    /// Shares: the answer is fed back with [`super::ClusterCore::handle_share_answer`] when
    /// it comes (not waited for).
    Shares(u64),
    /// Whole tables resent by a tick: waited for, fed back with
    /// [`super::ClusterCore::handle_resync_answer`].
    Resync(u64),
    /// Attachments sent to a data node: the answer is fed back with
    /// [`super::ClusterCore::handle_attachments_answer`] when it comes (not waited for).
    Attachments(u64),
    /// A self-dispatch table: the answer is fed back with
    /// [`super::ClusterCore::handle_dispatch_answer`] when it comes (not waited for).
    Dispatch(u64),
    /// An install: waited for, fed back with
    /// [`super::ClusterCore::handle_install_answer`].
    Install(EspSpi),
    /// The caller waits for the answer and logs a failure (nothing changes in the core).
    Logged,
}

/// One directive to queue.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The node.
    pub node: u32,
    /// The directive.
    pub directive: Directive,
    /// What the core waits for.
    pub wait: Await,
}

/// What the core's inputs produced, in the order the caller carries it out.
#[derive(Debug, Default)]
pub struct Outbox {
    /// Directives to queue now, in order.
    pub send: Vec<Outgoing>,
    /// Directives to queue once the steer nodes answered the [`Await::Steer`] ones of
    /// `send` (the steering moved away first).
    pub after_steers: Vec<Outgoing>,
    /// Tunnels the control loop must rekey, and why.
    pub rekeys: Vec<(Vec<TunnelId>, &'static str)>,
    /// The live steer nodes' Geneve addresses, when the relay list was sent.
    pub ike_steers: Option<Vec<SocketAddr>>,
    /// Self-dispatch: tunnels that need one more CHILD_SA (one entry per CHILD_SA to
    /// create; the control loop's `add_child`).
    pub add_children: Vec<TunnelId>,
    /// Self-dispatch: CHILD_SAs (by inbound SPI) the control loop deletes with the peer (their
    /// data node was lost; the tunnel's other data nodes hold their own).
    pub delete_children: Vec<(TunnelId, EspSpi)>,
}

impl Outbox {
    /// Nothing to carry out.
    pub fn is_empty(&self) -> bool {
        self.send.is_empty()
            && self.after_steers.is_empty()
            && self.rekeys.is_empty()
            && self.ike_steers.is_none()
            && self.add_children.is_empty()
            && self.delete_children.is_empty()
    }
}

/// One node as `protego ctl nodes` shows it.
#[derive(Debug, Clone)]
pub struct NodeStatus {
    /// Its id.
    pub id: u32,
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// Where it receives Geneve.
    pub geneve: SocketAddr,
    /// Alive.
    pub alive: bool,
    /// Being drained.
    pub draining: bool,
    /// Parked by the autoscaler.
    pub parked: bool,
    /// Packet workers.
    pub workers: u32,
    /// The names of the tunnels placed on it.
    pub tunnels: Vec<String>,
    /// The CHILD_SAs it holds (inbound, outbound SPI).
    pub child_sas: Vec<(EspSpi, EspSpi)>,
    /// Its last report.
    pub load: Option<NodeLoad>,
    /// Reports received.
    pub reports: u64,
    /// Its shares of the tunnels' limits (steer nodes).
    pub rate_shares: Vec<(TunnelId, steer::Share)>,
    /// The attachments it serves (data nodes) or whose ports it owns (steer nodes).
    pub attachments: Vec<String>,
    /// Its customer-facing ports (steer nodes).
    pub ports: Vec<PortInfo>,
}

/// The cluster as `protego ctl nodes` shows it, as plain data.
#[derive(Debug, Clone)]
pub struct Status {
    /// Every registered node.
    pub nodes: Vec<NodeStatus>,
    /// Every configured attachment.
    pub attachments: Vec<AttachmentStatus>,
}

/// A CHILD_SA the control loop installs, as the core needs it (no keys).
#[derive(Debug, Clone)]
pub struct NewChild {
    /// Its tunnel.
    pub tunnel: TunnelId,
    /// Its IKE SA.
    pub ike: IkeSpis,
    /// Its inbound SPI.
    pub inbound_spi: EspSpi,
    /// Its outbound SPI.
    pub outbound_spi: EspSpi,
    /// It carries the tunnel's outbound traffic from now on.
    pub outbound_active: bool,
    /// Its local selectors.
    pub local_ts: Vec<TrafficSelector>,
    /// Its remote selectors.
    pub remote_ts: Vec<TrafficSelector>,
    /// The CHILD_SA it replaces (a rekey): it goes to that one's data node when it can.
    pub replaces: Option<EspSpi>,
}

impl From<&ike::ChildSaInfo> for NewChild {
    fn from(c: &ike::ChildSaInfo) -> Self {
        Self {
            tunnel: c.tunnel,
            ike: c.ike,
            inbound_spi: c.inbound_spi,
            outbound_spi: c.outbound_spi,
            outbound_active: c.outbound_active,
            local_ts: c.local_ts.clone(),
            remote_ts: c.remote_ts.clone(),
            replaces: c.replaces,
        }
    }
}

/// Why an install was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallRefused {
    /// The inbound SPI is installed already.
    Duplicate,
    /// No live data node can take it (it moves to the first one that registers).
    NoDataNode,
}

/// A refused operator command.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No tunnel of that name.
    #[error("unknown tunnel {0:?}")]
    UnknownTunnel(String),
    /// No attachment of that name.
    #[error("unknown attachment {0:?}")]
    UnknownAttachment(String),
    /// The attachment's port is not known: it cannot be steered anywhere.
    #[error("attachment {name:?} is not steered: {reason}")]
    Unsteered {
        /// The attachment.
        name: String,
        /// Why.
        reason: String,
    },
    /// No node of that name.
    #[error("unknown node {0:?}")]
    UnknownNode(String),
    /// The node cannot take tunnels.
    #[error("node {name:?} cannot take tunnels: {reason}")]
    Unsuitable {
        /// The node.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// The tunnel has no CHILD_SA to move.
    #[error("tunnel {0:?} has no CHILD_SA (is it up?)")]
    NotUp(String),
    /// The move did not finish in time.
    #[error("{0}")]
    Timeout(String),
    /// The control loop is not attached or stopped.
    #[error("the control loop is not running")]
    NoControl,
}
