//! Shared pieces of the Protego interop suites (`protego_interop.rs`, `interop_*.rs`): the
//! standard one-tenant topology, the site's charon matching a gateway tunnel, ping checks and
//! status look-ups. Each test file includes this module with `mod common;`.

#![allow(dead_code, unreachable_pub)] // every suite uses a different subset, from a test crate

pub mod ike_craft;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use protego_testbed::cluster::ProtegoCluster;
use protego_testbed::protego::{GatewayTunnel, ProtegoGateway};
use protego_testbed::strongswan::{Charon, CharonSettings, Connection, SwanctlConfig};
use protego_testbed::topology::{SiteSpec, TenantSpec, VmSpec};
use protego_testbed::traffic::{self, IperfOptions, IperfResult, PingOptions};
use protego_testbed::wait::{wait_for, Probe};
use protego_testbed::{Cmd, Process, Result, Topology, TopologySpec};

pub const PSK: &str = "interop-test-psk-7f3a";
pub const UP: Duration = Duration::from_secs(20);

pub fn tenant(name: &str, vni: u32, behind_nat: bool, vms: Vec<VmSpec>) -> Result<TenantSpec> {
    Ok(TenantSpec {
        name: name.into(),
        vni,
        vnet: "10.2.0.0/24".parse()?,
        vnet6: None,
        vms,
        sites: vec![SiteSpec {
            lan: "10.1.0.0/24".parse()?,
            lan6: None,
            behind_nat,
        }],
    })
}

/// One tenant, one site, two VMs on two hosts.
pub fn one_tenant(behind_nat: bool) -> Result<TopologySpec> {
    Ok(TopologySpec {
        tenants: vec![tenant(
            "t1",
            4242,
            behind_nat,
            vec![VmSpec { host: 0 }, VmSpec { host: 1 }],
        )?],
        hosts: 2,
        ..TopologySpec::default()
    })
}

/// One tenant per `(name, VNI)`, the t-th (from 1) with its VNet `10.1<t>.0.0/24`, one site
/// with LAN `10.2<t>.0.0/24` and two VMs (one per cloud host); two hosts.
pub fn numbered_tenants(tenants: &[(&str, u32)]) -> Result<TopologySpec> {
    let mut specs = Vec::new();
    for (t, (name, vni)) in tenants.iter().enumerate() {
        specs.push(TenantSpec {
            name: (*name).to_owned(),
            vni: *vni,
            vnet: format!("10.1{}.0.0/24", t + 1).parse()?,
            vnet6: None,
            vms: vec![VmSpec { host: 0 }, VmSpec { host: 1 }],
            sites: vec![SiteSpec {
                lan: format!("10.2{}.0.0/24", t + 1).parse()?,
                lan6: None,
                behind_nat: false,
            }],
        });
    }
    Ok(TopologySpec {
        tenants: specs,
        hosts: 2,
        ..TopologySpec::default()
    })
}

/// True if etcd is not installed and the calling test `test` must skip itself; under `make test`
/// and in CI a missing etcd fails the test instead (see `testreq`).
pub fn skip_without_etcd(test: &str) -> bool {
    !(testreq::program(test, "etcd") && testreq::program(test, "etcdctl"))
}

/// Starts the site's charon with the standard connection toward Protego, matching `tun`.
pub fn site_charon(topo: &Topology, tun: &GatewayTunnel) -> Result<Charon> {
    let label = format!("site{}", tun.site);
    site_charon_with(topo, tun, &label, &CharonSettings::default(), |_| {})
}

/// Starts the site's charon toward Protego ([`site_charon`]), brings the tunnel up and waits
/// until every VM answers ([`warm_up`]).
pub fn site_up(topo: &Topology, tun: &GatewayTunnel) -> Result<Charon> {
    let site = site_charon(topo, tun)?;
    site.initiate("net", UP)?;
    site.wait_child_installed("net", UP)?;
    warm_up(topo, tun.site)?;
    Ok(site)
}

/// Starts a charon labelled `label` with `settings` on the site of `tun` and loads the
/// standard connection toward Protego, matching `tun`, after `edit` adjusted it (proposals,
/// rekey times...).
pub fn site_charon_with(
    topo: &Topology,
    tun: &GatewayTunnel,
    label: &str,
    settings: &CharonSettings,
    edit: impl FnOnce(&mut Connection),
) -> Result<Charon> {
    let (mut conn, _) = topo.site_connections(tun.site, &tun.psk);
    tun.apply_to_site(&mut conn);
    edit(&mut conn);
    let charon = Charon::start(&topo.sites[tun.site].ns, label, settings)?;
    charon.load(&SwanctlConfig::new(vec![conn]))?;
    Ok(charon)
}

/// Waits (at most 5 s) until every VM of the site's tenant answers one ping from the site: a
/// tunnel just set up may still be resolving neighbours on the way (the first packet to a VM
/// waits for its ARP answer), which is not what the caller measures.
pub fn warm_up(topo: &Topology, site: usize) -> Result<()> {
    warm_up_within(topo, site, Duration::from_secs(5))
}

/// [`warm_up`] waiting at most `timeout`.
pub fn warm_up_within(topo: &Topology, site: usize, timeout: Duration) -> Result<()> {
    topo.wait_vms_answer(site, timeout)
}

/// Pings every VM of the site's tenant from the site's LAN address; asserts nothing is lost.
pub fn ping_all_vms(topo: &Topology, site: usize, count: u32) -> Result<()> {
    let s = &topo.sites[site];
    for vm in &topo.tenants[s.tenant].vms {
        let ping = traffic::ping(
            &s.ns,
            vm.addr.addr,
            &PingOptions::new(count, Duration::from_millis(10)).from(s.lan_addr),
        )?;
        assert!(
            ping.all_received(),
            "site {site} -> vm {}: {ping:?}",
            vm.addr
        );
    }
    Ok(())
}

/// The `tunnels` entry of `protego status --json` named `name`.
/// From the first VM of site `site`'s tenant back to the site (10 pings, every one answered),
/// then a 2-second iperf3 TCP stream from the site's LAN to that VM: the stream's result.
pub fn back_and_tcp(topo: &Topology, site: usize) -> Result<IperfResult> {
    let s = &topo.sites[site];
    let vm = &topo.tenants[s.tenant].vms[0];
    let back = traffic::ping(
        &vm.ns,
        s.lan_addr,
        &PingOptions::new(10, Duration::from_millis(10)),
    )?;
    assert!(back.all_received(), "vm -> site: {back:?}");
    let server = traffic::iperf3_server(&vm.ns, vm.addr.addr, traffic::IPERF3_PORT)?;
    let mut opts = IperfOptions::tcp(Duration::from_secs(2));
    opts.bind = Some(s.lan_addr);
    let perf = traffic::iperf3_client(&s.ns, vm.addr.addr, &opts);
    server.process.stop();
    let perf = perf?;
    assert!(perf.received_bps > 1e6, "{perf:?}");
    Ok(perf)
}

pub fn tunnel_status(gw: &ProtegoGateway, name: &str) -> Result<serde_json::Value> {
    let status = gw.status_json()?;
    let found = status["tunnels"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == name).cloned());
    Ok(found.unwrap_or_else(|| panic!("tunnel {name} missing from status: {status}")))
}

/// SIGKILL, for killing a peer without letting it send a DELETE.
pub const SIGKILL: i32 = 9;

/// Seconds since the Unix epoch.
pub fn epoch_secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// A 100 Hz ping from the site's LAN to VM 0 that runs in the background and prints the
/// arrival time of every reply (`ping -D`), to time an outage.
pub struct OutagePing {
    /// The ping process (its log holds the replies).
    pub process: Process,
}

impl OutagePing {
    pub fn start(topo: &Topology) -> Result<OutagePing> {
        let s = &topo.sites[0];
        let vm = &topo.tenants[0].vms[0];
        // Line-buffered, so that replies show in the log while it runs.
        let cmd = Cmd::new("stdbuf").args(["-oL", "ping", "-n", "-D", "-i", "0.01", "-W", "1"]);
        let cmd = cmd.args([
            "-I".to_owned(),
            s.lan_addr.to_string(),
            vm.addr.addr.to_string(),
        ]);
        Ok(OutagePing {
            process: s.ns.spawn("outage-ping", cmd)?,
        })
    }

    /// Arrival times of the replies so far (seconds since the epoch).
    pub fn replies(&self) -> Vec<f64> {
        // `[1700000000.123456] 64 bytes from 10.2.0.2: icmp_seq=7 ttl=63 time=0.4 ms`
        self.process
            .log()
            .lines()
            .filter(|l| l.contains("bytes from"))
            .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse().ok())
            .collect()
    }

    /// Waits up to `limit` after `since` for the first reply that arrived after `since`.
    pub fn first_reply_after(&self, since: SystemTime, limit: Duration) -> Result<Duration> {
        let t0 = epoch_secs(since);
        let deadline = since + limit;
        wait_for(
            "a ping reply after the kill",
            deadline
                .duration_since(SystemTime::now())
                .unwrap_or_default(),
            || {
                Ok(match self.replies().into_iter().find(|&t| t > t0) {
                    Some(t) => Probe::Ready(Duration::from_secs_f64(t - t0)),
                    None => Probe::NotYet(self.process.log_tail(3)),
                })
            },
        )
    }
}

/// iperf3 TCP from site `site`'s LAN to VM 0 of its tenant (whose server listens on `port`),
/// in a thread: one run per `(Mbit/s, seconds)` step, with writes of `length` bytes if given.
pub fn iperf_thread(
    topo: &Topology,
    site: usize,
    port: u16,
    steps: Vec<(u64, u64)>,
    length: Option<u32>,
) -> std::thread::JoinHandle<Result<Vec<IperfResult>>> {
    let s = &topo.sites[site];
    let vm = &topo.tenants[s.tenant].vms[0];
    let (ns, bind, dst) = (s.ns.clone(), s.lan_addr, vm.addr.addr);
    std::thread::spawn(move || {
        let mut out = Vec::with_capacity(steps.len());
        for (mbit, secs) in steps {
            let mut o = IperfOptions::tcp(Duration::from_secs(secs));
            o.bind = Some(bind);
            o.port = port;
            o.tcp_bitrate = Some(mbit * 1_000_000);
            o.length = length;
            out.push(traffic::iperf3_client(&ns, dst, &o)?);
        }
        Ok(out)
    })
}

/// Waits for an [`iperf_thread`] of one step and returns that run.
pub fn iperf_result(
    thread: std::thread::JoinHandle<Result<Vec<IperfResult>>>,
) -> Result<IperfResult> {
    let mut runs = thread.join().expect("iperf3 thread")?;
    Ok(runs.remove(0))
}

/// Runs `body`; on failure prints every cluster node's log tail. Stops the cluster either way.
pub fn with_logs(cluster: &ProtegoCluster, body: impl FnOnce() -> Result<()>) -> Result<()> {
    let result = body();
    if result.is_err() {
        eprintln!("{}", cluster.log_tails(80));
    }
    cluster.stop_all();
    result
}

/// The host-side veth of VM `vm` of tenant 0 on its cloud host: the bridge port that is not
/// the VXLAN device.
pub fn host_veth(topo: &Topology, vm: usize) -> Result<String> {
    let v = &topo.tenants[0].vms[vm];
    let host = &topo.hosts[v.host];
    let seg = &host.segments[0];
    let out = host
        .ns
        .ip(["-j", "link", "show", "master", seg.bridge.as_str()])?;
    let links: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    let vm_mac = v.mac.to_lowercase();
    // The VM's own interface is the veth's peer: find the port whose peer is in the VM's
    // namespace by elimination (not the VXLAN device, and not another VM's port).
    let ports: Vec<String> = links
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
                .filter(|n| *n != seg.vxlan_if)
                .collect()
        })
        .unwrap_or_default();
    let peer_index =
        v.ns.ip(["-j", "link", "show", v.ifname.as_str()])
            .ok()
            .and_then(|o| serde_json::from_str::<serde_json::Value>(&o).ok())
            .and_then(|j| j[0]["link_index"].as_u64());
    for p in &ports {
        let j: serde_json::Value =
            serde_json::from_str(&host.ns.ip(["-j", "link", "show", p.as_str()])?)
                .unwrap_or_default();
        if peer_index.is_some() && j[0]["ifindex"].as_u64() == peer_index {
            return Ok(p.clone());
        }
    }
    Err(protego_testbed::Error::InvalidSpec {
        field: "vm veth".into(),
        reason: format!("no bridge port of {vm_mac} among {ports:?}"),
    })
}

/// What the site's traffic to VM 0 saw while something ran ([`under_traffic`]).
pub struct UnderTraffic {
    /// The 1 kHz probe stream over as long a time before it started (at most 1.8 s: the TCP
    /// stream's first 0.2 s are left out), the same traffic without it: a window's longest
    /// stall grows with its length.
    pub before: Option<protego_testbed::probe::ProbeStats>,
    /// The probe stream while it ran.
    pub during: Option<protego_testbed::probe::ProbeStats>,
    /// How long it ran.
    pub took: Duration,
    /// The iperf3 TCP stream that ran across it.
    pub iperf: IperfResult,
}

impl std::fmt::Display for UnderTraffic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |s: &Option<protego_testbed::probe::ProbeStats>| {
            match s {
            Some(s) => format!(
                "stall {:.1} ms (longest gap {:.1} ms less the sender's {:.1} ms; delay median {:.2} ms, max {:.1} ms), {} of {} probes lost, {} reordered",
                s.stall_us() as f64 / 1e3,
                s.longest_gap_us as f64 / 1e3,
                s.sender_gap_us as f64 / 1e3,
                s.median_delay_us as f64 / 1e3,
                s.max_delay_us as f64 / 1e3,
                s.sent - s.received,
                s.sent,
                s.reordered
            ),
            None => "no probes".to_owned(),
        }
        };
        write!(
            f,
            "during ({:.0} ms): {}; as long before: {}; iperf3 TCP site -> VM {:.0} Mbit/s",
            self.took.as_secs_f64() * 1e3,
            show(&self.during),
            show(&self.before),
            self.iperf.received_bps / 1e6
        )
    }
}

/// Runs `during` while the site sends an iperf3 TCP stream and a 1 kHz timestamped probe
/// stream (`protego_testbed::probe`) to VM 0 of tenant 0 through the tunnel, and returns its
/// result and what the traffic saw: the probe stream's longest stall while it ran and over as
/// long a time before (at most 1.8 s), and the TCP stream's rate. `during` must finish within
/// about 4 s.
pub fn under_traffic<T>(
    topo: &Topology,
    during: impl FnOnce() -> Result<T>,
) -> Result<(T, UnderTraffic)> {
    use protego_testbed::probe::{self, ProbeStream};
    let site = &topo.sites[0];
    let vm = &topo.tenants[0].vms[0];
    let server = traffic::iperf3_server(&vm.ns, vm.addr.addr, 5201)?;
    let stream = ProbeStream::start(
        &site.ns,
        site.lan_addr,
        &vm.ns,
        std::net::SocketAddr::new(vm.addr.addr, 6000),
        1000,
        Duration::from_secs(12),
    )?;
    let (ns, to, from) = (site.ns.clone(), server.addr, site.lan_addr);
    let iperf = std::thread::spawn(move || {
        let mut opts = IperfOptions::tcp(Duration::from_secs(7));
        opts.bind = Some(from);
        traffic::iperf3_client(&ns, to, &opts)
    });
    // TCP at full rate before the start.
    std::thread::sleep(Duration::from_secs(2));
    let now_ns = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    };
    let t0 = now_ns();
    let started = std::time::Instant::now();
    let out = during();
    let took = started.elapsed();
    let t1 = now_ns();
    let iperf = iperf
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
    let samples = stream.finish()?;
    drop(server);
    let out = out?;
    let iperf = iperf?;
    Ok((
        out,
        UnderTraffic {
            before: probe::stats(
                &samples,
                t0.saturating_sub((took.as_nanos() as u64).min(1_800_000_000)),
                t0,
            ),
            during: probe::stats(&samples, t0, t1),
            took,
            iperf,
        },
    ))
}

/// Writes a route file of `entries` per-VM entries of tenant 0's VNet in 172.16.0.0/12
/// pointing at the host VM 0 is not on, and VM 0's own entry at its host (the traffic of
/// [`under_traffic`] goes through it), to `path`. Returns the number of lines.
pub fn write_route_load(topo: &Topology, entries: u32, path: &std::path::Path) -> Result<u32> {
    let tenant = &topo.tenants[0].name;
    let vm = &topo.tenants[0].vms[0];
    let other = topo.hosts[1 - vm.host].underlay.addr;
    let mut text = String::with_capacity(entries as usize * 40);
    for i in 0..entries {
        let a = std::net::Ipv4Addr::from(0xac10_0000u32 + i + 1);
        text.push_str(&format!("{tenant},vnet,{a},{other}\n"));
    }
    text.push_str(&format!(
        "{tenant},vnet,{},{}\n",
        vm.addr.addr, topo.hosts[vm.host].underlay.addr
    ));
    std::fs::write(path, &text).map_err(|e| protego_testbed::Error::Io {
        action: "write the route file",
        path: path.to_path_buf(),
        source: e,
    })?;
    Ok(entries + 1)
}

/// What [`move_vm_under_ping`] saw.
pub struct VmMove {
    /// Pings (of [`MOVE_PINGS`], 1 ms apart) without a reply.
    pub lost: usize,
    /// From the VM's veth leaving its host to the route change's answer.
    pub gap: std::time::Duration,
    /// The route change's answer.
    pub answer: serde_json::Value,
    /// ping's output.
    pub log: String,
}

/// Pings sent 1 ms apart around a VM's move.
pub const MOVE_PINGS: usize = 3000;

/// Moves VM 0 of tenant 0 from host `from` to host `to` (its veth leaves one bridge for the
/// other, keeping its namespace, address and MAC, as in a live migration) while the site pings
/// it every millisecond (an interval below 2 ms needs root, as these tests run), then points
/// its entry at the new host with `point(new host's underlay address)`.
pub fn move_vm_under_ping(
    topo: &Topology,
    from: usize,
    to: usize,
    point: impl FnOnce(std::net::IpAddr) -> Result<serde_json::Value>,
) -> Result<VmMove> {
    let vm = &topo.tenants[0].vms[0];
    let (from, to) = (&topo.hosts[from], &topo.hosts[to]);
    let s = &topo.sites[0];
    let ping = s.ns.spawn(
        "move-ping",
        Cmd::new("ping").args([
            "-n".to_owned(),
            "-i".to_owned(),
            "0.001".to_owned(),
            "-c".to_owned(),
            MOVE_PINGS.to_string(),
            "-W".to_owned(),
            "1".to_owned(),
            "-I".to_owned(),
            s.lan_addr.to_string(),
            vm.addr.addr.to_string(),
        ]),
    )?;
    std::thread::sleep(Duration::from_millis(800));
    let veth = host_veth(topo, 0)?;
    let moved = std::time::Instant::now();
    from.ns
        .ip(["link", "set", veth.as_str(), "netns", to.ns.name()])?;
    to.ns.set_master(&veth, &to.segments[0].bridge)?;
    to.ns.link_up(&veth)?;
    let answer = point(to.underlay.addr)?;
    let gap = moved.elapsed();
    ping.wait(Duration::from_secs(10))?;
    let log = ping.log();
    let received = log.lines().filter(|l| l.contains("bytes from")).count();
    // ping's summary: that it kept its interval (its `time`) through the move.
    if let Some(summary) = log.lines().find(|l| l.contains("packets transmitted")) {
        eprintln!("ping: {summary}");
    }
    Ok(VmMove {
        lost: MOVE_PINGS.saturating_sub(received),
        gap,
        answer,
        log,
    })
}
