//! State shared by the data plane's threads and its control interface: the validated
//! configuration, the socket table, the VNets, the published SA tables and the counters; and
//! the per-thread [`Worker`] holding a thread's batches and scratch space.

use crate::api::{DataplaneConfig, DataplaneError, Inside, ToControl};
use crate::batch::RX_SLOT;
use crate::lane::{Lane, LaneKind};
use crate::pool::TxPool;
use crate::stats::{DropCounters, WorkerCounters};
use crate::sys::socket::{SocketOptions, UdpSocket};
use crate::sys::tun::Tun;
use crate::sys::tun_offload::Offloads;
use crate::sys::waker::Waker;
use crate::tables::{Published, Registry};
use crate::vnet::Vnet;
use crossbeam_channel::{Sender, TrySendError};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;
use wire::vxlan::Vni;

pub(crate) use crate::out::Out;

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
/// Ethernet toward hosts, or ESP header, IV, padding and ICV toward peers; ARP/ND answers).
const TX_SLACK_PER_PACKET: usize = 128;

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

/// Source ports per VTEP for VXLAN toward hosts: the flow hash picks one (RFC 7348 §5).
pub(crate) const VXLAN_SOURCE_PORTS: usize = 16;

/// One local VTEP: the socket on the VXLAN port that receives from hosts, and the sockets
/// on ephemeral ports whose source ports carry the flow entropy.
#[derive(Debug, Clone)]
pub(crate) struct Vtep {
    /// Underlay address.
    pub(crate) ip: IpAddr,
    /// Socket index of the receiving socket (also sends ARP/ND).
    pub(crate) recv: usize,
    /// Socket indexes of the source-port pool.
    pub(crate) pool: Vec<usize>,
}

/// A listen address: its IKE and NAT-T sockets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Listen {
    /// Address.
    pub(crate) ip: IpAddr,
    /// Socket index on the IKE port.
    pub(crate) ike: usize,
    /// Socket index on the NAT-T port.
    pub(crate) natt: usize,
}

/// Everything the threads share.
pub(crate) struct Shared {
    /// The configuration as given.
    pub(crate) cfg: DataplaneConfig,
    /// Every socket; messages name them by index.
    pub(crate) socks: Vec<Arc<UdpSocket>>,
    /// Listen addresses.
    pub(crate) listen: Vec<Listen>,
    /// Local VTEPs.
    pub(crate) vteps: Vec<Vtep>,
    /// VNets, by configuration index.
    pub(crate) vnets: Vec<Vnet>,
    /// (VTEP index, VNI) -> VNet index.
    pub(crate) vni_index: HashMap<(usize, Vni), usize>,
    /// The TUN device, if configured.
    pub(crate) tun: Option<Tun>,
    /// SA tables for the packet path.
    pub(crate) tables: Published,
    /// SA registry for the control path.
    registry: Mutex<Registry>,
    /// Drop counters.
    pub(crate) drops: DropCounters,
    /// Messages to the control plane.
    pub(crate) to_control: Sender<ToControl>,
    /// Shutdown signal.
    pub(crate) waker: Waker,
    /// One lane per input (IKE and NAT-T sockets, VTEP sockets, TUN device).
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
    /// Set at shutdown (workers busy with full batches check it between batches).
    pub(crate) stop: AtomicBool,
}

fn config_err(field: impl Into<String>, reason: impl Into<String>) -> DataplaneError {
    DataplaneError::Config {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Checks the configuration as a whole before anything is opened.
pub(crate) fn validate(cfg: &DataplaneConfig) -> Result<(), DataplaneError> {
    if cfg.listen.is_empty() {
        return Err(config_err("listen", "at least one address is needed"));
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
    for (i, v) in cfg.vnets.iter().enumerate() {
        if cfg.vnets[..i]
            .iter()
            .any(|o| o.vni == v.vni && o.vtep == v.vtep)
        {
            return Err(config_err(
                format!("vnets[{i}].vni"),
                format!("VNI {} is used twice on VTEP {}", v.vni, v.vtep),
            ));
        }
        if cfg.vnets[..i]
            .iter()
            .any(|o| o.tenant == v.tenant && o.name == v.name)
        {
            return Err(config_err(
                format!("vnets[{i}].name"),
                format!("{}/{} is defined twice", v.tenant, v.name),
            ));
        }
        if v.vtep.is_unspecified() || v.vtep.is_multicast() {
            return Err(config_err(
                format!("vnets[{i}].vtep"),
                format!("{} is not a unicast address", v.vtep),
            ));
        }
    }
    if !cfg.vnets.is_empty() && cfg.vxlan_port == 0 {
        return Err(config_err(
            "vxlan_port",
            "must not be 0 (hosts are addressed on it)",
        ));
    }
    for (i, t) in cfg.tunnels.iter().enumerate() {
        if cfg.tunnels[..i].iter().any(|o| o.tunnel == t.tunnel) {
            return Err(config_err(
                format!("tunnels[{i}].tunnel"),
                format!("{:?} is bound twice", t.tunnel),
            ));
        }
        match &t.inside {
            Inside::Vnet(v) => {
                let Some(vnet) = cfg.vnets.get(*v) else {
                    return Err(config_err(
                        format!("tunnels[{i}].inside"),
                        format!("VNet index {v} does not exist"),
                    ));
                };
                if vnet.tenant != t.tenant {
                    return Err(config_err(
                        format!("tunnels[{i}].inside"),
                        format!(
                            "VNet {} belongs to tenant {}, not {}",
                            vnet.name, vnet.tenant, t.tenant
                        ),
                    ));
                }
            }
            Inside::Tun => {
                if cfg.tun_name.is_none() {
                    return Err(config_err(
                        format!("tunnels[{i}].inside"),
                        "inside = tun needs tun_name",
                    ));
                }
            }
        }
    }
    Ok(())
}

impl Shared {
    /// Validates `cfg` and opens every socket and the TUN device.
    pub(crate) fn open(
        cfg: DataplaneConfig,
        to_control: Sender<ToControl>,
    ) -> Result<Self, DataplaneError> {
        validate(&cfg)?;
        let mut vteps: Vec<Vtep> = Vec::new();
        let mut vnets = Vec::with_capacity(cfg.vnets.len());
        let mut vni_index = HashMap::new();
        for (i, v) in cfg.vnets.iter().enumerate() {
            let vtep = match vteps.iter().position(|t| t.ip == v.vtep) {
                Some(t) => t,
                None => {
                    vteps.push(Vtep {
                        ip: v.vtep,
                        recv: 0,
                        pool: Vec::new(),
                    });
                    vteps.len() - 1
                }
            };
            let vnet = Vnet::new(i, v, vtep)?;
            vni_index.insert((vtep, vnet.vni), i);
            vnets.push(vnet);
        }
        let mut socks = Vec::new();
        let mut open = |addr: SocketAddr, opts: SocketOptions| -> Result<usize, DataplaneError> {
            let s = UdpSocket::bind(addr, opts)
                .map_err(|source| DataplaneError::Bind { addr, source })?;
            socks.push(Arc::new(s));
            Ok(socks.len() - 1)
        };
        let esp_opts = SocketOptions {
            gro: true,
            gso: true,
            recv: true,
        };
        let mut listen = Vec::with_capacity(cfg.listen.len());
        for ip in &cfg.listen {
            let ike = open(
                SocketAddr::new(*ip, cfg.ike_port),
                SocketOptions {
                    gro: false,
                    gso: false,
                    recv: true,
                },
            )?;
            let natt = open(SocketAddr::new(*ip, cfg.natt_port), esp_opts)?;
            listen.push(Listen { ip: *ip, ike, natt });
        }
        for vtep in &mut vteps {
            vtep.recv = open(SocketAddr::new(vtep.ip, cfg.vxlan_port), esp_opts)?;
            for _ in 0..VXLAN_SOURCE_PORTS {
                let s = open(
                    SocketAddr::new(vtep.ip, 0),
                    SocketOptions {
                        gro: false,
                        gso: true,
                        recv: false,
                    },
                )?;
                vtep.pool.push(s);
            }
        }
        let tun =
            match &cfg.tun_name {
                Some(name) => Some(Tun::open_with(name, Offloads::ALL).map_err(|source| {
                    DataplaneError::Tun {
                        name: name.clone(),
                        source,
                    }
                })?),
                None => None,
            };
        let waker = Waker::new().map_err(|source| DataplaneError::Start { source })?;
        let registry = Mutex::new(Registry::new(vnets.len()));
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
        let mut lanes = Vec::new();
        for (i, l) in listen.iter().enumerate() {
            for (kind, sock) in [
                (LaneKind::Ike { listen: i }, l.ike),
                (LaneKind::Natt { listen: i }, l.natt),
            ] {
                lanes.push(Lane::new(
                    kind,
                    socks[sock].raw_fd(),
                    in_flight,
                    POOL_BATCHES,
                ));
            }
        }
        for (i, v) in vteps.iter().enumerate() {
            lanes.push(Lane::new(
                LaneKind::Vtep { vtep: i },
                socks[v.recv].raw_fd(),
                in_flight,
                POOL_BATCHES,
            ));
        }
        if let Some(t) = &tun {
            lanes.push(Lane::new(
                LaneKind::Tun,
                t.raw_fd(),
                in_flight,
                POOL_BATCHES,
            ));
        }
        Ok(Self {
            cfg,
            socks,
            listen,
            vteps,
            vnets,
            vni_index,
            tun,
            tables: Published::default(),
            registry,
            drops: DropCounters::default(),
            to_control,
            waker,
            lanes,
            workers,
            worker_cpus,
            pools,
            worker_stats: (0..workers).map(|_| WorkerCounters::default()).collect(),
            housekeeping: Mutex::new(Instant::now() + crate::worker::HOUSEKEEPING),
            stop: AtomicBool::new(false),
        })
    }

    /// The registry (a poisoned lock still holds a consistent registry: every edit is one
    /// map operation).
    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes the registry's current state to the packet path.
    pub(crate) fn publish(&self, reg: &Registry) {
        self.tables.store(reg.snapshot());
    }

    /// The NAT-T socket on `ip`.
    pub(crate) fn natt_sock(&self, ip: IpAddr) -> Option<usize> {
        self.listen.iter().find(|l| l.ip == ip).map(|l| l.natt)
    }

    /// The socket for sending IKE from `local`: (socket, add the non-ESP marker).
    pub(crate) fn ike_sock(&self, local: SocketAddr) -> Option<(usize, bool)> {
        let family_match = |l: &&Listen| {
            l.ip == local.ip() || (local.ip().is_unspecified() && l.ip.is_ipv4() == local.is_ipv4())
        };
        self.listen.iter().filter(family_match).find_map(|l| {
            if self.socks[l.natt].local_addr().port() == local.port() {
                Some((l.natt, true))
            } else if self.socks[l.ike].local_addr().port() == local.port() {
                Some((l.ike, false))
            } else {
                None
            }
        })
    }

    /// Hands a message to the control plane; false if it could not take it.
    pub(crate) fn tell_control(&self, msg: ToControl) -> bool {
        match self.to_control.try_send(msg) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
        }
    }
}
