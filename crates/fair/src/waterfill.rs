//! One generation of Algorithm 1 (paper §2.2) as weighted water-filling, in integer cycles.
//!
//! Bucket `i` has room `c_i = B − b_i` (zero when full or vacant) and weight `w_i`. The paper's
//! two steps end where every bucket holds `b_i + min(c_i, w_i·λ)` for one level λ, the level at
//! which the additions sum to the generated amount G, or every bucket is full when even the sum
//! of the rooms is below G. Buckets with a small `c_i / w_i` fill first; once the smallest ratio
//! left is above the level that what remains would give, no other bucket fills and the remainder
//! is split by weight.
//!
//! Bounds that keep the arithmetic in range (checked where the inputs enter, in `lib.rs` and
//! `buckets.rs`): `B ≤ 2⁴⁰` so `c_i ≤ 2⁴¹`; `w_i ≤ 65 535` and at most 65 536 slots so
//! `Σ w < 2³²`. Then `c_i·w_j < 2⁵⁷` and `Σw · remainder < 2⁶⁴`.

/// A bucket that can take tokens, as the generation sees it (packed, so that the sort and the
/// split read one array in order).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Open {
    room: u64,
    weight: u32,
    slot: u32,
}

/// Adds up to `amount` cycles of tokens to `tokens` as one generation of Algorithm 1 with speeds
/// proportional to `weights` (0 = a vacant slot, which gets nothing), each bucket capped at
/// `bucket`. Returns the tokens added; the rest of `amount` is what the algorithm discards (only
/// when every occupied bucket is full). `open` is scratch space, kept by the caller so that a
/// generation allocates nothing once it has grown.
///
/// Every bucket gets `min(room, w_i·λ)` rounded down or up to a whole cycle, never above its
/// room; the rounding is cumulative (over the slots in order when no bucket fills, else over
/// the ones left open in the order of room per weight), so the additions sum exactly to
/// `min(amount, Σ room)`.
pub(crate) fn fill(
    tokens: &mut [i64],
    weights: &[u32],
    bucket: i64,
    amount: u128,
    open: &mut Vec<Open>,
) -> u64 {
    // Pass 1: the buckets that can take tokens, their weight and room.
    open.clear();
    let mut weight_open: u64 = 0;
    let mut room_total: u64 = 0;
    for (slot, (&t, &w)) in tokens.iter().zip(weights).enumerate() {
        // `t ≥ −B` and `B ≤ 2⁴⁰`: the room is at most 2⁴¹; above B means full.
        let room = bucket.saturating_sub(t).max(0) as u64;
        if w != 0 && room > 0 {
            weight_open += u64::from(w);
            room_total += room;
            open.push(Open {
                room,
                weight: w,
                slot: slot as u32,
            });
        }
    }
    if room_total == 0 {
        return 0;
    }
    if amount >= u128::from(room_total) {
        // Everything fits: every bucket fills, the rest is discarded.
        for o in open.iter() {
            tokens[o.slot as usize] = bucket;
        }
        return room_total;
    }
    // `amount < room_total ≤ 2⁵⁷`.
    let amount = amount as u64;

    // Does any bucket overflow at the level amount / weight_open? None does on an overloaded
    // worker (idle tenants are full and skipped, busy ones have room for their share): then the
    // split by weight is the answer, in O(n).
    let overflows = |o: &Open| {
        u128::from(amount) * u128::from(o.weight) > u128::from(o.room) * u128::from(weight_open)
    };
    if !open.iter().any(overflows) {
        spread(tokens, open, amount, weight_open);
        return amount;
    }

    // Some buckets fill: order the open ones by room per weight, fill them while their room is
    // within what the level gives them, and spread the rest.
    open.sort_unstable_by(|a, b| {
        let ra = a.room * u64::from(b.weight);
        let rb = b.room * u64::from(a.weight);
        ra.cmp(&rb).then(a.slot.cmp(&b.slot))
    });
    let mut left = amount;
    let mut weight_left = weight_open;
    let mut filled = 0;
    for o in open.iter() {
        // Fills when room ≤ left · w / weight_left (exactly, in 128 bits).
        if u128::from(o.room) * u128::from(weight_left) > u128::from(left) * u128::from(o.weight) {
            break;
        }
        tokens[o.slot as usize] = bucket;
        // room ≤ left·w/weight_left ≤ left: no underflow.
        left -= o.room;
        weight_left -= u64::from(o.weight);
        filled += 1;
    }
    // `amount < room_total` leaves at least one bucket open (filling them all would take
    // `room_total` tokens); the check keeps a broken invariant from dividing by zero.
    if weight_left > 0 {
        spread(tokens, &open[filled..], left, weight_left);
        amount
    } else {
        amount - left
    }
}

/// Splits `amount` among the buckets `open` by weight (`weight_total` = their sum, > 0 and
/// < 2³²), with cumulative rounding: bucket `j` gets `amount·w_j / weight_total` rounded down or
/// up, and the shares sum exactly to `amount`. The caller guarantees no share exceeds a room
/// (each room is at least the real share, so also at least its rounding up).
fn spread(tokens: &mut [i64], open: &[Open], amount: u64, weight_total: u64) {
    let per_weight = amount / weight_total;
    let remainder = amount % weight_total;
    let divide = Divider::new(weight_total);
    let mut weight_before: u64 = 0;
    let mut given_before: u64 = 0;
    for o in open {
        let w = u64::from(o.weight);
        weight_before += w;
        // weight_before ≤ weight_total < 2³² and remainder < weight_total: below 2⁶⁴.
        let given = divide.quotient(weight_before * remainder);
        let share = per_weight * w + (given - given_before);
        given_before = given;
        // share ≤ room ≤ 2⁴¹.
        tokens[o.slot as usize] += share as i64;
    }
}

/// Division by one divisor `d` < 2³² many times, by a multiplication with its reciprocal and
/// one correction (a hardware division costs several times more, once per tenant).
struct Divider {
    d: u64,
    /// ⌊2⁶⁴ / d⌋, or 0 for d = 1 (then the quotient is the dividend).
    reciprocal: u64,
}

impl Divider {
    fn new(d: u64) -> Divider {
        let reciprocal = if d > 1 {
            // d ≥ 2: the quotient is below 2⁶³.
            ((1u128 << 64) / u128::from(d)) as u64
        } else {
            0
        };
        Divider { d, reciprocal }
    }

    /// ⌊n / d⌋. With m = ⌊2⁶⁴/d⌋ = 2⁶⁴/d − e (0 ≤ e < 1), `n·m / 2⁶⁴` = `n/d − n·e/2⁶⁴`
    /// is below the quotient by less than one, so its floor is the quotient or one less.
    fn quotient(&self, n: u64) -> u64 {
        if self.d <= 1 {
            return n;
        }
        let q = ((u128::from(n) * u128::from(self.reciprocal)) >> 64) as u64;
        // q ≤ n/d: no underflow.
        if n - q * self.d >= self.d {
            q + 1
        } else {
            q
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Divider;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn divider_divides(d in 1u64..1 << 32, n in any::<u64>()) {
            prop_assert_eq!(Divider::new(d).quotient(n), n / d);
        }
    }

    #[test]
    fn divider_edges() {
        for d in [1u64, 2, 3, 7, (1 << 32) - 1, 1 << 31] {
            let div = Divider::new(d);
            for n in [0u64, 1, d - 1, d, d + 1, u64::MAX - 1, u64::MAX] {
                assert_eq!(div.quotient(n), n / d, "{n} / {d}");
            }
        }
    }
}
