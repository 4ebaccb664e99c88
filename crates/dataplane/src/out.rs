//! The send batch a worker fills, shared by every stage that produces output: [`Out`] holds
//! the batch being filled (from the worker's pool), the ESP packets waiting to be sealed in
//! it, the packets held for the tenants' feature chains, a CE's packets held for the
//! tunnels ([`CeBound`]), the batch's drop counts and the worker's neighbour memos. The stages import this module; it imports none of them: a
//! finished batch goes to the output stage through the [`Transmit`] trait.
//!
//! Within a lane (see [`crate::lane`]) a full send batch is handed to the lane's ordered
//! sender under the batch's ticket and a fresh one is taken from the pool; outside a lane
//! (in-memory tests, housekeeping before any lane exists) a flush sends at once.
//!
//! Outbound packets are sealed in two steps so that sequence numbers follow arrival order
//! while the encryption runs in parallel: at dispatch the inner packet is copied into the
//! send batch behind room for the ESP header, a sequence number is allocated and the exact
//! ESP length committed ([`Out::queue_seal`]); before the batch leaves, every queued packet
//! is sealed in place ([`Out::seal_queued`]). In relay mode the room reserved in front of
//! the ESP packet also holds the Geneve, IP and UDP headers toward the steer node, written
//! once the packet is sealed (the inner IPv6 UDP checksum covers the ciphertext): no copy,
//! and equal-size datagrams to one steer node still form GSO trains.

use crate::batch::{AcceptJob, TxBatch};
use crate::feature::Held;
use crate::pipeline::charge::{Charge, TenantSlot};
use crate::relays;
use crate::shared::{tx_batch_size, Shared};
use crate::stats::{DropCounts, DropReason};
use crate::tables::{Child, Tables};
use crate::vnet::neigh::NeighMemo;
use crate::vnet::Vnet;
use esp::Unaccepted;
use std::cell::Cell;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use wire::EspSpi;

/// The output stage as the send batch sees it (implemented by
/// [`crate::io::output::Output`]): sends a finished batch. The lane's ordered sender calls it
/// in ticket order, once per batch (one dynamic call per batch, none per packet).
pub(crate) trait Transmit: Send {
    /// Accepts the batch's inbound ESP packets and sends its datagrams and TUN packets;
    /// counts what it drops in `drops`.
    fn transmit(&mut self, sh: &Shared, tx: &TxBatch, drops: &mut DropCounts);
}

/// The destination address recorded for TUN packets in a send batch (unused by the device).
pub(crate) const TUN_DST: SocketAddr = crate::batch::UNSPECIFIED;

/// Socket index that stands for the TUN device in a send batch (decrypted packets written
/// to it keep the lane's order like datagrams do).
pub(crate) const TUN_SOCK: usize = usize::MAX;

/// Socket indexes from here on (below [`TUN_SOCK`]) stand for the AF_PACKET interfaces of
/// attachments, `PACKET_SOCK_BASE + i` for interface `i` (frames toward customers' edge
/// routers keep the lane's order like datagrams do).
pub(crate) const PACKET_SOCK_BASE: usize = usize::MAX / 2;

/// An ESP packet committed to the send batch but not sealed yet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SealJob {
    /// Offset of the datagram in the send batch.
    pub(crate) start: usize,
    /// Bytes in front of the ESP packet (relay mode: Geneve, IP and UDP headers; else 0).
    pub(crate) prefix: usize,
    /// The ESP packet's exact sealed length.
    pub(crate) len: usize,
    /// Length of the inner packet at `start + prefix + header_len`.
    pub(crate) inner_len: usize,
    /// The sequence number allocated for it.
    pub(crate) seq: u64,
    /// Inbound SPI of the CHILD_SA (the key of `Tables::by_spi`).
    pub(crate) child: EspSpi,
    /// The CHILD_SA's tenant (the CPU charge).
    pub(crate) tenant: TenantSlot,
}

/// How a packet held for its tenant's feature chain goes on once the chain let it through.
pub(crate) enum Resume {
    /// Decrypted: to the CHILD_SA's inside interface, then accepted by its replay window.
    Inbound {
        /// The CHILD_SA that opened it.
        child: Arc<Child>,
        /// What the replay window decides on.
        packet: Unaccepted,
        /// Where the ESP packet arrived.
        local: SocketAddr,
        /// Where it came from.
        src: SocketAddr,
    },
    /// From this VNet: to the seal stage, which chooses the CHILD_SA among the VNet's tunnels.
    FromVnet(Arc<Vnet>),
    /// From a CE attached to this VNet, for none of its VMs: held in [`CeBound`] for the seal
    /// stage (a packet no tunnel covers is `no_route`).
    FromCe(Arc<Vnet>),
    /// From a CE attached to this VNet, toward its VMs (the VNet's tenant's inbound chain
    /// ran): delivered to the VM its destination names.
    CeToVnet(Arc<Vnet>),
    /// Read from the TUN device: to the seal stage, which chooses among the TUN tunnels. With
    /// `same_tenant` (TUN tunnels of several tenants) the choice must be a tunnel whose tenant
    /// has the chain that ran.
    FromTun {
        /// The chosen tunnel's tenant must be the chain's.
        same_tenant: bool,
    },
}

/// A CE's packet held for the VNet's tunnels (see [`CeBound`]).
struct Bound {
    vnet: Arc<Vnet>,
    start: usize,
    len: usize,
    /// Numbered and queued already.
    done: bool,
}

/// The packets of an attachment lane batch bound for the VNets' tunnels, held (copied, the
/// feature chains run) from the lane's pass until they are numbered in the order of their
/// VNet's VTEP lane, where the VMs' packets for the same CHILD_SAs are numbered
/// (`worker::batch`): one ordering domain per CHILD_SA, so the peer receives its sequence
/// numbers in order whichever lane a packet came from. The buffer is allocated once, on
/// first use, as large as a lane batch's input.
pub(crate) struct CeBound {
    buf: Vec<u8>,
    packets: Vec<Bound>,
    capacity: usize,
}

impl CeBound {
    /// Room for `capacity` bytes of packets.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            buf: Vec::new(),
            packets: Vec::new(),
            capacity,
        }
    }

    /// Holds a copy of `pkt` for `vnet`'s tunnels; false if there is no room (cannot happen
    /// within one lane batch: the buffer holds a whole batch's input).
    pub(crate) fn hold(&mut self, vnet: &Arc<Vnet>, pkt: &[u8]) -> bool {
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(self.capacity);
        }
        if self.buf.len() + pkt.len() > self.capacity {
            return false;
        }
        self.packets.push(Bound {
            vnet: Arc::clone(vnet),
            start: self.buf.len(),
            len: pkt.len(),
            done: false,
        });
        self.buf.extend_from_slice(pkt);
        true
    }

    /// True when nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.packets.iter().all(|p| p.done)
    }

    /// The local VTEP of the first packet still held.
    pub(crate) fn next_vtep(&self) -> Option<usize> {
        self.packets.iter().find(|p| !p.done).map(|p| p.vnet.vtep)
    }

    /// Hands every held packet whose VNet's VTEP `pick` accepts to `f`, in the order they were
    /// held, and marks it done; empties the buffer once all are.
    pub(crate) fn take(
        &mut self,
        mut pick: impl FnMut(usize) -> bool,
        mut f: impl FnMut(&Arc<Vnet>, &mut [u8]),
    ) {
        for p in self.packets.iter_mut().filter(|p| !p.done) {
            if pick(p.vnet.vtep) {
                p.done = true;
                f(&p.vnet, &mut self.buf[p.start..p.start + p.len]);
            }
        }
        if self.packets.iter().all(|p| p.done) {
            self.packets.clear();
            self.buf.clear();
        }
    }
}

/// The lane and ticket of the batch being processed.
#[derive(Debug, Clone, Copy)]
struct InLane {
    lane: usize,
    ticket: u64,
}

/// What the packet paths write to.
pub(crate) struct Out {
    /// Datagrams to send.
    pub(crate) tx: TxBatch,
    /// Drops of the current batch.
    pub(crate) drops: DropCounts,
    /// Relay health probes answered in the current batch.
    pub(crate) probes_answered: u64,
    /// Addresses the neighbour caches want requests sent for.
    pub(crate) requests: Vec<IpAddr>,
    /// Recent resolutions (decrypted packets toward VMs).
    pub(crate) resolved: NeighMemo,
    /// Recent learnings (frames from VMs).
    pub(crate) learned: NeighMemo,
    /// Packets held for the tenants' feature chains until the end of the pass.
    pub(crate) held: Held<Resume>,
    /// A CE's packets for the tunnels, held until they are numbered in their VTEP lane.
    pub(crate) ce_bound: CeBound,
    /// The worker owning this (None: standalone, flushes send directly).
    pub(crate) worker: Option<usize>,
    in_lane: Option<InLane>,
    /// The SA tables of the current batch (for sealing queued packets).
    tables: Option<Arc<Tables>>,
    /// When the current batch began (relay mode: which steer nodes count as heard from).
    now: Instant,
    /// The steer node this batch's relayed output goes to, once chosen (one choice per batch:
    /// a GSO train is never split between two steer nodes).
    relay_dst: Cell<Option<Option<SocketAddr>>>,
    seals: Vec<SealJob>,
    /// Send batches passed on so far (tells [`Out::defer_accept`] whether the batch changed
    /// since its [`Mark`]).
    generation: u64,
    parts: Vec<TxBatch>,
    /// The output stage (scratch space, the TUN writer).
    output: Box<dyn Transmit>,
    /// The CPU charge of the current batch (None: `cpu_fairness` is off).
    pub(crate) charge: Option<Box<Charge>>,
}

impl Out {
    /// Output for batches of `batch` datagrams through the output stage `output`, holding up
    /// to `hold` bytes of packets for the feature chains (the largest input a lane delivers
    /// in one batch); standalone (flushes send at once) until [`worker`](Self::worker) is set
    /// and batches are begun.
    pub(crate) fn new(batch: usize, hold: usize, output: Box<dyn Transmit>) -> Self {
        let (msgs, bytes) = tx_batch_size(batch);
        Self {
            tx: TxBatch::new(msgs, bytes, true),
            drops: DropCounts::default(),
            probes_answered: 0,
            requests: Vec::new(),
            resolved: NeighMemo::default(),
            learned: NeighMemo::default(),
            held: Held::new(hold),
            ce_bound: CeBound::new(hold),
            worker: None,
            in_lane: None,
            tables: None,
            now: Instant::now(),
            relay_dst: Cell::new(None),
            seals: Vec::with_capacity(msgs),
            generation: 0,
            parts: Vec::new(),
            output,
            charge: None,
        }
    }

    /// Starts a batch of lane `lane` with ticket `ticket` over the SA tables `tables`, begun
    /// at `now`.
    pub(crate) fn begin(&mut self, lane: usize, ticket: u64, tables: Arc<Tables>, now: Instant) {
        self.in_lane = Some(InLane { lane, ticket });
        self.tables = Some(tables);
        self.now = now;
        self.relay_dst.set(None);
    }

    /// Self-dispatch: the current batch's share of the virtual MACs of VNI `vni` (None: the
    /// VNet is not dispatched, or no batch is under way).
    #[inline]
    pub(crate) fn dispatch_share(
        &self,
        vni: wire::vxlan::Vni,
    ) -> Option<&crate::vnet::vmacs::Share> {
        self.tables.as_deref()?.dispatch.as_deref()?.share(vni)
    }

    /// The SA tables of the current batch (an empty set outside a batch).
    pub(crate) fn tables(&self) -> Arc<Tables> {
        self.tables.clone().unwrap_or_default()
    }

    /// Relay mode: where datagrams toward peers go in this batch (the first steer node of the
    /// batch's tables heard from recently, see [`relays::Relays::output`], chosen once per
    /// batch); None without one.
    #[inline]
    pub(crate) fn relay_output(&self) -> Option<SocketAddr> {
        if let Some(dst) = self.relay_dst.get() {
            return dst;
        }
        let dst = self
            .tables
            .as_deref()
            .and_then(|t| t.relays.as_deref())
            .and_then(|r| r.output(self.now));
        self.relay_dst.set(Some(dst));
        dst
    }

    /// Sets the SA tables queued seals are looked up in (standalone use), the batch begun now.
    #[cfg(test)]
    pub(crate) fn use_tables(&mut self, tables: Arc<Tables>) {
        self.tables = Some(tables);
        self.now = Instant::now();
        self.relay_dst.set(None);
    }

    /// Sets when the current batch began (standalone use: an injected clock).
    #[cfg(test)]
    pub(crate) fn set_now(&mut self, now: Instant) {
        self.now = now;
        self.relay_dst.set(None);
    }

    /// A packet of `slot`'s tenant: charged from here on to its tenant (one branch while
    /// `cpu_fairness` is off). False if it is to be dropped for its tenant's fair share (the
    /// drop is counted per tenant here, and as `fair_share` by the caller's
    /// [`fair_share`](Self::fair_share)).
    #[inline]
    #[must_use]
    pub(crate) fn tenant(&mut self, slot: TenantSlot) -> bool {
        match self.charge.as_deref_mut() {
            Some(c) => c.enter(slot),
            None => true,
        }
    }

    /// A packet whose tenant is not known (dropped before it could be): what follows is
    /// charged to no tenant.
    #[inline]
    pub(crate) fn no_tenant(&mut self) {
        if let Some(c) = self.charge.as_deref_mut() {
            c.switch(crate::pipeline::charge::NO_TENANT, 1);
        }
    }

    /// Counts a drop for the tenant's fair share (after [`tenant`](Self::tenant) said so).
    #[cold]
    pub(crate) fn fair_share(&mut self) {
        self.drops.add(DropReason::FairShare);
    }

    /// Counts a drop.
    pub(crate) fn drop_packet(&mut self, reason: DropReason) {
        self.drops.add(reason);
    }

    /// Room for a datagram of up to `max` bytes, passing the batch on first if needed; None
    /// (counted as too big) if it cannot fit even an empty batch.
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

    /// Commits a datagram of `egress.prefix + len` bytes from `egress.sock` to `egress.dst`:
    /// an ESP packet of `len` bytes behind `egress.prefix` bytes of relay headers, whose
    /// inner packet (`inner_len` bytes) was written behind the ESP header in the last
    /// [`room`](Self::room). It is sealed with `seq` (and its relay headers written) before
    /// the batch leaves.
    pub(crate) fn queue_seal(
        &mut self,
        child: &Child,
        egress: Egress,
        len: usize,
        inner_len: usize,
        seq: u64,
    ) {
        let start = self.tx.commit(egress.sock, egress.dst, egress.prefix + len);
        self.seals.push(SealJob {
            start,
            prefix: egress.prefix,
            len,
            inner_len,
            seq,
            child: child.inbound_spi,
            tenant: child.tenant,
        });
    }

    /// Where the send batch stands, before a packet's output is written.
    pub(crate) fn mark(&self) -> Mark {
        Mark {
            generation: self.generation,
            used: self.tx.data().len(),
        }
    }

    /// Records an authentic inbound ESP packet for acceptance in arrival order (see
    /// [`crate::accept`]); its output is what was committed since `mark`. Call after the
    /// packet's output is written, so the job travels with the batch that carries it.
    pub(crate) fn defer_accept(&mut self, mark: Mark, mut job: AcceptJob) {
        let used = self.tx.data().len();
        // If the batch was passed on in between, what was written before that left with it:
        // only extra datagrams (an ARP/ND probe), because every path writes the packet's own
        // datagram last, into the batch that is current now.
        let start = if mark.generation == self.generation {
            mark.used
        } else {
            0
        };
        job.output = start..used;
        if self.tx.tables.is_none() {
            self.tx.tables = self.tables.clone();
        }
        self.tx.accepts.push(job);
    }

    /// Seals every queued ESP packet in place.
    pub(crate) fn seal_queued(&mut self) {
        if self.seals.is_empty() {
            return;
        }
        let Some(tables) = self.tables.as_deref() else {
            // Cannot happen: packets are queued only with the batch's tables set.
            tracing::error!(
                packets = self.seals.len(),
                "ESP packets queued without SA tables"
            );
            self.seals.clear();
            return;
        };
        let data = self.tx.data_mut();
        let mut last: Option<(EspSpi, &Arc<Child>)> = None;
        for job in self.seals.drain(..) {
            if let Some(c) = self.charge.as_deref_mut() {
                c.switch(job.tenant, 1);
            }
            let child = match last {
                Some((spi, c)) if spi == job.child => c,
                _ => match tables.by_spi.get(&job.child) {
                    Some(c) => {
                        last = Some((job.child, c));
                        c
                    }
                    None => {
                        tracing::error!(spi = %job.child, "queued ESP packet lost its SA");
                        self.drops.add(DropReason::EspSeal);
                        continue;
                    }
                },
            };
            let Some(buf) = data.get_mut(job.start..job.start + job.prefix + job.len) else {
                self.drops.add(DropReason::EspSeal);
                continue;
            };
            let sealed = child
                .state
                .sa
                .seal_with_seq(&mut buf[job.prefix..], job.inner_len, job.seq)
                .map_err(|e| e.to_string())
                .and_then(|_| {
                    if job.prefix == 0 {
                        return Ok(());
                    }
                    relays::write_headers(buf, child.local, child.remote, job.len)
                        .map_err(|e| format!("relay headers: {e}"))
                });
            if let Err(e) = sealed {
                // The lengths were computed by the same SA and the addresses checked at
                // install: only a cipher failure gets here. The datagram is already in the
                // batch: blank it, so no plaintext leaves (the receiver drops zeros).
                tracing::error!(tunnel = child.tunnel.0, spi = %child.outbound_spi, error = %e, "cannot seal");
                buf.fill(0);
                self.drops.add(DropReason::EspSeal);
            }
        }
    }

    /// Passes the send batch on: seals what is queued, then hands it to the lane's ordered
    /// sender (taking a fresh batch from the pool), or sends it at once outside a lane.
    pub(crate) fn flush(&mut self, sh: &Shared) {
        self.pass_on(sh, false);
    }

    /// Ends the current lane batch: everything goes to the lane as the batch's last part.
    pub(crate) fn finish(&mut self, sh: &Shared) {
        self.pass_on(sh, true);
        self.in_lane = None;
        self.tables = None;
    }

    fn pass_on(&mut self, sh: &Shared, last: bool) {
        self.seal_queued();
        self.generation = self.generation.wrapping_add(1);
        match (self.in_lane, self.worker) {
            (Some(InLane { lane, ticket }), Some(worker)) => {
                let fresh = sh.pools[worker].take(&sh.waker);
                let part = std::mem::replace(&mut self.tx, fresh);
                let (output, drops, parts) = (&mut self.output, &mut self.drops, &mut self.parts);
                let send = || {
                    sh.lanes[lane].submit(ticket, part, last, parts, |p| {
                        output.transmit(sh, &p, drops);
                        sh.pools[p.owner].give(p);
                    })
                };
                match self.charge.as_deref_mut() {
                    Some(c) => c.syscall(send),
                    None => send(),
                }
            }
            _ => {
                let (output, drops, tx) = (&mut self.output, &mut self.drops, &self.tx);
                let mut send = || output.transmit(sh, tx, drops);
                match self.charge.as_deref_mut() {
                    Some(c) => c.syscall(send),
                    None => send(),
                }
                self.tx.clear();
            }
        }
        sh.drops.absorb(&mut self.drops);
        if self.probes_answered != 0 {
            sh.relay_probes_answered
                .fetch_add(self.probes_answered, Ordering::Relaxed);
            self.probes_answered = 0;
        }
    }
}

/// Where an ESP packet toward a peer goes: the CHILD_SA's NAT-T socket and the peer, or (relay
/// mode) the Geneve socket and a steer node, with room for the relay headers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Egress {
    /// Sending socket.
    pub(crate) sock: usize,
    /// Destination.
    pub(crate) dst: SocketAddr,
    /// Bytes in front of the ESP packet (relay headers).
    pub(crate) prefix: usize,
}

/// A position in the send batch being filled (see [`Out::mark`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    generation: u64,
    used: usize,
}
