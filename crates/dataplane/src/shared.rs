//! State shared by the data plane's threads and its control interface: the validated
//! configuration, the socket table, the VNets, the published SA tables and the counters; and
//! the per-thread [`Worker`] holding a thread's batches and scratch space.

use crate::api::{DataplaneConfig, DataplaneError, Inside, ToControl};
use crate::batch::{RxBatch, TxBatch, RX_SLOT};
use crate::stats::{DropCounters, DropCounts, DropReason};
use crate::sys::socket::{RecvScratch, SendScratch, SocketOptions, UdpSocket};
use crate::sys::tun::Tun;
use crate::sys::waker::Waker;
use crate::tables::{Published, Registry};
use crate::vnet::neigh::NeighMemo;
use crate::vnet::Vnet;
use crossbeam_channel::{Sender, TrySendError};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use wire::vxlan::Vni;

/// Most receive slots per thread (64 KiB each).
pub(crate) const MAX_RX_SLOTS: usize = 64;

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
        let tun = match &cfg.tun_name {
            Some(name) => Some(Tun::open(name).map_err(|source| DataplaneError::Tun {
                name: name.clone(),
                source,
            })?),
            None => None,
        };
        let waker = Waker::new().map_err(|source| DataplaneError::Start { source })?;
        let registry = Mutex::new(Registry::new(vnets.len()));
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

/// A thread's working set: the receive batch and what the paths produce.
pub(crate) struct Worker {
    /// Received datagrams.
    pub(crate) rx: RxBatch,
    /// recvmmsg scratch.
    pub(crate) rx_scratch: RecvScratch,
    /// Output side.
    pub(crate) out: Out,
}

impl Worker {
    /// A worker for batches of `batch` datagrams. Receive slots hold a GRO train of up to
    /// 64 KiB each, so at most [`MAX_RX_SLOTS`] are kept per thread.
    pub(crate) fn new(batch: usize) -> Self {
        let slots = batch.clamp(1, MAX_RX_SLOTS);
        Self {
            rx: RxBatch::new(slots),
            rx_scratch: RecvScratch::new(slots),
            out: Out::new(batch),
        }
    }
}

/// What the packet paths write to: the send batch and the batch's counters.
pub(crate) struct Out {
    /// Datagrams to send.
    pub(crate) tx: TxBatch,
    /// sendmmsg scratch.
    tx_scratch: SendScratch,
    /// Drops of the current batch.
    pub(crate) drops: DropCounts,
    /// Addresses the neighbour caches want requests sent for.
    pub(crate) requests: Vec<IpAddr>,
    /// Recent resolutions (decrypted packets toward VMs).
    pub(crate) resolved: NeighMemo,
    /// Recent learnings (frames from VMs).
    pub(crate) learned: NeighMemo,
}

impl Out {
    /// Output for batches of `batch` datagrams.
    pub(crate) fn new(batch: usize) -> Self {
        Self {
            // The paths flush whenever the next datagram might not fit, so the buffer only
            // needs to hold one maximal datagram beyond a batch of typical ones.
            tx: TxBatch::new(batch * 8, (batch * 4096).max(4 * RX_SLOT), true),
            tx_scratch: SendScratch::default(),
            drops: DropCounts::default(),
            requests: Vec::new(),
            resolved: NeighMemo::default(),
            learned: NeighMemo::default(),
        }
    }

    /// Counts a drop.
    pub(crate) fn drop_packet(&mut self, reason: DropReason) {
        self.drops.add(reason);
    }

    /// Room for a datagram of up to `max` bytes, flushing first if needed; None (counted as
    /// too big) if it cannot fit even an empty batch.
    pub(crate) fn room(&mut self, sh: &Shared, max: usize) -> Option<&mut [u8]> {
        if self.tx.needs_flush(max) {
            self.flush(sh);
        }
        if self.tx.needs_flush(max) {
            self.drops.add(DropReason::TooBig);
            return None;
        }
        self.tx.room(max)
    }

    /// Sends everything queued and publishes the local counters.
    pub(crate) fn flush(&mut self, sh: &Shared) {
        let msgs = self.tx.messages();
        let mut i = 0;
        while i < msgs.len() {
            let sock = msgs[i].sock;
            let mut j = i + 1;
            while j < msgs.len() && msgs[j].sock == sock {
                j += 1;
            }
            match sh.socks.get(sock) {
                Some(s) => {
                    let r = s.send_batch(self.tx.data(), &msgs[i..j], &mut self.tx_scratch);
                    self.drops.add_n(DropReason::SendError, r.failed);
                }
                None => {
                    let n: usize = msgs[i..j].iter().map(|m| m.segments()).sum();
                    self.drops.add_n(DropReason::NoSocket, n as u64);
                }
            }
            i = j;
        }
        self.tx.clear();
        sh.drops.absorb(&mut self.drops);
    }
}
