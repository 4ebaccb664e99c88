//! Receiving: one `recvmmsg` call fills a [`RecvBatch`]; with UDP GRO a slot holds a train of
//! equal-size datagrams (the `UDP_GRO` control message gives their size), with timestamps the
//! `SCM_TIMESTAMPNS` message gives the kernel's receive time, with the drop counter
//! `SO_RXQ_OVFL` gives the receive queue's drops so far.

use crate::addr::from_sockaddr;
use crate::socket::{UdpSocket, UDP_GRO};
use crate::MAX_BATCH;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

/// Bytes per receive slot: a GRO train is at most 64 KiB, and so is a (reassembled) UDP
/// datagram.
pub const RX_SLOT: usize = 65536;

/// The most datagrams in one train of [`RecvBatch::push_segment`] (as the kernel's UDP GRO,
/// `UDP_GRO_CNT_MAX`).
pub const MAX_TRAIN: usize = 64;

/// Control buffer per slot, 8-byte aligned: room for a GRO size (int), a timestamp
/// (timespec) and a drop count (u32), each behind its `cmsghdr`.
type Cmsg = [u64; 16];

/// Control messages a socket asked for, as bits of the set a receive looks for.
const WANT_GRO: u8 = 1;
const WANT_STAMP: u8 = 2;
const WANT_DROPS: u8 = 4;

/// What the kernel reported for one receive slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecvMeta {
    /// Sender (`None` for an address family other than IPv4 and IPv6).
    pub src: Option<SocketAddr>,
    /// Bytes in the slot.
    pub len: usize,
    /// Datagram size of a GRO train (every datagram but the last has this size); `len` for a
    /// single datagram. Never 0, so `data.chunks(meta.seg)` yields the datagrams.
    pub seg: usize,
    /// The datagram did not fit the slot (`MSG_TRUNC`): its data is incomplete.
    pub truncated: bool,
    /// Kernel receive time in `CLOCK_REALTIME` nanoseconds, if timestamps are on.
    pub stamp_ns: Option<u64>,
    /// The receive queue's count of datagrams dropped so far for lack of buffer space, if the
    /// drop counter is on and the kernel reported it (it does once there were drops).
    pub queue_drops: Option<u32>,
}

/// Receive buffers and `recvmmsg` scratch for one thread: slots of [`RX_SLOT`] bytes each,
/// allocated once (the pages are only touched when the kernel writes them).
pub struct RecvBatch {
    buf: Box<[u8]>,
    meta: Vec<RecvMeta>,
    names: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    ctrl: Vec<Cmsg>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in `iovs` and `hdrs` point into this batch's own buffers; they are
// rebuilt before every receive and never dereferenced between receives, so the batch may move
// to another thread.
unsafe impl Send for RecvBatch {}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBatch")
            .field("capacity", &self.capacity())
            .field("meta", &self.meta)
            .finish_non_exhaustive()
    }
}

impl RecvBatch {
    /// Buffers for `slots` messages (1..=[`MAX_BATCH`]; other values are clamped).
    pub fn new(slots: usize) -> Self {
        let slots = slots.clamp(1, MAX_BATCH);
        // SAFETY: all-zero is a valid value of these plain C structs.
        let (name, iov, hdr): (libc::sockaddr_storage, libc::iovec, libc::mmsghdr) =
            unsafe { (zeroed(), zeroed(), zeroed()) };
        Self {
            buf: vec![0u8; slots * RX_SLOT].into_boxed_slice(),
            meta: Vec::with_capacity(slots),
            names: vec![name; slots],
            iovs: vec![iov; slots],
            ctrl: vec![[0; 16]; slots],
            hdrs: vec![hdr; slots],
        }
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.hdrs.len()
    }

    /// Slots filled (by the last receive, or by [`push`](Self::push)).
    pub fn len(&self) -> usize {
        self.meta.len()
    }

    /// True if no slot is filled.
    pub fn is_empty(&self) -> bool {
        self.meta.is_empty()
    }

    /// Forgets the content.
    pub fn clear(&mut self) {
        self.meta.clear();
    }

    /// The filled slots in order: each one's metadata and bytes.
    pub fn iter(&self) -> impl Iterator<Item = (RecvMeta, &[u8])> + '_ {
        self.buf
            .chunks_exact(RX_SLOT)
            .zip(&self.meta)
            .map(|(slot, m)| (*m, &slot[..m.len.min(RX_SLOT)]))
    }

    /// The filled slots in order, writable (for processing datagrams in place).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (RecvMeta, &mut [u8])> + '_ {
        self.buf
            .chunks_exact_mut(RX_SLOT)
            .zip(&self.meta)
            .map(|(slot, m)| (*m, &mut slot[..m.len.min(RX_SLOT)]))
    }

    /// Slots not filled yet.
    pub fn free_slots(&self) -> usize {
        self.capacity() - self.len()
    }

    /// Adds datagram `data` from `src` as UDP GRO would: to the last slot's train when that
    /// train is from `src`, still open (every datagram so far of its segment size), has room
    /// and fewer than [`MAX_TRAIN`] datagrams, and `data` is no longer than its segment size (a
    /// shorter one closes it); else into a new slot, as [`push`](Self::push). False if no slot
    /// is free.
    pub fn push_segment(&mut self, src: SocketAddr, data: &[u8]) -> bool {
        let i = self.meta.len();
        if let Some(m) = self.meta.last_mut() {
            // An empty datagram is a slot of its own (its `seg` of 1 is no segment size).
            let open = m.len > 0 && m.len % m.seg == 0 && m.len / m.seg < MAX_TRAIN;
            if m.src == Some(src)
                && open
                && !data.is_empty()
                && data.len() <= m.seg
                && m.len + data.len() <= RX_SLOT
            {
                let at = (i - 1) * RX_SLOT + m.len;
                self.buf[at..at + data.len()].copy_from_slice(data);
                m.len += data.len();
                return true;
            }
        }
        self.push(src, data)
    }

    /// Copies a datagram from `src` into the next free slot, as if received (in-memory paths
    /// and tests); false if the batch is full or `data` is larger than a slot.
    pub fn push(&mut self, src: SocketAddr, data: &[u8]) -> bool {
        let i = self.meta.len();
        if i >= self.capacity() || data.len() > RX_SLOT {
            return false;
        }
        self.buf[i * RX_SLOT..i * RX_SLOT + data.len()].copy_from_slice(data);
        self.meta.push(RecvMeta {
            src: Some(src),
            len: data.len(),
            seg: data.len().max(1),
            ..RecvMeta::default()
        });
        true
    }
}

impl UdpSocket {
    /// Receives up to one batch without blocking (`recvmmsg` with `MSG_DONTWAIT`); returns the
    /// number of slots filled, 0 if nothing was waiting. The batch's previous content is
    /// forgotten, also on error.
    pub fn recv_batch(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        batch.meta.clear();
        let RecvBatch {
            buf,
            meta,
            names,
            iovs,
            ctrl,
            hdrs,
        } = batch;
        let n = hdrs.len();
        for ((((slot, iov), name), ctrl), h) in buf
            .chunks_exact_mut(RX_SLOT)
            .zip(iovs.iter_mut())
            .zip(names.iter_mut())
            .zip(ctrl.iter_mut())
            .zip(hdrs.iter_mut())
        {
            *iov = libc::iovec {
                iov_base: slot.as_mut_ptr().cast(),
                iov_len: RX_SLOT,
            };
            h.msg_hdr.msg_name = (name as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = ctrl.as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = size_of::<Cmsg>() as _;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        let got = loop {
            // SAFETY: the n headers point at live names, iovecs, slots and control buffers of
            // the sizes given, all owned by `batch`, which this call borrows mutably.
            let ret = unsafe {
                libc::recvmmsg(
                    self.as_raw_fd(),
                    hdrs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if ret >= 0 {
                break (ret as usize).min(n);
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(0),
                _ => return Err(err),
            }
        };
        let want = self.wanted_cmsgs();
        for (h, name) in hdrs[..got].iter().zip(names.iter()) {
            let len = (h.msg_len as usize).min(RX_SLOT);
            let mut m = RecvMeta {
                src: from_sockaddr(name),
                len,
                seg: len,
                truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
                stamp_ns: None,
                queue_drops: None,
            };
            if want != 0 {
                read_cmsgs(&h.msg_hdr, want, &mut m);
            }
            m.seg = m.seg.max(1);
            meta.push(m);
        }
        Ok(got)
    }

    /// The control messages this socket's receives may carry.
    fn wanted_cmsgs(&self) -> u8 {
        let mut want = 0;
        if self.gro() {
            want |= WANT_GRO;
        }
        if self.timestamps() {
            want |= WANT_STAMP;
        }
        if self.queue_drops() {
            want |= WANT_DROPS;
        }
        want
    }
}

/// Reads the control messages of one received message into `m`, stopping once everything in
/// `want` was found.
fn read_cmsgs(h: &libc::msghdr, mut want: u8, m: &mut RecvMeta) {
    if h.msg_control.is_null() || h.msg_controllen == 0 {
        return;
    }
    // SAFETY: the kernel filled msg_control up to msg_controllen with well-formed cmsghdrs;
    // the CMSG_* functions stay within that range and each payload read is unaligned and of
    // the size the (level, type) pair defines.
    unsafe {
        let mut cm = libc::CMSG_FIRSTHDR(h);
        while !cm.is_null() {
            let data = libc::CMSG_DATA(cm);
            match ((*cm).cmsg_level, (*cm).cmsg_type) {
                (libc::SOL_UDP, UDP_GRO) => {
                    let seg = std::ptr::read_unaligned(data.cast::<libc::c_int>());
                    if let Ok(seg @ 1..) = usize::try_from(seg) {
                        m.seg = seg;
                    }
                    want &= !WANT_GRO;
                }
                (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS) => {
                    let ts = std::ptr::read_unaligned(data.cast::<libc::timespec>());
                    m.stamp_ns = Some(
                        (ts.tv_sec as u64)
                            .wrapping_mul(1_000_000_000)
                            .wrapping_add(ts.tv_nsec as u64),
                    );
                    want &= !WANT_STAMP;
                }
                (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) => {
                    m.queue_drops = Some(std::ptr::read_unaligned(data.cast::<u32>()));
                    want &= !WANT_DROPS;
                }
                _ => {}
            }
            if want == 0 {
                return;
            }
            cm = libc::CMSG_NXTHDR(h, cm);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OutMsg, SendMode, SendScratch, SocketOptions};
    use std::time::{Duration, Instant};

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn push_fills_slots_in_order_until_full() {
        let mut rx = RecvBatch::new(2);
        assert_eq!((rx.capacity(), rx.len()), (2, 0));
        assert!(rx.push(addr(9), b"abc"));
        assert!(rx.push(addr(8), b""));
        assert!(!rx.push(addr(9), b"f"), "full");
        let got: Vec<_> = rx.iter().map(|(m, d)| (m.src, m.seg, d.to_vec())).collect();
        assert_eq!(
            got,
            vec![
                (Some(addr(9)), 3, b"abc".to_vec()),
                (Some(addr(8)), 1, Vec::new())
            ]
        );
        for (_, d) in rx.iter_mut() {
            d.fill(b'z');
        }
        assert_eq!(
            rx.iter().next().map(|(_, d)| d.to_vec()),
            Some(b"zzz".to_vec())
        );
        rx.clear();
        assert!(rx.is_empty());
        let big = vec![0u8; RX_SLOT + 1];
        assert!(!rx.push(addr(9), &big), "larger than a slot");
    }

    #[test]
    fn slot_counts_are_clamped() {
        assert_eq!(RecvBatch::new(0).capacity(), 1);
        assert_eq!(RecvBatch::new(MAX_BATCH + 5).capacity(), MAX_BATCH);
    }

    #[test]
    fn nothing_waiting_is_zero_and_clears_the_batch() {
        let s = UdpSocket::bind(addr(0), &SocketOptions::default()).expect("bind");
        let mut rx = RecvBatch::new(4);
        assert!(rx.push(addr(1), b"old"));
        assert_eq!(s.recv_batch(&mut rx).expect("recv"), 0);
        assert!(rx.is_empty());
    }

    #[test]
    fn timestamps_come_from_the_kernel_clock() {
        let opts = SocketOptions {
            timestamps: true,
            queue_drops: true,
            send_mode: SendMode::Blocking,
            ..SocketOptions::default()
        };
        let std = std::net::UdpSocket::bind(addr(0)).expect("bind");
        let rx_sock = UdpSocket::from_std(std, &opts).expect("from_std");
        assert!(rx_sock.timestamps() && rx_sock.queue_drops());
        let tx_sock = UdpSocket::bind(addr(0), &opts).expect("bind");
        let now_ns = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        };
        let before = now_ns();
        let payload = [1u8; 10];
        let report = tx_sock.send_batch(
            [OutMsg::datagram(rx_sock.local_addr(), &payload)],
            &mut SendScratch::default(),
        );
        assert_eq!(report.sent, 1);
        let mut rx = RecvBatch::new(4);
        let deadline = Instant::now() + Duration::from_secs(5);
        while rx.is_empty() && Instant::now() < deadline {
            rx_sock.recv_batch(&mut rx).expect("recv");
        }
        let (m, _) = rx.iter().next().expect("a datagram");
        let stamp = m.stamp_ns.expect("timestamp");
        assert!(stamp >= before && stamp <= now_ns(), "{before} <= {stamp}");
        // No drops yet: the kernel attaches the counter only once it is non-zero.
        assert_eq!(m.queue_drops, None);
    }
}

#[cfg(test)]
mod train_tests {
    use super::*;

    #[test]
    fn pushed_segments_form_trains_as_gro_does() {
        let a: SocketAddr = "192.0.2.1:4500".parse().expect("a");
        let b: SocketAddr = "192.0.2.2:4500".parse().expect("b");
        let mut batch = RecvBatch::new(8);
        assert!(batch.push_segment(a, &[1; 100]));
        assert!(batch.push_segment(a, &[2; 100]));
        // Shorter: closes the train.
        assert!(batch.push_segment(a, &[3; 60]));
        assert!(batch.push_segment(a, &[4; 100]));
        // Another sender, and a longer datagram: new slots.
        assert!(batch.push_segment(b, &[5; 100]));
        assert!(batch.push_segment(b, &[6; 200]));
        let slots: Vec<(Option<SocketAddr>, usize, usize)> =
            batch.iter().map(|(m, _)| (m.src, m.len, m.seg)).collect();
        assert_eq!(
            slots,
            vec![
                (Some(a), 260, 100),
                (Some(a), 100, 100),
                (Some(b), 100, 100),
                (Some(b), 200, 200)
            ]
        );
        let (_, first) = batch.iter().next().expect("a slot");
        let segs: Vec<u8> = first.chunks(100).map(|c| c[0]).collect();
        assert_eq!(segs, [1, 2, 3]);
        assert_eq!(batch.free_slots(), 4);
    }

    #[test]
    fn a_train_stops_at_the_gro_limit_and_a_full_batch_refuses() {
        let a: SocketAddr = "192.0.2.1:4500".parse().expect("a");
        let mut batch = RecvBatch::new(2);
        for _ in 0..MAX_TRAIN + 1 {
            assert!(batch.push_segment(a, &[0; 10]));
        }
        let lens: Vec<usize> = batch.iter().map(|(m, _)| m.len).collect();
        assert_eq!(lens, [10 * MAX_TRAIN, 10]);
        // The last slot's train is still open; a datagram of another sender finds no slot.
        assert!(!batch.push_segment("192.0.2.9:1".parse().expect("c"), &[0; 10]));
    }

    #[test]
    fn an_empty_datagram_keeps_a_slot_of_its_own() {
        let a: SocketAddr = "192.0.2.1:4500".parse().expect("a");
        let mut batch = RecvBatch::new(4);
        assert!(batch.push_segment(a, &[]));
        assert!(batch.push_segment(a, &[9]));
        let lens: Vec<usize> = batch.iter().map(|(m, _)| m.len).collect();
        assert_eq!(lens, [0, 1]);
    }
}
