//! Codec tests: round trips of every payload, the RFC 7634 Appendix B message (as produced by
//! strongSwan's own unit test), and fuzz-style checks that no input makes the parser panic.

use super::*;
use crate::IkeSpi;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("test hex"))
        .collect()
}

/// RFC 7634 Appendix B: an INFORMATIONAL request with an encrypted SET_WINDOW_SIZE notify.
const RFC7634_B: &str = "c0c1c2c3c4c5c6c7 d0d1d2d3d4d5d6d7 2e202500 00000009 00000045
    29000029 1011121314151617 610394701f8d017f7c129248896b71bfe25236efd7cdc67066906315b2";

#[test]
fn rfc7634_appendix_b_structure() {
    let data = hex(RFC7634_B);
    let m = Message::parse(&data).expect("valid message");
    assert_eq!(m.header.ispi, IkeSpi(0xc0c1c2c3c4c5c6c7));
    assert_eq!(m.header.rspi, IkeSpi(0xd0d1d2d3d4d5d6d7));
    assert_eq!(m.header.exchange, ExchangeType::INFORMATIONAL);
    assert_eq!(m.header.message_id, 9);
    assert!(!m.header.flags.response() && !m.header.flags.initiator());
    assert!(m.payloads.is_empty());
    let e = m.encrypted.expect("SK payload");
    assert_eq!(e.next_inner, PayloadType::NOTIFY);
    assert_eq!(e.header_offset, 28);
    assert_eq!(e.body, 32..data.len());
}

#[test]
fn rfc7634_appendix_b_layout_matches_emit() {
    // The plaintext of the RFC's message: N(SET_WINDOW_SIZE, 10), no padding (AEAD, block 1).
    let inner_payloads = vec![Payload::Notify(NotifyPayload::new(
        NotifyType::SET_WINDOW_SIZE,
        10u32.to_be_bytes().to_vec(),
    ))];
    let mut inner = Vec::new();
    let first = emit_chain(&inner_payloads, PayloadType::NONE, &mut inner).expect("emit");
    assert_eq!(first, PayloadType::NOTIFY);
    assert_eq!(inner, hex("0000000c 00004001 0000000a"));
    let header = Header::new(
        IkeSpi(0xc0c1c2c3c4c5c6c7),
        IkeSpi(0xd0d1d2d3d4d5d6d7),
        ExchangeType::INFORMATIONAL,
        Flags(0),
        9,
    );
    let mut out = Vec::new();
    let layout = emit_encrypted(&header, first, &inner, 8, 1, 16, &mut out).expect("emit");
    let expected = hex(RFC7634_B);
    assert_eq!(out.len(), expected.len());
    assert_eq!(&out[..32], &expected[..32], "header and SK generic header");
    assert_eq!(layout.aad_len, 32);
    assert_eq!(layout.iv, 32..40);
    assert_eq!(layout.plaintext, 40..53);
    assert_eq!(layout.icv, 53..69);
    assert_eq!(
        strip_padding(&out[layout.plaintext.clone()]).expect("padding"),
        &inner[..]
    );
}

fn sample_payloads() -> Vec<Payload> {
    vec![
        Payload::Sa(SaPayload {
            proposals: vec![
                Proposal {
                    number: 1,
                    protocol: ProtocolId::IKE,
                    spi: vec![],
                    transforms: vec![
                        Transform::with_key_length(TransformType::ENCR, 20, Some(256)),
                        Transform::new(TransformType::PRF, 5),
                        Transform::new(TransformType::KE, 31),
                    ],
                },
                Proposal {
                    number: 2,
                    protocol: ProtocolId::ESP,
                    spi: vec![1, 2, 3, 4],
                    transforms: vec![
                        Transform::with_key_length(TransformType::ENCR, 12, Some(128)),
                        Transform::new(TransformType::INTEG, 12),
                        Transform::new(TransformType::ESN, 0),
                        Transform {
                            ty: TransformType(9),
                            id: 7,
                            attributes: vec![Attribute {
                                ty: 99,
                                value: AttributeValue::Tlv(vec![1, 2, 3]),
                            }],
                        },
                    ],
                },
            ],
        }),
        Payload::Ke(KePayload {
            group: 19,
            data: vec![7; 64],
        }),
        Payload::Nonce(NoncePayload { data: vec![9; 32] }),
        Payload::IdI(IdPayload {
            id_type: IdType::FQDN,
            data: b"hq.example".to_vec(),
        }),
        Payload::IdR(IdPayload {
            id_type: IdType::IPV4_ADDR,
            data: vec![10, 0, 0, 1],
        }),
        Payload::Auth(AuthPayload {
            method: AuthMethod::SHARED_KEY_MIC,
            data: vec![5; 32],
        }),
        Payload::Notify(NotifyPayload {
            protocol: ProtocolId::ESP,
            spi: vec![0xc1, 0, 0, 1],
            ty: NotifyType::REKEY_SA,
            data: vec![],
        }),
        Payload::Notify(NotifyPayload::new(
            NotifyType::NAT_DETECTION_SOURCE_IP,
            vec![0xab; 20],
        )),
        Payload::Delete(DeletePayload {
            protocol: ProtocolId::ESP,
            spis: vec![0xc0000001, 0xc0000002],
        }),
        Payload::Delete(DeletePayload {
            protocol: ProtocolId::IKE,
            spis: vec![],
        }),
        Payload::VendorId(VendorIdPayload {
            data: b"strongSwan".to_vec(),
        }),
        Payload::TsI(TsPayload {
            selectors: vec![
                TrafficSelector {
                    ip_proto: 0,
                    start_port: 0,
                    end_port: 65535,
                    start: IpAddr::V4(Ipv4Addr::new(10, 1, 0, 0)),
                    end: IpAddr::V4(Ipv4Addr::new(10, 1, 0, 255)),
                },
                TrafficSelector {
                    ip_proto: 6,
                    start_port: 443,
                    end_port: 443,
                    start: IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0)),
                    end: IpAddr::V6(Ipv6Addr::new(
                        0xfd00, 0, 0, 0, 0xffff, 0xffff, 0xffff, 0xffff,
                    )),
                },
            ],
        }),
        Payload::TsR(TsPayload { selectors: vec![] }),
        Payload::Unknown(UnknownPayload {
            ty: PayloadType::CERTREQ,
            critical: false,
            body: vec![4, 1, 2],
        }),
    ]
}

fn sample_message() -> Message {
    Message {
        header: Header::new(
            IkeSpi(0x1122334455667788),
            IkeSpi(0),
            ExchangeType::IKE_SA_INIT,
            Flags::new(true, false),
            0,
        ),
        payloads: sample_payloads(),
        encrypted: None,
    }
}

#[test]
fn message_round_trip() {
    let m = sample_message();
    let mut out = Vec::new();
    m.emit(&mut out).expect("emit");
    assert_eq!(out.len(), m.buffer_len());
    let p = Message::parse(&out).expect("parse");
    assert_eq!(p.payloads, m.payloads);
    assert_eq!(p.header.length as usize, out.len());
    assert_eq!(p.header.next_payload, PayloadType::SA);
    assert!(p.notify(NotifyType::NAT_DETECTION_SOURCE_IP).is_some());
    assert!(p.notify(NotifyType::COOKIE).is_none());
}

#[test]
fn payload_lengths_match_buffer_len() {
    for p in sample_payloads() {
        let mut out = Vec::new();
        p.emit(PayloadType::NONE, &mut out).expect("emit");
        assert_eq!(out.len(), p.buffer_len(), "{:?}", p.ty());
        assert_eq!(usize::from(u16::from_be_bytes([out[2], out[3]])), out.len());
    }
}

#[test]
fn known_transform_encoding() {
    // ENCR_AES_CBC with a 128-bit key: last, length 12, type 1, id 12, attribute 0x800e 0x0080.
    let t = Transform::with_key_length(TransformType::ENCR, 12, Some(128));
    let sa = SaPayload {
        proposals: vec![Proposal {
            number: 1,
            protocol: ProtocolId::IKE,
            spi: vec![],
            transforms: vec![t],
        }],
    };
    let mut out = Vec::new();
    sa.emit(&mut out).expect("emit");
    assert_eq!(out, hex("00000014 01010001 0000000c 0100000c 800e0080"));
    assert_eq!(SaPayload::parse(&out).expect("parse"), sa);
}

#[test]
fn unknown_critical_payload_rejected_and_non_critical_skipped() {
    let mut m = sample_message();
    m.payloads.push(Payload::Unknown(UnknownPayload {
        ty: PayloadType(200),
        critical: false,
        body: vec![1],
    }));
    let mut out = Vec::new();
    m.emit(&mut out).expect("emit");
    assert!(Message::parse(&out).is_ok());

    let mut m = sample_message();
    m.payloads.push(Payload::Unknown(UnknownPayload {
        ty: PayloadType(200),
        critical: true,
        body: vec![1],
    }));
    let mut out = Vec::new();
    m.emit(&mut out).expect("emit");
    assert_eq!(
        Message::parse(&out),
        Err(IkeWireError::UnsupportedCriticalPayload {
            payload: PayloadType(200)
        })
    );

    // The critical bit of a type RFC 7296 defines is ignored.
    let mut m = sample_message();
    m.payloads.push(Payload::Unknown(UnknownPayload {
        ty: PayloadType::CP,
        critical: true,
        body: vec![1, 0, 0, 0],
    }));
    let mut out = Vec::new();
    m.emit(&mut out).expect("emit");
    assert!(Message::parse(&out).is_ok());
}

#[test]
fn malformed_inputs_rejected() {
    let mut out = Vec::new();
    sample_message().emit(&mut out).expect("emit");
    // Length field disagreeing with the datagram.
    let mut bad = out.clone();
    bad.push(0);
    assert!(matches!(
        Message::parse(&bad),
        Err(IkeWireError::BadLength { .. })
    ));
    // Version 3.
    let mut bad = out.clone();
    bad[17] = 0x30;
    assert_eq!(
        Message::parse(&bad),
        Err(IkeWireError::UnsupportedVersion { major: 3 })
    );
    // Truncated header.
    assert!(Message::parse(&out[..20]).is_err());
    // Nonce too short.
    assert!(NoncePayload::parse(&[0; 15]).is_err());
    assert!(NoncePayload::parse(&[0; 257]).is_err());
    // TS with a wrong selector length.
    assert!(TsPayload::parse(&hex("01000000 0700000f 0000ffff 0a000000 0a0000ff")).is_err());
    // Delete with an SPI size of 3.
    assert!(DeletePayload::parse(&hex("03030001 010203")).is_err());
    // Padding longer than the plaintext.
    assert!(strip_padding(&[1, 2, 9]).is_err());
    assert!(strip_padding(&[]).is_err());
}

#[test]
fn encrypted_must_be_last() {
    // header + SK(next=NONE, 8 bytes body) + trailing Vendor ID payload
    let mut out = Vec::new();
    let h = Header::new(
        IkeSpi(1),
        IkeSpi(2),
        ExchangeType::INFORMATIONAL,
        Flags(0),
        1,
    );
    let inner = [];
    emit_encrypted(&h, PayloadType::NONE, &inner, 8, 1, 0, &mut out).expect("emit");
    assert!(Message::parse(&out).is_ok());
    out.extend_from_slice(&[0, 0, 0, 5, 1]);
    let len = out.len() as u32;
    out[24..28].copy_from_slice(&len.to_be_bytes());
    assert!(Message::parse(&out).is_err());
    // An SK payload nested in the decrypted chain is refused.
    let nested = hex("00000004");
    assert_eq!(
        parse_chain(PayloadType::SK, &nested, 0, false),
        Err(IkeWireError::NestedEncrypted)
    );
}

#[test]
fn registries_print_unknown_in_hex() {
    assert_eq!(format!("{}", NotifyType::COOKIE), "COOKIE");
    assert_eq!(format!("{}", NotifyType(0x4242)), "NotifyType(0x4242)");
    assert_eq!(format!("{:?}", ExchangeType(99)), "ExchangeType(0x63)");
    assert!(NotifyType::TS_UNACCEPTABLE.is_error());
    assert!(!NotifyType::INITIAL_CONTACT.is_error());
}

/// A small deterministic generator so that the fuzz-style tests need no dependency.
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

fn parse_everything(data: &[u8]) {
    let _ = Header::parse(data);
    if let Ok(m) = Message::parse(data) {
        // A parsed message re-emits to something that parses to the same payloads.
        if m.encrypted.is_none() {
            let mut out = Vec::new();
            if m.emit(&mut out).is_ok() {
                let again = Message::parse(&out).expect("re-emitted message parses");
                assert_eq!(again.payloads, m.payloads);
            }
        }
    }
    for ty in 0..=60u8 {
        let _ = Payload::parse_body(
            PayloadType(ty),
            data.first().is_some_and(|b| b & 1 == 1),
            data,
        );
        let _ = parse_chain(PayloadType(ty), data, 0, true);
    }
    let _ = strip_padding(data);
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = XorShift(0x9e3779b97f4a7c15);
    for _ in 0..20_000 {
        let len = rng.below(200);
        let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        parse_everything(&data);
    }
}

#[test]
fn mutated_valid_messages_never_panic() {
    let mut rng = XorShift(0x1234_5678_9abc_def1);
    let mut base = Vec::new();
    sample_message().emit(&mut base).expect("emit");
    let bases = [base, hex(RFC7634_B)];
    for i in 0..50_000 {
        let mut data = bases[i % bases.len()].clone();
        for _ in 0..1 + rng.below(4) {
            match rng.below(4) {
                0 => {
                    let at = rng.below(data.len());
                    data[at] = rng.next() as u8;
                }
                1 => {
                    let at = rng.below(data.len());
                    data[at] ^= 1 << rng.below(8);
                }
                2 => {
                    let n = rng.below(data.len());
                    data.truncate(n);
                }
                _ => {
                    let at = rng.below(data.len() + 1);
                    data.insert(at, rng.next() as u8);
                }
            }
            if data.is_empty() {
                break;
            }
        }
        // Keep the header length consistent half of the time so that payload parsing is reached.
        if data.len() >= 28 && rng.below(2) == 0 {
            let len = data.len() as u32;
            data[24..28].copy_from_slice(&len.to_be_bytes());
        }
        parse_everything(&data);
    }
}
