//! What the steer node counts: datagrams (and customers' frames) forwarded by kind, dropped by
//! reason,
//! per-tunnel traffic and rate-limit drops, and the failure detector's state.
//!
//! Each forwarding thread owns a [`Counters`] set (atomics only it writes, so counting costs
//! no contention); [`crate::SteerNode::stats`] sums them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use steer::{HealthStats, NodeId, NodeStatus, TunnelCounters, TunnelId, TunnelLimit};

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
    /// Outbound: VXLAN from hosts to data nodes.
    pub outbound: TunnelCounters,
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
    /// The failure detector's counters.
    pub health: HealthStats,
    /// The counters of the probes of dead nodes (see [`crate::SteerConfig::revive_interval`]).
    pub revive: HealthStats,
    /// Each data node's health as the failure detector sees it.
    pub nodes: BTreeMap<NodeId, NodeStatus>,
}
