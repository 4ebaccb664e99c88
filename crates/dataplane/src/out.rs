//! What a worker writes to: [`Out`] holds the send batch being filled (from the worker's
//! pool), the ESP packets waiting to be sealed in it, the batch's drop counts and the
//! worker's neighbour memos; [`Worker`] adds the receive batch.
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

use crate::accept::{accept_batch, is_dead, AcceptJob};
use crate::batch::{TxBatch, TxMsg};
use crate::path::relay;
use crate::shared::{rx_slots, tx_batch_size, Shared};
use crate::stats::{DropCounts, DropReason};
use crate::sys::tun::TunReadBatch;
use crate::sys::tun_offload::TunWriter;
use crate::tables::{Child, Tables};
use crate::vnet::neigh::NeighMemo;
use netio::{RecvBatch, SendScratch, RX_SLOT};
use std::cell::Cell;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use wire::EspSpi;

/// The destination address recorded for TUN packets in a send batch (unused by the device).
pub(crate) const TUN_DST: SocketAddr = crate::batch::UNSPECIFIED;

/// Socket index that stands for the TUN device in a send batch (decrypted packets written
/// to it keep the lane's order like datagrams do).
pub(crate) const TUN_SOCK: usize = usize::MAX;

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
}

/// A worker's thread-local state.
pub(crate) struct Worker {
    /// Worker index.
    pub(crate) id: usize,
    /// Received datagrams (and the `recvmmsg` scratch).
    pub(crate) rx: RecvBatch,
    /// Frames read from the TUN device (if there is one), GSO super-packets split.
    pub(crate) tun_rx: Option<TunReadBatch>,
    /// Output side.
    pub(crate) out: Out,
}

impl Worker {
    /// Worker `id` of `sh`, its first send batch taken from its pool.
    pub(crate) fn new(sh: &Shared, id: usize) -> Self {
        let slots = rx_slots(sh.cfg.batch);
        let mut out = Out::new(sh.cfg.batch);
        out.worker = Some(id);
        out.tx = sh.pools[id].take(&sh.waker);
        out.sending.wire.tun = sh.tun.as_ref().map(|t| {
            let (msgs, bytes) = tx_batch_size(sh.cfg.batch);
            TunWriter::new(t.offloads(), bytes, msgs)
        });
        Self {
            id,
            rx: RecvBatch::new(slots),
            tun_rx: sh
                .tun
                .as_ref()
                .map(|_| TunReadBatch::new(slots * RX_SLOT, slots)),
            out,
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
    /// The worker owning this (None: standalone, flushes send directly).
    worker: Option<usize>,
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
    /// What sending needs (scratch space, the TUN writer).
    sending: Sending,
}

impl Out {
    /// Standalone output for batches of `batch` datagrams.
    pub(crate) fn new(batch: usize) -> Self {
        let (msgs, bytes) = tx_batch_size(batch);
        Self {
            tx: TxBatch::new(msgs, bytes, true),
            drops: DropCounts::default(),
            probes_answered: 0,
            requests: Vec::new(),
            resolved: NeighMemo::default(),
            learned: NeighMemo::default(),
            worker: None,
            in_lane: None,
            tables: None,
            now: Instant::now(),
            relay_dst: Cell::new(None),
            seals: Vec::with_capacity(msgs),
            generation: 0,
            parts: Vec::new(),
            sending: Sending {
                wire: Wire {
                    scratch: SendScratch::default(),
                    tun: None,
                },
                grouped: Vec::with_capacity(msgs),
                staging: TxBatch::new(msgs, bytes, true),
                dead: Vec::with_capacity(msgs),
            },
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

    /// The SA tables of the current batch (an empty set outside a batch).
    pub(crate) fn tables(&self) -> Arc<Tables> {
        self.tables.clone().unwrap_or_default()
    }

    /// Relay mode: where datagrams toward peers go in this batch (the first steer node of the
    /// batch's tables heard from recently, see [`relay::Relays::output`], chosen once per
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
                    relay::write_headers(buf, child.local, child.remote, job.len)
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
                let (sending, drops) = (&mut self.sending, &mut self.drops);
                sh.lanes[lane].submit(ticket, part, last, &mut self.parts, |p| {
                    sending.send(sh, &p, drops);
                    sh.pools[p.owner].give(p);
                });
            }
            _ => {
                self.sending.send(sh, &self.tx, &mut self.drops);
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

/// What a worker needs to send batches (for its own lane turns and for other workers'
/// batches it sends as the lane's sender).
struct Sending {
    /// What hands datagrams and TUN packets to the kernel.
    wire: Wire,
    /// A batch's messages grouped by socket (reused).
    grouped: Vec<TxMsg>,
    /// A batch's datagrams copied in socket order (reused; see [`Sending::send`]).
    staging: TxBatch,
    /// Output of inbound packets the replay window refused (reused; see [`crate::accept`]).
    dead: Vec<Range<usize>>,
}

/// A position in the send batch being filled (see [`Out::mark`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    generation: u64,
    used: usize,
}

/// The system-call side of sending.
struct Wire {
    /// sendmmsg scratch.
    scratch: SendScratch,
    /// Coalesces packets written to the TUN device into GSO super-packets.
    tun: Option<TunWriter>,
}

impl Sending {
    /// Sends a batch: the messages of each socket in one `sendmmsg` series; packets for the
    /// TUN device coalesced per flow and written once per batch.
    ///
    /// When sockets alternate (decrypted packets of many flows toward hosts leave from the
    /// VTEP's source-port sockets, chosen by flow hash), the datagrams are first copied into
    /// a staging batch grouped by socket, where equal-size datagrams to one host join into
    /// GSO trains again: a copy costs far less than a socket buffer and a trip through the
    /// stack per datagram. A flow always uses one socket and grouping keeps the order within
    /// a socket, so every flow keeps its order.
    ///
    /// Inbound ESP packets the batch carries are accepted first; if the window refuses one,
    /// the batch is sent through the staging copy without its output.
    fn send(&mut self, sh: &Shared, tx: &TxBatch, drops: &mut DropCounts) {
        self.dead.clear();
        if !tx.accepts.is_empty() {
            accept_batch(sh, tx, &mut self.dead, drops);
        }
        let msgs = tx.messages();
        if !self.dead.is_empty() || msgs.windows(2).any(|w| w[0].sock != w[1].sock) {
            let lost = regroup(tx, &self.dead, &mut self.grouped, &mut self.staging);
            drops.add_n(DropReason::TooBig, lost);
            self.wire.send_runs(sh, &self.staging, drops);
            self.staging.clear();
        } else {
            self.wire.send_runs(sh, tx, drops);
        }
        if let (Some(w), Some(dev)) = (self.wire.tun.as_mut(), &sh.tun) {
            if !w.is_empty() {
                let st = w.flush(dev);
                drops.add_n(DropReason::TunWrite, st.failed as u64);
            }
        }
    }
}

impl Wire {
    /// Sends each run of consecutive messages of one socket with one `sendmmsg` series.
    fn send_runs(&mut self, sh: &Shared, tx: &TxBatch, drops: &mut DropCounts) {
        let msgs = tx.messages();
        let mut i = 0;
        while i < msgs.len() {
            let sock = msgs[i].sock;
            let mut j = i + 1;
            while j < msgs.len() && msgs[j].sock == sock {
                j += 1;
            }
            if sock == TUN_SOCK {
                self.write_tun(sh, tx.data(), &msgs[i..j], drops);
            } else {
                match sh.socks.get(sock) {
                    Some(s) => {
                        let data = tx.data();
                        let out = msgs[i..j].iter().map(|m| m.out(data));
                        let r = s.send_batch(out, &mut self.scratch);
                        drops.add_n(DropReason::SendError, r.failed);
                    }
                    None => {
                        let n: usize = msgs[i..j].iter().map(|m| m.segments()).sum();
                        drops.add_n(DropReason::NoSocket, n as u64);
                    }
                }
            }
            i = j;
        }
    }

    fn write_tun(&mut self, sh: &Shared, data: &[u8], msgs: &[TxMsg], drops: &mut DropCounts) {
        let (Some(w), Some(dev)) = (self.tun.as_mut(), &sh.tun) else {
            let n: usize = msgs.iter().map(|m| m.segments()).sum();
            drops.add_n(DropReason::TunWrite, n as u64);
            return;
        };
        for m in msgs {
            let bytes = &data[m.start.min(data.len())..(m.start + m.len).min(data.len())];
            for pkt in bytes.chunks(m.seg.max(1)) {
                let (queued, flushed) = w.push_or_flush(dev, pkt);
                drops.add_n(DropReason::TunWrite, flushed.failed as u64);
                if !queued {
                    drops.add(DropReason::TunWrite);
                }
            }
        }
    }
}

/// Copies the datagrams of `tx` into `staging` grouped by socket (in their order within each
/// socket), where consecutive equal-size datagrams to one destination form GSO trains again,
/// leaving out those that start in a `dead` range (ascending). Returns the datagrams that did
/// not fit (none when `staging` is as large as `tx`).
fn regroup(
    tx: &TxBatch,
    dead: &[Range<usize>],
    grouped: &mut Vec<TxMsg>,
    staging: &mut TxBatch,
) -> u64 {
    grouped.clear();
    grouped.extend_from_slice(tx.messages());
    // Offsets in the batch are unique and rise with the order of the messages: as a tie-break
    // they make the unstable (allocation-free) sort stable.
    grouped.sort_unstable_by_key(|m| (m.sock, m.start));
    staging.clear();
    let data = tx.data();
    let mut lost = 0;
    for m in grouped.iter() {
        let bytes = &data[m.start.min(data.len())..(m.start + m.len).min(data.len())];
        for (i, d) in bytes.chunks(m.seg.max(1)).enumerate() {
            if !dead.is_empty() && is_dead(dead, m.start + i * m.seg.max(1)) {
                continue;
            }
            match staging.room(d.len()) {
                Some(room) => {
                    room[..d.len()].copy_from_slice(d);
                    staging.commit(m.sock, m.dst, d.len());
                }
                None => lost += 1,
            }
        }
    }
    lost
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regrouping_keeps_each_sockets_order_and_rebuilds_trains() {
        let dst = SocketAddr::from(([10, 0, 0, 2], 4789));
        let mut tx = TxBatch::new(64, 1 << 16, true);
        // Flows on sockets 1, 2, 3 interleaved: no two consecutive datagrams share a socket.
        for i in 0..12u8 {
            let room = tx.room(100).expect("room");
            room[0] = i;
            tx.commit(1 + usize::from(i % 3), dst, 100);
        }
        assert_eq!(tx.messages().len(), 12);
        let mut grouped = Vec::new();
        let mut staging = TxBatch::new(64, 1 << 16, true);
        assert_eq!(regroup(&tx, &[], &mut grouped, &mut staging), 0);
        let m = staging.messages();
        assert_eq!(m.len(), 3, "one GSO train per socket: {m:?}");
        assert!(m.iter().all(|t| t.segments() == 4 && t.seg == 100));
        let order: Vec<(usize, u8)> = staging.datagrams().map(|(s, _, d)| (s, d[0])).collect();
        assert_eq!(
            order,
            vec![
                (1, 0),
                (1, 3),
                (1, 6),
                (1, 9),
                (2, 1),
                (2, 4),
                (2, 7),
                (2, 10),
                (3, 2),
                (3, 5),
                (3, 8),
                (3, 11)
            ]
        );
    }
}
