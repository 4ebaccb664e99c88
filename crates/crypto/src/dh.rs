//! Key exchange groups: MODP-2048 (RFC 3526 §3), ECP-256 and ECP-384 (RFC 5903, public value x|y
//! without point-format octet, shared secret = x), Curve25519 (RFC 8031). Private keys come from
//! the caller's [`Rng`](crate::Rng) so that engines stay deterministic under simulation.

use crate::{error::Error, transform::KeId, Rng};
use zeroize::Zeroizing;

/// A supported key exchange group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DhGroup {
    /// Group 14: 2048-bit MODP.
    Modp2048,
    /// Group 19: 256-bit random ECP.
    Ecp256,
    /// Group 20: 384-bit random ECP.
    Ecp384,
    /// Group 31: Curve25519.
    Curve25519,
}

impl DhGroup {
    /// The group for an IANA transform ID, if supported.
    pub fn from_id(id: KeId) -> Option<Self> {
        todo!("{id:?}")
    }

    /// The IANA transform ID (KE payload "Diffie-Hellman Group Num").
    pub fn id(self) -> KeId {
        todo!()
    }

    /// Length in bytes of a public value in the KE payload (256, 64, 96, 32).
    pub fn public_len(self) -> usize {
        todo!()
    }
}

/// One side's ephemeral key pair for a key exchange.
pub struct KeyExchange {
    group: DhGroup,
    // implementation-defined private state (zeroized on drop)
}

impl core::fmt::Debug for KeyExchange {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("KeyExchange").field("group", &self.group).finish_non_exhaustive()
    }
}

impl KeyExchange {
    /// Generates a key pair, drawing the private key from `rng`.
    pub fn generate(group: DhGroup, rng: &mut dyn Rng) -> Self {
        todo!("{group:?} {}", rng.next_u32())
    }

    /// The group.
    pub fn group(&self) -> DhGroup {
        self.group
    }

    /// Our public value, encoded as the KE payload carries it.
    pub fn public_value(&self) -> Vec<u8> {
        todo!()
    }

    /// The shared secret g^ir with the peer's public value (validated: length, range, on curve,
    /// not the identity / all-zero result).
    pub fn shared_secret(&self, peer_public: &[u8]) -> Result<Zeroizing<Vec<u8>>, Error> {
        todo!("{}", peer_public.len())
    }
}
