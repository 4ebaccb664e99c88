//! The load generator's UDP sockets on Linux: `sendmmsg` of pool trains with UDP GSO (one
//! `UDP_SEGMENT` control message per train), `recvmmsg` with UDP GRO (the `UDP_GRO` control
//! message gives the segment size of a coalesced train), kernel receive timestamps
//! (`SO_TIMESTAMPNS`, `CLOCK_REALTIME`) and the socket's overflow counter (`SO_RXQ_OVFL`).
//! When the kernel refuses GSO the socket falls back to one message per packet.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::pool::{Pool, Train};

/// `UDP_SEGMENT` (linux/udp.h): the GSO segment size of a send.
const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (linux/udp.h): enable GRO; on receive, the segment size of a coalesced train.
const UDP_GRO: libc::c_int = 104;
/// Size of one receive slot: a whole GRO train (at most 64 KiB).
pub(crate) const RX_SLOT: usize = 65536;
/// Control buffer per message, 8-byte aligned: GRO (int), timestamp (timespec) and
/// overflow count (u32), each with its `cmsghdr`.
type Cmsg = [u64; 16];
/// Most messages per `sendmmsg` call.
const MAX_MMSG: usize = 1024;

/// A UDP socket with batched, offloaded I/O. Shared between the threads that send and
/// receive on it.
#[derive(Debug)]
pub(crate) struct Socket {
    sock: UdpSocket,
    local: SocketAddr,
    gso: AtomicBool,
    nonblocking_rx: AtomicBool,
}

/// What the kernel granted on a receiving socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RxFeatures {
    /// UDP GRO is on.
    pub(crate) gro: bool,
    /// Kernel receive timestamps are on.
    pub(crate) timestamps: bool,
    /// The overflow counter is reported.
    pub(crate) overflow: bool,
}

/// Metadata of one received message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RecvMeta {
    /// Bytes received (a whole GRO train).
    pub(crate) len: usize,
    /// The sender.
    pub(crate) src: Option<SocketAddr>,
    /// Segment size of a GRO train (`len` if the message is a single datagram).
    pub(crate) seg: usize,
    /// Kernel receive time, `CLOCK_REALTIME` nanoseconds.
    pub(crate) stamp_ns: Option<u64>,
    /// The socket's cumulative count of datagrams dropped for lack of buffer space.
    pub(crate) overflow: Option<u32>,
}

/// Buffers for `recvmmsg`.
pub(crate) struct RecvBatch {
    bufs: Vec<u8>,
    names: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    ctrl: Vec<Cmsg>,
    hdrs: Vec<libc::mmsghdr>,
    meta: Vec<RecvMeta>,
}

// SAFETY: the raw pointers in `iovs` and `hdrs` point into this struct's own vectors and are
// rebuilt before every call; moving the struct to another thread moves their targets with it.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    /// Buffers for `slots` messages of up to [`RX_SLOT`] bytes each.
    pub(crate) fn new(slots: usize) -> RecvBatch {
        let slots = slots.clamp(1, 1024);
        // SAFETY: all-zero is a valid value of these plain C structs.
        let (name, iov, hdr): (libc::sockaddr_storage, libc::iovec, libc::mmsghdr) =
            unsafe { (zeroed(), zeroed(), zeroed()) };
        RecvBatch {
            bufs: vec![0; slots * RX_SLOT],
            names: vec![name; slots],
            iovs: vec![iov; slots],
            ctrl: vec![[0; 16]; slots],
            hdrs: vec![hdr; slots],
            meta: vec![RecvMeta::default(); slots],
        }
    }

    /// Metadata of message `i` of the last receive.
    pub(crate) fn meta(&self, i: usize) -> RecvMeta {
        self.meta[i]
    }

    /// The bytes of message `i` of the last receive.
    pub(crate) fn data(&self, i: usize) -> &[u8] {
        &self.bufs[i * RX_SLOT..i * RX_SLOT + self.meta[i].len]
    }

    /// The datagrams of message `i` (the segments of a GRO train).
    pub(crate) fn datagrams(&self, i: usize) -> impl Iterator<Item = &[u8]> {
        let seg = self.meta[i].seg.max(1);
        self.data(i).chunks(seg)
    }
}

/// Scratch space for `sendmmsg`, reused between calls.
#[derive(Default)]
pub(crate) struct SendScratch {
    plan: Vec<(usize, usize, usize)>,
    names: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    ctrl: Vec<Cmsg>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers inside point into the vectors of the same struct or into the pool
// during one call only; between calls they are never dereferenced.
unsafe impl Send for SendScratch {}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn setsockopt<T>(
    fd: libc::c_int,
    level: libc::c_int,
    name: libc::c_int,
    value: T,
) -> io::Result<()> {
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

/// A socket address for the kernel.
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

/// A kernel socket address; None for other families.
fn from_sockaddr(st: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match st.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin: &libc::sockaddr_in = unsafe { &*(st as *const libc::sockaddr_storage).cast() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
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

/// `CLOCK_REALTIME` now, in nanoseconds (the clock of kernel receive timestamps).
pub(crate) fn realtime_ns() -> u64 {
    // SAFETY: all-zero is a valid timespec; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { zeroed() };
    // SAFETY: ts is a live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Socket {
    /// Wraps a bound socket (created in its namespace with `Netns::udp_socket`); asks for
    /// large buffers (`SO_RCVBUFFORCE`/`SO_SNDBUFFORCE`, root only, else the capped variants).
    pub(crate) fn new(sock: UdpSocket, buffer: usize) -> io::Result<Socket> {
        let local = sock.local_addr()?;
        let fd = sock.as_raw_fd();
        let size = libc::c_int::try_from(buffer).unwrap_or(libc::c_int::MAX);
        if setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, size).is_err() {
            let _ = setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, size);
        }
        if setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, size).is_err() {
            let _ = setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, size);
        }
        Ok(Socket {
            sock,
            local,
            gso: AtomicBool::new(true),
            nonblocking_rx: AtomicBool::new(false),
        })
    }

    /// The bound address.
    pub(crate) fn local(&self) -> SocketAddr {
        self.local
    }

    /// Turns on GRO, kernel timestamps and the overflow counter, as far as the kernel allows.
    pub(crate) fn enable_rx_features(&self) -> RxFeatures {
        let fd = self.sock.as_raw_fd();
        RxFeatures {
            gro: setsockopt(fd, libc::SOL_UDP, UDP_GRO, 1 as libc::c_int).is_ok(),
            timestamps: setsockopt(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1 as libc::c_int)
                .is_ok(),
            overflow: setsockopt(fd, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1 as libc::c_int).is_ok(),
        }
    }

    /// Makes receives return at once when nothing is queued (sends still block when the
    /// socket buffer is full: they use their own flag).
    pub(crate) fn set_nonblocking(&self) -> io::Result<()> {
        self.nonblocking_rx.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Sends one datagram.
    pub(crate) fn send_to(&self, data: &[u8], dst: SocketAddr) -> io::Result<()> {
        self.sock.send_to(data, dst).map(drop)
    }

    /// Whether sends still use GSO.
    pub(crate) fn gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    /// Sends `trains` of `pool`, GSO trains where possible. Returns the number of packets the
    /// kernel took; packets refused with an error are counted as not sent.
    pub(crate) fn send_trains(
        &self,
        scratch: &mut SendScratch,
        pool: &Pool,
        trains: &[Train],
    ) -> io::Result<u64> {
        let mut sent = 0u64;
        let mut rest = trains;
        'outer: while !rest.is_empty() {
            let gso = self.gso();
            // Plan the messages: (train in `rest`, first segment, segments).
            scratch.plan.clear();
            let mut planned = 0;
            for (ti, t) in rest.iter().enumerate() {
                let msgs = if gso { 1 } else { t.count };
                if !scratch.plan.is_empty() && scratch.plan.len() + msgs > MAX_MMSG {
                    break;
                }
                if gso || t.count == 1 {
                    scratch.plan.push((ti, 0, t.count));
                } else {
                    scratch.plan.extend((0..t.count).map(|s| (ti, s, 1)));
                }
                planned = ti + 1;
            }
            let n = scratch.plan.len();
            scratch.names.clear();
            scratch.iovs.clear();
            scratch.ctrl.clear();
            for &(ti, first, segs) in &scratch.plan {
                let t = &rest[ti];
                let bytes = &pool.bytes(t)[first * t.seg..(first + segs) * t.seg];
                scratch.names.push(to_sockaddr(&t.dst).0);
                scratch.iovs.push(libc::iovec {
                    iov_base: bytes.as_ptr() as *mut libc::c_void,
                    iov_len: bytes.len(),
                });
                scratch.ctrl.push([0; 16]);
            }
            // SAFETY: all-zero is a valid mmsghdr.
            scratch.hdrs.resize(n, unsafe { zeroed() });
            for i in 0..n {
                let (ti, _, segs) = scratch.plan[i];
                let t = &rest[ti];
                let namelen = if t.dst.is_ipv4() {
                    size_of::<libc::sockaddr_in>()
                } else {
                    size_of::<libc::sockaddr_in6>()
                };
                let hdr = &mut scratch.hdrs[i].msg_hdr;
                hdr.msg_name = (&mut scratch.names[i] as *mut libc::sockaddr_storage).cast();
                hdr.msg_namelen = namelen as libc::socklen_t;
                hdr.msg_iov = &mut scratch.iovs[i];
                hdr.msg_iovlen = 1;
                hdr.msg_flags = 0;
                if segs > 1 {
                    let ctrl = &mut scratch.ctrl[i];
                    hdr.msg_control = ctrl.as_mut_ptr().cast();
                    // SAFETY: CMSG_SPACE only computes a size.
                    hdr.msg_controllen =
                        unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
                    // SAFETY: msg_control points at `ctrl`, which has room for one cmsghdr
                    // with a u16 (CMSG_SPACE(2) is far below 128 bytes).
                    unsafe {
                        let cm = libc::CMSG_FIRSTHDR(hdr);
                        (*cm).cmsg_level = libc::SOL_UDP;
                        (*cm).cmsg_type = UDP_SEGMENT;
                        (*cm).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                        std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<u16>(), t.seg as u16);
                    }
                } else {
                    hdr.msg_control = std::ptr::null_mut();
                    hdr.msg_controllen = 0;
                }
            }
            let mut done = 0usize;
            let mut retries = 0;
            while done < n {
                // SAFETY: the headers point at live names, iovecs (into `pool`) and control
                // buffers for the duration of the call.
                let r = unsafe {
                    libc::sendmmsg(
                        self.sock.as_raw_fd(),
                        scratch.hdrs[done..].as_mut_ptr(),
                        (n - done) as libc::c_uint,
                        0,
                    )
                };
                if r >= 0 {
                    let r = r as usize;
                    sent += scratch.plan[done..done + r]
                        .iter()
                        .map(|p| p.2 as u64)
                        .sum::<u64>();
                    done += r;
                    retries = 0;
                    continue;
                }
                let err = io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EINTR) => {}
                    // A pending ICMP error of an earlier datagram is reported once: retry.
                    Some(libc::ECONNREFUSED) | Some(libc::EAGAIN) | Some(libc::ENOBUFS)
                        if retries < 8 =>
                    {
                        retries += 1;
                        std::thread::sleep(Duration::from_micros(20));
                    }
                    Some(libc::EIO) | Some(libc::EINVAL) if scratch.plan[done].2 > 1 => {
                        // The kernel refuses GSO on this path: resend from this train on,
                        // one datagram per message.
                        self.gso.store(false, Ordering::Relaxed);
                        rest = &rest[scratch.plan[done].0..];
                        continue 'outer;
                    }
                    _ => {
                        // Give up on this message; the caller sees fewer packets sent.
                        done += 1;
                        retries = 0;
                    }
                }
            }
            rest = &rest[planned..];
        }
        Ok(sent)
    }

    /// Receives up to a batch of messages; `Ok(0)` when none is queued (non-blocking) or the
    /// read timeout passed.
    pub(crate) fn recv(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        let slots = batch.hdrs.len();
        for i in 0..slots {
            batch.iovs[i] = libc::iovec {
                iov_base: batch.bufs[i * RX_SLOT..].as_mut_ptr().cast(),
                iov_len: RX_SLOT,
            };
            let hdr = &mut batch.hdrs[i].msg_hdr;
            hdr.msg_name = (&mut batch.names[i] as *mut libc::sockaddr_storage).cast();
            hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            hdr.msg_iov = &mut batch.iovs[i];
            hdr.msg_iovlen = 1;
            hdr.msg_control = batch.ctrl[i].as_mut_ptr().cast();
            hdr.msg_controllen = size_of::<Cmsg>();
            hdr.msg_flags = 0;
        }
        // SAFETY: every header points at live buffers owned by `batch`.
        let r = unsafe {
            libc::recvmmsg(
                self.sock.as_raw_fd(),
                batch.hdrs.as_mut_ptr(),
                slots as libc::c_uint,
                if self.nonblocking_rx.load(Ordering::Relaxed) {
                    libc::MSG_DONTWAIT
                } else {
                    libc::MSG_WAITFORONE
                },
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            let err = io::Error::last_os_error();
            return match err.kind() {
                io::ErrorKind::WouldBlock
                | io::ErrorKind::TimedOut
                | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(err),
            };
        }
        let n = r as usize;
        for i in 0..n {
            let len = batch.hdrs[i].msg_len as usize;
            let mut meta = RecvMeta {
                len,
                src: from_sockaddr(&batch.names[i]),
                seg: len,
                stamp_ns: None,
                overflow: None,
            };
            let hdr = &batch.hdrs[i].msg_hdr;
            // SAFETY: the kernel filled msg_control up to msg_controllen with well-formed
            // cmsghdrs; the CMSG_* macros stay inside it.
            unsafe {
                let mut cm = libc::CMSG_FIRSTHDR(hdr);
                while !cm.is_null() {
                    let data = libc::CMSG_DATA(cm);
                    match ((*cm).cmsg_level, (*cm).cmsg_type) {
                        (libc::SOL_UDP, UDP_GRO) => {
                            let seg = std::ptr::read_unaligned(data.cast::<libc::c_int>());
                            if seg > 0 {
                                meta.seg = seg as usize;
                            }
                        }
                        (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS) => {
                            let ts = std::ptr::read_unaligned(data.cast::<libc::timespec>());
                            meta.stamp_ns =
                                Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
                        }
                        (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) => {
                            meta.overflow = Some(std::ptr::read_unaligned(data.cast::<u32>()));
                        }
                        _ => {}
                    }
                    cm = libc::CMSG_NXTHDR(hdr, cm);
                }
            }
            batch.meta[i] = meta;
        }
        Ok(n)
    }
}
