//! The load generator's AF_PACKET sockets on the attachment's link (the CE side): frames are
//! written whole, VLAN tags included, with `sendmmsg` past the queueing discipline
//! (`PACKET_QDISC_BYPASS`), as a customer's edge router's NIC would put them on the wire; and
//! read with `recvmmsg` and kernel receive timestamps (`SO_TIMESTAMPNS`, `CLOCK_REALTIME`).
//! The kernel here has no 802.1Q module, so no VLAN device can do the tagging.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

/// Frames per `sendmmsg` / `recvmmsg` call.
pub(crate) const BATCH: usize = 64;
/// Receive buffer per frame.
const FRAME_BUF: usize = 2048;

/// A packet socket bound to one interface of a namespace.
pub(crate) struct PacketSocket {
    fd: OwnedFd,
}

/// What a socket is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Sends only (bound with protocol 0: the kernel queues nothing to it).
    Send,
    /// Receives every frame of the interface but its own sends; never blocks.
    Receive,
}

impl PacketSocket {
    /// Opens a socket on `ifname` inside the namespace `netns` (its name under `/run/netns`).
    pub(crate) fn open(netns: &str, ifname: &str, role: Role) -> io::Result<PacketSocket> {
        let path = Path::new("/run/netns").join(netns);
        let file = File::open(&path)?;
        let ifname = std::ffi::CString::new(ifname)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in interface name"))?;
        // setns(2) changes the calling thread's namespace only: a thread of its own.
        let worker = std::thread::spawn(move || -> io::Result<PacketSocket> {
            // SAFETY: setns only reads the descriptor, which `file` keeps open.
            netio::cvt(unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) })?;
            Self::open_here(&ifname, role)
        });
        worker
            .join()
            .map_err(|_| io::Error::other("the namespace thread panicked"))?
    }

    fn open_here(ifname: &std::ffi::CStr, role: Role) -> io::Result<PacketSocket> {
        let name = ifname
            .to_str()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name"))?;
        let index = netio::packet::interface_index(name)?;
        let fd = match role {
            Role::Send => netio::packet::open_raw(
                index,
                0,
                false,
                &[
                    (libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, 1),
                    (libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 16 << 20),
                ],
            )?,
            Role::Receive => netio::packet::open_raw(
                index,
                libc::ETH_P_ALL as u16,
                true,
                &[
                    (libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1),
                    (libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 256 << 20),
                    (libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1),
                ],
            )?,
        };
        Ok(PacketSocket { fd })
    }

    /// Sends `frames` (at most [`BATCH`]) with one `sendmmsg`, blocking while the socket's
    /// buffer is full; returns how many the kernel took (0 on an error).
    pub(crate) fn send(&self, frames: &[&[u8]]) -> usize {
        let frames = &frames[..frames.len().min(BATCH)];
        let mut iov: Vec<libc::iovec> = frames
            .iter()
            .map(|f| libc::iovec {
                iov_base: f.as_ptr() as *mut libc::c_void,
                iov_len: f.len(),
            })
            .collect();
        // SAFETY: mmsghdr is plain data.
        let mut msgs: Vec<libc::mmsghdr> = (0..frames.len())
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
        }
        let mut done = 0;
        while done < msgs.len() {
            // SAFETY: every header points at a live iovec over a live frame; the kernel only
            // reads them.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    msgs[done..].as_mut_ptr(),
                    (msgs.len() - done) as libc::c_uint,
                    0,
                )
            };
            if r <= 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                break;
            }
            done += r as usize;
        }
        done
    }

    /// Frames the kernel dropped for want of buffer space since the last call
    /// (`PACKET_STATISTICS`, which reading resets).
    pub(crate) fn take_drops(&self) -> u64 {
        // SAFETY: tpacket_stats is plain data.
        let mut st: libc::tpacket_stats = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: `st` is live and `len` its size; the kernel writes at most that.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        };
        if r < 0 {
            0
        } else {
            u64::from(st.tp_drops)
        }
    }

    /// Reads what is queued (at most [`BATCH`] frames) into `batch` without blocking;
    /// returns the number of frames.
    pub(crate) fn recv(&self, batch: &mut RecvFrames) -> usize {
        batch.len = 0;
        let n = BATCH;
        for i in 0..n {
            batch.iov[i] = libc::iovec {
                iov_base: batch.data[i * FRAME_BUF..].as_mut_ptr().cast(),
                iov_len: FRAME_BUF,
            };
            // SAFETY: mmsghdr is plain data.
            batch.msgs[i] = unsafe { std::mem::zeroed() };
            let h = &mut batch.msgs[i].msg_hdr;
            h.msg_iov = &mut batch.iov[i];
            h.msg_iovlen = 1;
            h.msg_control = batch.cmsg[i].as_mut_ptr().cast();
            h.msg_controllen = std::mem::size_of_val(&batch.cmsg[i]);
        }
        // SAFETY: every header points at live buffers of the sizes given, owned by `batch`.
        let r = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                batch.msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r <= 0 {
            return 0;
        }
        batch.len = r as usize;
        batch.len
    }
}

/// Receive buffers for [`PacketSocket::recv`].
pub(crate) struct RecvFrames {
    data: Vec<u8>,
    iov: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
    cmsg: Vec<[u64; 8]>,
    len: usize,
}

// SAFETY: the raw pointers inside are rebuilt before every use and only point into `data`,
// `iov` and `cmsg`, which move with the value.
unsafe impl Send for RecvFrames {}

impl Default for RecvFrames {
    fn default() -> Self {
        RecvFrames {
            data: vec![0; BATCH * FRAME_BUF],
            iov: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                BATCH
            ],
            // SAFETY: mmsghdr is plain data.
            msgs: (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect(),
            cmsg: vec![[0; 8]; BATCH],
            len: 0,
        }
    }
}

impl RecvFrames {
    /// The frames of the last receive with their kernel receive time (`CLOCK_REALTIME` ns, if
    /// the kernel gave one).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], Option<u64>)> + '_ {
        (0..self.len).map(move |i| {
            let m = &self.msgs[i];
            let n = (m.msg_len as usize).min(FRAME_BUF);
            let frame = &self.data[i * FRAME_BUF..i * FRAME_BUF + n];
            (frame, stamp(&m.msg_hdr))
        })
    }
}

/// The `SCM_TIMESTAMPNS` of a received message, in nanoseconds.
fn stamp(h: &libc::msghdr) -> Option<u64> {
    // SAFETY: walking the control messages the kernel wrote into the header's buffer, whose
    // length it set.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                return Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}
