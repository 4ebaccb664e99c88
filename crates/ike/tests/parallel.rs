//! Parallel CHILD_SAs (issue 19 §2): `Endpoint::add_child` creates CHILD_SAs with the same
//! selectors beside the one in use (CREATE_CHILD_SA without REKEY_SA, RFC 7296 §1.3.1), each
//! with its own keys and sequence space, rekeyed and deleted on its own, from either side.

mod harness;
use harness::*;
use protego_ike::*;
use std::time::Duration;
use wire::EspSpi;

fn spis(n: &Node) -> Vec<EspSpi> {
    let mut v: Vec<EspSpi> = n.children.keys().copied().collect();
    v.sort_unstable_by_key(|s| s.0);
    v
}

#[test]
fn parallel_children_share_selectors_and_live_apart() {
    let mut p = Pair::with_tunnel(310);
    let t = TunnelId(1);
    assert!(matches!(
        p.a.ep.add_child(p.now, t),
        Err(Error::NotEstablished(_))
    ));
    assert!(matches!(
        p.a.ep.add_child(p.now, TunnelId(99)),
        Err(Error::UnknownTunnel(_))
    ));
    p.connect();
    let first = spis(&p.a);
    assert_eq!(first.len(), 1);
    // Three more at once: all are created (the first in flight, two queued behind it), none
    // merged.
    for _ in 0..3 {
        p.a.ep.add_child(p.now, t).expect("add");
    }
    p.run_for(Duration::from_secs(5));
    p.assert_children_consistent();
    assert_eq!(p.a.children.len(), 4, "{:?}", spis(&p.a));
    let ts = &p.a.children[&first[0]];
    for c in p.a.children.values() {
        assert_eq!((&c.local_ts, &c.remote_ts), (&ts.local_ts, &ts.remote_ts));
        assert_eq!(c.tunnel, t);
    }
    let mut keys: Vec<_> =
        p.a.children
            .values()
            .map(|c| c.keys.outbound_encr.to_vec())
            .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 4, "each has its own keys");
    // The responder adds one too.
    p.b.ep.add_child(p.now, t).expect("add from B");
    p.run_for(Duration::from_secs(5));
    p.assert_children_consistent();
    assert_eq!(p.b.children.len(), 5);

    // One is rekeyed: the others stay as they were.
    let before = spis(&p.a);
    let rekeyed = before[1];
    p.a.ep.rekey_child(p.now, rekeyed).expect("rekey");
    p.run_for(Duration::from_secs(5));
    p.assert_children_consistent();
    let after = spis(&p.a);
    assert_eq!(after.len(), 5);
    assert!(!after.contains(&rekeyed));
    for s in before.iter().filter(|s| **s != rekeyed) {
        assert!(after.contains(s), "{s} kept");
    }

    // One is deleted: the IKE SA and the others stay.
    let gone = after[0];
    p.a.ep.delete_child(p.now, gone).expect("delete");
    p.run_for(Duration::from_secs(5));
    p.assert_children_consistent();
    assert_eq!(p.a.children.len(), 4);
    assert!(!p.a.children.contains_key(&gone));
    assert!(p.a.events.iter().any(|e| matches!(
        e,
        Event::ChildSaDeleted { inbound_spi, reason: DeleteReason::LocalRequest, .. } if *inbound_spi == gone
    )));
    assert!(matches!(
        p.a.ep.delete_child(p.now, gone),
        Err(Error::UnknownChildSa(_))
    ));
    p.assert_one_ike_sa();
    p.assert_sending_decryptable();

    // Asked for while the IKE SA is being rekeyed: created on its successor.
    let ike = p.a.live_ike(p.now)[0].ike;
    p.a.ep.rekey_ike(p.now, t).expect("rekey IKE");
    for _ in 0..2 {
        p.a.ep.add_child(p.now, t).expect("add");
    }
    p.run_for(Duration::from_secs(5));
    p.assert_one_ike_sa();
    assert_ne!(p.a.live_ike(p.now)[0].ike, ike, "the IKE SA was rekeyed");
    p.assert_children_consistent();
    assert_eq!(p.a.children.len(), 6);
}

#[test]
fn parallel_children_are_rekeyed_by_their_own_timers_over_a_lossy_link() {
    // Every CHILD_SA's rekey timer runs on its own over a link that loses, duplicates and
    // reorders: after many rounds the parallel CHILD_SAs are all still there, in pairs, and
    // only rekeys deleted any.
    for seed in 320..324 {
        let mut p = Pair::with_rekeying_tunnel(seed);
        p.connect();
        for _ in 0..2 {
            p.a.ep.add_child(p.now, TunnelId(1)).expect("add");
        }
        p.run_for(Duration::from_secs(5));
        assert_eq!(p.a.children.len(), 3, "seed {seed}");
        p.link.loss = 0.1;
        p.link.duplicate = 0.05;
        p.link.jitter = Duration::from_millis(200);
        p.run_for(Duration::from_secs(1500));
        p.link = LinkConfig {
            delay: Duration::from_millis(5),
            ..Default::default()
        };
        p.run_for(Duration::from_secs(120));
        p.assert_one_ike_sa();
        p.assert_children_consistent();
        assert_eq!(p.a.children.len(), 3, "seed {seed}: {:?}", spis(&p.a));
        assert!(
            p.a.deleted_reasons()
                .iter()
                .all(|r| *r == DeleteReason::Rekeyed),
            "seed {seed}: {:?}",
            p.a.deleted_reasons()
        );
        assert!(
            p.a.count(|e| matches!(e, Event::ChildSaInstalled(i) if i.replaces.is_some())) >= 15,
            "seed {seed}: each was rekeyed several times"
        );
    }
}

#[test]
fn a_queued_add_survives_a_snapshot_and_restore() {
    // Two adds asked for while the link is down: one in flight (retransmitted), one queued.
    // A standby restored from the snapshot creates both.
    let mut p = Pair::with_tunnel(312);
    p.connect();
    let ike = p.a.live_ike(p.now)[0].ike;
    p.up = false;
    for _ in 0..2 {
        p.a.ep.add_child(p.now, TunnelId(1)).expect("add");
    }
    p.run_for(Duration::from_secs(1));
    let snap = p.a.ep.snapshot(p.now, ike).expect("snapshot");
    let mut standby = Node::new(A_ADDR, 78, EndpointConfig::default(), p.now);
    standby.ep.add_peer(p.now, cfg_a()).expect("a");
    standby.ep.restore(p.now, &snap).expect("restore");
    standby.children = std::mem::take(&mut p.a.children);
    p.a = standby;
    p.up = true;
    p.run_for(Duration::from_secs(30));
    // The queued one is created normally. The one in flight is the standby's orphan (its
    // answer accepted, not interpreted: a snapshot holds no nonce or key share), so only the
    // peer holds it, until its lifetime ends, as with any CREATE_CHILD_SA in flight at a
    // takeover.
    assert_eq!(p.a.children.len(), 2, "A {:?}", spis(&p.a));
    assert_eq!(p.b.children.len(), 3, "B {:?}", p.b.children.keys());
}
