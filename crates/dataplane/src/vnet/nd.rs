//! IPv6 neighbour discovery (RFC 4861) for the gateway: answer solicitations for the gateway's
//! addresses (§7.2.4, as a router: R flag), solicit VMs to resolve them (§7.2.2), and decide
//! what received messages teach the neighbour cache (§7.2.3, §7.2.5).

use super::Vnet;
use std::net::{IpAddr, Ipv6Addr};
use wire::ethernet::EthernetAddress;
use wire::ip::{IpProtocol, Ipv6Repr, IPV6_HEADER_LEN};
use wire::ndp::{solicited_node_multicast, NaFlags, NdpRepr, ND_HOP_LIMIT};

/// An ND packet to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NdOut {
    /// IPv6 source.
    pub(crate) src: Ipv6Addr,
    /// IPv6 destination.
    pub(crate) dst: Ipv6Addr,
    /// Ethernet destination.
    pub(crate) dst_mac: [u8; 6],
    /// Ethernet source.
    pub(crate) src_mac: EthernetAddress,
    /// The message.
    pub(crate) msg: NdpRepr,
}

impl NdOut {
    /// Bytes [`emit`](Self::emit) writes.
    pub(crate) fn len(&self) -> usize {
        IPV6_HEADER_LEN + self.msg.buffer_len()
    }

    /// Writes the IPv6 packet; None if `buf` is too small.
    pub(crate) fn emit(&self, buf: &mut [u8]) -> Option<usize> {
        let icmp_len = self.msg.buffer_len();
        let ip = Ipv6Repr {
            src_addr: self.src,
            dst_addr: self.dst,
            next_header: IpProtocol::ICMPV6,
            payload_len: icmp_len,
            hop_limit: ND_HOP_LIMIT,
            traffic_class: 0,
            flow_label: 0,
        };
        let h = ip.emit(buf).ok()?;
        let n = self
            .msg
            .emit(&self.src, &self.dst, buf.get_mut(h..)?)
            .ok()?;
        Some(h + n)
    }
}

/// What to do with a received ND message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NdVerdict {
    /// Send this advertisement.
    pub(crate) reply: Option<NdOut>,
    /// Learn address -> MAC; `create` a new entry.
    pub(crate) learn: Option<(IpAddr, [u8; 6], bool)>,
}

/// Handles a validated ND message from `src` (IPv6 source) in a frame from `frame_src`. A
/// solicitation for the gateway is answered with `answer_with` as the target's link-layer
/// address (None: another node answers it, self-dispatch).
pub(crate) fn handle(
    vnet: &Vnet,
    src: Ipv6Addr,
    frame_src: EthernetAddress,
    msg: &NdpRepr,
    answer_with: Option<EthernetAddress>,
) -> NdVerdict {
    match *msg {
        NdpRepr::NeighborSolicit {
            target_addr,
            source_lladdr,
        } => {
            let for_us = vnet.is_gateway(IpAddr::V6(target_addr));
            let learn = match source_lladdr {
                Some(ll)
                    if !src.is_unspecified()
                        && ll.is_unicast()
                        && !vnet.is_gateway(IpAddr::V6(src)) =>
                {
                    Some((IpAddr::V6(src), ll.0, for_us))
                }
                _ => None,
            };
            let reply = answer_with.filter(|_| for_us).map(|mac| {
                // §7.2.4: to the solicitor, or to all-nodes for a DAD probe (S clear).
                let (dst, dst_mac, solicited) = if src.is_unspecified() {
                    let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
                    (
                        all_nodes,
                        EthernetAddress::from_ipv6_multicast(&all_nodes).0,
                        false,
                    )
                } else {
                    (src, source_lladdr.unwrap_or(frame_src).0, true)
                };
                NdOut {
                    src: target_addr,
                    dst,
                    dst_mac,
                    src_mac: mac,
                    msg: NdpRepr::NeighborAdvert {
                        flags: NaFlags {
                            router: true,
                            solicited,
                            overrides: true,
                        },
                        target_addr,
                        target_lladdr: Some(mac),
                    },
                }
            });
            NdVerdict { reply, learn }
        }
        NdpRepr::NeighborAdvert {
            target_addr,
            target_lladdr,
            ..
        } => {
            let ll = target_lladdr.unwrap_or(frame_src);
            let learn = (!vnet.is_gateway(IpAddr::V6(target_addr)) && ll.is_unicast()).then_some((
                IpAddr::V6(target_addr),
                ll.0,
                false,
            ));
            NdVerdict { reply: None, learn }
        }
    }
}

/// A solicitation from the gateway for `target`, to its solicited-node group (§7.2.2). The
/// source is the gateway address if IPv6, else its link-local address. With self-dispatch it
/// comes from the node's own MAC `node` and that MAC's link-local address: a VM that hears it
/// must not take that MAC for the gateway's.
pub(crate) fn solicit(vnet: &Vnet, target: Ipv6Addr, node: Option<EthernetAddress>) -> NdOut {
    let (src, mac) = match node {
        Some(m) => (super::link_local(m), m),
        None => (vnet.gateway_v6.unwrap_or(vnet.link_local), vnet.mac),
    };
    let dst = solicited_node_multicast(&target);
    NdOut {
        src,
        dst,
        dst_mac: EthernetAddress::from_ipv6_multicast(&dst).0,
        src_mac: mac,
        msg: NdpRepr::NeighborSolicit {
            target_addr: target,
            source_lladdr: Some(mac),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datapath::{Route, VnetConfig};
    use wire::ip::Ipv6Packet;

    fn vnet() -> Vnet {
        let cfg = VnetConfig {
            tenant: ids::TenantId::new("t").expect("tenant"),
            name: "n".into(),
            vni: 100,
            gateway_ips: vec!["2001:db8::1".parse().expect("ip")],
            vtep: "2001:db8:ffff::1".parse().expect("ip"),
            routes: vec![Route {
                prefix: "2001:db8::".parse().expect("ip"),
                len: 64,
                host: "2001:db8:ffff::10".parse().expect("ip"),
            }],
            router_mac: None,
        };
        Vnet::new(0, &cfg, 0, overlay::VnetId(0)).expect("valid")
    }

    const VM: EthernetAddress = EthernetAddress([0x52, 0x54, 0, 0, 0, 5]);

    fn vm_ip() -> Ipv6Addr {
        "2001:db8::5".parse().expect("ip")
    }

    #[test]
    fn solicitation_for_gateway_is_answered_and_round_trips() {
        let v = vnet();
        let ns = NdpRepr::NeighborSolicit {
            target_addr: "2001:db8::1".parse().expect("ip"),
            source_lladdr: Some(VM),
        };
        let verdict = handle(&v, vm_ip(), VM, &ns, Some(v.mac));
        assert_eq!(verdict.learn, Some((IpAddr::V6(vm_ip()), VM.0, true)));
        let reply = verdict.reply.expect("NA");
        assert_eq!((reply.dst, reply.dst_mac), (vm_ip(), VM.0));
        let mut buf = [0u8; 128];
        let n = reply.emit(&mut buf).expect("fits");
        assert_eq!(n, reply.len());
        let p = Ipv6Packet::new_checked(&buf[..n]).expect("ipv6");
        let parsed = NdpRepr::parse(&p.src_addr(), &p.dst_addr(), p.hop_limit(), p.payload())
            .expect("valid NA");
        match parsed {
            NdpRepr::NeighborAdvert {
                flags,
                target_addr,
                target_lladdr,
            } => {
                assert!(flags.router && flags.solicited && flags.overrides);
                assert_eq!(target_addr, "2001:db8::1".parse::<Ipv6Addr>().expect("ip"));
                assert_eq!(target_lladdr, Some(v.mac));
            }
            other => panic!("not an NA: {other:?}"),
        }
    }

    /// In a dual-stack VNet (IPv4 gateway plus IPv6 gateway) the IPv6 gateway address is
    /// answered and is the source of the gateway's own solicitations.
    #[test]
    fn dual_stack_ipv6_gateway_is_answered() {
        let cfg = VnetConfig {
            tenant: ids::TenantId::new("t").expect("tenant"),
            name: "n".into(),
            vni: 100,
            gateway_ips: vec![
                "10.0.0.1".parse().expect("ip"),
                "2001:db8::1".parse().expect("ip"),
            ],
            vtep: "192.0.2.1".parse().expect("ip"),
            routes: vec![],
            router_mac: None,
        };
        let v = Vnet::new(0, &cfg, 0, overlay::VnetId(0)).expect("valid");
        let ns = NdpRepr::NeighborSolicit {
            target_addr: "2001:db8::1".parse().expect("ip"),
            source_lladdr: Some(VM),
        };
        assert!(handle(&v, vm_ip(), VM, &ns, Some(v.mac)).reply.is_some());
        let out = solicit(&v, vm_ip(), None);
        assert_eq!(out.src, "2001:db8::1".parse::<Ipv6Addr>().expect("ip"));
    }

    #[test]
    fn link_local_is_answered_and_dad_goes_to_all_nodes() {
        let v = vnet();
        let ns = NdpRepr::NeighborSolicit {
            target_addr: v.link_local,
            source_lladdr: None,
        };
        let verdict = handle(&v, Ipv6Addr::UNSPECIFIED, VM, &ns, Some(v.mac));
        let reply = verdict.reply.expect("NA");
        assert_eq!(reply.dst, "ff02::1".parse::<Ipv6Addr>().expect("ip"));
        assert_eq!(reply.dst_mac, [0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(verdict.learn, None);
    }

    #[test]
    fn other_targets_and_advertisements() {
        let v = vnet();
        let ns = NdpRepr::NeighborSolicit {
            target_addr: "2001:db8::9".parse().expect("ip"),
            source_lladdr: Some(VM),
        };
        let verdict = handle(&v, vm_ip(), VM, &ns, Some(v.mac));
        assert_eq!(verdict.reply, None);
        assert_eq!(verdict.learn, Some((IpAddr::V6(vm_ip()), VM.0, false)));
        let na = NdpRepr::NeighborAdvert {
            flags: NaFlags::default(),
            target_addr: vm_ip(),
            target_lladdr: None,
        };
        assert_eq!(
            handle(&v, vm_ip(), VM, &na, Some(v.mac)).learn,
            Some((IpAddr::V6(vm_ip()), VM.0, false))
        );
    }

    #[test]
    fn solicitation_we_send_is_valid() {
        let v = vnet();
        let out = solicit(&v, vm_ip(), None);
        let mut buf = [0u8; 128];
        let n = out.emit(&mut buf).expect("fits");
        let p = Ipv6Packet::new_checked(&buf[..n]).expect("ipv6");
        assert_eq!(
            p.dst_addr(),
            "ff02::1:ff00:5".parse::<Ipv6Addr>().expect("ip")
        );
        assert_eq!(out.dst_mac, [0x33, 0x33, 0xff, 0, 0, 5]);
        let parsed = NdpRepr::parse(&p.src_addr(), &p.dst_addr(), p.hop_limit(), p.payload())
            .expect("valid NS");
        assert_eq!(
            parsed,
            NdpRepr::NeighborSolicit {
                target_addr: vm_ip(),
                source_lladdr: Some(v.mac)
            }
        );
    }
}
