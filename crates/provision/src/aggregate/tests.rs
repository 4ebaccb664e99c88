//! Tests of the aggregate against direct convolution and known distributions.

use super::*;

/// A small deterministic generator (xorshift64*), so the tests need no RNG crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A Bernoulli(`ones / window`) tunnel: `ones` samples at σ, the rest idle.
fn bernoulli(sigma: f64, bins: usize, ones: usize, window: usize) -> UsageHistogram {
    let mut h = UsageHistogram::new(sigma, bins, window).unwrap();
    for i in 0..window {
        h.record(if i < ones { sigma } else { 0.0 }).unwrap();
    }
    h
}

/// A tunnel with `samples` random samples: a random base load plus noise, sometimes idle,
/// sometimes at its cap.
fn random_histogram(rng: &mut Rng, sigma: f64, bins: usize, samples: usize) -> UsageHistogram {
    let mut h = UsageHistogram::new(sigma, bins, samples.max(1)).unwrap();
    let base = rng.unit() * sigma;
    for _ in 0..samples {
        let roll = rng.unit();
        let alpha = if roll < 0.05 {
            0.0
        } else if roll < 0.1 {
            sigma
        } else {
            (base + (rng.unit() - 0.5) * sigma * 0.4).clamp(0.0, sigma)
        };
        h.record(alpha).unwrap();
    }
    h
}

/// Least k with Pr(Binomial(n, p) > k) <= epsilon, from the exact pmf.
fn binomial_capacity(n: usize, p: f64, epsilon: f64) -> usize {
    let mut log_pmf = Vec::with_capacity(n + 1);
    let mut current = n as f64 * (1.0 - p).ln();
    for k in 0..=n {
        log_pmf.push(current);
        if k < n {
            current += ((n - k) as f64 / (k + 1) as f64).ln() + (p / (1.0 - p)).ln();
        }
    }
    let mut above = 0.0;
    for k in (0..=n).rev() {
        let m = log_pmf[k].exp();
        if above + m > epsilon {
            return k;
        }
        above += m;
    }
    0
}

#[test]
fn no_tunnels_is_zero() {
    let none: [&UsageHistogram; 0] = [];
    let y = aggregate(none.iter().copied()).unwrap();
    assert_eq!(y.masses(), &[1.0]);
    assert_eq!(y.mean(), 0.0);
    assert_eq!(y.capacity(0.05).unwrap(), 0.0);
    assert_eq!(y.exceedance(0.0), 0.0);
}

#[test]
fn one_tunnel_is_its_histogram() {
    let mut rng = Rng(7);
    let h = random_histogram(&mut rng, 0.3, 100, 500);
    let y = aggregate([&h]).unwrap();
    assert_eq!(y.step(), h.step());
    let probabilities = h.probabilities();
    for (k, &m) in y.masses().iter().enumerate() {
        assert!((m - probabilities[y.offset() + k]).abs() < 1e-15);
    }
    assert!((y.mean() - h.mean()).abs() < 1e-12);
    assert_eq!(y.top_value(), 0.3);
}

#[test]
fn zero_sample_tunnels_count_at_their_cap() {
    let priors: Vec<UsageHistogram> = (0..10)
        .map(|_| UsageHistogram::new(0.3, 100, 10).unwrap())
        .collect();
    let y = aggregate(&priors).unwrap();
    assert!((y.capacity(0.05).unwrap() - 3.0).abs() < 1e-9);
    assert!((y.mean() - 3.0).abs() < 1e-9);
}

#[test]
fn sums_of_bernoulli_are_binomial() {
    let sigma = 0.3;
    let bins = 100;
    for (n, ones, window) in [
        (1, 1, 2),
        (10, 1, 2),
        (200, 1, 4),
        (1000, 1, 2),
        (2500, 3, 10),
    ] {
        let p = ones as f64 / window as f64;
        let tunnels: Vec<UsageHistogram> = (0..n)
            .map(|_| bernoulli(sigma, bins, ones, window))
            .collect();
        let y = aggregate(&tunnels).unwrap();
        assert!(y.beyond() < 1e-9, "n = {n}: beyond {}", y.beyond());
        assert!((y.mean() - n as f64 * p * sigma).abs() < 1e-6 * n as f64);
        for epsilon in [0.2, 0.05, 0.01, 0.001] {
            let k = binomial_capacity(n, p, epsilon);
            let c = y.capacity(epsilon).unwrap();
            assert!(
                (c - k as f64 * sigma).abs() < 1e-9 * n as f64,
                "n = {n}, p = {p}, ε = {epsilon}: C = {c}, expected {}",
                k as f64 * sigma
            );
        }
    }
}

#[test]
fn tree_aggregate_matches_exact_convolution() {
    let mut rng = Rng(0x5eed);
    let tunnels: Vec<UsageHistogram> = (0..200)
        .map(|_| random_histogram(&mut rng, 0.3, 100, 300))
        .collect();
    let fast = aggregate(&tunnels).unwrap();
    let exact = aggregate_exact(&tunnels).unwrap();
    assert_eq!(fast.step(), exact.step());
    assert_eq!(fast.top_value(), exact.top_value());
    assert!(fast.beyond() < 1e-10);
    let end = exact.offset() + exact.masses().len();
    for index in 0..end {
        let x = exact.value(index);
        let (f, e) = (fast.exceedance(x), exact.exceedance(x));
        assert!(
            f >= e - 1e-12 && f <= e + 1e-10,
            "Pr(Y > {x}): {f} vs exact {e}"
        );
    }
    for epsilon in [0.5, 0.1, 0.05, 0.01, 0.001] {
        assert_eq!(
            fast.capacity(epsilon).unwrap(),
            exact.capacity(epsilon).unwrap(),
            "ε = {epsilon}"
        );
    }
    assert!((fast.mean() - exact.mean()).abs() < 1e-9);
}

#[test]
fn mixed_caps_keep_the_mean() {
    let mut rng = Rng(99);
    let tunnels: Vec<UsageHistogram> = (0..40)
        .map(|i| {
            let sigma = [0.3, 0.2, 0.05, 0.17][i % 4];
            let bins = [100, 100, 30, 64][i % 4];
            random_histogram(&mut rng, sigma, bins, 50)
        })
        .collect();
    let y = aggregate(&tunnels).unwrap();
    let exact = aggregate_exact(&tunnels).unwrap();
    let mean: f64 = tunnels.iter().map(UsageHistogram::mean).sum();
    assert!((y.mean() - mean).abs() < 1e-9, "{} vs {mean}", y.mean());
    assert!((exact.mean() - mean).abs() < 1e-9);
    assert!(y.top_value() >= tunnels.iter().map(|t| t.sigma()).sum::<f64>() - 1e-9);
    for epsilon in [0.1, 0.01] {
        assert_eq!(
            y.capacity(epsilon).unwrap(),
            exact.capacity(epsilon).unwrap()
        );
    }
}

#[test]
fn capacity_walks_the_upper_tail() {
    // Two tunnels, each 0 or 1 with probability 1/2: Y is 0, 1, 2 with 1/4, 1/2, 1/4.
    let tunnels = [bernoulli(1.0, 2, 1, 2), bernoulli(1.0, 2, 1, 2)];
    let y = aggregate_exact(&tunnels).unwrap();
    assert_eq!(y.masses(), &[0.25, 0.5, 0.25]);
    assert_eq!(y.capacity(0.0).unwrap(), 2.0);
    assert_eq!(y.capacity(0.2).unwrap(), 2.0);
    assert_eq!(y.capacity(0.25).unwrap(), 1.0);
    assert_eq!(y.capacity(0.74).unwrap(), 1.0);
    assert_eq!(y.capacity(0.75).unwrap(), 0.0);
    assert_eq!(y.exceedance(-1.0), 1.0);
    assert_eq!(y.exceedance(0.0), 0.75);
    assert_eq!(y.exceedance(0.5), 0.75);
    assert_eq!(y.exceedance(1.0), 0.25);
    assert_eq!(y.exceedance(2.0), 0.0);
    assert_eq!(capacity(&y, 0.25).unwrap(), 1.0);
    for bad in [-0.1, 1.0, f64::NAN] {
        assert!(matches!(
            y.capacity(bad),
            Err(ProvisionError::InvalidEpsilon { .. })
        ));
    }
}

#[test]
fn beyond_above_epsilon_gives_the_top() {
    let tunnels = [bernoulli(1.0, 2, 1, 2)];
    let mut y = aggregate_exact(&tunnels).unwrap();
    y.beyond = 0.3;
    assert_eq!(y.capacity(0.2).unwrap(), 1.0);
    y.masses = vec![0.7];
    y.top = 5;
    assert_eq!(y.capacity(0.2).unwrap(), 5.0);
}

#[test]
fn reserve_nodes_rounds_up() {
    assert_eq!(reserve_nodes(0.0, 0.9).unwrap(), 0);
    assert_eq!(reserve_nodes(1.8, 0.9).unwrap(), 2);
    assert_eq!(reserve_nodes(0.3 * 6.0, 0.9).unwrap(), 2);
    assert_eq!(reserve_nodes(1.81, 0.9).unwrap(), 3);
    assert_eq!(reserve_nodes(17.5, 0.9).unwrap(), 20);
    assert_eq!(reserve_nodes(1e300, 0.5).unwrap(), u32::MAX);
    assert!(matches!(
        reserve_nodes(-1.0, 0.9),
        Err(ProvisionError::InvalidCapacity { .. })
    ));
    assert!(matches!(
        reserve_nodes(f64::INFINITY, 0.9),
        Err(ProvisionError::InvalidCapacity { .. })
    ));
    for bad in [0.0, 1.5, f64::NAN] {
        assert!(matches!(
            reserve_nodes(1.0, bad),
            Err(ProvisionError::InvalidThreshold { .. })
        ));
    }
}

#[test]
fn bad_steps_are_rejected() {
    let h = UsageHistogram::new(0.3, 100, 10).unwrap();
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(matches!(
            aggregate_with_step([&h], bad),
            Err(ProvisionError::InvalidStep { .. })
        ));
    }
    assert!(matches!(
        aggregate_with_step([&h], 1e-12),
        Err(ProvisionError::InvalidStep { .. })
    ));
    // A coarse step still keeps the mean: σ splits between 0 and h.
    let y = aggregate_with_step([&h], 1.0).unwrap();
    assert!((y.mean() - 0.3).abs() < 1e-12);
    assert_eq!(y.top_value(), 1.0);
}
