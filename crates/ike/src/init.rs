//! The IKE_SA_INIT exchange (RFC 7296 §1.2, §2.6 cookies, §2.7 proposal selection, §2.10
//! nonces, §2.14 key derivation, §2.23 NAT detection) for both roles.
//!
//! The responder is stateless until a request is valid: it answers COOKIE, INVALID_KE_PAYLOAD,
//! NO_PROPOSAL_CHOSEN and INVALID_SYNTAX without creating an SA.

use crate::{
    config::PeerConfig,
    event::{DeleteReason, Event, IkeSpis},
    keys::{nat_hash, CookieSecrets, IkeKeys},
    proposal::{check_ike_response, ike_offer, select_ike},
    sa::{first_error, Ctx, IkeSa, Nat, Setup, Task},
    timer::Timer,
    Error, IkeDrop,
};
use crypto::{DhGroup, KeyExchange};
use std::net::{IpAddr, SocketAddr};
use tracing::{debug, info, warn};
use wire::ike::{
    find_notify, ExchangeType, Flags, Header, KePayload, Message, NoncePayload, NotifyPayload,
    NotifyType, Payload, SaPayload,
};
use wire::IkeSpi;

/// The NAT-T port (RFC 3948, RFC 7296 §2.23).
pub(crate) const NATT_PORT: u16 = 4500;

/// How often we follow a COOKIE or INVALID_KE_PAYLOAD answer before giving up.
const MAX_INIT_RETRIES: u8 = 3;

/// Initiator state while IKE_SA_INIT is outstanding ("expect IKE_SA_INIT response").
pub(crate) struct InitTask {
    ke: KeyExchange,
    cookie: Option<Vec<u8>>,
    retries: u8,
}

/// Exactly one payload of a kind, or an error naming it.
macro_rules! one {
    ($payloads:expr, $variant:ident, $spi:expr, $ex:expr, $what:expr) => {{
        let mut it = $payloads.iter().filter_map(|p| match p {
            Payload::$variant(x) => Some(x),
            _ => None,
        });
        match (it.next(), it.next()) {
            (Some(x), None) => Ok(x),
            _ => Err(Error::InvalidSyntax {
                spi: $spi,
                exchange: $ex,
                what: $what,
            }),
        }
    }};
}
pub(crate) use one;

/// The NAT_DETECTION_SOURCE_IP data we send: the real hash, or a random one to fake a NAT
/// (`force_encap`, as strongSwan's `encap = yes`).
fn our_source_hash(ctx: &mut Ctx<'_>, spi_i: u64, spi_r: u64, local: SocketAddr) -> Vec<u8> {
    if ctx.config.force_encap {
        let mut h = vec![0u8; 20];
        ctx.rng.fill(&mut h);
        h
    } else {
        nat_hash(spi_i, spi_r, local)
    }
}

/// Evaluates the peer's NAT_DETECTION_* notifies (RFC 7296 §2.23). `None` if the peer sent
/// none (no NAT-T support).
fn detect_nat(
    payloads: &[Payload],
    spi_i: u64,
    spi_r: u64,
    local: SocketAddr,
    remote: SocketAddr,
) -> Option<Nat> {
    let mut src = crate::sa::notifies(payloads)
        .filter(|n| n.ty == NotifyType::NAT_DETECTION_SOURCE_IP)
        .peekable();
    let dst = find_notify(payloads, NotifyType::NAT_DETECTION_DESTINATION_IP)?;
    src.peek()?;
    let remote_hash = nat_hash(spi_i, spi_r, remote);
    let local_hash = nat_hash(spi_i, spi_r, local);
    let remote_ok = src.any(|n| n.data == remote_hash);
    Some(Nat {
        local: dst.data != local_hash,
        remote: !remote_ok,
    })
}

impl IkeSa {
    /// Creates an initiator SA and sends IKE_SA_INIT.
    pub(crate) fn initiate(
        ctx: &mut Ctx<'_>,
        cfg: &PeerConfig,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Result<IkeSa, Error> {
        let spi = ctx.alloc_ike_spi();
        let group = cfg
            .ike_proposals
            .first()
            .and_then(|p| p.dh.first())
            .copied()
            .ok_or(Error::Config {
                what: "IKE proposal",
                value: cfg.name.clone(),
                reason: "no proposals".into(),
            })?;
        let spis = IkeSpis {
            initiator: spi,
            responder: IkeSpi(0),
        };
        let mut sa = IkeSa::blank(ctx.now, spi, spis, true, local, remote);
        sa.tunnel = Some(cfg.id);
        sa.ni = ctx.nonce();
        let ke = KeyExchange::generate(group, ctx.rng);
        info!(ispi = %spi, tunnel = cfg.name, %remote, "initiating IKE SA");
        ctx.out.events.push_back(Event::IkeSaConnecting {
            tunnel: Some(cfg.id),
            ike: spis,
            remote,
        });
        sa.send_init(
            ctx,
            cfg,
            InitTask {
                ke,
                cookie: None,
                retries: 0,
            },
        );
        Ok(sa)
    }

    fn send_init(&mut self, ctx: &mut Ctx<'_>, cfg: &PeerConfig, task: InitTask) {
        let mut payloads = Vec::new();
        if let Some(c) = &task.cookie {
            // RFC 7296 §2.6: the COOKIE notify MUST be the first payload of the retried request.
            payloads.push(Payload::Notify(NotifyPayload::new(
                NotifyType::COOKIE,
                c.clone(),
            )));
        }
        payloads.push(Payload::Sa(SaPayload {
            proposals: ike_offer(&cfg.ike_proposals, &[], Some(task.ke.group())),
        }));
        payloads.push(Payload::Ke(KePayload {
            group: task.ke.group().id().0,
            data: task.ke.public_value(),
        }));
        payloads.push(Payload::Nonce(NoncePayload {
            data: self.ni.clone(),
        }));
        let src = our_source_hash(ctx, self.spis.initiator.0, 0, self.local);
        payloads.push(Payload::Notify(NotifyPayload::new(
            NotifyType::NAT_DETECTION_SOURCE_IP,
            src,
        )));
        let dst = nat_hash(self.spis.initiator.0, 0, self.remote);
        payloads.push(Payload::Notify(NotifyPayload::new(
            NotifyType::NAT_DETECTION_DESTINATION_IP,
            dst,
        )));
        let header = Header::new(
            self.spis.initiator,
            IkeSpi(0),
            ExchangeType::IKE_SA_INIT,
            Flags::new(true, false),
            0,
        );
        let msg = Message {
            header,
            payloads,
            encrypted: None,
        };
        let mut bytes = Vec::new();
        if let Err(e) = msg.emit(&mut bytes) {
            warn!(ispi = %self.spis.initiator, error = %e, "cannot encode IKE_SA_INIT");
            self.die(ctx, DeleteReason::NegotiationFailed);
            return;
        }
        self.next_request_id = 1;
        self.start_request(ctx, 0, ExchangeType::IKE_SA_INIT, bytes, Task::Init(task));
    }

    /// Processes the IKE_SA_INIT response (`task` already taken out of the request slot).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_init_response(
        &mut self,
        ctx: &mut Ctx<'_>,
        local: SocketAddr,
        remote: SocketAddr,
        data: &[u8],
        msg: &Message,
        mut task: InitTask,
        request: Vec<u8>,
    ) {
        let peers = ctx.peers;
        let Some(cfg) = self.peer_config(peers) else {
            self.die(ctx, DeleteReason::LocalRequest);
            return;
        };
        if let Some(c) = msg.notify(NotifyType::COOKIE) {
            // RFC 7296 §2.6: retry with the cookie, same SPI, nonce and KE.
            if task.retries < MAX_INIT_RETRIES && (1..=64).contains(&c.data.len()) {
                debug!(ispi = %self.spis.initiator, "responder demands a cookie");
                task.cookie = Some(c.data.clone());
                task.retries += 1;
                self.send_init(ctx, cfg, task);
            } else {
                self.die(ctx, DeleteReason::NegotiationFailed);
            }
            return;
        }
        if let Some(n) = msg.notify(NotifyType::INVALID_KE_PAYLOAD) {
            let wanted = <[u8; 2]>::try_from(n.data.as_slice())
                .ok()
                .and_then(|b| DhGroup::from_id(crypto::transform::KeId(u16::from_be_bytes(b))));
            match wanted {
                Some(g)
                    if task.retries < MAX_INIT_RETRIES
                        && g != task.ke.group()
                        && cfg.ike_proposals.iter().any(|p| p.dh.contains(&g)) =>
                {
                    // RFC 7296 §1.2/§2.6.1: retry with the requested group (same SPI, as
                    // strongSwan does; the cookie, if any, is kept).
                    info!(ispi = %self.spis.initiator, group = ?g, "responder wants another key exchange group");
                    task.ke = KeyExchange::generate(g, ctx.rng);
                    task.retries += 1;
                    self.send_init(ctx, cfg, task);
                }
                _ => {
                    warn!(ispi = %self.spis.initiator, "unacceptable INVALID_KE_PAYLOAD");
                    self.die(ctx, DeleteReason::NegotiationFailed);
                }
            }
            return;
        }
        if let Err(what) = crate::rules::check(ExchangeType::IKE_SA_INIT, true, &msg.payloads) {
            warn!(ispi = %self.spis.initiator, what, "invalid IKE_SA_INIT response");
            ctx.stats.count(IkeDrop::InitInvalid);
            self.die(ctx, DeleteReason::NegotiationFailed);
            return;
        }
        if let Some(n) = first_error(&msg.payloads) {
            warn!(ispi = %self.spis.initiator, notify = %n.ty, "IKE_SA_INIT refused");
            self.die(ctx, DeleteReason::NegotiationFailed);
            return;
        }
        match self.complete_init(ctx, cfg, (local, remote), data, msg, &task, request) {
            Ok(()) => self.start_auth(ctx),
            Err(e) => {
                warn!(ispi = %self.spis.initiator, error = %e, "invalid IKE_SA_INIT response");
                ctx.stats.count(IkeDrop::InitInvalid);
                self.die(ctx, DeleteReason::NegotiationFailed);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn complete_init(
        &mut self,
        ctx: &mut Ctx<'_>,
        cfg: &PeerConfig,
        (local, remote): (SocketAddr, SocketAddr),
        data: &[u8],
        msg: &Message,
        task: &InitTask,
        request: Vec<u8>,
    ) -> Result<(), Error> {
        let ex = "IKE_SA_INIT";
        let spi = self.spi;
        if msg.header.rspi.0 == 0 {
            return Err(Error::InvalidSyntax {
                spi,
                exchange: ex,
                what: "responder SPI is zero",
            });
        }
        let sa = one!(msg.payloads, Sa, spi, ex, "SA")?;
        let ke = one!(msg.payloads, Ke, spi, ex, "KE")?;
        let nr = one!(msg.payloads, Nonce, spi, ex, "Nonce")?;
        let algs = check_ike_response(&cfg.ike_proposals, &sa.proposals, 0)?;
        if algs.dh != task.ke.group() || ke.group != algs.dh.id().0 {
            return Err(Error::InvalidSyntax {
                spi,
                exchange: ex,
                what: "KE group differs from the proposal",
            });
        }
        let g_ir = task
            .ke
            .shared_secret(&ke.data)
            .map_err(|source| Error::Crypto { spi, source })?;
        self.spis.responder = msg.header.rspi;
        self.nr = nr.data.clone();
        let skeyseed = algs.prf.skeyseed(&self.ni, &self.nr, &g_ir);
        let keys = IkeKeys::derive(
            algs,
            &skeyseed,
            &self.ni,
            &self.nr,
            self.spis.initiator.0,
            self.spis.responder.0,
        )
        .map_err(|source| Error::Crypto { spi, source })?;
        self.keys = Some(keys);
        self.setup = Some(Setup {
            our_init: request,
            peer_init: data.to_vec(),
        });
        if let Some(mut nat) = detect_nat(
            &msg.payloads,
            self.spis.initiator.0,
            self.spis.responder.0,
            local,
            remote,
        ) {
            nat.local |= ctx.config.force_encap;
            self.nat = nat;
        }
        self.local = local;
        self.remote = remote;
        if self.nat.any() {
            // RFC 7296 §2.23: after detecting a NAT the initiator MUST move to port 4500.
            self.local.set_port(NATT_PORT);
            if self.remote.port() == 500 {
                self.remote.set_port(NATT_PORT);
            }
        }
        self.log_keys(ctx);
        Ok(())
    }

    /// Emits the Wireshark `ikev2_decryption_table` line when the key log is enabled.
    pub(crate) fn log_keys(&self, ctx: &mut Ctx<'_>) {
        if !ctx.config.key_log {
            return;
        }
        let Some(keys) = &self.keys else { return };
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let [ai, ar, ei, er] = keys.sk_a_e();
        let encr = match keys.algs.encr {
            crypto::Encr::AesCbc128 => "AES-CBC-128 [RFC3602]",
            crypto::Encr::AesCbc256 => "AES-CBC-256 [RFC3602]",
            crypto::Encr::AesGcm16_128 => "AES-GCM-128 with 16 octet ICV [RFC5282]",
            crypto::Encr::AesGcm16_256 => "AES-GCM-256 with 16 octet ICV [RFC5282]",
            crypto::Encr::ChaCha20Poly1305 => "ChaCha20-Poly1305 [RFC7634]",
        };
        let integ = match keys.algs.integ {
            None => "NONE [RFC4306]",
            Some(crypto::Integ::HmacSha1_96) => "HMAC_SHA1_96 [RFC2404]",
            Some(crypto::Integ::HmacSha256_128) => "HMAC_SHA2_256_128 [RFC4868]",
            Some(crypto::Integ::HmacSha384_192) => "HMAC_SHA2_384_192 [RFC4868]",
            Some(crypto::Integ::HmacSha512_256) => "HMAC_SHA2_512_256 [RFC4868]",
        };
        let line = format!(
            "{:016x},{:016x},{},{},\"{}\",{},{},\"{}\"",
            self.spis.initiator.0,
            self.spis.responder.0,
            hex(ei),
            hex(er),
            encr,
            hex(ai),
            hex(ar),
            integ
        );
        ctx.out.events.push_back(Event::KeyLog {
            ike: self.spis,
            line,
        });
    }
}

/// How well a tunnel's addresses match a peer: `None` if they exclude it, higher is better.
pub(crate) fn address_match(cfg: &PeerConfig, local: IpAddr, remote: IpAddr) -> Option<u8> {
    if !cfg.local_addrs.is_empty() && !cfg.local_addrs.contains(&local) {
        return None;
    }
    if cfg.remote_addrs.is_empty() {
        Some(0)
    } else if cfg.remote_addrs.contains(&remote) {
        Some(1)
    } else {
        None
    }
}

/// Tunnels whose addresses admit the peer, best match first.
pub(crate) fn candidates<'p>(ctx: &Ctx<'p>, local: IpAddr, remote: IpAddr) -> Vec<&'p PeerConfig> {
    let mut v: Vec<(u8, &PeerConfig)> = ctx
        .peers
        .values()
        .filter_map(|c| address_match(c, local, remote).map(|s| (s, c)))
        .collect();
    v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.id.cmp(&b.1.id)));
    v.into_iter().map(|(_, c)| c).collect()
}

fn stateless_reply(
    ctx: &mut Ctx<'_>,
    local: SocketAddr,
    remote: SocketAddr,
    request: &Header,
    notify: NotifyPayload,
) {
    let header = Header::new(
        request.ispi,
        IkeSpi(0),
        ExchangeType::IKE_SA_INIT,
        Flags::new(false, true),
        0,
    );
    let msg = Message {
        header,
        payloads: vec![Payload::Notify(notify)],
        encrypted: None,
    };
    let mut bytes = Vec::new();
    if msg.emit(&mut bytes).is_ok() {
        ctx.send(local, remote, bytes);
    }
}

/// Answers an IKE_SA_INIT request that failed to parse with `error` (stateless).
pub(crate) fn reject_unparsable(
    ctx: &mut Ctx<'_>,
    local: SocketAddr,
    remote: SocketAddr,
    header: &Header,
    error: &Error,
) {
    if let Some(ty) = error.notify() {
        stateless_reply(
            ctx,
            local,
            remote,
            header,
            NotifyPayload::new(ty, error.notify_data()),
        );
    }
}

/// Processes a new IKE_SA_INIT request. Returns the half-open SA if the request was valid and
/// answered; otherwise answers statelessly (or drops) and returns `None`.
pub(crate) fn respond_init(
    ctx: &mut Ctx<'_>,
    cookies: &CookieSecrets,
    demand_cookie: bool,
    local: SocketAddr,
    remote: SocketAddr,
    data: &[u8],
    msg: &Message,
) -> Option<IkeSa> {
    let ex = "IKE_SA_INIT";
    let h = &msg.header;
    // RFC 7296 §3.1: the initial request has message ID 0, the I flag, and a zero responder SPI.
    if h.message_id != 0
        || !h.flags.initiator()
        || h.rspi.0 != 0
        || h.ispi.0 == 0
        || msg.encrypted.is_some()
    {
        debug!(%remote, "dropping IKE_SA_INIT request with invalid header fields");
        ctx.stats.count(IkeDrop::Malformed);
        return None;
    }
    let spi0 = IkeSpi(0);
    if let Err(what) = crate::rules::check(ExchangeType::IKE_SA_INIT, false, &msg.payloads) {
        let e = Error::InvalidSyntax {
            spi: spi0,
            exchange: ex,
            what,
        };
        debug!(%remote, error = %e, "rejecting IKE_SA_INIT");
        ctx.stats.count(IkeDrop::InitInvalid);
        reject_unparsable(ctx, local, remote, h, &e);
        return None;
    }
    let parts = (|| {
        Ok::<_, Error>((
            one!(msg.payloads, Sa, spi0, ex, "SA")?,
            one!(msg.payloads, Ke, spi0, ex, "KE")?,
            one!(msg.payloads, Nonce, spi0, ex, "Nonce")?,
        ))
    })();
    let (sa, ke, ni) = match parts {
        Ok(p) => p,
        Err(e) => {
            debug!(%remote, error = %e, "rejecting IKE_SA_INIT");
            ctx.stats.count(IkeDrop::InitInvalid);
            reject_unparsable(ctx, local, remote, h, &e);
            return None;
        }
    };
    if demand_cookie {
        let ok = msg
            .notify(NotifyType::COOKIE)
            .is_some_and(|c| cookies.verify(&c.data, &ni.data, remote.ip(), h.ispi.0));
        if !ok {
            debug!(%remote, "demanding a cookie");
            ctx.stats.count(IkeDrop::InitCookieDemanded);
            let cookie = cookies.make(&ni.data, remote.ip(), h.ispi.0);
            stateless_reply(
                ctx,
                local,
                remote,
                h,
                NotifyPayload::new(NotifyType::COOKIE, cookie),
            );
            return None;
        }
    }
    let mut chosen = None;
    for cfg in candidates(ctx, local.ip(), remote.ip()) {
        if let Ok((algs, resp)) = select_ike(&cfg.ike_proposals, &sa.proposals, Some(ke.group), 0) {
            chosen = Some((cfg, algs, resp));
            break;
        }
    }
    let Some((cfg, algs, resp)) = chosen else {
        debug!(%remote, "no acceptable IKE proposal");
        ctx.stats.count(IkeDrop::InitNoProposal);
        stateless_reply(
            ctx,
            local,
            remote,
            h,
            NotifyPayload::new(NotifyType::NO_PROPOSAL_CHOSEN, vec![]),
        );
        return None;
    };
    if ke.group != algs.dh.id().0 {
        // RFC 7296 §1.2: the responder MUST reject a KE of another group with
        // INVALID_KE_PAYLOAD naming the group it wants.
        let e = Error::InvalidKePayload { wanted: algs.dh };
        debug!(%remote, wanted = ?algs.dh, "invalid KE payload group");
        ctx.stats.count(IkeDrop::InitInvalidKe);
        stateless_reply(
            ctx,
            local,
            remote,
            h,
            NotifyPayload::new(NotifyType::INVALID_KE_PAYLOAD, e.notify_data()),
        );
        return None;
    }
    let our_ke = KeyExchange::generate(algs.dh, ctx.rng);
    let g_ir = match our_ke.shared_secret(&ke.data) {
        Ok(s) => s,
        Err(source) => {
            let e = Error::Crypto { spi: spi0, source };
            debug!(%remote, error = %e, "bad KE public value");
            ctx.stats.count(IkeDrop::InitInvalid);
            reject_unparsable(ctx, local, remote, h, &e);
            return None;
        }
    };
    let spi = ctx.alloc_ike_spi();
    let spis = IkeSpis {
        initiator: h.ispi,
        responder: spi,
    };
    let mut new = IkeSa::blank(ctx.now, spi, spis, false, local, remote);
    new.candidate = Some(cfg.id);
    new.ni = ni.data.clone();
    new.nr = ctx.nonce();
    let skeyseed = algs.prf.skeyseed(&new.ni, &new.nr, &g_ir);
    match IkeKeys::derive(
        algs,
        &skeyseed,
        &new.ni,
        &new.nr,
        spis.initiator.0,
        spis.responder.0,
    ) {
        Ok(k) => new.keys = Some(k),
        Err(e) => {
            warn!(error = %e, "cannot key IKE SA");
            ctx.stats.count(IkeDrop::InitInvalid);
            return None;
        }
    }
    if let Some(mut nat) = detect_nat(&msg.payloads, h.ispi.0, 0, local, remote) {
        nat.local |= ctx.config.force_encap;
        new.nat = nat;
    }
    let mut resp = resp;
    resp.spi.clear();
    let mut payloads = vec![
        Payload::Sa(SaPayload {
            proposals: vec![resp],
        }),
        Payload::Ke(KePayload {
            group: algs.dh.id().0,
            data: our_ke.public_value(),
        }),
        Payload::Nonce(NoncePayload {
            data: new.nr.clone(),
        }),
    ];
    if find_notify(&msg.payloads, NotifyType::NAT_DETECTION_SOURCE_IP).is_some() {
        let src = our_source_hash(ctx, spis.initiator.0, spis.responder.0, local);
        payloads.push(Payload::Notify(NotifyPayload::new(
            NotifyType::NAT_DETECTION_SOURCE_IP,
            src,
        )));
        let dst = nat_hash(spis.initiator.0, spis.responder.0, remote);
        payloads.push(Payload::Notify(NotifyPayload::new(
            NotifyType::NAT_DETECTION_DESTINATION_IP,
            dst,
        )));
    }
    let header = Header::new(
        spis.initiator,
        spis.responder,
        ExchangeType::IKE_SA_INIT,
        Flags::new(false, true),
        0,
    );
    let reply = Message {
        header,
        payloads,
        encrypted: None,
    };
    let mut bytes = Vec::new();
    if let Err(e) = reply.emit(&mut bytes) {
        warn!(error = %e, "cannot encode IKE_SA_INIT response");
        ctx.stats.count(IkeDrop::InitInvalid);
        return None;
    }
    ctx.send(local, remote, bytes.clone());
    new.setup = Some(Setup {
        our_init: bytes.clone(),
        peer_init: data.to_vec(),
    });
    new.last_response = Some((0, bytes));
    new.next_peer_id = 1;
    new.last_received = ctx.now;
    new.last_sent = ctx.now;
    new.half_open_key = Some((h.ispi, remote));
    new.timers.set(
        Timer::HalfOpenExpiry,
        ctx.now + ctx.config.half_open_timeout,
    );
    info!(ispi = %spis.initiator, rspi = %spis.responder, %remote, proposal = algs.name(), "IKE_SA_INIT answered");
    ctx.out.events.push_back(Event::IkeSaConnecting {
        tunnel: None,
        ike: spis,
        remote,
    });
    new.log_keys(ctx);
    Some(new)
}
