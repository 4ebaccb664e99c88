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

/// Prefetching for a batch of ESP from many CHILD_SAs (VPP's approach in its ESP nodes): the
/// packets' SPIs and sequence numbers are read first, then, while packet `k` is opened, the
/// CHILD_SA of packet `k + 2D` is looked up and its `Child` loaded, and the ESP state of packet
/// `k + D` (whose `Child` is by then in cache) loaded, so the cache misses of one packet's
/// CHILD_SA overlap with the work on the packets before it instead of stalling it. With one
/// CHILD_SA everything stays in cache and this costs a few hint instructions per packet.
#[derive(Default)]
pub(crate) struct Prefetch {
    /// (SPI, sequence number) per ESP packet of the batch, in order; None for other datagrams.
    ahead: Vec<Option<(EspSpi, u32)>>,
    /// The next packet to be opened.
    at: usize,
}

/// Packets between the `Child` prefetch and the ESP state prefetch, and between that and the
/// open.
const PREFETCH_DISTANCE: usize = 4;

/// CHILD_SAs from which on the look-ahead is done: below, their state (about 1 KiB each) stays
/// in a core's first-level data cache (32 KiB) and the look-ahead's own pass over the batch
/// would only cost. Chosen from the cache size, not tuned on the benchmark.
const PREFETCH_FROM_SAS: usize = 32;

impl Prefetch {
    /// True if the tables hold enough CHILD_SAs for the look-ahead to pay.
    pub(crate) fn worth_it(t: &Tables) -> bool {
        t.by_spi.len() >= PREFETCH_FROM_SAS
    }

    /// Starts a batch: no packets yet.
    pub(crate) fn clear(&mut self) {
        self.ahead.clear();
        self.at = 0;
    }

    /// Adds the next packet of the batch: its ESP header if it is ESP (`data` starting at
    /// the SPI; a zero SPI, the NAT-T non-ESP marker, is not).
    pub(crate) fn push(&mut self, data: &[u8]) {
        let header = data.get(..8).and_then(|h| {
            let spi = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
            let seq = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
            (spi != 0).then_some((EspSpi(spi), seq))
        });
        self.ahead.push(header);
    }

    /// Called before the next packet is processed: loads ahead for the packets `D` and `2D`
    /// after it (and, at the start of a batch, for the first ones).
    pub(crate) fn next(&mut self, t: &Tables) {
        let k = self.at;
        if k == 0 {
            for j in 0..PREFETCH_DISTANCE.min(self.ahead.len()) {
                self.child(t, j);
                self.state(t, j);
            }
            for j in PREFETCH_DISTANCE..(2 * PREFETCH_DISTANCE).min(self.ahead.len()) {
                self.child(t, j);
            }
        }
        self.child(t, k + 2 * PREFETCH_DISTANCE);
        self.state(t, k + PREFETCH_DISTANCE);
        self.at += 1;
    }

    fn child(&self, t: &Tables, j: usize) {
        if let Some(Some((spi, _))) = self.ahead.get(j) {
            if let Some(child) = t.by_spi.get(spi) {
                wire::prefetch::prefetch::<Child>(child);
            }
        }
    }

    fn state(&self, t: &Tables, j: usize) {
        if let Some(Some((spi, seq))) = self.ahead.get(j) {
            if let Some(child) = t.by_spi.get(spi) {
                child.prefetch_open(*seq);
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_look_ahead_reads_esp_headers_and_skips_the_rest() {
        let mut p = Prefetch::default();
        p.push(&[0, 0, 0, 0, 1, 2, 3, 4, 5]); // the non-ESP marker: IKE
        p.push(&[0xff]); // a NAT keepalive
        p.push(&[0, 0, 0x10, 0x01, 0, 0, 0, 7, 0xaa]);
        assert_eq!(
            p.ahead,
            [None, None, Some((EspSpi(0x1001), 7))],
            "SPI and sequence number in network order"
        );
        // Looking ahead past the end of the batch (no CHILD_SA known) is harmless.
        let t = Tables::default();
        assert!(!Prefetch::worth_it(&t));
        for _ in 0..20 {
            p.next(&t);
        }
        assert_eq!(p.at, 20);
        p.clear();
        assert!(p.ahead.is_empty() && p.at == 0);
    }
}
