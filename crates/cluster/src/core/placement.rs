//! Placement: which data node takes a tunnel's next CHILD_SA, which tunnels are stranded,
//! and the pacing of their rekeys.

use super::{ClusterCore, Role, REKEY_RETRY};
use ike::TunnelId;
use std::collections::HashMap;
use std::time::Instant;

/// What is being placed (it does not count against the node it may stay on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placed {
    /// A tunnel.
    Tunnel(TunnelId),
    /// An attachment, by id.
    Attachment(u32),
}

impl ClusterCore {
    /// The data node for a new CHILD_SA of `tunnel`: its placement if that node is alive and
    /// not draining, else the live data node with the fewest tunnels and attachments (then
    /// lowest utilization, then lowest id), never `exclude`, and a parked one only if no other
    /// is left.
    pub fn choose(&self, tunnel: TunnelId, exclude: Option<u32>) -> Option<u32> {
        let current = self.placement.get(&tunnel).copied();
        self.choose_node(current, Placed::Tunnel(tunnel), exclude, |_| true)
    }

    /// [`Self::choose`] for a planned move of `tunnel` off data node `from` (a drain): a node
    /// whose per-VM routes are behind is chosen only if `from`'s are too (no worse than
    /// staying), never as the fallback [`Self::choose`] allows. A planned move can wait until
    /// the routes are fetched; a lost node's tunnels cannot, so failover keeps the fallback.
    /// A placement already pointing at such a node (a move under way when the drain began) is
    /// not kept either.
    pub fn choose_planned(&self, tunnel: TunnelId, from: u32) -> Option<u32> {
        let current = self
            .placement
            .get(&tunnel)
            .copied()
            .filter(|&c| self.routed_for(from, c));
        self.choose_node(current, Placed::Tunnel(tunnel), Some(from), |n| {
            self.routed_for(from, n)
        })
    }

    /// True if a planned move off `from` may go to `to` as far as per-VM routes go: `to`'s
    /// are current, or `from`'s are not either.
    pub(crate) fn routed_for(&self, from: u32, to: u32) -> bool {
        self.routes_behind.contains(&from) || !self.routes_behind.contains(&to)
    }

    /// Says whether data node `id`'s per-VM routes are the master table's: one that is not is
    /// chosen for something new only if no usable node is current.
    pub fn set_routes_current(&mut self, id: u32, current: bool) {
        if current {
            self.routes_behind.remove(&id);
        } else {
            self.routes_behind.insert(id);
        }
    }

    /// Says whether data node `id` runs the tenant filter set (it refused it: `false`); one
    /// that does not is chosen for something new only if no usable node does.
    pub fn set_filters_current(&mut self, id: u32, current: bool) {
        if current {
            self.filters_refused.remove(&id);
        } else {
            self.filters_refused.insert(id);
        }
    }

    /// True if data node `id` is chosen for something new only when no other can be: its
    /// per-VM routes are behind, or it refused the tenant filters.
    fn behind(&self, id: u32) -> bool {
        self.routes_behind.contains(&id) || self.filters_refused.contains(&id)
    }

    /// [`Self::choose`] for `what`, placed on `current` so far; a new node only among those
    /// `eligible` says.
    pub(crate) fn choose_node(
        &self,
        current: Option<u32>,
        what: Placed,
        exclude: Option<u32>,
        eligible: impl Fn(u32) -> bool,
    ) -> Option<u32> {
        let usable = |id: &u32| {
            Some(*id) != exclude
                && self
                    .nodes
                    .get(id)
                    .is_some_and(|n| n.role == Role::Data && n.alive && !n.draining && !n.leaving)
        };
        if let Some(p) = current.filter(|p| usable(p)) {
            return Some(p);
        }
        let mut count: HashMap<u32, usize> = HashMap::new();
        for (t, n) in &self.placement {
            if what != Placed::Tunnel(*t) {
                *count.entry(*n).or_default() += 1;
            }
        }
        for a in self.attachments.values() {
            if let Some(n) = a.node.filter(|_| what != Placed::Attachment(a.id)) {
                *count.entry(n).or_default() += 1;
            }
        }
        // Parked nodes (held in reserve by the autoscaler) only when no other can.
        let unparked = self
            .nodes
            .keys()
            .filter(|id| usable(id))
            .any(|id| !self.nodes[id].parked);
        // Nodes whose routes are behind (or that refused the filters) only when no current
        // one can.
        let routed = self
            .nodes
            .keys()
            .filter(|id| usable(id) && !(unparked && self.nodes[*id].parked) && eligible(**id))
            .any(|id| !self.behind(*id));
        self.nodes
            .keys()
            .filter(|id| usable(id) && !(unparked && self.nodes[*id].parked) && eligible(**id))
            .filter(|id| !(routed && self.behind(**id)))
            .min_by(|a, b| {
                let util = |id: &u32| {
                    self.nodes[id]
                        .last_report
                        .as_ref()
                        .map_or(0.0, |r| r.utilization)
                };
                count
                    .get(a)
                    .copied()
                    .unwrap_or(0)
                    .cmp(&count.get(b).copied().unwrap_or(0))
                    .then(util(a).total_cmp(&util(b)))
                    .then(a.cmp(b))
            })
            .copied()
    }

    /// Tunnels with a CHILD_SA that no live data node holds.
    pub fn unplaced(&self) -> Vec<TunnelId> {
        let mut out: Vec<TunnelId> = self
            .children
            .iter()
            .filter(|(spi, c)| {
                c.node
                    .is_none_or(|n| self.nodes.get(&n).is_none_or(|n| !n.alive))
                    && !self.spread_deleting(**spi)
            })
            .map(|(_, c)| c.tunnel)
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Of `tunnels`, those not asked to rekey within [`REKEY_RETRY`]; records the request.
    pub(crate) fn due(&mut self, tunnels: Vec<TunnelId>, now: Instant) -> Vec<TunnelId> {
        tunnels
            .into_iter()
            .filter(|t| {
                let due = self
                    .rekey_at
                    .get(t)
                    .is_none_or(|at| now.duration_since(*at) >= REKEY_RETRY);
                if due {
                    self.rekey_at.insert(*t, now);
                }
                due
            })
            .collect()
    }

    /// Marks the CHILD_SAs on `id` as unplaced; returns their tunnels.
    pub(crate) fn lose_node_children(&mut self, id: u32) -> Vec<TunnelId> {
        let mut lost = Vec::new();
        for c in self.children.values_mut().filter(|c| c.node == Some(id)) {
            c.node = None;
            c.last_node = Some(id);
            lost.push(c.tunnel);
        }
        lost
    }

    /// Makes the newest remaining CHILD_SA of `tunnel` (if any) its sending one, unless one
    /// already sends.
    pub(crate) fn promote_sender(&mut self, tunnel: TunnelId) {
        if self
            .children
            .values()
            .any(|c| c.tunnel == tunnel && c.sending)
        {
            return;
        }
        let next = self
            .children
            .iter()
            .filter(|(_, c)| c.tunnel == tunnel)
            .max_by_key(|(_, c)| c.seq)
            .map(|(spi, _)| *spi);
        if let Some(c) = next.and_then(|spi| self.children.get_mut(&spi)) {
            c.sending = true;
        }
    }

    /// Marks data node `id` lost: its CHILD_SAs are detached, its tunnels and attachments
    /// placed elsewhere, the steer nodes told (port tags of the moved attachments, every VNI's
    /// selectors, the data nodes), the tunnels rekeyed.
    pub(crate) fn lost(&mut self, id: u32, why: &'static str, now: Instant) {
        if let Some(n) = self.nodes.get_mut(&id) {
            n.alive = false;
            tracing::warn!(node = %n.name, id, why, "data node lost");
        }
        let mut tunnels = self.lose_node_children(id);
        // Spread tunnels keep their other nodes' CHILD_SAs: the lost ones are deleted.
        let spread = self.spread_lost(id);
        tunnels.retain(|t| !spread.contains(t));
        tunnels.extend(
            self.placement
                .iter()
                .filter(|(t, n)| **n == id && !spread.contains(t))
                .map(|(t, _)| *t),
        );
        tunnels.sort();
        tunnels.dedup();
        for t in &tunnels {
            match self.choose(*t, Some(id)) {
                Some(node) => {
                    self.placement.insert(*t, node);
                }
                None => {
                    self.placement.remove(t);
                }
            }
        }
        let attachments = self.place_attachments(Some(id));
        if !attachments.is_empty() {
            tracing::info!(
                node = id,
                attachments = attachments.len(),
                why,
                "moving the attachments of a lost data node"
            );
        }
        self.emit_port_tags(&attachments, None);
        for d in self.all_vni_directives() {
            self.emit_steers(&d, super::Await::Steer);
        }
        let nodes = self.steer_nodes();
        self.emit_steers(&super::Directive::SetNodes(nodes), super::Await::Steer);
        if !tunnels.is_empty() {
            tracing::info!(
                node = id,
                tunnels = tunnels.len(),
                why,
                "moving the tunnels of a lost data node"
            );
        }
        let tunnels = self.due(tunnels, now);
        self.rekey(tunnels, why);
        // Self-dispatch: its virtual MACs go to its successor at once.
        self.dispatch_forget(id);
        self.dispatch_update(now);
    }
}
