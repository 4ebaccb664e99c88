//! The Protego data plane on one node: UDP sockets for IKE (500) and ESP-in-UDP (4500, RFC 3948)
//! with batched I/O, ESP processing over the `esp` crate, and the inside interfaces — VXLAN
//! (RFC 7348) toward cloud hosts, where the gateway is each VNet's router, or a TUN device.
//!
//! The control plane drives it through [`DataPath`], the same interface a remote data node will
//! implement over gRPC later; IKE datagrams and data-path requests flow back as [`ToControl`].

mod api;

pub use api::{
    ChildStats, DataPath, DataplaneConfig, DataplaneError, DataplaneStats, IkeDatagram, Inside,
    Route, ToControl, TunnelBinding, VnetConfig,
};
