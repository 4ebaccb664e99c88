//! Customers attached at L2 (issue 16 §1, the paper's Q-in-Q "L2 tunnel" between the
//! customer's edge router, the CE, and the provider's edge): the attachments by tag pair, each
//! with its CE's MAC as learned, and per published snapshot which VNet each one serves
//! ([`AttachView`]). Pure state and decisions: the stage is `pipeline::attach`, the frames come
//! from `netio::packet` through the I/O stage.
//!
//! An attachment is identified by (interface, S-tag, C-tag): IEEE 802.1ad outer tag (TPID
//! 0x88a8) and 802.1Q inner tag (0x8100), or for `vlan` one 802.1Q tag. The gateway is the CE's
//! next hop: it answers ARP (RFC 826) and neighbour solicitations (RFC 4861 §7.2.4) for the
//! attachment's `gateway_ip` with the interface's MAC, learns the CE's MAC, and takes from the
//! CE only IP packets whose source is behind it (the attachment's `routes`, the CE's address
//! included): the same prefixes are what the VNet sends to the CE.

use crate::stats::DropReason;
use crate::vnet::nd::NdOut;
use crate::vnet::{link_local, Vnet};
use datapath::{AttachmentConfig, AttachmentPort, AttachmentTags, DataplaneError};
use ipnet::IpNet;
use rustc_hash::FxHashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wire::arp::{ArpOperation, ArpRepr};
use wire::ethernet::{
    EtherType, EthernetAddress, EthernetFrame, VlanPacket, ETHERNET_HEADER_LEN, VLAN_TAG_LEN,
};
use wire::ndp::{solicited_node_multicast, NaFlags, NdpRepr};

/// The link-local all-nodes multicast group (RFC 4291 §2.7.1).
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// The least spacing of the gateway's requests for the CE's address.
const CE_REQUEST_INTERVAL: Duration = Duration::from_secs(1);

/// The least spacing of reports of an attachment's CE MAC (log line; in relay mode a message
/// to the control plane, which passes it on to every data node).
const CE_REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// (interface index, S-tag or 0 for `vlan`, C-tag): what tells attachments apart.
pub(crate) type TagKey = (usize, u16, u16);

/// The key of an attachment's tags on interface `iface`.
pub(crate) fn tag_key(iface: usize, tags: AttachmentTags) -> TagKey {
    match tags {
        AttachmentTags::QinQ { s_tag, c_tag } => (iface, s_tag, c_tag),
        AttachmentTags::Vlan { c_tag } => (iface, 0, c_tag),
    }
}

/// Where an attachment's frames toward the CE leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttachOut {
    /// On the local packet interface with this index (the I/O stage's packet sockets).
    Packet(usize),
    /// Inside Geneve with the port option, to the steer node owning the port (relay mode).
    Steer {
        /// The steer node's Geneve address.
        geneve: SocketAddr,
        /// The port's id there.
        port: u32,
    },
}

/// One attachment at run time.
pub(crate) struct Attachment {
    /// Index in the configuration.
    pub(crate) index: usize,
    /// Name (logs).
    pub(crate) name: String,
    /// Owning tenant.
    pub(crate) tenant: ids::TenantId,
    /// The VNet's name (resolved per snapshot, [`AttachView`]).
    pub(crate) vnet: String,
    /// Where its frames toward the CE leave.
    pub(crate) out: AttachOut,
    /// Its tags.
    pub(crate) tags: AttachmentTags,
    /// The gateway's address on the segment.
    pub(crate) gateway_ip: IpAddr,
    /// The CE's address, if configured.
    pub(crate) ce_ip: Option<IpAddr>,
    /// The prefixes behind the CE (a handful: a scan; the VNet's own route table is not
    /// needed for "is it behind the CE").
    pub(crate) routes: Vec<IpNet>,
    /// The same prefixes as (network, mask) words, the form asked per packet.
    behind: Behind,
    /// The gateway's MAC on the segment (the interface's).
    pub(crate) mac: EthernetAddress,
    /// The IPv6 link-local address of `mac` (source of ND messages for an IPv4 gateway).
    pub(crate) link_local: Ipv6Addr,
    /// The CE's MAC: 0 while unknown, else the MAC's 48 bits with bit 63 set.
    ce_mac: AtomicU64,
    /// When the gateway last asked for the CE's address (ns since `epoch`).
    last_request: AtomicU64,
    /// The CE's MAC as last reported (logged, and in relay mode told to the control
    /// plane), encoded as `ce_mac` (0: none yet).
    reported: AtomicU64,
    /// When the CE's MAC was last reported (ns since `epoch`).
    last_report: AtomicU64,
    epoch: Instant,
}

const KNOWN: u64 = 1 << 63;

/// A known CE MAC as stored: its 48 bits with [`KNOWN`] set.
fn encode_mac(mac: EthernetAddress) -> u64 {
    let m = mac.0;
    KNOWN | u64::from_be_bytes([0, 0, m[0], m[1], m[2], m[3], m[4], m[5]])
}

/// The MAC of a stored value.
fn decode_mac(v: u64) -> EthernetAddress {
    let b = v.to_be_bytes();
    EthernetAddress([b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// Prefixes as (network, mask) words per family: "is this address behind the CE" in a few
/// instructions a prefix, where `IpNet::contains` rebuilds the mask each time.
#[derive(Debug, Default)]
struct Behind {
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u128)>,
}

impl Behind {
    fn new(routes: &[IpNet]) -> Self {
        let mut b = Self::default();
        for n in routes {
            match n {
                IpNet::V4(n) => b.v4.push((u32::from(n.network()), u32::from(n.netmask()))),
                IpNet::V6(n) => {
                    b.v6.push((u128::from(n.network()), u128::from(n.netmask())))
                }
            }
        }
        b
    }

    #[inline]
    fn contains(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => {
                let a = u32::from(a);
                self.v4.iter().any(|&(net, mask)| a & mask == net)
            }
            IpAddr::V6(a) => {
                let a = u128::from(a);
                self.v6.iter().any(|&(net, mask)| a & mask == net)
            }
        }
    }
}

impl Attachment {
    /// Builds attachment `index` whose frames leave by `out`, the gateway's MAC there being
    /// `mac`; errors name the field (`attachments[i].routes[j]`).
    pub(crate) fn new(
        index: usize,
        cfg: &AttachmentConfig,
        out: AttachOut,
        mac: [u8; 6],
    ) -> Result<Self, DataplaneError> {
        let field = |f: &str| format!("attachments[{index}].{f}");
        let mut routes: Vec<IpNet> = Vec::with_capacity(cfg.routes.len());
        for (i, &(prefix, len)) in cfg.routes.iter().enumerate() {
            let bad = |reason: String| DataplaneError::Config {
                field: field(&format!("routes[{i}]")),
                reason,
            };
            let net = IpNet::new(prefix, len)
                .map_err(|_| bad(format!("{prefix}/{len}: prefix length beyond the address")))?;
            if net.network() != prefix {
                return Err(bad(format!("{prefix}/{len} has host bits set")));
            }
            routes.push(net);
        }
        if cfg.gateway_ip.is_unspecified() || cfg.gateway_ip.is_multicast() {
            return Err(DataplaneError::Config {
                field: field("gateway_ip"),
                reason: format!("{} is not a unicast address", cfg.gateway_ip),
            });
        }
        let mac = EthernetAddress(mac);
        let a = Self {
            index,
            name: cfg.name.clone(),
            tenant: cfg.tenant.clone(),
            vnet: cfg.vnet.clone(),
            out,
            tags: cfg.tags,
            gateway_ip: cfg.gateway_ip,
            ce_ip: cfg.ce_ip,
            behind: Behind::new(&routes),
            routes,
            mac,
            link_local: link_local(mac),
            ce_mac: AtomicU64::new(0),
            last_request: AtomicU64::new(0),
            reported: AtomicU64::new(0),
            last_report: AtomicU64::new(0),
            epoch: Instant::now(),
        };
        if let Some(m) = cfg.ce_mac {
            let m = EthernetAddress(m);
            if !m.is_unicast() {
                return Err(DataplaneError::Config {
                    field: field("ce_mac"),
                    reason: format!("{m} is not a unicast MAC"),
                });
            }
            // Given by the control plane: known there already.
            a.set_ce_reported(m);
        }
        Ok(a)
    }

    /// True if `ip` is behind the CE (a source it may send from, a destination sent to it).
    #[inline]
    pub(crate) fn is_behind(&self, ip: IpAddr) -> bool {
        self.behind.contains(ip)
    }

    /// True if `mac` is the CE's MAC as known (one load: the per-packet check that spares
    /// learning again).
    #[inline]
    pub(crate) fn knows_ce(&self, mac: EthernetAddress) -> bool {
        self.ce_mac.load(Ordering::Relaxed) == encode_mac(mac)
    }

    /// The CE's MAC, once known.
    pub(crate) fn ce_mac(&self) -> Option<EthernetAddress> {
        let v = self.ce_mac.load(Ordering::Relaxed);
        (v & KNOWN != 0).then(|| decode_mac(v))
    }

    /// Records the CE's MAC (a unicast one; others are ignored); true if it was not the one
    /// known. It is reported later, at most once a second ([`Attachment::report_due`]): a
    /// CE whose source MAC flaps costs a store per frame, not a log line or a message.
    pub(crate) fn learn_ce(&self, mac: EthernetAddress) -> bool {
        mac.is_unicast() && self.set_ce(mac)
    }

    /// Sets the CE's MAC; true if it changed.
    pub(crate) fn set_ce(&self, mac: EthernetAddress) -> bool {
        let v = encode_mac(mac);
        self.ce_mac.swap(v, Ordering::Relaxed) != v
    }

    /// Sets the CE's MAC as another node learned it (the control plane passes it on): known
    /// and already reported, so it is not reported back. True if it changed.
    pub(crate) fn set_ce_reported(&self, mac: EthernetAddress) -> bool {
        let changed = self.set_ce(mac);
        self.reported.store(encode_mac(mac), Ordering::Relaxed);
        changed
    }

    /// The CE's MAC if it differs from the one last reported and no report was made in the
    /// last second (the time is taken: one caller reports). Reports that fail are retried
    /// by the housekeeping, which asks again.
    pub(crate) fn report_due(&self, now: Instant) -> Option<EthernetAddress> {
        let current = self.ce_mac.load(Ordering::Relaxed);
        if current == 0 || current == self.reported.load(Ordering::Relaxed) {
            return None;
        }
        let t = u64::try_from(now.saturating_duration_since(self.epoch).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        let last = self.last_report.load(Ordering::Relaxed);
        if last != 0 && t.saturating_sub(last) < CE_REPORT_INTERVAL.as_nanos() as u64 {
            return None;
        }
        self.last_report
            .compare_exchange(last, t, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        Some(decode_mac(current))
    }

    /// Marks `mac` as reported.
    pub(crate) fn reported(&self, mac: EthernetAddress) {
        self.reported.store(encode_mac(mac), Ordering::Relaxed);
    }

    /// True if a frame from `ip` may teach the CE's MAC: the CE's address if configured, else
    /// any address behind the CE.
    pub(crate) fn teaches(&self, ip: IpAddr) -> bool {
        match self.ce_ip {
            Some(ce) => ip == ce,
            None => self.is_behind(ip),
        }
    }

    /// True (and the time recorded) if the gateway should ask for the CE's address now: it is
    /// configured and the last request is older than a second.
    pub(crate) fn request_due(&self, now: Instant) -> bool {
        if self.ce_ip.is_none() {
            return false;
        }
        let t = u64::try_from(now.saturating_duration_since(self.epoch).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        let last = self.last_request.load(Ordering::Relaxed);
        let spacing = CE_REQUEST_INTERVAL.as_nanos() as u64;
        if last != 0 && t.saturating_sub(last) < spacing {
            return false;
        }
        self.last_request
            .compare_exchange(last, t, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// An ARP packet from the CE's side: the reply to send (a request for the gateway), and
    /// whether its sender teaches the CE's MAC.
    pub(crate) fn arp(&self, arp: &ArpRepr) -> (Option<ArpRepr>, bool) {
        let for_us = IpAddr::V4(arp.target_protocol_addr) == self.gateway_ip;
        let sender = IpAddr::V4(arp.source_protocol_addr);
        let learn = arp.source_hardware_addr.is_unicast()
            && sender != self.gateway_ip
            && self.teaches(sender);
        let reply = (for_us
            && arp.operation == ArpOperation::REQUEST
            && arp.source_hardware_addr.is_unicast())
        .then(|| arp.reply(self.mac));
        (reply, learn)
    }

    /// A neighbour solicitation or advertisement from `src` (frame source `frame_src`): the
    /// advertisement to send (a solicitation for the gateway, RFC 4861 §7.2.4, as a router),
    /// and the MAC it teaches for the CE, if any.
    pub(crate) fn nd(
        &self,
        src: Ipv6Addr,
        frame_src: EthernetAddress,
        msg: &NdpRepr,
    ) -> (Option<NdOut>, Option<EthernetAddress>) {
        match *msg {
            NdpRepr::NeighborSolicit {
                target_addr,
                source_lladdr,
            } => {
                let for_us = IpAddr::V6(target_addr) == self.gateway_ip;
                let from = IpAddr::V6(src);
                let learn = source_lladdr
                    .filter(|ll| ll.is_unicast() && !src.is_unspecified() && self.teaches(from));
                // RFC 4861 §7.2.4: "If the source of the solicitation is the unspecified
                // address, the node MUST set the Solicited flag to zero and multicast the
                // advertisement to the all-nodes address." (A CE checking the address with
                // DAD learns it is taken.)
                let dad = src.is_unspecified();
                let dst = if dad { ALL_NODES } else { src };
                let dst_mac = if dad {
                    EthernetAddress::from_ipv6_multicast(&ALL_NODES)
                } else {
                    source_lladdr.unwrap_or(frame_src)
                };
                let reply = for_us.then_some(NdOut {
                    src: target_addr,
                    dst,
                    dst_mac: dst_mac.0,
                    src_mac: self.mac,
                    msg: NdpRepr::NeighborAdvert {
                        flags: NaFlags {
                            router: true,
                            solicited: !dad,
                            overrides: true,
                        },
                        target_addr,
                        target_lladdr: Some(self.mac),
                    },
                });
                (reply, learn)
            }
            NdpRepr::NeighborAdvert {
                target_addr,
                target_lladdr,
                ..
            } => {
                let ll = target_lladdr.unwrap_or(frame_src);
                let learn =
                    (ll.is_unicast() && self.teaches(IpAddr::V6(target_addr))).then_some(ll);
                (None, learn)
            }
        }
    }

    /// The gateway's request for the CE's address `ce` (IPv4: ARP; IPv6: a solicitation to
    /// its solicited-node group).
    pub(crate) fn request(&self, ce: IpAddr) -> Request {
        match (ce, self.gateway_ip) {
            (IpAddr::V4(target), IpAddr::V4(spa)) => Request::Arp(ArpRepr {
                operation: ArpOperation::REQUEST,
                source_hardware_addr: self.mac,
                source_protocol_addr: spa,
                target_hardware_addr: EthernetAddress([0; 6]),
                target_protocol_addr: target,
            }),
            (IpAddr::V6(target), gw) => {
                let src = match gw {
                    IpAddr::V6(a) => a,
                    IpAddr::V4(_) => self.link_local,
                };
                let dst = solicited_node_multicast(&target);
                Request::Nd(NdOut {
                    src,
                    dst,
                    dst_mac: EthernetAddress::from_ipv6_multicast(&dst).0,
                    src_mac: self.mac,
                    msg: NdpRepr::NeighborSolicit {
                        target_addr: target,
                        source_lladdr: Some(self.mac),
                    },
                })
            }
            // Validation keeps ce_ip of gateway_ip's version; nothing to ask otherwise.
            (IpAddr::V4(_), IpAddr::V6(_)) => Request::None,
        }
    }
}

/// A request for the CE's address.
pub(crate) enum Request {
    /// ARP.
    Arp(ArpRepr),
    /// Neighbour solicitation.
    Nd(NdOut),
    /// Nothing to send.
    None,
}

/// Every attachment, and how tags find them: fixed at start for local interfaces; in relay
/// mode replaced whole by [`AttachTable::on_steer_ports`] (published with the tables).
#[derive(Default)]
pub(crate) struct AttachTable {
    /// By configuration index.
    pub(crate) list: Vec<Arc<Attachment>>,
    by_tags: FxHashMap<TagKey, usize>,
    /// Relay mode: the steer nodes' ports the attachments are on, as (steer node's Geneve
    /// address, port id there); an attachment's `iface` is its port's index here.
    pub(crate) steer_ports: Vec<(SocketAddr, u32)>,
}

/// Where attachment `i` is: its port's index and output, and the gateway's MAC there.
type PortOf = ((usize, AttachOut), [u8; 6]);

impl AttachTable {
    /// Builds the table from the configuration; `port_of(i, cfg)` is attachment `i`'s port.
    /// Errors name the field.
    pub(crate) fn new(
        cfgs: &[AttachmentConfig],
        mut port_of: impl FnMut(usize, &AttachmentConfig) -> Result<PortOf, DataplaneError>,
    ) -> Result<Self, DataplaneError> {
        let mut t = Self::default();
        for (i, cfg) in cfgs.iter().enumerate() {
            let ((iface, out), mac) = port_of(i, cfg)?;
            let a = Attachment::new(i, cfg, out, mac)?;
            if cfgs[..i].iter().any(|o| o.name == cfg.name) {
                return Err(DataplaneError::Config {
                    field: format!("attachments[{i}].name"),
                    reason: format!("{} is used twice", cfg.name),
                });
            }
            // Two CEs of one VNet behind the same addresses would leave the way to them to
            // the order of the attachments ([`AttachView::toward`] takes the first).
            for o in t
                .list
                .iter()
                .filter(|o| o.tenant == a.tenant && o.vnet == a.vnet)
            {
                let clash = a.routes.iter().enumerate().find_map(|(j, n)| {
                    o.routes
                        .iter()
                        .find(|m| n.contains(&m.network()) || m.contains(&n.network()))
                        .map(|m| (j, n, m))
                });
                if let Some((j, n, m)) = clash {
                    return Err(DataplaneError::Config {
                        field: format!("attachments[{i}].routes[{j}]"),
                        reason: format!(
                            "{n} overlaps {m} of attachment {} in the same VNet",
                            o.name
                        ),
                    });
                }
            }
            if t.by_tags.insert(tag_key(iface, cfg.tags), i).is_some() {
                return Err(DataplaneError::Config {
                    field: format!("attachments[{i}].tags"),
                    reason: format!("{:?} on {} is used twice", cfg.tags, cfg.port),
                });
            }
            t.list.push(Arc::new(a));
        }
        Ok(t)
    }

    /// Relay mode: the attachments of `cfgs`, every one on a steer node's port; a CE MAC
    /// known in `previous` for an attachment of the same name, on the same port and tags, is
    /// kept unless `cfgs` gives one. Errors name the field.
    pub(crate) fn on_steer_ports(
        cfgs: &[AttachmentConfig],
        previous: &AttachTable,
    ) -> Result<Self, DataplaneError> {
        let mut ports: Vec<(SocketAddr, u32)> = Vec::new();
        let mut t = Self::new(cfgs, |i, cfg| match cfg.port {
            AttachmentPort::Steer { geneve, port, mac } => {
                let at = match ports.iter().position(|&p| p == (geneve, port)) {
                    Some(at) => at,
                    None => {
                        ports.push((geneve, port));
                        ports.len() - 1
                    }
                };
                Ok(((at, AttachOut::Steer { geneve, port }), mac))
            }
            AttachmentPort::Interface(ref name) => Err(DataplaneError::Config {
                field: format!("attachments[{i}].port"),
                reason: format!(
                    "interface {name}: in relay mode an attachment is on a steer node's port"
                ),
            }),
        })?;
        t.steer_ports = ports;
        for (a, cfg) in t.list.iter().zip(cfgs) {
            if cfg.ce_mac.is_some() {
                continue;
            }
            let old = previous
                .by_name(&a.name)
                .filter(|o| o.out == a.out && o.tags == a.tags);
            if let Some((o, mac)) = old.and_then(|o| Some((o, o.ce_mac()?))) {
                a.set_ce(mac);
                if o.reported.load(Ordering::Relaxed) == encode_mac(mac) {
                    a.reported(mac);
                }
            }
        }
        Ok(t)
    }

    /// The index of port `port` of the steer node at `steer`, if an attachment is on it.
    pub(crate) fn steer_port(&self, steer: SocketAddr, port: u32) -> Option<usize> {
        self.steer_ports.iter().position(|&p| p == (steer, port))
    }

    /// The attachment named `name`.
    pub(crate) fn by_name(&self, name: &str) -> Option<&Arc<Attachment>> {
        self.list.iter().find(|a| a.name == name)
    }

    /// The attachment with these tags.
    #[inline]
    pub(crate) fn find(&self, key: TagKey) -> Option<&Arc<Attachment>> {
        self.by_tags.get(&key).and_then(|&i| self.list.get(i))
    }

    /// Which VNet of `vnets` each attachment of `table` serves (by tenant and name).
    pub(crate) fn view(table: &Arc<Self>, vnets: &[Arc<Vnet>]) -> AttachView {
        if table.list.is_empty() {
            return AttachView::default();
        }
        let mut view = AttachView {
            table: Arc::clone(table),
            vnet: Vec::with_capacity(table.list.len()),
            by_vnet: vec![Vec::new(); vnets.len()],
        };
        for a in &table.list {
            let v = vnets
                .iter()
                .position(|v| v.tenant == a.tenant && v.name == a.vnet);
            if let Some(v) = v {
                view.by_vnet[v].push(Arc::clone(a));
            }
            view.vnet.push(v);
        }
        view
    }
}

/// Per published snapshot: the attachments, the VNet each one serves and the attachments of
/// each VNet.
#[derive(Default)]
pub(crate) struct AttachView {
    /// The attachments.
    pub(crate) table: Arc<AttachTable>,
    /// By attachment index: its VNet's index (None: the VNet is gone).
    pub(crate) vnet: Vec<Option<usize>>,
    /// By VNet index: its attachments.
    pub(crate) by_vnet: Vec<Vec<Arc<Attachment>>>,
}

impl AttachView {
    /// The attachment with these tags.
    #[inline]
    pub(crate) fn find(&self, key: TagKey) -> Option<&Arc<Attachment>> {
        self.table.find(key)
    }

    /// The attachment of VNet `vnet` that `dst` is behind, if any.
    #[inline]
    pub(crate) fn toward(&self, vnet: usize, dst: IpAddr) -> Option<&Arc<Attachment>> {
        self.by_vnet.get(vnet)?.iter().find(|a| a.is_behind(dst))
    }
}

pub(crate) use wire::ethernet::tags::Tagged;

/// Reads a frame's tags with `wire::ethernet::tags::read` (the steer node's port thread reads
/// them with the same function): an 802.1ad S-tag (0x88a8) followed by an 802.1Q C-tag
/// (0x8100), or one 802.1Q tag. Anything else (untagged, an S-tag alone, two 0x8100 tags, a
/// third tag, a VLAN id of 0 or 4095 in any tag) cannot be an attachment's:
/// [`DropReason::AttachUnknownTags`]; a frame too short for its tags is
/// [`DropReason::AttachMalformed`]. S-tag 0 in [`TagKey`] is thus for single-tag attachments
/// only.
pub(crate) fn read_tags(frame: &[u8]) -> Result<Tagged, DropReason> {
    wire::ethernet::tags::read(frame).map_err(|e| match e {
        wire::ethernet::tags::TagError::Malformed => DropReason::AttachMalformed,
        wire::ethernet::tags::TagError::Unknown => DropReason::AttachUnknownTags,
    })
}

/// Bytes of the Ethernet header and tags of frames toward the CE of an attachment.
pub(crate) fn header_len(tags: AttachmentTags) -> usize {
    match tags {
        AttachmentTags::QinQ { .. } => ETHERNET_HEADER_LEN + 2 * VLAN_TAG_LEN,
        AttachmentTags::Vlan { .. } => ETHERNET_HEADER_LEN + VLAN_TAG_LEN,
    }
}

/// Writes the Ethernet header with the attachment's tags (priority 0) into
/// `buf[..header_len(tags)]`.
pub(crate) fn write_header(
    buf: &mut [u8],
    tags: AttachmentTags,
    dst: EthernetAddress,
    src: EthernetAddress,
    ethertype: EtherType,
) {
    let mut eth = EthernetFrame::new_unchecked(&mut buf[..ETHERNET_HEADER_LEN]);
    eth.set_dst_addr(dst);
    eth.set_src_addr(src);
    let at = ETHERNET_HEADER_LEN;
    match tags {
        AttachmentTags::QinQ { s_tag, c_tag } => {
            eth.set_ethertype(EtherType::QINQ);
            let mut outer = VlanPacket::new_unchecked(&mut buf[at..at + VLAN_TAG_LEN]);
            outer.set_tci_bits(s_tag & 0x0fff);
            outer.set_ethertype(EtherType::VLAN);
            let at = at + VLAN_TAG_LEN;
            let mut inner = VlanPacket::new_unchecked(&mut buf[at..at + VLAN_TAG_LEN]);
            inner.set_tci_bits(c_tag & 0x0fff);
            inner.set_ethertype(ethertype);
        }
        AttachmentTags::Vlan { c_tag } => {
            eth.set_ethertype(EtherType::VLAN);
            let mut t = VlanPacket::new_unchecked(&mut buf[at..at + VLAN_TAG_LEN]);
            t.set_tci_bits(c_tag & 0x0fff);
            t.set_ethertype(ethertype);
        }
    }
}

#[cfg(test)]
mod tests;
