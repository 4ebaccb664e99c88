//! Errors name the field: each refused value says where it was.

use super::*;

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
        router_mac: None,
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
    fails(
        vnet(|v| v.tenant = "acme corp".into()),
        "vnets[0].tenant",
        "not a valid name",
    );
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
    fails(
        config(vec![], vec![binding(1, &"x".repeat(65), None)]),
        "tunnels[0].tenant",
        "not a valid name",
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
        attachment: None,
    };
    let entry = selector_from_pb(&good).expect("valid");
    let attached = selector_from_pb(&pb::Selector {
        tunnel: 0,
        attachment: Some(3),
        ..good.clone()
    })
    .expect("an attachment's prefix");
    assert_eq!((attached.tunnel, attached.node), (None, NodeId(2)));
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
    fails(|s| s.attachment = Some(3), "tunnel");

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
    // OPAQUE ports are steered (to the packets without ports), as the data node lets them
    // through its selector check.
    let opaque = selector_entry(
        &t("10.1.0.0/24[tcp/opaque]"),
        &t("10.2.0.0/24"),
        steer::TunnelId(1),
        NodeId(1),
    )
    .expect("OPAQUE is steerable");
    assert_eq!(opaque.selector.sport, PortRange::OPAQUE);
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
    assert_eq!((ok.tunnel, ok.node), (Some(steer::TunnelId(4)), NodeId(2)));
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
