//! Inbound ESP accepted in arrival order.
//!
//! Workers decrypt the packets of one SA on several cores at once, so a worker can verify a
//! packet of a later batch before another worker has verified the packets of an earlier one.
//! If each worker updated the replay window as it went, the window would move in processing
//! order: after a burst of losses longer than the window between two batches in flight, the
//! earlier batch's packets would be refused as too old although they arrived in order. So the
//! workers only verify and decrypt ([`crate::sa::SaPair::open_unaccepted`]) and record an
//! [`AcceptJob`](crate::batch::AcceptJob) for every authentic packet in the send batch that carries what the packet
//! produced. The lane's ordered sender, which takes batches in ticket (arrival) order, accepts
//! them ([`accept_batch`]) right before sending; the output of a refused packet is left out.
//! The window therefore decides exactly as it would on one core, whatever the number of
//! workers, the way Linux's pcrypt serialises `xfrm_input`'s replay advance. It costs one
//! window update per packet on the sending core, which is also where it would otherwise run.
//!
//! The NAT rebinding check (RFC 7296 §2.23) runs here too: only a packet that the window
//! accepted as the newest of its SA may move the SA to its source address.

use crate::batch::TxBatch;
use crate::shared::Shared;
use crate::stats::{DropCounts, DropReason};
use crate::tables::Child;
use datapath::ToControl;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use wire::EspSpi;

/// Accepts the packets of `tx` in order. The output ranges of refused packets are appended
/// to `dead` (in ascending order) for the sender to leave out; drops are counted in `drops`.
pub(crate) fn accept_batch(
    sh: &Shared,
    tx: &TxBatch,
    dead: &mut Vec<Range<usize>>,
    drops: &mut DropCounts,
) {
    let Some(tables) = tx.tables.as_deref() else {
        // Jobs are recorded only with the batch's tables set.
        if !tx.accepts.is_empty() {
            tracing::error!(
                packets = tx.accepts.len(),
                "ESP packets to accept without SA tables"
            );
            drops.add_n(DropReason::EspReplay, tx.accepts.len() as u64);
            dead.push(0..tx.data().len());
        }
        return;
    };
    let mut last: Option<(EspSpi, &Arc<Child>)> = None;
    for job in &tx.accepts {
        let child = match last {
            Some((spi, c)) if spi == job.spi => c,
            _ => match tables.by_spi.get(&job.spi) {
                Some(c) => {
                    last = Some((job.spi, c));
                    c
                }
                None => {
                    // Cannot happen: the tables are those the packet was opened with.
                    tracing::error!(spi = %job.spi, "opened ESP packet lost its SA");
                    drops.add(DropReason::EspReplay);
                    dead.push(job.output.clone());
                    continue;
                }
            },
        };
        match child.state.sa.accept(job.packet) {
            Ok(behind) => {
                if let Some(reason) = job.fail {
                    drops.add(reason);
                }
                rebind(sh, child, behind, job.spi, (job.local, job.src));
            }
            Err(reason) => {
                drops.add(reason);
                if !job.output.is_empty() {
                    dead.push(job.output.clone());
                }
            }
        }
    }
}

/// NAT rebinding (RFC 7296 §2.23, RFC 3948) after the window accepted a packet `behind` the
/// newest: authentic ESP that is the newest of its SA (`behind == 0`, so a packet reordered
/// from before a move does not move the SA back) from a new address. Every SA here is
/// UDP-encapsulated, which the engine negotiates only with a NAT detected (or faked,
/// `force_encap`), so the SAs of the IKE SA follow at once: the answer to this very packet
/// already goes to the new address. The control plane moves the IKE SA too; if it cannot be
/// told now, nothing moves and a later packet tries again.
pub(crate) fn rebind(
    sh: &Shared,
    child: &Child,
    behind: u64,
    spi: EspSpi,
    (local, src): (SocketAddr, SocketAddr),
) {
    if behind != 0 || src == child.remote || !child.state.take_move_report(src) {
        return;
    }
    let msg = ToControl::PeerAddressSeen {
        inbound_spi: spi,
        local,
        remote: src,
    };
    if sh.tell_control(msg) {
        sh.update_peer(child.tunnel, child.ike, local, src);
    } else {
        child.state.retry_move_report();
    }
}

/// True if the datagram starting at `offset` lies in one of the `dead` ranges (ascending).
pub(crate) fn is_dead(dead: &[Range<usize>], offset: usize) -> bool {
    let i = dead.partition_point(|r| r.end <= offset);
    dead.get(i).is_some_and(|r| r.start <= offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_ranges_are_found_by_offset() {
        let dead = [10..20, 20..30, 50..60];
        for (offset, expected) in [
            (0, false),
            (9, false),
            (10, true),
            (25, true),
            (30, false),
            (49, false),
            (59, true),
            (60, false),
        ] {
            assert_eq!(is_dead(&dead, offset), expected, "{offset}");
        }
        assert!(!is_dead(&[], 0));
    }
}
