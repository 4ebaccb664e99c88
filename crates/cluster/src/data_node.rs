//! `protego data`: a data node. It runs the data plane in relay mode behind the steer nodes
//! and applies the control node's directives to it: the inside configuration (VNets and
//! tunnel bindings), CHILD_SAs, peer address moves, the steer nodes' addresses, and the
//! customer attachments on steer nodes' ports with their CEs' MACs (issue 16: every data node
//! holds every attachment; the steer nodes choose which one serves it). It reports
//! its load every interval and passes the data plane's requests (rekey near sequence number
//! exhaustion, NAT rebinding) and what it learned (a CE's MAC) up.
//!
//! The data plane starts before the first session and keeps forwarding when the session
//! breaks, so a control node's restart or failover does not stop ESP.

use crate::agent::{Agent, Applier};
use crate::link::Answer;
use crate::node_config::{ControlEndpoint, DataSection, NodeConfig};
use crate::route_follow::RouteFollower;
use dataplane::{DataPath, Dataplane, DataplaneConfig, DataplaneStats, RelayConfig, ToControl};
use rpc::certs::{NodeRole, NodeTls};
use rpc::pb;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Messages the data plane may queue for the agent.
const EVENT_QUEUE: usize = 4096;

/// Why a data node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The file lacks the role's section.
    #[error("{path}: a {role} node needs a [{role}] section")]
    MissingSection {
        /// The file.
        path: std::path::PathBuf,
        /// The role.
        role: &'static str,
    },
    /// TLS files.
    #[error("TLS: {0}")]
    Tls(#[from] rpc::certs::CertError),
    /// The certificate is for another node or role.
    #[error("the certificate is for {cert_name:?} ({cert_role}), not {name:?} ({role})")]
    Identity {
        /// From the certificate.
        cert_name: String,
        /// From the certificate.
        cert_role: NodeRole,
        /// From the file.
        name: String,
        /// The role being started.
        role: NodeRole,
    },
    /// The data plane.
    #[error("data plane: {0}")]
    Dataplane(#[from] dataplane::DataplaneError),
    /// The steer forwarder.
    #[error("steer forwarder: {0}")]
    Steer(String),
    /// Runtime or threads.
    #[error("cannot start: {0}")]
    Start(std::io::Error),
    /// `[metrics] listen` could not be served.
    #[error(transparent)]
    Metrics(#[from] metrics::MetricsError),
}

/// Loads and checks the node's TLS material against its name and role.
pub fn load_node_tls(config: &NodeConfig, role: NodeRole) -> Result<NodeTls, NodeError> {
    let n = &config.node;
    let tls = rpc::certs::load_tls(&n.ca, &n.cert, &n.key)?;
    if tls.name() != n.name || tls.role() != role {
        return Err(NodeError::Identity {
            cert_name: tls.name().to_owned(),
            cert_role: tls.role(),
            name: n.name.clone(),
            role,
        });
    }
    Ok(tls)
}

/// A process-unique boot id: a new one means the node's tables are empty.
pub(crate) fn boot_id() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 32)
}

/// Counters at the last report.
#[derive(Default)]
struct LastReport {
    at: Option<Instant>,
    busy_ns: u64,
    tunnels: HashMap<u32, (u64, u64, u64, u64)>,
}

/// The data node's directive handler.
struct DataApplier {
    name: String,
    geneve: SocketAddr,
    data: DataSection,
    dp: Arc<Dataplane>,
    boot_id: u64,
    last: Mutex<LastReport>,
    routes: Arc<RouteSide>,
    /// The tenant filters' objects the node holds.
    filter_objects: filters::FilterObjects,
}

/// Where the data node fetches the route snapshot from.
struct Fetcher {
    tls: Arc<NodeTls>,
    endpoints: Vec<ControlEndpoint>,
}

/// The data node's per-VM routes: the follower, and the thread fetching the snapshot.
struct RouteSide {
    dp: Arc<dyn dataplane::DataPath>,
    follower: Mutex<RouteFollower>,
    /// None: no fetching (tests).
    fetcher: Option<Fetcher>,
    /// The control node of the session (tried first).
    control: Mutex<Option<String>>,
    /// A fetch thread runs.
    running: AtomicBool,
    stop: AtomicBool,
}

/// Longest wait between fetch attempts.
const FETCH_RETRY: Duration = Duration::from_secs(1);
/// How long connecting for a fetch may take.
const FETCH_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

impl RouteSide {
    fn follower(&self) -> std::sync::MutexGuard<'_, RouteFollower> {
        // Every step leaves the follower consistent before anything can panic.
        self.follower.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn version(&self) -> routebook::RouteVersion {
        self.follower().version()
    }

    /// Starts the fetch thread if the follower needs a fetch and none runs.
    fn kick(self: &Arc<Self>) {
        if self.fetcher.is_none()
            || !self.follower().fetching()
            || self.running.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let side = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("protego-route-fetch".into())
            .spawn(move || {
                side.fetch_loop();
                side.running.store(false, Ordering::SeqCst);
                // A fetch asked for while this one was finishing.
                side.kick();
            });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start the route fetch thread");
            self.running.store(false, Ordering::SeqCst);
        }
    }

    /// Fetches and restores until the follower is current with what control announced.
    fn fetch_loop(&self) {
        while self.follower().fetching() && !self.stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let from = self.version();
            match self.fetch_once(from) {
                Ok((at, bytes)) => {
                    let size = bytes.len();
                    // The table is replaced without the follower locked: the session keeps
                    // (and answers) the changes that come meanwhile.
                    let restored = RouteFollower::replace_table(&*self.dp, at, bytes)
                        .and_then(|()| self.follower().restored_after(&*self.dp, at));
                    match restored {
                        Ok(()) => {
                            info!(from = %from, to = %at, bytes = size, ms = started.elapsed().as_millis() as u64, "per-VM routes fetched and restored")
                        }
                        Err(e) => {
                            // Not at once again: a snapshot this node refuses would be fetched
                            // back to back.
                            warn!(error = %e, "fetched routes not restored; retrying");
                            std::thread::sleep(FETCH_RETRY);
                        }
                    }
                }
                Err(e) => {
                    warn!(error = %e, "route snapshot not fetched; retrying");
                    std::thread::sleep(FETCH_RETRY);
                }
            }
        }
    }

    /// One fetch of the snapshot from the control node of the session (or any other).
    fn fetch_once(
        &self,
        from: routebook::RouteVersion,
    ) -> Result<(routebook::RouteVersion, Arc<[u8]>), String> {
        let Some(fetcher) = &self.fetcher else {
            return Err("no control node to fetch from".into());
        };
        let control = self
            .control
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut endpoints: Vec<&ControlEndpoint> = fetcher.endpoints.iter().collect();
        endpoints.sort_by_key(|e| Some(&e.name) != control.as_ref());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("runtime: {e}"))?;
        runtime.block_on(async {
            let mut errors = Vec::new();
            for ep in endpoints {
                match fetch_from(ep, &fetcher.tls, from).await {
                    Ok(r) => return Ok(r),
                    Err(e) => errors.push(format!("{}: {e}", ep.name)),
                }
            }
            Err(errors.join("; "))
        })
    }
}

/// The largest route snapshot a data node takes (16 M IPv6 entries are about 500 MiB).
const MAX_SNAPSHOT_BYTES: usize = 4 << 30;

/// Fetches the route snapshot from control node `ep` (the chunks in order, one version).
async fn fetch_from(
    ep: &ControlEndpoint,
    tls: &NodeTls,
    from: routebook::RouteVersion,
) -> Result<(routebook::RouteVersion, Arc<[u8]>), String> {
    let url = format!("https://{}", ep.address);
    let mut client = rpc::connect(&url, tls, &ep.name, FETCH_CONNECT_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    let mut stream = client
        .fetch_routes(pb::RoutesRequest {
            epoch: from.epoch,
            seq: from.seq,
        })
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    let mut bytes = Vec::new();
    let mut at = None;
    while let Some(chunk) = stream
        .message()
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
    {
        let v = routebook::RouteVersion {
            epoch: chunk.epoch,
            seq: chunk.seq,
        };
        if *at.get_or_insert(v) != v {
            return Err(format!(
                "a chunk of version {v} inside the snapshot of {}",
                at.unwrap_or(v)
            ));
        }
        // About 200 MiB at 16 M entries; far more is no snapshot of ours.
        if bytes.len().saturating_add(chunk.bytes.len()) > MAX_SNAPSHOT_BYTES {
            return Err(format!(
                "the route snapshot exceeds {} MiB",
                MAX_SNAPSHOT_BYTES >> 20
            ));
        }
        bytes.extend_from_slice(&chunk.bytes);
        if chunk.last {
            return Ok((v, Arc::from(bytes)));
        }
    }
    Err("the snapshot ended before its last chunk".into())
}

impl Applier for DataApplier {
    fn hello(&self) -> pb::Hello {
        let stats = self.dp.stats();
        let routes = self.routes.version();
        pb::Hello {
            name: self.name.clone(),
            role: pb::Role::Data as i32,
            geneve: self.geneve.to_string(),
            workers: stats.workers.len() as u32,
            boot_id: self.boot_id,
            installed_spis: stats.children.iter().map(|c| c.inbound_spi.0).collect(),
            installed: self
                .dp
                .installed()
                .iter()
                .map(rpc::convert::installed_to_pb)
                .collect(),
            ports: Vec::new(),
            ce_macs: self
                .dp
                .ce_macs()
                .into_iter()
                .map(|(attachment, mac)| rpc::convert::ce_mac_to_pb(&attachment, mac))
                .collect(),
            routes_epoch: routes.epoch,
            routes_seq: routes.seq,
            // Only a node whose VTEP receives can take part in self-dispatch.
            vtep: if self.dp.vteps_receive() {
                self.data.vtep.to_string()
            } else {
                String::new()
            },
        }
    }

    fn welcomed(&self, welcome: &pb::Welcome) {
        *self
            .routes
            .control
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(welcome.control_name.clone());
    }

    fn apply(&self, op: pb::directive::Op) -> Result<Answer, String> {
        match op {
            pb::directive::Op::RouteChanges(c) => self.route_changes(&c),
            pb::directive::Op::FilterMap(r) => self.filter_map(r),
            op => self.apply_op(op).map(|()| Answer::Applied),
        }
    }

    fn report(&self) -> pb::Report {
        let stats = self.dp.stats();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let routes = self.routes.version();
        let mut report = pb::Report {
            routes_epoch: routes.epoch,
            routes_seq: routes.seq,
            ..build_report(&stats, &mut last, Instant::now())
        };
        self.filter_report(&stats, &mut report);
        report.vmac_packets = stats
            .dispatch
            .iter()
            .flat_map(|d| d.vmac_packets.iter())
            .map(|&(vni, vmac, packets)| pb::VmacPackets {
                vni,
                vmac: u32::from(vmac),
                packets,
            })
            .collect();
        report
    }
}

impl DataApplier {
    /// Route changes: applied, or kept while the node fetches the snapshot (and answered so).
    fn route_changes(&self, c: &pb::RouteChanges) -> Result<Answer, String> {
        let changes = rpc::convert::route_changes_from_pb(c)
            .map_err(|e| e.context("route_changes").to_string())?;
        let result =
            self.routes
                .follower()
                .changes(&*self.routes.dp, c.epoch, c.first_seq, changes);
        self.routes.kick();
        result
    }

    /// Applies one directive but route changes; `Err` names why nothing changed.
    fn apply_op(&self, op: pb::directive::Op) -> Result<(), String> {
        use pb::directive::Op;
        match op {
            Op::DataConfig(c) => {
                let (vnets, tunnels) = rpc::convert::data_config_from_pb(&c, self.data.vtep)
                    .map_err(|e| e.to_string())?;
                let n = (vnets.len(), tunnels.len());
                self.dp
                    .set_inside(vnets, tunnels)
                    .map_err(|e| e.to_string())?;
                info!(vnets = n.0, tunnels = n.1, "inside configuration applied");
                Ok(())
            }
            Op::InstallChild(c) => {
                let child = rpc::convert::child_from_pb(c).map_err(|e| e.to_string())?;
                self.dp.install_child(&child).map_err(|e| e.to_string())
            }
            Op::RemoveChild(r) => {
                let spi = wire::EspSpi(r.inbound_spi);
                if !self
                    .dp
                    .stats()
                    .children
                    .iter()
                    .any(|c| c.inbound_spi == spi)
                {
                    warn!(spi_in = %spi, tunnel = r.tunnel, "remove_child for an SA this node does not hold");
                    return Err(format!("no CHILD_SA with inbound SPI {spi} on this node"));
                }
                self.dp
                    .remove_child(ike::TunnelId(r.tunnel), spi, wire::EspSpi(r.outbound_spi));
                Ok(())
            }
            Op::UpdatePeer(u) => {
                let local: SocketAddr = u
                    .local
                    .parse()
                    .map_err(|_| format!("update_peer.local: invalid address {:?}", u.local))?;
                let remote: SocketAddr = u
                    .remote
                    .parse()
                    .map_err(|_| format!("update_peer.remote: invalid address {:?}", u.remote))?;
                let ike = ike::IkeSpis {
                    initiator: wire::IkeSpi(u.ike_initiator_spi),
                    responder: wire::IkeSpi(u.ike_responder_spi),
                };
                self.dp
                    .update_peer(ike::TunnelId(u.tunnel), ike, local, remote);
                Ok(())
            }
            Op::SetRelays(r) => {
                let mut steer = Vec::new();
                for (i, s) in r.steer.iter().enumerate() {
                    steer
                        .push(s.parse::<SocketAddr>().map_err(|_| {
                            format!("set_relays.steer[{i}]: invalid address {s:?}")
                        })?);
                }
                info!(steer = ?steer, "steer nodes set");
                self.dp.set_relays(steer).map_err(|e| e.to_string())
            }
            Op::SetAttachments(a) => {
                let attachments = attachments_from_pb(&a)?;
                let n = attachments.len();
                self.dp
                    .set_attachments(attachments)
                    .map_err(|e| e.to_string())?;
                info!(attachments = n, "attachments applied");
                Ok(())
            }
            Op::SetCeMac(m) => {
                let (attachment, mac) = ce_mac_from_pb(&m)?;
                self.dp
                    .set_ce_mac(&attachment, mac)
                    .map_err(|e| e.to_string())
            }
            Op::RouteChanges(c) => self.route_changes(&c).map(drop),
            Op::StageFilterObject(o) => self.stage_filter_object(o),
            Op::SetFilters(f) => self.set_filters(&f),
            Op::SetCpuFairness(f) => self.set_cpu_fairness(&f),
            Op::FilterMap(r) => self.filter_map(r).map(drop),
            Op::SetDispatch(d) => {
                let table = rpc::convert::dispatch_from_pb(&d)
                    .map_err(|e| e.context("set_dispatch").to_string())?;
                let n = table.vnets.len();
                self.dp.set_dispatch(table).map_err(|e| e.to_string())?;
                info!(vnets = n, "self-dispatch table applied");
                Ok(())
            }
            Op::RoutesChanged(c) => {
                let at = routebook::RouteVersion {
                    epoch: c.epoch,
                    seq: c.seq,
                };
                self.routes.follower().announced(at);
                self.routes.kick();
                Ok(())
            }
            other => Err(format!("{} is not a data node directive", op_name(&other))),
        }
    }
}

/// The attachments of a `set_attachments` directive, checked (errors name the field, e.g.
/// `set_attachments.attachments[1].c_tag`).
fn attachments_from_pb(a: &pb::Attachments) -> Result<Vec<dataplane::AttachmentConfig>, String> {
    rpc::convert::attachments_from_pb(a).map_err(|e| e.context("set_attachments").to_string())
}

/// The attachment and MAC of a `set_ce_mac` directive, checked.
fn ce_mac_from_pb(m: &pb::CeMac) -> Result<(String, [u8; 6]), String> {
    rpc::convert::ce_mac_from_pb(m).map_err(|e| e.context("set_ce_mac").to_string())
}

/// The report since `last` (and updates `last`): per-tunnel traffic of the interval, the
/// workers' busy fraction, and per-tunnel CPU time estimated as the workers' busy time split
/// by the tunnel's share of the packets (the data plane does not time tunnels separately).
fn build_report(stats: &DataplaneStats, last: &mut LastReport, now: Instant) -> pb::Report {
    let busy: u64 = stats.workers.iter().map(|w| w.busy_ns).sum();
    let elapsed = last.at.map_or(Duration::ZERO, |t| now.duration_since(t));
    // The data plane's per-tunnel totals keep the counts of retired CHILD_SAs, so a rekey
    // between two reports loses nothing.
    let totals: HashMap<u32, (u64, u64, u64, u64)> = (stats.tunnels.iter())
        .map(|(t, c)| (t.0, (c.bytes_in, c.packets_in, c.bytes_out, c.packets_out)))
        .collect();
    let busy_delta = busy.saturating_sub(last.busy_ns);
    let mut tunnels: Vec<pb::TunnelUsage> = totals
        .iter()
        .map(|(t, now)| {
            let before = last.tunnels.get(t).copied().unwrap_or_default();
            pb::TunnelUsage {
                tunnel: *t,
                cpu_ns: 0,
                bytes_in: now.0.saturating_sub(before.0),
                packets_in: now.1.saturating_sub(before.1),
                bytes_out: now.2.saturating_sub(before.2),
                packets_out: now.3.saturating_sub(before.3),
                rate_dropped: 0,
                rate_dropped_bytes_in: 0,
                rate_dropped_bytes_out: 0,
            }
        })
        .collect();
    let packets: u64 = tunnels.iter().map(|u| u.packets_in + u.packets_out).sum();
    if packets > 0 {
        for u in &mut tunnels {
            let share =
                (u.packets_in + u.packets_out) as u128 * busy_delta as u128 / packets as u128;
            u.cpu_ns = share as u64;
        }
    }
    tunnels.sort_by_key(|u| u.tunnel);
    let workers = stats.workers.len().max(1) as f64;
    let utilization = if elapsed.is_zero() {
        0.0
    } else {
        (busy_delta as f64 / (elapsed.as_nanos() as f64 * workers)).clamp(0.0, 1.0)
    };
    *last = LastReport {
        at: Some(now),
        busy_ns: busy,
        tunnels: totals,
    };
    pb::Report {
        interval_ms: elapsed.as_millis() as u32,
        utilization,
        tunnels,
        drops: stats.drops.iter().cloned().collect(),
        ..pb::Report::default()
    }
}

pub(crate) fn op_name(op: &pb::directive::Op) -> &'static str {
    use pb::directive::Op;
    match op {
        Op::DataConfig(_) => "data_config",
        Op::InstallChild(_) => "install_child",
        Op::RemoveChild(_) => "remove_child",
        Op::UpdatePeer(_) => "update_peer",
        Op::SetRelays(_) => "set_relays",
        Op::SteerTables(_) => "steer_tables",
        Op::SetSpi(_) => "set_spi",
        Op::RemoveSpi(_) => "remove_spi",
        Op::SetSelectors(_) => "set_selectors",
        Op::SetNodes(_) => "set_nodes",
        Op::SetRateLimit(_) => "set_rate_limit",
        Op::SetRateLimits(_) => "set_rate_limits",
        Op::SetAttachments(_) => "set_attachments",
        Op::SetCeMac(_) => "set_ce_mac",
        Op::SetPortTag(_) => "set_port_tag",
        Op::RemovePortTag(_) => "remove_port_tag",
        Op::RouteChanges(_) => "route_changes",
        Op::RoutesChanged(_) => "routes_changed",
        Op::StageFilterObject(_) => "stage_filter_object",
        Op::SetFilters(_) => "set_filters",
        Op::SetCpuFairness(_) => "set_cpu_fairness",
        Op::FilterMap(_) => "filter_map",
        Op::SetDispatch(_) => "set_dispatch",
    }
}

/// The data plane of a data node: relay mode behind the steer nodes, no VNets or tunnels until
/// control sends them. Its VTEP receives VXLAN too, for self-dispatch (issue 19): the hosts
/// send there only when control's `[cluster.dispatch] mode` is `self`, and until control
/// sends a table no VNet is dispatched.
fn dataplane_config(data: &DataSection) -> DataplaneConfig {
    DataplaneConfig {
        attachments: vec![],
        listen: Vec::new(),
        ike_port: 500,
        natt_port: data.natt_port,
        vxlan_port: data.vxlan_port,
        vnets: Vec::new(),
        tunnels: Vec::new(),
        tun_name: None,
        batch: data.batch,
        workers: data.workers,
        cpus: Vec::new(),
        pin_workers: false,
        busy_poll: Duration::ZERO,
        busy_poll_budget: datapath::DEFAULT_BUSY_POLL_BUDGET,
        xdp: data.xdp,
        // Relay mode: the gate does not read Geneve (it would not open).
        fair_kernel_gate: false,
        relay: Some(RelayConfig {
            listen: data.geneve,
            vtep: Some(data.vtep),
            steer: Vec::new(),
        }),
        dispatch: Some(datapath::DispatchConfig {
            vmacs: 1,
            announce_interval: Duration::from_secs(10),
            linger: Duration::from_secs(1),
            vnets: Vec::new(),
        }),
    }
}

/// A running data node.
pub struct DataNode {
    dp: Arc<Dataplane>,
    routes: Arc<RouteSide>,
    agent: Agent,
    geneve: SocketAddr,
    /// `[metrics] listen`.
    metrics: Option<metrics::MetricsServer>,
}

impl DataNode {
    /// Starts the data plane and the session with control.
    pub fn start(config: &NodeConfig) -> Result<Self, NodeError> {
        let data = config
            .data
            .clone()
            .ok_or_else(|| NodeError::MissingSection {
                path: config.path.clone(),
                role: "data",
            })?;
        let tls = Arc::new(load_node_tls(config, NodeRole::Data)?);
        let (to_agent, from_dp) = crossbeam_channel::bounded(EVENT_QUEUE);
        let dp = Dataplane::start(dataplane_config(&data), to_agent)?;
        let started = Instant::now();
        let source = || -> Arc<dyn metrics::Source> {
            Arc::new(crate::metrics::DataNodeMetrics {
                dp: Arc::clone(&dp),
                started,
            })
        };
        let metrics = crate::metrics::serve(config, source).inspect_err(|_| dp.shutdown())?;
        let geneve = dp.relay_addr().unwrap_or(data.geneve);
        let routes = Arc::new(RouteSide {
            dp: dp.clone(),
            follower: Mutex::new(RouteFollower::default()),
            fetcher: Some(Fetcher {
                tls: Arc::clone(&tls),
                endpoints: config.node.control.clone(),
            }),
            control: Mutex::new(None),
            running: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let applier = Arc::new(DataApplier {
            name: config.node.name.clone(),
            geneve,
            data,
            dp: Arc::clone(&dp),
            boot_id: boot_id(),
            last: Mutex::new(LastReport::default()),
            routes: Arc::clone(&routes),
            filter_objects: filters::FilterObjects::default(),
        });
        let agent = Agent::start(
            "data",
            config.node.control.clone(),
            tls,
            applier,
            from_dp,
            data_event,
        )
        .map_err(NodeError::Start)?;
        info!(node = %config.node.name, %geneve, "data node started");
        Ok(Self {
            dp,
            routes,
            agent,
            geneve,
            metrics,
        })
    }

    /// The Geneve address the data plane bound.
    pub fn geneve(&self) -> SocketAddr {
        self.geneve
    }

    /// The data plane's counters.
    pub fn stats(&self) -> DataplaneStats {
        self.dp.stats()
    }

    /// Stops the session and the data plane.
    pub fn shutdown(mut self) {
        drop(self.metrics.take());
        self.routes.stop.store(true, Ordering::Relaxed);
        self.agent.shutdown();
        self.dp.shutdown();
    }
}

/// The session event for a data plane request; IKE never reaches a data node in relay mode
/// (the data plane drops and counts it).
fn data_event(msg: ToControl) -> Option<pb::node_event::Event> {
    use pb::node_event::Event;
    match msg {
        ToControl::RekeyNeeded(spi) => Some(Event::RekeyNeeded(spi.0)),
        ToControl::PeerAddressSeen {
            inbound_spi,
            local,
            remote,
        } => Some(Event::PeerAddressSeen(pb::PeerAddressSeen {
            inbound_spi: inbound_spi.0,
            local: local.to_string(),
            remote: remote.to_string(),
        })),
        ToControl::CeLearned { attachment, mac } => Some(Event::CeLearned(pb::CeMac {
            attachment,
            mac: mac.to_vec(),
        })),
        ToControl::Ike(_) => None,
    }
}

#[path = "data_node_filters.rs"]
mod filters;

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::WorkerStats;

    /// A data node's applier over a relay-mode data plane on loopback (no session).
    pub(super) fn applier() -> DataApplier {
        for attempt in 0..20u16 {
            let data = DataSection {
                geneve: "127.0.0.1:0".parse().unwrap(),
                vtep: "127.0.0.1".parse().unwrap(),
                workers: 1,
                batch: 8,
                natt_port: 4500,
                vxlan_port: 47000 + (std::process::id() % 1000) as u16 * 2 + attempt,
                xdp: datapath::XdpMode::Off,
            };
            let config = dataplane_config(&data);
            let (tx, _rx) = crossbeam_channel::unbounded();
            let Ok(dp) = Dataplane::start(config, tx) else {
                continue;
            };
            if !dp.vteps_receive() {
                // Another test process holds the VXLAN port.
                dp.shutdown();
                continue;
            }
            return applier_on(dp, data);
        }
        panic!("no free VXLAN port");
    }

    /// The applier of data plane `dp` started from `data`.
    fn applier_on(dp: Arc<Dataplane>, data: DataSection) -> DataApplier {
        {
            DataApplier {
                name: "data1".into(),
                geneve: dp.relay_addr().unwrap(),
                data,
                routes: Arc::new(RouteSide {
                    dp: dp.clone(),
                    follower: Mutex::new(RouteFollower::default()),
                    fetcher: None,
                    control: Mutex::new(None),
                    running: AtomicBool::new(false),
                    stop: AtomicBool::new(false),
                }),
                dp,
                boot_id: 1,
                last: Mutex::new(LastReport::default()),
                filter_objects: filters::FilterObjects::default(),
            }
        }
    }

    #[test]
    fn directives_for_sas_the_node_does_not_hold_are_rejected() {
        let a = applier();
        let e = a
            .apply(pb::directive::Op::RemoveChild(pb::RemoveChild {
                tunnel: 1,
                inbound_spi: 0xdead_beef,
                outbound_spi: 0x1234,
            }))
            .unwrap_err();
        assert!(e.contains("deadbeef") || e.contains("0xdeadbeef"), "{e}");
        // A malformed directive is refused, naming the field.
        let e = a
            .apply(pb::directive::Op::SetRelays(pb::Relays {
                steer: vec!["not an address".into()],
            }))
            .unwrap_err();
        assert!(e.contains("set_relays.steer[0]"), "{e}");
        // A steer node's directive is not a data node's.
        let e = a
            .apply(pb::directive::Op::RemoveSpi(pb::RemoveSpi { spi: 1 }))
            .unwrap_err();
        assert!(e.contains("remove_spi is not a data node directive"), "{e}");
        assert!(a.dp.stats().children.is_empty(), "nothing changed");
        a.dp.shutdown();
    }

    /// `set_attachments` and `set_ce_mac` are checked before the data plane sees them; bad
    /// fields are named. (Whether the data plane takes valid ones is its own tests' matter.)
    #[test]
    fn attachment_directives_are_converted_and_bad_fields_named() {
        let good = pb::Attachment {
            name: "acme-prod".into(),
            tenant: "acme".into(),
            vnet: "prod".into(),
            steer_geneve: "10.255.0.1:6081".into(),
            port: 1,
            port_mac: vec![2, 0, 0, 0, 0, 1],
            s_tag: Some(100),
            c_tag: 20,
            gateway_ip: "10.99.0.1".into(),
            ce_ip: Some("10.99.0.2".into()),
            routes: vec!["10.99.0.0/24".into()],
            ce_mac: Some(vec![2, 0, 0, 0, 0, 2]),
        };
        let all = |a: Vec<pb::Attachment>| pb::Attachments { attachments: a };
        let converted = attachments_from_pb(&all(vec![good.clone()])).expect("valid");
        assert_eq!(
            converted[0].port,
            datapath::AttachmentPort::Steer {
                geneve: "10.255.0.1:6081".parse().unwrap(),
                port: 1,
                mac: [2, 0, 0, 0, 0, 1],
            }
        );
        assert_eq!(converted[0].ce_mac, Some([2, 0, 0, 0, 0, 2]));
        let a = applier();
        let bad = pb::Attachment {
            c_tag: 4095,
            ..good.clone()
        };
        let e = a
            .apply(pb::directive::Op::SetAttachments(all(vec![good, bad])))
            .unwrap_err();
        assert!(e.starts_with("set_attachments.attachments[1].c_tag"), "{e}");
        let e = a
            .apply(pb::directive::Op::SetCeMac(pb::CeMac {
                attachment: "acme-prod".into(),
                mac: vec![1, 2, 3],
            }))
            .unwrap_err();
        assert!(e.starts_with("set_ce_mac.mac"), "{e}");
        assert_eq!(
            ce_mac_from_pb(&pb::CeMac {
                attachment: "acme-prod".into(),
                mac: vec![2, 0, 0, 0, 0, 3],
            }),
            Ok(("acme-prod".to_string(), [2, 0, 0, 0, 0, 3]))
        );
        a.dp.shutdown();
    }

    /// Route directives: bad fields named; a gap refused; the version in Hello and Report.
    #[test]
    fn route_directives_are_checked_and_versioned() {
        let a = applier();
        let add = |host: &str| pb::RouteOp {
            op: Some(pb::route_op::Op::Add(pb::RouteAdd {
                tenant: "acme".into(),
                vnet: "prod".into(),
                address: "10.1.0.7".into(),
                host: host.into(),
            })),
        };
        let e = a
            .apply(pb::directive::Op::RouteChanges(pb::RouteChanges {
                epoch: 5,
                first_seq: 1,
                ops: vec![add("not an address")],
            }))
            .unwrap_err();
        assert!(e.starts_with("route_changes.ops[0].add.host"), "{e}");
        // A node without routes cannot take changes of epoch 5: a gap, it must fetch.
        let e = a
            .apply(pb::directive::Op::RouteChanges(pb::RouteChanges {
                epoch: 5,
                first_seq: 3,
                ops: vec![add("192.0.2.9")],
            }))
            .unwrap_err();
        assert!(e.starts_with("gap: the routes are at 0.0"), "{e}");
        assert!(a.routes.follower().fetching());
        a.apply(pb::directive::Op::RoutesChanged(pb::RoutesChanged {
            epoch: 5,
            seq: 3,
        }))
        .expect("announcements are taken");
        // While it fetches, a change is kept and answered as kept (`Ack.kept`), not applied.
        let kept = a.apply(pb::directive::Op::RouteChanges(pb::RouteChanges {
            epoch: 5,
            first_seq: 4,
            ops: vec![add("192.0.2.9")],
        }));
        assert_eq!(kept, Ok(Answer::Kept));
        let (h, r) = (a.hello(), a.report());
        assert_eq!((h.routes_epoch, h.routes_seq), (0, 0));
        assert_eq!((r.routes_epoch, r.routes_seq), (0, 0));
        a.dp.shutdown();
    }

    #[test]
    fn reports_are_deltas_and_split_cpu_by_packets() {
        // The data plane's per-tunnel totals (live and retired CHILD_SAs).
        let tunnel = |t: u32, packets: u64| {
            (
                ike::TunnelId(t),
                datapath::TunnelTraffic {
                    packets_in: packets,
                    bytes_in: packets * 100,
                    ..datapath::TunnelTraffic::default()
                },
            )
        };
        let worker = |busy_ns| WorkerStats {
            busy_ns,
            ..WorkerStats::default()
        };
        let t0 = Instant::now();
        let mut last = LastReport::default();
        let s1 = DataplaneStats {
            tunnels: vec![tunnel(1, 10), tunnel(2, 30)],
            workers: vec![worker(1_000), worker(1_000)],
            drops: vec![("esp_replay".into(), 2)],
            ..DataplaneStats::default()
        };
        let r = build_report(&s1, &mut last, t0);
        assert_eq!(r.utilization, 0.0, "no interval yet");
        // One second later: tunnel 1 +30 packets (its first SA was rekeyed away: its 10 stay in
        // the total), tunnel 2 +10; 0.5 s busy per worker.
        let s2 = DataplaneStats {
            tunnels: vec![tunnel(1, 40), tunnel(2, 40)],
            workers: vec![worker(500_001_000), worker(500_001_000)],
            drops: vec![("esp_replay".into(), 3)],
            ..DataplaneStats::default()
        };
        let r = build_report(&s2, &mut last, t0 + Duration::from_secs(1));
        assert_eq!(r.interval_ms, 1000);
        assert!((r.utilization - 0.5).abs() < 1e-6, "{}", r.utilization);
        let t1 = &r.tunnels[0];
        let t2 = &r.tunnels[1];
        assert_eq!((t1.tunnel, t1.packets_in, t1.bytes_in), (1, 30, 3000));
        assert_eq!((t2.tunnel, t2.packets_in), (2, 10));
        assert_eq!(t1.cpu_ns, 750_000_000);
        assert_eq!(t2.cpu_ns, 250_000_000);
        assert_eq!(r.drops["esp_replay"], 3);
    }

    #[test]
    fn dispatch_tables_are_checked_applied_and_the_vtep_announced() {
        let a = applier();
        assert_eq!(a.hello().vtep, "127.0.0.1");
        let table = |owners: Vec<u32>| pb::DispatchTable {
            vmacs: 4,
            announce_interval_ms: 10_000,
            linger_ms: 1_000,
            vnets: vec![pb::DispatchVnet {
                vni: 1001,
                nodes: vec!["127.0.0.1".into(), "127.0.0.2".into()],
                owners,
            }],
        };
        a.apply(pb::directive::Op::SetDispatch(table(vec![0, 1, 0, 1])))
            .unwrap();
        let owned = |a: &DataApplier| a.dp.stats().dispatch.map(|d| d.owned);
        assert_eq!(owned(&a), Some(2));
        // A bad table names the field and changes nothing.
        let e = a
            .apply(pb::directive::Op::SetDispatch(table(vec![0, 0, 0, 2])))
            .unwrap_err();
        assert!(e.contains("set_dispatch.vnets[0].owners[3]"), "{e}");
        assert_eq!(owned(&a), Some(2));
        a.apply(pb::directive::Op::SetDispatch(table(vec![0, 0, 0, 1])))
            .unwrap();
        assert_eq!(owned(&a), Some(3));
    }

    #[test]
    fn a_second_data_node_on_the_same_vtep_runs_without_self_dispatch() {
        let a = applier();
        let (tx, _rx) = crossbeam_channel::unbounded();
        let dp = Dataplane::start(dataplane_config(&a.data), tx).unwrap();
        assert!(!dp.vteps_receive());
        let b = applier_on(dp, a.data.clone());
        assert_eq!(b.hello().vtep, "", "it cannot join the ring");
        let e = b
            .apply(pb::directive::Op::SetDispatch(pb::DispatchTable {
                vmacs: 1,
                announce_interval_ms: 10_000,
                linger_ms: 1_000,
                vnets: Vec::new(),
            }))
            .unwrap_err();
        assert!(e.contains("VTEP port was taken"), "{e}");
        assert_eq!(a.hello().vtep, "127.0.0.1");
    }
}
