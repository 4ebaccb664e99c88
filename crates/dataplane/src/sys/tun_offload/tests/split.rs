//! Tests of [`split_frame`] on kernel-style super-packets: segment headers, checksums (checked
//! with the naive routine), malformed frames and the in-place move.

use super::*;

#[test]
fn tcp4_split_with_short_last_segment_fin_psh_and_cwr() {
    let mut p = Pkt::tcp4(3500);
    p.flags = TCP_ACK | TCP_PSH | TCP_FIN | TCP_CWR;
    p.tcp_opts = vec![1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]; // NOP NOP timestamps
    p.ip_opts = vec![1, 1, 1, 0]; // NOP NOP NOP EOL
    let mut frame = p.as_super(1000);
    frame[1] |= GSO_ECN;
    let segs = split_bytes(&frame).expect("split");
    assert_eq!(segs.len(), 4);
    let hdr = 24 + 32;
    for (k, s) in segs.iter().enumerate() {
        let want_payload = if k < 3 { 1000 } else { 500 };
        assert_eq!(s.len(), hdr + want_payload);
        assert!(checksums_ok(s), "segment {k}");
        assert_eq!(usize::from(u16::from_be_bytes([s[2], s[3]])), s.len());
        assert_eq!(u16::from_be_bytes([s[4], s[5]]), 0x1234 + k as u16);
        let seq = u32::from_be_bytes([s[28], s[29], s[30], s[31]]);
        assert_eq!(seq, p.seq.wrapping_add(1000 * k as u32), "sequence wraps");
        let flags = s[24 + 13];
        assert_eq!(
            flags & (TCP_FIN | TCP_PSH) != 0,
            k == 3,
            "FIN/PSH on the last only"
        );
        assert_eq!(flags & TCP_CWR != 0, k == 0, "CWR on the first only");
        assert_eq!(&s[20..24], &p.ip_opts[..]);
        assert_eq!(&s[44..hdr], &p.tcp_opts[..]);
        assert_eq!(&s[hdr..], &p.payload[k * 1000..(k * 1000 + want_payload)]);
    }
}

#[test]
fn tcp6_split_with_destination_options() {
    let mut p = Pkt::tcp6(4000);
    p.dest_opts = true;
    p.flags = TCP_ACK | TCP_PSH;
    let segs = split_bytes(&p.as_super(1000)).expect("split");
    assert_eq!(segs.len(), 4, "an exact multiple gives full segments only");
    for (k, s) in segs.iter().enumerate() {
        assert_eq!(s.len(), 48 + 20 + 1000);
        assert_eq!(usize::from(u16::from_be_bytes([s[4], s[5]])), s.len() - 40);
        assert_eq!(&s[40..48], &p.build()[40..48], "the options header is kept");
        assert!(checksums_ok(s));
        assert_eq!(s[48 + 13] & TCP_PSH != 0, k == 3);
    }
}

#[test]
fn udp_split_for_both_families() {
    for p in [Pkt::tcp4(2500).udp(), Pkt::tcp6(2500).udp()] {
        let segs = split_bytes(&p.as_super(1200)).expect("split");
        assert_eq!(segs.iter().map(Vec::len).collect::<Vec<_>>().len(), 3);
        let l4 = if p.v6 { 40 } else { 20 };
        for (k, s) in segs.iter().enumerate() {
            assert!(checksums_ok(s), "{k}");
            assert_eq!(
                usize::from(u16::from_be_bytes([s[l4 + 4], s[l4 + 5]])),
                s.len() - l4
            );
            let want = &p.payload[k * 1200..(k * 1200 + 1200).min(2500)];
            assert_eq!(&s[l4 + 8..], want);
        }
    }
}

#[test]
fn a_gso_packet_with_one_segment_stays_whole() {
    let p = Pkt::tcp4(800);
    let segs = split_bytes(&p.as_super(1000)).expect("split");
    assert_eq!(segs, vec![p.build()]);
}

#[test]
fn partial_checksums_are_completed_without_gso() {
    for p in [Pkt::tcp4(100), Pkt::tcp6(33).udp()] {
        let mut frame = p.as_super(1000);
        frame[1] = GSO_NONE;
        assert_eq!(split_bytes(&frame).expect("completed"), vec![p.build()]);
    }
    // A sum that comes out zero is sent as 0xFFFF: choose the last two payload bytes so that
    // the data sums to all ones.
    let mut p = Pkt::tcp4(2).udp();
    p.payload = vec![0, 0];
    let c = {
        let b = p.build();
        u16::from_be_bytes([b[26], b[27]])
    };
    p.payload = c.to_be_bytes().to_vec();
    let mut frame = p.as_super(1000);
    frame[1] = GSO_NONE;
    let out = split_bytes(&frame).expect("completed");
    assert_eq!(&out[0][26..28], &[0xff, 0xff]);
    assert!(checksums_ok(&out[0]));
    // Offsets past the end are a bad header.
    let mut bad = frame.clone();
    bad[8..10].copy_from_slice(&100u16.to_ne_bytes());
    assert_eq!(split_bytes(&bad), Err(SplitFault::Drop(TunDrop::BadHeader)));
}

#[test]
fn malformed_super_packets_are_dropped_and_left_unchanged() {
    let good = Pkt::tcp4(3000).as_super(1000);
    let v = VNET_HDR_LEN;
    type Mutation = fn(&mut Vec<u8>);
    let cases: [(Mutation, TunDrop); 12] = [
        (|f| f[1] = 3, TunDrop::BadHeader),                  // legacy UFO
        (|f| f[1] = 9, TunDrop::BadHeader),                  // unknown type
        (|f| f[4..6].fill(0), TunDrop::BadHeader),           // gso_size 0
        (|f| f[1] = GSO_TCPV6, TunDrop::GsoMalformed),       // IPv4 packet, TCPv6 type
        (|f| f[VNET_HDR_LEN] = 0x55, TunDrop::GsoMalformed), // version 5
        (|f| f[VNET_HDR_LEN] = 0x44, TunDrop::GsoMalformed), // IHL 16 bytes
        (|f| f[VNET_HDR_LEN + 3] ^= 1, TunDrop::GsoMalformed), // total length
        (|f| f[VNET_HDR_LEN + 6] = 0x20, TunDrop::GsoMalformed), // a fragment (MF)
        (|f| f[6] = 24, TunDrop::GsoMalformed),              // csum_start
        (|f| f[8] = 6, TunDrop::GsoMalformed),               // csum_offset
        (|f| f[VNET_HDR_LEN + 32] = 0x40, TunDrop::GsoMalformed), // TCP header of 16 bytes
        (
            |f| {
                f.truncate(VNET_HDR_LEN + 30);
                f[VNET_HDR_LEN + 2] = 0;
                f[VNET_HDR_LEN + 3] = 30;
            },
            TunDrop::GsoMalformed,
        ), // TCP header cut short
    ];
    for (i, (mutate, why)) in cases.iter().enumerate() {
        let mut f = good.clone();
        mutate(&mut f);
        let pkt = f[v..].to_vec();
        let vh = VnetHdr::parse(&f).expect("header");
        let mut buf = vec![0u8; 1 << 17];
        buf[..pkt.len()].copy_from_slice(&pkt);
        let before = buf.clone();
        assert_eq!(
            split_frame(&mut buf, 0, pkt.len(), &vh),
            Err(SplitFault::Drop(*why)),
            "case {i}"
        );
        assert!(buf == before, "case {i} changed the buffer");
    }
    // IPv6 with a routing header, or UDP GSO over a TCP packet.
    let mut p = Pkt::tcp6(3000);
    p.dest_opts = true;
    let mut f = p.as_super(1000);
    f[v + 6] = 43;
    assert_eq!(
        split_bytes(&f),
        Err(SplitFault::Drop(TunDrop::GsoMalformed))
    );
    let mut f = Pkt::tcp4(3000).as_super(1000);
    f[1] = GSO_UDP_L4;
    assert_eq!(
        split_bytes(&f),
        Err(SplitFault::Drop(TunDrop::GsoMalformed))
    );
}

#[test]
fn no_room_is_reported_before_anything_moves() {
    let f = Pkt::tcp4(3000).as_super(1000);
    let vh = VnetHdr::parse(&f).expect("header");
    let pkt = &f[VNET_HDR_LEN..];
    let needed = 3 * 40 + 3000;
    let mut buf = vec![0u8; needed - 1];
    buf[..pkt.len()].copy_from_slice(pkt);
    let before = buf.clone();
    assert_eq!(
        split_frame(&mut buf, 0, pkt.len(), &vh),
        Err(SplitFault::NoRoom { needed })
    );
    assert!(buf == before);
    assert_eq!(
        split_frame(&mut buf, 100, pkt.len(), &vh),
        Err(SplitFault::Drop(TunDrop::Short)),
        "a frame past the buffer's end is refused, not read"
    );
}

proptest! {
    #[test]
    fn split_never_panics(
        bytes in prop::collection::vec(any::<u8>(), 0..400),
        flags in 0u8..4, gso_type in prop::sample::select(vec![0u8, 1, 3, 4, 5, 0x81, 0xff]),
        gso_size in 0u16..300, csum_start in 0u16..80, csum_offset in 0u16..40,
    ) {
        let vh = VnetHdr { flags, gso_type, hdr_len: 0, gso_size, csum_start, csum_offset };
        let mut buf = vec![0u8; 1 << 16];
        buf[..bytes.len()].copy_from_slice(&bytes);
        if let Ok(s) = split_frame(&mut buf, 0, bytes.len(), &vh) {
            prop_assert!(s.len <= buf.len() && s.stride > 0);
            prop_assert_eq!(s.len.div_ceil(s.stride), s.segments);
        }
    }

    #[test]
    fn kernel_super_packets_split_into_valid_segments(
        flow in arb_flow(), payload in 0usize..20_000, gso in 1u16..2000,
        psh in any::<bool>(),
    ) {
        let mut p = flow.next(payload);
        if psh { p.flags |= TCP_PSH; }
        let segs = split_bytes(&p.as_super(gso)).expect("a valid super-packet splits");
        let (l4, _) = l4_of(&segs[0]);
        let hdr = l4 + if p.tcp { 20 + p.tcp_opts.len() } else { 8 };
        let mut data = vec![];
        for (k, s) in segs.iter().enumerate() {
            prop_assert!(checksums_ok(s));
            prop_assert!(s.len() - hdr <= usize::from(gso));
            if p.tcp {
                let seq = u32::from_be_bytes([s[l4 + 4], s[l4 + 5], s[l4 + 6], s[l4 + 7]]);
                prop_assert_eq!(seq, p.seq.wrapping_add((k * usize::from(gso)) as u32));
                prop_assert_eq!(s[l4 + 13] & TCP_PSH != 0, psh && k + 1 == segs.len());
            }
            data.extend_from_slice(&s[hdr..]);
        }
        prop_assert_eq!(data, p.payload);
    }
}
