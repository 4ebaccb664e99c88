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
//! These functions take loads and sizes in any unit, keyed by any ordered identifier; ties are
//! broken by the smaller key, so every result is deterministic.

/// Slack allowed when comparing a load with the limit (absolute, in the caller's unit).
pub const FIT_TOLERANCE: f64 = 1e-9;

/// Whether a tunnel of usage `alpha` fits on a node of load `load` under `limit`.
pub fn fits(load: f64, alpha: f64, limit: f64) -> bool {
    load + alpha <= limit + FIT_TOLERANCE
}

/// Best Fit: among `nodes` (key, load), the one whose room left after taking `alpha`,
/// `limit − load − alpha`, is the smallest that is not negative; `None` when no node has room.
/// Ties go to the smaller key.
pub fn best_fit<K: Copy + Ord>(
    nodes: impl IntoIterator<Item = (K, f64)>,
    alpha: f64,
    limit: f64,
) -> Option<K> {
    let mut best: Option<(f64, K)> = None;
    for (key, load) in nodes {
        if !fits(load, alpha, limit) {
            continue;
        }
        let room = limit - load - alpha;
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

/// Sorts `(key, size)` items by size, largest first, ties by the smaller key.
pub(crate) fn sort_decreasing<K: Copy + Ord>(items: &mut [(K, f64)]) {
    items.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
}

/// Best Fit Decreasing: sorts the items by size, largest first, and puts each on the open bin
/// where it leaves the least room under `limit` (Best Fit), opening a new bin when none has
/// room. Returns the bins in the order they were opened, each with its items in the order they
/// were placed. Uses at most `11/9 · OPT + 6/9` bins (Dósa 2007) for items no larger than the
/// limit. Costs `O(items · bins)`.
pub fn best_fit_decreasing<K: Copy + Ord>(items: &[(K, f64)], limit: f64) -> Vec<Vec<K>> {
    best_fit_decreasing_onto(items, &[], limit)
}

/// [`best_fit_decreasing`] onto bins already holding `filled` loads (items that stay where
/// they are): the result starts with one bin per entry of `filled`, in its order, with the
/// items Best Fit put there (maybe none), then the bins it opened.
pub fn best_fit_decreasing_onto<K: Copy + Ord>(
    items: &[(K, f64)],
    filled: &[f64],
    limit: f64,
) -> Vec<Vec<K>> {
    let mut sorted = items.to_vec();
    sort_decreasing(&mut sorted);
    let mut bins: Vec<Vec<K>> = vec![Vec::new(); filled.len()];
    let mut loads: Vec<f64> = filled.to_vec();
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
/// usage, largest first, and of them the fewest largest `k` whose sum exceeds `load − limit`.
/// Taking the largest ones first is what makes `k` the fewest: no `k − 1` tunnels of the node
/// add up to more than its `k − 1` largest. At least one tunnel always stays (moving all of
/// them would only move the hotspot). Empty when the node is not a hotspot (`load <= limit`,
/// with [`FIT_TOLERANCE`]).
pub fn hotspot_selection<K: Copy + Ord>(tunnels: &[(K, f64)], load: f64, limit: f64) -> Vec<K> {
    if load <= limit + FIT_TOLERANCE || tunnels.len() < 2 {
        return Vec::new();
    }
    let excess = load - limit;
    let mut sorted = tunnels.to_vec();
    sort_decreasing(&mut sorted);
    let mut moved = 0.0;
    let mut chosen = Vec::new();
    for &(key, alpha) in &sorted[..sorted.len() - 1] {
        chosen.push(key);
        moved += alpha;
        if moved > excess {
            break;
        }
    }
    chosen
}

/// The volume bound on the number of nodes: `⌈Σ sizes / limit⌉` (no packing uses fewer).
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
    fn volume_bound() {
        assert_eq!(volume_lower_bound([0.45, 0.45], 0.9), 1);
        assert_eq!(volume_lower_bound([0.45, 0.46], 0.9), 2);
        assert_eq!(volume_lower_bound([], 0.9), 0);
        assert_eq!(volume_lower_bound([1.0], 0.0), 0);
    }
}
