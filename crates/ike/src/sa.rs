//! One IKE SA: its state, keys, message IDs, CHILD_SAs, timers and the exchange it has in
//! flight (RFC 7296 §1, §2.1-§2.4). Exchange-specific logic lives in the sibling modules
//! (`init`, `auth`, `child`, `ike_rekey`, `info`), each adding `impl IkeSa` blocks.
//!
//! Message IDs (§2.2): we use a window of one in both directions (we never send
//! SET_WINDOW_SIZE), so at most one request of ours is outstanding ([`IkeSa::active`]) and
//! further work waits in [`IkeSa::queue`]; the peer's requests must arrive in order.

use crate::{
    auth::AuthTask,
    child::ChildTask,
    config::{EndpointConfig, PeerConfig, TunnelId},
    event::{DeleteReason, Event, IkeSaState, IkeSpis},
    ike_rekey::{IkeRekeyTask, PassiveIkeRekey},
    init::InitTask,
    keys::{ChildKeyMat, IkeKeys},
    proposal::EspAlgs,
    timer::{ChildTimer, ChildTimers, Timer, TimerTable},
    Error, Identity, IkeDrop, IkeStats, TrafficSelector,
};
use crypto::Rng;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};
use wire::ike::{ExchangeType, Flags, Header, Message, Payload};
use wire::{EspSpi, IkeSpi};

/// A datagram queued for the driver.
#[derive(Debug)]
pub(crate) struct Datagram {
    pub(crate) local: SocketAddr,
    pub(crate) remote: SocketAddr,
    pub(crate) data: Vec<u8>,
}

/// What processing produced besides changes to the SA itself.
#[derive(Default)]
pub(crate) struct Output {
    pub(crate) tx: VecDeque<Datagram>,
    pub(crate) events: VecDeque<Event>,
    /// IKE SAs created by a rekey, to be added to the endpoint.
    pub(crate) new_sas: Vec<IkeSa>,
    /// INITIAL_CONTACT received on the SA with this SPI for this tunnel: delete the others.
    pub(crate) initial_contact: Vec<(TunnelId, IkeSpi)>,
    /// Tunnels to initiate again (DPD action restart).
    pub(crate) reinitiate: Vec<TunnelId>,
}

/// Everything an IKE SA needs from its endpoint while it processes input.
pub(crate) struct Ctx<'a> {
    pub(crate) now: Instant,
    pub(crate) config: &'a EndpointConfig,
    pub(crate) rng: &'a mut dyn Rng,
    pub(crate) peers: &'a BTreeMap<TunnelId, PeerConfig>,
    /// The other IKE SAs (the one being processed is taken out of the map meanwhile).
    pub(crate) others: &'a HashMap<IkeSpi, IkeSa>,
    /// Inbound ESP SPIs in use on this node.
    pub(crate) esp_spis: &'a mut HashSet<u32>,
    pub(crate) out: &'a mut Output,
    /// The endpoint's drop counters.
    pub(crate) stats: &'a mut IkeStats,
}

impl Ctx<'_> {
    /// Queues a datagram.
    pub(crate) fn send(&mut self, local: SocketAddr, remote: SocketAddr, data: Vec<u8>) {
        self.out.tx.push_back(Datagram {
            local,
            remote,
            data,
        });
    }

    /// A fresh nonce (32 bytes: at least half the key size of every supported PRF and within
    /// RFC 7296 §2.10's 16..=256).
    pub(crate) fn nonce(&mut self) -> Vec<u8> {
        let mut n = vec![0u8; 32];
        self.rng.fill(&mut n);
        n
    }

    /// A new IKE SPI not used by any IKE SA of this endpoint (RFC 7296 §2.6: non-zero).
    pub(crate) fn alloc_ike_spi(&mut self) -> IkeSpi {
        loop {
            let spi = IkeSpi(self.rng.next_u64());
            if spi.0 != 0
                && !self.others.contains_key(&spi)
                && !self.out.new_sas.iter().any(|s| s.spi == spi)
            {
                return spi;
            }
        }
    }

    /// A new inbound ESP SPI, unique on this node and outside the reserved 0..=255.
    pub(crate) fn alloc_esp_spi(&mut self) -> EspSpi {
        loop {
            let spi = self.rng.next_u32() | 0xc000_0000;
            if self.esp_spis.insert(spi) {
                return EspSpi(spi);
            }
        }
    }

    /// A random duration in `0..=max`.
    pub(crate) fn jitter(&mut self, max: Duration) -> Duration {
        let ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
        if ms == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis(self.rng.next_u64() % (ms + 1))
    }
}

/// Life-cycle state of an IKE SA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SaState {
    /// IKE_SA_INIT / IKE_AUTH in progress.
    Connecting,
    /// Authenticated.
    Established,
    /// Replaced by a rekeyed IKE SA; waits for (or sends) the DELETE.
    Rekeyed,
    /// Being deleted by us.
    Deleting,
    /// Gone: the endpoint removes it.
    Dead,
}

/// State of a CHILD_SA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChildState {
    /// Usable.
    Installed,
    /// We are rekeying it.
    Rekeying,
    /// Replaced; waiting for its DELETE exchange.
    Rekeyed,
    /// We are deleting it.
    Deleting,
}

/// One CHILD_SA pair.
pub(crate) struct ChildSa {
    pub(crate) inbound_spi: EspSpi,
    pub(crate) outbound_spi: EspSpi,
    pub(crate) algs: EspAlgs,
    pub(crate) keys: ChildKeyMat,
    /// Our role in the exchange that created it (decides which keys are inbound).
    pub(crate) keys_initiator: bool,
    pub(crate) local_ts: Vec<TrafficSelector>,
    pub(crate) remote_ts: Vec<TrafficSelector>,
    pub(crate) state: ChildState,
    pub(crate) installed_at: Instant,
    pub(crate) timers: ChildTimers,
    /// For a CHILD_SA the peer created by rekeying: the SA it replaces. Until the peer deletes
    /// that one, its rekey may not be complete on its side (our answer may be lost), so we do
    /// not rekey this one yet.
    pub(crate) predecessor: Option<EspSpi>,
    /// Negotiated with SA_RESOURCE_INFO (RFC 9611): one of a group of per-resource CHILD_SAs
    /// with these selectors. A rekey keeps it (without the notify, as strongSwan does).
    pub(crate) resource: bool,
}

/// Data kept from IKE_SA_INIT until IKE_AUTH completes (for the AUTH payloads, §2.15).
pub(crate) struct Setup {
    /// Our IKE_SA_INIT message as last sent.
    pub(crate) our_init: Vec<u8>,
    /// The peer's IKE_SA_INIT message.
    pub(crate) peer_init: Vec<u8>,
}

/// NAT detection results (RFC 7296 §2.23).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Nat {
    /// We are behind a NAT (or fake one, `force_encap`).
    pub(crate) local: bool,
    /// The peer is behind a NAT.
    pub(crate) remote: bool,
}

impl Nat {
    pub(crate) fn any(self) -> bool {
        self.local || self.remote
    }
}

/// Work waiting for the request slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pending {
    /// Rekey the CHILD_SA with this inbound SPI.
    RekeyChild(EspSpi),
    /// Create an additional CHILD_SA from the tunnel's configuration.
    CreateChild,
    /// Create one more CHILD_SA with the tunnel's selectors beside those in use (parallel
    /// CHILD_SAs, `Endpoint::add_child`); never merged with another queued one.
    AddChild,
    /// Rekey the IKE SA.
    RekeyIke,
    /// Delete CHILD_SAs (inbound SPIs).
    DeleteChildren(Vec<EspSpi>, DeleteReason),
    /// Delete the IKE SA.
    DeleteIke(DeleteReason),
    /// Liveness check.
    Dpd,
}

/// The exchange our outstanding request belongs to.
pub(crate) enum Task {
    Init(InitTask),
    Auth(Box<AuthTask>),
    Child(Box<ChildTask>),
    IkeRekey(Box<IkeRekeyTask>),
    DeleteChildren(Vec<EspSpi>, DeleteReason),
    DeleteIke(DeleteReason),
    Dpd,
    /// A request restored from a snapshot without its exchange state: it is retransmitted and
    /// its answer accepted, but not interpreted.
    Orphan,
}

impl Task {
    fn name(&self) -> &'static str {
        match self {
            Task::Init(_) => "IKE_SA_INIT",
            Task::Auth(_) => "IKE_AUTH",
            Task::Child(_) => "CREATE_CHILD_SA",
            Task::IkeRekey(_) => "IKE rekey",
            Task::DeleteChildren(..) => "CHILD_SA delete",
            Task::DeleteIke(_) => "IKE delete",
            Task::Dpd => "DPD",
            Task::Orphan => "restored request",
        }
    }
}

/// Our outstanding request.
pub(crate) struct Active {
    pub(crate) id: u32,
    pub(crate) exchange: ExchangeType,
    /// The datagram as sent (retransmitted verbatim, RFC 7296 §2.1).
    pub(crate) bytes: Vec<u8>,
    pub(crate) retransmits: u32,
    pub(crate) task: Task,
}

/// One IKE SA.
pub(crate) struct IkeSa {
    /// Our SPI (the key of the endpoint's table).
    pub(crate) spi: IkeSpi,
    pub(crate) spis: IkeSpis,
    /// True if we are the original initiator.
    pub(crate) initiator: bool,
    pub(crate) tunnel: Option<TunnelId>,
    pub(crate) local: SocketAddr,
    pub(crate) remote: SocketAddr,
    pub(crate) state: SaState,
    pub(crate) setup: Option<Setup>,
    pub(crate) keys: Option<IkeKeys>,
    pub(crate) ni: Vec<u8>,
    pub(crate) nr: Vec<u8>,
    pub(crate) nat: Nat,
    /// Message ID of our next request.
    pub(crate) next_request_id: u32,
    /// Message ID of the peer's next request.
    pub(crate) next_peer_id: u32,
    /// The last response we sent: (message ID, datagram), resent for retransmitted requests.
    pub(crate) last_response: Option<(u32, Vec<u8>)>,
    pub(crate) active: Option<Active>,
    pub(crate) queue: VecDeque<Pending>,
    pub(crate) deferred: Vec<(Instant, Pending)>,
    pub(crate) children: Vec<ChildSa>,
    pub(crate) timers: TimerTable,
    pub(crate) established: Option<Instant>,
    pub(crate) last_received: Instant,
    pub(crate) last_sent: Instant,
    /// Counter for deterministic IVs of the SK payload.
    pub(crate) iv_counter: u64,
    pub(crate) peer_id: Option<Identity>,
    /// A rekey of this IKE SA the peer started while ours was in flight (§2.8.2).
    pub(crate) passive_rekey: Option<Box<PassiveIkeRekey>>,
    /// Counted in the endpoint's half-open total.
    pub(crate) counted_half_open: bool,
    /// Deadline registered in the endpoint's timer index.
    pub(crate) scheduled: Option<Instant>,
    /// The SPI under which the endpoint routes to our pending collision SA.
    pub(crate) alias: Option<IkeSpi>,
    /// Tunnel the responder guessed from addresses at IKE_SA_INIT.
    pub(crate) candidate: Option<TunnelId>,
    /// The peer's IKE_SA_INIT SPI, for the endpoint's retransmission index.
    pub(crate) half_open_key: Option<(IkeSpi, SocketAddr)>,
}

impl IkeSa {
    /// A bare SA; the `init` module fills it in.
    pub(crate) fn blank(
        now: Instant,
        spi: IkeSpi,
        spis: IkeSpis,
        initiator: bool,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Self {
        Self {
            spi,
            spis,
            initiator,
            tunnel: None,
            local,
            remote,
            state: SaState::Connecting,
            setup: None,
            keys: None,
            ni: Vec::new(),
            nr: Vec::new(),
            nat: Nat::default(),
            next_request_id: 0,
            next_peer_id: 0,
            last_response: None,
            active: None,
            queue: VecDeque::new(),
            deferred: Vec::new(),
            children: Vec::new(),
            timers: TimerTable::default(),
            established: None,
            last_received: now,
            last_sent: now,
            iv_counter: 0,
            peer_id: None,
            passive_rekey: None,
            counted_half_open: false,
            scheduled: None,
            candidate: None,
            half_open_key: None,
            alias: None,
        }
    }

    /// The tunnel's configuration, if the tunnel is known and still configured.
    pub(crate) fn peer_config<'p>(
        &self,
        peers: &'p BTreeMap<TunnelId, PeerConfig>,
    ) -> Option<&'p PeerConfig> {
        self.tunnel.and_then(|t| peers.get(&t))
    }

    /// True while this SA is a responder's half-open SA (IKE_SA_INIT answered, no IKE_AUTH).
    pub(crate) fn is_half_open(&self) -> bool {
        !self.initiator && self.state == SaState::Connecting
    }

    /// Status for `Endpoint::status`.
    pub(crate) fn status_state(&self) -> IkeSaState {
        match self.state {
            SaState::Connecting => IkeSaState::Connecting,
            SaState::Established
                if self
                    .active
                    .as_ref()
                    .is_some_and(|a| matches!(a.task, Task::IkeRekey(_))) =>
            {
                IkeSaState::Rekeying
            }
            SaState::Established => IkeSaState::Established,
            SaState::Rekeyed => IkeSaState::Rekeying,
            SaState::Deleting | SaState::Dead => IkeSaState::Deleting,
        }
    }

    /// The earliest timer of the SA and its CHILD_SAs.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        let ike = self.timers.next_timeout();
        let child = self
            .children
            .iter()
            .filter_map(|c| c.timers.next_timeout())
            .min();
        match (ike, child) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub(crate) fn header(&self, exchange: ExchangeType, id: u32, response: bool) -> Header {
        Header::new(
            self.spis.initiator,
            self.spis.responder,
            exchange,
            Flags::new(self.initiator, response),
            id,
        )
    }

    /// Retransmission timeout after `n` retransmissions: timeout * base^n.
    pub(crate) fn rto(config: &EndpointConfig, n: u32) -> Duration {
        let f = config
            .retransmit_base
            .max(1.0)
            .powi(i32::try_from(n).unwrap_or(i32::MAX));
        config.retransmit_timeout.mul_f64(f.min(1e6))
    }

    /// Sends a protected request and makes it the outstanding one.
    pub(crate) fn send_request(
        &mut self,
        ctx: &mut Ctx<'_>,
        exchange: ExchangeType,
        payloads: &[Payload],
        task: Task,
    ) -> Result<(), Error> {
        let id = self.next_request_id;
        let bytes = self.protect(exchange, id, false, payloads)?;
        self.next_request_id = self.next_request_id.wrapping_add(1);
        self.start_request(ctx, id, exchange, bytes, task);
        Ok(())
    }

    /// Sends `bytes` as the outstanding request `id`.
    pub(crate) fn start_request(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u32,
        exchange: ExchangeType,
        bytes: Vec<u8>,
        task: Task,
    ) {
        debug!(ispi = %self.spis.initiator, rspi = %self.spis.responder, id, task = task.name(), "sending request");
        ctx.send(self.local, self.remote, bytes.clone());
        self.last_sent = ctx.now;
        self.timers
            .set(Timer::Retransmit, ctx.now + Self::rto(ctx.config, 0));
        self.active = Some(Active {
            id,
            exchange,
            bytes,
            retransmits: 0,
            task,
        });
    }

    /// Sends a protected response to the peer's request `id` and caches it.
    pub(crate) fn send_response(
        &mut self,
        ctx: &mut Ctx<'_>,
        exchange: ExchangeType,
        id: u32,
        payloads: &[Payload],
    ) {
        match self.protect(exchange, id, true, payloads) {
            Ok(bytes) => {
                ctx.send(self.local, self.remote, bytes.clone());
                self.last_sent = ctx.now;
                self.last_response = Some((id, bytes));
            }
            Err(e) => warn!(ispi = %self.spis.initiator, error = %e, "cannot build response"),
        }
    }

    /// Handles a datagram addressed to this SA (header already parsed into `msg`).
    pub(crate) fn handle(
        &mut self,
        ctx: &mut Ctx<'_>,
        local: SocketAddr,
        remote: SocketAddr,
        data: &[u8],
        msg: Message,
    ) {
        if self.state == SaState::Dead {
            ctx.stats.count(IkeDrop::UnknownSpi);
            return;
        }
        // The I flag names the original initiator; the peer's must be the opposite of ours.
        if msg.header.flags.initiator() == self.initiator {
            debug!(ispi = %self.spis.initiator, "dropping message with wrong I flag");
            ctx.stats.count(IkeDrop::Malformed);
            return;
        }
        if msg.header.flags.response() {
            self.handle_response(ctx, local, remote, data, msg);
        } else {
            self.handle_request(ctx, local, remote, data, msg);
        }
        self.start_next_task(ctx);
    }

    /// Hands an INFORMATIONAL request to the new SA of a pending rekey collision.
    pub(crate) fn handle_for_passive(
        &mut self,
        ctx: &mut Ctx<'_>,
        local: SocketAddr,
        remote: SocketAddr,
        data: &[u8],
        msg: Message,
    ) {
        if let Some(p) = self.passive_rekey.as_mut() {
            // Until the collision is concluded it is a rekey leftover, not a live SA.
            p.new_sa.state = SaState::Rekeyed;
            p.new_sa.handle(ctx, local, remote, data, msg);
            if p.new_sa.state == SaState::Dead {
                debug!(ispi = %self.spis.initiator, "the peer deleted the new SA of its losing rekey");
            } else {
                p.new_sa.state = SaState::Established;
            }
        }
    }

    fn handle_response(
        &mut self,
        ctx: &mut Ctx<'_>,
        local: SocketAddr,
        remote: SocketAddr,
        data: &[u8],
        msg: Message,
    ) {
        let Some(active) = self.active.as_ref() else {
            debug!(ispi = %self.spis.initiator, id = msg.header.message_id, "dropping response without a request");
            ctx.stats.count(IkeDrop::UnexpectedResponse);
            return;
        };
        // RFC 7296 §2.2: a response whose Message ID does not match the outstanding request
        // is dropped.
        if active.id != msg.header.message_id || active.exchange != msg.header.exchange {
            debug!(ispi = %self.spis.initiator, id = msg.header.message_id, "dropping unexpected response");
            ctx.stats.count(IkeDrop::UnexpectedResponse);
            return;
        }
        if msg.header.exchange == ExchangeType::IKE_SA_INIT {
            let Some(Active {
                task: Task::Init(task),
                bytes,
                ..
            }) = self.active.take()
            else {
                return;
            };
            self.timers.stop(Timer::Retransmit);
            self.on_init_response(ctx, local, remote, data, &msg, task, bytes);
            return;
        }
        let payloads = match self.unprotect(data, &msg) {
            Ok(p) => p,
            Err(e) => {
                debug!(ispi = %self.spis.initiator, error = %e, "dropping response that does not verify");
                ctx.stats.count(crate::stats::unprotect_failure(&e));
                return;
            }
        };
        if let Err(what) = crate::rules::check(msg.header.exchange, true, &payloads) {
            debug!(ispi = %self.spis.initiator, what, "dropping malformed response");
            ctx.stats.count(IkeDrop::Malformed);
            return;
        }
        let Some(active) = self.active.take() else {
            return;
        };
        self.timers.stop(Timer::Retransmit);
        self.authenticated_input(ctx, local, remote);
        match active.task {
            Task::Init(_) => {}
            Task::Auth(t) => self.on_auth_response(ctx, &payloads, *t),
            Task::Child(t) => self.on_child_response(ctx, &payloads, *t),
            Task::IkeRekey(t) => self.on_ike_rekey_response(ctx, &payloads, *t),
            Task::DeleteChildren(spis, reason) => {
                self.on_delete_children_response(ctx, &payloads, &spis, reason)
            }
            Task::DeleteIke(reason) => self.die(ctx, reason),
            Task::Dpd => {
                if let Some(tunnel) = self.tunnel {
                    ctx.out.events.push_back(Event::LivenessConfirmed {
                        tunnel,
                        ike: self.spis,
                    });
                }
            }
            Task::Orphan => {}
        }
    }

    fn handle_request(
        &mut self,
        ctx: &mut Ctx<'_>,
        local: SocketAddr,
        remote: SocketAddr,
        data: &[u8],
        msg: Message,
    ) {
        let id = msg.header.message_id;
        if msg.header.exchange == ExchangeType::IKE_SA_INIT {
            // RFC 7296 §3.1: an IKE_SA_INIT request carries a zero responder SPI.
            ctx.stats.count(IkeDrop::Malformed);
            return;
        }
        if self.keys.is_none() {
            ctx.stats.count(IkeDrop::OutsideWindow);
            return;
        }
        // RFC 7296 §2.1: a retransmitted request is answered with the cached response, without
        // processing it again. We check the ICV first so forged copies cannot trigger resends.
        if let Some((last_id, bytes)) = &self.last_response {
            if *last_id == id {
                match self.unprotect(data, &msg) {
                    Ok(_) => {
                        debug!(ispi = %self.spis.initiator, id, "retransmitting cached response");
                        ctx.send(self.local, self.remote, bytes.clone());
                        ctx.stats.count(IkeDrop::RetransmitAnswered);
                    }
                    Err(e) => {
                        debug!(ispi = %self.spis.initiator, id, error = %e, "dropping retransmission that does not verify");
                        ctx.stats.count(crate::stats::unprotect_failure(&e));
                    }
                }
                return;
            }
        }
        if id != self.next_peer_id {
            debug!(ispi = %self.spis.initiator, id, expected = self.next_peer_id, "dropping request outside the window");
            ctx.stats.count(IkeDrop::OutsideWindow);
            return;
        }
        let payloads = match self.unprotect(data, &msg) {
            Ok(p) => p,
            Err(e @ Error::Malformed { .. }) => {
                // Authentic (it decrypted) but undecodable: answer INVALID_SYNTAX or
                // UNSUPPORTED_CRITICAL_PAYLOAD (RFC 7296 §2.5, §2.21.2).
                debug!(ispi = %self.spis.initiator, error = %e, "answering malformed request");
                ctx.stats.count(IkeDrop::Malformed);
                self.next_peer_id = self.next_peer_id.wrapping_add(1);
                self.send_response(ctx, msg.header.exchange, id, &[error_notify(&e)]);
                return;
            }
            Err(e) => {
                // RFC 7296 §2.21.1: messages failing integrity checks are dropped silently.
                debug!(ispi = %self.spis.initiator, error = %e, "dropping request that does not verify");
                ctx.stats.count(crate::stats::unprotect_failure(&e));
                return;
            }
        };
        self.next_peer_id = self.next_peer_id.wrapping_add(1);
        self.authenticated_input(ctx, local, remote);
        if let Err(what) = crate::rules::check(msg.header.exchange, false, &payloads) {
            let e = Error::InvalidSyntax {
                spi: self.spi,
                exchange: "request",
                what,
            };
            debug!(ispi = %self.spis.initiator, error = %e, "answering INVALID_SYNTAX");
            ctx.stats.count(IkeDrop::Malformed);
            self.send_response(ctx, msg.header.exchange, id, &[error_notify(&e)]);
            return;
        }
        match msg.header.exchange {
            ExchangeType::IKE_AUTH => self.on_auth_request(ctx, id, &payloads),
            ExchangeType::CREATE_CHILD_SA => self.on_create_child_request(ctx, id, &payloads),
            ExchangeType::INFORMATIONAL => self.on_informational_request(ctx, id, &payloads),
            other => {
                debug!(ispi = %self.spis.initiator, exchange = %other, "unsupported exchange, answering empty");
                self.send_response(ctx, other, id, &[]);
            }
        }
    }

    /// Bookkeeping for every authenticated message: liveness and NAT rebinding. RFC 7296 §2.23:
    /// the peer's address is updated only from authenticated messages that are not
    /// retransmissions, and only when a NAT was detected.
    fn authenticated_input(&mut self, ctx: &mut Ctx<'_>, local: SocketAddr, remote: SocketAddr) {
        self.last_received = ctx.now;
        if let Some(delay) = self.peer_config(ctx.peers).and_then(|c| c.dpd_delay) {
            if self.state == SaState::Established {
                self.timers.set(Timer::Dpd, ctx.now + delay);
            }
        }
        self.follow_peer(ctx, local, remote);
    }

    /// Moves the SA to the addresses of an authenticated packet (IKE, or ESP of one of its
    /// CHILD_SAs) when they changed behind a NAT (RFC 7296 §2.23).
    pub(crate) fn follow_peer(&mut self, ctx: &mut Ctx<'_>, local: SocketAddr, remote: SocketAddr) {
        if local != self.local {
            self.local = local;
        }
        if remote != self.remote && (self.nat.any() || self.state == SaState::Connecting) {
            info!(ispi = %self.spis.initiator, old = %self.remote, new = %remote, "peer address changed");
            self.remote = remote;
            if let (Some(tunnel), false) = (self.tunnel, self.children.is_empty()) {
                ctx.out.events.push_back(Event::PeerAddressChanged {
                    tunnel,
                    ike: self.spis,
                    local: self.local,
                    remote: self.remote,
                });
            }
        }
    }

    /// Removes the SA: reports every CHILD_SA and the IKE SA as deleted.
    pub(crate) fn die(&mut self, ctx: &mut Ctx<'_>, reason: DeleteReason) {
        if self.state == SaState::Dead {
            return;
        }
        info!(ispi = %self.spis.initiator, rspi = %self.spis.responder, ?reason, "IKE SA deleted");
        for c in self.children.drain(..) {
            ctx.esp_spis.remove(&c.inbound_spi.0);
            if let Some(tunnel) = self.tunnel {
                ctx.out.events.push_back(Event::ChildSaDeleted {
                    tunnel,
                    inbound_spi: c.inbound_spi,
                    outbound_spi: c.outbound_spi,
                    reason,
                });
            }
        }
        ctx.out.events.push_back(Event::IkeSaDeleted {
            tunnel: self.tunnel,
            ike: self.spis,
            reason,
        });
        self.state = SaState::Dead;
        self.active = None;
        self.queue.clear();
        self.deferred.clear();
        self.timers = TimerTable::default();
        if reason == DeleteReason::DpdTimeout {
            if let Some(cfg) = self.peer_config(ctx.peers) {
                if cfg.dpd_action == crate::DpdAction::Restart && !cfg.remote_addrs.is_empty() {
                    ctx.out.reinitiate.push(cfg.id);
                }
            }
        }
    }

    /// Queues work unless the same work is already queued or in flight.
    pub(crate) fn enqueue(&mut self, p: Pending) {
        if p != Pending::AddChild && self.queue.contains(&p) {
            return;
        }
        let in_flight = match (&p, self.active.as_ref().map(|a| &a.task)) {
            (Pending::RekeyIke, Some(Task::IkeRekey(_))) | (Pending::Dpd, Some(Task::Dpd)) => true,
            (Pending::RekeyChild(s), Some(Task::Child(t))) => t.rekeys() == Some(*s),
            _ => false,
        };
        if in_flight {
            return;
        }
        match p {
            // Deleting the IKE SA supersedes everything else.
            Pending::DeleteIke(_) => {
                self.queue.clear();
                self.queue.push_back(p);
            }
            Pending::DeleteChildren(..) => self.queue.push_front(p),
            _ => self.queue.push_back(p),
        }
    }

    /// Starts the next queued exchange if the request slot is free.
    pub(crate) fn start_next_task(&mut self, ctx: &mut Ctx<'_>) {
        while self.active.is_none() && self.state != SaState::Dead {
            let Some(p) = self.queue.pop_front() else {
                return;
            };
            let allowed = match self.state {
                SaState::Established => true,
                SaState::Rekeyed | SaState::Deleting => {
                    matches!(p, Pending::DeleteIke(_) | Pending::DeleteChildren(..))
                }
                SaState::Connecting | SaState::Dead => false,
            };
            if !allowed {
                if p == Pending::AddChild {
                    self.child_refused(ctx, wire::ike::NotifyType::TEMPORARY_FAILURE);
                }
                continue;
            }
            let result = match p {
                Pending::RekeyChild(spi) => self.start_child_rekey(ctx, spi),
                Pending::CreateChild => self.start_child_create(ctx),
                Pending::AddChild => self.start_child_add(ctx),
                Pending::RekeyIke => self.start_ike_rekey(ctx),
                Pending::DeleteChildren(spis, reason) => {
                    self.start_delete_children(ctx, spis, reason)
                }
                Pending::DeleteIke(reason) => self.start_delete_ike(ctx, reason),
                Pending::Dpd => self.send_request(ctx, ExchangeType::INFORMATIONAL, &[], Task::Dpd),
            };
            if let Err(e) = result {
                warn!(ispi = %self.spis.initiator, error = %e, "cannot start exchange");
            }
        }
    }

    /// Runs the timers that are due.
    pub(crate) fn handle_timeout(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        if self.timers.take_expired(Timer::Retransmit, now) {
            self.retransmit(ctx);
        }
        if self.state == SaState::Dead {
            return;
        }
        if self.timers.take_expired(Timer::HalfOpenExpiry, now) && self.state == SaState::Connecting
        {
            debug!(ispi = %self.spis.initiator, "half-open IKE SA expired");
            self.die(ctx, DeleteReason::NegotiationFailed);
            return;
        }
        if self.timers.take_expired(Timer::DeleteTimeout, now) {
            // A rekeyed or redundant SA whose DELETE never came: destroy it silently.
            let reason = if self.state == SaState::Rekeyed {
                DeleteReason::Rekeyed
            } else {
                DeleteReason::LocalRequest
            };
            self.die(ctx, reason);
            return;
        }
        if self.timers.take_expired(Timer::TaskRetry, now) {
            let (due, later): (Vec<_>, Vec<_>) =
                self.deferred.drain(..).partition(|(t, _)| *t <= now);
            self.deferred = later;
            for (_, p) in due {
                self.enqueue(p);
            }
            if let Some(t) = self.deferred.iter().map(|(t, _)| *t).min() {
                self.timers.set(Timer::TaskRetry, t);
            }
        }
        if self.state == SaState::Established {
            self.established_timers(ctx);
        } else {
            // Liveness, rekeying, keepalives and CHILD_SA lifetimes only matter while
            // established; a deleting SA drops them instead of leaving them due forever.
            for t in [
                Timer::Dpd,
                Timer::IkeRekey,
                Timer::NatKeepalive,
                Timer::IkeExpire,
            ] {
                self.timers.take_expired(t, now);
            }
            for c in &mut self.children {
                c.timers.take_expired(ChildTimer::Rekey, now);
                c.timers.take_expired(ChildTimer::Expire, now);
            }
        }
        self.start_next_task(ctx);
    }

    fn established_timers(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now;
        let cfg = self.peer_config(ctx.peers);
        if self.timers.take_expired(Timer::Dpd, now) {
            if let Some(delay) = cfg.and_then(|c| c.dpd_delay) {
                let idle = now.saturating_duration_since(self.last_received);
                if idle >= delay && self.active.is_none() {
                    self.enqueue(Pending::Dpd);
                    self.timers.set(Timer::Dpd, now + delay);
                } else {
                    self.timers
                        .set(Timer::Dpd, self.last_received.max(now) + delay);
                }
            }
        }
        if self.timers.take_expired(Timer::IkeRekey, now) {
            self.enqueue(Pending::RekeyIke);
        }
        if self.timers.take_expired(Timer::IkeExpire, now) {
            // RFC 7296 §2.8: keys must not be used past their lifetime. The rekey did not
            // succeed in `over_time`: delete the IKE SA (and its CHILD_SAs), as strongSwan does.
            warn!(ispi = %self.spis.initiator, "IKE SA reached its hard lifetime without a rekey, deleting it");
            self.enqueue(Pending::DeleteIke(DeleteReason::Expired));
        }
        if self.timers.take_expired(Timer::NatKeepalive, now) {
            let interval = ctx.config.nat_keepalive;
            if now.saturating_duration_since(self.last_sent) >= interval {
                // RFC 3948 §2.3: a NAT-keepalive is a single octet 0xFF.
                ctx.send(self.local, self.remote, vec![0xFF]);
                self.last_sent = now;
            }
            self.timers
                .set(Timer::NatKeepalive, self.last_sent + interval);
        }
        let mut expired = Vec::new();
        let mut rekey = Vec::new();
        for c in &mut self.children {
            if c.timers.take_expired(ChildTimer::Expire, now) {
                expired.push(c.inbound_spi);
            }
            if c.timers.take_expired(ChildTimer::Rekey, now) && c.state == ChildState::Installed {
                rekey.push(c.inbound_spi);
            }
        }
        if !expired.is_empty() {
            self.enqueue(Pending::DeleteChildren(expired, DeleteReason::Expired));
        }
        for spi in rekey {
            self.enqueue(Pending::RekeyChild(spi));
        }
    }

    fn retransmit(&mut self, ctx: &mut Ctx<'_>) {
        let Some(active) = self.active.as_mut() else {
            return;
        };
        if active.retransmits >= ctx.config.retransmit_tries {
            let reason = match active.task {
                Task::Dpd => DeleteReason::DpdTimeout,
                _ => DeleteReason::RetransmitLimit,
            };
            let reason = match active.task {
                // A DELETE that is never answered still ends the SA, for the reason it had.
                Task::DeleteIke(r) => r,
                _ => reason,
            };
            warn!(ispi = %self.spis.initiator, id = active.id, "giving up after {} retransmissions", active.retransmits);
            self.die(ctx, reason);
            return;
        }
        active.retransmits += 1;
        debug!(ispi = %self.spis.initiator, id = active.id, n = active.retransmits, "retransmitting request");
        let bytes = active.bytes.clone();
        let n = active.retransmits;
        ctx.send(self.local, self.remote, bytes);
        self.last_sent = ctx.now;
        self.timers
            .set(Timer::Retransmit, ctx.now + Self::rto(ctx.config, n));
    }

    /// Marks the SA established: timers for rekey, DPD and keepalives (RFC 7296 §2.4, §2.8).
    pub(crate) fn arm_established_timers(&mut self, ctx: &mut Ctx<'_>) {
        let Some(cfg) = self.peer_config(ctx.peers) else {
            return;
        };
        let (rekey, rand, dpd) = (cfg.ike_rekey_time, cfg.rand_time, cfg.dpd_delay);
        let over = cfg.ike_over_time;
        if !rekey.is_zero() {
            let jitter = ctx.jitter(rand.min(rekey / 2));
            let soft = ctx.now + rekey - jitter;
            self.timers.set(Timer::IkeRekey, soft);
            if !over.is_zero() {
                self.timers.set(Timer::IkeExpire, soft + over);
            }
        }
        if let Some(d) = dpd {
            self.timers.set(Timer::Dpd, ctx.now + d);
        }
        if self.nat.local && !ctx.config.nat_keepalive.is_zero() {
            self.timers
                .set(Timer::NatKeepalive, ctx.now + ctx.config.nat_keepalive);
        }
        self.timers.stop(Timer::HalfOpenExpiry);
    }

    /// Defers `p` by a random 1..=5 s (after TEMPORARY_FAILURE, RFC 7296 §2.25). An IKE SA
    /// rekey is retried at the latest halfway to the SA's hard lifetime, so that a short
    /// `over_time` leaves room for another attempt.
    pub(crate) fn defer(&mut self, ctx: &mut Ctx<'_>, p: Pending) {
        let mut at = ctx.now + Duration::from_secs(1) + ctx.jitter(Duration::from_secs(4));
        if let (Pending::RekeyIke, Some(hard)) = (&p, self.timers.get(Timer::IkeExpire)) {
            let half = hard.saturating_duration_since(ctx.now) / 2;
            // Not in the last few round trips: no burst of retries just before the deadline.
            if half >= Duration::from_millis(100) {
                at = at.min(ctx.now + half);
            }
        }
        self.deferred.push((at, p));
        let next = self.deferred.iter().map(|(t, _)| *t).min().unwrap_or(at);
        self.timers.set(Timer::TaskRetry, next);
    }
}

/// The notify payload answering a request that failed with `e`.
pub(crate) fn error_notify(e: &Error) -> Payload {
    Payload::Notify(wire::ike::NotifyPayload::new(
        e.notify().unwrap_or(wire::ike::NotifyType::INVALID_SYNTAX),
        e.notify_data(),
    ))
}

/// The notifies in a payload list.
pub(crate) fn notifies(payloads: &[Payload]) -> impl Iterator<Item = &wire::ike::NotifyPayload> {
    payloads.iter().filter_map(|p| match p {
        Payload::Notify(n) => Some(n),
        _ => None,
    })
}

/// The first error notify in a payload list.
pub(crate) fn first_error(payloads: &[Payload]) -> Option<&wire::ike::NotifyPayload> {
    notifies(payloads).find(|n| n.ty.is_error())
}
