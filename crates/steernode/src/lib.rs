//! The Protego steer node (the paper's GIN and GEN, Son et al., ATC '17, §4.3 and §6.1;
//! docs/architecture.md, "The picture"): the process that owns the public VIPs and forwards between peers, cloud
//! hosts and the control and data nodes, over the decisions of the `steer` crate.
//!
//! Sockets:
//! - each VIP's IKE (500) and NAT-T (4500) socket, bound to the VIP itself;
//! - an underlay VTEP socket (4789) cloud hosts send VXLAN to;
//! - an underlay Geneve socket (6081) for frames to and from data and control nodes.
//!
//! Forwarding (every frame between nodes is Geneve, RFC 8926, whose payload is the whole
//! IP/UDP datagram as received, rebuilt with [`wire::relay`]: inner source = the sender,
//! inner destination = our socket it arrived on):
//! - IKE on 500, and on 4500 after the non-ESP marker, to the active control node; NAT
//!   keepalives are dropped (counted, not an error).
//! - ESP on 4500 by SPI to the data node holding the SA, charged to the tunnel's inbound
//!   rate limit, with the tunnel id option attached.
//! - VXLAN from hosts by (VNI, inner flow) selector to the data node holding the outbound SA,
//!   charged to the tunnel's outbound rate limit, with the tunnel id option (and the VNI in
//!   the Geneve header); ARP, IPv6 neighbour discovery and packets to the VNet's gateway to
//!   every live neighbour node of the VNI.
//! - Customers' tagged frames on a customer-facing port by tag pair to the data node serving
//!   the attachment, or, for a CE's IP packet one of the VNet's tunnel selectors takes, to the
//!   tunnel's node, charged to the tunnel's outbound rate limit like the hosts' VXLAN; frames
//!   from data nodes out of the port. Each attachment's frames and drops are counted
//!   ([`AttachmentStats`]).
//! - From a known data or control node: a relayed datagram whose inner source is one of our
//!   VIP sockets is sent from that socket to its inner destination; probe replies go to the
//!   failure detector.
//! - Health: forwarded frames carry probes as the `steer` crate's monitor samples them; idle
//!   nodes get explicit probes (Geneve control frames); deaths, and dead nodes answering
//!   again, are reported as [`SteerEvent`]s. Nothing is forwarded to a dead node.
//!
//! Every decision depends only on the tables and the datagram, so two steer nodes with the
//! same tables can run side by side (each keeps its own probes, and its own rate-limit
//! buckets, filled at the share of each tunnel's limit the control node gives it).
//! Anything malformed or unexpected is dropped and counted by [`DropReason`], never a panic.

mod classify;
mod config;
mod error;
mod forward;
mod health;
mod hold;
mod limits;
mod node;
mod stats;
mod sys;
mod tables;

pub use config::{PortSpec, SteerConfig, MAX_BATCH};
pub use error::SteerNodeError;
pub use health::SteerEvent;
pub use node::{LocalAddrs, PortInfo, SteerNode};
pub use stats::{
    AttachmentStats, DropReason, DropStats, ForwardKind, ForwardStats, SteerStats, TunnelStats,
};
pub use tables::{SteerTables, VniSteering};
