//! Tests for the keyed ciphers: GCM specification and draft-mcgrew-gcm-test-01 ESP vectors,
//! RFC 8439 / RFC 7634 ChaCha20-Poly1305, RFC 3602 AES-CBC, RFC 2202 / RFC 4868 §2.7.2
//! truncated HMACs, and every length and authentication failure.

use super::*;
use crate::{prf::Prf, test_vectors::parse};

const ALL_ENCR: [Encr; 5] = [
    Encr::AesGcm16_128,
    Encr::AesGcm16_256,
    Encr::ChaCha20Poly1305,
    Encr::AesCbc128,
    Encr::AesCbc256,
];
const ALL_INTEG: [Integ; 4] = [
    Integ::HmacSha1_96,
    Integ::HmacSha256_128,
    Integ::HmacSha384_192,
    Integ::HmacSha512_256,
];

fn encr_named(name: &str) -> Encr {
    *ALL_ENCR
        .iter()
        .find(|e| format!("{e:?}") == name)
        .unwrap_or_else(|| panic!("unknown {name}"))
}

fn integ_named(name: &str) -> Integ {
    *ALL_INTEG
        .iter()
        .find(|i| format!("{i:?}") == name)
        .unwrap_or_else(|| panic!("unknown {name}"))
}

/// A CBC cipher keyed with a fixed integrity key, for tests that only look at encryption.
fn cbc(encr: Encr, key: &[u8]) -> SaCipher {
    SaCipher::new(encr, key, Some((Integ::HmacSha256_128, &[0x11; 32]))).expect("valid keys")
}

#[test]
fn encr_registry() {
    for e in ALL_ENCR {
        let (id, bits) = e.id();
        assert_eq!(Encr::from_id(id, bits), Some(e));
    }
    assert_eq!(Encr::from_id(EncrId::AES_GCM_16, None), None);
    assert_eq!(Encr::from_id(EncrId::AES_GCM_16, Some(192)), None);
    assert_eq!(Encr::from_id(EncrId::AES_CBC, None), None);
    assert_eq!(Encr::from_id(EncrId::AES_CBC, Some(192)), None);
    assert_eq!(Encr::from_id(EncrId::CHACHA20_POLY1305, Some(256)), None);
    assert_eq!(Encr::from_id(EncrId::AES_GCM_8, Some(128)), None);
    assert_eq!(Encr::from_id(EncrId::DES3, None), None);
    assert_eq!(Encr::from_id(EncrId::NULL, None), None);
    let sizes: Vec<_> = ALL_ENCR
        .iter()
        .map(|e| {
            (
                e.is_aead(),
                e.keymat_len(),
                e.iv_len(),
                e.aead_icv_len(),
                e.block_size(),
            )
        })
        .collect();
    assert_eq!(
        sizes,
        [
            (true, 20, 8, 16, 4),
            (true, 36, 8, 16, 4),
            (true, 36, 8, 16, 4),
            (false, 16, 16, 0, 16),
            (false, 32, 16, 0, 16)
        ]
    );
}

#[test]
fn integ_registry() {
    for i in ALL_INTEG {
        assert_eq!(Integ::from_id(i.id()), Some(i));
    }
    for unsupported in [
        IntegId::NONE,
        IntegId::HMAC_MD5_96,
        IntegId::AES_XCBC_96,
        IntegId(99),
    ] {
        assert_eq!(Integ::from_id(unsupported), None);
    }
    let sizes: Vec<_> = ALL_INTEG
        .iter()
        .map(|i| (i.key_len(), i.icv_len()))
        .collect();
    assert_eq!(sizes, [(20, 12), (32, 16), (48, 24), (64, 32)]);
}

/// GCM spec test cases 1-4 and 13-16, draft-mcgrew-gcm-test-01 ESP examples, RFC 8439 §2.8.2
/// and A.5, RFC 7634 appendices A (ESP) and B (IKEv2).
#[test]
fn published_aead_vectors() {
    let vectors = parse(include_str!("../testdata/aead.txt"));
    assert_eq!(vectors.len(), 25);
    for v in vectors {
        let encr = encr_named(v.text("encr"));
        let cipher = SaCipher::new(encr, &v.hex("key"), None).expect("valid key");
        assert_eq!(
            (cipher.iv_len(), cipher.icv_len(), cipher.block_size()),
            (8, 16, 1)
        );
        let (iv, aad, plain) = (v.hex("iv"), v.hex("aad"), v.hex("plain"));
        let (expected_ct, expected_icv) = (v.hex("cipher"), v.hex("icv"));

        let mut buf = plain.clone();
        let mut icv = [0u8; 16];
        cipher
            .seal_in_place(&iv, &aad, &mut buf, &mut icv)
            .expect("seal");
        assert_eq!(buf, expected_ct, "{} ciphertext", v.name);
        assert_eq!(icv.as_slice(), expected_icv, "{} icv", v.name);

        cipher
            .open_in_place(&iv, &aad, &mut buf, &icv)
            .expect("open");
        assert_eq!(buf, plain, "{} plaintext", v.name);

        assert_tamper_detected(&cipher, &iv, &aad, &expected_ct, &expected_icv, &[], v.name);
    }
}

/// Every single-bit change of the IV, AAD, ciphertext, ICV or trailer fails authentication.
fn assert_tamper_detected(
    cipher: &SaCipher,
    iv: &[u8],
    aad: &[u8],
    ct: &[u8],
    icv: &[u8],
    trailer: &[u8],
    name: &str,
) {
    let open = |iv: &[u8], aad: &[u8], ct: &[u8], icv: &[u8], trailer: &[u8]| {
        let mut buf = ct.to_vec();
        cipher.open_in_place_with_trailer(iv, aad, &mut buf, trailer, icv)
    };
    assert_eq!(open(iv, aad, ct, icv, trailer), Ok(()), "{name} untouched");
    let flip = |v: &[u8], i: usize| {
        let mut v = v.to_vec();
        v[i] ^= 0x80;
        v
    };
    for i in [0, iv.len() - 1] {
        assert_eq!(
            open(&flip(iv, i), aad, ct, icv, trailer),
            Err(Error::Authentication),
            "{name} iv[{i}]"
        );
    }
    if !aad.is_empty() {
        assert_eq!(
            open(iv, &flip(aad, 0), ct, icv, trailer),
            Err(Error::Authentication),
            "{name} aad"
        );
        assert_eq!(
            open(iv, &aad[1..], ct, icv, trailer),
            Err(Error::Authentication),
            "{name} short aad"
        );
    }
    if !ct.is_empty() {
        let last = ct.len() - 1;
        assert_eq!(
            open(iv, aad, &flip(ct, last), icv, trailer),
            Err(Error::Authentication),
            "{name} ct"
        );
    }
    for i in [0, icv.len() - 1] {
        assert_eq!(
            open(iv, aad, ct, &flip(icv, i), trailer),
            Err(Error::Authentication),
            "{name} icv[{i}]"
        );
    }
    if !trailer.is_empty() {
        assert_eq!(
            open(iv, aad, ct, icv, &flip(trailer, 0)),
            Err(Error::Authentication),
            "{name} trailer"
        );
        assert_eq!(
            open(iv, aad, ct, icv, &[]),
            Err(Error::Authentication),
            "{name} no trailer"
        );
    }
}

/// RFC 3602 §4 cases 1-3 and NIST SP 800-38A F.2.1 / F.2.5: the CBC ciphertext.
#[test]
fn published_cbc_vectors() {
    let vectors = parse(include_str!("../testdata/cbc.txt"));
    assert_eq!(vectors.len(), 5);
    for v in vectors {
        let cipher = cbc(encr_named(v.text("encr")), &v.hex("key"));
        assert_eq!(
            (cipher.iv_len(), cipher.icv_len(), cipher.block_size()),
            (16, 16, 16)
        );
        let (iv, plain, expected) = (v.hex("iv"), v.hex("plain"), v.hex("cipher"));
        let aad = b"SPI.SEQ.";
        let mut buf = plain.clone();
        let mut icv = [0u8; 16];
        cipher
            .seal_in_place(&iv, aad, &mut buf, &mut icv)
            .expect("seal");
        assert_eq!(buf, expected, "{}", v.name);
        // The ICV is the truncated HMAC of aad | iv | ciphertext (RFC 4303 §3.3.2.1).
        let mac = Prf::HmacSha256.prf_parts(&[0x11; 32], &[aad, &iv, &expected]);
        assert_eq!(icv, mac[..16], "{}", v.name);
        cipher
            .open_in_place(&iv, aad, &mut buf, &icv)
            .expect("open");
        assert_eq!(buf, plain, "{}", v.name);
        assert_tamper_detected(&cipher, &iv, aad, &expected, &icv, &[], v.name);
    }
}

/// RFC 2202 (HMAC-SHA-1-96) and RFC 4868 §2.7.2 (AUTH256/384/512) truncated ICVs. The data of
/// vectors at least 16 bytes long is fed through a CBC cipher as `aad | iv` with an empty
/// payload, so the ICV path of `SaCipher` itself is what is checked; shorter data is checked
/// through the same HMAC algorithm mapping.
#[test]
fn published_integrity_vectors() {
    let vectors = parse(include_str!("../testdata/integ.txt"));
    assert_eq!(vectors.len(), 11);
    let mut through_sa_cipher = 0;
    for v in vectors {
        let integ = integ_named(v.text("integ"));
        let (key, data, expected) = (v.hex("key"), v.hex("data"), v.hex("icv"));
        assert_eq!(expected.len(), integ.icv_len(), "{}", v.name);
        let full = hmac::sign(&hmac::Key::new(integ.hmac_algorithm(), &key), &data);
        assert_eq!(full.as_ref()[..integ.icv_len()], expected, "{}", v.name);
        if data.len() < 16 {
            continue;
        }
        through_sa_cipher += 1;
        let cipher = SaCipher::new(Encr::AesCbc128, &[0; 16], Some((integ, &key))).expect("keys");
        assert_eq!(cipher.icv_len(), integ.icv_len());
        let (aad, iv) = data.split_at(data.len() - 16);
        let mut icv = vec![0u8; integ.icv_len()];
        cipher
            .seal_in_place(iv, aad, &mut [], &mut icv)
            .expect("seal");
        assert_eq!(icv, expected, "{}", v.name);
        assert_eq!(
            cipher.open_in_place(iv, aad, &mut [], &expected),
            Ok(()),
            "{}",
            v.name
        );
        assert_tamper_detected(&cipher, iv, aad, &[], &expected, &[], v.name);
    }
    assert_eq!(through_sa_cipher, 7);
}

/// AES-CBC + HMAC for ESP, with and without the ESN trailer (RFC 4303 §2.2.1), against an
/// independent implementation (Python 3 with pyca/cryptography):
///
/// ```python
/// import hmac, hashlib
/// from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
/// key = bytes.fromhex("c286696d887c9aa0611bbb3e2025a45a")   # RFC 3602 case 2
/// iv = bytes.fromhex("562e17996d093d28ddb3ba695a2e6f58")
/// e = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
/// ct = e.update(bytes(range(32))) + e.finalize()
/// aad = bytes.fromhex("0000123400000001")
/// print(hmac.new(bytes(range(0x40, 0x60)), aad + iv + ct, hashlib.sha256).digest()[:16].hex())
/// print(hmac.new(bytes(range(0x40, 0x60)), aad + iv + ct + bytes.fromhex("00000002"),
///                hashlib.sha256).digest()[:16].hex())
/// print(hmac.new(bytes(range(0x40, 0x54)), aad + iv + ct, hashlib.sha1).digest()[:12].hex())
/// ek = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
/// print((ek.update(bytes(8) + (1).to_bytes(8, "big")) + ek.finalize()).hex())
/// ```
#[test]
fn cbc_hmac_esp_matches_python() {
    let key = hex::decode("c286696d887c9aa0611bbb3e2025a45a").expect("hex");
    let iv = hex::decode("562e17996d093d28ddb3ba695a2e6f58").expect("hex");
    let ct = hex::decode("d296cd94c2cccf8a3a863028b5e1dc0a7586602d253cfff91b8266bea6d61ab1")
        .expect("hex");
    let aad = hex::decode("0000123400000001").expect("hex");
    let plain: Vec<u8> = (0..32).collect();
    let cases: [(Integ, Vec<u8>, &[u8], &str); 3] = [
        (
            Integ::HmacSha256_128,
            (0x40..0x60).collect(),
            &[],
            "2fe31a37a27e5febd0e0b7c28afe9f1b",
        ),
        (
            Integ::HmacSha256_128,
            (0x40..0x60).collect(),
            &[0, 0, 0, 2],
            "89adcfcb103b9776191b2269681464fe",
        ),
        (
            Integ::HmacSha1_96,
            (0x40..0x54).collect(),
            &[],
            "1abd541dbe4dfe3a430c8f2e",
        ),
    ];
    for (integ, integ_key, trailer, expected) in cases {
        let cipher = SaCipher::new(Encr::AesCbc128, &key, Some((integ, &integ_key))).expect("keys");
        let mut buf = plain.clone();
        let mut icv = vec![0u8; integ.icv_len()];
        cipher
            .seal_in_place_with_trailer(&iv, &aad, &mut buf, trailer, &mut icv)
            .expect("seal");
        assert_eq!(buf, ct);
        assert_eq!(hex::encode(&icv), expected, "{integ:?} trailer {trailer:?}");
        cipher
            .open_in_place_with_trailer(&iv, &aad, &mut buf, trailer, &icv)
            .expect("open");
        assert_eq!(buf, plain);
        assert_tamper_detected(&cipher, &iv, &aad, &ct, &icv, trailer, "python cbc");
    }

    // iv_from_counter for CBC: AES-ECB(key, 0^64 | counter) (NIST SP 800-38A appendix C).
    let cipher = cbc(Encr::AesCbc128, &key);
    let mut out = [0u8; 16];
    cipher.iv_from_counter(1, &mut out);
    assert_eq!(hex::encode(out), "cdbd1e99b9c39732b823647f14ec864f");
}

#[test]
fn iv_from_counter() {
    for encr in [
        Encr::AesGcm16_128,
        Encr::ChaCha20Poly1305,
        Encr::AesGcm16_256,
    ] {
        let cipher = SaCipher::new(encr, &vec![7; encr.keymat_len()], None).expect("keys");
        let mut iv = [0xee_u8; 10];
        cipher.iv_from_counter(0x0102_0304_0506_0708, &mut iv);
        // RFC 4106 §3.1: the counter itself, big-endian; bytes past iv_len() are untouched.
        assert_eq!(iv, [1, 2, 3, 4, 5, 6, 7, 8, 0xee, 0xee]);
    }
    for encr in [Encr::AesCbc128, Encr::AesCbc256] {
        let key = vec![9; encr.keymat_len()];
        let cipher = cbc(encr, &key);
        // Equal to the forward cipher of the counter block, computed with aws-lc's ECB mode.
        let ecb = EncryptingKey::ecb(
            UnboundCipherKey::new(
                if encr == Encr::AesCbc128 {
                    &AES_128
                } else {
                    &AES_256
                },
                &key,
            )
            .expect("key"),
        )
        .expect("ecb");
        let mut seen = std::collections::HashSet::new();
        for counter in [0, 1, 2, u64::from(u32::MAX) + 1, u64::MAX] {
            let mut iv = [0u8; 16];
            cipher.iv_from_counter(counter, &mut iv);
            let mut block = [0u8; 16];
            block[8..].copy_from_slice(&counter.to_be_bytes());
            ecb.less_safe_encrypt(&mut block, EncryptionContext::None)
                .expect("one block");
            assert_eq!(iv, block, "{encr:?} {counter}");
            assert!(seen.insert(iv), "distinct counters give distinct IVs");
        }
    }
}

#[test]
#[should_panic(expected = "IV buffer of 15 bytes, AES-CBC-128 needs 16")]
fn iv_from_counter_with_a_short_buffer_is_a_caller_bug() {
    cbc(Encr::AesCbc128, &[0; 16]).iv_from_counter(1, &mut [0; 15]);
}

#[test]
fn wrong_key_lengths_are_errors() {
    for encr in ALL_ENCR {
        let integ = (!encr.is_aead()).then_some((Integ::HmacSha256_128, [0u8; 32].as_slice()));
        for len in [
            0,
            encr.keymat_len() - 1,
            encr.keymat_len() + 1,
            encr.keymat_len() - 4 * usize::from(encr.is_aead()),
        ] {
            if len == encr.keymat_len() {
                continue;
            }
            assert_eq!(
                SaCipher::new(encr, &vec![0; len], integ).map(|_| ()),
                Err(Error::KeyLength {
                    alg: encr.name(),
                    got: len,
                    expected: encr.keymat_len()
                }),
                "{encr:?} {len}"
            );
        }
    }
    for integ in ALL_INTEG {
        for len in [0, integ.key_len() - 1, integ.key_len() + 1] {
            assert_eq!(
                SaCipher::new(Encr::AesCbc256, &[0; 32], Some((integ, &vec![0; len]))).map(|_| ()),
                Err(Error::KeyLength {
                    alg: integ.name(),
                    got: len,
                    expected: integ.key_len()
                }),
                "{integ:?} {len}"
            );
        }
    }
}

#[test]
fn transform_combinations_are_checked() {
    assert!(matches!(
        SaCipher::new(
            Encr::AesGcm16_128,
            &[0; 20],
            Some((Integ::HmacSha256_128, &[0; 32]))
        ),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        SaCipher::new(Encr::AesCbc128, &[0; 16], None),
        Err(Error::Unsupported(_))
    ));
    let cbc = SaCipher::new(
        Encr::AesCbc128,
        &[0; 16],
        Some((Integ::HmacSha384_192, &[0; 48])),
    )
    .expect("keys");
    assert_eq!(
        (cbc.encr(), cbc.integ()),
        (Encr::AesCbc128, Some(Integ::HmacSha384_192))
    );
    assert_eq!(cbc.icv_len(), 24);
    let gcm = SaCipher::new(Encr::AesGcm16_256, &[0; 36], None).expect("keys");
    assert_eq!((gcm.encr(), gcm.integ()), (Encr::AesGcm16_256, None));
    assert_eq!(
        format!("{gcm:?}"),
        "SaCipher { encr: AesGcm16_256, integ: None, .. }"
    );
}

/// Wrong IV, ICV and payload lengths (e.g. a truncated packet) are errors, never panics.
#[test]
fn bad_lengths_are_errors() {
    let gcm = SaCipher::new(Encr::AesGcm16_128, &[1; 20], None).expect("keys");
    let cbc = cbc(Encr::AesCbc128, &[1; 16]);
    for (cipher, iv_len, icv_len) in [(&gcm, 8, 16), (&cbc, 16, 16)] {
        let iv = vec![0u8; iv_len];
        let mut buf = [0u8; 32];
        let mut icv = vec![0u8; icv_len];
        for bad_iv in [0, iv_len - 1, iv_len + 1] {
            let err = Err(Error::Length {
                what: "iv",
                len: bad_iv,
            });
            assert_eq!(
                cipher.seal_in_place(&vec![0; bad_iv], b"", &mut buf, &mut icv),
                err
            );
            assert_eq!(
                cipher.open_in_place(&vec![0; bad_iv], b"", &mut buf, &icv),
                err
            );
        }
        for bad_icv in [0, icv_len - 4, icv_len + 1] {
            let err = Err(Error::Length {
                what: "icv",
                len: bad_icv,
            });
            assert_eq!(
                cipher.seal_in_place(&iv, b"", &mut buf, &mut vec![0; bad_icv]),
                err
            );
            assert_eq!(
                cipher.open_in_place(&iv, b"", &mut buf, &vec![0; bad_icv]),
                err
            );
        }
        // A well-formed but unauthenticated packet.
        assert_eq!(
            cipher.open_in_place(&iv, b"", &mut buf, &icv),
            Err(Error::Authentication)
        );
        assert_eq!(
            cipher.open_in_place(&iv, b"", &mut [], &icv),
            Err(Error::Authentication)
        );
    }
    // CBC needs whole blocks.
    let mut icv = [0u8; 16];
    for len in [1, 15, 17, 31] {
        let err = Err(Error::Length {
            what: "CBC payload",
            len,
        });
        assert_eq!(
            cbc.seal_in_place(&[0; 16], b"", &mut vec![0; len], &mut icv),
            err
        );
        assert_eq!(
            cbc.open_in_place(&[0; 16], b"", &mut vec![0; len], &icv),
            err
        );
    }
    // AEAD: any plaintext length is fine; a trailer is not.
    for len in [0, 1, 3, 17] {
        let mut buf = vec![5u8; len];
        gcm.seal_in_place(&[0; 8], b"a", &mut buf, &mut icv)
            .expect("seal");
        gcm.open_in_place(&[0; 8], b"a", &mut buf, &icv)
            .expect("open");
        assert_eq!(buf, vec![5u8; len]);
    }
    assert!(matches!(
        gcm.seal_in_place_with_trailer(&[0; 8], b"", &mut [], &[1], &mut icv),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        gcm.open_in_place_with_trailer(&[0; 8], b"", &mut [], &[1], &icv),
        Err(Error::Unsupported(_))
    ));
}

/// Keys of one direction do not open the other's packets.
#[test]
fn a_different_key_fails_authentication() {
    for encr in ALL_ENCR {
        let keyed = |encr_byte: u8, integ_key: &[u8; 32]| {
            let integ = (!encr.is_aead()).then_some((Integ::HmacSha256_128, integ_key.as_slice()));
            SaCipher::new(encr, &vec![encr_byte; encr.keymat_len()], integ).expect("keys")
        };
        let a = keyed(1, &[3; 32]);
        let iv = vec![0u8; encr.iv_len()];
        let mut buf = [0x42u8; 32];
        let mut icv = vec![0u8; a.icv_len()];
        a.seal_in_place(&iv, b"hdr", &mut buf, &mut icv)
            .expect("seal");
        let b = keyed(2, &[4; 32]);
        let mut copy = buf;
        assert_eq!(
            b.open_in_place(&iv, b"hdr", &mut copy, &icv),
            Err(Error::Authentication),
            "{encr:?}"
        );
        if !encr.is_aead() {
            // For CBC the integrity key alone decides authentication.
            let c = keyed(1, &[4; 32]);
            assert_eq!(
                c.open_in_place(&iv, b"hdr", &mut buf, &icv),
                Err(Error::Authentication),
                "{encr:?}"
            );
        }
    }
}

/// Data-plane workers share one `SaCipher` per SA across threads.
#[test]
fn ciphers_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SaCipher>();
}
