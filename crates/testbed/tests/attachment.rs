//! Customers attached at L2 (issue 16 §1, embedded form): `protego up` with two
//! `[[attachment]]`s of two tenants whose address plans are identical, over Q-in-Q on one
//! veth link into the gateway namespace, and a cloud host with kernel VXLAN and one VM per
//! tenant (the same VM address in both VNets).
//!
//! ```text
//!  site (strongSwan, red's LAN 10.1.0.0/24) ══ IKEv2/ESP ══ gw    (red's VNet served by both)
//!  cea (10.99.0.2) ─┐ untagged                802.1ad S=100 / 802.1Q C=10
//!  ceb (10.99.0.2) ─┼─ l2: protego-l2tag ══ trunk (veth) ══ gw: protego up ─ VXLAN ─ host0 ─ VMs
//!  cex (10.99.0.2) ─┤                         S=200 / C=10; S=300 / C=10 (no attachment)
//!  cev (10.98.0.2) ─┘                         802.1Q C=30 alone (blue's branch, kind = "vlan")
//! ```
//!
//! The customer's edge router would tag with Linux VLAN sub-interfaces (`ip link add … type
//! vlan proto 802.1ad id 100`, then `… type vlan id 10` on top); the kernels this project's
//! tests run on are built without VLAN support (`CONFIG_VLAN_8021Q` unset), so the `l2`
//! namespace runs `protego-l2tag`, which puts the same tags on in userspace and writes frames
//! as they would be on the wire (the gateway's kernel still moves the outer tag into
//! metadata, which Protego's ring reader writes back). Red also has an on-prem site with an
//! IPsec tunnel into the same VNet, used at the same time, whose selectors include red's CE
//! segment: red's CE and red's site ping each other through it, blue's CE (same addresses)
//! does not reach red's site. Pings both ways for both customers,
//! isolation checked with captures on the VMs, TCP both ways with nothing refused on the way,
//! and frames with an unknown tag pair, a spoofed source or a destination outside the VNet
//! dropped and counted in `protego status --json`. Needs root and the tools
//! from `scripts/setup.sh`, and the `protego` and `protego-l2tag` binaries built in the same
//! profile (`make test` does both). Every namespace is this test's own and removed with it.

mod common;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use protego_testbed::customers::{Attachment, CustomerLan};
use protego_testbed::protego::{GatewayTunnel, ProtegoGateway};
use protego_testbed::strongswan::CharonSettings;
use protego_testbed::topology::{TenantSpec, VmSpec};
use protego_testbed::traffic::{self, IperfOptions, PingOptions};
use protego_testbed::{Netns, Prefix, Result, Testbed, Topology, TopologySpec};

/// The CEs' address on the segment, the same for every customer.
const CE_IP: &str = "10.99.0.2";
/// The gateway's address on each attachment's segment.
const GW_IP: &str = "10.99.0.1";
/// The CEs' segment (each attachment's `routes`).
const SEGMENT: &str = "10.99.0.0/24";

fn addr(s: &str) -> IpAddr {
    s.parse().expect("constant address")
}

fn tenant(name: &str, vni: u32) -> Result<TenantSpec> {
    Ok(TenantSpec {
        name: name.into(),
        vni,
        vnet: "10.2.0.0/24".parse()?,
        vnet6: None,
        vms: vec![VmSpec { host: 0 }],
        sites: vec![],
    })
}

fn drops(gw: &ProtegoGateway) -> Result<BTreeMap<String, u64>> {
    let status = gw.status_json()?;
    Ok(status["drops"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default())
}

/// Waits until drop counter `reason` reaches `at_least` (status is read every 200 ms).
fn wait_drops(gw: &ProtegoGateway, reason: &str, at_least: u64) -> Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = drops(gw)?.get(reason).copied().unwrap_or(0);
        if n >= at_least || Instant::now() > deadline {
            return Ok(n);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn two_customers_attached_over_qinq_reach_their_own_vms_both_ways() -> Result<()> {
    let bed = Testbed::new()?;
    let spec = TopologySpec {
        // Red has an on-prem site (IPsec) besides its attachment; blue only the attachment.
        tenants: vec![
            common::tenant("red", 1001, false, vec![VmSpec { host: 0 }])?,
            tenant("blue", 1002)?,
        ],
        hosts: 1,
        ..TopologySpec::default()
    };
    let topo = Topology::build(&bed, spec)?;
    let gw_ns = &topo.gateway.ns;

    // The physical link: one trunk between the customers' side and the gateway.
    let mut lan = CustomerLan::build(&bed, gw_ns)?;
    let vnet: Prefix = "10.2.0.0/24".parse()?;
    let (ce, gw_ip) = (addr(CE_IP), addr(GW_IP));
    let red_ce = lan.customer(&bed, "cea", (100, 10), ce, gw_ip, &[vnet])?;
    let blue_ce = lan.customer(&bed, "ceb", (200, 10), ce, gw_ip, &[vnet])?;
    let stranger = lan.customer(&bed, "cex", (300, 10), ce, gw_ip, &[vnet])?;
    // Blue's second site on one 802.1Q tag (kind = "vlan"), another segment into the same VNet.
    let blue2_ce = lan.customer(
        &bed,
        "cev",
        (0, 30),
        addr("10.98.0.2"),
        addr("10.98.0.1"),
        &[vnet],
    )?;
    lan.start_tagger()?;

    // Red names its CE's address (the gateway asks for its MAC); blue does not (learned).
    let on_trunk = |name, tenant, tags, ce_ip: Option<IpAddr>, routes| Attachment {
        name,
        tenant,
        interface: &lan.trunk.peer,
        steer: None,
        tags,
        gateway_ip: gw_ip,
        ce_ip,
        routes,
    };
    let tables = on_trunk("red-dc", "red", (100, 10), Some(ce), &[SEGMENT]).toml()
        + &on_trunk("blue-dc", "blue", (200, 10), None, &[SEGMENT]).toml()
        + &Attachment {
            gateway_ip: addr("10.98.0.1"),
            ..on_trunk(
                "blue-branch",
                "blue",
                (0, 30),
                Some(addr("10.98.0.2")),
                &["10.98.0.0/24"],
            )
        }
        .toml();
    // Red's tunnel carries its CE's segment too, on both sides (the segment is in the local
    // selectors at the gateway, in the remote ones at the site).
    let mut tun = GatewayTunnel::for_site(&topo, 0, common::PSK);
    tun.extra_local_ts = vec![SEGMENT.to_owned()];
    let gw =
        ProtegoGateway::start_with_tables(&bed, &topo, std::slice::from_ref(&tun), &[], &tables)?;
    let settings = CharonSettings::default();
    let site = common::site_charon_with(&topo, &tun, "site0", &settings, |conn| {
        for child in &mut conn.children {
            child.remote_ts.push(SEGMENT.to_owned());
        }
    })?;
    site.initiate("net", common::UP)?;
    site.wait_child_installed("net", common::UP)?;
    common::warm_up(&topo, 0)?;

    let red_vm = &topo.tenants[0].vms[0];
    let blue_vm = &topo.tenants[1].vms[0];
    assert_eq!(
        red_vm.addr.addr, blue_vm.addr.addr,
        "identical address plans"
    );
    let ce_ip = addr(CE_IP);
    let vm_ip = red_vm.addr.addr;

    // VM -> red CE first: the gateway resolves the CE from ce_ip (the first echo may go while
    // it asks), then every ping both ways.
    let warm = traffic::ping(
        &red_vm.ns,
        ce_ip,
        &PingOptions::new(5, Duration::from_millis(300)),
    )?;
    assert!(warm.received >= 3, "VM -> red CE while resolving: {warm:?}");
    let unresolved = drops(&gw)?.get("attach_ce_unresolved").copied();
    assert!(
        unresolved.is_some_and(|n| (1..=2).contains(&n)),
        "the first echo waits for the CE's MAC: {unresolved:?}"
    );
    let fast = PingOptions::new(30, Duration::from_millis(20));
    let p = traffic::ping(&red_vm.ns, ce_ip, &fast)?;
    assert!(p.all_received(), "red VM -> CE: {p:?}\n{}", gw.log());
    let p = traffic::ping(&red_ce, vm_ip, &fast)?;
    assert!(p.all_received(), "red CE -> VM: {p:?}\n{}", gw.log());
    // Blue CE -> VM first: the gateway learns the CE's MAC from its ARP, then the VM's side.
    let p = traffic::ping(&blue_ce, vm_ip, &fast)?;
    assert!(p.all_received(), "blue CE -> VM: {p:?}\n{}", gw.log());
    let p = traffic::ping(&blue_vm.ns, ce_ip, &fast)?;
    assert!(p.all_received(), "blue VM -> CE: {p:?}\n{}", gw.log());
    // Blue's branch on a single VLAN tag reaches the same VM, and the VM it.
    let p = traffic::ping(&blue2_ce, vm_ip, &fast)?;
    assert!(
        p.all_received(),
        "blue branch (VLAN) -> VM: {p:?}\n{}",
        gw.log()
    );
    let p = traffic::ping(&blue_vm.ns, addr("10.98.0.2"), &fast)?;
    assert!(p.all_received(), "blue VM -> branch: {p:?}\n{}", gw.log());

    // Red's CE and red's on-prem site reach each other through red's tunnel, both ways (the
    // CE's packets for the site are read on the attachment lane and numbered in the order of
    // red's VTEP lane, where the VMs' packets for the tunnel are).
    let red_site = &topo.sites[0];
    let site_ip = red_site.lan_addr;
    for ce in [&red_ce, &blue_ce] {
        ce.add_route(red_site.lan, addr(GW_IP))?;
    }
    let p = traffic::ping(&red_ce, site_ip, &fast)?;
    assert!(p.all_received(), "red CE -> site: {p:?}\n{}", gw.log());
    let p = traffic::ping(&red_site.ns, ce_ip, &fast.clone().from(site_ip))?;
    assert!(p.all_received(), "red site -> CE: {p:?}\n{}", gw.log());
    // Blue's CE, with the same addresses and the same route, does not reach red's site: its
    // VNet has no tunnel, its packets end as no_route, and no answer from the site comes back
    // to red's CE (where a leaked request's echo reply would go).
    let leak_cap = traffic::capture(&red_ce, "any", "icmp", "red-ce")?;
    let base = drops(&gw)?.get("no_route").copied().unwrap_or(0);
    let mut opts = PingOptions::new(10, Duration::from_millis(20));
    opts.size = Some(444);
    let p = traffic::ping(&blue_ce, site_ip, &opts)?;
    assert_eq!(p.received, 0, "blue CE reached red's site: {p:?}");
    let now = wait_drops(&gw, "no_route", base + 10)?;
    assert!(now >= base + 10, "no_route: {now} (before {base})");
    let leaked = traffic::tshark_count(&leak_cap.stop(), "icmp && ip.len == 472")?;
    assert_eq!(leaked, 0, "red's site answered blue's CE");

    // Isolation: both customers ping the same VM address at once, and red's site through its
    // tunnel, with payload sizes that mark them (IPv4 total length 20 + 8 + size); each VM
    // sees only its own tenant's.
    let red_cap = traffic::capture(&red_vm.ns, &red_vm.ifname, "icmp", "red")?;
    let blue_cap = traffic::capture(&blue_vm.ns, &blue_vm.ifname, "icmp", "blue")?;
    let run = |ns: &Netns, size: u32, from: Option<IpAddr>| -> Result<()> {
        let mut opts = PingOptions::new(40, Duration::from_millis(10));
        opts.size = Some(size);
        opts.source = from;
        let p = traffic::ping(ns, vm_ip, &opts)?;
        assert!(p.all_received(), "size {size}: {p:?}");
        Ok(())
    };
    std::thread::scope(|scope| -> Result<()> {
        let a = scope.spawn(|| run(&red_ce, 111, None));
        let b = scope.spawn(|| run(&blue_ce, 222, None));
        let c = scope.spawn(|| run(&red_site.ns, 333, Some(red_site.lan_addr)));
        a.join().expect("red pinger")?;
        b.join().expect("blue pinger")?;
        c.join().expect("red site pinger")?;
        Ok(())
    })?;
    red_cap.wait_for_packets("icmp && ip.len == 139", 80, Duration::from_secs(10));
    red_cap.wait_for_packets("icmp && ip.len == 361", 80, Duration::from_secs(10));
    blue_cap.wait_for_packets("icmp && ip.len == 250", 80, Duration::from_secs(10));
    let (red, blue) = (red_cap.stop(), blue_cap.stop());
    let crossed = (
        traffic::tshark_count(&red, "icmp && ip.len == 250")?,
        traffic::tshark_count(&blue, "icmp && ip.len == 139")?
            + traffic::tshark_count(&blue, "icmp && ip.len == 361")?,
    );
    assert_eq!(
        crossed,
        (0, 0),
        "a customer's packets reached the other VNet"
    );
    let by_tunnel = traffic::tshark_count(&red, "icmp && ip.len == 361")?;
    assert!(
        by_tunnel >= 80,
        "red's site through the tunnel: {by_tunnel}"
    );
    let own = (
        traffic::tshark_count(&red, "icmp && ip.len == 139")?,
        traffic::tshark_count(&blue, "icmp && ip.len == 250")?,
    );
    assert!(own.0 >= 80 && own.1 >= 80, "own traffic missing: {own:?}");

    // TCP both ways between red's CE and its VM (checksums, MSS and the tagger's pace; a
    // figure for the log, not a target: the userspace tagger is the slow part of this path).
    // Nothing of the stream may be refused on the way: no frame too big for the tags'
    // MTU or the batch, no send refused by the kernel.
    let before_tcp = drops(&gw)?;
    let server = traffic::iperf3_server(&red_vm.ns, vm_ip, 5201)?;
    for reverse in [false, true] {
        let mut opts = IperfOptions::tcp(Duration::from_secs(2));
        opts.reverse = reverse;
        let r = traffic::iperf3_client(&red_ce, server.addr, &opts)?;
        eprintln!(
            "iperf3 red CE {} VM: {:.0} Mbit/s received, {:?} retransmits",
            if reverse { "<-" } else { "->" },
            r.received_bps / 1e6,
            r.retransmits
        );
        assert!(r.bytes_received > 0, "no TCP data crossed: {r:?}");
    }
    drop(server);
    let after_tcp = drops(&gw)?;
    for reason in ["too_big", "send_error", "truncated"] {
        let (a, b) = (
            before_tcp.get(reason).copied().unwrap_or(0),
            after_tcp.get(reason).copied().unwrap_or(0),
        );
        assert_eq!(a, b, "{reason} moved during the TCP runs");
    }

    // A customer with no attachment (S-tag 300): its frames are dropped and counted; nothing
    // answers it.
    let before = drops(&gw)?;
    let p = traffic::ping(
        &stranger,
        vm_ip,
        &PingOptions::new(3, Duration::from_millis(300)),
    )?;
    assert_eq!(p.received, 0, "an unknown tag pair got through: {p:?}");
    let base = before.get("attach_unknown_tags").copied().unwrap_or(0);
    let now = wait_drops(&gw, "attach_unknown_tags", base + 1)?;
    assert!(now > base, "attach_unknown_tags did not move: {now}");

    // A source outside what red's CE may send (its routes): dropped, counted, not forwarded.
    let spoofed = addr("172.16.0.9");
    red_ce.ip(["addr", "add", "172.16.0.9/32", "dev", "lo"])?;
    let base = before.get("attach_source").copied().unwrap_or(0);
    let p = traffic::ping(
        &red_ce,
        vm_ip,
        &PingOptions::new(3, Duration::from_millis(100)).from(spoofed),
    )?;
    assert_eq!(p.received, 0, "a spoofed source got through: {p:?}");
    let now = wait_drops(&gw, "attach_source", base + 3)?;
    assert!(now >= base + 3, "attach_source: {now} (before {base})");

    // An address in no route of red's VNet (nor of its tunnel): the CE's packets reach the
    // VNet and go no further, counted as no_route; blue's VNet does not see them either.
    red_ce.ip(["route", "add", "10.7.0.0/24", "via", GW_IP])?;
    let base = drops(&gw)?.get("no_route").copied().unwrap_or(0);
    let p = traffic::ping(
        &red_ce,
        addr("10.7.0.9"),
        &PingOptions::new(3, Duration::from_millis(100)),
    )?;
    assert_eq!(p.received, 0, "an address outside the VNet answered: {p:?}");
    let now = wait_drops(&gw, "no_route", base + 3)?;
    assert!(now >= base + 3, "no_route: {now} (before {base})");

    let nonzero: BTreeMap<String, u64> = drops(&gw)?.into_iter().filter(|(_, v)| *v > 0).collect();
    eprintln!("drops: {nonzero:?}");
    bed.teardown()?;
    Ok(())
}
