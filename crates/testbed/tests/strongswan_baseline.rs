//! Proves the test bed against itself: strongSwan (on-prem site) to a second
//! strongSwan acting as the gateway in the gateway namespace, both with
//! kernel-libipsec and `encap = yes` (ESP in UDP, RFC 3948), PSK,
//! aes256gcm16-prfsha256-x25519 (RFC 7296 IKEv2). Covers a direct site, a site
//! behind nftables NAT, and VMs behind kernel VXLAN (RFC 7348) hosts.
//!
//! Needs root and the tools from `scripts/setup.sh`. The test functions run in
//! parallel threads; every one has its own test bed, so names never collide.

use std::net::IpAddr;
use std::time::Duration;

use protego_testbed::strongswan::{Charon, CharonSettings, SwanctlConfig};
use protego_testbed::topology::{Site, SiteSpec, TenantSpec, VmSpec};
use protego_testbed::traffic::{self, IperfOptions, PingOptions};
use protego_testbed::wait::{wait_for, Probe};
use protego_testbed::{Cmd, IfAddr, Result, Testbed, Topology, TopologySpec};

const PSK: &str = "baseline-test-psk";
const UP: Duration = Duration::from_secs(20);

fn one_site(behind_nat: bool, vms: Vec<VmSpec>, hosts: usize) -> Result<TopologySpec> {
    Ok(TopologySpec {
        tenants: vec![TenantSpec {
            name: "t1".into(),
            vni: 4242,
            vnet: "10.2.0.0/24".parse()?,
            vnet6: None,
            vms,
            sites: vec![SiteSpec {
                lan: "10.1.0.0/24".parse()?,
                lan6: None,
                behind_nat,
            }],
        }],
        hosts,
        ..TopologySpec::default()
    })
}

/// Starts both charons, loads the standard connection pair for site 0 and
/// brings the tunnel up; returns (site charon, gateway charon).
fn tunnel_up(topo: &Topology) -> Result<(Charon, Charon)> {
    let (site_conn, gw_conn) = topo.site_connections(0, PSK);
    let site = Charon::start(&topo.sites[0].ns, "site", &CharonSettings::default())?;
    let gw = Charon::start(&topo.gateway.ns, "gateway", &CharonSettings::default())?;
    site.load(&SwanctlConfig::new(vec![site_conn]))?;
    gw.load(&SwanctlConfig::new(vec![gw_conn]))?;
    site.initiate("net", UP)?;
    site.wait_child_installed("net", UP)?;
    gw.wait_child_installed("net", UP)?;
    Ok((site, gw))
}

/// Waits (at most 5 s) until a ping from the site's LAN to `dst` through the tunnel is
/// answered. kernel-libipsec installs its routes, and the first packets resolve neighbours,
/// after both ends report the CHILD_SA installed; the counted pings after this measure the
/// tunnel, not its start (a fresh machine's run lost the first of 50 once).
fn wait_answers(site: &Site, dst: IpAddr) -> Result<()> {
    let one = PingOptions::new(1, Duration::from_millis(10)).from(site.lan_addr);
    wait_for(&format!("{dst} answers"), Duration::from_secs(5), || {
        let p = traffic::ping(&site.ns, dst, &one)?;
        Ok(if p.received > 0 {
            Probe::Ready(())
        } else {
            Probe::NotYet(format!("{p:?}"))
        })
    })
}

/// Names of our namespaces still listed by `ip netns list`.
fn our_namespaces(tag: &str) -> Vec<String> {
    let out = Cmd::new("ip")
        .args(["netns", "list"])
        .run()
        .unwrap_or_default();
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(tag))
        .map(str::to_owned)
        .collect()
}

#[test]
fn strongswan_to_strongswan_gateway() -> Result<()> {
    let bed = Testbed::new()?;
    let tag = bed.run_id().tag();
    let topo = Topology::build(&bed, one_site(false, Vec::new(), 0)?)?;
    let inner: IpAddr = topo.tenants[0].gateway_ip;
    topo.gateway.ns.add_addr("lo", IfAddr::new(inner, 32)?)?;
    let site = &topo.sites[0];

    let (site_charon, gw_charon) = tunnel_up(&topo)?;
    wait_answers(site, inner)?;
    let sas = gw_charon.list_sas()?;
    assert_eq!(sas.len(), 1, "{sas:?}");
    assert_eq!(
        sas[0].fields.get("dh-group").map(String::as_str),
        Some("CURVE_25519")
    );
    assert_eq!(sas[0].remote_host, site.addr.addr.to_string());
    assert_eq!(sas[0].remote_port, 4500);

    // ESP on the wire, never the plaintext ping.
    let cap = traffic::capture(&topo.gateway.ns, &topo.gateway.wan_if, "udp or icmp", "wan")?;
    let ping = traffic::ping(
        &site.ns,
        inner,
        &PingOptions::new(50, Duration::from_millis(10)).from(site.lan_addr),
    )?;
    assert!(ping.all_received(), "{ping:?}");
    let pcap = cap.stop();
    let esp = traffic::tshark_count(&pcap, "udp.port == 4500 && esp")?;
    let plain = traffic::tshark_count(&pcap, "icmp")?;
    assert!(esp >= 100, "expected >= 100 ESP-in-UDP packets, saw {esp}");
    assert_eq!(plain, 0, "plaintext ICMP leaked onto the WAN");

    let server = traffic::iperf3_server(&topo.gateway.ns, inner, traffic::IPERF3_PORT)?;
    let mut opts = IperfOptions::tcp(Duration::from_secs(2));
    opts.bind = Some(site.lan_addr);
    let perf = traffic::iperf3_client(&site.ns, inner, &opts)?;
    server.process.stop();
    assert!(perf.received_bps > 1e6, "{perf:?}");
    eprintln!(
        "baseline: iperf3 {:.0} Mbit/s through strongSwan <-> strongSwan",
        perf.received_bps / 1e6
    );

    let child = gw_charon.wait_child_installed("net", UP)?;
    assert!(child.packets_in >= 50, "{child:?}");

    // Rekey the CHILD_SA from the site; traffic keeps flowing on the new SA.
    let old = site_charon.wait_child_installed("net", UP)?;
    site_charon.rekey_child("net")?;
    let new = site_charon.wait_child_rekeyed("net", &old.spi_in, UP)?;
    assert_ne!(new.spi_out, old.spi_out);
    let ping = traffic::ping(
        &site.ns,
        inner,
        &PingOptions::new(20, Duration::from_millis(10)).from(site.lan_addr),
    )?;
    assert!(ping.all_received(), "after rekey: {ping:?}");

    let ike = &site_charon.list_sas()?[0].name;
    site_charon.terminate_ike(ike, UP)?;
    gw_charon.wait_ike_gone(ike, UP)?;

    bed.teardown()?;
    assert_eq!(our_namespaces(&tag), Vec::<String>::new());
    Ok(())
}

#[test]
fn strongswan_behind_nat() -> Result<()> {
    let bed = Testbed::new()?;
    let tag = bed.run_id().tag();
    let topo = Topology::build(&bed, one_site(true, Vec::new(), 0)?)?;
    let inner = topo.tenants[0].gateway_ip;
    topo.gateway.ns.add_addr("lo", IfAddr::new(inner, 32)?)?;
    let site = &topo.sites[0];
    let nat = site.nat.as_ref().expect("site is behind NAT");

    let (_site_charon, gw_charon) = tunnel_up(&topo)?;
    wait_answers(site, inner)?;
    let sas = gw_charon.list_sas()?;
    assert_eq!(sas.len(), 1, "{sas:?}");
    // The gateway sees the NAT router's public address, not the site's own.
    assert_eq!(sas[0].remote_host, nat.outside.addr.to_string());
    assert_eq!(site.public_addr, nat.outside.addr);
    assert_ne!(site.addr.addr, site.public_addr);

    let ping = traffic::ping(
        &site.ns,
        inner,
        &PingOptions::new(50, Duration::from_millis(10)).from(site.lan_addr),
    )?;
    assert!(ping.all_received(), "{ping:?}");

    bed.teardown()?;
    assert_eq!(our_namespaces(&tag), Vec::<String>::new());
    Ok(())
}

#[test]
fn vms_behind_kernel_vxlan_hosts() -> Result<()> {
    let bed = Testbed::new()?;
    let tag = bed.run_id().tag();
    let mut spec = one_site(false, vec![VmSpec { host: 0 }, VmSpec { host: 1 }], 2)?;
    // Dual stack inside the tunnel: IPv6 LAN and VNet as well.
    spec.tenants[0].vnet6 = Some("fd00:2::/64".parse()?);
    spec.tenants[0].sites[0].lan6 = Some("fd00:1::/64".parse()?);
    let topo = Topology::build(&bed, spec)?;
    // strongSwan forwards in the kernel, so the gateway terminates the VNI
    // with a kernel VXLAN device.
    topo.attach_kernel_vxlan_gateway()?;
    let site = &topo.sites[0];
    let (_site_charon, _gw_charon) = tunnel_up(&topo)?;
    for vm in &topo.tenants[0].vms {
        wait_answers(site, vm.addr.addr)?;
    }

    // The VXLAN on the underlay really is VNI 4242 toward both hosts.
    let cap = traffic::capture(
        &topo.gateway.ns,
        &topo.gateway.underlay_if,
        "udp port 4789",
        "underlay",
    )?;
    for vm in &topo.tenants[0].vms {
        let ping = traffic::ping(
            &site.ns,
            vm.addr.addr,
            &PingOptions::new(30, Duration::from_millis(10)).from(site.lan_addr),
        )?;
        assert!(ping.all_received(), "to {}: {ping:?}", vm.addr);
        let (Some(from6), Some(to6)) = (site.lan6_addr, vm.addr6) else {
            panic!("dual-stack topology without IPv6 addresses");
        };
        let ping6 = traffic::ping(
            &site.ns,
            to6.addr,
            &PingOptions::new(20, Duration::from_millis(10)).from(from6),
        )?;
        assert!(ping6.all_received(), "to {to6}: {ping6:?}");
    }
    let pcap = cap.stop();
    let rows = traffic::tshark_fields(&pcap, "vxlan && icmp", &["vxlan.vni", "ip.dst"])?;
    assert!(
        rows.len() >= 120,
        "expected >= 120 VXLAN ICMP packets, saw {}",
        rows.len()
    );
    assert!(
        rows.iter()
            .all(|r| r.first().map(String::as_str) == Some("4242")),
        "{rows:?}"
    );

    bed.teardown()?;
    assert_eq!(our_namespaces(&tag), Vec::<String>::new());
    Ok(())
}
