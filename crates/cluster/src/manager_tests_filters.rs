//! Tenant filters and CPU fairness in the distributed form over in-memory links: what a data
//! node gets when it registers and when the set changes (each object once), a refusal that
//! fails the change and puts the old set back, map operations on every node, and the
//! reports summed.

use super::*;
use datapath::{
    CpuFairness, CpuFairnessConfig, FilterConfig, FilterCounters, FilterDirection, FilterMapOp,
    FilterMapReport, FilterProgramReport, TenantStats,
};

/// Records every directive; refuses `set_filters` with `refuse` if set, and answers
/// `filter_map` with one entry holding the node's `mark`.
struct FilterLink {
    ops: Mutex<Vec<Op>>,
    refuse: Mutex<Option<String>>,
    mark: u8,
}

impl FilterLink {
    fn new(mark: u8) -> Arc<Self> {
        Arc::new(Self {
            ops: Mutex::new(Vec::new()),
            refuse: Mutex::new(None),
            mark,
        })
    }

    fn take(&self) -> Vec<Op> {
        std::mem::take(&mut *self.ops.lock().unwrap())
    }
}

impl NodeLink for FilterLink {
    fn submit(&self, op: Op) -> Result<Ack, LinkError> {
        let answer = match &op {
            Op::SetFilters(_) => match self.refuse.lock().unwrap().clone() {
                Some(why) => Err(why),
                None => Ok(Answer::Applied),
            },
            Op::FilterMap(r) => Ok(Answer::FilterMap(Box::new(pb::FilterMapResult {
                map: Some(pb::FilterMapInfo {
                    tenant: r.tenant.clone(),
                    name: r.map.clone(),
                    object_name: "drop.o".into(),
                    kind: "hash".into(),
                    key_size: 1,
                    value_size: 1,
                    max_entries: 8,
                    entries: 1,
                    copies: 1,
                }),
                entries: (r.op == "dump")
                    .then(|| pb::FilterMapEntry {
                        key: vec![1],
                        value: vec![self.mark],
                    })
                    .into_iter()
                    .collect(),
            }))),
            _ => Ok(Answer::Applied),
        };
        self.ops.lock().unwrap().push(op);
        Ok(Ack::answered(answer))
    }

    fn is_closed(&self) -> bool {
        false
    }
}

fn filter(tenant: &str, section: &str, object: &Arc<[u8]>) -> FilterConfig {
    FilterConfig {
        tenant: ids::TenantId::new(tenant).unwrap(),
        direction: FilterDirection::ToCloud,
        object_name: "drop.o".into(),
        object: Arc::clone(object),
        section: section.into(),
        weight: 0,
    }
}

fn object(text: &str) -> Arc<[u8]> {
    Arc::from(text.as_bytes())
}

/// Registers data node `name` on `link`.
fn join(b: &Bed, name: &str, boot: u64, link: &Arc<FilterLink>) -> u32 {
    let addr = format!("10.0.0.{}:6081", 40 + link.mark).parse().unwrap();
    let r = Registration {
        routes: b.cluster.routes_version(),
        ..registration(name, Role::Data, addr, boot, Vec::new())
    };
    b.cluster.register(r, Arc::clone(link) as Arc<dyn NodeLink>)
}

/// The directives' names in order, those of filters and fairness (and the inside
/// configuration) only.
fn names(ops: &[Op]) -> Vec<&'static str> {
    ops.iter()
        .filter_map(|op| match op {
            Op::DataConfig(_) => Some("data_config"),
            Op::SetCpuFairness(_) => Some("set_cpu_fairness"),
            Op::StageFilterObject(_) => Some("stage_filter_object"),
            Op::SetFilters(_) => Some("set_filters"),
            _ => None,
        })
        .collect()
}

fn set_of(ops: &[Op]) -> Vec<String> {
    ops.iter()
        .rev()
        .find_map(|op| match op {
            Op::SetFilters(f) => Some(f.filters.iter().map(|f| f.section.clone()).collect()),
            _ => None,
        })
        .expect("a set_filters")
}

#[test]
fn a_data_node_gets_fairness_and_filters_after_its_configuration_each_object_once() {
    let b = bed();
    let (a, c) = (object("object a"), object("object c"));
    b.cluster
        .set_cpu_fairness(&CpuFairnessConfig {
            mode: CpuFairness::Account,
            weights: vec![(ids::TenantId::new("a").unwrap(), 3)],
        })
        .expect("no node to refuse");
    b.cluster
        .set_filters(&[
            filter("a", "xdp:in", &a),
            filter("a", "xdp:two", &a),
            filter("b", "xdp", &c),
        ])
        .expect("no node to refuse");
    let d1 = FilterLink::new(1);
    join(&b, "d1", 1, &d1);
    let ops = d1.take();
    assert_eq!(
        names(&ops),
        [
            "data_config",
            "set_cpu_fairness",
            "stage_filter_object",
            "stage_filter_object",
            "set_filters"
        ]
    );
    assert!(ops.iter().any(|op| matches!(op, Op::SetCpuFairness(f)
        if f.mode == "account" && f.weights.len() == 1 && f.weights[0].weight == 3)));
    assert_eq!(set_of(&ops), ["xdp:in", "xdp:two", "xdp"]);

    // A change sends only the object the node lacks; the set names the others it holds.
    let e = object("object e");
    b.cluster
        .set_filters(&[filter("a", "xdp:in", &a), filter("b", "xdp", &e)])
        .expect("applied");
    let ops = d1.take();
    assert_eq!(names(&ops), ["stage_filter_object", "set_filters"]);
    assert!(matches!(&ops[0], Op::StageFilterObject(o) if o.object == b"object e"));
    // The node dropped `c` with that set: a set naming it again sends it again.
    b.cluster
        .set_filters(&[filter("b", "xdp", &c)])
        .expect("applied");
    assert_eq!(names(&d1.take()), ["stage_filter_object", "set_filters"]);

    // A new session (a restart, or a new control node's): every object again.
    join(&b, "d1", 2, &d1);
    let ops = d1.take();
    assert_eq!(
        names(&ops),
        [
            "data_config",
            "set_cpu_fairness",
            "stage_filter_object",
            "set_filters"
        ]
    );

    // Steer nodes get neither.
    b.cluster
        .set_filters(&[filter("a", "xdp:in", &a)])
        .expect("applied");
    let mut b = b;
    b.join("s1", Role::Steer, 1);
    assert!(names(&b.ops("s1")).is_empty());
}

#[test]
fn a_refusing_node_fails_the_change_with_its_reason_and_the_old_set_goes_back() {
    let b = bed();
    let a = object("object a");
    b.cluster.set_filters(&[filter("a", "xdp", &a)]).unwrap();
    let (d1, d2) = (FilterLink::new(1), FilterLink::new(2));
    join(&b, "d1", 1, &d1);
    join(&b, "d2", 1, &d2);
    d1.take();
    d2.take();
    *d2.refuse.lock().unwrap() =
        Some("tenant filter b xdp of drop.o: instruction 7: out of bounds".into());
    let e = b
        .cluster
        .set_filters(&[filter("a", "xdp", &a), filter("b", "xdp", &a)])
        .expect_err("d2 refuses");
    assert_eq!(
        e.to_string(),
        "data node d2: tenant filter b xdp of drop.o: instruction 7: out of bounds"
    );
    // d1 took the new set, then the old one back.
    let ops = d1.take();
    let sets: Vec<usize> = ops
        .iter()
        .filter_map(|op| match op {
            Op::SetFilters(f) => Some(f.filters.len()),
            _ => None,
        })
        .collect();
    assert_eq!(sets, [2, 1]);
    // The running set is the old one.
    let report = b.cluster.filter_report(None);
    assert_eq!(report.programs.len(), 1);
    assert_eq!(report.programs[0].tenant.as_str(), "a");
}

#[test]
fn map_operations_reach_every_data_node_and_dumps_are_labelled_by_node() {
    let b = bed();
    let a = object("object a");
    b.cluster.set_filters(&[filter("a", "xdp", &a)]).unwrap();
    let (d1, d2) = (FilterLink::new(1), FilterLink::new(2));
    join(&b, "d2", 1, &d2);
    join(&b, "d1", 1, &d1);
    let tenant = ids::TenantId::new("a").unwrap();
    let dump = b
        .cluster
        .filter_map(&tenant, "blocked", FilterMapOp::Dump)
        .expect("dumped");
    let nodes: Vec<String> = dump
        .nodes
        .iter()
        .map(|n| format!("{}: {:?}", n.node, n.entries))
        .collect();
    assert_eq!(nodes, ["d1: [([1], [1])]", "d2: [([1], [2])]"]);
    assert_eq!(dump.map.entries, 2, "summed over the nodes");
    d1.take();
    d2.take();
    b.cluster
        .filter_map(
            &tenant,
            "blocked",
            FilterMapOp::Update {
                key: vec![1],
                value: vec![9],
                flags: 0,
            },
        )
        .expect("updated");
    for link in [&d1, &d2] {
        assert!(matches!(&link.take()[..], [Op::FilterMap(r)]
            if r.op == "update" && r.key == [1] && r.value == [9]));
    }
}

#[test]
fn counters_and_tenant_cpu_are_summed_over_the_data_nodes_reports() {
    let b = bed();
    let a = object("object a");
    b.cluster.set_filters(&[filter("a", "xdp", &a)]).unwrap();
    let (d1, d2) = (FilterLink::new(1), FilterLink::new(2));
    let id1 = join(&b, "d1", 1, &d1);
    let id2 = join(&b, "d2", 1, &d2);
    let usage = |dropped, cpu_ns, tokens| FilterUsage {
        programs: vec![FilterProgramReport {
            instructions: 40,
            counters: FilterCounters {
                dropped,
                passed: 1,
                ..FilterCounters::default()
            },
            ..b.cluster.filter_report(None).programs[0].clone()
        }],
        maps: vec![FilterMapReport {
            tenant: ids::TenantId::new("a").unwrap(),
            name: "blocked".into(),
            object_name: "drop.o".into(),
            kind: "array".into(),
            key_size: 4,
            value_size: 4,
            max_entries: 16,
            entries: 16,
            copies: 1,
        }],
        tenants: vec![TenantStats {
            tenant: ids::TenantId::new("a").unwrap(),
            cpu_weight: 2,
            cpu_ns,
            packets: 10,
            fair_drops: 1,
            tokens_ns: tokens,
            recent_cpu_ns: cpu_ns / 2,
        }],
    };
    b.cluster.filters_reported(id1, usage(5, 100, Some(-4)));
    b.cluster.filters_reported(id2, usage(7, 50, None));
    let report = b
        .cluster
        .filter_report(Some(&ids::TenantId::new("a").unwrap()));
    assert_eq!(report.programs[0].counters.dropped, 12);
    assert_eq!(report.programs[0].counters.passed, 2);
    assert_eq!(report.programs[0].instructions, 40);
    assert_eq!(report.maps.len(), 1);
    assert_eq!(report.maps[0].entries, 32);
    let tenants = b.cluster.stats().tenants;
    assert_eq!(tenants.len(), 1);
    assert_eq!(
        (
            tenants[0].cpu_ns,
            tenants[0].packets,
            tenants[0].fair_drops,
            tenants[0].tokens_ns
        ),
        (150, 20, 2, Some(-4))
    );
    // The recent charge sums over the nodes too (50 + 25).
    assert_eq!(tenants[0].recent_cpu_ns, 75);
    // Another tenant's show lists nothing.
    assert!(b
        .cluster
        .filter_report(Some(&ids::TenantId::new("b").unwrap()))
        .programs
        .is_empty());
}

#[test]
fn a_data_node_that_refused_the_filters_takes_a_new_tunnel_only_if_no_other_can() {
    let b = bed();
    let a = object("object a");
    b.cluster.set_filters(&[filter("a", "xdp", &a)]).unwrap();
    let (d1, d2) = (FilterLink::new(1), FilterLink::new(2));
    // d2 registers first: by the tie-break (lowest id) it would take the tunnel.
    *d2.refuse.lock().unwrap() = Some("cannot map the JIT's memory".into());
    let id2 = join(&b, "d2", 1, &d2);
    let id1 = join(&b, "d1", 1, &d1);
    // The refusal comes back after the registration, from the answer's thread.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !b.cluster.state().core.filters_refused.contains(&id2) {
        assert!(Instant::now() < deadline, "the refusal was not recorded");
        std::thread::sleep(Duration::from_millis(5));
    }
    // A node is current only once it answered that it runs the set.
    while b.cluster.state().core.filters_refused.contains(&id1) {
        assert!(Instant::now() < deadline, "d1's answer was not recorded");
        std::thread::sleep(Duration::from_millis(5));
    }
    b.cluster
        .install_child(&child(1, 0x1000, None, true))
        .expect("placed");
    assert_eq!(b.cluster.state().core.choose(TunnelId(1), None), Some(id1));
    assert!(d1
        .take()
        .iter()
        .any(|op| matches!(op, Op::InstallChild(c) if c.inbound_spi == 0x1000)));
    assert!(!d2.take().iter().any(|op| matches!(op, Op::InstallChild(_))));
    // Once it takes a set, it is a node like the others.
    *d2.refuse.lock().unwrap() = None;
    b.cluster.set_filters(&[]).expect("both take it");
    assert!(!b.cluster.state().core.filters_refused.contains(&id2));
}
