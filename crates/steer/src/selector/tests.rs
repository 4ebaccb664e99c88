//! Selector matching, priority, validation, and the index against a linear scan.

use super::*;
use proptest::prelude::*;
use std::net::{Ipv4Addr, Ipv6Addr};

fn vni(v: u32) -> Vni {
    Vni::new(v).unwrap()
}

fn v4(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(s: &str) -> AddrRange {
    let (a, len) = s.split_once('/').unwrap();
    AddrRange::prefix(a.parse().unwrap(), len.parse().unwrap()).unwrap()
}

fn entry(selector: Selector, tunnel: u32, node: u32) -> SelectorEntry {
    SelectorEntry {
        selector,
        tunnel: Some(TunnelId(tunnel)),
        node: NodeId(node),
    }
}

fn flow(src: &str, dst: &str, proto: u8, sport: u16, dport: u16) -> Flow {
    Flow {
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        proto,
        sport: Some(sport),
        dport: Some(dport),
    }
}

fn linear<'a>(entries: &'a [SelectorEntry], f: &Flow) -> Option<&'a SelectorEntry> {
    entries.iter().find(|e| e.selector.matches(f))
}

#[test]
fn ranges_validate() {
    assert_eq!(
        AddrRange::new(v4("10.0.0.2"), v4("10.0.0.1")),
        Err(SteerError::InvertedAddressRange {
            start: v4("10.0.0.2"),
            end: v4("10.0.0.1")
        })
    );
    assert!(matches!(
        AddrRange::new(v4("10.0.0.1"), "::1".parse().unwrap()),
        Err(SteerError::AddressFamilyMismatch { .. })
    ));
    assert!(matches!(
        AddrRange::prefix(v4("10.0.0.0"), 33),
        Err(SteerError::InvalidPrefix { len: 33, .. })
    ));
    assert_eq!(
        PortRange::new(10, 9),
        Err(SteerError::InvertedPortRange { start: 10, end: 9 })
    );
    let r = net("10.1.2.3/24");
    assert_eq!((r.start(), r.end()), (v4("10.1.2.0"), v4("10.1.2.255")));
    assert_eq!(net("0.0.0.0/0"), AddrRange::V4_ANY);
    assert_eq!(
        AddrRange::prefix(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0).unwrap(),
        AddrRange::V6_ANY
    );
    assert_eq!(net("10.0.0.7/32"), AddrRange::host(v4("10.0.0.7")));
    let r6 = net("2001:db8::/32");
    assert!(r6.contains("2001:db8:ffff::1".parse().unwrap()));
    assert!(!r6.contains("2001:db9::".parse().unwrap()));
    assert!(!r6.contains(v4("10.0.0.1")));
    assert!(!r6.is_ipv4());
}

#[test]
fn selector_matching_checks_every_field() {
    let s = Selector {
        dst: net("192.168.0.0/16"),
        src: net("10.0.0.0/24"),
        proto: 6,
        sport: PortRange::ANY,
        dport: PortRange::new(443, 444).unwrap(),
    };
    assert!(s.matches(&flow("10.0.0.5", "192.168.7.7", 6, 40000, 443)));
    assert!(!s.matches(&flow("10.0.1.5", "192.168.7.7", 6, 40000, 443)));
    assert!(!s.matches(&flow("10.0.0.5", "192.169.7.7", 6, 40000, 443)));
    assert!(!s.matches(&flow("10.0.0.5", "192.168.7.7", 17, 40000, 443)));
    assert!(!s.matches(&flow("10.0.0.5", "192.168.7.7", 6, 40000, 445)));
    let any = Selector::between(net("10.0.0.0/24"), net("0.0.0.0/0"));
    assert!(any.matches(&flow("10.0.0.5", "8.8.8.8", 1, 0, 0)));
    assert!(!any.matches(&flow("::1", "::2", 1, 0, 0)));
}

#[test]
fn from_traffic_selectors_combines_protocols() {
    let ts = |proto, a: &str, b: &str, p0, p1| TrafficSelector {
        ip_proto: proto,
        start_port: p0,
        end_port: p1,
        start: a.parse().unwrap(),
        end: b.parse().unwrap(),
    };
    let local = ts(0, "10.0.0.0", "10.0.0.255", 0, 65535);
    let remote = ts(17, "192.168.1.0", "192.168.1.255", 53, 53);
    let s = Selector::from_traffic_selectors(&local, &remote).unwrap();
    assert_eq!(s.proto, 17);
    assert_eq!(s.src, net("10.0.0.0/24"));
    assert_eq!(s.dst, net("192.168.1.0/24"));
    assert_eq!(s.dport, PortRange::single(53));
    assert_eq!(s.sport, PortRange::ANY);
    assert_eq!(
        Selector::from_traffic_selectors(&ts(6, "10.0.0.0", "10.0.0.1", 0, 65535), &remote),
        Err(SteerError::ProtocolMismatch {
            local: 6,
            remote: 17
        })
    );
    // OPAQUE ports (RFC 7296 §3.13.1: start 65535, end 0) steer the packets without ports,
    // as the data node's selector check lets them through; other reversed ranges are refused.
    let opaque =
        Selector::from_traffic_selectors(&local, &ts(17, "1.1.1.1", "1.1.1.1", 65535, 0)).unwrap();
    assert_eq!(opaque.dport, PortRange::OPAQUE);
    let udp = |dport| Flow {
        dport,
        ..flow("10.0.0.1", "1.1.1.1", 17, 1, 1)
    };
    assert!(opaque.matches(&udp(None)));
    assert!(!opaque.matches(&udp(Some(53))));
    assert_eq!(
        Selector::from_traffic_selectors(&local, &ts(17, "1.1.1.1", "1.1.1.1", 54, 53)),
        Err(SteerError::InvertedPortRange { start: 54, end: 53 })
    );
}

#[test]
fn first_entry_in_list_order_wins() {
    let mut t = SelectorTable::new();
    let wide = entry(
        Selector::between(AddrRange::V4_ANY, net("192.168.0.0/16")),
        1,
        10,
    );
    let narrow = entry(
        Selector::between(AddrRange::V4_ANY, net("192.168.1.0/24")),
        2,
        20,
    );
    t.set_vni(vni(5), vec![wide, narrow]).unwrap();
    let f = flow("10.0.0.1", "192.168.1.1", 6, 1, 2);
    assert_eq!(t.lookup(vni(5), &f), Some(&wide));
    t.set_vni(vni(5), vec![narrow, wide]).unwrap();
    assert_eq!(t.lookup(vni(5), &f), Some(&narrow));
    assert_eq!(
        t.lookup(vni(5), &flow("10.0.0.1", "192.168.2.1", 6, 1, 2)),
        Some(&wide)
    );
    assert_eq!(t.lookup(vni(6), &f), None);
    assert_eq!(
        t.lookup(vni(5), &flow("10.0.0.1", "172.16.0.1", 6, 1, 2)),
        None
    );
    // Mixed-family flows match nothing.
    assert_eq!(t.lookup(vni(5), &flow("::1", "192.168.1.1", 6, 1, 2)), None);
}

#[test]
fn set_vni_validates_whole_list_and_empty_removes() {
    let mut t = SelectorTable::new();
    let good = entry(
        Selector::between(AddrRange::V4_ANY, net("10.0.0.0/8")),
        1,
        1,
    );
    t.set_vni(vni(1), vec![good]).unwrap();
    let bad = entry(
        Selector::between(AddrRange::V6_ANY, net("10.0.0.0/8")),
        9,
        1,
    );
    assert_eq!(
        t.set_vni(vni(1), vec![good, bad]),
        Err(SteerError::SelectorFamilyMismatch {
            vni: vni(1),
            index: 1,
            tunnel: Some(TunnelId(9))
        })
    );
    // The failed update changed nothing.
    assert_eq!(t.entries(vni(1)), &[good]);
    assert_eq!(t.len(), 1);
    t.set_vni(vni(1), Vec::new()).unwrap();
    assert!(t.is_empty());
    assert!(t.entries(vni(1)).is_empty());
    assert!(!t.remove_vni(vni(1)));
}

#[test]
fn snapshots_share_untouched_vnis_and_stay_independent() {
    let mut t = SelectorTable::new();
    let a = entry(
        Selector::between(AddrRange::V4_ANY, net("10.0.0.0/8")),
        1,
        1,
    );
    let b = entry(
        Selector::between(AddrRange::V4_ANY, net("10.0.0.0/8")),
        2,
        2,
    );
    t.set_vni(vni(1), vec![a]).unwrap();
    t.set_vni(vni(2), vec![a]).unwrap();
    let old = t.clone();
    // Migration: the tunnel of VNI 1 moves to node 2.
    t.set_vni(vni(1), vec![b]).unwrap();
    let f = flow("1.1.1.1", "10.1.1.1", 6, 1, 1);
    assert_eq!(old.lookup(vni(1), &f), Some(&a));
    assert_eq!(t.lookup(vni(1), &f), Some(&b));
    assert!(Arc::ptr_eq(&old.vnis[&vni(2)], &t.vnis[&vni(2)]));
    let mut vnis: Vec<_> = t.vnis().collect();
    vnis.sort();
    assert_eq!(vnis, vec![vni(1), vni(2)]);
}

/// One tenant with 10 000 sites (disjoint /24s), a default route last, and IPv6 sites.
#[test]
fn many_disjoint_tunnels_are_indexed() {
    let mut entries = Vec::new();
    for i in 0..10_000u32 {
        let dst =
            AddrRange::prefix(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + (i << 8))), 24).unwrap();
        entries.push(entry(
            Selector::between(net("172.16.0.0/16"), dst),
            i,
            i % 7,
        ));
    }
    for i in 0..100u32 {
        let dst = AddrRange::prefix(
            IpAddr::V6(Ipv6Addr::from(0x2001_0db8_u128 << 96 | u128::from(i) << 64)),
            64,
        )
        .unwrap();
        entries.push(entry(
            Selector::between(net("fd00::/8"), dst),
            20_000 + i,
            1,
        ));
    }
    let default = entry(
        Selector::between(net("172.16.0.0/16"), AddrRange::V4_ANY),
        99_999,
        3,
    );
    entries.push(default);
    let mut t = SelectorTable::new();
    t.set_vni(vni(42), entries.clone()).unwrap();
    let stats = t.index_stats(vni(42)).unwrap();
    assert_eq!(
        stats,
        IndexStats {
            entries: 10_101,
            layers: 2,
            indexed: 10_100,
            fallback: 1
        }
    );
    for i in (0..10_000u32).step_by(37) {
        let dst = Ipv4Addr::from(0x0a00_0000 + (i << 8) + 77);
        let f = Flow {
            src: v4("172.16.3.3"),
            dst: IpAddr::V4(dst),
            proto: 6,
            sport: Some(1000),
            dport: Some(443),
        };
        assert_eq!(
            t.lookup(vni(42), &f).map(|e| e.tunnel),
            Some(Some(TunnelId(i)))
        );
    }
    let outside = flow("172.16.3.3", "9.9.9.9", 17, 5, 5);
    assert_eq!(t.lookup(vni(42), &outside), Some(&default));
    let f6 = flow("fd00::1", "2001:db8:0:63::5", 6, 1, 1);
    assert_eq!(
        t.lookup(vni(42), &f6).map(|e| e.tunnel),
        Some(Some(TunnelId(20_099)))
    );
    assert_eq!(
        t.lookup(vni(42), &flow("fd00::1", "2001:db9::", 6, 1, 1)),
        None
    );
}

/// Several tunnels to one site, one per VNet subnet: a source layer.
#[test]
fn same_destination_different_sources_use_a_source_layer() {
    let entries: Vec<_> = (0..64u32)
        .map(|i| {
            let src =
                AddrRange::prefix(IpAddr::V4(Ipv4Addr::from(0xac10_0000 + (i << 8))), 24).unwrap();
            entry(Selector::between(src, net("192.168.0.0/16")), i, i)
        })
        .collect();
    let mut t = SelectorTable::new();
    t.set_vni(vni(1), entries).unwrap();
    let stats = t.index_stats(vni(1)).unwrap();
    assert_eq!((stats.layers, stats.indexed, stats.fallback), (1, 64, 0));
    let f = flow("172.16.33.9", "192.168.5.5", 1, 0, 0);
    assert_eq!(
        t.lookup(vni(1), &f).map(|e| e.tunnel),
        Some(Some(TunnelId(33)))
    );
}

/// Nested prefixes (/8 ⊃ /16 ⊃ /24 …) spread over layers; the answer is still the first match.
#[test]
fn nested_ranges_keep_list_order() {
    let mut entries = Vec::new();
    for base in 0..8u32 {
        for len in [8u8, 12, 16, 20, 24, 28, 32] {
            let a = Ipv4Addr::from((base + 1) << 24 | 0x0001_0101);
            entries.push(entry(
                Selector::between(
                    AddrRange::V4_ANY,
                    AddrRange::prefix(IpAddr::V4(a), len).unwrap(),
                ),
                base * 100 + u32::from(len),
                base,
            ));
        }
    }
    // Wide selectors first in the list: they win over everything below.
    entries.reverse();
    let mut t = SelectorTable::new();
    t.set_vni(vni(1), entries.clone()).unwrap();
    let stats = t.index_stats(vni(1)).unwrap();
    assert!(stats.layers >= 2, "{stats:?}");
    for base in 0..8u32 {
        for low in [
            0x0001_0101u32,
            0x0001_0102,
            0x0001_0201,
            0x0002_0000,
            0x00ff_ffff,
        ] {
            let dst = IpAddr::V4(Ipv4Addr::from((base + 1) << 24 | low));
            let f = Flow {
                src: v4("1.2.3.4"),
                dst,
                proto: 6,
                sport: Some(1),
                dport: Some(1),
            };
            assert_eq!(t.lookup(vni(1), &f), linear(&entries, &f), "{f:?}");
        }
    }
}

// ---- the index equals a linear scan on random tables ----

/// Addresses from a small space so that ranges overlap, nest and coincide often.
fn arb_v4_range() -> impl Strategy<Value = AddrRange> {
    prop_oneof![
        (0u32..64, 0u32..8).prop_map(|(a, w)| {
            let s = 0x0a00_0000 + a;
            AddrRange::new(IpAddr::V4(s.into()), IpAddr::V4((s + w).into())).unwrap()
        }),
        (0u32..64, 26u8..=32).prop_map(|(a, len)| {
            AddrRange::prefix(IpAddr::V4((0x0a00_0000 + a).into()), len).unwrap()
        }),
        Just(AddrRange::V4_ANY),
    ]
}

fn arb_v6_range() -> impl Strategy<Value = AddrRange> {
    (0u128..64, 0u128..8).prop_map(|(a, w)| {
        let s = (0xfd00_u128 << 112) + a;
        AddrRange::new(IpAddr::V6(s.into()), IpAddr::V6((s + w).into())).unwrap()
    })
}

fn arb_ports() -> impl Strategy<Value = PortRange> {
    prop_oneof![
        4 => Just(PortRange::ANY),
        4 => (0u16..6, 0u16..3).prop_map(|(p, w)| PortRange::new(p, p + w).unwrap()),
        1 => Just(PortRange::OPAQUE),
    ]
}

fn arb_selector() -> impl Strategy<Value = Selector> {
    let ranges = prop_oneof![
        4 => (arb_v4_range(), arb_v4_range()),
        1 => (arb_v6_range(), arb_v6_range()),
    ];
    (
        ranges,
        prop_oneof![Just(0u8), Just(6), Just(17)],
        arb_ports(),
        arb_ports(),
    )
        .prop_map(|((dst, src), proto, sport, dport)| Selector {
            dst,
            src,
            proto,
            sport,
            dport,
        })
}

fn arb_flow() -> impl Strategy<Value = Flow> {
    let addrs = prop_oneof![
        4 => (0u32..200, 0u32..200).prop_map(|(s, d)| {
            (IpAddr::V4((0x0a00_0000 + s).into()), IpAddr::V4((0x0a00_0000 + d).into()))
        }),
        1 => (0u128..80, 0u128..80).prop_map(|(s, d)| {
            (IpAddr::V6(((0xfd00_u128 << 112) + s).into()), IpAddr::V6(((0xfd00_u128 << 112) + d).into()))
        }),
    ];
    (
        addrs,
        prop_oneof![Just(6u8), Just(17), Just(1)],
        proptest::option::weighted(0.9, 0u16..8),
        proptest::option::weighted(0.9, 0u16..8),
    )
        .prop_map(|((src, dst), proto, sport, dport)| Flow {
            src,
            dst,
            proto,
            sport,
            dport,
        })
}

/// Mostly disjoint destination /28s (so layers form), plus random overlapping selectors.
fn arb_table() -> impl Strategy<Value = Vec<SelectorEntry>> {
    let disjoint = prop::collection::vec(arb_ports(), 0..12).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, dport)| {
                let base = 0x0a00_0000 + i as u32 * 16;
                Selector {
                    dst: AddrRange::prefix(IpAddr::V4(base.into()), 28).unwrap(),
                    src: AddrRange::V4_ANY,
                    proto: 0,
                    sport: PortRange::ANY,
                    dport,
                }
            })
            .collect::<Vec<_>>()
    });
    (
        disjoint,
        prop::collection::vec(arb_selector(), 0..40),
        any::<u64>(),
    )
        .prop_map(|(mut a, b, seed)| {
            a.extend(b);
            // Deterministic shuffle so indexed and fallback rules interleave in priority.
            let mut x = seed | 1;
            for i in (1..a.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                a.swap(i, (x % (i as u64 + 1)) as usize);
            }
            a.into_iter()
                .enumerate()
                .map(|(i, s)| entry(s, i as u32, i as u32 % 3))
                .collect()
        })
}

proptest! {
    #[test]
    fn index_equals_linear_scan(entries in arb_table(), flows in prop::collection::vec(arb_flow(), 1..64)) {
        let mut t = SelectorTable::new();
        t.set_vni(vni(7), entries.clone()).unwrap();
        let stats = t.index_stats(vni(7)).unwrap_or_default();
        prop_assert_eq!(stats.entries, entries.len());
        prop_assert_eq!(stats.indexed + stats.fallback, entries.len());
        for f in &flows {
            prop_assert_eq!(t.lookup(vni(7), f), linear(&entries, f), "flow {:?}", f);
        }
        // Flows inside each selector (its first addresses and ports) must agree too.
        for e in &entries {
            let s = e.selector;
            let f = Flow {
                src: s.src.start(),
                dst: s.dst.end(),
                proto: if s.proto == 0 { 6 } else { s.proto },
                sport: (s.sport != PortRange::OPAQUE).then_some(s.sport.start()),
                dport: (s.dport != PortRange::OPAQUE).then_some(s.dport.end()),
            };
            prop_assert_eq!(t.lookup(vni(7), &f), linear(&entries, &f));
            prop_assert!(t.lookup(vni(7), &f).is_some());
        }
    }
}

/// A traffic selector as a peer may negotiate it: addresses of either family (sometimes mixed
/// with the other side's), any protocol, ports "any", a range, OPAQUE or reversed.
fn arb_ts() -> impl Strategy<Value = TrafficSelector> {
    let v4 = (0u32..16, 0u32..8).prop_map(|(a, w)| {
        let s = 0x0a00_0000 + a;
        (IpAddr::V4(s.into()), IpAddr::V4((s + w).into()))
    });
    let v6 = (0u128..16, 0u128..8).prop_map(|(a, w)| {
        let s = (0xfd00_u128 << 112) + a;
        (IpAddr::V6(s.into()), IpAddr::V6((s + w).into()))
    });
    let ports = prop_oneof![
        3 => Just((0u16, 65535u16)),
        3 => (0u16..6, 0u16..3).prop_map(|(p, w)| (p, p + w)),
        1 => Just((65535, 0)),
        1 => (1u16..6).prop_map(|p| (p, p - 1)),
    ];
    (
        prop_oneof![4 => v4, 1 => v6],
        prop_oneof![Just(0u8), Just(1), Just(6), Just(17), Just(58)],
        ports,
    )
        .prop_map(
            |((start, end), ip_proto, (start_port, end_port))| TrafficSelector {
                ip_proto,
                start_port,
                end_port,
                start,
                end,
            },
        )
}

/// Flows in the small address space of [`arb_ts`], so that most selectors cover some of them,
/// with ports often absent (fragments, protocols without ports).
fn arb_dense_flow() -> impl Strategy<Value = Flow> {
    let addrs = prop_oneof![
        4 => (0u32..24, 0u32..24).prop_map(|(s, d)| {
            (IpAddr::V4((0x0a00_0000 + s).into()), IpAddr::V4((0x0a00_0000 + d).into()))
        }),
        1 => (0u128..24, 0u128..24).prop_map(|(s, d)| {
            let base = 0xfd00_u128 << 112;
            (IpAddr::V6((base + s).into()), IpAddr::V6((base + d).into()))
        }),
    ];
    let port = || proptest::option::weighted(0.7, 0u16..8);
    (
        addrs,
        prop_oneof![Just(1u8), Just(6), Just(17), Just(47), Just(58)],
        port(),
        port(),
    )
        .prop_map(|((src, dst), proto, sport, dport)| Flow {
            src,
            dst,
            proto,
            sport,
            dport,
        })
}

proptest! {
    /// One meaning of a selector match: the steer node's compiled selector (and its index)
    /// covers a flow exactly when the negotiated traffic selectors do, as the data node checks
    /// them (`TrafficSelector::covers` on both sides); a pair that cannot be compiled covers
    /// nothing.
    #[test]
    fn steering_agrees_with_the_negotiated_selectors(
        pairs in prop::collection::vec((arb_ts(), arb_ts()), 1..6),
        flows in prop::collection::vec(arb_dense_flow(), 1..48),
    ) {
        let compiled: Vec<Option<Selector>> = pairs
            .iter()
            .map(|(local, remote)| Selector::from_traffic_selectors(local, remote).ok())
            .collect();
        let entries: Vec<SelectorEntry> = compiled
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|s| entry(s, i as u32, 1)))
            .filter(|e| e.selector.src.is_ipv4() == e.selector.dst.is_ipv4())
            .collect();
        let mut t = SelectorTable::new();
        t.set_vni(vni(9), entries).unwrap();
        for f in &flows {
            for ((local, remote), s) in pairs.iter().zip(&compiled) {
                let negotiated = local.covers(f.src, f.proto, f.sport)
                    && remote.covers(f.dst, f.proto, f.dport);
                let steered = s.is_some_and(|s| s.matches(f));
                prop_assert_eq!(steered, negotiated, "{:?} -> {:?} for {:?}", local, remote, f);
            }
            let first = pairs.iter().position(|(l, r)| {
                l.covers(f.src, f.proto, f.sport) && r.covers(f.dst, f.proto, f.dport)
            });
            prop_assert_eq!(t.lookup(vni(9), f).map(|e| e.tunnel.map_or(usize::MAX, |t| t.0 as usize)), first);
        }
    }
}
