//! Tests of the decaying histogram, the calibrator, the prior and the aggregate forecast.

use super::*;

/// A forecaster with the paper's parameters in Gbit/s (5 Gbit/s nodes, τ = 1 minute,
/// 3-minute starts).
fn forecaster() -> Forecaster {
    let config = PlannerConfig {
        node_capacity: 5.0,
        default_sigma: 1.5,
        ..PlannerConfig::default()
    };
    Forecaster::new(ForecastConfig::from_planner(&config).unwrap())
}

#[test]
fn bins_cover_the_range_in_order() {
    let mut previous = -1.0;
    for i in 0..BINS {
        let (lo, hi) = bin_edges(i);
        assert!(
            (lo - previous).abs() < 1e-12,
            "bin {i}: {lo} after {previous}"
        );
        assert!(hi > lo, "bin {i}");
        previous = hi;
        for x in [lo + 0.25 * (hi - lo), lo + 0.75 * (hi - lo)] {
            assert_eq!(bin_of(x), i, "{x}");
        }
    }
    assert!((previous - 1.0).abs() < 1e-12);
    assert_eq!(bin_of(1.0), BINS - 1);
    assert_eq!(bin_of(-1.0), 0);
    assert!(core::mem::size_of::<DecayHist>() <= 208);
}

#[test]
fn quantiles_of_a_uniform_sample() {
    let mut h = DecayHist::new(f64::INFINITY);
    assert_eq!(h.quantile(0.5), None);
    // 0.000, 0.001, …, 0.999 and their negatives: uniform on [−1, 1].
    for k in 0..1000 {
        let x = f64::from(k) / 1000.0;
        h.push(x);
        h.push(-x - 0.0005);
    }
    assert!((h.mass() - 2000.0).abs() < 1e-3, "{}", h.mass());
    for p in [0.05, 0.25, 0.5, 0.75, 0.95, 0.99] {
        let q = h.quantile(p).unwrap();
        let expected = 2.0 * p - 1.0;
        // Within a bin: the widest are about 0.26 at |x| near 1.
        assert!(
            (q - expected).abs() < 0.02 + 0.15 * expected.abs(),
            "p {p}: {q}"
        );
    }
    let q = |p| h.quantile(p).unwrap();
    assert!(q(0.1) < q(0.5) && q(0.5) < q(0.9) && q(0.9) <= q(1.0));
    assert!(q(1.0) <= 1.0 && q(0.0) >= -1.0);
    // Small values are resolved finely.
    let mut small = DecayHist::new(f64::INFINITY);
    for k in 0..100 {
        small.push(0.001 + f64::from(k) * 0.0001);
    }
    let median = small.quantile(0.5).unwrap();
    assert!((median - 0.006).abs() < 0.001, "{median}");
    // Out of range is clamped, NaN dropped.
    let mut edge = DecayHist::new(f64::INFINITY);
    edge.push(7.0);
    edge.push(f64::NAN);
    assert!((edge.mass() - 1.0).abs() < 1e-6);
    assert!(edge.quantile(0.5).unwrap() > 0.7);
}

#[test]
fn forgetting_follows_the_half_life() {
    let mut h = DecayHist::new(20.0);
    for _ in 0..500 {
        h.push(0.5);
    }
    for _ in 0..200 {
        h.push(-0.5);
    }
    // 200 samples are 10 half-lives: the old ones weigh 2^−10 of what they did, so the
    // median and even the 99th percentile are the new value.
    assert!(h.quantile(0.99).unwrap() < -0.3);
    // Total weight relative to the next sample: g / (1 − g) ≈ 28.4 with g = 2^(−1/20).
    assert!((h.mass() - 28.4).abs() < 0.3, "{}", h.mass());
    // Without forgetting, the old samples keep the upper quantiles.
    let mut kept = DecayHist::new(f64::INFINITY);
    for _ in 0..500 {
        kept.push(0.5);
    }
    for _ in 0..200 {
        kept.push(-0.5);
    }
    assert!(kept.quantile(0.5).unwrap() > 0.3);
    // Many half-lives: the weights are rescaled, the answers stay right.
    let mut fast = DecayHist::new(1.0);
    for k in 0..10_000 {
        fast.push(if k % 2 == 0 { 0.2 } else { 0.4 });
    }
    let q = fast.quantile(0.9).unwrap();
    assert!(q > 0.3 && q <= 0.45, "{q}");
    assert!(fast.mass().is_finite() && fast.mass() < 3.0);
}

#[test]
fn saturation_is_a_load_at_the_ceiling() {
    assert!(saturated(5.0, 5.0));
    assert!(saturated(6.0, 5.0));
    assert!(saturated(4.95, 5.0));
    assert!(!saturated(4.85, 5.0));
}

#[test]
fn the_calibrator_rises_with_saturation_and_falls_to_its_floor_without() {
    let mut f = forecaster();
    let c = f.calibration();
    assert_eq!(c.k, K_START);
    // γ = 3 / (0.01 · 1440) at τ = 1 minute, target 2 · (1 − 0.97).
    assert!((c.gamma - 3.0 / 14.4).abs() < 1e-12, "{}", c.gamma);
    assert!((c.target - 0.06).abs() < 1e-12);
    // No active node: no information, no change.
    f.observe_nodes([]);
    assert_eq!(f.calibration().k, K_START);
    assert_eq!(f.calibration().steps, 0);
    // Every step saturated: k climbs to its ceiling, and stays.
    let mut previous = f.calibration().k;
    for _ in 0..30 {
        f.observe_nodes([5.0, 1.0]);
        let k = f.calibration().k;
        assert!(k > previous || k == K_MAX);
        previous = k;
    }
    assert_eq!(f.calibration().k, K_MAX);
    // Never saturated: it falls by γ · 0.06 per step to the floor.
    for _ in 0..300 {
        f.observe_nodes([4.0, 3.0]);
    }
    assert!(f.calibration().k < 1.5, "{:?}", f.calibration());
    for _ in 0..300 {
        f.observe_nodes([4.0, 3.0]);
    }
    assert_eq!(f.calibration().k, K_MIN);
    // Saturated exactly at the target rate (3 steps in 50 = 6 %): k stays within a band.
    let mut f = forecaster();
    let mut ks = Vec::new();
    for step in 0..3300 {
        f.observe_nodes([if matches!(step % 50, 0 | 17 | 34) {
            5.0
        } else {
            4.0
        }]);
        ks.push(f.calibration().k);
    }
    let late = &ks[1650..];
    let (lo, hi) = late
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), &k| (l.min(k), h.max(k)));
    assert!(lo > K_MIN && hi < K_MAX && hi - lo < 0.5, "{lo} {hi}");
    let c = f.calibration();
    assert_eq!(c.steps, 3300);
    assert_eq!(c.saturated_steps, 198);
}

#[test]
fn a_tunnel_is_sized_from_its_own_rises() {
    let mut f = forecaster();
    let calm = TunnelId(1);
    let jumpy = TunnelId(2);
    // Calm: 0.50 ± 0.01; jumpy: 0.2 and 0.8 in turn (cap 1.5).
    let mut last = (0.0, 0.0);
    for step in 0..40 {
        f.observe_nodes([3.0]);
        let a = 0.5 + if step % 2 == 0 { 0.01 } else { -0.01 };
        let b = if step % 2 == 0 { 0.2 } else { 0.8 };
        // A tunnel is packed at its measurement, with a headroom within its cap.
        assert_eq!((f.size(calm, a, 1.5), f.size(jumpy, b, 1.5)), (a, b));
        last = (f.spread(calm), f.spread(jumpy));
        assert!(last.0 >= 0.0 && a + last.0 <= 1.5 && last.1 >= 0.0 && b + last.1 <= 1.5);
    }
    // k ≈ 1 - 40 · γ · 0.06 ≈ 0.5: the calm tunnel's 95 % rise is 0.02, the jumpy one's 0.6.
    let k = f.calibration().k;
    assert!((0.4..0.65).contains(&k), "{k}");
    assert!(last.0 < 0.05, "{last:?}");
    assert!(last.1 > 0.2, "{last:?}");
    // Sizes never exceed the cap, and a measurement above the cap is the cap, with no room
    // left for headroom.
    assert_eq!(f.size(jumpy, 2.0, 1.5), 1.5);
    assert_eq!(f.spread(jumpy), 0.0);
    assert_eq!(f.spread(TunnelId(77)), 0.0);
    // A cap of 0 or a NaN cannot panic.
    assert_eq!(f.size(TunnelId(3), 0.1, 0.0), 0.0);
    assert_eq!(f.size(TunnelId(3), 0.1, f64::NAN), 0.1);
    assert!(!f.is_measured(TunnelId(3)));
    f.forget(calm);
    assert!(!f.is_measured(calm));
}

#[test]
fn a_tunnel_without_history_uses_the_population() {
    let mut f = forecaster();
    // 20 tunnels that move by 0.3 of their cap every step.
    for step in 0..5 {
        f.observe_nodes([3.0]);
        for t in 0..20 {
            f.size(TunnelId(t), if step % 2 == 0 { 0.0 } else { 0.45 }, 1.5);
        }
    }
    // A newcomer's first measurement: sized with the population's rise, not at its level.
    assert_eq!(f.size(TunnelId(99), 0.1, 1.5), 0.1);
    let spread = f.spread(TunnelId(99));
    assert!(spread > 0.3 * 1.5 * 0.5, "{spread}");
}

#[test]
fn the_prior_is_learned_from_first_measurements() {
    let mut p = Prior::new();
    // Before enough tunnels were seen: the cap.
    assert_eq!(p.size(2.0), 2.0);
    for _ in 0..(MIN_SAMPLES - 1) {
        p.observe(0.3, 1.5);
    }
    assert_eq!(p.size(2.0), 2.0);
    // Invalid caps or measurements teach nothing.
    p.observe(0.3, 0.0);
    p.observe(f64::NAN, 1.5);
    p.observe(0.3, f64::INFINITY);
    assert_eq!(p.size(2.0), 2.0);
    // 40 tunnels whose first measurements are 0, 0.01, …, 0.39 of their cap: the 95 %
    // quantile is near 0.37.
    let mut p = Prior::new();
    for t in 0..40 {
        p.observe(f64::from(t) * 0.01 * 1.5, 1.5);
    }
    let prior = p.size(2.0);
    assert!((prior - 0.37 * 2.0).abs() < 0.06, "{prior}");
}

#[test]
fn the_aggregate_forecast_keeps_nodes_for_the_rise_it_has_seen() {
    let mut f = forecaster();
    assert_eq!(f.config().horizon, 4);
    let step = |f: &mut Forecaster, n: usize, level: f64, active: usize| {
        f.observe_nodes(std::iter::repeat_n(4.0, active));
        for t in 0..n {
            f.size(TunnelId(t as u32), level, 1.5);
        }
    };
    // A ramp: 40 tunnels gaining 0.005 Gbit/s each per step, so the sized sum rises by about
    // 0.2 Gbit/s per step and 0.8 within the horizon.
    for s in 0..60 {
        assert!(s < MIN_SAMPLES as usize + 5 || f.hint().is_some());
        step(&mut f, 40, 0.3 + 0.005 * s as f64, 4);
    }
    let hint = f.hint().unwrap();
    assert_eq!(hint.horizon, 4);
    assert!(hint.level > 40.0 * 0.59, "{hint:?}");
    assert!(hint.rise > 0.6 && hint.rise < 1.2, "{hint:?}");
    // Nodes: (level + rise) / 4.5 at least, with fragmentation at least 1.
    let floor = ((hint.level + hint.rise) / 4.5).ceil() as u32;
    assert!(hint.fragmentation >= 1.0);
    assert!(hint.nodes >= floor, "{hint:?}");
    // Far more active nodes than the load needs: the fragmentation rises and so do the nodes.
    for s in 60..200 {
        step(&mut f, 40, 0.3 + 0.005 * s as f64, 30);
    }
    let fragmented = f.hint().unwrap();
    assert!(fragmented.fragmentation > 2.0, "{fragmented:?}");
    assert!(fragmented.nodes > 2 * floor, "{fragmented:?}");
}

#[test]
fn before_the_population_has_rises_a_tunnel_is_sized_at_its_measurement() {
    let mut f = forecaster();
    f.observe_step([3.0], 0);
    // No rise seen anywhere yet: q = 0, not the cap (which would activate nodes for load that
    // is not there).
    for t in 0..10 {
        assert_eq!(f.size(TunnelId(t), 0.3, 1.5), 0.3);
        assert_eq!(f.spread(TunnelId(t)), 0.0);
    }
    // Once the population has MIN_SAMPLES rises, its quantile sizes a tunnel without its own.
    for step in 0..3 {
        f.observe_step([3.0], 0);
        for t in 0..10 {
            f.size(TunnelId(t), if step % 2 == 0 { 0.75 } else { 0.3 }, 1.5);
        }
    }
    assert_eq!(f.size(TunnelId(50), 0.3, 1.5), 0.3);
    assert!(f.spread(TunnelId(50)) > 0.2);
}

#[test]
fn a_stranded_tunnel_counts_as_an_error_step() {
    let mut f = forecaster();
    f.observe_step([1.0, 1.0], 1);
    let c = f.calibration();
    assert_eq!((c.steps, c.saturated_steps), (1, 1));
    assert!(c.k > K_START);
    // Tunnels waiting while no node is active yet: still a step, and an error.
    f.observe_step([], 2);
    assert_eq!(f.calibration().saturated_steps, 2);
    // Neither saturated nor stranded: no error.
    f.observe_step([1.0], 0);
    let c = f.calibration();
    assert_eq!((c.steps, c.saturated_steps), (3, 2));
}

#[test]
fn a_small_load_on_one_node_is_not_fragmented() {
    let mut f = forecaster();
    // One tunnel at a steady 0.3 Gbit/s (a fifteenth of a node's limit) on 2 active nodes.
    for _ in 0..(MIN_SAMPLES as usize + 10) {
        f.observe_step([0.3, 0.0], 0);
        f.size(TunnelId(1), 0.3, 1.5);
    }
    let hint = f.hint().unwrap();
    // 2 active nodes for a load that needs 1: fragmentation 2 (not 2 / (0.3 / 4.5) = 30),
    // applied to the load only; no rise, so one node.
    assert!((hint.fragmentation - 2.0).abs() < 1e-9, "{hint:?}");
    assert!(hint.rise < 0.01, "{hint:?}");
    assert_eq!(hint.nodes, 1, "{hint:?}");
}

#[test]
fn a_carried_size_counts_in_the_aggregate_only() {
    let mut f = forecaster();
    let steady = |f: &mut Forecaster| {
        f.observe_nodes([2.0]);
        f.size(TunnelId(1), 1.0, 1.5);
        f.size(TunnelId(2), 0.5, 1.5)
    };
    for _ in 0..30 {
        steady(&mut f);
    }
    let before = f.hint().unwrap();
    // Tunnel 2 not measured this step: carried at its last size, the sum does not dip and its
    // own forecast is left as it was; a size that is not a number is ignored.
    f.observe_nodes([2.0]);
    f.size(TunnelId(1), 1.0, 1.5);
    f.carry(0.5, 1.5);
    f.carry(f64::NAN, 1.5);
    let hint = f.hint().unwrap();
    assert_eq!((hint.level, hint.rise), (before.level, before.rise));
    assert_eq!(f.tunnels[&TunnelId(2)].samples, 29);
    assert!((steady(&mut f) - 0.5).abs() < 1e-9);
}
