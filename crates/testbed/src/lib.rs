//! A Linux network-namespace test bed for Protego's interop tests and demo.
//!
//! Everything here runs as root on Linux and drives real tools: `ip`, `bridge`,
//! `nft`, strongSwan's charon and `swanctl`, `ping`, `iperf3`, `tcpdump` and
//! `tshark` (install them with `scripts/setup.sh`).
//!
//! - [`Testbed`] is the guard: every namespace, interface, background process
//!   and temp file it creates carries a per-run name (`pt` + pid + counter, see
//!   [`names`]) and is removed when the test bed is dropped — also when a test
//!   panics (the logs of its processes are printed first) and from a Ctrl-C
//!   handler via [`CleanupHandle`]. [`sweep()`] removes leftovers of runs whose
//!   process died (it runs automatically when a test bed is created).
//! - [`Netns`] offers the building blocks: veth pairs, addresses, routes,
//!   bridges, kernel VXLAN devices (RFC 7348) with static flood entries,
//!   nftables masquerade, commands and background processes inside.
//! - [`strongswan`] runs one charon per namespace (kernel-libipsec, UDP
//!   encapsulation, RFC 3948) configured from Rust structs and observed through
//!   `swanctl --list-sas`.
//! - [`traffic`] measures: ping loss, iperf3 throughput, pcap captures.
//! - [`probe`] times the path to the microsecond: a paced stream of timestamped datagrams
//!   (the `protego-probe` program) whose arrivals the receiver's kernel stamps, read back as
//!   the longest stall, delays, losses and reordering over a window.
//! - [`inject`] opens UDP and TCP sockets inside a namespace (hand-made datagrams, a TCP client
//!   and server across a tunnel), counts UDP datagrams by port across a path, attaches an extra
//!   host to the WAN and reads the UDP datagrams of a pcap (robustness tests).
//! - [`l2tag`] tags and untags frames between customers' untagged links and one 802.1ad /
//!   802.1Q trunk in userspace (the `protego-l2tag` program), where the kernel has no VLANs.
//! - [`browser::Browser`] drives a headless Chromium inside a namespace over the DevTools
//!   protocol (type, click, evaluate, screenshot), for the web console's test.
//! - [`etcd::Etcd`] runs a single-member etcd for distributed-store tests, with TLS, client
//!   certificates and users as docs/operations.md sets it up.
//! - [`cluster::ProtegoCluster`] runs Protego's distributed form on a topology (control,
//!   data and steer nodes, their PKI, optionally etcd).
//! - [`Topology`] builds the standard picture (sites, optional NAT, gateway,
//!   cloud hosts with VXLAN and VMs) from a [`TopologySpec`] and returns every
//!   address.
//!
//! ```no_run
//! use protego_testbed::{Testbed, traffic};
//! use std::time::Duration;
//!
//! let bed = Testbed::new()?;
//! let a = bed.netns("a")?;
//! let b = bed.netns("b")?;
//! let link = a.veth_to(&b)?;
//! a.add_addr(&link.local, "192.0.2.1/24".parse()?)?;
//! b.add_addr(&link.peer, "192.0.2.2/24".parse()?)?;
//! let stats = traffic::ping(&a, "192.0.2.2".parse()?, &traffic::PingOptions::new(10, Duration::from_millis(10)))?;
//! assert!(stats.all_received());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bed;
pub mod browser;
pub mod cluster;
pub mod cmd;
pub mod customers;
mod error;
pub mod etcd;
pub mod inject;
pub mod l2tag;
pub mod names;
mod netns;
pub mod prefix;
pub mod probe;
pub mod protego;
pub mod router;
pub mod strongswan;
pub mod sweep;
pub mod topology;
pub mod traffic;
pub mod wait;

pub use bed::{base_dir, CleanupHandle, Process, Testbed, KEEP_ENV};
pub use cmd::{Cmd, Output};
pub use error::{Error, Result};
pub use netns::{Netns, VethPair, VxlanDevice, VXLAN_PORT};
pub use prefix::{IfAddr, Prefix};
pub use sweep::{sweep, SweepReport};
pub use topology::{Topology, TopologySpec};

use std::path::PathBuf;

/// Path of a binary built by this workspace in the same profile as the running
/// test or program (`target/<profile>/<name>`), or `$PROTEGO_BIN` for
/// `protego` when set. The binary must have been built already (`make test`
/// builds all binaries before running tests).
pub fn workspace_bin(name: &str) -> Result<PathBuf> {
    if name == "protego" {
        if let Some(p) = std::env::var_os("PROTEGO_BIN") {
            return Ok(PathBuf::from(p));
        }
    }
    let exe =
        std::env::current_exe().map_err(|e| Error::io("locate current executable", name, e))?;
    // target/<profile>/deps/<test> or target/<profile>/<bin>
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let candidate = dir.join(name);
    if candidate.is_file() {
        Ok(candidate)
    } else {
        Err(Error::MissingProgram {
            program: format!(
                "{} (build it first: cargo build --bins)",
                candidate.display()
            ),
        })
    }
}
