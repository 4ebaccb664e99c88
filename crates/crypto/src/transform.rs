//! The IANA transform registry (RFC 7296 §3.3.2) as the crypto crate reads it. The registries
//! are defined once, with the IKEv2 codec (`wire::ike`); this module re-exports them so that
//! the algorithm types here (`Encr`, `Prf`, `Integ`, key exchange groups) name their IDs.

pub use wire::ike::{EncrId, EsnId, IntegId, KeId, PrfId, TransformType, ATTR_KEY_LENGTH};
