//! The packet pipeline's processing stages, VPP-graph style (docs/architecture.md, "The
//! pipeline"). Each stage is a module with one kind of input and one kind of output; a stage
//! imports only the shared state it reads (`tables`, `stats`, `out`, `shared`) and the stages
//! before it, never those after it; [`graph`] wires them per lane:
//!
//! - [`classify`]: a received datagram -> ESP for [`open`], VXLAN for [`decap`], or handled
//!   (IKE to the control plane, keepalives, relay probes).
//! - [`open`]: ESP -> a decrypted inner packet inside its CHILD_SA's selectors.
//! - [`decap`]: VXLAN -> an IP packet to the gateway, or ARP/ND for the VNet's L2 side.
//! - the tenant's feature chain ([`crate::feature`]), per direction.
//! - [`seal`]: an outbound inner packet -> its CHILD_SA chosen, ESP sealed into the send batch.
//! - [`encap`]: an inbound inner packet -> VXLAN toward the VM's host (or the TUN device);
//!   ARP/ND answers and neighbour housekeeping.
//!
//! - [`attach`]: frames from customers' edge routers attached at L2 (VLAN / Q-in-Q) -> their
//!   attachment, ARP/ND answered, tags stripped -> encap into the VNet; and VNet packets for
//!   prefixes behind a CE -> tagged frames toward it.
//!
//! The input and output stages, which alone touch sockets, are in [`crate::io`].

pub(crate) mod attach;
pub(crate) mod charge;
pub(crate) mod classify;
pub(crate) mod decap;
pub(crate) mod encap;
pub(crate) mod graph;
pub(crate) mod open;
pub(crate) mod seal;

#[cfg(test)]
mod tests;
