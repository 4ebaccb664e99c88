//! One worker's token buckets: the tenants in dense slots, admission and charging per packet
//! run, generation every Δt (Algorithm 1, in `waterfill.rs`), and changes of the tenant table
//! that keep every other tenant's bucket.

use core::ops::AddAssign;

use crate::{waterfill, FairError, Params, Weight, MAX_SLOTS};

/// The tenant in a slot of the table given to [`Buckets::new`] and [`Buckets::set_tenants`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occupant {
    /// Who holds the slot, in the caller's numbering (for example the tenant's number, or the
    /// generation of the table in which the slot was given to it). A slot whose key changes is
    /// a new tenant and starts with a full bucket; a slot that keeps its key keeps its bucket.
    pub key: u64,
    /// The tenant's CPU weight.
    pub weight: Weight,
}

/// What one call to [`Buckets::generate`] or [`Buckets::tick`] did, in cycles. Sums with `+=`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Generation {
    /// The tokens generated: [`Params::tokens`] per elapsed interval, saturating at `u64::MAX`.
    pub generated: u64,
    /// The tokens placed in buckets.
    pub added: u64,
    /// The tokens no bucket could take: non-zero only when every tenant's bucket is full.
    pub discarded: u64,
}

impl AddAssign for Generation {
    fn add_assign(&mut self, other: Generation) {
        self.generated = self.generated.saturating_add(other.generated);
        self.added = self.added.saturating_add(other.added);
        self.discarded = self.discarded.saturating_add(other.discarded);
    }
}

/// One worker's token buckets, one per tenant slot, in cycles.
///
/// The worker calls [`tick`](Buckets::tick) with the cycle counter at a batch start (it
/// generates the intervals elapsed since the last generation), [`admit`](Buckets::admit) where
/// a packet run's tenant becomes known, and [`charge`](Buckets::charge) with the run's measured
/// cycles once they are known. A slot the buckets do not know (vacant or beyond the table) is
/// admitted and never charged: fairness applies to the tenants in the table, and a packet is
/// never dropped because a table change has not reached this worker yet.
#[derive(Debug, Clone)]
pub struct Buckets {
    params: Params,
    /// Tokens per slot, in `[−B, B]`; `B` in a vacant slot.
    tokens: Vec<i64>,
    /// Weight per slot, 0 for a vacant slot (the generation's input).
    weights: Vec<u32>,
    /// The occupant per slot, to tell a kept tenant from a new one on a table change.
    occupants: Vec<Option<Occupant>>,
    /// Scratch space of the generation.
    open: Vec<waterfill::Open>,
    /// The cycle counter at the end of the last generated interval, once `tick` has run.
    last: Option<u64>,
}

impl Buckets {
    /// Buckets for the tenants of `table` (slot `i` is `table[i]`; `None` is a vacant slot),
    /// each starting full, or [`FairError::TooManySlots`] if the table is longer than
    /// [`MAX_SLOTS`].
    pub fn new(params: Params, table: &[Option<Occupant>]) -> Result<Buckets, FairError> {
        let mut buckets = Buckets {
            params,
            tokens: Vec::new(),
            weights: Vec::new(),
            occupants: Vec::new(),
            open: Vec::new(),
            last: None,
        };
        buckets.set_tenants(table)?;
        Ok(buckets)
    }

    /// Replaces the tenant table: a slot whose occupant keeps its key keeps its tokens (with
    /// its new weight), a slot with a new occupant starts full, a vacant slot is forgotten.
    /// Nothing changes on [`FairError::TooManySlots`].
    pub fn set_tenants(&mut self, table: &[Option<Occupant>]) -> Result<(), FairError> {
        if table.len() > MAX_SLOTS {
            return Err(FairError::TooManySlots { slots: table.len() });
        }
        let full = self.bucket();
        self.tokens.resize(table.len(), full);
        self.weights.resize(table.len(), 0);
        self.occupants.resize(table.len(), None);
        for (slot, new) in table.iter().enumerate() {
            let kept =
                matches!((self.occupants[slot], new), (Some(old), Some(new)) if old.key == new.key);
            if !kept {
                self.tokens[slot] = full;
            }
            self.weights[slot] = new.map_or(0, |o| o.weight.get());
            self.occupants[slot] = *new;
        }
        Ok(())
    }

    /// Changes Δt and B. Tokens outside the new `[−B, B]` are brought to its edge.
    pub fn set_params(&mut self, params: Params) {
        self.params = params;
        let b = self.bucket();
        for t in &mut self.tokens {
            *t = (*t).clamp(-b, b);
        }
    }

    /// The parameters.
    pub fn params(&self) -> Params {
        self.params
    }

    /// The number of slots (occupied or vacant).
    pub fn slots(&self) -> usize {
        self.tokens.len()
    }

    /// The occupant of `slot`, if any.
    pub fn occupant(&self, slot: usize) -> Option<Occupant> {
        self.occupants.get(slot).copied().flatten()
    }

    /// The tokens of `slot`'s tenant, in cycles (negative when in debt), or `None` for a vacant
    /// or unknown slot.
    pub fn tokens(&self, slot: usize) -> Option<i64> {
        match self.weights.get(slot) {
            Some(&w) if w != 0 => Some(self.tokens[slot]),
            _ => None,
        }
    }

    /// Whether `slot`'s tenant may have a packet run processed now: its bucket holds more than
    /// zero tokens. Always true for a vacant or unknown slot.
    #[inline]
    pub fn admit(&self, slot: usize) -> bool {
        self.tokens.get(slot).is_none_or(|&t| t > 0)
    }

    /// Takes `cycles` from `slot`'s bucket (the measured cost of its tenant's packets, admitted
    /// or dropped), down to −B at most. Does nothing for a vacant or unknown slot.
    #[inline]
    pub fn charge(&mut self, slot: usize, cycles: u64) {
        if let (Some(t), Some(&w)) = (self.tokens.get_mut(slot), self.weights.get(slot)) {
            if w != 0 {
                let floor = -(self.params.bucket() as i64);
                let cycles = i64::try_from(cycles).unwrap_or(i64::MAX);
                *t = t.saturating_sub(cycles).max(floor);
            }
        }
    }

    /// Gives back to `slot`'s bucket `cycles` of an earlier [`charge`](Buckets::charge) that
    /// turned out not to be its tenant's (time its worker was preempted in the middle of the
    /// tenant's run), up to B at most. Does nothing for a vacant or unknown slot.
    pub fn refund(&mut self, slot: usize, cycles: u64) {
        if let (Some(t), Some(&w)) = (self.tokens.get_mut(slot), self.weights.get(slot)) {
            if w != 0 {
                let bucket = self.params.bucket() as i64;
                let cycles = i64::try_from(cycles).unwrap_or(i64::MAX);
                *t = t.saturating_add(cycles).min(bucket);
            }
        }
    }

    /// Generates `intervals` intervals of tokens ([`Params::tokens`] cycles each) by Algorithm 1. The result is
    /// that of `intervals` generations in a row with no charge in between; the cost is that of
    /// one, however many intervals passed.
    pub fn generate(&mut self, intervals: u64) -> Generation {
        let amount = u128::from(intervals) * u128::from(self.params.tokens());
        let bucket = self.bucket();
        let added = waterfill::fill(
            &mut self.tokens,
            &self.weights,
            bucket,
            amount,
            &mut self.open,
        );
        let saturate = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
        Generation {
            generated: saturate(amount),
            added,
            discarded: saturate(amount - u128::from(added)),
        }
    }

    /// Generates the tokens of the intervals elapsed by `now` (a reading of the cycle counter)
    /// since the last generation, and moves the last generation's time by whole intervals (the
    /// part of an interval left over counts toward the next). The first call only sets the
    /// origin. A reading earlier than the last generation (a counter that went backwards)
    /// generates nothing.
    pub fn tick(&mut self, now: u64) -> Generation {
        let Some(last) = self.last else {
            self.last = Some(now);
            return Generation::default();
        };
        let elapsed = now.saturating_sub(last);
        let intervals = elapsed / self.params.interval();
        if intervals == 0 {
            return Generation::default();
        }
        // intervals · Δt ≤ elapsed: no overflow.
        self.last = Some(last + intervals * self.params.interval());
        self.generate(intervals)
    }

    /// B as a signed number of cycles (B ≤ 2⁴⁰).
    fn bucket(&self) -> i64 {
        self.params.bucket() as i64
    }
}
