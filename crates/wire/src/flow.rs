//! The flow of an inner (tunnelled) IP packet, and what it means for a traffic selector to
//! cover it: the one parser and the one match rule that the data node (picking and checking a
//! CHILD_SA) and the steer node (picking the data node that holds it) share, so that the two
//! cannot disagree about a packet.
//!
//! Selectors are RFC 4301 §4.4.1.1's as IKEv2 negotiates them (RFC 7296 §3.13.1): an address
//! range, an IP protocol (0: any) and a port range per side.
//!
//! - Ports exist for TCP, UDP, SCTP and UDP-Lite (the first 4 bytes of their header). For ICMP
//!   and ICMPv6, RFC 7296 §3.13.1 puts the message type and code into the port fields
//!   (type << 8 | code); ICMP carries them once, so they are matched against both selectors.
//! - A packet has no ports (`None`) for other protocols, behind a non-first fragment, or when
//!   the upper-layer header is truncated or behind an IPv6 extension header chain too long to
//!   follow. Such a packet matches a selector whose ports are "any" (0–65535) or OPAQUE
//!   (RFC 4301 §4.4.1.1; start 65535, end 0 in IKEv2), and no narrower range.
//! - An OPAQUE selector matches only packets without ports.

use std::net::IpAddr;

use crate::ip::{IpProtocol, IpVersion, Ipv4Packet, Ipv6Packet};

/// IP protocols whose first 4 payload bytes are the source and destination ports.
const PORT_PROTOCOLS: [IpProtocol; 4] = [
    IpProtocol::TCP,
    IpProtocol::UDP,
    IpProtocol::SCTP,
    IpProtocol(136), // UDP-Lite (RFC 3828)
];

/// IPv6 extension headers walked before giving up on finding the upper layer.
const MAX_EXTENSION_HEADERS: usize = 8;

/// What traffic selectors look at in a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Upper-layer protocol (after IPv6 extension headers).
    pub proto: u8,
    /// Source port; ICMP/ICMPv6: type << 8 | code. `None` without ports (see the module docs).
    pub sport: Option<u16>,
    /// Destination port; ICMP/ICMPv6: type << 8 | code again. `None` without ports.
    pub dport: Option<u16>,
}

impl Flow {
    /// The flow of a packet from its header fields; `l4` is the upper-layer header if the
    /// packet carries it (not behind a non-first fragment).
    pub fn new(src: IpAddr, dst: IpAddr, proto: IpProtocol, l4: Option<&[u8]>) -> Self {
        let (sport, dport) = match l4 {
            Some(h) if PORT_PROTOCOLS.contains(&proto) && h.len() >= 4 => (
                Some(u16::from_be_bytes([h[0], h[1]])),
                Some(u16::from_be_bytes([h[2], h[3]])),
            ),
            Some(h) if is_icmp(proto) && h.len() >= 2 => {
                let type_code = u16::from_be_bytes([h[0], h[1]]);
                (Some(type_code), Some(type_code))
            }
            _ => (None, None),
        };
        Self {
            src,
            dst,
            proto: proto.0,
            sport,
            dport,
        }
    }

    /// The ICMP or ICMPv6 message type, if this is such a packet with its header.
    pub fn icmp_type(&self) -> Option<u8> {
        if is_icmp(IpProtocol(self.proto)) {
            self.sport.map(|tc| (tc >> 8) as u8)
        } else {
            None
        }
    }
}

fn is_icmp(proto: IpProtocol) -> bool {
    proto == IpProtocol::ICMP || proto == IpProtocol::ICMPV6
}

/// A validated inner IP packet of either version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InnerIp {
    /// IP version.
    pub version: IpVersion,
    /// Length from the IP header (bytes after it, e.g. ESP TFC padding, are not part of it).
    pub len: usize,
    /// Addresses, protocol, ports.
    pub flow: Flow,
}

impl InnerIp {
    /// Validates an IPv4 or IPv6 packet (header and lengths) and reads its flow; `None` if it
    /// is not one.
    pub fn parse(pkt: &[u8]) -> Option<Self> {
        match IpVersion::of(pkt).ok()? {
            IpVersion::V4 => {
                let p = Ipv4Packet::new_checked(pkt).ok()?;
                let l4 = (p.frag_offset() == 0).then(|| p.payload());
                let flow = Flow::new(p.src_addr().into(), p.dst_addr().into(), p.protocol(), l4);
                Some(Self {
                    version: IpVersion::V4,
                    len: usize::from(p.total_len()),
                    flow,
                })
            }
            IpVersion::V6 => {
                let p = Ipv6Packet::new_checked(pkt).ok()?;
                let (proto, l4) = upper_layer_v6(p.next_header(), p.payload());
                let flow = Flow::new(p.src_addr().into(), p.dst_addr().into(), proto, l4);
                Some(Self {
                    version: IpVersion::V6,
                    len: p.total_len(),
                    flow,
                })
            }
        }
    }
}

/// Walks IPv6 extension headers (hop-by-hop, routing, destination options, fragment; RFC 8200
/// §4) to the upper-layer protocol and header. The header is `None` behind a non-first
/// fragment, a truncated chain, or a chain longer than 8 headers.
pub fn upper_layer_v6(mut next: IpProtocol, mut rest: &[u8]) -> (IpProtocol, Option<&[u8]>) {
    for _ in 0..MAX_EXTENSION_HEADERS {
        match next {
            IpProtocol::HOPOPT | IpProtocol::IPV6_ROUTE | IpProtocol::IPV6_OPTS => {
                if rest.len() < 8 {
                    return (next, None);
                }
                let len = (usize::from(rest[1]) + 1) * 8;
                if rest.len() < len {
                    return (next, None);
                }
                next = IpProtocol(rest[0]);
                rest = &rest[len..];
            }
            IpProtocol::IPV6_FRAG => {
                if rest.len() < 8 {
                    return (next, None);
                }
                let offset = u16::from_be_bytes([rest[2], rest[3]]) & 0xfff8;
                next = IpProtocol(rest[0]);
                if offset != 0 {
                    return (next, None);
                }
                rest = &rest[8..];
            }
            _ => return (next, Some(rest)),
        }
    }
    (next, None)
}

/// A selector's ports as they meet a packet (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ports {
    /// The ports `start..=end`; 0–65535 is "any" and also matches packets without ports.
    Range {
        /// First port.
        start: u16,
        /// Last port (not below `start`).
        end: u16,
    },
    /// OPAQUE: only packets whose ports are not available.
    Opaque,
}

impl Ports {
    /// Any port, and packets without ports.
    pub const ANY: Self = Self::Range {
        start: 0,
        end: u16::MAX,
    };

    /// The ports of a traffic selector's start and end fields: OPAQUE for 65535–0 (RFC 7296
    /// §3.13.1), `None` for any other reversed range (which covers nothing).
    pub fn from_fields(start: u16, end: u16) -> Option<Self> {
        if start <= end {
            Some(Self::Range { start, end })
        } else if (start, end) == (u16::MAX, 0) {
            Some(Self::Opaque)
        } else {
            None
        }
    }

    /// True if a packet with this port (`None`: without ports) is covered.
    #[inline]
    pub fn matches(self, port: Option<u16>) -> bool {
        let (start, end) = self.key_bounds();
        let key = port_key(port);
        start <= key && key <= end
    }

    /// The ports as an inclusive range of [`port_key`]s, for indexes that compare integers:
    /// "any" reaches up to the key of "no ports", OPAQUE is that key alone.
    pub const fn key_bounds(self) -> (u32, u32) {
        match self {
            Self::Range {
                start: 0,
                end: u16::MAX,
            } => (0, NO_PORTS),
            Self::Range { start, end } => (start as u32, end as u32),
            Self::Opaque => (NO_PORTS, NO_PORTS),
        }
    }
}

/// The [`port_key`] of a packet without ports, above every port.
pub const NO_PORTS: u32 = 1 << 16;

/// A packet's port as an integer key: the port, or [`NO_PORTS`]. A selector's [`Ports`] cover
/// the packet exactly when the key lies within [`Ports::key_bounds`].
#[inline]
pub const fn port_key(port: Option<u16>) -> u32 {
    match port {
        Some(p) => p as u32,
        None => NO_PORTS,
    }
}

/// True if `addr` lies within `start..=end`, all three of one family (a range whose ends differ
/// in family covers nothing).
#[inline]
pub fn addr_in((start, end): (IpAddr, IpAddr), addr: IpAddr) -> bool {
    match (start, end, addr) {
        (IpAddr::V4(s), IpAddr::V4(e), IpAddr::V4(a)) => s <= a && a <= e,
        (IpAddr::V6(s), IpAddr::V6(e), IpAddr::V6(a)) => s <= a && a <= e,
        _ => false,
    }
}

/// True if one selector side covers a packet's side: `addr` within `start..=end` (same
/// family), `proto` equal to the selector's unless that is 0, and the port as [`Ports`] says.
/// A reversed port range other than OPAQUE covers nothing.
pub fn side_covers(
    range: (IpAddr, IpAddr),
    ip_proto: u8,
    ports: (u16, u16),
    addr: IpAddr,
    proto: u8,
    port: Option<u16>,
) -> bool {
    addr_in(range, addr)
        && (ip_proto == 0 || ip_proto == proto)
        && Ports::from_fields(ports.0, ports.1).is_some_and(|p| p.matches(port))
}

#[cfg(test)]
mod tests;
