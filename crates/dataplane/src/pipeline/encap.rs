//! The encap stage, toward the inside interface. Input: a decrypted inner packet that passed
//! its tenant's inbound feature chain, with its CHILD_SA's inside interface. Output: VXLAN
//! datagrams in the send batch, or a TUN packet (queued in the batch so it keeps the lane's
//! order).
//!
//! Into a VNet (RFC 7348, RFC 1812 forwarding): the packet is routed to its host, by the
//! VM's per-VM entry ([`Routes`]) or else by longest prefix ([`lookup`] does a batch of packets
//! at once, the per-VM entries with prefetching), its TTL decremented (RFC 1812 §5.3.1), its
//! VM's MAC resolved, and sent as
//! Ethernet(gateway MAC -> VM MAC) in VXLAN, the UDP source port chosen by a flow hash (§5).
//! This stage also owns the VNet's L2 side: ARP (RFC 826) and neighbour discovery (RFC 4861)
//! packets the decap stage found are answered here and teach the neighbour cache, whose
//! waiting packets leave when their MAC is learned; the housekeeping retries requests.
//!
//! In relay mode VXLAN toward hosts leaves from the node's VTEP as well (hosts send to the
//! steer nodes' VIP).

use crate::inner::{self, InnerIp};
use crate::out::{Out, TUN_DST, TUN_SOCK};
use crate::routes::Routes;
use crate::shared::Shared;
use crate::stats::DropReason;
use crate::tables::Tables;
use crate::vnet::nd::NdOut;
use crate::vnet::neigh::{Mac, Resolution};
use crate::vnet::vmacs::{DispatchCounters, ANNOUNCE_ETHERTYPE};
use crate::vnet::{arp, nd, write_frame_header, Vnet, FRAME_HEADER_LEN};
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;
use wire::arp::{ArpOperation, ArpPacket, ArpRepr};
use wire::ethernet::{EtherType, EthernetAddress};
use wire::flow::Flow;
use wire::ip::{IpVersion, Ipv6Packet};
use wire::ndp::NdpRepr;

/// Minimum Ethernet payload (60-byte frames without FCS); ARP frames are padded to it.
const MIN_ETHERNET_PAYLOAD: usize = 46;

/// An ARP packet from `host` in `vnet` (frame to `dst_mac`): answered if it asks for the
/// gateway, learned from if its sender lives behind `host`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn arp(
    o: &mut Out,
    sh: &Shared,
    vnet: &Vnet,
    r: &Routes,
    host: IpAddr,
    now: Instant,
    dst_mac: EthernetAddress,
    payload: &[u8],
) {
    if !dst_mac.is_broadcast() && !for_this_node(o, sh, vnet, dst_mac) {
        return o.drop_packet(DropReason::NeighIgnored);
    }
    let Ok(repr) = ArpPacket::new_checked(payload).and_then(|p| ArpRepr::parse(&p)) else {
        return o.drop_packet(DropReason::NeighIgnored);
    };
    let asks = repr.operation == ArpOperation::REQUEST
        && vnet.gateway_v4 == Some(repr.target_protocol_addr);
    let answer_with = answer_with(o, sh, vnet, repr.source_hardware_addr, asks);
    let verdict = arp::handle(vnet, &repr, answer_with);
    let answer = verdict.reply.map(Answer::Arp);
    learn_and_answer(o, sh, vnet, r, host, now, verdict.learn, answer);
}

/// Whether a unicast frame to `dst` is for this node in `vnet`: to the gateway's MAC, or with
/// self-dispatch to one of this node's virtual MACs or its own MAC.
fn for_this_node(o: &Out, sh: &Shared, vnet: &Vnet, dst: EthernetAddress) -> bool {
    dst == vnet.mac
        || o.dispatch_share(vnet.vni).is_some_and(|s| {
            dst == sh.io.vteps[vnet.vtep].node_mac || s.index_of(dst).is_some_and(|i| s.owns(i))
        })
}

/// The MAC a request for the gateway from `requester` is answered with: the gateway's, or
/// with self-dispatch `h(requester)` if this node owns it (None: its owner answers). `asks`:
/// the packet is such a request (counted).
fn answer_with(
    o: &Out,
    sh: &Shared,
    vnet: &Vnet,
    requester: EthernetAddress,
    asks: bool,
) -> Option<EthernetAddress> {
    let Some(share) = o.dispatch_share(vnet.vni) else {
        return Some(vnet.mac);
    };
    let mac = share.own_vmac_for(requester.0);
    if asks {
        let c = &sh.dispatch_counters;
        DispatchCounters::add(
            if mac.is_some() {
                &c.answered
            } else {
                &c.left_to_owner
            },
            1,
        );
    }
    mac
}

/// The source MAC of a frame this node sends to the VM whose MAC is `vm` (an IP packet): the
/// gateway's, or with self-dispatch `h(vm)` if this node owns it (Algorithm 2, step 3: the
/// host's learning then confirms the owner) and else the node's own MAC (so the host never
/// learns a virtual MAC at a node that does not own it).
#[inline]
fn source_mac(o: &Out, sh: &Shared, vnet: &Vnet, vm: Mac) -> EthernetAddress {
    match o.dispatch_share(vnet.vni) {
        None => vnet.mac,
        Some(s) => s
            .own_vmac_for(vm)
            .unwrap_or(sh.io.vteps[vnet.vtep].node_mac),
    }
}

/// The MAC this node's own requests (ARP, ND) come from with self-dispatch (None: the
/// gateway's, as without it).
fn requester_mac(o: &Out, sh: &Shared, vnet: &Vnet) -> Option<EthernetAddress> {
    o.dispatch_share(vnet.vni)
        .map(|_| sh.io.vteps[vnet.vtep].node_mac)
}

/// Learns the MAC of the sender of an IP frame to the gateway (`src` from `src_mac`, if it
/// lives behind `host`), unless this worker learned it recently.
#[allow(clippy::too_many_arguments)]
pub(crate) fn learn_from_ip(
    o: &mut Out,
    sh: &Shared,
    vnet: &Vnet,
    r: &Routes,
    host: IpAddr,
    now: Instant,
    src: IpAddr,
    src_mac: EthernetAddress,
) {
    if o.learned.get(vnet.id, src, now) != Some(src_mac.0) && vnet.lives_behind(r, src, host) {
        learn(o, sh, vnet, host, now, src, src_mac.0, true);
        o.learned.put(vnet.id, src, src_mac.0, now);
    }
}

/// A neighbour solicitation or advertisement from `host` in `vnet`: answered if it asks for
/// the gateway, learned from if its sender lives behind `host`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn nd(
    o: &mut Out,
    sh: &Shared,
    vnet: &Vnet,
    r: &Routes,
    host: IpAddr,
    now: Instant,
    src_mac: EthernetAddress,
    dst_mac: EthernetAddress,
    pkt: &[u8],
) {
    if !dst_mac.is_multicast() && !for_this_node(o, sh, vnet, dst_mac) {
        return o.drop_packet(DropReason::NeighIgnored);
    }
    let Ok(p) = Ipv6Packet::new_checked(pkt) else {
        return o.drop_packet(DropReason::NeighIgnored);
    };
    let src = p.src_addr();
    let Ok(msg) = NdpRepr::parse(&src, &p.dst_addr(), p.hop_limit(), p.payload()) else {
        return o.drop_packet(DropReason::NeighIgnored);
    };
    let asks = matches!(msg, NdpRepr::NeighborSolicit { target_addr, .. }
        if vnet.is_gateway(IpAddr::V6(target_addr)));
    let answer_with = answer_with(o, sh, vnet, src_mac, asks);
    let verdict = nd::handle(vnet, src, src_mac, &msg, answer_with);
    let answer = verdict.reply.map(Answer::Nd);
    learn_and_answer(o, sh, vnet, r, host, now, verdict.learn, answer);
}

/// The gateway's answer to an ARP or ND packet, sent back to its sender.
enum Answer {
    /// An ARP reply (RFC 826), to its target hardware address.
    Arp(ArpRepr),
    /// A neighbour advertisement (RFC 4861 §7.2.4).
    Nd(NdOut),
}

/// What the ARP and ND handling share once the protocol judged a packet from `host`: the
/// sender is learned if it lives behind `host`, then the answer is sent; a packet that does
/// neither is counted as ignored.
#[allow(clippy::too_many_arguments)]
fn learn_and_answer(
    o: &mut Out,
    sh: &Shared,
    vnet: &Vnet,
    r: &Routes,
    host: IpAddr,
    now: Instant,
    sender: Option<(IpAddr, Mac, bool)>,
    answer: Option<Answer>,
) {
    let mut useful = false;
    if let Some((ip, mac, create)) = sender {
        if vnet.lives_behind(r, ip, host) {
            learn(o, sh, vnet, host, now, ip, mac, create);
            useful = true;
        }
    }
    match answer {
        Some(Answer::Arp(reply)) => send_frame(
            o,
            sh,
            vnet,
            host,
            (reply.target_hardware_addr.0, reply.source_hardware_addr),
            EtherType::ARP,
            reply.buffer_len(),
            |b| reply.emit(b).ok(),
        ),
        Some(Answer::Nd(reply)) => send_frame(
            o,
            sh,
            vnet,
            host,
            (reply.dst_mac, reply.src_mac),
            EtherType::IPV6,
            reply.len(),
            |b| reply.emit(b),
        ),
        None if !useful => o.drop_packet(DropReason::NeighIgnored),
        None => {}
    }
}

/// Records a neighbour and sends the packets that waited for it.
#[allow(clippy::too_many_arguments)]
fn learn(
    o: &mut Out,
    sh: &Shared,
    vnet: &Vnet,
    host: IpAddr,
    now: Instant,
    ip: IpAddr,
    mac: Mac,
    create: bool,
) {
    let waiting = vnet.neigh().learn(ip, mac, now, create);
    for pkt in waiting.into_iter().flatten() {
        match InnerIp::parse(&pkt) {
            Some(parsed) => emit_ip(o, sh, vnet, host, mac, &pkt[..parsed.len], &parsed),
            None => o.drop_packet(DropReason::InnerMalformed),
        }
    }
}

/// The batched lookup stage: the host of each (VNet index in `t`, destination) of `dsts`,
/// written to `hosts` (None: no route, or no such VNet). The per-VM entries of all of them
/// are looked up in one batch (`overlay::OverlayTable::get_batch`: buckets prefetched before
/// they are read, so the cache misses of a large table overlap); the prefix routes answer
/// for the destinations without one. `dsts`, `keys` and `hosts` are as long as each other
/// and at most `overlay::BATCH`.
pub(crate) fn lookup(
    t: &Tables,
    r: &Routes,
    dsts: &[(usize, IpAddr)],
    keys: &mut [overlay::Key],
    found: &mut [Option<overlay::Value>],
    hosts: &mut [Option<IpAddr>],
) {
    let vnets = &t.overlay.vnets;
    for ((&(v, dst), key), found) in dsts.iter().zip(keys.iter_mut()).zip(found.iter_mut()) {
        // A key of no VNet finds nothing: VNet numbers are below the table's VNI array.
        *key = overlay::Key::new(
            vnets.get(v).map_or(overlay::VnetId(u32::MAX), |v| v.key),
            dst,
        );
        *found = None;
    }
    r.exact_batch(keys, found);
    for ((&(v, dst), found), host) in dsts.iter().zip(found.iter()).zip(hosts.iter_mut()) {
        *host = match found {
            Some(value) => Some(value.host),
            None => vnets.get(v).and_then(|vnet| vnet.routes.lookup(dst)),
        };
    }
}

/// Delivers a decrypted packet into VNet `v` of `t` (RFC 1812 forwarding: TTL, route,
/// resolve), looking its route up alone. `admit` is called before the packet is held for
/// neighbour resolution (see `NeighCache::resolve`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn deliver(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    r: &Routes,
    now: Instant,
    v: usize,
    pkt: &mut [u8],
    parsed: &InnerIp,
    admit: impl FnOnce() -> Result<(), DropReason>,
) {
    let host = t
        .overlay
        .vnets
        .get(v)
        .and_then(|vnet| vnet.route(r, parsed.flow.dst));
    deliver_routed(o, sh, t, now, v, host, pkt, parsed, admit);
}

/// [`deliver`] with the route already looked up ([`lookup`]): `host` is where the packet's
/// destination lives (None: no route).
#[allow(clippy::too_many_arguments)]
pub(crate) fn deliver_routed(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    now: Instant,
    v: usize,
    host: Option<IpAddr>,
    pkt: &mut [u8],
    parsed: &InnerIp,
    admit: impl FnOnce() -> Result<(), DropReason>,
) {
    let Some(vnet) = t.overlay.vnets.get(v) else {
        return o.drop_packet(DropReason::NoRoute);
    };
    let dst = parsed.flow.dst;
    if vnet.is_gateway(dst) {
        return o.drop_packet(DropReason::ToGateway);
    }
    let Some(host) = host else {
        return o.drop_packet(DropReason::NoRoute);
    };
    if !inner::decrement_hop(pkt) {
        return o.drop_packet(DropReason::TtlExceeded);
    }
    // Hosts that route at their router MAC: no VM's MAC to resolve.
    if let Some(mac) = vnet.router_mac {
        return emit_ip(o, sh, vnet, host, mac, pkt, parsed);
    }
    if let Some(mac) = o.resolved.get(vnet.id, dst, now) {
        return emit_ip(o, sh, vnet, host, mac, pkt, parsed);
    }
    let resolution = vnet.neigh().resolve(dst, now, pkt, admit);
    match resolution {
        Resolution::Mac { mac, probe } => {
            o.resolved.put(vnet.id, dst, mac, now);
            // The probe first: the packet's own frame must be the last thing it writes, so
            // that a batch handed on in between carries nothing of the packet (its
            // acceptance by the replay window travels with the batch holding its frame).
            if probe {
                solicit(o, sh, vnet, host, dst);
            }
            emit_ip(o, sh, vnet, host, mac, pkt, parsed);
        }
        Resolution::Queued { request } => {
            if request {
                solicit(o, sh, vnet, host, dst);
            }
        }
        Resolution::Dropped(reason) => o.drop_packet(reason),
        Resolution::DroppedAsking(reason) => {
            solicit(o, sh, vnet, host, dst);
            o.drop_packet(reason);
        }
    }
}

/// Sends an IP packet to a VM: Ethernet(gateway -> `mac`) in VXLAN to `host`.
fn emit_ip(
    o: &mut Out,
    sh: &Shared,
    vnet: &Vnet,
    host: IpAddr,
    mac: Mac,
    pkt: &[u8],
    parsed: &InnerIp,
) {
    let len = FRAME_HEADER_LEN + pkt.len();
    let from = source_mac(o, sh, vnet, mac);
    let Some(room) = o.room(sh, len) else { return };
    let ethertype = match parsed.version {
        IpVersion::V4 => EtherType::IPV4,
        IpVersion::V6 => EtherType::IPV6,
    };
    write_frame_header(room, vnet.vni, mac, from, ethertype);
    room[FRAME_HEADER_LEN..len].copy_from_slice(pkt);
    let sock = source_socket(sh, vnet, &parsed.flow);
    o.tx.commit(sock, SocketAddr::new(host, sh.cfg.vxlan_port), len);
}

/// Self-dispatch: sends a host's VXLAN `datagram` (UDP payload) for a virtual MAC this node
/// gave away on to `to`, the new owner's VTEP, unchanged.
pub(crate) fn send_on(
    o: &mut Out,
    sh: &Shared,
    vnet: &Vnet,
    to: IpAddr,
    flow: &Flow,
    datagram: &[u8],
) {
    let len = datagram.len();
    let Some(room) = o.room(sh, len) else { return };
    room[..len].copy_from_slice(datagram);
    let sock = source_socket(sh, vnet, flow);
    o.tx.commit(sock, SocketAddr::new(to, sh.cfg.vxlan_port), len);
    DispatchCounters::add(&sh.dispatch_counters.forwarded, 1);
}

/// The socket whose source port carries this flow (RFC 7348 §5).
fn source_socket(sh: &Shared, vnet: &Vnet, flow: &Flow) -> usize {
    let vtep = &sh.io.vteps[vnet.vtep];
    if vtep.pool.is_empty() {
        vtep.recv
    } else {
        vtep.pool[(inner::flow_hash(flow) % vtep.pool.len() as u64) as usize]
    }
}

/// Sends a frame built by `write` (which returns the payload length) to `host`, from
/// `macs.1` to `macs.0`.
#[allow(clippy::too_many_arguments)]
fn send_frame(
    o: &mut Out,
    sh: &Shared,
    vnet: &Vnet,
    host: IpAddr,
    macs: (Mac, EthernetAddress),
    ethertype: EtherType,
    payload_len: usize,
    write: impl FnOnce(&mut [u8]) -> Option<usize>,
) {
    let max = FRAME_HEADER_LEN + payload_len.max(MIN_ETHERNET_PAYLOAD);
    let Some(room) = o.room(sh, max) else { return };
    write_frame_header(room, vnet.vni, macs.0, macs.1, ethertype);
    let Some(n) = write(&mut room[FRAME_HEADER_LEN..max]) else {
        return o.drop_packet(DropReason::TooBig);
    };
    let padded = n.max(MIN_ETHERNET_PAYLOAD);
    room[FRAME_HEADER_LEN + n..FRAME_HEADER_LEN + padded].fill(0);
    o.tx.commit(
        sh.io.vteps[vnet.vtep].recv,
        SocketAddr::new(host, sh.cfg.vxlan_port),
        FRAME_HEADER_LEN + padded,
    );
}

/// Asks `host` for the MAC of `ip` (ARP request or neighbour solicitation).
fn solicit(o: &mut Out, sh: &Shared, vnet: &Vnet, host: IpAddr, ip: IpAddr) {
    let node = requester_mac(o, sh, vnet);
    match ip {
        IpAddr::V4(a) => {
            let req = arp::request(vnet, a, node);
            send_frame(
                o,
                sh,
                vnet,
                host,
                (EthernetAddress::BROADCAST.0, req.source_hardware_addr),
                EtherType::ARP,
                req.buffer_len(),
                |b| req.emit(b).ok(),
            );
        }
        IpAddr::V6(a) => {
            let ns = nd::solicit(vnet, a, node);
            send_frame(
                o,
                sh,
                vnet,
                host,
                (ns.dst_mac, ns.src_mac),
                EtherType::IPV6,
                ns.len(),
                |b| ns.emit(b),
            );
        }
    }
}

/// Which of this node's virtual MACs a housekeeping round announces (Algorithm 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Announce {
    /// None (no self-dispatch, or nothing due).
    Nothing,
    /// Those gained with tables newer than this generation (the last announced).
    Gained(u64),
    /// All of them (the period is up).
    All,
}

/// What the housekeeping round starting at `now` over `t` announces; one round at a time
/// asks (the housekeeping's lock).
pub(crate) fn announcements_due(sh: &Shared, t: &Tables, now: Instant) -> Announce {
    let Some(d) = t.dispatch.as_deref() else {
        return Announce::Nothing;
    };
    let mut due = sh.announce.lock().unwrap_or_else(|p| p.into_inner());
    let (next, announced) = &mut *due;
    if now >= *next {
        *next = now + d.announce_interval;
        *announced = d.generation;
        Announce::All
    } else if *announced < d.generation {
        let since = std::mem::replace(announced, d.generation);
        Announce::Gained(since)
    } else {
        Announce::Nothing
    }
}

/// Algorithm 3 for `vnet`: a frame from each announced virtual MAC to itself, to every host of
/// the VNet. The host's VXLAN device learns the virtual MAC at this node's VTEP; its bridge
/// sends the frame back nowhere (the MAC is on the port it came in on), so no VM sees it.
fn announce(o: &mut Out, sh: &Shared, t: &Tables, vnet: &Vnet, which: Announce) {
    let Some(d) = t.dispatch.as_deref() else {
        return;
    };
    let Some(share) = d.share(vnet.vni) else {
        return;
    };
    let indices: Vec<u16> = match which {
        Announce::Nothing => return,
        Announce::All => share.owned().collect(),
        Announce::Gained(since) => d
            .gained
            .iter()
            .filter(|(vni, _, generation)| *vni == vnet.vni && *generation > since)
            .map(|(_, i, _)| *i)
            .collect(),
    };
    let mut sent = 0;
    for i in indices {
        let mac = share.mac(i);
        for &host in &vnet.hosts {
            send_frame(
                o,
                sh,
                vnet,
                host,
                (mac.0, mac),
                EtherType(ANNOUNCE_ETHERTYPE),
                0,
                |_| Some(0),
            );
            sent += 1;
        }
    }
    DispatchCounters::add(&sh.dispatch_counters.announced, sent);
}

/// Neighbour cache housekeeping for the VNets of `t` on local VTEP `vtep` (None: every VNet,
/// relay mode): retries requests, expires entries, counts the packets of failed resolutions;
/// with self-dispatch it sends the announcements `which` asks for.
pub(crate) fn housekeeping(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    r: &Routes,
    vtep: Option<usize>,
    now: Instant,
    which: Announce,
) {
    let mine = |v: &&std::sync::Arc<Vnet>| vtep.is_none_or(|i| v.vtep == i);
    for vnet in t.overlay.vnets.iter().filter(mine) {
        announce(o, sh, t, vnet, which);
        let mut requests = std::mem::take(&mut o.requests);
        requests.clear();
        let dropped = vnet.neigh().tick(now, &mut requests);
        if dropped > 0 {
            tracing::debug!(tenant = %vnet.tenant, vnet = %vnet.name, dropped, "address resolution failed");
            o.drops.add_n(DropReason::NeighUnresolved, dropped);
        }
        for ip in &requests {
            if let Some(host) = vnet.route(r, *ip) {
                solicit(o, sh, vnet, host, *ip);
            }
        }
        o.requests = requests;
    }
}

/// A decrypted packet for the TUN device: queued in the send batch, so it is written in the
/// lane's order like datagrams are sent (the kernel forwards it and decrements the TTL
/// itself).
pub(crate) fn deliver_tun(o: &mut Out, sh: &Shared, pkt: &[u8]) {
    if sh.io.tun.is_none() {
        return o.drop_packet(DropReason::TunWrite);
    }
    let Some(room) = o.room(sh, pkt.len()) else {
        return;
    };
    room[..pkt.len()].copy_from_slice(pkt);
    o.tx.commit(TUN_SOCK, TUN_DST, pkt.len());
}
