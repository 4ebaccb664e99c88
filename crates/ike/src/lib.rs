//! A sans-IO IKEv2 engine (RFC 7296) with pre-shared-key authentication, CHILD_SA negotiation,
//! rekeying, dead peer detection and NAT traversal (RFC 7296 §2.23, RFC 3948).
//!
//! The [`Endpoint`] owns every IKE SA of a node. It never touches a socket, a clock or the OS RNG:
//! the caller feeds it datagrams and the current time and drains what it wants to do.
//!
//! # Driving an endpoint
//! 1. Feed input: [`Endpoint::handle_datagram`] for every IKE datagram received (on port 4500 the
//!    caller strips the 4-byte non-ESP marker first), [`Endpoint::handle_timeout`] when the instant
//!    returned by [`Endpoint::poll_timeout`] has passed, and commands such as [`Endpoint::initiate`].
//! 2. After any input, drain in this order until each returns `None`:
//!    [`Endpoint::poll_event`] (SA lifecycle events, including CHILD_SA keys for the data
//!    path: install them before anything below is sent, because a datagram of this round may
//!    let the peer use the new SA at once), then, for a node whose IKE SAs must survive a
//!    restart, [`Endpoint::take_state_changes`] (write them durably before sending: a response
//!    must not leave before the state it depends on), then [`Endpoint::poll_transmit`]
//!    (datagrams to send;
//!    on port 4500 the caller prepends the marker, except to the one-byte NAT keepalive
//!    `0xFF`), then read [`Endpoint::poll_timeout`] for the next wake-up.
//! 3. At any time, [`Endpoint::stats`] counts every received datagram that was dropped or
//!    refused, by [`IkeDrop`] reason (for status documents and metrics).
//!
//! # Structure
//! `endpoint` demultiplexes by SPI and runs the stateless IKE_SA_INIT front; `sa` holds one
//! IKE SA (message IDs, retransmission, the request slot and queue of pending exchanges,
//! timers); `init`, `auth`, `child`, `ike_rekey` and `info` implement the exchanges for both
//! roles; `proposal` and `keys` are negotiation and key derivation; `snapshot` serialises an
//! IKE SA for a store, a standby or a restart ([`Endpoint::restore_aged`]).

mod auth;
mod child;
pub mod config;
mod endpoint;
pub mod error;
pub mod event;
mod ike_rekey;
mod info;
mod init;
mod keys;
mod proposal;
mod protect;
mod rules;
mod sa;
mod snapshot;
mod stats;
mod timer;

#[cfg(test)]
mod unit_tests;

pub use config::{
    DpdAction, EndpointConfig, EspProposal, Identity, IkeProposal, PeerConfig, StartAction,
    TrafficSelector, TunnelId, DEFAULT_RESOURCE_SAS,
};
pub use endpoint::Endpoint;
pub use error::Error;
pub use event::{
    ChildKeys, ChildSaInfo, ChildSaStatus, DeleteReason, Event, IkeSaState, IkeSaStatus, IkeSpis,
    StateChange,
};
pub use stats::{IkeDrop, IkeStats};
