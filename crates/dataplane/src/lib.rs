//! The Protego data plane on one node: UDP sockets for IKE (500) and ESP-in-UDP (4500, RFC 3948)
//! with batched I/O (`recvmmsg` with UDP GRO, `sendmmsg` with UDP GSO), ESP processing over the
//! `esp` crate, and the inside interfaces — VXLAN (RFC 7348) toward cloud hosts, where the
//! gateway is each VNet's router (ARP, IPv6 ND, longest-prefix routes to host VTEPs), or a TUN
//! device for the standalone case. In relay mode (a data node of the distributed form,
//! docs/architecture.md, "The picture") the outside is a Geneve socket toward steer nodes instead of public IKE and
//! NAT-T sockets.
//!
//! # Use
//! ```no_run
//! # fn main() -> Result<(), protego_dataplane::DataplaneError> {
//! use protego_dataplane::{DataPath, Dataplane, DataplaneConfig};
//! let cfg = DataplaneConfig {
//!     attachments: vec![],
//!     listen: vec!["192.0.2.1".parse().expect("address")],
//!     ike_port: 500,
//!     natt_port: 4500,
//!     vxlan_port: 4789,
//!     vnets: vec![],
//!     tunnels: vec![],
//!     tun_name: None,
//!     batch: 32,
//!     workers: 0,
//!     cpus: vec![],
//!     pin_workers: true,
//!     busy_poll: std::time::Duration::ZERO,
//!     busy_poll_budget: protego_dataplane::DEFAULT_BUSY_POLL_BUDGET,
//!     xdp: protego_dataplane::XdpMode::Off,
//!     fair_kernel_gate: true,
//!     relay: None,
//!     dispatch: None,
//! };
//! let (to_control, from_dataplane) = crossbeam_channel::unbounded();
//! let dp = Dataplane::start(cfg, to_control)?;
//! // The control plane reads `ToControl::Ike` datagrams from `from_dataplane`, answers with
//! // `dp.send_ike(..)`, and installs negotiated CHILD_SAs with `dp.install_child(&info)`.
//! # drop(from_dataplane);
//! let _stats = dp.stats();
//! dp.shutdown();
//! # Ok(()) }
//! ```
//!
//! # Threads and tables
//! [`Dataplane::start`] validates the whole configuration, opens every socket (and the TUN
//! device), then starts the worker threads (`workers`, by default one per CPU, pinned). Every
//! worker serves every input: each input is a *lane* with a serial dispatch stage (receive a
//! batch, draw its ticket, and for outbound lanes allocate ESP sequence numbers in arrival
//! order), parallel processing on the worker's core, and an ordered sender, so one tunnel's
//! packets use all cores and still leave in order (see `lane` and `worker`). Workers block in
//! `poll` on the lanes and a shared eventfd; [`Dataplane::shutdown`] (also run on drop)
//! signals it and joins them.
//!
//! The control plane's [`DataPath`] calls edit a registry under a mutex and publish an immutable
//! snapshot of the SA tables (inbound SPI -> CHILD_SA, and per inside interface the CHILD_SAs
//! carrying outbound traffic); workers read the snapshot once per batch. ESP state (sequence
//! numbers, replay windows) lives in the `esp` SAs and is shared, lock-free, by every worker
//! that uses the SA. The per-packet path does not allocate, lock or make system calls, except
//! to queue a packet while a VM's MAC is being resolved and to hand an IKE datagram to the
//! control plane; it takes a VNet's neighbour cache lock about once per second per address
//! (workers memoise answers).
//!
//! Sockets: per listen address one on the IKE port and one on the NAT-T port (IPv6 sockets are
//! IPV6_V6ONLY; all bind concrete addresses, so no IP_PKTINFO is needed); per local VTEP one on
//! the VXLAN port, which receives from hosts and sends ARP/ND, plus 16 send-only sockets on
//! ephemeral ports whose source ports carry the flow hash of RFC 7348 §5 (relay mode: see
//! below). UDP GRO and GSO are used where the kernel accepts them; a refusal is logged once
//! and the socket falls back to single datagrams (a GSO train above the path MTU is resent as
//! single, fragmentable datagrams).
//!
//! # Pipeline
//! Packets move through named stages over batches (docs/architecture.md, "The pipeline"):
//! input (`io::input`: `recvmmsg` with GRO, TUN reads) → classify → ESP open | VXLAN decap →
//! the tenant's feature chain → ESP seal | VXLAN encap → output (`io::output`: replay window
//! acceptance, `sendmmsg` with GSO, TUN writes). Each stage is a module of `pipeline` (or `io`)
//! that imports only shared state and earlier stages; `pipeline::graph` wires them per lane.
//! Only `sys` and `io` touch sockets and the TUN device (checked by `tests/layering.rs`).
//!
//! The per-tenant feature chain ([`Dataplane::set_feature_chain`]) is an ordered list of
//! [`Feature`] stages per tenant and [`Direction`], empty by default: inbound after decryption
//! and the selector check, outbound before the seal stage chooses the CHILD_SA (on the packet
//! as the chain left it, so a rewrite is checked against the selectors). A stage sees a
//! [`FeatureBatch`] of one tenant's inner IP packets with their [`PacketMeta`], may rewrite
//! them in place and drop them with reasons counted per tenant in [`DataplaneStats::drops`]
//! (`<tenant>/<reason>`).
//! Without chains the packet path pays one branch per packet.
//!
//! # Packet paths
//! - ESP from a peer: SPI lookup, open in place, RFC 4301 §5.2 inbound selector check, then
//!   into the VNet (TTL decremented, longest-prefix route to the host VTEP, VM MAC resolved by
//!   ARP/ND over VXLAN) or written to the TUN device.
//! - VXLAN from a host: the VNI must be configured on the receiving VTEP and the sender one of
//!   the VNet's route hosts; ARP and ND for the gateway are answered; IP frames to the gateway
//!   MAC pick the CHILD_SA whose negotiated selectors cover (inner source, inner destination)
//!   among that VNet's tunnels only, and are sealed and sent from the SA's local NAT-T socket.
//! - TUN: packets read from the device pick a CHILD_SA among the TUN tunnels the same way.
//! - A customer's edge router attached at L2 ([`AttachmentConfig`]): frames read from the
//!   interface's AF_PACKET ring find their attachment by (interface, S-tag, C-tag), hence
//!   its VNet; ARP/ND for the attachment's gateway address are answered, IP packets from
//!   behind the CE lose their tags and enter the VNet as decrypted ESP does. VNet packets to
//!   prefixes behind a CE leave tagged toward it, before the VNet's tunnels are considered.
//!
//! # Relay mode
//! With [`DataplaneConfig::relay`] the node sits behind steer nodes that own the public
//! address (VIP). No IKE or NAT-T socket is opened; one Geneve socket (RFC 8926) receives
//! from the steer nodes (any other sender is dropped) the whole IP/UDP datagrams peers and
//! cloud hosts sent to the VIP (`wire::relay`): ESP to the NAT-T port is opened as above (the
//! inner source is the peer, the inner destination the CHILD_SA's local address), VXLAN to
//! the VXLAN port goes to the VNet of its VNI as if received from the inner source. Health
//! probes in Geneve options are answered at once (probe reply, control frame). Encrypted
//! output goes back to a steer node as Geneve + inner IP/UDP (VIP -> peer) + ESP, written in
//! place in the send batch so GSO trains still form: to the first of the list heard from
//! (any valid frame, probes included) within the last 50 ms, so that one which stops
//! silently is left within that time, or to the first when none was; VXLAN toward hosts leaves
//! from the node's own VTEP ([`RelayConfig::vtep`], by default its Geneve address), whose
//! sockets only send there (hosts send to the VIP). The Geneve socket is one lane carrying
//! both directions: VXLAN from hosts is classified and numbered under the lane's dispatch
//! stage, ESP from peers is opened in parallel after it. The steer nodes and the inside
//! configuration are replaced at run time ([`DataPath::set_relays`],
//! [`DataPath::set_inside`]; VNets may only use the VTEPs opened at start).
//!
//! Every packet that is not forwarded is counted under a reason in
//! [`DataplaneStats::drops`]; nothing a peer or host sends can panic a thread. Workers report
//! the time they spend on batches ([`WorkerStats::busy_ns`]) for the node's utilization.

mod accept;
mod attach;
mod batch;
mod control;
mod dataplane;
mod feature;
mod filters;
mod inner;
mod io;
mod lane;
mod out;
mod overlay;
mod pipeline;
mod pool;
mod relays;
mod routes;
mod sa;
mod select;
mod shared;
mod spin;
mod stats;
mod sys;
mod tables;
mod vnet;
mod worker;

#[cfg(test)]
mod testutil;

// The interface types live in the `datapath` crate (so the control plane and the RPC layer
// need not link the data plane); the modules here use them from there.
pub use datapath::{
    AttachmentConfig, AttachmentTags, ChildStats, CpuFairness, CpuFairnessConfig, DataPath,
    DataplaneConfig, DataplaneError, DataplaneStats, DispatchConfig, DispatchStats, IkeDatagram,
    Inside, InstalledChild, KnownChild, RelayConfig, Route, RouteChange, RouteChangeReport,
    RouteStats, TenantStats, ToControl, TunnelBinding, VmRoute, VnetConfig, VnetOwners,
    VnetRouteStats, WorkerStats, XdpMode, XdpStats, DEFAULT_BUSY_POLL_BUDGET,
};
pub use dataplane::{BoundAddrs, Dataplane};
pub use feature::{Direction, Feature, FeatureBatch, FeatureChain, PacketMeta};
pub use select::carries_outbound;
