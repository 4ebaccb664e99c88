//! Protego's distributed form against real strongSwan 5.9: one control node, two data nodes
//! and one steer node in their own network namespaces (`protego control|data|steer`), the
//! steer node owning the VIP and the VTEP address the cloud hosts send to.
//!
//! strongSwan's IKE reaches the control node through the steer node (Geneve), the CHILD_SA
//! is placed on a data node, ESP is steered to it by SPI and VXLAN from the VMs by selector.

mod common;

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use common::*;

use protego_testbed::cluster::{ClusterSpec, ClusterStore, ProtegoCluster};
use protego_testbed::protego::GatewayTunnel;
use protego_testbed::strongswan::summarize;
use protego_testbed::traffic::{self, IperfOptions, PingOptions};
use protego_testbed::wait::{wait_for, Probe};
use protego_testbed::{Cmd, Result, Testbed, Topology};

/// Starts the standard cluster (one control, two data nodes, one steer node) for one
/// tenant's site and brings its tunnel up from strongSwan.
fn up(bed: &Testbed) -> Result<(Topology, GatewayTunnel, ProtegoCluster)> {
    let topo = Topology::build(bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let cluster = ProtegoCluster::start(
        bed,
        &topo,
        std::slice::from_ref(&tun),
        &ClusterSpec::default(),
    )?;
    Ok((topo, tun, cluster))
}

/// Every ESP packet of a capture as (SPI, sequence number); fails on a repeated pair, the
/// sign of a reused sequence number (RFC 4303 §3.3.3), across every SA the migrations made.
fn assert_no_sequence_reused(pcap: &std::path::Path) -> Result<usize> {
    let rows = traffic::tshark_fields(pcap, "esp", &["esp.spi", "esp.sequence"])?;
    let mut seen: HashMap<(String, String), usize> = HashMap::new();
    for r in &rows {
        *seen.entry((r[0].clone(), r[1].clone())).or_default() += 1;
    }
    let repeated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(
        repeated.is_empty(),
        "ESP (SPI, sequence) pairs seen more than once: {repeated:?}"
    );
    Ok(rows.len())
}

/// The data node holding the tunnel's CHILD_SAs, if exactly one does.
fn holder(cluster: &ProtegoCluster) -> Result<Option<String>> {
    cluster.sa_holder()
}

/// Two tenants (`ta` VNI 4301, `tb` VNI 4302 with its own VNet and site LAN), one VM each on
/// its own host.
fn two_tenants() -> Result<protego_testbed::TopologySpec> {
    let mut second = tenant(
        "tb",
        4302,
        false,
        vec![protego_testbed::topology::VmSpec { host: 1 }],
    )?;
    second.vnet = "10.3.0.0/24".parse()?;
    second.sites[0].lan = "10.4.0.0/24".parse()?;
    Ok(protego_testbed::TopologySpec {
        tenants: vec![
            tenant(
                "ta",
                4301,
                false,
                vec![protego_testbed::topology::VmSpec { host: 0 }],
            )?,
            second,
        ],
        hosts: 2,
        ..protego_testbed::TopologySpec::default()
    })
}

/// Starts the site's charon, brings the tunnel up from it and checks traffic to every VM;
/// returns the charon and its installed CHILD_SA.
fn bring_up(
    topo: &Topology,
    tun: &GatewayTunnel,
) -> Result<(
    protego_testbed::strongswan::Charon,
    protego_testbed::strongswan::ChildSa,
)> {
    let site = site_charon(topo, tun)?;
    site.initiate("net", UP)?;
    let child = site.wait_child_installed("net", UP)?;
    warm_up(topo, tun.site)?;
    ping_all_vms(topo, tun.site, 3)?;
    Ok((site, child))
}

/// A tunnel comes up through the steer node, traffic flows both ways through a data node,
/// and `migrate` moves it to the other data node with the peer.
#[test]
fn tunnel_through_steer_and_data_nodes_and_migration() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let cluster = ProtegoCluster::start(
        &bed,
        &topo,
        std::slice::from_ref(&tun),
        &ClusterSpec::default(),
    )?;
    let result = (|| -> Result<()> {
        let (_site, _) = bring_up(&topo, &tun)?;
        let first = wait_for(
            "one data node holding the tunnel",
            Duration::from_secs(10),
            || {
                Ok(match holder(&cluster)? {
                    Some(h) => Probe::Ready(h),
                    None => Probe::NotYet(cluster.nodes()?.to_string()),
                })
            },
        )?;
        let other = cluster
            .data_node_names()
            .into_iter()
            .find(|n| *n != first)
            .expect("two data nodes");
        let answer = cluster.control(&format!("migrate {} {other}", tun.name))?;
        eprintln!("migrate: {answer}");
        assert_eq!(answer["ok"], true, "{answer}");
        assert_eq!(holder(&cluster)?.as_deref(), Some(other.as_str()));
        ping_all_vms(&topo, 0, 3)?;
        // The capacity advisor models the live data nodes from their reports.
        // The advisor steps every 10 s at the most often.
        let capacity = wait_for("a capacity advisor step", Duration::from_secs(25), || {
            let c = cluster.control("capacity")?;
            Ok(if c["step"]["tunnels"] == 1 {
                Probe::Ready(c)
            } else {
                Probe::NotYet(c.to_string())
            })
        })?;
        eprintln!("capacity: {capacity}");
        assert_eq!(capacity["mode"], "advise", "{capacity}");
        let step = &capacity["step"];
        assert_eq!(
            step["nodes"].as_array().map(Vec::len),
            Some(2),
            "{capacity}"
        );
        assert!(step["required"].as_u64() >= Some(1), "{capacity}");
        assert_eq!(step["after"]["hotspots"], 0, "{capacity}");
        Ok(())
    })();
    cluster.finish(result)
}

/// Two migrations (there and back) during a TCP stream and a 1 kHz ping through the tunnel:
/// no ping is lost, the stream never stalls, and no ESP sequence number is used twice on the
/// wire (tshark reads every SPI and sequence number the peer and the steer node exchanged).
#[test]
fn migration_under_load_loses_nothing() -> Result<()> {
    let bed = Testbed::new()?;
    let (topo, tun, cluster) = up(&bed)?;
    with_logs(&cluster, || {
        let (_site, _) = bring_up(&topo, &tun)?;
        let s = &topo.sites[0];
        let vm = &topo.tenants[0].vms[0];
        let cap = traffic::capture(
            &topo.gateway.ns,
            &topo.gateway.wan_if,
            "udp port 4500",
            "migration",
        )?;
        let server = traffic::iperf3_server(&vm.ns, vm.addr.addr, 5201)?;
        // 20 Mbit/s: below what strongSwan's userspace ESP carries without dropping.
        let iperf = iperf_thread(&topo, 0, 5201, vec![(20, 6)], None);
        let ping = {
            let ns = s.ns.clone();
            let (src, dst) = (s.lan_addr, vm.addr.addr);
            std::thread::spawn(move || {
                traffic::ping(
                    &ns,
                    dst,
                    &PingOptions::new(5000, Duration::from_millis(1)).from(src),
                )
            })
        };
        let mut moves = Vec::new();
        for _ in 0..2 {
            std::thread::sleep(Duration::from_millis(1500));
            let from = holder(&cluster)?.expect("one data node holds the tunnel");
            let to = cluster
                .data_node_names()
                .into_iter()
                .find(|n| *n != from)
                .expect("two data nodes");
            let answer = cluster.control(&format!("migrate {} {to}", tun.name))?;
            assert_eq!(answer["ok"], true, "{answer}");
            assert_eq!(holder(&cluster)?.as_deref(), Some(to.as_str()));
            moves.push(format!("{from} -> {to} in {} ms", answer["ms"]));
        }
        let ping = ping.join().expect("ping thread")?;
        let iperf = iperf_result(iperf)?;
        drop(server);
        let pcap = cap.stop();
        let esp = assert_no_sequence_reused(&pcap)?;
        eprintln!(
            "migrations: {moves:?}; ping {}/{} received; iperf3 {:.1} Mbit/s, {:?} retransmits, \
             {} stalled intervals; {esp} ESP packets checked",
            ping.received,
            ping.transmitted,
            iperf.received_bps / 1e6,
            iperf.retransmits,
            iperf.stalled_intervals().len()
        );
        assert_eq!(ping.lost(), 0, "pings lost during migration: {ping:?}");
        assert!(
            iperf.stalled_intervals().is_empty(),
            "the TCP stream stalled: {iperf:?}"
        );
        Ok(())
    })
}

/// kill -9 of the data node holding the tunnel during a 100 Hz ping: the steer node's probes
/// (or the node's lost session) tell control, which rekeys the CHILD_SA onto the other data
/// node; the ping resumes. Prints the outage from the kill to the first reply.
#[test]
fn killed_data_node_fails_over() -> Result<()> {
    let bed = Testbed::new()?;
    let (topo, tun, cluster) = up(&bed)?;
    with_logs(&cluster, || {
        let (_site, _) = bring_up(&topo, &tun)?;
        let victim = holder(&cluster)?.expect("one data node holds the tunnel");
        let pinger = OutagePing::start(&topo)?;
        std::thread::sleep(Duration::from_millis(500));
        let killed_at = SystemTime::now();
        cluster.kill(&victim)?;
        let outage = pinger.first_reply_after(killed_at, Duration::from_secs(10))?;
        cluster.wait_not_alive(&victim, Duration::from_secs(5))?;
        let now = holder(&cluster)?;
        eprintln!(
            "data node {victim} killed: first reply after {} ms; tunnel now on {now:?}",
            outage.as_millis()
        );
        assert!(
            now.is_some_and(|n| n != victim),
            "the tunnel moved off {victim}"
        );
        ping_all_vms(&topo, 0, 3)?;
        Ok(())
    })
}

/// A data node whose certificate comes from another CA is refused: it never registers, and
/// the cluster keeps working.
#[test]
fn node_with_a_foreign_certificate_is_refused() -> Result<()> {
    let bed = Testbed::new()?;
    let (topo, tun, cluster) = up(&bed)?;
    with_logs(&cluster, || {
        let bin = protego_testbed::workspace_bin("protego")?;
        let dir = bed.dir().join("rogue-pki");
        let run = |args: &[&str]| -> Result<String> {
            let mut cmd = Cmd::new(bin.display().to_string()).arg("certs");
            cmd = cmd.args(args.iter().map(|a| (*a).to_owned()));
            topo.switch.exec(cmd)
        };
        let d = dir.display().to_string();
        run(&["init", "--dir", &d])?;
        run(&["issue", "--dir", &d, "--name", "data1", "--role", "data"])?;
        let data1 = cluster.underlay("data1")?;
        let control = cluster.underlay("control1")?;
        let config = dir.join("rogue.toml");
        std::fs::write(
            &config,
            format!(
                "[node]\nname = \"data1\"\nca = \"{d}/ca.pem\"\ncert = \"{d}/data1.pem\"\nkey = \"{d}/data1.key\"\n\
                 [[node.control]]\nname = \"control1\"\naddress = \"{}:7300\"\n[data]\ngeneve = \"{}:6082\"\n",
                control.addr, data1.addr
            ),
        )
        .map_err(|source| protego_testbed::Error::Io {
            action: "write rogue config",
            path: config.clone(),
            source,
        })?;
        let rogue = cluster.netns("data1")?.spawn(
            "rogue-data",
            Cmd::new(bin.display().to_string()).args([
                "data",
                "--config",
                &config.display().to_string(),
            ]),
        )?;
        wait_for(
            "the rogue node to be refused",
            Duration::from_secs(10),
            || {
                let log = rogue.log();
                Ok(if log.contains("session with control failed") {
                    Probe::Ready(())
                } else {
                    Probe::NotYet(rogue.log_tail(5))
                })
            },
        )?;
        let log = rogue.log();
        assert!(
            log.to_lowercase().contains("certificate")
                || log.contains("tls")
                || log.contains("TLS"),
            "the refusal names the certificate: {log}"
        );
        rogue.stop();
        // The genuine nodes are unaffected.
        cluster.wait_alive(&["data1", "data2", "steer1"], Duration::from_secs(5))?;
        let (_site, _) = bring_up(&topo, &tun)?;
        Ok(())
    })
}

/// Two control nodes elected through etcd; `kill -9` of the active one under a 100 Hz ping:
/// ESP never stops (the data and steer nodes keep their tables), the standby takes over (it
/// restores the IKE SA from etcd and adopts the CHILD_SA from its data node without rekeying),
/// and afterwards rekeys started by either side succeed on the same IKE SA: strongSwan sees
/// no new IKE_SA_INIT or IKE_AUTH.
#[test]
fn killed_control_node_is_replaced_without_stopping_esp() -> Result<()> {
    if skip_without_etcd("killed_control_node_is_replaced_without_stopping_esp") {
        return Ok(());
    }
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let mut tun = GatewayTunnel::for_site(&topo, 0, PSK);
    // Liveness checks from both sides once traffic stops (RFC 7296 §2.4).
    tun.extra.push("dpd_delay = \"1s\"".to_owned());
    let spec = ClusterSpec {
        controls: 2,
        store: ClusterStore::Etcd,
        ..ClusterSpec::default()
    };
    let cluster = ProtegoCluster::start(&bed, &topo, std::slice::from_ref(&tun), &spec)?;
    with_logs(&cluster, || {
        let site = site_charon_with(
            &topo,
            &tun,
            "site0",
            &protego_testbed::strongswan::CharonSettings::default(),
            |c| c.dpd_delay = Some(Duration::from_secs(1)),
        )?;
        site.initiate("net", UP)?;
        let child = site.wait_child_installed("net", UP)?;
        ping_all_vms(&topo, 0, 3)?;
        let (active, standby) = cluster.active_and_standby()?;
        let before = site.list_sas()?.into_iter().next().expect("one IKE SA");
        let charon_seen = site.log().len();
        let pinger = OutagePing::start(&topo)?;
        std::thread::sleep(Duration::from_millis(500));
        let killed_at = std::time::Instant::now();
        let killed_wall = SystemTime::now();
        cluster.kill(&active)?;
        // The standby is active once its control socket shows every node alive again.
        wait_for("the standby to take over", Duration::from_secs(15), || {
            let nodes = match cluster.control_on(&standby, "nodes") {
                Ok(n) => n,
                Err(e) => return Ok(Probe::NotYet(e.to_string())),
            };
            let all = nodes["nodes"].as_array().cloned().unwrap_or_default();
            let alive = all.iter().filter(|n| n["alive"] == true).count();
            Ok(if all.len() == 3 && alive == 3 {
                Probe::Ready(())
            } else {
                Probe::NotYet(nodes.to_string())
            })
        })?;
        let takeover = killed_at.elapsed();
        std::thread::sleep(Duration::from_millis(500));
        let replies = pinger.replies();
        pinger.process.stop();
        let t0 = epoch_secs(killed_wall);
        let after: Vec<f64> = replies.iter().copied().filter(|t| *t > t0 - 0.5).collect();
        let gap = after.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
        eprintln!(
            "control {active} killed: {standby} active after {} ms; longest gap between ping \
             replies {:.0} ms ({} replies around the kill)",
            takeover.as_millis(),
            gap * 1e3,
            after.len()
        );
        if std::env::var_os("PROTEGO_SHOW_LOGS").is_some() {
            eprintln!("{}", cluster.log(&standby)?);
        }
        assert!(gap < 0.1, "ESP stopped for {:.0} ms", gap * 1e3);
        // The same CHILD_SA still carries the traffic: nothing was rekeyed.
        let now = site.wait_child_installed("net", UP)?;
        assert_eq!(
            now.spi_in, child.spi_in,
            "the CHILD_SA was not rekeyed by the takeover"
        );
        // Rekeys from both sides on the same IKE SA.
        cluster.control_on(&standby, &format!("rekey {}", tun.name))?;
        let second = site.wait_child_rekeyed("net", &child.spi_in, UP)?;
        site.rekey_child("net")?;
        site.wait_child_rekeyed("net", &second.spi_in, UP)?;
        ping_all_vms(&topo, 0, 5)?;
        site.rekey_ike(&before.name)?;
        wait_for("strongSwan's IKE SA rekeyed", UP, || {
            let sas = site.list_sas()?;
            Ok(
                match sas.iter().find(|s| {
                    s.is_established()
                        && s.initiator_spi != before.initiator_spi
                        && s.installed("net").next().is_some()
                }) {
                    Some(_) => Probe::Ready(()),
                    None => Probe::NotYet(summarize(&sas)),
                },
            )
        })?;
        ping_all_vms(&topo, 0, 5)?;
        // Idle: liveness is checked over the IKE SA the standby took over, and answered. With
        // the same dpd_delay on both sides, whichever side checks first keeps the other from
        // checking (each only checks after hearing nothing for dpd_delay), so either
        // direction counts; strongSwan's own requests to the standby were answered above (its
        // rekeys).
        let idle_from = site.log().len();
        std::thread::sleep(Duration::from_millis(3500));
        let idle = site.log().get(idle_from..).unwrap_or_default().to_owned();
        let swan_checked =
            idle.contains("sending DPD request") && idle.contains("parsed INFORMATIONAL response");
        let protego_checked = idle.contains("parsed INFORMATIONAL request")
            && idle.contains("generating INFORMATIONAL response");
        assert!(
            swan_checked || protego_checked,
            "no liveness check was answered while idle:\n{idle}"
        );
        assert!(
            site.list_sas()?.iter().any(|s| s.is_established()),
            "the IKE SA survived the liveness checks"
        );
        let charon_new = site.log().get(charon_seen..).unwrap_or_default().to_owned();
        assert!(
            !charon_new.contains("IKE_SA_INIT") && !charon_new.contains("IKE_AUTH"),
            "strongSwan re-authenticated after the takeover:\n{charon_new}"
        );
        Ok(())
    })
}

/// Runs `body` with the cluster mutably (restarts); on failure prints every node's log
/// tail. Stops the cluster either way.
fn with_logs_mut(
    cluster: &mut ProtegoCluster,
    body: impl FnOnce(&mut ProtegoCluster) -> Result<()>,
) -> Result<()> {
    let result = body(cluster);
    cluster.finish(result)
}

/// The longest time without a ping reply from the last reply before `t0` on, in seconds.
fn longest_gap(replies: &[f64], t0: f64) -> f64 {
    let start = replies.iter().rposition(|t| *t <= t0).unwrap_or(0);
    replies[start..]
        .windows(2)
        .map(|w| w[1] - w[0])
        .fold(0.0, f64::max)
}

/// `kill -9` of the only control node (file store) and a restart: ESP never stops (the
/// data and steer nodes keep their tables), the restarted node restores the IKE SA from its
/// file and adopts the CHILD_SA from its data node without rekeying, and a rekey it starts
/// afterwards succeeds on the same IKE SA.
#[test]
fn restarted_control_node_keeps_the_tunnel_without_rekeying() -> Result<()> {
    let bed = Testbed::new()?;
    let (topo, tun, mut cluster) = up(&bed)?;
    with_logs_mut(&mut cluster, |cluster| {
        let (site, child) = bring_up(&topo, &tun)?;
        let before = site.list_sas()?.into_iter().next().expect("one IKE SA");
        let charon_seen = site.log().len();
        let pinger = OutagePing::start(&topo)?;
        std::thread::sleep(Duration::from_millis(300));
        let t0 = epoch_secs(SystemTime::now());
        cluster.kill("control1")?;
        std::thread::sleep(Duration::from_millis(300));
        cluster.restart("control1")?;
        std::thread::sleep(Duration::from_millis(300));
        let gap = longest_gap(&pinger.replies(), t0);
        pinger.process.stop();
        eprintln!(
            "control node restarted; longest gap between ping replies {:.0} ms",
            gap * 1e3
        );
        assert!(gap < 0.1, "ESP stopped for {:.0} ms", gap * 1e3);
        let now = site.wait_child_installed("net", UP)?;
        assert_eq!(
            now.spi_in, child.spi_in,
            "the CHILD_SA was kept, not rekeyed"
        );
        cluster.control(&format!("rekey {}", tun.name))?;
        site.wait_child_rekeyed("net", &child.spi_in, UP)?;
        ping_all_vms(&topo, 0, 3)?;
        let after = site.list_sas()?.into_iter().next().expect("one IKE SA");
        assert_eq!(after.initiator_spi, before.initiator_spi, "the same IKE SA");
        let charon_new = site.log().get(charon_seen..).unwrap_or_default().to_owned();
        assert!(
            !charon_new.contains("IKE_SA_INIT"),
            "strongSwan re-authenticated:\n{charon_new}"
        );
        Ok(())
    })
}

/// The store key rotated as docs/operations.md says for the distributed form: the operator
/// appends a key to the control nodes' key file, then `rotate-key` makes it current without
/// generating one; the records are re-encrypted under it, and after a `kill -9` the restarted
/// control node reads them and keeps the tunnel. A node whose key file lacks the key stops at
/// its start, naming the key id and the file.
#[test]
fn rotated_store_key_is_read_after_a_restart_and_a_missing_one_is_named() -> Result<()> {
    let bed = Testbed::new()?;
    let (topo, tun, mut cluster) = up(&bed)?;
    with_logs_mut(&mut cluster, |cluster| {
        let (site, child) = bring_up(&topo, &tun)?;
        let keys = cluster.store_key_file().to_owned();
        let before = std::fs::read_to_string(&keys).expect("the cluster's key file");
        let id: u32 = 0x5eed_1234;
        let added = format!("{before}{id} {}\n", "a5".repeat(32));
        std::fs::write(&keys, &added).expect("write the key file");
        let answer = cluster.control("rotate-store-key")?;
        assert_eq!(answer["key_id"], id, "{answer}");
        assert_eq!(answer["generated"], false, "{answer}");
        assert_eq!(
            std::fs::read_to_string(&keys).ok().as_deref(),
            Some(added.as_str()),
            "nothing generated or written"
        );
        wait_for("the records re-encrypted under the new key", UP, || {
            let status = cluster.control("status")?;
            let e = &status["store"]["encryption"];
            Ok(if e["current_key"] == id && e["reencrypt_pending"] == 0 {
                Probe::Ready(())
            } else {
                Probe::NotYet(e.to_string())
            })
        })?;
        cluster.kill("control1")?;
        cluster.restart("control1")?;
        let now = site.wait_child_installed("net", UP)?;
        assert_eq!(now.spi_in, child.spi_in, "restored from the sealed records");
        cluster.control(&format!("rekey {}", tun.name))?;
        site.wait_child_rekeyed("net", &child.spi_in, UP)?;
        ping_all_vms(&topo, 0, 3)?;
        // The key file without the new key (the operator forgot a node): the start stops.
        cluster.kill("control1")?;
        std::fs::write(&keys, &before).expect("write the key file");
        assert!(
            cluster.restart("control1").is_err(),
            "started without the key"
        );
        let log = cluster.log("control1")?;
        assert!(
            log.contains(&format!("sealed with key id {id}"))
                && log.contains(&keys.display().to_string()),
            "the error names the key id and the key file:\n{log}"
        );
        Ok(())
    })
}

/// `kill -9` of the steer node: traffic stops while the VIP has no owner; the restarted
/// steer node gets the whole tables from control and traffic resumes on the same SAs.
#[test]
fn restarted_steer_node_gets_its_tables_back() -> Result<()> {
    let bed = Testbed::new()?;
    let (topo, tun, mut cluster) = up(&bed)?;
    with_logs_mut(&mut cluster, |cluster| {
        let (site, child) = bring_up(&topo, &tun)?;
        let pinger = OutagePing::start(&topo)?;
        std::thread::sleep(Duration::from_millis(300));
        let killed = SystemTime::now();
        cluster.kill("steer1")?;
        std::thread::sleep(Duration::from_millis(200));
        cluster.restart("steer1")?;
        let outage = pinger
            .first_reply_after(killed + Duration::from_millis(200), Duration::from_secs(10))?;
        pinger.process.stop();
        eprintln!(
            "steer node restarted: traffic back {} ms after the restart began",
            outage.as_millis()
        );
        let now = site.wait_child_installed("net", UP)?;
        assert_eq!(
            now.spi_in, child.spi_in,
            "the same CHILD_SA carries the traffic"
        );
        ping_all_vms(&topo, 0, 3)?;
        Ok(())
    })
}

/// `drain` of the data node holding the tunnel under a 1 kHz ping loses nothing; nothing is
/// placed on a drained node until `undrain`.
#[test]
fn drain_loses_nothing() -> Result<()> {
    let bed = Testbed::new()?;
    let (topo, tun, cluster) = up(&bed)?;
    with_logs(&cluster, || {
        let (_site, _) = bring_up(&topo, &tun)?;
        let victim = holder(&cluster)?.expect("one data node holds the tunnel");
        let s = &topo.sites[0];
        let vm = &topo.tenants[0].vms[0];
        let ping = {
            let ns = s.ns.clone();
            let (src, dst) = (s.lan_addr, vm.addr.addr);
            std::thread::spawn(move || {
                traffic::ping(
                    &ns,
                    dst,
                    &PingOptions::new(2000, Duration::from_millis(1)).from(src),
                )
            })
        };
        std::thread::sleep(Duration::from_millis(500));
        let answer = cluster.control(&format!("drain {victim}"))?;
        assert_eq!(answer["ok"], true, "{answer}");
        assert_eq!(answer["moved"], 1, "{answer}");
        let ping = ping.join().expect("ping thread")?;
        assert_eq!(ping.lost(), 0, "pings lost during the drain: {ping:?}");
        assert_ne!(holder(&cluster)?.as_deref(), Some(victim.as_str()));
        // A drained node takes nothing: moving the tunnel back is refused.
        let refused = cluster.control(&format!("migrate {} {victim}", tun.name));
        assert!(refused.is_err(), "{refused:?}");
        cluster.control(&format!("undrain {victim}"))?;
        let back = cluster.control(&format!("migrate {} {victim}", tun.name))?;
        assert_eq!(back["ok"], true, "{back}");
        Ok(())
    })
}

/// Two tenants, each with its own site and VNet, through the same steer and data nodes: one
/// tunnel limited to 5 Mbit/s (`rate_limit`). A 30 Mbit/s UDP stream through it arrives at
/// about the limit and the steer node reports the excess as rate-limited, while the other
/// tenant's traffic flows untouched.
#[test]
fn rate_limit_keeps_one_tenant_from_taking_anothers_capacity() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, two_tenants()?)?;
    let mut limited = GatewayTunnel::for_site(&topo, 0, PSK);
    limited.extra.push("rate_limit = 5".to_owned());
    let free = GatewayTunnel::for_site(&topo, 1, PSK);
    let tunnels = [limited.clone(), free.clone()];
    let cluster = ProtegoCluster::start(&bed, &topo, &tunnels, &ClusterSpec::default())?;
    with_logs(&cluster, || {
        let site_a = site_charon(&topo, &limited)?;
        let site_b = site_charon(&topo, &free)?;
        site_a.initiate("net", UP)?;
        site_b.initiate("net", UP)?;
        site_a.wait_child_installed("net", UP)?;
        site_b.wait_child_installed("net", UP)?;
        ping_all_vms(&topo, 0, 3)?;
        ping_all_vms(&topo, 1, 3)?;
        let (s, vm) = (&topo.sites[0], &topo.tenants[0].vms[0]);
        let server = traffic::iperf3_server(&vm.ns, vm.addr.addr, 5202)?;
        let stream = {
            let ns = s.ns.clone();
            let (bind, dst) = (s.lan_addr, vm.addr.addr);
            std::thread::spawn(move || {
                let mut o = IperfOptions::tcp(Duration::from_secs(3));
                o.bind = Some(bind);
                o.port = 5202;
                o.udp_bitrate = Some(30_000_000);
                o.length = Some(1200);
                traffic::iperf3_client(&ns, dst, &o)
            })
        };
        // The other tenant meanwhile: nothing lost.
        std::thread::sleep(Duration::from_millis(500));
        let (sb, vmb) = (&topo.sites[1], &topo.tenants[1].vms[0]);
        let ping_b = traffic::ping(
            &sb.ns,
            vmb.addr.addr,
            &PingOptions::new(100, Duration::from_millis(10)).from(sb.lan_addr),
        )?;
        // The steer node's report (every second, while the stream runs) shows the
        // rate-limited packets.
        let dropped = wait_for(
            "the steer node to report rate-limited packets",
            Duration::from_secs(2),
            || {
                let nodes = cluster.nodes()?;
                let n = nodes["nodes"]
                    .as_array()
                    .and_then(|ns| ns.iter().find(|n| n["role"] == "steer").cloned())
                    .and_then(|n| n["load"]["rate_dropped"]["1"].as_u64())
                    .unwrap_or(0);
                Ok(if n > 0 {
                    Probe::Ready(n)
                } else {
                    Probe::NotYet(nodes.to_string())
                })
            },
        )?;
        let r = stream.join().expect("iperf3 thread")?;
        drop(server);
        eprintln!(
            "limited tunnel: sent {:.1} Mbit/s, received {:.1} Mbit/s; steer rate-limited {dropped} packets in the last report; other tenant {}/{} pings",
            r.sent_bps / 1e6,
            r.received_bps / 1e6,
            ping_b.received,
            ping_b.transmitted
        );
        assert!(
            r.sent_bps > 20e6,
            "the stream was offered above the limit: {r:?}"
        );
        // 5 Mbit/s of ESP (the limit counts whole datagrams) carries a little less inner
        // payload; the bucket's depth (256 KiB at the least) adds at most ~0.7 Mbit/s over
        // 3 s.
        assert!(r.received_bps < 6e6, "received above the limit: {r:?}");
        assert!(r.received_bps > 2e6, "received far below the limit: {r:?}");
        assert!(
            ping_b.all_received(),
            "the other tenant lost pings: {ping_b:?}"
        );
        Ok(())
    })
}

/// `protego ctl apply` on the active control node of two (etcd): a second tenant with its VNet
/// and tunnel is added live (its site connects through the steer node and reaches its VMs);
/// the configuration is in etcd, so after a `kill -9` of the active node the standby runs the
/// applied tunnels and keeps the added tunnel's IKE SA; an apply on the new active node then
/// removes the first tunnel, whose site gets a DELETE.
#[test]
fn applied_configuration_runs_live_and_after_a_control_takeover() -> Result<()> {
    if skip_without_etcd("applied_configuration_runs_live_and_after_a_control_takeover") {
        return Ok(());
    }
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, two_tenants()?)?;
    let first = GatewayTunnel::for_site(&topo, 0, PSK);
    let mut added = GatewayTunnel::for_site(&topo, 1, PSK);
    added.extra.push("rate_limit = 50".to_owned());
    let cluster_spec = ClusterSpec {
        controls: 2,
        store: ClusterStore::Etcd,
        ..ClusterSpec::default()
    };
    // The file knows only the first tenant's tunnel.
    let cluster = ProtegoCluster::start(&bed, &topo, std::slice::from_ref(&first), &cluster_spec)?;
    with_logs(&cluster, || {
        let (site_a, _) = bring_up(&topo, &first)?;
        let inventory = protego_testbed::protego::render_inventory(
            &topo,
            &[0, 1],
            &[first.clone(), added.clone()],
            cluster.dir(),
        )?;
        let out = cluster.apply(&inventory)?;
        eprintln!("apply:\n{out}");
        assert!(out.contains(&format!("+ tunnel {}", added.name)), "{out}");
        let (site_b, _) = bring_up(&topo, &added)?;
        ping_all_vms(&topo, 0, 3)?;
        let before = site_b.list_sas()?.into_iter().next().expect("one IKE SA");

        // The active node dies; the standby reads the applied configuration from etcd.
        let (active, standby) = cluster.active_and_standby()?;
        let charon_seen = site_b.log().len();
        cluster.kill(&active)?;
        let status = wait_for("the standby to take over", Duration::from_secs(15), || {
            Ok(match cluster.control_on(&standby, "status") {
                Ok(s) => Probe::Ready(s),
                Err(e) => Probe::NotYet(e.to_string()),
            })
        })?;
        let names: Vec<&str> = status["tunnels"]
            .as_array()
            .map(|ts| ts.iter().filter_map(|t| t["name"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(
            names,
            [first.name.as_str(), added.name.as_str()],
            "{status}"
        );
        ping_all_vms(&topo, 1, 5)?;
        let after = site_b.list_sas()?.into_iter().next().expect("one IKE SA");
        assert_eq!(
            (&after.initiator_spi, &after.responder_spi),
            (&before.initiator_spi, &before.responder_spi),
            "the added tunnel kept its IKE SA across the takeover"
        );
        let charon_new = site_b
            .log()
            .get(charon_seen..)
            .unwrap_or_default()
            .to_owned();
        assert!(
            !charon_new.contains("IKE_SA_INIT") && !charon_new.contains("IKE_AUTH"),
            "strongSwan re-authenticated after the takeover:\n{charon_new}"
        );

        // The new active node applies: the first tunnel goes, its site is told.
        let only_added = protego_testbed::protego::render_inventory(
            &topo,
            &[0, 1],
            std::slice::from_ref(&added),
            cluster.dir(),
        )?;
        let out = cluster.apply(&only_added)?;
        eprintln!("apply on {standby}:\n{out}");
        assert!(out.contains(&format!("- tunnel {}", first.name)), "{out}");
        wait_for(
            "the first site's IKE SA deleted",
            Duration::from_secs(10),
            || {
                let sas = site_a.list_sas()?;
                Ok(if sas.is_empty() {
                    Probe::Ready(())
                } else {
                    Probe::NotYet(summarize(&sas))
                })
            },
        )?;
        ping_all_vms(&topo, 1, 5)?;
        Ok(())
    })
}
