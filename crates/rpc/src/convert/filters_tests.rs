//! The tenant filters' messages: objects once each and named by digest, every field checked.

use super::*;

fn filter(
    tenant: &str,
    direction: FilterDirection,
    object: &Arc<[u8]>,
    section: &str,
) -> FilterConfig {
    FilterConfig {
        tenant: TenantId::new(tenant).unwrap(),
        direction,
        object_name: "f.o".into(),
        object: Arc::clone(object),
        section: section.into(),
        weight: 7,
    }
}

#[test]
fn a_set_names_each_object_once_by_digest_and_reads_back() {
    let a: Arc<[u8]> = Arc::from(&b"object a"[..]);
    // The same bytes in another allocation are the same object.
    let a_again: Arc<[u8]> = Arc::from(&b"object a"[..]);
    let b: Arc<[u8]> = Arc::from(&b"object b"[..]);
    let set = vec![
        filter("acme", FilterDirection::ToCloud, &a, "xdp:in"),
        filter("acme", FilterDirection::FromCloud, &a_again, "xdp:out"),
        filter("globex", FilterDirection::ToCloud, &b, "xdp"),
    ];
    let (objects, msg) = filters_to_pb(&set);
    assert_eq!(objects.len(), 2);
    assert_eq!(objects[0].0, object_digest(b"object a"));
    assert_eq!(objects[1].0, object_digest(b"object b"));
    assert_eq!(msg.filters[0].object_sha256, msg.filters[1].object_sha256);
    // Each object staged as its own directive, checked on arrival.
    let staged: HashMap<ObjectDigest, Arc<[u8]>> = objects
        .iter()
        .map(|(_, o)| filter_object_from_pb(filter_object_to_pb(o)).unwrap())
        .collect();
    let back = filters_from_pb(&msg, |d| staged.get(d).cloned()).unwrap();
    assert_eq!(back, set);
}

#[test]
fn a_set_naming_an_object_not_staged_or_a_bad_field_is_refused_with_its_place() {
    let a: Arc<[u8]> = Arc::from(&b"object a"[..]);
    let (_, msg) = filters_to_pb(&[
        filter("acme", FilterDirection::ToCloud, &a, "xdp"),
        filter("acme", FilterDirection::FromCloud, &a, "xdp"),
    ]);
    let e = filters_from_pb(&msg, |_| None).unwrap_err();
    assert_eq!(e.field, "filters[0].object_sha256");
    assert!(e.reason.contains("was staged"), "{e}");
    let staged = |_: &ObjectDigest| Some(Arc::clone(&a));
    for (edit, field) in [
        (
            (|f: &mut pb::Filter| f.direction = "sideways".into()) as fn(&mut pb::Filter),
            "filters[1].direction",
        ),
        (|f| f.tenant = String::new(), "filters[1].tenant"),
        (|f| f.section = String::new(), "filters[1].section"),
        (
            |f| f.object_sha256 = vec![1; 31],
            "filters[1].object_sha256",
        ),
    ] {
        let mut bad = msg.clone();
        edit(&mut bad.filters[1]);
        let e = filters_from_pb(&bad, staged).unwrap_err();
        assert_eq!(e.field, field, "{e}");
    }
}

#[test]
fn a_staged_object_must_match_its_digest_and_size() {
    let mut o = filter_object_to_pb(b"bytes");
    o.object[0] ^= 1;
    assert_eq!(filter_object_from_pb(o).unwrap_err().field, "sha256");
    let big = vec![0u8; MAX_FILTER_OBJECT + 1];
    assert_eq!(
        filter_object_from_pb(filter_object_to_pb(&big))
            .unwrap_err()
            .field,
        "object"
    );
    let (d, bytes) = filter_object_from_pb(filter_object_to_pb(b"bytes")).unwrap();
    assert_eq!((d, &*bytes), (object_digest(b"bytes"), &b"bytes"[..]));
}

#[test]
fn cpu_fairness_travels_with_its_weights_checked() {
    let f = CpuFairnessConfig {
        mode: CpuFairness::Enforce,
        weights: vec![
            (TenantId::new("acme").unwrap(), 3),
            (TenantId::new("globex").unwrap(), 65535),
        ],
    };
    assert_eq!(cpu_fairness_from_pb(&cpu_fairness_to_pb(&f)).unwrap(), f);
    let mut bad = cpu_fairness_to_pb(&f);
    bad.mode = "fair".into();
    assert_eq!(cpu_fairness_from_pb(&bad).unwrap_err().field, "mode");
    for w in [0, 65536] {
        let mut bad = cpu_fairness_to_pb(&f);
        bad.weights[1].weight = w;
        assert_eq!(
            cpu_fairness_from_pb(&bad).unwrap_err().field,
            "weights[1].weight"
        );
    }
}

#[test]
fn map_operations_and_answers_read_back() {
    let tenant = TenantId::new("acme").unwrap();
    for op in [
        FilterMapOp::Dump,
        FilterMapOp::Update {
            key: vec![1, 2],
            value: vec![3; 8],
            flags: 2,
        },
        FilterMapOp::Delete { key: vec![9] },
    ] {
        let back = filter_map_request_from_pb(filter_map_request_to_pb(&tenant, "o.o:limits", &op))
            .unwrap();
        assert_eq!(back, (tenant.clone(), "o.o:limits".to_owned(), op));
    }
    let mut bad = filter_map_request_to_pb(&tenant, "m", &FilterMapOp::Dump);
    bad.op = "clear".into();
    assert_eq!(filter_map_request_from_pb(bad).unwrap_err().field, "op");
    let answer = FilterMapAnswer {
        map: FilterMapReport {
            tenant: tenant.clone(),
            name: "limits".into(),
            object_name: "o.o".into(),
            kind: "percpu_array".into(),
            key_size: 4,
            value_size: 8,
            max_entries: 4,
            entries: 4,
            copies: 2,
        },
        entries: vec![(vec![0; 4], vec![1; 16])],
        nodes: Vec::new(),
    };
    assert_eq!(
        filter_map_answer_from_pb(filter_map_answer_to_pb(&answer)).unwrap(),
        answer
    );
    let mut bad = filter_map_answer_to_pb(&answer);
    bad.map = None;
    assert_eq!(filter_map_answer_from_pb(bad).unwrap_err().field, "map");
}

#[test]
fn reported_counters_and_cpu_read_back() {
    let p = FilterProgramReport {
        tenant: TenantId::new("acme").unwrap(),
        direction: FilterDirection::FromCloud,
        section: "xdp".into(),
        object_name: "f.o".into(),
        weight: 2,
        instructions: 120,
        counters: FilterCounters {
            passed: 1,
            dropped: 2,
            tx: 3,
            aborted: 4,
            insn_limit: 5,
            metered_insns: 6,
            cpu_ns: 7,
        },
    };
    assert_eq!(filter_usage_from_pb(&filter_usage_to_pb(&p)).unwrap(), p);
    let t = TenantStats {
        tenant: TenantId::new("acme").unwrap(),
        cpu_weight: 4,
        cpu_ns: 10,
        packets: 11,
        fair_drops: 12,
        tokens_ns: Some(-13),
        recent_cpu_ns: 14,
    };
    assert_eq!(tenant_cpu_from_pb(&tenant_cpu_to_pb(&t)).unwrap(), t);
    let mut bad = tenant_cpu_to_pb(&t);
    bad.cpu_weight = 70000;
    assert_eq!(tenant_cpu_from_pb(&bad).unwrap_err().field, "cpu_weight");
}
