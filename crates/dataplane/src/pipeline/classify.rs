//! The classify stage: tells what each received datagram is and where it goes next. Input: one
//! datagram (a GRO segment) of a lane's receive batch with the address it arrived on and its
//! source. Output: a [`Class`] naming the next stage (ESP to the open stage, VXLAN to the decap
//! stage) and where its payload lies in the datagram, or nothing when the datagram ends here:
//! IKE is handed to the control plane, NAT keepalives and malformed datagrams are counted as
//! drops, relay health probes are answered.
//!
//! On the NAT-T port (RFC 3948 §2): a zero first word is the non-ESP marker before an IKE
//! message, a single 0xFF is a NAT keepalive (dropped), anything else is ESP.
//!
//! Relay mode (the Geneve socket, see [`crate::relays`]), per frame:
//! - The outer source must be one of the steer nodes, else the frame is dropped
//!   (`relay_unknown_sender`) before anything else, probes included. A frame that does not
//!   parse is dropped (`relay_malformed`); one that does marks its steer node heard from.
//! - A health probe option is answered at once with a control frame (O flag, a probe reply
//!   option echoing the probe, no payload) to the sender: for idle control frames and for
//!   probes riding on data frames, whose datagram is then processed as well.
//! - A datagram to the NAT-T port goes the NAT-T way, in place, with the inner destination as
//!   the local address and the inner source as the peer: ESP is opened and delivered, NAT
//!   keepalives are consumed; IKE (the non-ESP marker) is not for a data node (`relay_ike`:
//!   steer nodes send it to the control node).
//! - A datagram to the VXLAN port goes the VXLAN way as if it had arrived on the VNet's VTEP
//!   from the inner source; the VNet is found by VNI alone ([`Via::Relay`]).
//! - Any other port: `relay_unexpected_port`.
//! - A customer's Ethernet frame (Protocol Type 0x6558 with the port option; issue 16's
//!   distributed form) goes to the attachment stage as if read from the port's ring, port
//!   = (sender, port id) (`attach_unknown_port` if no attachment is on it). In the serial
//!   pass: a CE's frames keep their order, and its packets for the tunnels are numbered under
//!   the relay lane's stage with the hosts' packets (one ordering domain per CHILD_SA).
//!
//! The Geneve lane carries both directions, so its batches are classified in two passes
//! ([`Pass`]): under the lane's dispatch stage, in arrival order, everything that is not ESP
//! (VXLAN from hosts is decapsulated and gets its ESP sequence numbers there, as on a VTEP
//! lane; probes are answered); after the stage is released, in parallel with other workers,
//! the ESP from peers (as on a NAT-T lane).

use crate::out::Out;
use crate::relays::RELAY_VNI;
use crate::shared::Shared;
use crate::stats::DropReason;
use crate::tables::Tables;
use datapath::{IkeDatagram, ToControl};
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Instant;
use wire::esp::{UdpEncap, NON_ESP_MARKER_LEN};
use wire::geneve::{GeneveBuilder, GeneveRepr, HealthProbe, ProtegoOption, GENEVE_HEADER_LEN};
use wire::relay::{self as frame, RelayFrame};
use wire::EspSpi;

/// How a VXLAN datagram reached us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// On the socket of local VTEP (index).
    Vtep(usize),
    /// Relayed by a steer node (relay mode).
    Relay,
}

/// Where a classified datagram goes next; `at` is its payload's range in the datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Class {
    /// ESP (starting at the SPI) for the open stage.
    Esp {
        /// Its SPI.
        spi: EspSpi,
        /// Where it arrived (relay mode: the relayed datagram's inner destination).
        local: SocketAddr,
        /// Where it came from (relay mode: the inner source).
        src: SocketAddr,
        /// The ESP packet.
        at: Range<usize>,
    },
    /// A customer's tagged Ethernet frame (relay mode) for the attachment stage.
    Frame {
        /// Its port's index among the attachments' steer ports
        /// (`attach::AttachTable::steer_ports`).
        iface: usize,
        /// The frame.
        at: Range<usize>,
    },
    /// VXLAN for the decap stage.
    Vxlan {
        /// How it reached us.
        via: Via,
        /// The sending host (relay mode: the inner source).
        src: SocketAddr,
        /// The VXLAN header and frame.
        at: Range<usize>,
    },
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

/// An IKE message (marker removed) for the control plane.
pub(crate) fn ike(o: &mut Out, sh: &Shared, local: SocketAddr, remote: SocketAddr, msg: &[u8]) {
    if !sh.tell_control(ToControl::Ike(IkeDatagram {
        local,
        remote,
        data: msg.to_vec(),
    })) {
        o.drop_packet(DropReason::IkeQueue);
    }
}

/// A datagram received on the NAT-T socket `local` from `src`.
pub(crate) fn natt(
    o: &mut Out,
    sh: &Shared,
    local: SocketAddr,
    src: SocketAddr,
    data: &[u8],
) -> Option<Class> {
    match UdpEncap::classify(data) {
        // No tenant's: charged to none (not to the tenant of the packet before).
        Err(_) => {
            o.no_tenant();
            o.drop_packet(DropReason::MalformedUdp)
        }
        Ok(UdpEncap::NatKeepalive) => {
            o.no_tenant();
            o.drop_packet(DropReason::NattKeepalive)
        }
        Ok(UdpEncap::Ike) => {
            o.no_tenant();
            ike(o, sh, local, src, &data[NON_ESP_MARKER_LEN..])
        }
        Ok(UdpEncap::Esp(spi)) => {
            return Some(Class::Esp {
                spi,
                local,
                src,
                at: 0..data.len(),
            })
        }
    }
    None
}

/// A Geneve frame received from `src` on the relay socket (one GRO segment): the part of it
/// that belongs to `pass`. Every frame is counted once, in the serial pass.
pub(crate) fn relay(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    now: Instant,
    src: SocketAddr,
    data: &[u8],
    pass: Pass,
) -> Option<Class> {
    let serial = pass != Pass::Parallel;
    let sender = t
        .relays
        .as_deref()
        .and_then(|r| r.index(src).map(|i| (r, i)));
    let Some((relays, steer)) = sender else {
        if serial {
            o.drop_packet(DropReason::RelayUnknownSender);
        }
        return None;
    };
    let f = match frame::parse_frame(data) {
        Ok(f) => f,
        Err(_) => {
            if serial {
                o.drop_packet(DropReason::RelayMalformed);
            }
            return None;
        }
    };
    let mut class = None;
    if serial {
        // The steer node is alive: it may take the output (`Relays::output`).
        relays.heard(steer, now);
        class = in_order(o, sh, t, src, &f, data);
    }
    if pass != Pass::Serial && class.is_none() {
        class = esp_in(o, sh, &f, data);
    }
    class
}

/// The serial part: probes, control frames, VXLAN, and the drops of what no pass takes.
fn in_order(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    src: SocketAddr,
    f: &RelayFrame,
    data: &[u8],
) -> Option<Class> {
    if let Some(probe) = f.probe {
        answer(o, sh, src, probe);
    }
    if f.control {
        // RFC 8926 §3.4: a control frame's payload is never forwarded.
        if f.probe.is_none() {
            o.drop_packet(DropReason::RelayControl);
        }
        return None;
    }
    if let (Some(port), Some(at)) = (f.port, &f.ethernet) {
        let Some(iface) = t.attach.table.steer_port(src, port) else {
            o.drop_packet(DropReason::AttachUnknownPort);
            return None;
        };
        if data.get(at.clone()).is_none() {
            o.drop_packet(DropReason::RelayMalformed);
            return None;
        }
        return Some(Class::Frame {
            iface,
            at: at.clone(),
        });
    }
    let Some(d) = &f.datagram else {
        o.drop_packet(DropReason::RelayMalformed);
        return None;
    };
    let port = d.dst.port();
    if port == sh.cfg.natt_port {
        // ESP: the parallel pass.
        None
    } else if port == sh.cfg.vxlan_port {
        if data.get(d.payload.clone()).is_none() {
            o.drop_packet(DropReason::RelayMalformed);
            return None;
        }
        Some(Class::Vxlan {
            via: Via::Relay,
            src: d.src,
            at: d.payload.clone(),
        })
    } else {
        o.drop_packet(DropReason::RelayUnexpectedPort);
        None
    }
}

/// The parallel part: a datagram to the NAT-T port, as if received on a NAT-T socket.
fn esp_in(o: &mut Out, sh: &Shared, f: &RelayFrame, data: &[u8]) -> Option<Class> {
    let d = f.datagram.as_ref().filter(|_| !f.control)?;
    if d.dst.port() != sh.cfg.natt_port {
        return None;
    }
    let Some(payload) = data.get(d.payload.clone()) else {
        o.drop_packet(DropReason::RelayMalformed);
        return None;
    };
    match UdpEncap::classify(payload) {
        Err(_) => o.drop_packet(DropReason::MalformedUdp),
        Ok(UdpEncap::NatKeepalive) => o.drop_packet(DropReason::NattKeepalive),
        Ok(UdpEncap::Ike) => o.drop_packet(DropReason::RelayIke),
        Ok(UdpEncap::Esp(spi)) => {
            return Some(Class::Esp {
                spi,
                local: d.dst,
                src: d.src,
                at: d.payload.clone(),
            })
        }
    }
    None
}

/// Answers a health probe from `to`: a control frame with the probe echoed, no payload.
fn answer(o: &mut Out, sh: &Shared, to: SocketAddr, probe: HealthProbe) {
    let Some(sock) = sh.io.relay_sock else {
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
