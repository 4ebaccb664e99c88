//! Network namespaces and the links between them: veth pairs, addresses,
//! routes, bridges, Linux kernel VXLAN devices (RFC 7348) with static flood
//! entries, and nftables masquerade NAT.

use std::fs;
use std::net::IpAddr;
use std::sync::Arc;

use crate::bed::{spawn_process, Inner, Process};
use crate::cmd::{Cmd, Output};
use crate::error::{Error, Result};
use crate::prefix::{IfAddr, Prefix};

/// The IANA-assigned VXLAN UDP port (RFC 7348 §5).
pub const VXLAN_PORT: u16 = 4789;

/// A network namespace of a test bed. Cloning is cheap; the namespace lives
/// until its [`crate::Testbed`] is torn down.
#[derive(Clone)]
pub struct Netns {
    name: String,
    bed: Arc<Inner>,
}

/// The two ends of a veth pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VethPair {
    /// The end inside the namespace the pair was created from.
    pub local: String,
    /// The end inside the peer namespace.
    pub peer: String,
}

/// A Linux kernel VXLAN device to create in a namespace.
#[derive(Clone, Debug)]
pub struct VxlanDevice {
    /// Interface name.
    pub name: String,
    /// The VXLAN network identifier (24 bits).
    pub vni: u32,
    /// Local underlay address (source of encapsulated packets).
    pub local: IpAddr,
    /// Underlay interface to bind to, if any.
    pub dev: Option<String>,
    /// UDP destination port (normally [`VXLAN_PORT`]).
    pub dst_port: u16,
    /// Whether the device learns remote MAC-to-VTEP mappings from received packets.
    pub learning: bool,
    /// MTU of the device, if not the kernel's default.
    pub mtu: Option<u32>,
}

impl Netns {
    pub(crate) fn new(name: String, bed: Arc<Inner>) -> Netns {
        Netns { name, bed }
    }

    /// The namespace's name (as in `ip netns list`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The run directory of the test bed this namespace belongs to.
    pub fn run_dir(&self) -> &std::path::Path {
        self.bed.dir()
    }

    /// A fresh interface name of this run: the run tag, `kind` (one letter) and a
    /// per-run counter.
    pub fn fresh_ifname(&self, kind: char) -> Result<String> {
        self.bed.fresh_ifname(kind)
    }

    /// Runs `cmd` inside the namespace; requires success, returns stdout.
    pub fn exec(&self, cmd: Cmd) -> Result<String> {
        cmd.in_netns(&self.name).run()
    }

    /// Runs `cmd` inside the namespace and returns its output whatever the status.
    pub fn exec_output(&self, cmd: Cmd) -> Result<Output> {
        cmd.in_netns(&self.name).output()
    }

    /// Runs `ip -n <ns> <args>`; requires success, returns stdout.
    pub fn ip<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Cmd::new("ip")
            .args(["-n", self.name.as_str()])
            .args(args)
            .run()
    }

    /// Starts `cmd` inside the namespace in the background (see [`crate::Testbed::spawn`]).
    pub fn spawn(&self, label: &str, cmd: Cmd) -> Result<Process> {
        spawn_process(&self.bed, label, &cmd.in_netns(&self.name))
    }

    /// Sets a sysctl inside the namespace (`net.*` keys are per namespace).
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.exec(Cmd::new("sysctl").args(["-qw", &format!("{key}={value}")]))
            .map(drop)
    }

    /// Turns on IPv4 and IPv6 forwarding (routers, gateways).
    pub fn enable_forwarding(&self) -> Result<()> {
        self.sysctl("net.ipv4.ip_forward", "1")?;
        self.sysctl("net.ipv6.conf.all.forwarding", "1")
    }

    /// Creates a veth pair with fresh names between this namespace and `peer`
    /// and sets both ends up.
    pub fn veth_to(&self, peer: &Netns) -> Result<VethPair> {
        let local = self.fresh_ifname('v')?;
        let peer_if = peer.fresh_ifname('v')?;
        self.veth_named(&local, peer, &peer_if)?;
        Ok(VethPair {
            local,
            peer: peer_if,
        })
    }

    /// Creates a veth pair `local` (here) <-> `peer_if` (in `peer`), both up.
    /// Both ends are created directly inside their namespaces.
    pub fn veth_named(&self, local: &str, peer: &Netns, peer_if: &str) -> Result<()> {
        Cmd::new("ip")
            .args(["link", "add", "name", local, "netns", &self.name])
            .args(["type", "veth", "peer", "name", peer_if, "netns", &peer.name])
            .run()?;
        self.link_up(local)?;
        peer.link_up(peer_if)
    }

    /// Sets an interface up.
    pub fn link_up(&self, ifname: &str) -> Result<()> {
        self.ip(["link", "set", "dev", ifname, "up"]).map(drop)
    }

    /// Sets an interface down.
    pub fn link_down(&self, ifname: &str) -> Result<()> {
        self.ip(["link", "set", "dev", ifname, "down"]).map(drop)
    }

    /// Sets an interface's MTU.
    pub fn set_mtu(&self, ifname: &str, mtu: u32) -> Result<()> {
        self.ip(["link", "set", "dev", ifname, "mtu", &mtu.to_string()])
            .map(drop)
    }

    /// Adds an address to an interface (IPv6 without duplicate-address detection,
    /// so it is usable at once).
    pub fn add_addr(&self, ifname: &str, addr: IfAddr) -> Result<()> {
        let a = addr.to_string();
        let mut args = vec!["addr", "add", a.as_str(), "dev", ifname];
        if addr.addr.is_ipv6() {
            args.push("nodad");
        }
        self.ip(args).map(drop)
    }

    /// Adds a route to `dest` via `gateway`.
    pub fn add_route(&self, dest: Prefix, gateway: IpAddr) -> Result<()> {
        let d = dest.to_string();
        let g = gateway.to_string();
        self.ip(["route", "replace", d.as_str(), "via", g.as_str()])
            .map(drop)
    }

    /// Adds a route to `dest` out of interface `dev` (on-link).
    pub fn add_route_dev(&self, dest: Prefix, dev: &str) -> Result<()> {
        let d = dest.to_string();
        self.ip(["route", "replace", d.as_str(), "dev", dev])
            .map(drop)
    }

    /// Sets the default route of `gateway`'s address family.
    pub fn add_default_route(&self, gateway: IpAddr) -> Result<()> {
        let family = if gateway.is_ipv4() { "-4" } else { "-6" };
        let g = gateway.to_string();
        self.ip([family, "route", "replace", "default", "via", g.as_str()])
            .map(drop)
    }

    /// Creates a bridge (STP off, no multicast snooping) and sets it up.
    pub fn add_bridge(&self, name: &str) -> Result<()> {
        self.ip([
            "link",
            "add",
            "name",
            name,
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
            "mcast_snooping",
            "0",
        ])?;
        self.link_up(name)
    }

    /// Enslaves `ifname` to `bridge`.
    pub fn set_master(&self, ifname: &str, bridge: &str) -> Result<()> {
        self.ip(["link", "set", "dev", ifname, "master", bridge])
            .map(drop)
    }

    /// Creates a kernel VXLAN device and sets it up.
    pub fn add_vxlan(&self, dev: &VxlanDevice) -> Result<()> {
        if dev.vni >= 1 << 24 {
            return Err(Error::InvalidSpec {
                field: format!("vxlan {}.vni", dev.name),
                reason: format!("VNI {} does not fit 24 bits", dev.vni),
            });
        }
        let vni = dev.vni.to_string();
        let local = dev.local.to_string();
        let port = dev.dst_port.to_string();
        let mut args = vec![
            "link", "add", "name", &dev.name, "type", "vxlan", "id", &vni, "local", &local,
            "dstport", &port,
        ];
        if let Some(d) = &dev.dev {
            args.extend(["dev", d.as_str()]);
        }
        args.push(if dev.learning {
            "learning"
        } else {
            "nolearning"
        });
        self.ip(args)?;
        if let Some(mtu) = dev.mtu {
            self.set_mtu(&dev.name, mtu)?;
        }
        self.link_up(&dev.name)
    }

    /// Appends a forwarding entry to a VXLAN device: frames to `mac` (use
    /// `00:00:00:00:00:00` for the flood entry of unknown/broadcast frames) go to
    /// the VTEP `dst`.
    pub fn fdb_append(&self, dev: &str, mac: &str, dst: IpAddr) -> Result<()> {
        let d = dst.to_string();
        self.exec(Cmd::new("bridge").args(["fdb", "append", mac, "dev", dev, "dst", d.as_str()]))
            .map(drop)
    }

    /// Adds a permanent neighbour entry `ip` -> `mac` on `dev`.
    pub fn add_neigh(&self, ip: IpAddr, mac: &str, dev: &str) -> Result<()> {
        let i = ip.to_string();
        self.ip([
            "neigh",
            "replace",
            i.as_str(),
            "lladdr",
            mac,
            "dev",
            dev,
            "nud",
            "permanent",
        ])
        .map(drop)
    }

    /// The MAC address of an interface.
    pub fn mac(&self, ifname: &str) -> Result<String> {
        let out = self.ip(["-j", "link", "show", "dev", ifname])?;
        let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| Error::Parse {
            what: "ip -j link output",
            detail: e.to_string(),
            input: out.clone(),
        })?;
        v.get(0)
            .and_then(|l| l.get("address"))
            .and_then(|a| a.as_str())
            .map(str::to_owned)
            .ok_or_else(|| Error::Parse {
                what: "ip -j link output",
                detail: format!("no address for {ifname}"),
                input: out,
            })
    }

    /// Adds nftables masquerade NAT (IPv4 and IPv6) for everything leaving
    /// through `out_if`, in table `inet protego_nat` of this namespace.
    pub fn add_masquerade(&self, out_if: &str) -> Result<()> {
        let script = format!(
            "table inet protego_nat {{\n  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n    oifname \"{out_if}\" masquerade\n  }}\n}}\n"
        );
        self.nft("nat", &script)
    }

    /// Simulates a NAT rebinding on a namespace set up with [`Netns::add_masquerade`]: the
    /// masquerade rule now maps sources to ports `ports.0..=ports.1` and the connection
    /// tracking table of this namespace is flushed, so every flow gets a new outside port.
    pub fn rebind_masquerade(&self, out_if: &str, ports: (u16, u16)) -> Result<()> {
        let script = format!(
            "flush chain inet protego_nat postrouting\n\
             add rule inet protego_nat postrouting oifname \"{out_if}\" meta l4proto {{ tcp, udp }} masquerade to :{}-{}\n\
             add rule inet protego_nat postrouting oifname \"{out_if}\" masquerade\n",
            ports.0, ports.1
        );
        self.nft("nat-rebind", &script)?;
        // `conntrack -F` exits non-zero on an empty table on some versions; the flush is
        // what matters, so only a missing tool is an error.
        self.exec_output(Cmd::new("conntrack").args(["-F"]))
            .map(drop)
    }

    /// Runs an nftables script in this namespace (kept as `<kind>-<ns>.nft` in the bed's
    /// directory for post-mortems).
    fn nft(&self, kind: &str, script: &str) -> Result<()> {
        let path = self.bed.dir().join(format!("{kind}-{}.nft", self.name));
        fs::write(&path, script).map_err(|e| Error::io("write", &path, e))?;
        self.exec(Cmd::new("nft").args(["-f", &path.to_string_lossy()]))
            .map(drop)
    }

    /// The pids of all processes inside the namespace.
    pub fn pids(&self) -> Result<Vec<u32>> {
        let out = Cmd::new("ip").args(["netns", "pids", &self.name]).run()?;
        Ok(out
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect())
    }
}

impl std::fmt::Debug for Netns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Netns").field(&self.name).finish()
    }
}
