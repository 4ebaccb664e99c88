//! Tests of the PEM files: round trips, RFC 7468's published example, and what is refused.

use super::*;

#[test]
fn pem_round_trips() {
    for len in [1usize, 2, 3, 4, 47, 48, 49, 100, 121] {
        let data: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
        let text = pem_encode("TEST", &data);
        assert!(text.lines().all(|l| l.len() <= 64));
        let blocks = pem_decode(&format!("leading text\n{}trailing\n", *text)).unwrap();
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0].label, "TEST");
        assert_eq!(blocks[0].der.as_slice(), data.as_slice(), "length {len}");
    }
    assert!(pem_decode("-----BEGIN A-----\nAAAA\n-----END B-----\n").is_err());
    assert!(pem_decode("-----BEGIN A-----\nAA==AA==\n-----END A-----\n").is_err());
    assert!(pem_decode("-----BEGIN A-----\n-----END A-----\n").is_err());
    // CRLF line ends are fine.
    let blocks = pem_decode("-----BEGIN A-----\r\nAAEC\r\n-----END A-----\r\n").unwrap();
    assert_eq!(blocks[0].der.as_slice(), [0, 1, 2]);
}

/// RFC 7468 §10, Figure 12: the published PKCS #8 `PRIVATE KEY` example decodes to its DER
/// (a secp256k1 key) and encodes back to the same text, byte for byte.
#[test]
fn pem_rfc7468_private_key_example() {
    const FIGURE_12: &str = "-----BEGIN PRIVATE KEY-----\n\
        MIGEAgEAMBAGByqGSM49AgEGBSuBBAAKBG0wawIBAQQgVcB/UNPxalR9zDYAjQIf\n\
        jojUDiQuGnSJrFEEzZPT/92hRANCAASc7UJtgnF/abqWM60T3XNJEzBv5ez9TdwK\n\
        H0M6xpM2q+53wmsN/eYLdgtjgBd3DBmHtPilCkiFICXyaA8z9LkJ\n\
        -----END PRIVATE KEY-----\n";
    let blocks = pem_decode(FIGURE_12).unwrap();
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].label, "PRIVATE KEY");
    let der = &blocks[0].der;
    assert_eq!(der.len(), 135);
    // SEQUENCE (132 bytes) { version 0, AlgorithmIdentifier { id-ecPublicKey, secp256k1 }, ... }
    assert_eq!(
        der[..24],
        [
            0x30, 0x81, 0x84, 0x02, 0x01, 0x00, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce,
            0x3d, 0x02, 0x01, 0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x0a
        ]
    );
    assert_eq!(der[127..], [0x25, 0xf2, 0x68, 0x0f, 0x33, 0xf4, 0xb9, 0x09]);
    assert_eq!(pem_encode("PRIVATE KEY", der).as_str(), FIGURE_12);
}

/// Base64 whose last character carries bits past the data (RFC 4648 §3.5) is refused: the
/// constant-time decoder accepts canonical encodings only.
#[test]
fn pem_non_canonical_base64_is_refused() {
    let Err(err) = pem_decode("-----BEGIN A-----\nAB==\n-----END A-----\n") else {
        panic!("non-canonical base64 accepted");
    };
    assert_eq!(
        err,
        "line 3: A block: non-canonical base64 (bits set after the data)"
    );
    assert_eq!(
        pem_decode("-----BEGIN A-----\nAA==\n-----END A-----\n").unwrap()[0]
            .der
            .as_slice(),
        [0]
    );
}
