//! SA-level tests: round trips for every transform with and without ESN and with IPv4 and
//! IPv6 inner packets; tampering, truncation and garbage never open and never panic;
//! replay handling through the SA; crafted authentic packets with bad trailers; buffer,
//! sequence and configuration errors; and concurrent opening of the same packets. Separate
//! allocation and sealing of sequence numbers, and the reordering measure, are in
//! `tests/ordered.rs`.

mod ordered;

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use crypto::{Encr, Integ, SaCipher};
use wire::ip::{IpProtocol, IpVersion, Ipv4Repr, Ipv6Repr};
use wire::EspSpi;

use crate::{DropReason, EspError, InboundSa, Opened, OutboundSa, SaConfig, MAX_OVERHEAD, MAX_SEQ};

const SPI: EspSpi = EspSpi(0x1234_5678);

fn transforms() -> Vec<(Encr, Option<Integ>)> {
    let mut t = vec![
        (Encr::AesGcm16_128, None),
        (Encr::AesGcm16_256, None),
        (Encr::ChaCha20Poly1305, None),
    ];
    for encr in [Encr::AesCbc128, Encr::AesCbc256] {
        for integ in [
            Integ::HmacSha1_96,
            Integ::HmacSha256_128,
            Integ::HmacSha384_192,
            Integ::HmacSha512_256,
        ] {
            t.push((encr, Some(integ)));
        }
    }
    t
}

fn cipher(encr: Encr, integ: Option<Integ>) -> SaCipher {
    let key: Vec<u8> = (0..encr.keymat_len() as u8)
        .map(|b| b.wrapping_mul(7).wrapping_add(1))
        .collect();
    let ikey: Vec<u8> = integ
        .map(|i| (0..i.key_len() as u8).collect())
        .unwrap_or_default();
    SaCipher::new(encr, &key, integ.map(|i| (i, &ikey[..])))
        .expect("test keys have the right lengths")
}

fn pair(encr: Encr, integ: Option<Integ>, config: &SaConfig) -> (OutboundSa, InboundSa) {
    (
        OutboundSa::new(SPI, cipher(encr, integ), config).unwrap(),
        InboundSa::new(SPI, cipher(encr, integ), config).unwrap(),
    )
}

fn esn() -> SaConfig {
    SaConfig {
        esn: true,
        ..SaConfig::default()
    }
}

/// An IPv4 (len >= 20) or IPv6 (len >= 40) UDP packet of exactly `len` bytes.
fn ip_packet(version: IpVersion, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len];
    for (i, b) in p.iter_mut().enumerate() {
        *b = (i * 31 % 251) as u8;
    }
    match version {
        IpVersion::V4 => {
            let r = Ipv4Repr {
                src_addr: Ipv4Addr::new(10, 0, 0, 1),
                dst_addr: Ipv4Addr::new(10, 0, 0, 2),
                protocol: IpProtocol::UDP,
                payload_len: len - 20,
                ttl: 64,
                dscp: 0,
                ecn: 0,
                ident: 7,
                dont_frag: true,
            };
            r.emit(&mut p).unwrap();
        }
        IpVersion::V6 => {
            let r = Ipv6Repr {
                src_addr: Ipv6Addr::LOCALHOST,
                dst_addr: "fd00::2".parse().unwrap(),
                next_header: IpProtocol::UDP,
                payload_len: len - 40,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 1,
            };
            r.emit(&mut p).unwrap();
        }
    }
    p
}

fn seal(out: &OutboundSa, inner: &[u8]) -> (Vec<u8>, u64) {
    let mut buf = vec![0u8; out.sealed_len(inner.len())];
    let hl = out.header_len();
    buf[hl..hl + inner.len()].copy_from_slice(inner);
    let sealed = out.seal(&mut buf, inner.len()).unwrap();
    assert_eq!(sealed.len, buf.len());
    (buf, sealed.seq)
}

fn open_inner(inb: &InboundSa, packet: &[u8]) -> Result<(u64, Vec<u8>), EspError> {
    let mut buf = packet.to_vec();
    match inb.open(&mut buf)? {
        Opened::Packet { seq, inner, .. } => Ok((seq, buf[inner].to_vec())),
        other => panic!("{other:?}"),
    }
}

#[test]
fn round_trip_every_transform() {
    for (encr, integ) in transforms() {
        for config in [SaConfig::default(), esn()] {
            let (out, inb) = pair(encr, integ, &config);
            let align = if encr.is_aead() { 4 } else { 16 };
            let mut n = 0;
            for (version, lens) in [
                (IpVersion::V4, &[20, 21, 63, 64, 100, 1400][..]),
                (IpVersion::V6, &[40, 41, 99, 1500][..]),
            ] {
                for &len in lens {
                    let inner = ip_packet(version, len);
                    let (packet, seq) = seal(&out, &inner);
                    n += 1;
                    assert_eq!(seq, n);
                    let hl = out.header_len();
                    let ct = packet.len() - hl - integ.map_or(16, |i| i.icv_len());
                    assert_eq!(ct % align, 0, "{encr:?} ciphertext alignment");
                    assert!(packet.len() - len <= out.overhead() && out.overhead() <= MAX_OVERHEAD);
                    assert_eq!(&packet[..4], &SPI.0.to_be_bytes());
                    assert_eq!(&packet[4..8], &(seq as u32).to_be_bytes());
                    assert_ne!(&packet[hl..hl + len], &inner[..], "{encr:?}: not encrypted");
                    let mut buf = packet.clone();
                    let opened = inb
                        .open(&mut buf)
                        .unwrap_or_else(|e| panic!("{encr:?} {integ:?} {len}: {e}"));
                    let Opened::Packet {
                        seq: s,
                        version: v,
                        inner: range,
                    } = opened
                    else {
                        panic!()
                    };
                    assert_eq!((s, v), (seq, version));
                    assert_eq!(range, hl..hl + len);
                    assert_eq!(&buf[range], &inner[..]);
                }
            }
            let c = inb.counters();
            assert_eq!((c.packets, c.total_drops()), (n, 0));
            assert_eq!(out.counters().packets, n);
            assert_eq!(out.counters().bytes, c.bytes);
        }
    }
}

#[test]
fn esn_across_the_32_bit_boundary() {
    for (encr, integ) in transforms() {
        let (out, inb) = pair(encr, integ, &esn());
        out.set_next_seq((1 << 32) - 3);
        inb.window().update((1 << 32) - 10).unwrap();
        let inner = ip_packet(IpVersion::V4, 60);
        let mut packets = Vec::new();
        for i in 0..6u64 {
            let (p, seq) = seal(&out, &inner);
            assert_eq!(seq, (1 << 32) - 3 + i);
            // Only the low 32 bits travel (RFC 4303 §2.2.1).
            assert_eq!(&p[4..8], &(seq as u32).to_be_bytes());
            packets.push((p, seq));
        }
        // Deliver out of order across the boundary.
        for i in [3, 0, 5, 1, 4, 2] {
            let (p, seq) = &packets[i];
            assert_eq!(
                open_inner(&inb, p).unwrap(),
                (*seq, inner.clone()),
                "{encr:?}"
            );
        }
        for (p, seq) in &packets {
            assert_eq!(
                open_inner(&inb, p),
                Err(EspError::Replayed {
                    spi: SPI,
                    seq: *seq
                })
            );
        }
        assert_eq!(inb.highest_seq(), (1 << 32) + 2);
    }
}

#[test]
fn esn_high_bits_are_authenticated_and_esn_must_match() {
    for (encr, integ) in transforms() {
        // The receiver believes it is in subspace 0; the packet is from subspace 1.
        let (out, inb) = pair(encr, integ, &esn());
        out.set_next_seq((1 << 32) + 5);
        let (p, seq) = seal(&out, &ip_packet(IpVersion::V6, 80));
        assert_eq!(seq, (1 << 32) + 5);
        assert_eq!(
            open_inner(&inb, &p),
            Err(EspError::Authentication { spi: SPI, seq: 5 })
        );
        // ESN on one side only never verifies, even with zero high bits.
        let (out, _) = pair(encr, integ, &esn());
        let (_, inb_plain) = pair(encr, integ, &SaConfig::default());
        let (p, _) = seal(&out, &ip_packet(IpVersion::V4, 40));
        assert!(
            matches!(
                open_inner(&inb_plain, &p),
                Err(EspError::Authentication { .. })
            ),
            "{encr:?}"
        );
        let (out_plain, _) = pair(encr, integ, &SaConfig::default());
        let (_, inb_esn) = pair(encr, integ, &esn());
        let (p, _) = seal(&out_plain, &ip_packet(IpVersion::V4, 40));
        assert!(
            matches!(
                open_inner(&inb_esn, &p),
                Err(EspError::Authentication { .. })
            ),
            "{encr:?}"
        );
    }
}

#[test]
fn every_flipped_byte_and_every_truncation_is_rejected() {
    for (encr, integ) in transforms() {
        for config in [SaConfig::default(), esn()] {
            let (out, inb) = pair(encr, integ, &config);
            let (packet, seq) = seal(&out, &ip_packet(IpVersion::V4, 45));
            for i in 0..packet.len() {
                for bit in [0x01, 0x80] {
                    let mut p = packet.clone();
                    p[i] ^= bit;
                    let r = inb.open(&mut p);
                    assert!(
                        r.is_err(),
                        "{encr:?} {integ:?} byte {i} bit {bit:#x} accepted: {r:?}"
                    );
                }
            }
            for len in 0..packet.len() {
                assert!(
                    inb.open(&mut packet[..len].to_vec()).is_err(),
                    "{encr:?} prefix {len}"
                );
            }
            let mut longer = packet.clone();
            longer.push(0);
            assert!(inb.open(&mut longer).is_err());
            // Nothing above touched the window: the genuine packet still opens, once.
            assert_eq!(open_inner(&inb, &packet).map(|(s, _)| s), Ok(seq));
            assert_eq!(
                open_inner(&inb, &packet),
                Err(EspError::Replayed { spi: SPI, seq })
            );
            assert_eq!(inb.counters().packets, 1);
            assert!(inb.counters().drops_for(DropReason::Authentication) > 0);
        }
    }
}

#[test]
fn garbage_never_panics() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for (encr, integ) in transforms() {
        let (_, inb) = pair(encr, integ, &esn());
        for _ in 0..300 {
            let len = (next() % 200) as usize;
            let mut buf: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if len >= 4 && next() % 2 == 0 {
                buf[..4].copy_from_slice(&SPI.0.to_be_bytes());
            }
            assert!(inb.open(&mut buf).is_err());
            let _ = inb.check(&buf);
        }
    }
}

#[test]
fn replay_window_through_the_sa() {
    let config = SaConfig {
        replay_window: 64,
        ..SaConfig::default()
    };
    let (out, inb) = pair(Encr::AesGcm16_128, None, &config);
    let inner = ip_packet(IpVersion::V4, 28);
    let packets: Vec<_> = (0..200).map(|_| seal(&out, &inner).0).collect();
    // seq n is packets[n - 1].
    assert!(open_inner(&inb, &packets[99]).is_ok()); // top = 100, window 37..=100
    assert_eq!(
        open_inner(&inb, &packets[35]),
        Err(EspError::TooOld {
            spi: SPI,
            seq: 36,
            top: 100
        })
    );
    assert!(open_inner(&inb, &packets[36]).is_ok());
    assert_eq!(
        open_inner(&inb, &packets[36]),
        Err(EspError::Replayed { spi: SPI, seq: 37 })
    );
    assert!(open_inner(&inb, &packets[199]).is_ok());
    assert!(matches!(
        open_inner(&inb, &packets[99]),
        Err(EspError::TooOld { .. })
    ));
    let c = inb.counters();
    assert_eq!(c.drops_for(DropReason::TooOld), 2);
    assert_eq!(c.drops_for(DropReason::Replayed), 1);
    assert_eq!(c.packets, 3);

    // check() before decryption, open_checked() after: a duplicate that passed check()
    // while the original was in flight is still caught.
    let a = packets[150].clone();
    let seq = inb.check(&a).unwrap();
    assert_eq!(inb.check(&a), Ok(seq));
    assert!(inb.open_checked(&mut a.clone(), seq).is_ok());
    assert_eq!(
        inb.open_checked(&mut a.clone(), seq),
        Err(EspError::Replayed { spi: SPI, seq })
    );
    assert_eq!(inb.check(&a), Err(EspError::Replayed { spi: SPI, seq }));
    // open_checked with a number that is not the packet's is refused.
    let b = packets[151].clone();
    assert!(matches!(
        inb.open_checked(&mut b.clone(), 7),
        Err(EspError::InvalidSequence { .. })
    ));
    assert!(matches!(
        inb.open_checked(&mut b.clone(), (1 << 32) | 152),
        Err(EspError::InvalidSequence { .. })
    ));
}

#[test]
fn late_esn_packets_are_reported_too_old() {
    let config = SaConfig {
        esn: true,
        replay_window: 64,
        ..SaConfig::default()
    };
    for (encr, integ) in [
        (Encr::AesGcm16_128, None),
        (Encr::AesCbc128, Some(Integ::HmacSha1_96)),
    ] {
        let (out, inb) = pair(encr, integ, &config);
        let inner = ip_packet(IpVersion::V6, 40);
        let packets: Vec<_> = (0..200).map(|_| seal(&out, &inner).0).collect();
        assert!(open_inner(&inb, &packets[199]).is_ok());
        // Appendix A2.2 reads seq 10 as 2^32 + 10; the ICV says no; 10 is below the window.
        assert_eq!(
            open_inner(&inb, &packets[9]),
            Err(EspError::TooOld {
                spi: SPI,
                seq: 10,
                top: 200
            })
        );
        // A forgery in the window is still an authentication failure.
        let mut forged = packets[180].clone();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        assert_eq!(
            open_inner(&inb, &forged),
            Err(EspError::Authentication { spi: SPI, seq: 181 })
        );
    }
}

#[test]
fn dummy_packets_are_authenticated_then_dropped_silently() {
    for (encr, integ) in transforms() {
        let (out, inb) = pair(encr, integ, &SaConfig::default());
        let mut buf = vec![0xa5u8; out.sealed_len(33)];
        let sealed = out.seal_dummy(&mut buf, 33).unwrap();
        assert_eq!(
            inb.open(&mut buf[..sealed.len]),
            Ok(Opened::Dummy { seq: sealed.seq })
        );
        assert_eq!(inb.counters().dummy_packets, 1);
        assert_eq!(inb.counters().packets, 0);
        assert_eq!(out.counters().dummy_packets, 1);
    }
}

/// Authentic packets whose plaintext is wrong in one way each.
#[test]
fn crafted_trailers_and_inner_packets() {
    for (encr, integ) in [
        (Encr::AesGcm16_256, None),
        (Encr::AesCbc256, Some(Integ::HmacSha256_128)),
    ] {
        let (out, inb) = pair(encr, integ, &SaConfig::default());
        let hl = out.header_len();
        let mut seq = 0;
        let mut craft = |payload: &[u8], trailer: &[u8]| -> Result<Opened, EspError> {
            seq += 1;
            let pt_len = payload.len() + trailer.len();
            let mut buf = vec![0u8; hl + pt_len + 32];
            buf[hl..hl + payload.len()].copy_from_slice(payload);
            buf[hl + payload.len()..hl + pt_len].copy_from_slice(trailer);
            let len = out.seal_plaintext(&mut buf, pt_len, seq);
            inb.open(&mut buf[..len])
        };
        let v4 = ip_packet(IpVersion::V4, 28);
        let v6 = ip_packet(IpVersion::V6, 46);
        // 28 + 2 trailer needs 2 bytes of padding for AEAD, 2 for CBC (28 + 4 = 32).
        assert!(matches!(
            craft(&v4, &[1, 2, 2, 4]),
            Ok(Opened::Packet { .. })
        ));
        assert!(matches!(
            craft(&v4, &[1, 3, 2, 4]),
            Err(EspError::BadPadding { pad_len: 2, .. })
        ));
        assert!(matches!(
            craft(&v4, &[0, 0, 2, 4]),
            Err(EspError::BadPadding { .. })
        ));
        assert!(matches!(
            craft(&v4, &[1, 2, 200, 4]),
            Err(EspError::BadPadding { pad_len: 200, .. })
        ));
        assert!(matches!(
            craft(&v4, &[1, 2, 2, 6]),
            Err(EspError::UnexpectedNextHeader {
                next_header: IpProtocol::TCP,
                ..
            })
        ));
        assert!(matches!(
            craft(&v4, &[1, 2, 2, 41]),
            Err(EspError::MalformedInner { .. })
        ));
        // 46 + 2 = 48: no padding needed for either cipher.
        assert!(matches!(
            craft(&v6, &[0, 41]),
            Ok(Opened::Packet {
                version: IpVersion::V6,
                ..
            })
        ));
        assert!(matches!(
            craft(&v6, &[0, 4]),
            Err(EspError::MalformedInner { .. })
        ));
        assert!(matches!(craft(&v6, &[0, 59]), Ok(Opened::Dummy { .. })));
        // An IPv4 header claiming more bytes than the payload holds.
        let mut long = v4.clone();
        long[2..4].copy_from_slice(&29u16.to_be_bytes());
        assert!(matches!(
            craft(&long, &[1, 2, 2, 4]),
            Err(EspError::MalformedInner { .. })
        ));
        // TFC padding (RFC 4303 §2.7) after the inner packet is excluded from its range.
        let mut tfc = v4.clone();
        tfc.extend_from_slice(&[0u8; 16]);
        let r = craft(&tfc, &[1, 2, 2, 4]).unwrap();
        let Opened::Packet { inner, .. } = r else {
            panic!()
        };
        assert_eq!(inner.len(), 28);
        let c = inb.counters();
        assert_eq!(c.drops_for(DropReason::BadPadding), 3);
        assert_eq!(c.drops_for(DropReason::UnexpectedNextHeader), 1);
        assert_eq!(c.drops_for(DropReason::MalformedInner), 3);
    }
}

#[test]
fn length_checks() {
    let (out, inb) = pair(
        Encr::AesCbc128,
        Some(Integ::HmacSha1_96),
        &SaConfig::default(),
    );
    // 24 header + 16 block + 12 ICV.
    assert_eq!(inb.min_packet_len(), 52);
    let (packet, _) = seal(&out, &ip_packet(IpVersion::V4, 40));
    let mut short = packet[..packet.len() - 4].to_vec();
    assert!(matches!(
        inb.open(&mut short),
        Err(EspError::CiphertextLength { block: 16, .. })
    ));
    assert!(matches!(
        inb.open(&mut packet[..51].to_vec()),
        Err(EspError::Truncated { spi: Some(SPI), .. })
    ));
    assert!(matches!(
        inb.open(&mut packet[..7].to_vec()),
        Err(EspError::Truncated { spi: None, .. })
    ));
    let mut other = packet.clone();
    other[3] ^= 1;
    assert!(matches!(
        inb.open(&mut other),
        Err(EspError::SpiMismatch { expected: SPI, .. })
    ));
    let mut zero = packet.clone();
    zero[4..8].fill(0);
    assert_eq!(
        inb.open(&mut zero),
        Err(EspError::InvalidSequence { spi: SPI, seq: 0 })
    );
}

#[test]
fn seal_errors() {
    let (out, _) = pair(Encr::ChaCha20Poly1305, None, &SaConfig::default());
    let inner = ip_packet(IpVersion::V4, 40);
    let need = out.sealed_len(40);
    let mut buf = vec![0u8; need - 1];
    buf[16..56].copy_from_slice(&inner);
    assert_eq!(
        out.seal(&mut buf, 40),
        Err(EspError::BufferTooSmall {
            spi: SPI,
            need,
            got: need - 1
        })
    );
    let mut buf = vec![0u8; need];
    buf[16] = 0x55;
    assert_eq!(
        out.seal(&mut buf, 40),
        Err(EspError::InnerNotIp {
            spi: SPI,
            version: 5
        })
    );
    assert_eq!(
        out.seal(&mut buf, 0),
        Err(EspError::InnerNotIp {
            spi: SPI,
            version: 0
        })
    );
    // No sequence number was used by the failures.
    assert_eq!(out.next_seq(), 1);
    assert_eq!(out.counters().drops_for(DropReason::InnerNotIp), 2);

    // Exhaustion at 2^32 - 1 without ESN; the soft limit fired long before.
    assert!(!out.needs_rekey());
    out.set_next_seq(MAX_SEQ);
    assert!(out.needs_rekey());
    let (p, seq) = seal(&out, &inner);
    assert_eq!(seq, MAX_SEQ);
    assert!(!p.is_empty());
    assert!(out.is_exhausted());
    let mut buf = vec![0u8; need];
    buf[16..56].copy_from_slice(&inner);
    assert_eq!(
        out.seal(&mut buf, 40),
        Err(EspError::SequenceExhausted { spi: SPI })
    );
    assert_eq!(out.next_seq(), MAX_SEQ + 1);
}

#[test]
fn configuration_is_validated() {
    let c = || cipher(Encr::AesGcm16_128, None);
    assert!(matches!(
        OutboundSa::new(EspSpi(255), c(), &SaConfig::default()),
        Err(EspError::InvalidConfig { field: "spi", .. })
    ));
    assert!(InboundSa::new(EspSpi(256), c(), &SaConfig::default()).is_ok());
    for w in [0, 31, 65_537] {
        let cfg = SaConfig {
            replay_window: w,
            ..SaConfig::default()
        };
        assert!(matches!(
            InboundSa::new(SPI, c(), &cfg),
            Err(EspError::InvalidConfig {
                field: "replay_window",
                ..
            })
        ));
    }
    for w in [32, 4096, 65_536] {
        let cfg = SaConfig {
            replay_window: w,
            ..SaConfig::default()
        };
        assert_eq!(InboundSa::new(SPI, c(), &cfg).unwrap().replay_window(), w);
    }
    let cfg = SaConfig {
        rekey_after: Some(MAX_SEQ),
        ..SaConfig::default()
    };
    assert!(matches!(
        OutboundSa::new(SPI, c(), &cfg),
        Err(EspError::InvalidConfig {
            field: "rekey_after",
            ..
        })
    ));
    let cfg = SaConfig {
        rekey_after: Some(10),
        ..SaConfig::default()
    };
    let out = OutboundSa::new(SPI, c(), &cfg).unwrap();
    let inner = ip_packet(IpVersion::V4, 20);
    for _ in 0..10 {
        seal(&out, &inner);
    }
    assert!(!out.needs_rekey());
    seal(&out, &inner);
    assert!(out.needs_rekey());
    assert_eq!(
        EspError::InvalidConfig {
            spi: SPI,
            field: "x",
            reason: "y"
        }
        .reason(),
        None
    );
}

#[test]
fn concurrent_opens_accept_each_packet_once() {
    const PACKETS: usize = 3000;
    const THREADS: usize = 4;
    for (encr, integ) in [
        (Encr::AesGcm16_128, None),
        (Encr::AesCbc128, Some(Integ::HmacSha256_128)),
    ] {
        let config = SaConfig {
            esn: true,
            replay_window: 256,
            ..SaConfig::default()
        };
        let (out, inb) = pair(encr, integ, &config);
        let inner = ip_packet(IpVersion::V4, 64);
        let packets: Arc<Vec<Vec<u8>>> =
            Arc::new((0..PACKETS).map(|_| seal(&out, &inner).0).collect());
        let inb = Arc::new(inb);
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (inb, packets) = (Arc::clone(&inb), Arc::clone(&packets));
                std::thread::spawn(move || {
                    let mut ok = vec![false; PACKETS];
                    let mut buf = Vec::new();
                    // Each thread walks the same packets with its own small reordering.
                    for chunk in (0..PACKETS).collect::<Vec<_>>().chunks(32) {
                        for k in 0..chunk.len() {
                            let i = chunk[(k * 5 + t * 3) % chunk.len()];
                            buf.clear();
                            buf.extend_from_slice(&packets[i]);
                            match inb.open(&mut buf) {
                                Ok(Opened::Packet { seq, .. }) => {
                                    assert_eq!(seq, i as u64 + 1);
                                    ok[i] = true;
                                }
                                Ok(other) => panic!("{other:?}"),
                                Err(EspError::Replayed { .. } | EspError::TooOld { .. }) => {}
                                Err(e) => panic!("{e}"),
                            }
                        }
                    }
                    ok
                })
            })
            .collect();
        let results: Vec<Vec<bool>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let mut accepted = 0;
        for i in 0..PACKETS {
            let n = results.iter().filter(|r| r[i]).count();
            assert!(n <= 1, "{encr:?}: packet {i} accepted {n} times");
            accepted += n;
        }
        let c = inb.counters();
        assert_eq!(c.packets as usize, accepted);
        assert_eq!(
            (c.drops_for(DropReason::Replayed) + c.drops_for(DropReason::TooOld)) as usize,
            THREADS * PACKETS - accepted
        );
        assert!(accepted > PACKETS * 9 / 10, "{encr:?}: {accepted}");
    }
}
