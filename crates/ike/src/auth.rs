//! The IKE_AUTH exchange with pre-shared keys (RFC 7296 §1.2, §2.15) for both roles: identities,
//! AUTH = prf(prf(Shared Secret, "Key Pad for IKEv2"), <SignedOctets>), peer configuration
//! lookup by the peer's IDi (and IDr if sent) and address, INITIAL_CONTACT (§2.4), and the first
//! CHILD_SA.

use crate::{
    child::{offer_payloads, resource_info},
    config::PeerConfig,
    event::{DeleteReason, Event},
    init::candidates,
    keys::{ct_eq, psk_auth},
    sa::{error_notify, first_error, Ctx, IkeSa, SaState, Task},
    Error, Identity, IkeDrop, TrafficSelector,
};
use tracing::{debug, info, warn};
use wire::ike::{
    find_notify, AuthMethod, AuthPayload, ExchangeType, IdPayload, NotifyPayload, NotifyType,
    Payload,
};
use wire::EspSpi;

/// The CHILD_SA proposed in IKE_AUTH.
pub(crate) struct ChildOffer {
    pub(crate) spi: EspSpi,
    pub(crate) local_ts: Vec<TrafficSelector>,
    pub(crate) remote_ts: Vec<TrafficSelector>,
    /// We offered SA_RESOURCE_INFO with it (RFC 9611).
    pub(crate) resource: bool,
}

/// Initiator state while IKE_AUTH is outstanding ("expect IKE_AUTH response").
pub(crate) struct AuthTask {
    pub(crate) child: Option<ChildOffer>,
}

fn id_payload(id: &Identity) -> IdPayload {
    let (id_type, data) = id.to_wire();
    IdPayload { id_type, data }
}

impl IkeSa {
    /// Sends the IKE_AUTH request (after a successful IKE_SA_INIT).
    pub(crate) fn start_auth(&mut self, ctx: &mut Ctx<'_>) {
        let peers = ctx.peers;
        let (Some(cfg), Some(keys), Some(setup)) = (
            self.peer_config(peers),
            self.keys.as_ref(),
            self.setup.as_ref(),
        ) else {
            self.die(ctx, DeleteReason::NegotiationFailed);
            return;
        };
        let idi = id_payload(&cfg.local_id);
        let auth = psk_auth(
            keys.algs.prf,
            &cfg.psk,
            keys.sk_pi(),
            &setup.our_init,
            &self.nr,
            &idi.body(),
        );
        let mut payloads = vec![Payload::IdI(idi)];
        // RFC 7296 §2.4: INITIAL_CONTACT when this is the only IKE SA with the peer.
        let first = !ctx
            .others
            .values()
            .any(|o| o.tunnel == self.tunnel && o.state == SaState::Established);
        if first {
            payloads.push(Payload::Notify(NotifyPayload::new(
                NotifyType::INITIAL_CONTACT,
                vec![],
            )));
        }
        payloads.push(Payload::IdR(id_payload(&cfg.remote_id)));
        payloads.push(Payload::Auth(AuthPayload {
            method: AuthMethod::SHARED_KEY_MIC,
            data: auth.to_vec(),
        }));
        let child = if cfg.local_ts.is_empty()
            || cfg.remote_ts.is_empty()
            || cfg.esp_proposals.is_empty()
        {
            None
        } else {
            let spi = ctx.alloc_esp_spi();
            let (sa, ts) = offer_payloads(cfg, spi, false, None, &cfg.local_ts, &cfg.remote_ts);
            payloads.push(sa);
            payloads.extend(ts);
            // RFC 9611: the first CHILD_SA of a group of per-resource ones (the peer's fallback).
            let resource = cfg.resource_sas > 0;
            if resource {
                payloads.push(resource_info());
            }
            Some(ChildOffer {
                spi,
                local_ts: cfg.local_ts.clone(),
                remote_ts: cfg.remote_ts.clone(),
                resource,
            })
        };
        let spi = child.as_ref().map(|c| c.spi);
        if let Err(e) = self.send_request(
            ctx,
            ExchangeType::IKE_AUTH,
            &payloads,
            Task::Auth(Box::new(AuthTask { child })),
        ) {
            warn!(ispi = %self.spis.initiator, error = %e, "cannot send IKE_AUTH");
            if let Some(s) = spi {
                ctx.esp_spis.remove(&s.0);
            }
            self.die(ctx, DeleteReason::NegotiationFailed);
        }
    }

    fn established_event(&mut self, ctx: &mut Ctx<'_>) {
        let (Some(tunnel), Some(keys)) = (self.tunnel, self.keys.as_ref()) else {
            return;
        };
        self.state = SaState::Established;
        self.established = Some(ctx.now);
        self.setup = None;
        info!(ispi = %self.spis.initiator, rspi = %self.spis.responder, ?tunnel, remote = %self.remote, "IKE SA established");
        ctx.out.events.push_back(Event::IkeSaEstablished {
            tunnel,
            ike: self.spis,
            proposal: keys.algs.name(),
            local: self.local,
            remote: self.remote,
        });
        self.arm_established_timers(ctx);
    }

    /// Processes the IKE_AUTH response.
    pub(crate) fn on_auth_response(
        &mut self,
        ctx: &mut Ctx<'_>,
        payloads: &[Payload],
        task: AuthTask,
    ) {
        let peers = ctx.peers;
        let release = |ctx: &mut Ctx<'_>, task: &AuthTask| {
            if let Some(c) = &task.child {
                ctx.esp_spis.remove(&c.spi.0);
            }
        };
        let Some(cfg) = self.peer_config(peers) else {
            release(ctx, &task);
            self.die(ctx, DeleteReason::LocalRequest);
            return;
        };
        if let Err(e) = self.verify_responder(cfg, payloads) {
            warn!(ispi = %self.spis.initiator, error = %e, "IKE_AUTH failed");
            ctx.stats.count(IkeDrop::AuthFailed);
            release(ctx, &task);
            if !matches!(
                e,
                Error::AuthenticationFailed("peer refused our authentication")
            ) {
                // RFC 7296 §2.21.2: tell the responder we do not accept its authentication.
                let n = Payload::Notify(NotifyPayload::new(
                    NotifyType::AUTHENTICATION_FAILED,
                    vec![],
                ));
                let id = self.next_request_id;
                if let Ok(bytes) = self.protect(ExchangeType::INFORMATIONAL, id, false, &[n]) {
                    ctx.send(self.local, self.remote, bytes);
                }
            }
            self.die(ctx, DeleteReason::AuthFailed);
            return;
        }
        self.peer_id = Some(cfg.remote_id.clone());
        self.established_event(ctx);
        let Some(offer) = task.child else { return };
        if let Some(n) = first_error(payloads) {
            warn!(ispi = %self.spis.initiator, notify = %n.ty, "first CHILD_SA refused");
            ctx.esp_spis.remove(&offer.spi.0);
            self.child_refused(ctx, n.ty);
            return;
        }
        let (ni, nr) = (self.ni.clone(), self.nr.clone());
        match self.complete_child_initiator(
            ctx,
            cfg,
            offer.spi,
            (&offer.local_ts, &offer.remote_ts),
            None,
            payloads,
            &ni,
            &nr,
            false,
        ) {
            Ok(mut child) => {
                child.resource = Self::resource_answer(offer.resource, payloads);
                self.install_child(ctx, child, None, true);
            }
            Err(e) => {
                warn!(ispi = %self.spis.initiator, error = %e, "unacceptable CHILD_SA in IKE_AUTH response");
                ctx.esp_spis.remove(&offer.spi.0);
                self.child_refused(ctx, NotifyType::NO_PROPOSAL_CHOSEN);
                self.enqueue(crate::sa::Pending::DeleteChildren(
                    vec![offer.spi],
                    DeleteReason::NegotiationFailed,
                ));
            }
        }
    }

    fn verify_responder(&self, cfg: &PeerConfig, payloads: &[Payload]) -> Result<(), Error> {
        if find_notify(payloads, NotifyType::AUTHENTICATION_FAILED).is_some() {
            return Err(Error::AuthenticationFailed(
                "peer refused our authentication",
            ));
        }
        let idr = crate::init::one!(payloads, IdR, self.spi, "IKE_AUTH", "IDr")?;
        let auth = crate::init::one!(payloads, Auth, self.spi, "IKE_AUTH", "AUTH")?;
        let (keys, setup) = match (self.keys.as_ref(), self.setup.as_ref()) {
            (Some(k), Some(s)) => (k, s),
            _ => return Err(Error::AuthenticationFailed("no keys")),
        };
        let peer = Identity::from_wire(idr.id_type, &idr.data)
            .ok_or(Error::AuthenticationFailed("unsupported IDr type"))?;
        if !cfg.remote_id.matches(&peer) {
            return Err(Error::AuthenticationFailed(
                "IDr does not match the configured remote identity",
            ));
        }
        if auth.method != AuthMethod::SHARED_KEY_MIC {
            return Err(Error::AuthenticationFailed(
                "responder did not use a shared key",
            ));
        }
        let expected = psk_auth(
            keys.algs.prf,
            &cfg.psk,
            keys.sk_pr(),
            &setup.peer_init,
            &self.ni,
            &idr.body(),
        );
        if !ct_eq(&expected, &auth.data) {
            return Err(Error::AuthenticationFailed(
                "responder AUTH does not verify",
            ));
        }
        Ok(())
    }

    /// Finds the tunnel whose identities, addresses, proposals and PSK the initiator satisfies.
    fn authenticate_initiator<'p>(
        &self,
        ctx: &Ctx<'p>,
        payloads: &[Payload],
    ) -> Result<&'p PeerConfig, Error> {
        let idi = crate::init::one!(payloads, IdI, self.spi, "IKE_AUTH", "IDi")?;
        let auth = crate::init::one!(payloads, Auth, self.spi, "IKE_AUTH", "AUTH")?;
        let mut idrs = payloads.iter().filter_map(|p| match p {
            Payload::IdR(i) => Some(i),
            _ => None,
        });
        let idr = idrs.next();
        if idrs.next().is_some() {
            return Err(Error::InvalidSyntax {
                spi: self.spi,
                exchange: "IKE_AUTH",
                what: "two IDr payloads",
            });
        }
        let (keys, setup) = match (self.keys.as_ref(), self.setup.as_ref()) {
            (Some(k), Some(s)) => (k, s),
            _ => return Err(Error::AuthenticationFailed("no keys")),
        };
        let peer = Identity::from_wire(idi.id_type, &idi.data)
            .ok_or(Error::AuthenticationFailed("unsupported IDi type"))?;
        let wanted_local = match idr {
            Some(i) => Some(
                Identity::from_wire(i.id_type, &i.data)
                    .ok_or(Error::AuthenticationFailed("unsupported IDr type"))?,
            ),
            None => None,
        };
        if auth.method != AuthMethod::SHARED_KEY_MIC {
            return Err(Error::AuthenticationFailed(
                "initiator did not use a shared key",
            ));
        }
        let idi_body = idi.body();
        for cfg in candidates(ctx, self.local.ip(), self.remote.ip()) {
            if !cfg.remote_id.matches(&peer)
                || wanted_local
                    .as_ref()
                    .is_some_and(|w| !cfg.local_id.matches(w))
            {
                continue;
            }
            // The IKE proposal chosen before the peer was known must be one this tunnel allows.
            if !keys.algs.acceptable_to(&cfg.ike_proposals) {
                continue;
            }
            let expected = psk_auth(
                keys.algs.prf,
                &cfg.psk,
                keys.sk_pi(),
                &setup.peer_init,
                &self.nr,
                &idi_body,
            );
            if ct_eq(&expected, &auth.data) {
                return Ok(cfg);
            }
        }
        Err(Error::AuthenticationFailed(
            "no tunnel matches the initiator's identity and key",
        ))
    }

    /// Answers the IKE_AUTH request.
    pub(crate) fn on_auth_request(&mut self, ctx: &mut Ctx<'_>, id: u32, payloads: &[Payload]) {
        let ex = ExchangeType::IKE_AUTH;
        if self.initiator || self.state != SaState::Connecting {
            let e = Error::InvalidSyntax {
                spi: self.spi,
                exchange: "IKE_AUTH",
                what: "unexpected IKE_AUTH",
            };
            ctx.stats.count(IkeDrop::Malformed);
            self.send_response(ctx, ex, id, &[error_notify(&e)]);
            return;
        }
        let cfg = match self.authenticate_initiator(ctx, payloads) {
            Ok(c) => c,
            Err(e) => {
                warn!(ispi = %self.spis.initiator, remote = %self.remote, error = %e, "IKE_AUTH failed");
                ctx.stats.count(IkeDrop::AuthFailed);
                // RFC 7296 §2.21.2: answer AUTHENTICATION_FAILED and delete the IKE SA.
                let n = Payload::Notify(NotifyPayload::new(
                    NotifyType::AUTHENTICATION_FAILED,
                    vec![],
                ));
                self.send_response(ctx, ex, id, &[n]);
                self.die(ctx, DeleteReason::AuthFailed);
                return;
            }
        };
        self.tunnel = Some(cfg.id);
        self.peer_id = Some(cfg.remote_id.clone());
        let Some(keys) = self.keys.as_ref() else {
            return;
        };
        let Some(setup) = self.setup.as_ref() else {
            return;
        };
        let idr = id_payload(&cfg.local_id);
        let auth = psk_auth(
            keys.algs.prf,
            &cfg.psk,
            keys.sk_pr(),
            &setup.our_init,
            &self.ni,
            &idr.body(),
        );
        let mut resp = vec![
            Payload::IdR(idr),
            Payload::Auth(AuthPayload {
                method: AuthMethod::SHARED_KEY_MIC,
                data: auth.to_vec(),
            }),
        ];
        let wants_child = payloads.iter().any(|p| matches!(p, Payload::Sa(_)));
        let mut child = None;
        if wants_child {
            let (ni, nr) = (self.ni.clone(), self.nr.clone());
            match self.negotiate_child_responder(ctx, cfg, payloads, &ni, &nr, false) {
                Ok((p, mut c)) => {
                    resp.extend(p);
                    // The first CHILD_SA: the limit cannot be reached yet.
                    c.resource = matches!(self.resource_request(cfg, payloads), Ok(true));
                    if c.resource {
                        resp.push(resource_info());
                    }
                    child = Some(c);
                }
                Err(e) => {
                    // RFC 7296 §1.2: a failed CHILD_SA does not fail the IKE SA.
                    debug!(ispi = %self.spis.initiator, error = %e, "first CHILD_SA refused");
                    resp.push(error_notify(&e));
                }
            }
        }
        self.send_response(ctx, ex, id, &resp);
        self.established_event(ctx);
        if let Some(c) = child {
            self.install_child(ctx, c, None, true);
        }
        if find_notify(payloads, NotifyType::INITIAL_CONTACT).is_some() {
            ctx.out.initial_contact.push((cfg.id, self.spi));
        }
    }
}
