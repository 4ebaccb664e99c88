//! Customers attached at L2 in the distributed form (issue 16 §1 and §4): the customers'
//! trunk is cabled to the steer node (`[steer] ports`), which steers their frames by tag pair
//! to the data node serving each attachment, inside Geneve; the control node places the
//! attachments (`[[attachment]] steer`), moves them with `migrate` and `drain`, and moves them
//! off a data node that dies.
//!
//! ```text
//!  site (strongSwan) ══ IKEv2/ESP ══╗
//!  cea (10.99.0.2, S=100) ─┐        ║ VIP
//!  ceb (10.99.0.2, S=200) ─┼─ l2 ══ trunk ══ steer1 ══ Geneve ══ data1 / data2 ── VXLAN ── host0
//!  cex (10.99.0.2, S=300) ─┘  (tagger)    (the gateway namespace)                    (VMs)
//! ```
//!
//! Two tenants with identical address plans (red also has an IPsec site whose selectors
//! include red's CE segment), one cloud host with a VM each. Checked: pings both ways for
//! both customers and between red's CE and red's site, isolation by captures on the VMs, TCP
//! both ways, an unknown tag pair dropped and counted on the steer node, `migrate` and
//! `drain` under 1 kHz pings with nothing lost, and `kill -9` of the serving data node
//! (the outage is printed; it is bounded by the failure detection). The kernels the tests
//! run on have no VLAN support: `protego-l2tag` tags in userspace
//! (see `protego_testbed::customers`). Needs root, the tools of `scripts/setup.sh` and the
//! workspace's binaries in the test profile (`make test` builds them).

mod common;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime};

use common::{epoch_secs, with_logs};
use protego_testbed::cluster::{ClusterSpec, ProbeSettings, ProtegoCluster};
use protego_testbed::customers::{Attachment, CustomerLan};
use protego_testbed::protego::GatewayTunnel;
use protego_testbed::topology::{TenantSpec, VmSpec};
use protego_testbed::traffic::{self, IperfOptions, PingOptions, PingStats};
use protego_testbed::wait::{wait_for, Probe};
use protego_testbed::{Cmd, Netns, Prefix, Result, Testbed, Topology, TopologySpec};

/// The CEs' address on the segment, the same for every customer.
const CE_IP: &str = "10.99.0.2";
/// The gateway's address on each attachment's segment.
const GW_IP: &str = "10.99.0.1";
/// The CEs' segment (each attachment's `routes`).
const SEGMENT: &str = "10.99.0.0/24";

fn addr(s: &str) -> IpAddr {
    s.parse().expect("constant address")
}

fn blue() -> Result<TenantSpec> {
    Ok(TenantSpec {
        name: "blue".into(),
        vni: 1002,
        vnet: "10.2.0.0/24".parse()?,
        vnet6: None,
        vms: vec![VmSpec { host: 0 }],
        sites: vec![],
    })
}

/// The data node serving attachment `name` (`nodes`' `attachments`), once it is steered.
fn serving(cluster: &ProtegoCluster, name: &str) -> Result<Option<String>> {
    let nodes = cluster.nodes()?;
    Ok(nodes["attachments"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["name"] == name && a["steered"] == true)
        .and_then(|a| a["node"].as_str().map(str::to_owned)))
}

/// Waits until attachment `name` is served by a live data node other than `not`.
fn wait_served(cluster: &ProtegoCluster, name: &str, not: Option<&str>) -> Result<String> {
    wait_for(
        &format!("attachment {name} served"),
        Duration::from_secs(20),
        || {
            Ok(match serving(cluster, name)? {
                Some(n) if Some(n.as_str()) != not => Probe::Ready(n),
                other => Probe::NotYet(format!("{other:?}")),
            })
        },
    )
}

/// Drop counters of node `node` as its reports gave them (`status`'s `drops`, named
/// `<node>:<reason>`).
fn node_drops(cluster: &ProtegoCluster, node: &str) -> Result<BTreeMap<String, u64>> {
    let status = cluster.control("status")?;
    let prefix = format!("{node}:");
    Ok(status["drops"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.to_owned(), v.as_u64()?)))
        .collect())
}

/// The steer node's counters of each attachment (`nodes`' `attachments`) after the pings
/// above: every customer sent and got at least 100 frames (its pings to the VM and, for red,
/// to its site, which go to the tunnel's node; the VMs' pings to the CEs), none dropped; the
/// stranger's frames (S-tag 300) are nobody's. Waits for the steer node's next report.
fn attachment_counters_show_the_pings(cluster: &ProtegoCluster) -> Result<()> {
    let counters = wait_for(
        "both attachments' frames reported by steer1",
        Duration::from_secs(10),
        || {
            let nodes = cluster.nodes()?;
            let all: Vec<serde_json::Value> =
                nodes["attachments"].as_array().cloned().unwrap_or_default();
            let ready = all.len() == 2
                && all.iter().all(|a| {
                    a["from_ce_frames"].as_u64() >= Some(100)
                        && a["to_ce_frames"].as_u64() >= Some(100)
                });
            Ok(if ready {
                Probe::Ready(nodes)
            } else {
                Probe::NotYet(format!("{all:?}"))
            })
        },
    )?;
    for a in counters["attachments"].as_array().into_iter().flatten() {
        eprintln!("attachment counters: {a}");
        let s_tag = if a["name"] == "red-dc" { 100 } else { 200 };
        assert_eq!(
            (a["s_tag"].as_u64(), a["c_tag"].as_u64()),
            (Some(s_tag), Some(10))
        );
        let (frames, bytes) = (&a["from_ce_frames"], &a["from_ce_bytes"]);
        // Every frame carries both tags: at least an unpadded ARP's 42 bytes and 8 of tags.
        assert!(bytes.as_u64() >= frames.as_u64().map(|f| f * 50), "{a}");
        if a["dropped"] != 0 {
            let why = node_drops(cluster, "steer1")?;
            panic!("{a}: frames dropped; steer1's drops by reason: {why:?}");
        }
    }
    let steer1 = counters["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["name"] == "steer1")
        .expect("steer1 in nodes");
    let listed = steer1["load"]["attachments"].as_array().map(Vec::len);
    assert_eq!(listed, Some(2), "only the two attachments: {steer1}");
    Ok(())
}

/// A ping from `ns` to `dst` in a thread.
fn ping_thread(
    ns: &Netns,
    dst: IpAddr,
    count: u32,
    interval: Duration,
) -> std::thread::JoinHandle<Result<PingStats>> {
    let ns = ns.clone();
    std::thread::spawn(move || traffic::ping(&ns, dst, &PingOptions::new(count, interval)))
}

#[test]
fn customers_on_a_steer_node_port_reach_their_vms_through_moves_and_a_data_node_kill() -> Result<()>
{
    let bed = Testbed::new()?;
    let spec = TopologySpec {
        tenants: vec![
            common::tenant("red", 1001, false, vec![VmSpec { host: 0 }])?,
            blue()?,
        ],
        hosts: 1,
        ..TopologySpec::default()
    };
    let topo = Topology::build(&bed, spec)?;
    // One steer node: it runs in the gateway namespace, where the trunk ends.
    let mut lan = CustomerLan::build(&bed, &topo.gateway.ns)?;
    let vnet: Prefix = "10.2.0.0/24".parse()?;
    let (ce, gw_ip) = (addr(CE_IP), addr(GW_IP));
    let red_ce = lan.customer(&bed, "cea", (100, 10), ce, gw_ip, &[vnet])?;
    let blue_ce = lan.customer(&bed, "ceb", (200, 10), ce, gw_ip, &[vnet])?;
    let stranger = lan.customer(&bed, "cex", (300, 10), ce, gw_ip, &[vnet])?;
    lan.start_tagger()?;
    let on_port = |name, tenant, tags, ce_ip| Attachment {
        name,
        tenant,
        interface: &lan.trunk.peer,
        steer: Some("steer1"),
        tags,
        gateway_ip: gw_ip,
        ce_ip,
        routes: &[SEGMENT],
    };
    // Red names its CE's address (the gateway asks for its MAC); blue's is learned.
    let tables = on_port("red-dc", "red", (100, 10), Some(ce)).toml()
        + &on_port("blue-dc", "blue", (200, 10), None).toml();
    let mut tun = GatewayTunnel::for_site(&topo, 0, common::PSK);
    tun.extra_local_ts = vec![SEGMENT.to_owned()];
    // The iperf3 streams below keep both of this machine's cores busy with the CE, the VM,
    // the tagger and four nodes; a data node starved for the default 3 x 30 ms was declared
    // lost there (and the frames steered to it meanwhile dropped as node_dead), which is a
    // verdict on the machine, not on the gateway. Probes that wait 100 ms and give up after 5
    // misses still find the killed node well inside the outage this test allows.
    let spec = ClusterSpec {
        extra_steer: vec![format!("ports = [{:?}]", lan.trunk.peer)],
        extra_tables: tables,
        probe: ProbeSettings {
            timeout: Duration::from_millis(100),
            misses: 5,
            ..ProbeSettings::default()
        },
        ..ClusterSpec::default()
    };
    let cluster = ProtegoCluster::start(&bed, &topo, std::slice::from_ref(&tun), &spec)?;
    with_logs(&cluster, || {
        let site = common::site_charon_with(&topo, &tun, "site0", &Default::default(), |c| {
            for child in &mut c.children {
                child.remote_ts.push(SEGMENT.to_owned());
            }
        })?;
        site.initiate("net", common::UP)?;
        site.wait_child_installed("net", common::UP)?;
        common::warm_up(&topo, 0)?;
        let red_node = wait_served(&cluster, "red-dc", None)?;
        let blue_node = wait_served(&cluster, "blue-dc", None)?;
        eprintln!("red-dc on {red_node}, blue-dc on {blue_node}");

        let red_vm = &topo.tenants[0].vms[0];
        let blue_vm = &topo.tenants[1].vms[0];
        let vm_ip = red_vm.addr.addr;
        assert_eq!(vm_ip, blue_vm.addr.addr, "identical address plans");

        // VM -> red CE first (the serving data node asks for the CE's MAC), then both ways.
        let warm = traffic::ping(
            &red_vm.ns,
            ce,
            &PingOptions::new(5, Duration::from_millis(300)),
        )?;
        assert!(warm.received >= 3, "VM -> red CE while resolving: {warm:?}");
        let fast = PingOptions::new(30, Duration::from_millis(20));
        for (what, ns, dst) in [
            ("red VM -> CE", &red_vm.ns, ce),
            ("red CE -> VM", &red_ce, vm_ip),
            ("blue CE -> VM", &blue_ce, vm_ip),
            ("blue VM -> CE", &blue_vm.ns, ce),
        ] {
            let p = traffic::ping(ns, dst, &fast)?;
            assert!(p.all_received(), "{what}: {p:?}");
        }

        // Red's CE and red's site through red's tunnel, both ways.
        let red_site = &topo.sites[0];
        let site_ip = red_site.lan_addr;
        red_ce.add_route(red_site.lan, gw_ip)?;
        let p = traffic::ping(&red_ce, site_ip, &fast)?;
        assert!(p.all_received(), "red CE -> site: {p:?}");
        let p = traffic::ping(&red_site.ns, ce, &fast.clone().from(site_ip))?;
        assert!(p.all_received(), "red site -> CE: {p:?}");

        // Isolation: both customers ping the same VM address at once, marked by size.
        let red_cap = traffic::capture(&red_vm.ns, &red_vm.ifname, "icmp", "red")?;
        let blue_cap = traffic::capture(&blue_vm.ns, &blue_vm.ifname, "icmp", "blue")?;
        let sized = |size| {
            let mut o = PingOptions::new(40, Duration::from_millis(10));
            o.size = Some(size);
            o
        };
        std::thread::scope(|scope| -> Result<()> {
            let a = scope.spawn(|| traffic::ping(&red_ce, vm_ip, &sized(111)));
            let b = scope.spawn(|| traffic::ping(&blue_ce, vm_ip, &sized(222)));
            for (who, p) in [("red", a), ("blue", b)] {
                let p = p.join().expect("pinger")?;
                assert!(p.all_received(), "{who}: {p:?}");
            }
            Ok(())
        })?;
        red_cap.wait_for_packets("icmp && ip.len == 139", 80, Duration::from_secs(10));
        blue_cap.wait_for_packets("icmp && ip.len == 250", 80, Duration::from_secs(10));
        let (red, blue) = (red_cap.stop(), blue_cap.stop());
        let crossed = (
            traffic::tshark_count(&red, "icmp && ip.len == 250")?,
            traffic::tshark_count(&blue, "icmp && ip.len == 139")?,
        );
        assert_eq!(
            crossed,
            (0, 0),
            "a customer's packets reached the other VNet"
        );

        // TCP both ways between red's CE and its VM.
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

        // A customer with no attachment (S-tag 300): dropped and counted on the steer node.
        let p = traffic::ping(
            &stranger,
            vm_ip,
            &PingOptions::new(3, Duration::from_millis(300)),
        )?;
        assert_eq!(p.received, 0, "an unknown tag pair got through: {p:?}");
        wait_for(
            "port_unknown_tags on steer1",
            Duration::from_secs(10),
            || {
                let d = node_drops(&cluster, "steer1")?;
                Ok(match d.get("port_unknown_tags") {
                    Some(n) if *n >= 3 => Probe::Ready(()),
                    _ => Probe::NotYet(format!("{d:?}")),
                })
            },
        )?;

        attachment_counters_show_the_pings(&cluster)?;

        // migrate under 1 kHz pings of both customers: nothing lost.
        let others = |not: &str| {
            cluster
                .data_node_names()
                .into_iter()
                .find(|n| n != not)
                .expect("two data nodes")
        };
        let from = serving(&cluster, "red-dc")?.expect("red-dc is served");
        let to = others(&from);
        let pings = [
            ping_thread(&red_ce, vm_ip, 3000, Duration::from_millis(1)),
            ping_thread(&blue_ce, vm_ip, 3000, Duration::from_millis(1)),
        ];
        std::thread::sleep(Duration::from_millis(800));
        let answer = cluster.control(&format!("migrate red-dc {to}"))?;
        assert_eq!(answer["ok"], true, "{answer}");
        for p in pings {
            let p = p.join().expect("pinger")?;
            assert_eq!(
                p.lost(),
                0,
                "pings lost in the migration {from} -> {to}: {p:?}"
            );
        }
        assert_eq!(serving(&cluster, "red-dc")?.as_deref(), Some(to.as_str()));
        eprintln!("red-dc migrated {from} -> {to}: {answer}");

        // drain of blue's node under 1 kHz pings: nothing lost, and blue-dc leaves it.
        let victim = serving(&cluster, "blue-dc")?.expect("blue-dc is served");
        let pings = [
            ping_thread(&red_ce, vm_ip, 2500, Duration::from_millis(1)),
            ping_thread(&blue_ce, vm_ip, 2500, Duration::from_millis(1)),
        ];
        std::thread::sleep(Duration::from_millis(500));
        let answer = cluster.control(&format!("drain {victim}"))?;
        assert_eq!(answer["ok"], true, "{answer}");
        for p in pings {
            let p = p.join().expect("pinger")?;
            assert_eq!(p.lost(), 0, "pings lost in the drain of {victim}: {p:?}");
        }
        let now = serving(&cluster, "blue-dc")?;
        assert!(
            now.is_some() && now.as_deref() != Some(victim.as_str()),
            "{now:?}"
        );
        cluster.control(&format!("undrain {victim}"))?;

        // kill -9 of the data node serving red-dc under a 100 Hz ping: traffic comes back on
        // the other data node once the steer node's probes notice.
        let serving_red = serving(&cluster, "red-dc")?.expect("red-dc is served");
        let pinger = red_ce.spawn(
            "outage-ping",
            Cmd::new("stdbuf").args([
                "-oL".to_owned(),
                "ping".to_owned(),
                "-n".to_owned(),
                "-D".to_owned(),
                "-i".to_owned(),
                "0.01".to_owned(),
                "-W".to_owned(),
                "1".to_owned(),
                vm_ip.to_string(),
            ]),
        )?;
        std::thread::sleep(Duration::from_millis(500));
        let killed = SystemTime::now();
        let t0 = Instant::now();
        cluster.kill(&serving_red)?;
        let after = wait_served(&cluster, "red-dc", Some(&serving_red))?;
        // The outage: the longest silence between replies around the kill, once replies flow
        // again for half a second.
        let t = epoch_secs(killed);
        let replies = |log: &str| -> Vec<f64> {
            log.lines()
                .filter(|l| l.contains("bytes from"))
                .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse::<f64>().ok())
                .filter(|&r| r > t - 0.1)
                .collect()
        };
        let outage = wait_for(
            "replies again after the kill",
            Duration::from_secs(10),
            || {
                let r = replies(&pinger.log());
                Ok(match r.last() {
                    Some(&last) if last > t + 0.5 => {
                        let gap = r.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
                        Probe::Ready(Duration::from_secs_f64(gap))
                    }
                    _ => Probe::NotYet(format!("{} replies since the kill", r.len())),
                })
            },
        )?;
        // Requests lost: the sequence numbers missing among the replies after the kill.
        let seqs: Vec<u64> = pinger
            .log()
            .lines()
            .filter(|l| l.contains("bytes from"))
            .filter(|l| {
                l.strip_prefix('[')
                    .and_then(|l| l.split(']').next())
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(|r| r > t)
            })
            .filter_map(|l| l.split("icmp_seq=").nth(1)?.split(' ').next()?.parse().ok())
            .collect();
        let lost = match (seqs.first(), seqs.last()) {
            (Some(a), Some(b)) => (b - a + 1).saturating_sub(seqs.len() as u64),
            _ => 0,
        };
        pinger.stop();
        eprintln!(
            "kill -9 of {serving_red}: red-dc moved to {after} within {} ms; the longest silence \
             between replies at 100 Hz around the kill: {} ms, {lost} requests lost",
            t0.elapsed().as_millis(),
            outage.as_millis()
        );
        assert!(
            outage < Duration::from_secs(3),
            "outage of {} ms around the kill",
            outage.as_millis()
        );
        let p = traffic::ping(&red_ce, vm_ip, &fast)?;
        assert!(p.all_received(), "red CE -> VM after the kill: {p:?}");
        let p = traffic::ping(&red_vm.ns, ce, &fast)?;
        assert!(p.all_received(), "red VM -> CE after the kill: {p:?}");
        Ok(())
    })
}
