//! The ESP seal stage. Input: an inner packet from the inside interface (decapsulated from a
//! VNet's VXLAN, sent by a CE attached to a VNet, or read from the TUN device); output: an ESP-in-UDP datagram committed to the
//! send batch, or a counted drop. The tenant's outbound feature chain, if any, has already
//! run: the stage sees the packet as the chain left it. First the CHILD_SA is chosen
//! ([`select_vnet`], [`select_tun`]: the first whose negotiated selectors cover the packet,
//! among the tunnels of that VNet only — tenant isolation — or among the TUN tunnels; a VNet
//! packet is forwarded, its TTL decremented, RFC 1812 §5.3.1); then [`queue`] seals.
//!
//! Outbound ESP (RFC 4303 §3.3) in UDP (RFC 3948 §2.1), in two steps. At dispatch, in the
//! lane's arrival order: a sequence number is allocated (§3.3.3: never reused, never cycled)
//! and the inner packet is copied into the send batch behind room for the ESP header and
//! IV, its exact ESP length committed, so consecutive packets to the same peer still form
//! GSO trains. Later, on the worker's core, every queued packet is sealed in place
//! ([`Out::seal_queued`]). The peer therefore receives a
//! tunnel's sequence numbers in order even though several cores encrypt its packets. Near
//! sequence number exhaustion the control plane is asked once to rekey (§3.3.3).
//!
//! In relay mode the datagram goes to a steer node instead of the peer: room for the Geneve,
//! IP and UDP headers is reserved in front of the ESP packet here and the headers written
//! when it is sealed ([`relays::write_headers`]), so every segment of a GSO train
//! toward the steer node carries its own relay headers.

use crate::inner::{self, InnerIp};
use crate::out::{Egress, Out};
use crate::relays;
use crate::shared::Shared;
use crate::stats::DropReason;
use crate::tables::{Child, Tables};
use crate::vnet::Vnet;
use datapath::ToControl;
use std::sync::Arc;
use wire::flow::Flow;

/// The largest UDP payload over IPv4 (65535 - 20 - 8); IPv6 allows 20 more, we keep one limit.
const MAX_UDP_PAYLOAD: usize = 65507;

/// The CHILD_SA for an IP packet (`flow`) of `vnet` to the gateway (from one of its VMs, or
/// from a CE attached to it), among the VNet's tunnels only; the packet's TTL / hop limit is
/// decremented for forwarding. A packet no tunnel covers is counted as `no_tunnel`
/// (`vxlan_no_tunnel` for a VM's, `no_route` for a CE's).
pub(crate) fn select_vnet<'t>(
    o: &mut Out,
    t: &'t Tables,
    vnet: &Vnet,
    pkt: &mut [u8],
    flow: &Flow,
    no_tunnel: DropReason,
) -> Option<&'t Arc<Child>> {
    if vnet.is_gateway(flow.dst) {
        o.drop_packet(DropReason::ToGateway);
        return None;
    }
    // Tenant isolation: only this VNet's tunnels are candidates.
    let Some(child) = t
        .vnet_out
        .get(vnet.index)
        .and_then(|c| Tables::select(c, flow))
    else {
        o.drop_packet(no_tunnel);
        return None;
    };
    if !inner::decrement_hop(pkt) {
        o.drop_packet(DropReason::TtlExceeded);
        return None;
    }
    Some(child)
}

/// The CHILD_SA among the TUN tunnels for a packet read from the TUN device, and the packet's
/// own length (what follows it is not sent).
pub(crate) fn select_tun<'t>(
    o: &mut Out,
    t: &'t Tables,
    pkt: &[u8],
) -> Option<(&'t Arc<Child>, usize)> {
    let Some(parsed) = InnerIp::parse(pkt) else {
        o.drop_packet(DropReason::TunMalformed);
        return None;
    };
    let Some(child) = Tables::select(&t.tun_out, &parsed.flow) else {
        o.drop_packet(DropReason::TunNoTunnel);
        return None;
    };
    Some((child, parsed.len))
}

/// Queues `pkt` (a whole IPv4 or IPv6 packet) for sealing with the CHILD_SA's outbound SA
/// and sending to the peer.
pub(crate) fn queue(o: &mut Out, sh: &Shared, child: &Child, pkt: &[u8]) {
    let sa = &child.state.sa;
    let header = sa.header_len();
    let len = sa.sealed_len(pkt.len());
    let egress = match egress(o, sh, child) {
        Ok(e) => e,
        Err(reason) => return o.drop_packet(reason),
    };
    let total = egress.prefix + len;
    if total > MAX_UDP_PAYLOAD {
        o.drop_packet(DropReason::TooBig);
        return;
    }
    // Room first: a packet that cannot be sent must not use a sequence number.
    if o.room(sh, total).is_none() {
        return;
    }
    let seq = match sa.allocate_seq() {
        Ok(seq) => seq,
        Err(e) => {
            tracing::debug!(tunnel = child.tunnel.0, spi = %child.outbound_spi, local = %child.local, error = %e, "cannot seal");
            o.drop_packet(DropReason::EspSeal);
            return;
        }
    };
    let Some(room) = o.room(sh, total) else {
        return;
    };
    let at = egress.prefix + header;
    room[at..at + pkt.len()].copy_from_slice(pkt);
    o.queue_seal(child, egress, len, pkt.len(), seq);
    if sa.rekey_due() && child.state.take_rekey_request() {
        tracing::info!(tunnel = child.tunnel.0, spi = %child.inbound_spi, "outbound sequence numbers nearly exhausted; asking for a rekey");
        if !sh.tell_control(ToControl::RekeyNeeded(child.inbound_spi)) {
            // The control queue is full: ask again with a later packet.
            child.state.retry_rekey_request();
            tracing::warn!(tunnel = child.tunnel.0, spi = %child.inbound_spi, "control plane did not take the rekey request");
        }
    }
}

/// Where the CHILD_SA's ESP goes: from its NAT-T socket to the peer, or in relay mode from
/// the Geneve socket (its `sock` then) to the current steer node, behind relay headers.
fn egress(o: &Out, sh: &Shared, child: &Child) -> Result<Egress, DropReason> {
    if sh.io.relay_sock.is_none() {
        return Ok(Egress {
            sock: child.sock,
            dst: child.remote,
            prefix: 0,
        });
    }
    let dst = o.relay_output().ok_or(DropReason::RelayNoSteer)?;
    Ok(Egress {
        sock: child.sock,
        dst,
        prefix: relays::prefix_len(child.remote.is_ipv6()),
    })
}
