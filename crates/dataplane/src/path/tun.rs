//! The TUN side (standalone gateway): packets the kernel routes into the TUN device are sealed
//! into the CHILD_SA among the TUN tunnels whose selectors cover them; decrypted packets are
//! written to the device for the kernel to forward (it decrements the TTL itself).

use super::seal;
use crate::inner;
use crate::out::{TUN_DST, TUN_SOCK};
use crate::shared::{Out, Shared};
use crate::stats::DropReason;
use crate::tables::Tables;

/// A packet read from the TUN device.
pub(crate) fn outbound(o: &mut Out, sh: &Shared, t: &Tables, pkt: &[u8]) {
    let Some(parsed) = inner::parse(pkt) else {
        return o.drop_packet(DropReason::TunMalformed);
    };
    let Some(child) = Tables::select(&t.tun_out, &parsed.flow) else {
        return o.drop_packet(DropReason::TunNoTunnel);
    };
    seal::queue(o, sh, child, &pkt[..parsed.len]);
}

/// A decrypted packet for the TUN device: queued in the send batch, so it is written in the
/// lane's order like datagrams are sent.
pub(crate) fn deliver(o: &mut Out, sh: &Shared, pkt: &[u8]) {
    if sh.tun.is_none() {
        return o.drop_packet(DropReason::TunWrite);
    }
    let Some(room) = o.room(sh, pkt.len()) else {
        return;
    };
    room[..pkt.len()].copy_from_slice(pkt);
    o.tx.commit(TUN_SOCK, TUN_DST, pkt.len());
}
