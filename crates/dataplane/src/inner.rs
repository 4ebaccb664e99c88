//! Inner (tunnelled) IP packets as the router sees them: validation with the `wire` views,
//! the flow key the selectors and the VXLAN source port hash need (walking IPv6 extension
//! headers to the upper-layer header, RFC 8200 §4), and the router's TTL / hop-limit decrement
//! (RFC 1812 §5.3.1, RFC 8200 §3) with the IPv4 header checksum update (RFC 1624).

use crate::select::FlowKey;
use std::net::IpAddr;
use wire::ip::{IpProtocol, IpVersion, Ipv4Packet, Ipv6Packet};

/// A validated inner packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InnerIp {
    /// IP version.
    pub(crate) version: IpVersion,
    /// Length from the IP header (bytes after it, e.g. ESP TFC padding, are not part of it).
    pub(crate) len: usize,
    /// Addresses, protocol, ports.
    pub(crate) flow: FlowKey,
}

/// Validates an IP packet of either version; None if it is not one.
pub(crate) fn parse(pkt: &[u8]) -> Option<InnerIp> {
    match IpVersion::of(pkt).ok()? {
        IpVersion::V4 => {
            let p = Ipv4Packet::new_checked(pkt).ok()?;
            let l4 = if p.frag_offset() == 0 {
                Some(p.payload())
            } else {
                None
            };
            let flow = FlowKey::new(p.src_addr().into(), p.dst_addr().into(), p.protocol().0, l4);
            Some(InnerIp {
                version: IpVersion::V4,
                len: usize::from(p.total_len()),
                flow,
            })
        }
        IpVersion::V6 => {
            let p = Ipv6Packet::new_checked(pkt).ok()?;
            let (proto, l4) = upper_layer_v6(p.next_header(), p.payload());
            let flow = FlowKey::new(p.src_addr().into(), p.dst_addr().into(), proto, l4);
            Some(InnerIp {
                version: IpVersion::V6,
                len: p.total_len(),
                flow,
            })
        }
    }
}

/// Walks IPv6 extension headers (hop-by-hop, routing, destination options, fragment) to the
/// upper-layer protocol and header; the header is None behind a non-first fragment or a
/// truncated chain.
fn upper_layer_v6(mut next: IpProtocol, mut rest: &[u8]) -> (u8, Option<&[u8]>) {
    // A bounded walk: a chain longer than this is not something we forward by port.
    for _ in 0..8 {
        match next {
            IpProtocol::HOPOPT | IpProtocol::IPV6_ROUTE | IpProtocol::IPV6_OPTS => {
                if rest.len() < 8 {
                    return (next.0, None);
                }
                let len = (usize::from(rest[1]) + 1) * 8;
                if rest.len() < len {
                    return (next.0, None);
                }
                next = IpProtocol(rest[0]);
                rest = &rest[len..];
            }
            IpProtocol::IPV6_FRAG => {
                if rest.len() < 8 {
                    return (next.0, None);
                }
                let offset = u16::from_be_bytes([rest[2], rest[3]]) & 0xfff8;
                next = IpProtocol(rest[0]);
                if offset != 0 {
                    return (next.0, None);
                }
                rest = &rest[8..];
            }
            _ => return (next.0, Some(rest)),
        }
    }
    (next.0, None)
}

/// Decrements the TTL / hop limit of a packet being forwarded; false (drop it) if it would
/// reach zero (RFC 1812 §5.3.1: a router MUST NOT forward a packet whose TTL reaches 0).
pub(crate) fn decrement_hop(pkt: &mut [u8]) -> bool {
    match pkt.first().map(|b| b >> 4) {
        Some(4) if pkt.len() >= 20 => {
            let ttl = pkt[8];
            if ttl <= 1 {
                return false;
            }
            pkt[8] = ttl - 1;
            // RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m'), m the 16-bit word holding TTL|protocol.
            let old = u16::from_be_bytes([ttl, pkt[9]]);
            let new = u16::from_be_bytes([ttl - 1, pkt[9]]);
            let hc = u16::from_be_bytes([pkt[10], pkt[11]]);
            let mut sum = u32::from(!hc) + u32::from(!old) + u32::from(new);
            sum = (sum & 0xffff) + (sum >> 16);
            sum = (sum & 0xffff) + (sum >> 16);
            pkt[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
            true
        }
        Some(6) if pkt.len() >= 40 => {
            if pkt[7] <= 1 {
                return false;
            }
            pkt[7] -= 1;
            true
        }
        _ => false,
    }
}

/// A hash of the flow for the VXLAN UDP source port (RFC 7348 §5: "a hash of fields from the
/// inner packet"), stable for a flow and symmetric in nothing.
pub(crate) fn flow_hash(flow: &FlowKey) -> u64 {
    fn mix(h: u64, v: u64) -> u64 {
        (h ^ v).wrapping_mul(0x0000_0100_0000_01b3).rotate_left(29)
    }
    fn addr(h: u64, a: IpAddr) -> u64 {
        match a {
            IpAddr::V4(a) => mix(h, u64::from(u32::from(a))),
            IpAddr::V6(a) => {
                let v = u128::from(a);
                mix(mix(h, v as u64), (v >> 64) as u64)
            }
        }
    }
    let mut h = 0xcbf2_9ce4_8422_2325;
    h = addr(h, flow.src);
    h = addr(h, flow.dst);
    h = mix(h, u64::from(flow.proto));
    h = mix(
        h,
        u64::from(flow.src_port.unwrap_or(0)) << 16 | u64::from(flow.dst_port.unwrap_or(0)),
    );
    h ^ (h >> 32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::ip::checksum;

    /// An IPv4/UDP packet 10.0.0.1:1000 -> 10.0.0.2:2000 with a valid header checksum.
    pub(crate) fn udp4(ttl: u8) -> Vec<u8> {
        let mut p = vec![
            0x45, 0, 0, 32, 0x12, 0x34, 0x40, 0, ttl, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0,
            2, // IPv4
            0x03, 0xe8, 0x07, 0xd0, 0, 12, 0, 0, b'd', b'a', b't', b'a', // UDP
        ];
        let c = !checksum::sum(&p[..20]);
        p[10..12].copy_from_slice(&c.to_be_bytes());
        p
    }

    #[test]
    fn parses_v4_flow() {
        let p = udp4(64);
        let i = parse(&p).expect("valid");
        assert_eq!(i.len, 32);
        assert_eq!(i.flow.proto, 17);
        assert_eq!((i.flow.src_port, i.flow.dst_port), (Some(1000), Some(2000)));
        assert!(parse(&p[..19]).is_none());
        assert!(parse(&[0x55; 40]).is_none());
    }

    #[test]
    fn ttl_decrement_keeps_checksum_valid() {
        let mut p = udp4(64);
        assert!(decrement_hop(&mut p));
        assert_eq!(p[8], 63);
        assert_eq!(checksum::sum(&p[..20]), 0xffff);
        let mut p = udp4(1);
        assert!(!decrement_hop(&mut p));
        // Edge: the checksum carry case.
        for ttl in 2..=255u8 {
            let mut p = udp4(ttl);
            assert!(decrement_hop(&mut p));
            assert_eq!(checksum::sum(&p[..20]), 0xffff, "ttl {ttl}");
        }
    }

    #[test]
    fn v6_walks_extension_headers() {
        let mut p = vec![0u8; 40 + 8 + 8];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&16u16.to_be_bytes());
        p[6] = 0; // hop-by-hop
        p[7] = 64;
        p[8] = 0x20;
        p[23] = 1;
        p[24] = 0x20;
        p[39] = 2;
        p[40] = 17; // next: UDP, len 0 (8 bytes)
        p[48..52].copy_from_slice(&[0, 53, 0, 54]);
        let i = parse(&p).expect("valid");
        assert_eq!(
            (i.flow.proto, i.flow.src_port, i.flow.dst_port),
            (17, Some(53), Some(54))
        );
        assert!(decrement_hop(&mut p));
        assert_eq!(p[7], 63);
    }

    #[test]
    fn flow_hash_differs_per_flow() {
        let a = parse(&udp4(64)).expect("valid").flow;
        let mut b = a;
        b.src_port = Some(1001);
        assert_ne!(flow_hash(&a), flow_hash(&b));
        assert_eq!(flow_hash(&a), flow_hash(&a));
    }
}
