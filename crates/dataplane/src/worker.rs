//! The worker threads: every worker serves every lane (see [`crate::lane`]). A worker waits in
//! `poll` on all lanes' descriptors; for each readable lane it takes the lane's dispatch
//! stage, receives a batch and draws its ticket, processes it on its own core and hands the
//! result to the lane's ordered sender, then goes on with the same lane while batches come
//! full. Workers are pinned to CPUs when configured (`DataplaneConfig::cpus`).
//!
//! Each worker measures the time it spends on batches (from the moment it holds a lane's
//! dispatch stage until its batch is handed to the sender: one pair of clock reads per
//! batch), reported as `WorkerStats::busy_ns` for the node's utilization.
//!
//! Per batch, not per packet: one `recvmmsg` (UDP GRO trains split into their segments here),
//! one snapshot of the SA tables, one lock of the dispatch stage and one of the lane's order,
//! counters folded into the shared ones. Per packet there is no allocation, lock or system
//! call on the ESP and VXLAN paths.

use crate::batch::UNSPECIFIED;
use crate::lane::LaneKind;
use crate::out::Worker;
use crate::path::relay::{self, Pass};
use crate::path::vxlan::{self, Via};
use crate::path::{tun, underlay};
use crate::shared::Shared;
use crate::stats::DropReason;
use crate::sys::tun_offload::TunDrop;
use netio::{Poller, Ready};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Batches taken from one lane before the worker looks at the others again.
const BATCHES_PER_WAKE: usize = 8;
/// Period of the neighbour cache housekeeping.
pub(crate) const HOUSEKEEPING: Duration = Duration::from_millis(250);

/// How a batch went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Batch {
    /// Nothing was waiting.
    Empty,
    /// Fewer datagrams than the batch holds: the lane is probably drained.
    Partial,
    /// A full batch: more is probably waiting.
    Full,
}

/// Runs worker `id` until shutdown.
pub(crate) fn run(sh: &Shared, id: usize) {
    if let Some(cpu) = sh.worker_cpus.get(id).copied().flatten() {
        pin(id, cpu);
    }
    let mut w = Worker::new(sh, id);
    let fds: Vec<RawFd> = sh.lanes.iter().map(|l| l.fd).collect();
    let mut poller = Poller::new(&fds, &sh.waker);
    let busy_poll = sh.cfg.busy_poll;
    let mut last_work = Instant::now()
        .checked_sub(busy_poll)
        .unwrap_or_else(Instant::now);
    loop {
        let now = Instant::now();
        // Busy polling: right after traffic, look again without sleeping (a sleeping thread
        // takes a wake-up, which on an idle virtual CPU can cost a millisecond).
        let timeout = if now.duration_since(last_work) < busy_poll {
            Duration::ZERO
        } else {
            housekeeping_due(sh).saturating_duration_since(now)
        };
        match poller.wait(Some(timeout)) {
            Ok(Ready::Shutdown) => return,
            Ok(Ready::Readable) => {}
            Err(e) => {
                tracing::error!(worker = id, error = %e, "poll failed; worker stops");
                return;
            }
        }
        if poller.any_readable() {
            last_work = Instant::now();
        }
        for lane in (0..sh.lanes.len()).filter(|&i| poller.readable(i)) {
            for _ in 0..BATCHES_PER_WAKE {
                if batch(sh, &mut w, lane) != Batch::Full || sh.stopping() {
                    break;
                }
            }
        }
        housekeeping(sh, &mut w);
    }
}

fn pin(worker: usize, cpu: usize) {
    // SAFETY: cpu_set_t is plain data.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` was validated below CPU_SETSIZE; pid 0 is the calling thread.
    let ret = unsafe {
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if ret == 0 {
        tracing::debug!(worker, cpu, "worker pinned");
    } else {
        tracing::warn!(worker, cpu, error = %std::io::Error::last_os_error(), "cannot pin worker; it runs unpinned");
    }
}

/// Receives and processes one batch of `lane`.
fn batch(sh: &Shared, w: &mut Worker, lane: usize) -> Batch {
    let l = &sh.lanes[lane];
    let Some(mut stage) = l.dispatch(true) else {
        return Batch::Empty;
    };
    let started = Instant::now();
    let (n, more) = receive(sh, w, l.kind);
    if n == 0 {
        return Batch::Empty;
    }
    let ticket = stage.ticket();
    let tables = sh.tables.load();
    let now = started;
    w.out.begin(lane, ticket, tables, now);
    let packets = if l.kind == LaneKind::Relay {
        // Both directions: the outbound part in arrival order under the stage, the inbound
        // part (ESP from peers) in parallel after it.
        let p = process(sh, w, l.kind, now, Pass::Serial);
        drop(stage);
        process(sh, w, l.kind, now, Pass::Parallel);
        p
    } else if l.kind.is_outbound() {
        // Outbound: classification and sequence numbers in arrival order, under the stage.
        let p = process(sh, w, l.kind, now, Pass::All);
        drop(stage);
        p
    } else {
        drop(stage);
        process(sh, w, l.kind, now, Pass::All)
    };
    w.out.finish(sh);
    sh.worker_stats[w.id].batch(packets, started.elapsed());
    if more {
        Batch::Full
    } else {
        Batch::Partial
    }
}

/// Fills the worker's receive batch from the lane's input; returns the datagrams (or TUN
/// frames) read and whether more is probably waiting.
fn receive(sh: &Shared, w: &mut Worker, kind: LaneKind) -> (usize, bool) {
    let sock = match kind {
        LaneKind::Ike { listen } => sh.listen[listen].ike,
        LaneKind::Natt { listen } => sh.listen[listen].natt,
        LaneKind::Vtep { vtep } => sh.vteps[vtep].recv,
        LaneKind::Relay => match sh.relay_sock {
            Some(s) => s,
            None => return (0, false),
        },
        LaneKind::Tun => {
            let (Some(dev), Some(rb)) = (&sh.tun, w.tun_rx.as_mut()) else {
                return (0, false);
            };
            return match dev.read_batch(rb, rb.frames().len().max(w.rx.capacity())) {
                Ok(r) => {
                    for (why, n) in rb.drops().iter() {
                        w.out.drops.add_n(tun_drop(why), n);
                    }
                    (r.frames, !r.would_block)
                }
                Err(e) => {
                    tracing::debug!(device = dev.name(), error = %e, "TUN read failed");
                    (0, false)
                }
            };
        }
    };
    match sh.socks[sock].recv_batch(&mut w.rx) {
        Ok(n) => (n, n == w.rx.capacity()),
        Err(e) => {
            tracing::debug!(lane = ?kind, error = %e, "receive failed");
            (0, false)
        }
    }
}

fn tun_drop(why: TunDrop) -> DropReason {
    match why {
        TunDrop::Short => DropReason::TunShortRead,
        TunDrop::Truncated => DropReason::TunReadTruncated,
        TunDrop::BadHeader => DropReason::TunVnetBadHeader,
        TunDrop::GsoMalformed => DropReason::TunGsoMalformed,
        TunDrop::GsoTooLarge => DropReason::TunGsoTooLarge,
    }
}

/// Runs the TUN lane's path over every packet read (super-packets already split).
fn process_tun(sh: &Shared, w: &mut Worker, tables: &crate::tables::Tables) -> u64 {
    let Some(rb) = w.tun_rx.as_mut() else {
        return 0;
    };
    let mut packets = 0;
    for i in 0..rb.frames().len() {
        let (f, bytes) = rb.frame_mut(i);
        for pkt in bytes.chunks_mut(f.stride.max(1)) {
            packets += 1;
            tun::outbound(&mut w.out, sh, tables, pkt);
        }
    }
    packets
}

/// Runs the lane's path over every datagram (GRO segments one by one); returns the number of
/// packets. `pass` splits a relay batch (see [`Pass`]); a datagram the kernel truncated or
/// that is empty is counted by the pass that runs first.
fn process(sh: &Shared, w: &mut Worker, kind: LaneKind, now: Instant, pass: Pass) -> u64 {
    let tables = w.out.tables();
    if kind == LaneKind::Tun {
        return process_tun(sh, w, &tables);
    }
    let local = match kind {
        LaneKind::Ike { listen } => sh.socks[sh.listen[listen].ike].local_addr(),
        LaneKind::Natt { listen } => sh.socks[sh.listen[listen].natt].local_addr(),
        LaneKind::Vtep { vtep } => sh.socks[sh.vteps[vtep].recv].local_addr(),
        LaneKind::Tun | LaneKind::Relay => UNSPECIFIED,
    };
    let first = pass != Pass::Parallel;
    let mut packets = 0;
    for (meta, data) in w.rx.iter_mut() {
        let o = &mut w.out;
        if meta.truncated {
            if first {
                o.drop_packet(DropReason::Truncated);
            }
            continue;
        }
        if data.is_empty() {
            if first {
                o.drop_packet(match kind {
                    LaneKind::Tun => DropReason::TunMalformed,
                    LaneKind::Relay => DropReason::RelayMalformed,
                    _ => DropReason::MalformedUdp,
                });
            }
            continue;
        }
        let from = (local, meta.src.unwrap_or(UNSPECIFIED));
        for segment in data.chunks_mut(meta.seg) {
            packets += 1;
            handle(o, sh, &tables, kind, now, from, segment, pass);
        }
    }
    packets
}

/// One datagram that arrived on `local` from `src` (`from`).
#[allow(clippy::too_many_arguments)]
fn handle(
    o: &mut crate::out::Out,
    sh: &Shared,
    t: &crate::tables::Tables,
    kind: LaneKind,
    now: Instant,
    (local, src): (SocketAddr, SocketAddr),
    data: &mut [u8],
    pass: Pass,
) {
    match kind {
        LaneKind::Ike { .. } => underlay::ike(o, sh, local, src, data),
        LaneKind::Natt { .. } => underlay::natt(o, sh, t, now, local, src, data),
        LaneKind::Vtep { vtep } => vxlan::receive(o, sh, t, now, Via::Vtep(vtep), src, data),
        LaneKind::Relay => relay::receive(o, sh, t, now, src, data, pass),
        // TUN packets are read into their own batch (process_tun).
        LaneKind::Tun => tun::outbound(o, sh, t, data),
    }
}

/// When the next housekeeping round is due.
fn housekeeping_due(sh: &Shared) -> Instant {
    *sh.housekeeping.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs the neighbour cache housekeeping if it is due and no other worker is running it. Its
/// output (ARP requests, ND solicitations) goes through the VTEP's lane like a batch (in
/// relay mode, where there are no VTEP lanes, through the relay lane, for every VNet).
fn housekeeping(sh: &Shared, w: &mut Worker) {
    let now = Instant::now();
    {
        let Ok(mut due) = sh.housekeeping.try_lock() else {
            return;
        };
        if now < *due {
            return;
        }
        *due = now + HOUSEKEEPING;
    }
    for (lane, l) in sh.lanes.iter().enumerate() {
        let vtep = match l.kind {
            LaneKind::Vtep { vtep } => Some(vtep),
            LaneKind::Relay => None,
            _ => continue,
        };
        let Some(mut stage) = l.dispatch(true) else {
            continue;
        };
        let ticket = stage.ticket();
        drop(stage);
        let tables = sh.tables.load();
        w.out
            .begin(lane, ticket, std::sync::Arc::clone(&tables), now);
        vxlan::housekeeping(&mut w.out, sh, &tables, vtep, now);
        w.out.finish(sh);
    }
    sh.expire_retired(now);
}

impl Shared {
    /// True once shutdown began.
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}
