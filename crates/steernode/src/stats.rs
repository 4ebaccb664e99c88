//! What the steer node counts: datagrams (and customers' frames) forwarded by kind, dropped by
//! reason, per-tunnel traffic and rate-limit drops, per-attachment frames and drops, and the
//! failure detector's state.
//!
//! Each forwarding thread owns a [`Counters`] set (atomics only it writes, so counting costs
//! no contention) and an [`AttachCounters`] map it adds a batch's [`AttachTally`] to once per
//! batch; [`crate::SteerNode::stats`] sums them.

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use steer::{
    AttachmentId, HealthStats, NodeId, NodeStatus, PortKey, TunnelCounters, TunnelId, TunnelLimit,
};

macro_rules! reasons {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident => $s:literal,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vm])* $v,)*
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$v,)*];

            /// A short snake_case name (for metrics and logs).
            pub const fn name(self) -> &'static str {
                match self {
                    $(Self::$v => $s,)*
                }
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

reasons! {
    /// Why a datagram (or a frame) was dropped.
    DropReason {
        /// The receive was truncated or the sender's address family is unknown.
        BadReceive => "bad_receive",
        /// IKE arrived but no control node is set.
        NoControl => "no_control",
        /// An empty datagram on an IKE socket.
        IkeEmpty => "ike_empty",
        /// A datagram on a NAT-T socket too short for an ESP header.
        EspMalformed => "esp_malformed",
        /// ESP whose SPI is not steered.
        UnknownSpi => "unknown_spi",
        /// The steering entry names a data node whose address is not known.
        UnknownNode => "unknown_node",
        /// The data node has been declared dead.
        NodeDead => "node_dead",
        /// The tunnel's rate limit was exceeded (also counted per tunnel).
        RateLimited => "rate_limited",
        /// A VXLAN datagram whose VXLAN, Ethernet, ARP or IP headers do not parse, or whose
        /// I flag is clear.
        VxlanMalformed => "vxlan_malformed",
        /// An IP packet from a host that no selector of its VNI matches (and not for the
        /// gateway).
        VxlanNoSelector => "vxlan_no_selector",
        /// An Ethernet frame neither IP nor ARP.
        VxlanUnsupported => "vxlan_unsupported",
        /// ARP, neighbour discovery or gateway traffic for a VNI without live neighbour nodes.
        NoNeighbours => "no_neighbours",
        /// A Geneve frame from an address that is neither a data node nor the control node.
        GeneveUnknownSender => "geneve_unknown_sender",
        /// A Geneve frame that does not parse (or has an unknown critical option).
        GeneveMalformed => "geneve_malformed",
        /// A Geneve control frame (O flag) with a payload, which is never forwarded.
        GeneveControlPayload => "geneve_control_payload",
        /// A Geneve frame with neither a datagram nor a probe reply.
        GeneveNoAction => "geneve_no_action",
        /// A relayed datagram whose inner source is not one of our VIP sockets.
        RelayNotFromVip => "relay_not_from_vip",
        /// A probe reply from an address that names no single data node.
        ProbeReplyUnattributed => "probe_reply_unattributed",
        /// A frame could not be built (the datagram is too large to wrap).
        FrameTooLarge => "frame_too_large",
        /// The kernel refused a send.
        SendFailed => "send_failed",
        /// A socket receive failed.
        ReceiveError => "receive_error",
        /// A frame on a customer-facing port too short for its Ethernet header or tags, or a
        /// ring frame header outside its block.
        PortMalformed => "port_malformed",
        /// A frame on a customer-facing port whose tags are no attachment's of the port.
        PortUnknownTags => "port_unknown_tags",
        /// Frames the kernel dropped because a port's receive ring was full, and frames too
        /// big for the receive batch.
        PortRingFull => "port_ring_full",
        /// An Ethernet frame from a node for a port this steer node does not own.
        PortNotOurs => "port_not_ours",
        /// An Ethernet frame from a node (or the control node) that is no data node.
        PortNotFromData => "port_not_from_data",
        /// An Ethernet frame from a data node whose tags are no attachment's of its port.
        PortUnknownTagsOut => "port_unknown_tags_out",
    }
}

reasons! {
    /// What was forwarded (or received and consumed).
    ForwardKind {
        /// IKE datagrams (port 500, or port 4500 with the non-ESP marker) sent to the control
        /// node.
        IkeToControl => "ike_to_control",
        /// ESP datagrams sent to data nodes.
        EspToData => "esp_to_data",
        /// ESP datagrams for an SPI not steered yet, held until it is (counted when held;
        /// those released count in `esp_to_data` too, the others as `unknown_spi` drops).
        EspHeld => "esp_held",
        /// VXLAN datagrams steered by selector to a data node.
        VxlanToData => "vxlan_to_data",
        /// VXLAN datagrams (ARP, neighbour discovery, gateway traffic) sent to a VNI's
        /// neighbour nodes.
        VxlanToNeighbours => "vxlan_to_neighbours",
        /// Frames sent for those (one per live neighbour node).
        NeighbourFrames => "neighbour_frames",
        /// Datagrams relayed from a node out of a VIP socket.
        RelayedToPeers => "relayed_to_peers",
        /// Health probes attached to forwarded frames.
        ProbesOnPackets => "probes_on_packets",
        /// Explicit probe frames (Geneve control frames) sent to idle or dead nodes.
        ProbeFrames => "probe_frames",
        /// Probe replies received from data nodes.
        ProbeReplies => "probe_replies",
        /// NAT keepalives received (dropped, not an error).
        NatKeepalives => "nat_keepalives",
        /// Customers' frames from a port sent to the data node serving their attachment.
        PortToData => "port_to_data",
        /// Frames from data nodes sent to customers out of a port.
        DataToPort => "data_to_port",
    }
}

/// One thread's counters.
#[derive(Debug)]
pub(crate) struct Counters {
    forwarded: Vec<AtomicU64>,
    dropped: Vec<AtomicU64>,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            forwarded: ForwardKind::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
            dropped: DropReason::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Counters {
    /// Counts `n` of `kind`.
    #[inline]
    pub(crate) fn forwarded(&self, kind: ForwardKind, n: u64) {
        if let Some(c) = self.forwarded.get(kind as usize) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Counts `n` drops for `reason`.
    #[inline]
    pub(crate) fn dropped(&self, reason: DropReason, n: u64) {
        if let Some(c) = self.dropped.get(reason as usize) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Adds this thread's counts into `stats`.
    pub(crate) fn add_to(&self, forwarded: &mut ForwardStats, dropped: &mut DropStats) {
        for (i, c) in self.forwarded.iter().enumerate() {
            if let Some(v) = forwarded.0.get_mut(i) {
                *v = v.wrapping_add(c.load(Ordering::Relaxed));
            }
        }
        for (i, c) in self.dropped.iter().enumerate() {
            if let Some(v) = dropped.0.get_mut(i) {
                *v = v.wrapping_add(c.load(Ordering::Relaxed));
            }
        }
    }
}

/// Datagrams forwarded, by [`ForwardKind`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardStats(Vec<u64>);

impl Default for ForwardStats {
    fn default() -> Self {
        Self(vec![0; ForwardKind::ALL.len()])
    }
}

impl ForwardStats {
    /// The count of `kind`.
    pub fn get(&self, kind: ForwardKind) -> u64 {
        self.0.get(kind as usize).copied().unwrap_or(0)
    }

    /// Every kind with its count, in declaration order.
    pub fn iter(&self) -> impl Iterator<Item = (ForwardKind, u64)> + '_ {
        ForwardKind::ALL.iter().map(|&k| (k, self.get(k)))
    }
}

/// Datagrams dropped, by [`DropReason`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropStats(Vec<u64>);

impl Default for DropStats {
    fn default() -> Self {
        Self(vec![0; DropReason::ALL.len()])
    }
}

impl DropStats {
    /// The count of `reason`.
    pub fn get(&self, reason: DropReason) -> u64 {
        self.0.get(reason as usize).copied().unwrap_or(0)
    }

    /// Every reason with its count, in declaration order.
    pub fn iter(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL.iter().map(|&r| (r, self.get(r)))
    }

    /// Drops over all reasons.
    pub fn total(&self) -> u64 {
        self.0.iter().fold(0, |a, &b| a.wrapping_add(b))
    }
}

/// One tunnel's traffic through this steer node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TunnelStats {
    /// Its rate limit at this node (each direction's), if any.
    pub limit: Option<TunnelLimit>,
    /// Inbound: ESP from peers to data nodes (admitted = forwarded, dropped = over the rate).
    pub inbound: TunnelCounters,
    /// Outbound: VXLAN from hosts, and CEs' packets from customer-facing ports, to data nodes
    /// (the bytes of the UDP payload, or of the Ethernet frame with its tags).
    pub outbound: TunnelCounters,
}

/// One attachment's traffic through this steer node: frames on its tag pair of one of the
/// node's customer-facing ports. Counters are cumulative and wrap at `u64::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttachmentStats {
    /// The attachment the tag pair belongs to (the last one counted on it).
    pub attachment: AttachmentId,
    /// Frames from the CE relayed to a data node (counted when queued, as
    /// [`ForwardKind::PortToData`]).
    pub from_ce_frames: u64,
    /// Their bytes: the Ethernet frames as received, tags included.
    pub from_ce_bytes: u64,
    /// Frames from data nodes handed to the port for the CE.
    pub to_ce_frames: u64,
    /// Their bytes, tags included.
    pub to_ce_bytes: u64,
    /// Frames from the CE this node dropped: for a data node unknown or dead, over a tunnel's
    /// rate limit, or too large to wrap (each also counted by its [`DropReason`]). A frame
    /// toward the CE whose tags are the attachment's passes every check of this node, so none
    /// is counted here; frames whose tags name no attachment, and frames the kernel refused
    /// to send either way (not told apart within a batch), count only node-wide
    /// (`port_unknown_tags*`, `send_failed`).
    pub dropped: u64,
}

impl AttachmentStats {
    fn add(&mut self, o: &Self) {
        self.attachment = o.attachment;
        self.from_ce_frames = self.from_ce_frames.wrapping_add(o.from_ce_frames);
        self.from_ce_bytes = self.from_ce_bytes.wrapping_add(o.from_ce_bytes);
        self.to_ce_frames = self.to_ce_frames.wrapping_add(o.to_ce_frames);
        self.to_ce_bytes = self.to_ce_bytes.wrapping_add(o.to_ce_bytes);
        self.dropped = self.dropped.wrapping_add(o.dropped);
    }
}

/// Which of an attachment's counters a frame goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttachCount {
    /// A frame from the CE relayed to a data node, of this many bytes.
    FromCe(usize),
    /// A frame for the CE handed to the port, of this many bytes.
    ToCe(usize),
    /// A frame of the attachment dropped.
    Dropped,
}

/// One batch's per-attachment counts, kept by the thread (a batch touches few tag pairs: a
/// short list, scanned from the last pair counted) and folded into the thread's
/// [`AttachCounters`] once per batch, so no lock is taken and no shared line written per
/// frame. Its allocation is reused from batch to batch.
#[derive(Debug, Default)]
pub(crate) struct AttachTally {
    counts: Vec<(PortKey, AttachmentStats)>,
    last: usize,
}

impl AttachTally {
    /// Counts one frame of the tag pair `key` (of `attachment`).
    #[inline]
    pub(crate) fn count(&mut self, key: PortKey, attachment: AttachmentId, what: AttachCount) {
        let i = match self.counts.get(self.last) {
            Some((k, _)) if *k == key => self.last,
            _ => match self.counts.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    self.counts.push((key, AttachmentStats::default()));
                    self.counts.len() - 1
                }
            },
        };
        self.last = i;
        let Some((_, s)) = self.counts.get_mut(i) else {
            return;
        };
        s.attachment = attachment;
        match what {
            AttachCount::FromCe(bytes) => {
                s.from_ce_frames = s.from_ce_frames.wrapping_add(1);
                s.from_ce_bytes = s.from_ce_bytes.wrapping_add(bytes as u64);
            }
            AttachCount::ToCe(bytes) => {
                s.to_ce_frames = s.to_ce_frames.wrapping_add(1);
                s.to_ce_bytes = s.to_ce_bytes.wrapping_add(bytes as u64);
            }
            AttachCount::Dropped => s.dropped = s.dropped.wrapping_add(1),
        }
    }

    /// Adds the batch's counts into `into` (one lock) and empties the tally.
    pub(crate) fn fold(&mut self, into: &AttachCounters) {
        if self.counts.is_empty() {
            return;
        }
        let mut map = into.0.lock().unwrap_or_else(|p| p.into_inner());
        for (key, s) in self.counts.drain(..) {
            map.entry(key).or_default().add(&s);
        }
        self.last = 0;
    }
}

/// One thread's cumulative per-attachment counters, by tag pair: written by that thread once
/// per batch ([`AttachTally::fold`]), read by [`crate::SteerNode::stats`].
#[derive(Debug, Default)]
pub(crate) struct AttachCounters(Mutex<FxHashMap<PortKey, AttachmentStats>>);

impl AttachCounters {
    /// Adds this thread's counts into `out`.
    pub(crate) fn add_to(&self, out: &mut BTreeMap<PortKey, AttachmentStats>) {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for (key, s) in map.iter() {
            out.entry(*key).or_default().add(s);
        }
    }

    /// Forgets the counters of tag pairs for which `keep` is false (pairs no table mentions
    /// any more).
    pub(crate) fn retain(&self, keep: impl Fn(PortKey) -> bool) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| keep(*k));
    }
}

/// A snapshot of everything the steer node counts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SteerStats {
    /// Forwarded, by kind.
    pub forwarded: ForwardStats,
    /// Dropped, by reason.
    pub dropped: DropStats,
    /// Per tunnel (every tunnel that has a limit or has carried traffic).
    pub tunnels: BTreeMap<TunnelId, TunnelStats>,
    /// Per attachment, by its port and tag pair (every pair that has carried traffic since
    /// the node started or last got whole tables without it).
    pub attachments: BTreeMap<PortKey, AttachmentStats>,
    /// The failure detector's counters.
    pub health: HealthStats,
    /// The counters of the probes of dead nodes (see [`crate::SteerConfig::revive_interval`]).
    pub revive: HealthStats,
    /// Each data node's health as the failure detector sees it.
    pub nodes: BTreeMap<NodeId, NodeStatus>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use steer::PortId;

    fn key(s_tag: u16, c_tag: u16) -> PortKey {
        PortKey::new(PortId(1), s_tag, c_tag).unwrap()
    }

    #[test]
    fn attachment_counts_fold_per_batch_and_sum_over_threads() {
        let (red, blue) = (key(100, 20), key(0, 30));
        let (port_thread, underlay_thread) = (AttachCounters::default(), AttachCounters::default());
        let mut tally = AttachTally::default();
        // One batch of the port thread: two frames of red, one of blue, red again, a drop.
        tally.count(red, AttachmentId(1), AttachCount::FromCe(100));
        tally.count(red, AttachmentId(1), AttachCount::FromCe(60));
        tally.count(blue, AttachmentId(2), AttachCount::FromCe(70));
        tally.count(red, AttachmentId(1), AttachCount::Dropped);
        tally.fold(&port_thread);
        tally.fold(&port_thread); // an empty tally adds nothing
                                  // The underlay thread's batch: frames to red's CE.
        let mut other = AttachTally::default();
        other.count(red, AttachmentId(1), AttachCount::ToCe(90));
        other.count(red, AttachmentId(1), AttachCount::ToCe(10));
        other.fold(&underlay_thread);
        // A second batch of the port thread.
        tally.count(red, AttachmentId(1), AttachCount::FromCe(40));
        tally.fold(&port_thread);

        let mut out = BTreeMap::new();
        port_thread.add_to(&mut out);
        underlay_thread.add_to(&mut out);
        assert_eq!(
            out[&red],
            AttachmentStats {
                attachment: AttachmentId(1),
                from_ce_frames: 3,
                from_ce_bytes: 200,
                to_ce_frames: 2,
                to_ce_bytes: 100,
                dropped: 1,
            }
        );
        assert_eq!(
            out[&blue],
            AttachmentStats {
                attachment: AttachmentId(2),
                from_ce_frames: 1,
                from_ce_bytes: 70,
                ..AttachmentStats::default()
            }
        );
        port_thread.retain(|k| k != blue);
        let mut out = BTreeMap::new();
        port_thread.add_to(&mut out);
        assert_eq!(out.keys().copied().collect::<Vec<_>>(), vec![red]);
    }
}
