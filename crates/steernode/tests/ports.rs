//! A steer node with a customer-facing port, in a network namespace of the test's own: a veth
//! pair stands for the customer's link (the steer node's port on one end, the customer's edge
//! router, an AF_PACKET socket writing and reading tagged frames, on the other); data nodes
//! are UDP sockets on loopback. Frames of an attachment's tag pair reach the data node serving
//! it inside Geneve with the port option, frames of other tags are counted and go nowhere,
//! and a data node's frame for the port leaves on the customer's link only with the port's
//! tags; a frame whose UDP checksum a local stack left to offload reaches the data node
//! finished. Needs root (CAP_SYS_ADMIN for the namespace, CAP_NET_RAW for the packet sockets).

mod common;

use std::time::{Duration, Instant};

use common::{recv, socket, start_with_port, with_customer_link, DEADLINE};
use netio::packet::{FrameBatch, PacketScratch, PacketSocket};
use protego_steernode::{DropReason, ForwardKind, PortInfo};
use steer::{AttachEntry, AttachmentId, NodeId, PortId, PortKey};
use wire::relay;

/// A customer's frame with these tags (TPID, VLAN id; outermost first) carrying `tag` in
/// an IPv4-looking payload.
fn customer_frame(tags: &[(u16, u16)], tag: u8) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
    for &(tpid, vid) in tags {
        f.extend_from_slice(&tpid.to_be_bytes());
        f.extend_from_slice(&vid.to_be_bytes());
    }
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend_from_slice(&[tag; 60]);
    f
}

/// Reads frames from the customer's side until one ends with `tag` bytes, or the deadline.
fn read_customer(ce: &PacketSocket, tag: u8, within: Duration) -> Option<Vec<u8>> {
    let mut batch = FrameBatch::new(64, 64 * 2048);
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let (n, _) = ce.read_batch(&mut batch);
        for i in 0..n {
            let f = batch.frame_mut(i).to_vec();
            if f.len() > 14 && f.ends_with(&[tag; 60]) {
                return Some(f);
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

#[test]
fn customer_frames_go_by_tag_pair_to_the_serving_data_node_and_back() {
    with_customer_link(run);
}

fn run() {
    let steer = start_with_port();
    let geneve = steer.local_addrs().geneve;
    let port0 = PacketSocket::open("port0").expect("the port's interface");
    assert_eq!(
        steer.ports(),
        vec![PortInfo {
            id: PortId(5),
            interface: "port0".into(),
            mac: port0.mac(),
        }]
    );
    drop(port0);
    let (d1, d2) = (socket("127.0.1.1"), socket("127.0.1.2"));
    steer
        .set_data_nodes(vec![
            (NodeId(1), d1.local_addr().unwrap()),
            (NodeId(2), d2.local_addr().unwrap()),
        ])
        .unwrap();
    let key = |s_tag, c_tag| PortKey {
        port: PortId(5),
        s_tag,
        c_tag,
    };
    let entry = |node, id| AttachEntry {
        node: NodeId(node),
        attachment: AttachmentId(id),
        vni: None,
    };
    steer.set_port_tags(key(100, 20), entry(1, 1)).unwrap();
    steer.set_port_tags(key(0, 30), entry(2, 2)).unwrap();
    assert!(steer.set_port_tags(key(100, 4095), entry(2, 3)).is_err());

    let ce = PacketSocket::open("ce0").expect("the customer's side");
    let mut scratch = PacketScratch::default();
    let red = customer_frame(&[(0x88a8, 100), (0x8100, 20)], 0xa1);
    let single = customer_frame(&[(0x8100, 30)], 0xa2);
    let stranger = customer_frame(&[(0x88a8, 101), (0x8100, 20)], 0xa3);
    let untagged = customer_frame(&[], 0xa4);
    for f in [&red, &single, &stranger, &untagged] {
        assert_eq!(ce.send_batch(std::iter::once(&f[..]), &mut scratch), 0);
    }
    // Each attachment's frame reaches its own data node, tags and all, with the port option.
    for (sock, want) in [(&d1, &red), (&d2, &single)] {
        let got = loop {
            let (bytes, from) = recv(sock, DEADLINE).expect("a frame at the data node");
            assert_eq!(from, geneve);
            let f = relay::parse_frame(&bytes).expect("Geneve");
            if let Some(eth) = f.ethernet {
                assert_eq!(f.port, Some(5));
                break bytes[eth].to_vec();
            }
        };
        assert_eq!(&got, want);
    }
    let s = common::wait_stats(&steer, "the two unknown frames counted", |s| {
        s.dropped.get(DropReason::PortUnknownTags) >= 2
    });
    assert_eq!(s.forwarded.get(ForwardKind::PortToData), 2);

    // Migration: the red pair now goes to data node 2.
    steer.set_port_tags(key(100, 20), entry(2, 1)).unwrap();
    let red2 = customer_frame(&[(0x88a8, 100), (0x8100, 20)], 0xa5);
    ce.send_batch(std::iter::once(&red2[..]), &mut scratch);
    let (bytes, _) = recv(&d2, DEADLINE).expect("after the move");
    let f = relay::parse_frame(&bytes).unwrap();
    assert_eq!(&bytes[f.ethernet.unwrap()], &red2[..]);

    // Back toward the customer: a data node's frame for port 5 with red's tags leaves on the
    // link; one with tags of no attachment, or for another port, does not.
    let mut buf = vec![0u8; 256];
    let back = customer_frame(&[(0x88a8, 100), (0x8100, 20)], 0xb1);
    let n = relay::emit_l2_frame(&mut buf, 5, None, &back).unwrap();
    d1.send_to(&buf[..n], geneve).unwrap();
    let got = read_customer(&ce, 0xb1, DEADLINE).expect("the frame on the customer's link");
    assert_eq!(got, back);
    let wrong_tags = customer_frame(&[(0x88a8, 100), (0x8100, 21)], 0xb2);
    let n = relay::emit_l2_frame(&mut buf, 5, None, &wrong_tags).unwrap();
    d1.send_to(&buf[..n], geneve).unwrap();
    let n = relay::emit_l2_frame(&mut buf, 6, None, &back).unwrap();
    d1.send_to(&buf[..n], geneve).unwrap();
    let s = common::wait_stats(&steer, "both refused frames counted", |s| {
        s.dropped.get(DropReason::PortUnknownTagsOut) == 1
            && s.dropped.get(DropReason::PortNotOurs) == 1
    });
    assert_eq!(s.forwarded.get(ForwardKind::DataToPort), 1);
    assert!(read_customer(&ce, 0xb2, Duration::from_millis(200)).is_none());

    offloaded_checksums_are_finished(&d2);
    steer.shutdown();
}

/// A frame whose UDP checksum a local stack left to offload: sent on the customer's side of
/// the veth by a packet socket with a `virtio_net_hdr` (`PACKET_VNET_HDR`) asking for the
/// checksum (`VIRTIO_NET_HDR_F_NEEDS_CSUM`), as a local stack hands a veth its packets (a VLAN
/// device would let the stack itself send on the attachment's tag, but needs the 8021q module,
/// which not every test kernel has). The steer
/// node's ring gets it marked `TP_STATUS_CSUMNOTREADY` with only the pseudo-header sum in the
/// checksum field; the data node (2, serving the single-tag attachment C-tag 30) must get it
/// finished.
fn offloaded_checksums_are_finished(d2: &std::net::UdpSocket) {
    use std::net::Ipv4Addr;
    use wire::checksum::pseudo_header_of;
    use wire::ip::{IpProtocol, Ipv4Repr};
    use wire::udp::{UdpChecksum, UdpRepr};
    const PACKET_VNET_HDR: libc::c_int = 15;
    const IP_AT: usize = 18;
    let data = b"finished by the steer node";
    let mut f = customer_frame(&[(0x8100, 30)], 0);
    f.truncate(IP_AT);
    f.resize(IP_AT + 28 + data.len(), 0);
    Ipv4Repr {
        src_addr: Ipv4Addr::new(10, 30, 0, 1),
        dst_addr: Ipv4Addr::new(10, 30, 0, 2),
        protocol: IpProtocol::UDP,
        payload_len: 8 + data.len(),
        ttl: 64,
        dscp: 0,
        ecn: 0,
        ident: 1,
        dont_frag: true,
    }
    .emit(&mut f[IP_AT..])
    .expect("IPv4 header");
    f[IP_AT + 28..].copy_from_slice(data);
    let udp = UdpRepr {
        src_port: 4030,
        dst_port: 9,
        payload_len: data.len(),
    };
    udp.emit(&mut f[IP_AT + 20..], UdpChecksum::Zero)
        .expect("UDP header");
    // What the stack leaves for the NIC: the pseudo-header sum.
    let ph = pseudo_header_of(&f[IP_AT..], IpProtocol::UDP, udp.buffer_len() as u32).unwrap();
    f[IP_AT + 26..IP_AT + 28].copy_from_slice(&ph.to_be_bytes());
    // struct virtio_net_hdr: flags, gso_type, hdr_len, gso_size, csum_start, csum_offset
    // (host byte order).
    let mut vnet = vec![1u8, 0];
    for v in [0u16, 0, (IP_AT + 20) as u16, 6] {
        vnet.extend_from_slice(&v.to_ne_bytes());
    }
    vnet.extend_from_slice(&f);

    // SAFETY: plain system calls on a socket this function owns and closes; the pointers are
    // to live locals of the sizes passed.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
        assert!(fd >= 0, "packet socket");
        let on: libc::c_int = 1;
        let r = libc::setsockopt(
            fd,
            libc::SOL_PACKET,
            PACKET_VNET_HDR,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        assert_eq!(r, 0, "PACKET_VNET_HDR");
        let mut ll: libc::sockaddr_ll = std::mem::zeroed();
        ll.sll_family = libc::AF_PACKET as u16;
        ll.sll_ifindex = libc::if_nametoindex(c"ce0".as_ptr()) as i32;
        ll.sll_halen = 6;
        let r = libc::sendto(
            fd,
            vnet.as_ptr().cast(),
            vnet.len(),
            0,
            (&ll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        );
        assert_eq!(r, vnet.len() as isize, "sent");
        libc::close(fd);
    }

    let deadline = Instant::now() + DEADLINE;
    let eth = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (bytes, _) = recv(d2, left).expect("the customer's datagram at data node 2");
        let g = relay::parse_frame(&bytes).expect("Geneve");
        if let Some(eth) = g.ethernet {
            let eth = bytes[eth].to_vec();
            if eth.ends_with(data) {
                break eth;
            }
        }
    };
    assert_eq!(eth[..IP_AT + 26], f[..IP_AT + 26]);
    assert_eq!(eth[IP_AT + 28..], f[IP_AT + 28..]);
    let ipp = wire::ip::Ipv4Packet::new_checked(&eth[IP_AT..]).expect("IPv4");
    let udp = wire::udp::UdpPacket::new_checked(ipp.payload()).expect("UDP");
    assert!(
        udp.verify_checksum_v4(ipp.src_addr(), ipp.dst_addr()) && udp.checksum() != 0,
        "UDP checksum {:#06x} finished",
        udp.checksum()
    );
}
