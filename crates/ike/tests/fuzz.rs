//! Seeded randomized robustness loops (a few seconds each, deterministic): the IKE message parser
//! (RFC 7296 §3) on random bytes and mutations of real messages, with an emit/parse round trip
//! for whatever parses; and *authenticated* garbage: the inner payloads of real Encrypted (SK)
//! payloads (RFC 7296 §3.14, RFC 5282) mutated and sealed again with the SA's own keys, so that
//! the payload parsers, the payload rules and every exchange handler see hostile content that
//! passes the ICV. Nothing may panic, and no datagram may be counted twice.

mod harness;
use crypto::SaCipher;
use harness::*;
use protego_ike::*;
use std::net::SocketAddr;
use std::time::Duration;
use wire::ike::*;

struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One to four random edits: byte sets, bit flips, truncation, insertion, removal, duplication
/// of a slice, or a 16/32-bit length-looking field set to a boundary value.
fn mutate(rng: &mut XorShift, d: &[u8]) -> Vec<u8> {
    let mut d = d.to_vec();
    for _ in 0..1 + rng.below(4) {
        if d.is_empty() {
            d.push(rng.next() as u8);
            continue;
        }
        let i = rng.below(d.len());
        match rng.below(8) {
            0 => d[i] = rng.next() as u8,
            1 => d[i] ^= 1 << rng.below(8),
            2 => d.truncate(i),
            3 => d.insert(i, rng.next() as u8),
            4 => {
                d.remove(i);
            }
            5 => {
                let end = (i + 1 + rng.below(16)).min(d.len());
                let slice = d[i..end].to_vec();
                let at = rng.below(d.len() + 1);
                d.splice(at..at, slice);
            }
            6 if i + 2 <= d.len() => {
                let v: u16 = [0, 1, 3, 4, 8, 0x7fff, 0xffff][rng.below(7)];
                d[i..i + 2].copy_from_slice(&v.to_be_bytes());
            }
            _ if i + 4 <= d.len() => {
                let v: u32 = [0, 1, 0xffff_ffff, d.len() as u32][rng.below(4)];
                d[i..i + 4].copy_from_slice(&v.to_be_bytes());
            }
            _ => d[i] = 0,
        }
    }
    d
}

/// Every datagram of a real run with rekeys of both kinds, DPD and a delete.
fn corpus(seed: u64) -> Vec<(SocketAddr, SocketAddr, Vec<u8>)> {
    let (mut a, mut b) = (cfg_a(), cfg_b());
    a.dpd_delay = Some(Duration::from_secs(5));
    b.dpd_delay = Some(Duration::from_secs(5));
    let mut p = Pair::with_configs(seed, a, b);
    p.connect();
    let spi = *p.a.children.keys().next().expect("child");
    p.a.ep.rekey_child(p.now, spi).expect("rekey");
    p.run_for(Duration::from_secs(10));
    p.b.ep.rekey_ike(p.now, TunnelId(1)).expect("rekey");
    p.run_for(Duration::from_secs(20));
    p.a.ep.terminate(p.now, TunnelId(1)).expect("terminate");
    p.run_for(Duration::from_secs(5));
    p.a.sent.iter().chain(p.b.sent.iter()).cloned().collect()
}

#[test]
fn parser_survives_random_and_mutated_input_and_round_trips() {
    let corpus = corpus(1000);
    assert!(corpus.len() > 10);
    let mut rng = XorShift(0x1234_5678_9abc_def1);
    let (mut parsed, mut round_trips) = (0, 0);
    for i in 0..50_000 {
        let data: Vec<u8> = if i % 5 == 0 {
            (0..rng.below(400)).map(|_| rng.next() as u8).collect()
        } else {
            let (_, _, d) = &corpus[rng.below(corpus.len())];
            let mut m = mutate(&mut rng, d);
            if rng.below(2) == 0 && m.len() >= 28 {
                // Keep the header's Length right so that the payload chain is reached.
                let n = m.len() as u32;
                m[24..28].copy_from_slice(&n.to_be_bytes());
            }
            m
        };
        // Inner chains are parsed by the engine after decryption: exercise that entry too.
        if data.len() > 1 {
            let _ = parse_chain(PayloadType(data[0]), &data[1..], 0, false);
        }
        let Ok(m) = Message::parse(&data) else {
            continue;
        };
        parsed += 1;
        if m.encrypted.is_some() {
            continue;
        }
        // What parses re-encodes to something that parses to the same message.
        let mut out = Vec::new();
        m.emit(&mut out)
            .unwrap_or_else(|e| panic!("input {i}: parsed but cannot emit: {e}\n{m:?}"));
        let again = Message::parse(&out)
            .unwrap_or_else(|e| panic!("input {i}: emitted message does not parse: {e}\n{m:?}"));
        assert_eq!(again, m, "input {i}: round trip changed the message");
        round_trips += 1;
    }
    assert!(parsed > 1_000, "{parsed}");
    assert!(round_trips > 100, "{round_trips}");
}

/// Seals `inner` under `header` as the SA would (RFC 7296 §3.14).
fn seal(cipher: &SaCipher, header: &Header, first: PayloadType, inner: &[u8], ctr: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let layout = emit_encrypted(
        header,
        first,
        inner,
        cipher.iv_len(),
        cipher.block_size(),
        cipher.icv_len(),
        &mut out,
    )
    .expect("layout");
    cipher.iv_from_counter(ctr, &mut out[layout.iv.clone()]);
    let (head, rest) = out.split_at_mut(layout.iv.end);
    let (pt, icv) = rest.split_at_mut(layout.plaintext.len());
    cipher
        .seal_in_place(&head[layout.iv.clone()], &head[..layout.aad_len], pt, icv)
        .expect("seal");
    out
}

/// A fresh established pair with its SK keys and the decrypted requests of a real run (each
/// as sender, exchange, first inner payload type and inner chain).
struct Target {
    p: Pair,
    keys: SkKeys,
    /// Message ID each side expects next from the other: [to B, to A].
    next_id: [u32; 2],
}

fn target(seed: u64) -> Target {
    let (p, keys) = connected_with_keys(seed, |a, b| {
        a.dpd_delay = Some(Duration::from_secs(600));
        b.dpd_delay = Some(Duration::from_secs(600));
    });
    Target {
        p,
        keys,
        next_id: [2, 0],
    }
}

#[test]
fn authenticated_garbage_never_panics_and_is_counted_at_most_once() {
    // Inner chains to mutate: every request of a real run, decrypted with that run's keys.
    let mut t = target(2000);
    let spi = *t.p.a.children.keys().next().expect("child");
    t.p.a.ep.rekey_child(t.p.now, spi).expect("rekey");
    t.p.run_for(Duration::from_secs(5));
    t.p.b.ep.rekey_ike(t.p.now, TunnelId(1)).expect("rekey");
    t.p.run_for(Duration::from_secs(5));
    let mut seeds: Vec<(ExchangeType, PayloadType, Vec<u8>)> = Vec::new();
    for (sent, cipher) in [
        (&t.p.a.sent, &t.keys.initiator),
        (&t.p.b.sent, &t.keys.responder),
    ] {
        for (_, _, d) in sent.iter() {
            if let Some((h, first, inner)) = open(cipher, d) {
                seeds.push((h.exchange, first, inner));
            }
        }
    }
    assert!(seeds.len() >= 4, "{}", seeds.len());

    let mut rng = XorShift(0x0dd_ba11_cafe);
    let mut t = target(2001);
    let (mut answered, mut fresh_pairs, mut ctr) = (0, 0, 1u64 << 40);
    for i in 0..6_000 {
        // Alternate targets: requests to B (the responder) and to A (the initiator).
        let to_b = i % 2 == 0;
        let (exchange, first, inner) = &seeds[rng.below(seeds.len())];
        let inner = mutate(&mut rng, inner);
        let first = if rng.below(8) == 0 {
            PayloadType(rng.next() as u8)
        } else {
            *first
        };
        let exchange = if rng.below(8) == 0 {
            ExchangeType(rng.next() as u8)
        } else {
            *exchange
        };
        let status = t.p.a.ep.status(t.p.now);
        let Some(ike) = status.first().map(|s| s.ike) else {
            t = target(3000 + i);
            fresh_pairs += 1;
            continue;
        };
        let k = usize::from(!to_b);
        let header = Header::new(
            ike.initiator,
            ike.responder,
            exchange,
            Flags::new(to_b, false),
            t.next_id[k],
        );
        let cipher = if to_b {
            &t.keys.initiator
        } else {
            &t.keys.responder
        };
        ctr += 1;
        let data = seal(cipher, &header, first, &inner, ctr);
        let (local, remote) = if to_b {
            (SocketAddr::new(B_ADDR, 4500), SocketAddr::new(A_ADDR, 4500))
        } else {
            (SocketAddr::new(A_ADDR, 4500), SocketAddr::new(B_ADDR, 4500))
        };
        let ep = if to_b { &mut t.p.b.ep } else { &mut t.p.a.ep };
        let before = ep.stats().total();
        ep.handle_datagram(t.p.now, local, remote, &data);
        let delta = ep.stats().total() - before;
        assert!(delta <= 1, "input {i} counted {delta} times");
        let mut buf = Vec::new();
        while ep.poll_transmit(&mut buf).is_some() {
            if Header::parse(&buf).is_ok_and(|h| h.flags.response() && h.message_id == t.next_id[k])
            {
                t.next_id[k] = t.next_id[k].wrapping_add(1);
                answered += 1;
            }
        }
        while ep.poll_event().is_some() {}
        // A garbage request may legitimately delete or rekey the SA: start over when the
        // original SA is no longer established on both sides.
        let intact = [&t.p.a.ep, &t.p.b.ep].iter().all(|ep| {
            ep.status(t.p.now)
                .iter()
                .any(|s| s.ike == ike && s.state == IkeSaState::Established)
        });
        if !intact {
            t = target(4000 + i);
            fresh_pairs += 1;
        }
    }
    // The garbage was authentic: much of it reached the exchange handlers and was answered.
    assert!(answered > 500, "{answered}");
    eprintln!("authenticated garbage: {answered} answered, {fresh_pairs} fresh pairs");
}
