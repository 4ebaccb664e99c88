//! Tests of the checksum arithmetic against RFC 1071 and checksums Linux computed, and a
//! property test against an independent word-by-word sum and the UDP view's own filling.

use super::*;
use crate::ethernet::{ETHERNET_HEADER_LEN, VLAN_TAG_LEN};
use crate::testdata::{
    frame, TCP4_SYN_FINAL, TCP4_SYN_PARTIAL, TCP6_SYN_FINAL, TCP6_SYN_PARTIAL, UDP4_FINAL,
    UDP4_PARTIAL, UDP6_FINAL, UDP6_PARTIAL,
};
use crate::udp::UdpPacket;
use proptest::prelude::*;

/// The sum as RFC 1071 §4.1 writes it: 16-bit big-endian words added in 32 bits, folded.
fn naive_sum(data: &[u8]) -> u16 {
    let mut s: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// The IP packet of an untagged captured frame.
fn packet(hex: &str) -> Vec<u8> {
    frame(hex)[ETHERNET_HEADER_LEN..].to_vec()
}

/// Where the transport header and its checksum field are in the captured packets (no IPv4
/// options, no IPv6 extension headers).
fn l4_and_field(p: &[u8]) -> (usize, usize, IpProtocol) {
    let (l4, proto) = if p[0] >> 4 == 4 {
        (20, IpProtocol(p[9]))
    } else {
        (40, IpProtocol(p[6]))
    };
    let field = l4 + if proto == IpProtocol::TCP { 16 } else { 6 };
    (l4, field, proto)
}

fn field(p: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([p[at], p[at + 1]])
}

/// `frame`'s IP packet behind an 802.1ad S-tag 100 and an 802.1Q C-tag 200, with `pad` bytes
/// of Ethernet padding after it.
fn qinq(untagged: &[u8], pad: usize) -> Vec<u8> {
    let mut f = untagged[..12].to_vec();
    f.extend_from_slice(&[0x88, 0xa8, 0x00, 100, 0x81, 0x00, 0x00, 200]);
    f.extend_from_slice(&untagged[12..]);
    f.extend(std::iter::repeat_n(0xee, pad));
    f
}

#[test]
fn rfc1071_example() {
    // RFC 1071 §3 worked example: 00 01 f2 03 f4 f5 f6 f7 sums to 0xddf2.
    assert_eq!(
        sum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
        0xddf2
    );
    // Odd length pads with zero.
    assert_eq!(sum(&[0x01]), 0x0100);
    assert_eq!(sum(&[0xab]), 0xab00);
    assert_eq!(sum(&[0x00, 0x01, 0x02]), 0x0201);
    assert_eq!(sum(&[]), 0);
    // End-around carry.
    assert_eq!(combine(&[0xffff, 0x0001]), 0x0001);
    assert_eq!(combine(&[]), 0);
}

#[test]
fn the_pseudo_header_is_what_linux_leaves_for_the_nic() {
    for hex in [
        UDP4_PARTIAL,
        UDP6_PARTIAL,
        TCP4_SYN_PARTIAL,
        TCP6_SYN_PARTIAL,
    ] {
        let p = packet(hex);
        let (l4, at, proto) = l4_and_field(&p);
        let length = u32::try_from(p.len() - l4).expect("small");
        let ph = pseudo_header_of(&p, proto, length).expect("an IP packet");
        assert_eq!(ph, field(&p, at), "{proto}");
        let (src, dst) = crate::ip::addresses(&p).expect("addresses");
        assert_eq!(pseudo_header(&src, &dst, proto, length), Some(ph));
    }
}

#[test]
fn fill_gives_the_checksums_linux_computed() {
    for hex in [UDP4_FINAL, UDP6_FINAL, TCP4_SYN_FINAL, TCP6_SYN_FINAL] {
        let want = packet(hex);
        let (l4, at, proto) = l4_and_field(&want);
        for junk in [[0, 0], [0x12, 0x34], [0xff, 0xff]] {
            let mut p = want.clone();
            p[at..at + 2].copy_from_slice(&junk);
            fill_l4(&mut p, l4, proto).expect("tcp or udp");
            assert_eq!(p, want, "{proto}, field was {junk:02x?}");
        }
        // The checksum verifies: the sum over pseudo-header and segment is all ones.
        let ph = pseudo_header_of(&want, proto, (want.len() - l4) as u32).expect("ip");
        assert_eq!(combine(&[ph, sum(&want[l4..])]), 0xffff);
    }
}

#[test]
fn finishing_an_offloaded_datagram_gives_linux_checksum() {
    // The UDP datagrams sent with and without offload have the same ports and data: finished,
    // the offloaded one carries the checksum the stack computed for the other.
    for (partial, fin) in [(UDP4_PARTIAL, UDP4_FINAL), (UDP6_PARTIAL, UDP6_FINAL)] {
        let mut f = qinq(&frame(partial), 0);
        finish_frame(&mut f).expect("finished");
        let want = packet(fin);
        let (l4, _, _) = l4_and_field(&want);
        let at = ETHERNET_HEADER_LEN + 2 * VLAN_TAG_LEN + l4;
        assert_eq!(&f[at..], &want[l4..]);
    }
    // TCP: the SYNs differ; the finished one verifies, and finishing a final frame whose
    // field was set back to the pseudo-header sum restores it.
    for hex in [TCP4_SYN_PARTIAL, TCP6_SYN_PARTIAL] {
        let mut p = packet(hex);
        finish_ip(&mut p).expect("finished");
        let (l4, _, proto) = l4_and_field(&p);
        let ph = pseudo_header_of(&p, proto, (p.len() - l4) as u32).expect("ip");
        assert_eq!(combine(&[ph, sum(&p[l4..])]), 0xffff);
    }
    for hex in [TCP4_SYN_FINAL, TCP6_SYN_FINAL] {
        let want = qinq(&frame(hex), 0);
        let mut f = want.clone();
        let ip = ETHERNET_HEADER_LEN + 2 * VLAN_TAG_LEN;
        let (l4, at, proto) = l4_and_field(&f[ip..]);
        let ph = pseudo_header_of(&f[ip..], proto, (f.len() - ip - l4) as u32).expect("ip");
        f[ip + at..ip + at + 2].copy_from_slice(&ph.to_be_bytes());
        finish_frame(&mut f).expect("finished");
        assert_eq!(f, want);
    }
}

#[test]
fn padding_after_the_packet_is_not_summed() {
    // A 60-byte minimum frame pads the short datagram; the padding is no part of it.
    let mut f = qinq(&frame(UDP4_PARTIAL), 30);
    finish_frame(&mut f).expect("finished");
    let ip = ETHERNET_HEADER_LEN + 2 * VLAN_TAG_LEN;
    let want = packet(UDP4_FINAL);
    assert_eq!(field(&f, ip + 26), field(&want, 26));
    // A single 802.1Q tag is an attachment's too.
    let mut untagged = frame(UDP6_PARTIAL);
    let mut f = untagged[..12].to_vec();
    f.extend_from_slice(&[0x81, 0x00, 0x00, 7]);
    f.extend_from_slice(&untagged[12..]);
    finish_frame(&mut f).expect("finished");
    untagged = packet(UDP6_FINAL);
    assert_eq!(&f[18..], &untagged[..]);
}

#[test]
fn what_cannot_be_finished_is_left_alone() {
    let tagged = qinq(&frame(UDP4_PARTIAL), 0);
    let ip = ETHERNET_HEADER_LEN + 2 * VLAN_TAG_LEN;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("untagged", frame(UDP4_PARTIAL)),
        ("truncated tags", tagged[..16].to_vec()),
        ("arp ethertype", {
            let mut f = tagged.clone();
            f[20..22].copy_from_slice(&[0x08, 0x06]);
            f
        }),
        ("ethertype says ipv6", {
            let mut f = tagged.clone();
            f[20..22].copy_from_slice(&[0x86, 0xdd]);
            f
        }),
        ("ip truncated", tagged[..tagged.len() - 1].to_vec()),
        ("fragment", {
            let mut f = tagged.clone();
            f[ip + 6] |= 0x20; // more fragments
            f
        }),
        ("icmp", {
            let mut f = tagged.clone();
            f[ip + 9] = 1;
            f
        }),
        ("udp header cut", {
            // Total length 24: 4 bytes of the 8-byte UDP header.
            let mut f = tagged[..ip + 24].to_vec();
            f[ip + 2..ip + 4].copy_from_slice(&24u16.to_be_bytes());
            f
        }),
    ];
    for (what, mut f) in cases {
        let before = f.clone();
        assert!(finish_frame(&mut f).is_err(), "{what}");
        assert_eq!(f, before, "{what}");
    }
    assert!(matches!(
        fill_l4(&mut [0x45; 20], 20, IpProtocol::UDP),
        Err(WireError::Truncated { what: "udp", .. })
    ));
    assert!(matches!(
        fill_l4(&mut [0x45; 40], 60, IpProtocol::TCP),
        Err(WireError::Truncated { what: "tcp", .. })
    ));
    assert!(pseudo_header_of(&[0x45; 19], IpProtocol::UDP, 8).is_err());
    assert!(pseudo_header_of(&[0x65; 39], IpProtocol::UDP, 8).is_err());
    assert!(pseudo_header_of(&[0x55; 40], IpProtocol::UDP, 8).is_err());
    assert!(pseudo_header_of(&[0x45; 20], IpProtocol::UDP, 70_000).is_err());
}

/// A TCP or UDP packet over IPv4 or IPv6 with the given addresses, ports and data, its
/// checksum field holding the pseudo-header sum (as a local stack with offload leaves it).
fn offloaded(v6: bool, tcp: bool, addrs: &[u8; 32], ports: [u16; 2], data: &[u8]) -> Vec<u8> {
    let (ip_len, proto) = (if v6 { 40 } else { 20 }, if tcp { 6u8 } else { 17 });
    let l4_len = if tcp { 20 } else { 8 } + data.len();
    let mut p = vec![0u8; ip_len];
    if v6 {
        p[0] = 0x60;
        p[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
        p[6] = proto;
        p[7] = 64;
        p[8..40].copy_from_slice(addrs);
    } else {
        p[0] = 0x45;
        p[2..4].copy_from_slice(&((20 + l4_len) as u16).to_be_bytes());
        p[8] = 64;
        p[9] = proto;
        p[12..20].copy_from_slice(&addrs[..8]);
        let c = !naive_sum(&p);
        p[10..12].copy_from_slice(&c.to_be_bytes());
    }
    p.extend_from_slice(&ports[0].to_be_bytes());
    p.extend_from_slice(&ports[1].to_be_bytes());
    if tcp {
        p.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
    } else {
        p.extend_from_slice(&(l4_len as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0]);
    }
    p.extend_from_slice(data);
    // The pseudo-header sum, word by word (RFC 768, RFC 8200 §8.1).
    let a = if v6 { &addrs[..] } else { &addrs[..8] };
    let ph = naive_sum(&[a, &[0, proto], &(l4_len as u32).to_be_bytes()[..]].concat());
    let at = ip_len + if tcp { 16 } else { 6 };
    p[at..at + 2].copy_from_slice(&ph.to_be_bytes());
    p
}

proptest! {
    #[test]
    fn sum_matches_the_naive_sum(data in prop::collection::vec(any::<u8>(), 0..3000), skip in 0usize..8) {
        let d = &data[skip.min(data.len())..];
        prop_assert_eq!(sum(d), naive_sum(d));
    }

    #[test]
    fn finishing_a_pseudo_header_sum_gives_the_full_checksum(
        v6 in any::<bool>(),
        tcp in any::<bool>(),
        addrs in any::<[u8; 32]>(),
        ports in any::<[u16; 2]>(),
        data in prop::collection::vec(any::<u8>(), 0..1500),
        tags in prop::sample::select(vec![0usize, 1, 2]),
        pad in 0usize..20,
    ) {
        let p = offloaded(v6, tcp, &addrs, ports, &data);
        let l4 = if v6 { 40 } else { 20 };
        let at = l4 + if tcp { 16 } else { 6 };
        // Independently: zero the field, sum the pseudo-header (now in the field's place,
        // so the field's old value) and the segment word by word.
        let ph = field(&p, at);
        let mut zeroed = p.clone();
        zeroed[at..at + 2].copy_from_slice(&[0, 0]);
        let mut want = !naive_sum(&[&ph.to_be_bytes()[..], &zeroed[l4..]].concat());
        if want == 0 && !tcp {
            want = 0xffff;
        }
        // The UDP view computes it its own way from the addresses.
        if !tcp {
            let mut u = zeroed[l4..].to_vec();
            let mut udp = UdpPacket::new_checked(&mut u[..]).expect("udp");
            if v6 {
                let s = Ipv6Addr::from(<[u8; 16]>::try_from(&addrs[..16]).expect("16"));
                let d = Ipv6Addr::from(<[u8; 16]>::try_from(&addrs[16..]).expect("16"));
                udp.fill_checksum_v6(&s, &d);
            } else {
                let s = Ipv4Addr::from(<[u8; 4]>::try_from(&addrs[..4]).expect("4"));
                let d = Ipv4Addr::from(<[u8; 4]>::try_from(&addrs[4..8]).expect("4"));
                udp.fill_checksum_v4(s, d);
            }
            prop_assert_eq!(udp.checksum(), want);
        }
        // The packet alone, and in a tagged frame with padding.
        let mut q = p.clone();
        finish_ip(&mut q).expect("finished");
        prop_assert_eq!(field(&q, at), want);
        let mut f = vec![2u8; 12];
        f.extend_from_slice(&match tags {
            0 => vec![0x81, 0x00, 0x00, 5],
            1 => vec![0x88, 0xa8, 0x00, 5, 0x81, 0x00, 0x00, 6],
            _ => vec![0x88, 0xa8, 0x0f, 0xfe, 0x81, 0x00, 0x00, 1],
        });
        f.extend_from_slice(if v6 { &[0x86, 0xdd] } else { &[0x08, 0x00] });
        let ip = f.len();
        f.extend_from_slice(&p);
        f.extend(std::iter::repeat_n(0xa5, pad));
        finish_frame(&mut f).expect("finished");
        prop_assert_eq!(&f[ip..ip + p.len()], &q[..]);
        prop_assert!(f[ip + p.len()..].iter().all(|&b| b == 0xa5));
    }
}
