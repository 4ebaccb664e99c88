//! Attachments in relay mode (issue 16's distributed form): a customer's frames reach the
//! data node from the steer node owning the port, inside Geneve with the port option, and
//! frames toward the CE leave the same way; the attachments are replaced at run time.

use super::*;
use datapath::{AttachmentConfig, AttachmentPort, AttachmentTags};
use wire::ethernet::EthernetAddress;
use wire::relay::emit_l2_frame;

/// The port's MAC on the steer node: the gateway's MAC on the customer's segment.
const PORT_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0xee, 0x01];
const CE_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0xc, 1];
/// The port id on the steer node.
const PORT: u32 = 3;

fn attachment(name: &str, s_tag: u16) -> AttachmentConfig {
    AttachmentConfig {
        name: name.into(),
        tenant: ids::TenantId::new("a").expect("tenant"),
        vnet: "a-net".into(),
        port: AttachmentPort::Steer {
            geneve: sa(STEER),
            port: PORT,
            mac: PORT_MAC,
        },
        tags: AttachmentTags::QinQ { s_tag, c_tag: 10 },
        gateway_ip: ip("10.99.0.1"),
        ce_ip: None,
        routes: vec![(ip("10.99.0.0"), 24)],
        ce_mac: None,
    }
}

/// Relay mode with tenant a's VNet, tunnel 1 and attachment "dc" (S-tag 100, C-tag 10) on
/// port 3 of the steer node.
fn env_attached() -> Env {
    let e = env();
    e.sh.set_attachments(vec![attachment("dc", 100)])
        .expect("attachments");
    e
}

/// A Q-in-Q frame from the CE (tags `s_tag`, 10) relayed by `steer` from port `port`.
fn from_ce(port: u32, s_tag: u16, dst: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    from_mac(CE_MAC, port, s_tag, dst, ethertype, payload)
}

/// [`from_ce`] from source MAC `src`.
fn from_mac(
    src: [u8; 6],
    port: u32,
    s_tag: u16,
    dst: [u8; 6],
    ethertype: u16,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x88, 0xa8]);
    f.extend_from_slice(&s_tag.to_be_bytes());
    f.extend_from_slice(&[0x81, 0x00, 0x00, 10]);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    let mut buf = vec![0u8; f.len() + 64];
    let n = emit_l2_frame(&mut buf, port, None, &f).expect("frame");
    buf.truncate(n);
    buf
}

/// The Ethernet frame inside a Geneve L2 frame sent toward a port, with the port id.
fn to_port(d: &[u8]) -> (u32, Vec<u8>) {
    let f = parse_frame(d).expect("geneve");
    let at = f.ethernet.expect("an ethernet frame");
    (f.port.expect("port option"), d[at].to_vec())
}

/// The CE asks for the gateway (ARP); the answer leaves toward the port.
fn ce_resolves_gateway(e: &mut Env) {
    let req = arp(
        ArpOperation::REQUEST,
        CE_MAC,
        "10.99.0.2",
        [0; 6],
        "10.99.0.1",
    );
    e.recv(STEER, from_ce(PORT, 100, [0xff; 6], 0x0806, &req));
}

#[test]
fn a_relayed_arp_request_is_answered_toward_the_port_and_the_ce_mac_reported() {
    let mut e = env_attached();
    ce_resolves_gateway(&mut e);
    let sent = e.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    let (sock, dst, d) = &sent[0];
    assert_eq!(
        (*sock, *dst),
        (e.relay_sock(), sa(STEER)),
        "to the port's steer node"
    );
    let (port, frame) = to_port(d);
    assert_eq!(port, PORT);
    let tagged = wire::ethernet::tags::read(&frame).expect("tags");
    assert_eq!(tagged.tags, (100, 10));
    assert_eq!((tagged.dst.0, tagged.src.0), (CE_MAC, PORT_MAC));
    let reply = ArpRepr::parse(&ArpPacket::new_checked(&frame[tagged.payload..]).expect("arp"))
        .expect("arp");
    assert_eq!(reply.operation, ArpOperation::REPLY);
    assert_eq!(reply.source_hardware_addr, EthernetAddress(PORT_MAC));
    // The CE's MAC is news for the control plane (other data nodes need it after a move).
    let learned = e.rx.try_iter().find_map(|m| match m {
        ToControl::CeLearned { attachment, mac } => Some((attachment, mac)),
        _ => None,
    });
    assert_eq!(learned, Some(("dc".to_owned(), CE_MAC)));
    // Learned once: the same MAC again is not news.
    ce_resolves_gateway(&mut e);
    e.sent();
    assert!(!e
        .rx
        .try_iter()
        .any(|m| matches!(m, ToControl::CeLearned { .. })));
}

#[test]
fn a_ce_packet_goes_to_its_vm_and_the_vms_answer_back_to_the_port() {
    let mut e = env_attached();
    ce_resolves_gateway(&mut e);
    e.sent();
    e.vm_answers_arp(100, 0);
    e.sent();
    // CE -> VM 10.0.0.5: VXLAN to the VM's host, from the VTEP.
    let pkt = udp4("10.99.0.2", 5000, "10.0.0.5", 6000, 64, b"from the ce");
    e.recv(STEER, from_ce(PORT, 100, PORT_MAC, 0x0800, &pkt));
    let sent = e.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].1, SocketAddr::new(ip(HOST), 4789));
    let (vni, dst, _, ty, inner) = parse_vxlan(&sent[0].2);
    assert_eq!((vni, dst, ty), (100, VM_MAC, EtherType::IPV4));
    assert_eq!(&inner[28..], b"from the ce");
    // VM -> CE: the host's VXLAN (relayed by the steer node) leaves tagged toward the port.
    let back = udp4("10.0.0.5", 6000, "10.99.0.2", 5000, 64, b"to the ce");
    let vx = vxlan_frame(100, e.gw_mac(0), VM_MAC, EtherType::IPV4, &back);
    e.recv(STEER, frame(sa(HOST_SRC), vip(4789), &[], &vx));
    let sent = e.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].1, sa(STEER));
    let (port, f) = to_port(&sent[0].2);
    assert_eq!(port, PORT);
    let tagged = wire::ethernet::tags::read(&f).expect("tags");
    assert_eq!((tagged.tags, tagged.dst.0), ((100, 10), CE_MAC));
    let ip4 = Ipv4Packet::new_checked(&f[tagged.payload..]).expect("ipv4");
    assert_eq!(ip4.ttl(), 63, "routed");
    assert_eq!(e.total_drops(), 0);
}

#[test]
fn a_ce_packet_for_the_tunnel_is_sealed_and_relayed() {
    let mut e = env_attached();
    // The CHILD_SA covers the CE's segment as well as the VMs'.
    let c = child(
        1,
        0x1001,
        0x2001,
        vip(4500),
        sa(PEER),
        ts("10.0.0.0", "10.255.255.255"),
        ts("192.168.0.0", "192.168.0.255"),
    );
    e.sh.install_child(&c).expect("install");
    ce_resolves_gateway(&mut e);
    e.sent();
    // 10.99.0.2 -> 192.168.0.9 is beyond the VNet's tunnel (remote selector 192.168.0.0/24).
    let pkt = udp4("10.99.0.2", 5000, "192.168.0.9", 2000, 64, b"over ipsec");
    let frames = (0..3)
        .map(|_| from_ce(PORT, 100, PORT_MAC, 0x0800, &pkt))
        .collect();
    e.recv_batch(STEER, frames);
    let sent = e.sent();
    assert_eq!(sent.len(), 3, "{sent:?}");
    let peer = Peer::of(&c);
    let mut seqs = Vec::new();
    for (_, dst, d) in &sent {
        assert_eq!(*dst, sa(STEER), "relayed from the VIP by the steer node");
        let dg = parse_frame(d).expect("frame").datagram.expect("datagram");
        assert_eq!((dg.src, dg.dst), (vip(4500), sa(PEER)));
        let esp = &d[dg.payload];
        seqs.push(u32::from_be_bytes([esp[4], esp[5], esp[6], esp[7]]));
        let inner = peer.open(esp).expect("opens");
        assert_eq!(&inner[28..], b"over ipsec");
    }
    assert_eq!(seqs, [1, 2, 3], "numbered in arrival order");
}

#[test]
fn frames_of_unknown_ports_tags_and_senders_are_dropped_and_counted() {
    let mut e = env_attached();
    let req = arp(
        ArpOperation::REQUEST,
        CE_MAC,
        "10.99.0.2",
        [0; 6],
        "10.99.0.1",
    );
    // Another port of the same steer node.
    e.recv(STEER, from_ce(PORT + 1, 100, [0xff; 6], 0x0806, &req));
    assert_eq!(e.drops(DropReason::AttachUnknownPort), 1);
    // Port 3 of another steer node is another port.
    e.sh.set_relays(vec![sa(STEER), sa(STEER2)])
        .expect("relays");
    e.recv(STEER2, from_ce(PORT, 100, [0xff; 6], 0x0806, &req));
    assert_eq!(e.drops(DropReason::AttachUnknownPort), 2);
    // The right port, a tag pair of nobody's.
    e.recv(STEER, from_ce(PORT, 200, [0xff; 6], 0x0806, &req));
    assert_eq!(e.drops(DropReason::AttachUnknownTags), 1);
    assert!(e.sent().is_empty());
    assert!(!e
        .rx
        .try_iter()
        .any(|m| matches!(m, ToControl::CeLearned { .. })));
}

#[test]
fn attachments_are_replaced_whole_and_keep_their_ce_mac() {
    let mut e = env_attached();
    ce_resolves_gateway(&mut e);
    e.sent();
    let before =
        e.sh.tables
            .load()
            .attach
            .table
            .by_name("dc")
            .and_then(|a| a.ce_mac());
    assert_eq!(before, Some(EthernetAddress(CE_MAC)));
    // Another attachment added: "dc" keeps the MAC it learned.
    let mut dc2 = attachment("dc2", 101);
    dc2.routes = vec![(ip("10.97.0.0"), 24)];
    e.sh.set_attachments(vec![attachment("dc", 100), dc2])
        .expect("replace");
    let t = e.sh.tables.load();
    assert_eq!(
        t.attach.table.by_name("dc").and_then(|a| a.ce_mac()),
        before
    );
    assert_eq!(t.attach.table.by_name("dc2").and_then(|a| a.ce_mac()), None);
    // A MAC learned elsewhere.
    e.sh.set_ce_mac("dc2", [0x52, 0x54, 0, 0, 0xd, 2])
        .expect("set");
    let got =
        e.sh.tables
            .load()
            .attach
            .table
            .by_name("dc2")
            .and_then(|a| a.ce_mac());
    assert_eq!(got, Some(EthernetAddress([0x52, 0x54, 0, 0, 0xd, 2])));
    // Bad input changes nothing and names the field.
    let err = |r: Result<(), DataplaneError>| match r {
        Err(DataplaneError::Config { field, .. }) => field,
        other => panic!("expected a configuration error, got {other:?}"),
    };
    assert_eq!(err(e.sh.set_ce_mac("nobody", CE_MAC)), "attachment");
    assert_eq!(err(e.sh.set_ce_mac("dc", [0xff; 6])), "mac");
    let mut local = attachment("lo", 102);
    local.port = AttachmentPort::Interface("lo".into());
    assert_eq!(
        err(e.sh.set_attachments(vec![attachment("dc", 100), local])),
        "attachments[1].port"
    );
    let mut twice = attachment("dc3", 100);
    twice.routes = vec![(ip("10.98.0.0"), 24)];
    assert_eq!(
        err(e.sh.set_attachments(vec![attachment("dc", 100), twice])),
        "attachments[1].tags"
    );
    assert_eq!(e.sh.tables.load().attach.table.list.len(), 2, "unchanged");
    // Removed: its frames are no attachment's.
    e.sh.set_attachments(Vec::new()).expect("none");
    ce_resolves_gateway(&mut e);
    assert_eq!(e.drops(DropReason::AttachUnknownPort), 1);
}

#[test]
fn a_flapping_ce_mac_is_reported_at_most_once_a_second_and_the_last_one_at_the_end() {
    let mut e = env_attached();
    let other = [0x52, 0x54, 0, 0, 0xc, 2];
    let reports = |e: &Env| {
        e.rx.try_iter()
            .filter_map(|m| match m {
                ToControl::CeLearned { mac, .. } => Some(mac),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    // 200 frames from the CE's address, the source MAC alternating.
    for i in 0..200 {
        let mac = if i % 2 == 0 { CE_MAC } else { other };
        let req = arp(ArpOperation::REQUEST, mac, "10.99.0.2", [0; 6], "10.99.0.1");
        e.recv(STEER, from_mac(mac, PORT, 100, [0xff; 6], 0x0806, &req));
    }
    e.sent();
    assert_eq!(reports(&e).len(), 1, "one report within the second");
    // A second later the housekeeping reports the MAC known last.
    let t = e.sh.tables.load();
    let later = Instant::now() + Duration::from_millis(1100);
    crate::pipeline::attach::report_ces(&e.sh, &t, later);
    assert_eq!(reports(&e), vec![other]);
    // Nothing new: nothing more.
    crate::pipeline::attach::report_ces(&e.sh, &t, later + Duration::from_secs(2));
    assert!(reports(&e).is_empty());
    // A MAC the control plane passes on is not reported back.
    e.sh.set_ce_mac("dc", [0x52, 0x54, 0, 0, 0xc, 3])
        .expect("set");
    crate::pipeline::attach::report_ces(&e.sh, &t, later + Duration::from_secs(4));
    assert!(reports(&e).is_empty());
}
