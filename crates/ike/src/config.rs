//! Configuration of the IKE endpoint and of each peer (tunnel), with strongSwan's proposal keywords
//! (`aes256gcm16-prfsha256-x25519`, `aes256-sha256-modp2048`, ...; see strongSwan's
//! "IKEv2 Cipher Suites" documentation).

use crypto::{DhGroup, Encr, Integ, Prf};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;
use zeroize::Zeroizing;

pub use ids::TunnelId;

/// An IKE identity (RFC 7296 §3.5).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identity {
    /// ID_IPV4_ADDR.
    Ipv4(std::net::Ipv4Addr),
    /// ID_IPV6_ADDR.
    Ipv6(std::net::Ipv6Addr),
    /// ID_FQDN.
    Fqdn(String),
    /// ID_RFC822_ADDR.
    Rfc822(String),
    /// ID_KEY_ID (opaque octets).
    KeyId(Vec<u8>),
}

impl Identity {
    /// Parses an identity the way swanctl.conf does: an IP address becomes ID_IPV4/6_ADDR,
    /// `user@domain` ID_RFC822_ADDR, `keyid:...` / `@#hex` ID_KEY_ID, `fqdn:x`/`@x`/other text ID_FQDN.
    pub fn parse(s: &str) -> Result<Self, crate::Error> {
        let err = |reason: &str| crate::Error::Config {
            what: "identity",
            value: s.to_string(),
            reason: reason.to_string(),
        };
        let t = s.trim();
        if t.is_empty() {
            return Err(err("empty identity"));
        }
        if let Ok(ip) = t.parse::<IpAddr>() {
            return Ok(match ip {
                IpAddr::V4(a) => Self::Ipv4(a),
                IpAddr::V6(a) => Self::Ipv6(a),
            });
        }
        let hex_bytes = |h: &str| -> Result<Vec<u8>, crate::Error> {
            let h: String = h.chars().filter(|c| *c != ':').collect();
            if h.is_empty() || !h.len().is_multiple_of(2) {
                return Err(err("key id needs an even number of hex digits"));
            }
            (0..h.len())
                .step_by(2)
                .map(|i| {
                    u8::from_str_radix(h.get(i..i + 2).unwrap_or("zz"), 16)
                        .map_err(|_| err("invalid hex digit in key id"))
                })
                .collect()
        };
        if let Some(rest) = t.strip_prefix("@#") {
            return Ok(Self::KeyId(hex_bytes(rest)?));
        }
        if let Some(rest) = t.strip_prefix("keyid:") {
            return Ok(match rest.strip_prefix('#') {
                Some(h) => Self::KeyId(hex_bytes(h)?),
                None if rest.is_empty() => return Err(err("empty key id")),
                None => Self::KeyId(rest.as_bytes().to_vec()),
            });
        }
        if let Some(rest) = t.strip_prefix("fqdn:").or_else(|| t.strip_prefix('@')) {
            if rest.is_empty() {
                return Err(err("empty FQDN"));
            }
            return Ok(Self::Fqdn(rest.to_string()));
        }
        if let Some(rest) = t
            .strip_prefix("email:")
            .or_else(|| t.strip_prefix("rfc822:"))
        {
            if rest.is_empty() {
                return Err(err("empty RFC 822 address"));
            }
            return Ok(Self::Rfc822(rest.to_string()));
        }
        if t.contains('@') {
            return Ok(Self::Rfc822(t.to_string()));
        }
        if t.contains('=') {
            return Err(err("distinguished names are not supported (PSK only)"));
        }
        Ok(Self::Fqdn(t.to_string()))
    }

    /// The ID payload type and data (RFC 7296 §3.5).
    pub fn to_wire(&self) -> (wire::ike::IdType, Vec<u8>) {
        use wire::ike::IdType;
        match self {
            Self::Ipv4(a) => (IdType::IPV4_ADDR, a.octets().to_vec()),
            Self::Ipv6(a) => (IdType::IPV6_ADDR, a.octets().to_vec()),
            Self::Fqdn(s) => (IdType::FQDN, s.as_bytes().to_vec()),
            Self::Rfc822(s) => (IdType::RFC822_ADDR, s.as_bytes().to_vec()),
            Self::KeyId(k) => (IdType::KEY_ID, k.clone()),
        }
    }

    /// The identity an ID payload carries, if its type is supported.
    pub fn from_wire(id_type: wire::ike::IdType, data: &[u8]) -> Option<Self> {
        use wire::ike::IdType;
        match id_type {
            IdType::IPV4_ADDR => <[u8; 4]>::try_from(data).ok().map(|a| Self::Ipv4(a.into())),
            IdType::IPV6_ADDR => <[u8; 16]>::try_from(data)
                .ok()
                .map(|a| Self::Ipv6(a.into())),
            IdType::FQDN => std::str::from_utf8(data)
                .ok()
                .map(|s| Self::Fqdn(s.to_string())),
            IdType::RFC822_ADDR => std::str::from_utf8(data)
                .ok()
                .map(|s| Self::Rfc822(s.to_string())),
            IdType::KEY_ID => Some(Self::KeyId(data.to_vec())),
            _ => None,
        }
    }

    /// True if an identity received from a peer matches this configured one. FQDN and RFC 822
    /// names compare case-insensitively (DNS names are case-insensitive).
    pub fn matches(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Fqdn(a), Self::Fqdn(b)) | (Self::Rfc822(a), Self::Rfc822(b)) => {
                a.eq_ignore_ascii_case(b)
            }
            (a, b) => a == b,
        }
    }
}

impl core::fmt::Display for Identity {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Ipv4(a) => write!(f, "{a}"),
            Self::Ipv6(a) => write!(f, "{a}"),
            Self::Fqdn(s) | Self::Rfc822(s) => f.write_str(s),
            Self::KeyId(k) => {
                f.write_str("@#")?;
                k.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        }
    }
}

/// One parsed strongSwan proposal keyword.
enum Keyword {
    Encr(Encr),
    Integ(Integ),
    Prf(Prf),
    Dh(DhGroup),
    Esn(bool),
}

fn keyword(k: &str) -> Option<Keyword> {
    use Keyword::*;
    Some(match k {
        "aes" | "aes128" => Encr(crypto::Encr::AesCbc128),
        "aes256" => Encr(crypto::Encr::AesCbc256),
        "aes128gcm" | "aes128gcm16" | "aes128gcm128" => Encr(crypto::Encr::AesGcm16_128),
        "aes256gcm" | "aes256gcm16" | "aes256gcm128" => Encr(crypto::Encr::AesGcm16_256),
        "chacha20poly1305" => Encr(crypto::Encr::ChaCha20Poly1305),
        "sha" | "sha1" => Integ(crypto::Integ::HmacSha1_96),
        "sha256" | "sha2_256" => Integ(crypto::Integ::HmacSha256_128),
        "sha384" | "sha2_384" => Integ(crypto::Integ::HmacSha384_192),
        "sha512" | "sha2_512" => Integ(crypto::Integ::HmacSha512_256),
        "prfsha1" => Prf(crypto::Prf::HmacSha1),
        "prfsha256" => Prf(crypto::Prf::HmacSha256),
        "prfsha384" => Prf(crypto::Prf::HmacSha384),
        "prfsha512" => Prf(crypto::Prf::HmacSha512),
        "modp2048" => Dh(DhGroup::Modp2048),
        "ecp256" => Dh(DhGroup::Ecp256),
        "ecp384" => Dh(DhGroup::Ecp384),
        "x25519" | "curve25519" => Dh(DhGroup::Curve25519),
        "esn" => Esn(true),
        "noesn" => Esn(false),
        _ => return None,
    })
}

/// The PRF strongSwan derives from an integrity algorithm when a proposal names none.
fn prf_for_integ(i: Integ) -> Prf {
    match i {
        Integ::HmacSha1_96 => Prf::HmacSha1,
        Integ::HmacSha256_128 => Prf::HmacSha256,
        Integ::HmacSha384_192 => Prf::HmacSha384,
        Integ::HmacSha512_256 => Prf::HmacSha512,
    }
}

struct Parsed {
    encr: Vec<Encr>,
    integ: Vec<Integ>,
    prf: Vec<Prf>,
    dh: Vec<DhGroup>,
    esn: Vec<bool>,
}

fn push_unique<T: PartialEq>(v: &mut Vec<T>, x: T) {
    if !v.contains(&x) {
        v.push(x);
    }
}

fn parse_keywords(s: &str, what: &'static str) -> Result<Parsed, crate::Error> {
    let err = |reason: String| crate::Error::Config {
        what,
        value: s.to_string(),
        reason,
    };
    let mut p = Parsed {
        encr: vec![],
        integ: vec![],
        prf: vec![],
        dh: vec![],
        esn: vec![],
    };
    for k in s.trim().split('-') {
        match keyword(&k.to_ascii_lowercase()) {
            Some(Keyword::Encr(e)) => push_unique(&mut p.encr, e),
            Some(Keyword::Integ(i)) => push_unique(&mut p.integ, i),
            Some(Keyword::Prf(f)) => push_unique(&mut p.prf, f),
            Some(Keyword::Dh(d)) => push_unique(&mut p.dh, d),
            Some(Keyword::Esn(e)) => push_unique(&mut p.esn, e),
            None => return Err(err(format!("unknown or unsupported keyword {k:?}"))),
        }
    }
    if p.encr.is_empty() {
        return Err(err("no encryption algorithm".into()));
    }
    let aead = p.encr.iter().filter(|e| e.is_aead()).count();
    if aead != 0 && aead != p.encr.len() {
        return Err(err(
            "AEAD and non-AEAD encryption algorithms mixed in one proposal".into(),
        ));
    }
    if aead != 0 && !p.integ.is_empty() {
        return Err(err("AEAD algorithms take no integrity algorithm".into()));
    }
    if aead == 0 && p.integ.is_empty() {
        return Err(err("no integrity algorithm for a non-AEAD cipher".into()));
    }
    Ok(p)
}

/// One IKE proposal: every combination of the listed transforms is acceptable (RFC 7296 §3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IkeProposal {
    /// Encryption transforms in preference order.
    pub encr: Vec<Encr>,
    /// Integrity transforms (empty for AEAD-only proposals).
    pub integ: Vec<Integ>,
    /// PRFs.
    pub prf: Vec<Prf>,
    /// Key exchange groups; the first is used for the initial KE payload.
    pub dh: Vec<DhGroup>,
}

impl IkeProposal {
    /// Parses one strongSwan IKE proposal string, e.g. `aes256gcm16-prfsha256-x25519` or
    /// `aes128-sha256-modp2048`. Without an explicit PRF, the PRF follows the integrity
    /// algorithm as strongSwan does. Errors name the unknown keyword.
    pub fn parse(s: &str) -> Result<Self, crate::Error> {
        let err = |reason: &str| crate::Error::Config {
            what: "IKE proposal",
            value: s.to_string(),
            reason: reason.to_string(),
        };
        let mut p = parse_keywords(s, "IKE proposal")?;
        if !p.esn.is_empty() {
            return Err(err("ESN is not an IKE transform"));
        }
        if p.dh.is_empty() {
            return Err(err("no key exchange group"));
        }
        if p.prf.is_empty() {
            if p.integ.is_empty() {
                return Err(err(
                    "a PRF is mandatory in AEAD IKE proposals (e.g. prfsha256)",
                ));
            }
            p.prf = p.integ.iter().map(|i| prf_for_integ(*i)).collect();
            p.prf.dedup();
        }
        Ok(Self {
            encr: p.encr,
            integ: p.integ,
            prf: p.prf,
            dh: p.dh,
        })
    }
}

/// One ESP proposal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EspProposal {
    /// Encryption transforms in preference order.
    pub encr: Vec<Encr>,
    /// Integrity transforms (empty for AEAD).
    pub integ: Vec<Integ>,
    /// PFS groups; empty means no PFS (no KE in CREATE_CHILD_SA).
    pub dh: Vec<DhGroup>,
    /// Acceptable ESN settings in order (`true` = ESN); default `[false]`, strongSwan's `esn` / `noesn`.
    pub esn: Vec<bool>,
}

impl EspProposal {
    /// Parses one strongSwan ESP proposal string, e.g. `aes256gcm16`, `aes128-sha256-modp2048-esn`.
    pub fn parse(s: &str) -> Result<Self, crate::Error> {
        let p = parse_keywords(s, "ESP proposal")?;
        if !p.prf.is_empty() {
            return Err(crate::Error::Config {
                what: "ESP proposal",
                value: s.to_string(),
                reason: "a PRF is not an ESP transform".into(),
            });
        }
        let esn = if p.esn.is_empty() { vec![false] } else { p.esn };
        Ok(Self {
            encr: p.encr,
            integ: p.integ,
            dh: p.dh,
            esn,
        })
    }
}

pub use wire::ike::TrafficSelector;

impl From<wire::ike::TsSyntaxError> for crate::Error {
    fn from(e: wire::ike::TsSyntaxError) -> Self {
        crate::Error::Config {
            what: "traffic selector",
            value: e.value,
            reason: e.reason.to_owned(),
        }
    }
}

/// What to do when DPD declares the peer dead (swanctl `dpd_action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DpdAction {
    /// Delete the IKE SA and its CHILD_SAs.
    #[default]
    Clear,
    /// Delete, then initiate again.
    Restart,
}

/// What to do when the configuration is loaded (swanctl `start_action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartAction {
    /// Wait for the peer to initiate.
    #[default]
    None,
    /// Initiate at once (and, with DPD restart, keep the tunnel up).
    Start,
}

/// One configured peer / tunnel: the IKE SA and the CHILD_SA it carries.
///
/// `Debug` prints every field but the pre-shared key, which shows as `<redacted>`.
#[derive(Clone)]
pub struct PeerConfig {
    /// The node-wide tunnel id.
    pub id: TunnelId,
    /// The tunnel's name (for logs and status).
    pub name: String,
    /// Local addresses the tunnel may use (empty = any configured listen address).
    pub local_addrs: Vec<IpAddr>,
    /// The peer's addresses (swanctl `remote_addrs`); empty means any (responder only).
    pub remote_addrs: Vec<IpAddr>,
    /// Our identity.
    pub local_id: Identity,
    /// The identity the peer must prove.
    pub remote_id: Identity,
    /// The pre-shared key.
    pub psk: Zeroizing<Vec<u8>>,
    /// IKE proposals in preference order.
    pub ike_proposals: Vec<IkeProposal>,
    /// ESP proposals in preference order.
    pub esp_proposals: Vec<EspProposal>,
    /// Our side's traffic selectors.
    pub local_ts: Vec<TrafficSelector>,
    /// The peer's side's traffic selectors.
    pub remote_ts: Vec<TrafficSelector>,
    /// IKE SA rekey interval (swanctl `rekey_time`); zero disables.
    pub ike_rekey_time: Duration,
    /// Hard lifetime of the IKE SA beyond its (jittered) rekey time (swanctl `over_time`): an
    /// IKE SA that could not be rekeyed by then is deleted. Zero disables (as does a zero
    /// `ike_rekey_time`).
    pub ike_over_time: Duration,
    /// CHILD_SA rekey interval (swanctl children `rekey_time`); zero disables.
    pub child_rekey_time: Duration,
    /// Hard lifetime of a CHILD_SA (swanctl `life_time`, default 110 % of rekey_time).
    pub child_life_time: Duration,
    /// Random jitter subtracted from rekey times (swanctl `rand_time`, default 10 % of rekey_time).
    pub rand_time: Duration,
    /// DPD interval; `None` disables liveness checks.
    pub dpd_delay: Option<Duration>,
    /// Action on DPD timeout.
    pub dpd_action: DpdAction,
    /// Action on load.
    pub start_action: StartAction,
    /// Anti-replay window in packets for inbound CHILD_SAs.
    pub replay_window: u32,
    /// Per-resource CHILD_SAs (RFC 9611): the most CHILD_SAs negotiated with SA_RESOURCE_INFO
    /// that one IKE SA of the tunnel holds (the first, the peer's fallback, included); a request
    /// for one more is refused with TS_MAX_QUEUE. Zero: RFC 9611 is neither offered nor
    /// answered (a peer's SA_RESOURCE_INFO is ignored and its CHILD_SAs are plain parallel
    /// ones, RFC 7296 §1.3.1).
    pub resource_sas: u32,
}

/// The default of [`PeerConfig::resource_sas`]: more than the CPUs of most peers (strongSwan
/// asks for one CHILD_SA per CPU that sends) and the data nodes of a cluster.
pub const DEFAULT_RESOURCE_SAS: u32 = 64;

impl fmt::Debug for PeerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerConfig")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("local_addrs", &self.local_addrs)
            .field("remote_addrs", &self.remote_addrs)
            .field("local_id", &self.local_id)
            .field("remote_id", &self.remote_id)
            .field("psk", &format_args!("<redacted>"))
            .field("ike_proposals", &self.ike_proposals)
            .field("esp_proposals", &self.esp_proposals)
            .field("local_ts", &self.local_ts)
            .field("remote_ts", &self.remote_ts)
            .field("ike_rekey_time", &self.ike_rekey_time)
            .field("ike_over_time", &self.ike_over_time)
            .field("child_rekey_time", &self.child_rekey_time)
            .field("child_life_time", &self.child_life_time)
            .field("rand_time", &self.rand_time)
            .field("dpd_delay", &self.dpd_delay)
            .field("dpd_action", &self.dpd_action)
            .field("start_action", &self.start_action)
            .field("replay_window", &self.replay_window)
            .field("resource_sas", &self.resource_sas)
            .finish()
    }
}

/// Node-wide IKE settings.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// First retransmission timeout (strongSwan `retransmit_timeout`, default 4 s).
    pub retransmit_timeout: Duration,
    /// Back-off base (strongSwan `retransmit_base`, default 1.8).
    pub retransmit_base: f64,
    /// Retransmissions before giving up (strongSwan `retransmit_tries`, default 5).
    pub retransmit_tries: u32,
    /// Half-open IKE SAs above which COOKIEs are demanded (RFC 7296 §2.6).
    pub cookie_threshold: usize,
    /// Half-open IKE SAs are dropped after this long.
    pub half_open_timeout: Duration,
    /// Always use UDP encapsulation of ESP by faking NAT detection, as swanctl `encap = yes`
    /// (Protego's data path only speaks ESP-in-UDP). Default true.
    pub force_encap: bool,
    /// Emit [`Event::KeyLog`](crate::Event::KeyLog) with IKE SA keys for debugging decoders
    /// (tshark). Dangerous; default false.
    pub key_log: bool,
    /// Interval of NAT keepalives when behind a NAT (RFC 3948 §4, default 20 s).
    pub nat_keepalive: Duration,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        Self {
            retransmit_timeout: Duration::from_secs(4),
            retransmit_base: 1.8,
            retransmit_tries: 5,
            cookie_threshold: 32,
            half_open_timeout: Duration::from_secs(30),
            force_encap: true,
            key_log: false,
            nat_keepalive: Duration::from_secs(20),
        }
    }
}
