//! The control node's view of the cluster: which data and steer nodes are registered and
//! alive, which data node holds each CHILD_SA, and what the steer nodes must know. It is the
//! [`DataPath`] the IKE control loop drives in the distributed form:
//!
//! - `install_child` places the CHILD_SA on its tunnel's data node (placement), installs it
//!   there, then steers its inbound SPI to that node on every steer node and, when it becomes
//!   the tunnel's sending SA, the tunnel's outbound selectors too — all acknowledged before
//!   the call returns, so the IKE message that lets the peer use the SA leaves after the
//!   steering is in place.
//! - `remove_child` removes it from its data node at once; the steer nodes keep steering its
//!   SPI for the data node's grace (late packets the peer sent before it processed the DELETE
//!   are still delivered), then forget it.
//! - `send_ike` sends through a steer node, from the VIP ([`crate::ike_relay`]).
//!
//! Moves (docs/architecture.md, "Moving tunnels") change the placement and rekey: the new CHILD_SA lands on the new
//! node while the old one keeps working, and the old one is deleted only once the rekey is
//! done ([`Cluster::migrate`], [`Cluster::drain`], data node failover).
//!
//! Lock discipline: directives are queued to a node's session while the state lock is held
//! (queuing never blocks), so every node receives them in the order of the state changes
//! they describe; the lock is never held while waiting for a node's answer (the session
//! tasks that deliver answers also take it).

use crate::ike_relay::IkeRelay;
use crate::link::{Ack, LinkError, NodeLink};
use crossbeam_channel::Sender;
use dataplane::{DataPath, DataplaneError, DataplaneStats, InstalledChild, KnownChild, ToControl};
use ike::{ChildSaInfo, IkeSpis, TrafficSelector, TunnelId};
use rpc::pb;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};
use wire::EspSpi;

/// How long steer nodes keep steering a removed CHILD_SA's SPI: the data node's grace for
/// late inbound packets (`dataplane` keeps a removed SA opening packets for 5 s).
pub const STEER_GRACE: Duration = Duration::from_secs(5);

/// Longest a waiting move sleeps without looking at the state again.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// A registered node's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// ESP and VXLAN processing (the paper's GPN).
    Data,
    /// The VIP's packet steering (GIN + GEN).
    Steer,
}

/// What control knows about a tunnel from the configuration.
#[derive(Debug, Clone)]
pub struct TunnelMeta {
    /// Its id.
    pub id: TunnelId,
    /// Its name.
    pub name: String,
    /// Its VNet's VNI (None: TUN inside, which the distributed form does not steer).
    pub vni: Option<u32>,
    /// Its rate limit, Mbit/s.
    pub rate_limit_mbit: Option<u32>,
}

/// Settings of the cluster logic.
#[derive(Debug, Clone)]
pub struct Settings {
    /// This control node's name.
    pub name: String,
    /// How long a node may take to answer a directive.
    pub directive_timeout: Duration,
    /// How often nodes report.
    pub report_interval: Duration,
    /// This control node's Geneve address (steer nodes send IKE there).
    pub geneve: SocketAddr,
    /// A data node's capacity, Mbit/s (the autoscaler's unit).
    pub node_capacity_mbit: u32,
    /// The autoscaler's model and mode (`[cluster.autoscale]`).
    pub autoscale: control::config::AutoscaleConfig,
}

/// One registered node.
struct Node {
    name: String,
    role: Role,
    geneve: SocketAddr,
    link: Arc<dyn NodeLink>,
    /// Session open and (data nodes) not declared dead by a steer node.
    alive: bool,
    /// Being drained: no new CHILD_SAs are placed on it.
    draining: bool,
    /// Held in reserve by the autoscaler (inactive): new CHILD_SAs go elsewhere if they can.
    parked: bool,
    /// The autoscaler asked the node provider to stop it: nothing is placed on it any more.
    leaving: bool,
    boot_id: u64,
    workers: u32,
    last_report: Option<NodeLoad>,
    /// Reports received so far (tells the autoscaler a report is new).
    reports: u64,
}

impl Node {
    /// True once the node's session is gone (a node declared dead by probes may still have
    /// its session).
    fn link_closed(&self) -> bool {
        self.link.is_closed()
    }
}

/// A node's last reported load.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct NodeLoad {
    /// Length of the interval the figures cover, milliseconds.
    pub interval_ms: u32,
    /// Busy fraction of its packet workers.
    pub utilization: f64,
    /// Per tunnel: bytes in and out during the last interval.
    pub tunnel_bytes: BTreeMap<u32, u64>,
    /// Cumulative drop counters by reason.
    pub drops: BTreeMap<String, u64>,
    /// Packets the steer node dropped per tunnel by rate limit (steer reports).
    pub rate_dropped: BTreeMap<u32, u64>,
    /// Per tunnel, what the steer node's limiter admitted and dropped each way during the
    /// interval (steer reports): the demand its share of the tunnel's limit follows.
    #[serde(skip)]
    pub rate_usage: BTreeMap<u32, steer::TunnelUsage>,
}

/// One installed CHILD_SA.
#[derive(Debug, Clone)]
struct ChildEntry {
    tunnel: TunnelId,
    /// The data node holding it; None if it could not be placed (no live data node) or its
    /// node was lost.
    node: Option<u32>,
    /// The node that last held it, while `node` is None (a node declared dead by probes may
    /// come back still holding it: it is told to remove it).
    last_node: Option<u32>,
    outbound_spi: EspSpi,
    ike: IkeSpis,
    /// Install order (the newest remaining SA sends after the sending one is removed).
    seq: u64,
    /// This SA carries the tunnel's outbound traffic (steer's selectors point at its node).
    sending: bool,
    local_ts: Vec<TrafficSelector>,
    remote_ts: Vec<TrafficSelector>,
}

/// What a node says when it registers (its checked Hello).
#[derive(Debug, Clone)]
pub struct Registration {
    /// Its name (its certificate's CN).
    pub name: String,
    /// Its role (its certificate's OU).
    pub role: Role,
    /// Where it receives Geneve.
    pub geneve: SocketAddr,
    /// Changes at every process start.
    pub boot_id: u64,
    /// Packet workers.
    pub workers: u32,
    /// The CHILD_SAs it holds (data nodes).
    pub installed: Vec<InstalledChild>,
}

/// A removed CHILD_SA whose SPI stays steered for the data node's grace.
#[derive(Debug, Clone, Copy)]
struct Retiring {
    until: Instant,
    spi: EspSpi,
    node: Option<u32>,
    tunnel: TunnelId,
}

/// How often a tunnel whose CHILD_SA has no live data node is rekeyed again.
const REKEY_RETRY: Duration = Duration::from_secs(5);
/// Most CHILD_SAs one data node may report in its Hello.
pub const MAX_INSTALLED: usize = 1_000_000;

/// Directives queued to steer nodes, whose answers are awaited after the lock is released.
type Pending = Vec<(u32, String, Result<Ack, LinkError>)>;

/// Work the cluster hands to its own thread (it calls into the control loop, which must not
/// be called from the control loop's thread or a session task).
#[derive(Debug)]
pub enum Task {
    /// Rekey these tunnels' CHILD_SAs onto their (new) placement.
    Rekey(Vec<TunnelId>, &'static str),
}

#[derive(Default)]
struct State {
    nodes: BTreeMap<u32, Node>,
    ids: HashMap<String, u32>,
    placement: HashMap<TunnelId, u32>,
    children: HashMap<EspSpi, ChildEntry>,
    seq: u64,
    /// Removed CHILD_SAs whose SPI stays steered to their node until the instant.
    retiring: Vec<Retiring>,
    /// When a rekey was last asked for each tunnel (retries are paced).
    rekey_at: HashMap<TunnelId, Instant>,
    /// The CHILD_SAs of the restored IKE SAs by inbound SPI, once reconciled: a data node
    /// arriving later with one of them, as described there, still has it adopted.
    known: HashMap<EspSpi, KnownChild>,
    /// Steer nodes whose whole tables are on their way (not resent until answered).
    resyncing: std::collections::HashSet<u32>,
    /// Steer nodes that missed an update and get the whole tables again.
    resync: Vec<u32>,
    /// Until the control loop reconciled its restored CHILD_SAs ([`DataPath::reconcile`]):
    /// CHILD_SAs data nodes hold are adopted as they are. Afterwards a held CHILD_SA the
    /// control loop does not know is removed from its node.
    reconciled: bool,
    /// The steer nodes' demand per tunnel and what each was sent, which divides each tunnel's
    /// limit among them (what they may enforce together stays within the tunnel's limit).
    shares: steer::RateShares,
    /// Shares sent to steer nodes whose answers have not come yet (a lowered share counts at
    /// its old value until then).
    share_acks: Vec<ShareAck>,
}

/// Shares sent to a steer node, awaiting its answer.
struct ShareAck {
    node: u32,
    shares: Vec<(steer::TunnelId, steer::Share)>,
    ack: Ack,
}

/// How long control keeps a lost steer node's shares reserved: the steer node drops to its
/// fallbacks after [`crate::agent::CONTROL_LOST_INTERVALS`] report intervals without a
/// session, and may notice the session's end up to an HTTP/2 keepalive interval and timeout
/// after control does.
pub fn share_grace(report_interval: Duration) -> Duration {
    report_interval * crate::agent::CONTROL_LOST_INTERVALS
        + rpc::KEEPALIVE_INTERVAL
        + rpc::KEEPALIVE_TIMEOUT
}

/// The cluster: registry, placement, steering. Shared by the control loop (as its
/// [`DataPath`]), the gRPC sessions and the operator commands.
pub struct Cluster {
    settings: Settings,
    /// Notified after every CHILD_SA install and removal (moves wait on it with `state`).
    changed: std::sync::Condvar,
    /// The elastic provisioning model on the load reports (`protego ctl capacity`), and when
    /// it last stepped. Never locked with `state` held.
    autoscaler: Mutex<(Option<crate::capacity::Autoscaler>, Option<Instant>)>,
    /// Starts and stops data nodes for the autoscaler (act mode).
    provider: Option<Arc<dyn crate::provider::NodeProvider>>,
    /// The names of the data nodes the provider manages (act mode): they register parked
    /// (inactive), as the paper's started node joins the reserve, until the autoscaler
    /// activates them; a node that arrives holding CHILD_SAs (a takeover) is not parked.
    provided: std::collections::HashSet<String>,
    /// The configured tunnels and the data nodes' VNets and bindings (replaced by an apply).
    inventory: std::sync::RwLock<Arc<Inventory>>,
    ike: IkeRelay,
    tasks: Sender<Task>,
    to_control: Sender<ToControl>,
    state: Mutex<State>,
}

/// What the configuration says about tunnels and VNets.
struct Inventory {
    tunnels: BTreeMap<TunnelId, TunnelMeta>,
    data_config: pb::DataConfig,
}

/// A refused operator command.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No tunnel of that name.
    #[error("unknown tunnel {0:?}")]
    UnknownTunnel(String),
    /// No node of that name.
    #[error("unknown node {0:?}")]
    UnknownNode(String),
    /// The node cannot take tunnels.
    #[error("node {name:?} cannot take tunnels: {reason}")]
    Unsuitable {
        /// The node.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// The tunnel has no CHILD_SA to move.
    #[error("tunnel {0:?} has no CHILD_SA (is it up?)")]
    NotUp(String),
    /// The move did not finish in time.
    #[error("{0}")]
    Timeout(String),
    /// The control loop is not attached or stopped.
    #[error("the control loop is not running")]
    NoControl,
}

impl Cluster {
    /// A cluster with no nodes yet. `tasks` receives the rekeys moves need (see
    /// [`crate::control_node`]).
    pub fn new(
        settings: Settings,
        tunnels: Vec<TunnelMeta>,
        data_config: pb::DataConfig,
        ike: IkeRelay,
        tasks: Sender<Task>,
        to_control: Sender<ToControl>,
    ) -> Self {
        let settings_report_interval = settings.report_interval;
        let autoscaler =
            crate::capacity::Autoscaler::new(settings.node_capacity_mbit, &settings.autoscale)
                .map_err(|e| warn!(error = %e, "autoscaler disabled"))
                .ok();
        Self {
            autoscaler: Mutex::new((autoscaler, None)),
            provider: None,
            provided: std::collections::HashSet::new(),
            settings,
            changed: std::sync::Condvar::new(),
            inventory: std::sync::RwLock::new(Arc::new(Inventory {
                tunnels: tunnels.into_iter().map(|t| (t.id, t)).collect(),
                data_config,
            })),
            ike,
            tasks,
            to_control,
            state: Mutex::new(State {
                shares: steer::RateShares::new(steer::ShareConfig {
                    lost_grace: share_grace(settings_report_interval),
                    ..steer::ShareConfig::default()
                }),
                ..State::default()
            }),
        }
    }

    /// The cluster with `provider` starting and stopping data nodes for the autoscaler.
    #[must_use]
    pub fn with_provider(mut self, provider: Arc<dyn crate::provider::NodeProvider>) -> Self {
        self.provided = provider.nodes().into_iter().map(|n| n.name).collect();
        self.provider = Some(provider);
        self
    }

    /// The current tunnels and VNets.
    fn inventory(&self) -> Arc<Inventory> {
        Arc::clone(
            &self
                .inventory
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Replaces the tunnels' rate limits (an apply changed them) and sends the steer nodes
    /// their new tables.
    pub fn set_rate_limits(&self, limits: &BTreeMap<TunnelId, Option<u32>>) {
        {
            let mut inv = self
                .inventory
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut next = Inventory {
                tunnels: inv.tunnels.clone(),
                data_config: inv.data_config.clone(),
            };
            for (id, t) in next.tunnels.iter_mut() {
                t.rate_limit_mbit = limits.get(id).copied().flatten();
            }
            *inv = Arc::new(next);
        }
        let mut st = self.state();
        if st.reconciled {
            self.push_tables(&mut st);
        }
    }

    /// The id of the node called `name` (stable for the control node's lifetime).
    pub fn node_id(&self, name: &str) -> u32 {
        let mut st = self.state();
        Self::id_of(&mut st, name)
    }

    fn id_of(st: &mut State, name: &str) -> u32 {
        if let Some(&id) = st.ids.get(name) {
            return id;
        }
        let id = st.ids.len() as u32 + 1;
        st.ids.insert(name.to_owned(), id);
        id
    }

    /// An event from node `id` (`name`). Data nodes speak only for the CHILD_SAs they hold,
    /// steer nodes only about data nodes' health; anything else is ignored and logged.
    pub fn event(&self, id: u32, name: &str, event: pb::NodeEvent) {
        use pb::node_event::Event;
        let role = self.role(id);
        let holds = |spi: u32| {
            self.state()
                .children
                .get(&EspSpi(spi))
                .is_some_and(|c| c.node == Some(id))
        };
        match (event.event, role) {
            (Some(Event::RekeyNeeded(spi)), Some(Role::Data)) if holds(spi) => {
                if self
                    .to_control
                    .try_send(ToControl::RekeyNeeded(EspSpi(spi)))
                    .is_err()
                {
                    warn!(
                        node = name,
                        spi, "control queue full; rekey request dropped (the node asks again)"
                    );
                }
            }
            (Some(Event::PeerAddressSeen(p)), Some(Role::Data)) if holds(p.inbound_spi) => {
                let (Ok(local), Ok(remote)) = (p.local.parse(), p.remote.parse()) else {
                    warn!(
                        node = name,
                        "peer_address_seen with invalid addresses; ignored"
                    );
                    return;
                };
                let _ = self.to_control.try_send(ToControl::PeerAddressSeen {
                    inbound_spi: EspSpi(p.inbound_spi),
                    local,
                    remote,
                });
            }
            (Some(Event::NodeDead(dead)), Some(Role::Steer)) => self.node_dead(dead, name),
            (Some(Event::NodeAlive(back)), Some(Role::Steer)) => self.node_alive(back, name),
            (None, _) => {}
            (Some(other), _) => {
                warn!(node = name, event = ?other, "event not for this node to send; ignored");
            }
        }
    }

    fn role(&self, id: u32) -> Option<Role> {
        self.state().nodes.get(&id).map(|n| n.role)
    }

    /// A data node a steer node had declared dead answers its probes again: it takes new
    /// tunnels again if its session is still open (tunnels without a live node move there).
    fn node_alive(&self, id: u32, by: &str) {
        let mut st = self.state();
        let Some(n) = st.nodes.get_mut(&id).filter(|n| n.role == Role::Data) else {
            return;
        };
        if n.alive || n.link_closed() {
            return;
        }
        n.alive = true;
        info!(node = %n.name, id, reported_by = by, "data node answers its probes again");
        let mut pending =
            self.submit_steers(&st, pb::directive::Op::SetNodes(self.steer_nodes(&st)));
        for op in self.all_vni_ops(&st) {
            pending.extend(self.submit_steers(&st, op));
        }
        let stranded = self.unplaced(&st);
        for t in &stranded {
            if let Some(node) = self.choose(&st, *t, None) {
                st.placement.insert(*t, node);
            }
        }
        let rekey = Self::due(&mut st, stranded, Instant::now());
        drop(st);
        self.finish_loss(pending, rekey, "data node available");
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent before anything can panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.settings.directive_timeout
    }

    // ---- sessions ----

    /// A node opened a session (its Hello is checked against its certificate by the
    /// caller). Returns its id. The node receives its configuration at once (data nodes: the
    /// inside configuration and the steer nodes' addresses); steer nodes receive the whole
    /// tables once the control loop reconciled its restored state (before that, they keep
    /// the tables they have, so a new control node never shrinks them).
    pub fn register(&self, hello: Registration, link: Arc<dyn NodeLink>) -> u32 {
        let Registration {
            name,
            role,
            geneve,
            boot_id,
            workers,
            installed,
        } = hello;
        let name = name.as_str();
        let mut st = self.state();
        let id = Self::id_of(&mut st, name);
        if role == Role::Steer {
            st.shares.add_node(steer::NodeId(id));
        } else {
            st.shares.remove_node(steer::NodeId(id));
        }
        let previous = st.nodes.get(&id);
        let restarted = previous.is_some_and(|n| n.boot_id != boot_id || n.role != role);
        // A drain or a park outlives a reconnect (not a restart of the process); a node the
        // provider started joins the reserve.
        let draining = previous.is_some_and(|n| n.draining && !restarted);
        let parked = match previous.filter(|_| !restarted) {
            Some(n) => n.parked,
            None => role == Role::Data && installed.is_empty() && self.provided.contains(name),
        };
        st.nodes.insert(
            id,
            Node {
                name: name.to_owned(),
                role,
                geneve,
                link: Arc::clone(&link),
                alive: true,
                draining,
                parked,
                leaving: false,
                boot_id,
                workers,
                last_report: None,
                reports: 0,
            },
        );
        info!(node = name, id, role = ?role, %geneve, restarted, "node registered");
        let mut rekey = Vec::new();
        let now = Instant::now();
        match role {
            Role::Data => {
                // Its tables are empty after a restart: whatever it held is lost.
                if restarted {
                    rekey.extend(Self::lose_node_children(&mut st, id));
                }
                let orphans = self.adopt(&mut st, id, installed);
                self.fire(
                    &*link,
                    pb::directive::Op::DataConfig(self.inventory().data_config.clone()),
                    name,
                );
                let relays = Self::relays(&st);
                if !relays.steer.is_empty() {
                    self.fire(&*link, pb::directive::Op::SetRelays(relays), name);
                }
                for op in orphans {
                    self.fire(&*link, op, name);
                }
                // Tunnels waiting for a data node, or stranded on lost ones, move here.
                rekey.extend(self.unplaced(&st));
                rekey.sort();
                rekey.dedup();
                for t in &rekey {
                    if let Some(node) = self.choose(&st, *t, None) {
                        st.placement.insert(*t, node);
                    }
                }
                rekey = Self::due(&mut st, rekey, now);
                if st.reconciled {
                    self.push_tables(&mut st);
                }
            }
            Role::Steer => {
                if st.reconciled {
                    // Its shares first (the others' lowered ones go out now, their growth once
                    // they confirmed), then its tables with its own.
                    self.rebalance(&mut st, now, Some(id));
                    let tables = self.steer_tables(&st, id);
                    self.send_tables(&mut st, id, &*link, tables, name);
                }
                self.push_relays(&st);
            }
        }
        drop(st);
        if role == Role::Steer {
            // The newcomer starts with what the others gave up: wait for them to confirm (not
            // for the newcomer, whose session starts once this returns).
            self.settle_shares(self.deadline(), Some(id));
        }
        if !rekey.is_empty() {
            let _ = self.tasks.send(Task::Rekey(rekey, "data node available"));
        }
        id
    }

    /// A node's session ended (or its stream failed). A data node's CHILD_SAs are moved
    /// (the process may be gone). A steer node stays in the data nodes' relay list, behind
    /// the live ones: its forwarding may be fine, and a list must never become empty.
    pub fn session_ended(&self, id: u32, link: &Arc<dyn NodeLink>) {
        let mut st = self.state();
        let Some(node) = st.nodes.get_mut(&id) else {
            return;
        };
        // A newer session of the same node replaced this one: nothing to do.
        if !Arc::ptr_eq(&node.link, link) {
            return;
        }
        let (name, role) = (node.name.clone(), node.role);
        warn!(node = %name, id, role = ?role, "node session ended");
        match role {
            Role::Data => {
                let (pending, tunnels) = self.lost_locked(&mut st, id, "session ended");
                drop(st);
                self.finish_loss(pending, tunnels, "session ended");
            }
            Role::Steer => {
                if let Some(n) = st.nodes.get_mut(&id) {
                    n.alive = false;
                }
                self.push_relays(&st);
                // It may still forward with its shares: they stay reserved for a grace (see
                // `share_grace`), then only its fallbacks.
                let now = Instant::now();
                st.shares.node_lost(steer::NodeId(id), now);
                self.rebalance(&mut st, now, None);
            }
        }
    }

    /// A steer node's health monitor declared data node `id` dead.
    pub fn node_dead(&self, id: u32, by: &str) {
        let mut st = self.state();
        if !st
            .nodes
            .get(&id)
            .is_some_and(|n| n.role == Role::Data && n.alive)
        {
            return;
        }
        warn!(node = %st.nodes[&id].name, id, reported_by = by, "data node missed its health probes");
        let (pending, tunnels) = self.lost_locked(&mut st, id, "missed health probes");
        drop(st);
        self.finish_loss(pending, tunnels, "missed health probes");
    }

    /// Marks data node `id` lost (under the lock, so a re-registration cannot interleave):
    /// its CHILD_SAs are detached, its tunnels placed elsewhere, the steer nodes told. Returns
    /// the steer nodes' pending answers and the tunnels to rekey.
    fn lost_locked(&self, st: &mut State, id: u32, why: &'static str) -> (Pending, Vec<TunnelId>) {
        if let Some(n) = st.nodes.get_mut(&id) {
            n.alive = false;
        }
        let mut tunnels = Self::lose_node_children(st, id);
        tunnels.extend(
            st.placement
                .iter()
                .filter(|(_, n)| **n == id)
                .map(|(t, _)| *t),
        );
        tunnels.sort();
        tunnels.dedup();
        for t in &tunnels {
            match self.choose(st, *t, Some(id)) {
                Some(node) => {
                    st.placement.insert(*t, node);
                }
                None => {
                    st.placement.remove(t);
                }
            }
        }
        let mut pending = Vec::new();
        for op in self.all_vni_ops(st) {
            pending.extend(self.submit_steers(st, op));
        }
        pending.extend(self.submit_steers(st, pb::directive::Op::SetNodes(self.steer_nodes(st))));
        if !tunnels.is_empty() {
            info!(
                node = id,
                tunnels = tunnels.len(),
                why,
                "moving the tunnels of a lost data node"
            );
        }
        let now = Instant::now();
        let tunnels = Self::due(st, tunnels, now);
        (pending, tunnels)
    }

    fn finish_loss(&self, pending: Pending, tunnels: Vec<TunnelId>, why: &'static str) {
        self.await_steers(pending);
        if !tunnels.is_empty() {
            let _ = self.tasks.send(Task::Rekey(tunnels, why));
        }
    }

    /// Marks the CHILD_SAs on `id` as unplaced; returns their tunnels.
    fn lose_node_children(st: &mut State, id: u32) -> Vec<TunnelId> {
        let mut lost = Vec::new();
        for c in st.children.values_mut().filter(|c| c.node == Some(id)) {
            c.node = None;
            c.last_node = Some(id);
            lost.push(c.tunnel);
        }
        lost
    }

    /// Of `tunnels`, those not asked to rekey within [`REKEY_RETRY`]; records the request.
    fn due(st: &mut State, tunnels: Vec<TunnelId>, now: Instant) -> Vec<TunnelId> {
        tunnels
            .into_iter()
            .filter(|t| {
                let due = st
                    .rekey_at
                    .get(t)
                    .is_none_or(|at| now.duration_since(*at) >= REKEY_RETRY);
                if due {
                    st.rekey_at.insert(*t, now);
                }
                due
            })
            .collect()
    }

    /// Tunnels with a CHILD_SA that no live data node holds.
    fn unplaced(&self, st: &State) -> Vec<TunnelId> {
        let mut out: Vec<TunnelId> = st
            .children
            .values()
            .filter(|c| {
                c.node
                    .is_none_or(|n| st.nodes.get(&n).is_none_or(|n| !n.alive))
            })
            .map(|c| c.tunnel)
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Takes note of the CHILD_SAs data node `id` holds (its Hello). Before the control loop
    /// reconciled, and afterwards for the CHILD_SAs of the restored IKE SAs, they are adopted
    /// as they are (a new control node takes over without rekeying); a known CHILD_SA that
    /// this node held before it was lost is attached to it again; any other is an orphan:
    /// returns the directives that remove it from the node.
    fn adopt(
        &self,
        st: &mut State,
        id: u32,
        installed: Vec<InstalledChild>,
    ) -> Vec<pb::directive::Op> {
        let mut orphans = Vec::new();
        let mut sending: HashMap<TunnelId, EspSpi> = HashMap::new();
        for c in installed {
            let entry = st
                .children
                .get(&c.inbound_spi)
                .map(|e| (e.node, e.last_node));
            match entry {
                Some((Some(n), _)) if n == id => {}
                Some((None, Some(last))) if last == id => {
                    if let Some(e) = st.children.get_mut(&c.inbound_spi) {
                        e.node = Some(id);
                        e.last_node = None;
                    }
                }
                // Before reconcile a claim is taken as made; reconcile checks it against the
                // restored IKE SAs. After it, a claim must match them.
                None if self.inventory().tunnels.contains_key(&c.tunnel)
                    && (!st.reconciled
                        || st.known.get(&c.inbound_spi).is_some_and(|k| k.matches(&c))) =>
                {
                    st.seq += 1;
                    let seq = st.seq;
                    if c.sending {
                        sending.insert(c.tunnel, c.inbound_spi);
                    }
                    st.placement.insert(c.tunnel, id);
                    info!(node = id, tunnel = c.tunnel.0, spi_in = %c.inbound_spi, sending = c.sending, "CHILD_SA adopted from its data node");
                    st.children.insert(
                        c.inbound_spi,
                        ChildEntry {
                            tunnel: c.tunnel,
                            node: Some(id),
                            last_node: None,
                            outbound_spi: c.outbound_spi,
                            ike: c.ike,
                            seq,
                            sending: false,
                            local_ts: c.local_ts,
                            remote_ts: c.remote_ts,
                        },
                    );
                }
                _ => {
                    warn!(node = id, tunnel = c.tunnel.0, spi_in = %c.inbound_spi, "data node holds a CHILD_SA it is not in charge of; removing it there");
                    orphans.push(pb::directive::Op::RemoveChild(pb::RemoveChild {
                        tunnel: c.tunnel.0,
                        inbound_spi: c.inbound_spi.0,
                        outbound_spi: c.outbound_spi.0,
                    }));
                }
            }
        }
        // One pass: an adopted sending SA makes the others of its tunnel stop sending.
        if !sending.is_empty() {
            for (spi, e) in st.children.iter_mut() {
                if let Some(s) = sending.get(&e.tunnel) {
                    e.sending = spi == s;
                }
            }
        }
        orphans
    }

    /// A node's report. A live steer node's report re-divides the tunnels' limits among the
    /// steer nodes: shares that moved enough are sent (see [`steer::RateShares::update`]).
    pub fn report(&self, id: u32, load: NodeLoad) {
        let mut st = self.state();
        let Some(n) = st.nodes.get_mut(&id) else {
            return;
        };
        let steer_usage = (n.role == Role::Steer && n.alive).then(|| {
            (
                std::time::Duration::from_millis(u64::from(load.interval_ms)),
                load.rate_usage.clone(),
            )
        });
        n.last_report = Some(load);
        n.reports += 1;
        if let Some((interval, usage)) = steer_usage {
            let usage = usage.into_iter().map(|(t, u)| (steer::TunnelId(t), u));
            // A zero interval (a steer node that predates the division) pins it to an equal
            // share; either way the division is looked at again.
            st.shares.handle_report(steer::NodeId(id), interval, usage);
            self.poll_share_acks(&mut st);
            self.rebalance(&mut st, Instant::now(), None);
        }
    }

    // ---- placement ----

    /// The data node for a new CHILD_SA of `tunnel`: its placement if that node is alive and
    /// not draining, else the live data node with the fewest tunnels (then lowest
    /// utilization, then lowest id), never `exclude`, and a parked one only if no other is
    /// left.
    fn choose(&self, st: &State, tunnel: TunnelId, exclude: Option<u32>) -> Option<u32> {
        let usable = |id: &u32| {
            Some(*id) != exclude
                && st
                    .nodes
                    .get(id)
                    .is_some_and(|n| n.role == Role::Data && n.alive && !n.draining && !n.leaving)
        };
        if let Some(p) = st.placement.get(&tunnel).filter(|p| usable(p)) {
            return Some(*p);
        }
        let mut count: HashMap<u32, usize> = HashMap::new();
        for (t, n) in &st.placement {
            if *t != tunnel {
                *count.entry(*n).or_default() += 1;
            }
        }
        // Parked nodes (held in reserve by the autoscaler) only when no other can.
        let unparked = st
            .nodes
            .keys()
            .filter(|id| usable(id))
            .any(|id| !st.nodes[id].parked);
        st.nodes
            .keys()
            .filter(|id| usable(id) && !(unparked && st.nodes[*id].parked))
            .min_by(|a, b| {
                let util = |id: &u32| {
                    st.nodes[id]
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

    // ---- steering tables ----

    /// The live steer nodes' links.
    fn steers(st: &State) -> Vec<(u32, String, Arc<dyn NodeLink>)> {
        st.nodes
            .iter()
            .filter(|(_, n)| n.role == Role::Steer && n.alive)
            .map(|(id, n)| (*id, n.name.clone(), Arc::clone(&n.link)))
            .collect()
    }

    /// The steer nodes' Geneve addresses for the data nodes: live ones first, then those
    /// whose session ended (their forwarding may be fine; a data node sends to the first).
    fn relays(st: &State) -> pb::Relays {
        let steer = |alive: bool| {
            st.nodes
                .values()
                .filter(move |n| n.role == Role::Steer && n.alive == alive)
                .map(|n| n.geneve.to_string())
        };
        pb::Relays {
            steer: steer(true).chain(steer(false)).collect(),
        }
    }

    /// The data nodes the steer nodes forward to and probe: every one with an open
    /// session, including those the probes declared dead (so the probes notice when they
    /// answer again; the steer node does not forward to a node its probes hold dead).
    fn steer_nodes(&self, st: &State) -> pb::SteerNodes {
        pb::SteerNodes {
            data: st
                .nodes
                .iter()
                .filter(|(_, n)| n.role == Role::Data && (n.alive || !n.link_closed()))
                .map(|(id, n)| pb::DataNode {
                    node: *id,
                    name: n.name.clone(),
                    geneve: n.geneve.to_string(),
                })
                .collect(),
            control: self.settings.geneve.to_string(),
        }
    }

    /// The selectors of one VNI: every tunnel of the VNI whose sending CHILD_SA is placed,
    /// each of its (local, remote) selector pairs steered to that SA's node.
    fn vni_op(&self, st: &State, vni: u32) -> pb::directive::Op {
        // One snapshot for the whole table (one lock, one inventory).
        let inventory = self.inventory();
        let mut selectors = Vec::new();
        for c in st.children.values().filter(|c| c.sending) {
            let Some(node) = c.node else { continue };
            if inventory.tunnels.get(&c.tunnel).and_then(|t| t.vni) != Some(vni) {
                continue;
            }
            for l in &c.local_ts {
                for r in &c.remote_ts {
                    match rpc::convert::selector_entry(
                        l,
                        r,
                        steer::TunnelId(c.tunnel.0),
                        steer::NodeId(node),
                    ) {
                        Ok(e) => selectors.push(rpc::convert::selector_to_pb(&e)),
                        Err(e) => {
                            warn!(tunnel = c.tunnel.0, error = %e, "traffic selector pair cannot be steered");
                        }
                    }
                }
            }
        }
        // Deterministic order: steer nodes receive identical tables.
        selectors.sort_by(|a, b| {
            (a.tunnel, &a.dst_start, &a.src_start).cmp(&(b.tunnel, &b.dst_start, &b.src_start))
        });
        let neighbour_nodes = st
            .nodes
            .iter()
            .filter(|(_, n)| n.role == Role::Data && n.alive)
            .map(|(id, _)| *id)
            .collect();
        let gateway_ips = inventory
            .data_config
            .vnets
            .iter()
            .filter(|v| v.vni == vni)
            .flat_map(|v| v.gateway_ips.iter().cloned())
            .collect();
        pb::directive::Op::SetSelectors(pb::VniSelectors {
            vni,
            selectors,
            neighbour_nodes,
            gateway_ips,
        })
    }

    fn vnis(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .inventory()
            .tunnels
            .values()
            .filter_map(|t| t.vni)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    fn all_vni_ops(&self, st: &State) -> Vec<pb::directive::Op> {
        self.vnis()
            .into_iter()
            .map(|v| self.vni_op(st, v))
            .collect()
    }

    /// Every limited tunnel's share as last sent to every steer node.
    fn all_shares(&self, st: &State) -> BTreeMap<(u32, TunnelId), steer::Share> {
        let mut out = BTreeMap::new();
        for t in self.inventory().tunnels.values() {
            if t.rate_limit_mbit.is_none() {
                continue;
            }
            for node in st.nodes.keys() {
                if let Some(share) = st
                    .shares
                    .sent(steer::NodeId(*node), steer::TunnelId(t.id.0))
                {
                    out.insert((*node, t.id), share);
                }
            }
        }
        out
    }

    /// The limited tunnels and their limits, bit/s.
    fn tunnel_limits(&self) -> Vec<(steer::TunnelId, u64)> {
        self.inventory()
            .tunnels
            .values()
            .filter_map(|t| {
                Some((
                    steer::TunnelId(t.id.0),
                    u64::from(t.rate_limit_mbit?) * 1_000_000,
                ))
            })
            .collect()
    }

    /// Moves the steer nodes' shares toward the division (call with the state lock held):
    /// each live steer node but `except` (whose whole tables are on their way) gets its
    /// changed shares in one directive, nodes with a lowered share first. Nothing before the
    /// control loop reconciled (the nodes keep what they have).
    fn rebalance(&self, st: &mut State, now: Instant, except: Option<u32>) {
        if !st.reconciled {
            return;
        }
        let batches = st.shares.update(&self.tunnel_limits(), now);
        for (node, shares) in batches {
            if Some(node.0) == except {
                continue;
            }
            let Some((name, link)) = st
                .nodes
                .get(&node.0)
                .filter(|n| n.alive && n.role == Role::Steer)
                .map(|n| (n.name.clone(), Arc::clone(&n.link)))
            else {
                continue;
            };
            self.send_shares(st, node.0, &*link, &name, shares);
        }
    }

    /// Queues `shares` to steer node `node` and keeps the answer to wait for: one
    /// `SetRateLimits`, or per tunnel a `SetRateLimit` to a steer node that predates the
    /// division.
    fn send_shares(
        &self,
        st: &mut State,
        node: u32,
        link: &dyn NodeLink,
        name: &str,
        shares: Vec<(steer::TunnelId, steer::Share)>,
    ) {
        let mut ops = Vec::new();
        for &(tunnel, share) in &shares {
            match rpc::convert::share_to_pb(tunnel, Some(share)) {
                Ok(r) => {
                    debug!(node = %name, tunnel = tunnel.0, inbound_bps = share.limit.inbound.bits_per_second, outbound_bps = share.limit.outbound.bits_per_second, fallback_bps = share.fallback_bits_per_second, "rate limit share");
                    ops.push(((tunnel, share), r));
                }
                Err(e) => {
                    warn!(node = %name, tunnel = tunnel.0, error = %e, "rate limit share not expressible")
                }
            }
        }
        let submitted: Vec<(Vec<(steer::TunnelId, steer::Share)>, pb::directive::Op)> =
            if st.shares.legacy(steer::NodeId(node)) {
                ops.into_iter()
                    .map(|(s, r)| (vec![s], pb::directive::Op::SetRateLimit(r)))
                    .collect()
            } else if ops.is_empty() {
                Vec::new()
            } else {
                let (shares, limits): (Vec<_>, Vec<_>) = ops.into_iter().unzip();
                vec![(
                    shares,
                    pb::directive::Op::SetRateLimits(pb::RateLimits { limits }),
                )]
            };
        for (shares, op) in submitted {
            match link.submit(op) {
                Ok(ack) => st.share_acks.push(ShareAck { node, shares, ack }),
                Err(e) => warn!(node = name, error = %e, "cannot send a directive"),
            }
        }
    }

    /// Queues whole `tables` to steer node `id`, keeping the answer (it confirms the shares
    /// they carry).
    fn send_tables(
        &self,
        st: &mut State,
        id: u32,
        link: &dyn NodeLink,
        tables: pb::SteerTables,
        name: &str,
    ) {
        let shares = Self::shares_of(&tables);
        match link.submit(pb::directive::Op::SteerTables(tables)) {
            Ok(ack) => st.share_acks.push(ShareAck {
                node: id,
                shares,
                ack,
            }),
            Err(e) => warn!(node = name, error = %e, "cannot send a directive"),
        }
    }

    /// The shares whole tables carry.
    fn shares_of(tables: &pb::SteerTables) -> Vec<(steer::TunnelId, steer::Share)> {
        tables
            .limits
            .iter()
            .filter_map(|l| match rpc::convert::share_from_pb(l) {
                Ok((t, s)) => Some((t, s?)),
                Err(_) => None,
            })
            .collect()
    }

    /// Takes the answers to shares that came (call with the state lock held): confirmed
    /// shares free what a lowered one gave up.
    fn poll_share_acks(&self, st: &mut State) {
        let now = Instant::now();
        let acks = std::mem::take(&mut st.share_acks);
        for a in acks {
            match a.ack.poll_until(now) {
                None => st.share_acks.push(a),
                Some(Ok(())) => {
                    for (t, share) in a.shares {
                        st.shares.confirm(steer::NodeId(a.node), t, share);
                    }
                }
                // Refused or closed: what the node holds stays counted at the most it may be.
                Some(Err(_)) => {}
            }
        }
    }

    /// Waits until `deadline` (without the lock) for the steer nodes' answers to their
    /// shares, except `skip`'s, then sends the growth they make room for.
    fn settle_shares(&self, deadline: Instant, skip: Option<u32>) {
        let waiting: Vec<ShareAck> = {
            let mut st = self.state();
            let (skipped, waiting) = std::mem::take(&mut st.share_acks)
                .into_iter()
                .partition(|a| Some(a.node) == skip);
            st.share_acks = skipped;
            waiting
        };
        let answers: Vec<_> = waiting
            .into_iter()
            .map(|a| {
                let answer = a.ack.poll_until(deadline);
                (a, answer)
            })
            .collect();
        let mut st = self.state();
        for (a, answer) in answers {
            match answer {
                None => st.share_acks.push(a),
                Some(Ok(())) => {
                    for (t, share) in a.shares {
                        st.shares.confirm(steer::NodeId(a.node), t, share);
                    }
                }
                Some(Err(_)) => {}
            }
        }
        self.poll_share_acks(&mut st);
        self.rebalance(&mut st, Instant::now(), None);
    }

    /// The tunnels' limits at steer node `node`: its shares as last sent (a node outside the
    /// division, which never gets tables, would get the floor).
    fn limits(&self, st: &State, node: u32) -> Vec<pb::RateLimit> {
        self.tunnel_limits()
            .into_iter()
            .filter_map(|(tunnel, bps)| {
                let share = st.shares.sent(steer::NodeId(node), tunnel).unwrap_or_else(|| {
                    steer::Share {
                        limit: st.shares.outsider_share(bps),
                        fallback_bits_per_second: 0,
                    }
                });
                rpc::convert::share_to_pb(tunnel, Some(share))
                    .map_err(|e| warn!(node, tunnel = tunnel.0, error = %e, "rate limit share not expressible"))
                    .ok()
            })
            .collect()
    }

    /// The whole steering state of steer node `node` (the tables are the same for every steer
    /// node, the rate limits are its shares), including the SPIs of removed CHILD_SAs still in
    /// their grace.
    fn steer_tables(&self, st: &State, node: u32) -> pb::SteerTables {
        let mut spis: Vec<pb::SteerSpi> = st
            .children
            .iter()
            .filter_map(|(spi, c)| {
                Some(pb::SteerSpi {
                    spi: spi.0,
                    node: c.node?,
                    tunnel: c.tunnel.0,
                })
            })
            .chain(st.retiring.iter().filter_map(|r| {
                Some(pb::SteerSpi {
                    spi: r.spi.0,
                    node: r.node?,
                    tunnel: r.tunnel.0,
                })
            }))
            .collect();
        spis.sort_by_key(|s| s.spi);
        spis.dedup_by_key(|s| s.spi);
        let vnis = self
            .all_vni_ops(st)
            .into_iter()
            .filter_map(|op| match op {
                pb::directive::Op::SetSelectors(v) => Some(v),
                _ => None,
            })
            .collect();
        pb::SteerTables {
            nodes: Some(self.steer_nodes(st)),
            spis,
            vnis,
            limits: self.limits(st, node),
        }
    }

    /// Queues `op` to every live steer node (call with the state lock held: queuing never
    /// blocks, and keeps each node's directives in the order of the state changes).
    fn submit_steers(&self, st: &State, op: pb::directive::Op) -> Pending {
        Self::steers(st)
            .into_iter()
            .map(|(id, name, link)| (id, name, link.submit(op.clone())))
            .collect()
    }

    /// Waits (without the lock) for the answers; a steer node that did not apply an update
    /// gets the whole tables again on the next tick.
    fn await_steers(&self, pending: Pending) {
        let deadline = self.deadline();
        let mut failed = Vec::new();
        for (id, name, ack) in pending {
            if let Err(e) = ack.and_then(|a| a.wait_until(deadline)) {
                warn!(node = %name, error = %e, "steer node did not apply a steering update; resending its tables");
                failed.push(id);
            }
        }
        if !failed.is_empty() {
            self.state().resync.extend(failed);
        }
    }

    /// Queues a directive without waiting; a failure shows as a closed session.
    fn fire(&self, link: &dyn NodeLink, op: pb::directive::Op, name: &str) {
        if let Err(e) = link.submit(op) {
            warn!(node = name, error = %e, "cannot send a directive");
        }
    }

    /// Makes the newest remaining CHILD_SA of `tunnel` (if any) its sending one, unless one
    /// already sends.
    fn promote_sender(st: &mut State, tunnel: TunnelId) {
        if st
            .children
            .values()
            .any(|c| c.tunnel == tunnel && c.sending)
        {
            return;
        }
        let next = st
            .children
            .iter()
            .filter(|(_, c)| c.tunnel == tunnel)
            .max_by_key(|(_, c)| c.seq)
            .map(|(spi, _)| *spi);
        if let Some(c) = next.and_then(|spi| st.children.get_mut(&spi)) {
            c.sending = true;
        }
    }

    /// Queues `op` to every live data node without waiting (call with the state lock held).
    fn fire_data_nodes(&self, st: &State, op: &pb::directive::Op) {
        for n in st
            .nodes
            .values()
            .filter(|n| n.role == Role::Data && n.alive)
        {
            self.fire(&*n.link, op.clone(), &n.name);
        }
    }

    /// Queues the whole tables to every live steer node (each with its shares of the limits).
    fn push_tables(&self, st: &mut State) {
        // The shares move with the tables, which carry each node's.
        let _carried = st.shares.update(&self.tunnel_limits(), Instant::now());
        let mut tables = self.steer_tables(st, 0);
        for (id, name, link) in Self::steers(st) {
            tables.limits = self.limits(st, id);
            self.send_tables(st, id, &*link, tables.clone(), &name);
        }
    }

    /// Queues the relay list to every live data node and the IKE relay (never an empty list:
    /// a data node keeps the last one).
    fn push_relays(&self, st: &State) {
        self.ike.set_steers(
            st.nodes
                .values()
                .filter(|n| n.role == Role::Steer && n.alive)
                .map(|n| n.geneve)
                .collect(),
        );
        let relays = Self::relays(st);
        if relays.steer.is_empty() {
            return;
        }
        self.fire_data_nodes(st, &pb::directive::Op::SetRelays(relays));
    }

    /// Periodic work (every 100 ms or so): forgets the steering of retired SPIs whose grace
    /// ended, resends whole tables to steer nodes that missed an update (one at a time per
    /// node), rekeys again the tunnels whose CHILD_SA found no live data node (paced by
    /// [`REKEY_RETRY`]).
    pub fn tick(&self, now: Instant) {
        let mut st = self.state();
        let mut due = Vec::new();
        st.retiring.retain(|r| {
            if r.until <= now {
                due.push(r.spi);
                false
            } else {
                true
            }
        });
        // An SPI reinstalled meanwhile (cannot happen with random SPIs, but be exact) stays.
        due.retain(|spi| !st.children.contains_key(spi));
        let mut pending = Vec::new();
        for spi in due {
            pending.extend(self.submit_steers(
                &st,
                pb::directive::Op::RemoveSpi(pb::RemoveSpi { spi: spi.0 }),
            ));
        }
        let mut resync = std::mem::take(&mut st.resync);
        resync.sort_unstable();
        resync.dedup();
        let mut full = Vec::new();
        if st.reconciled {
            for id in resync {
                if st.resyncing.contains(&id) {
                    continue;
                }
                let Some(n) = st
                    .nodes
                    .get(&id)
                    .filter(|n| n.alive && n.role == Role::Steer)
                else {
                    continue;
                };
                let (name, link) = (n.name.clone(), Arc::clone(&n.link));
                let tables = self.steer_tables(&st, id);
                let shares = Self::shares_of(&tables);
                let ack = link.submit(pb::directive::Op::SteerTables(tables));
                st.resyncing.insert(id);
                full.push((id, name, ack, shares));
            }
        }
        // Answers to shares, the growth they make room for, lost steer nodes' graces.
        self.poll_share_acks(&mut st);
        self.rebalance(&mut st, now, None);
        // Tunnels whose CHILD_SA has no live node, now that one may be there.
        let stranded: Vec<TunnelId> = self
            .unplaced(&st)
            .into_iter()
            .filter(|t| self.choose(&st, *t, None).is_some())
            .collect();
        for t in &stranded {
            if let Some(node) = self.choose(&st, *t, None) {
                st.placement.insert(*t, node);
            }
        }
        let rekey = Self::due(&mut st, stranded, now);
        drop(st);
        self.await_steers(pending);
        let deadline = self.deadline();
        for (id, name, ack, shares) in full {
            let result = ack.and_then(|a| a.wait_until(deadline));
            let mut st = self.state();
            st.resyncing.remove(&id);
            match result {
                Ok(()) => {
                    for (t, share) in shares {
                        st.shares.confirm(steer::NodeId(id), t, share);
                    }
                }
                Err(e) => {
                    warn!(node = %name, error = %e, "steer node did not take its whole tables; retrying");
                    st.resync.push(id);
                }
            }
        }
        if !rekey.is_empty() {
            let _ = self
                .tasks
                .send(Task::Rekey(rekey, "retry: no live data node held it"));
        }
    }

    // ---- operator commands ----

    fn tunnel_by_name(&self, name: &str) -> Result<TunnelId, ClusterError> {
        self.inventory()
            .tunnels
            .values()
            .find(|t| t.name == name)
            .map(|t| t.id)
            .ok_or_else(|| ClusterError::UnknownTunnel(name.to_owned()))
    }

    fn usable_data_node(&self, st: &State, name: &str) -> Result<u32, ClusterError> {
        let id = *st
            .ids
            .get(name)
            .ok_or_else(|| ClusterError::UnknownNode(name.to_owned()))?;
        let n = st
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
        Ok(id)
    }

    /// Starts moving `tunnel` to data node `to` (`protego ctl migrate`): its placement
    /// changes and its CHILD_SA is rekeyed; the new SA is installed on `to` while the old one
    /// keeps working, and the old one is deleted once the rekey is done. Returns the
    /// (tunnel, node) ids to wait for with [`Cluster::wait_moved`].
    pub fn migrate(&self, tunnel: &str, to: &str) -> Result<(TunnelId, u32), ClusterError> {
        let t = self.tunnel_by_name(tunnel)?;
        let mut st = self.state();
        let node = self.usable_data_node(&st, to)?;
        if !st.children.values().any(|c| c.tunnel == t) {
            return Err(ClusterError::NotUp(tunnel.to_owned()));
        }
        st.placement.insert(t, node);
        drop(st);
        info!(tunnel, to, "migrating tunnel");
        self.tasks
            .send(Task::Rekey(vec![t], "migration"))
            .map_err(|_| ClusterError::NoControl)?;
        Ok((t, node))
    }

    /// Starts draining data node `name` (`protego ctl drain`): nothing new is placed on it and
    /// every tunnel on it moves to other live nodes. Returns the tunnels moved.
    pub fn drain(&self, name: &str) -> Result<Vec<(TunnelId, u32)>, ClusterError> {
        let mut st = self.state();
        let id = *st
            .ids
            .get(name)
            .ok_or_else(|| ClusterError::UnknownNode(name.to_owned()))?;
        let Some(node) = st.nodes.get(&id) else {
            return Err(ClusterError::UnknownNode(name.to_owned()));
        };
        if node.role != Role::Data {
            return Err(ClusterError::Unsuitable {
                name: name.to_owned(),
                reason: "it is not a data node",
            });
        }
        if let Some(n) = st.nodes.get_mut(&id) {
            n.draining = true;
        }
        let mut tunnels: Vec<TunnelId> = st
            .children
            .values()
            .filter(|c| c.node == Some(id))
            .map(|c| c.tunnel)
            .collect();
        tunnels.sort();
        tunnels.dedup();
        let mut moves = Vec::new();
        for t in &tunnels {
            let Some(to) = self.choose(&st, *t, Some(id)) else {
                if let Some(n) = st.nodes.get_mut(&id) {
                    n.draining = false;
                }
                return Err(ClusterError::Unsuitable {
                    name: name.to_owned(),
                    reason: "no other live data node can take its tunnels",
                });
            };
            st.placement.insert(*t, to);
            moves.push((*t, to));
        }
        drop(st);
        info!(node = name, tunnels = moves.len(), "draining data node");
        if !tunnels.is_empty() {
            self.tasks
                .send(Task::Rekey(tunnels, "drain"))
                .map_err(|_| ClusterError::NoControl)?;
        }
        Ok(moves)
    }

    /// Ends a drain: the node takes tunnels again.
    pub fn undrain(&self, name: &str) -> Result<(), ClusterError> {
        let mut st = self.state();
        let id = *st
            .ids
            .get(name)
            .ok_or_else(|| ClusterError::UnknownNode(name.to_owned()))?;
        if let Some(n) = st.nodes.get_mut(&id) {
            n.draining = false;
        }
        Ok(())
    }

    /// Waits until every `(tunnel, node)` move is done: the tunnel's CHILD_SAs are all on
    /// `node` (the old one deleted).
    pub fn wait_moved(
        &self,
        moves: &[(TunnelId, u32)],
        timeout: Duration,
    ) -> Result<(), ClusterError> {
        let deadline = Instant::now() + timeout;
        let mut st = self.state();
        loop {
            let pending: Vec<TunnelId> = moves
                .iter()
                .filter(|(t, node)| {
                    let mut mine = st.children.values().filter(|c| c.tunnel == *t).peekable();
                    mine.peek().is_none() || mine.any(|c| c.node != Some(*node))
                })
                .map(|(t, _)| *t)
                .collect();
            if pending.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                drop(st);
                let inventory = self.inventory();
                let names: Vec<&str> = pending
                    .iter()
                    .filter_map(|t| inventory.tunnels.get(t).map(|m| m.name.as_str()))
                    .collect();
                return Err(ClusterError::Timeout(format!(
                    "not moved within {timeout:?}: {}",
                    names.join(", ")
                )));
            }
            // Woken by every install and removal (what completes a move); a change made
            // elsewhere is seen at the latest after WAIT_SLICE.
            st = match self
                .changed
                .wait_timeout(st, (deadline - now).min(WAIT_SLICE))
            {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// The cluster as `protego ctl nodes` shows it.
    pub fn describe(&self) -> serde_json::Value {
        let inventory = self.inventory();
        let st = self.state();
        // Each steer node's shares of the tunnels' limits, bit/s each way.
        let mut shares: BTreeMap<u32, serde_json::Map<String, serde_json::Value>> = BTreeMap::new();
        for ((node, tunnel), l) in self.all_shares(&st) {
            shares.entry(node).or_default().insert(
                tunnel.0.to_string(),
                serde_json::json!({
                    "inbound_bps": l.limit.inbound.bits_per_second,
                    "outbound_bps": l.limit.outbound.bits_per_second,
                    "fallback_bps": l.fallback_bits_per_second,
                }),
            );
        }
        let nodes: Vec<serde_json::Value> = st
            .nodes
            .iter()
            .map(|(id, n)| {
                let children: Vec<String> = st
                    .children
                    .iter()
                    .filter(|(_, c)| c.node == Some(*id))
                    .map(|(spi, c)| format!("{spi}/{}", c.outbound_spi))
                    .collect();
                let tunnels: Vec<&str> = st
                    .placement
                    .iter()
                    .filter(|(_, n)| **n == *id)
                    .filter_map(|(t, _)| inventory.tunnels.get(t).map(|m| m.name.as_str()))
                    .collect();
                serde_json::json!({
                    "id": id,
                    "name": n.name,
                    "role": n.role,
                    "geneve": n.geneve.to_string(),
                    "alive": n.alive,
                    "draining": n.draining,
                    "parked": n.parked,
                    "workers": n.workers,
                    "tunnels": tunnels,
                    "child_sas": children,
                    "load": n.last_report,
                    "reports": n.reports,
                    "rate_shares": shares.remove(id).unwrap_or_default(),
                })
            })
            .collect();
        serde_json::json!({ "control": self.settings.name, "nodes": nodes })
    }

    /// Geneve addresses of the live steer nodes (where IKE may come from and goes to).
    pub fn steer_addrs(&self) -> Vec<SocketAddr> {
        self.state()
            .nodes
            .values()
            .filter(|n| n.role == Role::Steer && n.alive)
            .map(|n| n.geneve)
            .collect()
    }

    /// Live data nodes (names).
    pub fn live_data_nodes(&self) -> Vec<String> {
        self.state()
            .nodes
            .values()
            .filter(|n| n.role == Role::Data && n.alive)
            .map(|n| n.name.clone())
            .collect()
    }
}

impl DataPath for Cluster {
    /// The checks a data node makes of VNets and bindings that do not depend on the node
    /// (one VNet per VNI: data nodes share one VTEP address; every field as the wire carries
    /// it). What does depend on the node is checked by each data node when the VNets arrive;
    /// a node that refuses says so in its answer, which is logged.
    fn check_inside(
        &self,
        vnets: &[dataplane::VnetConfig],
        tunnels: &[dataplane::TunnelBinding],
    ) -> Result<(), DataplaneError> {
        let pb = rpc::convert::data_config_to_pb(vnets, tunnels);
        let vtep = vnets
            .first()
            .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |v| v.vtep);
        rpc::convert::data_config_from_pb(&pb, vtep)
            .map(drop)
            .map_err(|e| DataplaneError::Unsupported {
                operation: "set_inside",
                reason: e.to_string(),
            })
    }

    /// Replaces the VNets and bindings: every live data node gets them, and the steer nodes
    /// their new tables (selectors by the tunnels' new VNIs). Rate limits are kept by tunnel
    /// id; [`Cluster::set_rate_limits`] changes them.
    fn set_inside(
        &self,
        vnets: Vec<dataplane::VnetConfig>,
        tunnels: Vec<dataplane::TunnelBinding>,
    ) -> Result<(), DataplaneError> {
        self.check_inside(&vnets, &tunnels)?;
        let data_config = rpc::convert::data_config_to_pb(&vnets, &tunnels);
        {
            let mut inv = self
                .inventory
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let metas = tunnels
                .iter()
                .map(|b| {
                    let vni = match b.inside {
                        dataplane::Inside::Vnet(i) => vnets.get(i).map(|v| v.vni),
                        dataplane::Inside::Tun => None,
                    };
                    let meta = TunnelMeta {
                        id: b.tunnel,
                        name: b.name.clone(),
                        vni,
                        rate_limit_mbit: inv.tunnels.get(&b.tunnel).and_then(|t| t.rate_limit_mbit),
                    };
                    (b.tunnel, meta)
                })
                .collect();
            *inv = Arc::new(Inventory {
                tunnels: metas,
                data_config: data_config.clone(),
            });
        }
        let mut st = self.state();
        // Tunnels no longer configured take no place in the balance of the data nodes.
        let inventory = self.inventory();
        st.placement
            .retain(|t, _| inventory.tunnels.contains_key(t));
        st.rekey_at.retain(|t, _| inventory.tunnels.contains_key(t));
        self.fire_data_nodes(&st, &pb::directive::Op::DataConfig(data_config));
        if st.reconciled {
            self.push_tables(&mut st);
        }
        info!(
            vnets = vnets.len(),
            tunnels = tunnels.len(),
            "VNets and tunnels sent to the data and steer nodes"
        );
        Ok(())
    }

    fn install_child(&self, child: &ChildSaInfo) -> Result<(), DataplaneError> {
        let refuse = |reason: String| DataplaneError::Install {
            tunnel: child.tunnel,
            spi: child.inbound_spi,
            reason,
        };
        let pb_child = rpc::convert::child_to_pb(child);
        let mut st = self.state();
        if st.children.contains_key(&child.inbound_spi) {
            return Err(refuse("inbound SPI already installed".into()));
        }
        let node = self.choose(&st, child.tunnel, None);
        st.seq += 1;
        let seq = st.seq;
        // Recorded first so that a data node arriving later takes it (rekey).
        st.children.insert(
            child.inbound_spi,
            ChildEntry {
                tunnel: child.tunnel,
                node: None,
                last_node: None,
                outbound_spi: child.outbound_spi,
                ike: child.ike,
                seq,
                sending: false,
                local_ts: child.local_ts.clone(),
                remote_ts: child.remote_ts.clone(),
            },
        );
        let Some(node) = node else {
            return Err(refuse(
                "no live data node (it moves to the first one that registers)".into(),
            ));
        };
        st.placement.insert(child.tunnel, node);
        let n = &st.nodes[&node];
        let (link, name) = (Arc::clone(&n.link), n.name.clone());
        // Queued under the lock: after the node's inside configuration, in state order.
        let ack = link.submit(pb::directive::Op::InstallChild(pb_child));
        drop(st);

        if let Err(e) = ack.and_then(|a| a.wait_until(self.deadline())) {
            // It may still arrive there: remove it, and rekey the tunnel later (paced).
            self.fire(
                &*link,
                pb::directive::Op::RemoveChild(pb::RemoveChild {
                    tunnel: child.tunnel.0,
                    inbound_spi: child.inbound_spi.0,
                    outbound_spi: child.outbound_spi.0,
                }),
                &name,
            );
            self.state()
                .rekey_at
                .entry(child.tunnel)
                .or_insert_with(Instant::now);
            return Err(refuse(format!("data node {name}: {e}")));
        }
        let mut st = self.state();
        let live = |n: Option<u32>| n.is_some_and(|n| st.nodes.get(&n).is_some_and(|n| n.alive));
        let has_sender = st
            .children
            .values()
            .any(|c| c.tunnel == child.tunnel && c.sending && live(c.node));
        let sending = child.outbound_active || !has_sender;
        if sending {
            for c in st
                .children
                .values_mut()
                .filter(|c| c.tunnel == child.tunnel)
            {
                c.sending = false;
            }
        }
        if let Some(e) = st.children.get_mut(&child.inbound_spi) {
            e.node = Some(node);
            e.sending = sending;
        }
        let mut pending = self.submit_steers(
            &st,
            pb::directive::Op::SetSpi(pb::SteerSpi {
                spi: child.inbound_spi.0,
                node,
                tunnel: child.tunnel.0,
            }),
        );
        if let Some(vni) = self
            .inventory()
            .tunnels
            .get(&child.tunnel)
            .and_then(|t| t.vni)
            .filter(|_| sending)
        {
            pending.extend(self.submit_steers(&st, self.vni_op(&st, vni)));
        }
        drop(st);
        self.await_steers(pending);
        self.changed.notify_all();
        debug!(tunnel = child.tunnel.0, spi_in = %child.inbound_spi, node = %name, sending, "CHILD_SA placed");
        Ok(())
    }

    fn remove_child(&self, tunnel: TunnelId, inbound_spi: EspSpi, outbound_spi: EspSpi) {
        let mut st = self.state();
        let Some(entry) = st.children.remove(&inbound_spi) else {
            debug!(tunnel = tunnel.0, spi_in = %inbound_spi, "remove_child: not placed");
            return;
        };
        // The newest remaining SA of the tunnel sends once the sending one is gone; the
        // steer nodes move the tunnel's outbound traffic to it before the old SA goes.
        // A restored SA that is gone may not be adopted again from a node that still has it.
        st.known.remove(&inbound_spi);
        let mut pending = Vec::new();
        if entry.sending {
            Self::promote_sender(&mut st, tunnel);
            if let Some(vni) = self.inventory().tunnels.get(&tunnel).and_then(|t| t.vni) {
                pending = self.submit_steers(&st, self.vni_op(&st, vni));
            }
        }
        let holder_id = entry.node.or(entry.last_node);
        st.retiring.push(Retiring {
            until: Instant::now() + STEER_GRACE,
            spi: inbound_spi,
            node: holder_id,
            tunnel,
        });
        // A node whose session is open holds it (one the probes declared dead too).
        let holder = holder_id
            .and_then(|n| st.nodes.get(&n))
            .filter(|n| !n.link_closed())
            .map(|n| (Arc::clone(&n.link), n.name.clone()));
        drop(st);
        self.changed.notify_all();
        self.await_steers(pending);
        if let Some((link, name)) = holder {
            let op = pb::directive::Op::RemoveChild(pb::RemoveChild {
                tunnel: tunnel.0,
                inbound_spi: inbound_spi.0,
                outbound_spi: outbound_spi.0,
            });
            if let Err(e) = link.submit(op).and_then(|a| a.wait_until(self.deadline())) {
                warn!(node = %name, tunnel = tunnel.0, spi_in = %inbound_spi, error = %e, "data node did not remove a CHILD_SA");
            }
        }
    }

    fn update_peer(&self, tunnel: TunnelId, ike: IkeSpis, local: SocketAddr, remote: SocketAddr) {
        let st = self.state();
        let mut holders: Vec<u32> = st
            .children
            .values()
            .filter(|c| c.tunnel == tunnel && c.ike == ike)
            .filter_map(|c| c.node)
            .collect();
        holders.sort_unstable();
        holders.dedup();
        let links: Vec<(String, Arc<dyn NodeLink>)> = holders
            .iter()
            .filter_map(|id| st.nodes.get(id))
            .filter(|n| n.alive)
            .map(|n| (n.name.clone(), Arc::clone(&n.link)))
            .collect();
        drop(st);
        let op = pb::directive::Op::UpdatePeer(pb::UpdatePeer {
            tunnel: tunnel.0,
            ike_initiator_spi: ike.initiator.0,
            ike_responder_spi: ike.responder.0,
            local: local.to_string(),
            remote: remote.to_string(),
        });
        let deadline = self.deadline();
        for (name, link) in links {
            if let Err(e) = link.submit(op.clone()).and_then(|a| a.wait_until(deadline)) {
                warn!(node = %name, tunnel = tunnel.0, error = %e, "data node did not move the tunnel's peer address");
            }
        }
    }

    /// Checks what the data nodes claimed in their Hellos (adopted before the control loop
    /// restored its IKE SAs) against the restored CHILD_SAs: one that no restored IKE SA knows,
    /// or that a data node holds under another tunnel, outbound SPI or other selectors than the
    /// restored state says, is removed from its node (a wrong claim must not steer a
    /// tunnel's selectors), and every restored CHILD_SA no live data node holds as described is
    /// returned to be rekeyed.
    fn reconcile(&self, known: &[KnownChild]) -> Vec<EspSpi> {
        let known: HashMap<EspSpi, KnownChild> =
            known.iter().map(|k| (k.inbound_spi, k.clone())).collect();
        let mut st = self.state();
        st.reconciled = true;
        let stale: Vec<EspSpi> = st
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
        st.known = known.clone();
        let now = Instant::now();
        let mut unsent: Vec<TunnelId> = Vec::new();
        for spi in stale {
            if let Some(e) = st.children.remove(&spi) {
                if e.sending {
                    unsent.push(e.tunnel);
                }
                st.retiring.push(Retiring {
                    until: now + STEER_GRACE,
                    spi,
                    node: e.node,
                    tunnel: e.tunnel,
                });
                if let Some(n) = e.node.and_then(|n| st.nodes.get(&n)).filter(|n| n.alive) {
                    warn!(node = %n.name, spi_in = %spi, "removing a CHILD_SA that no restored IKE SA knows as held");
                    self.fire(
                        &*n.link,
                        pb::directive::Op::RemoveChild(pb::RemoveChild {
                            tunnel: e.tunnel.0,
                            inbound_spi: spi.0,
                            outbound_spi: e.outbound_spi.0,
                        }),
                        &n.name,
                    );
                }
            }
        }
        // A tunnel whose sending SA was removed sends on its newest remaining one.
        for tunnel in unsent {
            Self::promote_sender(&mut st, tunnel);
        }
        let lost: Vec<EspSpi> = known
            .keys()
            .filter(|spi| {
                !st.children
                    .get(spi)
                    .and_then(|c| c.node)
                    .is_some_and(|n| st.nodes.get(&n).is_some_and(|n| n.alive))
            })
            .copied()
            .collect();
        // Now the steer nodes' tables can be replaced whole: every node that came has been
        // adopted.
        self.push_tables(&mut st);
        self.push_relays(&st);
        drop(st);
        info!(
            known = known.len(),
            lost = lost.len(),
            "restored CHILD_SAs reconciled with the data nodes"
        );
        lost
    }

    fn send_ike(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
        payload: &[u8],
    ) -> Result<(), DataplaneError> {
        let steers = self.steer_addrs();
        self.ike.send(&steers, local, remote, payload)
    }

    fn stats(&self) -> DataplaneStats {
        let st = self.state();
        let mut drops: BTreeMap<String, u64> = BTreeMap::new();
        for n in st.nodes.values() {
            if let Some(r) = &n.last_report {
                for (reason, count) in &r.drops {
                    *drops.entry(format!("{}:{reason}", n.name)).or_default() += count;
                }
            }
        }
        drop(st);
        for (reason, count) in self.ike.drops() {
            drops.insert(format!("ike_relay:{reason}"), count);
        }
        DataplaneStats {
            drops: drops.into_iter().collect(),
            ..DataplaneStats::default()
        }
    }
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.settings.name)
            .finish_non_exhaustive()
    }
}

#[path = "manager_autoscale.rs"]
mod autoscale;

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
