//! Socket tests of the forwarding paths on loopback: ESP by SPI and back out of the VIP, IKE
//! to the control node and back out of the right VIP port, VXLAN by selector, ARP to every
//! neighbour node, frames from strangers, whole-table replacement and two steer nodes side
//! by side.

mod common;

use std::time::Duration;

use common::*;
use protego_steernode::{DropReason, ForwardKind, SteerNodeError, SteerTables, VniSteering};
use steer::{AddrRange, NodeId, RateLimit, Selector, SelectorEntry, SpiEntry, TunnelId};
use wire::arp::{ArpOperation, ArpRepr};
use wire::ethernet::{EtherType, EthernetAddress};
use wire::vxlan::{Vni, VxlanPacket};
use wire::EspSpi;

const SHORT: Duration = Duration::from_millis(200);

#[test]
fn esp_goes_to_its_data_node_and_the_answer_leaves_from_the_vip() {
    let steer = start(patient_health(), None);
    let local = steer.local_addrs().clone();
    let node = socket("127.0.1.1");
    let peer = socket("127.0.0.50");
    steer
        .set_data_nodes(vec![(NodeId(1), node.local_addr().unwrap())])
        .unwrap();
    steer
        .set_spi(
            EspSpi(0x1000),
            SpiEntry {
                node: NodeId(1),
                tunnel: TunnelId(5),
            },
        )
        .unwrap();

    // The peer sends ESP to the second VIP's NAT-T port.
    let datagram = esp(0x1000, 1, 100);
    peer.send_to(&datagram, local.natt[1]).unwrap();
    let f = recv_frame(&node, false, DEADLINE).expect("ESP at the data node");
    assert_eq!(f.from, local.geneve);
    let d = f.parsed.datagram.as_ref().unwrap();
    assert_eq!(d.src, peer.local_addr().unwrap());
    assert_eq!(d.dst, local.natt[1]);
    assert_eq!(f.payload(), &datagram[..]);
    assert_eq!(f.parsed.tunnel, Some(5));
    assert_eq!(f.parsed.vni, Vni::default());

    // The data node's answer leaves from that VIP's NAT-T socket.
    send_relay(
        &node,
        local.geneve,
        local.natt[1],
        peer.local_addr().unwrap(),
        b"encrypted reply",
    );
    let (got, from) = recv(&peer, DEADLINE).expect("the reply at the peer");
    assert_eq!((&got[..], from), (&b"encrypted reply"[..], local.natt[1]));

    // An unknown SPI and a keepalive are dropped and counted; the peer's ESP was counted.
    peer.send_to(&esp(0x1001, 1, 100), local.natt[0]).unwrap();
    peer.send_to(&[0xff], local.natt[0]).unwrap();
    let s = wait_stats(&steer, "unknown spi and keepalive", |s| {
        s.dropped.get(DropReason::UnknownSpi) == 1
            && s.forwarded.get(ForwardKind::NatKeepalives) == 1
    });
    assert_eq!(s.forwarded.get(ForwardKind::EspToData), 1);
    assert_eq!(s.forwarded.get(ForwardKind::RelayedToPeers), 1);
    assert_eq!(s.tunnels[&TunnelId(5)].inbound.admitted_packets, 1);
    assert_eq!(s.tunnels[&TunnelId(5)].inbound.admitted_bytes, 100);
    assert!(
        recv_frame(&node, false, SHORT).is_none(),
        "nothing else forwarded"
    );

    // A removed SPI is no longer steered.
    assert!(steer.remove_spi(EspSpi(0x1000)));
    assert!(!steer.remove_spi(EspSpi(0x1000)));
    peer.send_to(&datagram, local.natt[1]).unwrap();
    wait_stats(&steer, "removed spi", |s| {
        s.dropped.get(DropReason::UnknownSpi) == 2
    });
    // Reserved SPIs are refused.
    assert!(matches!(
        steer.set_spi(
            EspSpi(255),
            SpiEntry {
                node: NodeId(1),
                tunnel: TunnelId(5)
            }
        ),
        Err(SteerNodeError::Steer { .. })
    ));
    steer.shutdown();
}

/// ESP the peer sends on a CHILD_SA before its SPI is steered (it may, once it answered the
/// CREATE_CHILD_SA) is held and sent on in order once the SPI is steered.
#[test]
fn esp_for_an_spi_steered_a_moment_later_is_held_and_sent_on() {
    let steer = start(patient_health(), None);
    let local = steer.local_addrs().clone();
    let node = socket("127.0.1.1");
    let peer = socket("127.0.0.50");
    steer
        .set_data_nodes(vec![(NodeId(1), node.local_addr().unwrap())])
        .unwrap();
    let first = esp(0x2000, 1, 100);
    let second = esp(0x2000, 2, 100);
    peer.send_to(&first, local.natt[0]).unwrap();
    peer.send_to(&second, local.natt[0]).unwrap();
    wait_stats(&steer, "two held", |s| {
        s.forwarded.get(ForwardKind::EspHeld) == 2
    });
    assert!(recv_frame(&node, false, Duration::from_millis(20)).is_none());
    steer
        .set_spi(
            EspSpi(0x2000),
            SpiEntry {
                node: NodeId(1),
                tunnel: TunnelId(5),
            },
        )
        .unwrap();
    let a = recv_frame(&node, false, DEADLINE).expect("the first held datagram");
    let b = recv_frame(&node, false, DEADLINE).expect("the second held datagram");
    assert_eq!(a.payload(), &first[..]);
    assert_eq!(b.payload(), &second[..]);
    let s = wait_stats(&steer, "sent on", |s| {
        s.forwarded.get(ForwardKind::EspToData) == 2
    });
    assert_eq!(s.dropped.get(DropReason::UnknownSpi), 0);
}

#[test]
fn ike_goes_to_control_and_the_answer_leaves_from_the_port_it_came_to() {
    let steer = start(patient_health(), None);
    let local = steer.local_addrs().clone();
    let control = socket("127.0.2.1");
    let peer = socket("127.0.0.50");
    let p = peer.local_addr().unwrap();

    // Without a control node IKE is dropped and counted.
    peer.send_to(b"ike_sa_init", local.ike[0]).unwrap();
    wait_stats(&steer, "no control", |s| {
        s.dropped.get(DropReason::NoControl) == 1
    });
    steer
        .set_control(Some(control.local_addr().unwrap()))
        .unwrap();

    // Port 500 of the first VIP.
    peer.send_to(b"ike_sa_init", local.ike[0]).unwrap();
    let f = recv_frame(&control, false, DEADLINE).expect("IKE at the control node");
    let d = f.parsed.datagram.as_ref().unwrap();
    assert_eq!((d.src, d.dst), (p, local.ike[0]));
    assert_eq!(f.payload(), b"ike_sa_init");
    assert_eq!(f.parsed.tunnel, None);
    send_relay(
        &control,
        local.geneve,
        local.ike[0],
        p,
        b"ike_sa_init response",
    );
    let (got, from) = recv(&peer, DEADLINE).expect("the IKE answer");
    assert_eq!(
        (&got[..], from),
        (&b"ike_sa_init response"[..], local.ike[0])
    );

    // Port 4500 of the second VIP, after the non-ESP marker.
    peer.send_to(b"\0\0\0\0ike_auth", local.natt[1]).unwrap();
    let f = recv_frame(&control, false, DEADLINE).expect("marked IKE at the control node");
    let d = f.parsed.datagram.as_ref().unwrap();
    assert_eq!((d.src, d.dst), (p, local.natt[1]));
    assert_eq!(f.payload(), b"\0\0\0\0ike_auth");
    send_relay(
        &control,
        local.geneve,
        local.natt[1],
        p,
        b"\0\0\0\0ike_auth response",
    );
    let (got, from) = recv(&peer, DEADLINE).expect("the IKE_AUTH answer");
    assert_eq!(
        (&got[..], from),
        (&b"\0\0\0\0ike_auth response"[..], local.natt[1])
    );

    let s = steer.stats();
    assert_eq!(s.forwarded.get(ForwardKind::IkeToControl), 2);
    assert_eq!(s.forwarded.get(ForwardKind::RelayedToPeers), 2);
    assert_eq!(s.dropped.total(), 1);
}

const VM_MAC: EthernetAddress = EthernetAddress([0x52, 0x54, 0, 0, 0, 1]);

/// A VXLAN datagram with an untagged frame of `ethertype` carrying `l3`.
fn vxlan_frame(vni: u32, ethertype: EtherType, l3: &[u8]) -> Vec<u8> {
    let mut d = vec![0u8; 8 + 14 + l3.len()];
    VxlanPacket::new_unchecked(&mut d[..]).set_header(Vni::new(vni).unwrap());
    d[8..14].copy_from_slice(&[0x02, 0x50, 0x47, 0, 0, vni as u8]);
    d[14..20].copy_from_slice(&VM_MAC.0);
    d[20..22].copy_from_slice(&ethertype.0.to_be_bytes());
    d[22..].copy_from_slice(l3);
    d
}

/// A VXLAN datagram carrying a UDP packet from `src` to `dst`.
fn vxlan_udp(vni: u32, src: &str, dst: &str) -> Vec<u8> {
    let mut ip = vec![0u8; 28 + 5];
    ip[28..].copy_from_slice(b"hello");
    wire::relay::emit_header(&mut ip, sa(src), sa(dst), 5, 9).unwrap();
    vxlan_frame(vni, EtherType::IPV4, &ip)
}

fn arp_request(vni: u32) -> Vec<u8> {
    let mut arp = [0u8; 28];
    ArpRepr {
        operation: ArpOperation::REQUEST,
        source_hardware_addr: VM_MAC,
        source_protocol_addr: "10.0.0.5".parse().unwrap(),
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: "10.0.0.1".parse().unwrap(),
    }
    .emit(&mut arp)
    .unwrap();
    vxlan_frame(vni, EtherType::ARP, &arp)
}

fn selector(dst: &str, tunnel: u32, node: u32) -> SelectorEntry {
    SelectorEntry {
        selector: Selector::between(
            AddrRange::prefix("10.0.0.0".parse().unwrap(), 24).unwrap(),
            AddrRange::prefix(dst.parse().unwrap(), 24).unwrap(),
        ),
        tunnel: Some(TunnelId(tunnel)),
        node: NodeId(node),
    }
}

/// An attachment's prefix (issue 16) first in the VNI's list: its packets go to the serving
/// node without a tunnel id and are not charged to any tunnel's limit, even one that would
/// have matched and blocks everything.
#[test]
fn an_attachments_prefix_is_steered_without_tunnel_or_limit() {
    let steer = start(patient_health(), None);
    let local = steer.local_addrs().clone();
    let (n1, n2) = (socket("127.0.1.1"), socket("127.0.1.2"));
    let host = socket("127.0.4.1");
    steer
        .set_data_nodes(vec![
            (NodeId(1), n1.local_addr().unwrap()),
            (NodeId(2), n2.local_addr().unwrap()),
        ])
        .unwrap();
    let vni = Vni::new(100).unwrap();
    let attachment = SelectorEntry {
        tunnel: None,
        ..selector("192.168.1.0", 0, 2)
    };
    let tunnel = SelectorEntry {
        selector: Selector::between(
            AddrRange::prefix("10.0.0.0".parse().unwrap(), 24).unwrap(),
            AddrRange::prefix("192.168.0.0".parse().unwrap(), 16).unwrap(),
        ),
        ..selector("192.168.0.0", 1, 1)
    };
    steer
        .set_selectors(vni, vec![attachment, tunnel], vec![NodeId(1), NodeId(2)])
        .unwrap();
    steer.set_rate_limit(TunnelId(1), Some(RateLimit::new(8, 1).into()));
    let to_ce = vxlan_udp(100, "10.0.0.5:1000", "192.168.1.7:53");
    host.send_to(&to_ce, local.vxlan).unwrap();
    let f = recv_frame(&n2, false, DEADLINE).expect("the attachment's packet");
    assert_eq!(f.payload(), &to_ce[..]);
    assert_eq!(f.parsed.tunnel, None);
    assert!(
        recv_frame(&n1, false, SHORT).is_none(),
        "nothing to the tunnel's node"
    );
    let s = wait_stats(&steer, "forwarded", |s| {
        s.forwarded.get(ForwardKind::VxlanToData) == 1
    });
    assert_eq!(
        s.tunnels
            .get(&TunnelId(1))
            .map_or(0, |t| t.outbound.admitted_packets
                + t.outbound.dropped_packets),
        0
    );
}

#[test]
fn vxlan_is_steered_by_selector_and_arp_reaches_every_neighbour_node() {
    let steer = start(patient_health(), None);
    let local = steer.local_addrs().clone();
    let (n1, n2) = (socket("127.0.1.1"), socket("127.0.1.2"));
    let host = socket("127.0.4.1");
    steer
        .set_data_nodes(vec![
            (NodeId(1), n1.local_addr().unwrap()),
            (NodeId(2), n2.local_addr().unwrap()),
        ])
        .unwrap();
    let vni = Vni::new(100).unwrap();
    steer
        .set_selectors(
            vni,
            vec![selector("192.168.1.0", 1, 1), selector("192.168.2.0", 2, 2)],
            vec![NodeId(1), NodeId(2)],
        )
        .unwrap();

    let to1 = vxlan_udp(100, "10.0.0.5:1000", "192.168.1.7:53");
    let to2 = vxlan_udp(100, "10.0.0.5:1000", "192.168.2.7:53");
    let nowhere = vxlan_udp(100, "10.0.0.5:1000", "172.16.0.1:53");
    let arp = arp_request(100);
    for d in [&to1, &to2, &nowhere, &arp] {
        host.send_to(d, local.vxlan).unwrap();
    }
    for (node, want_tunnel, want) in [(&n1, 1, &to1), (&n2, 2, &to2)] {
        let mut frames: Vec<Frame> = (0..2)
            .map(|_| recv_frame(node, false, DEADLINE).expect("two frames per node"))
            .collect();
        frames.sort_by_key(|f| f.parsed.tunnel.is_none());
        let (data, neighbour) = (&frames[0], &frames[1]);
        for (f, payload, tunnel) in [(data, want, Some(want_tunnel)), (neighbour, &arp, None)] {
            let d = f.parsed.datagram.as_ref().unwrap();
            assert_eq!((d.src, d.dst), (host.local_addr().unwrap(), local.vxlan));
            assert_eq!(f.payload(), &payload[..]);
            assert_eq!(f.parsed.tunnel, tunnel);
            assert_eq!(f.parsed.vni, vni);
        }
        assert!(recv_frame(node, false, SHORT).is_none(), "nothing else");
    }
    let s = wait_stats(&steer, "no selector", |s| {
        s.dropped.get(DropReason::VxlanNoSelector) == 1
    });
    assert_eq!(s.forwarded.get(ForwardKind::VxlanToData), 2);
    assert_eq!(s.forwarded.get(ForwardKind::VxlanToNeighbours), 1);
    assert_eq!(s.forwarded.get(ForwardKind::NeighbourFrames), 2);
    assert_eq!(s.tunnels[&TunnelId(1)].outbound.admitted_packets, 1);
    assert_eq!(s.tunnels[&TunnelId(2)].outbound.admitted_packets, 1);

    // The gateway's address: traffic to it goes to the neighbour nodes.
    steer
        .set_gateway_ips(vni, vec!["10.0.0.1".parse().unwrap()])
        .unwrap();
    host.send_to(&vxlan_udp(100, "10.0.0.5:1000", "10.0.0.1:53"), local.vxlan)
        .unwrap();
    for node in [&n1, &n2] {
        let f = recv_frame(node, false, DEADLINE).expect("gateway traffic");
        assert_eq!(f.parsed.tunnel, None);
    }
}

#[test]
fn frames_from_strangers_are_dropped() {
    let steer = start(patient_health(), None);
    let local = steer.local_addrs().clone();
    let node = socket("127.0.1.1");
    let stranger = socket("127.0.3.1");
    let peer = socket("127.0.0.50");
    let p = peer.local_addr().unwrap();
    steer
        .set_data_nodes(vec![(NodeId(1), node.local_addr().unwrap())])
        .unwrap();

    send_relay(&stranger, local.geneve, local.natt[0], p, b"spoofed");
    reply_probe(
        &stranger,
        local.geneve,
        wire::geneve::HealthProbe { id: 1, stamp: 0 },
    );
    wait_stats(&steer, "stranger", |s| {
        s.dropped.get(DropReason::GeneveUnknownSender) == 2
    });
    // The same frame from the data node goes out: the path itself works.
    send_relay(&node, local.geneve, local.natt[0], p, b"genuine");
    let (got, from) = recv(&peer, DEADLINE).expect("the node's datagram");
    assert_eq!((&got[..], from), (&b"genuine"[..], local.natt[0]));
    // A node's frame not from a VIP socket, and garbage.
    send_relay(&node, local.geneve, local.vxlan, p, b"not from a vip");
    node.send_to(b"\x00\x00garbage", local.geneve).unwrap();
    let s = wait_stats(&steer, "bad node frames", |s| {
        s.dropped.get(DropReason::RelayNotFromVip) == 1
            && s.dropped.get(DropReason::GeneveMalformed) == 1
    });
    assert_eq!(s.forwarded.get(ForwardKind::RelayedToPeers), 1);
    assert_eq!(s.forwarded.get(ForwardKind::ProbeReplies), 0);
    assert!(
        recv(&peer, SHORT).is_none(),
        "the stranger's datagram never left"
    );
}

fn tables(node: std::net::SocketAddr, control: std::net::SocketAddr) -> SteerTables {
    SteerTables {
        control: Some(control),
        data_nodes: vec![(NodeId(1), node)],
        spis: vec![(
            EspSpi(0x4000),
            SpiEntry {
                node: NodeId(1),
                tunnel: TunnelId(9),
            },
        )],
        vnis: vec![(
            Vni::new(7).unwrap(),
            VniSteering {
                selectors: vec![selector("192.168.1.0", 9, 1)],
                neighbour_nodes: vec![NodeId(1)],
                gateway_ips: vec![],
            },
        )],
        rate_limits: vec![],
        attachments: vec![],
    }
}

#[test]
fn two_steer_nodes_with_the_same_whole_tables_forward_alike() {
    let a = start(patient_health(), None);
    let b = start(patient_health(), None);
    let node = socket("127.0.1.1");
    let control = socket("127.0.2.1");
    let peer = socket("127.0.0.50");
    let host = socket("127.0.4.1");
    let t = tables(node.local_addr().unwrap(), control.local_addr().unwrap());
    for s in [&a, &b] {
        s.replace_all(t.clone()).unwrap();
        // An invalid whole state changes nothing.
        let mut bad = t.clone();
        bad.spis.push((EspSpi(3), bad.spis[0].1));
        match s.replace_all(bad) {
            Err(SteerNodeError::Steer { field, .. }) => assert_eq!(field, "spis[1]"),
            other => panic!("{other:?}"),
        }
    }
    for s in [&a, &b] {
        let local = s.local_addrs().clone();
        let datagram = esp(0x4000, 1, 64);
        peer.send_to(&datagram, local.natt[0]).unwrap();
        let f = recv_frame(&node, false, DEADLINE).expect("ESP through either steer node");
        assert_eq!(f.from, local.geneve);
        assert_eq!(f.payload(), &datagram[..]);
        assert_eq!(f.parsed.tunnel, Some(9));
        let d = vxlan_udp(7, "10.0.0.5:1", "192.168.1.9:2");
        host.send_to(&d, local.vxlan).unwrap();
        let f = recv_frame(&node, false, DEADLINE).expect("VXLAN through either steer node");
        assert_eq!(f.from, local.geneve);
        assert_eq!(f.payload(), &d[..]);
        peer.send_to(b"ike", local.ike[1]).unwrap();
        let f = recv_frame(&control, false, DEADLINE).expect("IKE through either steer node");
        assert_eq!(f.from, local.geneve);
    }
    // A whole state without the tunnel's SPI: ESP for it is dropped.
    let mut t2 = t;
    t2.spis.clear();
    a.replace_all(t2).unwrap();
    peer.send_to(&esp(0x4000, 2, 64), a.local_addrs().natt[0])
        .unwrap();
    wait_stats(&a, "spi gone", |s| {
        s.dropped.get(DropReason::UnknownSpi) == 1
    });
}
