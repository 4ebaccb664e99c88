//! The health monitor over virtual time: steady traffic, silent nodes at several packet
//! rates with their exact detection times, idle nodes, late replies, bounds.

use super::*;
use std::collections::BTreeSet;

const MS: Duration = Duration::from_millis(1);
const US: Duration = Duration::from_micros(1);

/// A monitor, the data nodes it watches (which answer probes after a delay until they fail)
/// and the replies in flight, on a virtual clock measured from `t0`.
struct Sim {
    mon: HealthMonitor,
    t0: Instant,
    /// Replies in flight: (arrival, node, probe).
    in_flight: Vec<(Duration, NodeId, ProbeId)>,
    /// Per node: it answers probes sent before this time (`None`: always).
    fails_at: BTreeMap<NodeId, Option<Duration>>,
    /// Reply delay for a probe.
    rtt: fn(ProbeId) -> Duration,
    /// Deaths taken: (when, node).
    deaths: Vec<(Duration, NodeId)>,
    outcomes: Vec<ReplyOutcome>,
}

impl Sim {
    fn new(config: HealthConfig, nodes: &[(u32, Option<Duration>)]) -> Self {
        let t0 = Instant::now();
        let mut mon = HealthMonitor::new(config).unwrap();
        let mut fails_at = BTreeMap::new();
        for &(n, fail) in nodes {
            mon.add_node(NodeId(n), t0);
            fails_at.insert(NodeId(n), fail);
        }
        Self {
            mon,
            t0,
            in_flight: Vec::new(),
            fails_at,
            rtt: |_| MS,
            deaths: Vec::new(),
            outcomes: Vec::new(),
        }
    }

    fn deliver(&mut self, now: Duration) {
        self.in_flight.sort_by_key(|r| (r.0, r.2));
        let n = self.in_flight.partition_point(|r| r.0 <= now);
        for (at, node, probe) in self.in_flight.drain(..n).collect::<Vec<_>>() {
            let o = self.mon.on_reply(node, probe, self.t0 + at);
            self.outcomes.push(o);
        }
    }

    fn sent(&mut self, node: NodeId, probe: ProbeId, now: Duration) {
        let answers = self
            .fails_at
            .get(&node)
            .is_some_and(|f| f.is_none_or(|f| now < f));
        if answers {
            self.in_flight.push((now + (self.rtt)(probe), node, probe));
        }
    }

    fn collect(&mut self, now: Duration) {
        for n in self.mon.take_dead() {
            self.deaths.push((now, n));
        }
    }

    fn forward(&mut self, node: u32, now: Duration) -> Option<ProbeId> {
        self.deliver(now);
        let p = self.mon.on_forward(NodeId(node), self.t0 + now);
        if let Some(p) = p {
            self.sent(NodeId(node), p, now);
        }
        self.collect(now);
        p
    }

    fn tick(&mut self, now: Duration) -> Vec<(NodeId, ProbeId)> {
        self.deliver(now);
        let probes = self.mon.on_tick(self.t0 + now);
        for &(n, p) in &probes {
            self.sent(n, p, now);
        }
        self.collect(now);
        probes
    }

    fn status(&self, node: u32) -> NodeStatus {
        self.mon.node_status(NodeId(node)).unwrap()
    }
}

#[test]
fn config_validation_names_the_field() {
    assert_eq!(HealthConfig::default().validate(), Ok(()));
    let d = HealthConfig::default();
    let cases = [
        ("sample", HealthConfig { sample: 0, ..d }),
        (
            "min_interval",
            HealthConfig {
                min_interval: Duration::ZERO,
                ..d
            },
        ),
        (
            "idle_interval",
            HealthConfig {
                idle_interval: Duration::ZERO,
                ..d
            },
        ),
        (
            "timeout",
            HealthConfig {
                timeout: Duration::ZERO,
                ..d
            },
        ),
        ("misses", HealthConfig { misses: 0, ..d }),
        (
            "max_outstanding",
            HealthConfig {
                max_outstanding: 0,
                ..d
            },
        ),
    ];
    for (name, config) in cases {
        match HealthMonitor::new(config) {
            Err(SteerError::InvalidHealthConfig { field, reason }) => {
                assert_eq!(field, name);
                assert!(!reason.is_empty());
                assert!(SteerError::InvalidHealthConfig { field, reason }
                    .to_string()
                    .contains(name));
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

/// Three nodes for 2 s: 100 000 packets/s, 1000 packets/s, idle; replies take 1..40 ms and
/// arrive out of order. Nobody is declared dead and no probe is missed.
#[test]
fn steady_traffic_never_declares_a_live_node_dead() {
    let mut sim = Sim::new(HealthConfig::default(), &[(1, None), (2, None), (3, None)]);
    sim.rtt = |p| MS + MS * (p.0 % 40) as u32;
    let mut now = Duration::ZERO;
    while now <= 2000 * MS {
        sim.forward(1, now);
        if now.as_micros().is_multiple_of(1000) {
            sim.forward(2, now);
            sim.tick(now);
        }
        now += 10 * US;
    }
    assert!(sim.deaths.is_empty());
    assert_eq!(sim.mon.stats().misses, 0);
    for n in 1..=3 {
        let s = sim.status(n);
        assert!(
            s.alive && s.consecutive_misses == 0 && s.total_misses == 0,
            "{s:?}"
        );
        assert!(s.replies + s.outstanding as u64 == s.probes_sent, "{s:?}");
    }
    // 100 kpps: 1000 packets per 10 ms, so both rules give one probe per 10 ms.
    assert_eq!(sim.status(1).probes_sent, 201);
    assert_eq!(sim.status(2).probes_sent, 201);
    // Idle: a probe every 20 ms.
    assert_eq!(sim.status(3).probes_sent, 101);
    assert!(sim.outcomes.iter().all(|&o| o == ReplyOutcome::Accepted));
}

/// 1000 packets/s: one probe per 10 ms (min_interval). The node stops answering at 35 ms;
/// probes at 40, 50 and 60 ms go unanswered and time out at 90, 100 and 110 ms, so it is
/// declared dead at exactly 40 + 2 × 10 + 50 = 110 ms.
#[test]
fn silent_node_is_dead_after_exactly_three_misses_at_low_rate() {
    let mut sim = Sim::new(HealthConfig::default(), &[(1, Some(35 * MS))]);
    let mut probes = Vec::new();
    for t in 0..=200u32 {
        let now = MS * t;
        if sim.forward(1, now).is_some() {
            probes.push(t);
        }
        sim.tick(now);
        match t {
            89 => assert_eq!(sim.status(1).consecutive_misses, 0),
            90 | 100 => assert!(sim.status(1).consecutive_misses > 0),
            109 => {
                assert_eq!(sim.status(1).consecutive_misses, 2);
                assert!(sim.deaths.is_empty());
            }
            _ => {}
        }
    }
    assert_eq!(&probes[..11], &[0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]);
    assert_eq!(sim.deaths, vec![(110 * MS, NodeId(1))]);
    let s = sim.status(1);
    assert!(!s.alive);
    assert_eq!(
        (s.total_misses, s.consecutive_misses, s.outstanding),
        (3, 3, 0)
    );
    assert_eq!(sim.mon.stats().deaths, 1);
    // A dead node carries no more probes.
    assert_eq!(*probes.last().unwrap(), 100);
}

/// 1 000 000 packets/s: every 1000th packet is probed, one per millisecond. The node stops
/// answering at 5 ms; probes at 5, 6 and 7 ms time out at 55, 56 and 57 ms: dead at 57 ms.
#[test]
fn silent_node_is_dead_after_exactly_three_misses_at_high_rate() {
    let mut sim = Sim::new(HealthConfig::default(), &[(1, Some(5 * MS))]);
    sim.rtt = |_| 100 * US;
    let mut now = Duration::ZERO;
    while now <= 60 * MS {
        sim.forward(1, now);
        if now.as_micros().is_multiple_of(1000) {
            sim.tick(now);
        }
        if now == 56_999 * US {
            assert_eq!(sim.status(1).consecutive_misses, 2);
        }
        now += US;
    }
    assert_eq!(sim.deaths, vec![(57 * MS, NodeId(1))]);
    let st = sim.mon.stats();
    assert_eq!(
        st.interval_probes, 1,
        "only the first packet is probed by interval"
    );
    // Probes at 0..=4 ms answered; 5..=36 ms fill the 32 slots; from 37 ms probes wait until
    // the probe of 5 ms times out at 55 ms, 56 ms frees the next slot.
    assert_eq!(st.sampled_probes, 4 + 32 + 2);
    assert!(st.suppressed_probes > 0);
    assert_eq!(st.misses, 3);
}

/// No traffic: node 1 answers, node 2 never does. Idle probes every 20 ms: node 2's probes
/// at 0, 20 and 40 ms time out at 50, 70 and 90 ms.
#[test]
fn idle_nodes_are_probed_and_detected() {
    let mut sim = Sim::new(
        HealthConfig::default(),
        &[(1, None), (2, Some(Duration::ZERO))],
    );
    let mut sent_to_2 = Vec::new();
    for t in 0..=1000u32 {
        for (n, _) in sim.tick(MS * t) {
            if n == NodeId(2) {
                sent_to_2.push(t);
            }
        }
    }
    assert_eq!(sim.deaths, vec![(90 * MS, NodeId(2))]);
    assert_eq!(sent_to_2, vec![0, 20, 40, 60, 80]);
    let s1 = sim.status(1);
    assert!(s1.alive);
    assert_eq!((s1.probes_sent, s1.replies, s1.total_misses), (51, 50, 0));
    assert_eq!(sim.mon.stats().idle_probes, 51 + 5);
}

#[test]
fn late_reply_after_death_does_not_resurrect() {
    let mut sim = Sim::new(HealthConfig::default(), &[(1, Some(Duration::ZERO))]);
    let mut probes = Vec::new();
    for t in 0..=90u32 {
        probes.extend(sim.tick(MS * t).into_iter().map(|(_, p)| p));
    }
    assert_eq!(sim.deaths, vec![(90 * MS, NodeId(1))]);
    let late = probes[2];
    let at = sim.t0 + 95 * MS;
    assert_eq!(
        sim.mon.on_reply(NodeId(1), late, at),
        ReplyOutcome::NodeDead
    );
    assert_eq!(sim.mon.is_alive(NodeId(1)), Some(false));
    assert_eq!(sim.mon.on_forward(NodeId(1), at), None);
    assert!(sim.mon.on_tick(at + 100 * MS).is_empty());
    assert!(sim.mon.take_dead().is_empty(), "reported once");
    assert_eq!(sim.mon.stats().dead_node_replies, 1);
    assert_eq!(sim.mon.poll_timeout(), None);

    // Re-added: alive with no history, probed at once, and its next death reported again.
    let t1 = sim.t0 + 300 * MS;
    sim.mon.add_node(NodeId(1), t1);
    assert_eq!(sim.mon.is_alive(NodeId(1)), Some(true));
    assert_eq!(sim.status(1).total_misses, 0);
    assert_eq!(sim.mon.on_reply(NodeId(1), late, t1), ReplyOutcome::Stale);
    assert!(sim.mon.on_forward(NodeId(1), t1).is_some());
    for t in 300..=400u32 {
        sim.tick(MS * t);
    }
    // Probes at 300 (the packet), 320 and 340 ms time out at 350, 370 and 390 ms.
    assert_eq!(
        sim.deaths,
        vec![(90 * MS, NodeId(1)), (390 * MS, NodeId(1))]
    );
}

#[test]
fn replies_are_classified_and_only_outstanding_ones_count() {
    let config = HealthConfig::default();
    let t0 = Instant::now();
    let mut m = HealthMonitor::new(config).unwrap();
    m.add_node(NodeId(1), t0);
    m.add_node(NodeId(2), t0);
    let p1 = m.on_forward(NodeId(1), t0).unwrap();
    let p2 = m.on_forward(NodeId(2), t0).unwrap();
    // Another node's probe.
    assert_eq!(m.on_reply(NodeId(1), p2, t0), ReplyOutcome::Stale);
    assert_eq!(
        m.on_reply(NodeId(1), ProbeId(0), t0),
        ReplyOutcome::NeverIssued
    );
    assert_eq!(
        m.on_reply(NodeId(1), ProbeId(999), t0),
        ReplyOutcome::NeverIssued
    );
    assert_eq!(m.on_reply(NodeId(9), p1, t0), ReplyOutcome::UnknownNode);
    // Just within the timeout, then a duplicate.
    let t = t0 + config.timeout - Duration::from_nanos(1);
    assert_eq!(m.on_reply(NodeId(1), p1, t), ReplyOutcome::Accepted);
    assert_eq!(m.on_reply(NodeId(1), p1, t), ReplyOutcome::Stale);
    // Exactly at the timeout is late: the probe is a miss first.
    assert_eq!(
        m.on_reply(NodeId(2), p2, t0 + config.timeout),
        ReplyOutcome::Stale
    );
    assert_eq!(m.node_status(NodeId(2)).unwrap().consecutive_misses, 1);
    let s = m.stats();
    assert_eq!(
        (
            s.accepted_replies,
            s.stale_replies,
            s.never_issued_replies,
            s.unknown_node_replies,
            s.misses
        ),
        (1, 3, 2, 1, 1)
    );
}

/// A reply between misses breaks the run: misses must be consecutive.
#[test]
fn an_accepted_reply_clears_the_misses() {
    let t0 = Instant::now();
    let mut m = HealthMonitor::new(HealthConfig::default()).unwrap();
    m.add_node(NodeId(1), t0);
    let mut alive_probe = None;
    for t in 0..400u32 {
        let now = t0 + MS * t;
        for (_, p) in m.on_tick(now) {
            // Answer every third probe only: at most two misses in a row.
            if p.0 % 3 == 0 {
                alive_probe = Some(p);
            }
        }
        if let Some(p) = alive_probe.take() {
            assert_eq!(m.on_reply(NodeId(1), p, now), ReplyOutcome::Accepted);
        }
    }
    assert!(m.take_dead().is_empty());
    let s = m.node_status(NodeId(1)).unwrap();
    assert!(
        s.alive && s.total_misses > 10 && s.consecutive_misses < 3,
        "{s:?}"
    );
}

/// How sampling and the minimum interval combine, over 1 s of forwarding (no ticks).
#[test]
fn sampling_and_min_interval_interplay() {
    // (packet gap, sample, expected probes in 1 s, of which sampled)
    let cases: [(Duration, u32, u64, u64); 6] = [
        (20 * MS, 1000, 50, 0),  // 50 pps: every packet (interval)
        (10 * MS, 1000, 100, 0), // 100 pps: every packet
        (2 * MS, 1000, 100, 0),  // 500 pps: every 5th packet
        (MS, 5, 200, 199),       // 1000 pps, 1/5: sampling wins
        (MS, 20, 100, 0),        // 1000 pps, 1/20: the interval wins
        (US, 1000, 1000, 999),   // 1 Mpps: every 1000th packet
    ];
    for (gap, sample, want, want_sampled) in cases {
        let config = HealthConfig {
            sample,
            ..HealthConfig::default()
        };
        let t0 = Instant::now();
        let mut m = HealthMonitor::new(config).unwrap();
        m.add_node(NodeId(1), t0);
        let mut at = Duration::ZERO;
        while at < Duration::from_secs(1) {
            if let Some(p) = m.on_forward(NodeId(1), t0 + at) {
                assert_eq!(m.on_reply(NodeId(1), p, t0 + at), ReplyOutcome::Accepted);
            }
            at += gap;
        }
        let s = m.stats();
        assert_eq!(
            (s.sampled_probes + s.interval_probes, s.sampled_probes),
            (want, want_sampled),
            "gap {gap:?} sample {sample}"
        );
    }
}

#[test]
fn outstanding_probes_are_capped() {
    let config = HealthConfig {
        max_outstanding: 4,
        ..HealthConfig::default()
    };
    let t0 = Instant::now();
    let mut m = HealthMonitor::new(config).unwrap();
    m.add_node(NodeId(1), t0);
    for t in 0..45u32 {
        m.on_forward(NodeId(1), t0 + MS * t);
        m.on_tick(t0 + MS * t);
        assert!(m.node_status(NodeId(1)).unwrap().outstanding <= 4);
    }
    assert_eq!(m.node_status(NodeId(1)).unwrap().outstanding, 4);
    assert!(m.stats().suppressed_probes > 0);
    // Full: the next event is the first probe's timeout, not an idle probe.
    assert_eq!(m.poll_timeout(), Some(t0 + config.timeout));
}

#[test]
fn poll_timeout_tracks_the_next_deadline() {
    let config = HealthConfig::default();
    let t0 = Instant::now();
    let mut m = HealthMonitor::new(config).unwrap();
    assert_eq!(m.poll_timeout(), None);
    m.add_node(NodeId(1), t0);
    assert_eq!(m.poll_timeout(), Some(t0), "a new node is due at once");
    let probes = m.on_tick(t0);
    assert_eq!(probes.len(), 1);
    assert_eq!(m.poll_timeout(), Some(t0 + config.idle_interval));
    assert!(m.on_tick(t0 + config.idle_interval - US).is_empty());
    assert_eq!(m.on_tick(t0 + config.idle_interval).len(), 1);
    assert_eq!(m.poll_timeout(), Some(t0 + 2 * config.idle_interval));
}

#[test]
fn time_going_backwards_is_harmless() {
    let t0 = Instant::now();
    let mut m = HealthMonitor::new(HealthConfig::default()).unwrap();
    m.add_node(NodeId(1), t0 + 20 * MS);
    assert!(m.on_forward(NodeId(1), t0 + 20 * MS).is_some());
    // Earlier instants are taken as 20 ms: no interval probe, no timeout, no idle probe.
    assert!(m.on_forward(NodeId(1), t0).is_none());
    assert!(m.on_tick(t0).is_empty());
    assert_eq!(m.node_status(NodeId(1)).unwrap().outstanding, 1);
    assert!(m.on_forward(NodeId(1), t0 + 30 * MS).is_some());
}

#[test]
fn removed_and_unknown_nodes() {
    let t0 = Instant::now();
    let mut m = HealthMonitor::new(HealthConfig::default()).unwrap();
    assert_eq!(m.on_forward(NodeId(5), t0), None);
    m.add_node(NodeId(1), t0);
    m.add_node(NodeId(2), t0);
    m.add_node(NodeId(3), t0);
    let mut probes = Vec::new();
    for t in 0..=90u32 {
        probes.extend(m.on_tick(t0 + MS * t));
    }
    // All three die at the same tick, reported in node order.
    m.add_node(NodeId(4), t0);
    assert!(m.remove_node(NodeId(2)));
    assert!(!m.remove_node(NodeId(2)));
    assert_eq!(m.take_dead(), vec![NodeId(1), NodeId(3)]);
    let nodes: BTreeSet<_> = m.nodes().collect();
    assert_eq!(nodes, BTreeSet::from([NodeId(1), NodeId(3), NodeId(4)]));
    assert_eq!(m.stats().deaths, 3);
    assert_eq!(probes.len(), 15);
}
