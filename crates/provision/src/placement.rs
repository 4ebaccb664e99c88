//! Tunnel placement as one-dimensional bin packing (the paper's §3.3 and §5.4): Best Fit for
//! one tunnel, Best Fit Decreasing for a whole consolidation, and the choice of the tunnels to
//! move off a hotspot.
//!
//! **Fill limit.** Nodes are bins of capacity 1 (in node units), but placement fills them only
//! up to the hotspot threshold, `limit = T_H · node capacity`. Filling to 1 would make every
//! fully packed node a hotspot (β_j > T_H) at once and trigger migrations straight after each
//! consolidation; filling to T_H is what makes "hotspot" mean "grew since it was placed", and is
//! why §5.3 reserves `C / T_H` nodes rather than C. A tunnel whose own usage is above the limit
//! fits only on an empty node (it gets a node of its own).
//!
//! Comparisons allow [`FIT_TOLERANCE`] for floating-point rounding: a load that adds up to the
//! limit in another order is still within it.
//!
//! **Loads with a spread.** A size is either a plain number (`f64`: the paper's packing) or a
//! [`Fill`]: an expected load and a variance, whose *level* is `mean + √var`. A node's fill is
//! the sum of its tunnels' (means and variances both add), so its level grows with the square
//! root of its tunnels' spreads, not with their sum: the headroom of a node is shared by its
//! tunnels, which rarely all rise at once (adaptive sizing, docs/provisioning.md). Every
//! function below compares levels; with no spread a [`Fill`] packs exactly as its mean does.
//!
//! These functions take loads and sizes in any unit, keyed by any ordered identifier; ties are
//! broken by the smaller key, so every result is deterministic.

use core::ops::{Add, AddAssign, Sub, SubAssign};

/// Slack allowed when comparing a load with the limit (absolute, in the caller's unit).
pub const FIT_TOLERANCE: f64 = 1e-9;

/// What placement packs: a tunnel's size or a node's load (see the module docs). The level is
/// `mean + spread`, compared with the limit; sizes add and subtract as loads do.
pub trait Size:
    Copy + Default + Add<Output = Self> + Sub<Output = Self> + AddAssign + SubAssign
{
    /// The expected load.
    fn mean(self) -> f64;
    /// The headroom on top of the mean (0 for a plain number).
    fn spread(self) -> f64;
    /// What is compared with the limit: `mean + spread`.
    fn level(self) -> f64 {
        self.mean() + self.spread()
    }
}

impl Size for f64 {
    fn mean(self) -> f64 {
        self
    }

    fn spread(self) -> f64 {
        0.0
    }

    fn level(self) -> f64 {
        self
    }
}

/// A load with a spread: an expected load and a variance (in the square of the caller's
/// unit); its spread is `√var`. A tunnel's fill is its size α and its headroom h as
/// `Fill::new(α, h)` (variance h²); a node's is the sum of its tunnels'.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Fill {
    /// Σ α.
    pub mean: f64,
    /// Σ h².
    pub var: f64,
}

impl Fill {
    /// A tunnel of size `mean` with headroom `spread` (its variance is `spread²`).
    pub fn new(mean: f64, spread: f64) -> Self {
        Self {
            mean,
            var: spread * spread,
        }
    }
}

impl Size for Fill {
    fn mean(self) -> f64 {
        self.mean
    }

    /// `√var`; a variance within [`FIT_TOLERANCE`] of 0 counts as 0. Adding and removing
    /// tunnels leaves rounding residues in the variance, and the root magnifies one near 0
    /// (a residue of 1e-17 would be a spread of 3e-9, beyond the tolerance); a spread below
    /// √FIT_TOLERANCE ≈ 3e-5 of the caller's unit is not worth keeping.
    fn spread(self) -> f64 {
        if self.var <= FIT_TOLERANCE {
            0.0
        } else {
            self.var.sqrt()
        }
    }
}

impl Add for Fill {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            mean: self.mean + other.mean,
            var: self.var + other.var,
        }
    }
}

impl Sub for Fill {
    type Output = Self;

    fn sub(self, other: Self) -> Self {
        Self {
            mean: self.mean - other.mean,
            var: self.var - other.var,
        }
    }
}

impl AddAssign for Fill {
    fn add_assign(&mut self, other: Self) {
        *self = *self + other;
    }
}

impl SubAssign for Fill {
    fn sub_assign(&mut self, other: Self) {
        *self = *self - other;
    }
}

impl From<f64> for Fill {
    fn from(mean: f64) -> Self {
        Self { mean, var: 0.0 }
    }
}

/// Whether a tunnel of size `alpha` fits on a node of load `load` under `limit`: the level of
/// the two together is within it.
pub fn fits<S: Size>(load: S, alpha: S, limit: f64) -> bool {
    (load + alpha).level() <= limit + FIT_TOLERANCE
}

/// Best Fit: among `nodes` (key, load), the one whose room left after taking `alpha`,
/// `limit − level(load + alpha)`, is the smallest that is not negative; `None` when no node
/// has room. Ties go to the smaller key.
pub fn best_fit<K: Copy + Ord, S: Size>(
    nodes: impl IntoIterator<Item = (K, S)>,
    alpha: S,
    limit: f64,
) -> Option<K> {
    let mut best: Option<(f64, K)> = None;
    for (key, load) in nodes {
        if !fits(load, alpha, limit) {
            continue;
        }
        let room = limit - (load + alpha).level();
        let better = match best {
            None => true,
            Some((best_room, best_key)) => {
                room < best_room || (room == best_room && key < best_key)
            }
        };
        if better {
            best = Some((room, key));
        }
    }
    best.map(|(_, key)| key)
}

/// Sorts `(key, size)` items by level, largest first, ties by the smaller key.
pub(crate) fn sort_decreasing<K: Copy + Ord, S: Size>(items: &mut [(K, S)]) {
    items.sort_by(|a, b| b.1.level().total_cmp(&a.1.level()).then(a.0.cmp(&b.0)));
}

/// Best Fit Decreasing: sorts the items by size, largest first, and puts each on the open bin
/// where it leaves the least room under `limit` (Best Fit), opening a new bin when none has
/// room. Returns the bins in the order they were opened, each with its items in the order they
/// were placed. Uses at most `11/9 · OPT + 6/9` bins (Dósa 2007) for items no larger than the
/// limit. Costs `O(items · bins)`.
pub fn best_fit_decreasing<K: Copy + Ord, S: Size>(items: &[(K, S)], limit: f64) -> Vec<Vec<K>> {
    best_fit_decreasing_onto(items, &[], limit)
}

/// [`best_fit_decreasing`] onto bins already holding `filled` loads (items that stay where
/// they are): the result starts with one bin per entry of `filled`, in its order, with the
/// items Best Fit put there (maybe none), then the bins it opened.
pub fn best_fit_decreasing_onto<K: Copy + Ord, S: Size>(
    items: &[(K, S)],
    filled: &[S],
    limit: f64,
) -> Vec<Vec<K>> {
    let mut sorted = items.to_vec();
    sort_decreasing(&mut sorted);
    let mut bins: Vec<Vec<K>> = vec![Vec::new(); filled.len()];
    let mut loads: Vec<S> = filled.to_vec();
    for (key, size) in sorted {
        match best_fit(loads.iter().copied().enumerate(), size, limit) {
            Some(bin) => {
                bins[bin].push(key);
                loads[bin] += size;
            }
            None => {
                bins.push(vec![key]);
                loads.push(size);
            }
        }
    }
    bins
}

/// The tunnels to move off a hotspot (§5.4, "Tunnel migration"): the node's tunnels sorted by
/// size, largest first, and of them the fewest largest `k` whose removal lowers the node's
/// level by more than `level(load) − limit` (for plain numbers: whose sum exceeds
/// `load − limit`). Taking the largest ones first is what makes `k` the fewest for plain
/// numbers: no `k − 1` tunnels of the node add up to more than its `k − 1` largest. At least
/// one tunnel always stays (moving all of them would only move the hotspot). Empty when the
/// node is not a hotspot (`level(load) <= limit`, with [`FIT_TOLERANCE`]).
pub fn hotspot_selection<K: Copy + Ord, S: Size>(
    tunnels: &[(K, S)],
    load: S,
    limit: f64,
) -> Vec<K> {
    if load.level() <= limit + FIT_TOLERANCE || tunnels.len() < 2 {
        return Vec::new();
    }
    let excess = load.level() - limit;
    let mut sorted = tunnels.to_vec();
    sort_decreasing(&mut sorted);
    let mut moved = S::default();
    let mut chosen = Vec::new();
    for &(key, alpha) in &sorted[..sorted.len() - 1] {
        chosen.push(key);
        moved += alpha;
        // What leaving lowers the level by: the moved means, and the spread the node loses.
        let shed = moved.mean() + (load.spread() - (load - moved).spread());
        if shed > excess {
            break;
        }
    }
    chosen
}

/// The volume bound on the number of nodes: `⌈Σ sizes / limit⌉` (no packing of plain numbers
/// uses fewer).
/// 0 for no items or a limit that is not above zero.
pub fn volume_lower_bound(sizes: impl IntoIterator<Item = f64>, limit: f64) -> usize {
    if limit.is_nan() || limit <= 0.0 {
        return 0;
    }
    let total: f64 = sizes.into_iter().filter(|s| s.is_finite()).sum();
    ((total - FIT_TOLERANCE) / limit).ceil().max(0.0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_takes_the_tightest_node() {
        let nodes = [(1u32, 0.5), (2, 0.7), (3, 0.2), (4, 0.8)];
        assert_eq!(best_fit(nodes, 0.15, 0.9), Some(2));
        assert_eq!(best_fit(nodes, 0.1, 0.9), Some(4));
        assert_eq!(best_fit(nodes, 0.65, 0.9), Some(3));
        assert_eq!(best_fit(nodes, 0.75, 0.9), None);
        // Ties go to the smaller key, whatever the order given.
        assert_eq!(best_fit([(5u32, 0.4), (2, 0.4)], 0.1, 0.9), Some(2));
        // Exactly filling to the limit fits, despite rounding.
        assert_eq!(best_fit([(1u32, 0.1 + 0.2)], 0.6, 0.9), Some(1));
    }

    #[test]
    fn bfd_packs_the_classic_example() {
        let items: Vec<(u32, f64)> = [0.5, 0.7, 0.5, 0.2, 0.4, 0.2, 0.5, 0.1, 0.6]
            .iter()
            .enumerate()
            .map(|(i, &s)| (i as u32, s))
            .collect();
        let bins = best_fit_decreasing(&items, 1.0);
        assert_eq!(bins.len(), 4);
        assert_eq!(bins[0], vec![1, 3, 7]);
        for bin in &bins {
            let load: f64 = bin.iter().map(|&k| items[k as usize].1).sum();
            assert!(load <= 1.0 + FIT_TOLERANCE);
        }
    }

    #[test]
    fn oversized_items_get_a_bin_of_their_own() {
        let bins = best_fit_decreasing(&[(1u32, 0.95), (2, 0.05), (3, 1.2)], 0.9);
        assert_eq!(bins, vec![vec![3], vec![1], vec![2]]);
    }

    #[test]
    fn filled_bins_come_first_and_are_filled_up_to_the_limit() {
        // Bins holding 0.7 and 0.95 (above the limit already); items 0.5, 0.2, 0.1.
        let bins = best_fit_decreasing_onto(&[(1u32, 0.5), (2, 0.2), (3, 0.1)], &[0.7, 0.95], 0.9);
        // 0.5 fits on neither: a new bin; 0.2 fills the first to the limit; 0.1 joins 0.5.
        assert_eq!(bins, vec![vec![2], vec![], vec![1, 3]]);
        assert_eq!(
            best_fit_decreasing_onto(&[(1u32, 0.5)], &[], 0.9),
            best_fit_decreasing(&[(1u32, 0.5)], 0.9)
        );
    }

    #[test]
    fn hotspot_selection_takes_the_fewest_largest() {
        let tunnels = [(1u32, 0.1), (2, 0.3), (3, 0.25), (4, 0.3)];
        // Load 0.95 over 0.9: excess 0.05; the largest (0.3, key 2) suffices.
        assert_eq!(hotspot_selection(&tunnels, 0.95, 0.9), vec![2]);
        // Excess 0.35 needs two.
        assert_eq!(hotspot_selection(&tunnels, 1.25, 0.9), vec![2, 4]);
        // The sum must exceed the excess strictly: 0.3 + 0.3 = 0.6 is not above 0.6.
        assert_eq!(hotspot_selection(&tunnels, 1.5, 0.9), vec![2, 4, 3]);
        // Not a hotspot.
        assert!(hotspot_selection(&tunnels, 0.9, 0.9).is_empty());
        // One tunnel always stays.
        assert_eq!(
            hotspot_selection(&[(1u32, 1.0), (2, 1.0)], 2.0, 0.5),
            vec![1]
        );
        assert!(hotspot_selection(&[(1u32, 1.0)], 1.0, 0.5).is_empty());
    }

    #[test]
    fn fills_share_their_spread() {
        // Eight tunnels of α 0.15 with headroom 0.1 each, limit 0.9. Headroom added to each
        // (0.25 a tunnel) packs three to a node: 3 nodes. Shared, four fit on one node
        // (0.6 + 0.1 · √4 = 0.8; a fifth would make 0.75 + 0.1 · √5 ≈ 0.97): 2 nodes.
        let additive: Vec<(u32, f64)> = (0..8).map(|i| (i, 0.25)).collect();
        let shared: Vec<(u32, Fill)> = (0..8).map(|i| (i, Fill::new(0.15, 0.1))).collect();
        assert_eq!(best_fit_decreasing(&additive, 0.9).len(), 3);
        let bins = best_fit_decreasing(&shared, 0.9);
        assert_eq!(bins, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        let four = (0..4).fold(Fill::default(), |sum, _| sum + Fill::new(0.15, 0.1));
        assert!((four.level() - 0.8).abs() < 1e-12);
        assert!(fits(four, Fill::default(), 0.8));
        assert!(!fits(four, Fill::new(0.15, 0.1), 0.9));
        // Without spread a fill packs as its mean.
        assert_eq!(Fill::from(0.3).level(), 0.3);
        assert_eq!(
            best_fit([(1u32, Fill::from(0.5))], Fill::from(0.4), 0.9),
            Some(1)
        );
        // Removing a tunnel takes its variance away; rounding below 0 counts as 0.
        let one = Fill::new(0.15, 0.1);
        assert_eq!((four - four).spread(), 0.0);
        assert!(((four - one).level() - (0.45 + 0.1 * 3f64.sqrt())).abs() < 1e-12);
        assert_eq!(
            Fill {
                mean: 0.0,
                var: -1e-18
            }
            .spread(),
            0.0
        );
    }

    #[test]
    fn hotspot_selection_counts_the_spread_a_node_loses() {
        // Four tunnels of α 0.2 with headroom 0.2: level 0.8 + 0.4 = 1.2 over 0.9. One leaving
        // lowers it to 0.6 + 0.2 · √3 ≈ 0.946 (still above); two to 0.4 + 0.2 · √2 ≈ 0.683.
        let tunnels: Vec<(u32, Fill)> = (0..4).map(|i| (i, Fill::new(0.2, 0.2))).collect();
        let load = tunnels.iter().fold(Fill::default(), |sum, t| sum + t.1);
        assert_eq!(hotspot_selection(&tunnels, load, 0.9), vec![0, 1]);
        // Their means alone (0.8) are no hotspot.
        let plain: Vec<(u32, f64)> = (0..4).map(|i| (i, 0.2)).collect();
        assert!(hotspot_selection(&plain, 0.8, 0.9).is_empty());
    }

    #[test]
    fn volume_bound() {
        assert_eq!(volume_lower_bound([0.45, 0.45], 0.9), 1);
        assert_eq!(volume_lower_bound([0.45, 0.46], 0.9), 2);
        assert_eq!(volume_lower_bound([], 0.9), 0);
        assert_eq!(volume_lower_bound([1.0], 0.0), 0);
    }
}
