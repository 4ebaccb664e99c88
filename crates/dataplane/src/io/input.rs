//! The input stage: fills a worker's receive batch from one lane's input. One `recvmmsg` per
//! batch on a socket (UDP GRO trains stay whole here: the classify stage walks their
//! segments), or one batch of frames read from the TUN device (GSO super-packets split into
//! IP packets, see `sys::tun_offload`), or the frames an attachment interface's AF_PACKET ring
//! holds, copied out with their outer VLAN tag written back (`netio::packet`): no system call at
//! all for those.

use crate::lane::LaneKind;
use crate::shared::{rx_slots, Shared, MAX_SEGMENTS_PER_SLOT};
use crate::stats::{DropCounts, DropReason};
use crate::sys::tun::TunReadBatch;
use crate::sys::tun_offload::TunDrop;
use netio::packet::FrameBatch;
use netio::{RecvBatch, RX_SLOT};

/// A worker's receive batch: datagrams with their metadata (source, GRO segment size,
/// truncation), or for the TUN lane IP packets read from the device.
pub(crate) struct RxBatch {
    /// Received datagrams (and the `recvmmsg` scratch).
    pub(crate) datagrams: RecvBatch,
    /// Frames read from the TUN device (if there is one), GSO super-packets split.
    pub(crate) tun: Option<TunReadBatch>,
    /// Frames from an attachment interface's ring (if there is one).
    pub(crate) frames: Option<FrameBatch>,
}

impl RxBatch {
    /// Receive batches sized for `sh`'s configured batch.
    pub(crate) fn new(sh: &Shared) -> Self {
        let slots = rx_slots(sh.cfg.batch);
        Self {
            datagrams: RecvBatch::new(slots),
            tun: sh
                .io
                .tun
                .as_ref()
                .map(|_| TunReadBatch::new(slots * RX_SLOT, slots)),
            frames: (!sh.io.packet.is_empty())
                .then(|| FrameBatch::new(slots * MAX_SEGMENTS_PER_SLOT, slots * RX_SLOT)),
        }
    }
}

/// The most bytes of packets one receive batch of a lane can deliver for a configured
/// `batch`: a datagram batch, or a TUN read batch (which holds at least two of the largest
/// reads: a split 64 KiB super-packet takes about 67 KiB).
pub(crate) fn largest_batch(batch: usize) -> usize {
    TunReadBatch::bytes_for(rx_slots(batch) * RX_SLOT)
}

/// Fills `rx` from the lane's input; returns the datagrams (or TUN frames) read and whether
/// more is probably waiting. Frames the TUN device delivered unusable are counted in `drops`.
pub(crate) fn receive(
    sh: &Shared,
    rx: &mut RxBatch,
    kind: LaneKind,
    drops: &mut DropCounts,
) -> (usize, bool) {
    let io = &sh.io;
    let sock = match kind {
        LaneKind::Ike { listen } => io.listen[listen].ike,
        LaneKind::Natt { listen } => io.listen[listen].natt,
        LaneKind::Vtep { vtep } => io.vteps[vtep].recv,
        LaneKind::Relay => match io.relay_sock {
            Some(s) => s,
            None => return (0, false),
        },
        LaneKind::Attach { iface } => {
            let (Some(sock), Some(fb)) = (io.packet.get(iface), rx.frames.as_mut()) else {
                return (0, false);
            };
            let got = sock.read_batch(fb);
            drops.add_n(DropReason::AttachRingFull, sock.take_losses());
            drops.add_n(DropReason::TooBig, fb.too_big);
            drops.add_n(DropReason::AttachRingMalformed, fb.bad_headers);
            return got;
        }
        LaneKind::Tun => {
            let (Some(dev), Some(rb)) = (&io.tun, rx.tun.as_mut()) else {
                return (0, false);
            };
            return match dev.read_batch(rb, rb.frames().len().max(rx.datagrams.capacity())) {
                Ok(r) => {
                    for (why, n) in rb.drops().iter() {
                        drops.add_n(tun_drop(why), n);
                    }
                    (r.frames, !r.would_block)
                }
                Err(e) => {
                    tracing::debug!(device = dev.name(), error = %e, "TUN read failed");
                    (0, false)
                }
            };
        }
    };
    match io.socks[sock].recv_batch(&mut rx.datagrams) {
        Ok(n) => (n, n == rx.datagrams.capacity()),
        Err(e) => {
            tracing::debug!(lane = ?kind, error = %e, "receive failed");
            (0, false)
        }
    }
}

fn tun_drop(why: TunDrop) -> DropReason {
    match why {
        TunDrop::Short => DropReason::TunShortRead,
        TunDrop::Truncated => DropReason::TunReadTruncated,
        TunDrop::BadHeader => DropReason::TunVnetBadHeader,
        TunDrop::GsoMalformed => DropReason::TunGsoMalformed,
        TunDrop::GsoTooLarge => DropReason::TunGsoTooLarge,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_batch_holds_a_split_super_packet_even_at_batch_one() {
        // A 64 KiB TCP super-packet of 1448-byte segments is about 67 KiB once split.
        for batch in [1, 2, 32, 64, 1000] {
            let n = largest_batch(batch);
            assert!(n >= 67 * 1024, "batch {batch}: {n}");
            assert!(n >= rx_slots(batch) * RX_SLOT, "batch {batch}: {n}");
        }
    }
}
