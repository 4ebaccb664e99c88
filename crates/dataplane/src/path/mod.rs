//! The packet paths, written over batches so the stages can later be split across cores
//! (dispatcher by SPI / selector, workers, sender): each function takes one datagram or packet
//! of a received batch and appends what it produces to the worker's send batch.
//!
//! - [`underlay`]: datagrams on the IKE and NAT-T sockets (RFC 3948): IKE to the control
//!   plane, ESP opened and handed to its inside interface.
//! - [`vxlan`]: the VNet side (RFC 7348): frames from hosts (ARP, ND, IP to the gateway) and
//!   delivery of decrypted packets to VMs.
//! - [`relay`]: relay mode, Geneve frames from and to steer nodes (docs/architecture.md, "The picture").
//! - [`seal`]: outbound ESP toward the peer (or, in relay mode, a steer node).
//! - [`tun`]: the TUN side.

pub(crate) mod relay;
pub(crate) mod seal;
pub(crate) mod tun;
pub(crate) mod underlay;
pub(crate) mod vxlan;

#[cfg(test)]
mod tests;
