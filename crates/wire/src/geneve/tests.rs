//! Tests of the Geneve view, builder and Protego options: vectors, RFC 8926 edge cases,
//! truncation and random input, and an independent decode of a built frame by tshark.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

use super::*;
use crate::ethernet::{EthernetAddress, EthernetRepr, VlanTags, VlanTci};
use crate::ip::{IpProtocol, Ipv4Packet, Ipv4Repr, IPV4_HEADER_LEN};
use crate::udp::{UdpChecksum, UdpPacket, UdpRepr, UDP_HEADER_LEN};

fn vni(v: u32) -> Vni {
    Vni::new(v).unwrap()
}

fn ipv4_repr(v: u32) -> GeneveRepr {
    GeneveRepr {
        control: false,
        protocol_type: EtherType::IPV4,
        vni: vni(v),
    }
}

const PROBE: ProtegoOption = ProtegoOption::Probe(HealthProbe {
    id: 0x0102_0304,
    stamp: 0x0a0b_0c0d,
});

/// Geneve header with a probe and a tunnel-id option, then `payload`.
fn sample(payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; 64 + payload.len()];
    let mut b = GeneveBuilder::new(&mut buf, &ipv4_repr(0x12_3456)).unwrap();
    b.push_protego(&PROBE).unwrap();
    b.push_protego(&ProtegoOption::TunnelId(0xdead_beef))
        .unwrap();
    let off = b.finish();
    buf[off..off + payload.len()].copy_from_slice(payload);
    buf.truncate(off + payload.len());
    buf
}

#[test]
fn vector_probe_header() {
    let mut buf = [0u8; 20];
    let n = ipv4_repr(0x12_3456)
        .emit(
            &[GeneveOption {
                class: OptionClass::PROTEGO,
                option_type: OptionType::PROTEGO_PROBE,
                data: &[1, 2, 3, 4, 0x0a, 0x0b, 0x0c, 0x0d],
            }],
            &mut buf,
        )
        .unwrap();
    assert_eq!(n, 20);
    // Ver 0, Opt Len 3 words; no flags; IPv4; VNI 0x123456; option ff50/01, Length 2 words.
    assert_eq!(
        hex::encode(buf),
        "03000800" /* Ver|Opt Len, flags, Protocol Type */
            .to_owned()
            + "12345600" // VNI, reserved
            + "ff500102" // class, type, R|Length
            + "01020304" // probe id
            + "0a0b0c0d" // stamp
    );
    let mut typed = [0u8; 20];
    let mut b = GeneveBuilder::new(&mut typed, &ipv4_repr(0x12_3456)).unwrap();
    b.push_protego(&PROBE).unwrap();
    assert_eq!(b.finish(), 20);
    assert_eq!(typed, buf);
}

#[test]
fn round_trip_with_payload() {
    let payload = b"the whole original packet";
    let pkt = sample(payload);
    let p = GenevePacket::new_checked(&pkt[..]).unwrap();
    assert_eq!(p.version(), 0);
    assert_eq!(p.options_len(), 20);
    assert_eq!(p.header_len(), 28);
    assert!(!p.is_control());
    assert!(!p.critical_options_present());
    assert_eq!(p.protocol_type(), EtherType::IPV4);
    assert_eq!(p.vni().get(), 0x12_3456);
    assert_eq!(p.payload(), payload);
    let opts: Vec<_> = p.options().collect();
    assert_eq!(opts.len(), 2);
    assert_eq!(ProtegoOption::parse(&opts[0]).unwrap(), Some(PROBE));
    assert_eq!(
        ProtegoOption::parse(&opts[1]).unwrap(),
        Some(ProtegoOption::TunnelId(0xdead_beef))
    );
    assert!(!p.has_unknown_critical_option());
    let repr = GeneveRepr::parse(&p).unwrap();
    assert_eq!(repr, ipv4_repr(0x12_3456));

    // Rebuild from the parsed repr and options: identical bytes.
    let mut out = vec![0u8; repr.buffer_len(&opts) + payload.len()];
    let off = repr.emit(&opts, &mut out).unwrap();
    assert_eq!(off, 28);
    GenevePacket::new_unchecked(&mut out[..])
        .payload_mut()
        .copy_from_slice(payload);
    assert_eq!(out, pkt);
}

#[test]
fn every_truncation_into_the_header_is_rejected() {
    let pkt = sample(b"payload");
    let header_len = 28;
    for n in 0..header_len {
        let err = GenevePacket::new_checked(&pkt[..n]).unwrap_err();
        assert!(
            matches!(err, WireError::Truncated { what: "geneve", .. }),
            "cut at {n}: {err:?}"
        );
        assert!(GeneveRepr::parse(&GenevePacket::new_unchecked(&pkt[..n])).is_err());
    }
    // Geneve has no length field: a cut inside the payload leaves a shorter payload.
    for n in header_len..=pkt.len() {
        let p = GenevePacket::new_checked(&pkt[..n]).unwrap();
        assert_eq!(p.payload().len(), n - header_len);
        assert_eq!(p.options().count(), 2);
    }
}

#[test]
fn other_versions_rejected() {
    for version in 1..=3u8 {
        let mut pkt = sample(b"x");
        pkt[0] |= version << 6;
        assert_eq!(
            GenevePacket::new_checked(&pkt[..]),
            Err(WireError::Unsupported {
                what: "geneve",
                field: "version",
                value: u32::from(version),
            })
        );
    }
}

#[test]
fn opt_len_zero() {
    let mut buf = [0xaau8; 12];
    let n = ipv4_repr(1).emit(&[], &mut buf).unwrap();
    assert_eq!(n, GENEVE_HEADER_LEN);
    assert_eq!(&buf[..8], &[0, 0, 0x08, 0, 0, 0, 1, 0]);
    let p = GenevePacket::new_checked(&buf[..]).unwrap();
    assert_eq!(p.options_len(), 0);
    assert_eq!(p.options_bytes(), &[] as &[u8]);
    assert_eq!(p.options().count(), 0);
    assert_eq!(p.payload(), &[0xaa; 4]);
    assert!(!p.has_unknown_critical_option());
    // The bare 8-byte header with an empty payload is valid too.
    assert!(GenevePacket::new_checked(&buf[..8]).is_ok());
}

#[test]
fn max_opt_len_252() {
    let big = [0x5au8; MAX_OPTION_DATA_LEN];
    let opts = [
        GeneveOption {
            class: OptionClass(0xff00),
            option_type: OptionType(0x10),
            data: &big,
        },
        GeneveOption {
            class: OptionClass(0xffff),
            option_type: OptionType(0x11),
            data: &big[..120],
        },
    ];
    let repr = ipv4_repr(Vni::MAX);
    assert_eq!(repr.buffer_len(&opts), 8 + 252);
    let mut buf = [0u8; 8 + 252 + 4];
    assert_eq!(repr.emit(&opts, &mut buf).unwrap(), 260);
    assert_eq!(buf[0], 63);
    assert_eq!(buf[8 + 3], 31);
    let p = GenevePacket::new_checked(&buf[..]).unwrap();
    assert_eq!(p.options_len(), MAX_OPTIONS_LEN);
    assert_eq!(p.vni().get(), Vni::MAX);
    assert_eq!(p.options().collect::<Vec<_>>(), opts);
    assert_eq!(p.payload().len(), 4);

    // One more word is over the limit; nothing is appended.
    let mut buf = [0u8; 300];
    let mut b = GeneveBuilder::new(&mut buf, &repr).unwrap();
    b.push(&opts[0]).unwrap();
    b.push(&opts[1]).unwrap();
    let zero = GeneveOption {
        class: OptionClass(0xff00),
        option_type: OptionType(0),
        data: &[],
    };
    assert_eq!(
        b.push(&zero),
        Err(WireError::Malformed {
            what: "geneve",
            field: "opt len"
        })
    );
    assert_eq!(b.len(), 260);
    assert_eq!(b.finish(), 260);

    // One option cannot carry more than 31 words of data.
    let mut b = GeneveBuilder::new(&mut buf, &repr).unwrap();
    let too_long = [0u8; MAX_OPTION_DATA_LEN + 1];
    let opt = GeneveOption {
        data: &too_long,
        ..zero
    };
    let err = WireError::Malformed {
        what: "geneve",
        field: "option length",
    };
    assert_eq!(b.push(&opt), Err(err));
    assert_eq!(opt.emit(&mut [0u8; 200]), Err(err));
    assert!(b.is_empty());
}

#[test]
fn option_data_padded_and_zero_length() {
    let opts = [
        GeneveOption {
            class: OptionClass(0xff01),
            option_type: OptionType(0x7f),
            data: &[],
        },
        GeneveOption {
            class: OptionClass(0xff02),
            option_type: OptionType(0x01),
            data: &[1, 2, 3, 4, 5],
        },
        GeneveOption {
            class: OptionClass(0xff03),
            option_type: OptionType(0x02),
            data: &[],
        },
    ];
    let mut buf = [0xeeu8; 64];
    let n = ipv4_repr(9).emit(&opts, &mut buf).unwrap();
    assert_eq!(n, 8 + 4 + 12 + 4);
    assert_eq!(buf[0], 5);
    assert_eq!(&buf[12..24], &[0xff, 0x02, 0x01, 2, 1, 2, 3, 4, 5, 0, 0, 0]);
    let p = GenevePacket::new_checked(&buf[..n]).unwrap();
    let got: Vec<_> = p.options().collect();
    assert_eq!(got.len(), 3);
    assert_eq!(got[0], opts[0]);
    assert_eq!(got[1].data, &[1, 2, 3, 4, 5, 0, 0, 0]);
    assert_eq!(got[2], opts[2]);
}

#[test]
fn option_overrunning_opt_len_or_opt_len_overrunning_packet() {
    // Opt Len 2 words, but the option says 2 words of data (12 bytes in all).
    let mut pkt = vec![
        0x02, 0, 0x08, 0, 0, 0, 1, 0, 0xff, 0x50, 0x01, 0x02, 1, 2, 3, 4,
    ];
    pkt.extend_from_slice(&[9; 16]);
    assert_eq!(
        GenevePacket::new_checked(&pkt[..]),
        Err(WireError::Malformed {
            what: "geneve",
            field: "option length"
        })
    );
    assert_eq!(
        GeneveOptions::new(&pkt[8..16]).unwrap_err(),
        WireError::Malformed {
            what: "geneve",
            field: "option length"
        }
    );
    // The unchecked view's iterator stops instead of panicking.
    assert_eq!(GenevePacket::new_unchecked(&pkt[..]).options().count(), 0);
    // Opt Len 3 now matches; one byte short of it is truncated.
    pkt[0] = 3;
    assert_eq!(
        GenevePacket::new_checked(&pkt[..]).unwrap().payload().len(),
        12
    );
    assert_eq!(
        GenevePacket::new_checked(&pkt[..19]),
        Err(WireError::Truncated {
            what: "geneve",
            need: 20,
            got: 19
        })
    );
    // Opt Len 63 on a short packet.
    pkt[0] = 63;
    assert!(matches!(
        GenevePacket::new_checked(&pkt[..]),
        Err(WireError::Truncated {
            need: 260,
            got: 32,
            ..
        })
    ));
}

#[test]
fn reserved_bits_ignored_on_receipt_zero_on_send() {
    let mut pkt = sample(b"abc");
    pkt[1] |= 0x3f; // Rsvd. of the fixed header
    pkt[7] = 0xa5; // reserved octet after the VNI
    pkt[8 + 3] |= 0xe0; // R bits of the first option
    let p = GenevePacket::new_checked(&pkt[..]).unwrap();
    assert!(!p.is_control());
    assert!(!p.critical_options_present());
    assert_eq!(p.vni().get(), 0x12_3456);
    let opts: Vec<_> = p.options().collect();
    assert_eq!(ProtegoOption::parse(&opts[0]).unwrap(), Some(PROBE));
    let repr = GeneveRepr::parse(&p).unwrap();
    let mut out = vec![0xffu8; pkt.len()];
    let off = repr.emit(&opts, &mut out).unwrap();
    out[off..].copy_from_slice(p.payload());
    assert_eq!(out, sample(b"abc"));
}

#[test]
fn critical_options() {
    let unknown_critical = GeneveOption {
        class: OptionClass(0x0101),
        option_type: OptionType(0x80 | 0x05),
        data: &[0, 0, 0, 1],
    };
    let unknown = GeneveOption {
        class: OptionClass(0x0101),
        option_type: OptionType(0x05),
        data: &[0, 0, 0, 1],
    };
    let tunnel = GeneveOption {
        class: OptionClass::PROTEGO,
        option_type: OptionType::PROTEGO_TUNNEL_ID,
        data: &[0, 0, 0, 7],
    };
    let mut buf = [0u8; 64];

    // Only non-critical options: C clear, nothing to drop; the unknown one is skipped.
    let n = ipv4_repr(1).emit(&[unknown, tunnel], &mut buf).unwrap();
    let p = GenevePacket::new_checked(&buf[..n]).unwrap();
    assert!(!p.critical_options_present());
    assert!(!p.has_unknown_critical_option());
    let typed: Vec<_> = p
        .options()
        .filter_map(|o| ProtegoOption::parse(&o).unwrap())
        .collect();
    assert_eq!(typed, [ProtegoOption::TunnelId(7)]);

    // A critical option sets C; unknown to Protego, the packet must be dropped.
    let n = ipv4_repr(1)
        .emit(&[tunnel, unknown_critical], &mut buf)
        .unwrap();
    assert_eq!(buf[1], FLAG_CRITICAL);
    let p = GenevePacket::new_checked(&buf[..n]).unwrap();
    assert!(p.critical_options_present());
    assert!(p.has_unknown_critical_option());
    assert_eq!(p.unknown_critical_option(|_| false), Some(unknown_critical));
    // A receiver that knows it keeps the packet.
    assert_eq!(
        p.unknown_critical_option(|o| o.class == OptionClass(0x0101)),
        None
    );
    assert!(unknown_critical.is_critical() && !unknown.is_critical());

    // The options decide even if the sender forgot the C flag.
    let mut q = buf;
    GenevePacket::new_unchecked(&mut q[..]).set_critical_options_present(false);
    assert_eq!(q[1], 0);
    assert!(GenevePacket::new_checked(&q[..n])
        .unwrap()
        .has_unknown_critical_option());

    // A Protego class option with the critical bit is not one Protego knows.
    let crit_probe = GeneveOption {
        class: OptionClass::PROTEGO,
        option_type: OptionType(0x81),
        data: &[0; 8],
    };
    assert_eq!(ProtegoOption::parse(&crit_probe), Ok(None));
    let n = ipv4_repr(1).emit(&[crit_probe], &mut buf).unwrap();
    assert!(GenevePacket::new_checked(&buf[..n])
        .unwrap()
        .has_unknown_critical_option());
}

#[test]
fn control_flag_and_setters() {
    let repr = GeneveRepr {
        control: true,
        protocol_type: PROTOCOL_ETHERNET,
        vni: vni(5),
    };
    let mut buf = [0u8; 8];
    repr.emit(&[], &mut buf).unwrap();
    assert_eq!(buf, [0, FLAG_CONTROL, 0x65, 0x58, 0, 0, 5, 0]);
    let mut p = GenevePacket::new_checked(&mut buf[..]).unwrap();
    assert!(p.is_control());
    assert_eq!(GeneveRepr::parse(&p).unwrap(), repr);
    p.set_control(false);
    p.set_critical_options_present(true);
    p.set_protocol_type(EtherType::IPV6);
    p.set_vni(vni(Vni::MAX));
    assert!(!p.is_control());
    assert!(p.critical_options_present());
    assert_eq!(buf, [0, FLAG_CRITICAL, 0x86, 0xdd, 0xff, 0xff, 0xff, 0]);
}

#[test]
fn protego_options_round_trip_and_lengths() {
    for opt in [
        PROBE,
        ProtegoOption::ProbeReply(HealthProbe {
            id: u32::MAX,
            stamp: 0,
        }),
        ProtegoOption::TunnelId(0),
        ProtegoOption::TunnelId(u32::MAX),
        ProtegoOption::Port(0),
        ProtegoOption::Port(0x0102_0304),
    ] {
        let mut buf = [0u8; 16];
        let n = opt.emit(&mut buf).unwrap();
        assert_eq!(n, opt.buffer_len());
        let (raw, len) = GeneveOption::parse(&buf[..n]).unwrap();
        assert_eq!(len, n);
        assert_eq!(raw.class, OptionClass::PROTEGO);
        assert_eq!(raw.option_type, opt.option_type());
        assert!(!raw.is_critical());
        assert_eq!(ProtegoOption::parse(&raw), Ok(Some(opt)));
        assert!(matches!(
            opt.emit(&mut buf[..n - 1]),
            Err(WireError::BufferTooSmall { .. })
        ));
    }
    let bad = WireError::Malformed {
        what: "geneve protego option",
        field: "length",
    };
    for (t, len) in [
        (1u8, 4usize),
        (1, 12),
        (2, 0),
        (3, 8),
        (3, 0),
        (4, 8),
        (4, 0),
    ] {
        let data = [0u8; 12];
        let o = GeneveOption {
            class: OptionClass::PROTEGO,
            option_type: OptionType(t),
            data: &data[..len],
        };
        assert_eq!(ProtegoOption::parse(&o), Err(bad), "type {t} len {len}");
    }
    // Unknown Protego type or another class: not ours, skipped.
    let other = GeneveOption {
        class: OptionClass::PROTEGO,
        option_type: OptionType(0x05),
        data: &[0; 4],
    };
    assert_eq!(ProtegoOption::parse(&other), Ok(None));
    let other = GeneveOption {
        class: OptionClass(0xff51),
        ..other
    };
    assert_eq!(ProtegoOption::parse(&other), Ok(None));
    assert!(OptionClass::PROTEGO.is_experimental());
    assert!(!OptionClass(0x0100).is_experimental());
    assert_eq!(format!("{:?}", OptionClass::PROTEGO), "PROTEGO");
    assert_eq!(format!("{}", OptionType(0x81)), "0x81");
}

#[test]
fn builder_buffer_errors() {
    let repr = ipv4_repr(1);
    assert!(matches!(
        GeneveBuilder::new(&mut [0u8; 7], &repr),
        Err(WireError::BufferTooSmall { what: "geneve", .. })
    ));
    let mut buf = [0u8; 16];
    let mut b = GeneveBuilder::new(&mut buf, &repr).unwrap();
    b.push_protego(&ProtegoOption::TunnelId(1)).unwrap();
    assert_eq!(
        b.push_protego(&PROBE),
        Err(WireError::BufferTooSmall {
            what: "geneve",
            need: 28,
            got: 16
        })
    );
    assert_eq!(b.finish(), 16);
    assert_eq!(buf[0], 2);
    assert!(matches!(
        repr.emit(&[], &mut [0u8; 4]),
        Err(WireError::BufferTooSmall { .. })
    ));
}

/// xorshift64*: deterministic, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Runs every accessor and parser on `bytes`; they must return, never panic.
fn exercise(bytes: &[u8]) -> bool {
    let _ = GeneveOptions::new(bytes).map(|o| o.count());
    let _ = GeneveOption::parse(bytes);
    let Ok(p) = GenevePacket::new_checked(bytes) else {
        return false;
    };
    let _ = GeneveRepr::parse(&p).unwrap();
    let mut total = 0;
    for o in p.options() {
        total += OPTION_HEADER_LEN + o.data.len();
        let _ = ProtegoOption::parse(&o);
    }
    assert_eq!(total, p.options_len());
    let _ = p.has_unknown_critical_option();
    assert_eq!(p.header_len() + p.payload().len(), bytes.len());
    true
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut accepted = 0;
    for i in 0..50_000 {
        let len = rng.below(300);
        let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        // Steer half of the inputs past the version and Opt Len checks into the options.
        if i % 2 == 0 && len >= GENEVE_HEADER_LEN {
            let words = rng.below((len - GENEVE_HEADER_LEN) / 4 + 1).min(63);
            b[0] = words as u8;
            // Small option lengths so that chains of options often fit exactly.
            let mut at = GENEVE_HEADER_LEN;
            while at + 4 <= GENEVE_HEADER_LEN + words * 4 {
                b[at + 3] = (b[at + 3] & 0xe0) | (rng.below(4) as u8);
                at += 4 + usize::from(b[at + 3] & 0x1f) * 4;
            }
        }
        if exercise(&b) {
            accepted += 1;
        }
    }
    // The steering must reach the accepting paths, not only the error ones.
    assert!(accepted > 5_000, "only {accepted} accepted");
}

#[test]
fn mutated_packets_never_panic() {
    let valid = sample(b"0123456789abcdef");
    let mut rng = Rng(42);
    for _ in 0..20_000 {
        let mut b = valid.clone();
        for _ in 0..=rng.below(4) {
            let at = rng.below(b.len());
            b[at] = rng.next() as u8;
        }
        b.truncate(rng.below(b.len() + 1));
        exercise(&b);
    }
}

// ---- Independent decoder: tshark ----

const OUTER_SRC: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const OUTER_DST: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);
const PEER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
const VIP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);

/// The peer's ESP-in-UDP packet as the steer node received it: IPv4/UDP 4500 -> 4500, ESP
/// with SPI 0xc0de0001, sequence `seq` and 16 bytes of ciphertext.
fn peer_packet(seq: u32) -> Vec<u8> {
    let mut esp = vec![0xc0, 0xde, 0x00, 0x01];
    esp.extend_from_slice(&seq.to_be_bytes());
    esp.extend((0u8..16).map(|i| i.wrapping_mul(37)));
    let udp_len = UDP_HEADER_LEN + esp.len();
    let mut pkt = vec![0u8; IPV4_HEADER_LEN + udp_len];
    Ipv4Repr {
        src_addr: PEER,
        dst_addr: VIP,
        protocol: IpProtocol::UDP,
        payload_len: udp_len,
        ttl: 60,
        dscp: 0,
        ecn: 0,
        ident: 0x1234,
        dont_frag: true,
    }
    .emit(&mut pkt)
    .unwrap();
    let udp = &mut pkt[IPV4_HEADER_LEN..];
    udp[UDP_HEADER_LEN..].copy_from_slice(&esp);
    UdpRepr {
        src_port: 4500,
        dst_port: 4500,
        payload_len: esp.len(),
    }
    .emit(
        udp,
        UdpChecksum::V4 {
            src: PEER,
            dst: VIP,
        },
    )
    .unwrap();
    pkt
}

/// Ethernet/IPv4/UDP(6081)/Geneve frame carrying `inner` with `options`.
fn geneve_frame(repr: &GeneveRepr, options: &[GeneveOption<'_>], inner: &[u8]) -> Vec<u8> {
    let geneve_len = repr.buffer_len(options) + inner.len();
    let udp_len = UDP_HEADER_LEN + geneve_len;
    let eth = EthernetRepr {
        src_addr: EthernetAddress([2, 0, 0, 0, 0x0a, 1]),
        dst_addr: EthernetAddress([2, 0, 0, 0, 0x0b, 2]),
        vlans: VlanTags::None,
        ethertype: EtherType::IPV4,
    };
    let mut f = vec![0u8; eth.buffer_len() + IPV4_HEADER_LEN + udp_len];
    let mut off = eth.emit(&mut f).unwrap();
    off += Ipv4Repr {
        src_addr: OUTER_SRC,
        dst_addr: OUTER_DST,
        protocol: IpProtocol::UDP,
        payload_len: udp_len,
        ttl: 64,
        dscp: 0,
        ecn: 0,
        ident: 7,
        dont_frag: true,
    }
    .emit(&mut f[off..])
    .unwrap();
    let udp = &mut f[off..];
    let g = repr.emit(options, &mut udp[UDP_HEADER_LEN..]).unwrap();
    udp[UDP_HEADER_LEN + g..].copy_from_slice(inner);
    UdpRepr {
        src_port: 49_152,
        dst_port: GENEVE_PORT,
        payload_len: geneve_len,
    }
    .emit(
        udp,
        UdpChecksum::V4 {
            src: OUTER_SRC,
            dst: OUTER_DST,
        },
    )
    .unwrap();
    f
}

/// A classic libpcap file (microsecond timestamps, LINKTYPE_ETHERNET) holding `frames`.
fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes()); // thiszone
    out.extend_from_slice(&0u32.to_le_bytes()); // sigfigs
    out.extend_from_slice(&65_535u32.to_le_bytes()); // snaplen
    out.extend_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
    for (i, f) in frames.iter().enumerate() {
        let len = u32::try_from(f.len()).unwrap();
        out.extend_from_slice(&1_700_000_000u32.to_le_bytes());
        out.extend_from_slice(&u32::try_from(i).unwrap().to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}

/// Deletes the capture file when the test ends, passing or failing.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn tshark_decodes_built_frames() {
    if !testreq::program("tshark_decodes_built_frames", "tshark") {
        return;
    }
    let inner = peer_packet(1);
    // Another ESP sequence number, or Wireshark warns of a repeated one.
    let inner2 = peer_packet(2);
    // Sanity: our own views accept the inner packet.
    let ip = Ipv4Packet::new_checked(&inner[..]).unwrap();
    assert!(UdpPacket::new_checked(ip.payload())
        .unwrap()
        .verify_checksum_v4(PEER, VIP));

    let mut opts_buf = [0u8; 20];
    let n1 = PROBE.emit(&mut opts_buf).unwrap();
    ProtegoOption::TunnelId(0xdead_beef)
        .emit(&mut opts_buf[n1..])
        .unwrap();
    let (probe, _) = GeneveOption::parse(&opts_buf).unwrap();
    let (tunnel, _) = GeneveOption::parse(&opts_buf[n1..]).unwrap();

    let frame1 = geneve_frame(&ipv4_repr(0x12_3456), &[probe, tunnel], &inner);
    // A control packet with an unknown critical option without data, and a probe reply.
    // (It carries the inner packet too: Wireshark flags an empty IPv4 payload as malformed.)
    let critical = GeneveOption {
        class: OptionClass(0xff51),
        option_type: OptionType(0x85),
        data: &[],
    };
    let mut reply_buf = [0u8; 12];
    ProtegoOption::ProbeReply(HealthProbe {
        id: 0x0102_0304,
        stamp: 0x0a0b_0c0d,
    })
    .emit(&mut reply_buf)
    .unwrap();
    let (reply, _) = GeneveOption::parse(&reply_buf).unwrap();
    let frame2 = geneve_frame(
        &GeneveRepr {
            control: true,
            protocol_type: EtherType::IPV4,
            vni: vni(1),
        },
        &[critical, reply],
        &inner2,
    );
    // Our own parser agrees with what we built.
    for (f, i) in [(&frame1, &inner), (&frame2, &inner2)] {
        let g = GenevePacket::new_checked(&f[14 + 20 + 8..]).unwrap();
        assert_eq!(g.payload(), &i[..]);
    }

    let path = std::env::temp_dir().join(format!(
        "protego-wire-geneve-{}-{:?}.pcap",
        std::process::id(),
        std::thread::current().id()
    ));
    let file = TempFile(path);
    std::fs::write(&file.0, pcap(&[frame1, frame2])).unwrap();

    let fields = [
        "geneve.version",
        "geneve.flags.oam",
        "geneve.flags.critical",
        "geneve.proto_type",
        "geneve.vni",
        "geneve.option.class",
        "geneve.option.type",
        "geneve.option.type.critical",
        "geneve.option.length",
        "geneve.option.unknown.data",
        "ip.src",
        "ip.dst",
        "ip.checksum.status",
        "udp.dstport",
        "udp.checksum.status",
        "esp.spi",
        "_ws.expert",
    ];
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(&file.0)
        .args(["-n", "-o", "ip.check_checksum:TRUE"])
        .args(["-o", "udp.check_checksum:TRUE"])
        .args(["-T", "fields", "-E", "separator=|", "-E", "occurrence=a"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("tshark -T fields -e {}", fields.join(" -e "));
    println!("{stdout}");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Vec<&str>> = stdout.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(rows.len(), 2, "one row per frame");
    // Wireshark's geneve.option.length is in bytes including the option header, and its
    // first occurrence is the "Options" subtree (the total, Opt Len * 4). Zero-length
    // option data shows as <MISSING>. Checksum status 1 is "Good". Values with a comma are
    // the outer then the inner header.
    let expected: [[&str; 17]; 2] = [
        [
            "0",
            "0",
            "0",
            "0x0800",
            "0x123456",
            "0xff50,0xff50",
            "0x01,0x03",
            "0,0",
            "20,12,8",
            "010203040a0b0c0d,deadbeef",
            "10.9.0.1,198.51.100.7",
            "10.9.0.2,203.0.113.10",
            "1,1",
            "6081,4500",
            "1,1",
            "0xc0de0001",
            "",
        ],
        [
            "0",
            "1",
            "1",
            "0x0800",
            "0x000001",
            "0xff51,0xff50",
            "0x85,0x02",
            "1,0",
            "16,4,12",
            "<MISSING>,010203040a0b0c0d",
            "10.9.0.1,198.51.100.7",
            "10.9.0.2,203.0.113.10",
            "1,1",
            "6081,4500",
            "1,1",
            "0xc0de0001",
            "",
        ],
    ];
    for (row, want) in rows.iter().zip(expected) {
        for ((field, got), want) in fields.iter().zip(row).zip(want) {
            assert_eq!(*got, want, "tshark field {field}");
        }
        assert_eq!(row.len(), fields.len());
    }
}

/// A customer's Q-in-Q frame relayed between Protego nodes (Protocol Type 0x6558 with the
/// port option, as `relay::emit_l2_frame` writes it) is read by tshark as Geneve carrying an
/// Ethernet frame with an 802.1ad S-tag and an 802.1Q C-tag around the customer's IPv4
/// packet.
#[test]
fn tshark_decodes_a_relayed_customer_frame() {
    if !testreq::program("tshark_decodes_a_relayed_customer_frame", "tshark") {
        return;
    }
    let ip = peer_packet(3);
    let eth = EthernetRepr {
        src_addr: EthernetAddress([2, 0, 0, 0, 0x0c, 1]),
        dst_addr: EthernetAddress([2, 0, 0, 0, 0x0d, 2]),
        vlans: VlanTags::Double {
            outer: VlanTci {
                pcp: 0,
                dei: false,
                vid: 100,
            },
            inner: VlanTci {
                pcp: 0,
                dei: false,
                vid: 20,
            },
        },
        ethertype: EtherType::IPV4,
    };
    let mut customer = vec![0u8; eth.buffer_len() + ip.len()];
    let off = eth.emit(&mut customer).unwrap();
    customer[off..].copy_from_slice(&ip);
    let mut relayed = vec![0u8; 64 + customer.len()];
    let n = crate::relay::emit_l2_frame(&mut relayed, 0x0000_0007, None, &customer).unwrap();
    relayed.truncate(n);
    let repr = GeneveRepr::parse(&GenevePacket::new_checked(&relayed[..]).unwrap()).unwrap();
    let g = GenevePacket::new_checked(&relayed[..]).unwrap();
    let options: Vec<GeneveOption<'_>> = g.options().collect();
    let frame = geneve_frame(&repr, &options, g.payload());

    let path = std::env::temp_dir().join(format!(
        "protego-wire-geneve-l2-{}-{:?}.pcap",
        std::process::id(),
        std::thread::current().id()
    ));
    let file = TempFile(path);
    std::fs::write(&file.0, pcap(&[frame])).unwrap();
    let fields = [
        "geneve.proto_type",
        "geneve.vni",
        "geneve.option.class",
        "geneve.option.type",
        "geneve.option.unknown.data",
        "ieee8021ad.id",
        "vlan.id",
        "vlan.etype",
        "ip.dst",
        "esp.spi",
        "_ws.expert",
    ];
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(&file.0).args([
        "-n",
        "-T",
        "fields",
        "-E",
        "separator=|",
        "-E",
        "occurrence=a",
    ]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row: Vec<&str> = stdout.trim_end().split('|').collect();
    // tshark names the S-tag (TPID 0x88a8) ieee8021ad and the C-tag vlan.
    let want = [
        "0x6558",
        "0x000000",
        "0xff50",
        "0x04",
        "00000007",
        "100",
        "20",
        "0x0800",
        "10.9.0.2,203.0.113.10",
        "0xc0de0001",
        "",
    ];
    assert_eq!(row.len(), fields.len(), "{stdout}");
    for ((field, got), want) in fields.iter().zip(&row).zip(want) {
        assert_eq!(*got, want, "tshark field {field}");
    }
}
