//! The datagram a steer node relays inside Geneve (docs/architecture.md, "The picture"): the whole IPv4 or IPv6
//! packet with its UDP header, so the node behind the steer node sees the peer's address and
//! port, and the steer node sees where to send an answer from and to.
//!
//! - Steer to data or control node: the packet a peer (or a cloud host) sent to the VIP,
//!   rebuilt by the steer node from what its socket received (source, destination, payload).
//! - Data or control node to steer node: the packet to send from the VIP; the steer node
//!   sends its UDP payload from the inner source address and port to the inner destination.
//! - Either way, for a customer's edge router attached at L2: the Ethernet frame as it is on
//!   the customer's link, VLAN tags included, with the customer-facing port it came in on or
//!   is to go out of ([`emit_l2_frame`]; Protocol Type 0x6558 and a port option, VNI 0).
//!
//! Only what Protego builds is accepted: no IPv4 options or fragments, no IPv6 extension
//! headers, UDP only. The IPv4 header checksum is always filled and checked; the inner UDP
//! checksum is optional for IPv4 (zero) and filled for IPv6 (RFC 8200 §8.1), and never
//! verified by the receiver (the outer Geneve datagram's UDP checksum covers the whole relay
//! hop).

use core::ops::Range;
use std::net::{IpAddr, SocketAddr};

use crate::error::WireError;
use crate::ethernet::{EtherType, ETHERNET_HEADER_LEN};
use crate::field::{need, room};
use crate::geneve::{
    GeneveOption, GenevePacket, GeneveRepr, HealthProbe, ProtegoOption, GENEVE_HEADER_LEN,
    PROTOCOL_ETHERNET,
};
use crate::ip::{IpProtocol, Ipv4Packet, Ipv4Repr, Ipv6Packet, Ipv6Repr};
use crate::ip::{IPV4_HEADER_LEN, IPV6_HEADER_LEN};
use crate::udp::{UdpChecksum, UdpPacket, UdpRepr, UDP_HEADER_LEN};
use crate::vxlan::Vni;

/// Hop limit of relayed packets (they never cross a router as such: the steer node sends
/// only their payload).
const HOP_LIMIT: u8 = 64;

const fn malformed(field: &'static str) -> WireError {
    WireError::Malformed {
        what: "relayed datagram",
        field,
    }
}

/// A relayed UDP datagram: its addresses and where its payload lies in the packet.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RelayedDatagram {
    /// Inner source address and port.
    pub src: SocketAddr,
    /// Inner destination address and port.
    pub dst: SocketAddr,
    /// The UDP payload's range within the packet given to [`parse`].
    pub payload: Range<usize>,
}

/// Reads an IPv4 or IPv6 packet carrying one whole UDP datagram. Trailing bytes after the
/// IP packet's length are ignored (as on a link with padding).
pub fn parse(packet: &[u8]) -> Result<RelayedDatagram, WireError> {
    need("relayed datagram", packet.len(), 1)?;
    let (src, dst, udp_start, ip_end) = match packet[0] >> 4 {
        4 => {
            let p = Ipv4Packet::new_checked(packet)?;
            let repr = Ipv4Repr::parse(&p)?;
            if p.header_len() != IPV4_HEADER_LEN {
                return Err(malformed("ipv4 options"));
            }
            if p.is_fragment() {
                return Err(malformed("ipv4 fragment"));
            }
            if repr.protocol != IpProtocol::UDP {
                return Err(malformed("protocol"));
            }
            (
                IpAddr::V4(repr.src_addr),
                IpAddr::V4(repr.dst_addr),
                IPV4_HEADER_LEN,
                IPV4_HEADER_LEN + repr.payload_len,
            )
        }
        6 => {
            let p = Ipv6Packet::new_checked(packet)?;
            let repr = Ipv6Repr::parse(&p)?;
            if repr.next_header != IpProtocol::UDP {
                return Err(malformed("next header"));
            }
            (
                IpAddr::V6(repr.src_addr),
                IpAddr::V6(repr.dst_addr),
                IPV6_HEADER_LEN,
                IPV6_HEADER_LEN + repr.payload_len,
            )
        }
        _ => return Err(malformed("version")),
    };
    let ip_end = ip_end.min(packet.len());
    let udp = UdpPacket::new_checked(&packet[udp_start..ip_end])?;
    let repr = UdpRepr::parse(&udp)?;
    let payload = udp_start + UDP_HEADER_LEN..udp_start + UDP_HEADER_LEN + repr.payload_len;
    Ok(RelayedDatagram {
        src: SocketAddr::new(src, repr.src_port),
        dst: SocketAddr::new(dst, repr.dst_port),
        payload,
    })
}

/// Length of the IP and UDP headers [`emit_header`] writes for this address family.
pub const fn header_len(ipv6: bool) -> usize {
    if ipv6 {
        IPV6_HEADER_LEN + UDP_HEADER_LEN
    } else {
        IPV4_HEADER_LEN + UDP_HEADER_LEN
    }
}

/// The Geneve Protocol Type of a relayed packet of this family (0x0800 or 0x86DD).
pub const fn protocol_type(ipv6: bool) -> EtherType {
    if ipv6 {
        EtherType::IPV6
    } else {
        EtherType::IPV4
    }
}

/// Writes the IP and UDP headers of a datagram from `src` to `dst` into
/// `buf[..header_len]`, with its `payload_len` bytes of payload already at
/// `buf[header_len..]` (an IPv6 UDP checksum covers them; IPv4 sends a zero UDP checksum).
/// Returns the header length. `src` and `dst` must be of one family; `ident` is the IPv4
/// Identification.
pub fn emit_header(
    buf: &mut [u8],
    src: SocketAddr,
    dst: SocketAddr,
    payload_len: usize,
    ident: u16,
) -> Result<usize, WireError> {
    let udp_len = UDP_HEADER_LEN + payload_len;
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            room("relayed datagram", buf.len(), IPV4_HEADER_LEN + udp_len)?;
            Ipv4Repr {
                src_addr: s,
                dst_addr: d,
                protocol: IpProtocol::UDP,
                payload_len: udp_len,
                ttl: HOP_LIMIT,
                dscp: 0,
                ecn: 0,
                ident,
                dont_frag: true,
            }
            .emit(buf)?;
            udp(src, dst, payload_len).emit(&mut buf[IPV4_HEADER_LEN..], UdpChecksum::Zero)?;
            Ok(IPV4_HEADER_LEN + UDP_HEADER_LEN)
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            room("relayed datagram", buf.len(), IPV6_HEADER_LEN + udp_len)?;
            Ipv6Repr {
                src_addr: s,
                dst_addr: d,
                next_header: IpProtocol::UDP,
                payload_len: udp_len,
                hop_limit: HOP_LIMIT,
                traffic_class: 0,
                flow_label: 0,
            }
            .emit(buf)?;
            udp(src, dst, payload_len).emit(
                &mut buf[IPV6_HEADER_LEN..],
                UdpChecksum::V6 { src: s, dst: d },
            )?;
            Ok(IPV6_HEADER_LEN + UDP_HEADER_LEN)
        }
        _ => Err(malformed("address family")),
    }
}

fn udp(src: SocketAddr, dst: SocketAddr, payload_len: usize) -> UdpRepr {
    UdpRepr {
        src_port: src.port(),
        dst_port: dst.port(),
        payload_len,
    }
}

/// Writes a whole Geneve relay frame into `buf`: the Geneve header (`vni`, Protocol Type of
/// the family, `options`), then the IP and UDP headers from `src` to `dst`, then `payload`.
/// Returns the frame's length. For the slow paths (IKE, probes, the steer node); the data
/// path writes its headers around payloads already in place with [`emit_header`].
pub fn emit_frame(
    buf: &mut [u8],
    vni: Vni,
    options: &[ProtegoOption],
    src: SocketAddr,
    dst: SocketAddr,
    payload: &[u8],
) -> Result<usize, WireError> {
    let repr = GeneveRepr {
        control: false,
        protocol_type: protocol_type(src.is_ipv6()),
        vni,
    };
    let mut builder = crate::geneve::GeneveBuilder::new(buf, &repr)?;
    for option in options {
        builder.push_protego(option)?;
    }
    let start = builder.finish();
    let header = header_len(src.is_ipv6());
    let end = start + header + payload.len();
    room("relayed datagram", buf.len(), end)?;
    buf[start + header..end].copy_from_slice(payload);
    emit_header(&mut buf[start..], src, dst, payload.len(), 0)?;
    Ok(end)
}

/// Length of the Geneve header [`emit_l2_header`] writes: the fixed header, the port option
/// and, with `probe`, a health probe option.
pub const fn l2_header_len(probe: bool) -> usize {
    let port = ProtegoOption::Port(0).buffer_len();
    let probe = if probe {
        ProtegoOption::Probe(HealthProbe { id: 0, stamp: 0 }).buffer_len()
    } else {
        0
    };
    GENEVE_HEADER_LEN + port + probe
}

/// Writes the Geneve header of a relayed Ethernet frame into `buf[..l2_header_len]`: Protocol
/// Type 0x6558, VNI 0, the port option and, if given, a health probe. The frame goes right
/// after it. Returns the header length ([`l2_header_len`]).
pub fn emit_l2_header(
    buf: &mut [u8],
    port: u32,
    probe: Option<HealthProbe>,
) -> Result<usize, WireError> {
    let repr = GeneveRepr {
        control: false,
        protocol_type: PROTOCOL_ETHERNET,
        vni: Vni::default(),
    };
    let mut builder = crate::geneve::GeneveBuilder::new(buf, &repr)?;
    builder.push_protego(&ProtegoOption::Port(port))?;
    if let Some(probe) = probe {
        builder.push_protego(&ProtegoOption::Probe(probe))?;
    }
    Ok(builder.finish())
}

/// Writes a whole Geneve relay frame carrying the Ethernet `frame` of customer-facing port
/// `port` into `buf` (see [`emit_l2_header`]); returns its length. A frame shorter than an
/// Ethernet header is `Malformed`.
pub fn emit_l2_frame(
    buf: &mut [u8],
    port: u32,
    probe: Option<HealthProbe>,
    frame: &[u8],
) -> Result<usize, WireError> {
    if frame.len() < ETHERNET_HEADER_LEN {
        return Err(malformed("ethernet frame"));
    }
    let start = emit_l2_header(buf, port, probe)?;
    let end = start + frame.len();
    room("relayed frame", buf.len(), end)?;
    buf[start..end].copy_from_slice(frame);
    Ok(end)
}

/// A received Geneve relay frame: its Protego options and the datagram (or Ethernet frame) it
/// carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayFrame {
    /// The Geneve VNI.
    pub vni: Vni,
    /// True if the O (control) flag is set: an idle probe or its reply, no datagram.
    pub control: bool,
    /// The first health probe option, if any.
    pub probe: Option<crate::geneve::HealthProbe>,
    /// The first probe reply option, if any.
    pub probe_reply: Option<crate::geneve::HealthProbe>,
    /// The tunnel id option, if any.
    pub tunnel: Option<u32>,
    /// The customer-facing port option, if any: present exactly when [`Self::ethernet`] is.
    pub port: Option<u32>,
    /// The relayed datagram, with its payload range relative to the whole frame; `None` for
    /// a control frame without payload and for an Ethernet frame.
    pub datagram: Option<RelayedDatagram>,
    /// The relayed Ethernet frame's range within the whole frame (Protocol Type 0x6558).
    pub ethernet: Option<Range<usize>>,
}

/// Reads a Geneve frame between Protego nodes. A frame with an unknown critical option is
/// refused (RFC 8926 §3.5.1); unknown non-critical options are skipped. The payload must be
/// an IPv4 or IPv6 UDP datagram unless the frame is a control frame with no payload, or an
/// Ethernet frame (Protocol Type 0x6558) of at least a header's length with a port option
/// and no O flag. A port option on anything but an Ethernet frame is refused.
pub fn parse_frame(frame: &[u8]) -> Result<RelayFrame, WireError> {
    let packet = GenevePacket::new_checked(frame)?;
    let repr = GeneveRepr::parse(&packet)?;
    if packet
        .unknown_critical_option(|o: &GeneveOption<'_>| {
            ProtegoOption::recognises(o.class, o.option_type)
        })
        .is_some()
    {
        return Err(WireError::Malformed {
            what: "geneve",
            field: "unknown critical option",
        });
    }
    let mut out = RelayFrame {
        vni: repr.vni,
        control: repr.control,
        probe: None,
        probe_reply: None,
        tunnel: None,
        port: None,
        datagram: None,
        ethernet: None,
    };
    for option in packet.options() {
        match ProtegoOption::parse(&option)? {
            Some(ProtegoOption::Probe(p)) => {
                out.probe.get_or_insert(p);
            }
            Some(ProtegoOption::ProbeReply(p)) => {
                out.probe_reply.get_or_insert(p);
            }
            Some(ProtegoOption::TunnelId(t)) => {
                out.tunnel.get_or_insert(t);
            }
            Some(ProtegoOption::Port(p)) => {
                out.port.get_or_insert(p);
            }
            None => {}
        }
    }
    let start = packet.header_len();
    if repr.protocol_type == PROTOCOL_ETHERNET {
        if out.port.is_none() {
            return Err(malformed("port option"));
        }
        if repr.control {
            return Err(malformed("control flag"));
        }
        if frame.len() - start < ETHERNET_HEADER_LEN {
            return Err(malformed("ethernet frame"));
        }
        out.ethernet = Some(start..frame.len());
        return Ok(out);
    }
    if out.port.is_some() {
        return Err(malformed("port option"));
    }
    if start == frame.len() && repr.control {
        return Ok(out);
    }
    if repr.protocol_type != EtherType::IPV4 && repr.protocol_type != EtherType::IPV6 {
        return Err(WireError::Malformed {
            what: "geneve",
            field: "protocol type",
        });
    }
    let mut d = parse(&frame[start..])?;
    if (repr.protocol_type == EtherType::IPV6) != d.src.is_ipv6() {
        return Err(malformed("protocol type"));
    }
    d.payload = d.payload.start + start..d.payload.end + start;
    out.datagram = Some(d);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn round_trip_v4_and_v6_with_options() {
        for (src, dst) in [
            (sa("198.51.100.7:4500"), sa("203.0.113.1:4500")),
            (sa("[2001:db8::7]:500"), sa("[2001:db8::1]:500")),
        ] {
            let mut buf = [0u8; 256];
            let payload = b"\0\0\0\0ike message";
            let opts = [ProtegoOption::TunnelId(9)];
            let vni = Vni::new(77).unwrap();
            let n = emit_frame(&mut buf, vni, &opts, src, dst, payload).unwrap();
            let f = parse_frame(&buf[..n]).unwrap();
            assert_eq!(f.vni, vni);
            assert_eq!(f.tunnel, Some(9));
            assert!(!f.control && f.probe.is_none());
            let d = f.datagram.unwrap();
            assert_eq!((d.src, d.dst), (src, dst));
            assert_eq!(&buf[d.payload], payload);
        }
    }

    #[test]
    fn ipv6_udp_checksum_is_valid_and_ipv4_is_zero() {
        let mut buf = [0u8; 128];
        let (s, d) = (sa("[2001:db8::7]:500"), sa("[2001:db8::1]:501"));
        buf[48..51].copy_from_slice(b"abc");
        emit_header(&mut buf, s, d, 3, 0).unwrap();
        let udp = UdpPacket::new_checked(&buf[40..51]).unwrap();
        assert!(udp.verify_checksum(&s.ip(), &d.ip()));
        let (s, d) = (sa("192.0.2.1:1"), sa("192.0.2.2:2"));
        emit_header(&mut buf, s, d, 3, 7).unwrap();
        assert_eq!(UdpPacket::new_checked(&buf[20..31]).unwrap().checksum(), 0);
        assert!(Ipv4Packet::new_checked(&buf[..31])
            .unwrap()
            .verify_checksum());
    }

    #[test]
    fn refuses_what_protego_never_builds() {
        let mut buf = [0u8; 128];
        let (s, d) = (sa("192.0.2.1:1"), sa("192.0.2.2:2"));
        let n = emit_frame(&mut buf, Vni::new(1).unwrap(), &[], s, d, b"xy").unwrap();
        // Every truncation is an error, never a panic.
        for cut in 0..n {
            let _ = parse_frame(&buf[..cut]);
        }
        // Mixed families.
        assert!(emit_header(&mut buf, s, sa("[::1]:2"), 0, 0).is_err());
        // Not UDP.
        let mut bad = buf;
        bad[8 + 9] = 6;
        assert!(parse_frame(&bad[..n]).is_err());
        // A fragment.
        let mut frag = buf;
        frag[8 + 6] = 0x20;
        assert!(parse_frame(&frag[..n]).is_err());
        // An unknown critical option.
        let mut crit = [0u8; 128];
        let repr = GeneveRepr {
            control: false,
            protocol_type: EtherType::IPV4,
            vni: Vni::new(1).unwrap(),
        };
        let mut b = crate::geneve::GeneveBuilder::new(&mut crit, &repr).unwrap();
        b.push(&GeneveOption {
            class: crate::geneve::OptionClass(0x0101),
            option_type: crate::geneve::OptionType(0x80),
            data: &[],
        })
        .unwrap();
        let start = b.finish();
        let m = start + header_len(false) + 2;
        emit_header(&mut crit[start..], s, d, 2, 0).unwrap();
        assert!(parse_frame(&crit[..m]).is_err());
    }

    #[test]
    fn ethernet_frames_carry_their_port() {
        let eth: Vec<u8> = (0..60u8).collect();
        let probe = HealthProbe { id: 3, stamp: 4 };
        for p in [None, Some(probe)] {
            let mut buf = [0u8; 128];
            let n = emit_l2_frame(&mut buf, 0x0a0b_0c0d, p, &eth).unwrap();
            assert_eq!(n, l2_header_len(p.is_some()) + eth.len());
            let f = parse_frame(&buf[..n]).unwrap();
            assert_eq!(f.port, Some(0x0a0b_0c0d));
            assert_eq!(f.probe, p);
            assert!(f.datagram.is_none() && !f.control && f.tunnel.is_none());
            assert_eq!(f.vni, Vni::default());
            assert_eq!(&buf[f.ethernet.unwrap()], &eth[..]);
            // Every truncation is an error, never a panic; a cut frame is still whole down
            // to an Ethernet header.
            for cut in 0..n {
                let r = parse_frame(&buf[..cut]);
                assert_eq!(
                    r.is_ok(),
                    cut >= l2_header_len(p.is_some()) + ETHERNET_HEADER_LEN,
                    "{cut}"
                );
            }
        }
        let mut buf = [0u8; 64];
        assert!(emit_l2_frame(&mut buf, 1, None, &eth[..13]).is_err());
        assert!(matches!(
            emit_l2_frame(&mut buf[..40], 1, None, &eth),
            Err(WireError::BufferTooSmall { .. })
        ));
    }

    #[test]
    fn ethernet_and_port_option_go_together() {
        let eth = [0u8; 20];
        let mut buf = [0u8; 96];
        // 0x6558 without a port option.
        let repr = GeneveRepr {
            control: false,
            protocol_type: crate::geneve::PROTOCOL_ETHERNET,
            vni: Vni::default(),
        };
        let start = repr.emit(&[], &mut buf).unwrap();
        buf[start..start + eth.len()].copy_from_slice(&eth);
        assert_eq!(
            parse_frame(&buf[..start + eth.len()]),
            Err(malformed("port option"))
        );
        // ... or with the O flag.
        let n = emit_l2_frame(&mut buf, 1, None, &eth).unwrap();
        let mut control = buf;
        control[1] |= crate::geneve::FLAG_CONTROL;
        assert_eq!(parse_frame(&control[..n]), Err(malformed("control flag")));
        // A port option on a relayed datagram.
        let (s, d) = (sa("192.0.2.1:1"), sa("192.0.2.2:2"));
        let n = emit_frame(
            &mut buf,
            Vni::default(),
            &[ProtegoOption::Port(1)],
            s,
            d,
            b"x",
        )
        .unwrap();
        assert_eq!(parse_frame(&buf[..n]), Err(malformed("port option")));
    }

    #[test]
    fn control_frame_without_payload() {
        let mut buf = [0u8; 32];
        let repr = GeneveRepr {
            control: true,
            protocol_type: EtherType::IPV4,
            vni: Vni::new(0).unwrap(),
        };
        let mut b = crate::geneve::GeneveBuilder::new(&mut buf, &repr).unwrap();
        let probe = crate::geneve::HealthProbe { id: 5, stamp: 6 };
        b.push_protego(&ProtegoOption::Probe(probe)).unwrap();
        let n = b.finish();
        let f = parse_frame(&buf[..n]).unwrap();
        assert!(f.control && f.datagram.is_none());
        assert_eq!(f.probe, Some(probe));
    }
}
