//! The gateway as each VNet's router on the VXLAN overlay (RFC 7348): a deterministic,
//! locally administered MAC per VNet, the gateway address answered by ARP (RFC 826) and
//! neighbour discovery (RFC 4861), routes to host VTEPs, and the neighbour cache of VM MACs.

pub(crate) mod arp;
pub(crate) mod nd;
pub(crate) mod neigh;
pub(crate) mod route;
pub(crate) mod vmacs;

use crate::routes::Routes;
use datapath::{DataplaneError, VnetConfig};
use neigh::{Mac, NeighCache};
use overlay::VnetId;
use route::RouteTable;
use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use wire::ethernet::{EtherType, EthernetAddress, EthernetFrame, ETHERNET_HEADER_LEN};
use wire::vxlan::{Vni, VxlanPacket, VXLAN_HEADER_LEN};

/// Bytes before the inner packet in a VXLAN datagram we send: VXLAN header and an untagged
/// Ethernet header.
pub(crate) const FRAME_HEADER_LEN: usize = VXLAN_HEADER_LEN + ETHERNET_HEADER_LEN;

/// The gateway's MAC in a VNet: locally administered, unicast (02:...), fixed per VNI so every
/// node of a cluster presents the same router to the VMs (`02:50:47` then the 24-bit VNI).
pub(crate) fn gateway_mac(vni: Vni) -> EthernetAddress {
    let v = vni.get().to_be_bytes();
    EthernetAddress([0x02, 0x50, 0x47, v[1], v[2], v[3]])
}

/// The IPv6 link-local address of a MAC (RFC 4291 §2.5.1 modified EUI-64, RFC 4862 §5.3).
pub(crate) fn link_local(mac: EthernetAddress) -> Ipv6Addr {
    let m = mac.0;
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 0x02,
        m[1],
        m[2],
        0xff,
        0xfe,
        m[3],
        m[4],
        m[5],
    ])
}

/// Source of [`Vnet::id`].
static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

/// A configured VNet at run time.
pub(crate) struct Vnet {
    /// Index in the configuration.
    pub(crate) index: usize,
    /// Unique among all VNets ever built in this process (a VNet replaced at run time gets a
    /// new one): the key of the workers' neighbour memos, so a memo never outlives its VNet.
    pub(crate) id: usize,
    /// Tenant name (logs).
    pub(crate) tenant: ids::TenantId,
    /// VNet name (logs).
    pub(crate) name: String,
    /// VXLAN network identifier.
    pub(crate) vni: Vni,
    /// The gateway's MAC.
    pub(crate) mac: EthernetAddress,
    /// The gateway's IPv4 address inside the VNet, if the VNet has IPv4.
    pub(crate) gateway_v4: Option<Ipv4Addr>,
    /// The gateway's IPv6 address inside the VNet, if it has one.
    pub(crate) gateway_v6: Option<Ipv6Addr>,
    /// The gateway's IPv6 link-local address (source of ND messages without `gateway_v6`).
    pub(crate) link_local: Ipv6Addr,
    /// Its number in the per-VM route table ([`Routes`]), the same for the life of the process
    /// for the same tenant and name.
    pub(crate) key: VnetId,
    /// Prefix routes to host VTEPs (per-VM entries in [`Routes`] win over them).
    pub(crate) routes: RouteTable,
    /// Every host VTEP of the routes: the only accepted senders.
    pub(crate) hosts: HashSet<IpAddr>,
    /// Index of the local VTEP (socket set) this VNet uses.
    pub(crate) vtep: usize,
    /// The hosts' router MAC (`router_mac`): set, packets into the VNet go to it and no VM's
    /// MAC is resolved (see [`datapath::VnetConfig::router_mac`]).
    pub(crate) router_mac: Option<Mac>,
    neigh: Mutex<NeighCache>,
}

impl Vnet {
    /// Validates one VNet's configuration (`field` names it in errors, e.g. `vnets[2]`);
    /// `key` is its number in the per-VM route table.
    pub(crate) fn new(
        index: usize,
        cfg: &VnetConfig,
        vtep: usize,
        key: VnetId,
    ) -> Result<Self, DataplaneError> {
        let field = |f: &str| format!("vnets[{index}].{f}");
        let vni = Vni::new(cfg.vni).ok_or_else(|| DataplaneError::Config {
            field: field("vni"),
            reason: format!("{} does not fit in 24 bits", cfg.vni),
        })?;
        let routes = RouteTable::new(&cfg.routes).map_err(|(i, e)| DataplaneError::Config {
            field: field(&format!("routes[{i}]")),
            reason: e.to_string(),
        })?;
        for (i, r) in cfg.routes.iter().enumerate() {
            if r.host.is_ipv4() != cfg.vtep.is_ipv4() {
                return Err(DataplaneError::Config {
                    field: field(&format!("routes[{i}].host")),
                    reason: format!(
                        "host {} is not of the VTEP {}'s address family",
                        r.host, cfg.vtep
                    ),
                });
            }
        }
        let (mut gateway_v4, mut gateway_v6) = (None, None);
        for ip in &cfg.gateway_ips {
            let bad = |reason: String| DataplaneError::Config {
                field: field("gateway_ips"),
                reason,
            };
            if ip.is_unspecified() || ip.is_multicast() {
                return Err(bad(format!("{ip} is not a unicast address")));
            }
            let taken = match *ip {
                IpAddr::V4(a) => gateway_v4.replace(a).is_some(),
                IpAddr::V6(a) => gateway_v6.replace(a).is_some(),
            };
            if taken {
                return Err(bad(format!("{ip}: at most one address per IP version")));
            }
        }
        if cfg.gateway_ips.is_empty() {
            return Err(DataplaneError::Config {
                field: field("gateway_ips"),
                reason: "the VNet needs a gateway address".into(),
            });
        }
        if let Some(m) = cfg.router_mac {
            if m[0] & 0x01 != 0 || m == [0; 6] {
                return Err(DataplaneError::Config {
                    field: field("router_mac"),
                    reason: format!("{} is not a unicast MAC address", EthernetAddress(m)),
                });
            }
        }
        let mac = gateway_mac(vni);
        Ok(Self {
            index,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            tenant: cfg.tenant.clone(),
            name: cfg.name.clone(),
            vni,
            mac,
            gateway_v4,
            gateway_v6,
            link_local: link_local(mac),
            hosts: cfg.routes.iter().map(|r| r.host).collect(),
            key,
            routes,
            vtep,
            router_mac: cfg.router_mac,
            neigh: Mutex::new(NeighCache::default()),
        })
    }

    /// True for the gateway's own addresses.
    pub(crate) fn is_gateway(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => self.gateway_v4 == Some(a),
            IpAddr::V6(a) => self.gateway_v6 == Some(a) || a == self.link_local,
        }
    }

    /// The host VTEP `dst` lives behind: its per-VM entry in `r` if it has one, else the
    /// longest prefix route.
    #[inline]
    pub(crate) fn route(&self, r: &Routes, dst: IpAddr) -> Option<IpAddr> {
        r.exact(self.key, dst).or_else(|| self.routes.lookup(dst))
    }

    /// True if `ip` routes to `host` (a frame from `host` may legitimately come from `ip`).
    pub(crate) fn lives_behind(&self, r: &Routes, ip: IpAddr, host: IpAddr) -> bool {
        self.route(r, ip) == Some(host)
    }

    /// True if VXLAN from `host` is accepted in this VNet: a host of its prefix routes or of
    /// its per-VM entries.
    pub(crate) fn accepts_host(&self, r: &Routes, host: IpAddr) -> bool {
        self.hosts.contains(&host) || r.has_host(self.key, host)
    }

    /// The neighbour cache (a poisoned lock still holds a consistent cache).
    pub(crate) fn neigh(&self) -> MutexGuard<'_, NeighCache> {
        self.neigh.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Writes the VXLAN header and an untagged Ethernet header into `buf[..FRAME_HEADER_LEN]`.
pub(crate) fn write_frame_header(
    buf: &mut [u8],
    vni: Vni,
    dst: Mac,
    src: EthernetAddress,
    ethertype: EtherType,
) {
    VxlanPacket::new_unchecked(&mut buf[..VXLAN_HEADER_LEN]).set_header(vni);
    let mut eth = EthernetFrame::new_unchecked(&mut buf[VXLAN_HEADER_LEN..FRAME_HEADER_LEN]);
    eth.set_dst_addr(EthernetAddress(dst));
    eth.set_src_addr(src);
    eth.set_ethertype(ethertype);
}

#[cfg(test)]
mod tests {
    use super::*;
    use datapath::Route;

    pub(crate) fn cfg(vni: u32) -> VnetConfig {
        VnetConfig {
            tenant: ids::TenantId::new("t").expect("tenant"),
            name: "n".into(),
            vni,
            gateway_ips: vec!["10.0.0.1".parse().expect("ip")],
            vtep: "192.0.2.1".parse().expect("ip"),
            routes: vec![Route {
                prefix: "10.0.0.0".parse().expect("ip"),
                len: 24,
                host: "192.0.2.10".parse().expect("ip"),
            }],
            router_mac: None,
        }
    }

    /// A dual-stack VNet has one gateway address per IP version; both (and the link-local
    /// address) are the gateway's, other addresses are not.
    #[test]
    fn dual_stack_gateway_addresses() {
        let mut c = cfg(7);
        c.gateway_ips.push("fd00::1".parse().expect("ip"));
        let v = Vnet::new(0, &c, 0, VnetId(0)).expect("valid");
        assert!(v.is_gateway("10.0.0.1".parse().expect("ip")));
        assert!(v.is_gateway("fd00::1".parse().expect("ip")));
        assert!(v.is_gateway(IpAddr::V6(v.link_local)));
        assert!(!v.is_gateway("10.0.0.2".parse().expect("ip")));
        assert!(!v.is_gateway("fd00::2".parse().expect("ip")));
    }

    #[test]
    fn a_router_mac_must_be_unicast() {
        for bad in [[1, 0, 0x5e, 0, 0, 1], [0; 6]] {
            let mut c = cfg(7);
            c.router_mac = Some(bad);
            match Vnet::new(3, &c, 0, VnetId(0)) {
                Err(DataplaneError::Config { field, .. }) => {
                    assert_eq!(field, "vnets[3].router_mac")
                }
                Err(e) => panic!("{e}"),
                Ok(_) => panic!("{bad:?} accepted"),
            }
        }
        let mut c = cfg(7);
        c.router_mac = Some([2, 0, 0x5e, 0, 1, 0xfe]);
        let v = Vnet::new(0, &c, 0, VnetId(0)).expect("valid");
        assert_eq!(v.router_mac, Some([2, 0, 0x5e, 0, 1, 0xfe]));
    }

    #[test]
    fn gateway_addresses_are_validated() {
        let mut two_v4 = cfg(7);
        two_v4.gateway_ips.push("10.0.0.2".parse().expect("ip"));
        let mut none = cfg(7);
        none.gateway_ips.clear();
        let mut multicast = cfg(7);
        multicast.gateway_ips = vec!["ff02::1".parse().expect("ip")];
        for bad in [two_v4, none, multicast] {
            match Vnet::new(3, &bad, 0, VnetId(0)) {
                Err(DataplaneError::Config { field, .. }) => {
                    assert_eq!(field, "vnets[3].gateway_ips");
                }
                Err(e) => panic!("{:?}: unexpected error {e}", bad.gateway_ips),
                Ok(_) => panic!("{:?} accepted", bad.gateway_ips),
            }
        }
    }

    #[test]
    fn gateway_mac_is_local_unicast_and_per_vni() {
        let a = gateway_mac(Vni::new(0x123456).expect("vni"));
        assert_eq!(a.0, [0x02, 0x50, 0x47, 0x12, 0x34, 0x56]);
        assert!(a.is_local() && a.is_unicast());
        assert_ne!(a, gateway_mac(Vni::new(7).expect("vni")));
    }

    #[test]
    fn link_local_is_modified_eui64() {
        // RFC 4291 appendix A: 34-56-78-9A-BC-DE -> 3656:78ff:fe9a:bcde.
        let ll = link_local(EthernetAddress([0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde]));
        assert_eq!(
            ll,
            "fe80::3656:78ff:fe9a:bcde".parse::<Ipv6Addr>().expect("ip")
        );
    }

    #[test]
    fn config_errors_name_the_field() {
        let mut c = cfg(1 << 24);
        assert!(
            matches!(Vnet::new(3, &c, 0, VnetId(0)), Err(DataplaneError::Config { field, .. }) if field == "vnets[3].vni")
        );
        c.vni = 5;
        c.routes[0].host = "2001:db8::1".parse().expect("ip");
        assert!(
            matches!(Vnet::new(0, &c, 0, VnetId(0)), Err(DataplaneError::Config { field, .. }) if field == "vnets[0].routes[0].host")
        );
        c.routes[0].host = "192.0.2.10".parse().expect("ip");
        c.routes[0].prefix = "10.0.0.1".parse().expect("ip");
        assert!(
            matches!(Vnet::new(0, &c, 0, VnetId(0)), Err(DataplaneError::Config { field, .. }) if field == "vnets[0].routes[0]")
        );
        let v = Vnet::new(0, &cfg(5), 0, VnetId(0)).expect("valid");
        let r = Routes::default();
        assert!(v.lives_behind(
            &r,
            "10.0.0.9".parse().expect("ip"),
            "192.0.2.10".parse().expect("ip")
        ));
        assert!(!v.lives_behind(
            &r,
            "10.0.1.9".parse().expect("ip"),
            "192.0.2.10".parse().expect("ip")
        ));
        assert!(v.is_gateway("10.0.0.1".parse().expect("ip")));
    }
}
