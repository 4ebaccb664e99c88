//! The optional parts of the generator, each alone on a flat trace where its effect is exact.

use super::*;
use crate::trace::params::{
    Arrivals, GlobalShock, GroupBursts, HourlyBase, LevelShifts, OnOff, Pareto,
};

/// A small trace where every tunnel's demand is the same constant unless a part moves it: no
/// spread of means, no diurnal cycle, no variation, no bursts; low enough never to be capped.
fn flat() -> TraceParams {
    TraceParams {
        tunnels: 12,
        minutes: 600,
        mean_total_gbps: 2.4,
        mean_log_sd: 0.0,
        groups: 3,
        diurnal_amplitude: (0.0, 0.0),
        slow_sd: 0.0,
        jitter_sd: 0.0,
        bursts_per_day: 0.0,
        ..TraceParams::paper()
    }
}

/// Demand series of tunnel `i`.
fn series(t: &Trace, i: usize) -> Vec<f64> {
    (0..t.minutes()).map(|m| t.demand(m, i)).collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn the_flat_trace_is_flat() {
    let t = generate(&flat(), 1).unwrap();
    let d = t.demand(0, 0);
    assert!(close(d, 0.2), "{d}");
    assert!((0..t.minutes()).all(|m| t.minute(m).iter().all(|&x| close(x, d))));
}

#[test]
fn mixed_caps_go_round_and_scale_the_weights() {
    let params = TraceParams {
        cap_mix: vec![0.5, 1.0, 1.5],
        ..flat()
    };
    let t = generate(&params, 1).unwrap();
    assert_eq!(&t.caps()[..4], &[0.5, 1.0, 1.5, 0.5]);
    assert_eq!(params.cap_total(), 12.0);
    // Demand in proportion to the cap.
    assert!(close(t.demand(0, 2), 3.0 * t.demand(0, 0)));
    assert!(close(t.mean_total(), 2.4));
}

#[test]
fn on_off_tunnels_are_silent_while_off() {
    let params = TraceParams {
        on_off: Some(OnOff {
            fraction: 0.5,
            on_minutes: 10.0,
            off_minutes: 20.0,
        }),
        ..flat()
    };
    let t = generate(&params, 3).unwrap();
    let switching: Vec<usize> = (0..12).filter(|&i| series(&t, i).contains(&0.0)).collect();
    assert_eq!(switching.len(), 6, "{switching:?}");
    for &i in &switching {
        let s = series(&t, i);
        let on = s.iter().filter(|&&x| x > 0.0).count() as f64 / s.len() as f64;
        // On a third of the time on average; one tunnel over 600 minutes is noisy.
        assert!((0.05..0.8).contains(&on), "tunnel {i}: on {on}");
        // While on, the flat level.
        let level = s.iter().copied().fold(0.0, f64::max);
        assert!(s.iter().all(|&x| x == 0.0 || close(x, level)));
    }
    assert!(close(t.mean_total(), 2.4));
}

#[test]
fn a_group_bursts_as_one() {
    let params = TraceParams {
        group_bursts: Some(GroupBursts {
            per_day: 20.0,
            minutes: 15.0,
            factor: (2.0, 3.0),
        }),
        ..flat()
    };
    let t = generate(&params, 5).unwrap();
    let (mut bursting, mut quiet) = (0, 0);
    for i in 0..12 {
        let s = series(&t, i);
        let base = s.iter().copied().fold(f64::MAX, f64::min);
        // Every minute at the quiet level or at a burst of ×2–3.
        for x in s {
            if close(x, base) {
                quiet += 1;
            } else {
                bursting += 1;
                assert!(
                    (2.0 - 1e-9..=3.0 + 1e-9).contains(&(x / base)),
                    "{x} {base}"
                );
            }
        }
    }
    assert!(bursting > 0 && quiet > 0);
    // Two tunnels of one group are always at the same level.
    let mut groups = Rng::stream(5, 2);
    let group_of: Vec<usize> = (0..12).map(|_| groups.below(3)).collect();
    for i in 0..12 {
        for j in (i + 1)..12 {
            if group_of[i] == group_of[j] {
                assert!(series(&t, i)
                    .iter()
                    .zip(series(&t, j))
                    .all(|(a, b)| close(*a, b)));
            }
        }
    }
}

#[test]
fn a_global_shock_moves_every_tunnel_alike() {
    let params = TraceParams {
        global_shock: Some(GlobalShock {
            sd: 0.3,
            minutes: 30.0,
        }),
        ..flat()
    };
    let t = generate(&params, 2).unwrap();
    for m in 0..t.minutes() {
        let d = t.minute(m);
        assert!(d.iter().all(|&x| close(x, d[0])));
    }
    let totals = t.totals();
    let (lo, hi) = (
        totals.iter().copied().fold(f64::MAX, f64::min),
        totals.iter().copied().fold(0.0, f64::max),
    );
    assert!(hi > 1.2 * lo, "{lo} {hi}");
}

#[test]
fn levels_jump_and_stay() {
    let params = TraceParams {
        level_shifts: Some(LevelShifts {
            per_day: 10.0,
            factor: (0.3, 3.0),
        }),
        ..flat()
    };
    let t = generate(&params, 4).unwrap();
    let mut jumps = 0;
    for i in 0..12 {
        let s = series(&t, i);
        let changes = s.windows(2).filter(|w| !close(w[0], w[1])).count();
        jumps += changes;
        // Piecewise constant: a handful of levels, not a new value every minute.
        assert!(changes < 30, "tunnel {i}: {changes} changes");
    }
    // About 10 a day × 12 tunnels × 600 minutes / 1440.
    assert!((15..90).contains(&jumps), "{jumps}");
}

#[test]
fn the_hourly_base_is_linear_within_each_hour() {
    let params = TraceParams {
        hourly_base: Some(HourlyBase {
            sd: 0.4,
            minutes: 60,
        }),
        ..flat()
    };
    let t = generate(&params, 6).unwrap();
    for i in 0..12 {
        let s = series(&t, i);
        for hour in s.chunks(60) {
            let step = hour[1] - hour[0];
            assert!(hour.windows(2).all(|w| (w[1] - w[0] - step).abs() < 1e-9));
        }
        // The slope changes from one hour to the next.
        assert!(!close(s[1] - s[0], s[61] - s[60]), "tunnel {i}");
    }
}

#[test]
fn arriving_tunnels_are_recorded_and_silent_before() {
    let params = TraceParams {
        arrivals: Some(Arrivals { fraction: 0.25 }),
        ..flat()
    };
    let t = generate(&params, 7).unwrap();
    let late: Vec<usize> = (0..12).filter(|&i| t.arrival(i) > 0).collect();
    assert_eq!(late.len(), 3);
    for i in late {
        let at = t.arrival(i);
        assert!(at < t.minutes());
        assert!(series(&t, i)[..at].iter().all(|&x| x == 0.0));
        assert!(series(&t, i)[at..].iter().all(|&x| x > 0.0));
    }
    assert!(close(t.mean_total(), 2.4));
}

#[test]
fn optional_parts_are_validated() {
    let field = |p: TraceParams| match p.validate() {
        Err(TraceError::InvalidParams { field, .. }) => field,
        other => panic!("expected an error, got {other:?}"),
    };
    let pareto = Pareto {
        scale: 1.0,
        shape: 1.5,
        max: 0.5,
    };
    assert_eq!(
        field(TraceParams {
            burst_length: BurstLength::Pareto(pareto),
            ..flat()
        }),
        "burst_length"
    );
    assert_eq!(
        field(TraceParams {
            burst_height: BurstHeight::Pareto(Pareto {
                shape: f64::NAN,
                max: 2.0,
                ..pareto
            }),
            ..flat()
        }),
        "burst_height"
    );
    assert_eq!(
        field(TraceParams {
            cap_mix: vec![1.0, 0.0],
            ..flat()
        }),
        "cap_mix"
    );
    // The mean must stay below the sum of the mixed caps (12 × 0.1).
    assert_eq!(
        field(TraceParams {
            cap_mix: vec![0.1],
            ..flat()
        }),
        "mean_total_gbps"
    );
    assert_eq!(
        field(TraceParams {
            on_off: Some(OnOff {
                fraction: 1.5,
                on_minutes: 10.0,
                off_minutes: 10.0
            }),
            ..flat()
        }),
        "on_off"
    );
    assert_eq!(
        field(TraceParams {
            group_bursts: Some(GroupBursts {
                per_day: 1.0,
                minutes: 5.0,
                factor: (0.5, 2.0)
            }),
            ..flat()
        }),
        "group_bursts"
    );
    assert_eq!(
        field(TraceParams {
            global_shock: Some(GlobalShock {
                sd: 0.2,
                minutes: 0.0
            }),
            ..flat()
        }),
        "global_shock"
    );
    assert_eq!(
        field(TraceParams {
            level_shifts: Some(LevelShifts {
                per_day: -1.0,
                factor: (0.3, 3.0)
            }),
            ..flat()
        }),
        "level_shifts"
    );
    assert_eq!(
        field(TraceParams {
            hourly_base: Some(HourlyBase {
                sd: 0.4,
                minutes: 0
            }),
            ..flat()
        }),
        "hourly_base"
    );
    assert_eq!(
        field(TraceParams {
            arrivals: Some(Arrivals { fraction: 0.1 }),
            minutes: 1,
            ..flat()
        }),
        "minutes"
    );
}

#[test]
fn pareto_draws_and_choices_stay_in_range() {
    let mut rng = Rng::new(11);
    let p = Pareto {
        scale: 0.5,
        shape: 1.3,
        max: 20.0,
    };
    let draws: Vec<f64> = (0..20_000).map(|_| rng.pareto(&p)).collect();
    assert!(draws.iter().all(|&x| (0.5..=20.0).contains(&x)));
    // P(X > 2·scale) = 2^−1.3 ≈ 0.406.
    let above = draws.iter().filter(|&&x| x > 1.0).count() as f64 / draws.len() as f64;
    assert!((above - 0.406).abs() < 0.02, "{above}");
    for (n, fraction, want) in [(10, 0.1, 1), (170, 0.1, 17), (5, 0.0, 0), (5, 1.0, 5)] {
        let chosen = rng.choose(n, fraction);
        assert_eq!(chosen.len(), n);
        assert_eq!(chosen.iter().filter(|&&c| c).count(), want);
    }
}
