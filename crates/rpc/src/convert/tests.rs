//! Round trips through the protocol's messages for every conversion (property tests), the
//! errors bad fields produce, and arbitrary messages never causing a panic.

use super::*;
use proptest::prelude::*;
use proptest::sample::select;
use std::net::{Ipv6Addr, SocketAddrV6};

mod arbitrary;
mod attachment;
mod errors;

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

fn arb_tenant() -> impl Strategy<Value = ids::TenantId> {
    arb_name().prop_map(|n| ids::TenantId::new(&n).expect("a valid tenant name"))
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
        arb_tenant(),
        arb_name(),
        0..=Vni::MAX,
        arb_gateways(),
        proptest::collection::vec(arb_route(vtep.is_ipv6()), 0..4),
        proptest::option::of(any::<[u8; 6]>().prop_map(|mut m| {
            // Unicast and not all zero.
            m[0] &= 0xfe;
            m[5] |= 1;
            m
        })),
    )
        .prop_map(
            move |(tenant, name, vni, gateway_ips, routes, router_mac)| VnetConfig {
                tenant,
                name,
                vni,
                gateway_ips,
                vtep,
                routes,
                router_mac,
            },
        )
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
                        _ => (
                            ids::TenantId::new(&format!("t{pick}")).expect("tenant"),
                            Inside::Tun,
                        ),
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
                proptest::option::of(any::<u32>()),
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
                tunnel: tunnel.map(steer::TunnelId),
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
        // A router MAC of another length, multicast or zero is refused, naming the field.
        for bad in [vec![2u8; 5], vec![1, 0, 0, 0, 0, 1], vec![0; 6]] {
            let mut m = msg.clone();
            m.router_mac = Some(bad);
            let e = vnet_from_pb(&m, vnet.vtep).unwrap_err();
            prop_assert!(e.to_string().contains("router_mac"), "{}", e);
        }
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
        let attached = SelectorEntry { tunnel: None, ..entry };
        prop_assert_eq!(
            selector_from_pb(&attachment_selector_to_pb(&entry, steer::AttachmentId(5))),
            Ok(attached)
        );
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
