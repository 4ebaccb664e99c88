//! Relay mode (DESIGN.md §2): the node sits behind steer nodes, which own the public address
//! (VIP) and forward to it, inside Geneve (RFC 8926, UDP 6081), the whole IP/UDP datagram a
//! peer or a cloud host sent to the VIP (`wire::relay`).
//!
//! Receive, per frame from the Geneve socket:
//! - The outer source must be one of the steer nodes ([`Relays`]), else the frame is dropped
//!   (`relay_unknown_sender`) before anything else, probes included. A frame that does not
//!   parse is dropped (`relay_malformed`).
//! - A health probe option is answered at once with a control frame (O flag, a probe reply
//!   option echoing the probe, no payload) to the sender: for idle control frames and for
//!   probes riding on data frames, whose datagram is then processed as well.
//! - A datagram to the NAT-T port goes the NAT-T way ([`super::underlay::esp`]), in place, with
//!   the inner destination as the local address and the inner source as the peer: ESP is
//!   opened and delivered, NAT keepalives are consumed; IKE (the non-ESP marker) is not for a
//!   data node (`relay_ike`: steer nodes send it to the control node).
//! - A datagram to the VXLAN port goes the VXLAN way ([`super::vxlan::receive`]) as if it had
//!   arrived on the VNet's VTEP from the inner source; the VNet is found by VNI alone.
//! - Any other port: `relay_unexpected_port`.
//!
//! The Geneve lane carries both directions, so its batches are processed in two passes
//! ([`Pass`]): under the lane's dispatch stage, in arrival order, everything that is not ESP
//! (VXLAN from hosts is classified and gets its ESP sequence numbers there, as on a VTEP
//! lane; probes are answered); after the stage is released, in parallel with other workers,
//! the ESP from peers (as on a NAT-T lane).
//!
//! Send: ESP toward a peer leaves the Geneve socket to the first steer node as
//! Geneve (8 bytes, no options, VNI 0, Protocol Type of the inner family) + IP/UDP
//! (the CHILD_SA's local address, the VIP, to the peer) + ESP; see [`write_headers`] and
//! `seal`. VXLAN toward hosts leaves from the VTEP directly.

use super::underlay;
use super::vxlan::{self, Via};
use crate::shared::{Out, Shared};
use crate::stats::DropReason;
use crate::tables::Tables;
use std::net::SocketAddr;
use std::time::Instant;
use wire::error::WireError;
use wire::esp::{UdpEncap, NON_ESP_MARKER_LEN};
use wire::geneve::{GeneveBuilder, GeneveRepr, HealthProbe, ProtegoOption, GENEVE_HEADER_LEN};
use wire::relay::{self as frame, RelayFrame};
use wire::vxlan::Vni;

/// The VNI of the frames the data node sends (the relay hop carries no tenant network).
const RELAY_VNI: Vni = match Vni::new(0) {
    Some(v) => v,
    None => panic!("0 fits in 24 bits"),
};

/// The steer nodes: the senders accepted on the Geneve socket, and where datagrams toward
/// peers go (the first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Relays {
    steer: Vec<SocketAddr>,
}

impl Relays {
    /// The steer nodes' Geneve addresses (validated by the caller).
    pub(crate) fn new(steer: Vec<SocketAddr>) -> Self {
        Self { steer }
    }

    /// True if frames from `src` are accepted.
    #[inline]
    pub(crate) fn accepts(&self, src: SocketAddr) -> bool {
        self.steer.contains(&src)
    }

    /// Where datagrams toward peers go (None: no steer node is known).
    #[inline]
    pub(crate) fn output(&self) -> Option<SocketAddr> {
        self.steer.first().copied()
    }

    /// The addresses, in order.
    pub(crate) fn steer(&self) -> &[SocketAddr] {
        &self.steer
    }
}

/// Bytes in front of the UDP payload of a datagram sent to a steer node: the Geneve header
/// (no options) and the inner IP and UDP headers of this family.
pub(crate) const fn prefix_len(ipv6: bool) -> usize {
    GENEVE_HEADER_LEN + frame::header_len(ipv6)
}

/// Writes the relay headers in front of a datagram toward a peer: `buf` holds
/// [`prefix_len`] bytes of room, then the `payload_len`-byte UDP payload (already final: the
/// inner IPv6 UDP checksum covers it). `local` (the VIP) and `remote` (the peer) must be of
/// one family.
pub(crate) fn write_headers(
    buf: &mut [u8],
    local: SocketAddr,
    remote: SocketAddr,
    payload_len: usize,
) -> Result<(), WireError> {
    let repr = GeneveRepr {
        control: false,
        protocol_type: frame::protocol_type(remote.is_ipv6()),
        vni: RELAY_VNI,
    };
    let start = GeneveBuilder::new(buf, &repr)?.finish();
    let rest = buf.get_mut(start..).ok_or(WireError::Malformed {
        what: "relayed datagram",
        field: "length",
    })?;
    frame::emit_header(rest, local, remote, payload_len, 0)?;
    Ok(())
}

/// Which part of a relay batch to process (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Everything, in one go (tests; a caller without a dispatch stage).
    All,
    /// Under the dispatch stage: drops, probes, VXLAN (sequence numbers in arrival order).
    Serial,
    /// After the dispatch stage: ESP from peers.
    Parallel,
}

/// A Geneve frame received from `src` on the relay socket (one GRO segment): the part of it
/// that belongs to `pass`. Every frame is counted once, in the serial pass.
pub(crate) fn receive(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    now: Instant,
    src: SocketAddr,
    data: &mut [u8],
    pass: Pass,
) {
    let serial = pass != Pass::Parallel;
    let known = t.relays.as_deref().is_some_and(|r| r.accepts(src));
    if !known {
        if serial {
            o.drop_packet(DropReason::RelayUnknownSender);
        }
        return;
    }
    let f = match frame::parse_frame(data) {
        Ok(f) => f,
        Err(_) => {
            if serial {
                o.drop_packet(DropReason::RelayMalformed);
            }
            return;
        }
    };
    if serial {
        in_order(o, sh, t, now, src, &f, data);
    }
    if pass != Pass::Serial {
        esp_in(o, sh, t, now, &f, data);
    }
}

/// The serial part: probes, control frames, VXLAN, and the drops of what no pass takes.
fn in_order(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    now: Instant,
    src: SocketAddr,
    f: &RelayFrame,
    data: &mut [u8],
) {
    if let Some(probe) = f.probe {
        answer(o, sh, src, probe);
    }
    if f.control {
        // RFC 8926 §3.4: a control frame's payload is never forwarded.
        if f.probe.is_none() {
            o.drop_packet(DropReason::RelayControl);
        }
        return;
    }
    let Some(d) = &f.datagram else {
        return o.drop_packet(DropReason::RelayMalformed);
    };
    let port = d.dst.port();
    if port == sh.cfg.natt_port {
        // ESP: the parallel pass.
    } else if port == sh.cfg.vxlan_port {
        let Some(payload) = data.get_mut(d.payload.clone()) else {
            return o.drop_packet(DropReason::RelayMalformed);
        };
        vxlan::receive(o, sh, t, now, Via::Relay, d.src, payload);
    } else {
        o.drop_packet(DropReason::RelayUnexpectedPort);
    }
}

/// The parallel part: a datagram to the NAT-T port, as if received on a NAT-T socket.
fn esp_in(o: &mut Out, sh: &Shared, t: &Tables, now: Instant, f: &RelayFrame, data: &mut [u8]) {
    let Some(d) = f.datagram.as_ref().filter(|_| !f.control) else {
        return;
    };
    if d.dst.port() != sh.cfg.natt_port {
        return;
    }
    let Some(payload) = data.get_mut(d.payload.clone()) else {
        return o.drop_packet(DropReason::RelayMalformed);
    };
    match UdpEncap::classify(payload) {
        Err(_) => o.drop_packet(DropReason::MalformedUdp),
        Ok(UdpEncap::NatKeepalive) => o.drop_packet(DropReason::NattKeepalive),
        Ok(UdpEncap::Ike) => o.drop_packet(DropReason::RelayIke),
        Ok(UdpEncap::Esp(spi)) => underlay::esp(o, sh, t, now, (d.dst, d.src), spi, payload),
    }
}

/// Answers a health probe from `to`: a control frame with the probe echoed, no payload.
fn answer(o: &mut Out, sh: &Shared, to: SocketAddr, probe: HealthProbe) {
    let Some(sock) = sh.relay_sock else {
        return;
    };
    let reply = ProtegoOption::ProbeReply(probe);
    let len = GENEVE_HEADER_LEN + reply.buffer_len();
    let Some(room) = o.room(sh, len) else {
        return;
    };
    let repr = GeneveRepr {
        control: true,
        protocol_type: frame::protocol_type(to.is_ipv6()),
        vni: RELAY_VNI,
    };
    let written = GeneveBuilder::new(room, &repr).and_then(|mut b| {
        b.push_protego(&reply)?;
        Ok(b.finish())
    });
    match written {
        Ok(n) => {
            o.tx.commit(sock, to, n);
            o.probes_answered += 1;
        }
        // The room was sized for it: cannot happen.
        Err(_) => o.drop_packet(DropReason::TooBig),
    }
}

/// Builds a relay frame carrying an IKE message or NAT keepalive from `local` (a VIP) to
/// `remote` (the control plane's slow path, [`crate::DataPath::send_ike`] in relay mode): the
/// non-ESP marker is added on the NAT-T port except before a keepalive (RFC 3948 §2.2, §2.3).
pub(crate) fn ike_frame(
    local: SocketAddr,
    remote: SocketAddr,
    marker: bool,
    payload: &[u8],
) -> Result<Vec<u8>, WireError> {
    let mut datagram = Vec::with_capacity(NON_ESP_MARKER_LEN + payload.len());
    if marker {
        datagram.extend_from_slice(&wire::esp::NON_ESP_MARKER);
    }
    datagram.extend_from_slice(payload);
    let mut buf = vec![0u8; prefix_len(remote.is_ipv6()) + datagram.len()];
    let n = frame::emit_frame(&mut buf, RELAY_VNI, &[], local, remote, &datagram)?;
    buf.truncate(n);
    Ok(buf)
}

#[cfg(test)]
mod tests;
