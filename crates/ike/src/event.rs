//! What the engine tells its driver: SA lifecycle events (with CHILD_SA keys for the data path)
//! and status snapshots for `protego status`.

use crate::config::{TrafficSelector, TunnelId};
use crypto::{DhGroup, Encr, Integ};
use std::net::SocketAddr;
use wire::{EspSpi, IkeSpi};
use zeroize::Zeroizing;

/// The SPI pair naming an IKE SA (initiator's, responder's; responder's is 0 while half-open).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IkeSpis {
    /// SPI chosen by the original initiator.
    pub initiator: IkeSpi,
    /// SPI chosen by the original responder.
    pub responder: IkeSpi,
}

/// Why an SA went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteReason {
    /// The peer sent a DELETE.
    PeerRequest,
    /// We were asked to delete it (operator, configuration change).
    LocalRequest,
    /// Replaced by a rekeyed SA.
    Rekeyed,
    /// Dead peer detection gave up.
    DpdTimeout,
    /// A request was retransmitted too often without answer.
    RetransmitLimit,
    /// Its hard lifetime passed.
    Expired,
    /// Authentication failed.
    AuthFailed,
    /// The negotiation failed (no proposal chosen, TS unacceptable, ...).
    NegotiationFailed,
}

/// Keys of both directions of a CHILD_SA, split as RFC 7296 §2.17 derives them.
pub struct ChildKeys {
    /// Encryption key (plus salt for AEAD) for packets we receive.
    pub inbound_encr: Zeroizing<Vec<u8>>,
    /// Integrity key for packets we receive (empty for AEAD).
    pub inbound_integ: Zeroizing<Vec<u8>>,
    /// Encryption key (plus salt) for packets we send.
    pub outbound_encr: Zeroizing<Vec<u8>>,
    /// Integrity key for packets we send (empty for AEAD).
    pub outbound_integ: Zeroizing<Vec<u8>>,
}

impl core::fmt::Debug for ChildKeys {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("ChildKeys(<redacted>)")
    }
}

/// A negotiated CHILD_SA pair, ready to be installed in a data path.
#[derive(Debug)]
pub struct ChildSaInfo {
    /// The tunnel it belongs to.
    pub tunnel: TunnelId,
    /// The IKE SA that negotiated it.
    pub ike: IkeSpis,
    /// SPI of the inbound SA (chosen by us).
    pub inbound_spi: EspSpi,
    /// SPI of the outbound SA (chosen by the peer).
    pub outbound_spi: EspSpi,
    /// Encryption transform.
    pub encr: Encr,
    /// Integrity transform (None for AEAD).
    pub integ: Option<Integ>,
    /// Extended sequence numbers negotiated.
    pub esn: bool,
    /// PFS group used when it was created by CREATE_CHILD_SA with KE.
    pub pfs: Option<DhGroup>,
    /// Keying material.
    pub keys: ChildKeys,
    /// Negotiated (narrowed) local traffic selectors.
    pub local_ts: Vec<TrafficSelector>,
    /// Negotiated (narrowed) remote traffic selectors.
    pub remote_ts: Vec<TrafficSelector>,
    /// Our outer address and port (UDP 4500 encapsulation).
    pub local: SocketAddr,
    /// The peer's outer address and port.
    pub remote: SocketAddr,
    /// Anti-replay window for the inbound SA.
    pub replay_window: u32,
    /// Inbound SPI of the CHILD_SA this one replaces (rekey): the data path keeps accepting on
    /// the old one until its `ChildSaDeleted`.
    pub replaces: Option<EspSpi>,
    /// Whether the data path sends on this SA from now on (and no longer on `replaces`).
    ///
    /// False when we answered the peer's rekey (RFC 7296 §2.8): the peer installs its inbound
    /// half only when our answer arrives, so anything we sent on the new SA before that would be
    /// dropped. The replaced SA keeps carrying outbound traffic until its `ChildSaDeleted`,
    /// which comes when the peer deletes it - after it switched - or at its hard lifetime; then
    /// the data path sends on this one, the tunnel's newest remaining SA. strongSwan (5.5+)
    /// behaves the same (`child_create.c`, `child_delete.c` `install_outbound`).
    pub outbound_active: bool,
    /// Human-readable proposal, strongSwan style (`AES_GCM_16_256/NO_EXT_SEQ`).
    pub proposal: String,
}

/// A change of the durable state of an IKE SA, from [`crate::Endpoint::take_state_changes`].
pub enum StateChange {
    /// The IKE SA with our SPI `spi` has new state: store `snapshot` (secret: it holds the
    /// SA's keys) under `spi`, replacing what was stored.
    Saved {
        /// Our SPI of the IKE SA (the key to store it under).
        spi: IkeSpi,
        /// Both SPIs.
        ike: IkeSpis,
        /// Its tunnel (None for an SA that matched none).
        tunnel: Option<TunnelId>,
        /// The state, for [`crate::Endpoint::restore_aged`].
        snapshot: zeroize::Zeroizing<Vec<u8>>,
    },
    /// The IKE SA with our SPI `spi` is gone: forget what was stored.
    Removed {
        /// Our SPI of the IKE SA.
        spi: IkeSpi,
    },
}

impl std::fmt::Debug for StateChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the snapshot's bytes: they hold keys.
        match self {
            Self::Saved { spi, snapshot, .. } => f
                .debug_struct("Saved")
                .field("spi", spi)
                .field("snapshot_len", &snapshot.len())
                .finish(),
            Self::Removed { spi } => f.debug_struct("Removed").field("spi", spi).finish(),
        }
    }
}

/// An event for the driver.
#[derive(Debug)]
pub enum Event {
    /// We started (or a peer started) negotiating an IKE SA.
    IkeSaConnecting {
        /// The tunnel (None when a peer's request matched no tunnel yet).
        tunnel: Option<TunnelId>,
        /// The SPIs so far.
        ike: IkeSpis,
        /// The peer's address.
        remote: SocketAddr,
    },
    /// An IKE SA was authenticated.
    IkeSaEstablished {
        /// The tunnel.
        tunnel: TunnelId,
        /// The SPIs.
        ike: IkeSpis,
        /// Human-readable proposal (`AES_GCM_16_256/PRF_HMAC_SHA2_256/CURVE_25519`).
        proposal: String,
        /// Our address.
        local: SocketAddr,
        /// The peer's address.
        remote: SocketAddr,
    },
    /// An IKE SA was replaced by a rekeyed one (its CHILD_SAs moved to the new one).
    IkeSaRekeyed {
        /// The tunnel.
        tunnel: TunnelId,
        /// The old SPIs.
        old: IkeSpis,
        /// The new SPIs.
        new: IkeSpis,
    },
    /// An IKE SA (and with it every CHILD_SA it had, each also reported) is gone. With reason
    /// `Rekeyed` this may also name the redundant new SA of a simultaneous rekey (RFC 7296
    /// §2.8.2) that was never announced.
    IkeSaDeleted {
        /// The tunnel (None for a half-open SA that never matched one).
        tunnel: Option<TunnelId>,
        /// The SPIs.
        ike: IkeSpis,
        /// Why.
        reason: DeleteReason,
    },
    /// A CHILD_SA pair is ready: install it.
    ChildSaInstalled(Box<ChildSaInfo>),
    /// A CHILD_SA pair is gone: remove it.
    ChildSaDeleted {
        /// The tunnel.
        tunnel: TunnelId,
        /// Inbound SPI.
        inbound_spi: EspSpi,
        /// Outbound SPI.
        outbound_spi: EspSpi,
        /// Why.
        reason: DeleteReason,
    },
    /// A new CHILD_SA we asked for (not a rekey) did not come about: the first one of
    /// IKE_AUTH, or one more with [`crate::Endpoint::add_child`]. `notify` is the peer's
    /// error; TS_MAX_QUEUE (RFC 9611) and NO_ADDITIONAL_SAS say it takes no more, so asking
    /// again is pointless until one of the tunnel's CHILD_SAs is gone. TEMPORARY_FAILURE also
    /// stands for a request that failed here (it could not be sent, its IKE SA was no longer
    /// established, or the peer deleted the new CHILD_SA before its answer arrived).
    ChildSaRefused {
        /// The tunnel.
        tunnel: TunnelId,
        /// The IKE SA the request went over.
        ike: IkeSpis,
        /// The peer's error notify (NO_PROPOSAL_CHOSEN for an answer we could not accept).
        notify: wire::ike::NotifyType,
    },
    /// The peer's address or port changed (NAT rebinding, RFC 7296 §2.23): update the outer
    /// addresses of all CHILD_SAs of this IKE SA.
    PeerAddressChanged {
        /// The tunnel.
        tunnel: TunnelId,
        /// The IKE SA.
        ike: IkeSpis,
        /// Our address.
        local: SocketAddr,
        /// The peer's new address.
        remote: SocketAddr,
    },
    /// The peer answered a liveness check (RFC 7296 §2.4, dead peer detection). A check that
    /// goes unanswered ends in [`Event::IkeSaDeleted`] with [`DeleteReason::DpdTimeout`].
    LivenessConfirmed {
        /// The tunnel.
        tunnel: TunnelId,
        /// The IKE SA.
        ike: IkeSpis,
    },
    /// IKE SA keys for a debugging decoder; only emitted when `EndpointConfig::key_log` is set.
    KeyLog {
        /// The IKE SA.
        ike: IkeSpis,
        /// A line in Wireshark's `ikev2_decryption_table` format.
        line: String,
    },
}

/// State of an IKE SA, for status output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IkeSaState {
    /// IKE_SA_INIT / IKE_AUTH in progress.
    Connecting,
    /// Authenticated and usable.
    Established,
    /// Being rekeyed.
    Rekeying,
    /// Being deleted.
    Deleting,
}

/// Status of one CHILD_SA.
#[derive(Debug, Clone)]
pub struct ChildSaStatus {
    /// Inbound SPI.
    pub inbound_spi: EspSpi,
    /// Outbound SPI.
    pub outbound_spi: EspSpi,
    /// Proposal string.
    pub proposal: String,
    /// Local selectors.
    pub local_ts: Vec<TrafficSelector>,
    /// Remote selectors.
    pub remote_ts: Vec<TrafficSelector>,
    /// Seconds since it was installed.
    pub age_secs: u64,
    /// Negotiated with SA_RESOURCE_INFO: one of the tunnel's per-resource CHILD_SAs (RFC 9611).
    pub per_resource: bool,
    /// Seconds until it is rekeyed (its soft lifetime), if a rekey is scheduled.
    pub rekey_in_secs: Option<u64>,
    /// Seconds until it expires (its hard lifetime), if it has one.
    pub expire_in_secs: Option<u64>,
}

/// Status of one IKE SA.
#[derive(Debug, Clone)]
pub struct IkeSaStatus {
    /// Its tunnel, once known.
    pub tunnel: Option<TunnelId>,
    /// SPIs.
    pub ike: IkeSpis,
    /// True if we were the original initiator.
    pub initiator: bool,
    /// State.
    pub state: IkeSaState,
    /// Proposal string (empty until negotiated).
    pub proposal: String,
    /// Our address.
    pub local: SocketAddr,
    /// The peer's address.
    pub remote: SocketAddr,
    /// Seconds since established.
    pub age_secs: u64,
    /// Seconds until it is rekeyed, if a rekey is scheduled.
    pub rekey_in_secs: Option<u64>,
    /// CHILD_SAs.
    pub children: Vec<ChildSaStatus>,
}

impl IkeSaStatus {
    /// Our own SPI of the SA (the one it is stored under, see [`StateChange`]).
    pub fn local_spi(&self) -> IkeSpi {
        if self.initiator {
            self.ike.initiator
        } else {
            self.ike.responder
        }
    }
}
