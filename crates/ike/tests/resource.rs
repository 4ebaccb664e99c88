//! Per-resource CHILD_SAs (RFC 9611, issue 19 §2) between two engines: every new CHILD_SA
//! (IKE_AUTH's first one included) is offered with SA_RESOURCE_INFO and answered with it while
//! the responder's `resource_sas` allows, then refused with TS_MAX_QUEUE; rekeys carry no
//! SA_RESOURCE_INFO and keep the flag; a side with `resource_sas = 0` neither offers nor
//! answers, so its CHILD_SAs are plain parallel ones (RFC 7296 §1.3.1). The messages are read
//! on the wire (opened with the key log's keys), not only through the engines' own view.

mod harness;
use harness::*;
use protego_ike::*;
use std::time::Duration;
use wire::ike::{find_notify, parse_chain, ExchangeType, NotifyType, Payload};
use wire::EspSpi;

/// Per CHILD_SA of `n` (inbound SPI), whether it is a per-resource one.
fn flags(n: &Node, p: &Pair) -> Vec<(EspSpi, bool)> {
    let mut v: Vec<(EspSpi, bool)> =
        n.ep.status(p.now)
            .iter()
            .flat_map(|s| s.children.iter().map(|c| (c.inbound_spi, c.per_resource)))
            .collect();
    v.sort_unstable_by_key(|(s, _)| s.0);
    v
}

fn refusals(n: &Node) -> Vec<NotifyType> {
    n.events
        .iter()
        .filter_map(|e| match e {
            Event::ChildSaRefused { notify, .. } => Some(*notify),
            _ => None,
        })
        .collect()
}

/// A pair with the given `resource_sas` on each side, connected, and A's IKE keys.
fn connected(seed: u64, a_max: u32, b_max: u32) -> (Pair, SkKeys) {
    connected_with_keys(seed, |a, b| {
        a.resource_sas = a_max;
        b.resource_sas = b_max;
    })
}

/// Every IKE_AUTH or CREATE_CHILD_SA message `sent` holds (opened with `cipher`), as
/// (exchange, is a rekey, carries SA_RESOURCE_INFO, error notify if any), in order.
fn child_messages(
    sent: &[(std::net::SocketAddr, std::net::SocketAddr, Vec<u8>)],
    cipher: &crypto::SaCipher,
) -> Vec<(ExchangeType, bool, bool, Option<NotifyType>)> {
    sent.iter()
        .filter_map(|(_, _, d)| open(cipher, d))
        .filter(|(h, _, _)| {
            h.exchange == ExchangeType::IKE_AUTH || h.exchange == ExchangeType::CREATE_CHILD_SA
        })
        .map(|(h, first, inner)| {
            let (payloads, _) = parse_chain(first, &inner, 0, false).expect("inner chain");
            let error = payloads.iter().find_map(|p| match p {
                Payload::Notify(n) if n.ty.is_error() => Some(n.ty),
                _ => None,
            });
            (
                h.exchange,
                find_notify(&payloads, NotifyType::REKEY_SA).is_some(),
                find_notify(&payloads, NotifyType::SA_RESOURCE_INFO).is_some(),
                error,
            )
        })
        .collect()
}

#[test]
fn per_resource_children_are_negotiated_up_to_the_responders_limit() {
    let (mut p, keys) = connected(900, DEFAULT_RESOURCE_SAS, 3);
    let t = TunnelId(1);
    // IKE_AUTH's CHILD_SA is the first of the group on both sides.
    assert_eq!(flags(&p.a, &p).len(), 1);
    assert!(flags(&p.a, &p).iter().all(|(_, r)| *r));
    assert!(flags(&p.b, &p).iter().all(|(_, r)| *r));

    // Two more: within B's limit of three, per-resource on both sides.
    for _ in 0..2 {
        p.a.ep.add_child(p.now, t).expect("add");
    }
    p.run_for(Duration::from_secs(5));
    p.assert_children_consistent();
    assert_eq!(p.a.children.len(), 3);
    assert!(
        flags(&p.a, &p).iter().all(|(_, r)| *r),
        "{:?}",
        flags(&p.a, &p)
    );
    assert!(
        flags(&p.b, &p).iter().all(|(_, r)| *r),
        "{:?}",
        flags(&p.b, &p)
    );
    assert!(refusals(&p.a).is_empty());

    // A fourth: TS_MAX_QUEUE, nothing installed on either side, A's driver told.
    p.a.ep.add_child(p.now, t).expect("add");
    p.run_for(Duration::from_secs(5));
    p.assert_children_consistent();
    assert_eq!(p.a.children.len(), 3);
    assert_eq!(p.b.children.len(), 3);
    assert_eq!(refusals(&p.a), vec![NotifyType::TS_MAX_QUEUE]);
    assert!(NotifyType::TS_MAX_QUEUE.no_more_children());

    // A rekey keeps the flag (and the count: it is no fifth).
    let rekeyed = flags(&p.a, &p)[1].0;
    p.a.ep.rekey_child(p.now, rekeyed).expect("rekey");
    p.run_for(Duration::from_secs(5));
    p.assert_children_consistent();
    let after = flags(&p.a, &p);
    assert_eq!(after.len(), 3);
    assert!(!after.iter().any(|(s, _)| *s == rekeyed));
    assert!(after.iter().all(|(_, r)| *r), "{after:?}");
    assert!(flags(&p.b, &p).iter().all(|(_, r)| *r));

    // On the wire: A offered SA_RESOURCE_INFO in IKE_AUTH and each new CREATE_CHILD_SA, not in
    // the rekey; B answered it for the accepted ones and TS_MAX_QUEUE without it for the fourth.
    let from_a = child_messages(&p.a.sent, &keys.initiator);
    let from_b = child_messages(&p.b.sent, &keys.responder);
    let expect_a = vec![
        (ExchangeType::IKE_AUTH, false, true, None),
        (ExchangeType::CREATE_CHILD_SA, false, true, None),
        (ExchangeType::CREATE_CHILD_SA, false, true, None),
        (ExchangeType::CREATE_CHILD_SA, false, true, None),
        (ExchangeType::CREATE_CHILD_SA, true, false, None),
    ];
    assert_eq!(from_a, expect_a);
    let expect_b = vec![
        (ExchangeType::IKE_AUTH, false, true, None),
        (ExchangeType::CREATE_CHILD_SA, false, true, None),
        (ExchangeType::CREATE_CHILD_SA, false, true, None),
        (
            ExchangeType::CREATE_CHILD_SA,
            false,
            false,
            Some(NotifyType::TS_MAX_QUEUE),
        ),
        (ExchangeType::CREATE_CHILD_SA, false, false, None),
    ];
    assert_eq!(from_b, expect_b);

    // One deleted (not the one A sends on): B takes another.
    let sending = p.a.sending_child(t).expect("sending").inbound_spi;
    let gone = after
        .iter()
        .map(|(s, _)| *s)
        .find(|s| *s != sending)
        .expect("another");
    p.a.ep.delete_child(p.now, gone).expect("delete");
    p.run_for(Duration::from_secs(5));
    p.a.ep.add_child(p.now, t).expect("add");
    p.run_for(Duration::from_secs(5));
    p.assert_children_consistent();
    assert_eq!(p.a.children.len(), 3);
    assert!(flags(&p.a, &p).iter().all(|(_, r)| *r));
    assert_eq!(refusals(&p.a).len(), 1, "no new refusal");
    p.assert_sending_decryptable();
}

#[test]
fn the_responders_limit_counts_the_children_the_peer_asked_for_too() {
    // B (the IKE responder) asks for CHILD_SAs of its own: A's limit applies to them, and A's
    // answer is TS_MAX_QUEUE once A holds two.
    let (mut p, _) = connected(901, 2, DEFAULT_RESOURCE_SAS);
    let t = TunnelId(1);
    for _ in 0..2 {
        p.b.ep.add_child(p.now, t).expect("add");
    }
    p.run_for(Duration::from_secs(5));
    p.assert_children_consistent();
    assert_eq!(p.b.children.len(), 2);
    assert_eq!(refusals(&p.b), vec![NotifyType::TS_MAX_QUEUE]);
    assert!(refusals(&p.a).is_empty());
}

#[test]
fn without_rfc_9611_on_either_side_children_are_plain_and_unlimited() {
    for (seed, a_max, b_max) in [
        (902, 0, DEFAULT_RESOURCE_SAS),
        (903, DEFAULT_RESOURCE_SAS, 0),
    ] {
        let (mut p, keys) = connected(seed, a_max, b_max);
        for _ in 0..4 {
            p.a.ep.add_child(p.now, TunnelId(1)).expect("add");
        }
        p.run_for(Duration::from_secs(5));
        p.assert_children_consistent();
        assert_eq!(p.a.children.len(), 5, "seed {seed}");
        assert!(flags(&p.a, &p).iter().all(|(_, r)| !*r), "seed {seed}");
        assert!(flags(&p.b, &p).iter().all(|(_, r)| !*r), "seed {seed}");
        assert!(refusals(&p.a).is_empty());
        // The side that allows it offers (A) or would answer (B); the other never answers.
        let from_a = child_messages(&p.a.sent, &keys.initiator);
        let from_b = child_messages(&p.b.sent, &keys.responder);
        assert!(
            from_a.iter().all(|m| m.2 == (a_max > 0)),
            "seed {seed}: {from_a:?}"
        );
        assert!(from_b.iter().all(|m| !m.2), "seed {seed}: {from_b:?}");
    }
}

#[test]
fn the_flag_survives_a_snapshot_and_restore() {
    let (mut p, _) = connected(904, DEFAULT_RESOURCE_SAS, 2);
    // A snapshot of the format before RFC 9611 (version 2: no flag after each CHILD_SA; here
    // the one CHILD_SA ends the record) is still restored, its CHILD_SA a plain one.
    let ike = p.b.live_ike(p.now)[0].ike;
    let mut old = p.b.ep.snapshot(p.now, ike).expect("snapshot");
    assert_eq!(
        (old[4], old.last()),
        (3, Some(&1)),
        "version 3, per-resource"
    );
    old[4] = 2;
    old.pop();
    let mut older = Node::new(B_ADDR, 80, EndpointConfig::default(), p.now);
    older.ep.add_peer(p.now, cfg_b()).expect("b");
    older.ep.restore(p.now, &old).expect("restore version 2");
    assert_eq!(flags(&older, &p).len(), 1);
    assert!(flags(&older, &p).iter().all(|(_, r)| !*r));

    p.a.ep.add_child(p.now, TunnelId(1)).expect("add");
    p.run_for(Duration::from_secs(5));
    assert_eq!(p.a.children.len(), 2);
    // B restored on a standby from its snapshot: it still counts both towards its limit.
    let ike = p.b.live_ike(p.now)[0].ike;
    let snap = p.b.ep.snapshot(p.now, ike).expect("snapshot");
    let mut standby = Node::new(B_ADDR, 79, EndpointConfig::default(), p.now);
    let mut b = cfg_b();
    b.resource_sas = 2;
    standby.ep.add_peer(p.now, b).expect("b");
    standby.ep.restore(p.now, &snap).expect("restore");
    standby.take_data_path(&mut p.b);
    p.b = standby;
    assert!(
        flags(&p.b, &p).iter().all(|(_, r)| *r),
        "{:?}",
        flags(&p.b, &p)
    );
    p.a.ep.add_child(p.now, TunnelId(1)).expect("add");
    p.run_for(Duration::from_secs(5));
    assert_eq!(p.a.children.len(), 2);
    assert_eq!(refusals(&p.a), vec![NotifyType::TS_MAX_QUEUE]);
}
