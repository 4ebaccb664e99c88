//! AF_XDP input: an XDP program on an interface steers the datagrams to our UDP addresses into
//! AF_XDP sockets, one per (address, receive queue), and the I/O threads read their frames
//! straight from shared memory (the UMEM), with no system call per batch while traffic flows
//! and no socket buffer, IP or UDP layer of the kernel in between. See the kernel's
//! `Documentation/networking/af_xdp.rst`.
//!
//! - [`XdpSteering::open`] finds the interface that holds each address, assembles and loads
//!   the steering program (`prog.rs`), opens per receive queue one UMEM with its fill ring
//!   and one socket with a receive ring per address (sockets on one queue share its UMEM,
//!   `XDP_SHARED_UMEM`), puts them into the program's XSKMAP and attaches the program
//!   (native, else generic). An interface that already has an XDP program, or a kernel that
//!   refuses, is an error the caller falls back from: the UDP sockets stay and serve.
//! - [`Xsk::receive`] hands each frame of its receive ring to the caller (the frame as it came
//!   off the wire, Ethernet header first) and gives the frames back to the fill ring: one
//!   lock of the queue's fill ring per batch.
//! - What is not steered (IKE, fragments, other addresses, IPv4 with options, IPv6 with
//!   extension headers, VLAN-tagged frames) passes to the kernel as before.
//!
//! Sockets are bound zero-copy where the driver offers it, else in copy mode (veth: copy);
//! [`XdpSteering::zero_copy`] says which. On an interface whose MTU does not fit a UMEM frame
//! (4 KiB less the kernel's headroom: MTUs above about 3.5 KB) frames arrive in several
//! descriptors (`XDP_USE_SG`, which many drivers support in copy mode only) and are joined.
//!
//! Costs: 16 MiB of UMEM per receive queue and interface, pre-faulted and locked by the kernel
//! (charged to `RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`); AF_XDP sockets need `CAP_NET_RAW`,
//! the program `CAP_BPF` and `CAP_NET_ADMIN`.

mod prog;
#[cfg(test)]
mod tests;

pub use prog::XdpAttach;

use crate::iface;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use xdpilone::{DeviceQueue, IfInfo, RingRx, Socket, SocketConfig, Umem, UmemConfig, User};

/// Bytes per UMEM frame (one page: a frame of up to about 3.5 KB with the kernel's headroom).
const FRAME_SIZE: u32 = 4096;
/// Frames per receive queue (16 MiB of UMEM): all of them start in the fill ring.
const FRAMES: u32 = 4096;
/// Entries of the fill ring: twice the frames, because the kernel publishes how far it has
/// read the ring only when it runs out of what it already looked at, so frames it took may
/// still count as in the ring when they come back.
const FILL_RING: u32 = 2 * FRAMES;
/// Descriptors per socket's receive ring.
const RX_RING: u32 = 2048;
/// `XDP_USE_SG`: a frame larger than a UMEM frame arrives in several descriptors, all but the
/// last marked [`XDP_PKT_CONTD`] (Linux 6.6 and later). Asked for only when the MTU needs it:
/// a driver without zero-copy multi-buffer support binds in copy mode with it.
const XDP_USE_SG: u16 = 1 << 4;
/// Room the kernel keeps in front of a frame in a UMEM chunk (`XDP_PACKET_HEADROOM`), and
/// the largest Ethernet header before the IP packet (with one VLAN tag).
const FRAME_OVERHEAD: u32 = 256 + 18;
/// The descriptor option saying that the frame continues in the next descriptor.
const XDP_PKT_CONTD: u32 = 1;
/// Descriptors of the (unused) completion ring, which the kernel requires.
const COMPLETION_RING: u32 = 64;

/// A page-aligned anonymous mapping holding one UMEM.
struct Area {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; the kernel writes only frames that
// are in the fill ring, and readers read only frames taken off a receive ring.
unsafe impl Send for Area {}
// SAFETY: as above.
unsafe impl Sync for Area {}

impl Area {
    fn new(len: usize) -> io::Result<Self> {
        // SAFETY: an anonymous private mapping with no address hint.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap"))?;
        Ok(Self { ptr, len })
    }

    fn slice(&self) -> NonNull<[u8]> {
        NonNull::slice_from_raw_parts(self.ptr, self.len)
    }

    /// The bytes at `[at, at + len)`, if inside the area.
    fn bytes(&self, at: u64, len: u32) -> Option<&[u8]> {
        let at = usize::try_from(at).ok()?;
        let end = at.checked_add(usize::try_from(len).ok()?)?;
        if end > self.len {
            return None;
        }
        // SAFETY: in bounds of the mapping, which lives as long as `self`; the frame is ours
        // until it goes back to the fill ring (see `Xsk::receive`).
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(at), end - at) })
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, after every socket using it is
        // closed (`Queue` drops its rings and UMEM first).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A queue's fill ring, and frames it had no room for yet (given back at the next chance).
struct Fill {
    ring: DeviceQueue,
    waiting: Vec<u64>,
}

impl Fill {
    /// Gives `frames` (and any waiting) back to the kernel; wakes it if it asks.
    fn give_back(&mut self, frames: &[u64]) {
        self.waiting.extend_from_slice(frames);
        let want = u32::try_from(self.waiting.len()).unwrap_or(u32::MAX);
        let put = {
            let mut w = self.ring.fill(want);
            let put = w.insert(self.waiting.iter().copied());
            w.commit();
            put as usize
        };
        self.waiting.drain(..put.min(self.waiting.len()));
        if self.ring.needs_wakeup() {
            self.ring.wake();
        }
    }
}

/// One receive queue of an interface: its UMEM and fill ring.
struct Queue {
    /// The fill (and completion) ring, shared by the queue's sockets.
    fill: Mutex<Fill>,
    /// The UMEM registration.
    _umem: Umem,
    /// Its memory; dropped last.
    area: Area,
}

// SAFETY: `Umem` is not `Send`/`Sync` because it holds a pointer to the area; after setup
// it is never used again (only dropped, with the queue), the fill ring is behind a mutex and
// the area's frames are read only by the holder of a receive ring (see `Area`).
unsafe impl Send for Queue {}
// SAFETY: as above.
unsafe impl Sync for Queue {}

/// A socket's receive ring, and the first parts of a frame that continues in descriptors not
/// read yet.
struct Rx {
    ring: RingRx,
    partial: Vec<u8>,
}

/// One AF_XDP socket: the frames for one address arriving on one receive queue.
pub struct Xsk {
    rx: Mutex<Rx>,
    fd: RawFd,
    /// Keeps the socket's configuration (and descriptor) alive.
    user: User,
    queue: Arc<Queue>,
    /// The receive queue it is bound to.
    queue_id: u32,
}

impl std::fmt::Debug for Xsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xsk")
            .field("fd", &self.fd)
            .field("queue", &self.queue_id)
            .finish_non_exhaustive()
    }
}

/// What one [`Xsk::receive`] read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Received {
    /// Descriptors taken off the receive ring (and given back to the fill ring).
    pub descriptors: usize,
    /// Complete frames handed over.
    pub frames: usize,
    /// More descriptors were waiting.
    pub more: bool,
}

/// Frames a socket lost before we read them (`XDP_STATISTICS`), cumulative.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XskLosses {
    /// Dropped by the kernel (in copy mode an empty fill ring included, and a frame that did
    /// not fit).
    pub dropped: u64,
    /// The receive ring was full.
    pub ring_full: u64,
}

impl XskLosses {
    /// Frames lost in all.
    pub fn total(&self) -> u64 {
        self.dropped + self.ring_full
    }
}

impl Xsk {
    /// The descriptor to poll (readable when the receive ring holds frames).
    pub fn raw_fd(&self) -> RawFd {
        self.fd
    }

    /// Bound zero-copy (`XDP_OPTIONS`): the driver writes frames straight into the UMEM.
    pub fn zero_copy(&self) -> bool {
        /// `SOL_XDP`, `XDP_OPTIONS` and its `XDP_OPTIONS_ZEROCOPY` flag.
        const SOL_XDP: libc::c_int = 283;
        const XDP_OPTIONS: libc::c_int = 8;
        const ZEROCOPY: u32 = 1;
        let mut flags: u32 = 0;
        let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into the live `flags`.
        let ret = unsafe {
            libc::getsockopt(
                self.fd,
                SOL_XDP,
                XDP_OPTIONS,
                (&mut flags as *mut u32).cast(),
                &mut len,
            )
        };
        ret == 0 && flags & ZEROCOPY != 0
    }

    /// Reads up to `max` descriptors of the receive ring and hands each complete frame
    /// (Ethernet header first; a jumbo frame's parts joined) to `each`, in arrival order, then
    /// returns the descriptors' chunks to the fill ring. A frame takes at least one
    /// descriptor, so `each` runs at most `max` times. Never blocks; no system call unless
    /// the kernel asks to be woken to refill.
    pub fn receive(&self, max: usize, mut each: impl FnMut(&[u8])) -> Received {
        let mut guard = self.rx.lock().unwrap_or_else(|p| p.into_inner());
        let Rx { ring: rx, partial } = &mut *guard;
        let want = u32::try_from(max).unwrap_or(u32::MAX);
        let mut got = [0u64; 256];
        let mut total = 0usize;
        let mut frames = 0usize;
        let mut more = false;
        // In chunks of `got`'s size: the frames go back to the fill ring chunk by chunk.
        loop {
            let room = (want - u32::try_from(total).unwrap_or(want)).min(got.len() as u32);
            if room == 0 {
                more = rx.available() > 0;
                break;
            }
            let mut n = 0;
            {
                let mut reader = rx.receive(room);
                while let Some(desc) = reader.read() {
                    let bytes = self.queue.area.bytes(desc.addr, desc.len);
                    if desc.options & XDP_PKT_CONTD != 0 {
                        // A jumbo frame: its parts are joined here.
                        partial.extend_from_slice(bytes.unwrap_or_default());
                    } else if !partial.is_empty() {
                        partial.extend_from_slice(bytes.unwrap_or_default());
                        each(partial);
                        frames += 1;
                        partial.clear();
                    } else if let Some(frame) = bytes {
                        each(frame);
                        frames += 1;
                    }
                    // Aligned chunks: the frame's chunk is its address rounded down.
                    got[n] = desc.addr & !u64::from(FRAME_SIZE - 1);
                    n += 1;
                }
                reader.release();
            }
            if n == 0 {
                break;
            }
            total += n;
            self.queue
                .fill
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .give_back(&got[..n]);
            if (n as u32) < room {
                break;
            }
        }
        Received {
            descriptors: total,
            frames,
            more,
        }
    }

    /// What the kernel counted as lost on this socket so far (one `getsockopt`).
    pub fn losses(&self) -> io::Result<XskLosses> {
        let s = self.user.statistics_v2().map_err(errno)?;
        // `rx_fill_ring_empty_descs` is the queue's (shared by its sockets) and counts events,
        // not frames: a frame it cost is in `rx_dropped` already (copy mode).
        Ok(XskLosses {
            dropped: s.rx_dropped + s.rx_invalid_descs,
            ring_full: s.rx_ring_full,
        })
    }
}

/// The steering of one interface: the program, its XSKMAP, and per address the sockets of
/// every receive queue. Dropping it detaches the program (the sockets close when the last
/// [`Xsk`] is dropped).
pub struct XdpSteering {
    /// The interface's name.
    pub interface: String,
    /// How the program is attached.
    pub attach: XdpAttach,
    /// Per address (in the order given), the sockets of every queue.
    pub sockets: Vec<(SocketAddr, Vec<Arc<Xsk>>)>,
    /// Every socket is bound zero-copy (the driver writes frames into the UMEM); false: copy
    /// mode on at least one.
    pub zero_copy: bool,
    _attached: prog::Attached,
    _map: OwnedFd,
}

impl std::fmt::Debug for XdpSteering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpSteering")
            .field("interface", &self.interface)
            .field("attach", &self.attach)
            .field("sockets", &self.sockets)
            .finish_non_exhaustive()
    }
}

impl XdpSteering {
    /// Steers the UDP datagrams to `addrs` (all on one interface, see [`interface_of`]) into
    /// AF_XDP sockets on interface `ifindex`, attaching the program in the first of `modes`
    /// the kernel accepts. Fails (and leaves the interface as it was) if no mode works, the
    /// interface has an XDP program already, or this process lacks the privileges.
    pub fn open(ifindex: u32, addrs: &[SocketAddr], modes: &[XdpAttach]) -> io::Result<Self> {
        if addrs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no address to steer",
            ));
        }
        let interface = interface_name(ifindex)?;
        let queues = rx_queues(&interface);
        let mtu = interface_mtu(&interface)?;
        let jumbo = mtu + FRAME_OVERHEAD > FRAME_SIZE;
        let slots = u32::try_from(addrs.len().max(1)).unwrap_or(u32::MAX);
        let map = prog::xsk_map(queues.saturating_mul(slots))?;
        let mut sockets: Vec<(SocketAddr, Vec<Arc<Xsk>>)> =
            addrs.iter().map(|a| (*a, Vec::new())).collect();
        for q in 0..queues {
            let xsks = open_queue(ifindex, q, addrs.len(), jumbo)?;
            for (slot, x) in xsks.into_iter().enumerate() {
                let key = q * slots + u32::try_from(slot).unwrap_or(0);
                prog::xsk_map_set(&map, key, x.fd)?;
                sockets[slot].1.push(x);
            }
        }
        let insns = prog::steer_program(addrs, slots, map.as_raw_fd(), mtu);
        let mut last = io::Error::other("no XDP attach mode to try");
        for &how in modes {
            match prog::load_and_attach(&insns, ifindex, how) {
                Ok(attached) => {
                    let zero_copy = sockets.iter().flat_map(|(_, x)| x).all(|x| x.zero_copy());
                    return Ok(Self {
                        interface,
                        attach: how,
                        sockets,
                        zero_copy,
                        _attached: attached,
                        _map: map,
                    });
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// Opens queue `q` of `ifindex`: its UMEM and fill ring, and `n` sockets with receive rings
/// bound to it (the first one owns the UMEM); with `jumbo`, frames may span descriptors.
fn open_queue(ifindex: u32, q: u32, n: usize, jumbo: bool) -> io::Result<Vec<Arc<Xsk>>> {
    let area = Area::new((FRAME_SIZE as usize) * (FRAMES as usize))?;
    let config = UmemConfig {
        fill_size: FILL_RING,
        complete_size: COMPLETION_RING,
        frame_size: FRAME_SIZE,
        headroom: 0,
        flags: 0,
    };
    // SAFETY: the area is page aligned (mmap), FRAMES × FRAME_SIZE bytes, and outlives the
    // UMEM (`Queue` drops it last).
    let umem = unsafe { Umem::new(config, area.slice()) }.map_err(errno)?;
    let mut info = IfInfo::invalid();
    info.from_ifindex(ifindex).map_err(errno)?;
    info.set_queue(q);
    let rx_config = SocketConfig {
        rx_size: NonZeroU32::new(RX_RING),
        tx_size: None,
        bind_flags: SocketConfig::XDP_BIND_NEED_WAKEUP | if jumbo { XDP_USE_SG } else { 0 },
    };
    let owner = Socket::with_shared(&info, &umem).map_err(errno)?;
    let mut fill = umem.fq_cq(&owner).map_err(errno)?;
    let mut users = Vec::with_capacity(n);
    for i in 0..n.max(1) {
        let sock = if i == 0 {
            Socket::with_shared(&info, &umem).map_err(errno)?
        } else {
            Socket::new(&info).map_err(errno)?
        };
        // A socket sharing the UMEM takes the owner's flags: the kernel refuses any of its own.
        let config = if i == 0 {
            rx_config.clone()
        } else {
            SocketConfig {
                bind_flags: 0,
                ..rx_config.clone()
            }
        };
        let user = umem.rx_tx(&sock, &config).map_err(errno)?;
        let rx = user.map_rx().map_err(errno)?;
        if i == 0 {
            umem.bind(&user).map_err(errno)?;
        } else {
            fill.bind(&user).map_err(errno)?;
        }
        users.push((user, rx));
    }
    // Every frame starts in the fill ring.
    {
        let mut w = fill.fill(FRAMES);
        let put = w.insert((0..FRAMES).map(|i| u64::from(i) * u64::from(FRAME_SIZE)));
        w.commit();
        if put != FRAMES {
            return Err(io::Error::other(format!(
                "the fill ring took {put} of {FRAMES} frames"
            )));
        }
    }
    let queue = Arc::new(Queue {
        fill: Mutex::new(Fill {
            ring: fill,
            waiting: Vec::with_capacity(FRAMES as usize),
        }),
        _umem: umem,
        area,
    });
    Ok(users
        .into_iter()
        .map(|(user, rx)| {
            let fd = rx.as_raw_fd();
            Arc::new(Xsk {
                rx: Mutex::new(Rx {
                    ring: rx,
                    partial: Vec::new(),
                }),
                fd,
                user,
                queue: Arc::clone(&queue),
                queue_id: q,
            })
        })
        .collect())
}

/// An `xdpilone` error as an `io::Error`.
fn errno(e: xdpilone::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.get_raw().abs())
}

/// The interface that holds local address `ip` (`getifaddrs`), by index.
pub fn interface_of(ip: IpAddr) -> io::Result<u32> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a list freed below.
    crate::cvt(unsafe { libc::getifaddrs(&mut list) })?;
    let mut found = None;
    let mut at = list;
    while !at.is_null() {
        // SAFETY: a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*at };
        at = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: a sockaddr of its family's size, per getifaddrs(3).
        let addr = unsafe { sockaddr_at(ifa.ifa_addr) };
        if addr.map(|a| a.ip()) == Some(ip) {
            // SAFETY: ifa_name is a NUL-terminated string of the list.
            let idx = unsafe { libc::if_nametoindex(ifa.ifa_name) };
            if idx != 0 {
                found = Some(idx);
                break;
            }
        }
    }
    // SAFETY: frees the list getifaddrs allocated, once.
    unsafe { libc::freeifaddrs(list) };
    found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no interface holds {ip}")))
}

/// The address at `p` (IPv4 or IPv6; `None` for other families).
///
/// # Safety
/// `p` points to a valid `sockaddr` of the size its family says.
unsafe fn sockaddr_at(p: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: the caller's promise; all-zero is a valid sockaddr_storage.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match i32::from(unsafe { (*p).sa_family }) {
        libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
        _ => return None,
    };
    // SAFETY: copies `len` bytes of a sockaddr of that size into storage large enough.
    unsafe {
        std::ptr::copy_nonoverlapping(
            p.cast::<u8>(),
            (&mut st as *mut libc::sockaddr_storage).cast::<u8>(),
            len,
        )
    };
    crate::addr::from_sockaddr(&st)
}

/// The name of interface `ifindex`.
pub fn interface_name(ifindex: u32) -> io::Result<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(name.to_string_lossy().into_owned())
}

/// The MTU of interface `name` (`SIOCGIFMTU`).
fn interface_mtu(name: &str) -> io::Result<u32> {
    let mut req = iface::ifreq(name)?;
    iface::interface_ioctl(libc::SIOCGIFMTU as libc::c_ulong, &mut req)?;
    // SAFETY: SIOCGIFMTU filled the union's MTU member.
    Ok(u32::try_from(unsafe { req.ifr_ifru.ifru_mtu }).unwrap_or(0))
}

/// The receive queues of interface `name` (`ETHTOOL_GCHANNELS`: receive-only plus combined
/// channels); 1 when the driver does not say: frames on a queue without a socket still reach
/// the kernel (see `prog.rs`).
fn rx_queues(name: &str) -> u32 {
    /// `struct ethtool_channels`: cmd, max_rx, max_tx, max_other, max_combined, rx_count,
    /// tx_count, other_count, combined_count.
    const ETHTOOL_GCHANNELS: u32 = 0x3c;
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    let mut ch = [0u32; 9];
    ch[0] = ETHTOOL_GCHANNELS;
    let Ok(mut req) = iface::ifreq(name) else {
        return 1;
    };
    req.ifr_ifru.ifru_data = ch.as_mut_ptr().cast();
    match iface::interface_ioctl(SIOCETHTOOL, &mut req) {
        Ok(()) => (ch[5] + ch[8]).max(1),
        Err(_) => 1,
    }
}
