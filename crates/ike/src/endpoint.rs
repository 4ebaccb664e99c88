//! The IKE endpoint: all IKE SAs of a node, demultiplexed by our SPI (RFC 7296 §2.6), the
//! stateless IKE_SA_INIT responder front (cookies, §2.6), and the driver-facing queues.

use crate::{
    config::*,
    event::*,
    init::respond_init,
    keys::CookieSecrets,
    sa::{Ctx, IkeSa, Output, Pending, SaState},
    Error, IkeDrop, IkeStats,
};
use crypto::Rng;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};
use tracing::debug;
use wire::ike::{ExchangeType, Header, Message};
use wire::{EspSpi, IkeSpi, Transmit};
use zeroize::Zeroizing;

/// All IKE SAs of a node. See the crate documentation for the order of calls.
pub struct Endpoint {
    config: EndpointConfig,
    rng: Box<dyn Rng>,
    peers: BTreeMap<TunnelId, PeerConfig>,
    /// IKE SAs by our SPI.
    sas: HashMap<IkeSpi, IkeSa>,
    /// Half-open responder SAs by (initiator SPI, peer address), to answer retransmitted
    /// IKE_SA_INIT requests from the cache.
    init_index: HashMap<(IkeSpi, SocketAddr), IkeSpi>,
    /// Responder SAs that answered IKE_SA_INIT but did not complete IKE_AUTH.
    half_open: usize,
    /// (deadline, SA) for every SA with an armed timer.
    timers: BTreeSet<(Instant, IkeSpi)>,
    /// Inbound ESP SPIs in use.
    esp_spis: HashSet<u32>,
    cookies: CookieSecrets,
    /// Last responses of IKE SAs that just ended, by our SPI: a peer whose DELETE answer was
    /// lost retransmits the request after we destroyed the SA, and gets the answer again.
    closed: HashMap<IkeSpi, Closed>,
    /// SPIs of new IKE SAs that exist only inside an old SA's pending rekey collision
    /// (RFC 7296 §2.8.2), mapped to that old SA.
    aliases: HashMap<IkeSpi, IkeSpi>,
    out: Output,
    /// Tunnels with `StartAction::Start` to initiate at the next `handle_timeout`.
    pending_start: Vec<TunnelId>,
    start_due: Option<Instant>,
    /// Dropped and refused datagrams by reason.
    stats: IkeStats,
    /// The instant snapshots are compared at (see [`Endpoint::take_state_changes`]).
    epoch: Instant,
    /// Whether state changes are tracked ([`Endpoint::track_state_changes`]).
    track: bool,
    /// SAs that ran or were filed since the last [`Endpoint::take_state_changes`].
    touched: BTreeSet<IkeSpi>,
    /// The last state of each SA reported by [`Endpoint::take_state_changes`], encoded at
    /// `epoch` (timers as deadlines after `epoch`, so the bytes change only with the state).
    saved: HashMap<IkeSpi, Zeroizing<Vec<u8>>>,
}

/// The cached last response of an ended IKE SA.
struct Closed {
    message_id: u32,
    bytes: Vec<u8>,
    until: Instant,
}

/// At most this many ended SAs are remembered (oldest forgotten first on overflow).
const MAX_CLOSED: usize = 65536;

macro_rules! ctx {
    ($self:ident, $now:expr) => {
        Ctx {
            now: $now,
            config: &$self.config,
            rng: &mut *$self.rng,
            peers: &$self.peers,
            others: &$self.sas,
            esp_spis: &mut $self.esp_spis,
            out: &mut $self.out,
            stats: &mut $self.stats,
        }
    };
}

impl Endpoint {
    /// A new endpoint with no peers. `now` starts its clock.
    pub fn new(config: EndpointConfig, rng: Box<dyn Rng>, now: Instant) -> Self {
        Self {
            config,
            rng,
            peers: BTreeMap::new(),
            sas: HashMap::new(),
            init_index: HashMap::new(),
            half_open: 0,
            timers: BTreeSet::new(),
            esp_spis: HashSet::new(),
            cookies: CookieSecrets::new(),
            closed: HashMap::new(),
            aliases: HashMap::new(),
            out: Output::default(),
            pending_start: Vec::new(),
            start_due: None,
            stats: IkeStats::default(),
            epoch: now,
            track: false,
            touched: BTreeSet::new(),
            saved: HashMap::new(),
        }
    }

    /// Adds or replaces a peer configuration. With `StartAction::Start` the next
    /// `handle_timeout` (or an explicit [`initiate`](Self::initiate)) initiates.
    pub fn add_peer(&mut self, now: Instant, peer: PeerConfig) -> Result<(), Error> {
        let bad = |reason: &str| Error::Config {
            what: "tunnel",
            value: peer.name.clone(),
            reason: reason.to_string(),
        };
        if peer.ike_proposals.is_empty() {
            return Err(bad("no IKE proposals"));
        }
        if peer.esp_proposals.is_empty() {
            return Err(bad("no ESP proposals"));
        }
        if peer
            .ike_proposals
            .iter()
            .any(|p| p.dh.is_empty() || p.encr.is_empty() || p.prf.is_empty())
        {
            return Err(bad("an IKE proposal lacks a transform type"));
        }
        if peer
            .esp_proposals
            .iter()
            .any(|p| p.encr.is_empty() || p.esn.is_empty())
        {
            return Err(bad("an ESP proposal lacks a transform type"));
        }
        if peer.child_life_time < peer.child_rekey_time && !peer.child_life_time.is_zero() {
            return Err(bad("child life_time is shorter than rekey_time"));
        }
        let id = peer.id;
        let start = peer.start_action == StartAction::Start;
        self.peers.insert(id, peer);
        if start && !self.pending_start.contains(&id) {
            self.pending_start.push(id);
            self.start_due = Some(self.start_due.map_or(now, |t| t.min(now)));
        }
        Ok(())
    }

    /// Removes a peer configuration, deleting its SAs (DELETE sent to the peer).
    pub fn remove_peer(&mut self, now: Instant, tunnel: TunnelId) -> Result<(), Error> {
        if !self.peers.contains_key(&tunnel) {
            return Err(Error::UnknownTunnel(tunnel));
        }
        self.terminate(now, tunnel)?;
        self.peers.remove(&tunnel);
        self.pending_start.retain(|t| *t != tunnel);
        Ok(())
    }

    /// Starts IKE_SA_INIT toward the first of the tunnel's `remote_addrs` (port 500), from the
    /// first of its `local_addrs` (or the unspecified address, leaving the choice to the driver).
    pub fn initiate(&mut self, now: Instant, tunnel: TunnelId) -> Result<(), Error> {
        let cfg = self
            .peers
            .get(&tunnel)
            .ok_or(Error::UnknownTunnel(tunnel))?;
        let remote_ip = *cfg
            .remote_addrs
            .first()
            .ok_or(Error::NoRemoteAddress(tunnel))?;
        let local_ip = cfg
            .local_addrs
            .iter()
            .copied()
            .find(|a| a.is_ipv4() == remote_ip.is_ipv4())
            .unwrap_or(match remote_ip {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            });
        let sa = {
            let peers = &self.peers;
            let cfg = peers.get(&tunnel).ok_or(Error::UnknownTunnel(tunnel))?;
            let mut ctx = ctx!(self, now);
            IkeSa::initiate(
                &mut ctx,
                cfg,
                SocketAddr::new(local_ip, 500),
                SocketAddr::new(remote_ip, 500),
            )?
        };
        self.insert(sa);
        self.settle(now);
        Ok(())
    }

    /// Starts a rekey of the CHILD_SA with this inbound SPI (data path: sequence numbers or byte
    /// limits near exhaustion, or operator request).
    pub fn rekey_child(&mut self, now: Instant, inbound_spi: EspSpi) -> Result<(), Error> {
        let spi = self
            .established_owner(inbound_spi)
            .ok_or(Error::UnknownChildSa(inbound_spi))?;
        self.run(now, spi, |sa, ctx| {
            sa.enqueue(Pending::RekeyChild(inbound_spi));
            sa.start_next_task(ctx);
        });
        Ok(())
    }

    /// Authenticated ESP of the CHILD_SA with this inbound SPI (ICV and anti-replay checks
    /// passed, the newest sequence number so far) arrived from `remote` on `local`. When a NAT
    /// is between the peers and the address differs from the IKE SA's, the peer's NAT rebound
    /// (RFC 7296 §2.23: packets go to the address of "the last valid authenticated packet";
    /// strongSwan follows the kernel's ESP mapping events the same way): the IKE SA moves
    /// there and [`Event::PeerAddressChanged`] is emitted. Unknown SPIs are ignored.
    pub fn peer_address_seen(
        &mut self,
        now: Instant,
        inbound_spi: EspSpi,
        local: SocketAddr,
        remote: SocketAddr,
    ) {
        if let Some(spi) = self.established_owner(inbound_spi) {
            self.run(now, spi, |sa, ctx| sa.follow_peer(ctx, local, remote));
        }
    }

    /// The established IKE SA that carries the CHILD_SA with this inbound SPI.
    fn established_owner(&self, inbound_spi: EspSpi) -> Option<IkeSpi> {
        self.sas
            .values()
            .find(|sa| {
                sa.state == SaState::Established
                    && sa.children.iter().any(|c| c.inbound_spi == inbound_spi)
            })
            .map(|sa| sa.spi)
    }

    /// Creates one more CHILD_SA of `tunnel` beside those in use, with its configured traffic
    /// selectors and ESP proposals (a CREATE_CHILD_SA without REKEY_SA on its newest
    /// established IKE SA, queued behind any exchange in flight): parallel CHILD_SAs with the
    /// same selectors, each with its own keys and sequence numbers, so that several senders
    /// (one per data node, issue 19 §2) need not share one sequence space. Each is announced
    /// by [`Event::ChildSaInstalled`] and rekeyed on its own; one the peer refuses is not
    /// asked for again (the caller sees no install and may ask again). Errors: an unknown
    /// tunnel, or one without an established IKE SA.
    pub fn add_child(&mut self, now: Instant, tunnel: TunnelId) -> Result<(), Error> {
        let spi = self.newest_established(tunnel)?;
        self.run(now, spi, |sa, ctx| {
            sa.enqueue(Pending::AddChild);
            sa.start_next_task(ctx);
        });
        Ok(())
    }

    /// Deletes the CHILD_SA with this inbound SPI (an INFORMATIONAL DELETE to the peer),
    /// leaving its IKE SA and the tunnel's other CHILD_SAs; [`Event::ChildSaDeleted`] follows
    /// with [`DeleteReason::LocalRequest`].
    pub fn delete_child(&mut self, now: Instant, inbound_spi: EspSpi) -> Result<(), Error> {
        let spi = self
            .established_owner(inbound_spi)
            .ok_or(Error::UnknownChildSa(inbound_spi))?;
        self.run(now, spi, |sa, ctx| {
            sa.enqueue(Pending::DeleteChildren(
                vec![inbound_spi],
                DeleteReason::LocalRequest,
            ));
            sa.start_next_task(ctx);
        });
        Ok(())
    }

    /// The SPIs of `tunnel`'s newest established IKE SA.
    fn newest_established(&self, tunnel: TunnelId) -> Result<IkeSpi, Error> {
        if !self.peers.contains_key(&tunnel) {
            return Err(Error::UnknownTunnel(tunnel));
        }
        self.sas
            .values()
            .filter(|sa| sa.tunnel == Some(tunnel) && sa.state == SaState::Established)
            .max_by_key(|sa| sa.established)
            .map(|sa| sa.spi)
            .ok_or(Error::NotEstablished(tunnel))
    }

    /// Starts a rekey of the tunnel's IKE SA.
    pub fn rekey_ike(&mut self, now: Instant, tunnel: TunnelId) -> Result<(), Error> {
        let spi = self.newest_established(tunnel)?;
        self.run(now, spi, |sa, ctx| {
            sa.enqueue(Pending::RekeyIke);
            sa.start_next_task(ctx);
        });
        Ok(())
    }

    /// Deletes the tunnel's IKE SA (and CHILD_SAs), telling the peer.
    pub fn terminate(&mut self, now: Instant, tunnel: TunnelId) -> Result<(), Error> {
        if !self.peers.contains_key(&tunnel) {
            return Err(Error::UnknownTunnel(tunnel));
        }
        let spis: Vec<IkeSpi> = self
            .sas
            .values()
            .filter(|sa| sa.tunnel == Some(tunnel))
            .map(|sa| sa.spi)
            .collect();
        for spi in spis {
            self.run(now, spi, |sa, ctx| match sa.state {
                SaState::Established => {
                    sa.enqueue(Pending::DeleteIke(DeleteReason::LocalRequest));
                    sa.start_next_task(ctx);
                }
                SaState::Connecting => sa.die(ctx, DeleteReason::LocalRequest),
                SaState::Rekeyed | SaState::Deleting | SaState::Dead => {}
            });
        }
        self.pending_start.retain(|t| *t != tunnel);
        Ok(())
    }

    /// Processes one received IKE datagram (non-ESP marker already removed). A single 0xFF
    /// byte (NAT keepalive, RFC 3948 §2.3) is ignored. Every datagram that is not processed as a
    /// valid message is counted in [`stats`](Self::stats) under one [`IkeDrop`] reason.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        data: &[u8],
    ) {
        if data == [0xFF] {
            self.stats.count(IkeDrop::NatKeepalive);
            return;
        }
        let Ok(header) = Header::parse(data) else {
            debug!(%remote, len = data.len(), "dropping datagram shorter than the IKE header");
            self.stats.count(IkeDrop::Truncated);
            return;
        };
        let msg = match Message::parse(data) {
            Ok(m) => m,
            Err(source) => {
                debug!(%remote, error = %source, "dropping undecodable IKE message");
                self.stats.count(
                    if header.major == 2 && header.length as usize > data.len() {
                        IkeDrop::Truncated
                    } else {
                        IkeDrop::Malformed
                    },
                );
                if header.exchange == ExchangeType::IKE_SA_INIT
                    && !header.flags.response()
                    && header.rspi.0 == 0
                    && header.major == 2
                {
                    let e = Error::Malformed {
                        spi: IkeSpi(0),
                        source,
                    };
                    let mut ctx = ctx!(self, now);
                    crate::init::reject_unparsable(&mut ctx, local, remote, &header, &e);
                }
                return;
            }
        };
        if header.exchange == ExchangeType::IKE_SA_INIT
            && !header.flags.response()
            && header.rspi.0 == 0
        {
            self.handle_init_request(now, local, remote, data, msg);
            return;
        }
        // The I flag says who sent it: from the original initiator we hold the responder SPI.
        let ours = if header.flags.initiator() {
            header.rspi
        } else {
            header.ispi
        };
        if let Some(&owner) = self.aliases.get(&ours) {
            if !self.sas.contains_key(&ours) {
                // The peer already uses the new SA of a collision we have not concluded: a
                // DELETE of it (it lost) or a liveness check is answered by that SA.
                if header.exchange == ExchangeType::INFORMATIONAL && !header.flags.response() {
                    self.run(now, owner, |sa, ctx| {
                        sa.handle_for_passive(ctx, local, remote, data, msg)
                    });
                } else {
                    debug!(%remote, spi = %ours, "dropping message for a pending rekey collision SA");
                    self.stats.count(IkeDrop::UnknownSpi);
                }
                return;
            }
        }
        if !self.sas.contains_key(&ours) {
            match self.closed.get(&ours) {
                Some(c)
                    if c.until > now
                        && !header.flags.response()
                        && c.message_id == header.message_id =>
                {
                    debug!(%remote, spi = %ours, "answering a retransmission for an ended IKE SA");
                    self.out.tx.push_back(crate::sa::Datagram {
                        local,
                        remote,
                        data: c.bytes.clone(),
                    });
                    self.stats.count(IkeDrop::RetransmitAnswered);
                }
                _ => {
                    debug!(%remote, spi = %ours, "message for unknown IKE SA");
                    self.stats.count(IkeDrop::UnknownSpi);
                }
            }
            return;
        }
        self.run(now, ours, |sa, ctx| {
            sa.handle(ctx, local, remote, data, msg)
        });
    }

    fn handle_init_request(
        &mut self,
        now: Instant,
        local: SocketAddr,
        remote: SocketAddr,
        data: &[u8],
        msg: Message,
    ) {
        if let Some(spi) = self.init_index.get(&(msg.header.ispi, remote)) {
            // RFC 7296 §2.1: a retransmitted IKE_SA_INIT is answered from the cache.
            let cached = self
                .sas
                .get(spi)
                .filter(|sa| {
                    sa.is_half_open() && sa.setup.as_ref().is_some_and(|s| s.peer_init == data)
                })
                .and_then(|sa| match &sa.last_response {
                    Some((0, bytes)) => Some((sa.local, bytes.clone())),
                    _ => None,
                });
            match cached {
                Some((local, bytes)) => {
                    self.out.tx.push_back(crate::sa::Datagram {
                        local,
                        remote,
                        data: bytes,
                    });
                    self.stats.count(IkeDrop::RetransmitAnswered);
                }
                None => {
                    // Message ID 0 of that SA is used up: a replay, or another request
                    // under the same SPI.
                    debug!(%remote, ispi = %msg.header.ispi, "dropping IKE_SA_INIT for an SA past IKE_SA_INIT");
                    self.stats.count(IkeDrop::OutsideWindow);
                }
            }
            return;
        }
        self.cookies.maybe_rotate(now, &mut *self.rng);
        let demand_cookie = self.half_open >= self.config.cookie_threshold;
        let sa = {
            let mut ctx = ctx!(self, now);
            respond_init(
                &mut ctx,
                &self.cookies,
                demand_cookie,
                local,
                remote,
                data,
                &msg,
            )
        };
        if let Some(mut sa) = sa {
            sa.counted_half_open = true;
            self.half_open += 1;
            if let Some(k) = sa.half_open_key {
                self.init_index.insert(k, sa.spi);
            }
            self.insert(sa);
        }
        self.settle(now);
    }

    /// Runs timers that are due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.start_due.is_some_and(|t| t <= now) {
            self.start_due = None;
            for tunnel in std::mem::take(&mut self.pending_start) {
                let active = self
                    .sas
                    .values()
                    .any(|sa| sa.tunnel == Some(tunnel) && sa.state != SaState::Dead);
                if !active {
                    if let Err(e) = self.initiate(now, tunnel) {
                        debug!(?tunnel, error = %e, "cannot start tunnel");
                    }
                }
            }
        }
        // Each due SA runs once per call, so that no SA can keep this loop busy.
        let due: Vec<(Instant, IkeSpi)> = self
            .timers
            .iter()
            .take_while(|(at, _)| *at <= now)
            .copied()
            .collect();
        for (at, spi) in due {
            self.timers.remove(&(at, spi));
            if let Some(sa) = self.sas.get_mut(&spi) {
                sa.scheduled = None;
            }
            self.run(now, spi, |sa, ctx| sa.handle_timeout(ctx));
        }
    }

    /// Writes the next datagram to send into `buf` (cleared first). A one-byte datagram holding
    /// 0xFF is a NAT keepalive (RFC 3948 §2.3): the driver sends it on port 4500 *without* the
    /// non-ESP marker. Every other datagram on port 4500 gets the marker.
    pub fn poll_transmit(&mut self, buf: &mut Vec<u8>) -> Option<Transmit> {
        let d = self.out.tx.pop_front()?;
        buf.clear();
        buf.extend_from_slice(&d.data);
        Some(Transmit {
            local: d.local,
            remote: d.remote,
            size: d.data.len(),
        })
    }

    /// The next event for the driver.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.out.events.pop_front()
    }

    /// When `handle_timeout` must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let t = self.timers.first().map(|(t, _)| *t);
        match (t, self.start_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Status of every IKE SA.
    pub fn status(&self, now: Instant) -> Vec<IkeSaStatus> {
        self.status_where(now, None)
    }

    /// [`Endpoint::status`] of the SAs of `tunnel` only (what a request about one tunnel
    /// needs, without copying the status of every other SA).
    pub fn tunnel_status(&self, now: Instant, tunnel: TunnelId) -> Vec<IkeSaStatus> {
        self.status_where(now, Some(tunnel))
    }

    fn status_where(&self, now: Instant, tunnel: Option<TunnelId>) -> Vec<IkeSaStatus> {
        // Whole seconds from now until a timer's deadline.
        let secs_until = |at: Instant| at.saturating_duration_since(now).as_secs();
        let mut v: Vec<IkeSaStatus> = self
            .sas
            .values()
            .filter(|sa| sa.state != SaState::Dead)
            .filter(|sa| tunnel.is_none_or(|t| sa.tunnel == Some(t)))
            .map(|sa| IkeSaStatus {
                tunnel: sa.tunnel,
                ike: sa.spis,
                initiator: sa.initiator,
                state: sa.status_state(),
                proposal: sa.keys.as_ref().map(|k| k.algs.name()).unwrap_or_default(),
                local: sa.local,
                remote: sa.remote,
                age_secs: sa
                    .established
                    .map_or(0, |t| now.saturating_duration_since(t).as_secs()),
                rekey_in_secs: sa.timers.get(crate::timer::Timer::IkeRekey).map(secs_until),
                children: sa
                    .children
                    .iter()
                    .map(|c| ChildSaStatus {
                        inbound_spi: c.inbound_spi,
                        outbound_spi: c.outbound_spi,
                        proposal: c.algs.name(),
                        local_ts: c.local_ts.clone(),
                        remote_ts: c.remote_ts.clone(),
                        age_secs: now.saturating_duration_since(c.installed_at).as_secs(),
                        per_resource: c.resource,
                        rekey_in_secs: (c.timers.get(crate::timer::ChildTimer::Rekey))
                            .map(secs_until),
                        expire_in_secs: (c.timers.get(crate::timer::ChildTimer::Expire))
                            .map(secs_until),
                    })
                    .collect(),
            })
            .collect();
        v.sort_by_key(|s| (s.tunnel, s.ike.initiator));
        v
    }

    /// Serialises the full state of one IKE SA (keys, SPIs, message IDs, CHILD_SAs, timers as
    /// remaining durations) for a standby to restore. `ike` may name either SPI.
    pub fn snapshot(&self, now: Instant, ike: IkeSpis) -> Option<Vec<u8>> {
        let sa = self
            .sas
            .values()
            .find(|sa| sa.spis == ike && sa.state != SaState::Dead)?;
        crate::snapshot::encode(sa, now)
    }

    /// Restores an IKE SA from [`snapshot`](Self::snapshot) bytes. The restored SA continues
    /// with the saved message IDs; its CHILD_SAs are *not* reported again (the data path
    /// already has them). The tunnel must be configured.
    pub fn restore(&mut self, now: Instant, bytes: &[u8]) -> Result<IkeSpis, Error> {
        self.restore_aged(now, bytes, Duration::ZERO)
    }

    /// [`restore`](Self::restore) for a snapshot taken `age` ago (read back from a store after
    /// a restart): the SA's timers have run that long, so a rekey or lifetime that fell due
    /// meanwhile is due now. The restored state counts as saved for
    /// [`take_state_changes`](Self::take_state_changes).
    pub fn restore_aged(
        &mut self,
        now: Instant,
        bytes: &[u8],
        age: Duration,
    ) -> Result<IkeSpis, Error> {
        let sa = crate::snapshot::decode(bytes, now, age)?;
        if self.sas.contains_key(&sa.spi) {
            return Err(Error::DuplicateSa(sa.spi));
        }
        if let Some(t) = sa.tunnel {
            if !self.peers.contains_key(&t) {
                return Err(Error::UnknownTunnel(t));
            }
        }
        for c in &sa.children {
            self.esp_spis.insert(c.inbound_spi.0);
        }
        let spis = sa.spis;
        if self.track {
            if let Some(state) = crate::snapshot::encode(&sa, self.epoch) {
                self.saved.insert(sa.spi, Zeroizing::new(state));
            }
        }
        self.insert(sa);
        Ok(spis)
    }

    /// The tunnel a [`snapshot`](Self::snapshot) belongs to, read from its header (to check,
    /// before restoring, that the configuration still has that tunnel as it was).
    pub fn snapshot_tunnel(bytes: &[u8]) -> Result<Option<TunnelId>, Error> {
        crate::snapshot::tunnel_of(bytes)
    }

    /// Starts tracking which IKE SAs' durable state changes, for
    /// [`take_state_changes`](Self::take_state_changes). Off by default, so that a node that
    /// never asks (a load generator, a test peer) keeps no record of it.
    pub fn track_state_changes(&mut self) {
        self.track = true;
    }

    /// What changed in the durable state of the IKE SAs since the last call (and since
    /// [`track_state_changes`](Self::track_state_changes)): for each IKE SA
    /// whose state (keys, SPIs, message IDs, CHILD_SAs, queued work, timers) changed, its new
    /// [`snapshot`](Self::snapshot); for each that had been reported and is gone (or no longer
    /// has state worth keeping), its removal. Half-open SAs are never reported, so a flood of
    /// IKE_SA_INIT requests causes no writes.
    ///
    /// A control node that must survive restarts writes these to its store *before* sending
    /// the datagrams of [`poll_transmit`](Self::poll_transmit): a response then never leaves
    /// unless the state it depends on (the message ID it used, the SAs it created) is durable.
    pub fn take_state_changes(&mut self, now: Instant) -> Vec<StateChange> {
        let mut changes = Vec::new();
        for spi in std::mem::take(&mut self.touched) {
            let current = self
                .sas
                .get(&spi)
                .and_then(|sa| crate::snapshot::encode(sa, self.epoch).map(|s| (sa, s)));
            match current {
                Some((sa, state)) => {
                    if self.saved.get(&spi).is_some_and(|old| **old == state) {
                        continue;
                    }
                    self.saved.insert(spi, Zeroizing::new(state));
                    if let Some(snapshot) = crate::snapshot::encode(sa, now) {
                        changes.push(StateChange::Saved {
                            spi,
                            ike: sa.spis,
                            tunnel: sa.tunnel,
                            snapshot: Zeroizing::new(snapshot),
                        });
                    }
                }
                None => {
                    if self.saved.remove(&spi).is_some() {
                        changes.push(StateChange::Removed { spi });
                    }
                }
            }
        }
        changes
    }

    /// Counters of dropped and refused datagrams by reason, since the endpoint was created.
    pub fn stats(&self) -> &IkeStats {
        &self.stats
    }

    /// Number of IKE SAs (any state), for metrics.
    pub fn ike_sa_count(&self) -> usize {
        self.sas.len()
    }

    /// Number of half-open responder IKE SAs (what the cookie threshold compares against).
    pub fn half_open_count(&self) -> usize {
        self.half_open
    }

    fn remember_closed(&mut self, now: Instant, spi: IkeSpi, message_id: u32, bytes: Vec<u8>) {
        if self.closed.len() >= MAX_CLOSED {
            self.closed.retain(|_, c| c.until > now);
            if self.closed.len() >= MAX_CLOSED {
                if let Some(oldest) = self
                    .closed
                    .iter()
                    .min_by_key(|(_, c)| c.until)
                    .map(|(k, _)| *k)
                {
                    self.closed.remove(&oldest);
                }
            }
        }
        let window: std::time::Duration = (0..=self.config.retransmit_tries)
            .map(|n| IkeSa::rto(&self.config, n))
            .sum();
        self.closed.insert(
            spi,
            Closed {
                message_id,
                bytes,
                until: now + window,
            },
        );
    }

    fn insert(&mut self, mut sa: IkeSa) {
        let spi = sa.spi;
        if self.track {
            self.touched.insert(spi);
        }
        Self::schedule(&mut self.timers, &mut sa);
        self.sas.insert(spi, sa);
    }

    fn schedule(timers: &mut BTreeSet<(Instant, IkeSpi)>, sa: &mut IkeSa) {
        let next = sa.next_timeout();
        if next == sa.scheduled {
            return;
        }
        if let Some(old) = sa.scheduled.take() {
            timers.remove(&(old, sa.spi));
        }
        if let Some(t) = next {
            timers.insert((t, sa.spi));
            sa.scheduled = Some(t);
        }
    }

    /// Runs `f` on the SA with our SPI `spi` (taken out of the table meanwhile), then files
    /// the SA back, removes it if it died, and applies what it asked of the endpoint.
    fn run(&mut self, now: Instant, spi: IkeSpi, f: impl FnOnce(&mut IkeSa, &mut Ctx<'_>)) {
        let Some(mut sa) = self.sas.remove(&spi) else {
            return;
        };
        {
            let mut ctx = ctx!(self, now);
            f(&mut sa, &mut ctx);
        }
        self.file(now, sa);
        self.settle(now);
    }

    fn file(&mut self, now: Instant, mut sa: IkeSa) {
        if self.track {
            self.touched.insert(sa.spi);
        }
        if sa.counted_half_open && !sa.is_half_open() {
            sa.counted_half_open = false;
            self.half_open = self.half_open.saturating_sub(1);
        }
        if sa.state == SaState::Dead {
            if let Some(old) = sa.scheduled.take() {
                self.timers.remove(&(old, sa.spi));
            }
            if let Some(k) = sa.half_open_key {
                if self.init_index.get(&k) == Some(&sa.spi) {
                    self.init_index.remove(&k);
                }
            }
            for c in &sa.children {
                self.esp_spis.remove(&c.inbound_spi.0);
            }
            if let Some((message_id, bytes)) = sa.last_response.take() {
                self.remember_closed(now, sa.spi, message_id, bytes);
            }
            if let Some(a) = sa.alias.take() {
                self.aliases.remove(&a);
            }
            return;
        }
        let dead_passive = sa
            .passive_rekey
            .as_mut()
            .filter(|p| p.new_sa.state == SaState::Dead);
        if let Some((spi, Some((message_id, bytes)))) =
            dead_passive.map(|p| (p.new_sa.spi, p.new_sa.last_response.take()))
        {
            self.remember_closed(now, spi, message_id, bytes);
        }
        let alias = sa
            .passive_rekey
            .as_ref()
            .filter(|p| p.new_sa.state != SaState::Dead)
            .map(|p| p.new_sa.spi);
        if alias != sa.alias {
            if let Some(old) = sa.alias.take() {
                self.aliases.remove(&old);
            }
            if let Some(a) = alias {
                self.aliases.insert(a, sa.spi);
                sa.alias = Some(a);
            }
        }
        Self::schedule(&mut self.timers, &mut sa);
        self.sas.insert(sa.spi, sa);
    }

    /// Applies the SA-level requests collected in the output: new SAs from rekeys,
    /// INITIAL_CONTACT deletions and DPD restarts.
    fn settle(&mut self, now: Instant) {
        loop {
            let new_sas = std::mem::take(&mut self.out.new_sas);
            let contacts = std::mem::take(&mut self.out.initial_contact);
            let restarts = std::mem::take(&mut self.out.reinitiate);
            if new_sas.is_empty() && contacts.is_empty() && restarts.is_empty() {
                return;
            }
            for sa in new_sas {
                let spi = sa.spi;
                self.insert(sa);
                self.run(now, spi, |sa, ctx| sa.start_next_task(ctx));
            }
            for (tunnel, keep) in contacts {
                // RFC 7296 §2.4: INITIAL_CONTACT - the peer has no other IKE SA with us; ours
                // are stale and deleted without notifying it.
                let stale: Vec<IkeSpi> = self
                    .sas
                    .values()
                    .filter(|sa| {
                        sa.tunnel == Some(tunnel)
                            && sa.spi != keep
                            && sa.state == SaState::Established
                    })
                    .map(|sa| sa.spi)
                    .collect();
                for spi in stale {
                    self.run(now, spi, |sa, ctx| sa.die(ctx, DeleteReason::PeerRequest));
                }
            }
            for tunnel in restarts {
                if let Err(e) = self.initiate(now, tunnel) {
                    debug!(?tunnel, error = %e, "cannot restart tunnel");
                }
            }
        }
    }
}
