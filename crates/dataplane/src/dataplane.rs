//! [`Dataplane`]: opens the sockets and the TUN device, runs the worker threads (every worker
//! serves every input, see [`crate::worker`] and [`crate::lane`]), and implements
//! [`DataPath`] for the control plane. Workers block in `poll` on the inputs and the shutdown
//! eventfd; [`Dataplane::shutdown`] signals it and joins them.

use crate::api::{
    DataPath, DataplaneConfig, DataplaneError, DataplaneStats, ToControl, WorkerStats,
};
use crate::shared::Shared;
use crossbeam_channel::Sender;
use ike::{ChildSaInfo, IkeSpis, TunnelId};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use wire::esp::NON_ESP_MARKER;
use wire::EspSpi;

/// The addresses the data plane's sockets are bound to (ports the kernel picked included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundAddrs {
    /// IKE sockets.
    pub ike: Vec<SocketAddr>,
    /// NAT-T (IKE with marker, ESP) sockets.
    pub natt: Vec<SocketAddr>,
    /// VXLAN sockets, one per local VTEP.
    pub vxlan: Vec<SocketAddr>,
}

/// The data plane of one node. Start it with [`Dataplane::start`], drive it through
/// [`DataPath`], stop it with [`Dataplane::shutdown`] (also done on drop).
pub struct Dataplane {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Dataplane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataplane")
            .field("addrs", &self.local_addrs())
            .finish_non_exhaustive()
    }
}

impl Dataplane {
    /// Validates `cfg`, opens the sockets (and the TUN device if `tun_name` is set) and starts
    /// the I/O threads. IKE datagrams and rekey requests are sent on `to_control`.
    ///
    /// A port of 0 in `cfg` lets the kernel pick one per socket (tests); see
    /// [`local_addrs`](Self::local_addrs).
    pub fn start(
        cfg: DataplaneConfig,
        to_control: Sender<ToControl>,
    ) -> Result<Arc<Self>, DataplaneError> {
        let shared = Arc::new(Shared::open(cfg, to_control)?);
        let dp = Arc::new(Self {
            shared: Arc::clone(&shared),
            threads: Mutex::new(Vec::new()),
        });
        let mut threads = Vec::new();
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .map_err(|source| DataplaneError::Start { source })
        };
        let result = (|| {
            for (i, l) in shared.listen.iter().enumerate() {
                tracing::info!(ike = %shared.socks[l.ike].local_addr(), natt = %shared.socks[l.natt].local_addr(),
                    gro = shared.socks[l.natt].gro(), gso = shared.socks[l.natt].gso(), listen = i, "listening");
            }
            for v in &shared.vteps {
                tracing::info!(vtep = %shared.socks[v.recv].local_addr(), "VXLAN VTEP up");
            }
            if let Some(t) = &shared.tun {
                tracing::info!(device = t.name(), "TUN device up");
            }
            for id in 0..shared.workers {
                let sh = Arc::clone(&shared);
                threads.push(spawn(
                    format!("dp-worker{id}"),
                    Box::new(move || crate::worker::run(&sh, id)),
                )?);
            }
            let cpus: Vec<String> = shared
                .worker_cpus
                .iter()
                .map(|c| c.map_or_else(|| "-".to_owned(), |c| c.to_string()))
                .collect();
            tracing::info!(workers = shared.workers, cpus = %cpus.join(","), batch = shared.cfg.batch, "data plane workers started");
            Ok(())
        })();
        *dp.threads.lock().unwrap_or_else(|p| p.into_inner()) = threads;
        if let Err(e) = result {
            dp.shutdown();
            return Err(e);
        }
        Ok(dp)
    }

    /// Stops and joins the threads (idempotent). Sockets close when the last reference goes.
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.waker.wake();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            if t.join().is_err() {
                tracing::error!("a data plane thread panicked");
            }
        }
    }

    /// Where the sockets are bound.
    pub fn local_addrs(&self) -> BoundAddrs {
        let sh = &self.shared;
        BoundAddrs {
            ike: sh
                .listen
                .iter()
                .map(|l| sh.socks[l.ike].local_addr())
                .collect(),
            natt: sh
                .listen
                .iter()
                .map(|l| sh.socks[l.natt].local_addr())
                .collect(),
            vxlan: sh
                .vteps
                .iter()
                .map(|v| sh.socks[v.recv].local_addr())
                .collect(),
        }
    }

    /// The gateway MAC the VNet with configuration index `vnet` answers ARP/ND with.
    pub fn gateway_mac(&self, vnet: usize) -> Option<[u8; 6]> {
        self.shared.vnets.get(vnet).map(|v| v.mac.0)
    }
}

impl Drop for Dataplane {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl DataPath for Dataplane {
    fn install_child(&self, child: &ChildSaInfo) -> Result<(), DataplaneError> {
        self.shared.install_child(child)
    }

    fn remove_child(&self, tunnel: TunnelId, inbound_spi: EspSpi, outbound_spi: EspSpi) {
        self.shared.remove_child(tunnel, inbound_spi, outbound_spi);
    }

    fn update_peer(&self, tunnel: TunnelId, ike: IkeSpis, local: SocketAddr, remote: SocketAddr) {
        self.shared.update_peer(tunnel, ike, local, remote);
    }

    fn send_ike(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
        payload: &[u8],
    ) -> Result<(), DataplaneError> {
        let sh = &self.shared;
        let Some((sock, marker)) = sh.ike_sock(local) else {
            return Err(DataplaneError::Send {
                to: remote,
                source: io::Error::new(
                    io::ErrorKind::AddrNotAvailable,
                    format!("no IKE socket on {local}"),
                ),
            });
        };
        let sock = &sh.socks[sock];
        let result = if marker {
            // RFC 3948 §2.2: IKE on the NAT-T port is preceded by the 4-byte non-ESP marker.
            let mut buf = Vec::with_capacity(NON_ESP_MARKER.len() + payload.len());
            buf.extend_from_slice(&NON_ESP_MARKER);
            buf.extend_from_slice(payload);
            sock.send_to(&buf, remote)
        } else {
            sock.send_to(payload, remote)
        };
        result.map_err(|source| DataplaneError::Send { to: remote, source })
    }

    fn stats(&self) -> DataplaneStats {
        let sh = &self.shared;
        DataplaneStats {
            children: sh.registry().stats(),
            workers: sh
                .worker_stats
                .iter()
                .zip(&sh.worker_cpus)
                .map(|(w, cpu)| WorkerStats {
                    cpu: *cpu,
                    packets: w.packets.load(Ordering::Relaxed),
                    batches: w.batches.load(Ordering::Relaxed),
                })
                .collect(),
            drops: sh.drops.snapshot(),
        }
    }
}
