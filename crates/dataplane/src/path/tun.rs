//! The TUN side (standalone gateway): packets the kernel routes into the TUN device are sealed
//! into the CHILD_SA among the TUN tunnels whose selectors cover them; decrypted packets are
//! written to the device for the kernel to forward (it decrements the TTL itself).

use super::seal;
use crate::inner;
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
    seal::seal(o, sh, child, &pkt[..parsed.len]);
}

/// A decrypted packet for the TUN device.
pub(crate) fn deliver(o: &mut Out, sh: &Shared, pkt: &[u8]) {
    let written = match &sh.tun {
        Some(tun) => tun
            .write(pkt)
            .map_err(|e| tracing::debug!(device = tun.name(), error = %e, "TUN write failed"))
            .is_ok(),
        None => false,
    };
    if !written {
        o.drop_packet(DropReason::TunWrite);
    }
}
