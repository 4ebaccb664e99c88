//! Tests of arrivals, the warm-up before the scored minutes, and adaptive sizing in the
//! simulator.

use super::*;

fn quiet(_: Progress<'_>) {}

/// A small deterministic generator (xorshift64*), so these traces do not depend on the
/// trace module's.
struct Xorshift(u64);

impl Xorshift {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// 10 tunnels of 0.3 Gbit/s for 20 minutes; tunnels 8 and 9 arrive at minutes 5 and 7 (9 at
/// 1.4 Gbit/s).
fn arrivals_trace() -> Trace {
    let (n, minutes) = (10, 20);
    let mut demand = Vec::with_capacity(n * minutes);
    for m in 0..minutes {
        for i in 0..n {
            demand.push(match i {
                8 if m < 5 => 0.0,
                9 if m < 7 => 0.0,
                9 => 1.4,
                _ => 0.3,
            });
        }
    }
    let mut arrivals = vec![0; n];
    arrivals[8] = 5;
    arrivals[9] = 7;
    Trace::new((0..n as u32).collect(), vec![1.5; n], minutes, demand)
        .unwrap()
        .with_arrivals(arrivals)
        .unwrap()
}

#[test]
fn a_tunnel_is_judged_from_its_arrival() {
    let trace = arrivals_trace();
    for sizing in [
        Sizing::Measured,
        Sizing::Envelope { steps: 2 },
        Sizing::Adaptive,
    ] {
        let mut config = SimConfig::paper(1.5);
        config.sizing = sizing;
        let run = run_policy(&trace, &config, Policy::Protego, Instant::now(), &mut quiet).unwrap();
        let tunnels: Vec<u32> = run.minutes.iter().map(|m| m.tunnels).collect();
        let mut expected = vec![8; 5];
        expected.extend([9, 9]);
        expected.extend([10; 13]);
        assert_eq!(tunnels, expected, "{sizing}");
        // Placed when it arrives: never under-served (a tunnel on no node with demand is).
        assert!(
            run.minutes.iter().all(|m| m.underserved_tunnels == 0),
            "{sizing}"
        );
        assert_eq!(run.summary.guarantee_pct, 100.0);
        assert_eq!(run.summary.tunnel_guarantee_pct, 100.0);
    }
    // The tunnels before their arrival are not judged: with 8 tunnels (a 99 % guarantee
    // tolerates none under-served) a judge that counted all 10 would read the same; the
    // per-minute tolerance follows the tunnels that exist.
    let config = SimConfig::paper(1.5);
    let mut judge = Judge::new(&trace, &config);
    // Minute 3: tunnel 9 on no node (it does not exist yet); the others on one node.
    let stats = *judge.minute(3, &[(0..9).collect()], 1, 1);
    assert_eq!((stats.tunnels, stats.underserved_tunnels), (8, 0));
    // Minute 8: tunnel 9 exists, has demand and no node: under-served.
    let stats = *judge.minute(8, &[(0..9).collect()], 1, 1);
    assert_eq!((stats.tunnels, stats.underserved_tunnels), (10, 1));
    let run = judge.finish(Policy::Protego, 10);
    // Tunnel 9 existed in one judged minute and was under-served in it.
    assert_eq!(run.summary.violation_minutes, 1);
}

#[test]
fn minutes_before_the_score_are_a_warm_up() {
    let trace = arrivals_trace();
    let mut config = SimConfig::protego(1.5);
    let full = run_policy(&trace, &config, Policy::Protego, Instant::now(), &mut quiet).unwrap();
    config.score_from_minute = 12;
    let scored = run_policy(&trace, &config, Policy::Protego, Instant::now(), &mut quiet).unwrap();
    assert_eq!(scored.minutes.len(), 20);
    assert_eq!(scored.summary.minutes, 8);
    let active = scored.minutes[12..]
        .iter()
        .map(|m| m.active_gbps)
        .sum::<f64>()
        / 8.0;
    assert!((scored.summary.active_capacity_gbps - active).abs() < 1e-9);
    let demand = scored.minutes[12..]
        .iter()
        .map(|m| m.demand_gbps)
        .sum::<f64>()
        / 8.0;
    assert!((scored.summary.mean_demand_gbps - demand).abs() < 1e-9);
    assert!((demand - (8.0 * 0.3 + 0.3 + 1.4)).abs() < 1e-9);
    assert!((full.summary.mean_demand_gbps - demand).abs() > 0.1);
    for policy in [Policy::Dedicated, Policy::LowerBound, Policy::StaticPeak] {
        let run = run_policy(&trace, &config, policy, Instant::now(), &mut quiet).unwrap();
        assert_eq!(run.summary.minutes, 8, "{policy:?}");
        assert_eq!(run.summary.guarantee_pct, 100.0, "{policy:?}");
    }
    config.score_from_minute = 20;
    assert!(matches!(
        run_policy(&trace, &config, Policy::Protego, Instant::now(), &mut quiet),
        Err(SimError::InvalidConfig {
            field: "score_from_minute",
            ..
        })
    ));
}

/// 40 tunnels (cap 1.5 Gbit/s) at steady levels of 0.2–0.6 Gbit/s with ±2 % noise for
/// `calm` minutes, then each minute an independent draw of 0.3–2.2 times the level (capped):
/// a sudden step-up in volatility.
fn step_up_trace(calm: usize, minutes: usize) -> Trace {
    let n = 40;
    let mut rng = Xorshift(0x9E37_79B9_7F4A_7C15);
    let levels: Vec<f64> = (0..n).map(|_| 0.2 + 0.4 * rng.unit()).collect();
    let mut demand = Vec::with_capacity(n * minutes);
    for m in 0..minutes {
        for &level in &levels {
            let factor = if m < calm {
                0.98 + 0.04 * rng.unit()
            } else {
                0.3 + 1.9 * rng.unit()
            };
            demand.push((level * factor).min(1.5));
        }
    }
    Trace::new((0..n as u32).collect(), vec![1.5; n], minutes, demand).unwrap()
}

#[test]
fn adaptive_sizing_keeps_its_guarantee_when_volatility_steps_up() {
    let (calm, minutes) = (400, 1000);
    let trace = step_up_trace(calm, minutes);
    let run = |sizing: Sizing| {
        let mut config = SimConfig::protego(1.5);
        config.sizing = sizing;
        config.warm_start = false;
        config.score_from_minute = calm;
        run_policy(&trace, &config, Policy::Protego, Instant::now(), &mut quiet).unwrap()
    };
    let adaptive = run(Sizing::Adaptive);
    let measured = run(Sizing::Measured);
    let envelope = run(Sizing::Envelope { steps: 2 });
    // Its calibrated target is 97 %; the rules fixed in advance lose far more.
    let g = |r: &Run| r.summary.guarantee_pct;
    assert!(g(&adaptive) >= 95.0, "{:?}", adaptive.summary);
    assert!(g(&measured) < 80.0, "{:?}", measured.summary);
    assert!(g(&envelope) < g(&adaptive) - 3.0, "{:?}", envelope.summary);
    // The calibrator reacted: capacity per Gbit/s of demand is higher once the demand is
    // volatile than while it was calm.
    let ratio = |range: core::ops::Range<usize>| {
        let m = &adaptive.minutes[range];
        m.iter().map(|m| m.active_gbps).sum::<f64>() / m.iter().map(|m| m.demand_gbps).sum::<f64>()
    };
    let (before, after) = (ratio(200..calm), ratio(calm + 100..minutes));
    assert!(after > 1.2 * before, "{before} {after}");
    // And it pays for it: it keeps more capacity than the envelope.
    assert!(adaptive.summary.saving_pct < envelope.summary.saving_pct);
}

/// 6 tunnels of 0.3 Gbit/s for 12 minutes at τ = 2 minutes; tunnel 4 arrives at minute 1
/// (within the first step), tunnel 5 at minute 5 (within the third), both at 0.9 Gbit/s.
fn mid_step_trace() -> Trace {
    let (n, minutes) = (6, 12);
    let mut demand = Vec::with_capacity(n * minutes);
    for m in 0..minutes {
        for i in 0..n {
            demand.push(match i {
                4 if m < 1 => 0.0,
                5 if m < 5 => 0.0,
                4 | 5 => 0.9,
                _ => 0.3,
            });
        }
    }
    let mut arrivals = vec![0; n];
    arrivals[4] = 1;
    arrivals[5] = 5;
    Trace::new((0..n as u32).collect(), vec![1.5; n], minutes, demand)
        .unwrap()
        .with_arrivals(arrivals)
        .unwrap()
}

fn two_minute_steps(sizing: Sizing) -> SimConfig {
    let mut config = SimConfig::paper(1.5);
    config.planner.tau = Duration::from_secs(120);
    config.sizing = sizing;
    config
}

#[test]
fn a_tunnel_arriving_within_the_first_step_is_in_before_it() {
    let trace = mid_step_trace();
    for sizing in [
        Sizing::Measured,
        Sizing::Envelope { steps: 2 },
        Sizing::Adaptive,
    ] {
        let config = two_minute_steps(sizing);
        for policy in [Policy::Protego, Policy::Paper] {
            let run = run_policy(&trace, &config, policy, Instant::now(), &mut quiet).unwrap();
            assert!(
                run.minutes.iter().all(|m| m.underserved_tunnels == 0),
                "{sizing} {policy:?}"
            );
            assert_eq!(run.minutes[1].tunnels, 5);
        }
    }
}

#[test]
fn a_tunnel_is_measured_only_from_its_arrival() {
    let trace = mid_step_trace();
    // Tunnel 5 arrives at minute 5, the second minute of step 2 (minutes 4 and 5).
    assert_eq!(measurement(&trace, 2, 2, 5), 0.9);
    assert_eq!(measurement(&trace, 2, 1, 5), 0.0);
    assert_eq!(measurement(&trace, 2, 3, 5), 0.9);
    // Tunnel 4, from minute 1: step 0 measures minute 1 only.
    assert_eq!(measurement(&trace, 2, 0, 4), 0.9);
    // A tunnel there from the start: the step's mean.
    assert_eq!(measurement(&trace, 2, 0, 0), 0.3);
    assert_eq!(measurement(&trace, 1, 4, 5), 0.0);
}

#[test]
fn saving_counts_the_pairs_of_the_tunnels_that_exist() {
    // 8 tunnels for minutes 0–4, 9 for 5–6, 10 from 7: pairs of 2 × 1.5 Gbit/s each.
    let trace = arrivals_trace();
    let dedicated = (5.0 * 24.0 + 2.0 * 27.0 + 13.0 * 30.0) / 20.0;
    let config = SimConfig::protego(1.5);
    for policy in [Policy::Protego, Policy::Paper, Policy::StaticPeak] {
        let run = run_policy(&trace, &config, policy, Instant::now(), &mut quiet).unwrap();
        let s = run.summary;
        let expected = 100.0 * (1.0 - s.active_capacity_gbps / dedicated);
        assert!((s.saving_pct - expected).abs() < 1e-9, "{policy:?} {s:?}");
    }
    let run = run_policy(
        &trace,
        &config,
        Policy::Dedicated,
        Instant::now(),
        &mut quiet,
    )
    .unwrap();
    assert_eq!(run.minutes[0].active_gbps, 24.0);
    assert_eq!(run.minutes[0].active_nodes, 16);
    assert_eq!(run.minutes[19].active_gbps, 30.0);
    assert!(run.summary.saving_pct.abs() < 1e-9, "{:?}", run.summary);
    // From minute 12 on all 10 exist: the full 30 Gbit/s.
    let scored = SimConfig {
        score_from_minute: 12,
        ..config
    };
    let run = run_policy(&trace, &scored, Policy::Protego, Instant::now(), &mut quiet).unwrap();
    let s = run.summary;
    assert_eq!(s.saving_pct, 100.0 * (1.0 - s.active_capacity_gbps / 30.0));
}

#[test]
fn the_paper_algorithm_leaves_no_tunnel_settling() {
    // Issue 24: Protego gives an arriving tunnel the prior and lets it settle under every
    // sizing rule; the paper's algorithm, as published, places it at 0 and may move it.
    for sizing in crate::sizing::every_rule() {
        let sizer = Sizer::new(sizing);
        for (policy, settles, alpha) in [
            (Policy::Protego, true, sizer.prior(1.5)),
            (Policy::Paper, false, 0.0),
        ] {
            let mut cluster = Cluster::new();
            admit(&mut cluster, &sizer, policy, TunnelId(1), 1.5).unwrap();
            let state = cluster.tunnel(TunnelId(1)).unwrap();
            assert_eq!(state.settling, settles, "{sizing} {policy:?}");
            assert_eq!(state.alpha, alpha, "{sizing} {policy:?}");
        }
        assert_eq!(sizer.prior(1.5), 1.5, "{sizing}");
    }
}

#[test]
fn a_warm_up_is_recorded_once_and_primes_nothing() {
    let trace = step_up_trace(60, 200);
    let run = |warm_start: bool, score_from_minute: usize| {
        let config = SimConfig {
            warm_start,
            score_from_minute,
            ..SimConfig::protego(1.5)
        };
        run_policy(&trace, &config, Policy::Protego, Instant::now(), &mut quiet).unwrap()
    };
    // With a warm-up the warm start changes nothing: the warm-up is the history.
    assert_eq!(run(true, 60), run(false, 60));
    // Without one it primes the histograms with the trace.
    assert_ne!(run(true, 0), run(false, 0));
}

#[test]
fn the_judged_minutes_must_be_in_the_trace() {
    let trace = arrivals_trace();
    let mut config = SimConfig::paper(1.5);
    // The last minute is a minute of the trace: one minute judged.
    config.score_from_minute = 19;
    let run = run_policy(&trace, &config, Policy::Protego, Instant::now(), &mut quiet).unwrap();
    assert_eq!(run.summary.minutes, 1);
    config.score_from_minute = 20;
    let err = run_policy(&trace, &config, Policy::Protego, Instant::now(), &mut quiet).unwrap_err();
    assert!(
        err.to_string()
            .contains("must be a minute of the trace (below its length)"),
        "{err}"
    );
}
