//! The steer node's use of `netio`: how its sockets are opened, its receive batch size, and
//! the send batch the forwarding threads build Geneve frames (and relayed datagrams) into.
//!
//! No UDP GRO/GSO here: the steer node forwards datagrams of many flows one by one, each into
//! its own Geneve frame.

use netio::{OutMsg, RecvBatch, SendMode, SendReport, SendScratch, SocketOptions};
use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

pub(crate) use netio::{Poller, Ready, UdpSocket, Waker};

/// Most receive slots per thread (4 MiB of buffers); a larger batch still sends in batches
/// of up to its size.
pub(crate) const MAX_RX_SLOTS: usize = 64;

/// How long a send waits for socket buffer space, at most three times per batch, before the
/// rest of the batch is dropped.
const SEND_BLOCK: Duration = Duration::from_millis(20);

/// Opens a non-blocking UDP socket bound to `addr` (IPV6_V6ONLY on IPv6), with 4 MiB buffers
/// and local fragmentation allowed (a Geneve frame around a full-size datagram may exceed the
/// underlay MTU).
pub(crate) fn bind(addr: SocketAddr) -> io::Result<UdpSocket> {
    let opts = SocketOptions {
        send_mode: SendMode::Bounded(SEND_BLOCK),
        ..SocketOptions::default()
    };
    UdpSocket::bind(addr, &opts)
}

/// A receive batch for a configured `batch` size (1..=[`MAX_RX_SLOTS`] slots).
pub(crate) fn recv_batch(batch: usize) -> RecvBatch {
    RecvBatch::new(batch.clamp(1, MAX_RX_SLOTS))
}

/// One queued datagram.
#[derive(Debug, Clone)]
struct Queued {
    /// Index of the sending socket.
    sock: usize,
    /// Where it goes.
    dst: SocketAddr,
    /// Its bytes in the batch's data.
    bytes: Range<usize>,
}

/// Datagrams built during one batch, and `sendmmsg` scratch.
#[derive(Debug, Default)]
pub(crate) struct TxBatch {
    data: Vec<u8>,
    queued: Vec<Queued>,
    scratch: SendScratch,
}

impl TxBatch {
    /// An empty batch with room reserved for `bytes`.
    pub(crate) fn with_capacity(bytes: usize) -> Self {
        Self {
            data: Vec::with_capacity(bytes),
            ..Self::default()
        }
    }

    /// Forgets the datagrams (keeps the allocations).
    pub(crate) fn clear(&mut self) {
        self.data.clear();
        self.queued.clear();
    }

    /// True if nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    /// Number of datagrams queued.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.queued.len()
    }

    /// The socket index of every datagram queued, in order.
    pub(crate) fn sockets(&self) -> impl Iterator<Item = usize> + '_ {
        self.queued.iter().map(|q| q.sock)
    }

    /// Builds one datagram of at most `max` bytes with `build`, which returns the length it
    /// wrote, to be sent from socket `sock` to `dst`; on error nothing is queued and the error
    /// is returned.
    pub(crate) fn push<E>(
        &mut self,
        sock: usize,
        dst: SocketAddr,
        max: usize,
        build: impl FnOnce(&mut [u8]) -> Result<usize, E>,
    ) -> Result<(), E> {
        let start = self.data.len();
        self.data.resize(start + max, 0);
        match build(&mut self.data[start..]) {
            Ok(len) => {
                let end = start + len.min(max);
                self.data.truncate(end);
                self.queued.push(Queued {
                    sock,
                    dst,
                    bytes: start..end,
                });
                Ok(())
            }
            Err(e) => {
                self.data.truncate(start);
                Err(e)
            }
        }
    }

    /// Sends the datagrams queued for socket index `index` from `sock`, in order. Datagrams
    /// that fail are counted, not retried (a full buffer is waited on briefly).
    pub(crate) fn send(&mut self, sock: &UdpSocket, index: usize) -> SendReport {
        let Self {
            data,
            queued,
            scratch,
        } = self;
        let data = &data[..];
        let msgs = queued
            .iter()
            .filter(|q| q.sock == index)
            .map(|q| OutMsg::datagram(q.dst, data.get(q.bytes.clone()).unwrap_or_default()));
        sock.send_batch(msgs, scratch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn datagrams_leave_from_their_socket_in_order() {
        let a = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut tx = TxBatch::with_capacity(1 << 16);
        for i in 0..20u8 {
            let len = 100 + usize::from(i);
            // Even datagrams on socket index 0, odd ones on index 1.
            tx.push::<()>(usize::from(i % 2), a.local_addr(), 2000, |buf| {
                buf[..len].fill(i);
                Ok(len)
            })
            .unwrap();
        }
        // A failed build queues nothing.
        assert!(tx.push(0, a.local_addr(), 10, |_| Err(())).is_err());
        assert_eq!(tx.len(), 20);
        assert_eq!(tx.sockets().filter(|&s| s == 1).count(), 10);
        let sent = |tx: &mut TxBatch, index| tx.send(&b, index);
        assert_eq!(
            sent(&mut tx, 1),
            SendReport {
                sent: 10,
                failed: 0
            }
        );
        assert_eq!(
            sent(&mut tx, 0),
            SendReport {
                sent: 10,
                failed: 0
            }
        );
        assert_eq!(sent(&mut tx, 2), SendReport::default());
        let mut rx = recv_batch(1000);
        assert_eq!(rx.capacity(), MAX_RX_SLOTS);
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < 20 && Instant::now() < deadline {
            a.recv_batch(&mut rx).unwrap();
            for (m, d) in rx.iter() {
                assert_eq!(m.src, Some(b.local_addr()));
                got.push((d.len(), d[0]));
            }
        }
        let odd = (0..20u8).filter(|i| i % 2 == 1);
        let even = (0..20u8).filter(|i| i % 2 == 0);
        let want: Vec<_> = odd.chain(even).map(|i| (100 + usize::from(i), i)).collect();
        assert_eq!(got, want);
        tx.clear();
        assert!(tx.is_empty());
    }
}
