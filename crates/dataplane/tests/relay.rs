//! The data plane in relay mode with real sockets and threads on loopback: a plain UDP socket
//! on 127.0.0.9 plays the steer node (it owns the VIP, relays the peer's ESP and the hosts'
//! VXLAN inside Geneve frames, and receives the encrypted output the same way), a socket on
//! 127.0.0.2 plays the cloud host's VTEP behind which VM 10.0.0.5 lives. The VIP and the peer
//! appear only inside the frames; every datagram on the wire is between loopback addresses.

mod common;
#[path = "../src/testutil.rs"]
mod testutil;

use common::{bind, drop_count, recv, wait_stats, Started};
use protego_dataplane::{DataPath, Dataplane, DataplaneConfig, Inside, RelayConfig};
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testutil::{arp, parse_vxlan, udp4, vxlan, Peer};
use wire::arp::{ArpOperation, ArpPacket, ArpRepr};
use wire::ethernet::EtherType;
use wire::geneve::{GeneveBuilder, GeneveRepr, HealthProbe, ProtegoOption};
use wire::ip::Ipv4Packet;
use wire::relay::{emit_frame, parse_frame};
use wire::vxlan::Vni;

const VM_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 5];
/// The VIP the steer node owns and the peer's public address (inside frames only).
const VIP: &str = "192.0.2.1";
const PEER: &str = "192.0.2.7:4500";

fn sa(s: &str) -> SocketAddr {
    s.parse().expect("socket address")
}

fn vip(port: u16) -> SocketAddr {
    SocketAddr::new(VIP.parse().expect("ip"), port)
}

struct Setup {
    dp: Arc<Dataplane>,
    steer: UdpSocket,
    host: UdpSocket,
    geneve: SocketAddr,
    vxlan_port: u16,
}

/// A data plane in relay mode behind the steer node `steer`, its Geneve socket on 127.0.0.1,
/// started beside the host's VTEP socket; `adjust` may change the configuration.
fn start(steer: UdpSocket, adjust: impl Fn(DataplaneConfig) -> DataplaneConfig) -> Setup {
    let steer_addr = steer.local_addr().expect("addr");
    let Started { dp, host, .. } = common::start_beside_host(|vxlan_port| {
        adjust(DataplaneConfig {
            attachments: vec![],
            listen: vec![],
            ike_port: 500,
            natt_port: 4500,
            relay: Some(RelayConfig {
                listen: sa("127.0.0.1:0"),
                vtep: None,
                steer: vec![steer_addr],
            }),
            ..common::config(vxlan_port)
        })
    });
    Setup {
        geneve: dp.local_addrs().relay.expect("relay socket"),
        vxlan_port: host.local_addr().expect("addr").port(),
        dp,
        steer,
        host,
    }
}

fn setup() -> Setup {
    let s = start(bind("127.0.0.9:0"), |cfg| cfg);
    let addrs = s.dp.local_addrs();
    assert!(
        addrs.ike.is_empty() && addrs.natt.is_empty(),
        "no public sockets"
    );
    assert_eq!(s.dp.relay_addr(), Some(s.geneve));
    s
}

fn frame(src: SocketAddr, dst: SocketAddr, options: &[ProtegoOption], payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; 128 + payload.len()];
    let n = emit_frame(
        &mut buf,
        Vni::new(0).expect("vni"),
        options,
        src,
        dst,
        payload,
    )
    .expect("frame");
    buf.truncate(n);
    buf
}

impl Setup {
    fn child(&self) -> ike::ChildSaInfo {
        common::site_child(vip(4500), sa(PEER))
    }

    fn gw_mac(&self) -> [u8; 6] {
        self.dp.gateway_mac(0).expect("vnet 0")
    }

    /// The steer node relays what the host sent to the VIP's VXLAN port.
    fn relay_from_host(&self, vxlan_datagram: &[u8]) {
        let src = self.host.local_addr().expect("addr");
        let f = frame(src, vip(self.vxlan_port), &[], vxlan_datagram);
        self.steer.send_to(&f, self.geneve).expect("relay vxlan");
    }
}

#[test]
fn relayed_esp_reaches_the_vm_and_vxlan_leaves_as_relayed_esp() {
    let s = setup();
    let c = s.child();
    s.dp.install_child(&c)
        .expect("install without a NAT-T socket on the VIP");
    let peer = Peer::of(&c);

    // Peer -> VM: the steer node relays the ESP; the gateway resolves the VM over VXLAN,
    // straight to the host from its VTEP.
    let inner = udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"to the vm");
    let esp = frame(sa(PEER), vip(4500), &[], &peer.seal(&inner));
    s.steer.send_to(&esp, s.geneve).expect("relay esp");
    let (d, from) = recv(&s.host);
    assert_eq!(from.ip(), s.geneve.ip(), "from the node's own VTEP address");
    let (vni, dst, _, ty, payload) = parse_vxlan(&d);
    assert_eq!((vni, dst, ty), (100, [0xff; 6], EtherType::ARP));
    let req = ArpRepr::parse(&ArpPacket::new_checked(&payload[..]).expect("arp")).expect("arp");
    assert_eq!(req.target_protocol_addr.to_string(), "10.0.0.5");
    // The host floods the VM's answer to the VIP; the steer node relays it.
    let reply = arp(
        ArpOperation::REPLY,
        VM_MAC,
        "10.0.0.5",
        s.gw_mac(),
        "10.0.0.1",
    );
    s.relay_from_host(&vxlan(100, s.gw_mac(), VM_MAC, EtherType::ARP, &reply));
    let (d, from) = recv(&s.host);
    assert_eq!(from.ip(), s.geneve.ip());
    let (vni, dst, _, ty, payload) = parse_vxlan(&d);
    assert_eq!((vni, dst, ty), (100, VM_MAC, EtherType::IPV4));
    let p = Ipv4Packet::new_checked(&payload[..]).expect("ipv4");
    assert_eq!(p.ttl(), 63);
    assert_eq!(&payload[28..], b"to the vm");

    // VM -> peer: a burst of equal packets, relayed by the steer node, comes back as one
    // Geneve-wrapped ESP datagram per packet (GSO trains split by the kernel).
    const BURST: u8 = 40;
    for i in 0..BURST {
        let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, &[i; 1000]);
        s.relay_from_host(&vxlan(100, s.gw_mac(), VM_MAC, EtherType::IPV4, &inner));
    }
    let mut got = Vec::new();
    let mut seqs = Vec::new();
    let mut sizes = std::collections::BTreeSet::new();
    while got.len() < usize::from(BURST) {
        let (d, from) = recv(&s.steer);
        assert_eq!(from, s.geneve, "from the Geneve socket");
        sizes.insert(d.len());
        let f = parse_frame(&d).expect("one whole relay frame per datagram");
        assert!(!f.control && f.probe.is_none());
        let dg = f.datagram.expect("datagram");
        assert_eq!((dg.src, dg.dst), (vip(4500), sa(PEER)));
        let esp = &d[dg.payload];
        seqs.push(u32::from_be_bytes([esp[4], esp[5], esp[6], esp[7]]));
        let inner = peer.open(esp).expect("the peer opens it");
        let p = Ipv4Packet::new_checked(&inner[..]).expect("ipv4");
        assert_eq!(p.ttl(), 63);
        assert!(inner[28..].iter().all(|b| *b == inner[28]) && inner.len() == 1028);
        got.push(inner[28]);
    }
    assert_eq!(sizes.len(), 1, "equal packets, equal frames: {sizes:?}");
    assert_eq!(got, (0..BURST).collect::<Vec<u8>>(), "in order");
    assert_eq!(seqs, (1..=u32::from(BURST)).collect::<Vec<u32>>());
    wait_stats(&s.dp, "children and workers counted", |st| {
        st.children.len() == 1
            && st.children[0].packets_in == 1
            && st.children[0].packets_out == u64::from(BURST)
            && st.workers.iter().map(|w| w.busy_ns).sum::<u64>() > 0
    });
}

#[test]
fn probes_are_answered_and_strangers_ignored() {
    let s = setup();
    let probe = HealthProbe { id: 9, stamp: 1234 };
    let mut buf = [0u8; 32];
    let repr = GeneveRepr {
        control: true,
        protocol_type: EtherType::IPV4,
        vni: Vni::new(0).expect("vni"),
    };
    let mut b = GeneveBuilder::new(&mut buf, &repr).expect("builder");
    b.push_protego(&ProtegoOption::Probe(probe)).expect("probe");
    let n = b.finish();
    // A stranger's probe is not answered.
    let stranger = bind("127.0.0.11:0");
    stranger.send_to(&buf[..n], s.geneve).expect("send");
    wait_stats(&s.dp, "stranger dropped", |st| {
        drop_count(st, "relay_unknown_sender") == 1
    });
    s.steer.send_to(&buf[..n], s.geneve).expect("send");
    let (d, from) = recv(&s.steer);
    assert_eq!(from, s.geneve);
    let f = parse_frame(&d).expect("reply");
    assert!(f.control && f.datagram.is_none());
    assert_eq!(f.probe_reply, Some(probe));
    wait_stats(&s.dp, "probe counted", |st| st.relay_probes_answered == 1);
    stranger
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let mut scratch = [0u8; 64];
    assert!(
        stranger.recv_from(&mut scratch).is_err(),
        "no answer to a stranger"
    );
    // Malformed frames are counted.
    s.steer.send_to(&buf[..5], s.geneve).expect("send");
    wait_stats(&s.dp, "malformed", |st| {
        drop_count(st, "relay_malformed") == 1
    });
}

#[test]
fn ike_and_keepalives_go_out_through_the_steer_node_which_can_change() {
    let s = setup();
    let peer = sa(PEER);
    s.dp.send_ike(vip(4500), peer, b"ike message")
        .expect("send_ike");
    let (d, _) = recv(&s.steer);
    let f = parse_frame(&d).expect("frame");
    let dg = f.datagram.expect("datagram");
    assert_eq!((dg.src, dg.dst), (vip(4500), peer));
    assert_eq!(
        &d[dg.payload], b"\0\0\0\0ike message",
        "non-ESP marker on 4500"
    );
    s.dp.send_ike(vip(4500), peer, &[0xff]).expect("keepalive");
    let (d, _) = recv(&s.steer);
    let dg = parse_frame(&d).expect("frame").datagram.expect("datagram");
    assert_eq!(
        &d[dg.payload],
        [0xff],
        "RFC 3948 keepalive: one octet, no marker"
    );
    s.dp.send_ike(vip(500), peer, b"on 500")
        .expect("send_ike 500");
    let (d, _) = recv(&s.steer);
    let dg = parse_frame(&d).expect("frame").datagram.expect("datagram");
    assert_eq!((dg.src, &d[dg.payload]), (vip(500), &b"on 500"[..]));
    assert!(s.dp.send_ike(vip(999), peer, b"x").is_err());

    // Another steer node takes over: output goes there and the old one is refused.
    let steer2 = bind("127.0.0.10:0");
    s.dp.set_relays(vec![steer2.local_addr().expect("addr")])
        .expect("set_relays");
    assert_eq!(s.dp.relays(), vec![steer2.local_addr().expect("addr")]);
    s.dp.send_ike(vip(4500), peer, b"via the new one")
        .expect("send_ike");
    let (d, from) = recv(&steer2);
    assert_eq!(from, s.geneve);
    let dg = parse_frame(&d).expect("frame").datagram.expect("datagram");
    assert_eq!(&d[dg.payload], b"\0\0\0\0via the new one");
    s.steer
        .send_to(&frame(peer, vip(4500), &[], &[0x12; 40]), s.geneve)
        .expect("send");
    wait_stats(&s.dp, "old steer refused", |st| {
        drop_count(st, "relay_unknown_sender") == 1
    });
    // No steer node: nothing can be sent.
    s.dp.set_relays(vec![]).expect("empty");
    assert!(s.dp.send_ike(vip(4500), peer, b"x").is_err());
}

/// An idle health probe (control frame) as a steer node sends it.
fn idle_probe(id: u32) -> Vec<u8> {
    let mut buf = [0u8; 32];
    let repr = GeneveRepr {
        control: true,
        protocol_type: EtherType::IPV4,
        vni: Vni::new(0).expect("vni"),
    };
    let mut b = GeneveBuilder::new(&mut buf, &repr).expect("builder");
    b.push_protego(&ProtegoOption::Probe(HealthProbe { id, stamp: 0 }))
        .expect("probe");
    let n = b.finish();
    buf[..n].to_vec()
}

#[test]
fn output_goes_to_the_first_steer_node_heard_from_and_leaves_a_silent_one() {
    let s = setup();
    let peer = sa(PEER);
    let steer2 = bind("127.0.0.10:0");
    let (first, second) = (
        s.steer.local_addr().expect("addr"),
        steer2.local_addr().expect("addr"),
    );
    s.dp.set_relays(vec![first, second]).expect("set_relays");
    // A steer node sends its idle probe; the reply shows the frame was processed.
    let probe = |from: &UdpSocket, id: u32| {
        from.send_to(&idle_probe(id), s.geneve).expect("probe");
        let (d, _) = recv(from);
        assert!(parse_frame(&d).expect("reply").probe_reply.is_some());
    };
    // Which steer node an IKE message goes out through (each is polled in turn).
    let via = |payload: &[u8]| -> SocketAddr {
        s.dp.send_ike(vip(500), peer, payload).expect("send_ike");
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut buf = [0u8; 256];
        let mut got = None;
        while got.is_none() && Instant::now() < deadline {
            for (sock, addr) in [(&s.steer, first), (&steer2, second)] {
                sock.set_read_timeout(Some(Duration::from_millis(10)))
                    .expect("timeout");
                if let Ok((n, _)) = sock.recv_from(&mut buf) {
                    let dg = parse_frame(&buf[..n]).expect("frame");
                    let dg = dg.datagram.expect("datagram");
                    assert_eq!(&buf[dg.payload], payload);
                    got = Some(addr);
                    break;
                }
            }
        }
        for sock in [&s.steer, &steer2] {
            sock.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
        }
        got.expect("the IKE message reached a steer node within 5 s")
    };
    // Nothing heard yet: the first of the list.
    assert_eq!(via(b"one"), first);
    // Only the second is heard from: it takes the output.
    probe(&steer2, 1);
    assert_eq!(via(b"two"), second);
    // The first is heard from again: back to it (list order).
    probe(&s.steer, 2);
    assert_eq!(via(b"three"), first);
    // The first goes silent for longer than the window while the second keeps probing.
    std::thread::sleep(Duration::from_millis(80));
    probe(&steer2, 3);
    assert_eq!(via(b"four"), second);
}

#[test]
fn unanswered_address_resolution_is_retried_by_housekeeping() {
    let s = setup();
    let c = s.child();
    s.dp.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    let inner = udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"x");
    let esp = frame(sa(PEER), vip(4500), &[], &peer.seal(&inner));
    s.steer.send_to(&esp, s.geneve).expect("relay esp");
    // The first request comes from the packet path, the next from the housekeeping round,
    // which in relay mode runs through the Geneve lane (there is no VTEP lane).
    for attempt in 0..2 {
        let (d, _) = recv(&s.host);
        let (_, dst, _, ty, _) = parse_vxlan(&d);
        assert_eq!((dst, ty), ([0xff; 6], EtherType::ARP), "request {attempt}");
    }
}

#[test]
fn inside_configuration_arrives_after_start() {
    let s = start(bind("127.0.0.9:0"), |cfg| DataplaneConfig {
        vnets: vec![],
        tunnels: vec![],
        batch: 8,
        workers: 1,
        // The Geneve socket and the VTEP on different addresses.
        relay: cfg.relay.map(|r| RelayConfig {
            listen: sa("127.0.0.3:0"),
            vtep: Some("127.0.0.1".parse().expect("ip")),
            ..r
        }),
        ..cfg
    });
    let c = s.child();
    assert!(s.dp.install_child(&c).is_err(), "tunnel not bound yet");
    assert_eq!(s.dp.gateway_mac(0), None);
    let path: &dyn DataPath = &*s.dp;
    path.set_inside(
        vec![common::loopback_vnet()],
        vec![common::site_tunnel(Inside::Vnet(0))],
    )
    .expect("set_inside through DataPath");
    s.dp.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, b"up");
    s.relay_from_host(&vxlan(100, s.gw_mac(), VM_MAC, EtherType::IPV4, &inner));
    let (d, _) = recv(&s.steer);
    let dg = parse_frame(&d).expect("frame").datagram.expect("datagram");
    let got = peer.open(&d[dg.payload]).expect("opens");
    assert_eq!(&got[28..], b"up");
    assert_eq!(s.geneve.ip().to_string(), "127.0.0.3");
    // Toward the host: from the VTEP address (the VM's MAC was learned from its frame).
    let inner = udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"down");
    let esp = frame(sa(PEER), vip(4500), &[], &peer.seal(&inner));
    s.steer.send_to(&esp, s.geneve).expect("relay esp");
    let (d, from) = recv(&s.host);
    assert_eq!(from.ip().to_string(), "127.0.0.1", "from the VTEP");
    let (_, dst, _, _, payload) = parse_vxlan(&d);
    assert_eq!((dst, &payload[28..]), (VM_MAC, &b"down"[..]));
}
