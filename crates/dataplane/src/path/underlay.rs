//! Datagrams on the IKE port and the NAT-T port. On the NAT-T port (RFC 3948 §2): a zero
//! first word is the non-ESP marker before an IKE message, a single 0xFF is a NAT keepalive
//! (dropped), anything else is ESP. ESP is looked up by SPI, verified and decrypted in place
//! (the `esp` crate's checks), checked against the CHILD_SA's selectors (RFC 4301 §5.2: a
//! decrypted packet outside them MUST be discarded) and handed to its inside interface; the
//! replay window accepts it in arrival order before its output leaves ([`crate::accept`]).

use super::{tun, vxlan};
use crate::accept::AcceptJob;
use crate::api::{IkeDatagram, Inside, ToControl};
use crate::inner;
use crate::shared::{Out, Shared};
use crate::stats::DropReason;
use crate::tables::{Child, Tables};
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Instant;
use wire::esp::{UdpEncap, NON_ESP_MARKER_LEN};
use wire::ip::IpVersion;
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

/// An ESP packet (starting at the SPI) that arrived on `addrs.0` from `addrs.1` (in relay
/// mode: the relayed datagram's inner destination and source): verified and decrypted here,
/// delivered, and accepted by the replay window in arrival order when its batch is sent (see
/// [`crate::accept`]).
pub(crate) fn esp(
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
    let (packet, opened) = match child.state.sa.open_unaccepted(data) {
        Ok(opened) => opened,
        Err(reason) => return o.drop_packet(reason),
    };
    let mark = o.mark();
    let mut accepted_early = false;
    let fail = match opened {
        Ok(inner) => {
            let accept_now = || {
                accepted_early = true;
                let behind = child.state.sa.accept(packet)?;
                crate::accept::rebind(sh, child, behind, spi, (local, src));
                Ok(())
            };
            deliver(o, sh, t, now, child, data, inner, accept_now);
            None
        }
        Err(reason) => Some(reason),
    };
    if accepted_early {
        return;
    }
    o.defer_accept(
        mark,
        AcceptJob {
            spi,
            packet,
            output: 0..0,
            fail,
            local,
            src,
        },
    );
}

/// Hands the decrypted inner packet at `data[range]` to the CHILD_SA's inside interface. A
/// packet that has to wait outside the send batch (for neighbour resolution) is accepted by
/// the replay window (`accept_now`) before it waits.
#[allow(clippy::too_many_arguments)]
fn deliver(
    o: &mut Out,
    sh: &Shared,
    t: &Tables,
    now: Instant,
    child: &Child,
    data: &mut [u8],
    (range, version): (Range<usize>, IpVersion),
    accept_now: impl FnOnce() -> Result<(), DropReason>,
) {
    let counters = &child.state.counters;
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
        Inside::Vnet(v) => vxlan::deliver(o, sh, t, now, v, pkt, &parsed, accept_now),
        Inside::Tun => tun::deliver(o, sh, pkt),
    }
}
