//! The graph: which stage's output goes to which stage, per lane. The stages do not call each
//! other; this module runs them in order over a lane batch's packets (the worker calls one
//! entry point per datagram or TUN packet, then [`end_pass`]):
//!
//! ```text
//! NAT-T / relay ESP:  classify -> open -> [inbound chain] -> encap (VXLAN | TUN)
//! VTEP / relay VXLAN: classify -> decap -> ARP/ND: encap (answers)
//!                                       -> IP: [outbound chain] -> seal (select_vnet, queue)
//! TUN:                [outbound chain] -> seal (select_tun, queue)
//! attachment (L2):    attach (tags -> attachment; ARP/ND) -> encap (VNet route, VXLAN)
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

use super::attach;
use super::classify::{self, Class, Pass, Via};
use super::decap::{self, Frame};
use super::encap;
use super::open::{self, Opened};
use super::seal;
use crate::feature::{Direction, PacketMeta, TunChain};
use crate::inner::InnerIp;
use crate::out::{Out, Resume};
use crate::shared::Shared;
use crate::stats::DropReason;
use crate::tables::Tables;
use datapath::Inside;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use wire::EspSpi;

/// A datagram on the IKE socket `local` from `src`.
pub(crate) fn ike(o: &mut Out, sh: &Shared, local: SocketAddr, src: SocketAddr, data: &[u8]) {
    classify::ike(o, sh, local, src, data);
}

/// A datagram received on the NAT-T socket `local` from `src`.
pub(crate) fn natt(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    now: Instant,
    local: SocketAddr,
    src: SocketAddr,
    data: &mut [u8],
) {
    if let Some(class) = classify::natt(o, sh, local, src, data) {
        next(o, sh, t, now, class, data);
    }
}

/// A VXLAN datagram (UDP payload) from `src`.
pub(crate) fn vxlan(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    now: Instant,
    via: Via,
    src: SocketAddr,
    data: &mut [u8],
) {
    from_host(o, sh, t, now, via, src, data);
}

/// A Geneve frame received from `src` on the relay socket: the part of it that belongs to
/// `pass`.
pub(crate) fn relay(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    now: Instant,
    src: SocketAddr,
    data: &mut [u8],
    pass: Pass,
) {
    if let Some(class) = classify::relay(o, sh, t, now, src, data, pass) {
        next(o, sh, t, now, class, data);
    }
}

/// A frame from a customer's edge router on attachment interface `iface`.
pub(crate) fn attach(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    now: Instant,
    iface: usize,
    frame: &mut [u8],
) {
    attach::from_ce(o, sh, t, now, iface, frame);
}

/// A packet read from the TUN device: the outbound chain of the TUN tunnels' tenant, or
/// straight to seal.
pub(crate) fn tun(o: &mut Out, sh: &Shared, t: &Tables, pkt: &mut [u8]) {
    let (chain, same_tenant, len) = match t.features.tun_outbound() {
        TunChain::None => {
            if let Some((child, len)) = seal::select_tun(o, t, pkt) {
                seal::queue(o, sh, child, &pkt[..len]);
            }
            return;
        }
        TunChain::One(chain) => {
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
fn next(o: &mut Out, sh: &Shared, t: &Tables, now: Instant, class: Class, data: &mut [u8]) {
    match class {
        Class::Esp {
            spi,
            local,
            src,
            at,
        } => {
            if let Some(esp) = data.get_mut(at) {
                from_peer(o, sh, t, now, (local, src), spi, esp);
            }
        }
        Class::Vxlan { via, src, at } => {
            if let Some(vx) = data.get_mut(at) {
                from_host(o, sh, t, now, via, src, vx);
            }
        }
    }
}

/// ESP from a peer: open, then the inbound chain or straight to encap. The replay window
/// accepts the packet when the batch holding its output is sent (see [`crate::accept`]).
fn from_peer(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    now: Instant,
    addrs: (SocketAddr, SocketAddr),
    spi: EspSpi,
    data: &mut [u8],
) {
    let Some((opened, inner)) = open::open(o, t, spi, addrs, data) else {
        return;
    };
    let fail = match inner {
        Ok(inner) => {
            let Some((pkt, parsed)) = open::admit(o, &opened, data, inner) else {
                o.defer_accept(o.mark(), opened.job(None));
                return;
            };
            let child = opened.child;
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
            return to_inside(o, sh, t, now, &opened, pkt, &parsed);
        }
        Err(reason) => Some(reason),
    };
    o.defer_accept(o.mark(), opened.job(fail));
}

/// Hands an admitted inbound packet to its CHILD_SA's inside interface and records its
/// acceptance by the replay window, unless it was accepted early (to wait for neighbour
/// resolution outside the send batch).
fn to_inside(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    now: Instant,
    opened: &Opened<'_>,
    pkt: &mut [u8],
    parsed: &InnerIp,
) {
    let mark = o.mark();
    let mut accepted_early = false;
    match opened.child.inside {
        Inside::Vnet(v) => {
            let accept_now = || {
                accepted_early = true;
                opened.accept_now(sh)
            };
            encap::deliver(o, sh, t, now, v, pkt, parsed, accept_now);
        }
        Inside::Tun => encap::deliver_tun(o, sh, pkt),
    }
    if !accepted_early {
        o.defer_accept(mark, opened.job(None));
    }
}

/// VXLAN from a host: decap, then the VNet's L2 side (ARP/ND) or the way out through seal.
fn from_host(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    now: Instant,
    via: Via,
    src: SocketAddr,
    data: &mut [u8],
) {
    match decap::decap(o, t, via, src, data) {
        None => {}
        Some(Frame::Arp {
            vnet,
            host,
            dst_mac,
            at,
        }) => encap::arp(o, sh, vnet, host, now, dst_mac, &data[at]),
        Some(Frame::Nd {
            vnet,
            host,
            src_mac,
            dst_mac,
            at,
        }) => encap::nd(o, sh, vnet, host, now, src_mac, dst_mac, &data[at]),
        Some(Frame::Ip {
            vnet,
            host,
            src_mac,
            at,
            parsed,
        }) => {
            encap::learn_from_ip(o, sh, vnet, host, now, parsed.flow.src, src_mac);
            let pkt = &mut data[at];
            // Prefixes behind a customer's edge router attached to this VNet go there (one
            // branch when the VNet has no attachment).
            if !t.attach.by_vnet.is_empty()
                && attach::to_ce(o, sh, t, now, vnet, host, pkt, &parsed)
            {
                return;
            }
            if let Some(chain) = t.features.vnet_outbound(vnet.index) {
                let meta = PacketMeta {
                    tunnel: None,
                    direction: Direction::Outbound,
                    inside: Inside::Vnet(vnet.index),
                };
                if !o
                    .held
                    .hold(chain, pkt, meta, Resume::FromVnet(Arc::clone(vnet)))
                {
                    o.drop_packet(DropReason::FeatureHoldFull);
                }
                return;
            }
            if let Some(child) = seal::select_vnet(o, t, vnet, pkt, &parsed.flow) {
                seal::queue(o, sh, child, pkt);
            }
        }
    }
}

/// Ends a pass over a lane batch: runs the feature chains over the packets held in it and
/// sends the survivors on (inbound to encap, outbound to seal), in the order they were held.
/// Nothing to do (one branch) when no packet was held.
pub(crate) fn end_pass(o: &mut Out, sh: &Shared, t: &Tables, now: Instant) {
    if o.held.is_empty() {
        return;
    }
    let mut held = std::mem::replace(&mut o.held, crate::feature::Held::new(0));
    held.run(now);
    held.drain(|resume, chain, pkt, dropped| match resume {
        Resume::Inbound {
            child,
            packet,
            local,
            src,
        } => {
            let opened = Opened {
                child: &child,
                spi: child.inbound_spi,
                packet,
                local,
                src,
            };
            if dropped {
                return o.defer_accept(o.mark(), opened.job(None));
            }
            // A stage may have rewritten the headers: parse again.
            match InnerIp::parse(pkt) {
                Some(parsed) => {
                    let len = parsed.len.min(pkt.len());
                    to_inside(o, sh, t, now, &opened, &mut pkt[..len], &parsed);
                }
                None => {
                    o.drop_packet(DropReason::InnerMalformed);
                    o.defer_accept(o.mark(), opened.job(None));
                }
            }
        }
        Resume::FromVnet(_) | Resume::FromTun { .. } if dropped => {}
        Resume::FromVnet(vnet) => {
            // The seal stage chooses on the packet as the chain left it.
            let Some(parsed) = InnerIp::parse(pkt) else {
                return o.drop_packet(DropReason::VxlanMalformed);
            };
            let len = parsed.len.min(pkt.len());
            let pkt = &mut pkt[..len];
            if let Some(child) = seal::select_vnet(o, t, &vnet, pkt, &parsed.flow) {
                seal::queue(o, sh, child, pkt);
            }
        }
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
