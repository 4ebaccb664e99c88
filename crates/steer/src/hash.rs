//! A fast hasher for the small integer keys of the steering tables (SPIs, VNIs, tunnels).
//!
//! The keys are chosen by the control node, never by a peer, so the table cannot be flooded
//! with colliding keys; a peer only chooses which key is looked up. SipHash's protection is
//! therefore not needed on the per-packet path, and a 64-bit mix (the SplitMix64 finaliser)
//! spreads sequential or aligned values over all bits, low and high.

use core::hash::{BuildHasherDefault, Hasher};

/// Builds [`IdHasher`]s.
pub(crate) type IdBuildHasher = BuildHasherDefault<IdHasher>;

/// Hashes integer ids (see the module docs).
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl IdHasher {
    fn add(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.add(u64::from(v));
    }

    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::hash::BuildHasher;

    #[test]
    fn aligned_keys_spread_over_low_bits() {
        let b = IdBuildHasher::default();
        let mut buckets = [0u32; 64];
        for i in 0..6400u32 {
            buckets[(b.hash_one(i << 12) & 63) as usize] += 1;
        }
        assert!(buckets.iter().all(|&n| n > 50 && n < 150), "{buckets:?}");
    }
}
