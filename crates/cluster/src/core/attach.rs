//! Customer attachments in the distributed form (issue 16, docs/architecture.md "Moving
//! tunnels", docs/operations.md "Customer attachments in the distributed form"): every data node holds every attachment; the core only chooses the data node
//! serving each one, i.e. where the steer node owning its port sends the CE's frames (a port
//! tag) and where every steer node sends the hosts' VXLAN for the prefixes behind the CE (the
//! first selectors of its VNI). A move is therefore a steering flip: the new node already
//! holds the attachment, and the old one keeps serving the frames already on their way.
//!
//! An attachment is steerable once the steer node named in its configuration announced the
//! interface in its Hello (`[steer] ports`): the port's id and MAC come from there. Until then
//! it is left out of what the data nodes hold and of the steering, and shown unsteered.

use super::{
    AttachmentEntry, AttachmentMeta, AttachmentRoute, AttachmentStatus, AttachmentTraffic, Await,
    ClusterCore, ClusterError, Directive, PortInfo, Role,
};
use datapath::{AttachmentConfig, AttachmentPort, AttachmentTags};
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::Instant;
use tracing::{info, warn};

/// The port table key of an attachment's tags on port `port`.
pub(crate) fn port_key(port: u32, tags: AttachmentTags) -> steer::PortKey {
    let (s_tag, c_tag) = match tags {
        AttachmentTags::QinQ { s_tag, c_tag } => (s_tag, c_tag),
        AttachmentTags::Vlan { c_tag } => (0, c_tag),
    };
    steer::PortKey {
        port: steer::PortId(port),
        s_tag,
        c_tag,
    }
}

/// The name of the interface an attachment's configuration names on its steer node.
fn interface(meta: &AttachmentMeta) -> &str {
    match &meta.config.port {
        AttachmentPort::Interface(name) => name,
        // Already resolved, which the configuration never gives: no port has this name.
        AttachmentPort::Steer { .. } => "",
    }
}

/// Where an attachment's port is: its steer node's id and Geneve address, and the port.
#[derive(Debug, Clone)]
pub(crate) struct PortOwner {
    pub(crate) steer: u32,
    pub(crate) geneve: SocketAddr,
    pub(crate) port: PortInfo,
}

impl ClusterCore {
    // ---- getters ----

    /// The configured attachments by id.
    pub fn attachments(&self) -> &std::collections::BTreeMap<u32, AttachmentEntry> {
        &self.attachments
    }

    /// The id of the attachment called `name`.
    pub fn attachment_by_name(&self, name: &str) -> Option<u32> {
        self.attachments
            .values()
            .find(|a| a.meta.config.name == name)
            .map(|a| a.id)
    }

    /// The port of attachment `a`, if its steer node announced the interface.
    pub(crate) fn port_owner(&self, a: &AttachmentEntry) -> Option<PortOwner> {
        let steer = *self.ids.get(&a.meta.steer)?;
        let node = self.nodes.get(&steer).filter(|n| n.role == Role::Steer)?;
        let port = self
            .ports
            .get(&a.meta.steer)?
            .iter()
            .find(|p| p.interface == interface(&a.meta))?
            .clone();
        Some(PortOwner {
            steer,
            geneve: node.geneve,
            port,
        })
    }

    /// Every steerable attachment as the data nodes hold it: on its steer node's port, with
    /// the CE MAC learned so far.
    pub fn resolved_attachments(&self) -> Vec<AttachmentConfig> {
        self.attachments
            .values()
            .filter_map(|a| {
                let owner = self.port_owner(a)?;
                let mut c = a.meta.config.clone();
                c.port = AttachmentPort::Steer {
                    geneve: owner.geneve,
                    port: owner.port.id,
                    mac: owner.port.mac,
                };
                c.ce_mac = a.ce_mac.or(c.ce_mac);
                Some(c)
            })
            .collect()
    }

    /// The steered attachments on steer node `steer`'s own ports (its port table).
    pub fn steer_attachments(&self, steer: u32) -> Vec<(steer::PortKey, steer::AttachEntry)> {
        let mut out: Vec<_> = self
            .attachments
            .values()
            .filter_map(|a| {
                let node = a.node?;
                let owner = self.port_owner(a).filter(|o| o.steer == steer)?;
                Some((
                    port_key(owner.port.id, a.meta.config.tags),
                    steer::AttachEntry {
                        node: steer::NodeId(node),
                        attachment: steer::AttachmentId(a.id),
                        vni: a.meta.vni.and_then(wire::vxlan::Vni::new),
                    },
                ))
            })
            .collect();
        out.sort_by_key(|(k, _)| *k);
        out
    }

    /// The steered attachments' routes in VNI `vni`, in attachment order.
    pub(crate) fn attachment_routes(&self, vni: u32) -> Vec<AttachmentRoute> {
        self.attachments
            .values()
            .filter(|a| a.meta.vni == Some(vni) && self.port_owner(a).is_some())
            .filter_map(|a| Some((a, a.node?)))
            .flat_map(|(a, node)| {
                a.meta
                    .config
                    .routes
                    .iter()
                    .map(move |&prefix| AttachmentRoute {
                        attachment: a.id,
                        node,
                        prefix,
                    })
            })
            .collect()
    }

    /// The VNIs of the configured attachments.
    pub(crate) fn attachment_vnis(&self) -> impl Iterator<Item = u32> + '_ {
        self.attachments.values().filter_map(|a| a.meta.vni)
    }

    /// The names of the attachments data node `id` serves, or whose ports steer node `id`
    /// owns.
    pub(crate) fn attachments_of_node(&self, id: u32) -> Vec<String> {
        self.attachments
            .values()
            .filter(|a| a.node == Some(id) || self.port_owner(a).is_some_and(|o| o.steer == id))
            .map(|a| a.meta.config.name.clone())
            .collect()
    }

    /// Every attachment as `protego ctl nodes` shows it.
    pub(crate) fn attachment_status(&self) -> Vec<AttachmentStatus> {
        self.attachments
            .values()
            .map(|a| {
                // The tags alone (the port's id is `port`).
                let tags = port_key(0, a.meta.config.tags);
                AttachmentStatus {
                    name: a.meta.config.name.clone(),
                    steer: a.meta.steer.clone(),
                    interface: interface(&a.meta).to_owned(),
                    port: self.port_owner(a).map(|o| o.port.id),
                    node: a
                        .node
                        .and_then(|n| self.nodes.get(&n))
                        .map(|n| n.name.clone()),
                    ce_mac: a.ce_mac,
                    s_tag: tags.s_tag,
                    c_tag: tags.c_tag,
                    traffic: self.attachment_traffic(a),
                }
            })
            .collect()
    }

    /// `a`'s frames as the steer node owning its port last reported them (by the attachment's
    /// id and the port's current tag pair).
    fn attachment_traffic(&self, a: &AttachmentEntry) -> Option<AttachmentTraffic> {
        let owner = self.port_owner(a)?;
        let key = port_key(owner.port.id, a.meta.config.tags);
        let report = self.nodes.get(&owner.steer)?.last_report.as_ref()?;
        report
            .attachments
            .iter()
            .find(|t| {
                t.attachment == a.id
                    && t.port == key.port.0
                    && (t.s_tag, t.c_tag) == (key.s_tag, key.c_tag)
            })
            .copied()
    }

    /// The data node for attachment `id`: its serving node if still usable, else chosen
    /// as for a tunnel ([`ClusterCore::choose`]: fewest tunnels and attachments), never
    /// `exclude`; among the nodes that confirmed holding the attachments if any can (the
    /// others hold them too once their answer comes).
    pub fn choose_attachment(&self, id: u32, exclude: Option<u32>) -> Option<u32> {
        let current = self.attachments.get(&id).and_then(|a| a.node);
        let what = super::placement::Placed::Attachment(id);
        self.choose_node(current, what, exclude, |n| self.holds_attachments(n))
            .or_else(|| self.choose_node(current, what, exclude, |_| true))
    }

    /// [`Self::choose_attachment`] for a planned move off data node `from` (a drain, an
    /// autoscaler's stop): as [`ClusterCore::choose_planned`], a node whose per-VM routes
    /// are behind only if `from`'s are too.
    pub fn choose_attachment_planned(&self, id: u32, from: u32) -> Option<u32> {
        let routed = |n| self.routed_for(from, n);
        let current = self
            .attachments
            .get(&id)
            .and_then(|a| a.node)
            .filter(|&c| routed(c));
        let what = super::placement::Placed::Attachment(id);
        self.choose_node(current, what, Some(from), |n| {
            self.holds_attachments(n) && routed(n)
        })
        .or_else(|| self.choose_node(current, what, Some(from), routed))
    }

    // ---- inputs ----

    /// The configured attachments (at start, or replaced): ids are kept by name; every live
    /// data node gets the steerable ones, and the steer nodes their new tables.
    pub fn handle_attachments(&mut self, metas: Vec<AttachmentMeta>, now: Instant) {
        let had_any = !self.attachments.is_empty();
        let mut old: HashMap<String, AttachmentEntry> = std::mem::take(&mut self.attachments)
            .into_values()
            .map(|a| (a.meta.config.name.clone(), a))
            .collect();
        for meta in metas {
            let name = meta.config.name.clone();
            let id = match self.attachment_ids.get(&name) {
                Some(id) => *id,
                None => {
                    let id = self.attachment_ids.len() as u32 + 1;
                    self.attachment_ids.insert(name.clone(), id);
                    id
                }
            };
            let (node, ce_mac) = old
                .remove(&name)
                .map_or((None, None), |a| (a.node, a.ce_mac));
            self.attachments.insert(
                id,
                AttachmentEntry {
                    id,
                    meta,
                    node,
                    ce_mac,
                },
            );
        }
        self.place_attachments(None);
        self.log_unsteered();
        if had_any || !self.attachments.is_empty() {
            self.fire_attachments();
        }
        if self.reconciled {
            self.push_tables(now);
        }
    }

    /// Data node `from` learned attachment `name`'s CE MAC (or saw it change): recorded, and
    /// passed on to every live data node (the others may serve it after a move; `from` may
    /// have been given its older MAC by a `set_attachments` sent meanwhile). Unknown
    /// attachments and unchanged MACs are ignored.
    pub fn handle_ce_learned(&mut self, from: u32, name: &str, mac: [u8; 6]) {
        let Some(id) = self.attachment_by_name(name) else {
            warn!(
                node = from,
                attachment = name,
                "CE MAC learned for an unknown attachment; ignored"
            );
            return;
        };
        let Some(a) = self.attachments.get_mut(&id) else {
            return;
        };
        if a.ce_mac == Some(mac) {
            return;
        }
        a.ce_mac = Some(mac);
        info!(
            node = from,
            attachment = name,
            "CE MAC learned; passed on to the data nodes"
        );
        // The node that learned it too: a `set_attachments` sent before this report arrived
        // may have set the MAC it held until then there (it is not reported back).
        self.fire_data_nodes(&Directive::SetCeMac {
            attachment: name.to_owned(),
            mac,
        });
    }

    /// Moves attachment `name` to data node `to` (`protego ctl migrate`): the steer node
    /// owning its port and every steer node's VNI selectors flip to `to` (acknowledged by the
    /// caller before it answers). `to` must have confirmed that it holds the current
    /// attachments; every data node holds them, so nothing is installed first and frames
    /// already sent to the old node are still served there.
    /// Returns the (attachment, node) ids.
    pub fn handle_migrate_attachment(
        &mut self,
        name: &str,
        to: &str,
    ) -> Result<(u32, u32), ClusterError> {
        let id = self
            .attachment_by_name(name)
            .ok_or_else(|| ClusterError::UnknownAttachment(name.to_owned()))?;
        let a = &self.attachments[&id];
        if self.port_owner(a).is_none() {
            return Err(ClusterError::Unsteered {
                name: name.to_owned(),
                reason: format!(
                    "steer node {:?} has not announced interface {:?} ([steer] ports)",
                    a.meta.steer,
                    interface(&a.meta)
                ),
            });
        }
        let node = self.usable_data_node(to)?;
        if !self.holds_attachments(node) {
            return Err(ClusterError::Unsuitable {
                name: to.to_owned(),
                reason: "it has not confirmed that it holds the attachments (set_attachments)",
            });
        }
        if self.attachments.get(&id).and_then(|a| a.node) != Some(node) {
            if let Some(a) = self.attachments.get_mut(&id) {
                a.node = Some(node);
            }
            info!(attachment = name, to, "migrating attachment");
            self.emit_attachment_steering(&[id], None);
        }
        Ok((id, node))
    }

    /// The answer to the attachments sent with `token` ([`Await::Attachments`]): on success
    /// the node holds them (a migration may go there).
    pub fn handle_attachments_answer(&mut self, token: u64, ok: bool) {
        let Some(i) = self.attachment_acks.iter().position(|a| a.0 == token) else {
            return;
        };
        let (_, node, version) = self.attachment_acks.remove(i);
        if ok {
            let held = self.attachments_held.entry(node).or_default();
            *held = (*held).max(version);
        } else {
            warn!(node, "data node did not take the attachments");
        }
    }

    /// The attachments sent whose answers have not come yet, by token.
    pub fn pending_attachment_acks(&self) -> Vec<u64> {
        self.attachment_acks.iter().map(|a| a.0).collect()
    }

    /// True if data node `id` confirmed it holds the current attachments.
    pub fn holds_attachments(&self, id: u32) -> bool {
        self.attachments_held.get(&id) == Some(&self.attachments_version)
    }

    /// Queues every steerable attachment to data node `id`, its answer pending: a new version
    /// when what they are (CE MACs aside, which `set_ce_mac` carries) changed since the last.
    /// Not before the control loop reconciled: after a takeover the data nodes keep what they
    /// hold until then, while the steer nodes whose ports make them steerable say hello (sent
    /// earlier, a list missing a late steer node's attachments would take them from the data
    /// nodes its frames still go to).
    pub(crate) fn send_attachments(&mut self, id: u32) {
        if !self.reconciled {
            return;
        }
        let all = self.resolved_attachments();
        let shape: Vec<AttachmentConfig> = all
            .iter()
            .map(|a| AttachmentConfig {
                ce_mac: None,
                ..a.clone()
            })
            .collect();
        if shape != self.attachments_sent {
            self.attachments_sent = shape;
            self.attachments_version += 1;
        }
        let token = self.token();
        self.attachment_acks
            .push((token, id, self.attachments_version));
        self.emit(
            id,
            Directive::SetAttachments(all),
            Await::Attachments(token),
        );
    }

    /// [`Self::send_attachments`] to every live data node.
    pub(crate) fn fire_attachments(&mut self) {
        for id in self.live_data_nodes() {
            self.send_attachments(id);
        }
    }

    // ---- placement and steering ----

    /// Gives every steerable attachment without a usable serving node one (never `exclude`),
    /// and takes the node of those no longer steerable. Returns the attachments whose node
    /// changed. Nothing before the control loop reconciled: after a takeover the steer nodes
    /// keep steering by the old control node's placement until then, and the attachments are
    /// spread over every data node that registered by then.
    pub(crate) fn place_attachments(&mut self, exclude: Option<u32>) -> Vec<u32> {
        if !self.reconciled {
            return Vec::new();
        }
        let ids: Vec<u32> = self.attachments.keys().copied().collect();
        let mut changed = Vec::new();
        for id in ids {
            let steerable = self.port_owner(&self.attachments[&id]).is_some();
            let want = if steerable {
                self.choose_attachment(id, exclude)
            } else {
                None
            };
            let Some(a) = self.attachments.get_mut(&id) else {
                continue;
            };
            if a.node != want {
                match want {
                    Some(n) => {
                        info!(attachment = %a.meta.config.name, node = n, "attachment placed")
                    }
                    None if steerable => {
                        warn!(attachment = %a.meta.config.name, "no live data node can serve the attachment")
                    }
                    None => {}
                }
                a.node = want;
                changed.push(id);
            }
        }
        changed
    }

    /// Logs the attachments whose port no steer node announced.
    fn log_unsteered(&self) {
        for a in self.attachments.values() {
            if self.port_owner(a).is_none() {
                warn!(attachment = %a.meta.config.name, steer = %a.meta.steer, interface = interface(&a.meta),
                    "attachment not steered: its steer node has not announced the interface");
            }
        }
    }

    /// Queues the port tags of `changed` to the live steer nodes owning their ports (a tag
    /// pair without a serving node is removed), except `skip`.
    pub(crate) fn emit_port_tags(&mut self, changed: &[u32], skip: Option<u32>) {
        for id in changed {
            let Some(a) = self.attachments.get(id) else {
                continue;
            };
            let Some(owner) = self.port_owner(a) else {
                continue;
            };
            if Some(owner.steer) == skip
                || !self
                    .nodes
                    .get(&owner.steer)
                    .is_some_and(|n| n.alive && n.session_open)
            {
                continue;
            }
            let key = port_key(owner.port.id, a.meta.config.tags);
            let d = match a.node {
                Some(node) => Directive::SetPortTag(
                    key,
                    steer::AttachEntry {
                        node: steer::NodeId(node),
                        attachment: steer::AttachmentId(a.id),
                        vni: a.meta.vni.and_then(wire::vxlan::Vni::new),
                    },
                ),
                None => Directive::RemovePortTag(key),
            };
            self.emit(owner.steer, d, Await::Steer);
        }
    }

    /// Queues the selectors of the VNIs of `changed` to every live steer node but `skip`. Not
    /// before the control loop reconciled: a VNI's list then may lack tunnels of data nodes
    /// yet to register, and the steer nodes keep what they have until the whole tables come
    /// (the attachments' old serving nodes still serve them meanwhile).
    pub(crate) fn emit_attachment_selectors(&mut self, changed: &[u32], skip: Option<u32>) {
        if !self.reconciled {
            return;
        }
        let vnis: BTreeSet<u32> = changed
            .iter()
            .filter_map(|id| self.attachments.get(id)?.meta.vni)
            .collect();
        for vni in vnis {
            let d = Directive::SetSelectors(self.vni_selectors(vni));
            for steer in self.live_steers() {
                if Some(steer) != skip {
                    self.emit(steer, d.clone(), Await::Steer);
                }
            }
        }
    }

    /// [`Self::emit_port_tags`] then [`Self::emit_attachment_selectors`].
    pub(crate) fn emit_attachment_steering(&mut self, changed: &[u32], skip: Option<u32>) {
        if changed.is_empty() {
            return;
        }
        self.emit_port_tags(changed, skip);
        self.emit_attachment_selectors(changed, skip);
    }

    /// Steer node `id` (`name`) announced `ports` (`before`: the steerable attachments as
    /// they were before its Hello): if that changes any of them, every live data node gets the
    /// attachments again and those placed or moved by it are steered (by every live steer node
    /// but the newcomer, whose whole tables carry them).
    pub(crate) fn handle_ports(
        &mut self,
        id: u32,
        name: &str,
        ports: Vec<PortInfo>,
        before: &[AttachmentConfig],
    ) {
        if ports.is_empty() {
            self.ports.remove(name);
        } else {
            self.ports.insert(name.to_owned(), ports);
        }
        let after = self.resolved_attachments();
        if before == after.as_slice() {
            return;
        }
        let changed = self.place_attachments(None);
        self.log_unsteered();
        self.fire_attachments();
        self.emit_attachment_steering(&changed, Some(id));
    }
}
