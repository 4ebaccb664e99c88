//! CHILD_SAs coming and going: installs (with their node's answer as an explicit pending
//! state), removals (the data node deletes only after the steer nodes moved the traffic),
//! adoption of what data nodes hold, reconciliation with the restored IKE SAs (a control
//! takeover), and the operator's moves (migrate, drain).

use super::{
    Await, ChildEntry, ClusterCore, ClusterError, Directive, InstallRefused, NewChild, Retiring,
    Role, STEER_GRACE,
};
use dataplane::{InstalledChild, KnownChild};
use ike::TunnelId;
use std::collections::HashMap;
use std::time::Instant;
use tracing::{info, warn};
use wire::EspSpi;

impl ClusterCore {
    /// The control loop installs a CHILD_SA: it is recorded (so a data node arriving later
    /// takes it), placed, and its install sent to its data node, whose answer the core then
    /// waits for ([`Await::Install`], [`ClusterCore::handle_install_answer`]). Returns the
    /// node.
    pub fn handle_install(&mut self, child: NewChild) -> Result<u32, InstallRefused> {
        if self.children.contains_key(&child.inbound_spi) {
            return Err(InstallRefused::Duplicate);
        }
        if child.replaces.is_none() {
            self.spread_answered(child.tunnel);
        }
        // A spread tunnel (self-dispatch) has a CHILD_SA on every node of the ring.
        let node = if self.spread(child.tunnel) {
            self.spread_node(&child)
        } else {
            self.choose(child.tunnel, None)
        };
        self.seq += 1;
        self.children.insert(
            child.inbound_spi,
            ChildEntry {
                tunnel: child.tunnel,
                node: None,
                last_node: None,
                installing: node,
                outbound_spi: child.outbound_spi,
                ike: child.ike,
                seq: self.seq,
                sending: false,
                local_ts: child.local_ts,
                remote_ts: child.remote_ts,
            },
        );
        let Some(node) = node else {
            return Err(InstallRefused::NoDataNode);
        };
        self.placement.insert(child.tunnel, node);
        // After the node's inside configuration, in state order.
        self.emit(
            node,
            Directive::InstallChild {
                tunnel: child.tunnel,
                inbound_spi: child.inbound_spi,
            },
            Await::Install(child.inbound_spi),
        );
        Ok(node)
    }

    /// The answer to the install of `child` (`ok` false: refused, timed out or its session
    /// closed, at `now`), from the data node its install is pending on (the `installing` of
    /// its [`ChildEntry`]). Installed: the steer nodes steer its SPI to the node and, when it
    /// becomes the tunnel's sending SA, the tunnel's selectors too. Not installed: it may
    /// still arrive there, so the node is told to remove it, and the tunnel is rekeyed later
    /// (paced).
    ///
    /// An answer for a CHILD_SA with no install pending (a duplicate, or a stale one for an
    /// SA removed meanwhile) changes nothing: it is logged and counted
    /// ([`ClusterCore::ignored_answers`]). Returns the node the answer was taken for.
    pub fn handle_install_answer(
        &mut self,
        child: &NewChild,
        ok: bool,
        now: Instant,
    ) -> Option<u32> {
        let Some(node) = self
            .children
            .get_mut(&child.inbound_spi)
            .and_then(|e| e.installing.take())
        else {
            self.ignored_answers += 1;
            warn!(tunnel = child.tunnel.0, spi_in = %child.inbound_spi, ok,
                "an install answer for a CHILD_SA with no install pending; ignored");
            return None;
        };
        if !ok {
            // A node whose session ended gets nothing; if it comes back holding the SA, its
            // Hello's orphan is removed then.
            if self.nodes.get(&node).is_some_and(|n| n.session_open) {
                self.emit(
                    node,
                    Directive::RemoveChild {
                        tunnel: child.tunnel,
                        inbound_spi: child.inbound_spi,
                        outbound_spi: child.outbound_spi,
                    },
                    Await::Nothing,
                );
            }
            self.rekey_at.entry(child.tunnel).or_insert(now);
            return Some(node);
        }
        // Its node may have been declared dead while the install waited for its answer: it
        // holds the SA then as a lost node does (detached, told to remove it if it comes
        // back, the tunnel rekeyed elsewhere); nothing is steered to it and the tunnel's
        // sending SA stays what it was.
        if !self.nodes.get(&node).is_some_and(|n| n.alive) {
            if let Some(e) = self.children.get_mut(&child.inbound_spi) {
                e.last_node = Some(node);
            }
            let rekey = self.due(vec![child.tunnel], now);
            self.rekey(rekey, "data node lost during an install");
            return Some(node);
        }
        let live = |n: Option<u32>| n.is_some_and(|n| self.nodes.get(&n).is_some_and(|n| n.alive));
        let has_sender = self
            .children
            .values()
            .any(|c| c.tunnel == child.tunnel && c.sending && live(c.node));
        let sending = child.outbound_active || !has_sender;
        if sending {
            for c in self
                .children
                .values_mut()
                .filter(|c| c.tunnel == child.tunnel)
            {
                c.sending = false;
            }
        }
        if let Some(e) = self.children.get_mut(&child.inbound_spi) {
            e.node = Some(node);
            e.sending = sending;
        }
        self.emit_steers(
            &Directive::SetSpi {
                spi: child.inbound_spi,
                node,
                tunnel: child.tunnel,
            },
            Await::Steer,
        );
        if sending {
            if let Some(d) = self.tunnel_selectors(child.tunnel) {
                self.emit_steers(&d, Await::Steer);
            }
        }
        Some(node)
    }

    /// The control loop removed a CHILD_SA: the newest remaining SA of the tunnel sends once
    /// the sending one is gone (the steer nodes move the tunnel's outbound traffic to it
    /// first); its SPI stays steered for [`STEER_GRACE`]; its data node removes it once the
    /// steer nodes answered ([`super::Outbox::after_steers`]).
    pub fn handle_remove(
        &mut self,
        tunnel: TunnelId,
        inbound_spi: EspSpi,
        outbound_spi: EspSpi,
        now: Instant,
    ) {
        self.dispatch.deleting.remove(&inbound_spi);
        let Some(entry) = self.children.remove(&inbound_spi) else {
            tracing::debug!(tunnel = tunnel.0, spi_in = %inbound_spi, "remove_child: not placed");
            return;
        };
        // A restored SA that is gone may not be adopted again from a node that still has it.
        self.known.remove(&inbound_spi);
        if entry.sending {
            self.promote_sender(tunnel);
            if let Some(d) = self.tunnel_selectors(tunnel) {
                self.emit_steers(&d, Await::Steer);
            }
        }
        let holder = entry.node.or(entry.last_node);
        self.retiring.push(Retiring {
            until: now + STEER_GRACE,
            spi: inbound_spi,
            node: holder,
            tunnel,
        });
        // A node whose session is open holds it (one the probes declared dead too).
        if let Some(h) = holder.filter(|h| self.nodes.get(h).is_some_and(|n| n.session_open)) {
            self.outbox.after_steers.push(super::Outgoing {
                node: h,
                directive: Directive::RemoveChild {
                    tunnel,
                    inbound_spi,
                    outbound_spi,
                },
                wait: Await::Logged,
            });
        }
    }

    /// Takes note of the CHILD_SAs data node `id` holds (its Hello). Before the control loop
    /// reconciled, and afterwards for the CHILD_SAs of the restored IKE SAs, they are adopted
    /// as they are (a new control node takes over without rekeying); a known CHILD_SA that
    /// this node held before it was lost is attached to it again; any other is an orphan:
    /// returns the directives that remove it from the node.
    pub(crate) fn adopt(&mut self, id: u32, installed: Vec<InstalledChild>) -> Vec<Directive> {
        let mut orphans = Vec::new();
        let mut sending: HashMap<TunnelId, EspSpi> = HashMap::new();
        for c in installed {
            let entry = self
                .children
                .get(&c.inbound_spi)
                .map(|e| (e.node, e.last_node));
            match entry {
                Some((Some(n), _)) if n == id => {}
                Some((None, Some(last))) if last == id => {
                    if let Some(e) = self.children.get_mut(&c.inbound_spi) {
                        e.node = Some(id);
                        e.last_node = None;
                    }
                }
                // Before reconcile a claim is taken as made; reconcile checks it against the
                // restored IKE SAs. After it, a claim must match them.
                None if self.tunnels.contains_key(&c.tunnel)
                    && (!self.reconciled
                        || self
                            .known
                            .get(&c.inbound_spi)
                            .is_some_and(|k| k.matches(&c))) =>
                {
                    self.seq += 1;
                    if c.sending {
                        sending.insert(c.tunnel, c.inbound_spi);
                    }
                    self.placement.insert(c.tunnel, id);
                    info!(node = id, tunnel = c.tunnel.0, spi_in = %c.inbound_spi, sending = c.sending, "CHILD_SA adopted from its data node");
                    self.children.insert(
                        c.inbound_spi,
                        ChildEntry {
                            tunnel: c.tunnel,
                            node: Some(id),
                            last_node: None,
                            installing: None,
                            outbound_spi: c.outbound_spi,
                            ike: c.ike,
                            seq: self.seq,
                            sending: false,
                            local_ts: c.local_ts,
                            remote_ts: c.remote_ts,
                        },
                    );
                }
                _ => {
                    warn!(node = id, tunnel = c.tunnel.0, spi_in = %c.inbound_spi, "data node holds a CHILD_SA it is not in charge of; removing it there");
                    orphans.push(Directive::RemoveChild {
                        tunnel: c.tunnel,
                        inbound_spi: c.inbound_spi,
                        outbound_spi: c.outbound_spi,
                    });
                }
            }
        }
        // One pass: an adopted sending SA makes the others of its tunnel stop sending.
        if !sending.is_empty() {
            for (spi, e) in self.children.iter_mut() {
                if let Some(s) = sending.get(&e.tunnel) {
                    e.sending = spi == s;
                }
            }
        }
        orphans
    }

    /// The control loop restored its IKE SAs (a control takeover): checks what the data
    /// nodes claimed in their Hellos against the restored CHILD_SAs. One that no restored
    /// IKE SA knows, or that a data node holds under another tunnel, outbound SPI or other
    /// selectors, is removed from its node, and every restored CHILD_SA no live data node
    /// holds as described is returned to be rekeyed. The steer nodes get whole tables.
    pub fn handle_reconcile(&mut self, known: &[KnownChild], now: Instant) -> Vec<EspSpi> {
        let known: HashMap<EspSpi, KnownChild> =
            known.iter().map(|k| (k.inbound_spi, k.clone())).collect();
        self.reconciled = true;
        let stale: Vec<EspSpi> = self
            .children
            .iter()
            .filter(|(spi, e)| {
                let Some(k) = known.get(spi) else {
                    return true;
                };
                // Not the IKE SA: an IKE SA rekey hands the CHILD_SAs over without telling
                // the data nodes (see KnownChild::matches).
                let same = k.tunnel == e.tunnel
                    && k.outbound_spi == e.outbound_spi
                    && k.local_ts == e.local_ts
                    && k.remote_ts == e.remote_ts;
                if !same {
                    warn!(node = ?e.node, spi_in = %spi, claimed_tunnel = e.tunnel.0, tunnel = k.tunnel.0,
                        "a data node's CHILD_SA does not match the restored IKE SA (tunnel, SPI or selectors); removing it and rekeying");
                }
                !same
            })
            .map(|(spi, _)| *spi)
            .collect();
        self.known = known.clone();
        let mut unsent: Vec<TunnelId> = Vec::new();
        for spi in stale {
            if let Some(e) = self.children.remove(&spi) {
                if e.sending {
                    unsent.push(e.tunnel);
                }
                self.retiring.push(Retiring {
                    until: now + STEER_GRACE,
                    spi,
                    node: e.node,
                    tunnel: e.tunnel,
                });
                if let Some(n) = e
                    .node
                    .filter(|n| self.nodes.get(n).is_some_and(|n| n.alive))
                {
                    warn!(node = n, spi_in = %spi, "removing a CHILD_SA that no restored IKE SA knows as held");
                    self.emit(
                        n,
                        Directive::RemoveChild {
                            tunnel: e.tunnel,
                            inbound_spi: spi,
                            outbound_spi: e.outbound_spi,
                        },
                        Await::Nothing,
                    );
                }
            }
        }
        // A tunnel whose sending SA was removed sends on its newest remaining one.
        for tunnel in unsent {
            self.promote_sender(tunnel);
        }
        let lost: Vec<EspSpi> = known
            .keys()
            .filter(|spi| {
                !self
                    .children
                    .get(spi)
                    .and_then(|c| c.node)
                    .is_some_and(|n| self.nodes.get(&n).is_some_and(|n| n.alive))
            })
            .copied()
            .collect();
        // The attachments are placed among every data node that came (not all on the first
        // one to register after a takeover).
        self.place_attachments(None);
        if !self.attachments.is_empty() {
            self.fire_attachments();
        }
        // Now the steer nodes' tables can be replaced whole: every node that came has been
        // adopted.
        self.push_tables(now);
        self.push_relays();
        info!(
            known = known.len(),
            lost = lost.len(),
            "restored CHILD_SAs reconciled with the data nodes"
        );
        lost
    }

    /// The tunnel called `name`.
    pub fn tunnel_by_name(&self, name: &str) -> Result<TunnelId, ClusterError> {
        self.tunnels
            .values()
            .find(|t| t.name == name)
            .map(|t| t.id)
            .ok_or_else(|| ClusterError::UnknownTunnel(name.to_owned()))
    }

    pub(crate) fn usable_data_node(&self, name: &str) -> Result<u32, ClusterError> {
        let id = *self
            .ids
            .get(name)
            .ok_or_else(|| ClusterError::UnknownNode(name.to_owned()))?;
        let n = self
            .nodes
            .get(&id)
            .ok_or_else(|| ClusterError::UnknownNode(name.to_owned()))?;
        let unsuitable = |reason| ClusterError::Unsuitable {
            name: name.to_owned(),
            reason,
        };
        if n.role != Role::Data {
            return Err(unsuitable("it is not a data node"));
        }
        if !n.alive {
            return Err(unsuitable("it is not alive"));
        }
        if n.draining {
            return Err(unsuitable("it is being drained"));
        }
        if n.leaving {
            return Err(unsuitable("the autoscaler is stopping it"));
        }
        Ok(id)
    }

    /// Moves `tunnel` to data node `to` (`protego ctl migrate`): its placement changes and
    /// it is rekeyed; the new CHILD_SA lands on `to` while the old one keeps working, and
    /// the old one is deleted once the rekey is done. Returns the (tunnel, node) ids.
    pub fn handle_migrate(
        &mut self,
        tunnel: &str,
        to: &str,
    ) -> Result<(TunnelId, u32), ClusterError> {
        let t = self.tunnel_by_name(tunnel)?;
        let node = self.usable_data_node(to)?;
        if !self.children.values().any(|c| c.tunnel == t) {
            return Err(ClusterError::NotUp(tunnel.to_owned()));
        }
        self.placement.insert(t, node);
        info!(tunnel, to, "migrating tunnel");
        self.rekey(vec![t], "migration");
        Ok((t, node))
    }

    /// Drains data node `name` (`protego ctl drain`): nothing new is placed on it, every
    /// attachment it serves is steered to another live node at once (the caller waits for
    /// the steer nodes' answers), and every tunnel on it moves to other live nodes. Returns
    /// the tunnels' moves.
    pub fn handle_drain(&mut self, name: &str) -> Result<Vec<(TunnelId, u32)>, ClusterError> {
        let id = *self
            .ids
            .get(name)
            .ok_or_else(|| ClusterError::UnknownNode(name.to_owned()))?;
        let Some(node) = self.nodes.get(&id) else {
            return Err(ClusterError::UnknownNode(name.to_owned()));
        };
        if node.role != Role::Data {
            return Err(ClusterError::Unsuitable {
                name: name.to_owned(),
                reason: "it is not a data node",
            });
        }
        if let Some(n) = self.nodes.get_mut(&id) {
            n.draining = true;
        }
        // Attachments first, all or none: their moves are steering flips.
        let served: Vec<u32> = self
            .attachments
            .values()
            .filter(|a| a.node == Some(id))
            .map(|a| a.id)
            .collect();
        let mut attachment_moves = Vec::new();
        for a in &served {
            let Some(to) = self.choose_attachment_planned(*a, id) else {
                let reason = if self.choose_attachment(*a, Some(id)).is_some() {
                    "the other data nodes' per-VM routes are not current yet (retry once they fetched the table)"
                } else {
                    "no other live data node can take its attachments"
                };
                self.drain_failed(id);
                return Err(ClusterError::Unsuitable {
                    name: name.to_owned(),
                    reason,
                });
            };
            attachment_moves.push((*a, to));
        }
        for (a, to) in &attachment_moves {
            if let Some(e) = self.attachments.get_mut(a) {
                e.node = Some(*to);
            }
        }
        if !served.is_empty() {
            info!(
                node = name,
                attachments = served.len(),
                "draining data node: attachments move"
            );
            self.emit_attachment_steering(&served, None);
        }
        // Spread tunnels (self-dispatch) do not move: the node leaves the ring, its virtual
        // MACs go to the others, then its CHILD_SAs are deleted with the peer.
        let mut tunnels: Vec<TunnelId> = self
            .children
            .values()
            .filter(|c| c.node == Some(id) && !self.spread(c.tunnel))
            .map(|c| c.tunnel)
            .collect();
        tunnels.sort();
        tunnels.dedup();
        let mut moves = Vec::new();
        for t in &tunnels {
            let Some(to) = self.choose_planned(*t, id) else {
                let reason = if self.choose(*t, Some(id)).is_some() {
                    "the other data nodes' per-VM routes are not current yet (retry once they fetched the table)"
                } else {
                    "no other live data node can take its tunnels"
                };
                self.drain_failed(id);
                return Err(ClusterError::Unsuitable {
                    name: name.to_owned(),
                    reason,
                });
            };
            self.placement.insert(*t, to);
            moves.push((*t, to));
        }
        info!(node = name, tunnels = moves.len(), "draining data node");
        self.rekey(tunnels, "drain");
        Ok(moves)
    }

    /// A drain of node `id` that could not be done: the node takes tunnels and attachments
    /// again (those without a serving node are served there at once).
    fn drain_failed(&mut self, id: u32) {
        if let Some(n) = self.nodes.get_mut(&id) {
            n.draining = false;
        }
        let placed = self.place_attachments(None);
        self.emit_attachment_steering(&placed, None);
    }

    /// Ends a drain: the node takes tunnels and attachments again (attachments without a
    /// serving node are served there at once).
    pub fn handle_undrain(&mut self, name: &str) -> Result<(), ClusterError> {
        let id = *self
            .ids
            .get(name)
            .ok_or_else(|| ClusterError::UnknownNode(name.to_owned()))?;
        if let Some(n) = self.nodes.get_mut(&id) {
            n.draining = false;
        }
        let placed = self.place_attachments(None);
        self.emit_attachment_steering(&placed, None);
        Ok(())
    }
}
