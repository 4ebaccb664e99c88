//! Send batches between the processing stages and the sockets: [`TxBatch`] packs outgoing
//! datagrams back to back in one buffer so that consecutive datagrams to the same destination
//! leave as one UDP GSO (`UDP_SEGMENT`) message. (Received datagrams are in a
//! [`netio::RecvBatch`].)
//!
//! Batches are allocated once per thread; filling and draining them does not allocate.

use crate::stats::DropReason;
use crate::tables::Tables;
use esp::Unaccepted;
use netio::{OutMsg, RX_SLOT};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::ops::Range;
use std::sync::Arc;
use wire::EspSpi;

/// The most segments put in one GSO message (the kernel's UDP_MAX_SEGMENTS is at least 64).
pub(crate) const MAX_GSO_SEGMENTS: usize = 64;

/// The most payload bytes put in one GSO message (stays below the 64 KiB IP packet limit).
pub(crate) const MAX_GSO_BYTES: usize = 64000;

/// An unused address for empty message slots.
pub(crate) const UNSPECIFIED: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));

/// One outgoing message: a datagram, or a GSO train of `seg`-byte datagrams (the last may be
/// shorter) to the same destination from the same socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TxMsg {
    /// Index of the sending socket in the data plane's socket table.
    pub(crate) sock: usize,
    /// Destination.
    pub(crate) dst: SocketAddr,
    /// Offset of the first byte in the batch buffer.
    pub(crate) start: usize,
    /// Total bytes.
    pub(crate) len: usize,
    /// Segment size (`len` for a single datagram).
    pub(crate) seg: usize,
}

impl TxMsg {
    /// Number of datagrams this message carries.
    pub(crate) fn segments(&self) -> usize {
        if self.seg == 0 {
            1
        } else {
            self.len.div_ceil(self.seg).max(1)
        }
    }

    /// The message as `netio` sends it, its bytes in `data` (the batch's buffer).
    pub(crate) fn out<'d>(&self, data: &'d [u8]) -> OutMsg<'d> {
        let end = self.start.saturating_add(self.len).min(data.len());
        OutMsg::train(self.dst, &data[self.start.min(end)..end], self.seg)
    }
}

/// An authentic inbound ESP packet waiting for the replay window's decision (see
/// [`crate::accept`]), carried by the send batch holding what it produced.
#[derive(Debug, Clone)]
pub(crate) struct AcceptJob {
    /// The inbound SA (the key of `Tables::by_spi` in the batch's tables).
    pub(crate) spi: EspSpi,
    /// What the window decides on.
    pub(crate) packet: Unaccepted,
    /// The bytes of the send batch holding what the packet produced (empty: nothing).
    pub(crate) output: Range<usize>,
    /// Why the packet is dropped once accepted (its payload was unusable), if it is.
    pub(crate) fail: Option<DropReason>,
    /// Where it arrived.
    pub(crate) local: SocketAddr,
    /// Where it came from.
    pub(crate) src: SocketAddr,
}

/// Outgoing datagrams packed back to back.
pub(crate) struct TxBatch {
    /// The worker whose pool this batch belongs to (the sender returns it there).
    pub(crate) owner: usize,
    buf: Box<[u8]>,
    used: usize,
    msgs: Vec<TxMsg>,
    max_msgs: usize,
    gso: bool,
    /// Inbound ESP packets whose output this batch carries, to be accepted by the replay
    /// window before it is sent (see [`crate::accept`]), in arrival order.
    pub(crate) accepts: Vec<AcceptJob>,
    /// The SA tables the packets in `accepts` were opened with.
    pub(crate) tables: Option<Arc<Tables>>,
}

impl TxBatch {
    /// A batch of up to `max_msgs` messages in `bytes` bytes; `gso` allows merging trains.
    pub(crate) fn new(max_msgs: usize, bytes: usize, gso: bool) -> Self {
        Self {
            owner: 0,
            buf: vec![0u8; bytes.max(RX_SLOT)].into_boxed_slice(),
            used: 0,
            msgs: Vec::with_capacity(max_msgs.max(1)),
            max_msgs: max_msgs.max(1),
            gso,
            accepts: Vec::with_capacity(max_msgs.max(1)),
            tables: None,
        }
    }

    /// True if nothing is queued.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// True if a datagram of up to `max` bytes may not fit: flush first.
    pub(crate) fn needs_flush(&self, max: usize) -> bool {
        self.msgs.len() >= self.max_msgs || self.buf.len() - self.used < max
    }

    /// Writable room of `max` bytes for the next datagram (None if it does not fit: flush
    /// first). Write the datagram at its start, then [`commit`](Self::commit) its length.
    pub(crate) fn room(&mut self, max: usize) -> Option<&mut [u8]> {
        if self.needs_flush(max) {
            return None;
        }
        Some(&mut self.buf[self.used..self.used + max])
    }

    /// Queues the `len` bytes written at the start of the last [`room`](Self::room), to be sent
    /// from socket `sock` to `dst`. Returns where the datagram starts in the buffer (the bytes
    /// may still be rewritten in place with [`data_mut`](Self::data_mut) before the batch is
    /// sent).
    pub(crate) fn commit(&mut self, sock: usize, dst: SocketAddr, len: usize) -> usize {
        let len = len.min(self.buf.len() - self.used);
        let start = self.used;
        if len == 0 {
            return start;
        }
        self.used += len;
        if self.gso {
            if let Some(last) = self.msgs.last_mut() {
                let train_open = last.len % last.seg == 0;
                if last.sock == sock
                    && last.dst == dst
                    && train_open
                    && len <= last.seg
                    && last.len / last.seg < MAX_GSO_SEGMENTS
                    && last.len + len <= MAX_GSO_BYTES
                    && last.start + last.len == start
                {
                    last.len += len;
                    return start;
                }
            }
        }
        self.msgs.push(TxMsg {
            sock,
            dst,
            start,
            len,
            seg: len,
        });
        start
    }

    /// Queued messages.
    pub(crate) fn messages(&self) -> &[TxMsg] {
        &self.msgs
    }

    /// The buffer the messages point into.
    pub(crate) fn data(&self) -> &[u8] {
        &self.buf[..self.used]
    }

    /// The committed bytes, writable (to finish datagrams in place after committing them).
    pub(crate) fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.used]
    }

    /// The datagrams queued, one slice per datagram (GSO trains split).
    #[cfg(test)]
    pub(crate) fn datagrams(&self) -> impl Iterator<Item = (usize, SocketAddr, &[u8])> + '_ {
        self.msgs.iter().flat_map(move |m| {
            self.buf[m.start..m.start + m.len]
                .chunks(m.seg.max(1))
                .map(move |c| (m.sock, m.dst, c))
        })
    }

    /// Empties the batch.
    pub(crate) fn clear(&mut self) {
        self.msgs.clear();
        self.used = 0;
        self.accepts.clear();
        self.tables = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn put(tx: &mut TxBatch, sock: usize, dst: SocketAddr, len: usize, fill: u8) {
        let room = tx.room(2048).expect("room");
        room[..len].fill(fill);
        tx.commit(sock, dst, len);
    }

    #[test]
    fn equal_datagrams_to_one_destination_form_a_train() {
        let mut tx = TxBatch::new(16, 1 << 20, true);
        put(&mut tx, 0, addr(1), 100, 1);
        put(&mut tx, 0, addr(1), 100, 2);
        put(&mut tx, 0, addr(1), 60, 3); // shorter: closes the train
        put(&mut tx, 0, addr(1), 60, 4); // new message
        put(&mut tx, 0, addr(2), 60, 5); // other destination
        put(&mut tx, 1, addr(2), 60, 6); // other socket
        let m = tx.messages();
        assert_eq!(m.len(), 4);
        assert_eq!((m[0].len, m[0].seg, m[0].segments()), (260, 100, 3));
        assert_eq!((m[1].len, m[1].seg), (60, 60));
        let d: Vec<_> = tx.datagrams().map(|(_, _, c)| (c.len(), c[0])).collect();
        assert_eq!(
            d,
            vec![(100, 1), (100, 2), (60, 3), (60, 4), (60, 5), (60, 6)]
        );
    }

    #[test]
    fn larger_datagram_starts_new_message_and_gso_off_never_merges() {
        let mut tx = TxBatch::new(16, 1 << 20, true);
        put(&mut tx, 0, addr(1), 100, 1);
        put(&mut tx, 0, addr(1), 200, 2);
        assert_eq!(tx.messages().len(), 2);
        let mut tx = TxBatch::new(16, 1 << 20, false);
        put(&mut tx, 0, addr(1), 100, 1);
        put(&mut tx, 0, addr(1), 100, 1);
        assert_eq!(tx.messages().len(), 2);
    }

    #[test]
    fn trains_respect_segment_and_byte_limits() {
        let mut tx = TxBatch::new(1024, 1 << 22, true);
        for _ in 0..MAX_GSO_SEGMENTS + 1 {
            put(&mut tx, 0, addr(1), 10, 0);
        }
        assert_eq!(tx.messages().len(), 2);
        let mut tx = TxBatch::new(1024, 1 << 22, true);
        for _ in 0..50 {
            put(&mut tx, 0, addr(1), 1500, 0);
        }
        assert!(tx.messages().iter().all(|m| m.len <= MAX_GSO_BYTES));
        assert_eq!(tx.datagrams().count(), 50);
    }

    #[test]
    fn messages_hand_their_own_bytes_to_netio() {
        let mut tx = TxBatch::new(16, 1 << 20, true);
        put(&mut tx, 0, addr(1), 100, 1);
        put(&mut tx, 0, addr(1), 100, 2);
        put(&mut tx, 0, addr(2), 30, 3);
        let data = tx.data();
        let out: Vec<_> = tx.messages().iter().map(|m| m.out(data)).collect();
        assert_eq!(
            (out[0].dst, out[0].bytes.len(), out[0].seg),
            (addr(1), 200, 100)
        );
        assert_eq!(out[0].segments(), 2);
        assert_eq!((out[0].bytes[99], out[0].bytes[100]), (1, 2));
        assert_eq!(
            (out[1].dst, out[1].bytes, out[1].segments()),
            (addr(2), &[3; 30][..], 1)
        );
        // A message outside the buffer yields no bytes rather than a panic.
        let stray = TxMsg {
            start: data.len() + 5,
            ..tx.messages()[0]
        };
        assert!(stray.out(data).bytes.is_empty());
    }

    #[test]
    fn room_reports_full_batches() {
        let mut tx = TxBatch::new(2, 1 << 20, false);
        put(&mut tx, 0, addr(1), 10, 0);
        put(&mut tx, 0, addr(1), 10, 0);
        assert!(tx.room(10).is_none());
        tx.clear();
        assert!(tx.is_empty() && tx.room(10).is_some());
    }
}
