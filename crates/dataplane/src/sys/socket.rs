//! UDP sockets with batched I/O on Linux: `recvmmsg` with UDP GRO (the `UDP_GRO` control message
//! gives the segment size of a coalesced train), `sendmmsg` with UDP GSO (a `UDP_SEGMENT` control
//! message per train). When the kernel refuses an offload the socket falls back to plain
//! datagrams and says so once in the log.

use super::{cvt, waker::wait_writable};
use crate::batch::{RxBatch, RxMeta, TxMsg, RX_SLOT, UNSPECIFIED};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// `UDP_SEGMENT` (linux/udp.h): GSO segment size, a u16 control message or socket option.
const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (linux/udp.h): enable GRO; the receive control message carries the segment size.
const UDP_GRO: libc::c_int = 104;

/// Socket buffer size asked for (the kernel may clamp it).
const SOCKET_BUFFER: libc::c_int = 4 << 20;

/// Most messages handed to one `sendmmsg` / `recvmmsg` call (the kernel's UIO_MAXIOV).
const MAX_MMSG: usize = 1024;

/// How long a send waits for buffer space before dropping.
const SEND_BLOCK: Duration = Duration::from_millis(50);

static GRO_REFUSED_LOGGED: AtomicBool = AtomicBool::new(false);
static GSO_REFUSED_LOGGED: AtomicBool = AtomicBool::new(false);

/// Control buffer per message: room for one `cmsghdr` with an int, 8-byte aligned.
type Cmsg = [u64; 8];

/// How a socket is opened.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SocketOptions {
    /// Ask for UDP GRO on receive.
    pub(crate) gro: bool,
    /// Use UDP GSO on send when the kernel supports it.
    pub(crate) gso: bool,
    /// The socket is read; false for send-only sockets, which get a minimal receive buffer
    /// so that stray datagrams to them cannot pile up.
    pub(crate) recv: bool,
}

/// A bound, non-blocking UDP socket.
#[derive(Debug)]
pub(crate) struct UdpSocket {
    fd: OwnedFd,
    local: SocketAddr,
    gro: bool,
    gso: AtomicBool,
}

/// Result of sending a batch.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendReport {
    /// Datagrams handed to the kernel.
    pub(crate) sent: u64,
    /// Datagrams dropped because of send errors.
    pub(crate) failed: u64,
}

/// Scratch space for `sendmmsg`, kept per thread so sends do not allocate.
#[derive(Default)]
pub(crate) struct SendScratch {
    names: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    ctrl: Vec<Cmsg>,
    hdrs: Vec<libc::mmsghdr>,
    /// For each header: (message index, datagrams it carries, is a GSO train).
    owner: Vec<(usize, usize, bool)>,
}

/// Scratch space for `recvmmsg`.
pub(crate) struct RecvScratch {
    names: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    ctrl: Vec<Cmsg>,
    hdrs: Vec<libc::mmsghdr>,
}

impl RecvScratch {
    /// Scratch for `slots` messages.
    pub(crate) fn new(slots: usize) -> Self {
        let slots = slots.clamp(1, MAX_MMSG);
        // SAFETY: all-zero is a valid value of these plain C structs.
        let (name, iov, hdr): (libc::sockaddr_storage, libc::iovec, libc::mmsghdr) =
            unsafe { (zeroed(), zeroed(), zeroed()) };
        Self {
            names: vec![name; slots],
            iovs: vec![iov; slots],
            ctrl: vec![[0; 8]; slots],
            hdrs: vec![hdr; slots],
        }
    }
}

// SAFETY: the raw pointers inside the scratch vectors only ever point into buffers owned by the
// same thread during one call; between calls they are dangling but never dereferenced.
unsafe impl Send for RecvScratch {}
// SAFETY: as above.
unsafe impl Send for SendScratch {}

/// Converts a socket address for the kernel.
pub(crate) fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
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

/// Converts a kernel socket address; None for other families.
pub(crate) fn from_sockaddr(st: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match st.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let sin: &libc::sockaddr_in = unsafe { &*(st as *const libc::sockaddr_storage).cast() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6.
            let sin6: &libc::sockaddr_in6 =
                unsafe { &*(st as *const libc::sockaddr_storage).cast() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, value: T) -> io::Result<()> {
    // SAFETY: passes a pointer to a live `T` and its size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

fn getsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: value and len are live and sized for an int option.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok(value)
}

impl UdpSocket {
    /// Opens a non-blocking UDP socket bound to `addr` (IPV6_V6ONLY on IPv6), with large
    /// buffers, local fragmentation allowed, and the offloads of `opts` the kernel accepts.
    pub(crate) fn bind(addr: SocketAddr, opts: SocketOptions) -> io::Result<Self> {
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
            setsockopt::<libc::c_int>(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
            // Tunnel packets may exceed the path MTU: let the kernel fragment them.
            let _ = setsockopt::<libc::c_int>(
                raw,
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DONT,
            );
        } else {
            let _ = setsockopt::<libc::c_int>(
                raw,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DONT,
            );
        }
        let rcvbuf = if opts.recv { SOCKET_BUFFER } else { 1 };
        for (force, plain, size) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, rcvbuf),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, SOCKET_BUFFER),
        ] {
            if setsockopt(raw, libc::SOL_SOCKET, force, size).is_err() {
                let _ = setsockopt(raw, libc::SOL_SOCKET, plain, size);
            }
        }
        let (st, len) = to_sockaddr(&addr);
        // SAFETY: `st` holds a valid address of length `len`.
        cvt(unsafe { libc::bind(raw, (&st as *const libc::sockaddr_storage).cast(), len) })?;
        let local = local_addr(raw).unwrap_or(addr);
        let gro = opts.gro
            && match setsockopt::<libc::c_int>(raw, libc::SOL_UDP, UDP_GRO, 1) {
                Ok(()) => true,
                Err(e) => {
                    if !GRO_REFUSED_LOGGED.swap(true, Ordering::Relaxed) {
                        tracing::info!(%local, error = %e, "kernel refused UDP GRO; receiving datagrams one by one");
                    }
                    false
                }
            };
        let gso = opts.gso
            && match getsockopt_int(raw, libc::SOL_UDP, UDP_SEGMENT) {
                Ok(_) => true,
                Err(e) => {
                    if !GSO_REFUSED_LOGGED.swap(true, Ordering::Relaxed) {
                        tracing::info!(%local, error = %e, "kernel lacks UDP GSO; sending datagrams one by one");
                    }
                    false
                }
            };
        Ok(Self {
            fd,
            local,
            gro,
            gso: AtomicBool::new(gso),
        })
    }

    /// The bound address (with the kernel's port if 0 was asked for).
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The descriptor, for polling.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// True if UDP GRO is on.
    pub(crate) fn gro(&self) -> bool {
        self.gro
    }

    /// True if UDP GSO is (still) used.
    pub(crate) fn gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    fn disable_gso(&self, err: &io::Error) {
        if self.gso.swap(false, Ordering::Relaxed)
            && !GSO_REFUSED_LOGGED.swap(true, Ordering::Relaxed)
        {
            tracing::info!(local = %self.local, error = %err, "UDP GSO refused on send; sending datagrams one by one");
        }
    }

    /// Receives up to one batch without blocking; returns the number of slots filled (0 if
    /// nothing was waiting).
    pub(crate) fn recv_batch(
        &self,
        rx: &mut RxBatch,
        scratch: &mut RecvScratch,
    ) -> io::Result<usize> {
        let n = rx.capacity().min(scratch.hdrs.len());
        let base = rx.raw_mut().as_mut_ptr();
        for i in 0..n {
            scratch.iovs[i] = libc::iovec {
                // SAFETY: slot i lies within the batch buffer (n <= slots).
                iov_base: unsafe { base.add(i * RX_SLOT) }.cast(),
                iov_len: RX_SLOT,
            };
            let h = &mut scratch.hdrs[i];
            h.msg_hdr.msg_name = (&mut scratch.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_iov = &mut scratch.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = scratch.ctrl[i].as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = size_of::<Cmsg>() as _;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        let got = loop {
            // SAFETY: the n headers point at live buffers of the sizes given.
            let ret = unsafe {
                libc::recvmmsg(
                    self.raw_fd(),
                    scratch.hdrs.as_mut_ptr(),
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
                io::ErrorKind::WouldBlock => {
                    rx.clear();
                    return Ok(0);
                }
                _ => {
                    rx.clear();
                    return Err(err);
                }
            }
        };
        let metas = (0..got).map(|i| {
            let h = &scratch.hdrs[i];
            let len = (h.msg_len as usize).min(RX_SLOT);
            let stride = gro_segment(&h.msg_hdr)
                .filter(|s| *s > 0)
                .unwrap_or(len)
                .max(1);
            RxMeta {
                src: from_sockaddr(&scratch.names[i]).unwrap_or(UNSPECIFIED),
                len,
                stride,
                truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            }
        });
        rx.set_filled(metas);
        Ok(rx.len())
    }

    /// Sends one datagram (blocking briefly if the socket buffer is full).
    pub(crate) fn send_to(&self, data: &[u8], dst: SocketAddr) -> io::Result<()> {
        let (st, len) = to_sockaddr(&dst);
        let mut tries = 0;
        loop {
            // SAFETY: data and address are live for the call.
            let ret = unsafe {
                libc::sendto(
                    self.raw_fd(),
                    data.as_ptr().cast(),
                    data.len(),
                    0,
                    (&st as *const libc::sockaddr_storage).cast(),
                    len,
                )
            };
            if ret >= 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock if tries < 3 => {
                    tries += 1;
                    wait_writable(self.raw_fd(), SEND_BLOCK);
                }
                _ => return Err(err),
            }
        }
    }

    /// Sends `msgs` (all from this socket) whose bytes are in `data`, as GSO trains where the
    /// kernel allows and as single datagrams otherwise. Failed datagrams are counted, never
    /// retried more than briefly.
    pub(crate) fn send_batch(
        &self,
        data: &[u8],
        msgs: &[TxMsg],
        scratch: &mut SendScratch,
    ) -> SendReport {
        let mut report = SendReport::default();
        let mut first = 0;
        while first < msgs.len() {
            let consumed = self.build_send(data, &msgs[first..], scratch);
            self.send_built(data, &msgs[first..], scratch, &mut report);
            first += consumed;
        }
        report
    }

    /// Fills the scratch headers for as many of `msgs` as fit one call; returns how many.
    fn build_send(&self, data: &[u8], msgs: &[TxMsg], s: &mut SendScratch) -> usize {
        let gso = self.gso();
        s.names.clear();
        s.iovs.clear();
        s.ctrl.clear();
        s.hdrs.clear();
        s.owner.clear();
        let mut consumed = 0;
        for (mi, m) in msgs.iter().enumerate() {
            let train = m.len > m.seg && m.seg > 0;
            let parts = if train && !gso { m.segments() } else { 1 };
            if s.hdrs.len() + parts > MAX_MMSG && !s.hdrs.is_empty() {
                break;
            }
            consumed += 1;
            let bytes = &data[m.start.min(data.len())..(m.start + m.len).min(data.len())];
            if train && gso {
                push_msg(
                    s,
                    m.dst,
                    bytes,
                    Some(m.seg as u16),
                    (mi, m.segments(), true),
                );
            } else {
                for chunk in bytes.chunks(m.seg.max(1)) {
                    push_msg(s, m.dst, chunk, None, (mi, 1, false));
                }
            }
        }
        // Now that the vectors no longer grow, point the headers at their parts.
        for i in 0..s.hdrs.len() {
            let has_ctrl = s.hdrs[i].msg_hdr.msg_controllen != 0;
            let h = &mut s.hdrs[i].msg_hdr;
            h.msg_name = (&mut s.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_iov = &mut s.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = if has_ctrl {
                s.ctrl[i].as_mut_ptr().cast()
            } else {
                std::ptr::null_mut()
            };
        }
        consumed
    }

    fn send_built(
        &self,
        data: &[u8],
        msgs: &[TxMsg],
        s: &mut SendScratch,
        report: &mut SendReport,
    ) {
        let total = s.hdrs.len();
        let mut i = 0;
        // Waits for buffer space in this call; past the limit the rest of the batch is dropped
        // rather than stalling the thread.
        let mut waits = 0;
        while i < total {
            // SAFETY: headers i.. point at live names, iovecs (into `data`) and control buffers.
            let ret = unsafe {
                libc::sendmmsg(
                    self.raw_fd(),
                    s.hdrs.as_mut_ptr().add(i),
                    (total - i) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if ret > 0 {
                for h in &s.owner[i..i + ret as usize] {
                    report.sent += h.1 as u64;
                }
                i += ret as usize;
                continue;
            }
            let err = io::Error::last_os_error();
            let (mi, count, train) = s.owner[i];
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                    if waits < 3 {
                        waits += 1;
                        wait_writable(self.raw_fd(), SEND_BLOCK);
                        continue;
                    }
                    let rest: usize = s.owner[i..].iter().map(|o| o.1).sum();
                    report.failed += rest as u64;
                    tracing::debug!(local = %self.local, dropped = rest, "socket buffer full; dropping the rest of the batch");
                    return;
                }
                Some(libc::EIO) | Some(libc::EINVAL) | Some(libc::EMSGSIZE) if train => {
                    // EIO: the device cannot checksum GSO trains, stop using GSO. EINVAL or
                    // EMSGSIZE: this train's segments exceed the path MTU; send them one by one
                    // so the kernel may fragment each.
                    if err.raw_os_error() == Some(libc::EIO) {
                        self.disable_gso(&err);
                    }
                    let m = msgs[mi];
                    let bytes = &data[m.start.min(data.len())..(m.start + m.len).min(data.len())];
                    for chunk in bytes.chunks(m.seg.max(1)) {
                        match self.send_to(chunk, m.dst) {
                            Ok(()) => report.sent += 1,
                            Err(e) => {
                                report.failed += 1;
                                tracing::debug!(dst = %m.dst, error = %e, "send failed");
                            }
                        }
                    }
                }
                _ => {
                    report.failed += count as u64;
                    tracing::debug!(dst = %msgs[mi].dst, error = %err, "send failed");
                }
            }
            i += 1;
        }
    }
}

fn push_msg(
    s: &mut SendScratch,
    dst: SocketAddr,
    bytes: &[u8],
    seg: Option<u16>,
    owner: (usize, usize, bool),
) {
    let (st, len) = to_sockaddr(&dst);
    s.names.push(st);
    s.iovs.push(libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    });
    let mut ctrl: Cmsg = [0; 8];
    let mut controllen = 0;
    if let Some(seg) = seg {
        // SAFETY: builds one cmsghdr with a u16 payload inside the 64-byte, 8-aligned buffer;
        // CMSG_SPACE(2) is 24 bytes.
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
    s.ctrl.push(ctrl);
    // SAFETY: all-zero is a valid mmsghdr; pointers are filled in by `build_send`.
    let mut h: libc::mmsghdr = unsafe { zeroed() };
    h.msg_hdr.msg_namelen = len;
    h.msg_hdr.msg_controllen = controllen;
    s.hdrs.push(h);
    s.owner.push(owner);
}

/// The UDP_GRO segment size in a received message's control data, if any.
fn gro_segment(h: &libc::msghdr) -> Option<usize> {
    if h.msg_control.is_null() || h.msg_controllen == 0 {
        return None;
    }
    // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG macros stay within them.
    unsafe {
        let mut cm = libc::CMSG_FIRSTHDR(h);
        while !cm.is_null() {
            if (*cm).cmsg_level == libc::SOL_UDP && (*cm).cmsg_type == UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast::<libc::c_int>());
                return usize::try_from(v).ok();
            }
            cm = libc::CMSG_NXTHDR(h, cm);
        }
    }
    None
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::TxBatch;

    fn sock(addr: &str, gro: bool, gso: bool) -> UdpSocket {
        UdpSocket::bind(
            addr.parse().expect("addr"),
            SocketOptions {
                gro,
                gso,
                recv: true,
            },
        )
        .expect("bind")
    }

    fn recv_all(s: &UdpSocket, want: usize) -> Vec<Vec<u8>> {
        let mut rx = RxBatch::new(8);
        let mut scratch = RecvScratch::new(8);
        let mut out = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while out.len() < want && std::time::Instant::now() < deadline {
            let n = s.recv_batch(&mut rx, &mut scratch).expect("recv");
            if n == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            for i in 0..n {
                let (m, d) = rx.slot_mut(i);
                assert!(!m.truncated);
                for seg in d.chunks(m.stride) {
                    out.push(seg.to_vec());
                }
            }
        }
        out
    }

    #[test]
    fn sockaddr_round_trip() {
        for a in ["192.0.2.1:4500", "[2001:db8::1]:500"] {
            let a: SocketAddr = a.parse().expect("addr");
            let (st, _) = to_sockaddr(&a);
            assert_eq!(from_sockaddr(&st), Some(a));
        }
    }

    fn batch_round_trip(local: &str, gro: bool, gso: bool) {
        let a = sock(local, gro, false);
        let b = sock(local, false, gso);
        let mut tx = TxBatch::new(64, 1 << 20, true);
        let mut sizes = Vec::new();
        for i in 0..40usize {
            let len = if i % 10 == 9 { 700 } else { 1200 };
            let room = tx.room(2000).expect("room");
            room[..len].fill(i as u8);
            tx.commit(0, a.local_addr(), len);
            sizes.push((len, i as u8));
        }
        let mut scratch = SendScratch::default();
        let report = b.send_batch(tx.data(), tx.messages(), &mut scratch);
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
        batch_round_trip("127.0.0.1:0", true, true);
    }

    #[test]
    fn plain_batches_work_without_offloads_v6() {
        batch_round_trip("[::1]:0", false, false);
    }

    #[test]
    fn gso_and_gro_v6() {
        batch_round_trip("[::1]:0", true, true);
    }

    #[test]
    fn v6_socket_is_v6_only() {
        let s = sock("[::]:0", false, false);
        let v4 = sock("127.0.0.1:0", false, false);
        let to = SocketAddr::from(([127, 0, 0, 1], s.local_addr().port()));
        // A v4 datagram to the v6 socket's port must not arrive on it.
        let _ = v4.send_to(b"x", to);
        std::thread::sleep(Duration::from_millis(20));
        let mut rx = RxBatch::new(1);
        let mut scratch = RecvScratch::new(1);
        assert_eq!(s.recv_batch(&mut rx, &mut scratch).expect("recv"), 0);
    }

    #[test]
    fn gso_train_above_the_path_mtu_falls_back_to_fragmented_datagrams() {
        std::thread::spawn(|| {
            // SAFETY: unshare(2) affects only this thread; its namespace dies with it.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                eprintln!(
                    "SKIP gso fallback test: no private network namespace: {}",
                    io::Error::last_os_error()
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
            let mut tx = TxBatch::new(64, 1 << 20, true);
            for i in 0..10u8 {
                let room = tx.room(2000).expect("room");
                room[..1400].fill(i);
                tx.commit(0, a.local_addr(), 1400);
            }
            assert_eq!(tx.messages().len(), 1, "one GSO train");
            let report = b.send_batch(tx.data(), tx.messages(), &mut SendScratch::default());
            assert_eq!(
                report,
                SendReport {
                    sent: 10,
                    failed: 0
                }
            );
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
