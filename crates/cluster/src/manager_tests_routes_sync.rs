//! What the control node knows of its data nodes' copies of the per-VM routes (issue 16 §2,
//! review): a replay at Hello answered after the registration returned, a node marked current
//! that reports another version, a change kept by a fetching node, a VNet removal that drops
//! entries, and the route store's write outside the routes lock.

use super::*;
use crate::manager::routes::PROMPT_AFTER_REPORTS;
use datapath::RouteFanout;

/// Waits (bounded) until `done` holds; `what` names it in the failure.
fn eventually(what: &str, done: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < until, "never: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

impl RouteBed {
    /// True if the core counts data node `name`'s routes as the master's.
    fn current(&self, name: &str) -> bool {
        let id = self.nodes[name].0;
        !self.bed.cluster.state().core.routes_behind.contains(&id)
    }

    /// Data node `name` reports its version (without fetching).
    fn report(&self, name: &str) {
        let (id, node) = &self.nodes[name];
        self.bed.cluster.routes_reported(*id, node.version());
    }

    /// A steer node and data node `data1`, whose routes are current, serving tunnel 1; also
    /// data1's id and the routes' version.
    fn serving_tunnel_1() -> (Self, u32, RouteVersion) {
        let mut b = Self::new();
        b.bed.join("steer1", Role::Steer, 1);
        let v = b.bed.cluster.routes_version();
        let d1 = b.join("data1", 1, v);
        b.bed
            .cluster
            .install_child(&child(1, 0x1000, None, true))
            .unwrap();
        (b, d1, v)
    }
}

/// ```text
///  data node                       control
///     |--- Hello (2 changes behind) -->|  register: replay sent, not waited for
///     |<-- route_changes (replay) -----|
///     |    (register returns; the session reads answers from now on)
///     |--- Ack ----------------------->|  current
/// ```
#[test]
fn a_replay_at_hello_is_answered_after_the_registration_returns() {
    let mut b = RouteBed::new();
    for i in 1..=3 {
        b.bed
            .cluster
            .change_routes(add(&format!("10.1.0.{i}"), "192.0.2.1"))
            .unwrap();
    }
    let v = b.bed.cluster.routes_version();
    let behind = RouteVersion {
        seq: v.seq - 2,
        ..v
    };
    // The node's answers wait until the registration returned (as a session's do): the
    // registration must neither wait for them nor give up on the replay.
    let node = Arc::new(RouteNode::new(behind));
    node.hold();
    b.join_node("data1", 1, Arc::clone(&node));
    let ops = b.route_ops("data1");
    assert!(
        matches!(&ops[..], [Op::RouteChanges(c)] if c.first_seq == v.seq - 1),
        "the replay only, no fetch: {ops:?}"
    );
    assert!(!b.current("data1"), "current before it answered");
    node.answer();
    eventually("the node is current once it answered the replay", || {
        b.current("data1")
    });
    assert!(b.route_ops("data1").is_empty());
    assert_eq!(node.version(), v);

    // A node that never answers is told to fetch once the directive timeout (200 ms) passed.
    let quiet = Arc::new(RouteNode::new(behind));
    quiet.hold();
    b.join_node("data2", 1, Arc::clone(&quiet));
    eventually("the silent node is told to fetch", || {
        quiet
            .ops
            .lock()
            .unwrap()
            .iter()
            .any(|op| matches!(op, Op::RoutesChanged(_)))
    });
    assert!(!b.current("data2"));
}

#[test]
fn a_current_node_that_keeps_reporting_another_version_fetches() {
    let mut b = RouteBed::new();
    let v = b.bed.cluster.routes_version();
    b.join("data1", 1, v);
    b.bed
        .cluster
        .change_routes(add("10.1.0.1", "192.0.2.1"))
        .unwrap();
    b.report("data1");
    assert!(b.current("data1"));
    // The node acknowledges a change it then loses (say, a data path that failed after the
    // answer): control still counts it current, and no later change shows the gap.
    b.node("data1").skip_next.store(true, Ordering::SeqCst);
    b.bed
        .cluster
        .change_routes(add("10.1.0.2", "192.0.2.2"))
        .unwrap();
    b.route_ops("data1");
    // One or two reports at the older version may race with the change: nothing yet.
    for _ in 1..PROMPT_AFTER_REPORTS {
        b.report("data1");
        assert!(b.route_ops("data1").is_empty());
        assert!(b.current("data1"));
    }
    b.report("data1");
    assert!(matches!(&b.route_ops("data1")[..], [Op::RoutesChanged(_)]));
    assert!(!b.current("data1"));
    b.fetch("data1");
    assert!(b.current("data1"));
    assert_eq!(
        b.node("data1").dp.host("10.1.0.2"),
        Some("192.0.2.2".parse().unwrap())
    );

    // A current node whose reports move forward is following changes still on their way:
    // never told to fetch, however many such reports.
    let id = b.nodes["data1"].0;
    let m = b.bed.cluster.routes_version();
    for i in 1..=5 {
        b.bed
            .cluster
            .change_routes(add(&format!("10.1.1.{i}"), "192.0.2.3"))
            .unwrap();
    }
    b.route_ops("data1");
    for i in 0..5 {
        b.bed.cluster.routes_reported(
            id,
            RouteVersion {
                seq: m.seq + i,
                ..m
            },
        );
    }
    assert!(b.route_ops("data1").is_empty());
    assert!(b.current("data1"));
}

/// A registration that waited in `register` (for steer nodes' answers) while the node
/// restarted and registered again: its Hello's version, the master's, is no longer what the
/// node holds (an empty table, fetching), and must not mark the node current.
#[test]
fn an_overtaken_registration_does_not_mark_its_node_current() {
    let mut b = RouteBed::new();
    b.bed
        .cluster
        .change_routes(add("10.1.0.1", "192.0.2.1"))
        .unwrap();
    let v = b.bed.cluster.routes_version();
    // The first session, at the master's version.
    let first = Arc::new(RouteNode::new(v));
    let id = b.join_node("data1", 1, Arc::clone(&first));
    assert!(b.current("data1"));
    // The node restarted with an empty table and registered again: it fetches.
    let empty = RouteVersion { epoch: 0, seq: 0 };
    assert_eq!(b.join("data1", 2, empty), id);
    assert!(!b.current("data1"));
    // The first registration's routes are judged only now.
    let first: Arc<dyn NodeLink> = first;
    b.bed.cluster.routes_hello(id, "data1", v, &first);
    assert!(
        !b.current("data1"),
        "an overtaken registration marked a fetching node current"
    );
    b.fetch("data1");
    assert!(b.current("data1"));
}

#[test]
fn a_change_kept_by_a_fetching_node_is_not_counted_as_applied() {
    let mut b = RouteBed::new();
    let v = b.bed.cluster.routes_version();
    b.join("data1", 1, v);
    b.join("data2", 1, v);
    // data2 was told to fetch (a bulk change) and has not yet.
    b.bed
        .cluster
        .change_routes(datapath::RouteChange::Load(
            "a,vnet,10.1.0.1,192.0.2.1\n".into(),
        ))
        .unwrap();
    b.fetch("data1");
    assert!(b.node("data2").fetching());
    let r = b
        .bed
        .cluster
        .change_routes(add("10.1.0.2", "192.0.2.2"))
        .unwrap();
    assert_eq!(
        r.nodes,
        Some(RouteFanout {
            applied: 1,
            fetching: 1,
            failed: 0
        }),
        "the operator's answer says where the change is applied"
    );
    assert!(b.current("data1"));
    assert!(!b.current("data2"));
    assert_eq!(
        b.node("data2").dp.host("10.1.0.2"),
        None,
        "kept, not applied"
    );
    // Once it restored the snapshot and applied what it kept, it reports the master's version.
    b.fetch("data2");
    assert!(b.current("data2"));
    assert_eq!(
        b.node("data2").dp.host("10.1.0.2"),
        Some("192.0.2.2".parse().unwrap())
    );
}

#[test]
fn a_vnet_removal_that_drops_entries_is_a_new_version_the_nodes_fetch() {
    let mut b = RouteBed::new();
    let v = b.bed.cluster.routes_version();
    b.join("data1", 1, v);
    b.bed
        .cluster
        .change_routes(add("10.1.0.1", "192.0.2.1"))
        .unwrap();
    // A snapshot taken before the removal (a fetch on its way) names the table with the
    // entry: the version after the removal must be another.
    let (before, _) = b.bed.cluster.route_snapshot().unwrap();
    b.route_ops("data1");
    b.bed.cluster.set_route_vnets(&[]).unwrap();
    let after = b.bed.cluster.routes_version();
    assert_eq!(after.seq, before.seq + 1);
    assert!(matches!(&b.route_ops("data1")[..], [Op::RoutesChanged(c)] if c.seq == after.seq));
    assert!(!b.current("data1"));
    b.fetch("data1");
    assert!(b.current("data1"));
    assert_eq!(b.node("data1").dp.len(), 0);
    // Giving the VNet back (no entries to drop) keeps the version: nothing to fetch.
    b.bed.cluster.set_route_vnets(&[vnet_config()]).unwrap();
    assert_eq!(b.bed.cluster.routes_version(), after);
    assert!(b.route_ops("data1").is_empty());
}

/// A route store's writer that stalls on its first write until released (etcd, slow).
struct StalledStore {
    started: crossbeam_channel::Sender<()>,
    release: crossbeam_channel::Receiver<()>,
    stalled: bool,
    bytes: Vec<u8>,
}

impl std::io::Write for StalledStore {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !self.stalled {
            self.stalled = true;
            let _ = self.started.send(());
            let _ = self.release.recv_timeout(Duration::from_secs(5));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_masters_changes_do_not_wait_for_the_route_stores_write() {
    let mut b = RouteBed::new();
    let v = b.bed.cluster.routes_version();
    b.join("data1", 1, v);
    b.bed
        .cluster
        .change_routes(add("10.1.0.1", "192.0.2.1"))
        .unwrap();
    let stored_at = b.bed.cluster.routes_version();
    let (started_tx, started) = crossbeam_channel::bounded(1);
    let (release_tx, release) = crossbeam_channel::bounded(1);
    let cluster = &b.bed.cluster;
    let stored = std::thread::scope(|s| {
        let writer = s.spawn(move || {
            let mut store = StalledStore {
                started: started_tx,
                release,
                stalled: false,
                bytes: Vec::new(),
            };
            cluster.write_routes(&mut store).map(|_| store.bytes)
        });
        started
            .recv_timeout(Duration::from_secs(5))
            .expect("the store write started");
        // The store is stalled mid-write: a change, a registration's check and a report
        // still go through.
        let (done_tx, done) = crossbeam_channel::bounded(1);
        s.spawn(move || {
            let r = cluster.change_routes(add("10.1.0.2", "192.0.2.2"));
            let _ = done_tx.send(r.map(|r| r.added).map_err(|e| e.to_string()));
        });
        let answered = done.recv_timeout(Duration::from_secs(3));
        let _ = release_tx.send(());
        assert_eq!(answered, Ok(Ok(1)), "the change waited for the store");
        writer.join().unwrap().unwrap()
    });
    // The snapshot written is the table at the version in its header, without the change
    // made while it was being stored.
    assert_eq!(&stored[..8], b"PGRTVER1");
    assert_eq!(stored[16..24], stored_at.seq.to_be_bytes());
    let c = RouteBed::new();
    c.bed
        .cluster
        .change_routes(datapath::RouteChange::Restore(stored.into()))
        .unwrap();
    assert_eq!(c.bed.cluster.route_stats().vnets[0].v4, 1);
}

/// An autoscaler plan of one decision, carried out by the core (act mode, no provider).
fn plan_one(b: &RouteBed, action: provision::Action) -> crate::capacity::Outcome {
    let mut sh = b.bed.cluster.state();
    let (input, _) = sh.core.autoscale_input(false, Vec::new());
    let plan = provision::Plan {
        decisions: vec![provision::Decision {
            action,
            reason: provision::Reason::Empty,
        }],
        consolidation: None,
        reservation: provision::Reservation {
            mean: 0.0,
            capacity: 0.0,
            capacity_nodes: 0.0,
            epsilon: 0.0,
            required: 0,
            reserved: 0,
            active: 0,
        },
        unplaced: Vec::new(),
        hotspots: Vec::new(),
    };
    let mut effects = sh.core.handle_plan(&plan, &input, false);
    effects.outcomes.remove(0)
}

/// Planned moves (a drain, an autoscaler's migration) wait for a node whose per-VM routes are
/// current; a lost node's tunnels still fall back to a node whose routes are behind.
#[test]
fn planned_moves_wait_for_current_routes_and_failover_does_not() {
    let (mut b, d1, _) = RouteBed::serving_tunnel_1();
    // data2 starts (an empty table) and has not fetched yet.
    let d2 = b.join("data2", 7, NO_ROUTES);
    assert!(!b.current("data2"));
    match b.bed.cluster.drain("data1") {
        Err(ClusterError::Unsuitable { reason, .. }) => {
            assert!(reason.contains("not current yet"), "{reason}")
        }
        other => panic!("drained onto a node without the routes: {other:?}"),
    }
    assert_eq!(b.bed.cluster.state().core.placement[&TunnelId(1)], d1);
    let migrate = provision::Action::Migrate {
        tunnel: provision::TunnelId(1),
        from: provision::NodeId(d1),
        to: provision::NodeId(d2),
    };
    assert!(matches!(
        plan_one(&b, migrate),
        crate::capacity::Outcome::Skipped(why) if why.contains("not current yet")
    ));
    assert_eq!(b.bed.cluster.state().core.placement[&TunnelId(1)], d1);
    // Once data2 holds the table, both go.
    b.fetch("data2");
    assert!(matches!(
        plan_one(&b, migrate),
        crate::capacity::Outcome::Done
    ));
    assert_eq!(b.bed.cluster.state().core.placement[&TunnelId(1)], d2);
    b.bed.rekeys();
    // A bulk change: every node is behind until it fetches. data2, serving the tunnel, is
    // lost: the tunnel goes to data1 all the same (behind, but alive beats nowhere).
    b.bed
        .cluster
        .change_routes(datapath::RouteChange::Load(
            "a,vnet,10.1.0.9,192.0.2.9\n".into(),
        ))
        .unwrap();
    assert!(!b.current("data1") && !b.current("data2"));
    b.bed.cluster.node_dead(d2, "steer1");
    assert_eq!(b.bed.cluster.state().core.placement[&TunnelId(1)], d1);
}

/// A drain does not keep a tunnel's placement on a node whose per-VM routes are behind, even
/// when a move toward that node was under way before the drain began.
#[test]
fn a_drain_does_not_keep_a_placement_on_a_node_whose_routes_are_behind() {
    let (mut b, d1, v) = RouteBed::serving_tunnel_1();
    let d2 = b.join("data2", 2, v);
    let d3 = b.join("data3", 3, NO_ROUTES);
    assert!(b.current("data2") && !b.current("data3"));
    // A move toward data3 under way: the next CHILD_SA was to go there.
    b.bed.cluster.state().core.placement.insert(TunnelId(1), d3);
    let moves = b.bed.cluster.drain("data1").expect("drain");
    assert_eq!(moves, vec![(TunnelId(1), d2)], "{d1} -> {moves:?}");
    assert_eq!(b.bed.cluster.state().core.placement[&TunnelId(1)], d2);
}
