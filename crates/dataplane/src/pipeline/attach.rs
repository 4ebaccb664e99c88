//! The attachment stage (issue 16 §1): customers' edge routers (CEs) attached at L2 on an
//! AF_PACKET interface, one VNet per tag pair.
//!
//! From the CE ([`from_ce`], input: one frame of the attachment lane's batch): the tags find
//! the attachment (interface, S-tag, C-tag; `attach::read_tags`), hence its VNet, and nothing
//! else: two customers with the same addresses never meet. ARP and neighbour solicitations
//! for the attachment's gateway address are answered (the CE's MAC learned); an IP frame to
//! the gateway's MAC whose source is behind the CE loses its tags and goes, in this order of
//! precedence, to a CE of the VNet (below), to one of its VMs, or to the VNet's IPsec tunnels:
//! for the last two the packet goes to the lookup stage ([`ToRoute`]; the graph looks the
//! routes of up to `overlay::BATCH` packets up at once, then sends each to the encap stage,
//! [`super::encap::deliver_routed`]: TTL, the VM's MAC, VXLAN to its host, or, with no route and
//! tunnels in the VNet, runs the VNet's outbound feature chain and holds the packet for the
//! seal stage, which chooses among the VNet's tunnels only and numbers it in the order of the
//! VNet's VTEP lane, see `worker::batch`).
//!
//! A CE's packets toward the VNet's VMs run the tenant's inbound feature chain first (its
//! `to_cloud` filters), those toward the tunnels its outbound chain; between two CEs of the
//! VNet none runs.
//!
//! Toward the CE ([`to_ce`], called by the graph for IP frames from a VNet's hosts, or
//! [`may_reach_ce`] then [`to_ce_of_vnet`] when the tenant has an outbound chain, which runs
//! first; [`to_ce_of_vnet`] for decrypted ESP of the VNet and for packets from a CE): when the
//! destination is behind one of the VNet's attachments, the packet is tagged and sent to the
//! CE's MAC on the attachment's interface, before any IPsec tunnel is considered (the two can
//! serve one VNet together: prefixes behind the CE go to the CE, the rest to the tunnels).
//!
//! Frames to the CE are written into the send batch under the interface's socket index
//! ([`packet_sock`]), so they leave in the lane's order with the batch's `sendmmsg`.

use crate::attach::{self, AttachOut, Attachment, Request};
use crate::batch::UNSPECIFIED;
use crate::inner::{self, InnerIp};
use crate::out::{Out, PACKET_SOCK_BASE};
use crate::routes::Routes;
use crate::shared::Shared;
use crate::stats::DropReason;
use crate::tables::Tables;
use crate::vnet::nd::NdOut;
use crate::vnet::Vnet;
use datapath::ToControl;
use std::net::IpAddr;
use std::ops::Range;
use std::time::Instant;
use wire::arp::{ArpPacket, ArpRepr};
use wire::ethernet::{EtherType, EthernetAddress};
use wire::ip::{IpProtocol, IpVersion, Ipv6Packet};
use wire::ndp::{NdpRepr, ICMPV6_NEIGHBOR_ADVERT, ICMPV6_NEIGHBOR_SOLICIT};

/// Shortest Ethernet frame without FCS: ARP and ND answers are padded to it.
const MIN_FRAME: usize = 60;

/// The send batch's socket index of packet interface `iface`.
pub(crate) fn packet_sock(iface: usize) -> usize {
    PACKET_SOCK_BASE + iface
}

/// A CE's IP packet that no CE of its VNet takes: for the lookup stage, which finds its host
/// among the VNet's routes (per-VM entries in a batch) and sends it to the VM, or else to the
/// VNet's IPsec tunnels (`graph::route_from_ces`).
#[derive(Debug)]
pub(crate) struct ToRoute {
    /// The VNet (index in the tables).
    pub(crate) vnet: usize,
    /// The IP packet in the frame (tags and Ethernet header left behind).
    pub(crate) at: Range<usize>,
    /// Its parsed header.
    pub(crate) parsed: InnerIp,
}

/// A frame received from a CE on packet interface `iface`: handled here (answered, sent on to a
/// CE, or dropped and counted), or an IP packet for the lookup stage ([`ToRoute`]).
pub(crate) fn from_ce(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    now: Instant,
    iface: usize,
    frame: &mut [u8],
) -> Option<ToRoute> {
    let tagged = match attach::read_tags(frame) {
        Ok(t) => t,
        Err(reason) => return dropped(o, reason),
    };
    let (s_tag, c_tag) = tagged.tags;
    let Some(a) = t.attach.find((iface, s_tag, c_tag)) else {
        return dropped(o, DropReason::AttachUnknownTags);
    };
    let Some(vnet) = t.attach.vnet.get(a.index).copied().flatten() else {
        return dropped(o, DropReason::AttachNoVnet);
    };
    // The tenant is known (the attachment's VNet's): the charge's mark and the fairness gate.
    if !o.tenant(t.tenants.vnet(vnet)) {
        o.fair_share();
        return None;
    }
    let start = tagged.payload;
    match tagged.ethertype {
        EtherType::ARP => {
            if tagged.dst != a.mac && !tagged.dst.is_broadcast() {
                return dropped(o, DropReason::NeighIgnored);
            }
            arp(o, sh, a, &frame[start..]);
        }
        EtherType::IPV4 | EtherType::IPV6 => {
            let Some(parsed) = InnerIp::parse(&frame[start..]) else {
                return dropped(o, DropReason::AttachMalformed);
            };
            let version_matches = match parsed.version {
                IpVersion::V4 => tagged.ethertype == EtherType::IPV4,
                IpVersion::V6 => tagged.ethertype == EtherType::IPV6,
            };
            if !version_matches {
                return dropped(o, DropReason::AttachEthertype);
            }
            let pkt = &mut frame[start..start + parsed.len];
            let is_nd = parsed.version == IpVersion::V6
                && parsed.flow.proto == IpProtocol::ICMPV6.0
                && matches!(
                    parsed.flow.icmp_type(),
                    Some(ICMPV6_NEIGHBOR_SOLICIT | ICMPV6_NEIGHBOR_ADVERT)
                );
            if is_nd {
                // Unicast neighbour discovery for another MAC is an IP frame not for us.
                if tagged.dst != a.mac && !tagged.dst.is_multicast() {
                    return dropped(o, DropReason::AttachNotForGateway);
                }
                nd(o, sh, a, tagged.src, pkt);
                return None;
            }
            if tagged.dst != a.mac {
                return dropped(o, DropReason::AttachNotForGateway);
            }
            let src = parsed.flow.src;
            // The gateway's own address lies within the CE's segment prefix but is never the
            // CE's to send from.
            if !a.is_behind(src) || src == a.gateway_ip {
                return dropped(o, DropReason::AttachSource);
            }
            if !a.knows_ce(tagged.src) && a.teaches(src) {
                learn_ce(sh, a, tagged.src);
            }
            // Behind a CE of the VNet (this one's included: routed back out, as a router
            // does); else a VM's or beyond the VNet's tunnels: the lookup stage decides.
            if to_ce_of_vnet(o, sh, t, now, vnet, pkt, &parsed) {
                return None;
            }
            let at = start..start + parsed.len;
            return Some(ToRoute { vnet, at, parsed });
        }
        _ => o.drop_packet(DropReason::AttachEthertype),
    }
    None
}

/// Counts a drop of `reason`; nothing goes on.
fn dropped(o: &mut Out, reason: DropReason) -> Option<ToRoute> {
    o.drop_packet(reason);
    None
}

/// An ARP packet from the CE's side.
fn arp(o: &mut Out, sh: &Shared, a: &Attachment, payload: &[u8]) {
    let Ok(repr) = ArpPacket::new_checked(payload).and_then(|p| ArpRepr::parse(&p)) else {
        return o.drop_packet(DropReason::NeighIgnored);
    };
    let (reply, learn) = a.arp(&repr);
    if learn {
        learn_ce(sh, a, repr.source_hardware_addr);
    }
    match reply {
        Some(r) => send_frame(
            o,
            sh,
            a,
            r.target_hardware_addr,
            EtherType::ARP,
            r.buffer_len(),
            |b| r.emit(b).ok(),
        ),
        None if !learn => o.drop_packet(DropReason::NeighIgnored),
        None => {}
    }
}

/// A neighbour solicitation or advertisement from the CE's side (`pkt`: the IPv6 packet).
fn nd(o: &mut Out, sh: &Shared, a: &Attachment, frame_src: EthernetAddress, pkt: &[u8]) {
    let Ok(p) = Ipv6Packet::new_checked(pkt) else {
        return o.drop_packet(DropReason::NeighIgnored);
    };
    let src = p.src_addr();
    let Ok(msg) = NdpRepr::parse(&src, &p.dst_addr(), p.hop_limit(), p.payload()) else {
        return o.drop_packet(DropReason::NeighIgnored);
    };
    let (reply, learn) = a.nd(src, frame_src, &msg);
    if let Some(mac) = learn {
        learn_ce(sh, a, mac);
    }
    match reply {
        Some(r) => send_nd(o, sh, a, &r),
        None if learn.is_none() => o.drop_packet(DropReason::NeighIgnored),
        None => {}
    }
}

fn send_nd(o: &mut Out, sh: &Shared, a: &Attachment, r: &NdOut) {
    send_frame(
        o,
        sh,
        a,
        EthernetAddress(r.dst_mac),
        EtherType::IPV6,
        r.len(),
        |b| r.emit(b),
    );
}

/// Records the CE's MAC; a new one is reported ([`report_ce`]).
fn learn_ce(sh: &Shared, a: &Attachment, mac: EthernetAddress) {
    if a.learn_ce(mac) {
        report_ce(sh, a, Instant::now());
    }
}

/// Reports attachment `a`'s CE MAC if it changed since the last report and a second has
/// passed ([`Attachment::report_due`]): logged, and in relay mode told to the control plane,
/// which passes it on to the other data nodes (they may serve the attachment after a move).
/// A report the control plane could not take is retried by the housekeeping
/// ([`report_ces`]).
pub(crate) fn report_ce(sh: &Shared, a: &Attachment, now: Instant) {
    let Some(mac) = a.report_due(now) else {
        return;
    };
    if sh.cfg.relay.is_some() {
        let msg = ToControl::CeLearned {
            attachment: a.name.clone(),
            mac: mac.0,
        };
        if !sh.tell_control(msg) {
            tracing::debug!(attachment = %a.name, "control plane busy: CE MAC report retried later");
            return;
        }
    }
    a.reported(mac);
    tracing::info!(attachment = %a.name, tenant = %a.tenant, ce_mac = %mac, "CE MAC learned");
}

/// The housekeeping's part: every attachment's CE MAC not reported yet is reported now.
pub(crate) fn report_ces(sh: &Shared, t: &Tables, now: Instant) {
    for a in &t.attach.table.list {
        report_ce(sh, a, now);
    }
}

/// Bytes written in front of a frame toward attachment `a`'s CE: none on a local interface,
/// the Geneve header with the port option toward a steer node.
fn out_prefix(a: &Attachment) -> usize {
    match a.out {
        AttachOut::Packet(_) => 0,
        AttachOut::Steer { .. } => wire::relay::l2_header_len(false),
    }
}

/// Room for a frame of up to `max` bytes toward attachment `a`'s CE, behind the prefix its
/// way out needs ([`out_prefix`], written by [`commit_frame`]).
fn frame_room<'o>(o: &'o mut Out, sh: &Shared, a: &Attachment, max: usize) -> Option<&'o mut [u8]> {
    let prefix = out_prefix(a);
    o.room(sh, prefix + max).map(|room| &mut room[prefix..])
}

/// Commits the frame of `len` bytes written into the last [`frame_room`]: to the
/// interface's socket, or in Geneve with the port option to the port's steer node through
/// the relay socket.
fn commit_frame(o: &mut Out, sh: &Shared, a: &Attachment, len: usize) {
    match a.out {
        AttachOut::Packet(iface) => {
            o.tx.commit(packet_sock(iface), UNSPECIFIED, len);
        }
        AttachOut::Steer { geneve, port } => {
            let Some(sock) = sh.io.relay_sock else {
                return o.drop_packet(DropReason::RelayNoSteer);
            };
            let prefix = out_prefix(a);
            // The same room again: nothing was committed since it was reserved.
            let Some(room) = o.tx.room(prefix + len) else {
                return o.drop_packet(DropReason::TooBig);
            };
            if wire::relay::emit_l2_header(&mut room[..prefix], port, None).is_err() {
                return o.drop_packet(DropReason::TooBig);
            }
            o.tx.commit(sock, geneve, prefix + len);
        }
    }
}

/// Sends a frame built by `write` (which returns the payload length) to `dst` on the
/// attachment's port, tagged, padded to the Ethernet minimum.
#[allow(clippy::too_many_arguments)]
fn send_frame(
    o: &mut Out,
    sh: &Shared,
    a: &Attachment,
    dst: EthernetAddress,
    ethertype: EtherType,
    payload_len: usize,
    write: impl FnOnce(&mut [u8]) -> Option<usize>,
) {
    let hdr = attach::header_len(a.tags);
    let max = (hdr + payload_len).max(MIN_FRAME);
    let Some(room) = frame_room(o, sh, a, max) else {
        return;
    };
    attach::write_header(room, a.tags, dst, a.mac, ethertype);
    let Some(n) = write(&mut room[hdr..max]) else {
        return o.drop_packet(DropReason::TooBig);
    };
    let len = (hdr + n).max(MIN_FRAME);
    room[hdr + n..len].fill(0);
    commit_frame(o, sh, a, len);
}

/// An IP packet from a host of `vnet` (`host`, already checked to be one of the VNet's) to
/// the gateway: if its destination is behind one of the VNet's attachments, it is sent to
/// that CE (true, whatever became of it); false: not the attachments' business.
#[allow(clippy::too_many_arguments)]
pub(crate) fn to_ce(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    r: &Routes,
    now: Instant,
    vnet: &Vnet,
    host: IpAddr,
    pkt: &mut [u8],
    parsed: &InnerIp,
) -> bool {
    let Some(a) = t.attach.toward(vnet.index, parsed.flow.dst) else {
        return false;
    };
    // Only the VNet's own VMs (by its routes) speak to the CE through this host.
    if !vnet.lives_behind(r, parsed.flow.src, host) {
        o.drop_packet(DropReason::AttachVnetSource);
        return true;
    }
    toward_ce(o, sh, now, a, pkt, parsed);
    true
}

/// Whether an IP packet from a host of `vnet` (`host`) may go on toward the VNet's CEs: false
/// (dropped and counted, `attach_vnet_source`) if its destination is behind one of them and
/// its source is not one of the VNet's VMs on that host; true otherwise (the CE is chosen
/// later, after the tenant's outbound chain).
pub(crate) fn may_reach_ce(
    o: &mut Out,
    t: &Tables,
    r: &Routes,
    vnet: &Vnet,
    host: IpAddr,
    parsed: &InnerIp,
) -> bool {
    if t.attach.toward(vnet.index, parsed.flow.dst).is_none()
        || vnet.lives_behind(r, parsed.flow.src, host)
    {
        return true;
    }
    o.drop_packet(DropReason::AttachVnetSource);
    false
}

/// A packet of VNet `vnet` from a source that needs no further check (decrypted from one of
/// the VNet's tunnels, or from another attachment's CE): if its destination is behind one of
/// the VNet's attachments, it is sent to that CE (true, whatever became of it); false: not
/// the attachments' business.
pub(crate) fn to_ce_of_vnet(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    now: Instant,
    vnet: usize,
    pkt: &mut [u8],
    parsed: &InnerIp,
) -> bool {
    let Some(a) = t.attach.toward(vnet, parsed.flow.dst) else {
        return false;
    };
    toward_ce(o, sh, now, a, pkt, parsed);
    true
}

/// Routes an IP packet to attachment `a`'s CE (RFC 1812: the TTL or hop limit decremented),
/// tagged; while the CE's MAC is unknown the packet is dropped and, with `ce_ip`, the MAC
/// asked for.
fn toward_ce(
    o: &mut Out,
    sh: &Shared,
    now: Instant,
    a: &Attachment,
    pkt: &mut [u8],
    parsed: &InnerIp,
) {
    // The gateway's own address on the segment lies within the CE's prefixes but is not
    // behind the CE: sent there it would come back until its TTL ran out.
    if parsed.flow.dst == a.gateway_ip {
        return o.drop_packet(DropReason::ToGateway);
    }
    if !inner::decrement_hop(pkt) {
        return o.drop_packet(DropReason::TtlExceeded);
    }
    let Some(mac) = a.ce_mac() else {
        if let Some(ce) = a.ce_ip {
            if a.request_due(now) {
                match a.request(ce) {
                    Request::Arp(r) => send_frame(
                        o,
                        sh,
                        a,
                        EthernetAddress::BROADCAST,
                        EtherType::ARP,
                        r.buffer_len(),
                        |b| r.emit(b).ok(),
                    ),
                    Request::Nd(ns) => send_nd(o, sh, a, &ns),
                    Request::None => {}
                }
            }
        }
        return o.drop_packet(DropReason::AttachCeUnresolved);
    };
    let ethertype = match parsed.version {
        IpVersion::V4 => EtherType::IPV4,
        IpVersion::V6 => EtherType::IPV6,
    };
    let hdr = attach::header_len(a.tags);
    let len = hdr + pkt.len();
    let Some(room) = frame_room(o, sh, a, len) else {
        return;
    };
    attach::write_header(room, a.tags, mac, a.mac, ethertype);
    room[hdr..len].copy_from_slice(pkt);
    commit_frame(o, sh, a, len);
}
