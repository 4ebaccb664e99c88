//! `protego control`: a control node of the distributed form. It runs the same IKE control
//! loop as `protego up`, from the same configuration file, with the [`Cluster`] as its data
//! path: CHILD_SAs go to data nodes over gRPC, IKE goes through the steer nodes.
//!
//! Start-up: configuration (with `[cluster]`), TLS files, store, the IKE relay socket, the
//! gRPC server; then the control loop, after the first data and steer nodes registered (or
//! after [`STARTUP_WAIT`], so a cluster that starts in any order converges: CHILD_SAs that
//! find no data node move to the first one that registers). Then the control socket, with
//! `nodes`, `migrate`, `drain` and `undrain` added to the commands of `protego up` (whose
//! `filter` commands reach every data node through the [`Cluster`]).

use crate::data_node::NodeError;
use crate::election::{Election, ElectionOptions, Role};
use crate::ike_relay::IkeRelay;
use crate::manager::{Cluster, ClusterError, Settings, Task, TunnelMeta};
use crate::peers::Peers;
use crate::service::ControlService;
use control::config::StoreConfig;
use control::status::{Request, RequestHandler, TunnelDirectory};
use control::{Config, ControlHandle, ControlPlane, Responder, StatusServer};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use dataplane::{DataPath, Inside};
use rpc::certs::NodeRole;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{debug, error, info, warn};

/// How long the control loop waits for the first data and steer nodes.
pub const STARTUP_WAIT: Duration = Duration::from_secs(10);
/// Messages queued for the control loop before IKE datagrams are dropped.
const CONTROL_QUEUE: usize = 8192;
/// How long the registered nodes must stay the same before the control loop starts.
const SETTLE: Duration = Duration::from_millis(150);
/// Period of the cluster's housekeeping.
const TICK: Duration = Duration::from_millis(100);
/// How long `migrate` and `drain` wait for their moves.
const MOVE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why `protego control` could not start.
#[derive(Debug, thiserror::Error)]
pub enum ControlNodeError {
    /// No `[cluster]` section.
    #[error("{0}: `protego control` needs a [cluster] section (see docs/operations.md)")]
    NoCluster(std::path::PathBuf),
    /// TLS, identity, sockets.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// Store, control loop, status socket.
    #[error(transparent)]
    Control(#[from] control::Error),
    /// The store could not be opened.
    #[error("cannot open the state store: {0}")]
    Store(#[from] control::store::StoreError),
    /// The leader election through etcd.
    #[error("leader election: {0}")]
    Election(#[from] crate::election::ElectionError),
    /// Stopped by a signal while standing by.
    #[error("stopped while standing by")]
    Cancelled,
    /// `[metrics] listen` could not be served.
    #[error(transparent)]
    Metrics(#[from] metrics::MetricsError),
    /// `[api] listen` could not be served.
    #[error(transparent)]
    Api(#[from] api::ApiError),
    /// The gRPC server.
    #[error("gRPC server on {addr}: {reason}")]
    Grpc {
        /// Its address.
        addr: std::net::SocketAddr,
        /// Why.
        reason: String,
    },
}

/// With the etcd store, control nodes elect the active one through an etcd lease
/// (`crate::election`): blocks until this node is the leader, or `cancel` yields (a signal).
/// Returns `None` without etcd (one control node, nothing to elect).
pub fn elect(config: &Config, cancel: &Receiver<()>) -> Result<Option<Election>, ControlNodeError> {
    let StoreConfig::Etcd(etcd) = &config.store else {
        return Ok(None);
    };
    let cc = config
        .cluster
        .as_ref()
        .ok_or_else(|| ControlNodeError::NoCluster(config.path.clone()))?;
    let mut options =
        ElectionOptions::new(etcd.endpoints.clone(), etcd.prefix.clone(), cc.name.clone());
    options.ttl = cc.lease;
    options.connect_timeout = etcd.connect_timeout;
    options.access = etcd.access.clone();
    let election = Election::start(&options)?;
    // Where the other control nodes can probe this one, and how this one finds the leader.
    let peers = match Peers::connect(etcd) {
        Ok(p) => {
            if let Err(e) = p.publish(&cc.name, cc.grpc) {
                warn!(error = %e, "cannot publish this control node's address; a standby will wait for the lease to expire");
            }
            Some(p)
        }
        Err(e) => {
            warn!(error = %e, "cannot reach etcd for the leader probe; takeover waits for the lease to expire");
            None
        }
    };
    let mut watchdog = LeaderWatchdog::default();
    let mut announced = false;
    while !election.is_leader() {
        if !announced {
            info!(node = %cc.name, "standing by: another control node is active");
            announced = true;
        }
        crossbeam_channel::select! {
            recv(election.changes()) -> _ => {}
            recv(cancel) -> _ => return Err(ControlNodeError::Cancelled),
            default(LEADER_PROBE) => {}
        }
        if let (
            Some(peers),
            Role::Standby {
                leader: Some(leader),
            },
        ) = (&peers, election.role())
        {
            if leader != cc.name {
                watchdog.probe(peers, &leader);
            }
        }
    }
    info!(node = %cc.name, term = ?election.fence().map(|f| f.term.revision()), "elected: this control node is now active");
    Ok(Some(election))
}

/// How often a standby probes the leader's gRPC port.
const LEADER_PROBE: Duration = Duration::from_millis(100);
/// Probes in a row the leader may miss before a standby revokes its lease.
const LEADER_MISSES: u32 = 3;
/// A new leader is not probed before it has led this long (it opens its gRPC port only after
/// its store and sockets).
const LEADER_GRACE: Duration = Duration::from_secs(3);
/// After revoking a leader's lease, a standby does not revoke again for this long (a
/// standby that cannot reach the leaders while etcd can would otherwise depose them in
/// turn).
const REVOKE_HOLD_DOWN: Duration = Duration::from_secs(30);

/// A standby's watch on the leader: a TCP connection to its published gRPC address every
/// [`LEADER_PROBE`]; after [`LEADER_MISSES`] refused or timed-out connections in a row, the
/// leader's lease is revoked so the election does not wait for it to expire
/// (`crate::peers`).
#[derive(Default)]
struct LeaderWatchdog {
    leader: String,
    since: Option<Instant>,
    address: Option<std::net::SocketAddr>,
    misses: u32,
    revoked_at: Option<Instant>,
}

impl LeaderWatchdog {
    fn probe(&mut self, peers: &Peers, leader: &str) {
        let now = Instant::now();
        if self.leader != leader {
            self.leader = leader.to_owned();
            self.since = Some(now);
            self.misses = 0;
            self.address = None;
        }
        if self
            .since
            .is_some_and(|t| now.duration_since(t) < LEADER_GRACE)
            || self
                .revoked_at
                .is_some_and(|t| now.duration_since(t) < REVOKE_HOLD_DOWN)
        {
            return;
        }
        if self.address.is_none() {
            self.address = match peers.address(leader) {
                Ok(a) => a,
                Err(e) => {
                    debug!(error = %e, "cannot read the leader's address");
                    None
                }
            };
        }
        let Some(address) = self.address else {
            return;
        };
        if std::net::TcpStream::connect_timeout(&address, LEADER_PROBE).is_ok() {
            self.misses = 0;
            return;
        }
        self.misses += 1;
        if self.misses < LEADER_MISSES {
            return;
        }
        self.misses = 0;
        match peers.revoke_leader(leader) {
            Ok(true) => {
                warn!(leader, %address, misses = LEADER_MISSES, "the active control node does not answer; its lease is revoked")
            }
            Ok(false) => {}
            Err(e) => {
                warn!(leader, error = %e, "cannot revoke the silent leader's lease; waiting for it to expire")
            }
        }
    }
}

/// A running control node.
pub struct ControlNode {
    election: Option<Election>,
    cluster: Arc<Cluster>,
    control: Option<ControlPlane>,
    server: Option<StatusServer>,
    /// `[metrics] listen`.
    metrics: Option<metrics::MetricsServer>,
    /// `[api] listen`.
    api: Option<api::ApiServer>,
    runtime: Option<tokio::runtime::Runtime>,
    stop: Arc<AtomicBool>,
    /// Stops the autoscaler first at shutdown: a node handing over must not start or stop
    /// data nodes while the next active node's provider adopts them.
    autoscaling: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl ControlNode {
    /// Starts every part (see the module documentation); `election` is this node's won
    /// election ([`elect`]), if the control nodes elect one.
    ///
    /// The tenants, VNets and tunnels last applied with `protego ctl apply` (kept in the store)
    /// replace the file's, unless `discard_applied` (see [`control::applied::effective`]).
    pub fn start(
        config: &Config,
        election: Option<Election>,
        discard_applied: bool,
    ) -> Result<Self, ControlNodeError> {
        let cc = config
            .cluster
            .clone()
            .ok_or_else(|| ControlNodeError::NoCluster(config.path.clone()))?;
        let tls = rpc::certs::load_tls(&cc.ca, &cc.cert, &cc.key).map_err(NodeError::Tls)?;
        if tls.name() != cc.name || tls.role() != NodeRole::Control {
            return Err(NodeError::Identity {
                cert_name: tls.name().to_owned(),
                cert_role: tls.role(),
                name: cc.name.clone(),
                role: NodeRole::Control,
            }
            .into());
        }
        // An elected node's commits are fenced by its term: once deposed, it writes nothing.
        let store: Box<dyn control::store::Store> =
            match (&config.store, election.as_ref().and_then(Election::fence)) {
                (StoreConfig::Etcd(options), Some(fence)) => {
                    Box::new(control::store::EtcdStore::connect(options)?.fenced(fence))
                }
                _ => config.store.open()?,
            };
        // Records are sealed with `[store] encryption_key_file`'s key, read now: a standby
        // that takes over reads the key file as it is then.
        let mut store: Box<dyn control::store::Store> = Box::new(
            control::store::SealedStore::open(store, &config.store_encryption)?,
        );
        let (mut config, _) =
            control::applied::effective(config.clone(), &mut *store, discard_applied)?;
        // The filters loaded with `protego ctl filter`, if any, in place of the file's.
        let settings = control::filters::effective(&mut config, &mut *store, discard_applied)?;
        let config = &config;
        let (to_control, from_nodes) = crossbeam_channel::bounded(CONTROL_QUEUE);
        let ike = IkeRelay::bind(
            cc.geneve,
            config.gateway.ike_port,
            config.gateway.natt_port,
            to_control.clone(),
        )
        .map_err(NodeError::Dataplane)?;
        let (tasks_tx, tasks_rx) = crossbeam_channel::unbounded();
        // Only act mode starts and stops nodes. A provider that cannot run must not keep a
        // standby from taking over: the autoscaler then says no provider is configured.
        let provider: Option<Arc<dyn crate::provider::NodeProvider>> =
            match (&cc.autoscale.local, cc.autoscale.mode) {
                (Some(local), control::config::AutoscaleMode::Act) => {
                    match crate::provider::LocalProvider::new(local) {
                        Ok(p) => Some(Arc::new(p)),
                        Err(e) => {
                            error!(error = %e, "node provider disabled: [cluster.autoscale.local]");
                            None
                        }
                    }
                }
                _ => None,
            };
        let cluster = Cluster::new(
            Settings {
                name: cc.name.clone(),
                directive_timeout: cc.directive_timeout,
                report_interval: cc.report_interval,
                geneve: cc.geneve,
                node_capacity_mbit: cc.node_capacity_mbit,
                autoscale: cc.autoscale.clone(),
                dispatch: cc.dispatch.clone(),
            },
            tunnel_meta(config),
            rpc::convert::data_config_to_pb(&config.dataplane.vnets, &config.dataplane.tunnels),
            ike,
            tasks_tx,
            to_control,
        );
        let cluster = Arc::new(match provider {
            Some(p) => cluster.with_provider(p),
            None => cluster,
        });
        // The tenants' CPU fairness and filters, before any data node registers: each gets
        // them right after its inside configuration, before a CHILD_SA is placed on it.
        cluster
            .set_cpu_fairness(&config.cpu_fairness())
            .map_err(NodeError::Dataplane)?;
        cluster
            .set_filters(&config.filters)
            .map_err(NodeError::Dataplane)?;
        // The tenants' map settings, written into each data node after its filter set.
        cluster
            .keep_filter_settings(&settings)
            .map_err(NodeError::Dataplane)?;
        // Customer attachments on steer nodes' ports (fixed until a restart, as in the
        // embedded form): placed once the steer nodes announce their ports.
        cluster.set_attachments(&config.dataplane.attachments, &cc.attachment_steers);
        // The per-VM routes' master table, restored before any node registers (each data
        // node's version is compared with it) and before IKE starts.
        let routes = route_store(config, election.as_ref())?;
        if let Some(store) = &routes {
            cluster
                .set_route_vnets(&config.dataplane.vnets)
                .map_err(NodeError::Dataplane)?;
            let r = store.restore(&*cluster)?;
            info!(store = %store.path().display(), snapshot = r.snapshot, journal = r.journal, skipped = r.skipped, ignored = r.ignored, version = %cluster.routes_version(), "per-VM routes restored");
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("protego-control-grpc")
            .enable_all()
            .build()
            .map_err(NodeError::Start)?;
        let stop = Arc::new(AtomicBool::new(false));
        let term = election
            .as_ref()
            .and_then(Election::fence)
            .map_or(0, |f| f.term.revision().max(0) as u64);
        let service = ControlService::new(Arc::clone(&cluster), term);
        {
            let stop = Arc::clone(&stop);
            let shutdown = async move {
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            };
            let listener = runtime
                .block_on(tokio::net::TcpListener::bind(cc.grpc))
                .map_err(|e| ControlNodeError::Grpc {
                    addr: cc.grpc,
                    reason: e.to_string(),
                })?;
            runtime.spawn(async move {
                if let Err(e) = rpc::serve_on(listener, &tls, service, shutdown).await {
                    error!(error = %e, "gRPC server stopped");
                }
            });
        }
        info!(grpc = %cc.grpc, geneve = %cc.geneve, "waiting for data and steer nodes");
        // Until a data and a steer node registered, and then until no new node came for a
        // moment: every node's CHILD_SAs should be adopted before the IKE SAs are restored.
        let deadline = Instant::now() + STARTUP_WAIT;
        let mut last = (0, 0);
        let mut settled_at = Instant::now() + SETTLE;
        while Instant::now() < deadline {
            let now = (cluster.live_data_nodes().len(), cluster.steer_addrs().len());
            if now != last {
                last = now;
                settled_at = Instant::now() + SETTLE;
            }
            if now.0 > 0 && now.1 > 0 && Instant::now() >= settled_at {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if cluster.live_data_nodes().is_empty() || cluster.steer_addrs().is_empty() {
            warn!(
                data = cluster.live_data_nodes().len(),
                steer = cluster.steer_addrs().len(),
                "starting the control loop before a data and a steer node registered; tunnels come up when they do"
            );
        }
        let datapath: Arc<dyn DataPath> = cluster.clone();
        let control = ControlPlane::start(config, Arc::clone(&datapath), from_nodes, store)?;
        let mut threads = Vec::new();
        {
            let handle = control.handle();
            let stop = Arc::clone(&stop);
            let datapath = Arc::clone(&datapath);
            threads.push(
                std::thread::Builder::new()
                    .name("protego-cluster-tasks".into())
                    .spawn(move || run_tasks(&tasks_rx, &handle, &*datapath, &stop))
                    .map_err(NodeError::Start)?,
            );
        }
        {
            let cluster = Arc::clone(&cluster);
            let stop = Arc::clone(&stop);
            threads.push(
                std::thread::Builder::new()
                    .name("protego-cluster-tick".into())
                    .spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            std::thread::sleep(TICK);
                            cluster.tick(Instant::now());
                        }
                    })
                    .map_err(NodeError::Start)?,
            );
        }
        let autoscaling = Arc::new(AtomicBool::new(true));
        {
            // The model's step takes up to a few hundred milliseconds on large clusters, and
            // a provider may be slow to answer: not in the tick thread.
            let cluster = Arc::clone(&cluster);
            let run = Arc::clone(&autoscaling);
            threads.push(
                std::thread::Builder::new()
                    .name("protego-autoscaler".into())
                    .spawn(move || {
                        while run.load(Ordering::Relaxed) {
                            std::thread::sleep(TICK);
                            if run.load(Ordering::Relaxed) {
                                cluster.autoscale(Instant::now());
                            }
                        }
                    })
                    .map_err(NodeError::Start)?,
            );
        }
        let mut inner = Responder::new(
            control.handle(),
            datapath,
            TunnelDirectory::from_config(config),
        );
        if let Some(store) = routes {
            inner = inner.with_routes(store);
        }
        let responder = Arc::new(ClusterResponder {
            inner,
            cluster: Arc::clone(&cluster),
        });
        let server = StatusServer::start(
            &config.gateway.control_socket,
            Arc::clone(&responder) as Arc<dyn RequestHandler>,
        )?;
        let metrics = match config.metrics {
            Some(m) => Some(metrics::MetricsServer::start(
                m.listen,
                &cc.name,
                Arc::clone(&responder) as _,
            )?),
            None => None,
        };
        let api = match &config.api {
            Some(a) => Some(api::ApiServer::start(config, a, &cc.name, responder)?),
            None => None,
        };
        info!(
            config = %config.path.display(),
            tunnels = config.tunnels.len(),
            socket = %server.path().display(),
            "protego control is up"
        );
        Ok(Self {
            election,
            cluster,
            control: Some(control),
            server: Some(server),
            metrics,
            api,
            runtime: Some(runtime),
            stop,
            autoscaling,
            threads,
        })
    }

    /// The cluster state.
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// A handle on the control loop.
    pub fn handle(&self) -> Option<ControlHandle> {
        self.control.as_ref().map(ControlPlane::handle)
    }

    /// True while the control loop runs and, with an election, this node is still the
    /// leader (a deposed leader must stop: another node acts on the same IKE SAs).
    pub fn is_running(&self) -> bool {
        let leader = self.election.as_ref().is_none_or(|e| {
            let leading = e.is_leader();
            if !leading {
                error!("this control node lost the leadership; stopping");
            }
            leading
        });
        leader && self.control.as_ref().is_some_and(ControlPlane::is_running)
    }

    /// Stops: the control socket, the control loop, the sessions. With an election the IKE
    /// SAs stay in the store and the leadership is given back, so a standby takes over
    /// without the peers noticing; a single control node deletes its IKE SAs (as
    /// `protego up`), waiting at most `grace` for the peers' answers.
    pub fn shutdown(mut self, grace: Duration) {
        self.autoscaling.store(false, Ordering::Relaxed);
        drop(self.api.take());
        drop(self.metrics.take());
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
        if let Some(c) = self.control.take() {
            if self.election.is_some() {
                c.hand_over();
                info!("IKE SAs left in the store for the next active control node");
            } else if let Err(e) = c.shutdown(grace) {
                warn!(error = %e, "control loop did not stop cleanly");
            }
        }
        if let Some(e) = self.election.take() {
            match e.resign() {
                Ok(()) => info!("leadership given back"),
                Err(e) => {
                    warn!(error = %e, "cannot give the leadership back; a standby takes over when the lease ends")
                }
            }
        }
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// The store of the per-VM routes: files beside a file store, records under an etcd store's
/// prefix (on a connection of its own, fenced by the leader's term like the state store);
/// none for a memory store (routes then live until the control node stops).
fn route_store(
    config: &Config,
    election: Option<&Election>,
) -> Result<Option<Arc<control::routes::RouteStore>>, ControlNodeError> {
    match &config.store {
        StoreConfig::File { path } => Ok(Some(Arc::new(control::routes::RouteStore::beside(path)))),
        StoreConfig::Etcd(options) => {
            let mut store = control::store::EtcdStore::connect(options)?;
            if let Some(fence) = election.and_then(Election::fence) {
                store = store.fenced(fence);
            }
            let medium = control::store::EtcdMedium::new(store, &config.store_encryption)?;
            Ok(Some(Arc::new(control::routes::RouteStore::new(Box::new(
                medium,
            )))))
        }
        StoreConfig::Memory => Ok(None),
    }
}

/// What control knows of each tunnel for steering.
fn tunnel_meta(config: &Config) -> Vec<TunnelMeta> {
    config
        .tunnels
        .iter()
        .map(|t| {
            let vni = config
                .dataplane
                .tunnels
                .iter()
                .find(|b| b.tunnel == t.peer.id)
                .and_then(|b| match b.inside {
                    Inside::Vnet(i) => config.dataplane.vnets.get(i).map(|v| v.vni),
                    Inside::Tun => None,
                });
            TunnelMeta {
                id: t.peer.id,
                name: t.peer.name.clone(),
                vni,
                rate_limit_mbit: t.rate_limit_mbit,
            }
        })
        .collect()
}

/// Carries out the rekeys moves need, one tunnel at a time (each is one CREATE_CHILD_SA), and
/// the CHILD_SAs to add and delete; an add the control loop cannot start counts as refused
/// (`datapath`: asked for again after the retry interval).
fn run_tasks(
    tasks: &Receiver<Task>,
    control: &ControlHandle,
    datapath: &dyn DataPath,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Relaxed) {
        match tasks.recv_timeout(Duration::from_millis(200)) {
            Ok(Task::Rekey(tunnels, why)) => {
                for t in tunnels {
                    match control.rekey_child(t) {
                        Ok(()) => info!(
                            tunnel = t.0,
                            why, "CHILD_SA rekey started to move the tunnel"
                        ),
                        Err(e) => {
                            error!(tunnel = t.0, why, error = %e, "cannot start the rekey that moves the tunnel")
                        }
                    }
                }
            }
            Ok(Task::AddChildren(tunnels)) => {
                for t in tunnels {
                    if let Err(e) = control.add_child(t) {
                        warn!(tunnel = t.0, error = %e, "cannot ask for a CHILD_SA for another data node");
                        datapath.child_refused(t, false);
                    }
                }
            }
            Ok(Task::DeleteChildren(children)) => {
                for (t, spi) in children {
                    match control.delete_child(t, spi) {
                        Ok(()) => {
                            info!(tunnel = t.0, spi_in = %spi, "deleting the CHILD_SA of a lost data node")
                        }
                        Err(e) => {
                            warn!(tunnel = t.0, spi_in = %spi, error = %e, "cannot delete the CHILD_SA of a lost data node")
                        }
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// The control socket of a control node: the commands of `protego up`, plus the cluster's.
struct ClusterResponder {
    inner: Responder,
    cluster: Arc<Cluster>,
}

/// `[metrics] listen` on a control node: the gateway's families (tunnels, IKE, store) and
/// the cluster's (nodes, autoscaler).
impl metrics::Source for ClusterResponder {
    fn collect(&self, out: &mut metrics::Families<'_, '_>) -> Result<(), metrics::Collect> {
        let (status, autoscaler) = self.cluster.metrics_view();
        crate::metrics::write_cluster(out, &status, autoscaler.as_ref())?;
        self.inner.collect(out)
    }
}

fn cluster_error(e: ClusterError) -> Value {
    let kind = match e {
        ClusterError::UnknownTunnel(_)
        | ClusterError::UnknownAttachment(_)
        | ClusterError::UnknownNode(_) => control::status::ErrorKind::NotFound,
        ClusterError::NoControl => control::status::ErrorKind::Unavailable,
        _ => control::status::ErrorKind::Refused,
    };
    json!({ "error": e.to_string(), "kind": kind })
}

impl RequestHandler for ClusterResponder {
    fn status_report(&self) -> Result<control::status::StatusReport, Value> {
        self.inner.status_report()
    }

    fn tunnel_status(&self, name: &str) -> Result<Option<control::status::TunnelStatus>, Value> {
        RequestHandler::tunnel_status(&self.inner, name)
    }

    fn tunnel_traffic(
        &self,
    ) -> Result<Vec<(String, ids::TenantId, datapath::TunnelTraffic)>, Value> {
        RequestHandler::tunnel_traffic(&self.inner)
    }

    fn handle(&self, request: Request) -> Value {
        match request {
            Request::Nodes => self.cluster.describe(),
            Request::Capacity => self.cluster.capacity(),
            Request::Dispatch => self.cluster.dispatch_show(),
            Request::Migrate { tunnel, to } if self.cluster.is_attachment(&tunnel) => {
                let started = Instant::now();
                match self.cluster.migrate_attachment(&tunnel, &to) {
                    Ok(_) => json!({
                        "ok": true,
                        "attachment": tunnel,
                        "node": to,
                        "ms": started.elapsed().as_millis() as u64,
                    }),
                    Err(e) => cluster_error(e),
                }
            }
            Request::Migrate { tunnel, to } => {
                let started = Instant::now();
                match self
                    .cluster
                    .migrate(&tunnel, &to)
                    .and_then(|m| self.cluster.wait_moved(&[m], MOVE_TIMEOUT))
                {
                    Ok(()) => json!({
                        "ok": true,
                        "tunnel": tunnel,
                        "node": to,
                        "ms": started.elapsed().as_millis() as u64,
                    }),
                    Err(e) => cluster_error(e),
                }
            }
            Request::Drain { node } => {
                let started = Instant::now();
                let attachments = self.cluster.attachments_served_by(&node);
                match self.cluster.drain(&node).and_then(|moves| {
                    self.cluster
                        .wait_moved(&moves, MOVE_TIMEOUT)
                        .map(|()| moves)
                }) {
                    Ok(moves) => json!({
                        "ok": true,
                        "node": node,
                        "moved": moves.len(),
                        "attachments_moved": attachments,
                        "ms": started.elapsed().as_millis() as u64,
                    }),
                    Err(e) => cluster_error(e),
                }
            }
            Request::Undrain { node } => match self.cluster.undrain(&node) {
                Ok(()) => json!({ "ok": true, "node": node }),
                Err(e) => cluster_error(e),
            },
            Request::Apply {
                file,
                text,
                dry_run,
            } => {
                let limits = |outcome: &control::ApplyOutcome| {
                    self.cluster.set_rate_limits(
                        &outcome
                            .config
                            .tunnels
                            .iter()
                            .map(|t| (t.peer.id, t.rate_limit_mbit))
                            .collect(),
                    )
                };
                match self.inner.apply(file, text, dry_run, limits) {
                    Ok(outcome) => control::status::apply_answer(&outcome, dry_run),
                    Err(e) => control::status::error_answer(&e),
                }
            }
            other => self.inner.handle(other),
        }
    }
}
