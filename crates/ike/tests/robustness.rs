//! Hostile input against established endpoints (docs/architecture.md, "Bad input and faults"): every kind of bad datagram is
//! dropped and counted under its [`IkeDrop`] reason exactly once (RFC 7296 §2.1 retransmissions,
//! §2.2 message IDs, §2.5 syntax, §2.6 cookies, §2.7/§1.2 IKE_SA_INIT refusals, §2.15
//! authentication, §2.21 ICV failures), and random bytes and random mutations of every datagram
//! of a real run (handshake, rekeys, DPD, delete) change nothing and panic nothing.
//! `fuzz.rs` goes deeper with seeded loops over the parser and authenticated garbage.

mod harness;
use crypto::{DhGroup, KeyExchange, SeededRng};
use harness::*;
use protego_ike::*;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;
use wire::ike::*;
use wire::IkeSpi;

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
    let mut counted = 0;
    for i in 0..30_000 {
        let (from, to, d) = &corpus[rng.below(corpus.len())];
        let random = i % 10 == 0;
        let data = if random {
            (0..rng.below(300)).map(|_| rng.next() as u8).collect()
        } else {
            mutate(&mut rng, d)
        };
        // Deliver to the original receiver, from the original sender.
        let ep = if to.ip() == A_ADDR {
            &mut p.a.ep
        } else {
            &mut p.b.ep
        };
        let before = ep.stats().total();
        ep.handle_datagram(p.now, *to, *from, &data);
        let delta = ep.stats().total() - before;
        // Never counted twice; random bytes are always dropped (and so counted).
        assert!(delta <= 1, "input {i} counted {delta} times");
        if random {
            assert_eq!(delta, 1, "random input {i} not counted: {data:02x?}");
        }
        counted += delta;
        let mut buf = Vec::new();
        while p.a.ep.poll_transmit(&mut buf).is_some() {
            answered += 1;
        }
        while p.b.ep.poll_transmit(&mut buf).is_some() {
            answered += 1;
        }
    }
    // Nearly everything was dropped and counted; some junk reached deep enough to be answered
    // (INVALID_SYNTAX, cached responses, new half-open SAs for mutated IKE_SA_INIT requests...).
    assert!(counted > 25_000, "{counted}");
    assert!(answered > 100, "{answered}");
    // Garbage changed nothing: same SAs, no events (half-open SAs from mutated IKE_SA_INIT
    // requests aside, which report IkeSaConnecting and later expire).
    let after_a = p.a.ep.status(p.now);
    assert_eq!(before_a.len(), after_a.len());
    assert_eq!(before_a[0].ike, after_a[0].ike);
    while let Some(e) = p.a.ep.poll_event() {
        assert!(
            matches!(e, Event::IkeSaConnecting { tunnel: None, .. }),
            "{e:?}"
        );
    }
    while let Some(e) = p.b.ep.poll_event() {
        assert!(
            matches!(e, Event::IkeSaConnecting { tunnel: None, .. }),
            "{e:?}"
        );
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

// ---- one counter per kind of bad input ----

/// A datagram as one node sent it: (from, to, bytes).
type Sent = (SocketAddr, SocketAddr, Vec<u8>);

/// The first datagram in `sent` of this exchange and direction.
fn find(sent: &[Sent], exchange: ExchangeType, response: bool) -> Sent {
    sent.iter()
        .find(|(_, _, d)| {
            Header::parse(d).is_ok_and(|h| h.exchange == exchange && h.flags.response() == response)
        })
        .cloned()
        .unwrap_or_else(|| panic!("no {exchange} (response {response}) was sent"))
}

/// The last datagram in `sent` of this exchange and direction.
fn find_last(sent: &[Sent], exchange: ExchangeType, response: bool) -> Sent {
    sent.iter()
        .rev()
        .find(|(_, _, d)| {
            Header::parse(d).is_ok_and(|h| h.exchange == exchange && h.flags.response() == response)
        })
        .cloned()
        .unwrap_or_else(|| panic!("no {exchange} (response {response}) was sent"))
}

/// Feeds `data` to `ep` from `remote` and checks that exactly `reason` moved, by one (`None`:
/// nothing was counted). Returns what the endpoint sent in answer.
fn expect_drop(
    ep: &mut Endpoint,
    p_now: std::time::Instant,
    (local, remote): (SocketAddr, SocketAddr),
    data: &[u8],
    reason: Option<IkeDrop>,
    what: &str,
) -> Vec<Vec<u8>> {
    let before = ep.stats().clone();
    ep.handle_datagram(p_now, local, remote, data);
    let after = ep.stats();
    for r in IkeDrop::ALL {
        let want = u64::from(Some(*r) == reason);
        assert_eq!(
            after.get(*r) - before.get(*r),
            want,
            "{what}: counter {} moved by {} (expected {reason:?})",
            r.name(),
            after.get(*r) - before.get(*r),
        );
    }
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while ep.poll_transmit(&mut buf).is_some() {
        out.push(buf.clone());
    }
    out
}

/// An IKE_SA_INIT request from `spi` offering AES-GCM-256/PRF-SHA256 with `offered` groups and a
/// KE payload of `ke_group`, plus optional extra payloads first.
fn init_request(
    spi: u64,
    rng: &mut SeededRng,
    encr: u16,
    offered: &[u16],
    ke_group: DhGroup,
    extra: Vec<Payload>,
) -> Vec<u8> {
    let ke = KeyExchange::generate(ke_group, rng);
    let mut transforms = vec![
        Transform::with_key_length(TransformType::ENCR, encr, Some(256)),
        Transform::new(TransformType::PRF, 5),
    ];
    transforms.extend(
        offered
            .iter()
            .map(|g| Transform::new(TransformType::KE, *g)),
    );
    let mut payloads = extra;
    payloads.push(Payload::Sa(SaPayload {
        proposals: vec![Proposal {
            number: 1,
            protocol: ProtocolId::IKE,
            spi: vec![],
            transforms,
        }],
    }));
    payloads.push(Payload::Ke(KePayload {
        group: ke_group.id().0,
        data: ke.public_value(),
    }));
    payloads.push(Payload::Nonce(NoncePayload {
        data: spi.to_be_bytes().repeat(4),
    }));
    emit(Message {
        header: Header::new(
            IkeSpi(spi),
            IkeSpi(0),
            ExchangeType::IKE_SA_INIT,
            Flags::new(true, false),
            0,
        ),
        payloads,
        encrypted: None,
    })
}

fn emit(m: Message) -> Vec<u8> {
    let mut out = Vec::new();
    m.emit(&mut out).expect("emit");
    out
}

fn notify_in(answers: &[Vec<u8>], ty: NotifyType) -> bool {
    answers
        .iter()
        .any(|d| Message::parse(d).is_ok_and(|m| m.notify(ty).is_some()))
}

/// Table of bad inputs against the responder B of an established tunnel, each checked to move
/// exactly its own counter by one, while the tunnel survives all of them.
#[test]
fn each_bad_input_moves_its_own_counter() {
    let mut p = Pair::with_tunnel(910);
    p.connect();
    let ike_before = p.b.ep.status(p.now);
    let (a_init, b_init, init_req) = find(&p.a.sent, ExchangeType::IKE_SA_INIT, false);
    let (a_auth, b_auth, auth_req) = find(&p.a.sent, ExchangeType::IKE_AUTH, false);
    let (_, _, auth_resp) = find(&p.b.sent, ExchangeType::IKE_AUTH, true);
    let to_b = (b_auth, a_auth);
    let now = p.now;
    let ep = &mut p.b.ep;

    // Datagram-level damage.
    expect_drop(
        ep,
        now,
        to_b,
        &[0xFF],
        Some(IkeDrop::NatKeepalive),
        "keepalive",
    );
    expect_drop(
        ep,
        now,
        to_b,
        &auth_req[..20],
        Some(IkeDrop::Truncated),
        "short header",
    );
    let cut = &auth_req[..auth_req.len() - 1];
    expect_drop(ep, now, to_b, cut, Some(IkeDrop::Truncated), "cut message");
    let mut v3 = auth_req.clone();
    v3[17] = 0x30;
    expect_drop(ep, now, to_b, &v3, Some(IkeDrop::Malformed), "version 3");
    let mut longer = auth_req.clone();
    longer.push(0);
    expect_drop(
        ep,
        now,
        to_b,
        &longer,
        Some(IkeDrop::Malformed),
        "trailing byte",
    );
    let mut chain = auth_req.clone();
    chain[30..32].copy_from_slice(&3u16.to_be_bytes()); // SK payload length 3 < 4
    expect_drop(
        ep,
        now,
        to_b,
        &chain,
        Some(IkeDrop::Malformed),
        "payload length",
    );
    let random: Vec<u8> = (0..200u32).map(|i| (i * 37 + 11) as u8).collect();
    expect_drop(
        ep,
        now,
        to_b,
        &random,
        Some(IkeDrop::Malformed),
        "random bytes",
    );

    // SPIs, integrity, replays and direction.
    let mut unknown = auth_req.clone();
    unknown[8..16].copy_from_slice(&0x1122_3344_5566_7788u64.to_be_bytes());
    expect_drop(
        ep,
        now,
        to_b,
        &unknown,
        Some(IkeDrop::UnknownSpi),
        "unknown SPI",
    );
    let mut forged = auth_req.clone();
    let last = forged.len() - 1;
    forged[last] ^= 0x01;
    let out = expect_drop(
        ep,
        now,
        to_b,
        &forged,
        Some(IkeDrop::IcvFailed),
        "forged ICV",
    );
    assert!(out.is_empty(), "a forged request is not answered");
    let mut forged_ct = auth_req.clone();
    forged_ct[60] ^= 0x80;
    expect_drop(
        ep,
        now,
        to_b,
        &forged_ct,
        Some(IkeDrop::IcvFailed),
        "forged body",
    );
    let out = expect_drop(
        ep,
        now,
        to_b,
        &auth_req,
        Some(IkeDrop::RetransmitAnswered),
        "retransmitted IKE_AUTH",
    );
    assert_eq!(out, vec![auth_resp.clone()], "answered from the cache");
    // Reflected to its sender, a response names the SPI of the other side.
    expect_drop(
        ep,
        now,
        to_b,
        &auth_resp,
        Some(IkeDrop::UnknownSpi),
        "reflected response",
    );
    let old_init = (b_init, a_init);
    let out = expect_drop(
        ep,
        now,
        old_init,
        &init_req,
        Some(IkeDrop::OutsideWindow),
        "replayed IKE_SA_INIT of the live SA",
    );
    assert!(out.is_empty());
    let mut id9 = init_req.clone();
    id9[20..24].copy_from_slice(&9u32.to_be_bytes());
    let other = (b_init, SocketAddr::new(A_ADDR, 600));
    expect_drop(
        ep,
        now,
        other,
        &id9,
        Some(IkeDrop::Malformed),
        "INIT with ID 9",
    );

    // IKE_SA_INIT requests from a stranger.
    let mut rng = SeededRng::new(911);
    let x25519 = DhGroup::Curve25519.id().0;
    let stranger = (b_init, SocketAddr::new(A_ADDR, 501));
    let fresh = init_request(0x51, &mut rng, 20, &[x25519], DhGroup::Curve25519, vec![]);
    let out = expect_drop(ep, now, stranger, &fresh, None, "a valid IKE_SA_INIT");
    assert_eq!(out.len(), 1, "answered in full");
    assert_eq!(ep.half_open_count(), 1);
    let out = expect_drop(
        ep,
        now,
        stranger,
        &fresh,
        Some(IkeDrop::RetransmitAnswered),
        "retransmitted IKE_SA_INIT",
    );
    assert_eq!(out.len(), 1);
    let wrong_ke = init_request(
        0x52,
        &mut rng,
        20,
        &[DhGroup::Ecp256.id().0, x25519],
        DhGroup::Ecp256,
        vec![],
    );
    let out = expect_drop(
        ep,
        now,
        stranger,
        &wrong_ke,
        Some(IkeDrop::InitInvalidKe),
        "KE group",
    );
    assert!(notify_in(&out, NotifyType::INVALID_KE_PAYLOAD));
    // ENCR_3DES (3) is offered alone: nothing acceptable.
    let des = init_request(0x53, &mut rng, 3, &[x25519], DhGroup::Curve25519, vec![]);
    let out = expect_drop(
        ep,
        now,
        stranger,
        &des,
        Some(IkeDrop::InitNoProposal),
        "3DES only",
    );
    assert!(notify_in(&out, NotifyType::NO_PROPOSAL_CHOSEN));
    let mut no_nonce = Message::parse(&init_request(
        0x54,
        &mut rng,
        20,
        &[x25519],
        DhGroup::Curve25519,
        vec![],
    ))
    .expect("parse");
    no_nonce
        .payloads
        .retain(|x| !matches!(x, Payload::Nonce(_)));
    let out = expect_drop(
        ep,
        now,
        stranger,
        &emit(no_nonce),
        Some(IkeDrop::InitInvalid),
        "no Nonce",
    );
    assert!(notify_in(&out, NotifyType::INVALID_SYNTAX));
    let mut bad_value = Message::parse(&init_request(
        0x55,
        &mut rng,
        20,
        &[x25519],
        DhGroup::Curve25519,
        vec![],
    ))
    .expect("parse");
    for x in &mut bad_value.payloads {
        if let Payload::Ke(k) = x {
            k.data.truncate(7);
        }
    }
    let out = expect_drop(
        ep,
        now,
        stranger,
        &emit(bad_value),
        Some(IkeDrop::InitInvalid),
        "short public value",
    );
    assert!(notify_in(&out, NotifyType::INVALID_SYNTAX));
    // Garbage where the SA payload's proposals belong, with a consistent generic header.
    let mut garbage = init_request(0x56, &mut rng, 20, &[x25519], DhGroup::Curve25519, vec![]);
    for (i, b) in garbage[32..60].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(73) ^ 0x5a;
    }
    let out = expect_drop(
        ep,
        now,
        stranger,
        &garbage,
        Some(IkeDrop::Malformed),
        "garbage SA",
    );
    assert!(notify_in(&out, NotifyType::INVALID_SYNTAX));
    assert_eq!(ep.half_open_count(), 1, "no refused request left state");

    // Replays of older requests and stale responses need exchanges in both directions.
    let spi = *p.b.children.keys().next().expect("child");
    p.b.ep.rekey_child(p.now, spi).expect("rekey from B");
    p.run_for(Duration::from_secs(5));
    let spi = *p.a.children.keys().next().expect("child");
    p.a.ep.rekey_child(p.now, spi).expect("rekey from A");
    p.run_for(Duration::from_secs(5));
    let now = p.now;
    let (_, _, a_resp) = find(&p.a.sent, ExchangeType::CREATE_CHILD_SA, true);
    let (_, _, a_last_req) = find_last(&p.a.sent, ExchangeType::INFORMATIONAL, false);
    let ep = &mut p.b.ep;
    let out = expect_drop(
        ep,
        now,
        to_b,
        &auth_req,
        Some(IkeDrop::OutsideWindow),
        "old request",
    );
    assert!(out.is_empty(), "an old request is not answered");
    expect_drop(
        ep,
        now,
        to_b,
        &a_resp,
        Some(IkeDrop::UnexpectedResponse),
        "stale response",
    );
    expect_drop(
        ep,
        now,
        to_b,
        &a_last_req,
        Some(IkeDrop::RetransmitAnswered),
        "last request again",
    );

    // Nothing touched the tunnel.
    p.run_for(Duration::from_secs(60));
    p.assert_one_ike_sa();
    p.assert_children_consistent();
    assert_eq!(p.b.ep.status(p.now)[0].ike, ike_before[0].ike);
    assert_eq!(p.b.ep.half_open_count(), 0, "the stranger's SA expired");
    let a = p.a.ep.stats();
    assert_eq!(
        a.total(),
        a.get(IkeDrop::NatKeepalive),
        "A saw only valid traffic and keepalives: {a:?}"
    );

    // After a delete, the last request is still answered; anything else is unknown.
    p.a.ep.terminate(p.now, TunnelId(1)).expect("terminate");
    p.run_for(Duration::from_secs(5));
    assert!(p.b.ep.status(p.now).is_empty());
    let (_, _, delete) = find_last(&p.a.sent, ExchangeType::INFORMATIONAL, false);
    let now = p.now;
    let ep = &mut p.b.ep;
    let out = expect_drop(
        ep,
        now,
        to_b,
        &delete,
        Some(IkeDrop::RetransmitAnswered),
        "DELETE after the SA ended",
    );
    assert_eq!(out.len(), 1);
    expect_drop(
        ep,
        now,
        to_b,
        &auth_req,
        Some(IkeDrop::UnknownSpi),
        "SA gone",
    );
}

#[test]
fn cookie_demand_is_counted() {
    let eb = EndpointConfig {
        cookie_threshold: 0,
        ..Default::default()
    };
    let mut p = Pair::new(920, EndpointConfig::default(), eb);
    let mut b = cfg_b();
    b.remote_addrs.clear();
    p.b.ep.add_peer(p.now, b).expect("b");
    let mut rng = SeededRng::new(921);
    let x25519 = DhGroup::Curve25519.id().0;
    let req = init_request(0x77, &mut rng, 20, &[x25519], DhGroup::Curve25519, vec![]);
    let pair = (
        SocketAddr::new(B_ADDR, 500),
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 9, 9, 9)), 500),
    );
    let now = p.now;
    let out = expect_drop(
        &mut p.b.ep,
        now,
        pair,
        &req,
        Some(IkeDrop::InitCookieDemanded),
        "no cookie",
    );
    assert!(notify_in(&out, NotifyType::COOKIE));
    assert_eq!(p.b.ep.ike_sa_count(), 0);
}

#[test]
fn authentication_failures_are_counted_on_both_sides() {
    let mut b = cfg_b();
    b.psk = zeroize::Zeroizing::new(b"another secret".to_vec());
    let mut p = Pair::with_configs(930, cfg_a(), b);
    p.a.ep.initiate(p.now, TunnelId(1)).expect("initiate");
    p.run_for(Duration::from_secs(30));
    assert_eq!((p.a.established(), p.b.established()), (0, 0));
    for (side, ep) in [("A", &p.a.ep), ("B", &p.b.ep)] {
        assert_eq!(ep.stats().get(IkeDrop::AuthFailed), 1, "{side}");
        assert_eq!(ep.stats().total(), 1, "{side}: {:?}", ep.stats());
    }
}

#[test]
fn unusable_init_response_is_counted() {
    let mut p = Pair::with_tunnel(940);
    p.a.ep.initiate(p.now, TunnelId(1)).expect("initiate");
    let mut buf = Vec::new();
    let t = p.a.ep.poll_transmit(&mut buf).expect("IKE_SA_INIT");
    let req = Message::parse(&buf).expect("parse");
    // A response without KE payload, as a blind attacker could forge it.
    let sa = req
        .payloads
        .iter()
        .find(|x| matches!(x, Payload::Sa(_)))
        .cloned()
        .expect("SA");
    let forged = emit(Message {
        header: Header::new(
            req.header.ispi,
            IkeSpi(0x99),
            ExchangeType::IKE_SA_INIT,
            Flags::new(false, true),
            0,
        ),
        payloads: vec![sa, Payload::Nonce(NoncePayload { data: vec![7; 32] })],
        encrypted: None,
    });
    let now = p.now;
    expect_drop(
        &mut p.a.ep,
        now,
        (t.local, t.remote),
        &forged,
        Some(IkeDrop::InitInvalid),
        "response without KE",
    );
}
