//! The decisions of a Protego steering node (the paper's GIN and GEN, Son et al., ATC '17,
//! §4.3 and §6.1): pure data structures, no I/O, no clock, no threads, no randomness.
//!
//! A steer node owns the public VIP. Inbound IKE goes to the active control node; inbound ESP
//! goes to the data node that holds the SPI ([`SpiTable`]); VXLAN from cloud hosts goes to the
//! data node that holds the outbound SA for the packet's VNI and inner flow
//! ([`SelectorTable`]); a customer's tagged frame on a customer-facing port goes to the data
//! node serving the attachment of its tags ([`PortTable`]). Every tunnel has a rate limit ([`TokenBucket`], [`RateLimiters`],
//! §4.3 "Rate limiting"), and failure of data nodes is detected from probes riding on a sample
//! of forwarded packets plus explicit probes of idle nodes ([`HealthMonitor`], §4.3 "GPN
//! failure detection", §6.1, §7.1).
//!
//! Steering is stateless: the forwarding decision depends only on the tables and the packet,
//! so two steer nodes holding the same tables may run side by side. The tables are `Clone`
//! snapshots the I/O layer builds off the hot path and swaps in whole. Rate limiters and the
//! health monitor hold per-node state; with several steer nodes each keeps its own. A
//! tunnel's limit holds for the tunnel as a whole: the control node divides it among the live
//! steer nodes by the traffic each reports ([`RateShares`], re-divided after every report),
//! and each node enforces its share.
//!
//! Time is always an explicit `now: Instant` argument, as in the other protocol crates.
//!
//! The per-packet tables (SPIs, VNIs, tunnels, tag pairs) hash with `rustc-hash`'s `FxHasher`, not
//! SipHash: their keys are chosen by the control node, never by a peer, so a table cannot be
//! flooded with colliding keys (a peer only chooses which key is looked up), and no hash value
//! leaves the process, so it need be neither keyed nor stable across versions.

pub mod attach;
mod error;
pub mod health;
mod ids;
pub mod rate;
pub mod selector;
pub mod share;
pub mod spi;

pub use attach::{AttachEntry, PortKey, PortTable};
pub use error::SteerError;
pub use health::{HealthConfig, HealthMonitor, HealthStats, NodeStatus, ReplyOutcome};
pub use ids::{AttachmentId, NodeId, PortId, ProbeId, TunnelId};
pub use rate::{RateLimit, RateLimiters, TokenBucket, TunnelCounters};
pub use selector::{
    AddrRange, Flow, IndexStats, PortRange, Selector, SelectorEntry, SelectorTable,
};
pub use share::{
    burst_bytes, Direction, RateShares, Share, ShareBatch, ShareConfig, TunnelLimit, TunnelUsage,
    Usage,
};
pub use spi::{SpiEntry, SpiTable};
