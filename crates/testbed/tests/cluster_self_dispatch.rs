//! Self-dispatch in the distributed form (issue 19) against real strongSwan 5.9 (and the first
//! test also against strongSwan 6 from Debian 13, `scripts/strongswan6.sh`): one control
//! node, three data nodes in `[cluster.dispatch] mode = "self"`, one steer node (the VIP, for
//! IKE and ESP from the site), two cloud hosts with unmodified kernel VXLAN devices (learning
//! on, one flood entry per data node VTEP, no dispatcher) and twelve VMs.
//!
//! Each VM's ARP request for its gateway reaches every data node; only the owner of the VM's
//! virtual MAC answers, with it. The tunnel has one CHILD_SA per data node (strongSwan shows
//! three with the same selectors), and each node seals what its VMs send with its own.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use common::*;

use protego_testbed::cluster::{ClusterSpec, ClusterStore, ProtegoCluster};
use protego_testbed::protego::GatewayTunnel;
use protego_testbed::strongswan::{strongswan6_daemon, summarize, CharonSettings, Flavor};
use protego_testbed::topology::{TopologySpec, VmSpec};
use protego_testbed::traffic::{self, IperfOptions, PingOptions};
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
            "[cluster.dispatch]\nmode = \"self\"\nvmacs = {VMACS}\nannounce_interval = \"1s\"\n\
             load_interval = \"500ms\"\nmove_interval = \"1s\"\nload_difference = 0.01\n"
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

/// The cluster in self mode with the hosts flooding to its data nodes, once the ring holds
/// the three nodes with every table confirmed; returns the last `ctl dispatch show`.
fn self_dispatch_up(cluster: &ProtegoCluster, topo: &Topology) -> Result<serde_json::Value> {
    let vteps: Vec<std::net::IpAddr> = cluster
        .data_node_names()
        .iter()
        .map(|n| cluster.underlay(n).map(|a| a.addr))
        .collect::<Result<_>>()?;
    topo.flood_to_data_nodes(&vteps)?;
    ring_of(cluster, 3)
}

/// The ring of three nodes, the site's strongSwan (5.9) up with a CHILD_SA on each node, and
/// every VM answering the site.
fn site_on_three_nodes(
    cluster: &ProtegoCluster,
    topo: &Topology,
    tun: &GatewayTunnel,
) -> Result<protego_testbed::strongswan::Charon> {
    self_dispatch_up(cluster, topo)?;
    let site = site_charon(topo, tun)?;
    site.initiate("net", UP)?;
    site.wait_child_installed("net", UP)?;
    children_on(cluster, 3)?;
    warm_up_within(topo, 0, Duration::from_secs(10))?;
    Ok(site)
}

/// Waits until the ring holds `n` nodes, each owning some virtual MACs, every table
/// confirmed; returns `ctl dispatch show`.
fn ring_of(cluster: &ProtegoCluster, n: usize) -> Result<serde_json::Value> {
    wait_for(
        &format!("a ring of {n} data nodes"),
        Duration::from_secs(20),
        || {
            let d = cluster.control("dispatch")?;
            let nodes = d["nodes"].as_array().cloned().unwrap_or_default();
            let ready = d["mode"] == "self"
                && nodes.len() == n
                && nodes.iter().all(|x| {
                    x["confirmed"] == true && x["owned"][VNI.to_string()].as_u64().unwrap_or(0) > 0
                });
            Ok(if ready {
                Probe::Ready(d)
            } else {
                Probe::NotYet(d.to_string())
            })
        },
    )
}

/// Waits until each of `n` data nodes holds a CHILD_SA of the tunnel; returns their
/// outbound SPIs by node.
fn children_on(cluster: &ProtegoCluster, n: usize) -> Result<BTreeMap<String, Vec<u32>>> {
    wait_for(
        &format!("a CHILD_SA on {n} data nodes"),
        Duration::from_secs(20),
        || {
            let held = outbound_spis(cluster)?;
            let holding = held.values().filter(|s| !s.is_empty()).count();
            Ok(if holding == n {
                Probe::Ready(held)
            } else {
                Probe::NotYet(format!("{held:?}"))
            })
        },
    )
}

/// Pings every VM from the site at once, `count` pings each `interval` apart; returns the
/// pings lost per VM.
fn ping_every_vm(topo: &Topology, count: u32, interval: Duration) -> Result<Vec<(String, u32)>> {
    let s = &topo.sites[0];
    let threads: Vec<_> = topo.tenants[0]
        .vms
        .iter()
        .map(|vm| {
            let (ns, src, dst) = (s.ns.clone(), s.lan_addr, vm.addr.addr);
            std::thread::spawn(move || {
                traffic::ping(&ns, dst, &PingOptions::new(count, interval).from(src))
                    .map(|p| (dst.to_string(), p.lost()))
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("a ping thread"))
        .collect()
}

/// One test of this file at a time: each runs a control node, three data nodes, a steer node,
/// two hosts with twelve VMs and a strongSwan site, and counts pings lost at 2-10 ms intervals
/// across joins, deaths, takeovers and moves. Four such clusters at once on a 2-vCPU machine
/// starve their nodes for tens of milliseconds, and a ping then goes missing in a move's
/// hand-over (seen in the fresh-machine run of stop 42, and again alone when run in parallel;
/// every test passes when they run one by one).
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn hosts_reach_three_data_nodes_without_a_dispatcher_and_each_seals_its_vms() -> Result<()> {
    three_data_nodes_seal(Flavor::Host)
}

#[test]
fn the_same_with_strongswan_6_as_the_site() -> Result<()> {
    if !testreq::need(
        &testreq::this_test(),
        strongswan6_daemon().is_some(),
        "strongSwan 6 is not installed",
        "scripts/setup.sh installs it (scripts/strongswan6.sh, Debian 13 in a root of its own)",
    ) {
        return Ok(());
    }
    three_data_nodes_seal(Flavor::Strongswan6)
}

/// Hosts reach three data nodes without a dispatcher, the site's strongSwan (`flavor`) holds
/// one CHILD_SA per data node, and each node seals what its VMs send.
fn three_data_nodes_seal(flavor: Flavor) -> Result<()> {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
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
        // The ring holds the three nodes, each with its share, every table confirmed.
        let show = self_dispatch_up(&cluster, &topo)?;
        let owned: u64 = show["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| n["owned"][VNI.to_string()].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(owned, u64::from(VMACS), "{show}");

        let settings = CharonSettings {
            flavor,
            ..CharonSettings::default()
        };
        let site = site_charon_with(&topo, &tun, "site0", &settings, |_| {})?;
        let version = site.swanctl(["--version", "--daemon"])?;
        eprintln!("site: {flavor:?}: {}", version.trim());
        if flavor == Flavor::Strongswan6 {
            assert!(
                version.contains(" 6."),
                "the site runs strongSwan 6: {version}"
            );
        }
        site.initiate("net", UP)?;
        site.wait_child_installed("net", UP)?;
        // One CHILD_SA per data node: control asks for the other two once the first is up.
        let held = children_on(&cluster, 3)?;
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
        // Each VM's ARP request reaches all three nodes (the host floods it to every data
        // node VTEP); exactly one answers, with that virtual MAC (tcpdump in the VM, decoded
        // by tshark).
        let gw = topo.tenants[0].gateway_ip;
        for (i, vm) in topo.tenants[0].vms.iter().enumerate() {
            let cap = traffic::capture(&vm.ns, "any", "arp", &format!("arp-vm{i}"))?;
            vm.ns.ip(["neigh", "flush", "to", &gw.to_string()])?;
            let ping = traffic::ping(
                &vm.ns,
                topo.sites[0].lan_addr,
                &PingOptions::new(1, Duration::from_millis(10)).from(vm.addr.addr),
            )?;
            assert!(ping.all_received(), "vm {}: {ping:?}", vm.addr);
            let replies = format!("arp.opcode == 2 && arp.src.proto_ipv4 == {gw}");
            cap.wait_for_packets(&replies, 1, Duration::from_secs(2));
            // Time for a second answer to arrive, were there one.
            std::thread::sleep(Duration::from_millis(200));
            let pcap = cap.stop();
            let rows = traffic::tshark_fields(&pcap, &replies, &["arp.src.hw_mac"])?;
            let requests = traffic::tshark_count(
                &pcap,
                &format!("arp.opcode == 1 && arp.dst.proto_ipv4 == {gw}"),
            )?;
            let mac = vm_gateway_mac(&topo, i)?.unwrap_or_default();
            assert!(
                requests >= 1
                    && rows.len() == requests
                    && rows.iter().all(|r| r.first() == Some(&mac)),
                "vm {}: {requests} ARP requests for the gateway, answered by {rows:?}: one \
                 answer each, from its virtual MAC {mac}",
                vm.addr
            );
        }

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
        // iperf3 (TCP, 2 s, 10 Mbit/s each) from all twelve VMs at once: every stream
        // arrives, each through the node owning its VM's virtual MAC.
        let mut servers = Vec::new();
        let mut streams = Vec::new();
        for (i, vm) in topo.tenants[0].vms.iter().enumerate() {
            let port = 5301 + i as u16;
            servers.push(traffic::iperf3_server(&s.ns, s.lan_addr, port)?);
            let (ns, src, dst) = (vm.ns.clone(), vm.addr.addr, s.lan_addr);
            streams.push(std::thread::spawn(move || {
                traffic::iperf3_client(
                    &ns,
                    dst,
                    &IperfOptions {
                        bind: Some(src),
                        port,
                        tcp_bitrate: Some(10_000_000),
                        ..IperfOptions::tcp(Duration::from_secs(2))
                    },
                )
                .map(|r| (src, r))
            }));
        }
        let mut total = 0.0;
        for t in streams {
            let (src, r) = t.join().expect("an iperf3 thread")?;
            assert!(r.bytes_received > 0, "vm {src}: nothing arrived: {r:?}");
            total += r.received_bps;
        }
        drop(servers);
        eprintln!(
            "iperf3 from the twelve VMs at once: {:.1} Mbit/s arrived in all",
            total / 1e6
        );
        Ok(())
    })
}

/// A data node killed: the ring gives its virtual MACs to its successor and the peer
/// deletes its CHILD_SA; every VM answers again. The node started again joins the ring once
/// it holds a CHILD_SA and takes its share back. Then a redistribution round under load
/// moves virtual MACs along the ring, and a drain takes a node out of it, losing nothing.
#[test]
fn a_killed_node_is_replaced_a_new_one_joins_and_moves_and_a_drain_lose_nothing() -> Result<()> {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, twelve_vms()?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let mut cluster = ProtegoCluster::start(
        &bed,
        &topo,
        std::slice::from_ref(&tun),
        &self_dispatch_spec(),
    )?;
    let result = (|| -> Result<()> {
        let _site = site_on_three_nodes(&cluster, &topo, &tun)?;

        // data2 dies while every VM is pinged every 10 ms.
        let pings = std::thread::scope(|scope| -> Result<Vec<(String, u32)>> {
            let pinger = scope.spawn(|| ping_every_vm(&topo, 300, Duration::from_millis(10)));
            std::thread::sleep(Duration::from_millis(800));
            cluster.kill("data2")?;
            pinger.join().expect("the pinger")
        })?;
        eprintln!("data2 killed: pings lost per VM (10 ms apart): {pings:?}");
        let show = ring_of(&cluster, 2)?;
        let moves = show["moves"].as_array().cloned().unwrap_or_default();
        assert!(
            moves
                .iter()
                .any(|m| m["why"] == "failed" && m["from"] == "data2"),
            "{show}"
        );
        ping_all_vms(&topo, 0, 5)?;

        // data2 comes back (a join) while every VM is pinged every 2 ms: nothing is lost.
        let pinger = {
            let topo = topo.clone();
            std::thread::spawn(move || ping_every_vm(&topo, 2500, Duration::from_millis(2)))
        };
        std::thread::sleep(Duration::from_millis(500));
        cluster.restart("data2")?;
        ring_of(&cluster, 3)?;
        let pings = pinger.join().expect("the pinger")?;
        // The peer sends on the CHILD_SA made for the joining node as soon as it answered,
        // before that node holds it: the steer node holds those packets until it is steered,
        // then releases them at once to a node whose neighbour cache is empty (its queue per
        // unresolved VM holds 64; with 8, one run in about ten lost 2 pings on several VMs).
        eprintln!("data2 joined: pings lost per VM (2 ms apart): {pings:?}");
        assert!(
            pings.iter().all(|(_, lost)| *lost == 0),
            "the join lost pings: {pings:?}"
        );
        children_on(&cluster, 3)?;
        ping_all_vms(&topo, 0, 5)?;

        // A redistribution round: while every VM is pinged every 2 ms, VM 0 starts sending
        // 20 Mbit/s and five others 2 Mbit/s to the site, so the nodes' loads usually come to
        // differ by more than the test's L_D and the ring moves virtual MACs: nothing is lost.
        let s = &topo.sites[0];
        let started = std::time::Instant::now();
        let pinger = {
            let topo = topo.clone();
            std::thread::spawn(move || ping_every_vm(&topo, 3000, Duration::from_millis(2)))
        };
        std::thread::sleep(Duration::from_millis(300));
        let mut servers = Vec::new();
        let mut iperfs = Vec::new();
        for (i, vm) in topo.tenants[0].vms.iter().take(6).enumerate() {
            let port = 5201 + i as u16;
            servers.push(traffic::iperf3_server(&s.ns, s.lan_addr, port)?);
            let (ns, src, dst) = (vm.ns.clone(), vm.addr.addr, s.lan_addr);
            let rate = if i == 0 { 20_000_000 } else { 2_000_000 };
            iperfs.push(std::thread::spawn(move || {
                traffic::iperf3_client(
                    &ns,
                    dst,
                    &IperfOptions {
                        udp_bitrate: Some(rate),
                        bind: Some(src),
                        port,
                        ..IperfOptions::tcp(Duration::from_secs(5))
                    },
                )
            }));
        }
        let pings = pinger.join().expect("the pinger")?;
        let window = started.elapsed();
        let show = cluster.control("dispatch")?;
        for i in iperfs {
            let _ = i.join();
        }
        drop(servers);
        let load_moves: Vec<&serde_json::Value> = show["moves"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| {
                m["why"] == "load"
                    && m["ago_ms"].as_u64().unwrap_or(u64::MAX) < window.as_millis() as u64
            })
            .collect();
        eprintln!("redistribution: moves during the pings {load_moves:?}; pings lost per VM (2 ms apart): {pings:?}");
        // Whether the ring moves in this window depends on the CPU each node measures (on a
        // busy 2-core machine the loads may stay within L_D): a move is not required here.
        // The core's tests drive load moves; the join and the drain go through the same
        // tables and hand-over, and are required to lose nothing.
        if load_moves.is_empty() {
            eprintln!("redistribution: no move along the ring in this run: {show}");
        }
        assert!(
            pings.iter().all(|(_, l)| *l == 0),
            "moves along the ring lose nothing: {pings:?}"
        );

        // data3 drained under 500 Hz pings to every VM: it leaves the ring, its virtual MACs
        // go to the others, then its CHILD_SA is deleted with the peer; nothing is lost.
        let pinger = {
            let topo = topo.clone();
            std::thread::spawn(move || ping_every_vm(&topo, 2000, Duration::from_millis(2)))
        };
        std::thread::sleep(Duration::from_millis(500));
        let answer = cluster.control("drain data3")?;
        assert!(answer.get("error").is_none(), "{answer}");
        ring_of(&cluster, 2)?;
        children_on(&cluster, 2)?;
        let pings = pinger.join().expect("the pinger")?;
        eprintln!("data3 drained: pings lost per VM (2 ms apart): {pings:?}");
        let show = cluster.control("dispatch")?;
        assert!(
            show["moves"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["why"] == "left" && m["from"] == "data3"),
            "{show}"
        );
        assert!(
            pings.iter().all(|(_, l)| *l == 0),
            "a drain loses nothing: {pings:?}"
        );
        Ok(())
    })();
    cluster.finish(result)
}

/// The active control node killed under 500 Hz pings to every VM: the standby takes over
/// (etcd), builds the ring again from the data nodes that reconnect and sends them tables
/// (many virtual MACs change hands at once); the data nodes forward with the tables they hold
/// meanwhile. Prints the pings lost per VM and the ring's moves; requires no VM to lose more
/// than the data-node failover bound (0.3 s: 150 pings) and every VM to answer afterwards.
/// Before old owners forwarded until the hosts had moved (a fixed `linger`), VMs whose
/// virtual MAC changed hands lost up to a second here.
#[test]
fn a_control_takeover_keeps_every_vm_reachable() -> Result<()> {
    if skip_without_etcd(&testreq::this_test()) {
        return Ok(());
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, twelve_vms()?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let spec = ClusterSpec {
        controls: 2,
        store: ClusterStore::Etcd,
        ..self_dispatch_spec()
    };
    let cluster = ProtegoCluster::start(&bed, &topo, std::slice::from_ref(&tun), &spec)?;
    with_logs(&cluster, || {
        let _site = site_on_three_nodes(&cluster, &topo, &tun)?;
        let before = cluster.control("dispatch")?;

        let (active, standby) = cluster.active_and_standby()?;
        let pinger = {
            let topo = topo.clone();
            std::thread::spawn(move || ping_every_vm(&topo, 2000, Duration::from_millis(2)))
        };
        std::thread::sleep(Duration::from_millis(500));
        cluster.kill(&active)?;
        let data: Vec<String> = cluster.data_node_names();
        let names: Vec<&str> = data.iter().map(String::as_str).collect();
        cluster.wait_alive(&names, Duration::from_secs(15))?;
        let pings = pinger.join().expect("the pinger")?;
        assert_eq!(cluster.active_control()?, standby);
        let after = ring_of(&cluster, 3)?;
        eprintln!(
            "control {active} killed, {standby} active: pings lost per VM (2 ms apart): {pings:?}"
        );
        let owned = |d: &serde_json::Value| -> BTreeMap<String, u64> {
            d["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|n| {
                    (
                        n["name"].as_str().unwrap_or_default().to_owned(),
                        n["owned"][VNI.to_string()].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        };
        eprintln!(
            "virtual MACs per node before {:?}, after {:?}; moves after: {}",
            owned(&before),
            owned(&after),
            after["moves"]
        );
        for (vm, lost) in &pings {
            assert!(
                *lost <= 150,
                "vm {vm} lost {lost} pings (2 ms apart) at the takeover: {pings:?}"
            );
        }
        ping_all_vms(&topo, 0, 3)?;
        Ok(())
    })
}
