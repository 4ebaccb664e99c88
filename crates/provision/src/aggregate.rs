//! The aggregate usage Y = U_1 * U_2 * … * U_n (the paper's §5.3, "Aggregated traffic
//! distribution"), the least capacity C with `Pr(Y > C) <= ε`, and the number of nodes to
//! reserve, `⌈C / T_H⌉`.
//!
//! **Lattice.** Tunnels may have different caps σ_i and so different bin widths. All U_i are
//! first put on one lattice of step `h` (by default the widest bin width of any histogram, so
//! no tunnel spans more than its own number of bins): a bin's mass at usage `v` goes to the two
//! lattice points around `v`, split in proportion to the distance (it lands whole on a point
//! when `v` is one, which is always the case when every tunnel has the same σ and bins). The
//! split keeps each U_i's mean exactly and adds at most `h² / 4` to its variance.
//!
//! **Method.** With n = 10 000 tunnels of 100 bins, Y spans about 10⁶ lattice points.
//! Folding the U_i in one by one with direct convolution costs about `n² · bins² / 2`
//! ≈ 5·10¹¹ multiplications; one FFT per U_i at Y's full length is no better (10⁴ transforms
//! of 10⁶ points). [`aggregate`] instead convolves pairwise in a balanced tree (always the two
//! shortest partial sums first, as in Huffman coding), using direct convolution while one side
//! is short and an FFT (both real vectors in one complex transform, `(A + iB)²`) when both are
//! long, and **trims each partial sum's tails** to at most 10⁻¹³ of probability at each end.
//! By the central limit theorem a partial sum of m tunnels is only about `√m` tunnel-widths
//! wide where it has mass, so trimming keeps the upper levels of the tree short: the whole
//! aggregate costs about `n · bins · log²` operations instead of `n² · bins²`.
//!
//! **Precision.** Mass is never lost silently. A distribution carries, beside its masses,
//! `beyond`: the probability that was trimmed from the upper tail, or that the FFT's rounding
//! noise made impossible to tell from zero (entries below a bound of a few machine epsilons
//! per FFT level are zeroed), and it is counted as lying *above* every value. Mass trimmed
//! from the lower tail is moved up to the lowest kept value. Both are conservative: the
//! computed `Pr(Y > C)` is never below the true one by more than the FFT's rounding noise
//! (about 10⁻¹⁵ per entry), and it is above it by at most `beyond`, about 10⁻¹³ per
//! convolution (≤ 10⁻⁹ for 10 000 tunnels), far below any useful ε.
//!
//! **Capacity at a tie.** So [`Distribution::capacity`] on [`aggregate`]'s Y is the exact
//! capacity except where the exact `Pr(Y > x)` at a lattice point `x` lies within that
//! tolerance of ε: from `ε − beyond` (less rounding) up to ε the tree counts `x` as exceeded
//! and takes a higher point; within rounding above ε it may take `x`. Ties are not rare:
//! histograms of a few dozen samples give tail probabilities such as 1/100 or 1/20 that equal
//! ε exactly, and `beyond` is never below the masses' rounding deficit (`1 − Σ masses`, a few
//! 2⁻⁵³), so at such a tie the tree typically reserves one lattice step more.
//!
//! [`aggregate_exact`] folds the U_i one by one with direct convolution and trims nothing: it
//! is the reference the tests compare [`aggregate`] with, usable for up to a few hundred
//! tunnels.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::error::ProvisionError;
use crate::fft::{convolve_direct, Fft};
use crate::usage::UsageHistogram;

/// Probability trimmed at most from each end of a partial sum after each convolution.
const TAIL_MASS: f64 = 1e-13;

/// The most lattice points one tunnel's usage may span (guards against a tiny step).
const MAX_POINTS_PER_TUNNEL: f64 = (1u64 << 24) as f64;

/// Below this length on either side, convolution is direct.
const DIRECT_MAX_SHORT_SIDE: usize = 48;

/// Relative tolerance when matching a usage to a lattice point.
const LATTICE_TOLERANCE: f64 = 1e-9;

/// A distribution on the lattice `{0, h, 2h, …}`: masses at consecutive points from
/// `offset · h`, plus `beyond`, mass known only to lie above the last point (see the module
/// docs). Y is never above [`Distribution::top_value`], the sum of the caps.
#[derive(Debug, Clone, PartialEq)]
pub struct Distribution {
    step: f64,
    offset: usize,
    masses: Vec<f64>,
    beyond: f64,
    top: usize,
}

impl Distribution {
    /// The lattice step `h`.
    pub fn step(&self) -> f64 {
        self.step
    }

    /// The lattice index of the first mass.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The masses at lattice points `offset`, `offset + 1`, …
    pub fn masses(&self) -> &[f64] {
        &self.masses
    }

    /// Mass not held in [`Distribution::masses`], counted as lying above every value.
    pub fn beyond(&self) -> f64 {
        self.beyond
    }

    /// The usage at lattice index `index`.
    pub fn value(&self, index: usize) -> f64 {
        index as f64 * self.step
    }

    /// The most Y can be: every tunnel at its cap (on the lattice, rounded up).
    pub fn top_value(&self) -> f64 {
        self.value(self.top)
    }

    /// `E[Y]`, with [`Distribution::beyond`] counted at [`Distribution::top_value`].
    pub fn mean(&self) -> f64 {
        let held: f64 = self
            .masses
            .iter()
            .enumerate()
            .map(|(k, &m)| m * self.value(self.offset + k))
            .sum();
        held + self.beyond * self.top_value()
    }

    /// `Pr(Y > x)`, with [`Distribution::beyond`] counted as above `x` unless `x` is at least
    /// the top value.
    pub fn exceedance(&self, x: f64) -> f64 {
        if x.is_nan() {
            return 1.0;
        }
        if x >= self.top_value() {
            return 0.0;
        }
        if x < 0.0 {
            return (self.masses.iter().sum::<f64>() + self.beyond).min(1.0);
        }
        // The highest lattice index whose value is at most x.
        let at_most = (x / self.step + LATTICE_TOLERANCE).floor();
        let first_above = at_most as usize + 1;
        let skip = first_above.saturating_sub(self.offset);
        let above: f64 = self.masses.iter().skip(skip).sum();
        (above + self.beyond).min(1.0)
    }

    /// The least capacity `C` (a lattice value) with `Pr(Y > C) <= epsilon`. When
    /// [`Distribution::beyond`] alone exceeds `epsilon`, the top value (every tunnel at its
    /// cap), which Y never exceeds. Rejects `epsilon` outside `[0, 1)`.
    pub fn capacity(&self, epsilon: f64) -> Result<f64, ProvisionError> {
        if !(0.0..1.0).contains(&epsilon) {
            return Err(ProvisionError::InvalidEpsilon { value: epsilon });
        }
        // `above` is Pr(Y > value(offset + k)) while walking k down from the last point.
        let mut above = self.beyond;
        if above > epsilon {
            return Ok(self.top_value());
        }
        for (k, &m) in self.masses.iter().enumerate().rev() {
            if above + m > epsilon {
                return Ok(self.value(self.offset + k));
            }
            above += m;
        }
        // Everything held fits under epsilon: only rounding makes this reachable.
        Ok(0.0)
    }
}

/// The least capacity `C` with `Pr(Y > C) <= epsilon` (see [`Distribution::capacity`]).
pub fn capacity(y: &Distribution, epsilon: f64) -> Result<f64, ProvisionError> {
    y.capacity(epsilon)
}

/// The nodes to reserve (active + inactive) for a capacity `c` in node units and a hotspot
/// threshold `t_h`: `⌈c / t_h⌉` (§5.3: "the number of VMs it reserves should be higher than
/// C/T_H"). A quotient within 10⁻⁹ above an integer counts as that integer, so that rounding
/// in `c` does not add a node. Saturates at `u32::MAX`.
pub fn reserve_nodes(c: f64, t_h: f64) -> Result<u32, ProvisionError> {
    if !(c.is_finite() && c >= 0.0) {
        return Err(ProvisionError::InvalidCapacity { value: c });
    }
    if !(t_h > 0.0 && t_h <= 1.0) {
        return Err(ProvisionError::InvalidThreshold { value: t_h });
    }
    let nodes = (c / t_h - 1e-9).ceil().max(0.0);
    Ok(if nodes >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        nodes as u32
    })
}

/// The default lattice step for a set of histograms: the widest bin width among them (1 when
/// there are none).
pub fn lattice_step<'a>(histograms: impl IntoIterator<Item = &'a UsageHistogram>) -> f64 {
    histograms
        .into_iter()
        .map(UsageHistogram::step)
        .fold(None, |widest: Option<f64>, step| {
            Some(widest.map_or(step, |w| w.max(step)))
        })
        .unwrap_or(1.0)
}

/// Y, the distribution of the sum of independent tunnels with the given usage histograms, on
/// the lattice of [`lattice_step`] (see the module docs for method and precision). No
/// histograms give Y = 0.
///
/// Against [`aggregate_exact`], `Pr(Y > x)` is at most rounding noise below and at most
/// [`Distribution::beyond`] plus rounding noise above (except at points below the lowest kept
/// one, where it is within 10⁻¹³ per convolution of 1). `capacity(ε)` is therefore the same,
/// except that it may be higher by the lattice points where the exact `Pr(Y > x)` is in
/// `[ε − beyond − noise, ε]`, or lower by those where it is within noise above ε (see the
/// module docs, "Capacity at a tie").
pub fn aggregate<'a>(
    histograms: impl IntoIterator<Item = &'a UsageHistogram> + Clone,
) -> Result<Distribution, ProvisionError> {
    let step = lattice_step(histograms.clone());
    aggregate_with_step(histograms, step)
}

/// [`aggregate`] on a lattice of step `step` (finite, above zero, and not so small that one
/// tunnel spans more than 2²⁴ points).
pub fn aggregate_with_step<'a>(
    histograms: impl IntoIterator<Item = &'a UsageHistogram>,
    step: f64,
) -> Result<Distribution, ProvisionError> {
    check_step(step)?;
    let mut top = 0usize;
    let mut parts: Vec<Option<Part>> = Vec::new();
    for histogram in histograms {
        let (part, part_top) = leaf(histogram, step)?;
        top = top.saturating_add(part_top);
        parts.push(Some(part));
    }
    let mut fft = Fft::new();
    // Always merge the two shortest partial sums (ties: the older first).
    let mut queue: BinaryHeap<Reverse<(usize, usize)>> = parts
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.as_ref().map(|p| Reverse((p.masses.len(), i))))
        .collect();
    while queue.len() > 1 {
        let (Some(Reverse((_, i))), Some(Reverse((_, j)))) = (queue.pop(), queue.pop()) else {
            break;
        };
        let (Some(a), Some(b)) = (parts[i].take(), parts[j].take()) else {
            break;
        };
        let merged = merge(&a, &b, &mut fft);
        queue.push(Reverse((merged.masses.len(), parts.len())));
        parts.push(Some(merged));
    }
    let result = queue
        .pop()
        .and_then(|Reverse((_, i))| parts[i].take())
        .unwrap_or_else(Part::zero);
    Ok(result.into_distribution(step, top))
}

/// Y by direct convolution of the histograms one after the other, with nothing trimmed: the
/// exact reference for [`aggregate`] (up to one rounding per product and sum). Costs about
/// `n² · bins² / 2` operations: for tests and small sets only.
pub fn aggregate_exact<'a>(
    histograms: impl IntoIterator<Item = &'a UsageHistogram> + Clone,
) -> Result<Distribution, ProvisionError> {
    let step = lattice_step(histograms.clone());
    check_step(step)?;
    let mut top = 0usize;
    let mut sum = Part::zero();
    for histogram in histograms {
        let (part, part_top) = leaf(histogram, step)?;
        top = top.saturating_add(part_top);
        sum = Part {
            offset: sum.offset + part.offset,
            masses: convolve_direct(&sum.masses, &part.masses),
            beyond: 0.0,
        };
    }
    Ok(sum.into_distribution(step, top))
}

fn check_step(step: f64) -> Result<(), ProvisionError> {
    if step.is_finite() && step > 0.0 {
        Ok(())
    } else {
        Err(ProvisionError::InvalidStep {
            step,
            sigma: 0.0,
            reason: "must be finite and above zero",
        })
    }
}

/// A partial sum: masses from lattice index `offset`, and mass trimmed above.
#[derive(Debug, Clone)]
struct Part {
    offset: usize,
    masses: Vec<f64>,
    beyond: f64,
}

impl Part {
    /// The distribution of 0.
    fn zero() -> Self {
        Self {
            offset: 0,
            masses: vec![1.0],
            beyond: 0.0,
        }
    }

    fn into_distribution(self, step: f64, top: usize) -> Distribution {
        Distribution {
            step,
            offset: self.offset,
            masses: self.masses,
            beyond: self.beyond,
            top: top.max(self.offset),
        }
    }
}

/// One histogram on the lattice of step `step`; also returns the lattice index of its cap
/// (rounded up).
fn leaf(histogram: &UsageHistogram, step: f64) -> Result<(Part, usize), ProvisionError> {
    let sigma = histogram.sigma();
    let span = sigma / step;
    if span > MAX_POINTS_PER_TUNNEL {
        return Err(ProvisionError::InvalidStep {
            step,
            sigma,
            reason: "too small: one tunnel would span more than 2^24 lattice points",
        });
    }
    let top = (span - LATTICE_TOLERANCE * span.max(1.0)).ceil().max(0.0) as usize;
    let mut masses = vec![0.0; top + 2];
    for bin in 0..histogram.bins() {
        let p = histogram.probability(bin);
        if p == 0.0 {
            continue;
        }
        let position = histogram.value(bin) / step;
        let nearest = position.round();
        if (position - nearest).abs() <= LATTICE_TOLERANCE * position.max(1.0) {
            masses[(nearest as usize).min(top)] += p;
        } else {
            let low = position.floor();
            let fraction = position - low;
            let low = (low as usize).min(top);
            masses[low] += p * (1.0 - fraction);
            masses[(low + 1).min(top)] += p * fraction;
        }
    }
    let first = masses.iter().position(|&m| m > 0.0).unwrap_or(0);
    let last = masses.iter().rposition(|&m| m > 0.0).unwrap_or(first);
    let part = Part {
        offset: first,
        masses: masses[first..=last].to_vec(),
        beyond: 0.0,
    };
    Ok((part, top))
}

/// The sum of two independent partial sums, cleaned and trimmed (see the module docs).
fn merge(a: &Part, b: &Part, fft: &mut Fft) -> Part {
    let (la, lb) = (a.masses.len(), b.masses.len());
    let n = (la + lb).next_power_of_two() as f64;
    let direct = la.min(lb) <= DIRECT_MAX_SHORT_SIDE || (la * lb) as f64 <= 6.0 * n * n.log2();
    let (mut raw, floor) = if direct {
        (convolve_direct(&a.masses, &b.masses), 0.0)
    } else {
        (
            fft.convolve(&a.masses, &b.masses),
            Fft::noise_floor(&a.masses, &b.masses),
        )
    };
    for m in raw.iter_mut() {
        // Also zeroes NaN (cannot arise from finite inputs, but never let it spread).
        if m.is_nan() || *m <= floor {
            *m = 0.0;
        }
    }
    let expected: f64 = a.masses.iter().sum::<f64>() * b.masses.iter().sum::<f64>();

    // Trim the lower tail, keeping its mass at the lowest kept point.
    let mut low = 0;
    let mut low_mass = 0.0;
    while low < raw.len() && low_mass + raw[low] <= TAIL_MASS {
        low_mass += raw[low];
        low += 1;
    }
    if low == raw.len() {
        // All mass is negligible (cannot happen for probability vectors); keep everything.
        low = 0;
        low_mass = 0.0;
    }
    // Trim the upper tail into `beyond`.
    let mut high = raw.len();
    let mut high_mass = 0.0;
    while high > low + 1 && high_mass + raw[high - 1] <= TAIL_MASS {
        high_mass += raw[high - 1];
        high -= 1;
    }
    raw.truncate(high);
    raw.drain(..low);
    raw[0] += low_mass;

    let mut held: f64 = raw.iter().sum();
    if held > expected && held > 0.0 {
        // Positive rounding noise: scale back to the mass the inputs held.
        let scale = expected / held;
        raw.iter_mut().for_each(|m| *m *= scale);
        held = expected;
    }
    let beyond = (1.0 - held)
        .clamp(0.0, 1.0)
        .max(1.0 - (1.0 - a.beyond) * (1.0 - b.beyond));
    Part {
        offset: a.offset + b.offset + low,
        masses: raw,
        beyond,
    }
}

#[cfg(test)]
mod tests;
