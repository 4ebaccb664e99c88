//! Hostile input against established endpoints: random bytes and random mutations of every
//! datagram of a real run (handshake, rekeys, DPD, delete) are fed to both sides. Nothing may
//! panic, nothing unauthenticated may change state, and the tunnel must keep working.

mod harness;
use harness::*;
use protego_ike::*;
use std::net::SocketAddr;
use std::time::Duration;

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

fn mutate(rng: &mut XorShift, d: &[u8]) -> Vec<u8> {
    let mut d = d.to_vec();
    for _ in 0..1 + rng.below(3) {
        if d.is_empty() {
            break;
        }
        match rng.below(5) {
            0 => {
                let i = rng.below(d.len());
                d[i] = rng.next() as u8;
            }
            1 => {
                let i = rng.below(d.len());
                d[i] ^= 1 << rng.below(8);
            }
            2 => d.truncate(rng.below(d.len())),
            3 => {
                let i = rng.below(d.len() + 1);
                d.insert(i, rng.next() as u8);
            }
            _ => {
                // Keep the header's length right so that payload parsing is reached.
                if d.len() >= 28 {
                    let n = d.len() as u32;
                    d[24..28].copy_from_slice(&n.to_be_bytes());
                }
            }
        }
    }
    d
}

#[test]
fn mutated_and_random_datagrams_never_hurt() {
    let (mut a, mut b) = (cfg_a(), cfg_b());
    a.dpd_delay = Some(Duration::from_secs(10));
    b.dpd_delay = Some(Duration::from_secs(10));
    let mut p = Pair::with_configs(900, a, b);
    p.connect();
    let spi = *p.a.children.keys().next().expect("child");
    p.a.ep.rekey_child(p.now, spi).expect("rekey");
    p.b.ep.rekey_ike(p.now, TunnelId(1)).expect("rekey");
    p.run_for(Duration::from_secs(30));
    let corpus: Vec<(SocketAddr, SocketAddr, Vec<u8>)> =
        p.a.sent.iter().chain(p.b.sent.iter()).cloned().collect();
    assert!(corpus.len() > 10);
    let before_a = p.a.ep.status(p.now);
    let events_a = p.a.events.len();
    let events_b = p.b.events.len();
    let mut rng = XorShift(0xfeed_beef);
    let mut answered = 0;
    for i in 0..30_000 {
        let (from, to, d) = &corpus[rng.below(corpus.len())];
        let data = if i % 10 == 0 {
            (0..rng.below(300)).map(|_| rng.next() as u8).collect()
        } else {
            mutate(&mut rng, d)
        };
        // Deliver to the original receiver, from the original sender.
        if to.ip() == A_ADDR {
            p.a.ep.handle_datagram(p.now, *to, *from, &data);
        } else {
            p.b.ep.handle_datagram(p.now, *to, *from, &data);
        }
        let mut buf = Vec::new();
        while p.a.ep.poll_transmit(&mut buf).is_some() {
            answered += 1;
        }
        while p.b.ep.poll_transmit(&mut buf).is_some() {
            answered += 1;
        }
    }
    // Some junk reached deep enough to be answered (INVALID_SYNTAX, cached responses, new
    // half-open SAs for mutated IKE_SA_INIT requests...).
    assert!(answered > 100, "{answered}");
    // Garbage changed nothing: same SAs, no events (half-open SAs from mutated IKE_SA_INIT
    // requests aside, which report IkeSaConnecting and later expire).
    let after_a = p.a.ep.status(p.now);
    assert_eq!(before_a.len(), after_a.len());
    assert_eq!(before_a[0].ike, after_a[0].ike);
    while let Some(e) = p.a.ep.poll_event() {
        assert!(matches!(e, Event::IkeSaConnecting { tunnel: None, .. }), "{e:?}");
    }
    while let Some(e) = p.b.ep.poll_event() {
        assert!(matches!(e, Event::IkeSaConnecting { tunnel: None, .. }), "{e:?}");
    }
    assert_eq!((p.a.events.len(), p.b.events.len()), (events_a, events_b));
    // The real tunnel still works and the junk half-open SAs go away.
    p.run_for(Duration::from_secs(60));
    let spi = *p.a.children.keys().next().expect("child");
    p.a.ep.rekey_child(p.now, spi).expect("rekey");
    p.run_for(Duration::from_secs(10));
    p.assert_one_ike_sa();
    p.assert_children_consistent();
    assert_eq!(p.b.ep.half_open_count(), 0);
}
