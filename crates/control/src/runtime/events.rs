//! The engine's events applied to the data path, the store and the status ([`Driver::on_event`]).

use super::*;

impl Driver {
    pub(super) fn on_event(&mut self, event: Event) {
        match event {
            Event::IkeSaConnecting {
                tunnel,
                ike,
                remote,
            } => {
                info!(
                    tunnel = %self.name(tunnel), tenant = %self.tenant(tunnel),
                    ispi = %ike.initiator, rspi = %ike.responder, remote = %remote,
                    "IKE_SA connecting"
                );
            }
            Event::IkeSaEstablished {
                tunnel,
                ike,
                proposal,
                local,
                remote,
            } => {
                let t = Some(tunnel);
                info!(
                    tunnel = %self.name(t), tenant = %self.tenant(t),
                    ispi = %ike.initiator, rspi = %ike.responder,
                    local = %local, remote = %remote, proposal = %proposal,
                    "IKE_SA established"
                );
                self.events.entry(tunnel).or_default().ike_established += 1;
            }
            Event::IkeSaRekeyed { tunnel, old, new } => {
                self.events.entry(tunnel).or_default().ike_rekeys += 1;
                let t = Some(tunnel);
                info!(
                    tunnel = %self.name(t), tenant = %self.tenant(t),
                    ispi = %new.initiator, rspi = %new.responder,
                    old_ispi = %old.initiator, old_rspi = %old.responder,
                    "IKE_SA rekeyed"
                );
            }
            Event::IkeSaDeleted {
                tunnel,
                ike,
                reason,
            } => self.on_ike_deleted(tunnel, ike, reason),
            Event::ChildSaInstalled(child) => {
                let t = Some(child.tunnel);
                let local_ts = join_ts(&child.local_ts);
                let remote_ts = join_ts(&child.remote_ts);
                if let Some(keylog) = self.keylog.as_mut() {
                    keylog.write_child(&child);
                }
                let counts = self.events.entry(child.tunnel).or_default();
                if let Some(old) = child.replaces {
                    counts.child_rekeys += 1;
                    info!(
                        tunnel = %self.name(t), tenant = %self.tenant(t),
                        ispi = %child.ike.initiator, rspi = %child.ike.responder,
                        spi_in = %child.inbound_spi, spi_out = %child.outbound_spi, old_spi_in = %old,
                        proposal = %child.proposal, local_ts = %local_ts, remote_ts = %remote_ts,
                        "CHILD_SA rekeyed"
                    );
                } else {
                    counts.child_installed += 1;
                    info!(
                        tunnel = %self.name(t), tenant = %self.tenant(t),
                        ispi = %child.ike.initiator, rspi = %child.ike.responder,
                        spi_in = %child.inbound_spi, spi_out = %child.outbound_spi,
                        proposal = %child.proposal, local_ts = %local_ts, remote_ts = %remote_ts,
                        "CHILD_SA installed"
                    );
                }
                if let Err(e) = self.datapath.install_child(&child) {
                    error!(
                        tunnel = %self.name(t), tenant = %self.tenant(t),
                        spi_in = %child.inbound_spi, spi_out = %child.outbound_spi, error = %e,
                        "data plane refused the CHILD_SA; traffic of this tunnel will not flow"
                    );
                }
            }
            Event::ChildSaDeleted {
                tunnel,
                inbound_spi,
                outbound_spi,
                reason,
            } => {
                let t = Some(tunnel);
                info!(
                    tunnel = %self.name(t), tenant = %self.tenant(t),
                    spi_in = %inbound_spi, spi_out = %outbound_spi, reason = %reason_name(reason),
                    "CHILD_SA deleted"
                );
                self.datapath
                    .remove_child(tunnel, inbound_spi, outbound_spi);
            }
            Event::ChildSaRefused {
                tunnel,
                ike,
                notify,
            } => {
                let t = Some(tunnel);
                warn!(
                    tunnel = %self.name(t), tenant = %self.tenant(t),
                    ispi = %ike.initiator, rspi = %ike.responder, %notify,
                    "peer refused a new CHILD_SA"
                );
                self.datapath
                    .child_refused(tunnel, notify.no_more_children());
            }
            Event::PeerAddressChanged {
                tunnel,
                ike,
                local,
                remote,
            } => {
                let t = Some(tunnel);
                info!(
                    tunnel = %self.name(t), tenant = %self.tenant(t),
                    ispi = %ike.initiator, rspi = %ike.responder, local = %local, remote = %remote,
                    "peer address changed"
                );
                self.datapath.update_peer(tunnel, ike, local, remote);
            }
            Event::LivenessConfirmed { tunnel, ike } => {
                let t = Some(tunnel);
                debug!(
                    tunnel = %self.name(t), tenant = %self.tenant(t),
                    ispi = %ike.initiator, rspi = %ike.responder,
                    "peer answered a liveness check"
                );
                self.events.entry(tunnel).or_default().dpd_answered += 1;
            }
            Event::KeyLog { ike, line } => match self.keylog.as_mut() {
                Some(keylog) => keylog.write_ike(&line),
                None => {
                    debug!(ispi = %ike.initiator, "engine emitted a key log line without a key log")
                }
            },
        }
    }

    pub(super) fn on_ike_deleted(
        &mut self,
        tunnel: Option<TunnelId>,
        ike: IkeSpis,
        reason: DeleteReason,
    ) {
        let (name, tenant) = (self.name(tunnel).to_owned(), self.tenant(tunnel).to_owned());
        let why = reason_name(reason);
        match reason {
            DeleteReason::DpdTimeout => warn!(
                tunnel = %name, tenant = %tenant, ispi = %ike.initiator, rspi = %ike.responder, reason = %why,
                "DPD timeout: peer is dead, IKE_SA deleted"
            ),
            DeleteReason::RetransmitLimit
            | DeleteReason::AuthFailed
            | DeleteReason::NegotiationFailed
            | DeleteReason::Expired => warn!(
                tunnel = %name, tenant = %tenant, ispi = %ike.initiator, rspi = %ike.responder, reason = %why,
                "IKE_SA deleted"
            ),
            DeleteReason::PeerRequest | DeleteReason::LocalRequest | DeleteReason::Rekeyed => {
                info!(
                    tunnel = %name, tenant = %tenant, ispi = %ike.initiator, rspi = %ike.responder, reason = %why,
                    "IKE_SA deleted"
                )
            }
        }
        if let Some(t) = tunnel {
            *(self.events.entry(t).or_default().ike_deleted)
                .entry(why.to_owned())
                .or_default() += 1;
            let restart = self
                .tunnels
                .get(&t)
                .is_some_and(|i| i.dpd_action == DpdAction::Restart);
            if reason == DeleteReason::DpdTimeout && restart && !self.restart.contains(&t) {
                self.restart.push(t);
            }
        }
    }
}
