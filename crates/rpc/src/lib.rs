//! Protego's cluster protocol: gRPC (tonic) between the active control node and its data and
//! steer nodes, over mutual TLS with the cluster's own CA (`protego certs`, [`certs`]).
//!
//! The protocol is defined in `proto/cluster.proto` (package `protego.cluster.v1`); [`pb`] is
//! the generated code. This crate adds what every participant needs around it: the cluster's PKI
//! (the development CA, node certificates, and loading and checking them: [`certs`]), TLS set-up
//! from a node's certificate files ([`tls`]), checked conversions between the messages and
//! Protego's own types ([`convert`]), and a small client/server layer ([`connect`],
//! [`serve`]) with one error type ([`RpcError`]).
//!
//! # The session
//! The main RPC is `Cluster.Session`: one bidirectional stream per node, which the node
//! opens to the active control node and keeps open. The other, `Cluster.FetchRoutes`, streams
//! the control node's per-VM route table to a data node as a snapshot in chunks of at most
//! 1 MiB ([`pb::RoutesChunk`]), on a stream of its own so that the session's directives are
//! not held up behind it; single route changes travel on the session
//! ([`pb::RouteChanges`], numbered by the table's version, which Hello and Report carry).
//! 1. The node sends [`pb::Hello`] first: its `name` and `role` (which must equal its
//!    certificate's CN and OU, or control ends the session with `PERMISSION_DENIED`; see
//!    [`verify_hello`]), its Geneve address, its packet worker count, a `boot_id` that changes
//!    at every process start (a new one means the node's tables are empty), and, for a data node
//!    reconnecting to a new active control node, the inbound SPIs of the CHILD_SAs it still
//!    holds.
//! 2. Control answers [`pb::Welcome`]: the node's id (steer tables and health reports name
//!    nodes by it), control's leadership term, the report interval and control's name.
//! 3. Control then pushes [`pb::Directive`]s, each with an id the node acknowledges with
//!    [`pb::Ack`] (an empty `error` when applied; otherwise why it was rejected, and nothing
//!    changed; `kept` when taken but not applied yet: route changes a data node receives while
//!    it fetches the route snapshot). A data node gets its whole inside configuration ([`pb::DataConfig`]) right
//!    after Welcome and whenever it changes, then CHILD_SAs to install and remove, peer address
//!    updates and the steer nodes to relay through, and the tenants' filters (each object once
//!    as [`pb::FilterObject`], then the set naming them by SHA-256, [`pb::Filters`]), the CPU
//!    fairness mode and weights, and map operations ([`pb::FilterMapRequest`], whose answer the
//!    `Ack` carries in `filter_map`); a steer node gets its whole table
//!    ([`pb::SteerTables`]) after Welcome, then incremental changes.
//! 4. The node sends a [`pb::Report`] every report interval and [`pb::NodeEvent`]s as they
//!    happen (a data node's report also carries its filters' counters and its tenants' CPU
//!    charge; events: a data node's SA needs rekeying, a peer's address moved; a steer node: a data
//!    node stopped or resumed answering its probes).
//!
//! A standby control node refuses a session with `FAILED_PRECONDITION`, naming the leader, if
//! it knows it, in the status message.
//!
//! Addresses travel as `"ip:port"` / `"[v6]:port"` strings, SPIs as their 32-bit values, tunnels
//! as the control node's tunnel numbers.
//!
//! # TLS rules
//! - Both ends hold a certificate issued by the cluster CA ([`certs::load_tls`] loads
//!   and checks a node's files). The CA is the only trust anchor: system roots are never used.
//! - The server ([`serve`], [`tls::server_tls`]) requires a client certificate that chains to
//!   the CA; a client without one, or with one from another CA, fails the handshake.
//! - The client ([`connect`]) checks the server's chain against the CA, the server name it was
//!   given against the certificate's subjectAltNames (never the CN: issue server certificates
//!   with the DNS names or IP addresses clients use, `protego certs issue --dns/--ip`), and that
//!   the certificate is a `control` node certificate (OU), since only control nodes serve this
//!   protocol.
//! - Once the handshake has verified the client's chain, the server reads who the client is
//!   from its certificate ([`peer_identity`]): the CN is the node's name and the OU its role.
//!   The Hello must say the same ([`verify_hello`]).
//! - rustls with the aws-lc-rs provider; TLS 1.3 or 1.2; ALPN `h2`.
//!
//! Secrets: directives carry CHILD_SA keys ([`pb::ChildSa`], which zeroizes them when dropped
//! and redacts them from `Debug`), only ever inside the TLS session. The node's private key is
//! copied into tonic's TLS configuration, which does not zeroize it (see [`tls`]).

pub mod certs;
pub mod convert;
mod error;
mod pb_ext;
pub mod tls;

mod client;
mod server;

use std::time::Duration;

/// How often either side of a connection sends an HTTP/2 PING (also while idle). Short, so
/// that a node notices within a few seconds a control node whose host vanished without
/// closing its connections, and turns to the standby.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// How long either side waits for a PING's answer before it drops the connection (and every
/// session on it).
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// The code generated from `proto/cluster.proto`: the messages, the `Cluster` service's
/// client ([`pb::cluster_client::ClusterClient`]) and server trait and wrapper
/// ([`pb::cluster_server::Cluster`], [`pb::cluster_server::ClusterServer`]).
///
/// [`pb::ChildSa`] holds CHILD_SA keys in plain `Vec<u8>` (prost's type): it zeroizes them when
/// dropped and its `Debug` omits them, but a clone is a second copy, so drop values promptly.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod pb {
    tonic::include_proto!("protego.cluster.v1");
}

pub use certs::{NodeIdentity, NodeRole, NodeTls};
pub use client::connect;
pub use error::{tls_failure, RpcError};
pub use server::{serve, serve_on, server, verify_hello, MAX_MESSAGE_LEN};
pub use tls::{identity_from_der, peer_identity};

pub use pb::cluster_client::ClusterClient;
pub use pb::cluster_server::{Cluster, ClusterServer};
