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
//! A batch goes through the pipeline (docs/architecture.md, "The pipeline"): the input stage
//! ([`crate::io::input`]) fills the worker's receive batch, the graph
//! ([`crate::pipeline::graph`]) runs the stages over its packets into the worker's send batch
//! ([`Out`]), and the lane's ordered sender hands it to the output stage
//! ([`crate::io::output`]).
//!
//! Per batch, not per packet: one `recvmmsg` (UDP GRO trains split into their segments here),
//! one snapshot of the SA tables (with the feature chains), one entry into the published copy
//! of the per-VM routes ([`crate::routes`]: the writer waits for it to end), one lock of the
//! dispatch stage and one of the lane's order, counters folded into the shared ones (an
//! attachment batch holding a CE's packets for the tunnels also takes, once each, the
//! dispatch stage and the order of every VTEP lane they are numbered in: `to_vtep_lanes`).
//! Per packet there is no allocation, lock or system call on the ESP and VXLAN paths.

use crate::batch::UNSPECIFIED;
use crate::io::input::{self, RxBatch};
use crate::io::output::Output;
use crate::lane::LaneKind;
use crate::out::Out;
use crate::pipeline::charge::{Charge, TenantTable};
use crate::pipeline::classify::{Pass, Via};
use crate::pipeline::graph::Deliveries;
use crate::pipeline::open::Prefetch;
use crate::pipeline::{encap, graph};
use crate::routes::{RouteReader, Routes};
use crate::shared::{Shared, HOUSEKEEPING};
use crate::spin::Spin;
use crate::stats::DropReason;
use crate::sys::tsc::Tsc;
use crate::tables::Tables;
use datapath::CpuFairness;
use netio::{Poller, Ready};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Batches taken from one lane before the worker looks at the others again.
const BATCHES_PER_WAKE: usize = 8;
/// A worker's thread-local state.
struct Worker {
    /// Worker index.
    id: usize,
    /// Received datagrams or TUN packets.
    rx: RxBatch,
    /// Output side.
    out: Out,
    /// The ESP open stage's look-ahead over a NAT-T batch.
    prefetch: Prefetch,
}

impl Worker {
    /// Worker `id` of `sh`, its first send batch taken from its pool.
    fn new(sh: &Shared, id: usize) -> Self {
        let mut out = Out::new(
            sh.cfg.batch,
            input::largest_batch(sh.cfg.batch),
            Box::new(Output::new(sh, sh.cfg.batch)),
        );
        out.worker = Some(id);
        out.tx = sh.pools[id].take(&sh.waker);
        Self {
            id,
            rx: RxBatch::new(sh),
            out,
            prefetch: Prefetch::default(),
        }
    }
}

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
    let routes = sh.route_readers.reader();
    // Every lane's input, then its AF_XDP sockets (if any): (lane, input) per descriptor.
    let mut fds: Vec<RawFd> = Vec::new();
    let mut inputs: Vec<(usize, usize)> = Vec::new();
    for (lane, l) in sh.lanes.iter().enumerate() {
        fds.push(l.fd);
        inputs.push((lane, 0));
        for (i, x) in sh.io.lane_xsks(l.kind).iter().enumerate() {
            fds.push(x.xsk.raw_fd());
            inputs.push((lane, i + 1));
        }
    }
    let mut poller = Poller::new(&fds, &sh.waker);
    let mut spin = Spin::new(sh.cfg.busy_poll, sh.cfg.busy_poll_budget, Instant::now());
    loop {
        let now = Instant::now();
        // Adaptive polling: while traffic comes faster than a wake-up costs, look again
        // without sleeping (a sleeping thread takes a wake-up, which on an idle virtual CPU
        // can cost a millisecond); the polls that find nothing are counted and bounded.
        let spinning = spin.spin(now);
        let timeout = if spinning {
            Duration::ZERO
        } else {
            housekeeping_due(sh).saturating_duration_since(now)
        };
        // The wait is the worker's idle time: it fills the tenants' token buckets.
        let waited = match w.out.charge.as_deref_mut() {
            Some(c) if c.kernel_refuses() && !timeout.is_zero() => {
                // An idle worker refuses nobody: before it sleeps, the kernel admits again
                // the tenants it refuses for this worker (looking first without sleeping).
                match c.idle(|| poller.wait(Some(Duration::ZERO))) {
                    Ok(Ready::Readable) if !poller.any_readable() => {
                        c.release_kernel();
                        c.idle(|| poller.wait(Some(timeout)))
                    }
                    other => other,
                }
            }
            Some(c) => c.idle(|| poller.wait(Some(timeout))),
            None => poller.wait(Some(timeout)),
        };
        match waited {
            Ok(Ready::Shutdown) => return,
            Ok(Ready::Readable) => {}
            Err(e) => {
                tracing::error!(worker = id, error = %e, "poll failed; worker stops");
                return;
            }
        }
        // Traffic is what this worker got: every worker polls every lane, and one that lost
        // the race for a readable lane found nothing.
        let mut got = false;
        for (i, &(lane, input)) in inputs.iter().enumerate() {
            if !poller.readable(i) {
                continue;
            }
            for _ in 0..BATCHES_PER_WAKE {
                let b = batch(sh, &mut w, &routes, lane, input);
                got |= b != Batch::Empty;
                if b != Batch::Full || sh.stopping() {
                    break;
                }
            }
        }
        if got {
            spin.worked(Instant::now());
        } else if spinning {
            // A poll without sleeping that got nothing (the lanes' empty receives included).
            let took = now.elapsed();
            spin.spun(took);
            let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
            sh.worker_stats[id].spin_ns.fetch_add(ns, Ordering::Relaxed);
        }
        housekeeping(sh, &mut w, &routes);
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

/// Receives and processes one batch of `lane` from its input `input` (see
/// [`input::receive`]).
fn batch(sh: &Shared, w: &mut Worker, routes: &RouteReader, lane: usize, input: usize) -> Batch {
    let l = &sh.lanes[lane];
    let Some(mut stage) = l.dispatch(true) else {
        return Batch::Empty;
    };
    let started = Instant::now();
    if let Some(c) = w.out.charge.as_deref_mut() {
        c.start();
    }
    let (n, more) = input::receive(sh, &mut w.rx, l.kind, input, &mut w.out.drops);
    if n == 0 {
        if let Some(c) = w.out.charge.as_deref_mut() {
            c.empty();
        }
        return Batch::Empty;
    }
    if let Some(c) = w.out.charge.as_deref_mut() {
        c.received();
    }
    let ticket = stage.ticket();
    let tables = sh.tables.load();
    let tenants = Arc::clone(&tables.tenants);
    match (tenants.mode, w.out.charge.as_deref_mut()) {
        (CpuFairness::Off, Some(_)) => w.out.charge = None,
        (CpuFairness::Off, None) => {}
        (_, Some(c)) => c.follow(&tenants),
        (_, None) => {
            // Charging begins with this batch (its receive was not measured).
            let mut c = Charge::new(Box::new(Tsc));
            c.start();
            c.received();
            c.follow(&tenants);
            w.out.charge = Some(Box::new(c));
        }
    }
    // The kernel gate opens with the first table that enforces: a charge made before it
    // (or in this batch) takes it up here.
    if let (Some(c), Some(g)) = (w.out.charge.as_deref_mut(), sh.gate()) {
        if !c.has_kernel() {
            c.set_kernel(Arc::clone(g) as _, w.id);
        }
    }
    let guard = routes.enter();
    let r = guard.as_deref().unwrap_or(RouteReader::empty());
    let now = started;
    w.out.begin(lane, ticket, tables, now);
    let packets = if l.kind == LaneKind::Relay {
        // Both directions: the outbound part in arrival order under the stage, the inbound
        // part (ESP from peers) in parallel after it.
        let p = process(sh, w, r, l.kind, now, Pass::Serial);
        // CEs' packets for the tunnels (relayed frames of steer nodes' ports) are numbered
        // here, under the stage, in the one ordering domain of relay mode's CHILD_SAs.
        let tables = w.out.tables();
        graph::seal_from_ces(&mut w.out, sh, &tables, |_| true);
        drop(stage);
        process(sh, w, r, l.kind, now, Pass::Parallel);
        p
    } else if let LaneKind::Attach { .. } = l.kind {
        // In arrival order under the stage; a CE's packets for the tunnels are then numbered
        // in their VTEP lanes (`to_vtep_lanes`), the attachment lane's stage still held.
        let p = process(sh, w, r, l.kind, now, Pass::All);
        if w.out.ce_bound.is_empty() {
            drop(stage);
        } else {
            to_vtep_lanes(sh, w, Some(stage), now);
        }
        p
    } else if l.kind.is_outbound() {
        // Outbound: classification and sequence numbers in arrival order, under the stage;
        // the encryption after it (`Out::finish`).
        let p = process(sh, w, r, l.kind, now, Pass::All);
        drop(stage);
        p
    } else {
        drop(stage);
        let p = process(sh, w, r, l.kind, now, Pass::All);
        // Decrypted packets a filter sent back into their tunnels (`XDP_TX`) are numbered in
        // their VNet's VTEP lane, as a CE's are, where the VMs' packets for the same CHILD_SAs
        // are numbered.
        if !w.out.ce_bound.is_empty() {
            to_vtep_lanes(sh, w, None, now);
        }
        p
    };
    drop(guard);
    if let Some(c) = w.out.charge.as_deref_mut() {
        c.phase();
    }
    w.out.finish(sh);
    charged(sh, w, &tenants, packets);
    let busy = started.elapsed();
    sh.worker_stats[w.id].batch(packets, busy);
    w.out.held.batch_done(packets, busy);
    if more {
        Batch::Full
    } else {
        Batch::Partial
    }
}

/// Folds the batch's CPU charge into the tenants' counters and the worker's (charging begins
/// and ends in `batch`, as the batch's tables say, once they are loaded).
fn charged(sh: &Shared, w: &mut Worker, tenants: &TenantTable, packets: u64) {
    if let Some(c) = w.out.charge.as_deref_mut() {
        fold(sh, w.id, c, tenants, packets);
    }
}

fn fold(sh: &Shared, id: usize, c: &mut Charge, tenants: &TenantTable, packets: u64) {
    let folded = c.end(packets, |ch| {
        if let Some(t) = tenants.counters.get(usize::from(ch.slot)) {
            // The refund is of cycles folded in earlier batches: the sum stays positive.
            if ch.cycles >= ch.refunded {
                t.cycles
                    .fetch_add(ch.cycles - ch.refunded, Ordering::Relaxed);
            } else {
                t.cycles
                    .fetch_sub(ch.refunded - ch.cycles, Ordering::Relaxed);
            }
            t.packets.fetch_add(ch.packets, Ordering::Relaxed);
            if ch.refused != 0 {
                t.fair_drops.fetch_add(ch.refused, Ordering::Relaxed);
            }
        }
    });
    let ws = &sh.worker_stats[id];
    if let Ok(mut tokens) = ws.tokens.try_lock() {
        // Once per Δt at most; a reader holding the lock makes it wait for the next.
        c.tokens(&mut tokens);
    }
    ws.cpu_unattributed
        .fetch_add(folded.unattributed, Ordering::Relaxed);
    if folded.capped != 0 {
        ws.cpu_capped.fetch_add(folded.capped, Ordering::Relaxed);
    }
    if folded.preempted != 0 {
        ws.cpu_preempted
            .fetch_add(folded.preempted, Ordering::Relaxed);
    }
}

/// The end of an attachment lane batch that holds a CE's packets for the tunnels
/// (`Out::ce_bound`), or of an ESP lane batch that holds decrypted packets a filter sent back
/// (`stage` None: an inbound lane releases its stage before its pass): they are numbered and
/// sent in the order of their VNet's VTEP lane,
/// where the VMs' packets for the same CHILD_SAs are, so each CHILD_SA has one ordering
/// domain and its peer receives its sequence numbers in order (two lanes numbering for one
/// SA would let a batch numbered earlier leave after one numbered later, and the peer's
/// anti-replay window drop it).
///
/// The attachment batch's own output is finished first (its ticket handed over complete);
/// then, per local VTEP of the held packets in the order they were held, the worker waits for
/// that VTEP lane's dispatch stage, draws a ticket of it, numbers and queues the packets under
/// it, releases it, and seals and hands over that part (`Out::finish`, at the next VTEP or in
/// the caller) before it waits for the next VTEP lane. The attachment lane's `stage` is held
/// throughout and released only at the end, so the next attachment batch's packets follow
/// these into every VTEP lane.
///
/// No deadlock: a worker waits for a lock, a VTEP lane's stage here or any lane's stage in
/// `batch` and `housekeeping`, only while it holds no unfinished ticket (the attachment
/// ticket is finished before the first VTEP lane is waited for, each VTEP ticket before the
/// next; `batch` and housekeeping finish theirs before they take a stage again). A holder
/// of a stage may itself wait, in `pools.take` when its send batch fills, for its batches
/// queued behind other lanes' tickets, the attachment lane's included; but those tickets
/// were drawn before its own, by workers that no longer wait for a lock, and each gets sent
/// (`crate::lane`): no wait cycle forms.
///
/// A VTEP without a lane has nowhere to number its CHILD_SAs' packets in their one ordering
/// domain (relay mode has no attachment lane: it numbers a CE's packets in its relay lane,
/// see `batch`): its packets are dropped as
/// `no_route` rather than numbered in the attachment batch. Leaves the last VTEP batch begun
/// (or the attachment batch, if none had a lane), for the caller to finish.
fn to_vtep_lanes(
    sh: &Shared,
    w: &mut Worker,
    stage: Option<crate::lane::Dispatch<'_>>,
    now: Instant,
) {
    let tables = w.out.tables();
    let lane_of = |vtep: usize| {
        sh.lanes
            .iter()
            .position(|l| l.kind == LaneKind::Vtep { vtep })
    };
    while let Some(vtep) = w.out.ce_bound.next_vtep() {
        let Some(lane) = lane_of(vtep) else {
            let mut lost = 0;
            w.out.ce_bound.take(|v| v == vtep, |_, _| lost += 1);
            w.out.drops.add_n(DropReason::NoRoute, lost);
            continue;
        };
        // The attachment batch, or the previous VTEP lane's part: no unfinished ticket is
        // held while waiting for the VTEP lane's stage.
        w.out.finish(sh);
        let mut vtep_stage = sh.lanes[lane].dispatch_waiting();
        let ticket = vtep_stage.ticket();
        w.out
            .begin(lane, ticket, std::sync::Arc::clone(&tables), now);
        graph::seal_from_ces(&mut w.out, sh, &tables, |v| v == vtep);
        drop(vtep_stage);
    }
    drop(stage);
}

/// Runs the TUN lane's graph over every packet read (super-packets already split).
fn process_tun(sh: &Shared, w: &mut Worker, tables: &Tables) -> u64 {
    let Some(rb) = w.rx.tun.as_mut() else {
        return 0;
    };
    let mut packets = 0;
    for i in 0..rb.frames().len() {
        let (f, bytes) = rb.frame_mut(i);
        for pkt in bytes.chunks_mut(f.stride.max(1)) {
            packets += 1;
            graph::tun(&mut w.out, sh, tables, pkt);
        }
    }
    packets
}

/// Runs the lane's graph over every datagram (GRO segments one by one), then the feature
/// chains over what it held; returns the number of packets. `pass` splits a relay batch (see
/// [`Pass`]); a datagram the kernel truncated or that is empty is counted by the pass that
/// runs first.
fn process(
    sh: &Shared,
    w: &mut Worker,
    r: &Routes,
    kind: LaneKind,
    now: Instant,
    pass: Pass,
) -> u64 {
    let tables = w.out.tables();
    let packets = if kind == LaneKind::Tun {
        process_tun(sh, w, &tables)
    } else if let LaneKind::Attach { iface } = kind {
        process_frames(sh, w, &tables, r, iface, now)
    } else {
        process_datagrams(sh, w, &tables, r, kind, now, pass)
    };
    graph::end_pass(&mut w.out, sh, &tables, r, now);
    packets
}

/// Runs the attachment graph over every frame read from packet interface `iface`.
fn process_frames(
    sh: &Shared,
    w: &mut Worker,
    tables: &Tables,
    r: &Routes,
    iface: usize,
    now: Instant,
) -> u64 {
    let Some(fb) = w.rx.frames.as_mut() else {
        return 0;
    };
    let n = fb.frames().len();
    let mut lookups = graph::CeLookups::new();
    for i in 0..n {
        let f = fb.frames()[i];
        if f.truncated {
            w.out.drop_packet(DropReason::Truncated);
            continue;
        }
        if f.csum_not_ready {
            // Sent by a local stack with checksum offload (a veth peer): the TCP or UDP
            // checksum field holds only the pseudo-header sum. A frame that does not parse is
            // left as it is; the attach stage drops it.
            let _ = wire::checksum::finish_frame(fb.frame_mut(i));
        }
        graph::attach(&mut w.out, sh, tables, r, now, iface, i, fb, &mut lookups);
    }
    graph::route_from_ces(&mut w.out, sh, tables, r, now, fb, &mut lookups);
    n as u64
}

fn process_datagrams(
    sh: &Shared,
    w: &mut Worker,
    tables: &Tables,
    r: &Routes,
    kind: LaneKind,
    now: Instant,
    pass: Pass,
) -> u64 {
    let local = sh.io.lane_local(kind);
    let first = pass != Pass::Parallel;
    let mut packets = 0;
    let mut d = Deliveries::new();
    // ESP from many CHILD_SAs: their state is loaded a few packets ahead (`Prefetch`).
    let esp = matches!(kind, LaneKind::Natt { .. }) && Prefetch::worth_it(tables);
    if esp {
        w.prefetch.clear();
        for (meta, data) in w.rx.datagrams.iter() {
            if !meta.truncated {
                for segment in data.chunks(meta.seg) {
                    w.prefetch.push(segment);
                }
            }
        }
    }
    for (meta, data) in w.rx.datagrams.iter_mut() {
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
            if esp {
                w.prefetch.next(tables);
            }
            handle(o, sh, tables, r, kind, now, from, segment, pass, &mut d);
        }
    }
    d.flush(&mut w.out, sh, tables, r, now);
    packets
}

/// One datagram that arrived on `local` from `src` (`from`): the lane's entry into the graph.
#[allow(clippy::too_many_arguments)]
fn handle<'p, 't>(
    o: &mut Out,
    sh: &Shared,
    t: &'t Tables,
    r: &Routes,
    kind: LaneKind,
    now: Instant,
    (local, src): (SocketAddr, SocketAddr),
    data: &'p mut [u8],
    pass: Pass,
    d: &mut Deliveries<'p, 't>,
) {
    match kind {
        LaneKind::Ike { .. } => graph::ike(o, sh, local, src, data),
        LaneKind::Natt { .. } => graph::natt(o, sh, t, r, now, local, src, data, d),
        LaneKind::Vtep { vtep } => graph::vxlan(o, sh, t, r, now, Via::Vtep(vtep), src, data),
        LaneKind::Relay => graph::relay(o, sh, t, r, now, src, data, pass, d),
        // TUN packets are read into their own batch (process_tun).
        LaneKind::Tun => graph::tun(o, sh, t, data),
        // Frames of attachment interfaces too (process_frames).
        LaneKind::Attach { iface } => graph::attach_one(o, sh, t, r, now, iface, data),
    }
}

/// When the next housekeeping round is due.
fn housekeeping_due(sh: &Shared) -> Instant {
    *sh.housekeeping.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs the neighbour cache housekeeping if it is due and no other worker is running it. Its
/// output (ARP requests, ND solicitations, self-dispatch's announcements) goes through the
/// VTEP's lane like a batch (in relay mode without self-dispatch, where there are no VTEP
/// lanes, through the relay lane, for every VNet).
fn housekeeping(sh: &Shared, w: &mut Worker, routes: &RouteReader) {
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
    // What the AF_XDP sockets lost since the last round (one `getsockopt` each).
    let mut lost = crate::stats::DropCounts::default();
    for x in sh.io.all_xsks() {
        lost.add_n(DropReason::XdpLost, x.new_losses());
    }
    sh.drops.absorb(&mut lost);
    let announce = encap::announcements_due(sh, &sh.tables.load(), now);
    for (lane, l) in sh.lanes.iter().enumerate() {
        let vtep = match l.kind {
            LaneKind::Vtep { vtep } => Some(vtep),
            // Relay mode without lanes of the VTEPs' own (no self-dispatch): every VNet.
            LaneKind::Relay if !sh.io.vteps_receive => None,
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
        let guard = routes.enter();
        let r = guard.as_deref().unwrap_or(RouteReader::empty());
        encap::housekeeping(&mut w.out, sh, &tables, r, vtep, now, announce);
        drop(guard);
        w.out.finish(sh);
    }
    crate::pipeline::attach::report_ces(sh, &sh.tables.load(), now);
    sh.expire_retired(now);
    sh.recent_cpu
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .sample(now, &sh.tables.load().tenants.counters);
}
