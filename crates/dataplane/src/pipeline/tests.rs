//! The packet paths driven in memory: datagrams are handed to the lanes' graph entry points
//! (`pipeline::graph`) directly and the send batch is inspected instead of sent. Sockets are
//! opened (on loopback, to build the shared state) but nothing is sent on them.

use super::classify::Via;
use super::graph;
use crate::io::output::Output;
use crate::out::Out;
use crate::shared::Shared;
use crate::stats::DropReason;
use crate::testutil::{arp, child, ip, parse_vxlan, ts, udp4, vxlan as vxlan_frame, Peer};
use crossbeam_channel::Receiver;
use datapath::{DataplaneConfig, Inside, Route, ToControl, TunnelBinding, VnetConfig};
use ike::{ChildSaInfo, TunnelId};
use std::net::SocketAddr;
use std::time::Instant;
use wire::arp::{ArpOperation, ArpPacket, ArpRepr};
use wire::ethernet::EtherType;
use wire::ip::Ipv4Packet;
use wire::EspSpi;

const VM_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 5];
const HOST: &str = "127.0.0.2";
const PEER_A: &str = "127.0.0.1:40001";
const PEER_B: &str = "127.0.0.1:40002";

struct Env {
    sh: Shared,
    rx: Receiver<ToControl>,
    out: Out,
    /// Output of packets the replay window refused (left out by `sent`).
    dead: Vec<std::ops::Range<usize>>,
}

/// A VNet of `tenant` (10.0.0.0/24 behind the host VTEP, gateway 10.0.0.1).
pub(super) fn vnet(tenant: &str, vni: u32) -> VnetConfig {
    VnetConfig {
        tenant: ids::TenantId::new(tenant).expect("tenant"),
        name: format!("{tenant}-net"),
        vni,
        gateway_ips: vec![ip("10.0.0.1")],
        vtep: ip("127.0.0.1"),
        routes: vec![Route {
            prefix: ip("10.0.0.0"),
            len: 24,
            host: ip(HOST),
        }],
        router_mac: None,
    }
}

/// Tunnel `tunnel` of `tenant`, delivering to `inside`.
pub(super) fn binding(tunnel: u32, tenant: &str, inside: Inside) -> TunnelBinding {
    TunnelBinding {
        tunnel: TunnelId(tunnel),
        name: format!("t{tunnel}"),
        tenant: ids::TenantId::new(tenant).expect("tenant"),
        inside,
    }
}

/// Two tenants with the same address plan on VNIs 100 and 200, tunnels 1 and 2.
fn env() -> Env {
    env_with(None)
}

/// [`env`] with self-dispatch `dispatch`.
fn env_with(dispatch: Option<datapath::DispatchConfig>) -> Env {
    let vnets = vec![vnet("a", 100), vnet("b", 200)];
    let tunnels = vec![
        binding(1, "a", Inside::Vnet(0)),
        binding(2, "b", Inside::Vnet(1)),
    ];
    for _ in 0..20 {
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .expect("free port")
            .port();
        let cfg = DataplaneConfig {
            attachments: vec![],
            listen: vec![ip("127.0.0.1")],
            ike_port: 0,
            natt_port: 0,
            vxlan_port: port,
            vnets: vnets.clone(),
            tunnels: tunnels.clone(),
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
            dispatch: dispatch.clone(),
        };
        let (tx, rx) = crossbeam_channel::unbounded();
        match Shared::open(cfg, tx) {
            Ok(sh) => {
                return Env {
                    out: Output::standalone(&sh, 16),
                    sh,
                    rx,
                    dead: Vec::new(),
                }
            }
            Err(crate::DataplaneError::Bind { .. }) => continue,
            Err(e) => panic!("open: {e}"),
        }
    }
    panic!("no free VXLAN port");
}

impl Env {
    fn natt(&self) -> SocketAddr {
        self.sh.io.local_addr(self.sh.io.listen[0].natt)
    }

    fn host(&self) -> SocketAddr {
        SocketAddr::new(ip(HOST), self.sh.cfg.vxlan_port)
    }

    fn child(&self, tunnel: u32, spi: u32, peer: &str) -> ChildSaInfo {
        child(
            tunnel,
            spi,
            spi + 0x1000,
            self.natt(),
            peer.parse().expect("peer"),
            ts("10.0.0.0", "10.0.0.255"),
            ts("192.168.0.0", "192.168.0.255"),
        )
    }

    /// Runs `f` as a lane's batch would: over the published tables (which the output uses
    /// too) and the per-VM routes.
    fn in_batch<R>(
        &mut self,
        f: impl FnOnce(&mut Out, &Shared, &crate::tables::Tables, &crate::routes::Routes) -> R,
    ) -> R {
        let t = self.sh.tables.load();
        self.out.use_tables(std::sync::Arc::clone(&t));
        let reader = self.sh.route_readers.reader();
        let guard = reader.enter();
        let r = guard
            .as_deref()
            .unwrap_or(crate::routes::RouteReader::empty());
        f(&mut self.out, &self.sh, &t, r)
    }

    fn recv_from_host(&mut self, from: SocketAddr, mut data: Vec<u8>) {
        self.in_batch(|o, sh, t, r| {
            graph::vxlan(o, sh, t, r, Instant::now(), Via::Vtep(0), from, &mut data);
        });
        // What the worker does before the batch leaves: seal the queued ESP packets.
        self.out.seal_queued();
    }

    fn recv_from_peer(&mut self, from: &str, data: Vec<u8>) {
        self.recv_batch_from_peer(from, vec![data]);
    }

    /// Several datagrams opened before the batch's acceptance runs (as one lane batch).
    fn recv_batch_from_peer(&mut self, from: &str, batch: Vec<Vec<u8>>) {
        for data in batch {
            self.open_from_peer(from, data);
        }
        // What the lane's sender does before the batch leaves: accept what was opened, in
        // order, and leave out the output of refused packets.
        let tx = &mut self.out.tx;
        crate::accept::accept_batch(&self.sh, tx, &mut self.dead, &mut self.out.drops);
        tx.accepts.clear();
    }

    fn open_from_peer(&mut self, from: &str, mut data: Vec<u8>) {
        let local = self.natt();
        self.in_batch(|o, sh, t, r| {
            let now = Instant::now();
            let mut d = graph::Deliveries::new();
            graph::natt(
                o,
                sh,
                t,
                r,
                now,
                local,
                from.parse().expect("peer"),
                &mut data,
                &mut d,
            );
            d.flush(o, sh, t, r, now);
        });
    }

    /// Datagrams queued for sending, and empties the batch.
    fn sent(&mut self) -> Vec<(SocketAddr, Vec<u8>)> {
        let base = self.out.tx.data().as_ptr() as usize;
        let v = self
            .out
            .tx
            .datagrams()
            .filter(|(_, _, d)| !crate::accept::is_dead(&self.dead, d.as_ptr() as usize - base))
            .map(|(_, dst, d)| (dst, d.to_vec()))
            .collect();
        self.out.tx.clear();
        self.dead.clear();
        v
    }

    /// The VM at 10.0.0.5 answers the gateway's ARP request (over VXLAN from its host).
    fn vm_answers_arp(&mut self) {
        self.vm_answers_arp_on(100, 0);
    }

    /// The same in VNet `vnet` (VNI `vni`).
    fn vm_answers_arp_on(&mut self, vni: u32, vnet: usize) {
        let gw = gw_mac(self, vnet);
        let reply = arp(ArpOperation::REPLY, VM_MAC, "10.0.0.5", gw, "10.0.0.1");
        self.recv_from_host(
            self.host(),
            vxlan_frame(vni, gw, VM_MAC, EtherType::ARP, &reply),
        );
    }

    fn drops(&self, r: DropReason) -> u64 {
        self.out.drops.get(r)
    }
}

/// A VXLAN frame (VNI 100) carrying a neighbour solicitation for `target` from the VM whose
/// MAC is `vm` (from its link-local address, to the target's solicited-node group).
fn solicitation(vm: [u8; 6], target: std::net::Ipv6Addr) -> Vec<u8> {
    use wire::ip::{IpProtocol, Ipv6Repr};
    use wire::ndp::{NdpRepr, ND_HOP_LIMIT};
    let src = crate::vnet::link_local(wire::ethernet::EthernetAddress(vm));
    let dst = wire::ndp::solicited_node_multicast(&target);
    let ns = NdpRepr::NeighborSolicit {
        target_addr: target,
        source_lladdr: Some(wire::ethernet::EthernetAddress(vm)),
    };
    let mut pkt = vec![0u8; 40 + ns.buffer_len()];
    ns.emit(&src, &dst, &mut pkt[40..]).expect("ns");
    Ipv6Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::ICMPV6,
        payload_len: ns.buffer_len(),
        hop_limit: ND_HOP_LIMIT,
        traffic_class: 0,
        flow_label: 0,
    }
    .emit(&mut pkt)
    .expect("ipv6");
    let mcast = wire::ethernet::EthernetAddress::from_ipv6_multicast(&dst).0;
    vxlan_frame(100, mcast, vm, EtherType::IPV6, &pkt)
}

fn spi_of(esp: &[u8]) -> u32 {
    u32::from_be_bytes([esp[0], esp[1], esp[2], esp[3]])
}

fn gw_mac(e: &Env, vnet: usize) -> [u8; 6] {
    e.sh.tables.load().overlay.vnets[vnet].mac.0
}

#[test]
fn arp_request_for_gateway_is_answered() {
    let mut e = env();
    let req = arp(
        ArpOperation::REQUEST,
        VM_MAC,
        "10.0.0.5",
        [0; 6],
        "10.0.0.1",
    );
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, [0xff; 6], VM_MAC, EtherType::ARP, &req),
    );
    let sent = e.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, e.host());
    let (vni, dst, src, ty, payload) = parse_vxlan(&sent[0].1);
    assert_eq!(
        (vni, dst, src, ty),
        (100, VM_MAC, gw_mac(&e, 0), EtherType::ARP)
    );
    assert!(payload.len() >= 46, "padded to the Ethernet minimum");
    let reply = ArpRepr::parse(&ArpPacket::new_checked(&payload[..]).expect("arp")).expect("arp");
    assert_eq!(reply.operation, ArpOperation::REPLY);
    assert_eq!(reply.source_hardware_addr.0, gw_mac(&e, 0));
    assert_eq!(reply.source_protocol_addr.to_string(), "10.0.0.1");
    // VNI 200 answers with its own MAC.
    e.recv_from_host(
        e.host(),
        vxlan_frame(200, [0xff; 6], VM_MAC, EtherType::ARP, &req),
    );
    let (vni, _, src, _, _) = parse_vxlan(&e.sent()[0].1);
    assert_eq!((vni, src), (200, gw_mac(&e, 1)));
    // Requests for other VMs are not answered.
    let other = arp(
        ArpOperation::REQUEST,
        VM_MAC,
        "10.0.0.5",
        [0; 6],
        "10.0.0.7",
    );
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, [0xff; 6], VM_MAC, EtherType::ARP, &other),
    );
    assert!(e.sent().is_empty());
}

#[test]
fn two_tenants_with_the_same_addresses_stay_apart() {
    let mut e = env();
    let a = e.child(1, 0x1001, PEER_A);
    let b = e.child(2, 0x1002, PEER_B);
    e.sh.install_child(&a).expect("install a");
    e.sh.install_child(&b).expect("install b");
    let (pa, pb) = (Peer::of(&a), Peer::of(&b));
    let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, b"hello");
    for (vni, gw, peer, expect_spi, p) in
        [(100, 0, PEER_A, 0x2001, &pa), (200, 1, PEER_B, 0x2002, &pb)]
    {
        let frame = vxlan_frame(vni, gw_mac(&e, gw), VM_MAC, EtherType::IPV4, &inner);
        e.recv_from_host(e.host(), frame);
        let sent = e.sent();
        assert_eq!(sent.len(), 1, "vni {vni}");
        assert_eq!(sent[0].0, peer.parse::<SocketAddr>().expect("addr"));
        assert_eq!(spi_of(&sent[0].1), expect_spi);
        let got = p.open(&sent[0].1).expect("peer opens");
        let ip4 = Ipv4Packet::new_checked(&got[..]).expect("ipv4");
        assert_eq!(ip4.ttl(), 63, "routed: TTL decremented");
        assert!(ip4.verify_checksum());
        assert_eq!(&got[28..], b"hello");
    }
    // The other tenant's peer cannot open it.
    let frame = vxlan_frame(100, gw_mac(&e, 0), VM_MAC, EtherType::IPV4, &inner);
    e.recv_from_host(e.host(), frame);
    assert!(pb.open(&e.sent()[0].1).is_err());
    // Unknown VNI, unknown host, wrong MAC, no covering selector.
    e.recv_from_host(
        e.host(),
        vxlan_frame(300, gw_mac(&e, 0), VM_MAC, EtherType::IPV4, &inner),
    );
    e.recv_from_host(
        SocketAddr::new(ip("127.0.0.3"), 4789),
        vxlan_frame(100, gw_mac(&e, 0), VM_MAC, EtherType::IPV4, &inner),
    );
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, gw_mac(&e, 1), VM_MAC, EtherType::IPV4, &inner),
    );
    let outside = udp4("10.0.0.5", 1000, "172.16.0.9", 2000, 64, b"x");
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, gw_mac(&e, 0), VM_MAC, EtherType::IPV4, &outside),
    );
    let ttl1 = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 1, b"x");
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, gw_mac(&e, 0), VM_MAC, EtherType::IPV4, &ttl1),
    );
    e.recv_from_host(e.host(), vec![0x08, 0, 0]);
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, gw_mac(&e, 0), VM_MAC, EtherType(0x88cc), &inner),
    );
    assert!(e.sent().is_empty());
    assert_eq!(e.drops(DropReason::VxlanUnknownVni), 1);
    assert_eq!(e.drops(DropReason::VxlanUnknownHost), 1);
    assert_eq!(e.drops(DropReason::VxlanNotForGateway), 1);
    assert_eq!(e.drops(DropReason::VxlanNoTunnel), 1);
    assert_eq!(e.drops(DropReason::TtlExceeded), 1);
    assert_eq!(e.drops(DropReason::VxlanMalformed), 1);
    assert_eq!(e.drops(DropReason::VxlanEthertype), 1);
}

#[test]
fn esp_to_vm_resolves_the_mac_then_delivers() {
    let mut e = env();
    let a = e.child(1, 0x1001, PEER_A);
    e.sh.install_child(&a).expect("install");
    let peer = Peer::of(&a);
    let inner = udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"first");
    e.recv_from_peer(PEER_A, peer.seal(&inner));
    // Queued; an ARP request went to the host.
    let sent = e.sent();
    assert_eq!(sent.len(), 1);
    let (vni, dst, src, ty, payload) = parse_vxlan(&sent[0].1);
    assert_eq!(
        (vni, dst, src, ty),
        (100, [0xff; 6], gw_mac(&e, 0), EtherType::ARP)
    );
    let req = ArpRepr::parse(&ArpPacket::new_checked(&payload[..]).expect("arp")).expect("arp");
    assert_eq!(req.target_protocol_addr.to_string(), "10.0.0.5");
    // The VM answers; the queued packet leaves.
    e.vm_answers_arp();
    let sent = e.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, e.host());
    let (vni, dst, src, ty, payload) = parse_vxlan(&sent[0].1);
    assert_eq!(
        (vni, dst, src, ty),
        (100, VM_MAC, gw_mac(&e, 0), EtherType::IPV4)
    );
    let p = Ipv4Packet::new_checked(&payload[..]).expect("ipv4");
    assert_eq!(p.ttl(), 63);
    assert!(p.verify_checksum());
    // Resolved now: the next packet goes straight out.
    e.recv_from_peer(
        PEER_A,
        peer.seal(&udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"second")),
    );
    assert_eq!(e.sent().len(), 1);
    let stats = e.sh.registry().stats();
    assert_eq!((stats[0].packets_in, stats[0].drops_in), (2, 0));
}

#[test]
fn a_copy_opened_in_the_same_batch_is_refused_when_accepted() {
    let mut e = env();
    let a = e.child(1, 0x1001, PEER_A);
    e.sh.install_child(&a).expect("install");
    let peer = Peer::of(&a);
    let seal = |body: &[u8]| peer.seal(&udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, body));
    // Resolve the VM first (the first packet waits for it and is accepted before it waits).
    e.recv_from_peer(PEER_A, seal(b"first"));
    e.vm_answers_arp();
    assert_eq!(e.sent().len(), 2, "ARP request and the first packet");
    // Both copies pass the check before decryption and are delivered into the batch; the
    // window accepts the first and refuses the second, whose frame is left out.
    let (p2, p3) = (seal(b"second"), seal(b"third"));
    e.recv_batch_from_peer(PEER_A, vec![p2.clone(), p2, p3]);
    let bodies: Vec<Vec<u8>> = e
        .sent()
        .iter()
        .map(|(_, d)| parse_vxlan(d).4[28..].to_vec())
        .collect();
    assert_eq!(bodies, vec![b"second".to_vec(), b"third".to_vec()]);
    assert_eq!(e.drops(DropReason::EspReplay), 1);
    let stats = e.sh.registry().stats();
    assert_eq!((stats[0].packets_in, stats[0].drops_in), (3, 1));
}

#[test]
fn bad_esp_is_counted_never_delivered() {
    let mut e = env();
    let a = e.child(1, 0x1001, PEER_A);
    e.sh.install_child(&a).expect("install");
    let peer = Peer::of(&a);
    let good = peer.seal(&udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"x"));
    e.recv_from_peer(PEER_A, good.clone());
    e.recv_from_peer(PEER_A, good.clone()); // replay
    let mut forged = peer.seal(&udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"y"));
    let last = forged.len() - 1;
    forged[last] ^= 1;
    e.recv_from_peer(PEER_A, forged);
    let mut unknown = good.clone();
    unknown[..4].copy_from_slice(&0x7777u32.to_be_bytes());
    e.recv_from_peer(PEER_A, unknown);
    e.recv_from_peer(PEER_A, vec![0xff]); // NAT keepalive
    e.recv_from_peer(PEER_A, vec![1, 2, 3]);
    e.recv_from_peer(PEER_A, good[..12].to_vec()); // truncated ESP
                                                   // Outside the negotiated selectors (RFC 4301 §5.2).
    e.recv_from_peer(
        PEER_A,
        peer.seal(&udp4("172.16.0.1", 2000, "10.0.0.5", 1000, 64, b"z")),
    );
    e.recv_from_peer(
        PEER_A,
        peer.seal(&udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 1, b"t")),
    );
    assert_eq!(
        e.sent().len(),
        1,
        "only the ARP request for the first packet"
    );
    for (r, n) in [
        (DropReason::EspReplay, 1),
        (DropReason::EspAuth, 1),
        (DropReason::EspUnknownSpi, 1),
        (DropReason::NattKeepalive, 1),
        (DropReason::MalformedUdp, 1),
        (DropReason::EspMalformed, 1),
        (DropReason::EspPolicy, 1),
        (DropReason::TtlExceeded, 1),
    ] {
        assert_eq!(e.drops(r), n, "{}", r.name());
    }
    let stats = e.sh.registry().stats();
    assert_eq!(stats[0].drops_in, 4, "replay, forged, truncated, policy");
}

#[test]
fn ike_on_the_natt_port_goes_to_control_without_marker() {
    let mut e = env();
    let mut msg = vec![0, 0, 0, 0];
    msg.extend_from_slice(&[0x11; 28]);
    e.recv_from_peer(PEER_A, msg);
    match e.rx.try_recv() {
        Ok(ToControl::Ike(d)) => {
            assert_eq!(d.data, vec![0x11; 28]);
            assert_eq!(d.remote, PEER_A.parse::<SocketAddr>().expect("addr"));
            assert_eq!(d.local, e.natt());
        }
        other => panic!("expected IKE, got {other:?}"),
    }
}

#[test]
fn rekey_moves_outbound_at_once_and_keeps_old_inbound() {
    let mut e = env();
    let old = e.child(1, 0x1001, PEER_A);
    e.sh.install_child(&old).expect("install");
    let mut new = e.child(1, 0x1003, PEER_A);
    new.replaces = Some(EspSpi(0x1001));
    e.sh.install_child(&new).expect("install rekeyed");
    let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, b"out");
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, gw_mac(&e, 0), VM_MAC, EtherType::IPV4, &inner),
    );
    assert_eq!(spi_of(&e.sent()[0].1), 0x2003);
    // The old inbound SA still accepts.
    let peer_old = Peer::of(&old);
    e.recv_from_peer(
        PEER_A,
        peer_old.seal(&udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"in")),
    );
    assert_eq!(e.sent().len(), 1, "ARP request: the packet was accepted");
    e.sh.remove_child(TunnelId(1), EspSpi(0x1001), EspSpi(0x2001));
    // Removed: late packets of the old SA are still opened during the grace...
    e.recv_from_peer(
        PEER_A,
        peer_old.seal(&udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"in")),
    );
    assert_eq!(
        e.drops(DropReason::EspUnknownSpi),
        0,
        "accepted in the grace"
    );
    // ...but not after it.
    e.sh.expire_retired(Instant::now() + crate::control::RETIRE_GRACE);
    e.recv_from_peer(
        PEER_A,
        peer_old.seal(&udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"in")),
    );
    assert_eq!(e.drops(DropReason::EspUnknownSpi), 1);
    // The tunnel's totals keep what the forgotten SA opened (its two inbound packets) and
    // the live one's outbound packet.
    let counters = e.sh.registry().counters();
    let children = counters.children();
    assert_eq!(children.len(), 1, "only the new SA is left");
    let tunnels = counters.tunnels(&children);
    assert_eq!(tunnels.len(), 1);
    assert_eq!(tunnels[0].0, TunnelId(1));
    assert_eq!((tunnels[0].1.packets_in, tunnels[0].1.packets_out), (2, 1));
    // Removing the new one leaves the tunnel without SAs.
    e.sh.remove_child(TunnelId(1), EspSpi(0x1003), EspSpi(0x2003));
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, gw_mac(&e, 0), VM_MAC, EtherType::IPV4, &inner),
    );
    assert_eq!(e.drops(DropReason::VxlanNoTunnel), 1);
}

/// The responder of a rekey receives on the new SA at once but keeps sending on the old one
/// (the peer installs the new one only when our answer arrives) until the old one is removed.
#[test]
fn rekey_answered_keeps_sending_on_old_until_it_is_removed() {
    let mut e = env();
    let old = e.child(1, 0x1001, PEER_A);
    e.sh.install_child(&old).expect("install");
    let mut new = e.child(1, 0x1003, PEER_A);
    new.replaces = Some(EspSpi(0x1001));
    new.outbound_active = false;
    e.sh.install_child(&new)
        .expect("install rekeyed, inbound only");
    let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, b"out");
    let out = |e: &mut Env| {
        e.recv_from_host(
            e.host(),
            vxlan_frame(100, gw_mac(e, 0), VM_MAC, EtherType::IPV4, &inner),
        );
        spi_of(&e.sent().last().expect("sent").1)
    };
    assert_eq!(out(&mut e), 0x2001, "still sending on the old SA");
    // The new inbound SA accepts already.
    let peer_new = Peer::of(&new);
    e.recv_from_peer(
        PEER_A,
        peer_new.seal(&udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"in")),
    );
    assert_eq!(e.sent().len(), 1, "ARP request: the packet was accepted");
    // The peer deleted the old SA: the new one sends.
    e.sh.remove_child(TunnelId(1), EspSpi(0x1001), EspSpi(0x2001));
    assert_eq!(out(&mut e), 0x2003);
}

#[test]
fn install_is_validated() {
    let e = env();
    let mut c = e.child(9, 0x1001, PEER_A);
    assert!(e.sh.install_child(&c).is_err(), "unbound tunnel");
    c.tunnel = TunnelId(1);
    c.inbound_spi = EspSpi(5);
    assert!(e.sh.install_child(&c).is_err(), "reserved SPI");
    c.inbound_spi = EspSpi(0x1001);
    c.local = "127.0.0.9:4500".parse().expect("addr");
    assert!(e.sh.install_child(&c).is_err(), "no socket on local");
    let c = e.child(1, 0x1001, PEER_A);
    e.sh.install_child(&c).expect("install");
    assert!(e.sh.install_child(&c).is_err(), "duplicate SPI");
}

#[test]
fn update_peer_moves_outbound_destination() {
    let mut e = env();
    let a = e.child(1, 0x1001, PEER_A);
    e.sh.install_child(&a).expect("install");
    let moved: SocketAddr = "127.0.0.1:45000".parse().expect("addr");
    e.sh.update_peer(TunnelId(1), a.ike, e.natt(), moved);
    let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, b"out");
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, gw_mac(&e, 0), VM_MAC, EtherType::IPV4, &inner),
    );
    assert_eq!(e.sent()[0].0, moved);
}

/// The peer's NAT rebinds while only ESP flows: the first authentic, newest packet from the
/// new address moves the SA's outbound destination at once and is reported to control once;
/// an older packet (reordered from before the move) and a forged one move nothing.
#[test]
fn authentic_esp_from_a_new_address_moves_the_sa() {
    let mut e = env();
    let a = e.child(1, 0x1001, PEER_A);
    e.sh.install_child(&a).expect("install");
    let peer = Peer::of(&a);
    let inner = |n: u8| udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, &[n; 8]);
    let early = peer.seal(&inner(1));
    let later = peer.seal(&inner(2));
    e.recv_from_peer(PEER_A, later);
    e.sent();
    assert!(e.rx.try_recv().is_err(), "same address: nothing to report");

    // A forged packet from a new address: dropped, no move.
    let mut forged = peer.seal(&inner(3));
    let last = forged.len() - 1;
    forged[last] ^= 1;
    e.recv_from_peer(PEER_B, forged);
    assert!(e.rx.try_recv().is_err(), "forged ESP moved the SA");
    // An authentic but older packet (sequence number below the newest) from the new
    // address: accepted, no move.
    e.recv_from_peer(PEER_B, early);
    e.sent();
    assert!(
        e.rx.try_recv().is_err(),
        "a reordered old packet moved the SA"
    );

    // Newest and authentic: moved and reported once.
    e.recv_from_peer(PEER_B, peer.seal(&inner(4)));
    e.recv_from_peer(PEER_B, peer.seal(&inner(5)));
    e.sent();
    let moved: SocketAddr = PEER_B.parse().expect("addr");
    match e.rx.try_recv() {
        Ok(ToControl::PeerAddressSeen {
            inbound_spi,
            local,
            remote,
        }) => {
            assert_eq!(
                (inbound_spi, local, remote),
                (a.inbound_spi, e.natt(), moved)
            );
        }
        other => panic!("expected PeerAddressSeen, got {other:?}"),
    }
    assert!(e.rx.try_recv().is_err(), "reported more than once");
    // Answers go to the new address already.
    let out = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, b"out");
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, gw_mac(&e, 0), VM_MAC, EtherType::IPV4, &out),
    );
    let host = e.host();
    let to_peer: Vec<SocketAddr> = e
        .sent()
        .into_iter()
        .map(|(to, _)| to)
        .filter(|to| *to != host)
        .collect();
    assert_eq!(to_peer, vec![moved]);
}

#[test]
fn ipv6_neighbor_solicitation_for_v4_gateway_link_local_is_answered() {
    use wire::ndp::NdpRepr;
    let mut e = env();
    let target = e.sh.tables.load().overlay.vnets[0].link_local;
    e.recv_from_host(e.host(), solicitation(VM_MAC, target));
    let sent = e.sent();
    assert_eq!(sent.len(), 1);
    let (_, dmac, smac, ty, payload) = parse_vxlan(&sent[0].1);
    assert_eq!((dmac, smac, ty), (VM_MAC, gw_mac(&e, 0), EtherType::IPV6));
    let p = wire::ip::Ipv6Packet::new_checked(&payload[..]).expect("ipv6");
    let na =
        NdpRepr::parse(&p.src_addr(), &p.dst_addr(), p.hop_limit(), p.payload()).expect("valid NA");
    assert!(matches!(na, NdpRepr::NeighborAdvert { target_addr, .. } if target_addr == target));
}

#[test]
fn sequence_number_exhaustion_asks_for_one_rekey() {
    let mut e = env();
    let a = e.child(1, 0x1001, PEER_A);
    e.sh.install_child_with(&a, Some(3)).expect("install");
    let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, b"out");
    for _ in 0..6 {
        e.recv_from_host(
            e.host(),
            vxlan_frame(100, gw_mac(&e, 0), VM_MAC, EtherType::IPV4, &inner),
        );
    }
    assert_eq!(
        e.sent().len(),
        6,
        "the SA keeps working until its hard limit"
    );
    let rekeys: Vec<_> = e.rx.try_iter().collect();
    assert_eq!(rekeys.len(), 1, "{rekeys:?}");
    assert!(matches!(rekeys[0], ToControl::RekeyNeeded(spi) if spi == EspSpi(0x1001)));
}

#[test]
fn arbitrary_and_mutated_input_never_panics() {
    let mut e = env();
    let a = e.child(1, 0x1001, PEER_A);
    e.sh.install_child(&a).expect("install");
    let peer = Peer::of(&a);
    let gw = gw_mac(&e, 0);
    let seeds = [
        vxlan_frame(
            100,
            gw,
            VM_MAC,
            EtherType::IPV4,
            &udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, b"abc"),
        ),
        vxlan_frame(
            100,
            [0xff; 6],
            VM_MAC,
            EtherType::ARP,
            &arp(
                ArpOperation::REQUEST,
                VM_MAC,
                "10.0.0.5",
                [0; 6],
                "10.0.0.1",
            ),
        ),
        peer.seal(&udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"xyz")),
        vec![0, 0, 0, 0, 1, 2, 3],
    ];
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..20_000 {
        let mut d = seeds[(next() % seeds.len() as u64) as usize].clone();
        match next() % 4 {
            0 => d.truncate((next() % (d.len() as u64 + 1)) as usize),
            1 => {
                for _ in 0..(next() % 4 + 1) {
                    let i = (next() % d.len() as u64) as usize;
                    d[i] ^= next() as u8 | 1;
                }
            }
            2 => d = (0..next() % 200).map(|_| next() as u8).collect(),
            _ => {}
        }
        if round % 2 == 0 {
            e.recv_from_host(e.host(), d);
        } else {
            e.recv_from_peer(PEER_A, d);
        }
        if round % 64 == 0 {
            e.out.tx.clear();
            while e.rx.try_recv().is_ok() {}
        }
    }
    let dropped: u64 = crate::stats::DropReason::ALL
        .iter()
        .map(|r| e.drops(*r))
        .sum();
    assert!(
        dropped > 10_000,
        "most mutated input is dropped and counted ({dropped})"
    );
}

#[test]
fn vnets_and_bindings_are_replaced_at_run_time_on_the_start_vteps() {
    let mut e = env();
    let a = e.child(1, 0x1001, PEER_A);
    let b = e.child(2, 0x1002, PEER_B);
    e.sh.install_child(&a).expect("install a");
    e.sh.install_child(&b).expect("install b");
    // VNet c (VNI 300) is added on the same VTEP; b's VNet goes with its tunnel; the VNets
    // swap places, so tunnel 1's CHILD_SA follows its binding to index 1.
    let c = vnet("c", 300);
    e.sh.set_inside(
        vec![c, vnet("a", 100)],
        vec![binding(1, "a", Inside::Vnet(1))],
    )
    .expect("set inside");
    let stats = e.sh.registry().stats();
    assert_eq!(
        stats.len(),
        1,
        "tunnel 2 is no longer bound: its SA is gone"
    );
    assert_eq!(stats[0].inbound_spi, EspSpi(0x1001));
    let req = arp(
        ArpOperation::REQUEST,
        VM_MAC,
        "10.0.0.5",
        [0; 6],
        "10.0.0.1",
    );
    for (vni, vnet) in [(300, 0), (100, 1)] {
        e.recv_from_host(
            e.host(),
            vxlan_frame(vni, [0xff; 6], VM_MAC, EtherType::ARP, &req),
        );
        let sent = e.sent();
        assert_eq!(sent.len(), 1, "VNI {vni} answered");
        let (got, _, src, _, _) = parse_vxlan(&sent[0].1);
        assert_eq!((got, src), (vni, gw_mac(&e, vnet)));
    }
    e.recv_from_host(
        e.host(),
        vxlan_frame(200, [0xff; 6], VM_MAC, EtherType::ARP, &req),
    );
    assert!(e.sent().is_empty());
    assert_eq!(e.drops(DropReason::VxlanUnknownVni), 1);
    // Tunnel 1 still carries VNet a's traffic, now at index 1.
    let pa = Peer::of(&a);
    e.vm_answers_arp_on(100, 1);
    let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, b"still");
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, gw_mac(&e, 1), VM_MAC, EtherType::IPV4, &inner),
    );
    let sent = e.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(&pa.open(&sent[0].1).expect("peer a opens")[28..], b"still");
    // A VNet on a VTEP that was not opened at start is refused, naming it.
    let mut far = vnet("a", 100);
    far.vtep = ip("127.0.0.77");
    match e.sh.set_inside(vec![far], vec![]) {
        Err(crate::DataplaneError::Config { field, .. }) => assert_eq!(field, "vnets[0].vtep"),
        other => panic!("expected a config error, got {other:?}"),
    }
}

mod attach;
mod dispatch;
mod relay;
