//! Tests of the IP views against captured packets.

use super::*;
use crate::testdata::{frame, UDP6, VXLAN_ICMP};
use std::net::{Ipv4Addr, Ipv6Addr};

#[test]
fn captured_ipv4_outer_and_inner() {
    let f = frame(VXLAN_ICMP);
    let outer = Ipv4Packet::new_checked(&f[14..]).unwrap();
    assert_eq!(outer.version(), 4);
    assert_eq!(outer.header_len(), 20);
    assert_eq!(outer.total_len(), 0x86);
    assert_eq!(outer.ident(), 0x232e);
    assert!(!outer.dont_frag());
    assert!(!outer.is_fragment());
    assert_eq!(outer.ttl(), 64);
    assert_eq!(outer.protocol(), IpProtocol::UDP);
    assert_eq!(outer.src_addr(), Ipv4Addr::new(10, 9, 0, 1));
    assert_eq!(outer.dst_addr(), Ipv4Addr::new(10, 9, 0, 2));
    assert!(outer.verify_checksum());
    assert_eq!(outer.payload().len(), 0x86 - 20);

    let inner = Ipv4Packet::new_checked(&f[14 + 20 + 8 + 8 + 14..]).unwrap();
    assert!(inner.dont_frag());
    assert_eq!(inner.protocol(), IpProtocol::ICMP);
    assert_eq!(inner.src_addr(), Ipv4Addr::new(192, 168, 77, 1));
    assert!(inner.verify_checksum());

    // Re-emitting the outer header from its Repr reproduces the captured bytes.
    let repr = Ipv4Repr::parse(&outer).unwrap();
    let mut out = [0u8; 20];
    assert_eq!(repr.emit(&mut out).unwrap(), 20);
    assert_eq!(&out[..], &f[14..34]);
}

#[test]
fn ipv4_checks() {
    let f = frame(VXLAN_ICMP);
    let ip = &f[14..14 + 0x86];
    // Truncated below the header, below Total Length.
    assert!(matches!(
        Ipv4Packet::new_checked(&ip[..19]),
        Err(WireError::Truncated { .. })
    ));
    assert!(matches!(
        Ipv4Packet::new_checked(&ip[..0x85]),
        Err(WireError::Truncated { .. })
    ));
    // Link-layer padding after Total Length is fine.
    let mut padded = ip.to_vec();
    padded.extend_from_slice(&[0; 6]);
    assert_eq!(
        Ipv4Packet::new_checked(&padded[..])
            .unwrap()
            .payload()
            .len(),
        0x86 - 20
    );
    // Bad version, IHL < 5, Total Length < IHL.
    let mut bad = ip.to_vec();
    bad[0] = 0x65;
    assert_eq!(
        Ipv4Packet::new_checked(&bad[..]),
        Err(WireError::Malformed {
            what: "ipv4",
            field: "version"
        })
    );
    bad[0] = 0x44;
    assert_eq!(
        Ipv4Packet::new_checked(&bad[..]),
        Err(WireError::Malformed {
            what: "ipv4",
            field: "ihl"
        })
    );
    bad[0] = 0x45;
    bad[2..4].copy_from_slice(&19u16.to_be_bytes());
    assert!(matches!(
        Ipv4Packet::new_checked(&bad[..]),
        Err(WireError::Malformed { .. })
    ));
    // A corrupted header fails the checksum in Repr::parse.
    let mut corrupt = ip.to_vec();
    corrupt[8] ^= 1;
    let p = Ipv4Packet::new_checked(&corrupt[..]).unwrap();
    assert_eq!(
        Ipv4Repr::parse(&p),
        Err(WireError::Checksum { what: "ipv4" })
    );
}

#[test]
fn captured_ipv6() {
    let f = frame(UDP6);
    let p = Ipv6Packet::new_checked(&f[14..]).unwrap();
    assert_eq!(p.version(), 6);
    assert_eq!(p.traffic_class(), 0);
    assert_eq!(p.flow_label(), 0x8217a);
    assert_eq!(p.payload_len(), 0x19);
    assert_eq!(p.next_header(), IpProtocol::UDP);
    assert_eq!(p.hop_limit(), 64);
    assert_eq!(p.src_addr(), "fd00:9::1".parse::<Ipv6Addr>().unwrap());
    assert_eq!(p.dst_addr(), "fd00:9::2".parse::<Ipv6Addr>().unwrap());
    let repr = Ipv6Repr::parse(&p).unwrap();
    let mut out = [0u8; 40];
    repr.emit(&mut out).unwrap();
    assert_eq!(&out[..], &f[14..54]);
    assert!(matches!(
        Ipv6Packet::new_checked(&f[14..14 + 40 + 0x18]),
        Err(WireError::Truncated { .. })
    ));
    let (s, d) = addresses(&f[14..]).unwrap();
    assert_eq!((s, d), (IpAddr::V6(p.src_addr()), IpAddr::V6(p.dst_addr())));
}

#[test]
fn version_and_protocol_helpers() {
    assert_eq!(IpVersion::of(&[0x45]), Ok(IpVersion::V4));
    assert_eq!(IpVersion::of(&[0x60]), Ok(IpVersion::V6));
    assert!(IpVersion::of(&[]).is_err());
    assert!(IpVersion::of(&[0x50]).is_err());
    assert_eq!(IpVersion::V6.encapsulation_protocol(), IpProtocol(41));
    assert_eq!(
        IpVersion::from_encapsulation_protocol(IpProtocol(4)),
        Some(IpVersion::V4)
    );
    assert_eq!(format!("{}", IpProtocol::ESP), "ESP");
    assert_eq!(format!("{}", IpProtocol(200)), "0xc8");
    let big = Ipv4Repr {
        src_addr: Ipv4Addr::LOCALHOST,
        dst_addr: Ipv4Addr::LOCALHOST,
        protocol: IpProtocol::UDP,
        payload_len: 65_516,
        ttl: 1,
        dscp: 0,
        ecn: 0,
        ident: 0,
        dont_frag: false,
    };
    assert!(big.emit(&mut [0u8; 20]).is_err());
    assert!(matches!(
        big.emit(&mut [0u8; 19]),
        Err(WireError::BufferTooSmall { .. })
    ));
}
