//! The ESP open stage (RFC 4303 §3.4, RFC 3948): input one ESP packet (from the classify stage,
//! in the receive batch), output the decrypted inner IP packet in place with its CHILD_SA
//! ([`Opened`]), or a counted drop. The packet is looked up by SPI, verified and decrypted
//! (the `esp` crate's checks) and checked against the CHILD_SA's selectors (RFC 4301 §5.2: a
//! decrypted packet outside them MUST be discarded). The replay window accepts it later, in
//! arrival order, when the send batch holding its output is sent ([`crate::accept`]); a packet
//! that has to wait outside the batch is accepted at once ([`Opened::accept_now`]).

use crate::batch::AcceptJob;
use crate::inner::InnerIp;
use crate::out::Out;
use crate::sa::InnerPacket;
use crate::shared::Shared;
use crate::stats::DropReason;
use crate::tables::{Child, Tables};
use esp::Unaccepted;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use wire::ip::IpVersion;
use wire::EspSpi;

/// An authentic ESP packet, decrypted in place, not yet accepted by the replay window.
pub(crate) struct Opened<'t> {
    /// Its CHILD_SA.
    pub(crate) child: &'t Arc<Child>,
    /// Its SPI (the CHILD_SA's inbound SPI).
    pub(crate) spi: EspSpi,
    /// What the replay window decides on.
    pub(crate) packet: Unaccepted,
    /// Where it arrived.
    pub(crate) local: SocketAddr,
    /// Where it came from.
    pub(crate) src: SocketAddr,
}

/// Opens the ESP packet `data` (starting at the SPI) that arrived on `local` from `src`:
/// the authentic packet and where its inner packet lies in `data` (or why its payload is
/// unusable, counted once the window accepted it); None if it was dropped.
pub(crate) fn open<'t>(
    o: &mut Out,
    t: &'t Tables,
    spi: EspSpi,
    (local, src): (SocketAddr, SocketAddr),
    data: &mut [u8],
) -> Option<(Opened<'t>, InnerPacket)> {
    let Some(child) = t.by_spi.get(&spi) else {
        o.no_tenant();
        o.drop_packet(DropReason::EspUnknownSpi);
        return None;
    };
    // The tenant is known (before decryption): the charge's mark and the fairness gate.
    if !o.tenant(child.tenant) {
        o.fair_share();
        return None;
    }
    match child.state.sa.open_unaccepted(data) {
        Ok((packet, inner)) => Some((
            Opened {
                child,
                spi,
                packet,
                local,
                src,
            },
            inner,
        )),
        Err(reason) => {
            o.drop_packet(reason);
            None
        }
    }
}

/// The decrypted inner packet at `data[range]`, if it is a valid IP packet of `version`
/// inside the CHILD_SA's selectors; else the drop is counted (and charged to the CHILD_SA).
pub(crate) fn admit<'d>(
    o: &mut Out,
    opened: &Opened<'_>,
    data: &'d mut [u8],
    (range, version): (Range<usize>, IpVersion),
) -> Option<(&'d mut [u8], InnerIp)> {
    let counters = &opened.child.state.counters;
    let Some(pkt) = data.get_mut(range) else {
        o.drop_packet(DropReason::EspMalformed);
        return None;
    };
    let Some(parsed) = InnerIp::parse(pkt).filter(|p| p.version == version) else {
        o.drop_packet(DropReason::InnerMalformed);
        counters.count_drop_in();
        return None;
    };
    // TFC padding (RFC 4303 §2.4) may follow the inner packet: its own length counts.
    let pkt = &mut pkt[..parsed.len];
    if !opened.child.admits_inbound(&parsed.flow) {
        o.drop_packet(DropReason::EspPolicy);
        counters.count_drop_in();
        return None;
    }
    Some((pkt, parsed))
}

impl Opened<'_> {
    /// Accepts the packet into the replay window now (it is about to wait outside the send
    /// batch for neighbour resolution), with the NAT rebinding check.
    pub(crate) fn accept_now(&self, sh: &Shared) -> Result<(), DropReason> {
        let behind = self.child.state.sa.accept(self.packet)?;
        crate::accept::rebind(sh, self.child, behind, self.spi, (self.local, self.src));
        Ok(())
    }

    /// The job that has the replay window accept the packet when its batch is sent (`fail`:
    /// why it is dropped once accepted).
    pub(crate) fn job(&self, fail: Option<DropReason>) -> AcceptJob {
        AcceptJob {
            spi: self.spi,
            packet: self.packet,
            output: 0..0,
            fail,
            local: self.local,
            src: self.src,
        }
    }
}
