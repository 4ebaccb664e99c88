//! The output stage: hands finished send batches to the kernel. It runs in a lane's ordered
//! sender ([`crate::lane`]), so batches leave in ticket (arrival) order: first the replay window
//! accepts the inbound ESP packets the batch carries ([`crate::accept`]), then the datagrams of
//! each socket leave in one `sendmmsg` series, consecutive equal-size datagrams to one
//! destination as UDP GSO trains, and packets for the TUN device are coalesced per flow into
//! GSO super-packets and written once per batch.

use crate::accept::{accept_batch, is_dead};
use crate::batch::{TxBatch, TxMsg};
#[cfg(test)]
use crate::out::Out;
use crate::out::{Transmit, PACKET_SOCK_BASE, TUN_SOCK};
use crate::shared::{tx_batch_size, Shared};
use crate::stats::{DropCounts, DropReason};
use crate::sys::tun_offload::writer::TunWriter;
use netio::packet::PacketScratch;
use netio::SendScratch;
use std::ops::Range;

/// The output stage of one worker: what it needs to send batches (for its own lane turns and
/// for other workers' batches it sends as the lane's ordered sender).
pub(crate) struct Output {
    /// What hands datagrams and TUN packets to the kernel.
    wire: Wire,
    /// A batch's messages grouped by socket (reused).
    grouped: Vec<TxMsg>,
    /// A batch's datagrams copied in socket order (reused; see [`Output::transmit`]).
    staging: TxBatch,
    /// Output of inbound packets the replay window refused (reused; see [`crate::accept`]).
    dead: Vec<Range<usize>>,
}

/// The system-call side of sending.
struct Wire {
    /// sendmmsg scratch.
    scratch: SendScratch,
    /// sendmmsg scratch of the attachments' packet sockets (used where the kernel refused
    /// their transmit rings).
    packet: PacketScratch,
    /// Coalesces packets written to the TUN device into GSO super-packets.
    tun: Option<TunWriter>,
}

impl Output {
    /// The output stage of a worker of `sh` sending batches of up to `batch` datagrams
    /// (with a TUN writer when the data plane has a TUN device).
    pub(crate) fn new(sh: &Shared, batch: usize) -> Self {
        let (msgs, bytes) = tx_batch_size(batch);
        Self {
            wire: Wire {
                scratch: SendScratch::default(),
                packet: PacketScratch::default(),
                tun: sh
                    .io
                    .tun
                    .as_ref()
                    .map(|t| TunWriter::new(t.offloads(), bytes, msgs)),
            },
            grouped: Vec::with_capacity(msgs),
            staging: TxBatch::new(msgs, bytes, true),
            dead: Vec::with_capacity(msgs),
        }
    }

    /// A worker's output stage and its send batch (tests: no pool, no lane).
    #[cfg(test)]
    pub(crate) fn standalone(sh: &Shared, batch: usize) -> Out {
        Out::new(
            batch,
            super::input::largest_batch(batch),
            Box::new(Self::new(sh, batch)),
        )
    }
}

impl Transmit for Output {
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
    fn transmit(&mut self, sh: &Shared, tx: &TxBatch, drops: &mut DropCounts) {
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
        if let (Some(w), Some(dev)) = (self.wire.tun.as_mut(), &sh.io.tun) {
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
            } else if sock >= PACKET_SOCK_BASE {
                self.send_frames(sh, sock - PACKET_SOCK_BASE, tx.data(), &msgs[i..j], drops);
            } else {
                match sh.io.socks.get(sock) {
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

    /// Sends frames toward customers' edge routers on packet interface `iface`: the run
    /// written into the interface's transmit ring and handed over with one `send` (or one
    /// `sendmmsg` series without a ring; trains of equal-size frames split).
    fn send_frames(
        &mut self,
        sh: &Shared,
        iface: usize,
        data: &[u8],
        msgs: &[TxMsg],
        drops: &mut DropCounts,
    ) {
        let Some(sock) = sh.io.packet.get(iface) else {
            let n: usize = msgs.iter().map(|m| m.segments()).sum();
            return drops.add_n(DropReason::NoSocket, n as u64);
        };
        let frames = msgs.iter().flat_map(|m| {
            let end = (m.start + m.len).min(data.len());
            data[m.start.min(end)..end].chunks(m.seg.max(1))
        });
        let r = sock.send_frames(frames, &mut self.packet);
        drops.add_n(DropReason::SendError, r.refused);
        drops.add_n(DropReason::AttachTxFull, r.queue_full);
    }

    fn write_tun(&mut self, sh: &Shared, data: &[u8], msgs: &[TxMsg], drops: &mut DropCounts) {
        let (Some(w), Some(dev)) = (self.tun.as_mut(), &sh.io.tun) else {
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

/// Sockets numbered below this are grouped by counting them; a batch with any other (the
/// attachments' packet sockets, the TUN device) is sorted.
const COUNTED_SOCKETS: usize = 256;

/// `msgs` into `out`, grouped by socket, each socket's messages in their order. With socket
/// numbers below [`COUNTED_SOCKETS`] (the UDP sockets) a counting sort, linear in the batch:
/// the VTEP's 16 source-port sockets alternate in every batch of many flows, where a
/// comparison sort of a 64-message batch cost about 19 ns a packet (docs/performance.md,
/// "The profile").
fn group_by_socket(msgs: &[TxMsg], out: &mut Vec<TxMsg>) {
    out.clear();
    out.extend_from_slice(msgs);
    if msgs.iter().any(|m| m.sock >= COUNTED_SOCKETS) {
        // Offsets in the batch are unique and rise with the order of the messages: as a
        // tie-break they make the unstable (allocation-free) sort stable.
        out.sort_unstable_by_key(|m| (m.sock, m.start));
        return;
    }
    let mut next = [0u16; COUNTED_SOCKETS];
    for m in msgs {
        next[m.sock] += 1;
    }
    let mut at = 0u16;
    for n in next.iter_mut() {
        let count = *n;
        *n = at;
        at += count;
    }
    for m in msgs {
        let slot = &mut next[m.sock];
        out[usize::from(*slot)] = *m;
        *slot += 1;
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
    group_by_socket(tx.messages(), grouped);
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
    use std::net::SocketAddr;

    proptest::proptest! {
        /// Counting or sorting, the grouping is the stable sort by socket.
        #[test]
        fn grouping_is_the_stable_sort_by_socket(
            socks in proptest::collection::vec(
                proptest::prop_oneof![0usize..20, 200usize..300, proptest::strategy::Just(usize::MAX)],
                0..200,
            ),
        ) {
            let dst = SocketAddr::from(([10, 0, 0, 2], 4789));
            let msgs: Vec<TxMsg> = socks
                .iter()
                .enumerate()
                .map(|(i, &sock)| TxMsg { sock, dst, start: i * 10, len: 10, seg: 10 })
                .collect();
            let mut want = msgs.clone();
            want.sort_by_key(|m| m.sock);
            let mut got = Vec::new();
            group_by_socket(&msgs, &mut got);
            proptest::prop_assert_eq!(got, want);
        }
    }

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
