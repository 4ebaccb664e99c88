//! The whole distributed picture against real strongSwan 5.9: etcd, two control nodes (one
//! active, one standing by), three data nodes and two steer nodes sharing the VIP and the VTEP
//! address behind an ECMP router, cloud hosts with kernel VXLAN devices and VMs, and three
//! tenants, each with its own VNet (its own VNI) and one site (its own strongSwan peer) with
//! one tunnel.
//!
//! - [`three_tenants_isolation_migration_and_drain`]: every tunnel up, traffic both ways,
//!   tenants isolated, both steer nodes forwarding; a migration under a TCP stream and 1 kHz
//!   pings on every tenant, then a drain, both without a lost ping.
//! - [`three_tenants_survive_each_kind_of_node_killed`]: `kill -9` of a data node holding a
//!   tunnel, of the active control node and of a steer node (its nexthop withdrawn as the
//!   router would), under 100 Hz pings on every tenant; prints the outages.
//!
//! The two tests run one after the other (each brings up a cluster of a dozen processes; two
//! at once would starve each other on a small machine).

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use common::*;

use protego_testbed::cluster::{ClusterSpec, ClusterStore, ProtegoCluster};
use protego_testbed::protego::GatewayTunnel;
use protego_testbed::strongswan::{Charon, ChildSa};
use protego_testbed::traffic::{self, PingOptions, PingStats};
use protego_testbed::wait::{wait_for, Probe};
use protego_testbed::{Cmd, Process, Result, Testbed, Topology};

/// One test of this file at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Tenants: name, VNI.
const TENANTS: [(&str, u32); 3] = [("ta", 5101), ("tb", 5102), ("tc", 5103)];

/// The picture up: topology, one tunnel per site, the cluster (etcd, two control nodes, three
/// data nodes, two steer nodes).
struct Full {
    topo: Topology,
    tunnels: Vec<GatewayTunnel>,
    cluster: ProtegoCluster,
}

impl Full {
    fn start(bed: &Testbed) -> Result<Full> {
        let topo = Topology::build(bed, numbered_tenants(&TENANTS)?)?;
        let tunnels: Vec<GatewayTunnel> = (0..topo.sites.len())
            .map(|s| GatewayTunnel::for_site(&topo, s, PSK))
            .collect();
        let spec = ClusterSpec {
            controls: 2,
            data: 3,
            steers: 2,
            store: ClusterStore::Etcd,
            ..ClusterSpec::default()
        };
        let cluster = ProtegoCluster::start(bed, &topo, &tunnels, &spec)?;
        Ok(Full {
            topo,
            tunnels,
            cluster,
        })
    }

    /// Starts every site's charon and brings its tunnel up; checks traffic to every VM.
    fn bring_up(&self) -> Result<Vec<(Charon, ChildSa)>> {
        let mut sites = Vec::new();
        for tun in &self.tunnels {
            let site = site_charon(&self.topo, tun)?;
            site.initiate("net", UP)?;
            let child = site.wait_child_installed("net", UP)?;
            sites.push((site, child));
        }
        // Every VM answers once (a tunnel just set up may still be resolving neighbours on
        // the way), then none of three pings is lost.
        for s in 0..self.topo.sites.len() {
            warm_up(&self.topo, s)?;
            ping_all_vms(&self.topo, s, 3)?;
        }
        Ok(sites)
    }

    /// Which data node holds each tunnel (from `nodes`).
    fn holders(&self) -> Result<BTreeMap<String, String>> {
        let nodes = self.cluster.nodes()?;
        let mut out = BTreeMap::new();
        for n in nodes["nodes"].as_array().into_iter().flatten() {
            if n["role"] != "data" {
                continue;
            }
            let name = n["name"].as_str().unwrap_or_default();
            for t in n["tunnels"].as_array().into_iter().flatten() {
                if let Some(t) = t.as_str() {
                    out.insert(t.to_owned(), name.to_owned());
                }
            }
        }
        Ok(out)
    }

    /// Waits until every tunnel is held by a data node other than those of `not_on`.
    fn wait_placed(&self, not_on: &[&str], timeout: Duration) -> Result<BTreeMap<String, String>> {
        wait_for("every tunnel on a live data node", timeout, || {
            let h = self.holders()?;
            let ok = self.tunnels.iter().all(|t| {
                h.get(&t.name)
                    .is_some_and(|n| !not_on.contains(&n.as_str()))
            });
            Ok(if ok {
                Probe::Ready(h)
            } else {
                Probe::NotYet(format!("{h:?}"))
            })
        })
    }
}

/// `count` pings at `interval` from site `site`'s LAN to VM 0 of its tenant, in a thread.
fn ping_thread(
    topo: &Topology,
    site: usize,
    count: u32,
    interval: Duration,
) -> std::thread::JoinHandle<Result<PingStats>> {
    let s = &topo.sites[site];
    let vm = &topo.tenants[s.tenant].vms[0];
    let ns = s.ns.clone();
    let (src, dst) = (s.lan_addr, vm.addr.addr);
    std::thread::spawn(move || {
        traffic::ping(&ns, dst, &PingOptions::new(count, interval).from(src))
    })
}

/// A 100 Hz `ping -D` from a site's LAN to VM 0 of its tenant, in the background, to time
/// outages from the arrival times of its replies.
struct Pinger {
    tenant: String,
    process: Process,
}

impl Pinger {
    fn start(topo: &Topology, site: usize, label: &str) -> Result<Pinger> {
        let s = &topo.sites[site];
        let tenant = &topo.tenants[s.tenant];
        let cmd = Cmd::new("stdbuf").args(["-oL", "ping", "-n", "-D", "-i", "0.01", "-W", "1"]);
        let cmd = cmd.args([
            "-I".to_owned(),
            s.lan_addr.to_string(),
            tenant.vms[0].addr.addr.to_string(),
        ]);
        Ok(Pinger {
            tenant: tenant.name.clone(),
            process: s.ns.spawn(&format!("{label}-{}", tenant.name), cmd)?,
        })
    }

    /// Arrival times of the replies so far (seconds since the epoch).
    fn replies(&self) -> Vec<f64> {
        self.process
            .log()
            .lines()
            .filter(|l| l.contains("bytes from"))
            .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse().ok())
            .collect()
    }

    /// The longest time without a reply from the last reply before `t0` on, in seconds.
    fn longest_gap_since(&self, t0: f64) -> f64 {
        let replies = self.replies();
        let start = replies.iter().rposition(|t| *t <= t0).unwrap_or(0);
        replies
            .get(start..)
            .unwrap_or_default()
            .windows(2)
            .map(|w| w[1] - w[0])
            .fold(0.0, f64::max)
    }

    /// Waits up to `limit` for a reply after `t0`; returns how long after `t0` it came.
    fn first_reply_after(&self, t0: f64, limit: Duration) -> Result<Duration> {
        wait_for(
            &format!("a ping reply of tenant {}", self.tenant),
            limit,
            || {
                Ok(match self.replies().into_iter().find(|&t| t > t0) {
                    Some(t) => Probe::Ready(Duration::from_secs_f64(t - t0)),
                    None => Probe::NotYet(self.process.log_tail(3)),
                })
            },
        )
    }
}

/// Bytes each steer node reported for its tunnels in its last report (`load.tunnel_bytes`).
fn steer_bytes(cluster: &ProtegoCluster) -> Result<BTreeMap<String, u64>> {
    let nodes = cluster.nodes()?;
    Ok(nodes["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["role"] == "steer")
        .map(|n| {
            let bytes = n["load"]["tunnel_bytes"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(_, b)| b.as_u64())
                .sum();
            (n["name"].as_str().unwrap_or_default().to_owned(), bytes)
        })
        .collect())
}

/// The steer node the data nodes send their output through: the first live one in their
/// relay list, i.e. the live steer node with the lowest id at the active control node.
fn relay_steer(cluster: &ProtegoCluster) -> Result<String> {
    let nodes = cluster.nodes()?;
    Ok(nodes["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["role"] == "steer" && n["alive"] == true)
        .min_by_key(|n| n["id"].as_u64().unwrap_or(u64::MAX))
        .and_then(|n| n["name"].as_str())
        .map(str::to_owned)
        .expect("a live steer node"))
}

/// a, b, c of the issue: all three tunnels up with traffic both ways, isolation, both steer
/// nodes forwarding; one migration under load and one drain, nothing lost.
#[test]
fn three_tenants_isolation_migration_and_drain() -> Result<()> {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let bed = Testbed::new()?;
    let full = Full::start(&bed)?;
    let (topo, cluster) = (&full.topo, &full.cluster);
    eprintln!("cluster up after {} ms", started.elapsed().as_millis());
    with_logs(cluster, || {
        let _sites = full.bring_up()?;
        eprintln!(
            "three tunnels up after {} ms; placement {:?}",
            started.elapsed().as_millis(),
            full.holders()?
        );

        // a. Traffic both ways for every tenant.
        for (s, site) in topo.sites.iter().enumerate() {
            ping_all_vms(topo, s, 3)?;
            for vm in &topo.tenants[site.tenant].vms {
                let p = traffic::ping(
                    &vm.ns,
                    site.lan_addr,
                    &PingOptions::new(3, Duration::from_millis(10)),
                )?;
                assert!(p.all_received(), "vm {} -> its site: {p:?}", vm.addr);
            }
        }
        // Isolation: no VM reaches another tenant's site.
        for (t, tenant) in topo.tenants.iter().enumerate() {
            for site in topo.sites.iter().filter(|s| s.tenant != t) {
                let vm = &tenant.vms[0];
                let mut o = PingOptions::new(3, Duration::from_millis(20));
                o.reply_timeout = Duration::from_millis(300);
                let p = traffic::ping(&vm.ns, site.lan_addr, &o)?;
                assert_eq!(
                    p.received, 0,
                    "tenant {} reached the site of tenant {}: {p:?}",
                    tenant.name, topo.tenants[site.tenant].name
                );
            }
        }
        // Both steer nodes forward: UDP flows from many source ports of every tenant's VMs
        // toward its site (each flow its own VXLAN source port, so the router's hash spreads
        // them), while the steer nodes report what they forwarded.
        let mut flows = Vec::new();
        for (s, site) in topo.sites.iter().enumerate() {
            for vm in &topo.tenants[site.tenant].vms {
                for _ in 0..8 {
                    let sock = vm.ns.udp_socket(SocketAddr::new(vm.addr.addr, 0))?;
                    flows.push((s, sock, SocketAddr::new(site.lan_addr, 9)));
                }
            }
        }
        let mut seen: BTreeMap<String, u64> = BTreeMap::new();
        let until = Instant::now() + Duration::from_millis(3500);
        let mut next_poll = Instant::now();
        while Instant::now() < until {
            for (_, sock, dst) in &flows {
                let _ = sock.send_to(&[0u8; 200], dst);
            }
            if Instant::now() >= next_poll {
                for (name, bytes) in steer_bytes(cluster)? {
                    *seen.entry(name).or_default() += bytes;
                }
                next_poll = Instant::now() + Duration::from_millis(500);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(flows);
        let router = cluster.router().expect("two steer nodes have a router");
        eprintln!(
            "steer nodes' reported tunnel bytes (sum of the reports seen): {seen:?}; routes:\n{}",
            router.describe()?
        );
        for name in cluster.steer_node_names() {
            assert!(
                seen.get(&name).is_some_and(|b| *b > 0),
                "{name} forwarded nothing: {seen:?}"
            );
        }

        // b. One migration under a TCP stream and 1 kHz pings on every tenant.
        let tun = &full.tunnels[0];
        let s0 = &topo.sites[tun.site];
        let vm0 = &topo.tenants[s0.tenant].vms[0];
        let server = traffic::iperf3_server(&vm0.ns, vm0.addr.addr, 5201)?;
        // 20 Mbit/s: below what strongSwan's userspace ESP carries without dropping.
        let iperf = iperf_thread(topo, tun.site, 5201, vec![(20, 5)], None);
        let pings: Vec<_> = (0..topo.sites.len())
            .map(|s| ping_thread(topo, s, 4500, Duration::from_millis(1)))
            .collect();
        std::thread::sleep(Duration::from_millis(1500));
        let before = full.holders()?;
        let from = before
            .get(&tun.name)
            .cloned()
            .expect("the tunnel is placed");
        let to = cluster
            .data_node_names()
            .into_iter()
            .find(|n| *n != from)
            .expect("three data nodes");
        let answer = cluster.control(&format!("migrate {} {to}", tun.name))?;
        assert_eq!(answer["ok"], true, "{answer}");
        let pings: Vec<PingStats> = pings
            .into_iter()
            .map(|p| p.join().expect("ping thread"))
            .collect::<Result<_>>()?;
        let iperf = iperf_result(iperf)?;
        drop(server);
        eprintln!(
            "migration of {} {from} -> {to} in {} ms; pings received {:?}; iperf3 {:.1} Mbit/s, \
             {:?} retransmits, {} stalled intervals",
            tun.name,
            answer["ms"],
            pings
                .iter()
                .map(|p| format!("{}/{}", p.received, p.transmitted))
                .collect::<Vec<_>>(),
            iperf.received_bps / 1e6,
            iperf.retransmits,
            iperf.stalled_intervals().len()
        );
        assert_eq!(full.holders()?.get(&tun.name), Some(&to));
        for (p, (name, _)) in pings.iter().zip(TENANTS) {
            assert_eq!(
                p.lost(),
                0,
                "tenant {name} lost pings in the migration: {p:?}"
            );
        }
        assert!(
            iperf.stalled_intervals().is_empty(),
            "the TCP stream stalled: {iperf:?}"
        );

        // c. Drain of the data node holding the most tunnels, under 1 kHz pings.
        let placement = full.holders()?;
        let mut count: BTreeMap<&str, usize> = BTreeMap::new();
        for n in placement.values() {
            *count.entry(n.as_str()).or_default() += 1;
        }
        let victim = count
            .iter()
            .max_by_key(|(_, c)| **c)
            .map(|(n, _)| (*n).to_owned())
            .expect("a data node holds tunnels");
        let pings: Vec<_> = (0..topo.sites.len())
            .map(|s| ping_thread(topo, s, 2500, Duration::from_millis(1)))
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        let answer = cluster.control(&format!("drain {victim}"))?;
        assert_eq!(answer["ok"], true, "{answer}");
        let pings: Vec<PingStats> = pings
            .into_iter()
            .map(|p| p.join().expect("ping thread"))
            .collect::<Result<_>>()?;
        let after = full.holders()?;
        eprintln!(
            "drain of {victim} (held {}) moved {} in {} ms; pings received {:?}; placement now \
             {after:?}",
            count[victim.as_str()],
            answer["moved"],
            answer["ms"],
            pings
                .iter()
                .map(|p| format!("{}/{}", p.received, p.transmitted))
                .collect::<Vec<_>>()
        );
        assert_eq!(answer["moved"], count[victim.as_str()], "{answer}");
        assert!(after.values().all(|n| *n != victim), "{after:?}");
        for (p, (name, _)) in pings.iter().zip(TENANTS) {
            assert_eq!(p.lost(), 0, "tenant {name} lost pings in the drain: {p:?}");
        }
        cluster.control(&format!("undrain {victim}"))?;
        for s in 0..topo.sites.len() {
            ping_all_vms(topo, s, 3)?;
        }
        eprintln!("test a-c took {} ms", started.elapsed().as_millis());
        Ok(())
    })
}

/// d of the issue: `kill -9` of a data node holding a tunnel, of the active control node and
/// of a steer node, each under 100 Hz pings on every tenant.
#[test]
fn three_tenants_survive_each_kind_of_node_killed() -> Result<()> {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let bed = Testbed::new()?;
    let mut full = Full::start(&bed)?;
    let result = (|| -> Result<()> {
        let full = &mut full;
        let sites = full.bring_up()?;
        let topo = &full.topo;
        let pingers: Vec<Pinger> = (0..topo.sites.len())
            .map(|s| Pinger::start(topo, s, "kill-ping"))
            .collect::<Result<_>>()?;
        std::thread::sleep(Duration::from_millis(500));

        // A data node: its tunnels come back on the live ones.
        let placement = full.holders()?;
        let victim = placement
            .get(&full.tunnels[0].name)
            .cloned()
            .expect("the first tunnel is placed");
        let moved: Vec<usize> = full
            .tunnels
            .iter()
            .enumerate()
            .filter(|(_, t)| placement.get(&t.name) == Some(&victim))
            .map(|(i, _)| i)
            .collect();
        let t0 = epoch_secs(SystemTime::now());
        full.cluster.kill(&victim)?;
        let mut outages = Vec::new();
        for &i in &moved {
            let outage = pingers[i].first_reply_after(t0, Duration::from_secs(10))?;
            outages.push((pingers[i].tenant.clone(), outage.as_millis()));
        }
        full.cluster
            .wait_not_alive(&victim, Duration::from_secs(5))?;
        let now = full.wait_placed(&[victim.as_str()], Duration::from_secs(10))?;
        std::thread::sleep(Duration::from_millis(300));
        let gaps: Vec<(String, u128)> = pingers
            .iter()
            .map(|p| (p.tenant.clone(), (p.longest_gap_since(t0) * 1e3) as u128))
            .collect();
        eprintln!(
            "data node {victim} killed: first reply after the kill on its tunnels {outages:?} \
             ms; longest gap between ping replies of every tenant {gaps:?} ms; placement now \
             {now:?}"
        );
        for (i, (tenant, ms)) in gaps.iter().enumerate() {
            if moved.contains(&i) {
                assert!(
                    *ms < 5000,
                    "tenant {tenant}'s tunnel came back after {ms} ms"
                );
            } else {
                assert!(
                    *ms < 300,
                    "tenant {tenant} (not on {victim}) stopped for {ms} ms"
                );
            }
        }
        for s in 0..topo.sites.len() {
            ping_all_vms(topo, s, 3)?;
        }

        // The active control node: the standby takes over, ESP never stops, same CHILD_SAs.
        let children: Vec<ChildSa> = sites
            .iter()
            .map(|(site, _)| site.wait_child_installed("net", UP))
            .collect::<Result<_>>()?;
        let charon_seen: Vec<usize> = sites.iter().map(|(s, _)| s.log().len()).collect();
        let (active, standby) = full.cluster.active_and_standby()?;
        let t0 = epoch_secs(SystemTime::now());
        let killed_at = Instant::now();
        full.cluster.kill(&active)?;
        let live: Vec<String> = full
            .cluster
            .data_node_names()
            .into_iter()
            .filter(|n| *n != victim)
            .chain(full.cluster.steer_node_names())
            .collect();
        let live_refs: Vec<&str> = live.iter().map(String::as_str).collect();
        full.cluster
            .wait_alive(&live_refs, Duration::from_secs(15))?;
        let takeover = killed_at.elapsed();
        std::thread::sleep(Duration::from_millis(500));
        let gaps: Vec<(String, u128)> = pingers
            .iter()
            .map(|p| (p.tenant.clone(), (p.longest_gap_since(t0) * 1e3) as u128))
            .collect();
        eprintln!(
            "control node {active} killed: {standby} active after {} ms; longest gap between \
             ping replies {gaps:?} ms",
            takeover.as_millis()
        );
        assert_eq!(full.cluster.active_control()?, standby);
        for (tenant, ms) in &gaps {
            assert!(*ms < 300, "tenant {tenant}: ESP stopped for {ms} ms");
        }
        for (i, (site, _)) in sites.iter().enumerate() {
            let now = site.wait_child_installed("net", UP)?;
            assert_eq!(
                now.spi_in, children[i].spi_in,
                "tenant {}: the CHILD_SA was not rekeyed by the takeover",
                TENANTS[i].0
            );
            let new = site
                .log()
                .get(charon_seen[i]..)
                .unwrap_or_default()
                .to_owned();
            assert!(
                !new.contains("IKE_SA_INIT") && !new.contains("IKE_AUTH"),
                "tenant {}: strongSwan re-authenticated after the takeover:\n{new}",
                TENANTS[i].0
            );
        }
        // The new active node rekeys on the same IKE SA.
        full.cluster
            .control(&format!("rekey {}", full.tunnels[1].name))?;
        sites[1]
            .0
            .wait_child_rekeyed("net", &children[1].spi_in, UP)?;
        ping_all_vms(topo, 1, 3)?;

        // A steer node: the router withdraws its nexthop (as BGP/BFD would, here 50 ms after
        // the kill); the other steer node carries everything. The victim is the steer node the
        // data nodes send their output through (the first live one in their relay list: the
        // lowest id at the control node).
        let steer = relay_steer(&full.cluster)?;
        let t0 = epoch_secs(SystemTime::now());
        full.cluster.kill(&steer)?;
        std::thread::sleep(Duration::from_millis(50));
        full.cluster.withdraw_steer(&steer)?;
        full.cluster
            .wait_not_alive(&steer, Duration::from_secs(5))?;
        std::thread::sleep(Duration::from_millis(1000));
        let gaps: Vec<(String, u128)> = pingers
            .iter()
            .map(|p| (p.tenant.clone(), (p.longest_gap_since(t0) * 1e3) as u128))
            .collect();
        eprintln!(
            "steer node {steer} killed, nexthop withdrawn after 50 ms: longest gap between ping \
             replies {gaps:?} ms"
        );
        for (tenant, ms) in &gaps {
            assert!(*ms < 2000, "tenant {tenant}: traffic stopped for {ms} ms");
        }
        for s in 0..topo.sites.len() {
            ping_all_vms(topo, s, 3)?;
        }
        // It comes back: restarted, whole tables again, its nexthop restored.
        full.cluster.restart(&steer)?;
        full.cluster.restore_steer(&steer)?;
        for s in 0..topo.sites.len() {
            ping_all_vms(topo, s, 3)?;
        }

        // A steer node that dies silently (frozen: no TCP reset ends its session with control
        // at once, as when its host loses power). The router withdraws it after 50 ms; the
        // data nodes stop hearing its probes and send their output through the other steer
        // node within 50 ms (`HEARD_WINDOW_MS`), long before control drops its session.
        let frozen = relay_steer(&full.cluster)?;
        let t0 = epoch_secs(SystemTime::now());
        full.cluster.node(&frozen)?.process().signal(libc::SIGSTOP);
        std::thread::sleep(Duration::from_millis(50));
        full.cluster.withdraw_steer(&frozen)?;
        let noticed = full
            .cluster
            .wait_not_alive(&frozen, Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(500));
        let gaps: Vec<(String, u128)> = pingers
            .iter()
            .map(|p| (p.tenant.clone(), (p.longest_gap_since(t0) * 1e3) as u128))
            .collect();
        full.cluster.node(&frozen)?.process().signal(libc::SIGCONT);
        noticed?;
        eprintln!(
            "steer node {frozen} frozen (SIGSTOP), nexthop withdrawn after 50 ms: longest gap \
             between ping replies {gaps:?} ms"
        );
        for (tenant, ms) in &gaps {
            assert!(*ms < 1000, "tenant {tenant}: traffic stopped for {ms} ms");
        }
        full.cluster
            .wait_alive(&[frozen.as_str()], Duration::from_secs(15))?;
        full.cluster.restore_steer(&frozen)?;
        for s in 0..topo.sites.len() {
            ping_all_vms(topo, s, 3)?;
        }
        for p in &pingers {
            p.process.stop();
        }
        eprintln!("test d took {} ms", started.elapsed().as_millis());
        Ok(())
    })();
    full.cluster.finish(result)
}
