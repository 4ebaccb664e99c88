//! Decision tests over hand-built datagrams: every steering rule, and every truncation of
//! every datagram is dropped, never a panic.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use steer::{
    AddrRange, AttachEntry, AttachmentId, NodeId, PortKey, PortRange, Selector, SelectorEntry,
    SpiEntry, TunnelId,
};
use wire::arp::{ArpOperation, ArpRepr};
use wire::ethernet::{EtherType, EthernetAddress};
use wire::geneve::{GeneveBuilder, GeneveRepr, HealthProbe, ProtegoOption};
use wire::ip::{IpProtocol, Ipv4Repr, Ipv6Repr};
use wire::ndp::{solicited_node_multicast, NdpRepr};
use wire::relay;
use wire::vxlan::{Vni, VxlanPacket};
use wire::EspSpi;

use super::*;
use crate::tables::VniSteering;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

const VNI: u32 = 100;
const CONTROL: &str = "10.9.0.9:6081";
const NODE1: &str = "10.9.0.1:6081";
const NODE2: &str = "10.9.0.2:6081";

fn prefix(s: &str, len: u8) -> AddrRange {
    AddrRange::prefix(ip(s), len).unwrap()
}

fn tables() -> Tables {
    let mut t = Tables::default();
    t.set_control(Some(sa(CONTROL)));
    t.set_nodes(&[(NodeId(1), sa(NODE1)), (NodeId(2), sa(NODE2))]);
    t.spis
        .insert(
            EspSpi(0xc0ffee),
            SpiEntry {
                node: NodeId(2),
                tunnel: TunnelId(7),
            },
        )
        .unwrap();
    let https = Selector {
        dst: prefix("2001:db8:b::", 48),
        src: prefix("2001:db8:a::", 48),
        proto: 6,
        sport: PortRange::ANY,
        dport: PortRange::single(443),
    };
    t.set_vni(
        Vni::new(VNI).unwrap(),
        VniSteering {
            selectors: vec![
                SelectorEntry {
                    selector: Selector::between(prefix("10.0.0.0", 24), prefix("192.168.1.0", 24)),
                    tunnel: Some(TunnelId(1)),
                    node: NodeId(1),
                },
                SelectorEntry {
                    selector: Selector::between(prefix("10.0.0.0", 24), prefix("192.168.2.0", 24)),
                    tunnel: Some(TunnelId(2)),
                    node: NodeId(2),
                },
                SelectorEntry {
                    selector: https,
                    tunnel: Some(TunnelId(3)),
                    node: NodeId(1),
                },
            ],
            neighbour_nodes: vec![NodeId(1), NodeId(2)],
            gateway_ips: vec![ip("10.0.0.1"), ip("2001:db8:a::1")],
        },
    )
    .unwrap();
    t
}

// ---- frame builders ----

const VM_MAC: EthernetAddress = EthernetAddress([0x52, 0x54, 0, 0, 0, 1]);
const GW_MAC: EthernetAddress = EthernetAddress([0x02, 0x50, 0x47, 0, 0, 100]);

fn eth(ethertype: EtherType, vlan: Option<u16>, l3: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&GW_MAC.0);
    f.extend_from_slice(&VM_MAC.0);
    if let Some(tci) = vlan {
        f.extend_from_slice(&EtherType::VLAN.0.to_be_bytes());
        f.extend_from_slice(&tci.to_be_bytes());
    }
    f.extend_from_slice(&ethertype.0.to_be_bytes());
    f.extend_from_slice(l3);
    f
}

fn encap(vni: u32, frame: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 8 + frame.len()];
    VxlanPacket::new_unchecked(&mut b[..]).set_header(Vni::new(vni).unwrap());
    b[8..].copy_from_slice(frame);
    b
}

/// An IPv4 UDP packet (IP and UDP headers built by the relay builder).
fn udp4(src: &str, dst: &str, sport: u16, dport: u16) -> Vec<u8> {
    let mut b = vec![0u8; 28 + 4];
    b[28..].copy_from_slice(b"data");
    relay::emit_header(
        &mut b,
        SocketAddr::new(ip(src), sport),
        SocketAddr::new(ip(dst), dport),
        4,
        1,
    )
    .unwrap();
    b
}

/// An IPv4 packet of `proto` with `l4` as payload.
fn ip4(src: &str, dst: &str, proto: IpProtocol, l4: &[u8]) -> Vec<u8> {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (ip(src), ip(dst)) else {
        panic!("v4")
    };
    let mut b = vec![0u8; 20 + l4.len()];
    Ipv4Repr {
        src_addr: s,
        dst_addr: d,
        protocol: proto,
        payload_len: l4.len(),
        ttl: 64,
        dscp: 0,
        ecn: 0,
        ident: 0,
        dont_frag: false,
    }
    .emit(&mut b)
    .unwrap();
    b[20..].copy_from_slice(l4);
    b
}

/// An IPv6 packet with `next` as Next Header and `rest` after the fixed header.
fn ip6(src: &str, dst: &str, next: IpProtocol, rest: &[u8]) -> Vec<u8> {
    let (IpAddr::V6(s), IpAddr::V6(d)) = (ip(src), ip(dst)) else {
        panic!("v6")
    };
    let mut b = vec![0u8; 40 + rest.len()];
    Ipv6Repr {
        src_addr: s,
        dst_addr: d,
        next_header: next,
        payload_len: rest.len(),
        hop_limit: 255,
        traffic_class: 0,
        flow_label: 0,
    }
    .emit(&mut b)
    .unwrap();
    b[40..].copy_from_slice(rest);
    b
}

fn tcp_ports(sport: u16, dport: u16) -> Vec<u8> {
    let mut h = vec![0u8; 20];
    h[..2].copy_from_slice(&sport.to_be_bytes());
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    h
}

fn arp_request() -> Vec<u8> {
    let mut b = [0u8; 28];
    ArpRepr {
        operation: ArpOperation::REQUEST,
        source_hardware_addr: VM_MAC,
        source_protocol_addr: "10.0.0.5".parse().unwrap(),
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: "10.0.0.1".parse().unwrap(),
    }
    .emit(&mut b)
    .unwrap();
    eth(EtherType::ARP, None, &b)
}

fn neighbour_solicit() -> Vec<u8> {
    let src: Ipv6Addr = "2001:db8:a::5".parse().unwrap();
    let target: Ipv6Addr = "2001:db8:a::1".parse().unwrap();
    let dst = solicited_node_multicast(&target);
    let ns = NdpRepr::NeighborSolicit {
        target_addr: target,
        source_lladdr: Some(VM_MAC),
    };
    let mut icmp = vec![0u8; ns.buffer_len()];
    ns.emit(&src, &dst, &mut icmp).unwrap();
    let pkt = ip6(
        &src.to_string(),
        &dst.to_string(),
        IpProtocol::ICMPV6,
        &icmp,
    );
    eth(EtherType::IPV6, None, &pkt)
}

fn entry_of(a: VxlanAction<'_>) -> Option<(TunnelId, NodeId)> {
    match a {
        VxlanAction::Data(vni, e) => {
            assert_eq!(vni.get(), VNI);
            Some((e.tunnel.expect("a tunnel's selector"), e.node))
        }
        _ => None,
    }
}

fn no_panic_on_truncation(datagram: &[u8], f: impl Fn(&[u8])) {
    for cut in 0..datagram.len() {
        f(&datagram[..cut]);
    }
}

// ---- peers ----

#[test]
fn wan_ike_goes_to_control_esp_by_spi_keepalives_are_not_errors() {
    let t = tables();
    let control = WanAction::Control(sa(CONTROL));
    assert_eq!(wan(WanPort::Ike, b"ike message", &t), control);
    assert_eq!(
        wan(WanPort::Ike, b"", &t),
        WanAction::Drop(DropReason::IkeEmpty)
    );
    assert_eq!(wan(WanPort::NatT, b"\0\0\0\0ike", &t), control);
    assert_eq!(wan(WanPort::NatT, &[0xff], &t), WanAction::Keepalive);
    let esp = [0, 0xc0, 0xff, 0xee, 0, 0, 0, 1, 0xaa, 0xbb];
    assert_eq!(
        wan(WanPort::NatT, &esp, &t),
        WanAction::Data(SpiEntry {
            node: NodeId(2),
            tunnel: TunnelId(7)
        })
    );
    let unknown = [0, 0xc0, 0xff, 0xef, 0, 0, 0, 1];
    assert_eq!(
        wan(WanPort::NatT, &unknown, &t),
        WanAction::UnknownSpi(wire::EspSpi(0x00c0_ffef))
    );
    for short in [&[][..], &[1, 2, 3][..], &[0, 0xc0, 0xff, 0xee, 0, 0, 0][..]] {
        assert_eq!(
            wan(WanPort::NatT, short, &t),
            WanAction::Drop(DropReason::EspMalformed)
        );
    }
    // Without a control node IKE is dropped; ESP is unaffected.
    let mut t = tables();
    t.set_control(None);
    assert_eq!(
        wan(WanPort::Ike, b"ike", &t),
        WanAction::Drop(DropReason::NoControl)
    );
    assert_eq!(
        wan(WanPort::NatT, b"\0\0\0\0ike", &t),
        WanAction::Drop(DropReason::NoControl)
    );
    assert!(matches!(wan(WanPort::NatT, &esp, &t), WanAction::Data(_)));
}

// ---- hosts ----

#[test]
fn vxlan_ip_is_steered_by_selector() {
    let t = tables();
    let to = |dst: &str| {
        encap(
            VNI,
            &eth(EtherType::IPV4, None, &udp4("10.0.0.5", dst, 999, 53)),
        )
    };
    assert_eq!(
        entry_of(vxlan(&to("192.168.1.7"), &t)),
        Some((TunnelId(1), NodeId(1)))
    );
    assert_eq!(
        entry_of(vxlan(&to("192.168.2.7"), &t)),
        Some((TunnelId(2), NodeId(2)))
    );
    assert_eq!(
        vxlan(&to("172.16.0.1"), &t),
        VxlanAction::Drop(DropReason::VxlanNoSelector)
    );
    // From outside the VNet's selector range.
    let foreign = encap(
        VNI,
        &eth(
            EtherType::IPV4,
            None,
            &udp4("10.0.1.5", "192.168.1.7", 1, 2),
        ),
    );
    assert_eq!(
        vxlan(&foreign, &t),
        VxlanAction::Drop(DropReason::VxlanNoSelector)
    );
    // A VLAN tag is skipped.
    let tagged = encap(
        VNI,
        &eth(
            EtherType::IPV4,
            Some(5),
            &udp4("10.0.0.5", "192.168.2.7", 1, 2),
        ),
    );
    assert_eq!(entry_of(vxlan(&tagged, &t)), Some((TunnelId(2), NodeId(2))));
    // Another VNI has no selectors.
    assert_eq!(
        vxlan(
            &encap(
                VNI + 1,
                &eth(
                    EtherType::IPV4,
                    None,
                    &udp4("10.0.0.5", "192.168.1.7", 1, 2)
                )
            ),
            &t
        ),
        VxlanAction::Drop(DropReason::VxlanNoSelector)
    );
}

#[test]
fn vxlan_ipv6_ports_are_read_behind_extension_headers() {
    let t = tables();
    let tcp = |dport: u16, hop_by_hop: bool| {
        let l4 = tcp_ports(40000, dport);
        let pkt = if hop_by_hop {
            // Hop-by-hop options (8 bytes: next header TCP, length 0, PadN) then TCP.
            let mut rest = vec![6, 0, 1, 4, 0, 0, 0, 0];
            rest.extend_from_slice(&l4);
            ip6("2001:db8:a::5", "2001:db8:b::9", IpProtocol::HOPOPT, &rest)
        } else {
            ip6("2001:db8:a::5", "2001:db8:b::9", IpProtocol::TCP, &l4)
        };
        encap(VNI, &eth(EtherType::IPV6, None, &pkt))
    };
    for hbh in [false, true] {
        assert_eq!(
            entry_of(vxlan(&tcp(443, hbh), &t)),
            Some((TunnelId(3), NodeId(1))),
            "hop-by-hop {hbh}"
        );
        assert_eq!(
            vxlan(&tcp(80, hbh), &t),
            VxlanAction::Drop(DropReason::VxlanNoSelector)
        );
    }
}

#[test]
fn arp_neighbour_discovery_and_gateway_traffic_go_to_every_neighbour_node() {
    let t = tables();
    let both = [NodeId(1), NodeId(2)];
    let neighbours = |a: VxlanAction<'_>| match a {
        VxlanAction::Neighbours(vni, n) => {
            assert_eq!(vni.get(), VNI);
            n.to_vec()
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(neighbours(vxlan(&encap(VNI, &arp_request()), &t)), both);
    assert_eq!(
        neighbours(vxlan(&encap(VNI, &neighbour_solicit()), &t)),
        both
    );
    // A ping of the gateway, though a selector covering it would match.
    let echo = [8, 0, 0, 0, 0, 1, 0, 1];
    let ping = ip4("10.0.0.5", "10.0.0.1", IpProtocol::ICMP, &echo);
    assert_eq!(
        neighbours(vxlan(&encap(VNI, &eth(EtherType::IPV4, None, &ping)), &t)),
        both
    );
    // A VNI without neighbour nodes.
    assert_eq!(
        vxlan(&encap(VNI + 1, &arp_request()), &t),
        VxlanAction::Drop(DropReason::NoNeighbours)
    );
}

#[test]
fn icmp_type_and_code_are_both_ports_and_fragments_have_none() {
    let echo = [8, 0, 0, 0];
    let f = inner_flow(&ip4("10.0.0.5", "192.168.1.7", IpProtocol::ICMP, &echo)).unwrap();
    assert_eq!(
        (f.flow.proto, f.flow.sport, f.flow.dport),
        (1, Some(0x0800), Some(0x0800))
    );
    assert!(!f.neighbour_discovery);
    let mut frag = ip4(
        "10.0.0.5",
        "192.168.1.7",
        IpProtocol::UDP,
        &[0, 53, 0, 53, 0, 8, 0, 0],
    );
    frag[6] = 0x00;
    frag[7] = 0x10; // fragment offset 128 bytes
    let f = inner_flow(&frag).unwrap();
    assert_eq!((f.flow.sport, f.flow.dport), (None, None));
    let f = inner_flow(&udp4("10.0.0.5", "192.168.1.7", 1234, 53)).unwrap();
    assert_eq!(
        (f.flow.proto, f.flow.sport, f.flow.dport),
        (17, Some(1234), Some(53))
    );
    // An ICMPv6 echo is not neighbour discovery.
    let pkt = ip6(
        "2001:db8:a::5",
        "2001:db8:b::9",
        IpProtocol::ICMPV6,
        &[128, 0, 0, 0],
    );
    assert!(!inner_flow(&pkt).unwrap().neighbour_discovery);
}

#[test]
fn malformed_and_unsupported_vxlan_is_dropped_and_no_truncation_panics() {
    let t = tables();
    let malformed = VxlanAction::Drop(DropReason::VxlanMalformed);
    let good = encap(
        VNI,
        &eth(
            EtherType::IPV4,
            None,
            &udp4("10.0.0.5", "192.168.1.7", 1, 2),
        ),
    );
    // The I flag clear (RFC 7348 §5).
    let mut no_i = good.clone();
    no_i[0] = 0;
    assert_eq!(vxlan(&no_i, &t), malformed);
    // Bad IP version and a truncated IP header.
    let mut bad = good.clone();
    bad[8 + 14] = 0x55;
    assert_eq!(vxlan(&bad, &t), malformed);
    assert_eq!(vxlan(&good[..8 + 14 + 10], &t), malformed);
    // A truncated ARP message.
    let arp = encap(VNI, &arp_request());
    assert_eq!(vxlan(&arp[..arp.len() - 1], &t), malformed);
    // LLDP is neither IP nor ARP.
    let lldp = encap(VNI, &eth(EtherType(0x88cc), None, &[0; 20]));
    assert_eq!(
        vxlan(&lldp, &t),
        VxlanAction::Drop(DropReason::VxlanUnsupported)
    );
    for d in [good, arp, encap(VNI, &neighbour_solicit())] {
        no_panic_on_truncation(&d, |cut| {
            let a = vxlan(cut, &t);
            assert!(
                matches!(a, VxlanAction::Drop(_)),
                "{a:?} for {} bytes",
                cut.len()
            );
        });
    }
}

// ---- nodes ----

const VIP: &str = "203.0.113.1:4500";
const PEER: &str = "198.51.100.7:4500";

fn vip_sock(a: SocketAddr) -> Option<usize> {
    (a == sa(VIP)).then_some(3)
}

fn no_port(_: PortId) -> Option<usize> {
    None
}

fn frame(control: bool, options: &[ProtegoOption], datagram: Option<(&str, &str)>) -> Vec<u8> {
    let mut buf = vec![0u8; 256];
    let n = match datagram {
        Some((src, dst)) => {
            let n = relay::emit_frame(&mut buf, Vni::default(), options, sa(src), sa(dst), b"esp!")
                .unwrap();
            if control {
                buf[1] |= wire::geneve::FLAG_CONTROL;
            }
            n
        }
        None => {
            let repr = GeneveRepr {
                control,
                protocol_type: EtherType::IPV4,
                vni: Vni::default(),
            };
            let mut b = GeneveBuilder::new(&mut buf, &repr).unwrap();
            for o in options {
                b.push_protego(o).unwrap();
            }
            b.finish()
        }
    };
    buf.truncate(n);
    buf
}

#[test]
fn geneve_relays_from_vips_and_takes_probe_replies_from_known_nodes_only() {
    let t = tables();
    let reply = HealthProbe { id: 9, stamp: 0 };
    // A data node's relay frame with a probe reply.
    let f = frame(
        false,
        &[ProtegoOption::ProbeReply(reply)],
        Some((VIP, PEER)),
    );
    let a = geneve(sa(NODE1), &f, &t, vip_sock, no_port).unwrap();
    assert_eq!(a.sender, Sender::Data(NodeId(1)));
    assert_eq!(a.probe_reply, Some(reply));
    let r = a.relay.unwrap();
    assert_eq!((r.sock, r.dst), (3, sa(PEER)));
    assert_eq!(&f[r.payload], b"esp!");
    assert_eq!(a.drop, None);
    // The control node relays IKE the same way.
    let a = geneve(
        sa(CONTROL),
        &frame(false, &[], Some((VIP, PEER))),
        &t,
        vip_sock,
        no_port,
    )
    .unwrap();
    assert_eq!(a.sender, Sender::Control);
    assert!(a.relay.is_some());
    // A stranger, even with a valid frame.
    assert_eq!(
        geneve(sa("10.9.0.3:6081"), &f, &t, vip_sock, no_port),
        Err(DropReason::GeneveUnknownSender)
    );
    // Not from one of our VIP sockets.
    let a = geneve(
        sa(NODE2),
        &frame(false, &[], Some((PEER, VIP))),
        &t,
        vip_sock,
        no_port,
    )
    .unwrap();
    assert_eq!((a.relay, a.drop), (None, Some(DropReason::RelayNotFromVip)));
    // A control frame: the reply counts, a payload is never forwarded.
    let a = geneve(
        sa(NODE2),
        &frame(true, &[ProtegoOption::ProbeReply(reply)], None),
        &t,
        vip_sock,
        no_port,
    )
    .unwrap();
    assert_eq!(
        (a.probe_reply, a.relay.is_none(), a.drop),
        (Some(reply), true, None)
    );
    let a = geneve(
        sa(NODE2),
        &frame(true, &[], Some((VIP, PEER))),
        &t,
        vip_sock,
        no_port,
    )
    .unwrap();
    assert_eq!(
        (a.relay, a.drop),
        (None, Some(DropReason::GeneveControlPayload))
    );
    // Nothing to do.
    let probe = ProtegoOption::Probe(reply);
    let a = geneve(
        sa(NODE2),
        &frame(true, &[probe], None),
        &t,
        vip_sock,
        no_port,
    )
    .unwrap();
    assert_eq!(a.drop, Some(DropReason::GeneveNoAction));
    // Garbage and every truncation.
    assert_eq!(
        geneve(sa(NODE1), b"\xff\xff\xff", &t, vip_sock, no_port),
        Err(DropReason::GeneveMalformed)
    );
    no_panic_on_truncation(&f, |cut| {
        let _ = geneve(sa(NODE1), cut, &t, vip_sock, no_port);
    });
}

/// Port 5 carries red (S-tag 100, C-tag 20) on node 1 and a single-tag customer (C-tag 30)
/// on node 2; port 6 has nothing.
fn port_tables() -> Tables {
    let mut t = tables();
    for (s_tag, c_tag, node, id) in [(100, 20, 1, 1), (0, 30, 2, 2)] {
        t.ports.insert(
            PortKey::new(PortId(5), s_tag, c_tag).unwrap(),
            AttachEntry {
                node: NodeId(node),
                attachment: AttachmentId(id),
                vni: None,
            },
        );
    }
    t
}

/// A customer's frame with these tags (TPID, VLAN id; outermost first), carrying IPv4.
fn customer_frame(tags: &[(u16, u16)]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
    for &(tpid, vid) in tags {
        f.extend_from_slice(&tpid.to_be_bytes());
        f.extend_from_slice(&vid.to_be_bytes());
    }
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend_from_slice(&[0x45; 46]);
    f
}

#[test]
fn port_frames_go_by_their_tag_pair() {
    let t = port_tables();
    let red = customer_frame(&[(0x88a8, 100), (0x8100, 20)]);
    let single = customer_frame(&[(0x8100, 30)]);
    let entry = |node, id| AttachEntry {
        node: NodeId(node),
        attachment: AttachmentId(id),
        vni: None,
    };
    let steer = |s_tag, c_tag, node, id| PortSteer {
        key: PortKey::new(PortId(5), s_tag, c_tag).unwrap(),
        entry: entry(node, id),
        node: NodeId(node),
        tunnel: None,
    };
    assert_eq!(port(PortId(5), &red, &t), Ok(steer(100, 20, 1, 1)));
    assert_eq!(port(PortId(5), &single, &t), Ok(steer(0, 30, 2, 2)));
    // The same tags on another port, an unknown pair, untagged, S-tag 0: another customer or
    // nobody's.
    for (p, f) in [
        (6, red.clone()),
        (5, customer_frame(&[(0x88a8, 100), (0x8100, 21)])),
        (5, customer_frame(&[])),
        (5, customer_frame(&[(0x88a8, 0), (0x8100, 30)])),
    ] {
        assert_eq!(port(PortId(p), &f, &t), Err(DropReason::PortUnknownTags));
    }
    for cut in 0..22 {
        assert_eq!(
            port(PortId(5), &red[..cut], &t),
            Err(DropReason::PortMalformed),
            "{cut}"
        );
    }
}

/// A Q-in-Q frame (S-tag 100, C-tag 20) from the CE carrying `ethertype` and `l3`.
fn ce_frame(ethertype: EtherType, l3: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
    f.extend_from_slice(&[0x88, 0xa8, 0, 100, 0x81, 0x00, 0, 20]);
    f.extend_from_slice(&ethertype.0.to_be_bytes());
    f.extend_from_slice(l3);
    f
}

#[test]
fn a_ce_packet_for_a_tunnel_goes_to_the_tunnels_node() {
    let mut t = port_tables();
    // Red's attachment is served by node 1 and its VNet is the VNI whose tunnel 2 (node 2)
    // takes 10.0.0.0/24 -> 192.168.2.0/24.
    t.ports.insert(
        PortKey::new(PortId(5), 100, 20).unwrap(),
        AttachEntry {
            node: NodeId(1),
            attachment: AttachmentId(1),
            vni: Some(Vni::new(VNI).unwrap()),
        },
    );
    let go = |f: &[u8]| port(PortId(5), f, &t).map(|e| e.node);
    // For the site behind tunnel 2: its node, naming the tunnel whose outbound rate limit it
    // is charged to; counted for red's attachment.
    let to_site = ce_frame(
        EtherType::IPV4,
        &udp4("10.0.0.7", "192.168.2.9", 1000, 2000),
    );
    assert_eq!(go(&to_site), Ok(NodeId(2)));
    let s = port(PortId(5), &to_site, &t).unwrap();
    assert_eq!(s.tunnel, Some(TunnelId(2)));
    assert_eq!(s.key, PortKey::new(PortId(5), 100, 20).unwrap());
    assert_eq!(s.entry.attachment, AttachmentId(1));
    assert_eq!(
        s.entry.node,
        NodeId(1),
        "the entry stays the serving node's"
    );
    // For a VM (no tunnel selector takes it), ARP, and what does not parse: the serving node.
    let to_vm = ce_frame(EtherType::IPV4, &udp4("10.0.0.7", "10.0.0.9", 1000, 2000));
    assert_eq!(go(&to_vm), Ok(NodeId(1)));
    assert_eq!(port(PortId(5), &to_vm, &t).map(|s| s.tunnel), Ok(None));
    let arp = ArpRepr {
        operation: ArpOperation::REQUEST,
        source_hardware_addr: VM_MAC,
        source_protocol_addr: "10.0.0.7".parse().unwrap(),
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: "10.0.0.1".parse().unwrap(),
    };
    let mut a = vec![0u8; arp.buffer_len()];
    arp.emit(&mut a).unwrap();
    assert_eq!(go(&ce_frame(EtherType::ARP, &a)), Ok(NodeId(1)));
    assert_eq!(go(&ce_frame(EtherType::IPV4, &[0x45; 10])), Ok(NodeId(1)));
    // Without the VNI (a single-tag customer here): always its serving node.
    let single = {
        let mut f = vec![
            0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x81, 0x00, 0, 30, 0x08, 0,
        ];
        f.extend_from_slice(&udp4("10.0.0.7", "192.168.2.9", 1000, 2000));
        f
    };
    assert_eq!(
        go(&single),
        Ok(NodeId(2)),
        "the single-tag customer's own node"
    );
    assert_eq!(
        port(PortId(5), &single, &t).map(|s| (s.entry.attachment, s.tunnel)),
        Ok((AttachmentId(2), None))
    );
}

#[test]
fn frames_from_data_nodes_leave_by_their_port_only_with_its_tags() {
    let t = port_tables();
    let own = |p: PortId| (p == PortId(5)).then_some(0);
    let relayed = |port: u32, eth: &[u8]| {
        let mut buf = vec![0u8; 256];
        let n = relay::emit_l2_frame(&mut buf, port, None, eth).unwrap();
        buf.truncate(n);
        buf
    };
    let red = customer_frame(&[(0x88a8, 100), (0x8100, 20)]);
    let f = relayed(5, &red);
    let a = geneve(sa(NODE2), &f, &t, vip_sock, own).unwrap();
    let to = a.to_port.unwrap();
    assert_eq!(to.port, 0);
    // Counted for red's attachment under its tag pair.
    assert_eq!(to.key, PortKey::new(PortId(5), 100, 20).unwrap());
    assert_eq!(to.attachment, AttachmentId(1));
    assert_eq!(&f[to.frame], &red[..]);
    assert_eq!((a.relay, a.drop), (None, None));
    for (src, frame, why) in [
        // The control node is no data node.
        (CONTROL, f.clone(), DropReason::PortNotFromData),
        // Port 6 is not ours.
        (NODE1, relayed(6, &red), DropReason::PortNotOurs),
        // Tags of no attachment of the port.
        (
            NODE1,
            relayed(5, &customer_frame(&[(0x88a8, 101), (0x8100, 20)])),
            DropReason::PortUnknownTagsOut,
        ),
        (
            NODE1,
            relayed(5, &customer_frame(&[])),
            DropReason::PortUnknownTagsOut,
        ),
    ] {
        let a = geneve(sa(src), &frame, &t, vip_sock, own).unwrap();
        assert_eq!((a.to_port, a.drop), (None, Some(why)), "{why}");
    }
    no_panic_on_truncation(&f, |cut| {
        let _ = geneve(sa(NODE1), cut, &t, vip_sock, own);
    });
}

/// `ip` (an IPv4 or IPv6 packet) in a frame with these tags, its TCP or UDP checksum field
/// (at `field` in the packet) holding the pseudo-header sum, as a local stack with checksum
/// offload leaves it.
fn offloaded_frame(tags: &[(u16, u16)], mut ip: Vec<u8>, l4: usize, field: usize) -> Vec<u8> {
    let proto = IpProtocol(if ip[0] >> 4 == 4 { ip[9] } else { ip[6] });
    let ph = wire::checksum::pseudo_header_of(&ip, proto, (ip.len() - l4) as u32).unwrap();
    ip[field..field + 2].copy_from_slice(&ph.to_be_bytes());
    let mut f = customer_frame(tags);
    f.truncate(f.len() - 46 - 2);
    f.extend_from_slice(if l4 == 20 {
        &[0x08, 0x00]
    } else {
        &[0x86, 0xdd]
    });
    f.extend_from_slice(&ip);
    f
}

#[test]
fn relayed_frames_get_the_checksum_a_local_stack_left_to_offload() {
    use wire::checksum::{combine, pseudo_header_of, sum};
    use wire::udp::UdpPacket;
    let t = port_tables();
    let red = [(0x88a8, 100), (0x8100, 20)];
    let entry = PortSteer {
        key: PortKey::new(PortId(5), 100, 20).unwrap(),
        entry: AttachEntry {
            node: NodeId(1),
            attachment: AttachmentId(1),
            vni: None,
        },
        node: NodeId(1),
        tunnel: None,
    };
    // UDP over IPv4 (the relay builder leaves the IPv4 UDP checksum zero) and TCP over IPv6.
    let udp = offloaded_frame(&red, udp4("10.1.0.5", "10.2.0.9", 4000, 53), 20, 26);
    let mut tcp_l4 = tcp_ports(40000, 443);
    tcp_l4.extend_from_slice(b"hello");
    let tcp = offloaded_frame(
        &red,
        ip6("fd00::5", "fd00:2::9", IpProtocol::TCP, &tcp_l4),
        40,
        56,
    );
    let verifies = |f: &[u8]| {
        let ip = &f[22..];
        let l4 = if ip[0] >> 4 == 4 { 20 } else { 40 };
        let proto = IpProtocol(if l4 == 20 { ip[9] } else { ip[6] });
        let ph = pseudo_header_of(ip, proto, (ip.len() - l4) as u32).unwrap();
        combine(&[ph, sum(&ip[l4..])]) == 0xffff
    };
    for (f, at) in [(&udp, 22 + 26), (&tcp, 22 + 56)] {
        assert!(!verifies(f));
        // Without the flag the frame goes on as it came.
        let mut g = f.clone();
        assert_eq!(port_frame(PortId(5), &mut g, false, &t), Ok(entry));
        assert_eq!(&g, f);
        // With it, finished.
        assert_eq!(port_frame(PortId(5), &mut g, true, &t), Ok(entry));
        assert!(verifies(&g));
        assert_ne!(g[at..at + 2], f[at..at + 2]);
        assert_eq!(
            (&g[..at], &g[at + 2..]),
            (&f[..at], &f[at + 2..]),
            "only the checksum changes"
        );
    }
    let mut g = udp.clone();
    port_frame(PortId(5), &mut g, true, &t).unwrap();
    let ip = wire::ip::Ipv4Packet::new_checked(&g[22..]).unwrap();
    let u = UdpPacket::new_checked(ip.payload()).unwrap();
    assert!(u.verify_checksum_v4(ip.src_addr(), ip.dst_addr()));
    assert_ne!(u.checksum(), 0);
    // A frame that goes nowhere is not touched; one that goes on but does not parse as IP
    // (or is no TCP/UDP) goes on as it is.
    let mut g = offloaded_frame(
        &[(0x88a8, 100), (0x8100, 21)],
        udp4("10.1.0.5", "10.2.0.9", 4000, 53),
        20,
        26,
    );
    let before = g.clone();
    assert_eq!(
        port_frame(PortId(5), &mut g, true, &t),
        Err(DropReason::PortUnknownTags)
    );
    assert_eq!(g, before);
    for f in [
        customer_frame(&red),
        offloaded_frame(
            &red,
            ip4(
                "10.1.0.5",
                "10.2.0.9",
                IpProtocol::ICMP,
                &[8, 0, 0, 0, 0, 0, 0, 0],
            ),
            20,
            22,
        ),
    ] {
        let mut g = f.clone();
        assert_eq!(port_frame(PortId(5), &mut g, true, &t), Ok(entry));
        assert_eq!(g, f);
    }
}
