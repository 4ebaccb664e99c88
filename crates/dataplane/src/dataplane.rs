//! [`Dataplane`]: opens the sockets and the TUN device, runs one thread per listen address
//! (IKE and NAT-T sockets), per local VTEP and for the TUN device, and implements
//! [`DataPath`] for the control plane. Threads block in `poll` on their descriptors and the
//! shutdown eventfd; [`Dataplane::shutdown`] signals it and joins them.

use crate::api::{DataPath, DataplaneConfig, DataplaneError, DataplaneStats, ToControl};
use crate::batch::RX_SLOT;
use crate::path::{tun, underlay, vxlan};
use crate::shared::{Out, Shared, Worker};
use crate::stats::DropReason;
use crate::sys::waker::{wait, Ready};
use crossbeam_channel::Sender;
use ike::{ChildSaInfo, IkeSpis, TunnelId};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use wire::esp::NON_ESP_MARKER;
use wire::EspSpi;

/// Batches drained from one socket before the thread looks at its other descriptors.
const BATCHES_PER_WAKE: usize = 8;
/// Period of the neighbour cache housekeeping on VTEP threads.
const HOUSEKEEPING: Duration = Duration::from_millis(250);

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
                let sh = Arc::clone(&shared);
                threads.push(spawn(
                    format!("dp-udp{i}"),
                    Box::new(move || underlay_thread(&sh, i)),
                )?);
                tracing::info!(ike = %shared.socks[l.ike].local_addr(), natt = %shared.socks[l.natt].local_addr(),
                    gro = shared.socks[l.natt].gro(), gso = shared.socks[l.natt].gso(), "listening");
            }
            for (i, v) in shared.vteps.iter().enumerate() {
                let sh = Arc::clone(&shared);
                threads.push(spawn(
                    format!("dp-vtep{i}"),
                    Box::new(move || vtep_thread(&sh, i)),
                )?);
                tracing::info!(vtep = %shared.socks[v.recv].local_addr(), "VXLAN VTEP up");
            }
            if let Some(t) = &shared.tun {
                let sh = Arc::clone(&shared);
                tracing::info!(device = t.name(), "TUN device up");
                threads.push(spawn("dp-tun".into(), Box::new(move || tun_thread(&sh)))?);
            }
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
            drops: sh.drops.snapshot(),
        }
    }
}

/// Drains `sock` in batches, handing each datagram (GRO segments split) to `handle`.
fn drain(
    sh: &Shared,
    w: &mut Worker,
    sock: usize,
    mut handle: impl FnMut(
        &mut Out,
        &Shared,
        &crate::tables::Tables,
        Instant,
        SocketAddr,
        SocketAddr,
        &mut [u8],
    ),
) {
    let s = &sh.socks[sock];
    let local = s.local_addr();
    for _ in 0..BATCHES_PER_WAKE {
        let n = match s.recv_batch(&mut w.rx, &mut w.rx_scratch) {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(%local, error = %e, "receive failed");
                break;
            }
        };
        if n == 0 {
            break;
        }
        let tables = sh.tables.load();
        let now = Instant::now();
        for i in 0..n {
            let (meta, data) = w.rx.slot_mut(i);
            if meta.truncated {
                w.out.drop_packet(DropReason::Truncated);
                continue;
            }
            if data.is_empty() {
                w.out.drop_packet(DropReason::MalformedUdp);
                continue;
            }
            for segment in data.chunks_mut(meta.stride) {
                handle(&mut w.out, sh, &tables, now, local, meta.src, segment);
            }
        }
        w.out.flush(sh);
        if n < w.rx.capacity() {
            break;
        }
    }
}

fn underlay_thread(sh: &Shared, listen: usize) {
    let l = sh.listen[listen];
    let mut w = Worker::new(sh.cfg.batch);
    let fds = [sh.socks[l.ike].raw_fd(), sh.socks[l.natt].raw_fd()];
    loop {
        let mask = match wait(&fds, &sh.waker, None) {
            Ok(Ready::Shutdown) => return,
            Ok(Ready::Readable(mask)) => mask,
            Err(e) => {
                tracing::error!(error = %e, "poll failed; underlay thread stops");
                return;
            }
        };
        if mask & 1 != 0 {
            drain(sh, &mut w, l.ike, |o, sh, _, _, local, src, data| {
                underlay::ike(o, sh, local, src, data)
            });
        }
        if mask & 2 != 0 {
            drain(sh, &mut w, l.natt, underlay::natt);
        }
    }
}

fn vtep_thread(sh: &Shared, vtep: usize) {
    let mut w = Worker::new(sh.cfg.batch);
    let recv = sh.vteps[vtep].recv;
    let fds = [sh.socks[recv].raw_fd()];
    let mut next_tick = Instant::now() + HOUSEKEEPING;
    loop {
        let timeout = next_tick.saturating_duration_since(Instant::now());
        match wait(&fds, &sh.waker, Some(timeout)) {
            Ok(Ready::Shutdown) => return,
            Ok(Ready::Readable(mask)) => {
                if mask & 1 != 0 {
                    drain(sh, &mut w, recv, |o, sh, t, now, _, src, data| {
                        vxlan::receive(o, sh, t, now, vtep, src, data)
                    });
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "poll failed; VTEP thread stops");
                return;
            }
        }
        let now = Instant::now();
        if now >= next_tick {
            vxlan::housekeeping(&mut w.out, sh, vtep, now);
            w.out.flush(sh);
            next_tick = now + HOUSEKEEPING;
        }
    }
}

fn tun_thread(sh: &Shared) {
    let Some(dev) = &sh.tun else { return };
    let mut out = Out::new(sh.cfg.batch);
    let mut buf = vec![0u8; RX_SLOT];
    let fds = [dev.raw_fd()];
    loop {
        match wait(&fds, &sh.waker, None) {
            Ok(Ready::Shutdown) => return,
            Ok(Ready::Readable(_)) => {}
            Err(e) => {
                tracing::error!(error = %e, "poll failed; TUN thread stops");
                return;
            }
        }
        for _ in 0..BATCHES_PER_WAKE {
            let tables = sh.tables.load();
            let mut read = 0;
            while read < sh.cfg.batch {
                match dev.read(&mut buf) {
                    Ok(Some(n)) => tun::outbound(&mut out, sh, &tables, &buf[..n]),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(device = dev.name(), error = %e, "TUN read failed");
                        break;
                    }
                }
                read += 1;
            }
            out.flush(sh);
            if read < sh.cfg.batch {
                break;
            }
        }
    }
}
