//! Self-dispatch in the packet path (issue 19 §1, `crate::vnet::vmacs`): VNet 100 is
//! dispatched over two data nodes, this one (VTEP 127.0.0.1) and another (127.0.0.9), with
//! eight virtual MACs, even indices this node's; VNet 200 is not dispatched.

use super::*;
use crate::pipeline::encap::{self, Announce};
use ::dispatch::VmacSpace;
use datapath::DispatchConfig;
use std::time::Duration;

const K: u32 = 8;
const OTHER: &str = "127.0.0.9";

fn table(owners: Vec<u16>) -> DispatchConfig {
    crate::testutil::dispatch_table(100, &["127.0.0.1", OTHER], owners)
}

fn even_mine() -> Vec<u16> {
    (0..K as u16).map(|i| i % 2).collect()
}

fn space() -> VmacSpace {
    VmacSpace::new(100, K).expect("space")
}

/// A VM MAC whose virtual MAC index is even (`mine`) or odd, and that index.
fn vm(mine: bool) -> ([u8; 6], u16) {
    (0..=255u8)
        .map(|b| [0x52, 0x54, 0, 0, 1, b])
        .map(|m| (m, space().assign(m)))
        .find(|(_, i)| (i % 2 == 0) == mine)
        .expect("a VM MAC of each parity")
}

fn request(vm: [u8; 6]) -> Vec<u8> {
    arp(ArpOperation::REQUEST, vm, "10.0.0.5", [0; 6], "10.0.0.1")
}

fn counters(e: &Env) -> datapath::DispatchStats {
    e.sh.dispatch_counters
        .stats(e.sh.tables.load().dispatch.as_deref())
}

#[test]
fn only_the_owner_of_a_vms_virtual_mac_answers_its_arp() {
    let mut e = env_with(Some(table(even_mine())));
    let (mine, index) = vm(true);
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, [0xff; 6], mine, EtherType::ARP, &request(mine)),
    );
    let sent = e.sent();
    assert_eq!(sent.len(), 1, "answered");
    let (vni, dst, src, ty, payload) = parse_vxlan(&sent[0].1);
    let vmac = space().mac(index);
    // From the virtual MAC, so the host learns it at this node.
    assert_eq!((vni, dst, src, ty), (100, mine, vmac, EtherType::ARP));
    let reply = ArpRepr::parse(&ArpPacket::new_checked(&payload[..]).expect("arp")).expect("arp");
    assert_eq!(reply.source_hardware_addr.0, vmac);
    assert_eq!(reply.source_protocol_addr.to_string(), "10.0.0.1");

    // Another node's VM: not answered, nothing counted as ignored.
    let (theirs, _) = vm(false);
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, [0xff; 6], theirs, EtherType::ARP, &request(theirs)),
    );
    assert!(e.sent().is_empty());
    assert_eq!(e.drops(DropReason::NeighIgnored), 0);
    let c = counters(&e);
    assert_eq!((c.answered, c.left_to_owner), (1, 1));

    // A unicast refresh to this node's virtual MAC is answered; VNI 200 keeps its gateway MAC.
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, vmac, mine, EtherType::ARP, &request(mine)),
    );
    assert_eq!(e.sent().len(), 1);
    e.recv_from_host(
        e.host(),
        vxlan_frame(200, [0xff; 6], theirs, EtherType::ARP, &request(theirs)),
    );
    let (_, _, src, _, _) = parse_vxlan(&e.sent()[0].1);
    assert_eq!(src, gw_mac(&e, 1));
}

#[test]
fn only_the_owner_answers_a_neighbour_solicitation_with_its_virtual_mac() {
    use wire::ndp::NdpRepr;
    let mut e = env_with(Some(table(even_mine())));
    let target = e.sh.tables.load().overlay.vnets[0].link_local;
    let (mine, index) = vm(true);
    e.recv_from_host(e.host(), solicitation(mine, target));
    let sent = e.sent();
    assert_eq!(sent.len(), 1, "answered");
    let (_, dst, src, ty, payload) = parse_vxlan(&sent[0].1);
    let vmac = space().mac(index);
    assert_eq!((dst, src, ty), (mine, vmac, EtherType::IPV6));
    let p = wire::ip::Ipv6Packet::new_checked(&payload[..]).expect("ipv6");
    let na =
        NdpRepr::parse(&p.src_addr(), &p.dst_addr(), p.hop_limit(), p.payload()).expect("valid NA");
    assert!(matches!(na, NdpRepr::NeighborAdvert { target_lladdr: Some(ll), .. } if ll.0 == vmac));
    let (theirs, _) = vm(false);
    e.recv_from_host(e.host(), solicitation(theirs, target));
    assert!(e.sent().is_empty());
    let c = counters(&e);
    assert_eq!((c.answered, c.left_to_owner), (1, 1));
}

#[test]
fn the_owner_seals_what_its_virtual_macs_receive_and_leaves_the_rest() {
    let mut e = env_with(Some(table(even_mine())));
    let a = e.child(1, 0x1001, PEER_A);
    e.sh.install_child(&a).expect("install");
    let p = Peer::of(&a);
    let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, b"out");
    let (mine, i_mine) = vm(true);
    let (theirs, i_theirs) = vm(false);
    // To this node's virtual MAC: sealed toward the peer.
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, space().mac(i_mine), mine, EtherType::IPV4, &inner),
    );
    let sent = e.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(&p.open(&sent[0].1).expect("peer opens")[28..], b"out");
    assert_eq!(
        counters(&e).vmac_packets,
        vec![(100, i_mine, 1)],
        "its load counted"
    );
    // To the other node's (flooded by a host that has not learnt it): its owner's copy.
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, space().mac(i_theirs), theirs, EtherType::IPV4, &inner),
    );
    assert!(e.sent().is_empty());
    assert_eq!(e.drops(DropReason::DispatchOtherOwner), 1);
    // The gateway MAC still works (a VM that resolved it before dispatch began).
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, gw_mac(&e, 0), mine, EtherType::IPV4, &inner),
    );
    assert_eq!(e.sent().len(), 1);
    // From the other node, to one of this node's virtual MACs: sealed (its host is found by
    // the inner source); anything else from a node is refused.
    let node = SocketAddr::new(ip(OTHER), e.sh.cfg.vxlan_port);
    e.recv_from_host(
        node,
        vxlan_frame(100, space().mac(i_mine), theirs, EtherType::IPV4, &inner),
    );
    assert_eq!(e.sent().len(), 1);
    e.recv_from_host(
        node,
        vxlan_frame(100, space().mac(i_theirs), theirs, EtherType::IPV4, &inner),
    );
    e.recv_from_host(
        node,
        vxlan_frame(100, [0xff; 6], theirs, EtherType::ARP, &request(theirs)),
    );
    assert!(e.sent().is_empty());
    assert_eq!(
        e.drops(DropReason::DispatchOtherOwner),
        2,
        "never sent on twice"
    );
    assert_eq!(
        e.drops(DropReason::VxlanUnknownHost),
        1,
        "nodes send no ARP"
    );
    // A source not behind any host of the VNet, sent on by a node: refused.
    let stray = udp4("172.16.0.5", 1000, "192.168.0.9", 2000, 64, b"x");
    e.recv_from_host(
        node,
        vxlan_frame(100, space().mac(i_mine), theirs, EtherType::IPV4, &stray),
    );
    assert!(e.sent().is_empty());
    assert_eq!(e.drops(DropReason::VxlanUnknownHost), 2);
}

#[test]
fn a_virtual_mac_given_away_is_sent_on_to_its_new_owner_while_it_lingers() {
    let mut e = env_with(Some(table(even_mine())));
    let (mine, index) = vm(true);
    e.sh.set_dispatch(&table(moved_owners(index)))
        .expect("replace");
    let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, b"late");
    let frame = vxlan_frame(100, space().mac(index), mine, EtherType::IPV4, &inner);
    e.recv_from_host(e.host(), frame.clone());
    let sent = e.sent();
    assert_eq!(sent.len(), 1, "sent on");
    assert_eq!(
        sent[0],
        (SocketAddr::new(ip(OTHER), e.sh.cfg.vxlan_port), frame),
        "unchanged, to the new owner's VTEP"
    );
    assert_eq!(counters(&e).forwarded, 1);
    // Its ARP is now the new owner's to answer.
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, [0xff; 6], mine, EtherType::ARP, &request(mine)),
    );
    assert!(e.sent().is_empty());
    // Without lingering (linger 0) it is left to the new owner at once.
    let mut e = env_with(Some(table(even_mine())));
    let mut at_once = table(moved_owners(index));
    at_once.linger = Duration::ZERO;
    e.sh.set_dispatch(&at_once).expect("replace");
    e.recv_from_host(
        e.host(),
        vxlan_frame(100, space().mac(index), mine, EtherType::IPV4, &inner),
    );
    assert!(e.sent().is_empty());
    assert_eq!(e.drops(DropReason::DispatchOtherOwner), 1);
}

/// [`even_mine`] with `index` moved to the other node.
fn moved_owners(index: u16) -> Vec<u16> {
    let mut owners = even_mine();
    owners[usize::from(index)] = 1;
    owners
}

#[test]
fn deliveries_leave_from_the_vms_virtual_mac_or_the_nodes_own() {
    for (vm_mac, owned) in [(vm(true).0, true), (vm(false).0, false)] {
        let e = &mut env_with(Some(table(even_mine())));
        let a = e.child(1, 0x1001, PEER_A);
        e.sh.install_child(&a).expect("install");
        let peer = Peer::of(&a);
        let node_mac = e.sh.io.vteps[0].node_mac.0;
        let inner = udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, b"in");
        e.recv_from_peer(PEER_A, peer.seal(&inner));
        // The request is a probe from the node's own MAC: the VM does not take that MAC
        // for the gateway's.
        let sent = e.sent();
        assert_eq!(sent.len(), 1);
        let (_, dst, src, ty, payload) = parse_vxlan(&sent[0].1);
        assert_eq!((dst, src, ty), ([0xff; 6], node_mac, EtherType::ARP));
        let req = ArpRepr::parse(&ArpPacket::new_checked(&payload[..]).expect("arp")).expect("arp");
        assert!(req.source_protocol_addr.is_unspecified());
        // The VM answers the probe (to the node's MAC, target address 0.0.0.0).
        let reply = arp(ArpOperation::REPLY, vm_mac, "10.0.0.5", node_mac, "0.0.0.0");
        e.recv_from_host(
            e.host(),
            vxlan_frame(100, node_mac, vm_mac, EtherType::ARP, &reply),
        );
        let sent = e.sent();
        assert_eq!(sent.len(), 1, "the queued packet leaves");
        let (_, dst, src, _, _) = parse_vxlan(&sent[0].1);
        let expect = if owned {
            space().mac(space().assign(vm_mac))
        } else {
            node_mac
        };
        assert_eq!((dst, src), (vm_mac, expect), "owned: {owned}");
    }
}

#[test]
fn owners_announce_their_virtual_macs_to_every_host() {
    let mut e = env_with(Some(table(even_mine())));
    let announce = |e: &mut Env, which: Announce| {
        e.in_batch(|o, sh, t, r| {
            encap::housekeeping(o, sh, t, r, Some(0), Instant::now(), which);
        });
        e.sent()
    };
    let frames = |sent: &[(SocketAddr, Vec<u8>)]| -> Vec<u16> {
        sent.iter()
            .map(|(to, d)| {
                let (vni, dst, src, ty, _) = parse_vxlan(d);
                assert_eq!(
                    (vni, dst, ty.0),
                    (100, src, 0x88b5),
                    "from itself to itself"
                );
                assert_eq!(to.ip(), ip(HOST));
                space().index_of(src).expect("a virtual MAC")
            })
            .collect()
    };
    // The first round announces all of this node's (there is one host).
    let t = e.sh.tables.load();
    assert_eq!(
        encap::announcements_due(&e.sh, &t, Instant::now()),
        Announce::All
    );
    assert_eq!(frames(&announce(&mut e, Announce::All)), vec![0, 2, 4, 6]);
    assert_eq!(
        encap::announcements_due(&e.sh, &t, Instant::now()),
        Announce::Nothing
    );
    // A new table: what it gained, at once.
    let mut more = even_mine();
    more[1] = 0;
    e.sh.set_dispatch(&table(more.clone())).expect("replace");
    let t = e.sh.tables.load();
    let due = encap::announcements_due(&e.sh, &t, Instant::now());
    assert_eq!(due, Announce::Gained(1), "newer than the first table");
    assert_eq!(frames(&announce(&mut e, due)), vec![1]);
    assert_eq!(counters(&e).announced, 5);
    // Two tables before the next round: the gains of both.
    more[3] = 0;
    e.sh.set_dispatch(&table(more.clone())).expect("replace");
    more[5] = 0;
    e.sh.set_dispatch(&table(more)).expect("replace");
    let t = e.sh.tables.load();
    let due = encap::announcements_due(&e.sh, &t, Instant::now());
    assert_eq!(frames(&announce(&mut e, due)), vec![3, 5]);
    // Nothing without self-dispatch.
    let mut plain = env();
    let t = plain.sh.tables.load();
    assert_eq!(
        encap::announcements_due(&plain.sh, &t, Instant::now()),
        Announce::Nothing
    );
    assert!(announce(&mut plain, Announce::All).is_empty());
}

#[test]
fn set_dispatch_is_validated_and_refused_without_self_dispatch() {
    let e = env_with(Some(table(even_mine())));
    let before = e.sh.tables.load().dispatch.as_ref().map(|d| d.generation);
    let mut bad = table(even_mine());
    bad.vnets[0].owners[3] = 7;
    assert!(matches!(
        e.sh.set_dispatch(&bad),
        Err(crate::DataplaneError::Config { field, .. }) if field == "dispatch.vnets[0].owners[3]"
    ));
    assert_eq!(
        e.sh.tables.load().dispatch.as_ref().map(|d| d.generation),
        before,
        "nothing changed"
    );
    assert!(matches!(
        env().sh.set_dispatch(&table(even_mine())),
        Err(crate::DataplaneError::Unsupported { .. })
    ));
}
