//! Batched UDP sockets on Linux (over `libc`), shared by the data plane, the steer node and the
//! benchmark's load generator.
//!
//! - [`UdpSocket`]: a UDP socket opened with [`UdpSocket::bind`] (IPV6_V6ONLY on IPv6, local
//!   fragmentation allowed, large buffers) or taken over with [`UdpSocket::from_std`], with
//!   the offloads of its [`SocketOptions`] that the kernel grants: UDP GRO on receive, UDP GSO
//!   on send, kernel receive timestamps and the receive queue's drop counter. A refused GRO or
//!   GSO is logged once per process and the socket works datagram by datagram.
//! - Receiving: [`UdpSocket::recv_batch`] fills a [`RecvBatch`] with one `recvmmsg` call that
//!   never blocks. Each slot holds one datagram or one GRO train of equal-size segments, with
//!   its [`RecvMeta`] (sender, segment size, truncation, timestamp).
//! - Sending: [`UdpSocket::send_batch`] hands [`OutMsg`]s (a datagram, or a GSO train of
//!   equal-size datagrams to one destination) to the kernel with as few `sendmmsg` calls as
//!   the batch needs, one `UDP_SEGMENT` control message per train. What happens when the
//!   socket buffer is full is the socket's [`SendMode`]. A train the kernel refuses (GSO
//!   unsupported by the device, segments above the path MTU) is resent datagram by datagram.
//! - Waiting: a [`Poller`] waits until some descriptors are readable or a shared [`Waker`]
//!   (an `eventfd`, readable for good once woken) signals shutdown.
//! - Frames: [`packet::PacketSocket`] is an AF_PACKET socket on a customer-facing interface,
//!   frames in through a TPACKET_V3 ring into a [`packet::FrameBatch`] (outer VLAN tag written
//!   back), frames out through a transmit ring (`PACKET_TX_RING`, one `send` per batch), or
//!   with `sendmmsg` where the kernel refuses the ring.
//! - AF_XDP: [`xdp::XdpSteering`] loads an XDP program that steers the datagrams to given UDP
//!   addresses into AF_XDP sockets ([`xdp::Xsk`]), one per receive queue, whose frames are read
//!   from shared memory without a system call per batch.
//! - Interfaces: [`iface::ifreq`] and [`iface::interface_ioctl`] (netdevice(7) requests).
//!
//! Scratch space ([`RecvBatch`], [`SendScratch`]) is allocated once per thread; receiving and
//! sending a batch allocate nothing and copy no packet bytes.
//!
//! ```
//! use protego_netio::{OutMsg, RecvBatch, SendScratch, SocketOptions, UdpSocket};
//! # fn main() -> std::io::Result<()> {
//! let opts = SocketOptions::default();
//! let rx = UdpSocket::bind("127.0.0.1:0".parse().expect("address"), &opts)?;
//! let tx = UdpSocket::bind("127.0.0.1:0".parse().expect("address"), &opts)?;
//! let payload = [7u8; 300];
//! // Three 100-byte datagrams: one GSO train where the kernel supports it.
//! let report = tx.send_batch(
//!     [OutMsg::train(rx.local_addr(), &payload, 100)],
//!     &mut SendScratch::default(),
//! );
//! assert_eq!(report.sent, 3);
//! // Receives never block: look again until the datagrams are in (with GRO, as one train).
//! let mut batch = RecvBatch::new(8);
//! let mut got = 0;
//! for _ in 0..1000 {
//!     rx.recv_batch(&mut batch)?;
//!     for (meta, data) in batch.iter() {
//!         got += data.chunks(meta.seg).count();
//!     }
//!     if got == 3 {
//!         break;
//!     }
//!     std::thread::sleep(std::time::Duration::from_millis(1));
//! }
//! assert_eq!(got, 3);
//! # Ok(()) }
//! ```

mod addr;
pub mod bpf;
pub mod iface;
pub mod packet;
mod poll;
mod recv;
mod send;
mod socket;
#[cfg(test)]
mod testutil;
pub mod xdp;

pub use poll::{Poller, Ready, Waker};
pub use recv::{RecvBatch, RecvMeta, MAX_TRAIN, RX_SLOT};
pub use send::{OutMsg, SendReport, SendScratch};
pub use socket::{SendMode, SocketOptions, UdpSocket};

/// Most messages one `recvmmsg` or `sendmmsg` call takes (the kernel's `UIO_MAXIOV`): a
/// [`RecvBatch`] has at most this many slots, and larger send batches take several calls.
pub const MAX_BATCH: usize = 1024;

/// Turns the return value of a libc call that reports errors as -1 into an `io::Result`,
/// reading `errno` on -1.
pub fn cvt(ret: libc::c_int) -> std::io::Result<libc::c_int> {
    if ret == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cvt_reads_errno_only_on_minus_one() {
        assert_eq!(cvt(5).expect("ok"), 5);
        // SAFETY: closing an invalid descriptor only fails with EBADF.
        let err = cvt(unsafe { libc::close(-1) }).expect_err("EBADF");
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
    }
}
