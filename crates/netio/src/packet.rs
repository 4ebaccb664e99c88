//! AF_PACKET on a customer-facing interface (issue 16 §1): frames in through a TPACKET_V3
//! receive ring (the kernel fills blocks of frames in shared memory; no system call per frame,
//! none at all while blocks are waiting), frames out through a transmit ring on a second,
//! send-only socket of the interface (`tx.rs`: frames copied into shared slots, one `send` per
//! batch, the queueing discipline bypassed), or with `sendmmsg` on the receiving socket where
//! the kernel refuses the ring. See packet(7) and the kernel's
//! `Documentation/networking/packet_mmap`.
//!
//! The kernel moves a frame's outer VLAN tag into metadata before packet sockets see it
//! (`skb_vlan_untag` in `__netif_receive_skb_core`, and any NIC or veth VLAN offload), so the
//! ring's frames arrive without it; the tag is in the frame header (`tp_vlan_tci`, with
//! `tp_vlan_tpid` since Linux 3.14). [`PacketSocket::read_batch`] writes it back into the copy
//! it makes, so later stages see the frame as it was on the wire. Outgoing frames are written
//! with their tags in the data; the kernel sends them as they are.
//!
//! Why not a crate: the Rust AF_PACKET crates we know either receive one frame per system call
//! (`pnet_datalink`), or read the ring but allocate a vector per block and are GPL-licensed
//! (`af_packet`); AF_XDP (`xsk-rs`, libxdp bindings) needs libbpf built from C and an XDP
//! program per interface. This file is the receive ring walk and the `sendmmsg` fallback,
//! `tx.rs` the transmit ring, over `libc`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
pub use tx::FrameSendReport;
use tx::TxRing;

mod tx;

/// Bytes per ring block (the kernel hands the ring over block by block).
const BLOCK_SIZE: usize = 1 << 18;
/// Blocks in the ring (4 MiB per interface).
const BLOCKS: usize = 16;
/// The nominal frame size the kernel checks the ring geometry with (TPACKET_V3 packs frames
/// of any size into a block).
const FRAME_SIZE: usize = 2048;
/// A block with frames in it is handed over after at most this long (milliseconds), so a
/// lone frame waits no longer.
const BLOCK_TIMEOUT_MS: u32 = 1;
/// Frames per `sendmmsg` call.
const SEND_CHUNK: usize = 64;
/// How long a send waits for room in the socket's queue (or transmit ring) before the rest is
/// dropped.
const SEND_WAIT_MS: i32 = 50;
/// Offset of `block_status` in `struct tpacket_block_desc` (after `version` and
/// `offset_to_priv`).
const BLOCK_STATUS: usize = 8;
/// Offset of `num_pkts`.
const BLOCK_NUM_PKTS: usize = 12;
/// Offset of `offset_to_first_pkt`.
const BLOCK_FIRST_PKT: usize = 16;
/// `TPACKET_ALIGN(sizeof(struct tpacket3_hdr))`: where the frame's `sockaddr_ll` starts.
const HDR_ALIGNED: usize = (std::mem::size_of::<libc::tpacket3_hdr>() + libc::TPACKET_ALIGNMENT
    - 1)
    & !(libc::TPACKET_ALIGNMENT - 1);
/// Offset of `sll_pkttype` in `struct sockaddr_ll`.
const SLL_PKTTYPE: usize = 10;

/// How a [`PacketSocket`] sends frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TxMode {
    /// Through a transmit ring (`PACKET_TX_RING`); with `sendmmsg` (logged) if the kernel
    /// refuses the ring.
    #[default]
    Ring,
    /// With `sendmmsg`, one message per frame.
    Sendmmsg,
}

/// One received frame in a [`FrameBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxFrame {
    /// Offset in the batch buffer.
    pub start: usize,
    /// Length (the outer VLAN tag written back included).
    pub len: usize,
    /// The frame was longer than what the ring kept of it.
    pub truncated: bool,
    /// Its TCP or UDP checksum is left to finish (`TP_STATUS_CSUMNOTREADY`: sent by a local
    /// stack with checksum offload).
    pub csum_not_ready: bool,
}

/// Frames copied out of a receive ring, back to back.
pub struct FrameBatch {
    buf: Box<[u8]>,
    used: usize,
    frames: Vec<RxFrame>,
    max_frames: usize,
    /// Frames dropped since the last `clear` because they do not fit even an empty batch.
    pub too_big: u64,
    /// Frames given up since the last `clear` because a ring frame header lay outside its
    /// block.
    pub bad_headers: u64,
}

impl FrameBatch {
    /// A batch of up to `max_frames` frames in `bytes` bytes.
    pub fn new(max_frames: usize, bytes: usize) -> Self {
        Self {
            buf: vec![0; bytes.max(FRAME_SIZE)].into_boxed_slice(),
            used: 0,
            frames: Vec::with_capacity(max_frames.max(1)),
            max_frames: max_frames.max(1),
            too_big: 0,
            bad_headers: 0,
        }
    }

    /// Empties the batch (and zeroes its drop counts).
    pub fn clear(&mut self) {
        self.used = 0;
        self.frames.clear();
        self.too_big = 0;
        self.bad_headers = 0;
    }

    /// The frames.
    pub fn frames(&self) -> &[RxFrame] {
        &self.frames
    }

    /// Frame `i`, writable (the stages rewrite in place).
    pub fn frame_mut(&mut self, i: usize) -> &mut [u8] {
        let f = self.frames[i];
        &mut self.buf[f.start..f.start + f.len]
    }

    /// Copies `frame` in, its outer VLAN tag (`vlan`: TPID and TCI) written back after the
    /// MAC addresses; false (nothing copied) if the batch is full.
    pub fn push(&mut self, frame: &[u8], vlan: Option<(u16, u16)>, truncated: bool) -> bool {
        let tag = if vlan.is_some() && frame.len() >= 12 {
            4
        } else {
            0
        };
        let len = frame.len() + tag;
        if self.frames.len() >= self.max_frames || self.buf.len() - self.used < len {
            return false;
        }
        let out = &mut self.buf[self.used..self.used + len];
        match vlan {
            Some((tpid, tci)) if tag == 4 => {
                out[..12].copy_from_slice(&frame[..12]);
                out[12..14].copy_from_slice(&tpid.to_be_bytes());
                out[14..16].copy_from_slice(&tci.to_be_bytes());
                out[16..].copy_from_slice(&frame[12..]);
            }
            _ => out.copy_from_slice(frame),
        }
        self.frames.push(RxFrame {
            start: self.used,
            len,
            truncated,
            csum_not_ready: false,
        });
        self.used += len;
        true
    }
}

/// Where the next frame to read is.
struct Cursor {
    /// Block index.
    block: usize,
    /// Frames of the block already read.
    read: u32,
    /// Offset of the next frame in the block.
    offset: usize,
}

/// An AF_PACKET socket bound to one interface, with a TPACKET_V3 receive ring.
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: u32,
    name: String,
    mac: [u8; 6],
    ring: *mut u8,
    ring_len: usize,
    /// The transmit ring, on a socket of its own (None: the kernel refused it, or
    /// [`TxMode::Sendmmsg`]).
    tx: Option<TxRing>,
    /// The reading position; readers are serialised by their lane's dispatch stage, the lock
    /// makes it so for any caller.
    cursor: Mutex<Cursor>,
    /// A block came back marked `TP_STATUS_LOSING`: the kernel dropped frames (ring full).
    losing: AtomicBool,
}

// SAFETY: the rings are shared memory owned by this value until drop; the receive ring is read
// only under `cursor`'s lock, the transmit ring written only under its own, and each block's or
// slot's status word is accessed atomically.
unsafe impl Send for PacketSocket {}
// SAFETY: as above; `send_batch` only reads caller buffers.
unsafe impl Sync for PacketSocket {}

fn last_error() -> io::Error {
    io::Error::last_os_error()
}

/// The index of the network interface named `interface` (any of its names).
pub fn interface_index(interface: &str) -> io::Result<u32> {
    let cname = std::ffi::CString::new(interface)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in interface name"))?;
    // SAFETY: a valid C string.
    let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if ifindex == 0 {
        return Err(last_error());
    }
    Ok(ifindex)
}

/// Opens an AF_PACKET raw socket for EtherType `protocol` (host order; 0 receives nothing, for
/// a socket that only sends), non-blocking if asked, sets the integer socket options
/// `options` (level, name, value), and binds it to interface `ifindex`. For the plain packet
/// sockets of the tests' tagger and the benchmark's load generator; [`PacketSocket`] adds the
/// receive ring. Needs CAP_NET_RAW.
pub fn open_raw(
    ifindex: u32,
    protocol: u16,
    nonblocking: bool,
    options: &[(libc::c_int, libc::c_int, libc::c_int)],
) -> io::Result<OwnedFd> {
    let mut flags = libc::SOCK_RAW | libc::SOCK_CLOEXEC;
    if nonblocking {
        flags |= libc::SOCK_NONBLOCK;
    }
    // SAFETY: plain socket call.
    let raw = unsafe { libc::socket(libc::AF_PACKET, flags, libc::c_int::from(protocol.to_be())) };
    if raw < 0 {
        return Err(last_error());
    }
    // SAFETY: `raw` is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    for &(level, name, value) in options {
        setsockopt(fd.as_raw_fd(), level, name, &value)?;
    }
    bind_to(fd.as_raw_fd(), ifindex, protocol)?;
    Ok(fd)
}

/// Binds the AF_PACKET socket `fd` to interface `ifindex` for EtherType `protocol` (host order).
fn bind_to(fd: RawFd, ifindex: u32, protocol: u16) -> io::Result<()> {
    // SAFETY: sockaddr_ll is plain data.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = protocol.to_be();
    sll.sll_ifindex = ifindex as libc::c_int;
    // SAFETY: `sll` is a live sockaddr_ll and its size is passed.
    let r = unsafe {
        libc::bind(
            fd,
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(last_error());
    }
    Ok(())
}

fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live T and its size is passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(last_error())
    }
}

impl PacketSocket {
    /// Opens `interface` (which must exist): an AF_PACKET socket for every EtherType, bound to
    /// it, non-blocking, with the receive ring and (where the kernel grants it) the transmit
    /// ring mapped, the interface promiscuous while it is open. Needs CAP_NET_RAW.
    pub fn open(interface: &str) -> io::Result<Self> {
        Self::open_with(interface, TxMode::Ring)
    }

    /// [`PacketSocket::open`], sending as `mode` says. Either way frames bypass the
    /// interface's queueing discipline (`PACKET_QDISC_BYPASS`): they go straight to the
    /// driver, not through `tc` (no shaping, no egress filters) and not past the interface's
    /// packet taps (a capture on this interface does not see them; one on the far end does).
    pub fn open_with(interface: &str, mode: TxMode) -> io::Result<Self> {
        let ifindex = interface_index(interface)?;
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket call.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::c_int::from(proto),
            )
        };
        if raw < 0 {
            return Err(last_error());
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let version = libc::tpacket_versions::TPACKET_V3 as libc::c_int;
        setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_VERSION,
            &version,
        )?;
        // Our own frames must not come back to us (Linux 4.20+; older kernels skip the
        // sending socket anyway, and the ring walk drops outgoing frames as well).
        let _ = setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            &1 as &libc::c_int,
        );
        // Straight to the driver (Linux 3.14+); without it frames take the queueing
        // discipline's path, which works as well.
        if let Err(e) = setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_QDISC_BYPASS,
            &1 as &libc::c_int,
        ) {
            tracing::debug!(interface, error = %e, "PACKET_QDISC_BYPASS refused");
        }
        let req = libc::tpacket_req3 {
            tp_block_size: BLOCK_SIZE as u32,
            tp_block_nr: BLOCKS as u32,
            tp_frame_size: FRAME_SIZE as u32,
            tp_frame_nr: (BLOCK_SIZE / FRAME_SIZE * BLOCKS) as u32,
            tp_retire_blk_tov: BLOCK_TIMEOUT_MS,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        setsockopt(fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_RX_RING, &req)?;
        let ring_len = BLOCK_SIZE * BLOCKS;
        // SAFETY: maps the ring the kernel just allocated for this socket.
        let ring = unsafe {
            libc::mmap(
                ptr::null_mut(),
                ring_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ring == libc::MAP_FAILED {
            return Err(last_error());
        }
        let ring = ring.cast::<u8>();
        let tx = match mode {
            TxMode::Sendmmsg => None,
            TxMode::Ring => match interface_mtu(fd.as_raw_fd(), interface)
                .and_then(|mtu| TxRing::open(ifindex, mtu))
            {
                Ok(tx) => Some(tx),
                Err(e) => {
                    tracing::warn!(interface, error = %e, "no transmit ring: sending with sendmmsg");
                    None
                }
            },
        };
        let mut sock = Self {
            fd,
            ifindex,
            name: interface.to_owned(),
            mac: [0; 6],
            ring,
            ring_len,
            tx,
            cursor: Mutex::new(Cursor {
                block: 0,
                read: 0,
                offset: 0,
            }),
            losing: AtomicBool::new(false),
        };
        bind_to(sock.fd.as_raw_fd(), ifindex, libc::ETH_P_ALL as u16)?;
        // Promiscuous for as long as the socket lives (the kernel counts it per socket and
        // takes it back on close): the gateway's address is no kernel address, so the
        // interface has not joined the solicited-node group of an IPv6 `gateway_ip`, and
        // frames to the MACs of other hosts on a shared segment as well as tagged frames with
        // VLAN ids the interface never registered are ours to see (a NIC filtering VLANs in
        // hardware still needs `ethtool -K IF rx-vlan-filter off`, docs/configuration.md).
        let mreq = libc::packet_mreq {
            mr_ifindex: ifindex as libc::c_int,
            mr_type: libc::PACKET_MR_PROMISC as libc::c_ushort,
            mr_alen: 0,
            mr_address: [0; 8],
        };
        setsockopt(
            sock.fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_ADD_MEMBERSHIP,
            &mreq,
        )?;
        sock.mac = hardware_address(sock.fd.as_raw_fd(), interface)?;
        Ok(sock)
    }

    /// Whether frames go out through the transmit ring (false: `sendmmsg`).
    pub fn has_tx_ring(&self) -> bool {
        self.tx.is_some()
    }

    /// The longest frame a transmit ring slot holds (None without a ring); frames are also
    /// held to the interface's MTU when the socket was opened, plus the Ethernet header (and
    /// an 802.1Q tag).
    pub fn tx_ring_room(&self) -> Option<usize> {
        self.tx.as_ref().map(TxRing::room)
    }

    /// The descriptor workers poll (readable when a block is handed over).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The interface's index (what tells interfaces apart: one may have several names).
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The interface's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn status(&self, block: usize) -> &AtomicU32 {
        // SAFETY: the block descriptor lies at the start of each block inside the mapping;
        // the status word is 4-byte aligned (blocks are page aligned) and shared with the
        // kernel, hence atomic.
        unsafe {
            &*self
                .ring
                .add(block * BLOCK_SIZE + BLOCK_STATUS)
                .cast::<AtomicU32>()
        }
    }

    /// Copies the frames the kernel handed over into `out` (which is cleared first), until it
    /// is full or no block is ready; returns the frames copied and whether the batch filled
    /// (never with none copied: a frame too big for an empty batch is dropped and counted,
    /// [`FrameBatch::too_big`]). Blocks are given back to the kernel as soon as they are read
    /// whole. Frames we sent ourselves are skipped.
    pub fn read_batch(&self, out: &mut FrameBatch) -> (usize, bool) {
        out.clear();
        let mut cur = self.cursor.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let block = cur.block;
            let status = self.status(block).load(Ordering::Acquire);
            if status & libc::TP_STATUS_USER == 0 {
                return (out.frames.len(), false);
            }
            if status & libc::TP_STATUS_LOSING != 0 {
                self.losing.store(true, Ordering::Relaxed);
            }
            // SAFETY: the block lies within the mapping, and while its status says
            // TP_STATUS_USER the kernel leaves it to us; the slice is gone before the status
            // is handed back below.
            let bytes = unsafe {
                std::slice::from_raw_parts(self.ring.add(block * BLOCK_SIZE), BLOCK_SIZE)
            };
            if walk_block(bytes, &mut cur, out) == Walk::BatchFull {
                return (out.frames.len(), true);
            }
            self.status(block)
                .store(libc::TP_STATUS_KERNEL, Ordering::Release);
            cur.block = (block + 1) % BLOCKS;
            cur.read = 0;
        }
    }

    /// The frames the kernel dropped because the ring was full, since the last call: read
    /// (and reset) with `PACKET_STATISTICS` only after a block came back marked as losing, so
    /// the common case costs no system call.
    pub fn take_losses(&self) -> u64 {
        if !self.losing.swap(false, Ordering::Relaxed) {
            return 0;
        }
        // SAFETY: tpacket_stats_v3 is plain data.
        let mut st: libc::tpacket_stats_v3 = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tpacket_stats_v3>() as libc::socklen_t;
        // SAFETY: `st` is live and `len` its size.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats_v3).cast(),
                &mut len,
            )
        };
        if r == 0 {
            u64::from(st.tp_drops)
        } else {
            0
        }
    }

    /// Sends `frames` (whole Ethernet frames, tags in the data) in their order: through the
    /// transmit ring, one `send` per call (and one more each time the ring fills), or with
    /// `sendmmsg`, 64 frames per system call. Waits up to 50 ms in all for room when the
    /// ring or the socket's queue is full; what still finds none is dropped and counted.
    pub fn send_frames<'a>(
        &self,
        frames: impl Iterator<Item = &'a [u8]>,
        scratch: &mut PacketScratch,
    ) -> FrameSendReport {
        match &self.tx {
            Some(tx) => tx.send(&self.name, frames),
            None => self.send_mmsg(frames, scratch),
        }
    }

    /// [`PacketSocket::send_frames`], returning how many frames were not sent.
    pub fn send_batch<'a>(
        &self,
        frames: impl Iterator<Item = &'a [u8]>,
        scratch: &mut PacketScratch,
    ) -> u64 {
        self.send_frames(frames, scratch).failed()
    }

    /// Sends `frames` with `sendmmsg`, [`SEND_CHUNK`] per call; waits up to 50 ms for room
    /// when the queue is full.
    fn send_mmsg<'a>(
        &self,
        frames: impl Iterator<Item = &'a [u8]>,
        scratch: &mut PacketScratch,
    ) -> FrameSendReport {
        let mut report = FrameSendReport::default();
        scratch.clear();
        for f in frames {
            scratch.iovs.push(libc::iovec {
                iov_base: f.as_ptr() as *mut libc::c_void,
                iov_len: f.len(),
            });
        }
        let total = scratch.iovs.len();
        // SAFETY: mmsghdr is plain data.
        scratch
            .msgs
            .resize_with(total, || unsafe { std::mem::zeroed() });
        for (m, iov) in scratch.msgs.iter_mut().zip(scratch.iovs.iter_mut()) {
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
            m.msg_len = 0;
        }
        let mut done = 0;
        let mut waited = false;
        while done < total {
            let n = (total - done).min(SEND_CHUNK);
            // SAFETY: the headers point at live iovecs over the caller's frames.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    scratch.msgs.as_mut_ptr().add(done),
                    n as libc::c_uint,
                    0,
                )
            };
            if r > 0 {
                done += r as usize;
                report.sent += r as u64;
                continue;
            }
            let e = last_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock if !waited => {
                    waited = true;
                    let mut p = libc::pollfd {
                        fd: self.fd.as_raw_fd(),
                        events: libc::POLLOUT,
                        revents: 0,
                    };
                    // SAFETY: one live pollfd.
                    unsafe { libc::poll(&mut p, 1, SEND_WAIT_MS) };
                }
                io::ErrorKind::WouldBlock => {
                    report.queue_full += (total - done) as u64;
                    break;
                }
                _ => {
                    // This frame is refused (too long for the interface, say): skip it.
                    tracing::debug!(interface = %self.name, error = %e, "frame not sent");
                    report.refused += 1;
                    done += 1;
                }
            }
        }
        scratch.clear();
        report
    }
}

impl Drop for PacketSocket {
    fn drop(&mut self) {
        // SAFETY: unmaps what `open` mapped; nothing refers to it after drop.
        unsafe { libc::munmap(self.ring.cast(), self.ring_len) };
    }
}

/// How a block walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// Every frame of the block was read (or the rest cannot be trusted): give it back.
    Done,
    /// The batch filled; the cursor is at the frame that did not fit.
    BatchFull,
}

/// A native-endian `u32` at `offset` in `block` (0 if outside it).
fn read_u32(block: &[u8], offset: usize) -> u32 {
    block
        .get(offset..offset + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

/// Copies the frames of `block` (one whole ring block the kernel handed over) from `cur` on
/// into `out`. A frame too big for the empty batch would never fit: it is counted
/// ([`FrameBatch::too_big`]) and skipped, so one oversized frame cannot stop the ring. A
/// frame header outside the block ends the walk, the frames left counted
/// ([`FrameBatch::bad_headers`]).
fn walk_block(block: &[u8], cur: &mut Cursor, out: &mut FrameBatch) -> Walk {
    let count = read_u32(block, BLOCK_NUM_PKTS);
    if cur.read == 0 {
        cur.offset = read_u32(block, BLOCK_FIRST_PKT) as usize;
    }
    while cur.read < count {
        let Some(frame) = frame_at(block, cur.offset) else {
            break;
        };
        if !frame.outgoing {
            let bytes = &block[frame.data..frame.data + frame.snaplen];
            if out.push(bytes, frame.vlan, frame.truncated) {
                if let Some(f) = out.frames.last_mut() {
                    f.csum_not_ready = frame.csum_not_ready;
                }
            } else {
                if !out.frames.is_empty() {
                    return Walk::BatchFull;
                }
                out.too_big += 1;
            }
        }
        cur.read += 1;
        if frame.next == 0 {
            break;
        }
        cur.offset = cur.offset.saturating_add(frame.next);
    }
    out.bad_headers += u64::from(count - cur.read);
    Walk::Done
}

/// The frame whose header is at `offset` in `block`, checked to lie within the block.
fn frame_at(block: &[u8], offset: usize) -> Option<RingFrame> {
    let end = offset.checked_add(HDR_ALIGNED + SLL_PKTTYPE + 1)?;
    if end > block.len() {
        return None;
    }
    // SAFETY: the header lies within the block (checked above: HDR_ALIGNED covers it), and
    // tpacket3_hdr is plain data, valid for any bytes.
    let h: libc::tpacket3_hdr = unsafe { ptr::read_unaligned(block.as_ptr().add(offset).cast()) };
    let data = offset + usize::from(h.tp_mac);
    let snaplen = h.tp_snaplen as usize;
    if data.checked_add(snaplen)? > block.len() {
        return None;
    }
    let pkttype = block[offset + HDR_ALIGNED + SLL_PKTTYPE];
    let vlan = (h.tp_status & libc::TP_STATUS_VLAN_VALID != 0).then(|| {
        let tpid = if h.tp_status & libc::TP_STATUS_VLAN_TPID_VALID != 0 {
            h.hv1.tp_vlan_tpid
        } else {
            0x8100
        };
        (tpid, h.hv1.tp_vlan_tci as u16)
    });
    Some(RingFrame {
        data,
        snaplen,
        next: h.tp_next_offset as usize,
        truncated: h.tp_len as usize > snaplen,
        csum_not_ready: h.tp_status & libc::TP_STATUS_CSUMNOTREADY != 0,
        outgoing: pkttype == libc::PACKET_OUTGOING,
        vlan,
    })
}

/// A ring frame's header, checked.
struct RingFrame {
    /// Offset of the frame's first byte in the block.
    data: usize,
    snaplen: usize,
    /// Offset of the next header from this one (0: last).
    next: usize,
    truncated: bool,
    csum_not_ready: bool,
    outgoing: bool,
    vlan: Option<(u16, u16)>,
}

/// `sendmmsg` scratch, reused across batches (empty between calls).
#[derive(Default)]
pub struct PacketScratch {
    msgs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
}

// SAFETY: the raw pointers in the vectors are only set within `send_batch` and cleared before
// it returns; between calls the vectors are empty.
unsafe impl Send for PacketScratch {}

impl PacketScratch {
    fn clear(&mut self) {
        self.msgs.clear();
        self.iovs.clear();
    }
}

/// The MTU of `interface` (SIOCGIFMTU on `fd`).
fn interface_mtu(fd: RawFd, interface: &str) -> io::Result<usize> {
    // SAFETY: ifreq is plain data.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(interface.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: `req` is a live ifreq naming the interface.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &mut req) } != 0 {
        return Err(last_error());
    }
    // SAFETY: SIOCGIFMTU filled the MTU member.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    Ok(usize::try_from(mtu).unwrap_or(0))
}

/// The MAC address of `interface` (SIOCGIFHWADDR on `fd`), which must be an Ethernet
/// interface (or loopback, Ethernet-framed).
fn hardware_address(fd: RawFd, interface: &str) -> io::Result<[u8; 6]> {
    // SAFETY: ifreq is plain data.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(interface.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: `req` is a live ifreq naming the interface.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut req) } != 0 {
        return Err(last_error());
    }
    // SAFETY: SIOCGIFHWADDR filled the hardware address member.
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    // Frames are read and written as Ethernet: an interface of another link type (a TUN
    // device, an IP tunnel, WireGuard) would have its packets taken apart as garbage.
    // Loopback frames carry an Ethernet header too (the stage tests attach to `lo`).
    if sa.sa_family != libc::ARPHRD_ETHER && sa.sa_family != libc::ARPHRD_LOOPBACK {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{interface} is not an Ethernet interface (link type {})",
                sa.sa_family
            ),
        ));
    }
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(sa.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok(mac)
}

#[cfg(test)]
mod tests;
