//! Per-VM overlay routes (issue 16 §2) against real strongSwan and kernel VXLAN hosts: a VM
//! moves from one cloud host to the other while the site pings it every millisecond (issue 16
//! §4's 1 kHz ping), and
//! `protego ctl route add` points its exact entry at the new host.
//!
//! The gateway's configuration routes each VM's /32 to the host it starts on, so after the
//! move only the exact entry can reach the VM: the pings that come back prove it wins over
//! the prefix. The move itself is the VM's host-side veth leaving the first host's bridge for
//! the second's (the VM keeps its namespace, address and MAC, as in a live migration); the
//! route change follows it. Pings sent between the two may be lost (the old host no longer
//! has the VM): the test says how many (3 or 4 of 3000 in 24-39 ms here), and requires no
//! more than one per millisecond of the move and command, plus three in flight.

mod common;

use common::*;

use protego_testbed::protego::{GatewayTunnel, ProtegoGateway};
use protego_testbed::{Result, Testbed, Topology};

#[test]
fn a_vm_moved_to_another_host_is_reached_through_its_exact_entry() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    let result = (|| -> Result<()> {
        let _site = site_up(&topo, &tun)?;
        let vm = &topo.tenants[0].vms[0];
        let from = &topo.hosts[vm.host];
        let tenant = &topo.tenants[0].name;

        // An exact entry where the prefix already points: the VM answers through it.
        let add = |host: &std::net::IpAddr| {
            gw.control(&format!("route add {tenant} vnet {} {host}", vm.addr.addr))
        };
        add(&from.underlay.addr)?;
        ping_all_vms(&topo, 0, 5)?;

        let VmMove {
            lost,
            gap,
            answer,
            log,
        } = move_vm_under_ping(&topo, vm.host, 1 - vm.host, |host| add(&host))?;
        assert_eq!(answer["replaced"], 1, "{answer}");
        eprintln!(
            "VM moved and its entry changed within {:.1} ms; {lost} of {MOVE_PINGS} pings (1 ms apart) lost",
            gap.as_secs_f64() * 1e3
        );
        // Only the pings sent while the VM was at neither host may be lost: one per
        // millisecond the move and the command took (`gap`), and the few in flight when the
        // veth left the old host (a round trip through the gateway is under a millisecond;
        // three allow for ping's own timer slack).
        let allowed = gap.as_millis() as usize + 3;
        assert!(
            lost <= allowed,
            "{lost} lost, at most {allowed} expected:\n{log}"
        );
        // And it keeps answering at its new host; the prefix still names the old one.
        ping_all_vms(&topo, 0, 20)?;
        let status = gw.status_json()?;
        assert_eq!(status["routes"]["entries"], 1, "{}", status["routes"]);
        Ok(())
    })();
    if result.is_err() {
        eprintln!("--- protego log ---\n{}", gw.log());
    }
    result
}

/// Issue 16 §4: a 1 M-entry table loaded (`route load`) while an iperf3 TCP stream and a
/// 1 kHz probe stream run from the site to a VM through the tunnel. The traffic keeps
/// flowing and reaches the VM through its own entry in the loaded table; the test prints
/// the longest stall the probes saw during the load and over as long a time before it (not
/// asserted: a timing on a shared 2-core machine; the figures are in docs/performance.md).
/// `PROTEGO_ROUTES_LOAD` changes the number of entries.
#[test]
fn a_million_entries_load_while_traffic_flows() -> Result<()> {
    let entries: u32 = std::env::var("PROTEGO_ROUTES_LOAD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    let result = (|| -> Result<()> {
        let _site = site_up(&topo, &tun)?;
        let file = bed.dir().join("routes.csv");
        let lines = write_route_load(&topo, entries, &file)?;
        let (answer, seen) = under_traffic(&topo, || {
            gw.control(&format!("route load {}", file.display()))
        })?;
        assert_eq!(answer["added"], lines, "{answer}");
        eprintln!("route load of {lines} entries: {seen}");
        assert!(
            seen.during.is_some_and(|s| s.received > 0) && seen.iperf.bytes_received > 0,
            "traffic stopped during the load: {seen}"
        );
        ping_all_vms(&topo, 0, 5)?;
        let status = gw.status_json()?;
        assert_eq!(
            status["routes"]["entries"],
            entries + 1,
            "{}",
            status["routes"]
        );
        Ok(())
    })();
    if result.is_err() {
        eprintln!("--- protego log ---\n{}", gw.log());
    }
    result
}
