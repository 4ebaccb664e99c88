//! ARP (RFC 826) for the gateway address: answer requests for it, build requests to resolve
//! VMs, and decide what a received ARP packet teaches the neighbour cache.

use super::Vnet;
use std::net::{IpAddr, Ipv4Addr};
use wire::arp::{ArpOperation, ArpRepr};
use wire::ethernet::EthernetAddress;

/// What to do with a received ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ArpVerdict {
    /// Send this reply (to the requester's MAC).
    pub(crate) reply: Option<ArpRepr>,
    /// Learn sender address -> MAC; `create` a new entry (when the packet was for us).
    pub(crate) learn: Option<(IpAddr, [u8; 6], bool)>,
}

/// Handles an ARP packet received in `vnet`. RFC 826's merge rule: the sender's entry is
/// updated if known, and created when we are the target. A request for the gateway is
/// answered with `answer_with` (None: another node answers it, self-dispatch).
pub(crate) fn handle(
    vnet: &Vnet,
    arp: &ArpRepr,
    answer_with: Option<EthernetAddress>,
) -> ArpVerdict {
    let gw = vnet.gateway_v4;
    let for_us = gw == Some(arp.target_protocol_addr);
    let sender_ok = !arp.source_protocol_addr.is_unspecified()
        && !arp.source_protocol_addr.is_broadcast()
        && !arp.source_protocol_addr.is_multicast()
        && arp.source_hardware_addr.is_unicast()
        && Some(arp.source_protocol_addr) != gw;
    let learn = sender_ok.then_some((
        IpAddr::V4(arp.source_protocol_addr),
        arp.source_hardware_addr.0,
        for_us,
    ));
    let reply = answer_with
        .filter(|_| {
            for_us
                && arp.operation == ArpOperation::REQUEST
                && arp.source_hardware_addr.is_unicast()
        })
        .map(|mac| arp.reply(mac));
    ArpVerdict { reply, learn }
}

/// A request from the gateway for `target` (broadcast). The sender address is the gateway's if
/// it is IPv4, else 0.0.0.0 (an RFC 5227 probe, which hosts answer as well). With
/// self-dispatch it comes from the node's own MAC `node`, always as a probe: a VM that hears
/// it must not take that MAC for the gateway's.
pub(crate) fn request(vnet: &Vnet, target: Ipv4Addr, node: Option<EthernetAddress>) -> ArpRepr {
    let spa = match node {
        Some(_) => Ipv4Addr::UNSPECIFIED,
        None => vnet.gateway_v4.unwrap_or(Ipv4Addr::UNSPECIFIED),
    };
    ArpRepr {
        operation: ArpOperation::REQUEST,
        source_hardware_addr: node.unwrap_or(vnet.mac),
        source_protocol_addr: spa,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: target,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datapath::{Route, VnetConfig};

    fn vnet() -> Vnet {
        let cfg = VnetConfig {
            tenant: ids::TenantId::new("t").expect("tenant"),
            name: "n".into(),
            vni: 100,
            gateway_ips: vec!["10.0.0.1".parse().expect("ip")],
            vtep: "192.0.2.1".parse().expect("ip"),
            routes: vec![Route {
                prefix: "10.0.0.0".parse().expect("ip"),
                len: 24,
                host: "192.0.2.10".parse().expect("ip"),
            }],
            router_mac: None,
        };
        Vnet::new(0, &cfg, 0, overlay::VnetId(0)).expect("valid")
    }

    const VM_MAC: EthernetAddress = EthernetAddress([0x52, 0x54, 0, 0, 0, 5]);

    fn req(target: [u8; 4]) -> ArpRepr {
        ArpRepr {
            operation: ArpOperation::REQUEST,
            source_hardware_addr: VM_MAC,
            source_protocol_addr: Ipv4Addr::new(10, 0, 0, 5),
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: Ipv4Addr::from(target),
        }
    }

    #[test]
    fn request_for_gateway_is_answered_with_gateway_mac() {
        let v = vnet();
        let verdict = handle(&v, &req([10, 0, 0, 1]), Some(v.mac));
        let reply = verdict.reply.expect("reply");
        assert_eq!(reply.operation, ArpOperation::REPLY);
        assert_eq!(reply.source_hardware_addr, v.mac);
        assert_eq!(reply.source_protocol_addr, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(reply.target_hardware_addr, VM_MAC);
        assert_eq!(reply.target_protocol_addr, Ipv4Addr::new(10, 0, 0, 5));
        assert_eq!(
            verdict.learn,
            Some(("10.0.0.5".parse().expect("ip"), VM_MAC.0, true))
        );
    }

    #[test]
    fn request_for_another_vm_is_not_answered_and_only_updates() {
        let v = vnet();
        let verdict = handle(&v, &req([10, 0, 0, 7]), Some(v.mac));
        assert_eq!(verdict.reply, None);
        assert_eq!(
            verdict.learn,
            Some(("10.0.0.5".parse().expect("ip"), VM_MAC.0, false))
        );
    }

    #[test]
    fn probes_and_spoofs_of_the_gateway_teach_nothing() {
        let v = vnet();
        let mut probe = req([10, 0, 0, 1]);
        probe.source_protocol_addr = Ipv4Addr::UNSPECIFIED;
        let verdict = handle(&v, &probe, Some(v.mac));
        assert!(verdict.reply.is_some(), "RFC 5227 probes are answered");
        assert_eq!(verdict.learn, None);
        let mut spoof = req([10, 0, 0, 9]);
        spoof.source_protocol_addr = Ipv4Addr::new(10, 0, 0, 1);
        assert_eq!(handle(&v, &spoof, Some(v.mac)).learn, None);
        let mut bcast = req([10, 0, 0, 1]);
        bcast.source_hardware_addr = EthernetAddress::BROADCAST;
        assert_eq!(
            handle(&v, &bcast, Some(v.mac)),
            ArpVerdict {
                reply: None,
                learn: None
            }
        );
    }

    #[test]
    fn our_request_names_the_gateway() {
        let v = vnet();
        let r = request(&v, Ipv4Addr::new(10, 0, 0, 5), None);
        assert_eq!(r.operation, ArpOperation::REQUEST);
        assert_eq!(
            (r.source_hardware_addr, r.source_protocol_addr),
            (v.mac, Ipv4Addr::new(10, 0, 0, 1))
        );
        assert_eq!(r.target_protocol_addr, Ipv4Addr::new(10, 0, 0, 5));
        // A dispatched node's request is a probe from its own MAC.
        let node = EthernetAddress([0x02, 0x50, 0x48, 1, 2, 3]);
        let p = request(&v, Ipv4Addr::new(10, 0, 0, 5), Some(node));
        assert_eq!(
            (p.source_hardware_addr, p.source_protocol_addr),
            (node, Ipv4Addr::UNSPECIFIED)
        );
    }

    #[test]
    fn a_request_left_to_another_node_is_learnt_from_but_not_answered() {
        let v = vnet();
        let verdict = handle(&v, &req([10, 0, 0, 1]), None);
        assert_eq!(verdict.reply, None);
        assert_eq!(
            verdict.learn,
            Some(("10.0.0.5".parse().expect("ip"), VM_MAC.0, true))
        );
        let vmac = EthernetAddress([0x02, 0, 0, 100, 0, 7]);
        let reply = handle(&v, &req([10, 0, 0, 1]), Some(vmac))
            .reply
            .expect("reply");
        assert_eq!(reply.source_hardware_addr, vmac);
    }
}
