//! Configuration of the IKE endpoint and of each peer (tunnel), with strongSwan's proposal keywords
//! (`aes256gcm16-prfsha256-x25519`, `aes256-sha256-modp2048`, ...; see strongSwan's
//! "IKEv2 Cipher Suites" documentation).

use crypto::{DhGroup, Encr, Integ, Prf};
use std::net::IpAddr;
use std::time::Duration;
use zeroize::Zeroizing;

/// Identifies a configured tunnel (a swanctl "connection") within a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TunnelId(pub u32);

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
        todo!("{s}")
    }
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
        todo!("{s}")
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
        todo!("{s}")
    }
}

/// A traffic selector range (RFC 7296 §3.13.1), address family given by the addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TrafficSelector {
    /// IP protocol ID, 0 = any.
    pub ip_proto: u8,
    /// First port (0 for any).
    pub start_port: u16,
    /// Last port (65535 for any).
    pub end_port: u16,
    /// First address.
    pub start: IpAddr,
    /// Last address (same family as `start`).
    pub end: IpAddr,
}

impl TrafficSelector {
    /// Parses swanctl's syntax: `10.1.0.0/24`, `10.1.0.5`, `10.1.0.1-10.1.0.9`, with an optional
    /// `[proto/port]` suffix such as `10.1.0.0/24[tcp/443]`.
    pub fn parse(s: &str) -> Result<Self, crate::Error> {
        todo!("{s}")
    }
    /// True if `addr` lies within the address range (ignores protocol and ports).
    pub fn contains_addr(&self, addr: IpAddr) -> bool {
        todo!("{addr}")
    }
    /// The intersection of two selectors, if not empty (RFC 7296 §2.9 narrowing).
    pub fn intersect(&self, other: &Self) -> Option<Self> {
        todo!("{other:?}")
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
#[derive(Debug, Clone)]
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
