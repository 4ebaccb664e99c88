//! Identifiers the provisioning model works with: tunnels and data nodes, defined once in the
//! `ids` crate.

pub use ids::{NodeId, TunnelId};
