//! The autoscaler's model on the live cluster's reports: hotspots, decisions, backoff and history.

use super::*;

fn load(interval_ms: u32, mbit: &[(u32, f64)]) -> NodeLoad {
    NodeLoad {
        interval_ms,
        tunnel_bytes: mbit
            .iter()
            .map(|(t, m)| (*t, (m * 1e6 / 8.0 * f64::from(interval_ms) / 1000.0) as u64))
            .collect(),
        ..NodeLoad::default()
    }
}

fn node(id: u32, seq: u64, mbit: &[(u32, f64)]) -> NodeInput {
    NodeInput {
        id,
        name: format!("data{id}"),
        alive: true,
        draining: false,
        parked: false,
        leaving: false,
        provided: None,
        load: Some((seq, load(1000, mbit))),
    }
}

fn input(seq: u64, a: &[(u32, f64)], b: &[(u32, f64)]) -> Input {
    Input {
        nodes: vec![node(1, seq, a), node(2, seq, b)],
        placement: a
            .iter()
            .map(|(t, _)| (TunnelId(*t), 1))
            .chain(b.iter().map(|(t, _)| (TunnelId(*t), 2)))
            .collect(),
        tunnels: (1..=6)
            .map(|t| (TunnelId(t), (format!("t{t}"), Some(1000))))
            .collect(),
        provider: false,
        // The tunnels the nodes report have a CHILD_SA there.
        with_child: a.iter().chain(b).map(|(t, _)| TunnelId(*t)).collect(),
        unplaced: HashSet::new(),
    }
}

fn config(mode: AutoscaleMode) -> AutoscaleConfig {
    AutoscaleConfig {
        mode,
        interval: Duration::from_secs(1),
        ..AutoscaleConfig::default()
    }
}

/// Steps and records the outcomes as advice; returns the plan.
fn advise(a: &mut Autoscaler, at: Instant, input: &Input) -> Plan {
    let plan = a.step(at, SystemTime::now(), input).unwrap();
    let nodes: HashMap<u32, String> = input.nodes.iter().map(|n| (n.id, n.name.clone())).collect();
    let names = Naming {
        nodes: &nodes,
        tunnels: &input.tunnels,
    };
    a.record(at, &names, vec![Outcome::Advised; plan.decisions.len()]);
    plan
}

#[test]
fn a_hot_node_and_the_reserve_are_shown_with_reasons() {
    let mut a = Autoscaler::new(5000, &config(AutoscaleMode::Advise)).unwrap();
    let t0 = Instant::now();
    assert!(a.describe()["step"].is_null());
    // data1 carries 4 × 1.2 Gbit/s = 4.8 of 5 Gbit/s (above T_H = 0.9); data2 a little.
    let hot = [(1, 1200.0), (2, 1200.0), (3, 1200.0), (4, 1200.0)];
    advise(&mut a, t0, &input(1, &hot, &[(5, 100.0)]));
    let d = a.describe();
    let step = &d["step"];
    assert_eq!(d["mode"], "advise");
    assert_eq!(step["tunnels"], 5);
    assert!(
        (step["used_mbit"].as_f64().unwrap() - 4900.0).abs() < 1.0,
        "{d}"
    );
    assert_eq!(step["before"]["hotspots"], 1, "{d}");
    let decisions: Vec<&str> = step["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["decision"].as_str().unwrap())
        .collect();
    // The first step consolidates; either way tunnels leave data1, named as operators
    // know them, and no node stays above T_H.
    assert!(
        decisions
            .iter()
            .any(|d| d.starts_with("migrate t") && d.contains("data1 -> data2")),
        "{decisions:?}"
    );
    assert!(step["decisions"][0]["carried_out"].is_null(), "{d}");
    assert_eq!(step["after"]["hotspots"], 0, "{d}");
    assert!(step["required"].as_u64().unwrap() >= 2, "{d}");
    assert_eq!(d["decisions"].as_array().unwrap().len(), decisions.len());
    let first = decisions.len();
    // The same report again is not recorded twice; a drained node leaves the model.
    let mut again = input(1, &hot, &[(5, 100.0)]);
    again.nodes[1].draining = true;
    advise(&mut a, t0 + Duration::from_secs(1), &again);
    let d = a.describe();
    let nodes = d["step"]["nodes"].as_array().unwrap();
    assert!(nodes.iter().all(|n| n["node"] != "data2"), "{d}");
    // Advice repeated from one step to the next is kept in the history once.
    let repeated = d["step"]["decisions"].as_array().unwrap().len();
    advise(&mut a, t0 + Duration::from_secs(2), &again);
    let d = a.describe();
    assert_eq!(
        d["decisions"].as_array().unwrap().len(),
        first + repeated,
        "{d}"
    );
}

#[test]
fn first_reports_and_lost_nodes_do_not_count() {
    let mut a = Autoscaler::new(5000, &config(AutoscaleMode::Advise)).unwrap();
    assert_eq!(a.tau(), Duration::from_secs(1));
    let mut i = input(1, &[(1, 1000.0)], &[(2, 1000.0)]);
    // data1's first report covers its whole life (no interval); data2 was lost.
    if let Some((_, l)) = i.nodes[0].load.as_mut() {
        l.interval_ms = 0;
    }
    i.nodes[1].alive = false;
    advise(&mut a, Instant::now(), &i);
    let d = a.describe();
    // Neither report measures its tunnel: both (with a CHILD_SA) are at the prior and
    // settling (issue 24), not at the 1000 Mbit/s the reports carry.
    assert_eq!(d["step"]["settling"], 2, "{d}");
    assert_eq!(
        d["step"]["used_mbit"].as_f64(),
        Some(2.0 * a.sizer.prior(2000.0)),
        "{d}"
    );
    for t in [1, 2] {
        assert!(a
            .usage
            .get(provision::TunnelId(t))
            .is_none_or(|h| h.samples() == 0));
    }
}

#[test]
fn decisions_name_nodes_and_tunnels_and_new_nodes_say_so() {
    let nodes: HashMap<u32, String> = [(1, "data1".to_owned()), (12, "data12".to_owned())].into();
    let tunnels: BTreeMap<TunnelId, (String, Option<u32>)> =
        [(TunnelId(1), ("acme-hq".to_owned(), None))].into();
    let names = Naming {
        nodes: &nodes,
        tunnels: &tunnels,
    };
    let migrate = Decision {
        action: Action::Migrate {
            tunnel: provision::TunnelId(1),
            from: NodeId(12),
            to: NodeId(1),
        },
        reason: provision::Reason::Hotspot {
            node: NodeId(12),
            load: 1.0,
            limit: 0.9,
            alpha: 0.2,
        },
    };
    let text = migrate.named(&names).to_string();
    assert!(
        text.starts_with("migrate acme-hq data12 -> data1: data12 is a hotspot"),
        "{text}"
    );
    let start = Decision {
        action: Action::Start {
            node: NodeId(7),
            ready_at: Instant::now(),
        },
        reason: provision::Reason::Empty,
    };
    assert!(
        start
            .named(&names)
            .to_string()
            .starts_with("start a new data node (node7)"),
        "{}",
        start.named(&names)
    );
}

#[test]
fn caps_follow_rate_limits_and_unknown_tunnels_are_ignored() {
    let mut a = Autoscaler::new(5000, &config(AutoscaleMode::Advise)).unwrap();
    let mut i = input(1, &[(1, 9000.0), (99, 100.0)], &[]);
    i.tunnels.get_mut(&TunnelId(1)).unwrap().1 = Some(500);
    advise(&mut a, Instant::now(), &i);
    let d = a.describe();
    // Tunnel 1 is capped at twice its 500 Mbit/s limit; tunnel 99 is not configured.
    assert_eq!(d["step"]["tunnels"], 1, "{d}");
    assert!(
        (d["step"]["used_mbit"].as_f64().unwrap() - 1000.0).abs() < 1e-6,
        "{d}"
    );
}

#[test]
fn nodes_map_onto_the_hierarchy() {
    let a = Autoscaler::new(5000, &config(AutoscaleMode::Act)).unwrap();
    let now = Instant::now();
    let base = node(1, 1, &[]);
    let with = |f: fn(&mut NodeInput)| {
        let mut n = base.clone();
        f(&mut n);
        n
    };
    assert_eq!(a.model_state(&base, false, now), Some(NodeState::Active));
    // Parked: inactive while empty; a parked node that holds tunnels is still serving.
    let parked = with(|n| n.parked = true);
    assert_eq!(
        a.model_state(&parked, false, now),
        Some(NodeState::Inactive)
    );
    assert_eq!(a.model_state(&parked, true, now), Some(NodeState::Active));
    // Drained by an operator, or being stopped: out of the model.
    assert_eq!(
        a.model_state(&with(|n| n.draining = true), false, now),
        None
    );
    let stopping = with(|n| n.provided = Some(ProvidedState::Stopping));
    assert_eq!(a.model_state(&stopping, false, now), None);
    assert_eq!(a.model_state(&with(|n| n.leaving = true), false, now), None);
    // Not registered: the provider's word.
    let lost = with(|n| n.alive = false);
    assert_eq!(a.model_state(&lost, false, now), None);
    let mut booting = lost.clone();
    booting.provided = Some(ProvidedState::Running {
        started_at: Some(now),
    });
    assert_eq!(
        a.model_state(&booting, false, now),
        Some(NodeState::Starting {
            ready_at: now + Duration::from_secs(180)
        })
    );
    for state in [
        ProvidedState::Stopped,
        ProvidedState::Stopping,
        ProvidedState::Failed {
            reason: "exited with status 1".into(),
        },
    ] {
        let mut n = lost.clone();
        n.provided = Some(state);
        assert_eq!(a.model_state(&n, false, now), Some(NodeState::ShutDown));
    }
}

#[test]
fn only_nodes_the_provider_runs_are_stopped() {
    let mut a = Autoscaler::new(5000, &config(AutoscaleMode::Act)).unwrap();
    // data1 serves; data2 (static) and data3 (the provider's) are parked and empty.
    let mut i = input(1, &[(1, 100.0)], &[]);
    i.nodes[1].parked = true;
    let mut managed = node(3, 1, &[]);
    managed.parked = true;
    managed.provided = Some(ProvidedState::Running { started_at: None });
    i.nodes.push(managed);
    i.provider = true;
    let plan = a.step(Instant::now(), SystemTime::now(), &i).unwrap();
    let stops: Vec<NodeId> = plan
        .decisions
        .iter()
        .filter_map(|d| match d.action {
            Action::Stop { node } => Some(node),
            _ => None,
        })
        .collect();
    assert_eq!(stops, vec![NodeId(3)], "{plan}");
}

#[test]
fn failing_nodes_back_off_and_stuck_ones_are_found() {
    let mut a = Autoscaler::new(5000, &config(AutoscaleMode::Act)).unwrap();
    let now = Instant::now();
    let mut n = node(3, 1, &[]);
    n.alive = false;
    n.provided = Some(ProvidedState::Failed {
        reason: "exited with status 1".into(),
    });
    // Failed, never started by us: may be started.
    assert_eq!(a.model_state(&n, false, now), Some(NodeState::ShutDown));
    // Each failure in a row doubles the time it is left out (start latency 3 min).
    a.note_failure(3, now);
    assert_eq!(a.model_state(&n, false, now), None);
    let later = now + Duration::from_secs(181);
    assert_eq!(a.model_state(&n, false, later), Some(NodeState::ShutDown));
    a.starts.get_mut(&3).unwrap().counted = false;
    a.note_failure(3, later);
    assert_eq!(a.backoff(2), Duration::from_secs(360));
    assert_eq!(
        a.model_state(&n, false, later + Duration::from_secs(200)),
        None
    );
    assert_eq!(a.backoff(40), MAX_BACKOFF);
    // A node stopped because it never registered backs off too.
    n.provided = Some(ProvidedState::Stopped);
    assert_eq!(a.model_state(&n, false, later), None);
    // Started 6 min 10 s ago and not registered: stuck.
    let mut starting = node(4, 1, &[]);
    starting.alive = false;
    starting.provided = Some(ProvidedState::Running {
        started_at: Some(now),
    });
    let input = Input {
        nodes: vec![starting],
        provider: true,
        ..Input::default()
    };
    assert!(a.stuck(&input, now + Duration::from_secs(300)).is_empty());
    assert_eq!(
        a.stuck(&input, now + Duration::from_secs(371)),
        vec![(4, "data4".to_owned())]
    );
}

#[test]
fn outcomes_are_shown_and_repeated_failures_kept_once() {
    let mut a = Autoscaler::new(5000, &config(AutoscaleMode::Act)).unwrap();
    let t0 = Instant::now();
    // One node with nothing on it and a parked one: the reserve wants at least one node.
    let mut i = input(1, &[(1, 100.0)], &[]);
    i.nodes[1].parked = true;
    let record = |a: &mut Autoscaler, at: Instant| {
        let plan = a.step(at, SystemTime::now(), &i).unwrap();
        let nodes: HashMap<u32, String> = i.nodes.iter().map(|n| (n.id, n.name.clone())).collect();
        let names = Naming {
            nodes: &nodes,
            tunnels: &i.tunnels,
        };
        let outcomes = plan
            .decisions
            .iter()
            .map(|_| Outcome::Skipped("no node provider is configured".into()))
            .collect();
        a.record(at, &names, outcomes);
        plan.decisions.len()
    };
    let n = record(&mut a, t0);
    let d = a.describe();
    assert_eq!(d["mode"], "act");
    for (i, v) in d["step"]["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        assert_eq!(v["carried_out"], false, "{i}: {d}");
        assert_eq!(
            v["not_carried_out_because"],
            "no node provider is configured"
        );
    }
    let before = d["decisions"].as_array().unwrap().len();
    assert_eq!(before, n);
    record(&mut a, t0 + Duration::from_secs(1));
    assert_eq!(a.describe()["decisions"].as_array().unwrap().len(), before);
}

fn adaptive(mode: AutoscaleMode) -> AutoscaleConfig {
    AutoscaleConfig {
        sizing: provision::Sizing::Adaptive,
        ..config(mode)
    }
}

/// data1 carries t1 (100 Mbit/s); t2's CHILD_SA was just placed on data2 and has no report
/// yet.
fn new_tunnel_on_data2(seq: u64) -> Input {
    let mut i = input(seq, &[(1, 100.0)], &[]);
    i.placement.push((TunnelId(2), 2));
    i.with_child.insert(TunnelId(2));
    i
}

fn migrates(plan: &Plan, tunnel: u32) -> bool {
    plan.decisions.iter().any(|d| {
        matches!(d.action, Action::Migrate { tunnel: t, .. } if t == provision::TunnelId(tunnel))
    })
}

#[test]
fn adaptive_sizing_places_a_new_tunnel_at_the_prior_and_leaves_it_until_measured() {
    let mut a = Autoscaler::new(5000, &adaptive(AutoscaleMode::Advise)).unwrap();
    let t0 = Instant::now();
    let plan = advise(&mut a, t0, &new_tunnel_on_data2(1));
    // The prior before 20 tunnels were seen is the cap: twice the 1000 Mbit/s rate limit.
    assert!(a.sizer.prior(2000.0) > 0.0);
    let d = a.describe();
    assert_eq!(d["step"]["settling"], 1, "{d}");
    // data2 holds only t2, at its prior.
    assert_eq!(d["step"]["nodes"][1]["node"], "data2", "{d}");
    assert_eq!(
        d["step"]["nodes"][1]["used_mbit"].as_f64(),
        Some(a.sizer.prior(2000.0)),
        "{d}"
    );
    // Consolidation is due and drain is on, yet t2 stays on data2.
    assert!(!migrates(&plan, 2), "{plan}");
    // Its first report ends the settling.
    let mut measured = new_tunnel_on_data2(2);
    measured.nodes[1] = node(2, 2, &[(2, 50.0)]);
    advise(&mut a, t0 + Duration::from_secs(1), &measured);
    assert_eq!(a.describe()["step"]["settling"], 0);
}

#[test]
fn saturated_nodes_raise_the_calibrators_multiplier() {
    let mut a = Autoscaler::new(5000, &adaptive(AutoscaleMode::Advise)).unwrap();
    let t0 = Instant::now();
    let k = |a: &Autoscaler| a.describe()["calibration"]["k"].as_f64().unwrap();
    assert_eq!(k(&a), provision::forecast::K_START);
    // data1 carries 4 × 1240 = 4960 of 5000 Mbit/s: saturated (at least 98 %).
    let full = [(1, 1240.0), (2, 1240.0), (3, 1240.0), (4, 1240.0)];
    let mut last = k(&a);
    for seq in 1..=5 {
        advise(
            &mut a,
            t0 + Duration::from_secs(seq),
            &input(seq, &full, &[(5, 100.0)]),
        );
        let now = k(&a);
        assert!(now > last, "step {seq}: {now} <= {last}");
        last = now;
    }
    // A report already seen is not a new step.
    advise(
        &mut a,
        t0 + Duration::from_secs(6),
        &input(5, &full, &[(5, 100.0)]),
    );
    let d = a.describe();
    let c = &d["calibration"];
    assert_eq!(c["k"].as_f64(), Some(last), "{d}");
    assert_eq!(
        (c["steps"].as_u64(), c["saturated_steps"].as_u64()),
        (Some(5), Some(5))
    );
    assert_eq!(c["recent_saturation_rate"].as_f64(), Some(1.0), "{d}");
    assert!(
        // 2 · (1 − 0.97): provision::forecast::SATURATED_PER_VIOLATION saturated steps per
        // violation minute.
        (c["target_saturation_rate"].as_f64().unwrap() - 0.06).abs() < 1e-9,
        "{d}"
    );
    assert!(
        d["step"]["reserve_hint"].is_null(),
        "too few steps for a forecast: {d}"
    );
    // A step with no saturated node lowers it.
    advise(
        &mut a,
        t0 + Duration::from_secs(7),
        &input(7, &[(1, 100.0)], &[(5, 100.0)]),
    );
    assert!(k(&a) < last);
}

#[test]
fn other_sizings_settle_a_new_tunnel_at_the_prior_and_show_no_calibration() {
    for sizing in ["envelope:2", "measured"] {
        let config = AutoscaleConfig {
            sizing: sizing.parse().unwrap(),
            ..config(AutoscaleMode::Advise)
        };
        let mut a = Autoscaler::new(5000, &config).unwrap();
        let now = Instant::now();
        let plan = advise(&mut a, now, &new_tunnel_on_data2(1));
        // Issue 24 requires it: under every sizing rule the unmeasured tunnel (with a
        // CHILD_SA) is placed at the prior, not at 0, and settles until it is measured.
        let prior = a.sizer.prior(2000.0);
        assert!(prior > 0.0, "{sizing}");
        let mut model = Model::new();
        for n in [1, 2] {
            model.add_node(NodeId(n), NodeState::Active).unwrap();
        }
        for (t, alpha, n) in [(1, 100.0, 1), (2, prior, 2)] {
            model.add_tunnel(provision::TunnelId(t), alpha).unwrap();
            model.assign(provision::TunnelId(t), NodeId(n)).unwrap();
        }
        model.set_settling(provision::TunnelId(2), true).unwrap();
        let expected = a.planner.plan(&model, &a.usage, now, None).unwrap();
        assert_eq!(plan, expected, "{sizing}");
        // Drain is on, yet the new tunnel is not moved in its first step.
        assert!(!migrates(&plan, 2), "{sizing}: {plan}");
        let d = a.describe();
        assert_eq!(d["step"]["settling"], 1, "{d}");
        assert_eq!(
            d["step"]["nodes"][1]["used_mbit"].as_f64(),
            Some(prior),
            "{d}"
        );
        // No forecast with these rules.
        assert!(d["calibration"].is_null(), "{d}");
        assert!(d["step"]["reserve_hint"].is_null(), "{d}");
        // Its first report ends the settling.
        let mut measured = new_tunnel_on_data2(2);
        measured.nodes[1] = node(2, 2, &[(2, 50.0)]);
        advise(&mut a, now + Duration::from_secs(1), &measured);
        assert_eq!(a.describe()["step"]["settling"], 0, "{sizing}");
    }
}

/// The calibrator's steps and error steps so far.
fn error_steps(a: &Autoscaler) -> (u64, u64) {
    let d = a.describe();
    let c = &d["calibration"];
    (
        c["steps"].as_u64().unwrap(),
        c["saturated_steps"].as_u64().unwrap(),
    )
}

#[test]
fn stranded_tunnels_are_those_with_a_child_sa_on_no_active_node() {
    let mut a = Autoscaler::new(5000, &adaptive(AutoscaleMode::Advise)).unwrap();
    let t0 = Instant::now();
    // data1 carries t1 and t2, far from saturated; data2 is drained. t3's placement still
    // points at data2 but its CHILD_SA is gone (a placement outlives it): not stranded.
    let quiet = |seq: u64| {
        let mut i = input(seq, &[(1, 100.0), (2, 100.0)], &[]);
        i.nodes[1].draining = true;
        i.placement.push((TunnelId(3), 2));
        i
    };
    for seq in 1..=3 {
        advise(&mut a, t0 + Duration::from_secs(seq), &quiet(seq));
    }
    assert_eq!(error_steps(&a), (3, 0));
    let k = a.describe()["calibration"]["k"].as_f64().unwrap();
    assert!(k < provision::forecast::K_START, "{k}");
    // t4's CHILD_SA lost its node and no data node could take it (its placement is gone):
    // stranded, an error step.
    let mut lost = quiet(4);
    lost.with_child.insert(TunnelId(4));
    lost.unplaced.insert(TunnelId(4));
    advise(&mut a, t0 + Duration::from_secs(4), &lost);
    assert_eq!(error_steps(&a), (4, 1));
    // Placed anew on data1 but its CHILD_SA not yet rekeyed there: still stranded.
    let mut moving = quiet(5);
    moving.with_child.insert(TunnelId(4));
    moving.unplaced.insert(TunnelId(4));
    moving.placement.push((TunnelId(4), 1));
    advise(&mut a, t0 + Duration::from_secs(5), &moving);
    assert_eq!(error_steps(&a), (5, 2));
    // A CHILD_SA whose placement points at the drained node: stranded too.
    let mut drained = quiet(6);
    drained.with_child.insert(TunnelId(3));
    advise(&mut a, t0 + Duration::from_secs(6), &drained);
    assert_eq!(error_steps(&a), (6, 3));
}

#[test]
fn a_tunnel_without_a_child_sa_is_not_sized_at_the_prior() {
    for sizing in ["adaptive", "envelope:2", "measured"] {
        let config = AutoscaleConfig {
            sizing: sizing.parse().unwrap(),
            ..config(AutoscaleMode::Advise)
        };
        let mut a = Autoscaler::new(5000, &config).unwrap();
        let t0 = Instant::now();
        // t2 is placed on data2 but its CHILD_SA went away before data2 reported it: no
        // report will ever measure it, so it carries nothing and does not settle.
        for seq in 1..=3 {
            let mut i = new_tunnel_on_data2(seq);
            i.with_child.remove(&TunnelId(2));
            advise(&mut a, t0 + Duration::from_secs(seq), &i);
            let d = a.describe();
            assert_eq!(d["step"]["settling"], 0, "{sizing}: {d}");
            assert_eq!(
                d["step"]["nodes"][1]["used_mbit"].as_f64(),
                Some(0.0),
                "{sizing}: {d}"
            );
        }
    }
}

#[test]
fn a_node_without_a_new_report_keeps_its_tunnels_in_the_aggregate() {
    let config = AutoscaleConfig {
        start_latency: Duration::from_secs(2),
        ..adaptive(AutoscaleMode::Advise)
    };
    let mut a = Autoscaler::new(5000, &config).unwrap();
    let t0 = Instant::now();
    let level = |a: &Autoscaler| {
        let d = a.describe();
        d["step"]["reserve_hint"]["level_mbit"].as_f64()
    };
    // Steady load on both nodes until the aggregate forecast has its rises.
    let mut seq = 0;
    while level(&a).is_none() {
        seq += 1;
        assert!(seq < 100, "no reserve hint after {seq} steps");
        advise(
            &mut a,
            t0 + Duration::from_secs(seq),
            &input(seq, &[(1, 100.0)], &[(2, 300.0)]),
        );
    }
    let steady = level(&a).unwrap();
    assert!((steady - 400.0).abs() < 1.0, "{steady}");
    // data2's next report is late: this step sees its last one again. t2 still counts.
    let mut late = input(seq + 1, &[(1, 100.0)], &[(2, 300.0)]);
    late.nodes[1] = node(2, seq, &[(2, 300.0)]);
    advise(&mut a, t0 + Duration::from_secs(seq + 1), &late);
    assert_eq!(level(&a), Some(steady));
}

#[test]
fn adaptive_sizing_shows_the_headroom_a_node_shares() {
    let mut a = Autoscaler::new(5000, &adaptive(AutoscaleMode::Advise)).unwrap();
    let t0 = Instant::now();
    // Four tunnels on data1 that swing between 100 and 400 Mbit/s (caps 2000): after a few
    // steps they have rises enough for a headroom.
    let mut d = serde_json::Value::Null;
    for seq in 1..=30u64 {
        let m = if seq % 2 == 0 { 400.0 } else { 100.0 };
        let a1 = [(1, m), (2, m), (3, m), (4, m)];
        advise(
            &mut a,
            t0 + Duration::from_secs(seq),
            &input(seq, &a1, &[(5, 100.0)]),
        );
        d = a.describe();
    }
    let data1 = &d["step"]["nodes"][0];
    assert_eq!(data1["node"], "data1", "{d}");
    let used = data1["used_mbit"].as_f64().unwrap();
    let level = data1["level_mbit"].as_f64().unwrap();
    // The level is the load plus one shared headroom, less than the four headrooms added:
    // each tunnel's is at most its cap minus its size, and the node's is their root sum of
    // squares, at most twice the largest.
    assert!((used - 1600.0).abs() < 1.0, "{d}");
    assert!(level > used + 100.0, "{d}");
    assert!(level <= used + 2.0 * 1600.0, "{d}");
    // Under any other rule there is no headroom: the level is the load.
    let envelope = AutoscaleConfig {
        sizing: provision::Sizing::Envelope { steps: 2 },
        ..config(AutoscaleMode::Advise)
    };
    let mut e = Autoscaler::new(5000, &envelope).unwrap();
    advise(&mut e, t0, &input(1, &[(1, 400.0)], &[(5, 100.0)]));
    advise(
        &mut e,
        t0 + Duration::from_secs(1),
        &input(2, &[(1, 400.0)], &[(5, 100.0)]),
    );
    let d = e.describe();
    assert_eq!(
        d["step"]["nodes"][0]["level_mbit"], d["step"]["nodes"][0]["used_mbit"],
        "{d}"
    );
}
