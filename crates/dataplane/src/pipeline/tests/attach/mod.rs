//! The attachment stage driven in memory: two customers with identical address plans attached
//! over Q-in-Q (S-tags 100 and 200, C-tag 10) on one interface (`lo`: the AF_PACKET socket is
//! opened, nothing is sent on it), each to its own VNet. Frames are handed to the graph and the
//! send batch inspected. Needs CAP_NET_RAW (root), as the data plane does.

use super::super::classify::Via;
use super::super::graph;
use super::{binding, vnet};
use crate::io::output::Output;
use crate::out::{Out, PACKET_SOCK_BASE};
use crate::shared::Shared;
use crate::stats::DropReason;
use crate::testutil::{arp, ip, parse_vxlan, udp4, vxlan as vxlan_frame};
use datapath::{AttachmentConfig, AttachmentTags, DataplaneConfig, Inside};
use std::net::SocketAddr;
use std::time::Instant;
use wire::arp::{ArpOperation, ArpPacket, ArpRepr};
use wire::ethernet::{EtherType, EthernetAddress, EthernetRepr, VlanTags};
use wire::ip::Ipv4Packet;

const HOST: &str = "127.0.0.2";
const VM_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 5];
const CE_A: [u8; 6] = [0x52, 0x54, 0, 0, 0xa, 1];
const CE_B: [u8; 6] = [0x52, 0x54, 0, 0, 0xb, 1];

fn attachment(name: &str, tenant: &str, s_tag: u16) -> AttachmentConfig {
    AttachmentConfig {
        name: name.into(),
        tenant: ids::TenantId::new(tenant).expect("tenant"),
        vnet: format!("{tenant}-net"),
        port: datapath::AttachmentPort::Interface("lo".into()),
        tags: AttachmentTags::QinQ { s_tag, c_tag: 10 },
        gateway_ip: ip("10.99.0.1"),
        ce_ip: None,
        routes: vec![(ip("10.99.0.0"), 24)],
        ce_mac: None,
    }
}

struct Env {
    sh: Shared,
    out: Out,
    gw_mac: [u8; 6],
}

fn env() -> Env {
    for _ in 0..20 {
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .expect("free port")
            .port();
        let cfg = DataplaneConfig {
            listen: vec![ip("127.0.0.1")],
            ike_port: 0,
            natt_port: 0,
            vxlan_port: port,
            vnets: vec![vnet("a", 100), vnet("b", 200)],
            // Each tenant also has an IPsec tunnel into its VNet.
            tunnels: vec![
                binding(1, "a", Inside::Vnet(0)),
                binding(2, "b", Inside::Vnet(1)),
            ],
            tun_name: None,
            batch: 16,
            workers: 1,
            cpus: vec![],
            pin_workers: false,
            busy_poll: std::time::Duration::ZERO,
            busy_poll_budget: datapath::DEFAULT_BUSY_POLL_BUDGET,
            xdp: Default::default(),
            fair_kernel_gate: true,
            relay: None,
            dispatch: None,
            attachments: vec![
                attachment("a", "a", 100),
                attachment("b", "b", 200),
                // Tenant b's VNet also on an IPv6 segment.
                AttachmentConfig {
                    gateway_ip: ip("fd99::1"),
                    routes: vec![(ip("fd99::"), 64)],
                    ..attachment("b6", "b", 201)
                },
                // Tenant a also on a single-tag segment, C-tag 10 (the Q-in-Q ones' C-tag).
                AttachmentConfig {
                    tags: AttachmentTags::Vlan { c_tag: 10 },
                    gateway_ip: ip("10.98.0.1"),
                    routes: vec![(ip("10.98.0.0"), 24)],
                    ..attachment("av", "a", 0)
                },
            ],
        };
        let (tx, _rx) = crossbeam_channel::unbounded();
        match Shared::open(cfg, tx) {
            Ok(sh) => {
                let gw_mac = sh.io.packet[0].mac();
                return Env {
                    out: Output::standalone(&sh, 16),
                    sh,
                    gw_mac,
                };
            }
            Err(crate::DataplaneError::Bind { .. }) => continue,
            Err(e) => panic!("open (needs CAP_NET_RAW): {e}"),
        }
    }
    panic!("no free VXLAN port");
}

/// A frame from a CE: Q-in-Q tags (`s_tag`, 10), then `ethertype` and `payload`.
fn ce_frame(s_tag: u16, dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x88, 0xa8]);
    f.extend_from_slice(&s_tag.to_be_bytes());
    f.extend_from_slice(&[0x81, 0x00, 0x00, 10]);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A frame from a CE on a single-tag segment: 802.1Q tag `c_tag`, then `ethertype` and
/// `payload`.
fn vlan_frame(c_tag: u16, dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x81, 0x00]);
    f.extend_from_slice(&c_tag.to_be_bytes());
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// What was queued: frames toward CEs (interface, bytes) and datagrams toward hosts.
type Sent = (Vec<(usize, Vec<u8>)>, Vec<(SocketAddr, Vec<u8>)>);

impl Env {
    fn recv_from_ce(&mut self, frame: Vec<u8>) {
        self.recv_batch_from_ce(vec![frame]);
    }

    /// Frames of one attachment lane batch, in order, then what the worker does before the
    /// batch leaves: the feature chains over what they held, the packets for the tunnels
    /// numbered (in the worker, under their VTEP lane's stage), the queued ESP sealed.
    fn recv_batch_from_ce(&mut self, frames: Vec<Vec<u8>>) {
        let t = self.sh.tables.load();
        self.out.use_tables(std::sync::Arc::clone(&t));
        let reader = self.sh.route_readers.reader();
        let guard = reader.enter();
        let r = guard
            .as_deref()
            .unwrap_or(crate::routes::RouteReader::empty());
        let now = Instant::now();
        let mut frames = frames;
        let mut lookups = graph::CeLookups::new();
        for i in 0..frames.len() {
            graph::attach(
                &mut self.out,
                &self.sh,
                &t,
                r,
                now,
                0,
                i,
                &mut frames[..],
                &mut lookups,
            );
        }
        graph::route_from_ces(
            &mut self.out,
            &self.sh,
            &t,
            r,
            now,
            &mut frames[..],
            &mut lookups,
        );
        graph::end_pass(&mut self.out, &self.sh, &t, r, now);
        graph::seal_from_ces(&mut self.out, &self.sh, &t, |_| true);
        self.out.seal_queued();
    }

    fn recv_from_host(&mut self, mut data: Vec<u8>) {
        let t = self.sh.tables.load();
        self.out.use_tables(std::sync::Arc::clone(&t));
        let from = SocketAddr::new(ip(HOST), self.sh.cfg.vxlan_port);
        let reader = self.sh.route_readers.reader();
        let guard = reader.enter();
        let r = guard
            .as_deref()
            .unwrap_or(crate::routes::RouteReader::empty());
        graph::vxlan(
            &mut self.out,
            &self.sh,
            &t,
            r,
            Instant::now(),
            Via::Vtep(0),
            from,
            &mut data,
        );
    }

    /// ESP from the peer at `from` on the NAT-T socket, opened and accepted as a lane batch
    /// is.
    fn recv_from_peer(&mut self, from: &str, mut data: Vec<u8>) {
        let t = self.sh.tables.load();
        self.out.use_tables(std::sync::Arc::clone(&t));
        let local = self.sh.io.local_addr(self.sh.io.listen[0].natt);
        let reader = self.sh.route_readers.reader();
        let guard = reader.enter();
        let r = guard
            .as_deref()
            .unwrap_or(crate::routes::RouteReader::empty());
        let now = Instant::now();
        let mut d = graph::Deliveries::new();
        graph::natt(
            &mut self.out,
            &self.sh,
            &t,
            r,
            now,
            local,
            from.parse().expect("peer"),
            &mut data,
            &mut d,
        );
        d.flush(&mut self.out, &self.sh, &t, r, now);
        let mut dead = Vec::new();
        let tx = &mut self.out.tx;
        crate::accept::accept_batch(&self.sh, tx, &mut dead, &mut self.out.drops);
        tx.accepts.clear();
        assert!(dead.is_empty(), "the replay window refused a packet");
    }

    fn sent(&mut self) -> Sent {
        let mut frames = Vec::new();
        let mut datagrams = Vec::new();
        for (sock, dst, d) in self.out.tx.datagrams() {
            if sock >= PACKET_SOCK_BASE {
                frames.push((sock - PACKET_SOCK_BASE, d.to_vec()));
            } else {
                datagrams.push((dst, d.to_vec()));
            }
        }
        self.out.tx.clear();
        (frames, datagrams)
    }

    fn drops(&self, r: DropReason) -> u64 {
        self.out.drops.get(r)
    }

    /// The CE of `s_tag` asks for the gateway: the answer comes back tagged, and the CE's MAC
    /// is learned.
    fn arp_from_ce(&mut self, s_tag: u16, ce: [u8; 6]) {
        let req = arp(ArpOperation::REQUEST, ce, "10.99.0.2", [0; 6], "10.99.0.1");
        self.recv_from_ce(ce_frame(s_tag, [0xff; 6], ce, 0x0806, &req));
        let (frames, datagrams) = self.sent();
        assert!(datagrams.is_empty());
        assert_eq!(frames.len(), 1, "one ARP reply");
        let (eth, off) = EthernetRepr::parse(&frames[0].1).expect("frame");
        assert_eq!(
            eth.vlans,
            VlanTags::Double {
                outer: wire::ethernet::VlanTci::from_bits(s_tag),
                inner: wire::ethernet::VlanTci::from_bits(10),
            }
        );
        assert_eq!(eth.dst_addr.0, ce);
        assert_eq!(eth.src_addr.0, self.gw_mac);
        let reply = ArpRepr::parse(&ArpPacket::new_checked(&frames[0].1[off..]).expect("arp"))
            .expect("arp");
        assert_eq!(reply.operation, ArpOperation::REPLY);
        assert_eq!(reply.source_hardware_addr, EthernetAddress(self.gw_mac));
    }
}

#[test]
fn two_customers_with_one_address_plan_reach_their_own_vnets_both_ways() {
    let mut e = env();
    e.arp_from_ce(100, CE_A);
    e.arp_from_ce(200, CE_B);
    let gw_vnet = |e: &Env, v: usize| e.sh.tables.load().overlay.vnets[v].mac.0;

    // The same VM address answers in each VNet: each reply goes to its own customer's CE.
    for (vni, v, s_tag, ce) in [(100, 0, 100u16, CE_A), (200, 1, 200, CE_B)] {
        let pkt = udp4("10.0.0.5", 7, "10.99.0.2", 9, 64, b"pong");
        e.recv_from_host(vxlan_frame(
            vni,
            gw_vnet(&e, v),
            VM_MAC,
            EtherType::IPV4,
            &pkt,
        ));
        let (frames, datagrams) = e.sent();
        assert!(datagrams.is_empty(), "{datagrams:?}");
        assert_eq!(frames.len(), 1);
        let (eth, off) = EthernetRepr::parse(&frames[0].1).expect("frame");
        assert_eq!(eth.dst_addr.0, ce);
        assert!(
            matches!(eth.vlans, VlanTags::Double { outer, inner } if outer.vid == s_tag && inner.vid == 10)
        );
        assert_eq!(eth.ethertype, EtherType::IPV4);
        let ipp = Ipv4Packet::new_checked(&frames[0].1[off..]).expect("ipv4");
        assert_eq!(ipp.ttl(), 63, "routed: TTL decremented");
    }

    // And each CE reaches the VM of its own VNet (its MAC was learned from the frames above).
    for (s_tag, ce, vni) in [(100u16, CE_A, 100u32), (200, CE_B, 200)] {
        let pkt = udp4("10.99.0.2", 9, "10.0.0.5", 7, 64, b"ping");
        e.recv_from_ce(ce_frame(s_tag, e.gw_mac, ce, 0x0800, &pkt));
        let (frames, datagrams) = e.sent();
        assert!(frames.is_empty());
        assert_eq!(datagrams.len(), 1, "one VXLAN datagram");
        assert_eq!(datagrams[0].0.ip(), ip(HOST));
        let (got_vni, dst, _, ty, payload) = parse_vxlan(&datagrams[0].1);
        assert_eq!((got_vni, dst, ty), (vni, VM_MAC, EtherType::IPV4));
        assert_eq!(Ipv4Packet::new_checked(&payload[..]).expect("ip").ttl(), 63);
    }
}

#[test]
fn bad_frames_are_dropped_and_counted_by_reason() {
    let mut e = env();
    let pkt = udp4("10.99.0.2", 9, "10.0.0.5", 7, 64, b"x");
    // An unknown tag pair, an untagged frame.
    e.recv_from_ce(ce_frame(300, e.gw_mac, CE_A, 0x0800, &pkt));
    let mut untagged = e.gw_mac.to_vec();
    untagged.extend_from_slice(&CE_A);
    untagged.extend_from_slice(&[0x08, 0x00]);
    untagged.extend_from_slice(&pkt);
    e.recv_from_ce(untagged);
    assert_eq!(e.drops(DropReason::AttachUnknownTags), 2);
    // A wrong EtherType inside the tags (LLDP), and IPv4 labelled IPv6.
    e.recv_from_ce(ce_frame(100, e.gw_mac, CE_A, 0x88cc, &pkt));
    e.recv_from_ce(ce_frame(100, e.gw_mac, CE_A, 0x86dd, &pkt));
    assert_eq!(e.drops(DropReason::AttachEthertype), 2);
    // A source that is not behind the CE, and a frame for another MAC.
    let spoofed = udp4("172.16.0.9", 9, "10.0.0.5", 7, 64, b"x");
    e.recv_from_ce(ce_frame(100, e.gw_mac, CE_A, 0x0800, &spoofed));
    // The gateway's own address, although within the CE's segment prefix.
    let spoofed = udp4("10.99.0.1", 9, "10.0.0.5", 7, 64, b"x");
    e.recv_from_ce(ce_frame(100, e.gw_mac, CE_A, 0x0800, &spoofed));
    assert_eq!(e.drops(DropReason::AttachSource), 2);
    e.recv_from_ce(ce_frame(100, [0x52, 0, 0, 0, 0, 9], CE_A, 0x0800, &pkt));
    assert_eq!(e.drops(DropReason::AttachNotForGateway), 1);
    assert_eq!(e.sent(), (vec![], vec![]));
}

#[test]
fn vnet_traffic_not_behind_a_ce_goes_on_to_the_tunnels() {
    let mut e = env();
    let gw = e.sh.tables.load().overlay.vnets[0].mac.0;
    // 192.168.0.9 is not behind tenant a's CE: the IPsec side is asked (no CHILD_SA yet).
    let pkt = udp4("10.0.0.5", 7, "192.168.0.9", 9, 64, b"x");
    e.recv_from_host(vxlan_frame(100, gw, VM_MAC, EtherType::IPV4, &pkt));
    assert_eq!(e.drops(DropReason::VxlanNoTunnel), 1);
    // Toward the CE before its MAC is known: counted (no ce_ip to ask for).
    let pkt = udp4("10.0.0.5", 7, "10.99.0.2", 9, 64, b"x");
    e.recv_from_host(vxlan_frame(100, gw, VM_MAC, EtherType::IPV4, &pkt));
    assert_eq!(e.drops(DropReason::AttachCeUnresolved), 1);
    // A source the VNet's routes do not place behind the sending host.
    let pkt = udp4("10.7.0.5", 7, "10.99.0.2", 9, 64, b"x");
    e.recv_from_host(vxlan_frame(100, gw, VM_MAC, EtherType::IPV4, &pkt));
    assert_eq!(e.drops(DropReason::AttachVnetSource), 1);
    assert_eq!(e.sent(), (vec![], vec![]));
}

#[test]
fn neighbour_solicitation_for_an_ipv6_gateway_is_answered_tagged() {
    use crate::vnet::nd::NdOut;
    use wire::ndp::{solicited_node_multicast, NdpRepr};
    let mut e = env();
    let gw: std::net::Ipv6Addr = "fd99::1".parse().expect("ip");
    let ce: std::net::Ipv6Addr = "fd99::2".parse().expect("ip");
    let group = solicited_node_multicast(&gw);
    let ns = NdOut {
        src: ce,
        dst: group,
        dst_mac: EthernetAddress::from_ipv6_multicast(&group).0,
        src_mac: EthernetAddress(CE_B),
        msg: NdpRepr::NeighborSolicit {
            target_addr: gw,
            source_lladdr: Some(EthernetAddress(CE_B)),
        },
    };
    let mut pkt = vec![0u8; ns.len()];
    ns.emit(&mut pkt).expect("fits");
    e.recv_from_ce(ce_frame(201, ns.dst_mac, CE_B, 0x86dd, &pkt));
    let (frames, datagrams) = e.sent();
    assert!(datagrams.is_empty());
    assert_eq!(frames.len(), 1, "one advertisement");
    let (eth, off) = EthernetRepr::parse(&frames[0].1).expect("frame");
    assert!(
        matches!(eth.vlans, VlanTags::Double { outer, inner } if outer.vid == 201 && inner.vid == 10)
    );
    assert_eq!((eth.dst_addr.0, eth.src_addr.0), (CE_B, e.gw_mac));
    let ip6 = wire::ip::Ipv6Packet::new_checked(&frames[0].1[off..]).expect("ipv6");
    assert_eq!((ip6.src_addr(), ip6.dst_addr()), (gw, ce));
    match NdpRepr::parse(
        &ip6.src_addr(),
        &ip6.dst_addr(),
        ip6.hop_limit(),
        ip6.payload(),
    ) {
        Ok(NdpRepr::NeighborAdvert {
            flags,
            target_addr,
            target_lladdr,
        }) => {
            assert!(flags.router && flags.solicited);
            assert_eq!(target_addr, gw);
            assert_eq!(target_lladdr, Some(EthernetAddress(e.gw_mac)));
        }
        other => panic!("not an NA: {other:?}"),
    }
    // The IPv4 attachment on S-tag 200 is another: it ignores IPv6 neighbour discovery.
    e.recv_from_ce(ce_frame(200, ns.dst_mac, CE_B, 0x86dd, &pkt));
    assert_eq!(e.drops(DropReason::NeighIgnored), 1);
    // A solicitation sent unicast to another MAC is an IP frame not for the gateway.
    e.recv_from_ce(ce_frame(201, [0x52, 0, 0, 0, 0, 9], CE_B, 0x86dd, &pkt));
    assert_eq!(e.drops(DropReason::AttachNotForGateway), 1);
    assert_eq!(e.sent(), (vec![], vec![]));
}

#[test]
fn reserved_vlan_ids_are_no_attachments_tags() {
    let mut e = env();
    let pkt = udp4("10.98.0.2", 9, "10.0.0.5", 7, 64, b"x");
    // Q-in-Q with S-tag 0 or 4095 and C-tag 10 is not the single-tag attachment on C-tag 10.
    for s_tag in [0, 4095] {
        e.recv_from_ce(ce_frame(s_tag, e.gw_mac, CE_A, 0x0800, &pkt));
    }
    // Nor is a priority tag (VLAN id 0) or a single tag of 4095 anyone's.
    for c_tag in [0, 4095] {
        e.recv_from_ce(vlan_frame(c_tag, e.gw_mac, CE_A, 0x0800, &pkt));
    }
    assert_eq!(e.drops(DropReason::AttachUnknownTags), 4);
    assert_eq!(e.sent(), (vec![], vec![]));
    // The same packet on C-tag 10 alone reaches the VNet.
    e.recv_from_ce(vlan_frame(10, e.gw_mac, CE_A, 0x0800, &pkt));
    let (frames, datagrams) = e.sent();
    assert!(frames.is_empty());
    assert_eq!(datagrams.len(), 1, "one VXLAN datagram");
    let (vni, _, _, _, _) = parse_vxlan(&datagrams[0].1);
    assert_eq!(vni, 100, "tenant a's VNet");
}

/// The frame in `frames` toward the CE at `ce`: its IPv4 packet's TTL, after checking it is
/// tagged as `tags` says.
fn ttl_toward(frames: &[(usize, Vec<u8>)], ce: [u8; 6], tags: VlanTags) -> u8 {
    assert_eq!(frames.len(), 1, "one frame toward a CE");
    let (eth, off) = EthernetRepr::parse(&frames[0].1).expect("frame");
    assert_eq!((eth.dst_addr.0, eth.vlans), (ce, tags));
    Ipv4Packet::new_checked(&frames[0].1[off..])
        .expect("ipv4")
        .ttl()
}

#[test]
fn a_ce_reaches_another_ce_of_its_vnet_but_not_the_gateway_address() {
    use wire::ethernet::VlanTci;
    const CE_V: [u8; 6] = [0x52, 0x54, 0, 0, 0xc, 1];
    let mut e = env();
    e.arp_from_ce(100, CE_A);
    // The single-tag CE's MAC is learned from its first packet (no ce_ip).
    let hello = udp4("10.98.0.2", 9, "10.0.0.5", 7, 64, b"hello");
    e.recv_from_ce(vlan_frame(10, e.gw_mac, CE_V, 0x0800, &hello));
    e.sent();
    // Q-in-Q CE -> single-tag CE of the same VNet, and back.
    let pkt = udp4("10.99.0.2", 9, "10.98.0.2", 7, 64, b"x");
    e.recv_from_ce(ce_frame(100, e.gw_mac, CE_A, 0x0800, &pkt));
    let (frames, datagrams) = e.sent();
    assert!(datagrams.is_empty());
    let single = VlanTags::Single(VlanTci::from_bits(10));
    assert_eq!(ttl_toward(&frames, CE_V, single), 63);
    let pkt = udp4("10.98.0.2", 7, "10.99.0.2", 9, 64, b"y");
    e.recv_from_ce(vlan_frame(10, e.gw_mac, CE_V, 0x0800, &pkt));
    let (frames, _) = e.sent();
    let double = VlanTags::Double {
        outer: VlanTci::from_bits(100),
        inner: VlanTci::from_bits(10),
    };
    assert_eq!(ttl_toward(&frames, CE_A, double), 63);
    // Tenant b's CE on the same addresses reaches neither.
    e.arp_from_ce(200, CE_B);
    let pkt = udp4("10.99.0.2", 9, "10.98.0.2", 7, 64, b"z");
    e.recv_from_ce(ce_frame(200, e.gw_mac, CE_B, 0x0800, &pkt));
    assert_eq!(e.sent(), (vec![], vec![]));
    assert_eq!(e.drops(DropReason::NoRoute), 1);
    // The gateway's own address on the segment is behind no CE: not sent back out.
    let pkt = udp4("10.99.0.2", 9, "10.99.0.1", 7, 64, b"gw");
    e.recv_from_ce(ce_frame(100, e.gw_mac, CE_A, 0x0800, &pkt));
    assert_eq!(e.sent(), (vec![], vec![]));
    assert_eq!(e.drops(DropReason::ToGateway), 1);
}

#[test]
fn esp_from_the_vnets_site_goes_to_the_ce() {
    use crate::testutil::{child, ts, Peer};
    use wire::ethernet::VlanTci;
    const PEER: &str = "127.0.0.1:40001";
    let mut e = env();
    e.arp_from_ce(100, CE_A);
    let natt = e.sh.io.local_addr(e.sh.io.listen[0].natt);
    let a = child(
        1,
        0x1001,
        0x2001,
        natt,
        PEER.parse().expect("peer"),
        ts("10.0.0.0", "10.255.255.255"),
        ts("192.168.0.0", "192.168.0.255"),
    );
    e.sh.install_child(&a).expect("install");
    let peer = Peer::of(&a);
    e.recv_from_peer(
        PEER,
        peer.seal(&udp4("192.168.0.9", 2000, "10.99.0.2", 9, 64, b"in")),
    );
    let (frames, datagrams) = e.sent();
    assert!(datagrams.is_empty(), "{datagrams:?}");
    let double = VlanTags::Double {
        outer: VlanTci::from_bits(100),
        inner: VlanTci::from_bits(10),
    };
    assert_eq!(ttl_toward(&frames, CE_A, double), 63);
}

#[test]
fn an_interface_under_two_names_is_one_interface() {
    // In a network namespace of its own (this thread's), `lo` also named `lo-alt`.
    let run = || {
        // SAFETY: plain system call; affects this thread only.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        for args in [
            &["link", "set", "lo", "up"][..],
            &["link", "property", "add", "dev", "lo", "altname", "lo-alt"],
        ] {
            let st = std::process::Command::new("ip")
                .args(args)
                .status()
                .expect("ip");
            assert!(st.success(), "ip {args:?}");
        }
        let cfg = |second: AttachmentConfig| DataplaneConfig {
            listen: vec![ip("127.0.0.1")],
            ike_port: 0,
            natt_port: 0,
            vxlan_port: 4789,
            vnets: vec![vnet("a", 100), vnet("b", 200)],
            tunnels: vec![],
            tun_name: None,
            batch: 16,
            workers: 1,
            cpus: vec![],
            pin_workers: false,
            busy_poll: std::time::Duration::ZERO,
            busy_poll_budget: datapath::DEFAULT_BUSY_POLL_BUDGET,
            xdp: Default::default(),
            fair_kernel_gate: true,
            relay: None,
            dispatch: None,
            attachments: vec![attachment("a", "a", 100), second],
        };
        let alias = |s_tag| AttachmentConfig {
            port: datapath::AttachmentPort::Interface("lo-alt".into()),
            ..attachment("b", "b", s_tag)
        };
        // Other tags: one socket, both attachments on it (frames are read once).
        let (tx, _rx) = crossbeam_channel::unbounded();
        let sh = Shared::open(cfg(alias(200)), tx).expect("open");
        assert_eq!(sh.io.packet.len(), 1);
        assert_eq!(
            (sh.io.packet_iface(0), sh.io.packet_iface(1)),
            (Some(0), Some(0))
        );
        drop(sh);
        // The same tags under the other name are the same attachment's: refused.
        let (tx, _rx) = crossbeam_channel::unbounded();
        match Shared::open(cfg(alias(100)), tx) {
            Err(crate::DataplaneError::Config { field, .. }) => {
                assert_eq!(field, "attachments[1].tags");
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("the same tags twice on one interface were accepted"),
        }
    };
    std::thread::spawn(run)
        .join()
        .expect("in its own namespace");
}

mod tunnels;
