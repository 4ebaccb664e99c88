//! Protego's distributed form (docs/architecture.md, "The picture", "Moving tunnels"): separate control, data and steer nodes.
//!
//! - [`core`]: the control node's registry of nodes, placement of CHILD_SAs on data nodes,
//!   the steer nodes' tables, and the moves (migration, drain, data node failover), as a
//!   state machine without I/O.
//! - [`manager`]: the shell around the core (links, locks, waits, protobuf). It is the
//!   [`dataplane::DataPath`] the IKE control loop drives.
//! - [`service`]: the control node's gRPC service (one session per node, mutual TLS).
//! - [`ike_relay`]: IKE between the control node and the steer nodes, inside Geneve.
//! - [`agent`]: the node side of a session; [`data_node`]: `protego data`.
//! - [`node_config`]: the data and steer nodes' configuration file.
//! - [`provider`]: node providers, which start and stop data nodes for the autoscaler.
//! - [`steer_node`]: `protego steer`; [`control_node`]: `protego control`.
//! - [`election`]: which control node is active (the holder of an etcd lease), and [`peers`]:
//!   the control nodes' addresses, for a faster takeover.

pub mod agent;
mod capacity;
pub mod control_node;
pub mod core;
pub mod data_node;
pub mod election;
pub mod ike_relay;
pub mod link;
pub mod manager;
mod metrics;
pub mod node_config;
pub mod peers;
pub mod provider;
mod route_follow;
pub mod service;
pub mod steer_node;

pub use manager::{Cluster, ClusterError, Registration, Role};
