//! The bench's network: three namespaces of one test bed, joined by two veth pairs.
//!
//! ```text
//!  peer (load generator:              gw (gateway under test)            host (load generator:
//!  IKE + ESP-in-UDP, RFC 7296/3948)                                       VXLAN VTEP, RFC 7348)
//!  198.51.100.2 ──────── WAN ──────── 198.51.100.1
//!                                     10.255.0.1 ──── underlay ──── 10.255.0.2  (+ 10.2.0.2)
//! ```
//!
//! The load generator is this process: its sockets are created inside `peer` and `host` and
//! used from its own threads. The gateway namespace forwards IP (for strongSwan, whose
//! decrypted packets the kernel routes, and for the baseline latency path peer -> gw -> host
//! without a gateway in user space). Links have an MTU of 9000 so that no size of the matrix
//! is fragmented after ESP or VXLAN encapsulation.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use testbed::{IfAddr, Netns, Prefix, Testbed};
use wire::ethernet::EthernetAddress;
use wire::vxlan::Vni;

use crate::error::Result;

/// The peer's (load generator's) WAN address.
pub(crate) const PEER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);
/// The gateway's WAN address (IKE and ESP).
pub(crate) const GW_WAN: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// The gateway's underlay address (its VTEP).
pub(crate) const GW_VTEP: Ipv4Addr = Ipv4Addr::new(10, 255, 0, 1);
/// The host's underlay address (the load generator's VTEP).
pub(crate) const HOST_VTEP: Ipv4Addr = Ipv4Addr::new(10, 255, 0, 2);
/// The VNet behind the gateway.
pub(crate) const VNET: &str = "10.2.0.0/24";
/// The gateway's address in the VNet.
pub(crate) const VNET_GW: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 1);
/// The VM the load generator plays (on the host; for strongSwan a plain address there).
pub(crate) const VM: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 2);
/// The VM's MAC.
pub(crate) const VM_MAC: EthernetAddress = EthernetAddress([0x02, 0x00, 0x00, 0xbe, 0x4c, 0x02]);
/// The VNet's VNI.
pub(crate) const VNI: u32 = 100;
/// UDP port of the inner packets (VM side and tunnel side).
pub(crate) const INNER_PORT: u16 = 5001;
/// UDP port the host receives plain inner packets on (strongSwan, which routes instead of
/// using VXLAN).
pub(crate) const PLAIN_PORT: u16 = INNER_PORT;
/// The VXLAN port (RFC 7348 §5).
pub(crate) const VXLAN_PORT: u16 = 4789;
/// Link MTU.
pub(crate) const MTU: u32 = 9000;

/// The VNI as a `wire` value.
pub(crate) fn vni() -> Vni {
    Vni::new(VNI).expect("VNI 100 fits 24 bits")
}

/// The tunnel-side address of tunnel `i`: 10.128.0.1, 10.128.0.2, ... (the tunnel's
/// `remote_ts` at the gateway, `local_ts` at the load generator).
pub(crate) fn tunnel_addr(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + i + 1)
}

/// The three namespaces and their links.
pub(crate) struct BenchNet {
    /// Where the load generator talks IKE and ESP.
    pub(crate) peer: Netns,
    /// Where the gateway under test runs.
    pub(crate) gw: Netns,
    /// Where the load generator plays the cloud host.
    pub(crate) host: Netns,
}

fn v4(addr: Ipv4Addr, len: u8) -> Result<IfAddr> {
    Ok(IfAddr::new(IpAddr::V4(addr), len)?)
}

fn prefix(text: &str) -> Result<Prefix> {
    Ok(text.parse::<Prefix>()?)
}

impl BenchNet {
    /// Builds the namespaces, links, addresses and routes in `bed`.
    pub(crate) fn build(bed: &Testbed) -> Result<BenchNet> {
        let peer = bed.netns("peer")?;
        let gw = bed.netns("gw")?;
        let host = bed.netns("host")?;
        let wan = peer.veth_to(&gw)?;
        let underlay = host.veth_to(&gw)?;
        for (ns, ifname) in [
            (&peer, &wan.local),
            (&gw, &wan.peer),
            (&host, &underlay.local),
            (&gw, &underlay.peer),
        ] {
            ns.set_mtu(ifname, MTU)?;
        }
        for ns in [&peer, &gw, &host] {
            ns.link_up("lo")?;
        }
        peer.add_addr(&wan.local, v4(PEER, 24)?)?;
        gw.add_addr(&wan.peer, v4(GW_WAN, 24)?)?;
        host.add_addr(&underlay.local, v4(HOST_VTEP, 24)?)?;
        gw.add_addr(&underlay.peer, v4(GW_VTEP, 24)?)?;
        // The VM's address, for strongSwan's routed (non-VXLAN) inside.
        host.add_addr(&underlay.local, v4(VM, 32)?)?;
        // strongSwan's kernel-libipsec routes each remote_ts into ipsec0 with a source
        // address from local_ts, which must be local: the VNet gateway address on lo (Protego
        // answers for it inside VXLAN and never uses the kernel's copy).
        gw.add_addr("lo", v4(VNET_GW, 32)?)?;
        gw.enable_forwarding()?;
        gw.add_route(prefix(VNET)?, IpAddr::V4(HOST_VTEP))?;
        peer.add_route(prefix("10.255.0.0/24")?, IpAddr::V4(GW_WAN))?;
        host.add_route(prefix("198.51.100.0/24")?, IpAddr::V4(GW_VTEP))?;
        host.add_route(prefix("10.128.0.0/10")?, IpAddr::V4(GW_VTEP))?;
        Ok(BenchNet { peer, gw, host })
    }

    /// The gateway's NAT-T address (IKE after the float, ESP-in-UDP).
    pub(crate) fn gw_natt() -> SocketAddr {
        SocketAddr::from((GW_WAN, 4500))
    }

    /// The gateway's VTEP.
    pub(crate) fn gw_vtep() -> SocketAddr {
        SocketAddr::from((GW_VTEP, VXLAN_PORT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tunnel_addresses_are_distinct_hosts() {
        assert_eq!(tunnel_addr(0), Ipv4Addr::new(10, 128, 0, 1));
        assert_eq!(tunnel_addr(254), Ipv4Addr::new(10, 128, 0, 255));
        assert_eq!(tunnel_addr(255), Ipv4Addr::new(10, 128, 1, 0));
        assert_eq!(tunnel_addr(999), Ipv4Addr::new(10, 128, 3, 232));
        let p: Prefix = "10.128.0.0/10".parse().expect("prefix");
        assert!(p.contains(IpAddr::V4(tunnel_addr(9999))));
    }
}
