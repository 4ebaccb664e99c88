//! A steer node's per-attachment counters and the rate limit of a CE's packets into a tunnel,
//! with a customer-facing port in a network namespace of the test's own (a veth pair: the
//! steer node's port on one end, the CE, an AF_PACKET socket, on the other; data nodes are UDP
//! sockets on loopback). A CE's packet that a tunnel selector of its attachment's VNet takes
//! goes to the tunnel's node charged to the tunnel's outbound limit, and over it is dropped
//! and counted as the hosts' VXLAN would be; every frame of the attachment, either way, shows
//! in its counters. Needs root (CAP_SYS_ADMIN for the namespace, CAP_NET_RAW for the packet
//! sockets).

mod common;

use std::net::Ipv4Addr;
use std::time::Duration;

use common::{recv, socket, start_with_port, with_customer_link};
use netio::packet::{PacketScratch, PacketSocket};
use protego_steernode::{AttachmentStats, DropReason, ForwardKind};
use steer::{
    AddrRange, AttachEntry, AttachmentId, NodeId, PortId, PortKey, RateLimit, Selector,
    SelectorEntry, TunnelId,
};
use wire::ip::{IpProtocol, Ipv4Repr};
use wire::relay;
use wire::vxlan::Vni;

/// Every CE frame here: Ethernet (12), S-tag and C-tag (8), EtherType (2), IPv4 (20), UDP
/// header (8) and payload.
const FRAME_LEN: usize = 200;
const IP_AT: usize = 22;

/// A Q-in-Q frame (S-tag 100, C-tag 20) from the CE: UDP from 10.0.0.7 to `dst`, its
/// payload filled with `tag`.
fn ce_frame(dst: Ipv4Addr, tag: u8) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
    f.extend_from_slice(&[0x88, 0xa8, 0, 100, 0x81, 0x00, 0, 20, 0x08, 0x00]);
    f.resize(FRAME_LEN, tag);
    Ipv4Repr {
        src_addr: Ipv4Addr::new(10, 0, 0, 7),
        dst_addr: dst,
        protocol: IpProtocol::UDP,
        payload_len: FRAME_LEN - IP_AT - 20,
        ttl: 64,
        dscp: 0,
        ecn: 0,
        ident: 1,
        dont_frag: true,
    }
    .emit(&mut f[IP_AT..])
    .expect("IPv4 header");
    let udp = &mut f[IP_AT + 20..IP_AT + 28];
    udp[..2].copy_from_slice(&1000u16.to_be_bytes());
    udp[2..4].copy_from_slice(&2000u16.to_be_bytes());
    udp[4..6].copy_from_slice(&((FRAME_LEN - IP_AT - 20) as u16).to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]);
    f
}

/// Ethernet frames that reach `sock` inside Geneve within `within`.
fn frames_at(sock: &std::net::UdpSocket, within: Duration) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    while let Some((bytes, _)) = recv(sock, within) {
        if let Some(eth) = relay::parse_frame(&bytes).ok().and_then(|f| f.ethernet) {
            got.push(bytes[eth].to_vec());
        }
    }
    got
}

#[test]
fn a_ce_packet_into_a_tunnel_is_rate_limited_and_every_frame_counted_for_its_attachment() {
    with_customer_link(run);
}

fn run() {
    let steer = start_with_port();
    let geneve = steer.local_addrs().geneve;
    // Data node 1 serves red's attachment; data node 2 holds tunnel 7, which takes
    // 10.0.0.0/24 -> 192.168.2.0/24 in red's VNet.
    let (d1, d2) = (socket("127.0.1.1"), socket("127.0.1.2"));
    steer
        .set_data_nodes(vec![
            (NodeId(1), d1.local_addr().unwrap()),
            (NodeId(2), d2.local_addr().unwrap()),
        ])
        .unwrap();
    let vni = Vni::new(5000).unwrap();
    let tunnel = TunnelId(7);
    let prefix = |a: &str, len| AddrRange::prefix(a.parse().unwrap(), len).unwrap();
    steer
        .set_selectors(
            vni,
            vec![SelectorEntry {
                selector: Selector::between(prefix("10.0.0.0", 24), prefix("192.168.2.0", 24)),
                tunnel: Some(tunnel),
                node: NodeId(2),
            }],
            vec![NodeId(1)],
        )
        .unwrap();
    let red = PortKey::new(PortId(5), 100, 20).unwrap();
    steer
        .set_port_tags(
            red,
            AttachEntry {
                node: NodeId(1),
                attachment: AttachmentId(3),
                vni: Some(vni),
            },
        )
        .unwrap();
    // 8 kbit/s with a 1000-byte burst: five 200-byte frames at once, then one every 200 ms.
    steer.set_rate_limit(tunnel, Some(RateLimit::new(8_000, 1000).into()));

    let ce = PacketSocket::open("ce0").expect("the customer's side");
    let mut scratch = PacketScratch::default();
    const TO_SITE: usize = 20;
    const TO_VM: usize = 3;
    let to_site: Vec<Vec<u8>> = (0..TO_SITE)
        .map(|_| ce_frame(Ipv4Addr::new(192, 168, 2, 9), 0xc1))
        .collect();
    let to_vm: Vec<Vec<u8>> = (0..TO_VM)
        .map(|_| ce_frame(Ipv4Addr::new(10, 0, 0, 9), 0xc2))
        .collect();
    let stranger = {
        let mut f = ce_frame(Ipv4Addr::new(10, 0, 0, 9), 0xc3);
        f[17] = 21; // C-tag 21: nobody's
        f
    };
    let all = to_site
        .iter()
        .chain(&to_vm)
        .chain(std::iter::once(&stranger));
    assert_eq!(ce.send_batch(all.map(|f| &f[..]), &mut scratch), 0);

    // Back to the CE: two frames from the serving node with red's tags.
    let mut buf = vec![0u8; 512];
    for tag in [0xd1, 0xd2] {
        let back = ce_frame(Ipv4Addr::new(10, 0, 0, 7), tag);
        let n = relay::emit_l2_frame(&mut buf, 5, None, &back).unwrap();
        d1.send_to(&buf[..n], geneve).unwrap();
    }

    let s = common::wait_stats(&steer, "every CE frame decided and both sent back", |s| {
        s.forwarded.get(ForwardKind::PortToData) + s.dropped.get(DropReason::RateLimited)
            == (TO_SITE + TO_VM) as u64
            && s.dropped.get(DropReason::PortUnknownTags) == 1
            && s.forwarded.get(ForwardKind::DataToPort) == 2
    });
    let limited = s.dropped.get(DropReason::RateLimited);
    let admitted = TO_SITE as u64 - limited;
    // The burst, and at most one more frame's credit earned while the batch was read.
    assert!(
        (5..=6).contains(&admitted),
        "{admitted} of {TO_SITE} CE frames into the tunnel admitted: {s:#?}"
    );
    // Charged to the tunnel's outbound (VM -> site) direction, as the hosts' VXLAN is: what
    // the steer node's usage reports, and so the division of the tunnel's limit, are made of.
    let t = s.tunnels[&tunnel];
    assert_eq!(t.outbound.admitted_packets, admitted);
    assert_eq!(t.outbound.admitted_bytes, admitted * FRAME_LEN as u64);
    assert_eq!(t.outbound.dropped_packets, limited);
    assert_eq!(t.outbound.dropped_bytes, limited * FRAME_LEN as u64);
    assert_eq!(t.inbound.admitted_packets + t.inbound.dropped_packets, 0);
    // Only the admitted frames reach the tunnel's node; the VM's go to the serving node.
    let at_d2 = frames_at(&d2, Duration::from_millis(300));
    assert_eq!(at_d2.len() as u64, admitted);
    assert!(at_d2.iter().all(|f| f == &to_site[0]));
    let at_d1 = frames_at(&d1, Duration::from_millis(100));
    assert_eq!(at_d1.len(), TO_VM);

    // Red's counters: every frame from its CE relayed, its rate-limit drops, the frames sent
    // back; the stranger's frame is nobody's.
    assert_eq!(
        s.attachments.get(&red),
        Some(&AttachmentStats {
            attachment: AttachmentId(3),
            from_ce_frames: admitted + TO_VM as u64,
            from_ce_bytes: (admitted + TO_VM as u64) * FRAME_LEN as u64,
            to_ce_frames: 2,
            to_ce_bytes: 2 * FRAME_LEN as u64,
            dropped: limited,
        }),
        "{:#?}",
        s.attachments
    );
    assert_eq!(s.attachments.len(), 1, "{:#?}", s.attachments);

    // Whole tables without red's pair forget its counters.
    steer.replace_all(Default::default()).unwrap();
    assert!(steer.stats().attachments.is_empty());
    steer.shutdown();
}
