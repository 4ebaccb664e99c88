//! Interop of Protego (`protego up`) with real strongSwan 5.9 peers (kernel-libipsec,
//! `encap = yes`) and unmodified Linux VXLAN hosts, in network namespaces: IKEv2 (RFC 7296),
//! ESP in UDP (RFC 4303, RFC 3948), VXLAN (RFC 7348).
//!
//! Every test builds its own topology (unique names) and removes it, also on failure.
//! Needs root and the tools from `scripts/setup.sh`, and the `protego` binary built in the
//! same profile (`make test` does both).

mod common;

use std::time::Duration;

use common::*;

use protego_testbed::protego::{GatewayTunnel, ProtegoGateway};
use protego_testbed::strongswan::CharonSettings;
use protego_testbed::topology::VmSpec;
use protego_testbed::traffic::{self, PingOptions};
use protego_testbed::{Result, Testbed, Topology, TopologySpec};

#[test]
fn strongswan_initiates_traffic_reaches_vms_over_vxlan() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    let site = site_charon(&topo, &tun)?;
    site.initiate("net", UP)?;
    let child = site.wait_child_installed("net", UP)?;
    assert!(
        child.fields.values().any(|v| v.contains("AES_GCM_16")),
        "{child:?}"
    );

    // Underlay capture: the hosts must see real VXLAN with the tenant's VNI.
    let cap = traffic::capture(
        &topo.gateway.ns,
        &topo.gateway.underlay_if,
        "udp port 4789",
        "underlay",
    )?;
    ping_all_vms(&topo, 0, 30)?;
    // Every request and reply crossed the underlay in VXLAN (ping_all_vms checks that each of
    // the 2 × 30 requests got its reply; the CHILD_SA was installed and the gateway's ARP is
    // resolved by then, and a packet waiting for it is queued, not lost): 120 frames. What may
    // lag is tcpdump, which under load has not always read the last ones when ping returns.
    cap.wait_for_packets("vxlan && icmp", 120, Duration::from_secs(10));
    let pcap = cap.stop();
    let rows = traffic::tshark_fields(&pcap, "vxlan && icmp", &["vxlan.vni"])?;
    assert!(
        rows.len() >= 120,
        "expected >= 120 VXLAN ICMP frames, saw {}",
        rows.len()
    );
    assert!(
        rows.iter()
            .all(|r| r.first().map(String::as_str) == Some("4242")),
        "{rows:?}"
    );

    // A VM can reach the site too (traffic started inside the VNet); TCP through the tunnel.
    let perf = back_and_tcp(&topo, 0)?;
    eprintln!(
        "protego: iperf3 {:.0} Mbit/s site -> VM",
        perf.received_bps / 1e6
    );

    let st = tunnel_status(&gw, &tun.name)?;
    assert_eq!(st["state"], "established", "{st}");
    eprintln!("{}", gw.status_text()?);
    bed.teardown()?;
    Ok(())
}

#[test]
fn protego_initiates() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let mut tun = GatewayTunnel::for_site(&topo, 0, PSK);
    tun.start_action = "start";
    tun.proposals = vec!["aes128gcm16-prfsha256-ecp256".into()];
    tun.esp_proposals = vec!["aes128gcm16".into()];
    // The site must be listening before Protego initiates.
    let site = site_charon(&topo, &tun)?;
    let _gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    site.wait_child_installed("net", UP)?;
    let sas = site.list_sas()?;
    assert_eq!(sas.len(), 1, "{sas:?}");
    assert_eq!(
        sas[0].fields.get("dh-group").map(String::as_str),
        Some("ECP_256"),
        "{sas:?}"
    );
    ping_all_vms(&topo, 0, 20)?;
    bed.teardown()?;
    Ok(())
}

#[test]
fn strongswan_behind_nat() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(true)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    let site = site_charon(&topo, &tun)?;
    site.initiate("net", UP)?;
    site.wait_child_installed("net", UP)?;
    ping_all_vms(&topo, 0, 30)?;
    let st = tunnel_status(&gw, &tun.name)?;
    let nat = topo.sites[0].nat.as_ref().expect("site behind NAT");
    let remote = st["ike_sas"][0]["remote"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(remote.contains(&nat.outside.addr.to_string()), "{st}");
    bed.teardown()?;
    Ok(())
}

#[test]
fn two_tenants_with_overlapping_addresses_are_isolated() -> Result<()> {
    let bed = Testbed::new()?;
    // Same site LAN (10.1.0.0/24) and same VNet (10.2.0.0/24) for both tenants, VMs of both on
    // the same host; only the VNI and the tunnel tell them apart.
    let spec = TopologySpec {
        tenants: vec![
            tenant("red", 1001, false, vec![VmSpec { host: 0 }])?,
            tenant("blue", 1002, false, vec![VmSpec { host: 0 }])?,
        ],
        hosts: 1,
        ..TopologySpec::default()
    };
    let topo = Topology::build(&bed, spec)?;
    let tuns = [
        GatewayTunnel::for_site(&topo, 0, "red-psk-0123456789"),
        GatewayTunnel::for_site(&topo, 1, "blue-psk-0123456789"),
    ];
    let _gw = ProtegoGateway::start(&bed, &topo, &tuns, &[])?;
    let sites = [site_charon(&topo, &tuns[0])?, site_charon(&topo, &tuns[1])?];
    for s in &sites {
        s.initiate("net", UP)?;
    }
    for s in &sites {
        s.wait_child_installed("net", UP)?;
    }
    // Both VMs have the same address; capture each VM's interface to prove who got what.
    let red_vm = &topo.tenants[0].vms[0];
    let blue_vm = &topo.tenants[1].vms[0];
    assert_eq!(
        red_vm.addr.addr, blue_vm.addr.addr,
        "the test needs overlapping addresses"
    );
    let red_cap = traffic::capture(&red_vm.ns, &red_vm.ifname, "icmp", "red")?;
    let blue_cap = traffic::capture(&blue_vm.ns, &blue_vm.ifname, "icmp", "blue")?;
    // Distinct payload sizes mark each tenant's pings (IPv4 total length 20 + 8 + size).
    let run = |site: usize, size: u32| -> Result<()> {
        let s = &topo.sites[site];
        let mut opts = PingOptions::new(40, Duration::from_millis(10)).from(s.lan_addr);
        opts.size = Some(size);
        let p = traffic::ping(&s.ns, red_vm.addr.addr, &opts)?;
        assert!(p.all_received(), "site {site}: {p:?}");
        Ok(())
    };
    std::thread::scope(|scope| -> Result<()> {
        let a = scope.spawn(|| run(0, 111));
        let b = scope.spawn(|| run(1, 222));
        a.join().expect("red pinger")?;
        b.join().expect("blue pinger")?;
        Ok(())
    })?;
    // Each site's 40 pings were answered: at least 80 of its packets reached the VM's
    // interface; tcpdump may not have read the last ones yet.
    red_cap.wait_for_packets("icmp && ip.len == 139", 80, Duration::from_secs(10));
    blue_cap.wait_for_packets("icmp && ip.len == 250", 80, Duration::from_secs(10));
    let red = red_cap.stop();
    let blue = blue_cap.stop();
    let red_other = traffic::tshark_count(&red, "icmp && ip.len == 250")?;
    let blue_other = traffic::tshark_count(&blue, "icmp && ip.len == 139")?;
    let red_own = traffic::tshark_count(&red, "icmp && ip.len == 139")?;
    let blue_own = traffic::tshark_count(&blue, "icmp && ip.len == 250")?;
    assert_eq!(
        (red_other, blue_other),
        (0, 0),
        "a tenant saw the other's packets"
    );
    assert!(
        red_own >= 80 && blue_own >= 80,
        "own traffic missing: red {red_own}, blue {blue_own}"
    );
    bed.teardown()?;
    Ok(())
}

/// Every ESP transform and every key exchange group, each in its own IKE SA: strongSwan
/// initiates, the CHILD_SA carries pings, strongSwan reports the expected algorithms.
#[test]
fn every_transform_and_group() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    // (IKE proposal, ESP proposal, strongSwan's encr-alg, encr-keysize, integ-alg, dh-group)
    let cases = [
        (
            "aes256gcm16-prfsha256-x25519",
            "aes256gcm16",
            "AES_GCM_16",
            "256",
            None,
            "CURVE_25519",
        ),
        (
            "aes128gcm16-prfsha256-ecp256",
            "aes128gcm16",
            "AES_GCM_16",
            "128",
            None,
            "ECP_256",
        ),
        (
            "aes256gcm16-prfsha384-ecp384",
            "chacha20poly1305",
            "CHACHA20_POLY1305",
            "256",
            None,
            "ECP_384",
        ),
        (
            "aes256-sha256-modp2048",
            "aes128-sha256",
            "AES_CBC",
            "128",
            Some("HMAC_SHA2_256_128"),
            "MODP_2048",
        ),
        (
            "aes128-sha1-x25519",
            "aes256-sha384",
            "AES_CBC",
            "256",
            Some("HMAC_SHA2_384_192"),
            "CURVE_25519",
        ),
        (
            "chacha20poly1305-prfsha512-x25519",
            "aes256-sha512",
            "AES_CBC",
            "256",
            Some("HMAC_SHA2_512_256"),
            "CURVE_25519",
        ),
        (
            "aes256-sha384-ecp256",
            "aes128-sha1",
            "AES_CBC",
            "128",
            Some("HMAC_SHA1_96"),
            "ECP_256",
        ),
    ];
    for (k, (ike, esp, encr, keysize, integ, group)) in cases.iter().enumerate() {
        let mut tun = GatewayTunnel::for_site(&topo, 0, PSK);
        tun.proposals = vec![(*ike).into()];
        tun.esp_proposals = vec![(*esp).into()];
        let gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
        let label = format!("site-case{k}");
        let site = site_charon_with(&topo, &tun, &label, &CharonSettings::default(), |_| {})?;
        site.initiate("net", UP)?;
        let child = site.wait_child_installed("net", UP)?;
        let sas = site.list_sas()?;
        let got_group = sas[0].fields.get("dh-group").cloned().unwrap_or_default();
        assert_eq!(got_group, *group, "case {ike} / {esp}: {sas:?}");
        let field = |k: &str| child.fields.get(k).map(String::as_str);
        assert_eq!(
            field("encr-alg"),
            Some(*encr),
            "case {ike} / {esp}: {child:?}"
        );
        if *encr != "CHACHA20_POLY1305" {
            assert_eq!(
                field("encr-keysize"),
                Some(*keysize),
                "case {ike} / {esp}: {child:?}"
            );
        }
        assert_eq!(field("integ-alg"), *integ, "case {ike} / {esp}: {child:?}");
        ping_all_vms(&topo, 0, 10)?;
        site.stop();
        gw.stop();
    }
    bed.teardown()?;
    Ok(())
}

/// strongSwan rekeys the CHILD_SA and the IKE SA while a 100 Hz ping runs: no ping is lost.
#[test]
fn peer_rekeys_under_ping_lose_nothing() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let _gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    let site = site_charon(&topo, &tun)?;
    site.initiate("net", UP)?;
    let first = site.wait_child_installed("net", UP)?;
    let s = &topo.sites[0];
    let vm = &topo.tenants[0].vms[0];
    std::thread::scope(|scope| -> Result<()> {
        let pinger = scope.spawn(|| {
            traffic::ping(
                &s.ns,
                vm.addr.addr,
                &PingOptions::new(300, Duration::from_millis(10)).from(s.lan_addr),
            )
        });
        std::thread::sleep(Duration::from_millis(500));
        site.rekey_child("net")?;
        let second = site.wait_child_rekeyed("net", &first.spi_in, UP)?;
        std::thread::sleep(Duration::from_millis(500));
        let ike = site.list_sas()?[0].name.clone();
        site.rekey_ike(&ike)?;
        std::thread::sleep(Duration::from_millis(500));
        site.rekey_child("net")?;
        site.wait_child_rekeyed("net", &second.spi_in, UP)?;
        let ping = pinger.join().expect("pinger")?;
        assert!(ping.all_received(), "lost pings across rekeys: {ping:?}");
        Ok(())
    })?;
    let sas = site.list_sas()?;
    assert_eq!(
        sas.len(),
        1,
        "exactly one IKE SA after the IKE rekey: {sas:?}"
    );
    bed.teardown()?;
    Ok(())
}

/// The peer dies: DPD clears the tunnel. The peer comes back: the tunnel is re-established
/// (Protego initiates again with `dpd_action = "restart"` and `start_action = "start"`).
#[test]
fn dpd_clears_dead_peer_and_restart_brings_it_back() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let mut tun = GatewayTunnel::for_site(&topo, 0, PSK);
    tun.start_action = "start";
    tun.extra = vec![
        "dpd_delay = \"1s\"".into(),
        "dpd_action = \"restart\"".into(),
    ];
    let gateway_opts = [
        "retransmit_timeout = \"1s\"".to_owned(),
        "retransmit_base = 1.2".to_owned(),
        "retransmit_tries = 2".to_owned(),
    ];
    let site = site_charon(&topo, &tun)?;
    let gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &gateway_opts)?;
    site.wait_child_installed("net", UP)?;
    ping_all_vms(&topo, 0, 5)?;

    // Kill the peer without a DELETE: only DPD can notice.
    site.process().signal(SIGKILL);
    let deadline = std::time::Instant::now() + UP;
    loop {
        let st = tunnel_status(&gw, &tun.name)?;
        if st["state"] != "established" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "DPD did not clear the tunnel: {st}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        gw.log().contains("dpd"),
        "no DPD line in the log:\n{}",
        gw.log()
    );

    // The peer comes back; Protego re-initiates.
    let back = site_charon_with(
        &topo,
        &tun,
        "site0-again",
        &CharonSettings::default(),
        |_| {},
    )?;
    back.wait_child_installed("net", Duration::from_secs(30))?;
    ping_all_vms(&topo, 0, 10)?;
    bed.teardown()?;
    Ok(())
}

/// The site's NAT rebinds (new outside port) between two 100 Hz pings: the first ESP from the
/// new port moves the tunnel there (RFC 7296 §2.23, RFC 3948), without waiting for an IKE
/// message, so not even the answer to that first packet is lost; IKE exchanges (a CHILD
/// rekey) still work afterwards. The rebinding happens while no packet is in flight: an answer
/// travelling toward the old mapping at the instant the NAT forgets it is lost whatever the
/// gateway does.
#[test]
fn nat_rebinding_moves_the_tunnel_to_the_new_port() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(true)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    let site = site_charon(&topo, &tun)?;
    site.initiate("net", UP)?;
    let first = site.wait_child_installed("net", UP)?;
    ping_all_vms(&topo, 0, 5)?;
    let nat = topo.sites[0].nat.as_ref().expect("site behind NAT");
    let remote_of = |st: &serde_json::Value| {
        st["ike_sas"][0]["remote"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let before = remote_of(&tunnel_status(&gw, &tun.name)?);

    nat.ns.rebind_masquerade(&nat.outside_if, (31000, 31999))?;
    let s = &topo.sites[0];
    let vm = &topo.tenants[0].vms[0];
    let ping = traffic::ping(
        &s.ns,
        vm.addr.addr,
        &PingOptions::new(300, Duration::from_millis(10)).from(s.lan_addr),
    )?;
    let after = remote_of(&tunnel_status(&gw, &tun.name)?);
    assert_ne!(before, after, "the peer's port did not change");
    assert!(
        after.starts_with(&nat.outside.addr.to_string()),
        "{before} -> {after}"
    );
    let port: u16 = after
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_default();
    assert!((31000..=31999).contains(&port), "{before} -> {after}");
    assert!(
        ping.all_received(),
        "pings lost across the NAT rebinding ({before} -> {after}): {ping:?}"
    );
    // IKE follows too: a rekey started by the peer goes through the new mapping.
    site.rekey_child("net")?;
    site.wait_child_rekeyed("net", &first.spi_in, UP)?;
    ping_all_vms(&topo, 0, 10)?;
    bed.teardown()?;
    Ok(())
}

/// Inner IPv6 next to IPv4 in one CHILD_SA (dual-stack selectors): ping6 from the site's IPv6
/// LAN reaches VMs on both hosts through the tunnel and the VXLAN overlay (neighbour discovery
/// by the gateway for its IPv4 and IPv6 addresses in the dual-stack VNet), and back.
#[test]
fn inner_ipv6_and_ipv4_share_the_tunnel() -> Result<()> {
    let bed = Testbed::new()?;
    let mut spec = one_tenant(false)?;
    spec.tenants[0].vnet6 = Some("fd00:2::/64".parse()?);
    spec.tenants[0].sites[0].lan6 = Some("fd00:1::/64".parse()?);
    let topo = Topology::build(&bed, spec)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    let site = site_charon(&topo, &tun)?;
    site.initiate("net", UP)?;
    site.wait_child_installed("net", UP)?;
    ping_all_vms(&topo, 0, 10)?;
    let s = &topo.sites[0];
    let from6 = s.lan6_addr.expect("site has an IPv6 LAN");
    for vm in &topo.tenants[0].vms {
        let to6 = vm.addr6.expect("VM has an IPv6 address").addr;
        let p = traffic::ping(
            &s.ns,
            to6,
            &PingOptions::new(20, Duration::from_millis(10)).from(from6),
        )?;
        assert!(
            p.all_received(),
            "site -> vm {to6}: {p:?}\n{}",
            gw.status_text()?
        );
    }
    let vm = &topo.tenants[0].vms[1];
    let back = traffic::ping(
        &vm.ns,
        from6,
        &PingOptions::new(10, Duration::from_millis(10)),
    )?;
    assert!(back.all_received(), "vm -> site over IPv6: {back:?}");
    bed.teardown()?;
    Ok(())
}

/// IKE and ESP over an IPv6 WAN, carrying IPv4 and IPv6 inside (RFC 4303 tunnel mode with
/// every combination of outer and inner version that the site uses).
#[test]
fn outer_ipv6_carries_ipv4_and_ipv6() -> Result<()> {
    let bed = Testbed::new()?;
    let mut spec = one_tenant(false)?;
    spec.tenants[0].vnet6 = Some("fd00:2::/64".parse()?);
    spec.tenants[0].sites[0].lan6 = Some("fd00:1::/64".parse()?);
    let topo = Topology::build(&bed, spec)?;
    let mut tun = GatewayTunnel::for_site(&topo, 0, PSK);
    tun.outer_ipv6 = true;
    let gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    let (site6, gw6) = (topo.sites[0].addr6.addr, topo.gateway.wan6.addr);
    let site = site_charon_with(
        &topo,
        &tun,
        "site0-v6",
        &CharonSettings::default(),
        |conn| {
            conn.local_addrs = vec![site6.to_string()];
            conn.remote_addrs = vec![gw6.to_string()];
        },
    )?;
    site.initiate("net", UP)?;
    site.wait_child_installed("net", UP)?;
    let st = tunnel_status(&gw, &tun.name)?;
    let remote = st["ike_sas"][0]["remote"].as_str().unwrap_or_default();
    assert!(remote.contains(&site6.to_string()), "{st}");
    let cap = traffic::capture(
        &topo.gateway.ns,
        &topo.gateway.wan_if,
        "ip6 and udp port 4500",
        "wan6",
    )?;
    ping_all_vms(&topo, 0, 10)?;
    let s = &topo.sites[0];
    let from6 = s.lan6_addr.expect("site has an IPv6 LAN");
    for vm in &topo.tenants[0].vms {
        let to6 = vm.addr6.expect("VM has an IPv6 address").addr;
        let p = traffic::ping(
            &s.ns,
            to6,
            &PingOptions::new(10, Duration::from_millis(10)).from(from6),
        )?;
        assert!(p.all_received(), "site -> vm {to6}: {p:?}");
    }
    // Every ping was answered (checked above): 2 VMs × 2 families × 10 requests and their
    // replies crossed the WAN as ESP. tcpdump may not have read the last ones yet.
    cap.wait_for_packets("ipv6 && esp", 80, Duration::from_secs(10));
    let pcap = cap.stop();
    let esp = traffic::tshark_count(&pcap, "ipv6 && esp")?;
    assert!(
        esp >= 80,
        "expected the pings as ESP over IPv6 on the WAN, saw {esp} packets"
    );
    bed.teardown()?;
    Ok(())
}

/// A site with the wrong PSK, then one claiming an identity no tunnel expects: strongSwan is
/// told AUTHENTICATION_FAILED (RFC 7296 §2.21.2), Protego keeps no IKE SA and counts both;
/// the right site still connects afterwards.
#[test]
fn wrong_psk_or_identity_is_refused_without_state() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    type Edit = fn(&mut protego_testbed::strongswan::Connection);
    let cases: [(&str, Edit); 2] = [
        ("wrong PSK", |conn| conn.psk = "not-the-interop-psk".into()),
        ("wrong identity", |conn| {
            conn.local_id = "intruder.protego.test".into()
        }),
    ];
    for (what, edit) in cases {
        // One charon at a time: they share the site's ports.
        let label = format!("site0-{}", what.replace(' ', "-"));
        let site = site_charon_with(&topo, &tun, &label, &CharonSettings::default(), edit)?;
        assert!(
            site.initiate("net", UP).is_err(),
            "{what}: the tunnel came up"
        );
        assert!(
            site.log().contains("AUTHENTICATION_FAILED"),
            "{what}: strongSwan was not told AUTHENTICATION_FAILED:\n{}",
            site.log()
        );
        assert!(site.list_sas()?.is_empty(), "{what}");
        site.stop();
        let st = tunnel_status(&gw, &tun.name)?;
        let sas = st["ike_sas"].as_array().map_or(0, Vec::len);
        assert_eq!(sas, 0, "{what}: state left behind: {st}");
    }
    let status = gw.status_json()?;
    assert_eq!(status["ike_drops"]["auth_failed"], 2, "{status}");
    let site = site_charon(&topo, &tun)?;
    site.initiate("net", UP)?;
    site.wait_child_installed("net", UP)?;
    ping_all_vms(&topo, 0, 5)?;
    bed.teardown()?;
    Ok(())
}
