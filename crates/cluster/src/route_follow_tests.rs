//! The follower over a data path backed by a `RouteMaster` (the same table code as a data
//! node's): changes in order, gaps, fetches with changes kept meanwhile.

use super::*;
use datapath::{DataplaneError, DataplaneStats, RouteChangeReport, RouteStats, VmRoute};
use ids::TenantId;
use ike::{ChildSaInfo, IkeSpis, TunnelId};
use routebook::RouteMaster;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use wire::EspSpi;

/// A data path holding only per-VM routes (one copy, the control node's table code).
pub(crate) struct BookPath(pub(crate) Mutex<RouteMaster>);

impl BookPath {
    /// A table with the VNet "a"/"vnet" (VNI 100, IPv4 VTEP).
    pub(crate) fn new() -> Self {
        let mut m = RouteMaster::new(1);
        m.set_vnet_configs(&[vnet_config()]).expect("VNet");
        Self(Mutex::new(m))
    }

    /// The host `addr` goes to, if any.
    pub(crate) fn host(&self, addr: &str) -> Option<IpAddr> {
        let m = self.0.lock().unwrap();
        let id = m.book().peek_id(&TenantId::new("a").unwrap(), "vnet");
        m.routes().exact(id, addr.parse().unwrap())
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.0.lock().unwrap().routes().len()
    }
}

/// The VNet the tests' routes are in.
pub(crate) fn vnet_config() -> datapath::VnetConfig {
    datapath::VnetConfig {
        tenant: TenantId::new("a").unwrap(),
        name: "vnet".into(),
        vni: 100,
        gateway_ips: vec!["10.1.0.1".parse().unwrap()],
        vtep: "192.0.2.1".parse().unwrap(),
        routes: Vec::new(),
        router_mac: None,
    }
}

/// Adds `addr` → `host` in the tests' VNet.
pub(crate) fn add(addr: &str, host: &str) -> RouteChange {
    RouteChange::Add(VmRoute {
        tenant: TenantId::new("a").unwrap(),
        vnet: "vnet".into(),
        address: addr.parse().unwrap(),
        host: host.parse().unwrap(),
    })
}

/// Removes `addr` from the tests' VNet.
pub(crate) fn del(addr: &str) -> RouteChange {
    RouteChange::Del {
        tenant: TenantId::new("a").unwrap(),
        vnet: "vnet".into(),
        address: addr.parse().unwrap(),
    }
}

impl DataPath for BookPath {
    fn install_child(&self, _child: &ChildSaInfo) -> Result<(), DataplaneError> {
        Ok(())
    }
    fn remove_child(&self, _tunnel: TunnelId, _inbound: EspSpi, _outbound: EspSpi) {}
    fn update_peer(&self, _t: TunnelId, _ike: IkeSpis, _l: SocketAddr, _r: SocketAddr) {}
    fn send_ike(&self, _l: SocketAddr, _r: SocketAddr, _p: &[u8]) -> Result<(), DataplaneError> {
        Ok(())
    }
    fn stats(&self) -> DataplaneStats {
        DataplaneStats::default()
    }
    fn change_routes(&self, change: RouteChange) -> Result<RouteChangeReport, DataplaneError> {
        self.0.lock().unwrap().change(change).map(|(_, r)| r)
    }
    fn write_routes(&self, out: &mut dyn std::io::Write) -> Result<usize, DataplaneError> {
        self.0.lock().unwrap().peek_snapshot(out)
    }
    fn route_stats(&self) -> RouteStats {
        self.0.lock().unwrap().stats()
    }
}

/// The snapshot of a master holding `changes`, at its version with epoch `epoch`.
fn snapshot(epoch: u64, changes: &[RouteChange]) -> (RouteVersion, Arc<[u8]>) {
    let mut m = RouteMaster::new(epoch);
    m.set_vnet_configs(&[vnet_config()]).unwrap();
    for c in changes {
        m.change(c.clone()).unwrap();
    }
    let mut out = Vec::new();
    m.peek_snapshot(&mut out).unwrap();
    (m.version(), Arc::from(out))
}

#[test]
fn changes_apply_in_order_and_a_gap_is_refused_and_fetched() {
    let dp = BookPath::new();
    let mut f = RouteFollower::default();
    // A node without routes takes the whole table first.
    let (v, snap) = snapshot(7, &[add("10.1.0.5", "192.0.2.5")]);
    f.announced(v);
    assert!(f.fetching());
    f.restored(&dp, v, snap).unwrap();
    assert!(!f.fetching());
    assert_eq!(f.version(), RouteVersion { epoch: 7, seq: 1 });
    let answer = f.changes(
        &dp,
        7,
        2,
        vec![add("10.1.0.6", "192.0.2.6"), del("10.1.0.5")],
    );
    assert_eq!(answer, Ok(Answer::Applied));
    assert_eq!(f.version().seq, 3);
    assert_eq!(dp.host("10.1.0.6"), Some("192.0.2.6".parse().unwrap()));
    assert_eq!(dp.host("10.1.0.5"), None);
    // Changes already held are skipped (a replay overlapping what came live).
    f.changes(
        &dp,
        7,
        3,
        vec![del("10.1.0.5"), add("10.1.0.7", "192.0.2.7")],
    )
    .unwrap();
    assert_eq!(f.version().seq, 4);
    // A gap: refused, nothing applied, the node must fetch.
    let e = f
        .changes(&dp, 7, 6, vec![add("10.1.0.8", "192.0.2.8")])
        .unwrap_err();
    assert!(
        e.starts_with("gap: the routes are at 7.4, the changes start at 7.6"),
        "{e}"
    );
    assert!(f.fetching());
    assert_eq!(dp.host("10.1.0.8"), None);
    // Another epoch is a gap too.
    let mut g = RouteFollower::default();
    assert!(g.changes(&dp, 8, 1, vec![]).is_err());
    assert!(g.fetching());
}

#[test]
fn changes_during_a_fetch_are_applied_after_it_and_stale_entries_go() {
    let dp = BookPath::new();
    let mut f = RouteFollower::default();
    // The node holds an entry the master deleted while it was away.
    dp.change_routes(add("10.1.0.99", "192.0.2.99")).unwrap();
    f.announced(RouteVersion { epoch: 3, seq: 2 });
    assert!(f.fetching());
    // Changes 3 and 4 come while the snapshot (at 2) is on its way: kept, and answered so
    // (not as applied: control must not count this node as holding them).
    let kept = f.changes(&dp, 3, 3, vec![add("10.1.0.3", "192.0.2.3")]);
    assert_eq!(kept, Ok(Answer::Kept));
    let kept = f.changes(&dp, 3, 4, vec![add("10.1.0.1", "192.0.2.44")]);
    assert_eq!(kept, Ok(Answer::Kept));
    assert_eq!(dp.host("10.1.0.3"), None, "kept, not applied");
    let (v, snap) = snapshot(
        3,
        &[add("10.1.0.1", "192.0.2.1"), add("10.1.0.2", "192.0.2.2")],
    );
    assert_eq!(v, RouteVersion { epoch: 3, seq: 2 });
    f.restored(&dp, v, snap).unwrap();
    assert!(!f.fetching());
    assert_eq!(f.version(), RouteVersion { epoch: 3, seq: 4 });
    assert_eq!(dp.host("10.1.0.99"), None, "not in the master's table");
    assert_eq!(dp.host("10.1.0.1"), Some("192.0.2.44".parse().unwrap()));
    assert_eq!(dp.host("10.1.0.3"), Some("192.0.2.3".parse().unwrap()));
    assert_eq!(dp.len(), 3);
}

#[test]
fn a_bulk_change_announced_during_a_fetch_fetches_again() {
    let dp = BookPath::new();
    let mut f = RouteFollower::default();
    f.announced(RouteVersion { epoch: 3, seq: 1 });
    f.announced(RouteVersion { epoch: 3, seq: 5 });
    let (v, snap) = snapshot(3, &[add("10.1.0.1", "192.0.2.1")]);
    f.restored(&dp, v, snap).unwrap();
    assert!(
        f.fetching(),
        "the table fetched is older than the one announced"
    );
    // Announcing the version held changes nothing.
    let mut g = RouteFollower::default();
    g.announced(NO_ROUTES);
    assert!(!g.fetching());
}
