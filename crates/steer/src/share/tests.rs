//! Division of a tunnel's limit among steer nodes: water-filling exactly, and simulated report
//! rounds for a skewed ECMP split, a node dying and a node joining.

use super::*;
use proptest::prelude::*;

const T: TunnelId = TunnelId(7);
const A: NodeId = NodeId(1);
const B: NodeId = NodeId(2);
const SECOND: Duration = Duration::from_secs(1);
const MBIT: u64 = 1_000_000;

/// Outbound-only usage of one second at `admitted` and `dropped` bit/s.
fn outbound(admitted: u64, dropped: u64) -> TunnelUsage {
    TunnelUsage {
        inbound: Usage::default(),
        outbound: Usage {
            admitted_bytes: admitted / 8,
            dropped_bytes: dropped / 8,
        },
    }
}

/// Outbound shares of `limit`, per node.
fn out_shares(s: &RateShares, limit: u64) -> BTreeMap<NodeId, u64> {
    s.shares(T, limit)
        .into_iter()
        .map(|(n, l)| (n, l.outbound.bits_per_second))
        .collect()
}

/// One report round of constant-rate (UDP-like) senders: each node admits what its current
/// share lets through of what it is offered, and reports it. Returns what each admitted.
fn udp_round(s: &mut RateShares, limit: u64, offered: &[(NodeId, u64)]) -> BTreeMap<NodeId, u64> {
    let shares = out_shares(s, limit);
    let mut admitted = BTreeMap::new();
    for &(node, offer) in offered {
        let a = offer.min(shares[&node]);
        assert!(s.handle_report(node, SECOND, [(T, outbound(a, offer - a))]));
        admitted.insert(node, a);
    }
    admitted
}

/// One report round of elastic (TCP-like) senders that always want more than they get: each
/// node carries its whole share and drops a tenth more.
fn tcp_round(s: &mut RateShares, limit: u64, nodes: &[NodeId]) -> BTreeMap<NodeId, u64> {
    let shares = out_shares(s, limit);
    for &node in nodes {
        let a = shares[&node];
        assert!(s.handle_report(node, SECOND, [(T, outbound(a, a / 10))]));
    }
    shares
}

fn total(m: &BTreeMap<NodeId, u64>) -> u64 {
    m.values().sum()
}

#[test]
fn divide_fills_small_wants_first_and_spreads_the_rest_by_want() {
    // 10 wants little: it gets it; the other two split the rest equally.
    assert_eq!(divide(100, &[60, 10, 90]), vec![45, 10, 45]);
    // Everyone satisfied: 40 left over, given by want (10:30).
    assert_eq!(divide(80, &[10, 30]), vec![20, 60]);
    // Nobody wants anything: equal parts.
    assert_eq!(divide(9, &[0, 0, 0]), vec![3, 3, 3]);
    assert_eq!(divide(5, &[]), Vec::<u64>::new());
    assert_eq!(divide(u64::MAX, &[u64::MAX, 1]), vec![u64::MAX - 1, 1]);
}

proptest! {
    #[test]
    fn divide_never_hands_out_more_than_the_total_and_is_max_min_fair(
        total in 0u64..=u64::MAX,
        wants in prop::collection::vec(0u64..=u64::MAX, 0..8),
    ) {
        let out = divide(total, &wants);
        prop_assert_eq!(out.len(), wants.len());
        let sum: u128 = out.iter().map(|&x| u128::from(x)).sum();
        prop_assert!(sum <= u128::from(total));
        if !wants.is_empty() {
            let fair = total / wants.len() as u64;
            for (o, w) in out.iter().zip(&wants) {
                prop_assert!(*o >= (*w).min(fair), "{o} < min({w}, {fair})");
            }
        }
    }
}

#[test]
fn burst_is_twenty_milliseconds_at_the_rate_and_at_least_two_iperf_writes() {
    assert_eq!(burst_bytes(200 * MBIT), 500_000);
    assert_eq!(burst_bytes(MBIT), MIN_BURST_BYTES);
    assert_eq!(burst_bytes(0), MIN_BURST_BYTES);
}

#[test]
fn a_single_steer_node_gets_the_whole_limit_both_ways() {
    let mut s = RateShares::default();
    assert!(s.shares(T, 200 * MBIT).is_empty(), "no node, no shares");
    s.add_node(A);
    let whole = TunnelLimit::from(RateLimit::new(200 * MBIT, burst_bytes(200 * MBIT)));
    assert_eq!(s.shares(T, 200 * MBIT), vec![(A, whole)]);
    // Whatever it reports.
    assert!(s.handle_report(A, SECOND, [(T, outbound(MBIT, 0))]));
    assert_eq!(s.share(A, T, 200 * MBIT), Some(whole));
}

#[test]
fn skewed_ecmp_split_ninety_ten_of_constant_streams_gives_the_limit_not_twice_it() {
    // 100 Mbit/s limit; the router sends 180 Mbit/s to A and 20 Mbit/s to B.
    let limit = 100 * MBIT;
    let mut s = RateShares::default();
    s.add_node(A);
    s.add_node(B);
    let first = out_shares(&s, limit);
    assert_eq!(
        first,
        [(A, 50 * MBIT), (B, 50 * MBIT)].into(),
        "equal until reports"
    );
    let mut admitted = BTreeMap::new();
    for _ in 0..5 {
        admitted = udp_round(&mut s, limit, &[(A, 180 * MBIT), (B, 20 * MBIT)]);
        assert!(total(&out_shares(&s, limit)) <= limit);
    }
    let shares = out_shares(&s, limit);
    // B keeps its 20 Mbit/s with headroom; A takes the rest; together about the limit.
    assert_eq!(shares[&B], 25 * MBIT, "{shares:?}");
    assert_eq!(shares[&A], 75 * MBIT, "{shares:?}");
    assert_eq!(admitted[&B], 20 * MBIT);
    let carried = total(&admitted);
    assert!(
        carried >= 90 * MBIT && carried <= limit,
        "carried {carried} of a limit of {limit}: {admitted:?}"
    );
    // Inbound carried nothing at either node: equal halves (nobody asks for more).
    let inbound: Vec<u64> = s
        .shares(T, limit)
        .iter()
        .map(|(_, l)| l.inbound.bits_per_second)
        .collect();
    assert_eq!(inbound, [50 * MBIT, 50 * MBIT]);
}

#[test]
fn elastic_flows_on_both_nodes_split_the_limit_equally_whatever_the_flow_split() {
    // Nine flows on A, one on B: both nodes are held back by their shares, so each asks
    // for more; the fair level is half each.
    let limit = 200 * MBIT;
    let mut s = RateShares::default();
    s.add_node(A);
    s.add_node(B);
    for _ in 0..4 {
        tcp_round(&mut s, limit, &[A, B]);
    }
    assert_eq!(
        out_shares(&s, limit),
        [(A, 100 * MBIT), (B, 100 * MBIT)].into()
    );
}

#[test]
fn a_starved_node_grows_back_to_its_fair_share_within_a_few_reports() {
    // B carried nothing for a while (its share sank to the floor); then the router moves
    // half the flows to it.
    let limit = 200 * MBIT;
    let mut s = RateShares::default();
    s.add_node(A);
    s.add_node(B);
    for _ in 0..10 {
        udp_round(&mut s, limit, &[(A, 400 * MBIT), (B, 0)]);
    }
    let low = out_shares(&s, limit);
    let floor = limit / 2 / 10;
    assert_eq!(low[&B], floor, "the floor: 10 % of an equal share");
    assert_eq!(low[&A], limit - floor);
    let mut rounds = 0;
    while out_shares(&s, limit)[&B] < limit / 2 {
        tcp_round(&mut s, limit, &[A, B]);
        rounds += 1;
        assert!(rounds <= 5, "B still starved: {:?}", out_shares(&s, limit));
    }
    assert_eq!(
        out_shares(&s, limit),
        [(A, limit / 2), (B, limit / 2)].into()
    );
}

#[test]
fn a_dead_nodes_share_moves_to_the_others() {
    let limit = 200 * MBIT;
    let mut s = RateShares::default();
    for n in [A, B, NodeId(3)] {
        s.add_node(n);
    }
    for _ in 0..3 {
        tcp_round(&mut s, limit, &[A, B, NodeId(3)]);
    }
    assert!(total(&out_shares(&s, limit)) <= limit);
    assert!(s.remove_node(NodeId(3)));
    assert!(!s.remove_node(NodeId(3)), "already gone");
    assert!(
        !s.handle_report(NodeId(3), SECOND, [(T, outbound(MBIT, 0))]),
        "a dead node's late report is ignored"
    );
    assert_eq!(
        out_shares(&s, limit),
        [(A, limit / 2), (B, limit / 2)].into()
    );
    assert!(s.remove_node(B));
    let whole = s.share(A, T, limit).expect("A is live");
    assert_eq!(whole.inbound.bits_per_second, limit);
    assert_eq!(whole.outbound.bits_per_second, limit);
    assert_eq!(s.share(B, T, limit), None);
}

#[test]
fn a_joining_node_starts_at_an_equal_share_then_follows_its_reports() {
    let limit = 100 * MBIT;
    let mut s = RateShares::default();
    s.add_node(A);
    tcp_round(&mut s, limit, &[A]);
    assert_eq!(out_shares(&s, limit)[&A], limit);
    s.add_node(B);
    assert_eq!(
        out_shares(&s, limit),
        [(A, limit / 2), (B, limit / 2)].into(),
        "the newcomer has not reported yet"
    );
    assert_eq!(s.demand(B, T, Direction::Outbound), None);
    // It sees a trickle: the floor covers it and A takes the rest.
    assert!(s.handle_report(B, SECOND, [(T, outbound(MBIT, 0))]));
    assert_eq!(s.demand(B, T, Direction::Outbound), Some(MBIT));
    let shares = out_shares(&s, limit);
    assert_eq!(shares[&B], limit / 2 / 10);
    assert_eq!(shares[&A], limit - limit / 2 / 10);
    // A node starting over (it reconnected) is a newcomer again.
    s.add_node(B);
    assert_eq!(out_shares(&s, limit)[&B], limit / 2);
}

#[test]
fn demand_rises_at_once_and_falls_by_half_per_report() {
    let mut s = RateShares::default();
    s.add_node(A);
    assert!(s.handle_report(A, SECOND, [(T, outbound(80 * MBIT, 0))]));
    assert_eq!(s.demand(A, T, Direction::Outbound), Some(80 * MBIT));
    assert_eq!(s.demand(A, T, Direction::Inbound), Some(0));
    // Not mentioned: carried nothing.
    assert!(s.handle_report(A, SECOND, []));
    assert_eq!(s.demand(A, T, Direction::Outbound), Some(40 * MBIT));
    // Drops: at least twice what was admitted (here more than the offered 15).
    assert!(s.handle_report(A, SECOND / 2, [(T, outbound(5 * MBIT, 2_500_000))]));
    assert_eq!(s.demand(A, T, Direction::Outbound), Some(40 * MBIT / 2));
    assert!(s.handle_report(A, SECOND / 2, [(T, outbound(10 * MBIT, 2_500_000))]));
    // 10 Mbit in half a second admitted: 20 Mbit/s, twice that is 40.
    assert_eq!(s.demand(A, T, Direction::Outbound), Some(40 * MBIT));
    assert!(
        !s.handle_report(A, Duration::ZERO, []),
        "no interval, no rate"
    );
    assert!(!s.handle_report(B, SECOND, []), "B is not live");
}

/// A fixed instant the rounds below count from.
fn t0() -> Instant {
    Instant::now()
}

/// Confirms every share of `batches`.
fn confirm_all(s: &mut RateShares, batches: &[ShareBatch]) {
    for (node, list) in batches {
        for &(tunnel, share) in list {
            s.confirm(*node, tunnel, share);
        }
    }
}

/// The outbound share sent to each node in `batches`.
fn sent_out(batches: &[ShareBatch]) -> BTreeMap<NodeId, u64> {
    batches
        .iter()
        .filter_map(|(n, list)| {
            let (_, s) = list.iter().find(|(t, _)| *t == T)?;
            Some((*n, s.limit.outbound.bits_per_second))
        })
        .collect()
}

#[test]
fn a_lost_nodes_share_stays_reserved_for_its_grace_then_only_its_fallback() {
    let limit = 200 * MBIT;
    let now = t0();
    let grace = ShareConfig::default().lost_grace;
    let mut s = RateShares::default();
    s.add_node(A);
    s.add_node(B);
    let first = s.update(&[(T, limit)], now);
    assert_eq!(sent_out(&first), [(A, limit / 2), (B, limit / 2)].into());
    confirm_all(&mut s, &first);
    // B's session ends; it may still forward with its half: A gets nothing more yet.
    assert!(s.node_lost(B, now));
    assert!(!s.node_lost(B, now), "already lost");
    assert_eq!(s.nodes().collect::<Vec<_>>(), vec![A]);
    assert!(s.update(&[(T, limit)], now).is_empty());
    assert!(s.update(&[(T, limit)], now + grace / 2).is_empty());
    assert_eq!(s.committed(T, now + grace / 2), [limit, limit]);
    // After the grace B holds at most its fallback (the floor: 10 % of an equal share,
    // which it was sent with its share); A gets the rest.
    let fallback = limit / 2 / 10;
    assert_eq!(s.sent(B, T).unwrap().fallback_bits_per_second, fallback);
    let after = s.update(&[(T, limit)], now + grace);
    assert_eq!(sent_out(&after), [(A, limit - fallback)].into());
    assert_eq!(s.committed(T, now + grace), [limit, limit]);
    // B comes back: it starts at an equal share once A confirmed giving it up.
    s.add_node(B);
    confirm_all(&mut s, &after);
    let back = s.update(&[(T, limit)], now + grace);
    assert!(s.committed(T, now + grace)[1] <= limit);
    assert_eq!(back[0].0, A, "the lowered share goes first: {back:?}");
    confirm_all(&mut s, &back);
    let grown = s.update(&[(T, limit)], now + grace);
    assert_eq!(sent_out(&grown), [(B, limit / 2)].into());
    assert_eq!(s.committed(T, now + grace), [limit, limit]);
}

#[test]
fn growth_waits_until_the_lowered_shares_are_confirmed() {
    let limit = 100 * MBIT;
    let now = t0();
    let mut s = RateShares::default();
    s.add_node(A);
    let alone = s.update(&[(T, limit)], now);
    assert_eq!(sent_out(&alone), [(A, limit)].into());
    confirm_all(&mut s, &alone);
    // B joins (after a control takeover, or a new node): A is cut to half, but until it
    // confirms, B can only get what nobody may hold (nothing: 1 bit/s, since a share of 0
    // has no encoding).
    s.add_node(B);
    let join = s.update(&[(T, limit)], now);
    assert_eq!(sent_out(&join), [(A, limit / 2), (B, 1)].into());
    assert_eq!(join[0].0, A, "the lowered share goes first");
    assert_eq!(s.committed(T, now), [limit + 1, limit + 1]);
    assert!(s.update(&[(T, limit)], now).is_empty(), "nothing free yet");
    confirm_all(&mut s, &join);
    let grown = s.update(&[(T, limit)], now);
    assert_eq!(sent_out(&grown), [(B, limit / 2)].into());
    assert_eq!(s.committed(T, now), [limit, limit]);
}

#[test]
fn small_moves_send_nothing_but_a_dropping_node_grows_at_once() {
    let limit = 200 * MBIT;
    let now = t0();
    let mut s = RateShares::default();
    s.add_node(A);
    s.add_node(B);
    let first = s.update(&[(T, limit)], now);
    confirm_all(&mut s, &first);
    // Both carry about 60 Mbit/s without drops: targets are 75 / 125 and then wobble by a
    // few percent from report to report; no directive for that.
    assert!(s.handle_report(A, SECOND, [(T, outbound(60 * MBIT, 0))]));
    assert!(s.handle_report(B, SECOND, [(T, outbound(60 * MBIT, 0))]));
    let settle = s.update(&[(T, limit)], now);
    confirm_all(&mut s, &settle);
    assert_eq!(
        s.update(&[(T, limit)], now),
        vec![],
        "the same reports again: nothing"
    );
    for mbit in [62, 58, 63, 60] {
        assert!(s.handle_report(A, SECOND, [(T, outbound(mbit * MBIT, 0))]));
        assert!(s.handle_report(B, SECOND, [(T, outbound(60 * MBIT, 0))]));
        assert_eq!(
            s.update(&[(T, limit)], now),
            vec![],
            "a {mbit} Mbit/s wobble is within the hysteresis"
        );
    }
    // A starts dropping: its share grows even by a little.
    let held = s.sent(A, T).unwrap().limit.outbound.bits_per_second;
    assert!(s.handle_report(A, SECOND, [(T, outbound(held / 8 * 8, MBIT))]));
    assert!(s.handle_report(B, SECOND, [(T, outbound(60 * MBIT, 0))]));
    // B is cut first (its demand did not change, A's did); A grows once B confirmed.
    let cut_b = s.update(&[(T, limit)], now);
    assert!(sent_out(&cut_b)[&B] < limit / 2, "{cut_b:?}");
    assert!(!sent_out(&cut_b).contains_key(&A), "{cut_b:?}");
    confirm_all(&mut s, &cut_b);
    let grown = s.update(&[(T, limit)], now);
    assert!(sent_out(&grown)[&A] > held, "{grown:?}");
    // A's flows leave: its estimate halves per report, and once its share moves by more
    // than 10 % it is sent, without any drops.
    confirm_all(&mut s, &grown);
    let grown_to = sent_out(&grown)[&A];
    for _ in 0..3 {
        assert!(s.handle_report(A, SECOND, [(T, outbound(MBIT, 0))]));
        assert!(s.handle_report(B, SECOND, [(T, outbound(60 * MBIT, 0))]));
    }
    let cut = s.update(&[(T, limit)], now);
    assert!(sent_out(&cut)[&A] < grown_to * 9 / 10, "{cut:?}");
}

#[test]
fn newcomers_and_old_steer_nodes_get_an_equal_share_never_more() {
    let limit = 300 * MBIT;
    let now = t0();
    let mut s = RateShares::default();
    for n in [A, B, NodeId(3)] {
        s.add_node(n);
    }
    // A reported a trickle; B has not reported; node 3 reports without an interval (an old
    // steer node). A, the only one that can use it, takes what is left over.
    assert!(s.handle_report(A, SECOND, [(T, outbound(MBIT, 0))]));
    assert!(!s.handle_report(NodeId(3), Duration::ZERO, []));
    assert_eq!(
        out_shares(&s, limit),
        [(A, limit / 3), (B, limit / 3), (NodeId(3), limit / 3)].into()
    );
    let sent = s.update(&[(T, limit)], now);
    let old = sent.iter().find(|(n, _)| *n == NodeId(3)).unwrap().1[0].1;
    assert_eq!(old.fallback_bits_per_second, 0, "it knows no fallback");
    assert_eq!(old.limit.inbound, old.limit.outbound, "one limit both ways");
    confirm_all(&mut s, &sent);
    // Lost, it keeps its whole share reserved: it never falls back on its own.
    s.node_lost(NodeId(3), now);
    let later = now + ShareConfig::default().lost_grace * 2;
    s.update(&[(T, limit)], later);
    assert_eq!(s.committed(T, later), [limit, limit]);
    assert_eq!(total(&out_shares(&s, limit)), limit - limit / 3);
}

#[test]
fn a_fallback_lowers_both_directions_to_the_floor_never_raises() {
    let share = Share {
        limit: TunnelLimit {
            inbound: RateLimit::new(80 * MBIT, burst_bytes(80 * MBIT)),
            outbound: RateLimit::new(2 * MBIT, burst_bytes(2 * MBIT)),
        },
        fallback_bits_per_second: 5 * MBIT,
    };
    let f = share.fallen_back();
    assert_eq!(f.inbound, RateLimit::new(5 * MBIT, burst_bytes(5 * MBIT)));
    assert_eq!(f.outbound, share.limit.outbound);
    let none = Share {
        fallback_bits_per_second: 0,
        ..share
    };
    assert_eq!(none.fallen_back(), share.limit);
}

proptest! {
    /// Whatever the reports, joins, losses, confirmations and times, what the nodes may
    /// enforce together stays at most the limit (plus 1 bit/s per node that could get
    /// nothing: a share of 0 has no encoding).
    #[test]
    fn what_the_nodes_may_enforce_never_exceeds_the_limit(
        ops in prop::collection::vec((0u8..6, 0u32..4, 0u64..400, 0u64..100, any::<bool>()), 1..60),
    ) {
        let limit = 200 * MBIT;
        let start = Instant::now();
        let mut now = start;
        let mut s = RateShares::default();
        let mut unconfirmed: Vec<ShareBatch> = Vec::new();
        for (op, node, mbit, drop_mbit, confirm) in ops {
            let node = NodeId(node);
            match op {
                0 => s.add_node(node),
                1 => {
                    s.node_lost(node, now);
                }
                2 | 3 => {
                    s.handle_report(node, SECOND, [(T, outbound(mbit * MBIT, drop_mbit * MBIT))]);
                }
                4 => now += Duration::from_secs(mbit % 8),
                _ => {
                    if confirm {
                        confirm_all(&mut s, &unconfirmed);
                        unconfirmed.clear();
                    }
                }
            }
            unconfirmed.extend(s.update(&[(T, limit)], now));
            let slack = s.nodes.len() as u64;
            let c = s.committed(T, now);
            prop_assert!(c[0] <= limit + slack && c[1] <= limit + slack, "{c:?}");
        }
    }
}
