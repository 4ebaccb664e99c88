//! The control node's cluster shell: the [`DataPath`] the IKE control loop drives in the
//! distributed form, around the pure [`ClusterCore`] (docs/architecture.md, "Cluster core").
//! The core decides (registry, placement, steering, moves, failover); this shell owns what
//! the core must not: the nodes' links, the lock, the waits for answers, the clock, the
//! protobuf conversion, the control loop's task queue and the IKE relay. Every entry point
//! feeds one input into the core and carries its [`crate::core::Outbox`] out:
//!
//! - `install_child` places the CHILD_SA on its tunnel's data node, installs it there, then
//!   steers its inbound SPI to that node on every steer node and, when it becomes the
//!   tunnel's sending SA, the tunnel's outbound selectors too — all acknowledged before the
//!   call returns, so the IKE message that lets the peer use the SA leaves after the
//!   steering is in place.
//! - `remove_child` moves the steering away first, then removes it from its data node; the
//!   steer nodes keep steering its SPI for the data node's grace.
//! - `send_ike` sends through a steer node, from the VIP ([`crate::ike_relay`]).
//!
//! Moves (docs/architecture.md, "Moving tunnels") change the placement and rekey
//! ([`Cluster::migrate`], [`Cluster::drain`], data node failover).
//!
//! Lock discipline: directives are queued to a node's session while the lock is held
//! (queuing never blocks), so every node receives them in the order of the state changes
//! they describe; the lock is never held while waiting for a node's answer (the session
//! tasks that deliver answers also take it).

use crate::core::{ClusterCore, Hello, InstallRefused, NewChild};
use crate::ike_relay::IkeRelay;
use crate::link::{Ack, LinkError, NodeLink};
use crossbeam_channel::Sender;
use dataplane::{DataPath, DataplaneError, DataplaneStats, InstalledChild, KnownChild, ToControl};
use ike::{ChildSaInfo, IkeSpis, TunnelId};
use rpc::pb;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};
use wire::EspSpi;

pub use crate::core::{
    AttachmentMeta, AttachmentTraffic, ClusterError, NodeLoad, PortInfo, Role, TunnelMeta,
    STEER_GRACE,
};

/// Longest a waiting move sleeps without looking at the state again.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// Most CHILD_SAs one data node may report in its Hello.
pub const MAX_INSTALLED: usize = 1_000_000;

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
    /// Steer or self-dispatch, and the ring (`[cluster.dispatch]`).
    pub dispatch: control::config::ClusterDispatch,
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
    /// Its customer-facing ports (steer nodes).
    pub ports: Vec<PortInfo>,
    /// The attachments' CE MACs it knows (data nodes): (attachment, MAC).
    pub ce_macs: Vec<(String, [u8; 6])>,
    /// The version of the per-VM routes it holds (data nodes; epoch 0: none).
    pub routes: routebook::RouteVersion,
    /// Its own VTEP address (data nodes; None: it cannot take part in self-dispatch).
    pub vtep: Option<std::net::IpAddr>,
}

/// Work the cluster hands to its own thread (it calls into the control loop, which must not
/// be called from the control loop's thread or a session task).
#[derive(Debug)]
pub enum Task {
    /// Rekey these tunnels' CHILD_SAs onto their (new) placement.
    Rekey(Vec<TunnelId>, &'static str),
    /// Self-dispatch: create one more CHILD_SA per entry (spread tunnels, one per data node).
    AddChildren(Vec<TunnelId>),
    /// Self-dispatch: delete these CHILD_SAs with the peer (their data node was lost).
    DeleteChildren(Vec<(TunnelId, wire::EspSpi)>),
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

/// What the lock guards: the core, and the links and pending answers it cannot hold.
struct Shell {
    core: ClusterCore,
    /// Each registered node's current session.
    links: HashMap<u32, Arc<dyn NodeLink>>,
    /// Answers to shares, by the core's token, polled as they come.
    acks: HashMap<u64, Ack>,
    /// The tenant filters and CPU fairness the data nodes get, and what they report.
    filters: filters::FilterShip,
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
    /// The data nodes' inside configuration (replaced by an apply).
    data_config: std::sync::RwLock<Arc<pb::DataConfig>>,
    /// The configured attachments and their steer nodes (their VNIs follow the VNets).
    attachments: Mutex<Vec<(datapath::AttachmentConfig, String)>>,
    ike: IkeRelay,
    tasks: Sender<Task>,
    to_control: Sender<ToControl>,
    /// The per-VM routes' master table (locked before `state`, never after). Shared with the
    /// threads that wait for a replay's answer ([`crate::link::Ack::on_answer`]).
    routes: Arc<Mutex<routes::RouteSync>>,
    state: Arc<Mutex<Shell>>,
    /// Per tunnel, the traffic the data nodes reported, summed over their reports (each is
    /// the interval's delta): cumulative across migrations and node losses, up to the last
    /// report of a lost node. Never locked with `state` held.
    traffic: Mutex<BTreeMap<TunnelId, datapath::TunnelTraffic>>,
}

/// Each VNI's gateway addresses in `config`.
fn gateways(config: &pb::DataConfig) -> BTreeMap<u32, Vec<String>> {
    let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for v in &config.vnets {
        out.entry(v.vni)
            .or_default()
            .extend(v.gateway_ips.iter().cloned());
    }
    out
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
        let autoscaler =
            crate::capacity::Autoscaler::new(settings.node_capacity_mbit, &settings.autoscale)
                .map_err(|e| warn!(error = %e, "autoscaler disabled"))
                .ok();
        let mut core = ClusterCore::new(
            settings.geneve,
            std::collections::HashSet::new(),
            tunnels,
            gateways(&data_config),
            share_grace(settings.report_interval),
        );
        core.set_dispatch_settings(settings.dispatch.clone(), std::time::Instant::now());
        Self {
            autoscaler: Mutex::new((autoscaler, None)),
            provider: None,
            settings,
            changed: std::sync::Condvar::new(),
            data_config: std::sync::RwLock::new(Arc::new(data_config)),
            attachments: Mutex::new(Vec::new()),
            ike,
            tasks,
            to_control,
            routes: Arc::new(Mutex::new(routes::RouteSync::new())),
            state: Arc::new(Mutex::new(Shell {
                core,
                links: HashMap::new(),
                acks: HashMap::new(),
                filters: filters::FilterShip::default(),
            })),
            traffic: Mutex::new(BTreeMap::new()),
        }
    }

    /// Adds a data node's report of its tunnels' traffic over the interval.
    pub fn traffic_reported(&self, usage: &[pb::TunnelUsage]) {
        let mut traffic = self.traffic.lock().unwrap_or_else(PoisonError::into_inner);
        for u in usage {
            traffic
                .entry(TunnelId(u.tunnel))
                .or_default()
                .add(datapath::TunnelTraffic {
                    bytes_in: u.bytes_in,
                    packets_in: u.packets_in,
                    bytes_out: u.bytes_out,
                    packets_out: u.packets_out,
                    drops_in: 0,
                });
        }
    }

    /// The cluster with `provider` starting and stopping data nodes for the autoscaler.
    #[must_use]
    pub fn with_provider(mut self, provider: Arc<dyn crate::provider::NodeProvider>) -> Self {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .core
            .provided = provider.nodes().into_iter().map(|n| n.name).collect();
        self.provider = Some(provider);
        self
    }

    /// The data nodes' current inside configuration.
    fn data_config(&self) -> Arc<pb::DataConfig> {
        Arc::clone(
            &self
                .data_config
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The state, with the core told of every session that closed since.
    fn state(&self) -> MutexGuard<'_, Shell> {
        // Every critical section leaves the state consistent before anything can panic.
        let mut sh = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Shell { core, links, .. } = &mut *sh;
        for (id, link) in links.iter() {
            if link.is_closed() && core.node(*id).is_some_and(|n| n.session_open) {
                core.handle_link_closed(*id);
            }
        }
        sh
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.settings.directive_timeout
    }

    // ---- sessions ----

    /// The id of the node called `name` (stable for the control node's lifetime).
    pub fn node_id(&self, name: &str) -> u32 {
        self.state().core.node_id(name)
    }

    /// A node opened a session (its Hello is checked against its certificate by the
    /// caller). Returns its id. The node receives its configuration at once (data nodes: the
    /// inside configuration and the steer nodes' addresses); steer nodes receive the whole
    /// tables once the control loop reconciled its restored state (before that, they keep
    /// the tables they have, so a new control node never shrinks them).
    pub fn register(&self, hello: Registration, link: Arc<dyn NodeLink>) -> u32 {
        let role = hello.role;
        let (name, routes) = (hello.name.clone(), hello.routes);
        // Decided before the core may place anything on it: a node whose routes are behind
        // takes new tunnels and attachments only if no current one can.
        let routes_current = self.routes_current_at(routes);
        let session = Arc::clone(&link);
        let mut sh = self.state();
        let id = sh.core.node_id(&hello.name);
        sh.links.insert(id, link);
        if role == Role::Data {
            sh.core.set_routes_current(id, routes_current);
        }
        let id = sh.core.handle_hello(
            Hello {
                name: hello.name,
                role,
                geneve: hello.geneve,
                boot_id: hello.boot_id,
                workers: hello.workers,
                installed: hello.installed,
                ports: hello.ports,
                vtep: hello.vtep,
            },
            Instant::now(),
        );
        // A new active control node learns the CE MACs again from the nodes that know them.
        if role == Role::Data {
            for (attachment, mac) in &hello.ce_macs {
                sh.core.handle_ce_learned(id, attachment, *mac);
            }
        }
        let q = self.carry(&mut sh, None);
        if role == Role::Data {
            // After its inside configuration, before anything placed on it.
            self.filters_on_hello(&mut sh, id, &name);
        }
        drop(sh);
        if role == Role::Steer {
            // The newcomer starts with what the others gave up: wait for them to confirm (not
            // for the newcomer, whose session starts once this returns).
            self.settle_shares(self.deadline(), Some(id));
        }
        self.finish(q);
        if role == Role::Data {
            self.routes_hello(id, &name, routes, &session);
        }
        id
    }

    /// A node's session ended (or its stream failed). A data node's CHILD_SAs are moved
    /// (the process may be gone). A steer node stays in the data nodes' relay list, behind
    /// the live ones: its forwarding may be fine, and a list must never become empty.
    pub fn session_ended(&self, id: u32, link: &Arc<dyn NodeLink>) {
        let mut sh = self.state();
        // A newer session of the same node replaced this one: nothing to do.
        if !sh.links.get(&id).is_some_and(|l| Arc::ptr_eq(l, link)) {
            return;
        }
        if let Some(n) = sh.core.node(id) {
            warn!(node = %n.name, id, role = ?n.role, "node session ended");
        }
        sh.core.handle_session_ended(id, Instant::now());
        let q = self.carry(&mut sh, None);
        drop(sh);
        self.finish(q);
    }

    /// A steer node's health monitor declared data node `id` dead.
    pub fn node_dead(&self, id: u32, by: &str) {
        let mut sh = self.state();
        if let Some(n) = sh.core.node(id).filter(|n| n.role == Role::Data && n.alive) {
            warn!(node = %n.name, id, reported_by = by, "data node missed its health probes");
        }
        sh.core.handle_node_dead(id, Instant::now());
        let q = self.carry(&mut sh, None);
        drop(sh);
        self.finish(q);
    }

    /// A data node a steer node had declared dead answers its probes again.
    fn node_alive(&self, id: u32, by: &str) {
        let mut sh = self.state();
        debug!(id, reported_by = by, "data node reported alive");
        sh.core.handle_node_alive(id, Instant::now());
        let q = self.carry(&mut sh, None);
        drop(sh);
        self.finish(q);
    }

    /// An event from node `id` (`name`). Data nodes speak only for the CHILD_SAs they hold,
    /// steer nodes only about data nodes' health; anything else is ignored and logged.
    pub fn event(&self, id: u32, name: &str, event: pb::NodeEvent) {
        use pb::node_event::Event;
        let role = self.state().core.node(id).map(|n| n.role);
        let holds = |spi: u32| self.state().core.holds(id, EspSpi(spi));
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
            (Some(Event::CeLearned(m)), Some(Role::Data)) => {
                match rpc::convert::ce_mac_from_pb(&m) {
                    Ok((attachment, mac)) => {
                        let mut sh = self.state();
                        sh.core.handle_ce_learned(id, &attachment, mac);
                        let q = self.carry(&mut sh, None);
                        drop(sh);
                        self.finish(q);
                    }
                    Err(e) => warn!(node = name, error = %e, "ce_learned ignored"),
                }
            }
            (Some(Event::NodeDead(dead)), Some(Role::Steer)) => self.node_dead(dead, name),
            (Some(Event::NodeAlive(back)), Some(Role::Steer)) => self.node_alive(back, name),
            (None, _) => {}
            (Some(other), _) => {
                warn!(node = name, event = ?other, "event not for this node to send; ignored");
            }
        }
    }

    /// A node's report. A live steer node's report re-divides the tunnels' limits among the
    /// steer nodes: shares that moved enough are sent (see [`steer::RateShares::update`]).
    pub fn report(&self, id: u32, load: NodeLoad) {
        let mut sh = self.state();
        if sh
            .core
            .node(id)
            .is_some_and(|n| n.role == Role::Steer && n.alive)
        {
            Self::poll_acks(&mut sh);
        }
        sh.core.handle_report(id, load, Instant::now());
        let q = self.carry(&mut sh, None);
        drop(sh);
        self.finish(q);
    }

    /// Replaces the tunnels' rate limits (an apply changed them) and sends the steer nodes
    /// their new tables.
    pub fn set_rate_limits(&self, limits: &BTreeMap<TunnelId, Option<u32>>) {
        let mut sh = self.state();
        sh.core.handle_rate_limits(limits, Instant::now());
        let q = self.carry(&mut sh, None);
        drop(sh);
        self.finish(q);
    }

    /// Periodic work (every 100 ms or so): see [`ClusterCore::handle_tick`].
    pub fn tick(&self, now: Instant) {
        let mut sh = self.state();
        Self::poll_acks(&mut sh);
        sh.core.handle_tick(now);
        let q = self.carry(&mut sh, None);
        drop(sh);
        self.finish(q);
    }

    // ---- operator commands ----

    /// Starts moving `tunnel` to data node `to` (`protego ctl migrate`): its placement
    /// changes and its CHILD_SA is rekeyed; the new SA is installed on `to` while the old one
    /// keeps working, and the old one is deleted once the rekey is done. Returns the
    /// (tunnel, node) ids to wait for with [`Cluster::wait_moved`].
    pub fn migrate(&self, tunnel: &str, to: &str) -> Result<(TunnelId, u32), ClusterError> {
        let mut sh = self.state();
        let moved = sh.core.handle_migrate(tunnel, to)?;
        let q = self.carry(&mut sh, None);
        drop(sh);
        if !self.finish(q) {
            return Err(ClusterError::NoControl);
        }
        Ok(moved)
    }

    /// Starts draining data node `name` (`protego ctl drain`): nothing new is placed on it and
    /// every tunnel on it moves to other live nodes. Returns the tunnels moved.
    pub fn drain(&self, name: &str) -> Result<Vec<(TunnelId, u32)>, ClusterError> {
        let mut sh = self.state();
        let moves = sh.core.handle_drain(name)?;
        let q = self.carry(&mut sh, None);
        drop(sh);
        if !self.finish(q) {
            return Err(ClusterError::NoControl);
        }
        Ok(moves)
    }

    /// Ends a drain: the node takes tunnels and attachments again.
    pub fn undrain(&self, name: &str) -> Result<(), ClusterError> {
        let mut sh = self.state();
        sh.core.handle_undrain(name)?;
        let q = self.carry(&mut sh, None);
        drop(sh);
        self.finish(q);
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
        let mut sh = self.state();
        loop {
            let pending = sh.core.moves_pending(moves);
            if pending.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                let names: Vec<&str> = pending
                    .iter()
                    .filter_map(|t| sh.core.tunnels().get(t).map(|m| m.name.as_str()))
                    .collect();
                return Err(ClusterError::Timeout(format!(
                    "not moved within {timeout:?}: {}",
                    names.join(", ")
                )));
            }
            // Woken by every install and removal (what completes a move); a change made
            // elsewhere is seen at the latest after WAIT_SLICE.
            sh = match self
                .changed
                .wait_timeout(sh, (deadline - now).min(WAIT_SLICE))
            {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// The cluster as `protego ctl nodes` shows it.
    pub fn describe(&self) -> serde_json::Value {
        let status = self.state().core.status();
        convert::status_json(&self.settings.name, &status)
    }

    /// Self-dispatch as `protego ctl dispatch show` shows it.
    pub fn dispatch_show(&self) -> serde_json::Value {
        let sh = self.state();
        let status = sh.core.dispatch_status(Instant::now());
        convert::dispatch_json(&status, sh.core.nodes())
    }

    /// Geneve addresses of the live steer nodes (where IKE may come from and goes to).
    pub fn steer_addrs(&self) -> Vec<SocketAddr> {
        self.state().core.steer_addrs()
    }

    /// The role of node `id`, if it registered.
    pub fn role_of(&self, id: u32) -> Option<Role> {
        self.state().core.node(id).map(|n| n.role)
    }

    /// Live data nodes (names).
    pub fn live_data_nodes(&self) -> Vec<String> {
        self.state()
            .core
            .nodes()
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
        self.set_route_vnets(&vnets)?;
        let data_config = rpc::convert::data_config_to_pb(&vnets, &tunnels);
        let gateways = gateways(&data_config);
        *self
            .data_config
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(data_config);
        let mut sh = self.state();
        let metas = tunnels
            .iter()
            .map(|b| TunnelMeta {
                id: b.tunnel,
                name: b.name.clone(),
                vni: match b.inside {
                    dataplane::Inside::Vnet(i) => vnets.get(i).map(|v| v.vni),
                    dataplane::Inside::Tun => None,
                },
                rate_limit_mbit: sh
                    .core
                    .tunnels()
                    .get(&b.tunnel)
                    .and_then(|t| t.rate_limit_mbit),
            })
            .collect();
        sh.core.handle_inventory(metas, gateways, Instant::now());
        // The attachments' VNIs follow their VNets.
        let attachments = attach::attachment_metas(
            &self.attachments.lock().unwrap_or_else(|e| e.into_inner()),
            &self.data_config(),
        );
        let current: Vec<AttachmentMeta> = sh
            .core
            .attachments()
            .values()
            .map(|a| a.meta.clone())
            .collect();
        if attachments != current {
            sh.core.handle_attachments(attachments, Instant::now());
        }
        let q = self.carry(&mut sh, None);
        drop(sh);
        self.finish(q);
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
        let new = NewChild::from(child);
        let mut sh = self.state();
        let node = match sh.core.handle_install(new.clone()) {
            Ok(node) => node,
            Err(InstallRefused::Duplicate) => {
                return Err(refuse("inbound SPI already installed".into()))
            }
            Err(InstallRefused::NoDataNode) => {
                return Err(refuse(
                    "no live data node (it moves to the first one that registers)".into(),
                ))
            }
        };
        let name = sh
            .core
            .node(node)
            .map_or_else(String::new, |n| n.name.clone());
        let mut q = self.carry(&mut sh, Some(child));
        drop(sh);
        let answer = q
            .install
            .take()
            .unwrap_or(Err(LinkError::Closed))
            .and_then(|a| a.wait_until(self.deadline()));
        self.finish(q);

        let mut sh = self.state();
        sh.core
            .handle_install_answer(&new, answer.is_ok(), Instant::now());
        let sending = sh
            .core
            .children()
            .get(&child.inbound_spi)
            .is_some_and(|c| c.sending);
        let q = self.carry(&mut sh, None);
        drop(sh);
        self.finish(q);
        if let Err(e) = answer {
            return Err(refuse(format!("data node {name}: {e}")));
        }
        self.changed.notify_all();
        debug!(tunnel = child.tunnel.0, spi_in = %child.inbound_spi, node = %name, sending, "CHILD_SA placed");
        Ok(())
    }

    fn remove_child(&self, tunnel: TunnelId, inbound_spi: EspSpi, outbound_spi: EspSpi) {
        let mut sh = self.state();
        sh.core
            .handle_remove(tunnel, inbound_spi, outbound_spi, Instant::now());
        let q = self.carry(&mut sh, None);
        drop(sh);
        self.changed.notify_all();
        self.finish(q);
    }

    fn child_refused(&self, tunnel: TunnelId, no_more: bool) {
        self.state()
            .core
            .handle_child_refused(tunnel, no_more, Instant::now());
    }

    fn update_peer(&self, tunnel: TunnelId, ike: IkeSpis, local: SocketAddr, remote: SocketAddr) {
        let sh = self.state();
        let links: Vec<(String, Arc<dyn NodeLink>)> = sh
            .core
            .peer_holders(tunnel, ike)
            .into_iter()
            .filter_map(|id| {
                Some((
                    sh.core.node(id)?.name.clone(),
                    Arc::clone(sh.links.get(&id)?),
                ))
            })
            .collect();
        drop(sh);
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

    /// See [`ClusterCore::handle_reconcile`].
    fn reconcile(&self, known: &[KnownChild]) -> Vec<EspSpi> {
        let mut sh = self.state();
        let lost = sh.core.handle_reconcile(known, Instant::now());
        let q = self.carry(&mut sh, None);
        drop(sh);
        self.finish(q);
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

    /// See [`Cluster::cluster_change_routes`].
    fn change_routes(
        &self,
        change: datapath::RouteChange,
    ) -> Result<datapath::RouteChangeReport, DataplaneError> {
        self.cluster_change_routes(change)
    }

    /// The master table's snapshot, headed by its version (what the route store keeps).
    fn write_routes(&self, out: &mut dyn std::io::Write) -> Result<usize, DataplaneError> {
        self.cluster_write_routes(out)
    }

    fn route_stats(&self) -> datapath::RouteStats {
        self.cluster_route_stats()
    }

    /// See [`Cluster::cluster_set_cpu_fairness`].
    fn set_cpu_fairness(
        &self,
        fairness: &datapath::CpuFairnessConfig,
    ) -> Result<(), DataplaneError> {
        self.cluster_set_cpu_fairness(fairness)
    }

    /// See [`Cluster::cluster_set_filters`].
    fn set_filters(&self, filters: &[datapath::FilterConfig]) -> Result<(), DataplaneError> {
        self.cluster_set_filters(filters)
    }

    /// See [`Cluster::cluster_keep_filter_settings`].
    fn keep_filter_settings(
        &self,
        settings: &[datapath::FilterMapSetting],
    ) -> Result<(), DataplaneError> {
        self.cluster_keep_filter_settings(settings);
        Ok(())
    }

    /// See [`Cluster::cluster_filter_report`].
    fn filter_report(&self, tenant: Option<&ids::TenantId>) -> datapath::FilterReport {
        self.cluster_filter_report(tenant)
    }

    /// See [`Cluster::cluster_filter_map`].
    fn filter_map(
        &self,
        tenant: &ids::TenantId,
        map: &str,
        op: datapath::FilterMapOp,
    ) -> Result<datapath::FilterMapAnswer, DataplaneError> {
        self.cluster_filter_map(tenant, map, op)
    }

    fn stats(&self) -> DataplaneStats {
        let sh = self.state();
        let mut drops: BTreeMap<String, u64> = BTreeMap::new();
        for n in sh.core.nodes().values() {
            if let Some(r) = &n.last_report {
                for (reason, count) in &r.drops {
                    *drops.entry(format!("{}:{reason}", n.name)).or_default() += count;
                }
            }
        }
        drop(sh);
        for (reason, count) in self.ike.drops() {
            drops.insert(format!("ike_relay:{reason}"), count);
        }
        let tunnels = (self.traffic.lock().unwrap_or_else(PoisonError::into_inner))
            .iter()
            .map(|(t, v)| (*t, *v))
            .collect();
        DataplaneStats {
            drops: drops.into_iter().collect(),
            tenants: self.cluster_tenant_stats(),
            tunnels,
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

#[path = "manager_attach.rs"]
mod attach;

#[path = "manager_autoscale.rs"]
mod autoscale;

#[path = "manager_carry.rs"]
mod carry;

#[path = "manager_convert.rs"]
mod convert;

#[path = "manager_filters.rs"]
mod filters;
pub use filters::FilterUsage;

#[path = "manager_routes.rs"]
mod routes;
pub use routes::CHUNK_LEN;

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
