//! The standard Protego test picture, built from a data description:
//!
//! ```text
//!  site (strongSwan, LAN addr on lo) ─┐                         ┌─ host0: vxlan/VNI ─ bridge ─ VMs
//!  site ─ NAT router (nft masquerade) ┼─ WAN ─ gateway ─ underlay ┤
//!  ...                                ┘  (bridge in the       └─ host1: ...
//!                                         switch namespace)
//! ```
//!
//! The gateway namespace has an address on the WAN (the VIP the peers talk IKE
//! and ESP-in-UDP to, RFC 7296 / RFC 3948) and one on the underlay (the source
//! of VXLAN, RFC 7348, toward the cloud hosts). Each cloud host runs one Linux
//! kernel VXLAN device per VNI it hosts (`nolearning`, one static flood entry
//! to the gateway) enslaved to a bridge with the VM namespaces behind it. VMs
//! have only an address and a default route via their VNet's gateway IP.
//! Every address is returned so tests can write configurations.

use std::net::IpAddr;
use std::sync::Mutex;

use crate::bed::Testbed;
use crate::cmd::Cmd;
use crate::error::{Error, Result};
use crate::netns::{Netns, VxlanDevice, VXLAN_PORT};
use crate::prefix::{IfAddr, Prefix};
use crate::strongswan::{ChildConfig, Connection};

/// The WAN (transit) subnet, IPv4 (TEST-NET-2, RFC 5737).
pub const WAN_V4: &str = "198.51.100.0/24";
/// The WAN subnet, IPv6 (documentation range, RFC 3849).
pub const WAN_V6: &str = "2001:db8:100::/64";
/// The underlay subnet between gateway and cloud hosts, IPv4.
pub const UNDERLAY_V4: &str = "10.255.0.0/24";
/// The underlay subnet, IPv6.
pub const UNDERLAY_V6: &str = "fd00:255::/64";
/// IKE identity the standard configurations give the gateway.
pub const GATEWAY_ID: &str = "gw.protego.test";
/// VXLAN encapsulation overhead on an IPv4 underlay (outer IPv4 + UDP + VXLAN + inner Ethernet).
pub const VXLAN_OVERHEAD: u32 = 50;

/// What to build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologySpec {
    /// The tenants, each with its VNet, VMs and on-prem sites.
    pub tenants: Vec<TenantSpec>,
    /// Number of cloud hosts.
    pub hosts: usize,
    /// MTU of the underlay links (VM and VXLAN MTUs are 50 bytes less).
    pub underlay_mtu: u32,
    /// If set, VMs get a permanent neighbour entry mapping their VNet gateway
    /// IP to this MAC (for a gateway that does not answer ARP).
    pub vnet_gateway_mac: Option<String>,
}

/// One tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantSpec {
    /// Short name (`[a-z0-9]`, 1..=8 characters), used in namespace names.
    pub name: String,
    /// The VXLAN network identifier of the tenant's VNet.
    pub vni: u32,
    /// The VNet's IPv4 prefix; host 1 is the VNet gateway IP.
    pub vnet: Prefix,
    /// Optional IPv6 prefix of the VNet; host 1 is the gateway IP.
    pub vnet6: Option<Prefix>,
    /// The VMs.
    pub vms: Vec<VmSpec>,
    /// The on-prem sites.
    pub sites: Vec<SiteSpec>,
}

/// One VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmSpec {
    /// Index of the cloud host it runs on.
    pub host: usize,
}

/// One on-prem site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteSpec {
    /// The site's LAN (IPv4); host 1 is put on the site's loopback.
    pub lan: Prefix,
    /// Optional IPv6 LAN; host 1 goes on loopback.
    pub lan6: Option<Prefix>,
    /// Whether the site sits behind a NAT router.
    pub behind_nat: bool,
}

/// The built topology.
#[derive(Clone, Debug)]
pub struct Topology {
    /// The namespace holding the WAN and underlay bridges.
    pub switch: Netns,
    /// The gateway under test.
    pub gateway: Gateway,
    /// All sites, tenant by tenant.
    pub sites: Vec<Site>,
    /// The cloud hosts.
    pub hosts: Vec<CloudHost>,
    /// The tenants with their VMs.
    pub tenants: Vec<Tenant>,
    /// What was built.
    pub spec: TopologySpec,
}

/// The gateway namespace and its addresses. A cluster with two steer nodes turns it into the
/// ECMP router in front of them ([`crate::router::EcmpRouter`]): the VIP, VIP6 and the
/// underlay address then live on the steer nodes, the namespace routes them there.
#[derive(Clone, Debug)]
pub struct Gateway {
    /// The namespace where the gateway under test runs.
    pub ns: Netns,
    /// WAN interface.
    pub wan_if: String,
    /// WAN address (the VIP peers talk to).
    pub wan: IfAddr,
    /// WAN IPv6 address.
    pub wan6: IfAddr,
    /// Underlay interface.
    pub underlay_if: String,
    /// Underlay address (VXLAN source).
    pub underlay: IfAddr,
    /// Underlay IPv6 address.
    pub underlay6: IfAddr,
}

/// An on-prem site.
#[derive(Clone, Debug)]
pub struct Site {
    /// Index into [`Topology::tenants`].
    pub tenant: usize,
    /// Index among the tenant's sites.
    pub index: usize,
    /// The site's namespace (where its strongSwan runs).
    pub ns: Netns,
    /// The interface toward the WAN (or the NAT router).
    pub wan_if: String,
    /// The site's own outer address (private if behind NAT).
    pub addr: IfAddr,
    /// The site's own outer IPv6 address.
    pub addr6: IfAddr,
    /// The address the gateway sees the site's packets from.
    pub public_addr: IpAddr,
    /// The LAN prefix (traffic selector).
    pub lan: Prefix,
    /// The LAN address on loopback (source for pings and iperf3).
    pub lan_addr: IpAddr,
    /// The IPv6 LAN prefix, if any.
    pub lan6: Option<Prefix>,
    /// The IPv6 LAN address on loopback, if any.
    pub lan6_addr: Option<IpAddr>,
    /// The NAT router in front of the site, if any.
    pub nat: Option<NatRouter>,
}

/// A NAT router between a site and the WAN.
#[derive(Clone, Debug)]
pub struct NatRouter {
    /// Its namespace.
    pub ns: Netns,
    /// Interface toward the WAN.
    pub outside_if: String,
    /// WAN address (the site's public address).
    pub outside: IfAddr,
    /// WAN IPv6 address.
    pub outside6: IfAddr,
    /// Interface toward the site.
    pub inside_if: String,
    /// Inside address (the site's default gateway).
    pub inside: IfAddr,
    /// Inside IPv6 address.
    pub inside6: IfAddr,
}

/// A cloud host.
#[derive(Clone, Debug)]
pub struct CloudHost {
    /// Index of the host.
    pub index: usize,
    /// Its namespace.
    pub ns: Netns,
    /// Underlay interface.
    pub underlay_if: String,
    /// Underlay address (the VTEP address).
    pub underlay: IfAddr,
    /// Underlay IPv6 address.
    pub underlay6: IfAddr,
    /// One VXLAN segment per VNI hosted here.
    pub segments: Vec<HostSegment>,
}

/// A VNI on a cloud host: kernel VXLAN device plus bridge.
#[derive(Clone, Debug)]
pub struct HostSegment {
    /// Index into [`Topology::tenants`].
    pub tenant: usize,
    /// The VNI.
    pub vni: u32,
    /// The kernel VXLAN device.
    pub vxlan_if: String,
    /// The bridge the VXLAN device and the VMs' veths are enslaved to.
    pub bridge: String,
}

/// A tenant as built.
#[derive(Clone, Debug)]
pub struct Tenant {
    /// Its name.
    pub name: String,
    /// Its VNI.
    pub vni: u32,
    /// Its VNet prefix.
    pub vnet: Prefix,
    /// The VNet gateway IP (default route of the VMs).
    pub gateway_ip: IpAddr,
    /// The IPv6 VNet prefix, if any.
    pub vnet6: Option<Prefix>,
    /// The IPv6 VNet gateway IP, if any.
    pub gateway_ip6: Option<IpAddr>,
    /// Indices into [`Topology::sites`].
    pub sites: Vec<usize>,
    /// Its VMs.
    pub vms: Vec<Vm>,
}

/// A VM (a namespace behind a cloud host's bridge).
#[derive(Clone, Debug)]
pub struct Vm {
    /// Index into [`Topology::tenants`].
    pub tenant: usize,
    /// Index of its cloud host.
    pub host: usize,
    /// Its namespace.
    pub ns: Netns,
    /// Its interface.
    pub ifname: String,
    /// Its address.
    pub addr: IfAddr,
    /// Its IPv6 address, if the VNet has IPv6.
    pub addr6: Option<IfAddr>,
    /// Its MAC address.
    pub mac: String,
}

/// A VNI terminated in the gateway namespace by a kernel VXLAN device (for a
/// kernel-forwarding gateway such as the strongSwan baseline).
#[derive(Clone, Debug)]
pub struct GatewaySegment {
    /// Index into [`Topology::tenants`].
    pub tenant: usize,
    /// The kernel VXLAN device, carrying the VNet gateway IP.
    pub vxlan_if: String,
}

/// A namespace attached to the underlay beside the gateway and the cloud hosts, with no
/// default route (everything it talks to is on the underlay): a node of Protego's distributed
/// form, a store. Made by [`Topology::add_underlay_node`].
#[derive(Clone, Debug)]
pub struct UnderlayNode {
    /// Its namespace.
    pub ns: Netns,
    /// Its underlay interface.
    pub underlay_if: String,
    /// Its underlay address (in [`UNDERLAY_V4`], not used by the gateway, a cloud host or an
    /// earlier underlay node).
    pub underlay: IfAddr,
}

/// Held while an underlay node is attached: its address follows from the number of ports
/// the underlay bridge has, so two attachments must not interleave.
static UNDERLAY_ATTACH: Mutex<()> = Mutex::new(());

/// Host numbers of [`UNDERLAY_V4`] given to underlay nodes, in order of preference (above the
/// cloud hosts' `10 + index` first). 254 is left to the ECMP router in front of two steer
/// nodes ([`crate::router::ROUTER_HOST`]).
fn underlay_node_host_numbers() -> impl Iterator<Item = u128> {
    (50..crate::router::ROUTER_HOST).chain(2..50)
}

impl TopologySpec {
    /// Checks the whole description; the error names the offending field.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: String, reason: &str| {
            Err(Error::InvalidSpec {
                field,
                reason: reason.to_owned(),
            })
        };
        if self.underlay_mtu < 1280 + VXLAN_OVERHEAD || self.underlay_mtu > 9000 {
            return bad("underlay_mtu".into(), "must be within 1330..=9000");
        }
        let mut site_count = 0;
        for (t, tenant) in self.tenants.iter().enumerate() {
            let f = |x: &str| format!("tenants[{t}].{x}");
            if tenant.name.is_empty()
                || tenant.name.len() > 8
                || !tenant
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            {
                return bad(f("name"), "must be 1..=8 characters of [a-z0-9]");
            }
            if self.tenants[..t].iter().any(|o| o.name == tenant.name) {
                return bad(f("name"), "duplicate tenant name");
            }
            if tenant.vni == 0 || tenant.vni >= 1 << 24 {
                return bad(f("vni"), "must be within 1..2^24");
            }
            if self.tenants[..t].iter().any(|o| o.vni == tenant.vni) {
                return bad(f("vni"), "duplicate VNI");
            }
            if !tenant.vnet.is_ipv4() || tenant.vnet.prefix_len() > 28 {
                return bad(f("vnet"), "must be an IPv4 prefix of length <= 28");
            }
            if tenant.vms.len() > 200 {
                return bad(f("vms"), "at most 200 VMs per tenant");
            }
            if let Some(p) = tenant.vnet6 {
                if p.is_ipv4() || p.prefix_len() > 120 {
                    return bad(f("vnet6"), "must be an IPv6 prefix of length <= 120");
                }
            }
            for (v, vm) in tenant.vms.iter().enumerate() {
                if vm.host >= self.hosts {
                    return bad(f(&format!("vms[{v}].host")), "no such cloud host");
                }
            }
            for (s, site) in tenant.sites.iter().enumerate() {
                if !site.lan.is_ipv4() || site.lan.prefix_len() > 30 {
                    return bad(
                        f(&format!("sites[{s}].lan")),
                        "must be an IPv4 prefix of length <= 30",
                    );
                }
                if site
                    .lan6
                    .is_some_and(|p| p.is_ipv4() || p.prefix_len() > 126)
                {
                    return bad(
                        f(&format!("sites[{s}].lan6")),
                        "must be an IPv6 prefix of length <= 126",
                    );
                }
            }
            site_count += tenant.sites.len();
        }
        if site_count > 200 {
            return bad("tenants[].sites".into(), "at most 200 sites in total");
        }
        if self.hosts > 200 {
            return bad("hosts".into(), "at most 200 cloud hosts");
        }
        Ok(())
    }
}

impl Default for TopologySpec {
    fn default() -> Self {
        TopologySpec {
            tenants: Vec::new(),
            hosts: 0,
            underlay_mtu: 1500,
            vnet_gateway_mac: None,
        }
    }
}

fn wan() -> (Prefix, Prefix) {
    (
        WAN_V4.parse().expect("constant prefix"),
        WAN_V6.parse().expect("constant prefix"),
    )
}

fn underlay() -> (Prefix, Prefix) {
    (
        UNDERLAY_V4.parse().expect("constant prefix"),
        UNDERLAY_V6.parse().expect("constant prefix"),
    )
}

impl Topology {
    /// Builds the topology described by `spec` inside `bed`.
    pub fn build(bed: &Testbed, spec: TopologySpec) -> Result<Topology> {
        spec.validate()?;
        let (wan4, wan6) = wan();
        let (ul4, ul6) = underlay();
        let vm_mtu = spec.underlay_mtu - VXLAN_OVERHEAD;

        // The switch: one bridge for the WAN, one for the underlay.
        let switch = bed.netns("sw")?;
        let wan_br = bed.fresh_ifname('b')?;
        let ul_br = bed.fresh_ifname('b')?;
        switch.add_bridge(&wan_br)?;
        switch.add_bridge(&ul_br)?;
        let attach = |ns: &Netns, bridge: &str, mtu: u32| -> Result<String> {
            let pair = ns.veth_to(&switch)?;
            switch.set_master(&pair.peer, bridge)?;
            ns.set_mtu(&pair.local, mtu)?;
            switch.set_mtu(&pair.peer, mtu)?;
            Ok(pair.local)
        };

        // Gateway.
        let gw_ns = bed.netns("gw")?;
        gw_ns.enable_forwarding()?;
        let gw_wan_if = attach(&gw_ns, &wan_br, 1500)?;
        let gw_ul_if = attach(&gw_ns, &ul_br, spec.underlay_mtu)?;
        let gateway = Gateway {
            wan: wan4.if_addr(1)?,
            wan6: wan6.if_addr(1)?,
            underlay: ul4.if_addr(1)?,
            underlay6: ul6.if_addr(1)?,
            ns: gw_ns,
            wan_if: gw_wan_if,
            underlay_if: gw_ul_if,
        };
        for (ifname, a) in [
            (&gateway.wan_if, gateway.wan),
            (&gateway.wan_if, gateway.wan6),
            (&gateway.underlay_if, gateway.underlay),
            (&gateway.underlay_if, gateway.underlay6),
        ] {
            gateway.ns.add_addr(ifname, a)?;
        }

        // Cloud hosts.
        let mut hosts = Vec::with_capacity(spec.hosts);
        for j in 0..spec.hosts {
            let ns = bed.netns(&format!("host{j}"))?;
            let ifname = attach(&ns, &ul_br, spec.underlay_mtu)?;
            let n = 10 + j as u128;
            let host = CloudHost {
                index: j,
                underlay: ul4.if_addr(n)?,
                underlay6: ul6.if_addr(n)?,
                ns,
                underlay_if: ifname,
                segments: Vec::new(),
            };
            host.ns.add_addr(&host.underlay_if, host.underlay)?;
            host.ns.add_addr(&host.underlay_if, host.underlay6)?;
            // A veth hands CHECKSUM_PARTIAL packets to the peer namespace with the checksum
            // still unfilled; a physical NIC would fill it on transmit. Without this, a
            // userspace VTEP (Protego) receives VXLAN whose inner TCP/UDP checksums were never
            // computed. Make the host's underlay behave like a real NIC.
            host.ns
                .exec(Cmd::new("ethtool").args(["-K", &host.underlay_if, "tx", "off"]))?;
            hosts.push(host);
        }

        // Tenants: segments on the hosts, VMs, sites.
        let mut tenants = Vec::with_capacity(spec.tenants.len());
        let mut sites = Vec::new();
        for (t, ts) in spec.tenants.iter().enumerate() {
            let gateway_ip = ts.vnet.host(1)?;
            let gateway_ip6 = ts.vnet6.map(|p| p.host(1)).transpose()?;
            let mut vms = Vec::with_capacity(ts.vms.len());
            for (v, vs) in ts.vms.iter().enumerate() {
                let host = &mut hosts[vs.host];
                let seg = match host.segments.iter().position(|s| s.tenant == t) {
                    Some(i) => i,
                    None => {
                        let seg = add_host_segment(host, t, ts.vni, gateway.underlay.addr, vm_mtu)?;
                        host.segments.push(seg);
                        host.segments.len() - 1
                    }
                };
                let bridge = host.segments[seg].bridge.clone();
                let ns = bed.netns(&format!("vm-{}-{v}", ts.name))?;
                let pair = ns.veth_to(&host.ns)?;
                host.ns.set_master(&pair.peer, &bridge)?;
                host.ns.set_mtu(&pair.peer, vm_mtu)?;
                ns.set_mtu(&pair.local, vm_mtu)?;
                let n = 10 + v as u128;
                let addr = ts.vnet.if_addr(n)?;
                ns.add_addr(&pair.local, addr)?;
                ns.add_default_route(gateway_ip)?;
                let addr6 = match ts.vnet6 {
                    Some(p) => {
                        let a = p.if_addr(n)?;
                        ns.add_addr(&pair.local, a)?;
                        if let Some(g6) = gateway_ip6 {
                            ns.add_default_route(g6)?;
                        }
                        Some(a)
                    }
                    None => None,
                };
                if let Some(mac) = &spec.vnet_gateway_mac {
                    ns.add_neigh(gateway_ip, mac, &pair.local)?;
                    if let Some(g6) = gateway_ip6 {
                        ns.add_neigh(g6, mac, &pair.local)?;
                    }
                }
                let mac = ns.mac(&pair.local)?;
                vms.push(Vm {
                    tenant: t,
                    host: vs.host,
                    ns,
                    ifname: pair.local,
                    addr,
                    addr6,
                    mac,
                });
            }

            let mut site_idx = Vec::with_capacity(ts.sites.len());
            for (s, ss) in ts.sites.iter().enumerate() {
                let k = sites.len();
                let site = build_site(bed, &attach, &wan_br, ts, t, s, k, ss)?;
                site_idx.push(k);
                sites.push(site);
            }
            tenants.push(Tenant {
                name: ts.name.clone(),
                vni: ts.vni,
                vnet: ts.vnet,
                gateway_ip,
                vnet6: ts.vnet6,
                gateway_ip6,
                sites: site_idx,
                vms,
            });
        }

        Ok(Topology {
            switch,
            gateway,
            sites,
            hosts,
            tenants,
            spec,
        })
    }

    /// Sets the cloud hosts up for self-dispatch (docs/configuration.md, `[cluster.dispatch]`):
    /// every VXLAN device learns source MACs and floods to each of `vteps` (the data nodes'
    /// VTEPs) instead of the gateway's address: the virtual MACs' owners teach each host
    /// where to send, with no dispatcher on the way.
    pub fn flood_to_data_nodes(&self, vteps: &[IpAddr]) -> Result<()> {
        let gateway = self.gateway.underlay.addr.to_string();
        for host in &self.hosts {
            for seg in &host.segments {
                host.ns.ip([
                    "link",
                    "set",
                    "dev",
                    &seg.vxlan_if,
                    "type",
                    "vxlan",
                    "learning",
                ])?;
                host.ns.exec(Cmd::new("bridge").args([
                    "fdb",
                    "del",
                    "00:00:00:00:00:00",
                    "dev",
                    seg.vxlan_if.as_str(),
                    "dst",
                    gateway.as_str(),
                ]))?;
                for v in vteps {
                    host.ns.fdb_append(&seg.vxlan_if, "00:00:00:00:00:00", *v)?;
                }
            }
        }
        Ok(())
    }

    /// Terminates every tenant's VNI in the gateway namespace with a kernel
    /// VXLAN device carrying the VNet gateway IP(s), with flood entries to every
    /// host that runs one of the tenant's VMs (MAC learning on). This is what a
    /// kernel-forwarding gateway (the strongSwan baseline) needs; Protego
    /// speaks VXLAN itself and must not get these devices.
    pub fn attach_kernel_vxlan_gateway(&self) -> Result<Vec<GatewaySegment>> {
        let gw = &self.gateway;
        let mtu = self.spec.underlay_mtu - VXLAN_OVERHEAD;
        let mut out = Vec::with_capacity(self.tenants.len());
        for (t, tenant) in self.tenants.iter().enumerate() {
            let name = gw.ns.fresh_ifname('x')?;
            gw.ns.add_vxlan(&VxlanDevice {
                name: name.clone(),
                vni: tenant.vni,
                local: gw.underlay.addr,
                dev: Some(gw.underlay_if.clone()),
                dst_port: VXLAN_PORT,
                learning: true,
                mtu: Some(mtu),
            })?;
            for host in self
                .hosts
                .iter()
                .filter(|h| h.segments.iter().any(|s| s.tenant == t))
            {
                gw.ns
                    .fdb_append(&name, "00:00:00:00:00:00", host.underlay.addr)?;
            }
            gw.ns.add_addr(
                &name,
                IfAddr::new(tenant.gateway_ip, tenant.vnet.prefix_len())?,
            )?;
            if let (Some(g6), Some(p6)) = (tenant.gateway_ip6, tenant.vnet6) {
                gw.ns.add_addr(&name, IfAddr::new(g6, p6.prefix_len())?)?;
            }
            out.push(GatewaySegment {
                tenant: t,
                vxlan_if: name,
            });
        }
        Ok(out)
    }

    /// The IKE identity of a site in the standard configurations.
    pub fn site_id(&self, site: usize) -> String {
        let s = &self.sites[site];
        format!(
            "site{}.{}.protego.test",
            s.index, self.tenants[s.tenant].name
        )
    }

    /// The standard pair of strongSwan connections for `site`: the site's
    /// (initiator) and the gateway's (responder, `remote_addrs = %any`), named
    /// `<tenant>-site<i>` with one child `net` between the site's LAN(s) and
    /// the tenant's VNet(s), PSK `psk`, default proposals, `encap = yes`.
    pub fn site_connections(&self, site: usize, psk: &str) -> (Connection, Connection) {
        let s = &self.sites[site];
        let t = &self.tenants[s.tenant];
        let name = format!("{}-site{}", t.name, s.index);
        let mut local_ts = vec![s.lan.to_string()];
        local_ts.extend(s.lan6.map(|p| p.to_string()));
        let mut remote_ts = vec![t.vnet.to_string()];
        remote_ts.extend(t.vnet6.map(|p| p.to_string()));
        let lts: Vec<&str> = local_ts.iter().map(String::as_str).collect();
        let rts: Vec<&str> = remote_ts.iter().map(String::as_str).collect();
        let site_conn = Connection::site_to_site(
            &name,
            &s.addr.addr.to_string(),
            &self.gateway.wan.addr.to_string(),
            &self.site_id(site),
            GATEWAY_ID,
            psk,
            ChildConfig::new("net", &lts, &rts),
        );
        let gw_conn = site_conn.mirrored(&[&self.gateway.wan.addr.to_string()], &["%any"]);
        (site_conn, gw_conn)
    }

    /// Every VM of every tenant.
    pub fn vms(&self) -> impl Iterator<Item = &Vm> {
        self.tenants.iter().flat_map(|t| t.vms.iter())
    }

    /// Attaches a new namespace `label` (a [`Testbed::netns`] role) to the underlay bridge the
    /// way the cloud hosts are attached (veth into the switch namespace, the underlay MTU, TX
    /// checksum offload off so that it behaves like a real NIC) and gives it a fresh IPv4
    /// underlay address: the first of `10.255.0.50..=253`, then `10.255.0.2..=49`, that the
    /// gateway, the cloud hosts and the underlay nodes attached before do not use. No default
    /// route is set.
    pub fn add_underlay_node(&self, bed: &Testbed, label: &str) -> Result<UnderlayNode> {
        let _serial = UNDERLAY_ATTACH.lock().unwrap_or_else(|e| e.into_inner());
        let bridge = self.switch_bridge_of(&self.gateway.ns, &self.gateway.underlay_if)?;
        // The bridge's ports: the gateway, the cloud hosts, then one per underlay node.
        let out = self
            .switch
            .ip(["-j", "link", "show", "master", bridge.as_str()])?;
        let ports = if out.trim().is_empty() {
            0
        } else {
            parse_ip_json(&out)?.as_array().map_or(0, Vec::len)
        };
        let earlier = ports.saturating_sub(1 + self.hosts.len());
        let (ul4, _) = underlay();
        let taken: Vec<IpAddr> = std::iter::once(self.gateway.underlay.addr)
            .chain(self.hosts.iter().map(|h| h.underlay.addr))
            .collect();
        let mut free = Vec::new();
        for n in underlay_node_host_numbers() {
            let a = ul4.if_addr(n)?;
            if !taken.contains(&a.addr) {
                free.push(a);
            }
        }
        let underlay = *free.get(earlier).ok_or_else(|| Error::InvalidSpec {
            field: format!("underlay node {label}"),
            reason: format!(
                "no free address left in {UNDERLAY_V4} ({earlier} underlay nodes attached)"
            ),
        })?;
        let ns = bed.netns(label)?;
        let pair = ns.veth_to(&self.switch)?;
        self.switch.set_master(&pair.peer, &bridge)?;
        ns.set_mtu(&pair.local, self.spec.underlay_mtu)?;
        self.switch.set_mtu(&pair.peer, self.spec.underlay_mtu)?;
        ns.add_addr(&pair.local, underlay)?;
        // As for the cloud hosts: fill checksums on transmit like a physical NIC would.
        ns.exec(Cmd::new("ethtool").args(["-K", &pair.local, "tx", "off"]))?;
        Ok(UnderlayNode {
            ns,
            underlay_if: pair.local,
            underlay,
        })
    }

    /// Waits (at most `timeout` per VM) until every VM of the tenant of `site` answers one ping
    /// from the site's LAN address: a tunnel just set up may still be resolving neighbours on
    /// the way (the first packet to a VM waits for its ARP answer), which callers measuring
    /// something else do not want to count.
    pub fn wait_vms_answer(&self, site: usize, timeout: std::time::Duration) -> Result<()> {
        let s = &self.sites[site];
        for vm in &self.tenants[s.tenant].vms {
            crate::wait::wait_for(
                &format!("a first reply from vm {}", vm.addr),
                timeout,
                || {
                    let ping = crate::traffic::ping(
                        &s.ns,
                        vm.addr.addr,
                        &crate::traffic::PingOptions::new(1, std::time::Duration::from_millis(10))
                            .from(s.lan_addr),
                    )?;
                    Ok(if ping.all_received() {
                        crate::wait::Probe::Ready(())
                    } else {
                        crate::wait::Probe::NotYet(format!("{ping:?}"))
                    })
                },
            )?;
        }
        Ok(())
    }

    /// With `on`, makes the gateway's two links deliver what the gateway sends in kernel
    /// threads of their own: the switch-side ends of its WAN and underlay veths get NAPI
    /// (`gro on`) in threaded mode; without, back to the default. A veth otherwise runs the
    /// receiving side's whole path (the bridge, the host's VXLAN decapsulation, the site's
    /// socket delivery) in the softirq of the sending system call, and so bills it to the
    /// sender; behind a real NIC that work happens on other machines. What is sent to the
    /// gateway is unchanged: its receive path up to the gateway's socket still runs in the
    /// sender's context (billed to the sender, not to the gateway). Benchmarks use it to take
    /// the receivers' work out of a gateway's CPU.
    pub fn set_gateway_links_threaded(&self, on: bool) -> Result<()> {
        for ifname in [&self.gateway.wan_if, &self.gateway.underlay_if] {
            let peer = self.switch_peer_of(&self.gateway.ns, ifname)?;
            let name = peer["ifname"].as_str().unwrap_or_default().to_owned();
            let threaded = |v: u8| {
                self.switch.exec(Cmd::new("sh").args([
                    "-c".to_owned(),
                    format!("echo {v} > /sys/class/net/{name}/threaded"),
                ]))
            };
            // NAPI exists while GRO is on: it is made threaded after GRO is switched on,
            // and back before GRO is switched off. A veth takes a UDP datagram from a sender
            // with segmentation offloads through NAPI only if the receiving end forwards UDP
            // GRO (else it goes to the backlog, in the sender's softirq again).
            if on {
                self.switch.exec(Cmd::new("ethtool").args([
                    "-K",
                    &name,
                    "gro",
                    "on",
                    "rx-udp-gro-forwarding",
                    "on",
                ]))?;
                threaded(1)?;
            } else {
                let now = self
                    .switch
                    .exec(Cmd::new("cat").args([format!("/sys/class/net/{name}/threaded")]))?;
                // Only what `on` changed is put back (a kernel or ethtool without these
                // features then never needs them).
                if now.trim() == "1" {
                    threaded(0)?;
                    self.switch.exec(Cmd::new("ethtool").args([
                        "-K",
                        &name,
                        "gro",
                        "off",
                        "rx-udp-gro-forwarding",
                        "off",
                    ]))?;
                }
            }
        }
        Ok(())
    }

    /// The switch namespace's `ip -j link` entry of the peer of `ns`'s veth `ifname`.
    fn switch_peer_of(&self, ns: &Netns, ifname: &str) -> Result<serde_json::Value> {
        let own = parse_ip_json(&ns.ip(["-j", "link", "show", "dev", ifname])?)?;
        let peer_index = own[0]["link_index"].as_u64().ok_or_else(|| Error::Parse {
            what: "ip -j link output",
            detail: format!("{ifname} in {} has no peer (link_index)", ns.name()),
            input: own.to_string().chars().take(400).collect(),
        })?;
        let links = parse_ip_json(&self.switch.ip(["-j", "link", "show"])?)?;
        links
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["ifindex"].as_u64() == Some(peer_index))
            .cloned()
            .ok_or_else(|| Error::Parse {
                what: "ip -j link output",
                detail: format!(
                    "no link in {} is the peer (ifindex {peer_index}) of {ifname}",
                    self.switch.name()
                ),
                input: links.to_string().chars().take(400).collect(),
            })
    }

    /// The bridge in the switch namespace that holds the peer of `ns`'s veth `ifname`.
    fn switch_bridge_of(&self, ns: &Netns, ifname: &str) -> Result<String> {
        let peer = self.switch_peer_of(ns, ifname)?;
        peer["master"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| Error::Parse {
                what: "ip -j link output",
                detail: format!(
                    "the peer of {ifname} in {} is in no bridge",
                    self.switch.name()
                ),
                input: peer.to_string().chars().take(400).collect(),
            })
    }
}

/// Parses the JSON output of `ip -j`.
fn parse_ip_json(out: &str) -> Result<serde_json::Value> {
    serde_json::from_str(out).map_err(|e| Error::Parse {
        what: "ip -j output",
        detail: e.to_string(),
        input: out.chars().take(400).collect(),
    })
}

fn add_host_segment(
    host: &CloudHost,
    tenant: usize,
    vni: u32,
    gateway_underlay: IpAddr,
    mtu: u32,
) -> Result<HostSegment> {
    let vxlan_if = host.ns.fresh_ifname('x')?;
    host.ns.add_vxlan(&VxlanDevice {
        name: vxlan_if.clone(),
        vni,
        local: host.underlay.addr,
        dev: Some(host.underlay_if.clone()),
        dst_port: VXLAN_PORT,
        learning: false,
        mtu: Some(mtu),
    })?;
    // Unknown unicast and broadcast (ARP) go to the gateway.
    host.ns
        .fdb_append(&vxlan_if, "00:00:00:00:00:00", gateway_underlay)?;
    let bridge = host.ns.fresh_ifname('b')?;
    host.ns.add_bridge(&bridge)?;
    host.ns.set_mtu(&bridge, mtu)?;
    host.ns.set_master(&vxlan_if, &bridge)?;
    Ok(HostSegment {
        tenant,
        vni,
        vxlan_if,
        bridge,
    })
}

#[allow(clippy::too_many_arguments)]
fn build_site(
    bed: &Testbed,
    attach: &dyn Fn(&Netns, &str, u32) -> Result<String>,
    wan_br: &str,
    ts: &TenantSpec,
    tenant: usize,
    index: usize,
    k: usize,
    ss: &SiteSpec,
) -> Result<Site> {
    let (wan4, wan6) = wan();
    let n = 10 + k as u128;
    let ns = bed.netns(&format!("site-{}-{index}", ts.name))?;
    let lan_addr = ss.lan.host(1)?;
    ns.add_addr("lo", IfAddr::new(lan_addr, ss.lan.prefix_len())?)?;
    let lan6_addr = match ss.lan6 {
        Some(p) => {
            let a = p.host(1)?;
            ns.add_addr("lo", IfAddr::new(a, p.prefix_len())?)?;
            Some(a)
        }
        None => None,
    };
    let (wan_if, addr, addr6, public_addr, nat) = if ss.behind_nat {
        let router = bed.netns(&format!("nat-{}-{index}", ts.name))?;
        router.enable_forwarding()?;
        let outside_if = attach(&router, wan_br, 1500)?;
        let outside = wan4.if_addr(n)?;
        let outside6 = wan6.if_addr(n)?;
        router.add_addr(&outside_if, outside)?;
        router.add_addr(&outside_if, outside6)?;
        let pair = router.veth_to(&ns)?;
        let k8 = k as u128;
        let inside_net: Prefix = format!("192.168.{k8}.0/24").parse()?;
        let inside_net6: Prefix = format!("fd00:168:{k8:x}::/64").parse()?;
        let inside = inside_net.if_addr(1)?;
        let inside6 = inside_net6.if_addr(1)?;
        router.add_addr(&pair.local, inside)?;
        router.add_addr(&pair.local, inside6)?;
        router.add_masquerade(&outside_if)?;
        let addr = inside_net.if_addr(2)?;
        let addr6 = inside_net6.if_addr(2)?;
        ns.add_addr(&pair.peer, addr)?;
        ns.add_addr(&pair.peer, addr6)?;
        ns.add_default_route(inside.addr)?;
        ns.add_default_route(inside6.addr)?;
        let nat = NatRouter {
            ns: router,
            outside_if,
            outside,
            outside6,
            inside_if: pair.local,
            inside,
            inside6,
        };
        (pair.peer, addr, addr6, outside.addr, Some(nat))
    } else {
        let wan_if = attach(&ns, wan_br, 1500)?;
        let addr = wan4.if_addr(n)?;
        let addr6 = wan6.if_addr(n)?;
        ns.add_addr(&wan_if, addr)?;
        ns.add_addr(&wan_if, addr6)?;
        (wan_if, addr, addr6, addr.addr, None)
    };
    Ok(Site {
        tenant,
        index,
        ns,
        wan_if,
        addr,
        addr6,
        public_addr,
        lan: ss.lan,
        lan_addr,
        lan6: ss.lan6,
        lan6_addr,
        nat,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TopologySpec {
        TopologySpec {
            tenants: vec![TenantSpec {
                name: "acme".into(),
                vni: 100,
                vnet: "10.2.0.0/24".parse().expect("prefix"),
                vnet6: None,
                vms: vec![VmSpec { host: 0 }],
                sites: vec![SiteSpec {
                    lan: "10.1.0.0/24".parse().expect("prefix"),
                    lan6: None,
                    behind_nat: false,
                }],
            }],
            hosts: 1,
            ..TopologySpec::default()
        }
    }

    #[test]
    fn validation_names_the_field() {
        assert!(spec().validate().is_ok());
        let mut s = spec();
        s.tenants[0].vms[0].host = 3;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("tenants[0].vms[0].host"), "{e}");
        let mut s = spec();
        s.tenants[0].name = "Bad".into();
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("tenants[0].name"));
        let mut s = spec();
        s.tenants.push(s.tenants[0].clone());
        s.tenants[1].name = "other".into();
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("tenants[1].vni"));
        let mut s = spec();
        s.underlay_mtu = 100;
        assert!(s.validate().is_err());
    }
}
