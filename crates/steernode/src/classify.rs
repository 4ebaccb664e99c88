//! The steer node's per-datagram decisions, pure functions of the bytes and a table snapshot
//! (no I/O, no clock, no state), so two steer nodes with the same tables decide alike:
//!
//! - [`wan`]: a datagram a peer sent to a VIP. Port 500, and port 4500 after the RFC 3948
//!   §2.2 non-ESP marker, is IKE for the control node; a single 0xFF on 4500 is a NAT
//!   keepalive (RFC 3948 §2.3); anything else on 4500 is ESP, steered by its SPI (the
//!   paper's GIN).
//! - [`vxlan`]: a datagram a cloud host sent to our VTEP (RFC 7348). ARP, IPv6 neighbour
//!   discovery (RFC 4861, ICMPv6 types 133–137) and IP packets to the VNet's gateway go to
//!   the VNI's neighbour nodes; other IP packets go where the VNI's selectors say (the
//!   paper's GEN).
//! - [`geneve`]: a frame from a data or control node: a datagram to send out of a VIP, a
//!   probe reply, or both; or a customer's Ethernet frame from a data node to send out of one
//!   of this node's customer-facing ports, if its tags are an attachment's of that port.
//! - [`port`]: a customer's frame on a customer-facing port, steered by its tag pair
//!   (`wire::ethernet::tags`, read as the data node's attach stage reads it) to the data
//!   node serving the attachment. [`port_frame`], what the port thread calls, also finishes
//!   the TCP or UDP checksum of a frame a local stack left to offload (the one change a
//!   decision here makes to the bytes: the data node cannot know the kernel's flag).

use std::net::SocketAddr;
use std::ops::Range;

use steer::{
    AttachEntry, AttachmentId, Flow, NodeId, PortId, PortKey, SelectorEntry, SpiEntry, TunnelId,
};
use wire::arp::ArpPacket;
use wire::esp::UdpEncap;
use wire::ethernet::{tags, EtherType, EthernetRepr};
use wire::flow::InnerIp;
use wire::geneve::HealthProbe;
use wire::ip::IpProtocol;
use wire::relay;
use wire::vxlan::{Vni, VxlanPacket};

use crate::stats::DropReason;
use crate::tables::{Sender, Tables};

/// The kind of VIP socket a datagram arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WanPort {
    /// The IKE port (500).
    Ike,
    /// The NAT-T port (4500).
    NatT,
}

/// What to do with a datagram from a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WanAction {
    /// Send it to the control node at this address.
    Control(SocketAddr),
    /// Send it to the data node of this SPI entry.
    Data(SpiEntry),
    /// ESP for an SPI that is not steered (yet): hold it a moment, a CHILD_SA that was just
    /// negotiated may be steered any moment (the peer may send on it before its data node
    /// holds it).
    UnknownSpi(wire::EspSpi),
    /// A NAT keepalive: drop it (not an error).
    Keepalive,
    /// Drop it.
    Drop(DropReason),
}

/// Decides where a datagram from a peer goes (see the module docs).
pub(crate) fn wan(port: WanPort, payload: &[u8], tables: &Tables) -> WanAction {
    let to_control = || match tables.control {
        Some(c) => WanAction::Control(c),
        None => WanAction::Drop(DropReason::NoControl),
    };
    match port {
        WanPort::Ike if payload.is_empty() => WanAction::Drop(DropReason::IkeEmpty),
        WanPort::Ike => to_control(),
        WanPort::NatT => match UdpEncap::classify(payload) {
            Ok(UdpEncap::NatKeepalive) => WanAction::Keepalive,
            Ok(UdpEncap::Ike) => to_control(),
            Ok(UdpEncap::Esp(spi)) => match tables.spis.lookup(spi) {
                Some(entry) => WanAction::Data(entry),
                None => WanAction::UnknownSpi(spi),
            },
            Err(_) => WanAction::Drop(DropReason::EspMalformed),
        },
    }
}

/// What to do with a VXLAN datagram from a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VxlanAction<'t> {
    /// Send it to the data node of this selector entry.
    Data(Vni, &'t SelectorEntry),
    /// Send it to every live one of these neighbour nodes.
    Neighbours(Vni, &'t [steer::NodeId]),
    /// Drop it.
    Drop(DropReason),
}

/// Decides where a VXLAN datagram (the UDP payload: VXLAN header and Ethernet frame) goes.
pub(crate) fn vxlan<'t>(payload: &[u8], tables: &'t Tables) -> VxlanAction<'t> {
    let malformed = VxlanAction::Drop(DropReason::VxlanMalformed);
    let Ok(packet) = VxlanPacket::new_checked(payload) else {
        return malformed;
    };
    // RFC 7348 §5: "The I flag MUST be set to 1 for a valid VXLAN Network ID (VNI)."
    if !packet.has_vni() {
        return malformed;
    }
    let vni = packet.vni();
    let frame = packet.payload();
    let Ok((eth, offset)) = EthernetRepr::parse(frame) else {
        return malformed;
    };
    let l3 = &frame[offset..];
    let neighbours = || match tables.vni(vni) {
        Some(v) if !v.neighbour_nodes.is_empty() => {
            VxlanAction::Neighbours(vni, &v.neighbour_nodes)
        }
        _ => VxlanAction::Drop(DropReason::NoNeighbours),
    };
    match eth.ethertype {
        EtherType::ARP => {
            if ArpPacket::new_checked(l3).is_err() {
                return malformed;
            }
            neighbours()
        }
        EtherType::IPV4 | EtherType::IPV6 => {
            let Some(inner) = inner_flow(l3) else {
                return malformed;
            };
            let to_gateway = tables
                .vni(vni)
                .is_some_and(|v| v.gateway_ips.contains(&inner.flow.dst));
            if to_gateway || inner.neighbour_discovery {
                return neighbours();
            }
            match tables.selectors.lookup(vni, &inner.flow) {
                Some(entry) => VxlanAction::Data(vni, entry),
                None => VxlanAction::Drop(DropReason::VxlanNoSelector),
            }
        }
        _ => VxlanAction::Drop(DropReason::VxlanUnsupported),
    }
}

/// The selector fields of an inner IP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InnerFlow {
    /// Addresses, protocol, ports.
    pub(crate) flow: Flow,
    /// ICMPv6 router solicitation/advertisement, neighbour solicitation/advertisement or
    /// redirect (RFC 4861 types 133–137).
    pub(crate) neighbour_discovery: bool,
}

/// ICMPv6 types of neighbour discovery (RFC 4861 §4): router solicitation (133) to redirect
/// (137).
const ND_TYPES: std::ops::RangeInclusive<u8> = 133..=137;

/// Reads the selector fields of an IPv4 or IPv6 packet with `wire::flow`, the parser the data
/// node uses too; `None` if it does not parse.
pub(crate) fn inner_flow(packet: &[u8]) -> Option<InnerFlow> {
    let flow = InnerIp::parse(packet)?.flow;
    let neighbour_discovery = flow.proto == IpProtocol::ICMPV6.0
        && flow.src.is_ipv6()
        && flow.icmp_type().is_some_and(|t| ND_TYPES.contains(&t));
    Some(InnerFlow {
        flow,
        neighbour_discovery,
    })
}

/// A datagram a node asks us to send from a VIP socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relay {
    /// Index of the VIP socket (the inner source).
    pub(crate) sock: usize,
    /// The peer (the inner destination).
    pub(crate) dst: SocketAddr,
    /// The UDP payload's range within the frame.
    pub(crate) payload: Range<usize>,
}

/// Where a customer's frame goes ([`port`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PortSteer {
    /// Its port and tag pair (the key its attachment's counters are kept under).
    pub(crate) key: PortKey,
    /// The attachment's entry, as the table has it.
    pub(crate) entry: AttachEntry,
    /// The data node to send it to: the entry's, or the tunnel's.
    pub(crate) node: NodeId,
    /// The tunnel whose selector took it, if any: the frame is charged to that tunnel's
    /// outbound rate limit, as a VM's packet into the tunnel (VXLAN from the hosts) is.
    pub(crate) tunnel: Option<TunnelId>,
}

/// Where a customer's frame on `port` goes: the data node serving the attachment of its tags,
/// or, for an IP packet that one of the attachment's VNet's tunnel selectors takes (a CE's
/// packet for the tenant's IPsec site), the node holding that tunnel's sending CHILD_SA, as
/// for the hosts' VXLAN: every data node holds every attachment, and only the tunnel's node
/// can seal for it, in the order of its relay lane. Such a packet names its tunnel, to be
/// charged to the tunnel's outbound rate limit like the hosts' VXLAN into it. Everything else
/// (ARP, neighbour discovery, packets for VMs and CEs) goes to the serving node.
pub(crate) fn port(port: PortId, frame: &[u8], tables: &Tables) -> Result<PortSteer, DropReason> {
    let t = tags::read(frame).map_err(|e| match e {
        tags::TagError::Malformed => DropReason::PortMalformed,
        tags::TagError::Unknown => DropReason::PortUnknownTags,
    })?;
    let (s_tag, c_tag) = t.tags;
    let entry = tables
        .ports
        .lookup(port, s_tag, c_tag)
        .ok_or(DropReason::PortUnknownTags)?;
    let mut steer = PortSteer {
        key: PortKey { port, s_tag, c_tag },
        entry,
        node: entry.node,
        tunnel: None,
    };
    let Some(vni) = entry.vni else {
        return Ok(steer);
    };
    if !matches!(t.ethertype, EtherType::IPV4 | EtherType::IPV6) {
        return Ok(steer);
    }
    let selected = frame
        .get(t.payload..)
        .and_then(inner_flow)
        .filter(|inner| !inner.neighbour_discovery)
        .and_then(|inner| tables.selectors.lookup(vni, &inner.flow));
    if let Some(s) = selected {
        if let Some(tunnel) = s.tunnel {
            steer.node = s.node;
            steer.tunnel = Some(tunnel);
        }
    }
    Ok(steer)
}

/// [`port`] for a frame the port thread relays: where it goes, and if the kernel marked it
/// `TP_STATUS_CSUMNOTREADY` (`csum_not_ready`: sent by a local stack with checksum offload, a
/// veth peer's namespace, so its TCP or UDP checksum field holds only the pseudo-header sum),
/// its checksum finished in place (`wire::checksum::finish_frame`, as the data plane's attach
/// stage finishes those of its own rings), since the data node it is relayed to cannot know the
/// flag. Only frames that go on are finished. One that cannot be (not IP, not parsing, a
/// fragment, neither TCP nor UDP) goes on as it is and is counted nowhere here: the data node's
/// attach stage drops what does not parse.
pub(crate) fn port_frame(
    port_id: PortId,
    frame: &mut [u8],
    csum_not_ready: bool,
    tables: &Tables,
) -> Result<PortSteer, DropReason> {
    let steer = port(port_id, frame, tables)?;
    if csum_not_ready {
        let _ = wire::checksum::finish_frame(frame);
    }
    Ok(steer)
}

/// A customer's frame to send out of one of this node's ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToPort {
    /// Index of the port among this node's ports.
    pub(crate) port: usize,
    /// The Ethernet frame's range within the Geneve frame.
    pub(crate) frame: Range<usize>,
    /// Its port and tag pair (the key its attachment's counters are kept under).
    pub(crate) key: PortKey,
    /// The attachment of its tags.
    pub(crate) attachment: AttachmentId,
}

/// What a Geneve frame from a node asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GeneveAction {
    /// Who sent it.
    pub(crate) sender: Sender,
    /// A probe reply it carries.
    pub(crate) probe_reply: Option<HealthProbe>,
    /// A datagram to send out of a VIP.
    pub(crate) relay: Option<Relay>,
    /// A customer's frame to send out of a port.
    pub(crate) to_port: Option<ToPort>,
    /// Part of the frame is dropped (its datagram, or the whole frame if it asks for
    /// nothing else).
    pub(crate) drop: Option<DropReason>,
}

/// Decides what a Geneve frame from `src` asks for. `vip_sock` maps an inner source address
/// to the VIP socket that owns it, `own_port` a port id to this node's index of it. `Err`
/// drops the whole frame.
pub(crate) fn geneve(
    src: SocketAddr,
    frame: &[u8],
    tables: &Tables,
    vip_sock: impl Fn(SocketAddr) -> Option<usize>,
    own_port: impl Fn(PortId) -> Option<usize>,
) -> Result<GeneveAction, DropReason> {
    let sender = tables.sender(src).ok_or(DropReason::GeneveUnknownSender)?;
    let f = relay::parse_frame(frame).map_err(|_| DropReason::GeneveMalformed)?;
    let mut action = GeneveAction {
        sender,
        probe_reply: f.probe_reply,
        relay: None,
        to_port: None,
        drop: None,
    };
    if let (Some(range), Some(port)) = (f.ethernet, f.port) {
        let port = PortId(port);
        let to = || -> Result<ToPort, DropReason> {
            if !matches!(sender, Sender::Data(_)) {
                return Err(DropReason::PortNotFromData);
            }
            let index = own_port(port).ok_or(DropReason::PortNotOurs)?;
            let eth = frame
                .get(range.clone())
                .ok_or(DropReason::GeneveMalformed)?;
            let t = tags::read(eth).map_err(|_| DropReason::PortUnknownTagsOut)?;
            let (s_tag, c_tag) = t.tags;
            let entry = tables
                .ports
                .lookup(port, s_tag, c_tag)
                .ok_or(DropReason::PortUnknownTagsOut)?;
            Ok(ToPort {
                port: index,
                frame: range,
                key: PortKey { port, s_tag, c_tag },
                attachment: entry.attachment,
            })
        };
        match to() {
            Ok(t) => action.to_port = Some(t),
            Err(r) => action.drop = Some(r),
        }
        return Ok(action);
    }
    match f.datagram {
        // RFC 8926 §3.4: a control packet's payload "MUST NOT be forwarded".
        Some(_) if f.control => action.drop = Some(DropReason::GeneveControlPayload),
        Some(d) => match vip_sock(d.src) {
            Some(sock) => {
                action.relay = Some(Relay {
                    sock,
                    dst: d.dst,
                    payload: d.payload,
                })
            }
            None => action.drop = Some(DropReason::RelayNotFromVip),
        },
        None if f.probe_reply.is_none() => action.drop = Some(DropReason::GeneveNoAction),
        None => {}
    }
    Ok(action)
}

#[cfg(test)]
mod agree;
#[cfg(test)]
mod tests;
