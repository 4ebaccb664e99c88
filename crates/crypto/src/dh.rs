//! Key exchange groups: MODP-2048 (RFC 3526 §3), ECP-256 and ECP-384 (RFC 5903, public value x|y
//! without point-format octet, shared secret = x), Curve25519 (RFC 8031). Private keys come from
//! the caller's [`Rng`] so that engines stay deterministic under simulation.
//!
//! Peer values are validated before use: exact length for every group (RFC 7296 §3.4 fixes the
//! KE data length per group), 1 < y < p-1 for MODP (NIST SP 800-56A §5.6.2.3.1), on-curve for
//! ECP (RFC 5903 §7 / RFC 6989 §2.3), and a non-zero result for Curve25519 (RFC 8031 §2.3).
//! MODP exponentiation is crypto-bigint's constant-time Montgomery ladder; ECP and X25519 run
//! in aws-lc.

use crate::{error::Error, transform::KeId, Rng};
use aws_lc_rs::agreement::{self, PrivateKey, UnparsedPublicKey};
use crypto_bigint::{
    modular::{MontyForm, MontyParams},
    Odd, U2048, U384,
};
use std::sync::OnceLock;
use zeroize::Zeroizing;

/// A supported key exchange group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DhGroup {
    /// Group 14: 2048-bit MODP.
    Modp2048,
    /// Group 19: 256-bit random ECP.
    Ecp256,
    /// Group 20: 384-bit random ECP.
    Ecp384,
    /// Group 31: Curve25519.
    Curve25519,
}

impl DhGroup {
    /// The group for an IANA transform ID, if supported.
    pub fn from_id(id: KeId) -> Option<Self> {
        match id {
            KeId::MODP2048 => Some(Self::Modp2048),
            KeId::ECP256 => Some(Self::Ecp256),
            KeId::ECP384 => Some(Self::Ecp384),
            KeId::CURVE25519 => Some(Self::Curve25519),
            _ => None,
        }
    }

    /// The IANA transform ID (KE payload "Diffie-Hellman Group Num").
    pub fn id(self) -> KeId {
        match self {
            Self::Modp2048 => KeId::MODP2048,
            Self::Ecp256 => KeId::ECP256,
            Self::Ecp384 => KeId::ECP384,
            Self::Curve25519 => KeId::CURVE25519,
        }
    }

    /// Length in bytes of a public value in the KE payload (256, 64, 96, 32).
    pub fn public_len(self) -> usize {
        match self {
            Self::Modp2048 => MODP_LEN,
            Self::Ecp256 => 64,
            Self::Ecp384 => 96,
            Self::Curve25519 => 32,
        }
    }

    /// Length in bytes of the shared secret g^ir (256, 32, 48, 32).
    pub fn shared_secret_len(self) -> usize {
        match self {
            Self::Modp2048 => MODP_LEN,
            Self::Ecp256 | Self::Curve25519 => 32,
            Self::Ecp384 => 48,
        }
    }

    /// A short human-readable name ("MODP-2048", "ECP-256", "ECP-384", "Curve25519").
    pub fn name(self) -> &'static str {
        match self {
            Self::Modp2048 => "MODP-2048",
            Self::Ecp256 => "ECP-256",
            Self::Ecp384 => "ECP-384",
            Self::Curve25519 => "Curve25519",
        }
    }

    fn bad_value(self, len: usize) -> Error {
        Error::PublicValue {
            group: self.name(),
            len,
        }
    }
}

/// One side's ephemeral key pair for a key exchange.
pub struct KeyExchange {
    group: DhGroup,
    public: Vec<u8>,
    secret: Secret,
}

/// The private half. aws-lc keys are cleansed by aws-lc when freed; the MODP exponent is a
/// zeroizing array.
enum Secret {
    Modp(Zeroizing<[u8; MODP_EXP_LEN]>),
    Agreement(PrivateKey),
}

impl core::fmt::Debug for KeyExchange {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("KeyExchange")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

/// How many out-of-range private values in a row prove the `Rng` broken. A working generator
/// is rejected with probability below 2^-32 per draw (P-256 has the largest gap below 2^256).
const MAX_DRAWS: usize = 64;

impl KeyExchange {
    /// Generates a key pair, drawing the private key from `rng`.
    ///
    /// # Panics
    /// If `rng` yields 64 unusable private values in a row (all-zero or not below the group
    /// order): a cryptographic RNG never does, so it is broken.
    pub fn generate(group: DhGroup, rng: &mut dyn Rng) -> Self {
        let (public, secret) = match group {
            DhGroup::Modp2048 => {
                let mut x = Zeroizing::new([0u8; MODP_EXP_LEN]);
                draw(rng, &mut x[..], |x| is_nonzero(x).then_some(()));
                let public = modp_pow(&modp_generator(), &x).to_be_bytes().to_vec();
                (public, Secret::Modp(x))
            }
            DhGroup::Ecp256 | DhGroup::Ecp384 => {
                let (alg, order) = ec_params(group);
                let mut d = Zeroizing::new([0u8; 48]);
                let d = &mut d[..order.len()];
                // RFC 5903 §3 / FIPS 186-5 A.4.2: a random integer in [1, n-1], by rejection.
                let key = draw(rng, d, |d| {
                    if is_nonzero(d) && ct_less_than(d, order) {
                        PrivateKey::from_private_key(alg, d).ok()
                    } else {
                        None
                    }
                });
                let point = key
                    .compute_public_key()
                    .expect("a valid ECP private key has a public point");
                // RFC 5903 §7: the KE data is x | y, without the SEC 1 point-format octet.
                let encoded = point.as_ref();
                debug_assert_eq!(encoded.first(), Some(&0x04));
                (encoded[1..].to_vec(), Secret::Agreement(key))
            }
            DhGroup::Curve25519 => {
                let mut k = Zeroizing::new([0u8; 32]);
                // Any 32 bytes are a Curve25519 private key (RFC 7748 §5 clamps them).
                let key = draw(rng, &mut k[..], |k| {
                    PrivateKey::from_private_key(&agreement::X25519, k).ok()
                });
                let point = key
                    .compute_public_key()
                    .expect("a valid X25519 private key has a public value");
                (point.as_ref().to_vec(), Secret::Agreement(key))
            }
        };
        debug_assert_eq!(public.len(), group.public_len());
        Self {
            group,
            public,
            secret,
        }
    }

    /// The group.
    pub fn group(&self) -> DhGroup {
        self.group
    }

    /// Our public value, encoded as the KE payload carries it.
    pub fn public_value(&self) -> Vec<u8> {
        self.public.clone()
    }

    /// Our public value, borrowed.
    pub fn public_bytes(&self) -> &[u8] {
        &self.public
    }

    /// The shared secret g^ir with the peer's public value (validated: length, range, on curve,
    /// not the identity / all-zero result).
    pub fn shared_secret(&self, peer_public: &[u8]) -> Result<Zeroizing<Vec<u8>>, Error> {
        let group = self.group;
        if peer_public.len() != group.public_len() {
            return Err(group.bad_value(peer_public.len()));
        }
        match &self.secret {
            Secret::Modp(x) => {
                modp_shared(x, peer_public).ok_or(group.bad_value(peer_public.len()))
            }
            Secret::Agreement(key) => {
                let mut buf = [0u8; 1 + 96];
                let peer = match group {
                    DhGroup::Ecp256 | DhGroup::Ecp384 => {
                        // Restore the uncompressed-point octet: aws-lc then checks that the point
                        // is on the curve (RFC 6989 §2.3 "MUST check").
                        buf[0] = 0x04;
                        buf[1..=peer_public.len()].copy_from_slice(peer_public);
                        &buf[..=peer_public.len()]
                    }
                    DhGroup::Curve25519 | DhGroup::Modp2048 => peer_public,
                };
                let bad = group.bad_value(peer_public.len());
                let secret = agreement::agree(
                    key,
                    UnparsedPublicKey::new(key.algorithm(), peer),
                    bad.clone(),
                    |s| Ok(Zeroizing::new(s.to_vec())),
                )?;
                // RFC 8031 §2.3: an all-zero X25519 result MUST be rejected (the peer sent a
                // small-order point). ECP results are x coordinates of a non-identity point.
                if !is_nonzero(&secret) {
                    return Err(bad);
                }
                Ok(secret)
            }
        }
    }
}

/// Draws candidates from `rng` into `buf` until `accept` returns a value.
fn draw<T>(rng: &mut dyn Rng, buf: &mut [u8], mut accept: impl FnMut(&[u8]) -> Option<T>) -> T {
    for _ in 0..MAX_DRAWS {
        rng.fill(buf);
        if let Some(v) = accept(buf) {
            return v;
        }
    }
    panic!("the Rng produced {MAX_DRAWS} unusable private values in a row; it is broken");
}

/// True if any byte is non-zero, in time independent of the contents.
fn is_nonzero(bytes: &[u8]) -> bool {
    bytes.iter().fold(0u8, |acc, b| acc | b) != 0
}

/// `a < b` for equal-length big-endian integers, in time independent of the contents.
fn ct_less_than(a: &[u8], b: &[u8]) -> bool {
    debug_assert_eq!(a.len(), b.len());
    // The final borrow of a - b is 1 exactly when a < b.
    let borrow = a.iter().zip(b).rev().fold(0u16, |borrow, (&x, &y)| {
        (u16::from(x).wrapping_sub(u16::from(y)).wrapping_sub(borrow) >> 8) & 1
    });
    borrow == 1
}

/// The aws-lc algorithm and group order n (big-endian) of an ECP group.
fn ec_params(group: DhGroup) -> (&'static agreement::Algorithm, &'static [u8]) {
    match group {
        DhGroup::Ecp384 => (&agreement::ECDH_P384, &P384_ORDER),
        _ => (&agreement::ECDH_P256, &P256_ORDER),
    }
}

/// Order of the P-256 base point (FIPS 186-5 / SEC 2 secp256r1 n).
const P256_ORDER: [u8; 32] = [
    0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2, 0xfc, 0x63, 0x25, 0x51,
];

/// Order of the P-384 base point (FIPS 186-5 / SEC 2 secp384r1 n).
const P384_ORDER: [u8; 48] = [
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xc7, 0x63, 0x4d, 0x81, 0xf4, 0x37, 0x2d, 0xdf,
    0x58, 0x1a, 0x0d, 0xb2, 0x48, 0xb0, 0xa7, 0x7a, 0xec, 0xec, 0x19, 0x6a, 0xcc, 0xc5, 0x29, 0x73,
];

/// Bytes of a MODP-2048 public value or shared secret (RFC 7296 §3.4, §2.14: left-padded).
const MODP_LEN: usize = 256;

/// Bytes of the private exponent: 384 bits, over twice the group's ~110-bit strength
/// (RFC 3526 §8), the length strongSwan uses for this group.
const MODP_EXP_LEN: usize = 48;

/// RFC 3526 §3, the 2048-bit MODP group's prime p = 2^2048 - 2^1984 - 1 + 2^64 * ([2^1918 pi] + 124476).
const MODP2048_P: Odd<U2048> = Odd::<U2048>::from_be_hex(concat!(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74",
    "020BBEA63B139B22514A08798E3404DDEF9519B3CD3A431B302B0A6DF25F1437",
    "4FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED",
    "EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF05",
    "98DA48361C55D39A69163FA8FD24CF5F83655D23DCA3AD961C62F356208552BB",
    "9ED529077096966D670C354E4ABC9804F1746C08CA18217C32905E462E36CE3B",
    "E39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF695581718",
    "3995497CEA956AE515D2261898FA051015728E5A8AACAA68FFFFFFFFFFFFFFFF",
));

fn modp_params() -> MontyParams<{ U2048::LIMBS }> {
    static PARAMS: OnceLock<MontyParams<{ U2048::LIMBS }>> = OnceLock::new();
    *PARAMS.get_or_init(|| MontyParams::new(MODP2048_P))
}

/// The generator, 2 (RFC 3526 §3).
fn modp_generator() -> U2048 {
    U2048::from_u8(2)
}

/// base^x mod p, constant time in x.
fn modp_pow(base: &U2048, x: &[u8; MODP_EXP_LEN]) -> Zeroizing<U2048> {
    let exponent = Zeroizing::new(U384::from_be_slice(x));
    Zeroizing::new(
        MontyForm::new(base, modp_params())
            .pow(&*exponent)
            .retrieve(),
    )
}

/// g^xy mod p for a peer value y of exactly 256 bytes; None if y is out of range.
fn modp_shared(x: &[u8; MODP_EXP_LEN], peer: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
    let y = U2048::from_be_slice(peer);
    // NIST SP 800-56A §5.6.2.3.1 (RFC 7296 §5 asks for this check): 1 < y < p - 1. This also
    // rejects p and anything above it, which no canonical encoding produces.
    let p_minus_1 = MODP2048_P.as_ref().wrapping_sub(&U2048::ONE);
    if y <= U2048::ONE || y >= p_minus_1 {
        return None;
    }
    let shared = modp_pow(&y, x);
    // With 1 < y < p-1 and p a safe prime y^x = 1 needs x to be a multiple of q; refuse anyway.
    if *shared == U2048::ONE {
        return None;
    }
    Some(Zeroizing::new(shared.to_be_bytes().to_vec()))
}

#[cfg(test)]
#[path = "dh_tests.rs"]
mod tests;
