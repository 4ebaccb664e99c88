//! The transmit ring of a [`super::PacketSocket`] (`PACKET_TX_RING`, packet(7) and the kernel's
//! `Documentation/networking/packet_mmap`): frames are written into fixed-size slots of a ring
//! shared with the kernel, marked `TP_STATUS_SEND_REQUEST`, and one
//! `send(fd, NULL, 0, MSG_DONTWAIT)` hands every marked slot to the interface (no `msghdr`
//! per frame); the kernel marks a slot `TP_STATUS_AVAILABLE` again when its skb is freed.
//!
//! The ring has a socket of its own, bound to the interface for sending only (protocol 0: it
//! receives nothing), TPACKET_V3 (for sending, fixed-size slots as in V2: a `tpacket3_hdr`
//! with `tp_next_offset` 0, the data at `TPACKET_ALIGN(sizeof(tpacket3_hdr))`), with
//! `PACKET_QDISC_BYPASS` and `PACKET_VNET_HDR`. Each slot's data is a `virtio_net_hdr` (no
//! offload) whose `hdr_len` is the whole frame, then the frame: the kernel then copies the
//! frame into the skb's head instead of attaching the slot's page as a zero-copy fragment.
//! A zero-copy fragment must be copied again (a fresh page per frame, `skb_copy_ubufs`)
//! wherever the skb is handed on inside the machine (a veth, a bridge, a local tap): in the
//! first profile of this ring that copy was 29 % of the gateway's CPU on the benchmark's veth,
//! more than the frame copy it saves. The vnet header lives on this socket only, so the receive
//! ring's frames keep their layout.
//!
//! What the kernel does with a slot, and what we do about it (`tpacket_snd` in
//! `net/packet/af_packet.c`):
//! - a frame it refuses would stop the ring at that slot (`TP_STATUS_WRONG_FORMAT`); the socket
//!   sets `PACKET_LOSS`, so the kernel skips such a slot instead, uncounted. With a vnet header
//!   the kernel does not check the MTU either: every frame is checked against the interface's
//!   limits before it is written ([`TxRing::fits`]: an Ethernet header, at most MTU + 14 bytes,
//!   4 more with an 802.1Q tag, as the kernel's own send path allows) and counted as refused
//!   if it fails them. The MTU is the one read when the socket was opened.
//! - a frame the interface drops at once (peer down, a full backlog), or one without socket
//!   buffer room for its skb, stays `TP_STATUS_SEND_REQUEST` and the kernel stops there (the
//!   `send` fails, or returns what it sent): the next `send` tries it again.
//!   A frame refused for want of buffer room is waited for (`POLLOUT`); one the interface
//!   refuses (`send` fails otherwise) is tried at most [`REFUSALS`] times in a row per call,
//!   without waiting, so an interface that drops everything (peer or carrier down) costs a few
//!   system calls per batch, not a stalled worker.
//! - when the slot to write is still in use the ring is full: [`TxRing::send`] hands the
//!   kernel what is marked and waits for the slot, at most [`super::SEND_WAIT_MS`] per call;
//!   frames that find no slot after that are counted as queue-full drops. Frames still
//!   marked when the call ends (the kernel kept refusing them) are taken back and counted as
//!   refused, so a call never leaves frames behind for a later one.

use super::{bind_to, last_error, setsockopt, SEND_WAIT_MS};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where a slot's data starts: `TPACKET_ALIGN(sizeof(struct tpacket3_hdr))` (the kernel's
/// `tp_hdrlen - sizeof(struct sockaddr_ll)` without `PACKET_TX_HAS_OFF`).
const TX_DATA: usize = super::HDR_ALIGNED;
/// `sizeof(struct virtio_net_hdr)`, in front of each frame.
const VNET_HDR: usize = 10;
/// Where a slot's frame starts.
pub(super) const TX_FRAME: usize = TX_DATA + VNET_HDR;
/// The Ethernet header the kernel requires in front of every frame (`hard_header_len`).
const ETH_HEADER: usize = 14;
/// A VLAN tag: the kernel allows a frame this much above MTU + Ethernet header when its
/// EtherType is 802.1Q (`packet_extra_vlan_len_allowed`).
const VLAN_TAG: usize = 4;
/// The smallest slot (frames of a 1500-byte MTU with two tags fit).
const MIN_SLOT: usize = 2048;
/// The largest slot (a 9000-byte MTU fits); larger frames are refused.
const MAX_SLOT: usize = 16384;
/// Bytes of slots per interface.
const RING_BYTES: usize = 4 << 20;
/// Bytes per ring block (a multiple of every slot size and of the page size).
const BLOCK: usize = 1 << 16;
/// How long to sleep when the socket is writable but the slot still in flight (a NIC's
/// queue holds its skb): keeps the bounded wait from spinning.
const IN_FLIGHT_NAP: Duration = Duration::from_micros(50);

/// The status bits that mean a slot is not ours: marked for sending, being sent, or refused
/// (timestamp bits the kernel may add to an available slot are not among them).
const IN_USE: u32 =
    libc::TP_STATUS_SEND_REQUEST | libc::TP_STATUS_SENDING | libc::TP_STATUS_WRONG_FORMAT;

/// Whether a slot of status `st` is ours to write.
fn available(st: u32) -> bool {
    st & IN_USE == 0
}

/// Whether a slot of status `st` is marked for sending and not yet taken by the kernel.
fn marked(st: u32) -> bool {
    st & libc::TP_STATUS_SEND_REQUEST != 0
}

/// The geometry of a transmit ring for an interface of MTU `mtu`: slot size and slots.
pub(super) fn geometry(mtu: usize) -> (usize, usize) {
    let want = TX_FRAME + mtu.saturating_add(ETH_HEADER + VLAN_TAG);
    let slot = want.next_power_of_two().clamp(MIN_SLOT, MAX_SLOT);
    (slot, RING_BYTES / slot)
}

/// The `PACKET_TX_RING` request for slots of `slot` bytes, `slots` of them (TPACKET_V3: the
/// block timeout, private area and feature word must be 0 for a transmit ring).
pub(super) fn request(slot: usize, slots: usize) -> libc::tpacket_req3 {
    libc::tpacket_req3 {
        tp_block_size: BLOCK as u32,
        tp_block_nr: (slot * slots / BLOCK) as u32,
        tp_frame_size: slot as u32,
        tp_frame_nr: slots as u32,
        tp_retire_blk_tov: 0,
        tp_sizeof_priv: 0,
        tp_feature_req_word: 0,
    }
}

/// What one [`super::PacketSocket::send_frames`] call did with its frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameSendReport {
    /// Frames handed to the interface.
    pub sent: u64,
    /// Frames the kernel refused or would refuse (longer than the interface's MTU or than a
    /// ring slot, shorter than an Ethernet header, an error from the interface).
    pub refused: u64,
    /// Frames dropped because the socket's queue or transmit ring stayed full for the whole
    /// bounded wait.
    pub queue_full: u64,
}

impl FrameSendReport {
    /// Frames not sent.
    pub fn failed(&self) -> u64 {
        self.refused + self.queue_full
    }
}

/// A transmit ring and its socket.
pub(super) struct TxRing {
    fd: OwnedFd,
    /// The first slot (the mapping's start).
    base: *mut u8,
    slot: usize,
    slots: usize,
    /// The longest frame the kernel takes from a slot on this interface without a VLAN
    /// tag (MTU + Ethernet header, at most the slot's room).
    plain_max: usize,
    /// The longest with an 802.1Q outer tag.
    tagged_max: usize,
    /// The next slot to write; senders are serialised by it (the kernel's head follows it).
    next: Mutex<usize>,
}

impl TxRing {
    /// Opens the send-only socket of interface `ifindex` (MTU `mtu`) and maps its ring.
    pub(super) fn open(ifindex: u32, mtu: usize) -> io::Result<Self> {
        // SAFETY: plain socket call; protocol 0: the socket receives nothing.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(last_error());
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let version = libc::tpacket_versions::TPACKET_V3 as libc::c_int;
        // Every option before the ring: the kernel refuses them once it is set up.
        for (name, value) in [
            (libc::PACKET_VERSION, version),
            (libc::PACKET_LOSS, 1),
            (libc::PACKET_VNET_HDR, 1),
            (libc::PACKET_QDISC_BYPASS, 1),
        ] {
            setsockopt(fd.as_raw_fd(), libc::SOL_PACKET, name, &value)?;
        }
        let (slot, slots) = geometry(mtu);
        let req = request(slot, slots);
        setsockopt(fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_TX_RING, &req)?;
        // SAFETY: maps the ring the kernel just allocated for this socket.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                slot * slots,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(last_error());
        }
        let ring = Self::new(fd, base.cast(), slot, slots, mtu);
        bind_to(ring.fd.as_raw_fd(), ifindex, 0)?;
        Ok(ring)
    }

    /// The ring of `slots` slots of `slot` bytes mapped at `base` (zeroed by the kernel:
    /// every slot available) for an interface of MTU `mtu`, on socket `fd`.
    fn new(fd: OwnedFd, base: *mut u8, slot: usize, slots: usize, mtu: usize) -> Self {
        let room = slot - TX_FRAME;
        Self {
            fd,
            base,
            slot,
            slots,
            plain_max: room.min(mtu.saturating_add(ETH_HEADER)),
            tagged_max: room.min(mtu.saturating_add(ETH_HEADER + VLAN_TAG)),
            next: Mutex::new(0),
        }
    }

    /// The longest frame a slot holds.
    pub(super) fn room(&self) -> usize {
        self.slot - TX_FRAME
    }

    /// Whether `frame` may be written: an Ethernet header, no longer than the MTU allows
    /// (4 bytes more with an 802.1Q outer tag, as for the kernel's own checks) and than a
    /// slot.
    pub(super) fn fits(&self, frame: &[u8]) -> bool {
        let len = frame.len();
        if len < ETH_HEADER {
            return false;
        }
        len <= self.plain_max || (len <= self.tagged_max && frame[12..14] == [0x81, 0x00])
    }

    fn header(&self, i: usize) -> *mut u8 {
        debug_assert!(i < self.slots);
        // SAFETY: slot `i` lies within the mapping (i < slots; blocks are contiguous in it).
        unsafe { self.base.add(i * self.slot) }
    }

    fn status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: the status word of slot `i`'s header, 4-byte aligned (slots are multiples
        // of 16 bytes from a page-aligned base) and shared with the kernel, hence atomic.
        unsafe {
            &*self
                .header(i)
                .add(std::mem::offset_of!(libc::tpacket3_hdr, tp_status))
                .cast::<AtomicU32>()
        }
    }

    /// Copies `frame` (checked with [`TxRing::fits`]) into slot `i`, which is ours
    /// (`TP_STATUS_AVAILABLE`), behind a vnet header asking for the whole frame in the skb's
    /// head, and marks it for sending.
    fn write(&self, i: usize, frame: &[u8]) {
        let h = self.header(i);
        let len = frame.len() as u16;
        // struct virtio_net_hdr: flags, gso_type (none), hdr_len, gso_size, csum_start,
        // csum_offset; in the host's byte order (the kernel reads a packet socket's vnet
        // header in legacy virtio order, which is the host's).
        let mut vnet = [0u8; VNET_HDR];
        vnet[2..4].copy_from_slice(&len.to_ne_bytes());
        // SAFETY: the slot is ours until marked; its header, vnet header and `room()` bytes of
        // frame lie within the mapping, and `frame` is no longer than that (`fits`).
        unsafe {
            std::ptr::copy_nonoverlapping(vnet.as_ptr(), h.add(TX_DATA), VNET_HDR);
            std::ptr::copy_nonoverlapping(frame.as_ptr(), h.add(TX_FRAME), frame.len());
            let put = |off: usize, v: u32| h.add(off).cast::<u32>().write_unaligned(v);
            put(std::mem::offset_of!(libc::tpacket3_hdr, tp_next_offset), 0);
            put(
                std::mem::offset_of!(libc::tpacket3_hdr, tp_len),
                (VNET_HDR + frame.len()) as u32,
            );
        }
        self.status(i)
            .store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
    }

    /// Sends `frames` through the ring (`name`: the interface, for logs): written slot by
    /// slot, handed over with one `send` per batch (and one each time the ring fills).
    pub(super) fn send<'a>(
        &self,
        name: &str,
        frames: impl Iterator<Item = &'a [u8]>,
    ) -> FrameSendReport {
        let mut report = FrameSendReport::default();
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let mut wait = Wait::new(self.fd.as_raw_fd(), name);
        let mut marked = 0u64;
        for f in frames {
            if !self.fits(f) {
                report.refused += 1;
                continue;
            }
            let i = *next;
            if !available(self.status(i).load(Ordering::Acquire)) {
                // The ring is full: hand over what is marked, then wait for this slot.
                if marked > 0 {
                    wait.kick();
                    marked = 0;
                }
                if !self.wait_for(i, &mut wait) {
                    report.queue_full += 1;
                    continue;
                }
            }
            self.write(i, f);
            *next = (i + 1) % self.slots;
            marked += 1;
            report.sent += 1;
        }
        if marked > 0 {
            wait.kick();
        }
        let left = self.finish(&mut next, &mut wait);
        report.sent = report.sent.saturating_sub(left);
        report.refused += left;
        report
    }

    /// Waits until slot `i` is available, handing marked slots to the kernel meanwhile; false
    /// once this call's wait is spent.
    fn wait_for(&self, i: usize, wait: &mut Wait) -> bool {
        loop {
            let st = self.status(i).load(Ordering::Acquire);
            if available(st) {
                return true;
            }
            let untaken = marked(st);
            if untaken {
                // Marked but not taken: another `send` may take it now.
                wait.kick();
                if available(self.status(i).load(Ordering::Acquire)) {
                    return true;
                }
            }
            if !wait.retry(untaken) {
                return false;
            }
        }
    }

    /// After the last `send` of a call: lets the kernel take every marked slot (within the
    /// call's wait), then takes back the slots it still has not taken (the newest ones, a
    /// contiguous run ending before `next`) and returns how many.
    fn finish(&self, next: &mut usize, wait: &mut Wait) -> u64 {
        let last = (*next + self.slots - 1) % self.slots;
        while marked(self.status(last).load(Ordering::Acquire)) && wait.retry(true) {
            wait.kick();
        }
        // Outside a `send` the kernel leaves marked slots alone, and our lock keeps every
        // other sender out: the run of marked slots ending at `last` is the kernel's head
        // onward, and giving it back moves our cursor to the kernel's head.
        let mut taken_back = 0;
        while taken_back < self.slots {
            let i = (*next + self.slots - 1) % self.slots;
            if !marked(self.status(i).load(Ordering::Acquire)) {
                break;
            }
            self.status(i)
                .store(libc::TP_STATUS_AVAILABLE, Ordering::Release);
            *next = i;
            taken_back += 1;
        }
        if taken_back > 0 {
            tracing::debug!(
                interface = %wait.name,
                frames = taken_back,
                error = ?wait.refused,
                "frames not taken by the kernel"
            );
        }
        taken_back as u64
    }
}

impl Drop for TxRing {
    fn drop(&mut self) {
        // SAFETY: unmaps what `open` mapped; nothing refers to it after drop.
        unsafe { libc::munmap(self.base.cast(), self.slot * self.slots) };
    }
}

/// Refusals in a row after which a call stops handing the kernel its marked slots (the
/// interface drops every frame: peer or carrier down, a full backlog that does not drain).
const REFUSALS: u32 = 3;

/// One call's kicks and its bounded wait for room ([`SEND_WAIT_MS`] in all).
struct Wait<'n> {
    fd: RawFd,
    name: &'n str,
    deadline: Option<Instant>,
    /// The last `send` failed other than for buffer room: its error.
    refused: Option<io::ErrorKind>,
    /// Such failures in a row.
    refusals: u32,
    /// The wait is spent (or the interface refuses frames): no more waiting in this call.
    spent: bool,
}

impl<'n> Wait<'n> {
    fn new(fd: RawFd, name: &'n str) -> Self {
        Self {
            fd,
            name,
            deadline: None,
            refused: None,
            refusals: 0,
            spent: false,
        }
    }

    /// Hands the marked slots to the kernel: `send(fd, NULL, 0, MSG_DONTWAIT)`. The kernel
    /// takes them in order and stops at the first it cannot send, which stays marked.
    fn kick(&mut self) {
        loop {
            // SAFETY: a send with no buffer; the kernel reads the ring.
            let r = unsafe { libc::send(self.fd, std::ptr::null(), 0, libc::MSG_DONTWAIT) };
            if r >= 0 {
                self.refused = None;
                self.refusals = 0;
                return;
            }
            let e = last_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                // No socket buffer room for the next skb: worth waiting for.
                io::ErrorKind::WouldBlock => {
                    self.refused = None;
                    return;
                }
                kind => {
                    tracing::trace!(interface = %self.name, error = %e, "transmit ring send");
                    self.refused = Some(kind);
                    self.refusals += 1;
                    return;
                }
            }
        }
    }

    /// Whether to look at a slot again: a `marked` one (the kernel did not take it) at once
    /// after an interface's refusal (up to [`REFUSALS`] in a row); otherwise (no buffer room,
    /// or the slot in flight) after waiting for the socket to become writable, or a short nap
    /// if it already is. False once the call's wait is spent.
    fn retry(&mut self, marked: bool) -> bool {
        if self.spent {
            return false;
        }
        if marked && self.refused.is_some() {
            self.spent = self.refusals >= REFUSALS;
            return !self.spent;
        }
        let now = Instant::now();
        let deadline = *self
            .deadline
            .get_or_insert(now + Duration::from_millis(SEND_WAIT_MS as u64));
        let Some(left) = deadline
            .checked_duration_since(now)
            .filter(|d| !d.is_zero())
        else {
            self.spent = true;
            return false;
        };
        let mut p = libc::pollfd {
            fd: self.fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, SEND_WAIT_MS as u128) as libc::c_int;
        // SAFETY: one live pollfd.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r > 0 {
            std::thread::sleep(IN_FLIGHT_NAP.min(left));
        }
        true
    }
}
