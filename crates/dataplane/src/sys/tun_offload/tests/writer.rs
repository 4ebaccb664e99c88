//! Tests of [`TunWriter`]: which packets coalesce, the super-packet header and partial
//! checksum, limits, and coalesce -> split round trips.

use super::*;
use std::io;

#[test]
fn a_tcp_flow_coalesces_into_one_write_and_splits_back() {
    for first in [Pkt::tcp4(1000), Pkt::tcp6(1000)] {
        let mut pkts = vec![first.clone()];
        for len in [1000, 1000, 1000, 300] {
            let n = pkts.last().expect("one").next(len);
            pkts.push(n);
        }
        pkts.last_mut().expect("last").flags |= TCP_PSH;
        let built: Vec<Vec<u8>> = pkts.iter().map(Pkt::build).collect();
        let frames = coalesce(Offloads::ALL, &built);
        assert_eq!(frames.len(), 1);
        let vh = VnetHdr::parse(&frames[0]).expect("header");
        let l4 = if first.v6 { 40 } else { 20 };
        assert_eq!(
            vh,
            VnetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: if first.v6 { GSO_TCPV6 } else { GSO_TCPV4 },
                hdr_len: (l4 + 20) as u16,
                gso_size: 1000,
                csum_start: l4 as u16,
                csum_offset: 16,
            }
        );
        assert_eq!(frames[0].len(), VNET_HDR_LEN + l4 + 20 + 4300);
        assert_super_packet_completes(&frames[0]);
        assert_eq!(round_trip(&frames), built);
    }
}

#[test]
fn udp_flows_coalesce_only_with_uso() {
    for first in [Pkt::tcp4(1200).udp(), Pkt::tcp6(1200).udp()] {
        let built: Vec<Vec<u8>> = [1200, 1200, 700]
            .iter()
            .scan(None::<Pkt>, |prev, &len| {
                let p = match prev {
                    None => first.clone(),
                    Some(p) => p.next(len),
                };
                *prev = Some(p.clone());
                Some(p.build())
            })
            .collect();
        let frames = coalesce(Offloads::ALL, &built);
        assert_eq!(frames.len(), 1);
        let vh = VnetHdr::parse(&frames[0]).expect("header");
        assert_eq!(
            (vh.gso_type, vh.gso_size, vh.csum_offset),
            (GSO_UDP_L4, 1200, 6)
        );
        assert_super_packet_completes(&frames[0]);
        assert_eq!(round_trip(&frames), built);
        let singles = coalesce(Offloads::ALL.without_uso(), &built);
        assert_eq!(singles.len(), 3);
        assert!(singles
            .iter()
            .all(|f| f[..VNET_HDR_LEN] == [0; VNET_HDR_LEN]));
        assert_eq!(round_trip(&singles), built);
    }
}

#[test]
fn interleaved_flows_coalesce_per_flow_in_order() {
    let a1 = Pkt::tcp4(500);
    let mut b1 = Pkt::tcp4(500);
    b1.sport = 40001;
    let (a2, b2) = (a1.next(500), b1.next(500));
    let a3 = a2.next(100);
    let built: Vec<Vec<u8>> = [&a1, &b1, &a2, &b2, &a3]
        .iter()
        .map(|p| p.build())
        .collect();
    let frames = coalesce(Offloads::ALL, &built);
    assert_eq!(frames.len(), 2);
    let out = round_trip(&frames);
    assert_eq!(
        out,
        vec![a1.build(), a2.build(), a3.build(), b1.build(), b2.build()]
    );
}

#[test]
fn a_packet_that_cannot_join_blocks_older_entries_of_its_flow() {
    // With DF the IDs do not matter, so only the ordering rule keeps a2 out of a1's entry.
    let mut a1 = Pkt::tcp4(500);
    a1.df = true;
    let ack = a1.next(0);
    let a2 = ack.next(500);
    let built: Vec<Vec<u8>> = [&a1, &ack, &a2].iter().map(|p| p.build()).collect();
    let frames = coalesce(Offloads::ALL, &built);
    assert_eq!(frames.len(), 3, "the pure ACK keeps a2 from overtaking it");
    assert_eq!(round_trip(&frames), built);
}

#[test]
fn packets_that_must_not_merge_are_written_alone_and_unchanged() {
    type Change = fn(&mut Pkt);
    let cases: [(&str, Change); 16] = [
        ("ttl", |p| p.ttl = 63),
        ("tos", |p| p.tos = 4),
        ("ip options", |p| p.ip_opts = vec![1, 1, 1, 0]),
        ("window", |p| p.window = 1024),
        ("ack", |p| p.ack = 78),
        ("tcp options", |p| p.tcp_opts = vec![1, 1, 1, 1]),
        ("sequence gap", |p| p.seq = p.seq.wrapping_add(1)),
        ("bigger than the first", |p| p.payload.push(0)),
        ("syn", |p| p.flags |= TCP_SYN),
        ("cwr", |p| p.flags |= TCP_CWR),
        ("urg", |p| p.flags |= TCP_URG),
        ("rst", |p| p.flags |= TCP_RST),
        ("no ack", |p| p.flags = TCP_PSH),
        ("ip id not next", |p| p.id = p.id.wrapping_add(5)),
        ("df differs", |p| p.df = true),
        ("other port", |p| p.dport = 1),
    ];
    for (what, change) in cases {
        let a = Pkt::tcp4(1000);
        let mut b = a.next(1000);
        change(&mut b);
        let built = vec![a.build(), b.build()];
        let frames = coalesce(Offloads::ALL, &built);
        assert_eq!(frames.len(), 2, "{what}");
        assert_eq!(round_trip(&frames), built, "{what}");
    }
    // After PSH or FIN, or after a short segment, nothing joins.
    for flag in [TCP_PSH, TCP_FIN] {
        let mut a = Pkt::tcp4(1000);
        a.flags |= flag;
        let built = vec![a.build(), a.next(1000).build()];
        assert_eq!(coalesce(Offloads::ALL, &built).len(), 2);
    }
    let a = Pkt::tcp4(1000);
    let b = a.next(400);
    let built = vec![a.build(), b.build(), b.next(400).build()];
    assert_eq!(coalesce(Offloads::ALL, &built).len(), 2);
    // A bad checksum is never laundered: alone, byte for byte.
    let a = Pkt::tcp4(1000);
    let mut bad = a.next(1000).build();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    let built = vec![a.build(), bad];
    let frames = coalesce(Offloads::ALL, &built);
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[1][VNET_HDR_LEN..], built[1][..]);
    // Nor is a bad IPv4 header checksum, a UDP datagram without checksum, or a fragment.
    let mut bad_ip = a.next(1000).build();
    bad_ip[10] ^= 1;
    let u = Pkt::tcp4(100).udp();
    let mut nocsum = u.next(100).build();
    nocsum[26..28].fill(0);
    let mut frag = a.next(1000).build();
    frag[6] = 0x20;
    for built in [
        vec![a.build(), bad_ip],
        vec![u.build(), nocsum],
        vec![a.build(), frag],
    ] {
        let frames = coalesce(Offloads::ALL, &built);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[1][VNET_HDR_LEN..], built[1][..]);
    }
}

#[test]
fn with_df_the_ip_id_may_jump() {
    // RFC 6864 §4.1: the ID of an atomic datagram means nothing; the split renumbers.
    let mut a = Pkt::tcp4(1000);
    a.df = true;
    let mut b = a.next(1000);
    b.id = 0x9999;
    let frames = coalesce(Offloads::ALL, &[a.build(), b.build()]);
    assert_eq!(frames.len(), 1);
    let out = round_trip(&frames);
    b.id = a.id + 1;
    assert_eq!(out, vec![a.build(), b.build()]);
}

#[test]
fn limits_start_new_super_packets() {
    // At most MAX_SEGMENTS per write.
    let mut p = Pkt::tcp4(100);
    let mut built = vec![];
    for _ in 0..70 {
        built.push(p.build());
        p = p.next(100);
    }
    let frames = coalesce(Offloads::ALL, &built);
    assert_eq!(frames.len(), 2);
    assert_eq!(round_trip(&frames), built);
    // At most 65 535 bytes in an IPv4 packet: 46 segments of 1400 bytes.
    let mut p = Pkt::tcp4(1400);
    let mut built = vec![];
    for _ in 0..50 {
        built.push(p.build());
        p = p.next(1400);
    }
    let frames = coalesce(Offloads::ALL, &built);
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[0].len(), VNET_HDR_LEN + 40 + 46 * 1400);
    assert_eq!(round_trip(&frames), built);
}

#[test]
fn a_plain_writer_writes_each_packet_without_a_header() {
    let a = Pkt::tcp4(1000);
    let built = vec![a.build(), a.next(1000).build(), vec![0x45, 0, 0]];
    let frames = coalesce(Offloads::NONE, &built);
    assert_eq!(frames, built);
}

#[test]
fn full_rejected_and_failed_writes() {
    let mut w = TunWriter::new(Offloads::ALL, 0, 2);
    let a = Pkt::tcp4(1000);
    assert_eq!(w.push(&[]), Push::Rejected);
    assert_eq!(w.push(&vec![0x45; MAX_IP_PACKET + 1]), Push::Rejected);
    assert_eq!(w.push(&a.build()), Push::Queued);
    assert_eq!(w.push(&a.next(1000).build()), Push::Queued);
    assert_eq!(w.push(&a.next(1000).build()), Push::Full, "packet limit");
    assert_eq!(w.len(), 2);
    let st = w.drain(|_| Err(io::Error::from(io::ErrorKind::InvalidInput)));
    assert_eq!(
        st,
        FlushStats {
            packets: 0,
            writes: 0,
            super_packets: 0,
            failed: 2,
            last_error: Some(io::ErrorKind::InvalidInput),
        }
    );
    assert!(w.is_empty());
    // The byte limit: the smallest writer holds one largest packet, then is full.
    let mut w = TunWriter::new(Offloads::ALL, 0, 100);
    let big = vec![0x45; 60_000];
    assert_eq!(w.push(&big), Push::Queued);
    assert_eq!(w.push(&big), Push::Full);
    assert_eq!(drain_frames(&mut w).len(), 1);
    assert_eq!(w.push(&big), Push::Queued);
}

proptest! {
    #[test]
    fn coalesce_then_split_gives_back_every_packet(
        flows in prop::collection::vec(arb_flow(), 1..4),
        events in prop::collection::vec((0usize..4, 0usize..1600, 0u8..10), 1..120),
    ) {
        // Each flow's packets follow on (sequence numbers, IP IDs); sizes and PSH are random.
        // Distinct ports keep the flows apart (equal flows with DF could renumber IP IDs).
        let flows: Vec<Pkt> = flows
            .into_iter()
            .enumerate()
            .map(|(i, mut f)| {
                f.sport = 1000 + i as u16;
                f
            })
            .collect();
        let mut last: Vec<Option<Pkt>> = vec![None; flows.len()];
        let mut pushed: Vec<(usize, Vec<u8>)> = vec![];
        for (f, len, r) in events {
            let f = f % flows.len();
            let mut p = match &last[f] {
                None => flows[f].next(len),
                Some(prev) => prev.next(len),
            };
            if p.tcp {
                p.flags = if r == 0 { TCP_ACK | TCP_PSH } else { TCP_ACK };
            }
            pushed.push((f, p.build()));
            last[f] = Some(p);
        }
        let mut w = TunWriter::new(Offloads::ALL, 200_000, 50);
        let mut frames = vec![];
        for (_, p) in &pushed {
            match w.push(p) {
                Push::Queued => {}
                Push::Full => {
                    frames.extend(drain_frames(&mut w));
                    prop_assert_eq!(w.push(p), Push::Queued);
                }
                Push::Rejected => prop_assert!(false, "valid packet rejected"),
            }
        }
        frames.extend(drain_frames(&mut w));
        prop_assert!(frames.len() <= pushed.len());
        let out = round_trip(&frames);
        prop_assert_eq!(out.len(), pushed.len());
        // Per flow (which the ports and family tell apart, or equal flows that are one flow)
        // the packets come back byte for byte, in order.
        let key = |p: &[u8]| {
            let (l4, proto) = l4_of(p);
            (p[0] >> 4, proto, p[l4..l4 + 4].to_vec())
        };
        for (_, first) in &pushed {
            let k = key(first);
            let want: Vec<&Vec<u8>> =
                pushed.iter().map(|(_, p)| p).filter(|p| key(p) == k).collect();
            let got: Vec<&Vec<u8>> = out.iter().filter(|p| key(p) == k).collect();
            prop_assert_eq!(got, want);
        }
    }
}
