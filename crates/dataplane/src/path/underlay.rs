//! Datagrams on the IKE port and the NAT-T port. On the NAT-T port (RFC 3948 §2): a zero
//! first word is the non-ESP marker before an IKE message, a single 0xFF is a NAT keepalive
//! (dropped), anything else is ESP. ESP is looked up by SPI, opened in place (anti-replay and
//! ICV checks are the `esp` crate's), checked against the CHILD_SA's selectors (RFC 4301 §5.2:
//! a decrypted packet outside them MUST be discarded) and handed to its inside interface.

use super::{tun, vxlan};
use crate::api::{IkeDatagram, Inside, ToControl};
use crate::inner;
use crate::shared::{Out, Shared};
use crate::stats::DropReason;
use crate::tables::Tables;
use std::net::SocketAddr;
use std::time::Instant;
use wire::esp::{UdpEncap, NON_ESP_MARKER_LEN};
use wire::EspSpi;

/// A datagram received on the NAT-T socket `local`.
pub(crate) fn natt(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    now: Instant,
    local: SocketAddr,
    src: SocketAddr,
    data: &mut [u8],
) {
    match UdpEncap::classify(data) {
        Err(_) => o.drop_packet(DropReason::MalformedUdp),
        Ok(UdpEncap::NatKeepalive) => o.drop_packet(DropReason::NattKeepalive),
        Ok(UdpEncap::Ike) => ike(o, sh, local, src, &data[NON_ESP_MARKER_LEN..]),
        Ok(UdpEncap::Esp(spi)) => esp(o, sh, t, now, (local, src), spi, data),
    }
}

/// An IKE message (marker removed) for the control plane.
pub(crate) fn ike(o: &mut Out, sh: &Shared, local: SocketAddr, remote: SocketAddr, msg: &[u8]) {
    if !sh.tell_control(ToControl::Ike(IkeDatagram {
        local,
        remote,
        data: msg.to_vec(),
    })) {
        o.drop_packet(DropReason::IkeQueue);
    }
}

/// An ESP packet (starting at the SPI) that arrived on `addrs.0` from `addrs.1`.
fn esp(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    now: Instant,
    (local, src): (SocketAddr, SocketAddr),
    spi: EspSpi,
    data: &mut [u8],
) {
    let Some(child) = t.by_spi.get(&spi) else {
        o.drop_packet(DropReason::EspUnknownSpi);
        return;
    };
    let counters = &child.state.counters;
    let (range, version, newest) = match child.state.sa.open(data) {
        Ok(opened) => opened,
        Err(reason) => return o.drop_packet(reason),
    };
    // NAT rebinding (RFC 7296 §2.23, RFC 3948): authentic ESP from a new address. Only the
    // newest packet counts, so one reordered from before the move does not move the SA back.
    // Every SA here is UDP-encapsulated, which the engine negotiates only with a NAT detected
    // (or faked, `force_encap`), so the SAs of the IKE SA follow at once: the answer to this
    // very packet already goes to the new address. The control plane moves the IKE SA too;
    // if it cannot be told now, nothing moves and a later packet tries again.
    if src != child.remote && newest && child.state.take_move_report(src) {
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
    let Some(pkt) = data.get_mut(range) else {
        return o.drop_packet(DropReason::EspMalformed);
    };
    let Some(parsed) = inner::parse(pkt).filter(|p| p.version == version) else {
        o.drop_packet(DropReason::InnerMalformed);
        counters.count_drop_in();
        return;
    };
    // TFC padding (RFC 4303 §2.4) may follow the inner packet: its own length counts.
    let pkt = &mut pkt[..parsed.len];
    if !child.admits_inbound(&parsed.flow) {
        o.drop_packet(DropReason::EspPolicy);
        counters.count_drop_in();
        return;
    }
    match child.inside {
        Inside::Vnet(v) => vxlan::deliver(o, sh, now, v, pkt, &parsed),
        Inside::Tun => tun::deliver(o, sh, pkt),
    }
}
