//! Outbound ESP (RFC 4303 §3.3) in UDP (RFC 3948 §2.1): the inner packet is copied behind
//! room for the ESP header and IV in the send batch and sealed there in place, so consecutive
//! packets to the same peer leave as one GSO train. Near sequence number exhaustion the
//! control plane is asked once to rekey (RFC 4303 §3.3.3).

use crate::api::ToControl;
use crate::shared::{Out, Shared};
use crate::stats::DropReason;
use crate::tables::Child;

/// The largest UDP payload over IPv4 (65535 - 20 - 8); IPv6 allows 20 more, we keep one limit.
const MAX_UDP_PAYLOAD: usize = 65507;

/// Seals `pkt` (a whole IPv4 or IPv6 packet) with the CHILD_SA's outbound SA and queues it to
/// the peer.
pub(crate) fn seal(o: &mut Out, sh: &Shared, child: &Child, pkt: &[u8]) {
    let sa = &child.state.sa;
    let header = sa.header_len();
    let max = header + pkt.len() + sa.max_trailer_len();
    if max > MAX_UDP_PAYLOAD {
        o.drop_packet(DropReason::TooBig);
        return;
    }
    let Some(room) = o.room(sh, max) else { return };
    room[header..header + pkt.len()].copy_from_slice(pkt);
    match sa.seal(&mut room[..max], pkt.len()) {
        Ok(len) => o.tx.commit(child.sock, child.remote, len),
        Err(e) => {
            tracing::debug!(tunnel = child.tunnel.0, spi = %child.outbound_spi, local = %child.local, error = %e, "cannot seal");
            o.drop_packet(DropReason::EspSeal);
        }
    }
    if sa.rekey_due() && child.state.take_rekey_request() {
        tracing::info!(tunnel = child.tunnel.0, spi = %child.inbound_spi, "outbound sequence numbers nearly exhausted; asking for a rekey");
        if !sh.tell_control(ToControl::RekeyNeeded(child.inbound_spi)) {
            // The control queue is full: ask again with a later packet.
            child.state.retry_rekey_request();
            tracing::warn!(tunnel = child.tunnel.0, spi = %child.inbound_spi, "control plane did not take the rekey request");
        }
    }
}
