//! The fairness figures: each tenant's weighted fair share of the worker (weighted max-min,
//! work-conserving: a tenant that wants less than its weight's share gets what it wants and
//! the rest is split among the others by weight), the deviation from it, Jain's fairness
//! index, and medians over rounds.

/// Weighted max-min fair shares of one worker, summing to 1 (or to the total demand, if it is
/// below 1, as shares of what was used: then each tenant's share is its demand over the
/// total). `demands[i]` is tenant `i`'s demand as a fraction of the worker (None: more than
/// the worker; 0: idle). Tenants with a zero weight or demand get 0.
pub(crate) fn fair_shares(weights: &[u16], demands: &[Option<f64>]) -> Vec<f64> {
    let n = weights.len();
    let demand = |i: usize| demands.get(i).copied().flatten().unwrap_or(f64::INFINITY);
    let mut share = vec![0.0; n];
    let mut open: Vec<usize> = (0..n)
        .filter(|&i| weights[i] > 0 && demand(i) > 0.0)
        .collect();
    let total_demand: f64 = open.iter().map(|&i| demand(i)).sum();
    if total_demand <= 1.0 {
        // Nobody is short: each got what it asked for, as a share of what was used.
        for &i in &open {
            share[i] = demand(i) / total_demand;
        }
        return share;
    }
    let mut left = 1.0;
    // Water-filling: give every open tenant its weight's part of what is left; those whose
    // demand is met leave with it, and the rest is split again.
    while !open.is_empty() && left > 1e-12 {
        let w: f64 = open.iter().map(|&i| f64::from(weights[i])).sum();
        let level = left / w;
        let (met, short): (Vec<usize>, Vec<usize>) = open
            .iter()
            .partition(|&&i| demand(i) - share[i] <= level * f64::from(weights[i]));
        if met.is_empty() {
            for &i in &short {
                share[i] += level * f64::from(weights[i]);
            }
            break;
        }
        for &i in &met {
            left -= demand(i) - share[i];
            share[i] = demand(i);
        }
        open = short;
    }
    share
}

/// Jain's fairness index of the allocations `x` (1 when all are equal, 1/n when one has
/// everything); 1 for an empty or all-zero list.
pub(crate) fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let squares: f64 = x.iter().map(|v| v * v).sum();
    if x.is_empty() || squares == 0.0 {
        return 1.0;
    }
    sum * sum / (x.len() as f64 * squares)
}

/// Jain's index of the tenants' shares normalised by their fair shares (tenants with no fair
/// share left out): 1 when every tenant has exactly its fair share.
pub(crate) fn jain_of_shares(shares: &[f64], fair: &[f64]) -> f64 {
    let x: Vec<f64> = shares
        .iter()
        .zip(fair)
        .filter(|(_, &f)| f > 0.0)
        .map(|(&s, &f)| s / f)
        .collect();
    jain(&x)
}

/// The median (the mean of the middle two for an even count); None for no value.
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    #[test]
    fn overloaded_tenants_share_by_weight() {
        let s = fair_shares(&[1, 2, 3], &[None, None, None]);
        assert!(close(&s, &[1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0]), "{s:?}");
        assert!(close(&fair_shares(&[1, 1, 1], &[None; 3]), &[1.0 / 3.0; 3]));
    }

    #[test]
    fn an_idle_or_modest_tenant_leaves_its_share_to_the_others() {
        // Idle: the other two split everything 1:2.
        let s = fair_shares(&[1, 2, 3], &[None, None, Some(0.0)]);
        assert!(close(&s, &[1.0 / 3.0, 2.0 / 3.0, 0.0]), "{s:?}");
        // The third wants 10 % (less than its half): it gets it, the others split 90 % 1:2.
        let s = fair_shares(&[1, 2, 3], &[None, None, Some(0.1)]);
        assert!(close(&s, &[0.3, 0.6, 0.1]), "{s:?}");
        // Two levels: the second's demand is met only in the second round.
        let s = fair_shares(&[1, 1, 1], &[Some(0.1), Some(0.4), None]);
        assert!(close(&s, &[0.1, 0.4, 0.5]), "{s:?}");
        // Nobody is short: shares of what was used.
        let s = fair_shares(&[1, 5], &[Some(0.2), Some(0.2)]);
        assert!(close(&s, &[0.5, 0.5]), "{s:?}");
        assert!(close(&fair_shares(&[1], &[Some(0.0)]), &[0.0]));
    }

    #[test]
    fn jain_index() {
        assert!((jain(&[1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert_eq!(jain(&[]), 1.0);
        // Shares exactly at their weighted fair shares are perfectly fair.
        let fair = [1.0 / 6.0, 2.0 / 6.0, 0.5];
        assert!((jain_of_shares(&fair, &fair) - 1.0).abs() < 1e-12);
        // Equal shares under 1:2:3 weights are not.
        assert!(jain_of_shares(&[1.0 / 3.0; 3], &fair) < 0.9);
        // A tenant without a fair share (idle) is left out.
        assert!((jain_of_shares(&[0.5, 0.5, 0.0], &[0.5, 0.5, 0.0]) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN]), None);
        assert_eq!(median(&[]), None);
    }
}
