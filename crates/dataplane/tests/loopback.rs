//! The data plane with real sockets and threads on loopback: a peer socket speaks ESP-in-UDP
//! (RFC 3948) to the NAT-T socket, a host socket on 127.0.0.2 plays a VXLAN VTEP (RFC 7348)
//! behind which VM 10.0.0.5 lives. Only loopback addresses are used; ports are the kernel's.

mod common;
#[path = "../src/testutil.rs"]
mod testutil;

use common::{drop_count, recv, wait_stats, Started};
use crossbeam_channel::Receiver;
use protego_dataplane::{
    DataPath, Dataplane, DataplaneConfig, DataplaneError, Inside, ToControl, TunnelBinding,
};
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testutil::{arp, ip, parse_vxlan, udp4, vxlan, Peer};
use wire::arp::{ArpOperation, ArpPacket, ArpRepr};
use wire::ethernet::EtherType;
use wire::ip::Ipv4Packet;

const VM_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 5];

struct Setup {
    dp: Arc<Dataplane>,
    rx: Receiver<ToControl>,
    host: UdpSocket,
    peer: UdpSocket,
    natt: SocketAddr,
    natt6: SocketAddr,
    ike: SocketAddr,
    vtep: SocketAddr,
}

fn setup(tunnel_inside: Inside) -> Setup {
    let Started { dp, rx, host } = common::start_beside_host(|port| DataplaneConfig {
        listen: vec![ip("127.0.0.1"), ip("::1")],
        tunnels: vec![common::site_tunnel(tunnel_inside.clone())],
        pin_workers: true,
        ..common::config(port)
    });
    let addrs = dp.local_addrs();
    Setup {
        dp,
        rx,
        host,
        peer: common::bind("127.0.0.1:0"),
        natt: addrs.natt[0],
        natt6: addrs.natt[1],
        ike: addrs.ike[0],
        vtep: addrs.vxlan[0],
    }
}

impl Setup {
    fn child(&self) -> ike::ChildSaInfo {
        common::site_child(self.natt, self.peer.local_addr().expect("addr"))
    }

    fn gw_mac(&self) -> [u8; 6] {
        self.dp.gateway_mac(0).expect("vnet 0")
    }
}

#[test]
fn esp_to_vm_and_back_through_vxlan() {
    let s = setup(Inside::Vnet(0));
    let c = s.child();
    s.dp.install_child(&c).expect("install");
    let peer = Peer::of(&c);

    // Peer -> VM: the gateway first resolves 10.0.0.5 over VXLAN.
    let inner = udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"to the vm");
    s.peer
        .send_to(&peer.seal(&inner), s.natt)
        .expect("send esp");
    let (d, from) = recv(&s.host);
    assert_eq!(from, s.vtep, "ARP comes from the VTEP socket");
    let (vni, dst, src, ty, payload) = parse_vxlan(&d);
    assert_eq!(
        (vni, dst, src, ty),
        (100, [0xff; 6], s.gw_mac(), EtherType::ARP)
    );
    let req = ArpRepr::parse(&ArpPacket::new_checked(&payload[..]).expect("arp")).expect("arp");
    assert_eq!(req.target_protocol_addr.to_string(), "10.0.0.5");
    let reply = arp(
        ArpOperation::REPLY,
        VM_MAC,
        "10.0.0.5",
        s.gw_mac(),
        "10.0.0.1",
    );
    s.host
        .send_to(
            &vxlan(100, s.gw_mac(), VM_MAC, EtherType::ARP, &reply),
            s.vtep,
        )
        .expect("send arp");
    let (d, from) = recv(&s.host);
    assert_ne!(
        from.port(),
        s.vtep.port(),
        "data uses a flow-hashed source port"
    );
    let (vni, dst, src, ty, payload) = parse_vxlan(&d);
    assert_eq!(
        (vni, dst, src, ty),
        (100, VM_MAC, s.gw_mac(), EtherType::IPV4)
    );
    let p = Ipv4Packet::new_checked(&payload[..]).expect("ipv4");
    assert_eq!(
        (p.ttl(), p.src_addr().to_string(), p.dst_addr().to_string()),
        (63, "192.168.0.9".into(), "10.0.0.5".into())
    );
    assert_eq!(&payload[28..], b"to the vm");

    // VM -> peer, a burst that leaves as GSO trains where the kernel allows.
    for i in 0..40u8 {
        let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, &[i; 1000]);
        s.host
            .send_to(
                &vxlan(100, s.gw_mac(), VM_MAC, EtherType::IPV4, &inner),
                s.vtep,
            )
            .expect("send vxlan");
    }
    let mut got = Vec::new();
    while got.len() < 40 {
        let (d, from) = recv(&s.peer);
        assert_eq!(from, s.natt, "ESP comes from the NAT-T socket");
        let inner = peer.open(&d).expect("peer opens");
        let p = Ipv4Packet::new_checked(&inner[..]).expect("ipv4");
        assert_eq!(p.ttl(), 63);
        got.push(inner[28]);
    }
    got.sort_unstable();
    assert_eq!(got, (0..40).collect::<Vec<u8>>());
    wait_stats(&s.dp, "children counted", |st| {
        st.children.len() == 1 && st.children[0].packets_in == 1 && st.children[0].packets_out == 40
    });
}

#[test]
fn malformed_replayed_and_forged_packets_are_counted() {
    let s = setup(Inside::Vnet(0));
    let c = s.child();
    s.dp.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    let good = peer.seal(&udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"x"));
    s.peer.send_to(&good, s.natt).expect("send");
    let _arp = recv(&s.host);
    s.peer.send_to(&good, s.natt).expect("replay");
    let mut forged = peer.seal(&udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"y"));
    forged[20] ^= 0x40;
    s.peer.send_to(&forged, s.natt).expect("forged");
    s.peer.send_to(&[0xff], s.natt).expect("keepalive");
    s.peer.send_to(&[9, 9], s.natt).expect("short");
    s.peer.send_to(&[0x12; 64], s.natt).expect("unknown spi");
    s.host.send_to(&[1, 2, 3], s.vtep).expect("short vxlan");
    s.host
        .send_to(
            &vxlan(555, s.gw_mac(), VM_MAC, EtherType::IPV4, &[0; 40]),
            s.vtep,
        )
        .expect("unknown vni");
    wait_stats(&s.dp, "drops counted", |st| {
        [
            "esp_replay",
            "esp_auth",
            "natt_keepalive",
            "malformed_udp",
            "esp_unknown_spi",
            "vxlan_malformed",
            "vxlan_unknown_vni",
        ]
        .iter()
        .all(|n| drop_count(st, n) == 1)
    });
    assert_eq!(s.dp.stats().children[0].drops_in, 2);
}

#[test]
fn ike_datagrams_both_ways() {
    let s = setup(Inside::Vnet(0));
    let mut marked = vec![0, 0, 0, 0];
    marked.extend_from_slice(b"ike on 4500");
    s.peer.send_to(&marked, s.natt).expect("send");
    s.peer.send_to(b"ike on 500", s.ike).expect("send");
    let mut seen = Vec::new();
    for _ in 0..2 {
        match s
            .rx
            .recv_timeout(Duration::from_secs(5))
            .expect("ToControl")
        {
            ToControl::Ike(d) => {
                assert_eq!(d.remote, s.peer.local_addr().expect("addr"));
                seen.push((d.local, d.data));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    seen.sort();
    let mut want = vec![
        (s.natt, b"ike on 4500".to_vec()),
        (s.ike, b"ike on 500".to_vec()),
    ];
    want.sort();
    assert_eq!(seen, want);

    let to = s.peer.local_addr().expect("addr");
    s.dp.send_ike(s.natt, to, b"reply").expect("send_ike natt");
    let (d, from) = recv(&s.peer);
    assert_eq!(
        (from, d),
        (s.natt, b"\0\0\0\0reply".to_vec()),
        "RFC 3948 non-ESP marker added"
    );
    s.dp.send_ike(s.natt, to, &[0xff]).expect("keepalive");
    let (d, from) = recv(&s.peer);
    assert_eq!(
        (from, d),
        (s.natt, vec![0xff]),
        "RFC 3948 §2.3 NAT keepalive: one octet, no marker"
    );
    s.dp.send_ike(s.ike, to, b"reply").expect("send_ike ike");
    let (d, from) = recv(&s.peer);
    assert_eq!((from, d), (s.ike, b"reply".to_vec()));
    let nowhere: SocketAddr = "127.0.0.1:1".parse().expect("addr");
    assert!(s.dp.send_ike(nowhere, to, b"x").is_err());
}

#[test]
fn esp_over_ipv6_outer_addresses() {
    let s = setup(Inside::Vnet(0));
    let peer6 = common::bind("[::1]:0");
    let c = common::site_child(s.natt6, peer6.local_addr().expect("addr"));
    s.dp.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    for i in 0..10u8 {
        let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, &[i; 500]);
        s.host
            .send_to(
                &vxlan(100, s.gw_mac(), VM_MAC, EtherType::IPV4, &inner),
                s.vtep,
            )
            .expect("send vxlan");
    }
    for _ in 0..10 {
        let (d, from) = recv(&peer6);
        assert_eq!(from, s.natt6);
        peer.open(&d).expect("peer opens");
    }
    // And inbound over IPv6 into the VNet: the VM's MAC was learned from its frames, so no
    // ARP is needed.
    peer6
        .send_to(
            &peer.seal(&udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"in")),
            s.natt6,
        )
        .expect("send");
    let (d, _) = recv(&s.host);
    let (_, dst, _, ty, _) = parse_vxlan(&d);
    assert_eq!((dst, ty), (VM_MAC, EtherType::IPV4));
}

#[test]
fn shutdown_joins_promptly_and_is_idempotent() {
    let s = setup(Inside::Vnet(0));
    let t = Instant::now();
    s.dp.shutdown();
    s.dp.shutdown();
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[test]
fn invalid_configuration_names_the_field() {
    let (tx, _rx) = crossbeam_channel::unbounded();
    let cfg = DataplaneConfig {
        attachments: vec![],
        vnets: vec![],
        tunnels: vec![TunnelBinding {
            tunnel: ike::TunnelId(1),
            name: "t".into(),
            tenant: ids::TenantId::new("x").expect("tenant"),
            inside: Inside::Vnet(3),
        }],
        pin_workers: true,
        ..common::config(4789)
    };
    match Dataplane::start(cfg, tx) {
        Err(DataplaneError::Config { field, .. }) => assert_eq!(field, "tunnels[0].inside"),
        other => panic!("expected a config error, got {other:?}"),
    }
}
