//! Rekeying the IKE SA with CREATE_CHILD_SA (RFC 7296 §1.3.2, §2.18): new SPIs in the SA
//! payload, SKEYSEED = prf(SK_d (old), g^ir (new) | Ni | Nr) with the old SA's PRF, the new SA's
//! message IDs start at zero and the CHILD_SAs move over. Simultaneous rekeys (§2.8.2): the
//! exchange whose lower nonce is the smallest produced the redundant SA; its initiator deletes
//! that SA and the winner's initiator deletes the old one.

use crate::{
    child::{lower_nonce, nonce_less},
    event::{DeleteReason, Event, IkeSpis},
    keys::IkeKeys,
    proposal::{check_ike_response, ike_offer, select_ike},
    sa::{error_notify, first_error, ChildState, Ctx, IkeSa, Pending, SaState, Task},
    timer::{Timer, TimerTable},
    Error,
};
use crypto::{DhGroup, KeyExchange};
use std::time::Duration;
use tracing::{debug, info, warn};
use wire::ike::{ExchangeType, KePayload, NoncePayload, NotifyType, Payload, SaPayload};
use wire::IkeSpi;

/// How long a rekeyed or redundant IKE SA waits for the peer's DELETE: strongSwan's 90 s, or a
/// whole retransmission schedule if that is longer, so that a peer still retransmitting its
/// rekey request (our answer lost) is answered from the old SA's cache instead of being left
/// with an SA we already destroyed.
fn rekeyed_delete_timeout(config: &crate::EndpointConfig) -> Duration {
    let schedule: Duration = (0..=config.retransmit_tries)
        .map(|n| IkeSa::rto(config, n))
        .sum();
    schedule.max(Duration::from_secs(90))
}

/// Our outstanding IKE SA rekey.
pub(crate) struct IkeRekeyTask {
    new_spi: IkeSpi,
    ni: Vec<u8>,
    ke: KeyExchange,
    retries: u8,
}

/// The new IKE SA of a rekey the peer started while ours was in flight.
pub(crate) struct PassiveIkeRekey {
    pub(crate) new_sa: IkeSa,
    pub(crate) lower_nonce: Vec<u8>,
}

impl IkeSa {
    /// Starts rekeying this IKE SA.
    pub(crate) fn start_ike_rekey(&mut self, ctx: &mut Ctx<'_>) -> Result<(), Error> {
        self.send_ike_rekey(ctx, None, 0)
    }

    fn send_ike_rekey(
        &mut self,
        ctx: &mut Ctx<'_>,
        group: Option<DhGroup>,
        retries: u8,
    ) -> Result<(), Error> {
        let peers = ctx.peers;
        let (Some(cfg), Some(keys)) = (self.peer_config(peers), self.keys.as_ref()) else {
            return Ok(());
        };
        if self.state != SaState::Established || self.passive_rekey.is_some() {
            return Ok(());
        }
        let configured: Vec<DhGroup> = cfg
            .ike_proposals
            .iter()
            .flat_map(|p| p.dh.iter().copied())
            .collect();
        // Reuse the current group when still configured: no INVALID_KE round trip.
        let group = group
            .or(Some(keys.algs.dh).filter(|g| configured.contains(g)))
            .or(configured.first().copied())
            .ok_or(Error::NoProposalChosen { what: "IKE" })?;
        let new_spi = ctx.alloc_ike_spi();
        let ni = ctx.nonce();
        let ke = KeyExchange::generate(group, ctx.rng);
        let payloads = [
            Payload::Sa(SaPayload {
                proposals: ike_offer(&cfg.ike_proposals, &new_spi.0.to_be_bytes(), Some(group)),
            }),
            Payload::Nonce(NoncePayload { data: ni.clone() }),
            Payload::Ke(KePayload {
                group: group.id().0,
                data: ke.public_value(),
            }),
        ];
        info!(ispi = %self.spis.initiator, "rekeying IKE SA");
        let task = IkeRekeyTask {
            new_spi,
            ni,
            ke,
            retries,
        };
        self.send_request(
            ctx,
            ExchangeType::CREATE_CHILD_SA,
            &payloads,
            Task::IkeRekey(Box::new(task)),
        )
    }

    /// A new IKE SA that inherits tunnel, addresses and NAT state from this one.
    fn successor(
        &self,
        ctx: &Ctx<'_>,
        spi: IkeSpi,
        spis: IkeSpis,
        initiator: bool,
        keys: IkeKeys,
    ) -> IkeSa {
        let mut n = IkeSa::blank(ctx.now, spi, spis, initiator, self.local, self.remote);
        n.tunnel = self.tunnel;
        n.nat = self.nat;
        n.peer_id = self.peer_id.clone();
        n.keys = Some(keys);
        n.state = SaState::Established;
        n.established = Some(ctx.now);
        n.last_received = ctx.now;
        n.last_sent = ctx.now;
        n
    }

    /// Moves the CHILD_SAs (and work queued for them) to `new`, reports the rekey and arms the
    /// new SA's timers. `self` becomes a rekeyed SA waiting for its DELETE.
    fn hand_over(&mut self, ctx: &mut Ctx<'_>, mut new: IkeSa) {
        new.children = std::mem::take(&mut self.children);
        for p in self.queue.drain(..) {
            if matches!(
                p,
                Pending::RekeyChild(_)
                    | Pending::DeleteChildren(..)
                    | Pending::CreateChild
                    | Pending::AddChild
            ) {
                new.queue.push_back(p);
            }
        }
        for (t, p) in self.deferred.drain(..) {
            if matches!(
                p,
                Pending::RekeyChild(_)
                    | Pending::DeleteChildren(..)
                    | Pending::CreateChild
                    | Pending::AddChild
            ) {
                new.deferred.push((t, p));
            }
        }
        if let Some(t) = new.deferred.iter().map(|(t, _)| *t).min() {
            new.timers.set(Timer::TaskRetry, t);
        }
        for c in &mut new.children {
            if c.state == ChildState::Rekeying {
                c.state = ChildState::Installed;
            }
        }
        new.arm_established_timers(ctx);
        new.log_keys(ctx);
        self.state = SaState::Rekeyed;
        self.timers = TimerTable::default();
        if let Some(tunnel) = self.tunnel {
            info!(old = %self.spis.initiator, new = %new.spis.initiator, "IKE SA rekeyed");
            ctx.out.events.push_back(Event::IkeSaRekeyed {
                tunnel,
                old: self.spis,
                new: new.spis,
            });
        }
        ctx.out.new_sas.push(new);
    }

    /// Processes the answer to our IKE SA rekey.
    pub(crate) fn on_ike_rekey_response(
        &mut self,
        ctx: &mut Ctx<'_>,
        payloads: &[Payload],
        task: IkeRekeyTask,
    ) {
        if let Some(n) = first_error(payloads) {
            if n.ty == NotifyType::INVALID_KE_PAYLOAD && task.retries < 2 {
                let g = <[u8; 2]>::try_from(n.data.as_slice())
                    .ok()
                    .and_then(|b| DhGroup::from_id(crypto::transform::KeId(u16::from_be_bytes(b))));
                if let Some(g) = g {
                    if let Err(e) = self.send_ike_rekey(ctx, Some(g), task.retries + 1) {
                        warn!(ispi = %self.spis.initiator, error = %e, "cannot retry IKE rekey");
                    }
                    return;
                }
            }
            warn!(ispi = %self.spis.initiator, notify = %n.ty, "IKE rekey refused");
            if !self.conclude_passive_rekey(ctx) {
                self.defer(ctx, Pending::RekeyIke);
            }
            return;
        }
        match self.complete_ike_rekey(ctx, payloads, &task) {
            Ok((new, nr)) => {
                let ours = lower_nonce(&task.ni, &nr);
                // A passive SA the peer already deleted was the redundant one: we won.
                let passive = self
                    .passive_rekey
                    .take()
                    .filter(|p| p.new_sa.state != SaState::Dead);
                match passive {
                    Some(p) if nonce_less(&ours, &p.lower_nonce) => {
                        // We lost: delete the SA our exchange created; the peer deletes the old.
                        info!(ispi = %self.spis.initiator, "IKE SA rekey collision lost");
                        let mut redundant = new;
                        redundant.state = SaState::Rekeyed;
                        redundant.enqueue(Pending::DeleteIke(DeleteReason::Rekeyed));
                        redundant.timers.set(
                            Timer::DeleteTimeout,
                            ctx.now + rekeyed_delete_timeout(ctx.config),
                        );
                        ctx.out.new_sas.push(redundant);
                        self.hand_over(ctx, p.new_sa);
                        self.timers.set(
                            Timer::DeleteTimeout,
                            ctx.now + rekeyed_delete_timeout(ctx.config),
                        );
                    }
                    passive => {
                        if let Some(p) = passive {
                            // We won: the peer deletes the SA its exchange created.
                            info!(ispi = %self.spis.initiator, "IKE SA rekey collision won");
                            // Nothing uses it; if the peer's DELETE does not come (its own
                            // exchange may have died with the old SA), drop it after the
                            // half-open timeout, as strongSwan does.
                            let mut redundant = p.new_sa;
                            redundant.state = SaState::Rekeyed;
                            redundant
                                .timers
                                .set(Timer::DeleteTimeout, ctx.now + ctx.config.half_open_timeout);
                            ctx.out.new_sas.push(redundant);
                        }
                        self.hand_over(ctx, new);
                        // RFC 7296 §2.18: the initiator of the rekey deletes the old IKE SA. The
                        // peer destroys it on answering, so a lost answer would leave us
                        // retransmitting into the void: bound the wait.
                        self.enqueue(Pending::DeleteIke(DeleteReason::Rekeyed));
                        self.timers.set(
                            Timer::DeleteTimeout,
                            ctx.now + rekeyed_delete_timeout(ctx.config),
                        );
                    }
                }
            }
            Err(e) => {
                warn!(ispi = %self.spis.initiator, error = %e, "invalid IKE rekey response");
                if !self.conclude_passive_rekey(ctx) {
                    self.defer(ctx, Pending::RekeyIke);
                }
            }
        }
    }

    /// After our rekey failed: if the peer's colliding rekey completed, it is the new SA.
    pub(crate) fn conclude_passive_rekey(&mut self, ctx: &mut Ctx<'_>) -> bool {
        let Some(p) = self
            .passive_rekey
            .take()
            .filter(|p| p.new_sa.state != SaState::Dead)
        else {
            return false;
        };
        self.hand_over(ctx, p.new_sa);
        self.timers.set(
            Timer::DeleteTimeout,
            ctx.now + rekeyed_delete_timeout(ctx.config),
        );
        true
    }

    fn complete_ike_rekey(
        &mut self,
        ctx: &mut Ctx<'_>,
        payloads: &[Payload],
        task: &IkeRekeyTask,
    ) -> Result<(IkeSa, Vec<u8>), Error> {
        let spi = self.spi;
        let ex = "CREATE_CHILD_SA";
        let peers = ctx.peers;
        let cfg = self
            .peer_config(peers)
            .ok_or(Error::NoProposalChosen { what: "IKE" })?;
        let old = self.keys.as_ref().ok_or(Error::InvalidSyntax {
            spi,
            exchange: ex,
            what: "no keys",
        })?;
        let sa = crate::init::one!(payloads, Sa, spi, ex, "SA")?;
        let ke = crate::init::one!(payloads, Ke, spi, ex, "KE")?;
        let nr = crate::init::one!(payloads, Nonce, spi, ex, "Nonce")?;
        let algs = check_ike_response(&cfg.ike_proposals, &sa.proposals, 8)?;
        let peer_spi = sa
            .proposals
            .first()
            .and_then(|p| <[u8; 8]>::try_from(p.spi.as_slice()).ok())
            .map(|b| IkeSpi(u64::from_be_bytes(b)))
            .filter(|s| s.0 != 0)
            .ok_or(Error::InvalidSyntax {
                spi,
                exchange: ex,
                what: "new responder SPI",
            })?;
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
        // RFC 7296 §2.18: "it is the old IKE SA's PRF that is used to generate SKEYSEED".
        let skeyseed = old
            .algs
            .prf
            .rekey_skeyseed(old.sk_d(), &g_ir, &task.ni, &nr.data);
        let keys = IkeKeys::derive(
            algs,
            &skeyseed,
            &task.ni,
            &nr.data,
            task.new_spi.0,
            peer_spi.0,
        )
        .map_err(|source| Error::Crypto { spi, source })?;
        let spis = IkeSpis {
            initiator: task.new_spi,
            responder: peer_spi,
        };
        let mut new = self.successor(ctx, task.new_spi, spis, true, keys);
        new.ni = task.ni.clone();
        new.nr = nr.data.clone();
        Ok((new, nr.data.clone()))
    }

    /// Answers the peer's request to rekey this IKE SA.
    pub(crate) fn on_ike_rekey_request(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u32,
        payloads: &[Payload],
    ) {
        let ex = ExchangeType::CREATE_CHILD_SA;
        match self.answer_ike_rekey(ctx, payloads) {
            Ok((resp, new, lower)) => {
                self.send_response(ctx, ex, id, &resp);
                if matches!(
                    self.active.as_ref().map(|a| &a.task),
                    Some(Task::IkeRekey(_))
                ) {
                    // Collision: our own rekey's answer decides which new SA survives.
                    debug!(ispi = %self.spis.initiator, "IKE SA rekey collision detected");
                    self.passive_rekey = Some(Box::new(PassiveIkeRekey {
                        new_sa: new,
                        lower_nonce: lower,
                    }));
                } else {
                    self.hand_over(ctx, new);
                    self.timers.set(
                        Timer::DeleteTimeout,
                        ctx.now + rekeyed_delete_timeout(ctx.config),
                    );
                }
            }
            Err(e) => {
                debug!(ispi = %self.spis.initiator, error = %e, "refusing IKE rekey");
                self.send_response(ctx, ex, id, &[error_notify(&e)]);
            }
        }
    }

    fn answer_ike_rekey(
        &mut self,
        ctx: &mut Ctx<'_>,
        payloads: &[Payload],
    ) -> Result<(Vec<Payload>, IkeSa, Vec<u8>), Error> {
        let spi = self.spi;
        let ex = "CREATE_CHILD_SA";
        if self.state != SaState::Established || self.passive_rekey.is_some() {
            return Err(Error::TemporaryFailure(
                "IKE SA is not in a state to be rekeyed",
            ));
        }
        // RFC 7296 §2.25.2: while we rekey or delete a CHILD_SA (or delete the IKE SA), an IKE
        // rekey request gets TEMPORARY_FAILURE.
        if let Some(Task::Child(_) | Task::DeleteChildren(..) | Task::DeleteIke(_)) =
            self.active.as_ref().map(|a| &a.task)
        {
            return Err(Error::TemporaryFailure("CHILD_SA exchange in progress"));
        }
        if self
            .children
            .iter()
            .any(|c| matches!(c.state, ChildState::Rekeying | ChildState::Deleting))
        {
            return Err(Error::TemporaryFailure("CHILD_SA exchange in progress"));
        }
        let peers = ctx.peers;
        let cfg = self
            .peer_config(peers)
            .ok_or(Error::NoProposalChosen { what: "IKE" })?;
        let old = self.keys.as_ref().ok_or(Error::InvalidSyntax {
            spi,
            exchange: ex,
            what: "no keys",
        })?;
        let sa = crate::init::one!(payloads, Sa, spi, ex, "SA")?;
        let ke = crate::init::one!(payloads, Ke, spi, ex, "KE")?;
        let ni = crate::init::one!(payloads, Nonce, spi, ex, "Nonce")?;
        let (algs, mut resp) = select_ike(&cfg.ike_proposals, &sa.proposals, Some(ke.group), 8)?;
        if ke.group != algs.dh.id().0 {
            return Err(Error::InvalidKePayload { wanted: algs.dh });
        }
        let peer_spi = sa
            .proposals
            .iter()
            .find(|p| p.number == resp.number)
            .and_then(|p| <[u8; 8]>::try_from(p.spi.as_slice()).ok())
            .map(|b| IkeSpi(u64::from_be_bytes(b)))
            .filter(|s| s.0 != 0)
            .ok_or(Error::InvalidSyntax {
                spi,
                exchange: ex,
                what: "new initiator SPI",
            })?;
        let our_ke = KeyExchange::generate(algs.dh, ctx.rng);
        let g_ir = our_ke
            .shared_secret(&ke.data)
            .map_err(|source| Error::Crypto { spi, source })?;
        let nr = ctx.nonce();
        let skeyseed = old
            .algs
            .prf
            .rekey_skeyseed(old.sk_d(), &g_ir, &ni.data, &nr);
        let new_spi = ctx.alloc_ike_spi();
        let keys = IkeKeys::derive(algs, &skeyseed, &ni.data, &nr, peer_spi.0, new_spi.0)
            .map_err(|source| Error::Crypto { spi, source })?;
        let spis = IkeSpis {
            initiator: peer_spi,
            responder: new_spi,
        };
        let mut new = self.successor(ctx, new_spi, spis, false, keys);
        new.ni = ni.data.clone();
        new.nr = nr.clone();
        resp.spi = new_spi.0.to_be_bytes().to_vec();
        let out = vec![
            Payload::Sa(SaPayload {
                proposals: vec![resp],
            }),
            Payload::Nonce(NoncePayload { data: nr.clone() }),
            Payload::Ke(KePayload {
                group: algs.dh.id().0,
                data: our_ke.public_value(),
            }),
        ];
        Ok((out, new, lower_nonce(&ni.data, &nr)))
    }
}
