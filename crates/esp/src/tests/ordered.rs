//! Sequence numbers allocated in one place and sealed in another (RFC 4303 §3.3.3): the
//! `allocate` / `seal_with_seq` pair a pipeline uses to keep a tunnel's numbers in arrival
//! order while sealing on several threads, and the inbound reordering measure
//! (`reordered`, `max_reorder`) that shows how much of the replay window (§3.4.3) a path's
//! reordering used.

use std::sync::Arc;

use crypto::{Encr, Integ};
use wire::ip::IpVersion;

use super::{esn, ip_packet, open_inner, pair, seal, SPI};
use crate::{
    DropReason, EspError, InboundSa, Opened, OutboundSa, SaConfig, Unaccepted, MAX_ESN, MAX_SEQ,
};

/// Seals `inner` with `seq` from an earlier `allocate`.
fn seal_with(out: &OutboundSa, inner: &[u8], seq: u64) -> Result<Vec<u8>, EspError> {
    let mut buf = vec![0u8; out.sealed_len(inner.len())];
    let hl = out.header_len();
    buf[hl..hl + inner.len()].copy_from_slice(inner);
    let sealed = out.seal_with_seq(&mut buf, inner.len(), seq)?;
    assert_eq!((sealed.len, sealed.seq), (buf.len(), seq));
    Ok(buf)
}

#[test]
fn allocate_then_seal_matches_seal_byte_for_byte() {
    for (encr, integ) in [
        (Encr::AesGcm16_256, None),
        (Encr::ChaCha20Poly1305, None),
        (Encr::AesCbc256, Some(Integ::HmacSha256_128)),
    ] {
        for config in [SaConfig::default(), esn()] {
            let (a, inb) = pair(encr, integ, &config);
            let (b, _) = pair(encr, integ, &config);
            let inner = ip_packet(IpVersion::V6, 120);
            for expected in 1..=3u64 {
                let seq = a.allocate().unwrap();
                assert_eq!(seq, expected);
                let split = seal_with(&a, &inner, seq).unwrap();
                let (whole, whole_seq) = seal(&b, &inner);
                assert_eq!(whole_seq, seq);
                assert_eq!(split, whole, "{encr:?} esn {}", config.esn);
                assert_eq!(open_inner(&inb, &split).unwrap(), (seq, inner.clone()));
            }
            let c = a.counters();
            assert_eq!((c.packets, c.bytes, c.total_drops()), (3, 360, 0));
            assert_eq!(a.next_seq(), 4);
        }
    }
}

#[test]
fn allocation_shares_the_counter_with_seal() {
    let (out, _) = pair(Encr::AesGcm16_128, None, &SaConfig::default());
    let inner = ip_packet(IpVersion::V4, 60);
    assert_eq!(out.allocate(), Ok(1));
    assert_eq!(seal(&out, &inner).1, 2);
    assert_eq!(out.allocate(), Ok(3));
    // Numbers may be sealed in any order, and one may be skipped (a gap, RFC 4303 §3.3.3).
    seal_with(&out, &inner, 3).unwrap();
    seal_with(&out, &inner, 1).unwrap();
    assert_eq!(out.counters().packets, 3);
}

#[test]
fn seal_with_seq_refuses_numbers_allocate_cannot_return() {
    let (out, _) = pair(Encr::AesGcm16_128, None, &SaConfig::default());
    let inner = ip_packet(IpVersion::V4, 60);
    for seq in [0, MAX_SEQ + 1, u64::MAX] {
        assert_eq!(
            seal_with(&out, &inner, seq),
            Err(EspError::InvalidSequence { spi: SPI, seq })
        );
    }
    assert!(seal_with(&out, &inner, MAX_SEQ).is_ok());
    // With ESN the limit is 2^64 - 2^32.
    let (out, _) = pair(Encr::AesGcm16_128, None, &esn());
    assert!(seal_with(&out, &inner, MAX_SEQ + 1).is_ok());
    assert!(seal_with(&out, &inner, MAX_ESN).is_ok());
    assert_eq!(
        seal_with(&out, &inner, MAX_ESN + 1),
        Err(EspError::InvalidSequence {
            spi: SPI,
            seq: MAX_ESN + 1
        })
    );
    assert_eq!(out.counters().drops_for(DropReason::InvalidSequence), 1);
    // Buffer and inner packet errors do not depend on the number.
    let mut short = vec![0u8; 10];
    assert!(matches!(
        out.seal_with_seq(&mut short, 60, 5),
        Err(EspError::BufferTooSmall { .. })
    ));
    // None of this touched the counter.
    assert_eq!(out.next_seq(), 1);
}

#[test]
fn allocate_counts_exhaustion_and_keeps_refusing() {
    let (out, _) = pair(Encr::AesGcm16_128, None, &SaConfig::default());
    out.set_next_seq(MAX_SEQ - 1);
    assert_eq!(out.allocate(), Ok(MAX_SEQ - 1));
    assert_eq!(out.allocate(), Ok(MAX_SEQ));
    assert!(out.is_exhausted());
    for _ in 0..3 {
        assert_eq!(
            out.allocate(),
            Err(EspError::SequenceExhausted { spi: SPI })
        );
    }
    assert_eq!(out.counters().drops_for(DropReason::SequenceExhausted), 3);
    assert_eq!(out.next_seq(), MAX_SEQ + 1);
    // The numbers allocated before exhaustion can still be sealed.
    let inner = ip_packet(IpVersion::V4, 60);
    assert!(seal_with(&out, &inner, MAX_SEQ).is_ok());
}

/// The pipeline the data plane runs: one serial stage allocates in arrival order, several
/// threads seal, the receiver sees every number once. Opening in allocation order shows no
/// reordering; opening in the order sealing finished shows what the threads reordered.
#[test]
fn parallel_sealing_of_serially_allocated_numbers() {
    const PACKETS: u64 = 2000;
    const THREADS: u64 = 4;
    let (out, inb) = pair(Encr::AesGcm16_128, None, &SaConfig::default());
    let out = Arc::new(out);
    let inner = ip_packet(IpVersion::V4, 80);
    let seqs: Vec<u64> = (0..PACKETS).map(|_| out.allocate().unwrap()).collect();
    assert_eq!(seqs, (1..=PACKETS).collect::<Vec<_>>());
    let sealed: Vec<Vec<(u64, Vec<u8>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (out, inner, seqs) = (&out, &inner, &seqs);
                s.spawn(move || {
                    seqs.iter()
                        .filter(|&&q| q % THREADS == t)
                        .map(|&q| (q, seal_with(out, inner, q).unwrap()))
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut in_order: Vec<&(u64, Vec<u8>)> = sealed.iter().flatten().collect();
    in_order.sort_by_key(|(q, _)| *q);
    for (q, p) in in_order {
        assert_eq!(open_inner(&inb, p).unwrap().0, *q);
    }
    let c = inb.counters();
    assert_eq!((c.packets, c.reordered, c.max_reorder), (PACKETS, 0, 0));
    assert_eq!(out.counters().packets, PACKETS);

    // The same packets to a fresh receiver, thread by thread: maximal reordering.
    let (_, inb) = pair(Encr::AesGcm16_128, None, &SaConfig::default());
    let mut accepted = 0;
    for (q, p) in sealed.iter().flatten() {
        match open_inner(&inb, p) {
            Ok((seq, _)) => {
                assert_eq!(seq, *q);
                accepted += 1;
            }
            Err(EspError::TooOld { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let c = inb.counters();
    assert_eq!(c.packets, accepted);
    assert!(c.reordered > 0 && c.reordered < accepted);
    assert!(c.max_reorder < u64::from(inb.replay_window()), "{c:?}");
    assert_eq!(c.drops_for(DropReason::TooOld), PACKETS - accepted);
}

#[test]
fn reordering_is_measured_on_accepted_packets_only() {
    let (out, inb) = pair(Encr::ChaCha20Poly1305, None, &SaConfig::default());
    let inner = ip_packet(IpVersion::V4, 40);
    let p: Vec<Vec<u8>> = (0..12).map(|_| seal(&out, &inner).0).collect();
    // Numbers 1..=12; arrival: 1, 2, 5, 3, 12, 4, 4 (replay), 11, 6.
    for i in [0, 1, 4, 2, 11, 3] {
        open_inner(&inb, &p[i]).unwrap();
    }
    assert!(matches!(
        open_inner(&inb, &p[3]),
        Err(EspError::Replayed { .. })
    ));
    for i in [10, 5] {
        open_inner(&inb, &p[i]).unwrap();
    }
    let c = inb.counters();
    // Behind: 3 by 2 (top 5), 4 by 8 and 11 by 1 and 6 by 6 (top 12).
    assert_eq!((c.packets, c.reordered, c.max_reorder), (8, 4, 8));
    assert_eq!(c.drops_for(DropReason::Replayed), 1);
    // An outbound SA reports no reordering.
    assert_eq!(
        (out.counters().reordered, out.counters().max_reorder),
        (0, 0)
    );
}

/// A receiver with a 64-number window and the packets its peer sent: 1..=40, then (after
/// a burst of 200 lost ones) 241..=260.
fn burst_after_loss() -> (InboundSa, Vec<Vec<u8>>) {
    let config = SaConfig {
        replay_window: 64,
        ..SaConfig::default()
    };
    let (out, inb) = pair(Encr::AesGcm16_256, None, &config);
    let inner = ip_packet(IpVersion::V4, 48);
    let packets = (1..=260u64)
        .map(|_| {
            let seq = out.allocate().unwrap();
            (seq, seal_with(&out, &inner, seq).unwrap())
        })
        .filter(|(seq, _)| *seq <= 40 || *seq > 240)
        .map(|(_, p)| p)
        .collect();
    (inb, packets)
}

#[test]
fn deferred_acceptance_decides_in_arrival_order() {
    // Two workers open the packets out of order: the batch after the loss before the one
    // before it. Accepting in arrival order refuses nothing, as one thread would.
    let (inb, packets) = burst_after_loss();
    let mut opened: Vec<Option<Unaccepted>> = vec![None; packets.len()];
    for i in (40..packets.len()).chain(0..40) {
        let (u, r) = inb.open_unaccepted(&mut packets[i].clone()).unwrap();
        assert!(matches!(r, Ok(Opened::Packet { .. })));
        opened[i] = Some(u);
    }
    // Nothing is accepted (or counted) until `accept`.
    assert_eq!((inb.highest_seq(), inb.counters().packets), (0, 0));
    for u in opened.iter().flatten() {
        assert_eq!(inb.accept(*u), Ok(0), "seq {}", u.seq());
    }
    let c = inb.counters();
    assert_eq!((c.packets, c.total_drops(), c.max_reorder), (60, 0, 0));
    assert_eq!(inb.highest_seq(), 260);

    // Opening in the same order with the window updated at once refuses the first batch as
    // too old: the case deferred acceptance exists for.
    let (eager, packets) = burst_after_loss();
    for i in (40..packets.len()).chain(0..40) {
        let _ = eager.open(&mut packets[i].clone());
    }
    assert_eq!(eager.counters().drops_for(DropReason::TooOld), 40);
}

#[test]
fn deferred_acceptance_refuses_duplicates_and_counts_authentic_failures() {
    let (out, inb) = pair(Encr::ChaCha20Poly1305, None, &SaConfig::default());
    let inner = ip_packet(IpVersion::V6, 80);
    let (p, seq) = seal(&out, &inner);
    // Two copies decrypted at once: both authentic, only the first accepted.
    let (a, ra) = inb.open_unaccepted(&mut p.clone()).unwrap();
    let (b, rb) = inb.open_unaccepted(&mut p.clone()).unwrap();
    assert!(ra.is_ok() && rb.is_ok());
    assert_eq!((a.seq(), b.seq()), (seq, seq));
    assert_eq!(inb.accept(a), Ok(0));
    assert_eq!(inb.accept(b), Err(EspError::Replayed { spi: SPI, seq }));
    // Once accepted, the check before decryption refuses it: nothing is decrypted.
    assert_eq!(
        inb.open_unaccepted(&mut p.clone()).map(|(u, _)| u.seq()),
        Err(EspError::Replayed { spi: SPI, seq })
    );
    // Not authentic: refused before acceptance, the window untouched.
    let (mut forged, fseq) = seal(&out, &inner);
    *forged.last_mut().unwrap() ^= 1;
    assert!(matches!(
        inb.open_unaccepted(&mut forged),
        Err(EspError::Authentication { .. })
    ));
    assert!(inb.highest_seq() < fseq);
    let c = inb.counters();
    assert_eq!(c.packets, 1);
    assert_eq!(c.drops_for(DropReason::Replayed), 2);
    assert_eq!(c.drops_for(DropReason::Authentication), 1);
}
