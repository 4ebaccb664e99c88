//! CPU fairness between tenants (issue 18 §3): token buckets in CPU cycles, one per tenant and
//! per worker, filled by Algorithm 1 of the offloading paper
//! (../shared/papers/offloading-security-services-fairness.md, §2.2) and drained by the cycles
//! each tenant's packets actually cost.
//!
//! # The algorithm
//! Each tenant `i` has a weight `w_i` (`[[tenant]] cpu_weight`, an integer ≥ 1) and so a token
//! speed `v_i = w_i / Σ w` of one core. Every interval Δt the worker generates Δt cycles of
//! tokens (the paper; a little less is better, see [`Params`]): each bucket first gets its own
//! `r_i = v_i·Δt`, capped at the bucket size B; what a full bucket could not take (the surplus
//! `r′`) is split among the buckets still below B in proportion to their speeds, capped again,
//! and so on until no surplus is left or every bucket is full; what is left then is discarded.
//! A tenant that sends little sits at B, and its share flows to the busy ones: the allocation
//! is *work-conserving*. Under overload no bucket fills, every tenant gets exactly its `r_i`,
//! and the CPU is shared by weight.
//!
//! A packet run is admitted while its tenant's bucket holds a positive number of tokens
//! ([`Buckets::admit`]); its measured cycles are subtracted afterwards ([`Buckets::charge`]), so
//! a bucket may go negative (the cost of a packet is only known once it has been processed).
//! The floor is −B: a debt clears within `2B / v_i`, and one very dear batch cannot lock a
//! tenant out for longer.
//!
//! The paper's loop needs up to one pass per bucket that fills (O(n²) in the worst case). Its
//! fixed point is a weighted *water level* λ: bucket `i` receives `min(B − b_i, w_i·λ)` with λ
//! the level at which the additions sum to what was generated (or every bucket is full). The
//! two steps of the paper (own share first, then the surplus) reach the same point, since a
//! bucket that is not full at the end received `w_i` times the same level in every pass.
//! [`Buckets::generate`] finds that level directly: one O(n) pass when no bucket would overflow
//! (the usual case under overload, where idle tenants are full and skipped), otherwise the
//! non-full buckets sorted by `(B − b_i) / w_i` and filled in that order, O(n log n). The
//! result is in integer cycles: every bucket that fills in the paper's (real-valued) algorithm
//! fills here, every other bucket gets the real value rounded up or down, and nothing is lost
//! to rounding (the tests hold it to a literal transcription of the paper's loop).
//!
//! Generating `k` intervals at once (a worker that was idle, or busy in one long batch) gives
//! the same result as `k` generations in a row with no charge in between, at the cost of one.
//!
//! # Units
//! Everything is in CPU cycles, as the data plane measures them (TSC cycles): the bucket size B,
//! the interval Δt, the tokens, the charges. Tokens are signed (`i64`) because a bucket may be in
//! debt. Time is an input ([`Buckets::tick`] takes the cycle counter's reading); this crate
//! reads no clock, does no I/O and starts no thread.
//!
//! # Why buckets per worker
//! Each data-plane worker owns a [`Buckets`] and generates one core's worth of tokens for its
//! own core. Admission and charging happen per packet run, on the hot path: with buckets shared
//! between workers every charge would be an atomic read-modify-write on a cache line that other
//! cores write too, moving the line between cores on every charge. Per worker, a charge is a
//! plain subtraction in the worker's own cache, the generation runs on the same core at a batch
//! start, and nothing is locked or shared. A tenant whose traffic spreads over several workers gets its share on each of them; a
//! tenant whose traffic lands on one worker is limited to its share of that worker's core, which
//! is what the steering (one CHILD_SA, one worker) already decides.
//!
//! # Why our own code
//! Token-bucket crates (for example `tokenbucket`, `better-bucket`) rate-limit one bucket against
//! a clock they read; none implements a work-conserving split of one budget among weighted,
//! possibly indebted buckets, which is the whole of Algorithm 1. The code here is small, pure and
//! tested against the paper's loop.

mod buckets;
#[cfg(test)]
mod oracle;
#[cfg(test)]
mod tests;
mod waterfill;

pub use buckets::{Buckets, Generation, Occupant};

use core::fmt;
use core::num::NonZeroU16;

/// The largest number of tenant slots one [`Buckets`] holds (the data plane numbers tenants
/// with a `u16`).
pub const MAX_SLOTS: usize = 1 << 16;

/// The largest bucket size B and interval Δt, in cycles: 2⁴⁰ cycles, about six minutes at
/// 3 GHz. The bound keeps every product the generation computes inside 64 bits.
pub const MAX_CYCLES: u64 = 1 << 40;

/// What this crate rejects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FairError {
    /// A tenant weight (`cpu_weight`) outside 1..=[`Weight::MAX`].
    #[error("cpu_weight = {value}: must be an integer from 1 to {max}", max = Weight::MAX.get())]
    InvalidWeight {
        /// The rejected weight.
        value: u64,
    },
    /// A bucket size or interval of zero or above [`MAX_CYCLES`], or tokens per interval of
    /// zero or above the interval.
    #[error("fairness {field} = {value} cycles: must be from 1 to {max} cycles")]
    InvalidCycles {
        /// `"bucket"` (B), `"interval"` (Δt) or `"tokens"` (per interval).
        field: &'static str,
        /// The rejected number of cycles.
        value: u64,
        /// The largest accepted.
        max: u64,
    },
    /// A slot table longer than [`MAX_SLOTS`].
    #[error("{slots} tenant slots: at most {MAX_SLOTS}")]
    TooManySlots {
        /// The table's length.
        slots: usize,
    },
}

/// A tenant's CPU weight (`[[tenant]] cpu_weight`): its token speed is its weight divided by
/// the sum of the weights of the worker's tenants, in cores. An integer from 1 to
/// [`Weight::MAX`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Weight(NonZeroU16);

impl Weight {
    /// The default weight.
    pub const ONE: Weight = Weight(NonZeroU16::MIN);
    /// The largest weight (65 535): with at most [`MAX_SLOTS`] tenants the sum of the weights
    /// stays below 2³².
    pub const MAX: Weight = Weight(NonZeroU16::MAX);

    /// The weight `value`, or [`FairError::InvalidWeight`] if it is 0 or above [`Weight::MAX`].
    pub fn new(value: u64) -> Result<Weight, FairError> {
        u16::try_from(value)
            .ok()
            .and_then(NonZeroU16::new)
            .map(Weight)
            .ok_or(FairError::InvalidWeight { value })
    }

    /// The weight as a number.
    pub const fn get(self) -> u32 {
        self.0.get() as u32
    }
}

impl Default for Weight {
    fn default() -> Weight {
        Weight::ONE
    }
}

impl fmt::Debug for Weight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "weight{}", self.0)
    }
}

impl fmt::Display for Weight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The generation's parameters, in cycles: the interval Δt between generations, the tokens
/// generated per interval (one core's worth, Δt, in the paper), and the bucket size B (the most
/// tokens a bucket holds; also the deepest debt, −B).
///
/// # Generate a little less than the worker charges
/// While a worker is saturated it charges as many cycles per interval as it works. If it
/// generates as many tokens, the sum of all tokens stays constant, and a bucket only empties if
/// its tenant spends more than it receives. But a tenant whose packets reach the worker
/// interleaved with a flood's (served in arrival order) spends only what the order lets it:
/// less than its share, so its bucket fills, work conservation hands its share to the flood,
/// and the flood, admitted, keeps its place in the order. From full buckets (a tenant that was
/// idle, or just added) the unfair split then persists, fairness on or off
/// (`tests/simulation.rs`, `as_many_tokens_as_cycles_lets_the_flood_win`). Generating a little
/// less than a saturated worker charges (for example 31/32, with [`Params::with_tokens`]) makes
/// the tokens drain under saturation: the tenant living on the surplus runs dry first, its
/// packets are refused (cheaply), the others' packets get through, and the split converges to
/// the weights (within a few `B / (Δt − tokens)` intervals). An unsaturated worker still
/// refuses nobody; a saturated one leaves the difference idle (3 % at 31/32). Cycles the data
/// plane does not charge to any tenant (polling, housekeeping) must be taken off the tokens
/// too: the tokens are a fraction of the *charged* cycles, not of the wall-clock ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    interval: u64,
    tokens: u64,
    bucket: u64,
}

impl Params {
    /// Δt = `interval` cycles and B = `bucket` cycles, both from 1 to [`MAX_CYCLES`],
    /// generating Δt tokens per interval as the paper does (the type's doc says why a data
    /// plane should generate less, with [`Params::with_tokens`]).
    ///
    /// B is usually a few Δt (the design proposes Δt = 1 ms and B = 4 ms of cycles): a tenant
    /// that was idle may then burst for B cycles, and an idle worker fills every bucket within
    /// `2B·n / Δt` intervals however deep in debt they were.
    pub fn new(interval: u64, bucket: u64) -> Result<Params, FairError> {
        let interval = check_cycles("interval", interval, MAX_CYCLES)?;
        Ok(Params {
            interval,
            tokens: interval,
            bucket: check_cycles("bucket", bucket, MAX_CYCLES)?,
        })
    }

    /// The same parameters generating `tokens` cycles of tokens per interval, from 1 to Δt.
    pub fn with_tokens(self, tokens: u64) -> Result<Params, FairError> {
        Ok(Params {
            tokens: check_cycles("tokens", tokens, self.interval)?,
            ..self
        })
    }

    /// Δt: the cycles between two generations.
    pub const fn interval(&self) -> u64 {
        self.interval
    }

    /// The tokens generated per interval, in cycles (at most Δt).
    pub const fn tokens(&self) -> u64 {
        self.tokens
    }

    /// B: the most tokens a bucket holds, in cycles.
    pub const fn bucket(&self) -> u64 {
        self.bucket
    }
}

/// `value` if it is from 1 to `max`, else [`FairError::InvalidCycles`].
fn check_cycles(field: &'static str, value: u64, max: u64) -> Result<u64, FairError> {
    if (1..=max).contains(&value) {
        Ok(value)
    } else {
        Err(FairError::InvalidCycles { field, value, max })
    }
}
