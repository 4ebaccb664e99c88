//! The graph: which stage's output goes to which stage, per lane. The stages do not call each
//! other; this module runs them in order over a lane batch's packets (the worker calls one
//! entry point per datagram or TUN packet, then [`end_pass`]):
//!
//! ```text
//! NAT-T / relay ESP:  classify -> open -> [inbound chain] -> lookup -> encap (VXLAN | TUN)
//! VTEP / relay VXLAN: classify -> decap -> ARP/ND: encap (answers)
//!                                       -> IP: [outbound chain] -> seal (select_vnet, queue)
//! TUN:                [outbound chain] -> seal (select_tun, queue)
//! attachment (L2):    attach (tags -> attachment; ARP/ND) -> a CE: attach (tag, CE's MAC)
//!                                                          -> a VM: encap (VNet route, VXLAN)
//!                                                          -> else: [outbound chain] -> hold
//!                      (then, under the VNet's VTEP lane's dispatch stage) held -> seal
//! VTEP IP to a CE:    classify -> decap -> attach (tag, to the CE's MAC)
//! IKE:                classify (to the control plane)
//! ```
//!
//! A packet whose tenant has a feature chain for its direction is held
//! ([`Held`](crate::feature::Held)) with what it needs to go on ([`Resume`]); at the end of
//! the pass ([`end_pass`]) the chains run over the held packets, batch-wise, and the
//! survivors continue to encap or seal in the order they were held. Without chains nothing is
//! held and each packet goes through all stages at once. The outbound chain runs before the
//! seal stage chooses the CHILD_SA: the choice (and a VNet packet's TTL decrement) is made
//! on the packet as the chain left it, so the selectors cover what is sent.
//!
//! The lookup stage: an opened packet for a VNet waits in the worker's [`Deliveries`] (a
//! reference to it in the receive batch, no copy) until [`overlay::BATCH`] of them are there
//! or the pass ends; then their routes are looked up together ([`encap::lookup`], per-VM
//! entries in one prefetched batch) and they go to encap in arrival order. A packet that
//! records its replay-window acceptance without waiting (dropped, to the TUN device, held for
//! a chain) hands the waiting ones on first, so acceptances keep arrival order.

use super::attach;
use super::classify::{self, Class, Pass, Via};
use super::decap::{self, Frame};
use super::encap;
use super::open::{self, Opened};
use super::seal;
use crate::feature::{Direction, Fate, PacketMeta, TunChain};
use crate::inner::InnerIp;
use crate::out::{Out, Resume};
use crate::routes::Routes;
use crate::shared::Shared;
use crate::stats::DropReason;
use crate::tables::Tables;
use datapath::Inside;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;
use wire::EspSpi;

/// A datagram on the IKE socket `local` from `src`.
pub(crate) fn ike(o: &mut Out, sh: &Shared, local: SocketAddr, src: SocketAddr, data: &[u8]) {
    o.no_tenant();
    classify::ike(o, sh, local, src, data);
}

/// An opened inbound packet for a VNet, waiting for its route.
struct Delivery<'p, 't> {
    opened: Opened<'t>,
    pkt: &'p mut [u8],
    parsed: InnerIp,
    vnet: usize,
}

/// A queued delivery's work is its tenant's (the queue is flushed under whichever run is
/// current: another tenant's, or none).
#[inline]
fn charge_to(o: &mut Out, opened: &Opened<'_>) {
    if let Some(c) = o.charge.as_deref_mut() {
        c.switch(opened.child.tenant, 1);
    }
}

/// The lookup stage's queue: opened packets for VNets (in the receive batch `'p`, with the
/// tables `'t`) waiting to be looked up together. See the module docs.
pub(crate) struct Deliveries<'p, 't> {
    items: [Option<Delivery<'p, 't>>; overlay::BATCH],
    len: usize,
}

impl<'p, 't> Deliveries<'p, 't> {
    /// An empty queue.
    pub(crate) fn new() -> Self {
        Self {
            items: std::array::from_fn(|_| None),
            len: 0,
        }
    }

    /// Queues `d`, first delivering what waits if the queue is full.
    fn push(
        &mut self,
        o: &mut Out,
        sh: &Shared,
        t: &Tables,
        r: &Routes,
        now: Instant,
        d: Delivery<'p, 't>,
    ) {
        if self.len == self.items.len() {
            self.flush(o, sh, t, r, now);
        }
        self.items[self.len] = Some(d);
        self.len += 1;
    }

    /// Looks the waiting packets' routes up in one batch and delivers them in order.
    pub(crate) fn flush(&mut self, o: &mut Out, sh: &Shared, t: &Tables, r: &Routes, now: Instant) {
        let n = self.len;
        if n == 0 {
            return;
        }
        self.len = 0;
        if r.is_empty() {
            // No per-VM entries: the prefixes answer, packet by packet, as before the stage.
            for item in &mut self.items[..n] {
                if let Some(d) = item.take() {
                    charge_to(o, &d.opened);
                    to_inside(o, sh, t, r, now, &d.opened, d.pkt, &d.parsed, None);
                }
            }
            return;
        }
        let mut dsts = [(0, IpAddr::V4(Ipv4Addr::UNSPECIFIED)); overlay::BATCH];
        for (d, item) in dsts.iter_mut().zip(&self.items[..n]) {
            if let Some(item) = item {
                *d = (item.vnet, item.parsed.flow.dst);
            }
        }
        let hosts = lookup_hosts(t, r, &dsts[..n]);
        for (item, host) in self.items[..n].iter_mut().zip(hosts) {
            if let Some(d) = item.take() {
                charge_to(o, &d.opened);
                to_inside(o, sh, t, r, now, &d.opened, d.pkt, &d.parsed, Some(host));
            }
        }
    }
}

/// A datagram received on the NAT-T socket `local` from `src`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn natt<'p, 't>(
    o: &mut Out,
    sh: &Shared,
    t: &'t Tables,
    r: &Routes,
    now: Instant,
    local: SocketAddr,
    src: SocketAddr,
    data: &'p mut [u8],
    d: &mut Deliveries<'p, 't>,
) {
    if let Some(class) = classify::natt(o, sh, local, src, data) {
        next(o, sh, t, r, now, class, data, d);
    }
}

/// A VXLAN datagram (UDP payload) from `src`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn vxlan(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    r: &Routes,
    now: Instant,
    via: Via,
    src: SocketAddr,
    data: &mut [u8],
) {
    from_host(o, sh, t, r, now, via, src, data);
}

/// A Geneve frame received from `src` on the relay socket: the part of it that belongs to
/// `pass`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn relay<'p, 't>(
    o: &mut Out,
    sh: &Shared,
    t: &'t Tables,
    r: &Routes,
    now: Instant,
    src: SocketAddr,
    data: &'p mut [u8],
    pass: Pass,
    d: &mut Deliveries<'p, 't>,
) {
    if let Some(class) = classify::relay(o, sh, t, now, src, data, pass) {
        next(o, sh, t, r, now, class, data, d);
    }
}

/// The hosts of up to `overlay::BATCH` (VNet index, destination) pairs, looked up together
/// by the lookup stage (`encap::lookup`), in their order; the slots past `dsts` stay None.
/// The decrypted packets' deliveries and the CEs' packets share it.
fn lookup_hosts(
    t: &Tables,
    r: &Routes,
    dsts: &[(usize, IpAddr)],
) -> [Option<IpAddr>; overlay::BATCH] {
    let n = dsts.len().min(overlay::BATCH);
    let mut keys = [overlay::Key::new(overlay::VnetId(0), Ipv4Addr::UNSPECIFIED); overlay::BATCH];
    let mut found = [None; overlay::BATCH];
    let mut hosts = [None; overlay::BATCH];
    encap::lookup(
        t,
        r,
        &dsts[..n],
        &mut keys[..n],
        &mut found[..n],
        &mut hosts[..n],
    );
    hosts
}

/// Frames of an attachment lane's batch by their number in it: where the lookup stage finds
/// the packets it routes after the attach stage let go of them.
pub(crate) trait FrameSource {
    /// Frame `i`, if there is one.
    fn frame(&mut self, i: usize) -> Option<&mut [u8]>;
}

impl FrameSource for netio::packet::FrameBatch {
    fn frame(&mut self, i: usize) -> Option<&mut [u8]> {
        (i < self.frames().len()).then(|| self.frame_mut(i))
    }
}

/// A frame on its own, as frame 0 of a batch of one.
pub(crate) struct OneFrame<'a>(pub(crate) &'a mut [u8]);

impl FrameSource for OneFrame<'_> {
    fn frame(&mut self, i: usize) -> Option<&mut [u8]> {
        (i == 0).then_some(&mut *self.0)
    }
}

#[cfg(test)]
impl FrameSource for [Vec<u8>] {
    fn frame(&mut self, i: usize) -> Option<&mut [u8]> {
        self.get_mut(i).map(Vec::as_mut_slice)
    }
}

/// A CE's packet waiting in the lookup stage: its frame's number in the batch and what the
/// attach stage found.
struct CePending {
    frame: usize,
    to: attach::ToRoute,
}

/// The attachment lane's lookup stage: CEs' IP packets for a VM or the tunnels, by frame
/// number, waiting to be looked up together ([`route_from_ces`]), as the inbound path's
/// [`Deliveries`] do for decrypted packets.
pub(crate) struct CeLookups {
    items: [Option<CePending>; overlay::BATCH],
    len: usize,
}

impl CeLookups {
    /// An empty stage.
    pub(crate) fn new() -> Self {
        Self {
            items: std::array::from_fn(|_| None),
            len: 0,
        }
    }
}

/// A frame from a customer's edge router on attachment interface `iface`, number `index` of
/// its batch: the attach stage; a packet for a VM or the tunnels waits in `lookups`, which is
/// routed first if full ([`route_from_ces`]; the worker routes what is left at the end of the
/// batch).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attach<F: FrameSource + ?Sized>(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    r: &Routes,
    now: Instant,
    iface: usize,
    index: usize,
    frames: &mut F,
    lookups: &mut CeLookups,
) {
    let Some(frame) = frames.frame(index) else {
        // The worker passes numbers of its batch's frames only.
        return o.drop_packet(DropReason::AttachMalformed);
    };
    let Some(to) = attach::from_ce(o, sh, t, now, iface, frame) else {
        return;
    };
    if lookups.len == lookups.items.len() {
        route_from_ces(o, sh, t, r, now, frames, lookups);
    }
    lookups.items[lookups.len] = Some(CePending { frame: index, to });
    lookups.len += 1;
}

/// The lookup stage of the attachment lane: looks the routes of the waiting packets up in one
/// batch (per-VM entries prefetched, `encap::lookup`), then, in arrival order, sends each to
/// its VM ([`encap::deliver_routed`]) or, with no route and tunnels in its VNet, runs the
/// VNet's outbound chain, as a VM's packet goes, and holds it for the seal stage
/// ([`Out::ce_bound`], sealed by [`seal_from_ces`] in the order of the VNet's VTEP lane).
pub(crate) fn route_from_ces<F: FrameSource + ?Sized>(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    r: &Routes,
    now: Instant,
    frames: &mut F,
    lookups: &mut CeLookups,
) {
    let n = lookups.len;
    if n == 0 {
        return;
    }
    lookups.len = 0;
    let mut dsts = [(0, IpAddr::V4(Ipv4Addr::UNSPECIFIED)); overlay::BATCH];
    for (d, item) in dsts.iter_mut().zip(&lookups.items[..n]) {
        if let Some(p) = item {
            *d = (p.to.vnet, p.to.parsed.flow.dst);
        }
    }
    let hosts = lookup_hosts(t, r, &dsts[..n]);
    for (item, host) in lookups.items[..n].iter_mut().zip(hosts) {
        let Some(p) = item.take() else { continue };
        let Some(frame) = frames.frame(p.frame) else {
            o.drop_packet(DropReason::AttachMalformed);
            continue;
        };
        let to = p.to;
        if let Some(c) = o.charge.as_deref_mut() {
            c.switch(t.tenants.vnet(to.vnet), 1);
        }
        // The attach stage found the VNet in this snapshot, so its index is in it; were it not,
        // or the offset past the frame, there is nowhere to route the packet: no_route.
        let (Some(vnet), Some(pkt)) = (t.overlay.vnets.get(to.vnet), frame.get_mut(to.at)) else {
            o.drop_packet(DropReason::NoRoute);
            continue;
        };
        let tunnels = t.vnet_out.get(to.vnet).is_some_and(|c| !c.is_empty());
        if host.is_some() || !tunnels {
            // Toward the VNet: the tenant's inbound chain first, if it has one.
            if hold_for_vnet_chain(o, t, vnet, Direction::Inbound, pkt, Resume::CeToVnet) {
                continue;
            }
            encap::deliver_routed(o, sh, t, now, to.vnet, host, pkt, &to.parsed, || Ok(()));
            continue;
        }
        if hold_for_vnet_chain(o, t, vnet, Direction::Outbound, pkt, Resume::FromCe) {
            continue;
        }
        if !o.ce_bound.hold(vnet, pkt) {
            o.drop_packet(DropReason::TooBig);
        }
    }
}

/// Holds `pkt`, an IP packet of VNet `vnet`, for the chain of `direction` of the VNet's
/// tenant if it has one (`feature_hold_full` if the hold is full), to resume as `resume` says
/// at the end of the pass; false if there is no such chain. Outbound: on its way out, from a VM
/// or a CE; inbound: from a CE toward the VNet.
fn hold_for_vnet_chain(
    o: &mut Out,
    t: &Tables,
    vnet: &Arc<crate::vnet::Vnet>,
    direction: Direction,
    pkt: &mut [u8],
    resume: fn(Arc<crate::vnet::Vnet>) -> Resume,
) -> bool {
    let chain = match direction {
        Direction::Outbound => t.features.vnet_outbound(vnet.index),
        Direction::Inbound => t.features.vnet_inbound(vnet.index),
    };
    let Some(chain) = chain else {
        return false;
    };
    let meta = PacketMeta {
        tunnel: None,
        direction,
        inside: Inside::Vnet(vnet.index),
    };
    if !o.held.hold(chain, pkt, meta, resume(Arc::clone(vnet))) {
        o.drop_packet(DropReason::FeatureHoldFull);
    }
    true
}

/// A CE's packets held for the tunnels ([`Out::ce_bound`]) whose VNet is on a local VTEP that
/// `pick` accepts, to the seal stage in the order they were held: the CHILD_SA chosen among
/// the VNet's tunnels (`no_route` if none covers the packet), TTL, sequence number, queue.
/// The worker calls it under the dispatch stage of the VNet's VTEP lane.
pub(crate) fn seal_from_ces(o: &mut Out, sh: &Shared, t: &Tables, pick: impl FnMut(usize) -> bool) {
    if o.ce_bound.is_empty() {
        return;
    }
    let mut bound = std::mem::replace(&mut o.ce_bound, crate::out::CeBound::new(0));
    bound.take(pick, |vnet, pkt| {
        let Some(parsed) = InnerIp::parse(pkt) else {
            return o.drop_packet(DropReason::AttachMalformed);
        };
        if let Some(c) = o.charge.as_deref_mut() {
            c.switch(t.tenants.vnet(vnet.index), 1);
        }
        let len = parsed.len.min(pkt.len());
        let pkt = &mut pkt[..len];
        let no_tunnel = DropReason::NoRoute;
        if let Some(child) = seal::select_vnet(o, t, vnet, pkt, &parsed.flow, no_tunnel) {
            seal::queue(o, sh, child, pkt);
        }
    });
    o.ce_bound = bound;
}

/// A packet read from the TUN device: the outbound chain of the TUN tunnels' tenant, or
/// straight to seal.
pub(crate) fn tun(o: &mut Out, sh: &Shared, t: &Tables, pkt: &mut [u8]) {
    let (chain, same_tenant, len) = match t.features.tun_outbound() {
        TunChain::None => {
            if let Some((child, len)) = seal::select_tun(o, t, pkt) {
                if !o.tenant(child.tenant) {
                    return o.fair_share();
                }
                seal::queue(o, sh, child, &pkt[..len]);
            }
            return;
        }
        TunChain::One(chain) => {
            if o.charge.is_some() && !o.tenant(t.tenants.slot(chain.tenant())) {
                return o.fair_share();
            }
            let Some(parsed) = InnerIp::parse(pkt) else {
                return o.drop_packet(DropReason::TunMalformed);
            };
            (chain, false, parsed.len.min(pkt.len()))
        }
        TunChain::ByTunnel => {
            // Several tenants share the device: a first choice on the packet as read names
            // the tenant; the seal stage chooses again after the chain.
            let Some((child, len)) = seal::select_tun(o, t, pkt) else {
                return;
            };
            if !o.tenant(child.tenant) {
                return o.fair_share();
            }
            let Some(chain) = t.features.chain(child.tunnel, Direction::Outbound) else {
                return seal::queue(o, sh, child, &pkt[..len]);
            };
            (chain, true, len)
        }
    };
    let meta = PacketMeta {
        tunnel: None,
        direction: Direction::Outbound,
        inside: Inside::Tun,
    };
    if !o
        .held
        .hold(chain, &pkt[..len], meta, Resume::FromTun { same_tenant })
    {
        o.drop_packet(DropReason::FeatureHoldFull);
    }
}

/// Hands a classified datagram to its next stage.
#[allow(clippy::too_many_arguments)]
fn next<'p, 't>(
    o: &mut Out,
    sh: &Shared,
    t: &'t Tables,
    r: &Routes,
    now: Instant,
    class: Class,
    data: &'p mut [u8],
    d: &mut Deliveries<'p, 't>,
) {
    match class {
        Class::Esp {
            spi,
            local,
            src,
            at,
        } => {
            if let Some(esp) = data.get_mut(at) {
                from_peer(o, sh, t, r, now, (local, src), spi, esp, d);
            }
        }
        Class::Vxlan { via, src, at } => {
            if let Some(vx) = data.get_mut(at) {
                from_host(o, sh, t, r, now, via, src, vx);
            }
        }
        Class::Frame { iface, at } => {
            if let Some(frame) = data.get_mut(at) {
                attach_one(o, sh, t, r, now, iface, frame);
            }
        }
    }
}

/// One frame from a customer's edge router on port `iface` that arrived on its own (a
/// steer node's relayed frame, or an attachment lane's datagram outside a ring batch): the
/// attach stage, then the lookup stage for it alone.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attach_one(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    r: &Routes,
    now: Instant,
    iface: usize,
    frame: &mut [u8],
) {
    let mut lookups = CeLookups::new();
    let frame = &mut OneFrame(frame);
    attach(o, sh, t, r, now, iface, 0, frame, &mut lookups);
    route_from_ces(o, sh, t, r, now, frame, &mut lookups);
}

/// ESP from a peer: open, then the inbound chain or straight to encap. The replay window
/// accepts the packet when the batch holding its output is sent (see [`crate::accept`]).
#[allow(clippy::too_many_arguments)]
fn from_peer<'p, 't>(
    o: &mut Out,
    sh: &Shared,
    t: &'t Tables,
    r: &Routes,
    now: Instant,
    addrs: (SocketAddr, SocketAddr),
    spi: EspSpi,
    data: &'p mut [u8],
    d: &mut Deliveries<'p, 't>,
) {
    let Some((opened, inner)) = open::open(o, t, spi, addrs, data) else {
        return;
    };
    let fail = match inner {
        Ok(inner) => {
            let Some((pkt, parsed)) = open::admit(o, &opened, data, inner) else {
                d.flush(o, sh, t, r, now);
                o.defer_accept(o.mark(), opened.job(None));
                return;
            };
            let child = opened.child;
            if let Inside::Vnet(vnet) = child.inside {
                if t.features.chain(child.tunnel, Direction::Inbound).is_none() {
                    let delivery = Delivery {
                        opened,
                        pkt,
                        parsed,
                        vnet,
                    };
                    return d.push(o, sh, t, r, now, delivery);
                }
            }
            d.flush(o, sh, t, r, now);
            if let Some(chain) = t.features.chain(child.tunnel, Direction::Inbound) {
                let meta = PacketMeta {
                    tunnel: Some(child.tunnel),
                    direction: Direction::Inbound,
                    inside: child.inside.clone(),
                };
                let resume = Resume::Inbound {
                    child: Arc::clone(child),
                    packet: opened.packet,
                    local: opened.local,
                    src: opened.src,
                };
                if !o.held.hold(chain, pkt, meta, resume) {
                    o.drop_packet(DropReason::FeatureHoldFull);
                    o.defer_accept(o.mark(), opened.job(None));
                }
                return;
            }
            return to_inside(o, sh, t, r, now, &opened, pkt, &parsed, None);
        }
        Err(reason) => Some(reason),
    };
    d.flush(o, sh, t, r, now);
    o.defer_accept(o.mark(), opened.job(fail));
}

/// Hands an admitted inbound packet to its CHILD_SA's inside interface and records its
/// acceptance by the replay window, unless it was accepted early (to wait for neighbour
/// resolution outside the send batch). `host`: its route, if the lookup stage found it
/// already (None: looked up here).
#[allow(clippy::too_many_arguments)]
fn to_inside(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    r: &Routes,
    now: Instant,
    opened: &Opened<'_>,
    pkt: &mut [u8],
    parsed: &InnerIp,
    host: Option<Option<IpAddr>>,
) {
    let mark = o.mark();
    let mut accepted_early = false;
    match opened.child.inside {
        // Prefixes behind a customer's edge router attached to the VNet go there.
        Inside::Vnet(v)
            if !t.attach.by_vnet.is_empty()
                && attach::to_ce_of_vnet(o, sh, t, now, v, pkt, parsed) => {}
        Inside::Vnet(v) => {
            let accept_now = || {
                accepted_early = true;
                opened.accept_now(sh)
            };
            match host {
                Some(host) => {
                    encap::deliver_routed(o, sh, t, now, v, host, pkt, parsed, accept_now);
                }
                None => encap::deliver(o, sh, t, r, now, v, pkt, parsed, accept_now),
            }
        }
        Inside::Tun => encap::deliver_tun(o, sh, pkt),
    }
    if !accepted_early {
        o.defer_accept(mark, opened.job(None));
    }
}

/// VXLAN from a host: decap, then the VNet's L2 side (ARP/ND) or the way out through seal.
#[allow(clippy::too_many_arguments)]
fn from_host(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    r: &Routes,
    now: Instant,
    via: Via,
    src: SocketAddr,
    data: &mut [u8],
) {
    match decap::decap(o, t, r, via, src, data, now) {
        None => {}
        Some(Frame::Forward { to, vnet, flow }) => encap::send_on(o, sh, vnet, to, &flow, data),
        Some(Frame::Arp {
            vnet,
            host,
            dst_mac,
            at,
        }) => encap::arp(o, sh, vnet, r, host, now, dst_mac, &data[at]),
        Some(Frame::Nd {
            vnet,
            host,
            src_mac,
            dst_mac,
            at,
        }) => encap::nd(o, sh, vnet, r, host, now, src_mac, dst_mac, &data[at]),
        Some(Frame::Ip {
            vnet,
            host,
            src_mac,
            at,
            parsed,
        }) => {
            encap::learn_from_ip(o, sh, vnet, r, host, now, parsed.flow.src, src_mac);
            let pkt = &mut data[at];
            // Prefixes behind a customer's edge router attached to this VNet go there (one
            // branch when the VNet has no attachment), after the tenant's outbound chain if it
            // has one (then the source is checked here and the CE chosen at the chain's end).
            if !t.attach.by_vnet.is_empty() {
                if t.features.vnet_outbound(vnet.index).is_none() {
                    if attach::to_ce(o, sh, t, r, now, vnet, host, pkt, &parsed) {
                        return;
                    }
                } else if !attach::may_reach_ce(o, t, r, vnet, host, &parsed) {
                    return;
                }
            }
            if hold_for_vnet_chain(o, t, vnet, Direction::Outbound, pkt, Resume::FromVnet) {
                return;
            }
            let no_tunnel = DropReason::VxlanNoTunnel;
            if let Some(child) = seal::select_vnet(o, t, vnet, pkt, &parsed.flow, no_tunnel) {
                seal::queue(o, sh, child, pkt);
            }
        }
    }
}

/// Ends a pass over a lane batch: runs the feature chains over the packets held in it and
/// sends the survivors on (inbound to encap, outbound to seal), in the order they were held.
/// Nothing to do (one branch) when no packet was held.
pub(crate) fn end_pass(o: &mut Out, sh: &Shared, t: &Tables, r: &Routes, now: Instant) {
    if o.held.is_empty() {
        return;
    }
    let mut held = std::mem::replace(&mut o.held, crate::feature::Held::new(0));
    // The charge: each chain is a run of its tenant, measured even past the cap (its programs
    // may cost anything), and so is each packet's way on after it.
    let mut charge = o.charge.take();
    let worker = o.worker.unwrap_or(0);
    held.run(now, worker, |chain, _packets| {
        if let Some(c) = charge.as_deref_mut() {
            c.exact(t.tenants.slot(chain.tenant()));
        }
    });
    o.charge = charge;
    held.drain(|resume, chain, pkt, fate| match resume {
        Resume::Inbound {
            child,
            packet,
            local,
            src,
        } => {
            if let Some(c) = o.charge.as_deref_mut() {
                c.switch(child.tenant, 1);
            }
            let opened = Opened {
                child: &child,
                spi: child.inbound_spi,
                packet,
                local,
                src,
            };
            if fate != Fate::Pass {
                // Authentic either way: the replay window takes it.
                o.defer_accept(o.mark(), opened.job(None));
                if fate == Fate::Reflected {
                    reflect_inbound(o, sh, t, child.inside.clone(), pkt);
                }
                return;
            }
            // A stage may have rewritten the headers: parse again.
            match InnerIp::parse(pkt) {
                Some(parsed) => {
                    let len = parsed.len.min(pkt.len());
                    to_inside(o, sh, t, r, now, &opened, &mut pkt[..len], &parsed, None);
                }
                None => {
                    o.drop_packet(DropReason::InnerMalformed);
                    o.defer_accept(o.mark(), opened.job(None));
                }
            }
        }
        Resume::FromVnet(_) | Resume::FromCe(_) | Resume::CeToVnet(_) | Resume::FromTun { .. }
            if fate == Fate::Dropped => {}
        Resume::FromVnet(vnet) => {
            if let Some(c) = o.charge.as_deref_mut() {
                c.switch(t.tenants.vnet(vnet.index), 1);
            }
            // The seal stage chooses on the packet as the chain left it.
            let Some(parsed) = InnerIp::parse(pkt) else {
                return o.drop_packet(DropReason::VxlanMalformed);
            };
            let len = parsed.len.min(pkt.len());
            let pkt = &mut pkt[..len];
            if fate == Fate::Reflected {
                // Back into the VNet, toward the packet's (new) destination.
                if t.attach.by_vnet.is_empty()
                    || !attach::to_ce_of_vnet(o, sh, t, now, vnet.index, pkt, &parsed)
                {
                    encap::deliver(o, sh, t, r, now, vnet.index, pkt, &parsed, || Ok(()));
                }
                return;
            }
            // Behind one of the VNet's CEs (as the chain left the packet): there.
            if !t.attach.by_vnet.is_empty()
                && attach::to_ce_of_vnet(o, sh, t, now, vnet.index, pkt, &parsed)
            {
                return;
            }
            let no_tunnel = DropReason::VxlanNoTunnel;
            if let Some(child) = seal::select_vnet(o, t, &vnet, pkt, &parsed.flow, no_tunnel) {
                seal::queue(o, sh, child, pkt);
            }
        }
        Resume::CeToVnet(vnet) => {
            if let Some(c) = o.charge.as_deref_mut() {
                c.switch(t.tenants.vnet(vnet.index), 1);
            }
            let Some(parsed) = InnerIp::parse(pkt) else {
                return o.drop_packet(DropReason::AttachMalformed);
            };
            let len = parsed.len.min(pkt.len());
            let pkt = &mut pkt[..len];
            // Sent back (XDP_TX), or rewritten toward a CE of the VNet: to that CE.
            if attach::to_ce_of_vnet(o, sh, t, now, vnet.index, pkt, &parsed) {
                return;
            }
            if fate == Fate::Reflected {
                return o.drop_packet(DropReason::ReflectNoRoute);
            }
            encap::deliver(o, sh, t, r, now, vnet.index, pkt, &parsed, || Ok(()));
        }
        Resume::FromCe(vnet) => {
            // Held for the seal stage as the chain left it.
            let Some(parsed) = InnerIp::parse(pkt) else {
                return o.drop_packet(DropReason::AttachMalformed);
            };
            let len = parsed.len.min(pkt.len());
            if fate == Fate::Reflected {
                // Back to the CE it came from (the one its destination is behind now).
                if !attach::to_ce_of_vnet(o, sh, t, now, vnet.index, &mut pkt[..len], &parsed) {
                    o.drop_packet(DropReason::ReflectNoRoute);
                }
                return;
            }
            if !o.ce_bound.hold(&vnet, &pkt[..len]) {
                o.drop_packet(DropReason::TooBig);
            }
        }
        Resume::FromTun { .. } if fate == Fate::Reflected => encap::deliver_tun(o, sh, pkt),
        Resume::FromTun { same_tenant } => {
            let Some((child, len)) = seal::select_tun(o, t, pkt) else {
                return;
            };
            if same_tenant
                && !t
                    .features
                    .chain(child.tunnel, Direction::Outbound)
                    .is_some_and(|c| Arc::ptr_eq(c, chain))
            {
                // A tunnel of another tenant: tenant isolation.
                return o.drop_packet(DropReason::TunNoTunnel);
            }
            seal::queue(o, sh, child, &pkt[..len]);
        }
    });
    o.held = held;
}

/// A decrypted packet a feature stage sent back (a filter's `XDP_TX`): sealed into the
/// tunnels its inside interface's outbound traffic takes (the VNet's, chosen on the packet as
/// the stage left it, or the TUN device's), as a packet from the VNet would be.
///
/// A VNet's packet is held like a CE's for the tunnels ([`Out::ce_bound`]) and numbered in the
/// VNet's VTEP lane after this batch (`worker::to_vtep_lanes`), where the CHILD_SA's other
/// outbound packets are numbered, so the peer receives its sequence numbers in order. In relay
/// mode (one ordering domain, the relay lane, whose inbound pass runs after its stage) and for
/// the TUN device it is sealed here, in this batch: the peer may then see its sequence number
/// out of order with the CHILD_SA's other packets (within its replay window, accepted).
fn reflect_inbound(o: &mut Out, sh: &Shared, t: &Tables, inside: Inside, pkt: &mut [u8]) {
    let Some(parsed) = InnerIp::parse(pkt) else {
        return o.drop_packet(DropReason::InnerMalformed);
    };
    let len = parsed.len.min(pkt.len());
    let pkt = &mut pkt[..len];
    if let (Inside::Vnet(v), None) = (&inside, &sh.cfg.relay) {
        match t.overlay.vnets.get(*v) {
            Some(vnet) if !o.ce_bound.hold(vnet, pkt) => o.drop_packet(DropReason::TooBig),
            Some(_) => {}
            None => o.drop_packet(DropReason::ReflectNoRoute),
        }
        return;
    }
    let child = match inside {
        Inside::Vnet(v) => match t.overlay.vnets.get(v) {
            Some(vnet) => {
                seal::select_vnet(o, t, vnet, pkt, &parsed.flow, DropReason::ReflectNoRoute)
            }
            None => {
                o.drop_packet(DropReason::ReflectNoRoute);
                None
            }
        },
        Inside::Tun => seal::select_tun(o, t, pkt).map(|(child, _)| child),
    };
    if let Some(child) = child {
        seal::queue(o, sh, child, pkt);
    }
}
