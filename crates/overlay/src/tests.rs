//! Tests of the table against a `HashMap` model, and of the route file parser.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use crate::*;

fn vni(v: u32) -> Vni {
    Vni::new(v).expect("test VNIs fit in 24 bits")
}

fn v4(a: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from_bits(0x0a00_0000 | (a % 0x00ff_fffe + 1)))
}

fn v6(a: u32) -> Ipv6Addr {
    Ipv6Addr::from_bits((0xfd00_u128 << 112) | (u128::from(a) + 1))
}

fn host(h: u32) -> IpAddr {
    IpAddr::V4(
        Ipv4Addr::new(192, 0, 2, 0)
            .to_bits()
            .wrapping_add(h % 250 + 1)
            .into(),
    )
}

/// A table with VNets 0..n, VNet `i` on VNI 100 + `i`.
fn table_with_vnets(n: u32) -> OverlayTable {
    let mut t = OverlayTable::new();
    for i in 0..n {
        t.set_vnet(VnetId(i), vni(100 + i)).expect("in range");
    }
    t
}

#[test]
fn insert_get_replace_remove() {
    let mut t = table_with_vnets(1);
    let k = Key::new(VnetId(0), Ipv4Addr::new(10, 0, 0, 5));
    assert_eq!(t.get(&k), None);
    assert_eq!(t.insert(k, host(1)), Ok(None));
    let first = Value {
        host: host(1),
        vni: vni(100),
    };
    assert_eq!(t.get(&k), Some(first));
    assert_eq!(
        t.insert(k, host(2)),
        Ok(Some(first)),
        "replace returns the old value"
    );
    assert_eq!(t.len(), 1);
    assert_eq!(t.hosts(), 1, "host 1 released when its last entry moved");
    assert_eq!(t.remove(&k).map(|v| v.host), Some(host(2)));
    assert_eq!(t.remove(&k), None);
    assert!(t.is_empty());
    assert_eq!(t.hosts(), 0);
}

#[test]
fn identical_address_plans_stay_apart() {
    // Two tenants' VNets and a second VNet of the first tenant, all using 10.0.0.0/16 and
    // fd00::/64; every address points to a different host in each.
    let mut t = table_with_vnets(3);
    for vnet in 0..3 {
        for a in 0..2000u32 {
            let h = host(vnet * 7 + a);
            t.insert(Key::new(VnetId(vnet), v4(a)), h).expect("insert");
            let a6 = v6(a);
            t.insert(Key::new(VnetId(vnet), a6), h).expect("insert");
        }
    }
    assert_eq!(t.len(), 3 * 2 * 2000);
    for vnet in 0..3 {
        for a in 0..2000u32 {
            let want = Some(Value {
                host: host(vnet * 7 + a),
                vni: vni(100 + vnet),
            });
            assert_eq!(t.get(&Key::new(VnetId(vnet), v4(a))), want);
            let a6 = v6(a);
            assert_eq!(t.get(&Key::new(VnetId(vnet), a6)), want);
        }
    }
    assert_eq!(
        t.get(&Key::new(VnetId(3), v4(1))),
        None,
        "VNet without entries"
    );
    assert_eq!(t.remove_vnet(VnetId(1)), 4000);
    assert_eq!(t.len(), 2 * 2 * 2000);
    assert_eq!(t.get(&Key::new(VnetId(1), v4(1))), None);
    assert!(t.get(&Key::new(VnetId(2), v4(1))).is_some());
    assert_eq!(t.vni(VnetId(1)), None);
}

#[test]
fn changing_a_vnets_vni_changes_all_its_entries() {
    let mut t = table_with_vnets(1);
    let k = Key::new(VnetId(0), v4(9));
    t.insert(k, host(1)).expect("insert");
    assert_eq!(t.set_vnet(VnetId(0), vni(555)), Ok(Some(vni(100))));
    assert_eq!(t.get(&k).map(|v| v.vni), Some(vni(555)));
}

#[test]
fn bad_input_is_refused_with_a_reason() {
    let mut t = table_with_vnets(1);
    let k = Key::new(VnetId(1), v4(1));
    assert_eq!(
        t.insert(k, host(1)),
        Err(OverlayError::UnknownVnet { vnet: VnetId(1) })
    );
    assert_eq!(
        t.set_vnet(VnetId(MAX_VNETS), vni(1)),
        Err(OverlayError::VnetOutOfRange {
            vnet: VnetId(MAX_VNETS)
        })
    );
    let zero = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
    let k = Key::new(VnetId(0), zero);
    assert!(matches!(
        t.insert(k, host(1)),
        Err(OverlayError::BadAddress { .. })
    ));
    let k = Key::new(VnetId(0), v4(1));
    let multicast = IpAddr::V6("ff02::1".parse().expect("literal"));
    assert_eq!(
        t.insert(k, multicast),
        Err(OverlayError::BadHost { host: multicast })
    );
    let keys = [k; 3];
    let mut out = [None; 2];
    assert_eq!(
        t.get_batch(&keys, &mut out),
        Err(OverlayError::BatchLength { keys: 3, out: 2 })
    );
    assert!(t.is_empty());
    assert_eq!(t.hosts(), 0, "failed inserts hold no host reference");
}

#[test]
fn a_reservation_past_what_the_table_can_address_is_refused() {
    let mut t = table_with_vnets(1);
    assert!(matches!(
        t.reserve(usize::MAX, 0),
        Err(OverlayError::CannotGrow {
            family: Family::V4,
            ..
        })
    ));
    assert!(matches!(
        t.reserve(0, 1 << 40),
        Err(OverlayError::CannotGrow {
            family: Family::V6,
            ..
        })
    ));
    assert_eq!(t.memory().v4 + t.memory().v6, 0, "nothing allocated");
    t.insert(Key::new(VnetId(0), v4(1)), host(1))
        .expect("still usable");
}

#[test]
fn the_limit_refuses_new_keys_but_not_replacements() {
    let mut t = table_with_vnets(1);
    t.set_max_entries(Some(2));
    t.insert(Key::new(VnetId(0), v4(1)), host(1)).expect("1");
    t.insert(Key::new(VnetId(0), v4(2)), host(1)).expect("2");
    assert_eq!(
        t.insert(Key::new(VnetId(0), v4(3)), host(1)),
        Err(OverlayError::LimitReached { entries: 2 })
    );
    assert!(t.insert(Key::new(VnetId(0), v4(2)), host(2)).is_ok());
    assert_eq!(t.len(), 2);
}

#[test]
fn grows_from_empty_to_a_hundred_thousand_keeping_every_entry() {
    let mut t = table_with_vnets(2);
    let n = 100_000u32;
    let mut slots_seen = Vec::new();
    for a in 0..n {
        t.insert(Key::new(VnetId(a % 2), v4(a)), host(a))
            .expect("insert");
        let m = t.memory().v4;
        if slots_seen.last() != Some(&m) {
            slots_seen.push(m);
        }
    }
    // Doubling: a handful of rebuilds, not one per few inserts.
    assert!(slots_seen.len() < 25, "{} rebuilds", slots_seen.len());
    for a in 0..n {
        let got = t.get(&Key::new(VnetId(a % 2), v4(a)));
        assert_eq!(got.map(|v| v.host), Some(host(a)), "{a}");
    }
    let lf = t.load_factor(Family::V4);
    assert!(lf > 0.4 && lf <= 0.95, "load factor {lf}");
    // Memory budget: at most 48 bytes per IPv4 entry, all included.
    assert!(t.memory_bytes() <= 48 * n as usize, "{:?}", t.memory());
}

#[test]
fn bulk_load_reserves_and_reports_the_failing_entry() {
    let mut t = table_with_vnets(1);
    let entries = (0..10_000u32).map(|a| (Key::new(VnetId(0), v4(a)), host(a)));
    assert_eq!(t.load(entries), Ok(10_000));
    let lf = t.load_factor(Family::V4);
    assert!(lf > 0.8, "reserved to size, load factor {lf}");
    let bad = [
        (Key::new(VnetId(0), v4(1)), host(3)),
        (Key::new(VnetId(9), v4(1)), host(3)),
    ];
    assert_eq!(
        t.load(bad),
        Err(OverlayError::Load {
            index: 1,
            source: Box::new(OverlayError::UnknownVnet { vnet: VnetId(9) })
        })
    );
    assert_eq!(
        t.get(&Key::new(VnetId(0), v4(1))).map(|v| v.host),
        Some(host(3))
    );
}

#[test]
fn batches_of_every_length_match_single_lookups() {
    let mut t = table_with_vnets(2);
    for a in 0..5000u32 {
        t.insert(Key::new(VnetId(a % 2), v4(a)), host(a))
            .expect("insert");
    }
    for len in [0, 1, BATCH - 1, BATCH, BATCH + 1, 3 * BATCH + 5] {
        let keys: Vec<Key> = (0..len as u32)
            .map(|i| Key::new(VnetId(i % 3), v4(i * 37)))
            .collect();
        let mut out = vec![None; len];
        t.get_batch(&keys, &mut out).expect("lengths match");
        let single: Vec<_> = keys.iter().map(|k| t.get(k)).collect();
        assert_eq!(out, single, "batch of {len}");
    }
    let empty = OverlayTable::new();
    let mut out = [Some(Value {
        host: host(1),
        vni: vni(1),
    })];
    empty
        .get_batch(&[Key::new(VnetId(0), v4(1))], &mut out)
        .expect("lengths match");
    assert_eq!(out, [None]);
}

#[test]
fn memory_per_entry_fits_the_budget_after_a_reserved_load() {
    for (family, budget) in [(Family::V4, 48.0), (Family::V6, 64.0)] {
        let mut t = table_with_vnets(1);
        let n = 200_000u32;
        let entries = (0..n).map(|a| {
            let addr = match family {
                Family::V4 => v4(a),
                Family::V6 => IpAddr::V6(v6(a)),
            };
            (Key::new(VnetId(0), addr), host(a))
        });
        t.load(entries).expect("load");
        let per_entry = t.memory_bytes() as f64 / f64::from(n);
        assert!(per_entry <= budget, "{family}: {per_entry} bytes per entry");
    }
}

#[derive(Debug, Clone)]
enum Op {
    Insert(Key, IpAddr),
    Remove(Key),
    Get(Key),
    Batch(Vec<Key>),
}

/// Keys from a small space (few VNets, few addresses), so that operations hit each other.
fn key() -> impl Strategy<Value = Key> {
    (0u32..3, 0u32..64, any::<bool>()).prop_map(|(vnet, a, six)| {
        let addr = if six { IpAddr::V6(v6(a)) } else { v4(a) };
        Key::new(VnetId(vnet), addr)
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (key(), 0u32..6).prop_map(|(k, h)| Op::Insert(k, host(h))),
        2 => key().prop_map(Op::Remove),
        1 => key().prop_map(Op::Get),
        1 => proptest::collection::vec(key(), 0..80).prop_map(Op::Batch),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn behaves_like_a_hash_map(ops in proptest::collection::vec(op(), 1..400)) {
        let mut t = table_with_vnets(3);
        let mut model: HashMap<Key, IpAddr> = HashMap::new();
        let value = |k: &Key, h: IpAddr| Value { host: h, vni: vni(100 + k.vnet.0) };
        for op in ops {
            match op {
                Op::Insert(k, h) => {
                    let old = t.insert(k, h).expect("insert");
                    prop_assert_eq!(old, model.insert(k, h).map(|o| value(&k, o)));
                }
                Op::Remove(k) => {
                    prop_assert_eq!(t.remove(&k), model.remove(&k).map(|o| value(&k, o)));
                }
                Op::Get(k) => {
                    prop_assert_eq!(t.get(&k), model.get(&k).map(|&o| value(&k, o)));
                }
                Op::Batch(keys) => {
                    let mut out = vec![None; keys.len()];
                    t.get_batch(&keys, &mut out).expect("lengths match");
                    let want: Vec<_> = keys.iter().map(|k| model.get(k).map(|&o| value(k, o))).collect();
                    prop_assert_eq!(out, want);
                }
            }
            prop_assert_eq!(t.len(), model.len());
        }
        t.check();
        let mut all: Vec<_> = t.iter().map(|(k, v)| (k, v.host)).collect();
        all.sort();
        let mut want: Vec<_> = model.iter().map(|(&k, &h)| (k, h)).collect();
        want.sort();
        prop_assert_eq!(all, want);
        let mut hosts: Vec<_> = model.values().collect();
        hosts.sort();
        hosts.dedup();
        prop_assert_eq!(t.hosts(), hosts.len(), "host references counted exactly");
    }

    #[test]
    fn a_full_table_grows_and_keeps_everything(seed in any::<u64>(), n in 1usize..3000) {
        // Random 32-bit addresses with a random seed: many cuckoo paths, several rebuilds.
        let mut t = OverlayTable::with_seed(seed);
        t.set_vnet(VnetId(0), vni(1)).expect("in range");
        let mut model = HashMap::new();
        let mut x = seed | 1;
        for _ in 0..n {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            let k = Key::new(VnetId(0), v4(x as u32));
            let h = host((x >> 32) as u32);
            t.insert(k, h).expect("insert");
            model.insert(k, h);
        }
        prop_assert_eq!(t.len(), model.len());
        for (k, h) in &model {
            prop_assert_eq!(t.get(k).map(|v| v.host), Some(*h));
        }
        prop_assert!(t.displaced(Family::V4) <= t.len());
        t.check();
    }
}

mod route_file {
    use super::*;

    fn first_error(text: &str) -> RouteFileError {
        parse_routes(text).find_map(Result::err).expect("an error")
    }

    #[test]
    fn csv_and_json_lines_mix() {
        let text = "tenant,vnet,address,host\n\
                    # a comment\n\
                    \n\
                    acme,prod,10.2.0.7,192.0.2.10\r\n\
                    {\"tenant\":\"globex\",\"vnet\":\"main\",\"address\":\"fd00::7\",\"host\":\"2001:db8::10\"}\n\
                    \x20 acme , prod , 10.2.0.8 , 192.0.2.11 \n";
        let lines: Vec<_> = parse_routes(text).collect::<Result<_, _>>().expect("valid");
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].line, 4);
        assert_eq!(lines[0].tenant, "acme");
        assert_eq!(lines[0].address, IpAddr::V4(Ipv4Addr::new(10, 2, 0, 7)));
        assert_eq!(lines[1].line, 5);
        assert_eq!(lines[1].vnet, "main");
        assert_eq!(
            lines[1].host,
            "2001:db8::10".parse::<IpAddr>().expect("literal")
        );
        assert_eq!(lines[2].host, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 11)));
    }

    #[test]
    fn errors_name_line_and_field() {
        let cases: &[(&str, usize, Option<Field>, &str)] = &[
            ("acme,prod,10.2.0.7\n", 1, None, "found 3"),
            ("\nacme,prod,10.2.0.7,192.0.2.1,x\n", 2, None, "found 5"),
            ("acme,prod,10.2.0.999,192.0.2.1\n", 1, Some(Field::Address), "not an IP address"),
            ("acme,prod,10.2.0.7,224.0.0.1\n", 1, Some(Field::Host), "not a unicast"),
            ("acme,prod,0.0.0.0,192.0.2.1\n", 1, Some(Field::Address), "not a unicast"),
            ("a b,prod,10.2.0.7,192.0.2.1\n", 1, Some(Field::Tenant), "not a valid name"),
            ("acme,,10.2.0.7,192.0.2.1\n", 1, Some(Field::Vnet), "must not be empty"),
            ("# c\n{\"tenant\":\"acme\",\"vnet\":\"prod\",\"address\":\"10.2.0.7\"}\n", 2, Some(Field::Host), "missing"),
            ("{\"tenant\":\"acme\",\"vnet\":5,\"address\":\"10.2.0.7\",\"host\":\"192.0.2.1\"}\n", 1, Some(Field::Vnet), "must be a string"),
            ("{\"tenant\":\"acme\",\"vnet\":\"p\",\"address\":\"10.2.0.7\",\"host\":\"192.0.2.1\",\"vni\":3}\n", 1, None, "unknown field \"vni\""),
            ("{\"tenant\":\"acme\"\n", 1, None, "not a JSON object"),
            ("{\"tenant\":\"ac\\u006de\",\"vnet\":\"p\",\"address\":\"x\",\"host\":\"192.0.2.1\"}\n", 1, Some(Field::Address), "\"x\" is not an IP address"),
        ];
        for &(text, line, field, needle) in cases {
            let e = first_error(text);
            assert_eq!((e.line, e.field), (line, field), "{text:?}: {e}");
            assert!(e.to_string().contains(needle), "{text:?}: {e}");
        }
        let e = first_error("x\n\nacme,prod,1.2.3.4,bad\n");
        assert_eq!(
            e.to_string(),
            "line 1: expected 4 comma-separated fields (tenant,vnet,address,host), found 1"
        );
        let e = first_error("acme,prod,10.0.0.1,192.0.2.1\nacme,prod,10.0.0.1,nope\n");
        assert_eq!(
            e.to_string(),
            "line 2, field host: \"nope\" is not an IP address"
        );
    }

    #[test]
    fn a_header_only_counts_on_the_first_line() {
        let e = first_error("acme,prod,10.0.0.1,192.0.2.1\ntenant,vnet,address,host\n");
        assert_eq!((e.line, e.field), (2, Some(Field::Address)));
    }

    #[test]
    fn resolved_routes_load_into_the_table() {
        let text = "acme,prod,10.2.0.7,192.0.2.10\n\
                    globex,main,10.2.0.7,192.0.2.20\n\
                    acme,test,10.2.0.7,192.0.2.30\n";
        let vnets = |tenant: &str, vnet: &str| match (tenant, vnet) {
            ("acme", "prod") => Some(VnetId(0)),
            ("globex", "main") => Some(VnetId(1)),
            _ => None,
        };
        let mut t = table_with_vnets(2);
        let mut entries = resolve_routes(text, vnets);
        let good: Vec<_> = entries
            .by_ref()
            .take(2)
            .collect::<Result<_, _>>()
            .expect("known");
        assert_eq!(t.load(good), Ok(2));
        let e = entries
            .next()
            .expect("third line")
            .expect_err("acme/test unknown");
        assert_eq!(
            e.to_string(),
            "line 3, field vnet: no VNet \"test\" of tenant \"acme\" is configured"
        );
        let k = |v| Key::new(VnetId(v), Ipv4Addr::new(10, 2, 0, 7));
        assert_eq!(
            t.get(&k(0)).map(|v| v.host),
            Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 10)))
        );
        assert_eq!(
            t.get(&k(1)).map(|v| v.host),
            Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 20)))
        );
    }
}
