//! The TUN inside interface (Linux `Documentation/networking/tuntap.rst`): a layer-3 device
//! opened through `/dev/net/tun` with `TUNSETIFF` and brought up; routes are the operator's
//! business.
//!
//! # Modes
//! [`Tun::open`] makes a plain device (`IFF_TUN | IFF_NO_PI`): each read or write is exactly one
//! IP packet. [`Tun::open_with`] asks for offloads: `IFF_VNET_HDR`, then `TUNSETOFFLOAD` with
//! `TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_USO4 | TUN_F_USO6`, then without the USO flags
//! (Linux < 6.2), and if the kernel refuses those too it reopens the device plain; the outcome
//! is logged once and [`Tun::offloads`] tells which offloads are on. In offload mode every packet
//! carries a `virtio_net_hdr` and may be a GSO super-packet (see [`super::tun_offload`]).
//!
//! # Batches
//! TUN has no `recvmmsg`: [`Tun::read_batch`] reads until the device has nothing more
//! (`EAGAIN`), the batch is full, or `max_reads` reads were made, and splits super-packets in
//! place into the caller's [`TunReadBatch`], which hands them out as frames of back-to-back
//! packets (`stride` bytes each but the last, like a UDP GRO train) or as single packets.
//! A super-packet that does not fit the rest of the batch waits inside the batch for the next
//! call. Malformed frames are counted per [`TunDrop`] reason in the batch, never a panic.
//! The write side is [`TunWriter`]: push packets, then [`TunWriter::flush`] writes one vectored
//! `writev` per flow per batch. Plain mode is the same API with one packet per syscall.

// The TUN worker moves to this API in issue 3's dataplane rewrite; until then parts are only
// used by the tests. Remove this allowance with the switch.

use super::cvt;
use super::tun_offload::split::{split_frame, SplitFault};
use super::tun_offload::writer::{FlushStats, Push, TunWriter};
use super::tun_offload::{Offloads, TunDrop, TunDrops, VnetHdr, MAX_IP_PACKET, VNET_HDR_LEN};
use std::ffi::CString;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// An open TUN device.
#[derive(Debug)]
pub(crate) struct Tun {
    fd: OwnedFd,
    name: String,
    offloads: Offloads,
}

/// Opens `/dev/net/tun` and attaches it to the device `name`, with a vnet header if `vnet`.
fn attach(name: &str, vnet: bool) -> io::Result<OwnedFd> {
    let mut req = netio::iface::ifreq(name)?;
    let path = CString::new("/dev/net/tun").expect("static path has no NUL");
    // SAFETY: plain syscall with a valid C string; the descriptor is checked then owned.
    let raw = cvt(unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    })?;
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut flags = libc::IFF_TUN | libc::IFF_NO_PI;
    if vnet {
        flags |= libc::IFF_VNET_HDR;
    }
    req.ifr_ifru.ifru_flags = flags as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes one ifreq.
    cvt(unsafe { libc::ioctl(raw, libc::TUNSETIFF as _, &mut req as *mut libc::ifreq) })?;
    if vnet {
        let size: libc::c_int = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int.
        cvt(unsafe { libc::ioctl(raw, libc::TUNSETVNETHDRSZ as _, &size as *const libc::c_int) })?;
    }
    Ok(fd)
}

/// `TUNSETOFFLOAD` with `flags` (the argument is the value itself, not a pointer).
fn set_offload(fd: &OwnedFd, flags: libc::c_uint) -> io::Result<()> {
    // SAFETY: TUNSETOFFLOAD takes an integer argument.
    cvt(unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TUNSETOFFLOAD as _,
            flags as libc::c_ulong,
        )
    })
    .map(drop)
}

/// The offload negotiation: `want`, then `want` without UDP segmentation, each only if it asks
/// for a segmentation offload; the first that `set` accepts wins. None: use a plain device.
fn negotiate(
    want: Offloads,
    mut set: impl FnMut(libc::c_uint) -> io::Result<()>,
) -> Option<Offloads> {
    let mut last = None;
    for c in [want, want.without_uso()] {
        if !c.any_gso() || last == Some(c) {
            continue;
        }
        last = Some(c);
        if set(c.tun_flags()).is_ok() {
            return Some(Offloads {
                vnet_hdr: true,
                ..c
            });
        }
    }
    None
}

impl Tun {
    /// Creates (or attaches to) the TUN device `name` in plain mode and sets it up.
    // Only the kernel tests (tests/tun.rs, which include this file) call it.
    #[cfg(test)]
    #[allow(dead_code)]
    pub(crate) fn open(name: &str) -> io::Result<Self> {
        Self::open_with(name, Offloads::NONE)
    }

    /// Creates (or attaches to) the TUN device `name`, asking for the offloads in `want`
    /// (`Offloads::ALL` for everything), and sets it up. Offloads the kernel refuses are left
    /// off, down to a plain device; this is logged once, and [`Tun::offloads`] tells the result.
    pub(crate) fn open_with(name: &str, want: Offloads) -> io::Result<Self> {
        if want.any_gso() {
            match attach(name, true) {
                Ok(fd) => match negotiate(want, |flags| set_offload(&fd, flags)) {
                    Some(got) => {
                        if got == want {
                            tracing::info!(device = name, offloads = %got, "TUN offloads on");
                        } else {
                            tracing::warn!(device = name, offloads = %got, wanted = %want,
                                "the kernel refused some TUN offloads");
                        }
                        return Self::finish(fd, name, got);
                    }
                    None => tracing::warn!(device = name, wanted = %want,
                        "the kernel refused TUN offloads: plain device, one packet per syscall"),
                },
                Err(e) => tracing::warn!(device = name, error = %e,
                    "IFF_VNET_HDR refused: plain device, one packet per syscall"),
            }
        }
        let fd = attach(name, false)?;
        // A persistent device may keep offloads an earlier owner set; without a vnet header
        // they must be off, or the kernel would hand over super-packets as single packets.
        if let Err(e) = set_offload(&fd, 0) {
            tracing::debug!(device = name, error = %e, "clearing TUN offloads failed");
        }
        Self::finish(fd, name, Offloads::NONE)
    }

    fn finish(fd: OwnedFd, name: &str, offloads: Offloads) -> io::Result<Self> {
        let tun = Self {
            fd,
            name: name.to_owned(),
            offloads,
        };
        tun.set_up()?;
        Ok(tun)
    }

    /// Sets IFF_UP on the device through an ordinary socket's SIOCSIFFLAGS.
    fn set_up(&self) -> io::Result<()> {
        let mut req = netio::iface::ifreq(&self.name)?;
        netio::iface::interface_ioctl(libc::SIOCGIFFLAGS as libc::c_ulong, &mut req)?;
        // SAFETY: SIOCGIFFLAGS filled the union's flags member.
        unsafe {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        }
        netio::iface::interface_ioctl(libc::SIOCSIFFLAGS as libc::c_ulong, &mut req)
    }

    /// The device name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The offloads in use (`Offloads::NONE` for a plain device).
    pub(crate) fn offloads(&self) -> Offloads {
        self.offloads
    }

    /// The descriptor, for polling.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// One `read(2)`; Ok(None) if nothing is waiting.
    fn read_raw(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            // SAFETY: reads at most buf.len() bytes into a live buffer.
            let ret = unsafe { libc::read(self.raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if ret >= 0 {
                return Ok(Some(ret as usize));
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(None),
                _ => return Err(err),
            }
        }
    }

    /// Reads one packet without blocking; Ok(None) if none is waiting. Plain devices only (an
    /// offload device returns `Unsupported`: use [`Tun::read_batch`]).
    // Only the kernel tests (tests/tun.rs, which include this file) call it.
    #[cfg(test)]
    #[allow(dead_code)]
    pub(crate) fn read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        if self.offloads.vnet_hdr {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "single-packet read on an offload TUN device",
            ));
        }
        self.read_raw(buf)
    }

    /// One `writev(2)` of the slices as one packet (or vnet frame).
    pub(crate) fn write_vectored(&self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        loop {
            // SAFETY: IoSlice is ABI-compatible with iovec; every slice is live for the call.
            let ret = unsafe {
                libc::writev(
                    self.raw_fd(),
                    iov.as_ptr().cast::<libc::iovec>(),
                    iov.len() as libc::c_int,
                )
            };
            if ret >= 0 {
                return Ok(ret as usize);
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }

    /// Writes one packet (the kernel takes it as received on the device); on an offload
    /// device with an all-zero vnet header.
    // Only the kernel tests (tests/tun.rs, which include this file) call it.
    #[cfg(test)]
    #[allow(dead_code)]
    pub(crate) fn write(&self, packet: &[u8]) -> io::Result<()> {
        let zero = [0u8; VNET_HDR_LEN];
        if self.offloads.vnet_hdr {
            self.write_vectored(&[IoSlice::new(&zero), IoSlice::new(packet)])
        } else {
            self.write_vectored(&[IoSlice::new(packet)])
        }
        .map(drop)
    }

    /// Reads frames into `batch` (emptied first) until the device has nothing more, the batch is
    /// full, or `max_reads` reads were made; super-packets are split into ordinary packets. An
    /// error with nothing read is returned; one after some packets ends the batch.
    pub(crate) fn read_batch(
        &self,
        batch: &mut TunReadBatch,
        max_reads: usize,
    ) -> io::Result<ReadOutcome> {
        let vnet = self.offloads.vnet_hdr;
        batch.begin(vnet);
        let mut out = ReadOutcome::default();
        while out.reads < max_reads {
            let Some(room) = batch.room() else { break };
            match self.read_raw(room) {
                Ok(Some(n)) => {
                    out.reads += 1;
                    if !batch.commit(n, vnet) {
                        break;
                    }
                }
                Ok(None) => {
                    out.would_block = true;
                    break;
                }
                Err(e) if batch.frames.is_empty() && batch.drops.total() == 0 => return Err(e),
                Err(e) => {
                    tracing::debug!(device = %self.name, error = %e, "TUN read failed");
                    break;
                }
            }
        }
        out.frames = batch.frames.len();
        out.packets = batch.packets;
        Ok(out)
    }
}

impl TunWriter {
    /// Queues `pkt`, first flushing to `tun` if the writer is full. Returns whether the packet
    /// was queued (false: not an IP packet size, count it as dropped) and what the flush on the
    /// way wrote (all zero if none was needed).
    pub(crate) fn push_or_flush(&mut self, tun: &Tun, pkt: &[u8]) -> (bool, FlushStats) {
        let mut flushed = FlushStats::default();
        loop {
            match self.push(pkt) {
                Push::Queued => return (true, flushed),
                Push::Rejected => return (false, flushed),
                Push::Full if self.is_empty() => return (false, flushed),
                Push::Full => flushed = self.flush(tun),
            }
        }
    }

    /// Writes everything queued to `tun` (see [`TunWriter::drain`]).
    pub(crate) fn flush(&mut self, tun: &Tun) -> FlushStats {
        let st = self.drain(|iov| tun.write_vectored(iov));
        if let Some(kind) = st.last_error {
            tracing::debug!(device = %tun.name, error = ?kind, failed = st.failed, "TUN write failed");
        }
        st
    }
}

/// What one [`Tun::read_batch`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ReadOutcome {
    /// `read(2)` calls that returned data.
    pub(crate) reads: usize,
    /// Frames in the batch.
    pub(crate) frames: usize,
    /// Packets in the batch (after splitting).
    pub(crate) packets: usize,
    /// The device had nothing more to read: poll before the next call.
    pub(crate) would_block: bool,
}

/// One frame of a [`TunReadBatch`]: `len` bytes at `start` of the batch buffer, packets of
/// `stride` bytes each but the last (`segments` of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TunFrame {
    /// Offset in the batch buffer.
    pub(crate) start: usize,
    /// Bytes of all packets of the frame.
    pub(crate) len: usize,
    /// Bytes of each packet but the last.
    pub(crate) stride: usize,
    /// Number of packets.
    pub(crate) segments: usize,
    /// Whether it came as one GSO super-packet.
    pub(crate) gso: bool,
}

/// Caller-owned buffers for [`Tun::read_batch`], allocated once.
#[derive(Debug)]
pub(crate) struct TunReadBatch {
    buf: Box<[u8]>,
    used: usize,
    frames: Vec<TunFrame>,
    max_frames: usize,
    packets: usize,
    drops: TunDrops,
    /// A raw frame that did not fit the previous batch (`pending_len` bytes, 0: none).
    pending: Box<[u8]>,
    pending_len: usize,
}

/// Bytes one read needs: a vnet header, the largest IP packet, and one more byte to tell a
/// longer one.
const READ_ROOM: usize = VNET_HDR_LEN + MAX_IP_PACKET + 1;

impl TunReadBatch {
    /// A batch of up to `max_frames` reads (at least one) in a `bytes`-byte buffer (at least
    /// room for two reads; a 64 KiB TCP super-packet of 1448-byte segments takes about 67 KiB
    /// once split).
    pub(crate) fn new(bytes: usize, max_frames: usize) -> Self {
        let bytes = Self::bytes_for(bytes);
        let max_frames = max_frames.max(1);
        Self {
            buf: vec![0u8; bytes].into_boxed_slice(),
            used: 0,
            frames: Vec::with_capacity(max_frames),
            max_frames,
            packets: 0,
            drops: TunDrops::default(),
            pending: vec![0u8; READ_ROOM].into_boxed_slice(),
            pending_len: 0,
        }
    }

    /// The buffer size of a batch asked for `bytes` (at least room for two reads; never less
    /// than `bytes`).
    pub(crate) fn bytes_for(bytes: usize) -> usize {
        bytes.max(2 * READ_ROOM)
    }

    /// The frames read.
    pub(crate) fn frames(&self) -> &[TunFrame] {
        &self.frames
    }

    /// Frame `i` and its bytes (packets back to back, `stride` bytes each but the last).
    pub(crate) fn frame_mut(&mut self, i: usize) -> (TunFrame, &mut [u8]) {
        let f = self.frames[i];
        (f, &mut self.buf[f.start..f.start + f.len])
    }

    /// Number of packets in all frames.
    // Only the kernel tests (tests/tun.rs, which include this file) call it.
    #[cfg(test)]
    #[allow(dead_code)]
    pub(crate) fn packet_count(&self) -> usize {
        self.packets
    }

    /// Every packet, in read order.
    // Only the kernel tests (tests/tun.rs, which include this file) call it.
    #[cfg(test)]
    #[allow(dead_code)]
    pub(crate) fn packets(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.frames
            .iter()
            .flat_map(|f| self.buf[f.start..f.start + f.len].chunks(f.stride.max(1)))
    }

    /// Frames dropped while filling this batch, per reason.
    pub(crate) fn drops(&self) -> &TunDrops {
        &self.drops
    }

    /// Empties the batch, then takes in a frame left over from the previous one.
    fn begin(&mut self, vnet: bool) {
        self.used = 0;
        self.frames.clear();
        self.packets = 0;
        self.drops.clear();
        if self.pending_len > 0 {
            let n = std::mem::take(&mut self.pending_len);
            self.buf[..n].copy_from_slice(&self.pending[..n]);
            self.commit(n, vnet);
        }
    }

    /// Room for the next read, or None when the batch is full.
    fn room(&mut self) -> Option<&mut [u8]> {
        if self.frames.len() >= self.max_frames
            || self.pending_len > 0
            || self.buf.len() - self.used < READ_ROOM
        {
            return None;
        }
        Some(&mut self.buf[self.used..self.used + READ_ROOM])
    }

    /// Takes in the `n` bytes just read at the end of the used part; false when the batch
    /// cannot take another read.
    fn commit(&mut self, n: usize, vnet: bool) -> bool {
        let at = self.used;
        if n >= READ_ROOM {
            self.drops.add(TunDrop::Truncated);
            return true;
        }
        let (start, len, vh) = if vnet {
            match VnetHdr::parse(&self.buf[at..at + n]) {
                Some(vh) if n > VNET_HDR_LEN => (at + VNET_HDR_LEN, n - VNET_HDR_LEN, vh),
                _ => {
                    self.drops.add(TunDrop::Short);
                    return true;
                }
            }
        } else if n == 0 {
            self.drops.add(TunDrop::Short);
            return true;
        } else {
            (at, n, VnetHdr::default())
        };
        match split_frame(&mut self.buf, start, len, &vh) {
            Ok(s) => {
                self.frames.push(TunFrame {
                    start,
                    len: s.len,
                    stride: s.stride,
                    segments: s.segments,
                    gso: s.gso,
                });
                self.packets += s.segments;
                self.used = start + s.len;
                true
            }
            Err(SplitFault::Drop(why)) => {
                self.drops.add(why);
                true
            }
            Err(SplitFault::NoRoom { .. }) if at == 0 => {
                self.drops.add(TunDrop::GsoTooLarge);
                true
            }
            Err(SplitFault::NoRoom { .. }) => {
                self.pending[..n].copy_from_slice(&self.buf[at..at + n]);
                self.pending_len = n;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refuse(accepted: &[libc::c_uint]) -> impl FnMut(libc::c_uint) -> io::Result<()> + '_ {
        move |flags| {
            if accepted.contains(&flags) {
                Ok(())
            } else {
                Err(io::Error::from_raw_os_error(libc::EINVAL))
            }
        }
    }

    #[test]
    fn negotiation_falls_back_step_by_step() {
        let all = Offloads::ALL.tun_flags();
        let tcp = Offloads::ALL.without_uso().tun_flags();
        assert_eq!(tcp, libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6);
        assert_eq!(
            negotiate(Offloads::ALL, refuse(&[all, tcp])),
            Some(Offloads::ALL)
        );
        assert_eq!(
            negotiate(Offloads::ALL, refuse(&[tcp])),
            Some(Offloads::ALL.without_uso())
        );
        assert_eq!(negotiate(Offloads::ALL, refuse(&[])), None);
        assert_eq!(negotiate(Offloads::NONE, refuse(&[all, tcp])), None);
        // Asking for TCP only tries once.
        let mut calls = 0;
        let got = negotiate(Offloads::ALL.without_uso(), |_| {
            calls += 1;
            Err(io::Error::from_raw_os_error(libc::EINVAL))
        });
        assert_eq!((got, calls), (None, 1));
    }

    /// Feeds `frames` (bytes as read from the device) to a batch as if read.
    fn feed(batch: &mut TunReadBatch, vnet: bool, frames: &[Vec<u8>]) -> usize {
        batch.begin(vnet);
        let mut taken = 0;
        for f in frames {
            let Some(room) = batch.room() else { break };
            room[..f.len()].copy_from_slice(f);
            taken += 1;
            if !batch.commit(f.len(), vnet) {
                break;
            }
        }
        taken
    }

    fn vnet(vh: VnetHdr, pkt: &[u8]) -> Vec<u8> {
        let mut v = vh.emit().to_vec();
        v.extend_from_slice(pkt);
        v
    }

    /// An IPv4 TCP super-packet of `payload` bytes, as the kernel hands it over.
    fn tcp_super(payload: usize, gso: u16) -> Vec<u8> {
        let len = 40 + payload;
        let mut p = vec![0u8; len];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        p[8] = 64;
        p[9] = 6;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        p[32] = 5 << 4;
        p[33] = 0x18;
        for (i, b) in p[40..].iter_mut().enumerate() {
            *b = i as u8;
        }
        vnet(
            VnetHdr {
                flags: 1,
                gso_type: 1,
                hdr_len: 40,
                gso_size: gso,
                csum_start: 20,
                csum_offset: 16,
            },
            &p,
        )
    }

    #[test]
    fn batch_splits_and_carries_a_super_packet_over() {
        // 160 000 bytes: after the first super-packet (91 000 bytes once split) there is room
        // for a read, but not for the second one's 84 000 bytes; it waits and leads the next
        // batch, which then still has room for another read.
        let mut b = TunReadBatch::new(160_000, 8);
        let first = tcp_super(65_000, 100);
        let second = tcp_super(60_000, 100);
        let small = vnet(VnetHdr::default(), &[0x45; 20]);
        assert_eq!(feed(&mut b, true, &[first, second, small.clone()]), 2);
        assert_eq!(b.frames().len(), 1);
        assert_eq!((b.packet_count(), b.packets().count()), (650, 650));
        assert!(b.packets().all(|p| p.len() == 140));
        assert!(b.frames()[0].gso);
        assert!(b.room().is_none(), "a pending frame ends the batch");
        assert_eq!(feed(&mut b, true, &[small]), 1);
        assert_eq!(
            b.packet_count(),
            601,
            "the pending super-packet comes first"
        );
        assert_eq!(b.frames()[0].segments, 600);
        assert_eq!(b.frames()[1].len, 20);
        assert_eq!(b.drops().total(), 0);
    }

    #[test]
    fn batch_counts_bad_frames() {
        let mut b = TunReadBatch::new(0, 8);
        let mut bad = tcp_super(3000, 1000);
        bad[VNET_HDR_LEN + 9] = 17; // TCP GSO type, UDP protocol
        let frames = [vec![1, 2, 3], VnetHdr::default().emit().to_vec(), bad];
        assert_eq!(feed(&mut b, true, &frames), 3);
        assert!(b.frames().is_empty());
        assert_eq!(b.drops().get(TunDrop::Short), 2);
        assert_eq!(b.drops().get(TunDrop::GsoMalformed), 1);
        // Plain mode: every read is one packet, an empty read is dropped.
        assert_eq!(feed(&mut b, false, &[vec![], vec![0x45; 30]]), 2);
        assert_eq!((b.packet_count(), b.drops().get(TunDrop::Short)), (1, 1));
        let (f, bytes) = b.frame_mut(0);
        assert_eq!((f.len, f.stride, f.segments, bytes.len()), (30, 30, 1, 30));
    }

    #[test]
    fn batch_drops_a_super_packet_too_large_for_an_empty_batch() {
        let mut b = TunReadBatch::new(0, 8);
        // 1-byte segments: 60 000 copies of a 40-byte header.
        let tiny = tcp_super(60_000, 1);
        assert_eq!(feed(&mut b, true, &[tiny]), 1);
        assert_eq!(b.drops().get(TunDrop::GsoTooLarge), 1);
        assert!(b.frames().is_empty());
    }
}
