//! The load generator's UDP sockets, over `netio`: sends block until the socket buffer has
//! room (the buffer paces the sender) and carry the pool's trains with UDP GSO; receives never
//! block and use UDP GRO, kernel receive timestamps (`SO_TIMESTAMPNS`, `CLOCK_REALTIME`) and
//! the socket's overflow counter (`SO_RXQ_OVFL`). When the kernel refuses GSO the socket falls
//! back to one message per packet.

use std::io;
use std::mem::zeroed;

use netio::{OutMsg, SendMode, SocketOptions};

pub(crate) use netio::{RecvBatch, SendScratch, UdpSocket as Socket};

use crate::pool::{Pool, Train};

/// Takes over a socket bound in its namespace (with `Netns::udp_socket`): buffers of `buffer`
/// bytes each way (`SO_RCVBUFFORCE`/`SO_SNDBUFFORCE`, root only, else the capped variants),
/// GSO, and for a receiving socket (`rx`) GRO, kernel timestamps and the overflow counter, as
/// far as the kernel allows.
pub(crate) fn wrap(sock: std::net::UdpSocket, buffer: usize, rx: bool) -> io::Result<Socket> {
    let opts = SocketOptions {
        recv_buffer: buffer,
        send_buffer: buffer,
        gro: rx,
        gso: true,
        timestamps: rx,
        queue_drops: rx,
        send_mode: SendMode::Blocking,
    };
    Socket::from_std(sock, &opts)
}

/// Sends `trains` of `pool` from `sock`, GSO trains where possible. Returns the number of
/// packets the kernel took; packets refused with an error are counted as not sent.
pub(crate) fn send_trains(
    sock: &Socket,
    scratch: &mut SendScratch,
    pool: &Pool,
    trains: &[Train],
) -> u64 {
    let msgs = trains
        .iter()
        .map(|t| OutMsg::train(t.dst, pool.bytes(t), t.seg));
    sock.send_batch(msgs, scratch).sent
}

/// `CLOCK_REALTIME` now, in nanoseconds (the clock of kernel receive timestamps).
pub(crate) fn realtime_ns() -> u64 {
    // SAFETY: all-zero is a valid timespec; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { zeroed() };
    // SAFETY: ts is a live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};

    #[test]
    fn pool_trains_arrive_whole_with_timestamps() {
        let bind = || std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let rx = wrap(bind(), 1 << 20, true).expect("rx socket");
        let tx = wrap(bind(), 1 << 20, false).expect("tx socket");
        assert!(rx.gro() && rx.timestamps() && tx.gso());
        let mut pool = Pool::with_budget(1 << 20);
        let dst: SocketAddr = rx.local_addr();
        let n = pool
            .build::<()>(30, 300, 64, |i, slot| {
                let len = if i < 20 { 200 } else { 100 };
                slot[..len].fill(i as u8);
                Ok(crate::pool::Built { len, dst })
            })
            .expect("pool");
        assert_eq!(n, 30);
        let before = realtime_ns();
        let sent = send_trains(&tx, &mut SendScratch::default(), &pool, pool.trains());
        assert_eq!(sent, 30);
        let mut batch = RecvBatch::new(16);
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < 30 && Instant::now() < deadline {
            rx.recv_batch(&mut batch).expect("recv");
            for (meta, data) in batch.iter() {
                assert!(meta.stamp_ns.is_some_and(|t| t >= before));
                got.extend(data.chunks(meta.seg).map(|d| (d.len(), d[0])));
            }
        }
        let want: Vec<_> = (0..30u8)
            .map(|i| (if i < 20 { 200 } else { 100 }, i))
            .collect();
        assert_eq!(got, want);
    }
}
