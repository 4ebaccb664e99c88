//! `protego bench site`: the gateway's cost as a user sees it (issue 23 §1). An unmodified
//! strongSwan 5.9 site (charon with kernel-libipsec, as `crates/testbed` runs it) brings up a
//! tunnel and sends iperf3 TCP streams from its LAN to a VM behind a kernel VXLAN host,
//! through two gateways in the same run:
//!
//! - Protego: `protego up` in the gateway namespace (decrypt, VXLAN to the host, and the
//!   VM's ACKs back through ESP);
//! - strongSwan as the responder: charon with kernel-libipsec in its own copy of the same
//!   topology, the gateway namespace's kernel VXLAN device delivering to the same kind of host.
//!
//! Each gateway's CPU is read from `/proc/<pid>/task/*/schedstat` (every thread's run time,
//! user and kernel) around each iperf3 run and divided by the bytes the VM received. A veth
//! runs the receiving side's path (the bridge, the host's VXLAN decapsulation, the site's
//! socket delivery) in the softirq of the sending system call and so bills it to the sender,
//! which a real NIC does not: every run is made twice, `veth` (as billed) and `threaded`
//! (the switch-side ends of the gateway's links deliver what it sends in NAPI threads of
//! their own, `Topology::set_gateway_links_threaded`), for both gateways alike. In both
//! modes the kernel's receive path of what is sent *to* a gateway runs in the sender's
//! context and is billed to neither gateway. The
//! gateways take turns (the order alternates by round) so that neither always runs first on
//! a warm machine; the ratio is taken within each round and reported with its spread.
//! Nothing here asserts a figure: it is a benchmark.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use testbed::protego::{GatewayTunnel, ProtegoGateway};
use testbed::strongswan::{Charon, CharonSettings, SwanctlConfig};
use testbed::topology::{SiteSpec, TenantSpec, VmSpec};
use testbed::traffic::{self, Iperf3Server, IperfOptions, IPERF3_PORT};
use testbed::{CleanupHandle, Testbed, Topology, TopologySpec};

use crate::cpu;
use crate::error::{BenchError, Result};
use crate::report::{Machine, Target};

/// How long a tunnel may take to come up.
const UP: Duration = Duration::from_secs(30);
/// The tunnels' pre-shared key (a test secret: the namespaces exist only for the run).
const PSK: &str = "site-bench-psk-7f3a91";

/// Options of `protego bench site`.
#[derive(Debug, Clone)]
pub struct SiteOptions {
    /// The `protego` binary under test (default: the one beside this process).
    pub protego_bin: Option<PathBuf>,
    /// Parallel TCP streams of each iperf3 run (`-P`).
    pub streams: Vec<u32>,
    /// Length of each iperf3 run.
    pub duration: Duration,
    /// Rounds: each round runs every stream count through both gateways.
    pub rounds: u32,
    /// Extra `key = value` lines for Protego's `[gateway]` table (e.g. `workers = 1`).
    pub gateway_options: Vec<String>,
    /// How the gateways' links deliver what they send.
    pub links: Vec<Links>,
}

/// How the gateway's links deliver what it sends (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Plain veths: the receiving side's path runs in the gateway's sending system call.
    Veth,
    /// The switch-side ends in threaded NAPI: the gateway pays for its own work only.
    Threaded,
}

impl Links {
    /// `veth` or `threaded`.
    pub fn name(self) -> &'static str {
        match self {
            Links::Veth => "veth",
            Links::Threaded => "threaded",
        }
    }
}

impl std::str::FromStr for Links {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "veth" => Ok(Links::Veth),
            "threaded" => Ok(Links::Threaded),
            _ => Err(BenchError::InvalidOption {
                option: "--links",
                value: s.to_owned(),
                reason: "expected `veth` or `threaded`".to_owned(),
            }),
        }
    }
}

impl Default for SiteOptions {
    fn default() -> Self {
        SiteOptions {
            protego_bin: None,
            streams: vec![1, 8],
            duration: Duration::from_secs(10),
            rounds: 3,
            gateway_options: Vec::new(),
            links: vec![Links::Veth, Links::Threaded],
        }
    }
}

impl SiteOptions {
    /// Checks the options.
    pub fn validate(&self) -> Result<()> {
        let bad = |option: &'static str, value: String, reason: &str| {
            Err(BenchError::InvalidOption {
                option,
                value,
                reason: reason.to_owned(),
            })
        };
        if self.streams.is_empty() {
            return bad("--streams", String::new(), "the list is empty");
        }
        if self.links.is_empty() {
            return bad("--links", String::new(), "the list is empty");
        }
        if let Some(s) = self.streams.iter().find(|s| !(1..=128).contains(*s)) {
            return bad("--streams", s.to_string(), "1 to 128 streams");
        }
        if !(1..=20).contains(&self.rounds) {
            return bad("--rounds", self.rounds.to_string(), "1 to 20 rounds");
        }
        if self.duration < Duration::from_secs(2) || self.duration > Duration::from_secs(600) {
            return bad(
                "--duration",
                format!("{:?}", self.duration),
                "2 s to 600 s (iperf3 counts whole seconds)",
            );
        }
        Ok(())
    }
}

/// One iperf3 run through one gateway.
#[derive(Debug, Clone, Serialize)]
pub struct SiteRun {
    /// `protego` or `strongswan`.
    pub gateway: String,
    /// Parallel TCP streams.
    pub streams: u32,
    /// `veth` or `threaded` ([`Links`]).
    pub links: String,
    /// The round (from 1).
    pub round: u32,
    /// What the VM received, Gbit/s (iperf3's receiver side).
    pub gbps: f64,
    /// Bytes the VM received.
    pub bytes: u64,
    /// TCP retransmissions the site's sender counted.
    pub retransmits: Option<u64>,
    /// The gateway's CPU time over the run, seconds (all its threads, user and kernel).
    pub gateway_cpu_s: f64,
    /// Gateway CPU per byte received, ns.
    pub cpu_ns_per_byte: f64,
    /// Gateway CPU seconds per second (cores busy).
    pub gateway_cores: f64,
    /// The site's charon (the peer) CPU time over the run, seconds.
    pub peer_cpu_s: f64,
}

/// Both gateways at one stream count and link mode, over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct SiteComparison {
    /// Parallel TCP streams.
    pub streams: u32,
    /// `veth` or `threaded`.
    pub links: String,
    /// Protego's CPU per byte: median, lowest, highest over the rounds (ns).
    pub protego_ns_per_byte: [f64; 3],
    /// strongSwan's CPU per byte: median, lowest, highest (ns).
    pub strongswan_ns_per_byte: [f64; 3],
    /// strongSwan's CPU per byte over Protego's, within each round: median, lowest, highest.
    pub ratio: [f64; 3],
    /// Protego's throughput, median Gbit/s.
    pub protego_gbps: f64,
    /// strongSwan's throughput, median Gbit/s.
    pub strongswan_gbps: f64,
}

/// The figures, as one JSON object.
#[derive(Debug, Clone, Serialize)]
pub struct SiteReport {
    /// The machine.
    pub machine: Machine,
    /// Seconds per iperf3 run.
    pub duration_s: f64,
    /// Rounds.
    pub rounds: u32,
    /// Protego's extra `[gateway]` lines.
    pub gateway_options: Vec<String>,
    /// Every run, in the order made.
    pub runs: Vec<SiteRun>,
    /// Per stream count.
    pub comparison: Vec<SiteComparison>,
    /// Issue 23's targets for this measurement.
    pub targets: Vec<Target>,
    /// How the figures are taken.
    pub notes: Vec<String>,
}

/// One tenant (VNet 10.2.0.0/24, VNI 4242) with one site (LAN 10.1.0.0/24, no NAT) and a VM
/// on each host of `vm_hosts`, over `hosts` cloud hosts: the topology of the benchmarks that
/// run a strongSwan site (`site`, `failover`).
pub(crate) fn one_site(vm_hosts: &[usize], hosts: usize) -> Result<TopologySpec> {
    let p = |s: &str| s.parse().map_err(BenchError::Testbed);
    Ok(TopologySpec {
        tenants: vec![TenantSpec {
            name: "t1".into(),
            vni: 4242,
            vnet: p("10.2.0.0/24")?,
            vnet6: None,
            vms: vm_hosts.iter().map(|&host| VmSpec { host }).collect(),
            sites: vec![SiteSpec {
                lan: p("10.1.0.0/24")?,
                lan6: None,
                behind_nat: false,
            }],
        }],
        hosts,
        ..TopologySpec::default()
    })
}

/// A gateway with its site, tunnel up, and the VM's iperf3 server.
struct Setup {
    name: &'static str,
    topo: Topology,
    site: Charon,
    gateway_pid: u32,
    // Held for their lifetime: dropping stops them.
    _server: Iperf3Server,
    _protego: Option<ProtegoGateway>,
    _charon: Option<Charon>,
}

impl Setup {
    /// Protego as the gateway.
    fn protego(bed: &Testbed, options: &SiteOptions) -> Result<Setup> {
        let topo = Topology::build(bed, one_site(&[0], 1)?)?;
        let tun = GatewayTunnel::for_site(&topo, 0, PSK);
        let gw = ProtegoGateway::start_binary(
            bed,
            &topo,
            std::slice::from_ref(&tun),
            &options.gateway_options,
            "",
            options.protego_bin.as_deref(),
        )?;
        let (mut conn, _) = topo.site_connections(0, PSK);
        tun.apply_to_site(&mut conn);
        let site = site_charon(&topo, conn)?;
        let pid = gw.process().pid();
        Self::finish("protego", topo, site, pid, Some(gw), None)
    }

    /// strongSwan as the gateway: charon in the gateway namespace, the kernel's VXLAN device
    /// toward the host.
    fn strongswan(bed: &Testbed) -> Result<Setup> {
        let topo = Topology::build(bed, one_site(&[0], 1)?)?;
        topo.attach_kernel_vxlan_gateway()?;
        let (mut site_conn, mut gw_conn) = topo.site_connections(0, PSK);
        // The same proposals as Protego's tunnel (AES-256-GCM, x25519), at both ends.
        let tun = GatewayTunnel::for_site(&topo, 0, PSK);
        tun.apply_to_site(&mut site_conn);
        tun.apply_to_site(&mut gw_conn);
        let gw = Charon::start(&topo.gateway.ns, "gateway", &quiet())?;
        gw.load(&SwanctlConfig::new(vec![gw_conn]))?;
        let site = site_charon(&topo, site_conn)?;
        let pid = gw.process().pid();
        Self::finish("strongswan", topo, site, pid, None, Some(gw))
    }

    fn finish(
        name: &'static str,
        topo: Topology,
        site: Charon,
        gateway_pid: u32,
        protego: Option<ProtegoGateway>,
        charon: Option<Charon>,
    ) -> Result<Setup> {
        site.initiate("net", UP)?;
        site.wait_child_installed("net", UP)?;
        let vm = &topo.tenants[0].vms[0];
        let server = traffic::iperf3_server(&vm.ns, vm.addr.addr, IPERF3_PORT)?;
        // The first packets to the VM wait for its MAC (ARP over VXLAN): not measured.
        topo.wait_vms_answer(0, Duration::from_secs(10))?;
        Ok(Setup {
            name,
            topo,
            site,
            gateway_pid,
            _server: server,
            _protego: protego,
            _charon: charon,
        })
    }

    /// One iperf3 run with `streams` streams over `links`, the gateway's CPU around it.
    fn run(&self, streams: u32, links: Links, round: u32, duration: Duration) -> Result<SiteRun> {
        self.topo
            .set_gateway_links_threaded(links == Links::Threaded)?;
        let s = &self.topo.sites[0];
        let vm = &self.topo.tenants[0].vms[0];
        let read = |pid: u32| {
            cpu::thread_cpu_ns(pid)
                .map_err(|e| BenchError::io(format!("read the CPU time of pid {pid}"), e))
        };
        let peer_pid = self.site.process().pid();
        let (gw0, peer0) = (read(self.gateway_pid)?, read(peer_pid)?);
        let start = std::time::Instant::now();
        let result = traffic::iperf3_client(
            &s.ns,
            vm.addr.addr,
            &IperfOptions {
                bind: Some(s.lan_addr),
                parallel: streams,
                ..IperfOptions::tcp(duration)
            },
        )?;
        let wall = start.elapsed().as_secs_f64();
        let (gw1, peer1) = (read(self.gateway_pid)?, read(peer_pid)?);
        let gw_ns = gw1.since(&gw0);
        if result.bytes_received == 0 {
            return Err(BenchError::NoTraffic {
                case: format!(
                    "{} {links} {streams} stream(s)",
                    self.name,
                    links = links.name()
                ),
                detail: "iperf3 reports no byte received by the VM".to_owned(),
            });
        }
        Ok(SiteRun {
            gateway: self.name.to_owned(),
            streams,
            links: links.name().to_owned(),
            round,
            gbps: result.received_bps / 1e9,
            bytes: result.bytes_received,
            retransmits: result.retransmits,
            gateway_cpu_s: gw_ns as f64 / 1e9,
            cpu_ns_per_byte: if result.bytes_received == 0 {
                0.0
            } else {
                gw_ns as f64 / result.bytes_received as f64
            },
            gateway_cores: gw_ns as f64 / 1e9 / wall.max(1e-9),
            peer_cpu_s: peer1.since(&peer0) as f64 / 1e9,
        })
    }
}

/// A charon that logs little (logging would cost it CPU during the runs).
fn quiet() -> CharonSettings {
    CharonSettings {
        log_level: 0,
        ike_log_level: 0,
        esp_log_level: 0,
        ..CharonSettings::default()
    }
}

fn site_charon(topo: &Topology, conn: testbed::strongswan::Connection) -> Result<Charon> {
    let site = Charon::start(&topo.sites[0].ns, "site", &quiet())?;
    site.load(&SwanctlConfig::new(vec![conn]))?;
    Ok(site)
}

/// Median, lowest and highest of `v` (zeros if empty).
fn spread(mut v: Vec<f64>) -> [f64; 3] {
    if v.is_empty() {
        return [0.0; 3];
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    [median, v[0], v[n - 1]]
}

/// The comparison per stream count and link mode, from the runs.
fn compare(runs: &[SiteRun], streams: &[u32], links: &[Links]) -> Vec<SiteComparison> {
    links
        .iter()
        .flat_map(|l| streams.iter().map(move |n| (*n, l.name())))
        .map(|(n, links)| {
            let of = |gw: &str| -> Vec<&SiteRun> {
                runs.iter()
                    .filter(|r| r.streams == n && r.links == links && r.gateway == gw)
                    .collect()
            };
            let (p, s) = (of("protego"), of("strongswan"));
            let ratios = p
                .iter()
                .filter_map(|pr| {
                    let sr = s.iter().find(|x| x.round == pr.round)?;
                    (pr.cpu_ns_per_byte > 0.0).then(|| sr.cpu_ns_per_byte / pr.cpu_ns_per_byte)
                })
                .collect();
            SiteComparison {
                streams: n,
                links: links.to_owned(),
                protego_ns_per_byte: spread(p.iter().map(|r| r.cpu_ns_per_byte).collect()),
                strongswan_ns_per_byte: spread(s.iter().map(|r| r.cpu_ns_per_byte).collect()),
                ratio: spread(ratios),
                protego_gbps: spread(p.iter().map(|r| r.gbps).collect())[0],
                strongswan_gbps: spread(s.iter().map(|r| r.gbps).collect())[0],
            }
        })
        .collect()
}

/// Issue 23's targets for one TCP stream: <= 1.0 ns of gateway CPU per byte, >= 10x less than
/// strongSwan in the same run (medians over the rounds), for each link mode measured.
fn targets(comparison: &[SiteComparison]) -> Vec<Target> {
    let detail = |c: &SiteComparison| {
        format!(
            "{} links: Protego {:.2} ns/B (rounds {:.2}-{:.2}), strongSwan {:.2} ns/B, ratio {:.1}x ({:.1}-{:.1}x), {:.2} and {:.2} Gbit/s",
            c.links,
            c.protego_ns_per_byte[0],
            c.protego_ns_per_byte[1],
            c.protego_ns_per_byte[2],
            c.strongswan_ns_per_byte[0],
            c.ratio[0],
            c.ratio[1],
            c.ratio[2],
            c.protego_gbps,
            c.strongswan_gbps
        )
    };
    let mut out = Vec::new();
    for links in [Links::Veth, Links::Threaded] {
        let modes: Vec<&SiteComparison> = comparison
            .iter()
            .filter(|c| c.links == links.name())
            .collect();
        if modes.is_empty() {
            continue;
        }
        let one = modes.iter().find(|c| c.streams == 1);
        let missing = "no single-stream runs (--streams without 1)".to_owned();
        out.push(Target {
            name: format!("site_cpu_per_byte_{}", links.name()),
            requirement:
                "one iperf3 TCP stream from a strongSwan site: <= 1.0 ns of gateway CPU per byte"
                    .to_owned(),
            value: one.map(|c| c.protego_ns_per_byte[0]),
            unit: "ns/B".to_owned(),
            met: one.map(|c| c.protego_ns_per_byte[0] <= 1.0),
            detail: one.map_or_else(|| missing.clone(), |c| detail(c)),
        });
        out.push(Target {
            name: format!("site_vs_strongswan_{}", links.name()),
            requirement:
                "the same stream: >= 10x less gateway CPU per byte than strongSwan in the same run"
                    .to_owned(),
            value: one.map(|c| c.ratio[0]),
            unit: "x".to_owned(),
            met: one.map(|c| c.ratio[0] >= 10.0),
            detail: one.map_or(missing, |c| detail(c)),
        });
    }
    out
}

/// Runs the measurement; `progress` gets a line per step, `on_start` each test bed's cleanup
/// handle as soon as it exists (a Ctrl-C handler removes every namespace and process with it).
pub fn run(
    options: &SiteOptions,
    progress: &mut dyn FnMut(&str),
    on_start: &mut dyn FnMut(CleanupHandle),
) -> Result<SiteReport> {
    options.validate()?;
    let protego_bed = Testbed::new()?;
    on_start(protego_bed.cleanup_handle());
    let swan_bed = Testbed::new()?;
    on_start(swan_bed.cleanup_handle());
    let protego = Setup::protego(&protego_bed, options)?;
    progress("protego: tunnel up from the strongSwan site, VM reachable");
    let swan = Setup::strongswan(&swan_bed)?;
    progress("strongswan: tunnel up from the strongSwan site, VM reachable");
    let mut runs = Vec::new();
    for round in 1..=options.rounds {
        let order = if round % 2 == 1 {
            [&protego, &swan]
        } else {
            [&swan, &protego]
        };
        for &links in &options.links {
            for &streams in &options.streams {
                for setup in order {
                    let r = setup.run(streams, links, round, options.duration)?;
                    progress(&format!(
                        "round {round}: {:<10} {:<8} {streams:>3} stream(s): {:>6.2} Gbit/s, gateway {:.2} ns/B ({:.2} cores), peer {:.2} s CPU",
                        r.gateway, r.links, r.gbps, r.cpu_ns_per_byte, r.gateway_cores, r.peer_cpu_s
                    ));
                    runs.push(r);
                }
            }
        }
    }
    let comparison = compare(&runs, &options.streams, &options.links);
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    Ok(SiteReport {
        machine: crate::session::machine(cpus),
        duration_s: options.duration.as_secs_f64(),
        rounds: options.rounds,
        gateway_options: options.gateway_options.clone(),
        targets: targets(&comparison),
        comparison,
        runs,
        notes: vec![
            "site: strongSwan 5.9 charon, kernel-libipsec (userspace ESP over a TUN device), ESP in UDP, aes256gcm16 (IKE aes256gcm16-prfsha256-x25519) with both gateways; iperf3 TCP from the site's LAN address to the VM".to_owned(),
            "gateways: protego up (its own VXLAN) and strongSwan 5.9 charon with kernel-libipsec and the kernel's VXLAN device, each in its own copy of the topology, taking turns".to_owned(),
            "CPU: every thread's run time (user and kernel) of the gateway process from /proc/<pid>/task/*/schedstat around each iperf3 run; per byte = over the bytes the VM received".to_owned(),
            "links veth: a veth runs the receiver's path (bridge, the host's VXLAN decapsulation, the site's socket delivery) in the sender's system call, billed to the gateway; threaded: the switch-side ends of the gateway's links deliver what it sends in NAPI threads, so that work leaves the gateway's bill, as behind a real NIC; in both, the kernel's receive path of what is sent to a gateway is billed to the sender, not to the gateway".to_owned(),
        ],
    })
}

/// The report as text.
pub fn render(r: &SiteReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "protego bench site: {} CPUs ({}), kernel {}, {} round(s) of {:.0} s per run",
        r.machine.cpus, r.machine.cpu_model, r.machine.kernel, r.rounds, r.duration_s
    );
    for n in &r.notes {
        let _ = writeln!(out, "  - {n}");
    }
    let _ = writeln!(
        out,
        "\n{:<8} {:>7} | {:>28} | {:>28} | {:>19}",
        "links",
        "streams",
        "Protego ns/B (min-max) Gbit/s",
        "strongSwan ns/B (min-max) Gb/s",
        "ratio (min-max)"
    );
    for c in &r.comparison {
        let _ = writeln!(
            out,
            "{:<8} {:>7} | {:>5.2} ({:.2}-{:.2}) {:>7.2} | {:>5.2} ({:.2}-{:.2}) {:>6.2} | {:>5.1}x ({:.1}-{:.1}x)",
            c.links,
            c.streams,
            c.protego_ns_per_byte[0],
            c.protego_ns_per_byte[1],
            c.protego_ns_per_byte[2],
            c.protego_gbps,
            c.strongswan_ns_per_byte[0],
            c.strongswan_ns_per_byte[1],
            c.strongswan_ns_per_byte[2],
            c.strongswan_gbps,
            c.ratio[0],
            c.ratio[1],
            c.ratio[2]
        );
    }
    crate::report::write_targets(&mut out, &r.targets);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(gateway: &str, streams: u32, round: u32, ns_per_byte: f64) -> SiteRun {
        SiteRun {
            gateway: gateway.to_owned(),
            streams,
            links: "threaded".to_owned(),
            round,
            gbps: 1.0,
            bytes: 1_000_000,
            retransmits: Some(0),
            gateway_cpu_s: ns_per_byte * 1e-3,
            cpu_ns_per_byte: ns_per_byte,
            gateway_cores: 0.5,
            peer_cpu_s: 1.0,
        }
    }

    #[test]
    fn ratios_are_taken_within_each_round() {
        let runs = vec![
            run("protego", 1, 1, 1.0),
            run("strongswan", 1, 1, 12.0),
            run("strongswan", 1, 2, 10.0),
            run("protego", 1, 2, 2.0),
            run("protego", 1, 3, 0.8),
            run("strongswan", 1, 3, 12.0),
        ];
        let c = compare(&runs, &[1], &[Links::Threaded]);
        assert_eq!(c[0].protego_ns_per_byte, [1.0, 0.8, 2.0]);
        assert_eq!(c[0].strongswan_ns_per_byte, [12.0, 10.0, 12.0]);
        // 12, 5 and 15: the median of the rounds' ratios, not the ratio of the medians.
        assert_eq!(c[0].ratio, [12.0, 5.0, 15.0]);
        let t = targets(&c);
        assert_eq!(t.len(), 2, "one link mode measured: {t:?}");
        assert_eq!(t[0].name, "site_cpu_per_byte_threaded");
        assert_eq!(t[0].met, Some(true), "1.0 ns/B meets <= 1.0");
        assert_eq!(t[1].met, Some(true), "12x meets >= 10x");
        // The veth runs are other runs: none here.
        let c = compare(&runs, &[1], &[Links::Veth]);
        assert_eq!(c[0].protego_ns_per_byte, [0.0; 3]);
        let c = compare(&runs, &[8], &[Links::Threaded]);
        assert_eq!(c[0].ratio, [0.0; 3]);
        assert_eq!(
            targets(&c)[0].met,
            None,
            "no single-stream runs: not measured"
        );
    }

    #[test]
    fn bad_options_are_refused() {
        assert!(SiteOptions::default().validate().is_ok());
        for o in [
            SiteOptions {
                streams: Vec::new(),
                ..SiteOptions::default()
            },
            SiteOptions {
                streams: vec![0],
                ..SiteOptions::default()
            },
            SiteOptions {
                rounds: 0,
                ..SiteOptions::default()
            },
            SiteOptions {
                links: Vec::new(),
                ..SiteOptions::default()
            },
            SiteOptions {
                duration: Duration::from_millis(500),
                ..SiteOptions::default()
            },
        ] {
            assert!(o.validate().is_err(), "{o:?}");
        }
    }
}
