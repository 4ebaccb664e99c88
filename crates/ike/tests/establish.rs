//! Establishment of IKE SAs and their first CHILD_SA through the two-engine harness:
//! both directions, every group, AEAD and CBC+HMAC, responder preference, failures (PSK,
//! identity, proposals, selectors), INVALID_KE_PAYLOAD retry, cookies under a flood,
//! retransmitted and malformed IKE_SA_INIT requests.

mod harness;
use crypto::{DhGroup, KeyExchange, SeededRng};
use harness::*;
use protego_ike::*;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;
use wire::ike::*;
use wire::IkeSpi;

fn no_child_within(p: &mut Pair, d: Duration) {
    p.run_for(d);
    assert!(p.a.children.is_empty() && p.b.children.is_empty());
}

#[test]
fn establish_a_to_b() {
    let mut p = Pair::with_tunnel(1);
    p.connect();
    p.assert_children_consistent();
    p.assert_one_ike_sa();
    assert_eq!(p.a.established(), 1);
    assert_eq!(p.b.established(), 1);
    let a = p.a.children.values().next().expect("child");
    assert_eq!(a.proposal, "AES_GCM_16_256/NO_EXT_SEQ");
    assert_eq!(a.local_ts, vec![ts("10.1.0.0/24")]);
    assert_eq!(a.remote.port(), 4500, "force_encap floats to port 4500");
    assert_eq!(a.keys.inbound_encr.len(), 36);
    assert!(a.replaces.is_none());
    let st = &p.a.ep.status(p.now)[0];
    assert!(st.initiator);
    assert_eq!(st.proposal, "AES_GCM_16_256/PRF_HMAC_SHA2_256/CURVE_25519");
    assert_eq!(st.children.len(), 1);
    // Four datagrams in all: IKE_SA_INIT and IKE_AUTH, request and response.
    assert_eq!(p.a.sent.len() + p.b.sent.len(), 4);
}

#[test]
fn establish_b_to_a() {
    let mut p = Pair::with_tunnel(2);
    p.b.ep.initiate(p.now, TunnelId(1)).expect("initiate");
    assert!(
        p.run_until(Duration::from_secs(10), |p| p.a.children.len() == 1
            && p.b.children.len() == 1)
    );
    p.assert_children_consistent();
    p.assert_one_ike_sa();
    assert!(p.b.ep.status(p.now)[0].initiator);
}

#[test]
fn every_group() {
    for (i, g) in ["modp2048", "ecp256", "ecp384", "x25519"]
        .iter()
        .enumerate()
    {
        let (mut a, mut b) = (cfg_a(), cfg_b());
        a.ike_proposals = vec![ike(&format!("aes256gcm16-prfsha256-{g}"))];
        b.ike_proposals = a.ike_proposals.clone();
        a.esp_proposals = vec![esp(&format!("aes128gcm16-{g}"))];
        b.esp_proposals = a.esp_proposals.clone();
        let mut p = Pair::with_configs(10 + i as u64, a, b);
        p.connect();
        p.assert_children_consistent();
        let proposal = p.a.ep.status(p.now)[0].proposal.clone();
        assert!(
            proposal.ends_with(match *g {
                "modp2048" => "MODP_2048",
                "ecp256" => "ECP_256",
                "ecp384" => "ECP_384",
                _ => "CURVE_25519",
            }),
            "{proposal}"
        );
        // PFS groups play no part in IKE_AUTH.
        assert!(p.a.children.values().all(|c| c.pfs.is_none()));
        // ... but in a rekey.
        let spi = *p.a.children.keys().next().expect("child");
        p.a.ep.rekey_child(p.now, spi).expect("rekey");
        p.run_for(Duration::from_secs(5));
        p.assert_children_consistent();
        assert!(p.a.children.values().all(|c| c.pfs.is_some()), "{g}");
    }
}

#[test]
fn aead_and_cbc_hmac_proposals() {
    let cases = [
        (
            "aes128-sha256-modp2048",
            "aes128-sha256",
            "AES_CBC_128/HMAC_SHA2_256_128/PRF_HMAC_SHA2_256/MODP_2048",
            "AES_CBC_128/HMAC_SHA2_256_128/NO_EXT_SEQ",
            16,
            32,
        ),
        (
            "aes256-sha384-ecp384",
            "aes256-sha512-esn",
            "AES_CBC_256/HMAC_SHA2_384_192/PRF_HMAC_SHA2_384/ECP_384",
            "AES_CBC_256/HMAC_SHA2_512_256/EXT_SEQ",
            32,
            64,
        ),
        (
            "chacha20poly1305-prfsha512-x25519",
            "chacha20poly1305",
            "CHACHA20_POLY1305_256/PRF_HMAC_SHA2_512/CURVE_25519",
            "CHACHA20_POLY1305_256/NO_EXT_SEQ",
            36,
            0,
        ),
        (
            "aes256-sha1-ecp256",
            "aes256-sha1",
            "AES_CBC_256/HMAC_SHA1_96/PRF_HMAC_SHA1/ECP_256",
            "AES_CBC_256/HMAC_SHA1_96/NO_EXT_SEQ",
            32,
            20,
        ),
        (
            "aes128gcm16-prfsha384-ecp256",
            "aes128gcm16",
            "AES_GCM_16_128/PRF_HMAC_SHA2_384/ECP_256",
            "AES_GCM_16_128/NO_EXT_SEQ",
            20,
            0,
        ),
    ];
    for (i, (ikep, espp, ike_name, esp_name, ekey, akey)) in cases.into_iter().enumerate() {
        let (mut a, mut b) = (cfg_a(), cfg_b());
        a.ike_proposals = vec![ike(ikep)];
        b.ike_proposals = vec![ike(ikep)];
        a.esp_proposals = vec![esp(espp)];
        b.esp_proposals = vec![esp(espp)];
        let mut p = Pair::with_configs(20 + i as u64, a, b);
        p.connect();
        p.assert_children_consistent();
        assert_eq!(p.b.ep.status(p.now)[0].proposal, ike_name);
        let c = p.a.children.values().next().expect("child");
        assert_eq!(c.proposal, esp_name);
        assert_eq!(c.keys.outbound_encr.len(), ekey);
        assert_eq!(c.keys.outbound_integ.len(), akey);
    }
}

#[test]
fn responder_prefers_its_own_order() {
    let (mut a, mut b) = (cfg_a(), cfg_b());
    a.ike_proposals = vec![
        ike("aes128-sha256-modp2048"),
        ike("aes256gcm16-prfsha256-x25519"),
    ];
    b.ike_proposals = vec![
        ike("aes256gcm16-prfsha256-x25519"),
        ike("aes128-sha256-modp2048"),
    ];
    a.esp_proposals = vec![esp("aes128-sha256"), esp("aes256gcm16")];
    b.esp_proposals = vec![esp("aes256gcm16"), esp("aes128-sha256")];
    let mut p = Pair::with_configs(30, a, b);
    p.connect();
    assert_eq!(
        p.a.ep.status(p.now)[0].proposal,
        "AES_GCM_16_256/PRF_HMAC_SHA2_256/CURVE_25519"
    );
    assert_eq!(
        p.a.children.values().next().expect("child").proposal,
        "AES_GCM_16_256/NO_EXT_SEQ"
    );
}

fn assert_auth_failed_both(p: &mut Pair) {
    p.a.ep.initiate(p.now, TunnelId(1)).expect("initiate");
    p.run_for(Duration::from_secs(30));
    assert_eq!(p.a.established(), 0);
    assert_eq!(p.b.established(), 0);
    assert_eq!(p.a.deleted_reasons(), vec![DeleteReason::AuthFailed]);
    assert_eq!(p.b.deleted_reasons(), vec![DeleteReason::AuthFailed]);
    assert!(p.a.ep.status(p.now).is_empty(), "no state left on A");
    assert!(p.b.ep.status(p.now).is_empty(), "no state left on B");
    assert_eq!(p.b.ep.half_open_count(), 0);
    assert!(p.a.children.is_empty() && p.b.children.is_empty());
}

#[test]
fn wrong_psk() {
    let mut b = cfg_b();
    b.psk = zeroize::Zeroizing::new(b"another secret".to_vec());
    let mut p = Pair::with_configs(40, cfg_a(), b);
    assert_auth_failed_both(&mut p);
}

#[test]
fn wrong_initiator_identity() {
    let mut a = cfg_a();
    a.local_id = Identity::parse("intruder.example").expect("id");
    let mut p = Pair::with_configs(41, a, cfg_b());
    assert_auth_failed_both(&mut p);
}

#[test]
fn wrong_responder_identity_requested() {
    // A asks for IDr "other.example", which B is not.
    let mut a = cfg_a();
    a.remote_id = Identity::parse("other.example").expect("id");
    let mut p = Pair::with_configs(42, a, cfg_b());
    assert_auth_failed_both(&mut p);
}

#[test]
fn identity_types() {
    for (i, (ida, idb)) in [
        ("10.1.0.1", "fd00::1"),
        ("user@hq.example", "@#c0ffee"),
        ("keyid:hq", "198.51.100.2"),
    ]
    .iter()
    .enumerate()
    {
        let (mut a, mut b) = (cfg_a(), cfg_b());
        a.local_id = Identity::parse(ida).expect("id");
        b.remote_id = a.local_id.clone();
        b.local_id = Identity::parse(idb).expect("id");
        a.remote_id = b.local_id.clone();
        let mut p = Pair::with_configs(43 + i as u64, a, b);
        p.connect();
    }
}

#[test]
fn responder_selects_tunnel_by_identity() {
    // B has two tunnels for "any" address; A's identity picks the second, whose PSK differs.
    let mut b1 = cfg_b();
    b1.remote_addrs.clear();
    b1.remote_id = Identity::parse("branch.example").expect("id");
    b1.psk = zeroize::Zeroizing::new(b"branch secret".to_vec());
    let mut b2 = cfg_b();
    b2.id = TunnelId(2);
    b2.remote_addrs.clear();
    let mut p = Pair::new(46, EndpointConfig::default(), EndpointConfig::default());
    p.a.ep.add_peer(p.now, cfg_a()).expect("a");
    p.b.ep.add_peer(p.now, b1).expect("b1");
    p.b.ep.add_peer(p.now, b2).expect("b2");
    p.connect();
    assert_eq!(
        p.b.children.values().next().expect("child").tunnel,
        TunnelId(2)
    );
}

#[test]
fn ike_no_proposal_chosen() {
    let mut b = cfg_b();
    b.ike_proposals = vec![ike("aes128-sha1-modp2048")];
    let mut p = Pair::with_configs(50, cfg_a(), b);
    p.a.ep.initiate(p.now, TunnelId(1)).expect("initiate");
    no_child_within(&mut p, Duration::from_secs(5));
    assert_eq!(p.a.deleted_reasons(), vec![DeleteReason::NegotiationFailed]);
    assert!(
        p.b.events.is_empty(),
        "B keeps no state and reports nothing: {:?}",
        p.b.events
    );
    assert_eq!(p.b.ep.ike_sa_count(), 0);
    // B answered with NO_PROPOSAL_CHOSEN.
    let (_, _, resp) = &p.b.sent[0];
    let m = Message::parse(resp).expect("parse");
    assert!(m.notify(NotifyType::NO_PROPOSAL_CHOSEN).is_some());
}

#[test]
fn esp_no_proposal_chosen_keeps_ike_sa() {
    let mut b = cfg_b();
    b.esp_proposals = vec![esp("aes128-sha1")];
    let mut p = Pair::with_configs(51, cfg_a(), b);
    p.a.ep.initiate(p.now, TunnelId(1)).expect("initiate");
    no_child_within(&mut p, Duration::from_secs(5));
    assert_eq!((p.a.established(), p.b.established()), (1, 1));
    p.assert_one_ike_sa();
}

#[test]
fn traffic_selector_narrowing() {
    let (mut a, mut b) = (cfg_a(), cfg_b());
    a.local_ts = vec![ts("10.1.0.0/16")];
    a.remote_ts = vec![ts("10.2.0.0/16"), ts("10.3.0.0/16")];
    b.local_ts = vec![ts("10.2.0.0/24"), ts("10.3.5.0/24[tcp]")];
    b.remote_ts = vec![ts("10.1.7.0/24")];
    let mut p = Pair::with_configs(52, a, b);
    p.connect();
    p.assert_children_consistent();
    let c = p.a.children.values().next().expect("child");
    assert_eq!(c.local_ts, vec![ts("10.1.7.0/24")]);
    assert_eq!(c.remote_ts, vec![ts("10.2.0.0/24"), ts("10.3.5.0/24[tcp]")]);
}

#[test]
fn traffic_selectors_unacceptable() {
    let mut b = cfg_b();
    b.remote_ts = vec![ts("10.9.0.0/24")];
    let mut p = Pair::with_configs(53, cfg_a(), b);
    p.a.ep.initiate(p.now, TunnelId(1)).expect("initiate");
    no_child_within(&mut p, Duration::from_secs(5));
    p.assert_one_ike_sa();
    let auth_resp = &p.b.sent[1].2;
    assert_eq!(
        Message::parse(auth_resp).expect("parse").header.exchange,
        ExchangeType::IKE_AUTH
    );
}

#[test]
fn invalid_ke_payload_retry() {
    let (mut a, mut b) = (cfg_a(), cfg_b());
    a.ike_proposals = vec![ike("aes256gcm16-prfsha256-x25519-ecp384")];
    b.ike_proposals = vec![ike("aes256gcm16-prfsha256-ecp384")];
    let mut p = Pair::with_configs(54, a, b);
    p.connect();
    assert_eq!(
        p.a.ep.status(p.now)[0].proposal,
        "AES_GCM_16_256/PRF_HMAC_SHA2_256/ECP_384"
    );
    // Request, INVALID_KE, request again (same SPI), response, then IKE_AUTH.
    let first = Message::parse(&p.b.sent[0].2).expect("parse");
    let n = first
        .notify(NotifyType::INVALID_KE_PAYLOAD)
        .expect("INVALID_KE_PAYLOAD");
    assert_eq!(n.data, vec![0, 20]);
    let r1 = Message::parse(&p.a.sent[0].2).expect("parse");
    let r2 = Message::parse(&p.a.sent[1].2).expect("parse");
    assert_eq!(r1.header.ispi, r2.header.ispi);
    assert_eq!(
        p.b.ep.ike_sa_count(),
        1,
        "the rejected request left no state"
    );
}

/// A syntactically valid IKE_SA_INIT request from `spi` with an x25519 KE.
fn init_request(spi: u64, rng: &mut SeededRng, cookie: Option<Vec<u8>>) -> Vec<u8> {
    let ke = KeyExchange::generate(DhGroup::Curve25519, rng);
    let mut payloads = Vec::new();
    if let Some(c) = cookie {
        payloads.push(Payload::Notify(NotifyPayload::new(NotifyType::COOKIE, c)));
    }
    payloads.push(Payload::Sa(SaPayload {
        proposals: vec![Proposal {
            number: 1,
            protocol: ProtocolId::IKE,
            spi: vec![],
            transforms: vec![
                Transform::with_key_length(TransformType::ENCR, 20, Some(256)),
                Transform::new(TransformType::PRF, 5),
                Transform::new(TransformType::KE, 31),
            ],
        }],
    }));
    payloads.push(Payload::Ke(KePayload {
        group: 31,
        data: ke.public_value(),
    }));
    payloads.push(Payload::Nonce(NoncePayload {
        data: spi.to_be_bytes().repeat(4),
    }));
    let m = Message {
        header: Header::new(
            IkeSpi(spi),
            IkeSpi(0),
            ExchangeType::IKE_SA_INIT,
            Flags::new(true, false),
            0,
        ),
        payloads,
        encrypted: None,
    };
    let mut out = Vec::new();
    m.emit(&mut out).expect("emit");
    out
}

fn drain(p: &mut Pair) -> Vec<(SocketAddr, Vec<u8>)> {
    let mut v = Vec::new();
    let mut buf = Vec::new();
    while let Some(t) = p.b.ep.poll_transmit(&mut buf) {
        v.push((t.remote, buf.clone()));
    }
    while p.b.ep.poll_event().is_some() {}
    v
}

#[test]
fn cookies_under_a_flood_of_half_open_requests() {
    let eb = EndpointConfig {
        cookie_threshold: 4,
        ..Default::default()
    };
    let mut p = Pair::new(60, EndpointConfig::default(), eb);
    p.a.ep.add_peer(p.now, cfg_a()).expect("a");
    let mut b = cfg_b();
    b.remote_addrs.clear();
    p.b.ep.add_peer(p.now, b).expect("b");
    let mut rng = SeededRng::new(61);
    let bl = SocketAddr::new(B_ADDR, 500);
    let mut cookies = 0;
    for i in 0..100u64 {
        let from = SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(10, 200, (i / 250) as u8, (i % 250) as u8 + 1)),
            500,
        );
        let req = init_request(0x1000 + i, &mut rng, None);
        p.b.ep.handle_datagram(p.now, bl, from, &req);
        for (_, d) in drain(&mut p) {
            let m = Message::parse(&d).expect("parse");
            if let Some(c) = m.notify(NotifyType::COOKIE) {
                cookies += 1;
                assert_eq!(m.payloads.len(), 1, "a cookie answer carries nothing else");
                // Following the cookie creates the SA; a forged cookie does not.
                if i == 50 {
                    let mut forged = c.data.clone();
                    forged[5] ^= 1;
                    p.b.ep.handle_datagram(
                        p.now,
                        bl,
                        from,
                        &init_request(0x1000 + i, &mut rng, Some(forged)),
                    );
                    let r = drain(&mut p);
                    assert!(Message::parse(&r[0].1)
                        .expect("parse")
                        .notify(NotifyType::COOKIE)
                        .is_some());
                    let before = p.b.ep.half_open_count();
                    // The cookie binds Ni: our helper derives Ni from the SPI, so it repeats.
                    p.b.ep.handle_datagram(
                        p.now,
                        bl,
                        from,
                        &init_request(0x1000 + i, &mut rng, Some(c.data.clone())),
                    );
                    let r = drain(&mut p);
                    let m = Message::parse(&r[0].1).expect("parse");
                    assert!(
                        m.payloads.iter().any(|x| matches!(x, Payload::Ke(_))),
                        "valid cookie answered in full"
                    );
                    assert_eq!(p.b.ep.half_open_count(), before + 1);
                }
            }
        }
    }
    assert_eq!(
        cookies, 96,
        "after 4 half-open SAs every request is answered with a COOKIE"
    );
    assert_eq!(p.b.ep.half_open_count(), 5);
    // A legitimate initiator follows the cookie and gets through.
    p.connect();
    assert_eq!(p.a.ep.status(p.now).len(), 1);
    // The flood's half-open SAs expire.
    p.run_for(Duration::from_secs(40));
    assert_eq!(p.b.ep.half_open_count(), 0);
    assert_eq!(p.b.ep.status(p.now).len(), 1);
    assert!(
        p.b.count(|e| matches!(
            e,
            Event::IkeSaDeleted {
                tunnel: None,
                reason: DeleteReason::NegotiationFailed,
                ..
            }
        )) >= 1
    );
}

#[test]
fn retransmitted_init_request_answered_from_cache() {
    let mut p = Pair::with_tunnel(62);
    let mut rng = SeededRng::new(63);
    let req = init_request(0xabc, &mut rng, None);
    let bl = SocketAddr::new(B_ADDR, 500);
    let from = SocketAddr::new(A_ADDR, 500);
    p.b.ep.handle_datagram(p.now, bl, from, &req);
    let r1 = drain(&mut p);
    p.b.ep.handle_datagram(p.now, bl, from, &req);
    let r2 = drain(&mut p);
    assert_eq!(r1, r2);
    assert_eq!(p.b.ep.half_open_count(), 1);
    assert_eq!(p.b.ep.ike_sa_count(), 1);
}

#[test]
fn malformed_requests_create_no_state() {
    let mut p = Pair::with_tunnel(64);
    let bl = SocketAddr::new(B_ADDR, 500);
    let from = SocketAddr::new(A_ADDR, 500);
    let mut rng = SeededRng::new(65);
    let good = init_request(0xdef, &mut rng, None);
    // Truncations, a missing KE, a bad KE value, version 3, junk.
    for n in [0, 1, 27, 28, 40, good.len() - 1] {
        p.b.ep.handle_datagram(p.now, bl, from, &good[..n]);
    }
    let mut no_ke = Message::parse(&good).expect("parse");
    no_ke.payloads.retain(|x| !matches!(x, Payload::Ke(_)));
    let mut d = Vec::new();
    no_ke.emit(&mut d).expect("emit");
    p.b.ep.handle_datagram(p.now, bl, from, &d);
    let r = drain(&mut p);
    assert!(Message::parse(&r.last().expect("answer").1)
        .expect("parse")
        .notify(NotifyType::INVALID_SYNTAX)
        .is_some());
    let mut bad_ke = Message::parse(&good).expect("parse");
    for x in &mut bad_ke.payloads {
        if let Payload::Ke(k) = x {
            k.data.truncate(10);
        }
    }
    let mut d = Vec::new();
    bad_ke.emit(&mut d).expect("emit");
    p.b.ep.handle_datagram(p.now, bl, from, &d);
    let mut v3 = good.clone();
    v3[17] = 0x30;
    p.b.ep.handle_datagram(p.now, bl, from, &v3);
    p.b.ep
        .handle_datagram(p.now, bl, from, &[0xde, 0xad, 0xbe, 0xef]);
    // An unknown critical payload is answered with UNSUPPORTED_CRITICAL_PAYLOAD.
    let mut crit = Message::parse(&good).expect("parse");
    crit.payloads.push(Payload::Unknown(UnknownPayload {
        ty: PayloadType(200),
        critical: true,
        body: vec![],
    }));
    let mut d = Vec::new();
    crit.emit(&mut d).expect("emit");
    drain(&mut p);
    p.b.ep.handle_datagram(p.now, bl, from, &d);
    let r = drain(&mut p);
    let n = Message::parse(&r[0].1).expect("parse");
    assert_eq!(
        n.notify(NotifyType::UNSUPPORTED_CRITICAL_PAYLOAD)
            .expect("notify")
            .data,
        vec![200]
    );
    assert_eq!(p.b.ep.ike_sa_count(), 0);
    assert_eq!(p.b.ep.half_open_count(), 0);
}

#[test]
fn peer_config_debug_never_prints_the_psk() {
    let cfg = cfg_a();
    let shown = format!("{cfg:?}");
    assert!(shown.contains("<redacted>"), "{shown}");
    assert!(
        !shown.contains("horse"),
        "the PSK leaked into Debug: {shown}"
    );
    assert!(
        shown.contains("hq.example"),
        "other fields still shown: {shown}"
    );
}
