//! A CE's packets for the tenant's IPsec site (issue 16 §1): what neither a CE nor a VM of the
//! VNet takes goes through the VNet's outbound feature chain to the seal stage, which chooses
//! among that VNet's tunnels only and numbers the ESP in the lane's arrival order.

use super::*;
use crate::feature::{Direction, Feature, FeatureBatch, FeatureChain};
use crate::testutil::{child, ts, Peer};
use ike::ChildSaInfo;
use std::sync::Arc;

/// Tenant a's IPsec peer, and tenant b's.
const PEER_A: &str = "127.0.0.1:40001";
const PEER_B: &str = "127.0.0.1:40002";

/// A CHILD_SA of `tunnel` toward `peer`: the VNet and the segments behind its CEs
/// (10.0.0.0/8) on our side, `remote` (a /24) on the site's.
fn site_child(e: &Env, tunnel: u32, spi: u32, peer: &str, remote: &str) -> ChildSaInfo {
    let natt = e.sh.io.local_addr(e.sh.io.listen[0].natt);
    let net: std::net::Ipv4Addr = remote.parse().expect("remote");
    let last = std::net::Ipv4Addr::from(u32::from(net) | 0xff).to_string();
    child(
        tunnel,
        spi,
        spi + 0x1000,
        natt,
        peer.parse().expect("peer"),
        ts("10.0.0.0", "10.255.255.255"),
        ts(remote, &last),
    )
}

/// The ESP header's sequence number (RFC 4303 §2.2).
fn seq_of(esp: &[u8]) -> u32 {
    u32::from_be_bytes([esp[4], esp[5], esp[6], esp[7]])
}

/// A UDP packet from tenant a's CE (behind S-tag 100) to `dst`, marked by `mark`.
fn from_ce_a(e: &Env, dst: &str, mark: u8) -> Vec<u8> {
    let pkt = udp4("10.99.0.2", 9, dst, 7, 64, &[mark; 32]);
    ce_frame(100, e.gw_mac, CE_A, 0x0800, &pkt)
}

#[test]
fn a_ces_packets_for_the_site_are_sealed_in_arrival_order() {
    let mut e = env();
    let a = site_child(&e, 1, 0x1001, PEER_A, "192.168.0.0");
    e.sh.install_child(&a).expect("install");
    let peer = Peer::of(&a);
    // The VM's MAC, learned from a frame it sends (to the CE, whose MAC is not known yet).
    let gw = e.sh.tables.load().overlay.vnets[0].mac.0;
    let pkt = udp4("10.0.0.5", 7, "10.99.0.2", 9, 64, b"hi");
    e.recv_from_host(vxlan_frame(100, gw, VM_MAC, EtherType::IPV4, &pkt));
    e.sent();

    // One lane batch mixing the site and the VM: the site's are sealed with consecutive
    // sequence numbers in arrival order (after the batch's own output: in the worker they
    // leave in their VTEP lane's order), TTL decremented; the VM's are not held up.
    let order = [
        "192.168.0.9",
        "10.0.0.5",
        "192.168.0.9",
        "192.168.0.7",
        "10.0.0.5",
    ];
    let frames = (0u8..)
        .zip(order)
        .map(|(i, dst)| from_ce_a(&e, dst, i))
        .collect();
    e.recv_batch_from_ce(frames);
    let (frames, datagrams) = e.sent();
    assert!(frames.is_empty());
    let peer_addr: SocketAddr = PEER_A.parse().expect("peer");
    let (mut to_site, mut to_vm) = (Vec::new(), Vec::new());
    for (to, d) in &datagrams {
        let inner = if *to == peer_addr {
            assert_eq!(u32::from_be_bytes([d[0], d[1], d[2], d[3]]), 0x2001, "SPI");
            let inner = peer.open(d).expect("the site opens it");
            to_site.push((seq_of(d), inner[28]));
            inner
        } else {
            let (vni, dst, _, _, payload) = parse_vxlan(d);
            assert_eq!((vni, dst), (100, VM_MAC));
            to_vm.push(payload[28]);
            payload
        };
        let ipp = Ipv4Packet::new_checked(&inner[..]).expect("ipv4");
        assert_eq!(ipp.ttl(), 63, "routed: TTL decremented");
    }
    assert_eq!(
        to_site,
        [(1, 0), (2, 2), (3, 3)],
        "numbered in arrival order"
    );
    assert_eq!(to_vm, [1, 4]);
    // The next batch goes on from there.
    let frames = (10u8..13)
        .map(|i| from_ce_a(&e, "192.168.0.9", i))
        .collect();
    e.recv_batch_from_ce(frames);
    let (_, datagrams) = e.sent();
    let seqs: Vec<u32> = datagrams.iter().map(|(_, d)| seq_of(d)).collect();
    assert_eq!(seqs, [4, 5, 6]);
    assert_eq!(e.sh.registry().stats()[0].packets_out, 6);
}

/// More of a batch's frames than the lookup stage holds (64): the stage is routed in the
/// middle of the batch and again at its end, and the site's packets still carry consecutive
/// sequence numbers in arrival order, the VM's all arriving too.
#[test]
fn a_batch_longer_than_the_lookup_stage_keeps_arrival_order() {
    let mut e = env();
    let a = site_child(&e, 1, 0x1001, PEER_A, "192.168.0.0");
    e.sh.install_child(&a).expect("install");
    let peer = Peer::of(&a);
    let gw = e.sh.tables.load().overlay.vnets[0].mac.0;
    let pkt = udp4("10.0.0.5", 7, "10.99.0.2", 9, 64, b"hi");
    e.recv_from_host(vxlan_frame(100, gw, VM_MAC, EtherType::IPV4, &pkt));
    e.sent();
    // 150 frames, every third for the VM, the others for the site, marked by arrival.
    let frames = (0u8..150)
        .map(|i| {
            let dst = if i % 3 == 1 {
                "10.0.0.5"
            } else {
                "192.168.0.9"
            };
            from_ce_a(&e, dst, i)
        })
        .collect();
    e.recv_batch_from_ce(frames);
    let (_, datagrams) = e.sent();
    let peer_addr: SocketAddr = PEER_A.parse().expect("peer");
    let (mut to_site, mut to_vm) = (Vec::new(), Vec::new());
    for (to, d) in &datagrams {
        if *to == peer_addr {
            let inner = peer.open(d).expect("the site opens it");
            to_site.push((seq_of(d), inner[28]));
        } else {
            let (_, _, _, _, payload) = parse_vxlan(d);
            to_vm.push(payload[28]);
        }
    }
    let want_site: Vec<(u32, u8)> = (1u32..).zip((0u8..150).filter(|i| i % 3 != 1)).collect();
    assert_eq!(
        to_site, want_site,
        "numbered in arrival order across the stage's flushes"
    );
    let want_vm: Vec<u8> = (0u8..150).filter(|i| i % 3 == 1).collect();
    assert_eq!(to_vm, want_vm);
}

#[test]
fn a_ces_packet_no_tunnel_covers_is_no_route() {
    let mut e = env();
    // No CHILD_SA yet.
    e.recv_from_ce(from_ce_a(&e, "192.168.0.9", 0));
    assert_eq!(e.drops(DropReason::NoRoute), 1);
    // A CHILD_SA for the VNet's own prefix alone: the CE's segment is not in its selectors
    // (RFC 4301 §5.1: the SA's selectors must cover the packet).
    let natt = e.sh.io.local_addr(e.sh.io.listen[0].natt);
    let narrow = child(
        1,
        0x1001,
        0x2001,
        natt,
        PEER_A.parse().expect("peer"),
        ts("10.0.0.0", "10.0.0.255"),
        ts("192.168.0.0", "192.168.0.255"),
    );
    e.sh.install_child(&narrow).expect("install");
    e.recv_from_ce(from_ce_a(&e, "192.168.0.9", 1));
    assert_eq!(e.drops(DropReason::NoRoute), 2);
    // One that covers the segment, but not this destination.
    let a = site_child(&e, 1, 0x1003, PEER_A, "192.168.0.0");
    e.sh.install_child(&a).expect("install");
    e.recv_from_ce(from_ce_a(&e, "172.20.0.9", 2));
    assert_eq!(e.drops(DropReason::NoRoute), 3);
    assert_eq!(e.sent(), (vec![], vec![]));
    assert_eq!(e.drops(DropReason::VxlanNoTunnel), 0, "counted as the CE's");
    // And to the site it goes.
    e.recv_from_ce(from_ce_a(&e, "192.168.0.9", 3));
    let (_, datagrams) = e.sent();
    assert_eq!(datagrams.len(), 1);
}

#[test]
fn a_ce_never_reaches_another_tenants_site() {
    let mut e = env();
    // Both tenants have a site; a's covers 192.168.0.0/24, b's 192.168.1.0/24.
    let a = site_child(&e, 1, 0x1001, PEER_A, "192.168.0.0");
    let b = site_child(&e, 2, 0x1002, PEER_B, "192.168.1.0");
    e.sh.install_child(&a).expect("install a");
    e.sh.install_child(&b).expect("install b");
    // Tenant b's CE, with tenant a's CE's addresses, sends to a's site: b's tunnels alone are
    // candidates and none covers it.
    let pkt = udp4("10.99.0.2", 9, "192.168.0.9", 7, 64, &[7; 32]);
    e.recv_from_ce(ce_frame(200, e.gw_mac, CE_B, 0x0800, &pkt));
    assert_eq!(e.sent(), (vec![], vec![]));
    assert_eq!(e.drops(DropReason::NoRoute), 1);
    // To its own site it goes, through its own tunnel; a's CE likewise.
    let pkt = udp4("10.99.0.2", 9, "192.168.1.9", 7, 64, &[8; 32]);
    e.recv_from_ce(ce_frame(200, e.gw_mac, CE_B, 0x0800, &pkt));
    e.recv_from_ce(from_ce_a(&e, "192.168.0.9", 9));
    let (_, datagrams) = e.sent();
    let to: Vec<(SocketAddr, u32)> = datagrams.iter().map(|(d, p)| (*d, seq_of(p))).collect();
    let expected = [
        (PEER_B.parse().expect("peer"), 1),
        (PEER_A.parse().expect("peer"), 1),
    ];
    assert_eq!(to, expected, "each tenant's first packet, on its own SA");
    assert_eq!(Peer::of(&b).open(&datagrams[0].1).expect("b's site")[28], 8);
    assert_eq!(Peer::of(&a).open(&datagrams[1].1).expect("a's site")[28], 9);
}

/// Drops the packets whose first UDP payload byte is odd (the VNet's outbound chain).
struct DropOdd;

impl Feature for DropOdd {
    fn name(&self) -> &'static str {
        "drop_odd"
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &["odd_out"]
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
fn the_vnets_outbound_chain_runs_on_a_ces_packets_for_the_site() {
    let mut e = env();
    let a = site_child(&e, 1, 0x1001, PEER_A, "192.168.0.0");
    e.sh.install_child(&a).expect("install");
    let chain = FeatureChain::new().with(Arc::new(DropOdd));
    let tenant = ids::TenantId::new("a").expect("tenant");
    e.sh.set_feature_chain(&tenant, Direction::Outbound, chain)
        .expect("chain");
    let frames = (0u8..6).map(|i| from_ce_a(&e, "192.168.0.9", i)).collect();
    e.recv_batch_from_ce(frames);
    let (_, datagrams) = e.sent();
    let peer = Peer::of(&a);
    let got: Vec<(u32, u8)> = datagrams
        .iter()
        .map(|(_, d)| (seq_of(d), peer.open(d).expect("opens")[28]))
        .collect();
    assert_eq!(
        got,
        [(1, 0), (2, 2), (3, 4)],
        "the survivors, numbered in order"
    );
    let dropped =
        e.sh.feature_drops
            .snapshot()
            .into_iter()
            .find(|(n, _)| n == "a/odd_out")
            .map(|(_, v)| v);
    assert_eq!(dropped, Some(3));
}
