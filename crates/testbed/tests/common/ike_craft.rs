//! IKEv2 messages built by hand for tests that must send what no correct implementation
//! would (RFC 7296 §3 layouts): header and generic payload encoding, a minimal IKE_SA_INIT
//! request, the non-ESP marker of port 4500.

/// IKEv2 numbers used to build messages by hand (RFC 7296 §3, IANA registries).
pub const SA: u8 = 33;
pub const KE: u8 = 34;
pub const NONCE: u8 = 40;
pub const IKE_SA_INIT: u8 = 34;
pub const CREATE_CHILD_SA: u8 = 36;
pub const INFORMATIONAL: u8 = 37;
pub const FLAG_I: u8 = 0x08;
pub const FLAG_R: u8 = 0x20;
pub const INVALID_SYNTAX: u16 = 7;
pub const NO_PROPOSAL_CHOSEN: u16 = 14;
pub const INVALID_KE_PAYLOAD: u16 = 17;

/// An IKE message's header fields (offsets of RFC 7296 §3.1).
pub struct Hdr {
    pub exchange: u8,
    pub flags: u8,
    pub id: u32,
}

/// The header fields of `m`, if it is long enough for an IKE header.
pub fn hdr(m: &[u8]) -> Option<Hdr> {
    (m.len() >= 28).then(|| Hdr {
        exchange: m[18],
        flags: m[19],
        id: u32::from_be_bytes(m[20..24].try_into().expect("4 bytes")),
    })
}

/// A generic payload header (RFC 7296 §3.2) and body.
pub fn payload(next: u8, body: &[u8]) -> Vec<u8> {
    let mut p = vec![next, 0];
    p.extend_from_slice(&u16::try_from(4 + body.len()).expect("small").to_be_bytes());
    p.extend_from_slice(body);
    p
}

/// An IKE_SA_INIT request from `ispi` with one IKE proposal of `transforms` (type, id, key bits),
/// a KE payload of `group` with `ke_len` bytes and a 32-byte nonce (RFC 7296 §1.2, §3.3).
pub fn init_request(
    ispi: u64,
    transforms: &[(u8, u16, Option<u16>)],
    group: u16,
    ke_len: usize,
) -> Vec<u8> {
    let mut ts = Vec::new();
    for (i, (ty, id, bits)) in transforms.iter().enumerate() {
        let mut t = vec![
            if i + 1 == transforms.len() { 0 } else { 3 },
            0,
            0,
            0,
            *ty,
            0,
        ];
        t.extend_from_slice(&id.to_be_bytes());
        if let Some(b) = bits {
            t.extend_from_slice(&0x800eu16.to_be_bytes());
            t.extend_from_slice(&b.to_be_bytes());
        }
        let n = u16::try_from(t.len()).expect("small");
        t[2..4].copy_from_slice(&n.to_be_bytes());
        ts.extend(t);
    }
    let n_transforms = u8::try_from(transforms.len()).expect("few");
    let mut prop = vec![0, 0, 0, 0, 1, 1, 0, n_transforms];
    prop.extend(ts);
    let n = u16::try_from(prop.len()).expect("small");
    prop[2..4].copy_from_slice(&n.to_be_bytes());
    let mut ke = group.to_be_bytes().to_vec();
    ke.extend_from_slice(&[0, 0]);
    ke.extend((0..ke_len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(9)));
    let mut body = payload(KE, &prop);
    body.extend(payload(NONCE, &ke));
    body.extend(payload(0, &[0x4e; 32]));
    message(ispi, 0, SA, IKE_SA_INIT, FLAG_I, 0, &body)
}

/// Header plus payloads, with the Length field set.
pub fn message(
    ispi: u64,
    rspi: u64,
    next: u8,
    exchange: u8,
    flags: u8,
    id: u32,
    body: &[u8],
) -> Vec<u8> {
    let mut m = Vec::with_capacity(28 + body.len());
    m.extend_from_slice(&ispi.to_be_bytes());
    m.extend_from_slice(&rspi.to_be_bytes());
    m.extend_from_slice(&[next, 0x20, exchange, flags]);
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&u32::try_from(28 + body.len()).expect("small").to_be_bytes());
    m.extend_from_slice(body);
    m
}

/// The IKE message behind the non-ESP marker, for port 4500 (RFC 3948 §2.2).
pub fn marked(m: &[u8]) -> Vec<u8> {
    let mut d = vec![0; 4];
    d.extend_from_slice(m);
    d
}
