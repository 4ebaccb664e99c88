//! Relay mode's shared state and frame codec (docs/architecture.md, "The picture"): the node
//! sits behind steer nodes, which own the public address (VIP) and forward to it, inside Geneve
//! (RFC 8926, UDP 6081), the whole IP/UDP datagram a peer or a cloud host sent to the VIP
//! (`wire::relay`). How received frames are classified is the pipeline's business
//! ([`crate::pipeline::classify`]); this module holds what every stage and the control side
//! share: the steer nodes ([`Relays`]) and the headers written in front of datagrams toward
//! them.
//!
//! Send: ESP toward a peer leaves the Geneve socket to the output steer node as
//! Geneve (8 bytes, no options, VNI 0, Protocol Type of the inner family) + IP/UDP
//! (the CHILD_SA's local address, the VIP, to the peer) + ESP; see [`write_headers`] and
//! the seal stage. VXLAN toward hosts leaves from the VTEP directly.
//!
//! The output steer node ([`Relays::output`]) is the first of the list, in the control
//! node's order, that was heard from within [`HEARD_WINDOW_MS`]: every valid frame received
//! from a steer node (forwarded traffic, health probes riding on it, idle probes) marks it
//! heard. Live steer nodes probe every data node at least every 10 ms (their
//! `probe_interval`), so one that freezes or loses power stops being chosen within the
//! window, long before the control node notices that its session is gone and reorders the
//! list. When none was heard within the window (start-up, probes turned off) the first of
//! the list is used.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use wire::error::WireError;
use wire::esp::NON_ESP_MARKER_LEN;
use wire::geneve::{GeneveBuilder, GeneveRepr, GENEVE_HEADER_LEN};
use wire::relay as frame;
use wire::vxlan::Vni;

/// The VNI of the frames the data node sends (the relay hop carries no tenant network).
pub(crate) const RELAY_VNI: Vni = match Vni::new(0) {
    Some(v) => v,
    None => panic!("0 fits in 24 bits"),
};

/// How recently (milliseconds) a steer node must have been heard from to take the output
/// ([`Relays::output`]). Steer nodes probe every data node at least once per
/// `probe_interval` (10 ms by default), more often under traffic, so a live steer node is
/// heard several times per window: five intervals tolerate a few lost or late probes and a
/// busy or descheduled steer node without moving the output back and forth, while a steer
/// node that stops (frozen, powered off) loses the output after at most this long, in the
/// time routers take to withdraw a failed next hop with fast detection (BFD). With a
/// `probe_interval` longer than this, an idle live steer node may lose the output between
/// probes to one heard more recently (or, none being recent, keep it as the first); traffic
/// still flows.
pub(crate) const HEARD_WINDOW_MS: u64 = 50;

/// A [`Relays::heard`] stamp for a steer node never heard from (stamps start at 1).
const NEVER: u64 = 0;

/// The steer nodes: the senders accepted on the Geneve socket, when each was last heard
/// from, and so where datagrams toward peers go ([`Relays::output`]). Replaced whole when the
/// control node sends a new list (a new one has heard nothing yet); shared by every worker
/// through the published [`Tables`](crate::tables::Tables).
#[derive(Debug)]
pub(crate) struct Relays {
    steer: Vec<SocketAddr>,
    /// Per steer node (same index): when a valid frame from it was last received, as a
    /// [`Relays::stamp`] ([`NEVER`] until then). Relaxed: a stamp orders nothing else, and a
    /// worker that sees one late only changes its output a little later. A stamp is written
    /// only when a new millisecond begins, so receiving workers do not take the cache line
    /// from the sending ones per packet.
    heard: Box<[AtomicU64]>,
    /// The origin of the stamps (when the list was set).
    pub(crate) epoch: Instant,
}

impl Relays {
    /// The steer nodes' Geneve addresses (validated by the caller), in the control node's
    /// order of preference; none heard from yet.
    pub(crate) fn new(steer: Vec<SocketAddr>) -> Self {
        let heard = steer.iter().map(|_| AtomicU64::new(NEVER)).collect();
        Self {
            steer,
            heard,
            epoch: Instant::now(),
        }
    }

    /// A new list that keeps what `previous` heard from the steer nodes it shares with it (so
    /// that replacing the list, e.g. when a steer node registers, does not send output back to
    /// a silent first node until the next probe).
    pub(crate) fn replacing(steer: Vec<SocketAddr>, previous: Option<&Relays>) -> Self {
        let Some(prev) = previous else {
            return Self::new(steer);
        };
        let heard = steer
            .iter()
            .map(|a| {
                let stamp = prev
                    .index(*a)
                    .and_then(|i| prev.heard.get(i))
                    .map_or(NEVER, |h| h.load(Ordering::Relaxed));
                AtomicU64::new(stamp)
            })
            .collect();
        Self {
            steer,
            heard,
            epoch: prev.epoch,
        }
    }

    /// The index of steer node `src` (frames are accepted from it), None if `src` is not one.
    #[inline]
    pub(crate) fn index(&self, src: SocketAddr) -> Option<usize> {
        self.steer.iter().position(|s| *s == src)
    }

    /// Records that a valid frame from steer node `i` (an [`index`](Self::index)) arrived at
    /// `now`. Cheap per packet: a relaxed load, and a write only when the stamp is older than
    /// `now`'s millisecond.
    #[inline]
    pub(crate) fn heard(&self, i: usize, now: Instant) {
        let Some(slot) = self.heard.get(i) else {
            return;
        };
        let stamp = self.stamp(now);
        if slot.load(Ordering::Relaxed) < stamp {
            // Workers' batch times differ slightly: never move a stamp back.
            slot.fetch_max(stamp, Ordering::Relaxed);
        }
    }

    /// Where datagrams toward peers go at `now`: the first steer node, in list order, heard
    /// from within [`HEARD_WINDOW_MS`]; the first of the list when none was (start-up, probes
    /// off); None when the list is empty. Per output datagram: relaxed loads of the stamps up
    /// to the first recent one (usually the first), no write.
    #[inline]
    pub(crate) fn output(&self, now: Instant) -> Option<SocketAddr> {
        let now = self.stamp(now);
        self.steer
            .iter()
            .zip(self.heard.iter())
            .find(|(_, heard)| {
                let at = heard.load(Ordering::Relaxed);
                // A stamp newer than `now` (another worker's later batch) is recent.
                at != NEVER && now.saturating_sub(at) < HEARD_WINDOW_MS
            })
            .map(|(s, _)| *s)
            .or_else(|| self.steer.first().copied())
    }

    /// The addresses, in order.
    pub(crate) fn steer(&self) -> &[SocketAddr] {
        &self.steer
    }

    /// `now` in milliseconds since the list was set, plus one (so that no stamp is
    /// [`NEVER`]); an instant before that counts as the first millisecond.
    #[inline]
    fn stamp(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.epoch);
        since
            .as_secs()
            .saturating_mul(1000)
            .saturating_add(u64::from(since.subsec_millis()))
            .saturating_add(1)
    }
}

/// Bytes in front of the UDP payload of a datagram sent to a steer node: the Geneve header
/// (no options) and the inner IP and UDP headers of this family.
pub(crate) const fn prefix_len(ipv6: bool) -> usize {
    GENEVE_HEADER_LEN + frame::header_len(ipv6)
}

/// Writes the relay headers in front of a datagram toward a peer: `buf` holds
/// [`prefix_len`] bytes of room, then the `payload_len`-byte UDP payload (already final: the
/// inner IPv6 UDP checksum covers it). `local` (the VIP) and `remote` (the peer) must be of
/// one family.
pub(crate) fn write_headers(
    buf: &mut [u8],
    local: SocketAddr,
    remote: SocketAddr,
    payload_len: usize,
) -> Result<(), WireError> {
    let repr = GeneveRepr {
        control: false,
        protocol_type: frame::protocol_type(remote.is_ipv6()),
        vni: RELAY_VNI,
    };
    let start = GeneveBuilder::new(buf, &repr)?.finish();
    let rest = buf.get_mut(start..).ok_or(WireError::Malformed {
        what: "relayed datagram",
        field: "length",
    })?;
    frame::emit_header(rest, local, remote, payload_len, 0)?;
    Ok(())
}

/// Builds a relay frame carrying an IKE message or NAT keepalive from `local` (a VIP) to
/// `remote` (the control plane's slow path, [`crate::DataPath::send_ike`] in relay mode): the
/// non-ESP marker is added on the NAT-T port except before a keepalive (RFC 3948 §2.2, §2.3).
pub(crate) fn ike_frame(
    local: SocketAddr,
    remote: SocketAddr,
    marker: bool,
    payload: &[u8],
) -> Result<Vec<u8>, WireError> {
    let mut datagram = Vec::with_capacity(NON_ESP_MARKER_LEN + payload.len());
    if marker {
        datagram.extend_from_slice(&wire::esp::NON_ESP_MARKER);
    }
    datagram.extend_from_slice(payload);
    let mut buf = vec![0u8; prefix_len(remote.is_ipv6()) + datagram.len()];
    let n = frame::emit_frame(&mut buf, RELAY_VNI, &[], local, remote, &datagram)?;
    buf.truncate(n);
    Ok(buf)
}
