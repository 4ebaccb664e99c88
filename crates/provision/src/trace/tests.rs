use super::*;

fn small() -> Trace {
    Trace::new(
        vec![3, 7],
        vec![1.5, 1.5],
        3,
        vec![0.0, 1.5, 0.25, 0.125, 1.0 / 3.0, 0.1],
    )
    .unwrap()
}

fn csv_err(text: &str) -> (usize, String) {
    match Trace::from_csv(text, 1.5) {
        Err(TraceError::Csv { line, reason }) => (line, reason),
        other => panic!("expected a CSV error, got {other:?}"),
    }
}

#[test]
fn accessors_and_totals() {
    let t = small();
    assert_eq!((t.tunnels(), t.minutes()), (2, 3));
    assert_eq!(t.ids(), &[3, 7]);
    assert_eq!(t.minute(1), &[0.25, 0.125]);
    assert!(t.minute(3).is_empty());
    assert_eq!(t.demand(0, 1), 1.5);
    assert_eq!(t.demand(9, 0), 0.0);
    assert_eq!(t.demand(0, 9), 0.0);
    assert_eq!(t.totals()[0], 1.5);
    assert_eq!(t.peak_total(), 1.5);
    assert!((t.mean_total() - (1.5 + 0.375 + 1.0 / 3.0 + 0.1) / 3.0).abs() < 1e-12);
    assert!((t.tunnel_mean(1) - (1.5 + 0.125 + 0.1) / 3.0).abs() < 1e-12);
    assert_eq!(t.dedicated_capacity(), 6.0);
    assert!(t.to_string().starts_with("2 tunnels × 3 minutes"));
}

#[test]
fn new_rejects_inconsistent_traces() {
    let err = |r: Result<Trace, TraceError>| r.unwrap_err().to_string();
    assert_eq!(
        err(Trace::new(vec![], vec![], 1, vec![])),
        "trace: no tunnels"
    );
    assert_eq!(
        err(Trace::new(vec![1], vec![1.0], 0, vec![])),
        "trace: no minutes"
    );
    assert!(err(Trace::new(vec![1], vec![1.0, 2.0], 1, vec![0.0])).contains("2 caps"));
    assert!(err(Trace::new(vec![2, 1], vec![1.0; 2], 1, vec![0.0; 2])).contains("increasing"));
    assert!(err(Trace::new(vec![1], vec![1.0], 2, vec![0.0])).contains("1 demands"));
    assert!(err(Trace::new(vec![1], vec![0.0], 1, vec![0.0])).contains("cap 0"));
    assert_eq!(
        err(Trace::new(
            vec![1, 4],
            vec![1.0; 2],
            2,
            vec![0.0, 0.0, 0.5, 1.5]
        )),
        "trace: minute 1, tunnel 4: demand 1.5 must be finite, from 0 to the cap 1"
    );
    assert!(err(Trace::new(vec![1], vec![1.0], 1, vec![f64::NAN])).contains("NaN"));
}

#[test]
fn csv_round_trip_is_exact() {
    let t = small();
    let text = t.to_csv();
    assert!(text.starts_with("minute,tunnel,gbps\n0,3,0\n0,7,1.5\n"));
    assert_eq!(Trace::from_csv(&text, 1.5).unwrap(), t);

    let generated = generate(
        &TraceParams {
            tunnels: 20,
            minutes: 120,
            mean_total_gbps: 6.0,
            ..TraceParams::paper()
        },
        9,
    )
    .unwrap();
    let back = Trace::from_csv(&generated.to_csv(), 1.5).unwrap();
    assert_eq!(back, generated);
}

#[test]
fn csv_is_lenient_about_layout_and_fills_missing_rows_with_zero() {
    let text = "\u{feff}\n  minute , tunnel , gbps \r\n\n2, 10, 0.5\r\n0,4,1\n";
    let t = Trace::from_csv(text, 1.5).unwrap();
    assert_eq!(t.ids(), &[4, 10]);
    assert_eq!(t.minutes(), 3);
    assert_eq!(t.minute(0), &[1.0, 0.0]);
    assert_eq!(t.minute(1), &[0.0, 0.0]);
    assert_eq!(t.minute(2), &[0.0, 0.5]);
}

#[test]
fn csv_errors_name_the_line() {
    assert_eq!(csv_err("").0, 1);
    assert!(csv_err("").1.contains("empty"));
    let (line, reason) = csv_err("\n\nminute,tunnel\n0,1,0.5\n");
    assert_eq!(line, 3);
    assert!(
        reason.contains("expected the header `minute,tunnel,gbps`"),
        "{reason}"
    );
    let (line, reason) = csv_err("minute,tunnel,gbps\n");
    assert_eq!(line, 1);
    assert!(reason.contains("no rows"), "{reason}");
    assert_eq!(
        csv_err("minute,tunnel,gbps\n0,1,0.5\n\n1,1\n"),
        (4, "expected 3 fields (minute,tunnel,gbps), found 2".into())
    );
    assert_eq!(
        csv_err("minute,tunnel,gbps\n-1,1,0.5\n"),
        (2, "minute `-1`: not a whole number".into())
    );
    assert!(csv_err("minute,tunnel,gbps\n0,x,0.5\n")
        .1
        .starts_with("tunnel `x`"));
    assert_eq!(
        csv_err("minute,tunnel,gbps\n0,1,fast\n"),
        (2, "gbps `fast`: not a number".into())
    );
    assert!(csv_err("minute,tunnel,gbps\n0,1,-0.1\n")
        .1
        .contains("not negative"));
    assert!(csv_err("minute,tunnel,gbps\n0,1,NaN\n")
        .1
        .contains("finite"));
    assert!(csv_err("minute,tunnel,gbps\n0,1,inf\n")
        .1
        .contains("finite"));
    let (line, reason) = csv_err("minute,tunnel,gbps\n0,1,0.5\n0,2,1.6\n");
    assert_eq!(line, 3);
    assert!(reason.contains("above the cap 1.5"), "{reason}");
    assert_eq!(
        csv_err("minute,tunnel,gbps\n0,1,0.5\n1,1,0.5\n0,1,0.7\n"),
        (4, "minute 0, tunnel 1 already given on line 2".into())
    );
    assert!(csv_err("minute,tunnel,gbps\n999999999,1,0.5\n")
        .1
        .contains("too large"));
    let (line, reason) = csv_err("minute,tunnel,gbps\n0,1,0.5\n9999999,2,0.5\n0,3,0\n0,4,0\n0,5,0\n0,6,0\n0,7,0\n0,8,0\n0,9,0\n0,10,0\n0,11,0\n");
    assert_eq!(line, 3);
    assert!(reason.contains("more than"), "{reason}");
    assert!(matches!(
        Trace::from_csv("minute,tunnel,gbps\n0,1,0.5\n", 0.0),
        Err(TraceError::Invalid(_))
    ));
}

#[test]
fn the_generator_is_deterministic_per_seed() {
    let params = TraceParams {
        tunnels: 30,
        minutes: 200,
        mean_total_gbps: 10.0,
        ..TraceParams::paper()
    };
    let a = generate(&params, 42).unwrap();
    assert_eq!(a, generate(&params, 42).unwrap());
    assert_ne!(a, generate(&params, 43).unwrap());
}

#[test]
fn the_paper_preset_has_the_papers_statistics() {
    let params = TraceParams::paper();
    for seed in [1, 2, 3] {
        let t = generate(&params, seed).unwrap();
        assert_eq!(t.tunnels(), 170);
        assert_eq!(t.minutes(), 1440);
        assert!(t.caps().iter().all(|&c| c == 1.5));
        assert!((t.mean_total() - 57.5).abs() < 0.01, "{}", t.mean_total());
        assert!((t.dedicated_capacity() - 510.0).abs() < 1e-9);
        for m in 0..t.minutes() {
            assert!(t.minute(m).iter().all(|&d| (0.0..=1.5).contains(&d)));
        }
        // Heavy-tailed means: the largest tunnel carries far more than the median one.
        let mut means: Vec<f64> = (0..t.tunnels()).map(|i| t.tunnel_mean(i)).collect();
        means.sort_by(f64::total_cmp);
        assert!(
            means[169] > 4.0 * means[85],
            "{} vs {}",
            means[169],
            means[85]
        );
        // Some tunnels reach their cap (bursts, large tenants).
        let capped = (0..t.minutes())
            .flat_map(|m| t.minute(m).iter())
            .filter(|&&d| d >= 1.5)
            .count();
        assert!(capped > 0);
        // A diurnal pattern: the busiest hour is well above the quietest.
        let totals = t.totals();
        let hours: Vec<f64> = totals
            .chunks(60)
            .map(|h| h.iter().sum::<f64>() / 60.0)
            .collect();
        let (lo, hi) = hours
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), &h| (lo.min(h), hi.max(h)));
        assert!(hi > 1.2 * lo, "hours from {lo} to {hi}");
        assert!(t.peak_total() < 510.0 / 2.0);
    }
}

#[test]
fn tenants_of_a_group_move_together() {
    // With full group correlation and no other variation, tunnels of one group are perfectly
    // correlated in log space; with none, they are not.
    let base = TraceParams {
        tunnels: 40,
        minutes: 600,
        groups: 1,
        diurnal_amplitude: (0.0, 0.0),
        jitter_sd: 0.0,
        bursts_per_day: 0.0,
        mean_total_gbps: 4.0,
        ..TraceParams::paper()
    };
    let corr = |t: &Trace| {
        let x: Vec<f64> = (0..t.minutes()).map(|m| t.demand(m, 0).ln()).collect();
        let y: Vec<f64> = (0..t.minutes()).map(|m| t.demand(m, 1).ln()).collect();
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (mx, my) = (mean(&x), mean(&y));
        let cov: f64 = x.iter().zip(&y).map(|(a, b)| (a - mx) * (b - my)).sum();
        let vx: f64 = x.iter().map(|a| (a - mx).powi(2)).sum();
        let vy: f64 = y.iter().map(|b| (b - my).powi(2)).sum();
        cov / (vx * vy).sqrt()
    };
    let together = generate(
        &TraceParams {
            group_correlation: 1.0,
            ..base.clone()
        },
        5,
    )
    .unwrap();
    assert!(corr(&together) > 0.999, "{}", corr(&together));
    let apart = generate(
        &TraceParams {
            group_correlation: 0.0,
            ..base
        },
        5,
    )
    .unwrap();
    assert!(corr(&apart).abs() < 0.5, "{}", corr(&apart));
}

#[test]
fn generator_parameters_are_validated() {
    let check = |p: TraceParams, field: &str| {
        let err = generate(&p, 1).unwrap_err();
        assert!(
            matches!(err, TraceError::InvalidParams { field: f, .. } if f == field),
            "{field}: {err}"
        );
    };
    let p = TraceParams::paper;
    check(TraceParams { tunnels: 0, ..p() }, "tunnels");
    check(TraceParams { minutes: 0, ..p() }, "minutes");
    check(
        TraceParams {
            minutes: usize::MAX,
            ..p()
        },
        "minutes",
    );
    check(
        TraceParams {
            cap_gbps: -1.0,
            ..p()
        },
        "cap_gbps",
    );
    check(
        TraceParams {
            mean_total_gbps: 255.0,
            ..p()
        },
        "mean_total_gbps",
    );
    check(
        TraceParams {
            mean_log_sd: f64::NAN,
            ..p()
        },
        "mean_log_sd",
    );
    check(TraceParams { groups: 0, ..p() }, "groups");
    check(
        TraceParams {
            group_correlation: 1.5,
            ..p()
        },
        "group_correlation",
    );
    check(
        TraceParams {
            diurnal_amplitude: (0.5, 0.1),
            ..p()
        },
        "diurnal_amplitude",
    );
    check(
        TraceParams {
            slow_minutes: 0.0,
            ..p()
        },
        "slow_minutes",
    );
    check(
        TraceParams {
            burst_minutes: 0.5,
            ..p()
        },
        "burst_minutes",
    );
    check(
        TraceParams {
            burst_factor: (0.5, 2.0),
            ..p()
        },
        "burst_factor",
    );
    check(
        TraceParams {
            peak_minute: f64::INFINITY,
            ..p()
        },
        "peak_minute",
    );
    check(
        TraceParams {
            minutes_per_day: 0.0,
            ..p()
        },
        "minutes_per_day",
    );
    assert_eq!(
        generate(&TraceParams { groups: 0, ..p() }, 1)
            .unwrap_err()
            .to_string(),
        "trace generator: groups = 0: must be at least 1"
    );
}

#[test]
fn rng_is_uniform_enough_and_its_helpers_stay_in_range() {
    let mut rng = Rng::new(7);
    let n = 20_000;
    let mean = (0..n).map(|_| rng.unit()).sum::<f64>() / n as f64;
    assert!((mean - 0.5).abs() < 0.01, "{mean}");
    let normals: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
    let m = normals.iter().sum::<f64>() / n as f64;
    let v = normals.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n as f64;
    assert!(m.abs() < 0.03 && (v - 1.0).abs() < 0.05, "{m} {v}");
    let g = (0..n).map(|_| rng.geometric(0.1) as f64).sum::<f64>() / n as f64;
    assert!((g - 10.0).abs() < 0.5, "{g}");
    assert_eq!(rng.geometric(1.0), 1);
    assert_eq!(rng.geometric(0.0), 1);
    assert!((0..1000).all(|_| rng.below(3) < 3));
    assert_eq!(rng.below(0), 0);
    assert_ne!(Rng::stream(1, 1).next_u64(), Rng::stream(1, 2).next_u64());
}

#[test]
fn arrivals_are_checked_against_the_demand() {
    let trace = Trace::new(
        vec![1, 2],
        vec![1.0, 1.0],
        3,
        vec![0.5, 0.0, 0.5, 0.0, 0.5, 0.3],
    )
    .expect("valid");
    assert_eq!(trace.arrival(1), 0);
    let late = trace
        .clone()
        .with_arrivals(vec![0, 2])
        .expect("tunnel 2 idle before minute 2");
    assert_eq!(
        (late.arrival(0), late.arrival(1), late.arrival(9)),
        (0, 2, 0)
    );
    let err = trace
        .clone()
        .with_arrivals(vec![1, 0])
        .expect_err("demand before arrival");
    assert!(
        err.to_string().contains("tunnel 1: demand in minute 0"),
        "{err}"
    );
    let err = trace
        .clone()
        .with_arrivals(vec![0, 3])
        .expect_err("past the end");
    assert!(
        err.to_string().contains("the trace ends at minute 2"),
        "{err}"
    );
    let err = trace
        .with_arrivals(vec![0])
        .expect_err("one arrival missing");
    assert!(
        err.to_string().contains("1 arrivals for 2 tunnels"),
        "{err}"
    );
}

/// FNV-1a over the bits of every demand, in order: a fingerprint of a whole trace.
fn fingerprint(trace: &Trace) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for m in 0..trace.minutes() {
        for &d in trace.minute(m) {
            for b in d.to_bits().to_le_bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    h
}

#[test]
fn the_paper_preset_is_unchanged() {
    // Fingerprints taken before the trace families were added (commit 01de4b1): the paper
    // preset must keep giving the same trace for the same seed, byte for byte, for one day
    // and for two.
    for (minutes, seed, expected) in [
        (1440, 1, 0xc898_a67f_cbc9_10bd_u64),
        (1440, 2, 0x36d1_7905_891b_d520),
        (2880, 1, 0x4954_fdfd_0ddd_862d),
    ] {
        let params = TraceParams {
            minutes,
            ..TraceParams::paper()
        };
        let trace = generate(&params, seed).unwrap();
        assert_eq!(
            fingerprint(&trace),
            expected,
            "{minutes} minutes, seed {seed}"
        );
    }
}
