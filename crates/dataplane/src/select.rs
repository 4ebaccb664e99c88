//! Traffic selector matching (RFC 4301 §4.4.1.1 selectors as IKEv2 negotiates them, RFC 7296
//! §3.13.1): the addresses, IP protocol and ports of an inner packet against a CHILD_SA's
//! negotiated selectors. Used for the inbound policy check and to pick the CHILD_SA (and so the
//! tunnel) for an outbound packet, through the destination index of [`index`] so that the
//! choice among many tunnels costs O(log n).

use ike::TrafficSelector;
use std::net::IpAddr;

pub(crate) mod index;

/// IP protocol numbers whose first 4 payload bytes are source and destination ports.
const PORT_PROTOCOLS: [u8; 4] = [6, 17, 132, 136]; // TCP, UDP, SCTP, UDP-Lite
/// ICMP and ICMPv6: RFC 7296 §3.13.1 puts type and code into the port fields.
const ICMP_PROTOCOLS: [u8; 2] = [1, 58];

/// What the selectors look at in a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlowKey {
    /// Source address.
    pub(crate) src: IpAddr,
    /// Destination address.
    pub(crate) dst: IpAddr,
    /// Upper-layer protocol (after IPv6 extension headers).
    pub(crate) proto: u8,
    /// Source port (ICMP: type << 8 | code); None for non-first fragments or protocols
    /// without ports ("OPAQUE", RFC 4301 §4.4.1.1).
    pub(crate) src_port: Option<u16>,
    /// Destination port (ICMP: none); None as above.
    pub(crate) dst_port: Option<u16>,
}

impl FlowKey {
    /// Builds a key from parsed header fields; `l4` is the upper-layer header, if present (not
    /// for non-first fragments).
    pub(crate) fn new(src: IpAddr, dst: IpAddr, proto: u8, l4: Option<&[u8]>) -> Self {
        let (src_port, dst_port) = match l4 {
            Some(h) if PORT_PROTOCOLS.contains(&proto) && h.len() >= 4 => (
                Some(u16::from_be_bytes([h[0], h[1]])),
                Some(u16::from_be_bytes([h[2], h[3]])),
            ),
            Some(h) if ICMP_PROTOCOLS.contains(&proto) && h.len() >= 2 => {
                (Some(u16::from_be_bytes([h[0], h[1]])), None)
            }
            _ => (None, None),
        };
        Self {
            src,
            dst,
            proto,
            src_port,
            dst_port,
        }
    }

    /// True if one of `src_ts` covers the source side and one of `dst_ts` the destination.
    pub(crate) fn matches(&self, src_ts: &[TrafficSelector], dst_ts: &[TrafficSelector]) -> bool {
        src_ts
            .iter()
            .any(|ts| side_matches(ts, self.src, self.proto, self.src_port))
            && dst_ts
                .iter()
                .any(|ts| side_matches(ts, self.dst, self.proto, self.dst_port_for_ts()))
    }

    /// ICMP carries type/code only once; RFC 7296 §3.13.1 matches it on both selectors.
    fn dst_port_for_ts(&self) -> Option<u16> {
        if ICMP_PROTOCOLS.contains(&self.proto) {
            self.src_port
        } else {
            self.dst_port
        }
    }
}

/// One selector against one side of a packet.
fn side_matches(ts: &TrafficSelector, addr: IpAddr, proto: u8, port: Option<u16>) -> bool {
    if ts.start.is_ipv4() != addr.is_ipv4() || !ts.contains_addr(addr) {
        return false;
    }
    if ts.ip_proto != 0 && ts.ip_proto != proto {
        return false;
    }
    if ts.start_port == 0 && ts.end_port == u16::MAX {
        return true; // any port
    }
    if ts.start_port > ts.end_port {
        // OPAQUE (start 65535, end 0): matches only packets whose ports are not available.
        return port.is_none();
    }
    match port {
        Some(p) => ts.start_port <= p && p <= ts.end_port,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(start: &str, end: &str, proto: u8, ports: (u16, u16)) -> TrafficSelector {
        TrafficSelector {
            ip_proto: proto,
            start_port: ports.0,
            end_port: ports.1,
            start: start.parse().expect("start"),
            end: end.parse().expect("end"),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    const ANY: (u16, u16) = (0, 65535);

    #[test]
    fn addresses_protocol_and_ports() {
        let lan = [ts("10.1.0.0", "10.1.255.255", 0, ANY)];
        let web = [ts("192.0.2.0", "192.0.2.255", 6, (443, 443))];
        let tcp = [0x30, 0x39, 0x01, 0xbb]; // 12345 -> 443
        let f = FlowKey::new(ip("10.1.2.3"), ip("192.0.2.9"), 6, Some(&tcp));
        assert!(f.matches(&lan, &web));
        let udp = FlowKey::new(ip("10.1.2.3"), ip("192.0.2.9"), 17, Some(&tcp));
        assert!(!udp.matches(&lan, &web));
        let frag = FlowKey::new(ip("10.1.2.3"), ip("192.0.2.9"), 6, None);
        assert!(!frag.matches(&lan, &web));
        let outside = FlowKey::new(ip("10.2.0.1"), ip("192.0.2.9"), 6, Some(&tcp));
        assert!(!outside.matches(&lan, &web));
        let v6 = [ts("2001:db8::", "2001:db8::ffff", 0, ANY)];
        let f6 = FlowKey::new(ip("2001:db8::1"), ip("2001:db8::2"), 17, Some(&tcp));
        assert!(f6.matches(&v6, &v6));
        assert!(!f6.matches(&lan, &v6));
    }

    #[test]
    fn icmp_type_and_code_and_opaque() {
        let any = [ts("0.0.0.0", "255.255.255.255", 0, ANY)];
        let echo = [ts("0.0.0.0", "255.255.255.255", 1, (0x0800, 0x0800))];
        let f = FlowKey::new(ip("10.0.0.1"), ip("10.0.0.2"), 1, Some(&[8, 0, 0xab, 0xcd]));
        assert!(f.matches(&any, &echo));
        assert!(f.matches(&echo, &echo));
        let reply = FlowKey::new(ip("10.0.0.1"), ip("10.0.0.2"), 1, Some(&[0, 0, 0, 0]));
        assert!(!reply.matches(&any, &echo));
        let opaque = [ts("0.0.0.0", "255.255.255.255", 0, (65535, 0))];
        assert!(FlowKey::new(ip("10.0.0.1"), ip("10.0.0.2"), 6, None).matches(&any, &opaque));
        assert!(
            !FlowKey::new(ip("10.0.0.1"), ip("10.0.0.2"), 6, Some(&[0, 1, 0, 2]))
                .matches(&any, &opaque)
        );
    }
}
