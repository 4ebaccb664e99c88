//! The VXLAN decap stage (RFC 7348): input one VXLAN datagram from a host (from the classify
//! stage), output what its Ethernet frame carries ([`Frame`]): an IP packet to the gateway for
//! the feature chain and the seal stage, or an ARP / neighbour discovery packet for the VNet's
//! L2 side (the encap stage answers them), with the VNet it belongs to; or a counted drop. The
//! VNI must be a VNet configured on the receiving VTEP (relay mode: the VNet of the VNI) and
//! the sender one of its route hosts (prefix routes or per-VM entries); the frame must come from a unicast MAC and, for IP
//! other than neighbour discovery, be addressed to the gateway's MAC. With self-dispatch
//! (`crate::vnet::vmacs`) a frame to one of this node's virtual MACs is the gateway's too; one
//! to a virtual MAC the node gave away within `linger` is sent on to its new owner, which
//! also accepts it from that node (and finds its host by the inner source); one to another
//! node's virtual MAC is left to its owner (hosts flood frames for MACs they have not learnt
//! to every data node).

use crate::inner::InnerIp;
use crate::out::Out;
use crate::pipeline::classify::Via;
use crate::routes::Routes;
use crate::stats::DropReason;
use crate::tables::Tables;
use crate::vnet::Vnet;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;
use wire::ethernet::{EtherType, EthernetAddress, EthernetFrame, ETHERNET_HEADER_LEN};
use wire::ip::{IpProtocol, IpVersion};
use wire::ndp::{ICMPV6_NEIGHBOR_ADVERT, ICMPV6_NEIGHBOR_SOLICIT};
use wire::vxlan::{VxlanPacket, VXLAN_HEADER_LEN};

/// What a VXLAN datagram's frame carries; ranges are into the datagram.
pub(crate) enum Frame<'t> {
    /// An ARP packet.
    Arp {
        /// Its VNet.
        vnet: &'t Arc<Vnet>,
        /// The sending host.
        host: IpAddr,
        /// The frame's destination MAC.
        dst_mac: EthernetAddress,
        /// The ARP packet.
        at: Range<usize>,
    },
    /// An IPv6 neighbour solicitation or advertisement.
    Nd {
        /// Its VNet.
        vnet: &'t Arc<Vnet>,
        /// The sending host.
        host: IpAddr,
        /// The frame's source MAC.
        src_mac: EthernetAddress,
        /// The frame's destination MAC.
        dst_mac: EthernetAddress,
        /// The IPv6 packet.
        at: Range<usize>,
    },
    /// Self-dispatch: a frame to a virtual MAC this node gave away a moment ago, to send on
    /// unchanged (the whole datagram) to the VTEP of its new owner.
    Forward {
        /// The new owner's VTEP.
        to: IpAddr,
        /// Its VNet (the local VTEP it leaves from).
        vnet: &'t Arc<Vnet>,
        /// The inner packet's flow (for the source port).
        flow: wire::flow::Flow,
    },
    /// An IP packet sent to the gateway's MAC (or, with self-dispatch, to one of this node's
    /// virtual MACs).
    Ip {
        /// Its VNet.
        vnet: &'t Arc<Vnet>,
        /// The sending host.
        host: IpAddr,
        /// The frame's source MAC (the sending VM's).
        src_mac: EthernetAddress,
        /// The IP packet (without trailing Ethernet padding).
        at: Range<usize>,
        /// What it is.
        parsed: InnerIp,
    },
}

/// Decapsulates a VXLAN datagram (UDP payload) from `src`.
pub(crate) fn decap<'t>(
    o: &mut Out,
    t: &'t Tables,
    r: &Routes,
    via: Via,
    src: SocketAddr,
    data: &[u8],
    now: Instant,
) -> Option<Frame<'t>> {
    let vni = match VxlanPacket::new_checked(data) {
        // RFC 7348 §5: the I flag MUST be set for a valid VNI.
        Ok(vx) if vx.has_vni() => vx.vni(),
        _ => return drop(o, DropReason::VxlanMalformed),
    };
    let found = match via {
        Via::Vtep(vtep) => t.overlay.by_vtep.get(&(vtep, vni)),
        Via::Relay => t.overlay.by_vni.get(&vni),
    };
    let Some((vi, vnet)) = found.and_then(|&vi| Some((vi, t.overlay.vnets.get(vi)?))) else {
        o.no_tenant();
        return drop(o, DropReason::VxlanUnknownVni);
    };
    // The tenant is known (the VNet's): the charge's mark and the fairness gate.
    if !o.tenant(t.tenants.vnet(vi)) {
        o.fair_share();
        return None;
    }
    let mut host = src.ip();
    // Self-dispatch: the VNet's share of virtual MACs, and whether another data node sent
    // the frame on (it then carries a VM's frame to one of this node's virtual MACs).
    let dispatch = t.dispatch.as_deref();
    let share = dispatch.and_then(|d| d.share(vni));
    let from_node = share.is_some_and(|s| s.is_other_node(host));
    if !from_node && !vnet.accepts_host(r, host) {
        return drop(o, DropReason::VxlanUnknownHost);
    }
    let frame = &data[VXLAN_HEADER_LEN..];
    let (dst_mac, src_mac, ethertype) = match EthernetFrame::new_checked(frame) {
        Ok(eth) if eth.src_addr().is_unicast() => (eth.dst_addr(), eth.src_addr(), eth.ethertype()),
        _ => return drop(o, DropReason::VxlanMalformed),
    };
    let start = VXLAN_HEADER_LEN + ETHERNET_HEADER_LEN;
    let payload = &data[start..];
    // Nodes send each other only frames to virtual MACs.
    if from_node && share.and_then(|s| s.index_of(dst_mac)).is_none() {
        return drop(o, DropReason::VxlanUnknownHost);
    }
    match ethertype {
        EtherType::ARP if from_node => drop(o, DropReason::VxlanUnknownHost),
        EtherType::ARP => Some(Frame::Arp {
            vnet,
            host,
            dst_mac,
            at: start..data.len(),
        }),
        EtherType::IPV4 | EtherType::IPV6 => {
            let Some(parsed) = InnerIp::parse(payload) else {
                return drop(o, DropReason::VxlanMalformed);
            };
            let at = start..start + parsed.len;
            let is_nd = parsed.version == IpVersion::V6
                && parsed.flow.proto == IpProtocol::ICMPV6.0
                && matches!(
                    parsed.flow.icmp_type(),
                    Some(ICMPV6_NEIGHBOR_SOLICIT | ICMPV6_NEIGHBOR_ADVERT)
                );
            if is_nd {
                if from_node {
                    return drop(o, DropReason::VxlanUnknownHost);
                }
                return Some(Frame::Nd {
                    vnet,
                    host,
                    src_mac,
                    dst_mac,
                    at,
                });
            }
            if dst_mac != vnet.mac {
                let Some((share, index)) = share.and_then(|s| Some((s, s.index_of(dst_mac)?)))
                else {
                    return drop(o, DropReason::VxlanNotForGateway);
                };
                if !share.owns(index) {
                    let lingers =
                        !from_node && dispatch.is_some_and(|d| d.lingers(vni, index, now));
                    return match share.owner(index) {
                        Some(to) if lingers => Some(Frame::Forward {
                            to,
                            vnet,
                            flow: parsed.flow,
                        }),
                        _ => drop(o, DropReason::DispatchOtherOwner),
                    };
                }
                share.count(index);
                if from_node {
                    // Sent on by the node that gave the virtual MAC away: its host is where
                    // the VM lives.
                    let Some(h) = vnet.route(r, parsed.flow.src) else {
                        return drop(o, DropReason::VxlanUnknownHost);
                    };
                    host = h;
                }
            }
            Some(Frame::Ip {
                vnet,
                host,
                src_mac,
                at,
                parsed,
            })
        }
        _ => drop(o, DropReason::VxlanEthertype),
    }
}

fn drop<T>(o: &mut Out, reason: DropReason) -> Option<T> {
    o.drop_packet(reason);
    None
}
