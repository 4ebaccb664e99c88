//! The steer node and the data node must give the same answer for a packet: a VXLAN frame from
//! a host is steered to the data node of a CHILD_SA exactly when that CHILD_SA's negotiated
//! selectors carry the packet on the data node. A property test feeds the same inner packets
//! (both IP versions; ports, ICMP type/code, no ports; first and later fragments; IPv6
//! extension headers; truncated upper-layer headers) and the same selectors (any, ranges,
//! OPAQUE, reversed, protocols) to [`super::vxlan`] and to `dataplane::carries_outbound`.

use std::net::IpAddr;

use proptest::prelude::*;
use steer::{NodeId, Selector, SelectorEntry, TunnelId};
use wire::ike::TrafficSelector;
use wire::vxlan::Vni;

use super::*;
use crate::tables::VniSteering;

const VNI: u32 = 77;

/// Addresses in a small space so that selectors and packets meet often.
fn v4(i: u32) -> IpAddr {
    IpAddr::V4((0x0a00_0000 + i).into())
}

fn v6(i: u32) -> IpAddr {
    IpAddr::V6(((0xfd00_u128 << 112) + u128::from(i)).into())
}

fn arb_ts() -> impl Strategy<Value = TrafficSelector> {
    let ports = prop_oneof![
        3 => Just((0u16, 65535u16)),
        3 => (0u16..6, 0u16..3).prop_map(|(p, w)| (p, p + w)),
        1 => Just((65535, 0)),
        1 => (1u16..6).prop_map(|p| (p, p - 1)),
        1 => Just((0x8000, 0x80ff)), // ICMP echo request, any code
    ];
    (
        any::<bool>(),
        0u32..12,
        0u32..6,
        prop_oneof![Just(0u8), Just(1), Just(6), Just(17), Just(58), Just(47)],
        ports,
    )
        .prop_map(|(six, a, w, ip_proto, (start_port, end_port))| {
            let addr = if six { v6 } else { v4 };
            TrafficSelector {
                ip_proto,
                start_port,
                end_port,
                start: addr(a),
                end: addr(a + w),
            }
        })
}

/// What follows the IP header: the upper-layer protocol and its header bytes.
#[derive(Debug, Clone)]
struct Upper {
    proto: u8,
    header: Vec<u8>,
}

fn arb_upper() -> impl Strategy<Value = Upper> {
    let ports = (0u16..8, 0u16..8).prop_map(|(s, d)| {
        let mut h = vec![0u8; 8];
        h[..2].copy_from_slice(&s.to_be_bytes());
        h[2..4].copy_from_slice(&d.to_be_bytes());
        h
    });
    prop_oneof![
        (prop_oneof![Just(6u8), Just(17), Just(132)], ports.clone())
            .prop_map(|(proto, header)| Upper { proto, header }),
        // ICMP/ICMPv6 echo request or reply, with a code (never neighbour discovery).
        (
            any::<bool>(),
            prop_oneof![Just(0u8), Just(8), Just(128), Just(129)],
            0u8..2
        )
            .prop_map(|(v6, t, c)| Upper {
                proto: if v6 { 58 } else { 1 },
                header: vec![t, c, 0, 0, 0, 0, 0, 0],
            }),
        Just(Upper {
            proto: 47,
            header: vec![0; 8],
        }),
        // A truncated header: ports unknown.
        (prop_oneof![Just(6u8), Just(17), Just(1)], 0usize..2).prop_map(|(proto, n)| Upper {
            proto,
            header: vec![0; n],
        }),
    ]
}

/// An inner packet: `later_fragment` hides the upper-layer header (IPv4 offset, or an IPv6
/// fragment header with an offset); `hop_by_hop` puts an IPv6 extension header in front.
fn packet(
    six: bool,
    src: u32,
    dst: u32,
    upper: &Upper,
    later_fragment: bool,
    hop_by_hop: bool,
) -> Vec<u8> {
    if !six {
        let total = 20 + upper.header.len();
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, upper.proto, 0, 0];
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        if later_fragment {
            p[6..8].copy_from_slice(&5u16.to_be_bytes());
        }
        for a in [src, dst] {
            let IpAddr::V4(a) = v4(a) else { unreachable!() };
            p.extend_from_slice(&a.octets());
        }
        p.extend_from_slice(&upper.header);
        return p;
    }
    let mut rest = Vec::new();
    let mut next = upper.proto;
    if later_fragment {
        rest.extend_from_slice(&[next, 0, 0, 5 << 3, 0, 0, 0, 1]);
        next = 44;
    }
    if hop_by_hop {
        let mut h = vec![next, 0, 0, 0, 0, 0, 0, 0];
        h.extend_from_slice(&rest);
        rest = h;
        next = 0;
    }
    rest.extend_from_slice(&upper.header);
    let mut p = vec![0x60, 0, 0, 0, 0, 0, next, 64];
    p[4..6].copy_from_slice(&(rest.len() as u16).to_be_bytes());
    for a in [src, dst] {
        let IpAddr::V6(a) = v6(a) else { unreachable!() };
        p.extend_from_slice(&a.octets());
    }
    p.extend_from_slice(&rest);
    p
}

fn arb_packet() -> impl Strategy<Value = Vec<u8>> {
    (
        any::<bool>(),
        0u32..20,
        0u32..20,
        arb_upper(),
        proptest::bool::weighted(0.2),
        any::<bool>(),
    )
        .prop_map(|(six, s, d, upper, frag, hbh)| packet(six, s, d, &upper, frag, hbh))
}

/// The steer node's answer for one CHILD_SA: is the packet steered to its data node?
fn steered(local: &TrafficSelector, remote: &TrafficSelector, inner: &[u8]) -> bool {
    let Ok(selector) = Selector::from_traffic_selectors(local, remote) else {
        return false;
    };
    let mut t = Tables::default();
    let entry = SelectorEntry {
        selector,
        tunnel: Some(TunnelId(1)),
        node: NodeId(1),
    };
    let steering = VniSteering {
        selectors: vec![entry],
        neighbour_nodes: vec![NodeId(2)],
        gateway_ips: vec![],
    };
    if t.set_vni(Vni::new(VNI).expect("vni"), steering).is_err() {
        return false; // a selector the table refuses steers nothing
    }
    let mut frame = vec![0u8; 8];
    wire::vxlan::VxlanPacket::new_unchecked(&mut frame[..]).set_header(Vni::new(VNI).expect("vni"));
    frame.extend_from_slice(&[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2]);
    frame.extend_from_slice(&if inner[0] >> 4 == 6 {
        [0x86, 0xdd]
    } else {
        [0x08, 0x00]
    });
    frame.extend_from_slice(inner);
    match vxlan(&frame, &t) {
        VxlanAction::Data(_, e) => e.node == NodeId(1),
        VxlanAction::Drop(DropReason::VxlanNoSelector) => false,
        other => panic!("unexpected steering {other:?} for {inner:02x?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn steer_and_data_nodes_agree_on_every_packet(
        pairs in prop::collection::vec((arb_ts(), arb_ts()), 1..6),
        packets in prop::collection::vec(arb_packet(), 1..24),
    ) {
        for inner in &packets {
            for (local, remote) in &pairs {
                let data = dataplane::carries_outbound(
                    inner,
                    std::slice::from_ref(local),
                    std::slice::from_ref(remote),
                );
                prop_assert_eq!(
                    steered(local, remote, inner),
                    data,
                    "local {:?} remote {:?} packet {:02x?}",
                    local,
                    remote,
                    inner
                );
            }
        }
    }
}
