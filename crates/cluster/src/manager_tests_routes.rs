//! Per-VM routes with the control node as their source, over in-memory links whose data
//! nodes apply the route directives to a table: fan-out and answers, replay or fetch at
//! Hello, gaps, the placement gate, a restarted control node.

use super::*;
use crate::route_follow::tests::{add, del, vnet_config, BookPath};
use crate::route_follow::{RouteFollower, NO_ROUTES};
use routebook::RouteVersion;

/// A data node's session that applies route directives to its own table.
struct RouteNode {
    ops: Mutex<Vec<Op>>,
    dp: BookPath,
    follower: Mutex<RouteFollower>,
    /// The next `route_changes` is acknowledged but not applied (as if lost).
    skip_next: AtomicBool,
    /// Answers to `route_changes` come this late (from another thread).
    late: Mutex<Option<Duration>>,
    /// While set, answers wait here until [`Self::answer`] (a session that reads answers only
    /// once its registration returned).
    held: Mutex<Option<Vec<Held>>>,
}

/// An answer held back, and where it goes.
type Held = (
    crossbeam_channel::Sender<Result<Answer, String>>,
    Result<Answer, String>,
);

impl RouteNode {
    fn new(at: RouteVersion) -> Self {
        Self {
            ops: Mutex::new(Vec::new()),
            dp: BookPath::new(),
            follower: Mutex::new(RouteFollower::at(at)),
            skip_next: AtomicBool::new(false),
            late: Mutex::new(None),
            held: Mutex::new(None),
        }
    }

    /// Holds the answers until [`Self::answer`].
    fn hold(&self) {
        *self.held.lock().unwrap() = Some(Vec::new());
    }

    /// Gives the answers held, and answers at once from now on.
    fn answer(&self) {
        for (tx, result) in self.held.lock().unwrap().take().unwrap_or_default() {
            let _ = tx.send(result);
        }
    }

    fn take(&self) -> Vec<Op> {
        std::mem::take(&mut *self.ops.lock().unwrap())
    }

    fn version(&self) -> RouteVersion {
        self.follower.lock().unwrap().version()
    }

    fn fetching(&self) -> bool {
        self.follower.lock().unwrap().fetching()
    }
}

impl NodeLink for RouteNode {
    fn submit(&self, op: Op) -> Result<Ack, LinkError> {
        self.ops.lock().unwrap().push(op.clone());
        let result = match op {
            Op::RouteChanges(c) if self.skip_next.swap(false, Ordering::SeqCst) => {
                drop(c);
                Ok(Answer::Applied)
            }
            Op::RouteChanges(c) => {
                let changes = rpc::convert::route_changes_from_pb(&c).map_err(|e| e.to_string());
                changes.and_then(|changes| {
                    self.follower
                        .lock()
                        .unwrap()
                        .changes(&self.dp, c.epoch, c.first_seq, changes)
                })
            }
            Op::RoutesChanged(c) => {
                self.follower.lock().unwrap().announced(RouteVersion {
                    epoch: c.epoch,
                    seq: c.seq,
                });
                Ok(Answer::Applied)
            }
            _ => Ok(Answer::Applied),
        };
        if let Some(held) = self.held.lock().unwrap().as_mut() {
            let (tx, ack) = Ack::later();
            held.push((tx, result));
            return Ok(ack);
        }
        if let Some(late) = *self.late.lock().unwrap() {
            let (tx, ack) = Ack::later();
            std::thread::spawn(move || {
                std::thread::sleep(late);
                let _ = tx.send(result);
            });
            return Ok(ack);
        }
        Ok(Ack::answered(result))
    }

    fn is_closed(&self) -> bool {
        false
    }
}

/// A cluster whose master has the test VNet, with data nodes that apply routes.
struct RouteBed {
    bed: Bed,
    nodes: HashMap<String, (u32, Arc<RouteNode>)>,
}

impl RouteBed {
    fn new() -> Self {
        let b = bed();
        b.cluster.set_route_vnets(&[vnet_config()]).unwrap();
        Self {
            bed: b,
            nodes: HashMap::new(),
        }
    }

    /// Registers data node `name` holding the routes at `at` (booted `boot`).
    fn join(&mut self, name: &str, boot: u64, at: RouteVersion) -> u32 {
        self.join_node(name, boot, Arc::new(RouteNode::new(at)))
    }

    /// Registers `node` as data node `name` (booted `boot`), at the version it holds.
    fn join_node(&mut self, name: &str, boot: u64, node: Arc<RouteNode>) -> u32 {
        let at = node.version();
        let addr = format!("10.0.1.{}:6081", 20 + self.nodes.len())
            .parse()
            .unwrap();
        let r = Registration {
            routes: at,
            ..registration(name, Role::Data, addr, boot, Vec::new())
        };
        let id = self.bed.cluster.register(r, node.clone());
        self.nodes.insert(name.into(), (id, node));
        id
    }

    fn node(&self, name: &str) -> &RouteNode {
        &self.nodes[name].1
    }

    /// Data node `name` fetches the snapshot if it must, then reports its version.
    fn fetch(&self, name: &str) {
        let (id, node) = &self.nodes[name];
        if node.fetching() {
            let (at, bytes) = self.bed.cluster.route_snapshot().unwrap();
            node.follower
                .lock()
                .unwrap()
                .restored(&node.dp, at, bytes)
                .unwrap();
        }
        self.bed.cluster.routes_reported(*id, node.version());
    }

    fn route_ops(&self, name: &str) -> Vec<Op> {
        self.node(name)
            .take()
            .into_iter()
            .filter(|op| matches!(op, Op::RouteChanges(_) | Op::RoutesChanged(_)))
            .collect()
    }
}

#[test]
fn a_change_reaches_every_data_node_and_answers_after_their_acks() {
    let mut b = RouteBed::new();
    b.bed.join("steer1", Role::Steer, 1);
    let v = b.bed.cluster.routes_version();
    b.join("data1", 1, v);
    b.join("data2", 1, v);
    *b.node("data2").late.lock().unwrap() = Some(Duration::from_millis(60));
    let started = Instant::now();
    let r = b
        .bed
        .cluster
        .change_routes(add("10.1.0.5", "192.0.2.5"))
        .unwrap();
    assert_eq!(r.added, 1);
    assert!(
        started.elapsed() >= Duration::from_millis(60),
        "answered before the slow node acknowledged"
    );
    for n in ["data1", "data2"] {
        assert_eq!(
            b.node(n).dp.host("10.1.0.5"),
            Some("192.0.2.5".parse().unwrap())
        );
        assert_eq!(b.node(n).version(), b.bed.cluster.routes_version());
    }
    assert!(
        !b.bed
            .ops("steer1")
            .iter()
            .any(|op| matches!(op, Op::RouteChanges(_))),
        "steer nodes hold no per-VM routes"
    );
    // The master validates as the data nodes do: a refused change reaches nobody.
    *b.node("data2").late.lock().unwrap() = None;
    b.node("data1").take();
    let e = b.bed.cluster.change_routes(del("10.1.0.77")).unwrap_err();
    assert!(e.to_string().contains("no entry for 10.1.0.77"), "{e}");
    assert!(b.route_ops("data1").is_empty());
    // The snapshot the route store keeps carries the version; stats are the master's.
    let mut stored = Vec::new();
    b.bed.cluster.write_routes(&mut stored).unwrap();
    assert_eq!(&stored[..8], b"PGRTVER1");
    assert_eq!(b.bed.cluster.route_stats().vnets[0].v4, 1);
}

#[test]
fn a_restarted_data_node_fetches_before_it_is_placed() {
    let mut b = RouteBed::new();
    b.bed.join("steer1", Role::Steer, 1);
    let v = b.bed.cluster.routes_version();
    let d1 = b.join("data1", 1, v);
    b.bed
        .cluster
        .change_routes(add("10.1.0.5", "192.0.2.5"))
        .unwrap();
    b.bed
        .cluster
        .install_child(&child(1, 0x1000, None, true))
        .unwrap();
    // data2 starts (a new boot id: an empty table): told to fetch, and not chosen while it
    // has not, although data1 already holds a tunnel.
    let d2 = b.join("data2", 7, NO_ROUTES);
    assert!(matches!(&b.route_ops("data2")[..], [Op::RoutesChanged(c)] if c.seq == 1));
    b.bed
        .cluster
        .install_child(&child(2, 0x2000, None, true))
        .unwrap();
    assert_eq!(b.bed.cluster.state().core.placement[&TunnelId(2)], d1);
    // Once it fetched and reported the master's version, it takes the next tunnel.
    b.fetch("data2");
    assert_eq!(
        b.node("data2").dp.host("10.1.0.5"),
        Some("192.0.2.5".parse().unwrap())
    );
    b.bed
        .cluster
        .install_child(&child(3, 0x3000, None, true))
        .unwrap();
    assert_eq!(b.bed.cluster.state().core.placement[&TunnelId(3)], d2);
}

#[test]
fn a_gap_makes_the_node_fetch() {
    let mut b = RouteBed::new();
    let v = b.bed.cluster.routes_version();
    b.join("data1", 1, v);
    b.bed
        .cluster
        .change_routes(add("10.1.0.1", "192.0.2.1"))
        .unwrap();
    b.node("data1").skip_next.store(true, Ordering::SeqCst);
    b.bed
        .cluster
        .change_routes(add("10.1.0.2", "192.0.2.2"))
        .unwrap();
    b.route_ops("data1");
    // The third change does not follow the node's version: refused, so control tells it
    // to fetch; the command still answers (the master holds the change).
    b.bed.cluster.change_routes(del("10.1.0.1")).unwrap();
    let ops = b.route_ops("data1");
    assert!(matches!(&ops[..], [Op::RouteChanges(_), Op::RoutesChanged(c)] if c.seq == 3));
    assert!(b.node("data1").fetching());
    b.fetch("data1");
    let n = b.node("data1");
    assert_eq!(n.version(), b.bed.cluster.routes_version());
    assert_eq!(n.dp.host("10.1.0.1"), None);
    assert_eq!(n.dp.host("10.1.0.2"), Some("192.0.2.2".parse().unwrap()));
}

#[test]
fn at_hello_a_node_behind_gets_a_replay_and_one_ahead_or_elsewhere_fetches() {
    let mut b = RouteBed::new();
    let v0 = b.bed.cluster.routes_version();
    for i in 1..=3 {
        b.bed
            .cluster
            .change_routes(add(&format!("10.1.0.{i}"), "192.0.2.1"))
            .unwrap();
    }
    let v = b.bed.cluster.routes_version();
    assert_eq!(v.seq, v0.seq + 3);
    // Two changes behind, same epoch: the two are replayed, the node is current.
    b.join(
        "behind",
        1,
        RouteVersion {
            seq: v.seq - 2,
            ..v
        },
    );
    let ops = b.route_ops("behind");
    assert!(
        matches!(&ops[..], [Op::RouteChanges(c)] if c.first_seq == v.seq - 1 && c.ops.len() == 2),
        "{ops:?}"
    );
    assert_eq!(b.node("behind").version(), v);
    // Ahead of the master (it crashed after telling the nodes, before storing): fetch.
    b.join(
        "ahead",
        1,
        RouteVersion {
            seq: v.seq + 2,
            ..v
        },
    );
    assert!(matches!(&b.route_ops("ahead")[..], [Op::RoutesChanged(_)]));
    // Another epoch: fetch.
    b.join(
        "other",
        1,
        RouteVersion {
            epoch: v.epoch + 1,
            seq: 1,
        },
    );
    assert!(matches!(&b.route_ops("other")[..], [Op::RoutesChanged(_)]));
    b.fetch("ahead");
    assert_eq!(b.node("ahead").version(), v);
    assert_eq!(b.node("ahead").dp.len(), 3);
    // At the master's version: nothing to do.
    b.join("same", 1, v);
    assert!(b.route_ops("same").is_empty());
}

#[test]
fn a_bulk_change_is_announced_and_a_restarted_control_node_starts_a_new_epoch() {
    let mut b = RouteBed::new();
    let v = b.bed.cluster.routes_version();
    b.join("data1", 1, v);
    b.bed
        .cluster
        .change_routes(datapath::RouteChange::Load(
            "a,vnet,10.1.0.1,192.0.2.1\na,vnet,10.1.0.2,192.0.2.2\n".into(),
        ))
        .unwrap();
    let v = b.bed.cluster.routes_version();
    assert!(matches!(&b.route_ops("data1")[..], [Op::RoutesChanged(c)] if c.seq == v.seq));
    b.fetch("data1");
    assert_eq!(b.node("data1").dp.len(), 2);
    // The route store keeps the snapshot with its version; a new control node restores it
    // in a new epoch (the store may lack a change its data nodes hold), so they fetch it once.
    let mut stored = Vec::new();
    b.bed.cluster.write_routes(&mut stored).unwrap();
    let mut c = RouteBed::new();
    c.bed
        .cluster
        .change_routes(datapath::RouteChange::Restore(stored.into()))
        .unwrap();
    let restored = c.bed.cluster.routes_version();
    assert_ne!(restored.epoch, v.epoch);
    c.join("data1", 1, v);
    assert!(matches!(&c.route_ops("data1")[..], [Op::RoutesChanged(_)]));
    c.fetch("data1");
    assert_eq!(c.node("data1").version(), restored);
    assert_eq!(c.node("data1").dp.len(), 2);
    assert_eq!(c.bed.cluster.route_stats().vnets[0].v4, 2);
}

#[path = "manager_tests_routes_sync.rs"]
mod sync;
