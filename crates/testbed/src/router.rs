//! An ECMP router in front of several steer nodes, as a real deployment announces one VIP from
//! several hosts (BGP anycast) and lets its router spread the flows:
//!
//! ```text
//!  sites ─ WAN ─┐                                   ┌─ link ─ steer1: VIP, VIP6, VTEP on lo,
//!               ├─ router (the topology's gateway) ─┤          own underlay address (Geneve)
//!  hosts ─ UL ──┘   VIP, VIP6, VTEP: multipath      └─ link ─ steer2: the same
//! ```
//!
//! [`EcmpRouter::build`] turns the topology's gateway namespace into the router: it gives up
//! the VIP (`gateway.wan`), VIP6 (`gateway.wan6`) and the VTEP address (`gateway.underlay`, the
//! address the cloud hosts' VXLAN flood entries point at), takes host number
//! [`ROUTER_HOST`] of the WAN and underlay subnets instead, answers ARP (proxy ARP) and
//! neighbour solicitations (proxy NDP) for them, and routes each of them with one multipath
//! route over a point-to-point link (veth, `100.64.<i>.0/30` and `fd00:64:<i>::/64`) per steer
//! node, hashing flows on their L4 ports (`fib_multipath_hash_policy = 1`), so different
//! peers and different VXLAN source ports spread over the steer nodes. Each steer node's
//! namespace holds the three addresses on `lo` (/32, /128) and does not answer ARP for them
//! on its underlay link (`arp_ignore = 1`), where it has an address of its own for Geneve.
//!
//! [`EcmpRouter::withdraw`] removes a steer node's nexthop from the three routes (what the
//! router does when BGP or BFD notices the steer node is gone), [`EcmpRouter::restore`] puts it
//! back. With every nexthop withdrawn the routes become blackholes.
//!
//! Every namespace and link belongs to the test bed (the steer namespaces are underlay nodes,
//! [`Topology::add_underlay_node`]), so teardown and `sweep` remove them.

use std::net::IpAddr;
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::netns::Netns;
use crate::prefix::{IfAddr, Prefix};
use crate::topology::{Topology, UnderlayNode};

/// Host number the router takes in the WAN and underlay subnets in place of the addresses it
/// hands to the steer nodes (`198.51.100.254`, `2001:db8:100::fe`, `10.255.0.254`).
pub const ROUTER_HOST: u128 = 254;

/// The link between the router and one steer node.
#[derive(Clone, Debug)]
pub struct SteerLink {
    /// The steer node's name (`steer1`).
    pub name: String,
    /// The steer node's namespace.
    pub ns: Netns,
    /// The link's interface in the router namespace.
    pub router_if: String,
    /// The link's interface in the steer node's namespace.
    pub steer_if: String,
    /// The router's address on the link (the steer node's default gateway).
    pub router_addr: IfAddr,
    /// The steer node's address on the link (the router's nexthop).
    pub steer_addr: IfAddr,
    /// The router's IPv6 address on the link.
    pub router_addr6: IfAddr,
    /// The steer node's IPv6 address on the link.
    pub steer_addr6: IfAddr,
}

/// The router in front of the steer nodes (see the module documentation).
#[derive(Debug)]
pub struct EcmpRouter {
    ns: Netns,
    vip: IpAddr,
    vip6: IpAddr,
    vtep: IpAddr,
    links: Vec<SteerLink>,
    /// Per link: its nexthop is withdrawn.
    withdrawn: Mutex<Vec<bool>>,
}

impl EcmpRouter {
    /// Turns `topo`'s gateway namespace into the router and links it to the steer nodes
    /// `steers` (name, underlay node), in order; see the module documentation. Needs at least
    /// one steer node.
    pub fn build(topo: &Topology, steers: &[(String, UnderlayNode)]) -> Result<EcmpRouter> {
        if steers.is_empty() || steers.len() > 250 {
            return Err(Error::InvalidSpec {
                field: "ecmp router steers".to_owned(),
                reason: "needs 1..=250 steer nodes".to_owned(),
            });
        }
        let gw = &topo.gateway;
        let ns = gw.ns.clone();
        let (vip, vip6, vtep) = (gw.wan.addr, gw.wan6.addr, gw.underlay.addr);

        // The router: flows hash on L4 ports; no reverse-path filter (the steer nodes answer
        // from the VIP, which the router routes toward them); proxy ARP and NDP for the
        // addresses that moved behind it, answered at once.
        ns.sysctl("net.ipv4.fib_multipath_hash_policy", "1")?;
        ns.sysctl("net.ipv6.fib_multipath_hash_policy", "1")?;
        ns.sysctl("net.ipv6.conf.all.proxy_ndp", "1")?;
        no_rp_filter(&ns, &[&gw.wan_if, &gw.underlay_if])?;
        for ifname in [&gw.wan_if, &gw.underlay_if] {
            ns.sysctl(&format!("net.ipv4.conf.{ifname}.proxy_arp"), "1")?;
            ns.sysctl(&format!("net.ipv4.neigh.{ifname}.proxy_delay"), "0")?;
            ns.sysctl(&format!("net.ipv6.conf.{ifname}.proxy_ndp"), "1")?;
        }
        // Delete before adding: removing an interface's primary IPv4 address removes the
        // secondaries of its subnet with it.
        for (ifname, a) in [
            (&gw.wan_if, gw.wan),
            (&gw.wan_if, gw.wan6),
            (&gw.underlay_if, gw.underlay),
        ] {
            let text = a.to_string();
            ns.ip(["addr", "del", text.as_str(), "dev", ifname.as_str()])?;
        }
        for (ifname, a) in [
            (&gw.wan_if, gw.wan),
            (&gw.wan_if, gw.wan6),
            (&gw.underlay_if, gw.underlay),
        ] {
            ns.add_addr(ifname, a.prefix().if_addr(ROUTER_HOST)?)?;
        }
        let vip6_text = vip6.to_string();
        ns.ip([
            "-6",
            "neigh",
            "add",
            "proxy",
            vip6_text.as_str(),
            "dev",
            gw.wan_if.as_str(),
        ])?;

        let mut links = Vec::with_capacity(steers.len());
        for (i, (name, node)) in steers.iter().enumerate() {
            let n = i + 1;
            let net: Prefix = format!("100.64.{n}.0/30").parse()?;
            let net6: Prefix = format!("fd00:64:{n:x}::/64").parse()?;
            let pair = ns.veth_to(&node.ns)?;
            let link = SteerLink {
                name: name.clone(),
                ns: node.ns.clone(),
                router_if: pair.local,
                steer_if: pair.peer,
                router_addr: net.if_addr(1)?,
                steer_addr: net.if_addr(2)?,
                router_addr6: net6.if_addr(1)?,
                steer_addr6: net6.if_addr(2)?,
            };
            ns.add_addr(&link.router_if, link.router_addr)?;
            ns.add_addr(&link.router_if, link.router_addr6)?;
            no_rp_filter(&ns, &[&link.router_if])?;

            // The steer node: the shared addresses on lo, never answered for on the underlay.
            let s = &link.ns;
            s.sysctl("net.ipv4.conf.all.arp_ignore", "1")?;
            s.sysctl("net.ipv4.conf.all.arp_announce", "2")?;
            no_rp_filter(s, &[&node.underlay_if, &link.steer_if])?;
            s.add_addr(&link.steer_if, link.steer_addr)?;
            s.add_addr(&link.steer_if, link.steer_addr6)?;
            for a in [vip, vtep] {
                s.add_addr("lo", IfAddr::new(a, 32)?)?;
            }
            s.add_addr("lo", IfAddr::new(vip6, 128)?)?;
            // Everything off the underlay (the peers) goes through the router.
            s.add_default_route(link.router_addr.addr)?;
            s.add_default_route(link.router_addr6.addr)?;
            links.push(link);
        }
        let router = EcmpRouter {
            ns,
            vip,
            vip6,
            vtep,
            withdrawn: Mutex::new(vec![false; links.len()]),
            links,
        };
        router.install()?;
        Ok(router)
    }

    /// The router's namespace (the topology's gateway namespace).
    pub fn netns(&self) -> &Netns {
        &self.ns
    }

    /// The links to the steer nodes, in the order given to [`EcmpRouter::build`].
    pub fn links(&self) -> &[SteerLink] {
        &self.links
    }

    /// The link to steer node `name`.
    pub fn link(&self, name: &str) -> Result<&SteerLink> {
        self.index_of(name).map(|i| &self.links[i])
    }

    /// The addresses routed to the steer nodes: the VIP, VIP6 and the VTEP address.
    pub fn routed(&self) -> [IpAddr; 3] {
        [self.vip, self.vip6, self.vtep]
    }

    /// The steer nodes whose nexthop is installed, in link order.
    pub fn active(&self) -> Vec<String> {
        let withdrawn = self.withdrawn.lock().unwrap_or_else(|e| e.into_inner());
        self.links
            .iter()
            .zip(withdrawn.iter())
            .filter(|(_, w)| !**w)
            .map(|(l, _)| l.name.clone())
            .collect()
    }

    /// Removes steer node `name`'s nexthop from the routes of the VIP, VIP6 and the VTEP
    /// address (a blackhole once none is left). Fails if it is withdrawn already.
    pub fn withdraw(&self, name: &str) -> Result<()> {
        self.set_withdrawn(name, true)
    }

    /// Puts steer node `name`'s nexthop back. Fails if it is not withdrawn.
    pub fn restore(&self, name: &str) -> Result<()> {
        self.set_withdrawn(name, false)
    }

    /// `ip route` and `ip -6 route` of the routed addresses, for messages.
    pub fn describe(&self) -> Result<String> {
        let mut out = String::new();
        for a in self.routed() {
            let family = if a.is_ipv4() { "-4" } else { "-6" };
            let text = a.to_string();
            out.push_str(&self.ns.ip([family, "route", "show", text.as_str()])?);
        }
        Ok(out)
    }

    fn set_withdrawn(&self, name: &str, withdrawn: bool) -> Result<()> {
        let i = self.index_of(name)?;
        {
            let mut w = self.withdrawn.lock().unwrap_or_else(|e| e.into_inner());
            if w[i] == withdrawn {
                return Err(Error::InvalidSpec {
                    field: format!("ecmp nexthop of {name}"),
                    reason: if withdrawn {
                        "is withdrawn already".to_owned()
                    } else {
                        "is not withdrawn".to_owned()
                    },
                });
            }
            w[i] = withdrawn;
        }
        self.install()
    }

    /// (Re)writes the three routes from the links whose nexthop is not withdrawn.
    fn install(&self) -> Result<()> {
        let withdrawn = self
            .withdrawn
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for dest in self.routed() {
            let (family, host_len) = if dest.is_ipv4() {
                ("-4", "32")
            } else {
                ("-6", "128")
            };
            let mut args: Vec<String> =
                vec![family.to_owned(), "route".to_owned(), "replace".to_owned()];
            let live: Vec<&SteerLink> = self
                .links
                .iter()
                .zip(withdrawn.iter())
                .filter(|(_, w)| !**w)
                .map(|(l, _)| l)
                .collect();
            if live.is_empty() {
                args.push("blackhole".to_owned());
                args.push(format!("{dest}/{host_len}"));
            } else {
                args.push(format!("{dest}/{host_len}"));
                for l in live {
                    let via = if dest.is_ipv4() {
                        l.steer_addr.addr
                    } else {
                        l.steer_addr6.addr
                    };
                    args.extend([
                        "nexthop".to_owned(),
                        "via".to_owned(),
                        via.to_string(),
                        "dev".to_owned(),
                        l.router_if.clone(),
                    ]);
                }
            }
            self.ns.ip(args)?;
        }
        Ok(())
    }

    fn index_of(&self, name: &str) -> Result<usize> {
        self.links
            .iter()
            .position(|l| l.name == name)
            .ok_or_else(|| Error::InvalidSpec {
                field: format!("ecmp nexthop {name:?}"),
                reason: format!(
                    "no such steer node (links: {})",
                    self.links
                        .iter()
                        .map(|l| l.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
    }
}

/// Turns the reverse-path filter off in `ns` (all, default and `ifaces`: the effective
/// setting is the highest of `all` and the interface's).
fn no_rp_filter(ns: &Netns, ifaces: &[&String]) -> Result<()> {
    ns.sysctl("net.ipv4.conf.all.rp_filter", "0")?;
    ns.sysctl("net.ipv4.conf.default.rp_filter", "0")?;
    for ifname in ifaces {
        ns.sysctl(&format!("net.ipv4.conf.{ifname}.rp_filter"), "0")?;
    }
    Ok(())
}
