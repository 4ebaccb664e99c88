//! The cluster core: the control node's registry of data and steer nodes, placement of
//! CHILD_SAs, the steer nodes' tables, moves and failover, as a state machine without I/O
//! (docs/architecture.md, "Cluster core").
//!
//! [`ClusterCore`] never reads the clock (every input that depends on time carries `now`),
//! never blocks, spawns, locks or builds protobuf messages. Its inputs are `handle_*`
//! methods (a node's hello, report, loss, health verdicts and answers, operator and control
//! loop commands, timer ticks); its outputs collect in an [`Outbox`] the caller takes with
//! [`ClusterCore::poll_outbox`] after every input:
//!
//! 1. [`Outbox::send`]: directives to queue to nodes now, in order, each saying which answer
//!    the core waits for ([`Await`]);
//! 2. once every [`Await::Steer`] answer of step 1 has been fed back,
//!    [`Outbox::after_steers`]: the directives that must wait for the steer nodes to move
//!    traffic away first (the removal of a CHILD_SA from its data node);
//! 3. [`Outbox::rekeys`]: tunnels the control loop must rekey, and
//!    [`Outbox::ike_steers`]: the steer nodes IKE goes through, when it changed.
//!
//! Waiting for an answer is an explicit state of the core: an install in flight is a
//! [`ChildEntry`] with `installing` set to its node until [`ClusterCore::handle_install_answer`],
//! which takes the node from there and ignores an answer with no install pending; shares
//! and whole tables sent to steer nodes are pending until their answer or its absence is
//! fed back.
//!
//! The thin shell around it is [`crate::manager::Cluster`].

mod attach;
mod autoscale;
mod dispatch;
mod moves;
mod placement;
mod steering;
mod types;

#[cfg(test)]
mod dispatch_tests;
#[cfg(test)]
mod sim;

pub use autoscale::{PlanEffects, ProviderCall};
pub use dispatch::{DispatchMove, DispatchState, DispatchStatus, Owners};
pub use types::*;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tracing::info;
use wire::EspSpi;

use ike::TunnelId;

/// How long steer nodes keep steering a removed CHILD_SA's SPI: the data node's grace for
/// late inbound packets (`dataplane` keeps a removed SA opening packets for 5 s).
pub const STEER_GRACE: Duration = Duration::from_secs(5);

/// How often a tunnel whose CHILD_SA has no live data node is rekeyed again.
pub const REKEY_RETRY: Duration = Duration::from_secs(5);

/// The control node's view of the cluster as a state machine (see the module's doc for the
/// order of inputs and outputs).
#[derive(Debug)]
pub struct ClusterCore {
    /// Where steer nodes send IKE to this control node.
    pub(crate) geneve: SocketAddr,
    /// The names of the data nodes a node provider manages: they register parked.
    pub(crate) provided: HashSet<String>,
    /// The configured tunnels.
    pub(crate) tunnels: BTreeMap<TunnelId, TunnelMeta>,
    /// The gateway addresses of each VNI's VNets.
    pub(crate) gateways: BTreeMap<u32, Vec<String>>,
    pub(crate) nodes: BTreeMap<u32, NodeEntry>,
    /// Data nodes whose per-VM routes are not the master table's (behind, or fetching): not
    /// chosen for new tunnels and attachments while a current one can be.
    pub(crate) routes_behind: HashSet<u32>,
    /// Data nodes that refused the running tenant filter set: not chosen for new tunnels and
    /// attachments while another can be (they would carry the tenants' traffic unfiltered).
    pub(crate) filters_refused: HashSet<u32>,
    pub(crate) ids: HashMap<String, u32>,
    pub(crate) placement: HashMap<TunnelId, u32>,
    pub(crate) children: HashMap<EspSpi, ChildEntry>,
    pub(crate) seq: u64,
    /// Removed CHILD_SAs whose SPI stays steered to their node until the instant.
    pub(crate) retiring: Vec<Retiring>,
    /// When a rekey was last asked for each tunnel (retries are paced).
    pub(crate) rekey_at: HashMap<TunnelId, Instant>,
    /// The CHILD_SAs of the restored IKE SAs by inbound SPI, once reconciled: a data node
    /// arriving later with one of them, as described there, still has it adopted.
    pub(crate) known: HashMap<EspSpi, dataplane::KnownChild>,
    /// Steer nodes whose whole tables are on their way (not resent until answered).
    pub(crate) resyncing: HashSet<u32>,
    /// Steer nodes that missed an update and get the whole tables again.
    pub(crate) resync: Vec<u32>,
    /// Until the control loop reconciled its restored CHILD_SAs: CHILD_SAs data nodes hold
    /// are adopted as they are. Afterwards a held CHILD_SA the control loop does not know is
    /// removed from its node.
    pub(crate) reconciled: bool,
    /// The steer nodes' demand per tunnel and what each was sent, which divides each tunnel's
    /// limit among them.
    pub(crate) shares: steer::RateShares,
    /// Shares sent to steer nodes whose answers have not come yet (a lowered share counts at
    /// its old value until then), by token.
    pub(crate) share_acks: Vec<ShareAck>,
    pub(crate) next_token: u64,
    /// Install answers ignored because no install of their CHILD_SA was pending.
    pub(crate) ignored_answers: u64,
    /// The configured customer attachments by id, with their serving data nodes.
    pub(crate) attachments: BTreeMap<u32, AttachmentEntry>,
    /// Attachment ids by name (stable for the core's lifetime).
    pub(crate) attachment_ids: HashMap<String, u32>,
    /// Each steer node's customer-facing ports (by its name), from its last Hello.
    pub(crate) ports: HashMap<String, Vec<PortInfo>>,
    /// The attachments last sent to data nodes (CE MACs aside).
    pub(crate) attachments_sent: Vec<datapath::AttachmentConfig>,
    /// Their version: bumped whenever what is sent changes.
    pub(crate) attachments_version: u64,
    /// The version of the attachments each data node confirmed holding.
    pub(crate) attachments_held: HashMap<u32, u64>,
    /// Attachments sent whose answers have not come: (token, node, version).
    pub(crate) attachment_acks: Vec<(u64, u32, u64)>,
    /// Self-dispatch: the ring, the owners of the virtual MACs, the nodes' tables.
    pub(crate) dispatch: DispatchState,
    pub(crate) outbox: Outbox,
}

impl ClusterCore {
    /// A core with no nodes: `geneve` is where steer nodes send IKE to control, `provided`
    /// the names of the data nodes a node provider manages, `tunnels` and `gateways` the
    /// configured tunnels and each VNI's gateway addresses, `share_grace` how long a lost
    /// steer node's shares stay reserved.
    pub fn new(
        geneve: SocketAddr,
        provided: HashSet<String>,
        tunnels: Vec<TunnelMeta>,
        gateways: BTreeMap<u32, Vec<String>>,
        share_grace: Duration,
    ) -> Self {
        Self {
            geneve,
            provided,
            tunnels: tunnels.into_iter().map(|t| (t.id, t)).collect(),
            gateways,
            nodes: BTreeMap::new(),
            routes_behind: HashSet::new(),
            filters_refused: HashSet::new(),
            ids: HashMap::new(),
            placement: HashMap::new(),
            children: HashMap::new(),
            seq: 0,
            retiring: Vec::new(),
            rekey_at: HashMap::new(),
            known: HashMap::new(),
            resyncing: HashSet::new(),
            resync: Vec::new(),
            reconciled: false,
            shares: steer::RateShares::new(steer::ShareConfig {
                lost_grace: share_grace,
                ..steer::ShareConfig::default()
            }),
            share_acks: Vec::new(),
            next_token: 1,
            ignored_answers: 0,
            attachments: BTreeMap::new(),
            attachment_ids: HashMap::new(),
            ports: HashMap::new(),
            attachments_sent: Vec::new(),
            attachments_version: 0,
            attachments_held: HashMap::new(),
            attachment_acks: Vec::new(),
            dispatch: DispatchState::default(),
            outbox: Outbox::default(),
        }
    }

    /// Everything the inputs since the last call produced.
    pub fn poll_outbox(&mut self) -> Outbox {
        std::mem::take(&mut self.outbox)
    }

    // ---- getters ----

    /// The id of the node called `name` (stable for the core's lifetime; assigned on first
    /// use).
    pub fn node_id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.ids.len() as u32 + 1;
        self.ids.insert(name.to_owned(), id);
        id
    }

    /// The id of `name` if it was ever seen.
    pub fn known_id(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    /// Node `id`, if registered.
    pub fn node(&self, id: u32) -> Option<&NodeEntry> {
        self.nodes.get(&id)
    }

    /// Every registered node by id.
    pub fn nodes(&self) -> &BTreeMap<u32, NodeEntry> {
        &self.nodes
    }

    /// The installed CHILD_SAs by inbound SPI.
    pub fn children(&self) -> &HashMap<EspSpi, ChildEntry> {
        &self.children
    }

    /// The data node each tunnel's next CHILD_SA goes to.
    pub fn placement(&self) -> &HashMap<TunnelId, u32> {
        &self.placement
    }

    /// The configured tunnels.
    pub fn tunnels(&self) -> &BTreeMap<TunnelId, TunnelMeta> {
        &self.tunnels
    }

    /// Removed CHILD_SAs still steered for their grace.
    pub fn retiring(&self) -> &[Retiring] {
        &self.retiring
    }

    /// How many install answers were ignored because no install of their CHILD_SA was
    /// pending (duplicates, or answers for an SA removed meanwhile).
    pub fn ignored_answers(&self) -> u64 {
        self.ignored_answers
    }

    /// True once the control loop reconciled its restored CHILD_SAs.
    pub fn reconciled(&self) -> bool {
        self.reconciled
    }

    /// True if data node `id` holds the CHILD_SA of inbound SPI `spi` (events from a data
    /// node are taken only for those).
    pub fn holds(&self, id: u32, spi: EspSpi) -> bool {
        self.children.get(&spi).is_some_and(|c| c.node == Some(id))
    }

    /// Geneve addresses of the live steer nodes.
    pub fn steer_addrs(&self) -> Vec<SocketAddr> {
        self.nodes
            .values()
            .filter(|n| n.role == Role::Steer && n.alive)
            .map(|n| n.geneve)
            .collect()
    }

    /// The live data nodes holding a CHILD_SA of `tunnel` under IKE SA `ike`.
    pub fn peer_holders(&self, tunnel: TunnelId, ike: ike::IkeSpis) -> Vec<u32> {
        let mut holders: Vec<u32> = self
            .children
            .values()
            .filter(|c| c.tunnel == tunnel && c.ike == ike)
            .filter_map(|c| c.node)
            .collect();
        holders.sort_unstable();
        holders.dedup();
        holders.retain(|id| self.nodes.get(id).is_some_and(|n| n.alive));
        holders
    }

    /// Of `moves`, the tunnels not yet wholly on their target: some CHILD_SA of the tunnel
    /// is elsewhere, or it has none.
    pub fn moves_pending(&self, moves: &[(TunnelId, u32)]) -> Vec<TunnelId> {
        moves
            .iter()
            .filter(|(t, node)| {
                let mut mine = self.children.values().filter(|c| c.tunnel == *t).peekable();
                mine.peek().is_none() || mine.any(|c| c.node != Some(*node))
            })
            .map(|(t, _)| *t)
            .collect()
    }

    /// Every limited tunnel's share as last sent to every steer node.
    pub fn all_shares(&self) -> BTreeMap<(u32, TunnelId), steer::Share> {
        let mut out = BTreeMap::new();
        for t in self.tunnels.values() {
            if t.rate_limit_mbit.is_none() {
                continue;
            }
            for node in self.nodes.keys() {
                if let Some(share) = self.shares.sent(steer::NodeId(*node), t.id) {
                    out.insert((*node, t.id), share);
                }
            }
        }
        out
    }

    /// What `protego ctl nodes` shows, as plain data.
    pub fn status(&self) -> Status {
        let mut shares: BTreeMap<u32, Vec<(TunnelId, steer::Share)>> = BTreeMap::new();
        for ((node, tunnel), s) in self.all_shares() {
            shares.entry(node).or_default().push((tunnel, s));
        }
        let nodes = self
            .nodes
            .iter()
            .map(|(id, n)| NodeStatus {
                id: *id,
                name: n.name.clone(),
                role: n.role,
                geneve: n.geneve,
                alive: n.alive,
                draining: n.draining,
                parked: n.parked,
                workers: n.workers,
                tunnels: self
                    .placement
                    .iter()
                    .filter(|(_, p)| **p == *id)
                    .filter_map(|(t, _)| self.tunnels.get(t).map(|m| m.name.clone()))
                    .collect(),
                child_sas: self
                    .children
                    .iter()
                    .filter(|(_, c)| c.node == Some(*id))
                    .map(|(spi, c)| (*spi, c.outbound_spi))
                    .collect(),
                load: n.last_report.clone(),
                reports: n.reports,
                rate_shares: shares.remove(id).unwrap_or_default(),
                attachments: self.attachments_of_node(*id),
                ports: self.ports.get(&n.name).cloned().unwrap_or_default(),
            })
            .collect();
        Status {
            nodes,
            attachments: self.attachment_status(),
        }
    }

    // ---- inputs: configuration ----

    /// The tunnels and VNets were replaced (an apply): tunnels no longer configured lose
    /// their placement, every live data node gets the new inside configuration, and the
    /// steer nodes their new tables.
    pub fn handle_inventory(
        &mut self,
        tunnels: Vec<TunnelMeta>,
        gateways: BTreeMap<u32, Vec<String>>,
        now: Instant,
    ) {
        self.tunnels = tunnels.into_iter().map(|t| (t.id, t)).collect();
        self.gateways = gateways;
        let tunnels = &self.tunnels;
        self.placement.retain(|t, _| tunnels.contains_key(t));
        self.rekey_at.retain(|t, _| tunnels.contains_key(t));
        self.fire_data_nodes(&Directive::DataConfig);
        // Self-dispatch: VNets gone leave the tables, new ones are partitioned.
        self.dispatch_update(now);
        // The attachments' VNets are found by name in the new VNets.
        if !self.attachments.is_empty() {
            self.fire_attachments();
        }
        if self.reconciled {
            self.push_tables(now);
        }
    }

    /// The tunnels' rate limits changed (an apply): the steer nodes get their new tables.
    pub fn handle_rate_limits(&mut self, limits: &BTreeMap<TunnelId, Option<u32>>, now: Instant) {
        for (id, t) in self.tunnels.iter_mut() {
            t.rate_limit_mbit = limits.get(id).copied().flatten();
        }
        if self.reconciled {
            self.push_tables(now);
        }
    }

    // ---- inputs: sessions ----

    /// A node registered (its Hello, checked by the caller). Returns its id. It receives its
    /// configuration at once (data nodes: the inside configuration and the steer nodes'
    /// addresses); steer nodes receive the whole tables once the control loop reconciled.
    pub fn handle_hello(&mut self, hello: Hello, now: Instant) -> u32 {
        let Hello {
            name,
            role,
            geneve,
            boot_id,
            workers,
            installed,
            ports,
            vtep,
        } = hello;
        let id = self.node_id(&name);
        let attachments_before = self.resolved_attachments();
        if role == Role::Steer {
            self.shares.add_node(steer::NodeId(id));
        } else {
            self.shares.remove_node(steer::NodeId(id));
        }
        let previous = self.nodes.get(&id);
        let previous_missing = previous.is_none();
        let restarted = previous.is_some_and(|n| n.boot_id != boot_id || n.role != role);
        // A drain or a park outlives a reconnect (not a restart of the process); a node the
        // provider started joins the reserve.
        let draining = previous.is_some_and(|n| n.draining && !restarted);
        let parked = match previous.filter(|_| !restarted) {
            Some(n) => n.parked,
            None => role == Role::Data && installed.is_empty() && self.provided.contains(&name),
        };
        self.nodes.insert(
            id,
            NodeEntry {
                name: name.clone(),
                role,
                geneve,
                session_open: true,
                alive: true,
                draining,
                parked,
                leaving: false,
                boot_id,
                workers,
                last_report: None,
                reports: 0,
                vtep,
            },
        );
        info!(node = %name, id, role = ?role, %geneve, restarted, "node registered");
        let mut rekey = Vec::new();
        match role {
            Role::Data => {
                // Its tables are empty after a restart: whatever it held is lost.
                if restarted {
                    rekey.extend(self.lose_node_children(id));
                    // Spread tunnels keep their other nodes' CHILD_SAs: the lost ones are
                    // deleted with the peer instead.
                    let spread = self.spread_lost(id);
                    rekey.retain(|t| !spread.contains(t));
                    self.dispatch_restarted(id);
                }
                // Self-dispatch: after a restart it holds no table (sent whole); after a
                // reconnect the one it confirmed.
                if restarted || previous_missing {
                    self.dispatch_forget(id);
                } else {
                    self.dispatch_reconnected(id);
                }
                let orphans = self.adopt(id, installed);
                self.emit(id, Directive::DataConfig, Await::Nothing);
                // Every attachment, after the VNets it names (a restarted node lost them).
                if restarted {
                    self.attachments_held.remove(&id);
                }
                if !self.attachments.is_empty() {
                    self.send_attachments(id);
                }
                let relays = self.relays();
                if !relays.is_empty() {
                    self.emit(id, Directive::Relays(relays), Await::Nothing);
                }
                for d in orphans {
                    self.emit(id, d, Await::Nothing);
                }
                // Tunnels waiting for a data node, or stranded on lost ones, move here.
                rekey.extend(self.unplaced());
                rekey.sort();
                rekey.dedup();
                for t in &rekey {
                    if let Some(node) = self.choose(*t, None) {
                        self.placement.insert(*t, node);
                    }
                }
                rekey = self.due(rekey, now);
                // Attachments waiting for a data node are served here.
                let placed = self.place_attachments(None);
                if self.reconciled {
                    self.push_tables(now);
                } else {
                    self.emit_attachment_steering(&placed, None);
                }
            }
            Role::Steer => {
                // Its ports make attachments steerable (the tables below carry them).
                self.handle_ports(id, &name, ports, &attachments_before);
                if self.reconciled {
                    // Its shares first (the others' lowered ones go out now, their growth
                    // once they confirmed), then its tables with its own.
                    self.rebalance(now, Some(id));
                    let tables = self.steer_tables(id);
                    self.send_tables(id, tables, false);
                }
                self.push_relays();
            }
        }
        self.rekey(rekey, "data node available");
        self.dispatch_update(now);
        id
    }

    /// Node `id`'s session is gone (the shell saw its link close): it receives no more
    /// directives. What that means for its CHILD_SAs is [`ClusterCore::handle_session_ended`].
    pub fn handle_link_closed(&mut self, id: u32) {
        if let Some(n) = self.nodes.get_mut(&id) {
            n.session_open = false;
        }
    }

    /// A node's session ended. A data node's CHILD_SAs are moved (the process may be gone).
    /// A steer node stays in the data nodes' relay list, behind the live ones: its forwarding
    /// may be fine, and a list must never become empty.
    ///
    /// Whether the node still receives directives is the link's state
    /// ([`ClusterCore::handle_link_closed`]): the session's end may be seen before its link
    /// closes.
    pub fn handle_session_ended(&mut self, id: u32, now: Instant) {
        let Some(role) = self.nodes.get(&id).map(|n| n.role) else {
            return;
        };
        match role {
            Role::Data => self.lost(id, "session ended", now),
            Role::Steer => {
                if let Some(n) = self.nodes.get_mut(&id) {
                    n.alive = false;
                }
                self.push_relays();
                // It may still forward with its shares: they stay reserved for a grace, then
                // only its fallbacks.
                self.shares.node_lost(steer::NodeId(id), now);
                self.rebalance(now, None);
            }
        }
    }

    /// A steer node's health monitor declared data node `id` dead.
    pub fn handle_node_dead(&mut self, id: u32, now: Instant) {
        if !self
            .nodes
            .get(&id)
            .is_some_and(|n| n.role == Role::Data && n.alive)
        {
            return;
        }
        self.lost(id, "missed health probes", now);
    }

    /// A data node a steer node had declared dead answers its probes again: it takes new
    /// tunnels again if its session is still open (tunnels without a live node move there).
    pub fn handle_node_alive(&mut self, id: u32, now: Instant) {
        let Some(n) = self.nodes.get_mut(&id).filter(|n| n.role == Role::Data) else {
            return;
        };
        if n.alive || !n.session_open {
            return;
        }
        n.alive = true;
        info!(node = %n.name, id, "data node answers its probes again");
        // While it counted as dead it was sent nothing: an apply's inside configuration, the
        // attachments and the relay list may have changed meanwhile (its session stayed open,
        // so it is not sent them as at a Hello).
        self.emit(id, Directive::DataConfig, Await::Nothing);
        if !self.attachments.is_empty() {
            self.send_attachments(id);
        }
        let relays = self.relays();
        if !relays.is_empty() {
            self.emit(id, Directive::Relays(relays), Await::Nothing);
        }
        let placed = self.place_attachments(None);
        self.emit_port_tags(&placed, None);
        let nodes = self.steer_nodes();
        self.emit_steers(&Directive::SetNodes(nodes), Await::Steer);
        for d in self.all_vni_directives() {
            self.emit_steers(&d, Await::Steer);
        }
        let stranded = self.unplaced();
        for t in &stranded {
            if let Some(node) = self.choose(*t, None) {
                self.placement.insert(*t, node);
            }
        }
        let rekey = self.due(stranded, now);
        self.rekey(rekey, "data node available");
        self.dispatch_update(now);
    }

    /// A node's report. A live steer node's report re-divides the tunnels' limits among the
    /// steer nodes: shares that moved enough are sent.
    pub fn handle_report(&mut self, id: u32, mut load: NodeLoad, now: Instant) {
        let Some(n) = self.nodes.get_mut(&id) else {
            return;
        };
        let steer_usage = (n.role == Role::Steer && n.alive).then(|| {
            (
                Duration::from_millis(u64::from(load.interval_ms)),
                load.rate_usage.clone(),
            )
        });
        let dispatch = (n.role == Role::Data && n.alive).then(|| {
            (
                load.utilization,
                load.packets,
                std::mem::take(&mut load.vmac_packets),
            )
        });
        n.last_report = Some(load);
        n.reports += 1;
        if let Some((utilization, packets, frames)) = dispatch {
            self.dispatch_report(id, utilization, packets, &frames);
        }
        if let Some((interval, usage)) = steer_usage {
            let usage = usage.into_iter().map(|(t, u)| (steer::TunnelId(t), u));
            // A zero interval (a steer node that predates the division) pins it to an equal
            // share; either way the division is looked at again.
            self.shares
                .handle_report(steer::NodeId(id), interval, usage);
            self.rebalance(now, None);
        }
    }

    // ---- inputs: answers ----

    /// A steer node did not apply a steering update ([`Await::Steer`]): it gets the whole
    /// tables again on the next tick.
    pub fn handle_steer_failed(&mut self, id: u32) {
        self.resync.push(id);
    }

    /// The answer to shares sent with `token` ([`Await::Shares`]): confirmed shares free
    /// what a lowered one gave up; a refusal or a closed session leaves what the node holds
    /// counted at the most it may be.
    pub fn handle_share_answer(&mut self, token: u64, ok: bool) {
        let Some(i) = self.share_acks.iter().position(|a| a.token == token) else {
            return;
        };
        let a = self.share_acks.remove(i);
        if ok {
            for (t, share) in a.shares {
                self.shares.confirm(steer::NodeId(a.node), t, share);
            }
        }
    }

    /// Shares of `token` that could not be expressed on the wire were not sent: their answer
    /// does not confirm them.
    pub fn handle_share_unsent(&mut self, token: u64, tunnel: steer::TunnelId) {
        if let Some(a) = self.share_acks.iter_mut().find(|a| a.token == token) {
            a.shares.retain(|(t, _)| *t != tunnel);
        }
    }

    /// The shares still awaiting an answer, in the order they were sent, except those of
    /// node `skip`.
    pub fn pending_shares(&self, skip: Option<u32>) -> Vec<u64> {
        self.share_acks
            .iter()
            .filter(|a| Some(a.node) != skip)
            .map(|a| a.token)
            .collect()
    }

    /// The answer to the whole tables a tick resent to steer node `id` ([`Await::Resync`]):
    /// on success their shares are confirmed, otherwise they are sent again.
    pub fn handle_resync_answer(&mut self, id: u32, token: u64, ok: bool) {
        self.resyncing.remove(&id);
        if ok {
            self.handle_share_answer(token, true);
        } else {
            self.share_acks.retain(|a| a.token != token);
            self.resync.push(id);
        }
    }

    /// Moves the steer nodes' shares toward the division after answers came (the growth
    /// they make room for).
    pub fn handle_shares_settled(&mut self, now: Instant) {
        self.rebalance(now, None);
    }

    // ---- inputs: timer ----

    /// Periodic work (every 100 ms or so): forgets the steering of retired SPIs whose grace
    /// ended, resends whole tables to steer nodes that missed an update (one at a time per
    /// node), rekeys again the tunnels whose CHILD_SA found no live data node (paced by
    /// [`REKEY_RETRY`]).
    pub fn handle_tick(&mut self, now: Instant) {
        let mut due = Vec::new();
        self.retiring.retain(|r| {
            if r.until <= now {
                due.push(r.spi);
                false
            } else {
                true
            }
        });
        // An SPI reinstalled meanwhile (cannot happen with random SPIs, but be exact) stays.
        due.retain(|spi| !self.children.contains_key(spi));
        for spi in due {
            self.emit_steers(&Directive::RemoveSpi(spi), Await::Steer);
        }
        let mut resync = std::mem::take(&mut self.resync);
        resync.sort_unstable();
        resync.dedup();
        if self.reconciled {
            for id in resync {
                if self.resyncing.contains(&id)
                    || !self
                        .nodes
                        .get(&id)
                        .is_some_and(|n| n.alive && n.role == Role::Steer)
                {
                    continue;
                }
                let tables = self.steer_tables(id);
                self.resyncing.insert(id);
                self.send_tables(id, tables, true);
            }
        }
        // The growth answers make room for, lost steer nodes' graces.
        self.rebalance(now, None);
        // Tunnels whose CHILD_SA has no live node, now that one may be there.
        let stranded: Vec<TunnelId> = self
            .unplaced()
            .into_iter()
            .filter(|t| self.choose(*t, None).is_some())
            .collect();
        for t in &stranded {
            if let Some(node) = self.choose(*t, None) {
                self.placement.insert(*t, node);
            }
        }
        let rekey = self.due(stranded, now);
        self.rekey(rekey, "retry: no live data node held it");
        // Attachments without a serving node, now that one may be there.
        let placed = self.place_attachments(None);
        self.emit_attachment_steering(&placed, None);
        // Self-dispatch: the ring's clocks, membership changes (parks, drains).
        self.dispatch_update(now);
    }

    // ---- outputs ----

    /// Queues `directive` to node `node` now.
    pub(crate) fn emit(&mut self, node: u32, directive: Directive, wait: Await) {
        self.outbox.send.push(Outgoing {
            node,
            directive,
            wait,
        });
    }

    /// The ids of the live steer nodes.
    pub(crate) fn live_steers(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.role == Role::Steer && n.alive)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Queues `directive` to every live steer node.
    pub(crate) fn emit_steers(&mut self, directive: &Directive, wait: Await) {
        for id in self.live_steers() {
            self.emit(id, directive.clone(), wait);
        }
    }

    /// The ids of the live data nodes.
    pub(crate) fn live_data_nodes(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.role == Role::Data && n.alive)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Queues `directive` to every live data node without waiting.
    pub(crate) fn fire_data_nodes(&mut self, directive: &Directive) {
        for id in self.live_data_nodes() {
            self.emit(id, directive.clone(), Await::Nothing);
        }
    }

    /// Asks the control loop to rekey `tunnels` (if any).
    pub(crate) fn rekey(&mut self, tunnels: Vec<TunnelId>, why: &'static str) {
        if !tunnels.is_empty() {
            self.outbox.rekeys.push((tunnels, why));
        }
    }

    pub(crate) fn token(&mut self) -> u64 {
        let t = self.next_token;
        self.next_token += 1;
        t
    }
}
