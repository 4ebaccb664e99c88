//! The relay path driven in memory, like `pipeline/tests.rs`: Geneve frames from a (fake) steer
//! node are handed to the relay lane's graph ([`crate::pipeline::graph::relay`]) and the send batch is inspected instead of sent. The
//! Geneve and VTEP sockets are opened on loopback (to build the shared state), nothing is
//! sent on them.

use super::{binding, vnet};
use crate::feature::{Direction, Feature, FeatureBatch, FeatureChain};
use crate::io::output::Output;
use crate::out::Out;
use crate::pipeline::classify::Pass;
use crate::pipeline::graph::{end_pass, relay as receive, Deliveries};
use crate::relays::{Relays, HEARD_WINDOW_MS};
use crate::shared::Shared;
use crate::stats::DropReason;
use crate::testutil::{arp, child, ip, parse_vxlan, ts, udp4, vxlan as vxlan_frame, Peer};
use datapath::{
    DataplaneConfig, DataplaneError, Inside, RelayConfig, ToControl, TunnelBinding, VnetConfig,
};
use ike::ChildSaInfo;
use proptest::prelude::*;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wire::arp::{ArpOperation, ArpPacket, ArpRepr};
use wire::ethernet::EtherType;
use wire::geneve::{GeneveBuilder, GeneveRepr, HealthProbe, ProtegoOption};
use wire::ip::{Ipv4Packet, Ipv6Packet};
use wire::relay::{emit_frame, parse_frame};
use wire::udp::UdpPacket;
use wire::vxlan::Vni;

const VM_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 5];
/// The steer node's Geneve address (nothing listens there: nothing is sent in memory).
const STEER: &str = "127.0.0.9:6081";
/// Another steer node.
const STEER2: &str = "127.0.0.10:6081";
/// The VIP the steer nodes own.
const VIP: &str = "203.0.113.1";
/// The peer's public address.
const PEER: &str = "198.51.100.7:4500";
/// The cloud host behind which VM 10.0.0.5 lives (its VXLAN comes from an ephemeral port).
const HOST: &str = "127.0.0.2";
const HOST_SRC: &str = "127.0.0.2:40000";

fn sa(s: &str) -> SocketAddr {
    s.parse().expect("socket address")
}

fn vip(port: u16) -> SocketAddr {
    SocketAddr::new(ip(VIP), port)
}

fn config(vnets: Vec<VnetConfig>, tunnels: Vec<TunnelBinding>) -> DataplaneConfig {
    DataplaneConfig {
        attachments: vec![],
        listen: vec![],
        ike_port: 500,
        natt_port: 4500,
        vxlan_port: 4789,
        vnets,
        tunnels,
        tun_name: None,
        batch: 16,
        workers: 1,
        cpus: vec![],
        pin_workers: false,
        busy_poll: std::time::Duration::ZERO,
        busy_poll_budget: datapath::DEFAULT_BUSY_POLL_BUDGET,
        xdp: Default::default(),
        fair_kernel_gate: true,
        relay: Some(RelayConfig {
            listen: sa("127.0.0.1:0"),
            vtep: None,
            steer: vec![sa(STEER)],
        }),
        dispatch: None,
    }
}

struct Env {
    sh: Shared,
    rx: crossbeam_channel::Receiver<ToControl>,
    out: Out,
    /// Output of packets the replay window refused (left out by `sent`).
    dead: Vec<std::ops::Range<usize>>,
}

/// Relay mode with tenant `a`'s VNet (VNI 100) and tunnel 1 bound to it.
fn env() -> Env {
    env_with(vec![vnet("a", 100)], vec![binding(1, "a", Inside::Vnet(0))])
}

fn env_with(vnets: Vec<VnetConfig>, tunnels: Vec<TunnelBinding>) -> Env {
    let (tx, rx) = crossbeam_channel::unbounded();
    let sh = Shared::open(config(vnets, tunnels), tx).expect("relay mode opens");
    Env {
        out: Output::standalone(&sh, 16),
        sh,
        rx,
        dead: Vec::new(),
    }
}

/// A Geneve frame from the steer node carrying the datagram `src` -> `dst`.
fn frame(src: SocketAddr, dst: SocketAddr, options: &[ProtegoOption], payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; 128 + payload.len()];
    let vni = Vni::new(0).expect("vni");
    let n = emit_frame(&mut buf, vni, options, src, dst, payload).expect("frame");
    buf.truncate(n);
    buf
}

/// An idle control frame with `options` and no payload.
fn control(options: &[ProtegoOption]) -> Vec<u8> {
    let mut buf = [0u8; 64];
    let repr = GeneveRepr {
        control: true,
        protocol_type: EtherType::IPV4,
        vni: Vni::new(0).expect("vni"),
    };
    let mut b = GeneveBuilder::new(&mut buf, &repr).expect("builder");
    for o in options {
        b.push_protego(o).expect("option");
    }
    let n = b.finish();
    buf[..n].to_vec()
}

impl Env {
    fn child(&self, spi: u32, local: SocketAddr, remote: SocketAddr) -> ChildSaInfo {
        child(
            1,
            spi,
            spi + 0x1000,
            local,
            remote,
            ts("10.0.0.0", "10.0.0.255"),
            ts("192.168.0.0", "192.168.0.255"),
        )
    }

    fn relay_sock(&self) -> usize {
        self.sh.io.relay_sock.expect("relay mode")
    }

    fn gw_mac(&self, vnet: usize) -> [u8; 6] {
        self.sh.tables.load().overlay.vnets[vnet].mac.0
    }

    /// Frames received as one lane batch from `from`: both passes, then what happens before
    /// the batch leaves (queued ESP sealed, opened ESP accepted in order).
    fn recv_batch(&mut self, from: &str, frames: Vec<Vec<u8>>) {
        self.recv_batch_at(from, frames, Instant::now());
    }

    /// [`recv_batch`](Self::recv_batch) in a batch begun at `now`.
    fn recv_batch_at(&mut self, from: &str, frames: Vec<Vec<u8>>, now: Instant) {
        let t = self.sh.tables.load();
        self.out.use_tables(Arc::clone(&t));
        self.out.set_now(now);
        let mut frames = frames;
        let reader = self.sh.route_readers.reader();
        let guard = reader.enter();
        let r = guard
            .as_deref()
            .unwrap_or(crate::routes::RouteReader::empty());
        let mut d = Deliveries::new();
        for f in &mut frames {
            receive(
                &mut self.out,
                &self.sh,
                &t,
                r,
                now,
                sa(from),
                f,
                Pass::Serial,
                &mut d,
            );
        }
        // As the worker does at the end of each pass: the waiting deliveries, then the
        // feature chains' held packets; after the serial pass, still under the stage, CEs'
        // packets for the tunnels are numbered.
        d.flush(&mut self.out, &self.sh, &t, r, now);
        end_pass(&mut self.out, &self.sh, &t, r, now);
        crate::pipeline::graph::seal_from_ces(&mut self.out, &self.sh, &t, |_| true);
        let mut d = Deliveries::new();
        for f in &mut frames {
            receive(
                &mut self.out,
                &self.sh,
                &t,
                r,
                now,
                sa(from),
                f,
                Pass::Parallel,
                &mut d,
            );
        }
        d.flush(&mut self.out, &self.sh, &t, r, now);
        end_pass(&mut self.out, &self.sh, &t, r, now);
        self.out.seal_queued();
        let tx = &mut self.out.tx;
        crate::accept::accept_batch(&self.sh, tx, &mut self.dead, &mut self.out.drops);
        tx.accepts.clear();
    }

    fn recv(&mut self, from: &str, f: Vec<u8>) {
        self.recv_batch(from, vec![f]);
    }

    fn recv_at(&mut self, from: &str, f: Vec<u8>, now: Instant) {
        self.recv_batch_at(from, vec![f], now);
    }

    /// Datagrams queued for sending (socket, destination, bytes); empties the batch.
    fn sent(&mut self) -> Vec<(usize, SocketAddr, Vec<u8>)> {
        let base = self.out.tx.data().as_ptr() as usize;
        let v = self
            .out
            .tx
            .datagrams()
            .filter(|(_, _, d)| !crate::accept::is_dead(&self.dead, d.as_ptr() as usize - base))
            .map(|(s, dst, d)| (s, dst, d.to_vec()))
            .collect();
        self.out.tx.clear();
        self.dead.clear();
        v
    }

    fn drops(&self, r: DropReason) -> u64 {
        self.out.drops.get(r)
    }

    fn total_drops(&self) -> u64 {
        DropReason::ALL.iter().map(|r| self.out.drops.get(*r)).sum()
    }

    /// The VM at 10.0.0.5 answers the gateway's ARP request, relayed by the steer node.
    fn vm_answers_arp(&mut self, vni: u32, vnet: usize) {
        let gw = self.gw_mac(vnet);
        let reply = arp(ArpOperation::REPLY, VM_MAC, "10.0.0.5", gw, "10.0.0.1");
        let vx = vxlan_frame(vni, gw, VM_MAC, EtherType::ARP, &reply);
        self.recv(STEER, frame(sa(HOST_SRC), vip(4789), &[], &vx));
    }

    /// A VXLAN datagram from the VM toward the peer's network (the gateway MAC of `vnet`).
    fn vm_vxlan(&self, vni: u32, vnet: usize, payload: &[u8]) -> Vec<u8> {
        let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, payload);
        vxlan_frame(vni, self.gw_mac(vnet), VM_MAC, EtherType::IPV4, &inner)
    }

    /// [`vm_vxlan`](Self::vm_vxlan) relayed by the steer node.
    fn relayed_from_vm(&self, vni: u32, vnet: usize, payload: &[u8]) -> Vec<u8> {
        frame(
            sa(HOST_SRC),
            vip(4789),
            &[],
            &self.vm_vxlan(vni, vnet, payload),
        )
    }
}

/// The ESP a peer sends, relayed by the steer node (inner source: the peer; destination: the
/// VIP's NAT-T port).
fn esp_frame(
    peer: &Peer,
    remote: SocketAddr,
    options: &[ProtegoOption],
    payload: &[u8],
) -> Vec<u8> {
    let inner = udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, payload);
    frame(remote, vip(4500), options, &peer.seal(&inner))
}

/// Checks a datagram to a host: VXLAN VNI `vni` to the VM, the peer's packet routed.
fn assert_to_vm(d: &[u8], vni: u32, payload: &[u8]) {
    let (got_vni, dst, _, ty, inner) = parse_vxlan(d);
    assert_eq!((got_vni, dst, ty), (vni, VM_MAC, EtherType::IPV4));
    let p = Ipv4Packet::new_checked(&inner[..]).expect("ipv4");
    assert_eq!(p.ttl(), 63, "routed: TTL decremented");
    assert_eq!(&inner[28..], payload);
}

#[test]
fn relayed_esp_is_delivered_to_the_host_directly() {
    let mut e = env();
    let c = e.child(0x1001, vip(4500), sa(PEER));
    e.sh.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    e.recv(STEER, esp_frame(&peer, sa(PEER), &[], b"to the vm"));
    // The VM's MAC is resolved first: an ARP request straight to the host from the VTEP.
    let sent = e.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    let (sock, dst, d) = &sent[0];
    assert_eq!(*dst, SocketAddr::new(ip(HOST), 4789));
    assert_eq!(
        *sock, e.sh.io.vteps[0].recv,
        "from the VTEP, not the Geneve socket"
    );
    let (vni, _, _, ty, payload) = parse_vxlan(d);
    assert_eq!((vni, ty), (100, EtherType::ARP));
    let req = ArpRepr::parse(&ArpPacket::new_checked(&payload[..]).expect("arp")).expect("arp");
    assert_eq!(req.target_protocol_addr.to_string(), "10.0.0.5");
    // The VM answers through the steer node (the host floods to the VIP); the waiting
    // packet leaves toward the host from a flow-hashed VTEP socket.
    e.vm_answers_arp(100, 0);
    let sent = e.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    let (sock, dst, d) = &sent[0];
    assert_eq!(*dst, SocketAddr::new(ip(HOST), 4789));
    assert!(
        e.sh.io.vteps[0].pool.contains(sock),
        "flow-hashed source port"
    );
    assert_to_vm(d, 100, b"to the vm");
    // Resolved now: the next packet goes at once.
    e.recv(STEER, esp_frame(&peer, sa(PEER), &[], b"again"));
    let sent = e.sent();
    assert_eq!(sent.len(), 1);
    assert_to_vm(&sent[0].2, 100, b"again");
    let stats = e.sh.registry().stats();
    assert_eq!(stats[0].packets_in, 2);
    // Replayed ESP is refused as on a NAT-T socket.
    let replay = esp_frame(&peer, sa(PEER), &[], b"x");
    e.recv(STEER, replay.clone());
    e.sent();
    e.recv(STEER, replay);
    assert!(e.sent().is_empty());
    assert_eq!(e.drops(DropReason::EspReplay), 1);
}

/// Drops the packets whose first UDP payload byte is odd.
struct DropOdd(&'static [&'static str]);

impl Feature for DropOdd {
    fn name(&self) -> &'static str {
        "drop_odd"
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        self.0
    }

    fn process(&self, batch: &mut FeatureBatch<'_>) {
        for i in 0..batch.len() {
            if batch.packet(i).get(28).is_some_and(|b| b % 2 == 1) {
                batch.drop_packet(i, 0);
            }
        }
    }
}

#[test]
fn feature_chains_run_on_both_passes_of_the_relay_lane() {
    let mut e = env();
    let c = e.child(0x1001, vip(4500), sa(PEER));
    e.sh.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    for (dir, reason) in [
        (Direction::Outbound, &["odd_out"][..]),
        (Direction::Inbound, &["odd_in"][..]),
    ] {
        let chain = FeatureChain::new().with(Arc::new(DropOdd(reason)));
        e.sh.set_feature_chain(&ids::TenantId::new("a").expect("tenant"), dir, chain)
            .expect("chain");
    }
    let feature_drops = |e: &Env, name: &str| {
        e.sh.feature_drops
            .snapshot()
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    };
    // VM -> peer (the serial pass): the even ones leave, sealed in order.
    let frames = (0..6u8)
        .map(|i| e.relayed_from_vm(100, 0, &[i; 300]))
        .collect();
    e.recv_batch(STEER, frames);
    let sent = e.sent();
    let firsts: Vec<u8> = sent
        .iter()
        .map(|(_, _, d)| {
            let f = parse_frame(d).expect("a relay frame");
            let dg = f.datagram.expect("datagram");
            peer.open(&d[dg.payload]).expect("the peer opens it")[28]
        })
        .collect();
    assert_eq!(firsts, vec![0, 2, 4]);
    assert_eq!(feature_drops(&e, "a/odd_out"), Some(3));
    // Peer -> VM (the parallel pass), the VM's MAC resolved first.
    e.vm_answers_arp(100, 0);
    e.sent();
    let frames = (0..4u8)
        .map(|i| esp_frame(&peer, sa(PEER), &[], &[i]))
        .collect();
    e.recv_batch(STEER, frames);
    let sent = e.sent();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_to_vm(&sent[0].2, 100, &[0]);
    assert_to_vm(&sent[1].2, 100, &[2]);
    assert_eq!(feature_drops(&e, "a/odd_in"), Some(2));
    // The dropped packets were authentic: the replay window took them all.
    assert_eq!(e.sh.registry().stats()[0].packets_in, 4);
    assert_eq!(
        e.total_drops(),
        0,
        "no drop under the data plane's own reasons"
    );
}

#[test]
fn vxlan_via_relay_leaves_as_geneve_wrapped_esp_in_one_gso_train() {
    let mut e = env();
    let c = e.child(0x1001, vip(4500), sa(PEER));
    e.sh.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    let frames = (0..5u8)
        .map(|i| e.relayed_from_vm(100, 0, &[i; 300]))
        .collect();
    e.recv_batch(STEER, frames);
    let msgs = e.out.tx.messages().to_vec();
    assert_eq!(
        msgs.len(),
        1,
        "equal datagrams to one steer node coalesce: {msgs:?}"
    );
    assert_eq!(msgs[0].segments(), 5);
    assert_eq!((msgs[0].sock, msgs[0].dst), (e.relay_sock(), sa(STEER)));
    let sent = e.sent();
    assert_eq!(sent.len(), 5);
    for (i, (_, _, d)) in sent.iter().enumerate() {
        let f = parse_frame(d).expect("a relay frame");
        assert_eq!(f.vni.get(), 0);
        assert!(!f.control && f.probe.is_none() && f.tunnel.is_none());
        let dg = f.datagram.expect("datagram");
        assert_eq!((dg.src, dg.dst), (vip(4500), sa(PEER)), "VIP:4500 -> peer");
        assert_eq!(
            d[..8],
            [0, 0, 0x08, 0, 0, 0, 0, 0],
            "no options, IPv4, VNI 0"
        );
        let ip4 = Ipv4Packet::new_checked(&d[8..]).expect("inner ipv4");
        assert!(ip4.verify_checksum());
        assert_eq!(usize::from(ip4.total_len()), d.len() - 8);
        let esp = &d[dg.payload];
        assert_eq!(u32::from_be_bytes([esp[0], esp[1], esp[2], esp[3]]), 0x2001);
        let inner = peer.open(esp).expect("the peer opens it");
        assert_eq!(Ipv4Packet::new_checked(&inner[..]).expect("ipv4").ttl(), 63);
        assert_eq!(inner[28..], [i as u8; 300]);
    }
    assert_eq!(e.total_drops(), 0);
}

#[test]
fn ipv6_peers_get_a_valid_inner_udp_checksum_over_the_ciphertext() {
    let mut e = env();
    let (local, remote) = (sa("[2001:db8::1]:4500"), sa("[2001:db8::7]:4500"));
    let c = e.child(0x1001, local, remote);
    e.sh.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    let f = e.relayed_from_vm(100, 0, b"over v6");
    e.recv(STEER, f);
    let sent = e.sent();
    assert_eq!(sent.len(), 1);
    let d = &sent[0].2;
    let f = parse_frame(d).expect("frame");
    let dg = f.datagram.expect("datagram");
    assert_eq!((dg.src, dg.dst), (local, remote));
    assert_eq!(d[2..4], [0x86, 0xdd], "protocol type IPv6");
    let ip6 = Ipv6Packet::new_checked(&d[8..]).expect("ipv6");
    let udp = UdpPacket::new_checked(ip6.payload()).expect("udp");
    assert_ne!(udp.checksum(), 0);
    assert!(
        udp.verify_checksum(&local.ip(), &remote.ip()),
        "covers the sealed ESP"
    );
    peer.open(&d[dg.payload]).expect("opens");
    // Mixed families cannot be relayed: refused at install.
    let mixed = e.child(0x3001, vip(4500), remote);
    assert!(matches!(
        e.sh.install_child(&mixed),
        Err(DataplaneError::Install { .. })
    ));
}

#[test]
fn idle_probes_are_answered_with_a_control_frame() {
    let mut e = env();
    let probe = HealthProbe { id: 5, stamp: 6 };
    e.recv(STEER, control(&[ProtegoOption::Probe(probe)]));
    let sent = e.sent();
    assert_eq!(sent.len(), 1);
    let (sock, dst, d) = &sent[0];
    assert_eq!((*sock, *dst), (e.relay_sock(), sa(STEER)));
    let f = parse_frame(d).expect("reply parses");
    assert!(f.control, "O flag");
    assert_eq!(f.probe_reply, Some(probe));
    assert!(f.probe.is_none() && f.datagram.is_none());
    assert_eq!(d.len(), 8 + 12, "no payload");
    assert_eq!(e.out.probes_answered, 1);
    assert_eq!(e.total_drops(), 0, "a probe is not a drop");
    // A control frame with nothing to answer is dropped and counted.
    e.recv(STEER, control(&[ProtegoOption::TunnelId(3)]));
    assert!(e.sent().is_empty());
    assert_eq!(e.drops(DropReason::RelayControl), 1);
    // A control frame's payload is never processed.
    let c = e.child(0x1001, vip(4500), sa(PEER));
    e.sh.install_child(&c).expect("install");
    let mut cf = frame(
        sa(PEER),
        vip(4500),
        &[ProtegoOption::Probe(probe)],
        &Peer::of(&c).seal(&udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"x")),
    );
    cf[1] |= wire::geneve::FLAG_CONTROL;
    e.recv(STEER, cf);
    let sent = e.sent();
    assert_eq!(sent.len(), 1, "only the reply: {sent:?}");
    assert!(parse_frame(&sent[0].2).expect("reply").control);
    assert_eq!(e.sh.registry().stats()[0].packets_in, 0);
}

#[test]
fn probes_riding_on_data_frames_are_answered_and_the_data_processed() {
    let mut e = env();
    let c = e.child(0x1001, vip(4500), sa(PEER));
    e.sh.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    e.vm_answers_arp(100, 0);
    assert!(e.sent().is_empty());
    let probe = HealthProbe {
        id: 77,
        stamp: 0xdead_beef,
    };
    // On ESP from a peer.
    e.recv(
        STEER,
        esp_frame(&peer, sa(PEER), &[ProtegoOption::Probe(probe)], b"ride"),
    );
    let sent = e.sent();
    assert_eq!(sent.len(), 2, "{sent:?}");
    let reply = parse_frame(&sent[0].2).expect("reply");
    assert_eq!(
        (sent[0].1, reply.control, reply.probe_reply),
        (sa(STEER), true, Some(probe))
    );
    assert_to_vm(&sent[1].2, 100, b"ride");
    // On VXLAN from a host.
    let vx = e.vm_vxlan(100, 0, b"up");
    let f = frame(sa(HOST_SRC), vip(4789), &[ProtegoOption::Probe(probe)], &vx);
    e.recv(STEER, f);
    let sent = e.sent();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(
        parse_frame(&sent[0].2).expect("reply").probe_reply,
        Some(probe)
    );
    let esp = parse_frame(&sent[1].2)
        .expect("esp frame")
        .datagram
        .expect("datagram");
    assert_eq!(esp.dst, sa(PEER));
    peer.open(&sent[1].2[esp.payload]).expect("opens");
    assert_eq!(e.out.probes_answered, 2);
}

#[test]
fn frames_from_unknown_senders_are_dropped_unanswered() {
    let mut e = env();
    let c = e.child(0x1001, vip(4500), sa(PEER));
    e.sh.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    let probe = [ProtegoOption::Probe(HealthProbe { id: 1, stamp: 2 })];
    // Another address, and the steer node's address with another port.
    for from in ["127.0.0.99:6081", "127.0.0.9:6082"] {
        e.recv(from, esp_frame(&peer, sa(PEER), &probe, b"x"));
        e.recv(from, control(&probe));
        e.recv(from, e.relayed_from_vm(100, 0, b"y"));
    }
    assert!(e.sent().is_empty());
    assert_eq!(e.drops(DropReason::RelayUnknownSender), 6);
    assert_eq!(e.total_drops(), 6);
    assert_eq!(e.out.probes_answered, 0);
    let s = &e.sh.registry().stats()[0];
    assert_eq!((s.packets_in, s.packets_out), (0, 0));
}

#[test]
fn every_truncation_of_a_frame_is_dropped_and_counted() {
    let mut e = env();
    let c = e.child(0x1001, vip(4500), sa(PEER));
    e.sh.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    let probe = [ProtegoOption::Probe(HealthProbe { id: 1, stamp: 2 })];
    let whole = [
        esp_frame(&peer, sa(PEER), &probe, b"whole"),
        e.relayed_from_vm(100, 0, b"whole"),
        frame(
            sa("[2001:db8::7]:4500"),
            sa("[2001:db8::1]:4500"),
            &probe,
            b"\x01\x02\x03\x04xx",
        ),
    ];
    let mut cuts = 0;
    for f in &whole {
        for cut in 0..f.len() {
            e.recv(STEER, f[..cut].to_vec());
            cuts += 1;
            assert_eq!(
                e.drops(DropReason::RelayMalformed),
                cuts,
                "cut at {cut} of {f:?}"
            );
            assert_eq!(e.total_drops(), cuts, "counted once, under one reason");
            assert!(e.sent().is_empty(), "nothing answered for a cut at {cut}");
        }
    }
    assert_eq!(e.out.probes_answered, 0);
    // Trailing bytes after the inner IP packet are ignored (as on a padded link).
    let mut padded = esp_frame(&peer, sa(PEER), &[], b"padded");
    padded.extend_from_slice(&[0; 6]);
    e.recv(STEER, padded);
    assert_eq!(e.total_drops(), cuts);
    assert_eq!(e.sent().len(), 1, "the ARP request for the VM");
    // Not a UDP datagram, and an unknown critical option.
    let mut tcp = e.relayed_from_vm(100, 0, b"z");
    tcp[8 + 9] = 6;
    e.recv(STEER, tcp);
    let mut crit = [0u8; 64];
    let repr = GeneveRepr {
        control: true,
        protocol_type: EtherType::IPV4,
        vni: Vni::new(0).expect("vni"),
    };
    let mut b = GeneveBuilder::new(&mut crit, &repr).expect("builder");
    b.push(&wire::geneve::GeneveOption {
        class: wire::geneve::OptionClass(0x0102),
        option_type: wire::geneve::OptionType(0x81),
        data: &[],
    })
    .expect("option");
    let n = b.finish();
    e.recv(STEER, crit[..n].to_vec());
    assert_eq!(e.drops(DropReason::RelayMalformed), cuts + 2);
}

#[test]
fn what_a_data_node_does_not_take_is_counted_by_reason() {
    let mut e = env();
    let peer = sa(PEER);
    // IKE (non-ESP marker) is for the control node.
    e.recv(
        STEER,
        frame(peer, vip(4500), &[], b"\0\0\0\0an IKE message"),
    );
    assert_eq!(e.drops(DropReason::RelayIke), 1);
    // A NAT keepalive is consumed as on a NAT-T socket; too short is malformed.
    e.recv(STEER, frame(peer, vip(4500), &[], &[0xff]));
    assert_eq!(e.drops(DropReason::NattKeepalive), 1);
    e.recv(STEER, frame(peer, vip(4500), &[], &[1, 2]));
    assert_eq!(e.drops(DropReason::MalformedUdp), 1);
    // IKE on port 500 and anything else.
    e.recv(STEER, frame(peer, vip(500), &[], b"an IKE message"));
    e.recv(STEER, frame(peer, vip(1234), &[], b"?"));
    assert_eq!(e.drops(DropReason::RelayUnexpectedPort), 2);
    // ESP of an unknown SPI; VXLAN of an unknown VNI or from an unknown host.
    e.recv(STEER, frame(peer, vip(4500), &[], &[0x12; 40]));
    assert_eq!(e.drops(DropReason::EspUnknownSpi), 1);
    let vx = e.vm_vxlan(100, 0, b"v");
    let mut wrong_vni = vx.clone();
    wrong_vni[6] = 7;
    e.recv(STEER, frame(sa(HOST_SRC), vip(4789), &[], &wrong_vni));
    assert_eq!(e.drops(DropReason::VxlanUnknownVni), 1);
    e.recv(STEER, frame(sa("127.0.0.3:40000"), vip(4789), &[], &vx));
    assert_eq!(e.drops(DropReason::VxlanUnknownHost), 1);
    assert_eq!(e.total_drops(), 8);
    assert!(e.sent().is_empty());
}

#[test]
fn steer_nodes_are_replaced_at_run_time() {
    let mut e = env();
    let c = e.child(0x1001, vip(4500), sa(PEER));
    e.sh.install_child(&c).expect("install");
    // No steer node: output is dropped, and no sender is accepted.
    e.sh.set_relays(vec![]).expect("empty list");
    e.recv(STEER, e.relayed_from_vm(100, 0, b"a"));
    assert_eq!(e.drops(DropReason::RelayUnknownSender), 1);
    let t = e.sh.tables.load();
    e.out.use_tables(Arc::clone(&t));
    let mut f = e.relayed_from_vm(100, 0, b"a");
    let mut d = Deliveries::new();
    receive(
        &mut e.out,
        &e.sh,
        &t,
        crate::routes::RouteReader::empty(),
        Instant::now(),
        sa(STEER),
        &mut f,
        Pass::All,
        &mut d,
    );
    assert_eq!(e.drops(DropReason::RelayUnknownSender), 2);
    // Two steer nodes: both accepted, output to the first (heard from, as both are once
    // the second frame arrives); the old one is forgotten.
    e.sh.set_relays(vec![sa(STEER2), sa(STEER)]).expect("two");
    e.recv(STEER2, e.relayed_from_vm(100, 0, b"b"));
    e.recv(STEER, e.relayed_from_vm(100, 0, b"c"));
    let sent = e.sent();
    assert_eq!(sent.len(), 2);
    assert!(sent.iter().all(|(_, dst, _)| *dst == sa(STEER2)));
    // Output without a steer node (the accept list cannot be empty then, so drive the
    // seal path directly through a batch whose tables have none).
    e.sh.set_relays(vec![]).expect("empty list");
    let t = e.sh.tables.load();
    e.out.use_tables(Arc::clone(&t));
    let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, b"d");
    let child = Arc::clone(&t.vnet_out[0][0]);
    crate::pipeline::seal::queue(&mut e.out, &e.sh, &child, &inner);
    assert!(e.sent().is_empty());
    assert_eq!(e.drops(DropReason::RelayNoSteer), 1);
    // No sequence number was used for it: the next packet carries number 3.
    e.sh.set_relays(vec![sa(STEER)]).expect("one");
    e.recv(STEER, e.relayed_from_vm(100, 0, b"e"));
    let sent = e.sent();
    assert_eq!(sent.len(), 1);
    let dg = parse_frame(&sent[0].2)
        .expect("frame")
        .datagram
        .expect("datagram");
    let esp = &sent[0].2[dg.payload];
    assert_eq!(u32::from_be_bytes([esp[4], esp[5], esp[6], esp[7]]), 3);
    // Invalid lists are refused whole, naming the entry.
    for (bad, field) in [
        (vec![sa(STEER), sa("127.0.0.11:0")], "steer[1]"),
        (vec![sa("[::1]:6081")], "steer[0]"),
        (vec![sa("0.0.0.0:6081")], "steer[0]"),
        (vec![sa(STEER), sa(STEER)], "steer[1]"),
    ] {
        match e.sh.set_relays(bad) {
            Err(DataplaneError::Config { field: f, .. }) => assert_eq!(f, field),
            other => panic!("expected a config error for {field}, got {other:?}"),
        }
    }
    assert_eq!(
        e.sh.tables.load().relays.as_deref().expect("relay").steer(),
        [sa(STEER)]
    );
}

/// Steer nodes A, B and C, and the instant their list was set.
fn three_relays() -> (Relays, Instant) {
    let r = Relays::new(vec![sa(STEER), sa(STEER2), sa("127.0.0.11:6081")]);
    let t0 = r.epoch;
    (r, t0)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn output_is_the_first_steer_node_heard_from_within_the_window() {
    let (r, t0) = three_relays();
    let (a, b, c) = (sa(STEER), sa(STEER2), sa("127.0.0.11:6081"));
    assert_eq!(r.index(b), Some(1));
    assert_eq!(r.index(sa("127.0.0.12:6081")), None);
    // Nothing heard yet: the first.
    assert_eq!(r.output(t0), Some(a));
    assert_eq!(r.output(t0 + ms(1000)), Some(a));
    // Only C heard, then also B: the first heard in list order, whatever the order heard.
    r.heard(2, t0 + ms(100));
    assert_eq!(r.output(t0 + ms(100)), Some(c));
    r.heard(1, t0 + ms(110));
    assert_eq!(r.output(t0 + ms(110)), Some(b));
    r.heard(0, t0 + ms(120));
    assert_eq!(r.output(t0 + ms(120)), Some(a));
    // A goes silent: it keeps the output for the window, then B (still heard) takes it.
    r.heard(1, t0 + ms(150));
    r.heard(2, t0 + ms(150));
    assert_eq!(r.output(t0 + ms(120 + HEARD_WINDOW_MS - 1)), Some(a));
    assert_eq!(r.output(t0 + ms(120 + HEARD_WINDOW_MS)), Some(b));
    // B too: C.
    r.heard(2, t0 + ms(190));
    assert_eq!(r.output(t0 + ms(150 + HEARD_WINDOW_MS)), Some(c));
    // All silent: the first of the list again.
    assert_eq!(r.output(t0 + ms(190 + HEARD_WINDOW_MS)), Some(a));
    // A is heard again: it takes the output back at once.
    r.heard(0, t0 + ms(300));
    assert_eq!(r.output(t0 + ms(300)), Some(a));
}

#[test]
fn heard_stamps_never_move_back_and_later_ones_count_as_recent() {
    let (r, t0) = three_relays();
    let b = sa(STEER2);
    r.heard(1, t0 + ms(100));
    // A worker whose batch began earlier reports B later: the newer stamp stays.
    r.heard(1, t0 + ms(60));
    assert_eq!(r.output(t0 + ms(100 + HEARD_WINDOW_MS - 1)), Some(b));
    // A worker whose batch began earlier than the last stamp chooses: B is recent.
    assert_eq!(r.output(t0 + ms(10)), Some(b));
    // Within one millisecond the stamp is not rewritten (nothing to observe but that it
    // still counts), and an index out of range is ignored.
    r.heard(1, t0 + ms(100) + Duration::from_micros(900));
    r.heard(7, t0 + ms(100));
    assert_eq!(r.output(t0 + ms(100)), Some(b));
    // An instant before the list was set counts as its first millisecond.
    let (r, t0) = three_relays();
    let early = t0.checked_sub(ms(5)).unwrap_or(t0);
    r.heard(2, early);
    assert_eq!(r.output(early), Some(sa("127.0.0.11:6081")));
}

#[test]
fn steer_nodes_never_heard_from_are_not_recent_in_the_first_milliseconds() {
    // Stamps start at 1: at the list's first millisecond a node never heard is not "heard 1
    // ms ago".
    let (r, t0) = three_relays();
    r.heard(1, t0);
    assert_eq!(r.output(t0), Some(sa(STEER2)));
    assert_eq!(Relays::new(vec![]).output(t0), None);
}

#[test]
fn output_follows_the_steer_nodes_heard_from_on_the_data_path() {
    let mut e = env();
    let c = e.child(0x1001, vip(4500), sa(PEER));
    e.sh.install_child(&c).expect("install");
    e.sh.set_relays(vec![sa(STEER), sa(STEER2)]).expect("two");
    let t0 = Instant::now();
    let dst = |e: &mut Env| -> Vec<SocketAddr> { e.sent().iter().map(|s| s.1).collect() };
    // Only the second steer node sends: output goes to it, not to the silent first.
    e.recv_at(STEER2, e.relayed_from_vm(100, 0, b"a"), t0);
    assert_eq!(dst(&mut e), [sa(STEER2)]);
    // The first is heard (its frame goes back through it, and so does the next of the second).
    e.recv_at(STEER, e.relayed_from_vm(100, 0, b"b"), t0 + ms(1));
    e.recv_at(STEER2, e.relayed_from_vm(100, 0, b"c"), t0 + ms(2));
    assert_eq!(dst(&mut e), [sa(STEER), sa(STEER)]);
    // The first goes silent (frozen): after the window the second takes the output.
    e.recv_at(
        STEER2,
        e.relayed_from_vm(100, 0, b"d"),
        t0 + ms(1 + HEARD_WINDOW_MS - 1),
    );
    e.recv_at(
        STEER2,
        e.relayed_from_vm(100, 0, b"e"),
        t0 + ms(1 + HEARD_WINDOW_MS),
    );
    assert_eq!(dst(&mut e), [sa(STEER), sa(STEER2)]);
    // An idle probe from the first counts: it takes the output back.
    let probe = [ProtegoOption::Probe(HealthProbe { id: 1, stamp: 2 })];
    let t1 = t0 + ms(100);
    e.recv_at(STEER, control(&probe), t1);
    e.recv_at(STEER2, e.relayed_from_vm(100, 0, b"f"), t1);
    assert_eq!(dst(&mut e), [sa(STEER), sa(STEER)], "probe reply, then ESP");
    // A malformed frame does not count, nor does one from an unknown sender.
    let t2 = t1 + ms(HEARD_WINDOW_MS);
    e.recv_at(STEER, vec![0xff; 4], t2);
    e.recv_at("127.0.0.9:6082", control(&probe), t2);
    e.recv_at(STEER2, e.relayed_from_vm(100, 0, b"g"), t2);
    assert_eq!(dst(&mut e), [sa(STEER2)]);
    assert_eq!(e.drops(DropReason::RelayMalformed), 1);
    assert_eq!(e.drops(DropReason::RelayUnknownSender), 1);
    // A new list keeps what was heard from the steer nodes it keeps: a new first node, not
    // heard yet, does not take the output from the second, heard just now.
    e.sh.set_relays(vec![sa("127.0.0.11:6081"), sa(STEER2)])
        .expect("again");
    let relays = e.sh.tables.load().relays.clone().expect("relay mode");
    assert_eq!(relays.output(t2), Some(sa(STEER2)));
    // A list of none heard starts from its first.
    assert_eq!(
        Relays::replacing(vec![sa("127.0.0.12:6081"), sa(STEER)], None).output(t2),
        Some(sa("127.0.0.12:6081"))
    );
    // The published list is the one frames mark heard (and the IKE path reads it too).
    let t = e.sh.tables.load();
    e.recv(STEER2, control(&probe));
    assert!(Arc::ptr_eq(t.relays.as_ref().expect("relay mode"), &relays));
    assert_eq!(relays.output(Instant::now()), Some(sa(STEER2)));
}

#[test]
fn inside_configuration_is_replaced_at_run_time() {
    // A data node starts without VNets or tunnels; the control node sends them later.
    let mut e = env_with(vec![], vec![]);
    let c = e.child(0x1001, vip(4500), sa(PEER));
    assert!(matches!(
        e.sh.install_child(&c),
        Err(DataplaneError::Install { .. })
    ));
    e.sh.set_inside(vec![vnet("a", 100)], vec![binding(1, "a", Inside::Vnet(0))])
        .expect("set inside");
    e.sh.install_child(&c).expect("install once bound");
    let peer = Peer::of(&c);
    e.vm_answers_arp(100, 0);
    e.recv(STEER, esp_frame(&peer, sa(PEER), &[], b"one"));
    let sent = e.sent();
    assert_eq!(sent.len(), 1);
    assert_to_vm(&sent[0].2, 100, b"one");
    // An unchanged VNet keeps its neighbour cache: no ARP needed after a no-op replace.
    e.sh.set_inside(vec![vnet("a", 100)], vec![binding(1, "a", Inside::Vnet(0))])
        .expect("same again");
    e.recv(STEER, esp_frame(&peer, sa(PEER), &[], b"two"));
    let sent = e.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_to_vm(&sent[0].2, 100, b"two");
    // Tunnel 1 moves to VNet `a2` (VNI 300), now at index 1: the installed SA follows.
    let mut a2 = vnet("a", 300);
    a2.name = "a2".into();
    e.sh.set_inside(
        vec![vnet("b", 200), a2],
        vec![binding(1, "a", Inside::Vnet(1))],
    )
    .expect("move");
    e.vm_answers_arp(300, 1);
    e.recv(STEER, esp_frame(&peer, sa(PEER), &[], b"three"));
    let sent = e.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_to_vm(&sent[0].2, 300, b"three");
    // VXLAN of the old VNI is unknown now; the new VNI is sealed into the tunnel.
    e.recv(STEER, e.relayed_from_vm(100, 0, b"old"));
    assert_eq!(e.drops(DropReason::VxlanUnknownVni), 1);
    e.recv(STEER, e.relayed_from_vm(300, 1, b"new"));
    let sent = e.sent();
    assert_eq!(sent.len(), 1);
    // An invalid configuration changes nothing.
    let mut far = vnet("a", 400);
    far.vtep = ip("127.0.0.77");
    match e.sh.set_inside(vec![far], vec![]) {
        Err(DataplaneError::Config { field, .. }) => assert_eq!(field, "vnets[0].vtep"),
        other => panic!("expected a config error, got {other:?}"),
    }
    assert_eq!(e.sh.registry().stats().len(), 1);
    // Unbinding the tunnel removes its CHILD_SAs.
    e.sh.set_inside(vec![vnet("b", 200)], vec![])
        .expect("unbind");
    assert!(e.sh.registry().stats().is_empty());
    e.recv(STEER, esp_frame(&peer, sa(PEER), &[], b"gone"));
    assert_eq!(e.drops(DropReason::EspUnknownSpi), 1);
}

#[test]
fn a_peer_behind_a_rebinding_nat_is_followed_through_the_relay() {
    let mut e = env();
    let c = e.child(0x1001, vip(4500), sa(PEER));
    e.sh.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    e.vm_answers_arp(100, 0);
    e.recv(STEER, esp_frame(&peer, sa(PEER), &[], b"before"));
    assert_eq!(e.sent().len(), 1);
    assert!(e.rx.try_recv().is_err(), "nothing moved");
    // The peer's NAT rebinds: the steer node relays its ESP from the new address.
    let moved = sa("198.51.100.7:61000");
    e.recv(STEER, esp_frame(&peer, moved, &[], b"after"));
    assert_eq!(e.sent().len(), 1);
    match e.rx.try_recv() {
        Ok(ToControl::PeerAddressSeen {
            inbound_spi,
            local,
            remote,
        }) => {
            assert_eq!((inbound_spi.0, local, remote), (0x1001, vip(4500), moved));
        }
        other => panic!("expected PeerAddressSeen, got {other:?}"),
    }
    // The answer goes to the new address, still through the steer node from the VIP.
    e.recv(STEER, e.relayed_from_vm(100, 0, b"answer"));
    let sent = e.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].1, sa(STEER));
    let dg = parse_frame(&sent[0].2)
        .expect("frame")
        .datagram
        .expect("datagram");
    assert_eq!((dg.src, dg.dst), (vip(4500), moved));
}

#[test]
fn relay_configuration_is_validated_by_field() {
    let check = |cfg: DataplaneConfig, want: &str| {
        let (tx, _rx) = crossbeam_channel::unbounded();
        match Shared::open(cfg, tx) {
            Err(DataplaneError::Config { field, .. }) => assert_eq!(field, want),
            Err(e) => panic!("{want}: unexpected error {e}"),
            Ok(_) => panic!("{want}: accepted"),
        }
    };
    let base = || config(vec![vnet("a", 100)], vec![binding(1, "a", Inside::Vnet(0))]);
    fn relay(cfg: &mut DataplaneConfig) -> &mut RelayConfig {
        cfg.relay.as_mut().expect("relay")
    }
    let mut c = base();
    c.listen = vec![ip("127.0.0.1")];
    check(c, "listen");
    let mut c = base();
    relay(&mut c).listen = sa("0.0.0.0:6081");
    check(c, "relay.listen");
    let mut c = base();
    relay(&mut c).vtep = Some(ip("224.0.0.1"));
    check(c, "relay.vtep");
    let mut c = base();
    relay(&mut c).steer.push(sa("[::1]:6081"));
    check(c, "relay.steer[1]");
    let mut c = base();
    c.natt_port = 0;
    check(c, "natt_port");
    let mut c = base();
    c.vxlan_port = 4500;
    check(c, "vxlan_port");
    // In relay mode attachments are on steer nodes' ports: a local interface is refused.
    let mut c = base();
    c.attachments.push(crate::AttachmentConfig {
        name: "dc".into(),
        tenant: ids::TenantId::new("a").expect("tenant"),
        vnet: "a-net".into(),
        port: datapath::AttachmentPort::Interface("lo".into()),
        tags: crate::AttachmentTags::Vlan { c_tag: 10 },
        gateway_ip: ip("10.99.0.1"),
        ce_ip: None,
        routes: vec![(ip("10.99.0.0"), 24)],
        ce_mac: None,
    });
    check(c, "attachments[0].port");
    let mut c = base();
    let mut other = vnet("b", 100);
    other.vtep = ip("127.0.0.1");
    c.vnets.push(other);
    check(c, "vnets[1].vni");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever a steer node sends is counted (dropped under a reason or answered), never a
    /// panic.
    #[test]
    fn arbitrary_frames_are_accounted_for(
        header in proptest::collection::vec(any::<u8>(), 0..16),
        body in proptest::collection::vec(any::<u8>(), 0..120),
        flip in any::<(usize, u8)>(),
    ) {
        let mut e = env();
        let mut f = frame(sa(PEER), vip(4500), &[], &body);
        // Half the time a garbled header, else a valid frame with one byte flipped.
        if header.len() >= 8 {
            f.splice(..header.len().min(f.len()), header.iter().copied());
        } else {
            let at = flip.0 % f.len();
            f[at] ^= flip.1;
        }
        e.recv(STEER, f);
        let answered = e.sent().len() as u64;
        prop_assert!(e.total_drops() + answered >= 1);
    }
}

mod attach;
