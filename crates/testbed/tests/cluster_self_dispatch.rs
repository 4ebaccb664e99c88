//! Self-dispatch in the distributed form (issue 19) against real strongSwan 5.9: one control
//! node, three data nodes in `[cluster.dispatch] mode = "self"`, one steer node (the VIP, for
//! IKE and ESP from the site), two cloud hosts with unmodified kernel VXLAN devices (learning
//! on, one flood entry per data node VTEP, no dispatcher) and twelve VMs.
//!
//! Each VM's ARP request for its gateway reaches every data node; only the owner of the VM's
//! virtual MAC answers, with it. The tunnel has one CHILD_SA per data node (strongSwan shows
//! three with the same selectors), and each node seals what its VMs send with its own.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;

use protego_testbed::cluster::{ClusterSpec, ProtegoCluster};
use protego_testbed::protego::GatewayTunnel;
use protego_testbed::strongswan::summarize;
use protego_testbed::topology::{TopologySpec, VmSpec};
use protego_testbed::traffic::{self, PingOptions};
use protego_testbed::wait::{wait_for, Probe};
use protego_testbed::{Result, Testbed, Topology};

/// K of the test's VNet.
const VMACS: u32 = 64;
/// The VNI of `one_tenant`'s VNet.
const VNI: u32 = 4242;

/// One tenant, one site, twelve VMs over two hosts.
fn twelve_vms() -> Result<TopologySpec> {
    Ok(TopologySpec {
        tenants: vec![tenant(
            "t1",
            VNI,
            false,
            (0..12).map(|i| VmSpec { host: i % 2 }).collect(),
        )?],
        hosts: 2,
        ..TopologySpec::default()
    })
}

fn self_dispatch_spec() -> ClusterSpec {
    ClusterSpec {
        data: 3,
        extra_tables: format!(
            "[cluster.dispatch]\nmode = \"self\"\nvmacs = {VMACS}\nannounce_interval = \"1s\"\n"
        ),
        ..ClusterSpec::default()
    }
}

/// An SPI as `ctl nodes` (`0x…`) or swanctl (`c1a2…`) writes it.
fn spi(text: &str) -> Option<u32> {
    u32::from_str_radix(text.trim_start_matches("0x"), 16).ok()
}

/// Per data node, the outbound SPIs of the CHILD_SAs it holds (`ctl nodes`).
fn outbound_spis(cluster: &ProtegoCluster) -> Result<BTreeMap<String, Vec<u32>>> {
    let nodes = cluster.nodes()?;
    let mut out = BTreeMap::new();
    for n in nodes["nodes"].as_array().into_iter().flatten() {
        if n["role"] != "data" {
            continue;
        }
        let spis = n["child_sas"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.as_str()?.split_once('/').and_then(|(_, o)| spi(o)))
            .collect();
        out.insert(n["name"].as_str().unwrap_or("?").to_owned(), spis);
    }
    Ok(out)
}

/// The MAC VM `vm` resolved its gateway address to (its neighbour table).
fn vm_gateway_mac(topo: &Topology, vm: usize) -> Result<Option<String>> {
    let t = &topo.tenants[0];
    let v = &t.vms[vm];
    let out =
        v.ns.ip(["-j", "neigh", "show", &t.gateway_ip.to_string()])?;
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    Ok(doc
        .as_array()
        .and_then(|a| a.first())
        .and_then(|n| n["lladdr"].as_str())
        .map(str::to_owned))
}

#[test]
fn hosts_reach_three_data_nodes_without_a_dispatcher_and_each_seals_its_vms() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, twelve_vms()?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let cluster = ProtegoCluster::start(
        &bed,
        &topo,
        std::slice::from_ref(&tun),
        &self_dispatch_spec(),
    )?;
    with_logs(&cluster, || {
        let vteps: Vec<std::net::IpAddr> = cluster
            .data_node_names()
            .iter()
            .map(|n| cluster.underlay(n).map(|a| a.addr))
            .collect::<Result<_>>()?;
        topo.flood_to_data_nodes(&vteps)?;
        // The ring holds the three nodes, each with its share, every table confirmed.
        let show = wait_for(
            "the ring of three data nodes",
            Duration::from_secs(10),
            || {
                let d = cluster.control("dispatch")?;
                let nodes = d["nodes"].as_array().cloned().unwrap_or_default();
                let ready = d["mode"] == "self"
                    && nodes.len() == 3
                    && nodes.iter().all(|n| {
                        n["confirmed"] == true
                            && n["owned"][VNI.to_string()].as_u64().unwrap_or(0) > 0
                    });
                Ok(if ready {
                    Probe::Ready(d)
                } else {
                    Probe::NotYet(d.to_string())
                })
            },
        )?;
        let owned: u64 = show["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| n["owned"][VNI.to_string()].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(owned, u64::from(VMACS), "{show}");

        let site = site_charon(&topo, &tun)?;
        site.initiate("net", UP)?;
        site.wait_child_installed("net", UP)?;
        // One CHILD_SA per data node: control asks for the other two once the first is up.
        let held = wait_for(
            "a CHILD_SA on every data node",
            Duration::from_secs(20),
            || {
                let held = outbound_spis(&cluster)?;
                Ok(if held.len() == 3 && held.values().all(|s| !s.is_empty()) {
                    Probe::Ready(held)
                } else {
                    Probe::NotYet(format!("{held:?}"))
                })
            },
        )?;
        let sas = site.list_sas()?;
        let children: Vec<_> = sas
            .iter()
            .flat_map(|ike| ike.children.iter())
            .filter(|c| c.state == "INSTALLED")
            .collect();
        assert!(
            children.len() >= 3,
            "strongSwan holds the parallel CHILD_SAs: {}",
            summarize(&sas)
        );
        assert!(
            children
                .iter()
                .all(|c| c.local_ts == children[0].local_ts && c.remote_ts == children[0].remote_ts),
            "{}",
            summarize(&sas)
        );

        // Every VM answers the site, through the node owning its virtual MAC.
        warm_up_within(&topo, 0, Duration::from_secs(10))?;
        ping_all_vms(&topo, 0, 5)?;
        // Each VM's gateway is a virtual MAC (02:VV:VV:VV:II:II of this VNI), never the
        // gateway MAC of steer mode.
        let vni_prefix = format!(
            "02:{:02x}:{:02x}:{:02x}:",
            (VNI >> 16) & 0xff,
            (VNI >> 8) & 0xff,
            VNI & 0xff
        );
        let mut macs = BTreeSet::new();
        for vm in 0..topo.tenants[0].vms.len() {
            let mac = vm_gateway_mac(&topo, vm)?.unwrap_or_default();
            assert!(
                mac.starts_with(&vni_prefix),
                "vm {vm}: gateway at {mac:?}, not a virtual MAC of VNI {VNI}"
            );
            macs.insert(mac);
        }
        assert!(macs.len() > 1, "the VMs' virtual MACs: {macs:?}");

        // Each node that owns some VM's virtual MAC sealed with its own CHILD_SA: strongSwan
        // received on the SA whose SPI is that node's outbound one.
        let sas = site.list_sas()?;
        let received: BTreeMap<u32, u64> = sas
            .iter()
            .flat_map(|ike| ike.children.iter())
            .filter_map(|c| Some((spi(&c.spi_in)?, c.packets_in)))
            .collect();
        let sealing: Vec<&String> = held
            .iter()
            .filter(|(_, spis)| {
                spis.iter()
                    .any(|s| received.get(s).copied().unwrap_or(0) > 0)
            })
            .map(|(n, _)| n)
            .collect();
        eprintln!(
            "virtual MACs in use: {}; nodes sealing: {sealing:?}; {}",
            macs.len(),
            summarize(&sas)
        );
        assert!(
            sealing.len() >= 2,
            "more than one data node seals the tunnel's traffic: {sealing:?}, {}",
            summarize(&sas)
        );
        // Pings from every VM too (their ARP goes first).
        let s = &topo.sites[0];
        for vm in &topo.tenants[0].vms {
            let ping = traffic::ping(
                &vm.ns,
                s.lan_addr,
                &PingOptions::new(3, Duration::from_millis(10)).from(vm.addr.addr),
            )?;
            assert!(ping.all_received(), "vm {} -> site: {ping:?}", vm.addr);
        }
        Ok(())
    })
}
