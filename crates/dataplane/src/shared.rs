//! State shared by the data plane's threads and its control interface: the validated
//! configuration, the I/O stage's socket table ([`Sockets`]), the published tables (SAs, VNets
//! and tunnel bindings, steer nodes, feature chains), the lanes and send batch pools, and the
//! counters. The pipeline's stages import this module; it imports none of them.

use crate::attach::{AttachOut, AttachTable};
use crate::feature::{Direction, FeatureChain, FeatureDrops};
use crate::io::sockets::Sockets;
use crate::lane::Lane;
use crate::overlay::{Overlay, Rules};
use crate::pipeline::charge::NO_TENANT;
use crate::pool::TxPool;
use crate::relays::Relays;
use crate::routes::{RouteReaders, RouteVnet, RouteWriter};
use crate::stats::{DropCounters, WorkerCounters};
use crate::sys::gate::{Gate, Keyed};
use crate::tables::{Published, Registry, Tables};
use crate::vnet::vmacs::{Dispatch, DispatchCounters};
use crossbeam_channel::{Sender, TrySendError};
use datapath::{
    AttachmentConfig, DataplaneConfig, DataplaneError, DispatchConfig, RelayConfig, ToControl,
    TunnelBinding, VnetConfig,
};
use netio::{Waker, RX_SLOT};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Period of the neighbour cache housekeeping.
pub(crate) const HOUSEKEEPING: Duration = Duration::from_millis(250);

/// Most workers (threads processing packets).
pub(crate) const MAX_WORKERS: usize = 1024;

/// Most receive slots per worker (64 KiB each).
pub(crate) const MAX_RX_SLOTS: usize = 64;

/// Most packets one receive slot holds: a coalesced train is at most UDP_MAX_SEGMENTS (128
/// since Linux 6.x) datagrams, whether the receive side's GRO built it or a sender's GSO train
/// crossed a veth whole.
pub(crate) const MAX_SEGMENTS_PER_SLOT: usize = 128;

/// Send batches per worker pool: one being filled, the others in flight to the lanes'
/// ordered senders. At least 2 (see `lane`); 3 lets a worker run one batch ahead.
pub(crate) const POOL_BATCHES: usize = 3;

/// Send buffer room per received packet beyond its own bytes (headers a path adds: VXLAN and
/// Ethernet toward hosts, or ESP header, IV, padding and ICV toward peers, in relay mode
/// behind up to 56 bytes of Geneve, IPv6 and UDP headers; ARP/ND answers, probe replies).
const TX_SLACK_PER_PACKET: usize = 160;

/// Receive slots per batch for a configured `batch` size.
pub(crate) fn rx_slots(batch: usize) -> usize {
    batch.clamp(1, MAX_RX_SLOTS)
}

/// (messages, bytes) of a send batch that holds everything one receive batch can produce.
pub(crate) fn tx_batch_size(batch: usize) -> (usize, usize) {
    let slots = rx_slots(batch);
    let packets = slots * MAX_SEGMENTS_PER_SLOT;
    (
        packets + 64,
        slots * RX_SLOT + packets * TX_SLACK_PER_PACKET,
    )
}

/// The CPUs this process may run on, in ascending order (empty if the kernel will not say).
pub(crate) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; the set is live and its size is passed.
    let ret =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if ret != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: i is below CPU_SETSIZE.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// Everything the threads share.
pub(crate) struct Shared {
    /// The configuration as given at start (VNets and tunnel bindings may have been replaced
    /// since: the current ones are in the published tables' overlay).
    pub(crate) cfg: DataplaneConfig,
    /// Every socket and the TUN device (the I/O stage's; the other stages name sockets by
    /// index).
    pub(crate) io: Sockets,
    /// SA tables (and VNets, bindings, steer nodes) for the packet path.
    pub(crate) tables: Published,
    /// SA registry for the control path.
    registry: Mutex<Registry>,
    /// The per-VM routes' one writer (taken before `registry` when both are needed).
    routes: Mutex<RouteWriter>,
    /// Makes each worker's reader of the per-VM routes.
    pub(crate) route_readers: RouteReaders,
    /// Drop counters.
    pub(crate) drops: DropCounters,
    /// Drop counters of the feature chains' stages, by reason name.
    pub(crate) feature_drops: FeatureDrops,
    /// Relay health probes answered.
    pub(crate) relay_probes_answered: AtomicU64,
    /// Self-dispatch's counters.
    pub(crate) dispatch_counters: DispatchCounters,
    /// Self-dispatch: when the next full announcement round is due, and the newest table
    /// whose gains were announced.
    pub(crate) announce: Mutex<(Instant, u64)>,
    /// Messages to the control plane.
    pub(crate) to_control: Sender<ToControl>,
    /// Shutdown signal.
    pub(crate) waker: Waker,
    /// One lane per input (IKE and NAT-T sockets, VTEP sockets, the Geneve socket, TUN
    /// device).
    pub(crate) lanes: Vec<Lane>,
    /// Number of workers.
    pub(crate) workers: usize,
    /// CPU of each worker (None: not pinned).
    pub(crate) worker_cpus: Vec<Option<usize>>,
    /// Send batch pools, one per worker.
    pub(crate) pools: Vec<TxPool>,
    /// Per-worker counters.
    pub(crate) worker_stats: Vec<WorkerCounters>,
    /// When the next neighbour cache housekeeping round is due (one worker runs it).
    pub(crate) housekeeping: Mutex<Instant>,
    /// The tenants' CPU charge over the last seconds (sampled by the housekeeping round).
    pub(crate) recent_cpu: Mutex<crate::pipeline::charge::RecentCpu>,
    /// Set at shutdown (workers busy with full batches check it between batches).
    pub(crate) stop: AtomicBool,
    /// Customers attached at L2: on local interfaces, fixed at start; in relay mode on the
    /// steer nodes' ports, replaced by [`Shared::set_attachments`]. Published with the tables
    /// ([`crate::attach::AttachView`]).
    pub(crate) attach: Mutex<Arc<AttachTable>>,
    /// The tenants' filters (their maps kept across replacements).
    pub(crate) filters: Mutex<crate::filters::Filters>,
    /// Held by a change of the filters from start to end (`set_filters`).
    filter_updates: Mutex<()>,
    /// The kernel gate of CPU fairness, opened at the first publication that enforces (None
    /// inside: it could not be opened, and refusals stay the workers').
    gate: std::sync::OnceLock<Option<Arc<Gate>>>,
}

fn config_err(field: impl Into<String>, reason: impl Into<String>) -> DataplaneError {
    DataplaneError::Config {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Checks the configuration as a whole before anything is opened (the VNets and tunnel
/// bindings are checked by [`Overlay::build`]).
pub(crate) fn validate(cfg: &DataplaneConfig) -> Result<(), DataplaneError> {
    match &cfg.relay {
        None if cfg.listen.is_empty() => {
            return Err(config_err("listen", "at least one address is needed"));
        }
        None => {}
        Some(relay) => {
            if !cfg.listen.is_empty() {
                return Err(config_err(
                    "listen",
                    "must be empty in relay mode (the steer nodes own the public addresses)",
                ));
            }
            validate_relay(relay)?;
            if cfg.natt_port == 0 {
                return Err(config_err(
                    "natt_port",
                    "must not be 0 in relay mode (relayed ESP is recognised by it)",
                ));
            }
            if cfg.vxlan_port == 0 {
                return Err(config_err(
                    "vxlan_port",
                    "must not be 0 in relay mode (relayed VXLAN is recognised by it)",
                ));
            }
            if cfg.vxlan_port == cfg.natt_port {
                return Err(config_err("vxlan_port", "must differ from natt_port"));
            }
        }
    }
    for (i, a) in cfg.listen.iter().enumerate() {
        if a.is_unspecified() || a.is_multicast() {
            return Err(config_err(
                format!("listen[{i}]"),
                format!("{a} is not a unicast address"),
            ));
        }
        if cfg.listen[..i].contains(a) {
            return Err(config_err(
                format!("listen[{i}]"),
                format!("{a} is listed twice"),
            ));
        }
    }
    if cfg.ike_port != 0 && cfg.ike_port == cfg.natt_port {
        return Err(config_err("natt_port", "must differ from ike_port"));
    }
    if cfg.workers > MAX_WORKERS {
        return Err(config_err(
            "workers",
            format!("{} is above the limit of {MAX_WORKERS}", cfg.workers),
        ));
    }
    if cfg.pin_workers {
        if let Some(bad) = cfg.cpus.iter().find(|c| **c >= libc::CPU_SETSIZE as usize) {
            return Err(config_err(
                "cpus",
                format!(
                    "CPU {bad} is beyond the {} CPUs Linux can address",
                    libc::CPU_SETSIZE
                ),
            ));
        }
    }
    if cfg.batch == 0 || cfg.batch > 1024 {
        return Err(config_err(
            "batch",
            format!("{} is outside 1..=1024", cfg.batch),
        ));
    }
    Ok(())
}

fn validate_relay(relay: &RelayConfig) -> Result<(), DataplaneError> {
    let ip = relay.listen.ip();
    if ip.is_unspecified() || ip.is_multicast() {
        return Err(config_err(
            "relay.listen",
            format!("{ip} is not a unicast address (steer nodes check the sender)"),
        ));
    }
    if let Some(v) = relay.vtep {
        if v.is_unspecified() || v.is_multicast() {
            return Err(config_err(
                "relay.vtep",
                format!("{v} is not a unicast address"),
            ));
        }
    }
    validate_steer(&relay.steer, relay.listen, "relay.steer")
}

/// Checks a list of steer node addresses for a Geneve socket bound to `listen`; `field`
/// names the list in errors.
pub(crate) fn validate_steer(
    steer: &[SocketAddr],
    listen: SocketAddr,
    field: &str,
) -> Result<(), DataplaneError> {
    for (i, a) in steer.iter().enumerate() {
        let field = format!("{field}[{i}]");
        if a.ip().is_unspecified() || a.ip().is_multicast() || a.port() == 0 {
            return Err(config_err(
                field,
                format!("{a} is not a unicast address and port"),
            ));
        }
        if a.is_ipv4() != listen.is_ipv4() {
            return Err(config_err(
                field,
                format!("{a} is not of the family of the Geneve address {listen}"),
            ));
        }
        if steer[..i].contains(a) {
            return Err(config_err(field, format!("{a} is listed twice")));
        }
    }
    Ok(())
}

/// The VTEP addresses to open socket sets on: those of the starting VNets in order, and in
/// relay mode the node's VTEP (by default its Geneve address).
fn vtep_addresses(cfg: &DataplaneConfig) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = Vec::new();
    let relay = cfg
        .relay
        .as_ref()
        .map(|r| r.vtep.unwrap_or_else(|| r.listen.ip()));
    for ip in cfg.vnets.iter().map(|v| v.vtep).chain(relay) {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    ips
}

/// The per-VM route table's view of the VNets of `overlay`, whose VTEP indices are into
/// `vteps`.
fn route_vnets(overlay: &Overlay, vteps: &[IpAddr]) -> Vec<RouteVnet> {
    overlay
        .vnets
        .iter()
        .map(|v| RouteVnet {
            tenant: v.tenant.clone(),
            name: v.name.clone(),
            id: v.key,
            vni: v.vni,
            vtep_v6: vteps.get(v.vtep).is_some_and(IpAddr::is_ipv6),
        })
        .collect()
}

impl Shared {
    /// Validates `cfg` and opens every socket and the TUN device.
    pub(crate) fn open(
        cfg: DataplaneConfig,
        to_control: Sender<ToControl>,
    ) -> Result<Self, DataplaneError> {
        validate(&cfg)?;
        let vtep_ips = vtep_addresses(&cfg);
        let (mut routes, route_readers) = RouteWriter::new();
        let overlay = Overlay::build(
            &cfg.vnets,
            cfg.tunnels.clone(),
            Self::rules(&cfg, &vtep_ips),
            None,
            &mut |v| routes.vnet_id(&v.tenant, &v.name),
        )?;
        routes.set_vnets(route_vnets(&overlay, &vtep_ips));
        let io = Sockets::open(&cfg, &vtep_ips)?;
        let attach = Arc::new(if cfg.relay.is_some() {
            AttachTable::on_steer_ports(&cfg.attachments, &AttachTable::default())?
        } else {
            AttachTable::new(&cfg.attachments, |i, _| {
                let iface = io
                    .packet_iface(i)
                    .expect("Sockets::open opened every attachment's interface");
                Ok(((iface, AttachOut::Packet(iface)), io.packet[iface].mac()))
            })?
        });
        let waker = Waker::new().map_err(|source| DataplaneError::Start { source })?;
        let relays = cfg
            .relay
            .as_ref()
            .map(|r| Arc::new(Relays::new(r.steer.clone())));
        let mut registry = Registry::new(Arc::new(overlay), relays);
        if let Some(d) = &cfg.dispatch {
            registry.set_dispatch(Arc::new(Dispatch::build(
                d,
                &vtep_ips,
                None,
                Instant::now(),
            )?));
        }
        let tables = Published::default();
        let mut first = registry.snapshot();
        first.attach = AttachTable::view(&attach, &first.overlay.vnets);
        tables.store(first);
        let allowed = allowed_cpus();
        let workers = match cfg.workers {
            0 => allowed.len().max(1),
            n => n,
        };
        let pin_to: Vec<usize> = if cfg.cpus.is_empty() {
            allowed
        } else {
            cfg.cpus.clone()
        };
        let worker_cpus = (0..workers)
            .map(|i| (cfg.pin_workers && !pin_to.is_empty()).then(|| pin_to[i % pin_to.len()]))
            .collect();
        let (msgs, bytes) = tx_batch_size(cfg.batch);
        let pools = (0..workers)
            .map(|w| TxPool::new(w, POOL_BATCHES, msgs, bytes))
            .collect();
        let in_flight = workers * POOL_BATCHES;
        let lanes = io
            .inputs()
            .into_iter()
            .map(|(kind, fd)| Lane::new(kind, fd, in_flight, POOL_BATCHES))
            .collect();
        Ok(Self {
            cfg,
            io,
            tables,
            registry: Mutex::new(registry),
            routes: Mutex::new(routes),
            route_readers,
            drops: DropCounters::default(),
            feature_drops: FeatureDrops::default(),
            relay_probes_answered: AtomicU64::new(0),
            dispatch_counters: DispatchCounters::default(),
            announce: Mutex::new((Instant::now(), 0)),
            to_control,
            waker,
            lanes,
            workers,
            worker_cpus,
            pools,
            worker_stats: (0..workers).map(|_| WorkerCounters::default()).collect(),
            housekeeping: Mutex::new(Instant::now() + HOUSEKEEPING),
            recent_cpu: Mutex::default(),
            stop: AtomicBool::new(false),
            attach: Mutex::new(attach),
            filters: Mutex::default(),
            filter_updates: Mutex::default(),
            gate: std::sync::OnceLock::new(),
        })
    }

    /// What VNets and tunnel bindings are checked against (`vteps`: the VTEP addresses).
    fn rules<'a>(cfg: &DataplaneConfig, vteps: &'a [IpAddr]) -> Rules<'a> {
        Rules {
            vteps,
            vxlan_port: cfg.vxlan_port,
            tun: cfg.tun_name.is_some(),
            relay: cfg.relay.is_some(),
        }
    }

    /// Validates VNets and tunnel bindings as [`Shared::set_inside`] does, changing nothing.
    pub(crate) fn check_inside(
        &self,
        vnets: &[VnetConfig],
        tunnels: &[TunnelBinding],
    ) -> Result<(), DataplaneError> {
        let vtep_ips: Vec<IpAddr> = self.io.vteps.iter().map(|v| v.ip).collect();
        let rules = Self::rules(&self.cfg, &vtep_ips);
        // Building is the whole check (each VNet's own fields, then across them); the result
        // is dropped. The previous overlay is not needed to validate.
        let routes = self.routes();
        Overlay::build(vnets, tunnels.to_vec(), rules, None, &mut |v| {
            routes.peek_id(&v.tenant, &v.name)
        })
        .map(drop)
    }

    /// Replaces the VNets and tunnel bindings (validated whole first); see
    /// [`Registry::set_inside`].
    pub(crate) fn set_inside(
        &self,
        vnets: Vec<VnetConfig>,
        tunnels: Vec<TunnelBinding>,
    ) -> Result<(), DataplaneError> {
        let vtep_ips: Vec<IpAddr> = self.io.vteps.iter().map(|v| v.ip).collect();
        let rules = Self::rules(&self.cfg, &vtep_ips);
        let mut routes = self.routes();
        let mut reg = self.registry();
        let overlay = Overlay::build(&vnets, tunnels, rules, Some(reg.overlay()), &mut |v| {
            routes.vnet_id(&v.tenant, &v.name)
        })?;
        let (vnet_count, tunnel_count) = (overlay.vnets.len(), overlay.tunnels.len());
        let route_vnets = route_vnets(&overlay, &vtep_ips);
        let (rebound, removed) = reg.set_inside(Arc::new(overlay));
        self.publish(&reg);
        drop(reg);
        // After the tables: a VNet's entries go once no batch can reach the VNet.
        routes.set_vnets(route_vnets);
        drop(routes);
        for (tunnel, spi) in &removed {
            tracing::warn!(tunnel = tunnel.0, spi_in = %spi, "CHILD_SA removed: its tunnel is no longer bound");
        }
        tracing::info!(
            vnets = vnet_count,
            tunnels = tunnel_count,
            children_rebound = rebound,
            children_removed = removed.len(),
            "inside configuration replaced"
        );
        Ok(())
    }

    /// Relay mode: replaces the steer nodes (validated first).
    pub(crate) fn set_relays(&self, steer: Vec<SocketAddr>) -> Result<(), DataplaneError> {
        let Some(relay) = &self.cfg.relay else {
            return Err(DataplaneError::Unsupported {
                operation: "set_relays",
                reason: "the data plane is not in relay mode".into(),
            });
        };
        validate_steer(&steer, relay.listen, "steer")?;
        tracing::info!(steer = ?steer, "steer nodes replaced");
        let mut reg = self.registry();
        let previous = self.tables.load().relays.clone();
        reg.set_relays(Arc::new(Relays::replacing(steer, previous.as_deref())));
        self.publish(&reg);
        Ok(())
    }

    /// Self-dispatch: replaces who owns which virtual MACs (validated whole first).
    pub(crate) fn set_dispatch(&self, cfg: &DispatchConfig) -> Result<(), DataplaneError> {
        if self.cfg.dispatch.is_none() || !self.io.vteps_receive {
            return Err(DataplaneError::Unsupported {
                operation: "set_dispatch",
                reason: if self.cfg.dispatch.is_none() {
                    "the data plane was started without self-dispatch (its VTEPs do not receive)"
                        .into()
                } else {
                    "the VTEP port was taken on this node's address at start (its VTEPs do not receive)"
                        .into()
                },
            });
        }
        let vtep_ips: Vec<IpAddr> = self.io.vteps.iter().map(|v| v.ip).collect();
        let mut reg = self.registry();
        let table = Dispatch::build(cfg, &vtep_ips, reg.dispatch().map(|d| &**d), Instant::now())?;
        tracing::info!(
            vnets = cfg.vnets.len(),
            owned = table.owned(),
            gained = table.gained.len(),
            "self-dispatch table replaced"
        );
        reg.set_dispatch(Arc::new(table));
        self.publish(&reg);
        drop(reg);
        // What it gained is announced by the next housekeeping round: make it due.
        *self.housekeeping.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        Ok(())
    }

    /// Sets `tenant`'s feature chain for `direction` (empty: removes it) and publishes it.
    pub(crate) fn set_feature_chain(
        &self,
        tenant: &ids::TenantId,
        direction: Direction,
        chain: FeatureChain,
    ) -> Result<(), DataplaneError> {
        let run = if chain.is_empty() {
            None
        } else {
            Some(self.feature_drops.prepare(tenant, direction, &chain)?)
        };
        let mut reg = self.registry();
        reg.set_chain(tenant, direction, run);
        self.publish(&reg);
        drop(reg);
        tracing::info!(%tenant, ?direction, stages = ?chain, "feature chain set");
        Ok(())
    }

    /// Replaces the tenants' filters: every program loaded, verified and instantiated first
    /// (nothing changes on an error), then each (tenant, direction) with filters gets its
    /// stage, and those that had one and have none now lose it.
    pub(crate) fn set_filters(
        &self,
        filters: &[datapath::FilterConfig],
    ) -> Result<(), DataplaneError> {
        // One change at a time; the new set is built (programs verified and compiled) from a
        // copy of the current one, without the lock that status and map requests take.
        let _one_at_a_time = self
            .filter_updates
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let current = self.filters().clone();
        let mut built = current.build(filters, self.workers)?;
        let direction = |d| match d {
            datapath::FilterDirection::ToCloud => Direction::Inbound,
            datapath::FilterDirection::FromCloud => Direction::Outbound,
        };
        for (tenant, d, chain) in &built.stages {
            self.set_feature_chain(tenant, direction(*d), chain.clone())?;
        }
        let gone = self.filters().commit(&mut built);
        for (tenant, d) in gone {
            self.set_feature_chain(&tenant, direction(d), FeatureChain::new())?;
        }
        tracing::info!(filters = filters.len(), "tenant filters set");
        Ok(())
    }

    /// The running filters (a poisoned lock still holds a whole set: `commit` replaces it in
    /// one step).
    pub(crate) fn filters(&self) -> MutexGuard<'_, crate::filters::Filters> {
        self.filters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The per-VM routes' writer (a poisoned lock still holds consistent copies: the table
    /// changes only inside the `left-right` publication, which finishes or never starts).
    pub(crate) fn routes(&self) -> MutexGuard<'_, RouteWriter> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The registry (a poisoned lock still holds a consistent registry: every edit is one
    /// map operation).
    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The registry if nobody holds it now (a worker's housekeeping does not wait).
    pub(crate) fn try_registry(&self) -> Option<MutexGuard<'_, Registry>> {
        match self.registry.try_lock() {
            Ok(reg) => Some(reg),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Publishes the registry's current state to the packet path.
    pub(crate) fn publish(&self, reg: &Registry) {
        let mut t = reg.snapshot();
        t.attach = AttachTable::view(&self.attachments(), &t.overlay.vnets);
        self.sync_gate(&t);
        self.tables.store(t);
    }

    /// The kernel gate, if one is open (see [`crate::sys::gate`]).
    pub(crate) fn gate(&self) -> Option<&Arc<Gate>> {
        self.gate.get().and_then(Option::as_ref)
    }

    /// Opens the kernel gate when `t` is the first table that enforces, and makes its keys
    /// those of `t`: every inbound SPI and every VNI with its tenant's slot.
    fn sync_gate(&self, t: &Tables) {
        let enforce = t.tenants.mode == datapath::CpuFairness::Enforce;
        let gate = if enforce && self.cfg.fair_kernel_gate {
            self.gate.get_or_init(|| self.open_gate())
        } else {
            match self.gate.get() {
                Some(g) => g,
                None => return,
            }
        };
        let Some(g) = gate else { return };
        let spis = t
            .by_spi
            .iter()
            .map(|(spi, c)| (spi.0, c.tenant))
            .filter(|&(_, s)| s != NO_TENANT);
        let vnis = t
            .overlay
            .vnets
            .iter()
            .enumerate()
            .map(|(i, v)| (v.vni.get(), t.tenants.vnet(i)))
            .filter(|&(_, s)| s != NO_TENANT);
        let left_out = g.sync(Keyed::Spi, spis) + g.sync(Keyed::Vni, vnis);
        if left_out != 0 {
            tracing::warn!(
                keys = left_out,
                "CPU fairness: the kernel gate has no room for some SPIs or VNIs; \
                 their tenants are refused by the workers only"
            );
        }
    }

    /// The kernel gate, attached to the NAT-T sockets and (unless relayed) the VTEPs; None,
    /// said once in the log, if the kernel refuses it (refusals then stay the workers'), and
    /// in relay mode, where the packets come in the steer nodes' Geneve, which it does not
    /// read.
    fn open_gate(&self) -> Option<Arc<Gate>> {
        if self.cfg.relay.is_some() {
            tracing::info!(
                "CPU fairness: relay mode; refused packets are dropped by the workers \
                 (the kernel gate does not read Geneve)"
            );
            return None;
        }
        let opened = Gate::new(self.workers).and_then(|g| {
            for l in &self.io.listen {
                g.attach(self.io.socks[l.natt].as_raw_fd(), Keyed::Spi)?;
            }
            for v in &self.io.vteps {
                g.attach(self.io.socks[v.recv].as_raw_fd(), Keyed::Vni)?;
            }
            Ok(g)
        });
        match opened {
            Ok(g) => {
                tracing::info!(
                    "CPU fairness: kernel gate attached (a refused tenant's datagrams are \
                     dropped before they reach the workers)"
                );
                Some(Arc::new(g))
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "CPU fairness: no kernel gate; refused packets are dropped by the workers"
                );
                None
            }
        }
    }

    /// The current attachments (a poisoned lock still holds a whole table: it is replaced in
    /// one store).
    fn attachments(&self) -> Arc<AttachTable> {
        Arc::clone(&self.attach.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Relay mode: replaces the attachments (validated whole first; CE MACs carried over by
    /// name, see [`AttachTable::on_steer_ports`]) and publishes them.
    pub(crate) fn set_attachments(
        &self,
        attachments: Vec<AttachmentConfig>,
    ) -> Result<(), DataplaneError> {
        if self.cfg.relay.is_none() {
            return Err(DataplaneError::Unsupported {
                operation: "set_attachments",
                reason: "attachments on local interfaces are fixed at start".into(),
            });
        }
        // The registry's lock orders this against other publications.
        let reg = self.registry();
        let table = {
            let mut current = self.attach.lock().unwrap_or_else(|p| p.into_inner());
            let table = Arc::new(AttachTable::on_steer_ports(&attachments, &current)?);
            *current = Arc::clone(&table);
            table
        };
        self.publish(&reg);
        drop(reg);
        tracing::info!(
            attachments = table.list.len(),
            ports = table.steer_ports.len(),
            "attachments replaced"
        );
        Ok(())
    }

    /// Sets the MAC of attachment `name`'s CE, learned by another data node.
    pub(crate) fn set_ce_mac(&self, name: &str, mac: [u8; 6]) -> Result<(), DataplaneError> {
        let table = self.attachments();
        let Some(a) = table.by_name(name) else {
            return Err(DataplaneError::Config {
                field: "attachment".into(),
                reason: format!("no attachment named {name:?}"),
            });
        };
        let mac = wire::ethernet::EthernetAddress(mac);
        if !mac.is_unicast() {
            return Err(DataplaneError::Config {
                field: "mac".into(),
                reason: format!("{mac} is not a unicast MAC"),
            });
        }
        if a.set_ce_reported(mac) {
            tracing::info!(attachment = %name, ce_mac = %mac, "CE MAC set by the control plane");
        }
        Ok(())
    }

    /// Hands a message to the control plane; false if it could not take it.
    pub(crate) fn tell_control(&self, msg: ToControl) -> bool {
        match self.to_control.try_send(msg) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
        }
    }

    /// True once shutdown began.
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}
