//! The cluster logic over in-memory links: placement, steering, moves and losses.

use super::*;
use crate::link::{Ack, Answer, LinkError, NodeLink};
use crypto::Encr;
use ike::{ChildKeys, TrafficSelector};
use pb::directive::Op;
use std::sync::atomic::{AtomicBool, Ordering};
use wire::IkeSpi;
use zeroize::Zeroizing;

/// Records every directive; answers with `refuse` if set.
#[derive(Default)]
struct FakeLink {
    ops: Mutex<Vec<Op>>,
    refuse: Mutex<Option<String>>,
    closed: AtomicBool,
}

impl FakeLink {
    fn take(&self) -> Vec<Op> {
        std::mem::take(&mut *self.ops.lock().unwrap())
    }
}

impl NodeLink for FakeLink {
    fn submit(&self, op: Op) -> Result<Ack, LinkError> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(LinkError::Closed);
        }
        self.ops.lock().unwrap().push(op);
        let refuse = self.refuse.lock().unwrap().clone();
        Ok(Ack::ready(refuse.map_or(Ok(()), Err)))
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }
}

struct Bed {
    cluster: Cluster,
    tasks: crossbeam_channel::Receiver<Task>,
    links: HashMap<String, Arc<FakeLink>>,
}

const VNI: u32 = 100;

/// A cluster whose control loop runs (reconciled with nothing restored).
fn bed() -> Bed {
    let b = fresh_bed();
    assert!(b.cluster.reconcile(&[]).is_empty());
    b
}

/// A cluster whose control loop has not started yet (a new control node adopting).
fn fresh_bed() -> Bed {
    fresh_bed_with(control::config::AutoscaleConfig::default())
}

/// [`fresh_bed`] with the autoscaler configured as `autoscale`.
fn fresh_bed_with(autoscale: control::config::AutoscaleConfig) -> Bed {
    let (tasks_tx, tasks) = crossbeam_channel::unbounded();
    let (to_control, _from) = crossbeam_channel::bounded(16);
    let ike = IkeRelay::bind(
        "127.0.0.1:0".parse().unwrap(),
        500,
        4500,
        to_control.clone(),
    )
    .unwrap();
    let tunnels = (1..=3)
        .map(|i| TunnelMeta {
            id: TunnelId(i),
            name: format!("t{i}"),
            vni: Some(VNI),
            rate_limit_mbit: (i == 1).then_some(100),
        })
        .collect();
    let cluster = Cluster::new(
        Settings {
            name: "control1".into(),
            directive_timeout: Duration::from_millis(200),
            report_interval: Duration::from_secs(1),
            geneve: "10.0.0.10:6081".parse().unwrap(),
            node_capacity_mbit: 5000,
            autoscale,
            dispatch: Default::default(),
        },
        tunnels,
        pb::DataConfig {
            vnets: vec![pb::Vnet {
                tenant: "a".into(),
                name: "vnet".into(),
                vni: VNI,
                gateway_ips: vec!["10.1.0.1".into()],
                routes: Vec::new(),
                router_mac: None,
            }],
            tunnels: Vec::new(),
        },
        ike,
        tasks_tx,
        to_control,
    );
    Bed {
        cluster,
        tasks,
        links: HashMap::new(),
    }
}

impl Bed {
    fn join(&mut self, name: &str, role: Role, boot: u64) -> u32 {
        self.join_holding(name, role, boot, Vec::new())
    }

    /// Registers a node whose Hello reports `installed`.
    fn join_holding(
        &mut self,
        name: &str,
        role: Role,
        boot: u64,
        installed: Vec<InstalledChild>,
    ) -> u32 {
        let link = Arc::new(FakeLink::default());
        self.links.insert(name.into(), Arc::clone(&link));
        let addr = format!("10.0.0.{}:6081", 20 + self.links.len())
            .parse()
            .unwrap();
        // Holding the master's routes (the route tests register behind on purpose).
        let r = Registration {
            routes: self.cluster.routes_version(),
            ..registration(name, role, addr, boot, installed)
        };
        self.cluster.register(r, link)
    }

    /// The last whole steering tables sent to steer node `name`.
    fn last_tables(&self, name: &str) -> pb::SteerTables {
        self.ops(name)
            .into_iter()
            .rev()
            .find_map(|op| match op {
                Op::SteerTables(t) => Some(t),
                _ => None,
            })
            .expect("whole tables")
    }

    fn ops(&self, name: &str) -> Vec<Op> {
        self.links[name].take()
    }

    fn clear(&self) {
        for l in self.links.values() {
            l.take();
        }
    }

    fn rekeys(&self) -> Vec<TunnelId> {
        let mut out = Vec::new();
        while let Ok(Task::Rekey(t, _)) = self.tasks.try_recv() {
            out.extend(t);
        }
        out
    }
}

fn ts(net: &str) -> TrafficSelector {
    TrafficSelector::parse(net).unwrap()
}

fn child(tunnel: u32, spi_in: u32, replaces: Option<u32>, outbound_active: bool) -> ChildSaInfo {
    ChildSaInfo {
        tunnel: TunnelId(tunnel),
        ike: IkeSpis {
            initiator: IkeSpi(u64::from(tunnel)),
            responder: IkeSpi(7),
        },
        inbound_spi: EspSpi(spi_in),
        outbound_spi: EspSpi(spi_in + 0x100000),
        encr: Encr::AesGcm16_128,
        integ: None,
        esn: false,
        pfs: None,
        keys: ChildKeys {
            inbound_encr: Zeroizing::new(vec![1; 20]),
            inbound_integ: Zeroizing::new(Vec::new()),
            outbound_encr: Zeroizing::new(vec![2; 20]),
            outbound_integ: Zeroizing::new(Vec::new()),
        },
        local_ts: vec![ts("10.1.0.0/24")],
        remote_ts: vec![ts(&format!("192.168.{tunnel}.0/24"))],
        local: "198.51.100.1:4500".parse().unwrap(),
        remote: "203.0.113.5:4500".parse().unwrap(),
        replay_window: 64,
        replaces: replaces.map(EspSpi),
        outbound_active,
        proposal: "AES_GCM_16_128/NO_EXT_SEQ".into(),
    }
}

/// The node each selector of the last SetSelectors points at, by tunnel.
fn selector_nodes(ops: &[Op]) -> Vec<(u32, u32)> {
    let last = ops
        .iter()
        .rev()
        .find_map(|op| match op {
            Op::SetSelectors(v) => Some(v.clone()),
            _ => None,
        })
        .expect("a selector update");
    last.selectors.iter().map(|s| (s.tunnel, s.node)).collect()
}

#[test]
fn a_node_gets_its_configuration_when_it_registers() {
    let mut b = bed();
    let s = b.join("steer1", Role::Steer, 1);
    let d = b.join("data1", Role::Data, 1);
    assert_eq!((s, d), (1, 2));
    let data_ops = b.ops("data1");
    assert!(matches!(&data_ops[0], Op::DataConfig(c) if c.vnets.len() == 1));
    assert!(matches!(&data_ops[1], Op::SetRelays(r) if r.steer == ["10.0.0.21:6081"]));
    let steer_ops = b.ops("steer1");
    match &steer_ops[0] {
        Op::SteerTables(t) => {
            assert_eq!(t.limits.len(), 1, "tunnel 1 has a rate limit");
            assert_eq!(t.limits[0].bits_per_second, 100_000_000);
            assert_eq!(t.vnis[0].gateway_ips, ["10.1.0.1"]);
        }
        other => panic!("{other:?}"),
    }
    // The data node's arrival is announced to the steer node (whole tables).
    assert!(steer_ops.iter().any(|op| matches!(op, Op::SteerTables(t)
        if t.nodes.as_ref().is_some_and(|n| n.data.len() == 1))));
    assert_eq!(b.cluster.node_id("data1"), 2, "ids are stable per name");
}

#[test]
fn install_places_spreads_and_steers() {
    let mut b = bed();
    b.join("steer1", Role::Steer, 1);
    let d1 = b.join("data1", Role::Data, 1);
    let d2 = b.join("data2", Role::Data, 1);
    b.clear();
    b.cluster
        .install_child(&child(1, 0x1000, None, true))
        .unwrap();
    b.cluster
        .install_child(&child(2, 0x2000, None, true))
        .unwrap();
    // One tunnel per node.
    assert!(matches!(&b.ops("data1")[..], [Op::InstallChild(c)] if c.inbound_spi == 0x1000));
    assert!(matches!(&b.ops("data2")[..], [Op::InstallChild(c)] if c.inbound_spi == 0x2000));
    let steer = b.ops("steer1");
    let spis: Vec<(u32, u32)> = steer
        .iter()
        .filter_map(|op| match op {
            Op::SetSpi(s) => Some((s.spi, s.node)),
            _ => None,
        })
        .collect();
    assert_eq!(spis, [(0x1000, d1), (0x2000, d2)]);
    assert_eq!(selector_nodes(&steer), [(1, d1), (2, d2)]);
    // The same tunnel's next CHILD_SA stays on its node.
    b.cluster
        .install_child(&child(1, 0x1001, Some(0x1000), true))
        .unwrap();
    assert!(matches!(&b.ops("data1")[..], [Op::InstallChild(c)] if c.inbound_spi == 0x1001));
    assert!(b.ops("data2").is_empty());
    // A duplicate SPI is refused without reaching any node.
    assert!(b
        .cluster
        .install_child(&child(3, 0x1001, None, true))
        .is_err());
}

#[test]
fn removal_keeps_steering_for_the_grace_then_forgets() {
    let mut b = bed();
    b.join("steer1", Role::Steer, 1);
    let d1 = b.join("data1", Role::Data, 1);
    b.cluster
        .install_child(&child(1, 0x1000, None, true))
        .unwrap();
    // The peer rekeyed: the new SA does not send until the old one is deleted.
    b.cluster
        .install_child(&child(1, 0x1001, Some(0x1000), false))
        .unwrap();
    b.clear();
    b.cluster
        .remove_child(TunnelId(1), EspSpi(0x1000), EspSpi(0x101000));
    assert!(matches!(&b.ops("data1")[..], [Op::RemoveChild(r)] if r.inbound_spi == 0x1000));
    let steer = b.ops("steer1");
    assert!(
        !steer.iter().any(|op| matches!(op, Op::RemoveSpi(_))),
        "not yet"
    );
    assert_eq!(selector_nodes(&steer), [(1, d1)], "the new SA sends now");
    b.cluster.tick(Instant::now());
    assert!(b.ops("steer1").is_empty());
    b.cluster
        .tick(Instant::now() + STEER_GRACE + Duration::from_millis(1));
    assert!(matches!(&b.ops("steer1")[..], [Op::RemoveSpi(r)] if r.spi == 0x1000));
}

#[test]
fn migration_rekeys_onto_the_target_and_waits_for_the_old_sa() {
    let mut b = bed();
    b.join("steer1", Role::Steer, 1);
    let d1 = b.join("data1", Role::Data, 1);
    let d2 = b.join("data2", Role::Data, 1);
    b.cluster
        .install_child(&child(1, 0x1000, None, true))
        .unwrap();
    assert!(matches!(
        b.cluster.migrate("t1", "nowhere"),
        Err(ClusterError::UnknownNode(_))
    ));
    assert!(matches!(
        b.cluster.migrate("t2", "data2"),
        Err(ClusterError::NotUp(_))
    ));
    assert!(matches!(
        b.cluster.migrate("t1", "steer1"),
        Err(ClusterError::Unsuitable { .. })
    ));
    let target = if b.links["data1"]
        .ops
        .lock()
        .unwrap()
        .iter()
        .any(|o| matches!(o, Op::InstallChild(_)))
    {
        ("data2", d2)
    } else {
        ("data1", d1)
    };
    let mv = b.cluster.migrate("t1", target.0).unwrap();
    assert_eq!(mv, (TunnelId(1), target.1));
    assert_eq!(b.rekeys(), [TunnelId(1)]);
    // Not moved until the new SA is on the target and the old one is gone.
    assert!(b
        .cluster
        .wait_moved(&[mv], Duration::from_millis(30))
        .is_err());
    b.clear();
    b.cluster
        .install_child(&child(1, 0x1001, Some(0x1000), true))
        .unwrap();
    assert!(matches!(&b.ops(target.0)[..], [Op::InstallChild(c)] if c.inbound_spi == 0x1001));
    assert_eq!(selector_nodes(&b.ops("steer1")), [(1, target.1)]);
    assert!(b
        .cluster
        .wait_moved(&[mv], Duration::from_millis(30))
        .is_err());
    b.cluster
        .remove_child(TunnelId(1), EspSpi(0x1000), EspSpi(0x101000));
    b.cluster
        .wait_moved(&[mv], Duration::from_millis(30))
        .unwrap();
}

#[test]
fn a_lost_data_node_moves_its_tunnels() {
    let mut b = bed();
    b.join("steer1", Role::Steer, 1);
    let d1 = b.join("data1", Role::Data, 1);
    b.cluster
        .install_child(&child(1, 0x1000, None, true))
        .unwrap();
    b.cluster
        .install_child(&child(2, 0x2000, None, true))
        .unwrap();
    let d2 = b.join("data2", Role::Data, 1);
    b.rekeys();
    // A steer node reports data1 dead.
    b.cluster.event(
        1,
        "steer1",
        pb::NodeEvent {
            event: Some(pb::node_event::Event::NodeDead(d1)),
        },
    );
    assert_eq!(b.rekeys(), [TunnelId(1), TunnelId(2)]);
    b.clear();
    b.cluster
        .install_child(&child(1, 0x1001, Some(0x1000), true))
        .unwrap();
    assert!(matches!(&b.ops("data2")[..], [Op::InstallChild(_)]));
    assert!(b.ops("data1").is_empty());
    // Its session is still open (only the probes failed): the old SA is removed there too.
    b.cluster
        .remove_child(TunnelId(1), EspSpi(0x1000), EspSpi(0x101000));
    assert!(matches!(&b.ops("data1")[..], [Op::RemoveChild(r)] if r.inbound_spi == 0x1000));
    // Only a steer node may declare a node dead.
    let _ = d2;
    b.cluster.event(
        d2,
        "data2",
        pb::NodeEvent {
            event: Some(pb::node_event::Event::NodeDead(d2)),
        },
    );
    assert!(b.rekeys().is_empty());
}

#[test]
fn without_data_nodes_install_fails_and_the_first_node_adopts_the_tunnel() {
    let mut b = bed();
    b.join("steer1", Role::Steer, 1);
    assert!(b
        .cluster
        .install_child(&child(1, 0x1000, None, true))
        .is_err());
    b.join("data1", Role::Data, 1);
    assert_eq!(b.rekeys(), [TunnelId(1)]);
}

#[test]
fn a_restarted_data_node_loses_its_sas_and_a_refusal_is_an_error() {
    let mut b = bed();
    b.join("steer1", Role::Steer, 1);
    b.join("data1", Role::Data, 1);
    b.cluster
        .install_child(&child(1, 0x1000, None, true))
        .unwrap();
    b.rekeys();
    // Same boot id: it kept its SAs (a reconnect).
    b.join("data1", Role::Data, 1);
    assert!(b.rekeys().is_empty());
    // New boot id: they are gone.
    b.join("data1", Role::Data, 2);
    assert_eq!(b.rekeys(), [TunnelId(1)]);
    *b.links["data1"].refuse.lock().unwrap() = Some("bad key".into());
    let e = b
        .cluster
        .install_child(&child(2, 0x2000, None, true))
        .unwrap_err();
    assert!(e.to_string().contains("bad key"), "{e}");
}

#[test]
fn a_steer_node_that_misses_an_update_gets_whole_tables() {
    let mut b = bed();
    b.join("steer1", Role::Steer, 1);
    b.join("data1", Role::Data, 1);
    *b.links["steer1"].refuse.lock().unwrap() = Some("busy".into());
    b.cluster
        .install_child(&child(1, 0x1000, None, true))
        .unwrap();
    *b.links["steer1"].refuse.lock().unwrap() = None;
    b.clear();
    b.cluster.tick(Instant::now());
    match &b.ops("steer1")[..] {
        [Op::SteerTables(t)] => assert_eq!(t.spis.len(), 1),
        other => panic!("{other:?}"),
    }
}

#[test]
fn drain_moves_everything_off_and_refuses_when_nowhere_to_go() {
    let mut b = bed();
    b.join("steer1", Role::Steer, 1);
    let d1 = b.join("data1", Role::Data, 1);
    b.cluster
        .install_child(&child(1, 0x1000, None, true))
        .unwrap();
    assert!(matches!(
        b.cluster.drain("data1"),
        Err(ClusterError::Unsuitable { .. })
    ));
    let d2 = b.join("data2", Role::Data, 1);
    b.rekeys();
    let moves = b.cluster.drain("data1").unwrap();
    assert_eq!(moves, [(TunnelId(1), d2)]);
    assert_eq!(b.rekeys(), [TunnelId(1)]);
    // Nothing new lands on a draining node.
    b.clear();
    b.cluster
        .install_child(&child(2, 0x2000, None, true))
        .unwrap();
    assert!(!b
        .ops("data1")
        .iter()
        .any(|o| matches!(o, Op::InstallChild(_))));
    // A reconnect of the same process keeps the drain.
    b.join("data1", Role::Data, 1);
    b.cluster
        .install_child(&child(3, 0x3000, None, true))
        .unwrap();
    assert!(!b
        .ops("data1")
        .iter()
        .any(|o| matches!(o, Op::InstallChild(_))));
    b.cluster.undrain("data1").unwrap();
    let _ = d1;
}

fn registration(
    name: &str,
    role: Role,
    geneve: SocketAddr,
    boot_id: u64,
    installed: Vec<InstalledChild>,
) -> Registration {
    Registration {
        name: name.into(),
        role,
        geneve,
        boot_id,
        workers: 2,
        installed,
        ports: Vec::new(),
        ce_macs: Vec::new(),
        routes: routebook::RouteVersion::default(),
        vtep: None,
    }
}

/// What a restored IKE SA says about the CHILD_SA [`held`] describes.
fn known(tunnel: u32, spi_in: u32) -> KnownChild {
    let c = held(tunnel, spi_in, false);
    KnownChild {
        tunnel: c.tunnel,
        ike: c.ike,
        inbound_spi: c.inbound_spi,
        outbound_spi: c.outbound_spi,
        local_ts: c.local_ts,
        remote_ts: c.remote_ts,
    }
}

fn held(tunnel: u32, spi_in: u32, sending: bool) -> InstalledChild {
    let c = child(tunnel, spi_in, None, sending);
    InstalledChild {
        tunnel: c.tunnel,
        ike: c.ike,
        inbound_spi: c.inbound_spi,
        outbound_spi: c.outbound_spi,
        local: c.local,
        remote: c.remote,
        local_ts: c.local_ts,
        remote_ts: c.remote_ts,
        sending,
    }
}

#[test]
fn a_new_control_node_adopts_what_data_nodes_hold_and_rekeys_only_the_rest() {
    let mut b = fresh_bed();
    b.join("steer1", Role::Steer, 1);
    // data1 still holds tunnel 1's two SAs (the newer sending) and an SA of tunnel 2.
    let d1 = b.join_holding(
        "data1",
        Role::Data,
        1,
        vec![
            held(1, 0x1000, false),
            held(1, 0x1001, true),
            held(2, 0x2000, true),
        ],
    );
    // Until the control loop reconciled, the steer node keeps the tables it has (a new
    // control node must not shrink them while other data nodes are still reconnecting).
    assert!(!b
        .ops("steer1")
        .iter()
        .any(|op| matches!(op, Op::SteerTables(_))));
    // The restored IKE SAs know 0x1001 and 0x2000, and 0x3000 that no node kept; 0x1000 is
    // unknown to them.
    let lost = b
        .cluster
        .reconcile(&[known(1, 0x1001), known(2, 0x2000), known(3, 0x3000)]);
    assert_eq!(lost, [EspSpi(0x3000)], "only what no node holds is rekeyed");
    assert!(b
        .ops("data1")
        .iter()
        .any(|op| matches!(op, Op::RemoveChild(r) if r.inbound_spi == 0x1000)));
    // Then steering is rebuilt whole: the SPIs (0x1000 for its grace) and the sending SAs'
    // selectors.
    let tables = b.last_tables("steer1");
    let spis: Vec<(u32, u32)> = tables.spis.iter().map(|s| (s.spi, s.node)).collect();
    assert_eq!(spis, [(0x1000, d1), (0x1001, d1), (0x2000, d1)]);
    let sel: Vec<(u32, u32)> = tables.vnis[0]
        .selectors
        .iter()
        .map(|s| (s.tunnel, s.node))
        .collect();
    assert_eq!(sel, [(1, d1), (2, d1)]);
    // A data node arriving late with a known SA still has it adopted.
    b.join_holding("data3", Role::Data, 1, vec![held(3, 0x3000, true)]);
    assert!(!b
        .ops("data3")
        .iter()
        .any(|op| matches!(op, Op::RemoveChild(_))));
    // After reconciling, a node arriving with an SA nobody knows is told to remove it.
    b.join_holding("data2", Role::Data, 1, vec![held(3, 0x4000, true)]);
    assert!(b
        .ops("data2")
        .iter()
        .any(|op| matches!(op, Op::RemoveChild(r) if r.inbound_spi == 0x4000)));
}

#[test]
fn a_claim_that_does_not_match_the_restored_sa_is_removed_and_rekeyed() {
    let mut b = fresh_bed();
    b.join("steer1", Role::Steer, 1);
    // data1 claims tunnel 2's SA 0x2000 for tunnel 1, and 0x1000 with selectors the restored
    // IKE SA did not negotiate; 0x3000 as it is.
    let mut wrong_ts = held(1, 0x1000, true);
    wrong_ts.remote_ts = held(2, 0x9999, false).remote_ts;
    b.join_holding(
        "data1",
        Role::Data,
        1,
        vec![wrong_ts, held(1, 0x2000, false), held(3, 0x3000, true)],
    );
    let mut lost = b
        .cluster
        .reconcile(&[known(1, 0x1000), known(2, 0x2000), known(3, 0x3000)]);
    lost.sort();
    assert_eq!(
        lost,
        [EspSpi(0x1000), EspSpi(0x2000)],
        "both wrong claims are rekeyed"
    );
    let mut removed: Vec<u32> = b
        .ops("data1")
        .iter()
        .filter_map(|op| match op {
            Op::RemoveChild(r) => Some(r.inbound_spi),
            _ => None,
        })
        .collect();
    removed.sort_unstable();
    assert_eq!(removed, [0x1000, 0x2000]);
    // The selectors steered are those of the SA held as described only.
    let tables = b.last_tables("steer1");
    let tunnels: Vec<u32> = tables
        .vnis
        .iter()
        .flat_map(|v| v.selectors.iter().map(|s| s.tunnel))
        .collect();
    assert_eq!(tunnels, [3]);
    // A node arriving after reconcile with a known SPI but a wrong description is refused.
    b.join_holding("data2", Role::Data, 1, vec![held(2, 0x3000, true)]);
    assert!(b
        .ops("data2")
        .iter()
        .any(|op| matches!(op, Op::RemoveChild(r) if r.inbound_spi == 0x3000)));
}

#[test]
fn reconcile_keeps_sas_of_a_rekeyed_ike_sa_and_a_sender_per_tunnel() {
    let mut b = fresh_bed();
    b.join("steer1", Role::Steer, 1);
    // data1 holds tunnel 1's old SA 0x1000 as sending (no restored IKE SA knows it) and the
    // current 0x1001, which the restored state lists under the IKE SA an IKE rekey made.
    let d1 = b.join_holding(
        "data1",
        Role::Data,
        1,
        vec![held(1, 0x1001, false), held(1, 0x1000, true)],
    );
    let mut current = known(1, 0x1001);
    current.ike.responder = IkeSpi(0x99);
    let lost = b.cluster.reconcile(&[current]);
    assert!(
        lost.is_empty(),
        "the SA handed to the new IKE SA is kept: {lost:?}"
    );
    let tables = b.last_tables("steer1");
    let sel: Vec<(u32, u32)> = tables.vnis[0]
        .selectors
        .iter()
        .map(|s| (s.tunnel, s.node))
        .collect();
    assert_eq!(sel, [(1, d1)], "the remaining SA sends for its tunnel");
    // Once removed, a restored SA is not adopted again from a node that kept it.
    b.cluster
        .remove_child(TunnelId(1), EspSpi(0x1001), EspSpi(0x1001 + 0x100000));
    b.join_holding("data2", Role::Data, 1, vec![held(1, 0x1001, true)]);
    assert!(b
        .ops("data2")
        .iter()
        .any(|op| matches!(op, Op::RemoveChild(r) if r.inbound_spi == 0x1001)));
}

#[test]
fn events_are_only_taken_from_the_node_they_concern() {
    let (to_control, from) = crossbeam_channel::bounded(16);
    let mut b = bed();
    // Rebuild with a reachable control channel.
    let (tasks_tx, tasks) = crossbeam_channel::unbounded();
    let ike = IkeRelay::bind(
        "127.0.0.1:0".parse().unwrap(),
        500,
        4500,
        to_control.clone(),
    )
    .unwrap();
    b.cluster = Cluster::new(
        b.cluster.settings().clone(),
        vec![TunnelMeta {
            id: TunnelId(1),
            name: "t1".into(),
            vni: Some(VNI),
            rate_limit_mbit: None,
        }],
        pb::DataConfig::default(),
        ike,
        tasks_tx,
        to_control,
    );
    b.tasks = tasks;
    b.links.clear();
    let s = b.join("steer1", Role::Steer, 1);
    let d1 = b.join("data1", Role::Data, 1);
    let d2 = b.join("data2", Role::Data, 1);
    b.cluster
        .install_child(&child(1, 0x1000, None, true))
        .unwrap();
    let holder = if b
        .ops("data1")
        .iter()
        .any(|o| matches!(o, Op::InstallChild(_)))
    {
        d1
    } else {
        d2
    };
    let other = if holder == d1 { d2 } else { d1 };
    let rekey = |spi| pb::NodeEvent {
        event: Some(pb::node_event::Event::RekeyNeeded(spi)),
    };
    b.cluster.event(other, "other", rekey(0x1000));
    b.cluster.event(s, "steer1", rekey(0x1000));
    assert!(
        from.try_recv().is_err(),
        "only the holder may ask for its SA's rekey"
    );
    b.cluster.event(holder, "holder", rekey(0x1000));
    assert!(matches!(from.try_recv(), Ok(ToControl::RekeyNeeded(spi)) if spi == EspSpi(0x1000)));
}

#[path = "manager_tests_limits.rs"]
mod limits;

#[path = "manager_tests_attach.rs"]
mod attach;

#[path = "manager_tests_routes.rs"]
mod routes;

#[path = "manager_tests_filters.rs"]
mod filters;
