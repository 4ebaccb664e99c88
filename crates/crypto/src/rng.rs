//! Randomness as an input: protocol engines take an `&mut dyn Rng` so that simulations are
//! deterministic. [`SystemRng`] is for binaries; [`SeededRng`] for tests and simulations.

/// A source of cryptographically strong random bytes.
pub trait Rng: Send {
    /// Fills `dest` with random bytes.
    fn fill(&mut self, dest: &mut [u8]);

    /// A random `u32`.
    fn next_u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.fill(&mut b);
        u32::from_le_bytes(b)
    }

    /// A random `u64`.
    fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.fill(&mut b);
        u64::from_le_bytes(b)
    }
}

/// The operating system's CSPRNG (through aws-lc). Only binaries should construct this.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemRng;

impl Rng for SystemRng {
    fn fill(&mut self, dest: &mut [u8]) {
        aws_lc_rs::rand::fill(dest).expect("the system CSPRNG does not fail once initialised");
    }
}

/// A deterministic ChaCha20 generator for tests and simulations.
#[derive(Debug, Clone)]
pub struct SeededRng(rand_chacha::ChaCha20Rng);

impl SeededRng {
    /// A generator whose output depends only on `seed`.
    pub fn new(seed: u64) -> Self {
        use rand_core::SeedableRng;
        Self(rand_chacha::ChaCha20Rng::seed_from_u64(seed))
    }
}

impl Rng for SeededRng {
    fn fill(&mut self, dest: &mut [u8]) {
        use rand_core::RngCore;
        self.0.fill_bytes(dest);
    }
}
