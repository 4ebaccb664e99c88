//! The life of established SAs: DELETE from either side, dead peer detection (timeout, keeping
//! alive, restart), the retransmission limit, CHILD_SA lifetimes, INITIAL_CONTACT, NAT traversal
//! (detection, keepalives, rebinding), duplicates, and snapshot/restore on another endpoint.

mod harness;
use harness::*;
use protego_ike::*;
use std::time::Duration;
use wire::ike::{ExchangeType, Message};

fn informational_requests(sent: &[(std::net::SocketAddr, std::net::SocketAddr, Vec<u8>)]) -> usize {
    sent.iter()
        .filter_map(|(_, _, d)| Message::parse(d).ok())
        .filter(|m| m.header.exchange == ExchangeType::INFORMATIONAL && !m.header.flags.response())
        .count()
}

#[test]
fn delete_from_initiator() {
    let mut p = Pair::with_tunnel(100);
    p.connect();
    p.a.ep.terminate(p.now, TunnelId(1)).expect("terminate");
    p.run_for(Duration::from_secs(5));
    assert_eq!(p.a.deleted_reasons(), vec![DeleteReason::LocalRequest]);
    assert_eq!(p.b.deleted_reasons(), vec![DeleteReason::PeerRequest]);
    assert!(p.a.children.is_empty() && p.b.children.is_empty());
    assert!(p.a.ep.status(p.now).is_empty() && p.b.ep.status(p.now).is_empty());
    assert_eq!(p.a.ep.poll_timeout(), None, "no timers left");
}

#[test]
fn delete_from_responder_and_unknown_tunnel() {
    let mut p = Pair::with_tunnel(101);
    p.connect();
    p.b.ep.terminate(p.now, TunnelId(1)).expect("terminate");
    p.run_for(Duration::from_secs(5));
    assert_eq!(p.b.deleted_reasons(), vec![DeleteReason::LocalRequest]);
    assert_eq!(p.a.deleted_reasons(), vec![DeleteReason::PeerRequest]);
    assert!(matches!(
        p.a.ep.terminate(p.now, TunnelId(9)),
        Err(Error::UnknownTunnel(_))
    ));
    assert!(matches!(
        p.a.ep.rekey_ike(p.now, TunnelId(1)),
        Err(Error::NotEstablished(_))
    ));
}

#[test]
fn remove_peer_deletes_its_sas() {
    let mut p = Pair::with_tunnel(102);
    p.connect();
    p.a.ep.remove_peer(p.now, TunnelId(1)).expect("remove");
    p.run_for(Duration::from_secs(5));
    assert!(p.a.ep.status(p.now).is_empty() && p.b.ep.status(p.now).is_empty());
    assert!(matches!(
        p.a.ep.initiate(p.now, TunnelId(1)),
        Err(Error::UnknownTunnel(_))
    ));
}

#[test]
fn dpd_timeout_clears() {
    let mut a = cfg_a();
    a.dpd_delay = Some(Duration::from_secs(10));
    let mut p = Pair::with_configs(103, a, cfg_b());
    p.connect();
    p.up = false;
    let t0 = p.now;
    assert!(p.run_until(Duration::from_secs(400), |p| !p
        .a
        .deleted_reasons()
        .is_empty()));
    assert_eq!(p.a.deleted_reasons(), vec![DeleteReason::DpdTimeout]);
    assert!(p.a.children.is_empty());
    // 10 s idle, then 4 + 7.2 + 12.96 + 23.3 + 42 + 75.6 s of retransmissions.
    let took = p.now - t0;
    assert!(
        took >= Duration::from_secs(170) && took <= Duration::from_secs(180),
        "{took:?}"
    );
    assert_eq!(
        informational_requests(&p.a.sent),
        6,
        "one DPD and five retransmissions"
    );
}

#[test]
fn dpd_keeps_a_live_tunnel() {
    let mut a = cfg_a();
    a.dpd_delay = Some(Duration::from_secs(10));
    let mut p = Pair::with_configs(104, a, cfg_b());
    p.connect();
    p.run_for(Duration::from_secs(100));
    assert!(p.a.deleted_reasons().is_empty());
    let n = informational_requests(&p.a.sent);
    assert!((9..=10).contains(&n), "one DPD per 10 s idle: {n}");
    assert_eq!(informational_requests(&p.b.sent), 0);
    // Each answered check is reported.
    let confirmed =
        p.a.events
            .iter()
            .filter(|e| matches!(e, Event::LivenessConfirmed { .. }))
            .count();
    assert_eq!(confirmed, n, "one LivenessConfirmed per answered DPD");
    // Without rekey times configured, the status schedules no rekey.
    let status = p.a.ep.status(p.now);
    assert_eq!(status[0].rekey_in_secs, None, "{status:?}");
    assert_eq!(status[0].children[0].rekey_in_secs, None, "{status:?}");
}

#[test]
fn status_says_when_sas_are_rekeyed_and_expire() {
    let mut a = cfg_a();
    a.ike_rekey_time = Duration::from_secs(3_600);
    a.child_rekey_time = Duration::from_secs(1_200);
    a.child_life_time = Duration::from_secs(1_320);
    a.rand_time = Duration::ZERO;
    let mut p = Pair::with_configs(105, a, cfg_b());
    p.connect();
    p.run_for(Duration::from_secs(100));
    let status = p.a.ep.status(p.now);
    let ike = status[0].rekey_in_secs.expect("an IKE rekey is scheduled");
    assert!((3_490..=3_500).contains(&ike), "{ike}");
    let child = &status[0].children[0];
    let rekey = child.rekey_in_secs.expect("a CHILD_SA rekey is scheduled");
    assert!((1_090..=1_100).contains(&rekey), "{rekey}");
    let expire = child.expire_in_secs.expect("a hard lifetime");
    assert!((1_210..=1_220).contains(&expire), "{expire}");
}

#[test]
fn dpd_restart_reconnects() {
    let mut a = cfg_a();
    a.dpd_delay = Some(Duration::from_secs(5));
    a.dpd_action = DpdAction::Restart;
    let mut p = Pair::with_configs(105, a, cfg_b());
    p.connect();
    p.up = false;
    assert!(p.run_until(Duration::from_secs(300), |p| !p
        .a
        .deleted_reasons()
        .is_empty()));
    p.up = true;
    assert!(p.run_until(Duration::from_secs(60), |p| p.a.established() == 2));
    p.run_for(Duration::from_secs(1));
    assert_eq!(p.a.children.len(), 1);
    // B still holds the stale SA until INITIAL_CONTACT removes it.
    assert_eq!(p.b.ep.status(p.now).len(), 1, "{:?}", p.b.ep.status(p.now));
    p.assert_children_consistent();
}

#[test]
fn retransmission_limit() {
    let mut p = Pair::with_tunnel(106);
    p.up = false;
    p.a.ep.initiate(p.now, TunnelId(1)).expect("initiate");
    let t0 = p.now;
    assert!(p.run_until(Duration::from_secs(400), |p| !p
        .a
        .deleted_reasons()
        .is_empty()));
    assert_eq!(p.a.deleted_reasons(), vec![DeleteReason::RetransmitLimit]);
    let took = (p.now - t0).as_secs_f64();
    assert!((165.0..166.0).contains(&took), "{took}");
    assert_eq!(p.a.sent.len(), 6);
    assert!(
        p.a.sent.windows(2).all(|w| w[0].2 == w[1].2),
        "retransmissions are byte-identical"
    );
}

#[test]
fn custom_retransmission_schedule() {
    let ea = EndpointConfig {
        retransmit_timeout: Duration::from_secs(1),
        retransmit_base: 2.0,
        retransmit_tries: 2,
        ..Default::default()
    };
    let mut p = Pair::new(107, ea, EndpointConfig::default());
    p.a.ep.add_peer(p.now, cfg_a()).expect("a");
    p.up = false;
    p.a.ep.initiate(p.now, TunnelId(1)).expect("initiate");
    let t0 = p.now;
    assert!(p.run_until(Duration::from_secs(60), |p| !p
        .a
        .deleted_reasons()
        .is_empty()));
    assert_eq!((p.now - t0).as_secs(), 7, "1 + 2 + 4 s");
}

#[test]
fn child_hard_lifetime_without_rekey() {
    let (mut a, mut b) = (cfg_a(), cfg_b());
    a.child_life_time = Duration::from_secs(30);
    b.child_life_time = Duration::from_secs(60);
    let mut p = Pair::with_configs(108, a, b);
    p.connect();
    p.run_for(Duration::from_secs(35));
    assert!(p.a.children.is_empty() && p.b.children.is_empty());
    assert_eq!(
        p.a.count(|e| matches!(
            e,
            Event::ChildSaDeleted {
                reason: DeleteReason::Expired,
                ..
            }
        )),
        1
    );
    assert_eq!(
        p.b.count(|e| matches!(
            e,
            Event::ChildSaDeleted {
                reason: DeleteReason::PeerRequest,
                ..
            }
        )),
        1
    );
    p.assert_one_ike_sa();
}

#[test]
fn initial_contact_replaces_stale_sa() {
    let mut p = Pair::with_tunnel(109);
    p.connect();
    let old = p.b.ep.status(p.now)[0].ike;
    // A restarts: fresh endpoint, same configuration.
    p.a = Node::new(A_ADDR, 999, EndpointConfig::default(), p.now);
    p.a.ep.add_peer(p.now, cfg_a()).expect("a");
    p.connect();
    let live = p.b.ep.status(p.now);
    assert_eq!(live.len(), 1);
    assert_ne!(live[0].ike, old);
    assert!(p.b.count(|e| matches!(e, Event::IkeSaDeleted { ike, reason: DeleteReason::PeerRequest, .. } if *ike == old)) == 1);
    p.assert_children_consistent();
}

#[test]
fn start_action_start() {
    let mut a = cfg_a();
    a.start_action = StartAction::Start;
    let mut p = Pair::with_configs(110, a, cfg_b());
    assert_eq!(p.a.ep.poll_timeout(), Some(p.now));
    assert!(
        p.run_until(Duration::from_secs(10), |p| p.a.children.len() == 1
            && p.b.children.len() == 1)
    );
}

fn nat_pair(seed: u64) -> Pair {
    let e = EndpointConfig {
        force_encap: false,
        ..Default::default()
    };
    let mut p = Pair::new(seed, e.clone(), e);
    let mut b = cfg_b();
    b.remote_addrs.clear();
    p.a.ep.add_peer(p.now, cfg_a()).expect("a");
    p.b.ep.add_peer(p.now, b).expect("b");
    p
}

#[test]
fn no_nat_no_encapsulation() {
    let mut p = nat_pair(111);
    p.connect();
    let c = p.a.children.values().next().expect("child");
    assert_eq!((c.local.port(), c.remote.port()), (500, 500));
    p.run_for(Duration::from_secs(60));
    assert!(
        p.a.sent.iter().all(|(_, _, d)| d.len() > 1),
        "no keepalives without NAT"
    );
}

#[test]
fn nat_detection_keepalives_and_rebinding() {
    let mut p = nat_pair(112);
    p.enable_nat();
    p.connect();
    let ca = p.a.children.values().next().expect("child");
    assert_eq!(ca.local.port(), 4500, "A floated to 4500 behind the NAT");
    let cb = p.b.children.values().next().expect("child");
    assert_eq!(cb.remote.ip(), NAT_ADDR);
    assert_eq!(cb.local.port(), 4500);
    let old_remote = cb.remote;
    p.run_for(Duration::from_secs(65));
    let keepalives = p.a.sent.iter().filter(|(_, _, d)| d == &[0xFF]).count();
    assert_eq!(keepalives, 3, "one per 20 s idle");
    assert!(
        p.b.sent.iter().all(|(_, _, d)| d != &[0xFF]),
        "B is not behind a NAT"
    );
    // The NAT rebinds; the next authenticated request from A updates B.
    p.rebind_nat();
    let spi = *p.a.children.keys().next().expect("child");
    p.a.ep.rekey_child(p.now, spi).expect("rekey");
    p.run_for(Duration::from_secs(5));
    let changed: Vec<_> =
        p.b.events
            .iter()
            .filter_map(|e| match e {
                Event::PeerAddressChanged { remote, .. } => Some(*remote),
                _ => None,
            })
            .collect();
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0].ip(), NAT_ADDR);
    assert_ne!(changed[0], old_remote);
    p.assert_children_consistent();
    assert_eq!(
        p.b.children.values().next().expect("child").remote,
        changed[0]
    );
}

fn address_changes(n: &Node) -> Vec<std::net::SocketAddr> {
    n.events
        .iter()
        .filter_map(|e| match e {
            Event::PeerAddressChanged { remote, .. } => Some(*remote),
            _ => None,
        })
        .collect()
}

/// The data path saw authentic ESP of a CHILD_SA from a new address (the NAT rebound while
/// only ESP flows): the IKE SA and its CHILD_SAs follow; an unknown SPI changes nothing.
#[test]
fn authenticated_esp_from_a_new_address_moves_the_sa_behind_a_nat() {
    let mut p = nat_pair(114);
    p.enable_nat();
    p.connect();
    let (&spi_b, cb) = p.b.children.iter().next().expect("child");
    let (local, old) = (cb.local, cb.remote);
    let moved = std::net::SocketAddr::new(old.ip(), old.port() + 7);
    p.b.ep.peer_address_seen(p.now, spi_b, local, moved);
    p.run_for(Duration::from_millis(1));
    assert_eq!(address_changes(&p.b), vec![moved]);
    assert_eq!(p.b.live_ike(p.now)[0].remote, moved);

    let unknown = wire::EspSpi(0x0bad_5a1d);
    assert!(!p.b.children.contains_key(&unknown));
    p.b.ep.peer_address_seen(p.now, unknown, local, old);
    p.run_for(Duration::from_millis(1));
    assert_eq!(address_changes(&p.b), vec![moved], "unknown SPI ignored");
    // The same address again is no change either.
    p.b.ep.peer_address_seen(p.now, spi_b, local, moved);
    p.run_for(Duration::from_millis(1));
    assert_eq!(address_changes(&p.b).len(), 1);
}

/// Without a NAT between the peers, an address change is never taken from ESP (RFC 7296
/// §2.23 allows dynamic updates only when a NAT was detected).
#[test]
fn esp_from_a_new_address_without_nat_changes_nothing() {
    let mut p = nat_pair(115);
    p.connect();
    let (&spi_b, cb) = p.b.children.iter().next().expect("child");
    let (local, old) = (cb.local, cb.remote);
    let elsewhere = std::net::SocketAddr::new(old.ip(), 4501);
    p.b.ep.peer_address_seen(p.now, spi_b, local, elsewhere);
    p.run_for(Duration::from_millis(1));
    assert!(address_changes(&p.b).is_empty());
    assert_eq!(p.b.live_ike(p.now)[0].remote, old);
}

#[test]
fn duplicated_datagrams_are_harmless() {
    let mut p = Pair::with_tunnel(113);
    p.link.duplicate = 1.0;
    p.connect();
    let spi = *p.a.children.keys().next().expect("child");
    p.a.ep.rekey_child(p.now, spi).expect("rekey");
    p.b.ep.rekey_ike(p.now, TunnelId(1)).expect("rekey");
    p.run_for(Duration::from_secs(30));
    p.assert_children_consistent();
    p.assert_one_ike_sa();
}

#[test]
fn snapshot_and_restore_on_another_endpoint() {
    let (mut a, mut b) = (cfg_a(), cfg_b());
    a.child_rekey_time = Duration::from_secs(100);
    b.child_rekey_time = Duration::from_secs(300);
    b.dpd_delay = Some(Duration::from_secs(30));
    let mut p = Pair::with_configs(114, a, b);
    p.connect();
    let spi = *p.a.children.keys().next().expect("child");
    p.a.ep.rekey_child(p.now, spi).expect("rekey");
    p.run_for(Duration::from_secs(10));
    let ike = p.b.ep.status(p.now)[0].ike;
    let snap = p.b.ep.snapshot(p.now, ike).expect("snapshot");
    assert!(p
        .b
        .ep
        .snapshot(
            p.now,
            IkeSpis {
                initiator: wire::IkeSpi(1),
                responder: wire::IkeSpi(2)
            }
        )
        .is_none());
    // The standby takes over B's address with the same configuration.
    let mut standby = Node::new(B_ADDR, 4242, EndpointConfig::default(), p.now);
    let mut b = cfg_b();
    b.child_rekey_time = Duration::from_secs(300);
    b.dpd_delay = Some(Duration::from_secs(30));
    standby.ep.add_peer(p.now, b).expect("b");
    assert_eq!(standby.ep.restore(p.now, &snap).expect("restore"), ike);
    assert!(matches!(
        standby.ep.restore(p.now, &snap),
        Err(Error::DuplicateSa(_))
    ));
    assert!(standby.ep.restore(p.now, &snap[..snap.len() - 1]).is_err());
    assert!(standby.ep.restore(p.now, b"junk").is_err());
    standby.take_data_path(&mut p.b);
    p.b = standby;
    let before = p.b.ep.status(p.now);
    assert_eq!(before[0].children.len(), 1);
    // Rekeys in both directions and DPD keep working across the takeover.
    p.run_for(Duration::from_secs(250));
    assert!(p.a.count(|e| matches!(e, Event::ChildSaInstalled(_))) >= 3);
    p.b.ep.rekey_ike(p.now, TunnelId(1)).expect("rekey ike");
    p.run_for(Duration::from_secs(10));
    p.assert_one_ike_sa();
    p.assert_children_consistent();
    assert!(p
        .a
        .deleted_reasons()
        .iter()
        .all(|r| *r == DeleteReason::Rekeyed));
}

#[test]
fn snapshot_with_outstanding_request() {
    let mut p = Pair::with_tunnel(115);
    p.connect();
    let ike = p.a.ep.status(p.now)[0].ike;
    p.up = false;
    p.a.ep.terminate(p.now, TunnelId(1)).expect("terminate");
    p.run_for(Duration::from_secs(1));
    let snap = p.a.ep.snapshot(p.now, ike).expect("snapshot");
    let mut standby = Node::new(A_ADDR, 77, EndpointConfig::default(), p.now);
    standby.ep.add_peer(p.now, cfg_a()).expect("a");
    standby.ep.restore(p.now, &snap).expect("restore");
    standby.children = std::mem::take(&mut p.a.children);
    p.a = standby;
    p.up = true;
    // The restored node retransmits the DELETE and finishes it.
    p.run_for(Duration::from_secs(10));
    assert_eq!(p.a.deleted_reasons(), vec![DeleteReason::LocalRequest]);
    assert_eq!(p.b.deleted_reasons(), vec![DeleteReason::PeerRequest]);
}

#[test]
fn delete_into_a_dead_link_with_timers_armed() {
    let (mut a, mut b) = (cfg_a(), cfg_b());
    for c in [&mut a, &mut b] {
        c.dpd_delay = Some(Duration::from_secs(5));
        c.ike_rekey_time = Duration::from_secs(20);
        c.child_rekey_time = Duration::from_secs(10);
        c.child_life_time = Duration::from_secs(15);
    }
    let mut p = nat_pair(116);
    p.a.ep.remove_peer(p.now, TunnelId(1)).expect("remove");
    p.a.ep.add_peer(p.now, a).expect("a");
    p.enable_nat();
    p.connect();
    p.up = false;
    p.a.ep.terminate(p.now, TunnelId(1)).expect("terminate");
    // Every timer of the deleting SA comes due while the DELETE is retransmitted.
    assert!(p.run_until(Duration::from_secs(400), |p| p
        .a
        .ep
        .status(p.now)
        .is_empty()));
    assert_eq!(p.a.deleted_reasons(), vec![DeleteReason::LocalRequest]);
    assert!(p.a.ep.poll_timeout().is_none());
}

/// Drains B's state changes as a control node's store would see them.
fn changes(node: &mut Node, now: std::time::Instant) -> Vec<StateChange> {
    node.ep.take_state_changes(now)
}

#[test]
fn state_changes_follow_what_a_restart_needs() {
    let mut p = Pair::with_tunnel(117);
    p.b.ep.track_state_changes();
    p.connect();
    let ike = p.b.ep.status(p.now)[0].ike;
    // A does not track: it keeps no record of its changes.
    assert!(changes(&mut p.a, p.now).is_empty());
    let c = changes(&mut p.b, p.now);
    assert_eq!(c.len(), 1, "{c:?}");
    let StateChange::Saved { spi, ike: spis, .. } = &c[0] else {
        panic!("{c:?}");
    };
    assert_eq!((*spis, *spi), (ike, ike.responder));
    // Nothing happened: nothing to write, also after time passes without an exchange.
    assert!(changes(&mut p.b, p.now).is_empty());
    p.run_for(Duration::from_secs(10));
    assert!(changes(&mut p.b, p.now).is_empty());
    // A forged request for the SA (A's IKE_AUTH under the next message ID, ICV broken) reaches
    // the SA, fails its integrity check and changes nothing.
    let (to, from, auth) = p.a.sent.last().expect("sent").clone();
    let mut forged = auth;
    forged[20..24].copy_from_slice(&2u32.to_be_bytes());
    let n = forged.len();
    forged[n - 1] ^= 1;
    let dropped = p.b.ep.stats().total();
    p.b.ep.handle_datagram(p.now, from, to, &forged);
    assert_eq!(
        p.b.ep.stats().total(),
        dropped + 1,
        "the forgery was dropped"
    );
    assert!(changes(&mut p.b, p.now).is_empty());
    // A CHILD_SA rekey changes the state (message IDs, CHILD_SAs): written once, at the end.
    let spi_in = *p.a.children.keys().next().expect("child");
    p.a.ep.rekey_child(p.now, spi_in).expect("rekey");
    p.run_for(Duration::from_secs(5));
    let c = changes(&mut p.b, p.now);
    assert_eq!(c.len(), 1, "{c:?}");
    assert!(matches!(&c[0], StateChange::Saved { spi, .. } if *spi == ike.responder));
    // An IKE_SA_INIT that never completes (half-open) is never written.
    let mut half = Pair::with_tunnel(118);
    half.up = false;
    half.a.ep.initiate(half.now, TunnelId(1)).expect("initiate");
    half.run_for(Duration::from_secs(1));
    let init = half.a.sent[0].2.clone();
    p.b.ep
        .handle_datagram(p.now, p.b.sent[0].0, p.b.sent[0].1, &init);
    assert!(changes(&mut p.b, p.now).is_empty());
    // Deleted: removed from the store.
    p.a.ep.terminate(p.now, TunnelId(1)).expect("terminate");
    p.run_for(Duration::from_secs(5));
    let c = changes(&mut p.b, p.now);
    assert!(
        matches!(c.as_slice(), [StateChange::Removed { spi }] if *spi == ike.responder),
        "{c:?}"
    );
}

#[test]
fn a_restore_after_a_long_outage_runs_the_timers_that_fell_due() {
    let (mut a, mut b) = (cfg_a(), cfg_b());
    a.child_rekey_time = Duration::from_secs(3600);
    b.child_rekey_time = Duration::from_secs(100);
    let mut p = Pair::with_configs(119, a, b);
    p.b.ep.track_state_changes();
    p.connect();
    let saved = match changes(&mut p.b, p.now).pop() {
        Some(StateChange::Saved { snapshot, .. }) => snapshot,
        other => panic!("{other:?}"),
    };
    let installs = p.a.count(|e| matches!(e, Event::ChildSaInstalled(_)));
    // B comes back 150 s after it wrote its state: the 100 s CHILD_SA rekey is overdue.
    let mut standby = Node::new(B_ADDR, 4343, EndpointConfig::default(), p.now);
    standby.ep.track_state_changes();
    let mut b = cfg_b();
    b.child_rekey_time = Duration::from_secs(100);
    standby.ep.add_peer(p.now, b).expect("b");
    standby
        .ep
        .restore_aged(p.now, &saved, Duration::from_secs(150))
        .expect("restore");
    // The restored state counts as written.
    assert!(changes(&mut standby, p.now).is_empty());
    standby.take_data_path(&mut p.b);
    p.b = standby;
    assert!(
        p.run_until(Duration::from_secs(5), |p| {
            p.a.count(|e| matches!(e, Event::ChildSaInstalled(_))) > installs
        }),
        "the overdue rekey did not run at once"
    );
    p.run_for(Duration::from_secs(5));
    p.assert_children_consistent();
    p.assert_one_ike_sa();
}
