//! Arbitrary input never panics: any protobuf message converts or is refused with an error.

use super::*;

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
                    router_mac: None,
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
        ints in proptest::collection::vec(arb_small(), 9),
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
            attachment: (ints[7] % 2 == 0).then_some(ints[8]),
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
