//! Tests of the outbound selector index: hand-made cases (disjoint and overlapping ranges,
//! ranges at the ends of the address space, mixed-family selectors, the budget fallback) and
//! a property test that the indexed choice equals the linear scan (first child in priority
//! order whose selectors cover the packet, RFC 4301 §4.4.1.1) for random selector sets with
//! overlaps, protocols, ports, OPAQUE ports and rekey duplicates.

use super::*;
use proptest::prelude::*;
use std::net::{Ipv4Addr, Ipv6Addr};
use wire::flow::Flow;
use wire::ip::IpProtocol;

/// A child as the index sees it: local and remote selectors.
type Sel = (Vec<TrafficSelector>, Vec<TrafficSelector>);

fn ts(start: &str, end: &str) -> TrafficSelector {
    TrafficSelector {
        ip_proto: 0,
        start_port: 0,
        end_port: u16::MAX,
        start: start.parse().expect("start"),
        end: end.parse().expect("end"),
    }
}

fn any4() -> TrafficSelector {
    ts("0.0.0.0", "255.255.255.255")
}

fn flow(src: &str, dst: &str) -> Flow {
    Flow::new(
        src.parse().expect("src"),
        dst.parse().expect("dst"),
        IpProtocol(17),
        Some(&[0x30, 0x39, 0x01, 0xbb]),
    )
}

fn covers(c: &Sel, f: &Flow) -> bool {
    crate::select::covers(f, &c.0, &c.1)
}

/// The index's choice as a position in `children`.
fn choice(index: &SelectorIndex, children: &[Sel], f: &Flow) -> Option<usize> {
    index.select(children, f, covers).map(|c| {
        children
            .iter()
            .position(|x| std::ptr::eq(x, c))
            .expect("an element")
    })
}

fn linear(children: &[Sel], f: &Flow) -> Option<usize> {
    children.iter().position(|c| covers(c, f))
}

fn build(children: &[Sel], linear_max: usize) -> SelectorIndex {
    SelectorIndex::build_above(children.iter().map(|c| c.1.as_slice()), linear_max)
}

#[test]
fn disjoint_and_overlapping_ranges() {
    let children: Vec<Sel> = vec![
        (vec![any4()], vec![ts("10.1.0.0", "10.1.0.255")]),
        (
            vec![any4()],
            vec![ts("10.2.0.0", "10.2.0.255"), ts("10.9.0.0", "10.9.0.0")],
        ),
        (vec![any4()], vec![ts("10.0.0.0", "10.255.255.255")]),
        (
            vec![ts("192.168.0.0", "192.168.0.255")],
            vec![ts("10.1.0.128", "10.1.0.128")],
        ),
    ];
    let index = build(&children, 0);
    assert!(index.is_indexed());
    let at = |dst: &str| choice(&index, &children, &flow("172.16.0.1", dst));
    assert_eq!(at("10.1.0.7"), Some(0));
    assert_eq!(at("10.2.0.255"), Some(1));
    assert_eq!(at("10.9.0.0"), Some(1));
    assert_eq!(at("10.9.0.1"), Some(2));
    assert_eq!(at("10.200.0.1"), Some(2));
    assert_eq!(at("11.0.0.0"), None);
    assert_eq!(at("9.255.255.255"), None);
    assert_eq!(at("0.0.0.0"), None);
    // 10.1.0.128 lists children 0, 2 and 3; child 0 comes first.
    assert_eq!(at("10.1.0.128"), Some(0));
    // Child 3 only for its own source.
    let only3: Vec<Sel> = children[3..].to_vec();
    let index3 = build(&only3, 0);
    let f = flow("192.168.0.1", "10.1.0.128");
    assert_eq!(choice(&index3, &only3, &f), Some(0));
    assert_eq!(
        choice(&index3, &only3, &flow("172.16.0.1", "10.1.0.128")),
        None
    );
    // An IPv6 destination has no candidates among IPv4 selectors.
    assert_eq!(at("2001:db8::1"), None);
}

#[test]
fn ends_of_the_address_space_and_mixed_families() {
    let children: Vec<Sel> = vec![
        (vec![any4()], vec![ts("255.255.255.0", "255.255.255.255")]),
        // Mixed-family selector (the codec and the configuration refuse one; the index must
        // still not trip over it): covers nothing, as `wire::flow` and the steer node say.
        (vec![any4()], vec![ts("10.0.0.5", "::1")]),
        // IPv6 start with an IPv4 end contains nothing.
        (
            vec![ts("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")],
            vec![ts("fd00::", "10.0.0.1")],
        ),
        (
            vec![ts("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")],
            vec![
                ts("ffff::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
                ts("::", "::"),
            ],
        ),
        // Reversed range: contains nothing.
        (vec![any4()], vec![ts("10.0.0.9", "10.0.0.8")]),
    ];
    let index = build(&children, 0);
    let flows = [
        flow("1.1.1.1", "255.255.255.255"),
        flow("1.1.1.1", "255.255.254.255"),
        flow("1.1.1.1", "10.0.0.5"),
        flow("1.1.1.1", "10.0.0.4"),
        flow("1.1.1.1", "10.0.0.8"),
        flow("::1", "fd00::1"),
        flow("::1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
        flow("::1", "::"),
        flow("::1", "::1"),
    ];
    let expected = [
        Some(0),
        None,
        None,
        None,
        None,
        None,
        Some(3),
        Some(3),
        None,
    ];
    for (f, e) in flows.iter().zip(expected) {
        assert_eq!(linear(&children, f), e, "{f:?}");
        assert_eq!(choice(&index, &children, f), e, "{f:?}");
    }
}

#[test]
fn many_disjoint_tunnels_are_indexed_and_nested_ones_fall_back() {
    let subnet = |i: u32| {
        let base = Ipv4Addr::from(0x0a00_0000 + (i << 8));
        let last = Ipv4Addr::from(0x0a00_0000 + (i << 8) + 255);
        TrafficSelector {
            start: base.into(),
            end: last.into(),
            ..any4()
        }
    };
    let children: Vec<Sel> = (0..1000).map(|i| (vec![any4()], vec![subnet(i)])).collect();
    let index = SelectorIndex::build(children.iter().map(|c| c.1.as_slice()));
    assert!(index.is_indexed());
    for i in [0u32, 1, 499, 998, 999] {
        let dst = Ipv4Addr::from(0x0a00_0000 + (i << 8) + 7);
        let f = Flow::new(Ipv4Addr::LOCALHOST.into(), dst.into(), IpProtocol(6), None);
        assert_eq!(choice(&index, &children, &f), Some(i as usize));
    }
    // 3000 nested ranges would list ~4.5 million entries: the index gives up, the scan
    // answers the same.
    let nested: Vec<Sel> = (0..3000u32)
        .map(|i| {
            let r = TrafficSelector {
                start: Ipv4Addr::from(0x0a00_0000 + i).into(),
                end: Ipv4Addr::from(0x0b00_0000 - i).into(),
                ..any4()
            };
            (vec![any4()], vec![r])
        })
        .collect();
    let index = SelectorIndex::build(nested.iter().map(|c| c.1.as_slice()));
    assert!(!index.is_indexed());
    let f = Flow::new(
        Ipv4Addr::LOCALHOST.into(),
        Ipv4Addr::new(10, 0, 0, 7).into(),
        IpProtocol(6),
        None,
    );
    assert_eq!(choice(&index, &nested, &f), Some(0));
    // Small sets are scanned.
    assert!(
        !SelectorIndex::build(children[..LINEAR_MAX].iter().map(|c| c.1.as_slice())).is_indexed()
    );
    assert!(SelectorIndex::default()
        .select(&children[..0], &f, covers)
        .is_none());
}

/// Addresses from a small dense universe (so ranges overlap and touch), the ends of the
/// space, and anywhere.
fn v4() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        6 => (0u32..48).prop_map(|x| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + x))),
        1 => Just(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        1 => Just(IpAddr::V4(Ipv4Addr::BROADCAST)),
        1 => any::<u32>().prop_map(|x| IpAddr::V4(Ipv4Addr::from(x))),
    ]
}

fn v6() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        6 => (0u128..48).prop_map(|x| IpAddr::V6(Ipv6Addr::from((0xfd00u128 << 112) + x))),
        1 => Just(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
        1 => Just(IpAddr::V6(Ipv6Addr::from(u128::MAX))),
        1 => any::<u128>().prop_map(|x| IpAddr::V6(Ipv6Addr::from(x))),
    ]
}

fn addr() -> impl Strategy<Value = IpAddr> {
    prop_oneof![3 => v4(), 1 => v6()]
}

fn ports() -> impl Strategy<Value = (u16, u16)> {
    prop_oneof![
        4 => Just((0u16, u16::MAX)),
        1 => Just((u16::MAX, 0)),
        2 => (0u16..8).prop_map(|p| (p, p)),
        2 => (0u16..8, 0u16..8).prop_map(|(a, b)| (a.min(b), a.max(b))),
    ]
}

fn selector() -> impl Strategy<Value = TrafficSelector> {
    (
        prop_oneof![Just(0u8), Just(6), Just(17), Just(1), Just(58)],
        ports(),
        prop_oneof![
            // Mostly one family, ordered; sometimes reversed or mixed.
            8 => prop_oneof![
                (v4(), v4()).prop_map(|(a, b)| (a.min(b), a.max(b))),
                (v6(), v6()).prop_map(|(a, b)| (a.min(b), a.max(b))),
            ],
            1 => (addr(), addr()),
        ],
    )
        .prop_map(
            |(ip_proto, (start_port, end_port), (start, end))| TrafficSelector {
                ip_proto,
                start_port,
                end_port,
                start,
                end,
            },
        )
}

fn local_side() -> impl Strategy<Value = Vec<TrafficSelector>> {
    prop_oneof![
        // Often "anything of either family", so the remote side decides.
        2 => Just(vec![any4(), ts("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")]),
        3 => proptest::collection::vec(selector(), 1..3),
    ]
}

fn children() -> impl Strategy<Value = Vec<Sel>> {
    (
        proptest::collection::vec(
            (local_side(), proptest::collection::vec(selector(), 1..4)),
            0..24,
        ),
        // Rekey duplicates: copies of earlier children inserted elsewhere.
        proptest::collection::vec(
            (any::<prop::sample::Index>(), any::<prop::sample::Index>()),
            0..4,
        ),
    )
        .prop_map(|(mut c, dups)| {
            for (from, to) in dups {
                if !c.is_empty() {
                    let copy = c[from.index(c.len())].clone();
                    let at = to.index(c.len() + 1);
                    c.insert(at, copy);
                }
            }
            c
        })
}

fn flows() -> impl Strategy<Value = Vec<Flow>> {
    let one = (
        any::<bool>(),
        v4(),
        v4(),
        v6(),
        v6(),
        prop_oneof![Just(6u8), Just(17), Just(1), Just(58), Just(50)],
        proptest::option::of((0u16..10, 0u16..10)),
    )
        .prop_map(|(six, s4, d4, s6, d6, proto, ports)| {
            let (src, dst) = if six { (s6, d6) } else { (s4, d4) };
            let l4 = ports.map(|(s, d)| {
                let mut h = [0u8; 4];
                h[..2].copy_from_slice(&s.to_be_bytes());
                h[2..].copy_from_slice(&d.to_be_bytes());
                h
            });
            Flow::new(src, dst, IpProtocol(proto), l4.as_ref().map(|h| &h[..]))
        });
    proptest::collection::vec(one, 1..64)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn indexed_choice_equals_the_linear_scan(children in children(), flows in flows()) {
        let always = build(&children, 0);
        let default = build(&children, LINEAR_MAX);
        prop_assert!(always.is_indexed() || children.is_empty());
        for f in &flows {
            let expected = linear(&children, f);
            prop_assert_eq!(choice(&always, &children, f), expected, "{:?}", f);
            prop_assert_eq!(choice(&default, &children, f), expected, "{:?}", f);
        }
        // Every destination that some child's remote selector contains, probed directly.
        for c in &children {
            for r in &c.1 {
                for dst in [r.start, r.end] {
                    let f = Flow { dst, ..flows[0] };
                    prop_assert_eq!(choice(&always, &children, &f), linear(&children, &f), "{:?}", f);
                }
            }
        }
    }
}
