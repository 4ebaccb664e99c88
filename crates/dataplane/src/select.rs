//! Traffic selector matching (RFC 4301 §4.4.1.1 selectors as IKEv2 negotiates them, RFC 7296
//! §3.13.1): the addresses, IP protocol and ports of an inner packet against a CHILD_SA's
//! negotiated selectors. Used for the inbound policy check and to pick the CHILD_SA (and so the
//! tunnel) for an outbound packet, through the destination index of [`index`] so that the
//! choice among many tunnels costs O(log n). The packet's flow and what a selector covers of
//! it are `wire::flow`'s, shared with the steer node.

use ike::TrafficSelector;
use wire::flow::{Flow, InnerIp};

pub(crate) mod index;

/// The data node's decision whether a CHILD_SA with these negotiated selectors carries an
/// outbound inner packet (source in `local_ts`, destination in `remote_ts`), from the packet's
/// bytes: the same parse and match the outbound path makes. False for what is not an IP
/// packet. Public so that the steer node's tests can hold their decisions to it.
pub fn carries_outbound(
    packet: &[u8],
    local_ts: &[TrafficSelector],
    remote_ts: &[TrafficSelector],
) -> bool {
    InnerIp::parse(packet).is_some_and(|p| covers(&p.flow, local_ts, remote_ts))
}

/// True if one of `src_ts` covers the packet's source side and one of `dst_ts` its
/// destination side, with `wire::flow`'s meaning of a selector match (the steer node's too).
pub(crate) fn covers(flow: &Flow, src_ts: &[TrafficSelector], dst_ts: &[TrafficSelector]) -> bool {
    src_ts
        .iter()
        .any(|ts| ts.covers(flow.src, flow.proto, flow.sport))
        && dst_ts
            .iter()
            .any(|ts| ts.covers(flow.dst, flow.proto, flow.dport))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;
    use wire::ip::IpProtocol;

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
        let f = Flow::new(ip("10.1.2.3"), ip("192.0.2.9"), IpProtocol(6), Some(&tcp));
        assert!(covers(&f, &lan, &web));
        let udp = Flow::new(ip("10.1.2.3"), ip("192.0.2.9"), IpProtocol(17), Some(&tcp));
        assert!(!covers(&udp, &lan, &web));
        let frag = Flow::new(ip("10.1.2.3"), ip("192.0.2.9"), IpProtocol(6), None);
        assert!(!covers(&frag, &lan, &web));
        let outside = Flow::new(ip("10.2.0.1"), ip("192.0.2.9"), IpProtocol(6), Some(&tcp));
        assert!(!covers(&outside, &lan, &web));
        let v6 = [ts("2001:db8::", "2001:db8::ffff", 0, ANY)];
        let f6 = Flow::new(
            ip("2001:db8::1"),
            ip("2001:db8::2"),
            IpProtocol(17),
            Some(&tcp),
        );
        assert!(covers(&f6, &v6, &v6));
        assert!(!covers(&f6, &lan, &v6));
    }

    #[test]
    fn icmp_type_and_code_and_opaque() {
        let any = [ts("0.0.0.0", "255.255.255.255", 0, ANY)];
        let echo = [ts("0.0.0.0", "255.255.255.255", 1, (0x0800, 0x0800))];
        let f = Flow::new(
            ip("10.0.0.1"),
            ip("10.0.0.2"),
            IpProtocol(1),
            Some(&[8, 0, 0xab, 0xcd]),
        );
        assert!(covers(&f, &any, &echo));
        assert!(covers(&f, &echo, &echo));
        let reply = Flow::new(
            ip("10.0.0.1"),
            ip("10.0.0.2"),
            IpProtocol(1),
            Some(&[0, 0, 0, 0]),
        );
        assert!(!covers(&reply, &any, &echo));
        let opaque = [ts("0.0.0.0", "255.255.255.255", 0, (65535, 0))];
        let no_ports = Flow::new(ip("10.0.0.1"), ip("10.0.0.2"), IpProtocol(6), None);
        assert!(covers(&no_ports, &any, &opaque));
        let ports = Flow::new(
            ip("10.0.0.1"),
            ip("10.0.0.2"),
            IpProtocol(6),
            Some(&[0, 1, 0, 2]),
        );
        assert!(!covers(&ports, &any, &opaque));
    }
}
