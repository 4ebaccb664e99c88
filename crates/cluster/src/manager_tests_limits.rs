//! The cluster over in-memory links: the autoscaler carrying out its plans, and the tunnels'
//! rate limits divided among the steer nodes.

use super::*;

/// A node provider that records what it is asked and manages `data3`.
#[derive(Default)]
struct FakeProvider {
    calls: Mutex<Vec<(bool, String)>>,
    running: AtomicBool,
}

impl crate::provider::NodeProvider for FakeProvider {
    fn kind(&self) -> &'static str {
        "fake"
    }

    fn nodes(&self) -> Vec<crate::provider::ProvidedNode> {
        let state = if self.running.load(Ordering::Relaxed) {
            crate::provider::ProvidedState::Running { started_at: None }
        } else {
            crate::provider::ProvidedState::Stopped
        };
        vec![crate::provider::ProvidedNode {
            name: "data3".into(),
            state,
        }]
    }

    fn start(&self, name: &str) -> Result<(), crate::provider::ProviderError> {
        self.calls.lock().unwrap().push((true, name.into()));
        self.running.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn stop(&self, name: &str) -> Result<(), crate::provider::ProviderError> {
        self.calls.lock().unwrap().push((false, name.into()));
        self.running.store(false, Ordering::Relaxed);
        Ok(())
    }
}

/// A report of `mbit` per tunnel over one second.
fn mbit_report(mbit: &[(u32, u64)]) -> NodeLoad {
    NodeLoad {
        interval_ms: 1000,
        tunnel_bytes: mbit.iter().map(|(t, m)| (*t, m * 1_000_000 / 8)).collect(),
        ..NodeLoad::default()
    }
}

#[test]
fn the_autoscaler_relieves_a_hotspot_parks_and_starts_nodes() {
    let provider = Arc::new(FakeProvider::default());
    let mut b = fresh_bed_with(control::config::AutoscaleConfig {
        mode: control::config::AutoscaleMode::Act,
        interval: Duration::from_secs(1),
        consolidation_interval: Duration::from_secs(1),
        // The steps below follow envelope sizing (the higher of the last two measurements).
        sizing: provision::Sizing::Envelope { steps: 2 },
        ..control::config::AutoscaleConfig::default()
    });
    b.cluster = std::mem::replace(&mut b.cluster, fresh_bed().cluster)
        .with_provider(Arc::clone(&provider) as Arc<dyn crate::provider::NodeProvider>);
    assert!(b.cluster.reconcile(&[]).is_empty());
    let d1 = b.join("data1", Role::Data, 1);
    b.join("steer1", Role::Steer, 1);
    for t in 1..=3 {
        b.cluster
            .install_child(&child(t, 0x1000 * t, None, true))
            .unwrap();
    }
    let d2 = b.join("data2", Role::Data, 1);
    b.rekeys();
    // Without a rate limit a tunnel's σ is 30 % of a node: allow t2 and t3 more.
    b.cluster
        .set_rate_limits(&[(TunnelId(2), Some(2500)), (TunnelId(3), Some(2500))].into());
    // data1 carries 200 + 2500 + 2200 Mbit/s of 5000 (t1 is capped at twice its 100 Mbit/s).
    b.cluster
        .report(d1, mbit_report(&[(1, 200), (2, 2500), (3, 2200)]));
    b.cluster
        .report(d1, mbit_report(&[(1, 200), (2, 2500), (3, 2200)]));
    let t0 = Instant::now();
    b.cluster.autoscale(t0);
    // Best Fit Decreasing keeps t2 and t1 together and moves t3: a zero-loss move by rekey.
    assert_eq!(b.rekeys(), vec![TunnelId(3)]);
    assert_eq!(b.cluster.state().core.placement()[&TunnelId(3)], d2);
    let c = b.cluster.capacity();
    assert_eq!(c["mode"], "act", "{c}");
    let decisions = c["step"]["decisions"].as_array().unwrap();
    assert!(
        decisions.iter().any(|d| d["decision"]
            .as_str()
            .unwrap()
            .starts_with("migrate t3 data1 -> data2")
            && d["carried_out"] == true),
        "{c}"
    );
    assert_eq!(c["provider"]["kind"], "fake", "{c}");
    assert_eq!(c["provider"]["nodes"][0]["state"], "stopped", "{c}");
    // Not again before τ.
    b.cluster.autoscale(t0 + Duration::from_millis(500));
    assert!(b.rekeys().is_empty());

    // Load falls. Tunnels are sized at the higher of their last two measurements: the first
    // low report changes nothing; at the second everything fits on one node, and the emptied
    // node is parked at once (its old CHILD_SA may still be leaving) and takes no new
    // CHILD_SA while another can.
    b.cluster.report(d1, mbit_report(&[(1, 50), (2, 100)]));
    b.cluster.report(d2, mbit_report(&[(3, 100)]));
    b.cluster.autoscale(t0 + Duration::from_secs(2));
    assert!(b.rekeys().is_empty());
    b.cluster.report(d1, mbit_report(&[(1, 50), (2, 100)]));
    b.cluster.report(d2, mbit_report(&[(3, 100)]));
    b.cluster.autoscale(t0 + Duration::from_secs(3));
    assert_eq!(b.rekeys(), vec![TunnelId(3)]);
    assert_eq!(b.cluster.state().core.placement()[&TunnelId(3)], d1);
    assert!(b.cluster.state().core.nodes()[&d2].parked);
    {
        let st = b.cluster.state();
        assert_eq!(st.core.choose(TunnelId(2), None), Some(d1));
    }
    assert_eq!(b.cluster.describe()["nodes"][2]["parked"], true);
    assert!(provider.calls.lock().unwrap().is_empty());

    // Demand far above two nodes: the reserve asks for a third, which the provider starts.
    for _ in 0..3 {
        b.cluster
            .report(d1, mbit_report(&[(1, 200), (2, 5000), (3, 5000)]));
    }
    b.cluster.autoscale(t0 + Duration::from_secs(5));
    assert_eq!(
        provider.calls.lock().unwrap().first(),
        Some(&(true, "data3".to_owned())),
        "{}",
        b.cluster.capacity()
    );
    let c = b.cluster.capacity();
    assert_eq!(c["provider"]["nodes"][0]["state"], "running", "{c}");
    // It joins the reserve parked (inactive), until the autoscaler activates it.
    let d3 = b.join("data3", Role::Data, 1);
    assert!(b.cluster.state().core.nodes()[&d3].parked);
    assert!(!b.cluster.state().core.nodes()[&d1].parked);
}

/// Tunnel `tunnel`'s (inbound, outbound) bit/s in `limits`.
fn limit_of(limits: &[pb::RateLimit], tunnel: u32) -> (u64, u64) {
    let l = limits
        .iter()
        .find(|l| l.tunnel == tunnel)
        .expect("the tunnel is limited");
    let (_, l) = rpc::convert::rate_limit_from_pb(l).expect("a valid limit");
    let l = l.expect("a limit");
    (l.inbound.bits_per_second, l.outbound.bits_per_second)
}

/// The shares of `tunnel` in `ops` (whole tables, `SetRateLimits` and `SetRateLimit`), in
/// order.
fn shares_in(ops: &[Op], tunnel: u32) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::SetRateLimit(l) if l.tunnel == tunnel => {
                out.push(limit_of(std::slice::from_ref(l), tunnel))
            }
            Op::SetRateLimits(r) if r.limits.iter().any(|l| l.tunnel == tunnel) => {
                out.push(limit_of(&r.limits, tunnel))
            }
            Op::SteerTables(t) if t.limits.iter().any(|l| l.tunnel == tunnel) => {
                out.push(limit_of(&t.limits, tunnel))
            }
            _ => {}
        }
    }
    out
}

/// The shares of `tunnel` sent to `name` since the last look.
fn set_limits(b: &Bed, name: &str, tunnel: u32) -> Vec<(u64, u64)> {
    shares_in(&b.ops(name), tunnel)
}

/// A steer report of one second: tunnel 1 outbound `admitted` and `dropped` bit/s.
fn steer_report(admitted: u64, dropped: u64) -> NodeLoad {
    let usage = steer::TunnelUsage {
        inbound: steer::Usage::default(),
        outbound: steer::Usage {
            admitted_bytes: admitted / 8,
            dropped_bytes: dropped / 8,
        },
    };
    NodeLoad {
        interval_ms: 1000,
        rate_usage: [(1, usage)].into(),
        ..NodeLoad::default()
    }
}

/// A steer report of one second: tunnel 1 outbound `admitted` bit/s, nothing dropped.
fn light_report(admitted: u64) -> NodeLoad {
    steer_report(admitted, 0)
}

const M: u64 = 1_000_000;

/// Two steer nodes holding tunnel 1's 100 Mbit/s half each, confirmed.
fn two_steer_nodes(b: &mut Bed) -> (u32, u32) {
    let s1 = b.join("steer1", Role::Steer, 1);
    let s2 = b.join("steer2", Role::Steer, 1);
    assert_eq!(set_limits(b, "steer1", 1).last(), Some(&(50 * M, 50 * M)));
    assert_eq!(set_limits(b, "steer2", 1).last(), Some(&(50 * M, 50 * M)));
    (s1, s2)
}

#[test]
fn a_tunnels_limit_is_divided_among_the_steer_nodes_by_their_reports() {
    let mut b = bed();
    b.join("steer1", Role::Steer, 1);
    // Alone: tunnel 1's whole 100 Mbit/s, both ways; the tunnels without a limit have none.
    let alone = b.last_tables("steer1").limits;
    assert_eq!(limit_of(&alone, 1), (100 * M, 100 * M));
    assert_eq!(alone.len(), 1, "{alone:?}");
    // A second steer node joins: the first is cut to half, and the newcomer gets its half
    // once the first confirmed (before its session even starts).
    let s2 = b.join("steer2", Role::Steer, 1);
    assert_eq!(set_limits(&b, "steer1", 1), vec![(50 * M, 50 * M)]);
    assert_eq!(
        set_limits(&b, "steer2", 1),
        vec![(1, 1), (50 * M, 50 * M)],
        "tables with nothing free yet, then the half steer1 gave up"
    );
    let s1 = b.cluster.node_id("steer1");
    // The router sends nearly all the tunnel's outbound flows to steer1, which drops; steer2
    // sees a trickle and keeps the floor (10 % of an equal share). steer1 grows once steer2
    // confirmed its cut (the next tick). Nobody carried inbound: equal halves.
    b.cluster.report(s1, steer_report(50 * M, 100 * M));
    b.cluster.report(s2, steer_report(M, 0));
    assert_eq!(set_limits(&b, "steer2", 1), vec![(50 * M, 5 * M)]);
    assert_eq!(set_limits(&b, "steer1", 1), vec![]);
    b.cluster.tick(Instant::now());
    assert_eq!(set_limits(&b, "steer1", 1), vec![(50 * M, 95 * M)]);
    // The same reports again change nothing: no directive.
    b.cluster.report(s1, steer_report(95 * M, 50 * M));
    b.cluster.report(s2, steer_report(M, 0));
    b.cluster.tick(Instant::now());
    assert_eq!(set_limits(&b, "steer1", 1), vec![]);
    assert_eq!(set_limits(&b, "steer2", 1), vec![]);
    // Whole tables (an apply) carry each node's share.
    b.cluster
        .set_rate_limits(&[(TunnelId(1), Some(100))].into());
    assert_eq!(
        limit_of(&b.last_tables("steer1").limits, 1),
        (50 * M, 95 * M)
    );
    assert_eq!(
        limit_of(&b.last_tables("steer2").limits, 1),
        (50 * M, 5 * M)
    );
}

#[test]
fn shares_that_wobble_by_a_few_percent_are_not_sent_again() {
    let mut b = bed();
    let (s1, s2) = two_steer_nodes(&mut b);
    // Both carry a little without drops: 60 / 40 of the limit by their demands.
    b.cluster.report(s1, light_report(30 * M));
    b.cluster.report(s2, light_report(20 * M));
    b.cluster.tick(Instant::now());
    b.cluster.tick(Instant::now());
    assert_eq!(set_limits(&b, "steer1", 1).last(), Some(&(50 * M, 60 * M)));
    assert_eq!(set_limits(&b, "steer2", 1).last(), Some(&(50 * M, 40 * M)));
    // Their demand moves by a few percent from report to report: the targets move by less
    // than 10 %, and no directive goes out.
    for (a, c) in [(32, 20), (29, 21), (31, 19), (30, 20)] {
        b.cluster.report(s1, light_report(a * M));
        b.cluster.report(s2, light_report(c * M));
        b.cluster.tick(Instant::now());
        assert_eq!(set_limits(&b, "steer1", 1), vec![], "{a}/{c}");
        assert_eq!(set_limits(&b, "steer2", 1), vec![], "{a}/{c}");
    }
}

#[test]
fn changed_shares_of_several_tunnels_go_in_one_directive() {
    let mut b = bed();
    let (s1, s2) = two_steer_nodes(&mut b);
    b.cluster
        .set_rate_limits(&[(TunnelId(1), Some(100)), (TunnelId(2), Some(100))].into());
    b.cluster.tick(Instant::now());
    b.clear();
    let both = |bytes: u64| {
        let u = steer::TunnelUsage {
            inbound: steer::Usage::default(),
            outbound: steer::Usage {
                admitted_bytes: bytes / 8,
                dropped_bytes: 0,
            },
        };
        NodeLoad {
            interval_ms: 1000,
            rate_usage: [(1, u), (2, u)].into(),
            ..NodeLoad::default()
        }
    };
    b.cluster.report(s1, both(40 * M));
    b.cluster.report(s2, both(M));
    let ops = b.ops("steer2");
    assert_eq!(ops.len(), 1, "{ops:?}");
    let Op::SetRateLimits(r) = &ops[0] else {
        panic!("one SetRateLimits, not {ops:?}");
    };
    let tunnels: Vec<u32> = r.limits.iter().map(|l| l.tunnel).collect();
    assert_eq!(tunnels, vec![1, 2]);
}

#[test]
fn a_lost_steer_nodes_share_is_handed_on_only_after_its_grace() {
    let mut b = bed();
    let (_, s2) = two_steer_nodes(&mut b);
    let link: Arc<dyn NodeLink> = b.links["steer2"].clone();
    b.links["steer2"].closed.store(true, Ordering::Relaxed);
    b.cluster.session_ended(s2, &link);
    let ended = Instant::now();
    // steer2 may still forward with its half (partitioned from control only): steer1 gets
    // nothing more during the grace.
    b.cluster.tick(ended);
    b.cluster.tick(ended + Duration::from_secs(4));
    assert_eq!(set_limits(&b, "steer1", 1), vec![]);
    // After the grace steer2 holds at most its fallback (it dropped to it on its own): 10 %
    // of an equal share. steer1 gets the rest.
    assert_eq!(share_grace(Duration::from_secs(1)), Duration::from_secs(5));
    b.cluster.tick(ended + Duration::from_secs(5));
    assert_eq!(set_limits(&b, "steer1", 1), vec![(95 * M, 95 * M)]);
    // steer2 comes back: it starts from its fallback, and gets its half once steer1
    // confirmed giving it up.
    b.links["steer2"].closed.store(false, Ordering::Relaxed);
    b.join("steer2", Role::Steer, 1);
    assert_eq!(set_limits(&b, "steer1", 1), vec![(50 * M, 50 * M)]);
    assert_eq!(
        set_limits(&b, "steer2", 1),
        vec![(5 * M, 5 * M), (50 * M, 50 * M)]
    );
}

#[test]
fn a_steer_node_without_report_intervals_gets_an_equal_share_per_tunnel() {
    let mut b = bed();
    let (s1, s2) = two_steer_nodes(&mut b);
    // steer2 predates the division: its reports carry no interval. It gets one limit for
    // both ways, no fallback, in a directive it knows (SetRateLimit).
    b.cluster.report(
        s2,
        NodeLoad {
            interval_ms: 0,
            ..steer_report(90 * M, 10 * M)
        },
    );
    let ops = b.ops("steer2");
    let [Op::SetRateLimit(l)] = ops.as_slice() else {
        panic!("one SetRateLimit, not {ops:?}");
    };
    assert_eq!(l.bits_per_second, 50 * M);
    assert_eq!(l.outbound_bits_per_second, 0, "the same both ways");
    assert_eq!(l.fallback_bits_per_second, 0);
    // steer1 cannot take more than the other half, however much it drops.
    b.cluster.report(s1, steer_report(50 * M, 200 * M));
    b.cluster.tick(Instant::now());
    assert_eq!(set_limits(&b, "steer1", 1), vec![]);
}

#[test]
fn a_steer_node_outside_the_division_would_get_the_floor_not_the_limit() {
    let mut b = bed();
    two_steer_nodes(&mut b);
    let st = b.cluster.state();
    let limits: Vec<pb::RateLimit> = st
        .core
        .limits(99)
        .into_iter()
        .map(|(t, s)| rpc::convert::share_to_pb(t, Some(s)).unwrap())
        .collect();
    // 10 % of an equal share among three.
    assert_eq!(limit_of(&limits, 1), (3_333_333, 3_333_333));
}
