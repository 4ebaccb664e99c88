//! Key material of IKE SAs and CHILD_SAs: SKEYSEED and the SK_* keys (RFC 7296 §2.14, §2.18),
//! CHILD_SA KEYMAT (§2.17), the PSK AUTH value (§2.15), NAT detection hashes (§2.23) and
//! stateless cookies (§2.6).

use crate::proposal::{EspAlgs, IkeAlgs};
use crypto::{Prf, SaCipher};
use std::net::SocketAddr;
use zeroize::Zeroizing;

/// The seven IKE SA keys, with the two directions' ciphers keyed once.
pub(crate) struct IkeKeys {
    /// The negotiated transforms.
    pub(crate) algs: IkeAlgs,
    /// SK_d | SK_ai | SK_ar | SK_ei | SK_er | SK_pi | SK_pr, as prf+ produced them.
    keymat: Zeroizing<Vec<u8>>,
    /// Protects messages sent by the original initiator (SK_ei / SK_ai).
    cipher_i: SaCipher,
    /// Protects messages sent by the original responder (SK_er / SK_ar).
    cipher_r: SaCipher,
}

impl core::fmt::Debug for IkeKeys {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("IkeKeys")
            .field("algs", &self.algs)
            .finish_non_exhaustive()
    }
}

impl IkeKeys {
    fn lens(algs: &IkeAlgs) -> (usize, usize, usize) {
        (
            algs.prf.output_len(),
            algs.integ.map_or(0, |i| i.key_len()),
            algs.encr.keymat_len(),
        )
    }

    /// Total keymat length for `algs`.
    pub(crate) fn keymat_len(algs: &IkeAlgs) -> usize {
        let (p, a, e) = Self::lens(algs);
        3 * p + 2 * a + 2 * e
    }

    /// {SK_d | SK_ai | SK_ar | SK_ei | SK_er | SK_pi | SK_pr} = prf+(SKEYSEED, Ni | Nr | SPIi | SPIr)
    /// (RFC 7296 §2.14).
    pub(crate) fn derive(
        algs: IkeAlgs,
        skeyseed: &[u8],
        ni: &[u8],
        nr: &[u8],
        spi_i: u64,
        spi_r: u64,
    ) -> Result<Self, crypto::Error> {
        let len = Self::keymat_len(&algs);
        let keymat = algs.prf.prf_plus_parts(
            skeyseed,
            &[ni, nr, &spi_i.to_be_bytes(), &spi_r.to_be_bytes()],
            len,
        );
        Self::from_keymat(algs, keymat)
    }

    /// Rebuilds the ciphers from stored keymat.
    pub(crate) fn from_keymat(
        algs: IkeAlgs,
        keymat: Zeroizing<Vec<u8>>,
    ) -> Result<Self, crypto::Error> {
        let (p, a, e) = Self::lens(&algs);
        if keymat.len() != 3 * p + 2 * a + 2 * e {
            return Err(crypto::Error::Length {
                what: "IKE keymat",
                len: keymat.len(),
            });
        }
        let sk_ai = &keymat[p..p + a];
        let sk_ar = &keymat[p + a..p + 2 * a];
        let sk_ei = &keymat[p + 2 * a..p + 2 * a + e];
        let sk_er = &keymat[p + 2 * a + e..p + 2 * a + 2 * e];
        let cipher_i = SaCipher::new(algs.encr, sk_ei, algs.integ.map(|i| (i, sk_ai)))?;
        let cipher_r = SaCipher::new(algs.encr, sk_er, algs.integ.map(|i| (i, sk_ar)))?;
        Ok(Self {
            algs,
            keymat,
            cipher_i,
            cipher_r,
        })
    }

    /// The raw keymat (for snapshots and the key log).
    pub(crate) fn keymat(&self) -> &[u8] {
        &self.keymat
    }

    fn part(&self, index: usize) -> &[u8] {
        let (p, a, e) = Self::lens(&self.algs);
        let bounds = [
            0,
            p,
            p + a,
            p + 2 * a,
            p + 2 * a + e,
            p + 2 * a + 2 * e,
            2 * p + 2 * a + 2 * e,
            3 * p + 2 * a + 2 * e,
        ];
        &self.keymat[bounds[index]..bounds[index + 1]]
    }

    /// SK_d.
    pub(crate) fn sk_d(&self) -> &[u8] {
        self.part(0)
    }
    /// SK_ai, SK_ar, SK_ei, SK_er (for the key log).
    pub(crate) fn sk_a_e(&self) -> [&[u8]; 4] {
        [self.part(1), self.part(2), self.part(3), self.part(4)]
    }
    /// SK_pi.
    pub(crate) fn sk_pi(&self) -> &[u8] {
        self.part(5)
    }
    /// SK_pr.
    pub(crate) fn sk_pr(&self) -> &[u8] {
        self.part(6)
    }

    /// The cipher protecting what we send; `initiator` is our original-initiator role.
    pub(crate) fn outbound(&self, initiator: bool) -> &SaCipher {
        if initiator {
            &self.cipher_i
        } else {
            &self.cipher_r
        }
    }

    /// The cipher protecting what we receive.
    pub(crate) fn inbound(&self, initiator: bool) -> &SaCipher {
        self.outbound(!initiator)
    }
}

/// Keys of a CHILD_SA pair, split per RFC 7296 §2.17: initiator-to-responder keys first, each
/// with the encryption key (plus salt) before the integrity key.
pub(crate) struct ChildKeyMat {
    /// Encryption key (+salt) for traffic from the exchange initiator.
    pub(crate) encr_i: Zeroizing<Vec<u8>>,
    /// Integrity key for traffic from the exchange initiator.
    pub(crate) integ_i: Zeroizing<Vec<u8>>,
    /// Encryption key (+salt) for traffic from the exchange responder.
    pub(crate) encr_r: Zeroizing<Vec<u8>>,
    /// Integrity key for traffic from the exchange responder.
    pub(crate) integ_r: Zeroizing<Vec<u8>>,
}

impl ChildKeyMat {
    /// KEYMAT = prf+(SK_d, [g^ir (new) |] Ni | Nr) (RFC 7296 §2.17).
    pub(crate) fn derive(
        prf: Prf,
        sk_d: &[u8],
        algs: &EspAlgs,
        g_ir: Option<&[u8]>,
        ni: &[u8],
        nr: &[u8],
    ) -> Self {
        let e = algs.encr.keymat_len();
        let a = algs.integ.map_or(0, |i| i.key_len());
        let km = prf.child_keymat(sk_d, g_ir, ni, nr, 2 * (e + a));
        Self {
            encr_i: Zeroizing::new(km[..e].to_vec()),
            integ_i: Zeroizing::new(km[e..e + a].to_vec()),
            encr_r: Zeroizing::new(km[e + a..2 * e + a].to_vec()),
            integ_r: Zeroizing::new(km[2 * e + a..].to_vec()),
        }
    }

    /// The keys as the event API presents them; `initiator` is our role in the exchange that
    /// created the CHILD_SA.
    pub(crate) fn for_event(&self, initiator: bool) -> crate::ChildKeys {
        let (inb, out) = if initiator {
            ((&self.encr_r, &self.integ_r), (&self.encr_i, &self.integ_i))
        } else {
            ((&self.encr_i, &self.integ_i), (&self.encr_r, &self.integ_r))
        };
        crate::ChildKeys {
            inbound_encr: inb.0.clone(),
            inbound_integ: inb.1.clone(),
            outbound_encr: out.0.clone(),
            outbound_integ: out.1.clone(),
        }
    }

    /// Serialises for snapshots (four length-prefixed parts).
    pub(crate) fn parts(&self) -> [&[u8]; 4] {
        [&self.encr_i, &self.integ_i, &self.encr_r, &self.integ_r]
    }
}

/// The RFC 7296 §2.15 pad string for shared-key authentication.
const KEY_PAD: &[u8] = b"Key Pad for IKEv2";

/// AUTH = prf(prf(Shared Secret, "Key Pad for IKEv2"), <SignedOctets>), where SignedOctets =
/// RealMessage | Nonce | prf(SK_p, ID') (RFC 7296 §2.15). `real_message` is the sender's
/// IKE_SA_INIT message, `nonce` the other side's nonce, `id_body` the sender's ID payload body.
pub(crate) fn psk_auth(
    prf: Prf,
    psk: &[u8],
    sk_p: &[u8],
    real_message: &[u8],
    nonce: &[u8],
    id_body: &[u8],
) -> Zeroizing<Vec<u8>> {
    let maced_id = prf.prf(sk_p, id_body);
    let key = prf.prf(psk, KEY_PAD);
    prf.prf_parts(&key, &[real_message, nonce, &maced_id])
}

/// Constant-time equality of two byte strings (AUTH values, cookies).
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    aws_lc_rs::constant_time::verify_slices_are_equal(a, b).is_ok()
}

/// NAT detection hash: SHA-1(SPIi | SPIr | IP | Port) (RFC 7296 §2.23).
pub(crate) fn nat_hash(spi_i: u64, spi_r: u64, addr: SocketAddr) -> Vec<u8> {
    use aws_lc_rs::digest;
    let mut ctx = digest::Context::new(&digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(&spi_i.to_be_bytes());
    ctx.update(&spi_r.to_be_bytes());
    match addr.ip() {
        std::net::IpAddr::V4(a) => ctx.update(&a.octets()),
        std::net::IpAddr::V6(a) => ctx.update(&a.octets()),
    }
    ctx.update(&addr.port().to_be_bytes());
    ctx.finish().as_ref().to_vec()
}

/// Secrets for stateless cookies (RFC 7296 §2.6): `Cookie = <VersionIDofSecret> |
/// Hash(Ni | IPi | SPIi | <secret>)`, here HMAC-SHA-256 keyed with the secret. The secret is
/// drawn from the endpoint's RNG and replaced every [`CookieSecrets::ROTATE`]; cookies made
/// with the previous secret stay valid for one more period.
pub(crate) struct CookieSecrets {
    current: (u8, Zeroizing<[u8; 32]>),
    previous: Option<(u8, Zeroizing<[u8; 32]>)>,
    rotated_at: Option<std::time::Instant>,
}

impl CookieSecrets {
    /// How often the secret changes.
    pub(crate) const ROTATE: std::time::Duration = std::time::Duration::from_secs(120);

    pub(crate) fn new() -> Self {
        Self {
            current: (0, Zeroizing::new([0; 32])),
            previous: None,
            rotated_at: None,
        }
    }

    /// Replaces the secret if it is older than [`ROTATE`](Self::ROTATE) (or was never drawn).
    pub(crate) fn maybe_rotate(&mut self, now: std::time::Instant, rng: &mut dyn crypto::Rng) {
        if self
            .rotated_at
            .is_some_and(|t| now.saturating_duration_since(t) < Self::ROTATE)
        {
            return;
        }
        let mut secret = Zeroizing::new([0u8; 32]);
        rng.fill(&mut secret[..]);
        let version = if self.rotated_at.is_some() {
            self.current.0.wrapping_add(1)
        } else {
            0
        };
        let old = core::mem::replace(&mut self.current, (version, secret));
        self.previous = self.rotated_at.map(|_| old);
        self.rotated_at = Some(now);
    }

    fn compute(secret: &[u8], version: u8, ni: &[u8], ip: std::net::IpAddr, spi_i: u64) -> Vec<u8> {
        let ip_bytes = match ip {
            std::net::IpAddr::V4(a) => a.octets().to_vec(),
            std::net::IpAddr::V6(a) => a.octets().to_vec(),
        };
        let mac = Prf::HmacSha256.prf_parts(secret, &[ni, &ip_bytes, &spi_i.to_be_bytes()]);
        let mut c = Vec::with_capacity(1 + mac.len());
        c.push(version);
        c.extend_from_slice(&mac);
        c
    }

    /// A cookie for this initiator.
    pub(crate) fn make(&self, ni: &[u8], ip: std::net::IpAddr, spi_i: u64) -> Vec<u8> {
        Self::compute(&self.current.1[..], self.current.0, ni, ip, spi_i)
    }

    /// True if `cookie` was made by [`make`](Self::make) with the current or previous secret.
    pub(crate) fn verify(
        &self,
        cookie: &[u8],
        ni: &[u8],
        ip: std::net::IpAddr,
        spi_i: u64,
    ) -> bool {
        let Some(&version) = cookie.first() else {
            return false;
        };
        [Some(&self.current), self.previous.as_ref()]
            .into_iter()
            .flatten()
            .filter(|(v, _)| *v == version)
            .any(|(v, s)| ct_eq(&Self::compute(&s[..], *v, ni, ip, spi_i), cookie))
    }
}
