//! Customers' edge routers (CEs) attached at L2 to a gateway over one trunk (issue 16): an
//! `l2` namespace holding the trunk's end and one untagged veth per customer, joined by the
//! userspace tagger ([`crate::l2tag`], `protego-l2tag`) standing in for the CEs' VLAN
//! sub-interfaces, and a namespace per customer with its CE address and a route to its VNet
//! through the gateway's address on the segment. The trunk's other end is in the namespace
//! given (the embedded gateway's, or the steer node's owning the customer port).
//!
//! ```text
//!  ce-a ─┐ untagged                 802.1ad S / 802.1Q C per customer
//!  ce-b ─┼─ l2: protego-l2tag ══ trunk (veth, MTU 1508) ══ gateway or steer node
//! ```

use crate::prefix::Prefix;
use crate::{workspace_bin, Cmd, Netns, Process, Result, Testbed, VethPair};
use std::net::IpAddr;

/// MTU of the trunk: a 1500-byte packet with both tags.
pub const TRUNK_MTU: u32 = 1508;

/// The trunk and the customers on it.
pub struct CustomerLan {
    /// The `l2` namespace (tagger, trunk end, customers' veth ends).
    pub l2: Netns,
    /// The trunk: `local` in `l2`, `peer` in the gateway's namespace (the attachments'
    /// `interface`, or the steer node's port).
    pub trunk: VethPair,
    /// `IF:S:C` of every customer port, for the tagger.
    ports: Vec<String>,
    tagger: Option<Process>,
}

impl CustomerLan {
    /// The `l2` namespace and a trunk into `gateway`, with no receive offloads merging
    /// frames on the gateway's end (as docs/configuration.md requires of an attachment's
    /// interface).
    pub fn build(bed: &Testbed, gateway: &Netns) -> Result<CustomerLan> {
        let l2 = bed.netns("l2")?;
        let trunk = l2.veth_to(gateway)?;
        l2.set_mtu(&trunk.local, TRUNK_MTU)?;
        gateway.set_mtu(&trunk.peer, TRUNK_MTU)?;
        gateway.exec(Cmd::new("ethtool").args(["-K", &trunk.peer, "gro", "off", "lro", "off"]))?;
        Ok(CustomerLan {
            l2,
            trunk,
            ports: Vec::new(),
            tagger: None,
        })
    }

    /// A customer namespace `role` whose frames get tags (`s_tag`, `c_tag`) on the trunk
    /// (`s_tag` 0: the C-tag alone), its CE at `ce`/24 with `routes` through `gw`. Call
    /// before [`CustomerLan::start_tagger`].
    pub fn customer(
        &mut self,
        bed: &Testbed,
        role: &str,
        (s_tag, c_tag): (u16, u16),
        ce: IpAddr,
        gw: IpAddr,
        routes: &[Prefix],
    ) -> Result<Netns> {
        let ns = bed.netns(role)?;
        let link = ns.veth_to(&self.l2)?;
        // Checksums filled on transmit, as a physical NIC does (see the cloud hosts' underlay).
        ns.exec(Cmd::new("ethtool").args(["-K", &link.local, "tx", "off"]))?;
        ns.add_addr(&link.local, format!("{ce}/24").parse()?)?;
        for r in routes {
            ns.add_route(*r, gw)?;
        }
        self.ports.push(format!("{}:{s_tag}:{c_tag}", link.peer));
        Ok(ns)
    }

    /// Starts the tagger over the customers added so far.
    pub fn start_tagger(&mut self) -> Result<()> {
        let bin = workspace_bin("protego-l2tag")?;
        let mut args = vec!["--trunk".to_owned(), self.trunk.local.clone()];
        for p in &self.ports {
            args.push("--port".to_owned());
            args.push(p.clone());
        }
        let cmd = Cmd::new(bin.display().to_string()).args(args);
        self.tagger = Some(self.l2.spawn("l2tag", cmd)?);
        Ok(())
    }
}

/// An `[[attachment]]` table: `tags` (S-tag, C-tag; S-tag 0 for kind "vlan") on `interface`
/// of the gateway (or, with `steer`, of that steer node), VNet "vnet" of `tenant`.
pub struct Attachment<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its tenant.
    pub tenant: &'a str,
    /// The interface.
    pub interface: &'a str,
    /// The steer node owning the interface (the distributed form).
    pub steer: Option<&'a str>,
    /// (S-tag, C-tag).
    pub tags: (u16, u16),
    /// The gateway's address on the segment.
    pub gateway_ip: IpAddr,
    /// The CE's address, when the gateway is to ask for its MAC.
    pub ce_ip: Option<IpAddr>,
    /// Prefixes behind the CE.
    pub routes: &'a [&'a str],
}

impl Attachment<'_> {
    /// The TOML table.
    pub fn toml(&self) -> String {
        let mut t = format!(
            "[[attachment]]\nname = {:?}\ntenant = {:?}\nvnet = \"vnet\"\ninterface = {:?}\n",
            self.name, self.tenant, self.interface
        );
        if let Some(s) = self.steer {
            t.push_str(&format!("steer = {s:?}\n"));
        }
        match self.tags {
            (0, c) => t.push_str(&format!("kind = \"vlan\"\nc_tag = {c}\n")),
            (s, c) => t.push_str(&format!("kind = \"qinq\"\ns_tag = {s}\nc_tag = {c}\n")),
        }
        t.push_str(&format!("gateway_ip = \"{}\"\n", self.gateway_ip));
        if let Some(ce) = self.ce_ip {
            t.push_str(&format!("ce_ip = \"{ce}\"\n"));
        }
        let routes: Vec<String> = self.routes.iter().map(|r| format!("{r:?}")).collect();
        t.push_str(&format!("routes = [{}]\n\n", routes.join(", ")));
        t
    }
}
