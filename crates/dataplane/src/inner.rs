//! Inner (tunnelled) IP packets as the router sees them: validation and the flow the selectors
//! and the VXLAN source port hash need come from `wire::flow` ([`InnerIp`], shared with the
//! steer node); here are the router's TTL / hop-limit decrement
//! (RFC 1812 §5.3.1, RFC 8200 §3) with the IPv4 header checksum update (RFC 1624).

use std::net::IpAddr;
use wire::flow::Flow;
pub(crate) use wire::flow::InnerIp;

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
pub(crate) fn flow_hash(flow: &Flow) -> u64 {
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
        u64::from(flow.sport.unwrap_or(0)) << 16 | u64::from(flow.dport.unwrap_or(0)),
    );
    h ^ (h >> 32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::checksum;

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
        let i = InnerIp::parse(&p).expect("valid");
        assert_eq!(i.len, 32);
        assert_eq!(i.flow.proto, 17);
        assert_eq!((i.flow.sport, i.flow.dport), (Some(1000), Some(2000)));
        assert!(InnerIp::parse(&p[..19]).is_none());
        assert!(InnerIp::parse(&[0x55; 40]).is_none());
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
        let i = InnerIp::parse(&p).expect("valid");
        assert_eq!(
            (i.flow.proto, i.flow.sport, i.flow.dport),
            (17, Some(53), Some(54))
        );
        assert!(decrement_hop(&mut p));
        assert_eq!(p[7], 63);
    }

    #[test]
    fn flow_hash_differs_per_flow() {
        let a = InnerIp::parse(&udp4(64)).expect("valid").flow;
        let mut b = a;
        b.sport = Some(1001);
        assert_ne!(flow_hash(&a), flow_hash(&b));
        assert_eq!(flow_hash(&a), flow_hash(&a));
    }
}
