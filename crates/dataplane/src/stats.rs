//! Counters: every dropped packet is counted under a [`DropReason`] reason (docs/architecture.md, "Bad input and faults"), per
//! CHILD_SA counters live beside the SA. Threads count into a local [`DropCounts`] and add it to
//! the shared atomics once per batch.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! drops {
    ($($(#[$doc:meta])* $name:ident = $text:literal,)*) => {
        /// Why a packet was dropped (or, for keepalives, consumed without forwarding).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub(crate) enum DropReason {
            $($(#[$doc])* $name,)*
        }
        impl DropReason {
            /// Every reason, in index order.
            pub(crate) const ALL: &'static [DropReason] = &[$(DropReason::$name,)*];
            /// The name shown in stats.
            pub(crate) fn name(self) -> &'static str {
                match self { $(DropReason::$name => $text,)* }
            }
        }
    };
}

drops! {
    /// A datagram larger than the receive buffer.
    Truncated = "truncated",
    /// RFC 3948 NAT keepalive (a single 0xFF byte): consumed by design.
    NattKeepalive = "natt_keepalive",
    /// A UDP payload on the NAT-T port too short to be ESP or IKE.
    MalformedUdp = "malformed_udp",
    /// The IKE datagram could not be handed to the control plane.
    IkeQueue = "ike_queue_full",
    /// ESP with an SPI we have no SA for.
    EspUnknownSpi = "esp_unknown_spi",
    /// ESP whose sequence number was already seen or is left of the window.
    EspReplay = "esp_replay",
    /// ESP whose ICV did not verify.
    EspAuth = "esp_auth",
    /// ESP that is structurally invalid (length, padding, next header).
    EspMalformed = "esp_malformed",
    /// ESP with an inner protocol we do not forward (not IPv4/IPv6).
    EspNextHeader = "esp_next_header",
    /// An authentic dummy packet (RFC 4303 §2.6, Next Header 59): discarded by design.
    EspDummy = "esp_dummy",
    /// A decrypted packet that is not a valid IP packet.
    InnerMalformed = "inner_malformed",
    /// A decrypted packet outside the CHILD_SA's negotiated selectors (RFC 4301 §5.2).
    EspPolicy = "esp_policy",
    /// Inner TTL / hop limit exhausted.
    TtlExceeded = "ttl_exceeded",
    /// No route in the VNet for the destination.
    NoRoute = "no_route",
    /// A packet to the gateway's own address (nothing answers it).
    ToGateway = "to_gateway",
    /// Address resolution failed (queued packets expired) or its queue was full.
    NeighUnresolved = "neigh_unresolved",
    /// The neighbour table was full.
    NeighTableFull = "neigh_table_full",
    /// A VXLAN datagram too short, with the I flag clear, or with a bad inner frame.
    VxlanMalformed = "vxlan_malformed",
    /// A VXLAN datagram for a VNI that is not configured on this VTEP.
    VxlanUnknownVni = "vxlan_unknown_vni",
    /// A VXLAN datagram from an address that is not a host of the VNet.
    VxlanUnknownHost = "vxlan_unknown_host",
    /// A frame neither for the gateway's MAC nor an ARP/ND packet for it.
    VxlanNotForGateway = "vxlan_not_for_gateway",
    /// Self-dispatch: a frame for a virtual MAC another data node owns (the host flooded it
    /// to every node before it learnt where that MAC lives; the owner takes its own copy).
    DispatchOtherOwner = "dispatch_other_owner",
    /// An ethertype other than IPv4, IPv6 and ARP.
    VxlanEthertype = "vxlan_ethertype",
    /// An ARP or ND packet that is invalid or not for the gateway.
    NeighIgnored = "arp_nd_ignored",
    /// No CHILD_SA of the VNet's tunnels covers the packet.
    VxlanNoTunnel = "vxlan_no_tunnel",
    /// No CHILD_SA of the TUN tunnels covers the packet read from the TUN.
    TunNoTunnel = "tun_no_tunnel",
    /// The packet read from the TUN is not a valid IP packet.
    TunMalformed = "tun_malformed",
    /// Writing to the TUN device failed.
    TunWrite = "tun_write",
    /// A TUN read shorter than its vnet header, or empty.
    TunShortRead = "tun_short_read",
    /// A TUN read longer than any IP packet.
    TunReadTruncated = "tun_read_truncated",
    /// A TUN vnet header with an unknown GSO type, a zero segment size or bad checksum offsets.
    TunVnetBadHeader = "tun_vnet_bad_header",
    /// A TUN GSO super-packet whose headers do not parse or do not match its GSO type.
    TunGsoMalformed = "tun_gso_malformed",
    /// A TUN GSO super-packet whose segments do not fit a read batch.
    TunGsoTooLarge = "tun_gso_too_large",
    /// No socket on the SA's outer local address.
    NoSocket = "no_socket",
    /// The packet (with ESP overhead) does not fit a datagram.
    TooBig = "too_big",
    /// A packet for a tenant's feature chain found the worker's hold buffer full.
    FeatureHoldFull = "feature_hold_full",
    /// A packet a feature stage sent back the way it came (a filter's `XDP_TX`) found no way
    /// back: no CHILD_SA of the VNet covers it, no route to its destination, no CE for it.
    ReflectNoRoute = "reflect_no_route",
    /// The outbound SA's sequence numbers are exhausted, or sealing failed.
    EspSeal = "esp_seal",
    /// The kernel refused to send.
    SendError = "send_error",
    /// Relay mode: a Geneve frame from an address that is not a steer node's.
    RelayUnknownSender = "relay_unknown_sender",
    /// Relay mode: a Geneve frame that does not parse (truncated, bad inner IP/UDP, unknown
    /// critical option, a data frame without a datagram).
    RelayMalformed = "relay_malformed",
    /// Relay mode: an IKE message (non-ESP marker) relayed to the data node (IKE goes to the
    /// control node).
    RelayIke = "relay_ike",
    /// Relay mode: a relayed datagram to a port that is neither the NAT-T nor the VXLAN port.
    RelayUnexpectedPort = "relay_unexpected_port",
    /// Relay mode: a control frame (O flag) with nothing to answer (no probe).
    RelayControl = "relay_control",
    /// Relay mode: a packet toward a peer while no steer node is known.
    RelayNoSteer = "relay_no_steer",
    /// Attachment: frames the kernel dropped because the interface's receive ring was full.
    AttachRingFull = "attach_ring_full",
    /// Attachment: frames given up because a receive ring frame header lay outside its
    /// block (a kernel we do not understand; never seen).
    AttachRingMalformed = "attach_ring_malformed",
    /// AF_XDP: frames the kernel could not put into a socket's receive ring (ring full, fill
    /// ring empty, or a frame larger than a UMEM frame), from the sockets' `XDP_STATISTICS`.
    XdpLost = "xdp_lost",
    /// AF_XDP: a steered frame that is not a well-formed Ethernet + IP + UDP datagram to
    /// our address (bad IPv4 header checksum, lengths that do not add up).
    XdpMalformed = "xdp_malformed",
    /// Attachment: frames toward a CE dropped because the interface's transmit ring (or, without
    /// one, the socket's queue) stayed full for the whole bounded wait of a send (50 ms).
    AttachTxFull = "attach_tx_full",
    /// Attachment: a frame whose tags are no attachment's on its interface (untagged, an
    /// unknown tag pair, a TPID other than 0x88a8 outside 0x8100 or 0x8100 alone).
    AttachUnknownTags = "attach_unknown_tags",
    /// Attachment: a frame too short for its tags, or an IP packet that does not parse.
    AttachMalformed = "attach_malformed",
    /// Attachment: an EtherType other than IPv4, IPv6 and ARP, or one that does not match the
    /// packet's IP version.
    AttachEthertype = "attach_ethertype",
    /// Attachment: an IP frame from the CE not addressed to the gateway's MAC.
    AttachNotForGateway = "attach_not_for_gateway",
    /// Attachment: an IP packet from the CE whose source is not behind it (its `routes`).
    AttachSource = "attach_source",
    /// Attachment: its VNet is not (or no longer) configured.
    AttachNoVnet = "attach_no_vnet",
    /// Attachment: a packet for the CE while its MAC is not known yet.
    AttachCeUnresolved = "attach_ce_unresolved",
    /// CPU fairness (`cpu_fairness = "enforce"`): the packet's tenant had used up its share
    /// of the worker's CPU (its token bucket was empty); dropped where its tenant became
    /// known, before decryption or decapsulation (per tenant: `TenantStats::fair_drops`).
    FairShare = "fair_share",
    /// Attachment: a packet for the CE from a host whose VNet routes do not place its source
    /// there.
    AttachVnetSource = "attach_vnet_source",
    /// Attachment (relay mode): a customer's frame from a steer node for a port of that steer
    /// node that no attachment is on.
    AttachUnknownPort = "attach_unknown_port",
}

/// Number of drop reasons.
pub(crate) const DROP_REASONS: usize = DropReason::ALL.len();

/// Node-wide drop counters.
#[derive(Debug)]
pub(crate) struct DropCounters {
    counts: [AtomicU64; DROP_REASONS],
}

impl Default for DropCounters {
    fn default() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl DropCounters {
    /// Adds a thread's local counts and zeroes them.
    pub(crate) fn absorb(&self, local: &mut DropCounts) {
        for (i, c) in local.0.iter_mut().enumerate() {
            if *c != 0 {
                self.counts[i].fetch_add(*c, Ordering::Relaxed);
                *c = 0;
            }
        }
    }

    /// Name and value of every reason.
    pub(crate) fn snapshot(&self) -> Vec<(String, u64)> {
        DropReason::ALL
            .iter()
            .map(|d| {
                (
                    d.name().to_owned(),
                    self.counts[*d as usize].load(Ordering::Relaxed),
                )
            })
            .collect()
    }
}

/// A thread's drop counts for the current batch.
#[derive(Debug, Clone)]
pub(crate) struct DropCounts([u64; DROP_REASONS]);

impl Default for DropCounts {
    fn default() -> Self {
        Self([0; DROP_REASONS])
    }
}

impl DropCounts {
    /// Counts one drop.
    pub(crate) fn add(&mut self, reason: DropReason) {
        self.0[reason as usize] += 1;
    }

    /// Counts `n` drops.
    pub(crate) fn add_n(&mut self, reason: DropReason, n: u64) {
        self.0[reason as usize] += n;
    }

    /// The count for one reason.
    #[cfg(test)]
    pub(crate) fn get(&self, reason: DropReason) -> u64 {
        self.0[reason as usize]
    }
}

/// Counters of one worker, written by it once per batch (each on its own cache line so
/// workers never share one).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct WorkerCounters {
    /// Datagrams and packets processed (GRO segments counted one by one).
    pub(crate) packets: AtomicU64,
    /// Batches processed.
    pub(crate) batches: AtomicU64,
    /// Nanoseconds spent receiving and processing batches.
    pub(crate) busy_ns: AtomicU64,
    /// Nanoseconds spent polling without sleeping and finding nothing (`busy_poll`).
    pub(crate) spin_ns: AtomicU64,
    /// Cycles the CPU charge could not attribute to a tenant.
    pub(crate) cpu_unattributed: AtomicU64,
    /// Phases the CPU charge split by packet count (too many tenant runs).
    pub(crate) cpu_capped: AtomicU64,
    /// Cycles the CPU charge took back from the tenants: the worker was preempted while it
    /// charged them.
    pub(crate) cpu_preempted: AtomicU64,
    /// Enforcing CPU fairness: the worker's tokens per tenant slot (cycles), as of its last
    /// generation.
    pub(crate) tokens: std::sync::Mutex<Vec<i64>>,
}

impl WorkerCounters {
    /// One batch of `packets` packets processed in `busy`.
    pub(crate) fn batch(&self, packets: u64, busy: std::time::Duration) {
        self.packets.fetch_add(packets, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(busy.as_nanos()).unwrap_or(u64::MAX);
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Counters of one CHILD_SA pair kept by the data plane (packets, bytes and ESP drops are
/// counted by the `esp` SAs themselves).
#[derive(Debug, Default)]
pub(crate) struct ChildCounters {
    /// Inbound packets dropped after decryption (selector check, inner packet).
    pub(crate) drops_in: AtomicU64,
}

impl ChildCounters {
    /// One inbound packet dropped after decryption.
    pub(crate) fn count_drop_in(&self) {
        self.drops_in.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_local_counts_are_absorbed() {
        let mut names: Vec<_> = DropReason::ALL.iter().map(|d| d.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DROP_REASONS);
        for (i, d) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*d as usize, i);
        }
        let shared = DropCounters::default();
        let mut local = DropCounts::default();
        local.add(DropReason::EspReplay);
        local.add_n(DropReason::EspAuth, 3);
        shared.absorb(&mut local);
        shared.absorb(&mut local);
        let snap = shared.snapshot();
        assert!(snap.contains(&("esp_replay".to_owned(), 1)));
        assert!(snap.contains(&("esp_auth".to_owned(), 3)));
        assert_eq!(local.get(DropReason::EspAuth), 0);
    }
}
