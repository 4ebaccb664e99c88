//! Scenario tests of one planning step.

use super::*;
use crate::plan::Decision;

const MINUTE: Duration = Duration::from_secs(60);

/// The default configuration, but with 101 bins, so that with σ = 1 (or 0.3) the usages of
/// these tests (multiples of 0.01, or of 0.003) are exactly on the lattice.
fn config() -> PlannerConfig {
    PlannerConfig {
        bins: 101,
        ..PlannerConfig::default()
    }
}

fn planner() -> Planner {
    Planner::new(config()).unwrap()
}

fn book() -> UsageBook {
    UsageBook::new(config().usage_config()).unwrap()
}

/// A cluster with the given nodes and tunnels `(id, α, node)`, and a usage book in which
/// every tunnel has σ = 1 and one sample at its α.
fn setup(nodes: &[(u32, NodeState)], tunnels: &[(u32, f64, Option<u32>)]) -> (Cluster, UsageBook) {
    let mut cluster = Cluster::new();
    let mut usage = book();
    for &(id, state) in nodes {
        cluster.add_node(NodeId(id), state).unwrap();
    }
    for &(id, alpha, node) in tunnels {
        cluster.add_tunnel(TunnelId(id), alpha).unwrap();
        usage.set_sigma(TunnelId(id), 1.0).unwrap();
        usage.record(TunnelId(id), alpha).unwrap();
        if let Some(node) = node {
            cluster.assign(TunnelId(id), NodeId(node)).unwrap();
        }
    }
    (cluster, usage)
}

fn actions(plan: &Plan) -> Vec<Action> {
    plan.decisions.iter().map(|d| d.action).collect()
}

fn migrate(tunnel: u32, from: u32, to: u32) -> Action {
    Action::Migrate {
        tunnel: TunnelId(tunnel),
        from: NodeId(from),
        to: NodeId(to),
    }
}

#[test]
fn config_is_validated() {
    for (config, field) in [
        (
            PlannerConfig {
                node_capacity: 0.0,
                ..PlannerConfig::default()
            },
            "node_capacity",
        ),
        (
            PlannerConfig {
                hotspot_threshold: 1.1,
                ..PlannerConfig::default()
            },
            "hotspot_threshold",
        ),
        (
            PlannerConfig {
                epsilon: 1.0,
                ..PlannerConfig::default()
            },
            "epsilon",
        ),
        (
            PlannerConfig {
                tau: Duration::ZERO,
                ..PlannerConfig::default()
            },
            "tau",
        ),
        (
            PlannerConfig {
                bins: 0,
                ..PlannerConfig::default()
            },
            "bins",
        ),
        (
            PlannerConfig {
                default_sigma: f64::NAN,
                ..PlannerConfig::default()
            },
            "default_sigma",
        ),
    ] {
        match Planner::new(config) {
            Err(ProvisionError::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
}

#[test]
fn new_tunnels_are_placed_by_best_fit_activating_nodes_as_needed() {
    let (cluster, usage) = setup(
        &[
            (0, NodeState::Inactive),
            (1, NodeState::Inactive),
            (2, NodeState::Inactive),
        ],
        &[
            (1, 0.2, None),
            (2, 0.5, None),
            (3, 0.3, None),
            (4, 0.3, None),
        ],
    );
    let now = Instant::now();
    let plan = planner().plan(&cluster, &usage, now, Some(now)).unwrap();
    // Largest first: 0.5 activates node0; 0.3 (tunnel3) joins it (0.8); 0.3 (tunnel4) does
    // not fit (1.1) and activates node1; 0.2 fits best on node1 (0.5, room 0.4) rather than
    // node0 (1.0 > 0.9).
    assert_eq!(
        actions(&plan)[..6],
        [
            Action::Activate { node: NodeId(0) },
            Action::Place {
                tunnel: TunnelId(2),
                node: NodeId(0)
            },
            Action::Place {
                tunnel: TunnelId(3),
                node: NodeId(0)
            },
            Action::Activate { node: NodeId(1) },
            Action::Place {
                tunnel: TunnelId(4),
                node: NodeId(1)
            },
            Action::Place {
                tunnel: TunnelId(1),
                node: NodeId(1)
            },
        ]
    );
    assert!(matches!(
        plan.decisions[0].reason,
        Reason::NothingFits {
            tunnel: TunnelId(2),
            ..
        }
    ));
    assert!(matches!(plan.decisions[1].reason, Reason::NewTunnel { .. }));
    // Y = 1.3 exactly: C = 1.3, ⌈1.3 / 0.9⌉ = 2 nodes; 3 reserved, so node2 stops.
    assert_eq!(plan.reservation.required, 2);
    assert!((plan.reservation.capacity - 1.3).abs() < 1e-9);
    assert_eq!(actions(&plan)[6], Action::Stop { node: NodeId(2) });
    assert_eq!(plan.reservation.reserved, 2);
    assert_eq!(plan.reservation.active, 2);
    assert!(plan.unplaced.is_empty() && plan.hotspots.is_empty());
    let mut applied = cluster.clone();
    applied.apply_plan(&plan).unwrap();
    assert_eq!(applied.counts().active, 2);
}

#[test]
fn hotspot_relief_moves_the_fewest_largest_tunnels_by_best_fit() {
    let (cluster, usage) = setup(
        &[
            (1, NodeState::Active),
            (2, NodeState::Active),
            (3, NodeState::Active),
            (4, NodeState::Inactive),
        ],
        &[
            (10, 0.1, Some(1)),
            (11, 0.3, Some(1)),
            (12, 0.25, Some(1)),
            (13, 0.3, Some(1)),
            (20, 0.5, Some(2)),
            (30, 0.3, Some(3)),
        ],
    );
    let now = Instant::now();
    let plan = planner()
        .plan(&cluster, &usage, now, Some(now - 5 * MINUTE))
        .unwrap();
    assert!(plan.consolidation.is_none());
    // β = 0.95 > 0.9: one tunnel of 0.3 (the lower number of the two) is enough; node2
    // (0.5 → 0.8) is a tighter fit than node3 (0.3 → 0.6).
    assert_eq!(plan.moves().count(), 1);
    assert_eq!(plan.decisions[0].action, migrate(11, 1, 2));
    match plan.decisions[0].reason {
        Reason::Hotspot {
            node, load, limit, ..
        } => {
            assert_eq!(node, NodeId(1));
            assert!((load - 0.95).abs() < 1e-9);
            assert!((limit - 0.9).abs() < 1e-12);
        }
        other => panic!("{other:?}"),
    }
    assert!(plan.hotspots.is_empty());
}

#[test]
fn hotspot_relief_activates_an_inactive_node_when_nothing_fits() {
    let (cluster, usage) = setup(
        &[
            (1, NodeState::Active),
            (2, NodeState::Active),
            (3, NodeState::Inactive),
        ],
        &[
            (10, 0.3, Some(1)),
            (11, 0.3, Some(1)),
            (12, 0.3, Some(1)),
            (13, 0.1, Some(1)),
            (20, 0.3, Some(2)),
            (21, 0.3, Some(2)),
            (22, 0.25, Some(2)),
        ],
    );
    let now = Instant::now();
    let plan = planner().plan(&cluster, &usage, now, Some(now)).unwrap();
    assert_eq!(
        actions(&plan)[..2],
        [Action::Activate { node: NodeId(3) }, migrate(10, 1, 3)]
    );
    assert!(matches!(
        plan.decisions[0].reason,
        Reason::NothingFits { .. }
    ));
    assert!(plan.hotspots.is_empty());
}

#[test]
fn an_unrelievable_hotspot_starts_a_node() {
    let (cluster, usage) = setup(
        &[(1, NodeState::Active), (2, NodeState::Active)],
        &[
            (10, 0.3, Some(1)),
            (11, 0.3, Some(1)),
            (12, 0.3, Some(1)),
            (13, 0.1, Some(1)),
            (20, 0.3, Some(2)),
            (21, 0.3, Some(2)),
            (22, 0.25, Some(2)),
        ],
    );
    let now = Instant::now();
    let plan = planner().plan(&cluster, &usage, now, Some(now)).unwrap();
    assert_eq!(plan.moves().count(), 0);
    assert_eq!(plan.hotspots, vec![NodeId(1)]);
    // Y = 1.95: ⌈1.95 / 0.9⌉ = 3 nodes; the stranded tunnel also needs one more than the two
    // active.
    assert_eq!(
        actions(&plan),
        vec![Action::Start {
            node: NodeId(3),
            ready_at: now + Duration::from_secs(180)
        }]
    );
    assert_eq!(plan.reservation.required, 3);
}

#[test]
fn a_single_tunnel_above_the_limit_is_left_alone() {
    let (cluster, usage) = setup(
        &[(1, NodeState::Active), (2, NodeState::Inactive)],
        &[(10, 0.95, Some(1))],
    );
    let now = Instant::now();
    let plan = planner().plan(&cluster, &usage, now, Some(now)).unwrap();
    assert_eq!(plan.moves().count(), 0);
    assert_eq!(plan.hotspots, vec![NodeId(1)]);
}

#[test]
fn consolidation_empties_nodes_and_deactivates_them() {
    let (cluster, usage) = setup(
        &[
            (1, NodeState::Active),
            (2, NodeState::Active),
            (3, NodeState::Active),
            (4, NodeState::Active),
        ],
        &[
            (10, 0.2, Some(1)),
            (11, 0.2, Some(2)),
            (20, 0.3, Some(2)),
            (30, 0.2, Some(3)),
            (40, 0.1, Some(4)),
        ],
    );
    let now = Instant::now();
    let config = PlannerConfig {
        stop_slack: 1,
        ..config()
    };
    let plan = Planner::new(config)
        .unwrap()
        .plan(&cluster, &usage, now, Some(now - 10 * MINUTE))
        .unwrap();
    let outcome = plan.consolidation.unwrap();
    assert_eq!(
        outcome,
        ConsolidationOutcome {
            active_before: 4,
            bfd_nodes: 2,
            applied: true
        }
    );
    // BFD: 0.3 (t20), 0.2 (t10), 0.2 (t11), 0.2 (t30) fill bin 0 to 0.9; 0.1 (t40) opens bin 1.
    // Bin 0 shares two tunnels with node2; bin 1 is node4's tunnel, which stays.
    assert_eq!(
        actions(&plan),
        vec![
            migrate(10, 1, 2),
            migrate(30, 3, 2),
            Action::Deactivate { node: NodeId(1) },
            Action::Deactivate { node: NodeId(3) },
            // Y = 1.0: 2 nodes required, 4 reserved, slack 1: stop one, the highest.
            Action::Stop { node: NodeId(3) },
        ]
    );
    assert!(matches!(
        plan.decisions[0].reason,
        Reason::Consolidation {
            active: 4,
            nodes: 2
        }
    ));
    assert!(matches!(plan.decisions[2].reason, Reason::Empty));
    assert!(matches!(
        plan.decisions[4].reason,
        Reason::AboveReserve { .. }
    ));
    let mut after = cluster.clone();
    after.apply_plan(&plan).unwrap();
    assert_eq!(after.counts().active, 2);
    assert!((after.load(NodeId(2)) - 0.9).abs() < 1e-9);
    assert_eq!(after.node_state(NodeId(1)), Some(NodeState::Inactive));
}

#[test]
fn consolidation_that_saves_no_node_keeps_the_placement_unless_told() {
    // Two active nodes, each with a 0.5 and a 0.3: BFD also needs two nodes, pairing
    // {t10, t11} and {t20, t21}.
    let (cluster, usage) = setup(
        &[(1, NodeState::Active), (2, NodeState::Active)],
        &[
            (10, 0.5, Some(1)),
            (11, 0.3, Some(2)),
            (20, 0.5, Some(2)),
            (21, 0.3, Some(1)),
        ],
    );
    let now = Instant::now();
    let plan = planner().plan(&cluster, &usage, now, None).unwrap();
    assert_eq!(
        plan.consolidation,
        Some(ConsolidationOutcome {
            active_before: 2,
            bfd_nodes: 2,
            applied: false
        })
    );
    assert_eq!(plan.moves().count(), 0);
    let always = Planner::new(PlannerConfig {
        consolidation: ConsolidationMode::Always,
        ..config()
    })
    .unwrap();
    let plan = always.plan(&cluster, &usage, now, None).unwrap();
    assert!(plan.consolidation.unwrap().applied);
    // Each bin shares one tunnel with each node: bin 0 takes node1, and the 0.3s swap.
    assert_eq!(actions(&plan), vec![migrate(11, 2, 1), migrate(21, 1, 2)]);
    // When the placement already is BFD's, nothing moves.
    let mut packed = cluster.clone();
    packed.apply_plan(&plan).unwrap();
    let plan = always.plan(&packed, &usage, now, None).unwrap();
    assert!(plan.consolidation.unwrap().applied);
    assert_eq!(plan.moves().count(), 0);
}

#[test]
fn tunnels_on_a_node_that_is_no_longer_active_are_moved() {
    let (mut cluster, usage) = setup(
        &[(1, NodeState::Active), (2, NodeState::Active)],
        &[(10, 0.2, Some(1)), (20, 0.3, Some(2))],
    );
    cluster
        .set_node_state(NodeId(1), NodeState::ShutDown)
        .unwrap();
    let now = Instant::now();
    let plan = planner().plan(&cluster, &usage, now, Some(now)).unwrap();
    assert_eq!(plan.decisions[0].action, migrate(10, 1, 2));
    assert!(matches!(
        plan.decisions[0].reason,
        Reason::NodeNotActive {
            state: NodeState::ShutDown,
            ..
        }
    ));
    let mut after = cluster.clone();
    after.apply_plan(&plan).unwrap();
    assert_eq!(after.tunnels_on(NodeId(1)).count(), 0);
}

#[test]
fn with_no_room_anywhere_a_new_tunnel_overflows_the_least_loaded_node() {
    let (cluster, usage) = setup(
        &[(1, NodeState::Active), (2, NodeState::Active)],
        &[(10, 0.8, Some(1)), (20, 0.7, Some(2)), (30, 0.3, None)],
    );
    let now = Instant::now();
    let plan = planner().plan(&cluster, &usage, now, Some(now)).unwrap();
    assert_eq!(
        plan.decisions[0].action,
        Action::Place {
            tunnel: TunnelId(30),
            node: NodeId(2)
        }
    );
    assert!(matches!(plan.decisions[0].reason, Reason::Overflow { .. }));
    // node2 is now a hotspot, with its 0.3 movable but nowhere to go until a node starts.
    assert_eq!(plan.hotspots, vec![NodeId(2)]);
    assert!(plan
        .decisions
        .iter()
        .any(|d| matches!(d.action, Action::Start { .. })));
}

#[test]
fn with_no_node_at_all_tunnels_wait_for_started_nodes() {
    let (mut cluster, usage) = setup(
        &[(0, NodeState::ShutDown)],
        &[(1, 0.3, None), (2, 0.3, None)],
    );
    let now = Instant::now();
    let plan = planner().plan(&cluster, &usage, now, None).unwrap();
    assert_eq!(plan.unplaced, vec![TunnelId(1), TunnelId(2)]);
    let ready_at = now + Duration::from_secs(180);
    // Y = 0.6: one node; the listed shut-down node is started first.
    assert_eq!(
        actions(&plan),
        vec![Action::Start {
            node: NodeId(0),
            ready_at
        }]
    );
    cluster.apply_plan(&plan).unwrap();
    // Still starting: nothing new is started.
    let plan = planner()
        .plan(&cluster, &usage, now + MINUTE, Some(now))
        .unwrap();
    assert!(plan.decisions.is_empty());
    assert_eq!(cluster.advance(ready_at), vec![NodeId(0)]);
    let plan = planner()
        .plan(&cluster, &usage, ready_at, Some(now))
        .unwrap();
    assert!(plan.unplaced.is_empty());
    assert_eq!(plan.moves().count(), 2);
}

#[test]
fn the_reserve_follows_the_usage_distributions() {
    // 20 unmeasured tunnels count at σ = 0.3: C = 6, ⌈6 / 0.9⌉ = 7 nodes.
    let mut cluster = Cluster::new();
    for t in 0..20 {
        cluster.add_tunnel(TunnelId(t), 0.05).unwrap();
    }
    cluster.add_node(NodeId(0), NodeState::Inactive).unwrap();
    cluster.add_node(NodeId(5), NodeState::ShutDown).unwrap();
    let usage = book();
    let now = Instant::now();
    let plan = planner().plan(&cluster, &usage, now, None).unwrap();
    assert!((plan.reservation.capacity - 6.0).abs() < 1e-9);
    assert_eq!(plan.reservation.required, 7);
    let started: Vec<NodeId> = plan.node_plan().start.iter().map(|&(n, _)| n).collect();
    assert_eq!(started, [5, 6, 7, 8, 9, 10].map(NodeId));
    assert!(matches!(
        plan.decisions.last().unwrap().reason,
        Reason::BelowReserve {
            required: 7,
            reserved: 1,
            ..
        }
    ));
    // Once measured at 0.06 each, Y = 1.2 and two nodes are enough.
    let mut usage = book();
    for t in 0..20 {
        usage.set_sigma(TunnelId(t), 0.3).unwrap();
        usage.record(TunnelId(t), 0.06).unwrap();
    }
    let reservation = planner().reservation(&cluster, &usage).unwrap();
    assert!((reservation.capacity - 1.2).abs() < 1e-9);
    assert_eq!(reservation.required, 2);
}

#[test]
fn loads_in_gbit_per_second() {
    // The paper's units: 5 Gbit/s nodes, T_H = 0.9, so the fill limit is 4.5 Gbit/s.
    let config = PlannerConfig {
        node_capacity: 5.0,
        default_sigma: 1.5,
        ..config()
    };
    let planner = Planner::new(config).unwrap();
    assert_eq!(planner.config().limit(), 4.5);
    let mut cluster = Cluster::new();
    let mut usage = UsageBook::new(planner.config().usage_config()).unwrap();
    for n in 0..4 {
        cluster.add_node(NodeId(n), NodeState::Inactive).unwrap();
    }
    for t in 0..6 {
        cluster.add_tunnel(TunnelId(t), 1.5).unwrap();
        usage.record(TunnelId(t), 1.5).unwrap();
    }
    let now = Instant::now();
    let plan = planner.plan(&cluster, &usage, now, None).unwrap();
    // Three 1.5 Gbit/s tunnels per node.
    assert_eq!(plan.reservation.active, 2);
    assert!((plan.reservation.capacity - 9.0).abs() < 1e-9);
    assert!((plan.reservation.capacity_nodes - 1.8).abs() < 1e-9);
    assert_eq!(plan.reservation.required, 2);
}

#[test]
fn plans_are_deterministic_and_print_their_reasons() {
    let (cluster, usage) = setup(
        &[
            (1, NodeState::Active),
            (2, NodeState::Active),
            (3, NodeState::Inactive),
        ],
        &[
            (10, 0.3, Some(1)),
            (11, 0.3, Some(1)),
            (12, 0.3, Some(1)),
            (13, 0.1, Some(1)),
            (20, 0.2, Some(2)),
            (30, 0.1, None),
        ],
    );
    let now = Instant::now();
    let a = planner().plan(&cluster, &usage, now, Some(now)).unwrap();
    let b = planner().plan(&cluster, &usage, now, Some(now)).unwrap();
    assert_eq!(a, b);
    let text = a.to_string();
    assert!(text.starts_with("reserve: E[Y] = "), "{text}");
    assert!(
        text.contains("place tunnel30 on node2: new tunnel (α = 0.1000), best fit"),
        "{text}"
    );
    assert!(
        text.contains(
            "migrate tunnel10 node1 -> node2: node1 is a hotspot (β = 1.0000 > limit 0.9000)"
        ),
        "{text}"
    );
    let decision: &Decision = &a.decisions[0];
    assert_eq!(decision.to_string(), text.lines().nth(1).unwrap());
}

#[test]
fn consolidation_is_due_after_the_interval() {
    let p = planner();
    let now = Instant::now();
    assert!(p.consolidation_due(now, None));
    assert!(!p.consolidation_due(now, Some(now)));
    assert!(!p.consolidation_due(now + 9 * MINUTE, Some(now)));
    assert!(p.consolidation_due(now + 10 * MINUTE, Some(now)));
    // A clock that went backwards does not make consolidation due.
    assert!(!p.consolidation_due(now, Some(now + MINUTE)));
}

#[test]
fn drain_gives_back_nodes_whose_tunnels_fit_elsewhere() {
    let active = NodeState::Active;
    // Node 1 (0.1) and node 2 (0.2) fit elsewhere under T_H = 0.9 (Best Fit: 0.1 onto node
    // 4's 0.7, 0.2 onto node 3's 0.5); nodes 3 and 4 then do not.
    // Node 5 is empty: it is deactivated, never drained into.
    let (cluster, usage) = setup(
        &[
            (1, active),
            (2, active),
            (3, active),
            (4, active),
            (5, active),
        ],
        &[
            (1, 0.1, Some(1)),
            (2, 0.2, Some(2)),
            (3, 0.5, Some(3)),
            (4, 0.7, Some(4)),
        ],
    );
    let now = Instant::now();
    // A consolidation was just done: only drain can give nodes back.
    let plain = planner().plan(&cluster, &usage, now, Some(now)).unwrap();
    assert!(actions(&plain)
        .iter()
        .all(|a| !matches!(a, Action::Migrate { .. })));
    let draining = Planner::new(PlannerConfig {
        drain: true,
        ..config()
    })
    .unwrap();
    let plan = draining.plan(&cluster, &usage, now, Some(now)).unwrap();
    let moves: Vec<Action> = actions(&plan)
        .into_iter()
        .filter(|a| matches!(a, Action::Migrate { .. }))
        .collect();
    assert_eq!(moves, vec![migrate(1, 1, 4), migrate(2, 2, 3)], "{plan}");
    for node in [1, 2, 5] {
        assert!(
            plan.decisions
                .iter()
                .any(|d| d.action == Action::Deactivate { node: NodeId(node) }),
            "{plan}"
        );
    }
    let reason = plan
        .decisions
        .iter()
        .find(|d| matches!(d.reason, Reason::Drain { .. }))
        .map(|d| d.reason.to_string())
        .unwrap_or_default();
    assert!(
        reason.starts_with("drain: every tunnel of node1"),
        "{reason}"
    );
    // Nothing is filled above the limit.
    let mut after = cluster.clone();
    after.apply_plan(&plan).unwrap();
    assert!(after.hotspots(config().limit()).is_empty());
    assert!((after.load(NodeId(3)) - 0.7).abs() < 1e-9);
    assert!((after.load(NodeId(4)) - 0.8).abs() < 1e-9);
}

#[test]
fn pinned_nodes_are_not_stopped_and_drained_last() {
    let (active, inactive) = (NodeState::Active, NodeState::Inactive);
    // Node 1 (pinned) and node 2 carry 0.1 each; nodes 3 (pinned) and 4 are inactive.
    let (mut cluster, usage) = setup(
        &[(1, active), (2, active), (3, inactive), (4, inactive)],
        &[(1, 0.1, Some(1)), (2, 0.1, Some(2))],
    );
    cluster.pin(NodeId(1)).unwrap();
    cluster.pin(NodeId(3)).unwrap();
    let now = Instant::now();
    let planner = Planner::new(PlannerConfig {
        drain: true,
        ..config()
    })
    .unwrap();
    let plan = planner.plan(&cluster, &usage, now, Some(now)).unwrap();
    let acts = actions(&plan);
    // The surplus is taken from the node that can be stopped; the pinned one stays.
    assert!(acts.contains(&Action::Stop { node: NodeId(4) }), "{plan}");
    assert!(!acts.contains(&Action::Stop { node: NodeId(3) }), "{plan}");
    // Both active nodes are equally loaded: the one that can be stopped is drained.
    assert!(acts.contains(&migrate(2, 2, 1)), "{plan}");
    assert!(!acts.iter().any(|a| *a == migrate(1, 1, 2)), "{plan}");
}

#[test]
fn a_settling_tunnel_is_left_where_it_is_until_measured() {
    let active = NodeState::Active;
    // As in the drain test: node 1 (0.1) would be drained onto node 4, and a due
    // consolidation would pack everything into fewer nodes.
    let (mut cluster, usage) = setup(
        &[(1, active), (2, active), (3, active), (4, active)],
        &[
            (1, 0.1, Some(1)),
            (2, 0.2, Some(2)),
            (3, 0.5, Some(3)),
            (4, 0.7, Some(4)),
        ],
    );
    cluster.set_settling(TunnelId(1), true).unwrap();
    let draining = Planner::new(PlannerConfig {
        drain: true,
        ..config()
    })
    .unwrap();
    let now = Instant::now();
    for last in [Some(now), None] {
        let plan = draining.plan(&cluster, &usage, now, last).unwrap();
        assert!(
            actions(&plan).iter().all(|a| !matches!(
                a,
                Action::Migrate {
                    tunnel: TunnelId(1),
                    ..
                } | Action::Deactivate { node: NodeId(1) }
            )),
            "{plan}"
        );
        // The other tunnels still move: node 2's 0.2 joins node 3 (drain or consolidation).
        assert!(
            actions(&plan).iter().any(|a| matches!(
                a,
                Action::Migrate {
                    tunnel: TunnelId(2),
                    ..
                }
            )),
            "{plan}"
        );
    }
    // Measured, it is drained as before.
    cluster.set_settling(TunnelId(1), false).unwrap();
    let plan = draining.plan(&cluster, &usage, now, Some(now)).unwrap();
    assert!(actions(&plan).contains(&migrate(1, 1, 4)), "{plan}");
    assert!(cluster.set_settling(TunnelId(9), true).is_err());
}

#[test]
fn a_reserve_hint_keeps_more_nodes_ready_and_says_why() {
    let (cluster, usage) = setup(
        &[(0, NodeState::Active), (1, NodeState::Inactive)],
        &[(1, 0.3, Some(0))],
    );
    let planner = planner();
    let now = Instant::now();
    let plain = planner.plan(&cluster, &usage, now, Some(now)).unwrap();
    let hint = ReserveHint {
        nodes: 4,
        level: 0.3,
        rise: 2.5,
        horizon: 4,
        fragmentation: 1.2,
    };
    assert_eq!(
        planner
            .plan_with(&cluster, &usage, now, Some(now), None)
            .unwrap(),
        plain
    );
    let plan = planner
        .plan_with(&cluster, &usage, now, Some(now), Some(&hint))
        .unwrap();
    assert!(plain.reservation.required < 4, "{plain}");
    assert_eq!(plan.reservation.required, 4);
    let starts: Vec<&Decision> = plan
        .decisions
        .iter()
        .filter(|d| matches!(d.action, Action::Start { .. }))
        .collect();
    assert_eq!(starts.len(), 2, "{plan}");
    assert!(
        starts[0]
            .reason
            .to_string()
            .starts_with("aggregate forecast: sized load 0.300 may rise by 2.500 within 4"),
        "{}",
        starts[0]
    );
    // A hint below what the model needs changes nothing.
    let low = ReserveHint { nodes: 0, ..hint };
    assert_eq!(
        planner
            .plan_with(&cluster, &usage, now, Some(now), Some(&low))
            .unwrap(),
        plain
    );
}

#[test]
fn consolidation_counts_a_settling_tunnels_node_as_a_filled_bin() {
    let active = NodeState::Active;
    // Node 1 holds a settling tunnel (0.5) and two small measured ones; nodes 2 and 3 one
    // tunnel of 0.3 each. Packing only the measured tunnels (0.8 in all) into one bin and
    // putting it on node 1, which shares the most, would load node 1 with 1.3.
    let (mut cluster, usage) = setup(
        &[(1, active), (2, active), (3, active)],
        &[
            (1, 0.5, Some(1)),
            (4, 0.1, Some(1)),
            (5, 0.1, Some(1)),
            (2, 0.3, Some(2)),
            (3, 0.3, Some(3)),
        ],
    );
    cluster.set_settling(TunnelId(1), true).unwrap();
    let now = Instant::now();
    let plan = planner().plan(&cluster, &usage, now, None).unwrap();
    let outcome = plan.consolidation.unwrap();
    // Node 1's 0.5 is a bin of its own that takes 0.4 more: two nodes, one saved.
    assert_eq!((outcome.bfd_nodes, outcome.applied), (2, true), "{plan}");
    assert!(
        plan.decisions
            .iter()
            .all(|d| !matches!(d.reason, Reason::Hotspot { .. })),
        "{plan}"
    );
    let mut after = cluster.clone();
    after.apply_plan(&plan).unwrap();
    assert!(after.hotspots(0.9).is_empty(), "{plan}");
    assert_eq!(after.counts().active, 2, "{plan}");

    // A node that holds only a settling tunnel stays active: beside it, packing node 2's two
    // tunnels into one bin saves nothing, and the packing is not adopted.
    let (mut cluster, usage) = setup(
        &[(1, active), (2, active)],
        &[(1, 0.5, Some(1)), (2, 0.5, Some(2)), (3, 0.3, Some(2))],
    );
    cluster.set_settling(TunnelId(1), true).unwrap();
    let plan = planner().plan(&cluster, &usage, now, None).unwrap();
    let outcome = plan.consolidation.unwrap();
    assert_eq!((outcome.bfd_nodes, outcome.applied), (2, false), "{plan}");
}
