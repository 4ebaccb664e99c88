//! Unit tests of the engine's building blocks: key derivation and PSK AUTH (expected values
//! computed independently with Python's `hmac`/`hashlib`), the RFC 7634 Appendix B protected
//! message, NAT detection hashes, cookies, configuration parsers, proposal selection and
//! traffic selector narrowing.

use crate::child::narrow;
use crate::keys::{nat_hash, psk_auth, ChildKeyMat, CookieSecrets, IkeKeys};
use crate::proposal::{
    check_esp_response, esp_offer, ike_offer, select_esp, select_ike, EspAlgs, IkeAlgs,
};
use crate::sa::{IkeSa, SaState};
use crate::*;
use crypto::{DhGroup, Encr, Integ, Prf, SeededRng};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use wire::ike::{
    ExchangeType, Message, NotifyPayload, NotifyType, Payload, Proposal, ProtocolId, Transform,
    TransformType,
};
use wire::IkeSpi;
use zeroize::Zeroizing;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn gcm256() -> IkeAlgs {
    IkeAlgs {
        encr: Encr::AesGcm16_256,
        integ: None,
        prf: Prf::HmacSha256,
        dh: DhGroup::Curve25519,
    }
}

fn test_nonces() -> (Vec<u8>, Vec<u8>) {
    ((0u8..32).collect(), (100u8..132).collect())
}

#[test]
fn ike_key_derivation_matches_independent_computation() {
    let (ni, nr) = test_nonces();
    let skeyseed = Prf::HmacSha256.skeyseed(&ni, &nr, &[0x42; 32]);
    assert_eq!(
        skeyseed.to_vec(),
        hex("0f6bb4d3faf8eca6787a076b8691b7e0a8cdf81df45ba02e48c1eac24f40e217")
    );
    let keys = IkeKeys::derive(
        gcm256(),
        &skeyseed,
        &ni,
        &nr,
        0x1122334455667788,
        0x99aabbccddeeff00,
    )
    .expect("keys");
    assert_eq!(
        keys.keymat().to_vec(),
        hex("b0676e1e6c28143f6894a863e6626fff3216b14eb5cd1ab4aa07960d1128ccfa1e850e63442af1d0ed729bf5daabb9b39c500baca7f7ef4271aae1bec7b28c30c359ee8a8a339998b51f44f667536fc7ebeeefccb3fac06ef3eb6f8f995516def6509ef60cab9d0d37735b1cb1ac380a079bdef8a262d637c5454c31432598711dee191436d466567078937deb73369ed22a4de06f3123931cc916a384aaf375a1bbe2d61bf4df5c")
    );
    assert_eq!(keys.sk_d().len(), 32);
    assert_eq!(keys.sk_pi().len(), 32);
    let idi = [&[2u8, 0, 0, 0][..], b"hq.example"].concat();
    let auth = psk_auth(
        Prf::HmacSha256,
        b"correct horse battery staple",
        keys.sk_pi(),
        b"IKE_SA_INIT message bytes",
        &nr,
        &idi,
    );
    assert_eq!(
        auth.to_vec(),
        hex("1c63e054e1c53d0633d91c8faa7b69ad6b4887aa29141c6aeb2fe7683fef21ee")
    );
    let child = ChildKeyMat::derive(
        Prf::HmacSha256,
        keys.sk_d(),
        &EspAlgs {
            encr: Encr::AesGcm16_256,
            integ: None,
            esn: false,
            dh: None,
        },
        None,
        &ni,
        &nr,
    );
    let all = [child.encr_i.to_vec(), child.encr_r.to_vec()].concat();
    assert_eq!(all, hex("731e7a083687d0384384799bf7df00837e1b1c92a56502d84ca2feebbcbfc91f2dfa6e1b608481a21724f47b1b750a30afb9d2266f15172530ef83195fea954ec5c712fb209b3026"));
    assert!(child.integ_i.is_empty() && child.integ_r.is_empty());
    // Initiator and responder views are mirrored.
    let ki = child.for_event(true);
    let kr = child.for_event(false);
    assert_eq!(ki.outbound_encr, kr.inbound_encr);
    assert_eq!(ki.inbound_encr, kr.outbound_encr);
    let rekey = Prf::HmacSha256.rekey_skeyseed(keys.sk_d(), &[7; 32], &[1; 32], &[2; 32]);
    assert_eq!(
        rekey.to_vec(),
        hex("5b0f0ec80b658dcf93c208ec3f4ce8b86e54031c368354dde4826c6963b16d9b")
    );
}

/// RFC 7634 Appendix B: an INFORMATIONAL request from the original responder, protected with
/// ChaCha20-Poly1305 (SK_er = 80..9f, salt a0a1a2a3, IV 1011121314151617).
const RFC7634_B: &str = "c0c1c2c3c4c5c6c7 d0d1d2d3d4d5d6d7 2e202500 00000009 00000045
    29000029 1011121314151617 610394701f8d017f7c129248896b71bfe25236efd7cdc67066906315b2";

fn rfc7634_sa(initiator: bool) -> IkeSa {
    let algs = IkeAlgs {
        encr: Encr::ChaCha20Poly1305,
        integ: None,
        prf: Prf::HmacSha256,
        dh: DhGroup::Curve25519,
    };
    let sk_er: Vec<u8> = (0x80u8..=0xa3).collect();
    let keymat = [vec![0u8; 32], vec![0x55; 36], sk_er, vec![0; 64]].concat();
    let keys = IkeKeys::from_keymat(algs, Zeroizing::new(keymat)).expect("keys");
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 4500);
    let spis = IkeSpis {
        initiator: IkeSpi(0xc0c1c2c3c4c5c6c7),
        responder: IkeSpi(0xd0d1d2d3d4d5d6d7),
    };
    let ours = if initiator {
        spis.initiator
    } else {
        spis.responder
    };
    let mut sa = IkeSa::blank(Instant::now(), ours, spis, initiator, addr, addr);
    sa.keys = Some(keys);
    sa
}

#[test]
fn rfc7634_appendix_b_protect_and_unprotect() {
    let expected = hex(RFC7634_B);
    // As the original responder, our message 9 with IV counter 0x1011121314151617 is the RFC's.
    let mut responder = rfc7634_sa(false);
    responder.iv_counter = 0x1011121314151616;
    let window = Payload::Notify(NotifyPayload::new(
        NotifyType::SET_WINDOW_SIZE,
        10u32.to_be_bytes().to_vec(),
    ));
    let out = responder
        .protect(
            ExchangeType::INFORMATIONAL,
            9,
            false,
            std::slice::from_ref(&window),
        )
        .expect("protect");
    assert_eq!(out, expected);
    // The original initiator decrypts it.
    let initiator = rfc7634_sa(true);
    let msg = Message::parse(&expected).expect("parse");
    assert_eq!(
        initiator.unprotect(&expected, &msg).expect("unprotect"),
        vec![window]
    );
    // A flipped bit anywhere in the authenticated range fails.
    for i in [0, 20, 30, 35, 50, 68] {
        let mut bad = expected.clone();
        bad[i] ^= 1;
        if let Ok(m) = Message::parse(&bad) {
            assert!(initiator.unprotect(&bad, &m).is_err(), "byte {i}");
        }
    }
}

#[test]
fn cbc_hmac_protect_round_trip() {
    let algs = IkeAlgs {
        encr: Encr::AesCbc128,
        integ: Some(Integ::HmacSha256_128),
        prf: Prf::HmacSha256,
        dh: DhGroup::Modp2048,
    };
    let keys = |_: ()| {
        let km: Vec<u8> = (0..IkeKeys::keymat_len(&algs)).map(|i| i as u8).collect();
        IkeKeys::from_keymat(algs, Zeroizing::new(km)).expect("keys")
    };
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 500);
    let spis = IkeSpis {
        initiator: IkeSpi(1),
        responder: IkeSpi(2),
    };
    let mut i = IkeSa::blank(Instant::now(), IkeSpi(1), spis, true, addr, addr);
    i.keys = Some(keys(()));
    let mut r = IkeSa::blank(Instant::now(), IkeSpi(2), spis, false, addr, addr);
    r.keys = Some(keys(()));
    let payloads =
        vec![Payload::Notify(NotifyPayload::new(NotifyType::INITIAL_CONTACT, vec![])); 3];
    let bytes = i
        .protect(ExchangeType::INFORMATIONAL, 3, false, &payloads)
        .expect("protect");
    let msg = Message::parse(&bytes).expect("parse");
    assert_eq!(r.unprotect(&bytes, &msg).expect("unprotect"), payloads);
    // Our own direction's key does not open it.
    assert!(i.unprotect(&bytes, &msg).is_err());
}

#[test]
fn nat_detection_hash_matches_sha1() {
    let a = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), 500);
    assert_eq!(
        nat_hash(0x1122334455667788, 0, a),
        hex("77273b31d6ed8389ee69c66f0c7f2037f0a982eb")
    );
}

#[test]
fn cookies_verify_across_one_rotation() {
    let mut rng = SeededRng::new(5);
    let mut c = CookieSecrets::new();
    let t0 = Instant::now();
    c.maybe_rotate(t0, &mut rng);
    let ip = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));
    let cookie = c.make(&[1; 32], ip, 42);
    assert!(c.verify(&cookie, &[1; 32], ip, 42));
    assert!(!c.verify(&cookie, &[2; 32], ip, 42));
    assert!(!c.verify(&cookie, &[1; 32], ip, 43));
    assert!(!c.verify(
        &cookie,
        &[1; 32],
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 8)),
        42
    ));
    assert!(!c.verify(&[], &[1; 32], ip, 42));
    c.maybe_rotate(t0 + CookieSecrets::ROTATE, &mut rng);
    assert!(
        c.verify(&cookie, &[1; 32], ip, 42),
        "previous secret still accepted"
    );
    c.maybe_rotate(t0 + CookieSecrets::ROTATE * 2, &mut rng);
    assert!(
        !c.verify(&cookie, &[1; 32], ip, 42),
        "two rotations later it expired"
    );
}

#[test]
fn identity_parsing() {
    assert_eq!(
        Identity::parse("10.0.0.1").unwrap(),
        Identity::Ipv4(Ipv4Addr::new(10, 0, 0, 1))
    );
    assert!(matches!(
        Identity::parse("2001:db8::1").unwrap(),
        Identity::Ipv6(_)
    ));
    assert_eq!(
        Identity::parse("hq.example").unwrap(),
        Identity::Fqdn("hq.example".into())
    );
    assert_eq!(
        Identity::parse("@hq.example").unwrap(),
        Identity::Fqdn("hq.example".into())
    );
    assert_eq!(
        Identity::parse("fqdn:x.example").unwrap(),
        Identity::Fqdn("x.example".into())
    );
    assert_eq!(
        Identity::parse("user@hq.example").unwrap(),
        Identity::Rfc822("user@hq.example".into())
    );
    assert_eq!(
        Identity::parse("email:u@x").unwrap(),
        Identity::Rfc822("u@x".into())
    );
    assert_eq!(
        Identity::parse("@#0a0B").unwrap(),
        Identity::KeyId(vec![0x0a, 0x0b])
    );
    assert_eq!(
        Identity::parse("keyid:#0102").unwrap(),
        Identity::KeyId(vec![1, 2])
    );
    assert_eq!(
        Identity::parse("keyid:ab").unwrap(),
        Identity::KeyId(b"ab".to_vec())
    );
    assert!(Identity::parse("").is_err());
    assert!(Identity::parse("@#abc").is_err());
    assert!(Identity::parse("C=CH, O=strongSwan").is_err());
    // Wire round trip and case-insensitive names.
    for s in [
        "10.0.0.1",
        "2001:db8::1",
        "hq.example",
        "u@x.example",
        "@#deadbeef",
    ] {
        let id = Identity::parse(s).unwrap();
        let (t, d) = id.to_wire();
        assert_eq!(Identity::from_wire(t, &d), Some(id));
    }
    assert!(Identity::Fqdn("HQ.Example".into()).matches(&Identity::Fqdn("hq.example".into())));
    assert!(!Identity::Fqdn("hq.example".into()).matches(&Identity::Rfc822("hq.example".into())));
}

#[test]
fn proposal_parsing() {
    let p = IkeProposal::parse("aes256gcm16-prfsha256-x25519").unwrap();
    assert_eq!(p.encr, vec![Encr::AesGcm16_256]);
    assert!(p.integ.is_empty());
    assert_eq!(p.prf, vec![Prf::HmacSha256]);
    assert_eq!(p.dh, vec![DhGroup::Curve25519]);
    let p = IkeProposal::parse("aes128-aes256-sha256-sha1-modp2048-ecp256").unwrap();
    assert_eq!(p.encr, vec![Encr::AesCbc128, Encr::AesCbc256]);
    assert_eq!(p.integ, vec![Integ::HmacSha256_128, Integ::HmacSha1_96]);
    assert_eq!(
        p.prf,
        vec![Prf::HmacSha256, Prf::HmacSha1],
        "PRF follows integrity"
    );
    assert_eq!(p.dh, vec![DhGroup::Modp2048, DhGroup::Ecp256]);
    assert!(
        IkeProposal::parse("aes256gcm16-x25519").is_err(),
        "AEAD needs a PRF"
    );
    assert!(IkeProposal::parse("aes256-sha256").is_err(), "no group");
    assert!(
        IkeProposal::parse("aes256-modp2048").is_err(),
        "no integrity"
    );
    assert!(IkeProposal::parse("3des-sha1-modp1024").is_err());
    assert!(
        IkeProposal::parse("aes256gcm16-aes256-sha256-modp2048").is_err(),
        "mixed AEAD"
    );
    let e = match IkeProposal::parse("aes256-sha256-modp1536") {
        Err(Error::Config { reason, .. }) => reason,
        other => panic!("{other:?}"),
    };
    assert!(e.contains("modp1536"), "{e}");

    let e = EspProposal::parse("aes256gcm16").unwrap();
    assert_eq!(
        (e.encr, e.integ.len(), e.dh.len(), e.esn),
        (vec![Encr::AesGcm16_256], 0, 0, vec![false])
    );
    let e = EspProposal::parse("aes128-sha256-modp2048-esn-noesn").unwrap();
    assert_eq!(e.integ, vec![Integ::HmacSha256_128]);
    assert_eq!(e.dh, vec![DhGroup::Modp2048]);
    assert_eq!(e.esn, vec![true, false]);
    assert!(EspProposal::parse("aes128").is_err());
    assert!(EspProposal::parse("aes128gcm16-prfsha256").is_err());
}

#[test]
fn traffic_selector_display_names_exact_cidr_blocks() {
    for (text, shown) in [
        ("10.1.0.77/24", "10.1.0.0/24"),
        ("0.0.0.0/0", "0.0.0.0/0"),
        ("::/0", "::/0"),
        ("10.1.0.5", "10.1.0.5/32"),
        ("255.255.255.255", "255.255.255.255/32"),
        (
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128",
        ),
        ("10.1.0.0-10.1.1.255", "10.1.0.0/23"),
        ("128.0.0.0-255.255.255.255", "128.0.0.0/1"),
        ("fd00::-fd00::ffff", "fd00::/112"),
        ("10.1.0.1-10.1.0.9", "10.1.0.1..10.1.0.9"),
        ("10.1.0.0-10.1.0.254", "10.1.0.0..10.1.0.254"),
        ("10.1.0.128-10.1.1.127", "10.1.0.128..10.1.1.127"),
        ("0.0.0.1-255.255.255.255", "0.0.0.1..255.255.255.255"),
    ] {
        let ts = TrafficSelector::parse(text).unwrap();
        assert_eq!(ts.to_string(), shown, "{text}");
        // Display writes a range as `a..b`; the parser reads it as `a-b`.
        let reparsed = TrafficSelector::parse(&shown.replace("..", "-")).unwrap();
        assert_eq!(reparsed, ts, "{shown}");
    }
}

#[test]
fn traffic_selector_parsing_and_intersection() {
    let t = TrafficSelector::parse("10.1.0.0/24").unwrap();
    assert_eq!(
        (t.start, t.end),
        ("10.1.0.0".parse().unwrap(), "10.1.0.255".parse().unwrap())
    );
    assert_eq!((t.ip_proto, t.start_port, t.end_port), (0, 0, 65535));
    assert_eq!(t.to_string(), "10.1.0.0/24");
    let t = TrafficSelector::parse("10.1.0.5").unwrap();
    assert_eq!(t.start, t.end);
    let t = TrafficSelector::parse("10.1.0.1-10.1.0.9[tcp/443]").unwrap();
    assert_eq!((t.ip_proto, t.start_port, t.end_port), (6, 443, 443));
    let t = TrafficSelector::parse("fd00::/8[udp/1000-2000]").unwrap();
    assert_eq!((t.ip_proto, t.start_port, t.end_port), (17, 1000, 2000));
    assert_eq!(
        TrafficSelector::parse("0.0.0.0/0").unwrap().end,
        IpAddr::V4(Ipv4Addr::BROADCAST)
    );
    for bad in [
        "10.1.0.0/33",
        "10.1.0.9-10.1.0.1",
        "10.0.0.1-fd00::1",
        "x",
        "10.0.0.0/8[tcp/9-1]",
        "10.0.0.0/8[tcp",
    ] {
        assert!(TrafficSelector::parse(bad).is_err(), "{bad}");
    }
    let a = TrafficSelector::parse("10.1.0.0/16").unwrap();
    let b = TrafficSelector::parse("10.1.2.0/24[tcp]").unwrap();
    assert_eq!(a.intersect(&b), Some(b));
    assert!(b.is_subset_of(&a));
    assert!(a.contains_addr("10.1.200.1".parse().unwrap()));
    assert!(!a.contains_addr("fd00::1".parse().unwrap()));
    assert_eq!(
        a.intersect(&TrafficSelector::parse("10.2.0.0/16").unwrap()),
        None
    );
    assert_eq!(
        b.intersect(&TrafficSelector::parse("10.1.2.0/24[udp]").unwrap()),
        None
    );
    assert_eq!(
        a.intersect(&TrafficSelector::parse("fd00::/8").unwrap()),
        None
    );
}

#[test]
fn narrowing_intersects_and_drops_covered_selectors() {
    let ts = |s| TrafficSelector::parse(s).unwrap();
    // The peer's first selector is the specific packet, then the whole range (RFC 7296 §2.9).
    let proposed = [ts("10.1.0.5[tcp/80]"), ts("10.1.0.0/16")];
    assert_eq!(
        narrow(&proposed, &[ts("10.1.0.0/24")]),
        vec![ts("10.1.0.0/24")]
    );
    assert_eq!(
        narrow(&[ts("10.0.0.0/8")], &[ts("10.1.0.0/24"), ts("10.2.0.0/24")]),
        vec![ts("10.1.0.0/24"), ts("10.2.0.0/24")]
    );
    assert!(narrow(&[ts("10.9.0.0/16")], &[ts("10.1.0.0/24")]).is_empty());
}

fn ike_cfg(s: &str) -> Vec<IkeProposal> {
    s.split(',')
        .map(|p| IkeProposal::parse(p).unwrap())
        .collect()
}

#[test]
fn ike_selection_prefers_our_order_and_the_peers_ke_group() {
    let ours = ike_cfg("aes256gcm16-prfsha256-x25519-ecp256,aes128-sha256-modp2048");
    let theirs = ike_offer(
        &ike_cfg("aes128-sha256-modp2048,aes256gcm16-prfsha256-ecp256-x25519"),
        &[],
        None,
    );
    // Our first proposal wins although it is the peer's second.
    let (algs, resp) = select_ike(&ours, &theirs, Some(31), 0).unwrap();
    assert_eq!(
        algs,
        IkeAlgs {
            encr: Encr::AesGcm16_256,
            integ: None,
            prf: Prf::HmacSha256,
            dh: DhGroup::Curve25519
        }
    );
    assert_eq!(resp.number, 2);
    assert_eq!(resp.transforms.len(), 3);
    // The peer's KE group is taken among the common ones (no INVALID_KE round trip).
    let (algs, _) = select_ike(&ours, &theirs, Some(19), 0).unwrap();
    assert_eq!(algs.dh, DhGroup::Ecp256);
    // Otherwise our first common group (the caller then answers INVALID_KE_PAYLOAD).
    let (algs, _) = select_ike(&ours, &theirs, Some(14), 0).unwrap();
    assert_eq!(algs.dh, DhGroup::Curve25519);
    // The response checks out against what was offered.
    let mut resp = resp;
    resp.number = 1;
    assert_eq!(
        crate::proposal::check_ike_response(
            &ike_cfg("aes256gcm16-prfsha256-x25519"),
            &[resp.clone()],
            0
        )
        .unwrap()
        .encr,
        Encr::AesGcm16_256
    );
    assert!(
        crate::proposal::check_ike_response(&ike_cfg("aes128-sha256-modp2048"), &[resp], 0)
            .is_err()
    );
    // Nothing in common.
    assert!(matches!(
        select_ike(&ike_cfg("aes128-sha1-modp2048"), &theirs, None, 0),
        Err(Error::NoProposalChosen { .. })
    ));
}

#[test]
fn ike_selection_rejects_unknown_transforms_and_attributes() {
    let ours = ike_cfg("aes128-sha256-modp2048");
    let mut p = ike_offer(&ours, &[], None).remove(0);
    p.transforms.push(Transform::new(TransformType(6), 1));
    assert!(
        select_ike(&ours, &[p], None, 0).is_err(),
        "unknown transform type rejects the proposal"
    );
    let mut p = ike_offer(&ours, &[], None).remove(0);
    p.transforms[0].attributes.push(wire::ike::Attribute {
        ty: 99,
        value: wire::ike::AttributeValue::Tv(1),
    });
    assert!(
        select_ike(&ours, &[p], None, 0).is_err(),
        "unknown attribute rejects the transform"
    );
    // AES-GCM with INTEG NONE is fine; with a real integrity algorithm it is not.
    let ours = ike_cfg("aes256gcm16-prfsha256-x25519");
    let mut p = ike_offer(&ours, &[], None).remove(0);
    p.transforms.push(Transform::new(TransformType::INTEG, 0));
    assert!(select_ike(&ours, &[p.clone()], None, 0).is_ok());
    p.transforms.push(Transform::new(TransformType::INTEG, 12));
    assert!(select_ike(&ours, &[p], None, 0).is_err());
    // SPI size must fit the context (8 when rekeying).
    let p = ike_offer(&ours, &[1, 2, 3, 4, 5, 6, 7, 8], None);
    assert!(select_ike(&ours, &p, None, 0).is_err());
    assert!(select_ike(&ours, &p, None, 8).is_ok());
}

#[test]
fn esp_selection_pfs_and_esn() {
    let ours = vec![EspProposal::parse("aes128gcm16-ecp256-esn-noesn").unwrap()];
    let theirs = esp_offer(
        &[EspProposal::parse("aes128gcm16-ecp256-modp2048-noesn").unwrap()],
        0xc000_0001,
        true,
        None,
    );
    let c = select_esp(&ours, &theirs, Some(19), true).unwrap();
    assert_eq!(
        c.algs,
        EspAlgs {
            encr: Encr::AesGcm16_128,
            integ: None,
            esn: false,
            dh: Some(DhGroup::Ecp256)
        }
    );
    assert_eq!(c.peer_spi, 0xc000_0001);
    // In IKE_AUTH KE transforms are ignored.
    let c = select_esp(&ours, &theirs, None, false).unwrap();
    assert_eq!(c.algs.dh, None);
    // No PFS configured = NONE, which a PFS-only offer does not include.
    let nopfs = vec![EspProposal::parse("aes128gcm16").unwrap()];
    assert!(select_esp(&nopfs, &theirs, Some(19), true).is_err());
    let offer_without_ke = esp_offer(&nopfs, 0xc000_0002, true, None);
    assert_eq!(
        select_esp(&nopfs, &offer_without_ke, None, true)
            .unwrap()
            .algs
            .dh,
        None
    );
    // SPIs 0..=255 are reserved.
    let bad = esp_offer(&nopfs, 7, true, None);
    assert!(select_esp(&nopfs, &bad, None, true).is_err());
    // A response with our choice checks out; one with two encryption transforms does not.
    let mut resp = c.proposal.clone();
    resp.spi = 0xc000_0003u32.to_be_bytes().to_vec();
    assert!(check_esp_response(&ours, &[resp.clone()], false).is_ok());
    resp.transforms.push(Transform::with_key_length(
        TransformType::ENCR,
        20,
        Some(256),
    ));
    assert!(check_esp_response(&ours, &[resp], false).is_err());
    let _ = Proposal {
        number: 1,
        protocol: ProtocolId::ESP,
        spi: vec![],
        transforms: vec![],
    };
}

#[test]
fn error_notify_mapping() {
    assert_eq!(
        Error::NoProposalChosen { what: "IKE" }.notify(),
        Some(NotifyType::NO_PROPOSAL_CHOSEN)
    );
    let e = Error::InvalidKePayload {
        wanted: DhGroup::Ecp256,
    };
    assert_eq!(e.notify(), Some(NotifyType::INVALID_KE_PAYLOAD));
    assert_eq!(e.notify_data(), vec![0, 19]);
    assert_eq!(
        Error::TsUnacceptable.notify(),
        Some(NotifyType::TS_UNACCEPTABLE)
    );
    assert_eq!(
        Error::AuthenticationFailed("x").notify(),
        Some(NotifyType::AUTHENTICATION_FAILED)
    );
    assert_eq!(Error::UnknownTunnel(TunnelId(1)).notify(), None);
    let e = Error::Malformed {
        spi: IkeSpi(1),
        source: wire::ike::IkeWireError::UnsupportedCriticalPayload {
            payload: wire::ike::PayloadType(99),
        },
    };
    assert_eq!(e.notify(), Some(NotifyType::UNSUPPORTED_CRITICAL_PAYLOAD));
    assert_eq!(e.notify_data(), vec![99]);
}

#[test]
fn a_restored_sa_never_reuses_an_iv() {
    // A store written back to an older copy of the record must not make the restored SA
    // protect new messages with IVs (AES-GCM nonces) it already used.
    let now = Instant::now();
    let mut sa = rfc7634_sa(false);
    sa.state = SaState::Established;
    sa.established = Some(now);
    sa.iv_counter = 7;
    let older = crate::snapshot::encode(&sa, now).expect("an established SA is snapshotted");
    let restored = crate::snapshot::decode(&older, now, Duration::ZERO).expect("restores");
    assert_eq!(restored.iv_counter, 7 + crate::snapshot::RESTORE_IV_GAP);
    sa.iv_counter = u64::MAX - 1;
    let worn = crate::snapshot::encode(&sa, now).expect("snapshot");
    assert!(crate::snapshot::decode(&worn, now, Duration::ZERO).is_err());
}
