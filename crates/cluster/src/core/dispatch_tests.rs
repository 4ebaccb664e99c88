//! The control node's self-dispatch: membership, the tables and the rule that keeps a
//! virtual MAC with its old owner until the new one confirmed.

use super::*;
use control::config::{ClusterDispatch, DispatchMode};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const VNI: u32 = 1001;
const K: u32 = 12;
const TUNNEL: ike::TunnelId = ike::TunnelId(1);

fn settings() -> ClusterDispatch {
    ClusterDispatch {
        mode: DispatchMode::SelfDispatch,
        vmacs: K,
        announce_interval: Duration::from_secs(10),
        ring: ::dispatch::Params {
            load_interval: Duration::from_secs(1),
            move_interval: Duration::from_secs(2),
            threshold: 0.1,
            batch: 2,
            linger: Duration::from_secs(1),
            ack_timeout: Duration::from_secs(2),
        },
    }
}

fn core(mode: DispatchMode, now: Instant) -> ClusterCore {
    let mut core = ClusterCore::new(
        "10.0.0.10:6081".parse().unwrap(),
        Default::default(),
        vec![TunnelMeta {
            id: TUNNEL,
            name: "t1".into(),
            vni: Some(VNI),
            rate_limit_mbit: None,
        }],
        BTreeMap::from([(VNI, vec!["10.1.0.1".to_owned()])]),
        Duration::from_secs(5),
    );
    core.set_dispatch_settings(ClusterDispatch { mode, ..settings() }, now);
    core
}

fn hello(core: &mut ClusterCore, name: &str, now: Instant) -> u32 {
    let n: u8 = name.trim_start_matches("data").parse().unwrap();
    core.handle_hello(
        Hello {
            name: name.to_owned(),
            role: Role::Data,
            geneve: format!("10.0.0.{}:6081", 20 + n).parse().unwrap(),
            boot_id: 1,
            workers: 1,
            installed: Vec::new(),
            ports: Vec::new(),
            vtep: Some(format!("10.0.0.{}", 20 + n).parse().unwrap()),
        },
        now,
    )
}

/// The tables of the outbox: (node, token, owner per virtual MAC as VTEP's last octet).
fn tables(core: &mut ClusterCore) -> Vec<(u32, u64, Vec<u8>)> {
    core.poll_outbox()
        .send
        .into_iter()
        .filter_map(|o| match (o.directive, o.wait) {
            (Directive::SetDispatch(d), Await::Dispatch(token)) => {
                assert_eq!(d.vmacs, K);
                assert_eq!(d.vnets.len(), 1);
                let v = &d.vnets[0];
                assert_eq!(v.vni, VNI);
                let owners = v
                    .owners
                    .iter()
                    .map(|&i| match v.nodes[usize::from(i)] {
                        std::net::IpAddr::V4(a) => a.octets()[3] - 20,
                        std::net::IpAddr::V6(_) => unreachable!(),
                    })
                    .collect();
                Some((o.node, token, owners))
            }
            _ => None,
        })
        .collect()
}

/// Confirms every table, returning the tables the confirmations released.
fn confirm(
    core: &mut ClusterCore,
    sent: &[(u32, u64, Vec<u8>)],
    now: Instant,
) -> Vec<(u32, u64, Vec<u8>)> {
    let mut out = Vec::new();
    for (_, token, _) in sent {
        core.handle_dispatch_answer(*token, true, now);
        out.extend(tables(core));
    }
    out
}

fn count(owners: &[u8], node: u8) -> usize {
    owners.iter().filter(|&&o| o == node).count()
}

#[test]
fn steer_mode_sends_no_tables() {
    let now = Instant::now();
    let mut c = core(DispatchMode::Steer, now);
    hello(&mut c, "data1", now);
    hello(&mut c, "data2", now);
    c.handle_tick(now + Duration::from_secs(10));
    assert!(tables(&mut c).is_empty());
    let s = c.dispatch_status(now);
    assert_eq!(s.mode, "steer");
    assert!(s.ring.is_empty());
}

#[test]
fn a_node_that_joins_takes_its_share_only_once_it_confirmed() {
    let now = Instant::now();
    let mut c = core(DispatchMode::SelfDispatch, now);
    hello(&mut c, "data1", now);
    let t = tables(&mut c);
    assert_eq!(t.len(), 1);
    assert_eq!(
        t[0].2,
        vec![1; K as usize],
        "alone, it owns every virtual MAC"
    );
    confirm(&mut c, &t, now);

    hello(&mut c, "data2", now);
    let t = tables(&mut c);
    // Only the newcomer: data1 keeps what it gives away until data2 confirmed.
    assert_eq!(t.len(), 1, "{t:?}");
    let (node, _, owners) = &t[0];
    assert_eq!(*node, c.known_id("data2").unwrap());
    assert_eq!(count(owners, 2), K as usize / 2);
    let released = confirm(&mut c, &t, now);
    assert_eq!(released.len(), 1, "{released:?}");
    assert_eq!(released[0].0, c.known_id("data1").unwrap());
    assert_eq!(released[0].2, *owners, "data1 lets go of data2's share");

    // A third: a third of each.
    confirm(&mut c, &released, now);
    hello(&mut c, "data3", now);
    let t = tables(&mut c);
    // The newcomer owns 4; the others learn where those went but still own their 6 each.
    let id = |n: &str| c.known_id(n).unwrap();
    assert_eq!(t.len(), 3);
    for (node, _, owners) in &t {
        let (mine, n) = match *node {
            x if x == id("data3") => (3, 4),
            x if x == id("data2") => (2, 6),
            _ => (1, 6),
        };
        assert_eq!(count(owners, mine), n, "{owners:?}");
    }
    let released = confirm(&mut c, &t, now);
    assert_eq!(released.len(), 2);
    for (_, _, owners) in &released {
        assert_eq!(
            [count(owners, 1), count(owners, 2), count(owners, 3)],
            [4, 4, 4]
        );
    }
    let s = c.dispatch_status(now);
    assert_eq!(s.mode, "self");
    assert_eq!(s.ring.len(), 3);
    assert_eq!(
        s.owned[&VNI].values().copied().collect::<Vec<_>>(),
        vec![4, 4, 4]
    );
    assert!(s.moves.iter().any(|(_, m)| m.why == "join" && m.vmacs == 4));
}

#[test]
fn a_failed_nodes_virtual_macs_go_to_its_successor_at_once() {
    let now = Instant::now();
    let mut c = core(DispatchMode::SelfDispatch, now);
    for n in ["data1", "data2", "data3"] {
        hello(&mut c, n, now);
        let t = tables(&mut c);
        let r = confirm(&mut c, &t, now);
        confirm(&mut c, &r, now);
    }
    let before = c.dispatch_status(now).owned[&VNI].clone();
    let d2 = c.known_id("data2").unwrap();
    let d3 = c.known_id("data3").unwrap();
    c.handle_node_dead(d2, now);
    let t = tables(&mut c);
    // The successor (data3) gets data2's share without waiting for anyone.
    let to3: Vec<_> = t.iter().filter(|x| x.0 == d3).collect();
    assert_eq!(to3.len(), 1, "{t:?}");
    assert_eq!(count(&to3[0].2, 3), before[&d2] + before[&d3]);
    assert_eq!(count(&to3[0].2, 2), 0);
    assert!(t.iter().all(|x| x.0 != d2), "nothing to the dead node");
    let s = c.dispatch_status(now);
    assert_eq!(s.ring.len(), 2);
    assert!(s
        .moves
        .iter()
        .any(|(_, m)| m.why == "failed" && m.from == Some(d2)));
}

#[test]
fn a_loaded_node_hands_virtual_macs_to_its_successor_and_no_vmac_is_ever_unowned() {
    let t0 = Instant::now();
    let mut c = core(DispatchMode::SelfDispatch, t0);
    let mut held: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let mut pending: Vec<(u32, u64, Vec<u8>)> = Vec::new();
    for n in ["data1", "data2"] {
        hello(&mut c, n, t0);
        pending.extend(tables(&mut c));
    }
    let (d1, d2) = (c.known_id("data1").unwrap(), c.known_id("data2").unwrap());
    let mut moved = false;
    for step in 0..60u64 {
        let now = t0 + Duration::from_millis(500 * step);
        // The nodes confirm what they were sent (one step late).
        for (node, token, owners) in std::mem::take(&mut pending) {
            held.insert(node, owners);
            c.handle_dispatch_answer(token, true, now);
            pending.extend(tables(&mut c));
        }
        // Every virtual MAC is owned by some node's confirmed table.
        if held.len() == 2 {
            for v in 0..K as usize {
                assert!(
                    held.iter()
                        .any(|(n, o)| (*n == d1 && o[v] == 1) || (*n == d2 && o[v] == 2)),
                    "virtual MAC {v} unowned at step {step}: {held:?}"
                );
            }
        }
        // data1 is busy, data2 idle; each reports every second.
        if step % 2 == 0 {
            for (id, util) in [(d1, 0.8), (d2, 0.1)] {
                let frames: Vec<(u32, u16, u64)> = held
                    .get(&id)
                    .map(|o| {
                        o.iter()
                            .enumerate()
                            .filter(|(_, x)| u32::from(**x) == if id == d1 { 1 } else { 2 })
                            .map(|(v, _)| (VNI, v as u16, 1000 * step))
                            .collect()
                    })
                    .unwrap_or_default();
                c.handle_report(
                    id,
                    NodeLoad {
                        utilization: util,
                        vmac_packets: frames,
                        ..NodeLoad::default()
                    },
                    now,
                );
                pending.extend(tables(&mut c));
            }
        }
        c.handle_tick(now);
        pending.extend(tables(&mut c));
        moved |= c
            .dispatch_status(now)
            .moves
            .iter()
            .any(|(_, m)| m.why == "load" && m.from == Some(d1) && m.to == d2);
    }
    assert!(moved, "data1 never handed anything to data2");
    let s = c.dispatch_status(t0);
    assert!(s.owned[&VNI][&d1] < K as usize / 2, "{:?}", s.owned);
    assert!(s.loads[&d1][&VNI] > 0.0);
}

fn child(spi: u32, replaces: Option<u32>) -> NewChild {
    let ts = |s: &str| ike::TrafficSelector::parse(s).unwrap();
    NewChild {
        tunnel: TUNNEL,
        ike: ike::IkeSpis {
            initiator: wire::IkeSpi(1),
            responder: wire::IkeSpi(2),
        },
        inbound_spi: wire::EspSpi(spi),
        outbound_spi: wire::EspSpi(spi + 1000),
        outbound_active: true,
        local_ts: vec![ts("10.1.0.0/24")],
        remote_ts: vec![ts("192.168.1.0/24")],
        replaces: replaces.map(wire::EspSpi),
    }
}

/// A self-dispatch core, reconciled, with data nodes `data1`..`data3` registered.
fn three_data_nodes(now: Instant) -> ClusterCore {
    let mut c = core(DispatchMode::SelfDispatch, now);
    c.handle_reconcile(&[], now);
    for n in ["data1", "data2", "data3"] {
        hello(&mut c, n, now);
    }
    drop(c.poll_outbox());
    c
}

/// Installs `c` and answers yes for its node; returns the node.
fn install(core: &mut ClusterCore, c: NewChild, now: Instant) -> u32 {
    let node = core.handle_install(c.clone()).unwrap();
    core.handle_install_answer(&c, true, now);
    drop(core.poll_outbox());
    node
}

#[test]
fn a_spread_tunnel_gets_a_child_sa_on_every_node_and_loses_only_a_dead_nodes() {
    let now = Instant::now();
    let mut c = three_data_nodes(now);
    let id = |c: &ClusterCore, n: &str| c.known_id(n).unwrap();
    assert!(c.spread(TUNNEL));
    // The first CHILD_SA (IKE_AUTH's) goes to the first node of the ring.
    assert_eq!(install(&mut c, child(100, None), now), id(&c, "data1"));
    // Then control asks for one per other node.
    c.handle_tick(now);
    let out = c.poll_outbox();
    assert_eq!(out.add_children, vec![TUNNEL, TUNNEL]);
    assert!(out.rekeys.is_empty());
    // Not again before the retry interval.
    c.handle_tick(now + Duration::from_secs(1));
    assert!(c.poll_outbox().add_children.is_empty());
    assert_eq!(install(&mut c, child(200, None), now), id(&c, "data2"));
    assert_eq!(install(&mut c, child(300, None), now), id(&c, "data3"));
    c.handle_tick(now + Duration::from_secs(10));
    assert!(
        c.poll_outbox().add_children.is_empty(),
        "every node has one"
    );
    // A rekey stays on the node of the CHILD_SA it replaces.
    assert_eq!(install(&mut c, child(201, Some(200)), now), id(&c, "data2"));
    c.handle_remove(TUNNEL, wire::EspSpi(200), wire::EspSpi(1200), now);
    drop(c.poll_outbox());

    // data3 dies: its CHILD_SA is deleted with the peer, not rekeyed; the others stay.
    c.handle_node_dead(id(&c, "data3"), now);
    let out = c.poll_outbox();
    assert_eq!(out.delete_children, vec![(TUNNEL, wire::EspSpi(300))]);
    assert!(out.rekeys.is_empty(), "{:?}", out.rekeys);
    assert!(c.unplaced().is_empty());
    c.handle_tick(now + Duration::from_secs(20));
    let out = c.poll_outbox();
    assert!(
        out.rekeys.is_empty() && out.add_children.is_empty(),
        "{out:?}"
    );
    c.handle_remove(TUNNEL, wire::EspSpi(300), wire::EspSpi(1300), now);
    assert!(!c.dispatch.deleting.contains(&wire::EspSpi(300)));

    // A node that joins gets one, and joins the ring only once it holds it (it could not
    // seal what its virtual MACs would bring before).
    hello(&mut c, "data4", now);
    assert_eq!(c.poll_outbox().add_children, vec![TUNNEL]);
    c.handle_tick(now + Duration::from_secs(30));
    assert!(c.poll_outbox().add_children.is_empty(), "in flight");
    assert!(!c.dispatch_status(now).ring.contains(&id(&c, "data4")));
    assert_eq!(install(&mut c, child(400, None), now), id(&c, "data4"));
    c.handle_tick(now + Duration::from_secs(31));
    assert!(c.dispatch_status(now).ring.contains(&id(&c, "data4")));
}

#[test]
fn a_peer_that_takes_no_more_child_sas_is_not_asked_again_until_one_is_removed() {
    let now = Instant::now();
    let mut c = three_data_nodes(now);
    let id = |c: &ClusterCore, n: &str| c.known_id(n).unwrap();
    // A refused first CHILD_SA (IKE_AUTH's, not asked for here) caps nothing.
    c.handle_child_refused(TUNNEL, true, now);
    // The peer's own CHILD_SAs (per-resource ones, RFC 9611, or plain parallel ones) go to
    // the nodes that hold none of the tunnel's, one each.
    assert_eq!(install(&mut c, child(100, None), now), id(&c, "data1"));
    assert_eq!(install(&mut c, child(200, None), now), id(&c, "data2"));
    c.handle_tick(now);
    assert_eq!(c.poll_outbox().add_children, vec![TUNNEL]);
    // data3 stays in the ring while its CHILD_SA is on its way.
    assert!(c.dispatch_status(now).ring.contains(&id(&c, "data3")));
    // The peer answers TS_MAX_QUEUE: data3 gets none, none is asked for however long, and
    // data3 leaves the ring (it could not seal what its virtual MACs bring).
    c.handle_child_refused(TUNNEL, true, now);
    for s in [10, 20, 60] {
        c.handle_tick(now + Duration::from_secs(s));
        assert!(c.poll_outbox().add_children.is_empty(), "at {s} s");
    }
    let ring = c.dispatch_status(now).ring;
    assert_eq!(ring, vec![id(&c, "data1"), id(&c, "data2")]);
    // A rekey frees no place on the peer: still none asked for.
    install(&mut c, child(201, Some(200)), now);
    c.handle_remove(TUNNEL, wire::EspSpi(200), wire::EspSpi(1200), now);
    drop(c.poll_outbox());
    c.handle_tick(now + Duration::from_secs(65));
    assert!(c.poll_outbox().add_children.is_empty(), "after a rekey");
    // One of the tunnel's CHILD_SAs is gone: asking again (for data2 and data3).
    c.handle_remove(TUNNEL, wire::EspSpi(201), wire::EspSpi(1201), now);
    drop(c.poll_outbox());
    c.handle_tick(now + Duration::from_secs(70));
    assert_eq!(c.poll_outbox().add_children, vec![TUNNEL, TUNNEL]);
}

#[test]
fn child_sas_asked_for_are_counted_until_answered_refused_or_lost() {
    let now = Instant::now();
    let mut c = three_data_nodes(now);
    let at = |s: u64| now + Duration::from_secs(s);
    install(&mut c, child(100, None), now);
    c.handle_tick(now);
    assert_eq!(c.poll_outbox().add_children, vec![TUNNEL, TUNNEL]);
    // A slow peer: nothing more is asked for while both are in flight (before, one was asked
    // for again every 5 s, and a peer slower than that got duplicates).
    for s in [5, 10, 30] {
        c.handle_tick(at(s));
        assert!(c.poll_outbox().add_children.is_empty(), "at {s} s");
    }
    // One answered, one refused (say TEMPORARY_FAILURE): the missing one is asked for again,
    // but only after the retry interval.
    install(&mut c, child(200, None), at(31));
    c.handle_child_refused(TUNNEL, false, at(31));
    c.handle_tick(at(32));
    assert!(c.poll_outbox().add_children.is_empty());
    c.handle_tick(at(37));
    assert_eq!(c.poll_outbox().add_children, vec![TUNNEL]);
    // Unanswered for a minute: lost, asked for again.
    c.handle_tick(at(60));
    assert!(c.poll_outbox().add_children.is_empty());
    c.handle_tick(at(98));
    assert_eq!(c.poll_outbox().add_children, vec![TUNNEL]);
}

#[test]
fn in_steer_mode_a_tunnel_is_not_spread() {
    let now = Instant::now();
    let mut c = core(DispatchMode::Steer, now);
    hello(&mut c, "data1", now);
    hello(&mut c, "data2", now);
    assert!(!c.spread(TUNNEL));
    install(&mut c, child(100, None), now);
    c.handle_tick(now + Duration::from_secs(10));
    assert!(c.poll_outbox().add_children.is_empty());
}

#[test]
fn a_drained_node_gives_its_virtual_macs_away_then_its_child_sa_is_deleted() {
    let now = Instant::now();
    let mut c = core(DispatchMode::SelfDispatch, now);
    c.handle_reconcile(&[], now);
    for n in ["data1", "data2"] {
        hello(&mut c, n, now);
        let t = tables(&mut c);
        let r = confirm(&mut c, &t, now);
        confirm(&mut c, &r, now);
    }
    let (d1, d2) = (c.known_id("data1").unwrap(), c.known_id("data2").unwrap());
    assert_eq!(install(&mut c, child(100, None), now), d1);
    assert_eq!(install(&mut c, child(200, None), now), d2);
    // A drain moves no spread tunnel: data2 leaves the ring.
    let moved = c.handle_drain("data2").unwrap();
    assert!(moved.is_empty(), "{moved:?}");
    c.handle_tick(now);
    let t = tables(&mut c);
    // data1 takes data2's virtual MACs; data2 keeps them until then: nothing deleted yet.
    assert!(
        t.iter().any(|x| x.0 == d1 && count(&x.2, 1) == K as usize),
        "{t:?}"
    );
    assert!(!c.dispatch.deleting.contains(&wire::EspSpi(200)));
    let released = confirm(&mut c, &t, now);
    assert!(
        released.iter().any(|x| x.0 == d2 && count(&x.2, 2) == 0),
        "{released:?}"
    );
    assert!(
        !c.dispatch.deleting.contains(&wire::EspSpi(200)),
        "not before data2 confirmed"
    );
    for (_, token, _) in &released {
        c.handle_dispatch_answer(*token, true, now);
    }
    let out = c.poll_outbox();
    assert_eq!(out.delete_children, vec![(TUNNEL, wire::EspSpi(200))]);
    assert!(out.rekeys.is_empty());
}

#[test]
fn a_restarted_nodes_lost_child_sa_is_deleted_not_rekeyed() {
    let now = Instant::now();
    let mut c = core(DispatchMode::SelfDispatch, now);
    c.handle_reconcile(&[], now);
    for n in ["data1", "data2"] {
        hello(&mut c, n, now);
    }
    drop(c.poll_outbox());
    let d2 = c.known_id("data2").unwrap();
    install(&mut c, child(100, None), now);
    assert_eq!(install(&mut c, child(200, None), now), d2);
    // data2 comes back with a new boot id before its session's end was seen.
    c.handle_hello(
        Hello {
            name: "data2".into(),
            role: Role::Data,
            geneve: "10.0.0.22:6081".parse().unwrap(),
            boot_id: 2,
            workers: 1,
            installed: Vec::new(),
            ports: Vec::new(),
            vtep: Some("10.0.0.22".parse().unwrap()),
        },
        now,
    );
    let out = c.poll_outbox();
    assert_eq!(out.delete_children, vec![(TUNNEL, wire::EspSpi(200))]);
    assert!(out.rekeys.is_empty(), "{:?}", out.rekeys);
    // A new one is asked for at once (and not again while it is on its way).
    assert_eq!(out.add_children, vec![TUNNEL]);
    // It leaves the ring until it holds a CHILD_SA again.
    assert!(!c.dispatch_status(now).ring.contains(&d2));
    c.handle_tick(now + Duration::from_secs(10));
    assert!(c.poll_outbox().add_children.is_empty());
    assert_eq!(install(&mut c, child(300, None), now), d2);
    c.handle_tick(now + Duration::from_secs(11));
    assert!(c.dispatch_status(now).ring.contains(&d2));
}

#[test]
fn a_refused_table_is_sent_again_after_the_retry_interval() {
    let now = Instant::now();
    let mut c = core(DispatchMode::SelfDispatch, now);
    hello(&mut c, "data1", now);
    let t = tables(&mut c);
    assert_eq!(t.len(), 1);
    c.handle_dispatch_answer(t[0].1, false, now);
    c.handle_tick(now + Duration::from_secs(1));
    assert!(tables(&mut c).is_empty(), "not at once");
    c.handle_tick(now + Duration::from_secs(6));
    let again = tables(&mut c);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].2, t[0].2);
}

#[test]
fn a_joining_node_keeps_its_first_child_sa_until_it_holds_every_tunnels() {
    let now = Instant::now();
    let t2 = ike::TunnelId(2);
    let mut c = ClusterCore::new(
        "10.0.0.10:6081".parse().unwrap(),
        Default::default(),
        [TUNNEL, t2]
            .into_iter()
            .map(|id| TunnelMeta {
                id,
                name: format!("t{}", id.0),
                vni: Some(VNI),
                rate_limit_mbit: None,
            })
            .collect(),
        BTreeMap::from([(VNI, vec!["10.1.0.1".to_owned()])]),
        Duration::from_secs(5),
    );
    c.set_dispatch_settings(settings(), now);
    c.handle_reconcile(&[], now);
    hello(&mut c, "data1", now);
    drop(c.poll_outbox());
    install(&mut c, child(100, None), now);
    install(
        &mut c,
        NewChild {
            tunnel: t2,
            ..child(110, None)
        },
        now,
    );
    let d2 = hello(&mut c, "data2", now);
    // data2 confirms its table (it owns nothing yet).
    let t = tables(&mut c);
    let r = confirm(&mut c, &t, now);
    confirm(&mut c, &r, now);
    // data2's first CHILD_SA (tunnel 1) arrives; it is not in the ring yet (tunnel 2's is
    // missing), and that CHILD_SA is not deleted.
    assert_eq!(install(&mut c, child(200, None), now), d2);
    c.handle_tick(now + Duration::from_secs(1));
    let out = c.poll_outbox();
    assert!(out.delete_children.is_empty(), "{:?}", out.delete_children);
    assert!(!c.dispatch_status(now).ring.contains(&d2));
    let t2_child = NewChild {
        tunnel: t2,
        ..child(210, None)
    };
    assert_eq!(install(&mut c, t2_child, now), d2);
    c.handle_tick(now + Duration::from_secs(2));
    assert!(c.dispatch_status(now).ring.contains(&d2));
    assert!(c.poll_outbox().delete_children.is_empty());
}

#[test]
fn a_reconnect_keeps_the_confirmed_table_and_resends_an_unanswered_one() {
    let now = Instant::now();
    let mut c = core(DispatchMode::SelfDispatch, now);
    hello(&mut c, "data1", now);
    let first = tables(&mut c);
    assert_eq!(first.len(), 1);
    // The session ends before the answer; the node comes back without restarting: the table
    // is sent again (its answer was lost with the session).
    hello(&mut c, "data1", now);
    let again = tables(&mut c);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].2, first[0].2);
    confirm(&mut c, &again, now);
    // Confirmed, then a reconnect: nothing to send, it holds it.
    hello(&mut c, "data1", now);
    assert!(tables(&mut c).is_empty());
}
