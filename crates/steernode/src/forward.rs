//! The forwarding threads: one for the VIP sockets (IKE and ESP from peers), one for the
//! underlay sockets (VXLAN from hosts, Geneve from nodes, health probes) and, if the node has
//! customer-facing ports, one for their AF_PACKET rings (customers' tagged frames). Each
//! receives a batch (`recvmmsg`, or the frames a ring holds), decides per datagram or frame
//! with [`crate::classify`], builds the Geneve frames (or relayed datagrams) into one send
//! batch and sends it with `sendmmsg`. Customers' frames from data nodes leave by their port
//! with one `sendmmsg` per port and batch.
//!
//! Per batch a thread takes the table snapshot once and, only if the batch needs them, the
//! health monitor's lock and its direction's rate-limit lock once; no lock is taken per
//! packet. Forwarded datagrams are counted when queued; send failures are counted apart.

use rustc_hash::FxHashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use netio::packet::{FrameBatch, PacketScratch, PacketSocket};
use steer::{NodeId, PortId, TunnelId};
use wire::geneve::{GeneveBuilder, GeneveRepr, HealthProbe, ProtegoOption, GENEVE_HEADER_LEN};
use wire::relay;
use wire::vxlan::Vni;

use crate::classify::{self, VxlanAction, WanAction, WanPort};
use crate::health::Health;
use crate::hold::{Hold, HOLD_POLL};
use crate::limits::Direction;
use crate::stats::{AttachCount, AttachCounters, AttachTally, Counters, DropReason, ForwardKind};
use crate::sys::{recv_batch, Poller, Ready, TxBatch, UdpSocket, Waker};
use crate::tables::{Published, Sender, Tables};
use netio::RecvBatch;
use std::os::fd::AsRawFd;

/// Longest wait of the VIP thread's poll (it has no timers; the waker ends it).
const WAN_IDLE: Duration = Duration::from_millis(100);
/// Longest and shortest time between two health ticks of the underlay thread.
const TICK_MAX: Duration = Duration::from_millis(5);
const TICK_MIN: Duration = Duration::from_millis(1);
/// Geneve options a forwarded frame may carry: tunnel id (8 bytes) and probe (12 bytes).
const OPTIONS_MAX: usize = 8 + 12;

/// What a socket is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A VIP's IKE socket.
    Ike,
    /// A VIP's NAT-T socket.
    NatT,
    /// The VTEP socket.
    Vxlan,
    /// The Geneve socket.
    Geneve,
}

/// Everything the threads and the control interface share.
pub(crate) struct Shared {
    /// Every socket; messages name them by index.
    pub(crate) socks: Vec<UdpSocket>,
    /// What each socket is for.
    pub(crate) roles: Vec<Role>,
    /// Index of the Geneve socket.
    pub(crate) geneve: usize,
    /// Index of the VXLAN socket.
    pub(crate) vxlan: usize,
    /// VIP socket address -> socket index.
    pub(crate) vip_socks: FxHashMap<SocketAddr, usize>,
    /// The steering tables.
    pub(crate) tables: Published,
    /// Failure detection.
    pub(crate) health: Mutex<Health>,
    /// Inbound (ESP) rate limits.
    pub(crate) inbound: Mutex<Direction>,
    /// Outbound rate limits: VXLAN from hosts, and CEs' packets into tunnels (one bucket per
    /// tunnel for both, so the port and underlay threads share this lock, each once per batch
    /// at most).
    pub(crate) outbound: Mutex<Direction>,
    /// The VIP thread's counters.
    pub(crate) wan_counters: Counters,
    /// The underlay thread's counters.
    pub(crate) underlay_counters: Counters,
    /// The port thread's counters.
    pub(crate) port_counters: Counters,
    /// The port thread's per-attachment counters (frames from CEs).
    pub(crate) port_attach: AttachCounters,
    /// The underlay thread's per-attachment counters (frames to CEs).
    pub(crate) underlay_attach: AttachCounters,
    /// Customer-facing ports.
    pub(crate) ports: Vec<Port>,
    /// Shutdown signal.
    pub(crate) waker: Waker,
    /// Datagrams per batch.
    pub(crate) batch: usize,
}

/// A customer-facing port: its id on this node and its packet socket.
pub(crate) struct Port {
    /// Its id on this node.
    pub(crate) id: PortId,
    /// Its AF_PACKET socket (receive ring, sendmmsg).
    pub(crate) sock: PacketSocket,
}

impl Shared {
    /// This node's index of port `id`, if it owns it (a handful of ports: a scan).
    fn own_port(&self, id: PortId) -> Option<usize> {
        self.ports.iter().position(|p| p.id == id)
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("sockets", &self.socks.len())
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

/// Locks a mutex, taking over the data of a poisoned one (its holder panicked mid-update of
/// counters or probes; the data stays usable).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One batch's context: the snapshot, the clock and the locks taken so far.
struct Batch<'a> {
    sh: &'a Shared,
    tables: Arc<Tables>,
    now: Instant,
    counters: &'a Counters,
    direction: &'a Mutex<Direction>,
    health: Option<MutexGuard<'a, Health>>,
    limits: Option<MutexGuard<'a, Direction>>,
}

impl<'a> Batch<'a> {
    fn new(sh: &'a Shared, counters: &'a Counters, direction: &'a Mutex<Direction>) -> Self {
        Self {
            sh,
            tables: sh.tables.load(),
            now: Instant::now(),
            counters,
            direction,
            health: None,
            limits: None,
        }
    }

    fn health(&mut self) -> &mut Health {
        let sh = self.sh;
        self.health.get_or_insert_with(|| lock(&sh.health))
    }

    /// Checks that `node` is known and alive, then (with a tunnel) charges its rate limit,
    /// then asks the monitor whether the packet carries a probe.
    fn admit_to_node(
        &mut self,
        node: NodeId,
        tunnel: Option<TunnelId>,
        bytes: usize,
    ) -> Result<(SocketAddr, Option<HealthProbe>), DropReason> {
        let addr = *self
            .tables
            .nodes
            .get(&node)
            .ok_or(DropReason::UnknownNode)?;
        let now = self.now;
        match self.health().is_alive(node) {
            Some(true) => {}
            Some(false) => return Err(DropReason::NodeDead),
            None => return Err(DropReason::UnknownNode),
        }
        if let Some(t) = tunnel {
            let dir = self.direction;
            let limits = self.limits.get_or_insert_with(|| lock(dir));
            if !limits.admit(t, now, bytes) {
                return Err(DropReason::RateLimited);
            }
        }
        let probe = self.health().on_forward(node, now);
        if probe.is_some() {
            self.counters.forwarded(ForwardKind::ProbesOnPackets, 1);
        }
        Ok((addr, probe))
    }

    /// Queues ESP datagram `rcv` to the data node of its SPI `entry` (admitted as
    /// [`Self::admit_to_node`] does, with the tunnel option).
    fn esp_to_node(
        &mut self,
        tx: &mut TxBatch,
        entry: steer::SpiEntry,
        rcv: Received<'_>,
    ) -> Result<(), DropReason> {
        let (addr, probe) =
            self.admit_to_node(entry.node, Some(entry.tunnel), rcv.payload.len())?;
        push_frame(
            tx,
            self.sh.geneve,
            addr,
            Vni::default(),
            Some(entry.tunnel),
            probe,
            rcv,
        )
    }

    /// Reports deaths noticed during the batch and releases the locks.
    fn finish(mut self) {
        let now = self.now;
        if let Some(h) = self.health.as_mut() {
            h.flush(now);
        }
    }
}

/// A received datagram: who sent it, which of our addresses it came to, its UDP payload.
#[derive(Clone, Copy)]
struct Received<'p> {
    src: SocketAddr,
    local: SocketAddr,
    payload: &'p [u8],
}

/// Queues a Geneve frame to `dst` carrying the datagram `d` (rebuilt with its IP and UDP
/// headers), with the tunnel and probe options given.
fn push_frame(
    tx: &mut TxBatch,
    sock: usize,
    dst: SocketAddr,
    vni: Vni,
    tunnel: Option<TunnelId>,
    probe: Option<HealthProbe>,
    d: Received<'_>,
) -> Result<(), DropReason> {
    let Received {
        src,
        local,
        payload,
    } = d;
    let mut options = [ProtegoOption::TunnelId(0); 2];
    let mut n = 0;
    if let Some(t) = tunnel {
        options[n] = ProtegoOption::TunnelId(t.0);
        n += 1;
    }
    if let Some(p) = probe {
        options[n] = ProtegoOption::Probe(p);
        n += 1;
    }
    let max = GENEVE_HEADER_LEN + OPTIONS_MAX + relay::header_len(src.is_ipv6()) + payload.len();
    tx.push(sock, dst, max, |buf| {
        relay::emit_frame(buf, vni, &options[..n], src, local, payload)
    })
    .map_err(|_| DropReason::FrameTooLarge)
}

/// Queues an explicit probe: a Geneve control frame with a probe option and no payload.
fn push_probe(tx: &mut TxBatch, sock: usize, dst: SocketAddr, probe: HealthProbe) -> bool {
    let repr = GeneveRepr {
        control: true,
        protocol_type: relay::protocol_type(dst.is_ipv6()),
        vni: Vni::default(),
    };
    tx.push(sock, dst, GENEVE_HEADER_LEN + OPTIONS_MAX, |buf| {
        let mut b = GeneveBuilder::new(buf, &repr)?;
        b.push_protego(&ProtegoOption::Probe(probe))?;
        Ok::<usize, wire::error::WireError>(b.finish())
    })
    .is_ok()
}

/// Sends everything queued in `tx`, socket by socket.
fn flush(sh: &Shared, tx: &mut TxBatch, counters: &Counters) {
    if tx.is_empty() {
        return;
    }
    let mut socks: Vec<usize> = Vec::new();
    for s in tx.sockets() {
        if !socks.contains(&s) {
            socks.push(s);
        }
    }
    for s in socks {
        if let Some(sock) = sh.socks.get(s) {
            let report = tx.send(sock, s);
            counters.dropped(DropReason::SendFailed, report.failed);
        }
    }
    tx.clear();
}

/// Receives one batch from socket `si`; false if there was nothing (or an error, counted).
fn receive(sh: &Shared, si: usize, rx: &mut RecvBatch, counters: &Counters) -> bool {
    match sh.socks[si].recv_batch(rx) {
        Ok(n) => n > 0,
        Err(e) => {
            counters.dropped(DropReason::ReceiveError, 1);
            tracing::debug!(local = %sh.socks[si].local_addr(), error = %e, "receive failed");
            false
        }
    }
}

/// Waits on `poller`; false at shutdown.
fn wait(poller: &mut Poller, timeout: Duration) -> bool {
    match poller.wait(Some(timeout)) {
        Ok(Ready::Shutdown) => false,
        Ok(Ready::Readable) => true,
        Err(e) => {
            tracing::error!(error = %e, "poll failed");
            std::thread::sleep(TICK_MAX);
            true
        }
    }
}

/// The VIP thread: IKE to the control node, ESP to data nodes.
pub(crate) fn run_wan(sh: Arc<Shared>) {
    let counters = &sh.wan_counters;
    let socks: Vec<usize> = (0..sh.socks.len())
        .filter(|&i| matches!(sh.roles[i], Role::Ike | Role::NatT))
        .collect();
    let fds: Vec<_> = socks.iter().map(|&i| sh.socks[i].as_raw_fd()).collect();
    let mut poller = Poller::new(&fds, &sh.waker);
    let mut rx = recv_batch(sh.batch);
    let mut tx = TxBatch::with_capacity(sh.batch * 2048);
    let mut hold = Hold::default();
    loop {
        let idle = if hold.is_empty() { WAN_IDLE } else { HOLD_POLL };
        if !wait(&mut poller, idle) {
            return;
        }
        // What was held for SPIs steered since goes first, in arrival order.
        if !hold.is_empty() {
            release_held(&sh, &mut hold, &mut tx);
            flush(&sh, &mut tx, counters);
        }
        for (pi, &si) in socks.iter().enumerate() {
            if poller.readable(pi) && receive(&sh, si, &mut rx, counters) {
                wan_batch(&sh, si, &rx, &mut tx, &mut hold);
                flush(&sh, &mut tx, counters);
            }
        }
    }
}

/// The SPI of an ESP datagram the classifier took as ESP (at least an ESP header long).
fn esp_spi(payload: &[u8]) -> wire::EspSpi {
    let mut spi = [0; 4];
    spi.copy_from_slice(&payload[..4]);
    wire::EspSpi(u32::from_be_bytes(spi))
}

/// Sends on the held ESP whose SPI is steered now; drops what waited too long.
fn release_held(sh: &Shared, hold: &mut Hold, tx: &mut TxBatch) {
    let counters = &sh.wan_counters;
    let mut b = Batch::new(sh, counters, &sh.inbound);
    let released = hold.release(&b.tables, b.now);
    counters.dropped(DropReason::UnknownSpi, released.expired);
    counters.dropped(DropReason::NodeDead, released.expired_dead);
    for h in released.ready {
        let Some(entry) = b.tables.spis.lookup(h.spi) else {
            continue;
        };
        let rcv = Received {
            src: h.src,
            local: h.local,
            payload: &h.payload,
        };
        match b.esp_to_node(tx, entry, rcv) {
            Ok(()) => counters.forwarded(ForwardKind::EspToData, 1),
            Err(DropReason::NodeDead) => {
                let now = b.now;
                if !hold.wait_for_node(h, now) {
                    counters.dropped(DropReason::NodeDead, 1);
                }
            }
            Err(r) => counters.dropped(r, 1),
        }
    }
    b.finish();
}

/// Forwards one batch received on VIP socket `si`.
fn wan_batch(sh: &Shared, si: usize, rx: &RecvBatch, tx: &mut TxBatch, hold: &mut Hold) {
    let counters = &sh.wan_counters;
    let port = if sh.roles[si] == Role::Ike {
        WanPort::Ike
    } else {
        WanPort::NatT
    };
    let local = sh.socks[si].local_addr();
    let mut b = Batch::new(sh, counters, &sh.inbound);
    for (meta, data) in rx.iter() {
        let Some(src) = meta.src.filter(|_| !meta.truncated) else {
            counters.dropped(DropReason::BadReceive, 1);
            continue;
        };
        let rcv = Received {
            src,
            local,
            payload: data,
        };
        let result = match classify::wan(port, data, &b.tables) {
            WanAction::Control(control) => {
                push_frame(tx, sh.geneve, control, Vni::default(), None, None, rcv)
                    .map(|()| ForwardKind::IkeToControl)
            }
            WanAction::Data(entry) => match b.esp_to_node(tx, entry, rcv) {
                Ok(()) => Ok(ForwardKind::EspToData),
                // Its node is declared dead: held a moment, it may answer its probes again (a
                // node that restarted, just given a CHILD_SA); dropped as before after it.
                Err(DropReason::NodeDead)
                    if hold.push_for_node(esp_spi(data), b.now, (src, local), data) =>
                {
                    Ok(ForwardKind::EspHeld)
                }
                Err(r) => Err(r),
            },
            WanAction::UnknownSpi(spi) => {
                if hold.push(spi, b.now, (src, local), data) {
                    Ok(ForwardKind::EspHeld)
                } else {
                    Err(DropReason::UnknownSpi)
                }
            }
            WanAction::Keepalive => Ok(ForwardKind::NatKeepalives),
            WanAction::Drop(r) => Err(r),
        };
        match result {
            Ok(kind) => counters.forwarded(kind, 1),
            Err(r) => counters.dropped(r, 1),
        }
    }
    b.finish();
}

/// The underlay thread: VXLAN from hosts, Geneve from nodes, health ticks.
pub(crate) fn run_underlay(sh: Arc<Shared>) {
    let counters = &sh.underlay_counters;
    let socks = [sh.vxlan, sh.geneve];
    let fds = socks.map(|i| sh.socks[i].as_raw_fd());
    let mut poller = Poller::new(&fds, &sh.waker);
    let mut rx = recv_batch(sh.batch);
    let mut tx = TxBatch::with_capacity(sh.batch * 2048);
    let mut scratch = PacketScratch::default();
    let mut tally = AttachTally::default();
    let mut next_tick = Instant::now();
    loop {
        let now = Instant::now();
        if now >= next_tick {
            next_tick = tick(&sh, now, &mut tx);
            flush(&sh, &mut tx, counters);
        }
        if !wait(
            &mut poller,
            next_tick.saturating_duration_since(Instant::now()),
        ) {
            return;
        }
        if poller.readable(0) && receive(&sh, sh.vxlan, &mut rx, counters) {
            vxlan_batch(&sh, &rx, &mut tx);
            flush(&sh, &mut tx, counters);
        }
        if poller.readable(1) && receive(&sh, sh.geneve, &mut rx, counters) {
            geneve_batch(&sh, &rx, &mut tx, &mut scratch, &mut tally);
            flush(&sh, &mut tx, counters);
        }
    }
}

/// Runs the health monitor's timers: queues the explicit probes due and reports deaths.
/// Returns when to tick next.
fn tick(sh: &Shared, now: Instant, tx: &mut TxBatch) -> Instant {
    let tables = sh.tables.load();
    let (probes, next) = {
        let mut h = lock(&sh.health);
        let probes = h.on_tick(now);
        h.flush(now);
        (probes, h.poll_timeout())
    };
    let mut sent = 0;
    for (node, probe) in probes {
        if let Some(&addr) = tables.nodes.get(&node) {
            if push_probe(tx, sh.geneve, addr, probe) {
                sent += 1;
            }
        }
    }
    sh.underlay_counters
        .forwarded(ForwardKind::ProbeFrames, sent);
    let earliest = now + TICK_MIN;
    let latest = now + TICK_MAX;
    next.map_or(latest, |t| t.clamp(earliest, latest))
}

/// Forwards one batch of VXLAN datagrams from hosts.
fn vxlan_batch(sh: &Shared, rx: &RecvBatch, tx: &mut TxBatch) {
    let counters = &sh.underlay_counters;
    let local = sh.socks[sh.vxlan].local_addr();
    let mut b = Batch::new(sh, counters, &sh.outbound);
    let tables = Arc::clone(&b.tables);
    for (meta, data) in rx.iter() {
        let Some(src) = meta.src.filter(|_| !meta.truncated) else {
            counters.dropped(DropReason::BadReceive, 1);
            continue;
        };
        let rcv = Received {
            src,
            local,
            payload: data,
        };
        match classify::vxlan(data, &tables) {
            VxlanAction::Data(vni, entry) => {
                let r = b
                    .admit_to_node(entry.node, entry.tunnel, data.len())
                    .and_then(|(addr, probe)| {
                        push_frame(tx, sh.geneve, addr, vni, entry.tunnel, probe, rcv)
                    });
                match r {
                    Ok(()) => counters.forwarded(ForwardKind::VxlanToData, 1),
                    Err(r) => counters.dropped(r, 1),
                }
            }
            VxlanAction::Neighbours(vni, nodes) => {
                let mut frames = 0;
                for &node in nodes {
                    // Dead or unknown neighbours are skipped: the others answer.
                    let Ok((addr, probe)) = b.admit_to_node(node, None, data.len()) else {
                        continue;
                    };
                    match push_frame(tx, sh.geneve, addr, vni, None, probe, rcv) {
                        Ok(()) => frames += 1,
                        Err(r) => counters.dropped(r, 1),
                    }
                }
                if frames == 0 {
                    counters.dropped(DropReason::NoNeighbours, 1);
                } else {
                    counters.forwarded(ForwardKind::VxlanToNeighbours, 1);
                    counters.forwarded(ForwardKind::NeighbourFrames, frames);
                }
            }
            VxlanAction::Drop(r) => counters.dropped(r, 1),
        }
    }
    b.finish();
}

/// Handles one batch of Geneve frames from nodes: relays datagrams out of the VIPs, hands
/// probe replies to the health monitor, sends customers' frames out of their ports (the
/// batch's frames of a port in one `sendmmsg`, after the loop), counted per attachment in
/// `tally` and folded into the thread's counters at the end.
fn geneve_batch(
    sh: &Shared,
    rx: &RecvBatch,
    tx: &mut TxBatch,
    scratch: &mut PacketScratch,
    tally: &mut AttachTally,
) {
    let counters = &sh.underlay_counters;
    let mut b = Batch::new(sh, counters, &sh.outbound);
    let tables = Arc::clone(&b.tables);
    // Customers' frames for the ports: allocated only when a batch has some.
    let mut to_ports: Vec<(usize, &[u8])> = Vec::new();
    for (meta, frame) in rx.iter() {
        let Some(src) = meta.src.filter(|_| !meta.truncated) else {
            counters.dropped(DropReason::BadReceive, 1);
            continue;
        };
        let action = match classify::geneve(
            src,
            frame,
            &tables,
            |a| sh.vip_socks.get(&a).copied(),
            |p| sh.own_port(p),
        ) {
            Ok(a) => a,
            Err(r) => {
                counters.dropped(r, 1);
                continue;
            }
        };
        if let Some(r) = action.drop {
            counters.dropped(r, 1);
        }
        if let Some(probe) = action.probe_reply {
            match action.sender {
                Sender::Data(node) => {
                    let now = b.now;
                    b.health().on_reply(node, probe, now);
                    counters.forwarded(ForwardKind::ProbeReplies, 1);
                }
                Sender::Control | Sender::Ambiguous => {
                    counters.dropped(DropReason::ProbeReplyUnattributed, 1)
                }
            }
        }
        if let Some(to) = action.to_port {
            match frame.get(to.frame) {
                Some(eth) => {
                    tally.count(to.key, to.attachment, AttachCount::ToCe(eth.len()));
                    to_ports.push((to.port, eth));
                }
                None => counters.dropped(DropReason::GeneveMalformed, 1),
            }
        }
        if let Some(relay) = action.relay {
            let Some(payload) = frame.get(relay.payload) else {
                counters.dropped(DropReason::GeneveMalformed, 1);
                continue;
            };
            let queued = tx.push(relay.sock, relay.dst, payload.len(), |buf| {
                buf[..payload.len()].copy_from_slice(payload);
                Ok::<usize, ()>(payload.len())
            });
            match queued {
                Ok(()) => counters.forwarded(ForwardKind::RelayedToPeers, 1),
                Err(()) => counters.dropped(DropReason::FrameTooLarge, 1),
            }
        }
    }
    b.finish();
    for (i, port) in sh.ports.iter().enumerate() {
        let frames = to_ports.iter().filter(|(p, _)| *p == i).map(|(_, f)| *f);
        let n = frames.clone().count() as u64;
        if n == 0 {
            continue;
        }
        let failed = port.sock.send_batch(frames, scratch);
        counters.forwarded(ForwardKind::DataToPort, n - failed.min(n));
        counters.dropped(DropReason::SendFailed, failed);
    }
    tally.fold(&sh.underlay_attach);
}

/// Longest wait of the port thread's poll (it has no timers; the waker ends it).
const PORT_IDLE: Duration = Duration::from_millis(100);

/// The port thread: customers' frames from the customer-facing ports' rings to the data
/// nodes serving their attachments (TCP/UDP checksums a local stack left to offload finished
/// on the way, since the data node cannot see the ring's flag).
pub(crate) fn run_ports(sh: Arc<Shared>) {
    let counters = &sh.port_counters;
    let fds: Vec<_> = sh.ports.iter().map(|p| p.sock.raw_fd()).collect();
    let mut poller = Poller::new(&fds, &sh.waker);
    let mut frames = FrameBatch::new(sh.batch, sh.batch * 2048);
    let mut tx = TxBatch::with_capacity(sh.batch * 2048);
    let mut tally = AttachTally::default();
    while wait(&mut poller, PORT_IDLE) {
        for (pi, port) in sh.ports.iter().enumerate() {
            if !poller.readable(pi) {
                continue;
            }
            loop {
                let (n, full) = port.sock.read_batch(&mut frames);
                if n > 0 {
                    port_batch(&sh, port.id, &mut frames, &mut tx, &mut tally);
                    flush(&sh, &mut tx, counters);
                }
                counters.dropped(
                    DropReason::PortRingFull,
                    port.sock.take_losses() + std::mem::take(&mut frames.too_big),
                );
                counters.dropped(
                    DropReason::PortMalformed,
                    std::mem::take(&mut frames.bad_headers),
                );
                if !full {
                    break;
                }
            }
        }
    }
}

/// Steers one batch of customers' frames of `port` to the data nodes serving their
/// attachments, inside Geneve with the port option (and a probe when one is due), with the
/// TCP/UDP checksums a local stack left to offload finished first ([`classify::port_frame`]).
/// A CE's packet into a tunnel is charged to the tunnel's outbound rate limit (the frame's
/// bytes, tags included) and dropped over it, as the hosts' VXLAN into the tunnel is. Each
/// frame of a known tag pair is counted for its attachment in `tally`, folded into the
/// thread's counters at the end.
fn port_batch(
    sh: &Shared,
    port: PortId,
    frames: &mut FrameBatch,
    tx: &mut TxBatch,
    tally: &mut AttachTally,
) {
    let counters = &sh.port_counters;
    let mut b = Batch::new(sh, counters, &sh.outbound);
    let tables = Arc::clone(&b.tables);
    for i in 0..frames.frames().len() {
        let rx = frames.frames()[i];
        if rx.truncated {
            counters.dropped(DropReason::BadReceive, 1);
            continue;
        }
        let frame = frames.frame_mut(i);
        let steer = match classify::port_frame(port, frame, rx.csum_not_ready, &tables) {
            Ok(s) => s,
            Err(r) => {
                counters.dropped(r, 1);
                continue;
            }
        };
        let len = frame.len();
        let r = b
            .admit_to_node(steer.node, steer.tunnel, len)
            .and_then(|(addr, probe)| {
                let max = relay::l2_header_len(probe.is_some()) + len;
                tx.push(sh.geneve, addr, max, |buf| {
                    relay::emit_l2_frame(buf, port.0, probe, frame)
                })
                .map_err(|_| DropReason::FrameTooLarge)
            });
        let attachment = steer.entry.attachment;
        match r {
            Ok(()) => {
                counters.forwarded(ForwardKind::PortToData, 1);
                tally.count(steer.key, attachment, AttachCount::FromCe(len));
            }
            Err(r) => {
                counters.dropped(r, 1);
                tally.count(steer.key, attachment, AttachCount::Dropped);
            }
        }
    }
    b.finish();
    tally.fold(&sh.port_attach);
}
