//! Round trips through the protocol's messages for every conversion (property tests), the
//! errors bad fields produce, and arbitrary messages never causing a panic.

use super::*;
use proptest::prelude::*;
use proptest::sample::select;
use std::net::{Ipv6Addr, SocketAddrV6};

// ---------------------------------------------------------------------------------------------
// Strategies

fn arb_ip(v6: bool) -> BoxedStrategy<IpAddr> {
    if v6 {
        any::<u128>()
            .prop_map(|a| IpAddr::V6(Ipv6Addr::from(a)))
            .boxed()
    } else {
        any::<u32>()
            .prop_map(|a| IpAddr::V4(Ipv4Addr::from(a)))
            .boxed()
    }
}

fn arb_unicast(v6: bool) -> BoxedStrategy<IpAddr> {
    arb_ip(v6)
        .prop_filter("unicast", |ip| is_unicast(*ip))
        .boxed()
}

fn arb_socket(v6: bool) -> BoxedStrategy<SocketAddr> {
    (
        arb_unicast(v6),
        1..=u16::MAX,
        prop_oneof![Just(0u32), any::<u32>()],
    )
        .prop_map(|(ip, port, scope)| match ip {
            IpAddr::V4(_) => SocketAddr::new(ip, port),
            // The flow label is not carried; a scope id is.
            IpAddr::V6(a) => SocketAddr::V6(SocketAddrV6::new(a, port, 0, scope)),
        })
        .boxed()
}

/// Two addresses of one family, in order.
fn arb_range(v6: bool) -> BoxedStrategy<(IpAddr, IpAddr)> {
    (arb_ip(v6), arb_ip(v6))
        .prop_map(|(a, b)| if a <= b { (a, b) } else { (b, a) })
        .boxed()
}

fn arb_ports() -> impl Strategy<Value = (u16, u16)> {
    prop_oneof![
        (any::<u16>(), any::<u16>()).prop_map(|(a, b)| (a.min(b), a.max(b))),
        Just((0, u16::MAX)),
    ]
}

fn arb_ts_of(v6: bool) -> BoxedStrategy<TrafficSelector> {
    (
        any::<u8>(),
        prop_oneof![4 => arb_ports(), 1 => Just((u16::MAX, 0))],
        arb_range(v6),
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
        .boxed()
}

fn arb_ts() -> BoxedStrategy<TrafficSelector> {
    any::<bool>().prop_flat_map(arb_ts_of).boxed()
}

const ENCRS: [Encr; 5] = [
    Encr::AesGcm16_128,
    Encr::AesGcm16_256,
    Encr::ChaCha20Poly1305,
    Encr::AesCbc128,
    Encr::AesCbc256,
];
const INTEGS: [Integ; 4] = [
    Integ::HmacSha1_96,
    Integ::HmacSha256_128,
    Integ::HmacSha384_192,
    Integ::HmacSha512_256,
];
const GROUPS: [DhGroup; 4] = [
    DhGroup::Modp2048,
    DhGroup::Ecp256,
    DhGroup::Ecp384,
    DhGroup::Curve25519,
];

fn arb_key(len: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), len)
}

/// Transforms with keys of the right lengths: (encr, integ, [in encr, in integ, out encr,
/// out integ]).
fn arb_transforms() -> impl Strategy<Value = (Encr, Option<Integ>, [Vec<u8>; 4])> {
    (select(&ENCRS[..]), select(&INTEGS[..]))
        .prop_map(|(e, i)| (e, (!e.is_aead()).then_some(i)))
        .prop_flat_map(|(e, i)| {
            let il = i.map_or(0, Integ::key_len);
            (
                Just(e),
                Just(i),
                arb_key(e.keymat_len()),
                arb_key(il),
                arb_key(e.keymat_len()),
                arb_key(il),
            )
        })
        .prop_map(|(e, i, a, b, c, d)| (e, i, [a, b, c, d]))
}

#[derive(Debug, Clone)]
struct ChildParts {
    tunnel: u32,
    ike: (u64, u64),
    spis: (u32, u32),
    transforms: (Encr, Option<Integ>, [Vec<u8>; 4]),
    esn: bool,
    pfs: Option<DhGroup>,
    ts: (Vec<TrafficSelector>, Vec<TrafficSelector>),
    addrs: (SocketAddr, SocketAddr),
    replay_window: u32,
    replaces: Option<u32>,
    outbound_active: bool,
    proposal: String,
}

impl ChildParts {
    fn build(self) -> ChildSaInfo {
        let [ie, ii, oe, oi] = self.transforms.2;
        ChildSaInfo {
            tunnel: TunnelId(self.tunnel),
            ike: IkeSpis {
                initiator: IkeSpi(self.ike.0),
                responder: IkeSpi(self.ike.1),
            },
            inbound_spi: EspSpi(self.spis.0),
            outbound_spi: EspSpi(self.spis.1),
            encr: self.transforms.0,
            integ: self.transforms.1,
            esn: self.esn,
            pfs: self.pfs,
            keys: ChildKeys {
                inbound_encr: Zeroizing::new(ie),
                inbound_integ: Zeroizing::new(ii),
                outbound_encr: Zeroizing::new(oe),
                outbound_integ: Zeroizing::new(oi),
            },
            local_ts: self.ts.0,
            remote_ts: self.ts.1,
            local: self.addrs.0,
            remote: self.addrs.1,
            replay_window: self.replay_window,
            replaces: self.replaces.filter(|r| *r != self.spis.0).map(EspSpi),
            outbound_active: self.outbound_active,
            proposal: self.proposal,
        }
    }
}

fn arb_child() -> impl Strategy<Value = ChildParts> {
    let spi = 256..=u32::MAX;
    (
        (
            any::<u32>(),
            (1..=u64::MAX, 1..=u64::MAX),
            (spi.clone(), spi.clone()),
            arb_transforms(),
            any::<bool>(),
            proptest::option::of(select(&GROUPS[..])),
        ),
        (
            (
                proptest::collection::vec(arb_ts(), 1..4),
                proptest::collection::vec(arb_ts(), 1..4),
            ),
            any::<bool>().prop_flat_map(|v6| (arb_socket(v6), arb_socket(v6))),
            any::<u32>(),
            proptest::option::of(spi),
            any::<bool>(),
            "[ -~]{0,40}",
        ),
    )
        .prop_map(
            |(
                (tunnel, ike, spis, transforms, esn, pfs),
                (ts, addrs, replay_window, replaces, outbound_active, proposal),
            )| ChildParts {
                tunnel,
                ike,
                spis,
                transforms,
                esn,
                pfs,
                ts,
                addrs,
                replay_window,
                replaces,
                outbound_active,
                proposal,
            },
        )
}

fn arb_name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,11}"
}

fn arb_route(v6_hosts: bool) -> impl Strategy<Value = Route> {
    (
        any::<bool>(),
        any::<u128>(),
        0u8..=128,
        arb_unicast(v6_hosts),
    )
        .prop_map(|(v6, bits, len, host)| {
            if v6 {
                let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                Route {
                    prefix: IpAddr::V6(Ipv6Addr::from(bits & mask)),
                    len,
                    host,
                }
            } else {
                let len = len % 33;
                let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                Route {
                    prefix: IpAddr::V4(Ipv4Addr::from(bits as u32 & mask)),
                    len,
                    host,
                }
            }
        })
}

fn arb_gateways() -> impl Strategy<Value = Vec<IpAddr>> {
    prop_oneof![
        arb_unicast(false).prop_map(|a| vec![a]),
        arb_unicast(true).prop_map(|a| vec![a]),
        (arb_unicast(false), arb_unicast(true)).prop_map(|(a, b)| vec![a, b]),
        (arb_unicast(true), arb_unicast(false)).prop_map(|(a, b)| vec![a, b]),
    ]
}

/// A VNet on `vtep`.
fn arb_vnet(vtep: IpAddr) -> impl Strategy<Value = VnetConfig> {
    (
        arb_name(),
        arb_name(),
        0..=Vni::MAX,
        arb_gateways(),
        proptest::collection::vec(arb_route(vtep.is_ipv6()), 0..4),
    )
        .prop_map(move |(tenant, name, vni, gateway_ips, routes)| VnetConfig {
            tenant,
            name,
            vni,
            gateway_ips,
            vtep,
            routes,
        })
}

/// A consistent inside configuration: distinct VNIs, names and tunnels; bindings into existing
/// VNets of their tenant.
fn arb_data_config() -> impl Strategy<Value = (IpAddr, Vec<VnetConfig>, Vec<TunnelBinding>)> {
    any::<bool>()
        .prop_flat_map(arb_unicast)
        .prop_flat_map(|vtep| {
            (
                Just(vtep),
                proptest::collection::vec(arb_vnet(vtep), 0..4),
                proptest::collection::vec((any::<u32>(), arb_name(), any::<u8>()), 0..6),
            )
        })
        .prop_map(|(vtep, mut vnets, raw)| {
            for (i, v) in vnets.iter_mut().enumerate() {
                v.vni = (v.vni & !0xf) | i as u32;
                v.name = format!("{}-{i}", v.name);
            }
            let tunnels: Vec<TunnelBinding> = raw
                .into_iter()
                .enumerate()
                .map(|(i, (id, name, pick))| {
                    let (tenant, inside) = match (pick as usize).checked_rem(vnets.len() + 1) {
                        Some(k) if k < vnets.len() => (vnets[k].tenant.clone(), Inside::Vnet(k)),
                        _ => (format!("t{pick}"), Inside::Tun),
                    };
                    TunnelBinding {
                        tunnel: TunnelId(id.wrapping_mul(8).wrapping_add(i as u32)),
                        name,
                        tenant,
                        inside,
                    }
                })
                .collect();
            (vtep, vnets, tunnels)
        })
        .prop_filter("distinct tunnel ids", |(_, _, tunnels)| {
            tunnels
                .iter()
                .enumerate()
                .all(|(i, t)| tunnels[..i].iter().all(|o| o.tunnel != t.tunnel))
        })
}

fn arb_addr_range(v6: bool) -> impl Strategy<Value = AddrRange> {
    arb_range(v6).prop_map(|(a, b)| AddrRange::new(a, b).expect("ordered range"))
}

fn arb_port_range() -> impl Strategy<Value = PortRange> {
    arb_ports().prop_map(|(a, b)| PortRange::new(a, b).expect("ordered ports"))
}

fn arb_selector_entry() -> impl Strategy<Value = SelectorEntry> {
    any::<bool>()
        .prop_flat_map(|v6| {
            (
                arb_addr_range(v6),
                arb_addr_range(v6),
                any::<u8>(),
                arb_port_range(),
                arb_port_range(),
                any::<u32>(),
                any::<u32>(),
            )
        })
        .prop_map(
            |(dst, src, proto, sport, dport, tunnel, node)| SelectorEntry {
                selector: steer::Selector {
                    dst,
                    src,
                    proto,
                    sport,
                    dport,
                },
                tunnel: steer::TunnelId(tunnel),
                node: NodeId(node),
            },
        )
}

// ---------------------------------------------------------------------------------------------
// Round trips

fn assert_same_child(a: &ChildSaInfo, b: &ChildSaInfo) {
    assert_eq!(a.tunnel, b.tunnel);
    assert_eq!(a.ike, b.ike);
    assert_eq!(a.inbound_spi, b.inbound_spi);
    assert_eq!(a.outbound_spi, b.outbound_spi);
    assert_eq!(a.encr, b.encr);
    assert_eq!(a.integ, b.integ);
    assert_eq!(a.esn, b.esn);
    assert_eq!(a.pfs, b.pfs);
    assert_eq!(*a.keys.inbound_encr, *b.keys.inbound_encr);
    assert_eq!(*a.keys.inbound_integ, *b.keys.inbound_integ);
    assert_eq!(*a.keys.outbound_encr, *b.keys.outbound_encr);
    assert_eq!(*a.keys.outbound_integ, *b.keys.outbound_integ);
    assert_eq!(a.local_ts, b.local_ts);
    assert_eq!(a.remote_ts, b.remote_ts);
    assert_eq!(a.local, b.local);
    assert_eq!(a.remote, b.remote);
    assert_eq!(a.replay_window, b.replay_window);
    assert_eq!(a.replaces, b.replaces);
    assert_eq!(a.outbound_active, b.outbound_active);
    assert_eq!(a.proposal, b.proposal);
}

proptest! {
    #[test]
    fn socket_addr_round_trip(addr in any::<bool>().prop_flat_map(arb_socket)) {
        let text = socket_addr_to_pb(addr);
        prop_assert_eq!(socket_addr_from_pb("a", &text), Ok(addr));
    }

    #[test]
    fn esp_spi_round_trip(spi in 256..=u32::MAX) {
        prop_assert_eq!(esp_spi_from_pb("spi", esp_spi_to_pb(EspSpi(spi))), Ok(EspSpi(spi)));
    }

    #[test]
    fn traffic_selector_round_trip(ts in arb_ts()) {
        prop_assert_eq!(traffic_selector_from_pb(&traffic_selector_to_pb(&ts)), Ok(ts));
    }

    #[test]
    fn child_round_trip(parts in arb_child()) {
        let info = parts.build();
        let msg = child_to_pb(&info);
        let back = child_from_pb(msg.clone()).expect("a valid CHILD_SA converts back");
        assert_same_child(&info, &back);
        prop_assert_eq!(child_to_pb(&back), msg);
    }

    #[test]
    fn installed_round_trip(parts in arb_child(), sending in any::<bool>()) {
        let info = parts.build();
        let held = datapath::InstalledChild {
            tunnel: info.tunnel,
            ike: info.ike,
            inbound_spi: info.inbound_spi,
            outbound_spi: info.outbound_spi,
            local: info.local,
            remote: info.remote,
            local_ts: info.local_ts.clone(),
            remote_ts: info.remote_ts.clone(),
            sending,
        };
        let msg = installed_to_pb(&held);
        prop_assert_eq!(installed_from_pb(&msg).expect("converts back"), held);
        let mut bad = msg.clone();
        bad.inbound_spi = 7;
        prop_assert!(installed_from_pb(&bad).is_err(), "reserved SPI");
        let mut bad = msg;
        bad.local_ts.clear();
        prop_assert!(installed_from_pb(&bad).is_err(), "no selectors");
    }

    #[test]
    fn route_round_trip(route in any::<bool>().prop_flat_map(arb_route)) {
        prop_assert_eq!(route_from_pb(&route_to_pb(&route)), Ok(route));
    }

    #[test]
    fn vnet_round_trip(vnet in any::<bool>().prop_flat_map(arb_unicast).prop_flat_map(arb_vnet)) {
        let msg = vnet_to_pb(&vnet);
        prop_assert_eq!(vnet_from_pb(&msg, vnet.vtep), Ok(vnet));
    }

    #[test]
    fn data_config_round_trip((vtep, vnets, tunnels) in arb_data_config()) {
        let msg = data_config_to_pb(&vnets, &tunnels);
        for (t, m) in tunnels.iter().zip(&msg.tunnels) {
            prop_assert_eq!(tunnel_binding_from_pb(m), Ok(t.clone()));
        }
        prop_assert_eq!(data_config_from_pb(&msg, vtep), Ok((vnets, tunnels)));
    }

    #[test]
    fn steer_spi_round_trip(spi in 256..=u32::MAX, node in any::<u32>(), tunnel in any::<u32>()) {
        let entry = SpiEntry { node: NodeId(node), tunnel: steer::TunnelId(tunnel) };
        prop_assert_eq!(
            steer_spi_from_pb(&steer_spi_to_pb(EspSpi(spi), &entry)),
            Ok((EspSpi(spi), entry))
        );
    }

    #[test]
    fn selector_round_trip(entry in arb_selector_entry()) {
        prop_assert_eq!(selector_from_pb(&selector_to_pb(&entry)), Ok(entry));
    }

    #[test]
    fn vni_selectors_round_trip(
        vni in 0..=Vni::MAX,
        selectors in proptest::collection::vec(arb_selector_entry(), 0..5),
        nodes in proptest::collection::vec(any::<u32>(), 0..4),
        gateway_ips in arb_gateways(),
    ) {
        let value = VniSelectors {
            vni: Vni::new(vni).expect("24 bits"),
            selectors,
            neighbour_nodes: nodes.into_iter().map(NodeId).collect(),
            gateway_ips,
        };
        prop_assert_eq!(vni_selectors_from_pb(&vni_selectors_to_pb(&value)), Ok(value));
    }

    #[test]
    fn rate_limit_round_trip(
        tunnel in any::<u32>(),
        limit in proptest::option::of((1..=u64::MAX, 1..=u64::MAX, 1..=u64::MAX, 1..=u64::MAX)),
        same in any::<bool>(),
    ) {
        let tunnel = steer::TunnelId(tunnel);
        let limit = limit.map(|(bps, burst, out_bps, out_burst)| {
            let inbound = RateLimit::new(bps, burst);
            let outbound = if same { inbound } else { RateLimit::new(out_bps, out_burst) };
            steer::TunnelLimit { inbound, outbound }
        });
        let msg = rate_limit_to_pb(tunnel, limit).expect("expressible");
        prop_assert_eq!(rate_limit_from_pb(&msg), Ok((tunnel, limit)));
    }

    #[test]
    fn share_round_trip(
        tunnel in any::<u32>(),
        share in proptest::option::of((1..=u64::MAX, 1..=u64::MAX, 1..=u64::MAX, 0..=u64::MAX)),
    ) {
        let tunnel = steer::TunnelId(tunnel);
        let share = share.map(|(bps, burst, out_bps, fallback)| steer::Share {
            limit: steer::TunnelLimit {
                inbound: RateLimit::new(bps, burst),
                outbound: RateLimit::new(out_bps, burst),
            },
            fallback_bits_per_second: fallback,
        });
        let msg = share_to_pb(tunnel, share).expect("expressible");
        prop_assert_eq!(share_from_pb(&msg), Ok((tunnel, share)));
    }

    #[test]
    fn selector_entry_of_traffic_selectors_matches_steer(
        (local, remote) in any::<bool>().prop_flat_map(|v6| (arb_ts_of(v6), arb_ts_of(v6))),
        node in any::<u32>(),
    ) {
        let ours = selector_entry(&local, &remote, steer::TunnelId(3), NodeId(node));
        let wire = |t: &TrafficSelector| wire::ike::TrafficSelector {
            ip_proto: t.ip_proto,
            start_port: t.start_port,
            end_port: t.end_port,
            start: t.start,
            end: t.end,
        };
        let theirs = steer::Selector::from_traffic_selectors(&wire(&local), &wire(&remote));
        match (ours, theirs) {
            (Ok(e), Ok(s)) => prop_assert_eq!(e.selector, s),
            (Err(_), Err(_)) => {}
            (a, b) => prop_assert!(false, "disagree: {:?} vs {:?}", a, b),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Arbitrary input never panics

/// Text that is sometimes an address, sometimes almost one.
fn arb_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9a-f.:/\\[\\]%-]{0,24}",
        any::<bool>()
            .prop_flat_map(arb_socket)
            .prop_map(|a| a.to_string()),
        any::<bool>()
            .prop_flat_map(arb_ip)
            .prop_map(|a| a.to_string()),
        (any::<bool>().prop_flat_map(arb_ip), 0u8..140).prop_map(|(a, l)| format!("{a}/{l}")),
    ]
}

fn arb_small() -> impl Strategy<Value = u32> {
    prop_oneof![any::<u32>(), 0u32..300, 65530u32..65540, Just(Vni::MAX + 1)]
}

fn arb_pb_ts() -> impl Strategy<Value = pb::TrafficSelector> {
    (
        arb_small(),
        arb_small(),
        arb_small(),
        arb_text(),
        arb_text(),
    )
        .prop_map(
            |(ip_proto, start_port, end_port, start, end)| pb::TrafficSelector {
                ip_proto,
                start_port,
                end_port,
                start,
                end,
            },
        )
}

proptest! {
    #[test]
    fn arbitrary_child_never_panics(
        ints in proptest::collection::vec(arb_small(), 8),
        spis in (any::<u64>(), any::<u64>()),
        opts in (proptest::option::of(arb_small()), proptest::option::of(arb_small()),
                 proptest::option::of(arb_small())),
        keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..70), 4),
        ts in (proptest::collection::vec(arb_pb_ts(), 0..3),
               proptest::collection::vec(arb_pb_ts(), 0..3)),
        addrs in (arb_text(), arb_text()),
    ) {
        let msg = pb::ChildSa {
            tunnel: ints[0],
            ike_initiator_spi: spis.0,
            ike_responder_spi: spis.1,
            inbound_spi: ints[1],
            outbound_spi: ints[2],
            encr: ints[3] % 40,
            encr_key_bits: ints[4],
            integ: opts.0.map(|i| i % 20),
            esn: ints[5] % 2 == 0,
            pfs: opts.1.map(|g| g % 40),
            inbound_encr_key: keys[0].clone(),
            inbound_integ_key: keys[1].clone(),
            outbound_encr_key: keys[2].clone(),
            outbound_integ_key: keys[3].clone(),
            local_ts: ts.0,
            remote_ts: ts.1,
            local: addrs.0,
            remote: addrs.1,
            replay_window: ints[6],
            replaces: opts.2,
            outbound_active: ints[7] % 2 == 0,
            proposal: String::new(),
        };
        if let Err(e) = child_from_pb(msg) {
            prop_assert!(!e.field.is_empty() && !e.reason.is_empty());
        }
    }

    #[test]
    fn arbitrary_data_config_never_panics(
        vnets in proptest::collection::vec(
            ("[a-z]{0,3}", "[a-z]{0,3}", arb_small(),
             proptest::collection::vec(arb_text(), 0..3),
             proptest::collection::vec((arb_text(), arb_text()), 0..3)),
            0..3),
        tunnels in proptest::collection::vec(
            (arb_small(), "[a-z]{0,3}", "[a-z]{0,3}", proptest::option::of(0u32..5)), 0..4),
        vtep in any::<bool>().prop_flat_map(arb_ip),
    ) {
        let msg = pb::DataConfig {
            vnets: vnets
                .into_iter()
                .map(|(tenant, name, vni, gateway_ips, routes)| pb::Vnet {
                    tenant,
                    name,
                    vni,
                    gateway_ips,
                    routes: routes
                        .into_iter()
                        .map(|(prefix, host)| pb::Route { prefix, host })
                        .collect(),
                })
                .collect(),
            tunnels: tunnels
                .into_iter()
                .map(|(tunnel, name, tenant, vnet)| pb::TunnelBinding { tunnel, name, tenant, vnet })
                .collect(),
        };
        if let Err(e) = data_config_from_pb(&msg, vtep) {
            prop_assert!(!e.field.is_empty() && !e.reason.is_empty());
        }
    }

    #[test]
    fn arbitrary_steer_messages_never_panic(
        texts in proptest::collection::vec(arb_text(), 4),
        ints in proptest::collection::vec(arb_small(), 8),
        limit in (any::<u64>(), prop_oneof![Just(0u64), any::<u64>()]),
    ) {
        let selector = pb::Selector {
            dst_start: texts[0].clone(),
            dst_end: texts[1].clone(),
            src_start: texts[2].clone(),
            src_end: texts[3].clone(),
            proto: ints[0],
            sport_start: ints[1],
            sport_end: ints[2],
            dport_start: ints[3],
            dport_end: ints[4],
            tunnel: ints[5],
            node: ints[6],
        };
        let _ = selector_from_pb(&selector);
        let _ = vni_selectors_from_pb(&pb::VniSelectors {
            vni: ints[7],
            selectors: vec![selector],
            neighbour_nodes: vec![ints[0]],
            gateway_ips: texts.clone(),
        });
        let _ = steer_spi_from_pb(&pb::SteerSpi { spi: ints[0], node: ints[1], tunnel: ints[2] });
        let _ = rate_limit_from_pb(&pb::RateLimit {
            tunnel: ints[3],
            bits_per_second: limit.0 % 3,
            burst_bytes: limit.1,
            outbound_bits_per_second: limit.1 % 3,
            outbound_burst_bytes: limit.0,
            fallback_bits_per_second: limit.0 % 2,
        });
        for t in &texts {
            let _ = socket_addr_from_pb("a", t);
            let _ = route_from_pb(&pb::Route { prefix: t.clone(), host: t.clone() });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Errors name the field

fn v4(s: &str) -> IpAddr {
    s.parse().expect("address")
}

fn ts(start: &str, end: &str) -> pb::TrafficSelector {
    pb::TrafficSelector {
        ip_proto: 0,
        start_port: 0,
        end_port: 65535,
        start: start.into(),
        end: end.into(),
    }
}

/// A valid AES-GCM-16-256 CHILD_SA message.
fn good_child() -> pb::ChildSa {
    pb::ChildSa {
        tunnel: 1,
        ike_initiator_spi: 0x1122,
        ike_responder_spi: 0x3344,
        inbound_spi: 0xc000_0001,
        outbound_spi: 0xc000_0002,
        encr: 20,
        encr_key_bits: 256,
        integ: None,
        esn: false,
        pfs: None,
        inbound_encr_key: vec![1; 36],
        inbound_integ_key: Vec::new(),
        outbound_encr_key: vec![2; 36],
        outbound_integ_key: Vec::new(),
        local_ts: vec![ts("10.1.0.0", "10.1.0.255")],
        remote_ts: vec![ts("10.2.0.0", "10.2.0.255")],
        local: "192.0.2.1:4500".into(),
        remote: "198.51.100.7:4500".into(),
        replay_window: 1024,
        replaces: None,
        outbound_active: true,
        proposal: "AES_GCM_16_256/NO_EXT_SEQ".into(),
    }
}

/// The field path of `child_from_pb(change(good_child()))`'s error, checking that the reason
/// contains `reason`.
fn child_error(change: impl FnOnce(&mut pb::ChildSa), reason: &str) -> String {
    let mut msg = good_child();
    change(&mut msg);
    let e = child_from_pb(msg).expect_err("must be refused");
    assert!(e.reason.contains(reason), "{e}: expected {reason:?}");
    e.field
}

#[test]
fn good_child_converts() {
    let info = child_from_pb(good_child()).expect("valid");
    assert_eq!(info.encr, Encr::AesGcm16_256);
    assert_eq!(info.keys.inbound_encr.len(), 36);
    assert_eq!(
        info.local,
        "192.0.2.1:4500".parse::<SocketAddr>().expect("addr")
    );
}

#[test]
fn child_errors_name_the_field() {
    let mut msg = good_child();
    msg.local = "x".into();
    let e = child_from_pb(msg)
        .expect_err("bad local")
        .context("install_child");
    assert_eq!(e.field, "install_child.local");
    assert!(
        e.to_string()
            .starts_with("install_child.local: invalid socket address \"x\""),
        "{e}"
    );

    type Change = Box<dyn FnOnce(&mut pb::ChildSa)>;
    let cases: Vec<(Change, &str, &str)> = vec![
        (
            Box::new(|m| m.ike_responder_spi = 0),
            "ike_responder_spi",
            "both SPIs",
        ),
        (Box::new(|m| m.inbound_spi = 0), "inbound_spi", "reserved"),
        (
            Box::new(|m| m.outbound_spi = 255),
            "outbound_spi",
            "reserved",
        ),
        (Box::new(|m| m.replaces = Some(7)), "replaces", "reserved"),
        (
            Box::new(|m| m.replaces = Some(0xc000_0001)),
            "replaces",
            "itself",
        ),
        (Box::new(|m| m.encr_key_bits = 192), "encr", "192-bit"),
        (Box::new(|m| m.encr = 70_000), "encr", "above 65535"),
        (Box::new(|m| m.encr = 3), "encr", "unsupported"),
        (
            Box::new(|m| m.encr_key_bits = 1 << 20),
            "encr_key_bits",
            "out of range",
        ),
        (Box::new(|m| m.integ = Some(12)), "integ", "AEAD"),
        (Box::new(|m| m.integ = Some(0)), "integ", "unsupported"),
        (
            Box::new(|m| {
                m.encr = 12;
                m.encr_key_bits = 128;
                m.inbound_encr_key = vec![0; 16];
                m.outbound_encr_key = vec![0; 16];
            }),
            "integ",
            "needs an integrity transform",
        ),
        (
            Box::new(|m| m.pfs = Some(99)),
            "pfs",
            "unsupported key exchange group",
        ),
        (
            Box::new(|m| m.inbound_encr_key.pop().map(drop).unwrap_or(())),
            "inbound_encr_key",
            "35 bytes",
        ),
        (
            Box::new(|m| m.outbound_integ_key = vec![0; 32]),
            "outbound_integ_key",
            "takes 0",
        ),
        (
            Box::new(|m| m.local_ts.clear()),
            "local_ts",
            "no traffic selector",
        ),
        (
            Box::new(|m| m.remote_ts.clear()),
            "remote_ts",
            "no traffic selector",
        ),
        (
            Box::new(|m| m.local_ts[0].end = "10.0.0.0".into()),
            "local_ts[0].end",
            "below start",
        ),
        (
            Box::new(|m| m.remote_ts[0].end = "::1".into()),
            "remote_ts[0].end",
            "address family",
        ),
        (
            Box::new(|m| {
                m.remote_ts[0].start_port = 80;
                m.remote_ts[0].end_port = 79;
            }),
            "remote_ts[0].end_port",
            "reversed",
        ),
        (
            Box::new(|m| m.remote_ts[0].ip_proto = 256),
            "remote_ts[0].ip_proto",
            "above 255",
        ),
        (
            Box::new(|m| m.local_ts[0].end_port = 65536),
            "local_ts[0].end_port",
            "above 65535",
        ),
        (
            Box::new(|m| m.remote = "[2001:db8::1]:4500".into()),
            "remote",
            "address family",
        ),
        (
            Box::new(|m| m.local = "192.0.2.1:0".into()),
            "local",
            "port 0",
        ),
        (
            Box::new(|m| m.local = "0.0.0.0:4500".into()),
            "local",
            "not a unicast",
        ),
        (
            Box::new(|m| m.remote = "198.51.100.7".into()),
            "remote",
            "invalid socket address",
        ),
    ];
    for (change, field, reason) in cases {
        assert_eq!(child_error(change, reason), field, "{reason}");
    }
}

#[test]
fn opaque_ports_are_a_valid_traffic_selector() {
    let mut t = ts("10.0.0.1", "10.0.0.1");
    t.start_port = 65535;
    t.end_port = 0;
    let parsed = traffic_selector_from_pb(&t).expect("OPAQUE");
    assert_eq!((parsed.start_port, parsed.end_port), (65535, 0));
}

fn good_vnet() -> pb::Vnet {
    pb::Vnet {
        tenant: "acme".into(),
        name: "prod".into(),
        vni: 100,
        gateway_ips: vec!["10.1.0.1".into()],
        routes: vec![pb::Route {
            prefix: "10.1.0.0/24".into(),
            host: "172.16.0.2".into(),
        }],
    }
}

#[test]
fn data_config_errors_name_the_field() {
    let vtep = v4("172.16.0.1");
    let config =
        |vnets: Vec<pb::Vnet>, tunnels: Vec<pb::TunnelBinding>| pb::DataConfig { vnets, tunnels };
    let binding = |tunnel: u32, tenant: &str, vnet: Option<u32>| pb::TunnelBinding {
        tunnel,
        name: format!("t{tunnel}"),
        tenant: tenant.into(),
        vnet,
    };
    let fails = |c: pb::DataConfig, field: &str, reason: &str| {
        let e = data_config_from_pb(&c, vtep).expect_err(field);
        assert_eq!(e.field, field, "{e}");
        assert!(e.reason.contains(reason), "{e}: expected {reason:?}");
    };
    let (vnets, tunnels) = data_config_from_pb(
        &config(
            vec![good_vnet()],
            vec![binding(1, "acme", Some(0)), binding(2, "x", None)],
        ),
        vtep,
    )
    .expect("valid");
    assert_eq!(vnets[0].vtep, vtep);
    assert_eq!(tunnels[0].inside, Inside::Vnet(0));
    assert_eq!(tunnels[1].inside, Inside::Tun);

    let vnet = |f: fn(&mut pb::Vnet)| {
        let mut v = good_vnet();
        f(&mut v);
        config(vec![v], Vec::new())
    };
    fails(vnet(|v| v.vni = 1 << 24), "vnets[0].vni", "24 bits");
    fails(vnet(|v| v.tenant.clear()), "vnets[0].tenant", "empty");
    fails(vnet(|v| v.name.clear()), "vnets[0].name", "empty");
    fails(
        vnet(|v| v.gateway_ips.clear()),
        "vnets[0].gateway_ips",
        "needs a gateway",
    );
    fails(
        vnet(|v| v.gateway_ips.push("10.1.0.2".into())),
        "vnets[0].gateway_ips",
        "at most one",
    );
    fails(
        vnet(|v| v.gateway_ips[0] = "224.0.0.1".into()),
        "vnets[0].gateway_ips[0]",
        "unicast",
    );
    fails(
        vnet(|v| v.gateway_ips[0] = "nope".into()),
        "vnets[0].gateway_ips[0]",
        "invalid IP",
    );
    fails(
        vnet(|v| v.routes[0].prefix = "10.1.0.1/24".into()),
        "vnets[0].routes[0].prefix",
        "host bits",
    );
    fails(
        vnet(|v| v.routes[0].prefix = "10.1.0.0/33".into()),
        "vnets[0].routes[0].prefix",
        "longer",
    );
    fails(
        vnet(|v| v.routes[0].prefix = "10.1.0.0".into()),
        "vnets[0].routes[0].prefix",
        "ADDRESS/LENGTH",
    );
    fails(
        vnet(|v| v.routes[0].host = "2001:db8::2".into()),
        "vnets[0].routes[0].host",
        "VTEP",
    );
    fails(
        vnet(|v| v.routes[0].host = "0.0.0.0".into()),
        "vnets[0].routes[0].host",
        "unicast",
    );

    let mut twin = good_vnet();
    twin.name = "test".into();
    fails(
        config(vec![good_vnet(), twin.clone()], Vec::new()),
        "vnets[1].vni",
        "also vnets[0]",
    );
    twin.vni = 101;
    twin.name = "prod".into();
    fails(
        config(vec![good_vnet(), twin], Vec::new()),
        "vnets[1].name",
        "also vnets[0]",
    );

    fails(
        config(vec![good_vnet()], vec![binding(1, "acme", Some(1))]),
        "tunnels[0].vnet",
        "does not exist",
    );
    fails(
        config(vec![good_vnet()], vec![binding(1, "other", Some(0))]),
        "tunnels[0].vnet",
        "tenant",
    );
    fails(
        config(vec![], vec![binding(1, "a", None), binding(1, "b", None)]),
        "tunnels[1].tunnel",
        "also bound",
    );
    fails(
        config(vec![], vec![binding(1, "", None)]),
        "tunnels[0].tenant",
        "empty",
    );

    let e = vnet_from_pb(&good_vnet(), v4("0.0.0.0")).expect_err("bad VTEP");
    assert_eq!(e.field, "vtep");
}

#[test]
fn steer_errors_name_the_field() {
    let good = pb::Selector {
        dst_start: "10.2.0.0".into(),
        dst_end: "10.2.0.255".into(),
        src_start: "10.1.0.0".into(),
        src_end: "10.1.0.255".into(),
        proto: 6,
        sport_start: 0,
        sport_end: 65535,
        dport_start: 443,
        dport_end: 443,
        tunnel: 1,
        node: 2,
    };
    let entry = selector_from_pb(&good).expect("valid");
    assert_eq!(entry.selector.dport, PortRange::single(443));
    let fails = |f: fn(&mut pb::Selector), field: &str| {
        let mut s = good.clone();
        f(&mut s);
        let e = selector_from_pb(&s).expect_err(field);
        assert_eq!(e.field, field, "{e}");
    };
    fails(|s| s.dst_end = "::1".into(), "dst_end");
    fails(|s| s.dst_end = "10.1.0.0".into(), "dst_end");
    fails(|s| s.src_start = "bad".into(), "src_start");
    fails(
        |s| {
            s.src_start = "::".into();
            s.src_end = "::1".into()
        },
        "src_start",
    );
    fails(|s| s.proto = 300, "proto");
    fails(|s| s.sport_start = 70_000, "sport_start");
    fails(|s| s.dport_start = 444, "dport_end");

    let e = vni_selectors_from_pb(&pb::VniSelectors {
        vni: 7,
        selectors: vec![
            good.clone(),
            pb::Selector {
                proto: 256,
                ..good.clone()
            },
        ],
        neighbour_nodes: vec![],
        gateway_ips: vec![],
    })
    .expect_err("bad second selector");
    assert_eq!(e.field, "selectors[1].proto");
    let e = vni_selectors_from_pb(&pb::VniSelectors {
        vni: 1 << 24,
        ..Default::default()
    })
    .expect_err("bad VNI");
    assert_eq!(e.field, "vni");

    let e = steer_spi_from_pb(&pb::SteerSpi {
        spi: 200,
        node: 1,
        tunnel: 1,
    })
    .expect_err("reserved");
    assert_eq!(e.field, "spi");

    let limit = |bits_per_second, burst_bytes| pb::RateLimit {
        tunnel: 1,
        bits_per_second,
        burst_bytes,
        ..pb::RateLimit::default()
    };
    assert_eq!(
        rate_limit_from_pb(&limit(0, 0)),
        Ok((steer::TunnelId(1), None))
    );
    assert_eq!(
        rate_limit_from_pb(&limit(0, 5))
            .expect_err("burst without rate")
            .field,
        "burst_bytes"
    );
    assert_eq!(
        rate_limit_from_pb(&limit(5, 0))
            .expect_err("no burst")
            .field,
        "burst_bytes"
    );
    assert!(rate_limit_to_pb(steer::TunnelId(1), Some(RateLimit::new(0, 1500).into())).is_err());
    assert!(rate_limit_to_pb(steer::TunnelId(1), Some(RateLimit::new(1, 0).into())).is_err());
    // Directions apart: outbound without inbound, and an outbound burst without a rate.
    let outbound_only = pb::RateLimit {
        outbound_bits_per_second: 5,
        outbound_burst_bytes: 1500,
        ..limit(0, 0)
    };
    assert_eq!(
        rate_limit_from_pb(&outbound_only)
            .expect_err("no inbound limit")
            .field,
        "outbound_bits_per_second"
    );
    let burst_only = pb::RateLimit {
        outbound_burst_bytes: 1500,
        ..limit(5, 1500)
    };
    assert_eq!(
        rate_limit_from_pb(&burst_only)
            .expect_err("outbound burst without rate")
            .field,
        "outbound_burst_bytes"
    );
    let both = pb::RateLimit {
        outbound_bits_per_second: 7,
        outbound_burst_bytes: 3000,
        ..limit(5, 1500)
    };
    let fallback_only = pb::RateLimit {
        fallback_bits_per_second: 5,
        ..limit(0, 0)
    };
    assert_eq!(
        share_from_pb(&fallback_only)
            .expect_err("a fallback without a limit")
            .field,
        "fallback_bits_per_second"
    );
    assert_eq!(
        rate_limit_from_pb(&both),
        Ok((
            steer::TunnelId(1),
            Some(steer::TunnelLimit {
                inbound: RateLimit::new(5, 1500),
                outbound: RateLimit::new(7, 3000),
            })
        ))
    );
}

#[test]
fn selector_entry_refuses_what_cannot_be_steered() {
    let t = |s: &str| ike::TrafficSelector::parse(s).expect("selector");
    let e = selector_entry(
        &t("10.1.0.0/24[tcp]"),
        &t("10.2.0.0/24[udp]"),
        steer::TunnelId(1),
        NodeId(1),
    )
    .expect_err("protocols differ");
    assert_eq!(e.field, "remote");
    let e = selector_entry(
        &t("10.1.0.0/24"),
        &t("2001:db8::/64"),
        steer::TunnelId(1),
        NodeId(1),
    )
    .expect_err("families differ");
    assert_eq!(e.field, "remote");
    let e = selector_entry(
        &t("10.1.0.0/24[tcp/opaque]"),
        &t("10.2.0.0/24"),
        steer::TunnelId(1),
        NodeId(1),
    )
    .expect_err("OPAQUE");
    assert_eq!(e.field, "local");
    let ok = selector_entry(
        &t("10.1.0.0/24"),
        &t("10.2.0.0/24[tcp/443]"),
        steer::TunnelId(4),
        NodeId(2),
    )
    .expect("steerable");
    assert_eq!(ok.selector.proto, 6);
    assert_eq!(ok.selector.dport, PortRange::single(443));
    assert_eq!(
        ok.selector.src,
        AddrRange::prefix(v4("10.1.0.0"), 24).expect("prefix")
    );
    assert_eq!((ok.tunnel, ok.node), (steer::TunnelId(4), NodeId(2)));
}

#[test]
fn scalar_errors() {
    assert_eq!(esp_spi_from_pb("x", 255).expect_err("reserved").field, "x");
    assert_eq!(esp_spi_from_pb("x", 256), Ok(EspSpi(256)));
    assert!(vni_from_pb("vni", Vni::MAX).is_ok());
    assert!(vni_from_pb("vni", Vni::MAX + 1).is_err());
    for bad in [
        "",
        "1.2.3.4",
        "1.2.3.4:0",
        "[::]:1",
        "224.0.0.1:5",
        "255.255.255.255:1",
        "[::1]:70000",
    ] {
        assert!(socket_addr_from_pb("a", bad).is_err(), "{bad}");
    }
    assert_eq!(
        role_from_pb("role", pb::Role::Data as i32),
        Ok(NodeRole::Data)
    );
    assert_eq!(
        role_from_pb("role", pb::Role::Steer as i32),
        Ok(NodeRole::Steer)
    );
    assert!(role_from_pb("role", 0).is_err());
    assert!(role_from_pb("role", 9).is_err());
    assert_eq!(role_to_pb(NodeRole::Control), None);
    assert_eq!(role_to_pb(NodeRole::Steer), Some(pb::Role::Steer));
    let e = ConvertError::new("", "bad").context("a").context("b[2]");
    assert_eq!(e.field, "b[2].a");
    assert_eq!(ConvertError::new("[1]", "bad").context("xs").field, "xs[1]");
}
