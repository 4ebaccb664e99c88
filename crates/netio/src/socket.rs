//! The socket itself: opening and options, the offloads the kernel granted, single sends.

use crate::addr::{from_sockaddr, to_sockaddr};
use crate::cvt;
use crate::poll::wait_writable;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// `UDP_SEGMENT` (linux/udp.h): GSO segment size, a u16 control message or socket option.
pub(crate) const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (linux/udp.h): enable GRO; the receive control message carries the segment size.
pub(crate) const UDP_GRO: libc::c_int = 104;

/// How often a [`SendMode::Bounded`] send waits for buffer space, per batch or datagram.
const BOUNDED_WAITS: u32 = 3;
/// How often a [`SendMode::Blocking`] send retries a transient error on one message.
const BLOCKING_RETRIES: u32 = 8;
/// The pause between those retries.
const BLOCKING_PAUSE: Duration = Duration::from_micros(20);

static GRO_REFUSED_LOGGED: AtomicBool = AtomicBool::new(false);
static GSO_REFUSED_LOGGED: AtomicBool = AtomicBool::new(false);

/// What a send does when the socket buffer is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendMode {
    /// Sends never block in the kernel. On a full socket buffer a batch waits for room (`poll`
    /// for writability) at most three times this long, then drops the rest of the batch; a
    /// single [`UdpSocket::send_to`] waits likewise, then fails. For forwarders: a slow
    /// receiver must not stall the thread for long.
    Bounded(Duration),
    /// Sends block in the kernel until the socket buffer has room (the descriptor is made
    /// blocking). A transient `ENOBUFS` or `EAGAIN` is retried up to eight times 20 µs apart,
    /// then that message counts as failed. For load generators, whose pace the socket buffer
    /// sets.
    Blocking,
}

/// How a socket is set up. Offloads the kernel refuses are left off (see [`UdpSocket::gro`]
/// and its siblings for what was granted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketOptions {
    /// Receive buffer to ask for, in bytes (`SO_RCVBUFFORCE`, which needs `CAP_NET_ADMIN`,
    /// else the capped `SO_RCVBUF`); the kernel may clamp it. 0 keeps the kernel's default; 1
    /// gets the smallest buffer, for send-only sockets, so that stray datagrams to them cannot
    /// pile up.
    pub recv_buffer: usize,
    /// Send buffer to ask for, in bytes (`SO_SNDBUFFORCE`, else `SO_SNDBUF`); 0 keeps the
    /// kernel's default.
    pub send_buffer: usize,
    /// Ask for UDP GRO on receive: a [`RecvBatch`](crate::RecvBatch) slot may then hold a
    /// train of equal-size datagrams from one sender.
    pub gro: bool,
    /// Send GSO trains with one `UDP_SEGMENT` control message each when the kernel supports
    /// it; else every datagram of a train is its own message.
    pub gso: bool,
    /// Ask for kernel receive timestamps (`SO_TIMESTAMPNS`, `CLOCK_REALTIME`).
    pub timestamps: bool,
    /// Ask for the receive queue's drop counter (`SO_RXQ_OVFL`).
    pub queue_drops: bool,
    /// What a send does when the socket buffer is full.
    pub send_mode: SendMode,
}

impl SocketOptions {
    /// The buffer size [`Default`] asks for: 4 MiB each way.
    pub const DEFAULT_BUFFER: usize = 4 << 20;
}

impl Default for SocketOptions {
    /// 4 MiB buffers, no offloads, no timestamps, sends waiting up to 3 × 50 ms for room.
    fn default() -> Self {
        Self {
            recv_buffer: Self::DEFAULT_BUFFER,
            send_buffer: Self::DEFAULT_BUFFER,
            gro: false,
            gso: false,
            timestamps: false,
            queue_drops: false,
            send_mode: SendMode::Bounded(Duration::from_millis(50)),
        }
    }
}

/// A bound UDP socket with batched I/O. Shared between threads by reference (`Arc`): every
/// call takes `&self`.
#[derive(Debug)]
pub struct UdpSocket {
    fd: OwnedFd,
    local: SocketAddr,
    gro: AtomicBool,
    gso: AtomicBool,
    timestamps: bool,
    queue_drops: bool,
    mode: SendMode,
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

fn local_addr(fd: RawFd) -> Option<SocketAddr> {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut st: libc::sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: getsockname writes at most `len` bytes into the live `st`.
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

/// Asks for the buffer sizes of `opts`, the forced variants first (a failure leaves the
/// kernel's size).
fn set_buffers(fd: RawFd, opts: &SocketOptions) {
    for (force, plain, size) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, opts.recv_buffer),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, opts.send_buffer),
    ] {
        if size == 0 {
            continue;
        }
        let size = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
        if setsockopt(fd, libc::SOL_SOCKET, force, size).is_err() {
            let _ = setsockopt(fd, libc::SOL_SOCKET, plain, size);
        }
    }
}

impl UdpSocket {
    /// Opens a UDP socket bound to `addr` (IPV6_V6ONLY on IPv6), with the buffers and the
    /// offloads of `opts` and local fragmentation allowed (tunnel packets may exceed the path
    /// MTU). The descriptor is non-blocking unless `opts.send_mode` is
    /// [`SendMode::Blocking`].
    pub fn bind(addr: SocketAddr, opts: &SocketOptions) -> io::Result<Self> {
        let domain = if addr.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        let nonblock = match opts.send_mode {
            SendMode::Bounded(_) => libc::SOCK_NONBLOCK,
            SendMode::Blocking => 0,
        };
        // SAFETY: plain syscall; the descriptor is checked and then owned.
        let raw = cvt(unsafe {
            libc::socket(
                domain,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | nonblock,
                libc::IPPROTO_UDP,
            )
        })?;
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if addr.is_ipv6() {
            setsockopt::<libc::c_int>(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
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
        set_buffers(raw, opts);
        let (st, len) = to_sockaddr(&addr);
        // SAFETY: `st` holds a valid address of length `len`.
        cvt(unsafe { libc::bind(raw, (&st as *const libc::sockaddr_storage).cast(), len) })?;
        let local = local_addr(raw).unwrap_or(addr);
        Ok(Self::with_features(fd, local, opts))
    }

    /// Takes over a socket bound elsewhere (in another network namespace, say) with the
    /// buffers and offloads of `opts`. Its address options (IPV6_V6ONLY, path MTU discovery)
    /// stay as they are; the descriptor is made blocking for [`SendMode::Blocking`] and
    /// non-blocking otherwise.
    pub fn from_std(sock: std::net::UdpSocket, opts: &SocketOptions) -> io::Result<Self> {
        let local = sock.local_addr()?;
        sock.set_nonblocking(matches!(opts.send_mode, SendMode::Bounded(_)))?;
        let fd = OwnedFd::from(sock);
        set_buffers(fd.as_raw_fd(), opts);
        Ok(Self::with_features(fd, local, opts))
    }

    /// Turns on what `opts` asks for and the kernel grants; logs a refused GRO or GSO once per
    /// process.
    fn with_features(fd: OwnedFd, local: SocketAddr, opts: &SocketOptions) -> Self {
        let raw = fd.as_raw_fd();
        let on = |level, name| setsockopt::<libc::c_int>(raw, level, name, 1);
        let gro = opts.gro
            && match on(libc::SOL_UDP, UDP_GRO) {
                Ok(()) => true,
                Err(e) => {
                    if !GRO_REFUSED_LOGGED.swap(true, Ordering::Relaxed) {
                        tracing::info!(%local, error = %e, "kernel refused UDP GRO; receiving datagrams one by one");
                    }
                    false
                }
            };
        let timestamps = opts.timestamps && on(libc::SOL_SOCKET, libc::SO_TIMESTAMPNS).is_ok();
        let queue_drops = opts.queue_drops && on(libc::SOL_SOCKET, libc::SO_RXQ_OVFL).is_ok();
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
        Self {
            fd,
            local,
            gro: AtomicBool::new(gro),
            gso: AtomicBool::new(gso),
            timestamps,
            queue_drops,
            mode: opts.send_mode,
        }
    }

    /// The bound address (with the kernel's port if 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// True if UDP GRO is on.
    pub fn gro(&self) -> bool {
        self.gro.load(Ordering::Relaxed)
    }

    /// Turns UDP GRO off (for a socket whose datagrams an XDP program in the kernel's generic
    /// path must see one by one: that path runs after GRO).
    pub fn stop_gro(&self) -> io::Result<()> {
        if self.gro.load(Ordering::Relaxed) {
            setsockopt::<libc::c_int>(self.fd.as_raw_fd(), libc::SOL_UDP, UDP_GRO, 0)?;
            self.gro.store(false, Ordering::Relaxed);
        }
        Ok(())
    }

    /// True if UDP GSO is (still) used: it is turned off for good when the device refuses a
    /// train.
    pub fn gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    /// True if kernel receive timestamps are on.
    pub fn timestamps(&self) -> bool {
        self.timestamps
    }

    /// True if the receive queue's drop counter is reported.
    pub fn queue_drops(&self) -> bool {
        self.queue_drops
    }

    /// What sends do when the socket buffer is full.
    pub fn send_mode(&self) -> SendMode {
        self.mode
    }

    /// Stops using GSO after the device refused a train (`err`); logs it once per process.
    pub(crate) fn disable_gso(&self, err: &io::Error) {
        if self.gso.swap(false, Ordering::Relaxed)
            && !GSO_REFUSED_LOGGED.swap(true, Ordering::Relaxed)
        {
            tracing::info!(local = %self.local, error = %err, "UDP GSO refused on send; sending datagrams one by one");
        }
    }

    /// After a send found the buffer full (or the device queue busy): waits or pauses as the
    /// send mode says and returns true to try again, or false once `tries` is used up.
    pub(crate) fn wait_for_room(&self, tries: &mut u32) -> bool {
        match self.mode {
            SendMode::Bounded(wait) if *tries < BOUNDED_WAITS => {
                *tries += 1;
                wait_writable(self.fd.as_raw_fd(), wait);
                true
            }
            SendMode::Blocking if *tries < BLOCKING_RETRIES => {
                *tries += 1;
                std::thread::sleep(BLOCKING_PAUSE);
                true
            }
            _ => false,
        }
    }

    /// Sends one datagram, waiting for buffer space as the send mode says.
    pub fn send_to(&self, data: &[u8], dst: SocketAddr) -> io::Result<()> {
        let (st, len) = to_sockaddr(&dst);
        let mut tries = 0;
        loop {
            // SAFETY: data and address are live for the call.
            let ret = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
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
                io::ErrorKind::WouldBlock if self.wait_for_room(&mut tries) => {}
                _ => return Err(err),
            }
        }
    }
}

impl AsFd for UdpSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback(addr: &str, opts: &SocketOptions) -> UdpSocket {
        UdpSocket::bind(addr.parse().expect("addr"), opts).expect("bind")
    }

    fn nonblocking(fd: RawFd) -> bool {
        // SAFETY: F_GETFL on a live descriptor only reads its flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        flags & libc::O_NONBLOCK != 0
    }

    #[test]
    fn bind_reports_the_kernels_port_and_the_granted_features() {
        let opts = SocketOptions {
            gro: true,
            gso: true,
            timestamps: true,
            queue_drops: true,
            ..SocketOptions::default()
        };
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let s = loopback(addr, &opts);
            assert_ne!(s.local_addr().port(), 0);
            assert_eq!(
                s.local_addr().ip(),
                addr.parse::<SocketAddr>().expect("a").ip()
            );
            // Loopback supports all of them on any kernel this runs on (4.18+).
            assert!(s.gro() && s.gso() && s.timestamps() && s.queue_drops());
            assert!(nonblocking(s.as_raw_fd()));
        }
        let plain = loopback("127.0.0.1:0", &SocketOptions::default());
        assert!(!plain.gro() && !plain.gso() && !plain.timestamps() && !plain.queue_drops());
    }

    #[test]
    fn v6_socket_is_v6_only() {
        let opts = SocketOptions::default();
        let v6 = loopback("[::]:0", &opts);
        let v4 = loopback("127.0.0.1:0", &opts);
        let to = SocketAddr::from(([127, 0, 0, 1], v6.local_addr().port()));
        // A v4 datagram to the v6 socket's port must not arrive on it.
        let _ = v4.send_to(b"x", to);
        std::thread::sleep(Duration::from_millis(20));
        let mut rx = crate::RecvBatch::new(1);
        assert_eq!(v6.recv_batch(&mut rx).expect("recv"), 0);
    }

    #[test]
    fn the_send_mode_sets_the_descriptors_blocking_mode() {
        let blocking = SocketOptions {
            send_mode: SendMode::Blocking,
            ..SocketOptions::default()
        };
        let s = loopback("127.0.0.1:0", &blocking);
        assert!(!nonblocking(s.as_raw_fd()));
        assert_eq!(s.send_mode(), SendMode::Blocking);
        let std = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let addr = std.local_addr().expect("addr");
        let s = UdpSocket::from_std(std, &SocketOptions::default()).expect("from_std");
        assert_eq!(s.local_addr(), addr);
        assert!(nonblocking(s.as_raw_fd()));
    }

    #[test]
    fn buffers_are_asked_for() {
        let read = |s: &UdpSocket, name| {
            getsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, name).expect("getsockopt")
        };
        let big = loopback("127.0.0.1:0", &SocketOptions::default());
        let small = loopback(
            "127.0.0.1:0",
            &SocketOptions {
                recv_buffer: 1,
                ..SocketOptions::default()
            },
        );
        // The kernel doubles what it grants and clamps a tiny receive buffer to its minimum.
        assert!(read(&small, libc::SO_RCVBUF) < read(&big, libc::SO_RCVBUF));
        assert_eq!(read(&small, libc::SO_SNDBUF), read(&big, libc::SO_SNDBUF));
    }

    #[test]
    fn send_to_reaches_the_destination() {
        let opts = SocketOptions::default();
        let a = loopback("127.0.0.1:0", &opts);
        let b = loopback("127.0.0.1:0", &opts);
        b.send_to(b"hello", a.local_addr()).expect("send");
        let mut rx = crate::RecvBatch::new(4);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while rx.is_empty() && std::time::Instant::now() < deadline {
            a.recv_batch(&mut rx).expect("recv");
        }
        let (meta, data) = rx.iter().next().expect("a datagram");
        assert_eq!((meta.src, data), (Some(b.local_addr()), &b"hello"[..]));
    }
}
