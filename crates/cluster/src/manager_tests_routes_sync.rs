//! What the control node knows of its data nodes' copies of the per-VM routes (issue 16 §2,
//! review): a change kept by a fetching node.

use super::*;
use datapath::RouteFanout;

impl RouteBed {
    /// True if the core counts data node `name`'s routes as the master's.
    fn current(&self, name: &str) -> bool {
        let id = self.nodes[name].0;
        !self.bed.cluster.state().core.routes_behind.contains(&id)
    }
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
