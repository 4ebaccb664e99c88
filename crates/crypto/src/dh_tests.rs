//! Tests for the key exchange groups: RFC 7748 §5.2/§6.1, RFC 8031 appendix A, RFC 5903 §8,
//! a MODP-2048 known answer, agreement between random key pairs, and rejection of bad peers.

use super::*;
use crate::{
    test_vectors::{parse, ReplayRng},
    SeededRng,
};

const ALL: [DhGroup; 4] = [
    DhGroup::Modp2048,
    DhGroup::Ecp256,
    DhGroup::Ecp384,
    DhGroup::Curve25519,
];

fn group_named(name: &str) -> DhGroup {
    match name {
        "Modp2048" => DhGroup::Modp2048,
        "Ecp256" => DhGroup::Ecp256,
        "Ecp384" => DhGroup::Ecp384,
        "Curve25519" => DhGroup::Curve25519,
        other => panic!("unknown group {other}"),
    }
}

/// An Rng that only ever yields zeros: broken.
struct ZeroRng;
impl Rng for ZeroRng {
    fn fill(&mut self, dest: &mut [u8]) {
        dest.fill(0);
    }
}

#[test]
fn registry_round_trip() {
    for g in ALL {
        assert_eq!(DhGroup::from_id(g.id()), Some(g));
    }
    for unsupported in [
        KeId::NONE,
        KeId::MODP1024,
        KeId::MODP3072,
        KeId::ECP521,
        KeId::CURVE448,
    ] {
        assert_eq!(DhGroup::from_id(unsupported), None);
    }
    let lens: Vec<(usize, usize)> = ALL
        .iter()
        .map(|g| (g.public_len(), g.shared_secret_len()))
        .collect();
    assert_eq!(lens, [(256, 256), (64, 32), (96, 48), (32, 32)]);
}

/// Known answers: the private value is what the Rng yields, so replaying a published private
/// key must reproduce the published public value and shared secret.
#[test]
fn published_key_exchange_vectors() {
    let vectors = parse(include_str!("../testdata/ke.txt"));
    assert_eq!(vectors.len(), 11);
    for v in vectors {
        let group = group_named(v.text("group"));
        let mut rng = ReplayRng::new(v.hex("i"));
        let kx = KeyExchange::generate(group, &mut rng);
        assert!(
            rng.exhausted(),
            "{}: the private value is exactly one draw",
            v.name
        );
        assert_eq!(kx.group(), group);
        if v.get("gi").is_some() {
            assert_eq!(kx.public_value(), v.hex("gi"), "{}", v.name);
            assert_eq!(kx.public_bytes(), v.hex("gi"), "{}", v.name);
        }
        let shared = kx
            .shared_secret(&v.hex("gr"))
            .unwrap_or_else(|e| panic!("{}: {e}", v.name));
        assert_eq!(*shared, v.hex("gir"), "{}", v.name);
    }
}

#[test]
fn random_key_pairs_agree_in_every_group() {
    let mut rng = SeededRng::new(7);
    for group in ALL {
        let a = KeyExchange::generate(group, &mut rng);
        let b = KeyExchange::generate(group, &mut rng);
        assert_eq!(a.public_value().len(), group.public_len(), "{group:?}");
        assert_ne!(a.public_value(), b.public_value(), "{group:?}");
        let ab = a.shared_secret(&b.public_value()).expect("valid peer");
        let ba = b.shared_secret(&a.public_value()).expect("valid peer");
        assert_eq!(ab, ba, "{group:?}");
        assert_eq!(ab.len(), group.shared_secret_len(), "{group:?}");
    }
}

#[test]
fn private_keys_come_only_from_the_rng() {
    for group in ALL {
        let a = KeyExchange::generate(group, &mut SeededRng::new(42));
        let b = KeyExchange::generate(group, &mut SeededRng::new(42));
        let c = KeyExchange::generate(group, &mut SeededRng::new(43));
        assert_eq!(a.public_value(), b.public_value(), "{group:?}");
        assert_ne!(a.public_value(), c.public_value(), "{group:?}");
    }
}

#[test]
fn debug_output_shows_no_key_material() {
    let kx = KeyExchange::generate(DhGroup::Curve25519, &mut SeededRng::new(1));
    assert_eq!(format!("{kx:?}"), "KeyExchange { group: Curve25519, .. }");
}

fn p_bytes() -> [u8; 256] {
    MODP2048_P.as_ref().to_be_bytes()
}

fn add_small(mut v: [u8; 256], delta: i16) -> [u8; 256] {
    let n = U2048::from_be_slice(&v);
    let d = U2048::from_u16(delta.unsigned_abs());
    v = if delta < 0 {
        n.wrapping_sub(&d)
    } else {
        n.wrapping_add(&d)
    }
    .to_be_bytes();
    v
}

#[test]
fn modp_public_value_is_in_range() {
    let p = U2048::from_be_slice(&p_bytes());
    let mut rng = SeededRng::new(3);
    for _ in 0..8 {
        let kx = KeyExchange::generate(DhGroup::Modp2048, &mut rng);
        let y = U2048::from_be_slice(&kx.public_value());
        assert!(y > U2048::ONE && y < p.wrapping_sub(&U2048::ONE));
    }
}

/// RFC 7296 §3.4 / §2.14: public values and g^ir are left-padded to the prime's length.
#[test]
fn modp_values_are_left_padded() {
    let mut found = false;
    for seed in 0..4096 {
        let a = KeyExchange::generate(DhGroup::Modp2048, &mut SeededRng::new(seed));
        if a.public_value()[0] != 0 {
            continue;
        }
        found = true;
        assert_eq!(a.public_value().len(), 256);
        let b = KeyExchange::generate(DhGroup::Modp2048, &mut SeededRng::new(seed + 100_000));
        assert_eq!(
            *b.shared_secret(&a.public_value()).expect("valid"),
            *a.shared_secret(&b.public_value()).expect("valid")
        );
        break;
    }
    assert!(
        found,
        "one public value in 4096 starts with a zero byte (p = 1/256 each)"
    );
}

#[test]
fn modp_rejects_peer_values_out_of_range() {
    let kx = KeyExchange::generate(DhGroup::Modp2048, &mut SeededRng::new(5));
    let p = p_bytes();
    let mut one = [0u8; 256];
    one[255] = 1;
    let mut two = [0u8; 256];
    two[255] = 2;
    let bad: [(&str, [u8; 256]); 6] = [
        ("0", [0u8; 256]),
        ("1", one),
        ("p-1", add_small(p, -1)),
        ("p", p),
        ("p+1", add_small(p, 1)),
        ("2^2048-1", [0xff; 256]),
    ];
    for (name, value) in bad {
        assert_eq!(
            kx.shared_secret(&value),
            Err(Error::PublicValue {
                group: "MODP-2048",
                len: 256
            }),
            "{name}"
        );
    }
    // The edges just inside the range are accepted.
    assert!(kx.shared_secret(&two).is_ok());
    assert!(kx.shared_secret(&add_small(p, -2)).is_ok());
}

#[test]
fn every_group_rejects_wrong_lengths() {
    let mut rng = SeededRng::new(9);
    for group in ALL {
        let kx = KeyExchange::generate(group, &mut rng);
        let peer = KeyExchange::generate(group, &mut rng).public_value();
        for len in [
            0,
            1,
            group.public_len() - 1,
            group.public_len() + 1,
            2 * group.public_len(),
        ] {
            let mut value = peer.clone();
            value.resize(len, 0);
            assert_eq!(
                kx.shared_secret(&value),
                Err(Error::PublicValue {
                    group: group.name(),
                    len
                }),
                "{group:?} len {len}"
            );
        }
    }
}

#[test]
fn ecp_rejects_points_not_on_the_curve() {
    let mut rng = SeededRng::new(11);
    for group in [DhGroup::Ecp256, DhGroup::Ecp384] {
        let kx = KeyExchange::generate(group, &mut rng);
        let peer = KeyExchange::generate(group, &mut rng).public_value();
        let n = group.public_len();
        let bad_error = Err(Error::PublicValue {
            group: group.name(),
            len: n,
        });
        // y flipped in its last bit: almost surely off the curve (the curve has at most one
        // other y per x, namely p - y, which differs in many bits).
        let mut off = peer.clone();
        off[n - 1] ^= 1;
        assert_eq!(kx.shared_secret(&off), bad_error, "{group:?} off-curve");
        assert_eq!(kx.shared_secret(&vec![0; n]), bad_error, "{group:?} (0, 0)");
        assert_eq!(
            kx.shared_secret(&vec![0xff; n]),
            bad_error,
            "{group:?} coordinates >= p"
        );
        // The SEC 1 encoding with its 0x04 octet is not the RFC 5903 §7 form.
        let mut sec1 = vec![0x04];
        sec1.extend_from_slice(&peer[..n - 1]);
        assert!(kx.shared_secret(&sec1).is_err(), "{group:?} SEC 1 form");
        // The genuine point still works.
        assert!(kx.shared_secret(&peer).is_ok());
    }
}

/// RFC 8031 §2.3 / RFC 7748 §6.1: small-order points give an all-zero secret, which is refused.
#[test]
fn x25519_rejects_small_order_points() {
    let kx = KeyExchange::generate(DhGroup::Curve25519, &mut SeededRng::new(13));
    let small_order = [
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0100000000000000000000000000000000000000000000000000000000000000",
        "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
        "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157",
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    ];
    for u in small_order {
        assert_eq!(
            kx.shared_secret(&hex::decode(u).expect("hex")),
            Err(Error::PublicValue {
                group: "Curve25519",
                len: 32
            }),
            "{u}"
        );
    }
}

/// RFC 5903 §3: the ECP private key is in [1, n-1]; other draws are discarded.
#[test]
fn ecp_private_key_is_drawn_by_rejection() {
    let v = parse(include_str!("../testdata/ke.txt"))
        .into_iter()
        .find(|v| v.name == "rfc5903-8.1-initiator")
        .expect("vector present");
    let mut draws = P256_ORDER.to_vec(); // n itself: out of range
    draws.extend_from_slice(&[0xff; 32]); // above n
    draws.extend_from_slice(&[0; 32]); // zero
    draws.extend_from_slice(&v.hex("i")); // in range
    let mut rng = ReplayRng::new(draws);
    let kx = KeyExchange::generate(DhGroup::Ecp256, &mut rng);
    assert!(rng.exhausted());
    assert_eq!(kx.public_value(), v.hex("gi"));

    // n - 1 is the largest valid scalar, for both curves.
    for (group, order) in [
        (DhGroup::Ecp256, &P256_ORDER[..]),
        (DhGroup::Ecp384, &P384_ORDER[..]),
    ] {
        let mut n_minus_1 = order.to_vec();
        *n_minus_1.last_mut().expect("non-empty") -= 1;
        let mut rng = ReplayRng::new(n_minus_1);
        let kx = KeyExchange::generate(group, &mut rng);
        assert!(rng.exhausted(), "{group:?}");
        // (n-1)G = -G: same x as the generator, so it is a valid point; a peer agrees with it.
        let peer = KeyExchange::generate(group, &mut SeededRng::new(1));
        assert_eq!(
            kx.shared_secret(&peer.public_value()).expect("valid"),
            peer.shared_secret(&kx.public_value()).expect("valid")
        );
    }
}

#[test]
fn constant_time_helpers() {
    assert!(ct_less_than(&[0, 1], &[0, 2]));
    assert!(ct_less_than(&[0, 0xff], &[1, 0]));
    assert!(!ct_less_than(&[1, 0], &[1, 0]));
    assert!(!ct_less_than(&[2, 0], &[1, 0xff]));
    assert!(!ct_less_than(&P256_ORDER, &P256_ORDER));
    assert!(!is_nonzero(&[0, 0, 0]));
    assert!(is_nonzero(&[0, 0, 1]));
}

#[test]
#[should_panic(expected = "unusable private values in a row")]
fn a_broken_rng_is_detected() {
    let _ = KeyExchange::generate(DhGroup::Ecp256, &mut ZeroRng);
}

/// IKE SA state (with a pending key exchange) moves between threads.
#[test]
fn key_exchanges_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<KeyExchange>();
}
