//! Unit tests of the attachment state: tags read from handmade frames (Q-in-Q, one VLAN tag,
//! and what is refused), headers written and read back by `wire`, ARP/ND decisions, the CE's
//! MAC, and which VNet an attachment serves.

use super::*;
use datapath::{Route, VnetConfig};
use std::net::Ipv4Addr;
use wire::ethernet::{EthernetRepr, VlanTags, VlanTci};

const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CE_MAC: EthernetAddress = EthernetAddress([0x52, 0x54, 0, 0, 0, 0x0c]);

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn cfg(name: &str, tenant: &str, tags: AttachmentTags, ce: Option<&str>) -> AttachmentConfig {
    AttachmentConfig {
        name: name.into(),
        tenant: ids::TenantId::new(tenant).expect("tenant"),
        vnet: "net".into(),
        port: datapath::AttachmentPort::Interface("eth1".into()),
        tags,
        gateway_ip: ip("10.99.0.1"),
        ce_ip: ce.map(ip),
        routes: vec![(ip("10.99.0.0"), 24), (ip("192.168.0.0"), 16)],
        ce_mac: None,
    }
}

const QINQ: AttachmentTags = AttachmentTags::QinQ {
    s_tag: 100,
    c_tag: 10,
};

/// A frame: MACs, then `tail` (TPIDs, TCIs, EtherType, payload) as given.
fn frame(tail: &[u8]) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&CE_MAC.0);
    f.extend_from_slice(tail);
    f.resize(f.len().max(60), 0);
    f
}

#[test]
fn qinq_and_single_tags_are_read() {
    // S-tag 100 (PCP 3 set, ignored), C-tag 10, IPv4.
    let f = frame(&[
        0x88, 0xa8, 0x60, 0x64, 0x81, 0x00, 0x00, 0x0a, 0x08, 0x00, 0x45,
    ]);
    let t = read_tags(&f).expect("qinq");
    assert_eq!(t.tags, (100, 10));
    assert_eq!(t.ethertype, EtherType::IPV4);
    assert_eq!(t.payload, 22);
    assert_eq!(t.src, CE_MAC);
    assert!(t.dst.is_broadcast());
    let f = frame(&[0x81, 0x00, 0x0f, 0xfe, 0x08, 0x06]);
    let t = read_tags(&f).expect("vlan");
    assert_eq!(
        (t.tags, t.ethertype, t.payload),
        ((0, 4094), EtherType::ARP, 18)
    );
}

#[test]
fn other_tag_stacks_are_unknown_and_short_frames_malformed() {
    for tail in [
        // Untagged.
        &[0x08, 0x00, 0x45][..],
        // An S-tag alone.
        &[0x88, 0xa8, 0x00, 0x64, 0x08, 0x00],
        // Old-style double 802.1Q.
        &[0x81, 0x00, 0x00, 0x64, 0x81, 0x00, 0x00, 0x0a, 0x08, 0x00],
        // A third tag.
        &[
            0x88, 0xa8, 0x00, 0x64, 0x81, 0x00, 0x00, 0x0a, 0x81, 0x00, 0x00, 0x01, 0x08, 0x00,
        ],
        // VLAN ids 0 (priority tag: no VLAN) and 4095 (reserved), in either position or
        // alone: an S-tag of 0 must not make a Q-in-Q frame a single-tag attachment's.
        &[0x88, 0xa8, 0x00, 0x00, 0x81, 0x00, 0x00, 0x0a, 0x08, 0x00],
        &[0x88, 0xa8, 0x2f, 0xff, 0x81, 0x00, 0x00, 0x0a, 0x08, 0x00],
        &[0x88, 0xa8, 0x00, 0x64, 0x81, 0x00, 0x00, 0x00, 0x08, 0x00],
        &[0x88, 0xa8, 0x00, 0x64, 0x81, 0x00, 0x0f, 0xff, 0x08, 0x00],
        &[0x81, 0x00, 0x60, 0x00, 0x08, 0x00],
        &[0x81, 0x00, 0x0f, 0xff, 0x08, 0x00],
    ] {
        assert_eq!(
            read_tags(&frame(tail)),
            Err(DropReason::AttachUnknownTags),
            "{tail:02x?}"
        );
    }
    let mut short = frame(&[0x88, 0xa8, 0x00, 0x64, 0x81, 0x00]);
    short.truncate(18);
    assert_eq!(read_tags(&short), Err(DropReason::AttachMalformed));
    assert_eq!(read_tags(&[0; 10]), Err(DropReason::AttachMalformed));
}

#[test]
fn written_headers_read_back_with_wire() {
    for (tags, want) in [
        (
            QINQ,
            VlanTags::Double {
                outer: VlanTci::from_bits(100),
                inner: VlanTci::from_bits(10),
            },
        ),
        (
            AttachmentTags::Vlan { c_tag: 7 },
            VlanTags::Single(VlanTci::from_bits(7)),
        ),
    ] {
        let mut buf = [0u8; 64];
        let n = header_len(tags);
        write_header(
            &mut buf,
            tags,
            CE_MAC,
            EthernetAddress(GW_MAC),
            EtherType::IPV6,
        );
        let (repr, off) = EthernetRepr::parse(&buf).expect("parses");
        assert_eq!(off, n);
        assert_eq!(repr.vlans, want);
        assert_eq!(repr.ethertype, EtherType::IPV6);
        assert_eq!(
            (repr.dst_addr, repr.src_addr),
            (CE_MAC, EthernetAddress(GW_MAC))
        );
        // And our own reader agrees (the outer TPID is 0x88a8 for Q-in-Q).
        let t = read_tags(&buf).expect("ours");
        assert_eq!(t.payload, n);
        assert_eq!(tag_key(3, tags), (3, t.tags.0, t.tags.1));
    }
}

fn attachment(ce: Option<&str>) -> Attachment {
    Attachment::new(0, &cfg("a", "t", QINQ, ce), AttachOut::Packet(0), GW_MAC).expect("valid")
}

fn arp_req(sender: [u8; 4], target: [u8; 4]) -> ArpRepr {
    ArpRepr {
        operation: ArpOperation::REQUEST,
        source_hardware_addr: CE_MAC,
        source_protocol_addr: Ipv4Addr::from(sender),
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: Ipv4Addr::from(target),
    }
}

#[test]
fn arp_for_the_gateway_is_answered_and_teaches_the_ce() {
    let a = attachment(None);
    let (reply, learn) = a.arp(&arp_req([10, 99, 0, 2], [10, 99, 0, 1]));
    let r = reply.expect("answered");
    assert_eq!(r.operation, ArpOperation::REPLY);
    assert_eq!(r.source_hardware_addr, EthernetAddress(GW_MAC));
    assert_eq!(r.target_hardware_addr, CE_MAC);
    assert!(learn);
    // For another address: no answer; from outside the routes: nothing learned.
    assert_eq!(a.arp(&arp_req([10, 99, 0, 2], [10, 99, 0, 9])).0, None);
    assert!(!a.arp(&arp_req([172, 16, 0, 2], [10, 99, 0, 1])).1);
    // With ce_ip only the CE's own address teaches its MAC.
    let a = attachment(Some("10.99.0.2"));
    assert!(a.arp(&arp_req([10, 99, 0, 2], [10, 99, 0, 1])).1);
    assert!(!a.arp(&arp_req([10, 99, 0, 3], [10, 99, 0, 1])).1);
}

#[test]
fn ce_mac_is_learned_once_known_and_only_unicast() {
    let a = attachment(None);
    assert_eq!(a.ce_mac(), None);
    a.learn_ce(EthernetAddress::BROADCAST);
    assert_eq!(a.ce_mac(), None);
    a.learn_ce(CE_MAC);
    assert_eq!(a.ce_mac(), Some(CE_MAC));
    let other = EthernetAddress([0x52, 0, 0, 0, 0, 0x0d]);
    a.learn_ce(other);
    assert_eq!(a.ce_mac(), Some(other), "a replaced CE is followed");
}

#[test]
fn requests_for_the_ce_are_spaced() {
    let t0 = Instant::now();
    assert!(
        !attachment(None).request_due(t0),
        "nothing to ask without ce_ip"
    );
    let a = attachment(Some("10.99.0.2"));
    assert!(a.request_due(t0 + Duration::from_millis(1)));
    assert!(!a.request_due(t0 + Duration::from_millis(500)));
    assert!(a.request_due(t0 + Duration::from_millis(1100)));
    match a.request(ip("10.99.0.2")) {
        Request::Arp(r) => {
            assert_eq!(r.target_protocol_addr, Ipv4Addr::new(10, 99, 0, 2));
            assert_eq!(r.source_protocol_addr, Ipv4Addr::new(10, 99, 0, 1));
            assert_eq!(r.source_hardware_addr, EthernetAddress(GW_MAC));
        }
        _ => panic!("an ARP request"),
    }
}

#[test]
fn neighbour_solicitation_for_an_ipv6_gateway() {
    let mut c = cfg("v6", "t", QINQ, None);
    c.gateway_ip = ip("fd99::1");
    c.routes = vec![(ip("fd99::"), 64)];
    let a = Attachment::new(0, &c, AttachOut::Packet(0), GW_MAC).expect("valid");
    let ce: Ipv6Addr = "fd99::2".parse().expect("ip");
    let ns = NdpRepr::NeighborSolicit {
        target_addr: "fd99::1".parse().expect("ip"),
        source_lladdr: Some(CE_MAC),
    };
    let (reply, learn) = a.nd(ce, CE_MAC, &ns);
    assert_eq!(learn, Some(CE_MAC));
    let r = reply.expect("NA");
    assert_eq!((r.dst, r.dst_mac), (ce, CE_MAC.0));
    match r.msg {
        NdpRepr::NeighborAdvert {
            flags,
            target_lladdr,
            ..
        } => {
            assert!(flags.router && flags.solicited);
            assert_eq!(target_lladdr, Some(EthernetAddress(GW_MAC)));
        }
        other => panic!("{other:?}"),
    }
    // An advertisement from the CE teaches; a solicitation for someone else is not answered.
    let na = NdpRepr::NeighborAdvert {
        flags: NaFlags::default(),
        target_addr: ce,
        target_lladdr: Some(CE_MAC),
    };
    assert_eq!(a.nd(ce, CE_MAC, &na), (None, Some(CE_MAC)));
    let other = NdpRepr::NeighborSolicit {
        target_addr: "fd99::9".parse().expect("ip"),
        source_lladdr: Some(CE_MAC),
    };
    assert!(a.nd(ce, CE_MAC, &other).0.is_none());
    // Duplicate address detection for the gateway's address (from ::, no link-layer option):
    // answered to all-nodes, Solicited clear (RFC 4861 §7.2.4), and nothing learned.
    let dad = NdpRepr::NeighborSolicit {
        target_addr: "fd99::1".parse().expect("ip"),
        source_lladdr: None,
    };
    let (reply, learn) = a.nd(Ipv6Addr::UNSPECIFIED, CE_MAC, &dad);
    assert_eq!(learn, None);
    let r = reply.expect("NA to all-nodes");
    let all_nodes: Ipv6Addr = "ff02::1".parse().expect("ip");
    assert_eq!((r.dst, r.dst_mac), (all_nodes, [0x33, 0x33, 0, 0, 0, 1]));
    match r.msg {
        NdpRepr::NeighborAdvert { flags, .. } => assert!(flags.router && !flags.solicited),
        other => panic!("{other:?}"),
    }
}

fn vnet(tenant: &str, name: &str, index: usize) -> Arc<Vnet> {
    let c = VnetConfig {
        tenant: ids::TenantId::new(tenant).expect("tenant"),
        name: name.into(),
        vni: 100 + index as u32,
        gateway_ips: vec![ip("10.0.0.1")],
        vtep: ip("192.0.2.1"),
        routes: vec![Route {
            prefix: ip("10.0.0.0"),
            len: 24,
            host: ip("192.0.2.10"),
        }],
        router_mac: None,
    };
    Arc::new(Vnet::new(index, &c, 0, ::overlay::VnetId(index as u32)).expect("vnet"))
}

#[test]
fn attachments_find_their_own_tenants_vnet_by_name() {
    let cfgs = vec![
        cfg("a", "acme", QINQ, None),
        cfg(
            "b",
            "globex",
            AttachmentTags::QinQ {
                s_tag: 200,
                c_tag: 10,
            },
            None,
        ),
    ];
    let table =
        AttachTable::new(&cfgs, |_, _| Ok(((0, AttachOut::Packet(0)), GW_MAC))).expect("valid");
    assert_eq!(table.find((0, 100, 10)).map(|a| a.index), Some(0));
    assert_eq!(table.find((0, 200, 10)).map(|a| a.index), Some(1));
    assert!(table.find((0, 100, 11)).is_none());
    assert!(table.find((1, 100, 10)).is_none(), "another interface");
    // Both tenants have a VNet called "net", in another order: each finds its own.
    let vnets = vec![vnet("globex", "net", 0), vnet("acme", "net", 1)];
    let table = Arc::new(table);
    let view = AttachTable::view(&table, &vnets);
    assert_eq!(view.vnet, vec![Some(1), Some(0)]);
    let a = view.toward(1, ip("192.168.3.4")).expect("behind acme's CE");
    assert_eq!(a.name, "a");
    assert!(view.toward(1, ip("10.0.0.5")).is_none(), "a VM, not the CE");
    // A VNet list without acme's VNet leaves the attachment without one.
    let view = AttachTable::view(&table, &vnets[..1]);
    assert_eq!(view.vnet, vec![None, Some(0)]);
    // Prefixes are checked as the configuration does.
    let mut host_bits = cfg("h", "acme", QINQ, None);
    host_bits.routes = vec![(ip("10.99.0.1"), 24)];
    assert!(matches!(
        Attachment::new(4, &host_bits, AttachOut::Packet(0), GW_MAC),
        Err(DataplaneError::Config { field, .. }) if field == "attachments[4].routes[0]"
    ));
    // The same tags twice on one interface are refused.
    let twice = vec![cfg("a", "acme", QINQ, None), cfg("b", "globex", QINQ, None)];
    assert!(matches!(
        AttachTable::new(&twice, |_, _| Ok(((0, AttachOut::Packet(0)), GW_MAC))),
        Err(DataplaneError::Config { field, .. }) if field == "attachments[1].tags"
    ));
    // Two attachments of one VNet behind overlapping prefixes are refused (the way to the
    // shared addresses would depend on their order); of two tenants they are fine (above).
    let mut branch = cfg("c", "acme", AttachmentTags::Vlan { c_tag: 30 }, None);
    branch.routes = vec![(ip("10.98.0.0"), 24), (ip("192.168.7.0"), 24)];
    let overlapping = vec![cfg("a", "acme", QINQ, None), branch];
    assert!(matches!(
        AttachTable::new(&overlapping, |_, _| Ok(((0, AttachOut::Packet(0)), GW_MAC))),
        Err(DataplaneError::Config { field, .. }) if field == "attachments[1].routes[1]"
    ));
}

proptest::proptest! {
    /// The per-packet form of the prefixes answers as `IpNet::contains` does, both families,
    /// every prefix length.
    #[test]
    fn behind_agrees_with_ipnet(
        v4 in proptest::collection::vec((proptest::prelude::any::<u32>(), 0u8..=32), 0..4),
        v6 in proptest::collection::vec((proptest::prelude::any::<u128>(), 0u8..=128), 0..4),
        a4 in proptest::prelude::any::<u32>(),
        a6 in proptest::prelude::any::<u128>(),
    ) {
        let mut nets: Vec<IpNet> = Vec::new();
        for (n, l) in v4 {
            nets.push(IpNet::new(IpAddr::V4(n.into()), l).expect("length").trunc());
        }
        for (n, l) in v6 {
            nets.push(IpNet::new(IpAddr::V6(n.into()), l).expect("length").trunc());
        }
        let b = Behind::new(&nets);
        for ip in [IpAddr::V4(a4.into()), IpAddr::V6(a6.into())] {
            proptest::prop_assert_eq!(b.contains(ip), nets.iter().any(|n| n.contains(&ip)));
        }
        // An address inside each prefix is found.
        for n in &nets {
            proptest::prop_assert!(b.contains(n.network()));
        }
    }
}
