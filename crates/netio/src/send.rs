//! Sending: [`OutMsg`]s go to the kernel with `sendmmsg`, a GSO train as one message with a
//! `UDP_SEGMENT` control message while the socket uses GSO, else datagram by datagram. A
//! train the kernel refuses is resent as single datagrams (which the kernel may fragment).

use crate::addr::{from_sockaddr, to_sockaddr};
use crate::socket::{SendMode, UdpSocket, UDP_SEGMENT};
use crate::MAX_BATCH;
use std::io;
use std::iter::Peekable;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

/// Control buffer per message, 8-byte aligned: room for one `cmsghdr` with a u16
/// (`CMSG_SPACE(2)` is 24 bytes on 64-bit Linux, 16 on 32-bit).
type Cmsg = [u64; 4];

/// One outgoing message: a datagram, or a GSO train of `seg`-byte datagrams (the last may be
/// shorter) to one destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutMsg<'d> {
    /// Destination.
    pub dst: SocketAddr,
    /// The bytes: one datagram, or the datagrams of a train back to back.
    pub bytes: &'d [u8],
    /// Datagram size of a train; 0, or at least `bytes.len()`, for a single datagram.
    pub seg: usize,
}

impl<'d> OutMsg<'d> {
    /// A single datagram.
    pub fn datagram(dst: SocketAddr, bytes: &'d [u8]) -> Self {
        Self {
            dst,
            bytes,
            seg: bytes.len(),
        }
    }

    /// A train of `seg`-byte datagrams (the last may be shorter) in `bytes`.
    pub fn train(dst: SocketAddr, bytes: &'d [u8], seg: usize) -> Self {
        Self { dst, bytes, seg }
    }

    /// The size of each datagram but the last (`bytes.len()` for a single datagram).
    fn segment(&self) -> usize {
        if self.seg == 0 || self.seg > self.bytes.len() {
            self.bytes.len()
        } else {
            self.seg
        }
    }

    /// Number of datagrams this message carries (1 for an empty one).
    pub fn segments(&self) -> usize {
        match self.segment() {
            0 => 1,
            seg => self.bytes.len().div_ceil(seg),
        }
    }
}

/// What a batch send achieved.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SendReport {
    /// Datagrams handed to the kernel.
    pub sent: u64,
    /// Datagrams dropped because of send errors or a full socket buffer.
    pub failed: u64,
}

/// One `mmsghdr` of a batch being sent: how many datagrams it carries and, for a GSO train,
/// their size.
#[derive(Debug, Clone, Copy)]
struct Part {
    datagrams: usize,
    /// Segment size of a GSO train; 0 for a single datagram.
    train_seg: usize,
}

/// Scratch space for `sendmmsg`, kept per thread so that sends do not allocate (it grows to
/// the largest batch sent, at most [`MAX_BATCH`] messages per call).
#[derive(Default)]
pub struct SendScratch {
    names: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    ctrl: Vec<Cmsg>,
    hdrs: Vec<libc::mmsghdr>,
    parts: Vec<Part>,
}

// SAFETY: the raw pointers inside the scratch vectors point into the scratch itself and into
// the messages of one `send_batch` call, only during that call; between calls they dangle but
// are never dereferenced, so the scratch may move to another thread.
unsafe impl Send for SendScratch {}

impl std::fmt::Debug for SendScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendScratch")
            .field("capacity", &self.hdrs.capacity())
            .finish_non_exhaustive()
    }
}

impl SendScratch {
    fn clear(&mut self) {
        self.names.clear();
        self.iovs.clear();
        self.ctrl.clear();
        self.hdrs.clear();
        self.parts.clear();
    }

    /// Queues one `mmsghdr` for `bytes` to `name`, with a `UDP_SEGMENT` control message of
    /// `seg` bytes if given. The pointers are set by [`point`](Self::point).
    fn push(
        &mut self,
        name: &(libc::sockaddr_storage, libc::socklen_t),
        bytes: &[u8],
        seg: Option<u16>,
        part: Part,
    ) {
        self.names.push(name.0);
        self.iovs.push(libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        });
        let mut ctrl: Cmsg = [0; 4];
        let mut controllen = 0;
        if let Some(seg) = seg {
            // SAFETY: builds one cmsghdr with a u16 payload at the start of `ctrl`, which is
            // 8-byte aligned and 32 bytes long, more than CMSG_SPACE(2); the temporary msghdr
            // only tells the CMSG functions where that buffer is.
            unsafe {
                let mut mh: libc::msghdr = zeroed();
                mh.msg_control = ctrl.as_mut_ptr().cast();
                mh.msg_controllen = libc::CMSG_SPACE(size_of::<u16>() as u32) as _;
                let cm = libc::CMSG_FIRSTHDR(&mh);
                (*cm).cmsg_level = libc::SOL_UDP;
                (*cm).cmsg_type = UDP_SEGMENT;
                (*cm).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<u16>(), seg);
                controllen = mh.msg_controllen;
            }
        }
        self.ctrl.push(ctrl);
        // SAFETY: all-zero is a valid mmsghdr; the pointers are set by `point`.
        let mut h: libc::mmsghdr = unsafe { zeroed() };
        h.msg_hdr.msg_namelen = name.1;
        h.msg_hdr.msg_controllen = controllen;
        self.hdrs.push(h);
        self.parts.push(part);
    }

    /// Points the headers at their names, iovecs and control buffers, once the vectors no
    /// longer grow.
    fn point(&mut self) {
        for (((h, name), iov), ctrl) in self
            .hdrs
            .iter_mut()
            .zip(self.names.iter_mut())
            .zip(self.iovs.iter_mut())
            .zip(self.ctrl.iter_mut())
        {
            let h = &mut h.msg_hdr;
            h.msg_name = (name as *mut libc::sockaddr_storage).cast();
            h.msg_iov = iov;
            h.msg_iovlen = 1;
            h.msg_control = if h.msg_controllen != 0 {
                ctrl.as_mut_ptr().cast()
            } else {
                std::ptr::null_mut()
            };
        }
    }
}

impl UdpSocket {
    /// Sends `msgs`, as GSO trains while the socket uses GSO and as single datagrams
    /// otherwise, with one `sendmmsg` call per [`MAX_BATCH`] messages (more if the kernel
    /// takes part of a call). Datagrams that fail are counted, never retried more than the
    /// socket's [`SendMode`] says; a train the device refuses (`EIO`: GSO is then turned off
    /// for good) or whose datagrams exceed the path MTU (`EINVAL`, `EMSGSIZE`) is resent
    /// datagram by datagram.
    pub fn send_batch<'d, I>(&self, msgs: I, scratch: &mut SendScratch) -> SendReport
    where
        I: IntoIterator<Item = OutMsg<'d>>,
    {
        let mut report = SendReport::default();
        let mut msgs = msgs.into_iter().peekable();
        while msgs.peek().is_some() {
            self.build(&mut msgs, scratch);
            // Every iovec just built points into the `bytes` of an `OutMsg<'d>` taken from
            // `msgs`, borrowed for 'd, which outlives this call: what `send_built` relies on.
            self.send_built(scratch, &mut report);
        }
        report
    }

    /// Fills the scratch headers with as many of `msgs` as fit one call.
    fn build<'d, I>(&self, msgs: &mut Peekable<I>, s: &mut SendScratch)
    where
        I: Iterator<Item = OutMsg<'d>>,
    {
        let gso = self.gso();
        s.clear();
        while let Some(&m) = msgs.peek() {
            let segments = m.segments();
            let seg = m.segment();
            // A train leaves whole with its segment size in a control message if GSO is on.
            let gso_seg = (gso && segments > 1)
                .then(|| u16::try_from(seg).ok())
                .flatten();
            let parts = if gso_seg.is_some() { 1 } else { segments };
            if s.hdrs.len() + parts > MAX_BATCH && !s.hdrs.is_empty() {
                break;
            }
            msgs.next();
            let name = to_sockaddr(&m.dst);
            match gso_seg {
                Some(g) => s.push(
                    &name,
                    m.bytes,
                    Some(g),
                    Part {
                        datagrams: segments,
                        train_seg: seg,
                    },
                ),
                None => {
                    let single = Part {
                        datagrams: 1,
                        train_seg: 0,
                    };
                    if m.bytes.is_empty() {
                        s.push(&name, m.bytes, None, single);
                    }
                    for chunk in m.bytes.chunks(seg.max(1)) {
                        s.push(&name, chunk, None, single);
                    }
                }
            }
        }
        s.point();
    }

    /// Sends the headers built in `s`. The caller guarantees that their iovecs point into
    /// bytes that stay borrowed for the whole call.
    fn send_built(&self, s: &mut SendScratch, report: &mut SendReport) {
        let total = s.hdrs.len();
        let flags = match self.send_mode() {
            SendMode::Bounded(_) => libc::MSG_DONTWAIT,
            SendMode::Blocking => 0,
        };
        let blocking = flags == 0;
        let mut i = 0;
        // Waits for buffer space in this call (Bounded: per call, then the rest of the batch
        // is dropped rather than stalling the thread; Blocking: per message).
        let mut tries = 0;
        while i < total {
            // SAFETY: headers i.. point at live names, iovecs (into bytes the caller keeps
            // borrowed) and control buffers of the sizes given, all built by `build`.
            let ret = unsafe {
                libc::sendmmsg(
                    self.as_raw_fd(),
                    s.hdrs.as_mut_ptr().add(i),
                    (total - i) as libc::c_uint,
                    flags,
                )
            };
            if ret > 0 {
                let done = (ret as usize).min(total - i);
                report.sent += s.parts[i..i + done]
                    .iter()
                    .map(|p| p.datagrams as u64)
                    .sum::<u64>();
                i += done;
                if blocking {
                    tries = 0;
                }
                continue;
            }
            let err = io::Error::last_os_error();
            let part = s.parts[i];
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                    if self.wait_for_room(&mut tries) {
                        continue;
                    }
                    if !blocking {
                        let rest: usize = s.parts[i..].iter().map(|p| p.datagrams).sum();
                        report.failed += rest as u64;
                        tracing::debug!(local = %self.local_addr(), dropped = rest, "socket buffer full; dropping the rest of the batch");
                        return;
                    }
                    tries = 0;
                    report.failed += part.datagrams as u64;
                    tracing::debug!(local = %self.local_addr(), error = %err, "send failed");
                }
                Some(libc::EIO) | Some(libc::EINVAL) | Some(libc::EMSGSIZE)
                    if part.train_seg > 0 =>
                {
                    // EIO: the device cannot checksum GSO trains, stop using GSO. EINVAL or
                    // EMSGSIZE: this train's datagrams exceed the path MTU; send them one by
                    // one so the kernel may fragment each.
                    if err.raw_os_error() == Some(libc::EIO) {
                        self.disable_gso(&err);
                    }
                    let iov = s.iovs[i];
                    // SAFETY: `build` made this iovec from the `bytes` slice of an OutMsg the
                    // caller keeps borrowed for this whole call (see `send_batch`); nothing
                    // wrote through it.
                    let bytes = unsafe {
                        std::slice::from_raw_parts(iov.iov_base as *const u8, iov.iov_len)
                    };
                    self.send_singly(bytes, part.train_seg, &s.names[i], report);
                }
                _ => {
                    report.failed += part.datagrams as u64;
                    tracing::debug!(dst = ?from_sockaddr(&s.names[i]), error = %err, "send failed");
                }
            }
            i += 1;
        }
    }

    /// Sends the `seg`-byte datagrams of a refused train one by one to `name`.
    fn send_singly(
        &self,
        bytes: &[u8],
        seg: usize,
        name: &libc::sockaddr_storage,
        report: &mut SendReport,
    ) {
        let chunks = bytes.chunks(seg.max(1));
        let Some(dst) = from_sockaddr(name) else {
            report.failed += chunks.len() as u64;
            return;
        };
        for chunk in chunks {
            match self.send_to(chunk, dst) {
                Ok(()) => report.sent += 1,
                Err(e) => {
                    report.failed += 1;
                    tracing::debug!(%dst, error = %e, "send failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RecvBatch, SocketOptions};
    use std::time::{Duration, Instant};

    fn sock(addr: &str, gro: bool, gso: bool) -> UdpSocket {
        let opts = SocketOptions {
            gro,
            gso,
            ..SocketOptions::default()
        };
        UdpSocket::bind(addr.parse().expect("addr"), &opts).expect("bind")
    }

    /// Receives until `want` datagrams arrived (GRO trains split) or 5 s passed.
    fn recv_all(s: &UdpSocket, want: usize) -> Vec<Vec<u8>> {
        let mut rx = RecvBatch::new(8);
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while out.len() < want && Instant::now() < deadline {
            if s.recv_batch(&mut rx).expect("recv") == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            for (m, d) in rx.iter() {
                assert!(!m.truncated);
                if d.is_empty() {
                    out.push(Vec::new());
                }
                out.extend(d.chunks(m.seg).map(<[u8]>::to_vec));
            }
        }
        out
    }

    /// 40 datagrams in trains of nine 1200-byte datagrams and a 700-byte one.
    fn trains(buf: &mut Vec<u8>) -> Vec<(usize, u8)> {
        let mut sizes = Vec::new();
        for i in 0..40usize {
            let len = if i % 10 == 9 { 700 } else { 1200 };
            buf.extend(std::iter::repeat_n(i as u8, len));
            sizes.push((len, i as u8));
        }
        sizes
    }

    fn round_trip(local: &str, gro: bool, gso: bool) {
        let a = sock(local, gro, false);
        let b = sock(local, false, gso);
        let mut buf = Vec::new();
        let sizes = trains(&mut buf);
        let msgs: Vec<OutMsg<'_>> = buf
            .chunks(9 * 1200 + 700)
            .map(|t| OutMsg::train(a.local_addr(), t, 1200))
            .collect();
        assert!(msgs.iter().all(|m| m.segments() == 10));
        let report = b.send_batch(msgs, &mut SendScratch::default());
        assert_eq!(
            report,
            SendReport {
                sent: 40,
                failed: 0
            }
        );
        let got = recv_all(&a, 40);
        let got: Vec<_> = got.iter().map(|d| (d.len(), d[0])).collect();
        assert_eq!(got, sizes);
    }

    #[test]
    fn gso_send_and_gro_receive_keep_datagram_boundaries_v4() {
        round_trip("127.0.0.1:0", true, true);
    }

    #[test]
    fn plain_batches_work_without_offloads_v6() {
        round_trip("[::1]:0", false, false);
    }

    #[test]
    fn gso_and_gro_v6() {
        round_trip("[::1]:0", true, true);
    }

    #[test]
    fn segments_count_datagrams() {
        let dst = SocketAddr::from(([127, 0, 0, 1], 9));
        let b = [0u8; 250];
        assert_eq!(OutMsg::datagram(dst, &b).segments(), 1);
        assert_eq!(OutMsg::datagram(dst, &[]).segments(), 1);
        assert_eq!(OutMsg::train(dst, &b, 100).segments(), 3);
        assert_eq!(OutMsg::train(dst, &b, 0).segments(), 1);
        assert_eq!(OutMsg::train(dst, &b, 400).segments(), 1);
    }

    #[test]
    fn batches_above_one_call_and_empty_datagrams_are_sent_in_order() {
        let a = sock("127.0.0.1:0", false, false);
        let b = sock("127.0.0.1:0", false, false);
        let n = MAX_BATCH + 300;
        let bytes: Vec<[u8; 2]> = (0..n).map(|i| (i as u16).to_be_bytes()).collect();
        let empty = [OutMsg::datagram(a.local_addr(), &[])];
        let msgs = bytes
            .iter()
            .map(|d| OutMsg::datagram(a.local_addr(), d))
            .chain(empty);
        let report = b.send_batch(msgs, &mut SendScratch::default());
        assert_eq!((report.sent, report.failed), (n as u64 + 1, 0));
        let got = recv_all(&a, n + 1);
        assert_eq!(got.len(), n + 1);
        assert!(got[..n]
            .iter()
            .enumerate()
            .all(|(i, d)| d[..] == (i as u16).to_be_bytes()));
        assert!(got[n].is_empty());
    }

    #[test]
    fn blocking_sockets_send_batches() {
        let opts = SocketOptions {
            gso: true,
            send_mode: SendMode::Blocking,
            ..SocketOptions::default()
        };
        let b = UdpSocket::from_std(
            std::net::UdpSocket::bind("127.0.0.1:0").expect("bind"),
            &opts,
        )
        .expect("from_std");
        let a = sock("127.0.0.1:0", true, false);
        let payload = [5u8; 1000];
        let report = b.send_batch(
            [
                OutMsg::train(a.local_addr(), &payload, 250),
                OutMsg::datagram(a.local_addr(), &payload[..10]),
            ],
            &mut SendScratch::default(),
        );
        assert_eq!((report.sent, report.failed), (5, 0));
        let got: Vec<usize> = recv_all(&a, 5).iter().map(Vec::len).collect();
        assert_eq!(got, [250, 250, 250, 250, 10]);
    }

    #[test]
    fn gso_train_above_the_path_mtu_falls_back_to_fragmented_datagrams() {
        std::thread::spawn(|| {
            // SAFETY: unshare(2) affects only this thread; its namespace (and its loopback)
            // goes away with the thread and the sockets made in it.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                let why = io::Error::last_os_error();
                testreq::netns_refused(
                    "gso_train_above_the_path_mtu_falls_back_to_fragmented_datagrams",
                    &why,
                );
                return;
            }
            let ok = std::process::Command::new("ip")
                .args(["link", "set", "lo", "up", "mtu", "1280"])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(ok, "ip link set lo");
            let a = sock("127.0.0.1:0", true, false);
            let b = sock("127.0.0.1:0", false, true);
            let mut buf = Vec::new();
            for i in 0..10u8 {
                buf.extend([i; 1400]);
            }
            let train = OutMsg::train(a.local_addr(), &buf, 1400);
            let report = b.send_batch([train], &mut SendScratch::default());
            assert_eq!(
                report,
                SendReport {
                    sent: 10,
                    failed: 0
                }
            );
            assert!(b.gso(), "an MTU refusal keeps GSO on");
            let got = recv_all(&a, 10);
            assert_eq!(
                got.iter().map(|d| (d.len(), d[0])).collect::<Vec<_>>(),
                (0..10).map(|i| (1400, i)).collect::<Vec<_>>()
            );
        })
        .join()
        .expect("test thread");
    }
}
