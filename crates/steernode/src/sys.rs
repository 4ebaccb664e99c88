//! The operating-system layer (Linux, over `libc`): non-blocking UDP sockets with batched
//! receive (`recvmmsg`) and send (`sendmmsg`), and the shutdown signal the forwarding threads
//! poll beside their sockets (an `eventfd`).
//!
//! No UDP GRO/GSO here: the steer node forwards datagrams of many flows one by one, each into
//! its own Geneve frame.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Bytes per receive slot: the largest UDP payload fits (65,535 minus the headers).
pub(crate) const RX_SLOT: usize = 65_536;

/// Most receive slots per thread (4 MiB of buffers); a larger batch still sends in batches
/// of up to its size.
pub(crate) const MAX_RX_SLOTS: usize = 64;

/// Socket buffer size asked for (the kernel may clamp it).
const SOCKET_BUFFER: libc::c_int = 4 << 20;

/// How long a send waits for socket buffer space, at most three times per batch, before the
/// rest of the batch is dropped.
const SEND_BLOCK: Duration = Duration::from_millis(20);

/// Turns a libc return value into an `io::Result`, reading `errno` on -1.
fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Converts a socket address for the kernel.
fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut st: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut st as *mut libc::sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut st as *mut libc::sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (st, len as libc::socklen_t)
}

/// Converts a kernel socket address; `None` for other families.
fn from_sockaddr(st: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match st.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let sin: &libc::sockaddr_in = unsafe { &*(st as *const libc::sockaddr_storage).cast() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6.
            let sin6: &libc::sockaddr_in6 =
                unsafe { &*(st as *const libc::sockaddr_storage).cast() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a live int and its size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// A bound, non-blocking UDP socket.
#[derive(Debug)]
pub(crate) struct UdpSocket {
    fd: OwnedFd,
    local: SocketAddr,
}

impl UdpSocket {
    /// Opens a non-blocking UDP socket bound to `addr` (IPV6_V6ONLY on IPv6), with large
    /// buffers and local fragmentation allowed (a Geneve frame around a full-size datagram may
    /// exceed the underlay MTU).
    pub(crate) fn bind(addr: SocketAddr) -> io::Result<Self> {
        let domain = if addr.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        // SAFETY: plain syscall; the descriptor is checked and then owned.
        let raw = cvt(unsafe {
            libc::socket(
                domain,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::IPPROTO_UDP,
            )
        })?;
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if addr.is_ipv6() {
            setsockopt_int(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
            let _ = setsockopt_int(
                raw,
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DONT,
            );
        } else {
            let _ = setsockopt_int(
                raw,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DONT,
            );
        }
        for (force, plain) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        ] {
            if setsockopt_int(raw, libc::SOL_SOCKET, force, SOCKET_BUFFER).is_err() {
                let _ = setsockopt_int(raw, libc::SOL_SOCKET, plain, SOCKET_BUFFER);
            }
        }
        let (st, len) = to_sockaddr(&addr);
        // SAFETY: `st` holds a valid address of length `len`.
        cvt(unsafe { libc::bind(raw, (&st as *const libc::sockaddr_storage).cast(), len) })?;
        let local = local_addr(raw).unwrap_or(addr);
        Ok(Self { fd, local })
    }

    /// The bound address (with the kernel's port if 0 was asked for).
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The descriptor, for polling.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Receives up to one batch without blocking; returns the number of datagrams (0 if
    /// nothing was waiting).
    pub(crate) fn recv_batch(&self, rx: &mut RxBatch) -> io::Result<usize> {
        rx.filled = 0;
        let n = rx.metas.len();
        let base = rx.data.as_mut_ptr();
        for i in 0..n {
            rx.iovs[i] = libc::iovec {
                // SAFETY: slot i lies within the batch buffer (n slots of RX_SLOT bytes).
                iov_base: unsafe { base.add(i * RX_SLOT) }.cast(),
                iov_len: RX_SLOT,
            };
            let h = &mut rx.hdrs[i];
            h.msg_hdr.msg_name = (&mut rx.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_iov = &mut rx.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = std::ptr::null_mut();
            h.msg_hdr.msg_controllen = 0;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        let got = loop {
            // SAFETY: the n headers point at live names, iovecs and buffers of the sizes given.
            let ret = unsafe {
                libc::recvmmsg(
                    self.raw_fd(),
                    rx.hdrs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if ret >= 0 {
                break ret as usize;
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(0),
                _ => return Err(err),
            }
        };
        for i in 0..got {
            let h = &rx.hdrs[i];
            rx.metas[i] = RxMeta {
                src: from_sockaddr(&rx.names[i]),
                len: (h.msg_len as usize).min(RX_SLOT),
                truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            };
        }
        rx.filled = got;
        Ok(got)
    }

    /// Sends the messages of `tx` that name socket `sock` (this socket), in order. Datagrams
    /// that fail are counted, not retried (a full buffer is waited on briefly).
    pub(crate) fn send_batch(&self, tx: &mut TxBatch, sock: usize) -> SendReport {
        let mut report = SendReport::default();
        let TxBatch {
            data,
            msgs,
            names,
            iovs,
            hdrs,
            ..
        } = tx;
        names.clear();
        iovs.clear();
        hdrs.clear();
        for m in msgs.iter().filter(|m| m.sock == sock) {
            let (st, len) = to_sockaddr(&m.dst);
            names.push(st);
            let end = (m.start + m.len).min(data.len());
            let start = m.start.min(end);
            iovs.push(libc::iovec {
                iov_base: data[start..end].as_ptr() as *mut libc::c_void,
                iov_len: end - start,
            });
            // SAFETY: all-zero is a valid mmsghdr; the pointers are filled in below.
            let mut h: libc::mmsghdr = unsafe { zeroed() };
            h.msg_hdr.msg_namelen = len;
            hdrs.push(h);
        }
        // The vectors no longer grow: point the headers at their parts.
        for (i, h) in hdrs.iter_mut().enumerate() {
            h.msg_hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_iov = &mut iovs[i];
            h.msg_hdr.msg_iovlen = 1;
        }
        let total = hdrs.len();
        let mut i = 0;
        let mut waits = 0;
        while i < total {
            let count = (total - i).min(crate::config::MAX_BATCH);
            // SAFETY: headers i..i+count point at live names, iovecs (into `data`) and no
            // control data.
            let ret = unsafe {
                libc::sendmmsg(
                    self.raw_fd(),
                    hdrs.as_mut_ptr().add(i),
                    count as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if ret > 0 {
                report.sent += ret as u64;
                i += ret as usize;
                continue;
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) if waits < 3 => {
                    waits += 1;
                    wait_writable(self.raw_fd(), SEND_BLOCK);
                }
                _ => {
                    // The first message of the rest failed (or the buffer stayed full): count
                    // it and go on with the next.
                    report.failed += 1;
                    if report.failed == 1 {
                        tracing::debug!(local = %self.local, error = %err, "send failed");
                    }
                    i += 1;
                }
            }
        }
        report
    }
}

/// One received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RxMeta {
    /// Sender (`None` for an address family we do not know).
    pub(crate) src: Option<SocketAddr>,
    /// Bytes in the slot.
    pub(crate) len: usize,
    /// The datagram was larger than the slot (never for UDP over IP).
    pub(crate) truncated: bool,
}

/// Receive buffers and `recvmmsg` scratch for one thread.
pub(crate) struct RxBatch {
    data: Vec<u8>,
    metas: Vec<RxMeta>,
    filled: usize,
    names: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in the scratch vectors point only into buffers of the same struct,
// and only during a call; between calls they are never dereferenced.
unsafe impl Send for RxBatch {}

impl RxBatch {
    /// Room for `slots` datagrams (1..=[`MAX_RX_SLOTS`]).
    pub(crate) fn new(slots: usize) -> Self {
        let slots = slots.clamp(1, MAX_RX_SLOTS);
        // SAFETY: all-zero is a valid value of these plain C structs.
        let (name, iov, hdr): (libc::sockaddr_storage, libc::iovec, libc::mmsghdr) =
            unsafe { (zeroed(), zeroed(), zeroed()) };
        Self {
            data: vec![0; slots * RX_SLOT],
            metas: vec![
                RxMeta {
                    src: None,
                    len: 0,
                    truncated: false,
                };
                slots
            ],
            filled: 0,
            names: vec![name; slots],
            iovs: vec![iov; slots],
            hdrs: vec![hdr; slots],
        }
    }

    /// Datagrams received by the last call.
    pub(crate) fn len(&self) -> usize {
        self.filled
    }

    /// Datagram `i` of the last call: its metadata and bytes.
    pub(crate) fn get(&self, i: usize) -> (RxMeta, &[u8]) {
        let m = self.metas[i];
        let start = i * RX_SLOT;
        (m, &self.data[start..start + m.len])
    }
}

/// One datagram to send: `len` bytes at `start` of the batch's data, from socket `sock`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TxMsg {
    /// Index of the sending socket.
    pub(crate) sock: usize,
    /// Destination.
    pub(crate) dst: SocketAddr,
    /// Offset in the data.
    pub(crate) start: usize,
    /// Length.
    pub(crate) len: usize,
}

/// Datagrams built during one batch, and `sendmmsg` scratch.
#[derive(Default)]
pub(crate) struct TxBatch {
    data: Vec<u8>,
    msgs: Vec<TxMsg>,
    names: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: as for RxBatch.
unsafe impl Send for TxBatch {}

impl TxBatch {
    /// An empty batch with room reserved for `bytes`.
    pub(crate) fn with_capacity(bytes: usize) -> Self {
        Self {
            data: Vec::with_capacity(bytes),
            ..Self::default()
        }
    }

    /// Forgets the messages (keeps the allocations).
    pub(crate) fn clear(&mut self) {
        self.data.clear();
        self.msgs.clear();
    }

    /// True if nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// The messages queued.
    pub(crate) fn messages(&self) -> &[TxMsg] {
        &self.msgs
    }

    /// Builds one datagram of at most `max` bytes with `build`, which returns the length it
    /// wrote; on error nothing is queued and the error is returned.
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
                let len = len.min(max);
                self.data.truncate(start + len);
                self.msgs.push(TxMsg {
                    sock,
                    dst,
                    start,
                    len,
                });
                Ok(())
            }
            Err(e) => {
                self.data.truncate(start);
                Err(e)
            }
        }
    }
}

/// What a batch send achieved.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendReport {
    /// Datagrams handed to the kernel.
    pub(crate) sent: u64,
    /// Datagrams dropped because of send errors.
    pub(crate) failed: u64,
}

fn local_addr(fd: RawFd) -> Option<SocketAddr> {
    // SAFETY: all-zero is a valid sockaddr_storage; getsockname writes at most `len` bytes.
    let mut st: libc::sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: as above.
    cvt(unsafe {
        libc::getsockname(
            fd,
            (&mut st as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    })
    .ok()?;
    from_sockaddr(&st)
}

/// Waits up to `timeout` for `fd` to become writable; false on timeout.
fn wait_writable(fd: RawFd, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one initialised pollfd.
    let ret = unsafe { libc::poll(&mut pfd, 1, ms) };
    ret > 0
}

/// The shutdown signal: an `eventfd` every thread polls beside its sockets. Once woken it
/// stays readable (nobody reads it), so every thread sees it.
#[derive(Debug)]
pub(crate) struct Waker {
    fd: OwnedFd,
}

impl Waker {
    /// Creates the eventfd.
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the returned descriptor is checked and then owned.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(Self {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Signals shutdown to every thread polling this waker.
    pub(crate) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. A failure (counter
        // overflow) still leaves the eventfd readable, which is all that is needed.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

/// What [`Poller::wait`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ready {
    /// Shutdown was signalled.
    Shutdown,
    /// Some sockets may be readable (see [`Poller::readable`]); none after a timeout.
    Sockets,
}

/// A `poll` set: some sockets and the waker.
pub(crate) struct Poller {
    fds: Vec<libc::pollfd>,
}

impl Poller {
    /// Polls `socks` and `waker`.
    pub(crate) fn new(socks: &[RawFd], waker: &Waker) -> Self {
        let mut fds: Vec<libc::pollfd> = socks
            .iter()
            .map(|&fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        fds.push(libc::pollfd {
            fd: waker.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        Self { fds }
    }

    /// Waits until a socket is readable, the waker fired, or `timeout` passed.
    pub(crate) fn wait(&mut self, timeout: Duration) -> io::Result<Ready> {
        // Round up, so a wait for a deadline 0.5 ms away does not spin.
        let ms = timeout.as_micros().div_ceil(1000);
        let ms = i32::try_from(ms).unwrap_or(i32::MAX);
        loop {
            // SAFETY: `fds` holds initialised pollfd entries and its length is passed.
            let ret =
                unsafe { libc::poll(self.fds.as_mut_ptr(), self.fds.len() as libc::nfds_t, ms) };
            if ret >= 0 {
                break;
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
        match self.fds.last() {
            Some(w) if w.revents != 0 => Ok(Ready::Shutdown),
            _ => Ok(Ready::Sockets),
        }
    }

    /// True if socket `i` (in the order given to [`Self::new`]) was found readable (or in
    /// error, which a read then reports).
    pub(crate) fn readable(&self, i: usize) -> bool {
        self.fds
            .get(i)
            .is_some_and(|p| p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_round_trip() {
        for a in ["192.0.2.1:4500", "[2001:db8::1]:500"] {
            let a: SocketAddr = a.parse().unwrap();
            let (st, _) = to_sockaddr(&a);
            assert_eq!(from_sockaddr(&st), Some(a));
        }
    }

    #[test]
    fn batch_send_and_receive_keep_order_and_sizes() {
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut tx = TxBatch::with_capacity(1 << 16);
        for i in 0..20u8 {
            let len = 100 + usize::from(i);
            tx.push::<()>(0, a.local_addr(), 2000, |buf| {
                buf[..len].fill(i);
                Ok(len)
            })
            .unwrap();
        }
        // A failed build queues nothing.
        assert!(tx.push(0, a.local_addr(), 10, |_| Err(())).is_err());
        assert_eq!(tx.messages().len(), 20);
        assert_eq!(
            b.send_batch(&mut tx, 0),
            SendReport {
                sent: 20,
                failed: 0
            }
        );
        // Messages for another socket index are not sent by this one.
        assert_eq!(b.send_batch(&mut tx, 1), SendReport::default());
        let mut rx = RxBatch::new(8);
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while got.len() < 20 && std::time::Instant::now() < deadline {
            let n = a.recv_batch(&mut rx).unwrap();
            if n == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            for i in 0..n {
                let (m, d) = rx.get(i);
                assert_eq!(m.src, Some(b.local_addr()));
                assert!(!m.truncated);
                got.push((d.len(), d[0]));
            }
        }
        let want: Vec<_> = (0..20u8).map(|i| (100 + usize::from(i), i)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn waker_stops_a_poll() {
        let w = Waker::new().unwrap();
        let s = UdpSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut p = Poller::new(&[s.raw_fd()], &w);
        assert_eq!(p.wait(Duration::ZERO).unwrap(), Ready::Sockets);
        assert!(!p.readable(0));
        w.wake();
        assert_eq!(p.wait(Duration::from_secs(5)).unwrap(), Ready::Shutdown);
    }
}
