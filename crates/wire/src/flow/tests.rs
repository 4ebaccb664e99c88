use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}

/// An IPv4 header (no options) with `proto`, fragment offset `frag` (8-byte units) and `l4`.
fn v4(proto: u8, frag: u16, l4: &[u8]) -> Vec<u8> {
    let total = 20 + l4.len();
    let mut p = vec![
        0x45, 0, 0, 0, 0, 0, 0, 0, 64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ];
    p[2..4].copy_from_slice(&u16::try_from(total).expect("len").to_be_bytes());
    p[6..8].copy_from_slice(&frag.to_be_bytes());
    p.extend_from_slice(l4);
    p
}

/// An IPv6 header with `next` and the payload `rest` (extension headers and upper layer).
fn v6(next: u8, rest: &[u8]) -> Vec<u8> {
    let mut p = vec![0x60, 0, 0, 0, 0, 0, next, 64];
    p[4..6].copy_from_slice(&u16::try_from(rest.len()).expect("len").to_be_bytes());
    p.extend_from_slice(&ip6("2001:db8::1"));
    p.extend_from_slice(&ip6("2001:db8::2"));
    p.extend_from_slice(rest);
    p
}

fn ip6(s: &str) -> [u8; 16] {
    s.parse::<std::net::Ipv6Addr>().expect("v6").octets()
}

const TCP_12345_443: [u8; 4] = [0x30, 0x39, 0x01, 0xbb];

#[test]
fn ports_of_tcp_udp_and_icmp() {
    let f = InnerIp::parse(&v4(6, 0, &TCP_12345_443)).expect("tcp").flow;
    assert_eq!((f.src, f.dst, f.proto), (ip("10.0.0.1"), ip("10.0.0.2"), 6));
    assert_eq!((f.sport, f.dport), (Some(12345), Some(443)));
    let echo = InnerIp::parse(&v4(1, 0, &[8, 0, 0xab, 0xcd]))
        .expect("icmp")
        .flow;
    assert_eq!((echo.sport, echo.dport), (Some(0x0800), Some(0x0800)));
    assert_eq!(echo.icmp_type(), Some(8));
    let gre = InnerIp::parse(&v4(47, 0, &[0; 8])).expect("gre").flow;
    assert_eq!((gre.sport, gre.dport, gre.icmp_type()), (None, None, None));
    let short_udp = InnerIp::parse(&v4(17, 0, &[0x30, 0x39])).expect("udp").flow;
    assert_eq!((short_udp.sport, short_udp.dport), (None, None));
}

#[test]
fn non_first_fragments_have_no_ports() {
    let first = InnerIp::parse(&v4(6, 0x2000, &TCP_12345_443))
        .expect("first")
        .flow;
    assert_eq!(
        first.dport,
        Some(443),
        "MF set, offset 0: the first fragment"
    );
    let later = InnerIp::parse(&v4(6, 3, &TCP_12345_443))
        .expect("later")
        .flow;
    assert_eq!((later.sport, later.dport), (None, None));
    // IPv6: a fragment header with offset 0 is walked; a non-zero offset hides the ports.
    let frag = |offset: u16| {
        let mut h = vec![6, 0];
        h.extend_from_slice(&(offset << 3).to_be_bytes());
        h.extend_from_slice(&[0, 0, 0, 1]);
        h.extend_from_slice(&TCP_12345_443);
        h
    };
    let f = InnerIp::parse(&v6(44, &frag(0))).expect("v6 first").flow;
    assert_eq!((f.proto, f.dport), (6, Some(443)));
    let f = InnerIp::parse(&v6(44, &frag(7))).expect("v6 later").flow;
    assert_eq!((f.proto, f.sport, f.dport), (6, None, None));
}

#[test]
fn ipv6_extension_headers_are_walked_to_the_upper_layer() {
    let mut hop = vec![58, 0, 0, 0, 0, 0, 0, 0]; // hop-by-hop, 8 bytes, then ICMPv6
    hop.extend_from_slice(&[135, 0, 0, 0]); // neighbour solicitation
    let p = InnerIp::parse(&v6(0, &hop)).expect("v6");
    assert_eq!(p.version, IpVersion::V6);
    assert_eq!(p.len, 40 + 12);
    assert_eq!((p.flow.proto, p.flow.icmp_type()), (58, Some(135)));
    // A truncated extension header, and a chain of 9 destination options headers.
    let f = InnerIp::parse(&v6(60, &[6, 1, 0, 0, 0, 0, 0, 0]))
        .expect("truncated")
        .flow;
    assert_eq!((f.proto, f.sport), (60, None));
    let mut chain = Vec::new();
    for _ in 0..9 {
        chain.extend_from_slice(&[60, 0, 0, 0, 0, 0, 0, 0]);
    }
    let f = InnerIp::parse(&v6(60, &chain)).expect("long chain").flow;
    assert_eq!((f.proto, f.sport), (60, None));
}

#[test]
fn not_ip_is_none() {
    assert_eq!(InnerIp::parse(&[]), None);
    assert_eq!(InnerIp::parse(&[0x50; 40]), None);
    let mut short = v4(6, 0, &TCP_12345_443);
    short[3] = 200; // total length beyond the buffer
    assert_eq!(InnerIp::parse(&short), None);
}

#[test]
fn ports_any_range_and_opaque() {
    assert!(Ports::ANY.matches(Some(7)) && Ports::ANY.matches(None));
    let https = Ports::from_fields(443, 443).expect("range");
    assert!(https.matches(Some(443)));
    assert!(!https.matches(Some(444)) && !https.matches(None));
    let low = Ports::from_fields(0, 100).expect("range");
    assert!(!low.matches(None), "a packet without ports is not port 0");
    let opaque = Ports::from_fields(65535, 0).expect("opaque");
    assert_eq!(opaque, Ports::Opaque);
    assert!(opaque.matches(None) && !opaque.matches(Some(1)));
    assert_eq!(Ports::from_fields(10, 9), None);
}

#[test]
fn side_covers_checks_family_range_protocol_and_ports() {
    let lan = (ip("10.1.0.0"), ip("10.1.255.255"));
    assert!(side_covers(lan, 0, (0, 65535), ip("10.1.2.3"), 6, None));
    assert!(!side_covers(lan, 0, (0, 65535), ip("10.2.0.0"), 6, None));
    assert!(!side_covers(lan, 0, (0, 65535), ip("::1"), 6, None));
    assert!(side_covers(
        lan,
        6,
        (443, 443),
        ip("10.1.0.1"),
        6,
        Some(443)
    ));
    assert!(!side_covers(
        lan,
        6,
        (443, 443),
        ip("10.1.0.1"),
        17,
        Some(443)
    ));
    assert!(!side_covers(lan, 6, (10, 9), ip("10.1.0.1"), 6, None));
    assert!(side_covers(lan, 6, (65535, 0), ip("10.1.0.1"), 6, None));
}
