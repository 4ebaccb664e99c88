//! Tests for the PRFs and prf+ (RFC 2202, RFC 4231 / RFC 4868 §2.7.1, NIST CAVP IKEv2 KDF).

use super::*;
use crate::test_vectors::parse;

const ALL: [Prf; 4] = [
    Prf::HmacSha1,
    Prf::HmacSha256,
    Prf::HmacSha384,
    Prf::HmacSha512,
];

fn prf_named(name: &str) -> Prf {
    match name {
        "HmacSha1" => Prf::HmacSha1,
        "HmacSha256" => Prf::HmacSha256,
        "HmacSha384" => Prf::HmacSha384,
        "HmacSha512" => Prf::HmacSha512,
        other => panic!("unknown PRF {other}"),
    }
}

#[test]
fn registry_round_trip() {
    for prf in ALL {
        assert_eq!(Prf::from_id(prf.id()), Some(prf));
    }
    assert_eq!(Prf::from_id(PrfId::HMAC_MD5), None);
    assert_eq!(Prf::from_id(PrfId::AES128_XCBC), None);
    assert_eq!(Prf::from_id(PrfId(1234)), None);
    let lens: Vec<usize> = ALL.iter().map(|p| p.output_len()).collect();
    assert_eq!(lens, [20, 32, 48, 64]);
}

/// RFC 2202 §3 and RFC 4231 §4 (= RFC 4868 §2.7.1) full-length HMAC outputs.
#[test]
fn published_hmac_vectors() {
    let vectors = parse(include_str!("../testdata/prf.txt"));
    assert_eq!(vectors.len(), 21);
    for v in vectors {
        let prf = prf_named(v.text("prf"));
        let (key, data, out) = (v.hex("key"), v.hex("data"), v.hex("out"));
        assert_eq!(*prf.prf(&key, &data), out, "{}", v.name);
        // The same value when the data arrives in pieces.
        for split in [0, 1, data.len() / 2, data.len()] {
            let (a, b) = data.split_at(split);
            assert_eq!(
                *prf.prf_parts(&key, &[a, &[], b]),
                out,
                "{} split at {split}",
                v.name
            );
        }
    }
}

/// NIST CAVP SP 800-135 "IKEv2 KDF" vectors: DKM = prf+(SKEYSEED, Ni | Nr | SPIi | SPIr).
#[test]
fn cavp_ikev2_prf_plus_vectors() {
    let vectors = parse(include_str!("../testdata/prf_plus.txt"));
    assert_eq!(vectors.len(), 6);
    for v in vectors {
        let prf = prf_named(v.text("prf"));
        let (key, seed, out) = (v.hex("key"), v.hex("seed"), v.hex("out"));
        assert_eq!(*prf.prf_plus(&key, &seed, out.len()), out, "{}", v.name);
        // Any prefix is the same stream truncated; a split seed changes nothing.
        assert_eq!(*prf.prf_plus(&key, &seed, 7), out[..7], "{}", v.name);
        let (a, b) = seed.split_at(seed.len() / 3);
        assert_eq!(
            *prf.prf_plus_parts(&key, &[a, b], out.len()),
            out,
            "{}",
            v.name
        );
        let mut buf = vec![0u8; out.len()];
        prf.prf_plus_into(&key, &[&seed], &mut buf);
        assert_eq!(buf, out, "{}", v.name);
    }
}

/// prf+ with HMAC-SHA-1 (no CAVP vector exists for it) against an independent implementation,
/// Python 3's hmac module:
///
/// ```python
/// import hmac, hashlib
/// def prf_plus(h, key, seed, n):
///     out, t, i = b"", b"", 1
///     while len(out) < n:
///         t = hmac.new(key, t + seed + bytes([i]), h).digest(); out += t; i += 1
///     return out[:n]
/// print(prf_plus(hashlib.sha1, bytes(range(20)), b"Ni|Nr|SPIi|SPIr", 70).hex())
/// ```
#[test]
fn sha1_prf_plus_matches_python() {
    let key: Vec<u8> = (0..20).collect();
    let out = Prf::HmacSha1.prf_plus(&key, b"Ni|Nr|SPIi|SPIr", 70);
    assert_eq!(
        hex::encode(&*out),
        "1135c6d7fc1f8472e5acd03d64445e44e80848795825fb91286897a4ca72e52ed702751050de481976ea\
         ee81e8b59684428bb0e45d42706d8d925e78d56666fd43ce5e57e5e0"
    );
}

/// The RFC 7296 §2.13 construction spelled out with `prf`, whose vectors are checked above.
#[test]
fn prf_plus_is_the_rfc_7296_construction() {
    for prf in ALL {
        let (k, s) = (b"some key".as_slice(), b"seed".as_slice());
        let t1 = prf.prf_parts(k, &[s, &[1]]);
        let t2 = prf.prf_parts(k, &[&t1, s, &[2]]);
        let t3 = prf.prf_parts(k, &[&t2, s, &[3]]);
        let expected = [t1.as_slice(), &t2, &t3].concat();
        let len = 2 * prf.output_len() + 5;
        assert_eq!(*prf.prf_plus(k, s, len), expected[..len], "{prf:?}");
    }
}

#[test]
fn prf_plus_lengths() {
    for prf in ALL {
        assert!(prf.prf_plus(b"k", b"s", 0).is_empty());
        let max = prf.max_prf_plus_len();
        assert_eq!(max, 255 * prf.output_len());
        let all = prf.prf_plus(b"k", b"s", max);
        // The last block uses counter 0xff.
        let last = &all[max - prf.output_len()..];
        let before = &all[max - 2 * prf.output_len()..max - prf.output_len()];
        assert_eq!(*prf.prf_parts(b"k", &[before, b"s", &[0xff]]), last);
    }
}

#[test]
#[should_panic(expected = "prf+ asked for 5101 bytes")]
fn prf_plus_beyond_255_blocks_is_a_caller_bug() {
    let _ = Prf::HmacSha1.prf_plus(b"k", b"s", 255 * 20 + 1);
}

#[test]
fn skeyseed_and_keymat_follow_rfc_7296() {
    let prf = Prf::HmacSha256;
    let (ni, nr, gir, sk_d) = (
        b"nonce-i".as_slice(),
        b"nonce-r".as_slice(),
        b"g^ir".as_slice(),
        b"SK_d",
    );
    // §2.14: SKEYSEED = prf(Ni | Nr, g^ir).
    assert_eq!(prf.skeyseed(ni, nr, gir), prf.prf(b"nonce-inonce-r", gir));
    // §2.18: SKEYSEED = prf(SK_d (old), g^ir (new) | Ni | Nr).
    assert_eq!(
        prf.rekey_skeyseed(sk_d, gir, ni, nr),
        prf.prf(sk_d, b"g^irnonce-inonce-r")
    );
    // §2.17: KEYMAT = prf+(SK_d, Ni | Nr) or prf+(SK_d, g^ir (new) | Ni | Nr).
    assert_eq!(
        prf.child_keymat(sk_d, None, ni, nr, 72),
        prf.prf_plus(sk_d, b"nonce-inonce-r", 72)
    );
    assert_eq!(
        prf.child_keymat(sk_d, Some(gir), ni, nr, 72),
        prf.prf_plus(sk_d, b"g^irnonce-inonce-r", 72)
    );
}

/// Keys longer than the hash block are hashed first (RFC 2104 §2); RFC 4231 case 6 covers
/// SHA-2 and this checks the SHA-1 path against the same rule.
#[test]
fn long_keys_are_hashed() {
    let long = [0xaa_u8; 131];
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, &long);
    assert_eq!(
        Prf::HmacSha1.prf(&long, b"x"),
        Prf::HmacSha1.prf(digest.as_ref(), b"x")
    );
}
