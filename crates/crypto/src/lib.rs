//! Cryptographic building blocks for Protego: the IANA transform registry (RFC 7296 §3.3.2,
//! IANA "IKEv2 Transform Attribute Types"; defined once in `wire::ike`, re-exported in
//! [`transform`]), PRFs and prf+ (RFC 7296 §2.13), key exchange groups
//! (RFC 3526 MODP-2048, RFC 5903 ECP-256/384, RFC 8031 Curve25519) and the keyed ciphers used by
//! both the IKE SK payload (RFC 7296 §3.14, RFC 5282) and ESP (RFC 4303, RFC 4106, RFC 7634,
//! RFC 3602 + RFC 4868).
//!
//! This crate does no I/O, reads no clock and draws randomness only from a caller-supplied
//! [`Rng`].

pub mod cipher;
pub mod dh;
pub mod error;
pub mod prf;
pub mod rng;
pub mod transform;

pub use cipher::{Encr, Integ, SaCipher};
pub use dh::{DhGroup, KeyExchange};
pub use error::Error;
pub use prf::Prf;
pub use rng::{Rng, SeededRng, SystemRng};

#[cfg(test)]
mod test_vectors;
