//! The INFORMATIONAL exchange (RFC 7296 §1.4): deleting CHILD_SAs and the IKE SA (§1.4.1,
//! including simultaneous deletes), liveness checks with empty messages (§2.4), and error
//! notifications.

use crate::{
    event::DeleteReason,
    sa::{ChildState, Ctx, IkeSa, SaState, Task},
    Error,
};
use tracing::{debug, info};
use wire::ike::{find_notify, DeletePayload, ExchangeType, NotifyType, Payload, ProtocolId};
use wire::EspSpi;

impl IkeSa {
    /// Sends a DELETE for CHILD_SAs (our inbound SPIs; SPIs without a local CHILD_SA are a
    /// half-created SA the peer installed).
    pub(crate) fn start_delete_children(
        &mut self,
        ctx: &mut Ctx<'_>,
        spis: Vec<EspSpi>,
        reason: DeleteReason,
    ) -> Result<(), Error> {
        if spis.is_empty() {
            return Ok(());
        }
        for s in &spis {
            if let Some(c) = self.child_mut(*s) {
                c.state = ChildState::Deleting;
            }
        }
        let payloads = [Payload::Delete(DeletePayload {
            protocol: ProtocolId::ESP,
            spis: spis.iter().map(|s| s.0).collect(),
        })];
        self.send_request(
            ctx,
            ExchangeType::INFORMATIONAL,
            &payloads,
            Task::DeleteChildren(spis, reason),
        )
    }

    /// The answer to our CHILD_SA DELETE: the pairs are gone (RFC 7296 §1.4.1: "the inbound SAs
    /// while processing the response").
    pub(crate) fn on_delete_children_response(
        &mut self,
        ctx: &mut Ctx<'_>,
        _payloads: &[Payload],
        spis: &[EspSpi],
        reason: DeleteReason,
    ) {
        for s in spis {
            if self.children.iter().any(|c| c.inbound_spi == *s) {
                self.remove_child(ctx, *s, reason);
            } else {
                ctx.esp_spis.remove(&s.0);
            }
        }
    }

    /// Sends a DELETE for the IKE SA.
    pub(crate) fn start_delete_ike(
        &mut self,
        ctx: &mut Ctx<'_>,
        reason: DeleteReason,
    ) -> Result<(), Error> {
        if self.state == SaState::Established {
            self.state = SaState::Deleting;
        }
        info!(ispi = %self.spis.initiator, ?reason, "deleting IKE SA");
        let payloads = [Payload::Delete(DeletePayload {
            protocol: ProtocolId::IKE,
            spis: vec![],
        })];
        self.send_request(
            ctx,
            ExchangeType::INFORMATIONAL,
            &payloads,
            Task::DeleteIke(reason),
        )
    }

    /// Answers an INFORMATIONAL request.
    pub(crate) fn on_informational_request(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u32,
        payloads: &[Payload],
    ) {
        let ex = ExchangeType::INFORMATIONAL;
        let deletes: Vec<&DeletePayload> = payloads
            .iter()
            .filter_map(|p| match p {
                Payload::Delete(d) => Some(d),
                _ => None,
            })
            .collect();
        if deletes.iter().any(|d| d.protocol == ProtocolId::IKE) {
            // RFC 7296 §1.4.1: the response to an IKE SA delete is empty; then the SA is gone.
            self.send_response(ctx, ex, id, &[]);
            // A peer deleting this SA while its rekey of it is done here (ours still in flight)
            // won the collision: the CHILD_SAs move to its new SA first (RFC 7296 §2.8.2).
            self.conclude_passive_rekey(ctx);
            let reason = if self.state == SaState::Rekeyed {
                DeleteReason::Rekeyed
            } else {
                DeleteReason::PeerRequest
            };
            self.die(ctx, reason);
            return;
        }
        if self.state == SaState::Established
            && find_notify(payloads, NotifyType::AUTHENTICATION_FAILED).is_some()
        {
            self.send_response(ctx, ex, id, &[]);
            self.die(ctx, DeleteReason::AuthFailed);
            return;
        }
        let mut ours = Vec::new();
        for d in deletes.iter().filter(|d| d.protocol == ProtocolId::ESP) {
            for spi in &d.spis {
                // The peer names its inbound SPI, our outbound one.
                let Some(c) = self.children.iter().find(|c| c.outbound_spi.0 == *spi) else {
                    debug!(ispi = %self.spis.initiator, spi = %EspSpi(*spi), "DELETE for unknown CHILD_SA");
                    if let Some(Task::Child(t)) = self.active.as_mut().map(|a| &mut a.task) {
                        t.deleted_spis.push(*spi);
                    }
                    continue;
                };
                let inbound = c.inbound_spi;
                let was = c.state;
                let we_delete_it = matches!(self.active.as_ref().map(|a| &a.task),
                    Some(Task::DeleteChildren(s, _)) if s.contains(&inbound));
                if let Some(Task::Child(t)) = self.active.as_mut().map(|a| &mut a.task) {
                    if t.rekey == Some(inbound) {
                        t.old_deleted = true;
                    }
                }
                let reason = if was == ChildState::Rekeyed {
                    DeleteReason::Rekeyed
                } else {
                    DeleteReason::PeerRequest
                };
                self.remove_child(ctx, inbound, reason);
                self.queue
                    .retain(|p| p != &crate::sa::Pending::RekeyChild(inbound));
                // RFC 7296 §1.4.1: for a simultaneous delete the response MUST NOT include the
                // SAs we are deleting ourselves.
                if !we_delete_it {
                    ours.push(inbound.0);
                }
            }
        }
        let resp: Vec<Payload> = if ours.is_empty() {
            Vec::new()
        } else {
            vec![Payload::Delete(DeletePayload {
                protocol: ProtocolId::ESP,
                spis: ours,
            })]
        };
        self.send_response(ctx, ex, id, &resp);
    }
}
