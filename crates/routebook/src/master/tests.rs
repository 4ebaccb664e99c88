use super::*;
use datapath::VmRoute;
use overlay::Vni;
use std::net::IpAddr;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn master() -> RouteMaster {
    let mut m = RouteMaster::new(7);
    let t = TenantId::new("acme").expect("tenant");
    let id = m.vnet_id(&t, "prod");
    m.set_vnets(vec![RouteVnet {
        tenant: t,
        name: "prod".into(),
        id,
        vni: Vni::new(100).expect("vni"),
        vtep_v6: false,
    }]);
    m
}

fn add(addr: &str, host: &str) -> RouteChange {
    RouteChange::Add(VmRoute {
        tenant: TenantId::new("acme").expect("tenant"),
        vnet: "prod".into(),
        address: ip(addr),
        host: ip(host),
    })
}

#[test]
fn single_changes_are_numbered_and_replayed() {
    let mut m = master();
    assert_eq!(m.version(), RouteVersion { epoch: 7, seq: 0 });
    let (v, r) = m.change(add("10.0.0.1", "192.0.2.1")).expect("added");
    assert_eq!((v.seq, r.added), (1, 1));
    m.change(add("10.0.0.2", "192.0.2.1")).expect("added");
    m.change(add("10.0.0.1", "192.0.2.2")).expect("replaced");
    assert_eq!(m.version().seq, 3);
    assert_eq!(m.replay(m.version()), Replay::Current);
    match m.replay(RouteVersion { epoch: 7, seq: 1 }) {
        Replay::Changes(c) => {
            assert_eq!(c.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![2, 3]);
            assert_eq!(c[1].1, add("10.0.0.1", "192.0.2.2"));
        }
        other => panic!("expected changes, got {other:?}"),
    }
    // Another epoch, or ahead of the master: fetch.
    assert_eq!(m.replay(RouteVersion { epoch: 6, seq: 1 }), Replay::Fetch);
    assert_eq!(m.replay(RouteVersion { epoch: 7, seq: 4 }), Replay::Fetch);
}

#[test]
fn only_the_latest_changes_are_kept() {
    let mut m = master().with_replay_limit(2);
    for i in 1..=4 {
        m.change(add(&format!("10.0.0.{i}"), "192.0.2.1"))
            .expect("added");
    }
    assert_eq!(m.kept(), 2);
    assert_eq!(m.replay(RouteVersion { epoch: 7, seq: 1 }), Replay::Fetch);
    match m.replay(RouteVersion { epoch: 7, seq: 2 }) {
        Replay::Changes(c) => assert_eq!(c.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [3, 4]),
        other => panic!("expected changes, got {other:?}"),
    }
}

#[test]
fn a_refused_change_is_not_numbered() {
    let mut m = master();
    let e = m
        .change(add("10.0.0.1", "2001:db8::1"))
        .expect_err("family");
    assert!(e.to_string().starts_with("field host:"), "{e}");
    let e = m
        .change(RouteChange::Load(
            "acme,prod,10.0.0.1,192.0.2.1\nacme,nope,10.0.0.2,192.0.2.1\n".into(),
        ))
        .expect_err("unknown vnet");
    assert!(e.to_string().starts_with("line 2, field vnet:"), "{e}");
    assert_eq!(m.version().seq, 0);
    assert_eq!(m.routes().len(), 0);
}

#[test]
fn a_snapshot_or_a_bulk_change_ends_replay() {
    let mut m = master();
    m.change(add("10.0.0.1", "192.0.2.1")).expect("added");
    let mut snap = Vec::new();
    let (v, n) = m.write_snapshot(&mut snap).expect("written");
    assert_eq!((v.seq, n), (1, 1));
    assert_eq!(m.kept(), 0);
    assert_eq!(m.replay(RouteVersion { epoch: 7, seq: 0 }), Replay::Fetch);
    m.change(add("10.0.0.2", "192.0.2.1")).expect("added");
    assert!(matches!(m.replay(v), Replay::Changes(c) if c.len() == 1));
    let (v, r) = m
        .change(RouteChange::Load("acme,prod,10.0.0.3,192.0.2.1\n".into()))
        .expect("loaded");
    assert_eq!((v.seq, r.added), (3, 1));
    assert_eq!(m.kept(), 0);
    assert_eq!(m.replay(RouteVersion { epoch: 7, seq: 2 }), Replay::Fetch);
    // A restore into a fresh master gives the same snapshot bytes.
    let mut full = Vec::new();
    m.peek_snapshot(&mut full).expect("written");
    let mut other = master();
    let (_, r) = other
        .change(RouteChange::Restore(full.clone().into()))
        .expect("restored");
    assert_eq!(r.added, 3);
    let mut again = Vec::new();
    other.peek_snapshot(&mut again).expect("written");
    assert_eq!(again, full);
}

#[test]
fn a_load_that_partly_fails_is_numbered() {
    let mut m = master();
    m.limit(Some(1));
    let e = m
        .change(RouteChange::Load(
            "acme,prod,10.0.0.1,192.0.2.1\nacme,prod,10.0.0.2,192.0.2.1\n".into(),
        ))
        .expect_err("one too many");
    assert!(
        e.to_string().contains("1 entries of the file not added"),
        "{e}"
    );
    assert_eq!((m.version().seq, m.routes().len()), (1, 1));
    // An add that fails is undone and not numbered.
    assert!(m.change(add("10.0.0.9", "192.0.2.1")).is_err());
    assert_eq!((m.version().seq, m.routes().len()), (1, 1));
}

#[test]
fn vnets_come_from_the_data_nodes_configuration() {
    let cfg = |name: &str, vni: u32, vtep: &str| datapath::VnetConfig {
        tenant: TenantId::new("acme").expect("tenant"),
        name: name.into(),
        vni,
        gateway_ips: vec![ip("10.0.0.1")],
        vtep: ip(vtep),
        routes: Vec::new(),
        router_mac: None,
    };
    let mut m = RouteMaster::new(1);
    m.set_vnet_configs(&[
        cfg("prod", 100, "192.0.2.100"),
        cfg("six", 200, "2001:db8::100"),
    ])
    .expect("valid");
    assert_eq!(m.book().vnets().len(), 2);
    m.change(add("10.0.0.1", "192.0.2.1")).expect("added");
    let e = m
        .set_vnet_configs(&[cfg("prod", 1 << 24, "192.0.2.100")])
        .expect_err("VNI too large");
    assert!(e.to_string().contains("vnets[0].vni"), "{e}");
    // Nothing changed: the entry is still there, and so is the VNet.
    assert_eq!((m.routes().len(), m.book().vnets().len()), (1, 2));
    // prod gone: its entry goes too, as a numbered bulk change (a table at version 1 holds
    // the entry, so version 1 must not also name the table without it); the change kept for
    // replay goes with it (a node at 1 fetches).
    assert_eq!(m.kept(), 1);
    let dropped = m
        .set_vnet_configs(&[cfg("six", 200, "2001:db8::100")])
        .expect("valid");
    assert!(dropped);
    assert_eq!((m.routes().len(), m.version().seq, m.kept()), (0, 2, 0));
    assert_eq!(m.replay(RouteVersion { epoch: 1, seq: 1 }), Replay::Fetch);
    // A VNet without entries goes, or one comes: the tables are the same, the version stays.
    let dropped = m
        .set_vnet_configs(&[cfg("prod", 100, "192.0.2.100")])
        .expect("valid");
    assert!(!dropped);
    assert_eq!(m.version().seq, 2);
}

/// `Replace` makes the table the snapshot's entries (a restore only adds and replaces), keeps
/// the VNets (an entry added after it lands), and numbers the change as a bulk one.
#[test]
fn replace_removes_what_the_snapshot_lacks_and_keeps_the_vnets() {
    let mut theirs = master();
    theirs.change(add("10.0.0.2", "192.0.2.9")).expect("added");
    theirs.change(add("10.0.0.3", "192.0.2.3")).expect("added");
    let mut snap = Vec::new();
    theirs.peek_snapshot(&mut snap).expect("snapshot");
    let mut m = master();
    m.change(add("10.0.0.1", "192.0.2.1")).expect("added");
    m.change(add("10.0.0.2", "192.0.2.1")).expect("added");
    let (v, r) = m
        .change(RouteChange::Replace(snap.clone().into()))
        .expect("replaced");
    assert_eq!((v.seq, r.added, m.kept()), (3, 2, 0));
    let id = m
        .book()
        .peek_id(&TenantId::new("acme").expect("tenant"), "prod");
    assert_eq!(m.routes().exact(id, ip("10.0.0.1")), None);
    assert_eq!(m.routes().exact(id, ip("10.0.0.2")), Some(ip("192.0.2.9")));
    assert_eq!(m.routes().len(), 2);
    assert_eq!(m.stats().hosts, 2);
    m.change(add("10.0.0.4", "192.0.2.4"))
        .expect("the VNet is still there");
    // Restore, by contrast, keeps what the snapshot lacks.
    let mut n = master();
    n.change(add("10.0.0.1", "192.0.2.1")).expect("added");
    n.change(RouteChange::Restore(snap.into()))
        .expect("restored");
    assert_eq!(n.routes().len(), 3);
}
