//! CHILD_SAs: negotiation shared by IKE_AUTH and CREATE_CHILD_SA (RFC 7296 §1.3.1, §2.9
//! traffic selector narrowing, §2.17 KEYMAT), creation of additional CHILD_SAs, and CHILD_SA
//! rekeying (§1.3.3, §2.8) including simultaneous rekeys (§2.8.1): the exchange whose lower
//! nonce is the smallest of the four produced the redundant SA, which its initiator deletes.
//!
//! Per-resource CHILD_SAs (RFC 9611): every new CHILD_SA we ask for (IKE_AUTH's included)
//! carries SA_RESOURCE_INFO when the tunnel allows them (`resource_sas` > 0), and one the peer
//! asks for with it is answered with it, up to `resource_sas` per IKE SA (then TS_MAX_QUEUE).
//! Both sides then hold a group of CHILD_SAs with the same selectors that each side may spread
//! its sending over (a peer's CPUs, our data nodes). Rekeys carry no SA_RESOURCE_INFO and keep
//! the flag, as strongSwan does. A peer that does not answer with it gets a plain parallel
//! CHILD_SA (RFC 7296 §1.3.1), as before.
//!
//! The old CHILD_SA stays installed until the new one is: the data path gets
//! `ChildSaInstalled { replaces: Some(old) }` first and `ChildSaDeleted` for the old one only
//! when its DELETE exchange is done. The rekey's initiator sends on the new SA at once (the peer
//! installed it before answering); its responder only once the old one is deleted
//! (`outbound_active: false`), since the initiator installs the new SA when the answer arrives.

use crate::{
    config::PeerConfig,
    event::{ChildSaInfo, DeleteReason, Event},
    keys::ChildKeyMat,
    proposal::{check_esp_response, esp_offer, select_esp},
    sa::{error_notify, first_error, ChildSa, ChildState, Ctx, IkeSa, Pending, SaState, Task},
    timer::{ChildTimer, ChildTimers},
    Error, TrafficSelector,
};
use crypto::{DhGroup, KeyExchange};
use tracing::{debug, info, warn};
use wire::ike::{
    find_notify, ExchangeType, KePayload, NoncePayload, NotifyPayload, NotifyType, Payload,
    ProtocolId, SaPayload, TsPayload,
};
use wire::EspSpi;

/// A rekey of the same CHILD_SA that the peer completed while ours was in flight.
pub(crate) struct PassiveChild {
    /// Inbound SPI of the CHILD_SA the peer's exchange created.
    pub(crate) inbound_spi: EspSpi,
    /// The lower of that exchange's two nonces.
    pub(crate) lower_nonce: Vec<u8>,
}

/// Our outstanding CREATE_CHILD_SA for a CHILD_SA ("expect CREATE_CHILD_SA response").
pub(crate) struct ChildTask {
    /// The CHILD_SA being rekeyed (its inbound SPI), or None for a new one.
    pub(crate) rekey: Option<EspSpi>,
    /// Our inbound SPI for the new CHILD_SA.
    pub(crate) spi: EspSpi,
    pub(crate) ni: Vec<u8>,
    pub(crate) ke: Option<KeyExchange>,
    pub(crate) local_ts: Vec<TrafficSelector>,
    pub(crate) remote_ts: Vec<TrafficSelector>,
    pub(crate) collision: Option<PassiveChild>,
    /// The peer deleted the CHILD_SA we are rekeying meanwhile.
    pub(crate) old_deleted: bool,
    /// SPIs of DELETEs for CHILD_SAs unknown to us that arrived meanwhile: the peer may have
    /// deleted the very SA this exchange creates before its answer reached us.
    pub(crate) deleted_spis: Vec<u32>,
    pub(crate) retries: u8,
    /// A new CHILD_SA: we offered SA_RESOURCE_INFO (the tunnel allows RFC 9611). A rekey:
    /// the CHILD_SA it replaces is a per-resource one (kept here: the peer may delete that
    /// one before the answer arrives).
    pub(crate) resource: bool,
}

impl ChildTask {
    /// The CHILD_SA this task rekeys.
    pub(crate) fn rekeys(&self) -> Option<EspSpi> {
        self.rekey
    }
}

/// RFC 7296 §2.9 narrowing: the intersections of the proposed selectors with ours, without
/// selectors already covered by another (the peer's first selector may be the specific
/// packet's one, which the broader ones then include).
pub(crate) fn narrow(
    proposed: &[TrafficSelector],
    ours: &[TrafficSelector],
) -> Vec<TrafficSelector> {
    let mut out: Vec<TrafficSelector> = Vec::new();
    for p in proposed {
        for o in ours {
            if let Some(x) = p.intersect(o) {
                if out.iter().any(|e| x.is_subset_of(e)) {
                    continue;
                }
                out.retain(|e| !e.is_subset_of(&x));
                out.push(x);
            }
        }
    }
    out
}

/// True if every selector of `got` lies within one of `offered` (checking a narrowed answer).
fn within(got: &[TrafficSelector], offered: &[TrafficSelector]) -> bool {
    !got.is_empty()
        && got
            .iter()
            .all(|g| offered.iter().any(|o| g.is_subset_of(o)))
}

/// Lexicographic comparison over the common length, as strongSwan compares nonces.
pub(crate) fn nonce_less(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().min(b.len());
    a[..n] < b[..n]
}

/// The lower of two nonces.
pub(crate) fn lower_nonce(a: &[u8], b: &[u8]) -> Vec<u8> {
    if nonce_less(a, b) {
        a.to_vec()
    } else {
        b.to_vec()
    }
}

fn ts_payloads(tsi: &[TrafficSelector], tsr: &[TrafficSelector]) -> [Payload; 2] {
    [
        Payload::TsI(TsPayload {
            selectors: tsi.to_vec(),
        }),
        Payload::TsR(TsPayload {
            selectors: tsr.to_vec(),
        }),
    ]
}

/// The SA, TSi and TSr payloads of a request proposing a CHILD_SA.
pub(crate) fn offer_payloads(
    cfg: &PeerConfig,
    spi: EspSpi,
    pfs: bool,
    group: Option<DhGroup>,
    local: &[TrafficSelector],
    remote: &[TrafficSelector],
) -> (Payload, [Payload; 2]) {
    (
        Payload::Sa(SaPayload {
            proposals: esp_offer(&cfg.esp_proposals, spi.0, pfs, group),
        }),
        ts_payloads(local, remote),
    )
}

/// The SA_RESOURCE_INFO notify we send (RFC 9611 §3.1), offering or accepting a per-resource
/// CHILD_SA. It names no resource: the identifier is opaque to the peer, and the data node that
/// will hold the CHILD_SA is chosen only once it is installed.
pub(crate) fn resource_info() -> Payload {
    Payload::Notify(NotifyPayload::new(NotifyType::SA_RESOURCE_INFO, Vec::new()))
}

fn one_ts(payloads: &[Payload], initiator: bool) -> Option<&TsPayload> {
    let mut it = payloads.iter().filter_map(|p| match (p, initiator) {
        (Payload::TsI(t), true) | (Payload::TsR(t), false) => Some(t),
        _ => None,
    });
    match (it.next(), it.next()) {
        (Some(t), None) => Some(t),
        _ => None,
    }
}

fn to_config_ts(t: &TsPayload) -> Vec<TrafficSelector> {
    t.selectors.clone()
}

impl IkeSa {
    /// Responder side of RFC 9611 for a new CHILD_SA the peer asks for (not a rekey): true if
    /// it becomes a per-resource one (the peer sent SA_RESOURCE_INFO and the tunnel allows
    /// them), [`Error::TsMaxQueue`] if this IKE SA holds as many as the tunnel allows.
    pub(crate) fn resource_request(
        &self,
        cfg: &PeerConfig,
        payloads: &[Payload],
    ) -> Result<bool, Error> {
        if cfg.resource_sas == 0 || find_notify(payloads, NotifyType::SA_RESOURCE_INFO).is_none() {
            return Ok(false);
        }
        // A CHILD_SA and the replacement the peer's rekey made for it count once.
        let held = self
            .children
            .iter()
            .filter(|c| {
                c.resource && matches!(c.state, ChildState::Installed | ChildState::Rekeying)
            })
            .filter(|c| {
                c.predecessor
                    .is_none_or(|p| !self.children.iter().any(|o| o.inbound_spi == p))
            })
            .count();
        if held >= cfg.resource_sas as usize {
            return Err(Error::TsMaxQueue(cfg.resource_sas));
        }
        Ok(true)
    }

    /// Initiator side of RFC 9611: the new CHILD_SA is a per-resource one if we offered it and
    /// the peer's answer accepted it with SA_RESOURCE_INFO.
    pub(crate) fn resource_answer(offered: bool, payloads: &[Payload]) -> bool {
        offered && find_notify(payloads, NotifyType::SA_RESOURCE_INFO).is_some()
    }

    /// The peer refused a new CHILD_SA we asked for: tell the driver.
    pub(crate) fn child_refused(&self, ctx: &mut Ctx<'_>, notify: NotifyType) {
        if let Some(tunnel) = self.tunnel {
            ctx.out.events.push_back(Event::ChildSaRefused {
                tunnel,
                ike: self.spis,
                notify,
            });
        }
    }

    /// Responder side of CHILD_SA negotiation. `ni`/`nr` are the exchange's nonces (those of
    /// IKE_SA_INIT when called from IKE_AUTH); `pfs` is false in IKE_AUTH. Returns the SA,
    /// [KEr], TSi, TSr payloads of the answer and the CHILD_SA.
    pub(crate) fn negotiate_child_responder(
        &mut self,
        ctx: &mut Ctx<'_>,
        cfg: &PeerConfig,
        payloads: &[Payload],
        ni: &[u8],
        nr: &[u8],
        pfs: bool,
    ) -> Result<(Vec<Payload>, ChildSa), Error> {
        let spi = self.spi;
        let ex = if pfs { "CREATE_CHILD_SA" } else { "IKE_AUTH" };
        let sa = crate::init::one!(payloads, Sa, spi, ex, "SA")?;
        let tsi = one_ts(payloads, true).ok_or(Error::InvalidSyntax {
            spi,
            exchange: ex,
            what: "TSi",
        })?;
        let tsr = one_ts(payloads, false).ok_or(Error::InvalidSyntax {
            spi,
            exchange: ex,
            what: "TSr",
        })?;
        let ke = payloads.iter().find_map(|p| match p {
            Payload::Ke(k) => Some(k),
            _ => None,
        });
        let choice = select_esp(
            &cfg.esp_proposals,
            &sa.proposals,
            ke.filter(|_| pfs).map(|k| k.group),
            pfs,
        )?;
        let mut out = Vec::new();
        let mut g_ir = None;
        let mut ke_payload = None;
        if let Some(g) = choice.algs.dh {
            let k = ke
                .filter(|k| k.group == g.id().0)
                .ok_or(Error::InvalidKePayload { wanted: g })?;
            let ours = KeyExchange::generate(g, ctx.rng);
            g_ir = Some(
                ours.shared_secret(&k.data)
                    .map_err(|source| Error::Crypto { spi, source })?,
            );
            ke_payload = Some(Payload::Ke(KePayload {
                group: g.id().0,
                data: ours.public_value(),
            }));
        }
        // TSi is the initiator's (the peer's) side, TSr ours.
        let remote_ts = narrow(&to_config_ts(tsi), &cfg.remote_ts);
        let local_ts = narrow(&to_config_ts(tsr), &cfg.local_ts);
        if remote_ts.is_empty() || local_ts.is_empty() {
            return Err(Error::TsUnacceptable);
        }
        let keys_ref = self.keys.as_ref().ok_or(Error::InvalidSyntax {
            spi,
            exchange: ex,
            what: "no keys",
        })?;
        let keys = ChildKeyMat::derive(
            keys_ref.algs.prf,
            keys_ref.sk_d(),
            &choice.algs,
            g_ir.as_deref().map(|v| &v[..]),
            ni,
            nr,
        );
        let our_spi = ctx.alloc_esp_spi();
        let mut proposal = choice.proposal;
        proposal.spi = our_spi.0.to_be_bytes().to_vec();
        out.push(Payload::Sa(SaPayload {
            proposals: vec![proposal],
        }));
        if let Some(k) = ke_payload {
            out.push(k);
        }
        out.extend(ts_payloads(&remote_ts, &local_ts));
        let child = ChildSa {
            inbound_spi: our_spi,
            outbound_spi: EspSpi(choice.peer_spi),
            algs: choice.algs,
            keys,
            keys_initiator: false,
            local_ts,
            remote_ts,
            state: ChildState::Installed,
            installed_at: ctx.now,
            timers: ChildTimers::default(),
            predecessor: None,
            resource: false,
        };
        Ok((out, child))
    }

    /// Initiator side: checks the answer to our CHILD_SA proposal and derives the keys.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn complete_child_initiator(
        &mut self,
        ctx: &mut Ctx<'_>,
        cfg: &PeerConfig,
        spi: EspSpi,
        offered: (&[TrafficSelector], &[TrafficSelector]),
        ke: Option<&KeyExchange>,
        payloads: &[Payload],
        ni: &[u8],
        nr: &[u8],
        pfs: bool,
    ) -> Result<ChildSa, Error> {
        let sspi = self.spi;
        let ex = if pfs { "CREATE_CHILD_SA" } else { "IKE_AUTH" };
        let sa = crate::init::one!(payloads, Sa, sspi, ex, "SA")?;
        let tsi = one_ts(payloads, true).ok_or(Error::InvalidSyntax {
            spi: sspi,
            exchange: ex,
            what: "TSi",
        })?;
        let tsr = one_ts(payloads, false).ok_or(Error::InvalidSyntax {
            spi: sspi,
            exchange: ex,
            what: "TSr",
        })?;
        let choice = check_esp_response(&cfg.esp_proposals, &sa.proposals, pfs)?;
        let mut g_ir = None;
        if let Some(g) = choice.algs.dh {
            let ours = ke
                .filter(|k| k.group() == g)
                .ok_or(Error::NoProposalChosen { what: "ESP" })?;
            let theirs = payloads
                .iter()
                .find_map(|p| match p {
                    Payload::Ke(k) if k.group == g.id().0 => Some(k),
                    _ => None,
                })
                .ok_or(Error::InvalidSyntax {
                    spi: sspi,
                    exchange: ex,
                    what: "KE",
                })?;
            g_ir = Some(
                ours.shared_secret(&theirs.data)
                    .map_err(|source| Error::Crypto { spi: sspi, source })?,
            );
        }
        let local_ts = to_config_ts(tsi);
        let remote_ts = to_config_ts(tsr);
        // RFC 7296 §2.9: the responder may only narrow what we proposed.
        if !within(&local_ts, offered.0) || !within(&remote_ts, offered.1) {
            return Err(Error::TsUnacceptable);
        }
        let keys_ref = self.keys.as_ref().ok_or(Error::InvalidSyntax {
            spi: sspi,
            exchange: ex,
            what: "no keys",
        })?;
        let keys = ChildKeyMat::derive(
            keys_ref.algs.prf,
            keys_ref.sk_d(),
            &choice.algs,
            g_ir.as_deref().map(|v| &v[..]),
            ni,
            nr,
        );
        Ok(ChildSa {
            inbound_spi: spi,
            outbound_spi: EspSpi(choice.peer_spi),
            algs: choice.algs,
            keys,
            keys_initiator: true,
            local_ts,
            remote_ts,
            state: ChildState::Installed,
            installed_at: ctx.now,
            timers: ChildTimers::default(),
            predecessor: None,
            resource: false,
        })
    }

    /// Installs a CHILD_SA: lifetimes from the tunnel configuration and the event for the
    /// data path. `outbound_active`: the data path sends on it at once (false only when we
    /// answered the peer's rekey, see [`ChildSaInfo::outbound_active`]).
    pub(crate) fn install_child(
        &mut self,
        ctx: &mut Ctx<'_>,
        mut child: ChildSa,
        replaces: Option<EspSpi>,
        outbound_active: bool,
    ) {
        let Some(cfg) = self.peer_config(ctx.peers) else {
            return;
        };
        let Some(tunnel) = self.tunnel else { return };
        if !cfg.child_rekey_time.is_zero() {
            let jitter = ctx.jitter(cfg.rand_time.min(cfg.child_rekey_time / 2));
            child
                .timers
                .set(ChildTimer::Rekey, ctx.now + cfg.child_rekey_time - jitter);
        }
        if !cfg.child_life_time.is_zero() {
            child
                .timers
                .set(ChildTimer::Expire, ctx.now + cfg.child_life_time);
        }
        info!(
            ispi = %self.spis.initiator, tunnel = cfg.name, spi_in = %child.inbound_spi, spi_out = %child.outbound_spi,
            proposal = child.algs.name(), ?replaces, outbound_active, "CHILD_SA installed"
        );
        ctx.out
            .events
            .push_back(Event::ChildSaInstalled(Box::new(ChildSaInfo {
                tunnel,
                ike: self.spis,
                inbound_spi: child.inbound_spi,
                outbound_spi: child.outbound_spi,
                encr: child.algs.encr,
                integ: child.algs.integ,
                esn: child.algs.esn,
                pfs: child.algs.dh,
                keys: child.keys.for_event(child.keys_initiator),
                local_ts: child.local_ts.clone(),
                remote_ts: child.remote_ts.clone(),
                local: self.local,
                remote: self.remote,
                replay_window: cfg.replay_window,
                replaces,
                outbound_active,
                proposal: child.algs.name(),
            })));
        self.children.push(child);
    }

    /// Removes a CHILD_SA and reports it.
    pub(crate) fn remove_child(
        &mut self,
        ctx: &mut Ctx<'_>,
        inbound: EspSpi,
        reason: DeleteReason,
    ) {
        let Some(pos) = self.children.iter().position(|c| c.inbound_spi == inbound) else {
            return;
        };
        let c = self.children.remove(pos);
        ctx.esp_spis.remove(&c.inbound_spi.0);
        info!(ispi = %self.spis.initiator, spi_in = %c.inbound_spi, ?reason, "CHILD_SA deleted");
        if let Some(tunnel) = self.tunnel {
            ctx.out.events.push_back(Event::ChildSaDeleted {
                tunnel,
                inbound_spi: c.inbound_spi,
                outbound_spi: c.outbound_spi,
                reason,
            });
        }
    }

    /// The child by inbound SPI.
    pub(crate) fn child_mut(&mut self, inbound: EspSpi) -> Option<&mut ChildSa> {
        self.children.iter_mut().find(|c| c.inbound_spi == inbound)
    }

    /// Starts rekeying the CHILD_SA with inbound SPI `old`.
    pub(crate) fn start_child_rekey(
        &mut self,
        ctx: &mut Ctx<'_>,
        old: EspSpi,
    ) -> Result<(), Error> {
        let Some(c) = self
            .children
            .iter()
            .find(|c| c.inbound_spi == old && c.state == ChildState::Installed)
        else {
            return Ok(());
        };
        if c.predecessor
            .is_some_and(|p| self.children.iter().any(|x| x.inbound_spi == p))
        {
            // The peer's rekey that created it is not confirmed yet (no DELETE of the old SA).
            self.defer(ctx, Pending::RekeyChild(old));
            return Ok(());
        }
        let (local_ts, remote_ts, group) = (c.local_ts.clone(), c.remote_ts.clone(), c.algs.dh);
        self.send_child_request(ctx, Some(old), local_ts, remote_ts, group, 0)
    }

    /// Creates a CHILD_SA from the tunnel's configuration unless one is in use: a tunnel carries
    /// one CHILD_SA, and this replaces it when rekeying failed for good (both sides may decide
    /// so; the first replacement wins).
    pub(crate) fn start_child_create(&mut self, ctx: &mut Ctx<'_>) -> Result<(), Error> {
        if self
            .children
            .iter()
            .any(|c| matches!(c.state, ChildState::Installed | ChildState::Rekeying))
        {
            return Ok(());
        }
        let Some(cfg) = self.peer_config(ctx.peers) else {
            return Ok(());
        };
        let (l, r) = (cfg.local_ts.clone(), cfg.remote_ts.clone());
        self.send_child_request(ctx, None, l, r, None, 0)
    }

    /// Creates one more CHILD_SA with the tunnel's configured selectors, whatever is in use:
    /// a CREATE_CHILD_SA without REKEY_SA (RFC 7296 §1.3.1), so the peer holds it beside the
    /// others, each with its own keys and sequence numbers.
    pub(crate) fn start_child_add(&mut self, ctx: &mut Ctx<'_>) -> Result<(), Error> {
        let Some(cfg) = self.peer_config(ctx.peers) else {
            return Ok(());
        };
        let (l, r) = (cfg.local_ts.clone(), cfg.remote_ts.clone());
        self.send_child_request(ctx, None, l, r, None, 0)
    }

    fn send_child_request(
        &mut self,
        ctx: &mut Ctx<'_>,
        rekey: Option<EspSpi>,
        local_ts: Vec<TrafficSelector>,
        remote_ts: Vec<TrafficSelector>,
        group: Option<DhGroup>,
        retries: u8,
    ) -> Result<(), Error> {
        let peers = ctx.peers;
        let Some(cfg) = self.peer_config(peers) else {
            return Ok(());
        };
        // PFS: the group of the CHILD_SA being rekeyed if still configured, else the first one.
        let configured: Vec<DhGroup> = cfg
            .esp_proposals
            .iter()
            .flat_map(|p| p.dh.iter().copied())
            .collect();
        let group = group
            .filter(|g| configured.contains(g))
            .or(configured.first().copied());
        let spi = ctx.alloc_esp_spi();
        let ni = ctx.nonce();
        let ke = group.map(|g| KeyExchange::generate(g, ctx.rng));
        let mut payloads = Vec::new();
        if let Some(old) = rekey {
            payloads.push(Payload::Notify(NotifyPayload {
                protocol: ProtocolId::ESP,
                spi: old.0.to_be_bytes().to_vec(),
                ty: NotifyType::REKEY_SA,
                data: Vec::new(),
            }));
        }
        let (sa, ts) = offer_payloads(cfg, spi, true, group, &local_ts, &remote_ts);
        payloads.push(sa);
        payloads.push(Payload::Nonce(NoncePayload { data: ni.clone() }));
        if let Some(k) = &ke {
            payloads.push(Payload::Ke(KePayload {
                group: k.group().id().0,
                data: k.public_value(),
            }));
        }
        payloads.extend(ts);
        let resource = match rekey {
            Some(old) => self
                .children
                .iter()
                .any(|c| c.inbound_spi == old && c.resource),
            None => cfg.resource_sas > 0,
        };
        if resource && rekey.is_none() {
            payloads.push(resource_info());
        }
        if let Some(old) = rekey {
            info!(ispi = %self.spis.initiator, spi_in = %old, "rekeying CHILD_SA");
            if let Some(c) = self.child_mut(old) {
                c.state = ChildState::Rekeying;
            }
        }
        let task = ChildTask {
            rekey,
            spi,
            ni,
            ke,
            local_ts,
            remote_ts,
            collision: None,
            old_deleted: false,
            deleted_spis: Vec::new(),
            retries,
            resource,
        };
        let r = self.send_request(
            ctx,
            ExchangeType::CREATE_CHILD_SA,
            &payloads,
            Task::Child(Box::new(task)),
        );
        if r.is_err() {
            ctx.esp_spis.remove(&spi.0);
        }
        r
    }

    /// Processes the answer to our CREATE_CHILD_SA for a CHILD_SA.
    pub(crate) fn on_child_response(
        &mut self,
        ctx: &mut Ctx<'_>,
        payloads: &[Payload],
        task: ChildTask,
    ) {
        let peers = ctx.peers;
        let Some(cfg) = self.peer_config(peers) else {
            return;
        };
        if let Some(n) = first_error(payloads) {
            ctx.esp_spis.remove(&task.spi.0);
            self.child_failed(ctx, cfg, n.ty, &n.data, task);
            return;
        }
        let offered = (&task.local_ts[..], &task.remote_ts[..]);
        let nr = match crate::init::one!(payloads, Nonce, self.spi, "CREATE_CHILD_SA", "Nonce") {
            Ok(n) => n.data.clone(),
            Err(e) => {
                warn!(ispi = %self.spis.initiator, error = %e, "invalid CREATE_CHILD_SA response");
                ctx.esp_spis.remove(&task.spi.0);
                self.child_failed(ctx, cfg, NotifyType::INVALID_SYNTAX, &[], task);
                return;
            }
        };
        let child = match self.complete_child_initiator(
            ctx,
            cfg,
            task.spi,
            offered,
            task.ke.as_ref(),
            payloads,
            &task.ni,
            &nr,
            true,
        ) {
            Ok(mut c) => {
                c.resource = match task.rekey {
                    Some(_) => task.resource,
                    None => Self::resource_answer(task.resource, payloads),
                };
                c
            }
            Err(e) => {
                warn!(ispi = %self.spis.initiator, error = %e, "unacceptable CREATE_CHILD_SA response");
                // The peer installed its half; delete it (the SPI is unknown locally).
                self.enqueue(Pending::DeleteChildren(
                    vec![task.spi],
                    DeleteReason::NegotiationFailed,
                ));
                self.child_failed(ctx, cfg, NotifyType::NO_PROPOSAL_CHOSEN, &[], task);
                return;
            }
        };
        if task.deleted_spis.contains(&child.outbound_spi.0) {
            // The peer already deleted what this exchange created (it gave up waiting for us).
            warn!(ispi = %self.spis.initiator, spi_in = %child.inbound_spi, "peer deleted the new CHILD_SA meanwhile");
            ctx.esp_spis.remove(&child.inbound_spi.0);
            match task.rekey.and_then(|old| self.child_mut(old)) {
                Some(c) => c.state = ChildState::Installed,
                // Neither the old nor the new SA is left: establish a replacement.
                None if task.rekey.is_some() => self.enqueue(Pending::CreateChild),
                None => self.child_refused(ctx, NotifyType::TEMPORARY_FAILURE),
            }
            return;
        }
        let Some(old) = task.rekey else {
            self.install_child(ctx, child, None, true);
            return;
        };
        let ours = lower_nonce(&task.ni, &nr);
        let lost = task
            .collision
            .as_ref()
            .is_some_and(|p| nonce_less(&ours, &p.lower_nonce));
        if lost {
            // RFC 7296 §2.8.1: our SA is the redundant one; we delete it, the peer deletes the
            // old one.
            info!(ispi = %self.spis.initiator, spi_in = %child.inbound_spi, "CHILD_SA rekey collision lost");
            self.enqueue(Pending::DeleteChildren(
                vec![child.inbound_spi],
                DeleteReason::Rekeyed,
            ));
            if let Some(c) = self.child_mut(old) {
                c.state = ChildState::Rekeyed;
            }
            return;
        }
        if let Some(p) = &task.collision {
            // The peer's replacement is redundant; the peer deletes it. Until then it must not
            // be rekeyed or used for anything new.
            info!(ispi = %self.spis.initiator, redundant = %p.inbound_spi, "CHILD_SA rekey collision won");
            if let Some(c) = self.child_mut(p.inbound_spi) {
                c.state = ChildState::Rekeyed;
                c.timers.stop(ChildTimer::Rekey);
            }
        }
        // As the rekey's initiator we send on the new SA at once: the peer installed it before
        // answering (RFC 7296 §2.8).
        self.install_child(ctx, child, Some(old), true);
        if task.old_deleted || self.child_mut(old).is_none() {
            return;
        }
        if let Some(c) = self.child_mut(old) {
            c.state = ChildState::Rekeyed;
            c.timers.stop(ChildTimer::Rekey);
        }
        // RFC 7296 §2.8: the initiator of the rekey deletes the old SA.
        self.enqueue(Pending::DeleteChildren(vec![old], DeleteReason::Rekeyed));
    }

    fn child_failed(
        &mut self,
        ctx: &mut Ctx<'_>,
        cfg: &PeerConfig,
        notify: NotifyType,
        data: &[u8],
        task: ChildTask,
    ) {
        warn!(ispi = %self.spis.initiator, %notify, rekey = ?task.rekey, "CHILD_SA negotiation failed");
        if notify == NotifyType::INVALID_KE_PAYLOAD && task.retries < 2 {
            let wanted = <[u8; 2]>::try_from(data)
                .ok()
                .and_then(|b| DhGroup::from_id(crypto::transform::KeId(u16::from_be_bytes(b))));
            let acceptable = wanted.filter(|g| cfg.esp_proposals.iter().any(|p| p.dh.contains(g)));
            if let Some(g) = acceptable {
                if let Some(old) = task.rekey {
                    if let Some(c) = self.child_mut(old) {
                        c.state = ChildState::Installed;
                    }
                }
                let r = self.send_child_request(
                    ctx,
                    task.rekey,
                    task.local_ts,
                    task.remote_ts,
                    Some(g),
                    task.retries + 1,
                );
                if let Err(e) = r {
                    warn!(ispi = %self.spis.initiator, error = %e, "cannot retry CREATE_CHILD_SA");
                    if task.rekey.is_none() {
                        self.child_refused(ctx, NotifyType::TEMPORARY_FAILURE);
                    }
                }
                return;
            }
        }
        let Some(old) = task.rekey else {
            self.child_refused(ctx, notify);
            return;
        };
        if task.collision.is_some() {
            // The peer rekeyed it already; its replacement wins and it deletes the old SA.
            if let Some(c) = self.child_mut(old) {
                c.state = ChildState::Rekeyed;
            }
            return;
        }
        if task.old_deleted {
            return;
        }
        if let Some(c) = self.child_mut(old) {
            c.state = ChildState::Installed;
        }
        match notify {
            NotifyType::TEMPORARY_FAILURE => self.defer(ctx, Pending::RekeyChild(old)),
            NotifyType::CHILD_SA_NOT_FOUND => {
                // The peer lost this CHILD_SA: drop ours and create a replacement.
                self.enqueue(Pending::DeleteChildren(
                    vec![old],
                    DeleteReason::NegotiationFailed,
                ));
                self.enqueue(Pending::CreateChild);
            }
            // Otherwise keep the old SA until its hard lifetime.
            _ => {}
        }
    }

    /// Answers a CREATE_CHILD_SA request (new CHILD_SA, CHILD_SA rekey or IKE SA rekey).
    pub(crate) fn on_create_child_request(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u32,
        payloads: &[Payload],
    ) {
        let ex = ExchangeType::CREATE_CHILD_SA;
        let is_ike = payloads.iter().any(|p| match p {
            Payload::Sa(sa) => sa
                .proposals
                .first()
                .is_some_and(|p| p.protocol == ProtocolId::IKE),
            _ => false,
        });
        if is_ike {
            self.on_ike_rekey_request(ctx, id, payloads);
            return;
        }
        match self.answer_child_request(ctx, payloads) {
            Ok((resp, child, rekeyed)) => {
                self.send_response(ctx, ex, id, &resp);
                self.accept_passive_child(ctx, child, rekeyed);
            }
            Err(e) => {
                debug!(ispi = %self.spis.initiator, error = %e, "refusing CREATE_CHILD_SA");
                self.send_response(ctx, ex, id, &[error_notify(&e)]);
            }
        }
    }

    fn answer_child_request(
        &mut self,
        ctx: &mut Ctx<'_>,
        payloads: &[Payload],
    ) -> Result<(Vec<Payload>, ChildSa, Option<EspSpi>), Error> {
        if self.state != SaState::Established {
            return Err(Error::TemporaryFailure("IKE SA is not established"));
        }
        // RFC 7296 §2.25.2: while rekeying the IKE SA, CHILD_SA requests get TEMPORARY_FAILURE.
        if matches!(
            self.active.as_ref().map(|a| &a.task),
            Some(Task::IkeRekey(_))
        ) {
            return Err(Error::TemporaryFailure("rekeying the IKE SA"));
        }
        let peers = ctx.peers;
        let cfg = self
            .peer_config(peers)
            .ok_or(Error::NoProposalChosen { what: "ESP" })?;
        let mut rekeyed = None;
        if let Some(n) = find_notify(payloads, NotifyType::REKEY_SA) {
            let spi = n.spi_u32().map(EspSpi).ok_or(Error::InvalidSyntax {
                spi: self.spi,
                exchange: "CREATE_CHILD_SA",
                what: "REKEY_SA without an ESP SPI",
            })?;
            // The notify names the peer's inbound SPI, which is our outbound one.
            let child = self
                .children
                .iter()
                .find(|c| c.outbound_spi == spi)
                .ok_or(Error::ChildSaNotFound(spi))?;
            let deleting = matches!(self.active.as_ref().map(|a| &a.task),
                Some(Task::DeleteChildren(s, _)) if s.contains(&child.inbound_spi));
            // RFC 7296 §2.25.1: a CHILD_SA we are closing gets TEMPORARY_FAILURE.
            if deleting || matches!(child.state, ChildState::Deleting | ChildState::Rekeyed) {
                return Err(Error::TemporaryFailure("CHILD_SA is being deleted"));
            }
            rekeyed = Some(child.inbound_spi);
        }
        let resource = match rekeyed {
            Some(old) => self
                .children
                .iter()
                .any(|c| c.inbound_spi == old && c.resource),
            None => self.resource_request(cfg, payloads)?,
        };
        let ni = crate::init::one!(payloads, Nonce, self.spi, "CREATE_CHILD_SA", "Nonce")?
            .data
            .clone();
        let nr = ctx.nonce();
        let (mut resp, mut child) =
            self.negotiate_child_responder(ctx, cfg, payloads, &ni, &nr, true)?;
        resp.insert(1, Payload::Nonce(NoncePayload { data: nr.clone() }));
        child.resource = resource;
        if resource && rekeyed.is_none() {
            resp.push(resource_info());
        }
        if let Some(old) = rekeyed {
            // Remember the nonces for a possible collision with our own rekey of `old`.
            if let Some(Task::Child(t)) = self.active.as_mut().map(|a| &mut a.task) {
                if t.rekey == Some(old) {
                    t.collision = Some(PassiveChild {
                        inbound_spi: child.inbound_spi,
                        lower_nonce: lower_nonce(&ni, &nr),
                    });
                }
            }
        }
        Ok((resp, child, rekeyed))
    }

    fn accept_passive_child(
        &mut self,
        ctx: &mut Ctx<'_>,
        mut child: ChildSa,
        rekeyed: Option<EspSpi>,
    ) {
        child.predecessor = rekeyed;
        // The peer installs this SA when our answer arrives: keep sending on the old one until
        // the peer deletes it. A new (not rekeying) CHILD_SA has no predecessor to send on.
        self.install_child(ctx, child, rekeyed, rekeyed.is_none());
        let Some(old) = rekeyed else { return };
        let colliding = matches!(self.active.as_ref().map(|a| &a.task), Some(Task::Child(t)) if t.rekey == Some(old));
        if let Some(c) = self.child_mut(old) {
            c.timers.stop(ChildTimer::Rekey);
            // While our own rekey of it is in flight the collision is decided on its answer.
            if !colliding {
                c.state = ChildState::Rekeyed;
            }
        }
        self.queue.retain(|p| p != &Pending::RekeyChild(old));
    }
}
